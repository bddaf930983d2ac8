"""StackPool: a stack that did not come up is not handed to the next scenario."""

from __future__ import annotations

import textwrap

import pytest

from chaos.runner.stacks import StackPool
from chaos.stack.base import StackError


def test_a_stack_whose_up_failed_is_started_afresh_for_the_next_scenario(tmp_path):
    """Seen under --backend compose on a shared host: the first scenario's stack lost a port
    (exit 3, right), and the second scenario ran on that never-started stack and got a failed
    liveness check (20/20 requests: connection refused): a check verdict for an infrastructure
    error."""
    marker = tmp_path / "may-start"
    stack_file = tmp_path / "stack.yml"
    stack_file.write_text(textwrap.dedent(f"""
        services:
          web:
            command: [python, -c, "import os, sys, http.server; os.path.exists({str(marker)!r}) or sys.exit(3); http.server.test(HandlerClass=http.server.SimpleHTTPRequestHandler, port=${{WEB_PORT:-0}}, bind='127.0.0.1')"]
            healthcheck:
              test: [CMD, kvchaos, probe, "http://127.0.0.1:${{WEB_PORT:-0}}/"]
              interval: 100ms
              retries: 100
    """))
    pool = StackPool("local", tmp_path / "stacks")
    try:
        with pytest.raises(StackError):
            pool.acquire(stack_file)
        marker.touch()
        stack = pool.acquire(stack_file)  # a new stack, started: not the one that failed
        assert stack.status()["web"].state == "running"
    finally:
        pool.close()
