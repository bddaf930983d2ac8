"""``kvchaos validate | schema | list``: scenario files without running them.

The lead's chaos/cli.py wires these as top-level commands, e.g.
``app.command("validate")(validate)``; ``app`` here is a standalone Typer app with the same
three commands (used by the tests).

Exit codes: 0 valid, 2 a scenario (or the stack file it names) is invalid.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Annotated, Any

import typer

from chaos.scenario.loader import discover_scenarios, load_scenario, validate_against_stack
from chaos.scenario.model import Scenario
from chaos.yamlsource import ConfigError

__all__ = ["app", "validate", "schema", "list_scenarios", "stack_names", "schema_text", "DEFAULT_SCHEMA_PATH"]

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


def _check_one(path: Path) -> Scenario:
    from chaos.stack.spec import load_stack

    scenario = load_scenario(path)
    spec = load_stack(scenario.stack, allocate_ports=False, require_commands=False)
    validate_against_stack(scenario, set(spec.settings.links), set(spec.services), spec.settings)
    return scenario


def validate(
    files: Annotated[list[Path], typer.Argument(help="scenario files or folders of them")],
) -> None:
    """Validate scenario files (keys, values, the stack file, links named by faults).

    Prints ``file: ok`` or one ``file:line: field: message`` line per problem. Exits 2 when any
    file is invalid.
    """
    bad = 0
    for root in files:
        try:
            paths = discover_scenarios(root)
        except ConfigError as exc:
            typer.echo(str(exc), err=True)
            bad += 1
            continue
        for path in paths:
            try:
                _check_one(path)
            except ConfigError as exc:
                typer.echo(str(exc), err=True)
                bad += 1
            else:
                typer.echo(f"{path}: ok")
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


def list_scenarios(
    directory: Annotated[Path, typer.Argument(help="folder of scenarios")] = Path("scenarios"),
    as_json: Annotated[bool, typer.Option("--json", help="one JSON object per scenario")] = False,
) -> None:
    """List the scenario catalogue: name, faults, checks, xfail. Exits 2 if any is invalid."""
    bad = 0
    try:
        paths = discover_scenarios(directory)
    except ConfigError as exc:
        typer.echo(str(exc), err=True)
        raise typer.Exit(2) from None
    rows = []
    for path in paths:
        try:
            rows.append(_row(path, load_scenario(path)))
        except ConfigError as exc:
            typer.echo(str(exc), err=True)
            bad += 1
    if as_json:
        for row in rows:
            typer.echo(json.dumps(row))
    else:
        from rich.console import Console
        from rich.table import Table

        table = Table("name", "faults", "checks", "xfail", "file")
        for row in rows:
            table.add_row(row["name"], ", ".join(row["faults"]) or "-", ", ".join(row["checks"]),
                          row["xfail"] or "", row["file"])
        Console(width=200).print(table)
    if bad:
        raise typer.Exit(2)


app.command("validate")(validate)
app.command("schema")(schema)
app.command("list")(list_scenarios)
