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
def test_pathological_inputs_are_bounded_by_the_timeout(grader: MathGrader, answer: str) -> None:
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
    with MathGrader(timeout_s=1.0) as grader:
        assert grader.compare("2", "2").correct  # worker started
        grader._proc.stdin.write(  # a request whose worker-side deadline is far away
            (json.dumps({"answer": "9^{9^{9^{9}}}", "reference": "1", "soft_timeout_s": 60}) + "\n").encode()
        )
        grader._proc.stdin.flush()
        started = time.monotonic()
        assert grader._read_line(time.monotonic() + grader.timeout_s) is None
        grader._stop_worker()
        assert time.monotonic() - started < 3.0
        assert grader.compare("\\frac{2}{4}", "0.5").correct  # a fresh worker answers
        assert grader.restarts == 0  # _stop_worker cleared the process: a plain start, not a restart


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
