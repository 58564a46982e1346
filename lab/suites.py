"""What the README's commands run on the lab: the demo and the lab test suites."""

from __future__ import annotations

import os
import re
import shlex

from lab import vm
from lab.kernel import REPO

PYTHON = os.path.join(REPO, ".venv", "bin", "python")
LOOPBACK_TESTS = "tests/lab/loopback"
PAIR_TESTS = "tests/lab/pair"


DEMO_TOKEN = "lab-demo-token-0001"
# Guests run under emulation on two cores: the loopback suite takes about 10 minutes on an
# idle machine and twice that on a loaded one. These bound a hung guest, not a slow one.
LOOPBACK_SUITE_TIMEOUT_S = 3600
PAIR_SUITE_TIMEOUT_S = 1800


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


def pytest_command(path: str, extra: list[str]) -> str:
    argv = [PYTHON, "-m", "pytest", "-p", "no:cacheprovider", "-q", "-rs", path, *extra]
    return " ".join(shlex.quote(a) for a in argv)


def run_suites(extra: list[str]) -> int:
    """The loopback suite in one guest, then the two-host suite across two guests."""
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
