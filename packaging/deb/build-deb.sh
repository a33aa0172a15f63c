#!/usr/bin/env bash
# Builds airlock's Debian package with cargo-deb (cargo install cargo-deb --locked), from
# the metadata in crates/airlock/Cargo.toml ([package.metadata.deb]):
#
#   packaging/deb/build-deb.sh                        # release build, then the package
#   packaging/deb/build-deb.sh --binary PATH --out DIR [--fast]
#                                                     # package an airlock built elsewhere
#                                                     # (--fast: gzip: quicker, larger)
#
# Generated at package time from the binary itself, next to it under deb/: the man pages
# (`airlock man`), the bash, zsh and fish completions (`airlock completions`) and the
# systemd unit (packaging/airlock.service with the installed path, /usr/bin/airlock).
# Prints the path of the .deb on stdout.
#
# --binary: cargo-deb packages only binaries under the target directory's release
# profile (its `target/release/` asset prefix), and refuses the dev profile; a binary
# built elsewhere (the tests' debug build, a CI artifact) is copied into a throw-away
# target directory (CARGO_TARGET_DIR) and packaged from there without a build.
set -euo pipefail

REPO=$(cd "$(dirname "$0")/../.." && pwd)
TRIPLE=x86_64-unknown-linux-gnu
binary=
out=
compression=()
while (($#)); do
  case "$1" in
    --binary) binary=$2; shift 2 ;;
    --out) out=$2; shift 2 ;;
    --fast) compression=(--fast -Z gz); shift ;;
    *) echo "build-deb.sh: unknown argument $1" >&2; exit 2 ;;
  esac
done
command -v cargo-deb >/dev/null || { echo "build-deb.sh: cargo-deb missing (cargo install cargo-deb --locked)" >&2; exit 1; }

cd "$REPO"
if [[ -n $binary ]]; then
  target_dir=$(mktemp -d /tmp/airlock-deb.XXXXXX)
  trap 'rm -rf "$target_dir"' EXIT
  mkdir -p "$target_dir/$TRIPLE/release"
  cp "$binary" "$target_dir/$TRIPLE/release/airlock"
  export CARGO_TARGET_DIR=$target_dir
else
  cargo build -p airlock --release --locked >&2
  target_dir=${CARGO_TARGET_DIR:-$REPO/target}
fi
release="$target_dir/$TRIPLE/release"
assets="$release/deb"
rm -rf "$assets"
mkdir -p "$assets/man" "$assets/completions"
"$release/airlock" man "$assets/man"
gzip -9n "$assets"/man/*.1
"$release/airlock" completions bash >"$assets/completions/airlock"
"$release/airlock" completions zsh >"$assets/completions/_airlock"
"$release/airlock" completions fish >"$assets/completions/airlock.fish"
sed 's#/usr/local/bin/airlock#/usr/bin/airlock#g' packaging/airlock.service >"$assets/airlock.service"

out=${out:-$REPO/target/debian}
mkdir -p "$out"
cargo deb -p airlock --no-build --target "$TRIPLE" --output "$out" --quiet "${compression[@]}" >&2
ls -t "$out"/airlock_*.deb | head -1
