"""Fail closed: model-written code runs on the host only when asked for by name and acknowledged, never as
root, with a scrubbed environment, and may write only in its own scratch folder. `none` runs nothing."""

from __future__ import annotations

import os
import sys
import tempfile
from pathlib import Path

import pytest
from support import require

import stare_agents.sandbox.local as local_module
from stare_agents.envs.tools import PythonTool
from stare_agents.sandbox import ALLOW_LOCAL_ENV, LocalSandbox, NoSandbox, SandboxError, make_sandbox
from stare_agents.sandbox.runner import landlock_abi

REPO = Path(__file__).resolve().parents[2]


def test_docker_or_auto_without_the_image_refuses_instead_of_running_on_the_host(monkeypatch):
    monkeypatch.setenv(ALLOW_LOCAL_ENV, "1")  # even acknowledged, "auto" never picks the host
    for backend in ("docker", "auto"):
        with pytest.raises(SandboxError) as error:
            make_sandbox(backend, pool_size=1, image="stare-agents/no-such-image:0")
        message = str(error.value)
        assert "no-such-image" in message or "no Docker engine" in message
        assert "provision_docker.sh" in message and ALLOW_LOCAL_ENV in message


def test_local_backend_needs_the_acknowledgement(monkeypatch):
    monkeypatch.delenv(ALLOW_LOCAL_ENV, raising=False)
    with pytest.raises(SandboxError, match=ALLOW_LOCAL_ENV):
        make_sandbox("local", pool_size=1)
    with pytest.raises(SandboxError, match="allow_host_execution"):
        LocalSandbox(1)
    for not_an_ack in ("0", "", "no", "false"):
        monkeypatch.setenv(ALLOW_LOCAL_ENV, not_an_ack)
        with pytest.raises(SandboxError):
            LocalSandbox(1)
    monkeypatch.setenv(ALLOW_LOCAL_ENV, "1")
    assert isinstance(make_sandbox("local", pool_size=1), LocalSandbox)
    with pytest.raises(ValueError, match="podman"):
        make_sandbox("podman")  # type: ignore[arg-type]


def test_sandbox_none_makes_every_tool_call_a_tool_error_and_runs_nothing(tmp_path):
    marker = tmp_path / "ran"
    with make_sandbox("none") as sandbox:
        assert isinstance(sandbox, NoSandbox)
        tool = PythonTool(sandbox)
        output = tool({"code": f"open({str(marker)!r}, 'w').write('x')\nprint(42)"})
        assert output.status == "error" and "sandbox: none" in output.text
        assert not marker.exists()
        with pytest.raises(SandboxError, match="disabled"):
            sandbox.session()


def test_local_refuses_to_start_without_landlock(monkeypatch):
    monkeypatch.setattr(local_module, "landlock_abi", lambda: 0)
    with (
        pytest.raises(SandboxError, match="Landlock"),
        LocalSandbox(1, preimport=(), allow_host_execution=True),
    ):
        pass


@pytest.fixture(scope="module")
def confined():
    require(landlock_abi() >= 1, "Landlock (Linux >= 5.13)", "the local sandbox refuses to start without it")
    os.environ["STARE_TEST_SECRET"] = "hunter2"  # a host secret the code must not see
    try:
        with LocalSandbox(1, preimport=(), allow_host_execution=True) as box, box.session() as session:
            yield session
    finally:
        del os.environ["STARE_TEST_SECRET"]


def test_local_code_is_not_root_and_sees_a_scrubbed_environment(confined):
    result = confined.run(
        "import os\n"
        "print(os.geteuid(), os.getegid(), os.getgroups())\n"
        "print(sorted(os.environ))\n"
        "print(os.getcwd())\n"
        "try:\n"
        "    print('PARENT', open(f'/proc/{os.getppid()}/environ').read())\n"
        "except OSError as e:\n"
        "    print('denied', e.errno)\n"
    )
    assert result.status == "ok", result.stderr
    ids, names, cwd, parent = result.stdout.splitlines()
    uid, gid, groups = ids.split(" ", 2)
    assert uid != "0" and gid != "0" and groups == "[]"
    assert "STARE_TEST_SECRET" not in names and "hunter2" not in result.stdout
    assert "hunter2" not in parent
    assert cwd.startswith(os.path.join(tempfile.gettempdir(), "stare-sandbox-"))


@pytest.mark.parametrize(
    "target",
    [
        str(REPO / "envs" / "_grader_worker.py"),  # the grader a restarted worker would re-read
        str(REPO / "pyproject.toml"),
        os.path.join(sys.prefix, "pyvenv.cfg"),
        str(Path(local_module.__file__)),
    ],
)
def test_local_code_cannot_write_the_project_or_the_venv(confined, target):
    before = Path(target).read_bytes()
    result = confined.run(
        f"import os\npath = {target!r}\n"
        "for attempt in (lambda: open(path, 'a').write('pwned'), lambda: os.rename(path, path + '.x'),\n"
        "                lambda: os.unlink(path), lambda: open(path + '.new', 'w')):\n"
        "    try:\n"
        "        attempt()\n"
        "        print('WROTE')\n"
        "    except OSError:\n"
        "        print('denied')\n"
    )
    assert result.stdout.split() == ["denied"] * 4, result
    assert Path(target).read_bytes() == before
    assert not Path(target + ".new").exists() and not Path(target + ".x").exists()


def test_local_code_writes_only_in_its_own_folder(confined, tmp_path):
    outside = tmp_path / "outside"
    tmp_path.chmod(0o777)  # even a world-writable folder outside the scratch folder stays shut
    result = confined.run(
        "open('mine.txt', 'w').write('ok')\nprint(open('mine.txt').read())\n"
        f"try:\n    open({str(outside)!r}, 'w')\n    print('WROTE')\nexcept OSError:\n    print('denied')\n"
        "import os\ntry:\n    os.symlink('/etc/passwd', 'link'); os.remove('link'); print('linked')\n"
        "except OSError:\n    print('no link')\n"
    )
    assert result.stdout.split()[:2] == ["ok", "denied"], result
    assert not outside.exists()


def test_local_code_does_not_see_roots_home(confined):
    if os.geteuid() != 0:
        pytest.skip("only as root: the interpreters then run as nobody with root's home covered")
    result = confined.run(
        "import os\nprint(sorted(os.listdir('/root')) if os.path.isdir('/root') else [])\n"
        "try:\n    open('/root/.bash_history').read()\n    print('READ')\nexcept OSError:\n    print('denied')\n"
    )
    listing, read = result.stdout.splitlines()
    allowed = {part for path in (sys.base_prefix, sys.prefix) for part in Path(path).parts[2:3]}
    assert set(eval(listing)) <= allowed, listing  # only the interpreter's own folders are bound back
    assert read == "denied"
