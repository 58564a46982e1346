"""What the README's commands run on the lab: the demo and the lab test suites."""

from __future__ import annotations

import os
import re
import shlex
import shutil

from lab import acs_iommu, dmabuf_guest, modules, rails, slurm, vm
from lab.kernel import REPO, LabError, ensure_kernel

PYTHON = os.path.join(REPO, ".venv", "bin", "python")
LOOPBACK_TESTS = "tests/lab/loopback"
PAIR_TESTS = "tests/lab/pair"


DEMO_TOKEN = "lab-demo-token-0001"
# Guests run under emulation on two cores: the loopback suite took 20 minutes on an idle
# machine (162 tests in 1218 s, benchmarks/RESULTS.md's CI of 935f666) and would take about
# twice that on a loaded one. These bound a hung guest, not a slow one.
LOOPBACK_SUITE_TIMEOUT_S = 3600
PAIR_SUITE_TIMEOUT_S = 1800
DEMO_SLURM_TIMEOUT_S = 600
DEMO_DMABUF_TIMEOUT_S = 600
DEMO_PLATFORM_TIMEOUT_S = 900
ACS_IOMMU_TESTS = "tests/lab/acs_iommu"
DEMO_RAILS_TIMEOUT_S = 1200
DEMO_NCCL_PATTERN_TIMEOUT_S = 1200
RAILS_TESTS = "tests/lab/rails"
# How many of a lab suite's slowest tests (set-up and tear-down apart) its pytest lists
SLOWEST_TESTS_SHOWN = 20


def demo() -> int:
    """The main job on the two-host lab: the device listing from both guests, then a
    full-sweep probe from host a to a server on host b."""
    gdrprobe = f"{PYTHON} -m gdrprobe"
    client = (f"{gdrprobe} devices && {gdrprobe} run {vm.HOST_ADDRESSES['b']} --token "
              f"{DEMO_TOKEN} --connect-wait 120 -a -n 20 --report-gbits")
    server = (f"{gdrprobe} devices && {gdrprobe} serve --bind {vm.HOST_ADDRESSES['b']} "
              f"--token {DEMO_TOKEN} --once")
    results = vm.run_pair(client, server)
    for result in results:
        vm.print_result(result)
    failed = max(result.returncode for result in results) != 0
    print(f"demo: {int(not failed)} passed, {int(failed)} failed")
    return max(result.returncode for result in results)


def demo_slurm() -> int:
    """A Slurm cluster across the two guests (lab/slurm.py): the prolog in deploy/slurm/
    run by slurmd, the node x node matrix under srun and salloc's mpirun, a node drained by
    a failing check."""
    from tests.cuda_standin.build import build   # test code: only the demo needs it

    # Host b checks over the stand-in libcuda.so.1, built here where the guests can see it.
    run_dir = slurm.prepare({"gdr-a": None, "gdr-b": str(build())})
    try:
        results = vm.run_pair(f"{PYTHON} -m lab.slurm demo {run_dir}",
                              f"{PYTHON} -m lab.slurm node {run_dir} gdr-b",
                              DEMO_SLURM_TIMEOUT_S)
    finally:
        shutil.rmtree(run_dir, ignore_errors=True)
    for result in results:
        vm.print_result(result)
    code = max(result.returncode for result in results)
    print(f"demo-slurm: {int(code == 0)} passed, {int(code != 0)} failed")
    return code


def demo_dmabuf(runtimes: tuple[str, ...] = ("cuda", "rocm"), name: str = "demo-dmabuf") -> int:
    """The A/B with --mem dmabuf through the kernel's dma-buf import path with host pages
    behind it (docs/dmabuf-lab.md), over each stand-in GPU runtime in the one guest boot
    (the stand-in libcuda.so.1, then the stand-in HIP runtime under hip-python): the modules
    built or reused here, loaded in one guest, the JSON and the kernel's dma-buf table taken
    during each run."""
    built = modules.ensure_modules()
    result = vm.run_loopback(f"bash {dmabuf_guest.GUEST_SCRIPT} load {built.folder} && "
                             f"{PYTHON} -m lab.modules guest-demo {' '.join(runtimes)}",
                             DEMO_DMABUF_TIMEOUT_S * len(runtimes))
    vm.print_result(result)
    code = result.returncode
    print(f"{name}: {int(code == 0)} passed, {int(code != 0)} failed")
    return code


def demo_rocm() -> int:
    """The ROCm half of demo-dmabuf alone: the A/B to a verdict over the stand-in HIP runtime."""
    return demo_dmabuf(("rocm",), "demo-rocm")


def demo_platform() -> int:
    """The platform between GPU and NIC (issue 34) in one q35 guest boot: NCCL's outcomes on a
    data-direct NIC through the kernel's dma-buf import path (lab/data_direct.py: the A/B's
    JSON, then each outcome's answer), then the doctor's ACS and IOMMU checks read live
    (lab/acs_iommu.py: the findings as JSON, then the lab test that asserts them)."""
    built = modules.ensure_modules()
    mark = f"env {acs_iommu.GUEST_MARK}=1"
    command = (f"bash {dmabuf_guest.GUEST_SCRIPT} load {built.folder} && "
               f"{PYTHON} -m lab.data_direct && "
               f"{mark} {PYTHON} -m lab.acs_iommu findings && "
               f"{mark} {pytest_command(ACS_IOMMU_TESTS, [])}")
    return one_boot_demo("demo-platform", vm.Guest(
        "gdr-platform", command, qemu_opts=acs_iommu.QEMU_OPTS,
        kernel_args=acs_iommu.KERNEL_ARGS), DEMO_PLATFORM_TIMEOUT_S)


def demo_rails() -> int:
    """All rails at once (issue 32) in one q35 guest boot (lab/rails.py): two Soft-RoCE rails
    under one PCIe switch with two stand-in GPUs, `check --node --all-rails` uncapped and
    then with the uplink both rails share capped (each report's rails JSON), then the lab
    test that asserts both answers from the kept reports."""
    built = modules.ensure_modules()
    kept = "/tmp/gdrprobe-rails-reports"
    command = (f"env {rails.REPORTS}={kept} {PYTHON} -m lab.rails guest {built.folder} && "
               f"env {rails.REPORTS}={kept} {pytest_command(RAILS_TESTS, [])}")
    return one_boot_demo("demo-rails", vm.Guest("gdr-rails", command, qemu_opts=rails.QEMU_OPTS),
                         DEMO_RAILS_TIMEOUT_S)


def demo_nccl_pattern() -> int:
    """NCCL's pattern (issue 40) in one loopback guest boot with the lab's rxe
    (lab/nccl_pattern.py): no delay ("sustains"), a delayed wire ("round-trip bound", within
    15 % of the prediction) and a slow flush (the GPU arm's flush phase named)."""
    built = modules.ensure_modules()
    command = (f"bash {dmabuf_guest.GUEST_SCRIPT} load {built.folder} && "
               f"{PYTHON} -m lab.nccl_pattern guest {built.folder}")
    return one_boot_demo("demo-nccl-pattern", vm.Guest("gdr-lo", command),
                         DEMO_NCCL_PATTERN_TIMEOUT_S)


def one_boot_demo(name: str, guest: vm.Guest, timeout_s: float) -> int:
    """A demo that is one guest's command: its output, then one line of its outcome."""
    with guest.start(ensure_kernel()):
        result = guest.wait(timeout_s)
    vm.print_result(result)
    code = result.returncode
    print(f"{name}: {int(code == 0)} passed, {int(code != 0)} failed "
          f"({result.seconds:.0f} s, one boot)")
    return code


def prepare_dmabuf_modules() -> None:
    """Build (or reuse) the dma-buf lab's modules before the guest boots; where they cannot
    be built, say why: tests/lab/loopback/test_dmabuf_kernel_lab.py then skips."""
    try:
        modules.ensure_modules()
    except LabError as error:
        print(f"lab: the dma-buf lab's modules were not built, their tests skip: {error}")


def pytest_command(path: str, extra: list[str]) -> str:
    """A lab suite's pytest in a guest: its skips' reasons, and its slowest tests timed
    (--durations), so a CI log shows where the guest's minutes went."""
    argv = [PYTHON, "-m", "pytest", "-p", "no:cacheprovider", "-q", "-rs",
            f"--durations={SLOWEST_TESTS_SHOWN}", path, *extra]
    return " ".join(shlex.quote(a) for a in argv)


def run_suites(extra: list[str]) -> int:
    """The loopback suite in one guest, then the two-host suite across two guests."""
    prepare_dmabuf_modules()
    loopback = vm.run_loopback(pytest_command(LOOPBACK_TESTS, extra), LOOPBACK_SUITE_TIMEOUT_S)
    vm.print_result(loopback)
    host_a, host_b = vm.run_pair(pytest_command(PAIR_TESTS, extra), f"{PYTHON} -m lab.agent",
                                 PAIR_SUITE_TIMEOUT_S)
    vm.print_result(host_a)
    vm.print_result(host_b)
    failed = [r.name for r in (loopback, host_a) if r.returncode != 0]
    passed_count, failed_count = count_outcomes(loopback.output + host_a.output)
    if failed:
        print(f"lab suites failed in: {', '.join(failed)}")
        # A guest that failed before pytest could summarise still counts as a failure.
        failed_count = max(failed_count, len(failed))
    print(f"lab: {passed_count} passed, {failed_count} failed")
    return 1 if failed else 0


def count_outcomes(output: str) -> tuple[int, int]:
    """Tests passed and failed (errors included) in pytest summary lines."""
    def total(word: str) -> int:
        return sum(int(n) for n in re.findall(rf"(\d+) {word}\b", output))

    return total("passed"), total("failed") + total("errors?")
