"""Helpers shared by the core tests: comparing nested batches, copying buffered ones, a
resume checker, a deadline guard, a check that workers die with their consumer, and mypy
run on a snippet of user code."""

import os
import select
import signal
import subprocess
import sys
import textwrap
import time
from contextlib import contextmanager
from pathlib import Path

import numpy as np


def copy_tree(x):
    """A deep copy of a batch (arrays inside tuples, dicts and lists), so that a buffered
    batch can be kept after the next one is requested."""
    if isinstance(x, dict):
        return {k: copy_tree(v) for k, v in x.items()}
    if isinstance(x, tuple):
        parts = [copy_tree(v) for v in x]
        return type(x)(*parts) if hasattr(x, "_fields") else tuple(parts)
    if isinstance(x, list):
        return [copy_tree(v) for v in x]
    if isinstance(x, (np.ndarray, np.generic)):
        return x.copy()
    return x


def leaves(x):
    """The arrays and scalars of a nested tuple/dict/list, in order."""
    if isinstance(x, dict):
        return [leaf for v in x.values() for leaf in leaves(v)]
    if isinstance(x, (tuple, list)):
        return [leaf for v in x for leaf in leaves(v)]
    return [x]


def stacked(x):
    """A list of observations stacked into arrays (through tuples and dicts), so that a
    batch given as a list compares with one given as arrays."""
    if isinstance(x, list) and x and isinstance(x[0], dict):
        return {k: stacked([o[k] for o in x]) for k in x[0]}
    if isinstance(x, list) and x and isinstance(x[0], tuple):
        return tuple(stacked([o[j] for o in x]) for j in range(len(x[0])))
    if isinstance(x, list):
        return np.array([np.asarray(o) for o in x])
    return x


def assert_tree_equal(actual, expected, path="batch"):
    """Same structure (tuple/namedtuple/dict/list kinds and keys), same array shapes,
    dtypes and values."""
    if isinstance(expected, dict):
        assert isinstance(actual, dict), f"{path}: {type(actual).__name__}, expected a dict"
        assert list(actual) == list(expected), f"{path}: keys {list(actual)} != {list(expected)}"
        for k in expected:
            assert_tree_equal(actual[k], expected[k], f"{path}[{k!r}]")
    elif isinstance(expected, (tuple, list)):
        assert type(actual) is type(expected), (
            f"{path}: {type(actual).__name__}, expected {type(expected).__name__}"
        )
        assert len(actual) == len(expected), f"{path}: length {len(actual)} != {len(expected)}"
        for k, (a, e) in enumerate(zip(actual, expected)):
            assert_tree_equal(a, e, f"{path}[{k}]")
    elif isinstance(expected, (np.ndarray, np.generic)):
        a = np.asarray(actual)
        assert a.shape == expected.shape, f"{path}: shape {a.shape} != {expected.shape}"
        assert a.dtype == expected.dtype, f"{path}: dtype {a.dtype} != {expected.dtype}"
        assert np.array_equal(a, expected, equal_nan=a.dtype.kind in "fc"), (
            f"{path}: values differ:\n{a}\n!=\n{expected}"
        )
    else:
        assert actual == expected, f"{path}: {actual!r} != {expected!r}"


def assert_fills(result, buffer):
    """Every array of ``result`` lies in the memory of the matching array of ``buffer``:
    getobs_into filled the caller's buffer rather than returning fresh arrays."""
    got, bufs = leaves(result), leaves(buffer)
    assert len(got) == len(bufs)
    for k, (g, b) in enumerate(zip(got, bufs)):
        assert isinstance(g, np.ndarray), f"leaf {k}: {type(g).__name__}, not a buffer view"
        assert g.size == 0 or np.shares_memory(g, b), (
            f"leaf {k}: the result does not lie in the caller's buffer"
        )


def run_epochs(loader, epochs):
    """The steps of ``epochs`` epochs of ``loader``, copied, as one list per epoch."""
    return [[copy_tree(step) for step in loader] for _ in range(epochs)]


def assert_resumes_exactly(make_loader, epochs=2, through=None):
    """For every stop point k of an ``epochs``-epoch run (k steps delivered, the state
    taken mid-epoch while the iterator is alive), a fresh loader restored from that state
    delivers exactly the rest of the run, following epochs included.

    ``make_loader()`` builds the loader; it must build equal loaders when its seed is fixed.
    ``through(state)``, when given, is the state as it comes back from where it was kept
    (a JSON file, numpy values): the loader is restored from that.
    Also checks that taking the state does not disturb the loader it is taken from.
    """
    reference_loader = make_loader()
    reference = [step for epoch in run_epochs(reference_loader, epochs) for step in epoch]
    steps = len(reference_loader)
    assert len(reference) == epochs * steps
    for epoch in range(epochs):
        for k in range(steps + 1):
            loader = make_loader()
            done = [step for e in run_epochs(loader, epoch) for step in e]
            it = iter(loader)
            done += [copy_tree(next(it)) for _ in range(k)]
            state = loader.state_dict()
            assert state["step"] == (k if k < steps else 0)
            assert state["epoch"] == (epoch if k < steps else epoch + 1)
            rest = [copy_tree(step) for step in it]
            rest += [step for e in run_epochs(loader, epochs - epoch - 1) for step in e]
            full = done + rest
            if loader.seed == reference_loader.seed:
                assert_tree_equal(full, reference, "uninterrupted run")

            restored = make_loader()
            restored.load_state_dict(state if through is None else through(state))
            resumed = [step for e in run_epochs(restored, epochs - state["epoch"]) for step in e]
            assert_tree_equal(resumed, rest, f"resumed after epoch {epoch} step {k}")


def load_factor():
    """How many times slower than an idle machine this one may run now: the load average
    of the last minute per CPU this process may use, at least 1. The hang guards (this
    module's ``deadline``, conftest.py's for every test) are scaled by it, so that a
    loaded machine fails no test that is merely slow."""
    return max(1.0, os.getloadavg()[0] / len(os.sched_getaffinity(0)))


@contextmanager
def deadline(seconds):
    """Raise TimeoutError in the main thread if the block runs longer than ``seconds``
    times ``load_factor()``: a hang guard, not a timing assertion."""
    limit = seconds * load_factor()

    def expire(signum, frame):
        raise TimeoutError(f"still running after {limit:.0f} s")

    previous = signal.signal(signal.SIGALRM, expire)
    signal.setitimer(signal.ITIMER_REAL, limit)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def _running(pid):
    """True while process ``pid`` exists and is not a zombie (a worker whose parent was
    killed is reaped by whoever adopts it, if ever)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            state = f.read().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError, IndexError):
        return False
    return state not in ("Z", "X")


def assert_workers_die_with_their_consumer(code, workers, within_s=5.0):
    """Runs ``code`` in a Python subprocess (the consumer) whose ``workers`` worker
    processes write their pid, a line in one write, once they are stuck; SIGKILLs the
    consumer and asserts that every worker is gone within ``within_s`` seconds (the promise
    is about one second: the bound is loose, so that a loaded machine does not fail it)."""
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    consumer = subprocess.Popen(
        [sys.executable, "-c", code],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env={**os.environ, "PYTHONPATH": root},
    )
    pids, lines = set(), b""
    try:
        end = time.monotonic() + 60
        while len(pids) < workers:
            assert time.monotonic() < end, (
                f"the workers did not start: {pids}; the consumer printed: {_output_of(consumer)}"
            )
            if select.select([consumer.stdout], [], [], 1.0)[0]:
                chunk = os.read(consumer.stdout.fileno(), 4096)
                assert chunk, consumer.stderr.read().decode()
                lines += chunk
                pids = {int(line) for line in lines.split(b"\n")[:-1]}
        consumer.kill()
        consumer.wait()
        end = time.monotonic() + within_s
        while any(_running(pid) for pid in pids) and time.monotonic() < end:
            time.sleep(0.05)
        left = [pid for pid in pids if _running(pid)]
        assert not left, f"workers {left} outlived their consumer by {within_s} s"
    finally:
        consumer.kill()
        for pid in pids:
            if _running(pid):
                os.kill(pid, signal.SIGKILL)
        consumer.stdout.close()
        consumer.stderr.close()
        consumer.wait()


def _output_of(process, within_s=5.0):
    """What a subprocess (and the children that share its stderr) printed to stderr, after
    killing it: as much as arrives within ``within_s`` seconds."""
    process.kill()
    chunks, end = [], time.monotonic() + within_s
    while time.monotonic() < end and select.select([process.stderr], [], [], 0.2)[0]:
        chunk = os.read(process.stderr.fileno(), 65536)
        if not chunk:
            break
        chunks.append(chunk)
    return b"".join(chunks).decode(errors="replace")[-4000:]


def mypy_on(code, tmp_path):
    """mypy's report on ``code`` (a module importing fastload from this checkout), and
    ``(flagged, expected)``: the lines it reports an error on, and those marked
    ``# error``."""
    import mypy.api

    root = Path(__file__).resolve().parent.parent
    (tmp_path / "snippet.py").write_text(code)
    (tmp_path / "mypy.ini").write_text(
        textwrap.dedent(f"""\
        [mypy]
        mypy_path = {root}
        cache_dir = {tmp_path / "cache"}
        python_executable = {sys.executable}
        follow_imports = silent
        [mypy-torch.*,jax.*,pyarrow.*,pandas.*,simplejpeg.*,tqdm.*,fsspec.*]
        follow_imports = skip
        ignore_missing_imports = True
        """)
    )
    config, path = str(tmp_path / "mypy.ini"), str(tmp_path / "snippet.py")
    out, err, _ = mypy.api.run(["--config-file", config, path])
    flagged = {int(line.split(":")[1]) for line in out.splitlines() if ": error:" in line}
    expected = {k for k, line in enumerate(code.splitlines(), 1) if "# error" in line}
    return out + err, flagged, expected
