"""``python -m chaos.engine serve ...``."""

from chaos.engine.cli import app

if __name__ == "__main__":
    app(prog_name="python -m chaos.engine")
