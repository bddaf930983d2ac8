"""``python -m chaos.proxy [serve] [OPTIONS]``: run the fault proxy server."""

import sys

from chaos.proxy.cli import app

if len(sys.argv) < 2 or sys.argv[1].startswith("-") and sys.argv[1] not in ("--help",):
    sys.argv.insert(1, "serve")
app(prog_name="python -m chaos.proxy")
