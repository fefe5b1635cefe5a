#!/usr/bin/env bash
# bench/redis-cost.sh: Redis's own time for the module's commands and for
# native alternatives (docs/performance.md, "Suggestions").
#
# Starts a private Redis (port BENCH_REDIS_PORT+2, 16502), loads the module's
# claim and finish scripts exactly as src/store/ngx_http_idempotency_script.c has
# them, and runs redis-benchmark (8 clients) for each command below, printing
# Redis's time per call from INFO commandstats (CONFIG RESETSTAT before each;
# a script's figure includes the GET/SET it runs).  About 30 seconds.
set -euo pipefail

top=$(cd "$(dirname "$0")/.." && pwd)
cd "$top"

PORT=$(( ${BENCH_REDIS_PORT:-16500} + 2 ))
export REDIS_DIR=/tmp/ngx-idempotency-redis-cost

command -v redis-benchmark >/dev/null || { echo "missing redis-benchmark" >&2; exit 1; }

trap './util/redis.sh stop "$PORT" >/dev/null 2>&1 || true; rm -rf "$REDIS_DIR"' EXIT
./util/redis.sh start "$PORT" >/dev/null

r() { redis-cli -p "$PORT" "$@"; }

# the scripts, from the C source: the lines between ngx_string( and );
script() {
    sed -n "/$1 = ngx_string(/,/^);/p" src/store/ngx_http_idempotency_script.c \
        | sed -n 's/^ *"\(.*\)\\n"$/\1/p' | sed "s/\\\\'/'/g"
}
claim=$(script ngx_http_idempotency_claim_script)
finish=$(script ngx_http_idempotency_finish_script)
stage='redis.call("SET", KEYS[1], ARGV[2], "PX", ARGV[3]) return 1'
claim_sha=$(r script load "$claim")
finish_sha=$(r script load "$finish")
stage_sha=$(r script load "$stage")

claim53=$(head -c 53 /dev/zero | tr '\0' c)     # a claim record's size
rec330=$(head -c 330 /dev/zero | tr '\0' r)     # a small stored record
rec125k=$(head -c 128000 /dev/zero | tr '\0' r) # argv strings stop at 128 KB
rec256k=$(head -c 262400 /dev/zero | tr '\0' r)

# run NAME N COMMAND...: time per call of every command Redis counted
run() {
    local name=$1 n=$2
    shift 2
    r config resetstat >/dev/null
    redis-benchmark -p "$PORT" -c 8 -r 1000000000 -n "$n" "$@" >/dev/null 2>&1
    printf '  %-48s' "$name"
    r info commandstats | tr -d '\r' \
        | sed -n 's/^cmdstat_\([a-z]*\):calls=\([0-9]*\),usec=[0-9]*,usec_per_call=\([0-9.]*\).*/\1 \3/p' \
        | grep -vE '^(config|script|info) ' \
        | awk '{ printf " %s %6.2f us", $1, $2 } END { print "" }'
}

echo "Redis time per call (usec_per_call), redis-benchmark -c 8:"
echo "claim, new key:"
r flushall >/dev/null
run "EVALSHA claim script (GET, SET PX)" 100000 \
    evalsha "$claim_sha" 1 'k:__rand_int__' "$claim53" 60000
r flushall >/dev/null
run "SET NX PX GET (Redis >= 7.0)" 100000 \
    set 'k:__rand_int__' "$claim53" NX PX 60000 GET

echo "claim of a stored 330-byte record (a replay):"
r set small "$rec330" >/dev/null
run "EVALSHA claim script" 100000 evalsha "$claim_sha" 1 small "$claim53" 60000
run "SET NX PX GET" 100000 set small "$claim53" NX PX 60000 GET

echo "claim of a stored 256 KB record (a large replay):"
printf '%s' "$rec256k" | r -x set big >/dev/null
run "EVALSHA claim script" 5000 evalsha "$claim_sha" 1 big "$claim53" 60000
run "SET NX PX GET" 5000 set big "$claim53" NX PX 60000 GET
run "GET" 5000 get big

echo "finish (key not ours: the script's GET and compare only):"
run "EVAL finish script (text sent each time)" 100000 \
    eval "$finish" 1 'f:__rand_int__' "$claim53" "$rec330" 86400000
run "EVALSHA finish script" 100000 \
    evalsha "$finish_sha" 1 'f:__rand_int__' "$claim53" "$rec330" 86400000

echo "storing a 125 KB record:"
r flushall >/dev/null
run "EVALSHA, value through Lua (SET ARGV[2])" 3000 \
    evalsha "$stage_sha" 1 's:__rand_int__' "$claim53" "$rec125k" 86400000
r flushall >/dev/null
run "native SET PX" 3000 set 's:__rand_int__' "$rec125k" PX 86400000
