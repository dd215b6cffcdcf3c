"""The import rules of the design (shared/DESIGN.md, "Layout"), checked by a static scan of every module,
lazy imports inside functions included, with the package-dir mapping of pyproject.toml (envs/ is
stare_agents.envs, and so on):

* `stare_agents.algo` imports torch and the standard library only;
* `stare_agents.envs` imports nothing of the project but `stare_agents.sandbox`;
* `stare_agents.sandbox` imports nothing else of the project;
* nothing imports `stare_agents.train` but the CLI (`stare_agents.cli`) and the training package itself;
* evaluation imports the rollout layer, never training;
* training imports evaluation through the `stare_agents.eval` package only, never its modules.
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import pytest
import tomllib

ROOT = Path(__file__).resolve().parents[1]
STDLIB = set(sys.stdlib_module_names) | {"__future__"}


def modules() -> dict[str, Path]:
    """Module name -> file, through the package-dir mapping (a nested mapped package wins over a folder)."""
    mapping = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-dir"]
    found: dict[str, Path] = {}
    for package, folder in sorted(mapping.items(), key=lambda item: -item[0].count(".")):
        for path in sorted((ROOT / folder).rglob("*.py")):
            parts = list(path.relative_to(ROOT / folder).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts = parts[:-1]
            found.setdefault(".".join([package, *parts]), path)
    return found


def imports(name: str, path: Path) -> set[str]:
    """Every module `name` imports (absolute names; relative imports resolved)."""
    tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
    package = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
    out: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package[: len(package) - node.level + 1]
                module = ".".join(base + ([node.module] if node.module else []))
            else:
                module = node.module or ""
            out.add(module)
            out.update(f"{module}.{alias.name}" for alias in node.names)  # `from pkg import submodule`
    return out


def within(module: str, package: str) -> bool:
    return module == package or module.startswith(package + ".")


GRAPH = {name: imports(name, path) for name, path in modules().items()}


def test_the_scan_sees_the_mapped_packages():
    """A scan that misses the package-dir mapping would find nothing to check and pass."""
    assert {"stare_agents.envs.core", "stare_agents.sandbox.pool", "stare_agents.train.trainer"} <= set(GRAPH)
    assert any(within(m, "stare_agents.train") for m in GRAPH["stare_agents.cli"])


def project(module: str) -> bool:
    return within(module, "stare_agents")


@pytest.mark.parametrize(
    ("layer", "allowed"),
    [
        ("stare_agents.algo", ("stare_agents.algo",)),
        ("stare_agents.envs", ("stare_agents.envs", "stare_agents.sandbox")),
        ("stare_agents.sandbox", ("stare_agents.sandbox",)),
        ("stare_agents.eval", None),  # checked below: anything but training
    ],
)
def test_layers_import_only_what_the_design_allows(layer, allowed):
    broken = []
    for name, targets in GRAPH.items():
        if not within(name, layer):
            continue
        for target in targets:
            if not project(target):
                continue
            if allowed is None:
                if within(target, "stare_agents.train"):
                    broken.append(f"{name} imports {target}")
            elif not any(within(target, a) for a in allowed):
                broken.append(f"{name} imports {target}")
    assert broken == []


def test_algo_imports_torch_and_the_standard_library_only():
    foreign = sorted(
        f"{name} imports {target}"
        for name, targets in GRAPH.items()
        if within(name, "stare_agents.algo")
        for target in targets
        if target.split(".")[0] not in STDLIB | {"torch", "stare_agents"}
    )
    assert foreign == []


def test_nothing_but_the_cli_imports_training():
    broken = sorted(
        f"{name} imports {target}"
        for name, targets in GRAPH.items()
        if name != "stare_agents.cli" and not within(name, "stare_agents.train")
        for target in targets
        if within(target, "stare_agents.train")
    )
    assert broken == []


def eval_imports(path: Path) -> list[str]:
    """The evaluation modules a file names in its imports (`from X import ...` and `import X`)."""
    tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
    named = [node.module or "" for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)]
    named += [alias.name for node in ast.walk(tree) if isinstance(node, ast.Import) for alias in node.names]
    return [module for module in named if within(module, "stare_agents.eval")]


def test_training_reaches_evaluation_through_its_one_door():
    """Training imports `stare_agents.eval` (the package's public names: `evaluate_on_workers`, the benchmark
    checks, the behaviour helpers), never one of its modules; plain statistics come from `stare_agents.stats`."""
    broken = sorted(
        f"{name} imports {module}"
        for name, path in modules().items()
        if within(name, "stare_agents.train")
        for module in eval_imports(path)
        if module != "stare_agents.eval"
    )
    assert broken == []
    assert any(eval_imports(path) for name, path in modules().items() if within(name, "stare_agents.train"))


def circles(graph: dict[str, set[str]]) -> list[set[str]]:
    """The import circles of `graph`: its strongly connected components of two modules or more (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[set[str]] = []

    def visit(module: str) -> None:
        index[module] = low[module] = len(index)
        stack.append(module)
        for target in graph[module]:
            if target not in index:
                visit(target)
                low[module] = min(low[module], low[target])
            elif target in stack:
                low[module] = min(low[module], index[target])
        if low[module] == index[module]:
            component = set()
            while True:
                member = stack.pop()
                component.add(member)
                if member == module:
                    break
            if len(component) > 1:
                found.append(component)

    for module in graph:
        if module not in index:
            visit(module)
    return found


# circles that were there before this test, each its owners' to break; a circle may shrink or go, never grow,
# and no other may appear
KNOWN_CIRCLES = [
    {"stare_agents.algo.advantages", "stare_agents.algo.config"},
    {"stare_agents.algo.baselines", "stare_agents.algo.losses"},
    {"stare_agents.envs", "stare_agents.envs.registration"},
    {"stare_agents.rollout.engine", "stare_agents.rollout.hf_engine", "stare_agents.rollout.vllm_engine"},
    {"stare_agents.sandbox.pool", "stare_agents.sandbox.session"},  # session's annotations (TYPE_CHECKING)
    {"stare_agents.train.distributed", "stare_agents.train.sft"},
]


def test_no_new_import_circles():
    """The agent loop and its environment processes once imported each other: env_pool.py hosts environments
    for the agent loop and imports it (make_env, EnvHostError); the agent loop knows nothing of env_pool."""
    graph = {name: {target for target in targets if target in GRAPH} for name, targets in GRAPH.items()}
    assert "stare_agents.rollout.env_pool" not in graph["stare_agents.rollout.agent_loop"]
    new = [sorted(circle) for circle in circles(graph) if not any(circle <= known for known in KNOWN_CIRCLES)]
    assert new == []


def test_the_learner_and_every_training_module_stay_small():
    """Issue 46's bounds for the training package: the learner <= 600 lines (a plain PPO step, with STARE's
    mechanics in `stare_agents.algo`), no module of train/ over 700 (split a module before it grows past)."""
    sizes = {
        path.relative_to(ROOT).as_posix(): len(path.read_text().splitlines())
        for path in (ROOT / "train").rglob("*.py")
    }
    assert sizes["train/learner.py"] <= 600, sizes["train/learner.py"]
    assert {path: n for path, n in sizes.items() if n > 700} == {}
