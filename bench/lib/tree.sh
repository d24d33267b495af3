# Sourced by bench/run.sh and bench/ab.sh.
# tree_tar OUT FILES: a tar of crates from the cargo registry sources, in name order
# (skipping the few huge ones that are mostly prebuilt import libraries) until about FILES
# files: a real, varied Rust source tree. Returns 1 (with a message) when there are none.
# Sets TREE_REG (the registry directory), TREE_CRATES and TREE_FILES (how many of each).
tree_tar() {
    local out=$1 want=$2 reg c n total=0
    local -a crates=()
    reg=$(ls -d "${CARGO_HOME:-$HOME/.cargo}"/registry/src/*/ 2>/dev/null | head -1)
    [[ -n $reg ]] || { echo "no cargo registry sources under ${CARGO_HOME:-$HOME/.cargo}/registry/src" >&2; return 1; }
    while read -r c; do
        n=$(find "$reg$c" -type f | wc -l)
        ((n > 1000)) && continue
        crates+=("$c") total=$((total + n))
        ((total >= want)) && break
    done < <(ls "$reg")
    TREE_REG=$reg TREE_CRATES=${#crates[@]} TREE_FILES=$total
    tar -C "$reg" -cf "$out" "${crates[@]}"
}
