#!/usr/bin/env bash
# Leak check: N airlock runs (default 10000) of every kind, two at a time, then verifies
# that nothing is left behind: no cell cgroup without a live supervisor under
# /sys/fs/cgroup/*/airlock/, no process with a cell host uid (>= 1000000000) outside a
# live cell, the same mount count (host mount namespace) and the same fd count of this
# script. Exits 1 on any leak or misclassified run. Cgroups are checked after every
# pair of runs (the next run would reap a dead supervisor's cgroup), processes every
# 20 runs and at the end.
#
#   scripts/leak-check.sh [N]        # as root
set -u -o pipefail

N=${1:-10000}
case "$N" in '' | *[!0-9]*) echo "usage: $0 [runs]" >&2; exit 2 ;; esac
cd "$(dirname "$0")/.."

if [ "$(id -u)" != 0 ]; then
    echo "leak-check: must run as root (cells need it)" >&2
    exit 2
fi

cargo build --release -q -p airlock || exit 2
BIN=$PWD/target/x86_64-unknown-linux-gnu/release/airlock
WORK=$(mktemp -d /tmp/airlock-leak-check.XXXXXX)
trap 'rm -rf "$WORK"' EXIT

cat >"$WORK/default.yaml" <<'EOF'
{}
EOF
cat >"$WORK/memory.yaml" <<'EOF'
resources:
  memory_mb: 32
EOF
cat >"$WORK/timeout.yaml" <<'EOF'
resources:
  wall_time_seconds: 1
EOF

# The payload of run i and the status/exit code it must end with. Every 500th run
# times out (1 s), so 10000 runs take a few minutes.
kind_of() {
    local i=$1
    if [ $((i % 500)) -eq 250 ]; then
        KIND=timeout CONTRACT=timeout.yaml WANT_STATUS=capacity_exceeded WANT_CODE=124
        ARGV=(/bin/sh -c "trap '' TERM; sleep 30 & while :; do sleep 0.05; done")
    elif [ $((i % 100)) -eq 17 ]; then
        KIND=memory CONTRACT=memory.yaml WANT_STATUS=capacity_exceeded WANT_CODE=137
        ARGV=(python3 -c 'b = bytearray(200 * 2**20)
for i in range(0, len(b), 4096): b[i] = 1')
    elif [ $((i % 100)) -eq 37 ]; then
        KIND=left_behind CONTRACT=default.yaml WANT_STATUS=ok WANT_CODE=0
        ARGV=(/bin/sh -c 'setsid sleep 300 & sleep 60 & exit 0')
    elif [ $((i % 10)) -eq 3 ]; then
        KIND=nonzero CONTRACT=default.yaml WANT_STATUS=task_error WANT_CODE=7
        ARGV=(/bin/sh -c 'echo failing >&2; exit 7')
    else
        KIND=normal CONTRACT=default.yaml WANT_STATUS=ok WANT_CODE=0
        ARGV=(/bin/true)
    fi
}

# Runs number i; appends a line to $WORK/bad on a misclassified or unclean run.
run_one() {
    local i=$1 result="$WORK/r$1.json" code status cleanup
    kind_of "$i"
    "$BIN" run --contract "$WORK/$CONTRACT" --result "$result" -- "${ARGV[@]}" \
        </dev/null >/dev/null 2>&1
    code=$?
    status=$(sed -n 's/^  "status": "\(.*\)",\{0,1\}$/\1/p' "$result" 2>/dev/null)
    cleanup=$(tr -d ' \n' <"$result" 2>/dev/null | grep -o '"cleanup":{"leftovers":\[\],"ok":true}')
    if [ "$code" != "$WANT_CODE" ] || [ "$status" != "$WANT_STATUS" ] || [ -z "$cleanup" ]; then
        echo "run $i ($KIND): exit $code status '${status}' (want $WANT_CODE $WANT_STATUS), cleanup ${cleanup:-NOT ok}" >>"$WORK/bad"
        cp "$result" "$WORK/bad-$i.json" 2>/dev/null
    fi
    rm -f "$result"
}

# Is pid a live airlock supervisor (a root process named airlock)?
live_supervisor() {
    local status
    status=$(cat "/proc/$1/status" 2>/dev/null) || return 1
    [ "$(awk '/^Name:/{print $2}' <<<"$status")" = airlock ] &&
        [ "$(awk '/^Uid:/{print $2}' <<<"$status")" = 0 ]
}

# Cell cgroups whose supervisor is gone.
stale_cgroups() {
    local dir name
    for dir in /sys/fs/cgroup/*/airlock/*/ /sys/fs/cgroup/airlock/*/; do
        [ -d "$dir" ] || continue
        name=$(basename "$dir")
        live_supervisor "${name%%-*}" || echo "$dir"
    done
}

# Processes with a cell host uid that no live supervisor is an ancestor of (one ps).
stray_processes() {
    ps -eo uid=,pid=,ppid=,comm= | awk '
        { uid[$2] = $1; ppid[$2] = $3; comm[$2] = $4 }
        END {
            for (p in uid) {
                if (uid[p] < 1000000000) continue
                q = ppid[p]; ok = 0
                for (hops = 0; hops < 64 && q > 1; hops++) {
                    if (uid[q] == 0 && comm[q] == "airlock") { ok = 1; break }
                    q = ppid[q]
                }
                if (!ok) print "pid " p " uid " uid[p] " (" comm[p] ")"
            }
        }'
}

# The next `airlock run` reaps cgroups of dead supervisors, which would hide a leak of
# an earlier run: look after every pair of runs and remember what was seen.
watch_leaks() {
    stale_cgroups >>"$WORK/seen-cgroups"
    if [ $(($1 % 20)) -eq 0 ]; then
        stray_processes >>"$WORK/seen-processes"
    fi
}

mounts() { wc -l </proc/$$/mountinfo; }
fds() { ls /proc/$$/fd | wc -l; }

cgroups_before=$(stale_cgroups | wc -l)
procs_before=$(stray_processes | wc -l)
: >"$WORK/seen-cgroups"
: >"$WORK/seen-processes"
mounts_before=$(mounts)
fds_before=$(fds)
echo "leak-check: $N runs of $BIN, 2 at a time"
echo "before: $mounts_before mounts, $fds_before fds, $cgroups_before stale cgroups, $procs_before stray cell processes"

start=$(date +%s.%N)
i=0
while [ "$i" -lt "$N" ]; do
    run_one "$i" &
    if [ $((i + 1)) -lt "$N" ]; then
        run_one $((i + 1)) &
    fi
    wait
    i=$((i + 2))
    watch_leaks "$i"
    if [ $((i % 500)) -eq 0 ] || [ "$i" -ge "$N" ]; then
        done_runs=$((i < N ? i : N))
        printf '%6d runs  %6.1f s  %d bad\n' "$done_runs" \
            "$(echo "$(date +%s.%N) - $start" | bc)" "$(cat "$WORK/bad" 2>/dev/null | wc -l)"
    fi
done
seconds=$(echo "$(date +%s.%N) - $start" | bc)

stale=$( (stale_cgroups; cat "$WORK/seen-cgroups") | sort -u)
stray=$( (stray_processes; cat "$WORK/seen-processes") | sort -u)
cgroups_after=$(grep -c . <<<"$stale")
procs_after=$(grep -c . <<<"$stray")
mounts_after=$(mounts)
fds_after=$(fds)
bad=$(cat "$WORK/bad" 2>/dev/null | wc -l)

echo
echo "summary: $N runs in ${seconds} s ($(echo "scale=1; $N / $seconds" | bc) runs/s)"
echo "  leftover cgroups:   $cgroups_after (before $cgroups_before)"
echo "  leftover processes: $procs_after (before $procs_before)"
echo "  mounts:             $mounts_after (before $mounts_before)"
echo "  fds:                $fds_after (before $fds_before)"
echo "  misclassified or unclean runs: $bad"

leak=0
[ "$cgroups_after" -eq 0 ] || { echo "LEAK: cgroups:"; echo "$stale"; leak=1; }
[ "$procs_after" -eq 0 ] || { echo "LEAK: processes:"; echo "$stray"; leak=1; }
[ "$mounts_after" -eq "$mounts_before" ] || { echo "LEAK: mount count changed"; leak=1; }
[ "$fds_after" -eq "$fds_before" ] || { echo "LEAK: fd count changed"; ls -l /proc/$$/fd; leak=1; }
if [ "$bad" -ne 0 ]; then
    echo "BAD RUNS (first 10):"
    head -n 10 "$WORK/bad"
    leak=1
fi
if [ "$leak" -ne 0 ]; then
    echo "leak-check: FAILED"
    exit 1
fi
echo "leak-check: OK"
