"""Where the probe's bytes live: the provider interface, host memory, the CUDA driver and
the GPU providers, the buffer spec, and why a registration failed.

Importing this package loads nothing heavy: pyverbs, the native extension and CUDA are
loaded by the modules that use them (``spec`` and ``causes`` are pure)."""
