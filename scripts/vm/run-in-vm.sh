#!/usr/bin/env bash
# Runs a command as root inside a throw-away QEMU guest (KVM or TCG) whose only cgroup hierarchy is
# cgroup v2 (memory, pids and cpu enabled), on a Linux >= 6.12 kernel with Landlock.
#
#   scripts/vm/prepare.sh                                  # once: packages + kernel
#   scripts/vm/run-in-vm.sh scripts/vm/cgroup-v2-checks.sh
#   scripts/vm/run-in-vm.sh airlock doctor
#   scripts/vm/run-in-vm.sh --check                        # prerequisites only
#
# The guest boots from an initramfs holding static busybox (at /bin), the airlock binary
# ($AIRLOCK_BIN, default target/x86_64-unknown-linux-gnu/debug/airlock, at /usr/local/bin/airlock), the shared
# libraries it links and scripts/vm/payloads built static (at /usr/local/bin). A cell sees
# exactly those as its host /usr, /bin, /lib*. The work tree is shared read-only over 9p
# at the same path (a copy of scripts/vm is in the initramfs in case 9p fails) and the
# command starts in the current directory when that is inside the work tree.
#
# The guest prints `AIRLOCK-VM-EXIT=<code>` after the command and powers off; this script
# prints the console on stdout (without carriage returns) and exits with that code, or
# with 125 when the guest did not report one (boot failure, timeout).
#
# Acceleration: KVM when /dev/kvm is backed by kvm_intel/kvm_amd, else QEMU's TCG (about
# 20 s for the checks). AIRLOCK_VM_ACCEL=kvm|tcg forces one, AIRLOCK_VM_CPU_MODEL the -cpu.
# Environment: AIRLOCK_VM_CACHE (/var/cache/airlock-vm), AIRLOCK_BIN, AIRLOCK_VM_TIMEOUT
# (seconds, 300), AIRLOCK_VM_MEM (MiB, 1024), AIRLOCK_VM_CPUS (2), AIRLOCK_VM_DEBUG=1
# (kernel messages on the console), AIRLOCK_VM_LSM (the kernel's lsm= list, default
# landlock,lockdown,yama,integrity,apparmor; scripts/vm/no-landlock-checks.sh boots
# without landlock). Variables named AIRLOCK_* (except AIRLOCK_VM_* and
# AIRLOCK_BIN), RUST_BACKTRACE and RUST_LOG are passed to the command.
set -euo pipefail

REPO=$(cd "$(dirname "$0")/../.." && pwd)
CACHE="${AIRLOCK_VM_CACHE:-/var/cache/airlock-vm}"
KERNEL="$CACHE/kernel"
AIRLOCK_BIN="${AIRLOCK_BIN:-$REPO/target/x86_64-unknown-linux-gnu/debug/airlock}"
TIMEOUT="${AIRLOCK_VM_TIMEOUT:-300}"
MEM="${AIRLOCK_VM_MEM:-1024}"
CPUS="${AIRLOCK_VM_CPUS:-2}"
BUSYBOX=/bin/busybox
[[ -x $BUSYBOX ]] || BUSYBOX=/usr/bin/busybox

log() { echo "run-in-vm.sh: $*" >&2; }

# Prints every missing prerequisite; returns non-zero if any.
check_prereqs() {
  local problems=()
  command -v qemu-system-x86_64 >/dev/null || problems+=("qemu-system-x86_64 not installed (apt-get install qemu-system-x86)")
  if [[ ! -x $BUSYBOX ]] || ! { ldd "$BUSYBOX" 2>&1 || true; } | grep -q "not a dynamic"; then
    problems+=("static busybox not installed (apt-get install busybox-static)")
  fi
  command -v cpio >/dev/null || problems+=("cpio not installed")
  command -v gcc >/dev/null && [[ -e /usr/lib/x86_64-linux-gnu/libc.a ]] ||
    problems+=("gcc + libc6-dev needed to build the static payloads")
  [[ -s $KERNEL/vmlinuz && -s $KERNEL/modules/order ]] ||
    problems+=("no guest kernel in $KERNEL (run scripts/vm/prepare.sh)")
  [[ -x $AIRLOCK_BIN ]] || problems+=("airlock binary $AIRLOCK_BIN not found (cargo build -p airlock, or set AIRLOCK_BIN)")
  if ((${#problems[@]})); then
    printf 'run-in-vm.sh: missing prerequisite: %s\n' "${problems[@]}" >&2
    return 1
  fi
}

if [[ "${1:-}" == --check ]]; then
  check_prereqs
  exit $?
fi
[[ "${1:-}" == -- ]] && shift
if (($# == 0)); then
  sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//' >&2
  exit 2
fi
check_prereqs || exit 125

work=$(mktemp -d /tmp/airlock-vm.XXXXXX)
trap 'rm -rf "$work"' EXIT
root="$work/root"
mkdir -p "$root"/{bin,sbin,usr/bin,usr/sbin,usr/local/bin,lib,lib64,etc,proc,sys,dev,tmp,run,root,newroot,vm/modules}

# --- userland: static busybox with every applet linked in /bin ---
cp "$BUSYBOX" "$root/bin/busybox"
for applet in $("$BUSYBOX" --list); do
  [[ -e "$root/bin/$applet" ]] || ln -s busybox "$root/bin/$applet"
done

# --- airlock and the libraries it links, at the paths ldd names ---
cp "$AIRLOCK_BIN" "$root/usr/local/bin/airlock"
# A debug build carries ~300 MB of debug info (the binary links the service, the agent's
# MCP and HTTP clients): unpacked twice in the guest's RAM (initramfs, then the tmpfs root)
# it no longer fits. The guest needs only the code.
if command -v strip >/dev/null; then strip --strip-debug "$root/usr/local/bin/airlock"; fi
# (none for the static-pie build; ldd then fails, which is fine)
{ ldd "$AIRLOCK_BIN" 2>/dev/null || true; } | { grep -o '/[^ ]*' || true; } | while read -r lib; do
  mkdir -p "$root$(dirname "$lib")"
  cp -L "$lib" "$root$lib"
done

# --- static payloads for the checks ---
for src in "$REPO"/scripts/vm/payloads/*.c; do
  gcc -static -O2 -o "$root/usr/local/bin/$(basename "$src" .c)" "$src"
done

# --- a copy of scripts/vm, used at the work tree's path when 9p fails ---
mkdir -p "$root/vm/fallback/scripts"
cp -r "$REPO/scripts/vm" "$root/vm/fallback/scripts/vm"

cp "$KERNEL"/modules/*.ko "$KERNEL/modules/order" "$root/vm/modules/"
printf 'root:x:0:0:root:/root:/bin/sh\n' >"$root/etc/passwd"
printf 'root:x:0:\n' >"$root/etc/group"

# --- the command, its directory and environment ---
case "$PWD/" in
  "$REPO"/*) cwd=$PWD ;;
  *) cwd=$REPO ;;
esac
{
  printf 'cd %q || exit 125\n' "$cwd"
  while IFS='=' read -r name _; do
    case "$name" in
      AIRLOCK_VM_* | AIRLOCK_BIN) ;;
      AIRLOCK_* | RUST_BACKTRACE | RUST_LOG) printf 'export %s=%q\n' "$name" "${!name}" ;;
    esac
  done < <(env)
  printf 'export AIRLOCK_BIN=/usr/local/bin/airlock\n'
  printf 'exec'
  printf ' %q' "$@"
  printf '\n'
} >"$root/vm/cmd"
printf '%s\n' "$REPO" >"$root/vm/repo"

# Stage 1: the kernel's initramfs is rootfs, which pivot_root (used by every cell) cannot
# leave, so copy it into a tmpfs and switch_root there.
cat >"$root/init" <<'INIT'
#!/bin/busybox sh
/bin/busybox mount -t tmpfs -o mode=0755 newroot /newroot
for entry in /*; do
  case "$entry" in /newroot | /proc | /sys | /dev) ;; *) /bin/busybox cp -a "$entry" /newroot/ ;; esac
done
/bin/busybox mkdir -p /newroot/proc /newroot/sys /newroot/dev
exec /bin/busybox switch_root /newroot /vm/init2
INIT

# Stage 2: mounts, pure cgroup v2, the shared work tree, then the command.
cat >"$root/vm/init2" <<'INIT2'
#!/bin/sh
export PATH=/usr/local/bin:/usr/bin:/bin:/usr/sbin:/sbin HOME=/root
mount -t proc proc /proc
mount -t sysfs sysfs /sys
mount -t securityfs securityfs /sys/kernel/security 2>/dev/null
mount -t devtmpfs devtmpfs /dev
mkdir -p /dev/pts /dev/shm
mount -t devpts devpts /dev/pts
mount -t tmpfs -o mode=1777 shm /dev/shm
mount -t tmpfs -o mode=1777 tmp /tmp
mount -t tmpfs -o mode=0755 run /run
mount -t cgroup2 -o nsdelegate cgroup2 /sys/fs/cgroup
echo "+memory +pids +cpu" >/sys/fs/cgroup/cgroup.subtree_control ||
  echo "AIRLOCK-VM: could not enable memory/pids/cpu controllers" >&2
hostname airlock-vm
ip link set lo up 2>/dev/null
repo=$(cat /vm/repo)
for m in $(cat /vm/modules/order); do insmod /vm/modules/$m.ko 2>/dev/null; done
# The share is mounted at a fixed place first and then bound at the host's path, which
# may lie under a directory mounted above (a checkout in /tmp, say).
mkdir -p /vm/work "$repo"
if mount -t 9p -o trans=virtio,version=9p2000.L,ro,msize=262144,cache=loose work /vm/work 2>/dev/null; then
  mount -o bind /vm/work "$repo"
else
  echo "AIRLOCK-VM: 9p share unavailable; only scripts/vm is present under $repo" >&2
  mount -o bind /vm/fallback "$repo"
fi
sh /vm/cmd </dev/null
echo "AIRLOCK-VM-EXIT=$?"
sync
poweroff -f
INIT2
chmod +x "$root/init" "$root/vm/init2"

(cd "$root" && find . -print0 | cpio --null -o -H newc --quiet) >"$work/initrd"

accel=${AIRLOCK_VM_ACCEL:-auto}
if [[ $accel == auto ]]; then
  # kvm_pvm (PVM, a software /dev/kvm found on nested sandboxes) only runs guest kernels
  # built for it; a stock kernel dies in its instruction emulator, so use TCG there.
  if [[ -d /sys/module/kvm_intel || -d /sys/module/kvm_amd ]] && [[ -w /dev/kvm ]]; then
    accel=kvm
  else
    accel=tcg
  fi
fi
if [[ $accel == kvm ]]; then
  cpu_model=${AIRLOCK_VM_CPU_MODEL:-host,-arch-capabilities}
else
  accel=tcg
  cpu_model=${AIRLOCK_VM_CPU_MODEL:-max}
fi
accel_opt=$accel
[[ $accel == tcg ]] && accel_opt=tcg,thread=multi,tb-size=256
log "accelerator: $accel_opt"

lsm=${AIRLOCK_VM_LSM:-landlock,lockdown,yama,integrity,apparmor}
append="console=ttyS0 panic=-1 cgroup_no_v1=all lsm=$lsm rdinit=/init"
if [[ "${AIRLOCK_VM_DEBUG:-}" == 1 ]]; then append+=" loglevel=7"; else append+=" quiet loglevel=3"; fi

set +e
timeout -k 5 "$TIMEOUT" qemu-system-x86_64 \
  -machine q35 -accel "$accel_opt" -cpu "$cpu_model" -smp "$CPUS" -m "$MEM" \
  -nodefaults -no-reboot -display none -serial stdio \
  -kernel "$KERNEL/vmlinuz" -initrd "$work/initrd" -append "$append" \
  -virtfs "local,path=$REPO,mount_tag=work,security_model=none,readonly=on" \
  </dev/null 2>"$work/qemu.err" | tr -d '\r' | tee "$work/console"
status=("${PIPESTATUS[@]}")
set -e
if [[ ${status[0]} -ne 0 ]]; then
  log "qemu exited with ${status[0]}$([[ ${status[0]} -eq 124 ]] && echo " (timed out after ${TIMEOUT}s)")"
  cat "$work/qemu.err" >&2
fi
code=$(sed -n 's/^AIRLOCK-VM-EXIT=\([0-9][0-9]*\)$/\1/p' "$work/console" | tail -1)
if [[ -z "$code" ]]; then
  log "the guest did not report an exit code"
  exit 125
fi
exit "$code"
