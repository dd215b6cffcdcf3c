"""The `stare-agents` command line."""

from __future__ import annotations

from pathlib import Path

import typer

import stare_agents._quiet_progress  # noqa: F401 (first: sets TQDM_MININTERVAL before tqdm is imported)
from stare_agents import __version__
from stare_agents.envs.cli import app as envs_app
from stare_agents.eval.cli import compare_command, eval_command
from stare_agents.sandbox.cli import app as sandbox_app

app = typer.Typer(
    name="stare-agents",
    help="Train and evaluate tool-using LLM agents with STARE (surprisal-guided token-level advantage reweighting).",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_show_locals=False,
)
app.add_typer(sandbox_app, name="sandbox", help="Build, check and benchmark the Docker Python sandbox.")
app.add_typer(envs_app, name="envs", help="List and check the registered Gymnasium environments.")
app.command("eval")(eval_command)
app.command("compare")(compare_command)


@app.command()
def demo(
    steps: int = typer.Option(300, help="Training steps for each algorithm."),
    target_entropy: float = typer.Option(0.3, help="STARE's entropy target H_tgt."),
    w: float = typer.Option(
        1.1, help="STARE's amplification W of the top-surprisal positive-advantage tokens."
    ),
    top_ratio: float = typer.Option(0.1, help="STARE's top fraction P of tokens that are reweighted."),
    seed: int = typer.Option(0, help="Random seed."),
    output_dir: Path = typer.Option(Path("outputs/demo"), help="Where the plot and metrics are written."),
) -> None:
    """Entropy simulation: the same synthetic softmax policy trained with GRPO and with STARE.

    GRPO collapses the policy entropy; STARE's gated reweighting holds it near the target. Prints a
    summary table and writes entropy.png and metrics.json to OUTPUT_DIR.
    """
    from stare_agents.demo import run_demo

    run_demo(
        steps=steps, target_entropy=target_entropy, w=w, top_ratio=top_ratio, seed=seed, output_dir=output_dir
    )


@app.command(context_settings={"allow_extra_args": True, "ignore_unknown_options": False})
def train(
    ctx: typer.Context,
    recipe: str | None = typer.Option(None, help="A recipe in train/recipes (e.g. smollm2-arith, tiny)."),
    config: Path | None = typer.Option(None, help="A YAML config file (same schema as the recipes)."),
    out: Path | None = typer.Option(None, help="The run folder (default: the recipe's out_dir)."),
    max_steps: int | None = typer.Option(None, "--max-steps", help="RL steps (overrides rl.steps)."),
    resume: bool = typer.Option(False, help="Continue the run in --out from its last checkpoint."),
    compare: str | None = typer.Option(
        None, help="Also train this algorithm (e.g. grpo-ds) from the same SFT model and plot both."
    ),
    imports: list[str] = typer.Option(
        [],
        "--import",
        help="A module that registers your environments (repeatable; added to env.imports). The current folder "
        "is searched first, as uvicorn finds its app; so is env.imports's.",
    ),
    show_config: bool = typer.Option(
        False,
        "--show-config",
        help="Print the resolved config (what the run folder's config.yaml holds) and exit.",
    ),
) -> None:
    """Train: base accuracy -> SFT cold start -> accuracy -> RL (STARE by default) -> accuracy.

    Extra arguments are key=value overrides, e.g. `rl.steps=4 rl.stare.w=1.2 sft.enabled=false`. The config
    is checked before any work starts: types and word sets when it loads, then the environment (constructed
    once with its kwargs), sft.data and --compare.
    """
    import logging

    from rich.console import Console
    from rich.table import Table

    from stare_agents.provenance import mixed_tree
    from stare_agents.sandbox import SandboxError
    from stare_agents.train.config import load_config
    from stare_agents.train.trainer import preflight
    from stare_agents.train.trainer import train as run_training

    mixed = mixed_tree()  # a run must be one tree's code, or no commit says what ran
    if mixed is not None:
        typer.secho(mixed, fg="red", err=True)
        raise typer.Exit(2)
    if recipe is None and config is None:
        recipe = "smollm2-arith"
    overrides = list(ctx.args)
    if out is not None:
        overrides.append(f"out_dir={out}")
    if max_steps is not None:
        overrides.append(f"rl.steps={max_steps}")
    try:
        train_config = load_config(recipe=recipe, path=config, overrides=overrides)
        train_config.env.imports = list(dict.fromkeys([*train_config.env.imports, *imports]))
        if show_config:
            typer.echo(train_config.to_yaml(), nl=False)
            return
        # check_run, and no usable sandbox where this process runs code: said before the run folder is written
        preflight(train_config, compare=compare)
    except (ValueError, FileNotFoundError, SandboxError) as error:  # an unknown recipe names the recipes; others
        typer.secho(str(error), fg="red", err=True)  # their key
        raise typer.Exit(2) from error
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s", datefmt="%H:%M:%S")
    for noisy in ("vllm", "ray", "httpx", "filelock"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    from stare_agents.train.memory_plan import MemoryPlanError
    from stare_agents.train.preflight import PreflightError
    from stare_agents.train.rl_loop import NoLearningSignal

    try:
        summary = run_training(train_config, resume=resume, compare=compare, checked=True)  # checked above
    except (FileExistsError, NoLearningSignal, MemoryPlanError, PreflightError) as error:  # said plainly,
        # before a model loads; the run folder keeps what it had
        typer.secho(str(error), fg="red", err=True)
        raise typer.Exit(2) from error
    table = Table(
        title=f"{summary['name']}: {summary['model']} on {summary['environment']} ({summary['algorithm']})"
    )
    table.add_column("figure")
    table.add_column("value", justify="right")
    for point, value in summary["accuracy"].items():
        if value is None:  # not evaluated (eval.num_tasks=0 and no benchmarks)
            table.add_row(f"accuracy ({point})", "not evaluated")
            continue
        low, high = summary.get("accuracy_ci", {}).get(point, [None, None])
        interval = f" [{low:.3f}, {high:.3f}]" if low is not None and high is not None else ""
        tasks = summary.get("eval_tasks", {}).get(point, "?")
        table.add_row(f"accuracy ({point}, {tasks} held-out tasks, 95% CI)", f"{value:.3f}{interval}")
    compared = summary.get("compare") or {}
    gains = [summary.get("rl_gain"), compared.get("rl_gain"), compared.get("difference")]
    for gain in gains:
        if gain and gain.get("value") is not None:
            table.add_row(
                f"{gain['of']} (paired, {gain['tasks']} tasks, 95% CI)",
                f"{gain['value']:+.3f} [{gain['ci_low']:+.3f}, {gain['ci_high']:+.3f}]",
            )
    for key in (
        "entropy_first",
        "entropy_final",
        "entropy_target",
        "gate_on_fraction",
        "rl_steps",
        "wall_time_s",
    ):
        value = summary.get(key)
        table.add_row(
            key, "-" if value is None else f"{value:.3f}" if isinstance(value, float) else str(value)
        )
    for key, value in summary["tool_use"].items():
        table.add_row(f"tool use: {key}", f"{value:.3f}" if isinstance(value, float) else str(value))
    Console().print(table)
    typer.echo(
        f"run folder: {train_config.out_dir} (summary.json, metrics.jsonl, training.png, tensorboard/)"
    )


@app.command()
def model(
    name: str = typer.Argument(..., help="'tiny' (random, for plumbing) or 'smollm2-135m' (real, offline)."),
    out: Path | None = typer.Option(None, help="Where to write the HF folder (default: the cache)."),
    force: bool = typer.Option(False, help="Rebuild even if a prepared copy is there."),
) -> None:
    """Prepare a model as a local Hugging Face folder that vLLM and transformers load. Idempotent."""
    from stare_agents.models import MODEL_NAMES, prepare_model

    if name not in MODEL_NAMES:
        raise typer.BadParameter(f"choose one of {MODEL_NAMES}", param_hint="NAME")
    try:
        path = prepare_model(name, out, force=force)
    except (RuntimeError, FileNotFoundError) as error:
        typer.secho(str(error), fg="red", err=True)
        raise typer.Exit(1) from error
    typer.echo(str(path))


@app.command()
def rollout(
    env: str = typer.Option(..., "--env", help="Environment id, e.g. stare_agents/ArithmeticTIR-v0."),
    model: str = typer.Option(..., help="A local HF folder, 'tiny' or 'smollm2-135m'."),
    out: Path = typer.Option(..., help="JSONL file: one trajectory per line."),
    engine: str = typer.Option("vllm", help="vllm or hf."),
    dtype: str = typer.Option("auto", help="auto (the checkpoint's), float32, bfloat16 or fast."),
    num_tasks: int = typer.Option(8, "--num-tasks", help="Distinct tasks (prompts)."),
    n: int = typer.Option(1, "--n", help="Samples per task (a GRPO group)."),
    seed: int = typer.Option(0, help="Task i is reset with seed + i."),
    workers: int = typer.Option(1, help="Ray rollout workers; 0 runs in this process without Ray."),
    temperature: float = typer.Option(1.0),
    top_p: float = typer.Option(1.0, "--top-p"),
    max_tokens_per_turn: int = typer.Option(512, "--max-tokens-per-turn"),
    max_total_tokens: int = typer.Option(2048, "--max-total-tokens", help="Response budget per episode."),
    max_model_len: int = typer.Option(4096, "--max-model-len"),
    rendering: str = typer.Option("auto", help="auto, chat (template tool turns) or inline."),
    sandbox: str = typer.Option(
        "docker", help="docker, local (needs STARE_ALLOW_LOCAL_SANDBOX=1) or none (tool calls are errors)."
    ),
    env_kwargs: str = typer.Option(
        "{}", "--env-kwargs", help="JSON object of keyword arguments for the env."
    ),
    imports: list[str] = typer.Option(
        [],
        "--import",
        help="A module that registers your environments (repeatable), also in every worker. The current folder "
        "is searched first, as uvicorn finds its app.",
    ),
) -> None:
    """Run episodes of an environment with a model and write their trajectories (token-in-token-out).

    --env takes a registered id, your own id after --import MODULE, or gymnasium's module:Name-v0."""
    import json
    import time

    from rich.console import Console
    from rich.table import Table

    from stare_agents.envs.registration import accepted_kwargs, resolve_env_id, unknown_kwargs
    from stare_agents.models import prepare_model
    from stare_agents.rollout import RolloutConfig, RolloutTask, RolloutWorkerGroup, WorkerSpec
    from stare_agents.rollout.summary import summarize_episodes
    from stare_agents.trajectory import write_jsonl

    try:
        kwargs = json.loads(env_kwargs)
        if not isinstance(kwargs, dict):
            raise ValueError("not an object")
    except ValueError as error:
        raise typer.BadParameter(f"--env-kwargs must be a JSON object: {error}") from error
    module, sep, _ = env.rpartition(":")
    imports = list(dict.fromkeys([*imports, *([module] if sep and module else [])]))
    try:
        env = resolve_env_id(env, imports)
    except ValueError as error:
        raise typer.BadParameter(str(error), param_hint="--env") from error
    unknown = unknown_kwargs(env, kwargs)
    if unknown:
        raise typer.BadParameter(
            f"{env} takes no keyword {unknown[0]!r} (value {kwargs[unknown[0]]!r}); allowed: "
            f"{sorted((accepted_kwargs(env) or set()) - {'sandbox', 'tools'})}",
            param_hint="--env-kwargs",
        )
    from stare_agents.sandbox import SandboxError, check_backend

    try:  # no usable sandbox: say so before any model is prepared or Ray started
        check_backend(sandbox)
    except (SandboxError, ValueError) as error:
        typer.secho(str(error), fg="red", err=True)
        raise typer.Exit(2) from error
    model_dir = str(prepare_model(model))
    config = RolloutConfig(
        temperature=temperature,
        top_p=top_p,
        max_tokens_per_turn=max_tokens_per_turn,
        max_total_tokens=max_total_tokens,
        rendering=rendering,
        seed=seed,
    )
    tasks = [
        RolloutTask(env, seed=seed + i, env_kwargs=kwargs, group_id=str(seed + i), sample_index=j)
        for i in range(num_tasks)
        for j in range(n)
    ]
    spec = WorkerSpec(
        model=model_dir,
        engine=engine,
        dtype=dtype,
        seed=seed,
        max_model_len=max_model_len,
        sandbox=sandbox,
        imports=imports,
    )
    with RolloutWorkerGroup(spec, max(1, workers), use_ray=workers > 0) as group:
        started = time.perf_counter()
        trajectories = group.collect(tasks, config, progress=True)
        seconds = time.perf_counter() - started
    out.parent.mkdir(parents=True, exist_ok=True)
    write_jsonl(trajectories, out)
    summary = summarize_episodes(trajectories, seconds)
    table = Table(title=f"{len(trajectories)} episodes of {env} -> {out}")
    table.add_column("figure")
    table.add_column("value", justify="right")
    for key, value in summary.items():
        table.add_row(key, f"{value:.3f}" if isinstance(value, float) else str(value))
    Console().print(table)


@app.command()
def show(
    source: Path = typer.Argument(
        ..., help="A run folder, a rollouts/step-*.jsonl.gz file, a samples.jsonl or trajectories JSONL."
    ),
    out: Path | None = typer.Option(None, help="The HTML file (default: RUN/rollouts.html, or FILE.html)."),
    step: list[int] | None = typer.Option(None, help="Only these RL steps (repeatable; default: all saved)."),
    against: Path | None = typer.Option(
        None,
        help="A second run folder (e.g. GRPO-ds from the same SFT model): its entropy curves drawn over this "
        "run's and its held-out samples beside this run's in the across-training view.",
    ),
    serve: bool = typer.Option(False, help="Also serve the page over HTTP on localhost until Ctrl-C."),
    port: int = typer.Option(8000, help="The port for --serve (0: any free port)."),
) -> None:
    """Write one self-contained HTML page of saved rollouts: per-step overview, filters, search and sorting, token
    search by statistics with per-step histograms, and each trajectory's tokens coloured by STARE weight,
    surprisal, entropy, rollout/learner mismatch or Phi (with a scale), with tool calls, outputs and grading
    details; #step=N&traj=I links one trajectory, #prompt=P one prompt across steps, #heldout the held-out tasks
    across training (base, SFT, during RL, end; and --against's). Opens from disk."""
    from stare_agents.jsonl import Unread, unread_message
    from stare_agents.viewer import serve as serve_page
    from stare_agents.viewer import write_page

    unread: list[Unread] = []
    try:
        path = write_page(source, out, steps=step or None, unread=unread, against=against)
    except (FileNotFoundError, ValueError) as error:
        typer.secho(str(error), fg="red", err=True)
        raise typer.Exit(2) from error
    if unread:  # also on the page, as notices above the overview
        typer.secho(f"warning: {unread_message(unread, 'lines or files')}", fg="yellow", err=True)
    typer.echo(str(path))
    if serve:
        serve_page(path, port=port)


@app.command(
    "gpu-smoke",
    context_settings={"allow_extra_args": True, "ignore_unknown_options": True},
    add_help_option=False,
)
def gpu_smoke(ctx: typer.Context) -> None:
    """GPU smoke checks (tiers device, node, cluster), each with a deadline: one JSON report, what was skipped and
    why. `stare-agents gpu-smoke --help` lists the options; `--tier device --device cpu` rehearses on the CPU."""
    from stare_agents.train.gpu_smoke import main as smoke

    raise typer.Exit(smoke(list(ctx.args)))


@app.command()
def version() -> None:
    """Print the installed version."""
    typer.echo(__version__)


def main() -> None:
    app()


if __name__ == "__main__":
    main()
