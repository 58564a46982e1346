"""Build of the native layer: csrc/ (the C hot loop) wrapped by gdrprobe/_native.pyx.

Only a C compiler and libibverbs-dev are needed; CUDA comes from cuda-python at run time.
The C and Cython's output build without a warning under -Wall -Wextra (tests/unit/
test_native_build.py holds that); no warning is silenced. There is no -Werror: a user's
newer compiler or Cython may warn where this one does not, and that must not fail pip.
"""

from Cython.Build import cythonize
from setuptools import Extension, setup

CSRC = ["csrc/gdr_clock.c", "csrc/gdr_stats.c", "csrc/gdr_pattern.c", "csrc/gdr_hostmem.c",
        "csrc/gdr_peek.c", "csrc/gdr_loop.c", "csrc/gdr_dmabuf.c", "csrc/gdr_flush.c"]
WARNINGS = ["-Wall", "-Wextra"]

native = Extension(
    "gdrprobe._native",
    sources=["gdrprobe/_native.pyx", *CSRC],
    include_dirs=["csrc"],
    libraries=["ibverbs", "m", "dl"],   # dl: dlvsym before glibc 2.34 moved it into libc
    extra_compile_args=["-O2", *WARNINGS],
)

setup(ext_modules=cythonize([native], compiler_directives={"language_level": "3"}))
