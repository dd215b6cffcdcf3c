"""The environment of the Ray workers the trainer starts: the driver's NCCL and gloo settings as defaults.

A worker on another node gets its raylet's environment (what `ray start` had there), not the driver's: the
driver's NCCL_*, TORCH_NCCL_* and GLOO_SOCKET_IFNAME (`local_ray.forwarded_env`) would never reach the learner
ranks and engines that open the sockets. They travel with each worker (`worker_runtime_env`) and fill in what the
worker's node does not set itself (`apply_driver_env`, the first thing each worker does): a head node
whose interface is eth0 and GPU nodes whose NCCL_SOCKET_IFNAME=ib0 was set when `ray start` ran keep ib0. To set
a value for every node, set it in each node's `ray start` environment (or use a form that fits all of them:
NCCL_SOCKET_IFNAME=^lo,docker excludes interfaces by prefix, docs/cluster.md).

    actor.options(runtime_env=worker_runtime_env({"TOKENIZERS_PARALLELISM": "false"})).remote(...)
    apply_driver_env()   # in the worker's __init__, before any process group or engine starts

(Ray's runtime_env sets variables over the node's, and its worker_process_setup_hook is the job's, not an
actor's: hence the variable of our own and the call.)
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from typing import Any

from stare_agents.rollout.local_ray import forwarded_env

DRIVER_ENV = "STARE_DRIVER_ENV"  # the driver's forwarded settings, JSON, read by `apply_driver_env`


def worker_runtime_env(env_vars: Mapping[str, str] | None = None) -> dict[str, Any]:
    """A Ray `runtime_env`: `env_vars` set as they are, and the driver's forwarded settings for the worker to take
    where its node has none (`apply_driver_env`). {} when there is nothing to set."""
    env = dict(env_vars or {})
    defaults = forwarded_env()
    if defaults:
        env[DRIVER_ENV] = json.dumps(defaults, sort_keys=True)
    return {"env_vars": env} if env else {}


def driver_defaults(own: Mapping[str, str], driver: Mapping[str, str]) -> dict[str, str]:
    """The driver's values a worker takes: those its own environment leaves unset or empty."""
    return {name: value for name, value in driver.items() if not own.get(name)}


def apply_driver_env() -> None:
    """The driver's forwarded settings, where this process has none of its own (a Ray worker calls it first)."""
    raw = os.environ.get(DRIVER_ENV)
    if raw:
        os.environ.update(driver_defaults(os.environ, json.loads(raw)))
