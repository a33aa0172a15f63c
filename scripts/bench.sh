#!/usr/bin/env bash
# airlock's benchmark: cell start-up against baselines measured in the same hyperfine run,
# egress proxy overhead, and supervisor memory. Prints medians and ratios; raw hyperfine
# JSON goes to target/bench/. Run as root on an otherwise idle machine.
#
#   scripts/bench.sh            # start-up + egress + memory
#   RUNS=1000 scripts/bench.sh  # more samples
#   DOCKER=1 scripts/bench.sh   # also docker run with the seed's hardened flags
set -euo pipefail
cd "$(dirname "$0")/.."
RUNS=${RUNS:-500}
OUT=target/bench
mkdir -p "$OUT"
command -v hyperfine >/dev/null && command -v bwrap >/dev/null || {
  apt-get update -qq && apt-get install -y -qq hyperfine bubblewrap >/dev/null
}
cargo build --release -q -p airlock
STATE=$(mktemp -d)
BIN=$(mktemp -d)
trap 'rm -rf "$STATE" "$BIN"' EXIT
# Measure an installed copy, not the linker's output: the file the linker just wrote sits
# in the page cache in small pieces, and exec'ing it costs ~0.3 ms more per run on this VM
# until its pages are evicted; a copy (as a package install or `cp` writes it) does not.
install -m 0755 target/x86_64-unknown-linux-gnu/release/airlock "$BIN/airlock"
AIRLOCK=$BIN/airlock

echo "== host"
uname -r; nproc; grep -E 'cgroup2? ' /proc/mounts | awk '{print $2, $3, $4}' | head -3
$AIRLOCK doctor | grep -E 'cgroups|landlock|seccomp'

BWRAP_SAME_ROOT=(bwrap --unshare-all --die-with-parent --ro-bind /usr /usr --symlink usr/bin /bin
  --symlink usr/lib /lib --symlink usr/lib64 /lib64 --symlink usr/sbin /sbin --dev /dev --proc /proc
  --tmpfs /tmp --cap-drop ALL /bin/true)
# The two unshare lines are floors, not sandboxes: util-linux unshare creating the bare
# namespaces (user, mount, pid, ipc, uts; then also net), forking and exec'ing.
cmds=(
  "$AIRLOCK run --state-dir $STATE -- /bin/true"
  "bwrap --unshare-all --ro-bind / / --dev /dev --proc /proc /bin/true"
  "${BWRAP_SAME_ROOT[*]}"
  "/bin/true"
  "unshare -Umpiu -f -r /bin/true"
  "unshare -Umpiun -f -r /bin/true"
)
if [ "${DOCKER:-0}" = 1 ]; then
  scripts/bench-docker-image.sh >/dev/null
  cmds+=("docker run --rm --user 1000:1000 --cap-drop=ALL --security-opt no-new-privileges --read-only --tmpfs /tmp:size=16m --memory=128m --pids-limit=64 --network=none airlock-bench:busybox /bin/true")
fi

echo "== cell start-up: $RUNS runs each, one hyperfine run"
hyperfine -N -w 30 -r "$RUNS" --export-json "$OUT/startup.json" "${cmds[@]}" >/dev/null
python3 - "$OUT/startup.json" <<'PY'
import json, sys
results = json.load(open(sys.argv[1]))["results"]
airlock = results[0]["median"]
for r in results:
    print(f"{r['median']*1000:8.2f} ms median  {r['mean']*1000:7.2f} mean  {r['max']*1000:7.2f} max  "
          f"x{r['median']/airlock:5.2f} of airlock  {r['command'][:90]}")
PY

echo "== the same commands interleaved (one of each per round; $RUNS rounds)"
# Docker is left out here: at ~250 ms a run it would dominate the rounds.
scripts/interleaved.py "$RUNS" "${cmds[@]:0:6}"

echo "== in-run milestones (airlock's own result record, median of 200 runs, ms since process start)"
for i in $(seq 1 200); do
  rm -f "$OUT/r.json"  # airlock never replaces an existing result file
  $AIRLOCK run --state-dir "$STATE" --result "$OUT/r.json" -- /bin/true
  python3 -c "import json; print(json.dumps(json.load(open('$OUT/r.json'))['timings']))"
done > "$OUT/timings.jsonl"
python3 - "$OUT/timings.jsonl" <<'PY'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
for key in ["spawned_ms", "prepared_ms", "recorded_ms", "released_ms", "startup_ms", "ended_ms", "wall_ms", "teardown_ms"]:
    print(f"{key:14} {statistics.median(r[key] for r in rows):6.2f}")
PY

echo "== start-up with a 1 GiB read-only input next to a tiny one (one hyperfine run)"
# The start records only the inputs' identity; their content is hashed while the payload
# runs and cached by file identity, so the first run of a new input waits for its hash at
# the end (reported separately), and later runs read nothing.
INPUTS=$(mktemp -d)
trap 'rm -rf "$STATE" "$BIN" "$INPUTS"' EXIT
head -c 1073741824 /dev/urandom > "$INPUTS/big.bin"
echo tiny > "$INPUTS/tiny.txt"
for size in big tiny; do
  src=$([ $size = big ] && echo big.bin || echo tiny.txt)
  printf 'filesystem:\n  readonly_inputs:\n    - source: %s\n      target: /input/%s\n' \
    "$INPUTS/$src" "$src" > "$INPUTS/$size.yaml"
done
rm -f "$OUT/big-first.json"
/usr/bin/time -f "first run with the new 1 GiB input (hashes it after the payload): %e s" \
  "$AIRLOCK" run --state-dir "$STATE" --result "$OUT/big-first.json" -c "$INPUTS/big.yaml" -- /bin/true
python3 -c "import json; r=json.load(open('$OUT/big-first.json')); print(f\"  its startup_ms {r['timings']['startup_ms']:.2f}\")"
hyperfine -N -w 20 -r "$RUNS" --export-json "$OUT/inputs.json" \
  "$AIRLOCK run --state-dir $STATE -c $INPUTS/tiny.yaml -- /bin/true" \
  "$AIRLOCK run --state-dir $STATE -c $INPUTS/big.yaml -- /bin/true" >/dev/null
python3 - "$OUT/inputs.json" <<'PY'
import json, sys
tiny, big = json.load(open(sys.argv[1]))["results"]
print(f"tiny input: {tiny['median']*1000:.2f} ms median; 1 GiB input: {big['median']*1000:.2f} ms median; "
      f"difference {(big['median']-tiny['median'])*1000:+.2f} ms")
PY

echo "== supervisor memory"
/usr/bin/time -f "airlock run -- /bin/true: max RSS %M KiB" "$AIRLOCK" run --state-dir "$STATE" -- /bin/true
/usr/bin/time -f "airlock run -- 1 GiB of stdout: max RSS %M KiB" "$AIRLOCK" run --state-dir "$STATE" -- head -c 1073741824 /dev/zero >/dev/null || true

echo "== gVisor tier: /bin/true on each tier and bare runsc run of the same bundle (one hyperfine run)"
# The baseline is airlock's own bundle: copied from a live gVisor cell (its config.json,
# root skeleton and /etc), with its writable /tmp on a tmpfs of the same kind and a cgroup
# made once, then `runsc run` (create + start + wait + delete in one process) on it. What
# airlock adds on top of runsc: the contract and plan, the store's records, the per-run
# cell directory, tmpfs, cgroup and host ids, the kill and reap of every sandbox process
# and the cleanup checks (airlock also runs one `runsc run`, with the same global flags as
# this baseline: --oci-seccomp has the Sentry apply the plan's seccomp policy).
if command -v runsc >/dev/null; then
  GV=$(mktemp -d)
  trap 'umount "$GV/w0" 2>/dev/null; rm -rf "$STATE" "$BIN" "$INPUTS" "$GV"; for h in /sys/fs/cgroup/*/airlock-bench-gvisor; do rmdir "$h" 2>/dev/null; done' EXIT
  # runsc's gofer runs as the sandbox root's host id: it must traverse the bundle's parents.
  chmod 0711 "$GV"
  printf 'isolation: gvisor\n' > "$GV/gvisor.yaml"
  "$AIRLOCK" run --state-dir "$STATE" -c "$GV/gvisor.yaml" -- /bin/sleep 4 &
  LIVE=
  for _ in $(seq 100); do LIVE=$(ls -d /run/airlock-gvisor/*/bundle/config.json 2>/dev/null | head -1 || true); [ -n "$LIVE" ] && break; sleep 0.05; done
  cp -a "$(dirname "$LIVE")" "$GV/bundle"
  wait
  mkdir -p "$GV/w0" "$GV/state"
  for h in memory pids cpu freezer; do mkdir -p /sys/fs/cgroup/$h/airlock-bench-gvisor; done
  python3 - "$GV" <<'PY'
import json, subprocess, sys
gv = sys.argv[1]
path = f"{gv}/bundle/config.json"
c = json.load(open(path))
c["root"]["path"] = f"{gv}/bundle/rootfs"
c["process"]["args"] = ["/bin/true"]
c["linux"]["cgroupsPath"] = "/airlock-bench-gvisor"
for m in c["mounts"]:
    if m["destination"] == "/tmp":
        m["source"] = f"{gv}/w0"
owner = c["linux"]["uidMappings"][1]["hostID"]
subprocess.run(["mount", "-t", "tmpfs", "-o", f"size=16m,nosuid,nodev,mode=0755,uid={owner},gid={owner}", "tmpfs", f"{gv}/w0"], check=True)
json.dump(c, open(path, "w"))
PY
  GRUNS=${GVISOR_RUNS:-60}
  hyperfine -N -w 5 -r "$GRUNS" --export-json "$OUT/gvisor.json" \
    "$AIRLOCK run --state-dir $STATE -c $GV/gvisor.yaml -- /bin/true" \
    "runsc --root=$GV/state --network=none --oci-seccomp --platform=ptrace run --bundle=$GV/bundle bench" \
    "$AIRLOCK run --state-dir $STATE -- /bin/true" >/dev/null
  python3 - "$OUT/gvisor.json" <<'PY'
import json, sys
gv, bare, native = json.load(open(sys.argv[1]))["results"]
for name, r in [("airlock run, isolation gvisor", gv), ("bare runsc run, same bundle", bare), ("airlock run, native cell", native)]:
    print(f"{r['median']*1000:8.2f} ms median  {r['mean']*1000:7.2f} mean  {name}")
print(f"airlock's overhead on runsc: x{gv['median']/bare['median']:.3f} ({(gv['median']-bare['median'])*1000:+.1f} ms); gvisor/native x{gv['median']/native['median']:.1f}")
PY
  echo "-- peak memory of one gVisor cell (the sandbox's cgroup: Sentry, gofer, stubs; /bin/true and python3 -c pass)"
  for cmd in /bin/true "python3 -c pass"; do
    rm -f "$OUT/gv.json"
    "$AIRLOCK" run --state-dir "$STATE" -c "$GV/gvisor.yaml" --result "$OUT/gv.json" -- $cmd
    python3 -c "import json; r=json.load(open('$OUT/gv.json')); print(f\"$cmd: {r['usage']['memory_peak_bytes']/2**20:.1f} MiB peak, {r['usage']['pids_peak']} host tasks at most\")"
  done
  /usr/bin/time -f "airlock run (gvisor) supervisor: max RSS %M KiB" "$AIRLOCK" run --state-dir "$STATE" -c "$GV/gvisor.yaml" -- /bin/true
else
  echo "runsc not installed: skipped (apt-get install runsc)"
fi

echo "== egress proxy (loopback)"
cargo run -q --release -p airlock-egress --example egress_bench

echo "== secret injection (plain HTTP through the proxy, with and without a swapped placeholder)"
# What injection adds to a forwarded plain-HTTP request, one connection per request,
# interleaved.
cargo run -q --release -p airlock-egress --example secrets_bench

echo "== TLS interception (HTTPS through a CONNECT tunnel: intercepted vs tunnelled)"
# One connection and full handshake per request, to a local rustls upstream; the
# intercepted host has an HTTP rule (terminated with the run CA's leaf, checked,
# re-encrypted and verified), the other is only tunnelled; interleaved, medians.
cargo run -q --release -p airlock-egress --example tls_bench -- "${TLS_RUNS:-500}"

echo "== engine (one process, cells through the cell factory)"
# Claim-to-exec and request-to-exit of /bin/true from a warm pool, one claim at a time,
# then ENGINE_THREADS threads driving runs for ENGINE_SECONDS; the same number of bwrap
# loops in parallel for the same time is the baseline (runs per second).
ENGINE_THREADS=${ENGINE_THREADS:-16}
ENGINE_SECONDS=${ENGINE_SECONDS:-30}
cargo build -q --release -p airlock-engine --example engine_bench
ENGINE_BENCH=$BIN/engine_bench
install -m 0755 target/x86_64-unknown-linux-gnu/release/examples/engine_bench "$ENGINE_BENCH"
"$ENGINE_BENCH" claim "${ENGINE_CLAIMS:-300}"
"$ENGINE_BENCH" threads "$ENGINE_THREADS" "$ENGINE_SECONDS"
python3 - "$ENGINE_THREADS" "$ENGINE_SECONDS" <<'PY'
import subprocess, sys, threading, time
threads, seconds = int(sys.argv[1]), float(sys.argv[2])
argv = ["bwrap", "--unshare-all", "--ro-bind", "/", "/", "--dev", "/dev", "--proc", "/proc", "/bin/true"]
until = time.monotonic() + seconds
latencies = []
lock = threading.Lock()
def loop():
    mine = []
    while time.monotonic() < until:
        t = time.monotonic()
        subprocess.run(argv, check=True)
        mine.append((time.monotonic() - t) * 1000)
    with lock:
        latencies.extend(mine)
started = time.monotonic()
workers = [threading.Thread(target=loop) for _ in range(threads)]
for w in workers: w.start()
for w in workers: w.join()
elapsed = time.monotonic() - started
latencies.sort()
p = lambda q: latencies[round((len(latencies) - 1) * q)]
print(f'{{"baseline": "{threads} bwrap loops", "runs": {len(latencies)}, "runs_per_second": {len(latencies)/elapsed:.1f}, "p50_ms": {p(0.5):.2f}, "p99_ms": {p(0.99):.2f}}}')
PY

echo "== airlock run handed to a running service (warm cells)"
# The engine example hosts crates/engine/src/handoff.rs's serve_connection on a socket with
# a warm pool of the default contract's shape (as airlock serve routes hand-off clients);
# the client is the installed airlock binary. Same hyperfine run: bwrap, bare /bin/true,
# and the client's own start (`airlock run` with no command: a usage error, exit 2, before
# any connection) as the floor of the client's cost.
cargo build -q --release -p airlock-engine --example handoff_host
install -m 0755 target/x86_64-unknown-linux-gnu/release/examples/handoff_host "$BIN/handoff_host"
HANDOFF_STATE=$(mktemp -d)
HANDOFF_SOCKET=$HANDOFF_STATE/airlock.sock
"$BIN/handoff_host" "$HANDOFF_SOCKET" "$HANDOFF_STATE" "${HANDOFF_WARM:-4}" > "$HANDOFF_STATE/ready" &
HANDOFF_PID=$!
for _ in $(seq 600); do grep -q ready "$HANDOFF_STATE/ready" 2>/dev/null && break; sleep 0.1; done
AIRLOCK_SOCKET=$HANDOFF_SOCKET "$AIRLOCK" run -v -- /bin/true 2>&1 | grep -q "handed to the service" || {
  echo "the run was not handed to the service"; kill "$HANDOFF_PID"; exit 1; }
# --prepare: the pool refills one cell at a time after each claim; back-to-back runs would
# measure cells built on demand instead of warm ones.
AIRLOCK_SOCKET=$HANDOFF_SOCKET hyperfine -N -w 10 -r "$RUNS" -i --prepare "sleep 0.05" \
  --export-json "$OUT/handoff.json" \
  "$AIRLOCK run -- /bin/true" \
  "bwrap --unshare-all --ro-bind / / --dev /dev --proc /proc /bin/true" \
  "/bin/true" \
  "$AIRLOCK run" >/dev/null
kill "$HANDOFF_PID"; wait "$HANDOFF_PID" 2>/dev/null || true
rm -rf "$HANDOFF_STATE"
python3 - "$OUT/handoff.json" <<'PY'
import json, sys
results = json.load(open(sys.argv[1]))["results"]
handed, bwrap = results[0]["median"], results[1]["median"]
names = ["airlock run -- /bin/true (handed off)", "bwrap --unshare-all ... /bin/true", "/bin/true", "airlock run (client start only, usage error)"]
for name, r in zip(names, results):
    print(f"{r['median']*1000:8.3f} ms median  x{r['median']/bwrap:5.2f} of bwrap  {name}")
print(f"target: handed-off median <= 1.0 ms and <= 0.35x bwrap: {handed*1000:.3f} ms, {handed/bwrap:.2f}x")
PY
echo "== service (airlock serve over its unix socket)"
# SERVICE_CLIENTS clients for SERVICE_SECONDS running /bin/true through
# POST /v1/runs?wait=true (crates/server/examples/load.rs) against a pool of 16, then the
# same number of bwrap loops in parallel for the same time; and the service's RSS idle
# with a pool of 8 (the service process; its factory is a process of its own).
SERVICE_CLIENTS=${SERVICE_CLIENTS:-16}
SERVICE_SECONDS=${SERVICE_SECONDS:-20}
cargo build -q --release -p airlock-server --example load
install -m 0755 target/x86_64-unknown-linux-gnu/release/examples/load "$BIN/load"
SERVICE_DIR=$(mktemp -d)
cp examples/contracts/default.yaml "$SERVICE_DIR/small.yaml"
# A contract whose output ceiling lets 1 GiB through, for the streaming measurement.
sed 's/output_bytes: .*/output_bytes: 1073741824/' examples/contracts/default.yaml > "$SERVICE_DIR/stream.yaml"
start_service() { # POOL
  printf '[server]\nlisten = ["unix:%s/airlock.sock"]\nmax_stream_bytes = 2147483648\n[server.contracts]\nsmall = "small.yaml"\nstream = "stream.yaml"\n[server.pools]\nsmall = %s\n' \
    "$SERVICE_DIR" "$1" > "$SERVICE_DIR/airlock.toml"
  $AIRLOCK serve --config "$SERVICE_DIR/airlock.toml" --state-dir "$SERVICE_DIR/state" 2>"$SERVICE_DIR/serve.log" &
  SERVICE_PID=$!
  until curl -sf --unix-socket "$SERVICE_DIR/airlock.sock" http://airlock/readyz >/dev/null; do sleep 0.2; done
}
stop_service() { kill -TERM "$SERVICE_PID"; wait "$SERVICE_PID" || true; }
start_service 8
sleep 2
echo "service idle RSS, pool of 8: $(awk '/VmRSS/ {print $2, $3}' /proc/$SERVICE_PID/status)"
# 1 GiB of stdout through a session command, streamed to a client (curl, to /dev/null):
# the service's peak RSS over its whole life (VmHWM) after it, and the bytes the client got.
SESSION=$(curl -sf --unix-socket "$SERVICE_DIR/airlock.sock" -H 'content-type: application/json' \
  -d '{"contract": "stream"}' http://airlock/v1/sessions | python3 -c 'import json,sys; print(json.load(sys.stdin)["session_id"])')
STREAMED=$(curl -sfN --unix-socket "$SERVICE_DIR/airlock.sock" -H 'content-type: application/json' \
  -d '{"argv": ["sh", "-c", "yes | head -c 1073741824"]}' "http://airlock/v1/sessions/$SESSION/exec" |
  python3 -c '
import json, sys
data = 0
for line in sys.stdin:
    frame = json.loads(line)
    if frame["type"] == "stdout":
        data += len(frame["data"])
    elif frame["type"] == "exit":
        print(data, frame["dropped_bytes"], frame["status"])
')
curl -sf -X DELETE --unix-socket "$SERVICE_DIR/airlock.sock" "http://airlock/v1/sessions/$SESSION" >/dev/null
echo "service streaming 1 GiB through a session command: peak RSS $(awk '/VmHWM/ {print $2, $3}' /proc/$SERVICE_PID/status); client got, dropped, status: $STREAMED"
stop_service
start_service 16
"$BIN/load" "$SERVICE_DIR/airlock.sock" "$SERVICE_CLIENTS" "$SERVICE_SECONDS" small
stop_service
python3 - "$SERVICE_CLIENTS" "$SERVICE_SECONDS" <<'PY'
import subprocess, sys, threading, time
threads, seconds = int(sys.argv[1]), float(sys.argv[2])
argv = ["bwrap", "--unshare-all", "--ro-bind", "/", "/", "--dev", "/dev", "--proc", "/proc", "/bin/true"]
until = time.monotonic() + seconds
count = [0]
lock = threading.Lock()
def loop():
    n = 0
    while time.monotonic() < until:
        subprocess.run(argv, check=True)
        n += 1
    with lock:
        count[0] += n
started = time.monotonic()
workers = [threading.Thread(target=loop) for _ in range(threads)]
for w in workers: w.start()
for w in workers: w.join()
print(f"baseline: {threads} bwrap loops x {seconds:.0f} s: {count[0] / (time.monotonic() - started):.1f} runs/s")
PY
rm -rf "$SERVICE_DIR"

echo "== containers through containerd: runc and airlock-runc (one hyperfine run)"
AIRLOCK=$AIRLOCK RUNS=$((RUNS / 5)) scripts/bench-containerd.sh

echo "== images"
AIRLOCK=$AIRLOCK scripts/bench-images.sh
AIRLOCK=$AIRLOCK RUNS=$RUNS scripts/bench-image-root.sh

echo "== airlock verify (the whole suite: 16 checks, 17 cells; docs/verify.md)"
AIRLOCK_SOCKET= hyperfine -N -r 5 -w 1 --export-json "$OUT/verify.json" \
  "$AIRLOCK verify --state-dir $STATE --smoke true" >/dev/null
python3 - "$OUT/verify.json" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))["results"][0]
print(f"{r['median']:6.2f} s median  {r['min']:6.2f} min  {r['max']:6.2f} max  airlock verify --smoke true")
PY
