"""Settings for the whole test suite.

- Telemetry off for every process a test starts (LMCache, vLLM), as the project promises.
- kvchaos state (journals, detached stacks) goes to a per-session temporary folder, so tests
  never touch a user's ~/.local/state/kvchaos and leave nothing behind.
"""

from __future__ import annotations

import os

from chaos.stack.environment import TELEMETRY_OFF

os.environ.update(TELEMETRY_OFF)


def pytest_configure(config):
    import tempfile

    if not os.environ.get("KVCHAOS_STATE_DIR"):
        os.environ["KVCHAOS_STATE_DIR"] = tempfile.mkdtemp(prefix="kvchaos-test-state-")
