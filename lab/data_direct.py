"""NCCL's outcomes on a data-direct NIC, reproduced through the kernel's dma-buf import path
(issues 34 and 39; docs/dmabuf-lab.md#data-direct): the stand-in libmlx5.so.1
(tests/mlx5_standin) gives rxe0 a data-direct path by knob and forwards ``mlx5dv_reg_dmabuf_mr``
to ``ibv_reg_dmabuf_mr``, so the data-direct rung registers through the same patched rxe as
plain DMA-BUF, over the stand-in libcuda.so.1. The rung is the one NCCL registers through
(gdrprobe.nccl.data_direct.nccl_face): ``<dev>_dma`` alone by default, with no fallback, the
device itself under NCCL_IB_DATA_DIRECT=0, both (data-direct first) under 2. What this proves:
gdrprobe's calls, their order and the answer it gives for each outcome; not a ConnectX, not
data-direct DMA.

  python -m lab.data_direct       (in a lab guest after 'lab/dmabuf/guest.sh load FOLDER')
                                  each outcome's answer; the first one's JSON in full
"""

from __future__ import annotations

import dataclasses
import errno
import json
import os
import sys

from lab.kernel import LabError
from lab.dmabuf_guest import (DEMO_REPEATS, RXE_DMA_DEVICE, Built, answered_by_dmabuf,
                              dmabuf_environment, run_dmabuf_ab)
from lab.modules import built_modules

# rxe's dma-buf device stands at the data-direct path: registration never reads the path, the
# doctor's placement does (a PCI function, which rxe has none of: placement is fixture-tested).
RXE_DATA_DIRECT_PATH = "/devices/" + RXE_DMA_DEVICE
MLX5_KNOB_PREFIX = "GDRPROBE_MLX5_STANDIN_"


@dataclasses.dataclass(frozen=True)
class Outcome:
    """One of NCCL's outcomes on a data-direct NIC, and the answer gdrprobe must give."""
    name: str
    mlx5: dict[str, str]              # the stand-in libmlx5's knobs (PATH, DD_ERRNO, ...)
    cuda: dict[str, str]              # the stand-in libcuda's (tests.cuda_standin.build)
    args: tuple[str, ...]             # gdrprobe run's extra arguments
    rung: str | None                  # the registration rung expected; None: none registered
    words: str                        # what the rung's reason (or the failure) must say
    environ: tuple[tuple[str, str], ...] = ()   # NCCL's variables for the run

    def run(self, built: Built, repeats: int = 1):
        """(the finished ``gdrprobe run --loopback --mem dmabuf --json``, the bufinfo seen)."""
        from tests.cuda_standin.build import standin_settings

        return run_dmabuf_ab(built, *self.args, repeats=repeats,
                             standin=mlx5_environment(built, **self.mlx5) | standin_settings(**self.cuda)
                             | dict(self.environ))

    def mismatch(self, report: dict) -> str:
        """Why the report is not this outcome's answer, or "" when it is."""
        arm = report["arms"][1]
        memory = arm["local_memory"]
        if self.rung is None:
            failed = report["verdict"]["classification"] == "not engaged"
            return "" if failed and self.words in arm["detail"] else \
                f"expected not engaged with {self.words!r}: {report['verdict']['classification']}, {arm['detail']}"
        if arm["outcome"] != "measured" or memory.get("registration_rung") != self.rung:
            return f"expected a measured {self.rung} rung: {arm['outcome']}, {memory.get('registration_rung')}"
        if self.words not in memory["registration_rung_reason"]:
            return f"expected {self.words!r} in {memory['registration_rung_reason']!r}"
        return ""


OUTCOMES = (
    Outcome("data-direct works", {"path": RXE_DATA_DIRECT_PATH}, {}, (), "data-direct",
            "opens only <dev>_dma"),
    # NCCL exports with the PCIe mapping type where its GDR mode is PCI (a GPU on C2C, as on
    # the GB300 trays that carry data-direct NICs: net.cc getHandleForAddressRangeFlags) ...
    Outcome("data-direct with the PCIe mapping", {"path": RXE_DATA_DIRECT_PATH}, {},
            ("--dmabuf-pcie",), "data-direct", "no fallback"),
    # ... and its CUCHECK fails the connection where the driver refuses that export.
    Outcome("PCIe mapping refused", {"path": RXE_DATA_DIRECT_PATH}, {"pcie_mapping": "refused"},
            ("--dmabuf-pcie",), None, "with the PCIe mapping returned CUDA_ERROR_NOT_SUPPORTED"),
    # NCCL registers on <dev>_dma through mlx5dv's DATA_DIRECT call alone (net_ib/reg.cc): a
    # refusal is the job's, never a fall to plain DMA-BUF (issue 39 item 3) ...
    Outcome("data-direct registration refused: not engaged, no fallback",
            {"path": RXE_DATA_DIRECT_PATH, "dd_errno": str(errno.EOPNOTSUPP)}, {}, (), None,
            "MLX5DV_REG_DMABUF_ACCESS_DATA_DIRECT, was refused"),
    # ... NCCL_IB_DATA_DIRECT=0 leaves the device itself, plain DMA-BUF (item 4) ...
    Outcome("NCCL_IB_DATA_DIRECT=0: the device itself, plain DMA-BUF",
            {"path": RXE_DATA_DIRECT_PATH, "dd_errno": str(errno.EOPNOTSUPP)}, {}, (), "dmabuf",
            "NCCL_IB_DATA_DIRECT=0", (("NCCL_IB_DATA_DIRECT", "0"),)),
    # ... and 2 opens both: with no decision for this NIC, data-direct first, then plain.
    Outcome("NCCL_IB_DATA_DIRECT=2: data-direct refused, then plain DMA-BUF",
            {"path": RXE_DATA_DIRECT_PATH, "dd_errno": str(errno.EOPNOTSUPP)}, {}, (), "dmabuf",
            "MLX5DV_REG_DMABUF_ACCESS_DATA_DIRECT) refused", (("NCCL_IB_DATA_DIRECT", "2"),)),
    Outcome("no data-direct path", {}, {}, (), "dmabuf", "registered through ibv_reg_dmabuf_mr"),
)


def mlx5_environment(built: Built, **knobs: str) -> dict:
    """The stand-in libmlx5 preloaded, with its knobs. Preloaded, not first on
    LD_LIBRARY_PATH: libibverbs loads every provider when it lists devices, Debian's mlx5
    provider is libmlx5.so.1 itself, and a later dlopen of the soname finds that one."""
    from tests.mlx5_standin.build import build

    base = dmabuf_environment(built)["LD_PRELOAD"]
    return {"LD_PRELOAD": f"{base}:{build()}",
            **{MLX5_KNOB_PREFIX + key.upper(): value for key, value in knobs.items()}}


def show(built: Built) -> int:
    """Each outcome in turn: the first with its JSON in full and the A/B sampled as the
    dma-buf demo samples; 0 only when every answer is the outcome's."""
    failures = 0
    for index, outcome in enumerate(OUTCOMES):
        done, _ = outcome.run(built, DEMO_REPEATS if index == 0 else 1)
        try:
            report = json.loads(done.stdout)
        except ValueError:
            print(f"{outcome.name}: no JSON (exit {done.returncode}): {done.stderr.strip()}")
            failures += 1
            continue
        if index == 0:
            print(done.stdout.rstrip())
        wrong = outcome.mismatch(report) or ("" if index or answered_by_dmabuf(report) else
                                              "the A/B's answer is a drain code")
        memory, verdict = report["arms"][1]["local_memory"], report["verdict"]
        print(f"{outcome.name}: {verdict['classification']} (exit {verdict['exit_code']}), "
              f"rung {memory.get('registration_rung') or '-'}: "
              f"{memory.get('registration_rung_reason') or report['arms'][1]['detail']}"
              + (f"  <-- WRONG: {wrong}" if wrong else ""))
        failures += bool(wrong)
    print("the stand-in libmlx5 over Soft-RoCE and host pages: NCCL's outcomes, not a ConnectX, "
          "not GPU proof")
    return 1 if failures else 0


def main() -> int:
    built = built_modules(os.uname().release)
    if built is None:
        print("lab.data_direct: no build for this kernel: run 'python -m lab.modules' on the host",
              file=sys.stderr)
        return 3
    try:
        return show(built)
    except LabError as error:
        print(f"lab.data_direct: {error}", file=sys.stderr)
        return 3


if __name__ == "__main__":
    sys.exit(main())
