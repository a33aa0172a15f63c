#!/usr/bin/env bash
# Container start through containerd (called by scripts/bench.sh, or alone): `ctr run --rm`
# of /bin/true in a busybox-static image, through containerd's runc shim with runc and with
# airlock as the OCI runtime (airlock-runc: a cell, its contract, a begin and a final
# record), interleaved in one hyperfine run against a containerd of this script's own.
# Run as root.
#   AIRLOCK=path/to/airlock RUNS=100 scripts/bench-containerd.sh
set -euo pipefail
cd "$(dirname "$0")/.."
RUNS=${RUNS:-100}
OUT=target/bench
mkdir -p "$OUT"
command -v containerd >/dev/null && command -v runc >/dev/null && [ -x /usr/bin/busybox ] || {
  apt-get update -qq && apt-get install -y -qq containerd runc busybox-static >/dev/null
}
if [ -z "${AIRLOCK:-}" ]; then
  cargo build --release -q -p airlock
  AIRLOCK=target/x86_64-unknown-linux-gnu/release/airlock
fi
cargo build -q -p airlock-images --example make-layout
MAKE=target/x86_64-unknown-linux-gnu/debug/examples/make-layout
# Under target/ (not /tmp, which may be a tmpfs or overlayfs: the snapshots are overlayfs).
W=$(mktemp -d -p "$PWD/target"); CD_PID=
trap '[ -n "$CD_PID" ] && kill $CD_PID && wait $CD_PID; umount -R "$W" 2>/dev/null; rm -rf "$W"' EXIT
mkdir -p "$W/bin" "$W/tree/bin" "$W/tree/tmp" "$W/contracts"
install -m 0755 "$AIRLOCK" "$W/bin/airlock"
ln -s airlock "$W/bin/airlock-runc"
cp /usr/bin/busybox "$W/tree/bin/"; ln -s busybox "$W/tree/bin/sh"; ln -s busybox "$W/tree/bin/true"
cat > "$W/config.toml" <<TOML
version = 2
root = "$W/root"
state = "$W/state"
disabled_plugins = ["io.containerd.grpc.v1.cri"]
[grpc]
  address = "$W/c.sock"
TOML
printf '[store]\nstate_dir = "%s/store"\n' "$W" > "$W/airlock.toml"
AIRLOCK_CONFIG=$W/airlock.toml AIRLOCK_CONTRACTS_DIR=$W/contracts \
  containerd --config "$W/config.toml" >"$W/containerd.log" 2>&1 &
CD_PID=$!
CTR="ctr --address $W/c.sock -n airlock-bench"
for _ in $(seq 100); do $CTR version >/dev/null 2>&1 && break; sleep 0.1; done
"$MAKE" "$W/layout" --name airlock.bench/busybox:1 --cmd /bin/true "$W/tree" >/dev/null
(cd "$W/layout" && tar cf "$W/image.tar" .)
$CTR images import "$W/image.tar" >/dev/null
run() { echo "$CTR run --rm --runtime io.containerd.runc.v2 --runc-binary $1 airlock.bench/busybox:1 $2 /bin/true"; }
hyperfine -N -w 3 -r "$RUNS" --export-json "$OUT/containerd.json" \
  "$(run /usr/sbin/runc bench-runc)" "$(run "$W/bin/airlock-runc" bench-airlock)" >/dev/null
python3 - "$OUT/containerd.json" <<'PY'
import json, sys
runc, airlock = json.load(open(sys.argv[1]))["results"]
for name, r in [("ctr run --rm, runc", runc), ("ctr run --rm, airlock-runc", airlock)]:
    print(f"{r['median']*1000:8.1f} ms median  {r['min']*1000:8.1f} min  {name}")
print(f"airlock over runc through containerd: x{airlock['median']/runc['median']:.2f} "
      f"({(airlock['median']-runc['median'])*1000:+.1f} ms)")
PY
echo "records written by airlock-runc: $("$W/bin/airlock" runs --state-dir "$W/store" list --limit 100000 --json | python3 -c 'import json,sys; print(len(json.load(sys.stdin)))')"
