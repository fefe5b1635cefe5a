#!/usr/bin/env bash
# bench/durability.sh MODULE.so: what each Redis persistence setting loses
# on kill -9 (`make durability`; the table is in docs/operations.md).
#
# For each setting (none, AOF everysec, AOF always): a private Redis, an
# nginx with the module in front of an origin that logs every execution,
# 8 clients sending POSTs with fresh keys; after DURATION seconds Redis is
# killed with -9 while they run, and restarted from its own files.  Then
# every key the origin executed is looked up: a key without its record
# (stored response, or claim) is one a retry would run again.  The claims
# and records of requests that were answered 503 during the outage do not
# count (nothing ran).  Loopback only, bounded in time.
#
# REDIS_SERVER and REDIS_CLI name the server and its client (redis-server
# and redis-cli by default; valkey-server and valkey-cli for Valkey), as
# for util/test.sh, bench/run.sh and util/topology.sh.
set -euo pipefail

module=$(cd "$(dirname "$1")" && pwd)/$(basename "$1")
top=$(cd "$(dirname "$0")/.." && pwd)
port=${DURABILITY_REDIS_PORT:-16479}
edge=${DURABILITY_PORT:-19870}
origin=$((edge + 1))
duration=${DURABILITY_SECONDS:-3}
REDIS_SERVER=${REDIS_SERVER:-redis-server}
REDIS_CLI=${REDIS_CLI:-redis-cli}
work=$(mktemp -d /tmp/ngx-idempotency-durability.XXXXXX)
trap 'cleanup' EXIT

cleanup() {
    [ -f "$work/nginx/logs/nginx.pid" ] &&
        nginx -p "$work/nginx/" -c conf/nginx.conf -s stop 2>/dev/null
    [ -f "$work/redis/redis.pid" ] && kill -9 "$(cat "$work/redis/redis.pid")" 2>/dev/null
    rm -rf "$work"
}

redis_start() {
    local mode=$1
    local -a persist
    case $mode in
        none)     persist=(--appendonly no --save '') ;;
        everysec) persist=(--appendonly yes --appendfsync everysec --save '') ;;
        always)   persist=(--appendonly yes --appendfsync always --save '') ;;
    esac
    mkdir -p "$work/redis"
    "$REDIS_SERVER" --port "$port" --bind 127.0.0.1 "${persist[@]}" \
        --daemonize yes --dir "$work/redis" --pidfile "$work/redis/redis.pid" \
        --logfile "$work/redis/redis.log"
    for _ in $(seq 100); do
        "$REDIS_CLI" -p "$port" ping 2>/dev/null | grep -q PONG && return 0
        sleep 0.1
    done
    echo "redis did not start" >&2
    return 1
}

mkdir -p "$work/nginx/logs" "$work/nginx/conf"
user=""
[ "$(id -u)" -eq 0 ] && user="user root;"
cat > "$work/nginx/conf/nginx.conf" <<EOF
load_module $module;
$user
worker_processes 1;
error_log logs/error.log warn;
pid logs/nginx.pid;
events { worker_connections 1024; }
http {
    access_log off;
    log_format exec '\$http_idempotency_key';
    idempotency_redis 127.0.0.1:$port;
    idempotency_redis_timeout 300ms;
    server {
        listen 127.0.0.1:$edge;
        location / {
            idempotency on;
            proxy_pass http://127.0.0.1:$origin;
        }
    }
    server {
        listen 127.0.0.1:$origin;
        location / {
            access_log $work/nginx/logs/exec.log exec;
            return 201 "ok\n";
        }
    }
}
EOF

# the table in docs/operations.md is Redis's: say when it is another's
if [ "$REDIS_SERVER" != redis-server ]; then
    echo "== $("$REDIS_SERVER" --version | awk '{ print $1, $2, $3 }')"
fi
printf '%-10s %10s %10s %10s %8s\n' persistence executed kept lost lost%
for mode in none everysec always; do
    rm -rf "$work/redis"
    : > "$work/nginx/logs/exec.log"
    redis_start "$mode"
    if [ -f "$work/nginx/logs/nginx.pid" ]; then
        nginx -p "$work/nginx/" -c conf/nginx.conf -s reload
    else
        nginx -p "$work/nginx/" -c conf/nginx.conf
    fi
    sleep 0.5

    # the clients: fresh keys, as fast as each one is answered
    python3 - "$edge" "$duration" "$mode" <<'PY' &
import http.client, sys, threading, time
port, duration, mode = int(sys.argv[1]), float(sys.argv[2]), sys.argv[3]
end = time.time() + duration + 1.0
def client(n):
    i = 0
    while time.time() < end:
        i += 1
        try:
            c = http.client.HTTPConnection('127.0.0.1', port, timeout=2)
            c.request('POST', '/pay', body='x',
                      headers={'Idempotency-Key': f'{mode}-{n}-{i}'})
            c.getresponse().read()
            c.close()
        except OSError:
            time.sleep(0.01)
threads = [threading.Thread(target=client, args=(n,)) for n in range(8)]
for t in threads: t.start()
for t in threads: t.join()
PY
    clients=$!
    sleep "$duration"
    kill -9 "$(cat "$work/redis/redis.pid")"
    wait "$clients"
    redis_start "$mode"
    # the stores that Redis did not acknowledge are sent again meanwhile
    sleep 2

    executed=$(sort -u "$work/nginx/logs/exec.log" | grep -c . || true)
    kept=$(sort -u "$work/nginx/logs/exec.log" | python3 -c '
import hashlib, sys
for k in sys.stdin.read().split():
    print("EXISTS idem:{%s}" % hashlib.sha256(b"\0" + k.encode()).hexdigest())
' | "$REDIS_CLI" -p "$port" | grep -c '^1$' || true)
    lost=$((executed - kept))
    printf '%-10s %10d %10d %10d %7s%%\n' "$mode" "$executed" "$kept" "$lost" \
        "$(awk -v l="$lost" -v e="$executed" 'BEGIN { printf "%.2f", e ? 100 * l / e : 0 }')"
    "$REDIS_CLI" -p "$port" shutdown nosave >/dev/null 2>&1 || true
    rm -f "$work/redis/redis.pid"
done
