#!/usr/bin/env bash
# Builds the root trees of the test images under target/test-images/<key>/ (cached:
# rebuilt only when this script or the host's python3 changes). There is no public
# registry or docker on the test machines, so the images are made from host files; the
# tests write them as OCI layouts in-process (crates/images/src/layout.rs), the
# benchmark with `cargo run -p airlock-images --example make-layout`:
#   distroless/  one static binary (gcc -static), no shell, no libc; plus a setuid-root
#                copy of it (the unpacker must drop the bit); meant for USER 1000:1000,
#                ENTRYPOINT /bin/hello
#   python/      the host's python3, its shared libraries and standard library, the
#                seed's tool.py pattern (JSON on stdin, JSON on stdout), an /etc/shadow of
#                the image's own; meant for USER 1000:1000, ENTRYPOINT python3 /app/tool.py
# Prints the directory that holds both trees. (No cargo here: the tests call this script
# while `cargo test` holds the build directory's lock.)
set -euo pipefail
cd "$(dirname "$0")/.."
PY=$(readlink -f /usr/bin/python3)
KEY=$( (cat "$0"; echo "$PY"; "$PY" --version) | sha256sum | cut -c1-16)
OUT=target/test-images/$KEY
mkdir -p target/test-images
# Tests run in parallel: one builds, the others wait for it.
exec 9>target/test-images/.lock
flock 9
if [ -f "$OUT/done" ]; then echo "$PWD/$OUT"; exit 0; fi
rm -rf "$OUT"; mkdir -p "$OUT"
WORK=$(mktemp -d); trap 'rm -rf "$WORK"' EXIT

# distroless: a static program that reads stdin and answers one JSON line with its ids.
mkdir -p "$OUT/distroless/bin" "$OUT/distroless/etc"
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
D=$OUT/distroless
gcc -static -O2 -o "$D/bin/hello" "$WORK/hello.c"
cp "$D/bin/hello" "$D/bin/hello-setuid"
chown 0:0 "$D/bin/hello-setuid"; chmod 4755 "$D/bin/hello-setuid"
printf 'root:x:0:0::/:/nonexistent\ntool:x:1000:1000::/:/nonexistent\n' > "$D/etc/passwd"

# python: the interpreter, the libraries it links, its standard library, the tool.
R=$OUT/python
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
touch "$OUT/done"
echo "$PWD/$OUT"
