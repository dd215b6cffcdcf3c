"""The trajectory viewer: one self-contained HTML page of a run's saved rollouts (`stare-agents show`).

    path = write_page("runs/tiny")                  # runs/tiny/rollouts.html; also a step file, an eval
    path = write_page("evals/x/samples.jsonl")      # samples.jsonl or a trajectories JSONL
    path = write_page("runs/a", against="runs/b")   # and run b's entropy curve and held-out samples beside a's

The page needs no server and no network: its script and style are inline, a Content-Security-Policy forbids
every other source, and the data is embedded as JSON in `<script type="application/json">` blocks, one per
RL step, one per held-out evaluation point, and one of the prompts (each distinct prompt once, however many
samples and steps share it), escaped so that no text (a tool output holding `</script>`, say) can end a block.
The script parses a block when its view is opened and draws a trajectory's tokens when it is opened, so a run
of thousands of trajectories opens as fast as its overview. Text is only ever inserted as text, with every
character that hides or reorders text (`viewer.text.INVISIBLE_RANGES`: controls, bidi and zero-width
characters, tag characters, fillers, lone surrogates) shown as a marked code-point chip.

A display cap keeps a huge trajectory readable and loses nothing: an observation or a turn's text longer than
`CAP_CHARS` characters is drawn cut there, and a run of more than `CAP_TOKENS` action tokens draws its first
`CAP_TOKENS`, each with a marker saying how much is hidden and a "show all" button that draws the rest (tokens
drawn later take the current colouring). Only the drawing is cut: the embedded data holds everything, and the
search reads the data, so it finds text past the cap.

Per token the page colours the STARE weight, the surprisal -log pi, the learner's entropy, the learner/rollout
log-prob mismatch and Phi (each where the rollout files have it, for any trajectory: `SavedRollout`'s
`learner_*` fields), on a log or a quantile scale drawn with its numbers. Per step it finds tokens by their
statistics (histograms of entropy, surprisal and mismatch on log axes with the L+/L- cut-offs, a token table
filtered by a threshold, trajectories sorted by their largest mismatch or entropy, their L+/L- counts, Phi < 0
share or tool errors); it shows the grading details, a link per trajectory (`#step=N&traj=I`), a prompt's
trajectories across steps (`#prompt=P`) and the held-out tasks across training (`#heldout`: each evaluation
point's samples of one task side by side, `#heldout=TASK`). docs/viewer.md describes the page.
"""

from __future__ import annotations

import contextlib
import logging
import math
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from stare_agents.jsonl import Unread, report_unread
from stare_agents.rollout_log import ROLLOUTS_DIR, SavedRollout, read_rollouts, saved_steps
from stare_agents.viewer.heldout import heldout_points_of
from stare_agents.viewer.text import INVISIBLE_RANGES, escape_json, marked

__all__ = ["build_page", "compact", "escape_json", "marked", "serve", "write_page"]

logger = logging.getLogger("stare_agents.viewer")
ASSETS = Path(__file__).parent / "assets"
PAGE_NAME = "rollouts.html"
# the figures of a metrics.jsonl "rl" record the overview shows, and their column titles
OVERVIEW = {
    "rollout/mean_reward": "reward",
    "rollout/accuracy": "accuracy",
    "learner/entropy": "entropy",
    "learner/entropy_all": "entropy (all)",
    "stare/gate_on": "gate",
    "stare/w": "w",
    "stare/lplus_share": "L+ share",
    "data/kept_trajectories": "trained",
    "rollout/failed": "failed",
}
# a trajectory's info keys that say how it was graded, shown with it (from the env's final step info)
GRADING = ("extracted", "answer", "grade_reason", "score_details", "reward_violation")
TARGET_BAND = 0.3  # the band drawn around the target entropy: +-30%, as training.png and summary.json have it
# the display cap (see the module docstring): characters of one observation or turn text, and action tokens
# of one run, drawn before a "show all" button; counted as the page's script counts (UTF-16 code units)
CAP_CHARS = 4000
CAP_TOKENS = 2000
DIGITS = 4  # decimals of the per-token figures in the page


def compact(saved: SavedRollout, index: int, prompt: int | None = None) -> dict[str, Any]:
    """One trajectory as the page's script reads it (short keys: a step of thousands stays small). `prompt`:
    the index of its prompt in the page's prompt table (None: the prompt text is stored with it). Per-token
    lists hold 0 on observation tokens, and null where a saved figure is not a number."""
    t = saved.trajectory
    learner = saved.learner_logprobs
    mask = t.action_mask
    surprisal = _per_action([-lp for lp in (learner if learner is not None else t.rollout_logprobs)], mask)
    selection = _selection(saved)
    tokens = saved.tokens or None
    out = {
        "i": index,
        "g": t.group_id,
        "si": t.sample_index,
        "task": t.task_id,
        "r": t.reward,
        "c": t.correct,
        "sr": t.stop_reason,
        "st": saved.status,
        "a": saved.mean_advantage,  # a per-token advantage: its mean over the action tokens
        "wv": t.weight_version,
        "nt": t.num_turns,
        "n": len(t.response_ids) or sum(turn.num_tokens for turn in t.turns),
        "err": t.error,
        "gate": saved.gate_on,
        "tok": tokens,
        "m": "".join("1" if bit else "0" for bit in mask),
        "s": surprisal,
        "ssrc": "learner" if learner is not None else "rollout",
        "w": [round(w, DIGITS) for w in saved.stare_weights] if saved.stare_weights is not None else None,
        "sel": "".join("+-"[v < 0] if v else "0" for v in saved.selection) if saved.selection else None,
        "cut": _cutoffs(surprisal, selection) if selection else None,
        "grade": {key: t.info[key] for key in GRADING if t.info.get(key) is not None} or None,
        "turns": [
            {
                # with token texts the turns' text is the tokens' (drawn from them): not stored twice
                **({} if tokens else {"text": turn.text, "obs": turn.observation}),
                "calls": turn.tool_calls,
                "statuses": turn.tool_statuses,
                "finish": turn.finish_reason,
            }
            for turn in t.turns
        ],
    }
    if saved.learner_entropy is not None:
        out["h"] = _per_action(saved.learner_entropy, mask)
    if learner is not None:  # log pi_learner - log pi_rollout per action token
        out["d"] = _per_action(
            [_difference(lp, rp) for lp, rp in zip(learner, t.rollout_logprobs, strict=True)], mask
        )
    if saved.learner_phi is not None:
        out["phi"] = _per_action(saved.learner_phi, mask)
    if prompt is None:
        out["prompt"] = saved.prompt_text
    else:
        out["p"] = prompt
    return out


def _per_action(values: Sequence[Any], mask: Sequence[int]) -> list[float | None]:
    """A per-token figure rounded, 0 on observation tokens, None where it is not a finite number."""
    return [
        (round(v, DIGITS) if _number(v) else None) if bit else 0 for v, bit in zip(values, mask, strict=True)
    ]


def _difference(a: Any, b: Any) -> float | None:
    return a - b if _number(a) and _number(b) else None


def _selection(saved: SavedRollout) -> list[int] | None:
    """1 L+, -1 L-, 0 neither per response token: as saved, else as the saved weights say (w > 1: L+)."""
    if saved.selection:
        return saved.selection
    if saved.stare_weights is None or all(w == 1 for w in saved.stare_weights):
        return None
    return [1 if w > 1 else -1 if w < 1 else 0 for w in saved.stare_weights]


def _cutoffs(surprisal: list[float | None], selection: list[int]) -> dict[str, Any]:
    """The surprisal cut-off of a trajectory's selected tokens: the lowest surprisal among its L+ (and L-)
    tokens, and how many there are."""
    out: dict[str, Any] = {}
    for sign, name in ((1, "+"), (-1, "-")):
        chosen = [s for s, v in zip(surprisal, selection, strict=True) if v == sign and s is not None]
        if chosen:
            out[name] = min(chosen)
            out[name + "n"] = len(chosen)
    return out


def step_cutoffs(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """A step's selection thresholds from its trajectories' (`compact`): per sign, the lowest selected
    surprisal over the step, the highest of the trajectories' own cut-offs (the two differ when L+/L- are
    taken per micro-batch) and the number of selected tokens."""
    out: dict[str, Any] = {}
    for name in ("+", "-"):
        cuts = [r["cut"][name] for r in rows if r.get("cut") and name in r["cut"]]
        if cuts:
            out[name] = min(cuts)
            out[name + "max"] = max(cuts)
            out[name + "n"] = sum(r["cut"][name + "n"] for r in rows if r.get("cut") and name in r["cut"])
    return out


def load_source(
    source: str | Path, unread: list[Unread] | None = None, *, steps: Iterable[int] | None = None
) -> tuple[str, dict[str, list[SavedRollout]], list[dict[str, Any]]]:
    """(title, step name -> saved rollouts, metrics.jsonl records) of a run folder, a step file, an eval
    samples.jsonl or a trajectories JSONL. `steps` limits a run folder to those RL steps: only their files are
    opened. What cannot be read (a damaged step file, a malformed line) is skipped and appended to `unread`
    (else logged as a warning); a step of which nothing could be read is left out, and a single file of which
    nothing could be read is a ValueError."""
    source = Path(source)
    if source.is_dir():
        saved = saved_steps(source)
        if not saved:
            raise FileNotFoundError(
                f"{source} has no saved rollouts ({source / ROLLOUTS_DIR}/step-*.jsonl.gz); they are written "
                "by RL runs with logging.rollouts > 0 (the default)"
            )
        if steps is not None:
            wanted = sorted(set(steps))
            missing = [s for s in wanted if s not in saved]
            if len(missing) == len(wanted):
                raise ValueError(
                    f"none of the steps {wanted} has saved rollouts in {source}; steps saved: "
                    f"{_ranges(saved)}"
                )
            if missing:
                logger.warning("steps %s have no saved rollouts in %s; showing %s", missing, source, wanted)
            saved = [s for s in wanted if s not in missing]
        data = {str(s): read_rollouts(source, s, unread=unread) for s in saved}
        data = {name: saved for name, saved in data.items() if saved}
        return source.name or str(source.resolve().name), data, _records(source / "metrics.jsonl", unread)
    if not source.exists():
        raise FileNotFoundError(f"{source}: no such run folder or file")
    if source.name.endswith(".jsonl.gz"):
        saved = read_rollouts(source, unread=unread)
        name = str(saved[0].step) if saved else source.name
        return source.name, {name: saved}, _records(source.parent.parent / "metrics.jsonl", unread)
    if source.suffix == ".jsonl":
        return source.name, {"samples": read_rollouts(source, unread=unread)}, []
    raise ValueError(
        f"{source}: not a run folder, a rollouts/step-*.jsonl.gz file or a .jsonl of samples/trajectories"
    )


def _ranges(numbers: list[int]) -> str:
    """0-11, 14, 20-22: a list of step numbers, short."""
    parts: list[str] = []
    start = prev = None
    for n in [*numbers, None]:
        if start is not None and (n is None or n != prev + 1):
            parts.append(str(start) if start == prev else f"{start}-{prev}")
            start = None
        if n is not None and start is None:
            start = n
        prev = n
    return ", ".join(parts)


def _records(path: Path, unread: list[Unread] | None) -> list[dict[str, Any]]:
    from stare_agents.records import read_records

    return read_records(path, unread=unread)


def _curve(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [
        {"step": r.get("step"), "entropy": r.get("learner/entropy"), "all": r.get("learner/entropy_all")}
        for r in records
        if r.get("kind") == "rl"
    ]


def _target(records: list[dict[str, Any]]) -> float | None:
    return next((r["stare/target_entropy"] for r in records if _number(r.get("stare/target_entropy"))), None)


def build_page(
    source: str | Path,
    *,
    steps: Iterable[int] | None = None,
    unread: list[Unread] | None = None,
    against: str | Path | None = None,
) -> str:
    """The HTML page of `source` (see `load_source`); `steps` limits a run folder to those RL steps (only
    their files are read); `against`: a second run folder whose entropy curve is drawn over `source`'s and
    whose held-out samples stand beside `source`'s in the across-training view. What could not be read is
    shown as notices at the top of the page, and appended to `unread` when given (else logged as one
    warning)."""
    notices: list[Unread] = []
    title, data, records = load_source(source, notices, steps=steps)
    if steps is not None and not Path(source).is_dir():
        wanted = {str(s) for s in steps}
        data = {name: saved for name, saved in data.items() if name in wanted}
        if not data:
            report_unread(notices, unread, "lines or files")
            raise ValueError(f"none of the steps {sorted(wanted)} has saved rollouts in {source}")
    runs = [("A", Path(source), title, records)]
    if against is not None:
        other = Path(against)
        if not other.is_dir():
            raise FileNotFoundError(f"--against {other}: not a run folder")
        other_records = _records(other / "metrics.jsonl", notices)
        if not other_records and not saved_steps(other):
            raise FileNotFoundError(
                f"--against {other}: no metrics.jsonl and no saved rollouts: not a run folder"
            )
        runs.append(("B", other, other.resolve().name, other_records))
    prompts = Prompts()
    payloads = {
        name: [compact(s, i, prompts.index(s, name)) for i, s in enumerate(saved)]
        for name, saved in data.items()
    }
    heldout: list[dict[str, Any]] = []
    heldout_blocks: dict[str, list[dict[str, Any]]] = {}
    heldout_notes: list[str] = []
    seen: set[tuple[Path, str]] = set()  # a compare arm's base and SFT are its parent's: shown once
    for run, folder, _, run_records in runs:
        if not folder.is_dir():
            continue
        points, note = heldout_points_of(folder, run_records, notices)
        if note:
            heldout_notes.append(note)
        for point in points:
            if (point.source.resolve(), point.name) in seen:
                continue
            seen.add((point.source.resolve(), point.name))
            block = f"heldout-{len(heldout_blocks)}"  # the point's name may hold any character
            heldout.append({**point.meta(), "run": run, "block": block})
            heldout_blocks[block] = [compact(s, i, prompts.index(s)) for i, s in enumerate(point.samples)]
    report_unread(notices, unread, "lines or files")
    every = [s for saved in data.values() for s in saved]
    by_step = {str(r.get("step")): r for r in records if r.get("kind") == "rl"}
    overview = []
    for name, saved in data.items():
        record = by_step.get(name, {})
        row = {"step": name, "saved": len(saved), "statuses": {}}
        for status in (s.status for s in saved):
            row["statuses"][status] = row["statuses"].get(status, 0) + 1
        row.update({key: record.get(key) for key in OVERVIEW})
        row["target"] = record.get("stare/target_entropy")
        row["cut"] = step_cutoffs(payloads[name])
        overview.append(row)
    meta = {
        "title": title,
        "columns": OVERVIEW,
        "overview": overview,
        "runs": [
            {"run": run, "title": name, "curve": _curve(recs), "target": _target(recs)}
            for run, _, name, recs in runs
        ],
        "curve": _curve(records),
        "target": _target(records),
        "band": TARGET_BAND,
        "fields": {  # which per-token figures the source holds (the page says so where one is absent)
            "entropy": any(s.learner_entropy is not None for s in every),
            "learner": any(s.learner_logprobs is not None for s in every),
            "phi": any(s.learner_phi is not None for s in every),
        },
        # trajectories with the learner's per-token figures, by status: a folder written before every sampled
        # trajectory was scored has them for trained ones only (the page says so)
        "coverage": _coverage(every),
        "heldout": heldout,
        "heldoutNotes": heldout_notes,
        "notices": [str(u) for u in notices],
        "cap": {"chars": CAP_CHARS, "tokens": CAP_TOKENS},
        "invisible": [[lo, hi, name] for lo, hi, name in INVISIBLE_RANGES],
    }
    blocks = [
        f'<script type="application/json" id="meta">{escape_json(meta)}</script>',
        f'<script type="application/json" id="prompts">{escape_json(prompts.table())}</script>',
    ]
    for name, payload in payloads.items():
        blocks.append(
            f'<script type="application/json" id="step-{_safe_id(name)}">{escape_json(payload)}</script>'
        )
    for name, payload in heldout_blocks.items():
        blocks.append(
            f'<script type="application/json" id="{_safe_id(name)}">{escape_json(payload)}</script>'
        )
    css = (ASSETS / "viewer.css").read_text(encoding="utf-8")
    js = (ASSETS / "viewer.js").read_text(encoding="utf-8")
    return (
        '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">\n'
        '<meta http-equiv="Content-Security-Policy" content="default-src \'none\'; '
        "script-src 'unsafe-inline'; style-src 'unsafe-inline'; img-src data:\">\n"
        f"<title>{_html_text(title)} - stare-agents rollouts</title>\n<style>{css}</style></head>\n"
        '<body><div id="app"><p id="loading">loading...</p></div>\n'
        + "\n".join(blocks)
        + f"\n<script>{js}</script>\n</body></html>\n"
    )


def _coverage(saved: list[SavedRollout]) -> dict[str, list[int]]:
    """status -> [trajectories with learner log-probs, trajectories]."""
    out: dict[str, list[int]] = {}
    for s in saved:
        counts = out.setdefault(s.status, [0, 0])
        counts[0] += s.learner_logprobs is not None
        counts[1] += 1
    return out


class Prompts:
    """The page's prompt table: each distinct prompt once, and the steps each appears in (for the view of a
    prompt across steps). A rollout without a prompt text (an eval sample) is keyed by its task."""

    def __init__(self) -> None:
        self.keys: dict[tuple[str, str], int] = {}
        self.texts: list[str] = []
        self.tasks: list[str] = []
        self.steps: list[list[str]] = []

    def index(self, saved: SavedRollout, step: str | None = None) -> int:
        """The number of `saved`'s prompt in the table (added if new); `step`: the name of its RL step (None:
        a held-out sample, not a training prompt)."""
        text = saved.prompt_text
        key = (text, "" if text else saved.trajectory.task_id)
        if key not in self.keys:
            self.keys[key] = len(self.texts)
            self.texts.append(text)
            self.tasks.append(saved.trajectory.task_id)
            self.steps.append([])
        number = self.keys[key]
        if step is not None and (not self.steps[number] or self.steps[number][-1] != step):
            self.steps[number].append(step)
        return number

    def table(self) -> dict[str, list[Any]]:
        return {"text": self.texts, "task": self.tasks, "steps": self.steps}


def _number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def _safe_id(name: str) -> str:
    return "".join(ch if ch.isalnum() or ch in "-_" else "_" for ch in name)


def _html_text(text: str) -> str:
    return marked(text).replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def default_output(source: str | Path) -> Path:
    source = Path(source)
    if source.is_dir():
        return source / PAGE_NAME
    name = source.name.removesuffix(".gz").removesuffix(".jsonl")
    return source.with_name(f"{name}.html")


def write_page(
    source: str | Path,
    out: str | Path | None = None,
    *,
    steps: Iterable[int] | None = None,
    unread: list[Unread] | None = None,
    against: str | Path | None = None,
) -> Path:
    """Write the page of `source` (default: RUN/rollouts.html, or FILE.html beside a file); returns its path.
    `against`: a second run folder (see `build_page`). What could not be read goes to `unread` when given."""
    path = Path(out) if out is not None else default_output(source)
    html = build_page(source, steps=steps, unread=unread, against=against)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(html, encoding="utf-8")
    tmp.replace(path)
    return path


def serve(path: str | Path, *, port: int = 8000, host: str = "127.0.0.1") -> None:
    """Serve one page over HTTP on `host` until interrupted (for opening it from another machine over a tunnel).
    Only requests addressed to it (Host `host:port` or `localhost:port`) are answered, others get 403: a web
    page whose own name resolves to this address (DNS rebinding) cannot read the rollouts."""
    import http.server

    page = Path(path).read_bytes()
    hosts: set[str] = set()  # the Host headers answered, once the port is bound

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            if self.headers.get("Host") not in hosts:
                self.send_error(403, "this server answers requests for its own address only")
                return
            self.send_response(200)
            self.send_header("Content-Type", "text/html; charset=utf-8")
            self.send_header("Content-Length", str(len(page)))
            self.end_headers()
            self.wfile.write(page)

        def log_message(self, format: str, *args: Any) -> None:
            return

    with http.server.ThreadingHTTPServer((host, port), Handler) as server:
        bound = server.server_address[1]
        hosts.update({f"{host}:{bound}", f"localhost:{bound}"})
        print(f"serving {path} on http://{host}:{bound}/ (Ctrl-C stops)")
        with contextlib.suppress(KeyboardInterrupt):
            server.serve_forever()
