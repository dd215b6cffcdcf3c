"""A single-node Ray that listens on loopback only.

On Linux `ray.init()` takes the machine's routable address as its node IP, and the GCS, the raylet, the
runtime-env agent and every worker's gRPC server listen on all interfaces; whoever reaches the machine
could then talk to the cluster (Ray 2.60 turns token authentication on for a local `ray.init`, but a
listener on loopback is not reachable at all). `ray.init(_node_ip_address="127.0.0.1")` does not help: Ray
2.60 maps a loopback node address back to the routable one (`services.resolve_ip_for_localhost`). What
does is Ray's own single-machine switch, `RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0` (the default on macOS and
Windows): the node IP becomes 127.0.0.1 and every server above binds to it. Ray reads it when `ray` is
imported, so it is set in the environment (for the processes Ray starts) and in Ray's constants (for this
process, which may have imported Ray already).

A multi-node run connects to a cluster started with `ray start` instead (`ray.init(address=...)`, see the
README's cluster section): this function is only for the local instance.
"""

from __future__ import annotations

import os
from typing import Any

SINGLE_MACHINE_ENV = "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"
LOOPBACK = "127.0.0.1"


def init_local_ray(**kwargs: Any) -> Any:
    """`ray.init(**kwargs)` for a new single-node instance whose servers listen on 127.0.0.1 only; the
    dashboard stays off unless asked for (it too binds to loopback by default)."""
    if "address" in kwargs:
        raise ValueError(
            "init_local_ray starts a new local instance; connect to a cluster with ray.init(address=...)"
        )
    os.environ[SINGLE_MACHINE_ENV] = "0"  # the GCS, raylet, agents and workers Ray starts read it
    import ray
    from ray._private import ray_constants

    ray_constants.ENABLE_RAY_CLUSTER = False  # read at import; this process may have imported ray already
    kwargs.setdefault("include_dashboard", False)
    return ray.init(**kwargs)


__all__ = ["LOOPBACK", "SINGLE_MACHINE_ENV", "init_local_ray"]
