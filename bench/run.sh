#!/usr/bin/env bash
# Side-by-side benchmark of intentfs (issue 6): the same workloads on the native directory,
# on an intentfs mount with governance on (intent ALL covering the tree, ledger on) and on
# bindfs (when installed), interleaved per workload and round; medians and ratios to
# native. A program you run and read, not a test: it asserts no timing.
#
# Usage: sudo bench/run.sh [--rounds N] [--copies K] [--quick] [--seq-mib M] [--files F]
#                          [--with-bindfs | --no-bindfs] [--low-latency] [--keep]
#                          [--fs image|dir]
#   --rounds N      rounds per workload (default 5); the table shows medians over them
#   --copies K      copies of the source tree unpacked by `tar x` (default 4)
#   --seq-mib M     size of the sequential write/read file (default 512)
#   --files F       files to take from the cargo registry sources (default 4700)
#   --quick         = --rounds 1 --copies 1 --seq-mib 64 (smoke test)
#   --with-bindfs   apt-get install -y bindfs when missing (the only thing it installs)
#   --no-bindfs     skip bindfs even when installed
#   --low-latency   mount intentfs with --low-latency (idle CPUs poll while requests flow)
#   --keep          keep the temp directory (logs, results.tsv) for inspection
#   --fs image      (default) native, workspace and bindfs directories on a fresh ext4
#                   (journaled, mkfs defaults) in a sparse image file, loop-mounted for
#                   the run: every target starts from the same clean filesystem state
#   --fs dir        directories straight on the filesystem of BENCH_DIR (on an ext4
#                   without a journal, creating files after mass deletions is slow for
#                   minutes and moves native times tenfold; see bench/README.md)
# Env: INTENTFS=path/to/intentfs (default target/release/intentfs), INTENTFS_MOUNT_ARGS=extra
#      `intentfs mount` options (e.g. "--threads 8"), BENCH_DIR=where to make
#      the temp directory (default $TMPDIR or /tmp; native, workspace and bindfs backing
#      directories are all on that filesystem), CARGO_HOME (registry sources for the tree).
# Needs root (mounts, drop_caches) and /dev/fuse. See bench/README.md.
set -uo pipefail
export LC_ALL=C

ROUNDS=5 COPIES=4 SEQ_MIB=512 FILES=4700 BINDFS=auto KEEP=0 FS=image
while (($#)); do
    case $1 in
    --rounds) ROUNDS=$2; shift ;;
    --copies) COPIES=$2; shift ;;
    --seq-mib) SEQ_MIB=$2; shift ;;
    --files) FILES=$2; shift ;;
    --quick) ROUNDS=1 COPIES=1 SEQ_MIB=64 ;;
    --with-bindfs) BINDFS=install ;;
    --no-bindfs) BINDFS=no ;;
    --low-latency) INTENTFS_MOUNT_ARGS="${INTENTFS_MOUNT_ARGS:-} --low-latency" ;;
    --keep) KEEP=1 ;;
    --fs) FS=$2; shift ;;
    -h | --help) sed -n '2,/^set -uo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) echo "unknown argument: $1 (see --help)" >&2; exit 2 ;;
    esac
    shift
done
[[ $FS == image || $FS == dir ]] || { echo "--fs must be image or dir, not '$FS'" >&2; exit 2; }
for v in ROUNDS COPIES SEQ_MIB FILES; do
    [[ ${!v} =~ ^[1-9][0-9]*$ ]] || { echo "$v must be a positive integer" >&2; exit 2; }
done
((EUID == 0)) || { echo "bench/run.sh needs root (it mounts and drops caches): sudo $0 $*" >&2; exit 1; }
[[ -c /dev/fuse ]] || { echo "no /dev/fuse" >&2; exit 1; }

root=$(cd "$(dirname "$0")/.." && pwd)
BIN=${INTENTFS:-}
if [[ -z $BIN ]]; then
    for c in "$root/target/release/intentfs" "$root/target/debug/intentfs"; do
        [[ -x $c ]] && { BIN=$c; break; }
    done
fi
[[ -n $BIN && -x $BIN ]] || { echo "no intentfs binary: run 'cargo build --release' or set INTENTFS" >&2; exit 1; }
[[ $BIN == *debug* ]] && echo "warning: $BIN is a debug build; the numbers are pessimistic" >&2

if [[ $BINDFS == install ]] && ! command -v bindfs >/dev/null; then
    echo "installing bindfs..."
    apt-get install -y bindfs >/dev/null 2>&1 || { apt-get update -qq && apt-get install -y bindfs >/dev/null; } ||
        echo "warning: could not install bindfs; going on without it" >&2
fi
HAVE_BINDFS=0
[[ $BINDFS != no ]] && command -v bindfs >/dev/null && HAVE_BINDFS=1
if command -v rg >/dev/null; then RG="rg -c fn ."; else RG="grep -r -c fn ."; fi

# ----- directories, source tree ------------------------------------------------------------

tmp=$(mktemp -d "${BENCH_DIR:-${TMPDIR:-/tmp}}/intentfs-bench.XXXXXX")
tmp=$(cd "$tmp" && pwd -P)
logs=$tmp/logs res=$tmp/results.tsv
mkdir -p "$logs" "$tmp/mnt" "$tmp/bmnt"
: >"$res"
# Where native/, ws/ (the workspace) and bws/ (bindfs's backing) live: $fs.
fs=$tmp
if [[ $FS == image ]]; then
    if command -v mkfs.ext4 >/dev/null && [[ -e /dev/loop-control ]]; then
        # Sparse: only what the run writes takes room. Inode tables and the journal are
        # written now, not by a background thread during the run.
        size_mib=$((SEQ_MIB * 3 + COPIES * 3 * 200 + 2048))
        truncate -s "${size_mib}M" "$tmp/fs.img" &&
            mkfs.ext4 -q -F -E lazy_itable_init=0,lazy_journal_init=0 "$tmp/fs.img" &&
            mkdir -p "$tmp/fs" && mount -o loop "$tmp/fs.img" "$tmp/fs" && fs=$tmp/fs ||
            { echo "warning: could not make and mount an ext4 image; using --fs dir" >&2; FS=dir; }
        # Direct I/O from the loop device to the image: no second page cache of the image
        # file below the filesystem, so an fsync waits for the disk as it would natively
        # (without it, the first fsync after a busy workload wrote out the image file's
        # dirty pages: native seq_write 1.5 s instead of 0.1-0.2).
        if [[ $FS == image ]]; then
            losetup --direct-io=on "$(findmnt -n -o SOURCE "$tmp/fs")" 2>/dev/null ||
                echo "warning: the loop device runs without direct I/O: fsync times include the image file's page cache" >&2
        fi
    else
        echo "warning: no mkfs.ext4 or loop devices; using --fs dir" >&2
        FS=dir
    fi
fi
mkdir -p "$fs/native" "$fs/ws/.orchestration" "$fs/bws"
# policies/allow-all.yaml (intent ALL, scope **), plus sensitive_read: allow: a real tree
# has files the default sensitive patterns match (objc2-foundation's NSURLCredential.rs
# matches `*credential*`, any case), which --approver deny would refuse to read.
{ cat "$root/policies/allow-all.yaml"; printf 'approval:\n  sensitive_read: allow\n'; } >"$fs/ws/.orchestration/active_intents.yaml"
ledger=$fs/ws/.orchestration/agent_trace.jsonl
mnt=$tmp/mnt bmnt=$tmp/bmnt
DAEMON=

mounted() { grep -q " $1 " /proc/mounts; }
cleanup() {
    if mounted "$mnt"; then "$BIN" umount "$mnt" >/dev/null 2>&1 || umount -l "$mnt" 2>/dev/null; fi
    if mounted "$bmnt"; then fusermount3 -u "$bmnt" 2>/dev/null || umount -l "$bmnt" 2>/dev/null; fi
    if ! mounted "$mnt" && ! mounted "$bmnt" && mounted "$tmp/fs" && ! ((KEEP)); then
        umount "$tmp/fs" 2>/dev/null || umount -l "$tmp/fs" 2>/dev/null
    fi
    if mounted "$mnt" || mounted "$bmnt"; then
        echo "warning: a mount is still up; leaving $tmp in place" >&2
    elif ((KEEP)); then
        echo "kept: $tmp (logs/, results.tsv$(mounted "$tmp/fs" && echo "; $tmp/fs is still mounted: umount it first"))"
        echo "      remove with rm -rf $tmp"
    else
        rm -rf "$tmp"
    fi
}
trap cleanup EXIT
trap 'exit 130' INT TERM

reg=$(ls -d "${CARGO_HOME:-$HOME/.cargo}"/registry/src/*/ 2>/dev/null | head -1)
[[ -n $reg ]] || { echo "no cargo registry sources under ${CARGO_HOME:-$HOME/.cargo}/registry/src" >&2; exit 1; }
# Crates in name order (skipping the few huge ones that are mostly prebuilt import
# libraries) until about FILES files: a real, varied Rust source tree.
crates=() nfiles=0
while read -r c; do
    n=$(find "$reg$c" -type f | wc -l)
    ((n > 1000)) && continue
    crates+=("$c") nfiles=$((nfiles + n))
    ((nfiles >= FILES)) && break
done < <(ls "$reg")
tar -C "$reg" -cf "$tmp/tree.tar" "${crates[@]}"
tree_mib=$(du -sm "$tmp/tree.tar" | cut -f1)
# What `find . | wc -l` must print after the K copies: ".", c1..cK, every tar entry K times.
FIND_WANT=$(($(tar -tf "$tmp/tree.tar" | wc -l) * COPIES + COPIES + 1))

# ----- mounts ------------------------------------------------------------------------------

# shellcheck disable=SC2086 # INTENTFS_MOUNT_ARGS: extra mount options, word-split
"$BIN" mount --intent ALL --approver deny --agent bench ${INTENTFS_MOUNT_ARGS:-} "$fs/ws" "$mnt" >"$logs/mount.out" 2>&1 ||
    { echo "intentfs mount failed:" >&2; cat "$logs/mount.out" >&2; exit 1; }
# The daemon's pid: /run/intentfs/<key>/pid, key = the mountpoint without its leading '/',
# every character but [A-Za-z0-9.-] replaced by '_' (src/cli/runtime.rs).
key=$(printf '%s' "${mnt#/}" | sed 's/[^A-Za-z0-9.-]/_/g')
DAEMON=$(cat "/run/intentfs/$key/pid" 2>/dev/null)
[[ -n $DAEMON ]] && kill -0 "$DAEMON" 2>/dev/null || { echo "no live intentfs daemon pid in /run/intentfs/$key/pid" >&2; exit 1; }
TARGETS=(native intentfs)
declare -A ACC=([native]=$fs/native [intentfs]=$mnt) BACK=([native]=$fs/native [intentfs]=$fs/ws)
if ((HAVE_BINDFS)); then
    if bindfs "$fs/bws" "$bmnt" 2>"$logs/bindfs.err"; then
        TARGETS+=(bindfs) ACC[bindfs]=$bmnt BACK[bindfs]=$fs/bws
    else
        echo "warning: bindfs mount failed: $(cat "$logs/bindfs.err")" >&2
    fi
fi

echo "intentfs:  $BIN ($(git -C "$root" rev-parse --short HEAD 2>/dev/null)$(git -C "$root" diff --quiet HEAD -- src 2>/dev/null || echo ', src modified'))"
echo "machine:   $(nproc) CPUs, $(awk '/MemTotal/ {printf "%.0f GiB", $2/1048576}' /proc/meminfo), $(uname -r), $(stat -f -c %T "$fs") at $fs$([[ $FS == image ]] && echo " (a fresh image, --fs image)")"
echo "tree:      ${#crates[@]} crates from $reg, $nfiles files, $tree_mib MiB; x$COPIES copies"
echo "targets:   ${TARGETS[*]}$( ((HAVE_BINDFS)) || echo ' (bindfs not installed: --with-bindfs)'); $ROUNDS round(s); sequential $SEQ_MIB MiB; search: ${RG%% *}"
[[ -n ${INTENTFS_MOUNT_ARGS:-} ]] && echo "intentfs mount options: ${INTENTFS_MOUNT_ARGS# }"
echo

# ----- measurement helpers -----------------------------------------------------------------

FAILS=() DEAD=0
declare -A LEDGER_DELTA
now_us() { local t=$EPOCHREALTIME; echo "${t/./}"; }
entries() { [[ -f $ledger ]] && wc -l <"$ledger" || echo 0; }
# FUSE requests the intentfs daemon has answered (its status counters). Reading the status
# costs a few requests itself: REQ_SELF, measured below, is taken off each workload's count.
requests() { tr -d ' \n' <"$mnt/.intentfs/status" 2>/dev/null | grep -o '"requests":{[^}]*}' | grep -o '"total":[0-9]*' | cut -d: -f2; }
declare -A REQ_DELTA
q0=$(requests) q1=$(requests)
REQ_SELF=$((${q1:-0} - ${q0:-0}))
alive() { [[ $1 != intentfs ]] || kill -0 "$DAEMON" 2>/dev/null; }

# timed WL TARGET ROUND DIR CMD...: run CMD in DIR, append "WL TARGET ROUND µs" to results
# (or FAIL). With INNER=1 the time is the last line CMD prints (µs), not the wall clock.
timed() {
    local wl=$1 tg=$2 r=$3 dir=$4
    shift 4
    local base=$logs/$wl.$tg.r$r t0 t1 rc e0 e1 q0 q1 us
    if [[ $tg == intentfs ]] && ((DEAD)); then echo "$wl $tg $r FAIL" >>"$res"; return 1; fi
    [[ $tg == intentfs ]] && e0=$(entries) q0=$(requests)
    t0=$(now_us)
    (cd "$dir" && "$@") >"$base.out" 2>"$base.err"
    rc=$?
    t1=$(now_us)
    us=$((t1 - t0))
    ((${INNER:-0})) && us=$(tail -1 "$base.out")
    if [[ $tg == intentfs ]]; then
        e1=$(entries) q1=$(requests)
        LEDGER_DELTA[$wl]+="$((e1 - e0)) "
        [[ -n $q0 && -n $q1 ]] && REQ_DELTA[$wl]+="$((q1 - q0 - REQ_SELF)) "
    fi
    if ((rc != 0)) || ! alive "$tg"; then
        fail "$wl" "$tg" "$r" "exit status $rc" "cd $dir && $*" "$base.err"
        echo "$wl $tg $r FAIL" >>"$res"
        return 1
    fi
    echo "$wl $tg $r $us" >>"$res"
}

# fail WL TARGET ROUND WHY REPRO ERRFILE: remember a failure with a reproduction.
fail() {
    local msg="$1 on $2 (round $3): $4; repro: $5"
    [[ -s ${6:-} ]] && msg+=$'\n      stderr: '"$(tail -3 "$6" | tr '\n' ' ' | cut -c1-300)"
    if [[ $2 == intentfs ]]; then
        if ! kill -0 "$DAEMON" 2>/dev/null; then
            DEAD=1
            msg+=$'\n      the intentfs daemon (pid '"$DAEMON"') is gone: see /run/intentfs/'"$key"'/daemon.log'
        elif [[ -r $mnt/.intentfs/last_error ]]; then
            msg+=$'\n      last_error: '"$(tr -d '\n' <"$mnt/.intentfs/last_error" | cut -c1-300)"
        fi
    fi
    FAILS+=("$msg")
    echo "  FAILED: $msg" >&2
}

# check WL TARGET ROUND WHAT GOT WANT: a result that differs from native's is a failure.
check() {
    [[ $5 == "$6" ]] || fail "$1" "$2" "$3" "$4: got '$5', native got '$6'" "see $logs/$1.$2.r$3.out"
}

drop_caches() { sync; echo 3 >/proc/sys/vm/drop_caches 2>/dev/null; }
CAN_DROP=1
drop_caches || { CAN_DROP=0; echo "warning: cannot write /proc/sys/vm/drop_caches: 'cold' reads are not cold" >&2; }

# ----- workloads (each runs with its fresh directory as cwd) -------------------------------

wl_untar() { local k; for ((k = 1; k <= COPIES; k++)); do mkdir "c$k" && tar -xf "$tmp/tree.tar" -C "c$k" || return; done; }
wl_find() { find . | wc -l; }
wl_du() { du -s . | cut -f1; }
wl_rg() { $RG; (($? <= 1)); }
wl_git_status() { git status; }
wl_seq_write() { dd if=/dev/zero of=f bs=1M count="$SEQ_MIB" conv=fsync status=none; }
wl_seq_read() { dd if=f of=/dev/null bs=1M status=none; }
wl_rm() { rm -rf tree; }
wl_build() { CARGO_TARGET_DIR=$PWD/target cargo build --offline -q; }

# The edit loop: 200 x (read a file, write it in place, write a temp file and rename it
# over another). "setup" makes the 20 files it edits; "loop" prints its own time in µs
# (so python's start-up, the same everywhere, is not counted).
read -r -d '' EDIT_PY <<'EOF'
import os, sys, time
files = ["f%02d.rs" % i for i in range(20)]
if sys.argv[1] == "setup":
    body = "".join("pub fn item_%d(x: u64) -> u64 { x.wrapping_mul(%d) ^ 0x5a }\n" % (i, i) for i in range(150))
    for f in files:
        with open(f, "w") as h:
            h.write(body)
    sys.exit(0)
t0 = time.perf_counter_ns()
for i in range(200):
    p = files[i % 20]
    with open(p, "rb") as h:
        data = h.read()
    with open(p, "r+b") as h:          # write in place
        h.write(data.replace(b"0x5a", b"0x%02x" % (i % 256), 1))
        h.truncate()
    q = files[(i + 7) % 20]              # write a temp file, rename it over the original
    with open(q, "rb") as h:
        data = h.read()
    with open(q + ".tmp", "wb") as h:
        h.write(data + b"// edit %d\n" % i)
    os.rename(q + ".tmp", q)
print((time.perf_counter_ns() - t0) // 1000)
EOF
wl_edit() { python3 -I -c "$EDIT_PY" "$1"; }

# A tiny dependency-free crate: one lib of generated code (~1 s of rustc in debug).
make_crate() {
    mkdir -p src
    printf '[package]\nname = "benchcrate"\nversion = "0.1.0"\nedition = "2021"\n\n[dependencies]\n' >Cargo.toml
    {
        echo "use std::collections::HashMap;"
        for i in $(seq 0 119); do
            cat <<EOF
#[derive(Debug, Clone, Default, PartialEq)]
pub struct S$i { pub a: u64, pub b: String, pub c: Vec<u32> }
impl S$i {
    pub fn score(&self, m: &HashMap<String, u64>) -> u64 {
        let mut t = self.a.wrapping_mul($i);
        for (k, v) in m.iter() { if k.len() > self.c.len() { t ^= v.rotate_left($i % 63); } }
        match self.b.as_str() { "x" => t + 1, "y" => t * 3, _ => t / 2 + self.c.iter().map(|&x| x as u64).sum::<u64>() }
    }
}
EOF
        done
    } >src/lib.rs
}

# ----- rounds ------------------------------------------------------------------------------

declare -A NATIVE_OUT
RSS_WALK=
for ((r = 1; r <= ROUNDS; r++)); do
    echo "round $r/$ROUNDS"
    for tg in "${TARGETS[@]}"; do mkdir -p "${ACC[$tg]}/r$r/tree"; done
    cat "$tmp/tree.tar" >/dev/null # in the page cache for every target alike

    for tg in "${TARGETS[@]}"; do timed tar_x "$tg" "$r" "${ACC[$tg]}/r$r/tree" wl_untar; sync; done
    for wl in find du rg; do
        for tg in "${TARGETS[@]}"; do
            timed "$wl" "$tg" "$r" "${ACC[$tg]}/r$r/tree" "wl_$wl" || continue
            out=$logs/$wl.$tg.r$r.out
            case $wl in
            find) got=$(cat "$out") ;;
            du) got=$(cat "$out") ;;
            rg) got=$(awk -F: '{ s += $NF } END { print NR, s }' "$out") ;;
            esac
            if [[ $tg == native ]]; then NATIVE_OUT[$wl]=$got
            elif [[ $wl != du ]]; then check "$wl" "$tg" "$r" "output" "$got" "${NATIVE_OUT[$wl]:-}"
            fi
        done
        if [[ $wl == find && -n ${NATIVE_OUT[find]:-} && ${NATIVE_OUT[find]} != "$FIND_WANT" ]]; then
            fail find native "$r" "find counted ${NATIVE_OUT[find]} entries, the tar holds $FIND_WANT" "see $logs/find.native.r$r.out"
        fi
    done
    # the daemon's peak RSS after the first walk (find, du, rg)
    [[ -z $RSS_WALK ]] && RSS_WALK=$(awk '/VmHWM/ { print $2 }' "/proc/$DAEMON/status" 2>/dev/null)

    # rm -rf of the unpacked copies, while their metadata is still cached (as after tar x).
    # Each target starts with nothing dirty: on a journaled ext4 a commit writes out the
    # data of every file in the transaction, so whoever fsyncs or fills the journal first
    # would pay for the targets before it (native seq_write took 1,068 ms after the build
    # left its output dirty, 165-294 ms after a sync). Untimed.
    for tg in "${TARGETS[@]}"; do sync; timed rm_rf "$tg" "$r" "${ACC[$tg]}/r$r" wl_rm; done

    # git status in a repo made of one copy, committed natively in the backing directory.
    for tg in "${TARGETS[@]}"; do
        g=${BACK[$tg]}/r$r/git
        mkdir -p "$g" && tar -xf "$tmp/tree.tar" -C "$g" &&
            git -C "$g" init -q && git -C "$g" add -A &&
            git -C "$g" -c user.name=bench -c user.email=bench@localhost commit -q -m tree ||
            { fail git_status "$tg" "$r" "setup failed" "git init/add/commit in $g"; continue; }
    done
    # Cold (the first look at a repo made behind the mount), then warm (as an agent runs it
    # again and again).
    for wl in git_status git_status_warm; do
        for tg in "${TARGETS[@]}"; do
            timed "$wl" "$tg" "$r" "${ACC[$tg]}/r$r/git" wl_git_status || continue
            grep -q 'nothing to commit, working tree clean' "$logs/$wl.$tg.r$r.out" ||
                fail "$wl" "$tg" "$r" "the tree is not clean through $tg" "cd ${ACC[$tg]}/r$r/git && git status" "$logs/$wl.$tg.r$r.out"
        done
    done

    for tg in "${TARGETS[@]}"; do
        d=${ACC[$tg]}/r$r/edit
        mkdir -p "$d" && (cd "$d" && wl_edit setup) || { fail edit_loop "$tg" "$r" "setup failed" "cd $d && python3"; continue; }
        INNER=1 timed edit_loop "$tg" "$r" "$d" wl_edit loop
    done

    for tg in "${TARGETS[@]}"; do
        d=${ACC[$tg]}/r$r/build
        mkdir -p "$d" && (cd "$d" && make_crate) || { fail build "$tg" "$r" "setup failed" "make_crate in $d"; continue; }
        sync
        timed build "$tg" "$r" "$d" wl_build
    done

    # Last in the round: it drops the page cache for the cold read.
    for tg in "${TARGETS[@]}"; do
        d=${ACC[$tg]}/r$r/seq
        mkdir -p "$d"
        sync
        timed seq_write "$tg" "$r" "$d" wl_seq_write || continue
        drop_caches
        timed seq_read_cold "$tg" "$r" "$d" wl_seq_read
        timed seq_read_warm "$tg" "$r" "$d" wl_seq_read
        rm -f "$d/f"
    done

    for tg in "${TARGETS[@]}"; do rm -rf "${ACC[$tg]}/r$r"; done # untimed
done

# ----- report ------------------------------------------------------------------------------

RSS_END=$(awk '/VmHWM/ { print $2 }' "/proc/$DAEMON/status" 2>/dev/null)
RSS_NOW=$(awk '/VmRSS/ { print $2 }' "/proc/$DAEMON/status" 2>/dev/null)
CPU=$(awk '{ printf "%.1f", ($14 + $15) / '"$(getconf CLK_TCK)"' }' "/proc/$DAEMON/stat" 2>/dev/null)

# median WL TARGET: median µs over the rounds that succeeded ("" when none did).
median() {
    awk -v w="$1" -v t="$2" '$1 == w && $2 == t && $4 != "FAIL" { print $4 }' "$res" | sort -n |
        awk '{ a[NR] = $1 } END { if (NR) print (NR % 2 ? a[(NR + 1) / 2] : (a[NR / 2] + a[NR / 2 + 1]) / 2) }'
}
nfail() { awk -v w="$1" -v t="$2" '$1 == w && $2 == t && $4 == "FAIL"' "$res" | wc -l; }
ms() { [[ -n $1 ]] && awk -v u="$1" 'BEGIN { printf(u >= 100000 ? "%.0f" : "%.1f", u / 1000) }' || echo "-"; }
ratio() { [[ -n $1 && -n $2 ]] && awk -v a="$1" -v b="$2" 'BEGIN { printf "%.2fx", (b > 0 ? a / b : 0) }' || echo "-"; }
medlist() { tr ' ' '\n' <<<"$1" | grep . | sort -n | awk '{ a[NR] = $1 } END { if (NR) print a[int((NR + 1) / 2)] }'; }

declare -A GOAL=([tar_x]=4 [find]=1.5 [du]=1.5 [rg]=2.5 [git_status]=1.5 [git_status_warm]=1.5 [edit_loop]=2.5
    [seq_write]=1.1 [seq_read_cold]=1.1 [seq_read_warm]=1.1 [rm_rf]=3 [build]=1.1)
WLS=(tar_x find du rg git_status git_status_warm edit_loop seq_write seq_read_cold seq_read_warm rm_rf build)

echo
printf '%-14s %11s %11s %8s %11s %8s %7s %5s %8s %9s %8s\n' workload "native ms" "intentfs ms" ratio "bindfs ms" ratio target met ledger requests "+µs/req"
for wl in "${WLS[@]}"; do
    n=$(median "$wl" native) i=$(median "$wl" intentfs) b=
    ((HAVE_BINDFS)) && [[ -n ${ACC[bindfs]:-} ]] && b=$(median "$wl" bindfs)
    ri=$(ratio "$i" "$n") rb=$(ratio "$b" "$n")
    met=-
    if [[ -n $i && -n $n ]]; then
        met=$(awk -v a="$i" -v n="$n" -v g="${GOAL[$wl]}" -v b="${b:-}" \
            'BEGIN { ok = a / n <= g; if (b != "") ok = ok && a < b; print ok ? "yes" : "NO" }')
    fi
    f=$(nfail "$wl" intentfs)
    ((f)) && ri="FAIL($f)"
    q=$(medlist "${REQ_DELTA[$wl]:-}")
    per=$([[ -n $q && -n $i && -n $n ]] && awk -v a="$i" -v n="$n" -v q="$q" 'BEGIN { printf(q > 0 ? "%.1f" : "-", (a - n) / q) }' || echo -)
    printf '%-14s %11s %11s %8s %11s %8s %7s %5s %8s %9s %8s\n' "$wl" "$(ms "$n")" "$(ms "$i")" "$ri" "$(ms "$b")" "$rb" \
        "<=${GOAL[$wl]}x" "$met" "$(medlist "${LEDGER_DELTA[$wl]:-}")" "${q:--}" "$per"
done
echo "(medians over $ROUNDS round(s); 'met' = ratio within target and, with bindfs, faster than bindfs;"
echo " ledger = entries the intentfs run of the workload added, median; requests = FUSE requests the daemon"
echo " answered for it, median; +µs/req = (intentfs - native) / requests, the cost of the mount per request;"
echo " seq = $SEQ_MIB MiB$( ((CAN_DROP)) || echo ', cold reads NOT cold'))"
echo
echo "intentfs daemon (pid $DAEMON): peak RSS $(awk -v k="${RSS_WALK:-0}" 'BEGIN { printf "%.1f", k / 1024 }') MiB after walking" \
    "$((nfiles * COPIES)) files (round 1), $(awk -v k="${RSS_END:-0}" 'BEGIN { printf "%.1f", k / 1024 }') MiB at the end" \
    "(VmRSS now $(awk -v k="${RSS_NOW:-0}" 'BEGIN { printf "%.1f", k / 1024 }') MiB; target < 100 MiB after 50,000 files); CPU ${CPU:-?} s"

"$BIN" umount "$mnt" >"$logs/umount.out" 2>&1 || fail umount intentfs - "intentfs umount failed" "$BIN umount $mnt" "$logs/umount.out"
echo "ledger: $(entries) entries"
if "$BIN" ledger verify --ledger "$ledger" >"$logs/verify.txt" 2>&1; then
    echo "ledger verify: $(grep -m1 '^chain:' "$logs/verify.txt" || tail -1 "$logs/verify.txt")"
else
    fail ledger_verify intentfs - "intentfs ledger verify failed" "$BIN ledger verify --ledger $ledger" "$logs/verify.txt"
fi

if ((${#FAILS[@]})); then
    echo
    echo "FAILURES (${#FAILS[@]}):"
    for f in "${FAILS[@]}"; do echo "  - $f"; done
    KEEP=1
    exit 1
fi
