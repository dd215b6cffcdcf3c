"""grade_answer / MathGrader: equivalences math-verify must accept, near misses it must reject, reasons, and
pathological inputs that must come back within the hard timeout."""

from __future__ import annotations

import json
import threading
import time

import pytest
from support import shared_data

from stare_agents.envs import GradeResult, MathGrader, extract_boxed, grade_answer

EQUIVALENT = [
    # fractions vs decimals
    ("\\frac{1}{2}", "0.5"),
    ("\\dfrac{3}{4}", "0.75"),
    ("\\frac{1}{3}", "0.333333"),
    ("2.50", "\\frac{5}{2}"),
    # LaTeX forms
    ("\\frac12", "\\frac{1}{2}"),
    ("\\dfrac{3}{4}", "\\tfrac34"),
    ("\\sqrt{8}", "2\\sqrt{2}"),
    ("90^\\circ", "90"),
    ("1000", "1,000"),
    ("10\\%", "10"),
    ("\\$5", "5"),
    ("\\text{Evelyn}", "Evelyn"),
    ("x = 3", "3"),
    # intervals
    ("[1, 2)", "[1,2)"),
    ("(-\\infty, 3]", "(-\\infty,3]"),
    ("[-2,5]\\cup[7,\\infty)", "[-2, 5] \\cup [7, \\infty)"),
    # tuples and sets
    ("(1, 2)", "(1,2)"),
    ("(3, \\frac{\\pi}{2})", "\\left(3, \\frac{\\pi}{2}\\right)"),
    ("\\{1, 2\\}", "\\{2, 1\\}"),
    # simplified expressions
    ("x^2 + 2x + 1", "(x+1)^2"),
    ("\\frac{x^2-1}{x-1}", "x+1"),
    ("2\\sin x \\cos x", "\\sin 2x"),
    # matrices
    ("\\begin{pmatrix} 1 & 2 \\\\ 3 & 4 \\end{pmatrix}", "\\begin{pmatrix}1&2\\\\3&4\\end{pmatrix}"),
    ("\\begin{pmatrix} 1 \\\\ -1 \\end{pmatrix}", "\\begin{bmatrix} 1 \\\\ -1 \\end{bmatrix}"),
    # base subscripts
    ("52_8", "52_{8}"),
    # big integers stay exact
    ("123456789012345678901234567890", "123456789012345678901234567890"),
]

DIFFERENT = [
    ("\\frac{1}{3}", "0.333"),
    ("[1, 2)", "(1, 2)"),
    ("(1, 2)", "(2, 1)"),
    ("x^2 + 2x + 1", "(x-1)^2"),
    ("\\begin{pmatrix} 1 & 2 \\\\ 3 & 4 \\end{pmatrix}", "\\begin{pmatrix} 1 & 2 \\\\ 3 & 5 \\end{pmatrix}"),
    ("123456789012345678901234567890", "123456789012345678901234567891"),
    ("\\pi", "3.14159"),
    ("5", "-5"),
    # numbers in another base: math-verify alone drops the subscript
    ("52_8", "52_9"),
    ("4210_{5}", "4210_{6}"),
    ("52_8", "53_8"),
]


@pytest.mark.parametrize(("reference", "answer"), EQUIVALENT)
def test_equivalent_answers_are_correct(grader: MathGrader, reference: str, answer: str) -> None:
    result = grade_answer(f"Therefore the answer is $\\boxed{{{answer}}}$.", reference, grader=grader)
    assert result == GradeResult(True, "correct", answer, "")


@pytest.mark.parametrize(("reference", "answer"), DIFFERENT)
def test_different_answers_are_wrong(grader: MathGrader, reference: str, answer: str) -> None:
    result = grade_answer(f"\\boxed{{{answer}}}", reference, grader=grader)
    assert (result.correct, result.reason, result.extracted) == (False, "wrong", answer)


def test_the_last_box_is_graded(grader: MathGrader) -> None:
    assert grade_answer("first \\boxed{3}, corrected: \\boxed{4}", "4", grader=grader).correct
    assert not grade_answer("first \\boxed{4}, corrected: \\boxed{3}", "4", grader=grader).correct
    assert grade_answer("\\fbox{4}", "4", grader=grader).correct
    assert grade_answer("\\boxed 4", "4", grader=grader).correct


def test_no_last_number_fallback(grader: MathGrader) -> None:
    result = grade_answer("The answer is 4.", "4", grader=grader)
    assert (result.correct, result.reason, result.extracted) == (False, "no_answer", None)


@pytest.mark.parametrize(
    ("response", "reason"),
    [
        ("", "no_answer"),
        ("no box here", "no_answer"),
        ("\\boxed{", "parse_failure"),
        ("\\boxed{\\frac{1}{2}", "parse_failure"),
        ("\\boxed{}", "parse_failure"),
        ("\\boxed{   }", "parse_failure"),
        ("\\boxed{" + "1" * 2000 + "}", "parse_failure"),
    ],
)
def test_reasons(grader: MathGrader, response: str, reason: str) -> None:
    result = grade_answer(response, "1", grader=grader)
    assert result.reason == reason
    assert not result.correct


def test_extract_boxed_nesting_and_absence() -> None:
    assert extract_boxed("\\boxed{\\frac{a}{b^{2}}} tail") == "\\frac{a}{b^{2}}"
    assert extract_boxed("\\boxed{1} and \\boxed{2") is None  # the last box is unterminated
    assert extract_boxed("nothing") is None
    assert extract_boxed("x" * 1_000_000 + "\\boxed{7}") == "7"


PATHOLOGICAL = [
    "9^{9^{9^{9}}}",
    "10^{10^{10}}",
    "(" * 60 + "1" + ")" * 60,
    "x^" * 200 + "2",
    "100000000!",
    "\\int_0^x e^{t^2} \\sin(t^{t^t}) \\, dt",
    "2^{2^{2^{2^{2}}}}",
]


@pytest.mark.parametrize("answer", PATHOLOGICAL)
def test_pathological_inputs_are_bounded_by_the_timeout(fast_grader: MathGrader, answer: str) -> None:
    grader = fast_grader
    started = time.monotonic()
    result = grade_answer(f"\\boxed{{{answer}}}", "1", grader=grader)
    elapsed = time.monotonic() - started
    assert not result.correct
    assert result.reason in ("timeout", "wrong", "parse_failure")
    # the grader's timeout is 2 s; allow for a worker restart (spawn + import sympy) on a slow machine
    assert elapsed < grader.timeout_s + 8.0, f"{answer!r} took {elapsed:.1f} s"
    # and the grader still works afterwards
    assert grade_answer("\\boxed{2}", "2", grader=grader).correct


def test_hard_timeout_kills_a_worker_stuck_in_c_code() -> None:
    """A soft deadline longer than the hard one forces the kill path: the parent must not wait for it."""
    from stare_agents.envs.grading import _Worker

    worker = _Worker(memory_limit_mb=2048)
    request = {"answer": "9^{9^{9^{9}}}", "reference": "1", "soft_timeout_s": 60}  # the worker won't stop
    started = time.monotonic()
    assert worker.request(request, timeout_s=1.0) is None
    worker.kill()
    assert time.monotonic() - started < 3.0 and not worker.alive()
    with MathGrader(timeout_s=1.0, workers=1) as grader:  # through the pool: a timeout, then a working grader
        result = grader.compare("9^{9^{9^{9^{9}}}}", "1")
        assert result.reason == "timeout" and grader.stats.timeouts == 1
        assert grader.compare("\\frac{2}{4}", "0.5").correct
        # killed (stuck in C) and replaced, or interrupted by its own deadline and kept
        assert grader.restarts == grader.stats.worker_starts - 1 in (0, 1)


def test_an_easy_grade_next_to_a_pathological_one_is_not_blocked() -> None:
    """The issue's stall: with one worker an easy grade waits out the pathological one's timeout; with a
    pool it returns at once."""
    pathological = "\\boxed{9^{9^{9^{9^{9}}}}}"
    for workers, expect_blocked in ((1, True), (2, False)):
        with MathGrader(timeout_s=3.0, workers=workers).start() as grader:
            slow = threading.Thread(target=grader.grade, args=(pathological, "1"))
            slow.start()
            time.sleep(0.2)  # the pathological grade holds a worker now
            started = time.monotonic()
            assert grader.grade("\\boxed{\\frac{1}{2}}", "0.5").correct
            easy_s = time.monotonic() - started
            slow.join()
            assert grader.stats.timeouts == 1
            if expect_blocked:
                assert easy_s > 2.0, easy_s  # it waited for the only worker
            else:
                assert easy_s < 1.0, easy_s  # milliseconds on an idle machine


def test_asyncio_entry_points_do_not_block_the_loop() -> None:
    import asyncio

    async def main(grader: MathGrader) -> tuple[list, int]:
        ticks = 0

        async def ticker() -> None:
            nonlocal ticks
            while True:
                await asyncio.sleep(0.05)
                ticks += 1

        task = asyncio.create_task(ticker())
        results = await asyncio.gather(
            grader.agrade("\\boxed{9^{9^{9^{9^{9}}}}}", "1"),
            grader.agrade("\\boxed{\\frac{1}{2}}", "0.5"),
            grader.acompare("2", "3"),
            grader.agrade("no box", "1"),
        )
        task.cancel()
        return results, ticks

    with MathGrader(timeout_s=1.0, workers=2) as grader:
        results, ticks = asyncio.run(main(grader))
    assert [r.reason for r in results] == ["timeout", "correct", "wrong", "no_answer"]
    assert ticks >= 10  # the loop kept running while the pathological grade waited out its 1 s


def test_default_pool_size_follows_the_core_count() -> None:
    import os

    from stare_agents.envs.grading import default_grader, default_workers

    assert default_workers() == max(2, min(8, os.cpu_count()))
    assert default_grader().workers == default_workers() and default_grader() is default_grader()
    with pytest.raises(ValueError, match=r"workers must be in 1\.\.256"):
        MathGrader(workers=0)


def test_grading_time_and_timeouts_are_in_info() -> None:
    import gymnasium as gym

    with MathGrader(timeout_s=1.0, workers=1) as grader:
        env = gym.make("stare_agents/MathCoT-v0", grader=grader)
        env.reset(seed=0, options={"problem": "p", "answer": "1"})
        *_, info = env.step("\\boxed{9^{9^{9^{9^{9}}}}}")
        assert info["grade_reason"] == "timeout" and info["grade_timeouts"] == 1
        assert 0.7 < info["grade_duration_s"] < 3.0  # the worker's own deadline (0.75 s) or the kill (1 s)
        env.reset(seed=0, options={"problem": "p", "answer": "1"})
        *_, info = env.step("no answer at all")  # settled without a worker: exactly nothing
        assert (info["grade_duration_s"], info["grade_timeouts"]) == (0.0, 0)
        env.reset(seed=0, options={"problem": "p", "answer": "1/2"})
        *_, info = env.step("\\boxed{0.5}")
        assert info["correct"] and 0.0 < info["grade_duration_s"] < 1.0 and info["grade_timeouts"] == 0


def test_grader_is_thread_safe(grader: MathGrader) -> None:
    results: list[bool] = []

    def work(i: int) -> None:
        for j in range(5):
            results.append(grade_answer(f"\\boxed{{{i * 10 + j}}}", str(i * 10 + j), grader=grader).correct)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert results == [True] * 20


def test_math500_references_grade_against_themselves(grader: MathGrader) -> None:
    rows = [json.loads(line) for line in shared_data("benchmarks/math500.jsonl").read_text().splitlines()]
    failures = [
        r["answer"]
        for r in rows
        if not grade_answer(f"\\boxed{{{r['answer']}}}", r["answer"], grader=grader).correct
    ]
    assert failures == []
