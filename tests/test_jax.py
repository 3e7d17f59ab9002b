"""Smoke test of the JAX integration.

It runs in a child process: JAX starts threads of its own, and the other tests fork
(os.fork, the process backend), which is unsafe in a process where JAX runs.
"""

import importlib.util
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("jax") is None,
    reason="jax is not installed (pip install 'fastload[jax]')",
)

CHECK = """
import jax, numpy as np
from fastload import DataLoader, mapobs
from fastload.jax import prefetch_to_device

data = {"x": mapobs(lambda v: v + 1, np.arange(60, dtype=np.float32).reshape(30, 2)),
        "y": np.arange(30, dtype=np.int32)}
for buffer in (True, False):
    make = lambda: DataLoader(data, batch_size=4, shuffle=True, seed=2, parallel=2,
                              buffer=buffer)
    expected = [{k: np.array(v) for k, v in b.items()} for b in make()]
    got = list(prefetch_to_device(make(), size=3))
    assert len(got) == len(expected) == 8
    for g, e in zip(got, expected):
        assert isinstance(g["x"], jax.Array) and isinstance(g["y"], jax.Array)
        assert all(np.array_equal(np.asarray(g[k]), e[k]) for k in e)
try:
    next(prefetch_to_device([], size=0))
except ValueError:
    print("ok")
"""


def test_prefetch_to_device_yields_jax_arrays_equal_to_the_batches_and_checks_size():
    child = subprocess.run(
        [sys.executable, "-c", CHECK],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "PYTHONPATH": ROOT, "JAX_PLATFORMS": "cpu"},
    )
    assert child.returncode == 0 and child.stdout.strip() == "ok", child.stderr[-3000:]
