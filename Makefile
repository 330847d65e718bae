# Reliability Console. Fresh machine: `make run` (the product) and `make test` (the tests).
PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
# Tests run against PostgreSQL (pytest-django creates and drops test_<name>).
TEST_DATABASE_URL ?= postgresql://postgres@127.0.0.1:5432/reliability_console

.PHONY: run test test-fast bench bench-compare profile chaos lint format install clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip

$(STAMP): pyproject.toml | $(BIN)/python
	$(BIN)/pip install --quiet -e ".[dev,local,psycopg2]"
	touch $(STAMP)

install: $(STAMP)

run: install
	$(BIN)/python scripts/run_local.py

test: install lint
	DATABASE_URL=$${DATABASE_URL:-$(TEST_DATABASE_URL)} $(BIN)/python -m pytest $(PYTEST_ARGS)

# The loop while working (under 3 minutes): tests/unit and tests/integration without the tests marked acceptance,
# processes, browser or slow (pyproject says what each means); a redis-server starts only for a test that asks.
test-fast: install
	DATABASE_URL=$${DATABASE_URL:-$(TEST_DATABASE_URL)} $(BIN)/python -m pytest tests/unit tests/integration \
		-m "not acceptance and not processes and not browser and not slow" $(PYTEST_ARGS)

bench: install
	$(BIN)/pip install --quiet -e ".[bench]"
	$(BIN)/python scripts/bench.py $(BENCH_ARGS)

# The engine's 1-step, batch and 10-step figures of this tree beside BASE's (a commit; default HEAD), one run,
# alternating rounds: what a change costs. `make bench-compare BASE=7c7f784 COMPARE_ARGS="--rounds 7"`.
BASE ?= HEAD
bench-compare: install
	$(BIN)/pip install --quiet -e ".[bench]"
	$(BIN)/python scripts/bench_compare.py --base $(BASE) $(COMPARE_ARGS)

# Where a worker's time goes while it drains 10-step tasks (py-spy), and each task's commits and Redis commands.
profile: install
	$(BIN)/pip install --quiet -e ".[bench]"
	$(BIN)/python scripts/profile_engine.py $(PROFILE_ARGS)

# A fault campaign against a real deployment on this machine (`make chaos CHAOS_ARGS="--help"` lists its options).
chaos: install
	$(BIN)/python -m chaos $(CHAOS_ARGS)

lint: install
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

format: install
	$(BIN)/ruff check --fix .
	$(BIN)/ruff format .

clean:
	rm -rf $(VENV) var .pytest_cache .ruff_cache
