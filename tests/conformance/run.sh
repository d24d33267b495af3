#!/usr/bin/env bash
# POSIX conformance: runs pjdfstest (the Rust rewrite from crates.io) on a native
# directory and on an intentfs mount of a workspace on the same filesystem (allow-all
# policy, intent ALL, --approver allow), prints the pass counts of both, and lists every
# case that passes natively but not on the mount. Exits 1 when such a case is not in
# tests/conformance/expected-differences.txt (patterns with their reasons).
#
# Needs root (pjdfstest switches users; the mount uses --allow-other) and /dev/fuse.
#
# Environment:
#   PJDFSTEST=path        the pjdfstest binary (default: PATH, ~/.cargo/bin, or
#                         `cargo install pjdfstest` into target/pjdfstest)
#   INTENTFS_BIN=path     the intentfs binary (default: `cargo build`, target/debug/intentfs)
#   CONFORMANCE_DIR=dir   work in (and keep) this directory instead of a temporary one
#   PJDFSTEST_FILTER=pat  only run the pjdfstest cases matching pat
#
# Exit status: 0 no unexpected difference; 1 unexpected differences; 2 setup failed
# (not root, users missing, the mount did not come up); 3 pjdfstest could not be built.
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../.." && pwd)

if [ "$(id -u)" != 0 ]; then
    echo "conformance: needs root (pjdfstest switches users)" >&2
    exit 2
fi
for u in nobody daemon; do
    getent passwd "$u" >/dev/null || { echo "conformance: user $u missing" >&2; exit 2; }
done

# --- pjdfstest ---------------------------------------------------------------------------
pjd=${PJDFSTEST:-}
if [ -z "$pjd" ]; then
    for c in "$(command -v pjdfstest || true)" "$HOME/.cargo/bin/pjdfstest" \
        "$repo/target/pjdfstest/bin/pjdfstest"; do
        if [ -n "$c" ] && [ -x "$c" ]; then pjd=$c; break; fi
    done
fi
if [ -z "$pjd" ]; then
    echo "conformance: building pjdfstest 0.2.2 from crates.io (once, into target/pjdfstest)" >&2
    if ! cargo install --quiet --locked pjdfstest --version 0.2.2 --root "$repo/target/pjdfstest" >&2; then
        echo "conformance: pjdfstest could not be built (exit 3: environment, not a finding)" >&2
        exit 3
    fi
    pjd=$repo/target/pjdfstest/bin/pjdfstest
fi

# --- intentfs ----------------------------------------------------------------------------
bin=${INTENTFS_BIN:-}
if [ -z "$bin" ]; then
    cargo build --quiet --manifest-path "$repo/Cargo.toml" --bin intentfs >&2
    bin=$repo/target/debug/intentfs
fi

# --- work directory ----------------------------------------------------------------------
if [ -n "${CONFORMANCE_DIR:-}" ]; then
    work=$CONFORMANCE_DIR
    mkdir -p "$work"
    keep=1
else
    work=$(mktemp -d /tmp/intentfs-conformance.XXXXXX)
    keep=0
fi
# pjdfstest's other users must be able to reach the test directories.
chmod 755 "$work"
rm -rf "$work/native" "$work/ws" "$work/mnt"
mkdir -p "$work/native" "$work/ws/.orchestration" "$work/mnt"
cp "$repo/policies/allow-all.yaml" "$work/ws/.orchestration/active_intents.yaml"

daemon=
cleanup() {
    if grep -q " $work/mnt " /proc/mounts 2>/dev/null; then
        fusermount3 -u "$work/mnt" 2>/dev/null || fusermount -u "$work/mnt" 2>/dev/null \
            || umount -l "$work/mnt" 2>/dev/null || true
    fi
    if [ -n "$daemon" ]; then
        kill "$daemon" 2>/dev/null || true
        wait "$daemon" 2>/dev/null || true
    fi
    if [ "$keep" = 0 ]; then rm -rf "$work"; fi
}
trap cleanup EXIT

"$bin" mount "$work/ws" "$work/mnt" --intent ALL --agent pjdfstest --approver allow \
    --allow-other --breaker 0 --foreground 2>"$work/daemon.log" &
daemon=$!
for _ in $(seq 1 200); do
    grep -q " $work/mnt " /proc/mounts && break
    sleep 0.1
done
if ! grep -q " $work/mnt " /proc/mounts; then
    echo "conformance: the mount did not come up:" >&2
    cat "$work/daemon.log" >&2
    exit 2
fi
mkdir "$work/mnt/t"

# --- run ---------------------------------------------------------------------------------
run() { # dir log
    (cd "$1" && "$pjd" -c "$here/pjdfstest.toml" -p "$1" ${PJDFSTEST_FILTER:-} >"$2" 2>&1) || true
}
run "$work/native" "$work/native.log"
run "$work/mnt/t" "$work/mount.log"

# "name   ok|FAILED|skipped" -> "name status", sorted.
results() {
    grep -E '^[A-Za-z0-9_:]+ +(ok|FAILED|skipped)$' "$1" | awk '{print $1, $2}' | sort
}
results "$work/native.log" >"$work/native.results"
results "$work/mount.log" >"$work/mount.results"

count() { grep -c " $2\$" "$1" || true; }
for side in native mount; do
    f=$work/$side.results
    printf 'pjdfstest %-6s %s passed, %s failed, %s skipped, %s total\n' "$side:" \
        "$(count "$f" ok)" "$(count "$f" FAILED)" "$(count "$f" skipped)" "$(wc -l <"$f")"
done

# Expected differences: pattern<TAB>reason.
patterns=()
reasons=()
while IFS=$'\t' read -r pat reason; do
    case "$pat" in '' | '#'*) continue ;; esac
    patterns+=("$pat")
    reasons+=("$reason")
done <"$here/expected-differences.txt"

declare -A mount_status
while read -r name st; do mount_status[$name]=$st; done <"$work/mount.results"

unexpected=0
expected=0
declare -A pattern_hits
while read -r name st; do
    [ "$st" = ok ] || continue
    got=${mount_status[$name]:-missing}
    [ "$got" = ok ] && continue
    matched=
    for i in "${!patterns[@]}"; do
        # shellcheck disable=SC2053
        if [[ $name == ${patterns[$i]} ]]; then matched=$i; break; fi
    done
    if [ -n "$matched" ]; then
        expected=$((expected + 1))
        pattern_hits[$matched]=$((${pattern_hits[$matched]:-0} + 1))
    else
        unexpected=$((unexpected + 1))
        echo "UNEXPECTED: $name: native ok, mount $got"
        # The assertion pjdfstest printed for it.
        { grep -A2 -E "^$name +FAILED" "$work/mount.log" || true; } | sed -n '2p' | sed 's/^/    /'
    fi
done <"$work/native.results"
for i in "${!patterns[@]}"; do
    echo "expected difference: ${pattern_hits[$i]:-0} case(s) '${patterns[$i]}': ${reasons[$i]}"
done
# Passing on the mount but not natively is not a conformance problem; say it anyway.
while read -r name st; do
    [ "$st" = ok ] || continue
    nat=$({ grep -E "^$name " "$work/native.results" || true; } | awk '{print $2}')
    [ "$nat" = ok ] || echo "note: $name passes on the mount, native: ${nat:-missing}"
done <"$work/mount.results"
echo "differences: $expected expected, $unexpected unexpected"
if [ "$keep" = 1 ]; then echo "logs: $work/native.log $work/mount.log $work/daemon.log"; fi
[ "$unexpected" = 0 ]
