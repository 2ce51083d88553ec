# Fresh machine: `make demo` or `make test`. Both create .venv if missing and install what they need.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed-$(shell cat setup.cfg pyproject.toml | cksum | cut -d' ' -f1)

.PHONY: demo test lint typecheck check models clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip

# Reinstall whenever setup.cfg/pyproject.toml change.
$(STAMP): $(BIN)/python setup.cfg pyproject.toml
	$(BIN)/python -m pip install --quiet -e '.[dev]'
	rm -f $(VENV)/.installed-*
	touch $@

demo: $(STAMP)
	$(BIN)/coinf demo

test: $(STAMP)
	$(BIN)/ruff check .
	$(MAKE) --no-print-directory typecheck
	$(BIN)/python -m pytest -q

lint: $(STAMP)
	$(BIN)/ruff check .

# mypy does not follow the editable install's folder -> coinf.* mapping: check an installed copy.
typecheck: $(STAMP)
	rm -rf build/typecheck
	$(BIN)/python -m pip install --quiet --no-deps --no-compile --target build/typecheck . >/dev/null
	cd build/typecheck && ../../$(BIN)/mypy --config-file ../../setup.cfg --cache-dir ../../.mypy_cache -p coinf

check: lint typecheck test

# Rebuild the committed zoo files from their builders (needs the `models` extra: torch==2.13.0).
models: $(STAMP)
	$(BIN)/coinf models build --all --out models/onnx

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache .mypy_cache .ruff_cache
