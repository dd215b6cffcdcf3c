"""The grader against hand-labelled cases written for this project: fractions, sets, intervals, several
boxes forming one answer, hedges, thousands separators, units, long answers. Every label is a judgement a
math teacher would make; the grader must agree with all of them."""

from __future__ import annotations

import pytest

from stare_agents.envs import MathGrader, grade_answer

# (response, reference, correct). A response without "\boxed" is wrapped in one.
CASES: list[tuple[str, str, bool]] = [
    # fractions and decimals
    ("\\frac{1}{2}", "0.5", True),
    ("\\dfrac{3}{4}", "\\frac34", True),
    ("2/3", "\\frac{2}{3}", True),
    ("\\frac{2}{4}", "\\frac{1}{2}", True),
    ("-\\frac{1}{2}", "\\frac{-1}{2}", True),
    ("0.33", "\\frac{1}{3}", False),
    ("\\frac{1}{2}", "\\frac{1}{3}", False),
    ("\\frac{\\sqrt{2}}{2}", "\\frac{1}{\\sqrt{2}}", True),
    # sets and tuples
    ("\\{1,2,3\\}", "\\{3,2,1\\}", True),
    ("\\{1,2\\}", "\\{1,2,3\\}", False),
    ("1, 2, 3", "\\{1,2,3\\}", True),
    ("(1, 2)", "(1,2)", True),
    ("(2, 1)", "(1,2)", False),
    # several boxes forming one answer where the reference lists several values
    ("\\boxed{1}, \\boxed{2}, \\boxed{3}", "\\{1,2,3\\}", True),
    ("$\\boxed{3}$ and $\\boxed{-2}$", "-2, 3", True),
    ("x = \\boxed{1} or x = \\boxed{2}", "1, 2", False),  # text between the boxes: not one run
    ("\\boxed{1}, \\boxed{2}", "(1, 2)", True),
    ("\\boxed{2}, \\boxed{1}", "(1, 2)", False),  # a tuple keeps its order
    ("\\boxed{1}, \\boxed{2}", "\\{1,2,3\\}", False),  # an element short
    # hedges: two different answers to a one-value question fail, the same answer twice does not
    ("\\boxed{2} or \\boxed{3}", "3", False),
    ("\\boxed{3}, \\boxed{2}", "3", False),
    ("\\boxed{3} \\boxed{3.0}", "3", True),
    ("\\boxed{3}\\boxed{3}", "3", True),
    ("first \\boxed{3}, then on reflection the answer is \\boxed{4}", "4", True),  # a correction, not a hedge
    # intervals
    ("[1, 2)", "[1,2)", True),
    ("(1, 2]", "[1,2)", False),
    ("(-\\infty, 0) \\cup (1, \\infty)", "(-\\infty,0)\\cup(1,\\infty)", True),
    ("(-\\infty, 0] \\cup (1, \\infty)", "(-\\infty,0)\\cup(1,\\infty)", False),
    # thousands separators
    ("1\\,000", "1000", True),
    ("1 000", "1000", True),
    ("1{,}000", "1000", True),
    ("12,345,678", "12345678", True),
    ("1\\,170", "1170", True),
    ("1\\,171", "1170", False),
    ("1\\ 000\\ 000", "10^6", True),
    ("\\$1\\,000", "1000", True),
    ("1000", "1{,}000", True),
    # units and decorations
    ("5\\text{ cm}", "5", True),
    ("90^\\circ", "90", True),
    ("10\\%", "10", True),
    ("5 \\text{ meters}", "6", False),
    ("x = 3", "3", True),
    ("\\text{Evelyn}", "Evelyn", True),
    # expressions
    ("x^2+2x+1", "(x+1)^2", True),
    ("\\pi", "3.14", False),
    ("2\\sqrt{2}", "\\sqrt{8}", True),
    ("52_8", "52_9", False),
    # length: a long answer that is literally the reference is graded; a long different one is not parsed
    ("1" * 1200, "1" * 1200, True),
    ("1" * 1200 + "2", "1" * 1200, False),
]


@pytest.mark.parametrize(("response", "reference", "correct"), CASES)
def test_grader_agrees_with_the_label(
    grader: MathGrader, response: str, reference: str, correct: bool
) -> None:
    if "\\boxed" not in response:
        response = f"The answer is $\\boxed{{{response}}}$."
    result = grade_answer(response, reference, grader=grader)
    assert result.correct is correct, result
