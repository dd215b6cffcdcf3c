"""`ArithmeticTIR-v0`: procedurally generated integer problems that need the Python tool to be solved reliably.

Offline, unlimited and seeded: `reset(seed=s)` always yields the same task. Five kinds, drawn uniformly:

* multiply: the product of two `digits`-digit numbers (default 15 digits each);
* modpow: a^b mod m with a 12-digit exponent;
* range_sum: the sum of i^k over i in [lo, hi] with i = r (mod d), for a range of ~10^5..10^6 numbers;
* digit_sum_factorial: the sum of the decimal digits of n!, n in [150, 1500] (1500! has 4,115 digits, under Python's 4,300-digit str() limit);
* count_primes: the number of primes in [lo, hi] with hi up to 2*10^6.

Two more kinds, not drawn unless asked for (`kinds=ALL_KINDS`), need a program the model constructs (a loop)
rather than one expression filled in with the problem's numbers:

* collatz_steps: how many steps the Collatz map takes from n (10^9 <= n < 10^12) to 1;
* fib_mod: F_n mod m for n in [10^5, 10^6) and a 9-digit m.

**Held-out problems.** Every problem belongs to one of two splits, decided by a hash of its text (the same on
every machine): one problem in `HELDOUT_SHARE` (16) of every kind is held out. `split="train"` (the default)
never draws a held-out problem and `split="heldout"` draws only held-out ones, so evaluation is disjoint from
anything training can draw by problem, not by seed. `ArithmeticTIREnv.task_space()` gives the size of each
kind's problem space (its held-out part is about 1/16 of it).

The reward is exact integer equality with the last `\\boxed{}` (commas and spaces inside it are ignored);
no math-verify needed, which keeps this environment's scoring instant.
"""

from __future__ import annotations

import hashlib
import math
import re
from collections.abc import Callable
from typing import Any, ClassVar, Literal

import numpy as np

from stare_agents.envs.core import Score, ToolEnv, load_prompt
from stare_agents.envs.grading import final_boxes, normalize_thousands
from stare_agents.envs.tasks import Task

_INTEGER = re.compile(r"-?[0-9]+")
_DIGITS = re.compile(r"\d+")
KINDS: tuple[str, ...] = ("multiply", "modpow", "range_sum", "digit_sum_factorial", "count_primes")
LOOP_KINDS: tuple[str, ...] = ("collatz_steps", "fib_mod")  # the model has to write a loop
ALL_KINDS: tuple[str, ...] = KINDS + LOOP_KINDS
SPLITS: tuple[str, ...] = ("train", "heldout")
HELDOUT_SHARE = 16  # one problem in 16 is held out
MAX_DRAWS = 1000  # draws per task before giving up on a split ((15/16)^1000 ~ 1e-28 for the held-out one)
Split = Literal["train", "heldout"]


def is_heldout(problem: str) -> bool:
    """Whether `problem` (its exact text) belongs to the held-out split."""
    digest = hashlib.sha256(f"stare-agents/arithmetic-heldout/{problem}".encode()).digest()
    return int.from_bytes(digest[:8], "big") % HELDOUT_SHARE == 0


def _count_primes(lo: int, hi: int) -> int:
    sieve = bytearray([1]) * (hi + 1)
    sieve[0:2] = b"\x00\x00"
    for p in range(2, math.isqrt(hi) + 1):
        if sieve[p]:
            sieve[p * p :: p] = bytearray(len(range(p * p, hi + 1, p)))
    return sum(sieve[lo:])


def _collatz_steps(n: int) -> int:
    steps = 0
    while n != 1:
        n = n // 2 if n % 2 == 0 else 3 * n + 1
        steps += 1
    return steps


def _fibonacci_mod(n: int, m: int) -> int:
    """F_n mod m by fast doubling: F_2k = F_k (2 F_k+1 - F_k), F_2k+1 = F_k^2 + F_k+1^2."""
    a, b = 0, 1  # F_0, F_1
    for bit in bin(n)[2:]:
        a, b = a * (2 * b - a) % m, (a * a + b * b) % m
        if bit == "1":
            a, b = b, (a + b) % m
    return a


class ArithmeticTIREnv(ToolEnv):
    """Seeded integer arithmetic that is easy with Python and error-prone without it.

    Args (besides `ToolEnv`'s): digits: size of the multiplication operands; kinds: which task kinds to draw.
    """

    default_max_turns: ClassVar[int] = 3
    default_prompt_template: ClassVar[str] = load_prompt("arithmetic_tir")

    def __init__(
        self, *, digits: int = 15, kinds: tuple[str, ...] = KINDS, split: Split = "train", **kwargs: Any
    ) -> None:
        unknown = set(kinds) - set(ALL_KINDS)
        if unknown or not kinds:
            raise ValueError(f"kinds must be a non-empty subset of {ALL_KINDS}, got {kinds!r}")
        if digits < 2:
            raise ValueError(f"digits must be >= 2, got {digits}")
        if split not in SPLITS:
            raise ValueError(f"split must be one of {SPLITS}, got {split!r}")
        super().__init__(**kwargs)
        self.digits = digits
        self.kinds = tuple(kinds)
        self.split = split

    def sample_task(self) -> Task:
        """A task of a uniformly drawn kind, from this environment's split (draws until the split matches)."""
        rng = self.np_random
        for _ in range(MAX_DRAWS):
            kind = self.kinds[int(rng.integers(len(self.kinds)))]
            problem, solve = self._draw(kind, rng)
            if is_heldout(problem) == (self.split == "heldout"):
                task_id = f"arith-{kind}-{hashlib.sha1(problem.encode()).hexdigest()[:10]}"
                return Task(problem=problem, answer=str(solve()), id=task_id, data={"kind": kind})
        raise RuntimeError(f"no {self.split} problem of kinds {self.kinds} in {MAX_DRAWS} draws")

    def _draw(self, kind: str, rng: np.random.Generator) -> tuple[str, Callable[[], int]]:
        """(problem text, a function computing its answer): the answer is computed only for kept draws."""

        def number(digits: int) -> int:
            rest = "".join(str(d) for d in rng.integers(0, 10, size=digits - 1))
            return int(str(int(rng.integers(1, 10))) + rest)

        if kind == "multiply":
            a, b = number(self.digits), number(self.digits)
            return f"Compute {a} \\times {b}.", lambda: a * b
        if kind == "modpow":
            a = int(rng.integers(2, 10**6))
            b = int(rng.integers(10**11, 10**12))
            m = int(rng.integers(10**8, 10**9)) * 2 + 1
            return f"Compute {a}^{{{b}}} \\bmod {m}.", lambda: pow(a, b, m)
        if kind == "range_sum":
            lo = int(rng.integers(1, 10**5))
            hi = lo + int(rng.integers(10**5, 10**6))
            d = int(rng.integers(3, 13))
            r = int(rng.integers(0, d))
            k = int(rng.integers(2, 4))
            problem = (
                f"Compute the sum of i^{k} over all integers i with {lo} \\le i \\le {hi} "
                f"and i \\equiv {r} \\pmod{{{d}}}."
            )
            return problem, lambda: sum(i**k for i in range(lo + (r - lo) % d, hi + 1, d))
        if kind == "digit_sum_factorial":
            n = int(rng.integers(150, 1501))
            return (
                f"What is the sum of the decimal digits of {n}!?",
                lambda: sum(map(int, str(math.factorial(n)))),
            )
        if kind == "collatz_steps":
            n = int(rng.integers(10**9, 10**12))
            return (
                f"Starting from n = {n}, repeatedly replace n by n/2 if n is even and by 3n+1 if n is odd. "
                "How many replacements does it take to reach 1?",
                lambda: _collatz_steps(n),
            )
        if kind == "fib_mod":
            n = int(rng.integers(10**5, 10**6))
            m = int(rng.integers(10**8, 10**9))
            return (
                f"Let F_0 = 0, F_1 = 1 and F_{{k+1}} = F_k + F_{{k-1}}. Compute F_{{{n}}} \\bmod {m}.",
                lambda: _fibonacci_mod(n, m),
            )
        hi = int(rng.integers(5 * 10**5, 2 * 10**6))
        lo = int(rng.integers(1, hi // 2))
        return f"How many prime numbers p satisfy {lo} \\le p \\le {hi}?", lambda: _count_primes(lo, hi)

    @staticmethod
    def task_space(digits: int = 15) -> dict[str, int]:
        """The number of distinct problems of each kind (each parameter tuple has its own text); about
        1/HELDOUT_SHARE of each is held out."""
        # count_primes: hi in [5e5, 2e6), lo in [1, hi // 2): sum of (hi // 2 - 1) over hi
        his = np.arange(5 * 10**5, 2 * 10**6, dtype=np.int64)
        return {
            "multiply": (9 * 10 ** (digits - 1)) ** 2,
            "modpow": (10**6 - 2) * (10**12 - 10**11) * (10**9 - 10**8),
            "range_sum": (10**5 - 1) * (10**6 - 10**5) * sum(range(3, 13)) * 2,
            "digit_sum_factorial": 1501 - 150,
            "count_primes": int((his // 2 - 1).sum()),
            "collatz_steps": 10**12 - 10**9,
            "fib_mod": (10**6 - 10**5) * (10**9 - 10**8),
        }

    def validate_task(self, task: Task) -> None:
        """The reference must be an integer (scoring compares integers exactly)."""
        answer = task.answer
        if not isinstance(answer, str) or len(answer) > 4000 or not _INTEGER.fullmatch(answer.strip()):
            raise ValueError(
                f"task {task.id!r}: ArithmeticTIR grades by exact integer equality, so the answer must be an "
                f"integer string such as '42', got {answer!r:.60}"
            )

    def solution_code(self, task: Task) -> str:
        """Python that solves an ArithmeticTIR task, with the numbers copied from the problem text (the SFT
        cold start's solver, `sft.data=solver`)."""
        kind = task.data.get("kind")
        n = [int(x) for x in _DIGITS.findall(task.problem)]
        if kind == "multiply":
            return f"print({n[0]} * {n[1]})"
        if kind == "modpow":
            return f"print(pow({n[0]}, {n[1]}, {n[2]}))"
        if kind == "range_sum":
            k, lo, hi, r, d = n[:5]
            return f"print(sum(i**{k} for i in range({lo}, {hi} + 1) if i % {d} == {r}))"
        if kind == "digit_sum_factorial":
            return f"import math\nprint(sum(int(c) for c in str(math.factorial({n[0]}))))"
        if kind == "count_primes":
            return f"from sympy import primepi\nprint(primepi({n[1]}) - primepi({n[0]} - 1))"
        if kind == "collatz_steps":
            return (
                f"n, steps = {n[0]}, 0\nwhile n != 1:\n    n = n // 2 if n % 2 == 0 else 3 * n + 1\n"
                "    steps += 1\nprint(steps)"
            )
        if kind == "fib_mod":
            return f"a, b = 0, 1\nfor _ in range({n[-2]}):\n    a, b = b, (a + b) % {n[-1]}\nprint(a)"
        raise ValueError(f"no ArithmeticTIR solver for task kind {kind!r}")

    def score(self, task: Task, response: str) -> Score:
        """1.0 when the final `\\boxed{}` holds exactly the reference integer (thousands separators allowed;
        several different boxed integers in the final run of boxes are a hedge and score 0)."""
        boxes, unterminated = final_boxes(response)
        if not boxes and not unterminated and self.tool_answers:
            boxes = [self.tool_answers[-1]]
        if unterminated:
            return Score(0.0, "parse_failure", details={"detail": "the last \\boxed{ is never closed"})
        if not boxes:
            return Score(0.0, "no_answer")
        values = []
        for boxed in boxes:
            cleaned = normalize_thousands(boxed.strip().strip("$").strip()).replace(",", "").replace(" ", "")
            if len(cleaned) > 4000 or not _INTEGER.fullmatch(cleaned):
                return Score(0.0, "parse_failure", extracted=boxed, details={"detail": "not an integer"})
            values.append(int(cleaned))
        extracted = ", ".join(boxes)
        if len(set(values)) > 1:
            return Score(
                0.0,
                "wrong",
                False,
                extracted,
                {"detail": f"{len(set(values))} different boxed integers (a hedge)"},
            )
        correct = values[-1] == int(str(task.answer).strip())
        return Score(float(correct), "correct" if correct else "wrong", correct, boxes[-1])
