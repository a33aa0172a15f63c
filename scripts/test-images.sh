#!/usr/bin/env bash
# Builds the test images as OCI layouts under target/test-images/ (cached: rebuilt only
# when this script or the host's python3 changes). There is no public registry or docker
# on the test machines, so the images are made from host files:
#   distroless/  one static binary (gcc -static), no shell, no libc; plus a setuid-root
#                copy of it (the unpacker must drop the bit), USER 1000:1000
#   python/      the host's python3, its shared libraries and standard library, the
#                seed's tool.py pattern (JSON on stdin, JSON on stdout), an /etc/shadow of
#                the image's own, USER 1000:1000, ENTRYPOINT python3 /app/tool.py
# Prints the directory that holds both layouts.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=$(readlink -f /usr/bin/python3)
KEY=$( (cat "$0"; echo "$PY"; "$PY" --version) | sha256sum | cut -c1-16)
OUT=target/test-images/$KEY
if [ -f "$OUT/done" ]; then echo "$PWD/$OUT"; exit 0; fi
rm -rf "$OUT"; mkdir -p "$OUT"
cargo build -q -p airlock-images --example make-layout
MAKE=target/x86_64-unknown-linux-gnu/debug/examples/make-layout
[ -x "$MAKE" ] || MAKE=target/debug/examples/make-layout
WORK=$(mktemp -d); trap 'rm -rf "$WORK"' EXIT

# distroless: a static program that reads stdin and answers one JSON line with its ids.
mkdir -p "$WORK/d/bin" "$WORK/d/etc"
cat > "$WORK/hello.c" <<'C'
#include <stdio.h>
#include <unistd.h>
int main(void) {
  char buf[4096]; size_t n = fread(buf, 1, sizeof buf - 1, stdin); buf[n] = 0;
  printf("{\"tool\":\"hello\",\"uid\":%d,\"euid\":%d,\"gid\":%d,\"stdin_bytes\":%zu}\n",
         getuid(), geteuid(), getgid(), n);
  return 0;
}
C
gcc -static -O2 -o "$WORK/d/bin/hello" "$WORK/hello.c"
cp "$WORK/d/bin/hello" "$WORK/d/bin/hello-setuid"
chown 0:0 "$WORK/d/bin/hello-setuid"; chmod 4755 "$WORK/d/bin/hello-setuid"
printf 'root:x:0:0::/:/nonexistent\ntool:x:1000:1000::/:/nonexistent\n' > "$WORK/d/etc/passwd"
$MAKE "$OUT/distroless" --name airlock.test/distroless:1 --user 1000:1000 \
  --entrypoint /bin/hello "$WORK/d" > "$OUT/distroless.digest"

# python: the interpreter, the libraries it links, its standard library, the tool.
R=$WORK/p
mkdir -p "$R/usr/bin" "$R/app" "$R/etc" "$R/tmp"
cp -a "$PY" "$R/usr/bin/"; ln -s "$(basename "$PY")" "$R/usr/bin/python3"
# ldd's lines: `libx.so => /path (addr)` and `/lib64/ld-linux... (addr)`.
libs() { ldd "$@" 2>/dev/null | awk '$2 == "=>" && $3 ~ /^\// {print $3} $1 ~ /^\// && $2 ~ /^\(/ {print $1}' | sort -u; }
for lib in $(libs "$PY"); do
  mkdir -p "$R$(dirname "$lib")"; cp -L "$lib" "$R$lib"
done
STDLIB=$("$PY" -c 'import sysconfig; print(sysconfig.get_paths()["stdlib"])')
mkdir -p "$R$STDLIB"
(cd "$STDLIB" && tar --exclude=test --exclude=__pycache__ --exclude=idlelib --exclude=tkinter \
  -cf - .) | (cd "$R$STDLIB" && tar -xf -)
for lib in $(libs "$STDLIB"/lib-dynload/*.so); do
  [ -e "$R$lib" ] || { mkdir -p "$R$(dirname "$lib")"; cp -L "$lib" "$R$lib"; }
done
cat > "$R/app/tool.py" <<'PYTOOL'
import json, os, sys
request = json.load(sys.stdin)
shadow = open("/etc/shadow").read() if os.access("/etc/shadow", os.R_OK) else None
json.dump({"tool": "py", "echo": request, "uid": os.getuid(), "gid": os.getgid(),
           "cwd": os.getcwd(), "shadow": shadow}, sys.stdout)
PYTOOL
printf 'root:x:0:0::/root:/nonexistent\ntool:x:1000:1000::/app:/nonexistent\n' > "$R/etc/passwd"
printf 'root:image-shadow:19000::::::\n' > "$R/etc/shadow"; chmod 0644 "$R/etc/shadow"
chmod 1777 "$R/tmp"
$MAKE "$OUT/python" --name airlock.test/python-tool:1 --user 1000:1000 --workdir /app \
  --env PYTHONDONTWRITEBYTECODE=1 --entrypoint python3 --entrypoint /app/tool.py \
  "$R" > "$OUT/python.digest"
touch "$OUT/done"
echo "$PWD/$OUT"
