"""Checkpoints: an exact round trip of the learner's state, and saves that a SIGKILL cannot corrupt."""

import signal
import subprocess
import sys
import time

import pytest
import torch
from learner_support import assert_same_metrics, make_learner, max_param_diff, step_inputs

from stare_agents.algo import AlgorithmConfig, PolicyLossConfig, StareConfig
from stare_agents.train.checkpoint import (
    checkpoint_path,
    latest_checkpoint,
    list_checkpoints,
    load_checkpoint,
    prune_checkpoints,
    save_checkpoint,
)


def _algorithm():
    # Clip-Cov draws random tokens (the learner's generator), adaptive STARE moves w and m (the gate state)
    return AlgorithmConfig(
        loss=PolicyLossConfig(cov_mode="clip-cov", clip_cov_low=-100, clip_cov_high=100, clip_cov_ratio=0.05),
        stare=StareConfig(adaptive=True, target_entropy=100.0, variant="C2"),
    )


def test_round_trip_gives_an_identical_next_step(tmp_path):
    _, batch, advantages = step_inputs(13)
    config = {"optimizer": {"warmup_steps": 3}, "micro_batch_tokens": 90}
    first = make_learner(_algorithm(), **config)
    first.step(batch, advantages)
    path = save_checkpoint(first.state_dict() | {"data_position": 1}, checkpoint_path(tmp_path, 1))
    expected = first.step(batch, advantages)

    resumed = make_learner(_algorithm(), seed=99, **config)  # other initial weights: all must come from disk
    state = load_checkpoint(path)
    assert state["data_position"] == 1 and state["step_count"] == 1
    resumed.load_state_dict(state)
    got = resumed.step(batch, advantages)
    assert_same_metrics(expected, got)
    assert max_param_diff(first.model, resumed.model) == 0.0
    assert got["stare/w"] == pytest.approx(1.12) and got["learner/lr"] == pytest.approx(2e-3 / 3)
    with pytest.raises(ValueError, match="STARE gate state"):
        make_learner("grpo-ds").load_state_dict(state)


def test_listing_latest_and_pruning(tmp_path):
    assert latest_checkpoint(tmp_path) is None
    for step in (3, 10):
        save_checkpoint({"step": step}, checkpoint_path(tmp_path, step))
    save_checkpoint({"step": 7}, tmp_path / "checkpoints" / "step-00000007.pt")  # the single-file layout
    (tmp_path / "checkpoints" / ".step-00000011.pt.tmp-4242").write_bytes(b"torn")
    (tmp_path / "checkpoints" / ".step-00000012.tmp-4242").mkdir()  # a folder save killed half-way
    (tmp_path / "checkpoints" / "step-00000013").mkdir()  # no state file: not a checkpoint
    assert [s for s, _ in list_checkpoints(tmp_path)] == [3, 7, 10]
    assert latest_checkpoint(tmp_path).is_dir() and load_checkpoint(latest_checkpoint(tmp_path)) == {
        "step": 10
    }
    assert load_checkpoint(tmp_path / "checkpoints" / "step-00000007.pt") == {"step": 7}
    removed = prune_checkpoints(tmp_path, keep_last=2)
    assert sorted(p.name for p in removed) == [
        ".step-00000011.pt.tmp-4242",
        ".step-00000012.tmp-4242",
        "step-00000003",
    ]
    assert not any(p.exists() for p in removed)
    assert [s for s, _ in list_checkpoints(tmp_path)] == [7, 10]
    with pytest.raises(ValueError, match="keep_last"):
        prune_checkpoints(tmp_path, keep_last=0)
    with pytest.raises(FileNotFoundError, match="no checkpoint"):
        load_checkpoint(tmp_path / "nope.pt")
    (tmp_path / "bad.pt").write_bytes(b"not a checkpoint")
    with pytest.raises(ValueError, match="cannot be loaded"):
        load_checkpoint(tmp_path / "bad.pt")


SAVER = """
import sys, torch
from stare_agents.train.checkpoint import save_checkpoint
payload = torch.zeros(16_000_000)  # 64 MB: most of the loop's time is spent writing
i = 0
while True:
    payload.fill_(float(i))
    save_checkpoint({"i": i, "payload": payload}, sys.argv[1])
    i += 1
"""


def test_a_save_killed_with_sigkill_never_corrupts_the_last_checkpoint(tmp_path):
    path = tmp_path / "checkpoints" / "step-00000001.pt"
    torn = 0
    for _ in range(3):
        proc = subprocess.Popen([sys.executable, "-c", SAVER, str(path)])
        try:
            deadline = time.monotonic() + 120
            while not path.exists() and time.monotonic() < deadline:
                time.sleep(0.02)
            # then inside a later save: as soon as its temporary file is there (not after a fixed sleep, which a
            # loaded machine stretches past or short of the write)
            while time.monotonic() < deadline and not any(
                p.name.startswith(".step-00000001.pt.tmp-") for p in path.parent.iterdir()
            ):
                time.sleep(0.002)
        finally:
            proc.send_signal(signal.SIGKILL)
            proc.wait()
        torn += any(p.name.startswith(".step-00000001.pt.tmp-") for p in path.parent.iterdir())
        state = load_checkpoint(path)
        assert bool((state["payload"] == float(state["i"])).all())
        prune_checkpoints(tmp_path, keep_last=1)
    assert torn >= 1  # at least one kill did land in the middle of a write
    assert torch.load(path, weights_only=True)["payload"].numel() == 16_000_000
