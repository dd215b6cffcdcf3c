"""The completions table (issue 30, item 3): a step's prompts, completions, rewards and advantages in
TensorBoard's text plugin (read back with TensorBoard's own EventAccumulator and rendered with its own
Markdown sanitiser) and in W&B (a wandb.Table, offline), as TRL logs them; long texts capped, hostile text
shown literally."""

from __future__ import annotations

import html
import json
import re
import sys
import types
from pathlib import Path

import pytest

from stare_agents.completions_table import (
    COLUMNS,
    TAG,
    CompletionRow,
    completion_rows,
    log_completions,
    markdown_table,
)
from stare_agents.rollout_log import SavedRollout
from stare_agents.trajectory import Trajectory, TurnRecord

HOSTILE = '</td></tr><script>alert(1)</script><img src=x onerror="x()"> | *bold* `code` [a](javascript:x) \\'


def saved(
    index: int, reward: float, advantage, status: str, tokens: list[str], prompt: str = ""
) -> SavedRollout:
    n = len(tokens)
    t = Trajectory(
        prompt_ids=[1, 2],
        response_ids=list(range(n)),
        action_mask=[1] * n,
        rollout_logprobs=[-0.5] * n,
        reward=reward,
        num_turns=1,
        turns=[TurnRecord("".join(tokens), n, "eos")],
        task_id=f"task-{index}",
        group_id="g",
        sample_index=index,
    )
    return SavedRollout(
        step=3, trajectory=t, status=status, advantage=advantage, tokens=tokens, prompt_text=prompt
    )


@pytest.fixture
def rollouts() -> list[SavedRollout]:
    return [
        saved(0, 1.0, 0.5, "trained", ["The answer", " is\n", "\\boxed{7}"], prompt="What is 3+4?\nThink."),
        saved(1, 0.0, [-1.0, -0.5, 0.0], "trained", ["x"] * 3, prompt=HOSTILE),
        saved(2, 0.0, None, "dropped", ["y" * 5000], prompt="\u202eevil prompt"),
    ]


def test_rows_cap_long_texts_and_mark_invisible_characters(rollouts):
    rows = completion_rows(3, rollouts, max_chars=100)
    assert [r.step for r in rows] == [3, 3, 3]
    assert rows[0] == CompletionRow(
        3, "What is 3+4?\nThink.", "The answer is\n\\boxed{7}", 1.0, 0.5, "trained"
    )
    assert rows[1].prompt == HOSTILE and len(HOSTILE) < 100
    assert (
        completion_rows(3, rollouts, max_chars=10)[1].prompt
        == HOSTILE[:10] + f" … [{len(HOSTILE) - 10} more characters]"
    )
    assert rows[1].advantage == pytest.approx(-0.5)  # per-token: the mean over action tokens
    assert rows[2].completion == "y" * 100 + " … [4900 more characters]"
    assert rows[2].advantage is None and rows[2].status == "dropped"
    assert rows[2].prompt == "\u27e8U+202E\u27e9evil prompt"  # never rendered reversed
    assert len(completion_rows(3, rollouts, max_rows=2)) == 2


def cells(rendered: str) -> list[list[str]]:
    """The text of each cell of each body row of the HTML TensorBoard shows."""
    body = rendered.split("<tbody>", 1)[1]
    return [
        [html.unescape(re.sub(r"<br\s*/?>", "\n", cell)) for cell in re.findall(r"<td>(.*?)</td>", row, re.S)]
        for row in re.findall(r"<tr>(.*?)</tr>", body, re.S)
    ]


def test_tensorboard_text_plugin_reads_back_the_table_and_shows_every_cell_literally(
    rollouts, tmp_path: Path
):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    from tensorboard.plugin_util import markdown_to_safe_html
    from tensorboard.util import tensor_util
    from torch.utils.tensorboard import SummaryWriter

    writer = SummaryWriter(str(tmp_path))
    rows = log_completions(3, rollouts, writer=writer, max_chars=2000)
    log_completions(4, rollouts[:1], writer=writer)
    writer.close()
    events = EventAccumulator(str(tmp_path), size_guidance={"tensors": 0})
    events.Reload()
    tags = [tag for tag in events.Tags()["tensors"] if tag.startswith(TAG)]
    assert len(tags) == 1, events.Tags()
    logged = events.Tensors(tags[0])
    assert [e.step for e in logged] == [3, 4]
    assert events.summary_metadata[tags[0]].plugin_data.plugin_name == "text"
    markdown = tensor_util.make_ndarray(logged[0].tensor_proto).item().decode("utf-8")
    assert markdown == markdown_table(rows)
    rendered = markdown_to_safe_html(markdown)  # what TensorBoard's text dashboard puts in the page
    assert "<script" not in rendered and "<img" not in rendered and "<strong>" not in rendered
    header = re.findall(r"<th>(.*?)</th>", rendered)
    assert header == list(COLUMNS)
    shown = cells(rendered)
    assert len(shown) == 3 and all(len(row) == len(COLUMNS) for row in shown)
    for row, cell in zip(rows, shown, strict=True):
        assert cell[1] == row.prompt and cell[2] == row.completion, cell  # literally, line breaks kept
        assert float(cell[3]) == row.reward and cell[5] == row.status
        assert cell[4] == ("" if row.advantage is None else f"{row.advantage:.4g}")


def test_nothing_is_logged_for_a_step_without_rows(tmp_path: Path):
    class Writer:
        def add_text(self, *args):
            raise AssertionError("an empty table was logged")

    assert log_completions(0, [], writer=Writer(), wandb_run=Writer()) == []


def test_wandb_gets_a_table_of_the_trl_columns(rollouts, monkeypatch):
    """The call W&B receives (a stand-in wandb module: this runs without wandb installed)."""
    made = []

    class Table:
        def __init__(self, columns, data):
            self.columns, self.data = columns, data
            made.append(self)

    monkeypatch.setitem(sys.modules, "wandb", types.SimpleNamespace(Table=Table))
    logged = []
    run = types.SimpleNamespace(log=logged.append)
    rows = log_completions(3, rollouts, wandb_run=run)
    assert len(logged) == 1 and set(logged[0]) == {TAG, "rl/step"} and logged[0]["rl/step"] == 3
    table = logged[0][TAG]
    assert table is made[0] and table.columns == list(COLUMNS)
    assert table.data == [[r.step, r.prompt, r.completion, r.reward, r.advantage, r.status] for r in rows]


def test_wandb_offline_run_holds_the_table(rollouts, tmp_path: Path, monkeypatch):
    try:
        import wandb
    except ImportError:
        pytest.skip("wandb is not installed (optional: pip install wandb); the stand-in test covers the call")
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    run = wandb.init(project="stare-agents-test", dir=str(tmp_path), mode="offline")
    try:
        rows = log_completions(3, rollouts, wandb_run=run)
    finally:
        run.finish()
    files = list(tmp_path.rglob("*.table.json"))
    assert len(files) == 1, files
    table = json.loads(files[0].read_text())
    assert table["columns"] == list(COLUMNS)
    assert [row[2] for row in table["data"]] == [r.completion for r in rows]


def test_the_rollout_log_keeps_what_it_saved_and_the_learners_entropy(tmp_path: Path):
    """The trainer's hook: `RolloutLog.write` keeps its rows (`last_saved`) for `log_completions`, and saves
    the learner's per-token entropy when its TokenRecord has an `entropy` field (None when it has not)."""
    from stare_agents.rollout_log import RolloutLog, read_rollouts

    first, second = (saved(i, 1.0 - i, None, "trained", ["a", "b"]).trajectory for i in (0, 1))
    record = types.SimpleNamespace(
        learner_logprobs=[-0.1, -0.2], stare_weights=[1.0, 1.1], selection=[0, 1], entropy=[0.3, 0.4]
    )
    learner = types.SimpleNamespace(token_records={0: record}, gate_on=True)
    log = RolloutLog(tmp_path, tokenizer_dir=None)
    log.write(5, [first, second], [first], [0.5], learner.token_records, gate_on=learner.gate_on)
    back = read_rollouts(tmp_path, step=5)
    assert [s.learner_entropy for s in back] == [[0.3, 0.4], None]
    assert [s.status for s in log.last_saved] == ["trained", "dropped"]
    rows = log_completions(5, log.last_saved)
    assert [(r.reward, r.advantage, r.status) for r in rows] == [
        (1.0, 0.5, "trained"),
        (0.0, None, "dropped"),
    ]
    del record.entropy  # a learner that does not record entropies
    log.write(6, [first], [first], [0.5], learner.token_records, gate_on=learner.gate_on)
    assert read_rollouts(tmp_path, step=6)[0].learner_entropy is None
