#!/bin/sh
# Install intentfs for mount(8), /etc/fstab and systemd. Run as root from the repository:
#
#   cargo build --release && sudo mount/install.sh [BINARY]
#
# BINARY defaults to target/release/intentfs. Installs:
#   /usr/local/bin/intentfs
#   /sbin/mount.fuse.intentfs and /usr/sbin/mount.fuse.intentfs   (mount -t fuse.intentfs, fstab)
#   /etc/systemd/system/intentfs@.service                          (systemctl enable --now intentfs@NAME)
#   /etc/intentfs/example.conf                                     (copy to /etc/intentfs/NAME.conf)
#   /usr/local/share/doc/intentfs/containers.md
# DESTDIR=/some/root installs under another root (packaging); nothing is started.

set -eu
here=$(cd "$(dirname "$0")" && pwd)
bin=${1:-$here/../target/release/intentfs}
root=${DESTDIR:-}

[ -x "$bin" ] || { echo "install.sh: $bin is not an executable (cargo build --release first, or pass the binary)" >&2; exit 1; }
if [ -z "$root" ] && [ "$(id -u)" != 0 ]; then
    echo "install.sh: run as root (or set DESTDIR)" >&2
    exit 1
fi

install -D -m 0755 "$bin" "$root/usr/local/bin/intentfs"
install -D -m 0755 "$here/mount.fuse.intentfs" "$root/usr/sbin/mount.fuse.intentfs"
# On merged-/usr systems /sbin is /usr/sbin: then this is already done.
if [ "$(readlink -f "$root/sbin")" != "$(readlink -f "$root/usr/sbin")" ]; then
    install -D -m 0755 "$here/mount.fuse.intentfs" "$root/sbin/mount.fuse.intentfs"
fi
install -D -m 0644 "$here/intentfs@.service" "$root/etc/systemd/system/intentfs@.service"
install -D -m 0644 "$here/example.conf" "$root/etc/intentfs/example.conf"
install -D -m 0644 "$here/containers.md" "$root/usr/local/share/doc/intentfs/containers.md"

if [ -z "$root" ]; then
    if ! grep -qs '^[[:space:]]*user_allow_other' /etc/fuse.conf; then
        echo "note: non-root users need 'user_allow_other' in /etc/fuse.conf to mount with --allow-other / allow_other"
    fi
    if command -v systemctl >/dev/null 2>&1 && [ -d /run/systemd/system ]; then
        systemctl daemon-reload
    fi
fi
echo "installed. Next: cp /etc/intentfs/example.conf /etc/intentfs/agent.conf; edit it; systemctl enable --now intentfs@agent"
