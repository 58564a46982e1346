#!/bin/bash
# In a loopback lab guest (lab/guest_init.sh has brought up Debian's rdma_rxe as rxe0 on lo):
#   guest.sh load FOLDER   swap in the lab's rdma_rxe with dma-buf registration and load the
#                          gdr_dmabuf exporter, both from FOLDER (python -m lab.modules prints it)
#   guest.sh restore       put Debian's rdma_rxe back and unload the exporter, so the rest of
#                          a suite sees the stock Soft-RoCE again
# Both mount debugfs (for /sys/kernel/debug/dma_buf/bufinfo) and end with rxe0 ACTIVE on lo.
set -u
fail() { echo "lab dmabuf guest: $*" >&2; exit 97; }

rxe0_on_lo() {
  rdma link add rxe0 type rxe netdev lo || fail "rdma link add rxe0 on lo failed"
  for _ in $(seq 100); do
    grep -q ACTIVE /sys/class/infiniband/rxe0/ports/1/state 2>/dev/null && return 0
    sleep 0.1
  done
  fail "rxe0 port 1 never became ACTIVE"
}

drop_rxe() {
  if [ -e /sys/class/infiniband/rxe0 ]; then
    rdma link delete rxe0 || fail "rdma link delete rxe0 failed"
  fi
  if [ -e /sys/module/rdma_rxe ]; then
    rmmod rdma_rxe || fail "rmmod rdma_rxe failed (still in use?)"
  fi
}

mountpoint -q /sys/kernel/debug || mount -t debugfs debugfs /sys/kernel/debug \
  || fail "cannot mount debugfs"
case "${1:-}" in
  load)
    folder=${2:?guest.sh load FOLDER}
    drop_rxe
    # rdma_rxe's own dependencies, from Debian's kernel, before the lab's module.
    modprobe -a ib_uverbs udp_tunnel ip6_udp_tunnel || fail "modprobe rxe's dependencies failed"
    insmod "$folder/rdma_rxe.ko" || fail "insmod $folder/rdma_rxe.ko failed"
    [ -e /sys/module/gdr_dmabuf ] || insmod "$folder/gdr_dmabuf.ko" \
      || fail "insmod $folder/gdr_dmabuf.ko failed"
    rxe0_on_lo ;;
  restore)
    drop_rxe
    if [ -e /sys/module/gdr_dmabuf ]; then
      rmmod gdr_dmabuf || fail "rmmod gdr_dmabuf failed (a dma-buf still open?)"
    fi
    modprobe rdma_rxe || fail "modprobe rdma_rxe failed"
    rxe0_on_lo ;;
  *) fail "usage: guest.sh load FOLDER | restore" ;;
esac
