# jobwire developer targets. `make serve` and `make test` work on a fresh machine.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
# The hot modules setup.py compiles with mypyc: editing one reinstalls (recompiles) before
# `make test` or `make serve`, so they never run a stale build (src/jobwire/native.py).
NATIVE_SOURCES := $(shell $(PYTHON) src/jobwire/native.py)

.PHONY: install serve test lint bench bench-e2e bench-pg-peers bench-zmq gearmand-tests clean

install: $(STAMP)

# JOBWIRE_PURE=1 make install: no compiling, the pure-Python modules only.
$(STAMP): pyproject.toml setup.py src/jobwire/native.py src/jobwire/_zmqframes.c $(NATIVE_SOURCES)
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[dev]'
	$(BIN)/jobwire --version
	touch $(STAMP)

serve: install
	$(BIN)/jobwire serve

test: install
	$(BIN)/python -m pytest

lint: install
	$(BIN)/ruff check src tests
	$(BIN)/ruff format --check src tests
	$(BIN)/mypy

bench: install
	$(BIN)/python bench/run.py

# End to end through the Python SDK vs Dramatiq, Celery, RQ and arq (needs local Redis and
# RabbitMQ); the peers go into their own venv, bench/.venv-peers, created on first run.
bench-e2e: install
	$(BIN)/python bench/e2e.py

# jobwire on the PostgreSQL store vs pgqueuer and procrastinate on the local PostgreSQL (a
# database of its own, dropped after); the peers go into bench/.venv-pg-peers on first run.
bench-pg-peers: install
	$(BIN)/python bench/pg_peers.py

# Majordomo: jobwire vs the ZeroMQ Guide's Python and C brokers and majortomo (fetched and
# built into bench/.zmq-peers/ on first run; needs libzmq3-dev and libczmq-dev).
bench-zmq: install
	$(BIN)/python bench/zmq.py

# gearmand 1.1.20's own test programs (t/cli, t/client, t/worker, ...) against jobwire: built
# from gearmand's repository into build/gearmand-suite on first run (GEARMAND_SRC=PATH takes
# a local clone; GEARMAND_SERVER=both adds the gearmand baseline). Prints a pass/fail table.
gearmand-tests: install
	JOBWIRE=$(abspath $(BIN))/jobwire PYTHON=$(abspath $(BIN))/python tests/gearmand_suite/run.sh

clean:
	rm -rf $(VENV) bench/.venv-peers bench/.venv-pg-peers bench/.zmq-peers jobwire-data build .pytest_cache .mypy_cache .ruff_cache
	find src -name '*.so' -delete
	rm -f src/jobwire/native-build.txt
