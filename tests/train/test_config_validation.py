"""The config is checked where it loads: every hostile value is refused with the key, the value and what is
allowed; strings stay strings; the algorithm's fields are typed keys over the preset; the environment, its
kwargs, sft.data and --compare are checked before any work; the resolved config round-trips."""

from __future__ import annotations

import dataclasses
import inspect
import re
import typing
from pathlib import Path

import gymnasium as gym
import pytest
from typer.testing import CliRunner

from stare_agents.algo import AlgorithmConfig
from stare_agents.algo.config import ALGORITHMS
from stare_agents.sandbox import NoSandbox
from stare_agents.sandbox.runner import DEFAULT_TIMEOUT_S, MAX_TIMEOUT_S
from stare_agents.train.config import (
    ALGORITHM_FIELDS,
    RLSection,
    TrainConfig,
    check_run,
    load_config,
    recipe_names,
)

# (overrides, the key, the value as shown, what is allowed): each message must hold all three
HOSTILE = [
    (["rollout.engine=vlm"], "rollout.engine", "'vlm'", "vllm, hf"),
    (["model.rollout_dtype=fp16"], "model.rollout_dtype", "'fp16'", "auto, float32, bfloat16, fast, float16"),
    (["rollout.rendering=yes"], "rollout.rendering", "'yes'", "auto, chat, inline"),
    (["rollout.sandbox=dockr"], "rollout.sandbox", "'dockr'", "docker, local, none"),
    (["sft.precision=fp8"], "sft.precision", "'fp8'", "fp32, bf16, fast, bf16-emulated, fp16"),
    (["rl.algorithm=stare-c3"], "rl.algorithm", "'stare-c3'", ", ".join(ALGORITHMS)),
    (["rl.one_member_groups=off"], "rl.one_member_groups", "'off'", "drop, keep"),
    (["rl.learner.optimizer.betas=[a,b]"], "rl.learner.optimizer.betas[0]", "'a'", "a finite number"),
    (["rl.learner.optimizer.betas=[0.9]"], "rl.learner.optimizer.betas", "[0.9]", "a list of 2 (float, float)"),
    (["rl.learner.optimizer.betas=0.9"], "rl.learner.optimizer.betas", "0.9", "a list"),
    (["rl.steps=many"], "rl.steps", "'many'", "an int"),
    (["rl.steps=true"], "rl.steps", "True", "an int"),
    (["rl.steps=2.5"], "rl.steps", "2.5", "an int"),
    (["rl.stare.w=.inf"], "rl.stare.w", "inf", "a finite number"),
    (["rl.stare.target_entropy=.nan"], "rl.stare.target_entropy", "nan", "a finite number"),
    (["rl.stare.top_ratio=2"], "rl.stare", "2.0", "(0, 1]"),
    (["rl.stare=5"], "rl.stare", "5", "a mapping"),
    (["rl.stare.wq=1"], "'rl.stare'", "['wq']", "'top_ratio'"),
    (["rl.algorithm=grpo", "rl.stare.w=1.2"], "rl.stare.", "rl.algorithm=grpo", "(stare, stare-c2, stare-random)"),
    (["rl.stare.m=0.25"], "rl.stare.m", "0.25", "rl.stare.variant=C2"),  # tiny's stare is O1: M never read
    (["logging.progress=maybe"], "logging.progress", "'maybe'", "true or false"),
    (["env.kwargs=[1]"], "env.kwargs", "[1]", "a mapping"),
    (["env.kwargs.max_turns=3"], "env.kwargs.max_turns", "3", "env.max_turns"),
    (["env.max_turns=0"], "env.max_turns", "0", "an int >= 1"),
    (["env.tool_timeout_s=99999"], "env.tool_timeout_s", "99999", f"(0, {MAX_TIMEOUT_S:g}]"),
    (["env.tool_wall_timeout_s=0"], "env.tool_wall_timeout_s", "0", f"(0, {MAX_TIMEOUT_S:g}]"),
    (["env.tool_timeout_s=2", "env.tool_wall_timeout_s=1"], "env.tool_wall_timeout_s=1", "below", "at least"),
    (["env.tool_wall_timeout_s=4"], "env.tool_wall_timeout_s=4", "below env.tool_timeout_s=5", "at least"),
    (["env.kwargs.tool_wall_timeout_s=9"], "env.kwargs.tool_wall_timeout_s", "9", "env.tool_wall_timeout_s"),
    # a sandbox: none run whose environment names a sandbox of its own (null: the tool's process-wide Docker one)
    (["rollout.sandbox=none", "env.kwargs.sandbox=null"], "env.kwargs.sandbox", "None", "set rollout.sandbox"),
    (["env.kwargs.sandbox=local"], "env.kwargs.sandbox", "'local'", "set rollout.sandbox"),
    (["rollout.gpu_memory_utilization=1.5"], "rollout.gpu_memory_utilization", "1.5", "(0, 1]"),
    (["rollout.tensor_parallel_size=0"], "rollout.tensor_parallel_size", "0", "an int >= 1"),
    (["rollout.max_num_seqs=0"], "rollout.max_num_seqs", "0", "an int >= 1"),
    (["rollout.engine_kwargs.seed=3"], "rollout.engine_kwargs.seed", "3", "from seed"),
    (["rollout.engine_kwargs.gpu_memory_utilization=0.9"], "engine_kwargs.gpu_memory_utilization", "0.9",
     "rollout.gpu_memory_utilization"),
    (["rollout.engine=hf", "rollout.max_num_seqs=4"], "rollout.engine", "'max_num_seqs': 4", "vllm only"),
    (["rl.algorithm_overrides.bogus=1"], "rl.algorithm_overrides.bogus", "1", "normalize_std"),
    (["rl.algorithm_overrides.stare.w=1.3", "rl.stare.w=1.2"], "rl.stare.w", "set twice", "rl.algorithm_overrides"),
]  # fmt: skip


@pytest.mark.parametrize(
    ("overrides", "key", "value", "allowed"), HOSTILE, ids=[" ".join(h[0]) for h in HOSTILE]
)
def test_a_hostile_value_is_refused_naming_the_key_the_value_and_what_is_allowed(
    overrides, key, value, allowed
):
    with pytest.raises(ValueError) as caught:
        load_config(recipe="tiny", overrides=overrides)
    message = str(caught.value)
    assert key in message and value in message and allowed in message, message


def test_switching_a_c2_recipe_to_an_o1_preset_is_refused_while_its_m_would_go_unread():
    # the hold recipe sets M 0.25 under stare-c2; its random-token control must keep variant C2, or the run trains
    # with every weight 1 (W 1, M unread) and looks like a control of something it never did
    with pytest.raises(ValueError, match=r"rl\.stare\.m=0\.25: variant O1"):
        load_config(recipe="smollm2-arith-hold", overrides=["rl.algorithm=stare-random"])
    overrides = ["rl.algorithm=stare-random", "rl.stare.variant=C2"]
    control = load_config(recipe="smollm2-arith-hold", overrides=overrides)
    stare = control.rl.algorithm_config().stare
    assert (control.rl.algorithm, stare.variant, stare.w, stare.m) == ("stare-random", "C2", 1.0, 0.25)
    # the paper's M left at 1 under O1 is no contradiction, nor is M from a preset a config did not set
    assert load_config(recipe="tiny", overrides=["rl.stare.m=1.0"]).rl.algorithm_config().stare.m == 1.0
    assert load_config(recipe="tiny").rl.algorithm_config().stare.variant == "O1"


def test_yaml_scalars_for_string_fields_stay_strings(tmp_path):
    config = load_config(recipe="tiny", overrides=["sft.data=off", "name=2024-01-01", "out_dir=007"])
    assert (config.sft.data, config.name, config.out_dir) == ("off", "2024-01-01", str(Path.cwd() / "007"))
    assert load_config(recipe="tiny", overrides=["model.name=yes"]).model.name == "yes"
    path = tmp_path / "c.yaml"
    path.write_text("name: 2024-01-01\nsft: {data: no}\nenv: {kwargs: {digits: 4, when: 2024-01-01}}\n")
    config = load_config(path=path)
    assert (config.name, config.sft.data) == ("2024-01-01", "no")
    assert config.env.kwargs == {"digits": 4, "when": "2024-01-01"}  # kwargs keep YAML's reading (int)
    # where a number or a bool is wanted, YAML's reading is kept
    assert load_config(recipe="tiny", overrides=["sft.enabled=off"]).sft.enabled is False
    assert load_config(recipe="tiny", overrides=["logging.wandb_project=null"]).logging.wandb_project is None


def test_the_algorithms_fields_are_typed_keys_over_the_presets_values():
    config = load_config(
        recipe="tiny",
        overrides=[
            "rl.algorithm=stare-c2",
            "rl.stare.top_ratio=0.2",
            "rl.stare.w=1.2",  # the module docstring's example
            "rl.stare.m=0.8",
            "rl.stare.target_entropy=0.25",
            "rl.stare.adaptive=true",
            "rl.stare.alpha=0.02",
            "rl.stare.w_max=1.4",
            "rl.stare.m_min=0.6",
            "rl.loss.clip_high=0.3",
            "rl.one_member_groups=keep",
        ],
    )
    algorithm = config.algorithm()
    stare = algorithm.stare
    assert (stare.variant, stare.top_ratio, stare.w, stare.m, stare.target_entropy) == (
        "C2",
        0.2,
        1.2,
        0.8,
        0.25,
    )
    assert (stare.adaptive, stare.alpha, stare.w_max, stare.m_min) == (True, 0.02, 1.4, 0.6)
    assert (algorithm.loss.clip_high, algorithm.one_member_groups, algorithm.name) == (
        0.3,
        "keep",
        "stare-c2",
    )
    # keys left out keep the preset's: grpo's symmetric clip and no filtering, with no STARE
    grpo = load_config(
        recipe="tiny", overrides=["rl.algorithm=grpo", "rl.stare=null", "rl.dynamic_sampling=false"]
    )
    assert grpo.algorithm() == AlgorithmConfig.preset("grpo")
    for name in ALGORITHMS:  # the bare presets, through the config
        rl = load_config(overrides=[f"rl.algorithm={name}"]).rl
        assert rl.algorithm_config() == AlgorithmConfig.preset(name), name
    # the deprecated spelling still reads
    assert (
        load_config(recipe="tiny", overrides=["rl.algorithm_overrides.loss.clip_low=0.1"])
        .algorithm()
        .loss.clip_low
        == 0.1
    )


def test_the_rl_section_holds_an_algorithm_config_whose_fields_are_its_own_keys(tmp_path):
    """One definition per knob: RLSection declares none of AlgorithmConfig's fields; it holds one (`algo`),
    built over the preset, whose fields are keys of rl itself, in the loader and in the saved config."""
    rl_fields = {f.name for f in dataclasses.fields(RLSection)}
    assert set(ALGORITHM_FIELDS) == {f.name for f in dataclasses.fields(AlgorithmConfig)} - {"name"}
    assert (
        not rl_fields & set(ALGORITHM_FIELDS) and typing.get_type_hints(RLSection)["algo"] is AlgorithmConfig
    )
    assert RLSection().algorithm_config() == AlgorithmConfig.preset(RLSection().algorithm)
    config = load_config(overrides=["rl.algorithm=grpo-ds", "rl.loss.clip_high=0.25"])
    assert config.rl.algo.loss.clip_high == 0.25 and config.algorithm().name == "grpo-ds"
    assert config.algorithm() == dataclasses.replace(
        AlgorithmConfig.preset("grpo-ds"), loss=config.rl.algo.loss
    )
    saved = config.to_dict()["rl"]  # flat under rl, as the user writes them, and no "algo" key
    assert "algo" not in saved and set(ALGORITHM_FIELDS) <= set(saved) and saved["loss"]["clip_high"] == 0.25
    path = tmp_path / "config.yaml"
    path.write_text(config.to_yaml())
    assert load_config(path=path) == config
    for hostile in (["rl.algo.loss.clip_high=0.2"], ["rl.name=grpo"]):  # the holder's names are not keys
        with pytest.raises(ValueError, match="unknown key"):
            load_config(recipe="tiny", overrides=hostile)


def test_the_resolved_config_round_trips_and_is_what_show_config_prints(tmp_path):
    from stare_agents.cli import app
    from stare_agents.train.trainer import Trainer

    for name in recipe_names():
        config = load_config(recipe=name)
        path = tmp_path / f"{name}.yaml"
        path.write_text(config.to_yaml())
        assert load_config(path=path) == config, name
    overrides = [
        "rl.stare.w=1.3",
        "name=2024-01-01",
        f"out_dir={tmp_path / 'run'}",
        "rl.loss.clip_high=0.25",
    ]
    result = CliRunner().invoke(app, ["train", "--recipe", "tiny", "--show-config", *overrides])
    assert result.exit_code == 0, result.output
    config = load_config(recipe="tiny", overrides=overrides)
    assert result.output == config.to_yaml()
    assert not (tmp_path / "run").exists()  # --show-config does nothing else
    Trainer(config)  # writes the run folder's config.yaml
    assert (tmp_path / "run" / "config.yaml").read_text() == result.output


def test_max_turns_and_the_tool_timeout_are_typed_keys_that_reach_the_environment():
    overrides = ["env.max_turns=5", "env.tool_timeout_s=2.5", "env.tool_wall_timeout_s=7"]
    config = load_config(recipe="tiny", overrides=overrides)
    kwargs = config.env.make_kwargs()
    assert kwargs == {
        "digits": 4,
        "kinds": ["multiply"],
        "max_turns": 5,
        "tool_timeout_s": 2.5,
        "tool_wall_timeout_s": 7,
    }
    env = gym.make(config.env.id, sandbox=NoSandbox(), **kwargs).unwrapped
    tool = env.tools()["python"]
    assert env.max_turns == 5 and (tool.timeout_s, tool.wall_timeout_s) == (2.5, 7.0)
    default = gym.make(config.env.id, sandbox=NoSandbox()).unwrapped
    assert default.tools()["python"].timeout_s == DEFAULT_TIMEOUT_S


def test_one_tool_timeout_default_and_one_cap():
    from stare_agents.envs.python_unittest import PythonUnitTestEnv
    from stare_agents.envs.tools import PythonTool
    from stare_agents.sandbox import DockerSandbox, LocalSandbox, channel, runner

    defaults = [
        inspect.signature(PythonTool).parameters["timeout_s"].default,
        inspect.signature(PythonUnitTestEnv).parameters["tool_timeout_s"].default,
        inspect.signature(DockerSandbox).parameters["default_timeout_s"].default,
        inspect.signature(LocalSandbox).parameters["default_timeout_s"].default,
        runner.bounded_timeout(None),
        gym.make("stare_agents/MathTIR-v0", sandbox=NoSandbox()).unwrapped.tools()["python"].timeout_s,
    ]
    assert defaults == [DEFAULT_TIMEOUT_S] * 6
    assert channel.MAX_TIMEOUT_S is runner.MAX_TIMEOUT_S == MAX_TIMEOUT_S
    assert runner.bounded_timeout(MAX_TIMEOUT_S + 1) == DEFAULT_TIMEOUT_S
    with pytest.raises(
        ValueError, match=r"timeout_s must be a finite number of seconds in \(0, 3600\], got 5000"
    ):
        PythonTool(NoSandbox(), timeout_s=5000)


def test_check_run_names_what_is_wrong_before_any_work(tmp_path):
    tiny = ["sft.enabled=false"]
    check_run(load_config(recipe="tiny", overrides=tiny))  # fine as it is
    cases = [
        (["env.kwargs.digitz=3"], ("env.kwargs.digitz=3", "takes no keyword 'digitz'", "digits, ")),
        (["env.id=stare_agents/MathCoT-v0"], ("env.kwargs.digits=4", "MathCoTEnv", "cot, dataset")),
        (["env.id=stare_agents/MathCoT-v0", "env.kwargs={}", "env.tool_timeout_s=3"],
         ("env.tool_timeout_s=3.0", "takes no keyword 'tool_timeout_s'", "max_turns")),
        (["env.kwargs.digits=-3"], ("env.kwargs=", "'digits': -3", "digits must be >= 2")),
        (["env.id=my/X-v0"], ("env.id='my/X-v0'", "unknown environment", "stare_agents/ArithmeticTIR-v0")),
        (["env.id=nomod_q:my/X-v0"], ("env.id='my/X-v0'", "cannot import 'nomod_q'", "Python path")),
        (["sft.enabled=true", "sft.data=off"], ("sft.data='off'", "no such file", "'solver'")),
        (["sft.enabled=true", "env.id=stare_agents/PythonUnitTest-v0", "env.kwargs={}"],
         ("sft.data='solver'", "has no solver", "a JSONL file")),
    ]  # fmt: skip
    for overrides, parts in cases:
        with pytest.raises(ValueError) as caught:
            check_run(load_config(recipe="tiny", overrides=[*tiny, *overrides]))
        assert all(part in str(caught.value) for part in parts), (overrides, str(caught.value))
    for compare in ("grpo-dz", "stare"):  # unknown, or the run's own algorithm
        with pytest.raises(
            ValueError, match=rf"--compare='{compare}': allowed: an algorithm other than .*grpo-ds"
        ):
            check_run(load_config(recipe="tiny"), compare=compare)
    check_run(load_config(recipe="tiny", overrides=tiny), compare="grpo-ds")


def test_a_run_with_a_typo_stops_before_the_model_or_the_base_evaluation(tmp_path, monkeypatch):
    """The trainer checks the run first: nothing is prepared, evaluated or trained (the CLI exits 2)."""
    from stare_agents.cli import app
    from stare_agents.train import trainer as trainer_module

    def no_work(*args, **kwargs):
        raise AssertionError("work started before the config was checked")

    monkeypatch.setattr("stare_agents.models.prepare_model", no_work)
    monkeypatch.setattr(trainer_module, "prepare_model", no_work)  # where the trainer uses it
    monkeypatch.setattr(trainer_module.Trainer, "_record_accuracy", no_work)
    for extra, expected in (
        (["env.kwargs.digitz=3"], "digitz"),
        (["sft.data=missing.jsonl"], "missing.jsonl"),
    ):
        config = load_config(recipe="tiny", overrides=[f"out_dir={tmp_path / extra[0]}", *extra])
        with pytest.raises(ValueError, match=expected):
            trainer_module.Trainer(config).run()
    config = load_config(recipe="tiny", overrides=[f"out_dir={tmp_path / 'compare'}"])
    with pytest.raises(ValueError, match="--compare='grpo-dz'"):
        trainer_module.Trainer(config).run(compare="grpo-dz")
    out = tmp_path / "cli"
    result = CliRunner().invoke(app, ["train", "--recipe", "tiny", "--out", str(out), "--compare", "grpo-dz"])
    assert result.exit_code == 2 and "--compare='grpo-dz'" in result.output and not out.exists()


def test_gpu_engine_settings_reach_the_vllm_engines_arguments():
    config = load_config(
        overrides=[
            "rollout.gpu_memory_utilization=0.8",
            "rollout.tensor_parallel_size=2",
            "rollout.num_gpus_per_worker=2",  # an engine sharded over 2 GPUs needs a worker holding 2
            "rollout.max_num_seqs=64",
            "rollout.engine_kwargs.enable_chunked_prefill=false",
        ]
    )
    assert config.rollout.vllm_kwargs() == {
        "gpu_memory_utilization": 0.8,
        "tensor_parallel_size": 2,
        "max_num_seqs": 64,
        "enable_chunked_prefill": False,
    }
    assert TrainConfig().rollout.vllm_kwargs() == {"gpu_memory_utilization": 0.5, "tensor_parallel_size": 1}


@pytest.mark.parametrize(("gpus", "share"), [(1, 0.9), (2, 0.9), (0.5, 0.45), (0.25, 0.225), (0, 0.5)])
def test_gpu_memory_utilization_defaults_to_what_the_engine_has_of_its_gpu(gpus, share):
    """An engine with whole GPUs of its own takes vLLM's 0.9 (it took 0.5, half the GPU idle); on a GPU share
    0.9 x the share; without a Ray GPU (an engine beside the learner on the driver's GPU) 0.5; a set value wins."""
    config = load_config(overrides=[f"rollout.num_gpus_per_worker={gpus}"])
    assert config.rollout.vllm_kwargs()["gpu_memory_utilization"] == share
    override = [f"rollout.num_gpus_per_worker={gpus}", "rollout.gpu_memory_utilization=0.7"]
    assert load_config(overrides=override).rollout.vllm_kwargs()["gpu_memory_utilization"] == 0.7
    pytest.importorskip("vllm")
    with pytest.raises(ValueError) as caught:
        load_config(overrides=["rollout.engine_kwargs.enable_chunky_prefill=true"])
    assert all(
        part in str(caught.value)
        for part in (
            "rollout.engine_kwargs",
            "enable_chunky_prefill",
            "True",
            "fields of vllm.engine.arg_utils",
        )
    )


def test_sandbox_low_priority_is_on_for_cpu_only_workers_and_never_contradicts_the_limits():
    from stare_agents.sandbox import DockerLimits, DockerSandbox
    from stare_agents.train.config import RolloutSection

    # CPU-only workers: the engine and the model's code share cores, so the code yields them
    assert RolloutSection().resolved_sandbox_kwargs() == {"limits": {"low_priority": True}}
    assert RolloutSection(num_gpus_per_worker=1).resolved_sandbox_kwargs()["limits"] == {
        "low_priority": False
    }
    assert (
        RolloutSection(sandbox_low_priority=False).resolved_sandbox_kwargs()["limits"]["low_priority"]
        is False
    )
    # the user's own limits are kept, and their own word on the priority wins over the default
    kept = RolloutSection(sandbox_kwargs={"runtime": "runsc", "limits": {"memory_mb": 300}})
    assert kept.resolved_sandbox_kwargs() == {
        "runtime": "runsc",
        "limits": {"memory_mb": 300, "low_priority": True},
    }
    assert kept.sandbox_kwargs == {"runtime": "runsc", "limits": {"memory_mb": 300}}  # not modified in place
    own = RolloutSection(sandbox_kwargs={"limits": {"low_priority": False}})
    assert own.resolved_sandbox_kwargs()["limits"]["low_priority"] is False
    # other backends take no Docker limits
    assert RolloutSection(sandbox="none").resolved_sandbox_kwargs() == {}
    # what reaches the rollout worker builds a sandbox
    box = DockerSandbox(pool_size=1, **RolloutSection().resolved_sandbox_kwargs())
    assert box.limits == DockerLimits(low_priority=True)
    with pytest.raises(ValueError, match=r"sandbox_low_priority=True and .*low_priority=False disagree"):
        RolloutSection(sandbox_low_priority=True, sandbox_kwargs={"limits": {"low_priority": False}})
    with pytest.raises(ValueError, match=r"rollout\.sandbox_low_priority"):
        load_config("smollm2-arith", overrides=["rollout.sandbox_low_priority=maybe"])


def test_the_learners_derived_fields_are_not_settings(tmp_path):
    """rl.learner.temperature, .fp32_head and .device follow rollout.temperature, model.fp32_lm_head and the
    machine: as keys they are refused with the setting to use (a temperature set on purpose was once silently
    replaced), they never reach config.yaml, and a config.yaml that still holds them resumes."""
    import yaml

    from stare_agents.train.config import derived_keys
    from stare_agents.train.run_folder import check_same_run

    assert sorted(derived_keys(TrainConfig)) == [
        "rl.learner.device",
        "rl.learner.fp32_head",
        "rl.learner.score_untrained",
        "rl.learner.temperature",
    ]
    for key, value, source in (
        ("temperature", "1.0", "rollout.temperature"),
        ("fp32_head", "true", "model.fp32_lm_head"),
        ("fp32_head", "false", "model.fp32_lm_head"),
        ("device", "cuda", "the machine"),
        ("score_untrained", "false", "logging.entropy_all"),
    ):
        with pytest.raises(ValueError, match=rf"rl.learner.{key}=.*not a setting.*{source}"):
            load_config(recipe="tiny", overrides=[f"rl.learner.{key}={value}"])
    config = load_config(recipe="tiny", overrides=["rollout.temperature=0.6"])
    assert config.rl.learner.temperature == 0.6 and config.rl.learner.fp32_head is False
    assert (
        load_config(recipe="tiny", overrides=["logging.entropy_all=false"]).rl.learner.score_untrained
        is False
    )
    text = config.to_yaml()
    learner = yaml.safe_load(text)["rl"]["learner"]
    assert not {"temperature", "fp32_head", "device", "score_untrained"} & set(learner)
    assert "micro_batch_tokens" in learner
    assert load_config(path=_written(tmp_path / "now.yaml", text)) == config
    old = yaml.safe_load(text)  # as a run folder written before: the derived values among the settings
    old["rl"]["learner"].update(temperature=0.6, fp32_head=False, device="cpu")
    check_same_run(_written(tmp_path / "old.yaml", yaml.safe_dump(old)), config)
    old["rl"]["learner"]["micro_batch_tokens"] += 1  # a real change is still refused
    with pytest.raises(FileExistsError, match=r"rl\.learner\.micro_batch_tokens"):
        check_same_run(_written(tmp_path / "changed.yaml", yaml.safe_dump(old)), config)


def _written(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


@pytest.mark.parametrize(
    "key, value, allowed",
    [
        ("rl.learner.precision", "fp8", "fp32, bf16, fast, bf16-emulated, fp16"),
        ("rl.learner.micro_batch_packing", "shortest-first", "longest-first, balanced, verl"),
        ("rl.learner.old_logprobs", "engine", "recompute, rollout"),
        ("rl.learner.optimizer.schedule", "linear", "constant, cosine"),
    ],
)
def test_the_learners_word_sets_are_literals_that_list_what_is_allowed(key, value, allowed):
    with pytest.raises(
        ValueError, match=rf"^{re.escape(key)}='{value}': allowed: {re.escape(allowed)}(; did you|$)"
    ):
        load_config(recipe="tiny", overrides=[f"{key}={value}"])


@pytest.mark.parametrize(
    "overrides, message",
    [
        (["rl.learner.micro_batch_packing=longest_first"], "allowed: longest-first, balanced, verl; did you mean 'longest-first'?"),
        (["rl.stare.top_ration=0.2"], "known: [" ),
        (["rl.stare.top_ration=0.2"], "; did you mean 'top_ratio'?"),
        (["rl.loss.aggregation=token_mean"], "did you mean 'token-mean'?"),
        (["rl.stare.scope=batches"], "did you mean 'batch'?"),
        (["rl.reweighting=random"], "did you mean 'random-tokens'?"),
        (["rl.algorithm=stare_c2"], "did you mean 'stare-c2'?"),
        (["rollout.engin=hf"], "did you mean 'engine'?"),
    ],
)  # fmt: skip
def test_an_unknown_word_or_key_is_answered_with_the_nearest(overrides, message):
    """As Gymnasium's registry answers "did you mean": a misspelt key or word names the nearest valid one."""
    with pytest.raises(ValueError) as caught:
        load_config(recipe="tiny", overrides=overrides)
    assert message in str(caught.value), str(caught.value)


def test_a_word_far_from_every_allowed_one_gets_no_suggestion():
    with pytest.raises(ValueError) as caught:
        load_config(recipe="tiny", overrides=["rl.stare.scope=zzzzzz"])
    assert "did you mean" not in str(caught.value) and "micro-batch, batch" in str(caught.value)


def test_every_sft_setting_reaches_the_sft_trainer_or_the_trainer():
    """Each sft.* field is either in the SFT trainer's config (sft_config) or one the trainer reads itself
    (SFTSection.TRAINER_FIELDS): a field neither uses would be a knob that does nothing."""
    from stare_agents.train.config import SFTSection
    from stare_agents.train.policy import OptimizerConfig
    from stare_agents.train.sft import SFTConfig

    changed = {
        "epochs": 3,
        "batch_size": 5,
        "lr": 1.25e-4,
        "warmup_steps": 7,
        "micro_batch_tokens": 777,
        "precision": "bf16",
        "seed": 3,
    }
    section = SFTSection(**changed)
    assert set(changed) | set(SFTSection.TRAINER_FIELDS) == {f.name for f in dataclasses.fields(SFTSection)}
    built = section.sft_config(seed=11, device="cpu")
    assert built == SFTConfig(
        optimizer=OptimizerConfig(lr=1.25e-4, warmup_steps=7),
        epochs=3,
        batch_size=5,
        micro_batch_tokens=777,
        precision="bf16",
        seed=3,  # sft.seed over the run's
        device="cpu",
    )
    assert SFTSection().sft_config(seed=11, device="cpu").seed == 11  # None: the run's seed
    default = SFTSection().sft_config(seed=0, device="cpu")
    for name in changed:  # every one of them changes what is built
        one = SFTSection(**{name: changed[name]}).sft_config(seed=0, device="cpu")
        assert one != default, name


@pytest.mark.parametrize("value", ["-1", "abc", "true", "1.5"])
def test_a_bad_sft_seed_is_refused_naming_the_key(value):
    with pytest.raises(ValueError, match=r"sft\.seed"):
        load_config(recipe="tiny", overrides=[f"sft.seed={value}"])


def test_a_fixed_sft_seed_holds_over_the_run_seed():
    """sft.seed fixes the cold start's example order for every run seed; unset, the order follows the run's seed."""
    fixed = [load_config(recipe="tiny", overrides=[f"seed={s}", "sft.seed=0"]) for s in (1, 2)]
    assert {c.sft.sft_config(seed=c.seed, device="cpu").seed for c in fixed} == {0}
    free = [load_config(recipe="tiny", overrides=[f"seed={s}"]) for s in (1, 2)]
    assert [c.sft.sft_config(seed=c.seed, device="cpu").seed for c in free] == [1, 2]


def test_every_benchmark_setting_reaches_the_eval_harness():
    """Each eval.benchmarks[i] field but the benchmark's name (which load_benchmark reads) changes the harness
    settings that BenchmarkEval.eval_config builds, and the run's engine, sandbox and seed come with them."""
    from stare_agents.train.config import BenchmarkEval

    run = load_config(recipe="tiny", overrides=["seed=5", "rollout.sandbox=local"])
    changed = {
        "protocol": "cot",
        "k": 4,
        "limit": 3,
        "temperature": 0.5,
        "top_p": 0.9,
        "max_turns": 2,
        "max_tokens_per_turn": 64,
        "max_total_tokens": 256,
    }
    assert set(changed) | {"benchmark"} == {f.name for f in dataclasses.fields(BenchmarkEval)}
    default = BenchmarkEval(benchmark="x").eval_config(run)
    assert (default.engine, default.sandbox, default.seed) == ("hf", "local", 5)
    for name, value in changed.items():
        assert BenchmarkEval(benchmark="x", **{name: value}).eval_config(run) != default, name


# a value other than the default for each rollout.* field (on the tiny recipe with the vLLM engine)
ROLLOUT_VALUES = {
    "engine": "hf",
    "temperature": "0.5",
    "max_tokens_per_turn": "33",
    "max_total_tokens": "129",
    "rendering": "chat",
    "sandbox": "local",
    "sandbox_pool_size": "3",
    "sandbox_kwargs": "{limits: {memory_mb: 1024}}",
    "max_concurrency": "7",
    "kv_cache_gib": "3",
    "multiprocess": "true",
    "env_processes": "2",
    "sandbox_low_priority": "false",
    "num_cpus_per_worker": "2",
    "num_gpus_per_worker": "0.5",
    "timeout_s": "99",
    "gpu_memory_utilization": "0.3",
    "tensor_parallel_size": "2",
    "max_num_seqs": "8",
    "engine_kwargs": "{enforce_eager: true}",
    "placement": "PACK",
    "resources_per_worker": "{foo: 1}",
}


def test_every_rollout_setting_reaches_the_workers_or_the_trainer():
    """Each rollout.* field changes what TrainConfig.worker_spec / rollout_config build, or is one the trainer
    reads itself (RolloutSection.TRAINER_FIELDS); top_p is refused at any value but 1 for training (the
    learner scores the full distribution), and env_cpus needs environment processes."""
    from stare_agents.train.config import RolloutSection

    fields = {f.name for f in dataclasses.fields(RolloutSection)}
    assert set(ROLLOUT_VALUES) | set(RolloutSection.TRAINER_FIELDS) | {"top_p", "env_cpus"} == fields

    def built(*overrides: str) -> tuple:
        config = load_config(recipe="tiny", overrides=["rollout.engine=vllm", *overrides])
        return config.worker_spec("m"), config.rollout_config(), config.rollout_config(evaluation=True)

    needs = {"tensor_parallel_size": ("rollout.num_gpus_per_worker=2",)}  # a sharded engine needs its GPUs
    for name, value in ROLLOUT_VALUES.items():
        given = needs.get(name, ())
        assert built(*given, f"rollout.{name}={value}") != built(*given), name
    with_processes = ("rollout.use_ray=true", "rollout.env_processes=1")
    assert built(*with_processes, "rollout.env_cpus=[0]") != built(*with_processes)
    with pytest.raises(ValueError, match="top_p"):
        built("rollout.top_p=0.9")


def test_the_runs_sandbox_wins_over_a_sandbox_in_env_kwargs():
    """Given the run's sandbox, make_env refuses env_kwargs naming another: before, `sandbox: None` there gave
    the python tool the process-wide Docker sandbox in a run that said `sandbox: none`."""
    from stare_agents.rollout import RolloutTask, make_env

    task = RolloutTask("stare_agents/ArithmeticTIR-v0", env_kwargs={"sandbox": None})
    with pytest.raises(
        ValueError, match=r"env_kwargs.sandbox=None conflicts with the run's sandbox \(NoSandbox\)"
    ):
        make_env(task, NoSandbox())
    run_sandbox = NoSandbox()
    same = make_env(
        RolloutTask("stare_agents/ArithmeticTIR-v0", env_kwargs={"sandbox": run_sandbox}), run_sandbox
    )
    assert same.unwrapped.tools()["python"].sandbox is run_sandbox
    same.close()
