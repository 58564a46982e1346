"""Compile the stand-in libnvidia-ml.so.1 (standin.c) at test time, into a directory named
after a hash of its source and flags under the system's temporary directory. Load it by
path (:func:`gdrprobe.doctor.facts.nvml_library.open_nvml`'s ``library``) or put the
directory first on LD_LIBRARY_PATH (a child process, as the driver's library is found).
NVML's call shapes and NCCL's reading of them, not a GPU."""

from __future__ import annotations

import os
import pathlib

from tests.standin_build import build_once

HERE = pathlib.Path(__file__).parent
SOURCE = HERE / "standin.c"
LIBRARY = "libnvidia-ml.so.1"
# A driver whose NVML has no nvmlDeviceGetNvLinkRemoteDeviceType (what NCCL 2.31 asks first).
VARIANTS = {"": [], "no-remote-device-type": ["-DSTANDIN_NO_REMOTE_DEVICE_TYPE"]}


def build(variant: str = "") -> pathlib.Path:
    """The compiled stand-in's path; compiled once per source and flags."""
    flags = VARIANTS[variant]
    return build_once("nvml", LIBRARY, (SOURCE,), [*flags, "-Wl,-soname," + LIBRARY, str(SOURCE)],
                      key=" ".join(flags)) / LIBRARY


def settings(gpus=(), nvlinks=(), c2c=(), fail=(), hang=()) -> dict[str, str]:
    """The stand-in's environment (standin.c's header): gpus as (bus id, sm) pairs in NVML's
    index order; nvlinks as "BUS>END*N" items; c2c as "BUS=N[/ACTIVE]"; fail and hang as
    "call=value"."""
    return {"GDRPROBE_NVML_GPUS": ",".join(f"{bus}@{sm}" for bus, sm in gpus),
            "GDRPROBE_NVML_NVLINKS": ",".join(nvlinks), "GDRPROBE_NVML_C2C": ",".join(c2c),
            "GDRPROBE_NVML_FAIL": ",".join(fail), "GDRPROBE_NVML_HANG_S": ",".join(hang)}


def environment(base: dict | None = None, variant: str = "", **stand_in) -> dict:
    """os.environ (or base) with the stand-in first on LD_LIBRARY_PATH and its settings."""
    env = dict(os.environ if base is None else base)
    path = [str(build(variant).parent)] + [p for p in env.get("LD_LIBRARY_PATH", "").split(":") if p]
    return {**env, "LD_LIBRARY_PATH": ":".join(path), **settings(**stand_in)}
