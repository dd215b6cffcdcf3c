"""`ArithmeticTIR-v0` and `-v1`: procedurally generated integer problems that need the Python tool to be solved
reliably. Offline, unlimited and seeded: `reset(seed=s)` always yields the same task.

`ArithmeticTIR-v1` (`ArithmeticTIRV1Env`, below): twelve kinds at three levels each (larger numbers at higher
levels), drawn uniformly over the 36 (kind, level) cells, so that held-out accuracy averages many cells and moves
in small steps. Its kinds and levels are listed in `V1_KINDS` and `ArithmeticTIRV1Env.task_space()`.

`ArithmeticTIR-v0` (`ArithmeticTIREnv`, kept unchanged for old runs: the same task for the same seed). Five kinds,
drawn uniformly:

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
from dataclasses import dataclass
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


def _number(rng: np.random.Generator, digits: int) -> int:
    """A uniformly drawn `digits`-digit number (first digit 1-9)."""
    rest = "".join(str(d) for d in rng.integers(0, 10, size=digits - 1))
    return int(str(int(rng.integers(1, 10))) + rest)


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


class _IntegerTasksEnv(ToolEnv):
    """What both versions share: the prompt, the split by problem hash, the integer reference and its scorer.
    A subclass draws one problem (`_draw_problem`)."""

    default_max_turns: ClassVar[int] = 3
    default_prompt_template: ClassVar[str] = load_prompt("arithmetic_tir")

    def __init__(self, *, split: Split = "train", **kwargs: Any) -> None:
        if split not in SPLITS:
            raise ValueError(f"split must be one of {SPLITS}, got {split!r}")
        super().__init__(**kwargs)
        self.split = split

    def _draw_problem(self, rng: np.random.Generator) -> tuple[str, Callable[[], int], dict[str, Any]]:
        """(problem text, a function computing its answer, `Task.data`): the answer is computed only for kept
        draws. `data["kind"]` (and `data["level"]`, where there are levels) name the task's id."""
        raise NotImplementedError

    def sample_task(self) -> Task:
        """A task from this environment's split (draws until the split matches; each draw as `_draw_problem`)."""
        rng = self.np_random
        for _ in range(MAX_DRAWS):
            problem, solve, data = self._draw_problem(rng)
            if is_heldout(problem) == (self.split == "heldout"):
                cell = data["kind"] if "level" not in data else f"{data['kind']}-L{data['level']}"
                task_id = f"arith-{cell}-{hashlib.sha1(problem.encode()).hexdigest()[:10]}"
                return Task(problem=problem, answer=str(solve()), id=task_id, data=data)
        raise RuntimeError(f"no {self.split} problem of kinds {self.kinds} in {MAX_DRAWS} draws")

    def validate_task(self, task: Task) -> None:
        """The reference must be an integer (scoring compares integers exactly)."""
        answer = task.answer
        if not isinstance(answer, str) or len(answer) > 4000 or not _INTEGER.fullmatch(answer.strip()):
            raise ValueError(
                f"task {task.id!r}: ArithmeticTIR grades by exact integer equality, so the answer must be an "
                f"integer string such as '42', got {answer!r:.60}"
            )

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


class ArithmeticTIREnv(_IntegerTasksEnv):
    """`ArithmeticTIR-v0`: seeded integer arithmetic that is easy with Python and error-prone without it.

    Args (besides `ToolEnv`'s): digits: size of the multiplication operands; kinds: which task kinds to draw;
    split: "train" or "heldout".
    """

    def __init__(
        self, *, digits: int = 15, kinds: tuple[str, ...] = KINDS, split: Split = "train", **kwargs: Any
    ) -> None:
        unknown = set(kinds) - set(ALL_KINDS)
        if unknown or not kinds:
            raise ValueError(f"kinds must be a non-empty subset of {ALL_KINDS}, got {kinds!r}")
        if digits < 2:
            raise ValueError(f"digits must be >= 2, got {digits}")
        super().__init__(split=split, **kwargs)
        self.digits = digits
        self.kinds = tuple(kinds)

    def _draw_problem(self, rng: np.random.Generator) -> tuple[str, Callable[[], int], dict[str, Any]]:
        kind = self.kinds[int(rng.integers(len(self.kinds)))]
        problem, solve = self._draw(kind, rng)
        return problem, solve, {"kind": kind}

    def _draw(self, kind: str, rng: np.random.Generator) -> tuple[str, Callable[[], int]]:
        """(problem text, a function computing its answer): the answer is computed only for kept draws."""

        if kind == "multiply":
            a, b = _number(rng, self.digits), _number(rng, self.digits)
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


# -- ArithmeticTIR-v1: twelve kinds at three levels ------------------------------------------------------------
LEVELS: tuple[int, ...] = (1, 2, 3)
Range = tuple[int, int]  # [low, high), as numpy's `integers` draws
Drawn = tuple[str, Callable[[], int]]  # (problem text, a function computing its answer)


def _pick(rng: np.random.Generator, bounds: Range) -> int:
    return int(rng.integers(*bounds))


def _size(bounds: Range) -> int:
    return bounds[1] - bounds[0]


def _coprime(rng: np.random.Generator, bounds: Range, other: int) -> int:
    """The first draw from `bounds` that is coprime to `other` (redrawn until it is)."""
    while True:
        value = _pick(rng, bounds)
        if math.gcd(value, other) == 1:
            return value


def _digit_sum(value: int) -> int:
    return sum(map(int, str(value)))


def _multiply(rng: np.random.Generator, r: dict[str, Range]) -> Drawn:
    a, b = _number(rng, r["digits"][0]), _number(rng, r["digits"][0])
    return f"Compute {a} \\times {b}.", lambda: a * b


def _modpow(rng: np.random.Generator, r: dict[str, Range]) -> Drawn:
    a, b, m = _pick(rng, r["a"]), _pick(rng, r["b"]), _pick(rng, r["m"])
    return f"Compute {a}^{{{b}}} \\bmod {m}.", lambda: pow(a, b, m)


def _modinv(rng: np.random.Generator, r: dict[str, Range]) -> Drawn:
    m = _pick(rng, r["m"])
    a = _coprime(rng, (2, m), m)
    return (
        f"Compute the inverse of {a} modulo {m}, that is, the integer x with 0 < x < {m} and "
        f"{a} x \\equiv 1 \\pmod{{{m}}}.",
        lambda: pow(a, -1, m),
    )


def _gcd(rng: np.random.Generator, r: dict[str, Range]) -> Drawn:
    g, x = _pick(rng, r["g"]), _pick(rng, r["x"])
    y = _coprime(rng, r["x"], x)  # gcd(g x, g y) = g
    return f"Compute \\gcd({g * x}, {g * y}).", lambda: g


def _isqrt(rng: np.random.Generator, r: dict[str, Range]) -> Drawn:
    a = _number(rng, r["digits"][0])
    return (
        f"Compute \\lfloor \\sqrt{{{a}}} \\rfloor, the largest integer whose square is at most {a}.",
        lambda: math.isqrt(a),
    )


def _base_convert(rng: np.random.Generator, r: dict[str, Range]) -> Drawn:
    base = _pick(rng, r["base"])
    numeral = str(_pick(rng, (1, base))) + "".join(
        str(d) for d in rng.integers(0, base, size=r["length"][0] - 1)
    )
    return f"Write the base-{base} numeral {numeral} in base 10.", lambda: int(numeral, base)


def _digit_sum_factorial(rng: np.random.Generator, r: dict[str, Range]) -> Drawn:
    n = _pick(rng, r["n"])
    return f"What is the sum of the decimal digits of {n}!?", lambda: _digit_sum(math.factorial(n))


def _digit_sum_power(rng: np.random.Generator, r: dict[str, Range]) -> Drawn:
    a, b = _pick(rng, r["a"]), _pick(rng, r["b"])
    return f"What is the sum of the decimal digits of {a}^{{{b}}}?", lambda: _digit_sum(a**b)


def _binomial_mod(rng: np.random.Generator, r: dict[str, Range]) -> Drawn:
    n = _pick(rng, r["n"])
    k, m = _pick(rng, (n // 4, n // 2 + 1)), _pick(rng, r["m"])
    return f"Compute \\binom{{{n}}}{{{k}}} \\bmod {m}.", lambda: math.comb(n, k) % m


def _range_sum(rng: np.random.Generator, r: dict[str, Range]) -> Drawn:
    lo = _pick(rng, r["lo"])
    hi = lo + _pick(rng, r["span"])
    d = _pick(rng, r["d"])
    residue, k = _pick(rng, (0, d)), _pick(rng, r["k"])
    return (
        f"Compute the sum of i^{k} over all integers i with {lo} \\le i \\le {hi} "
        f"and i \\equiv {residue} \\pmod{{{d}}}.",
        lambda: sum(i**k for i in range(lo + (residue - lo) % d, hi + 1, d)),
    )


def _count_primes_problem(rng: np.random.Generator, r: dict[str, Range]) -> Drawn:
    hi = _pick(rng, r["hi"])
    lo = _pick(rng, (1, hi // 2))
    return f"How many prime numbers p satisfy {lo} \\le p \\le {hi}?", lambda: _count_primes(lo, hi)


def _fib_mod(rng: np.random.Generator, r: dict[str, Range]) -> Drawn:
    n, m = _pick(rng, r["n"]), _pick(rng, r["m"])
    return (
        f"Let F_0 = 0, F_1 = 1 and F_{{k+1}} = F_k + F_{{k-1}}. Compute F_{{{n}}} \\bmod {m}.",
        lambda: _fibonacci_mod(n, m),
    )


@dataclass(frozen=True)
class V1Kind:
    """One kind of `ArithmeticTIR-v1`. `levels`: per level, the ranges its numbers are drawn from (a level's
    ranges are disjoint from the other levels', so a problem's text tells its level); `draw(rng, ranges)`: the
    problem and its answer; `code(numbers)`: the solver program, from the integers of the problem text in order;
    `space(ranges)`: the number of distinct problems (for modinv and gcd, whose second number is redrawn until
    coprime, the number of drawn tuples: an upper bound)."""

    levels: dict[int, dict[str, Range]]
    draw: Callable[[np.random.Generator, dict[str, Range]], Drawn]
    code: Callable[[list[int]], str]
    space: Callable[[dict[str, Range]], int]


V1_TABLE: dict[str, V1Kind] = {
    "multiply": V1Kind(
        {1: {"digits": (6, 7)}, 2: {"digits": (10, 11)}, 3: {"digits": (15, 16)}},
        _multiply,
        lambda n: f"print({n[0]} * {n[1]})",
        lambda r: (9 * 10 ** (r["digits"][0] - 1)) ** 2,
    ),
    "modpow": V1Kind(
        {
            1: {"a": (2, 10**3), "b": (10**3, 10**4), "m": (10**4, 10**5)},
            2: {"a": (2, 10**5), "b": (10**6, 10**7), "m": (10**6, 10**7)},
            3: {"a": (2, 10**6), "b": (10**11, 10**12), "m": (10**8, 10**9)},
        },
        _modpow,
        lambda n: f"print(pow({n[0]}, {n[1]}, {n[2]}))",
        lambda r: _size(r["a"]) * _size(r["b"]) * _size(r["m"]),
    ),
    "modinv": V1Kind(
        {1: {"m": (10**3, 10**4)}, 2: {"m": (10**7, 10**8)}, 3: {"m": (10**15, 10**16)}},
        _modinv,
        lambda n: f"print(pow({n[0]}, -1, {n[1]}))",
        lambda r: (r["m"][0] + r["m"][1] - 5) * _size(r["m"]) // 2,  # the sum of m - 2 (a in [2, m)) over m
    ),
    "gcd": V1Kind(
        {
            1: {"g": (10**2, 10**3), "x": (10**3, 10**4)},
            2: {"g": (10**5, 10**6), "x": (10**7, 10**8)},
            3: {"g": (10**9, 10**10), "x": (10**11, 10**12)},
        },
        _gcd,
        lambda n: f"import math\nprint(math.gcd({n[0]}, {n[1]}))",
        lambda r: _size(r["g"]) * _size(r["x"]) ** 2,
    ),
    "isqrt": V1Kind(
        {1: {"digits": (12, 13)}, 2: {"digits": (24, 25)}, 3: {"digits": (40, 41)}},
        _isqrt,
        lambda n: f"import math\nprint(math.isqrt({n[0]}))",
        lambda r: 9 * 10 ** (r["digits"][0] - 1),
    ),
    "base_convert": V1Kind(
        {
            1: {"base": (3, 10), "length": (12, 13)},
            2: {"base": (3, 10), "length": (20, 21)},
            3: {"base": (3, 10), "length": (32, 33)},
        },
        _base_convert,
        lambda n: f"print(int('{n[1]}', {n[0]}))",
        lambda r: sum((b - 1) * b ** (r["length"][0] - 1) for b in range(*r["base"])),
    ),
    "digit_sum_factorial": V1Kind(
        {1: {"n": (50, 400)}, 2: {"n": (400, 900)}, 3: {"n": (900, 1501)}},
        _digit_sum_factorial,
        lambda n: f"import math\nprint(sum(int(c) for c in str(math.factorial({n[0]}))))",
        lambda r: _size(r["n"]),
    ),
    "digit_sum_power": V1Kind(
        {
            1: {"a": (2, 100), "b": (20, 60)},
            2: {"a": (100, 1000), "b": (60, 200)},
            3: {"a": (1000, 10**4), "b": (200, 800)},
        },
        _digit_sum_power,
        lambda n: f"print(sum(int(c) for c in str({n[0]} ** {n[1]})))",
        lambda r: _size(r["a"]) * _size(r["b"]),
    ),
    "binomial_mod": V1Kind(
        {
            1: {"n": (50, 200), "m": (10**8, 10**9)},
            2: {"n": (10**3, 5 * 10**3), "m": (10**8, 10**9)},
            3: {"n": (10**4, 3 * 10**4), "m": (10**8, 10**9)},
        },
        _binomial_mod,
        lambda n: f"import math\nprint(math.comb({n[0]}, {n[1]}) % {n[2]})",
        lambda r: sum(n // 2 - n // 4 + 1 for n in range(*r["n"])) * _size(r["m"]),
    ),
    "range_sum": V1Kind(
        {
            1: {"lo": (1, 10**3), "span": (10**3, 10**4), "d": (3, 13), "k": (2, 4)},
            2: {"lo": (1, 10**4), "span": (10**4, 10**5), "d": (3, 13), "k": (2, 4)},
            3: {"lo": (1, 10**5), "span": (10**5, 10**6), "d": (3, 13), "k": (2, 4)},
        },
        _range_sum,
        lambda n: f"print(sum(i**{n[0]} for i in range({n[1]}, {n[2]} + 1) if i % {n[4]} == {n[3]}))",
        lambda r: _size(r["lo"]) * _size(r["span"]) * sum(range(*r["d"])) * _size(r["k"]),
    ),
    "count_primes": V1Kind(
        {1: {"hi": (10**4, 10**5)}, 2: {"hi": (10**5, 5 * 10**5)}, 3: {"hi": (5 * 10**5, 2 * 10**6)}},
        _count_primes_problem,
        lambda n: f"from sympy import primepi\nprint(primepi({n[1]}) - primepi({n[0]} - 1))",
        lambda r: int((np.arange(*r["hi"], dtype=np.int64) // 2 - 1).sum()),
    ),
    "fib_mod": V1Kind(
        {
            1: {"n": (10**3, 10**4), "m": (10**4, 10**5)},
            2: {"n": (10**4, 10**5), "m": (10**6, 10**7)},
            3: {"n": (10**5, 5 * 10**5), "m": (10**8, 10**9)},
        },
        _fib_mod,
        lambda n: f"a, b = 0, 1\nfor _ in range({n[-2]}):\n    a, b = b, (a + b) % {n[-1]}\nprint(a)",
        lambda r: _size(r["n"]) * _size(r["m"]),
    ),
}
V1_KINDS: tuple[str, ...] = tuple(V1_TABLE)
_LEVEL_ID = re.compile(r"^arith-(?P<kind>[a-z_]+)-L(?P<level>[0-9]+)-[0-9a-f]+$")


def kind_and_level(task_id: str) -> tuple[str, int | None]:
    """A task's kind and level from its id: "arith-gcd-L2-0123456789" -> ("gcd", 2); a v0 id
    ("arith-gcd-0123456789") has no level: ("gcd", None)."""
    graded = _LEVEL_ID.match(task_id)
    if graded:
        return graded["kind"], int(graded["level"])
    return re.sub(r"^arith-|-[0-9a-f]{6,}$", "", task_id), None


class ArithmeticTIRV1Env(_IntegerTasksEnv):
    """`ArithmeticTIR-v1`: twelve kinds (`V1_KINDS`) at three levels (`LEVELS`: larger numbers at higher levels),
    drawn uniformly over the (kind, level) cells. Each kind is solved by a short program with the problem's
    numbers filled in (`solution_code`). `Task.data` holds "kind" and "level"; the task id names both
    ("arith-gcd-L2-<hash>").

    Args (besides `ToolEnv`'s): kinds: which kinds to draw; levels: which levels; split: "train" or "heldout".
    """

    def __init__(
        self,
        *,
        kinds: tuple[str, ...] = V1_KINDS,
        levels: tuple[int, ...] = LEVELS,
        split: Split = "train",
        **kwargs: Any,
    ) -> None:
        if isinstance(kinds, str) or not kinds or set(kinds) - set(V1_KINDS):
            unknown = [] if isinstance(kinds, str) else sorted(set(kinds) - set(V1_KINDS), key=str)
            raise ValueError(
                f"kinds must be a non-empty subset of {V1_KINDS}, got {kinds!r}"
                + (f" ({', '.join(map(repr, unknown))} not a v1 kind)" if unknown else "")
            )
        if (
            isinstance(levels, str | int)
            or not levels
            or any(isinstance(v, bool) or v not in LEVELS for v in levels)
        ):
            raise ValueError(f"levels must be a non-empty subset of {LEVELS}, got {levels!r}")
        super().__init__(split=split, **kwargs)
        self.kinds = tuple(kinds)
        self.levels = tuple(int(v) for v in levels)
        self.cells = [(kind, level) for kind in self.kinds for level in self.levels]

    def _draw_problem(self, rng: np.random.Generator) -> tuple[str, Callable[[], int], dict[str, Any]]:
        kind, level = self.cells[int(rng.integers(len(self.cells)))]
        kind_spec = V1_TABLE[kind]
        problem, solve = kind_spec.draw(rng, kind_spec.levels[level])
        return problem, solve, {"kind": kind, "level": level}

    @staticmethod
    def task_space() -> dict[str, int]:
        """The number of distinct problems of each cell, keyed "<kind>-L<level>" (for modinv and gcd an upper
        bound, see `V1Kind`); about 1/HELDOUT_SHARE of each is held out."""
        return {
            f"{kind}-L{level}": spec.space(ranges)
            for kind, spec in V1_TABLE.items()
            for level, ranges in spec.levels.items()
        }

    def solution_code(self, task: Task) -> str:
        """Python that solves an ArithmeticTIR-v1 task, with the numbers copied from the problem text (the SFT
        cold start's solver, `sft.data=solver`)."""
        kind = task.data.get("kind")
        if kind not in V1_TABLE:
            raise ValueError(f"no ArithmeticTIR-v1 solver for task kind {kind!r}; the kinds are {V1_KINDS}")
        return V1_TABLE[kind].code([int(x) for x in _DIGITS.findall(task.problem)])
