#!/bin/sh
# gdrprobe's Slurm prolog: check every GPU of this node before a job starts on it.
#
# Install it as slurm.conf's Prolog= on every node (docs/slurm.md), with PrologFlags=Alloc
# so that it runs when the job is allocated rather than at its first step. slurmd runs it
# as root once per node and job. What it does with the gate's exit code is the "prolog
# action" column of the README's exit-code table (SCHEDULER_ACTION in gdrprobe/errors.py;
# a unit test holds DRAIN_CODES below equal to it):
#   start  exit 0: nothing to say
#   drain  the node cannot do GPUDirect RDMA: `scontrol update ... state=drain` with the
#          gate's own one-line reason (what `sinfo -R` shows), then exit 1, so that slurmd
#          keeps the job off the node. A failed prolog drains the node by itself, but with
#          Slurm's reason ("Prolog error"), not this one; the job is requeued (Slurm's
#          prolog_epilog.html: "If the Prolog fails ... the node being set to a DRAIN state
#          and the job being requeued")
#   warn   any other code (not testable, an NCCL setting of the job, gdrprobe missing...):
#          log why and exit 0, so the job starts
#
#
# The job's GPUs: slurmd puts the GPUs it allocated the job on this node in the prolog's
# environment as SLURM_JOB_GPUS (Slurm's index of each, gres.conf's order; SchedMD/slurm
# src/plugins/gres/common/gres_common.c, gres_common_prep_set_env), and `gdrprobe check
# --node` checks those GPUs alone (docs/check.md, "The job's GPUs"): on a node jobs share,
# the other GPUs are other jobs'. A job with no GPU here (SLURM_JOB_GPUS unset) has nothing
# to check: where Slurm allocates GPUs (slurm.conf's GresTypes names gpu) the prolog says so
# and the job starts; where it does not (whole nodes, no gres) SLURM_JOB_GPUS is never set,
# so the whole node is checked, as GDRPROBE_JOB_WITHOUT_GPUS says.
#
# Settings come from /etc/default/gdrprobe-prolog (or $GDRPROBE_PROLOG_CONF), a shell file:
#   GDRPROBE              the gdrprobe command (default: gdrprobe on PATH)
#   GDRPROBE_CHECK_ARGS   more arguments for `gdrprobe check --node` (default: --time-budget 60)
#   GDRPROBE_PROLOG_LOG   a file for the log lines (default: syslog through logger)
#   GDRPROBE_JOB_WITHOUT_GPUS  a job with no SLURM_JOB_GPUS: skip (nothing to check), check
#                         (every GPU of the node) or auto (default: skip where slurm.conf's
#                         GresTypes names gpu, else check)
# slurmd gives the prolog an environment of its own, not the job's (prolog_epilog.html,
# "Prolog and Epilog Scripts"), so anything gdrprobe needs from the environment
# (NCCL_IB_HCA, say) is exported there too.

DRAIN_CODES="1 4 6 7 8 11"
REASON_MAX=200

GDRPROBE=gdrprobe
GDRPROBE_CHECK_ARGS="--time-budget 60"
GDRPROBE_PROLOG_LOG=
GDRPROBE_JOB_WITHOUT_GPUS=auto
conf=${GDRPROBE_PROLOG_CONF:-/etc/default/gdrprobe-prolog}
if [ -r "$conf" ]; then
    . "$conf"
fi
node=${SLURMD_NODENAME:-$(hostname -s)}

log() {
    line="gdrprobe-prolog: node $node, job ${SLURM_JOB_ID:-?}: $*"
    if [ -n "$GDRPROBE_PROLOG_LOG" ]; then
        echo "$(date -u +%Y-%m-%dT%H:%M:%SZ) $line" >>"$GDRPROBE_PROLOG_LOG"
    else
        logger -t gdrprobe-prolog "$line"
    fi
}

is_drain_code() {
    for drain in $DRAIN_CODES; do
        [ "$1" = "$drain" ] && return 0
    done
    return 1
}

# Whether a job Slurm gave no GPU on this node is left unchecked: Slurm allocates GPUs here
# (slurm.conf's GresTypes names gpu), so the job has none.
skips_jobs_without_gpus() {
    case "$GDRPROBE_JOB_WITHOUT_GPUS" in
        skip) return 0 ;;
        check) return 1 ;;
    esac
    grep -Eiq '^[[:space:]]*GresTypes[[:space:]]*=.*gpu' "${SLURM_CONF:-/etc/slurm/slurm.conf}" \
        2>/dev/null
}

if [ -z "${SLURM_JOB_GPUS:-}" ] && skips_jobs_without_gpus; then
    log "start: the job has no GPU on this node (SLURM_JOB_GPUS unset): nothing to check"
    exit 0
fi

# --quiet prints nothing when every GPU is engaged and one line per GPU otherwise, on
# stderr: keep that, and let stdout go. SLURM_JOB_GPUS goes to gdrprobe in the environment.
# shellcheck disable=SC2086  # GDRPROBE and GDRPROBE_CHECK_ARGS are word lists
said=$($GDRPROBE check --node $GDRPROBE_CHECK_ARGS --quiet 2>&1 >/dev/null)
code=$?
first_line=$(printf '%s\n' "$said" | sed -n '1p')

if [ "$code" = 0 ]; then
    exit 0
fi
if is_drain_code "$code"; then
    reason=$(printf 'gdrprobe: exit %s: %s' "$code" "${first_line#gdrprobe check: }" \
             | cut -c "1-$REASON_MAX")
    log "drain: $said"
    if ! scontrol update nodename="$node" state=drain reason="$reason"; then
        log "scontrol could not drain $node; the failed prolog drains it with Slurm's reason"
    fi
    exit 1
fi
log "warn (exit $code), the job starts: ${said:-no message}"
exit 0
