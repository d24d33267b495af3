#!/usr/bin/env bash
# Builds libfuse's passthrough_hp (3.18.2, with FUSE-over-io_uring and kernel passthrough):
# the fastest FUSE passthrough there is, the reference peer of bench/run.sh. No governance.
#
# Usage: bench/peers/build-passthrough-hp.sh [OUTDIR]   (default /tmp/passthrough_hp)
#   Prints the binary's path on its last line; a second call with the same OUTDIR only
#   prints it.
# Env: LIBFUSE_TARBALL  the libfuse 3.18.2 release tarball (default
#        ../shared/peers/libfuse-3.18.2.tar.gz relative to the repository). Not committed:
#        get it from https://github.com/libfuse/libfuse/releases/tag/fuse-3.18.2
#        (fuse-3.18.2.tar.gz). Any 3.18.x should do; older releases lack io_uring.
# Installs with apt-get, when missing: meson ninja-build pkg-config liburing-dev
# libnuma-dev gcc g++ (io_uring support needs BOTH liburing and libnuma at build time, or
# meson drops it silently: the script warns then).
#
# Run it:  passthrough_hp [--nopassthrough] [-o io_uring] SOURCE MOUNTPOINT
#   io_uring needs a 6.14+ kernel with CONFIG_FUSE_IO_URING and, as root,
#   echo Y > /sys/module/fuse/parameters/enable_uring (it silently falls back without).
#   Kernel passthrough (the default; --nopassthrough turns it off) needs CAP_SYS_ADMIN.
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
tarball=${LIBFUSE_TARBALL:-$root/../shared/peers/libfuse-3.18.2.tar.gz}
out=${1:-/tmp/passthrough_hp}
bin=$out/build/example/passthrough_hp
if [[ -x $bin ]]; then echo "$bin"; exit 0; fi
if [[ ! -f $tarball ]]; then
    echo "no libfuse tarball at $tarball: download fuse-3.18.2.tar.gz from" >&2
    echo "https://github.com/libfuse/libfuse/releases/tag/fuse-3.18.2 and set LIBFUSE_TARBALL=/path/to/it" >&2
    exit 1
fi
tarball=$(cd "$(dirname "$tarball")" && pwd)/$(basename "$tarball")
export DEBIAN_FRONTEND=noninteractive
need=()
for p in meson ninja-build pkg-config liburing-dev libnuma-dev gcc g++; do dpkg -s "$p" >/dev/null 2>&1 || need+=("$p"); done
if ((${#need[@]})); then
    ((EUID == 0)) || { echo "missing packages (${need[*]}); installing them needs root" >&2; exit 1; }
    apt-get update -qq && apt-get install -y -qq "${need[@]}" >/dev/null
fi
mkdir -p "$out" && tar xzf "$tarball" -C "$out" --strip-components=1
cd "$out"
meson setup build -Denable-io-uring=true -Dexamples=true -Dtests=false -Dutils=false >meson.log 2>&1 ||
    { tail -20 meson.log >&2; exit 1; }
grep -rq "define HAVE_URING" build/ || echo "warning: built without io_uring support (see $out/meson.log)" >&2
ninja -C build example/passthrough_hp >ninja.log 2>&1 || { tail -20 ninja.log >&2; exit 1; }
echo "$bin"
