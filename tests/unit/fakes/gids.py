"""RoCE GID tables as a port lists them, (index, gid, type) each: the usual dual-stack port
(each address as a RoCE v1 and a RoCE v2 GID) and an IPv6-only one, shared by the tests of
NCCL's walk (test_nccl_gid.py) and of the endpoint's choice (test_rdma_platform.py)."""

V4_A = "0000:0000:0000:0000:0000:ffff:0a4d:0001"          # ::ffff:10.77.0.1
V4_B = "0000:0000:0000:0000:0000:ffff:c0a8:0101"          # ::ffff:192.168.1.1
LINK_LOCAL = "fe80:0000:0000:0000:5054:00ff:fe00:0001"
GLOBAL_V6 = "fd00:0000:0000:0000:5054:00ff:fe00:0001"
V1, V2 = "RoCE v1", "RoCE v2"

DUAL_STACK = [(0, LINK_LOCAL, V1), (1, LINK_LOCAL, V2), (2, V4_A, V1), (3, V4_A, V2),
              (4, GLOBAL_V6, V1), (5, GLOBAL_V6, V2)]
IPV6_ONLY = [(0, LINK_LOCAL, V1), (1, LINK_LOCAL, V2), (2, GLOBAL_V6, V1), (3, GLOBAL_V6, V2)]
