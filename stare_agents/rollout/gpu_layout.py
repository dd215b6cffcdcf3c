"""The GPUs a Ray started on this machine may hand to rollout workers.

A learner in the trainer's own process computes on this machine's first visible GPU (`cuda:0`), which Ray does
not know about: a local Ray counts every GPU and gives GPU 0 to the first rollout worker, whose engine takes its
share of it before the learner loads. Ray reads CUDA_VISIBLE_DEVICES when it starts its node, counts only the
devices listed and gives each worker ids from that list (an actor asking for one GPU gets CUDA_VISIBLE_DEVICES=2
when the list is "1,2,3"), so the trainer starts its local Ray inside `gpus_hidden(1)`: the list without the
learner's device, restored for this process afterwards.

    with gpus_hidden(1):              # CUDA_VISIBLE_DEVICES=1,2,3 here on a 4-GPU machine
        init_ray(None)                # the local Ray counts 3 GPUs and hands out 1, 2 and 3
    # CUDA_VISIBLE_DEVICES as it was: the learner computes on device 0
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator

VISIBLE = "CUDA_VISIBLE_DEVICES"


def visible_gpus() -> list[str]:
    """This process's CUDA devices as CUDA_VISIBLE_DEVICES names them (ids or UUIDs), else 0 .. n-1 as torch
    counts them."""
    listed = os.environ.get(VISIBLE)
    if listed is not None:
        return [device.strip() for device in listed.split(",") if device.strip()]
    import torch

    return [str(i) for i in range(torch.cuda.device_count())] if torch.cuda.is_available() else []


@contextlib.contextmanager
def gpus_hidden(count: int) -> Iterator[list[str]]:
    """Within: CUDA_VISIBLE_DEVICES without this process's first `count` devices (what a Ray node started here
    counts and hands out; yielded); afterwards it is as it was. `count` 0 changes nothing."""
    if count < 1:
        yield visible_gpus()
        return
    before = os.environ.get(VISIBLE)
    left = visible_gpus()[count:]
    os.environ[VISIBLE] = ",".join(left)
    try:
        yield left
    finally:
        if before is None:
            os.environ.pop(VISIBLE, None)
        else:
            os.environ[VISIBLE] = before
