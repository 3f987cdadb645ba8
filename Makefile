# The two front doors: `make demo` and `make test`. Each builds .venv from nothing.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
OUTPUT ?= output/quickstart

.PHONY: demo test test-fast venv clean

venv: $(VENV)/.installed

$(VENV)/.installed: setup.cfg pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[test]'
	touch $@

## Train the quickstart model across 2 local workers with tfdist launch.
demo: venv
	$(BIN)/tfdist validate configs/quickstart.yaml
	$(BIN)/tfdist launch configs/quickstart.yaml -- \
		$(BIN)/python examples/quickstart/train.py --config configs/quickstart.yaml \
		--output_dir $(OUTPUT)
	@echo "Metrics written to $(OUTPUT)/metrics.json"

## The whole test suite, multi-process tests included.
test: venv
	$(BIN)/python -m pytest

## Everything but the multi-process tests (a quick local loop).
test-fast: venv
	$(BIN)/python -m pytest -m "not multiprocess"

clean:
	rm -rf $(VENV) output .pytest_cache
