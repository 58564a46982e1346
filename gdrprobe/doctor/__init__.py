"""The doctor: reads the machine and says what stands between it and GPUDirect RDMA. It
changes nothing and needs no peer.

- ``facts/``: the collectors (sysfs, procfs, the CUDA driver, NVML, NCCL's NIC probe) and the
  context that reads each fact once;
- ``checks/``: one module per flowchart group, findings over those facts; what NCCL will do
  is asked of :mod:`gdrprobe.nccl`, which the doctor hands the facts to;
- ``runner``: every check in flowchart order, a crashing check turned into a finding;
- ``capture``: copy what the doctor read, for ``--root`` to replay anywhere.
"""
