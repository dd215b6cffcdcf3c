"""Held-out benchmarks during training (eval.benchmarks), checkpoints `stare-agents eval --model` accepts, and
the config checks of the new keys."""

from __future__ import annotations

import json
from pathlib import Path

import gymnasium as gym
import pytest
import torch
from typer.testing import CliRunner

from stare_agents.cli import app
from stare_agents.eval.report import read_samples
from stare_agents.records import read_records
from stare_agents.train.checkpoint import latest_checkpoint, list_checkpoints, load_checkpoint
from stare_agents.train.config import load_config
from stare_agents.train.rl_loop import training_tasks
from stare_agents.train.trainer import Trainer, train

# a benchmark in the harness's file format, in the default job's task family (the "arith" protocol)
ROWS = [
    {"id": "m0", "problem": "Compute 1234 * 5678.", "answer": "7006652"},
    {"id": "m1", "problem": "Compute 4321 * 8765.", "answer": "37873565"},
    {"id": "m2", "problem": "Compute 1111 * 2222.", "answer": "2468642"},
]
SHORT = {"max_tokens_per_turn": 24, "max_total_tokens": 48}  # the tiny random model: keep episodes short


@pytest.fixture(autouse=True)
def acknowledge_local_sandbox(monkeypatch):
    monkeypatch.setenv("STARE_ALLOW_LOCAL_SANDBOX", "1")


def benchmark_file(folder: Path, name: str = "mini") -> Path:
    path = folder / f"{name}.jsonl"
    path.write_text("".join(json.dumps(row) + "\n" for row in ROWS))
    return path


def tiny(out: Path, *extra: str):
    overrides = [f"out_dir={out}", "rollout.sandbox=local", "sft.enabled=false", *extra]
    return load_config(recipe="tiny", overrides=overrides)


def test_a_tiny_run_evaluates_its_benchmarks_every_n_steps_and_at_the_end(tmp_path):
    bench = benchmark_file(tmp_path)
    entry = json.dumps({"benchmark": str(bench), "protocol": "arith", "k": 2, **SHORT})
    config = tiny(
        tmp_path / "run", "rl.steps=3", "eval.every=2", f"eval.benchmarks=[{entry}]", "eval.num_tasks=0"
    )
    summary = train(config)
    folder = tmp_path / "run"
    # eval.num_tasks=0: no held-out tasks of the environment, the benchmarks only
    assert summary["accuracy"] == {"base": None, "rl": None} and summary["rl_gain"] is None
    assert read_records(folder / "metrics.jsonl", "eval") == []

    records = read_records(folder / "metrics.jsonl", "rl")
    assert [r["step"] for r in records] == [0, 1, 2]
    evaluated = [r["step"] for r in records if "benchmark/mini/avg@2" in r]
    assert evaluated == [1, 2]  # after RL step 2 (eval.every) and after the last one (step 3)
    for record in (records[1], records[2]):
        assert 0.0 <= record["benchmark/mini/avg@2"] <= 1.0
        assert record["benchmark/mini/avg@2_ci_low"] <= record["benchmark/mini/avg@2"]
        assert record["benchmark/mini/avg@2"] <= record["benchmark/mini/avg@2_ci_high"]
        assert 0.0 <= record["benchmark/mini/pass@1"] <= record["benchmark/mini/pass@2"] <= 1.0
        assert record["benchmark/mini/problems"] == 3 and "rollout/mean_reward" in record  # beside training

    for steps in (2, 3):  # each evaluation is an eval harness folder, its samples from the trained weights
        out = folder / "evals" / f"step-{steps:06d}" / "mini"
        samples = read_samples(out / "samples.jsonl")
        assert len(samples) == 6 and {s["problem_id"] for s in samples} == {"m0", "m1", "m2"}
        # the weights after the step's update: one version past those that collected the step's rollouts
        assert {s["weight_version"] for s in samples} == {records[steps - 1]["rollout/weight_version"] + 1}
        results = json.loads((out / "results.json").read_text())
        avg = results["benchmarks"]["mini"]["metrics"]["avg"]["value"]
        assert avg == records[steps - 1]["benchmark/mini/avg@2"]
        assert results["settings"]["protocol"]["name"] == "arith"
        assert results["settings"]["samples"] == {"mini": 2}

    figures = summary["benchmarks"]["mini"]
    assert figures["steps"] == 3 and set(figures["avg_by_step"]) == {"2", "3"}
    assert figures["final"]["avg@2"] == records[2]["benchmark/mini/avg@2"]
    assert figures["folder"] == "evals/step-000003/mini"
    assert json.loads((folder / "summary.json").read_text())["benchmarks"] == summary["benchmarks"]

    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(folder / "tensorboard"))
    events.Reload()
    tags = set(events.Tags()["scalars"])
    assert {"benchmark/mini/avg@2", "rollout/mean_reward"} <= tags
    assert [e.step for e in events.Scalars("benchmark/mini/avg@2")] == [1, 2]


def test_every_checkpoint_is_a_model_folder_eval_accepts_and_resume_reads(tmp_path, tiny_two_step_run):
    folder = tiny_two_step_run.folder  # the tiny recipe's checkpoint.every=1, keep_last=2; two RL steps
    assert [step for step, _ in list_checkpoints(folder)] == [1, 2]
    first, last = (path for _, path in list_checkpoints(folder))
    assert last == latest_checkpoint(folder) and last.name == "step-00000002" and last.is_dir()
    assert {"config.json", "model.safetensors", "tokenizer_config.json", "trainer_state.ckpt"} <= {
        p.name for p in last.iterdir()
    }

    # the weights are stored once, and the resumable state gets them back exactly (the final model's)
    state = load_checkpoint(last)
    assert state["next_step"] == 2 and state["weight_version"] >= 2
    raw = torch.load(last / "trainer_state.ckpt", weights_only=True)
    assert "model" not in raw["learner"] and "optimizer" in raw["learner"]
    from stare_agents.train.policy import load_causal_lm

    final = load_causal_lm(folder / "final_model").state_dict()
    assert state["learner"]["model"].keys() == final.keys()
    assert all(torch.equal(state["learner"]["model"][k], final[k]) for k in final)
    earlier = load_checkpoint(first)["learner"]["model"]
    assert any(not torch.equal(earlier[k], final[k]) for k in final)  # step 1's policy, not the last one

    # `stare-agents eval --model <mid-run checkpoint>`
    bench = benchmark_file(tmp_path)
    out = tmp_path / "eval-step-1"
    command = ["eval", "--model", str(first), "--benchmark", str(bench), "--out", str(out)]
    command += ["--protocol", "arith", "--engine", "hf", "--sandbox", "local", "--k", "1"]
    command += ["--max-tokens-per-turn", "24", "--max-tokens", "48", "--bootstrap", "0"]
    result = CliRunner().invoke(app, command)
    assert result.exit_code == 0, result.output
    results = json.loads((out / "results.json").read_text())
    assert results["model"]["path"] == str(first.resolve()) and results["benchmarks"]["mini"]["complete"]
    # the model identity covers the weights, not the resumable state next to them
    assert [w["file"] for w in results["model"]["weights"]] == ["model.safetensors"]


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("[nope/missing.jsonl]", r"eval.benchmarks\[0\].benchmark = 'nope/missing.jsonl': .*does not exist"),
        ("[frobnicate]", r"eval.benchmarks\[0\].benchmark = 'frobnicate': unknown benchmark"),
        ("[{benchmark: BENCH, k: 0}]", r"eval.benchmarks\[0\].k = 0: .*>= 1"),
        ("[{benchmark: BENCH, k: 2.5}]", r"eval.benchmarks\[0\].k.*2.5"),
        ("[{benchmark: BENCH, protocol: nope}]", r"eval.benchmarks\[0\].protocol = 'nope': unknown protocol"),
        ("[{benchmark: BENCH, temperature: -1}]", r"eval.benchmarks\[0\] .*temperature must be in"),
        ("[{benchmark: BENCH, samples: 4}]", r"'samples'.*eval.benchmarks\[0\]"),
        (
            "[BENCH, BENCH]",
            r"eval.benchmarks\[1\].benchmark = .* has the name 'mini' of eval.benchmarks\[0\]",
        ),
        ("{benchmark: BENCH}", r"eval.benchmarks.*list"),
    ],
)
def test_bad_benchmark_settings_are_refused_where_the_config_loads(tmp_path, value, message):
    bench = benchmark_file(tmp_path)
    with pytest.raises(ValueError, match=message):
        load_config(recipe="tiny", overrides=[f"eval.benchmarks={value.replace('BENCH', str(bench))}"])


def test_a_benchmark_file_without_answers_is_refused_where_the_config_loads(tmp_path):
    path = tmp_path / "broken.jsonl"
    path.write_text(json.dumps({"id": "a", "problem": "2 + 2?"}) + "\n")
    with pytest.raises(ValueError, match=r"eval.benchmarks\[0\].benchmark = .*has no reference answer"):
        load_config(recipe="tiny", overrides=[f"eval.benchmarks=[{path}]"])


def test_benchmark_names_resolve_in_eval_data_dir(tmp_path):
    data = tmp_path / "data"
    data.mkdir()
    benchmark_file(data, "aime24")
    config = load_config(recipe="tiny", overrides=[f"eval.data_dir={data}", "eval.benchmarks=[aime24]"])
    assert config.eval.benchmarks[0].benchmark == "aime24" and config.eval.benchmarks[0].k == 1
    with pytest.raises(ValueError, match=r"eval.benchmarks\[0\].benchmark = 'aime25': .*does not exist"):
        load_config(recipe="tiny", overrides=[f"eval.data_dir={data}", "eval.benchmarks=[aime25]"])


def test_without_a_data_folder_benchmark_names_are_looked_up_when_the_run_starts(tmp_path, monkeypatch):
    """A config shown or checked before the data is fetched loads; the run refuses before any work, naming the
    entry and the key that points at the data."""
    import stare_agents.eval.benchmarks as benchmarks

    monkeypatch.delenv("STARE_DATA_DIR", raising=False)
    monkeypatch.setattr(benchmarks, "default_data_dir", lambda: tmp_path / "nowhere")
    config = tiny(tmp_path / "run", "eval.benchmarks=[{benchmark: aime24, protocol: arith}]")
    assert config.eval.benchmarks[0].benchmark == "aime24"
    with pytest.raises(ValueError, match=r"eval.benchmarks\[0\].benchmark = 'aime24': .*eval.data_dir=DIR"):
        Trainer(config).evaluation.benchmarks()
    with pytest.raises(ValueError, match=r"eval.benchmarks\[0\].benchmark = 'frobnicate': unknown benchmark"):
        tiny(tmp_path / "run", "eval.benchmarks=[frobnicate]")  # what is not a name is still checked at load


def test_a_dataset_without_a_held_out_part_trains_when_only_benchmarks_evaluate(tmp_path):
    """eval.num_tasks=0 (the paper recipes): the run's checks never ask the training set for a held-out split."""
    from stare_agents.train.config import check_run

    data = tmp_path / "train.jsonl"
    data.write_text("".join(json.dumps({"problem": f"{i} + {i}?", "answer": str(2 * i)}) + "\n" for i in range(4)))
    env = ["env.id=stare_agents/MathCoT-v0", f"env.kwargs={{dataset: {data}}}"]
    check_run(tiny(tmp_path / "a", *env, "eval.num_tasks=0"))
    with pytest.raises(ValueError, match="no held-out part"):
        check_run(tiny(tmp_path / "b", *env, "eval.num_tasks=2"))


def test_dataset_environments_are_never_evaluated_on_their_training_problems(tmp_path):
    data = tmp_path / "train.jsonl"
    rows = [{"id": f"p{i}", "problem": f"What is {i} + {i}?", "answer": str(2 * i)} for i in range(40)]
    data.write_text("".join(json.dumps(row) + "\n" for row in rows))
    env_id = "stare_agents/MathCoT-v0"
    trainer = Trainer(
        tiny(tmp_path / "a", f"env.id={env_id}", f"env.kwargs={{dataset: {data}, heldout_fraction: 0.25}}")
    )
    trainer.evaluation.check_heldout()
    heldout = {task.problem for task in trainer.evaluation.heldout_tasks(4)}
    assert len(heldout) == 4
    training = training_tasks(trainer.config, 0)[0]
    assert training.env_kwargs["split"] == "train"
    env = gym.make(env_id, **training.env_kwargs)
    drawn = set()
    for seed in range(100):
        env.reset(seed=seed)
        drawn.add(env.unwrapped.task.problem)
    env.close()
    assert len(drawn) > 10 and not drawn & heldout

    # no held-out part: refused before any work, instead of evaluating on training problems
    trainer = Trainer(tiny(tmp_path / "b", f"env.id={env_id}", f"env.kwargs={{dataset: {data}}}"))
    with pytest.raises(ValueError, match="no held-out part"):
        trainer.evaluation.check_heldout()
    # a split fixed in env.kwargs would make training and held-out tasks the same
    fixed = f"env.kwargs={{dataset: {data}, heldout_fraction: 0.25, split: train}}"
    with pytest.raises(ValueError, match=r"env\.kwargs\.split = 'train'"):
        Trainer(tiny(tmp_path / "c", f"env.id={env_id}", fixed)).evaluation.check_heldout()


@pytest.mark.parametrize(
    "recipe",
    [
        "qwen2.5-7b-tir-stare-c2",
        "qwen2.5-7b-tir-grpo-ds",
        "qwen2.5-7b-zero-tir-grpo-ds",
        "short-cot-qwen2.5-math-7b",
        "long-cot-r1-distill-qwen-1.5b",
        "long-cot-qwen3-8b",
    ],
)
def test_paper_recipes_refill_their_groups_and_never_evaluate_on_training_problems(recipe):
    config = load_config(recipe=recipe)
    assert config.algorithm().dynamic_sampling and config.rl.sampling_rounds >= 4
    assert config.eval.num_tasks == 0 and "heldout_fraction" not in config.env.kwargs
