"""A low-priority sandbox starts its containers at the normal CPU weight: starting a runner is the sandbox's
own work, and at a 16th of the weight beside busy processes a pool did not start in time (the run stopped with
"no containers left"). The model's code still runs at the low weight."""

from __future__ import annotations

import contextlib
import threading

import pytest
from support import require

from stare_agents.sandbox import DEFAULT_IMAGE, DockerSandbox, docker_backend, docker_status
from stare_agents.sandbox.docker_backend import (
    LOW_PRIORITY_PARENT,
    LOW_PRIORITY_SHARES,
    normal_weight_while_starting,
)


def _cgroups(tmp_path):
    """A fake cgroup root with the parent's weight file as cgroup v1 and v2 lay it out, both at the low weight."""
    v1 = tmp_path / "cpu" / LOW_PRIORITY_PARENT / "cpu.shares"
    v2 = tmp_path / (LOW_PRIORITY_PARENT + ".slice") / "cpu.weight"
    for path, value in ((v1, str(LOW_PRIORITY_SHARES)), (v2, "6")):
        path.parent.mkdir(parents=True)
        path.write_text(value)
    return v1, v2


def test_the_weight_is_normal_while_any_start_runs_and_low_again_after(tmp_path):
    v1, v2 = _cgroups(tmp_path)
    root = str(tmp_path)
    with normal_weight_while_starting(root):
        assert (v1.read_text(), v2.read_text()) == ("1024", "100")
        with normal_weight_while_starting(root):  # a second start in flight
            pass
        assert v1.read_text() == "1024"  # the first is still starting
    assert (v1.read_text(), v2.read_text()) == (str(LOW_PRIORITY_SHARES), "6")
    with pytest.raises(RuntimeError), normal_weight_while_starting(root):
        raise RuntimeError("the runner did not start")
    assert v1.read_text() == str(LOW_PRIORITY_SHARES)  # a failed start lowers it again too


def test_overlapping_starts_on_threads_keep_it_normal_until_the_last_ends(tmp_path):
    v1, _ = _cgroups(tmp_path)
    inside, release, seen = threading.Barrier(4), threading.Event(), []

    def start():
        with normal_weight_while_starting(str(tmp_path)):
            inside.wait(timeout=10)
            release.wait(timeout=10)
            seen.append(v1.read_text())

    threads = [threading.Thread(target=start) for _ in range(3)]
    for thread in threads:
        thread.start()
    inside.wait(timeout=10)
    assert v1.read_text() == "1024"
    release.set()
    for thread in threads:
        thread.join(timeout=10)
    assert "1024" in seen and v1.read_text() == str(LOW_PRIORITY_SHARES)


def test_no_cgroup_files_is_no_error(tmp_path):
    with normal_weight_while_starting(str(tmp_path / "absent")):
        pass


@pytest.mark.docker
def test_a_low_priority_sandbox_starts_each_container_inside_the_normal_weight(monkeypatch):
    available, reason = docker_status(DEFAULT_IMAGE)
    require(
        available,
        "a Docker engine with the sandbox image",
        f"{reason} (as root: bash scripts/provision_docker.sh)",
    )
    calls = []

    @contextlib.contextmanager
    def recorder(cgroup_root: str = "/sys/fs/cgroup"):
        calls.append("enter")
        yield
        calls.append("exit")

    monkeypatch.setattr(docker_backend, "normal_weight_while_starting", recorder)
    with DockerSandbox(pool_size=1, limits={"low_priority": True}) as box:
        assert box.run("print(6 * 7)").stdout.strip() == "42"
    assert calls[:2] == ["enter", "exit"]
    calls.clear()
    with DockerSandbox(pool_size=1) as box:  # normal priority: nothing to raise
        assert box.run("print(1)").stdout.strip() == "1"
    assert calls == []
