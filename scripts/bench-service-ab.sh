#!/usr/bin/env bash
# The service's throughput and p99 for two builds of airlock in one run, interleaved
# (A B A B ...), so a change's cost is measured against its baseline on the same noisy
# machine: each round starts `airlock serve` with a pool of 16 and drives it with
# crates/server/examples/load.rs (CLIENTS clients running /bin/true through
# POST /v1/runs?wait=true for SECONDS seconds), then stops it. Prints each round and the
# medians of both builds, and their ratio.
#
#   AIRLOCK_BEFORE=/path/to/old/airlock scripts/bench-service-ab.sh
#   ROUNDS=5 SERVICE_CLIENTS=16 SERVICE_SECONDS=20 AIRLOCK=/path/to/new/airlock ...
set -euo pipefail
cd "$(dirname "$0")/.."
: "${AIRLOCK_BEFORE:?set AIRLOCK_BEFORE to the baseline build of airlock}"
ROUNDS=${ROUNDS:-5}
CLIENTS=${SERVICE_CLIENTS:-16}
SECONDS_PER_ROUND=${SERVICE_SECONDS:-20}
if [ -z "${AIRLOCK:-}" ]; then
  cargo build --release -q -p airlock
  AIRLOCK=target/x86_64-unknown-linux-gnu/release/airlock
fi
cargo build -q --release -p airlock-server --example load
DIR=$(mktemp -d)
trap 'rm -rf "$DIR"' EXIT
# Installed copies, as bench.sh measures them (a freshly linked file execs slower).
install -m 0755 "$AIRLOCK_BEFORE" "$DIR/before"
install -m 0755 "$AIRLOCK" "$DIR/after"
install -m 0755 target/x86_64-unknown-linux-gnu/release/examples/load "$DIR/load"
cp examples/contracts/default.yaml "$DIR/small.yaml"
printf '[server]\nlisten = ["unix:%s/airlock.sock"]\n[server.contracts]\nsmall = "small.yaml"\n[server.pools]\nsmall = 16\n' \
  "$DIR" >"$DIR/airlock.toml"

round() { # BUILD
  rm -rf "$DIR/state"
  "$DIR/$1" serve --config "$DIR/airlock.toml" --state-dir "$DIR/state" 2>"$DIR/serve-$1.log" &
  local pid=$!
  until curl -sf --unix-socket "$DIR/airlock.sock" http://airlock/readyz >/dev/null; do sleep 0.2; done
  sleep 1
  echo "$1 $("$DIR/load" "$DIR/airlock.sock" "$CLIENTS" "$SECONDS_PER_ROUND" small)" | tee -a "$DIR/rounds"
  kill -TERM "$pid"
  wait "$pid" || true
}

for _ in $(seq "$ROUNDS"); do
  round before
  round after
done
python3 - "$DIR/rounds" <<'PY'
import re, statistics, sys
rounds = {"before": [], "after": []}
for line in open(sys.argv[1]):
    build = line.split()[0]
    rate = float(re.search(r"([\d.]+) runs/s", line).group(1))
    p99 = float(re.search(r"p99 ([\d.]+) ms", line).group(1))
    failed = int(re.search(r"(\d+) not ok", line).group(1))
    rounds[build].append((rate, p99, failed))
for build, r in rounds.items():
    print(f"{build:6}: median {statistics.median(x[0] for x in r):7.1f} runs/s, "
          f"median p99 {statistics.median(x[1] for x in r):7.2f} ms, {sum(x[2] for x in r)} not ok "
          f"over {len(r)} rounds")
b, a = rounds["before"], rounds["after"]
print(f"after/before: throughput x{statistics.median(x[0] for x in a) / statistics.median(x[0] for x in b):.3f}, "
      f"p99 x{statistics.median(x[1] for x in a) / statistics.median(x[1] for x in b):.3f}")
PY
