#!/usr/bin/env bash
# Per-command latency of a gVisor session against a one-shot gVisor run (issue 21), in
# one hyperfine run: a session command through `airlock serve`'s HTTP API (curl over the
# unix socket: the records, `runsc exec` of the launcher, the command), bare `runsc exec`
# of the same process spec without the launcher into the same sandbox, a one-shot
# `airlock run` with `isolation: gvisor`, and a native one for scale; then a run that
# claims a warm pool's parked gVisor cell through the service. `/bin/true`. Root.
#   AIRLOCK=path/to/airlock RUNS=40 scripts/bench-gvisor-session.sh
set -euo pipefail
if [ -z "${AIRLOCK:-}" ]; then
  cd "$(dirname "$0")/.."
  cargo build --release -q -p airlock
  AIRLOCK=$PWD/target/x86_64-unknown-linux-gnu/release/airlock
fi
RUNS=${RUNS:-30}
W=$(mktemp -d /tmp/gvbench.XXXX)
KEY=bench-key
printf 'isolation: gvisor\n' > $W/gv.yaml
cat > $W/airlock.toml <<T
[server]
listen = ["unix:$W/airlock.sock"]
[server.contracts]
gv = "gv.yaml"
[server.tenants.bench]
api_key_sha256 = ["$(printf $KEY | sha256sum | cut -d' ' -f1)"]
runs_per_minute = 100000
[server.pools]
gv = 1
T
$AIRLOCK serve --config $W/airlock.toml --state-dir $W/state > $W/serve.log 2>&1 &
SERVER=$!
trap 'kill $SERVER; wait $SERVER 2>/dev/null; rm -rf $W' EXIT
for _ in $(seq 100); do curl -sf --unix-socket $W/airlock.sock http://a/healthz >/dev/null && break; sleep 0.1; done
A="Authorization: Bearer $KEY"; J="Content-Type: application/json"
READY="sh -c 'until curl -s --unix-socket $W/airlock.sock http://a/metrics | grep -q \"^airlock_pool_free{pool=.gv.} 1\"; do sleep 0.05; done'"
sh -c "$READY"
BEFORE=$(ls /run/airlock-gvisor)
S=$(curl -sS --unix-socket $W/airlock.sock -H "$A" -H "$J" -X POST http://a/v1/sessions -d '{"contract":"gv"}' | python3 -c 'import json,sys; print(json.load(sys.stdin)["session_id"])')
curl -sS --unix-socket $W/airlock.sock -H "$A" -H "$J" -X POST http://a/v1/sessions/$S/exec -d '{"argv":["/bin/true"]}' > /dev/null
ID=$(ls /run/airlock-gvisor | grep -vxF "$BEFORE")
CELL=/run/airlock-gvisor/$ID
# The first payload's process spec (the holder's: user, capabilities, rlimits, env) with
# /bin/true: what a command's spec is, without airlock's launcher.
python3 - $CELL/bundle/config.json $W/bare.json <<'P'
import json,sys
p=json.load(open(sys.argv[1]))["process"]; p["args"]=["/bin/true"]; json.dump(p,open(sys.argv[2],"w"))
P
RUNSC="runsc --root=$CELL/state --network=none --oci-seccomp --platform=ptrace --log=$W/runsc.log"
hyperfine -N -w 3 -r $RUNS --export-json $W/h.json \
  -n "session command (HTTP exec, runsc exec + launcher)" "curl -sS -o /dev/null --unix-socket $W/airlock.sock -H '$A' -H '$J' -X POST http://a/v1/sessions/$S/exec -d '{\"argv\":[\"/bin/true\"]}'" \
  -n "bare runsc exec, same sandbox and spec, no launcher" "$RUNSC exec --process $W/bare.json $ID" \
  -n "one-shot airlock run (gvisor)" "$AIRLOCK run --state-dir $W/state -c $W/gv.yaml -- /bin/true" \
  -n "one-shot airlock run (native)" "$AIRLOCK run --state-dir $W/state -- /bin/true"
python3 - $W/h.json <<'P'
import json,sys
rs=json.load(open(sys.argv[1]))["results"]
base=rs[2]["median"]
for r in rs: print(f'{r["command"][:60]:60s} median {r["median"]*1000:7.1f} ms  x{r["median"]/base:.3f} of one-shot gvisor')
P
curl -sS --unix-socket $W/airlock.sock -H "$A" -X DELETE http://a/v1/sessions/$S > /dev/null
# A warm pool's parked sandbox claimed by a run through the service, each run with a
# parked cell ready (--prepare waits for the pool's refill, which is not timed), against
# the same run with no parked cell (the pool emptied by a run that is not waited for).
hyperfine -N -w 2 -r $RUNS --export-json $W/warm.json --prepare "$READY" \
  -n "service run, warm gVisor cell (claimed)" "curl -sS -o /dev/null --unix-socket $W/airlock.sock -H '$A' -H '$J' -X POST 'http://a/v1/runs?wait=true' -d '{\"contract\":\"gv\",\"argv\":[\"/bin/true\"]}'" \
  -n "one-shot airlock run (gvisor), same interleaving" "$AIRLOCK run --state-dir $W/state -c $W/gv.yaml -- /bin/true"
python3 - $W/warm.json <<'P'
import json,sys
rs=json.load(open(sys.argv[1]))["results"]
base=rs[1]["median"]
for r in rs: print(f'{r["command"][:60]:60s} median {r["median"]*1000:7.1f} ms  x{r["median"]/base:.3f} of one-shot gvisor')
P
