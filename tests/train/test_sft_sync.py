"""Which syncs the trainer makes between SFT and RL (issue 29, item 5)."""

from __future__ import annotations

import pytest

from stare_agents.train.config import load_config
from stare_agents.train.trainer import Trainer


class _Workers:
    def close(self) -> None:
        pass


@pytest.mark.parametrize(("num_tasks", "syncs"), [(0, 0), (2, 1)])
def test_sft_model_goes_to_the_engines_only_for_a_held_out_evaluation(
    tmp_path, monkeypatch, num_tasks, syncs
):
    """With no held-out evaluation after SFT nothing reads the engines before RL's first sync (which loads
    the SFT model anyway): no sync of the whole model through the driver (it made one)."""
    config = load_config(
        recipe="tiny",
        overrides=[f"out_dir={tmp_path / 'run'}", "rollout.sandbox=none", f"eval.num_tasks={num_tasks}"],
    )
    assert config.sft.enabled
    trainer = Trainer(config)
    synced, evaluated, reinforced = [], [], []
    monkeypatch.setattr(trainer, "_start_workers", lambda model_dir: _Workers())
    monkeypatch.setattr(
        trainer, "supervised_fine_tuning", lambda base, out: trainer.progress.update(sft_done=True)
    )
    monkeypatch.setattr(
        trainer, "_sync_from_dir", lambda model_dir, version: synced.append((model_dir, version))
    )
    monkeypatch.setattr(
        trainer.evaluation,
        "evaluate",
        lambda workers, n=None, point=None: evaluated.append(n) or {"per_task": {"t0": 1.0}, "tasks": 1},
    )

    def reinforce(start, algorithm, folder, key, version):  # the engines end on the arm's weights
        reinforced.append((start, version))
        trainer.engines_hold = key

    monkeypatch.setattr(trainer, "reinforce", reinforce)
    monkeypatch.setattr(trainer, "write_summary", lambda compare: {})
    trainer.run()
    assert synced == [(trainer.folder / "sft_model", 1)] * syncs  # the SFT model is weight version 1
    # RL starts from the SFT model and syncs it first, as version 2 whether or not the SFT model was synced
    assert reinforced == [(trainer.folder / "sft_model", 2)]
