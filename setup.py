"""Builds the native core of fastload: C in csrc/, bound by thin Cython modules.

Two extension modules: fastload._core (every C unit but one) and fastload._jpeg (csrc/jpeg.c,
the only unit that links libjpeg). The core loads the second when it can, so that a
missing libjpeg never stops ``import fastload``: JPEGs then decode through simplejpeg.

JPEG decoding in C (only the crop, without the GIL) needs libjpeg-turbo's headers and
library (Debian/Ubuntu: libjpeg62-turbo-dev or libjpeg-turbo8-dev; Fedora/AlmaLinux:
libjpeg-turbo-devel; macOS: jpeg-turbo; `make` installs it when it can); they are looked
for with $CPPFLAGS, $CFLAGS and $LDFLAGS, so a copy elsewhere is found with
``CPPFLAGS=-I<prefix>/include LDFLAGS=-L<prefix>/lib``. Without them the build still
succeeds, without fastload._jpeg; ``python -m fastload info`` says which decoder a build
has. FASTLOAD_LIBJPEG=0 builds without it; FASTLOAD_LIBJPEG=1 fails the build when it is
missing (release wheels are built so).

FASTLOAD_OPT replaces the optimisation flags (default ``-O3``), which come after ``$CFLAGS``
on the compiler's command line and so would win over any level given there: the sanitizer
builds (``make sanitize``, ``make tsan``) pass ``FASTLOAD_OPT=-O1`` with their ``CFLAGS``.
"""

import glob
import os
import shutil
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor

import numpy
from Cython.Build import cythonize
from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

OPT = os.environ.get("FASTLOAD_OPT", "-O3").split()
CFLAGS = [
    *OPT,
    "-std=c99",
    "-pthread",
    "-Wall",
    "-Wno-unused-function",
    "-Wno-format-truncation",
    "-D_GNU_SOURCE",
    "-DNPY_NO_DEPRECATED_API=NPY_1_7_API_VERSION",
]

# The C units of csrc/ but jpeg.c, each compiled once, into the binding module fastload._core
# (fastload/_core.pyx and its includes; the declarations are csrc/*.pxd).
C_UNITS = [
    "csrc/status.c",
    "csrc/pool.c",
    "csrc/engine.c",
    "csrc/image.c",
    "csrc/augment.c",
    "csrc/qoi.c",
    "csrc/imagesource.c",
    "csrc/mapguard.c",
]


def libjpeg_found():
    """Whether a test program including jpeglib.h links with -ljpeg here, with the flags
    setuptools will pass ($CPPFLAGS, $CFLAGS, $LDFLAGS)."""
    compiler = os.environ.get("CC", "cc").split()[0]
    if not shutil.which(compiler):
        return False
    program = (
        "#include <stdio.h>\n#include <jpeglib.h>\n"
        "int main(void) { struct jpeg_decompress_struct c; jpeg_crop_scanline(&c, 0, 0);"
        " return 0; }\n"
    )
    flags = [
        f for var in ("CPPFLAGS", "CFLAGS", "LDFLAGS") for f in os.environ.get(var, "").split()
    ]
    with tempfile.TemporaryDirectory() as tmp:
        source = os.path.join(tmp, "probe.c")
        with open(source, "w") as f:
            f.write(program)
        result = subprocess.run(
            [compiler, *flags, source, "-o", os.path.join(tmp, "probe"), "-ljpeg"],
            capture_output=True,
        )
    return result.returncode == 0


def use_libjpeg():
    wanted = os.environ.get("FASTLOAD_LIBJPEG", "auto")
    if wanted == "0":
        return False
    found = libjpeg_found()
    if wanted == "1" and not found:
        sys.exit(
            "FASTLOAD_LIBJPEG=1 but jpeglib.h or libjpeg was not found: install "
            "libjpeg62-turbo-dev (Debian), libjpeg-turbo8-dev (Ubuntu) or libjpeg-turbo-devel "
            "(Fedora), or point CPPFLAGS and LDFLAGS at a libjpeg-turbo of version 1.5 or later"
        )
    if not found:
        print(
            "fastload: libjpeg headers not found; JPEG decodes through simplejpeg "
            "(install libjpeg62-turbo-dev for the faster native path)",
            file=sys.stderr,
        )
    return found


LIBJPEG = use_libjpeg()


def extensions():
    core = Extension(
        "fastload._core",
        ["fastload/_core.pyx", *C_UNITS],
        depends=sorted(glob.glob("csrc/*.h")),
        include_dirs=["csrc", numpy.get_include()],
        extra_compile_args=CFLAGS,
        extra_link_args=["-pthread"],
    )
    if not LIBJPEG:
        return [core]
    jpeg = Extension(
        "fastload._jpeg",
        ["fastload/_jpeg.pyx", "csrc/jpeg.c"],
        depends=["csrc/jpeg.h", "csrc/image.h", "csrc/status.h"],
        include_dirs=["csrc"],
        extra_compile_args=CFLAGS,
        libraries=["jpeg"],
    )
    return [core, jpeg]


class BuildExt(build_ext):
    """build_ext that compiles the C files of a module side by side, one per CPU (the
    largest first: the C that Cython generates takes most of the time), where setuptools
    compiles them one after the other. Each file is compiled as setuptools would alone."""

    def build_extensions(self):
        compiler, compile_one = self.compiler, self.compiler.compile
        cpus = os.sched_getaffinity(0) if hasattr(os, "sched_getaffinity") else None
        jobs = min(len(cpus) if cpus else os.cpu_count() or 1, 8)

        def compile_all(sources, *args, **kwargs):
            if jobs == 1 or len(sources) < 2:
                return compile_one(sources, *args, **kwargs)
            order = sorted(sources, key=lambda f: -os.path.getsize(f))
            with ThreadPoolExecutor(jobs) as pool:
                objects = dict(
                    zip(order, pool.map(lambda f: compile_one([f], *args, **kwargs), order))
                )
            return [obj for f in sources for obj in objects[f]]

        compiler.compile = compile_all
        try:
            super().build_extensions()
        finally:
            compiler.compile = compile_one


setup(
    cmdclass={"build_ext": BuildExt},
    ext_modules=cythonize(
        extensions(),
        include_path=["csrc"],
        language_level=3,
        # Indexing is bounds-checked but in the few inner loops that turn it off for
        # themselves: unchecked, a short tuple read past its end kills the interpreter.
        compiler_directives={"wraparound": False, "cdivision": True},
    ),
)
