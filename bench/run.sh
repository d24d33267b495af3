#!/usr/bin/env bash
# Side-by-side benchmark of intentfs (issue 6): the same workloads on the native directory,
# on an intentfs mount with governance on (intent ALL covering the tree, ledger on), on
# bindfs (when installed) and on libfuse's passthrough_hp in its four modes (the fastest
# FUSE passthrough there is, no governance: the limit a FUSE daemon can reach here),
# interleaved per workload and round; medians and ratios to native. A program you run and
# read, not a test: it asserts no timing.
#
# Usage: sudo bench/run.sh [--rounds N] [--copies K] [--quick] [--seq-mib M] [--files F]
#                          [--with-bindfs | --no-bindfs] [--with-peers | --no-peers]
#                          [--low-latency] [--keep] [--fs image|dir] [--versions on|off|both]
#   --rounds N      rounds per workload (default 5); the table shows medians over them
#   --copies K      copies of the source tree unpacked by `tar x` (default 4)
#   --seq-mib M     size of the sequential write/read file (default 512)
#   --files F       files to take from the cargo registry sources (default 4700)
#   --quick         = --rounds 1 --copies 1 --seq-mib 64, round trips of 5,000 calls
#                   (smoke test)
#   --with-bindfs   apt-get install -y bindfs when missing
#   --no-bindfs     skip bindfs even when installed
#   --no-uring      skip intentfs-uring (intentfs mounted with --transport io-uring, beside
#                   the /dev/fuse mount; it runs when enable_uring can be set, and is put
#                   back at exit), intentfs-uring-pt and intentfs-async
#   --versions V    the content store (every version of every changed file kept, zstd):
#                   on (default, as mounts run), off (the policy's versions.enabled: false),
#                   or both: a second intentfs mount, intentfs-nover, with versions off,
#                   beside the first, to read the store's cost from one run
#   --no-pt         skip intentfs-pt, intentfs-uring-pt and intentfs-async (intentfs with
#                   --data passthrough: the kernel reads and writes files, decisions at open;
#                   docs/passthrough.md), which run when the kernel offers FUSE passthrough.
#                   intentfs-async is intentfs-uring-pt with --record async (a close is
#                   answered before its entry is written; docs/ledger.md): its times end
#                   when the command returns, and the entries still queued then are waited
#                   for outside the time (in its daemon CPU), before the next target runs
#   --with-peers    passthrough_hp is required: the run stops if it cannot be built or
#                   mounted
#   --no-peers      skip passthrough_hp. Default: its four modes run when
#                   bench/peers/build-passthrough-hp.sh builds it (it apt-installs meson,
#                   ninja, liburing-dev, libnuma-dev when missing) or PASSTHROUGH_HP is set:
#                     hp-dev       /dev/fuse, no kernel passthrough (--nopassthrough)
#                     hp-dev+pt    /dev/fuse, kernel passthrough of read/write
#                     hp-uring     FUSE-over-io_uring, no passthrough
#                     hp-uring+pt  FUSE-over-io_uring and kernel passthrough
#                   io_uring needs /sys/module/fuse/parameters/enable_uring = Y: the run
#                   sets it and puts the previous value back at exit. Each mode is
#                   probed after mounting (requests on its rings, READs of a cold read)
#                   and the header says what it really used; a mode that fell back is
#                   labelled "(fb)"
#   --low-latency   mount intentfs with --low-latency (idle CPUs poll while requests flow)
#   --keep          keep the temp directory (logs, results.tsv) for inspection
#   --fs image      (default) every target's directory on a fresh ext4 (journaled, mkfs
#                   defaults) in a sparse image file, loop-mounted for the run: every
#                   target starts from the same clean filesystem state
#   --fs dir        directories straight on the filesystem of BENCH_DIR (on an ext4
#                   without a journal, creating files after mass deletions is slow for
#                   minutes and moves native times tenfold; see bench/README.md)
# Env: INTENTFS=path/to/intentfs (default target/release/intentfs), INTENTFS_MOUNT_ARGS=extra
#      `intentfs mount` options (e.g. "--threads 8"), BENCH_DIR=where to make
#      the temp directory (default $TMPDIR or /tmp; every target's backing directory is
#      on that filesystem), CARGO_HOME (registry sources for the tree),
#      PASSTHROUGH_HP=path/to/passthrough_hp (skips the build), PEERS_DIR=where the build
#      goes (default target/peers/passthrough_hp), LIBFUSE_TARBALL (for the build; see
#      bench/peers/build-passthrough-hp.sh).
# Needs root (mounts, drop_caches) and /dev/fuse. See bench/README.md.
set -uo pipefail
export LC_ALL=C

ROUNDS=5 COPIES=4 SEQ_MIB=512 FILES=4700 BINDFS=auto PEERS=auto URING=auto PT=auto KEEP=0 FS=image RT_CALLS=20000 VERSIONS=on
while (($#)); do
    case $1 in
    --rounds) ROUNDS=$2; shift ;;
    --copies) COPIES=$2; shift ;;
    --seq-mib) SEQ_MIB=$2; shift ;;
    --files) FILES=$2; shift ;;
    --quick) ROUNDS=1 COPIES=1 SEQ_MIB=64 RT_CALLS=5000 ;;
    --with-bindfs) BINDFS=install ;;
    --no-bindfs) BINDFS=no ;;
    --with-peers) PEERS=require ;;
    --no-peers) PEERS=no ;;
    --no-uring) URING=no ;;
    --no-pt) PT=no ;;
    --versions) VERSIONS=$2; shift ;;
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
[[ $VERSIONS == on || $VERSIONS == off || $VERSIONS == both ]] || { echo "--versions must be on, off or both, not '$VERSIONS'" >&2; exit 2; }
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

# passthrough_hp, the peer: PASSTHROUGH_HP, else built (once; later runs find the binary).
HP_MODES=(hp_dev hp_dev_pt hp_uring hp_uring_pt)
declare -A HP_ARGS=([hp_dev]="--nopassthrough" [hp_dev_pt]="" [hp_uring]="-o io_uring --nopassthrough" [hp_uring_pt]="-o io_uring")
declare -A NAME=([native]=native [intentfs]=intentfs [intentfs_nover]=intentfs-nover [intentfs_uring]=intentfs-uring [intentfs_pt]=intentfs-pt [intentfs_upt]=intentfs-uring-pt [intentfs_async]=intentfs-async [bindfs]=bindfs [hp_dev]=hp-dev [hp_dev_pt]=hp-dev+pt [hp_uring]=hp-uring [hp_uring_pt]=hp-uring+pt)
HP= HP_WHY=
if [[ $PEERS != no ]]; then
    if [[ -n ${PASSTHROUGH_HP:-} ]]; then
        [[ -x $PASSTHROUGH_HP ]] && HP=$PASSTHROUGH_HP || HP_WHY="PASSTHROUGH_HP=$PASSTHROUGH_HP is not an executable"
    else
        hp_log=$(mktemp)
        if "$root/bench/peers/build-passthrough-hp.sh" "${PEERS_DIR:-$root/target/peers/passthrough_hp}" >"$hp_log" 2>&1; then
            HP=$(tail -1 "$hp_log")
        else
            HP_WHY="bench/peers/build-passthrough-hp.sh failed: $(tail -3 "$hp_log" | tr '\n' ' ')"
        fi
        rm -f "$hp_log"
    fi
    if [[ -z $HP ]]; then
        [[ $PEERS == require ]] && { echo "--with-peers: $HP_WHY" >&2; exit 1; }
        echo "warning: no passthrough_hp ($HP_WHY); going on without it" >&2
    fi
fi

# ----- directories, source tree ------------------------------------------------------------

tmp=$(mktemp -d "${BENCH_DIR:-${TMPDIR:-/tmp}}/intentfs-bench.XXXXXX")
tmp=$(cd "$tmp" && pwd -P)
# Names this run in the files edit_new makes (their versions are new to every store).
RUN_ID=${tmp##*.}
logs=$tmp/logs res=$tmp/results.tsv
mkdir -p "$logs" "$tmp/mnt" "$tmp/bmnt"
: >"$res"
# Where native/, ws/ (the workspace), bws/ (bindfs's backing) and hp_*/ (passthrough_hp's)
# live: $fs.
fs=$tmp
if [[ $FS == image ]]; then
    if command -v mkfs.ext4 >/dev/null && [[ -e /dev/loop-control ]]; then
        # Sparse: only what the run writes takes room. Inode tables and the journal are
        # written now, not by a background thread during the run.
        size_mib=$((SEQ_MIB * 7 + COPIES * (7 + ${#HP_MODES[@]}) * 200 + 2048))
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
# intentfs variants mounted beside the /dev/fuse one: their mount options, workspaces and
# mountpoints (the same binary and policy).
# (intentfs-nover: the same mount with the content store off, for --versions both.)
VARIANTS=(intentfs_nover intentfs_uring intentfs_pt intentfs_upt intentfs_async)
# (The /dev/fuse ones say so: the default transport is `auto`, which takes the ring
# whenever enable_uring is Y, as it is for the io-uring variants.)
declare -A VARGS=([intentfs_nover]="--transport dev-fuse" [intentfs_uring]="--transport io-uring" [intentfs_pt]="--transport dev-fuse --data passthrough" [intentfs_upt]="--transport io-uring --data passthrough" [intentfs_async]="--transport io-uring --data passthrough --record async")
declare -A VWS=([intentfs_nover]=$fs/wsn [intentfs_uring]=$fs/wsu [intentfs_pt]=$fs/wsp [intentfs_upt]=$fs/wsq [intentfs_async]=$fs/wsa)
declare -A VMNT=([intentfs_nover]=$tmp/nmnt [intentfs_uring]=$tmp/umnt [intentfs_pt]=$tmp/pmnt [intentfs_upt]=$tmp/qmnt [intentfs_async]=$tmp/amnt)
declare -A VDAEMON VKEY VWHY
for v in "${VARIANTS[@]}"; do mkdir -p "${VWS[$v]}/.orchestration" "${VMNT[$v]}"; done
[[ -n $HP ]] && for m in "${HP_MODES[@]}"; do mkdir -p "$fs/$m" "$tmp/m_$m"; done
# policies/allow-all.yaml (intent ALL, scope **), plus sensitive_read: allow: a real tree
# has files the default sensitive patterns match (objc2-foundation's NSURLCredential.rs
# matches `*credential*`, any case), which --approver deny would refuse to read.
{ cat "$root/policies/allow-all.yaml"; printf 'approval:\n  sensitive_read: allow\n'; } >"$fs/ws/.orchestration/active_intents.yaml"
for v in "${VARIANTS[@]}"; do cp "$fs/ws/.orchestration/active_intents.yaml" "${VWS[$v]}/.orchestration/"; done
# Versions off: for the intentfs target (--versions off), or for intentfs-nover (both).
VERSIONS_OFF=$'versions:\n  enabled: false\n'
printf '%s' "$VERSIONS_OFF" >>"$fs/wsn/.orchestration/active_intents.yaml"
[[ $VERSIONS == off ]] && printf '%s' "$VERSIONS_OFF" >>"$fs/ws/.orchestration/active_intents.yaml"
ledger=$fs/ws/.orchestration/agent_trace.jsonl
mnt=$tmp/mnt bmnt=$tmp/bmnt
DAEMON=

declare -A HP_PID
URING_PARAM=/sys/module/fuse/parameters/enable_uring URING_OLD= TRACEFS_MOUNTED=

mounted() { grep -q " $1 " /proc/mounts; }
# Every FUSE mountpoint of the run, whether mounted yet or not.
fuse_mounts() { echo "$mnt" "${VMNT[@]}" "$bmnt"; for m in "${HP_MODES[@]}"; do echo "$tmp/m_$m"; done; }
cleanup() {
    local m pid i up=0
    if mounted "$mnt"; then "$BIN" umount "$mnt" >/dev/null 2>&1 || umount -l "$mnt" 2>/dev/null; fi
    for m in "${VMNT[@]}"; do
        if mounted "$m"; then "$BIN" umount "$m" >/dev/null 2>&1 || umount -l "$m" 2>/dev/null; fi
    done
    if mounted "$bmnt"; then fusermount3 -u "$bmnt" 2>/dev/null || umount -l "$bmnt" 2>/dev/null; fi
    for m in "${HP_MODES[@]}"; do
        if mounted "$tmp/m_$m"; then umount "$tmp/m_$m" 2>/dev/null || umount -l "$tmp/m_$m" 2>/dev/null; fi
        # The daemon leaves once its mount is gone; one that does not is ended by its pid.
        pid=${HP_PID[$m]:-}
        [[ -n $pid ]] || continue
        for ((i = 0; i < 50; i++)); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
        kill -0 "$pid" 2>/dev/null && { echo "warning: passthrough_hp $m (pid $pid) still up after umount: killing it" >&2; kill "$pid"; }
    done
    # enable_uring back as it was before the run (it is system-wide).
    [[ -n $URING_OLD ]] && { echo "$URING_OLD" >"$URING_PARAM" 2>/dev/null || echo "warning: could not restore $URING_PARAM to $URING_OLD" >&2; }
    [[ -n $TRACEFS_MOUNTED ]] && umount "$TRACEFS_MOUNTED" 2>/dev/null
    for m in $(fuse_mounts); do mounted "$m" && up=1; done
    if ((!up)) && mounted "$tmp/fs" && ! ((KEEP)); then
        umount "$tmp/fs" 2>/dev/null || umount -l "$tmp/fs" 2>/dev/null
    fi
    if ((up)); then
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

# shellcheck source=bench/lib/tree.sh
. "$root/bench/lib/tree.sh"
tree_tar "$tmp/tree.tar" "$FILES" || exit 1
tree_mib=$(du -sm "$tmp/tree.tar" | cut -f1)
# What `find . | wc -l` must print after the K copies: ".", c1..cK, every tar entry K times.
FIND_WANT=$(($(tar -tf "$tmp/tree.tar" | wc -l) * COPIES + COPIES + 1))

# passthrough_hp holds an O_PATH descriptor for every inode the kernel knows, and the kernel
# keeps them for a day (its entry timeout): all K copies of the tree at once, plus a margin
# for the git, edit and build directories. It raises only its soft limit to the hard one;
# root raises the hard one up to fs.nr_open when it may (CAP_SYS_RESOURCE: not in every
# container; here the hard limit was 20,000, and four copies ran out with "Too many open
# files" in tar, find and du). Too few: without the peer, or stop with --with-peers.
if [[ -n $HP ]]; then
    HP_NOFILE=$(cat /proc/sys/fs/nr_open 2>/dev/null || echo 1048576)
    HP_NOFILE=$( (ulimit -Hn "$HP_NOFILE" 2>/dev/null; ulimit -Hn))
    need=$((FIND_WANT + 2000))
    if [[ $HP_NOFILE != unlimited ]] && ((HP_NOFILE < need)); then
        per=$((FIND_WANT / COPIES))
        msg="passthrough_hp would need about $need descriptors for $COPIES copies of the tree; the hard limit here is $HP_NOFILE and cannot be raised (CAP_SYS_RESOURCE): use --copies $(((HP_NOFILE - 2000) / per)) or fewer"
        [[ $PEERS == require ]] && { echo "--with-peers: $msg" >&2; exit 1; }
        echo "warning: $msg; going on without passthrough_hp" >&2
        HP= HP_WHY="descriptor limit $HP_NOFILE < $need"
    fi
fi

# ----- mounts ------------------------------------------------------------------------------

# /dev/fuse, whatever enable_uring says (the default transport, `auto`, would take the ring).
# shellcheck disable=SC2086 # INTENTFS_MOUNT_ARGS: extra mount options, word-split
"$BIN" mount --transport dev-fuse --intent ALL --approver deny --agent bench ${INTENTFS_MOUNT_ARGS:-} "$fs/ws" "$mnt" >"$logs/mount.out" 2>&1 ||
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

# intentfs variants beside the /dev/fuse mount, each on its own workspace: over
# FUSE-over-io_uring (`--transport io-uring`; the kernel offers the ring only while
# enable_uring is Y: set for the run, put back by cleanup), with kernel passthrough of file
# data (`--data passthrough`), and both.
if [[ $URING != no ]] && [[ -w $URING_PARAM ]]; then
    old=$(cat "$URING_PARAM")
    [[ $old != Y ]] && echo Y >"$URING_PARAM" 2>/dev/null && URING_OLD=$old
fi
for v in "${VARIANTS[@]}"; do
    [[ $URING == no && ${VARGS[$v]} == *io-uring* ]] && continue
    [[ $PT == no && ${VARGS[$v]} == *passthrough* ]] && continue
    [[ $v == intentfs_nover && $VERSIONS != both ]] && continue
    # shellcheck disable=SC2086 # VARGS, INTENTFS_MOUNT_ARGS: mount options, word-split
    if "$BIN" mount ${VARGS[$v]} --intent ALL --approver deny --agent bench ${INTENTFS_MOUNT_ARGS:-} \
        "${VWS[$v]}" "${VMNT[$v]}" >"$logs/mount.$v.out" 2>&1; then
        VKEY[$v]=$(printf '%s' "${VMNT[$v]#/}" | sed 's/[^A-Za-z0-9.-]/_/g')
        VDAEMON[$v]=$(cat "/run/intentfs/${VKEY[$v]}/pid" 2>/dev/null)
        # A variant that asked for passthrough and did not get it is not run (it would be
        # the plain mount again under another name).
        if [[ ${VARGS[$v]} == *passthrough* ]] && ! grep -q '"data":"passthrough"' <(tr -d ' \n' <"${VMNT[$v]}/.intentfs/status"); then
            VWHY[$v]="the kernel did not offer FUSE passthrough"
            "$BIN" umount "${VMNT[$v]}" >/dev/null 2>&1
            unset "VDAEMON[$v]"
            continue
        fi
        TARGETS+=("$v") ACC[$v]=${VMNT[$v]} BACK[$v]=${VWS[$v]}
    else
        VWHY[$v]=$(tail -1 "$logs/mount.$v.out")
        echo "warning: intentfs ${VARGS[$v]} did not mount (${VWHY[$v]}); going on without it" >&2
    fi
done

# passthrough_hp in its four modes. FUSE-over-io_uring is offered by the kernel at INIT
# only while enable_uring is Y (without it passthrough_hp silently serves /dev/fuse), so
# it is set before the mounts and put back by cleanup.
declare -A HP_NOTE
HP_URING_WHY=
if [[ -n $HP ]]; then
    if [[ -w $URING_PARAM ]]; then
        old=$(cat "$URING_PARAM")
        if [[ $old != Y ]]; then
            if echo Y >"$URING_PARAM" 2>/dev/null; then URING_OLD=$old
            else HP_URING_WHY="could not set $URING_PARAM"; fi
        fi
    else
        HP_URING_WHY="no writable $URING_PARAM (kernel without CONFIG_FUSE_IO_URING, or < 6.14)"
    fi
    for m in "${HP_MODES[@]}"; do
        # --foreground: the pid is $!, and what it logs (a failed io_uring start, a
        # passthrough open that failed) lands in logs/ instead of /dev/null. setsid: in a
        # session of its own, as it runs by default (it daemonizes) and as intentfs's daemon
        # runs. The scheduler groups a session's processes (autogroup): in the session of
        # the workloads it ran the edit loop in 120 ms instead of 166 and `tar x` in 1.1 s
        # instead of 1.5, where intentfs with --foreground gained 2% and 8% (bench/README.md).
        # shellcheck disable=SC2086 # HP_ARGS: options, word-split
        (ulimit -Hn "$HP_NOFILE" 2>/dev/null; exec setsid "$HP" --foreground ${HP_ARGS[$m]} "$fs/$m" "$tmp/m_$m") >"$logs/$m.log" 2>&1 &
        HP_PID[$m]=$!
        for ((i = 0; i < 100; i++)); do
            mounted "$tmp/m_$m" && break
            kill -0 "${HP_PID[$m]}" 2>/dev/null || break
            sleep 0.1
        done
        if mounted "$tmp/m_$m"; then
            TARGETS+=("$m") ACC[$m]=$tmp/m_$m BACK[$m]=$fs/$m
        else
            echo "warning: passthrough_hp ${HP_ARGS[$m]} did not mount: $(tail -3 "$logs/$m.log" | tr '\n' ' ')" >&2
            [[ $PEERS == require ]] && exit 1
        fi
    done
fi

# The requests served through a daemon's io_uring rings so far: the completion counters
# (CqTail) of its io_uring descriptors, summed. Nothing when it has no ring, i.e. serves
# /dev/fuse.
ring_cqes() {
    local fd s=0 n=0 t
    for fd in /proc/"$1"/fd/*; do
        [[ $(readlink "$fd" 2>/dev/null) == 'anon_inode:[io_uring]' ]] || continue
        t=$(awk '/^CqTail:/ { print $2 }' "/proc/$1/fdinfo/${fd##*/}" 2>/dev/null)
        n=$((n + 1)) s=$((s + ${t:-0}))
    done
    ((n)) && echo "$s"
}
# What each passthrough_hp mode really uses, by what it does rather than what it was asked:
# a 1 MiB file written natively behind the mount is read cold through it, with the
# kernel's fuse_request_send tracepoint on. Kernel passthrough sends no READ for it; a
# daemon serving io_uring has ring completions after it. A mode that asked for either and
# did not get it is labelled "(fb)", fell back.
T=/sys/kernel/tracing
hp_probe() {
    local m have_trace=0 conn reads c0 c1
    [[ -e $T/events/fuse ]] || { mountpoint -q "$T" || { mount -t tracefs nodev "$T" 2>/dev/null && TRACEFS_MOUNTED=$T; }; }
    if [[ -e $T/events/fuse/fuse_request_send/enable ]]; then
        have_trace=1
        echo 0 >"$T/tracing_on"
        echo >"$T/trace"
        echo 1 >"$T/events/fuse/fuse_request_send/enable"
    fi
    for m in "${TARGETS[@]}"; do
        [[ $m == hp_* ]] || continue
        head -c 1048576 /dev/urandom >"${BACK[$m]}/.probe"
        c0=$(ring_cqes "${HP_PID[$m]}")
        ((have_trace)) && echo 1 >"$T/tracing_on"
        cat "${ACC[$m]}/.probe" >/dev/null
        ((have_trace)) && echo 0 >"$T/tracing_on"
        c1=$(ring_cqes "${HP_PID[$m]}")
        rm -f "${ACC[$m]}/.probe"
        local note= fb=0
        if [[ ${HP_ARGS[$m]} == *io_uring* ]]; then
            if [[ -n $c1 ]] && ((c1 > ${c0:-0})); then note="io_uring yes ($((c1 - c0)) requests on its rings in the probe)"
            else note="io_uring NO, served /dev/fuse${HP_URING_WHY:+ ($HP_URING_WHY)}" fb=1; fi
        else
            note="/dev/fuse$([[ -n $c1 ]] && echo ", but it has io_uring rings")"
        fi
        if ((have_trace)); then
            # The tracepoint names the connection by the superblock's device number.
            conn=$(stat -c '%Hd %Ld' "${ACC[$m]}" | awk '{ print $1 * 1048576 + $2 }')
            reads=$(grep -c "connection $conn .*(FUSE_READ)" "$T/trace")
            if [[ ${HP_ARGS[$m]} == *nopassthrough* ]]; then note+="; no passthrough ($reads READs for a cold 1 MiB read)"
            elif ((reads == 0)); then note+="; passthrough yes (no READ for a cold 1 MiB read)"
            else note+="; passthrough NO ($reads READs for a cold 1 MiB read)" fb=1; fi
        elif [[ ${HP_ARGS[$m]} != *nopassthrough* ]]; then
            note+="; passthrough unchecked (no fuse tracepoints)"
        fi
        HP_NOTE[$m]=$note
        ((fb)) && NAME[$m]+="(fb)"
    done
    if ((have_trace)); then echo 0 >"$T/events/fuse/fuse_request_send/enable"; echo >"$T/trace"; fi
}
[[ -n $HP ]] && hp_probe
declare -A RING0
for m in "${TARGETS[@]}"; do [[ $m == hp_* ]] && RING0[$m]=$(ring_cqes "${HP_PID[$m]}"); done

echo "intentfs:  $BIN ($(git -C "$root" rev-parse --short HEAD 2>/dev/null)$(git -C "$root" diff --quiet HEAD -- src 2>/dev/null || echo ', src modified'))"
echo "machine:   $(nproc) CPUs, $(awk '/MemTotal/ {printf "%.0f GiB", $2/1048576}' /proc/meminfo), $(uname -r), $(stat -f -c %T "$fs") at $fs$([[ $FS == image ]] && echo " (a fresh image, --fs image)")"
echo "tree:      $TREE_CRATES crates from $TREE_REG, $TREE_FILES files, $tree_mib MiB; x$COPIES copies"
names=() && for tg in "${TARGETS[@]}"; do names+=("${NAME[$tg]}"); done
echo "targets:   ${names[*]}$( ((HAVE_BINDFS)) || echo ' (bindfs not installed: --with-bindfs)')$([[ -n $HP || $PEERS == no ]] || echo " (no passthrough_hp: $HP_WHY)"); $ROUNDS round(s); sequential $SEQ_MIB MiB; search: ${RG%% *}"
[[ -n ${INTENTFS_MOUNT_ARGS:-} ]] && echo "intentfs mount options: ${INTENTFS_MOUNT_ARGS# }"
for v in "${VARIANTS[@]}"; do
    if [[ -n ${VDAEMON[$v]:-} ]]; then
        echo "${NAME[$v]}: ${VARGS[$v]}: $(grep -o 'transport: .*\|data: .*' "/run/intentfs/${VKEY[$v]}/daemon.log" 2>/dev/null | tr '\n' ' ')"
    elif [[ -n ${VWHY[$v]:-} ]]; then
        echo "${NAME[$v]}: not run (${VWHY[$v]})"
    fi
done
if [[ -n $HP ]]; then
    echo "passthrough_hp: $HP (libfuse $(grep -m1 -o "version: *'[0-9.]*'" "$(dirname "$HP")/../../meson.build" 2>/dev/null | grep -o '[0-9.]*' || echo '?'));" \
        "enable_uring $(cat "$URING_PARAM" 2>/dev/null || echo absent)$([[ -n $URING_OLD ]] && echo " for the run (was $URING_OLD; put back at exit)")"
    for tg in "${TARGETS[@]}"; do
        [[ $tg == hp_* ]] && printf '  %-12s %-41s %s\n' "${NAME[$tg]}" "passthrough_hp ${HP_ARGS[$tg]:-(defaults)}" "${HP_NOTE[$tg]}"
    done
fi
echo

# ----- measurement helpers -----------------------------------------------------------------

FAILS=()
declare -A LEDGER_DELTA DEAD CPU_DELTA
now_us() { local t=$EPOCHREALTIME; echo "${t/./}"; }
entries() { [[ -f $ledger ]] && wc -l <"$ledger" || echo 0; }
# FUSE requests the intentfs daemon has answered (its status counters). Reading the status
# costs a few requests itself: REQ_SELF, measured below, is taken off each workload's count.
requests() { tr -d ' \n' <"$mnt/.intentfs/status" 2>/dev/null | grep -o '"requests":{[^}]*}' | grep -o '"total":[0-9]*' | cut -d: -f2; }
declare -A REQ_DELTA
q0=$(requests) q1=$(requests)
REQ_SELF=$((${q1:-0} - ${q0:-0}))
# daemon TARGET: the pid of the target's FUSE daemon, when it has one we measure.
daemon() { case $1 in intentfs) echo "$DAEMON" ;; intentfs_*) echo "${VDAEMON[$1]:-}" ;; hp_*) echo "${HP_PID[$1]:-}" ;; esac; }
alive() { local p; p=$(daemon "$1"); [[ -z $p ]] || kill -0 "$p" 2>/dev/null; }
# CPU the process has used (every thread, live or exited), in clock ticks: utime + stime of
# /proc/<pid>/stat (fields 14 and 15; neither daemon's name has a space in it).
TICK=$(getconf CLK_TCK)
cpu_ticks() { awk '{ print $14 + $15 }' "/proc/$1/stat" 2>/dev/null; }

# timed WL TARGET ROUND DIR CMD...: run CMD in DIR, append "WL TARGET ROUND µs" to results
# (or FAIL). With INNER=1 the time is the last line CMD prints (µs), not the wall clock.
timed() {
    local wl=$1 tg=$2 r=$3 dir=$4
    shift 4
    local base=$logs/$wl.$tg.r$r t0 t1 rc e0 e1 q0 q1 us pid c0 c1
    if ((${DEAD[$tg]:-0})); then echo "$wl $tg $r FAIL" >>"$res"; return 1; fi
    [[ $tg == intentfs ]] && e0=$(entries) q0=$(requests)
    pid=$(daemon "$tg")
    [[ -n $pid ]] && c0=$(cpu_ticks "$pid")
    t0=$(now_us)
    (cd "$dir" && "$@") >"$base.out" 2>"$base.err"
    rc=$?
    t1=$(now_us)
    us=$((t1 - t0))
    ((${INNER:-0})) && us=$(tail -1 "$base.out")
    # --record async: the entries of the workload's last closes are written after it
    # returned. Waited for here (opening status does), outside the time and inside the
    # daemon's CPU, so the next target's run does not share the CPUs with them.
    [[ ${VARGS[$tg]:-} == *"--record async"* ]] && cat "${ACC[$tg]}/.intentfs/status" >/dev/null 2>&1
    [[ -n $pid ]] && c1=$(cpu_ticks "$pid")
    [[ -n ${c0:-} && -n ${c1:-} ]] && CPU_DELTA[$wl.$tg]+="$((c1 - c0)) "
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
    if [[ $2 == hp_* || $2 == intentfs_?* ]] && ! alive "$2"; then
        DEAD[$2]=1
        msg+=$'\n      passthrough_hp (pid '"${HP_PID[$2]}"') is gone: see '"$logs/$2.log"
    elif [[ $2 == intentfs ]]; then
        if ! kill -0 "$DAEMON" 2>/dev/null; then
            DEAD[intentfs]=1
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
# over another). "setup [SALT]" makes the 20 files it edits (SALT, when given, heads each
# file, so every version the loop makes is new to the content store, as an agent's edits
# are; without it every round makes the versions of the round before); "loop" prints its
# own time in µs (so python's start-up, the same everywhere, is not counted).
read -r -d '' EDIT_PY <<'EOF'
import os, sys, time
files = ["f%02d.rs" % i for i in range(20)]
if sys.argv[1] == "setup":
    salt = "// %s\n" % sys.argv[2] if len(sys.argv) > 2 else ""
    body = salt + "".join("pub fn item_%d(x: u64) -> u64 { x.wrapping_mul(%d) ^ 0x5a }\n" % (i, i) for i in range(150))
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
wl_edit() { python3 -I -c "$EDIT_PY" "$@"; }

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
    # The same loop over files no round made before: every version is new to the store.
    for tg in "${TARGETS[@]}"; do
        d=${ACC[$tg]}/r$r/edit_new
        mkdir -p "$d" && (cd "$d" && wl_edit setup "round $r of run $RUN_ID") ||
            { fail edit_new "$tg" "$r" "setup failed" "cd $d && python3"; continue; }
        INNER=1 timed edit_new "$tg" "$r" "$d" wl_edit loop
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

    # Untimed. intentfs's round directory is removed behind the mount: intentfs refuses an
    # agent's removal of .git/config and .git/hooks/*, and the refusals count towards the
    # agent's circuit breaker, which stopped the bench agent ("refused too often") in
    # round 3. The others through their mount, so that no kernel cache holds what is gone.
    for tg in "${TARGETS[@]}"; do
        if [[ $tg == intentfs* ]]; then rm -rf "${BACK[$tg]}/r$r"; else rm -rf "${ACC[$tg]}/r$r"; fi
    done
done

# ----- round trips, memory -----------------------------------------------------------------

# One round trip per target (bench/roundtrip.py: calls answered without touching data, on a
# file made natively in the target's backing directory), after the rounds so that it does
# not warm anything they measure. Five passes of a fifth of the calls, interleaved over the
# targets like the workloads, and the median pass: a single pass moved 10x with what else
# the machine was running.
declare -A RT_IOCTL RT_XATTR
RT_TARGETS=()
for tg in "${TARGETS[@]}"; do : >"${BACK[$tg]}/rt" && RT_TARGETS+=("$tg"); done
for ((p = 1; p <= 5; p++)); do
    for tg in "${RT_TARGETS[@]}"; do
        o=$logs/roundtrip.$tg.p$p.out
        if python3 -I "$root/bench/roundtrip.py" "${ACC[$tg]}/rt" "$((RT_CALLS / 5))" >"$o" 2>&1; then
            RT_IOCTL[$tg]+="$(grep -o 'ioctl [0-9.]*' "$o" | cut -d' ' -f2) "
            RT_XATTR[$tg]+="$(grep -o 'getxattr [0-9.]*' "$o" | cut -d' ' -f2) "
        else
            fail roundtrip "$tg" - "bench/roundtrip.py failed" "python3 $root/bench/roundtrip.py ${ACC[$tg]}/rt" "$o"
        fi
    done
done
for tg in "${RT_TARGETS[@]}"; do
    RT_IOCTL[$tg]=$(tr ' ' '\n' <<<"${RT_IOCTL[$tg]:-}" | grep . | sort -g | awk '{ a[NR] = $1 } END { if (NR) print a[int((NR + 1) / 2)] }')
    RT_XATTR[$tg]=$(tr ' ' '\n' <<<"${RT_XATTR[$tg]:-}" | grep . | sort -g | awk '{ a[NR] = $1 } END { if (NR) print a[int((NR + 1) / 2)] }')
    rm -f "${ACC[$tg]}/rt"
done

declare -A HWM CPU_ALL RING_RUN
for tg in "${TARGETS[@]}"; do
    p=$(daemon "$tg")
    [[ -n $p ]] || continue
    HWM[$tg]=$(awk '/VmHWM/ { print $2 }' "/proc/$p/status" 2>/dev/null)
    CPU_ALL[$tg]=$(awk '{ printf "%.1f", ($14 + $15) / '"$TICK"' }' "/proc/$p/stat" 2>/dev/null)
    [[ $tg == hp_* && -n ${RING0[$tg]:-} ]] && RING_RUN[$tg]=$(($(ring_cqes "$p") - RING0[$tg]))
done

# ----- report ------------------------------------------------------------------------------

RSS_END=${HWM[intentfs]:-}
RSS_NOW=$(awk '/VmRSS/ { print $2 }' "/proc/$DAEMON/status" 2>/dev/null)
CPU=${CPU_ALL[intentfs]:-}

# median WL TARGET: median µs over the rounds that succeeded ("" when none did).
median() {
    awk -v w="$1" -v t="$2" '$1 == w && $2 == t && $4 != "FAIL" { print $4 }' "$res" | sort -n |
        awk '{ a[NR] = $1 } END { if (NR) print (NR % 2 ? a[(NR + 1) / 2] : (a[NR / 2] + a[NR / 2 + 1]) / 2) }'
}
nfail() { awk -v w="$1" -v t="$2" '$1 == w && $2 == t && $4 == "FAIL"' "$res" | wc -l; }
ms() { [[ -n $1 ]] && awk -v u="$1" 'BEGIN { printf(u >= 100000 ? "%.0f" : "%.1f", u / 1000) }' || echo "-"; }
ratio() { [[ -n $1 && -n $2 ]] && awk -v a="$1" -v b="$2" 'BEGIN { printf "%.2fx", (b > 0 ? a / b : 0) }' || echo "-"; }
medlist() { tr ' ' '\n' <<<"$1" | grep . | sort -n | awk '{ a[NR] = $1 } END { if (NR) print a[int((NR + 1) / 2)] }'; }
# cpu_ms WL TARGET: the daemon's CPU per round of the workload, in ms (the mean: a tick is
# 1/CLK_TCK s, 10 ms here, coarser than most single rounds).
cpu_ms() {
    tr ' ' '\n' <<<"${CPU_DELTA[$1.$2]:-}" | grep . |
        awk -v t="$TICK" '{ s += $1 } END { if (NR) printf "%.0f", s * 1000 / t / NR; else print "-" }'
}

declare -A GOAL=([tar_x]=4 [find]=1.5 [du]=1.5 [rg]=2.5 [git_status]=1.5 [git_status_warm]=1.5 [edit_loop]=2.5 [edit_new]=2.5
    [seq_write]=1.1 [seq_read_cold]=1.1 [seq_read_warm]=1.1 [rm_rf]=3 [build]=1.1)
WLS=(tar_x find du rg git_status git_status_warm edit_loop edit_new seq_write seq_read_cold seq_read_warm rm_rf build)
HPS=() && for tg in "${TARGETS[@]}"; do [[ $tg == hp_* ]] && HPS+=("$tg"); done
# A column as wide as its target's name, at least 8.
w() { local n=${NAME[$1]}; echo $((${#n} > 7 ? ${#n} + 1 : 8)); }

# Times: every target's median and its ratio to native; with passthrough_hp, which mode was
# fastest and intentfs's time over that one's.
echo
printf '%-15s' "workload (ms)"
for tg in "${TARGETS[@]}"; do
    printf "%$(w "$tg")s" "${NAME[$tg]}"
    [[ $tg == native ]] || printf '%8s' ratio
done
((${#HPS[@]})) && printf '%13s %8s' "best hp" "vs best"
if ((${#HPS[@]})); then for v in "${VARIANTS[@]}"; do [[ -n ${VDAEMON[$v]:-} ]] && printf ' %18s' "${NAME[$v]#intentfs-} vs best"; done; fi
echo
for wl in "${WLS[@]}"; do
    n=$(median "$wl" native) best= bestt=
    printf '%-15s' "$wl"
    for tg in "${TARGETS[@]}"; do
        t=$(median "$wl" "$tg")
        printf "%$(w "$tg")s" "$(ms "$t")"
        [[ $tg == native ]] && continue
        f=$(nfail "$wl" "$tg")
        if ((f)); then printf '%8s' "FAIL($f)"; else printf '%8s' "$(ratio "$t" "$n")"; fi
        if [[ $tg == hp_* && -n $t ]] && { [[ -z $best ]] || awk -v a="$t" -v b="$best" 'BEGIN { exit !(a < b) }'; }; then
            best=$t bestt=$tg
        fi
    done
    ((${#HPS[@]})) && printf '%13s %8s' "${NAME[$bestt]:--}" "$(ratio "$(median "$wl" intentfs)" "$best")"
    if ((${#HPS[@]})); then for v in "${VARIANTS[@]}"; do [[ -n ${VDAEMON[$v]:-} ]] && printf ' %18s' "$(ratio "$(median "$wl" "$v")" "$best")"; done; fi
    echo
done
echo "(medians over $ROUNDS round(s), ms; ratio = to native; seq = $SEQ_MIB MiB$( ((CAN_DROP)) || echo ', cold reads NOT cold'))"
((${#HPS[@]})) && echo "(best hp = the fastest passthrough_hp mode of the workload; vs best = intentfs / that mode's time;"
((${#HPS[@]})) && echo " uring / pt / uring-pt / async vs best = that intentfs variant / that mode's time; async = uring-pt with --record async)"

# The content store's cost: intentfs (versions on) over intentfs-nover (versions off).
if [[ -n ${VDAEMON[intentfs_nover]:-} ]]; then
    echo
    printf '%-15s %10s %10s %8s\n' "workload (ms)" "versions" "no vers." "cost"
    for wl in "${WLS[@]}"; do
        a=$(median "$wl" intentfs) b=$(median "$wl" intentfs_nover)
        printf '%-15s %10s %10s %8s\n' "$wl" "$(ms "$a")" "$(ms "$b")" "$(ratio "$a" "$b")"
    done
    echo "(cost = intentfs with the content store / intentfs without it, medians)"
fi

# intentfs against its targets, and what each daemon spent on the CPU.
echo
printf '%-15s %7s %5s %8s %9s %8s   %s' workload target met ledger requests "+µs/req" "daemon CPU ms/round:"
for tg in "${TARGETS[@]}"; do [[ -n $(daemon "$tg") ]] && printf "%$(w "$tg")s" "${NAME[$tg]}"; done
echo
for wl in "${WLS[@]}"; do
    n=$(median "$wl" native) i=$(median "$wl" intentfs) b=
    [[ -n ${ACC[bindfs]:-} ]] && b=$(median "$wl" bindfs)
    met=-
    if [[ -n $i && -n $n ]]; then
        met=$(awk -v a="$i" -v n="$n" -v g="${GOAL[$wl]}" -v b="${b:-}" \
            'BEGIN { ok = a / n <= g; if (b != "") ok = ok && a < b; print ok ? "yes" : "NO" }')
    fi
    q=$(medlist "${REQ_DELTA[$wl]:-}")
    per=$([[ -n $q && -n $i && -n $n ]] && awk -v a="$i" -v n="$n" -v q="$q" 'BEGIN { printf(q > 0 ? "%.1f" : "-", (a - n) / q) }' || echo -)
    printf '%-15s %7s %5s %8s %9s %8s   %20s' "$wl" "<=${GOAL[$wl]}x" "$met" "$(medlist "${LEDGER_DELTA[$wl]:-}")" "${q:--}" "$per" ""
    for tg in "${TARGETS[@]}"; do [[ -n $(daemon "$tg") ]] && printf "%$(w "$tg")s" "$(cpu_ms "$wl" "$tg")"; done
    echo
done
echo "('met' = ratio within target and, with bindfs, faster than bindfs; ledger = entries the intentfs"
echo " run of the workload added, median; requests = FUSE requests the intentfs daemon answered for it,"
echo " median; +µs/req = (intentfs - native) / requests, the cost of the mount per request; daemon CPU ="
echo " utime + stime of the daemon's process over the timed command, mean per round, 1/$TICK s ticks)"

# Per target: one round trip, the daemon's memory and CPU.
echo
printf '%-14s %22s %10s %9s  %s\n' target "round trip xattr/ioctl" "peak RSS" "CPU" ""
for tg in "${TARGETS[@]}"; do
    rt=-
    [[ -n ${RT_XATTR[$tg]:-} ]] && rt="${RT_XATTR[$tg]} / ${RT_IOCTL[$tg]} µs"
    rss=- cpu=- note=
    [[ -n ${HWM[$tg]:-} ]] && rss=$(awk -v k="${HWM[$tg]}" 'BEGIN { printf "%.1f MiB", k / 1024 }')
    [[ -n ${CPU_ALL[$tg]:-} ]] && cpu="${CPU_ALL[$tg]} s"
    [[ -n ${RING_RUN[$tg]:-} ]] && note="$(printf "%'d" "${RING_RUN[$tg]}") requests through io_uring during the run"
    [[ $tg == hp_* && ${HP_ARGS[$tg]} == *io_uring* && -z ${RING_RUN[$tg]:-} ]] && note="no io_uring ring: served /dev/fuse"
    printf '%-14s %22s %10s %9s  %s\n' "${NAME[$tg]}" "$rt" "$rss" "$cpu" "$note"
done
echo "(round trip: bench/roundtrip.py, $RT_CALLS getxattr of a missing attribute and ioctl TCGETS on one file,"
echo " in 5 passes interleaved over the targets, the median pass, µs per call; each call is a full trip to"
echo " the daemon (passthrough_hp answers ioctl ENOSYS, intentfs ENOTTY); peak RSS = the daemon's VmHWM;"
echo " CPU = its utime + stime over its whole life, probes included)"
echo

echo "intentfs daemon (pid $DAEMON): peak RSS $(awk -v k="${RSS_WALK:-0}" 'BEGIN { printf "%.1f", k / 1024 }') MiB after walking" \
    "$((TREE_FILES * COPIES)) files (round 1), $(awk -v k="${RSS_END:-0}" 'BEGIN { printf "%.1f", k / 1024 }') MiB at the end" \
    "(VmRSS now $(awk -v k="${RSS_NOW:-0}" 'BEGIN { printf "%.1f", k / 1024 }') MiB; target < 100 MiB after 50,000 files); CPU ${CPU:-?} s"

for m in "${HPS[@]}"; do
    umount "${ACC[$m]}" 2>"$logs/umount.$m.err" || fail umount "$m" - "umount failed" "umount ${ACC[$m]}" "$logs/umount.$m.err"
done
"$BIN" umount "$mnt" >"$logs/umount.out" 2>&1 || fail umount intentfs - "intentfs umount failed" "$BIN umount $mnt" "$logs/umount.out"
for v in "${VARIANTS[@]}"; do
    [[ -n ${VDAEMON[$v]:-} ]] || continue
    "$BIN" umount "${VMNT[$v]}" >"$logs/umount.$v.out" 2>&1 || fail umount "$v" - "intentfs umount failed" "$BIN umount ${VMNT[$v]}" "$logs/umount.$v.out"
    vl=${VWS[$v]}/.orchestration/agent_trace.jsonl
    "$BIN" ledger verify --ledger "$vl" >"$logs/verify.$v.txt" 2>&1 ||
        fail ledger_verify "$v" - "intentfs ledger verify failed" "$BIN ledger verify --ledger $vl" "$logs/verify.$v.txt"
done
# What the content store kept over the run (the rounds' files are gone; their versions stay
# until `intentfs gc`).
store=$fs/ws/.orchestration/objects
if [[ -d $store ]]; then
    # (Objects a mounted daemon kept are in its packs; `gc --dry-run` counts them with the loose
    # ones.)
    objects=$("$BIN" gc --dry-run --json --store "$store" "$fs/ws" 2>/dev/null |
        python3 -c 'import json, sys; print(json.load(sys.stdin)["objects_before"])' 2>/dev/null || echo "?")
    echo "content store ($([[ $VERSIONS == off ]] && echo "versions off" || echo "versions on")): $objects objects," \
        "$(du -sm "$store" | cut -f1) MiB on disk (packs: $(find "$store" -type f -name '*.pack' | wc -l)," \
        "loose objects: $(find "$store" -type f \( -name '*.zst' -o -name '*.raw' \) | wc -l))"
fi
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
