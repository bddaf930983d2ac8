"""Signatures of explore's findings: what makes two failures the same one, and which are known.

    failed run ──> (failed check names the shrunk file still runs, diagnosis class, fault kinds
                    of the shrunk file, none when the failure does not need them)
                    e.g. checks=recompute_equivalence | diagnosis=length_mismatch | faults=latency
    xfail scenarios (scenarios/**, the shipped findings) ──> KnownFinding (fault kinds, checks,
                                                                    log marks)
    a signature is "known" when every failed check of the signature is one of the checks a
    shipped finding runs (and the run planted no engine bug: a planted bug is never an upstream
    finding), and either the finding has ``xfail.marks`` and the failing run logged every one of
    them with a fault on each part of the stack the finding's faults act on (the marks show its
    mechanism, the part is where it was reached: a latency on the LMCache->Redis link, a
    ``timeout`` on it and a pause of Redis all hold LMCache's L2 reads; other faults were by the
    way), or it has none and the same fault kinds; and, for a failed ``leaks`` check, every field
    that leaked (``lmcache.read_locked_count``) is one the finding's ``xfail.leaks`` names (a known
    L2 read-lock leak does not explain engine blocks held beside it)

A fault's target (:func:`fault_targets`): ``l2`` for a fault on a link to the L2 server or on
the L2 server's service (Redis), ``link:<name>`` / ``service:<name>`` for one on another link
or service, ``kind:<kind>`` for one that names neither (a stall, a tier flush, a cancel).

The diagnosis class is the verdict ``kvchaos diagnose`` gave most of the run's failing requests,
without its detail in parentheses (``kv_content (zero)`` -> ``kv_content``); none when the run
was not diagnosed (no request-level check failed, or diagnosis off or failed).
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

from chaos.scenario.loader import discover_scenarios, load_scenario
from chaos.scenario.model import Scenario
from chaos.yamlsource import ConfigError

__all__ = ["Signature", "KnownFinding", "diagnosis_class", "fault_targets", "known_findings", "match_known",
           "run_log_window", "signature_of"]


@dataclass(frozen=True, order=True)
class Signature:
    """What deduplicates explore's findings.

    Attributes:
        checks: the names of the checks that failed, sorted.
        diagnosis: the diagnosis class of the run's failing requests, "" when none.
        faults: the fault kinds in the (shrunk) scenario, sorted, distinct.
    """

    checks: tuple[str, ...]
    diagnosis: str
    faults: tuple[str, ...]

    def text(self) -> str:
        """One line: ``checks=a+b | diagnosis=x | faults=k1+k2`` (``-`` for empty parts)."""
        return (f"checks={'+'.join(self.checks) or '-'} | diagnosis={self.diagnosis or '-'} | "
                f"faults={'+'.join(self.faults) or '-'}")

    def slug(self) -> str:
        """A file name for the signature's scenario: ``[a-z0-9-]``, at most 90 characters."""
        raw = "-".join([*self.checks, self.diagnosis or "undiagnosed", *(self.faults or ("no-fault",))])
        return re.sub(r"[^a-z0-9]+", "-", raw.lower()).strip("-")[:90]


def diagnosis_class(verdicts: Iterable[str]) -> str:
    """The most frequent verdict without its ``(detail)``; "" for none. Ties: the name first in
    alphabetical order (deterministic)."""
    counts = Counter(v.split(" (")[0].strip() for v in verdicts if v)
    if not counts:
        return ""
    return sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))[0][0]


def signature_of(failed_checks: Iterable[str], diagnosis: str, scenario: Scenario, *,
                 faults_irrelevant: bool = False) -> Signature:
    """The signature of a failure: its failed checks, its diagnosis class, and the fault kinds
    of ``scenario`` (the shrunk one when the shrink worked, else the one that ran).

    Only the failed checks ``scenario`` still runs count: a shrunk file keeps the one check it
    was shrunk on (chaos/shrink), so the other checks the first run failed by the way (a leak
    or a hit-rate miss beside a wrong output, which depend on the workload and the faults
    generated) do not split one failure into several signatures. When ``scenario`` runs none of
    them (not a shrunk file of this failure), all count.

    ``faults_irrelevant``: the failure was shown not to need its faults (the planted bug's
    control run on the clean engine passed its checks, or the shrunk file failed again with
    every fault removed); the signature then has no fault kind (``faults=-``), so that shrinks
    that kept different, unneeded faults give one signature.
    """
    failed = set(failed_checks)
    runs = failed & set(scenario.checks.enabled())
    kinds = () if faults_irrelevant else tuple(sorted({f.kind for _p, _i, f in scenario.faults()}))
    return Signature(checks=tuple(sorted(runs or failed)), diagnosis=diagnosis, faults=kinds)


def fault_targets(scenario: Scenario, stack: str | Path | None = None) -> frozenset[str]:
    """The parts of the stack ``scenario``'s faults act on (module docstring: ``l2``,
    ``link:<name>``, ``service:<name>``, ``kind:<kind>``).

    Args:
        scenario: the scenario (a shrunk or generated one, or a shipped finding).
        stack: the stack file that tells which links lead to the L2 server and which service it
            is (``x-kvchaos`` links and ``redis``); None: the scenario's own ``stack``. A stack
            that does not load gives no ``l2`` target (each link and service by its name).

    Returns:
        The targets; empty for a scenario without faults.
    """
    from chaos.explore.generate import stack_offer

    l2_links: tuple[str, ...] = ()
    l2_services: set[str] = set()
    try:
        offer = stack_offer(stack if stack is not None else scenario.stack)
    except (ConfigError, OSError, ValueError):
        offer = None
    if offer is not None and offer.redis:
        l2_links, l2_services = offer.l2_links, {offer.redis, "redis"}  # its name or its role
    out = set()
    for _p, _i, f in scenario.faults():
        link, service = getattr(f, "link", None), getattr(f, "service", None)
        if link is not None:
            out.add("l2" if link in l2_links else f"link:{link}")
        elif service is not None:
            out.add("l2" if service in l2_services else f"service:{service}")
        else:
            out.add(f"kind:{f.kind}")
    return frozenset(out)


@dataclass(frozen=True)
class KnownFinding:
    """A shipped xfail scenario, as explore compares it.

    Attributes:
        name: the scenario's name.
        file: its path.
        faults: its fault kinds, sorted, distinct.
        checks: the checks it runs.
        stacks: the stacks (file stems) its ``xfail.stacks`` limits it to; None: every stack.
        marks: its ``xfail.marks`` as (service, regular expression) pairs; empty: none.
        targets: the parts of its stack its faults act on (:func:`fault_targets`).
        leaks: its ``xfail.leaks``, the leak fields (``source.field``) it leaves held; None: not
            declared (it explains no failed ``leaks`` check).
    """

    name: str
    file: str
    faults: tuple[str, ...]
    checks: frozenset[str]
    stacks: tuple[str, ...] | None = None
    marks: tuple[tuple[str, str], ...] = ()
    targets: frozenset[str] = frozenset()
    leaks: frozenset[str] | None = None


def known_findings(roots: Iterable[Path]) -> list[KnownFinding]:
    """Every xfail scenario under ``roots`` (files or folders); files that do not load are
    skipped (``kvchaos validate`` reports them, not explore)."""
    out = []
    for root in roots:
        root = Path(root)
        paths = [root] if root.is_file() else (discover_scenarios(root) if root.is_dir() else [])
        for path in paths:
            try:
                s = load_scenario(path)
            except (ConfigError, OSError, ValueError):
                continue
            if s.xfail is None:
                continue
            out.append(KnownFinding(name=s.name, file=str(path), faults=tuple(sorted({f.kind for _p, _i, f in s.faults()})),
                                    checks=frozenset(s.checks.enabled()),
                                    stacks=tuple(s.xfail.stacks) if s.xfail.stacks is not None else None,
                                    marks=tuple((m.service, m.log) for m in s.xfail.marks or ()),
                                    targets=fault_targets(s),
                                    leaks=frozenset(s.xfail.leaks) if s.xfail.leaks is not None else None))
    return out


def match_known(sig: Signature, known: Iterable[KnownFinding], *, planted_bugs: bool,
                stack: str | None = None, logs: Callable[[str], str] | None = None,
                targets: Iterable[str] | None = None, leaked: Iterable[str] | None = None) -> KnownFinding | None:
    """The shipped finding ``sig`` matches, or None; never one when the run planted engine bugs.

    A finding matches when it is expected to fail on ``stack`` (a stack file's stem: its
    ``xfail.stacks`` names it or is unset; ``stack`` None: any) and every failed check of ``sig``
    is one it runs, and then:

    - a finding with ``xfail.marks``, given ``logs`` (a service -> the text it logged during the
      failing run, "" when none): each mark matches a line, and the run faulted each part of the
      stack the finding's faults act on (``targets``: :func:`fault_targets` of the scenario that
      failed; None: the finding's fault kinds are among those of ``sig`` instead); the other
      faults were by the way. A run that did not log the marks is not this bug, even with the
      same kinds (a pause of LMCache is not a pause of Redis);
    - otherwise (no marks, or ``logs`` None): the same fault kinds;

    and, when ``sig`` failed ``leaks`` and ``leaked`` (``chaos.checks.leaks.leaked_fields`` of the failing run)
    is given and not empty, every leaked field is one the finding's ``leaks`` names: a finding
    that declares none explains no leak (an unexplained field is a new bug, never a known one).

    Among several findings that match, one whose fault kinds are among those of ``sig`` comes
    first (slow-l2-read-lock-leak for a latency on the L2 link, frozen-l2-read-lock-leak for a
    pause of Redis; both have the same mark).
    """
    if planted_bugs or not sig.checks:
        return None
    texts: dict[str, str] = {}
    run_targets = frozenset(targets) if targets is not None else None
    run_leaked = frozenset(leaked or ()) if "leaks" in sig.checks else frozenset()
    matches: list[tuple[int, KnownFinding]] = []  # (0 when its fault kinds are among the run's, else 1)
    for k in known:
        if stack is not None and k.stacks is not None and stack not in k.stacks:
            continue
        if not set(sig.checks) <= k.checks:
            continue
        if run_leaked and not (k.leaks is not None and run_leaked <= k.leaks):
            continue
        if k.marks and logs is not None:
            same_kinds = set(k.faults) <= set(sig.faults)
            reached = k.targets <= run_targets if run_targets is not None and k.targets else same_kinds
            if reached and all(re.search(pattern, texts.setdefault(service, logs(service)), re.MULTILINE)
                               for service, pattern in k.marks):
                matches.append((0 if same_kinds else 1, k))
        elif k.faults == sig.faults:
            matches.append((0, k))
    return min(matches, key=lambda m: m[0])[1] if matches else None  # the first of the best rank


#: A log line's time: docker's RFC 3339 UTC prefix (``--backend compose``), else the first local
#: ``YYYY-MM-DD HH:MM:SS`` in the line (LMCache's ``[2026-12-06 18:27:47,234]``, the engine's
#: ``2026-12-06 18:26:44,418``).
_DOCKER_TIME = re.compile(r"^(\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2})(?:\.\d+)?Z ")
_LOCAL_TIME = re.compile(r"(\d{4}-\d{2}-\d{2})[ T](\d{2}:\d{2}:\d{2})")
_ANSI = re.compile(r"\x1b\[[0-9;]*m")


def run_log_window(log: Path, started_at: str | None) -> str:
    """The lines of a run's collected service log (``<run>/logs/<service>.log``) written from the
    run's start on: a stack's log spans every run on it since it started, so earlier runs' lines
    are dropped by their time. A line without a time belongs to the line before it.

    Args:
        log: the log file; missing: "".
        started_at: the run's ``started_at`` (result.json: local time, ``YYYY-MM-DDTHH:MM:SS``);
            None: the whole log.

    Returns:
        The window's text, colour codes removed.
    """
    try:
        text = log.read_text(errors="replace")
    except OSError:
        return ""
    text = _ANSI.sub("", text)
    if not started_at:
        return text
    start = started_at.replace("T", " ")[:19]
    keep, inside = [], False
    for line in text.splitlines():
        m = _DOCKER_TIME.match(line)
        if m:
            utc = datetime.strptime(m.group(1), "%Y-%m-%dT%H:%M:%S").replace(tzinfo=timezone.utc)
            stamp = utc.astimezone().strftime("%Y-%m-%d %H:%M:%S")
        else:
            lm = _LOCAL_TIME.search(line)
            stamp = f"{lm.group(1)} {lm.group(2)}" if lm else None
        if stamp is not None:
            inside = stamp >= start
        if inside:
            keep.append(line)
    return "\n".join(keep)
