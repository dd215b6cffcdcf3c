"""Token-budget micro-batches: a step batch cut into optimiser updates and micro-batches (`split_step`), rows
planned into micro-batches by padded tokens, or by packed tokens with shared prompts (`plan_micro_batches`)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Literal, get_args

import torch
from torch import Tensor

from stare_agents.train.packing import prompt_groups
from stare_agents.train.seqlen_balancing import verl_micro_batches
from stare_agents.trajectory import Batch

Packing = Literal["longest-first", "balanced", "verl"]  # how plan_micro_batches packs rows
PACKINGS: tuple[str, ...] = get_args(Packing)


@dataclass
class MicroBatch:
    """Some rows of a step batch, padding trimmed, with their advantages ([b] or [b, R'])."""

    batch: Batch
    advantages: Tensor
    rows: list[int] = field(default_factory=list)  # indices into the step batch
    filler: bool = False  # an all-masked stand-in that keeps collective forwards in step (FSDP); not counted

    @property
    def num_action_tokens(self) -> int:
        return int((self.batch.action_mask > 0).sum())

    def to(self, device: torch.device) -> MicroBatch:
        return MicroBatch(self.batch.to(device), self.advantages.to(device), self.rows, self.filler)


def row_lengths(batch: Batch) -> tuple[list[int], list[int]]:
    """(prompt tokens, response tokens) of every row, from the attention mask."""
    p = batch.prompt_length
    return batch.attention_mask[:, :p].sum(-1).tolist(), batch.attention_mask[:, p:].sum(-1).tolist()


def plan_micro_batches(
    batch: Batch,
    max_tokens: int,
    rows: Sequence[int] | None = None,
    *,
    packing: str = "longest-first",
    shared_prompts: bool = False,
) -> list[list[int]]:
    """Pack rows into micro-batches of at most `max_tokens` padded tokens (rows x (longest prompt + longest
    response)). A row longer than the budget gets a micro-batch of its own. Deterministic: ties keep row
    order; rows ascend in each group.

    "longest-first": rows sorted by length fill one micro-batch after another, so rows of like length share
    padding (fewest padded tokens). "balanced": the padded token counts are evened out across micro-batches
    (what the official code's dynamic batching aims at); see `_balanced_groups`. "verl": the official code's
    own partitioning (ceil(real tokens / max_tokens) micro-batches, Karmarkar-Karp over the rows' real
    lengths; `stare_agents.train.seqlen_balancing`).

    `shared_prompts` (for a policy that packs rows and shares prompts, and packing "longest-first"): a
    micro-batch costs its packed tokens, each distinct prompt once plus every response, and the rows of one
    prompt stay together (`_shared_groups`)."""
    if max_tokens < 1:
        raise ValueError(f"micro_batch_tokens must be >= 1, got {max_tokens}")
    if packing not in PACKINGS:
        raise ValueError(f"micro_batch_packing must be one of {PACKINGS}, got {packing!r}")
    prompt_lens, response_lens = row_lengths(batch)
    rows = list(range(len(prompt_lens))) if rows is None else list(rows)
    if shared_prompts and packing == "longest-first":
        return _shared_groups(batch, rows, prompt_lens, response_lens, max_tokens)
    if packing == "verl":
        lengths = [prompt_lens[i] + response_lens[i] for i in rows]
        return [[rows[i] for i in part] for part in verl_micro_batches(lengths, max_tokens)]
    order = sorted(rows, key=lambda i: -(prompt_lens[i] + response_lens[i]))
    groups: list[list[int]] = []
    current: list[int] = []
    longest_p = longest_r = 0
    for i in order:
        p, r = max(longest_p, prompt_lens[i]), max(longest_r, response_lens[i], 1)
        if current and (len(current) + 1) * (p + r) > max_tokens:
            groups.append(sorted(current))
            current, p, r = [], prompt_lens[i], max(response_lens[i], 1)
        current.append(i)
        longest_p, longest_r = p, r
    if current:
        groups.append(sorted(current))
    if packing == "balanced":
        return _balanced_groups(order, prompt_lens, response_lens, max_tokens, len(groups))
    return groups


def shared_prompt_planning(shares: bool, packing: str, normalization: str) -> bool:
    """Whether a learner cuts its micro-batches by packed tokens with each group's prompt once: where its policy
    shares prompts, rows are planned "longest-first" and the loss is normalised globally (the "micro-batch"
    normalisation's meaning is tied to the official micro-batches, which are kept as they are)."""
    return shares and packing == "longest-first" and normalization == "global"


def _shared_groups(
    batch: Batch, rows: list[int], prompt_lens: list[int], response_lens: list[int], max_tokens: int
) -> list[list[int]]:
    """Micro-batches by packed tokens with shared prompts: the rows of one prompt form a unit costing the prompt
    once plus their responses (a unit over the budget is cut into runs of rows that fit, each paying the prompt
    again; a row over the budget alone); units, largest first, go to the first micro-batch they fit in
    (first-fit decreasing), else open one. Deterministic; rows ascend in each micro-batch."""
    wanted = set(rows)
    units: list[tuple[int, list[int]]] = []  # (packed tokens, rows)
    for group in prompt_groups(batch):
        members = [i for i in group if i in wanted]
        if not members:
            continue
        prompt = prompt_lens[members[0]]
        cost, run = prompt, []
        for i in members:
            if run and cost + response_lens[i] > max_tokens:
                units.append((cost, run))
                cost, run = prompt, []
            run.append(i)
            cost += response_lens[i]
        units.append((cost, run))
    units.sort(key=lambda unit: (-unit[0], unit[1][0]))
    bins: list[tuple[int, list[int]]] = []
    for cost, run in units:
        for k, (used, members) in enumerate(bins):
            if used + cost <= max_tokens:
                bins[k] = (used + cost, members + run)
                break
        else:
            bins.append((cost, list(run)))
    return [sorted(members) for _, members in bins]


def _balanced_groups(
    order: list[int], prompt_lens: list[int], response_lens: list[int], max_tokens: int, start: int
) -> list[list[int]]:
    """Greedy longest-processing-time packing over k micro-batches: each row (longest first) joins the
    micro-batch whose padded token count after adding it is smallest among those it fits in, and opens a new
    one when it fits in none. k starts at `start` (longest-first's count, less its oversized rows) and is
    raised to the count a pass ended with until a pass ends with k (at most len(rows) passes, usually one).
    Rows longer than the budget come first, each alone, as in longest-first. Mixing long and short rows
    evens the micro-batches out at the price of some padding."""

    def length(i: int) -> int:
        return prompt_lens[i] + max(response_lens[i], 1)

    alone = [[i] for i in order if length(i) > max_tokens]
    rest = [i for i in order if length(i) <= max_tokens]
    start -= len(alone)
    k = start
    while True:
        groups: list[list[int]] = [[] for _ in range(k)]
        shape = [(0, 0)] * k  # (longest prompt, longest response) of each group
        for i in rest:
            best, best_cost = None, None
            for g, (p, r) in enumerate(shape):
                p, r = max(p, prompt_lens[i]), max(r, response_lens[i], 1)
                cost = (len(groups[g]) + 1) * (p + r)
                if cost <= max_tokens and (best_cost is None or cost < best_cost):
                    best, best_cost = g, cost
            if best is None:
                groups.append([])
                shape.append((0, 0))
                best = len(groups) - 1
            groups[best].append(i)
            p, r = shape[best]
            shape[best] = (max(p, prompt_lens[i]), max(r, response_lens[i], 1))
        if len(groups) == k:
            return alone + [sorted(g) for g in groups]
        k = len(groups)


def slice_batch(batch: Batch, rows: Sequence[int]) -> Batch:
    """The given rows, with the padding no row of them needs trimmed off both ends."""
    index = torch.as_tensor(list(rows), dtype=torch.long)
    prompt_lens, response_lens = row_lengths(batch)
    p = max(prompt_lens[i] for i in rows)
    r = max(1, max(response_lens[i] for i in rows))
    start, stop = batch.prompt_length - p, batch.prompt_length + r
    return Batch(
        input_ids=batch.input_ids[index, start:stop],
        attention_mask=batch.attention_mask[index, start:stop],
        position_ids=batch.position_ids[index, start:stop],
        response_ids=batch.response_ids[index, :r],
        action_mask=batch.action_mask[index, :r],
        rollout_logprobs=batch.rollout_logprobs[index, :r],
        rewards=batch.rewards[index],
        prompt_length=p,
    )


def split_step(
    batch: Batch,
    advantages: Tensor | None,
    *,
    mini_batches: int,
    micro_batch_tokens: int,
    packing: str = "longest-first",
    shared_prompts: bool = False,
) -> list[list[MicroBatch]]:
    """A step batch -> `mini_batches` optimiser updates (contiguous row ranges) -> token-budget micro-batches
    (packed as `packing` says, see `plan_micro_batches`)."""
    num_rows = batch.input_ids.shape[0]
    if advantages is None:
        advantages = torch.zeros(num_rows)
    if advantages.shape[0] != num_rows or advantages.dim() not in (1, 2):
        raise ValueError(
            f"advantages must be [B] or [B, R] for a batch of B={num_rows} rows and R={batch.response_length} "
            f"response tokens, got {tuple(advantages.shape)}"
        )
    if advantages.dim() == 2 and advantages.shape[1] != batch.response_length:
        raise ValueError(
            f"per-token advantages {tuple(advantages.shape)} do not match the responses "
            f"{num_rows} x {batch.response_length}"
        )
    if not bool(torch.isfinite(advantages).all()):
        raise ValueError("advantages must be finite; got NaN or inf (check the rewards)")
    if not 1 <= mini_batches <= num_rows:
        raise ValueError(f"mini_batches must be in [1, {num_rows}] for {num_rows} rows, got {mini_batches}")
    plan = []
    for part in torch.arange(num_rows).tensor_split(mini_batches):
        micro = []
        for rows in plan_micro_batches(
            batch, micro_batch_tokens, part.tolist(), packing=packing, shared_prompts=shared_prompts
        ):
            sliced = slice_batch(batch, rows)
            adv = advantages[rows]
            if adv.dim() == 2:
                adv = adv[:, : sliced.response_length]
            micro.append(MicroBatch(sliced, adv, rows))
        plan.append(micro)
    return plan
