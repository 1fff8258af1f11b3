# profiling-agent: `make run` (embedded offline default) and `make test` install what they need first.
VENV   ?= .venv
PYTHON ?= python3
BIN     = $(VENV)/bin
# torch 2.13.0 CPU: on this kind of machine pip takes it from local disk; elsewhere add
# TORCH_INDEX="--index-url https://download.pytorch.org/whl/cpu" to avoid a multi-GB CUDA build.
TORCH_SPEC  ?= torch==2.13.0
TORCH_INDEX ?=

.PHONY: install run test test-fast test-floors lint typecheck bench clean
# mypy sees the repository root as the package profiling_agent through this link (the editable install's
# import hook is invisible to it)
TYPECHECK_ROOT = .typecheck
PACKAGES = state schemas graph nodes tools prompts

install: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -qq --upgrade pip
	$(BIN)/python -m pip install -qq $(TORCH_INDEX) "$(TORCH_SPEC)"
	$(BIN)/python -m pip install -qq -e ".[dev]"
	touch $@

run: install
	$(BIN)/profiling-agent run

# test files run on this many processes (pytest-xdist; a file stays in one process, so its fixtures are built
# once), in the conftest's order (longest first, from tests/file_seconds.json); 1 runs them in this process
TEST_PROCS ?= 2
PYTEST = $(BIN)/python -m pytest -q -p no:cacheprovider \
	$(if $(filter-out 1,$(TEST_PROCS)),-n $(TEST_PROCS) --dist loadfile --no-loadscope-reorder)

# the whole suite; the 15 slowest tests are listed at the end, and every test's seconds go to .cache/junit.xml
# (`python tests/helpers/file_seconds.py .cache/junit.xml` turns them into the order's table)
test: lint typecheck
	$(PYTEST) --durations=15 --junitxml=.cache/junit.xml

# the fast tier is the tree's: tests/unit (tools, routers, parsers, records; no whole run); tests/e2e holds whole runs
test-fast: install
	$(PYTEST) tests/unit

# the declared floors: the lowest version pyproject.toml allows of every direct dependency, in a second environment
# (.cache/floors-venv, uv's lowest-direct resolution), and the unit tier there
test-floors:
	PYTHON="$(PYTHON)" TORCH_INDEX="$(TORCH_INDEX)" TEST_PROCS="$(TEST_PROCS)" .ci/floors

lint: install
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

typecheck: install
	mkdir -p $(TYPECHECK_ROOT) && ln -sfn .. $(TYPECHECK_ROOT)/profiling_agent
	cd $(TYPECHECK_ROOT) && $(abspath $(BIN))/mypy --config-file ../pyproject.toml $(addprefix -p profiling_agent.,$(PACKAGES))

bench: install
	$(BIN)/python bench/architectures.py --quick --threads 1
	$(BIN)/python bench/paper_tables.py --quick

clean:
	rm -rf runs .pytest_cache
