"""Dataset environments' splits: training draws never come from the held-out part, and a dataset without a
held-out part refuses a held-out draw instead of evaluating on training problems."""

from __future__ import annotations

import json

import gymnasium as gym
import pytest

from stare_agents.envs.math_envs import in_heldout_fraction, split_tasks
from stare_agents.envs.registration import split_kwargs
from stare_agents.envs.tasks import TaskDataset

ROWS = [{"id": f"p{i}", "problem": f"What is {i} + {i}?", "answer": str(2 * i)} for i in range(60)]


def problems(tasks) -> set[str]:
    return {t.problem for t in tasks}


def test_a_heldout_fraction_splits_the_rows_in_two_disjoint_parts():
    every = split_tasks("MathTIR-v0", ROWS, split=None)
    train = split_tasks("MathTIR-v0", ROWS, split="train", heldout_fraction=0.25)
    heldout = split_tasks("MathTIR-v0", ROWS, split="heldout", heldout_fraction=0.25)
    assert len(every) == 60
    assert problems(train) | problems(heldout) == problems(every) and not problems(train) & problems(heldout)
    assert 5 <= len(heldout) <= 25  # about a quarter of 60 (a hash, not a count)
    assert all(in_heldout_fraction(t.problem, 0.25) for t in heldout)
    # the side is the problem text's, whitespace aside: a repeated problem cannot be on both sides
    assert in_heldout_fraction("What is  3 +\n3?", 0.25) == in_heldout_fraction("What is 3 + 3?", 0.25)


def test_a_heldout_dataset_is_the_heldout_split_and_never_trained_on(tmp_path):
    heldout_file = tmp_path / "heldout.jsonl"
    heldout_rows = [{**ROWS[3], "id": "h3"}, {"id": "new", "problem": "What is 7 * 6?", "answer": "42"}]
    heldout_file.write_text("".join(json.dumps(row) + "\n" for row in heldout_rows))
    heldout = split_tasks("MathTIR-v0", ROWS, split="heldout", heldout_dataset=str(heldout_file))
    train = split_tasks("MathTIR-v0", ROWS, split="train", heldout_dataset=str(heldout_file))
    assert [t.id for t in heldout] == ["h3", "new"]
    assert len(train) == 59 and ROWS[3]["problem"] not in problems(train)


def test_without_a_heldout_part_a_heldout_draw_is_an_error_not_training_problems():
    assert len(split_tasks("MathTIR-v0", ROWS, split="train")) == 60  # all rows train
    with pytest.raises(ValueError, match=r"split='heldout'.*no held-out part.*heldout_fraction"):
        split_tasks("MathTIR-v0", ROWS, split="heldout")
    with pytest.raises(ValueError, match="no held-out part"):
        gym.make("stare_agents/MathCoT-v0", dataset=ROWS, split="heldout")
    with pytest.raises(ValueError, match="split must be"):
        split_tasks("MathTIR-v0", ROWS, split="test")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="heldout_fraction must be in"):
        split_tasks("MathTIR-v0", ROWS, split="train", heldout_fraction=1.0)
    with pytest.raises(ValueError, match="not both"):
        split_tasks("MathTIR-v0", ROWS, split="train", heldout_fraction=0.1, heldout_dataset=ROWS[:2])


@pytest.mark.parametrize("env_id", ["stare_agents/MathTIR-v0", "stare_agents/MathCoT-v0"])
def test_the_trainer_split_reaches_dataset_environments(env_id):
    """split_kwargs hands the math environments their split, and seeded draws stay inside it."""
    kwargs = {"dataset": ROWS, "heldout_fraction": 0.25}
    assert split_kwargs(env_id, kwargs, "heldout")["split"] == "heldout"
    heldout = problems(split_tasks("x", ROWS, split="heldout", heldout_fraction=0.25))
    env = gym.make(env_id, **split_kwargs(env_id, kwargs, "train"))
    drawn = set()
    for seed in range(200):
        env.reset(seed=seed)
        drawn.add(env.unwrapped.task.problem)
    env.close()
    assert not drawn & heldout and len(drawn) > 20
    env = gym.make(env_id, **split_kwargs(env_id, kwargs, "heldout"))
    env.reset(seed=0)
    assert env.unwrapped.task.problem in heldout
    env.close()


def test_task_dataset_where_filters_lazily_and_composes():
    dataset = TaskDataset(ROWS)
    even = dataset.where(lambda t: int(t.id[1:]) % 2 == 0)
    assert repr(even).endswith("not loaded)")
    small = even.where(lambda t: int(t.id[1:]) < 10)
    assert [t.id for t in small] == ["p0", "p2", "p4", "p6", "p8"] and len(even) == 30
    assert len(dataset) == 60  # the original is untouched
