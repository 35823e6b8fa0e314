# jobwire developer targets. `make serve` and `make test` work on a fresh machine.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: install serve test lint bench bench-e2e clean

install: $(STAMP)

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[dev]'
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

clean:
	rm -rf $(VENV) bench/.venv-peers jobwire-data .pytest_cache .mypy_cache .ruff_cache
