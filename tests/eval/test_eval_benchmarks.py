"""Benchmark resolution (names, files, field mapping), protocols and the paper's preset."""

from __future__ import annotations

import json
from pathlib import Path

import gymnasium as gym
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from support import shared_data

import stare_agents.envs  # noqa: F401  (registers the environment ids)
from stare_agents.eval import benchmarks as bm
from stare_agents.eval.benchmarks import (
    BENCHMARK_FILES,
    DATA_DIR_ENV,
    PRESETS,
    PROTOCOLS,
    benchmark_source,
    get_preset,
    get_protocol,
    load_benchmark,
    parse_fields,
    resolve_data_dir,
)


def write_jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(row) + "\n" for row in rows), encoding="utf-8")
    return path


ROWS = [
    {"id": "q0", "problem": "1+1?", "answer": "2"},
    {"id": "q1", "problem": "2+2?", "answer": "4"},
    {"id": "q2", "problem": "3+3?", "answer": "6"},
]


@pytest.fixture
def data_dir(tmp_path: Path) -> Path:
    folder = tmp_path / "bench"
    folder.mkdir()
    write_jsonl(folder / "aime24.jsonl", ROWS)
    return folder


def test_name_resolves_in_data_dir_argument_then_env_var(
    data_dir: Path, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.delenv(DATA_DIR_ENV, raising=False)
    bench = load_benchmark("aime24", data_dir=data_dir)
    assert bench.name == "aime24" and bench.source == str(data_dir / "aime24.jsonl")
    assert [t.id for t in bench.tasks] == ["q0", "q1", "q2"] and bench.tasks[1].answer == "4"
    monkeypatch.setenv(DATA_DIR_ENV, str(data_dir))
    assert len(load_benchmark("aime24", limit=2)) == 2
    # the argument wins over the environment variable
    other = tmp_path / "other"
    other.mkdir()
    write_jsonl(other / "aime24.jsonl", ROWS[:1])
    assert len(load_benchmark("aime24", data_dir=other)) == 1


def test_missing_data_folder_is_a_clear_error(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.delenv(DATA_DIR_ENV, raising=False)
    monkeypatch.setattr(bm, "default_data_dir", lambda: tmp_path / "nowhere")
    with pytest.raises(FileNotFoundError, match=r"--data-dir DIR .* STARE_DATA_DIR=DIR"):
        load_benchmark("math500")
    monkeypatch.setenv(DATA_DIR_ENV, str(tmp_path / "missing"))
    with pytest.raises(FileNotFoundError, match=r"from \$STARE_DATA_DIR\) is not a directory"):
        resolve_data_dir()
    (tmp_path / "empty").mkdir()
    with pytest.raises(FileNotFoundError, match=r"must hold minerva\.jsonl"):
        load_benchmark("minerva", data_dir=tmp_path / "empty")


def test_default_data_dir_is_next_to_the_repository() -> None:
    repo = Path(bm.__file__).resolve().parents[2]
    assert bm.default_data_dir() == repo.parent / "shared" / "data" / "benchmarks"


def test_the_six_paper_benchmarks_load_from_shared_data() -> None:
    folder = shared_data("benchmarks")
    sizes = {name: len(load_benchmark(name, data_dir=folder)) for name in BENCHMARK_FILES}
    assert sizes == {
        "aime24": 30,
        "aime25": 30,
        "amc23": 40,
        "math500": 500,
        "minerva": 272,
        "olympiadbench": 675,
    }


def test_files_with_field_mapping(tmp_path: Path) -> None:
    rows = [
        {"question": "What is 6*7?", "solution": 42, "uid": 10},
        {"question": "5-5?", "solution": 0, "uid": 11},
    ]
    parquet = tmp_path / "held_out.parquet"
    pq.write_table(pa.Table.from_pylist(rows), parquet)
    bench = load_benchmark(str(parquet), fields={"problem": "question", "answer": "solution", "id": "uid"})
    assert bench.name == "held_out"
    assert [(t.id, t.problem, t.answer) for t in bench.tasks] == [
        ("10", "What is 6*7?", "42"),
        ("11", "5-5?", "0"),
    ]
    # without an id column, ids are row numbers
    no_ids = write_jsonl(
        tmp_path / "plain.jsonl", [{"problem": "a", "answer": "1"}, {"problem": "b", "answer": "2"}]
    )
    assert [t.id for t in load_benchmark(str(no_ids)).tasks] == ["plain-0", "plain-1"]


def test_hugging_face_ids_are_recognised_without_loading() -> None:
    assert benchmark_source("HuggingFaceH4/MATH-500") == ("HuggingFaceH4/MATH-500", "HuggingFaceH4/MATH-500")


@pytest.mark.parametrize(
    ("rows", "match"),
    [
        ([], "has no problems"),
        ([ROWS[0], ROWS[0]], "appears at rows 0 and 1"),
        ([{"id": "a", "problem": "x", "answer": ""}], "no reference answer"),
        ([{"id": "a", "problem": "x"}], "no reference answer"),
        ([{"id": "a", "problem": "   ", "answer": "1"}], "has no text"),
        ([{"id": "a", "question": "x", "answer": "1"}], "no column 'problem'"),
    ],
)
def test_hostile_benchmark_files(tmp_path: Path, rows: list[dict], match: str) -> None:
    path = write_jsonl(tmp_path / "bad.jsonl", rows)
    with pytest.raises((ValueError, KeyError), match=match):
        load_benchmark(str(path))


def test_hostile_benchmark_specs(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="unknown benchmark 'aime2024'"):
        load_benchmark("aime2024")
    with pytest.raises(FileNotFoundError, match="does not exist"):
        load_benchmark(str(tmp_path / "missing.jsonl"))
    with pytest.raises(ValueError, match="a benchmark is a name"):
        load_benchmark("  ")
    with pytest.raises(ValueError, match="limit must be >= 1"):
        load_benchmark(str(write_jsonl(tmp_path / "ok.jsonl", ROWS)), limit=0)
    torn = tmp_path / "torn.jsonl"
    torn.write_text(json.dumps(ROWS[0]) + "\n{not json\n", encoding="utf-8")
    with pytest.raises(ValueError, match="not valid JSON"):
        load_benchmark(str(torn))


def test_parse_fields() -> None:
    assert parse_fields(None) is None
    assert parse_fields(["problem=question", " answer = solution "]) == {
        "problem": "question",
        "answer": "solution",
    }
    for bad in (["problem"], ["=x"], ["answer="], ["level=difficulty"]):
        with pytest.raises(ValueError, match="--field"):
            parse_fields(bad)


def test_protocol_settings() -> None:
    tir, cot, simple = PROTOCOLS["tir"], PROTOCOLS["cot"], PROTOCOLS["simpletir"]
    assert tir.env_id == "stare_agents/MathTIR-v0" and tir.make_env_kwargs() == {}
    assert cot.env_id == "stare_agents/MathCoT-v0" and cot.single_turn and cot.to_dict()["max_turns"] == 1
    assert (simple.max_turns, simple.temperature, simple.top_p) == (10, 1.0, 0.7)
    assert simple.make_env_kwargs() == {
        "observation_format": "code_execution_result",
        "max_obs_chars": 512,
        "stateless": True,
        "max_turns": 10,
    }
    changed = tir.override(temperature=0.6, top_p=0.95, max_turns=6, max_total_tokens=2048)
    assert (changed.temperature, changed.top_p, changed.max_turns, changed.max_total_tokens) == (
        0.6,
        0.95,
        6,
        2048,
    )
    assert tir.override() == tir
    assert cot.override(max_turns=1) == cot
    with pytest.raises(ValueError, match="single-turn"):
        cot.override(max_turns=3)
    for bad in ({"top_p": 0.0}, {"temperature": -1.0}, {"max_turns": 0}, {"max_tokens_per_turn": 0}):
        with pytest.raises(ValueError):
            tir.override(**bad)
    with pytest.raises(ValueError, match="exceeds max_total_tokens"):
        tir.override(max_tokens_per_turn=8192)
    with pytest.raises(ValueError, match="unknown protocol"):
        get_protocol("tool")


def test_the_arith_v1_protocol_is_the_default_jobs_evaluation() -> None:
    """`--protocol arith-v1` on exported held-out tasks scores a model as the default job's own held-out
    evaluation does: its environment, environment settings and token budgets, read from the recipe (so the two
    cannot drift apart)."""
    from stare_agents.train.config import load_config

    config = load_config(recipe="smollm2-arith")
    protocol = get_protocol("arith-v1")
    assert protocol.env_id == config.env.id
    assert dict(protocol.env_kwargs) == dict(config.env.kwargs)
    assert (protocol.max_tokens_per_turn, protocol.max_total_tokens) == (
        config.rollout.max_tokens_per_turn,
        config.rollout.max_total_tokens,
    )


def test_paper_preset() -> None:
    paper = get_preset("paper")
    assert PRESETS["paper"] is paper
    assert [paper.samples_for(n) for n in BENCHMARK_FILES] == [32, 32, 32, 4, 4, 4]
    assert paper.samples_for("my_file") == 4
    assert (paper.temperature, paper.top_p) == (1.0, 0.7)
    with pytest.raises(ValueError, match="unknown preset"):
        get_preset("simpletir")


def test_protocol_env_kwargs_take_effect_in_the_environment() -> None:
    """The simpletir kwargs build a MathTIR env with 10 turns, 512-character 'Code execution result:'
    observations and stateless calls (checked on a local sandbox: a variable set in one call is gone)."""
    from stare_agents.sandbox import make_sandbox

    protocol = PROTOCOLS["simpletir"]
    with make_sandbox("local", pool_size=1, allow_host_execution=True) as sandbox:
        # a generous tool time limit: this test checks formatting and statelessness, not speed under load
        env = gym.make(protocol.env_id, sandbox=sandbox, tool_timeout_s=60.0, **protocol.make_env_kwargs())
        try:
            env.reset(options={"problem": "p", "answer": "1", "id": "x"})
            assert env.unwrapped.max_turns == 10
            obs, *_ = env.step("```python\nx = 5\nprint('a' * 2000)\n```")
            assert obs[0]["inline"].startswith("\nCode execution result: ")
            assert len(obs[0]["content"]) <= 512
            obs, *_ = env.step("```python\nprint(x)\n```")
            assert "NameError" in obs[0]["content"]
        finally:
            env.close()
    cot = gym.make(PROTOCOLS["cot"].env_id, **PROTOCOLS["cot"].make_env_kwargs())
    assert cot.unwrapped.max_turns == 1
    cot.close()


def test_a_long_cot_model_is_scored_with_its_own_prompt_and_budget() -> None:
    """cot-long: MathCoT-v0's long-CoT prompt (not the short one) and 16,384 response tokens (not 4,096)."""
    short, long = PROTOCOLS["cot"], PROTOCOLS["cot-long"]
    assert long.single_turn and (long.max_tokens_per_turn, long.max_total_tokens) == (16384, 16384)
    assert (short.max_total_tokens, long.temperature, long.top_p) == (4096, 1.0, 1.0)
    prompts = {}
    for protocol in (short, long):
        env = gym.make(protocol.env_id, **protocol.make_env_kwargs())
        observation, _ = env.reset(options={"problem": "What is 2 + 2?", "answer": "4", "id": "x"})
        prompts[protocol.name] = observation[-1]["content"]
        env.close()
    assert "at length" in prompts["cot-long"] and "at length" not in prompts["cot"]
    assert "What is 2 + 2?" in prompts["cot-long"]
