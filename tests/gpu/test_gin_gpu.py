"""check --gin on a real GPU beside an mlx5 NIC (issue 44): the registration NCCL's GIN makes
of the NIC's doorbell page, and, where the driver maps it, the doorbell rung from the GPU.

The full proof: a loopback RC QP on the NIC (gdrprobe's own endpoint, connected to itself),
its send queue, doorbell record and BlueFlame register taken through libmlx5's direct-verbs
interface (``mlx5dv_init_obj``); the send queue and the doorbell record mapped for the GPU
(cuMemHostRegister with DEVICEMAP), the register with IOMEMORY as NCCL maps a UAR; a kernel
compiled at run time through ``cuda.bindings.nvrtc`` writes one RDMA WRITE work request
(control, remote-address and data segments, mlx5's layout: rdma-core providers/mlx5/wqe.h),
updates the doorbell record and rings the doorbell; the host then finds the bytes in the
receiving buffer. Skips, with the reason, where there is no GPU, no mlx5 NIC, no NVRTC, or
where the driver refuses the mapping (the registration test says so).

Not run in this project's CI: the development machines have no GPU and no ConnectX. Set
GDRPROBE_TEST_NIC to choose the NIC (default: the first libmlx5 drives).
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import time

import pytest

from gdrprobe.errors import MissingDependency, NotTestable
from gdrprobe.memory import cuda_driver

try:
    cuda_driver.driver()
except (NotTestable, MissingDependency) as error:
    pytest.skip(f"needs a GPU: {error.cause}", allow_module_level=True)

from gdrprobe.campaign import gin                                          # noqa: E402
from gdrprobe.memory import cuda                                           # noqa: E402
from gdrprobe.rdma import mlx5dv                                           # noqa: E402
from gdrprobe.report.gin import MAPPED, REFUSED                             # noqa: E402

SELECTOR = os.environ.get("GDRPROBE_TEST_GPU", "0")
PAYLOAD = bytes(range(256)) * 16          # 4 KiB the GPU's work request moves
WQE_BYTES = 64                            # MLX5_SEND_WQE_BB
SEND_DBR = 1                              # MLX5_SND_DBR: the send queue's doorbell record
PAGE = 4096


def mlx5_nic() -> str:
    """The NIC to use: GDRPROBE_TEST_NIC, else the first device libmlx5 drives."""
    try:
        library = mlx5dv.loaded()
    except mlx5dv.Unavailable as error:
        pytest.skip(f"needs an mlx5 NIC: {error}")
    wanted = os.environ.get("GDRPROBE_TEST_NIC")
    count = ctypes.c_int(0)
    listed = library.get_device_list(ctypes.byref(count))
    if not listed:
        pytest.skip("needs an mlx5 NIC: no RDMA device")
    try:
        for i in range(count.value):
            name = library.get_device_name(listed[i]).decode()
            if (wanted is None or name == wanted) and library.is_supported(listed[i]):
                return name
    finally:
        library.free_device_list(listed)
    pytest.skip(f"needs an mlx5 NIC: none {'named ' + wanted if wanted else 'found'}")


@pytest.fixture(scope="module")
def nic() -> str:
    return mlx5_nic()


def test_the_registration_nccl_makes_on_this_nic(nic, facts):
    answer = gin.gin_check(SELECTOR, nic, os.environ)
    facts["GIN doorbell"] = f"{nic}: {answer.outcome}: {answer.summary}"
    assert answer.outcome in (MAPPED, REFUSED), answer.summary
    assert answer.calls[0].startswith("cuMemHostRegister(")


# ---- the doorbell rung from the GPU -----------------------------------------------------------


class Mlx5dvQp(ctypes.Structure):
    """struct mlx5dv_qp (rdma-core providers/mlx5/mlx5dv.h), as far as bf."""

    _fields_ = [("dbrec", ctypes.c_void_p),
                ("sq_buf", ctypes.c_void_p), ("sq_wqe_cnt", ctypes.c_uint32), ("sq_stride", ctypes.c_uint32),
                ("rq_buf", ctypes.c_void_p), ("rq_wqe_cnt", ctypes.c_uint32), ("rq_stride", ctypes.c_uint32),
                ("bf_reg", ctypes.c_void_p), ("bf_size", ctypes.c_uint32),
                ("comp_mask", ctypes.c_uint64), ("uar_mmap_offset", ctypes.c_long),
                ("tirn", ctypes.c_uint32), ("tisn", ctypes.c_uint32), ("rqn", ctypes.c_uint32),
                ("sqn", ctypes.c_uint32), ("tir_icm_addr", ctypes.c_uint64)]


class Mlx5dvObj(ctypes.Structure):
    """struct mlx5dv_obj: {in, out} pairs for qp, cq, srq, rwq, dm, ah, pp; only qp asked."""

    _fields_ = [("qp_in", ctypes.c_void_p), ("qp_out", ctypes.POINTER(Mlx5dvQp))] + \
               [(f"unused{i}", ctypes.c_void_p) for i in range(12)]


KERNEL = r"""
__device__ unsigned int be32(unsigned int x) { return __byte_perm(x, 0, 0x0123); }

extern "C" __global__ void post_write(unsigned int *wqe, unsigned int *dbrec,
                                      unsigned long long *doorbell, unsigned int qpn,
                                      unsigned int pi, unsigned long long raddr, unsigned int rkey,
                                      unsigned long long laddr, unsigned int lkey, unsigned int length)
{
    wqe[0] = be32(((pi & 0xffff) << 8) | 0x08);      /* MLX5_OPCODE_RDMA_WRITE */
    wqe[1] = be32((qpn << 8) | 3);                   /* three 16-byte segments */
    wqe[2] = be32(0x08);                             /* fm_ce_se: MLX5_WQE_CTRL_CQ_UPDATE */
    wqe[3] = 0;
    wqe[4] = be32((unsigned int)(raddr >> 32));      /* struct mlx5_wqe_raddr_seg */
    wqe[5] = be32((unsigned int)raddr);
    wqe[6] = be32(rkey);
    wqe[7] = 0;
    wqe[8] = be32(length);                           /* struct mlx5_wqe_data_seg */
    wqe[9] = be32(lkey);
    wqe[10] = be32((unsigned int)(laddr >> 32));
    wqe[11] = be32((unsigned int)laddr);
    __threadfence_system();
    dbrec[1] = be32((pi + 1) & 0xffff);              /* MLX5_SND_DBR */
    __threadfence_system();
    *(volatile unsigned long long *)doorbell = *(volatile unsigned long long *)wqe;
    __threadfence_system();
}
"""


def compiled(device) -> bytes:
    """The kernel's PTX for this GPU, through NVRTC; skips where NVRTC is not installed."""
    try:
        from cuda.bindings import nvrtc
        result, program = nvrtc.nvrtcCreateProgram(KERNEL.encode(), b"post_write.cu", 0, [], [])
    except (ImportError, RuntimeError) as error:
        pytest.skip(f"needs NVRTC (libnvrtc, e.g. pip install nvidia-cuda-nvrtc-cu12): {error}")
    major = device.call("cuDeviceGetAttribute",
                        device.bindings.CUdevice_attribute.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR,
                        device.device)
    minor = device.call("cuDeviceGetAttribute",
                        device.bindings.CUdevice_attribute.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR,
                        device.device)
    options = [f"--gpu-architecture=compute_{major}{minor}".encode()]
    (result,) = nvrtc.nvrtcCompileProgram(program, len(options), options)
    if int(result) != 0:
        _, size = nvrtc.nvrtcGetProgramLogSize(program)
        log = b" " * size
        nvrtc.nvrtcGetProgramLog(program, log)
        pytest.fail(f"NVRTC: {log.decode(errors='replace')}")
    _, size = nvrtc.nvrtcGetPTXSize(program)
    ptx = b" " * size
    nvrtc.nvrtcGetPTX(program, ptx)
    nvrtc.nvrtcDestroyProgram(program)
    return ptx


@contextlib.contextmanager
def host_mapped(device, address: int, length: int):
    """[address, address + length) of host memory registered for the GPU (DEVICEMAP), whole
    pages; yields the device pointer of ``address``."""
    driver = device.bindings
    start = address & ~(PAGE - 1)
    size = -(-(address + length - start) // PAGE) * PAGE
    device.call("cuMemHostRegister", start, size, driver.CU_MEMHOSTREGISTER_DEVICEMAP
                | driver.CU_MEMHOSTREGISTER_PORTABLE)
    try:
        pointer = int(device.call("cuMemHostGetDevicePointer", start, 0))
        yield pointer + (address - start)
    finally:
        device.call("cuMemHostUnregister", start)


def test_the_gpu_rings_the_doorbell_and_the_bytes_arrive(nic, facts):
    from gdrprobe.rdma import verbs
    from gdrprobe.rdma.endpoint import Endpoint, EndpointOptions
    from gdrprobe.rdma.handles import raw_handles

    answer = gin.gin_check(SELECTOR, nic, os.environ)
    if answer.outcome != MAPPED:
        pytest.skip(f"the driver does not map the NIC's doorbell here: {answer.summary}")
    pv = verbs.pyverbs()
    library = mlx5dv.loaded()
    init_obj = library.mlx5.mlx5dv_init_obj
    init_obj.restype, init_obj.argtypes = ctypes.c_int, (ctypes.POINTER(Mlx5dvObj), ctypes.c_uint64)
    with cuda.open_gpu(SELECTOR) as device, Endpoint(EndpointOptions(device=nic), None) as endpoint:
        endpoint.connect(endpoint.address())           # the QP to itself: a loopback
        access = pv.enums.IBV_ACCESS_LOCAL_WRITE | pv.enums.IBV_ACCESS_REMOTE_WRITE
        source = pv.mr.MR(endpoint.pd, len(PAYLOAD), access)
        target = pv.mr.MR(endpoint.pd, len(PAYLOAD), access)
        try:
            source.write(PAYLOAD, len(PAYLOAD))
            target.write(bytes(len(PAYLOAD)), len(PAYLOAD))
            qp = endpoint.qps[0]
            out = Mlx5dvQp()
            obj = Mlx5dvObj(qp_in=raw_handles([qp], endpoint.cq).qps[0], qp_out=ctypes.pointer(out))
            assert init_obj(ctypes.byref(obj), 1) == 0          # MLX5DV_OBJ_QP
            assert out.sq_stride == WQE_BYTES and out.sq_wqe_cnt
            module = device.call("cuModuleLoadData", compiled(device))
            function = device.call("cuModuleGetFunction", module, b"post_write")
            with host_mapped(device, out.sq_buf, out.sq_wqe_cnt * WQE_BYTES) as sq, \
                    host_mapped(device, out.dbrec, 8) as dbrec, \
                    cuda_driver.IoMemoryMapping(device.bindings, out.bf_reg, 8) as bell:
                assert bell.device_pointer is not None, bell.refused
                arguments = ((sq, dbrec, bell.device_pointer, qp.qp_num, 0, target.buf, target.rkey,
                              source.buf, source.lkey, len(PAYLOAD)),
                             (ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_uint,
                              ctypes.c_uint, ctypes.c_ulonglong, ctypes.c_uint, ctypes.c_ulonglong,
                              ctypes.c_uint, ctypes.c_uint))
                device.call("cuLaunchKernel", function, 1, 1, 1, 1, 1, 1, 0, 0, arguments, 0)
                device.call("cuCtxSynchronize")
                deadline = time.monotonic() + 5.0
                while target.read(len(PAYLOAD), 0) != PAYLOAD and time.monotonic() < deadline:
                    time.sleep(0.01)
                arrived = target.read(len(PAYLOAD), 0) == PAYLOAD
            device.call("cuModuleUnload", module)
        finally:
            source.close()
            target.close()
    facts["GPU-rung doorbell"] = f"{nic}: one RDMA WRITE of {len(PAYLOAD)} B posted by the GPU: " + (
        "the bytes arrived" if arrived else "nothing arrived in 5 s")
    assert arrived, "the GPU rang the doorbell, and the WRITE's bytes did not arrive"
