#!/usr/bin/env bash
# Leak check: N airlock runs (default 10000) of every kind, two at a time, then verifies
# that nothing of these runs is left behind: no cgroup of theirs, no process in one, the
# same mount count and the same fd count of this script. Exits 1 on any leak or
# misclassified run. Cgroups and processes are checked after every pair of runs (the
# next run, or any other airlock run on the host, reaps a dead supervisor's cgroup) and
# at the end.
#
# Other cells may run on this host meanwhile (other users, tests, an installed airlock or
# a copy under another name); they are not this script's leaks. So its own runs are
# recognised, never processes by name: each supervisor's pid and start time are recorded
# when it starts, and they begin the names of its cells' cgroups
# (`<pid>-<start time>-<ns>`, crates/cell/src/cgroup.rs); every process of a cell is in
# its cgroup. The runs use a state dir of their own, and the script runs in a private
# mount namespace so that mounts made elsewhere on the host do not change its count
# (a mount an airlock supervisor leaks lands in its namespace, which is this one).
#
#   scripts/leak-check.sh [N]        # as root
#   ENGINE_SECONDS=0 scripts/leak-check.sh 1000   # without the engine phase
set -u -o pipefail

N=${1:-10000}
case "$N" in '' | *[!0-9]*) echo "usage: $0 [runs]" >&2; exit 2 ;; esac
cd "$(dirname "$0")/.."

if [ "$(id -u)" != 0 ]; then
    echo "leak-check: must run as root (cells need it)" >&2
    exit 2
fi
if [ -z "${AIRLOCK_LEAK_CHECK_PRIVATE_MOUNTS:-}" ]; then
    AIRLOCK_LEAK_CHECK_PRIVATE_MOUNTS=1 exec unshare --mount --propagation private -- \
        "$BASH" "$0" "$@"
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

# Field 22 (start time) of /proc/PID/stat; the fields after the command name start at 3.
start_time() {
    local stat fields
    stat=$(cat "/proc/$1/stat") || return 1
    read -r -a fields <<<"${stat##*) }"
    echo "${fields[19]}"
}

# Runs number i; records its supervisor's cgroup name prefix in $WORK/supervisors;
# appends a line to $WORK/bad on a misclassified or unclean run.
run_one() {
    local i=$1 result="$WORK/r$1.json" code status cleanup pid
    kind_of "$i"
    "$BIN" run --state-dir "$WORK/state" --contract "$WORK/$CONTRACT" --result "$result" \
        -- "${ARGV[@]}" </dev/null >/dev/null 2>&1 &
    pid=$!
    # Not waited for yet, so /proc/$pid stays (even once it exited); the start time is
    # the fork's, the same after exec. One short line per append: the two runs' lines
    # do not mix.
    echo "$pid-$(start_time "$pid")-" >>"$WORK/supervisors"
    wait "$pid"
    code=$?
    status=$(sed -n 's/^  "status": "\(.*\)",\{0,1\}$/\1/p' "$result" 2>/dev/null)
    cleanup=$(tr -d ' \n' <"$result" 2>/dev/null | grep -o '"cleanup":{"leftovers":\[\],"ok":true}')
    if [ "$code" != "$WANT_CODE" ] || [ "$status" != "$WANT_STATUS" ] || [ -z "$cleanup" ]; then
        echo "run $i ($KIND): exit $code status '${status}' (want $WANT_CODE $WANT_STATUS), cleanup ${cleanup:-NOT ok}" >>"$WORK/bad"
        cp "$result" "$WORK/bad-$i.json" 2>/dev/null
    fi
    rm -f "$result"
}

# Cgroup dirs of cells of this script's supervisors (all have exited when it looks).
stale_cgroups() {
    local dir name
    for dir in /sys/fs/cgroup/*/airlock/*/ /sys/fs/cgroup/airlock/*/; do
        [ -d "$dir" ] || continue
        name=$(basename "$dir")
        if grep -qxF -- "${name%-*}-" "$WORK/supervisors"; then
            echo "$dir"
        fi
    done
}

# Processes in those cgroups: every process of a cell is in the cell's cgroup.
stray_processes() {
    local dir pid
    for dir in $(stale_cgroups); do
        # Another run on the host may be reaping it right now.
        [ -r "$dir/cgroup.procs" ] || continue
        while read -r pid; do
            echo "pid $pid ($(cat "/proc/$pid/comm" 2>/dev/null)) in $dir"
        done < <(cat "$dir/cgroup.procs" 2>/dev/null)
    done
}

# The next `airlock run` (this script's or anyone's on the host) reaps cgroups of dead
# supervisors and kills what is in them, which would hide a leak of an earlier run: look
# after every pair of runs and remember what was seen.
watch_leaks() {
    stale_cgroups >>"$WORK/seen-cgroups"
    stray_processes >>"$WORK/seen-processes"
}

mounts() { wc -l </proc/$$/mountinfo; }
fds() { ls /proc/$$/fd | wc -l; }

: >"$WORK/supervisors"
cgroups_before=$(stale_cgroups | wc -l)
procs_before=$(stray_processes | wc -l)
: >"$WORK/seen-cgroups"
: >"$WORK/seen-processes"
mounts_before=$(mounts)
fds_before=$(fds)
echo "leak-check: $N runs of $BIN, 2 at a time"
echo "before: $mounts_before mounts, $fds_before fds, $cgroups_before leftover cgroups, $procs_before leftover cell processes"

start=$(date +%s.%N)
i=0
while [ "$i" -lt "$N" ]; do
    run_one "$i" &
    if [ $((i + 1)) -lt "$N" ]; then
        run_one $((i + 1)) &
    fi
    wait
    i=$((i + 2))
    watch_leaks
    if [ $((i % 500)) -eq 0 ] || [ "$i" -ge "$N" ]; then
        done_runs=$((i < N ? i : N))
        printf '%6d runs  %6.1f s  %d bad\n' "$done_runs" \
            "$(echo "$(date +%s.%N) - $start" | bc)" "$(cat "$WORK/bad" 2>/dev/null | wc -l)"
    fi
done
seconds=$(echo "$(date +%s.%N) - $start" | bc)

# The engine phase: 16 threads of one process driving warm and on-demand cells through
# the cell factory for ENGINE_SECONDS (0 skips it). Its cells' cgroups are named by
# supervisor processes the script does not see start, so what is compared is the set of
# cell cgroups and cell pid 1s (named airlock-init) before and after: run the check on an
# otherwise idle host.
ENGINE_SECONDS=${ENGINE_SECONDS:-30}
engine_leaks=""
if [ "$ENGINE_SECONDS" -gt 0 ]; then
    cargo build --release -q -p airlock-engine --example engine_bench || exit 2
    cell_cgroups() { ls -d /sys/fs/cgroup/*/airlock/*/ /sys/fs/cgroup/airlock/*/ 2>/dev/null | sort; }
    cell_pid1s() { for c in /proc/[0-9]*/comm; do [ "$(cat "$c" 2>/dev/null)" = airlock-init ] && echo "${c%/comm}"; done | sort; }
    cgroups_pre=$(cell_cgroups)
    pid1s_pre=$(cell_pid1s)
    echo "engine: 16 threads for $ENGINE_SECONDS s"
    target/x86_64-unknown-linux-gnu/release/examples/engine_bench threads 16 "$ENGINE_SECONDS" \
        || engine_leaks="engine_bench failed"
    sleep 1
    new_cgroups=$(comm -13 <(echo "$cgroups_pre") <(cell_cgroups))
    new_pid1s=$(comm -13 <(echo "$pid1s_pre") <(cell_pid1s))
    [ -z "$new_cgroups" ] || engine_leaks="$engine_leaks cgroups: $new_cgroups"
    [ -z "$new_pid1s" ] || engine_leaks="$engine_leaks cells: $new_pid1s"
fi

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
echo "  engine phase leftovers: ${engine_leaks:-none}"

leak=0
[ "$cgroups_after" -eq 0 ] || { echo "LEAK: cgroups:"; echo "$stale"; leak=1; }
[ "$procs_after" -eq 0 ] || { echo "LEAK: processes:"; echo "$stray"; leak=1; }
[ "$mounts_after" -eq "$mounts_before" ] || { echo "LEAK: mount count changed"; leak=1; }
[ "$fds_after" -eq "$fds_before" ] || { echo "LEAK: fd count changed"; ls -l /proc/$$/fd; leak=1; }
[ -z "$engine_leaks" ] || { echo "LEAK: engine phase: $engine_leaks"; leak=1; }
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
