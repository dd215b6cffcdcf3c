"""vLLM on CPU: generation speed with 1 or 2 OpenMP threads, and what an idle engine costs.

    .venv/bin/python benchmarks/bench_engine_threads.py                      # 1 and 2 threads, both wait policies
    .venv/bin/python benchmarks/bench_engine_threads.py --model DIR --dtype float32

Each configuration runs in a child process (OpenMP reads OMP_NUM_THREADS / OMP_WAIT_POLICY once, at start):
SmolLM2-135M-Instruct (the prepared model) generates 128 tokens for each of 32 prompts at temperature 1
(EOS ignored), after a warm-up; then the engine sits idle for 5 s and the CPU time it burns meanwhile is
measured. Rollout workers run with OMP_WAIT_POLICY=PASSIVE because an idle engine with spinning threads
takes a core from the learner beside it.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time


def child(model: str, dtype: str) -> None:
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "2")
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    llm = LLM(model=model, dtype=dtype, enforce_eager=True, distributed_executor_backend="uni",
              max_model_len=1024, seed=0)  # fmt: skip
    tokenizer = llm.get_tokenizer()
    prompts = [TokensPrompt(prompt_token_ids=tokenizer.encode(f"Write a long story number {i} about the sea."))
               for i in range(32)]  # fmt: skip
    params = SamplingParams(temperature=1.0, max_tokens=128, ignore_eos=True)
    llm.generate(prompts[:2], params, use_tqdm=False)
    started = time.perf_counter()
    outputs = llm.generate(prompts, params, use_tqdm=False)
    seconds = time.perf_counter() - started
    tokens = sum(len(o.outputs[0].token_ids) for o in outputs)
    before = resource.getrusage(resource.RUSAGE_SELF)
    time.sleep(5)
    after = resource.getrusage(resource.RUSAGE_SELF)
    idle = (after.ru_utime + after.ru_stime) - (before.ru_utime + before.ru_stime)
    print(json.dumps({"tokens": tokens, "seconds": round(seconds, 1), "tokens_per_s": round(tokens / seconds, 1),
                      "idle_cpu_s_per_5_s": round(idle, 2)}), flush=True)  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--model", default=None, help="a local HF folder (default: the prepared smollm2-135m)"
    )
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.model is None:
        from stare_agents.models import prepare_model

        args.model = str(prepare_model("smollm2-135m"))
    if args.child:
        child(args.model, args.dtype)
        return
    for threads, wait in (("1", None), ("2", "ACTIVE"), ("2", "PASSIVE")):
        env = {**os.environ, "OMP_NUM_THREADS": threads}
        env.pop("OMP_WAIT_POLICY", None)
        if wait:
            env["OMP_WAIT_POLICY"] = wait
        command = [sys.executable, __file__, "--child", "--model", args.model, "--dtype", args.dtype]
        done = subprocess.run(command, env=env, capture_output=True, text=True, check=True)
        result = json.loads(done.stdout.strip().splitlines()[-1])
        print(json.dumps({"omp_threads": threads, "omp_wait_policy": wait or "default", **result}))


if __name__ == "__main__":
    main()
