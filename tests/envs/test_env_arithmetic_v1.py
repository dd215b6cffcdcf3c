"""ArithmeticTIR-v1: twelve kinds at three levels, drawn uniformly over the cells; every kind's solver program
prints the environment's answer at every level; held out by problem as v0; and v0 still draws the tasks it drew."""

from __future__ import annotations

import hashlib
import json
import re
import subprocess
import sys
from collections import Counter

import gymnasium as gym
import pytest

import stare_agents.envs  # registers the ids
from stare_agents.envs import ArithmeticTIREnv, ArithmeticTIRV1Env, unique_tasks
from stare_agents.envs.arithmetic import (
    ALL_KINDS,
    HELDOUT_SHARE,
    LEVELS,
    V1_KINDS,
    V1_TABLE,
    is_heldout,
    kind_and_level,
)

ENV = "stare_agents/ArithmeticTIR-v1"
CELLS = [(kind, level) for kind in V1_KINDS for level in LEVELS]

# Runs each (code, answer) pair of the JSON list on stdin in a fresh namespace, as a tool call would, and prints
# the indices whose output is not the answer: one interpreter for all programs keeps the test fast.
HARNESS = """
import contextlib, io, json, sys
wrong = []
for index, (code, answer) in enumerate(json.load(sys.stdin)):
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(code, {"__name__": "__main__"})
    if out.getvalue().strip() != answer:
        wrong.append([index, out.getvalue().strip()[:80]])
print(json.dumps(wrong))
"""


def cell_tasks(kind: str, level: int, seeds: range, split: str = "train") -> list:
    env = ArithmeticTIRV1Env(kinds=(kind,), levels=(level,), split=split)
    tasks = []
    for seed in seeds:
        env.reset(seed=seed)
        tasks.append(env.task)
    return tasks


def test_v0_draws_the_tasks_it_drew_before_v1() -> None:
    """Old runs stay reproducible: the digest of v0's tasks (id, problem, answer, data) for fixed seeds and
    arguments, taken before v1 existed."""
    digest = hashlib.sha256()
    for kwargs in [
        {},
        {"split": "heldout"},
        {"kinds": ALL_KINDS},
        {"digits": 4, "kinds": ("multiply", "collatz_steps")},
    ]:
        env = ArithmeticTIREnv(**kwargs)
        for seed in range(60):
            env.reset(seed=seed)
            t = env.task
            digest.update(f"{t.id}|{t.problem}|{t.answer}|{sorted(t.data.items())}\n".encode())
    assert digest.hexdigest() == "e5538849bb24bfc4eae02b9332171e9da686e69d0eae36528ff40ad979c53f84"


def test_every_solver_program_prints_the_answer_at_every_level() -> None:
    tasks = [
        t
        for i, (kind, level) in enumerate(CELLS)
        for t in cell_tasks(kind, level, range(i * 100, i * 100 + 8))
    ]
    tasks += [t for kind, level in CELLS for t in cell_tasks(kind, level, range(2), split="heldout")]
    env = ArithmeticTIRV1Env()
    pairs = [(env.solution_code(t), t.answer) for t in tasks]
    done = subprocess.run(
        [sys.executable, "-c", HARNESS], input=json.dumps(pairs), capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr[-2000:]
    wrong = json.loads(done.stdout)
    assert not wrong, [(tasks[i].id, tasks[i].problem, got) for i, got in wrong[:5]]
    assert {(t.data["kind"], t.data["level"]) for t in tasks} == set(CELLS)


def test_solver_answers_score_correct_through_the_environment_and_the_local_sandbox(local_sandbox) -> None:
    env = gym.make(ENV, sandbox=local_sandbox, stateless=True)
    for index, (kind, level) in enumerate(CELLS):
        [task] = cell_tasks(kind, level, range(index, index + 1), split="heldout")
        env.reset(options={"task": task})
        observation, *_ = env.step(f"```python\n{env.unwrapped.solution_code(task)}\n```")
        printed = observation[0]["content"].strip()
        assert printed == task.answer, (task.problem, printed)
        _, reward, terminated, _, info = env.step(f"So the answer is \\boxed{{{printed}}}.")
        assert (reward, terminated, info["grade_reason"], info["task_id"]) == (1.0, True, "correct", task.id)
    env.close()


def test_cells_are_drawn_uniformly_and_each_task_names_its_kind_and_level() -> None:
    env = ArithmeticTIRV1Env()
    cells: Counter = Counter()
    for seed in range(720):
        env.reset(seed=seed)
        task = env.task
        kind, level = task.data["kind"], task.data["level"]
        cells[(kind, level)] += 1
        assert re.fullmatch(rf"arith-{kind}-L{level}-[0-9a-f]{{10}}", task.id)
        assert kind_and_level(task.id) == (kind, level)
    assert set(cells) == set(CELLS) and min(cells.values()) >= 8  # 20 expected in each
    assert kind_and_level("arith-range_sum-70fd62526f") == ("range_sum", None)  # a v0 id
    again = ArithmeticTIRV1Env()
    for seed in (0, 7, 99):
        env.reset(seed=seed)
        again.reset(seed=seed)
        assert env.task == again.task
    subset = ArithmeticTIRV1Env(kinds=("gcd", "isqrt"), levels=(2,))
    for seed in range(20):
        subset.reset(seed=seed)
        assert (subset.task.data["kind"] in ("gcd", "isqrt"), subset.task.data["level"]) == (True, 2)


def test_higher_levels_have_larger_numbers() -> None:
    def mean_digits(kind: str, level: int) -> float:
        tasks = cell_tasks(kind, level, range(12))
        return sum(len("".join(re.findall(r"\d+", t.problem))) for t in tasks) / len(tasks)

    for kind in V1_KINDS:
        sizes = [mean_digits(kind, level) for level in LEVELS]
        assert sizes == sorted(sizes) and sizes[0] < sizes[-1], (kind, sizes)


def test_the_heldout_split_is_disjoint_by_problem() -> None:
    def problems(split: str, seeds: range, **kwargs) -> list[str]:
        env = ArithmeticTIRV1Env(split=split, **kwargs)
        out = []
        for seed in seeds:
            env.reset(seed=seed)
            out.append(env.task.problem)
        return out

    train, heldout = problems("train", range(500)), problems("heldout", range(10**6, 10**6 + 250))
    assert not any(map(is_heldout, train)) and all(map(is_heldout, heldout))
    assert not set(train) & set(heldout)
    # the smallest cell: 350 problems, about 22 held out; the training split draws none of them
    small = {"kinds": ("digit_sum_factorial",), "levels": (1,)}
    every = [f"What is the sum of the decimal digits of {n}!?" for n in range(50, 400)]
    held = {p for p in every if is_heldout(p)}
    assert 5 <= len(held) <= 50 and abs(len(held) / len(every) - 1 / HELDOUT_SHARE) < 0.04
    assert not set(problems("train", range(400), **small)) & held
    assert set(problems("heldout", range(200), **small)) <= held
    tasks = unique_tasks(ArithmeticTIRV1Env(split="heldout", **small), len(held), first_seed=0)
    assert {t.problem for t in tasks} == held


def test_task_space_has_every_cell_and_exact_sizes() -> None:
    sizes = ArithmeticTIRV1Env.task_space()
    assert set(sizes) == {f"{kind}-L{level}" for kind, level in CELLS}
    assert sizes["digit_sum_factorial-L1"] == 350  # n = 50..399
    assert sizes["multiply-L1"] == (900_000) ** 2
    assert sizes["modinv-L1"] == sum(m - 2 for m in range(1000, 10_000))  # a in [2, m): an upper bound
    assert sizes["range_sum-L3"] == ArithmeticTIREnv.task_space()["range_sum"]  # v0's ranges
    assert sizes["count_primes-L3"] == ArithmeticTIREnv.task_space()["count_primes"]
    assert sizes["base_convert-L1"] == sum((b - 1) * b**11 for b in range(3, 10))
    assert sizes["binomial_mod-L1"] == sum(n // 2 - n // 4 + 1 for n in range(50, 200)) * 900_000_000
    assert min(sizes.values()) == 350
    seen = {t.problem for t in cell_tasks("digit_sum_factorial", 1, range(2000))}
    assert len(seen) <= 350 - 5


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"kinds": "gcd"}, "kinds must be a non-empty subset"),  # a string, not a tuple of kinds
        ({"kinds": ()}, "kinds must be a non-empty subset"),
        ({"kinds": ("gcd", "collatz_steps")}, "'collatz_steps' not a v1 kind"),  # a v0-only kind
        ({"levels": ()}, "levels must be a non-empty subset"),
        ({"levels": 2}, "levels must be a non-empty subset"),
        ({"levels": (0, 1)}, "levels must be a non-empty subset"),
        ({"levels": (True,)}, "levels must be a non-empty subset"),
        ({"levels": ("1",)}, "levels must be a non-empty subset"),
        ({"split": "test"}, "split must be one of"),
    ],
)
def test_bad_arguments_are_refused_naming_the_key(kwargs: dict, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        ArithmeticTIRV1Env(**kwargs)


def test_solution_code_refuses_a_task_without_a_v1_kind() -> None:
    env = ArithmeticTIRV1Env()
    with pytest.raises(ValueError, match="no ArithmeticTIR-v1 solver for task kind 'collatz_steps'"):
        env.solution_code(
            stare_agents.envs.Task(problem="p", answer="1", id="x", data={"kind": "collatz_steps"})
        )
    assert set(V1_TABLE) == set(V1_KINDS) and len(V1_KINDS) == 12


def test_making_v0_does_not_tell_users_to_upgrade() -> None:
    """v0 is kept on purpose: gymnasium's "out of date, consider upgrading to v1" is turned off for our ids
    (pytest resets warning filters per test, so the registration's filter is set again here)."""
    import warnings

    from stare_agents.envs.registration import register_envs

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        register_envs()
        gym.make("stare_agents/ArithmeticTIR-v0").close()
    assert not [w for w in caught if "out of date" in str(w.message)]
