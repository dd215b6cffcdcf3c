"""The CoT recipes hold the official STARE settings (issue 29, deliverable 5: the official short-CoT script
recipe/STARE/scripts/run_short_cot_qwen2.5_math_7b_STARE.sh), and DAPO-Math-17k converts into rows the math
environments read. Every paper recipe runs as written (issue 50): its config shows without the data, its
precision is one word, and one step of it runs here with the tiny model, its benchmark entries included."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from stare_agents.cli import app
from stare_agents.envs.tasks import TaskDataset
from stare_agents.eval import BENCHMARK_FILES
from stare_agents.records import read_records
from stare_agents.train.config import check_run, load_config
from stare_agents.train.trainer import train


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
    # the official 0.6 leaves room for the actor verl keeps on the rollout's GPUs; here the learners have their own
    assert c.rollout.resolved_gpu_memory_utilization() == 0.9 and c.rollout.temperature == 1.0
    assert (c.eval.every, c.checkpoint.every, c.rl.steps) == (
        10,
        10,
        5500,
    )  # test_freq, save_freq, the run's length
    # the official precision: fp16 actor and engine, without the bf16 corrections
    assert (c.precision, c.model.rollout_dtype, c.rl.learner.precision) == ("fp16", "float16", "fp16")
    assert not c.model.fp32_lm_head and not c.rl.learner.importance.active
    # the official validation: temperature 1.0, top_p 0.7, avg@32 on AIME24/25 and AMC23, avg@4 on the rest
    assert [(e.benchmark, e.k) for e in c.eval.benchmarks] == [
        ("aime24", 32),
        ("aime25", 32),
        ("amc23", 32),
        ("math500", 4),
        ("minerva", 4),
        ("olympiadbench", 4),
    ]
    for entry in c.eval.benchmarks:
        assert (entry.protocol, entry.temperature, entry.top_p) == ("cot", 1.0, 0.7)
        assert (
            entry.max_tokens_per_turn == entry.max_total_tokens == 3072
        )  # the training budget, in the context
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
    assert c.precision == short.precision and c.rl.steps == short.rl.steps
    # scored with their own prompt and budget: the long-CoT protocol, 16,384 response tokens
    assert [(e.benchmark, e.k, e.top_p) for e in c.eval.benchmarks] == [
        (e.benchmark, e.k, e.top_p) for e in short.eval.benchmarks
    ]
    assert {(e.protocol, e.max_total_tokens) for e in c.eval.benchmarks} == {("cot-long", 16384)}


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


PAPER_RECIPES = (
    "qwen2.5-7b-tir-stare-c2",
    "qwen2.5-7b-tir-grpo-ds",
    "qwen2.5-7b-zero-tir-grpo-ds",
    "short-cot-qwen2.5-math-7b",
    "long-cot-r1-distill-qwen-1.5b",
    "long-cot-qwen3-8b",
)


@pytest.mark.parametrize("recipe", PAPER_RECIPES)
def test_a_paper_recipe_shows_its_config_before_the_benchmark_data_is_there(recipe, monkeypatch, tmp_path):
    """No eval.data_dir, no $STARE_DATA_DIR, no data folder beside the repository: the benchmark names are looked
    up when the run starts (a recipe is shown and checked before the data is fetched)."""
    import stare_agents.eval.benchmarks as benchmarks

    monkeypatch.delenv("STARE_DATA_DIR", raising=False)
    monkeypatch.setattr(benchmarks, "default_data_dir", lambda: tmp_path / "nowhere")
    result = CliRunner().invoke(app, ["train", "--recipe", recipe, "--show-config"])
    assert result.exit_code == 0, result.output
    shown = yaml.safe_load(result.output)
    assert shown["precision"] == "fp16" and shown["model"]["rollout_dtype"] == "float16"
    assert [e["benchmark"] for e in shown["eval"]["benchmarks"]] == list(BENCHMARK_FILES)
    assert {e["top_p"] for e in shown["eval"]["benchmarks"]} == {0.7}
    assert [e["k"] for e in shown["eval"]["benchmarks"]] == [32, 32, 32, 4, 4, 4]


@pytest.mark.parametrize("recipe", PAPER_RECIPES)
def test_a_paper_recipe_places_its_engines_and_its_learner_each_on_a_node(recipe):
    """Both kinds placed: the engines start first, and placed wherever Ray finds room they may take GPUs on every
    node, leaving none with the learner's 8 (issue 50)."""
    c = load_config(recipe=recipe)
    assert (c.rollout.placement, c.rl.learner_placement) == ("STRICT_PACK", "STRICT_PACK")
    assert (
        c.rollout.workers * c.rollout.num_gpus_per_worker
        == c.rl.learner_workers * c.rl.learner_gpus_per_worker
        == 8
    )


@pytest.mark.parametrize("recipe", PAPER_RECIPES)
def test_one_word_switches_a_paper_recipe_between_fp16_and_bf16(recipe):
    official = load_config(recipe=recipe)
    assert (official.model.rollout_dtype, official.rl.learner.precision) == ("float16", "fp16")
    assert not official.model.fp32_lm_head and not official.rl.learner.importance.active
    bf16 = load_config(recipe=recipe, overrides=["precision=bf16"])
    assert (bf16.model.rollout_dtype, bf16.rl.learner.precision) == ("bfloat16", "bf16")
    assert bf16.model.fp32_lm_head and bf16.rl.learner.importance.cap == 2.0
    # the corrections are the word's defaults, which a key may change; the dtypes it names are not
    assert (
        load_config(
            recipe=recipe, overrides=["precision=bf16", "rl.learner.importance.cap=3"]
        ).rl.learner.importance.cap
        == 3
    )
    with pytest.raises(ValueError, match=r"model.rollout_dtype='bfloat16' disagrees with precision=fp16"):
        load_config(recipe=recipe, overrides=["model.rollout_dtype=bfloat16"])
    with pytest.raises(ValueError, match=r"precision='fp8': allowed: fp16, bf16"):
        load_config(recipe=recipe, overrides=["precision=fp8"])
    # the saved config (config.yaml) reads back to the same config
    saved = yaml.safe_load(bf16.to_yaml())
    assert saved["precision"] == "bf16" and saved["model"]["fp32_lm_head"] is True


@pytest.fixture(scope="module")
def paper_data(tmp_path_factory) -> Path:
    """Tiny local stand-ins for what the paper recipes read: the six benchmark files (two problems each), training
    problems, and tool-interleaved SFT conversations."""
    folder = tmp_path_factory.mktemp("paper-data")
    (folder / "benchmarks").mkdir()
    for name in BENCHMARK_FILES:
        rows = [
            {"id": f"{name}-{i}", "problem": f"What is {i} + {i}?", "answer": str(2 * i)} for i in range(2)
        ]
        (folder / "benchmarks" / f"{name}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    rows = [{"id": f"t{i}", "problem": f"What is {i} * 3?", "answer": str(3 * i)} for i in range(8)]
    (folder / "problems.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    conversation = [
        {"role": "user", "content": "What is 2 * 3?"},
        {"role": "assistant", "content": "```python\nprint(2 * 3)\n```"},
        {"role": "tool", "content": "6"},
        {"role": "assistant", "content": "The answer is \\boxed{6}."},
    ]
    (folder / "sft.jsonl").write_text(json.dumps({"messages": conversation}) + "\n")
    return folder


def cpu_dry_run(recipe: str, data: Path, out: Path) -> list[str]:
    """The overrides that run one step of a paper recipe on this machine: the tiny model on the HF engine in this
    process, one learner on the CPU, the local data of `paper_data`, short responses, and every benchmark entry
    as the recipe has it (protocol, sampling, turns) on one problem with at most 2 samples and short responses.
    Its precision, algorithm, loss, packing and environment stay the recipe's."""
    config = load_config(recipe=recipe, overrides=[f"eval.data_dir={data / 'benchmarks'}"])
    short = {"max_tokens_per_turn": 8, "max_total_tokens": 16, "limit": 1}
    entries = [{**dataclasses.asdict(e), **short, "k": min(e.k, 2)} for e in config.eval.benchmarks]
    overrides = [
        f"out_dir={out}",
        "model.name=tiny",
        "model.max_model_len=512",
        "model.fp32_lm_head=false",  # the HF engine computes its head in its own dtype
        "rollout.engine=hf",
        "rollout.gpu_memory_utilization=null",
        "rollout.use_ray=false",
        "rollout.workers=1",
        "rollout.num_gpus_per_worker=0",
        "rollout.max_tokens_per_turn=8",
        "rollout.max_total_tokens=16",
        "rl.steps=1",
        "rl.prompts_per_step=2",
        "rl.samples_per_prompt=2",
        "rl.sampling_rounds=1",
        "rl.sampling_batch_factor=1",
        "rl.dynamic_sampling=false",  # the random model's groups rarely vary: the step trains on them anyway
        "rl.learner_workers=1",
        "rl.learner_gpus_per_worker=0",
        "rl.fsdp=false",
        f"env.kwargs.dataset={data / 'problems.jsonl'}",
        f"eval.data_dir={data / 'benchmarks'}",
        f"eval.benchmarks={json.dumps(entries)}",
        "logging.progress=false",
    ]
    if config.rollout.sandbox != "none":
        overrides += ["rollout.sandbox=local", "rollout.sandbox_pool_size=2"]
    if config.sft.enabled:
        overrides += [f"sft.data={data / 'sft.jsonl'}", "sft.num_examples=1", "sft.batch_size=1"]
    return overrides


@pytest.mark.slow
@pytest.mark.parametrize("recipe", PAPER_RECIPES)
def test_one_step_of_a_paper_recipe_runs_here_with_the_tiny_model(recipe, paper_data, tmp_path, monkeypatch):
    monkeypatch.setenv("STARE_ALLOW_LOCAL_SANDBOX", "1")  # the TIR recipes' tool, on this machine's CPU
    config = load_config(recipe=recipe, overrides=cpu_dry_run(recipe, paper_data, tmp_path / "run"))
    assert (config.precision, config.rl.learner.precision) == ("fp16", "fp16")
    summary = train(config)
    (record,) = read_records(tmp_path / "run" / "metrics.jsonl", "rl")
    if "learner/loss_scale" in record:  # fp16's loss scale: the official precision ran
        assert record["learner/loss_scale"] > 0
    else:  # the random model's turns are void, and SimpleTIR's rule leaves every trajectory out of the loss
        assert config.rl.drop_void_turns and record["rollout/void_turns"] > 0
    assert (tmp_path / "run" / "final_model" / "config.json").is_file()
    for entry in config.eval.benchmarks:  # every entry evaluated after the step, with its protocol
        figures = summary["benchmarks"][entry.benchmark]["final"]
        assert figures["problems"] == 1 and f"avg@{entry.k}" in figures
        results = json.loads(
            (tmp_path / "run" / "evals" / "step-000001" / entry.benchmark / "results.json").read_text()
        )
        assert results["settings"]["protocol"]["name"] == entry.protocol
        assert results["settings"]["protocol"]["top_p"] == 0.7
