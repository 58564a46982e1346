"""The doctor's checks, one module per flowchart group (topology, stack, gpu, memlock,
iommu, acs, nccl_env, nic): each has ``GROUP`` and ``check(ctx) -> list[Finding]`` over the
facts of a :class:`gdrprobe.doctor.facts.context.DoctorContext`, and names its findings with
:mod:`gdrprobe.report.finding_ids`. :mod:`gdrprobe.doctor.runner` runs them in order.
"""
