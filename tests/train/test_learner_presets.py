"""Every preset changes the learner's update as it claims, from the same model, batch and advantages
(the advantage-stage claims, dynamic sampling and overlong shaping, are in tests/algo/test_presets.py)."""

import pytest
import torch
from learner_support import make_learner, max_param_diff, peaked_model, step_inputs

from stare_agents.algo import PRESETS, AlgorithmConfig


@pytest.fixture(scope="module")
def step_data():
    _, batch, advantages = step_inputs(10)
    advantages = advantages * 2  # |A| ~ 1.7: Clip-Cov's covariance band [1, 5] holds tokens
    probe = make_learner(model=peaked_model())
    logprobs = probe.token_stats(batch).logprob
    noise = torch.randn(logprobs.shape, generator=torch.Generator().manual_seed(0)) * 0.3
    # rollout log-probs off the learner's by ~0.3 nats: ratios away from 1, so the clips take part
    batch.rollout_logprobs = torch.where(batch.action_mask > 0, logprobs + noise, 0.0)
    return batch, advantages


def _run(algorithm, step_data, **config):
    batch, advantages = step_data
    learner = make_learner(algorithm, model=peaked_model(), old_logprobs="rollout", **config)
    return learner, learner.step(batch, advantages)


@pytest.fixture(scope="module")
def grpo_ds(step_data):
    return _run("grpo-ds", step_data)


# preset -> does its learner update differ from GRPO-ds's on this batch?
CHANGES_THE_UPDATE = {
    "grpo": True,  # symmetric clip 0.2, seq-mean-token-mean
    "grpo-ds": False,
    "dapo": False,  # overlong shaping acts on the rewards, before the learner
    "stare": False,  # entropy ~2.6 is above the 0.3 target: the gate stays off
    "stare-c2": False,
    "stare-random": False,  # the same gate, off
    "entropy-bonus": True,
    "clip-cov": True,
    "kl-cov": True,
    "entrocraft": True,  # entropy above the upper bound: only positive advantages are kept
}


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_each_preset_changes_the_update_as_claimed(name, step_data, grpo_ds):
    learner, metrics = _run(name, step_data)
    diff = max_param_diff(learner.model, grpo_ds[0].model)
    assert (diff > 1e-6) is CHANGES_THE_UPDATE[name], diff
    if not CHANGES_THE_UPDATE[name]:
        assert diff == 0.0
    assert metrics["stare/gate_on"] == 0.0
    if AlgorithmConfig.preset(name).loss.aggregation == "token-mean":
        assert metrics["learner/entropy"] == pytest.approx(grpo_ds[1]["learner/entropy"])
    else:  # GRPO: the gate entropy is aggregated like its loss, a mean of per-sequence means
        batch = step_data[0]
        entropy = make_learner(model=peaked_model()).token_stats(batch).entropy  # the pre-update policy
        mask = batch.action_mask > 0
        per_seq = (entropy * mask).sum(-1) / mask.sum(-1)
        assert metrics["learner/entropy"] == pytest.approx(float(per_seq.mean()), rel=1e-5)
        assert metrics["learner/entropy"] != pytest.approx(grpo_ds[1]["learner/entropy"], abs=1e-3)


def test_stare_presets_with_the_gate_on_reweight_l_plus_and_c2_also_l_minus(step_data, grpo_ds):
    runs = {}
    for name in ("stare", "stare-c2"):
        algorithm = AlgorithmConfig.preset(name)
        algorithm.stare.target_entropy = 5.0  # above the entropy: the gate opens
        runs[name] = _run(algorithm, step_data)
        assert runs[name][1]["stare/gate_on"] == 1.0 and runs[name][1]["stare/lplus_share"] > 0
        assert max_param_diff(runs[name][0].model, grpo_ds[0].model) > 1e-6
    assert max_param_diff(runs["stare"][0].model, runs["stare-c2"][0].model) > 1e-6
    # open loop: gated=False reweights although the gate is off
    open_loop = AlgorithmConfig.preset("stare")
    open_loop.stare.gated = False
    learner, metrics = _run(open_loop, step_data)
    assert metrics["stare/gate_on"] == 1.0 and not learner.reweighting.method.gate.active
    assert max_param_diff(learner.model, runs["stare"][0].model) == 0.0


def test_the_random_token_control_reweights_as_many_tokens_as_stare_but_other_ones(step_data, grpo_ds):
    runs = {}
    for name in ("stare", "stare-random"):
        algorithm = AlgorithmConfig.preset(name)
        algorithm.stare.target_entropy = 5.0  # the gate opens
        learner = make_learner(algorithm, model=peaked_model(), old_logprobs="rollout")
        runs[name] = learner, learner.step(*step_data, record_tokens=True)  # keep each token's selection
    (stare, stare_metrics), (control, control_metrics) = runs["stare"], runs["stare-random"]
    assert control_metrics["stare/gate_on"] == 1.0 and control_metrics["stare/w"] == stare_metrics["stare/w"]
    assert control_metrics["stare/lplus_share"] == stare_metrics["stare/lplus_share"] > 0  # as many tokens
    assert max_param_diff(control.model, grpo_ds[0].model) > 1e-6  # it reweights
    assert max_param_diff(control.model, stare.model) > 1e-6  # other tokens than STARE's
    picked = {
        name: {
            (row, j)
            for row, r in result.token_records.items()
            for j, c in enumerate(r.selection)
            if c == 1
        }
        for name, (_, result) in runs.items()
    }
    assert picked["stare"] != picked["stare-random"]
    surprisal = {}  # STARE takes the highest-surprisal T+ tokens: the control's are no higher on average
    for name, (_, result) in runs.items():
        values = [-result.token_records[row].learner_logprobs[j] for row, j in picked[name]]
        surprisal[name] = sum(values) / len(values)
    assert surprisal["stare"] > surprisal["stare-random"]


def test_adaptive_w_follows_the_entropy_and_reaches_the_weights(step_data):
    algorithm = AlgorithmConfig.preset("stare")
    algorithm.stare.target_entropy, algorithm.stare.adaptive, algorithm.stare.alpha = 5.0, True, 0.1
    learner, metrics = _run(algorithm, step_data)
    assert metrics["stare/w"] == pytest.approx(1.2) and metrics["stare/m"] == pytest.approx(0.8)
    fixed = AlgorithmConfig.preset("stare")
    fixed.stare.target_entropy, fixed.stare.w = 5.0, 1.2
    reference, _ = _run(fixed, step_data)
    assert max_param_diff(learner.model, reference.model) == 0.0  # the step used the updated w = 1.2
