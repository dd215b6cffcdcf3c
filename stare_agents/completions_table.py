"""Each RL step's completions as a table in TensorBoard (text plugin) and W&B, as TRL's trainers log them:
step, prompt, completion, reward, advantage (and the trajectory's status in the step).

    from stare_agents.completions_table import log_completions
    log_completions(step, rollout_log.last_saved, writer=run_log.writer, wandb_run=run_log.wandb)

The rows are the saved rollouts the step's `RolloutLog.write` produced (`SavedRollout`: prompt text, token
texts, reward, advantage, status). Prompts and completions are cut at `max_chars` characters (the cut is
said in the cell); every character that hides or reorders text (bidi controls, zero-width and tag
characters, controls, fillers, lone surrogates: `stare_agents.viewer.text.INVISIBLE_RANGES`) is shown as a
marked chip (`⟨U+202E⟩`), as the viewer shows it, so no cell renders reordered or hides text, and every cell
encodes. In TensorBoard the table is Markdown under the tag `rl/completions` (every Markdown and HTML character of the text escaped, so a cell
shows what was generated, literally); in W&B a `wandb.Table` under the same key, on the `rl/step` axis.
"""

from __future__ import annotations

import html
from collections.abc import Sequence
from dataclasses import astuple, dataclass
from typing import Any

from stare_agents.rollout_log import SavedRollout
from stare_agents.viewer.text import marked

TAG = "rl/completions"
COLUMNS = ("step", "prompt", "completion", "reward", "advantage", "status")
MAX_CHARS = 1000  # characters of a prompt or completion shown in a cell
# python-markdown's escapable characters, and `|` (tables); `<`, `>` and `&` become entities
_MARKDOWN_SPECIAL = frozenset("\\`*_{}[]()#+-.!|")


@dataclass(frozen=True)
class CompletionRow:
    """One trajectory of a step as the completions table shows it; `advantage` None when it was not
    trained (dropped, failed)."""

    step: int
    prompt: str
    completion: str
    reward: float
    advantage: float | None
    status: str


def completion_rows(
    step: int, rollouts: Sequence[SavedRollout], *, max_chars: int = MAX_CHARS, max_rows: int | None = None
) -> list[CompletionRow]:
    """The table's rows: one per saved rollout (the first `max_rows` when given), texts capped at
    `max_chars` with their invisible characters marked. A per-token advantage is shown as its mean over
    the action tokens."""
    rows = []
    for saved in rollouts[:max_rows] if max_rows is not None else rollouts:
        t = saved.trajectory
        if saved.tokens:
            completion = "".join(saved.tokens)
        else:  # no token texts (no tokenizer when saved): the turns' text and what came back
            completion = "".join(turn.text + turn.observation for turn in t.turns)
        prompt = saved.prompt_text or f"(prompt text not saved; task {t.task_id})"
        rows.append(
            CompletionRow(
                step=step,
                prompt=cap(marked(prompt), max_chars),
                completion=cap(marked(completion), max_chars),
                reward=float(t.reward),
                advantage=saved.mean_advantage,
                status=saved.status,
            )
        )
    return rows


def cap(text: str, max_chars: int) -> str:
    """`text` cut at `max_chars` characters, saying how many were left out."""
    if len(text) <= max_chars:
        return text
    return text[:max_chars] + f" … [{len(text) - max_chars} more characters]"


def markdown_table(rows: Sequence[CompletionRow]) -> str:
    """The rows as a Markdown table whose cells show their text literally (TensorBoard's text plugin
    renders Markdown, then sanitises the HTML)."""
    lines = ["| " + " | ".join(COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
    for row in rows:
        cells = [
            str(row.step),
            markdown_cell(row.prompt),
            markdown_cell(row.completion),
            f"{row.reward:.4g}",
            "" if row.advantage is None else f"{row.advantage:.4g}",
            markdown_cell(row.status),
        ]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def markdown_cell(text: str) -> str:
    """Text as one Markdown table cell, shown literally: HTML characters as entities, Markdown characters
    backslash-escaped, line breaks as <br>."""
    escaped = "".join("\\" + c if c in _MARKDOWN_SPECIAL else c for c in html.escape(text, quote=False))
    return escaped.replace("\r\n", "\n").replace("\r", "\n").replace("\n", "<br>")


def log_completions(
    step: int,
    rollouts: Sequence[SavedRollout],
    *,
    writer: Any = None,
    wandb_run: Any = None,
    max_chars: int = MAX_CHARS,
    max_rows: int | None = None,
) -> list[CompletionRow]:
    """Log one step's completions table: to TensorBoard through `writer` (a SummaryWriter: `add_text`, tag
    `rl/completions`) and to W&B through `wandb_run` (`wandb.Table` under `rl/completions`, with `rl/step`),
    each when given. Returns the rows (nothing is logged when `rollouts` is empty)."""
    rows = completion_rows(step, rollouts, max_chars=max_chars, max_rows=max_rows)
    if not rows:
        return rows
    if writer is not None:
        writer.add_text(TAG, markdown_table(rows), step)
        writer.flush()
    if wandb_run is not None:
        import wandb

        table = wandb.Table(columns=list(COLUMNS), data=[list(astuple(row)) for row in rows])
        wandb_run.log({TAG: table, "rl/step": step})
    return rows
