# Quick start: `make demo` and `make test`; both set up .venv by themselves.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python

.PHONY: install build test demo bench clean

$(VENV)/.deps: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet "setuptools>=64" wheel "Cython>=3.0" "numpy>=1.25"
	$(PY) -m pip install --quiet --no-build-isolation -e '.[test]'
	touch $@

install: $(VENV)/.deps

# Incremental: recompiles only the native units that changed since the last build.
build: install
	$(PY) setup.py --quiet build_ext --inplace

test: build
	$(PY) -m pytest -q

demo: build
	$(PY) -m fastload demo

bench: build
	$(PY) bench/tensor.py

clean:
	rm -rf build $(VENV) fastload/*.so fastload/_*.c
