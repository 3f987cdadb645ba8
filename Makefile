# The two front doors: `make demo` and `make test`. Each builds .venv from nothing.
PYTHON ?= python3
# Python keeps what it compiles (__pycache__). An environment that sets PYTHONDONTWRITEBYTECODE
# (this project's machines do) made every process of the suite compile tfdist again, and every
# process of the version matrix (installed --no-compile) all of TensorFlow: 16 CPU-s an import
# of TensorFlow and Keras there instead of 5.
unexport PYTHONDONTWRITEBYTECODE
VENV ?= .venv
BIN := $(VENV)/bin
OUTPUT ?= output/unet
DEMO_CONFIG ?= configs/unet_multi_worker_mirrored.yaml

.PHONY: demo test test-fast docs matrix report report-full venv clean

venv: $(VENV)/.installed

$(VENV)/.installed: setup.cfg pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[tensorflow,test,plots,tensorboard,docs]'
	touch $@

## Train the UNet on synthetic shapes across 2 local workers with tfdist launch.
demo: venv
	$(BIN)/tfdist validate $(DEMO_CONFIG)
	$(BIN)/tfdist launch $(DEMO_CONFIG) -- \
		$(BIN)/python examples/unet_segmentation/train.py --config $(DEMO_CONFIG) \
		--output_dir $(OUTPUT)
	@echo "Done. Images and metrics: $(OUTPUT)/predictions.png $(OUTPUT)/curves.png $(OUTPUT)/metrics.json"

## The whole test suite, multi-process tests included: two test processes, a file each at a
## time (module fixtures stay shared within a file), the slowest files first
## (tests/conftest.py's SLOWEST_FIRST, not xdist's order by test count).
PYTEST_PARALLEL ?= -n 2 --dist loadfile --no-loadscope-reorder

test: venv
	$(BIN)/python -m pytest $(PYTEST_PARALLEL)

## Everything but the multi-process tests (a quick local loop).
test-fast: venv
	$(BIN)/python -m pytest $(PYTEST_PARALLEL) -m "not multiprocess"

## The documentation site, docs/_build/html: warnings are errors (a public name without a
## docstring, a broken internal link, a docstring rst cannot read);
## tests/unit/project/test_docs.py builds it in the suite.
docs: venv
	$(BIN)/python -m sphinx -E -W --keep-going -q -b html docs docs/_build/html
	@echo "Built: docs/_build/html/index.html"

## Every other TensorFlow of the supported range, with the lowest and the newest Keras,
## one virtual environment per TensorFlow under .venv-matrix/ (.ci/matrix.py).
matrix: venv
	$(BIN)/python .ci/matrix.py

## The benchmark report (root: network namespaces), regenerating docs/benchmarks.md.
report: venv
	cd benchmarks && $(abspath $(BIN))/python report.py --quick

report-full: venv
	cd benchmarks && $(abspath $(BIN))/python report.py

clean:
	rm -rf $(VENV) .venv-matrix output .pytest_cache
