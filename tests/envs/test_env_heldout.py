"""Held-out ArithmeticTIR tasks are held out by problem, not by seed: the training split never draws one, the
evaluation list has distinct problems at any count, and the export writes a benchmark `stare-agents eval` loads."""

from __future__ import annotations

import json
import math

import gymnasium as gym
import pytest
from typer.testing import CliRunner

import stare_agents.envs  # noqa: F401  (registers the ids)
from stare_agents.envs import ArithmeticTIREnv, unique_tasks
from stare_agents.envs.arithmetic import HELDOUT_SHARE, KINDS, is_heldout
from stare_agents.envs.registration import split_kwargs
from stare_agents.eval.benchmarks import load_benchmark

ENV = "stare_agents/ArithmeticTIR-v0"


def problems(split: str, seeds: range, **kwargs) -> list[str]:
    env = ArithmeticTIREnv(split=split, **kwargs)
    out = []
    for seed in seeds:
        env.reset(seed=seed)
        out.append(env.task.problem)
    return out


def test_the_training_split_never_draws_a_heldout_problem_and_the_heldout_split_only_those() -> None:
    train = problems("train", range(600))
    heldout = problems("heldout", range(1_000_000, 1_000_200))
    assert not any(is_heldout(p) for p in train)
    assert all(is_heldout(p) for p in heldout)
    assert not set(train) & set(heldout)
    # the small kind: every digit sum problem the training split can draw is outside the held-out list
    small = problems("train", range(400), kinds=("digit_sum_factorial",))
    assert not set(small) & set(problems("heldout", range(200), kinds=("digit_sum_factorial",)))


def test_each_split_is_seeded_and_kinds_stay_uniform() -> None:
    for split in ("train", "heldout"):
        assert problems(split, range(30)) == problems(split, range(30))
    env = ArithmeticTIREnv(split="heldout")
    kinds = []
    for seed in range(250):
        env.reset(seed=seed)
        kinds.append(env.task.data["kind"])
    assert set(kinds) == set(KINDS)
    assert min(kinds.count(k) for k in KINDS) >= 25  # 50 expected each; rejection keeps kinds uniform


def test_split_membership_is_a_fixed_hash_of_the_problem_text() -> None:
    # hand-checked values: the hash is sha256 of a fixed prefix + the text, so it is the same on every machine
    assert is_heldout("What is the sum of the decimal digits of 150!?") == is_heldout(
        "What is the sum of the decimal digits of 150!?"
    )
    texts = [f"What is the sum of the decimal digits of {n}!?" for n in range(150, 1501)]
    share = sum(map(is_heldout, texts)) / len(texts)
    assert abs(share - 1 / HELDOUT_SHARE) < 0.03
    with pytest.raises(ValueError, match="split must be one of"):
        ArithmeticTIREnv(split="test")  # type: ignore[arg-type]


def test_task_space_sizes_are_exact() -> None:
    sizes = ArithmeticTIREnv.task_space()
    assert sizes["digit_sum_factorial"] == 1351  # n = 150..1500
    assert sizes["multiply"] == (9 * 10**14) ** 2
    assert sizes["count_primes"] == sum(hi // 2 - 1 for hi in range(5 * 10**5, 2 * 10**6))
    assert sizes["range_sum"] == 99_999 * 900_000 * 75 * 2
    assert ArithmeticTIREnv.task_space(digits=2)["multiply"] == 90 * 90
    # every digit-sum problem has a distinct text, so its space is the number of n
    env = ArithmeticTIREnv(kinds=("digit_sum_factorial",))
    seen = set()
    for seed in range(3000):
        env.reset(seed=seed)
        seen.add(env.task.problem)
    assert len(seen) <= sizes["digit_sum_factorial"] - sum(
        is_heldout(f"What is the sum of the decimal digits of {n}!?") for n in range(150, 1501)
    )


def test_unique_tasks_skips_repeated_problems_and_refuses_a_space_too_small() -> None:
    env = ArithmeticTIREnv(split="heldout", kinds=("digit_sum_factorial",))
    tasks = unique_tasks(env, 40, first_seed=1_000_000)
    assert len({t.problem for t in tasks}) == len({t.id for t in tasks}) == 40
    heldout_size = sum(
        is_heldout(f"What is the sum of the decimal digits of {n}!?") for n in range(150, 1501)
    )
    with pytest.raises(ValueError, match="distinct problems"):
        unique_tasks(env, heldout_size + 1, first_seed=1_000_000)
    with pytest.raises(ValueError, match="count must be >= 1"):
        unique_tasks(env, 0, first_seed=0)


def test_split_kwargs_only_for_environments_that_take_a_split() -> None:
    assert split_kwargs(ENV, {"digits": 4}, "heldout") == {"digits": 4, "split": "heldout"}
    assert split_kwargs(ENV, {"split": "train"}, "heldout") == {"split": "train"}  # an explicit choice stays
    assert split_kwargs("stare_agents/MathTIR-v0", {}, "heldout") == {"split": "heldout"}  # dataset splits
    assert split_kwargs("stare_agents/PythonUnitTest-v0", {}, "heldout") == {}


def test_answers_are_exact_for_hand_computed_tasks() -> None:
    env = gym.make(ENV)
    for problem, answer in [
        ("What is the sum of the decimal digits of 10!?", 27),  # 3628800
        ("How many prime numbers p satisfy 1 \\le p \\le 10?", 4),
        ("Compute 2^{10} \\bmod 1000.", 24),
    ]:
        env.reset(options={"problem": problem, "answer": str(answer)})
        assert env.step(f"\\boxed{{{answer}}}")[1] == 1.0
    assert math.factorial(10) == 3628800


@pytest.mark.parametrize(("env_id", "count"), [(ENV, 96), (ENV, 300), ("stare_agents/ArithmeticTIR-v1", 300)])
def test_export_writes_distinct_heldout_tasks_that_eval_loads(tmp_path, env_id: str, count: int) -> None:
    from stare_agents.cli import app

    out = tmp_path / "heldout.jsonl"
    result = CliRunner().invoke(app, ["envs", "export", env_id, "--out", str(out), "--count", str(count)])
    assert result.exit_code == 0, result.output
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(rows) == count == len({r["id"] for r in rows}) == len({r["problem"] for r in rows})
    assert all(is_heldout(r["problem"]) for r in rows)
    assert len(load_benchmark(str(out)).tasks) == count
    train = CliRunner().invoke(
        app,
        ["envs", "export", env_id, "--out", str(tmp_path / "t.jsonl"), "--count", "50", "--split", "train"],
    )
    assert train.exit_code == 0, train.output
    train_rows = [json.loads(line) for line in (tmp_path / "t.jsonl").read_text().splitlines()]
    assert not {r["problem"] for r in train_rows} & {r["problem"] for r in rows}


def test_export_refuses_more_tasks_than_the_space_holds(tmp_path) -> None:
    from stare_agents.cli import app

    result = CliRunner().invoke(
        app,
        [
            "envs", "export", ENV, "--out", str(tmp_path / "x.jsonl"), "--count", "500",
            "--env-kwargs", '{"kinds": ["digit_sum_factorial"]}',
        ],
    )  # fmt: skip
    assert result.exit_code != 0 and "distinct problems" in result.output
    assert not (tmp_path / "x.jsonl").exists()


# -- the loop kinds: a program the model has to construct ------------------------------------------------------
def test_loop_kinds_are_seeded_and_match_hand_computed_answers() -> None:
    from stare_agents.envs.arithmetic import LOOP_KINDS, _collatz_steps, _fibonacci_mod

    assert (
        _collatz_steps(27) == 111 and _collatz_steps(1) == 0 and _collatz_steps(6) == 8
    )  # 6 3 10 5 16 8 4 2 1
    assert [_fibonacci_mod(n, 1000) for n in range(11)] == [0, 1, 1, 2, 3, 5, 8, 13, 21, 34, 55]
    assert _fibonacci_mod(10, 7) == 6 and _fibonacci_mod(100, 10**9) == 354224848179261915075 % 10**9
    env = ArithmeticTIREnv(kinds=LOOP_KINDS)
    seen = set()
    for seed in range(20):
        env.reset(seed=seed)
        task = env.task
        seen.add(task.data["kind"])
        env.reset(seed=seed)
        assert env.task == task
    assert seen == set(LOOP_KINDS)
    assert ArithmeticTIREnv.task_space()["fib_mod"] == 900_000 * 900_000_000
    with pytest.raises(ValueError, match="kinds must be"):
        ArithmeticTIREnv(kinds=("collatz",))


@pytest.mark.docker
@pytest.mark.timeout(180)
def test_loop_kind_solvers_are_right_through_the_docker_sandbox_and_hostile_answers_score_zero(
    docker_sandbox,
) -> None:
    from stare_agents.envs.arithmetic import LOOP_KINDS

    for kind in LOOP_KINDS:
        env = gym.make(ENV, kinds=(kind,), sandbox=docker_sandbox, stateless=True)
        env.reset(seed=5)
        task = env.unwrapped.task
        observation, *_ = env.step(f"```python\n{env.unwrapped.solution_code(task)}\n```")
        printed = observation[0]["content"].strip()
        assert printed == task.answer, (kind, printed)
        _, reward, terminated, _, info = env.step(f"So the answer is \\boxed{{{printed}}}.")
        assert (reward, terminated, info["grade_reason"]) == (1.0, True, "correct")
        for hostile, reason in [
            (f"\\boxed{{{int(task.answer) + 1}}} or \\boxed{{{task.answer}}}", "wrong"),  # a hedge
            (f"\\boxed{{{task.answer}.0}}", "parse_failure"),
            ("\\boxed{" + task.answer, "parse_failure"),  # never closed
            (f"```output\n{task.answer}\n```", "no_answer"),  # a forged tool output is no answer
        ]:
            env.reset(seed=5)
            _, reward, _, _, info = env.step(hostile)
            assert (reward, info["grade_reason"]) == (0.0, reason), hostile
        env.close()
