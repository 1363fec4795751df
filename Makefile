# The two set-up commands of the README: `make demo` (a real conversion with validation, offline) and `make test`.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
DEMO := build/demo

FLOORS := .venv-floors

.PHONY: demo test test-fast test-family install test-floors

install: $(VENV)/.installed

# torch 2.13.0 first: its CPU wheel lies on this project's machines (a plain `torch` would take a multi-GB CUDA build).
# pip byte-compiles at install (torch: 16 s of its 23): where PYTHONDONTWRITEBYTECODE is set, as on this project's
# machines, a process would otherwise compile every module it imports from source, every time
PIP := -m pip install -q
$(VENV)/.installed: setup.cfg setup.py
	$(PYTHON) -m venv $(VENV)
	$(PY) $(PIP) --upgrade pip
	$(PY) $(PIP) torch==2.13.0
	$(PY) $(PIP) -e '.[test]'
	touch $@

demo: install
	rm -rf $(DEMO)
	$(VENV)/bin/vae-convert random-checkpoint wan2.1 $(DEMO)/wan2.1-random
	$(VENV)/bin/vae-convert wan2.1 --source $(DEMO)/wan2.1-random --to flax --out $(DEMO)/wan2.1-flax
	$(VENV)/bin/vae-convert wan2.1 --source $(DEMO)/wan2.1-random --to torchax --dtype bfloat16 --out $(DEMO)/wan2.1-torchax

# two workers (two, not one per core, bounds memory), each taking whole work units: a module, or one family's case of
# a generic module (tests/conftest.py), so module fixtures convert once; the slowest first so that neither worker idles
# at the end. A worker that crashes is replaced once (xdist reruns its unit from the start): a second crash ends the
# run with the test named rather than rerunning the unit until CI's time is out
PYTEST := $(PY) -m pytest -q -n 2 --dist loadgroup --no-loadscope-reorder --max-worker-restart=1
# the run's report (build/test-report.xml) is what `python -m tests.costs` turns into docs/testing.md's cost tables
test: install
	$(PYTEST) --junitxml=build/test-report.xml

# the inner loop, under 5 minutes: every family's default-architecture parity on both targets at its longest input,
# the protocol, every module's basic behaviour; what costs more is marked slow where it is written
test-fast: install
	$(PYTEST) -m "not slow"

# every test of one family (F=wan, F=ltx, ...): its cases of the generic tests and its own test file
test-family: install
	$(PYTEST) --family $(F)

# The lowest releases setup.cfg allows (constraints-floors.txt; torch: the CPU wheel, see that file), on the fast tier
# of the tests that cover each family and target, load, export and the mappings: every registered family's
# default-architecture decode on both targets at its longest input, which runs every step of the decode (an encode,
# like the other inputs and configs, calls the same library functions in other arrangements; test_export.py's
# validated conversions encode at the floors too). The mapping engine runs at the floors in test_published_configs.py,
# which plans every published config through it ('check-mappings' over every config and target is the main suite's)
FLOOR_TESTS := tests/test_parity.py tests/test_model_api.py tests/test_export.py tests/test_published_configs.py
$(FLOORS)/.installed: setup.cfg setup.py constraints-floors.txt
	$(PYTHON) -m venv $(FLOORS)
	$(FLOORS)/bin/python $(PIP) --upgrade pip
	$(FLOORS)/bin/python $(PIP) torch==2.13.0
	grep -v '^torch==' constraints-floors.txt > $(FLOORS)/constraints.txt
	$(FLOORS)/bin/python $(PIP) -c $(FLOORS)/constraints.txt -e '.[test]'
	touch $@

test-floors: $(FLOORS)/.installed
	$(FLOORS)/bin/vae-convert --version
	$(FLOORS)/bin/python -m pytest -q -n 2 --dist loadgroup -m "not slow" -k "not test_encode_matches_diffusers" $(FLOOR_TESTS)
