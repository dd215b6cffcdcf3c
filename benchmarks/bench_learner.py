"""Learner throughput: `Learner.step` tokens/s, MFU, peak memory, padding share and the pre-update share, rows
packed (with each group's prompt once, and without) against rows padded, and the STARE / GRPO-ds step-time ratio.

A learner step is what `Learner.step` does: the pre-update pass (no grad) over the batch unless the step is one
micro-batch (then the update's forward is that pass), forward + backward with the chunked action-token head, the
loss, AdamW. Tokens/s counts the batch's real (non-padding) tokens per second of step. MFU: model FLOPs over the
device's dense bf16 peak, with 8 N FLOPs a real token (2 N for the pre-update pass, 6 N forward + backward; 6 N
when the pre-update pass is the update's forward), N the parameters, attention not counted. The padding share is
the share of the padded micro-batches' positions that are padding (what a padded forward computes for nothing).

STARE vs GRPO-ds: two learners from the same weights on the same batch, STARE with its gate forced on (target
entropy above the model's), their steps interleaved round by round (the order alternating); the ratio is of the
median step times.

    python benchmarks/bench_learner.py                                        # SmolLM2-135M, 8 x (64 + 192)
    python benchmarks/bench_learner.py --device cuda --shape qwen2.5-1.5b    # random weights from a config
    python benchmarks/bench_learner.py --device cpu --shape tiny --rows 8 --response 16:48 --rounds 1
    python benchmarks/bench_learner.py --rollouts benchmarks/logs/hold-s0 --steps 0:4 --pack both

`--shape` builds a Qwen2.5-shaped model with random weights on the device (no download); `--rollouts` takes the
trained rows of saved RL steps (a run folder: their real multi-turn lengths) for the model that produced them.
Before a model is built, the memory plan (train/memory_plan.py) says whether the step fits the device and turns
checkpointing on or lowers the budget when it does not ("fit"); a step that cannot fit is reported, not run.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import gc
import resource
import statistics
import sys
import threading
from pathlib import Path
from typing import Any

import torch

from stare_agents.algo import AlgorithmConfig
from stare_agents.jsonl import dumps
from stare_agents.train.learner import Learner, LearnerConfig
from stare_agents.train.memory_plan import MemoryPlanError, ModelShape, gib, parameters, plan_memory
from stare_agents.train.policy import OptimizerConfig, load_causal_lm, plan_micro_batches, row_lengths
from stare_agents.trajectory import Trajectory, collate

# Qwen2.5's shapes (their config.json), for random-weight models; "tiny" for a CPU test
SHAPES: dict[str, dict[str, Any]] = {
    "qwen2.5-0.5b": dict(
        hidden_size=896, intermediate_size=4864, num_hidden_layers=24, num_attention_heads=14
    ),
    "qwen2.5-1.5b": dict(
        hidden_size=1536, intermediate_size=8960, num_hidden_layers=28, num_attention_heads=12
    ),
    "qwen2.5-3b": dict(
        hidden_size=2048, intermediate_size=11008, num_hidden_layers=36, num_attention_heads=16
    ),
    "qwen2.5-7b": dict(
        hidden_size=3584,
        intermediate_size=18944,
        num_hidden_layers=28,
        num_attention_heads=28,
        num_key_value_heads=4,
        vocab_size=152064,
        tie_word_embeddings=False,
    ),
    "tiny": dict(
        hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4, vocab_size=512
    ),
}
QWEN25 = dict(num_key_value_heads=2, vocab_size=151936, tie_word_embeddings=True, rope_theta=1e6)
QWEN25.update(max_position_embeddings=32768, rms_norm_eps=1e-6)
# dense bf16 tensor-core peaks (TFLOP/s) by device name; the first name found in the device's name counts
DENSE_BF16_TFLOPS = {
    "H200": 989.4,
    "H100 PCIe": 756.5,
    "H100": 989.4,
    "A100": 312.0,
    "L40S": 362.1,
    "L4": 121.0,
}


def shape_config(name: str) -> Any:
    from transformers import Qwen2Config

    if name not in SHAPES:
        raise SystemExit(f"--shape {name!r}: allowed: {', '.join(SHAPES)}")
    return Qwen2Config(**{**QWEN25, **SHAPES[name]})


def model_source(args: argparse.Namespace) -> tuple[Any, str]:
    """(the model's config, a description); `build()` makes fresh fp32 weights from it on the device."""
    if args.shape:
        return shape_config(args.shape), f"{args.shape} shape, random weights"
    from transformers import AutoConfig

    from stare_agents.models import prepare_model

    args.model_dir = prepare_model(args.model)
    return AutoConfig.from_pretrained(args.model_dir), str(args.model_dir)


def build(args: argparse.Namespace, config: Any) -> torch.nn.Module:
    if not args.shape:
        return load_causal_lm(args.model_dir, args.device)
    from transformers import AutoModelForCausalLM

    torch.manual_seed(args.seed)
    with torch.device(args.device):  # initialised where it trains: no copy of a 7B from the host
        return AutoModelForCausalLM.from_config(config, dtype=torch.float32)


def synthetic_rows(
    vocab: int, rows: int, prompt: int, response: tuple[int, int], seed: int, *, group_prompts: bool = False
) -> list[Trajectory]:
    """`rows` rollouts of `prompt` tokens and a response of a length drawn from [lo, hi], each with a 30%
    observation span (action_mask 0) in its middle; groups of 4, rewards alternating. `group_prompts`: a
    group's rows share one prompt (as GRPO's samples do), else every row has its own."""
    gen = torch.Generator().manual_seed(seed)
    out = []
    prompt_ids: list[int] = []
    for i in range(rows):
        if i % 4 == 0 or not group_prompts:
            prompt_ids = torch.randint(3, vocab, (prompt,), generator=gen).tolist()
        length = int(torch.randint(response[0], response[1] + 1, (1,), generator=gen))
        obs = int(0.3 * length)
        start = (length - obs) // 2
        mask = [0 if start <= j < start + obs else 1 for j in range(length)]
        out.append(
            Trajectory(
                prompt_ids=list(prompt_ids),
                response_ids=torch.randint(3, vocab, (length,), generator=gen).tolist(),
                action_mask=mask,
                rollout_logprobs=[-1.0 * bit for bit in mask],
                reward=float(i % 2),
                group_id=f"g{i // 4}",
            )
        )
    return out


def saved_steps(path: str, steps: str) -> list[list[Trajectory]]:
    """The trained rows of each saved RL step FIRST:LAST (inclusive) of a run folder: one step batch each."""
    from stare_agents.rollout_log import read_rollouts

    first, _, last = steps.partition(":")
    out = []
    for step in range(int(first), int(last or first) + 1):
        rows = [s.trajectory for s in read_rollouts(path, step) if s.status == "trained"]
        if rows:
            out.append(rows)
    if not out:
        raise SystemExit(f"--rollouts {path} --steps {steps}: no trained rows there")
    return out


def step_batch(trajectories: list[Trajectory]) -> tuple[Any, torch.Tensor]:
    """A step batch and advantages of alternating sign (what the learner is timed on; their values do not matter)."""
    advantages = torch.tensor([1.0 if i % 2 else -1.0 for i in range(len(trajectories))])
    return collate(trajectories, pad_token_id=0), advantages


def padding_share(batches, budget: int, packing: str) -> tuple[float, int, int]:
    """(padding share of the padded micro-batches, their count, tokens of the largest) over the step batches, as
    the learner plans them."""
    padded = real = largest = count = 0
    for batch, _ in batches:
        prompt_lens, response_lens = row_lengths(batch)
        groups = plan_micro_batches(batch, budget, packing=packing)
        count += len(groups)
        for rows in groups:
            width = max(prompt_lens[i] for i in rows) + max(max(response_lens[i] for i in rows), 1)
            padded += len(rows) * width
            real += sum(prompt_lens[i] + response_lens[i] for i in rows)
            largest = max(largest, len(rows) * width)
    return 1 - real / padded, count, largest


class PeakMemory:
    """The device's peak memory while a block runs, and what it held when the block began (`baseline`): CUDA's
    allocator statistics, or on the CPU the process's resident set sampled every 5 ms (ru_maxrss cannot be reset
    between rows, and it counts the interpreter, the libraries and the loaded batches, which the memory plan does
    not). `learner` = peak - baseline: what building and stepping the learner added."""

    def __init__(self, device: str) -> None:
        self.cuda = device.startswith("cuda")
        self.baseline = self.peak = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    @staticmethod
    def rss() -> int:
        with open("/proc/self/statm") as handle:
            return int(handle.read().split()[1]) * resource.getpagesize()

    def __enter__(self) -> PeakMemory:
        # on the CPU the freed heap is handed back, so the rows before do not lend this block their memory
        reset_peak("cuda" if self.cuda else "cpu")
        if self.cuda:
            self.baseline = int(torch.cuda.memory_allocated())
        else:
            self.baseline = self.peak = self.rss()
            self._thread = threading.Thread(target=self._sample, daemon=True)
            self._thread.start()
        return self

    def _sample(self) -> None:
        while not self._stop.wait(0.005):
            self.peak = max(self.peak, self.rss())

    def __exit__(self, *exc: object) -> None:
        if self.cuda:
            torch.cuda.synchronize()
            self.peak = int(torch.cuda.max_memory_allocated())
        else:
            self._stop.set()
            assert self._thread is not None
            self._thread.join()
            self.peak = max(self.peak, self.rss())

    @property
    def learner(self) -> int:
        return max(0, self.peak - self.baseline)


def _trim_heap() -> None:
    with contextlib.suppress(OSError, AttributeError):  # not glibc: nothing to trim
        ctypes.CDLL("libc.so.6").malloc_trim(0)


def reset_peak(device: str) -> None:
    gc.collect()
    if device.startswith("cuda"):
        torch.cuda.synchronize()
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
    else:
        _trim_heap()


def device_peak_tflops(args: argparse.Namespace) -> tuple[float | None, str]:
    if args.peak_tflops:
        return args.peak_tflops, f"--peak-tflops {args.peak_tflops:g}"
    if not args.device.startswith("cuda"):
        return None, "no MFU on the CPU (no dense bf16 peak to hold it against)"
    name = torch.cuda.get_device_name()
    for key, tflops in DENSE_BF16_TFLOPS.items():
        if key in name:
            return tflops, f"{name}: {tflops:g} TFLOP/s dense bf16"
    return None, f"{name}: its dense bf16 peak is unknown here (give --peak-tflops)"


def learner_for(model, algorithm: AlgorithmConfig, args, precision: str, pack: str, checkpointing: bool):
    """`pack`: "shared" (rows packed, a group's prompt run once), "on" (packed, every row's prompt), "off"
    (padded) or "auto" (the learner's default)."""
    config = LearnerConfig(
        optimizer=OptimizerConfig(lr=1e-6),
        precision=precision,
        micro_batch_tokens=args.micro_batch_tokens,
        gradient_checkpointing=checkpointing,
        pack_rows="on" if pack == "shared" else pack,
        share_prompts=pack in ("shared", "auto"),
        device=args.device,
    )
    return Learner(model, algorithm, config)


def measure(learners: dict[str, Learner], batches, rounds: int, device: str) -> dict[str, list[list[dict]]]:
    """Each learner's step metrics, round by round ([round][batch]): a warm-up step on the first batch, then
    `rounds` rounds over every batch, the learners interleaved within each (their order alternating from round
    to round) so that machine noise hits them alike."""
    names = list(learners)
    for name in names:
        learners[name].step(*batches[0])
    out: dict[str, list[list[dict]]] = {name: [] for name in names}
    for round_ in range(rounds):
        for name in names if round_ % 2 == 0 else names[::-1]:
            steps = []
            for batch, advantages in batches:
                if device.startswith("cuda"):
                    torch.cuda.synchronize()
                steps.append(dict(learners[name].step(batch, advantages)))
            out[name].append(steps)
    return out


def summary_row(
    rounds: list[list[dict]], learner: Learner, precision: str, plan, params: int, peak_tflops
) -> dict:
    """A throughput row from one learner's rounds: medians over rounds of (all batches' tokens / their time)."""
    tokens = sum(m["learner/tokens"] for m in rounds[0])
    round_s = [sum(m["learner/step_s"] for m in steps) for steps in rounds]
    pre_share = [
        sum(m["learner/pre_update_s"] for m in steps) / sum(m["learner/step_s"] for m in steps)
        for steps in rounds
    ]
    row = {
        "precision": precision,
        "rows": "shared" if learner.policy.share_prompts else "packed" if learner.policy.packed else "padded",
        "gradient_checkpointing": plan.gradient_checkpointing,
        "steps_per_round": len(rounds[0]),
        "median_round_s": statistics.median(round_s),
        "tokens_per_s": tokens / statistics.median(round_s),
        "pre_update_share": statistics.median(pre_share),
        "micro_batches": sum(m["learner/micro_batches"] for m in rounds[0]),
        "plan_estimate_bytes": plan.estimate.peak,
        "round_s": round_s,
    }
    if peak_tflops:
        flops = sum(
            (8 if m["learner/micro_batches"] > 1 else 6) * params * m["learner/tokens"] for m in rounds[0]
        )
        row["mfu"] = flops / statistics.median(round_s) / (peak_tflops * 1e12)
    return row


def throughput_rows(args, config, batches, precision: str, packs: list[str], plan, peak_tflops) -> list[dict]:
    """GRPO-ds learner steps with rows packed and/or padded: interleaved in one process (`--interleave`), or one
    after the other, each with the device's peak memory to itself."""
    algorithm = AlgorithmConfig.preset("grpo-ds")
    checkpointing = plan.gradient_checkpointing
    groups = [packs] if args.interleave else [[pack] for pack in packs]
    rows = []
    for group in groups:
        with PeakMemory(args.device) as memory:
            learners = {
                pack: learner_for(build(args, config), algorithm, args, precision, pack, checkpointing)
                for pack in group
            }
            params = sum(p.numel() for p in next(iter(learners.values())).model.parameters())
            measured = measure(learners, batches, args.rounds, args.device)
        for pack in group:  # interleaved: the memory is of both learners together
            row = summary_row(measured[pack], learners[pack], precision, plan, params, peak_tflops)
            row["peak_memory_bytes"] = memory.peak
            row["memory_before_bytes"] = memory.baseline
            row["learner_memory_bytes"] = memory.learner
            rows.append(row)
        del learners
        reset_peak(args.device)
    return rows


def stare_ratio(args, config, batches, precision: str, checkpointing: bool) -> dict:
    stare = AlgorithmConfig.preset("stare")
    stare.stare.target_entropy = 1e9  # the gate always on: the weights are computed and applied
    learners = {
        "grpo-ds": learner_for(
            build(args, config), AlgorithmConfig.preset("grpo-ds"), args, precision, "auto", checkpointing
        ),
        "stare": learner_for(build(args, config), stare, args, precision, "auto", checkpointing),
    }
    measured = measure(learners, batches, args.ratio_rounds, args.device)
    del learners
    reset_peak(args.device)
    if any(m["stare/gate_on"] != 1.0 for steps in measured["stare"] for m in steps):
        raise AssertionError("the STARE gate was off: the ratio would not time the reweighting")
    times = {
        name: [sum(m["learner/step_s"] for m in steps) for steps in rounds]
        for name, rounds in measured.items()
    }
    grpo, stare_s = statistics.median(times["grpo-ds"]), statistics.median(times["stare"])
    return {
        "precision": precision,
        "rounds": args.ratio_rounds,
        "grpo_ds_median_s": grpo,
        "stare_median_s": stare_s,
        "stare_over_grpo_ds": stare_s / grpo,
        "grpo_ds_s": times["grpo-ds"],
        "stare_s": times["stare"],
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--model", default="smollm2-135m", help="a prepare_model name or a local HF dir")
    parser.add_argument("--shape", default=None, help=f"random weights of a shape: {', '.join(SHAPES)}")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--rows", "--batch", type=int, default=8, help="synthetic rows")
    parser.add_argument("--prompt", type=int, default=64, help="prompt tokens of a synthetic row")
    parser.add_argument("--response", default="192", help="response tokens of a synthetic row: N or LO:HI")
    parser.add_argument(
        "--group-prompts", action="store_true", help="synthetic rows: each group of 4 shares its prompt"
    )
    parser.add_argument(
        "--rollouts", default=None, help="a run folder: its saved steps' trained rows instead"
    )
    parser.add_argument("--steps", default="0", help="with --rollouts: the saved steps FIRST:LAST")
    parser.add_argument("--micro-batch-tokens", type=int, default=None, help="default: one micro-batch")
    parser.add_argument(
        "--precisions", default=None, help="comma-separated (default: bf16 on CUDA, fp32,bf16 on CPU)"
    )
    parser.add_argument(
        "--pack",
        default="all",
        help="comma-separated: shared (rows packed, each group's prompt once), on (packed), off (padded); "
        "both = on,off; all = shared,on,off",
    )
    parser.add_argument("--gradient-checkpointing", action="store_true")
    parser.add_argument("--memory-plan", choices=("fit", "check", "off"), default="fit")
    parser.add_argument(
        "--device-memory-gib", type=float, default=None, help="plan for this much device memory"
    )
    parser.add_argument(
        "--interleave",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="packed and padded learners stepped in turn in one process (default: on the CPU)",
    )
    parser.add_argument("--rounds", type=int, default=3, help="timed steps per throughput row")
    parser.add_argument(
        "--ratio-rounds", type=int, default=5, help="interleaved STARE/GRPO-ds rounds (0: none)"
    )
    parser.add_argument("--ratio-precision", default=None, help="default: the first precision")
    parser.add_argument(
        "--peak-tflops", type=float, default=None, help="the device's dense bf16 peak for MFU"
    )
    parser.add_argument(
        "--padding-only", action="store_true", help="only the padding share of the step batches"
    )
    parser.add_argument("--threads", type=int, default=torch.get_num_threads())
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", default=None, help="also write the results here (strict JSON)")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    cuda = args.device.startswith("cuda")
    if cuda:
        torch.backends.cuda.matmul.allow_tf32 = True  # fp32 rows as a GPU user runs them
    precisions = (args.precisions or ("bf16" if cuda else "fp32,bf16")).split(",")

    config, described = model_source(args)
    if args.rollouts:
        row_sets = saved_steps(args.rollouts, args.steps)
    else:
        lo, _, hi = args.response.partition(":")
        row_sets = [
            synthetic_rows(
                config.vocab_size,
                args.rows,
                args.prompt,
                (int(lo), int(hi or lo)),
                args.seed,
                group_prompts=args.group_prompts,
            )
        ]
    batches = [step_batch(rows) for rows in row_sets]
    real = sum(int(batch.attention_mask.sum()) for batch, _ in batches)
    args.micro_batch_tokens = args.micro_batch_tokens or max(
        batch.attention_mask.numel() for batch, _ in batches
    )
    share, micro_batches, largest = padding_share(batches, args.micro_batch_tokens, "longest-first")
    if args.padding_only:  # the micro-batch plan's padding, step batch by step batch; no model is built
        shares = [padding_share([b], args.micro_batch_tokens, "longest-first")[0] for b in batches]
        report = {
            "step_batches": len(batches),
            "real_tokens": real,
            "micro_batch_tokens": args.micro_batch_tokens,
        }
        report.update(padding_share=share, step_padding_shares=shares, micro_batches=micro_batches)
        print(
            f"{len(batches)} step batches, {real} real tokens, micro_batch_tokens {args.micro_batch_tokens}: padding "
            f"{100 * share:.1f}% of the padded positions (by step: median {100 * statistics.median(shares):.1f}%, "
            f"{100 * min(shares):.1f}-{100 * max(shares):.1f}%)"
        )
        if args.json:
            Path(args.json).write_text(dumps(report, indent=2) + "\n")
        return 0
    shape = ModelShape.of_config(config)
    peak_tflops, peak_note = device_peak_tflops(args)
    device_name = torch.cuda.get_device_name() if cuda else "CPU"
    if args.interleave is None:
        args.interleave = not cuda  # a shared CPU: interleave; a GPU: each row its own peak memory
    results: dict[str, Any] = {
        "model": described,
        "params": shape.params,
        "device": device_name,
        "torch": torch.__version__,
        "threads": args.threads,
        "step_batches": len(batches),
        "rows": sum(len(rows) for rows in row_sets),
        "real_tokens": real,
        "micro_batch_tokens": args.micro_batch_tokens,
        "micro_batches": micro_batches,
        "padding_share": share,
        "interleaved": args.interleave,
        "throughput": [],
    }
    if peak_tflops:
        results["peak_tflops"] = peak_tflops
    print(
        f"{described} ({parameters(shape.params)} parameters) on {device_name}, torch {torch.__version__}; "
        f"{len(batches)} step batch(es), {results['rows']} rows, {real} real tokens, micro_batch_tokens "
        f"{args.micro_batch_tokens} -> {micro_batches} micro-batches, padding {100 * share:.1f}% of the padded "
        f"positions; {peak_note}",
        flush=True,
    )
    if args.device_memory_gib:
        device_bytes = int(args.device_memory_gib * 2**30)
    elif cuda:
        device_bytes = torch.cuda.mem_get_info()[0] + torch.cuda.memory_reserved()
    else:
        import psutil

        device_bytes = psutil.virtual_memory().total
    packs = {"all": ["shared", "on", "off"], "both": ["on", "off"]}.get(args.pack) or args.pack.split(",")
    if not packs or set(packs) - {"shared", "on", "off"} or len(set(packs)) < len(packs):
        parser.error(f"--pack: shared, on and off, each at most once (or both, all), got {args.pack!r}")
    for precision in precisions:
        try:
            plan = plan_memory(
                shape,
                device_bytes,
                precision=precision,
                micro_batch_tokens=args.micro_batch_tokens,
                gradient_checkpointing=args.gradient_checkpointing,
                longest_row=largest,
                mode=args.memory_plan,
                where="bench",
                device="cuda" if cuda else "cpu",
            )
        except MemoryPlanError as refused:
            print(f"{precision}: refused by the memory plan: {refused}", flush=True)
            results["throughput"].append({"precision": precision, "refused": str(refused)})
            continue
        print(f"{precision}: {plan.summary()}", flush=True)
        budget, args.micro_batch_tokens = args.micro_batch_tokens, plan.micro_batch_tokens
        for row in throughput_rows(args, config, batches, precision, packs, plan, peak_tflops):
            results["throughput"].append(row)
            mfu = f", MFU {100 * row['mfu']:.1f}%" if "mfu" in row else ""
            print(
                f"{precision} {row['rows']:>6}: {row['median_round_s']:.3f} s for {row['steps_per_round']} step(s), "
                f"{row['tokens_per_s']:,.0f} tok/s{mfu}, peak {gib(row['peak_memory_bytes'])}: the learner "
                f"{gib(row['learner_memory_bytes'])} over {gib(row['memory_before_bytes'])} before it (plan "
                f"{gib(row['plan_estimate_bytes'])}), pre-update pass {100 * row['pre_update_share']:.0f}% of the "
                f"step, {row['micro_batches']:g} micro-batches",
                flush=True,
            )
        if args.ratio_rounds and precision == (args.ratio_precision or precisions[0]):
            ratio = stare_ratio(args, config, batches, precision, plan.gradient_checkpointing)
            results["ratio"] = ratio
            print(
                f"STARE (gate on) / GRPO-ds step, {precision}, {args.ratio_rounds} interleaved rounds: "
                f"{ratio['stare_median_s']:.3f} s / {ratio['grpo_ds_median_s']:.3f} s = "
                f"{ratio['stare_over_grpo_ds']:.3f}",
                flush=True,
            )
        args.micro_batch_tokens = budget
    shared = [r for r in results["throughput"] if r.get("rows") == "shared"]
    packed = [r for r in results["throughput"] if r.get("rows") == "packed"]
    by_precision = {r["precision"]: r for r in packed}
    for row in shared:
        if row["precision"] in by_precision:
            speedup = row["tokens_per_s"] / by_precision[row["precision"]]["tokens_per_s"]
            results.setdefault("shared_over_packed", {})[row["precision"]] = speedup
            print(f"{row['precision']}: shared / packed tokens/s = {speedup:.2f}", flush=True)
    padded = {r["precision"]: r for r in results["throughput"] if r.get("rows") == "padded"}
    for row in packed:
        if row["precision"] in padded:
            speedup = row["tokens_per_s"] / padded[row["precision"]]["tokens_per_s"]
            results.setdefault("packed_over_padded", {})[row["precision"]] = speedup
            print(f"{row['precision']}: packed / padded tokens/s = {speedup:.2f}", flush=True)
    if args.json:
        Path(args.json).write_text(dumps(results, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
