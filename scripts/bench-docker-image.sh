#!/usr/bin/env bash
# Builds the local image `airlock-bench:busybox` (busybox-static, no network needed) and
# starts dockerd if it is not running. Used by `DOCKER=1 scripts/bench.sh`.
set -euo pipefail
command -v dockerd >/dev/null && command -v busybox >/dev/null || {
  apt-get update -qq && apt-get install -y -qq docker.io busybox-static >/dev/null
}
if ! docker info >/dev/null 2>&1; then
  (dockerd >/var/log/dockerd-bench.log 2>&1 &)
  for _ in $(seq 1 60); do docker info >/dev/null 2>&1 && break; sleep 0.5; done
fi
if ! docker image inspect airlock-bench:busybox >/dev/null 2>&1; then
  root=$(mktemp -d)
  mkdir -p "$root/bin" "$root/tmp"
  cp "$(command -v busybox)" "$root/bin/busybox"
  for tool in sh true echo cat; do ln -s busybox "$root/bin/$tool"; done
  tar -C "$root" -c . | docker import - airlock-bench:busybox
  rm -rf "$root"
fi
