"""Every RL step's trajectories on disk, with what the learner did to each token; read back with one call.

    log = RolloutLog(run_folder, tokenizer_dir=model_dir, fraction=1.0)  # = logging.rollouts
    log.write(step, trajectories, kept, advantages, result.token_records, gate_on=result.gate_on,
              others=untrained, other_data=result.other_records)     # rollouts/step-000012.jsonl.gz
    saved = read_rollouts(run_folder)            # or a step file, or read_rollouts(run_folder, step=12)

One gzip'd JSON line per trajectory (`SavedRollout.to_dict`): the trajectory itself (token ids, action mask,
rollout log-probs, turns with tool calls and outputs, reward, stop reason, weight version, group), its
`status` in the step (`ROLLOUT_STATUSES`), the advantage it was trained with, the learner's per-token
log-probs, entropies and entropy sensitivities Phi (for the trained trajectories and the untrained ones it
scored), STARE weights and L+/L- selection (trained only; see `stare_agents.train.learner.TokenRecord`), and
the text of each response token so that a viewer needs no tokenizer. A step's file is written whole and renamed into
place: a killed run leaves no torn file, and a resumed run rewrites the steps it repeats.
"""

from __future__ import annotations

import gzip
import hashlib
import os
import re
import zlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from stare_agents.jsonl import Unread, dumps_line, parse_lines, read_lines, report_unread
from stare_agents.trajectory import Trajectory

ROLLOUTS_DIR = "rollouts"
STEP_FILE = "step-{step:06d}.jsonl.gz"
GUNZIP_PIECE = 1 << 16  # compressed bytes decompressed at a time when reading a step file

# What became of a trajectory in its step. A closed set: the viewer filters on it.
ROLLOUT_STATUSES: tuple[str, ...] = (
    "trained",  # in the step batch: it has an advantage and (from a Learner) per-token learner outputs
    "dropped",  # left out by dynamic sampling (its group's rewards were all equal) or past prompts_per_step
    "void_turn",  # left out because it has a void turn (rl.drop_void_turns)
    "failed",  # the rollout failed (environment, sandbox or engine): its reward carries no signal
    "evaluated",  # a held-out evaluation sample (heldout/): never trained
)


@dataclass
class SavedRollout:
    """One saved trajectory and what its RL step did with it (see the module docstring)."""

    step: int
    trajectory: Trajectory
    status: str = "trained"
    advantage: float | list[float] | None = None  # per sequence, or per response token; None unless trained
    learner_logprobs: list[float] | None = None  # per response token; None unless the learner recorded them
    # the pre-update policy's entropy per response token (0 on observation tokens); None unless recorded
    learner_entropy: list[float] | None = None
    # Phi(p, a) of the pre-update policy per response token (0 on observation tokens); None unless recorded
    learner_phi: list[float] | None = None
    stare_weights: list[float] | None = None
    selection: list[int] | None = None  # 1 L+, -1 L-, 0 neither
    gate_on: bool | None = None  # whether the step reweighted (None: unknown)
    tokens: list[str] = field(default_factory=list)  # the text of each response token
    prompt_text: str = ""

    def __post_init__(self) -> None:
        if self.status not in ROLLOUT_STATUSES:
            raise ValueError(f"status must be one of {ROLLOUT_STATUSES}, got {self.status!r}")
        n = len(self.trajectory.response_ids)
        for name in (
            "learner_logprobs",
            "learner_entropy",
            "learner_phi",
            "stare_weights",
            "selection",
            "advantage",
        ):
            value = getattr(self, name)
            if isinstance(value, list) and value and len(value) != n:
                raise ValueError(
                    f"saved rollout {self.trajectory.task_id!r} (step {self.step}): {name} has {len(value)} "
                    f"entries for {n} response tokens"
                )
        if self.tokens and len(self.tokens) != n:
            raise ValueError(
                f"saved rollout {self.trajectory.task_id!r} (step {self.step}): {len(self.tokens)} token texts "
                f"for {n} response tokens"
            )

    @property
    def mean_advantage(self) -> float | None:
        """The advantage as one number: as saved, or a per-token advantage's mean over the action tokens;
        None when it was not trained."""
        advantage = self.advantage
        if isinstance(advantage, list):
            actions = [a for a, bit in zip(advantage, self.trajectory.action_mask, strict=True) if bit]
            return sum(actions) / len(actions) if actions else 0.0
        return None if advantage is None else float(advantage)

    def to_dict(self) -> dict[str, Any]:
        return {
            "step": self.step,
            "status": self.status,
            "advantage": self.advantage,
            "gate_on": self.gate_on,
            "learner_logprobs": self.learner_logprobs,
            "learner_entropy": self.learner_entropy,
            "learner_phi": self.learner_phi,
            "stare_weights": self.stare_weights,
            "selection": self.selection,
            "prompt_text": self.prompt_text,
            "tokens": self.tokens,
            "trajectory": self.trajectory.to_dict(),
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> SavedRollout:
        data = dict(data)
        data["trajectory"] = Trajectory.from_dict(data["trajectory"])
        return cls(**data)


def step_file(folder: str | Path, step: int) -> Path:
    """The file of one RL step in a run folder."""
    return Path(folder) / ROLLOUTS_DIR / STEP_FILE.format(step=step)


def saved_steps(folder: str | Path) -> list[int]:
    """The RL steps with a rollout file in a run folder, ascending."""
    directory = Path(folder) / ROLLOUTS_DIR
    steps = []
    for path in directory.glob("step-*.jsonl.gz") if directory.is_dir() else []:
        number = path.name.removeprefix("step-").removesuffix(".jsonl.gz")
        if number.isdigit():
            steps.append(int(number))
    return sorted(steps)


def read_rollouts(
    path: str | Path, step: int | None = None, *, unread: list[Unread] | None = None
) -> list[SavedRollout]:
    """Saved rollouts: of a run folder (every step, or `step`), of one step file, or of an eval samples.jsonl
    or trajectories JSONL. What cannot be read (a damaged or truncated step file, a line that is not a saved
    rollout) is skipped and reported: into `unread` when given, else as one warning naming file and line. A
    file of which nothing could be read is a ValueError naming what was wrong."""
    path = Path(path)
    if path.is_dir():
        if step is not None:
            files = [step_file(path, step)]
            if not files[0].exists():
                raise FileNotFoundError(
                    f"{path} has no rollouts of step {step}; steps saved: {saved_steps(path) or 'none'}"
                )
        else:
            files = [step_file(path, s) for s in saved_steps(path)]
    elif path.exists():
        files = [path]
    else:
        raise FileNotFoundError(f"{path} is neither a run folder nor a rollout file")
    out: list[SavedRollout] = []
    problems: list[Unread] = []
    for file in files:
        read, damage = read_jsonl_rollouts(file) if file.suffix == ".jsonl" else read_step_file(file)
        if not read and damage and not path.is_dir():
            raise ValueError(f"{file}: nothing could be read: " + "; ".join(str(u) for u in damage[:5]))
        out += read
        problems += damage
    report_unread(problems, unread, "rollout lines or files")
    return out


def read_step_file(path: str | Path) -> tuple[list[SavedRollout], list[Unread]]:
    """The saved rollouts of one step file, and what could not be read of it: a line that is not a saved
    rollout, or the end of a damaged file (truncated, not gzip) after the rollouts that came before it."""
    path = Path(path)
    data, damage = gunzip(path.read_bytes())
    values, unread = parse_lines(data, path)
    rollouts = []
    for number, value in values:
        try:
            rollouts.append(SavedRollout.from_dict(value))
        except (KeyError, TypeError, ValueError, AttributeError) as error:
            unread.append(Unread(str(path), number, f"not a saved rollout ({type(error).__name__}: {error})"))
    if damage:
        unread.append(
            Unread(str(path), None, f"damaged ({damage}); {len(rollouts)} rollouts read before the damage")
        )
    return rollouts, unread


def gunzip(data: bytes) -> tuple[bytes, str | None]:
    """The bytes gzip `data` holds, and what was wrong with it (None: nothing). Of a truncated or corrupt
    stream, or of data that is not gzip, what decompressed before the fault."""
    out = []
    rest = data
    while rest.strip(b"\0"):  # one member after another (gzip pads with zeros at the end)
        stream = zlib.decompressobj(16 + zlib.MAX_WBITS)  # 16: a gzip header and trailer
        position = 0
        try:
            while not stream.eof and position < len(rest):  # in pieces: a fault loses only its piece
                out.append(stream.decompress(rest[position : position + GUNZIP_PIECE]))
                position += GUNZIP_PIECE
        except zlib.error as error:
            return b"".join(out), f"not gzip data, or corrupt: {error}"
        if not stream.eof:
            return b"".join(out), "truncated: the gzip stream ends before its end"
        rest = stream.unused_data + rest[position:]
    return b"".join(out), None


def read_jsonl_rollouts(path: str | Path) -> tuple[list[SavedRollout], list[Unread]]:
    """The episodes of an eval samples.jsonl (`stare-agents eval`; with their token ids, mask and rollout
    log-probs when the file has them, turn texts only in older files) or of a trajectories JSONL
    (`stare_agents.trajectory.write_jsonl`), as saved rollouts (step 0), and the lines that are neither (a
    line torn by a kill among them)."""
    from stare_agents.trajectory import TurnRecord

    path = Path(path)
    values, unread = read_lines(path)
    rollouts = []
    for number, record in values:
        try:
            if not isinstance(record, dict):
                raise TypeError(f"a JSON {type(record).__name__}, not an object")
            if "prompt_ids" in record:
                rollouts.append(
                    SavedRollout(step=0, trajectory=Trajectory.from_dict(record), status="trained")
                )
                continue
            if "benchmark" not in record or "turns" not in record:
                raise KeyError("neither an eval sample nor a trajectory")
            tokens = record.get("tokens") or {}
            trajectory = Trajectory(
                prompt_ids=list(tokens.get("prompt_ids") or [0]),
                response_ids=list(tokens.get("response_ids", [])),
                action_mask=list(tokens.get("action_mask", [])),
                rollout_logprobs=[float(x) for x in tokens.get("rollout_logprobs", [])],
                reward=float(record.get("reward", 0.0)),
                num_turns=int(record.get("num_turns", 0)),
                stop_reason=record.get("stop_reason", "answered"),
                weight_version=int(record.get("weight_version") or 0),
                turns=[TurnRecord(**turn) for turn in record["turns"]],
                task_id=str(record.get("problem_id", "")),
                group_id=f"{record.get('benchmark')}/{record.get('problem_id')}",
                sample_index=int(record.get("sample_index", 0)),
                correct=bool(record.get("correct")),
                error=record.get("error"),
                info={key: record[key] for key in SAMPLE_GRADING if record.get(key) is not None},
            )
            status = "failed" if record.get("failed") else "trained"
            rollouts.append(SavedRollout(step=0, trajectory=trajectory, status=status))
        except (KeyError, TypeError, ValueError) as error:
            unread.append(
                Unread(
                    str(path), number, f"not an eval sample or a trajectory ({type(error).__name__}: {error})"
                )
            )
    unread.sort(key=lambda u: u.line or 0)
    return rollouts, unread


# the grading fields of an eval sample that a saved rollout keeps in its trajectory's info (as an RL
# trajectory's final step info has them)
SAMPLE_GRADING = ("extracted", "grade_reason", "answer")


def token_texts(tokenizer: Any, ids: Sequence[int]) -> list[str]:
    """The text of each token, such that they join to the decoded sequence where the tokenizer allows:
    a character split over several tokens (bytes of one UTF-8 character) goes to the first of them."""
    if not ids:
        return []
    pieces = tokenizer.batch_decode(
        [[i] for i in ids], skip_special_tokens=False, clean_up_tokenization_spaces=False
    )
    i = 0
    while i < len(pieces):
        if "\ufffd" in pieces[i]:  # an incomplete UTF-8 sequence: join with the next few tokens
            for j in range(i + 2, min(i + 5, len(ids)) + 1):
                joined = tokenizer.decode(
                    list(ids[i:j]), skip_special_tokens=False, clean_up_tokenization_spaces=False
                )
                if "\ufffd" not in joined:
                    pieces[i:j] = [joined] + [""] * (j - i - 1)
                    i = j - 1
                    break
        i += 1
    return pieces


def keep_group(step: int, group_id: str, fraction: float) -> bool:
    """Whether a group's trajectories are saved at `fraction` < 1: a fixed pseudo-random choice per
    (step, group), the same on every machine and on resume."""
    if fraction >= 1.0:
        return True
    digest = hashlib.sha256(f"{step}\0{group_id}".encode()).digest()
    return int.from_bytes(digest[:8], "big") / 2**64 < fraction


class RolloutLog:
    """Writes each RL step's trajectories to `rollouts/step-NNNNNN.jsonl.gz` in a run folder.

    `fraction` (the config's `logging.rollouts`) is the share of each step's groups saved: 1.0 saves
    everything, 0 nothing; groups are kept or left whole, so their rewards and advantages stay comparable.
    """

    def __init__(
        self, folder: str | Path, *, tokenizer_dir: str | Path | None, fraction: float = 1.0
    ) -> None:
        if not 0.0 <= fraction <= 1.0:
            raise ValueError(f"logging.rollouts is the share of groups saved, in [0, 1]; got {fraction}")
        self.folder = Path(folder)
        self.fraction = fraction
        self.last_saved: list[SavedRollout] = []  # what the last `write` saved (for the completions table)
        self.tokenizer = None
        if tokenizer_dir is not None:
            from transformers import AutoTokenizer

            self.tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir)

    def write(
        self,
        step: int,
        trajectories: Sequence[Trajectory],
        kept: Sequence[Trajectory],
        advantages: Any,
        token_data: Mapping[int, Any] | None = None,
        *,
        gate_on: bool | None = None,
        void_dropped: bool = False,
        others: Sequence[Trajectory] = (),
        other_data: Mapping[int, Any] | None = None,
    ) -> Path | None:
        """Save one step: every trajectory it collected; `kept` (in step-batch order) with `advantages` ([K]
        or [K, R] tensor or list) and the learner's per-token records of the step (`token_data`: step-batch row
        -> its TokenRecord, when it recorded them) and whether it reweighted the step (`gate_on`); `others`
        (the untrained trajectories the learner scored, in its order) with their records (`other_data`: row of
        `others` -> TokenRecord). Trajectories not in `kept` are saved as failed, void_turn (when
        `void_dropped`: rl.drop_void_turns) or dropped."""
        self.last_saved = []
        if self.fraction <= 0.0:
            return None
        rows = {id(t): i for i, t in enumerate(kept)}
        other_rows = {id(t): i for i, t in enumerate(others)}
        token_data = (token_data or {}) if kept else {}
        other_data = other_data or {}
        gate = gate_on if kept else None
        adv = advantages.tolist() if hasattr(advantages, "tolist") else list(advantages)
        saved = []
        for t in trajectories:
            if not keep_group(step, t.group_id, self.fraction):
                continue
            row = rows.get(id(t))
            if row is not None:
                status, record = "trained", token_data.get(row)
            else:
                record = other_data.get(other_rows[id(t)]) if id(t) in other_rows else None
                if t.failed:
                    status = "failed"
                elif void_dropped and (t.stop_reason == "void_turn" or t.info.get("void_turns")):
                    status = "void_turn"
                else:
                    status = "dropped"
            n = len(t.response_ids)
            advantage = None
            if row is not None:
                advantage = adv[row]
                if isinstance(advantage, list):
                    advantage = [float(a) for a in advantage[:n]]
            weights = getattr(record, "stare_weights", None)
            saved.append(
                SavedRollout(
                    step=step,
                    trajectory=t,
                    status=status,
                    advantage=advantage,
                    learner_logprobs=_rounded(record.learner_logprobs[:n]) if record else None,
                    learner_entropy=_per_token(record, "entropy", n),
                    learner_phi=_per_token(record, "phi", n),
                    stare_weights=_rounded(weights[:n]) if weights is not None else None,
                    selection=list(record.selection[:n]) if record and record.selection else None,
                    gate_on=bool(gate) if gate is not None and row is not None else None,
                    tokens=token_texts(self.tokenizer, t.response_ids) if self.tokenizer else [],
                    prompt_text=self._decode(t.prompt_ids),
                )
            )
        self.last_saved = saved
        return write_step(self.folder, step, saved)

    def _decode(self, ids: Sequence[int]) -> str:
        if self.tokenizer is None:
            return ""
        return self.tokenizer.decode(list(ids), skip_special_tokens=False, clean_up_tokenization_spaces=False)


def write_step(folder: str | Path, step: int, rollouts: Sequence[SavedRollout]) -> Path:
    """Write one step's file atomically (a temporary file renamed into place)."""
    return write_rollouts(step_file(folder, step), rollouts)


def write_rollouts(path: Path, rollouts: Sequence[SavedRollout]) -> Path:
    """Write a file of saved rollouts (gzip'd JSON lines) atomically: a temporary file renamed into place."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    with gzip.open(tmp, "wt", encoding="utf-8", compresslevel=6) as handle:
        for rollout in rollouts:
            handle.write(dumps_line(rollout.to_dict()) + "\n")
    os.replace(tmp, path)
    return path


def _per_token(record: Any, name: str, n: int) -> list[float] | None:
    """A TokenRecord's per-token list `name` (entropy, phi), when it has one."""
    values = getattr(record, name, None) if record is not None else None
    return _rounded(values[:n]) if values else None


def _rounded(values: Sequence[float]) -> list[float]:
    return [round(float(v), 5) for v in values]


# ---- held-out evaluation samples: <run>/heldout/<point>.jsonl.gz, read by the viewer's across-training view ----
HELDOUT_DIR = "heldout"
# a point: "base", "sft", an RL run's key ("rl", "rl-grpo-ds") after its last step, or "<key>-step-NNNNNN" for
# an evaluation during RL (eval.every) after NNNNNN steps
_IN_TRAINING = re.compile(r"^(rl(?:-.+?)?)-step-(\d{6})$")


def heldout_file(folder: str | Path, point: str) -> Path:
    """The file of one evaluation point's held-out samples in a run folder."""
    if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9_.-]*", point):
        raise ValueError(f"held-out point {point!r}: letters, digits, '_', '.', '-' only")
    return Path(folder) / HELDOUT_DIR / f"{point}.jsonl.gz"


def heldout_points(folder: str | Path) -> list[str]:
    """The evaluation points with held-out samples in a run folder, in training order: base, sft, then each RL
    run (rl first) with its evaluations during training by step and its last."""
    directory = Path(folder) / HELDOUT_DIR
    names = (
        [p.name.removesuffix(".jsonl.gz") for p in directory.glob("*.jsonl.gz")] if directory.is_dir() else []
    )
    return sorted(names, key=heldout_order)


def heldout_stage(point: str) -> tuple[str, int | None]:
    """(RL key or "base"/"sft", steps done) of a point: ("rl-grpo-ds", 10) for "rl-grpo-ds-step-000010",
    ("rl", None) for "rl" (after its last step)."""
    found = _IN_TRAINING.match(point)
    return (found.group(1), int(found.group(2))) if found else (point, None)


def heldout_order(point: str) -> tuple[int, str, int]:
    """The sort key of a point: (stage, RL key, step), a run's last evaluation after those during it."""
    if point in ("base", "sft"):
        return (0 if point == "base" else 1, "", 0)
    key, step = heldout_stage(point)
    return (2 if key == "rl" else 3, key, (1 << 62) if step is None else step)


def write_heldout(
    folder: str | Path, point: str, trajectories: Sequence[Trajectory], tokenizer_dir: str | Path | None
) -> Path:
    """Save one evaluation point's held-out samples (status "evaluated", or "failed") with their token texts
    and prompts, so that the viewer shows them without a tokenizer; a repeated point (resume) is rewritten."""
    log = RolloutLog(folder, tokenizer_dir=tokenizer_dir)
    saved = [
        SavedRollout(
            step=t.weight_version,
            trajectory=t,
            status="failed" if t.failed else "evaluated",
            tokens=token_texts(log.tokenizer, t.response_ids) if log.tokenizer else [],
            prompt_text=log._decode(t.prompt_ids),
        )
        for t in trajectories
    ]
    return write_rollouts(heldout_file(folder, point), saved)
