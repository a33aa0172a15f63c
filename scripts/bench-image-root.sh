#!/usr/bin/env bash
# Cell start-up with an OCI image root against `image: host`, in the same hyperfine run
# (called by scripts/bench.sh, or alone; run as root). The images are the test images of
# scripts/test-images.sh (distroless: a static binary; python: the host's python3), imported
# into a fresh state directory, so they are unpacked before the first timed run.
#   AIRLOCK=path/to/airlock RUNS=300 scripts/bench-image-root.sh
set -euo pipefail
cd "$(dirname "$0")/.."
RUNS=${RUNS:-300}
OUT=target/bench
mkdir -p "$OUT"
if [ -z "${AIRLOCK:-}" ]; then
  cargo build --release -q -p airlock
  AIRLOCK=target/x86_64-unknown-linux-gnu/release/airlock
fi
cargo build -q -p airlock-images --example make-layout
MAKE=target/x86_64-unknown-linux-gnu/debug/examples/make-layout
IMAGES=$(scripts/test-images.sh)
W=$(mktemp -d)
trap 'rm -rf "$W"' EXIT
$MAKE "$W/distroless" --name bench.test/distroless:1 --user 1000:1000 "$IMAGES/distroless" >/dev/null
$MAKE "$W/python" --name bench.test/python:1 --user 1000:1000 "$IMAGES/python" >/dev/null
# distroless with a second layer: its root is an overlayfs of the two (one layer is used as
# it is), so the two distroless rows compare the overlay with direct clones of one layer.
mkdir -p "$W/extra/opt"; echo second > "$W/extra/opt/second.txt"
$MAKE "$W/distroless2" --name bench.test/distroless2:1 --user 1000:1000 "$IMAGES/distroless" "$W/extra" >/dev/null
S=$W/state
D=$($AIRLOCK image --state-dir "$S" import "$W/distroless")
P=$($AIRLOCK image --state-dir "$S" import "$W/python")
D2=$($AIRLOCK image --state-dir "$S" import "$W/distroless2")
printf 'image: %s\n' "$D" > "$W/distroless.yaml"
printf 'image: %s\n' "$P" > "$W/python.yaml"
printf 'image: %s\n' "$D2" > "$W/distroless2.yaml"
echo "== image root: start-up against image: host ($RUNS runs each)"
hyperfine -N -w 20 -r "$RUNS" --export-json "$OUT/image-root.json" \
  "$AIRLOCK run --state-dir $S -- /bin/true" \
  "$AIRLOCK run --state-dir $S -c $W/distroless.yaml -- /bin/hello" \
  "$AIRLOCK run --state-dir $S -c $W/distroless2.yaml -- /bin/hello" \
  "$AIRLOCK run --state-dir $S -- /usr/bin/python3 -S -c pass" \
  "$AIRLOCK run --state-dir $S -c $W/python.yaml -- /usr/bin/python3 -S -c pass" >/dev/null
python3 - "$OUT/image-root.json" <<'PY'
import json, statistics, sys
r = json.load(open(sys.argv[1]))["results"]
med = [statistics.median(x["times"]) * 1000 for x in r]
names = ["host /bin/true", "distroless /bin/hello (1 layer)",
         "distroless /bin/hello (2 layers, overlay)", "host python3 -S -c pass",
         "python image python3 -S -c pass"]
for n, m in zip(names, med):
    print(f"{n:36s} median {m:7.2f} ms")
# The python image's tree has no .pyc files (test-images.sh copies sources), so its row
# includes compiling the modules python imports; the distroless rows are the root's cost.
print(f"image root - host: one layer {med[1]-med[0]:+.2f} ms, overlay {med[2]-med[0]:+.2f} ms, "
      f"python (no .pyc in the image) {med[4]-med[3]:+.2f} ms")
PY
