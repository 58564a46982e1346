"""Build of the native layer: csrc/ (the C hot loop) wrapped by gdrprobe/_native.pyx.

Only a C compiler and libibverbs-dev are needed; CUDA comes from cuda-python at run time.
The C and Cython's output build without a warning under -Wall -Wextra (tests/unit/
test_native_build.py holds that); no warning is silenced. There is no -Werror: a user's
newer compiler or Cython may warn where this one does not, and that must not fail pip.
"""

from Cython.Build import cythonize
from setuptools import Extension, setup

CSRC = ["csrc/gdr_clock.c", "csrc/gdr_stats.c", "csrc/gdr_pattern.c", "csrc/gdr_hostmem.c",
        "csrc/gdr_peek.c", "csrc/gdr_wait.c", "csrc/gdr_loop.c", "csrc/gdr_dmabuf.c",
        "csrc/gdr_flush.c"]
WARNINGS = ["-Wall", "-Wextra"]


def extension(name: str, sources: list[str]) -> Extension:
    return Extension(name, sources=sources, include_dirs=["csrc"],
                     libraries=["ibverbs", "m", "dl"],   # dl: dlvsym before glibc 2.34 moved it into libc
                     extra_compile_args=["-O2", *WARNINGS])


native = extension("gdrprobe._native", ["gdrprobe/_native.pyx", *CSRC])
# NCCL's traffic pattern: its own module beside _native (which it cimports for the stop flag
# and the loop clock), the C it runs linked in again
nccl = extension("gdrprobe._nccl", ["gdrprobe/_nccl.pyx", "csrc/gdr_nccl.c",
                                    "csrc/gdr_nccl_schedule.c", "csrc/gdr_wait.c",
                                    "csrc/gdr_clock.c", "csrc/gdr_pattern.c"])

setup(ext_modules=cythonize([native, nccl], compiler_directives={"language_level": "3"}))
