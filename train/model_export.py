"""A data-parallel learner's model without full copies: each rank starts from rank 0's weights without reading
them itself, and the trained policy is exported from the ranks' own shards.

- `empty_causal_lm` + `replicate_from_rank0`: only rank 0 reads the model folder; the other ranks build the
  architecture without weights (on the meta device, then uninitialised memory on their device) and receive every
  parameter and buffer from rank 0. Eight ranks of a node no longer each read a 7B model in float32 (30 GB) from
  shared storage into their CPU memory before sharding it.
- `save_trained_model`: the SFT model and the final model as Hugging Face folders. A data-parallel group's workers
  write the policy's weights as their own shards beside the folder (`save_model_shards`, torch.distributed.checkpoint)
  and the trainer writes the folder from them a few tensors at a time (`stare_agents.sharded_export`): the trainer
  never holds the whole model and nothing of it passes through Ray's object store (before: ~30 GB in the object
  store and ~60 GB of the trainer's memory for 7B, on the head node). One learner in the trainer's process saves its
  model as before.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from stare_agents.sharded_export import export_shards
from stare_agents.train.checkpoint import missing_shards, unshared_shards


def save_hf_model(model: Any, tokenizer_dir: Path, out: Path) -> Path:
    """Save a model (and the tokenizer of `tokenizer_dir`) as a Hugging Face folder, atomically."""
    from transformers import AutoTokenizer

    tmp = out.with_name(out.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    model.save_pretrained(tmp, safe_serialization=True)
    AutoTokenizer.from_pretrained(tokenizer_dir).save_pretrained(tmp)
    shutil.rmtree(out, ignore_errors=True)
    tmp.rename(out)
    return out


def empty_causal_lm(path: str | Path, device: str | torch.device) -> nn.Module:
    """The Hugging Face causal LM of `path` (float32) with uninitialised weights on `device`: its config only is
    read. Tied weights are tied again; every parameter and buffer must then be filled (`replicate_from_rank0`)."""
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.from_pretrained(path)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.to_empty(device=device)
    model.tie_weights()
    return model


def model_tensors(model: nn.Module) -> list[tuple[str, torch.Tensor]]:
    """Every tensor a replica must hold, in an order all ranks share: the parameters (a tied one once), then the
    buffers (rotary frequencies among them, which no state dict holds)."""
    return [*model.named_parameters(), *model.named_buffers()]


def replicate_from_rank0(model: nn.Module) -> None:
    """Every parameter and buffer of `model` broadcast from rank 0 of the default process group, after checking
    that every rank holds the same tensors (names and shapes)."""
    layout = [(name, tuple(t.shape)) for name, t in model_tensors(model)]
    layouts: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(layouts, layout)
    if any(other != layout for other in layouts):
        raise RuntimeError(
            "the learner ranks built different models (parameter and buffer names or shapes differ)"
        )
    with torch.no_grad():
        for _, tensor in model_tensors(model):
            dist.broadcast(tensor, src=0)
    for module in model.modules():  # Hugging Face's rotary embeddings keep their first frequencies aside too
        if hasattr(module, "original_inv_freq") and isinstance(
            getattr(module, "inv_freq", None), torch.Tensor
        ):
            module.original_inv_freq = module.inv_freq


def rank_model(model_dir: str | Path, device: str | torch.device, rank: int) -> nn.Module:
    """This rank's starting model, rank 0's weights everywhere (the caller has joined the process group)."""
    from stare_agents.train.policy import load_causal_lm

    model = load_causal_lm(model_dir, device) if rank == 0 else empty_causal_lm(model_dir, device)
    replicate_from_rank0(model)
    return model


def save_model_shards(policy: nn.Module, folder: str | Path) -> None:
    """The policy's weights as this worker holds them (its FSDP shards; a replica's are written once), without the
    optimiser, with torch.distributed.checkpoint: every rank of the group calls it."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_model_state_dict

    dcp.save({"model": get_model_state_dict(policy)}, checkpoint_id=str(folder))


def export_from_workers(workers: list[Any], tokenizer_dir: Path, out: Path) -> Path:
    """The Hugging Face folder `out` from a data-parallel group's Ray workers: each writes its shards of the policy
    (`save_model_shards`) to a folder beside `out` (storage every worker reaches: the run folder), which must then
    hold every rank's file here, and the folder is written from them (`export_shards`) and removed."""
    import ray

    shards = out.with_name(f".{out.name}.shards")
    shutil.rmtree(shards, ignore_errors=True)
    try:
        ray.get([worker.save_model_shards.remote(str(shards)) for worker in workers])
        missing = missing_shards(shards, len(workers))
        if missing:
            raise RuntimeError(unshared_shards(f"the export of {out}", shards, len(workers), missing))
        return export_shards(shards, tokenizer_dir=tokenizer_dir, out=out)
    finally:
        shutil.rmtree(shards, ignore_errors=True)


def save_trained_model(trained: Any, tokenizer_dir: Path, out: Path) -> Path:
    """The trained policy (a learner or SFT, one process's or a data-parallel group's) as the Hugging Face folder
    `out`, with the tokenizer of `tokenizer_dir`: a group's from its workers' shards (`export_model`)."""
    export = getattr(trained, "export_model", None)
    if export is not None:
        return export(tokenizer_dir, out)
    return save_hf_model(trained.hf_model(tokenizer_dir), tokenizer_dir, out)
