#!/usr/bin/env bash
# What one command costs in FUSE requests: runs CMD in DIR (on a FUSE mount) and prints,
# per opcode, how many requests the kernel sent and how long each took from send to
# reply (the fuse:fuse_request_send and fuse:fuse_request_end tracepoints). Only the
# requests of DIR's mount are counted.
#
# Usage: sudo bench/requests.sh DIR CMD...
#   e.g. sudo bench/requests.sh /tmp/mnt/tree 'find . | wc -l'
# Needs root and tracefs (mounted at /sys/kernel/tracing if it is not).
set -euo pipefail
export LC_ALL=C

if (($# < 2)) || [[ $1 == -h || $1 == --help ]]; then
    sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'
    exit $(($# < 2 ? 2 : 0))
fi
((EUID == 0)) || { echo "bench/requests.sh needs root (tracefs): sudo $0 $*" >&2; exit 1; }
dir=$1
shift
[[ -d $dir ]] || { echo "no directory $dir" >&2; exit 2; }
# The tracepoints name the connection by the superblock's device number (major << 20 |
# minor inside the kernel).
conn=$(stat -c '%Hd %Ld' "$dir" | awk '{print $1 * 1048576 + $2}')

T=/sys/kernel/tracing
if [[ ! -e $T/events/fuse ]]; then
    mountpoint -q "$T" || mount -t tracefs nodev "$T" ||
        { echo "cannot mount tracefs at $T" >&2; exit 1; }
fi
[[ -e $T/events/fuse/fuse_request_send ]] ||
    { echo "this kernel has no fuse tracepoints ($T/events/fuse)" >&2; exit 1; }

restore() {
    echo 0 >"$T/tracing_on"
    echo 0 >"$T/events/fuse/fuse_request_send/enable"
    echo 0 >"$T/events/fuse/fuse_request_end/enable"
}
trap restore EXIT
restore
echo >"$T/trace"
echo 131072 >"$T/buffer_size_kb"
echo 1 >"$T/events/fuse/fuse_request_send/enable"
echo 1 >"$T/events/fuse/fuse_request_end/enable"
echo 1 >"$T/tracing_on"
t0=$(date +%s%N)
rc=0
(cd "$dir" && eval "$*" >/dev/null) || rc=$?
t1=$(date +%s%N)
echo 0 >"$T/tracing_on"
echo "$* : $(((t1 - t0) / 1000000)) ms (exit $rc)"
python3 - "$T/trace" "$conn" <<'PY'
import collections, re, signal, sys
signal.signal(signal.SIGPIPE, signal.SIG_DFL)
send, lat, lost = {}, collections.defaultdict(list), 0
pat = re.compile(r"\s(\d+\.\d+): fuse_request_(send|end): connection (\d+) req (\d+)(?: opcode \d+ \((\w+)\))?")
for line in open(sys.argv[1]):
    if "LOST" in line:
        lost += 1
    m = pat.search(line)
    if not m:
        continue
    if m.group(3) != sys.argv[2]:
        continue
    t, kind, key = float(m.group(1)), m.group(2), m.group(4)
    if kind == "send":
        send[key] = (t, m.group(5))
    elif key in send:
        t0, op = send.pop(key)
        lat[op].append(t - t0)
total = sum(len(v) for v in lat.values())
print(f"{'opcode':22s} {'requests':>9s} {'mean µs':>9s} {'total ms':>9s}")
for op, v in sorted(lat.items(), key=lambda kv: -sum(kv[1])):
    print(f"{op:22s} {len(v):9d} {1e6 * sum(v) / len(v):9.1f} {1e3 * sum(v):9.1f}")
print(f"{'all':22s} {total:9d}")
if total == 0:
    print(f"(no request reached this mount, connection {sys.argv[2]}: is DIR on a FUSE mount, and was it all cached?)")
if send:
    print(f"({len(send)} requests without a reply in the window: FORGETs, or still pending)")
if lost:
    print("warning: the trace buffer overflowed; counts are short", file=sys.stderr)
PY
exit "$rc"
