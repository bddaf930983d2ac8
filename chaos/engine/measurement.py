"""Branch coverage of a running engine process, for ``kvchaos coverage`` (chaos/coverage.py).

    kvchaos coverage / zoo --coverage           engine process (``kvchaos engine serve``)
      writes DIR/coveragerc, sets the stack ──>  KVCHAOS_ENGINE_COVERAGE=DIR/coveragerc
      variable KVCHAOS_ENGINE_COVERAGE            └─ coverage.process_startup() (coverage.py's
      writes DIR/context = "<row>/<scenario>"        subprocess support, COVERAGE_PROCESS_START)
      before each scenario, "idle" after        every SAVE_INTERVAL_S: context changed ->
                                                 switch_context(); save() (a SIGKILLed engine
                                                 loses at most that much)

The stack file passes the variable to the engine service only (its recompute twin runs the
same code and must not be measured). Without the variable nothing here runs.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from pathlib import Path

log = logging.getLogger("kvchaos.engine.measurement")

#: The stack variable (and engine environment variable) naming the coverage.py config file.
COVERAGE_ENV = "KVCHAOS_ENGINE_COVERAGE"
#: File next to the config whose text is the dynamic context to record under.
CONTEXT_FILE = "context"
#: Seconds between saves of the collected data (and polls of the context file).
SAVE_INTERVAL_S = 1.0


def read_context(rc_file: Path) -> str:
    """The context the coverage run asks for now (``idle`` when the file is missing/empty)."""
    try:
        return (rc_file.parent / CONTEXT_FILE).read_text().strip() or "idle"
    except OSError:
        return "idle"


def start_coverage_from_environment(interval_s: float = SAVE_INTERVAL_S) -> object | None:
    """Start coverage.py in this process when ``KVCHAOS_ENGINE_COVERAGE`` names a config file.

    Uses coverage.py's own subprocess start-up (``COVERAGE_PROCESS_START`` +
    ``coverage.process_startup()``), then a daemon thread that switches the dynamic context
    to the text of ``context`` beside the config file and saves the data every
    ``interval_s`` seconds.

    Args:
        interval_s: seconds between context polls and saves.

    Returns:
        the started ``coverage.Coverage``, or None (variable unset or empty, or coverage already
        started in this process).

    Raises:
        ImportError: the variable is set but coverage.py is not installed.
    """
    rc = os.environ.get(COVERAGE_ENV, "")
    if not rc:
        return None
    import coverage

    os.environ["COVERAGE_PROCESS_START"] = rc
    cov = coverage.process_startup()
    if cov is None:
        return None
    rc_file = Path(rc)
    current = read_context(rc_file)
    cov.switch_context(current)

    def saver() -> None:
        nonlocal current
        while True:
            time.sleep(interval_s)
            try:
                wanted = read_context(rc_file)
                if wanted != current:
                    cov.switch_context(wanted)
                    current = wanted
                cov.save()
            except Exception:  # noqa: BLE001 - measuring must never stop the engine
                log.warning("coverage save failed", exc_info=True)

    threading.Thread(target=saver, daemon=True, name="coverage-saver").start()
    log.info("measuring branch coverage (%s), context %r", rc, current)
    return cov
