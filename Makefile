# dtsim: `make run` simulates the quick-start scenario, `make test` runs the whole suite.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
OUT ?= out

.PHONY: run test lint typecheck unit notebooks bench clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)

$(VENV)/.run-installed: pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install --quiet --disable-pip-version-check -e .
	@touch $@

# torch is pinned to the CPU wheel and installed before the extras, so pip never pulls CUDA
$(VENV)/.test-installed: pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install --quiet --disable-pip-version-check torch==2.13.0
	$(BIN)/python -m pip install --quiet --disable-pip-version-check -e '.[calibrate,dist,notebooks,dev]'
	@touch $@ $(VENV)/.run-installed

run: $(VENV)/.run-installed
	@mkdir -p $(OUT)
	$(BIN)/dtsim run scenarios/quickstart.yaml --report $(OUT)/quickstart.html --trace $(OUT)/quickstart.json.gz
	$(BIN)/dtsim run scenarios/quickstart.yaml --set parallelism.tp=2 --set parallelism.pp=2 --quiet \
		--report $(OUT)/quickstart-tp2-pp2.html --trace $(OUT)/quickstart-tp2-pp2.json.gz
	@echo "open $(abspath $(OUT))/quickstart.html in a browser; load the .json.gz traces in https://ui.perfetto.dev"

test: $(VENV)/.test-installed lint typecheck unit notebooks

lint: $(VENV)/.test-installed
	$(BIN)/ruff check simulator tests bench

typecheck: $(VENV)/.test-installed
	$(BIN)/mypy

unit: $(VENV)/.test-installed
	$(BIN)/python -m pytest -q

# every notebook runs top to bottom in its own folder (nbmake), so none can rot
notebooks: $(VENV)/.test-installed
	DTSIM_STATIC_FIGURES=0 $(BIN)/python -m pytest -q -p no:cacheprovider --nbmake --nbmake-timeout=300 notebooks/*.ipynb

bench: $(VENV)/.run-installed
	$(BIN)/python bench/bench_engine.py
	$(BIN)/python bench/bench_scale.py
	$(BIN)/python bench/bench_solver.py --quick
	$(BIN)/python bench/bench_sweep.py
	$(BIN)/python bench/bench_megatron_order.py --repeats 1

clean:
	rm -rf $(VENV) $(OUT) .pytest_cache .mypy_cache .ruff_cache
