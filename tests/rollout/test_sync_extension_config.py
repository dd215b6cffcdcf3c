"""The vLLM worker extension loads synced weights inside vLLM's config context (issue 29, item 6)."""

from __future__ import annotations

import pytest
import torch

from stare_agents.rollout.weight_sync import VLLMSyncExtension

vllm_config_module = pytest.importorskip("vllm.config")


class _Runner:
    """A model runner whose load (and the tied head's repacking) reads vLLM's current config, as custom ops
    and quantization methods do."""

    def __init__(self, model: torch.nn.Module) -> None:
        self.model, self.seen = model, []

    def reload_weights(self, weights_iterator, is_checkpoint_format: bool) -> None:
        self.seen.append(("reload", vllm_config_module.get_current_vllm_config()))
        for _ in weights_iterator:
            pass

    def get_model(self) -> torch.nn.Module:
        return self.model


class _Receiver:
    def weights(self, plan):
        return iter([(name, torch.zeros(1)) for name in plan["names"]])


def _tied_model(runner_seen: list) -> torch.nn.Module:
    class Method:
        def process_weights_after_loading(self, layer) -> None:
            runner_seen.append(("head", vllm_config_module.get_current_vllm_config()))

    model = torch.nn.Module()
    model.model = torch.nn.Module()
    model.model.embed_tokens = torch.nn.Embedding(4, 2)
    model.lm_head = torch.nn.Module()
    model.lm_head.weight = model.model.embed_tokens.weight
    model.lm_head.quant_method = Method()
    return model


class _Worker(VLLMSyncExtension):
    """vLLM's worker as far as the extension sees it: its config, its model runner, its sync receiver."""

    def __init__(self) -> None:
        self.vllm_config = object()  # the worker's VllmConfig; only its identity matters here
        self.model_runner = _Runner(None)
        self.model_runner.model = _tied_model(self.model_runner.seen)
        self._stare_receiver = _Receiver()


def test_a_synced_reload_and_the_tied_heads_repacking_run_with_the_workers_vllm_config():
    worker = _Worker()
    assert worker.stare_sync_receive({"names": ["a", "b"], "version": 3}) == 2
    assert worker.model_runner.seen == [("reload", worker.vllm_config), ("head", worker.vllm_config)]
    assert worker.stare_refresh_tied_head()  # the driver path calls it alone, after vLLM's own reload
    assert worker.model_runner.seen[-1] == ("head", worker.vllm_config)
    assert vllm_config_module.get_current_vllm_config_or_none() is None  # set only while loading
