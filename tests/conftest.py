"""Settings for the whole test suite.

- Telemetry off for every process a test starts (LMCache, vLLM), as the project promises.
- kvchaos state (journals, detached stacks) goes to a per-session temporary folder, so tests
  never touch a user's ~/.local/state/kvchaos and leave nothing behind.
- The real Toxiproxy: ``KVCHAOS_TOXIPROXY_BIN`` when set, else ``toxiproxy-server`` on PATH, else
  the build kept beside the checkout in ``../shared/tools/toxiproxy/`` (the Makefile's default
  too); tests that need it are skipped only when none is there.
- Signal handlers (SIGINT, SIGTERM, SIGHUP) come back after every test: a CLI command run in
  this process (``kvchaos run`` ends with ``interrupts.exit_on_signal()``) must not change how
  the next test, or pytest itself, reacts to a signal.
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


def pytest_configure(config):
    import tempfile

    if not os.environ.get("KVCHAOS_STATE_DIR"):
        os.environ["KVCHAOS_STATE_DIR"] = tempfile.mkdtemp(prefix="kvchaos-test-state-")


@pytest.fixture(autouse=True)
def _restore_signal_handlers():
    """Put SIGINT/SIGTERM/SIGHUP's handlers back as they were before the test."""
    sigs = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
    before = {s: signal.getsignal(s) for s in sigs}
    yield
    for s, handler in before.items():
        if signal.getsignal(s) is not handler and handler is not None:
            signal.signal(s, handler)
