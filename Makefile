# kvchaos: every target does its own set-up (scripts/setup.sh and scripts/build-image.sh are
# idempotent).
VENV ?= .venv
PY := $(VENV)/bin/python
KVCHAOS := $(VENV)/bin/kvchaos
# The default suite of `make demo`: no fault, a lookup stall, a node exit.
SUITE ?= scenarios/smoke.yaml scenarios/lookup-timeout.yaml scenarios/node-exit-lmcache.yaml

.PHONY: setup image demo test test-fast zoo bench fuzz killpoints clean

setup:
	bash scripts/setup.sh

## The Docker image of the reference stack for --backend compose (Docker engine, offline base).
image: setup
	bash scripts/build-image.sh

## The main job: the default chaos scenario suite against the reference stack (local processes).
demo: setup
	$(KVCHAOS) run $(SUITE)

## Every test: unit and integration (real LMCache, Redis, proxy, Docker), then the scenarios.
test: setup image
	$(PY) -m pytest -q -p no:cacheprovider -m "not chaos" tests
	$(PY) -m pytest -q -p no:cacheprovider -m chaos --junitxml=reports/junit-chaos.xml

## Unit tests only (no real servers, no Docker).
test-fast: setup
	$(PY) -m pytest -q -p no:cacheprovider -m "not slow and not chaos" tests

## The bug zoo: the catalogue against the clean engine and each planted bug (reports/zoo/).
zoo: setup
	$(KVCHAOS) zoo $(ZOO_ARGS)

## Hostile input at acceptance size: 3,000 mutated scenarios + 500 mutated stack files through
## `kvchaos validate`, each in its own process, each under 5 s and 200 MB (reports/fuzz/).
fuzz: setup
	$(PY) scripts/fuzz_validate.py $(FUZZ_ARGS)

## Interrupted runs at acceptance size: SIGTERM, SIGINT and SIGKILL at 20 random points each of a
## real run (stack start-up included), then the leftover count (reports/killpoints/).
killpoints: setup
	$(PY) scripts/kill_points.py $(KILLPOINTS_ARGS)

bench: setup
	$(PY) benchmarks/proxy_throughput.py
	$(PY) benchmarks/ttft_hit.py
	$(PY) benchmarks/suite_overhead.py

clean:
	rm -rf $(VENV) reports/*/ .pytest_cache
