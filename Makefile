# profiling-agent: `make run` (embedded offline default) and `make test` install what they need first.
VENV   ?= .venv
PYTHON ?= python3
BIN     = $(VENV)/bin
# torch 2.13.0 CPU: on this kind of machine pip takes it from local disk; elsewhere add
# TORCH_INDEX="--index-url https://download.pytorch.org/whl/cpu" to avoid a multi-GB CUDA build.
TORCH_SPEC  ?= torch==2.13.0
TORCH_INDEX ?=

.PHONY: install run test lint bench clean

install: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -qq --upgrade pip
	$(BIN)/python -m pip install -qq $(TORCH_INDEX) "$(TORCH_SPEC)"
	$(BIN)/python -m pip install -qq -e ".[dev]"
	touch $@

run: install
	$(BIN)/profiling-agent run

test: install
	$(BIN)/ruff check .
	$(BIN)/python -m pytest -q -p no:cacheprovider

lint: install
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

bench: install
	$(BIN)/python bench/architectures.py --quick --threads 1
	$(BIN)/python bench/paper_tables.py --quick

clean:
	rm -rf runs .pytest_cache
