"""The ``kvchaos`` console script (pyproject ``[project.scripts]``).

    interpreter start-up ──> main(): a start-up mode for SIGINT/SIGTERM (chaos/interrupts.py)
        ──> import chaos.cli (typer, rich, pydantic, every layer's commands: 2-11 s)
        ──> the command

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


def main() -> None:
    """Console-script entry point: signals are held from here on, then ``chaos.cli.main``."""
    from chaos import interrupts

    if _command(sys.argv[1:]) == "run":
        interrupts.hold_startup()
    else:
        interrupts.exit_during_startup()
    try:
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


def _command(args: list[str]) -> str | None:
    """The sub-command named by the command line (the first argument not an option: the app
    takes no options of its own but ``--help``)."""
    return next((a for a in args if not a.startswith("-")), None)


if __name__ == "__main__":
    main()
