"""Weight sync, the two paths side by side in one run: through the driver (the learner's state dict packed
into one array, `ray.put`, unpacked and loaded by every rollout worker) and over the sync group (the learner
broadcasts buckets straight to the engines, which load them as they arrive; stare_agents.rollout.weight_sync).

    .venv/bin/python benchmarks/bench_weight_sync.py --model smollm2-135m --workers 1 --syncs 5

Ray rollout workers with vLLM engines, the learner in this process (as in the default job). After each path's
last sync, one engine's log-probs of a sampled continuation are compared with the learner's (float32 engines:
they must agree to ~1e-3; a stale engine would differ by far more). Prints one JSON object.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import time


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    parser.add_argument("--workers", type=int, default=1)
    parser.add_argument("--syncs", type=int, default=5)
    parser.add_argument("--bucket-mb", type=float, default=256.0)
    args = parser.parse_args()

    import ray
    import torch

    from stare_agents.algo import AlgorithmConfig
    from stare_agents.models import prepare_model
    from stare_agents.rollout import RolloutWorkerGroup, WorkerSpec
    from stare_agents.rollout.engine import SamplingParams
    from stare_agents.train.learner import Learner, LearnerConfig

    model_dir = prepare_model(args.model)
    ray.init(num_cpus=max(2, args.workers + 1), include_dashboard=False, log_to_driver=False)
    learner = Learner.from_pretrained(model_dir, AlgorithmConfig.preset("grpo"), LearnerConfig())
    spec = WorkerSpec(
        model=str(model_dir),
        engine="vllm",
        dtype=args.dtype,
        max_model_len=512,
        sandbox="none",
        kv_cache_gib=1.0,
    )
    workers = RolloutWorkerGroup(spec, num_workers=args.workers)
    prompt = list(range(100, 140))

    def perturb(seed: int) -> None:
        generator = torch.Generator().manual_seed(seed)
        with torch.no_grad():
            for p in learner.model.parameters():
                p.add_(torch.randn(p.shape, generator=generator) * 1e-3)

    def agreement() -> float:
        def sample(worker):
            g = asyncio.run(worker.engine.generate(prompt, SamplingParams(temperature=1.0, max_tokens=16)))
            return list(g.token_ids), list(g.logprobs)

        ids, rollout = ray.get(workers._actors[0].__ray_call__.remote(sample))
        with torch.no_grad():
            logits = learner.model(torch.tensor([prompt + ids])).logits[0].float()
        ref = torch.log_softmax(logits, -1)[len(prompt) - 1 : -1].gather(-1, torch.tensor(ids)[:, None])[:, 0]
        return float((ref - torch.tensor(rollout)).abs().max())

    figures: dict = {"model": args.model, "dtype": args.dtype, "workers": args.workers}
    try:
        for path in ("driver", "collective"):
            seconds = []
            for i in range(args.syncs):
                perturb(i)
                started = time.perf_counter()
                if path == "driver":
                    workers.update_weights(learner.model_state_dict())
                else:
                    workers.update_weights_from(learner.sender, bucket_mb=args.bucket_mb)
                seconds.append(time.perf_counter() - started)
            figures[path] = {
                "median_s": round(statistics.median(seconds), 3),
                "all_s": [round(s, 3) for s in seconds],
                "max_abs_logprob_diff_after": round(agreement(), 6),
            }
        figures["collective_over_driver"] = round(
            figures["collective"]["median_s"] / figures["driver"]["median_s"], 3
        )
    finally:
        workers.close()
        ray.shutdown()
    print(json.dumps(figures))


if __name__ == "__main__":
    main()
