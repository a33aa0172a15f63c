#!/bin/sh
# The OCI runtime's pause/resume, update and events --stats on a pure cgroup v2 host (the
# CI machine is a v1/v2 hybrid, where cells use the v1 controllers). Runs INSIDE the VM
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
for applet in sh sleep echo; do ln -s busybox "rootfs/bin/$applet"; done
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

echo "=== $passes passed, $failures failed"
[ $failures = 0 ]
