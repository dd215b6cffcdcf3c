"""The "fast" precision: bf16 only where the hardware computes it fast, fp32 elsewhere."""

from __future__ import annotations

import pytest
import torch

from stare_agents import hardware
from stare_agents.hardware import resolve_dtype, resolve_precision
from stare_agents.train.policy import autocast


@pytest.fixture
def cpu(monkeypatch):
    def set_flags(flags: set[str]) -> None:
        for function in (hardware.bf16_is_fast, hardware.fast_bf16_or_fp32):
            function.cache_clear()
        monkeypatch.setattr(hardware, "cpu_flags", lambda: frozenset(flags))

    yield set_flags
    for function in (hardware.bf16_is_fast, hardware.fast_bf16_or_fp32):
        function.cache_clear()


@pytest.mark.parametrize(
    ("flags", "precision", "dtype"),
    [
        ({"avx2", "fma"}, "fp32", "float32"),  # e.g. an EPYC without avx512_bf16: bf16 ~100x slower
        ({"avx512f", "avx512_bf16"}, "bf16", "bfloat16"),
        ({"amx_bf16", "amx_tile"}, "bf16", "bfloat16"),
        (set(), "fp32", "float32"),  # no /proc/cpuinfo
    ],
)
def test_fast_follows_the_cpu_flags(cpu, caplog, flags, precision, dtype) -> None:
    cpu(flags)
    assert resolve_precision("fast") == precision and resolve_dtype("fast") == dtype
    assert "precision 'fast' on this CPU" in caplog.text  # the choice is said, once
    for word in ("fp32", "bf16"):
        assert resolve_precision(word) == word  # explicit words are kept
    for word in ("auto", "float32", "bfloat16"):
        assert resolve_dtype(word) == word


def test_autocast_follows_the_resolved_precision(cpu) -> None:
    cpu(set())
    with autocast(torch.device("cpu"), "fast"):
        assert not torch.is_autocast_enabled("cpu")
    cpu({"avx512_bf16"})
    with autocast(torch.device("cpu"), "fast"):
        assert torch.is_autocast_enabled("cpu")
    with autocast(torch.device("cpu"), "fp16"):  # fp16 is asked for by name only, never picked by "fast"
        assert torch.get_autocast_dtype("cpu") == torch.float16
    with pytest.raises(ValueError, match="precision must be one of"):
        autocast(torch.device("cpu"), "fp8")


def test_this_machine_reads_real_flags() -> None:
    flags = hardware.cpu_flags()
    assert isinstance(flags, frozenset)
    assert hardware.bf16_is_fast("cpu") == bool(flags & {"avx512_bf16", "amx_bf16"})
