#!/bin/sh
# Checks that airlock refuses, in `doctor` and in `run` alike, on a kernel booted without
# Landlock. Runs INSIDE the VM of run-in-vm.sh, booted with an lsm= list lacking landlock:
#
#   AIRLOCK_VM_LSM=lockdown,yama,integrity,apparmor scripts/vm/run-in-vm.sh scripts/vm/no-landlock-checks.sh
#
# Exits 0 when every check passed, 1 otherwise.
set -u
AIRLOCK=${AIRLOCK_BIN:-airlock}
failures=0
passes=0
pass() { passes=$((passes + 1)); echo "PASS: $*"; }
fail() { failures=$((failures + 1)); echo "FAIL: $*"; }

work=$(mktemp -d /tmp/checks.XXXXXX)
cd "$work" || exit 1
echo "=== lsm: $(cat /sys/kernel/security/lsm 2>/dev/null || echo '(securityfs not mounted)'); cmdline: $(cat /proc/cmdline)"
case ",$(cat /sys/kernel/security/lsm 2>/dev/null)," in
  *,landlock,*) fail "the guest kernel runs Landlock: nothing to check" ;;
  *) pass "the guest kernel runs without Landlock" ;;
esac

# The fix both must name: landlock in the kernel's lsm= list.
fix='lsm=landlock'
"$AIRLOCK" doctor >doctor.out 2>&1
doctor_rc=$?
cat doctor.out
if [ $doctor_rc = 1 ] && grep -q '^FAIL landlock .*Landlock is not enabled' doctor.out && grep -qF "$fix" doctor.out; then
  pass "doctor: FAIL landlock, naming the lsm= list, exit 1"
else
  fail "doctor (exit $doctor_rc) does not name the missing Landlock and its fix"
fi

printf 'resources:\n  wall_time_seconds: 30\n' >c.yaml
"$AIRLOCK" run --contract c.yaml --result r.json -- /bin/true >run.out 2>&1
rc=$?
cat run.out
sed 's/^/    /' r.json 2>/dev/null | grep -v '^    *"plan"' | head -20
if [ $rc = 125 ] && grep -q '^  "status": "sandbox_unavailable",$' r.json &&
  grep -q 'landlock cannot be enforced on this host: Landlock is not enabled' run.out && grep -qF "$fix" run.out; then
  pass "run: refused, exit 125, sandbox_unavailable, naming landlock and the same fix"
else
  fail "run (exit $rc) was not refused as documented"
fi

echo "=== no-landlock checks: $passes passed, $failures failed"
[ $failures = 0 ]
