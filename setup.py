"""Builds the native core of fastload: C in csrc/, bound by thin Cython modules.

JPEG decoding in C (only the crop, without the GIL) needs libjpeg(-turbo)'s headers and
library (Debian/Ubuntu: libjpeg62-turbo-dev or libjpeg-turbo8-dev; `make` installs it when
it can). Without them the build still succeeds and JPEGs decode through simplejpeg;
``python -m fastload info`` says which decoder a build has. FASTLOAD_LIBJPEG=0 builds
without it; FASTLOAD_LIBJPEG=1 fails the build when it is missing.

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

import numpy
from Cython.Build import cythonize
from setuptools import Extension, setup

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

# The C units of csrc/, each compiled once, into the one binding module fastload._core
# (fastload/_core.pyx and its includes; the declarations are csrc/*.pxd).
C_UNITS = [
    "csrc/status.c",
    "csrc/pool.c",
    "csrc/engine.c",
    "csrc/image.c",
    "csrc/augment.c",
    "csrc/qoi.c",
    "csrc/jpeg.c",
    "csrc/imagesource.c",
    "csrc/mapguard.c",
]


def libjpeg_found():
    """Whether a test program including jpeglib.h links with -ljpeg here."""
    compiler = os.environ.get("CC", "cc").split()[0]
    if not shutil.which(compiler):
        return False
    program = (
        "#include <stdio.h>\n#include <jpeglib.h>\n"
        "int main(void) { struct jpeg_decompress_struct c; jpeg_crop_scanline(&c, 0, 0);"
        " return 0; }\n"
    )
    with tempfile.TemporaryDirectory() as tmp:
        source = os.path.join(tmp, "probe.c")
        with open(source, "w") as f:
            f.write(program)
        result = subprocess.run(
            [compiler, source, "-o", os.path.join(tmp, "probe"), "-ljpeg"], capture_output=True
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
            "libjpeg62-turbo-dev (Debian) or libjpeg-turbo8-dev (Ubuntu)"
        )
    if not found:
        print(
            "fastload: libjpeg headers not found; JPEG decodes through simplejpeg "
            "(install libjpeg62-turbo-dev for the faster native path)",
            file=sys.stderr,
        )
    return found


LIBJPEG = use_libjpeg()


def core_extension():
    return Extension(
        "fastload._core",
        ["fastload/_core.pyx", *C_UNITS],
        depends=sorted(glob.glob("csrc/*.h")),
        include_dirs=["csrc", numpy.get_include()],
        extra_compile_args=CFLAGS + (["-DFL_HAVE_LIBJPEG"] if LIBJPEG else []),
        extra_link_args=["-pthread"],
        libraries=["jpeg"] if LIBJPEG else [],
    )


setup(
    ext_modules=cythonize(
        [core_extension()],
        include_path=["csrc"],
        language_level=3,
        # Indexing is bounds-checked but in the few inner loops that turn it off for
        # themselves: unchecked, a short tuple read past its end kills the interpreter.
        compiler_directives={"wraparound": False, "cdivision": True},
    ),
)
