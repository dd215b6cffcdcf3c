"""The pre-flight (issue 50, item 2): every node a worker may run on checks, from the node itself, the run folder
(the driver's marker), the model folder, the data files, the environment's modules, CUDA where GPUs are asked for,
and the rollout workers' sandbox; one report names each node and what it lacks. The check of one node runs here
(`check_node`, what a Ray task runs on each node); which node checks what is a pure function of Ray's node table.
The two-node run of it, with one node that does not share the run folder, is in
tests/rollout/test_cluster_rehearsal.py."""

from __future__ import annotations

from pathlib import Path

import pytest

from stare_agents.train.checkpoint import missing_shards, save_checkpoint
from stare_agents.train.config import load_config
from stare_agents.train.preflight import (
    MARKER,
    NodeNeeds,
    NodeReport,
    PreflightError,
    check_node,
    cuda_problem,
    driver_runs_code,
    node_preflight,
    plan_nodes,
    report_text,
    role_needs,
    worker_requests,
)


@pytest.fixture
def run(tmp_path) -> tuple[Path, Path, Path]:
    """(run folder with the driver's marker, a model folder, a dataset)."""
    folder = tmp_path / "run"
    folder.mkdir()
    (folder / MARKER).write_text("token-1\n")
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text("{}")
    (model / "model.safetensors").write_bytes(b"\0" * 64)
    data = tmp_path / "problems.jsonl"
    data.write_text('{"problem": "1 + 1?", "answer": "2"}\n')
    return folder, model, data


def needs(run_folder: Path, **changes) -> NodeNeeds:
    return NodeNeeds(roles=("learner",), run_folder=str(run_folder), token="token-1", **changes)


def test_a_node_that_sees_everything_is_ready(run):
    folder, model, data = run
    files = (
        ("model folder file", str(model / "model.safetensors"), 64),
        ("env.kwargs.dataset", str(data), data.stat().st_size),
    )
    report = check_node(needs(folder, writes_run_folder=True, files=files, imports=("json",)), "10.0.0.5")
    assert report.lacks == [] and report.node == "10.0.0.5"
    assert report.line().endswith("ready") and list(folder.iterdir()) == [
        folder / MARKER
    ]  # its write probe went


def test_a_node_with_other_storage_at_the_run_folders_path_says_so(run, tmp_path):
    folder, _, _ = run
    (lacks,) = check_node(needs(tmp_path / "elsewhere")).lacks
    assert "marker the driver wrote there" in lacks and "storage every node mounts" in lacks
    (folder / MARKER).write_text("another-run\n")
    (lacks,) = check_node(needs(folder)).lacks
    assert "another run's token" in lacks


def test_a_node_lacking_files_modules_cuda_or_the_sandbox_names_each(run, monkeypatch):
    folder, model, data = run
    files = (
        ("model folder file", str(model / "model.safetensors"), 65),  # another copy: another size
        ("env.kwargs.dataset", str(data.with_name("missing.jsonl")), 10),
    )
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    hostile = needs(
        folder,
        files=files,
        imports=("no_such_module_anywhere",),
        gpus=1.0,
        sandbox="docker",
        sandbox_kwargs={"image": "stare-agents/no-such-image:0"},
    )
    from stare_agents.sandbox import docker_backend

    monkeypatch.setattr(docker_backend, "docker_status", lambda *a, **k: (False, "no Docker engine answers"))
    lacks = check_node(hostile).lacks
    assert len(lacks) == 5, lacks
    assert "64 bytes here, 65 where the driver runs" in lacks[0]
    assert "missing.jsonl: not readable here" in lacks[1]
    assert "env.imports 'no_such_module_anywhere'" in lacks[2]
    assert "torch sees none" in lacks[3] and "--num-gpus=0" in lacks[3]
    assert lacks[4].startswith("sandbox 'docker' (rollout.sandbox) for the rollout workers:")


@pytest.mark.parametrize(
    ("available", "devices", "gpus", "says"),
    [
        (True, 8, 0.0, None),  # no GPU asked for: no CUDA needed
        (False, 0, 0.0, None),
        (True, 1, 0.5, None),  # a share of one device
        (True, 2, 2.0, None),
        (False, 0, 1.0, "torch sees none"),
        (True, 0, 1.0, "torch sees none"),
        (True, 1, 2.0, "torch sees 1"),  # tensor parallel 2 on a node whose torch sees one GPU
    ],
)
def test_cuda_is_asked_for_where_gpus_are(available, devices, gpus, says):
    problem = cuda_problem(available, devices, gpus)
    assert (problem is None) if says is None else (says in problem)


def node(ip: str, node_id: str, alive: bool = True, **resources: float) -> dict:
    return {"NodeID": node_id, "NodeManagerAddress": ip, "Alive": alive, "Resources": resources}


def test_every_node_that_may_host_a_worker_checks_what_that_worker_needs(run):
    folder, model, _ = run
    config = load_config(
        recipe="tiny",
        overrides=[
            "rollout.use_ray=true",
            "rollout.num_gpus_per_worker=1",
            "rollout.resources_per_worker={rollout_node: 1}",
            "rl.learner_workers=2",
            "rl.learner_gpus_per_worker=1",
            "rl.learner_resources_per_worker={learner_node: 1}",
        ],
    )
    by_role = role_needs(config, folder, model, "token-1")
    assert by_role["learner"].writes_run_folder and not by_role["rollout"].writes_run_folder
    assert (
        by_role["rollout"].sandbox == "docker" and by_role["learner"].sandbox is None
    )  # Docker on rollout nodes
    nodes = [
        node("10.0.0.1", "head", CPU=8),  # a CPU head node: neither kind of worker fits
        node("10.0.0.2", "a", CPU=8, GPU=8, rollout_node=8),
        node("10.0.0.3", "b", CPU=8, GPU=8, learner_node=8, rollout_node=8),
        node("10.0.0.4", "dead", alive=False, CPU=8, GPU=8, learner_node=8),
    ]
    plan, homeless = plan_nodes(nodes, worker_requests(config), by_role)
    assert homeless == []
    assert {key: (ip, n.roles) for key, (ip, n) in plan.items()} == {
        "a": ("10.0.0.2", ("rollout",)),
        "b": ("10.0.0.3", ("learner", "rollout")),
    }
    assert plan["b"][1].writes_run_folder and plan["b"][1].sandbox == "docker" and plan["b"][1].gpus == 1.0
    # no node has what a learner worker asks for: said, with the request, instead of Ray waiting forever
    _, homeless = plan_nodes(nodes[:2], worker_requests(config), by_role)
    (said,) = homeless
    assert said.startswith("no node can host a learner worker") and "'learner_node': 1.0" in said
    # a learner in the trainer's process, rollouts without Ray: no node of Ray's checks for them (the trainer's
    # process does, below)
    local = load_config(recipe="tiny")
    assert plan_nodes(nodes, worker_requests(local), role_needs(local, folder, model, "t")) == ({}, [])


def test_the_report_names_every_node_and_what_it_lacks():
    reports = [
        NodeReport("10.0.0.2", "gpu-a", ("rollout",), []),
        NodeReport("10.0.0.3", "gpu-b", ("learner",), ["run folder /runs/x: ...", "CUDA: ..."]),
    ]
    text = report_text(reports, ["no node can host a rollout worker: ..."])
    assert text.splitlines()[0].startswith("pre-flight: 1 of 2 node(s) cannot run their part of this run")
    assert "node 10.0.0.2 (host gpu-a; rollout workers): ready" in text
    assert (
        "node 10.0.0.3 (host gpu-b; learner workers) lacks:\n    - run folder /runs/x: ...\n    - CUDA"
        in text
    )
    assert text.splitlines()[-1] == "  no node can host a rollout worker: ..."


def test_without_ray_the_trainers_process_checks_everything_and_the_marker_goes(run, monkeypatch):
    folder, model, _ = run
    (folder / MARKER).unlink()
    config = load_config(recipe="tiny", overrides=["rollout.sandbox=none"])
    (report,) = node_preflight(config, folder, model)
    assert report.roles == ("learner", "rollout") and report.lacks == [] and not (folder / MARKER).exists()
    assert report.node == "the trainer's process"
    monkeypatch.setattr(
        "stare_agents.train.preflight.check_node",
        lambda n, node=None: NodeReport("x", "h", n.roles, ["lack"]),
    )
    with pytest.raises(PreflightError, match=r"1 of 1 node\(s\) cannot run"):
        node_preflight(config, folder, model)
    assert not (folder / MARKER).exists()


def test_the_driver_needs_a_sandbox_only_where_it_runs_code():
    assert driver_runs_code(load_config(recipe="tiny"))  # its rollout worker runs in the trainer's process
    assert driver_runs_code(
        load_config(recipe="tiny", overrides=["rollout.use_ray=true"])
    )  # the solver's traces
    assert not driver_runs_code(
        load_config(recipe="tiny", overrides=["rollout.use_ray=true", "sft.enabled=false"])
    )
    assert not driver_runs_code(load_config(recipe="qwen2.5-7b-tir-stare-c2"))  # SFT from a file of traces


def test_a_sharded_checkpoint_holds_a_shard_file_per_rank_or_is_not_kept(tmp_path):
    def shards_of(ranks: list[int], metadata: bool = True):
        def write(folder: Path) -> dict:
            folder.mkdir(parents=True)
            for rank in ranks:
                (folder / f"__{rank}_0.distcp").write_bytes(b"x")
            if metadata:
                (folder / ".metadata").write_bytes(b"m")
            return {"small": 1}

        return write

    path = tmp_path / "checkpoints" / "step-00000001"
    save_checkpoint({"next_step": 1}, path, shards=shards_of([0, 1]), ranks=2)
    assert missing_shards(path / "learner_shards", 2) == []
    for ranks, metadata, says in (
        ([0], True, "__1_0.distcp (rank 1's)"),
        ([1], False, ".metadata (rank 0's)"),
    ):
        other = tmp_path / "checkpoints" / "step-00000002"
        with pytest.raises(
            RuntimeError, match=r"lacks .*" + says.replace("(", r"\(").replace(")", r"\)")
        ) as caught:
            save_checkpoint({"next_step": 2}, other, shards=shards_of(ranks, metadata), ranks=2)
        assert "storage every node mounts" in str(caught.value)
        assert not other.exists() and sorted(p.name for p in other.parent.iterdir()) == ["step-00000001"]
