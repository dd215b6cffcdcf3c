"""Evaluation: benchmarks, protocols, avg@k / pass@k with bootstrap intervals, behaviour analysis, reports.

    from stare_agents.eval import EvalConfig, evaluate, compare_runs
    evaluate("runs/ckpt", ["aime24", "math500"], EvalConfig(protocol="tir", samples=4), out="evals/ckpt")
    table, _ = compare_runs(["evals/base", "evals/ckpt"])

Training reaches evaluation through this package only (tests/test_layers.py): `evaluate_on_workers` runs a
benchmark on a training run's running workers; `get_protocol`, `load_benchmark` and `benchmark_source` check a
config's benchmarks where it loads.

The command line: `stare-agents eval ...` and `stare-agents compare DIR ...` (see `stare_agents.eval.cli`).
"""

from stare_agents.eval.behavior import (
    REFLECTION_CATEGORIES,
    REFLECTION_WORDS,
    SUMMARY_KEYS,
    ResponseStats,
    behavior_summary,
    reflection_counts,
    response_stats,
)
from stare_agents.eval.benchmarks import (
    BENCHMARK_FILES,
    DATA_DIR_ENV,
    PRESETS,
    PROTOCOLS,
    Benchmark,
    Preset,
    Protocol,
    benchmark_source,
    data_dir_found,
    get_protocol,
    load_benchmark,
    resolve_data_dir,
)
from stare_agents.eval.harness import EvalConfig, RolloutRunner, SampleSpec, evaluate, evaluate_on_workers
from stare_agents.eval.metrics import (
    BenchmarkMetrics,
    ProblemOutcome,
    benchmark_metrics,
    k_values,
    pass_at_k,
)
from stare_agents.eval.report import compare_runs, load_results, model_identity
from stare_agents.stats import Estimate

__all__ = [
    "BENCHMARK_FILES",
    "DATA_DIR_ENV",
    "PRESETS",
    "PROTOCOLS",
    "REFLECTION_CATEGORIES",
    "REFLECTION_WORDS",
    "SUMMARY_KEYS",
    "Benchmark",
    "BenchmarkMetrics",
    "Estimate",
    "EvalConfig",
    "Preset",
    "ProblemOutcome",
    "Protocol",
    "ResponseStats",
    "RolloutRunner",
    "SampleSpec",
    "behavior_summary",
    "benchmark_metrics",
    "benchmark_source",
    "compare_runs",
    "data_dir_found",
    "evaluate",
    "evaluate_on_workers",
    "get_protocol",
    "k_values",
    "load_benchmark",
    "load_results",
    "model_identity",
    "pass_at_k",
    "reflection_counts",
    "resolve_data_dir",
    "response_stats",
]
