#!/bin/sh
# gdrprobe as Slurm's HealthCheckProgram: the full check of every GPU of an idle node.
#
# slurm.conf(5): slurmd runs HealthCheckProgram as root every HealthCheckInterval seconds on
# the nodes in HealthCheckNodeState, kills it after 60 s, and acts on nothing but what it does
# itself (a drain through scontrol). Install it beside gdrprobe-prolog.sh, which it runs in
# health-check mode (one script, one set of rules: docs/slurm.md, "The health check"):
#
#   HealthCheckProgram=/etc/slurm/gdrprobe-healthcheck.sh
#   HealthCheckInterval=3600
#   HealthCheckNodeState=IDLE
#
# It checks every GPU of the node (there is no job), with gdrprobe's default budget, under
# the prolog's settings file (GDRPROBE, GDRPROBE_HEALTH_CHECK_ARGS, ..._TIMEOUT, ..._KILL_AFTER),
# drains the node where the prolog would, and always exits 0. The prolog is found beside
# this file, wherever the two are installed and however this one is started (by its path,
# `sh gdrprobe-healthcheck.sh` in its directory, or through a symbolic link).
GDRPROBE_HEALTH_CHECK=1
export GDRPROBE_HEALTH_CHECK
here=$(readlink -f -- "$0" 2>/dev/null) || here=$0
case $here in
    */*) here=${here%/*} ;;
    *) here=. ;;
esac
prolog="$here/gdrprobe-prolog.sh"
if [ ! -r "$prolog" ]; then
    message="gdrprobe-healthcheck: $prolog not found: install gdrprobe-prolog.sh beside $0"
    echo "$message" >&2
    logger -t gdrprobe-prolog -- "$message" 2>/dev/null
    exit 1
fi
exec /bin/sh "$prolog"
