"""Fixtures for the reference-engine tests: a real LMCache stack and engines (see engine_procs)."""

from __future__ import annotations

import sys
import time
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


# How long the shared stack may take to release what a test's last request held (LMCache
# frees lookup locks and ends sessions asynchronously).
SHARED_STACK_QUIESCE_S = 10.0


def _held(stack: LMCacheStack) -> dict[str, int]:
    return {"read_locked_count": stack.l1()["read_locked_count"],
            "active_sessions": stack.status()["active_sessions"]}


@pytest.fixture(autouse=True)
def shared_stack_left_clean(request: pytest.FixtureRequest) -> Iterator[None]:
    """Every test that uses the session's ``lmcache_stack`` leaves it holding no more read locks
    and sessions than it found (within SHARED_STACK_QUIESCE_S after its engines stopped).

    A leak on the shared stack outlives the test that made it (LMCache keeps a read lock for its
    300 s read TTL) and fails a later test that asserts an absolute zero; this names the test
    that leaked instead. A test whose point is a leak runs on a stack of its own.
    Autouse, so set up before and torn down after the test's other fixtures (its engines).
    """
    if "lmcache_stack" not in request.fixturenames:
        yield
        return
    stack: LMCacheStack = request.getfixturevalue("lmcache_stack")
    before = _held(stack)
    yield
    deadline = time.monotonic() + SHARED_STACK_QUIESCE_S
    while True:
        after = _held(stack)
        grew = {k: (before[k], v) for k, v in after.items() if v > before[k]}
        if not grew or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    if grew:
        pytest.fail(f"{request.node.nodeid} left the shared LMCache stack holding more than it "
                    f"found (before, after): {grew}; a test that leaks on purpose needs a stack "
                    "of its own", pytrace=False)


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
