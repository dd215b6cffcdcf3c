"""The suite's file order (tests/file_order.py): longest files first, each file whole, the figures written by a run."""

from __future__ import annotations

import json
import os
import textwrap
from pathlib import Path

import pytest
from file_order import FILE_SECONDS_PATH, file_of, load_file_seconds, longest_first, per_file

pytest_plugins = ["pytester"]


class Item:  # what longest_first reads of a pytest.Item
    def __init__(self, nodeid: str) -> None:
        self.nodeid = nodeid

    def __repr__(self) -> str:
        return self.nodeid


def ids(items) -> list[str]:
    return [item.nodeid for item in items]


def test_files_go_longest_first_each_whole_and_in_its_own_order():
    items = [Item(n) for n in ("a.py::t1", "b.py::t1", "a.py::t2", "c.py::t1", "b.py::t2", "d.py::t[x]")]
    ordered = longest_first(items, {"a.py": 1.0, "b.py": 30.0, "c.py": 5.0, "d.py": 5.0})
    assert ids(ordered) == ["b.py::t1", "b.py::t2", "c.py::t1", "d.py::t[x]", "a.py::t1", "a.py::t2"]
    assert sorted(ids(ordered)) == sorted(ids(items))  # nothing lost, nothing doubled


def test_a_file_without_a_figure_is_placed_as_the_median_file():
    items = [Item(f"{name}.py::t") for name in ("new", "slow", "mid", "fast")]
    ordered = longest_first(items, {"slow.py": 100.0, "mid.py": 10.0, "fast.py": 1.0})
    assert ids(ordered) == ["slow.py::t", "new.py::t", "mid.py::t", "fast.py::t"]
    assert ids(longest_first(items, {})) == ids(items)  # no figures: the collection's order


def test_the_figures_per_file_count_tests_and_module_fixtures_not_session_ones():
    costs = [
        ("tests/a/test_x.py::test_one", 2.0),
        ("tests/a/test_x.py::test_two[p]", 3.5),
        ("fixture engine (module tests/a/test_x.py) on gw1", 10.0),
        ("fixture tiny_model (session session) on gw0", 50.0),
        ("fixture run (class tests/b/test_y.py::TestRun)", 4.0),
        ("tests/b/test_y.py::TestRun::test_z", 1.0),
    ]
    assert per_file(costs) == {"tests/a/test_x.py": 15.5, "tests/b/test_y.py": 5.0}
    assert file_of("tests/b/test_y.py::TestRun::test_z") == "tests/b/test_y.py"


@pytest.mark.parametrize(
    "text", ["{not json", "[1, 2]", '{"tests/a.py": "slow"}', '{"tests/a.py": true}', '{"tests/a.py": NaN}']
)
def test_a_broken_figures_file_is_named_not_ignored(tmp_path: Path, text: str):
    path = tmp_path / "file_seconds.json"
    path.write_text(text)
    with pytest.raises(pytest.UsageError, match=r"file_seconds\.json"):
        load_file_seconds(path)
    assert load_file_seconds(tmp_path / "absent.json") == {}


def test_the_committed_figures_name_only_files_that_exist():
    figures = load_file_seconds(FILE_SECONDS_PATH)
    root = FILE_SECONDS_PATH.parent.parent
    assert figures, "tests/file_seconds.json is missing or empty"
    missing = [name for name in figures if not (root / name).is_file()]
    assert not missing, f"tests/file_seconds.json names files that are gone: {missing} (write it again)"


def test_a_session_writes_the_figures_and_the_next_one_reads_them(pytester: pytest.Pytester, monkeypatch):
    """End to end through the cost ratchet's controller: one session writes its files' wall seconds where
    STARE_TEST_FILE_SECONDS says, and a session ordered by them runs the slow file first."""
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(Path(__file__).parent), str(pytester.path)]))
    pytester.makeconftest(
        textwrap.dedent(
            """
            from cost_ratchet import CostRatchet
            from file_order import load_file_seconds, longest_first
            from pathlib import Path
            ORDER = []

            def pytest_configure(config):
                config.pluginmanager.register(CostRatchet(), "cost_ratchet")

            def pytest_collection_modifyitems(items):
                items[:] = longest_first(items, load_file_seconds(Path("figures.json")))

            def pytest_runtest_call(item):
                ORDER.append(item.nodeid)

            def pytest_sessionfinish(session):
                Path("order.txt").write_text("\\n".join(ORDER))
            """
        )
    )
    pytester.makepyfile(
        test_fast="def test_f(): pass",
        test_slow="import time\ndef test_s(): time.sleep(0.3)",
    )
    out = pytester.path / "written.json"
    monkeypatch.setenv("STARE_TEST_FILE_SECONDS", str(out))
    assert pytester.runpytest_subprocess("-p", "no:cacheprovider").ret == 0
    figures = json.loads(out.read_text())
    assert (
        set(figures) == {"test_fast.py", "test_slow.py"}
        and figures["test_slow.py"] >= 0.3 > figures["test_fast.py"]
    )
    (pytester.path / "order.txt").unlink()
    out.rename(pytester.path / "figures.json")
    assert pytester.runpytest_subprocess("-p", "no:cacheprovider").ret == 0
    assert (pytester.path / "order.txt").read_text().splitlines() == [
        "test_slow.py::test_s",
        "test_fast.py::test_f",
    ]
