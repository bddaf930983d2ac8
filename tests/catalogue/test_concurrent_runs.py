"""Two `kvchaos run` started at the same moment on one host, each with its own
KVCHAOS_STATE_DIR and the default ports: each gets ports of its own and ends with the verdicts
of a lone run (the clean engine passes these scenarios). Before host-wide port claims, both
picked the same free defaults; one stack's engine lost its bind and its probe passed against
the other stack's engine.

Two reference stacks at once (four engines) on a 2-core machine: marked slow, a subset of the
catalogue (a plain scenario and a network fault).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SUBSET = ["scenarios/smoke.yaml", "scenarios/lookup-timeout.yaml"]


@pytest.mark.slow
def test_two_runs_at_once_with_default_ports_end_as_lone_runs(tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.endswith("_PORT")}  # the defaults
    go = tmp_path / "go"
    starter = ("import os, sys, time\n"
               "while not os.path.exists(sys.argv[1]): time.sleep(0.001)\n"
               "os.execv(sys.argv[2], sys.argv[2:])\n")
    kvchaos = str(Path(sys.executable).with_name("kvchaos"))
    procs = []
    for i in (1, 2):
        e = dict(env, KVCHAOS_STATE_DIR=str(tmp_path / f"state-{i}"))
        procs.append(subprocess.Popen(
            [sys.executable, "-c", starter, str(go), kvchaos, "run", *SUBSET,
             "--report-dir", str(tmp_path / f"reports-{i}")],
            env=e, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
    time.sleep(1)
    go.touch()  # both start now
    outs = [p.communicate(timeout=1500)[0] for p in procs]
    ports = []
    for i, (p, out) in enumerate(zip(procs, outs), start=1):
        results = [json.loads(f.read_text()) for f in (tmp_path / f"reports-{i}").glob("*/result.json")]
        verdicts = {r["scenario"]: r["verdict"] for r in results}
        errors = {r["scenario"]: (r.get("error") or "")[:1500] for r in results if r.get("error")}
        assert p.returncode == 0 and verdicts == {"smoke": "passed", "lookup-timeout": "passed"}, \
            (verdicts, errors, out[-2000:])
        stacks = list((tmp_path / f"reports-{i}").glob("suite-*/stacks/*/logs/engine.log")) or \
            list((tmp_path / f"reports-{i}").glob("**/logs/engine.log"))
        ports.append({line.split("--port', '")[1].split("'")[0] for s in stacks
                      for line in s.read_text().splitlines() if "starting engine:" in line})
    assert ports[0] and ports[1] and not ports[0] & ports[1], ports
