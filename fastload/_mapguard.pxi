"""Guarded file maps: the binding of mapguard.h (a file that shrinks under its map)."""
from cpython.buffer cimport PyBUF_SIMPLE, PyBuffer_FillInfo, PyBuffer_Release, PyObject_GetBuffer

from mapguard cimport *
from status cimport FL_EINVAL, FL_OK, fl_strerror


cdef class FileGuard:
    """The bytes of a memory-mapped file (``mapping``: any object exporting them, an
    ``mmap``), guarded: a read past the file's end, once it shrank under the map, reads
    zeros and counts a fault instead of killing the process by SIGBUS. Exports the same
    bytes, read-only; holds ``mapping``'s export (the map stays while this object or a
    view of it lives) and stops guarding when dropped.

    Raises OSError when the SIGBUS handler cannot be installed, ValueError for an empty
    mapping and MemoryError when every guard slot is in use.
    """
    cdef Py_buffer view
    cdef int id
    cdef bint held

    def __cinit__(self, mapping):
        self.id = -1
        PyObject_GetBuffer(mapping, &self.view, PyBUF_SIMPLE)
        self.held = True
        if fl_guard_install() != FL_OK:
            raise OSError("cannot install the SIGBUS handler that guards file maps")
        cdef int found = fl_guard_add(self.view.buf, <size_t>self.view.len)
        if found == FL_EINVAL:
            raise ValueError("an empty mapping cannot be guarded")
        if found < 0:
            raise MemoryError(f"cannot guard another file map: {fl_strerror(found).decode()}")
        self.id = found

    def __getbuffer__(self, Py_buffer *buffer, int flags):
        PyBuffer_FillInfo(buffer, self, self.view.buf, self.view.len, 1, flags)

    def __releasebuffer__(self, Py_buffer *buffer):
        pass

    def __len__(self):
        return self.view.len

    @property
    def faults(self):
        """Reads past the file's end answered with zeros in this map, in this process."""
        return fl_guard_faults(self.id) if self.id >= 0 else 0

    def __dealloc__(self):
        if self.id >= 0:
            fl_guard_remove(self.id)
        if self.held:
            PyBuffer_Release(&self.view)


def guarded_faults():
    """Reads past a file's end answered with zeros in any guarded map, in this process and
    in the processes forked from it (worker processes): a number that grows."""
    return fl_guard_all_faults()
