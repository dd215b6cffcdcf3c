"""The default job's precisions are what the README and docs/precision.md say, on every CPU: SFT and RL (engine
and learner) in `fast` (bf16 where the CPU has bf16 units, fp32 elsewhere); the long STARE-beside-GRPO-ds runs
keep RL in fp32, the precision their registered runs were made in."""

from __future__ import annotations

from pathlib import Path

import pytest

from stare_agents import hardware
from stare_agents.train.config import load_config

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(params=[frozenset(), frozenset({"avx2", "avx512_bf16"}), frozenset({"amx_bf16"})])
def cpu(request, monkeypatch):
    for cached in (hardware.cpu_flags, hardware.bf16_is_fast, hardware.fast_bf16_or_fp32):
        cached.cache_clear()
    monkeypatch.setattr(hardware, "cpu_flags", lambda: request.param)
    yield request.param
    for cached in (hardware.bf16_is_fast, hardware.fast_bf16_or_fp32):
        cached.cache_clear()


@pytest.mark.parametrize("recipe", ["smollm2-arith", "smollm2-arith-compare"])
def test_the_default_job_runs_in_fast_on_every_cpu(cpu, recipe):
    config = load_config(recipe=recipe)
    bf16 = bool(cpu & hardware.BF16_CPU_FLAGS)
    assert hardware.resolve_dtype(config.model.rollout_dtype, "cpu") == ("bfloat16" if bf16 else "float32")
    assert hardware.resolve_precision(config.rl.learner.precision, "cpu") == ("bf16" if bf16 else "fp32")
    assert hardware.resolve_precision(config.sft.precision, "cpu") == ("bf16" if bf16 else "fp32")


def test_the_long_runs_keep_rl_in_fp32_on_every_cpu(cpu):
    config = load_config(recipe="smollm2-arith-long")
    assert hardware.resolve_dtype(config.model.rollout_dtype, "cpu") == "float32"
    assert hardware.resolve_precision(config.rl.learner.precision, "cpu") == "fp32"


@pytest.mark.parametrize("page", ["README.md", "docs/precision.md"])
def test_the_docs_state_those_precisions(page):
    text = " ".join((ROOT / page).read_text(encoding="utf-8").split())
    assert "SFT and RL (the engine and the learner) run in `fast`" in text
    assert "model.rollout_dtype=float32 rl.learner.precision=fp32" in text
