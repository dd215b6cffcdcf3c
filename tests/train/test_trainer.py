"""The trainer end to end on the tiny recipe: stages, outputs, metrics, and an exact resume after SIGKILL."""

from __future__ import annotations

import json
import math
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from stare_agents.models import prepare_model
from stare_agents.records import read_records
from stare_agents.rollout_log import read_step_file, step_file
from stare_agents.train.checkpoint import latest_checkpoint, load_checkpoint
from stare_agents.train.config import load_config
from stare_agents.train.learner import LEARNER_METRICS
from stare_agents.train.policy import load_causal_lm
from stare_agents.train.trainer import train

# timing figures differ between runs; everything else in a step's record must be identical
TIMING = ("time/", "learner/step_s", "learner/pre_update_s", "learner/tokens_per_s", "rollout/tokens_per_s")


# the coin environment has no tool, so no sandbox is started for it (measured: the same metrics, ~1.4 s of CPU
# and a pool's start less a run)
COIN = [
    "env.id=tests/Coin-v0",
    "env.kwargs={}",
    "env.imports=[coin_env]",
    "sft.enabled=false",
    "rollout.sandbox=none",
]


@pytest.fixture(autouse=True)
def acknowledge_local_sandbox(monkeypatch):
    """These runs ask for the local sandbox (rollout.sandbox=local), which needs the acknowledgement."""
    monkeypatch.setenv("STARE_ALLOW_LOCAL_SANDBOX", "1")


def tiny(out: Path, *extra: str):
    return load_config(
        recipe="tiny", overrides=[f"out_dir={out}", "rollout.sandbox=local", "rl.steps=4", *extra]
    )


def comparable(record: dict) -> dict:
    return {
        k: (None if isinstance(v, float) and math.isnan(v) else v)
        for k, v in record.items()
        if not k.startswith(TIMING) and k not in TIMING
    }


def _dcp_model_state(folder: Path) -> dict:
    """The policy's weights in a sharded checkpoint, read with DCP's own full-state conversion."""
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

    dcp_to_torch_save(folder, folder.parent / "full.pt")
    return torch.load(folder.parent / "full.pt", weights_only=True)["model"]


def sigkill_after_checkpoint(out: Path, step: int, *overrides: str) -> None:
    """`stare-agents train --recipe tiny` in a process of its own, SIGKILLed once its step-`step` checkpoint
    exists (the run must not end before)."""
    command = [sys.executable, "-m", "stare_agents.cli", "train", "--recipe", "tiny", "--out", str(out)]
    command += ["rollout.sandbox=local", *overrides]
    environment = {**os.environ, "PYTHONPATH": str(Path(__file__).parent)}
    process = subprocess.Popen(
        command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True, env=environment
    )
    deadline = time.monotonic() + 600
    while latest_checkpoint(out) is None or str(step) not in latest_checkpoint(out).stem:
        assert process.poll() is None, "the run ended before it could be killed"
        assert time.monotonic() < deadline
        time.sleep(0.02)
    os.killpg(process.pid, signal.SIGKILL)
    process.wait()


def test_tiny_run_writes_every_output(tiny_two_step_run):
    # tiny(..., "rl.steps=2") as it is, shared with the other tests that only read a run (tests/conftest.py)
    folder, summary = tiny_two_step_run
    assert set(summary["accuracy"]) == {"base", "sft", "rl"}
    assert summary["rl_steps"] == 2 and summary["wall_time_s"] > 0 and summary["entropy_final"] is not None
    assert 0.0 <= summary["gate_on_fraction"] <= 1.0
    assert json.loads((folder / "summary.json").read_text()) == summary
    assert (folder / "training.png").stat().st_size > 0 and any((folder / "tensorboard").iterdir())
    assert (folder / "sft_model" / "config.json").exists() and (folder / "config.yaml").exists()
    assert (folder / "final_model" / "model.safetensors").exists()
    records = read_records(folder / "metrics.jsonl", "rl")
    assert [r["step"] for r in records] == [0, 1]
    for record in records:  # every learner figure, but one that was not measured (absent, never NaN)
        missing = set(LEARNER_METRICS) - set(record)
        # a share of an empty set: L+ (no T+ token), T+ / T- tokens of successful / failed trajectories
        may_miss = {"stare/lplus_negative_phi", "mismatch/lplus_abs_diff", "mismatch/lminus_abs_diff"}
        assert missing <= may_miss | {name for name in LEARNER_METRICS if name.startswith("phi_neg_share/")}
        assert "stare/lplus_negative_phi" not in missing or record["stare/lplus_share"] == 0
        assert all(0 <= record[k] <= 1 for k in record if k.startswith("phi_neg_share/"))
        assert record["phi_mass/pos_high"] <= 0 <= record["phi_mass/pos_low"]
        assert record["rollout/weight_version"] >= 1 and record["rollout/wasted_tokens"] == 0
        assert record["data/kept_trajectories"] == 8  # tiny: no dynamic sampling, 2 prompts x 4 samples
    assert [r["point"] for r in read_records(folder / "metrics.jsonl", "eval")] == ["base", "sft", "rl"]
    assert read_records(folder / "metrics.jsonl", "sft")[0]["traces"] > 0
    assert latest_checkpoint(folder).name == "step-00000002"  # a model folder (see test_trainer_benchmarks)
    rollouts, unread = read_step_file(step_file(folder, 1))  # the viewer's per-token entropy is recorded
    trained = [r for r in rollouts if r.learner_logprobs]
    assert not unread and trained and all(len(r.learner_entropy) == len(r.learner_logprobs) for r in trained)
    assert all(len(r.learner_phi) == len(r.learner_logprobs) for r in trained)  # Phi per token, for the viewer
    assert all(
        h > 0 for r in trained for h, m in zip(r.learner_entropy, r.trajectory.action_mask, strict=True) if m
    )


def test_every_json_file_of_a_run_parses_strictly(tmp_path, tiny_two_step_run):
    """What was not measured is absent, never NaN (learner/entropy_all with logging.entropy_all off; the share
    of L+ tokens with Phi < 0 when L+ is empty): a strict parser (no NaN, no Infinity) reads every line."""

    def refuse(constant: str):
        raise ValueError(f"{constant} is not JSON")

    def strict_rl_records(folder):
        lines = (folder / "metrics.jsonl").read_text(encoding="utf-8").split("\n")
        assert lines[-1] == ""
        records = [json.loads(line, parse_constant=refuse) for line in lines[:-1]]
        summary = json.loads((folder / "summary.json").read_text(encoding="utf-8"), parse_constant=refuse)
        return [r for r in records if r["kind"] == "rl"], summary

    train(tiny(tmp_path / "off", "rl.steps=2", "logging.entropy_all=false"))
    rl, summary = strict_rl_records(tmp_path / "off")
    assert len(rl) == 2 and all("learner/entropy_all" not in r and "learner/entropy" in r for r in rl)
    # no stand-in: without the all-trajectory entropy its figures are None, the sampler's are its own
    assert summary["entropy"]["all_final"] is None and summary["entropy"]["sampler_final"] is not None

    rl, summary = strict_rl_records(tiny_two_step_run.folder)  # logging.entropy_all is on by default
    # the tiny run trains on every trajectory (no dynamic sampling): the entropy over all of them is the
    # trained batch's, token for token
    assert all(r["learner/entropy_all"] == pytest.approx(r["learner/entropy"], rel=1e-6) for r in rl)
    assert summary["entropy"]["all_final"] == pytest.approx(rl[-1]["learner/entropy_all"])


def test_a_run_killed_with_sigkill_resumes_to_the_same_state_and_metrics(tmp_path):
    """Uninterrupted 4-step run vs. a run SIGKILLed once its step-2 checkpoint exists, then resumed."""
    import coin_env  # noqa: F401  (registers tests/Coin-v0: rewards with variance, so the model changes)

    reference = tmp_path / "reference"
    train(tiny(reference, *COIN))
    killed = tmp_path / "killed"
    sigkill_after_checkpoint(killed, 2, "rl.steps=4", *COIN)
    assert not (killed / "summary.json").exists()
    train(tiny(killed, *COIN), resume=True)

    a = load_checkpoint(latest_checkpoint(reference))
    b = load_checkpoint(latest_checkpoint(killed))
    assert a["next_step"] == b["next_step"] == 4
    records = read_records(reference / "metrics.jsonl", "rl")
    assert all(r["learner/grad_norm"] > 0 for r in records)  # the model really changed at every step
    for name, tensor in a["learner"]["model"].items():
        assert torch.equal(tensor, b["learner"]["model"][name]), name
    assert a["learner"]["stare"] == b["learner"]["stare"]
    first = [comparable(r) for r in read_records(reference / "metrics.jsonl", "rl")]
    second = [comparable(r) for r in read_records(killed / "metrics.jsonl", "rl")]
    assert [r["step"] for r in second] == [0, 1, 2, 3]  # what the killed attempt logged after step 2 is gone
    assert first == second
    summary = json.loads((killed / "summary.json").read_text())
    assert summary["accuracy"] == json.loads((reference / "summary.json").read_text())["accuracy"]


def test_the_random_token_control_trains_and_resumes_exactly(tmp_path):
    """The control baseline (rl.algorithm=stare-random) through the trainer: gate on (the tiny recipe's target
    is 10 nats), tokens reweighted, and its random draws continue from the checkpoint on resume."""
    import coin_env  # noqa: F401

    algorithm = ["rl.algorithm=stare-random", *COIN]
    reference = tmp_path / "reference"
    train(tiny(reference, *algorithm, "rl.steps=3"))
    records = read_records(reference / "metrics.jsonl", "rl")
    assert [r["algorithm"] for r in records] == ["stare-random"] * 3
    assert all(r["stare/gate_on"] == 1.0 and r["stare/lplus_share"] > 0 for r in records)
    resumed = tmp_path / "resumed"
    sigkill_after_checkpoint(resumed, 1, "rl.steps=3", *algorithm)
    train(tiny(resumed, *algorithm, "rl.steps=3"), resume=True)
    first = [comparable(r) for r in records]
    assert [comparable(r) for r in read_records(resumed / "metrics.jsonl", "rl")] == first
    a = load_checkpoint(latest_checkpoint(reference))["learner"]
    b = load_checkpoint(latest_checkpoint(resumed))["learner"]
    assert torch.equal(a["stare"]["generator"], b["stare"]["generator"])
    for name, tensor in a["model"].items():
        assert torch.equal(tensor, b["model"][name]), name


def test_compare_trains_the_second_algorithm_from_the_same_sft_model(tmp_path):
    import coin_env  # noqa: F401

    summary = train(tiny(tmp_path / "run", *COIN, "rl.steps=2", "sft.enabled=false"), compare="grpo-ds")
    assert summary["compare"]["algorithm"] == "grpo-ds" and "rl-grpo-ds" in summary["accuracy"]
    stare = read_records(tmp_path / "run" / "metrics.jsonl", "rl")
    grpo = read_records(tmp_path / "run" / "grpo-ds" / "metrics.jsonl", "rl")
    assert [r["algorithm"] for r in stare] == ["stare"] * 2 and [r["algorithm"] for r in grpo] == [
        "grpo-ds"
    ] * 2
    assert all(r["stare/gate_on"] == 0.0 for r in grpo)  # GRPO-ds never reweights
    assert summary["compare"]["entropy_final"] == grpo[-1]["learner/entropy"]


def test_dynamic_sampling_refills_from_the_next_prompts(tmp_path):
    """One sample per prompt: no group has reward variance, so every round is dropped and the step draws
    rl.sampling_rounds batches of prompts (the data position moves on by all of them) and trains on nothing."""
    import coin_env  # noqa: F401

    dynamic = ["rl.dynamic_sampling=true", "rl.sampling_rounds=3", "rl.steps=2"]
    train(tiny(tmp_path / "none", *COIN, *dynamic, "rl.samples_per_prompt=1", "rl.max_empty_steps=0"))
    records = read_records(tmp_path / "none" / "metrics.jsonl", "rl")
    assert [
        (r["data/sampling_rounds"], r["data/position"], r["data/kept_trajectories"]) for r in records
    ] == [
        (3, 6, 0),
        (3, 12, 0),
    ]
    assert [(r["data/kept_groups"], r["data/budget_exhausted"]) for r in records] == [(0, 1), (0, 1)]
    assert all("learner/entropy" not in r for r in records)  # no update without a kept group: not measured
    # four samples per prompt: groups with variance come quickly; at most prompts_per_step (2) are trained on
    train(tiny(tmp_path / "some", *COIN, *dynamic))
    for record in read_records(tmp_path / "some" / "metrics.jsonl", "rl"):
        assert 1 <= record["data/sampling_rounds"] <= 3 and record["data/kept_trajectories"] <= 8
        assert record["data/position"] % 2 == 0


def test_steps_that_never_find_reward_variance_stop_the_run_after_the_budget(tmp_path, caplog):
    """A dataset where no prompt ever has reward variance (one sample per prompt) stops after rl.max_empty_steps
    steps in a row that spent their whole budget, with a message naming the knobs, not a run that trains on
    nothing; the steps before the stop are logged, and a short step is said once (not at every step)."""
    import logging

    import coin_env  # noqa: F401

    from stare_agents.train.rl_loop import NoLearningSignal

    dynamic = ["rl.dynamic_sampling=true", "rl.sampling_rounds=2", "rl.steps=5", "rl.max_empty_steps=3"]
    with caplog.at_level(logging.WARNING, logger="stare_agents.train"), pytest.raises(
        NoLearningSignal, match=r"3 step\(s\) in a row .*rl\.sampling_rounds=2.*max_empty_steps"
    ):
        train(tiny(tmp_path / "none", *COIN, *dynamic, "rl.samples_per_prompt=1"))
    assert caplog.text.count("its budget of rl.sampling_rounds=2") == 1
    # the stop is raised while step 2 samples: steps 0 and 1 were logged, each with its budget spent
    records = read_records(tmp_path / "none" / "metrics.jsonl", "rl")
    assert [(r["step"], r["data/sampling_rounds"], r["data/budget_exhausted"]) for r in records] == [
        (0, 2, 1),
        (1, 2, 1),
    ]


def test_weights_over_the_collective_train_the_same_run_as_through_the_driver(tmp_path):
    """rollout.weight_sync=collective (the learner broadcasts to the engine over a gloo group) and =driver
    (the state dict through the driver) put the same float32 weights in the engine: the same rollouts,
    the same updates, the same metrics."""
    import coin_env  # noqa: F401  (rewards with variance, so the weights change every step)

    runs = {}
    for mode in ("driver", "collective"):
        folder = tmp_path / mode
        train(tiny(folder, *COIN, "rl.steps=3", f"rollout.weight_sync={mode}"))
        runs[mode] = [comparable(r) for r in read_records(folder / "metrics.jsonl", "rl")]
    assert [r["rollout/weight_version"] for r in runs["collective"]] == [1, 2, 3]
    assert all(r["learner/grad_norm"] > 0 for r in runs["collective"])
    assert runs["collective"] == runs["driver"]


PIPELINE = [*COIN, "rl.pipeline=one-step", "rl.learner.importance.cap=2.0"]


def test_a_pipelined_run_trains_one_version_behind_and_resumes_exactly(tmp_path):
    """rl.pipeline=one-step: step k+1's rollouts are sampled with the weights from before step k's update
    (staleness 1 from step 1 on, recorded), so rollout and learner log-probs differ and TIS sees it; a run
    SIGKILLed after its step-2 checkpoint (which holds the batch sampled ahead) resumes to the same metrics."""
    import coin_env  # noqa: F401

    reference = tmp_path / "reference"
    train(tiny(reference, *PIPELINE))
    records = read_records(reference / "metrics.jsonl", "rl")
    assert [r["rollout/staleness_max"] for r in records] == [0, 1, 1, 1]
    versions = [r["rollout/weight_version"] for r in records]
    assert versions[1] == versions[0] and versions[2:] == [versions[0] + 1, versions[0] + 2]
    assert records[0]["mismatch/logprob_abs_diff"] < 1e-3 < records[2]["mismatch/logprob_abs_diff"]
    assert all("time/wait_rollout_s" in r for r in records[:-1]) and "time/wait_rollout_s" not in records[-1]

    killed = tmp_path / "killed"
    sigkill_after_checkpoint(killed, 2, "rl.steps=4", *PIPELINE)
    assert load_checkpoint(latest_checkpoint(killed))["ahead"] is not None  # step 2's batch, sampled ahead
    train(tiny(killed, *PIPELINE), resume=True)
    assert [comparable(r) for r in read_records(killed / "metrics.jsonl", "rl")] == [
        comparable(r) for r in records
    ]


def test_a_pipelined_run_needs_truncated_importance_sampling():
    with pytest.raises(ValueError, match=r"rl\.pipeline=one-step .* set rl\.learner\.importance\.cap"):
        load_config(recipe="tiny", overrides=["rl.pipeline=one-step"])


def test_a_data_parallel_learner_runs_sft_and_rl_on_its_workers_and_resumes_from_its_sharded_checkpoints(
    tmp_path, monkeypatch, local_ray
):
    """rl.learner_workers=2: SFT and RL both on two gloo learner workers (Ray actors), weights to the engine
    over the sync group (weight_sync auto picks the collective for a learner group); checkpoints hold each
    worker's shards (learner_shards/) and the small rest of the state; a run that dies after its step-2 checkpoint
    and is resumed equals an uninterrupted run. The runs find the folder's shared Ray started (tests/conftest.py)
    and use it, as a run does any Ray this process has. The stopped and resumed runs evaluate nothing: a rollout's
    sampling seeds are its task's (the tiny recipe's HF engine), so the held-out evaluations around RL change no
    RL record, and the reference's records are what the resumed run must repeat."""
    from stare_agents.train.rl_loop import RLLoop

    args = ["rl.learner_workers=2", "rl.steps=3"]
    reference = tmp_path / "reference"
    summary = train(tiny(reference, *args, "eval.num_tasks=2"))
    assert set(summary["accuracy"]) == {"base", "sft", "rl"}
    assert read_records(reference / "metrics.jsonl", "sft-step")  # SFT ran (on the group) and logged its steps
    records = read_records(reference / "metrics.jsonl", "rl")
    # 1: the SFT model; 2: the learner at RL start
    assert [r["rollout/weight_version"] for r in records] == [2, 3, 4]
    assert all(math.isfinite(r["learner/loss"]) for r in records)
    assert (reference / "sft_model" / "model.safetensors").exists()
    assert (reference / "final_model" / "model.safetensors").exists()

    stopped = tmp_path / "stopped"
    original = RLLoop.step

    def dies_at_step_2(self, step, *rest):
        if step == 2:
            raise KeyboardInterrupt("killed after the step-2 checkpoint")
        return original(self, step, *rest)

    monkeypatch.setattr(RLLoop, "step", dies_at_step_2)
    args += ["eval.num_tasks=0"]
    with pytest.raises(KeyboardInterrupt):
        train(tiny(stopped, *args))
    monkeypatch.setattr(RLLoop, "step", original)
    checkpoint = latest_checkpoint(stopped)
    state = load_checkpoint(checkpoint)
    assert state["next_step"] == 2 and state["sharded"] and "model" not in state["learner"]
    assert (checkpoint / "learner_shards").is_dir()
    exported = prepare_model(str(checkpoint))  # what `stare-agents eval --model` does with the folder
    assert exported == checkpoint / "hf_export" and prepare_model(str(checkpoint)) == exported  # once
    learner_weights = {
        k.removeprefix("model."): v for k, v in _dcp_model_state(checkpoint / "learner_shards").items()
    }
    exported_weights = load_causal_lm(exported).state_dict()
    assert all(torch.equal(exported_weights[k], learner_weights[k]) for k in learner_weights)
    train(tiny(stopped, *args), resume=True)
    first = [comparable(r) for r in read_records(reference / "metrics.jsonl", "rl")]
    second = [comparable(r) for r in read_records(stopped / "metrics.jsonl", "rl")]
    assert [r["step"] for r in second] == [0, 1, 2] and second == first


def test_the_cli_summary_of_a_run_without_held_out_evaluation(tmp_path):
    """eval.num_tasks=0 and no benchmarks: nothing is evaluated, and the run's table says so (it crashed)."""
    from typer.testing import CliRunner

    from stare_agents.cli import app

    out = tmp_path / "run"
    overrides = ["rl.steps=1", "eval.num_tasks=0", "sft.enabled=false", "checkpoint.every=0"]
    result = CliRunner().invoke(
        app, ["train", "--recipe", "tiny", "--out", str(out), "rollout.sandbox=none", *overrides]
    )
    assert result.exit_code == 0, result.output
    assert "not evaluated" in result.output
    assert json.loads((out / "summary.json").read_text())["accuracy"] == {"base": None, "rl": None}


def test_environment_processes_train_as_environments_on_threads_do(tmp_path):
    """rollout.env_processes (the default on GPU workers): the same run, step for step, as with the
    environments on threads of the worker's process; the user's environment module is imported there too."""
    import coin_env  # noqa: F401  (registers tests/Coin-v0)

    threads, processes = tmp_path / "threads", tmp_path / "processes"
    train(tiny(threads, *COIN, "rl.steps=2", "rollout.env_processes=0"))
    train(tiny(processes, *COIN, "rl.steps=2", "rollout.env_processes=2"))
    a, b = read_records(threads / "metrics.jsonl", "rl"), read_records(processes / "metrics.jsonl", "rl")
    assert len(a) == 2 and [comparable(r) for r in a] == [comparable(r) for r in b]
    assert all(r["rollout/failed"] == 0 for r in b)


def test_a_gate_reading_every_sampled_trajectory_reads_the_logged_all_trajectory_entropy(tmp_path):
    """rl.stare.gate_input=all: what the gate read each step is learner/entropy_all, the entropy over every
    trajectory that ran (the tiny recipe trains on all of them, so it is also the trained batch's)."""
    folder = tmp_path / "run"
    train(tiny(folder, "rl.steps=2", "rl.stare.gate_input=all", "logging.entropy_all=false"))
    rl = read_records(folder / "metrics.jsonl", "rl")
    assert len(rl) == 2
    for record in rl:  # computed for the gate even with the logging switch off
        assert record["stare/gate_input"] == pytest.approx(record["learner/entropy_all"], rel=1e-6)


def test_refill_rounds_draw_a_multiple_of_the_batch_and_a_short_step_says_so(tmp_path, caplog):
    """rl.sampling_batch_factor=3: each round draws 3 x prompts_per_step prompts, as the official code's
    gen_batch_size does (issue 29, item 5). One sample per prompt leaves every group without variance: both
    rounds are drawn (2 x 6 prompts) and the step that trains none of its 2 groups says so, with the count."""
    import logging

    import coin_env  # noqa: F401

    refill = ["rl.dynamic_sampling=true", "rl.sampling_rounds=2", "rl.sampling_batch_factor=3", "rl.steps=1"]
    refill.append("rl.max_empty_steps=0")
    with caplog.at_level(logging.WARNING, logger="stare_agents.train"):
        train(tiny(tmp_path / "none", *COIN, *refill, "rl.samples_per_prompt=1", "eval.num_tasks=2"))
    figures = ("data/sampling_rounds", "data/position", "data/kept_trajectories")
    (record,) = read_records(tmp_path / "none" / "metrics.jsonl", "rl")
    assert [record[k] for k in figures] == [2, 12, 0]
    said = (
        "RL step 0 trains 0 of rl.prompts_per_step=2 groups: its budget of rl.sampling_rounds=2 round(s) of 6"
    )
    assert said in caplog.text
    caplog.clear()
    # four samples per prompt: a round of 6 prompts has groups with variance to spare; the first 2 are trained
    with caplog.at_level(logging.WARNING, logger="stare_agents.train"):
        train(tiny(tmp_path / "some", *COIN, *refill, "eval.num_tasks=2"))
    (record,) = read_records(tmp_path / "some" / "metrics.jsonl", "rl")
    assert [record[k] for k in figures] == [1, 6, 8]
    assert (record["data/kept_groups"], record["data/budget_exhausted"]) == (2, 0)
    assert "round(s)" not in caplog.text
    paper = (
        "qwen2.5-7b-tir-stare-c2",
        "qwen2.5-7b-tir-grpo-ds",
        "qwen2.5-7b-zero-tir-grpo-ds",
        "short-cot-qwen2.5-math-7b",
    )
    for recipe in paper:
        rl = load_config(recipe=recipe).rl  # the official refill: 10 rounds of 3 x the batch
        assert (rl.sampling_rounds, rl.sampling_batch_factor) == (10, 3), recipe


def test_a_run_that_dies_mid_sft_goes_on_from_its_sft_checkpoint(tmp_path, monkeypatch):
    """sft.checkpoint_every=1: a run killed after its second SFT checkpoint (mid-epoch 2 of 2) resumes from it:
    the same SFT steps and epoch figures once each (what the killed attempt logged after the checkpoint is
    gone), the same SFT model as an uninterrupted run, and the checkpoint removed once SFT is done."""
    from stare_agents.train.run_folder import SFT_CHECKPOINT, SFT_MODEL
    from stare_agents.train.sft import SFTTrainer

    args = ["sft.epochs=2", "sft.checkpoint_every=1", "rl.steps=0", "eval.num_tasks=0"]
    reference = tmp_path / "reference"
    train(tiny(reference, *args))
    assert not (reference / SFT_CHECKPOINT).exists()
    stopped = tmp_path / "stopped"
    original, saves = SFTTrainer.save_checkpoint, []

    def dies_after_the_second_save(self, *a, **k):
        original(self, *a, **k)
        saves.append(self.steps_done)
        if len(saves) == 2:
            raise KeyboardInterrupt("killed after the step-2 SFT checkpoint")

    monkeypatch.setattr(SFTTrainer, "save_checkpoint", dies_after_the_second_save)
    args += ["eval.num_tasks=0"]
    with pytest.raises(KeyboardInterrupt):
        train(tiny(stopped, *args))
    monkeypatch.setattr(SFTTrainer, "save_checkpoint", original)
    assert saves == [1, 2] and (stopped / SFT_CHECKPOINT).is_dir() and not (stopped / SFT_MODEL).exists()
    with open(stopped / "metrics.jsonl", "a") as log:  # as if the killed attempt had logged step 3 already
        log.write(json.dumps({"kind": "sft-step", "step": 3, "loss": 123.0}) + "\n")
    train(tiny(stopped, *args), resume=True)
    assert not (stopped / SFT_CHECKPOINT).exists()
    for kind in ("sft-step", "sft"):
        first = [comparable(r) for r in read_records(reference / "metrics.jsonl", kind)]
        second = [comparable(r) for r in read_records(stopped / "metrics.jsonl", kind)]
        assert [r["step"] for r in second] == ([1, 2, 3, 4] if kind == "sft-step" else [1, 2])
        drop = ("time_s", "tokens_per_s")
        assert [{k: v for k, v in r.items() if k not in drop} for r in second] == [
            {k: v for k, v in r.items() if k not in drop} for r in first
        ]
    a, b = load_causal_lm(reference / SFT_MODEL), load_causal_lm(stopped / SFT_MODEL)
    assert all(
        torch.equal(x, y) for x, y in zip(a.state_dict().values(), b.state_dict().values(), strict=True)
    )


def test_an_sft_checkpoint_taken_on_other_traces_is_not_continued(tmp_path, monkeypatch, caplog):
    """A checkpoint whose traces fingerprint differs from this run's (the solver's traces came out otherwise)
    is set aside with a warning and SFT starts over, never continued on other data."""
    from stare_agents.train.checkpoint import save_checkpoint
    from stare_agents.train.run_folder import SFT_CHECKPOINT

    args = ["sft.checkpoint_every=1", "rl.steps=0", "eval.num_tasks=0"]
    out = tmp_path / "run"
    train(tiny(out, *args))
    save_checkpoint({"traces": "other", "learner": {"steps_done": 1, "epochs_done": 0}}, out / SFT_CHECKPOINT)
    (out / "progress.json").write_text(
        json.dumps({**json.loads((out / "progress.json").read_text()), "sft_done": False, "accuracy": {}})
    )
    with caplog.at_level("WARNING", logger="stare_agents.train"):
        train(tiny(out, *args), resume=True)
    assert "taken on other SFT traces" in caplog.text
    assert [r["step"] for r in read_records(out / "metrics.jsonl", "sft-step")][-2:] == [1, 2]
