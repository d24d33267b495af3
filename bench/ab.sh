#!/usr/bin/env bash
# A/B of two intentfs builds (and passthrough_hp) on the workloads furthest from the
# target: `tar x` of a source tree, the edit loop of bench/run.sh (as `edit_loop`, and as
# `edit_new` over files whose every version is new to the content store), `rm -rf` of the tree.
# Every target is mounted once on its own workspace of one fresh ext4 image; the workloads
# run interleaved, target after target, round after round, so a noisy machine slows them
# alike. Prints per workload and target the median wall time and the median CPU the daemon
# spent on it (all its threads, from /proc/PID/task/*/schedstat, in ms): the CPU moves far
# less than the wall time from round to round. A program you run and read, not a test.
#
# Usage: sudo bench/ab.sh [--rounds N] [--files F] [--no-peer] [--dev-fuse] [--no-pt]
#                         BIN_A [BIN_B...] [-- MOUNT_ARGS...]
#   BIN_A, BIN_B...  intentfs binaries (e.g. a release build of main and of a change)
#   --rounds N       rounds (default 9)
#   --files F        files of the tree, from the cargo registry sources (default 4000)
#   --no-peer        without passthrough_hp (by default it runs beside them, built by
#                    bench/peers/build-passthrough-hp.sh or PASSTHROUGH_HP)
#   --dev-fuse       /dev/fuse for every target (default: io_uring, enable_uring set for
#                    the run and put back at exit)
#   --no-pt          without kernel passthrough (intentfs --data daemon, passthrough_hp
#                    --nopassthrough)
#   MOUNT_ARGS       more `intentfs mount` options for every intentfs target (e.g.
#                    `-- --record async`)
# Needs root (mounts) and /dev/fuse. See bench/README.md.
set -uo pipefail
export LC_ALL=C

ROUNDS=9 FILES=4000 PEER=1 URING=1 PT=1
BINS=() EXTRA=()
while (($#)); do
    case $1 in
    --rounds) ROUNDS=$2; shift ;;
    --files) FILES=$2; shift ;;
    --no-peer) PEER=0 ;;
    --dev-fuse) URING=0 ;;
    --no-pt) PT=0 ;;
    --) shift; EXTRA=("$@"); break ;;
    -h | --help) sed -n '2,/^set -uo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    -*) echo "unknown option: $1 (see --help)" >&2; exit 2 ;;
    *) BINS+=("$1") ;;
    esac
    shift
done
((${#BINS[@]})) || { echo "name at least one intentfs binary (see --help)" >&2; exit 2; }
for v in ROUNDS FILES; do
    [[ ${!v} =~ ^[1-9][0-9]*$ ]] || { echo "$v must be a positive integer" >&2; exit 2; }
done
for b in "${BINS[@]}"; do
    [[ -x $b ]] || { echo "$b is not an executable (an intentfs binary)" >&2; exit 2; }
done
((EUID == 0)) || { echo "bench/ab.sh needs root (it mounts): sudo $0 $*" >&2; exit 1; }
[[ -c /dev/fuse ]] || { echo "no /dev/fuse" >&2; exit 1; }
command -v python3 >/dev/null || { echo "python3 is needed for the edit loop" >&2; exit 1; }
root=$(cd "$(dirname "$0")/.." && pwd)

HP=
if ((PEER)); then
    if [[ -n ${PASSTHROUGH_HP:-} ]]; then
        HP=$PASSTHROUGH_HP
    else
        log=$(mktemp)
        if "$root/bench/peers/build-passthrough-hp.sh" "${PEERS_DIR:-$root/target/peers/passthrough_hp}" >"$log" 2>&1; then
            HP=$(tail -1 "$log")
        else
            echo "warning: no passthrough_hp ($(tail -2 "$log" | tr '\n' ' ')); going on without it" >&2
        fi
        rm -f "$log"
    fi
fi

tmp=$(mktemp -d "${TMPDIR:-/tmp}/intentfs-ab.XXXXXX")
URING_PARAM=/sys/module/fuse/parameters/enable_uring URING_OLD=
declare -a MNTS=()
cleanup() {
    local m
    for m in "${MNTS[@]}"; do
        mountpoint -q "$m" && { umount "$m" 2>/dev/null || umount -l "$m" 2>/dev/null; }
    done
    sleep 0.5
    [[ -n $URING_OLD ]] && echo "$URING_OLD" >"$URING_PARAM" 2>/dev/null
    mountpoint -q "$tmp/fs" && umount "$tmp/fs"
    rm -rf "$tmp"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# One fresh journaled ext4 for every target, as bench/run.sh --fs image.
truncate -s 8G "$tmp/fs.img" && mkfs.ext4 -q -F -E lazy_itable_init=0,lazy_journal_init=0 "$tmp/fs.img" &&
    mkdir -p "$tmp/fs" && mount -o loop "$tmp/fs.img" "$tmp/fs" ||
    { echo "cannot make and mount an ext4 image under $tmp" >&2; exit 1; }
losetup --direct-io=on "$(findmnt -n -o SOURCE "$tmp/fs")" 2>/dev/null || true

if ((URING)); then
    if [[ -w $URING_PARAM ]]; then
        URING_OLD=$(cat "$URING_PARAM")
        echo Y >"$URING_PARAM"
    else
        echo "no $URING_PARAM to set: every target on /dev/fuse" >&2
        URING=0
    fi
fi

# The tree bench/run.sh unpacks.
# shellcheck source=bench/lib/tree.sh
. "$root/bench/lib/tree.sh"
tree_tar "$tmp/tree.tar" "$FILES" || exit 1
# The edit loop of bench/run.sh, word for word.
sed -n "/^read -r -d '' EDIT_PY <<'EOF'/,/^EOF/p" "$root/bench/run.sh" | sed '1d;$d' >"$tmp/edit.py"
[[ -s $tmp/edit.py ]] || { echo "could not take the edit loop from bench/run.sh" >&2; exit 1; }

declare -A PID DIR
names=()
mode_args=()
((URING)) && mode_args+=(--transport io-uring) || mode_args+=(--transport dev-fuse)
((PT)) && mode_args+=(--data passthrough) || mode_args+=(--data daemon)
i=0
for b in "${BINS[@]}"; do
    i=$((i + 1))
    t="$i:$(basename "$b")"
    ws=$tmp/fs/ws$i m=$tmp/m$i
    mkdir -p "$ws/.orchestration" "$m"
    { cat "$root/policies/allow-all.yaml"; printf 'approval:\n  sensitive_read: allow\n'; } >"$ws/.orchestration/active_intents.yaml"
    "$b" mount --approver deny --intent ALL "${mode_args[@]}" "${EXTRA[@]}" "$ws" "$m" >"$tmp/log$i" 2>&1 ||
        { echo "$b did not mount: $(tail -3 "$tmp/log$i")" >&2; exit 1; }
    MNTS+=("$m")
    PID[$t]=$(pgrep -f -n " $m\$")
    names+=("$t")
    DIR[$t]=$m
done
if [[ -n $HP ]]; then
    t=passthrough_hp
    mkdir -p "$tmp/fs/hp" "$tmp/mhp"
    hp_args=()
    ((URING)) && hp_args+=(-o io_uring)
    ((PT)) || hp_args+=(--nopassthrough)
    "$HP" "${hp_args[@]}" "$tmp/fs/hp" "$tmp/mhp" >"$tmp/loghp" 2>&1 &
    for _ in $(seq 50); do mountpoint -q "$tmp/mhp" && break; sleep 0.1; done
    mountpoint -q "$tmp/mhp" || { echo "passthrough_hp did not mount: $(tail -3 "$tmp/loghp")" >&2; exit 1; }
    MNTS+=("$tmp/mhp")
    PID[$t]=$(pgrep -f -n " $tmp/mhp\$")
    DIR[$t]=$tmp/mhp
    names+=("$t")
fi

cpu_ms() { cat /proc/"$1"/task/*/schedstat 2>/dev/null | awk '{s += $1} END {printf "%d", s / 1000000}'; }
now_ms() { echo $(($(date +%s%N) / 1000000)); }
declare -A WALL CPU
echo "targets: ${names[*]}; $(tar -tf "$tmp/tree.tar" | wc -l) tar entries; $ROUNDS rounds; $( ((URING)) && echo io_uring || echo /dev/fuse)$( ((PT)) && echo ' + passthrough')${EXTRA[*]:+; mount options: ${EXTRA[*]}}"
# edit WORKLOAD DIR [SALT]: the edit loop in DIR (its files headed by SALT when given), timed
# inside python, for target $t (daemon $p).
edit() {
    local c0 c1 us
    mkdir -p "$2" && (cd "$2" && python3 -I "$tmp/edit.py" setup "${@:3}") || exit 1
    c0=$(cpu_ms "$p")
    us=$(cd "$2" && python3 -I "$tmp/edit.py" loop) || { echo "$1 failed on $t" >&2; exit 1; }
    c1=$(cpu_ms "$p")
    WALL[$1,$t]+=" $((us / 1000))" CPU[$1,$t]+=" $((c1 - c0))"
}
for ((r = 1; r <= ROUNDS; r++)); do
    echo "round $r/$ROUNDS" >&2
    for t in "${names[@]}"; do
        d=${DIR[$t]}/r$r p=${PID[$t]}
        mkdir -p "$d/tree" "$d/ed"
        c0=$(cpu_ms "$p") w0=$(now_ms)
        tar -xf "$tmp/tree.tar" -C "$d/tree" || { echo "tar x failed on $t" >&2; exit 1; }
        w1=$(now_ms) c1=$(cpu_ms "$p")
        WALL[tar_x,$t]+=" $((w1 - w0))" CPU[tar_x,$t]+=" $((c1 - c0))"
        edit edit_loop "$d/ed"
        # The same loop over files no round made before (their versions are new to the store).
        edit edit_new "$d/en" "round $r of ${tmp##*.}"
        sync
        c0=$(cpu_ms "$p") w0=$(now_ms)
        rm -rf "$d" || { echo "rm -rf failed on $t" >&2; exit 1; }
        w1=$(now_ms) c1=$(cpu_ms "$p")
        WALL[rm_rf,$t]+=" $((w1 - w0))" CPU[rm_rf,$t]+=" $((c1 - c0))"
    done
done
median() { tr ' ' '\n' <<<"$1" | grep . | sort -n | awk '{a[NR] = $1} END {print a[int((NR + 1) / 2)]}'; }
printf '%-10s' "wall / CPU"
for t in "${names[@]}"; do printf ' %22s' "$t"; done
echo
for w in tar_x edit_loop edit_new rm_rf; do
    printf '%-10s' "$w"
    for t in "${names[@]}"; do printf ' %22s' "$(median "${WALL[$w,$t]}") / $(median "${CPU[$w,$t]}")"; done
    echo
done
echo "(medians over $ROUNDS rounds, ms: the workload's wall time / the CPU its daemon spent on it)"
