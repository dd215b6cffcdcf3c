"""A multi-node rehearsal on this machine (issue 29, deliverable 2): a Ray cluster of two nodes started with
`ray start`, the trainer attached to it by address, as a cluster user runs it.

- The head node on 127.0.0.2 (custom resource `rollout_node`) and a second node on 127.0.0.3 (`learner_node`),
  each with its own temp folder and working directory; token authentication on, the second node and the driver
  with the head's token. Ray maps 127.0.0.1 (and only it) to the machine's network address once multi-node is
  on, so the nodes take the next loopback addresses: every address Ray advertises is on loopback (Ray still
  binds its servers to every interface on a multi-node cluster; the token guards them).
- The driver (`stare-agents train`) attaches by RAY_ADDRESS, from a working directory of its own with a relative
  --out; it lands on the head node, with the rollout worker (rollout.resources_per_worker); the two learner
  workers go to the other node (rl.learner_resources_per_worker).
- The weights travel over the gloo sync group, opened by learner rank 0 on its node (127.0.0.3); the engine binds
  its own node's address (127.0.0.2), as the driver's log says.
- The driver is SIGKILLed once its first checkpoint exists and the run resumed from it (its learner shards
  written by the learner workers on the other node, into the driver's run folder by absolute path).
- Before any model loads, each node checks from itself what its workers need (the pre-flight,
  stare_agents.train.preflight); with a learner node that does not share the driver's folder (its processes in a
  mount namespace with an empty tmpfs there) the run stops at the pre-flight, naming that node and the run folder.

Every node, the driver and the query run in one network namespace whose only interface is loopback
(`unshare -rn`; ray_cluster_support.loopback_only_network): what listens on every interface there (Ray's servers
do on a multi-node cluster) listens on loopback only, not on the machine's network while the test runs.

The cluster is stopped by process id: only the processes of this cluster (see ray_cluster_support.stop_cluster),
never `ray stop`, which ends every Ray of the machine.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from ray_cluster_support import (
    cluster_env,
    loopback_only_network,
    mount_namespace_prefix,
    remove,
    short_folder,
    start_node,
)
from support import require

from stare_agents.records import read_records
from stare_agents.train.checkpoint import latest_checkpoint

HEAD_IP, LEARNER_IP = "127.0.0.2", "127.0.0.3"
COIN_ENV = Path(__file__).parents[1] / "train"  # tests/Coin-v0 (rewards with variance): on every node's path
RUN = [
    "--recipe",
    "tiny",
    "--out",
    "rel/run",  # relative to the driver's working directory, which no Ray worker shares
    "env.id=tests/Coin-v0",
    "env.kwargs={}",
    "env.imports=[coin_env]",
    "sft.enabled=false",
    "eval.num_tasks=2",
    "rl.steps=3",
    "rollout.use_ray=true",
    "rollout.sandbox=none",
    "rollout.weight_sync=collective",
    "rollout.resources_per_worker={rollout_node: 1}",
    "rl.learner_workers=2",
    "rl.learner_resources_per_worker={learner_node: 1}",
]

# where every actor and driver of the cluster ran, from the GCS's tables (no dashboard needed)
PLACES = r"""
import json, sys
import ray
from ray._private.state import state

ray.init(address=sys.argv[1], log_to_driver=False)
me = ray.get_runtime_context().get_job_id()
actors = [(a["ActorClassName"], a["Address"]["IPAddress"]) for a in state.actor_table(None).values()]
drivers = [j["DriverIPAddress"] for j in state.job_table() if j["JobID"] != me]
print(json.dumps({"actors": actors, "drivers": drivers}))
"""


def two_nodes(*, learner_node_hides_the_driver: bool = False):
    """(folder, address, network) of a two-node cluster in a loopback-only network namespace (`network`: the prefix
    that runs a command there); stopped by process id afterwards. With `learner_node_hides_the_driver` the
    learner node does not share the driver's folder (an empty tmpfs over it)."""
    with loopback_only_network() as network:
        require(network is not None, "a loopback-only network namespace (unshare -rn, nsenter and ip)")
        folder = short_folder()
        node_env = {"PYTHONPATH": str(COIN_ENV)}  # the environment's module, importable on every node
        (folder / "driver").mkdir()
        hidden = (folder / "driver",) if learner_node_hides_the_driver else ()
        try:
            address = start_node(
                folder, "head", ip=HEAD_IP, resources={"rollout_node": 1}, env=node_env, network=network
            )
            start_node(
                folder,
                "learner-node",
                ip=LEARNER_IP,
                head=address,
                resources={"learner_node": 2},
                env=node_env,
                hidden=hidden,
                network=network,
            )
            yield folder, address, network
        finally:
            remove(folder)


@pytest.fixture
def cluster():
    yield from two_nodes()


@pytest.fixture
def cluster_without_shared_storage():
    require(
        mount_namespace_prefix() is not None,
        "a private mount namespace (root, or unprivileged user namespaces)",
    )
    yield from two_nodes(learner_node_hides_the_driver=True)


def driver(folder: Path, address: str, network: list[str], *extra: str, log: Path) -> subprocess.Popen:
    cwd = folder / "driver"
    cwd.mkdir(exist_ok=True)
    env = {**cluster_env(folder), "RAY_ADDRESS": address, "PYTHONPATH": str(COIN_ENV)}
    env.pop("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER")
    command = [*network, sys.executable, "-m", "stare_agents.cli", "train", *RUN, *extra]
    with log.open("w") as out:
        return subprocess.Popen(
            command, cwd=cwd, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
        )


@pytest.mark.ray
@pytest.mark.slow
def test_a_run_on_a_two_node_cluster_attaches_places_syncs_and_resumes(cluster):
    folder, address, network = cluster
    run = folder / "driver" / "rel" / "run"
    first_log, second_log = folder / "first.log", folder / "second.log"

    first = driver(folder, address, network, log=first_log)
    deadline = time.monotonic() + 420
    while latest_checkpoint(run) is None:  # the first step's checkpoint (the learner's shards are in it)
        assert first.poll() is None, (
            f"the run ended before its first checkpoint:\n{first_log.read_text()[-4000:]}"
        )
        assert time.monotonic() < deadline, first_log.read_text()[-4000:]
        time.sleep(0.2)
    os.killpg(first.pid, signal.SIGKILL)  # the driver dies; Ray ends its job's actors
    first.wait()
    killed_at = latest_checkpoint(run).name

    second = driver(folder, address, network, "--resume", log=second_log)
    assert second.wait(timeout=420) == 0, second_log.read_text()[-4000:]

    # the run folder is the driver's, by absolute path; the nodes' working directories got nothing
    assert yaml.safe_load((run / "config.yaml").read_text())["out_dir"] == str(run)
    assert sorted(p.name for p in (folder / "head").iterdir()) == ["ray"]
    assert sorted(p.name for p in (folder / "learner-node").iterdir()) == ["ray"]
    # resumed from the killed attempt's checkpoint to the end: every step once, each with newer weights
    records = read_records(run / "metrics.jsonl", "rl")
    assert [r["step"] for r in records] == [0, 1, 2]
    assert all(r["rollout/weight_version"] >= r["step"] + 1 for r in records)
    assert latest_checkpoint(run).name == "step-00000003" and killed_at != "step-00000003"
    shards = run / "checkpoints" / "step-00000003" / "learner_shards"
    assert sorted(p.name for p in shards.glob("*.distcp")) == ["__0_0.distcp", "__1_0.distcp"]

    # each start checked every node from the node itself before any model loaded
    for log in (first_log, second_log):
        assert f"pre-flight: 2 node(s) ready ({HEAD_IP}: rollout, {LEARNER_IP}: learner)" in log.read_text()
    # the sync group opened by the learner on its node; the engine bound its own node's address
    for log in (first_log, second_log):
        said = re.search(
            r"weight sync: a gloo group of 2 opened by the learner on (\S+) .*the engines bind (\S+)",
            log.read_text(),
        )
        assert said is not None, log.read_text()[-4000:]
        assert said.groups() == (LEARNER_IP, HEAD_IP)

    # everything ran in a network with loopback alone: whatever listened on "every interface" listened there
    links = subprocess.run([*network, "ip", "-o", "link"], capture_output=True, text=True, check=True).stdout
    assert [line.split(":")[1].strip() for line in links.splitlines()] == ["lo"], links

    # the driver and the rollout worker on the head node, the learner workers on the other
    query = subprocess.run(
        [*network, sys.executable, "-c", PLACES, address],
        env=cluster_env(folder) | {"RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "1"},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert query.returncode == 0, query.stderr[-3000:]
    places = json.loads(query.stdout.strip().splitlines()[-1])
    actors: dict[str, set[str]] = {}
    for name, ip in places["actors"]:
        actors.setdefault(name, set()).add(ip)
    assert actors["LearnerWorker"] == {LEARNER_IP} and actors["RolloutWorker"] == {HEAD_IP}
    assert set(places["drivers"]) == {HEAD_IP} and len(places["drivers"]) == 2


@pytest.mark.ray
@pytest.mark.slow
def test_a_node_that_does_not_share_the_run_folder_stops_the_run_at_the_pre_flight(
    cluster_without_shared_storage,
):
    """The learner node sees an empty folder where the driver's run folder is: the run stops before any model loads
    or any worker starts, with one report naming that node, what it lacks and the remedy, and the ready one."""
    folder, address, network = cluster_without_shared_storage
    log = folder / "driver.log"
    started = time.monotonic()
    run = driver(folder, address, network, log=log)
    assert run.wait(timeout=300) == 2, log.read_text()[-4000:]
    text = log.read_text()
    assert "pre-flight: 1 of 2 node(s) cannot run their part of this run" in text, text[-4000:]
    assert re.search(
        rf"node {re.escape(LEARNER_IP)} \(host \S+; learner workers\) lacks:\n    - run folder ", text
    )
    assert "storage every node mounts at the same path" in text
    assert re.search(rf"node {re.escape(HEAD_IP)} \(host \S+; rollout workers\): ready", text)
    assert "rollout worker 0:" not in text  # no engine started, no model loaded
    run_folder = folder / "driver" / "rel" / "run"
    assert sorted(p.name for p in run_folder.iterdir()) == ["config.yaml"], text[-2000:]  # nothing trained
    assert time.monotonic() - started < 300


def test_an_engine_binds_its_own_nodes_address_the_sender_its_own(monkeypatch) -> None:
    """A rollout worker sets STARE_NODE_ADDRESS (its Ray node) for its engine's processes: a member of a sync group
    binds there, whatever the group's host; the sender binds the group's host."""
    from stare_agents.rollout.weight_sync import NODE_ADDRESS_ENV, GroupAddress, bind_host

    group = GroupAddress(LEARNER_IP, 1234, 3, "gloo", 5.0, store_path="/nonexistent/store")
    monkeypatch.delenv(NODE_ADDRESS_ENV, raising=False)
    assert [bind_host(group, rank) for rank in (0, 1)] == [LEARNER_IP, LEARNER_IP]  # one machine, no Ray
    monkeypatch.setenv(NODE_ADDRESS_ENV, HEAD_IP)
    assert [bind_host(group, rank) for rank in (0, 1, 2)] == [LEARNER_IP, HEAD_IP, HEAD_IP]


@pytest.mark.parametrize(
    "override",
    [
        "rollout.resources_per_worker={CPU: 1}",
        "rl.learner_resources_per_worker={GPU: 1}",
        "rl.learner_resources_per_worker={learner_node: 0}",
    ],
)
def test_custom_resources_other_than_rays_own_and_positive(override: str) -> None:
    from stare_agents.train.config import load_config

    with pytest.raises(ValueError, match="resources_per_worker"):
        load_config(recipe="tiny", overrides=[override])
    config = load_config(recipe="tiny", overrides=["rollout.resources_per_worker={rollout_node: 1}"])
    assert config.rollout.resources_per_worker == {"rollout_node": 1.0}
