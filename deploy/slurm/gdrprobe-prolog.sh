#!/bin/sh
# gdrprobe's Slurm prolog: check the job's GPUs on this node before any task of the job runs
# here, and turn the job away from a node that cannot do GPUDirect RDMA.
#
# Install it as slurm.conf's Prolog= on every node with PrologFlags=Alloc,DeferBatch (and
# never NoHold): docs/slurm.md, "A hard gate", says why each flag, from Slurm's source. slurmd
# runs it as root once per node and job. What it does with the gate's exit code is the "prolog
# action" column of the README's exit-code table (SCHEDULER_ACTION in gdrprobe/errors.py; a
# unit test holds DRAIN_CODES below equal to it):
#   start  exit 0: nothing to say
#   drain  the node cannot do GPUDirect RDMA: `scontrol update ... state=drain` with the
#          gate's own one-line reason (what `sinfo -R` shows); then the prolog ends the job
#          itself (end_job below: a batch job requeued, held unless SchedulerParameters has
#          nohold_on_prolog_fail, as slurmd would, and exit 1; any other job, or one that
#          may not be requeued, cancelled, and exit 0: turn_away says why). Slurm's own
#          reaction to a failed prolog comes too late to be a gate: slurmd reports the
#          prolog over to slurmctld before it asks for the requeue or the kill, and in
#          between an srun or salloc waiting for the prolog may start a step here
#          (docs/slurm.md, "A hard gate"). Slurm never requeues an srun or salloc job: it
#          cancels it.
#   warn   any other code (not testable, inconclusive, an NCCL setting of the job...): log
#          why and exit 0, so the job starts
# except where the check could not run at all: a usage error, a missing extra or a bug in
# gdrprobe (CANNOT_CHECK_CODES below, errors.CANNOT_CHECK_CODES: 2, 3, 70), gdrprobe not
# installed or not executable (the shell's 127, 126), or a settings file it cannot read (2).
# Nothing is said against the node, but nothing checks it either until an operator acts:
# always a log record and the metric gdrprobe_prolog_cannot_check, and with
# GDRPROBE_PROLOG_STRICT=1 a drain with the reason "gdrprobe cannot check: ...", so that a
# cluster never runs for weeks on a gate that is off. Every check's outcome goes to
# node-exporter's textfile directory (GDRPROBE_PROLOG_METRICS_DIR, Debian's
# /var/lib/prometheus/node-exporter by default) as gdrprobe_<prolog|health_check>.prom.
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
# Slurm runs prologs with no search path ("for security reasons, these programs do not have a
# search path set", Slurm's prolog_epilog.html): the prolog sets one for the system's own
# commands (scontrol, scancel, logger, timeout) after the caller's, and gdrprobe is named by
# its absolute path in the settings file; a gdrprobe that is not there is a configuration
# error (exit 127), not a job start with nothing checked unnoticed.
#
# Its own time limit: slurm.conf(5) expects a prolog to finish "in less time than
# MessageTimeout" (10 s by default), and a batch job whose launch takes longer than
# BatchStartTimeout (10 s by default) is considered missing. gdrprobe's --time-budget bounds
# its measurement, but not a driver call that never returns: timeout(1) sends the check
# SIGTERM at GDRPROBE_PROLOG_TIMEOUT and SIGKILL GDRPROBE_PROLOG_KILL_AFTER later, and a
# check that even SIGKILL does not end (a process stuck in the kernel) is left behind one
# second after that. Either way the node is drained: "gdrprobe: check stuck past N s". The
# defaults (a 6 s budget, SIGTERM at 8 s, SIGKILL at 10 s) keep a job start within
# MessageTimeout's default; the full check of every GPU belongs to HealthCheckProgram on idle
# nodes (gdrprobe-healthcheck.sh beside this file, docs/slurm.md), whose own defaults fit
# Slurm's 60 s limit for it.
#
# Settings come from /etc/default/gdrprobe-prolog (or $GDRPROBE_PROLOG_CONF). The file is
# read, never run: one `NAME=VALUE` or `export NAME=VALUE` a line, the value written as in
# a shell (quotes, backslashes, $NAME and ${NAME} of the environment or an earlier line),
# comments after #; anything else (a quote left open, a command, a setting that is not one
# of these, a value these cannot take) is a settings error: logged with its line, the metric
# set, and the check not run (the strict rule decides the job):
#   GDRPROBE              the gdrprobe command, by its absolute path (default: gdrprobe on
#                         the prolog's PATH), such as /opt/gdrprobe/.venv/bin/gdrprobe
#   GDRPROBE_CHECK_ARGS   more arguments for `gdrprobe check --node` (default: --time-budget 6)
#   GDRPROBE_PROLOG_TIMEOUT, GDRPROBE_PROLOG_KILL_AFTER  the outer limit above (8, 2 seconds),
#                         as timeout(1) takes a duration: seconds, or a number and s, m, h, d
#   GDRPROBE_PROLOG_LOG   a file for the log records (default: syslog through logger)
#   GDRPROBE_PROLOG_STRICT  1: a check that cannot run drains the node (default 0: warns)
#   GDRPROBE_PROLOG_METRICS_DIR  node-exporter's --collector.textfile.directory (default
#                         /var/lib/prometheus/node-exporter; empty: no metrics)
#   GDRPROBE_JOB_WITHOUT_GPUS  a job with no SLURM_JOB_GPUS: skip (nothing to check), check
#                         (every GPU of the node) or auto (default: skip where slurm.conf's
#                         GresTypes names gpu, else check)
#   GDRPROBE_HEALTH_CHECK_ARGS, _TIMEOUT, _KILL_AFTER  the same for the health check
# slurmd gives the prolog an environment of its own, not the job's (prolog_epilog.html,
# "Prolog and Epilog Scripts"), so anything gdrprobe needs from the environment
# (NCCL_IB_HCA, say) is exported there: `export NCCL_IB_HCA=mlx5_0`.
#
# Run with GDRPROBE_HEALTH_CHECK=1 (gdrprobe-healthcheck.sh does), it is the node's health
# check instead: no job, every GPU of the node, the GDRPROBE_HEALTH_CHECK_* settings, and
# exit 0 whatever it found (slurmd acts on a health check's drain, not on its exit code).

DRAIN_CODES="1 4 6 7 8 11"
CANNOT_CHECK_CODES="2 3 70 126 127"
SETTINGS_ERROR=2        # a settings file the prolog cannot read: a configuration error
REASON_MAX=200          # bytes of the drain reason: one line of `sinfo -R`
LOG_RECORD_MAX=1024     # bytes of one log record, time stamp included (log below)
READ_MAX=65536          # bytes of gdrprobe's output read back: far more than one record holds

PATH=${PATH:+$PATH:}/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
export PATH

GDRPROBE=gdrprobe
GDRPROBE_CHECK_ARGS="--time-budget 6"
GDRPROBE_PROLOG_TIMEOUT=8
GDRPROBE_PROLOG_KILL_AFTER=2
# The health check: gdrprobe's own default budget (30 s), SIGTERM at 50 s and SIGKILL at
# 55 s, within the 60 s after which slurmd kills a HealthCheckProgram (slurm.conf(5)).
GDRPROBE_HEALTH_CHECK_ARGS=
GDRPROBE_HEALTH_CHECK_TIMEOUT=50
GDRPROBE_HEALTH_CHECK_KILL_AFTER=5
GDRPROBE_PROLOG_LOG=
GDRPROBE_PROLOG_STRICT=0
GDRPROBE_PROLOG_METRICS_DIR=/var/lib/prometheus/node-exporter
GDRPROBE_JOB_WITHOUT_GPUS=auto
SETTINGS="GDRPROBE GDRPROBE_CHECK_ARGS GDRPROBE_PROLOG_TIMEOUT GDRPROBE_PROLOG_KILL_AFTER
GDRPROBE_HEALTH_CHECK_ARGS GDRPROBE_HEALTH_CHECK_TIMEOUT GDRPROBE_HEALTH_CHECK_KILL_AFTER
GDRPROBE_PROLOG_LOG GDRPROBE_PROLOG_STRICT GDRPROBE_PROLOG_METRICS_DIR GDRPROBE_JOB_WITHOUT_GPUS"
conf=${GDRPROBE_PROLOG_CONF:-/etc/default/gdrprobe-prolog}
node=${SLURMD_NODENAME:-$(hostname -s)}
run="job ${SLURM_JOB_ID:-?}"
kind=prolog
health_check=0
[ "${GDRPROBE_HEALTH_CHECK:-0}" = 1 ] && { health_check=1; run="health check"; kind=health_check; }
set -f                  # no pathname expansion of the word lists below (GDRPROBE_CHECK_ARGS)

# One record per run, on one line: gdrprobe's output (which a driver's message or a broken
# locale may fill with anything) is escaped byte by byte, never through echo, which expands
# backslashes (a "\\c" would glue the next record onto this one); the record stays within
# LOG_RECORD_MAX bytes: syslog's traditional message size, logger(1)'s default --size
# (util-linux, RFC 3164's 1 KiB), and under PIPE_BUF (4 KiB), so that the records of
# prologs running at once never interleave in the file (one write to an O_APPEND file).
log() {
    stamp="$(date -u +%Y-%m-%dT%H:%M:%SZ) "
    prefix="gdrprobe-prolog: node $node, $run: "
    line="$prefix$(printf '%s' "$*" | clean log $((LOG_RECORD_MAX - ${#prefix} - ${#stamp})))"
    if [ -n "$GDRPROBE_PROLOG_LOG" ]; then
        printf '%s%s\n' "$stamp" "$line" >>"$GDRPROBE_PROLOG_LOG"
    else
        logger -t gdrprobe-prolog -- "$line"
    fi
}

# clean MODE MAX: stdin made one line of valid UTF-8 of at most MAX bytes, cut on a character
# boundary and ending in "..." where it was cut. MODE log keeps every byte visible: a
# backslash doubled, a line break as \n, another control character (ESC, CR, C1's CSI...),
# a byte that is not UTF-8 (an overlong form, a surrogate) or a hidden character as \xHH.
# MODE reason keeps the first line and removes all of those: what scontrol gets is printed
# by sinfo to terminals. Hidden: the line and paragraph separators U+2028 and U+2029, the
# noncharacters (U+FDD0-FDEF, U+FFFE and U+FFFF of every plane), private use, and the format
# characters that hide or reorder text (soft hyphen, zero-width and bidirectional marks and
# overrides, U+2060-206F, the byte-order mark, tags).
clean() {
    tr -d '\000' | LC_ALL=C awk -v mode="$1" -v max="$2" '
        BEGIN { for (i = 1; i < 256; i++) ord[sprintf("%c", i)] = i; room = max - 3 }
        function put(token) {
            if (length(out) + length(token) > room) cut = 1
            else out = out token
        }
        function control(code) { if (mode == "log") put(sprintf("\\x%02x", code)) }
        function hidden(cp) {
            return cp == 173 || cp == 1564 || (cp >= 8203 && cp <= 8207) || \
                (cp >= 8232 && cp <= 8238) || (cp >= 8288 && cp <= 8303) || cp == 65279 || \
                (cp >= 57344 && cp <= 63743) || (cp >= 64976 && cp <= 65007) || \
                (cp >= 65529 && cp <= 65531) || cp % 65536 >= 65534 || cp >= 917504
        }
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
                cp = b % 2 ^ (6 - need)
                for (k = 1; k <= need; k++) {
                    d = ord[substr($0, i + k, 1)]
                    if (d < 128 || d > 191) need = -1
                    else cp = cp * 64 + d - 128
                }
                # Overlong forms, surrogates and past U+10FFFF are not UTF-8 either.
                if (need < 0 || cp < 2 ^ (need == 1 ? 7 : 5 * need + 1) || \
                    (cp >= 55296 && cp <= 57343) || cp > 1114111) { control(b); continue }
                second = ord[substr($0, i + 1, 1)]
                if (b == 194 && second < 160) control(second)  # U+0080..U+009F: C1 controls
                else if (hidden(cp)) { for (k = 0; k <= need; k++) control(ord[substr($0, i + k, 1)]) }
                else put(substr($0, i, need + 1))
                i += need
            }
        }
        END { printf "%s%s", out, (cut ? "..." : "") }'
}

# is_one_of WORD LIST: whether WORD is one of the words in LIST.
is_one_of() {
    for listed in $2; do
        [ "$1" = "$listed" ] && return 0
    done
    return 1
}

# ---- the settings file: read, never run -----------------------------------------------------

# The reader: each line of the settings file as a record of two lines for the shell below,
# "s LINE NAME" (or "x LINE NAME", exported) and the value, or "e LINE" and what is wrong
# with it. A value is a shell word: unquoted characters, '...' as written, "..." with \\ \"
# \$ \` escaped, a backslash quoting the next character, $NAME and ${NAME} of the prolog's
# environment, its defaults and the lines above. Whatever a shell would run (a command, a
# pipe, $(...) or `...`, ${NAME...} with an operator) or continue on the next line is
# refused: the file is configuration, read as data.
READER='
function fail(what) {
    if (length(text) > 120) text = substr(text, 1, 117) "..."
    printf "e %d\n%s: %s\n", NR, what, text; bad = 1
}
function name_at(k,    start) {
    start = k
    if (substr(line, k, 1) !~ /[A-Za-z_]/) return ""
    while (k <= n && substr(line, k, 1) ~ /[A-Za-z0-9_]/) k++
    return substr(line, start, k - start)
}
function value_of(name) { return (name in set) ? set[name] : ENVIRON[name] }
# $NAME or ${NAME} at i: appended to value; 0 where the syntax is refused.
function expand(    name, shut) {
    if (substr(line, i + 1, 1) == "{") {
        shut = index(substr(line, i + 2), "}")
        name = name_at(i + 2)
        if (!shut || length(name) != shut - 1) {
            fail("only $NAME and ${NAME} are expanded (the file is read, not run)")
            return 0
        }
        value = value value_of(name); i += shut + 2; return 1
    }
    if (substr(line, i + 1, 1) == "(") {
        fail("$(...) would run a command: the settings file is read, not run"); return 0
    }
    name = name_at(i + 1)
    if (name == "") { value = value "$"; i++; return 1 }
    value = value value_of(name); i += length(name) + 1; return 1
}
function double_quoted(    c, d) {
    i++
    while (i <= n) {
        c = substr(line, i, 1)
        if (c == "\"") { i++; return 1 }
        if (c == "`") { fail("`...` would run a command: the settings file is read, not run"); return 0 }
        if (c == "$") { if (!expand()) return 0; continue }
        if (c == "\\") {
            d = substr(line, i + 1, 1)
            if (d == "") break
            value = value (index("$`\"\\", d) ? d : c d); i += 2; continue
        }
        value = value c; i++
    }
    fail("a double quote left open (the value must end on its own line)"); return 0
}
BEGIN { quote = sprintf("%c", 39) }
{
    line = $0; sub(/\r$/, "", line); text = line; n = length(line); i = 1
    while (i <= n && substr(line, i, 1) ~ /[ \t]/) i++
    if (i > n || substr(line, i, 1) == "#") next
    exported = 0
    if (substr(line, i, 6) == "export" && substr(line, i + 6, 1) ~ /[ \t]/) {
        exported = 1; i += 6
        while (i <= n && substr(line, i, 1) ~ /[ \t]/) i++
    }
    name = name_at(i); i += length(name)
    if (name == "") { fail("not a setting (NAME=VALUE)"); next }
    if (exported && (i > n || substr(line, i, 1) ~ /[ \t#]/)) {
        rest = substr(line, i); sub(/^[ \t]+/, "", rest)
        if (rest != "" && substr(rest, 1, 1) != "#") { fail("one setting a line"); next }
        if (name in set || name in ENVIRON) printf "x %d %s\n%s\n", NR, name, value_of(name)
        next
    }
    if (substr(line, i, 1) != "=") { fail("not a setting (NAME=VALUE)"); next }
    i++; value = ""; ok = 1
    while (ok && i <= n) {
        c = substr(line, i, 1)
        if (c ~ /[ \t]/) break
        if (c == quote) {
            shut = index(substr(line, i + 1), quote)
            if (!shut) { fail("a single quote left open (the value must end on its own line)"); ok = 0; break }
            value = value substr(line, i + 1, shut - 1); i += shut + 1
        } else if (c == "\"") ok = double_quoted()
        else if (c == "$") ok = expand()
        else if (c == "\\") {
            if (i == n) { fail("a backslash at the end of the line (a value ends on its own line)"); ok = 0; break }
            value = value substr(line, i + 1, 1); i += 2
        } else if (c ~ /[;&|<>()`]/) {
            fail("\"" c "\" is shell syntax: the settings file is read, not run"); ok = 0
        } else { value = value c; i++ }
    }
    if (!ok) next
    rest = substr(line, i); sub(/^[ \t]+/, "", rest)
    if (rest != "" && substr(rest, 1, 1) != "#") { fail("one setting a line"); next }
    set[name] = value
    printf "%s %d %s\n%s\n", (exported ? "x" : "s"), NR, name, value
}'

settings_error=
# settings_fault WHAT: a settings error, the first one kept (the log names its line).
settings_fault() {
    [ -n "$settings_error" ] || settings_error="$conf: $1"
}

# read_settings: the settings file's valid lines applied, the first fault kept; a variable
# the file exports goes to gdrprobe's environment.
read_settings() {
    [ -e "$conf" ] || return 0
    if [ ! -r "$conf" ] || [ -d "$conf" ]; then
        settings_fault "cannot be read"
        return 0
    fi
    set --
    for setting in $SETTINGS; do
        eval "set -- \"\$@\" \"$setting=\${$setting}\""
    done
    if ! env "$@" LC_ALL=C awk "$READER" "$conf" >"$scratch" 2>&1; then
        settings_fault "awk could not read it: $(head -c 200 "$scratch")"
        return 0
    fi
    while IFS= read -r head && IFS= read -r value; do
        set -- $head
        case $1 in
            e) settings_fault "line $2: $value" ;;
            x) export "$3=$value"
               is_one_of "$3" "$SETTINGS" && eval "line_$3=\$2" ;;
            s) if is_one_of "$3" "$SETTINGS"; then
                   eval "$3=\$value; line_$3=\$2"
               else
                   settings_fault "line $2: $3 is not a setting of the prolog (a variable for gdrprobe is exported: export $3=...)"
               fi ;;
        esac
    done <"$scratch"
}

# seconds DURATION: DURATION in whole seconds (rounded up) on stdout, as timeout(1) reads a
# duration (a number, then s, m, h or d; seconds without one; over 0); fails otherwise.
seconds() {
    case $1 in
        ''|*[!0-9.smhd]*) return 1 ;;
    esac
    awk -v given="$1" 'BEGIN {
        if (given !~ /^([0-9]+|[0-9]*\.[0-9]+)[smhd]?$/) exit 1
        unit = substr(given, length(given)); number = given; scale = 1
        if (unit ~ /[smhd]/) {
            number = substr(given, 1, length(given) - 1)
            scale = unit == "m" ? 60 : unit == "h" ? 3600 : unit == "d" ? 86400 : 1
        }
        whole = number * scale; rounded = int(whole); if (rounded < whole) rounded++
        if (rounded < 1) exit 1
        print rounded }'
}

# duration NAME: the setting NAME made whole seconds, or a settings fault naming its line.
duration() {
    eval "given=\${$1}; where=\${line_$1:-}"
    if made=$(seconds "$given"); then
        eval "$1=\$made"
    else
        settings_fault "${where:+line $where: }$1=$given is not a duration over 0 (seconds, or a number and s, m, h or d, as timeout(1) takes)"
    fi
}

# one_of NAME CHOICES: a settings fault where the setting NAME is not one of CHOICES.
one_of() {
    eval "given=\${$1}; where=\${line_$1:-}"
    is_one_of "$given" "$2" \
        || settings_fault "${where:+line $where: }$1=$given is not one of: $2"
}

# ---- the check and what it says ----------------------------------------------------------

# metric CODE CANNOT: this check's outcome for node-exporter's textfile collector, replaced
# atomically (written beside it under a name the collector skips, then renamed), so that a
# scrape never reads half a file. CODE: gdrprobe's exit code, timeout(1)'s 124 for a stuck
# check, 2 for a settings file the prolog cannot read; CANNOT: 1 where the check could not
# run (CANNOT_CHECK_CODES, a stuck check, a settings error).
metric() {
    dir=$GDRPROBE_PROLOG_METRICS_DIR
    [ -n "$dir" ] && [ -d "$dir" ] || return 0
    labels="{check=\"$kind\"}"
    staged=$(mktemp "$dir/.gdrprobe_$kind.XXXXXX" 2>/dev/null) || return 0
    if printf '%s\n' \
        "# HELP gdrprobe_prolog_exit_code The exit code of the last gdrprobe check the prolog or health check ran (124: stuck past its limit)." \
        "# TYPE gdrprobe_prolog_exit_code gauge" \
        "gdrprobe_prolog_exit_code$labels $1" \
        "# HELP gdrprobe_prolog_cannot_check 1 where the last check could not run (a configuration or internal error, gdrprobe missing, a stuck check)." \
        "# TYPE gdrprobe_prolog_cannot_check gauge" \
        "gdrprobe_prolog_cannot_check$labels $2" \
        "# HELP gdrprobe_prolog_timestamp_seconds When the last check ended, in seconds since the epoch." \
        "# TYPE gdrprobe_prolog_timestamp_seconds gauge" \
        "gdrprobe_prolog_timestamp_seconds$labels $(date +%s)" >"$staged" \
        && chmod 0644 "$staged" && mv -f "$staged" "$dir/gdrprobe_$kind.prom"; then
        return 0
    fi
    rm -f "$staged"
}

# Whether a job Slurm gave no GPU on this node is left unchecked: Slurm allocates GPUs here
# (slurm.conf's GresTypes names gpu), so the job has none.
skips_jobs_without_gpus() {
    case "$GDRPROBE_JOB_WITHOUT_GPUS" in
        skip) return 0 ;;
        check) return 1 ;;
    esac
    slurm_conf_names GresTypes gpu
}

# slurm_conf_names KEY WORD: whether slurm.conf ($SLURM_CONF, else /etc/slurm/slurm.conf)
# sets KEY to a list naming WORD (keys are case-insensitive, slurm.conf(5)).
slurm_conf_names() {
    grep -Eiq "^[[:space:]]*$1[[:space:]]*=.*$2" "${SLURM_CONF:-/etc/slurm/slurm.conf}" \
        2>/dev/null
}

# check: gdrprobe's check under the prolog's own limit (the header); sets `code` (STUCK for
# a check that outlived it) and `said`. --quiet prints nothing when every GPU is engaged and
# one line per GPU otherwise, on stderr: that goes to a file, read back bounded whatever
# gdrprobe wrote; stdout goes. SLURM_JOB_GPUS goes to gdrprobe in the environment.
STUCK=stuck
check() {
    limit=$GDRPROBE_PROLOG_TIMEOUT
    kill_after=$GDRPROBE_PROLOG_KILL_AFTER
    # shellcheck disable=SC2086  # GDRPROBE and GDRPROBE_CHECK_ARGS are word lists
    timeout -k "$kill_after" "$limit" $GDRPROBE check --node $GDRPROBE_CHECK_ARGS --quiet \
        2>"$scratch" >/dev/null </dev/null &
    checking=$!
    # The watchdog for a check SIGKILL cannot end: it interrupts the wait below (a trapped
    # signal ends `wait`), and is itself stopped, with its sleep, once the check ends.
    trap 'code=$STUCK' USR1
    (trap 'kill "$sleeping" 2>/dev/null; exit 0' TERM
     sleep $((limit + kill_after + 1)) & sleeping=$!
     wait "$sleeping" && kill -USR1 $$) </dev/null >/dev/null 2>&1 &
    watchdog=$!
    code=
    wait "$checking"
    done_code=$?
    kill "$watchdog" 2>/dev/null
    # timeout(1) exits 124 for a check ended by SIGTERM, 128+9 for one SIGKILL ended.
    case "$code:$done_code" in
        "$STUCK":*|:124|:137) code=$STUCK ;;
        *) code=$done_code ;;
    esac
    said=$(head -c "$READ_MAX" "$scratch" | tr -d '\000')
}

# gdrprobe prints no traceback: its own errors are a message and an exit code, its bugs 70.
# A traceback is Python dying before gdrprobe's main (a broken install: the package missing
# from the interpreter the command names), whose exit 1 is not a verdict: it cannot check.
# argparse's refusal of GDRPROBE_CHECK_ARGS is its usage text (hundreds of bytes naming
# every flag) and then its one line "gdrprobe check: error: ...": only that line, and what
# follows it, is kept for the log and the reason.
NOT_STARTED=70
interpret() {
    case "$said" in
        "Traceback (most recent call last):"*)
            code=$NOT_STARTED
            said="gdrprobe did not start (a Python traceback; reinstall gdrprobe for $GDRPROBE):\
 $(printf '%s\n' "$said" | tail -n 1)" ;;
        "usage: "*": error: "*)
            said=$(printf '%s\n' "$said" | sed -n '/: error: /,$p') ;;
    esac
}

# drain REASON: the node drained with REASON (what `sinfo -R` shows); `drained` says how
# for the log record.
drain() {
    reason=$(printf '%s' "$1" | clean reason "$REASON_MAX")
    if scontrol update nodename="$node" state=drain reason="$reason"; then
        drained=drain
    else
        drained="drain (scontrol could not drain $node; the failed prolog drains it with Slurm's reason)"
    fi
}

# end_job: the job turned away before the prolog returns, which is what makes the drain a
# gate (docs/slurm.md, "A hard gate"): a batch job requeued as slurmd would (held unless
# SchedulerParameters has nohold_on_prolog_fail), any other job, or one that may not be
# requeued, cancelled; `ended` says which for the log record, `cancelled` whether it was.
end_job() {
    ended=
    cancelled=0
    [ -n "${SLURM_JOB_ID:-}" ] || return 0
    requeue=requeuehold
    slurm_conf_names SchedulerParameters nohold_on_prolog_fail && requeue=requeue
    if refused=$(scontrol "$requeue" "$SLURM_JOB_ID" 2>&1); then
        ended="the job is requeued$([ "$requeue" = requeuehold ] && printf ' and held')"
    elif cancel_said=$(scancel "$SLURM_JOB_ID" 2>&1); then
        ended="the job is cancelled ($(last_line "$refused" "not requeued"))"
        cancelled=1
    else
        ended="the job is left to Slurm (scontrol $requeue: $(last_line "$refused" failed);\
 scancel: $(last_line "$cancel_said" failed))"
    fi
}

# last_line TEXT DEFAULT: the last line of a command's output (its error), else DEFAULT.
last_line() {
    printf '%s\n' "${1:-$2}" | tail -n 1
}

# turn_away REASON MESSAGE: the node drained with REASON, the job ended, one record, and
# the exit status slurmd acts on (a health check: the drain and the record, exit 0). 1 is
# a failed prolog: slurmd revokes the job's credentials on this node, then has the job
# requeued or killed. A job this prolog cancelled itself gets 0: slurmd's kill would find
# it ended and retry every 15 s until slurmctld forgets the job (MinJobAge), holding
# slurmd's shutdown; the cancel's own kill request revokes the credentials instead. Where
# the drain or the end of the job failed, 1 leaves both to Slurm.
turn_away() {
    drain "$1"
    if [ "$health_check" = 1 ]; then
        log "$drained: $2"
        exit 0
    fi
    end_job
    log "$drained${ended:+, $ended}: $2"
    [ "$cancelled" = 1 ] && [ "$drained" = drain ] && exit 0
    exit 1
}

# ---- the run -------------------------------------------------------------------------------

# A node whose /tmp is read-only (a diskless image) still has /run, a tmpfs.
scratch=$(mktemp 2>/dev/null || mktemp -p /run 2>/dev/null) || scratch=/dev/null
trap '[ "$scratch" = /dev/null ] || rm -f "$scratch"' EXIT

read_settings
if [ "$health_check" = 1 ]; then
    unset SLURM_JOB_GPUS
    GDRPROBE_JOB_WITHOUT_GPUS=check
    GDRPROBE_CHECK_ARGS=$GDRPROBE_HEALTH_CHECK_ARGS
    GDRPROBE_PROLOG_TIMEOUT=$GDRPROBE_HEALTH_CHECK_TIMEOUT
    GDRPROBE_PROLOG_KILL_AFTER=$GDRPROBE_HEALTH_CHECK_KILL_AFTER
    line_GDRPROBE_PROLOG_TIMEOUT=${line_GDRPROBE_HEALTH_CHECK_TIMEOUT:-}
    line_GDRPROBE_PROLOG_KILL_AFTER=${line_GDRPROBE_HEALTH_CHECK_KILL_AFTER:-}
fi
duration GDRPROBE_PROLOG_TIMEOUT
duration GDRPROBE_PROLOG_KILL_AFTER
one_of GDRPROBE_PROLOG_STRICT "0 1"
one_of GDRPROBE_JOB_WITHOUT_GPUS "auto skip check"
[ -n "$GDRPROBE" ] || settings_fault "${line_GDRPROBE:+line $line_GDRPROBE: }GDRPROBE is empty: name gdrprobe by its absolute path"

starts=", the job starts"
[ "$health_check" = 1 ] && starts=
if [ -n "$settings_error" ]; then
    metric "$SETTINGS_ERROR" 1
    if [ "$GDRPROBE_PROLOG_STRICT" = 1 ]; then
        turn_away "gdrprobe cannot check: settings: $settings_error" \
                  "gdrprobe cannot check (a settings error, nothing checked): $settings_error"
    fi
    log "gdrprobe cannot check (a settings error, nothing checked)$starts" \
        "(GDRPROBE_PROLOG_STRICT=1 drains): $settings_error"
    exit 0
fi

if [ -z "${SLURM_JOB_GPUS:-}" ] && skips_jobs_without_gpus; then
    log "start: the job has no GPU on this node (SLURM_JOB_GPUS unset): nothing to check"
    exit 0
fi

# The command, found where the settings file says (slurmd gives the prolog no search path).
set -- $GDRPROBE
if command -v "${1:-gdrprobe}" >/dev/null 2>&1; then
    check
    interpret
else
    code=127
    said="gdrprobe not found: GDRPROBE=$GDRPROBE; set GDRPROBE in $conf to its absolute path \
(slurmd gives a prolog no search path)"
fi

if [ "$code" = "$STUCK" ]; then
    metric 124 1
    turn_away "gdrprobe: check stuck past $GDRPROBE_PROLOG_TIMEOUT s" \
              "gdrprobe check stuck past $GDRPROBE_PROLOG_TIMEOUT s, killed by the prolog's own limit${said:+: $said}"
fi
cannot=0
is_one_of "$code" "$CANNOT_CHECK_CODES" && cannot=1
metric "$code" "$cannot"
if [ "$code" = 0 ]; then
    exit 0
fi
if is_one_of "$code" "$DRAIN_CODES"; then
    turn_away "gdrprobe: exit $code: ${said#gdrprobe check: }" "$said"
fi
if [ "$cannot" = 1 ] && [ "$GDRPROBE_PROLOG_STRICT" = 1 ]; then
    turn_away "gdrprobe cannot check: exit $code: ${said#gdrprobe check: }" \
              "gdrprobe cannot check (exit $code): ${said:-no message}"
fi
if [ "$cannot" = 1 ]; then
    log "gdrprobe cannot check (exit $code)$starts (GDRPROBE_PROLOG_STRICT=1 drains):" \
        "${said:-no message}"
    exit 0
fi
log "warn (exit $code)$starts: ${said:-no message}"
exit 0
