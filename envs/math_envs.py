"""Math environments: `MathTIR-v0` (multi-turn, Python tool) and `MathCoT-v0` (single turn, chain of thought).

Both read tasks from a dataset (`dataset=` a .jsonl/.parquet path or a Hugging Face id; rows need a problem
and a reference answer) and grade the last `\\boxed{}` with math-verify. Without a dataset they use a small
built-in demo set (and say so once), so `gymnasium.make("stare_agents/MathTIR-v0")` works offline.

**Splits.** A training run draws its tasks with `split="train"` and its held-out accuracy with
`split="heldout"` (the trainer passes them), and the two never share a problem: the held-out part is
`heldout_dataset` (its problems are then left out of training), or the `heldout_fraction` of the dataset's
rows chosen by a hash of each problem's text (the same on every machine). A dataset with neither has no
held-out part, and `split="heldout"` is an error instead of an evaluation on training problems.
`split=None` (the default) is the whole dataset, for direct use and for the eval harness, which pins each
problem. The Hugging Face split of a dataset id is `hf_split`.
"""

from __future__ import annotations

import hashlib
import logging
from typing import Any, ClassVar, Literal

from stare_agents.envs.core import TextEnv, ToolEnv, load_prompt
from stare_agents.envs.tasks import Task, TaskDataset

logger = logging.getLogger("stare_agents.envs")

# Small, varied problems with exact answers, for smoke tests and demos (not for training).
DEMO_MATH_ROWS: list[dict[str, str]] = [
    {"id": "demo-0", "problem": "What is the sum of all positive divisors of 360?", "answer": "1170"},
    {"id": "demo-1", "problem": "Compute $\\dfrac{7}{12} + \\dfrac{5}{18}$.", "answer": "\\frac{31}{36}"},
    {"id": "demo-2", "problem": "Solve for $x$: $3x - 7 = 2x + 5$.", "answer": "12"},
    {
        "id": "demo-3",
        "problem": "How many positive integers less than 1000 are divisible by 7 but not by 11?",
        "answer": "130",
    },
    {"id": "demo-4", "problem": "Find the remainder when $2^{100}$ is divided by $13$.", "answer": "3"},
    {"id": "demo-5", "problem": "What is the value of $\\binom{12}{5}$?", "answer": "792"},
    {"id": "demo-6", "problem": "Simplify $\\sqrt{72}$.", "answer": "6\\sqrt{2}"},
    {
        "id": "demo-7",
        "problem": "Find all real $x$ with $x^2 - 5x + 6 < 0$. Give your answer in interval notation.",
        "answer": "(2,3)",
    },
    {
        "id": "demo-8",
        "problem": "The points $(1,2)$ and $(7,10)$ are the endpoints of a diameter of a circle. What is the center of the circle?",
        "answer": "(4,6)",
    },
    {"id": "demo-9", "problem": "What is the greatest common divisor of $9177$ and $7293$?", "answer": "3"},
    {"id": "demo-10", "problem": "Compute $\\sum_{k=1}^{50} k^2$.", "answer": "42925"},
    {"id": "demo-11", "problem": "Evaluate $\\log_2 1024 + \\log_3 81$.", "answer": "14"},
    {
        "id": "demo-12",
        "problem": "How many ways can 6 people be seated around a round table (rotations are the same)?",
        "answer": "120",
    },
    {"id": "demo-13", "problem": "Expand $(x+2)^3$.", "answer": "x^3+6x^2+12x+8"},
    {
        "id": "demo-14",
        "problem": "A fair die is rolled twice. What is the probability that the sum is 8? Express your answer as a common fraction.",
        "answer": "\\frac{5}{36}",
    },
    {"id": "demo-15", "problem": "What is the 20th Fibonacci number, if $F_1 = F_2 = 1$?", "answer": "6765"},
    {
        "id": "demo-16",
        "problem": "Compute the determinant of $\\begin{pmatrix} 2 & 3 \\\\ 1 & 4 \\end{pmatrix}$.",
        "answer": "5",
    },
    {
        "id": "demo-17",
        "problem": "Find the inverse of $\\begin{pmatrix} 2 & 1 \\\\ 1 & 1 \\end{pmatrix}$.",
        "answer": "\\begin{pmatrix} 1 & -1 \\\\ -1 & 2 \\end{pmatrix}",
    },
    {
        "id": "demo-18",
        "problem": "What is $0.\\overline{36}$ as a common fraction in lowest terms?",
        "answer": "\\frac{4}{11}",
    },
    {"id": "demo-19", "problem": "How many trailing zeros does $100!$ have?", "answer": "24"},
]

_warned_demo: set[str] = set()


Split = Literal["train", "heldout"]
SPLITS: tuple[str, ...] = ("train", "heldout")


def _problem_key(problem: str) -> str:
    return " ".join(problem.split())


def in_heldout_fraction(problem: str, fraction: float) -> bool:
    """Whether `problem` falls in the held-out `fraction` of a dataset (a hash of its text, whitespace
    collapsed, so a problem repeated in the dataset is always on one side)."""
    digest = hashlib.sha256(f"stare-agents/math-heldout/{_problem_key(problem)}".encode()).digest()
    return int.from_bytes(digest[:8], "big") / 2**64 < fraction


def split_tasks(
    env_name: str,
    dataset: Any,
    *,
    split: Split | None,
    heldout_fraction: float = 0.0,
    heldout_dataset: Any = None,
    fields: Any = None,
    hf_split: str = "train",
) -> TaskDataset:
    """The tasks of `split` (see the module docstring): None all of `dataset`, "train" the rows outside the
    held-out part, "heldout" the held-out part (an error when there is none)."""
    if split not in (None, *SPLITS):
        raise ValueError(
            f"{env_name}: split must be 'train', 'heldout' or None (the whole dataset), got {split!r}; the "
            "split of a Hugging Face dataset id is hf_split"
        )
    if isinstance(heldout_fraction, bool) or not 0.0 <= heldout_fraction < 1.0:
        raise ValueError(f"{env_name}: heldout_fraction must be in [0, 1), got {heldout_fraction!r}")
    if heldout_dataset is not None and heldout_fraction:
        raise ValueError(
            f"{env_name}: give heldout_dataset or heldout_fraction, not both (got {heldout_fraction})"
        )

    def load(source: Any) -> TaskDataset:
        if isinstance(source, TaskDataset):
            return source
        return TaskDataset(source, fields=fields, split=hf_split)

    tasks = load(_dataset_or_demo(env_name, dataset))
    if split is None:
        return tasks
    if heldout_dataset is not None:
        heldout = load(heldout_dataset)
        if split == "heldout":
            return heldout
        held: set[str] = set()

        def not_held_out(task: Task) -> bool:
            if not held:
                held.update(_problem_key(t.problem) for t in heldout)
            return _problem_key(task.problem) not in held

        return tasks.where(not_held_out, name=f"{tasks.name!s} without {heldout.name!s}")
    if heldout_fraction > 0:
        inside = split == "heldout"
        return tasks.where(
            lambda task: in_heldout_fraction(task.problem, heldout_fraction) == inside,
            name=f"{tasks.name!s} ({split}, heldout_fraction={heldout_fraction})",
        )
    if split == "heldout":
        raise ValueError(
            f"{env_name}(split='heldout'): the dataset {tasks.name!s} has no held-out part, so a held-out "
            "evaluation would draw training problems. Set heldout_fraction (env.kwargs.heldout_fraction=0.02: "
            "that share of the rows, chosen by a hash of the problem text, is never trained on) or "
            "heldout_dataset=<file or id> (its problems are never trained on), or set eval.num_tasks=0 and "
            "evaluate on benchmarks only (eval.benchmarks)"
        )
    return tasks


def _dataset_or_demo(env_name: str, dataset: Any) -> Any:
    if dataset is not None:
        return dataset
    if env_name not in _warned_demo:
        _warned_demo.add(env_name)
        logger.warning(
            "%s: no dataset given, using the %d built-in demo problems. Pass dataset=<.jsonl/.parquet path or "
            "Hugging Face id> to train or evaluate on real data.",
            env_name,
            len(DEMO_MATH_ROWS),
        )
    return TaskDataset(DEMO_MATH_ROWS)


class MathTIREnv(ToolEnv):
    """Tool-integrated reasoning on math problems (SimpleTIR/ToRL style).

    The policy reasons in text, runs Python in a stateful sandbox session (one per episode) by writing
    ```python blocks (or Hermes `<tool_call>`s with `tool_format="hermes"`), and ends with `\\boxed{answer}`.
    Reward 1.0 if math-verify finds the answer equal to the reference, else 0.0. Defaults: 4 turns, first
    code block of a turn runs, ```output observations of at most 2048 characters, 5 s per tool call,
    void turns end the episode. All `ToolEnv`/`TextEnv` arguments apply.
    """

    default_max_turns: ClassVar[int] = 4

    def __init__(
        self,
        *,
        dataset: Any = None,
        split: Split | None = None,
        heldout_fraction: float = 0.0,
        heldout_dataset: Any = None,
        hf_split: str = "train",
        fields: Any = None,
        prompt_template: str | None = None,
        **kwargs: Any,
    ) -> None:
        if prompt_template is None:
            hermes = kwargs.get("tool_format") == "hermes"
            prompt_template = load_prompt("math_tir_hermes" if hermes else "math_tir")
        tasks = split_tasks(
            "MathTIR-v0",
            dataset,
            split=split,
            heldout_fraction=heldout_fraction,
            heldout_dataset=heldout_dataset,
            fields=fields,
            hf_split=hf_split,
        )
        self.split = split
        super().__init__(dataset=tasks, prompt_template=prompt_template, **kwargs)


class MathCoTEnv(TextEnv):
    """Single-turn chain-of-thought math. `cot="short"` or `"long"` changes only the prompt and the
    generation budget hint (`max_response_tokens`: 4096 short, 16384 long)."""

    def __init__(
        self,
        *,
        dataset: Any = None,
        split: Split | None = None,
        heldout_fraction: float = 0.0,
        heldout_dataset: Any = None,
        hf_split: str = "train",
        fields: Any = None,
        cot: Literal["short", "long"] = "short",
        prompt_template: str | None = None,
        max_response_tokens: int | None = None,
        **kwargs: Any,
    ) -> None:
        if cot not in ("short", "long"):
            raise ValueError(f"cot must be 'short' or 'long', got {cot!r}")
        self.cot = cot
        self.split = split
        tasks = split_tasks(
            "MathCoT-v0",
            dataset,
            split=split,
            heldout_fraction=heldout_fraction,
            heldout_dataset=heldout_dataset,
            fields=fields,
            hf_split=hf_split,
        )
        super().__init__(
            dataset=tasks,
            prompt_template=prompt_template or load_prompt(f"math_cot_{cot}"),
            max_response_tokens=max_response_tokens or (4096 if cot == "short" else 16384),
            max_turns=1,
            **kwargs,
        )


__all__ = ["DEMO_MATH_ROWS", "MathCoTEnv", "MathTIREnv", "Task", "in_heldout_fraction", "split_tasks"]
