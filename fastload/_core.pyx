# cython: language_level=3
"""Thin binding of the native engine: the pool, runs of a schedule and the delivery loop,
per-item randomness, native image sources."""
from libc.stdint cimport int64_t, uint8_t, uint64_t
from libc.stdlib cimport calloc, free
from libc.string cimport memcpy, strncpy
from cpython.exc cimport PyErr_CheckSignals
from posix.time cimport clock_gettime, timespec, CLOCK_MONOTONIC

import os

import numpy as np

cimport numpy as cnp

cnp.import_array()


cdef extern from "pool.h" nogil:
    int fl_pool_size()
    int fl_pool_reserve(int n)
    int fl_pool_default_size()
    void fl_pool_shutdown()


cdef extern from "rng.h" nogil:
    ctypedef struct fl_rng:
        uint64_t state
    fl_rng fl_rng_for(uint64_t seed, uint64_t epoch, uint64_t index, uint64_t op)
    uint64_t fl_rng_next(fl_rng *r)
    double fl_rng_uniform(fl_rng *r)


cdef extern from "engine.h" nogil:
    enum: FL_MAX_DIMS
    enum: FL_MESSAGE_BYTES
    enum: FL_FILL_FATAL
    ctypedef struct fl_scratch:
        void *data
        size_t bytes
    ctypedef struct fl_slot:
        int64_t step
        int64_t rows
        int failed
        int64_t fail_pos
        int fail_field
        int64_t skipped
        uint8_t *skipped_items
        char message[FL_MESSAGE_BYTES]
    ctypedef struct fl_run:
        fl_slot *slots
        void *ctx
    ctypedef struct fl_item:
        const fl_run *run
        int slot
        int64_t pos
        int64_t index
    ctypedef struct fl_field
    ctypedef int (*fl_fill_fn)(const fl_field *field, const fl_item *item, char *dst,
                               fl_scratch *scratch, char *message)
    ctypedef void (*fl_prefetch_fn)(const fl_field *field, int64_t index)
    ctypedef struct fl_field:
        fl_fill_fn fill
        fl_prefetch_fn prefetch
        int64_t row_bytes
        const char *src
        int ndim
        int64_t shape[FL_MAX_DIMS]
        int64_t strides[FL_MAX_DIMS + 1]
        int64_t itemsize
        int contiguous
        int64_t count
        void *state
        int number
    fl_run *fl_run_create(const int64_t *order, const int64_t *bounds, int64_t end_item,
                          int64_t rows, int64_t first_step, int64_t end_step, uint64_t seed,
                          uint64_t epoch, const fl_field *fields, int nfields,
                          char *const *dst, int nslots, int parallel, int64_t chunk,
                          int ordered, int skip_errors, void *ctx)
    int fl_run_next(fl_run *run, int release, double timeout_s)
    int fl_run_start(fl_run *run)
    void fl_run_cancel(fl_run *run)
    void fl_run_join(fl_run *run)
    void fl_run_destroy(fl_run *run)
    int fl_fill_gather(const fl_field *field, const fl_item *item, char *dst,
                       fl_scratch *scratch, char *message)
    void fl_prefetch_gather(const fl_field *field, int64_t index)


def pool_size():
    """Threads in the process-wide pool (starting it if needed)."""
    return fl_pool_size()


def reserve_threads(int n):
    """Grow the pool to at least ``n`` threads; returns its size."""
    return fl_pool_reserve(n)


def default_pool_size():
    """Threads the pool starts with: FASTLOAD_NUM_THREADS, else the CPUs this process may use."""
    return fl_pool_default_size()


def shutdown_pool():
    """Join the pool's threads once their queued tasks are done (it restarts on next use)."""
    with nogil:
        fl_pool_shutdown()


def rng_uniform(uint64_t seed, uint64_t epoch, uint64_t index, uint64_t op, Py_ssize_t n):
    """The first ``n`` uniform [0, 1) draws of the stream for (seed, epoch, index, op)."""
    cdef fl_rng r = fl_rng_for(seed, epoch, index, op)
    out = np.empty(n, np.float64)
    cdef double[::1] view = out
    cdef Py_ssize_t k
    for k in range(n):
        view[k] = fl_rng_uniform(&r)
    return out


def rng_bits(uint64_t seed, uint64_t epoch, uint64_t index, uint64_t op, Py_ssize_t n):
    """The first ``n`` 64-bit words of the stream for (seed, epoch, index, op)."""
    cdef fl_rng r = fl_rng_for(seed, epoch, index, op)
    out = np.empty(n, np.uint64)
    cdef uint64_t[::1] view = out
    cdef Py_ssize_t k
    for k in range(n):
        view[k] = fl_rng_next(&r)
    return out


cdef void _write_message(char *message, exc) noexcept:
    """``type: text`` of ``exc`` into a C message buffer; a fixed text if that fails."""
    try:
        text = f"{type(exc).__name__}: {exc}".encode("utf-8", "replace")
    except BaseException:
        text = type(exc).__name__.encode("ascii", "replace")
    strncpy(message, text[:FL_MESSAGE_BYTES - 1], FL_MESSAGE_BYTES - 1)
    message[FL_MESSAGE_BYTES - 1] = 0


cdef int _fill_python(const fl_field *field, const fl_item *item, char *dst,
                      fl_scratch *scratch, char *message) noexcept nogil:
    """A field loaded by Python code: takes the GIL for this item only."""
    with gil:
        return (<Iteration>item.run.ctx)._fill(field.number, item.slot, item.pos, item.index,
                                               message)


cdef class Fields:
    """How to load one observation, field by field: gathers from arrays run natively;
    other fields call back into Python with the GIL held for that item.

    ``fields`` is a list of ``("gather", array)``, ``("python", None)`` or
    ``("native", (fill_address, prefetch_address, state_address, owner))``; row_bytes gives each field's
    bytes per position in its destination (0 for fields with no destination array)."""
    cdef fl_field *fields
    cdef readonly int nfields
    cdef readonly list kinds
    cdef list owners

    def __cinit__(self, list fields, list row_bytes):
        self.nfields = len(fields)
        self.fields = <fl_field *>calloc(max(self.nfields, 1), sizeof(fl_field))
        if self.fields == NULL:
            raise MemoryError()
        self.owners = []
        self.kinds = [kind for kind, _ in fields]
        if len(row_bytes) != self.nfields:
            raise ValueError("row_bytes needs one entry per field")
        cdef int f, d
        cdef cnp.ndarray array
        for f, (kind, value) in enumerate(fields):
            self.fields[f].number = f
            self.fields[f].row_bytes = row_bytes[f]
            if kind == "gather":
                array = <cnp.ndarray>value
                if array.ndim - 1 > FL_MAX_DIMS:
                    raise ValueError(f"arrays of more than {FL_MAX_DIMS + 1} dimensions are not supported")
                self.owners.append(array)
                self.fields[f].fill = fl_fill_gather
                self.fields[f].prefetch = fl_prefetch_gather
                self.fields[f].src = <const char *>cnp.PyArray_DATA(array)
                self.fields[f].ndim = array.ndim - 1
                self.fields[f].itemsize = array.itemsize
                self.fields[f].count = array.shape[0]
                self.fields[f].strides[0] = array.strides[0]
                for d in range(1, array.ndim):
                    self.fields[f].shape[d - 1] = array.shape[d]
                    self.fields[f].strides[d] = array.strides[d]
                self.fields[f].contiguous = array[0:1].flags.c_contiguous if array.shape[0] else 1
            elif kind == "python":
                self.fields[f].fill = _fill_python
            elif kind == "native":
                fill_address, prefetch_address, state_address, owner = value
                self.owners.append(owner)
                self.fields[f].fill = <fl_fill_fn><size_t>fill_address
                self.fields[f].prefetch = <fl_prefetch_fn><size_t>prefetch_address
                self.fields[f].state = <void *><size_t>state_address
            else:
                raise ValueError(f"unknown field kind {kind!r}")

    def __dealloc__(self):
        free(self.fields)


cdef class Stats:
    """What a loader's iterations counted: observations and steps delivered, observations
    skipped, and the consumer's time (seconds) waiting in ``next()`` and between calls."""
    cdef public int64_t items, batches, skipped
    cdef public double wait_s, compute_s


cdef class Progress:
    """The epoch an iteration loads and the steps of it delivered so far (a resumed
    iteration starts at its first step)."""
    cdef public int64_t epoch, step

    def __init__(self, int64_t epoch=0, int64_t step=0):
        self.epoch = epoch
        self.step = step


cdef inline double _now() noexcept nogil:
    cdef timespec t
    clock_gettime(CLOCK_MONOTONIC, &t)
    return t.tv_sec + t.tv_nsec * 1e-9


cdef object _owned(object value):
    """``value`` with every array copied (the caller owns what it gets)."""
    if isinstance(value, cnp.ndarray):
        return cnp.PyArray_NewCopy(<cnp.ndarray>value, cnp.NPY_CORDER)
    if isinstance(value, tuple):
        parts = [_owned(v) for v in <tuple>value]
        return type(value)(*parts) if hasattr(value, "_fields") else tuple(parts)
    if isinstance(value, dict):
        return {k: _owned(v) for k, v in (<dict>value).items()}
    return value


cdef int64_t _count_items(value):
    """Observations in a batch a container formed itself: the length of its first leaf."""
    while isinstance(value, (tuple, dict)) and len(value):
        value = next(iter(value.values())) if isinstance(value, dict) else value[0]
    if isinstance(value, cnp.ndarray):
        return value.shape[0] if value.ndim else 1
    return len(value) if hasattr(value, "__len__") else 1


cdef double _WAIT_S = 0.1      # longest wait between two checks for Ctrl-C
cdef object _END = object()
cdef object _EMPTY = object()   # a step none of whose observations loaded

_STOPPED = {
    -3: "the loader was closed while this iteration ran",
    -4: "this iteration was started before the process forked: it cannot go on in the "
        "child; start a new one there",
    -5: "could not start the native thread pool",
}


cdef class Iteration:
    """One pass over a schedule's steps: the delivery loop shared by every transport.

    Each ``next()`` releases the slot handed out before, waits for the next step's slot
    (in order, or the first finished with ``ordered=False``) and returns its value: the
    slot's cached arrays when the step is whole, else ``plan.assemble(...)``; a copy the
    caller owns unless ``buffer``. A failed item raises ``plan.load_error(...)``; skipped
    ones are counted, and a step none of whose observations loaded is passed over. The
    steps come from a native run (``start_run``: inline or on the pool) or from a
    transport object (``start_transport``: worker processes), whose ``next(release)``
    returns ``(slot, step, rows, failure, keep, objects)`` or None at the end.
    ``check(step)``, when given, runs before a step's value is handed out (a packed
    dataset's checksums, with ``verify="read"``); what it raises ends the iteration.

    Slots: ``ring[slot]`` is the list of a slot's destination arrays (None for fields with
    no array); ``values[slot]`` its whole step's value (None: assemble every time);
    ``objects[slot]`` the lists Python fields collect into. Only the running step's
    tasks write into a slot, and a slot is reused only after the consumer released it.
    """
    cdef fl_run *run
    cdef object transport
    cdef Fields fields
    cdef object order, bounds
    cdef readonly object plan
    cdef list ring, values
    cdef readonly list objects
    cdef dict errors
    cdef object filler, on_end, check
    cdef bint buffer, release_gil, count_values, busy
    cdef readonly bint done
    cdef int held
    cdef int64_t rows
    cdef Stats stats
    cdef Progress progress
    cdef double last
    cdef object __weakref__

    def __cinit__(self, plan, list ring, list values, list objects, int64_t rows, bint buffer,
                  Stats stats, Progress progress, on_end=None, bint count_values=False,
                  check=None):
        if len(values) != len(ring) or len(objects) != len(ring) or not ring:
            raise ValueError("a ring needs at least one slot, with a value and objects each")
        self.plan = plan
        self.ring, self.values, self.objects = ring, values, objects
        self.rows = rows
        self.buffer = buffer
        self.stats, self.progress = stats, progress
        self.on_end = on_end
        self.check = check
        self.count_values = count_values
        self.errors = {}
        self.held = -1

    def start_run(self, Fields fields, cnp.ndarray order, bounds, int64_t first_step,
                  int64_t end_step, uint64_t seed, uint64_t epoch, int parallel, int64_t chunk,
                  bint ordered, bint skip_errors, bint release_gil, filler):
        """Load steps [first_step, end_step) of ``order`` (int64, C-contiguous) natively:
        ``rows`` items a step, or at the offsets ``bounds`` (int64, ``end_step + 1`` of
        them, each step 1 to ``rows`` items). In the caller's thread when ``parallel`` is
        0, else on up to ``parallel`` pool threads claiming ``chunk`` items at a time.
        ``filler(slot, field, pos, index)`` loads an item of a Python field (with the
        GIL). Raises ValueError for bounds that do not fit."""
        if self.run != NULL or self.transport is not None:
            raise RuntimeError("this iteration was started already")
        if order.dtype != np.int64 or not order.flags.c_contiguous:
            raise TypeError("a schedule's order must be a C-contiguous int64 array")
        cdef const int64_t *bounds_data = NULL
        if bounds is not None:
            if (not isinstance(bounds, np.ndarray) or bounds.dtype != np.int64
                    or not bounds.flags.c_contiguous or bounds.shape[0] < end_step + 1):
                raise TypeError("a schedule's bounds must be a C-contiguous int64 array of "
                                "steps + 1 offsets")
            bounds_data = <const int64_t *>cnp.PyArray_DATA(<cnp.ndarray>bounds)
        cdef int nslots = len(self.ring), f, s
        cdef char **dst = <char **>calloc(nslots * max(fields.nfields, 1), sizeof(char *))
        if dst == NULL:
            raise MemoryError()
        try:
            for s in range(nslots):
                if len(self.ring[s]) != fields.nfields:
                    raise ValueError(f"{len(self.ring[s])} destinations for {fields.nfields} fields")
                for f in range(fields.nfields):
                    dst[s * fields.nfields + f] = self._destination(fields, f, self.ring[s][f])
            self.fields, self.order, self.bounds, self.filler = fields, order, bounds, filler
            self.release_gil = release_gil or parallel > 0
            self.run = fl_run_create(<const int64_t *>cnp.PyArray_DATA(order), bounds_data,
                                     order.shape[0], self.rows, first_step, end_step, seed,
                                     epoch, fields.fields, fields.nfields, dst, nslots,
                                     parallel, chunk, ordered, skip_errors, <void *>self)
        finally:
            free(dst)
        if self.run == NULL:
            if bounds is not None:
                raise ValueError(f"the schedule's bounds must cut the order into steps of 1 "
                                 f"to {self.rows} observations")
            raise MemoryError("could not set up a native run")

    def begin(self):
        """Start loading on the pool now, without waiting for a step (the first ``next()``
        starts it otherwise): an iteration begun while another one is being consumed
        loads ahead of it. Does nothing for an inline run."""
        cdef int rc = 0
        if self.run != NULL and not self.done:
            with nogil:
                rc = fl_run_start(self.run)
        if rc != 0:
            raise RuntimeError(_STOPPED.get(rc))

    cdef char *_destination(self, Fields fields, int f, dest) except? NULL:
        # Native fields write row_bytes per position: the array must hold exactly that.
        if fields.kinds[f] == "python":
            return NULL
        if not isinstance(dest, np.ndarray):
            raise TypeError(f"field {f} needs an array to write into")
        cdef cnp.ndarray array = <cnp.ndarray>dest
        if (array.ndim == 0 or array.shape[0] < self.rows or not array.flags.c_contiguous
                or not array.flags.writeable or array.strides[0] != fields.fields[f].row_bytes):
            raise ValueError(f"field {f}: a destination must be a writeable C-contiguous array "
                             f"of {self.rows} rows of {fields.fields[f].row_bytes} bytes")
        return <char *>cnp.PyArray_DATA(array)

    def start_transport(self, transport):
        """Deliver the steps that ``transport`` loads (see the class docstring)."""
        if self.run != NULL or self.transport is not None:
            raise RuntimeError("this iteration was started already")
        self.transport = transport

    def cancel(self):
        """Stop loading; a consumer waiting in ``next()`` wakes and raises RuntimeError.
        Safe from any thread."""
        if self.run != NULL:
            with nogil:
                fl_run_cancel(self.run)

    def close(self):
        """Stop loading and wait until no thread works for this iteration. Idempotent."""
        self._stop()

    cdef void _stop(self):
        self.done = True
        if self.run != NULL:
            with nogil:
                fl_run_join(self.run)
        elif self.transport is not None:
            transport, self.transport = self.transport, None
            transport.close()

    def __dealloc__(self):
        # Pool threads may still be finishing a claim: wait for them without the GIL.
        if self.run != NULL:
            with nogil:
                fl_run_destroy(self.run)

    def __iter__(self):
        return self

    def __next__(self):
        cdef double start = _now(), end
        if self.done:
            raise StopIteration
        if self.busy:
            raise ValueError("this iteration is already in next() on another thread")
        if self.last > 0:
            self.stats.compute_s += start - self.last
        self.busy = True
        try:
            value = self._next_native() if self.run != NULL else self._next_transport()
            while value is _EMPTY:      # every observation of the step was skipped
                self.progress.step += 1
                value = self._next_native() if self.run != NULL else self._next_transport()
        except BaseException:
            self._stop()
            raise
        finally:
            self.busy = False
        end = _now()
        self.stats.wait_s += end - start
        if value is _END:
            self._stop()
            if self.on_end is not None:
                self.on_end()
            raise StopIteration
        self.last = end
        self.stats.batches += 1
        self.progress.step += 1
        return value

    cdef object _next_native(self):
        cdef int slot, release = self.held
        cdef fl_slot *s
        self.held = -1
        while True:
            if self.release_gil:
                with nogil:
                    slot = fl_run_next(self.run, release, _WAIT_S)
            else:
                slot = fl_run_next(self.run, release, _WAIT_S)
            release = -1
            if slot != -2:
                break
            PyErr_CheckSignals()
        if slot == -1:
            return _END
        if slot < 0:
            raise RuntimeError(_STOPPED.get(slot, f"the native run stopped ({slot})"))
        self.held = slot
        s = &self.run.slots[slot]
        if self.check is not None:
            self.check(s.step)
        value = self.values[slot] if s.rows == self.rows else None
        if value is None or s.failed or s.skipped:
            return self._deliver(slot, s.rows, self._failure(slot), self._kept(slot), None)
        self.stats.items += s.rows
        return value if self.buffer else _owned(value)

    cdef object _next_transport(self):
        release, self.held = self.held, -1
        reply = self.transport.next(release)
        if reply is None:
            return _END
        slot, step, rows, failure, keep, objects = reply
        self.held = slot
        if self.check is not None:
            self.check(step)
        return self._deliver(slot, rows, failure, keep, objects)

    cdef object _deliver(self, int slot, int64_t rows, failure, keep, objects):
        self.errors.pop(slot, None)
        if failure is not None:
            cause = failure[4]
            if cause is not None and not isinstance(cause, Exception):
                raise cause        # an interrupt is not a failed observation
            raise self.plan.load_error(*failure)
        if objects is None:
            objects = self.objects[slot]
        kept = rows if keep is None else int(keep.sum())
        self.stats.skipped += rows - kept
        if kept == 0:
            return _EMPTY
        value = self.values[slot] if keep is None and rows == self.rows else None
        if value is None:
            value = self.plan.assemble(self.ring[slot], objects, rows, keep)
        self.stats.items += _count_items(value) if self.count_values else kept
        return value if self.buffer else _owned(value)

    cdef object _failure(self, int slot):
        """(step, field, index, message, cause) of the slot's fatal failure, or None."""
        cdef fl_slot *s = &self.run.slots[slot]
        if not s.failed:
            return None
        cdef int64_t first = s.step * self.rows if self.bounds is None else self.bounds[s.step]
        cdef int64_t index = (<int64_t *>cnp.PyArray_DATA(self.order))[first + s.fail_pos]
        cause = self.errors.get(slot, {}).get(s.fail_pos)
        field = s.fail_field if s.fail_field >= 0 else None
        return s.step, field, index, s.message.decode("utf-8", "replace"), cause

    cdef object _kept(self, int slot):
        cdef fl_slot *s = &self.run.slots[slot]
        if not s.skipped:
            return None
        flags = np.asarray(<uint8_t[:s.rows]>s.skipped_items)
        return flags == 0

    cdef int _fill(self, int field, int slot, int64_t pos, int64_t index, char *message) noexcept:
        # Runs on a pool thread (or the consumer's) with the GIL held. Whatever escapes the
        # user's code, the item fails (never passes unfilled), keeping its traceback.
        try:
            self.filler(slot, field, pos, index)
            return 0
        except BaseException as exc:
            self.errors.setdefault(slot, {}).setdefault(pos, exc)
            _write_message(message, exc)
            # Ctrl-C (or SystemExit) in the user's code stops the step, skip or not.
            return -1 if isinstance(exc, Exception) else FL_FILL_FATAL


cdef extern from "imageplan.h" nogil:
    ctypedef struct fl_pipeline
    ctypedef int (*fl_decode_fn)(void *ctx, const uint8_t *data, size_t n, int scale_denom,
                                 int channels, int h, int w, uint8_t *out, char *message)
    ctypedef void *(*fl_alloc_fn)(void *ctx, size_t bytes)
    ctypedef struct fl_image:
        uint8_t *data
        int h, w, c
        Py_ssize_t stride
    ctypedef int (*fl_decode_other_fn)(void *ctx, const uint8_t *data, size_t n, int channels,
                                       int64_t max_pixels, fl_alloc_fn alloc, void *alloc_ctx,
                                       fl_image *out, char *message)
    ctypedef struct fl_image_source:
        const fl_pipeline *pipeline
        int kind
        int64_t count
        const uint8_t *const *ptrs
        const int64_t *lens
        const uint8_t *base
        const int64_t *offsets
        const char *const *paths
        const int *dims
        const int64_t *row_strides
        int channels
        int exact
        fl_decode_fn decode_jpeg
        fl_decode_other_fn decode_other
        void *decode_ctx
        const char *name
        int64_t max_pixels
        int64_t max_file_bytes
    int fl_jpeg_size(const uint8_t *data, size_t n, int *h, int *w)
    int fl_fill_image(const fl_field *field, const fl_item *item, char *dst,
                      fl_scratch *scratch, char *message)
    void fl_prefetch_image(const fl_field *field, int64_t index)
    ctypedef struct fl_decoded:
        fl_image part
        int y, x, src_h, src_w, denom
    int fl_decode_for_run(const fl_image_source *src, const uint8_t *data, size_t n,
                          uint64_t seed, uint64_t epoch, uint64_t index, int64_t dst_bytes,
                          fl_scratch *scratch, fl_decoded *out, char *message)
    int fl_run_encoded(const fl_image_source *src, const uint8_t *data, size_t n,
                       uint64_t seed, uint64_t epoch, uint64_t index, char *dst,
                       int64_t dst_bytes, fl_scratch *scratch, char *message)
    int fl_jpeg_library_version()


cdef extern from "Python.h":
    object PyMemoryView_FromMemory(char *mem, Py_ssize_t size, int flags)
    int PyBUF_READ


cdef int _decode_jpeg(void *ctx, const uint8_t *data, size_t n, int scale_denom,
                      int channels, int h, int w, uint8_t *out,
                      char *message) noexcept nogil:
    """Decodes a JPEG through simplejpeg (``ctx``: the module ``fastload.codecs``) on
    bytes owned by C, into C memory. The GIL is held around the call only; simplejpeg
    releases it while it decodes."""
    cdef cnp.npy_intp dims[3]
    dims[0] = (h + scale_denom - 1) // scale_denom
    dims[1] = (w + scale_denom - 1) // scale_denom
    dims[2] = channels
    with gil:
        try:
            view = PyMemoryView_FromMemory(<char *>data, n, PyBUF_READ)
            target = cnp.PyArray_SimpleNewFromData(3, dims, cnp.NPY_UINT8, out)
            (<object>ctx).decode_jpeg_into(view, target, scale_denom, channels)
            return 0
        except BaseException as exc:
            _write_message(message, exc)
            return -1


cdef int _decode_other(void *ctx, const uint8_t *data, size_t n, int channels,
                       int64_t max_pixels, fl_alloc_fn alloc, void *alloc_ctx, fl_image *out,
                       char *message) noexcept nogil:
    """Decodes an image of another format (PNG, BMP, ...) through Pillow, with the GIL,
    into C memory from ``alloc``."""
    cdef uint8_t *pixels
    cdef const uint8_t[:, :, ::1] decoded
    with gil:
        try:
            view = PyMemoryView_FromMemory(<char *>data, n, PyBUF_READ)
            decoded = (<object>ctx).decode_pillow(view, channels, max_pixels)
            pixels = <uint8_t *>alloc(alloc_ctx, decoded.shape[0] * decoded.shape[1] * channels)
            if pixels == NULL:
                raise MemoryError("out of memory")
            memcpy(pixels, &decoded[0, 0, 0], decoded.shape[0] * decoded.shape[1] * channels)
            out.data = pixels
            out.h = <int>decoded.shape[0]
            out.w = <int>decoded.shape[1]
            out.c = channels
            out.stride = decoded.shape[1] * channels
            return 0
        except BaseException as exc:
            _write_message(message, exc)
            return -1


def jpeg_library_version():
    """The libjpeg-turbo version number the JPEG decoder in C links (e.g. 2001005), or 0
    when this build decodes JPEG through simplejpeg."""
    return fl_jpeg_library_version()


def jpeg_size(data):
    """(height, width) from a JPEG's frame header; ValueError if it has none."""
    cdef const unsigned char[::1] view = memoryview(data).cast("B")
    cdef int h = 0, w = 0
    if view.shape[0] == 0 or fl_jpeg_size(&view[0], view.shape[0], &h, &w) != 0:
        raise ValueError("not a JPEG, or its header is truncated or corrupt")
    return h, w


SOURCE_BUFFERS, SOURCE_OFFSETS, SOURCE_FILES, SOURCE_PIXELS = range(4)


cdef class ImageSource:
    """The state of a native image field: where each image is, the compiled pipeline, and
    the JPEG decoder. Holds every Python object the C side points into."""
    cdef fl_image_source source
    cdef list owners
    cdef bytes name_bytes

    def __cinit__(self, size_t pipeline_address, pipeline_owner, int kind, int64_t count,
                  int channels, str name, decoder, int64_t max_pixels,
                  int64_t max_file_bytes, bint exact=False, keep=None, ptrs=None, lens=None,
                  base=None, offsets=None, paths=None, dims=None, row_strides=None):
        self.owners = [pipeline_owner, decoder, keep]
        self.name_bytes = name.encode("utf-8", "replace")
        self.source.pipeline = <const fl_pipeline *>pipeline_address
        self.source.kind = kind
        self.source.count = count
        self.source.channels = channels
        self.source.exact = exact
        self.source.decode_jpeg = _decode_jpeg
        self.source.decode_other = _decode_other
        self.source.decode_ctx = <void *>decoder
        self.source.name = self.name_bytes
        self.source.max_pixels = max_pixels
        self.source.max_file_bytes = max_file_bytes
        if ptrs is not None:
            self.source.ptrs = <const uint8_t *const *><size_t>self._keep(ptrs, np.uintp, count)
        if lens is not None:
            self.source.lens = <const int64_t *><size_t>self._keep(lens, np.int64, count)
        if base is not None:
            self.source.base = <const uint8_t *><size_t>self._keep(base, np.uint8)
        if offsets is not None:
            self.source.offsets = <const int64_t *><size_t>self._keep(offsets, np.int64,
                                                                      count + 1)
        if dims is not None:
            self.source.dims = <const int *><size_t>self._keep(dims, np.int32, 3 * count)
        if row_strides is not None:
            self.source.row_strides = <const int64_t *><size_t>self._keep(row_strides,
                                                                          np.int64, count)
        if paths is not None:
            encoded = [os.fsencode(p) for p in paths]
            self.owners.append(encoded)
            self.source.paths = <const char *const *><size_t>self._keep(
                [<size_t><const char *>b for b in encoded], np.uintp, count)

    cdef size_t _keep(self, values, dtype, Py_ssize_t length=-1) except 0:
        array = np.ascontiguousarray(values, dtype=dtype)
        if length >= 0 and array.size != length:
            raise ValueError(f"the image source needs {length} entries, got {array.size}")
        if array.size == 0:
            array = np.zeros(1, dtype)
        self.owners.append(array)
        return <size_t>cnp.PyArray_DATA(array)

    def run(self, data, out, uint64_t seed=0, uint64_t epoch=0, uint64_t index=0):
        """Decodes the encoded image ``data`` and runs the pipeline on it into ``out`` (a
        writable C-contiguous array sized for this image), as a loader does for item
        ``index``. Raises ValueError naming what is wrong with the image."""
        cdef const uint8_t[::1] src = memoryview(data).cast("B")
        cdef uint8_t[::1] dst = out.reshape(-1).view(np.uint8)
        cdef fl_scratch scratch
        cdef char message[FL_MESSAGE_BYTES]
        cdef int rc
        cdef const uint8_t *p = &src[0] if src.shape[0] else NULL
        scratch.data = NULL
        scratch.bytes = 0
        message[0] = 0
        try:
            with nogil:
                rc = fl_run_encoded(&self.source, p, src.shape[0], seed, epoch, index,
                                    <char *>&dst[0], dst.shape[0], &scratch, message)
        finally:
            free(scratch.data)
        if rc != 0:
            raise ValueError(message.decode("utf-8", "replace"))
        return out

    def decode(self, data, uint64_t seed=0, uint64_t epoch=0, uint64_t index=0):
        """What the loader decodes of ``data`` for item ``index``, without running the rest
        of the pipeline: ``(pixels, (y, x), scale_denom)``, the part of the image at
        1/scale_denom (only the crop's region for a JPEG) and where it sits in it."""
        cdef const uint8_t[::1] src = memoryview(data).cast("B")
        cdef fl_scratch scratch
        cdef fl_decoded d
        cdef uint8_t *dst
        cdef Py_ssize_t row, row_bytes
        cdef char message[FL_MESSAGE_BYTES]
        cdef int rc
        cdef const uint8_t *p = &src[0] if src.shape[0] else NULL
        scratch.data = NULL
        scratch.bytes = 0
        try:
            with nogil:
                rc = fl_decode_for_run(&self.source, p, src.shape[0], seed, epoch, index, -1,
                                       &scratch, &d, message)
            if rc != 0:
                raise ValueError(message.decode("utf-8", "replace"))
            pixels = np.empty((d.part.h, d.part.w, d.part.c), np.uint8)
            row_bytes = d.part.w * d.part.c
            dst = <uint8_t *>cnp.PyArray_DATA(pixels)
            for row in range(d.part.h):
                memcpy(dst + row * row_bytes, d.part.data + row * d.part.stride, row_bytes)
        finally:
            free(scratch.data)
        return pixels, (d.y, d.x), d.denom

    @property
    def fill_address(self):
        return <size_t>fl_fill_image

    @property
    def prefetch_address(self):
        return <size_t>fl_prefetch_image

    @property
    def state_address(self):
        return <size_t>&self.source
