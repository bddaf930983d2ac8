"""Resetting a reused stack between scenarios: a proxy that cannot re-create its links is an
infrastructure error (StackError), never a crash of the suite. (Seen: a link's listen port was
taken while the proxy restarted; ToxiproxyError escaped reset_stack and `kvchaos run` died with a
traceback, losing the rest of the suite's reports.)"""

from __future__ import annotations

import os
import socket
import time
from pathlib import Path

import pytest

from chaos.runner.stacks import reset_stack
from chaos.stack.base import StackError
from chaos.stack.local import LocalStack

DATA = Path(__file__).parent / "data"
pytestmark = pytest.mark.slow


def test_reset_with_a_link_port_taken_is_a_stack_error(tmp_path: Path) -> None:
    stack = LocalStack(DATA / "proxy-redis.yml", run_dir=tmp_path / "run", environ=dict(os.environ))
    taker = socket.socket()
    try:
        stack.up()
        port = int(stack.env["REDIS_PROXY_PORT"])
        stack.kill("toxiproxy")
        deadline = time.monotonic() + 10
        while True:  # the dead proxy's listener goes away; take its link port
            try:
                taker.bind(("127.0.0.1", port))
                break
            except OSError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.1)
        taker.listen()
        with pytest.raises(StackError, match="could not create the proxy links") as info:
            reset_stack(stack)
        assert info.value.service == "toxiproxy"
        # The link, its port variable, the port and who holds it (this test's process).
        assert (f"link 'cache-link': port {port} (REDIS_PROXY_PORT) is held by pid {os.getpid()} ("
                in str(info.value)), str(info.value)
    finally:
        taker.close()
        stack.down()
