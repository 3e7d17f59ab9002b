"""Builds the native core of fastload: plain C99 in csrc/, bound by thin Cython modules."""
import numpy
from Cython.Build import cythonize
from setuptools import Extension, setup

CFLAGS = ["-O3", "-std=c99", "-pthread", "-Wall", "-Wno-unused-function", "-Wno-format-truncation",
          "-D_GNU_SOURCE", "-DNPY_NO_DEPRECATED_API=NPY_1_7_API_VERSION"]

# Each binding module and the C units it links; a C unit may be linked into more than one.
MODULES = {
    "fastload._core": ["csrc/pool.c", "csrc/engine.c", "csrc/imageplan.c", "csrc/image.c",
                       "csrc/qoi.c", "csrc/augment.c"],
    "fastload._image": ["csrc/image.c", "csrc/augment.c"],
    "fastload._qoi": ["csrc/qoi.c"],
}


def extension(name, c_sources):
    pyx = name.replace(".", "/") + ".pyx"
    return Extension(
        name,
        [pyx, *c_sources],
        include_dirs=["csrc", numpy.get_include()],
        extra_compile_args=CFLAGS,
        extra_link_args=["-pthread"],
    )


setup(
    ext_modules=cythonize(
        [extension(name, sources) for name, sources in MODULES.items()],
        language_level=3,
        compiler_directives={"boundscheck": False, "wraparound": False, "cdivision": True},
    ),
)
