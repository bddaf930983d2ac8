"""Settings for the whole test suite.

- Telemetry off for every process a test starts (LMCache, vLLM), as the project promises.
- kvchaos state (journals, detached stacks) goes to a per-session temporary folder, so tests
  never touch a user's ~/.local/state/kvchaos and leave nothing behind: at the session's end
  ``kvchaos cleanup`` undoes what runs killed by a test left there, and the folder is removed.
- The real Toxiproxy: ``KVCHAOS_TOXIPROXY_BIN`` when set, else ``toxiproxy-server`` on PATH, else
  the build kept beside the checkout in ``../shared/tools/toxiproxy/`` (the Makefile's default
  too); tests that need it are skipped only when none is there.
- Signal handlers (SIGINT, SIGTERM, SIGHUP) come back after every test: a CLI command run in
  this process (``kvchaos run`` ends with ``interrupts.exit_on_signal()``) must not change how
  the next test, or pytest itself, reacts to a signal.
- Under ``--dist loadfile`` (``make test``'s non-chaos stage) the test files are collected
  longest first, from the seconds per file in ``tests/file_durations.json`` (``make
  record-durations`` refreshes it; tests/file_durations.py), so no long file is handed to a
  worker last; xdist keeps that order with ``--no-loadscope-reorder`` (else it sorts files by
  their number of tests). Without the table the order is left as it is.
"""

from __future__ import annotations

import os
import signal

import pytest

from chaos.stack.environment import TELEMETRY_OFF

os.environ.update(TELEMETRY_OFF)


def _default_toxiproxy_bin() -> None:
    import shutil
    from pathlib import Path

    if os.environ.get("KVCHAOS_TOXIPROXY_BIN") or shutil.which("toxiproxy-server"):
        return
    repo = Path(__file__).resolve().parents[1]
    for up in (repo.parent, repo.parent.parent, Path("/work")):  # beside the checkout, or this machine's
        candidate = up / "shared" / "tools" / "toxiproxy" / "toxiproxy-server"
        if candidate.is_file() and os.access(candidate, os.X_OK):
            os.environ["KVCHAOS_TOXIPROXY_BIN"] = str(candidate)
            return


_default_toxiproxy_bin()


#: The state folder this session made (None when KVCHAOS_STATE_DIR was given, or in an xdist
#: worker, which inherits the controller's).
_STATE_DIR_MADE: str | None = None


def pytest_configure(config):
    import tempfile

    global _STATE_DIR_MADE
    if not os.environ.get("KVCHAOS_STATE_DIR"):
        os.environ["KVCHAOS_STATE_DIR"] = _STATE_DIR_MADE = tempfile.mkdtemp(prefix="kvchaos-test-state-")


def pytest_sessionfinish(session, exitstatus):
    """At the end of the session, in the process that made the state folder (the xdist
    controller, after every worker ended): ``kvchaos cleanup`` of that folder, then the folder
    is removed. A test that kills a kvchaos process at its timeout (SIGKILL: no teardown) leaves
    its stacks' journals there, where no later ``kvchaos cleanup`` of a user's state would look;
    what is undone is written to the terminal, so the test that left it can be found."""
    import shutil
    from pathlib import Path

    if _STATE_DIR_MADE is None or not Path(_STATE_DIR_MADE).is_dir():
        return
    from chaos.cleanup import cleanup

    report = cleanup(Path(_STATE_DIR_MADE) / "journal")
    say = session.config.pluginmanager.get_plugin("terminalreporter")
    lines = ([f"undone: {m}" for m in report.undone] + [f"cleanup error: {m}" for m in report.errors]
             + [f"left alone: {m}" for m in report.skipped])
    if lines and say is not None:
        say.write_sep("-", f"kvchaos cleanup of the test state folder {_STATE_DIR_MADE}")
        for line in lines:
            say.write_line(line)
    if not report.errors and not report.skipped:
        shutil.rmtree(_STATE_DIR_MADE, ignore_errors=True)


def _longest_files_first(config: pytest.Config) -> bool:
    """True under ``--dist loadfile``: asked on the xdist controller; a worker (whose own
    ``dist`` option xdist sets to "no") is told by the controller (pytest_configure_node)."""
    workerinput = getattr(config, "workerinput", None)
    if workerinput is not None:
        return bool(workerinput.get("kvchaos_longest_files_first"))
    return config.getoption("dist", "no") == "loadfile"


@pytest.hookimpl(optionalhook=True)
def pytest_configure_node(node) -> None:
    node.workerinput["kvchaos_longest_files_first"] = _longest_files_first(node.config)


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if not _longest_files_first(config):
        return
    from file_durations import file_of, load_table, order_by_duration

    table = load_table()
    if table is not None:
        items[:] = order_by_duration(items, table, key=lambda item: file_of(item.nodeid))


#: The session's reference pools that are open (one per process: the xdist worker's, or this one).
_REFERENCE_POOLS: list = []


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log):
    """Under ``--dist loadfile``: xdist's own scheduling, with the files of
    tests/file_durations.py REFERENCE_POOL_FILES one unit of work (placed where the first of
    them is in the collection: the longest first), see ``scope_of`` there; None otherwise
    (xdist's default)."""
    if config.getoption("dist", "no") != "loadfile":
        return None
    from xdist.scheduler import LoadFileScheduling

    from file_durations import scope_of

    class ReferencePoolFilesTogether(LoadFileScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return scope_of(nodeid)

    return ReferencePoolFilesTogether(config, log)


@pytest.fixture(scope="session")
def reference_pool(tmp_path_factory: pytest.TempPathFactory):
    """A chaos.runner.stacks.StackPool (local backend) shared by the tests of
    tests/file_durations.py REFERENCE_POOL_FILES (a file that uses it is listed there): acquire
    and release it as a suite does; never close it (the session does, and
    pytest_runtest_teardown brings its stacks down after the last test of a run of those
    files, so the stack never idles through other files' tests)."""
    from chaos.runner.stacks import StackPool

    pool = StackPool("local", tmp_path_factory.mktemp("reference-pool"))
    _REFERENCE_POOLS.append(pool)
    try:
        yield pool
    finally:
        _REFERENCE_POOLS.remove(pool)
        pool.close()


@pytest.hookimpl(wrapper=True)
def pytest_runtest_teardown(item: pytest.Item, nextitem: pytest.Item | None):
    """After a test (its fixtures torn down) whose next test is not in a file of
    tests/file_durations.py REFERENCE_POOL_FILES (or there is none): the reference pool's
    stacks are brought down, and what their teardown could not undo is raised (a teardown
    error of that test)."""
    result = yield
    if not _REFERENCE_POOLS:
        return result
    from file_durations import REFERENCE_POOL_FILES, file_of

    if nextitem is not None and file_of(nextitem.nodeid) in REFERENCE_POOL_FILES:
        return result
    for pool in _REFERENCE_POOLS:
        pool.keep_only(None)  # every stack down, the pool's state with it
        pool.raise_teardown_errors()
    return result


@pytest.fixture(autouse=True)
def _restore_signal_handlers():
    """Put SIGINT/SIGTERM/SIGHUP's handlers back as they were before the test."""
    sigs = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
    before = {s: signal.getsignal(s) for s in sigs}
    yield
    for s, handler in before.items():
        if signal.getsignal(s) is not handler and handler is not None:
            signal.signal(s, handler)
