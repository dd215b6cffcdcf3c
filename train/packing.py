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
    """Where each row lies in the packed sequence: `bounds` [(start, stop)] in token positions, `cu_seqlens` the
    same as a cumulative int32 tensor [rows + 1] on the device, `max_len` the longest row."""

    bounds: tuple[tuple[int, int], ...]
    cu_seqlens: Tensor
    max_len: int


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


def pack_batch(batch: Batch) -> PackedRows:
    """The real tokens of `batch` (attention_mask 1) packed row after row. Each row's real tokens must be one
    contiguous run (what `collate` makes); a row with holes in its mask is refused rather than packed otherwise
    than the padded forward would see it."""
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
    cu = torch.zeros(len(lengths) + 1, dtype=torch.long)
    cu[1:] = lengths.cpu().cumsum(0)
    bounds = tuple((int(a), int(b)) for a, b in zip(cu[:-1].tolist(), cu[1:].tolist(), strict=True))
    index = keep.flatten().long().cumsum(0).view(keep.shape) - 1
    index = index.masked_fill(~keep, -1)
    segments = Segments(bounds, cu.to(device=keep.device, dtype=torch.int32), int(lengths.max()))
    return PackedRows(batch.input_ids[keep][None], batch.position_ids[keep][None], segments, index)


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
    """The largest relative difference of the last hidden states between a padded and a packed forward of two
    rows of different lengths (the model's own device, eval mode; fp32, or `half` autocast)."""
    device = next(model.parameters()).device
    vocab = int(model.config.vocab_size)
    generator = torch.Generator().manual_seed(0)
    lengths = (5, 11)
    width = max(lengths)
    ids = torch.randint(0, min(vocab, 1000), (len(lengths), width), generator=generator)
    mask = torch.zeros(len(lengths), width, dtype=torch.long)
    for row, n in enumerate(lengths):
        mask[row, width - n :] = 1  # left-padded, as collate pads prompts
    positions = (mask.cumsum(-1) - 1).clamp(min=0)
    ones = mask[:, :1].float()
    batch = Batch(ids, mask, positions, ids[:, :1], ones, ones, ones[:, 0], width).to(device)
    decoder = model.get_decoder()
    was_training = decoder.training
    decoder.eval()
    try:
        with torch.autocast(device.type, dtype=half or torch.bfloat16, enabled=half is not None):
            padded = decoder(
                input_ids=batch.input_ids,
                attention_mask=batch.attention_mask,
                position_ids=batch.position_ids,
                use_cache=False,
            ).last_hidden_state
            flat = packed_hidden_states(decoder, pack_batch(batch))[0]
    finally:
        decoder.train(was_training)
    reference = padded[batch.attention_mask > 0].float()
    scale = float(reference.abs().max()) or 1.0
    return float((flat.float() - reference).abs().max()) / scale


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
