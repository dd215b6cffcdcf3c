"""Weights from the learner to the rollout engines over a collective, without the driver.

The learner's rank 0 (the sender) and every rollout engine form a process group of their own (gloo on CPUs,
NCCL on GPUs: the same code, only the backend and the device differ), rendezvousing through a TCP store on the
sender's node. The sender opens each group itself (`open_group`, in its own process): it binds the store's
port on its node and reports the address, so the driver, which may run on another node, never binds anything. A sync is: the sender announces a `WeightsPlan` (names, shapes, dtype, buckets, version),
every engine starts receiving, and the sender broadcasts the weights bucket by bucket (one flat buffer of
about `bucket_mb` each), so neither side ever holds a second full copy of the model; each engine feeds the
received tensors to its own loader as they arrive (vLLM: `reload_weights` with an iterator, inside the engine's
worker process through a worker extension; the HF engine: `load_state_dict` per bucket).

Every collective has the group's timeout; the plan's version becomes the engine's weight version only when the
whole plan was received and loaded, and the receiver checks each bucket's byte count against the plan. A
member that fails (a dead engine, a timeout) leaves the group unusable: the driver forms a new group with the
members that are left (or a replaced worker) and sends again.
"""

from __future__ import annotations

import contextlib
import datetime
import hashlib
import ipaddress
import math
import os
import shutil
import socket
import sys
import tempfile
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, Protocol

import torch
import torch.distributed as dist

BACKENDS = ("gloo", "nccl")
# how the trainer moves weights to the engines: "driver" (the learner's state dict through Ray's object store),
# "collective" (this module), "auto" (collective with GPUs or a data-parallel learner, driver otherwise)
WeightSync = Literal["auto", "driver", "collective"]


def free_address(host: str = "127.0.0.1") -> tuple[str, int]:
    """A free TCP port on `host` (an address of this machine)."""
    with socket.socket() as probe:
        probe.bind((host, 0))
        return host, probe.getsockname()[1]


def is_loopback(host: str) -> bool:
    return ipaddress.ip_address(socket.gethostbyname(host)).is_loopback


def listening_store(host: str, world_size: int, timeout: datetime.timedelta, port: int = 0) -> Any:
    """A TCPStore server (rank 0's) listening on `host` only, the address its peers connect to, on `port` (0: one
    the kernel picks). torch's TCPStore, given a host, still listens on every interface (and answers anyone,
    without authentication): here it listens on a socket bound to `host` first (`master_listen_fd`)."""
    family, kind, proto, _, where = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0]
    listener = socket.socket(family, kind, proto)
    try:
        listener.bind(where[:2])
        listener.listen(max(128, world_size))
    except OSError:
        listener.close()
        raise
    return dist.TCPStore(
        host,
        listener.getsockname()[1],
        world_size,
        is_master=True,
        timeout=timeout,
        wait_for_workers=False,
        master_listen_fd=listener.detach(),  # the store owns the socket from here
        use_libuv=True,
    )


def open_group(
    host: str, world_size: int, backend: str = "gloo", timeout_s: float = 300.0
) -> tuple[GroupAddress, Any]:
    """A new group, opened by its sender (rank 0) in its own process on its node `host`: (its address, the store
    the sender keeps for `SyncGroup(address, 0, store=...)`). On loopback the store is a file in a fresh private
    folder (nothing listens; the port is only the group's name); elsewhere a TCP store already listening on a
    port the kernel picked, on `host` only (`listening_store`), so nothing can take it between choosing and
    binding and it is not reachable on the node's other interfaces."""
    timeout = datetime.timedelta(seconds=timeout_s)
    if is_loopback(host):
        store_path = str(Path(tempfile.mkdtemp(prefix="stare-sync-")) / "store")
        store = dist.FileStore(store_path, world_size)
        store.set_timeout(timeout)
        address = GroupAddress(host, free_address(host)[1], world_size, backend, timeout_s, store_path)
        return address, store
    store = listening_store(host, world_size, timeout)
    return GroupAddress(host, store.port, world_size, backend, timeout_s), store


def sync_ranks(sizes: Iterable[int]) -> tuple[int, list[int]]:
    """(world size, each member's first rank) of a group whose sender is rank 0 and whose members receive in
    `sizes[i]` processes each (a vLLM engine: one per tensor/pipeline-parallel worker, every one a rank of its
    own, as NCCL needs one per GPU; the HF engine: one). Member i's processes are ranks first[i] ... first[i] +
    sizes[i] - 1."""
    firsts, next_rank = [], 1
    for size in sizes:
        if size < 1:
            raise ValueError(f"a group member receives in at least one process, got {size}")
        firsts.append(next_rank)
        next_rank += size
    return next_rank, firsts


def address_towards(host: str) -> str:
    """This machine's address on the route to `host` (the source address the kernel picks for it; no packet is
    sent): where a group member on another node than the sender binds its gloo socket."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        probe.connect((socket.gethostbyname(host), 9))
        return probe.getsockname()[0]


@dataclass(frozen=True)
class GroupAddress:
    """Where and how a sync group meets: the store's host and port, the number of members (the sender is
    rank 0, engines are ranks 1..world_size-1), the backend and the timeout of every operation."""

    host: str
    port: int
    world_size: int
    backend: str = "gloo"
    timeout_s: float = 300.0
    # a loopback group meets through a file in a private folder instead of a TCP store (which listens on every
    # interface whatever its host): nothing of a single-machine run is reachable from the network
    store_path: str | None = None

    def __post_init__(self) -> None:
        if self.backend not in BACKENDS:
            raise ValueError(f"backend must be one of {BACKENDS}, got {self.backend!r}")
        if self.world_size < 2:
            raise ValueError(f"a sync group needs the sender and at least one engine, got {self.world_size}")


class SyncError(RuntimeError):
    """A sync group's collective failed (a timeout, a lost member); the message names the group and the remedy."""


# NCCL's default (TORCH_NCCL_ASYNC_ERROR_HANDLING=3) kills the whole process when a collective times out: the
# learner's rank 0 with its optimiser state. A sync group's communicator is aborted instead, and its wait
# raises (blocking wait), unless the environment chose otherwise. Both are read when a group is constructed.
NCCL_SYNC_ERROR_HANDLING = {"TORCH_NCCL_ASYNC_ERROR_HANDLING": "2", "TORCH_NCCL_BLOCKING_WAIT": "1"}


@contextlib.contextmanager
def nccl_errors_raise() -> Iterator[None]:
    """Around the construction of an NCCL group: NCCL_SYNC_ERROR_HANDLING where the environment sets neither
    name (nor NCCL's older spelling without TORCH_), restored afterwards."""
    added = [
        name
        for name in NCCL_SYNC_ERROR_HANDLING
        if name not in os.environ and name.removeprefix("TORCH_") not in os.environ
    ]
    for name in added:
        os.environ[name] = NCCL_SYNC_ERROR_HANDLING[name]
    try:
        yield
    finally:
        for name in added:
            os.environ.pop(name, None)


class SyncGroup:
    """One member of a sync group: a process group made from its own store, outside torch.distributed's
    default group (a learner rank keeps its data-parallel group; an engine process has none). The sender
    (rank 0) passes the store `open_group` made; the others connect to it."""

    def __init__(self, address: GroupAddress, rank: int, *, store: Any = None) -> None:
        if not 0 <= rank < address.world_size:
            raise ValueError(f"rank {rank} is not in a group of {address.world_size}")
        self.address, self.rank = address, rank
        timeout = datetime.timedelta(seconds=address.timeout_s)
        if store is not None:
            self.store = store
        elif address.store_path is not None:
            self.store = dist.FileStore(address.store_path, address.world_size)
            self.store.set_timeout(timeout)
        else:
            self.store = dist.TCPStore(
                address.host, address.port, address.world_size, is_master=rank == 0, timeout=timeout
            )
        if address.backend == "gloo":
            options = dist.ProcessGroupGloo._Options()
            options._timeout = timeout
            options._devices = [gloo_device(address, rank)]
            self.group = dist.ProcessGroupGloo(self.store, rank, address.world_size, options)
            self.device = torch.device("cpu")
        else:
            options = dist.ProcessGroupNCCL.Options()
            options._timeout = timeout
            with nccl_errors_raise():
                self.group = dist.ProcessGroupNCCL(self.store, rank, address.world_size, options)
            self.device = torch.device("cuda", torch.cuda.current_device())

    def broadcast(self, tensor: torch.Tensor) -> None:
        """From rank 0 to everyone, in place; raises `SyncError` when the group's timeout passes (this process
        and its other groups go on; the group itself is unusable)."""
        try:
            self.group.broadcast([tensor], dist.BroadcastOptions()).wait()
        except RuntimeError as error:  # gloo's and NCCL's timeouts and lost peers (DistBackendError included)
            a = self.address
            raise SyncError(
                f"weight sync: the {a.backend} group at {a.host}:{a.port} (rank 0 the learner, ranks 1-"
                f"{a.world_size - 1} the engines' processes) failed at rank {self.rank} within its "
                f"{a.timeout_s:g} s timeout: {error}. A member did not take part: an engine that died or hangs "
                "(its worker's log says), or a network path between the nodes that does not carry it (a "
                "firewall, or NCCL_SOCKET_IFNAME / GLOO_SOCKET_IFNAME naming the wrong interface; the driver's "
                "log names where each side binds). The group is left; the next sync forms a new one"
            ) from error

    def close(self) -> None:
        self.group = None
        self.store = None
        if self.rank == 0 and self.address.store_path is not None:  # the sender made the folder
            shutil.rmtree(Path(self.address.store_path).parent, ignore_errors=True)


# the address of the Ray node a rollout worker runs on, set by the worker (`RolloutWorker`) for its engine's
# processes (a multiprocess vLLM engine's core has no Ray of its own): where its members of a sync group bind
NODE_ADDRESS_ENV = "STARE_NODE_ADDRESS"


def bind_host(address: GroupAddress, rank: int) -> str:
    """The address a gloo member binds (without GLOO_SOCKET_IFNAME): the sender its own (the group's host); a
    member the address of its Ray node (STARE_NODE_ADDRESS, set by its rollout worker), else, on loopback, the
    sender's, else its own address on the route to the sender (binding the sender's address there fails)."""
    if rank == 0:
        return address.host
    if os.environ.get(NODE_ADDRESS_ENV):
        return os.environ[NODE_ADDRESS_ENV]
    if address.store_path is not None or is_loopback(address.host):
        return address.host
    return address_towards(address.host)


def gloo_device(address: GroupAddress, rank: int) -> Any:
    """The gloo device a member binds: the interface GLOO_SOCKET_IFNAME names when set, else `bind_host`."""
    interface = os.environ.get("GLOO_SOCKET_IFNAME", "").split(",")[0]
    if interface:
        return dist.ProcessGroupGloo.create_device(interface=interface)
    return dist.ProcessGroupGloo.create_device(hostname=bind_host(address, rank))


# what weights may travel as: the engines' dtype (float16 for an fp16 run, as the official STARE runs)
WIRE_DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}


@dataclass(frozen=True)
class WeightsPlan:
    """What a sync sends: tensor names and shapes in sending order, the wire dtype, the buckets (index ranges
    into `names`) and the weight version the engines take once everything arrived."""

    names: tuple[str, ...]
    shapes: tuple[tuple[int, ...], ...]
    dtype: str  # a WIRE_DTYPES key: "bfloat16", "float16" or "float32"
    buckets: tuple[tuple[int, int], ...]
    version: int
    numels: tuple[int, ...] = field(init=False)

    def __post_init__(self) -> None:
        if len(self.names) != len(self.shapes) or len(set(self.names)) != len(self.names):
            raise ValueError("a weights plan needs one shape per name and no name twice")
        object.__setattr__(self, "numels", tuple(math.prod(s) for s in self.shapes))
        covered = [i for start, end in self.buckets for i in range(start, end)]
        if covered != list(range(len(self.names))):
            raise ValueError("the buckets of a weights plan must cover every tensor once, in order")

    @property
    def torch_dtype(self) -> torch.dtype:
        return WIRE_DTYPES[self.dtype]

    def bucket_numel(self, bucket: int) -> int:
        start, end = self.buckets[bucket]
        return sum(self.numels[start:end])

    @classmethod
    def of(
        cls,
        shapes: Iterable[tuple[str, tuple[int, ...]]],
        *,
        dtype: torch.dtype = torch.bfloat16,
        version: int,
        bucket_mb: float = 256.0,
    ) -> WeightsPlan:
        """Buckets of about `bucket_mb` (a tensor larger than that is a bucket of its own)."""
        names, sizes = [], []
        for name, shape in shapes:
            names.append(name)
            sizes.append(tuple(int(d) for d in shape))
        limit = max(1, int(bucket_mb * 2**20) // torch.empty(0, dtype=dtype).element_size())
        buckets, start, filled = [], 0, 0
        for i, shape in enumerate(sizes):
            n = math.prod(shape)
            if i > start and filled + n > limit:
                buckets.append((start, i))
                start, filled = i, 0
            filled += n
        if sizes:
            buckets.append((start, len(sizes)))
        wire = {d: name for name, d in WIRE_DTYPES.items()}.get(dtype)
        if wire is None:
            raise ValueError(f"weights travel as one of {sorted(WIRE_DTYPES)}, not {dtype}")
        return cls(tuple(names), tuple(sizes), wire, tuple(buckets), int(version))

    def to_dict(self) -> dict[str, Any]:
        return {
            "names": list(self.names),
            "shapes": [list(s) for s in self.shapes],
            "dtype": self.dtype,
            "buckets": [list(b) for b in self.buckets],
            "version": self.version,
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> WeightsPlan:
        return cls(
            tuple(data["names"]),
            tuple(tuple(s) for s in data["shapes"]),
            data["dtype"],
            tuple(tuple(b) for b in data["buckets"]),
            int(data["version"]),
        )


def send_weights(group: SyncGroup, plan: WeightsPlan, tensors: Iterable[torch.Tensor]) -> None:
    """Rank 0: broadcast `tensors` (in the plan's order, any dtype and device) bucket by bucket, each cast to
    the wire dtype while it is copied into the bucket's flat buffer. A failed broadcast raises `SyncError`
    after the rest of `tensors` was drawn, so that the learner's other ranks leave their gathers too."""
    if group.rank != 0:
        raise ValueError("only rank 0 sends")
    source = iter(tensors)
    for bucket, (start, end) in enumerate(plan.buckets):
        flat = torch.empty(plan.bucket_numel(bucket), dtype=plan.torch_dtype, device=group.device)
        offset = 0
        for i in range(start, end):
            tensor = next(source, None)
            if tensor is None:
                raise ValueError(f"the weights ran out at {plan.names[i]!r}: the plan has {len(plan.names)}")
            if tuple(tensor.shape) != plan.shapes[i]:
                raise ValueError(
                    f"{plan.names[i]}: shape {tuple(tensor.shape)}, the plan says {plan.shapes[i]}"
                )
            flat[offset : offset + plan.numels[i]].copy_(tensor.detach().reshape(-1))
            offset += plan.numels[i]
        try:
            group.broadcast(flat)
        except SyncError:  # under FSDP each tensor is a gather the other learner ranks wait in: finish them
            for _ in source:
                pass
            raise
    if next(source, None) is not None:
        raise ValueError("more weights than the plan has")


def receive_weights(group: SyncGroup, plan: WeightsPlan) -> Iterator[tuple[str, torch.Tensor]]:
    """Ranks > 0: (name, tensor) in the plan's order, each bucket received when the consumer reaches it.
    The tensors are views of the bucket's buffer: a consumer copies them into the model (as loaders do)."""
    if group.rank == 0:
        raise ValueError("rank 0 sends; it does not receive")
    for bucket, (start, end) in enumerate(plan.buckets):
        flat = torch.empty(plan.bucket_numel(bucket), dtype=plan.torch_dtype, device=group.device)
        group.broadcast(flat)
        offset = 0
        for i in range(start, end):
            yield plan.names[i], flat[offset : offset + plan.numels[i]].view(plan.shapes[i])
            offset += plan.numels[i]


class WeightSender(Protocol):
    """The learner's end of a sync group, as the rollout workers' driver asks it
    (`RolloutWorkerGroup.update_weights_from`): a learner in this process (`ModelSender`) or a data-parallel
    learner group's rank 0 through Ray (`stare_agents.train.distributed`)."""

    def open(self, world_size: int, *, engines_on_gpu: bool, timeout_s: float = 300.0) -> GroupAddress:
        """Open a new group on the sender's node (its store's port bound there) and return its address."""
        ...

    def join(self, address: GroupAddress) -> None:
        """Join the group opened by `open` as rank 0; returns once every engine joined."""
        ...

    def plan(self, *, version: int, dtype: torch.dtype, bucket_mb: float = 256.0) -> WeightsPlan: ...

    def send(self, plan: WeightsPlan, port: int) -> None:
        """Broadcast the current weights to the group on `port`, bucket by bucket."""
        ...

    def leave(self, port: int) -> None: ...


def sender_host() -> str:
    """Where a sender in this process opens its groups: its node's Ray address when this process runs Ray (a
    cluster: the node's network address; the local instance: 127.0.0.1), else loopback."""
    ray = sys.modules.get("ray")
    if ray is not None and ray.is_initialized():
        return ray.util.get_node_ip_address()
    return "127.0.0.1"


class ModelSender:
    """A `WeightSender` for a model in this process (one learner rank). NCCL when the model and the engines
    are on GPUs, else gloo. Under FSDP every rank has one and all call `send` together (each tensor is gathered
    from the shards as it is sent); only rank 0 opens and joins a group."""

    def __init__(self, model: Any, *, device: torch.device, rank: int = 0) -> None:
        self.model, self.device, self.rank = model, torch.device(device), rank
        self._groups: dict[int, SyncGroup] = {}  # the groups this sender sends to, by port
        self._stores: dict[int, Any] = {}  # the stores of groups opened here and not yet joined

    def open(self, world_size: int, *, engines_on_gpu: bool, timeout_s: float = 300.0) -> GroupAddress:
        backend = "nccl" if engines_on_gpu and self.device.type == "cuda" else "gloo"
        address, store = open_group(sender_host(), world_size, backend, timeout_s)
        self._stores[address.port] = store
        return address

    def join(self, address: GroupAddress) -> None:
        store = self._stores.pop(address.port, None)
        self._groups[address.port] = SyncGroup(address, 0, store=store)

    def plan(self, *, version: int, dtype: torch.dtype, bucket_mb: float = 256.0) -> WeightsPlan:
        shapes = ((name, tuple(t.shape)) for name, t in self._state().items())
        return WeightsPlan.of(shapes, dtype=dtype, version=version, bucket_mb=bucket_mb)

    def send(self, plan: WeightsPlan, port: int) -> None:
        tensors = self._tensors(plan)
        group = self._groups.get(port)
        if group is None:
            if self.rank == 0:
                raise RuntimeError(f"no sync group on port {port}: join it first")
            for _ in tensors:  # another rank's group: take part in the gathers
                pass
            return
        send_weights(group, plan, tensors)

    def leave(self, port: int) -> None:
        self._stores.pop(port, None)  # a group opened and never joined
        group = self._groups.pop(port, None)
        if group is not None:
            group.close()

    def close(self) -> None:
        """Leave every group this sender opened or joined."""
        for port in list(self._groups) + list(self._stores):
            self.leave(port)

    def _tensors(self, plan: WeightsPlan) -> Iterator[torch.Tensor]:
        """The full tensors of the plan, in its order (under FSDP gathered one by one, a collective)."""
        state = self._state()
        for name in plan.names:
            tensor = state[name]
            yield tensor.full_tensor() if hasattr(tensor, "full_tensor") else tensor

    def _state(self) -> dict[str, torch.Tensor]:
        state = self.model.state_dict()
        if getattr(self.model.config, "tie_word_embeddings", False):
            state.pop("lm_head.weight", None)  # the engine ties it to the embedding itself
        return state


class SyncReceiver:
    """The engine side, for engines that load weights in this process (the HF engine, a vLLM engine whose
    worker runs here); vLLM's worker extension (`VLLMSyncExtension`) holds one per worker process."""

    def __init__(self) -> None:
        self.group: SyncGroup | None = None

    def join(self, address: dict[str, Any] | GroupAddress, rank: int) -> None:
        address = address if isinstance(address, GroupAddress) else GroupAddress(**address)
        self.close()
        self.group = SyncGroup(address, rank)

    def weights(self, plan: dict[str, Any] | WeightsPlan) -> Iterator[tuple[str, torch.Tensor]]:
        if self.group is None:
            raise RuntimeError("this engine has not joined a sync group")
        plan = plan if isinstance(plan, WeightsPlan) else WeightsPlan.from_dict(plan)
        return receive_weights(self.group, plan)

    def close(self) -> None:
        if self.group is not None:
            self.group.close()
            self.group = None


def weights_digest(named_tensors: Iterable[tuple[str, torch.Tensor]]) -> str:
    """A digest of a model's weights: SHA-256 over every tensor's name, dtype, shape and bytes, in name order
    (16 hex digits). Equal digests: the same weights, bit for bit, in the same layout; an engine's layout
    (vLLM fuses some projections) gives its own digest, equal between two engines of one kind."""
    digest = hashlib.sha256()
    for name, tensor in sorted(named_tensors, key=lambda item: item[0]):
        flat = tensor.detach().reshape(-1).contiguous().cpu()
        digest.update(f"{name}|{flat.dtype}|{tuple(tensor.shape)}|".encode())
        digest.update(flat.view(torch.uint8).numpy().tobytes())
    return digest.hexdigest()[:16]


class VLLMSyncExtension:
    """Mixed into vLLM's worker class (`worker_extension_cls`): the engine process's end of a sync group.
    Called with `llm.collective_rpc("stare_sync_join" | "stare_sync_receive" | "stare_sync_leave", ...)` on every
    worker of the engine (one per tensor/pipeline-parallel rank)."""

    def stare_sync_join(self, address: dict[str, Any], first_rank: int) -> None:
        """Join as rank `first_rank` + this worker's rank in the engine (`sync_ranks`): each tensor-parallel
        worker receives the whole model on a GPU of its own, so each is a rank of the group."""
        if getattr(self, "_stare_receiver", None) is None:
            self._stare_receiver = SyncReceiver()
        self._stare_receiver.join(address, first_rank + int(getattr(self, "rank", 0)))

    def stare_sync_receive(self, plan: dict[str, Any]) -> int:
        receiver = getattr(self, "_stare_receiver", None)
        if receiver is None:
            raise RuntimeError("this engine has not joined a sync group")
        received = 0

        def counted() -> Iterator[tuple[str, torch.Tensor]]:
            nonlocal received
            for name, tensor in receiver.weights(plan):
                received += 1
                yield name, tensor

        with self._stare_vllm_config():
            self.model_runner.reload_weights(weights_iterator=counted(), is_checkpoint_format=True)
            self.stare_refresh_tied_head()
        expected = len(plan["names"])
        if received != expected:  # the loader stopped early: the engine holds a mix of old and new weights
            raise RuntimeError(
                f"the engine loaded {received} of {expected} tensors of weight version {plan['version']}"
            )
        return received

    def stare_weights_digest(self) -> str:
        """`weights_digest` of this worker's model (its shard under tensor parallelism)."""
        return weights_digest(self.model_runner.get_model().named_parameters())

    def stare_refresh_tied_head(self) -> bool:
        """Rebuild the LM head's kernel state when it is tied to the input embedding. A reload loads the
        embedding (a tied model's checkpoint has no `lm_head.weight`), and the head shares its tensor, but
        on CPUs the head's matmul runs on a packed copy made when the model was loaded (oneDNN/SGL): without
        this the engine samples from the new body through the old head. Returns whether it did anything."""
        model = self.model_runner.get_model()
        head = getattr(model, "lm_head", None)
        embed = getattr(getattr(model, "model", None), "embed_tokens", None)
        if (
            head is None
            or embed is None
            or getattr(head, "weight", None) is not getattr(embed, "weight", None)
        ):
            return False
        method = getattr(head, "quant_method", None)
        if method is None or not hasattr(method, "process_weights_after_loading"):
            return False
        with self._stare_vllm_config():
            method.process_weights_after_loading(head)
        return True

    def _stare_vllm_config(self) -> contextlib.AbstractContextManager:
        """vLLM's config context, as vLLM's own `Worker.reload_weights` sets it: a layer that reads the config
        while loading (`get_current_vllm_config`, e.g. a custom op or a quantization method) raises outside."""
        from vllm.config import set_current_vllm_config

        config = getattr(self, "vllm_config", None)
        return set_current_vllm_config(config) if config is not None else contextlib.nullcontext()

    def stare_sync_member(self) -> dict[str, Any] | None:
        """This worker's place in its sync group (None outside one): its process, rank and the group's port."""
        receiver = getattr(self, "_stare_receiver", None)
        if receiver is None or receiver.group is None:
            return None
        return {"pid": os.getpid(), "rank": receiver.group.rank, "port": receiver.group.address.port}

    def stare_sync_leave(self) -> None:
        receiver = getattr(self, "_stare_receiver", None)
        if receiver is not None:
            receiver.close()
