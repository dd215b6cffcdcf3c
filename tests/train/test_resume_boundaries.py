"""A run stopped between any two stages and resumed scores the same weights as one never stopped (issue 51,
item 5): a run that stopped after RL ended but before its final evaluation used to resume on the base model's
weights (nothing synced `final_model/` into the engines) and record their accuracy as "rl".

Every evaluation names the weights it scored (the engines' weight version and a digest of what they hold), in
progress.json and metrics.jsonl. The stops are raised at each boundary in this process (what a SIGKILL there
leaves on disk is the same: progress.json is written before each boundary), one after the other in one run
folder, which is then compared with an uninterrupted run and with the weights saved for each point. The model
is the tiny recipe's on the HF engine; the environment (tests/Coin-v0) rewards half of what a random model
writes, so that RL changes the weights, and SFT reads a small file of conversations.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from stare_agents.models import prepare_model
from stare_agents.records import read_records
from stare_agents.rollout.weight_sync import weights_digest
from stare_agents.train import trainer as trainer_module
from stare_agents.train.config import load_config
from stare_agents.train.policy import load_causal_lm
from stare_agents.train.rl_loop import RLLoop
from stare_agents.train.trainer import Trainer, train

POINTS = ("base", "sft", "rl")


class Stop(Exception):
    """The run stops here (as a SIGKILL at this boundary would leave it)."""


def config(out: Path, sft_data: Path):
    return load_config(
        recipe="tiny",
        overrides=[
            f"out_dir={out}",
            "env.id=tests/Coin-v0",
            "env.kwargs={}",
            "env.imports=[coin_env]",
            "rollout.sandbox=none",
            f"sft.data={sft_data}",
            "sft.num_examples=4",
            "rl.steps=2",
            "eval.num_tasks=2",
            "checkpoint.every=1",
        ],
    )


@pytest.fixture(scope="module")
def sft_data(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("sft") / "coin.jsonl"
    rows = [
        {
            "messages": [
                {"role": "user", "content": f"Say something ({n})."},
                {"role": "assistant", "content": "ok"},
            ]
        }
        for n in range(4)
    ]
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory, sft_data) -> Path:
    out = tmp_path_factory.mktemp("uninterrupted") / "run"
    train(config(out, sft_data))
    return out


def scored(folder: Path) -> dict[str, tuple[int, str]]:
    """What each point's evaluation says it scored, in progress.json; metrics.jsonl must say the same."""
    evaluations = json.loads((folder / "progress.json").read_text())["evaluations"]
    said = {p: (evaluations[p]["weight_version"], evaluations[p]["weights_digest"]) for p in POINTS}
    records = {r["point"]: r for r in read_records(folder / "metrics.jsonl", "eval")}
    assert {p: (records[p]["weight_version"], records[p]["weights_digest"]) for p in POINTS} == said
    return said


def saved_digest(model_dir: Path) -> str:
    return weights_digest(load_causal_lm(model_dir).state_dict().items())


def accuracies(folder: Path) -> dict[str, float]:
    return json.loads((folder / "progress.json").read_text())["accuracy"]


def test_each_evaluation_names_the_weights_it_scored(uninterrupted: Path) -> None:
    said = scored(uninterrupted)
    assert said["base"] == (0, saved_digest(prepare_model("tiny")))
    assert said["sft"] == (1, saved_digest(uninterrupted / "sft_model"))
    assert said["rl"][1] == saved_digest(uninterrupted / "final_model") != said["sft"][1]  # RL changed them
    steps = read_records(uninterrupted / "metrics.jsonl", "rl")
    synced = sum(
        1 for r in steps if r["data/kept_trajectories"]
    )  # a step with nothing to learn syncs nothing
    assert said["rl"][0] == 2 + synced  # 2: the learner at RL start; one more per step that synced


def test_a_run_stopped_at_every_boundary_scores_what_an_uninterrupted_one_does(
    uninterrupted: Path, sft_data: Path, tmp_path: Path, monkeypatch
) -> None:
    out = tmp_path / "run"
    stop_at: list[str] = []  # the boundary the next run stops at

    def stopping(name: str, original):
        def wrapped(self, *args, **kwargs):
            if stop_at and stop_at[0] == name(args):
                stop_at.pop()
                raise Stop(name(args))
            return original(self, *args, **kwargs)

        return wrapped

    record = Trainer._record_accuracy
    monkeypatch.setattr(
        Trainer, "supervised_fine_tuning", stopping(lambda a: "before SFT", Trainer.supervised_fine_tuning)
    )
    monkeypatch.setattr(
        Trainer, "_record_accuracy", stopping(lambda a: f"before the {a[0]} evaluation", record)
    )
    monkeypatch.setattr(Trainer, "reinforce", stopping(lambda a: "before RL", Trainer.reinforce))
    monkeypatch.setattr(
        trainer_module,
        "write_summary",
        stopping(lambda a: "before the summary", trainer_module.write_summary),
    )
    checkpoint = RLLoop.checkpoint

    def checkpoint_then_stop(self, next_step: int) -> None:
        checkpoint(self, next_step)
        if stop_at == ["after RL step 1"] and next_step == 1:
            stop_at.pop()
            raise Stop("after RL step 1")

    monkeypatch.setattr(RLLoop, "checkpoint", checkpoint_then_stop)
    boundaries = [
        "before SFT",  # the base model evaluated
        "before the sft evaluation",  # SFT done and saved
        "before RL",  # the SFT model evaluated
        "after RL step 1",  # a checkpoint mid-RL
        "before the rl evaluation",  # RL done, final_model saved (issue 51, item 5)
        "before the summary",  # every point evaluated
    ]
    for boundary in boundaries:
        stop_at[:] = [boundary]
        with pytest.raises(Stop, match=boundary):
            train(config(out, sft_data), resume=out.exists())
    summary = train(config(out, sft_data), resume=True)
    assert scored(out) == scored(uninterrupted)
    assert scored(out)["rl"][1] == saved_digest(out / "final_model")
    assert accuracies(out) == accuracies(uninterrupted) == summary["accuracy"]
