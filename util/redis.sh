#!/usr/bin/env bash
# util/redis.sh start|stop|restart|kill [port]: a private, throw-away Redis
# (no persistence) for the tests, the demo and the bench.  REDIS_SERVER and
# REDIS_CLI name the server and its client (valkey-server and valkey-cli
# for Valkey; default redis-server and redis-cli).
set -euo pipefail

server=${REDIS_SERVER:-redis-server}
cli=${REDIS_CLI:-redis-cli}

cmd=$1
port=${2:-${TEST_NGINX_REDIS_PORT:-16379}}
dir=${REDIS_DIR:-/tmp/ngx-idempotency-redis-$port}

start() {
    mkdir -p "$dir"
    "$server" --port "$port" --bind 127.0.0.1 --save '' --appendonly no \
        --daemonize yes --dir "$dir" --pidfile "$dir/redis.pid" \
        --logfile "$dir/redis.log" --unixsocket "$dir/redis.sock" \
        --unixsocketperm 777 --enable-debug-command yes
    for _ in $(seq 50); do
        "$cli" -p "$port" ping >/dev/null 2>&1 && return 0
        sleep 0.1
    done
    echo "redis did not start on port $port" >&2
    return 1
}

stop() {
    if [ -f "$dir/redis.pid" ]; then
        kill "$(cat "$dir/redis.pid")" 2>/dev/null || true
        for _ in $(seq 50); do
            "$cli" -p "$port" ping >/dev/null 2>&1 || break
            sleep 0.1
        done
        rm -f "$dir/redis.pid"
    fi
}

case $cmd in
    start) stop; start ;;
    stop) stop ;;
    restart) stop; start ;;
    kill) [ -f "$dir/redis.pid" ] && kill -9 "$(cat "$dir/redis.pid")"; rm -f "$dir/redis.pid" ;;
    *) echo "usage: $0 start|stop|restart|kill [port]" >&2; exit 2 ;;
esac
