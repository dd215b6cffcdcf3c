"""The default job's precisions are what the README says, on every CPU: RL (engine and learner) in fp32, SFT
`fast` (bf16 where the CPU has bf16 units)."""

from __future__ import annotations

from pathlib import Path

import pytest

from stare_agents import hardware
from stare_agents.train.config import load_config

README = Path(__file__).resolve().parents[2] / "README.md"


@pytest.fixture(params=[frozenset(), frozenset({"avx2", "avx512_bf16"}), frozenset({"amx_bf16"})])
def cpu(request, monkeypatch):
    for cached in (hardware.cpu_flags, hardware.bf16_is_fast, hardware.fast_bf16_or_fp32):
        cached.cache_clear()
    monkeypatch.setattr(hardware, "cpu_flags", lambda: request.param)
    yield request.param
    for cached in (hardware.bf16_is_fast, hardware.fast_bf16_or_fp32):
        cached.cache_clear()


@pytest.mark.parametrize("recipe", ["smollm2-arith", "smollm2-arith-compare", "smollm2-arith-long"])
def test_the_default_jobs_rl_runs_in_fp32_on_every_cpu(cpu, recipe):
    config = load_config(recipe=recipe)
    assert hardware.resolve_dtype(config.model.rollout_dtype, "cpu") == "float32"
    assert hardware.resolve_precision(config.rl.learner.precision, "cpu") == "fp32"
    sft = hardware.resolve_precision(config.sft.precision, "cpu")
    assert sft == ("bf16" if cpu & hardware.BF16_CPU_FLAGS else "fp32")


def test_the_readme_states_those_precisions():
    text = " ".join(README.read_text(encoding="utf-8").split())
    assert "RL runs in fp32 on every CPU (the engine and the learner)" in text
    assert "SFT in `fast`" in text
