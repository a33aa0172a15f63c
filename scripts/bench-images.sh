#!/usr/bin/env bash
# Image figures (called by scripts/bench.sh, or alone): pull + unpack throughput of a
# ~100 MB image from a local registry (Debian's docker-registry over TLS, pushed with
# skopeo), import (unpack only) throughput of the same image from a layout directory,
# and the disk use of two images that share their base layer. Run as root.
#   AIRLOCK=path/to/airlock scripts/bench-images.sh
set -euo pipefail
cd "$(dirname "$0")/.."
command -v docker-registry >/dev/null && command -v skopeo >/dev/null || {
  apt-get update -qq && apt-get install -y -qq docker-registry skopeo >/dev/null
}
if [ -z "${AIRLOCK:-}" ]; then
  cargo build --release -q -p airlock
  AIRLOCK=target/x86_64-unknown-linux-gnu/release/airlock
fi
cargo build -q -p airlock-images --example make-layout
MAKE=target/x86_64-unknown-linux-gnu/debug/examples/make-layout
IMAGES=$(scripts/test-images.sh)  # the test images' root trees
W=$(mktemp -d); REG_PID=
trap '[ -n "$REG_PID" ] && kill $REG_PID; rm -rf "$W"' EXIT

# The big image: the python test image's tree plus 80 MB of incompressible data files.
PYROOT=$IMAGES/python
DATA=$W/data; mkdir -p "$DATA/opt/data"
for i in $(seq 1 80); do head -c 1048576 /dev/urandom > "$DATA/opt/data/blob$i"; done
EXTRA=$W/extra; mkdir -p "$EXTRA/opt"; echo second > "$EXTRA/opt/second.txt"
$MAKE "$W/big" --name bench.test/big:1 "$PYROOT" "$DATA" >/dev/null
$MAKE "$W/second" --name bench.test/second:1 "$PYROOT" "$EXTRA" >/dev/null
BLOB_BYTES=$(du -sb "$W/big/blobs" | cut -f1)

# TLS for the registry: a CA and a certificate for 127.0.0.1.
EC=(-newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes)
(cd "$W" && openssl req -x509 "${EC[@]}" -keyout ca.key -out ca.pem -subj /CN=bench-ca -days 1 \
  && openssl req "${EC[@]}" -keyout key.pem -out req.csr -subj /CN=127.0.0.1 \
  && printf 'subjectAltName=IP:127.0.0.1\nbasicConstraints=CA:FALSE\n' > ext.cnf \
  && openssl x509 -req -in req.csr -CA ca.pem -CAkey ca.key -CAcreateserial -out cert.pem \
       -days 1 -extfile ext.cnf) 2>/dev/null
PORT=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
cat > "$W/registry.yml" <<YML
version: 0.1
log: {level: error}
storage: {filesystem: {rootdirectory: $W/storage}}
http: {addr: 127.0.0.1:$PORT, tls: {certificate: $W/cert.pem, key: $W/key.pem}}
YML
docker-registry serve "$W/registry.yml" >/dev/null 2>&1 & REG_PID=$!
for _ in $(seq 100); do (exec 3<>/dev/tcp/127.0.0.1/$PORT) 2>/dev/null && break; sleep 0.1; done
skopeo --insecure-policy copy -q --dest-tls-verify=false "oci:$W/big" "docker://127.0.0.1:$PORT/big:1"
printf '[images]\nca_file = "%s"\nallow_tags = true\n' "$W/ca.pem" > "$W/airlock.toml"

echo "== images: pull + unpack of a $((BLOB_BYTES / 1000000)) MB image (compressed blobs), 3 runs"
for i in 1 2 3; do
  S=$W/state-pull-$i
  start=$(date +%s.%N)
  $AIRLOCK image --state-dir "$S" --config "$W/airlock.toml" pull "127.0.0.1:$PORT/big:1" >/dev/null
  end=$(date +%s.%N)
  python3 -c "t=$end-$start; print(f'pull+unpack {t:.2f} s, {$BLOB_BYTES/t/1e6:.0f} MB/s')"
  rm -rf "$S"
done
echo "== images: import (verify + unpack only) of the same image from a layout directory, 3 runs"
for i in 1 2 3; do
  S=$W/state-import-$i
  start=$(date +%s.%N)
  $AIRLOCK image --state-dir "$S" import "$W/big" >/dev/null
  end=$(date +%s.%N)
  python3 -c "t=$end-$start; print(f'import {t:.2f} s, {$BLOB_BYTES/t/1e6:.0f} MB/s')"
  rm -rf "$S"
done
echo "== images: disk use of two images sharing their base layer"
for name in big second; do
  $AIRLOCK image --state-dir "$W/alone-$name" import "$W/$name" >/dev/null
  echo "$name alone: $(du -sb "$W/alone-$name/images" | cut -f1) bytes"
done
$AIRLOCK image --state-dir "$W/both" import "$W/big" >/dev/null
$AIRLOCK image --state-dir "$W/both" import "$W/second" >/dev/null
echo "both in one store: $(du -sb "$W/both/images" | cut -f1) bytes"
