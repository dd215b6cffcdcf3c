"""Saved rollouts: the learner's per-token records, the step files' round trip, sampling, hostile text."""

from __future__ import annotations

import gzip
import math

import pytest
import torch
from learner_support import make_learner, peaked_model, step_inputs

from stare_agents.algo import AlgorithmConfig
from stare_agents.rollout_log import (
    RolloutLog,
    SavedRollout,
    keep_group,
    read_rollouts,
    saved_steps,
    step_file,
    token_texts,
    write_step,
)
from stare_agents.trajectory import Trajectory, TurnRecord


def stare_always_on() -> AlgorithmConfig:
    algorithm = AlgorithmConfig.preset("stare")
    algorithm.stare.target_entropy = 100.0  # the gate is on whatever the entropy
    algorithm.stare.variant = "C2"  # L- attenuated too
    return algorithm


def test_learner_records_tokens_only_when_asked():
    _, batch, advantages = step_inputs()
    learner = make_learner(stare_always_on(), model=peaked_model())
    result = learner.step(batch, advantages)
    assert result.token_records == {} and result.gate_on is True  # opt-in: nothing kept by default
    assert not hasattr(learner, "last_token_data")  # the step returns its records, never leaves them


def test_learner_token_records_match_the_step():
    trajectories, batch, advantages = step_inputs()
    algorithm = stare_always_on()
    learner = make_learner(algorithm, model=peaked_model(), micro_batch_tokens=200)  # several micro-batches
    pre = learner.token_stats(batch)  # the pre-update policy's log-probs, before the step changes it
    metrics = learner.step(batch, advantages, record_tokens=True)
    assert metrics["stare/gate_on"] == 1.0
    assert sorted(metrics.token_records) == list(range(len(trajectories)))
    lplus = lminus = 0
    for row, t in enumerate(trajectories):
        record = metrics.token_records[row]
        n = len(t.response_ids)
        assert len(record.learner_logprobs) == len(record.stare_weights) == len(record.selection) == n
        assert len(record.entropy) == n
        for j, bit in enumerate(t.action_mask):
            if not bit:  # observation tokens: never selected, never weighted, no log-prob, no entropy
                assert (
                    record.selection[j],
                    record.stare_weights[j],
                    record.learner_logprobs[j],
                    record.entropy[j],
                ) == (0, 1.0, 0.0, 0.0)
                continue
            assert math.isclose(record.learner_logprobs[j], float(pre.logprob[row, j]), abs_tol=1e-4)
            assert math.isclose(record.entropy[j], float(pre.entropy[row, j]), abs_tol=1e-4)
            assert record.entropy[j] > 0  # the peaked model is still uncertain at every position
            expected = {1: learner.reweighting.method.w, -1: learner.reweighting.method.m, 0: 1.0}[record.selection[j]]
            assert math.isclose(record.stare_weights[j], expected, rel_tol=1e-6)
            sign = float(advantages[row])
            if record.selection[j] == 1:
                assert sign > 0
            if record.selection[j] == -1:
                assert sign < 0
        lplus += record.selection.count(1)
        lminus += record.selection.count(-1)
    actions = metrics["learner/action_tokens"]
    assert lplus == round(metrics["stare/lplus_share"] * actions) and lplus > 0
    assert lminus == round(metrics["stare/lminus_share"] * actions) and lminus > 0


def test_recording_leaves_the_update_unchanged():
    _, batch, advantages = step_inputs()
    a = make_learner(stare_always_on(), model=peaked_model())
    b = make_learner(stare_always_on(), model=peaked_model())
    a.step(batch, advantages, record_tokens=True)
    b.step(batch, advantages)
    for (name, x), y in zip(a.model.state_dict().items(), b.model.state_dict().values(), strict=True):
        assert torch.equal(x, y), name


class CharTokenizer:
    """One token per UTF-8 byte (ids 0-255): enough to exercise token_texts on split characters."""

    def decode(self, ids, **_):
        return bytes(ids).decode("utf-8", errors="replace")

    def batch_decode(self, sequences, **_):
        return [self.decode(ids) for ids in sequences]


def test_token_texts_join_to_the_text_and_keep_split_characters_whole():
    text = "x=é€😀<script>\x00"
    ids = list(text.encode("utf-8"))
    pieces = token_texts(CharTokenizer(), ids)
    assert len(pieces) == len(ids) and "".join(pieces) == text
    assert "\ufffd" not in "".join(pieces)
    assert pieces[2] == "é" and pieces[3] == ""
    assert token_texts(CharTokenizer(), []) == []


def hostile_trajectory(group: str = "g0", reward: float = 1.0, index: int = 0) -> Trajectory:
    observation = "</script><script>window.pwned=1</script><img src=x onerror=alert(1)> <|im_end|>\x1b[31m"
    return Trajectory(
        prompt_ids=[1, 2, 3],
        response_ids=[10, 11, 12, 13, 14],
        action_mask=[1, 1, 0, 0, 1],
        rollout_logprobs=[-0.5, -2.25, 0.0, 0.0, -0.125],
        reward=reward,
        num_turns=2,
        stop_reason="answered",
        weight_version=3,
        turns=[
            TurnRecord("```python\nprint('<b>')\n```", 2, "stop", 1, ["ok"], observation, 2),
            TurnRecord("\\boxed{7}", 1, "eos"),
        ],
        info={"answer": "</script>"},
        task_id="t<0>",
        env_id="stare_agents/Test-v0",
        group_id=group,
        sample_index=index,
        correct=reward > 0,
    )


class Recorded:
    """A step's token records, for RolloutLog.write (the real thing is tested above)."""

    def __init__(self, data):
        from stare_agents.train.learner import TokenRecord

        self.token_records = {
            row: TokenRecord(logprobs, entropy=[], stare_weights=weights, selection=selection)
            for row, (logprobs, weights, selection) in data.items()
        }


def test_step_file_round_trip_with_statuses(tmp_path):
    kept = [hostile_trajectory("g0", 1.0, 0), hostile_trajectory("g0", 0.0, 1)]
    dropped = hostile_trajectory("g1", 1.0, 0)
    failed = hostile_trajectory("g2", 0.0, 0)
    failed.stop_reason, failed.error = "tool_failure", "sandbox died"
    void = hostile_trajectory("g3", 0.0, 0)
    void.stop_reason = "void_turn"
    learner = Recorded(
        {
            0: ([-0.5, -2.0, 0.0, 0.0, -0.1], [1.0, 1.1, 1.0, 1.0, 1.0], [0, 1, 0, 0, 0]),
            1: ([-0.4, -1.0, 0.0, 0.0, -3.0], [1.0, 1.0, 1.0, 1.0, 0.9], [0, 0, 0, 0, -1]),
        }
    )
    log = RolloutLog(tmp_path, tokenizer_dir=None)
    path = log.write(
        12,
        [*kept, dropped, failed, void],
        kept,
        torch.tensor([0.5, -0.5]),
        learner.token_records,
        gate_on=True,
        void_dropped=True,
    )
    assert path == step_file(tmp_path, 12) and path.name == "step-000012.jsonl.gz"
    assert saved_steps(tmp_path) == [12]
    saved = read_rollouts(tmp_path)
    assert [s.status for s in saved] == ["trained", "trained", "dropped", "failed", "void_turn"]
    assert [s.trajectory for s in saved] == [*kept, dropped, failed, void]  # the trajectory, unchanged
    assert [s.advantage for s in saved] == [0.5, -0.5, None, None, None]
    assert saved[0].stare_weights == [1.0, 1.1, 1.0, 1.0, 1.0] and saved[1].selection == [0, 0, 0, 0, -1]
    assert saved[2].learner_logprobs is None and saved[2].stare_weights is None
    assert read_rollouts(path) == saved == read_rollouts(tmp_path, step=12)
    with gzip.open(path, "rt") as handle:
        assert len(handle.read().splitlines()) == 5
    with pytest.raises(FileNotFoundError, match=r"steps saved: \[12\]"):
        read_rollouts(tmp_path, step=3)


def test_a_rewritten_step_replaces_the_file_whole(tmp_path):
    log = RolloutLog(tmp_path, tokenizer_dir=None)
    log.write(0, [hostile_trajectory(index=i) for i in range(4)], [], [])
    log.write(0, [hostile_trajectory()], [], [])  # a resumed run repeats step 0
    assert len(read_rollouts(tmp_path)) == 1
    assert not list((tmp_path / "rollouts").glob("*.tmp"))


def test_sampling_keeps_whole_groups_and_is_deterministic(tmp_path):
    trajectories = [hostile_trajectory(f"g{g}", float(i % 2), i) for g in range(40) for i in range(4)]
    RolloutLog(tmp_path, tokenizer_dir=None, fraction=0.25).write(5, trajectories, [], [])
    saved = read_rollouts(tmp_path, step=5)
    groups = {s.trajectory.group_id for s in saved}
    assert 0 < len(groups) < 40 and len(saved) == 4 * len(groups)
    assert groups == {f"g{g}" for g in range(40) if keep_group(5, f"g{g}", 0.25)}
    assert (
        RolloutLog(tmp_path / "none", tokenizer_dir=None, fraction=0.0).write(5, trajectories, [], []) is None
    )
    with pytest.raises(ValueError, match=r"in \[0, 1\]; got 1.5"):
        RolloutLog(tmp_path, tokenizer_dir=None, fraction=1.5)


def test_bad_files_and_records_say_what_is_wrong(tmp_path):
    with pytest.raises(FileNotFoundError, match="neither a run folder nor a rollout file"):
        read_rollouts(tmp_path / "missing.jsonl.gz")
    bad = tmp_path / "bad.jsonl.gz"
    with gzip.open(bad, "wt") as handle:
        handle.write('{"step": 1}\n')
    with pytest.raises(ValueError, match=r"bad\.jsonl\.gz:1: not a saved rollout"):
        read_rollouts(bad)
    with pytest.raises(ValueError, match="status must be one of"):
        SavedRollout(step=0, trajectory=hostile_trajectory(), status="kept")
    with pytest.raises(ValueError, match="stare_weights has 2 entries for 5 response tokens"):
        SavedRollout(step=0, trajectory=hostile_trajectory(), stare_weights=[1.0, 1.0])
    write_step(tmp_path, 1, [SavedRollout(step=1, trajectory=hostile_trajectory())])
    assert read_rollouts(tmp_path)[0].trajectory.turns[0].observation.startswith("</script>")
