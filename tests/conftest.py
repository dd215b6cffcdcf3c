"""Settings and fixtures for the whole suite: compute threads, the test-cost ratchet (tests/cost_ratchet.py), the
models, runs and the wheel that tests across the folders share.

Threads: one OpenMP/MKL/BLAS thread per process unless the caller says otherwise. The suite's models are tiny
(a second thread buys nothing on their matrices) and many tests run several processes at once -- a trainer
beside its engine workers, two learner ranks, environment and grader processes -- which, with one thread per
core each, would ask for 4-6 threads on CI's two cores. Set here, before anything imports torch, so the
processes the tests start (CLI runs, Ray workers, engines) inherit it; the rollout workers still set their
engine's own count (OMP_NUM_THREADS = the actor's CPUs).

Workers: scripts/test.sh runs the suite in two pytest-xdist workers, a test file at a time each (`--dist
loadfile`: a module's shared engine or Ray stays in one process): the modules that share the local Ray first, then
the others, each group longest first (tests/file_order.py). Each worker gets a temporary folder of its own
(TMPDIR, inherited by what it starts), so what one worker's tests make there -- sandbox scratch folders, rendezvous
files, private Ray folders, `ray start`'s address file -- is never counted, swept or attached to by the other's.
"""

from __future__ import annotations

import atexit
import os
import shutil
import tempfile
from pathlib import Path
from typing import NamedTuple

import pytest

for _name in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
    os.environ.setdefault(_name, "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")  # its thread pool would be one more per process

if os.environ.get("PYTEST_XDIST_WORKER"):  # short: Ray's socket paths under it must stay within 107 bytes
    _worker_tmp = tempfile.mkdtemp(prefix=f"{os.environ['PYTEST_XDIST_WORKER']}-")
    os.environ["TMPDIR"] = _worker_tmp
    tempfile.tempdir = None  # gettempdir() reads TMPDIR again
    atexit.register(shutil.rmtree, _worker_tmp, ignore_errors=True)

from cost_ratchet import CostRatchet  # noqa: E402
from support import SharedRay  # noqa: E402
from wheel_support import InstalledWheel, build_and_install  # noqa: E402

SHARED_RAY = SharedRay()


def pytest_configure(config) -> None:
    config.pluginmanager.register(CostRatchet(), "cost_ratchet")


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config, log):
    """`--dist loadfile` in the collection's order (`pytest_collection_modifyitems` below); other modes: xdist's."""
    if config.getvalue("dist") != "loadfile":
        return None
    from file_order import make_scheduler

    return make_scheduler(config, log)


RAY_MODULES: set[Path] = set()  # the test modules with a test that uses `local_ray`


@pytest.fixture(scope="module")
def local_ray(request: pytest.FixtureRequest):
    """A private local Ray (stare_agents.rollout.local_ray, 4 logical CPUs), one for all the consecutive modules
    that ask for it (tests/support.py: SharedRay); stopped before the first test of a module that does not, so
    no other test finds a Ray it did not ask for. Close the actors you start."""
    return SHARED_RAY.start()


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Notes the modules that use the shared Ray, and puts the files in the order the workers take them
    (tests/file_order.py): those modules first, then the others, each group longest first."""
    from file_order import file_seconds, longest_first

    RAY_MODULES.update(item.path for item in items if "local_ray" in getattr(item, "fixturenames", ()))
    ray_files = frozenset(item.nodeid.split("::", 1)[0] for item in items if item.path in RAY_MODULES)
    rank = {
        nodeid: i
        for i, nodeid in enumerate(longest_first([i.nodeid for i in items], file_seconds(), ray_files))
    }
    items.sort(key=lambda item: rank[item.nodeid])


@pytest.hookimpl(trylast=True)  # after the module's own fixtures (actors, groups) are torn down
def pytest_runtest_teardown(item: pytest.Item, nextitem: pytest.Item | None) -> None:
    """Stop the shared Ray when the next test's module does not use it."""
    if SHARED_RAY.running and (nextitem is None or nextitem.path not in RAY_MODULES):
        SHARED_RAY.stop()


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny random model (stare_agents.models), prepared once for the session."""
    from stare_agents.models import prepare_model

    return prepare_model("tiny", out=tmp_path_factory.mktemp("models") / "tiny")


@pytest.fixture(scope="session")
def toolcaller_model(tiny_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny "tool caller" (tests/rollout_support.py), fine-tuned once for the rollout and evaluation tests."""
    from rollout_support import train_toolcaller

    return train_toolcaller(tiny_model, tmp_path_factory.mktemp("models") / "toolcaller")


class TinyRun(NamedTuple):
    folder: Path
    summary: dict


@pytest.fixture(scope="session")
def tiny_two_step_run(tmp_path_factory: pytest.TempPathFactory) -> TinyRun:
    """A finished run of the tiny recipe as it is (SFT, two RL steps, a checkpoint after each, the held-out
    evaluations) on the local sandbox, for the tests that only read a run folder (tests/train, tests/viewer).
    Write nothing into it but what `stare-agents show` adds (rollouts.html)."""
    from stare_agents.train.config import load_config
    from stare_agents.train.trainer import train

    folder = tmp_path_factory.mktemp("tiny-two-step") / "run"
    overrides = [f"out_dir={folder}", "rollout.sandbox=local", "rl.steps=2"]
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("STARE_ALLOW_LOCAL_SANDBOX", "1")  # the acknowledgement the local sandbox asks for
        summary = train(load_config(recipe="tiny", overrides=overrides))
    return TinyRun(folder, summary)


@pytest.fixture(scope="session")
def installed_wheel(tmp_path_factory) -> InstalledWheel:
    """The checkout built as a wheel and installed into a folder outside it (once per session)."""
    return build_and_install(tmp_path_factory.mktemp("installed-wheel"))
