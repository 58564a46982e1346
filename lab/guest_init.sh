#!/bin/bash
# Runs inside a lab guest: bring up Soft-RoCE, then run the given command.
#   guest_init.sh loopback -- CMD...       rxe0 on lo
#   guest_init.sh wire ADDR/PREFIX -- CMD...   rxe0 on the guest's virtio NIC, with ADDR
set -u
mode=$1; shift
address=""
if [ "$mode" = wire ]; then address=$1; shift; fi
[ "${1:-}" = "--" ] && shift

fail() { echo "lab guest: $*" >&2; exit 97; }

# The guest starts in the checkout it was booted from (vng --cwd): its gdrprobe is the one
# imported, by `python -m` and by the venv's console script alike, whichever checkout the
# shared venv's editable install names.
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"

ip link set lo up
modprobe rdma_rxe || fail "modprobe rdma_rxe failed"
if [ "$mode" = loopback ]; then
  netdev=lo
else
  netdev=$(ls /sys/class/net | grep -v '^lo$' | head -n 1)
  [ -n "$netdev" ] || fail "no network interface besides lo"
  ip addr add "$address" dev "$netdev" || fail "cannot set $address on $netdev"
  ip link set "$netdev" up || fail "cannot bring $netdev up"
fi
rdma link add rxe0 type rxe netdev "$netdev" || fail "rdma link add rxe0 on $netdev failed"
for _ in $(seq 100); do
  grep -q ACTIVE /sys/class/infiniband/rxe0/ports/1/state 2>/dev/null && break
  sleep 0.1
done
grep -q ACTIVE /sys/class/infiniband/rxe0/ports/1/state || fail "rxe0 port 1 never became ACTIVE"
# The RoCE v2 GID for the address (IPv4-mapped) appears shortly after the port is up.
if [ -n "$address" ]; then
  IFS=. read -r o1 o2 o3 o4 <<<"${address%/*}"
  gid=$(printf '0000:0000:0000:0000:0000:ffff:%02x%02x:%02x%02x' "$o1" "$o2" "$o3" "$o4")
  for _ in $(seq 100); do
    grep -qx "$gid" /sys/class/infiniband/rxe0/ports/1/gids/* 2>/dev/null && break
    sleep 0.1
  done
  grep -qx "$gid" /sys/class/infiniband/rxe0/ports/1/gids/* || fail "no GID for $address on rxe0"
fi
# PYTHONFAULTHANDLER: a process that crashes in a guest prints every thread's stack (a test
# that sees only "returncode -11" cannot say where).
export PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 PYTHONFAULTHANDLER=1
exec "$@"
