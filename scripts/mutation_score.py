#!/usr/bin/env python3
"""Print the mutation score of the last ``mutmut run`` and every surviving mutant.

    make mutation ──> mutmut run (chaos/checks/, [tool.mutmut] in pyproject.toml)
                 ──> this script: mutmut results ──> killed / survived / other per mutant
                                  each survivor: explained in docs/mutation-explained.yaml
                                  (function + mutated line + why no test can or should kill
                                  it), or unexplained

Exit codes: 0 every mutant killed or explained; 1 an unexplained survivor (or no mutant);
2 mutmut's results could not be read.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent
EXPLAINED = ROOT / "docs" / "mutation-explained.yaml"
MUTMUT = str(Path(sys.executable).parent / "mutmut")


def results() -> dict[str, str]:
    """mutant name -> status (``killed``, ``survived``, ``timeout``, ...), from mutmut."""
    out = subprocess.run([MUTMUT, "results", "--all", "true"], cwd=ROOT, capture_output=True,
                         text=True, check=True).stdout
    found = {}
    for line in out.splitlines():
        m = re.match(r"\s*([\w.]+__mutmut_\d+): (.+)$", line)
        if m:
            found[m.group(1)] = m.group(2).strip()
    return found


def mutated_line(name: str) -> str:
    """The line a mutant changes, as it reads in the mutant (stripped)."""
    diff = subprocess.run([MUTMUT, "show", name], cwd=ROOT, capture_output=True, text=True).stdout
    added = [ln[1:].strip() for ln in diff.splitlines() if ln.startswith("+") and not ln.startswith("+++")]
    return added[0] if added else "(line removed)"


def function_of(name: str) -> str:
    """``chaos.checks.result.x_worst__mutmut_4`` -> ``chaos.checks.result.worst``."""
    module, _, rest = name.rpartition(".")
    func = re.sub(r"__mutmut_\d+$", "", rest)
    func = re.sub(r"^x[ǁ_]", "", func).replace("ǁ", ".")
    return f"{module}.{func}"


def main() -> int:
    try:
        status = results()
    except (OSError, subprocess.CalledProcessError) as exc:
        print(f"error: cannot read mutmut's results ({exc}); run `mutmut run` first", file=sys.stderr)
        return 2
    if not status:
        print("error: mutmut reports no mutants; run `mutmut run` first", file=sys.stderr)
        return 1
    explained = yaml.safe_load(EXPLAINED.read_text()) or []
    reasons = {(e["function"], e["line"]): e["reason"] for e in explained}
    killed = [n for n, s in status.items() if s == "killed"]
    survived = sorted(n for n, s in status.items() if s != "killed")
    unexplained, used = [], set()
    print(f"mutants of chaos/checks/: {len(status)}; killed {len(killed)}; "
          f"survived or not killed {len(survived)}")
    for name in survived:
        key = (function_of(name), mutated_line(name))
        why = reasons.get(key)
        if why:
            used.add(key)
        else:
            unexplained.append(name)
        print(f"  {status[name]:9s} {name}: {key[1]}\n            -> {why or 'UNEXPLAINED'}")
    score = 100.0 * len(killed) / len(status)
    print(f"mutation score: {score:.1f}% killed ({len(killed)}/{len(status)}); "
          f"{len(survived) - len(unexplained)} survivors explained in {EXPLAINED.relative_to(ROOT)}, "
          f"{len(unexplained)} unexplained")
    stale = [k for k in reasons if k not in used]
    if stale:
        print(f"note: {len(stale)} explanations match no survivor now (killed or code changed):")
        for func, line in stale:
            print(f"  {func}: {line}")
    return 1 if unexplained else 0


if __name__ == "__main__":
    sys.exit(main())
