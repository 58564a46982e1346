"""One GPU's gate on a fixture machine with the run engine recorded (campaign/prelaunch);
the fixtures runs and locks are in tests/unit/conftest.py."""

from gdrprobe.campaign import prelaunch
from gdrprobe.campaign.gate import Budget, rank_pair
from gdrprobe.measure.options import ProbeOptions
from gdrprobe.memory.spec import MemorySpec


def gpu_buffer(gpu: str) -> MemorySpec:
    return MemorySpec.from_choice("gpu", gpu=gpu)


GATE = prelaunch.GateSettings(options=ProbeOptions(sizes=(1 << 20,), qps=2),
                              gpu_memory=gpu_buffer, receive_memory=gpu_buffer)


def check(facts, gpu: str, locks, gate=GATE, device=None, budget=30.0):
    pair = rank_pair({}, facts.gpus, facts.nics, gpu=gpu, device=device)
    return prelaunch.check_pair(pair, facts, gate, Budget(budget), locks)
