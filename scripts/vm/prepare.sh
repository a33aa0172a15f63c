#!/usr/bin/env bash
# One-time setup for scripts/vm/run-in-vm.sh: installs QEMU, busybox and a static C
# toolchain, and extracts a Linux >= 6.12 kernel (Debian bookworm-backports'
# linux-image-amd64) into the cache WITHOUT installing it as the host's kernel.
#
#   scripts/vm/prepare.sh            # idempotent; a second run only checks the cache
#
# Cache: $AIRLOCK_VM_CACHE (default /var/cache/airlock-vm):
#   kernel/vmlinuz, kernel/version, kernel/modules/*.ko (9p for sharing the work tree)
# Needs root (apt-get). Only Debian's own archive is used.
set -euo pipefail

CACHE="${AIRLOCK_VM_CACHE:-/var/cache/airlock-vm}"
export DEBIAN_FRONTEND=noninteractive
log() { echo "prepare.sh: $*" >&2; }

if [[ $(id -u) -ne 0 ]]; then
  log "must run as root (apt-get install, apt-get download)"
  exit 1
fi

codename=$(. /etc/os-release && echo "${VERSION_CODENAME:-}")
# A kernel >= 6.12 comes from bookworm-backports on Debian 12 (trixie has it in main).
if [[ "$codename" == bookworm ]] && ! grep -rqs "bookworm-backports" /etc/apt/sources.list /etc/apt/sources.list.d/; then
  log "adding bookworm-backports to apt sources"
  cat >/etc/apt/sources.list.d/airlock-vm-backports.sources <<'SRC'
Types: deb
URIs: http://deb.debian.org/debian
Suites: bookworm-backports
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg
SRC
fi

need_update=1
apt_update() {
  if [[ -n "$need_update" ]]; then
    apt-get update -qq
    need_update=
  fi
}

# Host tools. qemu-system-x86 may have to come from backports when qemu-utils from
# backports is already installed (their versions must match).
missing=()
command -v qemu-system-x86_64 >/dev/null || missing+=(qemu-system-x86)
# busybox-static: the VM's userland; it must be static (the initramfs has no libc for it).
if ! { [[ -x /bin/busybox ]] && { ldd /bin/busybox 2>&1 || true; } | grep -q "not a dynamic"; }; then
  missing+=(busybox-static)
fi
command -v cpio >/dev/null || missing+=(cpio)
command -v xz >/dev/null || missing+=(xz-utils)
command -v gcc >/dev/null || missing+=(gcc)
[[ -e /usr/lib/x86_64-linux-gnu/libc.a ]] || missing+=(libc6-dev)
if ((${#missing[@]})); then
  apt_update
  log "installing ${missing[*]}"
  if ! apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null; then
    log "retrying from bookworm-backports"
    apt-get install -y -qq --no-install-recommends -t bookworm-backports "${missing[@]}" >/dev/null
  fi
fi

if [[ -s "$CACHE/kernel/vmlinuz" && -s "$CACHE/kernel/version" && -s "$CACHE/kernel/modules/9p.ko" ]]; then
  log "kernel $(cat "$CACHE/kernel/version") already in $CACHE/kernel"
  exit 0
fi

apt_update
meta=linux-image-amd64
[[ "$codename" == bookworm ]] && meta=linux-image-amd64/bookworm-backports
# linux-image-amd64 is a metapackage; its dependency names the real image package.
pkg=$(apt-cache depends "$meta" 2>/dev/null | awk '/Depends: linux-image-[0-9]/ {print $2; exit}')
if [[ -z "$pkg" ]]; then
  log "cannot resolve linux-image-amd64 to a kernel image package"
  exit 1
fi
kver=${pkg#linux-image-}
major=${kver%%.*}; rest=${kver#*.}; minor=${rest%%.*}
if ((major < 6 || (major == 6 && minor < 12))); then
  log "$pkg is older than 6.12 (Landlock ABI 6 needs 6.12+)"
  exit 1
fi

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
log "downloading $pkg"
# (the versioned package name exists only in the suite that has that kernel)
chmod 777 "$work" # apt's _apt user downloads into it
(cd "$work" && apt-get download -qq "$pkg")
deb=$(ls "$work"/linux-image-*.deb | head -1)
dpkg-deb -x "$deb" "$work/x"

mkdir -p "$CACHE"
rm -rf "$CACHE/kernel.new"
mkdir -p "$CACHE/kernel.new/modules"
cp "$work"/x/boot/vmlinuz-"$kver" "$CACHE/kernel.new/vmlinuz"
cp "$work"/x/boot/config-"$kver" "$CACHE/kernel.new/config"
moddir="$work/x/lib/modules/$kver/kernel"
# 9p over virtio, to share the work tree read-only (load order = dependency order).
for m in fs/netfs/netfs net/9p/9pnet net/9p/9pnet_virtio fs/9p/9p; do
  src="$moddir/$m.ko"
  if [[ -e "$src.xz" ]]; then
    xz -dc "$src.xz" >"$CACHE/kernel.new/modules/$(basename "$m").ko"
  elif [[ -e "$src.zst" ]]; then
    zstd -dcq "$src.zst" >"$CACHE/kernel.new/modules/$(basename "$m").ko"
  else
    cp "$src" "$CACHE/kernel.new/modules/"
  fi
done
printf '%s\n' netfs 9pnet 9pnet_virtio 9p >"$CACHE/kernel.new/modules/order"
grep -q '^CONFIG_SECURITY_LANDLOCK=y' "$CACHE/kernel.new/config" || {
  log "kernel $kver lacks CONFIG_SECURITY_LANDLOCK"
  exit 1
}
echo "$kver" >"$CACHE/kernel.new/version"
rm -rf "$CACHE/kernel"
mv "$CACHE/kernel.new" "$CACHE/kernel"
log "kernel $kver ready in $CACHE/kernel"
