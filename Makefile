# kvchaos: every target does its own set-up (scripts/setup.sh and scripts/build-image.sh are
# idempotent).
VENV ?= .venv
PY := $(VENV)/bin/python
KVCHAOS := $(VENV)/bin/kvchaos
# The default suite of `make demo`: no fault, a lookup stall, a node exit.
SUITE ?= scenarios/smoke.yaml scenarios/lookup-timeout.yaml scenarios/node-exit-lmcache.yaml

.PHONY: setup image demo test test-fast zoo coverage coverage-docs mutation mutation-engine bench clean

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

## Engine path coverage under the catalogue (~15 min): the clean engine under coverage.py, one
## context per scenario; stores docs/coverage.json and regenerates docs/coverage.md and the
## field-report map of docs/catalogue.md.
coverage: setup
	$(KVCHAOS) coverage run --update-docs $(COVERAGE_ARGS)

## Regenerate the coverage pages from the stored measurement (no run).
coverage-docs: setup
	$(KVCHAOS) coverage docs

## Mutation score of the checks (~5 min): mutmut over chaos/checks/ against their unit tests;
## prints the score and every survivor, each killed or explained (docs/mutation-explained.yaml).
mutation: setup
	rm -rf mutants
	$(VENV)/bin/mutmut run >/dev/null 2>&1 || true
	$(PY) scripts/mutation_score.py

## Nightly: a sample of mutants of the engine's scheduler and connector against the scenarios
## whose coverage record reaches each (~3 min per mutant; MUTANTS=8).
mutation-engine: setup
	$(PY) scripts/mutate_engine.py --sample $(or $(MUTANTS),8)

bench: setup
	$(PY) benchmarks/proxy_throughput.py
	$(PY) benchmarks/ttft_hit.py
	$(PY) benchmarks/suite_overhead.py

clean:
	rm -rf $(VENV) reports/*/ .pytest_cache mutants
