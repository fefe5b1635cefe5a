#!/usr/bin/env bash
# demo/run.sh MODULE.so: a live demo of ngx_http_idempotency_module with curl.
#
# Starts a private Redis (util/redis.sh) and one nginx with three servers:
# the edge (the module in front of /payments), a loopback-only server with
# the metrics and the admin view, and a stand-in payments API that logs one
# line per execution.  Then walks through new / replay / conflict /
# mismatch / bypass, the admin view of a key and the metrics.  Exits
# non-zero when a status code or the number of upstream executions is not
# the expected one, so it doubles as a smoke test.
#
# Everything lives in a directory of its own (mktemp -d, or DEMO_PREFIX),
# removed at the end unless something failed.  With DEMO_KEEP=1 (make demo
# KEEP=1) the servers keep running: the script prints what to try and the
# one command that stops them.
#
# Environment: EDGE_PORT (8080), UPSTREAM_PORT (8081), ADMIN_PORT (8082),
# REDIS_PORT (16400), DEMO_PREFIX (a new mktemp -d), DEMO_KEEP,
# NGINX (/usr/sbin/nginx),
# ECHO_MODULE (/usr/lib/nginx/modules/ngx_http_echo_module.so).
set -euo pipefail

top=$(cd "$(dirname "$0")/.." && pwd)
# shellcheck source=util/lib.sh
. "$top/util/lib.sh"
module_arg "$@"
cd "$top"

EDGE_PORT=${EDGE_PORT:-8080}
UPSTREAM_PORT=${UPSTREAM_PORT:-8081}
ADMIN_PORT=${ADMIN_PORT:-8082}
REDIS_PORT=${REDIS_PORT:-16400}
NGINX=${NGINX:-/usr/sbin/nginx}
ECHO_MODULE=${ECHO_MODULE:-/usr/lib/nginx/modules/ngx_http_echo_module.so}
case ${DEMO_KEEP:-} in ''|0|no|false) keep= ;; *) keep=1 ;; esac

edge=http://127.0.0.1:$EDGE_PORT
ops=http://127.0.0.1:$ADMIN_PORT
# where a kept demo says how to stop it, for the next run to find
kept_note=${TMPDIR:-/tmp}/ngx-idempotency-demo.kept
fails=0

for f in "$NGINX" "$ECHO_MODULE"; do
    [ -e "$f" ] || { echo "missing $f (apt-get install nginx libnginx-mod-http-echo)" >&2; exit 1; }
done

# something accepts connections on 127.0.0.1:PORT (no ss or netstat needed)
port_busy() {
    (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null
}

for p in "$EDGE_PORT" "$UPSTREAM_PORT" "$ADMIN_PORT" "$REDIS_PORT"; do
    if port_busy "$p"; then
        echo "port $p is in use." >&2
        if [ -f "$kept_note" ]; then
            echo "A demo kept running (KEEP=1) may hold it; stop it with:" >&2
            echo "    $(cat "$kept_note")" >&2
        fi
        echo "Or choose other ports, e.g. EDGE_PORT=18080 UPSTREAM_PORT=18081" \
             "ADMIN_PORT=18082 REDIS_PORT=16401 $0 $1" >&2
        exit 1
    fi
done

# The demo's own directory.  A DEMO_PREFIX given by the user is emptied
# only if an earlier demo made it (the marker file), never otherwise.
if [ -n "${DEMO_PREFIX:-}" ]; then
    PREFIX=$DEMO_PREFIX
    if [ -e "$PREFIX" ] && [ -n "$(ls -A "$PREFIX" 2>/dev/null)" ]; then
        if [ ! -f "$PREFIX/.ngx-idempotency-demo" ]; then
            echo "DEMO_PREFIX $PREFIX is not empty and not a demo's: choose another" >&2
            exit 1
        fi
        rm -rf "${PREFIX:?}"/*
    fi
    mkdir -p "$PREFIX"
else
    PREFIX=$(mktemp -d "${TMPDIR:-/tmp}/ngx-idempotency-demo.XXXXXX")
fi
PREFIX=$(cd "$PREFIX" && pwd)
touch "$PREFIX/.ngx-idempotency-demo"
mkdir -p "$PREFIX"/{conf,logs,tmp,out,redis}

pidfile=$PREFIX/logs/nginx.pid
out=$PREFIX/out
export REDIS_DIR=$PREFIX/redis
nginx_cmd=("$NGINX" -p "$PREFIX/" -c "$PREFIX/conf/nginx.conf" -e "$PREFIX/logs/error.log")

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
    if [ "$rc" -eq 0 ] && [ -z "${DEMO_PREFIX:-}" ]; then
        rm -rf "$PREFIX"
    fi
    exit "$rc"
}

trap cleanup EXIT

sed -e "s|@PREFIX@|$PREFIX|g" -e "s|@MODULE@|$module|g" \
    -e "s|@ECHO_MODULE@|$ECHO_MODULE|g" -e "s|@REDIS_PORT@|$REDIS_PORT|g" \
    -e "s|@EDGE_PORT@|$EDGE_PORT|g" -e "s|@UPSTREAM_PORT@|$UPSTREAM_PORT|g" \
    -e "s|@ADMIN_PORT@|$ADMIN_PORT|g" \
    demo/nginx.conf.in > "$PREFIX/conf/nginx.conf"

./util/redis.sh start "$REDIS_PORT"

if ! "${nginx_cmd[@]}" -q -t || ! "${nginx_cmd[@]}"; then
    echo "nginx did not start; see $PREFIX/logs/error.log" >&2
    tail -5 "$PREFIX/logs/error.log" >&2 || true
    exit 1
fi
for _ in $(seq 50); do
    port_busy "$EDGE_PORT" && port_busy "$ADMIN_PORT" && break
    sleep 0.1
done

# --- helpers ----------------------------------------------------------------

# call NAME CURL-ARGS...: one request as account "acct_alice", saved under $out
call() {
    local name=$1
    shift
    curl -sS -m 10 -o "$out/$name.body" -D "$out/$name.head" \
        -H 'X-Account-Id: acct_alice' "$@" || true
}

# show NAME EXPECTED-STATUS: print status line, relevant headers, body, verdict
show() {
    local name=$1 expected=$2 line code
    line=$(head -n 1 "$out/$name.head" 2>/dev/null | tr -d '\r')
    code=$(awk 'NR == 1 { print $2 }' "$out/$name.head" 2>/dev/null)
    echo "    < ${line:-(no response)}"
    grep -iE '^(x-idempotency-status|idempotent-replayed|retry-after|content-type|x-should-retry):' \
        "$out/$name.head" 2>/dev/null | tr -d '\r' | sed 's/^/    < /' || true
    [ -s "$out/$name.body" ] && echo "    $(tr -d '\n' < "$out/$name.body")"
    check "$code" "$expected"
}

# check GOT EXPECTED: the verdict line
check() {
    if [ "$1" = "$2" ]; then
        echo "    ok: $1 as expected"
    else
        echo "    FAIL: expected $2, got ${1:-nothing}"
        fails=$((fails + 1))
    fi
}

# holds FILE REGEX WHAT: a verdict on what a body holds
holds() {
    if grep -qE "$2" "$1" 2>/dev/null; then
        echo "    ok: $3"
    else
        echo "    FAIL: expected $3"
        fails=$((fails + 1))
    fi
}

step() { echo; echo "$*"; }
cmd() { echo "    \$ curl -X POST -H 'X-Account-Id: acct_alice' $*"; }

body_a='{"amount":1000,"currency":"EUR"}'
body_a2='{"amount":9999,"currency":"EUR"}'
body_b='{"amount":250,"currency":"EUR"}'

# --- the demo ---------------------------------------------------------------

cat <<EOF
== ngx_http_idempotency_module demo ==
How to read this: curl talks to the edge nginx ($edge), where the
module runs; it proxies to a fake payments API (127.0.0.1:$UPSTREAM_PORT) that
"charges" once per request it receives. Redis: 127.0.0.1:$REDIS_PORT.
Metrics and the admin view: $ops (loopback only).
Each step: what it shows, the curl command, then "<" lines (status line,
X-Idempotency-Status = what the module decided, Idempotent-Replayed,
Retry-After, Content-Type), the body, and whether the status was expected.
All requests carry "X-Account-Id: acct_alice": the idempotency scope, so
each account has its own keys. In production, take the account from your
authentication, never from the Authorization header itself: a refreshed
token would be a new scope, and a retry with it would run again.
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
echo "    (idempotency_required on makes it a 400 instead)"
cmd "-d '$body_a' $edge/payments"
call n1 -X POST -d "$body_a" "$edge/payments"
show n1 200

executions=$(wc -l < "$PREFIX/logs/upstream.log")
echo
echo "upstream executions: $executions"
echo "    expected 3: key A once (the replay and the 422 never reached it), key B"
echo "    once (the 409 duplicate never reached it), the keyless POST once."
check "$executions" 3

step "[6] What Redis holds for key A: the admin view (an operator's first look"
echo "    when a client writes \"was I charged twice?\"), by key and scope:"
admin_url="$ops/idempotency/admin?key=A&scope=acct_alice"
echo "    \$ curl '$admin_url'"
code=$(curl -sS -m 10 -o "$out/admin.body" -w '%{http_code}' "$admin_url" || true)
echo "    $(cat "$out/admin.body" 2>/dev/null)"
check "$code" 200
holds "$out/admin.body" '"state":"completed"' \
    "state completed: a retry gets the stored response"
hash=$(awk '/idempotency=new/ { sub(/.*key=/, ""); print; exit }' "$PREFIX/logs/edge.log")
echo "    The access log names the key by its hash (never the key itself):"
echo "    $(grep -m1 'idempotency=new' "$PREFIX/logs/edge.log")"
echo "    and ?hash= shows the same record:"
echo "    \$ curl '$ops/idempotency/admin?hash=$hash'"
curl -sS -m 10 -o "$out/admin-hash.body" "$ops/idempotency/admin?hash=$hash" || true
# the same record; stored_at and expires_at are worked out from the clock
# and Redis's PTTL, and may move by a millisecond between the two looks
same_record() {
    local times='s/"(stored_at|expires_at)":"[^"]*"//g'
    [ "$(sed -E "$times" "$1")" = "$(sed -E "$times" "$2")" ]
}
if same_record "$out/admin.body" "$out/admin-hash.body"; then
    echo "    ok: the same record"
else
    echo "    FAIL: ?hash= answered $(cat "$out/admin-hash.body" 2>/dev/null)"
    fails=$((fails + 1))
fi

step "[7] The metrics Prometheus scrapes (a few lines of them):"
echo "    \$ curl $ops/metrics"
code=$(curl -sS -m 10 -o "$out/metrics.body" -w '%{http_code}' "$ops/metrics" || true)
grep -E '^nginx_idempotency_requests_total' "$out/metrics.body" 2>/dev/null \
    | sed 's/^/    /' || true
check "$code" 200
holds "$out/metrics.body" \
    '^nginx_idempotency_requests_total\{.*status="replay".*\} 1$' \
    "the replay of [2] counted"

echo
if [ "$fails" -ne 0 ]; then
    echo "DEMO FAILED: $fails check(s); logs in $PREFIX/logs/"
    exit 1
fi

if [ -z "$keep" ]; then
    echo "All checks passed. (make demo KEEP=1 leaves the servers running)"
    exit 0
fi

# --- kept running: what to try, and how to stop -----------------------------

cat > "$PREFIX/stop.sh" <<EOF
#!/bin/sh
# stops the demo in $PREFIX (nginx, then Redis) and removes the directory
"$NGINX" -p "$PREFIX/" -c "$PREFIX/conf/nginx.conf" -e "$PREFIX/logs/error.log" -s quit 2>/dev/null
[ -f "$PREFIX/redis/redis.pid" ] && kill "\$(cat "$PREFIX/redis/redis.pid")" 2>/dev/null
i=0
while [ -f "$PREFIX/logs/nginx.pid" ] && [ \$i -lt 50 ]; do sleep 0.1; i=\$((i + 1)); done
rm -f "$kept_note"
EOF
[ -z "${DEMO_PREFIX:-}" ] && echo "rm -rf '$PREFIX'" >> "$PREFIX/stop.sh"
echo 'echo "demo stopped"' >> "$PREFIX/stop.sh"
chmod +x "$PREFIX/stop.sh"
echo "sh $PREFIX/stop.sh" > "$kept_note"

trap - EXIT
cat <<EOF
All checks passed. The servers keep running (KEEP=1); try:

  curl -i -X POST -H 'X-Account-Id: acct_alice' -H 'Idempotency-Key: C' -d '{"amount":5}' $edge/payments
  curl -i -X POST -H 'X-Account-Id: acct_alice' -H 'Idempotency-Key: C' -d '{"amount":5}' $edge/payments
  curl -i -X POST -H 'X-Account-Id: acct_bob'   -H 'Idempotency-Key: C' -d '{"amount":5}' $edge/payments
  curl -s '$ops/idempotency/admin?key=C&scope=acct_alice'
  curl -s -X DELETE '$ops/idempotency/admin?key=C&scope=acct_alice'
  curl -s $ops/metrics | grep ^nginx_idempotency_requests_total

Logs: $PREFIX/logs/
  (edge.log: what the module did; upstream.log: one line per execution)
Configuration: $PREFIX/conf/nginx.conf

Stop everything with:

  sh $PREFIX/stop.sh
EOF
