"""Plain statistics shared by training and evaluation: a mean with its percentile-bootstrap interval over
problems, and the paired difference of two evaluations on the same problems.

    estimate([1, 0, 1, 1], bootstrap=1000).format()          # "75.0 [25.0, 100.0]"
    paired_difference(after_by_problem, before_by_problem)    # RL - SFT, problem by problem
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class Estimate:
    """A benchmark-level figure: the mean over `problems` problems and its bootstrap interval.

    value/ci_low/ci_high are None when no problem qualifies (e.g. every sample failed).
    """

    value: float | None
    ci_low: float | None
    ci_high: float | None
    problems: int

    def format(self, percent: bool = True, digits: int = 1) -> str:
        """ "43.2 [38.0, 48.1]" (percent) or "—" when there is no value."""
        if self.value is None:
            return "—"
        scale = 100.0 if percent else 1.0
        text = f"{self.value * scale:.{digits}f}"
        if self.ci_low is not None and self.ci_high is not None:
            text += f" [{self.ci_low * scale:.{digits}f}, {self.ci_high * scale:.{digits}f}]"
        return text


def estimate(
    values: Sequence[float], *, bootstrap: int = 1000, confidence: float = 0.95, seed: int = 0
) -> Estimate:
    """Mean of per-problem values with a percentile-bootstrap interval over problems (seeded).

    bootstrap=0 gives the mean without an interval. One problem gives an interval of zero width.
    """
    if not 0.0 < confidence < 1.0:
        raise ValueError(f"confidence must be in (0, 1), got {confidence}")
    if bootstrap < 0:
        raise ValueError(f"bootstrap must be >= 0 resamples, got {bootstrap}")
    array = np.asarray(values, dtype=float)
    if array.size == 0:
        return Estimate(None, None, None, 0)
    if not np.all(np.isfinite(array)):
        raise ValueError(f"per-problem values must be finite, got {array.tolist()}")
    mean = float(array.mean())
    if bootstrap == 0:
        return Estimate(mean, None, None, int(array.size))
    rng = np.random.default_rng(seed)
    means = array[rng.integers(0, array.size, size=(bootstrap, array.size))].mean(axis=1)
    tail = (1.0 - confidence) / 2.0 * 100.0
    low, high = np.percentile(means, [tail, 100.0 - tail])
    return Estimate(mean, float(low), float(high), int(array.size))



def paired_difference(
    after: Mapping[str, float],
    before: Mapping[str, float],
    *,
    bootstrap: int = 1000,
    confidence: float = 0.95,
    seed: int = 0,
) -> Estimate:
    """Mean of `after[p] - before[p]` over the problems both score, with a paired percentile-bootstrap
    interval: each resample draws problems, and both figures of a drawn problem move together.

    Raises ValueError when the two share no problem (they were measured on different tasks)."""
    common = [problem for problem in after if problem in before]
    if not common:
        raise ValueError(
            f"no problem in common between the two evaluations ({len(after)} and {len(before)} problems)"
        )
    return estimate(
        [float(after[p]) - float(before[p]) for p in common],
        bootstrap=bootstrap,
        confidence=confidence,
        seed=seed,
    )
