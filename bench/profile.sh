#!/usr/bin/env bash
# bench/profile.sh MODULE.so: where the instructions of a fresh request go.
#
# Runs the plain edge and then the module edge (the same nginx.conf shapes as
# bench/run.sh) as a single process (master_process off) under
# valgrind --tool=callgrind, collecting only while wrk sends fresh POSTs
# (bench/fresh.lua, 1 thread, 4 connections, PROFILE_SECONDS, default 20, a
# few thousand requests under valgrind).  Then, without valgrind, counts the
# worker's system calls per request with strace -c.
#
# PROFILE_SCENARIO=large profiles large-fresh instead (64 KB POST, 256 KB
# answer).  Prints instructions per request for both edges and, per shared
# object (nginx, the module, hiredis, libcrypto, libc, ...), how many the
# module adds; the module edge's top 15 functions by inclusive and by
# exclusive cost; the inclusive cost of the module's own steps.  Valgrind's
# CPU has no SHA extensions, so SHA-256 costs several times what it does
# natively (see docs/performance.md).  Output files stay in
# PROFILE_DIR (/tmp/ngx-idempotency-profile): callgrind.{plain,module}.out,
# for callgrind_annotate or kcachegrind.
#
# Not part of `make bench` (it takes about two minutes): see
# docs/performance.md.  Ports: BENCH_UPSTREAM_PORT+10 .. +12 (18111-18113),
# Redis BENCH_REDIS_PORT+1 (16501).
set -euo pipefail

top=$(cd "$(dirname "$0")/.." && pwd)
# shellcheck source=util/lib.sh
. "$top/util/lib.sh"
module_arg "$@"
cd "$top"
# shellcheck source=bench/conf.sh
. bench/conf.sh

NGINX=${NGINX:-/usr/sbin/nginx}
DIR=${PROFILE_DIR:-/tmp/ngx-idempotency-profile}
SECONDS_=${PROFILE_SECONDS:-20}
# small: 200-byte POST, 11-byte answer (the fresh scenario); large: 64 KB
# POST, 256 KB answer (large-fresh)
SCENARIO=${PROFILE_SCENARIO:-small}
case $SCENARIO in
    small) BODY_SIZE=200 URI=/pay ;;
    large) BODY_SIZE=65536 URI=/large ;;
    *) echo "PROFILE_SCENARIO is small or large" >&2; exit 2 ;;
esac
UPSTREAM_PORT=$(( ${BENCH_UPSTREAM_PORT:-18101} + 10 ))
PLAIN_PORT=$((UPSTREAM_PORT + 1))
MODULE_PORT=$((UPSTREAM_PORT + 2))
REDIS_PORT=$(( ${BENCH_REDIS_PORT:-16500} + 1 ))
export REDIS_DIR=$DIR/redis

for t in valgrind callgrind_annotate callgrind_control wrk redis-cli curl; do
    command -v "$t" >/dev/null || { echo "missing $t (apt-get install valgrind)" >&2; exit 1; }
done

pids=()

cleanup() {
    local rc=$? p
    trap - EXIT INT TERM
    for p in "${pids[@]}"; do
        kill -QUIT "$p" 2>/dev/null || true
    done
    sleep 1
    for p in "${pids[@]}"; do
        kill -TERM "$p" 2>/dev/null || true
    done
    ./util/redis.sh stop "$REDIS_PORT" >/dev/null 2>&1 || true
    exit "$rc"
}

trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

for p in "$UPSTREAM_PORT" "$PLAIN_PORT" "$MODULE_PORT" "$REDIS_PORT"; do
    if [ -n "$(ss -Hltn "sport = :$p" 2>/dev/null)" ]; then
        echo "port $p is in use" >&2
        exit 1
    fi
done

rm -rf "$DIR"
mkdir -p "$DIR"/{upstream,plain,module,redis,www}

body "$DIR/body.json" "$BODY_SIZE"
body "$DIR/www/large.json" 262144

upstream_conf "$DIR" "$UPSTREAM_PORT" 1

# one process, in the foreground, under valgrind
single='daemon off;
master_process off;'
edge_conf "$DIR" plain "$PLAIN_PORT" "$UPSTREAM_PORT" "$single" "" "" ""
edge_conf "$DIR" module "$MODULE_PORT" "$UPSTREAM_PORT" \
    "load_module $module;
$single" "" "" \
    "            idempotency on;
            idempotency_redis 127.0.0.1:$REDIS_PORT;"

./util/redis.sh start "$REDIS_PORT" >/dev/null
"$NGINX" -p "$DIR/upstream/" -c "$DIR/upstream/nginx.conf" -e "$DIR/upstream/error.log"
pids+=("$(sleep 0.3; cat "$DIR/upstream/nginx.pid")")

handled() {
    curl -sS -m 30 "http://127.0.0.1:$1/bench-status" | awk 'NR == 3 { print $3 }'
}

wait_port() {
    for _ in $(seq 300); do
        [ -n "$(ss -Hltn "sport = :$1" 2>/dev/null)" ] && return 0
        sleep 0.1
    done
    echo "nothing listens on $1" >&2
    return 1
}

# warm PORT N: N fresh POSTs over one connection each (not collected)
warm() {
    local i
    for i in $(seq "$2"); do
        curl -sS -m 30 -o /dev/null -X POST -H "Idempotency-Key: warm-$i" \
             -H 'Content-Type: application/json' \
             --data-binary "@$DIR/body.json" "http://127.0.0.1:$1$URI"
    done
}

declare -A REQS IR

for side in plain module; do
    port=$(port_of $side)
    valgrind --tool=callgrind --instr-atstart=no \
        --callgrind-out-file="$DIR/callgrind.$side.out" \
        "$NGINX" -p "$DIR/$side/" -c "$DIR/$side/nginx.conf" \
        -e "$DIR/$side/error.log" > "$DIR/$side/valgrind.log" 2>&1 &
    vpid=$!
    pids+=("$vpid")
    wait_port "$port"
    warm "$port" 20

    s0=$(handled "$port")
    callgrind_control -i on "$vpid" > /dev/null
    wrk -t1 -c4 -d"${SECONDS_}s" --timeout 30s -s bench/fresh.lua \
        "http://127.0.0.1:$port$URI" -- "prof-$side" "$DIR/body.json" \
        > "$DIR/$side/wrk.txt" 2>&1
    sleep 1    # in-flight requests and their stores finish
    callgrind_control -i off "$vpid" > /dev/null
    s1=$(handled "$port")
    REQS[$side]=$((s1 - s0 - 1))

    kill -QUIT "$vpid"
    wait "$vpid" 2>/dev/null || true
    IR[$side]=$(sed -n 's/^totals: *\([0-9]*\).*/\1/p' "$DIR/callgrind.$side.out")
done

# the reports below end in head: no SIGPIPE failures
set +o pipefail

echo "== callgrind: instructions per fresh request ($SCENARIO; user space, nginx worker) =="
for side in plain module; do
    awk -v s="$side" -v ir="${IR[$side]}" -v n="${REQS[$side]}" 'BEGIN {
        printf "  %-6s %6d requests  %14.0f Ir  %8.0f Ir/request\n", s, n, ir, ir / n }'
done
awk -v a="${IR[plain]}" -v na="${REQS[plain]}" -v b="${IR[module]}" \
    -v nb="${REQS[module]}" 'BEGIN {
    printf "  module/plain: %.2fx, +%.0f Ir per request\n",
        (b / nb) / (a / na), b / nb - a / na }'
echo

ann() {
    callgrind_annotate --threshold=100 "$@" "$DIR/callgrind.module.out" 2>/dev/null \
        | grep -E '^ *[0-9,]+ ' | grep -v 'PROGRAM TOTALS'
}

echo "== module edge: top 15 functions by inclusive cost =="
ann --inclusive=yes | head -15
echo

echo "== module edge: top 15 functions by exclusive cost =="
ann --inclusive=no | head -15
echo

echo "== exclusive cost per shared object, Ir per request =="
printf "  %-28s %8s %8s %8s %6s\n" object plain module added share
for side in plain module; do
    callgrind_annotate --threshold=100 --inclusive=no "$DIR/callgrind.$side.out" \
        2>/dev/null | grep -E '^ *[0-9,]+ ' | grep -v 'PROGRAM TOTALS' \
        | awk -v s="$side" -v n="${REQS[$side]}" '{
            ir = $1; gsub(/,/, "", ir)
            obj = "?"
            if (match($0, /\[[^]]*\]$/)) obj = substr($0, RSTART + 1, RLENGTH - 2)
            k = split(obj, parts, "/"); obj = parts[k]
            sum[obj] += ir
          }
          END { for (o in sum) print s, o, sum[o] / n }'
done | awk '{ v[$2, $1] = $3; objs[$2] = 1; t[$1] += $3 }
    END {
        for (o in objs) {
            d = v[o, "module"] - v[o, "plain"]
            printf "  %-28s %8.0f %8.0f %+8.0f %5.1f%%\n", o, v[o, "plain"],
                   v[o, "module"], d, 100 * d / (t["module"] - t["plain"])
        }
    }' | sort -k5 -rn
echo

echo "== module edge: inclusive cost of the module's steps, Ir per request =="
ann --inclusive=yes \
    | grep -E 'ngx_http_idempotency_|redis[A-Z][A-Za-z]*|EVP_Digest' \
    | awk -v n="${REQS[module]}" -v total="${IR[module]}" '{
        ir = $1; gsub(/,/, "", ir)
        fn = $0; sub(/^ *[0-9,]+ +(\([^)]*\) +)?/, "", fn); sub(/ \[.*$/, "", fn)
        sub(/^[^:]*:/, "", fn)
        # a function can be listed under two file names: keep one line
        if (seen[fn]++) next
        printf "  %8.0f  %5.1f%%  %s\n", ir / n, 100 * ir / total, fn }' \
    | head -30
echo

# --- system calls, without valgrind -----------------------------------------

if command -v strace >/dev/null; then
    echo "== system calls per fresh request (strace -c on the worker, 3 s of wrk -c4) =="
    for side in plain module; do
        port=$(port_of $side)
        sed -i 's/^daemon off;$//; s/^master_process off;$//' "$DIR/$side/nginx.conf"
        "$NGINX" -p "$DIR/$side/" -c "$DIR/$side/nginx.conf" -e "$DIR/$side/error.log"
        sleep 0.3
        m=$(cat "$DIR/$side/nginx.pid")
        pids+=("$m")
        w=$({ cat /proc/[0-9]*/stat 2>/dev/null || true; } \
            | sed -E 's/^([0-9]+) \(.*\) /\1 /' | awk -v m="$m" '$3 == m { print $1 }')
        warm "$port" 5
        s0=$(handled "$port")
        strace -c -f -p "$w" -o "$DIR/$side/strace.txt" &
        spid=$!
        sleep 0.5
        wrk -t1 -c4 -d3s -s bench/fresh.lua "http://127.0.0.1:$port$URI" \
            -- "strace-$side" "$DIR/body.json" > /dev/null 2>&1
        sleep 0.5
        kill -INT "$spid"
        wait "$spid" 2>/dev/null || true
        s1=$(handled "$port")
        n=$((s1 - s0 - 1))
        # columns: % time, seconds, usecs/call, calls, [errors,] syscall
        awk -v s="$side" -v n="$n" '
            $1 ~ /^[0-9.]+$/ && $NF == "total" { t = $4; next }
            $1 ~ /^[0-9.]+$/ && $4 / n >= 0.01 {
                out = out sprintf(" %s %.2f", $NF, $4 / n) }
            END { printf "  %-6s %5d requests %5.2f syscalls/request:%s\n",
                         s, n, t / n, out }' "$DIR/$side/strace.txt"
        kill -QUIT "$m"
    done
fi
