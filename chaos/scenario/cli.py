"""``kvchaos validate | schema | list | findings``: scenario files without running them.

The lead's chaos/cli.py wires these as top-level commands, e.g.
``app.command("validate")(validate)``; ``app`` here is a standalone Typer app with the same
three commands (used by the tests).

Exit codes: 0 valid (warnings may be printed), 2 a scenario (or the stack file it names) is
invalid, a path names no scenario at all, or (``--stack``) a scenario needs a capability that
stack does not offer.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Annotated, Any

import typer

from chaos.scenario.loader import check_scenario, discover_scenarios, load_scenario, validate_against_stack
from chaos.scenario.model import Scenario
from chaos.yamlsource import ConfigError, display_path

__all__ = ["app", "validate", "schema", "list_scenarios", "findings", "stack_names", "schema_text", "DEFAULT_SCHEMA_PATH"]

DEFAULT_SCHEMA_PATH = Path("schemas/scenario.schema.json")

app = typer.Typer(help="Scenario files: validate, JSON schema, catalogue.", no_args_is_help=True)


def stack_names(stack_file: Path) -> tuple[set[str], set[str]]:
    """(link names, service names) of a stack file, validated by chaos.stack.spec.load_stack
    (no ports allocated, commands not required).

    Raises:
        ConfigError: the stack file is invalid (file:line of the stack file).
    """
    from chaos.stack.spec import load_stack  # the stack layer; imported when needed

    spec = load_stack(stack_file, allocate_ports=False, require_commands=False)
    return set(spec.settings.links), set(spec.services)


StackOption = Annotated[
    Path | None,
    typer.Option("--stack", help="check the scenarios against this stack file instead of their own "
                 "(which of them it can run: links, services and capabilities)"),
]


def validate(
    files: Annotated[list[Path], typer.Argument(help="scenario files or folders of them")],
    stack: StackOption = None,
) -> None:
    """Validate scenario files (keys, values, names between parts, the stack file, the links and
    services faults name, what checks need of the stack, the capabilities they need from it).

    Prints ``file: ok`` or one ``file:line: field: message`` line per problem, every problem of
    a file in one pass; ``warning: file:line: ...`` for likely mistakes that do not stop a run
    (a hook without evidence, a file named differently from its ``name``). Exits 2 when any file
    is invalid, a path holds no scenario file, or (``--stack``) a scenario needs what that stack
    does not offer.
    """
    if stack is not None:
        try:
            stack_names(stack)
        except ConfigError as exc:
            typer.echo(str(exc), err=True)
            raise typer.Exit(2) from None
    bad = 0
    for root in files:
        try:
            paths = discover_scenarios(root)
        except ConfigError as exc:
            typer.echo(str(exc), err=True)
            bad += 1
            continue
        if not paths:
            typer.echo(f"{display_path(root)}: no scenario files (*.yaml, *.yml other than stack files) here",
                       err=True)
            bad += 1
            continue
        for path in paths:
            check = check_scenario(path, stack=stack)
            for line in check.warning_lines():
                typer.echo(f"warning: {line}", err=True)
            if check.ok:
                typer.echo(f"{display_path(path)}: ok")
            else:
                typer.echo(str(check.error()), err=True)
                bad += 1
    if bad:
        raise typer.Exit(2)


def schema_text() -> str:
    """The scenario JSON schema as the checked-in file holds it (sorted keys, 2-space indent)."""
    return json.dumps(Scenario.json_schema(), indent=2, sort_keys=True) + "\n"


def schema(
    output: Annotated[
        str, typer.Option("--output", "-o", help="where to write; '-' for stdout")
    ] = str(DEFAULT_SCHEMA_PATH),
) -> None:
    """Write the JSON Schema of scenario files (for editors: yaml-language-server)."""
    text = schema_text()
    if output == "-":
        sys.stdout.write(text)
        return
    out = Path(output)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(text, encoding="utf-8")
    typer.echo(f"wrote {out}")


def _row(path: Path, scenario: Scenario) -> dict[str, Any]:
    return {
        "name": scenario.name,
        "file": str(path),
        "faults": sorted({f.kind for _, _, f in scenario.faults()}),
        "checks": scenario.checks.enabled(),
        "xfail": scenario.xfail.upstream or scenario.xfail.reason if scenario.xfail else None,
        "description": scenario.description,
    }


def runnable_on(scenario: Scenario, spec: Any) -> list[str]:
    """Why ``scenario`` cannot run on the loaded stack ``spec``, one short line each: a missing
    capability (``engine.hooks.stall (fault 'stall' (hook))``), an unknown link or service
    (empty: it runs there). ``kvchaos validate --stack`` gives the full messages."""
    from chaos.scenario.needs import missing, scenario_needs

    out = []
    try:
        validate_against_stack(scenario, set(spec.settings.links), set(spec.services), spec.settings)
    except ConfigError as exc:
        out += [p.rsplit(": ", 1)[-1] for p in exc.problems]
    out += [f"{n.capability} ({n.who})" for n in missing(scenario_needs(scenario), spec.capabilities())]
    return out


def list_scenarios(
    directory: Annotated[Path, typer.Argument(help="folder of scenarios")] = Path("scenarios"),
    as_json: Annotated[bool, typer.Option("--json", help="one JSON object per scenario")] = False,
    stack: StackOption = None,
) -> None:
    """List the scenario catalogue: name, faults, checks, xfail; with ``--stack FILE``, whether
    each runs on that stack or what it needs there. Exits 2 if any is invalid or (``--stack``)
    cannot run there."""
    bad = 0
    try:
        paths = discover_scenarios(directory)
        spec = None
        if stack is not None:
            from chaos.stack.spec import load_stack

            spec = load_stack(stack, allocate_ports=False, require_commands=False)
    except ConfigError as exc:
        typer.echo(str(exc), err=True)
        raise typer.Exit(2) from None
    rows = []
    for path in paths:
        try:
            scenario = load_scenario(path)
        except ConfigError as exc:
            typer.echo(str(exc), err=True)
            bad += 1
            continue
        row = _row(path, scenario)
        if spec is not None:
            why = runnable_on(scenario, spec)
            row.update(stack=str(stack), runnable=not why, needs=why)
            bad += bool(why)
        rows.append(row)
    if as_json:
        for row in rows:
            typer.echo(json.dumps(row))
    else:
        from rich.console import Console
        from rich.table import Table

        if spec is None:
            table = Table("name", "faults", "checks", "xfail", "file")
            for row in rows:
                table.add_row(row["name"], ", ".join(row["faults"]) or "-", ", ".join(row["checks"]),
                              row["xfail"] or "", row["file"])
        else:
            table = Table("name", "faults", f"on {stack}")
            for row in rows:
                table.add_row(row["name"], ", ".join(row["faults"]) or "-",
                              "runnable" if row["runnable"] else "needs " + "; ".join(row["needs"]))
        Console(width=200).print(table)
        if spec is not None:
            n_bad = sum(not r["runnable"] for r in rows)
            typer.echo(f"{len(rows) - n_bad} of {len(rows)} scenarios run on {stack}"
                       + (f"; {n_bad} need what it lacks" if n_bad else ""))
    if bad:
        raise typer.Exit(2)


def findings(
    directory: Annotated[Path, typer.Argument(help="folder of scenarios")] = Path("scenarios"),
    docs: Annotated[Path, typer.Option("--docs", help="folder of the findings pages")] = Path("docs/findings"),
    reports: Annotated[Path | None, typer.Option(
        "--reports", help="reports folder: show each scenario's latest clean-engine outcome")] = None,
    fail_on_xpass: Annotated[bool, typer.Option(
        "--fail-on-xpass", help="exit 1 when a latest outcome is XPASS (a nightly job's alarm)")] = False,
    as_json: Annotated[bool, typer.Option("--json", help="one JSON object per finding")] = False,
) -> None:
    """List the known upstream bugs: every xfail scenario, its upstream report, its page in
    docs/findings/ and (with --reports) whether its latest run still fails as expected (XFAIL)
    or now passes (XPASS: fixed upstream, or the scenario no longer reaches the bug).

    Exit codes: 0 listed, 1 an XPASS with --fail-on-xpass, 2 a scenario is invalid.
    """
    from chaos.scenario.findings import finding_rows

    try:
        rows, bad = finding_rows(directory, docs, reports)
    except ConfigError as exc:
        typer.echo(str(exc), err=True)
        raise typer.Exit(2) from None
    for exc in bad:
        typer.echo(str(exc), err=True)
    if as_json:
        for row in rows:
            typer.echo(json.dumps(row.as_dict()))
    else:
        from rich.console import Console
        from rich.table import Table

        table = Table("name", "upstream", "page", *(["latest", "run"] if reports is not None else []),
                      title="known upstream bugs (xfail scenarios)")
        for row in rows:
            extra = [row.outcome or "not run", row.run_dir or ""] if reports is not None else []
            table.add_row(row.name, row.upstream or "(not set)", row.page or "-", *extra)
        Console(width=200).print(table)
    if bad:
        raise typer.Exit(2)
    xpassed = [r.name for r in rows if r.outcome == "XPASS"]
    if fail_on_xpass and xpassed:
        typer.echo(f"XPASS (the bug no longer shows; check upstream and drop the xfail): "
                   f"{', '.join(xpassed)}", err=True)
        raise typer.Exit(1)


app.command("validate")(validate)
app.command("schema")(schema)
app.command("list")(list_scenarios)
app.command("findings")(findings)
