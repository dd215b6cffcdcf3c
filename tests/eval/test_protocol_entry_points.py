"""A protocol's environment may be registered with any entry point Gymnasium accepts (issue 49, item 2): a
class (as the README's walk-through registers it), a "module:attr" string, a function or a partial; the turn
limit `eval` records is the one the episodes run with. An id registered with a vector entry point only is an
error that names it. The README walk-through test (tests/envs/test_import_from_current_folder.py) runs `eval` on the
class form end to end."""

from __future__ import annotations

import functools

import gymnasium as gym
import pytest

from stare_agents.envs import Score, Task, ToolEnv
from stare_agents.eval.benchmarks import Protocol


class MulEnv(ToolEnv):
    default_max_turns = 3

    def sample_task(self) -> Task:
        a, b = (int(x) for x in self.np_random.integers(2, 9, size=2))
        return Task(problem=f"{a}*{b}?", answer=str(a * b), id=f"mul-{a}-{b}")

    def score(self, task: Task, response: str) -> Score:
        return Score(0.0, "wrong", False, None)


def make_mul(**kwargs) -> MulEnv:
    return MulEnv(**{"max_turns": 5, **kwargs})


ENTRY_POINTS = {
    "class": (MulEnv, 3),
    "string": (f"{__name__}:MulEnv", 3),
    "function": (make_mul, 5),
    "partial": (functools.partial(MulEnv, max_turns=2), 2),
}
for form, (entry, _) in ENTRY_POINTS.items():
    gym.register(f"tests/Mul-{form}-v0", entry_point=entry, disable_env_checker=True)


@pytest.mark.parametrize("form", list(ENTRY_POINTS))
def test_a_protocol_takes_every_entry_point_gymnasium_takes(form: str):
    protocol = Protocol(name="mul", env_id=f"tests/Mul-{form}-v0")
    assert protocol.effective_max_turns() == ENTRY_POINTS[form][1]
    assert protocol.to_dict()["max_turns"] == ENTRY_POINTS[form][1]
    assert Protocol(name="mul", env_id=f"tests/Mul-{form}-v0", max_turns=4).effective_max_turns() == 4
    pinned = Protocol(name="mul", env_id=f"tests/Mul-{form}-v0", env_kwargs={"max_turns": 6})
    assert pinned.effective_max_turns() == 6


def test_an_id_without_an_entry_point_is_named():
    """Gymnasium registers an id with a vector entry point only; it has no single environment to evaluate."""
    gym.register("tests/Mul-none-v0", vector_entry_point=f"{__name__}:MulEnv", disable_env_checker=True)
    with pytest.raises(ValueError, match=r"tests/Mul-none-v0 is registered with entry_point=None"):
        Protocol(name="mul", env_id="tests/Mul-none-v0").effective_max_turns()
