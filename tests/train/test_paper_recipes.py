"""The CoT recipes hold the official STARE settings (issue 29, deliverable 5: the official short-CoT script
recipe/STARE/scripts/run_short_cot_qwen2.5_math_7b_STARE.sh), and DAPO-Math-17k converts into rows the math
environments read."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from stare_agents.cli import app
from stare_agents.envs.tasks import TaskDataset
from stare_agents.train.config import check_run, load_config


def test_short_cot_is_the_official_script():
    c = load_config(recipe="short-cot-qwen2.5-math-7b")
    assert c.model.name == "Qwen/Qwen2.5-Math-7B" and c.model.max_model_len == 1024 + 3072
    assert (c.rl.prompts_per_step, c.rl.samples_per_prompt) == (64, 8)  # train_prompt_bsz, n
    assert c.rollout.max_total_tokens == c.rollout.max_tokens_per_turn == 3072  # max_response_length
    assert (c.rl.sampling_rounds, c.rl.sampling_batch_factor) == (
        10,
        3,
    )  # max_num_gen_batches, gen_batch_size
    learner = c.rl.learner
    assert (learner.optimizer.lr, learner.optimizer.max_grad_norm, learner.mini_batches) == (1e-6, 1.0, 1)
    assert (learner.micro_batch_packing, learner.micro_batch_tokens) == ("verl", (1024 + 3072) * 2)
    assert c.rollout.gpu_memory_utilization == 0.6 and c.rollout.temperature == 1.0
    assert (c.eval.every, c.checkpoint.every) == (10, 10)  # test_freq, save_freq
    assert c.env.kwargs["dataset"].endswith("data/dapo_math_17k.jsonl")
    stare = c.algorithm().stare
    assert (stare.variant, stare.top_ratio, stare.w, stare.target_entropy) == ("O1", 0.1, 1.1, 0.3)


@pytest.mark.parametrize(
    ("recipe", "model"),
    [
        ("long-cot-r1-distill-qwen-1.5b", "deepseek-ai/DeepSeek-R1-Distill-Qwen-1.5B"),
        ("long-cot-qwen3-8b", "Qwen/Qwen3-8B"),
    ],
)
def test_long_cot_trains_the_papers_models_with_the_short_scripts_settings(recipe, model):
    c = load_config(recipe=recipe)
    short = load_config(recipe="short-cot-qwen2.5-math-7b")
    assert c.model.name == model and c.env.kwargs["cot"] == "long"
    assert c.model.max_model_len == 1024 + c.rollout.max_total_tokens
    assert c.rl.learner.micro_batch_tokens == 2 * c.model.max_model_len
    same = ("prompts_per_step", "samples_per_prompt", "sampling_rounds", "sampling_batch_factor")
    assert [getattr(c.rl, k) for k in same] == [getattr(short.rl, k) for k in same]
    assert c.rl.learner.micro_batch_packing == "verl" and c.rl.learner.optimizer.lr == 1e-6


def test_dapo_math_rows_become_problems_and_answers(tmp_path):
    wrapped = (
        "Solve the following math problem step by step. The last line of your response should be of the form "
        "Answer: $Answer (without quotes) where $Answer is the answer to the problem.\n\n{}\n\n"
        'Remember to put your answer on its own line after "Answer:".'
    )
    rows = [
        {
            "prompt": [{"role": "user", "content": wrapped.format("What is $2+3$?")}],
            "reward_model": {"ground_truth": "5", "style": "rule"},
            "extra_info": {"index": "a1"},
        },
        {
            "prompt": [{"role": "user", "content": wrapped.format("Find $x$ if $2x=8$.")}],
            "reward_model": {"ground_truth": 4},
            "extra_info": {"index": "a2"},
        },
        {
            "prompt": [{"role": "user", "content": wrapped.format("What is $2+3$?")}],
            "reward_model": {"ground_truth": "5"},
            "extra_info": {"index": "a3"},
        },  # a repeat: written once
    ]
    source = tmp_path / "dapo.jsonl"
    source.write_text("".join(json.dumps(r) + "\n" for r in rows))
    out = tmp_path / "data" / "dapo_math_17k.jsonl"
    done = CliRunner().invoke(app, ["envs", "prepare-dapo-math", "--source", str(source), "--out", str(out)])
    assert done.exit_code == 0, done.output
    assert "2 problems" in done.output and [p.name for p in out.parent.iterdir()] == [out.name]  # no partial
    tasks = list(TaskDataset(str(out)))
    assert [(t.problem, t.answer, t.id) for t in tasks] == [
        ("What is $2+3$?", "5", "a1"),
        ("Find $x$ if $2x=8$.", "4", "a2"),
    ]


def test_a_recipe_whose_data_file_is_missing_says_which_and_how_to_make_it(tmp_path, monkeypatch):
    """The package ships no training data: the CoT recipes' file is named, with the command that writes it;
    another recipe's missing file is named, with where it was looked for."""
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ValueError) as missing:
        check_run(load_config(recipe="short-cot-qwen2.5-math-7b"))
    assert str(missing.value) == (
        f"env.kwargs.dataset='data/dapo_math_17k.jsonl': no such file (looked for {tmp_path}/data/dapo_math_17k.jsonl); "
        "the package ships no training data: make this one with "
        "`stare-agents envs prepare-dapo-math --out data/dapo_math_17k.jsonl`"
    )
    with pytest.raises(
        ValueError, match=r"env.kwargs.dataset='data/math_l3to5.jsonl': no such file \(looked for"
    ):
        check_run(load_config(recipe="qwen2.5-7b-tir-stare-c2"))
    config = load_config(recipe="tiny", overrides=["sft.data=traces/none.jsonl"])
    with pytest.raises(ValueError, match=r"sft.data='traces/none.jsonl': no such file .* allowed: 'solver'"):
        check_run(config)
