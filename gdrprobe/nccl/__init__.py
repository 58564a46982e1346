"""What NCCL will do, decided as NCCL's own source decides it (NVIDIA/nccl 2.30.7):

- ``params``: one declaration per NCCL and RCCL variable (parsing, default by release,
  library); ``env``: their readers and NCCL's configuration files (``cparse``: C's number
  parsing that reading uses); ``effects``: what a set variable does under a release;
- ``gid``: the GID NCCL picks on a RoCE port; ``refusals``: where the environment keeps
  NCCL off RDMA whatever the topology; ``data_direct``: mlx5 data-direct devices;
- ``topo``: its path types, its PCI tree (Broadcom switches flattened), the bandwidth of each link;
- ``nets``: its network devices: each port, placed where ``net_ib`` places it, fused into
  virtual NICs;
- ``gdr_support``: whether it can register GPU memory with a NIC, and through what;
- ``versions``: where an older release's rules differ, and since which release;
- ``decision``: per GPU, the NIC it uses, the path, and GPUDirect RDMA for sends and receives;
- ``log``: what an NCCL_DEBUG=INFO log proves.

Pure rules over facts handed in as data: the doctor (:mod:`gdrprobe.doctor`) reads the
machine and asks these modules; nothing here reads the machine or imports the doctor, the
verbs layer or the memory layer, so those may ask it (the GID walk, the registration's face).
"""
