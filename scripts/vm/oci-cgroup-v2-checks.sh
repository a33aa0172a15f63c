#!/bin/sh
# The OCI runtime's pause/resume, update and events --stats on a pure cgroup v2 host (the
# CI machine is a v1/v2 hybrid, where cells use the v1 controllers), and a container with
# `linux.cgroupsPath` (the supervisor in the container cgroup, the cell its leaf). Runs INSIDE the VM
# of run-in-vm.sh (busybox sh), driving `airlock oci` on a busybox bundle without
# containerd, as crates/airlock/tests/oci_lifecycle.rs does:
#
#   scripts/vm/run-in-vm.sh scripts/vm/oci-cgroup-v2-checks.sh
#
# Exits 0 when every check passed, 1 otherwise.
set -u
AIRLOCK=${AIRLOCK_BIN:-airlock}
CG=/sys/fs/cgroup
failures=0
passes=0

pass() { passes=$((passes + 1)); echo "PASS: $*"; }
fail() { failures=$((failures + 1)); echo "FAIL: $*"; }

work=$(mktemp -d /tmp/oci.XXXXXX)
cd "$work" || exit 1
printf '[store]\nstate_dir = "%s/store"\n' "$work" >airlock.toml
mkdir -p contracts rootfs/bin
printf 'resources:\n  memory_mb: 128\n  process_limit: 16\n' >contracts/default.yaml
cp /bin/busybox rootfs/bin/busybox
for applet in sh sleep echo tail; do ln -s busybox "rootfs/bin/$applet"; done
cat >config.json <<'EOF'
{"ociVersion": "1.0.2",
 "process": {"user": {"uid": 0, "gid": 0}, "env": ["PATH=/bin"], "cwd": "/",
             "args": ["/bin/sh", "-c", "i=0; while true; do i=$((i+1)); echo $i; sleep 0.05; done"]},
 "root": {"path": "rootfs", "readonly": true},
 "mounts": [{"destination": "/proc", "type": "proc", "source": "proc"}],
 "linux": {"namespaces": [{"type": "pid"}, {"type": "mount"}, {"type": "ipc"},
                          {"type": "uts"}, {"type": "network"}]}}
EOF
export AIRLOCK_CONFIG="$work/airlock.toml" AIRLOCK_CONTRACTS_DIR="$work/contracts"
oci() { "$AIRLOCK" oci --root "$work/root" "$@"; }
status() { oci state c1 2>/dev/null | grep -o '"status": "[a-z]*"' | cut -d'"' -f4; }
count() { tail -n 1 out.txt 2>/dev/null; }

echo "=== host: $(uname -r), $(grep ' /sys/fs/cgroup ' /proc/mounts)"
oci create --bundle "$work" c1 >out.txt 2>err.txt </dev/null || { cat err.txt; fail "create"; }
oci start c1 || fail "start"
sleep 1
cell=$(ls -d $CG/airlock/*-*-* 2>/dev/null | head -n 1)
echo "cell cgroup: $cell"
[ -n "$cell" ] && [ "$(count)" -gt 0 ] 2>/dev/null && pass "the container runs in a v2 cell" || fail "no running cell"

echo "=== pause"
oci pause c1 && [ "$(cat "$cell/cgroup.freeze")" = 1 ] && grep -qx 'frozen 1' "$cell/cgroup.events" \
  && pass "pause: cgroup.freeze 1, cgroup.events frozen 1" || fail "pause"
[ "$(status)" = paused ] && pass "state: paused" || fail "state is $(status), not paused"
before=$(count)
sleep 1
[ "$(count)" = "$before" ] && pass "paused: the counter stays at $before" || fail "paused, the counter moved: $before -> $(count)"
oci resume c1 && [ "$(cat "$cell/cgroup.freeze")" = 0 ] || fail "resume"
sleep 1
[ "$(count)" -gt "$before" ] && [ "$(status)" = running ] && pass "resumed: running, the counter at $(count)" \
  || fail "resumed: $(status), counter $(count)"

echo "=== update"
echo '{"memory":{"limit":67108864},"pids":{"limit":8},"cpu":{"quota":50000,"period":100000}}' | oci update --resources - c1 \
  && [ "$(cat "$cell/memory.max")" = 67108864 ] && [ "$(cat "$cell/pids.max")" = 9 ] \
  && [ "$(cat "$cell/cpu.max")" = "50000 100000" ] \
  && pass "update: memory.max, pids.max and cpu.max lowered" \
  || fail "update: memory.max $(cat "$cell/memory.max"), pids.max $(cat "$cell/pids.max"), cpu.max $(cat "$cell/cpu.max")"
if echo '{"memory":{"limit":268435456}}' | oci update --resources - c1 2>update.err; then
  fail "BREACH: memory raised above the contract's ceiling"
elif grep -q 'ceiling of 134217728 bytes' update.err && [ "$(cat "$cell/memory.max")" = 67108864 ]; then
  pass "update above the ceiling: refused, memory.max unchanged"
else
  cat update.err
  fail "update above the ceiling: not refused by name"
fi

echo "=== events --stats"
oci events --stats c1 >stats.json
cat stats.json
grep -q '"type":"stats"' stats.json && grep -q '"limit":67108864' stats.json \
  && grep -q '"pids":{"current":[1-9]' stats.json && ! grep -q '"total":0,' stats.json \
  && pass "events --stats: runc's event, the lowered limit, tasks and CPU time" \
  || fail "events --stats"

echo "=== kill while paused, delete"
oci pause c1 || fail "pause again"
oci kill c1 KILL || fail "kill"
i=0
while [ "$(status)" != stopped ] && [ $i -lt 100 ]; do sleep 0.1; i=$((i + 1)); done
[ "$(status)" = stopped ] && pass "a paused container is killed" || fail "still $(status) after SIGKILL"
oci delete c1 || fail "delete"
left=$(ls -d $CG/airlock/*-*-* 2>/dev/null)
[ -z "$left" ] && pass "no cell cgroup left" || fail "cgroups left: $left"

echo "=== linux.cgroupsPath"
# A second bundle on the same root, with the cgroupsPath kubelet's cgroupfs driver gives.
C=$CG/kubepods/burstable/pod1/c2
mkdir -p b2
sed -e "s|\"path\": \"rootfs\"|\"path\": \"$work/rootfs\"|" \
    -e 's|"args": \[[^]]*\]|"args": ["/bin/sh", "-c", "tail -c 20971520 /dev/zero"]|' \
    -e 's|"linux": {|"linux": {"cgroupsPath": "/kubepods/burstable/pod1/c2", |' config.json >b2/config.json
status2() { oci state c2 2>/dev/null | grep -o '"status": "[a-z]*"' | cut -d'"' -f4; }
oci create --bundle "$work/b2" c2 >out2.txt 2>err2.txt </dev/null || { cat err2.txt; fail "create c2"; }
oci start c2 || fail "start c2"
sleep 1
sup=$(oci state c2 | grep -o '"pid": [0-9]*' | grep -o '[0-9]*')
[ "$(cat /proc/$sup/cgroup)" = "0::/kubepods/burstable/pod1/c2" ] \
  && pass "cgroupsPath: the supervisor (the shim's pid) is in the container cgroup" \
  || fail "cgroupsPath: supervisor $sup in $(cat /proc/$sup/cgroup)"
cellpids=$(cat $C/cell/cgroup.procs 2>/dev/null)
inside=1
for p in $cellpids; do grep -qx "0::/kubepods/burstable/pod1/c2/cell" /proc/$p/cgroup || inside=0; done
[ -n "$cellpids" ] && [ $inside = 1 ] && [ "$(cat $C/cgroup.procs)" = "$sup" ] \
  && pass "cgroupsPath: the payload is in the cell below it, the supervisor alone above" \
  || fail "cgroupsPath: cell $(echo $cellpids), container $(cat $C/cgroup.procs 2>/dev/null)"
grep -qw memory $CG/kubepods/burstable/pod1/cgroup.subtree_control \
  && [ -z "$(cat $C/cgroup.subtree_control)" ] \
  && [ "$(cat $C/memory.max)" = 134217728 ] && [ "$(cat $C/pids.max)" = $((17 + $(ls /proc/$sup/task | wc -l))) ] \
  && [ "$(cat $C/memory.oom.group)" = 1 ] && [ "$(cat /proc/$sup/oom_score_adj)" = -1000 ] \
  && pass "cgroupsPath: the ceilings at the container cgroup (pids 16+1+the supervisor's $(ls /proc/$sup/task | wc -l) tasks), no controllers below it, the supervisor exempt from the OOM killer" \
  || fail "cgroupsPath: supervisor tasks $(ls /proc/$sup/task | wc -l), memory.max $(cat $C/memory.max) pids.max $(cat $C/pids.max) subtree '$(cat $C/cgroup.subtree_control)' oom.group $(cat $C/memory.oom.group) adj $(cat /proc/$sup/oom_score_adj)"
i=0
while [ "$(cat $C/memory.current)" -lt 20971520 ] && [ $i -lt 50 ]; do sleep 0.1; i=$((i + 1)); done
[ "$(cat $C/memory.current)" -ge 20971520 ] \
  && pass "cgroupsPath: the container cgroup's memory.current counts the payload's 20 MiB" \
  || fail "cgroupsPath: memory.current $(cat $C/memory.current)"
oci pause c2 && [ "$(cat $C/cell/cgroup.freeze)" = 1 ] && grep -qx 'frozen 1' $C/cell/cgroup.events \
  && grep -qx 'frozen 0' $C/cgroup.events && [ "$(status2)" = paused ] \
  && pass "cgroupsPath: pause freezes the cell, not the supervisor" || fail "cgroupsPath: pause"
oci resume c2 && [ "$(cat $C/cell/cgroup.freeze)" = 0 ] || fail "cgroupsPath: resume"
echo '{"memory":{"limit":67108864},"pids":{"limit":8}}' | oci update --resources - c2 \
  && [ "$(cat $C/memory.max)" = 67108864 ] && [ "$(cat $C/pids.max)" = 17 ] \
  && pass "cgroupsPath: update writes the container cgroup (pids 8+1+8)" \
  || fail "cgroupsPath: update: memory.max $(cat $C/memory.max), pids.max $(cat $C/pids.max)"
# Below what the payload holds: v2 reclaims, then its OOM killer ends the payload.
echo '{"memory":{"limit":8388608}}' | oci update --resources - c2 || fail "cgroupsPath: lowering to 8 MiB"
i=0
while [ "$(status2)" != stopped ] && [ $i -lt 100 ]; do sleep 0.1; i=$((i + 1)); done
oom=$(grep '^oom_kill ' $C/memory.events 2>/dev/null | cut -d' ' -f2)
record=$("$AIRLOCK" runs list --state-dir "$work/store" --json --limit 1 2>&1)
echo "$record" | grep -E '"(status|limit_fired)"'
[ "$(status2)" = stopped ] && echo "$record" | grep -Eq '"status": ?"capacity_exceeded"' \
  && echo "$record" | grep -Eq '"limit_fired": ?"memory"' \
  && pass "cgroupsPath: an OOM ends the payload, the supervisor records it (capacity_exceeded, memory)" \
  || fail "cgroupsPath: OOM: status $(status2), oom_kill ${oom:-gone}"
oci delete c2 || fail "cgroupsPath: delete"
[ ! -e $CG/kubepods ] && pass "cgroupsPath: nothing airlock created is left" || fail "cgroupsPath: left: $(find $CG/kubepods -type d)"
# The pids ceiling on v2 is the container cgroup's: at START it becomes exact (16 + pid 1
# + the supervisor's tasks then), so it fires before the cell's RLIMIT_NPROC backstop
# (process_limit + 2, per its user namespace) and is recorded as the pids ceiling.
mkdir -p b4
sed -e "s|\"path\": \"rootfs\"|\"path\": \"$work/rootfs\"|" \
    -e 's|"args": \[[^]]*\]|"args": ["/bin/sh", "-c", "i=0; while [ $i -lt 60 ]; do sleep 100 \& i=$((i+1)); echo $i; done"]|' \
    -e 's|"linux": {|"linux": {"cgroupsPath": "/kubepods/burstable/pod1/c4", |' config.json >b4/config.json
oci create --bundle "$work/b4" c4 >out4.txt 2>err4.txt </dev/null || { cat err4.txt; fail "create c4"; }
oci start c4 || fail "start c4"
i=0
while [ "$(oci state c4 2>/dev/null | grep -o '"status": "[a-z]*"' | cut -d'"' -f4)" != stopped ] && [ $i -lt 100 ]; do sleep 0.1; i=$((i + 1)); done
forks=$(tail -n 1 out4.txt)
record=$("$AIRLOCK" runs list --state-dir "$work/store" --json --limit 1 2>&1)
echo "fork bomb under process_limit 16: $forks background sleeps started; $(echo "$record" | grep -E '"(status|limit_fired)"' | head -n 2 | tr -d '\n ')"
[ "$forks" = 15 ] \
  && pass "cgroupsPath: a fork bomb gets exactly the cell's pids ceiling (sh + 15 = process_limit 16)" \
  || fail "cgroupsPath: fork bomb started ${forks:-none}"
echo "$record" | grep -Eq '"status": ?"capacity_exceeded"' && echo "$record" | grep -Eq '"limit_fired": ?"pids"' \
  && pass "cgroupsPath: the fork bomb is recorded as the pids ceiling (capacity_exceeded, pids)" \
  || fail "cgroupsPath: the fork bomb is not recorded as the pids ceiling"
oci delete c4 || fail "delete c4"
mkdir -p b3
sed -e "s|\"path\": \"rootfs\"|\"path\": \"$work/rootfs\"|" \
    -e 's|"linux": {|"linux": {"cgroupsPath": "/kubepods/../../x", |' config.json >b3/config.json
if oci create --bundle "$work/b3" c3 >/dev/null 2>err3.txt </dev/null; then
  fail "BREACH: cgroupsPath with .. accepted"; oci kill c3 KILL; oci delete --force c3
elif grep -q 'linux.cgroupsPath' err3.txt && grep -q '`..`' err3.txt; then
  pass "cgroupsPath: .. refused by name"
else
  cat err3.txt; fail "cgroupsPath: .. not refused by name"
fi

echo "=== $passes passed, $failures failed"
[ $failures = 0 ]
