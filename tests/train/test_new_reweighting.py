"""A new token reweighting with a knob of its own is a class and its config type in `algo/` and one line in
`REWEIGHTINGS` (here registered by the test): the config loader, the saved config, the learner's step and its
token records take it without a change in `train/`."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pytest
import torch
from learner_support import make_learner, step_inputs

from stare_agents.algo.reweighting import REWEIGHTINGS
from stare_agents.algo.stare import Stare, StareConfig
from stare_agents.train.config import load_config

ROOT = Path(__file__).resolve().parents[2]


@dataclass
class FloorConfig(StareConfig):
    """STARE's settings and one of its own."""

    floor: float = 0.5  # the weight of L- tokens, whatever the variant

    def __post_init__(self) -> None:
        super().__post_init__()
        if not 0 < self.floor <= 1:
            raise ValueError(f"stare.floor must be in (0, 1], got {self.floor}")


class FloorTokens(Stare):
    """STARE's selection and gate; L- tokens weighted `floor` while the step is reweighted."""

    config_type = FloorConfig

    def weights_from_selection(self, top_pos: torch.Tensor, top_neg: torch.Tensor) -> torch.Tensor:
        weights = super().weights_from_selection(top_pos, top_neg)
        return torch.where(top_neg, self.config.floor, weights) if self.reweighting else weights


@pytest.fixture
def floor(monkeypatch):
    monkeypatch.setitem(REWEIGHTINGS, "floor", FloorTokens)  # the line a new method adds to REWEIGHTINGS


def test_the_loader_builds_the_new_methods_config_with_its_knob(floor, tmp_path):
    overrides = [
        f"out_dir={tmp_path / 'run'}",
        "rl.reweighting=floor",
        "rl.stare.floor=0.25",
        "rl.stare.w=1.3",
    ]
    config = load_config(recipe="tiny", overrides=overrides)
    stare = config.algorithm().stare
    assert type(stare) is FloorConfig and (stare.floor, stare.w, stare.target_entropy) == (0.25, 1.3, 10.0)
    saved = tmp_path / "config.yaml"
    saved.write_text(config.to_yaml())
    assert load_config(path=str(saved)) == config  # the knob is saved and read back
    with pytest.raises(ValueError, match=r"rl\.stare: stare\.floor must be in \(0, 1\], got 0\.0"):
        load_config(recipe="tiny", overrides=["rl.reweighting=floor", "rl.stare.floor=0"])
    with pytest.raises(
        ValueError, match=r"unknown key\(s\) \['floor'\] in 'rl\.stare'"
    ):  # STARE has no floor
        load_config(recipe="tiny", overrides=["rl.stare.floor=0.25"])


def test_the_learner_trains_with_it_and_records_its_weights(floor):
    _, batch, advantages = step_inputs(2)
    algorithm = load_config(
        recipe="tiny", overrides=["rl.reweighting=floor", "rl.stare.floor=0.25"]
    ).algorithm()
    result = make_learner(algorithm).step(batch, advantages, record_tokens=True)
    assert result["stare/gate_on"] == 1.0  # tiny's target 10 nats: on
    chosen = [
        (weight, selected)
        for record in result.token_records.values()
        for weight, selected in zip(record.stare_weights, record.selection, strict=True)
        if selected
    ]
    assert {w for w, s in chosen if s < 0} == {0.25}
    assert all(w == pytest.approx(1.1) for w, s in chosen if s > 0) and any(s > 0 for _, s in chosen)


def test_nothing_in_train_names_a_method_or_decides_what_its_gate_reads():
    for path in (ROOT / "train").rglob("*.py"):
        source = path.read_text()
        assert "random-tokens" not in source and "RandomTokens" not in source, path
        assert 'gate_input != "trained"' not in source and ".scope ==" not in source, (
            path
        )  # the method's to say
