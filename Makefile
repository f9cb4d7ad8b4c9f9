# Quick start: `make demo` (set up + run the main job on the tiny preset), `make test`.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: demo test test-all lint clean

$(STAMP): pyproject.toml requirements.lock
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -c requirements.lock -e '.[dev]'
	touch $(STAMP)

demo: $(STAMP)
	$(BIN)/toolchain demo

test: $(STAMP)
	$(BIN)/lint-imports
	$(BIN)/pytest -q -m "not slow and not darwin and not device"

test-all: $(STAMP)
	$(BIN)/pytest -q -m "not darwin and not device"

clean:
	rm -rf $(VENV) build *.egg-info
