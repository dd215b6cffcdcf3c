"""bf16 autocast's numerics at fp32 speed, for measuring on CPUs that have no bf16 units.

On a CPU without avx512_bf16 or AMX, torch's bf16 matrix products run ~100x slower than fp32, so a bf16
learner cannot be studied there. The learner's precision "bf16-emulated" runs its decoder inside
`emulated_bf16()`: the layers CPU autocast runs in bf16 (linear, scaled-dot-product attention) instead round
their operands to bf16, multiply in fp32 (as bf16 hardware accumulates: a product of two bf16 numbers is exact
in fp32) and return a bf16 tensor, so the ops after them see the dtypes autocast gives them; linear's backward
rounds its gradient operands and results to bf16 as autocast's bf16 backward does. The LM head rounds the
same way (`round_bf16_product`) unless it is kept in fp32. What differs from the hardware: the order of the
fp32 accumulation, and attention's backward, which stays fp32. tests/train/test_bf16_emulation.py holds it
against real bf16 autocast on small tensors.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch
from torch import Tensor
from torch.nn import functional as F
from torch.overrides import TorchFunctionMode

_BF16 = torch.bfloat16


def _round(x: Tensor) -> Tensor:
    """x rounded to bf16 (round to nearest even), held in fp32."""
    return x.to(_BF16).to(torch.float32)


class _Bf16Linear(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x: Tensor, weight: Tensor, bias: Tensor | None) -> Tensor:
        xr, wr = _round(x), _round(weight)
        ctx.save_for_backward(xr, wr)
        ctx.dtypes = (x.dtype, weight.dtype, bias.dtype if bias is not None else None)
        out = xr @ wr.t()
        if bias is not None:
            out = out + _round(bias)
        return out.to(_BF16)

    @staticmethod
    def backward(ctx, grad: Tensor):
        xr, wr = ctx.saved_tensors
        x_dtype, w_dtype, b_dtype = ctx.dtypes
        g = _round(grad)
        grad_x = (g @ wr).to(_BF16).to(x_dtype)
        flat_g, flat_x = g.reshape(-1, g.shape[-1]), xr.reshape(-1, xr.shape[-1])
        grad_w = (flat_g.t() @ flat_x).to(_BF16).to(w_dtype)
        grad_b = flat_g.sum(0).to(_BF16).to(b_dtype) if b_dtype is not None else None
        return grad_x, grad_w, grad_b


def round_bf16_product(a: Tensor, b: Tensor) -> Tensor:
    """a @ b as a bf16 matrix product computes it (bf16 operands, fp32 accumulation, a bf16 result), in fp32."""
    return _round(_round(a) @ _round(b))


class _EmulatedBf16(TorchFunctionMode):
    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is F.linear:
            x, weight = args[0], args[1]
            bias = args[2] if len(args) > 2 else kwargs.get("bias")
            return _Bf16Linear.apply(x, weight, bias)
        if func is F.scaled_dot_product_attention:
            return _attention(*args, **kwargs)
        return func(*args, **kwargs)


def _attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    attn_mask: Tensor | None = None,
    dropout_p: float = 0.0,
    is_causal: bool = False,
    scale: float | None = None,
    enable_gqa: bool = False,
) -> Tensor:
    """Scaled-dot-product attention as CPU bf16 flash attention rounds it: bf16 q, k, v; scores and the
    softmax's running max in fp32; exp(s - max) rounded to bf16 before it multiplies v; the sum and the
    division in fp32; a bf16 result. (On 30-token rows this matched torch's bf16 kernel on 98.6% of outputs,
    the rest by one unit in the last place.)"""
    if dropout_p:
        raise ValueError("emulated bf16 attention has no dropout (the learner runs without it)")
    q, k, v = _round(q), _round(k), _round(v)
    if enable_gqa and k.shape[-3] != q.shape[-3]:
        k = k.repeat_interleave(q.shape[-3] // k.shape[-3], dim=-3)
        v = v.repeat_interleave(q.shape[-3] // v.shape[-3], dim=-3)
    scores = (q @ k.transpose(-2, -1)) * (scale if scale is not None else q.shape[-1] ** -0.5)
    if is_causal:
        length, source = scores.shape[-2:]
        causal = torch.ones(length, source, dtype=torch.bool, device=q.device).tril(source - length)
        scores = scores.masked_fill(~causal, float("-inf"))
    if attn_mask is not None:
        scores = (
            scores.masked_fill(~attn_mask, float("-inf"))
            if attn_mask.dtype == torch.bool
            else scores + attn_mask.float()
        )
    peak = scores.amax(-1, keepdim=True)
    peak = torch.where(torch.isfinite(peak), peak, 0.0)  # a row with every position masked
    weights = torch.exp(scores - peak)
    total = weights.sum(-1, keepdim=True).clamp(min=torch.finfo(torch.float32).tiny)
    return ((_round(weights) @ v) / total).to(_BF16)


@contextmanager
def emulated_bf16() -> Iterator[None]:
    """Run the model's forward (and backward) with bf16 autocast's rounding, computed in fp32."""
    with _EmulatedBf16():
        yield
