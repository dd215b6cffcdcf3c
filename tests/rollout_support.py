"""Helpers of the rollout tests (and the evaluation tests that reuse them): the tiny "tool caller" model,
weight loading into a running engine, and reference log-probabilities from a plain transformers forward.

The tool caller is the tiny random model fine-tuned for a few seconds on one chat-template conversation: for
any question it answers with a ```python block that prints 6 * 7 and, once the tool's output is back, with
\\boxed{42}. Greedy decoding reproduces that conversation, which gives the agent-loop tests a real model with
predictable multi-turn behaviour.
"""

from __future__ import annotations

from pathlib import Path

import torch

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
