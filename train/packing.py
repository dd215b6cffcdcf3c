"""Row packing: the learner's forward spends no FLOPs on padding.

A micro-batch arrives padded ([b, T]: prompts left-padded, responses right-padded). Packed, its real tokens run as
one sequence [1, N] (N = the real tokens, N <= b * T) with each row's position ids restarting at 0, and attention
is computed row by row (a segment of the packed sequence sees only itself, causally), so the result is the padded
forward's to float rounding while the linear layers, norms and MLPs touch only real tokens.

    packed = pack_batch(batch)                                   # ids [1, N], positions, segments, index map
    hidden = decoder(input_ids=packed.input_ids, position_ids=packed.position_ids,
                     packed_segments=packed.segments).last_hidden_state
    rows = hidden[0, packed.index[:, p - 1 : p - 1 + r][is_action]]   # the action tokens' hidden states

The attention runs through Hugging Face's attention interface under the name PACKED_ATTENTION. With a packed
forward's `packed_segments` it attends per segment: torch's variable-length flash attention on CUDA in half
precision (`torch.nn.attention.varlen.varlen_attn`, where this torch has it), else one causal
`scaled_dot_product_attention` per row (CPU, fp32). Without `packed_segments` (a padded batch, generation) it is
the model's SDPA attention with the usual mask, so the model stays usable for everything else. The name stays set
on the model: gradient checkpointing re-runs a layer in backward with the same arguments, and finds the same
attention.

Packing is exact only where attention is the one place positions meet (Llama, Qwen2/2.5/3, Mistral without a
sliding window, SmolLM): `packing_refusal` checks this on the model itself, by comparing a packed and a padded
forward of two rows of different lengths in fp32, before any training.
"""

from __future__ import annotations

import contextlib
import contextvars
import inspect
import logging
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, Literal, get_args

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from stare_agents.trajectory import Batch

logger = logging.getLogger(__name__)

PackRows = Literal["auto", "on", "off"]  # auto: pack where the probe finds it exact, else pad (said once)
PACK_ROWS: tuple[str, ...] = get_args(PackRows)
PACKED_ATTENTION = "stare_packed"
# packed vs padded last hidden states, relative to their scale (a leak between rows is O(1)): fp32, and bf16/fp16
# autocast (8 or 11 significant bits, other kernels)
PROBE_TOLERANCE = 1e-3
HALF_PROBE_TOLERANCE = 5e-2

_in_packed_forward: contextvars.ContextVar[bool] = contextvars.ContextVar(
    "stare_packed_forward", default=False
)


@dataclass(frozen=True)
class Segments:
    """The segments of the packed sequence: `bounds` [(start, stop)] in token positions, in order and covering
    it; `cu_seqlens` the same as a cumulative int32 tensor [segments + 1] on the device; `max_len` the longest
    context a segment's tokens attend over (its prefix included). `prefixes`, one per segment (empty: none
    has one): None, or the (start, stop) of an earlier segment that this one continues, i.e. attends to in
    full before itself (a shared prompt, see `pack_batch`)."""

    bounds: tuple[tuple[int, int], ...]
    cu_seqlens: Tensor
    max_len: int
    prefixes: tuple[tuple[int, int] | None, ...] = ()

    @property
    def shared(self) -> bool:
        """Whether some segment continues a prefix (then attention runs segment by segment)."""
        return any(prefix is not None for prefix in self.prefixes)


@dataclass(frozen=True)
class PackedRows:
    """A padded batch's real tokens as one sequence: `input_ids` and `position_ids` [1, N], the rows' `segments`,
    and `index` [b, T]: the packed position of each padded position (-1 at padding)."""

    input_ids: Tensor
    position_ids: Tensor
    segments: Segments
    index: Tensor

    @property
    def tokens(self) -> int:
        return int(self.input_ids.shape[1])


def pack_batch(batch: Batch, *, share_prompts: bool = False) -> PackedRows:
    """The real tokens of `batch` (attention_mask 1) packed row after row. Each row's real tokens must be one
    contiguous run (what `collate` makes); a row with holes in its mask is refused rather than packed otherwise
    than the padded forward would see it.

    `share_prompts`: rows whose real prompt tokens are the same (a GRPO group: one prompt, several samples) keep
    one copy of the prompt, followed by each row's response as a segment that attends to that copy and then to
    itself. Every token sees exactly the context it sees unshared (same ids, same positions), so the result is
    the unshared forward's to float rounding, and the prompt's tokens run through the decoder once per group
    instead of once per row; in backward the copy collects the gradients of every row that reads it."""
    keep = batch.attention_mask > 0
    if keep.dim() != 2:
        raise ValueError(f"attention_mask must be [rows, tokens], got shape {tuple(keep.shape)}")
    lengths = keep.sum(-1)
    starts = (
        keep.int().diff(dim=-1, prepend=torch.zeros_like(keep[:, :1], dtype=torch.int)).clamp(min=0).sum(-1)
    )
    holes = ((starts > 1) | (lengths == 0)).nonzero().flatten().tolist()
    if holes:
        raise ValueError(
            f"rows {holes[:10]} have no real tokens or gaps in their attention_mask: packing needs each row's "
            "tokens in one run (as collate pads them); pass rl.learner.pack_rows=off for such batches"
        )
    if share_prompts:
        return _pack_shared(batch, keep)
    cu = torch.zeros(len(lengths) + 1, dtype=torch.long)
    cu[1:] = lengths.cpu().cumsum(0)
    bounds = tuple((int(a), int(b)) for a, b in zip(cu[:-1].tolist(), cu[1:].tolist(), strict=True))
    index = keep.flatten().long().cumsum(0).view(keep.shape) - 1
    index = index.masked_fill(~keep, -1)
    segments = Segments(bounds, cu.to(device=keep.device, dtype=torch.int32), int(lengths.max()))
    return PackedRows(batch.input_ids[keep][None], batch.position_ids[keep][None], segments, index)


def prompt_groups(batch: Batch) -> list[list[int]]:
    """The rows of `batch` grouped by their real prompt tokens and their positions (both the same, same group),
    in order of each group's first row; rows ascend within a group. A row without real prompt tokens is a group
    of its own."""
    p = batch.prompt_length
    ids, mask = batch.input_ids[:, :p].cpu(), batch.attention_mask[:, :p].cpu() > 0
    positions = batch.position_ids[:, :p].cpu()
    groups: dict[Any, list[int]] = {}
    for row in range(ids.shape[0]):
        prompt = (tuple(ids[row][mask[row]].tolist()), tuple(positions[row][mask[row]].tolist()))
        groups.setdefault(prompt if prompt[0] else ("row", row), []).append(row)
    return list(groups.values())


def _pack_shared(batch: Batch, keep: Tensor) -> PackedRows:
    """`pack_batch` with one copy of each group's prompt (see there)."""
    p = batch.prompt_length
    device = keep.device
    mask = keep.cpu()
    first = mask.int().argmax(-1).tolist()  # each row's first real column (its run is contiguous)
    last = (mask.shape[1] - mask.flip(-1).int().argmax(-1)).tolist()  # one past its last
    rows_at: list[int] = []  # the (row, column) each packed position reads its id and position from
    cols_at: list[int] = []
    index = torch.full(mask.shape, -1, dtype=torch.long)
    bounds: list[tuple[int, int]] = []
    prefixes: list[tuple[int, int] | None] = []
    longest = 0

    def place(row: int, start: int, stop: int) -> tuple[int, int]:
        at = len(rows_at)
        rows_at.extend([row] * (stop - start))
        cols_at.extend(range(start, stop))
        index[row, start:stop] = torch.arange(at, at + stop - start)
        return at, at + stop - start

    for group in prompt_groups(batch):
        head = group[0]
        prompt_stop = min(max(first[head], p), last[head])  # the prompt's real tokens end at column P
        if len(group) == 1 or prompt_stop == first[head]:
            for row in group:
                bounds.append(place(row, first[row], last[row]))
                prefixes.append(None)
                longest = max(longest, last[row] - first[row])
            continue
        prompt = place(head, first[head], prompt_stop)
        bounds.append(prompt)
        prefixes.append(None)
        for row in group:
            index[row, first[row] : p] = torch.arange(*prompt)
            if last[row] > p:  # a row with a response continues the prompt's copy
                bounds.append(place(row, p, last[row]))
                prefixes.append(prompt)
                longest = max(longest, last[row] - first[row])
        longest = max(longest, prompt[1] - prompt[0])
    at_rows, at_cols = torch.tensor(rows_at), torch.tensor(cols_at)
    cu = torch.tensor([0] + [stop for _, stop in bounds], dtype=torch.int32, device=device)
    segments = Segments(tuple(bounds), cu, longest, tuple(prefixes))
    input_ids = batch.input_ids[at_rows.to(device), at_cols.to(device)][None]
    position_ids = batch.position_ids[at_rows.to(device), at_cols.to(device)][None]
    return PackedRows(input_ids, position_ids, segments, index.to(device))


@contextlib.contextmanager
def packed_forward() -> Iterator[None]:
    """While set, the attention mask the model builds for PACKED_ATTENTION is none: the segments say who sees
    whom (the mask is built once per forward, before the layers; recomputation in backward does not rebuild it)."""
    token = _in_packed_forward.set(True)
    try:
        yield
    finally:
        _in_packed_forward.reset(token)


def packed_hidden_states(decoder: nn.Module, packed: PackedRows) -> Tensor:
    """The decoder's last hidden states [1, N, H] for a packed sequence."""
    with packed_forward():
        return decoder(
            input_ids=packed.input_ids,
            position_ids=packed.position_ids,
            attention_mask=None,
            use_cache=False,
            packed_segments=packed.segments,
        ).last_hidden_state


# ---- the attention ------------------------------------------------------------------------------------------


_VARLEN = {"enabled": True}  # off once the probe found torch's varlen attention failing or inexact here


def _varlen() -> Any:
    """torch's variable-length flash attention, where this torch has it and it has not been switched off."""
    if not _VARLEN["enabled"]:
        return None
    try:
        from torch.nn.attention.varlen import varlen_attn
    except ImportError:
        return None
    return varlen_attn


def _varlen_causal_kwargs(varlen_attn: Any) -> dict[str, Any] | None:
    """How this torch's varlen_attn is asked for causal attention (its signature changed between releases)."""
    parameters = inspect.signature(varlen_attn).parameters
    if "window_size" in parameters:
        return {"window_size": (-1, 0)}
    if "is_causal" in parameters:
        return {"is_causal": True}
    return None


def _segment_attention(
    query: Tensor, key: Tensor, value: Tensor, segments: Segments, scaling, dropout
) -> Tensor:
    """Causal attention within each segment of [1, heads, N, dim] tensors -> [1, N, heads, dim]."""
    groups = query.shape[1] // key.shape[1]
    if segments.shared:
        return _prefixed_segment_attention(query, key, value, segments, scaling, dropout)
    varlen_attn = _varlen() if query.is_cuda and query.dtype in (torch.float16, torch.bfloat16) else None
    causal = _varlen_causal_kwargs(varlen_attn) if varlen_attn is not None else None
    if causal is not None and dropout == 0.0:
        q, k, v = (t[0].transpose(0, 1) for t in (query, key, value))  # [N, heads, dim]
        if groups > 1:
            if "enable_gqa" in inspect.signature(varlen_attn).parameters:
                causal = {**causal, "enable_gqa": True}
            else:
                k, v = (t.repeat_interleave(groups, dim=1) for t in (k, v))
        out = varlen_attn(
            q,
            k,
            v,
            segments.cu_seqlens,
            segments.cu_seqlens,
            segments.max_len,
            segments.max_len,
            scale=scaling,
            **causal,
        )
        return out[None]
    outs = [
        F.scaled_dot_product_attention(
            query[:, :, a:b],
            key[:, :, a:b],
            value[:, :, a:b],
            dropout_p=dropout,
            scale=scaling,
            is_causal=True,
            enable_gqa=groups > 1,
        )
        for a, b in segments.bounds
    ]
    return torch.cat(outs, dim=2).transpose(1, 2).contiguous()


def _prefixed_segment_attention(
    query: Tensor, key: Tensor, value: Tensor, segments: Segments, scaling, dropout
) -> Tensor:
    """Causal attention within each segment, a segment with a prefix also attending to all of its prefix first
    ([1, heads, N, dim] -> [1, N, heads, dim]): SDPA per segment, the prefixed ones with an explicit mask."""
    groups = query.shape[1] // key.shape[1]
    outs = []
    for (a, b), prefix in zip(segments.bounds, segments.prefixes, strict=True):
        if prefix is None:
            k, v, mask, causal = key[:, :, a:b], value[:, :, a:b], None, True
        else:
            pa, pb = prefix
            k = torch.cat([key[:, :, pa:pb], key[:, :, a:b]], dim=2)
            v = torch.cat([value[:, :, pa:pb], value[:, :, a:b]], dim=2)
            own = torch.ones(b - a, b - a, dtype=torch.bool, device=query.device).tril()
            mask = torch.cat([own.new_ones(b - a, pb - pa), own], dim=1)
            causal = False
        outs.append(
            F.scaled_dot_product_attention(
                query[:, :, a:b],
                k,
                v,
                attn_mask=mask,
                dropout_p=dropout,
                scale=scaling,
                is_causal=causal,
                enable_gqa=groups > 1,
            )
        )
    return torch.cat(outs, dim=2).transpose(1, 2).contiguous()


def packed_attention(
    module: nn.Module,
    query: Tensor,
    key: Tensor,
    value: Tensor,
    attention_mask: Tensor | None,
    dropout: float = 0.0,
    scaling: float | None = None,
    **kwargs: Any,
) -> tuple[Tensor, None]:
    """PACKED_ATTENTION: per segment with `packed_segments`, else the model's SDPA attention (see the module
    docstring)."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    segments: Segments | None = kwargs.pop("packed_segments", None)
    if segments is None:
        return sdpa_attention_forward(
            module, query, key, value, attention_mask, dropout=dropout, scaling=scaling, **kwargs
        )
    window = kwargs.get("sliding_window")
    if window is not None and segments.max_len > window:
        raise ValueError(
            f"a packed row of {segments.max_len} tokens is longer than the model's sliding window ({window}): "
            "packing is not exact for it; set pack_rows=off"
        )
    if query.shape[0] != 1:
        raise ValueError(f"a packed forward is one sequence, got a batch of {query.shape[0]}")
    return _segment_attention(query, key, value, segments, scaling, dropout), None


def _packed_mask(*args: Any, **kwargs: Any) -> Tensor | None:
    """PACKED_ATTENTION's mask: none in a packed forward, else SDPA's."""
    if _in_packed_forward.get():
        return None
    from transformers.masking_utils import sdpa_mask

    return sdpa_mask(*args, **kwargs)


def register_packed_attention() -> None:
    """Make PACKED_ATTENTION known to transformers (idempotent)."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface

    AttentionInterface.register(PACKED_ATTENTION, packed_attention)
    AttentionMaskInterface.register(PACKED_ATTENTION, _packed_mask)


# ---- whether to pack ----------------------------------------------------------------------------------------


def packing_refusal(model: nn.Module) -> str | None:
    """Why packing would not be exact for `model` (None: it is). Sets the model's attention to PACKED_ATTENTION
    to find out, and leaves it set when the answer is None (restored otherwise). On CUDA the half-precision path
    (varlen flash attention) is probed too; where it fails or differs, per-row SDPA takes its place, said once."""
    if not getattr(model, "_supports_attention_backend", False):
        return (
            f"{type(model).__name__} does not route its attention through transformers' attention interface"
        )
    windows = sorted({w for m in model.modules() if (w := getattr(m, "sliding_window", None))})
    if windows:
        return f"{type(model).__name__} has sliding-window attention (window {windows[0]})"
    before = model.config._attn_implementation
    register_packed_attention()
    model.set_attn_implementation(PACKED_ATTENTION)
    reason = _probe_reason(model, None)
    device = next(model.parameters()).device
    if reason is None and device.type == "cuda" and _varlen() is not None:
        half = torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16
        varlen = _probe_reason(model, half)
        if varlen is not None:
            _VARLEN["enabled"] = False
            logger.warning(
                "varlen flash attention is not used for packed rows (%s): per-row SDPA instead", varlen
            )
    if reason is not None:
        model.set_attn_implementation(before)
    return reason


def _probe_reason(model: nn.Module, half: torch.dtype | None) -> str | None:
    tolerance = PROBE_TOLERANCE if half is None else HALF_PROBE_TOLERANCE
    try:
        difference = _probe(model, half)
    except (
        Exception
    ) as error:  # any failure of the packed forward is a reason not to pack, said with the error
        return f"the packed forward failed ({type(error).__name__}: {error})"
    if difference <= tolerance:
        return None
    where = "fp32" if half is None else str(half).removeprefix("torch.")
    return f"a packed forward differs from the padded one by {difference:.2e} in {where} (relative; over {tolerance})"


@torch.no_grad()
def _probe(model: nn.Module, half: torch.dtype | None = None) -> float:
    """The largest relative difference of the last hidden states between a padded and a packed forward (the
    model's own device, eval mode; fp32, or `half` autocast) of three rows of different lengths, two of which
    share their prompt: packed without and with the shared prompt, so both are probed."""
    device = next(model.parameters()).device
    vocab = int(model.config.vocab_size)
    generator = torch.Generator().manual_seed(0)
    prompts, responses = (5, 7, 7), (2, 3, 1)
    p, r = max(prompts), max(responses)
    ids = torch.randint(0, min(vocab, 1000), (len(prompts), p + r), generator=generator)
    ids[2, :p] = ids[1, :p]  # rows 1 and 2: one prompt, two responses
    mask = torch.zeros(len(prompts), p + r, dtype=torch.long)
    for row, (m, n) in enumerate(zip(prompts, responses, strict=True)):
        mask[row, p - m : p + n] = 1  # prompts left-padded, responses right-padded, as collate pads them
    positions = (mask.cumsum(-1) - 1).clamp(min=0)
    ones = mask[:, p:].float()
    batch = Batch(ids, mask, positions, ids[:, p:], ones, ones, ones[:, 0], p).to(device)
    decoder = model.get_decoder()
    was_training = decoder.training
    decoder.eval()
    keep = batch.attention_mask > 0
    try:
        with torch.autocast(device.type, dtype=half or torch.bfloat16, enabled=half is not None):
            padded = decoder(
                input_ids=batch.input_ids,
                attention_mask=batch.attention_mask,
                position_ids=batch.position_ids,
                use_cache=False,
            ).last_hidden_state
            reference = padded[keep].float()
            scale = float(reference.abs().max()) or 1.0
            difference = 0.0
            for share in (False, True):
                packed = pack_batch(batch, share_prompts=share)
                flat = packed_hidden_states(decoder, packed)[0]
                found = flat[packed.index[keep]].float()
                difference = max(difference, float((found - reference).abs().max()) / scale)
    finally:
        decoder.train(was_training)
    return difference


def resolve_pack_rows(model: nn.Module, pack_rows: str) -> bool:
    """Whether the learner packs rows for `model`: "off" never; "on" always, refusing a model for which packing
    is not exact; "auto" where it is exact, else padding, said once."""
    if pack_rows not in PACK_ROWS:
        raise ValueError(f"pack_rows must be one of {PACK_ROWS}, got {pack_rows!r}")
    if pack_rows == "off":
        return False
    refusal = packing_refusal(model)
    if refusal is None:
        return True
    if pack_rows == "on":
        raise ValueError(
            f"pack_rows=on, but packing is not exact here: {refusal}. Set pack_rows to auto or off"
        )
    logger.warning("rows are padded, not packed (padding costs FLOPs): %s", refusal)
    return False
