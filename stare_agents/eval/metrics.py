"""Accuracy metrics for sampled evaluations: avg@k, the unbiased pass@k, bootstrap intervals, error rate.

Each problem is sampled `n` times; `c` of the samples are correct.

* avg@n: the mean per-sample accuracy, `c / n` per problem, averaged over problems (the paper's avg@32 /
  avg@4). It equals the unbiased pass@1.
* pass@k (k <= n): the probability that at least one of k samples drawn without replacement from the n is
  correct, `1 - C(n-c, k) / C(n, k)` (Chen et al., 2021), computed as the product
  `1 - prod_{i=n-c+1}^{n} (1 - k / i)` so that no binomial coefficient is ever formed.

Failed samples (the rollout failed: `Trajectory.failed`, stop reasons tool_failure / env_error /
engine_error) say nothing about the model, so they are neither counted as wrong nor dropped silently:

* the headline metrics are computed over each problem's *successful* samples (n = successful, c = correct
  among them); a problem whose samples all failed has no value and is left out of the mean (the number of
  problems each figure covers is reported next to it), and pass@k leaves out problems with fewer than k
  successful samples;
* `error_rate` = failed samples / all samples is reported beside them;
* the *strict* variant counts every failed sample as wrong (n = all samples), so a reader sees the
  worst case the failures could hide.

Confidence intervals: a percentile bootstrap over problems (the problems are the random unit), seeded.
"""

from __future__ import annotations

import operator
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from stare_agents.stats import Estimate, estimate


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k for one problem: 1 - C(n-c, k) / C(n, k), as a stable product.

    n: samples drawn, c: correct samples among them, k: the budget (1 <= k <= n).
    """
    try:
        n, c, k = operator.index(n), operator.index(c), operator.index(k)
    except TypeError:
        raise TypeError(f"pass_at_k needs integers, got n={n!r}, c={c!r}, k={k!r}") from None
    if n < 1:
        raise ValueError(f"pass_at_k needs at least one sample, got n={n}")
    if not 0 <= c <= n:
        raise ValueError(f"the number of correct samples must be in [0, n={n}], got c={c}")
    if not 1 <= k <= n:
        raise ValueError(f"k must be in [1, n={n}], got k={k}: draw at least k samples per problem")
    if n - c < k:  # every k-subset holds a correct sample
        return 1.0
    # C(n-c, k) / C(n, k) = prod_{i=n-c+1}^{n} (1 - k / i)
    miss = 1.0
    for i in range(n - c + 1, n + 1):
        miss *= 1.0 - k / i
    return 1.0 - miss


def k_values(n: int) -> list[int]:
    """The budgets reported for n samples per problem: 1, 2, 4, ... (powers of two below n), then n."""
    if n < 1:
        raise ValueError(f"k_values needs n >= 1, got {n}")
    ks = []
    k = 1
    while k < n:
        ks.append(k)
        k *= 2
    ks.append(n)
    return ks


@dataclass(frozen=True)
class ProblemOutcome:
    """How one problem's samples went.

    samples: samples drawn (successful + failed); correct: correct samples (failed ones are never correct);
    failed: samples whose rollout failed.
    """

    problem_id: str
    samples: int
    correct: int
    failed: int = 0

    def __post_init__(self) -> None:
        if self.samples < 0 or self.failed < 0 or self.correct < 0:
            raise ValueError(f"problem {self.problem_id!r}: counts must be >= 0, got {self}")
        if self.failed > self.samples:
            raise ValueError(f"problem {self.problem_id!r}: failed={self.failed} > samples={self.samples}")
        if self.correct > self.samples - self.failed:
            raise ValueError(
                f"problem {self.problem_id!r}: correct={self.correct} exceeds the successful samples "
                f"({self.samples - self.failed}); a failed sample cannot be correct"
            )

    @property
    def successful(self) -> int:
        return self.samples - self.failed


def outcomes_from_samples(samples: Iterable[dict[str, Any]]) -> list[ProblemOutcome]:
    """Per-problem outcomes from sample records with `problem_id`, `correct` and `failed` keys.

    Problems keep the order in which they first appear. A failed sample must not be marked correct.
    """
    order: list[str] = []
    counts: dict[str, list[int]] = {}
    for record in samples:
        pid = str(record["problem_id"])
        if pid not in counts:
            counts[pid] = [0, 0, 0]
            order.append(pid)
        failed = bool(record.get("failed", False))
        correct = bool(record["correct"])
        if failed and correct:
            raise ValueError(
                f"sample {record.get('sample_index')} of {pid!r} is marked both failed and correct"
            )
        counts[pid][0] += 1
        counts[pid][1] += int(correct)
        counts[pid][2] += int(failed)
    return [ProblemOutcome(pid, *counts[pid]) for pid in order]


@dataclass
class BenchmarkMetrics:
    """The figures of one benchmark (see the module docstring for how failed samples count).

    avg: avg@n over successful samples; pass_at: pass@k over successful samples for `ks`;
    avg_strict / pass_at_strict: the same with failed samples counted as wrong.
    problems_all_failed: problems without a single successful sample.
    """

    problems: int
    samples: int
    samples_per_problem: int  # the largest n of any problem (the k of avg@k)
    correct: int
    failed: int
    error_rate: float
    problems_all_failed: int
    avg: Estimate
    avg_strict: Estimate
    pass_at: dict[int, Estimate] = field(default_factory=dict)
    pass_at_strict: dict[int, Estimate] = field(default_factory=dict)
    bootstrap: int = 1000
    confidence: float = 0.95
    seed: int = 0

    @property
    def ks(self) -> list[int]:
        return sorted(self.pass_at)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready: pass@k maps are keyed "pass@1", "pass@2", ..."""
        data = asdict(self)
        data["avg_at"] = f"avg@{self.samples_per_problem}"
        data["pass_at"] = {f"pass@{k}": asdict(v) for k, v in sorted(self.pass_at.items())}
        data["pass_at_strict"] = {f"pass@{k}": asdict(v) for k, v in sorted(self.pass_at_strict.items())}
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> BenchmarkMetrics:
        data = dict(data)
        data.pop("avg_at", None)
        data["avg"] = Estimate(**data["avg"])
        data["avg_strict"] = Estimate(**data["avg_strict"])
        for key in ("pass_at", "pass_at_strict"):
            data[key] = {int(name.split("@")[1]): Estimate(**v) for name, v in data[key].items()}
        return cls(**data)


def benchmark_metrics(
    outcomes: Sequence[ProblemOutcome],
    *,
    ks: Sequence[int] | None = None,
    bootstrap: int = 1000,
    confidence: float = 0.95,
    seed: int = 0,
) -> BenchmarkMetrics:
    """avg@n, pass@k (k in `ks`, default `k_values(n)`), strict variants and error rate for one benchmark."""
    if not outcomes:
        raise ValueError("benchmark_metrics needs at least one problem outcome")
    ids = [o.problem_id for o in outcomes]
    if len(set(ids)) != len(ids):
        duplicates = sorted({pid for pid in ids if ids.count(pid) > 1})
        raise ValueError(f"problem ids must be unique within a benchmark; repeated: {duplicates[:10]}")
    n_max = max(o.samples for o in outcomes)
    if n_max < 1:
        raise ValueError("no samples at all: every problem has samples=0")
    ks = list(ks) if ks is not None else k_values(n_max)
    bad = [k for k in ks if not 1 <= k <= n_max]
    if bad:
        raise ValueError(f"k values {bad} are outside [1, {n_max}] (the most samples any problem has)")

    def est(values: list[float]) -> Estimate:
        return estimate(values, bootstrap=bootstrap, confidence=confidence, seed=seed)

    ok = [o for o in outcomes if o.successful > 0]
    pass_at = {k: est([pass_at_k(o.successful, o.correct, k) for o in ok if o.successful >= k]) for k in ks}
    pass_at_strict = {
        k: est([pass_at_k(o.samples, o.correct, k) for o in outcomes if o.samples >= k]) for k in ks
    }
    samples = sum(o.samples for o in outcomes)
    failed = sum(o.failed for o in outcomes)
    return BenchmarkMetrics(
        problems=len(outcomes),
        samples=samples,
        samples_per_problem=n_max,
        correct=sum(o.correct for o in outcomes),
        failed=failed,
        error_rate=failed / samples,
        problems_all_failed=len(outcomes) - len(ok),
        avg=est([o.correct / o.successful for o in ok]),
        avg_strict=est([o.correct / o.samples for o in outcomes if o.samples > 0]),
        pass_at=pass_at,
        pass_at_strict=pass_at_strict,
        bootstrap=bootstrap,
        confidence=confidence,
        seed=seed,
    )
