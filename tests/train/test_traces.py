"""SFT traces: solver traces verified by the real environment and laid out like rollouts; conversation files."""

from __future__ import annotations

import json

import pytest
from transformers import AutoTokenizer

from stare_agents.envs.arithmetic import ALL_KINDS
from stare_agents.models import prepare_model
from stare_agents.sandbox import LocalSandbox
from stare_agents.train.traces import conversation_traces, solver_traces


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory):
    return AutoTokenizer.from_pretrained(prepare_model("tiny", out=tmp_path_factory.mktemp("m") / "tiny"))


def encode(tokenizer, text):
    return tokenizer(text, add_special_tokens=False)["input_ids"]


def test_solver_traces_are_correct_for_every_task_kind_and_shaped_like_rollouts(tokenizer):
    eos = {tokenizer.eos_token_id}
    with LocalSandbox(2, allow_host_execution=True) as sandbox:
        traces = {
            kind: solver_traces(
                "stare_agents/ArithmeticTIR-v0",
                [7],
                tokenizer,
                eos,
                env_kwargs={"kinds": [kind]},
                sandbox=sandbox,
            )
            for kind in ALL_KINDS
        }
    for kind, [trace] in traces.items():
        assert trace.reward == 1.0 and trace.correct, kind
        code, answer = trace.turns[0].text, trace.turns[1].text
        assert code.startswith("```python\n") and code.endswith("\n```") and "\\boxed{" in answer
        code_ids = encode(tokenizer, code)
        inserted = trace.turns[0].observation_tokens
        assert trace.response_ids[: len(code_ids)] == code_ids
        assert trace.action_mask == [1] * len(code_ids) + [0] * inserted + [1] * (trace.turns[1].num_tokens)
        assert trace.response_ids[-1] == tokenizer.eos_token_id  # the model learns to end its answer
        assert trace.turns[0].observation.startswith("<|im_end|>\n<|im_start|>tool\n")
    with pytest.raises(ValueError, match="no solver"):
        solver_traces("stare_agents/MathTIR-v0", [0], tokenizer, eos)


def test_conversation_traces_learn_only_the_assistant(tokenizer, tmp_path):
    path = tmp_path / "traces.jsonl"
    conversation = [
        {"role": "user", "content": "What is 2 + 2?"},
        {"role": "assistant", "content": "```python\nprint(2 + 2)\n```"},
        {"role": "tool", "content": "4"},
        {"role": "assistant", "content": "\\boxed{4}"},
    ]
    path.write_text(json.dumps({"messages": conversation}) + "\n\n")
    [trace] = conversation_traces(path, tokenizer, {tokenizer.eos_token_id})
    rendered = tokenizer.apply_chat_template(conversation, tokenize=False)
    assert trace.prompt_ids + trace.response_ids + encode(tokenizer, "\n") == encode(tokenizer, rendered)
    learned = [i for i, bit in zip(trace.response_ids, trace.action_mask, strict=True) if bit]
    assert learned == encode(tokenizer, "```python\nprint(2 + 2)\n```") + encode(tokenizer, "\\boxed{4}") + [
        tokenizer.eos_token_id
    ]
    path.write_text('{"messages": [{"role": "user", "content": "no answer"}]}\n')
    with pytest.raises(ValueError, match=r"traces\.jsonl:1"):
        conversation_traces(path, tokenizer, {tokenizer.eos_token_id})


def test_assistant_turns_end_with_the_templates_end_of_turn_token_not_the_smallest_eos_id(
    tokenizer, tmp_path
):
    """Qwen2.5-Instruct lists <|endoftext|> (the smaller id) and <|im_end|> as end-of-sequence ids; its template
    closes turns with <|im_end|>, which is what the rollout samples and what SFT must teach."""
    qwen_like = AutoTokenizer.from_pretrained(tokenizer.name_or_path)
    qwen_like.eos_token = "<|endoftext|>"
    eos_ids = {
        qwen_like.convert_tokens_to_ids("<|endoftext|>"),
        qwen_like.convert_tokens_to_ids("<|im_end|>"),
    }
    assert min(eos_ids) == qwen_like.convert_tokens_to_ids("<|endoftext|>")  # what SFT used to append
    path = tmp_path / "traces.jsonl"
    conversation = [{"role": "user", "content": "2 + 2?"}, {"role": "assistant", "content": "\\boxed{4}"}]
    path.write_text(json.dumps({"messages": conversation}) + "\n")
    [trace] = conversation_traces(path, qwen_like, eos_ids)
    assert trace.response_ids == [
        *encode(qwen_like, "\\boxed{4}"),
        qwen_like.convert_tokens_to_ids("<|im_end|>"),
    ]
