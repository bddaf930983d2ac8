"""Fixtures for the compose backend's tests: a real Docker engine, a small image, a stack.

Every test here needs a Docker engine and a compose CLI; without them the whole folder is
skipped with the reason (run scripts/docker-setup.sh). The image is compose/Dockerfile's ``os``
stage (a Debian base + redis-server) on ``$KVCHAOS_BASE_IMAGE`` (default
``kvchaos/base:bookworm`` from scripts/offline-base-image.sh; any Debian-based Python image
works, e.g. ``python:3.11-slim`` where a registry is reachable).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from chaos.stack.compose import (LABEL_PROJECT, build_image, docker_client, engine_available,
                                 image_exists)

REPO = Path(__file__).resolve().parents[2]
STACKS = Path(__file__).resolve().parent / "stacks"
TEST_IMAGE = "kvchaos-test/os:dev"

_ok, _why = engine_available()
if not _ok and os.environ.get("CI"):
    raise RuntimeError(f"CI must test the compose backend, but there is no Docker engine ({_why}); "
                       ".ci/run runs scripts/docker-setup.sh")
if not _ok:
    pytest.skip(f"no Docker engine or compose CLI here ({_why}); run scripts/docker-setup.sh",
                allow_module_level=True)


@pytest.fixture(scope="session")
def docker():
    client = docker_client()
    yield client
    client.close()


@pytest.fixture(scope="session")
def test_image(docker, tmp_path_factory) -> str:
    """``kvchaos-test/os:dev``, built once per session (seconds when the layer cache has it)."""
    base = os.environ.get("KVCHAOS_BASE_IMAGE", "kvchaos/base:bookworm")
    if not image_exists(docker, base):
        if os.environ.get("CI"):
            pytest.fail(f"base image {base} is not present: .ci/run builds it (scripts/build-image.sh)")
        pytest.skip(f"base image {base} is not present: run scripts/offline-base-image.sh "
                    "(or set KVCHAOS_BASE_IMAGE to a Debian-based image you have)")
    log = tmp_path_factory.mktemp("build") / "build.log"
    build_image(TEST_IMAGE, REPO, "compose/Dockerfile", target="os",
                buildargs={"BASE_IMAGE": base}, log_path=log, client=docker)
    return TEST_IMAGE


@pytest.fixture
def stack_env(test_image, monkeypatch, tmp_path) -> dict[str, str]:
    """Variables for tests/compose/stacks/*.yml; a private state dir so journals stay apart."""
    monkeypatch.setenv("KVCHAOS_TEST_IMAGE", test_image)
    monkeypatch.setenv("KVCHAOS_STATE_DIR", str(tmp_path / "state"))
    return dict(os.environ)


@pytest.fixture
def leftovers(docker):
    """``leftovers(project)``: containers, networks and volumes still labelled with compose
    project ``project``, as ``{"containers": [names], "networks": [...], "volumes": [...]}``."""
    def look(project: str) -> dict[str, list[str]]:
        label = {"label": f"{LABEL_PROJECT}={project}"}
        return {"containers": [c.name for c in docker.containers.list(all=True, filters=label)],
                "networks": [n.name for n in docker.networks.list(filters=label)],
                "volumes": [v.name for v in docker.volumes.list(filters=label)]}
    return look


@pytest.fixture
def redis_stack_path() -> Path:
    return STACKS / "redis.yml"


@pytest.fixture
def sweeper(docker) -> Iterator[list[str]]:
    """Projects appended here are removed after the test whatever happened (so one failing
    test does not leave containers for the next)."""
    projects: list[str] = []
    yield projects
    from chaos.stack.compose import remove_project
    for p in projects:
        remove_project(p, docker)
