"""The harness's planning, resumption and aggregation, and the reports, with trajectories built here.

The runner below stands in for the rollout layer only where these tests pin the harness's own logic
(which samples run, what is written, how a resume continues); the end-to-end tests in
test_eval_e2e.py run the real rollout layer, engine and sandbox.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Sequence
from pathlib import Path

import pytest
from rich.console import Console

from stare_agents.envs import Task
from stare_agents.eval import report
from stare_agents.eval.benchmarks import Benchmark
from stare_agents.eval.harness import RUN_FILE, EvalConfig, SampleSpec, evaluate, plan_samples, sample_seed
from stare_agents.eval.metrics import pass_at_k
from stare_agents.eval.report import (
    SAMPLE_KEYS,
    append_samples,
    compare_runs,
    drop_torn_tail,
    load_results,
    model_identity,
    read_samples,
)
from stare_agents.trajectory import Trajectory, TurnRecord

# which samples are correct / failed, by problem id
CORRECT = {"q0": {0, 1, 2, 3}, "q1": {0, 1}, "q2": set(), "r0": {1}, "r1": {0, 1, 2, 3}}
FAILED = {("q2", 3), ("r0", 0)}


class ScriptedRunner:
    """Answers each sample with a trajectory whose outcome is fixed by `CORRECT` and `FAILED`."""

    def __init__(self, stop_after_chunks: int | None = None) -> None:
        self.calls: list[list[tuple[str, str, int]]] = []
        self.stop_after_chunks = stop_after_chunks

    def collect(self, specs: Sequence[SampleSpec]) -> list[Trajectory]:
        if self.stop_after_chunks is not None and len(self.calls) >= self.stop_after_chunks:
            raise KeyboardInterrupt  # the run is interrupted while this chunk is in flight
        self.calls.append([spec.key for spec in specs])
        return [self.trajectory(spec) for spec in specs]

    @staticmethod
    def trajectory(spec: SampleSpec) -> Trajectory:
        pid = spec.task.id
        failed = (pid, spec.sample_index) in FAILED
        correct = spec.sample_index in CORRECT[pid] and not failed
        text = f"Wait, let me compute.\n```python\nprint({spec.seed % 100})\n```"
        answer = f"The answer is \\boxed{{{spec.task.answer if correct else 'x'}}}."
        turns = [
            TurnRecord(text, 6, "stop", 1, ["ok"], "\n```output\n1\n```\n", 3),
            TurnRecord(answer, 4, "eos"),
        ]
        mask = [1] * 6 + [0] * 3 + [1] * 4
        return Trajectory(
            prompt_ids=[5, 6, 7],
            response_ids=list(range(13)),
            action_mask=mask,
            rollout_logprobs=[-1.0 if m else 0.0 for m in mask],
            reward=float(correct),
            num_turns=2,
            stop_reason="engine_error" if failed else "answered",
            turns=turns,
            info={
                "extracted": None if failed else spec.task.answer if correct else "x",
                "grade_reason": "wrong",
            },
            task_id=pid,
            group_id=spec.group_id,
            sample_index=spec.sample_index,
            correct=correct,
            error="engine died" if failed else None,
        )

    def close(self) -> None:
        pass


def write_benchmark(path: Path, ids: list[str]) -> Path:
    rows = [{"id": pid, "problem": f"Problem {pid}?", "answer": str(i + 1)} for i, pid in enumerate(ids)]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


@pytest.fixture
def setup(tmp_path: Path) -> dict:
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text('{"model_type": "llama"}')
    (model / "model.safetensors").write_bytes(b"\x01" * 4096)
    return {
        "model": model,
        "benchmarks": [
            str(write_benchmark(tmp_path / "alpha.jsonl", ["q0", "q1", "q2"])),
            str(write_benchmark(tmp_path / "beta.jsonl", ["r0", "r1"])),
        ],
        "config": EvalConfig(protocol="tir", samples=4, chunk_size=3, bootstrap=200),
    }


def stable(results: dict) -> dict:
    """results.json without what differs between runs of the same evaluation (time, timing, run shape)."""
    data = json.loads(json.dumps(results))
    for key in ("created", "timing"):
        data.pop(key)
    for key in ("workers", "chunk_size"):
        data["settings"].pop(key)
    return data


def test_evaluate_writes_samples_and_results_that_agree(setup: dict, tmp_path: Path) -> None:
    out = tmp_path / "run"
    runner = ScriptedRunner()
    results = evaluate(
        setup["model"], setup["benchmarks"], setup["config"], out=out, runner=runner, progress=False
    )
    # 5 problems x 4 samples in chunks of 3, in problem order
    assert [len(c) for c in runner.calls] == [3, 3, 3, 3, 3, 3, 2]
    assert runner.calls[0] == [("alpha", "q0", 0), ("alpha", "q0", 1), ("alpha", "q0", 2)]
    samples = read_samples(out / "samples.jsonl")
    assert len(samples) == 20 and all(tuple(s) == (*SAMPLE_KEYS, "tokens") for s in samples)
    first = samples[0]
    assert (
        first["text"].startswith("Wait, let me compute.\n```python") and "```output\n1\n```" in first["text"]
    )
    assert first["turns"][0]["tool_statuses"] == ["ok"] and first["seed"] == sample_seed(0, "alpha", "q0", 0)
    failed = [s for s in samples if s["failed"]]
    assert {(s["problem_id"], s["sample_index"]) for s in failed} == FAILED
    assert all(not s["correct"] and s["error"] == "engine died" for s in failed)

    alpha = results["benchmarks"]["alpha"]["metrics"]
    # q0 4/4, q1 2/4, q2 0/3 successful (one failed)
    assert alpha["avg"]["value"] == pytest.approx((1 + 0.5 + 0) / 3)
    assert alpha["pass_at"]["pass@2"]["value"] == pytest.approx((1 + (1 - 1 / 6) + 0) / 3)
    assert alpha["pass_at"]["pass@4"]["problems"] == 2  # q2 has 3 successful samples
    assert alpha["error_rate"] == pytest.approx(1 / 12)
    beta = results["benchmarks"]["beta"]["metrics"]
    # r0: sample 0 failed, 1 of the 3 others correct; r1 4/4
    assert beta["avg"]["value"] == pytest.approx((1 / 3 + 1) / 2)
    assert beta["avg_strict"]["value"] == pytest.approx((1 / 4 + 1) / 2)
    assert beta["pass_at"]["pass@2"]["value"] == pytest.approx((pass_at_k(3, 1, 2) + 1) / 2)

    # results.json agrees with samples.jsonl: counts per benchmark recomputed from the samples
    on_disk = load_results(out)
    assert stable(on_disk) == stable(results)
    for name, entry in on_disk["benchmarks"].items():
        rows = [s for s in samples if s["benchmark"] == name]
        metrics = entry["metrics"]
        assert metrics["samples"] == len(rows) == entry["samples_done"] == entry["samples_planned"]
        assert metrics["correct"] == sum(s["correct"] for s in rows)
        assert metrics["failed"] == sum(s["failed"] for s in rows)
        assert entry["complete"] and entry["behavior"]["tool_calls_per_response"] == 1.0
        assert entry["behavior"]["reflection/hesitation_per_response"] == 1.0
    assert on_disk["complete"] and on_disk["model"]["fingerprint"]
    assert on_disk["settings"]["samples"] == {"alpha": 4, "beta": 4}
    assert on_disk["settings"]["protocol"]["env_id"] == "stare_agents/MathTIR-v0"
    md = (out / "results.md").read_text()
    assert "| alpha | 3 | avg@4 50.0 [" in md and "8.3% (1/12)" in md
    assert (out / "pass_at_k.png").stat().st_size > 1000
    assert (out / RUN_FILE).exists()


def test_interrupted_run_resumes_without_redoing_samples(setup: dict, tmp_path: Path) -> None:
    full = evaluate(
        setup["model"],
        setup["benchmarks"],
        setup["config"],
        out=tmp_path / "full",
        runner=ScriptedRunner(),
        progress=False,
    )
    out = tmp_path / "interrupted"
    with pytest.raises(KeyboardInterrupt):
        evaluate(
            setup["model"],
            setup["benchmarks"],
            setup["config"],
            out=out,
            runner=ScriptedRunner(stop_after_chunks=2),
            progress=False,
        )
    assert len(read_samples(out / "samples.jsonl")) == 6
    assert not (out / "results.json").exists()
    # a writer killed mid-line leaves a torn tail; it is cut off and that sample redone
    with open(out / "samples.jsonl", "a", encoding="utf-8") as handle:
        handle.write('{"benchmark": "alpha", "problem_id": "q1", "sampl')
    resumed_runner = ScriptedRunner()
    resumed = evaluate(
        setup["model"], setup["benchmarks"], setup["config"], out=out, runner=resumed_runner, progress=False
    )
    redone = [key for chunk in resumed_runner.calls for key in chunk]
    assert len(redone) == 14 and redone[0] == ("alpha", "q1", 2)
    assert stable(resumed) == stable(full)
    assert resumed["timing"]["samples_resumed"] == 6 and resumed["timing"]["samples_this_run"] == 14
    lines = (out / "samples.jsonl").read_text().splitlines()
    assert len(lines) == 20 and all(json.loads(line) for line in lines)
    # a finished run started again does nothing
    again = ScriptedRunner()
    evaluate(setup["model"], setup["benchmarks"], setup["config"], out=out, runner=again, progress=False)
    assert again.calls == []


def test_resume_refuses_other_settings_and_foreign_files(setup: dict, tmp_path: Path) -> None:
    out = tmp_path / "run"
    evaluate(
        setup["model"], setup["benchmarks"], setup["config"], out=out, runner=ScriptedRunner(), progress=False
    )
    other = EvalConfig(protocol="tir", samples=4, temperature=0.6, chunk_size=3)
    with pytest.raises(ValueError, match=r"other settings \(protocol: was"):
        evaluate(setup["model"], setup["benchmarks"], other, out=out, runner=ScriptedRunner(), progress=False)
    # a different model (weights changed)
    (setup["model"] / "model.safetensors").write_bytes(b"\x02" * 4096)
    with pytest.raises(ValueError, match="model: was"):
        evaluate(
            setup["model"],
            setup["benchmarks"],
            setup["config"],
            out=out,
            runner=ScriptedRunner(),
            progress=False,
        )
    # chunk size and worker count do not change the numbers: a resume with others is fine
    (setup["model"] / "model.safetensors").write_bytes(b"\x01" * 4096)
    evaluate(
        setup["model"],
        setup["benchmarks"],
        EvalConfig(protocol="tir", samples=4, chunk_size=7, bootstrap=200),
        out=out,
        runner=ScriptedRunner(),
        progress=False,
    )
    foreign = tmp_path / "foreign"
    foreign.mkdir()
    (foreign / "samples.jsonl").write_text('{"x": 1}\n')
    with pytest.raises(FileExistsError, match="not a resumable evaluation folder"):
        evaluate(
            setup["model"],
            setup["benchmarks"],
            setup["config"],
            out=foreign,
            runner=ScriptedRunner(),
            progress=False,
        )


def test_fewer_problems_in_the_same_folder_is_refused(setup: dict, tmp_path: Path) -> None:
    out = tmp_path / "run"
    evaluate(
        setup["model"], setup["benchmarks"], setup["config"], out=out, runner=ScriptedRunner(), progress=False
    )
    with pytest.raises(ValueError, match="other settings"):
        evaluate(
            setup["model"],
            setup["benchmarks"][:1],
            setup["config"],
            out=out,
            runner=ScriptedRunner(),
            progress=False,
        )


def test_runner_out_of_order_and_name_clash_are_errors(setup: dict, tmp_path: Path) -> None:
    class Shuffled(ScriptedRunner):
        def collect(self, specs):
            return list(reversed(super().collect(specs)))

    with pytest.raises(RuntimeError, match="task order"):
        evaluate(
            setup["model"],
            setup["benchmarks"],
            setup["config"],
            out=tmp_path / "a",
            runner=Shuffled(),
            progress=False,
        )
    (tmp_path / "b").mkdir()
    clash = write_benchmark(tmp_path / "b" / "alpha.jsonl", ["z"])
    with pytest.raises(ValueError, match="share a name"):
        evaluate(
            setup["model"],
            [setup["benchmarks"][0], str(clash)],
            setup["config"],
            out=tmp_path / "c",
            runner=ScriptedRunner(),
        )
    with pytest.raises(ValueError, match="--k"):
        evaluate(
            setup["model"],
            setup["benchmarks"],
            EvalConfig(samples=0),
            out=tmp_path / "d",
            runner=ScriptedRunner(),
        )
    with pytest.raises(FileNotFoundError, match=r"no config\.json"):
        evaluate(
            tmp_path / "b", setup["benchmarks"], setup["config"], out=tmp_path / "e", runner=ScriptedRunner()
        )


def test_paper_preset_plans_32_samples_on_aime_and_4_elsewhere() -> None:
    task = Task(problem="p", answer="1", id="t")
    benches = [
        Benchmark("aime24", "x", (task,)),
        Benchmark("math500", "y", (task,)),
        Benchmark("own", "z", (task,)),
    ]
    config = EvalConfig(preset="paper")
    counts = {b.name: sum(1 for s in plan_samples(benches, config) if s.benchmark == b.name) for b in benches}
    assert counts == {"aime24": 32, "math500": 4, "own": 4}
    protocol = config.resolve_protocol()
    assert (protocol.temperature, protocol.top_p) == (1.0, 0.7)
    assert EvalConfig(preset="paper", top_p=0.9).resolve_protocol().top_p == 0.9
    assert EvalConfig(preset="paper", samples=2).samples_for("aime24") == 2
    assert EvalConfig().samples_for("aime24") == 1
    specs = plan_samples(benches, EvalConfig(samples=3, seed=1))
    assert len({s.seed for s in specs}) == len(specs)
    assert specs[0].group_id == "aime24/t"
    assert sample_seed(1, "aime24", "t", 0) == specs[0].seed


def test_compare_runs_side_by_side(setup: dict, tmp_path: Path) -> None:
    a = tmp_path / "before"
    b = tmp_path / "after"
    evaluate(
        setup["model"], setup["benchmarks"], setup["config"], out=a, runner=ScriptedRunner(), progress=False
    )
    evaluate(
        setup["model"],
        setup["benchmarks"][:1],
        EvalConfig(protocol="cot", samples=2, bootstrap=100),
        out=b,
        runner=ScriptedRunner(),
        progress=False,
    )
    png = tmp_path / "cmp" / "bars.png"
    table, data = compare_runs([a, b], out=png)
    assert png.stat().st_size > 1000
    assert data["before"]["alpha"]["value"] == pytest.approx(0.5)
    assert data["after"]["alpha"]["value"] == pytest.approx((1 + 1 + 0) / 3)  # q0 2/2, q1 2/2, q2 0/2
    assert "beta" not in data["after"]
    console = Console(width=200, record=True)
    console.print(table)
    text = console.export_text()
    assert "before" in text and "after" in text and "avg@4 50.0" in text and "avg@2 66.7" in text
    assert "protocol.name" in text and '"cot"' in text
    _, passes = compare_runs([a], metric="pass@2", out=None)
    assert passes["before"]["alpha"]["value"] == pytest.approx((1 + 5 / 6 + 0) / 3)
    with pytest.raises(ValueError, match="metric must be"):
        compare_runs([a], metric="best", out=None)
    with pytest.raises(FileNotFoundError, match=r"results\.json does not exist"):
        compare_runs([tmp_path], out=None)
    (tmp_path / "bad").mkdir()
    (tmp_path / "bad" / "results.json").write_text('{"format": "other"}')
    with pytest.raises(ValueError, match="not a stare-agents evaluation result"):
        compare_runs([tmp_path / "bad"], out=None)


def test_model_identity(tmp_path: Path) -> None:
    model = tmp_path / "m"
    model.mkdir()
    (model / "config.json").write_text("{}")
    (model / "model.safetensors").write_bytes(bytes(range(256)) * 10000)  # 2.5 MB: head and tail hashed
    first = model_identity(model)
    assert (
        first["name"] == "m" and first["weights"][0]["bytes"] == 2560000 and len(first["fingerprint"]) == 16
    )
    copy = tmp_path / "copy"
    shutil.copytree(model, copy)
    assert model_identity(copy)["fingerprint"] == first["fingerprint"]  # content, not place or mtime
    data = bytearray((model / "model.safetensors").read_bytes())
    data[-1] ^= 1
    (model / "model.safetensors").write_bytes(bytes(data))
    assert model_identity(model)["fingerprint"] != first["fingerprint"]
    assert model_identity("Qwen/Qwen2.5-7B") == {
        "path": "Qwen/Qwen2.5-7B",
        "name": "Qwen/Qwen2.5-7B",
        "fingerprint": None,
    }


def test_samples_file_hostile_content(tmp_path: Path) -> None:
    path = tmp_path / "samples.jsonl"
    record = {key: None for key in SAMPLE_KEYS} | {"benchmark": "b", "problem_id": "p", "sample_index": 0}
    append_samples(path, [record])
    assert drop_torn_tail(path) == 0
    path.write_text(path.read_text() + '{"benchmark": "b", "probl')
    assert len(read_samples(path)) == 1  # torn last line skipped
    assert drop_torn_tail(path) == len('{"benchmark": "b", "probl')
    assert path.read_text().endswith("}\n")
    path.write_text('{"torn\n' + json.dumps(record) + "\n")
    with pytest.raises(ValueError, match="damaged"):
        read_samples(path)
    path.write_text(json.dumps(record) + "\n" + json.dumps(record) + "\n")
    with pytest.raises(ValueError, match="appears twice"):
        read_samples(path)
    path.write_text('{"benchmark": "b"}\n')
    with pytest.raises(ValueError, match="not a sample record"):
        read_samples(path)
    path.write_text("[1, 2]\n")
    with pytest.raises(ValueError, match="not a sample record"):
        read_samples(path)
    path.write_text("no newline at all")
    assert drop_torn_tail(path) == len("no newline at all") and path.read_text() == ""
    assert read_samples(tmp_path / "missing.jsonl") == []
    assert report.drop_torn_tail(tmp_path / "missing.jsonl") == 0


def test_resume_follows_the_data_not_its_path(setup: dict, tmp_path: Path) -> None:
    out = tmp_path / "run"
    config = EvalConfig(protocol="tir", samples=2, chunk_size=3, bootstrap=0)
    evaluate(
        setup["model"], setup["benchmarks"][:1], config, out=out, runner=ScriptedRunner(), progress=False
    )
    moved = tmp_path / "elsewhere"
    moved.mkdir()
    copy = Path(shutil.copy(setup["benchmarks"][0], moved / "alpha.jsonl"))
    again = ScriptedRunner()
    evaluate(setup["model"], [str(copy)], config, out=out, runner=again, progress=False)
    assert again.calls == []  # the same problems from another folder: nothing to redo
    copy.write_text(copy.read_text().replace("Problem q1?", "Problem q1, edited?"))
    with pytest.raises(ValueError, match="benchmarks: was"):
        evaluate(setup["model"], [str(copy)], config, out=out, runner=ScriptedRunner(), progress=False)
