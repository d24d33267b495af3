#!/usr/bin/env bash
# What the audit ledger costs (issue 4's benchmark; not a timed test).
#
#  1. Latency of `echo x > f` (open + write + close: the WRITE entry is made durable before
#     close returns) through an intentfs mount vs the same in a native directory, over
#     ITERATIONS runs: with hyperfine when installed, else a bash loop timed with
#     `date +%s%N` (plus per-iteration percentiles from $EPOCHREALTIME when bash has it).
#  2. Ledger entries per second sustained by 4 parallel writers for SECONDS seconds.
#
# Usage: bench/ledger_close.sh [ITERATIONS=2000] [SECONDS=10]
# Env:   INTENTFS=path/to/intentfs (default: target/release/intentfs, else target/debug)
#        BENCH_DIR=where to make the temp workspace (default: $TMPDIR or /tmp; its
#        filesystem decides what the ledger's fdatasync costs).
# Needs root or user_allow_other-free FUSE (like the tests), and /dev/fuse.
set -euo pipefail
export LC_ALL=C

N=${1:-2000}
D=${2:-10}
WRITERS=4
root=$(cd "$(dirname "$0")/.." && pwd)

BIN=${INTENTFS:-}
if [[ -z $BIN ]]; then
    for c in "$root/target/release/intentfs" "$root/target/debug/intentfs"; do
        if [[ -x $c ]]; then BIN=$c; break; fi
    done
fi
[[ -n $BIN && -x $BIN ]] || { echo "no intentfs binary: run 'cargo build --release' or set INTENTFS" >&2; exit 1; }
[[ $BIN == *debug* ]] && echo "warning: $BIN is a debug build; the numbers are pessimistic" >&2

tmp=$(mktemp -d "${BENCH_DIR:-${TMPDIR:-/tmp}}/intentfs-bench.XXXXXX")
ws=$tmp/ws mnt=$tmp/mnt native=$tmp/native
ledger=$ws/.orchestration/agent_trace.jsonl
mkdir -p "$ws/.orchestration" "$mnt" "$native"
cp "$root/policies/allow-all.yaml" "$ws/.orchestration/active_intents.yaml"

"$BIN" mount --foreground --intent ALL --agent bench "$ws" "$mnt" 2>"$tmp/daemon.log" &
daemon=$!
cleanup() {
    if grep -q " $mnt " /proc/mounts; then
        "$BIN" umount "$mnt" >/dev/null 2>&1 || umount -l "$mnt" 2>/dev/null || true
    fi
    wait "$daemon" 2>/dev/null || true
    rm -rf "$tmp"
}
trap cleanup EXIT
for _ in $(seq 200); do [[ -e $mnt/.intentfs/status ]] && break; sleep 0.05; done
[[ -e $mnt/.intentfs/status ]] || { echo "the mount did not come up:" >&2; cat "$tmp/daemon.log" >&2; exit 1; }

fs_type=$(stat -f -c %T "$ws")
echo "intentfs: $BIN"
echo "workspace: $ws ($fs_type), $(nproc) CPUs"
echo

# ----- 1. close() latency -----------------------------------------------------------------

# loop DIR: N x `echo x > DIR/f` in this shell (no fork per iteration); prints
# "mean_us p50_us p99_us" (percentiles "-" without $EPOCHREALTIME).
loop() {
    local dir=$1 i t0 t1 start end
    local -a d=()
    for ((i = 0; i < 50; i++)); do echo x >"$dir/f"; done # warm-up
    if [[ -n ${EPOCHREALTIME:-} ]]; then
        start=$(date +%s%N)
        for ((i = 0; i < N; i++)); do
            t0=$EPOCHREALTIME
            echo x >"$dir/f"
            t1=$EPOCHREALTIME
            d+=($((${t1/./} - ${t0/./})))
        done
        end=$(date +%s%N)
        printf '%s\n' "${d[@]}" | sort -n |
            awk -v mean="$(((end - start) / N / 1000))" \
                '{ a[NR] = $1 } END { printf "%d %d %d\n", mean, a[int(NR * 0.5)], a[int(NR * 0.99)] }'
    else
        start=$(date +%s%N)
        for ((i = 0; i < N; i++)); do echo x >"$dir/f"; done
        end=$(date +%s%N)
        echo "$(((end - start) / N / 1000)) - -"
    fi
}

echo "== close() latency: echo x > f, $N iterations =="
if command -v hyperfine >/dev/null; then
    hyperfine -N --warmup 50 --runs "$N" \
        -n native "sh -c 'echo x > $native/f'" \
        -n intentfs "sh -c 'echo x > $mnt/f'"
    echo "(hyperfine times include starting sh; the difference is the mount's cost)"
else
    e0=$(wc -l <"$ledger")
    read -r n_mean n_p50 n_p99 < <(loop "$native")
    read -r m_mean m_p50 m_p99 < <(loop "$mnt")
    e1=$(wc -l <"$ledger")
    printf '%-10s %10s %10s %10s\n' "" "mean µs" "p50 µs" "p99 µs"
    printf '%-10s %10s %10s %10s\n' native "$n_mean" "$n_p50" "$n_p99"
    printf '%-10s %10s %10s %10s\n' intentfs "$m_mean" "$m_p50" "$m_p99"
    echo "added by the mount + ledger: $((m_mean - n_mean)) µs per echo (mean)"
    awk -v e="$((e1 - e0))" -v n="$((N + 50))" \
        'BEGIN { printf "ledger entries per echo: %.2f (%d entries)\n", e / n, e }'
fi
echo

# ----- 2. sustained entries per second --------------------------------------------------

echo "== $WRITERS parallel writers for ${D} s =="
for k in $(seq "$WRITERS"); do mkdir -p "$mnt/w$k"; done
e0=$(wc -l <"$ledger")
t0=$(date +%s%N)
pids=()
for k in $(seq "$WRITERS"); do
    (
        i=0
        SECONDS=0
        while ((SECONDS < D)); do
            echo "writer $k op $i" >"$mnt/w$k/f$((i % 100))"
            i=$((i + 1))
        done
        echo "$i" >"$tmp/ops$k"
    ) &
    pids+=($!)
done
wait "${pids[@]}"
t1=$(date +%s%N)
e1=$(wc -l <"$ledger")
ops=0
for k in $(seq "$WRITERS"); do ops=$((ops + $(cat "$tmp/ops$k"))); done
awk -v e="$((e1 - e0))" -v ops="$ops" -v ns="$((t1 - t0))" 'BEGIN {
    s = ns / 1e9
    printf "%d writes (echo > f) in %.2f s: %.0f ops/s, %d ledger entries: %.0f entries/s\n", ops, s, ops / s, e, e / s
}'

"$BIN" umount "$mnt" >/dev/null
wait "$daemon" 2>/dev/null || true
if "$BIN" ledger verify --ledger "$ledger" >"$tmp/verify.txt"; then
    echo "ledger: $(grep '^chain:' "$tmp/verify.txt")"
else
    echo "ledger verify FAILED:" >&2
    cat "$tmp/verify.txt" >&2
    exit 1
fi
