"""perftest's spellings that gdrprobe writes otherwise, each with gdrprobe's equivalent: the one
table behind the hint a perftest habit gets instead of argparse's bare usage error.

The spellings are those of perftest's ``ib_write_bw`` (linux-rdma/perftest,
src/perftest_parameters.c: ``--report_gbits``, ``--use_cuda=<id>``, ``--use_cuda_dmabuf``,
``-F``/``--CPU-freq``, ``-b``/``--bidirectional``, ``-a``/``--all``). A flag a command
shares with perftest (``-a`` on ``run``; ``-b`` on ``run``, ``bench`` and ``cluster``) means
what it means there and never reaches this table: only an argument the command refused does.
"""

from __future__ import annotations

PERFTEST_SPELLINGS = {
    "--report_gbits": "gdrprobe writes it --report-gbits (run); check, bench and cluster "
                      "report Gb/s always",
    "--use_cuda": "a GPU buffer is --mem gpu --gpu N on run and serve; check measures GPU "
                  "memory by default (--gpu N), bench sweeps GPU memory by default (--gpu N)",
    "--use_cuda_dmabuf": "DMA-BUF is --mem dmabuf (run, serve, check; bench --mem host,dmabuf)",
    "-F": "not needed: gdrprobe times with the CPU's cycle counter only where the kernel "
          "states it constant, else CLOCK_MONOTONIC (run --clock)",
    "--CPU-freq": "not needed: gdrprobe times with the CPU's cycle counter only where the "
                  "kernel states it constant, else CLOCK_MONOTONIC (run --clock)",
    "-b": "both directions at once is -b (--bidir) on run, bench and cluster, and check "
          "--bidir; check already measures the NIC reading and writing GPU memory (GPU "
          "memory at both ends), and names a failing direction",
    "--bidirectional": "both directions at once is -b (--bidir) on run, bench and cluster; "
                       "check already measures the NIC reading and writing GPU memory, and "
                       "names a failing direction",
    "-a": "every size is 'gdrprobe run -a' or 'gdrprobe bench' (2 B to 8 MiB by default, "
          "--sizes LIST); check measures one size, -s SIZE (default 1 MiB)",
    "--all": "every size is 'gdrprobe run -a' or 'gdrprobe bench' (2 B to 8 MiB by default, "
             "--sizes LIST); check measures one size, -s SIZE (default 1 MiB)",
}


def perftest_spelling(argument: str) -> str | None:
    """The table's key an argument is spelt as (``--use_cuda=0`` is ``--use_cuda``), or
    None."""
    name = argument.split("=", 1)[0]
    return name if name in PERFTEST_SPELLINGS else None


def perftest_hint(arguments: list[str]) -> str | None:
    """gdrprobe's equivalent of the first perftest spelling among arguments argparse did
    not know, or None when none is one."""
    for argument in arguments:
        name = perftest_spelling(argument)
        if name is not None:
            return f"{name} is perftest's spelling: {PERFTEST_SPELLINGS[name]}"
    return None
