"""A Hugging Face model folder written from a data-parallel learner's shards, a few tensors at a time.

The learner workers write the policy's weights with torch.distributed.checkpoint (each rank its own file, on storage
every node reaches: a checkpoint's `learner_shards/`, or the shards written for an export); this reads them back in
one process without a process group, in groups of at most `max_file_bytes`, and writes each group as one
safetensors file of the model folder. No process ever holds the whole model: a 7B policy in float32 (30 GB) is
written with about 2 GB in memory, instead of being gathered into the trainer (and through Ray's object store).

    export_shards(run / "checkpoints/step-00000050/learner_shards", tokenizer_dir=base_model, out=run / "export")

The folder is what `save_pretrained` writes for the same weights: `model.safetensors`, or
`model-0000i-of-0000n.safetensors` files with `model.safetensors.index.json`; the weights in the dtype they were
trained in (float32: the learner's master weights), the embedding's tied head left out as Hugging Face does;
`config.json` (its dtype that of the weights), the generation config and the tokenizer of `tokenizer_dir`. It is
written to a temporary folder and renamed: a killed export leaves no partial model under the name.
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

# the learner's shards: {"model": <the policy wrapper's state>} and the wrapper keeps the Hugging Face model as
# `.model`, so a weight `model.layers.0.mlp.up_proj.weight` is stored as `model.model.model.layers.0...`
POLICY_PREFIX = "model.model."
MAX_FILE_BYTES = 2 * 2**30


def shard_tensors(shards: str | Path) -> dict[str, Any]:
    """The policy's weights in a shards folder: {Hugging Face name: DCP's metadata of it (size, dtype)}."""
    from torch.distributed.checkpoint import FileSystemReader
    from torch.distributed.checkpoint.metadata import TensorStorageMetadata

    metadata = FileSystemReader(str(shards)).read_metadata()
    found = {
        key.removeprefix(POLICY_PREFIX): item
        for key, item in metadata.state_dict_metadata.items()
        if key.startswith(POLICY_PREFIX) and isinstance(item, TensorStorageMetadata)
    }
    if not found:
        raise ValueError(f"{shards} holds no policy weights (no key starting with {POLICY_PREFIX!r})")
    return found


def _groups(tensors: dict[str, Any], max_file_bytes: int) -> Iterator[list[str]]:
    """The names in order, in groups of at most `max_file_bytes` (a larger tensor is a group of its own)."""
    group: list[str] = []
    size = 0
    for name, item in tensors.items():
        nbytes = item.size.numel() * item.properties.dtype.itemsize
        if group and size + nbytes > max_file_bytes:
            yield group
            group, size = [], 0
        group.append(name)
        size += nbytes
    if group:
        yield group


def export_shards(
    shards: str | Path, *, tokenizer_dir: str | Path, out: str | Path, max_file_bytes: int = MAX_FILE_BYTES
) -> Path:
    """Write the Hugging Face model folder `out` from the policy weights in `shards` (see the module docstring),
    with the config, generation config and tokenizer of `tokenizer_dir`. Returns `out`."""
    import torch
    import torch.distributed.checkpoint as dcp
    from safetensors.torch import save_file
    from transformers import AutoConfig, AutoTokenizer

    out = Path(out)
    config = AutoConfig.from_pretrained(tokenizer_dir)
    tensors = shard_tensors(shards)
    if getattr(config, "tie_word_embeddings", False):
        tensors.pop("lm_head.weight", None)  # the head is the embedding: Hugging Face stores it once
    names = sorted(tensors)
    dtypes = {tensors[name].properties.dtype for name in names}
    tmp = out.with_name(f".{out.name}.tmp-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    try:
        groups = list(_groups({name: tensors[name] for name in names}, max_file_bytes))
        files = (
            ["model.safetensors"]
            if len(groups) == 1
            else [f"model-{i + 1:05d}-of-{len(groups):05d}.safetensors" for i in range(len(groups))]
        )
        weight_map: dict[str, str] = {}
        total = 0
        for group, file in zip(groups, files, strict=True):
            part = {
                name: torch.empty(tuple(tensors[name].size), dtype=tensors[name].properties.dtype)
                for name in group
            }
            # only these keys are read from the shards (a plain tensor each: DCP joins a sharded one)
            dcp.load(
                {"model": {f"model.{name}": t for name, t in part.items()}},
                checkpoint_id=str(shards),
                no_dist=True,
            )
            save_file(
                {name: t.contiguous() for name, t in part.items()}, str(tmp / file), metadata={"format": "pt"}
            )
            weight_map.update(dict.fromkeys(group, file))
            total += sum(t.numel() * t.element_size() for t in part.values())
            del part
        if len(groups) > 1:
            index = {"metadata": {"total_size": total}, "weight_map": weight_map}
            (tmp / "model.safetensors.index.json").write_text(
                json.dumps(index, indent=2, sort_keys=True) + "\n"
            )
        if len(dtypes) == 1:  # the dtype loaders take as the checkpoint's ("auto")
            config.dtype = next(iter(dtypes))
        config.save_pretrained(tmp)
        generation = Path(tokenizer_dir) / "generation_config.json"
        if generation.is_file():
            shutil.copy2(generation, tmp / generation.name)
        AutoTokenizer.from_pretrained(tokenizer_dir).save_pretrained(tmp)
        shutil.rmtree(out, ignore_errors=True)
        os.replace(tmp, out)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return out
