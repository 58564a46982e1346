"""The Soft-RoCE lab: Debian kernels with rdma_rxe booted under QEMU by virtme-ng."""
