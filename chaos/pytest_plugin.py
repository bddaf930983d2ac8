"""pytest plugin: scenario YAML files as test items (``pytest -m chaos``).

Follows pytest's documented pattern for non-Python tests ("Working with non-python tests":
``pytest_collect_file`` returning a ``pytest.File`` whose items implement ``runtest`` and
``repr_failure``), so each scenario gets a node id, ``-k`` selection, ``--junitxml`` and the
``chaos`` marker. The plugin is thin: items call the same runner as ``kvchaos run``.

- Scenario files are collected from ``--kvchaos-scenarios`` (default ``scenarios/``; the ini
  option ``kvchaos_scenarios`` too).
- Every scenario item is marked ``chaos`` and ``slow``, and ``network`` when one of its faults
  is on a proxied link. Unless the ``-m`` expression names
  ``chaos``, they are deselected: plain ``pytest`` never starts a stack.
- One stack per stack file per session, reset between scenarios, down at session end.
- pytest-xdist (``-n N``): each worker has its own stacks (the host-wide port claims keep them
  apart); scenario times reach the controller's summary on the reports; a SIGINT or SIGTERM sent
  to the controller alone is forwarded to the workers, which heal and report as above, and the
  controller waits for their stacks to go down before it exits 130 / 143.
- A failed check shows as its one-line explanation (request id, first differing token,
  expected vs actual), with the report path; no traceback.
- SIGINT and SIGTERM while scenarios run (chaos/interrupts.py), stack start-up included: the
  scenario under way heals, writes its report (verdict ``interrupted``), the session stops, the
  stacks go down (a second signal is held until they are), and pytest exits 130 / 143.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from chaos.yamlsource import ConfigError

_POOL_KEY = pytest.StashKey["object"]()
_TIMES_KEY = pytest.StashKey[list]()
_STOP_KEY = pytest.StashKey["object"]()
#: The user_properties key of a scenario's [name, seconds, verdict, [xfail outcome, upstream]].
_TIME_PROPERTY = "kvchaos_time"
#: Signals an xdist controller forwarded to its workers.
_FORWARDED_KEY = pytest.StashKey[list]()
#: The controller's signal handlers from before it forwarded signals.
_HANDLERS_KEY = pytest.StashKey[dict]()
#: The session's config (pytest_runtest_logreport is handed none).
_CONFIG: list[pytest.Config] = []


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("kvchaos", "kvchaos chaos scenarios")
    group.addoption("--kvchaos-scenarios", action="store", default=None,
                    help="file or folder of scenario YAML files (default: scenarios/, ini kvchaos_scenarios)")
    group.addoption("--kvchaos-backend", action="store", default=None,
                    help="local (default) or compose; env KVCHAOS_BACKEND")
    group.addoption("--kvchaos-proxy", action="store", default=None, choices=("bundled", "real"),
                    help="the stacks' fault proxy: bundled or real (Toxiproxy); env KVCHAOS_PROXY")
    group.addoption("--kvchaos-stack", action="store", default=None,
                    help="run every scenario on this stack file instead of its own")
    group.addoption("--kvchaos-report-dir", action="store", default="reports",
                    help="parent folder of run reports (default reports/)")
    parser.addini("kvchaos_scenarios", "file or folder of scenario YAML files", default="scenarios")


def _scenario_root(config: pytest.Config) -> Path:
    opt = config.getoption("--kvchaos-scenarios") or config.getini("kvchaos_scenarios")
    return (Path(config.rootpath) / opt).resolve()


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "chaos: a chaos scenario run against a real stack (pytest -m chaos)")
    config.addinivalue_line("markers", "slow: takes more than a few seconds or starts a real stack")
    config.addinivalue_line("markers", "network: a chaos scenario with a fault on a proxied link (a toxic): "
                            "`-m 'chaos and network'` selects what the real Toxiproxy must agree on")
    config.stash[_TIMES_KEY] = []
    _CONFIG.append(config)
    proxy = config.getoption("--kvchaos-proxy", None)
    if proxy:
        from chaos.proxy.real import use_proxy

        use_proxy(proxy)  # the stack variable KVCHAOS_PROXY of every stack the session starts


def pytest_collect_file(file_path: Path, parent: pytest.Collector):
    if file_path.suffix not in (".yaml", ".yml"):
        return None
    root = _scenario_root(parent.config)
    try:
        file_path.resolve().relative_to(root)
    except ValueError:
        if file_path.resolve() != root:
            return None
    from chaos.scenario.loader import is_stack_file

    if is_stack_file(file_path):  # a stack file kept next to its scenarios
        return None
    return ScenarioFile.from_parent(parent, path=file_path)


def _wants_chaos(config: pytest.Config) -> bool:
    expr = config.getoption("markexpr", "") or ""
    return "chaos" in expr and "not chaos" not in expr


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if _wants_chaos(config):
        _scenarios_in_discovery_order(items)
        return
    keep, drop = [], []
    for item in items:
        (drop if isinstance(item, ScenarioItem) else keep).append(item)
    if drop:
        config.hook.pytest_deselected(items=drop)
        items[:] = keep


def _scenarios_in_discovery_order(items: list[pytest.Item]) -> None:
    """Scenario items in ``kvchaos run``'s order (chaos.scenario.loader.discover_scenarios: a
    folder's own files before its sub-folders, so ``scenarios/findings/`` runs after the rest of
    the catalogue, not interleaved by name), in the slots scenario items held; other items stay."""
    slots = [i for i, item in enumerate(items) if isinstance(item, ScenarioItem)]
    ordered = sorted((items[i] for i in slots), key=lambda it: (len(Path(it.path).parts), str(it.path)))
    for i, item in zip(slots, ordered):
        items[i] = item


@pytest.hookimpl(hookwrapper=True)
def pytest_runtestloop(session: pytest.Session):
    """While scenario items run, SIGINT and SIGTERM become RunInterrupted (a KeyboardInterrupt,
    which stops the session) instead of killing pytest with the stacks up."""
    if _is_xdist_controller(session.config) and _wants_chaos(session.config):
        # Put back at the end of pytest_sessionfinish, once the workers' stacks are down.
        session.config.stash[_HANDLERS_KEY] = _forward_signals(session.config)
        yield
        return
    if not any(isinstance(i, ScenarioItem) for i in session.items):
        yield
        return
    from chaos import interrupts

    with interrupts.handling():
        yield


#: RunInterrupted that stopped a session (pytest_keyboard_interrupt has no config to stash on).
_STOPS: list = []


def pytest_keyboard_interrupt(excinfo) -> None:
    from chaos.interrupts import RunInterrupted

    if isinstance(excinfo.value, RunInterrupted):
        _STOPS.append(excinfo.value)


@pytest.hookimpl(wrapper=True)
def pytest_sessionfinish(session: pytest.Session, exitstatus):
    """The session's stacks go down before any other plugin ends the session, and a session a
    signal stopped exits 128 + the signal (130 SIGINT, 143 SIGTERM).

    Under pytest-xdist a worker reports itself finished from its own sessionfinish, and the
    controller ends every worker process (SIGKILL after 10 s) once they have: stacks left for the
    config's clean-up could die with their worker, unhealed. The controller, stopped by a signal
    it forwarded (see pytest_runtestloop), first waits for every worker's stacks to go down."""
    config = session.config
    pool = config.stash.get(_POOL_KEY, None)
    if pool is not None:
        pool.close()
    forwarded = config.stash.get(_FORWARDED_KEY, None)
    if forwarded:
        _wait_for_workers_stacks()
    try:
        return (yield)
    finally:
        import signal

        for sig, handler in config.stash.get(_HANDLERS_KEY, {}).items():
            signal.signal(sig, handler)
        stop = config.stash.get(_STOP_KEY, None) or (_STOPS[-1] if _STOPS else None)
        if stop is not None:
            session.exitstatus = stop.exit_code
            _STOPS.clear()
        elif forwarded:
            session.exitstatus = 128 + forwarded[0]


def _is_xdist_controller(config: pytest.Config) -> bool:
    """True in the controller of a pytest-xdist session (``-n N``), which runs no item itself."""
    return not hasattr(config, "workerinput") and config.pluginmanager.has_plugin("dsession")


def _forward_signals(config: pytest.Config):
    """Signal handlers for an xdist controller: SIGINT and SIGTERM are recorded and sent on to
    every worker (a ``kill`` reaches the controller alone), whose own handling (chaos/interrupts.py)
    heals, reports and brings its stacks down; the controller does not stop itself, xdist stops
    the session once the workers report that they were interrupted. Returns the handlers to put
    back."""
    import signal

    import psutil

    def forward(signum, _frame):
        config.stash.setdefault(_FORWARDED_KEY, []).append(signum)
        for worker in psutil.Process().children(recursive=False):
            try:
                worker.send_signal(signum)
            except psutil.Error:
                pass

    return {sig: signal.signal(sig, forward) for sig in (signal.SIGINT, signal.SIGTERM)}


def _wait_for_workers_stacks(timeout_s: float = 180.0) -> None:
    """Waits until no xdist worker of this controller has a child process left (a local stack's
    services are the worker's children until its pool brought them down), at most ``timeout_s``."""
    import psutil

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            busy = [w for w in psutil.Process().children(recursive=False) if w.children(recursive=False)]
        except psutil.Error:
            busy = []
        if not busy:
            return
        time.sleep(0.2)


@pytest.hookimpl(trylast=True)
def pytest_unconfigure(config: pytest.Config) -> None:
    if config in _CONFIG:
        _CONFIG.remove(config)


class ScenarioFile(pytest.File):
    """A scenario YAML file: one item."""

    def collect(self):
        from chaos.runner.suite import load_and_validate

        stack = self.config.getoption("--kvchaos-stack")
        try:
            scenario = load_and_validate([self.path], Path(stack) if stack else None)[0]
        except ConfigError as exc:
            needs = _needs_elsewhere(self.path, Path(stack)) if stack else None
            if not needs:
                raise self.CollectError(str(exc)) from None
            # Valid on its own stack, but --kvchaos-stack lacks what it needs: skipped, not an
            # error, so that the rest of the catalogue runs there.
            scenario = load_and_validate([self.path])[0]
            item = ScenarioItem.from_parent(self, name=scenario.name, scenario=scenario)
            item.add_marker(pytest.mark.chaos)
            item.add_marker(pytest.mark.skip(reason=f"{stack} lacks what it needs: " + "; ".join(needs)))
            yield item
            return
        item = ScenarioItem.from_parent(self, name=scenario.name, scenario=scenario)
        item.add_marker(pytest.mark.chaos)
        item.add_marker(pytest.mark.slow)
        if any(getattr(fault, "link", None) for phase in scenario.phases for fault in phase.faults):
            item.add_marker(pytest.mark.network)
        xfail = scenario.expected_failure  # None where xfail.stacks leaves this stack out
        if xfail is not None:
            # Only a failed check is the known bug: a run that could not run (ScenarioError) fails,
            # and one that did not reach its window is skipped (runtest), never shown as XFAIL.
            item.add_marker(pytest.mark.xfail(reason=f"{xfail.reason} ({xfail.upstream or ''})",
                                              strict=False, raises=ScenarioFailure))
        yield item


def _needs_elsewhere(path: Path, stack: Path) -> list[str] | None:
    """What the scenario at ``path``, valid on its own stack, needs that ``stack`` lacks (None:
    it is invalid on its own stack too, or ``stack`` is not the problem)."""
    from chaos.runner.suite import load_and_validate
    from chaos.scenario.cli import runnable_on
    from chaos.stack.spec import load_stack

    try:
        scenario = load_and_validate([path])[0]
        spec = load_stack(stack, allocate_ports=False, require_commands=False)
    except ConfigError:
        return None
    return runnable_on(scenario, spec) or None


class ScenarioFailure(Exception):
    """A scenario whose checks failed or were inconclusive."""


class ScenarioError(Exception):
    """A scenario that could not run (an infrastructure error: never an expected failure)."""


class UnexpectedFailure(Exception):
    """A scenario under xfail whose failed checks go beyond the ones its known bug fails
    (``xfail.checks``), or whose leaks go beyond the fields it leaves held (``xfail.leaks``):
    never an expected failure."""


class ScenarioItem(pytest.Item):
    """One scenario run."""

    def __init__(self, *, scenario, **kwargs) -> None:
        super().__init__(**kwargs)
        self.scenario = scenario

    def _pool(self):
        config = self.config
        pool = config.stash.get(_POOL_KEY, None)
        if pool is None:
            import os

            from chaos.runner.stacks import StackPool
            from chaos.stack.base import new_run_id

            backend = config.getoption("--kvchaos-backend") or os.environ.get("KVCHAOS_BACKEND") or "local"
            report_dir = Path(config.getoption("--kvchaos-report-dir"))
            pool = StackPool(backend, report_dir / new_run_id("pytest-stacks"))
            config.stash[_POOL_KEY] = pool
            config.add_cleanup(pool.close)
        return pool

    def runtest(self) -> None:
        from chaos.diagnose.hook import diagnose_after_checks
        from chaos.runner.run import run_scenario
        from chaos.runner.suite import infra_error_result
        from chaos.stack.base import StackError, new_run_id

        report_dir = Path(self.config.getoption("--kvchaos-report-dir"))
        run_id = new_run_id(self.scenario.name)
        run_dir = report_dir / run_id
        t0 = time.monotonic()
        try:
            try:
                stack = self._pool().acquire(Path(self.scenario.stack), self.scenario.stack_variables())
            except (StackError, ConfigError) as exc:
                result = infra_error_result(self.scenario, run_id, run_dir, f"stack: {exc}")
            else:
                result = run_scenario(self.scenario, stack, run_dir, run_id=run_id, timeout_s=600,
                                      after_checks=diagnose_after_checks)
                self._pool().release(Path(self.scenario.stack), result)
        except KeyboardInterrupt as exc:  # SIGINT / SIGTERM: this item's report, then stop the session
            from chaos import interrupts
            from chaos.runner.suite import interrupted_result

            stop = interrupts.as_interrupt(exc)
            if stop.result is None:
                stop.result = interrupted_result(self.scenario, run_id, run_dir, stop)
            self.config.stash[_STOP_KEY] = stop
            raise stop from None
        elapsed = time.monotonic() - t0
        xfail = result.xfail
        # The time travels on the test report (user_properties), not in this process: under
        # pytest-xdist the item runs in a worker and the summary is written by the controller.
        self.user_properties.append((_TIME_PROPERTY, [
            self.scenario.name, elapsed, result.verdict,
            [xfail.outcome, xfail.upstream or ""] if xfail is not None else None]))
        self.user_properties.append(("report", str(run_dir / "report.html")))
        if result.error:
            raise ScenarioError(f"could not run: {result.error.splitlines()[0]}\nreport: {run_dir}/report.html")
        if xfail is not None and result.verdict == "unknown" and xfail.outcome is None:
            # A known-bug scenario that did not reach its failure window says nothing about the
            # bug: an unknown, not an XFAIL (which would claim the bug was reproduced).
            why = "; ".join(f"{c.name}: {c.summary}" for c in result.checks if c.verdict == "unknown")
            pytest.skip(f"inconclusive, the known bug was not reached: {why} (report: {run_dir}/report.html)")
        from chaos.report.model import UNPROVEN

        if result.verdict == UNPROVEN:
            # The author said nothing proves a window (`trigger: none`): never a plain pass.
            why = "; ".join(c.summary for c in result.checks if c.name == "evidence")
            pytest.skip(f"{UNPROVEN}: {why} (report: {run_dir}/report.html)")
        if result.verdict != "passed":
            lines = [f"{c.name} {c.verdict}: {c.summary}" for c in result.checks if c.verdict != "passed"]
            lines.append(f"report: {run_dir}/report.html")
            if xfail is not None and xfail.unexpected:  # not the known bug's checks: a failure
                known = ", ".join([*(xfail.checks or ()), *(f"leaks of {f}" for f in xfail.leaks or ())])
                raise UnexpectedFailure("\n".join([f"failed beyond the known bug's ({known}): "
                                                f"{', '.join(xfail.unexpected)}", *lines]))
            raise ScenarioFailure("\n".join(lines))

    def repr_failure(self, excinfo, style=None):
        if isinstance(excinfo.value, (ScenarioFailure, ScenarioError, UnexpectedFailure)):
            return str(excinfo.value)
        return super().repr_failure(excinfo, style=style)

    def reportinfo(self):
        return self.path, 0, f"scenario: {self.name}"


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    """Collects each scenario's time from its call report (in this process, or sent by an
    xdist worker) for the summary."""
    if report.when != "call":
        return
    for key, value in report.user_properties:
        if key == _TIME_PROPERTY and _CONFIG:
            _CONFIG[-1].stash[_TIMES_KEY].append(tuple(value))


def pytest_terminal_summary(terminalreporter, exitstatus, config: pytest.Config) -> None:
    times = config.stash.get(_TIMES_KEY, [])
    if not times:
        return
    terminalreporter.section("kvchaos scenario times")
    for name, seconds, verdict, _ in times:
        terminalreporter.write_line(f"{seconds:7.1f}s  {verdict:8s}  {name}")
    terminalreporter.write_line(f"{sum(t[1] for t in times):7.1f}s  total")
    known = [(name, xf) for name, _, _, xf in times if xf is not None]
    if known:
        # Known upstream bugs (xfail): an XPASS means the bug no longer shows (fixed upstream,
        # or the scenario stopped reaching it); `kvchaos findings` lists them all.
        terminalreporter.section("kvchaos known upstream bugs")
        for name, (outcome, upstream) in known:
            word = {"xfailed": "XFAIL", "xpassed": "XPASS"}.get(outcome or "", "inconclusive")
            terminalreporter.write_line(f"{word:12s}  {name}  ({upstream or 'upstream not set'})")
