"""Helpers: write a scenario next to a minimal stack file in a temporary folder."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

STACK = """\
services:
  engine: {command: [sleep, "1"]}
  lmcache: {command: [sleep, "1"]}
x-kvchaos:
  links:
    engine-lmcache: {listen: "127.0.0.1:15555", upstream: "127.0.0.1:5555"}
    lmcache-redis: {listen: "127.0.0.1:16379", upstream: "127.0.0.1:6379"}
"""

GOOD = """\
name: lookup-stall
description: test
stack: stack.yml
seed: 7
workload:
  families: 2
  prefix_tokens: [255, 256]
  requests: 4
phases:
  - name: warm
  - name: stall
    faults:
      - kind: latency
        link: engine-lmcache
        latency_ms: 3000
        start: 500ms
        duration: 1m30s
checks:
  liveness: {request_deadline_s: 30}
  leaks:
"""


@pytest.fixture
def scenario_dir(tmp_path: Path) -> Path:
    (tmp_path / "stack.yml").write_text(STACK)
    return tmp_path


@pytest.fixture
def write(scenario_dir: Path):
    """write(text, name="s.yaml") -> path of a scenario file next to stack.yml."""

    def _write(text: str, name: str = "s.yaml") -> Path:
        path = scenario_dir / name
        path.write_text(textwrap.dedent(text))
        return path

    return _write
