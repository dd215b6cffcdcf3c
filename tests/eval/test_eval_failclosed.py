"""Results and models that cannot be forged or mixed up, and nothing deleted that the project did not make:
a tampered samples.jsonl is refused on resume, the model fingerprint covers every byte of the weights,
`model --out` never empties a folder it did not make, and a mistyped local path is no hub download."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from test_eval_harness import ScriptedRunner, setup  # noqa: F401  (setup is a fixture)
from typer.testing import CliRunner

from stare_agents.cli import app
from stare_agents.eval.harness import evaluate
from stare_agents.eval.report import model_identity, read_samples
from stare_agents.models import STAMP, file_sha256, prepare_model


def interrupted_run(setup: dict, out: Path) -> Path:  # noqa: F811
    with pytest.raises(KeyboardInterrupt):
        evaluate(
            setup["model"],
            setup["benchmarks"],
            setup["config"],
            out=out,
            runner=ScriptedRunner(stop_after_chunks=2),
            progress=False,
        )
    return out / "samples.jsonl"


def rewrite_and_resume(setup: dict, out: Path, records: list[dict]) -> ScriptedRunner:  # noqa: F811
    """Write `records` as the samples file of `out`, then resume the evaluation there."""
    (out / "samples.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records), encoding="utf-8")
    runner = ScriptedRunner()
    evaluate(setup["model"], setup["benchmarks"], setup["config"], out=out, runner=runner)
    return runner


@pytest.mark.parametrize(
    "field, forged, says",
    [
        ("correct", "false", "correct = 'false' is not a bool"),  # a truthy string must never count
        ("correct", 1, "correct = 1 is not a bool"),
        ("failed", "no", "failed = 'no' is not a bool"),
        ("reward", "1.0", "reward = '1.0' is not a int or float"),
        ("reward", True, "reward = True is not a int or float"),
        ("sample_index", 1.0, "sample_index = 1.0 is not a int"),
        ("problem_id", 7, "problem_id = 7 is not a str"),
        ("stop_reason", "won", "stop_reason 'won' is not one of"),
        ("turns", {}, "turns = {} is not a list"),
    ],
)
def test_a_tampered_samples_file_is_refused(setup: dict, tmp_path: Path, field, forged, says) -> None:  # noqa: F811
    samples = interrupted_run(setup, tmp_path / "run")
    records = read_samples(samples)
    records[1][field] = forged
    samples.write_text("".join(json.dumps(r) + "\n" for r in records), encoding="utf-8")
    runner = ScriptedRunner()
    with pytest.raises(ValueError, match=r"not trusted|not resumed") as error:
        evaluate(setup["model"], setup["benchmarks"], setup["config"], out=tmp_path / "run", runner=runner)
    assert says in str(error.value) and runner.calls == []  # refused before anything ran


@pytest.mark.parametrize(
    "forge, says",
    [
        (lambda t: t.update(action_mask=[2] * len(t["action_mask"])), "values other than 0 and 1"),
        (lambda t: t.update(response_ids=t["response_ids"][:-1]), "disagree in length"),
        (lambda t: t.update(rollout_logprobs=["x"] * len(t["rollout_logprobs"])), "finite numbers"),
        (lambda t: t.update(prompt_ids=[1.5]), "lists of integers"),
        (lambda t: t.pop("action_mask"), "must be a mapping of"),
    ],
)
def test_tampered_token_fields_are_refused(setup: dict, tmp_path: Path, forge, says) -> None:  # noqa: F811
    samples = interrupted_run(setup, tmp_path / "run")
    records = read_samples(samples)
    forge(records[1]["tokens"])
    with pytest.raises(ValueError, match=says):
        rewrite_and_resume(setup, tmp_path / "run", records)


def test_samples_are_rollouts_and_older_lines_without_tokens_still_resume(
    setup: dict,  # noqa: F811
    tmp_path: Path,
) -> None:
    """samples.jsonl lines carry the episode's tokens as a saved RL rollout does (read_rollouts reads both);
    a file written before that (no tokens) resumes and shows as turn texts."""
    from stare_agents.rollout_log import read_rollouts

    samples = interrupted_run(setup, tmp_path / "run")
    records = read_samples(samples)
    saved = read_rollouts(samples)
    assert len(saved) == len(records) > 0
    for record, rollout in zip(records, saved, strict=True):
        t = rollout.trajectory
        assert (t.prompt_ids, t.response_ids, t.action_mask) == tuple(
            record["tokens"][k] for k in ("prompt_ids", "response_ids", "action_mask")
        )
        assert t.task_id == record["problem_id"] and [turn.text for turn in t.turns] == [
            turn["text"] for turn in record["turns"]
        ]
        assert rollout.status == ("failed" if record["failed"] else "trained")
    for record in records:
        del record["tokens"]
    samples.write_text("".join(json.dumps(r) + "\n" for r in records), encoding="utf-8")
    assert [r.trajectory.response_ids for r in read_rollouts(samples)] == [[] for _ in records]
    runner = ScriptedRunner()
    evaluate(setup["model"], setup["benchmarks"], setup["config"], out=tmp_path / "run", runner=runner)
    resumed = read_samples(samples)
    assert resumed[: len(records)] == records and all("tokens" in r for r in resumed[len(records) :])


@pytest.mark.parametrize(
    "changes, says",
    [
        ({"correct": True, "failed": True, "stop_reason": "engine_error"}, "failed sample is marked correct"),
        (
            {"correct": True, "stop_reason": "policy_error", "failed": False},
            "failed sample is marked correct",
        ),
        ({"failed": True, "stop_reason": "answered"}, "disagrees with stop_reason"),
        ({"failed": False, "stop_reason": "engine_error"}, "disagrees with stop_reason"),
        ({"reward": float("nan")}, "not finite"),
        ({"num_turns": -1}, "negative"),
    ],
)
def test_records_that_contradict_themselves_are_refused(setup: dict, tmp_path: Path, changes, says) -> None:  # noqa: F811
    samples = interrupted_run(setup, tmp_path / "run")
    records = read_samples(samples)
    records[0].update(changes)
    with pytest.raises(ValueError, match=says):
        rewrite_and_resume(setup, tmp_path / "run", records)


@pytest.mark.parametrize("changes", [{"bonus": 1}, {"correct_strict": True}])
def test_unknown_fields_are_refused_and_the_folder_is_left_as_it_was(
    setup: dict,  # noqa: F811
    tmp_path: Path,
    changes,
) -> None:
    samples = interrupted_run(setup, tmp_path / "run")
    records = read_samples(samples)
    records[0].update(changes)
    samples.write_text("".join(json.dumps(r) + "\n" for r in records) + '{"torn', encoding="utf-8")
    before = {p.name: p.read_bytes() for p in (tmp_path / "run").iterdir()}
    runner = ScriptedRunner()
    with pytest.raises(ValueError, match=rf"unknown fields \['{next(iter(changes))}'\]") as error:
        evaluate(setup["model"], setup["benchmarks"], setup["config"], out=tmp_path / "run", runner=runner)
    assert str(samples) in str(error.value) and "not resumed" in str(error.value) and runner.calls == []
    assert {p.name: p.read_bytes() for p in (tmp_path / "run").iterdir()} == before  # torn line and all


def interrupted_with_wrong_samples(setup: dict, out: Path) -> list[dict]:  # noqa: F811
    """Three chunks of three: q0's four samples (right), q1's (two right, two wrong), q2's first (wrong)."""
    with pytest.raises(KeyboardInterrupt):
        evaluate(
            setup["model"],
            setup["benchmarks"],
            setup["config"],
            out=out,
            runner=ScriptedRunner(3),
            progress=False,
        )
    return read_samples(out / "samples.jsonl")


def uninterrupted(setup: dict, out: Path) -> dict:  # noqa: F811
    return evaluate(setup["model"], setup["benchmarks"], setup["config"], out=out, runner=ScriptedRunner())


@pytest.mark.parametrize(
    "changes, says",
    [
        # issue 51, item 2: a wrong sample marked correct with `extracted` set to the answer (its response
        # still says x): the extracted answer alone grades correct, so it resumed as correct (avg@4 rose)
        (
            {"correct": True, "extracted": "2", "reward": 1.0},
            "graded again from its response text it is correct=False",
        ),
        (
            {"correct": True, "reward": 1.0},
            "correct=False, extracted='x', reward=0.0, where the record says correct=True",
        ),
        ({"extracted": "2"}, "extracted='x'"),  # an edit that changes no grade is an edit too
        ({"answer": "x"}, "its answer 'x' is not the benchmark's, '2'"),
        ({"reward": 0.5}, "reward=0.0, where the record says correct=False, extracted='x', reward=0.5"),
        ({"turns": [{"text": 5}]}, "its turns do not hold the policy's text"),
        # ended by the rollout, never graded: cannot be correct
        ({"stop_reason": "token_budget", "correct": True, "reward": 1.0}, "ended 'token_budget', ungraded"),
    ],
)
def test_a_record_that_does_not_grade_as_it_says_is_sampled_again_and_counted(
    setup: dict,  # noqa: F811
    tmp_path: Path,
    changes,
    says,
) -> None:
    records = interrupted_with_wrong_samples(setup, tmp_path / "run")
    forged = next(i for i, r in enumerate(records) if r["problem_id"] == "q1" and r["sample_index"] == 2)
    assert not records[forged]["correct"] and records[forged]["extracted"] == "x"
    original = dict(records[forged])
    records[forged].update(changes)
    runner = rewrite_and_resume(setup, tmp_path / "run", records)
    rerun = [key for chunk in runner.calls for key in chunk]
    assert rerun[0] == ("alpha", "q1", 2) and len(rerun) == 20 - len(records) + 1  # it, then the rest
    resumed = {
        (r["problem_id"], r["sample_index"]): r for r in read_samples(tmp_path / "run" / "samples.jsonl")
    }
    assert resumed[("q1", 2)]["correct"] is False and resumed[("q1", 2)]["extracted"] == "x"
    results = json.loads((tmp_path / "run" / "results.json").read_text())
    assert results["timing"]["samples_regraded_rerun"] == 1
    assert "Resumed: 1 sample(s) did not grade again" in (tmp_path / "run" / "results.md").read_text()
    if changes.get("extracted") == "2" and changes.get("correct"):  # the forgery
        alone = uninterrupted(setup, tmp_path / "alone")
        assert results["benchmarks"] == alone["benchmarks"]  # the same figures as a run never interrupted
    (rejected,) = [
        json.loads(line) for line in (tmp_path / "run" / "samples.rejected.jsonl").read_text().splitlines()
    ]
    assert rejected["record"] == {**original, **changes} and says in rejected["rejected_because"]


def test_a_sample_graded_again_from_its_text_resumes_by_the_environments_own_grading(
    setup: dict,  # noqa: F811
    tmp_path: Path,
) -> None:
    """Grading again is the environment's own: an answer equal to the reference in value still counts."""
    samples = interrupted_run(setup, tmp_path / "run")
    records = read_samples(samples)
    records[0]["turns"][-1]["text"] = "The answer is \\boxed{\\frac{2}{2}}."
    records[0]["extracted"] = "\\frac{2}{2}"
    runner = rewrite_and_resume(setup, tmp_path / "run", records)
    assert len([key for chunk in runner.calls for key in chunk]) == 20 - len(records)
    assert read_samples(samples)[0]["extracted"] == "\\frac{2}{2}"
    assert (
        json.loads((tmp_path / "run" / "results.json").read_text())["timing"]["samples_regraded_rerun"] == 0
    )


def test_fingerprint_covers_the_middle_of_the_weights_and_is_cached(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("STARE_CACHE_DIR", str(tmp_path / "cache"))
    model = tmp_path / "m"
    model.mkdir()
    (model / "config.json").write_text("{}")
    weights = model / "model.safetensors"
    data = bytearray(os.urandom(5 << 20))  # 5 MiB: the middle is more than a MiB from either end
    weights.write_bytes(bytes(data))
    first = model_identity(model)
    data[len(data) // 2] ^= 1  # one bit in the middle: another checkpoint with the same size
    weights.write_bytes(bytes(data))
    os.utime(weights, ns=(1, 1))
    second = model_identity(model)
    assert second["fingerprint"] != first["fingerprint"]
    cache = json.loads((tmp_path / "cache" / "weight-sha256.json").read_text())
    assert list(cache.values()) == [second["weights"][0]["sha256"]]  # the stale entry of the file was dropped
    # an unchanged file (same size and mtime) is not read again: the cached value answers
    key = next(iter(cache))
    cache[key] = "f" * 64
    (tmp_path / "cache" / "weight-sha256.json").write_text(json.dumps(cache))
    assert file_sha256(weights) == "f" * 64
    os.utime(weights, ns=(2, 2))  # touched: hashed again
    assert file_sha256(weights) == second["weights"][0]["sha256"]
    (tmp_path / "cache" / "weight-sha256.json").write_text("[not a dict")  # a damaged cache is ignored
    assert file_sha256(weights) == second["weights"][0]["sha256"]


def test_model_out_refuses_a_folder_it_did_not_make(tmp_path: Path) -> None:
    folder = tmp_path / "data"
    folder.mkdir()
    (folder / "notes.txt").write_text("keep me")
    with pytest.raises(FileExistsError, match="did not make"):
        prepare_model("tiny", out=folder)
    with pytest.raises(FileExistsError, match="did not make"):
        prepare_model("tiny", out=folder, force=True)
    assert (folder / "notes.txt").read_text() == "keep me" and len(list(folder.iterdir())) == 1
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".data.")]  # no temporary left either
    a_file = tmp_path / "file"
    a_file.write_text("x")
    with pytest.raises(FileExistsError):
        prepare_model("tiny", out=a_file)
    assert a_file.read_text() == "x"
    empty = tmp_path / "empty"
    empty.mkdir()
    assert (prepare_model("tiny", out=empty) / STAMP).is_file()  # an empty folder is fine
    (empty / "config.json").write_text("{}")  # a model we made is rebuilt on force
    assert (prepare_model("tiny", out=empty, force=True) / "config.json").read_text() != "{}"


def test_model_out_dot_in_a_folder_with_a_file_keeps_the_file(tmp_path: Path, monkeypatch) -> None:
    work = tmp_path / "project"
    work.mkdir()
    (work / "train.py").write_text("print('mine')")
    monkeypatch.chdir(work)
    result = CliRunner().invoke(app, ["model", "tiny", "--out", "."])
    assert result.exit_code != 0
    assert (work / "train.py").read_text() == "print('mine')" and sorted(os.listdir(work)) == ["train.py"]
    assert sorted(os.listdir(tmp_path)) == ["project"]


def test_a_mistyped_local_path_is_an_error_not_a_download(tmp_path: Path, monkeypatch) -> None:
    (tmp_path / "runs" / "sft_model").mkdir(parents=True)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("HF_HUB_OFFLINE", "0")

    def no_download(*args, **kwargs):
        raise AssertionError("a mistyped local path must not reach the hub")

    monkeypatch.setattr("stare_agents.models._download_hub", no_download)
    with pytest.raises(FileNotFoundError, match="mistyped local path"):
        prepare_model("runs/sft_modle")


@pytest.mark.parametrize(
    "spec, says",
    [
        ("data/aime2O24", r"no file or folder data/aime2O24 \(but data/ exists here"),  # a letter O for a 0
        ("data/sub/aime24", "benchmark file data/sub/aime24 does not exist"),  # no hub id has two slashes
        ("./aime24", "benchmark file aime24 does not exist"),
        (str(Path("/nonexistent") / "aime24"), "benchmark file /nonexistent/aime24 does not exist"),
    ],
)
def test_a_mistyped_benchmark_path_is_an_error_not_a_dataset_id(
    tmp_path: Path, monkeypatch, spec: str, says: str
) -> None:
    from stare_agents.eval import benchmarks

    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "aime2024.jsonl").write_text('{"id": "1", "problem": "p", "answer": "1"}\n')
    monkeypatch.chdir(tmp_path)

    def no_dataset(*args, **kwargs):
        raise AssertionError("a mistyped local path must not be loaded as a Hugging Face dataset")

    monkeypatch.setattr(benchmarks, "TaskDataset", no_dataset)
    with pytest.raises(FileNotFoundError, match=says):
        benchmarks.load_benchmark(spec)
    # an owner/name whose owner is no folder here is still a dataset id
    assert benchmarks.benchmark_source("HuggingFaceH4/MATH-500")[1] == "HuggingFaceH4/MATH-500"
