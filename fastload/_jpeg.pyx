# cython: language_level=3
"""libjpeg-turbo's region decoder (csrc/jpeg.c), in a module of its own: the only one that
links libjpeg. ``fastload._core`` takes the decoder from here when it loads; where this
module is missing (a build without libjpeg's headers) or cannot be loaded (the library is
gone), the core decodes JPEG through simplejpeg instead, and ``import fastload`` works."""
from cpython.pycapsule cimport PyCapsule_New

from jpeg cimport (FL_JPEG_CAPSULE_NAME, fl_jpeg_decode, fl_jpeg_decode_fn,
                  fl_jpeg_library_version)

cdef fl_jpeg_decode_fn _decode = fl_jpeg_decode


def library_version():
    """The libjpeg-turbo version number this module links, e.g. 2001005 for 2.1.5."""
    return fl_jpeg_library_version()


def decoder():
    """fl_jpeg_decode's address, in a capsule named FL_JPEG_CAPSULE_NAME (jpeg.h), for the
    C core."""
    return PyCapsule_New(<void *>&_decode, FL_JPEG_CAPSULE_NAME, NULL)
