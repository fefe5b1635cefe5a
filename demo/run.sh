#!/usr/bin/env bash
# demo/run.sh MODULE.so: a live demo of ngx_http_idempotency_module with curl.
#
# Starts a private Redis (util/redis.sh) and one nginx with two servers: the
# edge (the module in front of /payments) and a stand-in payments API that
# logs one line per execution.  Then walks through new / replay / conflict /
# mismatch / bypass.  Exits non-zero when a status code or the number of
# upstream executions is not the expected one, so it doubles as a smoke test.
#
# Environment: EDGE_PORT (8080), UPSTREAM_PORT (8081), REDIS_PORT (16400),
# DEMO_PREFIX (/tmp/ngx-idempotency-demo), NGINX (/usr/sbin/nginx),
# ECHO_MODULE (/usr/lib/nginx/modules/ngx_http_echo_module.so).
set -euo pipefail

if [ $# -ne 1 ] || [ ! -f "$1" ]; then
    echo "usage: $0 path/to/ngx_http_idempotency_module.so" >&2
    exit 2
fi

module=$(cd "$(dirname "$1")" && pwd)/$(basename "$1")
top=$(cd "$(dirname "$0")/.." && pwd)
cd "$top"

EDGE_PORT=${EDGE_PORT:-8080}
UPSTREAM_PORT=${UPSTREAM_PORT:-8081}
REDIS_PORT=${REDIS_PORT:-16400}
PREFIX=${DEMO_PREFIX:-/tmp/ngx-idempotency-demo}
NGINX=${NGINX:-/usr/sbin/nginx}
ECHO_MODULE=${ECHO_MODULE:-/usr/lib/nginx/modules/ngx_http_echo_module.so}

edge=http://127.0.0.1:$EDGE_PORT
pidfile=$PREFIX/logs/nginx.pid
out=$PREFIX/out
fails=0

for f in "$NGINX" "$ECHO_MODULE"; do
    [ -e "$f" ] || { echo "missing $f (apt-get install nginx libnginx-mod-http-echo)" >&2; exit 1; }
done

# --- process management ---------------------------------------------------

stop_nginx() {
    local pid
    [ -f "$pidfile" ] || return 0
    pid=$(cat "$pidfile" 2>/dev/null || true)
    # only signal the pid if it still is an nginx (pid files can go stale)
    if [ -n "$pid" ] && [ "$(cat "/proc/$pid/comm" 2>/dev/null)" = nginx ]; then
        kill -QUIT "$pid" 2>/dev/null || true        # = nginx -s quit
        for _ in $(seq 50); do
            kill -0 "$pid" 2>/dev/null || break
            sleep 0.1
        done
        kill -TERM "$pid" 2>/dev/null || true
    fi
    rm -f "$pidfile"
}

cleanup() {
    local rc=$?
    trap - EXIT
    stop_nginx
    ./util/redis.sh stop "$REDIS_PORT" || true
    exit "$rc"
}

port_busy() {
    [ -n "$(ss -Hltn "sport = :$1" 2>/dev/null)" ]
}

# leftovers of an interrupted earlier run
stop_nginx
./util/redis.sh stop "$REDIS_PORT" || true

for p in "$EDGE_PORT" "$UPSTREAM_PORT" "$REDIS_PORT"; do
    if port_busy "$p"; then
        echo "port $p is in use; choose others, e.g." \
             "EDGE_PORT=18080 UPSTREAM_PORT=18081 REDIS_PORT=16401 $0 $1" >&2
        exit 1
    fi
done

trap cleanup EXIT

rm -rf "$PREFIX"
mkdir -p "$PREFIX"/{conf,logs,tmp,out}
sed -e "s|@PREFIX@|$PREFIX|g" -e "s|@MODULE@|$module|g" \
    -e "s|@ECHO_MODULE@|$ECHO_MODULE|g" -e "s|@REDIS_PORT@|$REDIS_PORT|g" \
    -e "s|@EDGE_PORT@|$EDGE_PORT|g" -e "s|@UPSTREAM_PORT@|$UPSTREAM_PORT|g" \
    demo/nginx.conf.in > "$PREFIX/conf/nginx.conf"

./util/redis.sh start "$REDIS_PORT"

nginx_cmd=("$NGINX" -p "$PREFIX/" -c "$PREFIX/conf/nginx.conf" -e "$PREFIX/logs/error.log")
if ! "${nginx_cmd[@]}" -q -t || ! "${nginx_cmd[@]}"; then
    echo "nginx did not start; see $PREFIX/logs/error.log" >&2
    tail -5 "$PREFIX/logs/error.log" >&2 || true
    exit 1
fi
for _ in $(seq 50); do
    port_busy "$EDGE_PORT" && break
    sleep 0.1
done

# --- helpers ----------------------------------------------------------------

# call NAME CURL-ARGS...: one request as tenant "alice", saved under $out
call() {
    local name=$1
    shift
    curl -sS -m 10 -o "$out/$name.body" -D "$out/$name.head" \
        -H 'Authorization: Bearer alice' "$@" || true
}

# show NAME EXPECTED-STATUS: print status line, relevant headers, body, verdict
show() {
    local name=$1 expected=$2 line code
    line=$(head -n 1 "$out/$name.head" 2>/dev/null | tr -d '\r')
    code=$(awk 'NR == 1 { print $2 }' "$out/$name.head" 2>/dev/null)
    echo "    < ${line:-(no response)}"
    grep -iE '^(x-idempotency-status|idempotent-replayed|retry-after|content-type):' \
        "$out/$name.head" 2>/dev/null | tr -d '\r' | sed 's/^/    < /' || true
    [ -s "$out/$name.body" ] && echo "    $(tr -d '\n' < "$out/$name.body")"
    if [ "$code" = "$expected" ]; then
        echo "    ok: $code as expected"
    else
        echo "    FAIL: expected $expected, got ${code:-nothing}"
        fails=$((fails + 1))
    fi
}

step() { echo; echo "$*"; }
cmd() { echo "    \$ curl -X POST $*"; }

body_a='{"amount":1000,"currency":"EUR"}'
body_a2='{"amount":9999,"currency":"EUR"}'
body_b='{"amount":250,"currency":"EUR"}'

# --- the demo ---------------------------------------------------------------

cat <<EOF
== ngx_http_idempotency_module demo ==
How to read this: curl talks to the edge nginx ($edge), where the
module runs; it proxies to a fake payments API (127.0.0.1:$UPSTREAM_PORT) that
"charges" once per request it receives. Redis: 127.0.0.1:$REDIS_PORT.
Each step: what it shows, the curl command, then "<" lines (status line,
X-Idempotency-Status = what the module decided, Idempotent-Replayed,
Retry-After, Content-Type), the body, and whether the status was expected.
All requests carry "Authorization: Bearer alice" (the idempotency scope).
EOF

step "[1] First POST with key A: claimed in Redis, runs upstream, response stored."
cmd "-H 'Idempotency-Key: A' -d '$body_a' $edge/payments"
call a1 -X POST -H 'Idempotency-Key: A' -d "$body_a" "$edge/payments"
show a1 200

step "[2] Client retries the same POST: answered from Redis, upstream not contacted."
cmd "-H 'Idempotency-Key: A' -d '$body_a' $edge/payments"
call a2 -X POST -H 'Idempotency-Key: A' -d "$body_a" "$edge/payments"
show a2 200
if cmp -s "$out/a1.body" "$out/a2.body"; then
    echo "    same body, same payment id as in [1]"
else
    echo "    FAIL: the replayed body differs from [1]"
    fails=$((fails + 1))
fi

step "[3] Slow POST with key B (3 s upstream) in the background, duplicate 0.5 s later."
cmd "-H 'Idempotency-Key: B' -d '$body_b' $edge/payments/slow   (twice)"
call b1 -X POST -H 'Idempotency-Key: B' -d "$body_b" "$edge/payments/slow" &
bg=$!
sleep 0.5
echo "    duplicate while the first is still running: 409, retry in 1 s"
call b2 -X POST -H 'Idempotency-Key: B' -d "$body_b" "$edge/payments/slow"
show b2 409
wait "$bg" || true
echo "    the background original, once it finished:"
show b1 200

step "[4] Key A reused with a different body (amount 9999): refused, nothing runs."
cmd "-H 'Idempotency-Key: A' -d '$body_a2' $edge/payments"
call a3 -X POST -H 'Idempotency-Key: A' -d "$body_a2" "$edge/payments"
show a3 422

step "[5] POST without Idempotency-Key: not protected, passes straight through."
cmd "-d '$body_a' $edge/payments"
call n1 -X POST -d "$body_a" "$edge/payments"
show n1 200

executions=$(wc -l < "$PREFIX/logs/upstream.log")
echo
echo "upstream executions: $executions"
echo "    expected 3: key A once (the replay and the 422 never reached it), key B"
echo "    once (the 409 duplicate never reached it), the keyless POST once."
if [ "$executions" != 3 ]; then
    echo "    FAIL: expected 3 executions"
    fails=$((fails + 1))
fi

echo
if [ "$fails" -ne 0 ]; then
    echo "DEMO FAILED: $fails check(s); logs in $PREFIX/logs/"
    exit 1
fi
echo "All checks passed. (logs kept in $PREFIX/logs/ until the next run)"
