"""Base classes: `TextEnv` (the policy writes text, the environment grades it) and `ToolEnv` (the text may
call tools, whose results come back as observations, over several turns).

The protocol, for both:

    obs, info = env.reset(seed=0)                      # obs: the prompt, a list of Messages
    obs, reward, terminated, truncated, info = env.step(model_text)

* An action is the policy's text for one turn (a `str`).
* An observation is a list of `Message`s (`role`, `content`, `inline`; see `stare_agents.envs.parsing`):
  the prompt after `reset`, what the environment answers after each `step` (tool results, feedback), and
  `[]` once the episode is over.
* The reward is 0 until the episode ends; the final step carries the episode's score, clipped into
  `reward_range` (a violation is reported in `info["reward_violation"]`).
* `terminated`: the episode ended on its own (a final answer, a void turn under the "end" policy, a tool's
  final answer). `truncated`: the turn limit (`max_turns`, which is `spec.max_episode_steps`, or a smaller
  `TimeLimit` around the environment) was reached first. Both end the episode; `step` afterwards raises
  `gymnasium.error.ResetNeeded` until `reset`.
* `step` never raises for what the policy writes; a step that raises (misuse, the sandbox failing) leaves
  the state as it was. `reset` validates the seed, the options and the task, raising with the remedy.
* `reset(options={"problem": ..., "answer": ...})` pins the task (extra keys go to `Task.data`);
  `options={"index": i}` picks row `i` of the dataset; `options={"task": Task(...)}` passes a task object.

A new environment subclasses one of them and overrides a few methods:

    sample_task(self) -> Task             draw a task with self.np_random      (required unless a dataset is given)
    validate_task(self, task) -> None     raise ValueError for an unusable task (default: it needs an answer)
    prompt(self, task) -> list[Message]   the first observation                (default: system prompt + template)
    score(self, task, response) -> Score  the episode's reward                 (default: math grading of \\boxed{})
    tools(self) -> dict[str, ToolLike]    ToolEnv only: the callable tools     (default: the tools given, PythonTool)

Everything else (turn limits, tool-call parsing, observation formatting and truncation, void turns, grading,
`info`) is handled here.
"""

from __future__ import annotations

import ctypes
import json
import logging
import math
import multiprocessing
import string
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, ClassVar, Literal

import gymnasium as gym
import numpy as np
from gymnasium import spaces
from gymnasium.envs.registration import EnvSpec
from gymnasium.vector.utils import create_shared_memory, read_from_shared_memory, write_to_shared_memory
from gymnasium.wrappers import TimeLimit

from stare_agents.envs.grading import MathGrader, _last_box, default_grader, grading_clock
from stare_agents.envs.parsing import (
    PYTHON_LANGUAGES,
    ROLES,
    CodeBlock,
    Message,
    ObservationFormat,
    ToolCall,
    ToolFormat,
    count_tool_calls,
    find_tool_calls,
    message,
    render_template,
    tool_message,
    truncate_middle,
)
from stare_agents.envs.tasks import FieldSpec, Task, TaskDataset
from stare_agents.envs.tools import PythonTool, ToolLike, ToolOutput
from stare_agents.sandbox import SandboxError
from stare_agents.sandbox.runner import DEFAULT_TIMEOUT_S

logger = logging.getLogger("stare_agents.envs")

PROMPTS_DIR = Path(__file__).with_name("prompts")
MAX_ACTION_CHARS = 16 * 1024 * 1024
MAX_MESSAGE_CHARS = 16 * 1024 * 1024
SHARED_MEMORY_BYTES = 1024 * 1024  # MessagesSpace: shared memory per environment of an async vector env
MAX_TOOL_CALLS_PER_TURN = 1024
VoidTurnPolicy = Literal["end", "continue"]

# Keys every `info` dict carries (after reset and after every step); check_env verifies them.
INFO_KEYS: tuple[str, ...] = (
    "task_id",
    "turn",
    "finished",
    "truncated",
    "void_turn",
    "void_turns",
    "tool_calls",
    "tool_errors",
    "tool_timeouts",
    "tool_statuses",
)
# Keys the info of an episode's last step adds; check_env verifies them. `grade_duration_s` / `grade_timeouts`:
# the time the score spent in grading workers (or the unit-test run) and how many of their calls timed out
# (0.0 / 0 when the answer was settled without one). `reward_violation` is None, or says what `score()`
# returned that was not a finite number in `reward_range` (the reward is then clipped).
FINAL_INFO_KEYS: tuple[str, ...] = (
    "reward",
    "correct",
    "grade_reason",
    "extracted",
    "score_details",
    "grade_duration_s",
    "grade_timeouts",
    "reward_violation",
)


def load_prompt(name: str) -> str:
    """The text of `envs/prompts/<name>.txt` (shipped with the package)."""
    path = PROMPTS_DIR / f"{name}.txt"
    if not path.exists():
        known = sorted(p.stem for p in PROMPTS_DIR.glob("*.txt"))
        raise FileNotFoundError(f"no prompt template {name!r}; known templates: {known}")
    return path.read_text(encoding="utf-8").strip("\n")


# -- spaces ---------------------------------------------------------------------------------------------------
class UnicodeText(spaces.Text):
    """A `gymnasium.spaces.Text` that contains any Unicode string of allowed length.

    `spaces.Text.contains` accepts only characters of its charset; model output is arbitrary Unicode, so
    here membership checks type and length only. `sample()` still draws from printable ASCII, and only up to
    `sample_max_length` characters.
    """

    def __init__(
        self,
        max_length: int,
        *,
        min_length: int = 0,
        sample_max_length: int = 256,
        seed: int | np.random.Generator | None = None,
    ):
        super().__init__(max_length=max_length, min_length=min_length, charset=string.printable, seed=seed)
        self.sample_max_length = max(min_length, min(max_length, sample_max_length))

    def sample(self, mask: Any = None, probability: Any = None) -> str:
        """Printable ASCII of a length drawn up to `sample_max_length` (256), not up to `max_length`: a
        space that holds 16 M characters need not sample them (a mask or probability picks as in `Text`)."""
        if mask is None and probability is None:
            mask = (int(self.np_random.integers(self.min_length, self.sample_max_length + 1)), None)
        return super().sample(mask=mask, probability=probability)

    def contains(self, x: Any) -> bool:
        return isinstance(x, str) and self.min_length <= len(x) <= self.max_length

    def __repr__(self) -> str:
        return f"UnicodeText({self.min_length}, {self.max_length})"


class MessagesSpace(gym.Space[list[Message]]):
    """Lists of `Message`s: dicts with exactly the string fields role, content and inline.

    Not composed from `spaces.Sequence(spaces.Dict(...))` because `Sequence` holds tuples, not lists, and
    `Dict` would insist on Text's charset; this space states the same shape directly.

    Vector environments: `gymnasium.make_vec(id, num_envs=N, vectorization_mode="async")` passes observations
    through shared memory (Gymnasium's default), `shared_memory_bytes` per environment holding the messages as
    UTF-8 JSON; an observation that does not fit is an error that says so (raise the limit, or pass
    `vector_kwargs={"shared_memory": False}`). The batched observation is a tuple of message lists
    (`SharedMessages`, a live view of the shared memory, when the vector environment does not copy).
    """

    def __init__(
        self,
        max_messages: int = 64,
        max_chars: int = MAX_MESSAGE_CHARS,
        seed: int | np.random.Generator | None = None,
        shared_memory_bytes: int = SHARED_MEMORY_BYTES,
    ):
        super().__init__(shape=None, dtype=None, seed=seed)
        self.max_messages = max_messages
        self.max_chars = max_chars
        if shared_memory_bytes < 64:
            raise ValueError(f"shared_memory_bytes must be >= 64, got {shared_memory_bytes!r}")
        self.shared_memory_bytes = shared_memory_bytes
        self._text = UnicodeText(max_length=64)

    @property
    def is_np_flattenable(self) -> bool:
        return False

    def seed(self, seed: int | None = None) -> int | list[int] | dict[str, int]:
        seeds = super().seed(seed)
        self._text.seed(int(self.np_random.integers(2**31)))
        return seeds

    def sample(self, mask: Any = None, probability: Any = None) -> list[Message]:
        count = int(self.np_random.integers(0, 4))
        roles = ("user", "tool")
        return [message(roles[int(self.np_random.integers(2))], self._text.sample()) for _ in range(count)]

    def contains(self, x: Any) -> bool:
        if not isinstance(x, list) or len(x) > self.max_messages:
            return False
        return all(_is_message(item, self.max_chars) for item in x)

    def __repr__(self) -> str:
        return f"MessagesSpace(max_messages={self.max_messages}, max_chars={self.max_chars})"

    def __eq__(self, other: object) -> bool:
        return (
            isinstance(other, MessagesSpace)
            and other.max_messages == self.max_messages
            and other.max_chars == self.max_chars
        )


# shared memory for AsyncVectorEnv: per environment, an 8-byte length, then the observation as UTF-8 JSON
@create_shared_memory.register(MessagesSpace)
def _create_messages_shared_memory(space: MessagesSpace, n: int = 1, ctx: Any = multiprocessing) -> Any:
    return ctx.Array(ctypes.c_uint8, n * space.shared_memory_bytes)


class SharedMessages(Sequence):
    """The observations of an async vector environment's sub-environments, read from its shared memory when
    indexed (a live view, as Gymnasium's arrays are); a copy (`copy=True`, the default) is a tuple of lists."""

    def __init__(self, rows: np.ndarray) -> None:
        self._rows = rows

    def __len__(self) -> int:
        return len(self._rows)

    def __getitem__(self, index: Any) -> Any:
        if isinstance(index, slice):
            return tuple(self)[index]
        row = self._rows[index]
        length = int.from_bytes(row[:8].tobytes(), "little")
        return json.loads(row[8 : 8 + length].tobytes()) if length else []  # 0: nothing written yet

    def __deepcopy__(self, memo: dict) -> tuple[list[Message], ...]:
        return tuple(self)

    def __repr__(self) -> str:
        return f"SharedMessages({list(self)!r})"


@read_from_shared_memory.register(MessagesSpace)
def _read_messages_from_shared_memory(space: MessagesSpace, shared_memory: Any, n: int = 1) -> SharedMessages:
    return SharedMessages(
        np.frombuffer(shared_memory.get_obj(), dtype=np.uint8).reshape(n, space.shared_memory_bytes)
    )


@write_to_shared_memory.register(MessagesSpace)
def _write_messages_to_shared_memory(
    space: MessagesSpace, index: int, value: list[Message], shared_memory: Any
) -> None:
    data = json.dumps(value, ensure_ascii=False, allow_nan=False).encode("utf-8")
    size = space.shared_memory_bytes
    if len(data) + 8 > size:
        raise ValueError(
            f"an observation of {len(data)} bytes (UTF-8 JSON) does not fit the {size - 8} bytes of shared memory "
            "per environment: make the vector environment with vector_kwargs={'shared_memory': False}, or give "
            "its MessagesSpace a larger shared_memory_bytes"
        )
    row = np.frombuffer(shared_memory.get_obj(), dtype=np.uint8, count=size, offset=index * size)
    row[:8] = np.frombuffer(len(data).to_bytes(8, "little"), dtype=np.uint8)
    row[8 : 8 + len(data)] = np.frombuffer(data, dtype=np.uint8)


def _is_message(item: Any, max_chars: int) -> bool:
    return (
        isinstance(item, dict)
        and set(item) == {"role", "content", "inline"}
        and item["role"] in ROLES
        and isinstance(item["content"], str)
        and isinstance(item["inline"], str)
        and len(item["content"]) <= max_chars
        and len(item["inline"]) <= max_chars
    )


# -- scores and turns -----------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Score:
    """What `score()` returns for a finished episode.

    reward: the scalar reward, within the environment's `reward_range`.
    reason: why ("correct", "wrong", "no_answer", "parse_failure", "timeout" for math; free text elsewhere).
    correct: whether the episode counts as solved (for accuracy metrics).
    extracted: the answer the score was computed from (boxed text, submitted code), if any.
    details: anything else worth logging; merged into the final `info` under "score_details".
    """

    reward: float
    reason: str
    correct: bool = False
    extracted: str | None = None
    details: Mapping[str, Any] = field(default_factory=dict)


@dataclass
class Turn:
    """What a turn produced, as decided by `TextEnv.respond` (internal to the base classes).

    observation: messages to return; done: the episode ends here (terminated); void: a void turn.
    """

    observation: list[Message] = field(default_factory=list)
    done: bool = False
    void: bool = False


@dataclass
class EpisodeStats:
    """Counters reported in `info` (episode totals; `step_statuses` holds the current step's calls)."""

    void_turns: int = 0
    tool_calls: int = 0
    tool_errors: int = 0
    tool_timeouts: int = 0
    step_statuses: list[str] = field(default_factory=list)

    def count_call(self, status: str) -> None:
        """One tool call with its status ("ok", "error", "timeout", "killed")."""
        self.tool_calls += 1
        self.tool_errors += int(status in ("error", "killed"))
        self.tool_timeouts += int(status == "timeout")
        self.step_statuses.append(status)


# -- the text environment -------------------------------------------------------------------------------------
class TextEnv(gym.Env[list[Message], str]):
    """A text environment: the prompt is a task, the action is the policy's text, the reward its score.

    Single-turn by default (`max_turns=1`): the first action ends the episode and is scored. Subclasses
    override `sample_task`, `prompt` and `score` (see the module docstring).

    Args:
        dataset: tasks to sample from: a `TaskDataset`, a path (.jsonl/.json/.parquet), a Hugging Face
            dataset id, or a list of row dicts. Not needed when the subclass generates tasks itself.
        fields: column mapping for `dataset` (see `TaskDataset`).
        split: dataset split for Hugging Face ids.
        max_turns: turn limit; the episode is truncated after this many actions.
        system_prompt: text of a system message placed before the task (None: no system message).
        prompt_template: user-message template; `{problem}` is replaced by the task's problem.
        grader: the `MathGrader` used by the default `score` (None: the shared process-wide grader).
        max_response_tokens: a hint for the rollout layer: tokens to generate per turn (None: its default).
    """

    metadata: ClassVar[dict[str, Any]] = {"render_modes": ["ansi"], "render_fps": 1}
    reward_range: tuple[float, float] = (0.0, 1.0)
    uses_sandbox: ClassVar[bool] = False  # True where the constructor takes sandbox= (tools, unit tests)
    # reset(options=...) that pins a valid task of this environment (check_env pins with it)
    example_task_options: ClassVar[dict[str, Any]] = {"problem": "What is 2 + 3?", "answer": "5"}
    default_system_prompt: ClassVar[str | None] = None
    default_prompt_template: ClassVar[str] = "{problem}"

    def __init__(
        self,
        *,
        dataset: TaskDataset | str | Path | Sequence[Mapping[str, Any]] | None = None,
        fields: Mapping[str, FieldSpec] | None = None,
        split: str = "train",
        max_turns: int = 1,
        system_prompt: str | None = None,
        prompt_template: str | None = None,
        grader: MathGrader | None = None,
        max_response_tokens: int | None = None,
        render_mode: str | None = None,
    ) -> None:
        if max_turns < 1:
            raise ValueError(f"max_turns must be >= 1, got {max_turns}")
        if render_mode is not None and render_mode not in self.metadata["render_modes"]:
            raise ValueError(
                f"render_mode must be one of {self.metadata['render_modes']}, got {render_mode!r}"
            )
        if dataset is None or isinstance(dataset, TaskDataset):
            self.dataset = dataset
        else:
            self.dataset = TaskDataset(dataset, fields=fields, split=split)
        self.max_turns = max_turns
        self.turn_limit = (
            max_turns  # this episode's: max_turns, or a smaller TimeLimit around the environment
        )
        self.system_prompt = system_prompt if system_prompt is not None else self.default_system_prompt
        self.prompt_template = (
            prompt_template if prompt_template is not None else self.default_prompt_template
        )
        self.grader = grader
        self.max_response_tokens = max_response_tokens
        self.render_mode = render_mode
        self.action_space = UnicodeText(max_length=MAX_ACTION_CHARS)
        self.observation_space = MessagesSpace()
        self.task: Task | None = None
        self.turn = 0
        self.responses: list[str] = []
        self.stats = EpisodeStats()
        self.final_score: Score | None = None
        self.tool_answers: list[str] = []  # final answers tools produced this episode (ToolEnv)
        self._episode_over = False

    # -- hooks for subclasses -------------------------------------------------------------------------------
    def sample_task(self) -> Task:
        """Draw the next task using `self.np_random` (seeded by `reset(seed=...)`).

        The default samples uniformly from `self.dataset`. Environments that generate tasks override this.
        """
        if self.dataset is None:
            raise NotImplementedError(
                f"{type(self).__name__} has no dataset: pass dataset=<path or HF id> or override sample_task()"
            )
        return self.dataset.sample(self.np_random)

    def prompt(self, task: Task) -> list[Message]:
        """The first observation: an optional system message and the task in the prompt template."""
        messages = [] if not self.system_prompt else [message("system", self.system_prompt)]
        messages.append(message("user", render_template(self.prompt_template, problem=task.problem)))
        return messages

    def score(self, task: Task, response: str) -> Score:
        """Score a finished episode. `response` is all of the policy's text, turns joined.

        The default grades the last `\\boxed{}` against `task.answer` with math-verify: reward 1.0 when
        correct, else 0.0.
        """
        result = (self.grader or default_grader()).grade(response, _reference(task))
        return Score(
            float(result.correct), result.reason, result.correct, result.extracted, {"detail": result.detail}
        )

    def validate_task(self, task: Task) -> None:
        """Raise ValueError (with the task and the remedy) when `task` lacks what `score` needs.

        Called by `reset` for every task, sampled or pinned, so a bad task fails there and not at the end of
        its episode. The default requires a reference answer (what math grading needs); an environment whose
        `score` needs none overrides this.
        """
        _reference(task)

    def respond(self, action: str) -> Turn:
        """Decide what this turn produced. The text environment ends the episode on the first action."""
        return Turn(done=True)

    # -- gymnasium API --------------------------------------------------------------------------------------
    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[list[Message], dict[str, Any]]:
        """Start an episode: pick a task (seeded, or pinned by `options`) and return its prompt.

        Returns (observation, info): the prompt messages, and an info dict with the `INFO_KEYS`. A bad seed,
        bad options or a task that `validate_task` rejects raise here, with the value and the remedy, and
        leave the current episode as it was.
        """
        if isinstance(seed, np.integer):
            seed = int(seed)
        if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int)):
            raise TypeError(f"seed must be an integer (int or numpy integer) or None, got {seed!r}")
        if seed is not None and seed < 0:
            raise ValueError(f"seed must be >= 0, got {seed}")
        super().reset(seed=seed)
        task = self._task_from_options(options) if options else self.sample_task()
        if not isinstance(task, Task):
            raise TypeError(
                f"{type(self).__name__}.sample_task() must return a Task, got {type(task).__name__}"
            )
        self.validate_task(task)
        outer_limit = self._outer_time_limit()
        self.end_episode()
        self.task = task
        self.turn_limit = self.max_turns if outer_limit is None else min(self.max_turns, outer_limit)
        self.turn = 0
        self.responses = []
        self.stats = EpisodeStats()
        self.final_score = None
        self._episode_over = False
        return self.prompt(self.task), self._info(void_turn=False, finished=False, truncated=False)

    def step(self, action: str) -> tuple[list[Message], float, bool, bool, dict[str, Any]]:
        """Apply one turn of policy text. Returns (observation, reward, terminated, truncated, info).

        Nothing the policy writes makes this raise: parse errors, bad tool calls and tool failures become
        observations. What does raise: calling it outside an episode (`gymnasium.error.ResetNeeded`), an action that is not
        text within the action space (TypeError / ValueError), and failures that are not the policy's doing
        (the sandbox itself failing, a bug in a subclass); then the environment's state is as it was before
        the call.
        """
        self._check_action(action)
        saved = (self.turn, list(self.responses), replace(self.stats), list(self.tool_answers))
        self.stats.step_statuses = []
        try:
            return self._step(action)
        except BaseException:
            self.turn, self.responses, self.stats, self.tool_answers = saved
            self._episode_over, self.final_score = False, None
            raise

    def _check_action(self, action: Any) -> None:
        if self.task is None:
            raise gym.error.ResetNeeded(f"{type(self).__name__}.step() called before reset()")
        if self._episode_over:
            raise gym.error.ResetNeeded(
                f"{type(self).__name__}.step() called after the episode ended; call reset()"
            )
        if not isinstance(action, str):
            raise TypeError(f"the action must be the policy's text (str), got {type(action).__name__}")
        if len(action) > MAX_ACTION_CHARS:
            raise ValueError(
                f"action of {len(action)} characters exceeds the action space ({MAX_ACTION_CHARS})"
            )

    def _step(self, action: str) -> tuple[list[Message], float, bool, bool, dict[str, Any]]:
        assert self.task is not None
        self.turn += 1
        self.responses.append(action)
        outcome = self.respond(action)
        if outcome.void:
            self.stats.void_turns += 1
        terminated = outcome.done
        truncated = not terminated and self.turn >= self.turn_limit
        reward = 0.0
        observation = outcome.observation
        info_extra: dict[str, Any] = {}
        if terminated or truncated:
            with grading_clock() as clock:
                score = self.score(self.task, self.response_text())
            self._episode_over, self.final_score = True, score
            self.end_episode()  # hand per-episode resources (a sandbox session) back right away
            reward, violation = clip_reward(score.reward, self.reward_range)
            observation = []
            info_extra = {
                "reward": reward,
                "correct": bool(score.correct),
                "grade_reason": score.reason,
                "extracted": score.extracted,
                "score_details": dict(score.details),
                "grade_duration_s": clock.seconds,
                "grade_timeouts": clock.timeouts,
                "reward_violation": violation,
            }
        info = self._info(void_turn=outcome.void, finished=terminated, truncated=truncated)
        info.update(info_extra)
        return observation, reward, terminated, truncated, info

    def render(self) -> str | None:
        """Render mode "ansi": the episode so far as plain text (the task, then each turn)."""
        if self.render_mode != "ansi" or self.task is None:
            return None
        parts = [f"[task {self.task.id}] {self.task.problem}"]
        parts += [f"[turn {i + 1}] {text}" for i, text in enumerate(self.responses)]
        return "\n".join(parts)

    def close(self) -> None:
        """Release the episode's resources. Safe to call more than once."""
        self.end_episode()
        super().close()

    # -- helpers --------------------------------------------------------------------------------------------
    @property
    def turns_left(self) -> int:
        return self.turn_limit - self.turn

    @property
    def spec(self) -> EnvSpec | None:
        """The spec `gymnasium.make` gave this environment, with `max_episode_steps` = `max_turns`."""
        spec = self.__dict__.get("_spec")
        return None if spec is None else replace(spec, max_episode_steps=self.max_turns)

    @spec.setter
    def spec(self, value: EnvSpec | None) -> None:
        self.__dict__["_spec"] = value

    def _outer_time_limit(self) -> int | None:
        """The limit of a `gymnasium.wrappers.TimeLimit` this reset came through, if any.

        `gym.make(..., max_episode_steps=k)` and `TimeLimit(env, k)` cut episodes from outside, where the
        environment cannot see them: an episode cut there would end ungraded, `info["truncated"]` False and its
        sandbox session open. Gymnasium gives an environment no handle on its wrappers, so `reset` looks for
        the TimeLimit among its callers (the wrapper chain) and adopts its limit when it is the smaller one.
        """
        frame = sys._getframe(2)
        for _ in range(24):
            if frame is None:
                return None
            wrapper = frame.f_locals.get("self")
            if isinstance(wrapper, TimeLimit) and wrapper.unwrapped is self:
                limit = getattr(wrapper, "_max_episode_steps", None)
                return limit if isinstance(limit, int) and limit > 0 else None
            frame = frame.f_back
        return None

    def response_text(self) -> str:
        """All of the policy's text this episode, turns joined with newlines (what `score` grades)."""
        return "\n".join(self.responses)

    def end_episode(self) -> None:
        """Release per-episode resources (called when an episode ends, by `reset` and by `close`).

        The base class holds none; `ToolEnv` closes its sandbox session here.
        """

    def _task_from_options(self, options: Mapping[str, Any]) -> Task:
        """The task `options` pin: {"problem": ..., "answer": ..., "id": ..., <more: Task.data>},
        {"index": i} (row i of the dataset) or {"task": Task(...)}; anything else is an error."""
        if not isinstance(options, Mapping):
            raise TypeError(f"options must be a dict, got {type(options).__name__}")
        ways = [key for key in ("task", "index", "problem") if key in options]
        if len(ways) != 1:
            raise ValueError(
                f"options {_keys(options)} must pick the task one way: {{'problem': ..., 'answer': ...}} (more keys "
                "go to Task.data), {'index': i} or {'task': Task(...)}; or pass options=None to sample one"
            )
        (way,) = ways
        if way in ("task", "index") and len(options) > 1:
            raise ValueError(f"options {_keys(options)}: {way!r} takes no other keys")
        if way == "task":
            if not isinstance(options["task"], Task):
                raise TypeError(f"options['task'] must be a Task, got {type(options['task']).__name__}")
            return options["task"]
        if way == "index":
            index = options["index"]
            if self.dataset is None:
                raise ValueError(
                    f"options={{'index': {index!r}}} needs a dataset; {type(self).__name__} has none"
                )
            size = len(self.dataset)
            if isinstance(index, bool) or not isinstance(index, int | np.integer):
                raise TypeError(f"options['index'] must be an integer in [0, {size}), got {index!r}")
            if not 0 <= index < size:
                raise IndexError(
                    f"options['index']={int(index)} is out of range: dataset {self.dataset.name!s} has {size} rows "
                    f"(0..{size - 1})"
                )
            return self.dataset[int(index)]
        problem, answer, task_id = options["problem"], options.get("answer"), options.get("id", "pinned")
        if not isinstance(problem, str):
            raise TypeError(f"options['problem'] must be a str, got {type(problem).__name__}")
        if answer is not None and (isinstance(answer, bool) or not isinstance(answer, str | int | float)):
            raise TypeError(f"options['answer'] must be a str (or a number), got {type(answer).__name__}")
        extra = {k: v for k, v in options.items() if k not in ("problem", "answer", "id")}
        return Task(
            problem=problem, answer=None if answer is None else str(answer), id=str(task_id), data=extra
        )

    def _info(self, *, void_turn: bool, finished: bool, truncated: bool) -> dict[str, Any]:
        assert self.task is not None
        return {
            "task_id": self.task.id,
            "turn": self.turn,
            "finished": finished,
            "truncated": truncated,
            "void_turn": void_turn,
            "void_turns": self.stats.void_turns,
            "tool_calls": self.stats.tool_calls,
            "tool_errors": self.stats.tool_errors,
            "tool_timeouts": self.stats.tool_timeouts,
            "tool_statuses": list(self.stats.step_statuses),
        }


def _reference(task: Task) -> str:
    if task.answer is None or not str(task.answer).strip():
        raise ValueError(
            f"task {task.id!r} has no reference answer, which math grading needs: map the answer column with "
            "fields={'answer': '<column>'}, pin it with reset(options={'problem': ..., 'answer': ...}), or "
            "override validate_task() if your score() needs none"
        )
    return str(task.answer)


def _keys(options: Mapping[str, Any]) -> str:
    return (
        "{" + ", ".join(repr(key) for key in list(options)[:8]) + (", ..." if len(options) > 8 else "") + "}"
    )


# -- tools ------------------------------------------------------------------------------------------------------
_UNSET: Any = object()  # "not given": distinguishes a python-tool option the caller set from its default


class ToolEnv(TextEnv):
    """A multi-turn environment in which the policy's text may call tools.

    Each turn is one of:
      * a final answer (a `\\boxed{` in the text): the episode ends and is scored (tool calls in the same
        turn are not run, as in SimpleTIR);
      * one or more complete tool calls: they run and their results are the observation;
      * neither: a *void turn* (SimpleTIR). `void_turn_policy="end"` ends the episode (scored, flagged in
        `info`); "continue" answers with `void_turn_feedback` and goes on.
    On the last allowed turn tool calls are not run; the episode is truncated and scored.

    The tools are objects the environment is given (`tools=[...]`), by default one `PythonTool` built from
    the python-tool arguments below. The environment never owns a sandbox: it uses the injected one or, when
    none is given, the process-wide `shared_sandbox()`; it ends its tools' episodes with its own.

    Args (besides `TextEnv`'s):
        tools: the tools the policy may call (`PythonTool`, `Tool`, or anything with `name`, `schema()`,
            `__call__(arguments)` and `end_episode()`). Default: `[PythonTool(sandbox, timeout_s=tool_timeout_s,
            wall_timeout_s=tool_wall_timeout_s, stateless=stateless, error_lines=error_lines,
            accept_tool_answer=accept_tool_answer)]`; with `tools=` given, those six arguments belong to the
            tool and are refused here.
        sandbox: the sandbox of the default python tool (None: the process-wide shared one).
        tool_timeout_s: the CPU seconds one python call may use (default DEFAULT_TIMEOUT_S, 5 s; at most
            MAX_TIMEOUT_S): CPU time, so that a busy machine never fails an honest program.
        tool_wall_timeout_s: the wall-clock cap of one python call, for code that sleeps or waits (>=
            tool_timeout_s; default WALL_FACTOR, 4, times tool_timeout_s).
        stateless: run each python call in a fresh namespace (SimpleTIR) instead of one session per episode.
        error_lines: show only the last N lines of a traceback (None: all of it).
        accept_tool_answer: also accept a final answer printed by the tool (`final_answer(x)`, defined in the
            interpreter, prints `\\boxed{x}`); such output ends the episode.
        tool_format: "python_fence" (```python blocks) or "hermes" (<tool_call> JSON).
        code_block: which complete python block of a turn runs: "first" or "last".
        observation_format: "output_block", "code_execution_result" or "tool_response" (default:
            output_block for fences, tool_response for hermes).
        max_obs_chars: a tool result longer than this keeps its head and tail. Counted in UTF-8 bytes of the
            result in Unicode normal form C, not in tokens (an environment has no tokenizer; see
            `truncate_middle`): a byte-level BPE that reads it as it is or in NFC (Qwen's) spends at most one
            token per byte (2,048 bytes: at most 2,048 tokens, 1.3 times that where the rollout breaks up
            chat-control strings in it); measured, one per digit on numbers (SmolLM2's and Qwen's split
            digits), 1/5 to 1/3 of a token per byte on English and tracebacks.
        void_turn_policy / void_turn_feedback: see above.
        max_tool_calls_per_turn: calls past this many in one turn are not run; one error message says so.
    """

    default_max_turns: ClassVar[int] = 4
    uses_sandbox: ClassVar[bool] = True

    def __init__(
        self,
        *,
        tools: Sequence[ToolLike] | None = None,
        sandbox: Any = _UNSET,
        tool_timeout_s: float = _UNSET,
        tool_wall_timeout_s: float | None = _UNSET,
        stateless: bool = _UNSET,
        error_lines: int | None = _UNSET,
        accept_tool_answer: bool = _UNSET,
        tool_format: ToolFormat = "python_fence",
        code_block: CodeBlock = "first",
        observation_format: ObservationFormat | None = None,
        max_turns: int | None = None,
        max_obs_chars: int = 2048,
        void_turn_policy: VoidTurnPolicy = "end",
        void_turn_feedback: str = (
            "Your message contained neither a complete ```python code block nor a final answer in \\boxed{}."
        ),
        max_tool_calls_per_turn: int = 4,
        languages: tuple[str, ...] = PYTHON_LANGUAGES,
        **kwargs: Any,
    ) -> None:
        super().__init__(max_turns=max_turns or self.default_max_turns, **kwargs)
        if tool_format not in ("python_fence", "hermes"):
            raise ValueError(f"tool_format must be 'python_fence' or 'hermes', got {tool_format!r}")
        if code_block not in ("first", "last"):
            raise ValueError(f"code_block must be 'first' or 'last', got {code_block!r}")
        if void_turn_policy not in ("end", "continue"):
            raise ValueError(f"void_turn_policy must be 'end' or 'continue', got {void_turn_policy!r}")
        if not 1 <= max_tool_calls_per_turn <= MAX_TOOL_CALLS_PER_TURN:
            raise ValueError(
                f"max_tool_calls_per_turn must be in 1..{MAX_TOOL_CALLS_PER_TURN}, got {max_tool_calls_per_turn!r}"
            )
        if max_obs_chars < 64:
            raise ValueError(f"max_obs_chars must be >= 64, got {max_obs_chars!r}")
        python_options = {
            "sandbox": sandbox,
            "tool_timeout_s": tool_timeout_s,
            "tool_wall_timeout_s": tool_wall_timeout_s,
            "stateless": stateless,
            "error_lines": error_lines,
            "accept_tool_answer": accept_tool_answer,
        }
        given = {name: value for name, value in python_options.items() if value is not _UNSET}
        if tools is None:
            tools = [
                PythonTool(
                    given.get("sandbox"),
                    timeout_s=given.get("tool_timeout_s", DEFAULT_TIMEOUT_S),
                    wall_timeout_s=given.get("tool_wall_timeout_s"),
                    stateless=given.get("stateless", False),
                    error_lines=given.get("error_lines"),
                    accept_tool_answer=given.get("accept_tool_answer", False),
                )
            ]
        elif given:
            raise ValueError(
                f"{sorted(given)} configure the default python tool, but tools= was given: pass them to the "
                "tool instead, e.g. PythonTool(sandbox, timeout_s=..., stateless=..., error_lines=..., "
                "accept_tool_answer=...)"
            )
        self._tools: list[ToolLike] = list(tools)
        for tool in self._tools:
            if not isinstance(tool, ToolLike):
                raise TypeError(
                    f"tools must have name, schema(), __call__(arguments) and end_episode(); got {tool!r}"
                )
            if isinstance(tool, PythonTool):
                if tool.bound:
                    raise ValueError(
                        f"{tool!r} already serves another environment and holds its episode's session: give "
                        "each environment its own PythonTool (they can share one sandbox)"
                    )
                tool.bound = True
        self.tool_format = tool_format
        self.code_block = code_block
        default_format = "output_block" if tool_format == "python_fence" else "tool_response"
        self.observation_format: ObservationFormat = observation_format or default_format
        self.max_obs_chars = max_obs_chars
        self.void_turn_policy = void_turn_policy
        self.void_turn_feedback = void_turn_feedback
        self.max_tool_calls_per_turn = max_tool_calls_per_turn
        self.languages = languages
        # a turn answers with at most max_tool_calls_per_turn results and one message about the calls past it
        self.observation_space = MessagesSpace(max_messages=max(64, max_tool_calls_per_turn + 1))

    # -- hooks ------------------------------------------------------------------------------------------------
    def tools(self) -> dict[str, ToolLike]:
        """The tools the policy may call, by name. Default: the tools given to the constructor."""
        return {tool.name: tool for tool in self._tools}

    def score(self, task: Task, response: str) -> Score:
        """Math grading of the policy's last `\\boxed{}`; a final answer a tool produced counts when the
        policy's own text has none."""
        grader = self.grader or default_grader()
        result = grader.grade(response, _reference(task))
        if result.reason == "no_answer" and self.tool_answers:
            result = grader.compare(self.tool_answers[-1], _reference(task))
            details = {"detail": result.detail, "answer_source": "tool"}
        else:
            details = {"detail": result.detail, "answer_source": "policy"}
        return Score(float(result.correct), result.reason, result.correct, result.extracted, details)

    # -- turn logic -------------------------------------------------------------------------------------------
    def respond(self, action: str) -> Turn:
        boxed, unterminated = _last_box(action)
        if boxed is not None or unterminated:
            return Turn(done=True)
        calls, ignored = self.parse_calls(action)
        if not calls and not ignored:
            if self.void_turn_policy == "end":
                return Turn(done=True, void=True)
            feedback = message("user", self.void_turn_feedback, "\n" + self.void_turn_feedback + "\n")
            return Turn(observation=[feedback], void=True)
        if self.turns_left <= 0:
            return Turn()  # the turn limit: nothing would read the result; the base class truncates
        observation: list[Message] = []
        done = False
        for call in calls:
            output = self.call_tool(call)
            self.stats.count_call(output.status)
            observation.append(self._observe(output.text))
            if output.final_answer is not None:
                self.tool_answers.append(output.final_answer)
                done = True
        if ignored > 0:  # one message for all of them, so the observation stays within its space
            self.stats.count_call("error")  # one status for the batch; the counters count each call
            self.stats.tool_calls += ignored - 1
            self.stats.tool_errors += ignored - 1
            observation.append(
                self._observe(
                    f"Error: {ignored} more tool call(s) were not run: at most "
                    f"{self.max_tool_calls_per_turn} tool calls per turn"
                )
            )
        return Turn(observation=observation, done=done)

    def solution_code(self, task: Task) -> str:
        """Python whose printed output is `task`'s answer: the environment's own solver, which
        `sft.data=solver` uses to write verified SFT traces (the code, the tool's output, then the boxed answer;
        a trace the environment does not score correct is dropped). Override it to give your environment a
        cold start; the base class has no solver (`stare_agents.envs.registration.has_solver` says which do)."""
        raise NotImplementedError(f"{type(self).__name__} has no solver (ToolEnv.solution_code)")

    def parse_calls(self, action: str) -> tuple[list[ToolCall], int]:
        """(the calls of this turn to run, at most `max_tool_calls_per_turn`; how many more it holds).

        The parsers turn malformed calls into `ToolCall(error=...)`; should one still raise, the turn gets
        one error call (logged with its traceback) instead of crashing `step`.
        """
        limit = self.max_tool_calls_per_turn
        try:
            calls = find_tool_calls(action, self.tool_format, self.code_block, self.languages, limit)
            more = (
                count_tool_calls(action, self.tool_format, self.languages) - len(calls)
                if len(calls) == limit
                else 0
            )
        except Exception as error:
            logger.exception("parsing the tool calls of a %d-character turn raised", len(action))
            return [
                ToolCall(name="", error=f"the tool calls could not be parsed ({type(error).__name__})")
            ], 0
        return calls, more

    def _observe(self, text: str) -> Message:
        return tool_message(truncate_middle(text, self.max_obs_chars), self.observation_format)

    def call_tool(self, call: ToolCall) -> ToolOutput:
        """Run one parsed call: unknown tools, bad arguments and tool exceptions become error outputs
        (`SandboxError`, the sandbox itself failing, is not the policy's doing and propagates)."""
        if call.error is not None:
            return ToolOutput(f"Error: {call.error}", "error")
        tools = self.tools()
        tool = tools.get(call.name)
        if tool is None:
            name = call.name if len(call.name) <= 64 else call.name[:61] + "..."
            return ToolOutput(f"Error: unknown tool {name!r}; available tools: {sorted(tools)}", "error")
        try:
            return tool(dict(call.arguments))
        except SandboxError:
            raise
        except Exception as error:  # a tool bug must not crash the rollout; the model sees the error
            logger.exception("tool %r raised", call.name)
            return ToolOutput(f"Error: tool {call.name!r} failed: {type(error).__name__}: {error}", "error")

    def end_episode(self) -> None:
        """End the tools' episodes (the python tool closes its session; the sandbox stays up)."""
        self.tool_answers = []
        for tool in self.tools().values():
            try:
                tool.end_episode()
            except Exception:
                logger.exception("ending the episode of tool %r failed", tool.name)

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[list[Message], dict[str, Any]]:
        observation, info = super().reset(seed=seed, options=options)
        info["tools"] = [tool.schema() for tool in self.tools().values()]
        return observation, info


def clip_reward(value: Any, reward_range: tuple[float, float]) -> tuple[float, str | None]:
    """(the reward clipped into `reward_range`, None) or, when it was not a finite number inside the range,
    (the clipped reward, a sentence saying what `score()` returned). NaN and non-numbers become the low end."""
    low, high = float(reward_range[0]), float(reward_range[1])
    try:
        number = float(value)
    except (TypeError, ValueError, OverflowError):
        return low, f"score() returned {value!r:.80}, not a number; the reward is {low:g}"
    if isinstance(value, bool) or math.isnan(number):
        return low, f"score() returned {value!r}, not a finite number; the reward is {low:g}"
    if low <= number <= high:
        return number, None
    clipped = min(max(number, low), high)
    return (
        clipped,
        f"score() returned {number!r}, outside reward_range {reward_range}; clipped to {clipped:g}",
    )


def is_finite_number(value: Any) -> bool:
    """True for a real, finite int/float/numpy scalar (what a reward must be)."""
    try:
        return math.isfinite(float(value)) and not isinstance(value, bool)
    except (TypeError, ValueError):
        return False
