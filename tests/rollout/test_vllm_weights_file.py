"""The driver path's weights file in /dev/shm lives only while the engine loads it (issue 29, item 5)."""

from __future__ import annotations

import concurrent.futures
from pathlib import Path

import pytest
import torch

from stare_agents.rollout.vllm_engine import WEIGHTS_FILE, VLLMEngine


class _FakeLLM:
    """What `update_weights` calls on `vllm.LLM`; records whether the file was there when vLLM loaded it."""

    def __init__(self, fail: bool = False) -> None:
        self.fail = fail
        self.seen: list[bool] = []

    def collective_rpc(self, method: str, args: tuple = (), kwargs: dict | None = None) -> None:
        if method == "reload_weights":
            self.seen.append((Path(kwargs["weights_path"]) / WEIGHTS_FILE).is_file())
            if self.fail:
                raise RuntimeError("the reload failed")

    def reset_prefix_cache(self) -> None:
        pass


def _engine(model_dir: Path, llm: _FakeLLM) -> VLLMEngine:
    """A multiprocess VLLMEngine around a fake `vllm.LLM`, its commands run at once (no driver thread)."""
    engine = object.__new__(VLLMEngine)
    engine.multiprocess, engine.model, engine.llm, engine._extension = True, str(model_dir), llm, True
    engine._weights_dir, engine.weight_version = None, 0

    def command(fn):
        future: concurrent.futures.Future = concurrent.futures.Future()
        try:
            future.set_result(fn())
        except Exception as error:
            future.set_exception(error)
        return future

    engine._command = command
    return engine


@pytest.mark.parametrize("fail", [False, True])
def test_the_weights_file_is_deleted_once_the_engine_loaded_it(tmp_path, fail):
    model_dir = tmp_path / "model"
    model_dir.mkdir()
    (model_dir / "config.json").write_text("{}")
    llm = _FakeLLM(fail=fail)
    engine = _engine(model_dir, llm)
    for _ in range(2):
        if fail:
            with pytest.raises(RuntimeError, match="reload failed"):
                engine.update_weights({"w": torch.ones(4)})
        else:
            engine.update_weights({"w": torch.ones(4)})
        assert not (engine._weights_dir / WEIGHTS_FILE).exists()  # it stayed for the whole run
        assert (engine._weights_dir / "config.json").is_symlink()  # the config files stay for the next sync
    assert llm.seen == [True, True]  # each sync's file was there while vLLM loaded it
    assert engine.weight_version == (0 if fail else 2)
    engine._weights_dir.joinpath("config.json").unlink()
    engine._weights_dir.rmdir()
