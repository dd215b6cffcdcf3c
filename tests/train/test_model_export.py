"""No full copy of the model in the trainer (issue 50, item 5): the SFT and final models of a data-parallel learner
are written from the workers' own shards a few tensors at a time (`stare_agents.sharded_export`), and only rank 0
reads the model folder when the workers start (the others get its weights by broadcast). Tested with two learners
on gloo; the export against the weights gathered the old way, exactly."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from learner_support import step_inputs

from stare_agents.models import prepare_model
from stare_agents.sharded_export import export_shards, shard_tensors
from stare_agents.train.policy import load_causal_lm


def write_policy_shards(model: torch.nn.Module, folder: Path) -> None:
    """A model's weights as the learner's shards hold them (the policy wrapper's keys, under "model")."""
    import torch.distributed.checkpoint as dcp

    dcp.save(
        {"model": {f"model.{k}": v for k, v in model.state_dict().items()}},
        checkpoint_id=str(folder),
        no_dist=True,
    )


@pytest.fixture(scope="module")
def models(tmp_path_factory) -> dict[str, Path]:
    """The tiny model (its own LM head) and a tied twin (the head is the embedding), each with its tokenizer."""
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    folder = tmp_path_factory.mktemp("export-models")
    untied = prepare_model("tiny", out=folder / "untied")
    config = AutoConfig.from_pretrained(untied)
    config.tie_word_embeddings = True
    torch.manual_seed(1)
    AutoModelForCausalLM.from_config(config).save_pretrained(folder / "tied")
    AutoTokenizer.from_pretrained(untied).save_pretrained(folder / "tied")
    return {"untied": untied, "tied": folder / "tied"}


@pytest.mark.parametrize("kind", ["untied", "tied"])
def test_a_model_folder_is_written_from_shards_a_few_tensors_at_a_time(models, kind, tmp_path, monkeypatch):
    source = models[kind]
    model = load_causal_lm(source)
    with torch.no_grad():
        for p in model.parameters():  # trained weights, not the folder's
            p.add_(0.01)
    write_policy_shards(model, tmp_path / "shards")
    # a bound of 200 kB a file: many files, and never more than one file's tensors loaded at once
    import torch.distributed.checkpoint as dcp

    largest, load = [0], dcp.load
    monkeypatch.setattr(
        dcp,
        "load",
        lambda state, **kw: (
            largest.append(sum(t.numel() * 4 for t in state["model"].values())) or load(state, **kw)
        ),
    )
    out = export_shards(
        tmp_path / "shards", tokenizer_dir=source, out=tmp_path / "out", max_file_bytes=200_000
    )
    files = sorted(p.name for p in out.glob("*.safetensors"))
    index = json.loads((out / "model.safetensors.index.json").read_text())
    assert len(files) > 3 and set(index["weight_map"].values()) == set(files)
    biggest_tensor = max(t.numel() * 4 for t in model.state_dict().values())
    assert max(largest) <= max(200_000, biggest_tensor)
    assert ("lm_head.weight" in index["weight_map"]) is (
        kind == "untied"
    )  # a tied head is stored once, as HF does
    loaded = load_causal_lm(out)
    expected = model.state_dict()
    assert loaded.state_dict().keys() == expected.keys()
    assert all(torch.equal(loaded.state_dict()[k], expected[k]) for k in expected)
    assert json.loads((out / "config.json").read_text())["dtype"] == "float32"
    assert (out / "tokenizer_config.json").is_file() and not list(tmp_path.glob(".out.tmp-*"))
    # one file when everything fits, as save_pretrained writes it
    single = export_shards(tmp_path / "shards", tokenizer_dir=source, out=tmp_path / "one")
    assert sorted(p.name for p in single.glob("*.safetensors")) == ["model.safetensors"]


def test_shards_without_a_policy_are_refused(tmp_path):
    import torch.distributed.checkpoint as dcp

    dcp.save({"optimizer": {"step": torch.zeros(1)}}, checkpoint_id=str(tmp_path / "shards"), no_dist=True)
    with pytest.raises(ValueError, match="holds no policy weights"):
        shard_tensors(tmp_path / "shards")


@pytest.fixture(scope="module")
def ray_cluster(local_ray):
    """The suite's shared local Ray (tests/conftest.py)."""
    return local_ray


@pytest.mark.ray
@pytest.mark.slow
@pytest.mark.parametrize("fsdp", [False, True])
def test_two_gloo_learners_export_their_model_from_their_own_shards(ray_cluster, models, tmp_path, fsdp):
    """Rank 1 starts from rank 0's weights without reading the folder; after a step, the exported folder holds
    exactly the weights the group holds (gathered here the old way to compare), and the shards beside it are gone."""
    from stare_agents.algo import AlgorithmConfig
    from stare_agents.train.distributed import DistributedConfig, LearnerGroup
    from stare_agents.train.learner import LearnerConfig
    from stare_agents.train.model_export import save_trained_model
    from stare_agents.train.policy import OptimizerConfig

    source = models["tied"]
    config = LearnerConfig(optimizer=OptimizerConfig(lr=1e-3, eps=1e-5), micro_batch_tokens=100)
    group = LearnerGroup(
        source, AlgorithmConfig.preset("grpo"), config, DistributedConfig(num_workers=2, fsdp=fsdp)
    )
    try:
        start = group.model_state_dict()
        folder = load_causal_lm(source).state_dict()
        assert all(torch.equal(start[k], folder[k]) for k in folder)  # rank 0's weights, on every rank
        _, batch, advantages = step_inputs(7, groups=2)
        group.step(batch, advantages)
        out = save_trained_model(group, source, tmp_path / "final_model")
        trained = group.model_state_dict()
    finally:
        group.close()
    exported = load_causal_lm(out).state_dict()
    assert exported.keys() == trained.keys()
    assert all(torch.equal(exported[k], trained[k]) for k in trained)
    assert any(not torch.equal(trained[k], folder[k]) for k in trained)  # the step's weights, not the start's
    assert sorted(p.name for p in tmp_path.iterdir()) == ["final_model"]
