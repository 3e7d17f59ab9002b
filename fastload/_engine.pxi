"""Pool, runs and the delivery loop: the binding of pool.h, rng.h and engine.h."""
cimport cython
from libc.stdint cimport int64_t, uint8_t, uint64_t
from libc.stdlib cimport calloc, free
from libc.string cimport strncpy
from cpython.exc cimport PyErr_CheckSignals
from cpython.list cimport PyList_GET_ITEM
from cpython.object cimport PyObject
from posix.time cimport clock_gettime, timespec, CLOCK_MONOTONIC

from engine cimport *
from imagesource cimport fl_image_source_field
from pool cimport *
from rng cimport fl_rng, fl_rng_for, fl_rng_next, fl_rng_uniform
from status cimport *

import traceback
import warnings

from ._base import replies as _replies  # modules: _core holds no type but its own
from ._base import tree as _tree

cdef extern from "Python.h":
    Py_ssize_t Py_REFCNT(PyObject *o)


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


@cython.boundscheck(False)
def rng_uniform(uint64_t seed, uint64_t epoch, uint64_t index, uint64_t op, Py_ssize_t n):
    """The first ``n`` uniform [0, 1) draws of the stream for (seed, epoch, index, op)."""
    cdef fl_rng r = fl_rng_for(seed, epoch, index, op)
    out = np.empty(n, np.float64)
    cdef double[::1] view = out
    cdef Py_ssize_t k
    for k in range(n):
        view[k] = fl_rng_uniform(&r)
    return out


@cython.boundscheck(False)
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


cdef void _clear_frames(exc) noexcept:
    """Drop the variables of the frames in the tracebacks of ``exc`` and the exceptions
    chained to it, keeping the lines: they hold views of the slot being loaded, which is
    reused after the failure is reported (and would look like a batch kept by the
    consumer). A worker process sends tracebacks as text, without variables, likewise."""
    seen = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        traceback.clear_frames(exc.__traceback__)
        exc = exc.__cause__ if exc.__cause__ is not None else exc.__context__


cdef int _fill_python(const fl_field *field, const fl_item *item, char *dst,
                      fl_scratch *scratch, char *message) noexcept nogil:
    """A field loaded by Python code: takes the GIL for this item only."""
    with gil:
        return (<Iteration>fl_run_context(item.run))._fill(fl_field_number(field), item.slot,
                                                           item.pos, item.index, message)


cdef class Fields:
    """How to load one observation, field by field: gathers from arrays and native image
    fields run without the GIL; other fields call back into Python with the GIL held for
    that item.

    ``fields`` is a list of ``(LeafKind.GATHER, array)``, ``(LeafKind.IMAGE, ImageSource)``
    or ``(LeafKind.INTO or LeafKind.OBJECT, None)`` (``fastload._base.tree.LeafKind``);
    row_bytes gives each field's bytes per position in its destination (0 for fields with
    no destination array). The arrays and sources are kept alive here while the C fields
    point into them; ``kinds`` and ``row_bytes`` are tuples, as C keeps them."""
    cdef fl_field *fields
    cdef readonly int nfields
    cdef readonly tuple kinds
    cdef readonly tuple row_bytes
    cdef list owners

    def __cinit__(self, list fields, list row_bytes):
        self.nfields = len(fields)
        if len(row_bytes) != self.nfields:
            raise ValueError("row_bytes needs one entry per field")
        self.fields = fl_fields_create(max(self.nfields, 1))
        if self.fields == NULL:
            raise MemoryError()
        self.owners = []
        self.kinds = tuple([kind for kind, _ in fields])
        self.row_bytes = tuple(row_bytes)
        cdef int f
        for f, (kind, value) in enumerate(fields):
            if kind is _tree.LeafKind.GATHER:
                self._gather(f, value, row_bytes[f])
            elif kind is _tree.LeafKind.IMAGE:
                if not isinstance(value, ImageSource):
                    raise TypeError(f"field {f}: an image field needs an ImageSource, got "
                                    f"{type(value).__name__}")
                self.owners.append(value)
                fl_image_source_field(self.fields, f, (<ImageSource>value).source,
                                      row_bytes[f])
            elif kind is _tree.LeafKind.INTO or kind is _tree.LeafKind.OBJECT:
                fl_field_set_fill(self.fields, f, _fill_python, NULL, NULL, row_bytes[f])
            else:
                raise ValueError(f"field {f}: the kind must be a LeafKind, got {kind!r}")

    cdef _gather(self, int f, cnp.ndarray array, int64_t row_bytes):
        cdef int64_t shape[FL_MAX_DIMS]
        cdef int64_t strides[FL_MAX_DIMS + 1]
        if array is None or array.ndim < 1:
            raise ValueError(f"field {f}: a gather field needs an array of observations")
        # A plain view: what C reads is what is checked, whatever a subclass says of itself.
        array = np.asarray(array)
        # C copies row_bytes per observation, from the array and into the destination: it
        # must be an observation's size exactly.
        if row_bytes != array.itemsize * np.prod((<object>array).shape[1:], dtype=np.int64):
            raise ValueError(f"field {f}: an observation of an array of shape "
                             f"{(<object>array).shape} and {array.dtype} is not {row_bytes} "
                             f"bytes")
        cdef int d, ndim = array.ndim - 1
        if ndim > FL_MAX_DIMS:
            raise ValueError(f"arrays of more than {FL_MAX_DIMS + 1} dimensions are not "
                             f"supported")
        strides[0] = array.strides[0]
        for d in range(ndim):
            shape[d] = array.shape[d + 1]
            strides[d + 1] = array.strides[d + 1]
        contiguous = array[0:1].flags.c_contiguous if array.shape[0] else True
        self.owners.append(array)
        if fl_field_set_gather(self.fields, f, <const char *>cnp.PyArray_DATA(array), ndim,
                               shape, strides, array.itemsize, array.shape[0], contiguous,
                               row_bytes) != FL_OK:
            raise ValueError(f"field {f}: cannot gather from an array of {array.ndim} dimensions")

    def __dealloc__(self):
        fl_fields_destroy(self.fields)


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


def _copied(leaf):
    if isinstance(leaf, cnp.ndarray):
        return cnp.PyArray_NewCopy(<cnp.ndarray>leaf, cnp.NPY_CORDER)
    return leaf


cdef object _owned(object value):
    """``value`` with every array copied (the caller owns what it gets)."""
    if isinstance(value, cnp.ndarray):
        return _copied(value)
    if type(value) is tuple:
        # The commonest batch, (x, y), copied without building its tree definition: at a
        # batch of one, that would cost several times the rest of the step.
        parts = []
        for v in <tuple>value:
            if not isinstance(v, cnp.ndarray):
                break
            parts.append(cnp.PyArray_NewCopy(<cnp.ndarray>v, cnp.NPY_CORDER))
        else:
            return tuple(parts)
    return _tree.map_tree(_copied, value)


cdef int64_t _count_items(value):
    """Observations in a batch a container formed itself: the length of its first leaf
    (the value itself when it holds no leaf: an empty tuple or dict)."""
    leaves = _tree.tree_leaves(value)
    if leaves:
        value = leaves[0]
    if isinstance(value, cnp.ndarray):
        return value.shape[0] if value.ndim else 1
    # Rows first: a sparse matrix has a shape but refuses len().
    shape = getattr(value, "shape", None)
    if isinstance(shape, tuple) and len(shape):
        return shape[0]
    return len(value) if hasattr(value, "__len__") else 1


cdef void _collect(value, list into, bint bases) except *:
    """The arrays of ``value`` and the tuples and dicts holding them, into ``into``; with
    ``bases``, the arrays each one is a view of too (numpy makes a new view refer to the
    first array of the chain that owns its memory or sits on a foreign buffer)."""
    if isinstance(value, cnp.ndarray):
        into.append(value)
        while bases and isinstance(value.base, cnp.ndarray):
            value = value.base
            into.append(value)
    elif isinstance(value, (tuple, dict)):
        into.append(value)
        for member in (value.values() if isinstance(value, dict) else value):
            _collect(member, into, bases)


cdef class SlotWatch:
    """Whether anything outside the loader still refers to what a slot handed out.

    The watched objects are the slot's arrays (every view of them, and every tensor made
    from a view, holds a reference to one of them) and its cached value's views, tuples and
    dicts; their reference counts are taken when the ring is made, before anyone else can
    hold them. A count above that later means the consumer kept part of a batch. An
    iteration starts by raising the limit to the counts it finds (``arm``): a loop variable
    of an earlier iteration over the same ring is not a batch kept from this one. The check
    reads one count per object: tens of nanoseconds a step."""
    cdef list objects
    cdef Py_ssize_t *base
    cdef Py_ssize_t *counts
    cdef Py_ssize_t n

    def __cinit__(self, dests, value):
        self.objects = []
        _collect(value, self.objects, False)
        for dest in dests:
            _collect(dest, self.objects, True)
        self.n = len(self.objects)
        self.base = <Py_ssize_t *>calloc(2 * max(self.n, 1), sizeof(Py_ssize_t))
        if self.base == NULL:
            raise MemoryError()
        self.counts = self.base + max(self.n, 1)

    cdef void measure(self) noexcept:
        cdef Py_ssize_t k
        for k in range(self.n):
            self.base[k] = self.counts[k] = Py_REFCNT(PyList_GET_ITEM(self.objects, k))

    cdef void arm(self) noexcept:
        cdef Py_ssize_t k
        for k in range(self.n):
            self.counts[k] = max(self.base[k], Py_REFCNT(PyList_GET_ITEM(self.objects, k)))

    cdef bint held(self) noexcept:
        cdef Py_ssize_t k
        for k in range(self.n):
            if Py_REFCNT(PyList_GET_ITEM(self.objects, k)) > self.counts[k]:
                return True
        return False

    def __dealloc__(self):
        free(self.base)


def watch_ring(list ring, list values):
    """A ``SlotWatch`` per slot of a ring just made (``ring[s]``: the slot's destinations,
    ``values[s]``: its cached value or None), counting the references the loader holds."""
    if len(values) != len(ring):
        raise ValueError("a ring needs one value per slot")
    watches = [SlotWatch(ring[s], values[s]) for s in range(len(ring))]
    for watch in watches:
        (<SlotWatch>watch).measure()
    return watches


cdef cnp.ndarray _steps_array(value, str message):
    """``value`` as a plain 1-D C-contiguous int64 array (a view of it), else TypeError with
    ``message``; checked on the view, whatever a subclass of ndarray says of itself."""
    if not isinstance(value, np.ndarray):
        raise TypeError(message)
    cdef cnp.ndarray array = np.asarray(value)
    if array.dtype != np.int64 or array.ndim != 1 or not cnp.PyArray_IS_C_CONTIGUOUS(array):
        raise TypeError(message)
    return array


cdef double _WAIT_S = 0.1      # longest wait between two checks for Ctrl-C
# Adapting (start_run's adaptive): the caller's time in next() per step is measured over
# a window of steps loaded by the pool, one loaded in the caller's thread, and one more of
# the pool (what else runs at an epoch's start, such as the next epoch's order being
# drawn, slows the first), each after the steps loaded ahead before it; the run goes on in
# the caller's thread when that took less than the pool's better window. A window is _ADAPT_BLOCKS blocks of at least _ADAPT_STEPS steps and _ADAPT_S
# seconds each (or _ADAPT_MAX_STEPS steps), and counts the median of their means per step:
# a stall of the process (another thread holding the GIL, the scheduler) moves one block.
cdef int _ADAPT_SKIP = 8
cdef int _ADAPT_BLOCKS = 8
cdef int _ADAPT_STEPS = 4
cdef int _ADAPT_MAX_STEPS = 128
cdef double _ADAPT_S = 0.0003
# Phases of adapting, in order.
cdef enum:
    ADAPT_OFF = 0           # not adapting, or decided
    ADAPT_SKIP_POOL = 1     # steps before the pool's window: not measured
    ADAPT_POOL = 2          # measuring the pool
    ADAPT_SKIP_INLINE = 3   # steps the pool loaded ahead, delivered first: not measured
    ADAPT_INLINE = 4        # measuring the caller's thread
    ADAPT_SKIP_POOL2 = 5    # the pool starting again: not measured
    ADAPT_POOL2 = 6         # measuring the pool again
cdef object _END = object()
cdef object _EMPTY = object()   # a step none of whose observations loaded

_STOPPED = {
    FL_ECANCELLED: "the loader was closed while this iteration ran",
    FL_EFORKED: "this iteration was started before the process forked: it cannot go on in "
                "the child; start a new one there",
    FL_ETHREADS: "could not start the native thread pool",
}


cdef double _median(double *values, int n) noexcept:
    """The median of ``values[:n]`` (sorted in place)."""
    cdef int i, j
    cdef double v
    for i in range(1, n):
        v, j = values[i], i - 1
        while j >= 0 and values[j] > v:
            values[j + 1] = values[j]
            j -= 1
        values[j + 1] = v
    return values[n // 2] if n % 2 else (values[n // 2 - 1] + values[n // 2]) / 2


def _check_run(nfields, first_step, end_step, parallel, claim_size, adaptive, filler):
    """Raise ValueError for arguments of ``Iteration.start_run`` that make no run."""
    if nfields < 1:
        raise ValueError("a run loads at least one field")
    if first_step < 0 or end_step < 0:
        raise ValueError(f"steps [{first_step}, {end_step}) of a schedule: they count from 0")
    if parallel < 0:
        raise ValueError(f"parallel is a number of pool threads (0: inline), not {parallel}")
    if claim_size < 1:
        raise ValueError(f"a claim takes at least one item, not {claim_size}")
    if adaptive and filler is not None:
        raise ValueError("adaptive=True needs fields that run no Python code (no filler)")


cdef class Iteration:
    """One pass over a schedule's steps: the delivery loop shared by every transport.

    Each ``next()`` releases the slot handed out before (with ``buffer``, the one before
    that, warning once if the consumer still refers to it: see ``SlotWatch``), waits for
    the next step's slot (in order, or the first finished with ``ordered=False``) and
    returns its value: the slot's cached arrays when the step is whole, else
    ``plan.assemble(...)``; a copy the caller owns unless ``buffer``. A failed item raises ``plan.load_error(...)``; skipped
    ones are counted, and a step none of whose observations loaded is passed over. The
    steps come from a native run (``start_run``: inline or on the pool) or from a
    transport object (``start_transport``: worker processes), whose ``next(release)``
    returns a ``Reply`` (``_base/replies.py``) or None at the end, whose
    ``copied(slot)`` hears that the consumer took a copy of the slot's step (``buffer=False``),
    and whose ``lend(slot, value)`` may hand a whole step's value out as it is, keeping the
    slot until the caller drops it (None: copy it). ``_loading/seams.py`` declares both
    (``Plan``, ``Transport``) and names the tuples.
    ``check(step)``, when given, runs before a step's value is handed out (a packed
    dataset's checksums, with ``verify="read"``); what it raises ends the iteration.
    ``copier(value)``, when given, makes the consumer's copy of a step (``buffer=False``)
    in place of copying its arrays with numpy.

    Slots: ``ring[slot]`` is the list of a slot's destination arrays (None for fields with
    no array); ``values[slot]`` its whole step's value (None: assemble every time);
    ``objects[slot]`` the lists Python fields collect into; ``watches[slot]`` its
    ``SlotWatch`` (with ``buffer``). Only the running step's tasks write into a slot, and a
    slot is reused only after the consumer released it.

    What C points into is the binding's own: the ring and the watches are copied (as
    tuples) when the iteration is made, and a run copies the steps of the order and bounds
    it loads, so that nothing the caller does to its lists or arrays afterwards reaches C.
    """
    cdef fl_run *run
    cdef object transport
    cdef Fields fields
    cdef object order, bounds      # the run's own copies, from its first step on
    cdef int64_t first_step        # the schedule's step that C numbers 0
    cdef int64_t first_item        # the position in the schedule's order that C numbers 0
    cdef readonly object plan
    cdef tuple ring, watches
    cdef list values
    cdef readonly list objects
    cdef dict errors
    cdef object filler, on_end, check, watched, gated, copier
    cdef bint buffer, release_gil, count_values, busy
    cdef bint adaptive  # a native run that may go inline (start_run's adaptive)
    cdef int adapt_phase, adapt_left, adapt_steps  # ADAPT_*; steps to skip, measured
    cdef int adapt_ring  # the ring's slots: steps loaded ahead at most
    cdef double adapt_s, pool_s, inline_s  # time in next() in the block; per step
    cdef int adapt_block  # the block of the window being measured
    cdef double adapt_means[8]  # the window's blocks' means per step (_ADAPT_BLOCKS)
    # Called with True (the caller's thread loads the rest) or False (the pool does) once
    # an adaptive run decided.
    cdef public object on_adapted
    cdef readonly bint done
    cdef bint warned
    cdef int held, previous
    cdef int64_t rows
    cdef Stats stats
    cdef Progress progress
    cdef double last
    cdef object __weakref__

    def __cinit__(self, plan, *, list ring not None, list values not None,
                  list objects not None, int64_t rows, bint buffer, Stats stats not None,
                  Progress progress not None,
                  on_end=None, bint count_values=False, check=None, list watches=None,
                  copier=None):
        if len(values) != len(ring) or len(objects) != len(ring) or not ring:
            raise ValueError("a ring needs at least one slot, with a value and objects each")
        if rows < 1:
            raise ValueError(f"a step holds at least one observation, not {rows}")
        if watches is not None and len(watches) != len(ring):
            raise ValueError("a ring needs one SlotWatch per slot")
        if buffer and len(ring) < 2:
            raise ValueError("buffer=True needs a ring of at least two slots: the consumer "
                             "holds the last step and the one before it")
        try:
            self.ring = tuple([tuple(dests) for dests in ring])
        except TypeError:
            raise TypeError("each slot of a ring is a sequence of its destinations") from None
        # A watch is called through C, as a SlotWatch.
        if watches is not None and not all([isinstance(w, SlotWatch) for w in watches]):
            raise TypeError("watches must be SlotWatch objects (watch_ring makes them)")
        self.watches = None if watches is None else tuple(watches)
        self.plan = plan
        self.values, self.objects = values, objects
        self.rows = rows
        self.buffer = buffer
        self.stats, self.progress = stats, progress
        self.on_end = on_end
        self.check = check
        self.count_values = count_values
        self.errors = {}
        self.copier = copier
        self.held = self.previous = -1
        # After the copies above: the references they hold are the loader's, not a batch kept.
        for watch in self.watches or ():
            (<SlotWatch>watch).arm()

    def start_run(self, Fields fields not None, *, cnp.ndarray order not None, bounds,
                  int64_t first_step, int64_t end_step, uint64_t seed, uint64_t epoch,
                  int parallel, int64_t claim_size, bint ordered, bint skip_errors, bint release_gil,
                  filler, bint adaptive=False):
        """Load steps [first_step, end_step) of ``order`` (int64, C-contiguous) natively:
        ``rows`` items a step, or at the offsets ``bounds`` (int64, ``end_step + 1`` of
        them, each step 1 to ``rows`` items). In the caller's thread when ``parallel`` is
        0, else on up to ``parallel`` pool threads claiming ``claim_size`` (at least 1)
        items at a time. ``filler(slot, field, pos, index)`` loads an item of a Python field
        (with the GIL). ``adaptive`` (parallel, no ``filler``): the time the caller spends
        in ``next()`` is measured over some steps loaded by the pool, then over some loaded
        in the caller's thread (``go_inline``) and by the pool again; the run goes on the way
        that took less, and calls ``on_adapted(inline)`` when it decided. The run loads
        from its own copy of the part of ``order`` and ``bounds`` those steps use: changing
        them afterwards changes nothing. Raises TypeError for an order or bounds of another
        kind, ValueError for bounds that do not fit, for a negative step, ``parallel`` or a
        ``claim_size`` below 1, and for ``adaptive`` with a ``filler``."""
        if self.run != NULL or self.transport is not None:
            raise RuntimeError("this iteration was started already")
        order = _steps_array(order, "a schedule's order must be a 1-D C-contiguous int64 array")
        _check_run(fields.nfields, first_step, end_step, parallel, claim_size, adaptive, filler)
        # The steps to load, from C's step 0 on: first_item and end_item delimit the part of
        # the order they use. Python integers: rows may be any positive int64.
        cdef object rows = self.rows
        cdef Py_ssize_t items = order.shape[0], first_item, end_item
        if bounds is not None:
            bounds = _steps_array(bounds, "a schedule's bounds must be a C-contiguous int64 "
                                          "array of steps + 1 offsets")
            if bounds.shape[0] <= end_step:
                raise TypeError("a schedule's bounds must be a C-contiguous int64 array of "
                                "steps + 1 offsets")
            first_step = min(first_step, end_step)
            bounds = bounds[first_step:end_step + 1].copy()
            if not 0 <= bounds[0] <= bounds[-1] <= items:
                raise ValueError(f"the schedule's bounds must cut the order into steps of 1 "
                                 f"to {self.rows} observations")
            first_item, end_item = bounds[0], bounds[-1]
            bounds -= first_item
        else:
            # No more steps than the order holds.
            end_step = min(end_step, items // rows + (items % rows != 0))
            first_step = min(first_step, end_step)
            first_item, end_item = min(first_step * rows, items), min(end_step * rows, items)
        order = order[first_item:end_item].copy()
        cdef const int64_t *bounds_data = NULL
        if bounds is not None:
            bounds_data = <const int64_t *>cnp.PyArray_DATA(<cnp.ndarray>bounds)
        cdef Py_ssize_t nslots = len(self.ring), nfields = fields.nfields, f, s
        cdef char **dst = <char **>calloc(nslots * nfields, sizeof(char *))
        if dst == NULL:
            raise MemoryError()
        try:
            for s in range(nslots):
                if len(self.ring[s]) != nfields:
                    raise ValueError(f"{len(self.ring[s])} destinations for {nfields} fields")
                for f in range(nfields):
                    dst[s * nfields + f] = self._destination(fields, f, self.ring[s][f])
            self.fields, self.order, self.bounds, self.filler = fields, order, bounds, filler
            self.first_step, self.first_item = first_step, first_item
            self.release_gil = release_gil or parallel > 0
            self.run = fl_run_create(<const int64_t *>cnp.PyArray_DATA(<cnp.ndarray>order),
                                     bounds_data, end_item - first_item, self.rows, 0,
                                     end_step - first_step, seed, epoch, fields.fields,
                                     fields.nfields, dst, nslots, parallel, claim_size, ordered,
                                     skip_errors, <void *>self)
        finally:
            free(dst)
        if self.run != NULL and adaptive and parallel > 0:
            self.adaptive = True
            self.adapt_phase, self.adapt_ring = ADAPT_SKIP_POOL, nslots
            self.adapt_left = nslots + _ADAPT_SKIP
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
        if rc != FL_OK:
            raise RuntimeError(_STOPPED.get(rc, fl_strerror(rc).decode()))

    cdef char *_destination(self, Fields fields, int f, dest) except? NULL:
        # Native fields write row_bytes per position: the array must hold exactly that.
        # numpy calls an array of one row C-contiguous whatever its first stride: its bytes
        # are counted too. C-level checks, whatever a subclass says of itself.
        if not fields.kinds[f].native:
            return NULL
        if not isinstance(dest, np.ndarray):
            raise TypeError(f"field {f} needs an array to write into")
        cdef cnp.ndarray array = <cnp.ndarray>dest
        row_bytes = fields.row_bytes[f]
        if (array.ndim == 0 or array.shape[0] < self.rows
                or not cnp.PyArray_IS_C_CONTIGUOUS(array) or not cnp.PyArray_ISWRITEABLE(array)
                or array.strides[0] != row_bytes
                or cnp.PyArray_NBYTES(array) != array.shape[0] * row_bytes):
            raise ValueError(f"field {f}: a destination must be a writeable C-contiguous array "
                             f"of {self.rows} rows of {row_bytes} bytes")
        return <char *>cnp.PyArray_DATA(array)

    def watch(self, cnp.ndarray word not None, int64_t value):
        """Count the run as cancelled once ``word[0]`` (an int64 array, in memory another
        process may write) no longer holds ``value``: a worker process's run stops when
        its consumer moves to another generation. Call after ``start_run``."""
        if self.run == NULL:
            raise RuntimeError("watch needs a native run: call start_run first")
        # Read atomically by C: an aligned int64 (the memory stays the caller's to write;
        # the binding holds the array, so that it lives as long as the run).
        if (np.asarray(word).dtype != np.int64 or word.ndim != 1 or word.shape[0] < 1
                or not cnp.PyArray_ISALIGNED(word)):
            raise TypeError("the watched word must be a 1-D aligned int64 array")
        self.watched = word
        fl_run_watch(self.run, <const int64_t *>cnp.PyArray_DATA(word), value)

    @property
    def is_gated(self):
        """Whether a gate holds the run back (``gate``)."""
        return self.gated is not None

    def gate(self, cnp.ndarray word not None):
        """Claim no item at a position of the schedule's order from ``word[0]`` on (an
        int64 array another thread or process writes: the first position whose data is not
        there yet) until it grows past it. The run then waits without the GIL, so that a
        Python thread may fetch what it waits for; it does not go inline (``adaptive``).
        Call after ``start_run``, before the first step."""
        if self.run == NULL:
            raise RuntimeError("gate needs a native run: call start_run first")
        if (np.asarray(word).dtype != np.int64 or word.ndim != 1 or word.shape[0] < 1
                or not cnp.PyArray_ISALIGNED(word)):
            raise TypeError("the gate must be a 1-D aligned int64 array")
        self.gated = word
        self.release_gil = True
        self.adaptive = False
        fl_run_gate(self.run, <const int64_t *>cnp.PyArray_DATA(word), self.first_item)

    def load_next(self):
        """Load the run's next step without delivering it: a ``Loaded`` (``step``, ``rows``,
        ``failure``: a ``Failure`` or None; ``keep``: the rows' kept flags after skips, or
        None), or None at the end. What a worker process
        replies; its slot is released at the next call. Raises RuntimeError when the run
        was cancelled."""
        cdef int slot, release = self.held
        cdef const fl_slot *s
        if self.run == NULL:
            raise RuntimeError("load_next needs a native run: call start_run first")
        self.held = -1
        while True:
            if self.release_gil:
                with nogil:
                    slot = fl_run_next(self.run, release, _WAIT_S)
            else:
                slot = fl_run_next(self.run, release, _WAIT_S)
            release = -1
            if slot != FL_ETIMEOUT:
                break
            PyErr_CheckSignals()
        if slot == FL_DONE:
            return None
        if slot < 0:
            raise RuntimeError(_STOPPED.get(slot, fl_strerror(slot).decode()))
        self.held = slot
        s = fl_run_slot(self.run, slot)
        return _replies.Loaded(
            self.first_step + s.step, s.rows, self._failure(slot), self._kept(slot))

    def go_inline(self, bint on=True):
        """``on``: from the next step on, load the run's remaining steps in the caller's
        thread, the pool's threads claiming nothing more (what they claimed they finish);
        else back on the pool. What an adaptive run does as it measures which costs the
        caller less. Does nothing inline."""
        if self.run == NULL:
            raise RuntimeError("go_inline needs a native run: call start_run first")
        with nogil:
            fl_run_go_inline(self.run, on)

    cdef int _adapt(self, double spent) except -1:
        """Count a delivered step's time in next() (``spent``) toward adapting."""
        cdef double per_step
        if self.adapt_phase in (ADAPT_SKIP_POOL, ADAPT_SKIP_INLINE, ADAPT_SKIP_POOL2):
            self.adapt_left -= 1
            if self.adapt_left <= 0:
                self.adapt_phase += 1
                self.adapt_steps, self.adapt_s, self.adapt_block = 0, 0.0, 0
            return 0
        self.adapt_steps += 1
        self.adapt_s += spent
        if self.adapt_steps < _ADAPT_MAX_STEPS and (
                self.adapt_steps < _ADAPT_STEPS or self.adapt_s < _ADAPT_S):
            return 0
        self.adapt_means[self.adapt_block] = self.adapt_s / self.adapt_steps
        self.adapt_block += 1
        self.adapt_steps, self.adapt_s = 0, 0.0
        if self.adapt_block < _ADAPT_BLOCKS:
            return 0
        per_step = _median(self.adapt_means, _ADAPT_BLOCKS)
        self.adapt_phase += 1
        if self.adapt_phase == ADAPT_SKIP_INLINE:
            self.pool_s, self.adapt_left = per_step, self.adapt_ring
            fl_run_go_inline(self.run, 1)
        elif self.adapt_phase == ADAPT_SKIP_POOL2:
            self.inline_s, self.adapt_left = per_step, _ADAPT_SKIP
            fl_run_go_inline(self.run, 0)
        else:
            self.adapt_phase = ADAPT_OFF
            inline = self.inline_s < min(self.pool_s, per_step)
            if inline:
                fl_run_go_inline(self.run, 1)
            if self.on_adapted is not None:
                self.on_adapted(inline)
        return 0

    @property
    def inline(self):
        """Whether the caller's thread loads the run's steps now (a run without pool threads,
        or one that went inline); None without a native run."""
        if self.run == NULL:
            return None
        return bool(fl_run_is_inline(self.run))

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
        if self.run == NULL and self.transport is None:
            raise RuntimeError("this iteration was not started: call start_run or "
                               "start_transport first")
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
        if self.adapt_phase != ADAPT_OFF and value is not _END:
            self._adapt(end - start)
        if value is _END:
            self._stop()
            if self.on_end is not None:
                self.on_end()
            raise StopIteration
        self.last = end
        self.stats.batches += 1
        self.progress.step += 1
        return value

    cdef int _release(self):
        """The slot to give back before the next step. With ``buffer``, the one handed out
        two steps ago: the consumer's loop variables have moved on to the last step, so
        anything that still refers to that slot is a batch kept past its validity, about
        to be overwritten (warned about once). Else the last step's slot, copied already."""
        cdef int release
        if not self.buffer:
            release, self.held = self.held, -1
            return release
        release, self.previous, self.held = self.previous, self.held, -1
        if (release >= 0 and not self.warned and self.watches is not None
                and (<SlotWatch>self.watches[release]).held()):
            self.warned = True
            warnings.warn(
                "a batch of a buffer=True loader is still referenced when its memory is "
                "about to be reused for a later batch: what was kept will change. Copy what "
                "you keep (np.copy(x), tensor.clone()) or load with buffer=False",
                RuntimeWarning, stacklevel=1)
        return release

    cdef object _next_native(self):
        cdef int slot, release = self._release()
        cdef const fl_slot *s
        while True:
            # Gone inline, a run of native fields loads in this thread: the GIL stays held
            # (no Python code runs in the run's tasks) rather than paid for per step.
            if self.release_gil and not (self.adaptive and fl_run_is_inline(self.run)):
                with nogil:
                    slot = fl_run_next(self.run, release, _WAIT_S)
            else:
                slot = fl_run_next(self.run, release, _WAIT_S)
            release = -1
            if slot != FL_ETIMEOUT:
                break
            PyErr_CheckSignals()
        if slot == FL_DONE:
            return _END
        if slot < 0:
            raise RuntimeError(_STOPPED.get(slot, fl_strerror(slot).decode()))
        self.held = slot
        s = fl_run_slot(self.run, slot)
        if self.check is not None:
            self.check(self.first_step + s.step)
        value = self.values[slot] if s.rows == self.rows else None
        if value is None or s.failed or s.skipped:
            return self._deliver(slot, s.rows, self._failure(slot), self._kept(slot), None)
        self.stats.items += s.rows
        return value if self.buffer else self._owned(value)

    cdef object _next_transport(self):
        release = self._release()
        reply = self.transport.next(release)
        if reply is None:
            return _END
        slot, rows = reply.slot, reply.rows
        self.held = slot
        if self.check is not None:
            self.check(reply.step)
        value = self.values[slot]
        if (not self.buffer and reply.failure is None and reply.keep is None
                and rows == self.rows and value is not None):
            value = self.transport.lend(slot, value)
            if value is not None:
                self.held = -1     # the transport takes it back once the caller drops it
                self.stats.items += rows
                return value
        value = self._deliver(slot, rows, reply.failure, reply.keep, reply.objects)
        if not self.buffer:
            self.transport.copied(slot)  # nothing refers to the slot's memory any more
        return value

    cdef object _deliver(self, int slot, int64_t rows, failure, keep, objects):
        self.errors.pop(slot, None)
        if failure is not None:
            cause = failure.cause
            if cause is not None and not isinstance(cause, Exception):
                raise cause        # an interrupt is not a failed observation
            raise self.plan.load_error(
                failure.step, failure.field, failure.observation, failure.message, cause)
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
        return value if self.buffer else self._owned(value)

    cdef object _owned(self, value):
        """A copy of a step's ``value`` that the caller owns: ``copier(value)`` when given,
        else its arrays copied."""
        return _owned(value) if self.copier is None else self.copier(value)

    cdef object _failure(self, int slot):
        """The ``Failure`` of the slot's fatal failure, or None."""
        cdef const fl_slot *s = fl_run_slot(self.run, slot)
        if not s.failed:
            return None
        # The run's own order and bounds start at its first step.
        cdef int64_t first = s.step * self.rows if self.bounds is None else self.bounds[s.step]
        cdef int64_t index = (<int64_t *>cnp.PyArray_DATA(self.order))[first + s.fail_pos]
        cause = self.errors.get(slot, {}).get(s.fail_pos)
        if cause is None and s.fail_code == FL_EINTERRUPT:
            cause = KeyboardInterrupt()   # in a decoder called from C, which keeps no traceback
        field = s.fail_field if s.fail_field >= 0 else None
        cdef const char *message = &s.message[0]
        return _replies.Failure(self.first_step + s.step, field, index,
                                message.decode("utf-8", "replace"), cause)

    cdef object _kept(self, int slot):
        cdef const fl_slot *s = fl_run_slot(self.run, slot)
        if not s.skipped:
            return None
        flags = np.asarray(<uint8_t[:s.rows]>s.skipped_items)
        return flags == 0

    cdef int _fill(self, int field, int slot, int64_t pos, int64_t index, char *message) noexcept:
        # Runs on a pool thread (or the consumer's) with the GIL held. Whatever escapes the
        # user's code, the item fails (never passes unfilled), keeping its traceback.
        try:
            self.filler(slot, field, pos, index)
            return FL_OK
        except BaseException as exc:
            _clear_frames(exc)
            self.errors.setdefault(slot, {}).setdefault(pos, exc)
            _write_message(message, exc)
            # Ctrl-C (or SystemExit) in the user's code stops the step, skip or not.
            return FL_EFAILED if isinstance(exc, Exception) else FL_EINTERRUPT
