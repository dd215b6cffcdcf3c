"""The trainer holds a `TrainingLearner`: `Learner` and `LearnerGroup` both have every member it names, and the
trainer never asks which one it holds (no isinstance / hasattr / getattr on the learner)."""

import inspect
import re
from pathlib import Path

from stare_agents.train.distributed import LearnerGroup
from stare_agents.train.learner import Learner, TrainingLearner

ROOT = Path(__file__).resolve().parents[2]


def members(cls) -> set[str]:
    names = {name for name in vars(cls) if not name.startswith("_")}
    return names | set(getattr(cls, "__annotations__", {}))


def test_both_learners_have_every_member_the_trainer_uses():
    wanted = members(TrainingLearner)
    assert {"step", "save_checkpoint", "resume", "hf_model", "close", "gate_on", "sender"} <= wanted
    for cls in (Learner, LearnerGroup):
        source = inspect.getsource(cls)
        missing = sorted(
            name
            for name in wanted
            if not hasattr(cls, name) and not re.search(rf"self\.{name}\b\s*(:[^=]*)?=", source)
        )
        assert missing == [], f"{cls.__name__} lacks {missing}"
    step = inspect.signature(TrainingLearner.step).parameters
    for cls in (Learner, LearnerGroup):
        assert list(inspect.signature(cls.step).parameters) == list(step), cls.__name__


def test_the_trainer_never_asks_which_learner_it_holds():
    source = (ROOT / "train" / "trainer.py").read_text()
    asks = re.findall(r"(?:isinstance|hasattr|getattr)\(\s*learner\b", source)
    assert asks == []
    assert "isinstance(learner" not in (ROOT / "stare_agents" / "rollout_log.py").read_text()
    assert "getattr(learner" not in (ROOT / "stare_agents" / "rollout_log.py").read_text()


def test_both_sft_trainers_have_what_the_trainer_uses_and_it_never_asks_which():
    """SFTTrainer (this process) and SFTGroup (data-parallel workers) answer the same calls: a fit in pieces,
    its checkpoint and resume, the fine-tuned model."""
    from stare_agents.train.distributed import SFTGroup
    from stare_agents.train.sft import SFTTrainer

    for name in ("fit", "fitting", "save_checkpoint", "resume", "hf_model", "close"):
        for cls in (SFTTrainer, SFTGroup):
            source = inspect.getsource(cls)
            assert hasattr(cls, name) or re.search(rf"self\.{name}\b\s*(:[^=]*)?=", source), (cls, name)
    for name in ("fit", "save_checkpoint", "resume", "hf_model"):
        a = [p for p in inspect.signature(getattr(SFTTrainer, name)).parameters if p != "progress"]
        assert a == list(inspect.signature(getattr(SFTGroup, name)).parameters), name
    source = (ROOT / "train" / "trainer.py").read_text()
    assert re.findall(r"(?:isinstance|hasattr|getattr)\(\s*sft\b", source) == []
