# kvchaos: every target does its own set-up (scripts/setup.sh is idempotent).
VENV ?= .venv
PY := $(VENV)/bin/python
KVCHAOS := $(VENV)/bin/kvchaos
SUITE ?= scenarios/smoke.yaml scenarios/lookup-timeout.yaml

.PHONY: setup demo test test-fast test-chaos zoo bench clean

setup:
	bash scripts/setup.sh

## The main job: the default chaos scenario suite against the reference stack (local processes).
demo: setup
	$(KVCHAOS) run $(SUITE)

## Every test: unit, integration (real LMCache, Redis, proxy) and the chaos scenarios.
test: setup
	$(PY) -m pytest -q -m "not chaos" tests
	$(PY) -m pytest -q -m chaos -p no:cacheprovider --junitxml=reports/junit-chaos.xml

test-fast: setup
	$(PY) -m pytest -q -m "not slow and not chaos" tests

## The bug zoo: the catalogue against the clean engine and each planted bug -> reports/zoo/
## (ZOO_ARGS="--full" for the whole matrix, "--scenarios smoke,preemption" to choose).
zoo: setup
	$(PY) -m chaos.zoo $(ZOO_ARGS)

bench: setup
	$(PY) benchmarks/proxy_throughput.py
	$(PY) benchmarks/ttft_hit.py

clean:
	rm -rf $(VENV) reports/* .pytest_cache
