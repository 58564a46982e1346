"""One GPU's gate on a fixture machine with the run engine recorded (campaign/prelaunch);
the fixtures runs and locks are in tests/unit/conftest.py."""

from gdrprobe.campaign import prelaunch
from gdrprobe.campaign.gate import Budget, rank_pair
from gdrprobe.campaign.plan import Buffer, CheckPlan
from gdrprobe.measure.options import ProbeOptions

GATE = CheckPlan(options=ProbeOptions(sizes=(1 << 20,), qps=2), send=Buffer("gpu"),
                 receive=Buffer("gpu"))


def check(facts, gpu: str, locks, gate=GATE, device=None, budget=30.0):
    pair = rank_pair({}, facts.gpus, facts.nics, gpu=gpu, device=device)
    return prelaunch.check_pair(pair, facts, gate, Budget(budget), locks)
