"""A Python child where the native extension cannot be imported, as on a machine that never
built it: the doctor, capture and the help must work there."""

import subprocess
import sys

WITHOUT_NATIVE = """
import importlib.abc, sys
class NoNative(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name == "gdrprobe._native":
            raise ImportError("gdrprobe._native is not built here")
sys.meta_path.insert(0, NoNative())
"""


def run_without_native(code: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", WITHOUT_NATIVE + code],
                          capture_output=True, text=True, timeout=60)
