"""Process environment every service of a kvchaos stack gets.

LMCache's usage telemetry is on by default and calls a public host; vLLM has its own usage
stats. kvchaos turns both off for every process it starts, in tests too. Variable names from
LMCache 0.5.6 (``lmcache/usage_context.py``: ``LMCACHE_TRACK_USAGE``, ``DO_NOT_TRACK``;
``LMCACHE_DISABLE_BANNER`` from its CLI banner) and vLLM (``VLLM_NO_USAGE_STATS``).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping
from pathlib import Path

#: Set for every service process; a service's own ``environment`` cannot turn telemetry back on.
TELEMETRY_OFF: dict[str, str] = {
    "LMCACHE_TRACK_USAGE": "false",
    "DO_NOT_TRACK": "1",
    "LMCACHE_DISABLE_BANNER": "1",
    "VLLM_NO_USAGE_STATS": "1",
}


def apply_to_current_process() -> None:
    """Set :data:`TELEMETRY_OFF` in ``os.environ`` (for code that imports lmcache in-process)."""
    os.environ.update(TELEMETRY_OFF)


def service_environment(extra: Mapping[str, str] | None = None,
                        base: Mapping[str, str] | None = None) -> dict[str, str]:
    """Build the environment of one service process.

    Args:
        extra: the service's own variables (from the stack file), applied over ``base``.
        base: the starting environment; ``os.environ`` when None.

    Returns:
        A new dict: ``base`` + ``extra`` + :data:`TELEMETRY_OFF` (always last, so it wins), with
        the directory of the running Python interpreter first on ``PATH`` so that ``python``,
        ``kvchaos`` and ``lmcache`` in a service command resolve to this virtual environment.
    """
    env = dict(os.environ if base is None else base)
    env.update(extra or {})
    bindir = str(Path(sys.executable).parent)
    path = env.get("PATH", "")
    if path.split(os.pathsep)[0] != bindir:
        env["PATH"] = bindir + (os.pathsep + path if path else "")
    env.setdefault("PYTHONUNBUFFERED", "1")
    env.update(TELEMETRY_OFF)
    return env
