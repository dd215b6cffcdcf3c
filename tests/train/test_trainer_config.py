"""Training config: recipes, overrides, unknown keys, and fields read where they take effect."""

from __future__ import annotations

import pytest

from stare_agents.train.config import TrainConfig, load_config, recipe_names
from stare_agents.train.rl_loop import training_tasks
from stare_agents.train.trainer import Trainer


def test_every_recipe_loads_and_builds_its_algorithm():
    names = recipe_names()
    assert {
        "tiny",
        "smollm2-arith",
        "qwen2.5-7b-tir-stare-c2",
        "qwen2.5-7b-tir-grpo-ds",
        "qwen2.5-7b-zero-tir-grpo-ds",
    } <= set(names)
    assert {"short-cot-qwen2.5-math-7b", "long-cot-r1-distill-qwen-1.5b", "long-cot-qwen3-8b"} <= set(names)
    for name in names:
        config = load_config(recipe=name)
        algorithm = config.algorithm()
        assert algorithm.name == config.rl.algorithm


def test_the_paper_tool_use_recipes_hold_the_paper_settings():
    c2 = load_config(recipe="qwen2.5-7b-tir-stare-c2")
    algo = c2.algorithm()
    assert (
        algo.stare.variant,
        algo.stare.top_ratio,
        algo.stare.w,
        algo.stare.m,
        algo.stare.target_entropy,
    ) == ("C2", 0.1, 1.1, 0.9, 0.3)
    assert (c2.rl.learner.optimizer.lr, c2.rl.prompts_per_step, c2.rl.samples_per_prompt) == (1e-6, 64, 8)
    assert (c2.rollout.temperature, c2.rollout.max_total_tokens, c2.sft.enabled) == (1.0, 3072, True)
    twin = load_config(recipe="qwen2.5-7b-tir-grpo-ds")
    assert twin.algorithm().stare is None and twin.algorithm().name == "grpo-ds"
    simple = load_config(recipe="qwen2.5-7b-zero-tir-grpo-ds")
    assert simple.rl.drop_void_turns and simple.env.kwargs["stateless"] is True
    assert (
        simple.env.kwargs["observation_format"] == "code_execution_result"
        and simple.env.kwargs["max_obs_chars"] == 512
    )


def test_overrides_are_typed_and_unknown_keys_are_refused():
    config = load_config(
        recipe="tiny",
        overrides=[
            "rl.steps=7",
            "rl.algorithm=stare-c2",
            "rl.stare.w=1.3",
            "rollout.temperature=0.7",
        ],
    )
    assert config.rl.steps == 7 and config.rollout.temperature == 0.7 == config.rl.learner.temperature
    algo = config.algorithm()
    assert algo.stare.variant == "C2" and algo.stare.w == 1.3
    assert (
        load_config(recipe="tiny", overrides=["rl.learner.optimizer.lr=3e-6"]).rl.learner.optimizer.lr == 3e-6
    )
    with pytest.raises(ValueError, match="unknown key"):
        load_config(recipe="tiny", overrides=["rl.stepz=3"])
    with pytest.raises(ValueError, match=r"rl\.steps='many': allowed: an int"):
        load_config(recipe="tiny", overrides=["rl.steps=many"])
    with pytest.raises(ValueError, match="sampling_rounds"):
        load_config(recipe="tiny", overrides=["rl.sampling_rounds=0"])
    with pytest.raises(ValueError, match="key=value"):
        load_config(recipe="tiny", overrides=["rl.steps"])
    with pytest.raises(ValueError, match=r"unknown key\(s\) \['wq'\] in 'rl.stare'"):
        load_config(recipe="tiny", overrides=["rl.stare.wq=1"])
    with pytest.raises(ValueError, match=r"rl\.algorithm=grpo has no stare"):
        load_config(recipe="tiny", overrides=["rl.algorithm=grpo", "rl.stare.w=1.2"])
    with pytest.raises(FileNotFoundError, match="recipes"):
        load_config(recipe="no-such-recipe")


def test_trainer_reads_the_task_and_sampling_fields(tmp_path):
    config = load_config(
        recipe="tiny",
        overrides=[
            f"out_dir={tmp_path / 'run'}",
            "env.train_seed=100",
            "rl.prompts_per_step=3",
            "rl.samples_per_prompt=2",
            "rollout.temperature=0.8",
            "eval.temperature=0.0",
        ],
    )
    tasks = training_tasks(config, position=6)  # prompts 6, 7, 8 of the run: seeds 106, 107, 108
    assert [(t.seed, t.sample_index) for t in tasks] == [
        (106, 0),
        (106, 1),
        (107, 0),
        (107, 1),
        (108, 0),
        (108, 1),
    ]
    # ArithmeticTIR takes a split: training draws from split="train", evaluation from the held-out split
    assert all(
        t.env_id == config.env.id and t.env_kwargs == {**config.env.kwargs, "split": "train"} for t in tasks
    )
    sampling = config.rollout_config()
    assert (sampling.temperature, sampling.top_p, sampling.max_tokens_per_turn) == (0.8, 1.0, 32)
    assert config.rollout_config(evaluation=True).temperature == 0.0
    Trainer(config)  # writes the run folder
    with pytest.raises(FileExistsError, match="--resume"):
        (tmp_path / "run" / "x").write_text("")
        Trainer(config)
    assert isinstance(TrainConfig().rl.learner.optimizer.lr, float)


def test_resuming_with_another_configuration_is_refused(tmp_path):
    config = load_config(recipe="tiny", overrides=[f"out_dir={tmp_path / 'run'}"])
    Trainer(config)  # writes config.yaml
    Trainer(load_config(recipe="tiny", overrides=[f"out_dir={tmp_path / 'run'}", "rl.steps=9"]), resume=True)
    with pytest.raises(FileExistsError, match=r"rl\.prompts_per_step"):
        Trainer(
            load_config(recipe="tiny", overrides=[f"out_dir={tmp_path / 'run'}", "rl.prompts_per_step=5"]),
            resume=True,
        )


def test_heldout_tasks_are_distinct_and_never_drawn_by_training(tmp_path):
    import gymnasium as gym

    from stare_agents.envs.arithmetic import is_heldout

    config = load_config(
        recipe="tiny", overrides=[f"out_dir={tmp_path / 'run'}", "eval.num_tasks=40", "eval.base_num_tasks=8"]
    )
    trainer = Trainer(config)
    heldout = trainer.evaluation.heldout_tasks(40)
    assert len({t.problem for t in heldout}) == 40 and all(is_heldout(t.problem) for t in heldout)
    assert [t.id for t in trainer.evaluation.heldout_tasks(8)] == [
        t.id for t in heldout[:8]
    ]  # the base model's are a prefix
    env = gym.make(config.env.id, **training_tasks(config, 0)[0].env_kwargs)
    drawn = set()
    for position in range(0, 400, config.rl.prompts_per_step):
        for task in training_tasks(config, position)[:: config.rl.samples_per_prompt]:
            env.reset(seed=task.seed)
            drawn.add(env.unwrapped.task.problem)
    assert not drawn & {t.problem for t in heldout}


def test_the_step_record_counts_reflection_words_of_every_sampling_round(tmp_path):
    """A dynamic-sampling step that refilled: its reflection words are those of every round's trajectories
    (they were the last round's only)."""
    from stare_agents.train.rl_loop import SampledStep, step_record
    from stare_agents.trajectory import Trajectory, TurnRecord

    def trajectory(text: str, group: str) -> Trajectory:
        ids = [1, 2, 3]
        return Trajectory([0], ids, [1, 1, 1], [-0.5] * 3, group_id=group, turns=[TurnRecord(text, 3, "eos")])

    first_round = [trajectory("Wait, hmm. Let me check.", "a"), trajectory("Fine.", "a")]
    second_round = [trajectory("Done.", "b"), trajectory("Done.", "b")]
    everything = first_round + second_round
    sampled = SampledStep(trajectories=everything, usable=everything, kept=second_round, rounds=2, groups=2)
    config = load_config(recipe="tiny", overrides=[f"out_dir={tmp_path / 'run'}"])
    record = step_record(config, 0, config.algorithm(), sampled, {}, {"rollout": 1.0})
    assert record["reflection_words"]["hesitation"] == 2 / 4  # "Wait" and "hmm" over four usable trajectories
    assert record["data/sampling_rounds"] == 2 and record["data/kept_trajectories"] == 2


def test_the_hold_recipe_is_the_long_recipe_with_the_chosen_stare_settings():
    """smollm2-arith-hold differs from smollm2-arith-long only where its comment says: the STARE weights (W 1 and
    M 0.25 fixed, gated on every sampled trajectory) and RL's precision (`fast`), so that the two stay comparable."""
    import dataclasses

    long, hold = load_config(recipe="smollm2-arith-long"), load_config(recipe="smollm2-arith-hold")
    stare = hold.algorithm().stare
    assert (stare.variant, stare.gated, stare.adaptive, stare.w, stare.m) == ("C2", True, False, 1.0, 0.25)
    assert (stare.gate_input, stare.target_entropy, stare.top_ratio) == ("all", 0.3, 0.1)
    assert (hold.model.rollout_dtype, hold.rl.learner.precision) == ("fast", "fast")
    a, b = dataclasses.asdict(long), dataclasses.asdict(hold)
    for config in (a, b):
        config.pop("name"), config.pop("out_dir")
        config["model"].pop("rollout_dtype"), config["rl"]["learner"].pop("precision")
        config["rl"]["algo"]["stare"] = None
    assert a == b
