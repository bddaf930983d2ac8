"""The ``kvchaos`` console script (pyproject ``[project.scripts]``).

    interpreter start-up ──> main(): a start-up mode for SIGINT/SIGTERM (chaos/interrupts.py)
        ──> import chaos.cli (typer, rich, pydantic, every layer's commands: 2-11 s)
        ──> the command

``kvchaos engine ...`` and ``kvchaos proxy ...`` (the reference engine and the bundled proxy, the
services every stack start and restart runs) skip ``chaos.cli`` and run their own layer's app
(``SERVICE_APPS``): the other layers' commands cost them about a CPU-second per start.

``kvchaos run`` holds a signal of its start-up (stage "start-up") and ends the hold after its
own imports and the validation, writing its report with verdict ``interrupted`` (exit 130/143);
every other command exits 130/143 at once on a signal of its start-up, and gets the usual
handlers back when it starts (the app's callback in chaos/cli.py).

Before :func:`main`'s first instruction only the interpreter and this package's empty
``__init__`` run; :mod:`chaos.interrupts`, imported first, needs the standard library's light
modules only. A signal that comes even earlier (the interpreter's own start-up, a few tens of
milliseconds) meets Python's defaults.
"""

from __future__ import annotations

import sys

#: Sub-commands that serve a stack's service, and the module whose typer ``app`` they are: the
#: same app ``chaos.cli`` mounts under that name, run without importing ``chaos.cli`` (typer,
#: rich and every layer's commands: 12% of a reference engine's start-up CPU in py-spy on the
#: 2-core CI machine, 2026-12-07, paid by both engines of every stack start and engine restart).
SERVICE_APPS = {"engine": "chaos.engine.cli", "proxy": "chaos.proxy.cli"}


def main() -> None:
    """Console-script entry point: signals are held from here on, then ``chaos.cli.main``."""
    from chaos import interrupts

    if _command(sys.argv[1:]) == "run":
        interrupts.hold_startup()
    else:
        interrupts.exit_during_startup()
    try:
        command = sys.argv[1] if len(sys.argv) > 1 else None
        if command in SERVICE_APPS:
            _service_main(command)
        else:
            from chaos import cli

            cli.main()
    finally:
        # Still held: the command never started (`--help`, a usage error, an import that
        # failed). A signal that came meanwhile decides the exit code.
        try:
            interrupts.end_startup()
        except interrupts.RunInterrupted as exc:
            print(f"interrupted ({exc.describe()})", file=sys.stderr)
            sys.exit(exc.exit_code)


def _service_main(command: str) -> None:
    """``kvchaos <command> ...`` for a command of ``SERVICE_APPS``: its app, with what
    ``chaos.cli.main`` gives every command (the SIGUSR1 stack dump, the end of the start-up
    mode for signals once the command starts, tracebacks without rich's pretty printing)."""
    import importlib

    import typer

    from chaos import interrupts

    app = typer.Typer(no_args_is_help=True, pretty_exceptions_enable=False, add_completion=False)
    app.add_typer(importlib.import_module(SERVICE_APPS[command]).app, name=command)
    interrupts.dump_stacks_on_sigusr1()
    interrupts.end_startup()
    app(args=sys.argv[1:], prog_name="kvchaos")


def _command(args: list[str]) -> str | None:
    """The sub-command named by the command line (the first argument not an option: the app
    takes no options of its own but ``--help``)."""
    return next((a for a in args if not a.startswith("-")), None)


if __name__ == "__main__":
    main()
