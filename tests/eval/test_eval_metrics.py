"""avg@k, unbiased pass@k and bootstrap intervals against hand-computed values."""

from __future__ import annotations

import math

import numpy as np
import pytest

from stare_agents.eval.metrics import (
    BenchmarkMetrics,
    ProblemOutcome,
    benchmark_metrics,
    k_values,
    outcomes_from_samples,
    pass_at_k,
)
from stare_agents.stats import Estimate, estimate


@pytest.mark.parametrize(
    ("n", "c", "k", "expected"),
    [
        (5, 2, 1, 2 / 5),  # pass@1 = c / n
        (5, 2, 2, 1 - 3 / 10),  # 1 - C(3,2)/C(5,2)
        (5, 2, 4, 1.0),  # n - c = 3 < 4: every 4-subset holds a correct sample
        (4, 1, 2, 1 - 3 / 6),  # 1 - C(3,2)/C(4,2)
        (10, 3, 4, 1 - 35 / 210),  # 1 - C(7,4)/C(10,4)
        (32, 0, 1, 0.0),  # c = 0
        (32, 0, 32, 0.0),  # c = 0, k = n
        (32, 32, 1, 1.0),  # c = n
        (32, 32, 32, 1.0),  # c = n, k = n
        (32, 1, 32, 1.0),  # k = n with one correct sample
        (1, 0, 1, 0.0),
        (1, 1, 1, 1.0),
        (1000, 1, 500, 0.5),  # 1 - C(999,500)/C(1000,500) = 1 - 500/1000
        (1024, 2, 1, 2 / 1024),
    ],
)
def test_pass_at_k_hand_computed(n: int, c: int, k: int, expected: float) -> None:
    assert pass_at_k(n, c, k) == pytest.approx(expected, abs=1e-12)


def test_pass_at_k_matches_exact_binomials_on_a_grid() -> None:
    for n in range(1, 13):
        for c in range(n + 1):
            for k in range(1, n + 1):
                exact = 1 - math.comb(n - c, k) / math.comb(n, k)
                assert pass_at_k(n, c, k) == pytest.approx(exact, abs=1e-12)


def test_pass_at_k_large_n_stays_finite_and_monotone() -> None:
    values = [pass_at_k(5000, 3, k) for k in (1, 10, 100, 1000, 4997, 4998)]
    assert all(0.0 <= v <= 1.0 for v in values)
    assert values == sorted(values)
    assert values[-1] == 1.0  # n - c = 4997 < 4998
    assert pass_at_k(np.int64(4), np.int64(1), np.int64(2)) == pytest.approx(0.5)


@pytest.mark.parametrize(
    ("n", "c", "k", "error"),
    [
        (0, 0, 1, ValueError),
        (4, 5, 1, ValueError),
        (4, -1, 1, ValueError),
        (4, 1, 0, ValueError),
        (4, 1, 5, ValueError),
        (4.0, 1, 1, TypeError),
        ("4", 1, 1, TypeError),
    ],
)
def test_pass_at_k_rejects_bad_arguments(n, c, k, error) -> None:
    with pytest.raises(error):
        pass_at_k(n, c, k)


def test_k_values() -> None:
    assert k_values(1) == [1]
    assert k_values(4) == [1, 2, 4]
    assert k_values(5) == [1, 2, 4, 5]
    assert k_values(32) == [1, 2, 4, 8, 16, 32]
    with pytest.raises(ValueError):
        k_values(0)


def test_estimate_bootstrap_interval() -> None:
    constant = estimate([0.5] * 7, bootstrap=200, seed=3)
    assert (constant.value, constant.ci_low, constant.ci_high, constant.problems) == (0.5, 0.5, 0.5, 7)
    # two problems, values 0 and 1: resampled means are 0, 0.5 or 1 with probabilities 1/4, 1/2, 1/4,
    # so the 95% percentile interval is [0, 1]
    two = estimate([0.0, 1.0], bootstrap=2000, seed=0)
    assert (two.value, two.ci_low, two.ci_high) == (0.5, 0.0, 1.0)
    values = np.random.default_rng(1).random(50).tolist()
    a, b = estimate(values, seed=7), estimate(values, seed=7)
    assert a == b  # seeded
    assert a.ci_low < a.value < a.ci_high
    assert estimate(values, bootstrap=0) == Estimate(pytest.approx(np.mean(values)), None, None, 50)
    assert estimate([]) == Estimate(None, None, None, 0)
    assert estimate([]).format() == "—"
    assert Estimate(0.4321, 0.38, 0.481, 10).format() == "43.2 [38.0, 48.1]"
    with pytest.raises(ValueError, match="finite"):
        estimate([0.1, float("nan")])
    with pytest.raises(ValueError, match="confidence"):
        estimate([0.1], confidence=1.0)
    with pytest.raises(ValueError, match="bootstrap"):
        estimate([0.1], bootstrap=-1)


def test_benchmark_metrics_with_failures_hand_computed() -> None:
    outcomes = [
        ProblemOutcome("p1", samples=4, correct=1, failed=0),
        ProblemOutcome("p2", samples=4, correct=2, failed=2),  # 2 successful, both correct
        ProblemOutcome("p3", samples=4, correct=0, failed=4),  # every sample failed
    ]
    m = benchmark_metrics(outcomes, bootstrap=0)
    assert (m.problems, m.samples, m.samples_per_problem, m.correct, m.failed) == (3, 12, 4, 3, 6)
    assert m.error_rate == 0.5
    assert m.problems_all_failed == 1
    assert m.ks == [1, 2, 4]
    # over successful samples: p1 1/4, p2 2/2; p3 has none and is left out
    assert m.avg.value == pytest.approx((0.25 + 1.0) / 2) and m.avg.problems == 2
    assert m.pass_at[1].value == pytest.approx(0.625)
    assert m.pass_at[2].value == pytest.approx((0.5 + 1.0) / 2) and m.pass_at[2].problems == 2
    # pass@4 needs 4 successful samples: only p1 (n - c = 3 < 4, so 1.0)
    assert m.pass_at[4].value == pytest.approx(1.0) and m.pass_at[4].problems == 1
    # strict: failed samples count as wrong
    assert m.avg_strict.value == pytest.approx((0.25 + 0.5 + 0.0) / 3) and m.avg_strict.problems == 3
    assert m.pass_at_strict[2].value == pytest.approx((0.5 + (1 - 1 / 6) + 0.0) / 3)
    assert m.pass_at_strict[4].value == pytest.approx(2 / 3)


def test_benchmark_metrics_all_correct_and_all_wrong() -> None:
    right = benchmark_metrics([ProblemOutcome(f"p{i}", 8, 8) for i in range(5)], bootstrap=100)
    assert all(e.value == 1.0 and e.ci_low == 1.0 for e in right.pass_at.values())
    assert right.avg.value == 1.0 and right.error_rate == 0.0
    wrong = benchmark_metrics([ProblemOutcome(f"p{i}", 8, 0) for i in range(5)], bootstrap=100)
    assert all(e.value == 0.0 and e.ci_high == 0.0 for e in wrong.pass_at.values())
    failed = benchmark_metrics([ProblemOutcome("p", 2, 0, 2)], bootstrap=10)
    assert failed.avg.value is None and failed.pass_at[1].problems == 0
    assert failed.avg_strict.value == 0.0 and failed.error_rate == 1.0


def test_benchmark_metrics_round_trip_and_explicit_ks() -> None:
    m = benchmark_metrics([ProblemOutcome("a", 4, 1), ProblemOutcome("b", 4, 3, 1)], ks=[1, 3], seed=5)
    assert m.ks == [1, 3]
    data = m.to_dict()
    assert data["avg_at"] == "avg@4"
    assert sorted(data["pass_at"]) == ["pass@1", "pass@3"]
    assert BenchmarkMetrics.from_dict(data) == m
    with pytest.raises(ValueError, match="outside"):
        benchmark_metrics([ProblemOutcome("a", 4, 1)], ks=[8])


def test_outcomes_from_samples_and_hostile_records() -> None:
    records = [
        {"problem_id": "x", "sample_index": 0, "correct": True, "failed": False},
        {"problem_id": "y", "sample_index": 0, "correct": False, "failed": True},
        {"problem_id": "x", "sample_index": 1, "correct": False, "failed": False},
        {"problem_id": 7, "sample_index": 0, "correct": 1},
    ]
    assert outcomes_from_samples(records) == [
        ProblemOutcome("x", 2, 1, 0),
        ProblemOutcome("y", 1, 0, 1),
        ProblemOutcome("7", 1, 1, 0),
    ]
    with pytest.raises(ValueError, match="both failed and correct"):
        outcomes_from_samples([{"problem_id": "x", "correct": True, "failed": True}])
    with pytest.raises(ValueError, match="failed sample cannot be correct"):
        ProblemOutcome("x", samples=2, correct=2, failed=1)
    with pytest.raises(ValueError, match="failed=3"):
        ProblemOutcome("x", samples=2, correct=0, failed=3)
    with pytest.raises(ValueError, match=">= 0"):
        ProblemOutcome("x", samples=-1, correct=0)
    with pytest.raises(ValueError, match="unique"):
        benchmark_metrics([ProblemOutcome("x", 1, 0), ProblemOutcome("x", 1, 1)])
    with pytest.raises(ValueError, match="at least one"):
        benchmark_metrics([])
    with pytest.raises(ValueError, match="samples=0"):
        benchmark_metrics([ProblemOutcome("x", 0, 0)])
