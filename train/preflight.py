"""The pre-flight: before any model loads, every node a learner or rollout worker may run on checks, from the
node itself, what the run needs there, and one report names each node and what it lacks.

    node_preflight(config, run_folder, model_dir)   # PreflightError with the report, or one line in the log

What a node is asked (`NodeNeeds`, checked by `check_node` on the node: a Ray task pinned to it, or this
process where no Ray runs):
- the run folder: a marker the driver wrote just before (`<run>/.preflight`, a fresh random token); a node
  that does not read it there has other storage at that path (the learners' checkpoint shards would land on
  its own disk), and learner nodes must also be able to write there;
- the model folder: every file of the driver's copy, at the same path with the same size;
- the data files the rollout workers' environments read (`env.kwargs.dataset`, `env.kwargs.*_dataset`), the
  same;
- the modules `env.imports` names;
- CUDA, where the workers there take GPUs;
- on rollout nodes, the sandbox the workers run (Docker's engine and the image, or the local backend's needs):
  a CPU head or login node that runs no code needs none (the driver checks its own only when it runs code
  itself: `driver_runs_code`).

Which nodes: with Ray, every live node whose resources cover what one worker of the kind asks for (its CPUs,
GPUs and custom resources); without, this machine. A kind of worker no node can host is a problem too (Ray
would wait for one forever)."""

from __future__ import annotations

import importlib
import logging
import math
import os
import secrets
import socket
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from stare_agents.train.config import TrainConfig

logger = logging.getLogger("stare_agents.train")

MARKER = ".preflight"  # in the run folder while the pre-flight runs: the token every node must read there
ROLES = ("learner", "rollout")
PROBE_TIMEOUT_S = 180.0  # a node whose probe has not answered by then is reported, not waited for


class PreflightError(RuntimeError):
    """A node cannot run its part of the job; the message is the whole report (every node, what it lacks)."""


@dataclass(frozen=True)
class NodeNeeds:
    """What one node must have for the workers that may run there (see the module docstring)."""

    roles: tuple[str, ...]
    run_folder: str
    token: str  # what <run_folder>/.preflight holds
    writes_run_folder: bool = False  # learners write their checkpoint shards there
    files: tuple[tuple[str, str, int], ...] = ()  # (what, path, size in bytes) as the driver sees them
    imports: tuple[str, ...] = ()
    gpus: float = 0.0  # GPUs one worker there takes (0: none, no CUDA asked for)
    sandbox: str | None = None  # the rollout workers' sandbox backend (None: none to check here)
    sandbox_kwargs: Mapping[str, Any] = field(default_factory=dict)

    def merged(self, other: NodeNeeds) -> NodeNeeds:
        """The needs of a node that may host both kinds of worker."""
        return replace(
            self,
            roles=tuple(r for r in ROLES if r in self.roles or r in other.roles),
            writes_run_folder=self.writes_run_folder or other.writes_run_folder,
            files=tuple(dict.fromkeys(self.files + other.files)),
            imports=tuple(dict.fromkeys(self.imports + other.imports)),
            gpus=max(self.gpus, other.gpus),
            sandbox=self.sandbox or other.sandbox,
            sandbox_kwargs=self.sandbox_kwargs or other.sandbox_kwargs,
        )


@dataclass
class NodeReport:
    """What a node found: its Ray address (or "this machine"), its host name, its roles and what it lacks."""

    node: str
    host: str
    roles: tuple[str, ...]
    lacks: list[str]

    def line(self) -> str:
        head = f"node {self.node} (host {self.host}; {' and '.join(self.roles)} workers)"
        return (
            f"{head}: ready"
            if not self.lacks
            else f"{head} lacks:\n" + "\n".join(f"    - {x}" for x in self.lacks)
        )


# ---- the decisions (pure) ------------------------------------------------------------------------------
def cuda_problem(available: bool, devices: int, gpus: float) -> str | None:
    """Why a node whose torch sees `devices` CUDA devices (`available`: torch.cuda.is_available()) cannot run a
    worker that takes `gpus` GPUs, or None."""
    if gpus <= 0:
        return None
    needed = math.ceil(gpus)
    if not available or devices == 0:
        return (
            f"CUDA: a worker here takes {gpus:g} GPU(s) and torch sees none (torch.cuda.is_available() is False): "
            "install a CUDA build of torch that the node's NVIDIA driver supports (docs/cluster.md, Installing on a "
            "GPU node), or start this node's Ray without GPUs (ray start --num-gpus=0)"
        )
    if devices < needed:
        return (
            f"CUDA: a worker here takes {gpus:g} GPU(s) and torch sees {devices}: lower the GPUs per worker or check "
            "CUDA_VISIBLE_DEVICES in this node's `ray start` environment"
        )
    return None


def node_fits(resources: Mapping[str, float], request: Mapping[str, float]) -> bool:
    """Whether a node with these total resources can host a worker asking for `request` (Ray's resource names)."""
    return all(resources.get(name, 0.0) >= amount for name, amount in request.items() if amount > 0)


def shared_gpu_problem(hidden: int, started_here: bool, driver_node_gpus: float) -> str | None:
    """Why the learner in the trainer's process (on its machine's first GPU, `hidden` > 0) would share a GPU with
    an engine, or have left the engines none, or None. A Ray started here has that GPU hidden (`gpus_hidden`):
    fine while it has others to hand out. A cluster attached to counts the trainer's node's GPUs as its
    `ray start` found them, the learner's among them."""
    if hidden < 1:
        return None
    if started_here:
        if driver_node_gpus > 0:
            return None
        return (
            "the learner runs in the trainer's process on this machine's only visible GPU, which the local Ray does "
            "not hand out (an engine would share it), so no GPU is left for the rollout workers: run them on CPUs "
            "(rollout.num_gpus_per_worker=0) or on a machine with more GPUs"
        )
    if driver_node_gpus <= 0:
        return None
    return (
        f"the learner runs in the trainer's process on this node's first GPU, and the Ray cluster counts this node's "
        f"{driver_node_gpus:g} GPU(s) for the rollout engines, so an engine may be given the learner's GPU: run the "
        "trainer on a node whose `ray start` counts no GPU (--num-gpus=0) or none of the learner's (a "
        "CUDA_VISIBLE_DEVICES without it), or the learner as Ray workers on GPUs of their own "
        "(rl.learner_workers >= 2 with rl.learner_gpus_per_worker=1)"
    )


def learner_gpus_in_driver(config: TrainConfig, driver_has_gpu: bool) -> int:
    """The GPUs of the trainer's own process that rollout engines must not be given: 1 (cuda:0) when the learner
    runs there on a GPU and the engines are Ray workers that take GPUs, else 0."""
    r = config.rollout
    in_driver = config.rl.learner_workers == 1
    return 1 if driver_has_gpu and in_driver and r.use_ray and r.num_gpus_per_worker > 0 else 0


def report_text(reports: list[NodeReport], homeless: list[str]) -> str:
    """The one report: how many nodes cannot run their part, each node and what it lacks, the kinds of worker no
    node can host."""
    failing = [r for r in reports if r.lacks]
    head = (
        f"pre-flight: {len(failing)} of {len(reports)} node(s) cannot run their part of this run (each checked "
        "from the node itself, before any model loads)"
    )
    lines = [head, *(f"  {r.line()}" for r in reports), *(f"  {h}" for h in homeless)]
    return "\n".join(lines)


# ---- on the node ---------------------------------------------------------------------------------------
def check_node(needs: NodeNeeds, node: str | None = None) -> NodeReport:
    """Check `needs` here (on the node this runs on); the report names this node (`node`: its Ray address)."""
    lacks: list[str] = []
    folder = Path(needs.run_folder)
    marker = folder / MARKER
    try:
        seen = marker.read_text().strip()
    except OSError as error:
        lacks.append(
            f"run folder {folder}: the marker the driver wrote there ({marker}) cannot be read here "
            f"({type(error).__name__}: {error.strerror or error}): this node has other storage at that path, so "
            "checkpoints and shards written here would be lost to the others; put --out on storage every node "
            "mounts at the same path (NFS, Lustre, ...)"
        )
    else:
        if seen != needs.token:
            lacks.append(
                f"run folder {folder}: the marker there holds another run's token: this node sees another folder at "
                "that path; put --out on storage every node mounts at the same path"
            )
        elif needs.writes_run_folder:
            probe = folder / f".preflight-write-{socket.gethostname()}-{os.getpid()}"
            try:
                probe.write_text("ok")
                probe.unlink()
            except OSError as error:
                lacks.append(
                    f"run folder {folder}: cannot write there ({type(error).__name__}: {error.strerror or error}); "
                    "the learner workers write their checkpoint shards into it"
                )
    for what, path, size in needs.files:
        try:
            found = os.stat(path).st_size
        except OSError as error:
            lacks.append(
                f"{what} {path}: not readable here ({type(error).__name__}: {error.strerror or error}); put it on "
                "storage every node mounts at the same path"
            )
            continue
        if found != size:
            lacks.append(
                f"{what} {path}: {found} bytes here, {size} where the driver runs: another copy of it"
            )
    for module in needs.imports:
        try:
            importlib.import_module(module)
        except Exception as error:  # whatever the module raises on import
            lacks.append(
                f"env.imports {module!r}: cannot be imported here ({type(error).__name__}: {error}); install it on "
                "every node, or put its folder on PYTHONPATH when `ray start` runs"
            )
    if needs.gpus > 0:
        import torch

        available = torch.cuda.is_available()
        problem = cuda_problem(available, torch.cuda.device_count() if available else 0, needs.gpus)
        if problem:
            lacks.append(problem)
    if needs.sandbox is not None:
        from stare_agents.sandbox import SandboxError, check_backend

        try:
            check_backend(needs.sandbox, **dict(needs.sandbox_kwargs))
        except (SandboxError, ValueError) as error:
            lacks.append(f"sandbox {needs.sandbox!r} (rollout.sandbox) for the rollout workers: {error}")
    return NodeReport(node or "this process", socket.gethostname(), needs.roles, lacks)


# ---- on the driver -------------------------------------------------------------------------------------
def driver_runs_code(config: TrainConfig) -> bool:
    """Whether the trainer's own process runs model-written code (and so needs the sandbox itself): its rollout
    worker runs there (rollout.use_ray=false), or the cold start's solver traces are verified there."""
    return not config.rollout.use_ray or (config.sft.enabled and config.sft.data == "solver")


def role_needs(config: TrainConfig, run_folder: Path, model_dir: Path, token: str) -> dict[str, NodeNeeds]:
    """What a learner node and a rollout node need, as the driver sees the files."""
    model_files = tuple(
        ("model folder file", str(path), path.stat().st_size)
        for path in sorted(Path(model_dir).iterdir())
        if path.is_file()
    )
    datasets = tuple(
        (f"env.kwargs.{key}", str(value), Path(value).stat().st_size)
        for key, value in config.env.kwargs.items()
        if (key == "dataset" or key.endswith("_dataset")) and isinstance(value, str) and Path(value).is_file()
    )
    base = NodeNeeds(roles=(), run_folder=str(run_folder), token=token)
    sandbox = config.rollout.sandbox
    runs_code = sandbox != "none"
    learner_gpus = config.rl.learner_gpus_per_worker if config.rl.learner_workers > 1 else 0.0
    return {
        "learner": replace(
            base, roles=("learner",), writes_run_folder=True, files=model_files, gpus=learner_gpus
        ),
        "rollout": replace(
            base,
            roles=("rollout",),
            files=model_files + datasets,
            imports=tuple(config.env.imports),
            gpus=config.rollout.num_gpus_per_worker if config.rollout.use_ray else 0.0,
            sandbox=sandbox if runs_code else None,
            sandbox_kwargs=dict(config.rollout.sandbox_kwargs) if runs_code else {},
        ),
    }


def worker_requests(config: TrainConfig) -> dict[str, dict[str, float] | None]:
    """What one worker of each kind asks Ray for; None: it runs in the trainer's process."""
    r, rl = config.rollout, config.rl
    rollout = {"CPU": r.num_cpus_per_worker, "GPU": r.num_gpus_per_worker, **r.resources_per_worker}
    learner = {"CPU": 1.0, "GPU": rl.learner_gpus_per_worker, **rl.learner_resources_per_worker}
    return {"learner": learner if rl.learner_workers > 1 else None, "rollout": rollout if r.use_ray else None}


def plan_nodes(
    nodes: Iterable[Mapping[str, Any]],
    requests: Mapping[str, Mapping[str, float] | None],
    needs: Mapping[str, NodeNeeds],
) -> tuple[dict[str, tuple[str, NodeNeeds]], list[str]]:
    """Which node checks what: {node id: (its address, its merged needs)} over the live nodes (`ray.nodes()`
    entries), each kind of worker that runs as Ray workers on every node that can host one (a kind that runs in
    the trainer's process, request None, is checked there), and the kinds no node can host (said with the
    request and the remedy)."""
    live = [n for n in nodes if n.get("Alive")]
    plan: dict[str, tuple[str, NodeNeeds]] = {}
    homeless = []
    for role in ROLES:
        request = requests[role]
        if request is None:
            continue
        hosts = [n for n in live if node_fits(n.get("Resources", {}), request)]
        if not hosts:
            shown = {k: v for k, v in request.items() if v > 0}
            offered = [
                {k: v for k, v in n.get("Resources", {}).items() if not k.startswith("node:")} for n in live
            ]
            homeless.append(
                f"no node can host a {role} worker: none of the {len(live)} live node(s) has {shown} (they "
                f"offer {offered}); start the nodes with those resources (ray start --num-gpus, --resources) "
                "or ask for fewer"
            )
        for host in hosts:
            key = host["NodeID"]
            mine = needs[role]
            plan[key] = (host["NodeManagerAddress"], plan[key][1].merged(mine) if key in plan else mine)
    return plan, homeless


def node_preflight(
    config: TrainConfig, run_folder: Path, model_dir: Path, *, timeout_s: float = PROBE_TIMEOUT_S
) -> list[NodeReport]:
    """Every node checks what it needs (see the module docstring); returns the reports, or raises PreflightError
    with the one report naming each node and what it lacks. The marker is removed again either way."""
    token = f"{socket.gethostname()}-{os.getpid()}-{secrets.token_hex(8)}"
    marker = Path(run_folder) / MARKER
    marker.write_text(token + "\n")
    try:
        needs = role_needs(config, Path(run_folder), Path(model_dir), token)
        requests = worker_requests(config)
        here = [needs[role] for role in ROLES if requests[role] is None]  # what runs in the trainer's process
        reports, homeless = [], []
        if here:
            merged = here[0].merged(here[-1])
            reports.append(check_node(merged, "the trainer's process"))
        if len(here) < len(ROLES):
            on_ray, homeless = _probe_cluster(config, needs, timeout_s)
            reports += on_ray
    finally:
        marker.unlink(missing_ok=True)
    if homeless or any(r.lacks for r in reports):
        raise PreflightError(report_text(reports, homeless))
    logger.info(
        "pre-flight: %d node(s) ready (%s)",
        len(reports),
        ", ".join(f"{r.node}: {'+'.join(r.roles)}" for r in reports),
    )
    return reports


def start_ray(config: TrainConfig) -> tuple[int, bool]:
    """Ray for the run, unless this process has it: attached to the cluster the run names, else a private local
    instance (`init_ray`) started without the GPUs the trainer's own learner computes on
    (`learner_gpus_in_driver`, `gpus_hidden`). Returns (those GPUs, whether this call started a local instance)."""
    import ray
    import torch

    from stare_agents.rollout.gpu_layout import gpus_hidden
    from stare_agents.rollout.local_ray import init_ray

    hidden = learner_gpus_in_driver(config, torch.cuda.is_available())
    if ray.is_initialized():
        return hidden, False
    with gpus_hidden(hidden):
        attached = init_ray(config.rollout.ray_address)
    return hidden, attached is None


def _probe_cluster(
    config: TrainConfig, needs: dict[str, NodeNeeds], timeout_s: float
) -> tuple[list[NodeReport], list[str]]:
    """The checks as Ray tasks, one pinned to each node that may host a worker (no CPU taken: they run beside
    anything; a fresh worker process each, gone after it, so no CUDA state stays behind)."""
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    from stare_agents.rollout.worker_env import worker_runtime_env

    hidden, started_here = start_ray(config)
    nodes, driver_node = ray.nodes(), ray.util.get_node_ip_address()
    plan, homeless = plan_nodes(nodes, worker_requests(config), needs)
    driver_gpus = sum(
        n.get("Resources", {}).get("GPU", 0.0)
        for n in nodes
        if n.get("Alive") and n["NodeManagerAddress"] == driver_node
    )
    problem = shared_gpu_problem(hidden, started_here, driver_gpus)
    if problem:
        homeless.append(problem)
    env = worker_runtime_env()
    probe = ray.remote(num_cpus=0, max_calls=1)(check_node)
    pending = {
        probe.options(
            scheduling_strategy=NodeAffinitySchedulingStrategy(node_id, soft=False),
            **({"runtime_env": env} if env else {}),
        ).remote(node_needs, address): (address, node_needs)
        for node_id, (address, node_needs) in plan.items()
    }
    done, late = ray.wait(list(pending), num_returns=len(pending), timeout=timeout_s)
    reports = []
    for ref in done:
        try:
            reports.append(ray.get(ref))
        except Exception as error:  # the probe itself could not run there (a worker that does not start)
            address, node_needs = pending[ref]
            reports.append(
                NodeReport(address, "?", node_needs.roles, [f"the check could not run there: {error}"])
            )
    for ref in late:
        address, node_needs = pending[ref]
        ray.cancel(ref, force=True)
        reports.append(
            NodeReport(address, "?", node_needs.roles, [f"its check did not answer within {timeout_s:g} s"])
        )
    return sorted(reports, key=lambda r: r.node), homeless
