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
REASON_MAX=200          # bytes of the drain reason: one line of `sinfo -R`
LOG_RECORD_MAX=1024     # bytes of one log record, time stamp included (log below)
READ_MAX=65536          # bytes of gdrprobe's output read back: far more than one record holds

GDRPROBE=gdrprobe
GDRPROBE_CHECK_ARGS="--time-budget 60"
GDRPROBE_PROLOG_LOG=
GDRPROBE_JOB_WITHOUT_GPUS=auto
conf=${GDRPROBE_PROLOG_CONF:-/etc/default/gdrprobe-prolog}
if [ -r "$conf" ]; then
    . "$conf"
fi
node=${SLURMD_NODENAME:-$(hostname -s)}

# One record per run, on one line: gdrprobe's output (which a driver's message or a broken
# locale may fill with anything) is escaped byte by byte, never through echo, which expands
# backslashes (a "\\c" would glue the next record onto this one); the record stays within
# LOG_RECORD_MAX bytes: syslog's traditional message size, logger(1)'s default --size
# (util-linux, RFC 3164's 1 KiB), and under PIPE_BUF (4 KiB), so that the records of
# prologs running at once never interleave in the file (one write to an O_APPEND file).
log() {
    stamp="$(date -u +%Y-%m-%dT%H:%M:%SZ) "
    prefix="gdrprobe-prolog: node $node, job ${SLURM_JOB_ID:-?}: "
    line="$prefix$(printf '%s' "$*" | clean log $((LOG_RECORD_MAX - ${#prefix} - ${#stamp})))"
    if [ -n "$GDRPROBE_PROLOG_LOG" ]; then
        printf '%s%s\n' "$stamp" "$line" >>"$GDRPROBE_PROLOG_LOG"
    else
        logger -t gdrprobe-prolog -- "$line"
    fi
}

# clean MODE MAX: stdin made one line of valid UTF-8 of at most MAX bytes, cut on a character
# boundary and ending in "..." where it was cut. MODE log keeps every byte visible: a
# backslash doubled, a line break as \n, another control character (ESC, CR, C1's CSI...) or
# a byte that is not UTF-8 as \xHH. MODE reason keeps the first line and removes control
# characters and non-UTF-8 bytes: what scontrol gets is printed by sinfo to terminals.
clean() {
    tr -d '\000' | LC_ALL=C awk -v mode="$1" -v max="$2" '
        BEGIN { for (i = 1; i < 256; i++) ord[sprintf("%c", i)] = i; room = max - 3 }
        function put(token) {
            if (length(out) + length(token) > room) cut = 1
            else out = out token
        }
        function control(code) { if (mode == "log") put(sprintf("\\x%02x", code)) }
        NR > 1 && mode != "log" { exit }
        NR > 1 && !cut { put("\\n") }
        !cut {
            n = length($0)
            for (i = 1; i <= n && !cut; i++) {
                c = substr($0, i, 1); b = ord[c]
                if (b == 92) { put(mode == "log" ? "\\\\" : c); continue }
                if (b < 32 || b == 127) { control(b); continue }
                if (b < 128) { put(c); continue }
                need = -1
                if (b >= 194 && b <= 223) need = 1
                else if (b >= 224 && b <= 239) need = 2
                else if (b >= 240 && b <= 244) need = 3
                for (k = 1; k <= need; k++) {
                    d = ord[substr($0, i + k, 1)]
                    if (d < 128 || d > 191) need = -1
                }
                if (need < 0) { control(b); continue }
                second = ord[substr($0, i + 1, 1)]
                if (b == 194 && second < 160) control(second)  # U+0080..U+009F: C1 controls
                else put(substr($0, i, need + 1))
                i += need
            }
        }
        END { printf "%s%s", out, (cut ? "..." : "") }'
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
# stderr: keep that in a file (read back bounded, whatever gdrprobe wrote), let stdout go.
# SLURM_JOB_GPUS goes to gdrprobe in the environment.
said_file=$(mktemp 2>/dev/null) || said_file=/dev/null
trap '[ "$said_file" = /dev/null ] || rm -f "$said_file"' EXIT
# shellcheck disable=SC2086  # GDRPROBE and GDRPROBE_CHECK_ARGS are word lists
$GDRPROBE check --node $GDRPROBE_CHECK_ARGS --quiet 2>"$said_file" >/dev/null
code=$?
said=$(head -c "$READ_MAX" "$said_file" | tr -d '\000')

if [ "$code" = 0 ]; then
    exit 0
fi
if is_drain_code "$code"; then
    reason=$(printf 'gdrprobe: exit %s: %s' "$code" "${said#gdrprobe check: }" \
             | clean reason "$REASON_MAX")
    if scontrol update nodename="$node" state=drain reason="$reason"; then
        log "drain: $said"
    else
        log "drain (scontrol could not drain $node; the failed prolog drains it with Slurm's" \
            "reason): $said"
    fi
    exit 1
fi
log "warn (exit $code), the job starts: ${said:-no message}"
exit 0
