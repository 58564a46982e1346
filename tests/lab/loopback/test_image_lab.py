"""The OCI image's gdrprobe (`./dev image`, lab/image.py) on the guest's Soft-RoCE device.

The image's root filesystem, as `umoci unpack` made it from the layout that went into the
archive, is entered with chroot, with the guest's /dev, /sys and /proc bound in: what a
container runtime gives a container started with `--device /dev/infiniband`. The kernel, its
rxe0 and /dev/infiniband/uverbs0 are the guest's; Python, pyverbs, libibverbs, the rxe
provider, cuda-python and gdrprobe with its native loop are all the image's. It proves those
reach a real verbs device and run the gate to its answer, and with the stand-in libcuda.so.1
mounted in as the NVIDIA runtime mounts a driver, that the image's GPU path reaches a measured
verdict. It does not prove a container runtime (namespaces, cgroups, seccomp), the NVIDIA
runtime itself, or anything about a GPU: there is none here.
"""

import json
import os
import subprocess

import pytest

from lab.image import ENTRYPOINT, ENV_PATH, LATEST
from tests.cuda_standin.build import build
from tests.lab.helpers import rdma_resources

ROOTFS = os.path.join(LATEST, "bundle", "rootfs")
IMAGE_SITE = "/usr/local/lib/python3"    # where lab/image.py installs the wheels

pytestmark = pytest.mark.skipif(not os.path.isfile(ROOTFS + ENTRYPOINT),
                                reason="the image is not built: run ./dev image")

# In a mount namespace of its own, so the mounts go when the command ends, however it ends.
# The image's /tmp is a tmpfs: the guest shares this checkout read-only. A driver directory,
# when given, is bound at /tmp/driver, as the NVIDIA runtime mounts the node's libcuda.so.1.
ENTER = ('root=$1; driver=$2; shift 2; mount --bind /dev "$root/dev" && '
         'mount --bind /sys "$root/sys" && mount -t proc proc "$root/proc" && '
         'mount -t tmpfs tmpfs "$root/tmp" && '
         '{ [ -z "$driver" ] || { mkdir "$root/tmp/driver" && '
         'mount --bind "$driver" "$root/tmp/driver"; }; } && exec chroot "$root" "$@"')


def in_image(*argv: str, timeout: float = 300, driver: str = "",
             env: dict | None = None) -> subprocess.CompletedProcess:
    """argv run inside the image, with the image's PATH and nothing of this venv's."""
    return subprocess.run(["unshare", "--mount", "--propagation", "private", "sh", "-c", ENTER,
                           "enter", ROOTFS, driver, *argv],
                          capture_output=True, text=True, timeout=timeout,
                          env={"PATH": ENV_PATH, "HOME": "/root", **(env or {})})


def test_the_image_runs_its_own_gdrprobe_and_pyverbs():
    done = in_image("python3", "-c", "import cuda.bindings, gdrprobe._native, pyverbs; "
                    "print(gdrprobe._native.__file__); print(pyverbs.__file__)")
    assert done.returncode == 0, done.stderr
    native, pyverbs = done.stdout.split()
    assert native.startswith(f"{IMAGE_SITE}.") and "/dist-packages/gdrprobe/" in native
    assert pyverbs.startswith("/usr/lib/python3/dist-packages/pyverbs/")   # Debian's


def test_devices_in_the_image_see_the_guests_rxe_device():
    done = in_image("gdrprobe", "devices", "--json")
    assert done.returncode == 0, done.stderr
    device = {d["name"]: d for d in json.loads(done.stdout)["devices"]}["rxe0"]
    port = device["ports"][0]
    assert port["state"] == "ACTIVE" and port["link_layer"] == "Ethernet"
    assert any(g["type"] == "RoCE v2" and g["ip_address"] == "127.0.0.1" for g in port["gids"])


def test_check_in_the_image_measures_the_host_arm_and_answers_not_testable(baseline):
    """No GPU here: the host arm runs over rxe0 through the image's native loop, the GPU arm
    finds no CUDA driver (cuda-python is in the image, or this would be exit 3), exit 9."""
    done = in_image("gdrprobe", "check", "--json", "--time-budget", "60", timeout=180)
    assert done.returncode == 9, done.stderr
    report = json.loads(done.stdout)
    assert report["verdict"]["classification"] == "not testable"
    assert report["placement"]["nic"] == "rxe0"
    host, gpu = report["arms"]
    assert host["outcome"] == "measured" and len(host["bandwidths_gbps"]) == 1
    assert gpu["outcome"] == "not testable" and "no CUDA driver" in gpu["detail"]
    assert rdma_resources() == baseline


def test_check_in_the_image_drives_a_mounted_in_driver_to_a_measured_verdict(baseline):
    """The stand-in libcuda.so.1 (tests/cuda_standin) bound into the image, as the NVIDIA
    runtime mounts the node's driver: the image's cuda-python drives it, its "GPU memory"
    (host memory here) registers on rxe0 through peermem and the gate measures both arms.
    The image's GPU path end to end; the ratio compares host memory with host memory."""
    try:
        driver = str(build())
    except (RuntimeError, subprocess.CalledProcessError) as error:
        pytest.skip(f"the stand-in libcuda.so.1 could not be built: {error}")
    done = in_image("gdrprobe", "check", "--json", "--time-budget", "120", "-s", "64K",
                    "--repeats", "1", driver=driver, timeout=600,
                    env={"LD_LIBRARY_PATH": "/tmp/driver", "GDRPROBE_LOCK_DIR": "/tmp"})
    assert done.stdout, done.stderr
    report = json.loads(done.stdout)
    assert report["verdict"]["classification"] in ("engaged", "degraded"), report["verdict"]
    assert done.returncode == report["verdict"]["exit_code"]
    gpu = report["arms"][1]
    assert gpu["outcome"] == "measured"
    # peermem on rxe; dmabuf where the lab's dma-buf exporter module is loaded (docs/lab.md)
    assert gpu["local_memory"]["kind"] == "gpu"
    assert gpu["local_memory"]["mechanism"] in ("peermem", "dmabuf"), gpu["local_memory"]
    assert report["placement"]["nic"] == "rxe0"
    assert rdma_resources() == baseline


NPD_DIR = os.path.join(os.path.dirname(__file__), "..", "..", "..", "deploy", "npd")


def test_the_npd_plugin_in_the_image_checks_and_writes_its_metrics(baseline):
    """deploy/npd/ as the DaemonSet mounts it (bound at /tmp/driver here) run by the image's
    Python, as NPD runs it: the check runs with --prometheus (the image ships
    prometheus_client: issue 29 found every run exit 3), answers Unknown for "not testable"
    (no GPU: a warning, never a problem), writes the check's metrics with the node's name,
    and the health rule finds that the check runs."""
    plugin = "/tmp/driver/gdrprobe-npd-plugin"
    state = ["--npd-state", "/tmp/npd-state.json"]
    command = (f"{plugin} {' '.join(state)} --time-budget 60 --prometheus /tmp/gdrprobe.prom; "
               f"echo \"status $?\"; {plugin} {' '.join(state)} --npd-health; "
               "echo \"health $?\"; cat /tmp/gdrprobe.prom")
    done = in_image("sh", "-c", command, driver=os.path.abspath(NPD_DIR), timeout=300,
                    env={"GDRPROBE_LOCK_DIR": "/tmp", "GDRPROBE_NODE_NAME": "gpu-node-17"})
    lines = done.stdout.splitlines()
    assert lines[0].startswith("exit 9 (warn: not testable): ") and lines[1] == "status 2", \
        done.stdout + done.stderr
    assert lines[2:4] == ["gdrprobe check runs", "health 0"]
    codes = [line for line in lines[4:] if line.startswith("gdrprobe_check_exit_code{")]
    assert codes and all('node="gpu-node-17"' in line and line.endswith(" 9.0")
                         for line in codes), lines[4:]
    assert "Traceback" not in done.stderr
    assert rdma_resources() == baseline
