# detq: `make demo` and `make test` do all set-up on a fresh machine (a .venv with the project installed).
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip

.PHONY: install install-dev bytecode lint format test test-unit test-fast demo bench services clean

$(PY):
	$(PYTHON) -m venv $(VENV)
	$(PIP) install --quiet --upgrade pip

$(VENV)/.installed: pyproject.toml | $(PY)
	$(PIP) install --quiet -e '.[worker]'
	touch $@

$(VENV)/.installed-dev: pyproject.toml | $(PY)
	$(PIP) install --quiet -e '.[worker,dev]'
	touch $@ $(VENV)/.installed

install: $(VENV)/.installed

install-dev: $(VENV)/.installed-dev

# An editable install leaves our own modules uncompiled, and where PYTHONDONTWRITEBYTECODE is set (as on
# the CI machines) each detq command, worker and pool process would compile them again: about 0.2 s
# more at every command's start. compileall writes what is missing or stale, and is quick otherwise.
bytecode: install
	$(PY) -m compileall -q cli detq db producer dispatch worker demo bench

lint: install-dev
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/mypy
	$(VENV)/bin/lint-imports --no-cache
	$(PY) scripts/check_layout.py

format: install-dev
	$(VENV)/bin/ruff format .
	$(VENV)/bin/ruff check --fix .

# Starts Redis/PostgreSQL only if they are not answering (CI machines start them before the run).
services:
	bash scripts/ensure_services.sh

# Everything: the linters, then every test, the 20 slowest named at the end. TEST_PROCESSES=2 runs two test
# processes side by side (pytest-xdist; each its own Redis database, PostgreSQL databases and one intra-op
# thread): 16 min instead of about 30 on 2 cores (2026-12-08), but the load it adds once wedged a Celery
# pool whose child was SIGKILLed mid-hand-off (test_recovery's killed pool process: no task taken again),
# so CI runs them one at a time until that is mended.
TEST_PROCESSES ?= 0
test: install-dev lint services bytecode
	$(PY) -m pytest -n $(TEST_PROCESSES) --durations=20

# The tests not marked integration: no detq worker process (the ledger's tests use PostgreSQL where it answers).
test-unit: install-dev
	$(PY) -m pytest -m "not integration"

# The tier to run after every change: pure logic and in-process, neither integration nor slow, in two test
# processes (no worker pool here to load: 73 s against 91 to 102 s in one, measured on 2 cores).
FAST_PROCESSES ?= 2
test-fast: install-dev
	$(PY) -m pytest -q -n $(FAST_PROCESSES) -m "not integration and not slow"

demo: install bytecode
	$(VENV)/bin/detq demo

$(VENV)/.installed-bench: pyproject.toml | $(VENV)/.installed-dev
	$(PIP) install --quiet -e '.[worker,dev,bench]'
	touch $@

# The benchmark suite (bench/): 45 to 70 min on 2 cores (the scale table about 7 of them) (two rounds, as every documented run); python -m bench --help for smaller runs.
bench: install-dev services $(VENV)/.installed-bench bytecode
	$(PY) -m bench $(BENCH_ARGS)

clean:
	rm -rf $(VENV) .detq demo-output .mypy_cache .ruff_cache .pytest_cache
