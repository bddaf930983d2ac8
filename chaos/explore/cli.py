"""``kvchaos explore --stack FILE``: generated scenarios against one stack until a budget ends.

Exit codes: 0 no failure found, 1 at least one new (not known) signature, 2 bad input (a missing
or invalid stack file, a bad --budget, an unknown --bug; nothing started), 130 / 143 SIGINT /
SIGTERM (the summary is still written).
"""

from __future__ import annotations

import sys
from pathlib import Path

import typer

from chaos.proxy.real import PROXY_OPTION_HELP

EXIT_OK, EXIT_FOUND, EXIT_INVALID = 0, 1, 2


def _err(msg: str) -> typer.Exit:
    print(f"error: {msg}", file=sys.stderr)
    return typer.Exit(EXIT_INVALID)


def explore(
    stack: Path = typer.Option(..., "--stack", help="the stack file to explore (e.g. compose/reference.yml)"),
    budget: str = typer.Option("2h", "--budget", help="wall time (e.g. 5m, 2h); no run or shrink starts after it"),
    seed: int = typer.Option(0, "--seed", help="seed of the generator: the same seed gives the same scenarios"),
    jobs: str = typer.Option("1", "--jobs", "-j", help="runs at once, each on a stack of its own (a whole "
                             "number, or auto: cores and memory, README \"Parallel runs\"); a new finding's "
                             "shrink runs on one more stack meanwhile"),
    max_runs: int | None = typer.Option(None, "--max-runs", min=1, help="stop after this many runs"),
    out: Path = typer.Option(Path("reports/explore"), "--out", help="parent folder of the exploration's folder"),
    bug: list[str] = typer.Option(None, "--bug", help="plant this reference-engine bug in every run (repeatable; "
                                  "chaos/engine/bugs.py)"),
    shrink_budget: str = typer.Option("5m", "--shrink-budget", help="search time of each new finding's shrink "
                                      "(0: no shrink, the generated file is kept)"),
    shrink_reruns: int = typer.Option(2, "--shrink-reruns", min=1, help="a shrunk file must fail this many of this "
                                      "many reruns"),
    diagnose: int = typer.Option(3, "--diagnose", min=0, help="diagnose the first N failing requests of each run "
                                 "(0: off)"),
    diagnose_budget: float = typer.Option(60.0, "--diagnose-budget", help="seconds of diagnosis per run, at most"),
    timeout: float = typer.Option(600.0, "--timeout", help="per-run deadline for the phases (s)"),
    catalogue: list[Path] = typer.Option(None, "--known", help="xfail scenarios (files or folders) whose "
                                         "signatures are reported as known (default scenarios/)"),
    stop_on_finding: bool = typer.Option(False, "--stop-on-finding", help="stop at the first new (not known) "
                                         "signature: runs and minutes to a first finding"),
    guide: bool = typer.Option(False, "--guide/--no-guide", help="run, among the next 4 generated scenarios, the "
                               "one whose fault kinds reached the most new LMCache counter combinations, or "
                               "engine branches not run before (the reference stack, --jobs 1), so far "
                               "(without: the generated order, the same for the same seed)"),
    backend: str = typer.Option("local", "--backend", "-b", envvar="KVCHAOS_BACKEND", help="local or compose"),
    proxy: str | None = typer.Option(None, "--proxy", envvar="KVCHAOS_PROXY", help=PROXY_OPTION_HELP),
) -> None:
    """Generate scenarios from what the stack offers (fault kinds, links, services, L2 tiers;
    workloads around chunk boundaries, tenants, turns, cancellations, small pools), run them one
    after another on one stack (--jobs N: N at once, each on its own stack), and diagnose,
    shrink and deduplicate every failure by signature. Writes OUT/<explore-id>/summary.json, index.html and findings/<signature>.yaml."""
    import os

    from chaos import interrupts
    from chaos.campaign import parse_jobs
    from chaos.duration import parse_duration
    from chaos.engine.bugs import validate_bugs
    from chaos.explore.explore import ExploreOptions, run_explore
    from chaos.explore.generate import stack_offer
    from chaos.explore.signature import known_findings
    from chaos.yamlsource import ConfigError

    try:
        budget_s = parse_duration(budget)
        shrink_s = parse_duration(shrink_budget)
    except ValueError as exc:
        raise _err(f"--budget/--shrink-budget: {exc}") from None
    if budget_s <= 0:
        raise _err(f"--budget must be more than 0 (got {budget!r})")
    if shrink_s < 0:
        raise _err(f"--shrink-budget must be 0 or more (got {shrink_budget!r})")
    try:
        n_jobs = parse_jobs(jobs)
    except ValueError as exc:
        raise _err(str(exc)) from None
    if backend not in ("local", "compose"):
        raise _err(f"--backend must be local or compose, not {backend!r}")
    try:
        bugs = validate_bugs(list(bug or []))
    except ValueError as exc:
        raise _err(str(exc)) from None
    if not stack.is_file():
        raise _err(f"--stack {stack}: no such file")
    try:
        offer = stack_offer(stack)
    except ConfigError as exc:
        raise _err(f"--stack: {exc}") from None
    if bugs and not offer.has("engine.planted_bugs"):
        raise _err(f"--bug: the stack {stack} does not offer engine.planted_bugs (the reference engine's "
                   "KVCHAOS_ENGINE_BUGS)")
    if proxy:
        os.environ["KVCHAOS_PROXY"] = proxy
    roots = list(catalogue) if catalogue else [Path("scenarios")]
    opts = ExploreOptions(seed=seed, budget_s=budget_s, max_runs=max_runs, bugs=bugs, out=out, backend=backend,
                          timeout_s=timeout, shrink_budget_s=shrink_s, shrink_reruns=shrink_reruns,
                          diagnose=diagnose, diagnose_budget_s=diagnose_budget, known=known_findings(roots),
                          guide=guide, stop_on_finding=stop_on_finding, jobs=n_jobs)

    def say(msg: str) -> None:
        print(msg, file=sys.stderr, flush=True)

    try:
        summary = run_explore(offer, opts, say)
    except interrupts.RunInterrupted as exc:
        s = exc.results[0] if exc.results else None
        if s is not None:
            print(f"interrupted ({exc.describe()}): faults healed, stacks stopped; summary {s.folder / 'summary.json'}")
        raise typer.Exit(exc.exit_code) from None
    d = summary.as_dict()
    print(f"explore {summary.explore_id}: {d['run_count']} runs in {d['elapsed_s']:.0f}s ({d['stopped_by']}): "
          f"passed {d['passed']}, failed {d['failed']}, inconclusive {d['inconclusive']}, error {d['error']}; "
          f"window reached {d['window_reached_fraction']}; LMCache counter combinations "
          f"{d['lmcache_counter_combinations']}; generator bugs {len(d['generator_invalid'])}")
    for g in d["signatures"]:
        print(f"  {g['signature']}: {g['count']}x, first at run {g['first_run_index']} after {g['first_elapsed_s']:.0f}s"
              f"{' (known: ' + g['known'] + ')' if g['known'] else ''}"
              f"{'' if not g['engine_bugs'] else '; clean engine: ' + str(g['clean_engine'])} -> {g['scenario']}")
    print(f"summary: {summary.folder / 'summary.json'}; page: {summary.folder / 'index.html'}")
    new = [g for g in d["signatures"] if not g["known"]]
    raise typer.Exit(EXIT_FOUND if new else EXIT_OK)
