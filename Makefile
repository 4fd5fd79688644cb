# fusegen: `make demo` builds the examples and checks them on the CPU interpreter; `make test` runs the suite.
PY ?= python3.11
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: demo test lint regen bench smoke help

help:  ## list targets
	@grep -E '^[a-z]+:.*##' $(MAKEFILE_LIST) | sed 's/:.*## /\t/'

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	# the CPU build of torch first: an unpinned torch would pull several GB of CUDA packages
	$(BIN)/pip install -q torch==2.13.0
	$(BIN)/pip install -q -e '.[dev]'
	touch $(STAMP)

demo: $(STAMP)  ## build every example spec and check the kernels on the interpreter
	$(BIN)/fusegen build examples/*.spec
	$(BIN)/fusegen check examples/*.spec

test: $(STAMP)  ## lint, type-check, verify generated/ is fresh, run the test suite
	$(BIN)/ruff check fusegen tests bench
	$(BIN)/mypy
	$(BIN)/fusegen build --check
	$(BIN)/pytest -n 2

regen: $(STAMP)  ## rebuild generated/ from examples/
	$(BIN)/fusegen build examples/*.spec

bench: $(STAMP)  ## print the benchmark ratios
	for b in bench/*.py; do $(BIN)/python $$b || exit 1; done

smoke: $(STAMP)  ## build the wheel, install it in a fresh venv, use it from an empty folder (also in `make test`)
	.ci/wheel-smoke $(BIN)/python
