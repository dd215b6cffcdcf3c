"""Registration of the built-in environments under `stare_agents/<Name>-v<N>` (runs on `import stare_agents.envs`),
and the look-ups every command that takes an environment shares: `resolve_env_id` (a registered id, your own
module's ids after `--import MODULE`, or gymnasium's `module:Name-v0`), `accepted_kwargs` / `unknown_kwargs`
(what the constructor takes), `has_solver` (an SFT solver of its own)."""

from __future__ import annotations

import importlib
import inspect
import os
import sys
import warnings
from collections.abc import Iterable, Mapping
from typing import Any

import gymnasium as gym

NAMESPACE = "stare_agents"

# id -> (entry point, one-line description). Versions bump when behaviour changes incompatibly.
ENVIRONMENTS: dict[str, tuple[str, str]] = {
    f"{NAMESPACE}/MathTIR-v0": (
        "stare_agents.envs.math_envs:MathTIREnv",
        "multi-turn math with a stateful Python sandbox session per episode (SimpleTIR/ToRL style)",
    ),
    f"{NAMESPACE}/MathCoT-v0": (
        "stare_agents.envs.math_envs:MathCoTEnv",
        "single-turn chain-of-thought math (cot='short' or 'long')",
    ),
    f"{NAMESPACE}/ArithmeticTIR-v0": (
        "stare_agents.envs.arithmetic:ArithmeticTIREnv",
        "seeded, offline integer problems that need the Python tool",
    ),
    f"{NAMESPACE}/ArithmeticTIR-v1": (
        "stare_agents.envs.arithmetic:ArithmeticTIRV1Env",
        "ArithmeticTIR with twelve kinds at three levels each, drawn uniformly over the 36 (kind, level) cells",
    ),
    f"{NAMESPACE}/PythonUnitTest-v0": (
        "stare_agents.envs.python_unittest:PythonUnitTestEnv",
        "write a function; reward = fraction of hidden unit tests passing in the sandbox",
    ),
}


def register_envs() -> None:
    """Register every built-in environment with gymnasium (idempotent).

    An older version of ours is kept on purpose (ArithmeticTIR-v0 draws the tasks old runs drew), so gymnasium's
    "is out of date, consider upgrading" warning on making it is turned off for this namespace; the table above
    and envs/README.md say what each version is."""
    warnings.filterwarnings(
        "ignore", message=rf".*The environment {NAMESPACE}/\S+ is out of date", category=DeprecationWarning
    )
    for env_id, (entry_point, _) in ENVIRONMENTS.items():
        if env_id not in gym.registry:
            gym.register(id=env_id, entry_point=entry_point)


def env_class(env_id: str) -> Any:
    """The class (or creator) registered under `env_id`: any entry point Gymnasium accepts, a callable (class,
    function, partial) or a "module:attr" string (its module imported)."""
    import stare_agents.envs  # noqa: F401  (registers the stare_agents/* ids)

    entry_point = gym.spec(env_id).entry_point
    if callable(entry_point):
        return entry_point
    if not isinstance(entry_point, str) or ":" not in entry_point:
        raise ValueError(
            f"{env_id} is registered with entry_point={entry_point!r}: register a class, a callable or a "
            "'module:attr' string (gymnasium.register(id, entry_point=...))"
        )
    return gym.envs.registration.load_env_creator(entry_point)


def split_kwargs(env_id: str, kwargs: dict, split: str) -> dict:
    """`kwargs` for drawing tasks of `split` ("train" or "heldout"): environments whose constructor takes a
    `split` keyword (e.g. ArithmeticTIR-v0) get it, unless `kwargs` already sets one; others are returned as
    they are (their held-out tasks come from seeds, or from a benchmark file)."""
    import inspect

    if "split" in kwargs:
        return dict(kwargs)
    try:
        takes_split = "split" in inspect.signature(env_class(env_id)).parameters
    except (TypeError, ValueError):
        takes_split = False
    return {**kwargs, "split": split} if takes_split else dict(kwargs)


def import_modules(modules: Iterable[str]) -> None:
    """Import each module (they register your own environments), the current folder searched first (see
    `search_current_folder`); an import that fails is a ValueError naming it."""
    modules = list(modules)
    if modules:
        search_current_folder()
    for module in modules:
        try:
            importlib.import_module(module)
        except ImportError as error:
            raise ValueError(
                f"cannot import {module!r} ({type(error).__name__}: {error}) from the current folder "
                f"({os.getcwd()}) or the Python path: give a module that registers your environments "
                "(gymnasium.register(...) at import)"
            ) from None


def search_current_folder() -> None:
    """Put the current folder first on the module search path, as `python -m`, uvicorn and celery do for the
    module they are given: a console script (`stare-agents`) does not, so `--import my_envs` would not find the
    my_envs.py beside you. The folder also goes first on PYTHONPATH, so that the processes started after this
    one (Ray workers, environment processes) find the module too."""
    folder = os.getcwd()
    if folder not in sys.path:
        sys.path.insert(0, folder)
    paths = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    if folder not in paths:
        os.environ["PYTHONPATH"] = os.pathsep.join([folder, *paths])


def resolve_env_id(env_id: str, imports: Iterable[str] = ()) -> str:
    """The registered id that `env_id` names, after importing `imports` and, for gymnasium's `module:Name-v0`
    form, `module`. An id that is not registered then is a ValueError listing the ids that are."""
    import stare_agents.envs  # noqa: F401  (registers the stare_agents/* ids)

    module, sep, name = env_id.rpartition(":")
    import_modules([*imports, *([module] if sep and module else [])])
    bare = name if sep else env_id
    if bare not in gym.registry:
        ours = sorted(key for key, spec in gym.registry.items() if not _gymnasiums_own(spec.entry_point))
        raise ValueError(
            f"unknown environment {env_id!r}; registered (besides gymnasium's own): {ours}. For your own "
            "environment, import the module that registers it (--import MODULE, env.imports) or write "
            "module:Name-v0"
        )
    return bare


def accepted_kwargs(env_id: str) -> set[str] | None:
    """The keyword arguments `gymnasium.make(env_id, ...)` can pass to the environment: its constructor's,
    and its base classes' through `**kwargs`. None when the creator takes anything (a `**kwargs` that does not
    end in a base class, e.g. a plain function)."""
    creator = env_class(env_id)
    if not isinstance(creator, type):
        return _parameters(creator)
    names: set[str] = set()
    for klass in creator.__mro__:
        if klass in (object, gym.Env):
            return names
        init = klass.__dict__.get("__init__")
        if init is None:
            continue
        taken = _parameters(init)
        if taken is None:
            return None
        names |= taken - {"self"}
        if not _takes_var_keyword(init):
            return names
    return names


def unknown_kwargs(env_id: str, kwargs: Mapping[str, object]) -> list[str]:
    """The keys of `kwargs` that environment `env_id` does not take (empty when it takes anything)."""
    accepted = accepted_kwargs(env_id)
    return [] if accepted is None else [key for key in kwargs if key not in accepted]


def has_solver(env_id: str) -> bool:
    """Whether the environment writes its own SFT solutions (`ToolEnv.solution_code` overridden)."""
    from stare_agents.envs.core import ToolEnv

    creator = env_class(env_id)
    return (
        isinstance(creator, type)
        and issubclass(creator, ToolEnv)
        and creator.solution_code is not ToolEnv.solution_code
    )


def _gymnasiums_own(entry_point: object) -> bool:
    where = entry_point if isinstance(entry_point, str) else getattr(entry_point, "__module__", "") or ""
    return where.startswith(("gymnasium", "shimmy"))


def _parameters(function: object) -> set[str] | None:
    """The keyword parameters of `function`; None for a plain function that also takes **kwargs (anything)."""
    try:
        parameters = list(inspect.signature(function).parameters.values())  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return None
    is_method = inspect.isfunction(function) and "." in function.__qualname__
    if not is_method and any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters):
        return None
    keyword = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
    return {p.name for p in parameters if p.kind in keyword}


def _takes_var_keyword(function: object) -> bool:
    parameters = inspect.signature(function).parameters.values()  # type: ignore[arg-type]
    return any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters)
