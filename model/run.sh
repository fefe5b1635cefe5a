#!/usr/bin/env bash
# The protocol model, checked exhaustively by SPIN, one configuration at a
# time (model/README.md).  Each search runs in a private temporary
# directory.  A correct configuration must pass; a mutant, a known hole of
# the protocol as first written, or a configuration outside the promise
# (release, failover without WAIT, reordered commands) must fail with the
# expected property.  Prints one line per configuration, then
# "N passed, N failed"; exits non-zero if a check failed.
#
#   MODEL_JOBS=n   searches run at once (default: the number of CPUs)
#   MODEL_ONLY=re  only the configurations whose name matches re

set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
model=$here/idempotency.pml

if ! command -v spin >/dev/null 2>&1; then
    if [ "$(id -u)" -eq 0 ]; then
        apt-get install -y -qq spin >/dev/null 2>&1 || {
            apt-get update -qq && apt-get install -y -qq spin >/dev/null
        }
    else
        echo "model: spin is missing (apt-get install spin)" >&2
        exit 1
    fi
fi

work=$(mktemp -d "${TMPDIR:-/tmp}/idempotency-model.XXXXXX")
trap 'rm -rf "$work"' EXIT

# the protocol with the fixes model/README.md proposes
fix="-DFIX_JUDGE -DFIX_SEND -DFIX_RENEW_MAX -DFIX_RENEW_TTL -DFIX_TAKER_UNK"
fix="$fix -DEXCUSE_RELEASE_LOST"
K=-DPOLICY=0
F=-DPOLICY=1
R=-DPOLICY=2
LU="-DLOSS -DUPFAULT -DH=5"     # the costly pair, on a shorter horizon

# the fixes but one, to show that each is needed
without() {
    local f out=""
    for f in $fix; do
        [ "$f" = "-D$1" ] || out="$out $f"
    done
    echo "$out"
}

# name | expected: ok, or a piece of the property that must fail | flags
# A name ending in "+" is a large search: compiled -O1 (the rest -O0, which
# compiles faster), a larger hash table.
configs=(
    "keep|ok|$K $fix"
    "keep-loss+|ok|$K $fix -DLOSS"
    "keep-stall+|ok|$K $fix -DSTALL"
    "keep-die|ok|$K $fix -DDIE"
    "keep-slow|ok|$K $fix -DSLOW"
    "keep-upstream|ok|$K $fix -DUPFAULT"
    "keep-failover-wait|ok|$K $fix -DFAILOVER -DWAIT"
    "keep-slow-reply|ok|$K $fix -DDELAY=3"
    "keep-ttl+|ok|$K $fix -DTTLEXP -DH=8"
    "keep-loss-upstream+|ok|$K $fix $LU"
    "keep-die-upstream+|ok|$K $fix -DDIE -DUPFAULT -DH=5"
    "keep-3-edges+|ok|$K $fix -DNE=3 -DNR=1"
    "forward|ok|$F $fix"
    "forward-loss+|ok|$F $fix -DLOSS"
    "forward-stall+|ok|$F $fix -DSTALL"
    "forward-die|ok|$F $fix -DDIE"
    "forward-slow|ok|$F $fix -DSLOW"
    "forward-upstream|ok|$F $fix -DUPFAULT"
    "forward-failover-wait|ok|$F $fix -DFAILOVER -DWAIT"
    "forward-ttl+|ok|$F $fix -DTTLEXP -DH=8"
    "forward-slow-upstream+|ok|$F $fix -DSLOW -DUPFAULT"
    "forward-loss-upstream+|ok|$F $fix $LU"
    "forward-die-upstream+|ok|$F $fix -DDIE -DUPFAULT -DH=5"
    "forward-3-edges-slow+|ok|$F $fix -DNE=3 -DNR=1 -DSLOW -DH=5"
    "live-keep|ok|$K $fix -DLIVE"
    "live-forward|ok|$F $fix -DLIVE"
    "release-upstream|execs<=1|$R $fix -DUPFAULT"
    "failover-nowait|execs<=1|$K $fix -DFAILOVER"
    "reorder|nsent|$K $fix -DSTALL -DREORDER"
    "mutant-finish-noowner|execs<=1|$K $fix -DLOSS -DMUT_FINISH_NOOWNER"
    "mutant-expired-free|execs<=1|$K $fix -DDIE -DMUT_EXPIRED_FREE"
    "mutant-orphan-del|execs<=1|$K $fix -DLOSS -DMAXF=2 -DMUT_ORPHAN_DEL"
    "mutant-take-head|execs<=1|$F $fix -DSLOW -DMUT_TAKE_HEAD"
    "mutant-no-margin|execs<=1|$F $fix -DSLOW -DMUT_NO_MARGIN"
    "hole-judge|nsent|$K $(without FIX_JUDGE) -DDELAY=3"
    "hole-send|execs<=1|$F $(without FIX_SEND) -DSLOW"
    "hole-renew-back|execs<=1|$F $(without FIX_RENEW_MAX) -DSTALL"
    "hole-renew-ttl|execs<=1|$K $(without FIX_RENEW_TTL) -DTTLEXP -DH=8"
    "hole-taker-release|execs<=1|$F $(without FIX_TAKER_UNK) -DDIE -DUPFAULT"
    "hole-lost-take|execs<=1|$F $(without FIX_TAKER_UNK) $LU"
    "hole-excuse|nsent|$K $(without EXCUSE_RELEASE_LOST) $LU"
)

# one search; writes "<line>" to $work/<i>.line and pass|fail to $work/<i>.ok
check() {
    local i=$1 name=$2 expect=$3 flags=$4 dir=$work/$1
    local live="" run="" opt="-O0" hash="-w24" out states secs line bad=""

    mkdir "$dir"
    cp "$model" "$dir/"
    case "$name" in *+) opt="-O1"; hash="-w26" ;; esac
    case " $flags " in *" -DLIVE "*) live=1 ;; esac

    if [ -n "$live" ]; then
        run="-a -f"
    else
        opt="$opt -DSAFETY"
    fi

    # shellcheck disable=SC2086
    if ! (cd "$dir" && spin -a $flags idempotency.pml >spin.log 2>&1 \
          && gcc $opt -w -o pan pan.c >gcc.log 2>&1)
    then
        echo "model: ${name%+} does not build" >"$work/$i.line"
        echo fail >"$work/$i.ok"
        return 0
    fi

    # shellcheck disable=SC2086
    (cd "$dir" && ./pan -m1000000 $hash $run >pan.out 2>&1) || true
    out=$dir/pan.out
    states=$(sed -n 's/^ *\([0-9][0-9]*\) states, stored.*/\1/p' "$out")
    secs=$(sed -n 's/^pan: elapsed time \([0-9.e+-]*\) seconds.*/\1/p' "$out")

    if grep -q 'errors: 0' "$out" && ! grep -q 'too small' "$out"; then
        line="model: ${name%+} ok (${states:-?} states, ${secs:-?} s)"
        [ "$expect" = ok ] || bad="expected a violation of $expect"
    else
        line="model: ${name%+} VIOLATION"
        if [ "$expect" = ok ]; then
            bad=$(grep -m1 -E 'violated|cycle|invalid end|too small' "$out" \
                  || echo "no result")
        elif ! grep -E 'violated|cycle' "$out" | grep -qF "$expect"; then
            bad="expected $expect, got: $(grep -m1 -E 'violated|cycle' "$out" \
                                          || echo "no violation")"
        fi
    fi

    if [ -n "$bad" ]; then
        line="$line  <- check failed: $bad"
        echo fail >"$work/$i.ok"
    else
        echo pass >"$work/$i.ok"
    fi
    echo "$line" >"$work/$i.line"
    rm -rf "$dir"
}

jobs_max=${MODEL_JOBS:-$(nproc 2>/dev/null || echo 2)}
passed=0
failed=0
next=0

# print finished results in the order of the table
flush() {
    while [ "$next" -lt "${#configs[@]}" ]; do
        if [ -e "$work/$next.skip" ]; then
            next=$((next + 1))
            continue
        fi
        [ -e "$work/$next.ok" ] || return 0
        cat "$work/$next.line"
        if [ "$(cat "$work/$next.ok")" = pass ]; then
            passed=$((passed + 1))
        else
            failed=$((failed + 1))
        fi
        next=$((next + 1))
    done
}

for i in "${!configs[@]}"; do
    IFS='|' read -r name expect flags <<<"${configs[$i]}"
    if [ -n "${MODEL_ONLY:-}" ] && ! [[ $name =~ $MODEL_ONLY ]]; then
        touch "$work/$i.skip"
        continue
    fi
    while [ "$(jobs -rp | wc -l)" -ge "$jobs_max" ]; do
        wait -n || true
        flush
    done
    check "$i" "$name" "$expect" "$flags" &
done
wait
flush

echo "$passed passed, $failed failed"
[ "$failed" -eq 0 ]
