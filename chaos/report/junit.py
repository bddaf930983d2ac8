"""junit.xml: one <testsuite> per run, one <testcase> per check, for CI.

Mapping of verdicts (the JUnit schema that Jenkins, GitLab and GitHub reporters read):
- passed  -> <testcase/>
- failed  -> <failure message="<check summary>" type="failed">details</failure>
             (under xfail: <skipped type="xfail" message="xfail: <reason>: <summary>"/>, as pytest)
- unknown -> <error message="<check summary>" type="inconclusive">; an inconclusive check must
             not read as green.
- a run "passed (window not proven)" (``trigger: none``): its `evidence` testcase is
  <skipped type="window-not-proven" message="passed (window not proven): <summary>"/>, never
  a plain pass.
An infrastructure error adds a testcase "run" carrying <error type="infrastructure">; a run
stopped by SIGINT/SIGTERM one carrying <error type="interrupted">.
"""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET
from pathlib import Path

from chaos.report.model import UNPROVEN, RunResult

_MAX_DETAIL = 20_000  # characters of details JSON per testcase, to keep CI pages loadable


def _testcase(parent: ET.Element, classname: str, name: str, time_s: float = 0.0) -> ET.Element:
    return ET.SubElement(parent, "testcase", classname=classname, name=name, time=f"{time_s:.3f}")


def run_testsuite(result: RunResult) -> ET.Element:
    """The <testsuite> element of one run (attributes tests/failures/errors/skipped/time set)."""
    suite = ET.Element("testsuite", name=f"kvchaos.{result.scenario}")
    props = ET.SubElement(suite, "properties")
    for k, v in (("run_id", result.run_id), ("seed", result.seed), ("verdict", result.verdict),
                 ("exit_code", result.exit_code), ("scenario_path", result.scenario_path),
                 ("xfail", result.xfail.reason if result.xfail else None),
                 ("proxy", " ".join(str(result.proxy[k]) for k in ("impl", "version") if result.proxy.get(k))
                  if result.proxy else None)):
        if v is not None:
            ET.SubElement(props, "property", name=k, value=str(v))
    classname = f"kvchaos.{result.scenario}"
    failures = errors = skipped = 0
    if result.interrupted is not None:
        tc = _testcase(suite, classname, "run")
        text = f"interrupted by {result.interrupted.describe()}"
        ET.SubElement(tc, "error", message=text, type="interrupted").text = text
        errors += 1
    if result.error:
        tc = _testcase(suite, classname, "run")
        ET.SubElement(tc, "error", message=result.error, type="infrastructure").text = result.error
        errors += 1
    for chk in result.checks:
        tc = _testcase(suite, classname, chk.name)
        body = json.dumps(chk.details, indent=1, default=str)[:_MAX_DETAIL]
        if chk.verdict == "failed" and result.xfail is not None:
            ET.SubElement(tc, "skipped", type="xfail", message=f"xfail: {result.xfail.reason}: {chk.summary}")
            skipped += 1
        elif chk.verdict == "failed":
            ET.SubElement(tc, "failure", message=chk.summary, type="failed").text = body
            failures += 1
        elif chk.verdict == "unknown":
            ET.SubElement(tc, "error", message=chk.summary, type="inconclusive").text = body
            errors += 1
        elif chk.name == "evidence" and result.verdict == UNPROVEN:
            ET.SubElement(tc, "skipped", type="window-not-proven", message=f"{UNPROVEN}: {chk.summary}")
            skipped += 1
        else:
            ET.SubElement(tc, "system-out").text = chk.summary
    total = result.durations.total_s or 0.0
    suite.set("tests", str(len(result.checks) + (1 if result.error else 0)
                           + (1 if result.interrupted is not None else 0)))
    suite.set("failures", str(failures))
    suite.set("errors", str(errors))
    suite.set("skipped", str(skipped))
    suite.set("time", f"{total:.3f}")
    if result.started_at:
        suite.set("timestamp", result.started_at)
    return suite


def write_junit(path: Path, results: list[RunResult], name: str = "kvchaos") -> Path:
    """Write junit.xml with a <testsuites> root holding one <testsuite> per run.

    Args:
        path: file to write (parent folder must exist).
        results: one or more runs.
        name: the <testsuites> name.
    Returns:
        `path`.
    Raises:
        OSError: the file cannot be written.
    """
    root = ET.Element("testsuites", name=name)
    totals = {"tests": 0, "failures": 0, "errors": 0, "skipped": 0}
    time_s = 0.0
    for r in results:
        s = run_testsuite(r)
        root.append(s)
        for k in totals:
            totals[k] += int(s.get(k, "0"))
        time_s += float(s.get("time", "0"))
    for k, v in totals.items():
        root.set(k, str(v))
    root.set("time", f"{time_s:.3f}")
    tree = ET.ElementTree(root)
    ET.indent(tree)
    tree.write(path, encoding="utf-8", xml_declaration=True)
    return path
