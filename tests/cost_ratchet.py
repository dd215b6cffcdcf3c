"""The test-cost ratchet: no test costs more than `LIMIT_S` seconds of CPU, except the tests in `ALLOWED`, a list
that may shrink, never grow (`tests/test_cost_ratchet.py` pins its length).

Headroom: the limits are what a test may cost on the reference machine (2 cores, the engineers' and CI's kind),
and the session fails only beyond `SLACK` times its limit (90 s for an unlisted test), so that a slower or busier
CI machine does not fail a test for the machine; a test between its limit and that is named in a warning section
of the summary (make it cheaper before it grows).

What a test costs: the CPU time (user + system) of the pytest process and of every process it started, directly
or not, alive or ended, over the test's setup, call and teardown -- less the setup and teardown of the fixtures
that several tests share (class, module, package or session scope: an engine, a Ray cluster, a prepared model).
Each instance of those is measured on its own, as `fixture <name> (<scope> <module or session>)`, and held to the
same limit, so a test does not pay for an engine only because it happened to run first.

Why CPU time and not wall time: CI and the engineers' machines are shared with long training runs, and on two
cores a test's wall time grows with the load around it (measured: 3-9x under a load average of 15), while the
CPU it uses stays put; a wall-clock limit would fail the suite for the neighbours' work. The cost of the choice:
time a test spends waiting (sleep, a Docker container's own processes, which are not the test's descendants)
is not counted, and a test that uses two cores for 40 s costs 80 s. `--durations=N` (CI passes 25) still prints
the wall-clock slowest; with it this plugin also prints the N costliest by CPU.

How descendants are counted: live processes are read from /proc (utime + stime of each, plus the cutime + cstime
of the ended children it reaped); ended children of the pytest process through os.times(). A process that ends
during a test moves its whole CPU time into its parent's children time, where it was counted before the test as a
live process, so the difference over the test holds only what was used during it. Processes that leave the tree
(orphans adopted by init) are lost, which can only make a test look cheaper.

Under pytest-xdist (scripts/test.sh runs two workers) each worker measures its own tests and fixtures and hands
its figures to the controller when it finishes (`workeroutput`); the controller holds them to the limits and prints
the report. A shared fixture is set up once per worker, so its figures are reported per worker
(`fixture tiny_model (session session) on gw1`).
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass

import pytest

LIMIT_S = 60.0
SLACK = 1.5  # the session fails beyond SLACK x a test's limit (see Headroom above)

# node id (or fixture name as reported) -> its limit in CPU seconds: what it measured on the reference machine
# (rounded up; SLACK applies on top); each entry says why it cannot be cheaper yet. Remove an entry when its test
# gets under LIMIT_S, lower one when its test gets cheaper; never add one or raise one.
ALLOWED: dict[str, float] = {
    # SmolLM2-135M's SFT stage as the default recipe runs it but with 24 solver traces (two a kind; the recipe has
    # 36), 2 epochs, and two `stare-agents eval` processes with their vLLM engines: the one test that shows
    # training changes accuracy. Measured 216 s of CPU with 16 tasks (307 s wall at load average 4; issue 46);
    # 8 tasks: 119 s of CPU, 130 s wall alone; the two evaluations in the test's process (no interpreter and vLLM
    # import each): 100 s of CPU beside a training run. Of that, SFT is ~60 s (six optimiser steps of SmolLM2 in
    # bf16 on one thread): cheaper needs a cheaper default SFT stage.
    "tests/eval/test_eval_trained.py::test_smollm2_before_and_after_training_side_by_side": 125.0,
}


@dataclass
class Cost:
    cpu_s: float
    wall_s: float


def _stat_fields(pid: int) -> list[bytes] | None:
    """The fields of /proc/PID/stat after the command name (field 3, the state, first); None if it is gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as handle:
            data = handle.read()
    except OSError:
        return None
    return data[data.rindex(b")") + 2 :].split()


class ProcessTree:
    """CPU seconds used so far by this process and all its descendants (see the module docstring)."""

    def __init__(self) -> None:
        self.root = os.getpid()
        self.tick = os.sysconf("SC_CLK_TCK")
        self.parents: dict[int, int] = {}  # pid -> parent pid, for every pid in /proc at the last look

    def cpu_seconds(self) -> float:
        own = os.times()
        total = own.user + own.system + own.children_user + own.children_system
        try:  # cheap test for "no child at all" (WNOWAIT: reaps nothing)
            os.waitid(os.P_ALL, 0, os.WEXITED | os.WNOHANG | os.WNOWAIT)
        except ChildProcessError:
            return total
        return total + sum(self._descendants().values()) / self.tick

    def _descendants(self) -> dict[int, int]:
        """Clock ticks (own + reaped children's) of every live descendant."""
        listed = {int(name) for name in os.listdir("/proc") if name.isdigit()}
        for pid in self.parents.keys() - listed:
            del self.parents[pid]
        for pid in listed - self.parents.keys():  # a parent never changes but by adoption, which we ignore
            fields = _stat_fields(pid)
            if fields is not None:
                self.parents[pid] = int(fields[1])
        children: dict[int, list[int]] = {}
        for pid, parent in self.parents.items():
            children.setdefault(parent, []).append(pid)
        ticks: dict[int, int] = {}
        todo = list(children.get(self.root, ()))
        while todo:
            pid = todo.pop()
            fields = _stat_fields(pid)
            if fields is None:
                continue
            ticks[pid] = sum(int(value) for value in fields[11:15])  # utime, stime, cutime, cstime
            todo.extend(children.get(pid, ()))
        return ticks


class CostRatchet:
    """The pytest plugin: measures each test and each shared fixture, fails the session on a cost over the limit."""

    def __init__(
        self, limit_s: float = LIMIT_S, allowed: dict[str, float] | None = None, slack: float = SLACK
    ) -> None:
        self.limit_s = limit_s
        self.slack = slack
        self.allowed = ALLOWED if allowed is None else allowed
        self.tree = ProcessTree()
        self.costs: dict[str, Cost] = {}
        self._shared = Cost(0.0, 0.0)  # shared fixtures' setup/teardown inside the running test
        self._nested: list[Cost] = []  # shared fixtures set up inside a shared fixture's setup
        self._teardown_started: dict[int, Cost] = {}

    def _now(self) -> Cost:
        return Cost(self.tree.cpu_seconds(), time.perf_counter())

    def _add(self, name: str, start: Cost, less: Cost | None = None) -> Cost:
        end = self._now()
        spent = Cost(end.cpu_s - start.cpu_s, end.wall_s - start.wall_s)
        own = Cost(spent.cpu_s - (less.cpu_s if less else 0.0), spent.wall_s - (less.wall_s if less else 0.0))
        before = self.costs.get(name, Cost(0.0, 0.0))
        self.costs[name] = Cost(before.cpu_s + max(0.0, own.cpu_s), before.wall_s + max(0.0, own.wall_s))
        return spent

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_protocol(self, item: pytest.Item, nextitem: pytest.Item | None):
        self._shared = Cost(0.0, 0.0)
        start = self._now()
        try:
            return (yield)
        finally:
            self._add(item.nodeid, start, less=self._shared)

    @pytest.hookimpl(wrapper=True)
    def pytest_fixture_setup(self, fixturedef: pytest.FixtureDef, request: pytest.FixtureRequest):
        if fixturedef.scope == "function":
            return (yield)
        start = self._now()
        self._nested.append(Cost(0.0, 0.0))
        try:
            return (yield)
        finally:
            nested = self._nested.pop()
            spent = self._add(fixture_name(fixturedef, request), start, less=nested)
            outer = self._nested[-1] if self._nested else self._shared
            outer.cpu_s += spent.cpu_s
            outer.wall_s += spent.wall_s
            # runs first when the fixture is finished (finalizers run last-in first-out), before its teardown
            fixturedef.addfinalizer(lambda: self._teardown_started.__setitem__(id(fixturedef), self._now()))

    def pytest_fixture_post_finalizer(
        self, fixturedef: pytest.FixtureDef, request: pytest.FixtureRequest
    ) -> None:
        start = self._teardown_started.pop(id(fixturedef), None)
        if start is not None:
            spent = self._add(fixture_name(fixturedef, request), start)
            self._shared.cpu_s += spent.cpu_s
            self._shared.wall_s += spent.wall_s

    def over(self, within_slack: bool = False) -> list[str]:
        """One line per test or fixture over `SLACK` x its limit (LIMIT_S, or its ceiling in the allowed list):
        those fail the session; with `within_slack`, the ones over their limit but not over that."""
        lines = []
        for name, cost in self.costs.items():
            ceiling = self.allowed.get(name, self.limit_s)
            failing = cost.cpu_s > self.slack * ceiling
            if cost.cpu_s > ceiling and failing != within_slack:
                where = f"its ceiling in ALLOWED, {ceiling:g} s" if name in self.allowed else f"{ceiling:g} s"
                lines.append(f"{name}: {cost.cpu_s:.1f} s of CPU (wall {cost.wall_s:.1f} s) > {where}")
        return lines

    def below(self) -> list[str]:
        """The allowed tests that ran and cost less than the limit: they can leave the list."""
        return [
            f"{name}: {self.costs[name].cpu_s:.1f} s of CPU"
            for name in self.allowed
            if name in self.costs and self.costs[name].cpu_s <= self.limit_s
        ]

    @pytest.hookimpl(tryfirst=True)
    def pytest_sessionfinish(self, session: pytest.Session, exitstatus: int) -> None:
        workeroutput = getattr(session.config, "workeroutput", None)
        if workeroutput is not None:  # an xdist worker: the controller judges (pytest_testnodedown)
            workeroutput["cost_ratchet"] = {name: [c.cpu_s, c.wall_s] for name, c in self.costs.items()}
            return
        if self.over() and session.exitstatus == pytest.ExitCode.OK:
            session.exitstatus = pytest.ExitCode.TESTS_FAILED

    @pytest.hookimpl(optionalhook=True)
    def pytest_testnodedown(self, node, error) -> None:
        """xdist's controller: take a finished worker's figures (a fixture's under its worker's name)."""
        worker = node.gateway.id
        for name, (cpu_s, wall_s) in getattr(node, "workeroutput", {}).get("cost_ratchet", {}).items():
            key = f"{name} on {worker}" if name.startswith("fixture ") else name
            self.costs[key] = Cost(cpu_s, wall_s)

    def pytest_terminal_summary(self, terminalreporter, exitstatus: int, config: pytest.Config) -> None:
        write = terminalreporter.write_line
        count = config.option.durations
        if count is not None:
            ranked = sorted(self.costs.items(), key=lambda pair: -pair[1].cpu_s)
            total = sum(cost.cpu_s for cost in self.costs.values())
            title = (
                f"costliest {count or len(ranked)} by CPU (process tree; all {len(ranked)}: {total:.0f} s)"
            )
            terminalreporter.write_sep("=", title)
            for name, cost in ranked[: count or None]:
                write(f"{cost.cpu_s:8.2f}s cpu {cost.wall_s:8.2f}s wall  {name}")
        if self.below():
            terminalreporter.write_sep(
                "-", "allowed slow tests now under the limit (remove them from ALLOWED)"
            )
            for line in self.below():
                write(line)
        near = self.over(within_slack=True)
        if near:
            terminalreporter.write_sep(
                "-",
                f"over the test-cost limit, within the slack (x{self.slack:g}) that fails the session",
                yellow=True,
            )
            for line in near:
                write(line, yellow=True)
        over = self.over()
        if over:
            terminalreporter.write_sep(
                "=",
                f"over the test-cost limit ({self.limit_s:g} s of CPU, x{self.slack:g} slack; tests/cost_ratchet.py)",
                red=True,
            )
            for line in over:
                write(line, red=True)
            write(
                "Make the test cheaper (share the engine/model through a session fixture, fold runs together)."
            )


def fixture_name(fixturedef: pytest.FixtureDef, request: pytest.FixtureRequest) -> str:
    """The name a shared fixture's cost is reported under: one per instance (a module-scoped fixture of a
    conftest is set up once in each module that asks for it)."""
    return f"fixture {fixturedef.argname} ({fixturedef.scope} {request.node.nodeid or 'session'})"
