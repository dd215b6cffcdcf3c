"""What the hardware computes fast, for the "fast" precision of the learner and the rollout engines.

bf16 is about 2x faster than fp32 for SmolLM2 on CPUs with avx512_bf16 or AMX (and on every recent GPU), and
about 100x slower on CPUs without them (measured: a 1024x1024 matmul on one AMD EPYC core without
avx512_bf16 ran at 70 GFLOP/s in fp32 and 0.6 GFLOP/s in bf16). Recipes meant for any machine say "fast":
bf16 where the hardware has it, fp32 elsewhere, and the choice is logged once.
"""

from __future__ import annotations

import functools
import logging
import platform
from pathlib import Path

logger = logging.getLogger("stare_agents.hardware")

BF16_CPU_FLAGS = frozenset({"avx512_bf16", "amx_bf16"})


@functools.cache
def _cpuinfo(field: str) -> str | None:
    """The first `field` of Linux /proc/cpuinfo (None elsewhere, or without it)."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return None
    for line in text.splitlines():
        if line.startswith(field):
            return line.partition(":")[2].strip()
    return None


@functools.cache
def cpu_flags() -> frozenset[str]:
    """The CPU's feature flags (Linux /proc/cpuinfo; empty elsewhere)."""
    return frozenset((_cpuinfo("flags") or "").split())


def cpu_model() -> str:
    """The CPU's model name, for figures that say where they were measured ("unknown CPU" when not found)."""
    return _cpuinfo("model name") or platform.processor() or "unknown CPU"


@functools.cache
def bf16_is_fast(device_type: str = "cpu") -> bool:
    """Whether bf16 matrix products run at least as fast as fp32 on this device type."""
    if device_type == "cuda":
        import torch

        return bool(torch.cuda.is_available() and torch.cuda.is_bf16_supported())
    return bool(BF16_CPU_FLAGS & cpu_flags())


@functools.cache
def fast_bf16_or_fp32(device_type: str = "cpu") -> bool:
    """`bf16_is_fast`, with the choice logged once per process and device type."""
    fast = bf16_is_fast(device_type)
    if device_type != "cuda":
        logger.warning(
            "precision 'fast' on this CPU: %s",
            "bf16 (it has " + ", ".join(sorted(BF16_CPU_FLAGS & cpu_flags())) + ")"
            if fast
            else "fp32 (no avx512_bf16 or amx_bf16: bf16 would run about 100x slower here)",
        )
    return fast


def resolve_precision(precision: str, device_type: str = "cpu") -> str:
    """The learner's precision: "fast" -> "bf16" or "fp32" for this device; other words unchanged."""
    if precision != "fast":
        return precision
    return "bf16" if fast_bf16_or_fp32(device_type) else "fp32"


def resolve_dtype(dtype: str, device_type: str = "cpu") -> str:
    """An engine's dtype: "fast" -> "bfloat16" or "float32" for this device; other words unchanged."""
    if dtype != "fast":
        return dtype
    return "bfloat16" if fast_bf16_or_fp32(device_type) else "float32"
