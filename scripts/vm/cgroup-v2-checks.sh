#!/bin/sh
# Checks airlock's cells on a pure cgroup v2 host. Runs INSIDE the VM of run-in-vm.sh
# (busybox sh, static payload `vmprobe` from scripts/vm/payloads in /usr/local/bin):
#
#   scripts/vm/run-in-vm.sh scripts/vm/cgroup-v2-checks.sh
#
# Exits 0 when every check passed, 1 otherwise; prints each result JSON it judged.
set -u
AIRLOCK=${AIRLOCK_BIN:-airlock}
CG=/sys/fs/cgroup
failures=0
passes=0

pass() { passes=$((passes + 1)); echo "PASS: $*"; }
fail() { failures=$((failures + 1)); echo "FAIL: $*"; }

# field FILE KEY VALUE: the (pretty-printed) result JSON has "KEY": VALUE.
field() { grep -q "^  \"$2\": $3,\{0,1\}\$" "$1"; }

work=$(mktemp -d /tmp/checks.XXXXXX)
cd "$work" || exit 1

# run NAME CONTRACT_YAML ARGV...: runs a cell with the contract (as $AS, a command prefix:
# empty for root), saves the exit code in $rc and the result in ./NAME.json, and prints
# both.
AS=
run() {
  name=$1 contract=$2
  shift 2
  printf '%s' "$contract" >"$name.yaml"
  $AS "$AIRLOCK" run --state-dir "$PWD/state" --contract "$name.yaml" --result "$name.json" -- "$@" >"$name.out" 2>&1
  rc=$?
  echo "--- $name: airlock run -- $* => exit $rc"
  sed 's/^/    /' "$name.out"
  # The plan is long and says nothing about the outcome: print the rest.
  sed '/^  "plan": {/,/^  },/d' "$name.json" 2>/dev/null | sed 's/^/    /'
}

# expect NAME EXIT STATUS LIMIT: judge the last run.
expect() {
  name=$1 want_rc=$2 want_status=$3 want_limit=$4
  ok=1
  [ "$rc" = "$want_rc" ] || { ok=0; echo "    exit $rc, want $want_rc"; }
  field "$name.json" status "\"$want_status\"" || { ok=0; echo "    status is not $want_status"; }
  field "$name.json" limit_fired "$want_limit" || { ok=0; echo "    limit_fired is not $want_limit"; }
  field "$name.json" cgroup_version '"v2"' || { ok=0; echo "    cgroup_version is not v2"; }
  field "$name.json" exit_code "$want_rc" || { ok=0; echo "    exit_code in the result is not $want_rc"; }
  if [ $ok = 1 ]; then pass "$name: exit $want_rc, $want_status, limit_fired $want_limit"; else fail "$name"; fi
}

echo "=== host: $(uname -r), $(grep ' /sys/fs/cgroup ' /proc/mounts)"
controllers=$(cat $CG/cgroup.controllers 2>/dev/null)
echo "cgroup.controllers: $controllers"
missing=
for c in memory pids cpu; do
  case " $controllers " in *" $c "*) ;; *) missing="$missing $c" ;; esac
done
if [ -z "$missing" ] && ! grep -q ' cgroup ' /proc/mounts; then
  pass "pure cgroup v2 with memory, pids and cpu"
else
  fail "not a pure cgroup v2 host (missing:$missing; v1 mounts: $(grep -c ' cgroup ' /proc/mounts))"
fi

echo "=== airlock doctor"
"$AIRLOCK" doctor >doctor.out 2>&1
doctor_rc=$?
cat doctor.out
if [ $doctor_rc = 0 ] && grep -Eq '^ok +cgroups +v2 ' doctor.out; then
  pass "doctor: every check ok, cgroups v2"
else
  fail "doctor (exit $doctor_rc) does not report ok cgroups v2"
fi

echo "=== plain run"
run true 'resources:
  wall_time_seconds: 30
' /bin/true
expect true 0 ok null

echo "=== the cell sees its own limits under /sys/fs/cgroup (read-only)"
run cgview 'resources:
  cpu_millis: 250
  memory_mb: 48
  process_limit: 12
  wall_time_seconds: 30
' /bin/cat /sys/fs/cgroup/memory.max /sys/fs/cgroup/cpu.max /sys/fs/cgroup/pids.max
# pids.max is process_limit + 1: airlock's own pid 1 is not the payload's.
if [ "$rc" = 0 ] && grep -qx 50331648 cgview.out && grep -qx '25000 100000' cgview.out &&
  grep -qx 13 cgview.out; then
  pass "cgroup view: memory.max, cpu.max and pids.max of the cell's own cgroup"
else
  fail "cgroup view (see above)"
fi

echo "=== memory ceiling: 32 MiB, the payload touches 100 MiB"
run memory 'resources:
  memory_mb: 32
  wall_time_seconds: 60
' /usr/local/bin/vmprobe alloc 100
expect memory 137 capacity_exceeded '"memory"'
grep -Eq '"oom_kills": [1-9]' memory.json && pass "memory: oom_kills counted from memory.events" ||
  fail "memory: no oom_kills in usage"

echo "=== process ceiling: 8 processes, the payload forks 64"
run pids 'resources:
  process_limit: 8
  wall_time_seconds: 60
' /usr/local/bin/vmprobe forks 64
expect pids 137 capacity_exceeded '"pids"'

echo "=== cpu quota and wall time: 250 millicores, a busy loop, 4 s deadline"
run_bg_contract='resources:
  cpu_millis: 250
  memory_mb: 48
  process_limit: 12
  wall_time_seconds: 4
'
# Read the live cell's cgroup while it spins, then judge the deadline.
(sleep 2.5
  for d in $CG/airlock/*/; do
    [ -d "$d" ] || continue
    echo "cell cgroup $d"
    for f in memory.max memory.swap.max memory.oom.group pids.max cpu.max cgroup.procs; do
      printf '  %s: %s\n' "$f" "$(tr '\n' ' ' <"$d$f")"
    done
    printf '  cpu.stat: %s\n' "$(tr '\n' ' ' <"${d}cpu.stat")"
  done >live.txt 2>&1) &
run walltime "$run_bg_contract" /usr/local/bin/vmprobe spin
wait
cat live.txt
expect walltime 124 capacity_exceeded '"wall_time"'
if grep -q '^  memory.max: 50331648 $' live.txt &&
  grep -q '^  memory.swap.max: 0 $' live.txt &&
  grep -q '^  memory.oom.group: 1 $' live.txt &&
  grep -q '^  pids.max: 13 $' live.txt && # process_limit 12 + airlock's pid 1
  grep -q '^  cpu.max: 25000 100000 $' live.txt &&
  grep -Eq '^  cgroup.procs: [0-9]' live.txt; then
  pass "live cell cgroup has the contract's limits"
else
  fail "live cell cgroup limits (see above)"
fi
if grep -Eq 'nr_throttled [1-9]' live.txt; then
  pass "cpu.max throttled the busy loop"
else
  fail "cpu.max did not throttle the busy loop"
fi

echo "=== cleanup"
left=$(find $CG/airlock -mindepth 1 -type d 2>/dev/null)
if [ -z "$left" ]; then
  pass "no cell cgroup left under $CG/airlock"
else
  fail "cell cgroups left behind: $left"
fi

# --- An ordinary user (uid 1001) with a delegated cgroup: as an operator delegates one
# (docs/architecture.md, "Running as an ordinary user"), it is chowned to the user and
# the user's shell is started in it; airlock moves itself into the leaf
# airlock-supervisor, enables the controllers and puts its cells beside it.
echo "=== uid 1001 with a delegated cgroup v2 subtree"
D=$CG/deleg-1001
mkdir "$D"
chown 1001:1001 "$D" "$D/cgroup.procs" "$D/cgroup.subtree_control" "$D/cgroup.threads"
udir=$(mktemp -d /tmp/user1001.XXXXXX)
chown 1001:1001 "$udir"
cd "$udir" || exit 1
# Once a run enabled the controllers, the delegated cgroup takes no process (no internal
# processes): a new shell of the user starts in its leaf instead, as the first one's
# children do.
as_delegated_user() {
  sh -c '{ echo $$ >"$0/cgroup.procs" || echo $$ >"$0/airlock-supervisor/cgroup.procs"; } 2>/dev/null &&
    exec vmprobe asuser 1001 1001 "$@"' "$D" "$@"
}
AS=as_delegated_user
$AS "$AIRLOCK" doctor >doctor-user.out 2>&1
doctor_rc=$?
cat doctor-user.out
if [ $doctor_rc = 0 ] && grep -Eq "^ok +cgroups +v2 at $CG, delegated: cells under $D " doctor-user.out; then
  pass "doctor as uid 1001: every check ok, cells under the delegated $D"
else
  fail "doctor as uid 1001 (exit $doctor_rc) does not report the delegated cgroup"
fi
run user-memory 'resources:
  memory_mb: 32
  wall_time_seconds: 60
' /usr/local/bin/vmprobe alloc 100
expect user-memory 137 capacity_exceeded '"memory"'
run user-pids 'resources:
  process_limit: 8
  wall_time_seconds: 60
' /usr/local/bin/vmprobe forks 64
expect user-pids 137 capacity_exceeded '"pids"'
(sleep 2.5
  for d in "$D"/*/; do
    case "$d" in */airlock-supervisor/) continue ;; esac
    echo "cell cgroup $d"
    printf '  cpu.max: %s\n' "$(cat "${d}cpu.max")"
    printf '  cpu.stat: %s\n' "$(tr '\n' ' ' <"${d}cpu.stat")"
  done >user-live.txt 2>&1) &
run user-walltime "$run_bg_contract" /usr/local/bin/vmprobe spin
wait
cat user-live.txt
expect user-walltime 124 capacity_exceeded '"wall_time"'
if grep -q '^  cpu.max: 25000 100000$' user-live.txt && grep -Eq 'nr_throttled [1-9]' user-live.txt; then
  pass "uid 1001: the cell's cpu.max throttled the busy loop"
else
  fail "uid 1001: cpu.max of the cell (see above)"
fi
left=$(find "$D" -mindepth 1 -type d ! -name airlock-supervisor)
if [ -z "$left" ] && [ "$(cat "$D/airlock-supervisor/cgroup.procs")" = "" ]; then
  pass "uid 1001: no cell cgroup and no process left under $D (only the empty leaf airlock-supervisor)"
else
  fail "uid 1001: left under $D: $left $(cat "$D/airlock-supervisor/cgroup.procs")"
fi

echo "=== uid 1002 without a delegated cgroup"
udir=$(mktemp -d /tmp/user1002.XXXXXX)
chown 1002:1002 "$udir"
cd "$udir" || exit 1
AS="vmprobe asuser 1002 1002"
$AS "$AIRLOCK" doctor >doctor-plain.out 2>&1
doctor_rc=$?
cat doctor-plain.out
fix='chown 1002 $D $D/cgroup.procs $D/cgroup.subtree_control $D/cgroup.threads'
if [ $doctor_rc = 1 ] && grep -q '^FAIL cgroups .*cgroups.delegation' doctor-plain.out && grep -qF "$fix" doctor-plain.out; then
  pass "doctor as uid 1002: FAIL cgroups, naming the delegation"
else
  fail "doctor as uid 1002 (exit $doctor_rc) does not name the missing delegation"
fi
run plain 'resources:
  wall_time_seconds: 30
' /bin/true
if [ "$rc" = 125 ] && field plain.json status '"sandbox_unavailable"' && grep -q 'cgroups.delegation' plain.out && grep -qF "$fix" plain.out; then
  pass "run as uid 1002: refused, exit 125, sandbox_unavailable, naming the same delegation"
else
  fail "run as uid 1002 was not refused as documented"
fi
AS=
cd "$work" || exit 1

# --- User namespaces switched off (user.max_user_namespaces=0, the guest's own): doctor
# and run name the same control and fix. Last: nothing after this can build a cell.
echo "=== user.max_user_namespaces=0"
echo 0 >/proc/sys/user/max_user_namespaces
"$AIRLOCK" doctor >doctor-userns.out 2>&1
doctor_rc=$?
cat doctor-userns.out
fix='sysctl -w user.max_user_namespaces='
if [ $doctor_rc = 1 ] && grep -q '^FAIL namespace.user .*max_user_namespaces is 0' doctor-userns.out && grep -qF "$fix" doctor-userns.out; then
  pass "doctor: FAIL namespace.user, naming the sysctl"
else
  fail "doctor (exit $doctor_rc) does not name user.max_user_namespaces"
fi
run userns 'resources:
  wall_time_seconds: 30
' /bin/true
if [ "$rc" = 125 ] && field userns.json status '"sandbox_unavailable"' && grep -q 'namespace.user cannot be enforced' userns.out && grep -qF "$fix" userns.out; then
  pass "run: refused, exit 125, sandbox_unavailable, naming namespace.user and the sysctl"
else
  fail "run with user.max_user_namespaces=0 was not refused as documented"
fi

echo "=== cgroup v2 checks: $passes passed, $failures failed"
[ $failures = 0 ]
