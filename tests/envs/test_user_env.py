"""A user's own environment is first-class: imported with --import (or gymnasium's module:Name-v0), checked by
`stare-agents envs check`, its kwargs checked, its own SFT solver found; and every registered environment runs
in Gymnasium's async vector environment with the default shared memory."""

from __future__ import annotations

import sys
import textwrap

import gymnasium as gym
import pytest
from typer.testing import CliRunner

import stare_agents.envs  # noqa: F401  (registers the ids)
from stare_agents.envs.core import MessagesSpace, SharedMessages
from stare_agents.envs.registration import (
    ENVIRONMENTS,
    accepted_kwargs,
    env_class,
    has_solver,
    resolve_env_id,
    unknown_kwargs,
)
from stare_agents.sandbox import NoSandbox

USER_MODULE = '''
import gymnasium as gym

from stare_agents.envs import Score, Task, ToolEnv, extract_boxed


class AddEnv(ToolEnv):
    """Add two numbers; the policy may run Python, then answers in \\\\boxed{}."""

    default_max_turns = 2

    def __init__(self, *, digits: int = 3, **kwargs):
        super().__init__(**kwargs)
        if digits < 1:
            raise ValueError(f"digits must be >= 1, got {digits}")
        self.digits = digits

    def sample_task(self) -> Task:
        low, high = 10 ** (self.digits - 1), 10**self.digits
        a, b = (int(self.np_random.integers(low, high)) for _ in range(2))
        return Task(problem=f"What is {a} + {b}?", answer=str(a + b), id=f"add-{a}-{b}", data={"a": a, "b": b})

    def score(self, task: Task, response: str) -> Score:
        answer = extract_boxed(response)
        correct = answer is not None and answer.strip() == task.answer
        return Score(float(correct), "correct" if correct else "wrong", correct, answer)

    def solution_code(self, task: Task) -> str:
        return f"print({task.data['a']} + {task.data['b']})"


class NoSolverEnv(AddEnv):
    solution_code = ToolEnv.solution_code


gym.register("{module}/Add-v0", entry_point=AddEnv)
gym.register("{module}/NoSolver-v0", entry_point=NoSolverEnv)
'''


@pytest.fixture
def user_module(tmp_path, monkeypatch, request):
    """A module in a temporary folder on sys.path that registers {name}/Add-v0 when imported (not before)."""
    name = f"user_envs_{request.node.name[-40:].replace('[', '_').replace(']', '_').replace('-', '_')}"
    (tmp_path / f"{name}.py").write_text(textwrap.dedent(USER_MODULE).replace("{module}", name))
    monkeypatch.syspath_prepend(str(tmp_path))
    yield name
    sys.modules.pop(name, None)
    for env_id in (f"{name}/Add-v0", f"{name}/NoSolver-v0"):
        gym.registry.pop(env_id, None)


def test_a_user_env_is_found_with_import_or_module_colon_id(user_module):
    with pytest.raises(ValueError, match=rf"unknown environment '{user_module}/Add-v0'.*--import MODULE"):
        resolve_env_id(f"{user_module}/Add-v0")
    assert resolve_env_id(f"{user_module}:{user_module}/Add-v0") == f"{user_module}/Add-v0"
    assert resolve_env_id(f"{user_module}/Add-v0", [user_module]) == f"{user_module}/Add-v0"
    with pytest.raises(ValueError, match=r"cannot import 'no_such_module_x'.*ModuleNotFoundError"):
        resolve_env_id("no_such_module_x:x/Y-v0")
    # the constructor's keywords, through the base classes' **kwargs
    accepted = accepted_kwargs(f"{user_module}/Add-v0")
    assert {"digits", "max_turns", "tool_timeout_s", "stateless", "dataset", "system_prompt"} <= accepted
    assert unknown_kwargs(f"{user_module}/Add-v0", {"digits": 2, "kinds": ["multiply"]}) == ["kinds"]
    assert has_solver(f"{user_module}/Add-v0") and not has_solver(f"{user_module}/NoSolver-v0")
    assert has_solver("stare_agents/ArithmeticTIR-v0") and not has_solver("stare_agents/MathTIR-v0")


def test_the_builtin_envs_accept_exactly_their_keywords():
    assert unknown_kwargs("stare_agents/MathCoT-v0", {"cot": "long", "digits": 4, "tool_timeout_s": 3}) == [
        "digits",
        "tool_timeout_s",
    ]
    assert unknown_kwargs("stare_agents/ArithmeticTIR-v0", {"digits": 4, "kinds": ["multiply"]}) == []
    for env_id in ENVIRONMENTS:
        assert "max_turns" in accepted_kwargs(env_id), env_id


@pytest.mark.docker
@pytest.mark.timeout(300)
def test_envs_check_runs_a_user_env_imported_with_import(user_module):
    from stare_agents.cli import app

    runner = CliRunner()
    result = runner.invoke(app, ["envs", "check", f"{user_module}/Add-v0", "--import", user_module])
    assert result.exit_code == 0, result.output
    assert f"ok {user_module}/Add-v0 passed check_env" in result.output
    result = runner.invoke(
        app, ["envs", "check", f"{user_module}:{user_module}/Add-v0", "--env-kwargs", '{"digits": 2}']
    )
    assert result.exit_code == 0, result.output


def test_envs_check_refuses_unknown_ids_and_keywords_before_making_anything(user_module):
    from stare_agents.cli import app

    runner = CliRunner()
    result = runner.invoke(app, ["envs", "check", f"{user_module}/Add-v0"])  # not imported
    assert result.exit_code == 2 and f"unknown environment '{user_module}/Add-v0'" in result.output
    result = runner.invoke(
        app,
        ["envs", "check", f"{user_module}/Add-v0", "--import", user_module, "--env-kwargs", '{"digitz": 2}'],
    )
    assert result.exit_code == 2
    assert "takes no keyword 'digitz' (value 2)" in result.output and "'digits'" in result.output
    result = runner.invoke(app, ["envs", "check", "stare_agents/MathCoT-v0", "--env-kwargs", "[1]"])
    assert result.exit_code == 2 and "expected a JSON object" in result.output


def test_the_user_envs_solver_writes_verified_traces(user_module, tmp_path):
    from transformers import AutoTokenizer

    from stare_agents.models import prepare_model
    from stare_agents.sandbox import LocalSandbox
    from stare_agents.train.traces import solver_traces

    resolve_env_id(f"{user_module}/Add-v0", [user_module])
    tokenizer = AutoTokenizer.from_pretrained(prepare_model("tiny"))
    eos = {tokenizer.eos_token_id}
    with LocalSandbox(1, allow_host_execution=True) as sandbox:
        traces = solver_traces(
            f"{user_module}/Add-v0", [0, 1, 2], tokenizer, eos, env_kwargs={"digits": 2}, sandbox=sandbox
        )
        with pytest.raises(ValueError, match=r"NoSolver-v0' has no solver \(ToolEnv.solution_code"):
            solver_traces(f"{user_module}/NoSolver-v0", [0], tokenizer, eos, sandbox=sandbox)
    assert len(traces) == 3 and all(t.correct and t.reward == 1.0 for t in traces)
    env = gym.make(f"{user_module}/Add-v0", digits=2, sandbox=NoSandbox())
    env.reset(seed=1)
    task = env.unwrapped.task
    assert traces[1].turns[0].text == f"```python\nprint({task.data['a']} + {task.data['b']})\n```"
    assert f"\\boxed{{{task.answer}}}" in traces[1].turns[1].text


def _env_kwargs(env_id: str) -> dict:
    return {"sandbox": NoSandbox()} if getattr(env_class(env_id), "uses_sandbox", False) else {}


@pytest.mark.timeout(300)
@pytest.mark.parametrize("env_id", sorted(ENVIRONMENTS))
def test_every_registered_env_runs_in_an_async_vector_env_with_gymnasiums_defaults(env_id):
    single = gym.make(env_id, **_env_kwargs(env_id))
    expected = [single.reset(seed=seed)[0] for seed in (7, 8)]  # make_vec seeds env i with seed + i
    vector = gym.make_vec(env_id, num_envs=2, vectorization_mode="async", **_env_kwargs(env_id))
    try:
        observations, _ = vector.reset(seed=7)
        assert isinstance(observations, tuple) and list(observations) == expected
        observations, rewards, terminated, truncated, _ = vector.step(["no answer", "still none"])
        assert len(observations) == 2 and all(isinstance(o, list) for o in observations)
        assert rewards.shape == (2,) and terminated.shape == (2,) and truncated.shape == (2,)
    finally:
        vector.close()


def test_shared_memory_holds_unicode_and_refuses_an_observation_too_large_for_it():
    import multiprocessing

    from gymnasium.vector.utils import create_shared_memory, read_from_shared_memory, write_to_shared_memory

    space = MessagesSpace(shared_memory_bytes=256)
    memory = create_shared_memory(space, n=2, ctx=multiprocessing)
    view = read_from_shared_memory(space, memory, n=2)
    assert isinstance(view, SharedMessages) and list(view) == [[], []]  # nothing written yet
    message = {"role": "tool", "content": "ünïcødé ✓ \x00", "inline": "π"}
    write_to_shared_memory(space, 1, [message], memory)
    assert view[1] == [message] and view[0] == []  # a live view: writes after the read show
    with pytest.raises(
        ValueError, match=r"does not fit the 248 bytes.*shared_memory': False.*shared_memory_bytes"
    ):
        write_to_shared_memory(space, 0, [{**message, "content": "x" * 300}], memory)
    assert view[1] == [message]  # the other environment's observation is untouched
    with pytest.raises(ValueError, match="shared_memory_bytes must be >= 64"):
        MessagesSpace(shared_memory_bytes=8)
