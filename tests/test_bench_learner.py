"""benchmarks/bench_learner.py on the CPU with a small shape: every figure the GPU run reports (tokens/s, peak
memory, padding share, pre-update share, packed vs padded, the STARE / GRPO-ds ratio) in strict JSON; a shape that
cannot fit is refused by the memory plan before any weight is made."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from support import load_script

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "bench_learner.py"


@pytest.mark.slow
def test_a_small_shape_reports_every_figure_on_the_cpu(tmp_path, capsys):
    bench = load_script(SCRIPT)
    out = tmp_path / "learner.json"
    args = ["--device", "cpu", "--shape", "tiny", "--rows", "6", "--prompt", "8", "--response", "8:40"]
    args += ["--group-prompts"]  # rows 0-3 and 4-5 share their prompts
    args += ["--micro-batch-tokens", "128", "--precisions", "fp32", "--rounds", "1", "--ratio-rounds", "1"]
    assert bench.main([*args, "--threads", "1", "--json", str(out)]) == 0
    printed = capsys.readouterr().out
    report = json.loads(out.read_text())  # strict JSON: NaN would not parse back into a float here
    assert report["device"] == "CPU" and report["rows"] == 6 and report["micro_batches"] >= 2
    assert 0 < report["padding_share"] < 1 and "mfu" not in json.dumps(report)  # no CPU peak to hold MFU to
    rows = {row["rows"]: row for row in report["throughput"]}
    assert set(rows) == {"shared", "packed", "padded"}
    for name, row in rows.items():
        assert row["tokens_per_s"] > 0 and 0 <= row["pre_update_share"] < 1 and row["peak_memory_bytes"] > 0
        assert row["plan_estimate_bytes"] > 0
        if name == "shared":  # micro-batches cut by packed tokens, each prompt once: no more
            assert row["micro_batches"] <= report["micro_batches"]
        else:
            assert row["micro_batches"] == report["micro_batches"]
        assert 0 < row["learner_memory_bytes"] < row["peak_memory_bytes"]
        assert row["memory_before_bytes"] + row["learner_memory_bytes"] == row["peak_memory_bytes"]
    assert report["ratio"]["stare_over_grpo_ds"] > 0 and report["packed_over_padded"]["fp32"] > 0
    assert report["shared_over_packed"]["fp32"] > 0
    for words in (
        "padding",
        "tok/s",
        "packed / padded tokens/s",
        "shared / packed tokens/s",
        "STARE (gate on) / GRPO-ds",
        "memory plan",
    ):
        assert words in printed


def test_a_shape_that_cannot_fit_is_refused_before_any_weight_is_made(tmp_path, capsys, monkeypatch):
    bench = load_script(SCRIPT)
    built = []
    monkeypatch.setattr(bench, "build", lambda *a: built.append(a))
    out = tmp_path / "learner.json"
    args = [
        "--device",
        "cpu",
        "--shape",
        "qwen2.5-7b",
        "--rows",
        "2",
        "--precisions",
        "bf16",
        "--json",
        str(out),
    ]
    assert bench.main([*args, "--device-memory-gib", "139.8"]) == 0  # one H200
    (row,) = json.loads(out.read_text())["throughput"]
    assert "16 bytes a parameter" in row["refused"] and built == []
    assert "refused by the memory plan" in capsys.readouterr().out


def test_an_unknown_shape_names_the_allowed_ones():
    bench = load_script(SCRIPT)
    with pytest.raises(SystemExit, match=r"--shape 'qwen9': allowed: qwen2\.5-0\.5b"):
        bench.shape_config("qwen9")


def test_the_cpu_peak_is_of_the_block_and_freed_memory_is_not_counted_again():
    """On the CPU the peak is the resident set sampled while the block runs, over what the process held when it
    began: a 256 MiB tensor made and freed inside shows; after it, the next block starts from the lower level."""
    import torch

    bench = load_script(SCRIPT)
    with bench.PeakMemory("cpu") as first:
        block = torch.ones(64 * 2**20)  # 256 MiB, touched
        del block
    assert first.learner >= 200 * 2**20, first.learner
    with bench.PeakMemory("cpu") as second:
        pass
    assert second.baseline < first.peak - 200 * 2**20 and second.learner < 64 * 2**20
