"""Fixtures for the reference-engine tests: a real LMCache stack and engines (see engine_procs)."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))

from engine_procs import SMALL_MODEL, Engine, LMCacheStack, lmcache_args  # noqa: E402


@pytest.fixture(scope="session")
def lmcache_stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LMCacheStack]:
    """One redis-server + `lmcache server` shared by the tests that do not break it."""
    stack = LMCacheStack(tmp_path_factory.mktemp("lmcache"))
    stack.start()
    yield stack
    stack.stop()


@pytest.fixture(scope="session")
def twin(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Engine]:
    """The recompute twin: same model, no connector, no prefix caching, a big pool."""
    eng = Engine("twin", tmp_path_factory.mktemp("twin"),
                 [*SMALL_MODEL, "--num-blocks", "2048"]).start()
    yield eng
    eng.stop()


@pytest.fixture(scope="session")
def engine(lmcache_stack: LMCacheStack, tmp_path_factory: pytest.TempPathFactory
           ) -> Iterator[Engine]:
    """The clean engine under test: LMCache connector on, its own prefix cache off (so a
    repeated prompt is served by LMCache)."""
    eng = Engine("engine", tmp_path_factory.mktemp("engine"),
                 [*SMALL_MODEL, "--num-blocks", "1024", *lmcache_args(lmcache_stack)]).start()
    yield eng
    eng.stop()


@pytest.fixture()
def make_engine(tmp_path: Path) -> Iterator:
    """Factory for extra engines (bugs, policies); all stopped at teardown."""
    made: list[Engine] = []

    def make(name: str, args: list[str], wait_lmcache: bool = True) -> Engine:
        eng = Engine(name, tmp_path, [*SMALL_MODEL, *args])
        made.append(eng)
        return eng.start(wait_lmcache=wait_lmcache)

    yield make
    for eng in made:
        eng.stop()
