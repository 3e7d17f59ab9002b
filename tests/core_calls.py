"""Runs calls of fastload._core, given as Python expressions, one after the other in a
child process, and reports each: a call which kills the interpreter kills only the child.
``run(expressions)`` starts the child (this file as a script) and returns what it reported.

    python tests/core_calls.py < calls.json     (a JSON list of expressions)

Before each call the child writes ``start <i>`` to stdout, after it ``ok <i>`` or
``raised <i> <type>: <message>``, and ``done`` at the end, after a garbage collection and a
pool shutdown (so that a crash in a destructor or on a pool thread shows too). The
expressions may use the names of NAMESPACE: numpy, the module, and the builders below of
arrays, encoded images and ready objects of each class of the module. Memory is capped, so
a call asking for a huge array fails with MemoryError instead of taking the machine's
memory.

After each call the child does what a careless caller does next (``aftermath``): it writes
over every array the call was given (made by ``arr``, read-only ones made writeable
first), then iterates what the call made or started (up to a few steps of each
iteration; none of a gated one, which waits for a gate nothing here opens), so that
whatever the binding kept of the caller's arrays is used after they changed.
"""

import contextlib
import gc
import io
import json
import os
import resource
import subprocess
import sys
from pathlib import Path

import numpy as np

import fastload
from fastload import _core, limits
from fastload._base.tree import LeafKind
from fastload._images import codecs

MEMORY_CAP_BYTES = 3 << 30
# The child imports the fastload under test, wherever this script lies.
PACKAGE_ROOT = Path(fastload.__file__).resolve().parent.parent


def run(expressions, timeout_s=120):
    """Runs the calls in one child: (its return code, or "hung" if it ran past timeout_s;
    the index of the last call started, or None; its output)."""
    path = os.pathsep.join([str(PACKAGE_ROOT), os.environ.get("PYTHONPATH", "")])
    try:
        done = subprocess.run(
            [sys.executable, __file__],
            input=json.dumps(expressions),
            capture_output=True,
            text=True,
            timeout=timeout_s,
            cwd=PACKAGE_ROOT,
            env={**os.environ, "PYTHONPATH": path, **_sanitizer_cap()},
        )
    except subprocess.TimeoutExpired as exc:
        stdout = exc.stdout.decode() if isinstance(exc.stdout, bytes) else exc.stdout or ""
        return "hung", _last_started(stdout), stdout
    return done.returncode, _last_started(done.stdout), done.stdout + done.stderr


def _under_asan():
    return "libasan" in os.environ.get("LD_PRELOAD", "")


def _sanitizer_cap():
    """Under AddressSanitizer (``make sanitize``) the memory cap is ASan's own: its shadow
    memory reserves far more address space than any RLIMIT_AS would let it map."""
    if not _under_asan():
        return {}
    options = os.environ.get("ASAN_OPTIONS", "")
    cap = f"allocator_may_return_null=1:max_allocation_size_mb={MEMORY_CAP_BYTES >> 20}"
    return {"ASAN_OPTIONS": f"{options}:{cap}" if options else cap}


def _last_started(stdout):
    started = [int(line.split()[1]) for line in stdout.splitlines() if line.startswith("start")]
    return started[-1] if started else None


def completed(code, output):
    """Whether a child ran every call and ended normally."""
    return code == 0 and "\ndone\n" in output


# What the running call was given and made: arrays (from arr) and iterations (from
# iteration, or returned), for the aftermath.
GIVEN = []
MADE = []
STEPS_AFTER = 3  # steps of each iteration loaded after its arrays changed


def arr(shape, dtype="uint8", layout="c"):
    """An array of `shape` and `dtype` filled with a pattern, laid out as `layout` says:
    c, f (Fortran order), strided (every other column), reversed (rows backwards),
    readonly, or scalar (0-d)."""
    a = _pattern(shape, dtype, layout)
    GIVEN.append(a)
    return a


def _pattern(shape, dtype, layout):
    if layout == "scalar":
        return np.array(7, dtype)
    size = int(np.prod(shape)) if shape else 1
    if layout == "strided" and len(shape) > 1:
        wide = (*shape[:-1], shape[-1] * 2)
        return (np.arange(int(np.prod(wide))) % 251).astype(dtype).reshape(wide)[..., ::2]
    a = (np.arange(size) % 251).astype(dtype).reshape(shape)
    if layout == "f":
        return np.asfortranarray(a)
    if layout == "reversed" and a.ndim:
        return a[::-1]
    if layout == "readonly":
        a.flags.writeable = False
    return a


def scribble(a, k):
    """Writes over array `a` (made writeable if it can be) with the k-th of a few hostile
    values of its dtype: its largest, its smallest, -1 or NaN."""
    if not a.flags.writeable:
        try:
            a.flags.writeable = True
        except ValueError:
            return  # a view of memory that is not writeable: nobody can change it
    kind = a.dtype.kind
    if kind in "iu":
        info = np.iinfo(a.dtype)
        a[...] = [info.max, info.min, info.max // 2 + 1][k % 3]
    elif kind == "f":
        a[...] = [np.nan, np.inf, -1e30][k % 3]
    elif kind == "b":
        a[...] = k % 2 == 0


def aftermath(result, k):
    """What a caller does after call k, which returned `result`: writes over the arrays it
    gave, then loads a few steps of each iteration the call made or started."""
    for a in GIVEN:
        scribble(a, k)
    if isinstance(result, _core.Iteration):
        MADE.append(result)
    # A Python exception is a fine answer here too: only a dead interpreter is not. A gated
    # run is not iterated: it waits, by its contract, until another thread opens its gate
    # (``Iteration.gate``), and nothing here does; it is still closed.
    for it in MADE:
        with contextlib.suppress(Exception):
            for _ in range(0 if it.is_gated else STEPS_AFTER):
                next(it)
        with contextlib.suppress(Exception):
            it.close()  # the call's transport may not close: nothing more is loaded


def qoi(h, w, c=3):
    """A QOI stream of an h x w x c image (3 or 4 channels)."""
    return _core.qoi_encode(arr((h, w, c)))


def jpeg(h, w):
    """A baseline JPEG of an h x w RGB image (encoded by Pillow)."""
    from PIL import Image

    out = io.BytesIO()
    Image.fromarray(arr((h, w, 3))).save(out, "JPEG", quality=90)
    return out.getvalue()


def png(h, w):
    """A PNG of an h x w RGB image (decoded through Pillow by image sources)."""
    from PIL import Image

    out = io.BytesIO()
    Image.fromarray(arr((h, w, 3))).save(out, "PNG")
    return out.getvalue()


def cut(data, n):
    """`data` cut to its first n bytes: a truncated stream."""
    return bytes(data)[:n]


def flipped(data, at):
    """`data` with the byte at position `at` (modulo the length) inverted."""
    b = bytearray(data)
    if b:
        b[at % len(b)] ^= 0xFF
    return bytes(b)


PIPELINES = [
    {},
    {"crop": "center", "crop_size": (3, 3)},
    {"crop": "random_resized", "crop_size": (4, 5), "scale": (0.08, 1.0), "ratio": (0.75, 1.33)},
    {"resize": "shorter", "resize_size": (6, 6), "crop": "random", "crop_size": (4, 4),
     "padding": 1, "flip_p": 0.5},
    {"resize": "exact", "resize_size": (5, 7), "mean": (0.5, 0.5, 0.5), "std": (0.2, 0.2, 0.2),
     "chw": True},
    {"channels": 3, "pixel_ops": [
        {"kind": "jitter", "op": 1, "ranges": [(0.8, 1.2), None, (0.5, 1.5), (-0.1, 0.1)]},
        {"kind": "grayscale", "op": 2, "p": 0.5},
        {"kind": "blur", "op": 3, "kernel": (3, 3), "sigma": (0.1, 2.0)},
    ], "erasing": {"op": 4, "p": 1.0, "scale": (0.02, 0.33), "ratio": (0.3, 3.3),
                   "value": "random"}},
]  # fmt: skip


def pipeline(k=0):
    """The k-th of a few valid pipelines (k modulo their number)."""
    return _core.Pipeline(**PIPELINES[k % len(PIPELINES)])


def source(k=0, kind="buffers"):
    """A valid image source of three images over pipeline(k), given as `kind` says."""
    images = [qoi(4, 5), jpeg(8, 8), png(3, 3)]
    where = {
        "buffers": images,
        "spans": ([np.frombuffer(b"".join(images), np.uint8)], None,
                  [0, len(images[0]), len(images[0]) + len(images[1])],
                  np.cumsum([len(i) for i in images])),
        "offsets": (np.frombuffer(b"".join(images), np.uint8),
                    np.cumsum([0] + [len(i) for i in images])),
        "paths": ["/nonexistent/a.qoi", "/nonexistent/b.jpg", "/nonexistent/c.png"],
        "pixels": [arr((4, 5, 3)), arr((2, 2)), arr((3, 3, 4))],
    }[kind]  # fmt: skip
    return _core.ImageSource(
        pipeline(k),
        channels=3,
        name="fuzz",
        decoder=codecs,
        max_pixels=limits.MAX_IMAGE_PIXELS,
        max_file_bytes=limits.MAX_FILE_BYTES,
        **{kind: where},
    )


def fields(kind="gather"):
    """Fields of one field: a gather from a 10 x 2 x 3 uint8 array, a Python field, or a
    native image field whose images are 4 x 5 x 3."""
    if kind == "gather":
        return _core.Fields([(LeafKind.GATHER, arr((10, 2, 3)))], [6])
    if kind == "image":
        return _core.Fields([(LeafKind.IMAGE, source(1))], [27])
    return _core.Fields([(LeafKind.OBJECT, None)], [0])


class Plan:
    """The least a plan does for an iteration: assemble a partial step and name a failure."""

    def assemble(self, ring, objects, rows, keep):
        return [None if a is None else a[:rows] for a in ring]

    def load_error(self, step, field, index, message, cause):
        return ValueError(f"step {step}, field {field}, index {index}: {message}")


def iteration(rows=4, slots=2, started=None, kind=None):
    """An iteration of `slots` slots of `rows` rows for fields() of the kind `started` (or
    `kind`) names, started on the 10 observations in order when `started` is given."""
    ring = [[np.zeros((rows, 2, 3), np.uint8)] for _ in range(slots)]
    if (started or kind) == "image":
        ring = [[np.zeros((rows, 3, 3, 3), np.uint8)] for _ in range(slots)]
    it = _core.Iteration(
        Plan(), ring=ring, values=[None] * slots, objects=[[[]] for _ in range(slots)],
        rows=rows, buffer=False, stats=_core.Stats(), progress=_core.Progress(),
    )  # fmt: skip
    MADE.append(it)
    if started is not None:
        it.start_run(fields(started), order=np.arange(10, dtype=np.int64), bounds=None,
                     first_step=0, end_step=10 // rows, seed=1, epoch=0, parallel=1,
                     claim_size=1, ordered=True, skip_errors=False, release_gil=True,
                     filler=lambda *a: None)  # fmt: skip
    return it


NAMESPACE = {
    "np": np,
    "_core": _core,
    "codecs": codecs,
    "arr": arr,
    "qoi": qoi,
    "jpeg": jpeg,
    "png": png,
    "cut": cut,
    "flipped": flipped,
    "pipeline": pipeline,
    "source": source,
    "fields": fields,
    "iteration": iteration,
    "LeafKind": LeafKind,
    "Plan": Plan,
}


def main():
    if not _under_asan():
        resource.setrlimit(resource.RLIMIT_AS, (MEMORY_CAP_BYTES, MEMORY_CAP_BYTES))
    calls = json.load(sys.stdin)
    out = sys.stdout
    for i, call in enumerate(calls):
        out.write(f"start {i}\n")
        out.flush()
        result = None
        try:
            result = eval(call, dict(NAMESPACE))
        except Exception as exc:
            message = str(exc).replace("\n", " ")
            out.write(f"raised {i} {type(exc).__name__}: {message}\n")
        else:
            out.write(f"ok {i}\n")
        out.flush()
        aftermath(result, i)
        del result
        GIVEN.clear()
        MADE.clear()
    gc.collect()
    _core.shutdown_pool()
    out.write("done\n")
    out.flush()


if __name__ == "__main__":
    main()
