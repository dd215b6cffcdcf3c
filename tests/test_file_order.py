"""The workers take the test files in the order of tests/file_order.py: the shared-Ray modules first, then the
others, each group longest first, whole files at a time."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest
from file_order import TABLE, file_seconds, longest_first, table_from_log

pytest_plugins = ["pytester"]


def test_longest_files_first_whole_files_together_in_collection_order_otherwise():
    ids = ["a.py::t1", "a.py::t2", "b.py::t1", "c.py::t1", "c.py::t2", "d.py::t1"]
    seconds = {"a.py": 1.0, "b.py": 30.0, "c.py": 1.0}  # d.py unlisted: 1 s, as a and c
    assert longest_first(ids, seconds) == [
        "b.py::t1",
        "a.py::t1",
        "a.py::t2",
        "c.py::t1",
        "c.py::t2",
        "d.py::t1",
    ]
    assert longest_first(ids, {}) == ids  # no table: the collection's order
    # the shared-Ray modules first, longest first among them, then the others
    ray = frozenset({"c.py", "d.py"})
    assert longest_first(ids, seconds | {"d.py": 2.0}, ray) == [
        "d.py::t1", "c.py::t1", "c.py::t2", "b.py::t1", "a.py::t1", "a.py::t2"
    ]  # fmt: skip


def test_the_table_is_read_from_a_durations_log():
    log = textwrap.dedent(
        """\
        ============================= slowest durations =============================
        12.50s call     tests/a/test_x.py::test_one[param-with::colons]
        0.50s setup    tests/a/test_x.py::test_one[param-with::colons]
        3.00s call     tests/test_y.py::TestClass::test_two
        0.01s teardown tests/test_y.py::TestClass::test_two
        (1200 durations < 0.005s hidden.  Use -vv to show these durations.)
        """
    )
    assert table_from_log(log) == {"tests/a/test_x.py": 13.0, "tests/test_y.py": 3.0}


@pytest.mark.parametrize(
    "text",
    [
        "not json",
        "[1, 2]",
        '{"seconds": [1]}',
        '{"seconds": {"a.py": -1, "b.py": "x", "c.py": NaN, "d.py": Infinity, "e.py": true, "f.py": 2}}',
    ],
)
def test_a_broken_or_hostile_table_changes_the_order_only_where_it_is_sound(tmp_path, text):
    table = tmp_path / "file_seconds.json"
    table.write_text(text)
    assert file_seconds(table) == ({"f.py": 2.0} if "f.py" in text else {})
    assert file_seconds(tmp_path / "missing.json") == {}


def test_the_checked_in_table_names_files_that_exist():
    seconds = file_seconds()
    root = Path(__file__).parent.parent
    assert len(seconds) > 50 and sum(seconds.values()) > 300
    missing = [path for path in seconds if not (root / path).is_file()]
    assert not missing, f"{TABLE} lists files that are gone (refresh it, tests/file_order.py): {missing}"


def test_an_xdist_worker_runs_the_files_in_that_order(pytester):
    """The two hooks with a table of their own: one worker, so the order it runs in is the queue's. xdist alone
    would start with the file of most tests."""
    pytester.makepyfile(
        test_short="def test_s1(): pass\ndef test_s2(): pass\ndef test_s3(): pass\n",
        test_long="def test_l1(): pass\n",
        test_ray="def test_r1(): pass\n",
    )
    table = {"seconds": {"test_long.py": 60.0, "test_short.py": 1.0, "test_ray.py": 0.5}}
    (pytester.path / "table.json").write_text(json.dumps(table))
    pytester.makeconftest(
        f"""
        import sys
        from pathlib import Path
        sys.path.insert(0, {str(Path(__file__).parent)!r})
        import file_order

        def pytest_collection_modifyitems(items):
            seconds = file_order.file_seconds(Path(__file__).with_name("table.json"))
            order = file_order.longest_first([i.nodeid for i in items], seconds, frozenset({{"test_ray.py"}}))
            items.sort(key=lambda item: order.index(item.nodeid))

        def pytest_xdist_make_scheduler(config, log):
            return file_order.make_scheduler(config, log)
        """
    )
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "-n", "1", "--dist", "loadfile", "-v")
    result.assert_outcomes(passed=5)
    ran = [line.split()[-1] for line in result.outlines if " PASSED " in line]
    expected = ["test_ray.py", "test_long.py", *["test_short.py"] * 3]
    assert [name.split("::")[0] for name in ran] == expected, result.outlines
