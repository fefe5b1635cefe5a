#!/usr/bin/env bash
# Runs the libFuzzer targets one after the other, each for FUZZ_SECONDS
# (default 300), and prints executions, coverage and corpus size of each.
# Exits non-zero if any target crashed (or if a saved crash still does).
#
#   fuzz/run.sh [--merge] [target...]  targets: key record roundtrip resp json
#
#   FUZZ_SECONDS   time per target (libFuzzer -max_total_time)
#   FUZZ_ARGS      more libFuzzer flags, e.g. "-max_len=4096"
#   FUZZ_NO_BUILD  set: do not install packages or run build.sh first
#   --merge        afterwards, minimise the committed corpus with what was
#                  found (-merge=1) and replace fuzz/corpus/<target> by it
#
# New inputs go to fuzz/.build/corpus/<target> (git-ignored); the committed
# fuzz/corpus/<target> is only read, unless --merge.  Crashing inputs are
# written to fuzz/crashes/<target>-crash-<sha1>.  Every saved crash of a
# target is replayed before it is fuzzed: if one still crashes (a known bug
# not fixed yet, or a regression), the target fails and is not fuzzed.
set -uo pipefail

top=$(cd "$(dirname "$0")/.." && pwd)
fz=$top/fuzz
out=$fz/.build
seconds=${FUZZ_SECONDS:-300}
merge=0

if [ "${1:-}" = "--merge" ]; then
    merge=1
    shift
fi

targets=("$@")
[ ${#targets[@]} -eq 0 ] && targets=(key record roundtrip resp json)

if [ -z "${FUZZ_NO_BUILD:-}" ]; then
    "$fz/../util/deps.sh" clang libclang-rt-14-dev || exit 1
    "$fz/build.sh" || exit 1
fi

mkdir -p "$fz/crashes"
failed=()
summary=()

for t in "${targets[@]}"; do
    bin=$out/fuzz_$t
    corpus=$fz/corpus/$t
    work=$out/corpus/$t
    log=$out/$t.log

    [ -x "$bin" ] || { echo "no $bin" >&2; exit 1; }
    mkdir -p "$corpus" "$work"

    # saved crashes first: regression inputs
    known=()
    for f in "$fz"/crashes/"$t"-*; do
        [ -f "$f" ] && known+=("$f")
    done

    if [ ${#known[@]} -gt 0 ]; then
        if "$bin" "${known[@]}" > "$log" 2>&1; then
            echo "== $t: ${#known[@]} saved crash(es) replayed, none crashes"
        else
            echo "== $t: a saved crash still crashes; not fuzzing $t"
            grep -E "ERROR: AddressSanitizer|runtime error|assertion|SUMMARY" \
                "$log" | head -5 | sed 's/^/   /'
            failed+=("$t")
            summary+=("$t: saved crash still crashes (see $log)")
            continue
        fi
    fi

    dict=()
    [ -f "$fz/$t.dict" ] && dict=(-dict="$fz/$t.dict")

    echo "== $t: fuzzing for ${seconds}s (log: $log)"

    # shellcheck disable=SC2086
    "$bin" -max_total_time="$seconds" -print_final_stats=1 -timeout=10 \
        -rss_limit_mb=2048 -artifact_prefix="$fz/crashes/$t-" \
        "${dict[@]}" ${FUZZ_ARGS:-} "$work" "$corpus" > "$log" 2>&1
    rc=$?

    execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -1)
    cov=$(grep -E '^#[0-9]+' "$log" | grep -o 'cov: [0-9]* ft: [0-9]*' \
          | tail -1)
    ncorp=$(grep -E '^#[0-9]+' "$log" | grep -o 'corp: [0-9]*/[0-9]*b' \
            | tail -1)

    if [ $rc -ne 0 ]; then
        grep -E "ERROR: AddressSanitizer|ERROR: libFuzzer|runtime error|assertion|SUMMARY|Test unit written" \
            "$log" | head -8 | sed 's/^/   /'
        failed+=("$t")
        summary+=("$t: CRASH after ${execs:-?} executions ($cov)")
        continue
    fi

    line="$t: ${execs:-?} executions in ${seconds}s, $cov, $ncorp"

    if [ $merge = 1 ]; then
        rm -rf "$out/merge/$t"
        mkdir -p "$out/merge/$t"
        if "$bin" -merge=1 "${dict[@]}" "$out/merge/$t" "$corpus" "$work" \
            > "$out/$t.merge.log" 2>&1
        then
            find "$corpus" -type f -delete
            cp "$out/merge/$t"/* "$corpus"/ 2>/dev/null
            line="$line; merged: $(find "$corpus" -type f | wc -l) files, $(du -sb "$corpus" | cut -f1) bytes"
        else
            line="$line; merge FAILED (see $out/$t.merge.log)"
            failed+=("$t")
        fi
    fi

    summary+=("$line")
done

echo
echo "== summary"
printf '   %s\n' "${summary[@]}"

if [ ${#failed[@]} -gt 0 ]; then
    echo "FAILED: ${failed[*]}"
    exit 1
fi
