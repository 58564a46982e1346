"""Every launcher's node-local rank picks the rank's GPU, not only torchrun's, srun's and
Open MPI's: otherwise every rank would check GPU 0."""

from __future__ import annotations

import pytest

from gdrprobe.campaign import gate

FOUR_GPUS = gate.GpuFacts(runtime_bus_ids=tuple(f"0000:{bus:02x}:00.0" for bus in (0x1b, 0x43, 0x52,
                                                                                0x61)),
                          sysfs_bus_ids=())


@pytest.mark.parametrize("variable", ["MPI_LOCALRANKID",              # MPICH / Intel MPI Hydra
                                      "MV2_COMM_WORLD_LOCAL_RANK",    # MVAPICH2 mpirun_rsh
                                      "PALS_LOCAL_RANKID",            # HPE Cray PALS
                                      "FLUX_TASK_LOCAL_ID"])          # Flux
def test_each_launchers_local_rank_picks_the_ranks_gpu(variable):
    assert gate.local_rank({variable: "2"}) == (2, variable)
    pair = gate.rank_pair({variable: "2"}, FOUR_GPUS, {})
    assert (pair.cuda_ordinal, pair.gpu, pair.rank) == (2, "0000:52:00.0", f"{variable}=2")


def test_torchrun_under_any_launcher_still_wins():
    assert gate.local_rank({"LOCAL_RANK": "1", "MPI_LOCALRANKID": "3"}) == (1, "LOCAL_RANK")
