"""Code a config can make the trainer import or run needs the acknowledgement of whoever starts the run (issue
51, item 4): `rollout.engine_kwargs.trust_remote_code`, class-path engine options and `rollout.ray_address` in a
config file are refused by name unless STARE_ALLOW_CONFIG_CODE=1 is in the environment, as host execution is
acknowledged by STARE_ALLOW_LOCAL_SANDBOX=1 only."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from stare_agents.train.config import check_run, load_config
from stare_agents.train.config.config_code import ALLOW_CONFIG_CODE_ENV, config_code

# engine_kwargs are set after loading here: checking them against vLLM's EngineArgs at load imports vLLM (a
# minute on a busy 2-core machine); what decides is `config_code`, which reads the loaded config


@pytest.fixture(autouse=True)
def not_acknowledged(monkeypatch) -> None:
    monkeypatch.delenv(ALLOW_CONFIG_CODE_ENV, raising=False)
    monkeypatch.delenv("RAY_ADDRESS", raising=False)


def tiny_with(engine_kwargs: dict, *overrides: str):
    config = load_config(recipe="tiny", overrides=list(overrides))
    config.rollout.engine_kwargs = engine_kwargs
    return config


@pytest.mark.parametrize(
    "engine_kwargs, key",
    [
        ({"trust_remote_code": True}, "rollout.engine_kwargs.trust_remote_code"),
        ({"worker_extension_cls": "evil.Payload"}, "rollout.engine_kwargs.worker_extension_cls"),
        ({"worker_cls": "auto"}, "rollout.engine_kwargs.worker_cls"),  # a class-path key, whatever its value
        ({"logits_processors": ["pkg.mod:Proc"]}, "rollout.engine_kwargs.logits_processors"),
        ({"reasoning_parser_plugin": "/tmp/parser.py"}, "rollout.engine_kwargs.reasoning_parser_plugin"),
        (
            {"distributed_executor_backend": "pkg.exec.Backend"},
            "rollout.engine_kwargs.distributed_executor_backend",
        ),
        (  # a class path anywhere in a nested option
            {"compilation_config": {"pass_config": {"custom": ["my_passes.Fuse"]}}},
            "rollout.engine_kwargs.compilation_config.pass_config.custom[0]",
        ),
        ({"hf_overrides": {"loader": "plugin.py"}}, "rollout.engine_kwargs.hf_overrides.loader"),
    ],
)
def test_engine_options_that_name_code_are_refused_unless_acknowledged(
    engine_kwargs, key, monkeypatch
) -> None:
    config = tiny_with(engine_kwargs)
    assert [c.key for c in config_code(config)] == [key]
    with pytest.raises(ValueError, match="makes the trainer import or run code") as error:
        check_run(config)
    said = str(error.value)
    assert key in said and f"{ALLOW_CONFIG_CODE_ENV}=1" in said and "remove the keys" in said
    monkeypatch.setenv(ALLOW_CONFIG_CODE_ENV, "1")
    check_run(config)  # acknowledged: the other checks go on


def test_engine_options_that_name_no_code_need_nothing() -> None:
    harmless = {
        "trust_remote_code": False,
        "enable_chunked_prefill": True,
        "kv_cache_dtype": "auto",
        "distributed_executor_backend": "mp",
        "served_model_name": "qwen2.5-7b",
        "hf_overrides": {"architectures": ["Qwen2ForCausalLM"], "rope_theta": 1e6},
        "tokenizer": "Qwen/Qwen2.5-7B-Instruct",
        "worker_cls": "",
    }
    assert config_code(tiny_with(harmless)) == []
    for address in (None, "local", "auto"):
        config = load_config(recipe="tiny", overrides=[f"rollout.ray_address={address or 'null'}"])
        assert config_code(config) == []


def test_a_ray_address_from_a_config_file_is_refused_with_the_variable_to_use(tmp_path, monkeypatch) -> None:
    """Attaching runs the cluster's code in the trainer (Ray unpickles its results): a config file naming one is
    refused before any work, with RAY_ADDRESS (the starter's own setting) as the remedy; nothing is written."""
    from stare_agents.cli import app

    recipe = yaml.safe_load((Path(__file__).parents[2] / "train" / "recipes" / "tiny.yaml").read_text())
    recipe["rollout"]["ray_address"] = "10.9.8.7:6379"
    recipe["out_dir"] = str(tmp_path / "run")
    shared = tmp_path / "shared.yaml"
    shared.write_text(yaml.safe_dump(recipe))
    result = CliRunner().invoke(app, ["train", "--config", str(shared)])
    assert result.exit_code == 2, result.output
    said = " ".join(result.output.split())
    assert "rollout.ray_address='10.9.8.7:6379' runs a Ray cluster's tasks" in said
    assert "give the cluster as RAY_ADDRESS=10.9.8.7:6379 instead of the key" in said
    assert f"{ALLOW_CONFIG_CODE_ENV}=1" in said
    assert not (tmp_path / "run").exists()
    config = load_config(path=shared)
    monkeypatch.setenv(ALLOW_CONFIG_CODE_ENV, "yes")
    check_run(config)
    monkeypatch.setenv(ALLOW_CONFIG_CODE_ENV, "0")  # anything but 1/true/yes acknowledges nothing
    with pytest.raises(ValueError, match=r"rollout\.ray_address"):
        check_run(config)
