"""Build of the native layer: csrc/ (the C hot loop) wrapped by gdrprobe/_native.pyx.

Only a C compiler and libibverbs-dev are needed; CUDA comes from cuda-python at run time.
"""

from Cython.Build import cythonize
from setuptools import Extension, setup

CSRC = ["csrc/gdr_clock.c", "csrc/gdr_stats.c", "csrc/gdr_pattern.c", "csrc/gdr_hostmem.c", "csrc/gdr_loop.c"]

native = Extension(
    "gdrprobe._native",
    sources=["gdrprobe/_native.pyx", *CSRC],
    include_dirs=["csrc"],
    libraries=["ibverbs", "m"],
    extra_compile_args=["-O2", "-Wall", "-Wno-unused-function", "-Wno-sign-compare"],
)

setup(ext_modules=cythonize([native], compiler_directives={"language_level": "3"}))
