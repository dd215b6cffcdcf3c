"""The learner's "bf16-emulated" precision against real bf16 autocast, and the fp32 LM head."""

from __future__ import annotations

import torch
from learner_support import step_inputs, tiny_model
from torch.nn import functional as F

from stare_agents.train.bf16_emulation import emulated_bf16
from stare_agents.train.policy import PolicyModel


def scaled_model():
    """The tiny Llama with its weights scaled up, so that bf16's rounding shows in the log-probs (logits of
    size ~10-30, as a real LM's are)."""
    model = tiny_model(3)
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() >= 2:
                p.mul_(6.0)
    return model


def scores(
    model, precision: str, *, fp32_head: bool = False, temperature: float = 0.7, pack_rows: str = "auto"
):
    _, batch, _ = step_inputs(4)
    policy = PolicyModel(
        model, precision=precision, fp32_head=fp32_head, temperature=temperature, pack_rows=pack_rows
    )
    with torch.no_grad():
        stats = policy(batch)
    mask = batch.action_mask > 0
    return stats.logprob[mask], stats.entropy[mask]


def test_emulated_linear_is_bit_identical_to_autocast_and_attention_nearly_so():
    torch.manual_seed(0)
    x, w, b = torch.randn(3, 7, 64) * 3, torch.randn(96, 64), torch.randn(96)
    with torch.autocast("cpu", dtype=torch.bfloat16):  # real bf16 kernels: slow without bf16 units, fine here
        real, real_bias = F.linear(x, w), F.linear(x, w, b)
    with emulated_bf16():
        emulated, emulated_bias = F.linear(x, w), F.linear(x, w, b)
    assert emulated.dtype == real.dtype == torch.bfloat16
    # bit-identical on this project's CPUs; bf16 units (AMX, avx512_bf16) sum the fp32 products in another
    # order, which can move a result across a rounding boundary: allow that, one unit in the last place
    for mine, theirs in ((emulated, real), (emulated_bias, real_bias)):
        assert (mine == theirs).float().mean() > 0.99
        assert ((mine.float() - theirs.float()).abs() <= 2.0**-7 * theirs.float().abs()).all()

    q, k, v = torch.randn(2, 4, 30, 16) * 2, torch.randn(2, 4, 30, 16) * 2, torch.randn(2, 4, 30, 16)
    mask = torch.ones(30, 30, dtype=torch.bool).tril()[None, None].expand(2, 1, 30, 30).clone()
    mask[0, :, :, :3] = False  # left padding of the first row
    with torch.autocast("cpu", dtype=torch.bfloat16):
        real = F.scaled_dot_product_attention(q, k, v, attn_mask=mask).float()
    with emulated_bf16():
        emulated = F.scaled_dot_product_attention(q, k, v, attn_mask=mask).float()
    same = (emulated == real)[torch.isfinite(real)].float().mean()
    assert same > 0.95  # the rest by one unit in the last place (the kernel's block order)
    assert (emulated - real).abs().max() <= 2 * 2.0**-8 * real.abs().max()


def test_emulated_bf16_moves_the_log_probs_as_much_as_real_bf16_does():
    """bf16's rounding is chaotic: one unit in the last place early on gives other roundings later, so two bf16
    implementations differ from each other about as much as from fp32. What the emulation must get right is
    the size of the error, and it is a bf16-sized one, not fp32's."""
    model = scaled_model()
    fp32, _ = scores(model, "fp32")
    real, _ = scores(model, "bf16")
    emulated, _ = scores(model, "bf16-emulated")
    distance_real = (real - fp32).abs().mean()
    distance_emulated = (emulated - fp32).abs().mean()
    assert distance_real > 1e-3  # bf16 visibly moves the log-probs of this model
    assert 0.5 < float(distance_emulated / distance_real) < 2.0


def test_fp32_head_takes_the_bf16_bodys_hidden_states_through_an_unrounded_head():
    model = scaled_model()
    _, batch, _ = step_inputs(4)
    mask = batch.action_mask > 0
    p, r = batch.prompt_length, batch.response_length
    for precision, context in (
        ("bf16", torch.autocast("cpu", dtype=torch.bfloat16)),
        ("bf16-emulated", emulated_bf16()),
    ):
        with torch.no_grad(), context:
            hidden = model.model(
                input_ids=batch.input_ids,
                attention_mask=batch.attention_mask,
                position_ids=batch.position_ids,
                use_cache=False,
            ).last_hidden_state
        assert hidden.dtype == torch.float32  # the residual stream stays fp32 under autocast
        rows = hidden[:, p - 1 : p - 1 + r][mask]
        logits = (rows @ model.lm_head.weight.t()) / 0.7  # all fp32
        expected = logits.log_softmax(-1).gather(1, batch.response_ids[mask][:, None]).squeeze(1)
        # rows padded, as the hidden states above (packed rows round differently in bf16: train/packing.py)
        head32, _ = scores(model, precision, fp32_head=True, pack_rows="off")
        rounded, _ = scores(model, precision, pack_rows="off")
        assert torch.allclose(head32, expected, atol=1e-5), precision
        assert not torch.allclose(rounded, expected, atol=1e-5), precision  # the bf16 head rounds
    # in fp32 the option changes nothing
    assert torch.equal(scores(model, "fp32", fp32_head=True)[0], scores(model, "fp32")[0])


def test_emulated_bf16_gradients_follow_real_bf16_ones():
    model = scaled_model()
    _, batch, advantages = step_inputs(4)
    grads = {}
    for precision in ("fp32", "bf16", "bf16-emulated"):
        model.zero_grad(set_to_none=True)
        policy = PolicyModel(model, precision=precision, temperature=0.7)
        stats = policy(batch)
        adv = advantages[:, None].expand_as(stats.logprob)
        (-(stats.logprob * adv).sum()).backward()
        grads[precision] = torch.cat([p.grad.flatten() for p in model.parameters() if p.grad is not None])
    cos = torch.nn.functional.cosine_similarity
    assert cos(grads["bf16-emulated"], grads["bf16"], dim=0) > 0.999
    # and the gradient's bf16 error is bf16-sized: within a factor 2 of the real one's distance from fp32
    error = {k: float((grads[k] - grads["fp32"]).norm()) for k in ("bf16", "bf16-emulated")}
    assert error["bf16"] > 0 and 0.5 < error["bf16-emulated"] / error["bf16"] < 2.0
