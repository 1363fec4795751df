# The two set-up commands of the README: `make demo` (a real conversion with validation, offline) and `make test`.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
DEMO := build/demo

FLOORS := .venv-floors

.PHONY: demo test test-fast install test-floors

install: $(VENV)/.installed

# torch 2.13.0 first: its CPU wheel lies on this project's machines (a plain `torch` would take a multi-GB CUDA build)
$(VENV)/.installed: setup.cfg setup.py
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q torch==2.13.0
	$(PY) -m pip install -q -e '.[test]'
	touch $@

demo: install
	rm -rf $(DEMO)
	$(VENV)/bin/vae-convert random-checkpoint wan2.1 $(DEMO)/wan2.1-random
	$(VENV)/bin/vae-convert wan2.1 --source $(DEMO)/wan2.1-random --to flax --out $(DEMO)/wan2.1-flax
	$(VENV)/bin/vae-convert wan2.1 --source $(DEMO)/wan2.1-random --to torchax --dtype bfloat16 --out $(DEMO)/wan2.1-torchax

# two workers, whole modules each (their fixtures convert once per module), the slowest modules first (tests/conftest.py);
# two, not one per core, bounds memory. A worker that crashes is replaced once (xdist reruns its module from the
# start): a second crash ends the run with the test named rather than rerunning the module until CI's time is out
PYTEST := $(PY) -m pytest -q -n 2 --dist loadscope --no-loadscope-reorder --max-worker-restart=1
test: install
	$(PYTEST)

# the inner loop: every module's basic cases (tests/conftest.py marks the rest slow), under 5 minutes
test-fast: install
	$(PYTEST) -m "not slow"

# The lowest releases setup.cfg allows (constraints-floors.txt; torch: the CPU wheel, see that file), on the tests
# that cover each family and target, load, export and the mappings
FLOOR_TESTS := tests/test_parity.py tests/test_model_api.py tests/test_export.py tests/test_published_configs.py
# each family's default architecture, both targets: the other small configs and layouts, and Qwen-Image (Wan's code
# under another class), call the same library functions in other arrangements
FLOOR_SELECTION := not full_size and not fine_tuned and not qwenimage and not other-config and not 3-levels \
	and not wan2.2-layout and not ltx-0.9.5 and not ltx-2.3 and not variant
$(FLOORS)/.installed: setup.cfg setup.py constraints-floors.txt
	$(PYTHON) -m venv $(FLOORS)
	$(FLOORS)/bin/python -m pip install -q --upgrade pip
	$(FLOORS)/bin/python -m pip install -q torch==2.13.0
	grep -v '^torch==' constraints-floors.txt > $(FLOORS)/constraints.txt
	$(FLOORS)/bin/python -m pip install -q -c $(FLOORS)/constraints.txt -e '.[test]'
	touch $@

test-floors: $(FLOORS)/.installed
	$(FLOORS)/bin/vae-convert --version
	$(FLOORS)/bin/python -m pytest -q -n 2 --dist loadscope -k "$(FLOOR_SELECTION)" $(FLOOR_TESTS)
	$(FLOORS)/bin/vae-convert check-mappings
