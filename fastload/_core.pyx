# cython: language_level=3
"""Thin binding of the native engine: the pool, batch jobs, per-item randomness."""
from libc.stdint cimport int64_t, uint8_t, uint64_t
from libc.stdlib cimport calloc, free
from libc.string cimport strncpy

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
    ctypedef struct fl_scratch:
        pass
    ctypedef struct fl_group:
        int cancel
    ctypedef struct fl_job
    ctypedef struct fl_field
    ctypedef int (*fl_fill_fn)(const fl_field *field, fl_job *job, int64_t pos,
                               int64_t index, char *dst, fl_scratch *scratch, char *message)
    ctypedef struct fl_field:
        fl_fill_fn fill
        int64_t row_bytes
        const char *src
        int ndim
        int64_t shape[FL_MAX_DIMS]
        int64_t strides[FL_MAX_DIMS + 1]
        int64_t itemsize
        int contiguous
        int64_t count
        void *state
        void *ctx
        int number
    ctypedef struct fl_job:
        fl_group *group
        const fl_field *fields
        int nfields
        char **dst
        const int64_t *idx
        int64_t n
        uint64_t seed, epoch
        int64_t chunk
        int skip_errors
        uint8_t *failed_items
        void *ctx
        int finished
        int failed
        int64_t fail_pos
        int fail_field
        int64_t skipped
        char message[FL_MESSAGE_BYTES]
    int fl_group_init(fl_group *g)
    void fl_group_destroy(fl_group *g)
    void fl_group_cancel(fl_group *g)
    int fl_group_cancelled(const fl_group *g)
    int fl_job_submit(fl_job *job, int max_tasks)
    int fl_wait_any(fl_group *g, fl_job **jobs, int njobs, double timeout_s)
    void fl_job_join(fl_job *job)
    int fl_fill_gather(const fl_field *field, fl_job *job, int64_t pos, int64_t index,
                       char *dst, fl_scratch *scratch, char *message)


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


cdef int _fill_python(const fl_field *field, fl_job *job, int64_t pos, int64_t index,
                      char *dst, fl_scratch *scratch, char *message) noexcept nogil:
    """A field loaded by Python code: takes the GIL for this item only."""
    if fl_group_cancelled(job.group):
        return 0
    with gil:
        return (<Job>job.ctx)._fill(field.number, pos, index, message)


cdef class Group:
    """The jobs of one iteration: a completion signal and a cancel flag."""
    cdef fl_group group
    cdef object __weakref__

    def __cinit__(self):
        if fl_group_init(&self.group) != 0:
            raise MemoryError("could not create a job group")

    def __dealloc__(self):
        # Its tasks may still be finishing a claim: wait for them without the GIL.
        with nogil:
            fl_group_destroy(&self.group)

    def cancel(self):
        """Stop loading: queued items of every job of the group are skipped."""
        fl_group_cancel(&self.group)

    @property
    def cancelled(self):
        return bool(fl_group_cancelled(&self.group))


cdef class Plan:
    """How to load one observation, field by field: gathers from arrays run natively;
    other fields call back into Python with the GIL held for that item.

    ``fields`` is a list of ``("gather", array)``, ``("python", None)`` or
    ``("native", (fill_address, state_address, owner))``; row_bytes gives each field's
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
                fill_address, state_address, owner = value
                self.owners.append(owner)
                self.fields[f].fill = <fl_fill_fn><size_t>fill_address
                self.fields[f].state = <void *><size_t>state_address
            else:
                raise ValueError(f"unknown field kind {kind!r}")

    def __dealloc__(self):
        free(self.fields)


cdef class Job:
    """One batch (or one observation) in flight: loads ``idx[k]`` into position k of each
    field's destination. A job object is reused; it must not be resubmitted or dropped
    while running: ``join()`` first (``__dealloc__`` joins as a last resort)."""
    cdef fl_job job
    cdef Group group_obj
    cdef Plan plan_obj
    cdef char **dst
    cdef object idx_array
    cdef object failed_array
    cdef readonly list destinations
    cdef readonly object error          # (pos, exception) of the first Python failure
    cdef public object filler           # filler(field, pos, index) for Python fields
    cdef bint running

    def __cinit__(self, Group group, Plan plan):
        self.group_obj = group
        self.plan_obj = plan
        self.dst = <char **>calloc(max(plan.nfields, 1), sizeof(char *))
        if self.dst == NULL:
            raise MemoryError()
        self.job.group = &group.group
        self.job.fields = plan.fields
        self.job.nfields = plan.nfields
        self.job.dst = self.dst
        self.job.ctx = <void *>self
        self.running = False

    def __dealloc__(self):
        if self.running:
            with nogil:
                fl_job_join(&self.job)
        free(self.dst)

    def submit(self, cnp.ndarray idx, list destinations, uint64_t seed, uint64_t epoch,
               int ntasks, bint skip_errors=False, int64_t chunk=1):
        """Start loading ``idx`` (int64, C-contiguous) into ``destinations`` (one array or
        None per field, rows along axis 0), behind the group's earlier jobs, on at most
        ``ntasks`` threads for the group, which claim ``chunk`` items at a time."""
        if self.running:
            raise RuntimeError("this job is still running")
        if idx.dtype != np.int64 or not idx.flags.c_contiguous:
            raise TypeError("job indices must be a C-contiguous int64 array")
        cdef int f
        cdef cnp.ndarray array
        if len(destinations) != self.plan_obj.nfields:
            raise ValueError(f"{len(destinations)} destinations for "
                             f"{self.plan_obj.nfields} fields")
        for f, dest in enumerate(destinations):
            if self.plan_obj.kinds[f] == "python":
                self.dst[f] = NULL
                continue
            # Native fields write row_bytes per index: the array must hold exactly that.
            if not isinstance(dest, np.ndarray):
                raise TypeError(f"field {f} needs an array to write into")
            array = <cnp.ndarray>dest
            if (array.ndim == 0 or array.shape[0] < idx.shape[0]
                    or not array.flags.c_contiguous or not array.flags.writeable
                    or array.strides[0] != self.plan_obj.fields[f].row_bytes):
                raise ValueError(f"field {f}: a destination must be a writeable C-contiguous "
                                 f"array with a row of {self.plan_obj.fields[f].row_bytes} "
                                 f"bytes per index")
            self.dst[f] = <char *>cnp.PyArray_DATA(array)
        self.idx_array = idx
        self.destinations = destinations
        self.error = None
        self.failed_array = np.zeros(idx.shape[0], np.uint8) if skip_errors else None
        self.job.idx = <const int64_t *>cnp.PyArray_DATA(idx)
        self.job.n = idx.shape[0]
        self.job.seed = seed
        self.job.epoch = epoch
        self.job.chunk = chunk
        self.job.skip_errors = skip_errors
        self.job.failed_items = <uint8_t *>cnp.PyArray_DATA(self.failed_array) if skip_errors else NULL
        self.running = True
        cdef int rc
        with nogil:
            rc = fl_job_submit(&self.job, ntasks)
        if rc != 0:
            self.join()
            raise RuntimeError("could not start the native thread pool")

    cdef int _fill(self, int field, int64_t pos, int64_t index, char *message) noexcept:
        # Runs on a pool thread with the GIL held. Whatever escapes the user's code, the
        # item fails (never passes unfilled); the first error keeps its traceback.
        try:
            self.filler(field, pos, index)
            return 0
        except BaseException as exc:
            if self.error is None:
                self.error = (pos, exc)
            _write_message(message, exc)
            return -1

    def join(self):
        """Wait until every task of the job has returned (promptly after a cancel)."""
        if self.running:
            with nogil:
                fl_job_join(&self.job)
            self.running = False

    def wait(self, double timeout):
        """True once the job finished, waiting up to ``timeout`` seconds without the GIL."""
        cdef fl_job *ptr = &self.job
        cdef int found
        with nogil:
            found = fl_wait_any(self.job.group, &ptr, 1, timeout)
        _check_orphaned(found)
        if found == 0:
            self.running = False
        return found == 0

    @property
    def finished(self):
        return bool(self.job.finished)

    @property
    def n(self):
        return self.job.n

    @property
    def indices(self):
        return self.idx_array

    @property
    def failure(self):
        """None, or (position, field, message) of the first item that failed."""
        if not self.job.failed and not self.job.skipped:
            return None
        return (self.job.fail_pos, self.job.fail_field,
                self.job.message.decode("utf-8", "replace"))

    @property
    def fatal(self):
        return bool(self.job.failed)

    @property
    def failed_items(self):
        """Per position, 1 where the item was skipped (with ``skip_errors``)."""
        return self.failed_array


cdef _check_orphaned(int found):
    if found == -2:
        raise RuntimeError("this iteration was started before the process forked: it cannot "
                           "go on in the child; start a new one there")


def wait_any(Group group, list jobs, double timeout):
    """Index in ``jobs`` of one that has finished, waiting up to ``timeout`` seconds
    without the GIL; -1 on timeout."""
    cdef int n = len(jobs), k, found
    cdef fl_job **ptrs = <fl_job **>calloc(max(n, 1), sizeof(fl_job *))
    if ptrs == NULL:
        raise MemoryError()
    for k in range(n):
        ptrs[k] = &(<Job>jobs[k]).job
    with nogil:
        found = fl_wait_any(&group.group, ptrs, n, timeout)
    free(ptrs)
    _check_orphaned(found)
    if found >= 0:
        (<Job>jobs[found]).running = False
    return found


cdef extern from "imageplan.h" nogil:
    ctypedef struct fl_pipeline
    ctypedef int (*fl_decode_fn)(void *ctx, const uint8_t *data, size_t n, int scale_denom,
                                 int channels, int h, int w, uint8_t *out, char *message)
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
        fl_decode_fn decode_jpeg
        void *decode_ctx
        const char *name
    int fl_jpeg_size(const uint8_t *data, size_t n, int *h, int *w)
    int fl_fill_image(const fl_field *field, fl_job *job, int64_t pos, int64_t index,
                      char *dst, fl_scratch *scratch, char *message)


cdef extern from "Python.h":
    object PyMemoryView_FromMemory(char *mem, Py_ssize_t size, int flags)
    int PyBUF_READ


cdef int _decode_jpeg(void *ctx, const uint8_t *data, size_t n, int scale_denom,
                      int channels, int h, int w, uint8_t *out,
                      char *message) noexcept nogil:
    """Calls the Python JPEG decoder (simplejpeg) on bytes owned by C, into C memory.
    The GIL is held around the call only; the decoder releases it while it decodes."""
    cdef cnp.npy_intp dims[3]
    dims[0] = (h + scale_denom - 1) // scale_denom
    dims[1] = (w + scale_denom - 1) // scale_denom
    dims[2] = channels
    with gil:
        try:
            view = PyMemoryView_FromMemory(<char *>data, n, PyBUF_READ)
            target = cnp.PyArray_SimpleNewFromData(3, dims, cnp.NPY_UINT8, out)
            (<object>ctx)(view, target, scale_denom, channels)
            return 0
        except BaseException as exc:
            _write_message(message, exc)
            return -1


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
                  int channels, str name, decode_jpeg, keep=None, ptrs=None, lens=None,
                  base=None, offsets=None, paths=None, dims=None, row_strides=None):
        self.owners = [pipeline_owner, decode_jpeg, keep]
        self.name_bytes = name.encode("utf-8", "replace")
        self.source.pipeline = <const fl_pipeline *>pipeline_address
        self.source.kind = kind
        self.source.count = count
        self.source.channels = channels
        self.source.decode_jpeg = _decode_jpeg
        self.source.decode_ctx = <void *>decode_jpeg
        self.source.name = self.name_bytes
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

    @property
    def fill_address(self):
        return <size_t>fl_fill_image

    @property
    def state_address(self):
        return <size_t>&self.source
