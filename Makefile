# The two set-up commands of the README: `make demo` (a real conversion with validation, offline) and `make test`.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
DEMO := build/demo

.PHONY: demo test install

install: $(VENV)/.installed

# torch 2.13.0 first: its CPU wheel is what this project pins (see README, "torch and torchax").
$(VENV)/.installed: setup.cfg
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
# two, not one per core, bounds memory
test: install
	$(PY) -m pytest -q -n 2 --dist loadscope --no-loadscope-reorder
