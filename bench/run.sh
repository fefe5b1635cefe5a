#!/usr/bin/env bash
# bench/run.sh MODULE.so: the cost of ngx_http_idempotency_module, measured
# against the same nginx without it (`make bench`; method and figures in
# docs/performance.md).
#
# Starts a private Redis, a cheap upstream nginx (201 {"id":"ok"}), an edge
# nginx doing plain proxy_pass ("plain") and an identical edge with the
# module ("module"), then runs wrk against plain and module in alternation,
# round after round, for these scenarios (2 threads, 32 connections):
#
#   fresh         POST, 200-byte JSON body, a new Idempotency-Key every time
#   replay        POST repeating 16 keys stored beforehand
#   bypass        GET (not a protected method)
#   large-fresh   POST, 64 KB body, 256 KB response, new keys
#   large-replay  the same, repeating 4 keys stored beforehand
#   sweep         fresh at 32, 256 and 1024 connections
#   tls           tls-fresh and tls-replay: fresh and replay with the module
#                 talking to Redis over TLS (util/topology.sh standalone-tls,
#                 its private CA; a module edge of its own, "tls")
#   cluster       cluster-fresh and cluster-replay: the same against a Redis
#                 Cluster of 3 masters and 3 replicas (util/topology.sh
#                 cluster; edge "cluster", `idempotency_redis SEED cluster`)
#   wait          waiting duplicates (bench/wait.py, no wrk): per trial an
#                 original POST to an upstream answering after 200 ms and,
#                 20-50 ms later, 4 duplicates under `idempotency_wait 5s`
#                 (edge "wait"); the time from the original's response to
#                 each duplicate's (p50/p99/max) and the Redis commands and
#                 CPU per waiting duplicate, beyond what an original alone
#                 costs (measured first, without duplicates)
#   floor         what this box charges for the least the large scenarios
#                 must do (no wrk): Redis CPU per native SET of a new
#                 200-byte and 256 KB value and per GET of 256 KB
#                 (redis-benchmark, 32 clients), SHA-256 of the 64 KB body
#                 and AES-256-GCM of the 256 KB response (openssl speed:
#                 what BENCH_ENCRYPT=1 adds per large record); the report
#                 turns them into the best large-fresh and large-replay
#                 ratios reachable here
#
# With BENCH_ENCRYPT=1 every module edge seals its records with
# idempotency_encrypt_key (a key made by `openssl rand 32` in BENCH_DIR),
# so two runs, one with and one without, measure what encryption costs;
# the report's first line says which it was.
#
# tls-fresh etc. can be named alone in BENCH_SCENARIOS.  The plain side of
# the tls and cluster scenarios is the same plain edge, run in alternation.
#
# It checks correctness while it measures: no socket errors or timeouts,
# every response a 201 and, on the module edges, $idempotency_status the one
# the scenario expects (both edges log only the requests that are not what
# the scenario expects); the upstream sees each fresh key once, every
# completed request once, and no request at all on module replays; no nginx
# worker died; nothing at [error] or worse in the edge's error log.  For
# wait: the upstream ran once per key, every duplicate got the original's
# response (Idempotent-Replayed: true, the same body).  Per run it reads
# nginx, upstream, Redis and whole-machine CPU time from /proc, the edge's
# request count from stub_status and Redis INFO commandstats.  Redis CPU
# per request (us of Redis process CPU; for the cluster the sum over its
# six nodes, commands summed over the masters) is reported for every
# scenario.  It exits non-zero only when a correctness check fails, never
# for a missed performance target.
#
# REDIS_SERVER, REDIS_CLI and REDIS_BENCHMARK name the server and its tools
# (redis-server, redis-cli, redis-benchmark; valkey-server, valkey-cli and
# valkey-benchmark for Valkey; util/redis.sh and util/topology.sh read the
# first two as well).
#
# BENCH_NATIVE=1 measures the store path without scripts: the bench's
# Redis gets an ACL user that may not run scripts (-@scripting) and every
# module edge on it authenticates as that user, so the module finishes,
# renews and releases by native compare-and-set (SET ... IFEQ ... GET)
# instead of EVALSHA, and a large record goes in one SET IFEQ instead of a
# staged SET and a RENAME by script.  It needs a server with SET IFEQ
# (Valkey 8.1 or later), which it checks; every module run checks that no
# script ran (commandstats).  The tls and cluster scenarios, whose servers
# util/topology.sh starts without that user, are left out of the default
# scenarios and refused when named.  The report's first lines say which
# path was measured.
#
# BENCH_MODULE_DIRECTIVES adds directives to the module edge's location,
# to measure what one costs (idempotency_fresh_key_detect 10m;).
#
# Environment: BENCH_QUICK=1 (1 round of 3 s per scenario, 20 wait trials:
# a smoke run), BENCH_ROUNDS (3), BENCH_DURATION (10 s: fresh, replay,
# bypass), BENCH_LARGE_DURATION (4), BENCH_SWEEP_DURATION (4),
# BENCH_SWEEP_CONNS ("32 256 1024"), BENCH_TOPO_ROUNDS (2) and
# BENCH_TOPO_DURATION (5 s) for tls and cluster, BENCH_WAIT_TRIALS (200),
# BENCH_WAIT_BASELINE (50 trials without duplicates), BENCH_WAIT_DUPS (4),
# BENCH_WAIT_DELAY_MS (200), BENCH_WAIT_GAP_MS ("20:50"),
# BENCH_WAIT_PARALLEL (4 trials at a time), BENCH_WAIT_TIMEOUT (5s),
# BENCH_SCENARIOS ("fresh replay bypass large-fresh large-replay sweep tls
# cluster wait floor"), BENCH_ENCRYPT (0), BENCH_UPSTREAM_WORKERS (2),
# BENCH_DIR (/tmp/ngx-idempotency-bench), BENCH_UPSTREAM_PORT (18101),
# BENCH_PLAIN_PORT (18102), BENCH_MODULE_PORT (18103), BENCH_REDIS_PORT
# (16500), TOPO_BASE (16600: the TLS Redis on +0 and +1, the cluster on
# +11..+16 and +111..+116, see util/topology.sh), TOPO_DIR (BENCH_DIR/topo),
# BENCH_TLS_PORT, BENCH_CLUSTER_PORT, BENCH_WAIT_PORT and
# BENCH_WAIT_UPSTREAM_PORT (TOPO_BASE + 200, 201, 202, 203), NGINX
# (/usr/sbin/nginx).  Results stay in BENCH_DIR: report.txt, runs.tsv (one
# line per wrk run), summary.tsv (one line per scenario, with a header),
# wait.tsv, wait.txt and wait-latency.txt (one line per duplicate, ms),
# wrk/ (raw wrk output and Redis time per command of each run), the nginx
# logs.  The Redis instances, the nginx and bench/wait.py are stopped on
# exit, also on Ctrl-C.
#
# The machine is shared by wrk, three nginx and Redis: on a small box the
# throughput is bounded by the CPU all of them need per request, which is
# why the whole machine's CPU per request ("box") is reported too.
set -euo pipefail

top=$(cd "$(dirname "$0")/.." && pwd)
# shellcheck source=util/lib.sh
. "$top/util/lib.sh"
module_arg "$@"
cd "$top"
# shellcheck source=bench/conf.sh
. bench/conf.sh

NGINX=${NGINX:-/usr/sbin/nginx}
export REDIS_SERVER=${REDIS_SERVER:-redis-server}
export REDIS_CLI=${REDIS_CLI:-redis-cli}
REDIS_BENCHMARK=${REDIS_BENCHMARK:-redis-benchmark}
NATIVE=${BENCH_NATIVE:-0}
# the ACL user of BENCH_NATIVE=1: everything but scripting
NATIVE_USER=benchnolua
NATIVE_PASS=bench-$$-$RANDOM
DIR=${BENCH_DIR:-/tmp/ngx-idempotency-bench}
UPSTREAM_PORT=${BENCH_UPSTREAM_PORT:-18101}
PLAIN_PORT=${BENCH_PLAIN_PORT:-18102}
MODULE_PORT=${BENCH_MODULE_PORT:-18103}
REDIS_PORT=${BENCH_REDIS_PORT:-16500}
UPSTREAM_WORKERS=${BENCH_UPSTREAM_WORKERS:-2}
# the TLS and Cluster Redis (util/topology.sh) and the edges and the slow
# upstream of the tls, cluster and wait scenarios: TOPO_BASE and the
# offsets util/topology.sh leaves to its users (+200 ...)
export TOPO_BASE=${TOPO_BASE:-16600}
TOPO_ROOT=${TOPO_DIR:-$DIR/topo}
TLS_PORT=${BENCH_TLS_PORT:-$((TOPO_BASE + 200))}
CLUSTER_PORT=${BENCH_CLUSTER_PORT:-$((TOPO_BASE + 201))}
WAIT_PORT=${BENCH_WAIT_PORT:-$((TOPO_BASE + 202))}
WAIT_UPSTREAM_PORT=${BENCH_WAIT_UPSTREAM_PORT:-$((TOPO_BASE + 203))}
TLS_REDIS_PORT=$TOPO_BASE
CLUSTER_SEED_PORT=$((TOPO_BASE + 11))

if [ "${BENCH_QUICK:-0}" = 1 ]; then
    d_rounds=1 d_dur=3 d_large=3 d_sweep=3 WARMUP=1
    d_topo_rounds=1 d_topo=3 d_trials=20 d_base=10
else
    d_rounds=3 d_dur=10 d_large=4 d_sweep=4 WARMUP=2
    d_topo_rounds=2 d_topo=5 d_trials=200 d_base=50
fi

ROUNDS=${BENCH_ROUNDS:-$d_rounds}
DURATION=${BENCH_DURATION:-$d_dur}
LARGE_DURATION=${BENCH_LARGE_DURATION:-$d_large}
SWEEP_DURATION=${BENCH_SWEEP_DURATION:-$d_sweep}
SWEEP_CONNS=${BENCH_SWEEP_CONNS:-32 256 1024}
if [ "$NATIVE" = 1 ]; then
    d_scen="fresh replay bypass large-fresh large-replay sweep wait floor"
else
    d_scen="fresh replay bypass large-fresh large-replay sweep tls cluster wait floor"
fi
SCENARIOS=${BENCH_SCENARIOS:-$d_scen}
TOPO_ROUNDS=${BENCH_TOPO_ROUNDS:-$d_topo_rounds}
TOPO_DURATION=${BENCH_TOPO_DURATION:-$d_topo}
WAIT_TRIALS=${BENCH_WAIT_TRIALS:-$d_trials}
WAIT_BASELINE=${BENCH_WAIT_BASELINE:-$d_base}
WAIT_DUPS=${BENCH_WAIT_DUPS:-4}
WAIT_DELAY_MS=${BENCH_WAIT_DELAY_MS:-200}
WAIT_GAP_MS=${BENCH_WAIT_GAP_MS:-20:50}
WAIT_PARALLEL=${BENCH_WAIT_PARALLEL:-4}
WAIT_TIMEOUT=${BENCH_WAIT_TIMEOUT:-5s}
THREADS=2
CONNS=32
REPLAY_KEYS=16
LARGE_REPLAY_KEYS=4
SMALL_BODY=200
LARGE_BODY=65536
LARGE_RESPONSE=262144

has() { [[ " $SCENARIOS " == *" $1 "* ]]; }

# want SCENARIO: SCENARIO or its family (tls-fresh: tls) was asked for
want() { has "$1" || has "${1%%-*}"; }

want_tls() { want tls-fresh || want tls-replay; }
want_cluster() { want cluster-fresh || want cluster-replay; }

# the edges this run needs: plain and module always (warm-up, MONITOR)
EDGES="upstream plain module"
if [ "$NATIVE" = 1 ] && { want_tls || want_cluster; }; then
    echo "BENCH_NATIVE=1: the tls and cluster scenarios run on servers" \
         "without the scripting-less user; leave them out of BENCH_SCENARIOS" >&2
    exit 2
fi
want_tls && EDGES+=" tls"
want_cluster && EDGES+=" cluster"
has wait && EDGES+=" wait"
ALL_EDGES="upstream plain module tls cluster wait"

for t in wrk "$REDIS_SERVER" "$REDIS_CLI" curl openssl python3; do
    command -v "$t" >/dev/null || {
        echo "missing $t (make deps installs what the bench needs)" >&2; exit 1; }
done
[ -x "$NGINX" ] || { echo "missing $NGINX" >&2; exit 1; }

CLK_TCK=$(getconf CLK_TCK)
NCPU=$(nproc)
export REDIS_DIR=$DIR/redis

# --- process management -----------------------------------------------------

wrk_pid=
monitor_pid=
wait_pid=
declare -A PIDS

master_pid() {
    local pid
    pid=$(cat "$DIR/$1/nginx.pid" 2>/dev/null || true)
    if [ -n "$pid" ] && [ "$(cat "/proc/$pid/comm" 2>/dev/null)" = nginx ]; then
        echo "$pid"
    fi
}

# the master and its workers
nginx_pids() {
    local m
    m=$(master_pid "$1")
    [ -n "$m" ] || return 0
    echo "$m"
    { cat /proc/[0-9]*/stat 2>/dev/null || true; } \
        | sed -E 's/^([0-9]+) \(.*\) /\1 /' \
        | awk -v m="$m" '$3 == m { print $1 }'
}

# fast shutdown: nothing here needs a graceful one
stop_nginx() {
    local pid
    pid=$(master_pid "$1")
    [ -n "$pid" ] || return 0
    kill -TERM "$pid" 2>/dev/null || true
    for _ in $(seq 100); do
        kill -0 "$pid" 2>/dev/null || break
        sleep 0.05
    done
    rm -f "$DIR/$1/nginx.pid"
}

# all of them at once: each takes a while to exit on a busy machine
stop_all_nginx() {
    local n pid
    for n in $ALL_EDGES; do
        pid=$(master_pid "$n")
        [ -z "$pid" ] || kill -TERM "$pid" 2>/dev/null || true
    done
    for n in $ALL_EDGES; do
        stop_nginx "$n"
    done
}

cleanup() {
    local rc=$?
    # a second Ctrl-C must not leave half of it running
    trap - EXIT
    trap '' INT TERM
    [ -n "$wrk_pid" ] && kill "$wrk_pid" 2>/dev/null || true
    [ -n "$monitor_pid" ] && kill "$monitor_pid" 2>/dev/null || true
    [ -n "$wait_pid" ] && kill "$wait_pid" 2>/dev/null || true
    stop_all_nginx
    ./util/redis.sh stop "$REDIS_PORT" >/dev/null 2>&1 || true
    topologies_down
    exit "$rc"
}

topologies_down() {
    local t
    for t in standalone-tls cluster; do
        ./util/topology.sh down "$t" "$TOPO_ROOT/$t" >/dev/null 2>&1 || true
    done
}

port_busy() {
    [ -n "$(ss -Hltn "sport = :$1" 2>/dev/null)" ]
}

# leftovers of an interrupted earlier run
stop_all_nginx
./util/redis.sh stop "$REDIS_PORT" >/dev/null 2>&1 || true
topologies_down

ports=("$UPSTREAM_PORT" "$PLAIN_PORT" "$MODULE_PORT" "$REDIS_PORT")
want_tls && ports+=("$TLS_PORT" "$TLS_REDIS_PORT" "$((TLS_REDIS_PORT + 1))")
if want_cluster; then
    ports+=("$CLUSTER_PORT")
    for i in 11 12 13 14 15 16; do
        ports+=("$((TOPO_BASE + i))" "$((TOPO_BASE + 100 + i))")
    done
fi
has wait && ports+=("$WAIT_PORT" "$WAIT_UPSTREAM_PORT")
for p in "${ports[@]}"; do
    if port_busy "$p"; then
        echo "port $p is in use; set BENCH_UPSTREAM_PORT, BENCH_PLAIN_PORT," \
             "BENCH_MODULE_PORT, BENCH_REDIS_PORT, TOPO_BASE (TLS, Cluster" \
             "and wait ports) or BENCH_TLS_PORT, BENCH_CLUSTER_PORT," \
             "BENCH_WAIT_PORT, BENCH_WAIT_UPSTREAM_PORT" >&2
        exit 1
    fi
done

trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

ulimit -n 16384 2>/dev/null || ulimit -n "$(ulimit -Hn)" 2>/dev/null || true

rm -rf "$DIR"
mkdir -p "$DIR"/{upstream,plain,module,tls,cluster,wait,wrk,www,redis}

# --- request bodies and the large response ----------------------------------

body "$DIR/body-small.json" "$SMALL_BODY"
body "$DIR/body-large.json" "$LARGE_BODY"
body "$DIR/www/large.json" "$LARGE_RESPONSE"

# --- configuration ----------------------------------------------------------

# BENCH_ENCRYPT=1: the module edges seal their records
SEAL=
if [ "${BENCH_ENCRYPT:-0}" = 1 ]; then
    (umask 077; openssl rand 32 > "$DIR/bench.key")
    SEAL="
            idempotency_encrypt_key $DIR/bench.key;"
fi

# BENCH_NATIVE=1: the module edges on the bench's Redis log in as the user
# that may not run scripts
AUTH=
if [ "$NATIVE" = 1 ]; then
    AUTH=" user=$NATIVE_USER password=$NATIVE_PASS"
fi

upstream_conf "$DIR" "$UPSTREAM_PORT" "$UPSTREAM_WORKERS"

edge_conf "$DIR" plain "$PLAIN_PORT" "$UPSTREAM_PORT" "" \
    '$status $http_x_bench_expect' \
    '        "201 new" 0; "201 replay" 0; "201 bypass" 0;' \
    ""

edge_conf "$DIR" module "$MODULE_PORT" "$UPSTREAM_PORT" "load_module $module;" \
    '$status $http_x_bench_expect $idempotency_status' \
    '        "201 new new" 0; "201 replay replay" 0; "201 bypass bypass" 0;' \
    "            idempotency on;
            idempotency_redis 127.0.0.1:$REDIS_PORT$AUTH;$SEAL
            ${BENCH_MODULE_DIRECTIVES:-}"

# the module edges of the topology scenarios: the same as "module" but for
# the Redis they use; the wait edge proxies to bench/wait.py's slow upstream
tls_dir=$TOPO_ROOT/standalone-tls
edge_conf "$DIR" tls "$TLS_PORT" "$UPSTREAM_PORT" "load_module $module;" \
    '$status $http_x_bench_expect $idempotency_status' \
    '        "201 new new" 0; "201 replay replay" 0;' \
    "            idempotency on;
            idempotency_redis 127.0.0.1:$TLS_REDIS_PORT tls;
            idempotency_redis_tls_trusted_certificate $tls_dir/tls/ca.crt;$SEAL"

edge_conf "$DIR" cluster "$CLUSTER_PORT" "$UPSTREAM_PORT" "load_module $module;" \
    '$status $http_x_bench_expect $idempotency_status' \
    '        "201 new new" 0; "201 replay replay" 0;' \
    "            idempotency on;
            idempotency_redis 127.0.0.1:$CLUSTER_SEED_PORT cluster;$SEAL"

edge_conf "$DIR" wait "$WAIT_PORT" "$WAIT_UPSTREAM_PORT" "load_module $module;" \
    '$status $http_x_bench_expect $idempotency_status' \
    '        "201 new new" 0; "201 replay replay" 0;' \
    "            idempotency on;
            idempotency_redis 127.0.0.1:$REDIS_PORT$AUTH;
            idempotency_wait $WAIT_TIMEOUT;$SEAL"

./util/redis.sh start "$REDIS_PORT" >/dev/null
REDIS_PID=$(cat "$REDIS_DIR/redis.pid")

# BENCH_NATIVE=1: a server with SET IFEQ (an unknown option is a syntax
# error elsewhere), and the user without scripting
if [ "$NATIVE" = 1 ]; then
    probe=$("$REDIS_CLI" -p "$REDIS_PORT" SET bench-ifeq-probe x IFEQ y 2>&1 || true)
    "$REDIS_CLI" -p "$REDIS_PORT" DEL bench-ifeq-probe > /dev/null
    if [[ $probe == *ERR* ]]; then
        echo "BENCH_NATIVE=1: $("$REDIS_SERVER" --version | awk '{ print $1, $2, $3 }')" \
             "has no SET IFEQ (Valkey 8.1 or later): $probe" >&2
        exit 1
    fi
    "$REDIS_CLI" -p "$REDIS_PORT" ACL SETUSER "$NATIVE_USER" reset on \
        ">$NATIVE_PASS" '~*' '&*' +@all -@scripting > /dev/null
fi

# topo_up NAME: a topology of util/topology.sh in TOPO_ROOT/NAME
topo_up() {
    local t0=$SECONDS
    if ! ./util/topology.sh up "$1" "$TOPO_ROOT/$1" > "$DIR/topo-$1.log" 2>&1; then
        echo "util/topology.sh up $1 failed:" >&2
        cat "$DIR/topo-$1.log" >&2
        exit 1
    fi
    TOPO_MSGS+="redis $1 up in $((SECONDS - t0)) s ($TOPO_ROOT/$1)"$'\n'
}
TOPO_MSGS=

topo_pid() { cat "$TOPO_ROOT/$1/$2/redis.pid"; }

if want_tls; then
    topo_up standalone-tls
    TLS_REDIS_PID=$(topo_pid standalone-tls "$TLS_REDIS_PORT")
fi

if want_cluster; then
    topo_up cluster
    # every node's CPU counts (replicas apply the writes too); the
    # commands are counted on the masters
    CLUSTER_PIDS=$(for i in 11 12 13 14 15 16; do
                       topo_pid cluster $((TOPO_BASE + i)); done | tr '\n' ' ')
    # the masters, as the seed sees them (no failover happens in a bench)
    CLUSTER_MASTERS=$("$REDIS_CLI" -h 127.0.0.1 -p "$CLUSTER_SEED_PORT" CLUSTER NODES |
        awk '$3 ~ /master/ { split($2, a, "[:@]"); print a[2] }' | tr '\n' ' ')
    [ "$(wc -w <<< "$CLUSTER_MASTERS")" -eq 3 ] || {
        echo "expected 3 cluster masters, found: $CLUSTER_MASTERS" >&2; exit 1; }
fi

for n in $EDGES; do
    cmd=("$NGINX" -p "$DIR/$n/" -c "$DIR/$n/nginx.conf" -e "$DIR/$n/error.log")
    if ! "${cmd[@]}" -q -t || ! "${cmd[@]}"; then
        echo "nginx ($n) did not start; see $DIR/$n/error.log" >&2
        tail -5 "$DIR/$n/error.log" >&2 || true
        exit 1
    fi
done

for n in $EDGES; do
    p=$(port_of "$n")
    for _ in $(seq 50); do
        port_busy "$p" && break
        sleep 0.1
    done
done

for n in $EDGES; do
    PIDS[$n]=$(nginx_pids "$n" | tr '\n' ' ')
done
UPSTREAM_MASTER=$(master_pid upstream)

# --- measurement helpers ----------------------------------------------------
#
# Process creation costs ~20 ms on a small VM, so the per-run bookkeeping
# talks to nginx and Redis with bash's /dev/tcp and reads /proc in one awk.

# edge_requests PORT: the edge's stub_status request counter (this read
# included), into $HANDLED
edge_requests() {
    local line
    HANDLED=-1
    exec 3<>"/dev/tcp/127.0.0.1/$1"
    printf 'GET /bench-status HTTP/1.0\r\n\r\n' >&3
    while IFS= read -r -t 5 line <&3; do
        if [[ $line =~ ^\ ([0-9]+)\ ([0-9]+)\ ([0-9]+) ]]; then
            HANDLED=${BASH_REMATCH[3]}
        fi
    done
    exec 3<&-
}

# redis CMD...: inline commands to the bench's Redis, the reply lines
# (without CR) to stdout
redis() {
    redis_at "$REDIS_PORT" "$@"
}

# redis_at PORT CMD...: the same to another plaintext Redis
redis_at() {
    local line
    exec 4<>"/dev/tcp/127.0.0.1/$1"
    shift
    printf '%s\r\n' "$@" QUIT >&4
    while IFS= read -r -t 30 line <&4; do
        printf '%s\n' "${line%$'\r'}"
    done
    exec 4<&-
}

redis_reset() {
    redis FLUSHALL > /dev/null
}

# The Redis a scenario uses (CTX): standalone (the bench's own), tls (TLS
# only: redis-cli) or cluster (the masters, each asked in turn)
tls_cli() {
    "$REDIS_CLI" --no-auth-warning -h 127.0.0.1 -p "$TLS_REDIS_PORT" --tls \
        --cacert "$tls_dir/tls/ca.crt" --cert "$tls_dir/tls/client.crt" \
        --key "$tls_dir/tls/client.key" "$@" | tr -d '\r'
}


ctx_of() {
    case $1 in
        tls-*) echo tls ;;
        cluster-*) echo cluster ;;
        *) echo standalone ;;
    esac
}

# ctx_cmd CTX CMD: one command to the CTX's Redis (every master of a
# cluster: INFO's sections one after the other)
ctx_cmd() {
    local m
    case $1 in
        standalone) redis "$2" ;;
        tls) read -ra m <<< "$2"; tls_cli "${m[@]}" ;;
        cluster) for m in $CLUSTER_MASTERS; do redis_at "$m" "$2"; done ;;
    esac
}

# ctx_pids CTX [masters]: the Redis processes of CTX (only the masters)
ctx_pids() {
    local m
    case $1:${2:-} in
        standalone:*) echo "$REDIS_PID" ;;
        tls:*) echo "$TLS_REDIS_PID" ;;
        cluster:) echo "$CLUSTER_PIDS" ;;
        cluster:masters)
            for m in $CLUSTER_MASTERS; do
                topo_pid cluster "$m"
            done | tr '\n' ' ' ;;
    esac
}

# snapshot FILE EDGE: the counters of a run as "name value" lines:
# machine busy/total jiffies, CPU ticks of the edge (and its system part),
# of Redis and of the upstream, the edge's request counter, the line counts
# of the logs, and "cmd NAME CALLS USEC" from INFO commandstats
snapshot() {
    local f=$1 side=$2
    edge_requests "$(port_of "$side")"
    ctx_cmd "$CTX" 'INFO commandstats' > "$f.info"
    wc -l "$DIR/$side/bad.log" "$DIR/$side/error.log" > "$f.wc"
    awk -v handled="$HANDLED" -v edge="${PIDS[$side]}" \
        -v up="${PIDS[upstream]}" -v redis="$(ctx_pids "$CTX")" -v info="$f.info" \
        -v masters="$(ctx_pids "$CTX" masters)" \
        -v wc="$f.wc" -v side="$side" '
    function ticks(pids, sys,   n, p, i, l, a, s, f) {
        n = split(pids, p, " ")
        for (i = 1; i <= n; i++) {
            f = "/proc/" p[i] "/stat"
            if ((getline l < f) > 0) {
                sub(/^.*\) /, "", l)
                split(l, a, " ")
                s += sys ? a[13] : a[12] + a[13]
            }
            close(f)
        }
        return s + 0
    }
    BEGIN {
        while ((getline l < "/proc/stat") > 0) {
            if (l ~ /^cpu /) {
                n = split(l, a, " "); t = 0
                for (i = 2; i <= n; i++) t += a[i]
                print "busy", t - a[5] - a[6]
                print "total", t
            }
        }
        print "edge", ticks(edge, 0)
        print "edge_sys", ticks(edge, 1)
        print "redis", ticks(redis, 0)
        print "redis_masters", ticks(masters, 0)
        print "upstream", ticks(up, 0)
        print "handled", handled
        while ((getline l < wc) > 0) {
            split(l, a, " ")
            if (a[2] ~ /bad\.log$/) print "bad_lines", a[1]
            if (a[2] ~ /error\.log$/) print "err_lines", a[1]
        }
        # cmdstat_evalsha:calls=1,usec=2,usec_per_call=2.00,...
        while ((getline l < info) > 0) {
            if (l !~ /^cmdstat_/) continue
            sub(/^cmdstat_/, "", l)
            split(l, a, /[:=,]/)
            print "cmd", a[1], a[3], a[5]
        }
    }' > "$f"
}

# rotate_upstream_log NAME: the upstream's access log so far becomes NAME
# (USR1 makes the workers flush their buffers and reopen the log)
rotate_upstream_log() {
    mv "$DIR/upstream/requests.log" "$DIR/upstream/$1"
    kill -USR1 "$UPSTREAM_MASTER"
    for _ in $(seq 100); do
        [ -e "$DIR/upstream/requests.log" ] && break
        sleep 0.02
    done
    sleep 0.05  # the workers reopen after the master
    UPSTREAM_DIRTY=0
}

UPSTREAM_DIRTY=1

# seed PREFIX N BODY_FILE PATH [PORT]: store N records through the module
# edge (one curl, one connection) and check that a retry of each is replayed
seed() {
    local i e args=() got want=
    for i in $(seq "$2"); do
        for e in new replay; do
            args+=(--next -m 10 -o /dev/null -X POST -H 'Expect:'
                   -H "X-Bench-Expect: $e" -H 'Content-Type: application/json'
                   -H "Idempotency-Key: $1-$i" --data-binary "@$3"
                   -w '%{http_code} %header{idempotent-replayed}\n'
                   "http://127.0.0.1:${5:-$MODULE_PORT}$4")
        done
        want+="201 
201 true
"
    done
    got=$(curl -sS "${args[@]:1}" 2>&1 || true)
    if [ "$got"$'\n' != "$want" ]; then
        echo "seeding $1-* failed; expected alternating \"201\" and" \
             "\"201 true\" (replayed), got:" >&2
        printf '%s\n' "$got" | head -4 >&2
        return 1
    fi
    # BENCH_ENCRYPT=1: what the module edge stored is sealed (state 5)
    if [ -n "$SEAL" ] && [ "${5:-$MODULE_PORT}" = "$MODULE_PORT" ]; then
        got=$("$REDIS_CLI" -p "$REDIS_PORT" GETRANGE \
                  "idem:{$(printf '\0%s' "$1-1" | sha256sum | cut -d' ' -f1)}" 4 4 |
              head -c 1 | od -An -tu1 | tr -d ' \n')
        if [ "$got" != 5 ]; then
            echo "seeding $1-*: the record is not sealed (state \"$got\")" >&2
            return 1
        fi
    fi
}

# kv_of TAG FILE: the key=value words of FILE's lines "TAG ...", as
# "key value" lines (wrk's BENCH line, bench/wait.py's WAIT line)
kv_of() {
    local line kv
    while IFS= read -r line; do
        [[ $line == "$1 "* ]] || continue
        for kv in $line; do
            [[ $kv == *=* ]] && echo "${kv%%=*} ${kv#*=}"
        done
    done < "$2"
}

# --- one wrk run -------------------------------------------------------------

RUNS=$DIR/runs.tsv
printf 'scenario\tconns\tround\tside\trequests\taborted\trps\tp50_us\tp99_us\tnginx_us\tredis_us\tbox_us\tupstream_us\tclient_cmds\tdata_cmds\tupstream_reqs\tbusy_pct\tok\tproblems\tnginx_sys_us\thandled\tredis_masters_us\n' > "$RUNS"
fails=0
seq_no=0
CTX=standalone

# run SCENARIO CONNS ROUND SIDE DURATION
run() {
    local scen=$1 conns=$2 round=$3 side=$4 dur=$5
    local port path script out id s0 s1 ulog edge=$4
    local args=() problems=() ok=1

    # the module side of tls-* and cluster-* is an edge of its own; the
    # plain side's Redis figures come from the same Redis (they must be 0)
    CTX=$(ctx_of "$scen")
    if [ "$side" = module ] && [ "$CTX" != standalone ]; then
        edge=$CTX
    fi
    port=$(port_of "$edge")
    seq_no=$((seq_no + 1))
    id=r$seq_no
    out=$DIR/wrk/$seq_no-$scen-$conns-$round-$side
    s0=$DIR/s0 s1=$DIR/s1
    ulog=$DIR/upstream/run-$seq_no.log

    case $scen in
        fresh|sweep-fresh|tls-fresh|cluster-fresh)
                      path=/pay;   script=fresh.lua
                      args=("$id" "$DIR/body-small.json" new) ;;
        replay|tls-replay|cluster-replay)
                      path=/pay;   script=replay.lua
                      args=("$id" "$REPLAY_KEYS" "$DIR/body-small.json" replay) ;;
        bypass)       path=/pay;   script=bypass.lua ;;
        large-fresh)  path=/large; script=fresh.lua
                      args=("$id" "$DIR/body-large.json" new) ;;
        large-replay) path=/large; script=replay.lua
                      args=("$id" "$LARGE_REPLAY_KEYS" "$DIR/body-large.json" replay) ;;
    esac

    if [ "$side" = module ]; then
        ctx_cmd "$CTX" FLUSHALL > /dev/null
        case $scen in
            replay|tls-replay|cluster-replay)
                seed "$id" "$REPLAY_KEYS" "$DIR/body-small.json" /pay "$port" ;;
            large-replay) seed "$id" "$LARGE_REPLAY_KEYS" "$DIR/body-large.json" /large ;;
        esac || { problems+=("seeding failed"); ok=0; }
        UPSTREAM_DIRTY=1
    fi

    # requests the upstream got outside a run (warm-up, seeding) go aside
    if [ "$UPSTREAM_DIRTY" = 1 ]; then
        rotate_upstream_log before.log
    fi
    snapshot "$s0" "$edge"

    wrk -t"$THREADS" -c"$conns" -d"${dur}s" --timeout 10s -s "bench/$script" \
        "http://127.0.0.1:$port$path" -- "${args[@]}" > "$out.txt" 2>&1 &
    wrk_pid=$!
    wait "$wrk_pid" || { problems+=("wrk exited $?"); ok=0; }
    wrk_pid=

    # requests in flight when wrk stopped finish, their stores reach Redis
    snapshot "$s1" "$edge"
    sleep 0.2
    ctx_cmd "$CTX" 'INFO commandstats' > "$s1.info"
    rotate_upstream_log "run-$seq_no.log"

    # --- wrk's result ---
    local k v
    declare -A W=()
    while read -r k v; do
        W[$k]=$v
    done < <(kv_of BENCH "$out.txt")
    if [ -z "${W[requests]:-}" ]; then
        printf '%s\t%s\t%s\t%s\t0\t0\t0\t0\t0\t0\t0\t0\t0\t0\t0\t0\t0\t0\t%s\t0\t0\t0\n' \
            "$scen" "$conns" "$round" "$side" "no wrk result" >> "$RUNS"
        fails=$((fails + 1))
        echo "  $scen c=$conns round $round $side: FAIL (no wrk result, see $out.txt)"
        return 0
    fi

    # --- everything derived from the two snapshots, the logs and wrk ---
    local upstat upreqs dups=0 row aborted bad errs
    if [ "${scen##*-}" = fresh ]; then
        # one upstream request per key: count the keys seen more than once
        upstat=$(sort "$ulog" | uniq -c | awk '{ n += $1; if ($1 > 1) d++ }
                                             END { print n + 0, d + 0 }')
        read -r upreqs dups <<< "$upstat"
    else
        upreqs=$(wc -l < "$ulog")
    fi
    rm -f "$ulog" "$DIR/upstream/before.log"

    # the snapshot before, the one after with a fresh INFO (stores done),
    # then the new lines of bad.log and error.log
    row=$(awk -v hz="$CLK_TCK" -v ncpu="$NCPU" -v detail="$out.redis" '
        FILENAME == ARGV[1] || FILENAME == ARGV[2] {
            i = FILENAME == ARGV[1] ? 0 : 1
            if ($1 == "cmd") next
            v[i, $1] = $2; next
        }
        FILENAME == ARGV[3] || FILENAME == ARGV[4] {
            # "cmdstat_x:calls=..." of INFO: before, after the stores
            i = FILENAME == ARGV[3] ? 0 : 1
            if ($0 !~ /^cmdstat_/) next
            l = $0; sub(/^cmdstat_/, "", l); split(l, a, /[:=,]/)
            # summed over the masters of a cluster
            calls[i, a[1]] += a[3]; usec[i, a[1]] += a[5]; names[a[1]] = 1
            next
        }
        FILENAME == ARGV[5] {
            if (FNR <= v[0, "bad_lines"]) next
            if ($1 == 499) aborted++; else bad++
            next
        }
        FILENAME == ARGV[6] {
            if (FNR <= v[0, "err_lines"]) next
            if ($0 ~ /\[(error|crit|alert|emerg)\]/) errs++
            next
        }
        END {
            n = v[1, "handled"] - v[0, "handled"] - 1
            if (n < 1) n = 1
            us = 1000000 / hz
            for (c in names) {
                if (c ~ /^(info|flushall|quit|echo|monitor|ping|client\|.*|config\|.*|replconf|psync|sync)$/) continue
                d = calls[1, c] - calls[0, c]
                if (d <= 0) continue
                printf "%-10s calls/request %.3f  usec/call %.2f\n", c, d / n,
                       (usec[1, c] - usec[0, c]) / d > detail
                # client: what clients sent (scripts, SCRIPT LOAD, AUTH,
                # SELECT, ...); data: GET, SET, DEL, which Redis 7 counts
                # also when a script runs them
                if (c ~ /^(eval|evalsha|eval_ro|evalsha_ro|fcall|fcall_ro|auth|select|hello|multi|exec|asking)$/ || c ~ /^(script|cluster)/)
                    client += d
                else
                    data += d
            }
            db = v[1, "busy"] - v[0, "busy"]; dt = v[1, "total"] - v[0, "total"]
            printf "%d %.1f %.1f %.1f %.1f %.1f %.2f %.2f %.0f %d %d %d %.1f\n", n,
                (v[1, "edge"] - v[0, "edge"]) * us / n,
                (v[1, "edge_sys"] - v[0, "edge_sys"]) * us / n,
                (v[1, "redis"] - v[0, "redis"]) * us / n,
                (v[1, "upstream"] - v[0, "upstream"]) * us / n,
                db * us / n, client / n, data / n,
                (dt > 0 ? 100 * ncpu * db / dt : 0), aborted, bad, errs,
                (v[1, "redis_masters"] - v[0, "redis_masters"]) * us / n
        }' "$s0" "$s1" "$s0.info" "$s1.info" "$DIR/$edge/bad.log" "$DIR/$edge/error.log")

    local handled cpu_ng cpu_ns cpu_rd cpu_up cpu_box client data busy cpu_rm
    read -r handled cpu_ng cpu_ns cpu_rd cpu_up cpu_box client data busy \
        aborted bad errs cpu_rm <<< "$row"

    local requests=${W[requests]} conn_err=$((W[err_connect] + W[err_read] + W[err_write]))

    # --- correctness ---
    [ "$requests" -gt 0 ] || { problems+=("no requests completed"); ok=0; }
    [ "$conn_err" -eq 0 ] || { problems+=("socket errors: connect ${W[err_connect]} read ${W[err_read]} write ${W[err_write]}"); ok=0; }
    [ "${W[err_timeout]}" -eq 0 ] || { problems+=("${W[err_timeout]} timeouts"); ok=0; }
    [ "${W[err_status]}" -eq 0 ] || { problems+=("${W[err_status]} responses >= 400"); ok=0; }
    # 499: requests wrk cut off when its time was up, at most one per
    # connection; anything else in bad.log is a wrong answer
    [ "$bad" -eq 0 ] || { problems+=("$bad unexpected status or \$idempotency_status (see $DIR/$edge/bad.log)"); ok=0; }
    [ "$aborted" -le "$conns" ] || { problems+=("$aborted requests aborted (499)"); ok=0; }
    [ "$errs" -eq 0 ] || { problems+=("$errs [error]+ lines in $edge/error.log"); ok=0; }

    local p
    for p in ${PIDS[$edge]}; do
        kill -0 "$p" 2>/dev/null || { problems+=("nginx process $p is gone (crash?)"); ok=0; }
    done

    if [ "$side" = module ] && [ "${scen##*-}" = replay ]; then
        [ "$upreqs" -eq 0 ] || { problems+=("replay reached the upstream $upreqs times"); ok=0; }
    else
        # every completed request reached the upstream once; requests still
        # in flight when wrk stopped may have too (at most one per connection)
        if [ "$upreqs" -lt "$requests" ] || [ "$upreqs" -gt $((requests + conns)) ]; then
            problems+=("upstream saw $upreqs requests for $requests responses"); ok=0
        fi
    fi
    [ "$dups" -eq 0 ] || { problems+=("$dups keys reached the upstream more than once"); ok=0; }

    # BENCH_NATIVE=1: the module stored, renewed and released without a
    # script (the bench's own INFO, FLUSHALL and seeding run none either)
    if [ "$NATIVE" = 1 ]; then
        local scripts
        scripts=$(awk '/^cmdstat_(eval|evalsha|eval_ro|evalsha_ro|fcall|fcall_ro|script\|load):/ {
                           split($0, a, /[:=,]/)
                           n[FILENAME == ARGV[1]] += a[3]
                       }
                       END { print n[0] - n[1] }' "$s0.info" "$s1.info")
        [ "$scripts" -eq 0 ] || { problems+=("$scripts script calls on the native path"); ok=0; }
    fi

    if [ "$side" = plain ] && [ "$client" != 0.00 ]; then
        problems+=("plain edge run saw Redis commands"); ok=0
    fi

    local prob="-"
    if [ ${#problems[@]} -gt 0 ]; then
        prob=$(IFS=';'; echo "${problems[*]}")
    fi
    [ "$ok" = 1 ] || fails=$((fails + 1))

    printf '%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n' \
        "$scen" "$conns" "$round" "$side" "$requests" "$aborted" "${W[rps]}" \
        "${W[p50_us]}" "${W[p99_us]}" "$cpu_ng" "$cpu_rd" "$cpu_box" "$cpu_up" \
        "$client" "$data" "$upreqs" "$busy" "$ok" "$prob" "$cpu_ns" "$handled" \
        "$cpu_rm" >> "$RUNS"

    printf '  %-14s c=%-4s #%s %-6s %6.0f r/s  p50 %6.2f  p99 %7.2f ms  us/req: nginx %5.1f (sys %5.1f) redis %6.1f upstream %5.1f box %6.1f  cmds %4s  upstream %6s  cpu %3s%%  %s\n' \
        "$scen" "$conns" "$round" "$side" "${W[rps]}" \
        "$((W[p50_us] / 1000)).$(printf '%03d' $((W[p50_us] % 1000)))" \
        "$((W[p99_us] / 1000)).$(printf '%03d' $((W[p99_us] % 1000)))" \
        "$cpu_ng" "$cpu_ns" "$cpu_rd" "$cpu_up" "$cpu_box" "$client" "$upreqs" \
        "$busy" "$([ "$ok" = 1 ] && echo ok || echo "FAIL: $prob")"
}

# --- the exact commands per request: a MONITOR sample -------------------------

monitor_sample() {
    local mon=$DIR/monitor.txt i args=()
    redis_reset
    "$REDIS_CLI" -p "$REDIS_PORT" monitor > "$mon" 2>&1 &
    monitor_pid=$!
    sleep 0.3
    redis 'ECHO fresh-start' > /dev/null
    seed mon 10 "$DIR/body-small.json" /pay || echo "monitor sample: seeding failed" >&2
    redis 'ECHO end' > /dev/null
    sleep 0.3
    kill "$monitor_pid" 2>/dev/null || true
    wait "$monitor_pid" 2>/dev/null || true
    monitor_pid=

    # lines: time [db client] "CMD" ...; client is ip:port, or lua.  Each of
    # the 10 keys was POSTed twice: a fresh request, then its replay; the
    # claim's reply tells them apart, so count commands per phase by key
    awk '/"fresh-start"/ { on = 1; next }
         /"end"/ { on = 0; next }
         on && /^[0-9.]+ \[/ {
             cmd = toupper($4); gsub(/"/, "", cmd)
             if (cmd == "QUIT" || cmd == "ECHO") next    # the bench itself
             who = ($3 ~ /^lua\]/) ? "lua" : "client"
             # the claim: SET key claim NX GET PX ttl (Redis 7; the bench
             # needs it); a store is EVALSHA sha N key ..., or EVAL after
             # a NOSCRIPT, behind a staging SET key:s:token for a large
             # record: it counts in the phase of the last claim of its key
             if (who == "client" && cmd == "SET" \
                 && $(NF - 3) == "\"NX\"" && $(NF - 2) == "\"GET\"")
             {
                 key = $5; seen[key]++
                 phase = seen[key] == 1 ? "fresh" : "replay"
             } else if (who == "client" \
                        && (cmd == "SET" || cmd == "EVALSHA" || cmd == "EVAL"))
             {
                 key = cmd == "SET" ? $5 : $7
                 sub(/:s:[0-9a-f]+"$/, "\"", key)
                 phase = seen[key] > 1 ? "replay" : "fresh"
             }
             n[phase " " who " " cmd]++
             if (who == "client") nc[phase]++
         }
         END {
             for (k in n) printf "%s %.1f\n", k, n[k] / 10 > "/dev/stderr"
             printf "fresh %.1f replay %.1f\n", nc["fresh"] / 10, nc["replay"] / 10
         }' "$mon" > "$DIR/monitor.sum" 2> "$DIR/monitor.unsorted"
    sort "$DIR/monitor.unsorted" > "$DIR/monitor.detail"
}

# --- the bench ----------------------------------------------------------------

echo "== ngx_http_idempotency_module bench =="
echo "machine: $NCPU cores, $(sed -n 's/^model name[[:space:]]*: //p' /proc/cpuinfo | head -1), kernel $(uname -r)"
echo "$("$NGINX" -v 2>&1), $("$REDIS_SERVER" --version | awk '{ print $1, $2, $3 }'), $(wrk --version 2>&1 | head -1 | awk '{ print $1, $2 }')"
echo "module: $module"
if [ "$NATIVE" = 1 ]; then
    echo "store path: native compare-and-set (SET IFEQ GET): the module edges log in" \
         "as $NATIVE_USER, an ACL user without @scripting (BENCH_NATIVE=1)"
fi
echo "edges: 1 worker each; upstream: $UPSTREAM_WORKERS workers; wrk -t$THREADS;" \
     "$ROUNDS round(s) of ${DURATION}s (large ${LARGE_DURATION}s, sweep ${SWEEP_DURATION}s)"
echo "plain 127.0.0.1:$PLAIN_PORT, module 127.0.0.1:$MODULE_PORT," \
     "upstream 127.0.0.1:$UPSTREAM_PORT, redis 127.0.0.1:$REDIS_PORT; results in $DIR"
want_tls && echo "tls: edge 127.0.0.1:$TLS_PORT, Redis over TLS 127.0.0.1:$TLS_REDIS_PORT;" \
    "${TOPO_ROUNDS} round(s) of ${TOPO_DURATION}s"
want_cluster && echo "cluster: edge 127.0.0.1:$CLUSTER_PORT, 3 masters + 3 replicas" \
    "from 127.0.0.1:$CLUSTER_SEED_PORT; ${TOPO_ROUNDS} round(s) of ${TOPO_DURATION}s"
has wait && echo "wait: edge 127.0.0.1:$WAIT_PORT, slow upstream (bench/wait.py)" \
    "127.0.0.1:$WAIT_UPSTREAM_PORT, Redis 127.0.0.1:$REDIS_PORT"
printf '%s' "$TOPO_MSGS"
echo "load average before: $(cut -d' ' -f1-3 /proc/loadavg)"

# the figures are only worth something on an otherwise idle machine
idle_check() {
    local b0 t0 b1 t1 pct
    read -r b0 t0 < <(awk '/^cpu / { t = 0; for (i = 2; i <= NF; i++) t += $i;
                                     print t - $5 - $6, t }' /proc/stat)
    sleep 1
    read -r b1 t1 < <(awk '/^cpu / { t = 0; for (i = 2; i <= NF; i++) t += $i;
                                     print t - $5 - $6, t }' /proc/stat)
    pct=$(( t1 > t0 ? 100 * (b1 - b0) / (t1 - t0) : 0 ))
    if [ "$pct" -gt 15 ]; then
        echo "WARNING: the machine is ${pct}% busy before the bench starts;" \
             "other load skews every figure (compare the box us/req columns)"
    else
        echo "machine ${pct}% busy before the bench starts"
    fi
}
idle_check
echo

# warm-up, not measured (the tls and cluster edges too: TLS handshakes,
# the slot map)
redis_reset
for side in $EDGES; do
    [ "$side" = upstream ] || [ "$side" = wait ] && continue
    wrk -t"$THREADS" -c"$CONNS" -d"${WARMUP}s" -s bench/fresh.lua \
        "http://127.0.0.1:$(port_of $side)/pay" -- "warm-$side" \
        "$DIR/body-small.json" > "$DIR/wrk/warmup-$side.txt" 2>&1
done

# Redis's memory, too: on a fresh virtual machine a page Redis touches for
# the first time costs the hypervisor as well, and the first large-fresh
# run paid 844 us of Redis CPU per store where the third paid 323
if has large-fresh; then
    wrk -t"$THREADS" -c"$CONNS" -d"${LARGE_DURATION}s" -s bench/fresh.lua \
        "http://127.0.0.1:$(port_of module)/large" -- "warm-large" \
        "$DIR/body-large.json" > "$DIR/wrk/warmup-large.txt" 2>&1
    redis_reset
fi

monitor_sample
UPSTREAM_DIRTY=1
echo "MONITOR sample (10 fresh POSTs, then their 10 retries), commands per request:"
sed 's/^/  /' "$DIR/monitor.detail"
echo

for scen in fresh replay bypass large-fresh large-replay; do
    has "$scen" || continue
    dur=$DURATION
    [[ $scen == large-* ]] && dur=$LARGE_DURATION
    echo "$scen: $ROUNDS round(s) x ${dur}s, $CONNS connections"
    for round in $(seq "$ROUNDS"); do
        run "$scen" "$CONNS" "$round" plain "$dur"
        run "$scen" "$CONNS" "$round" module "$dur"
    done
done

if has sweep; then
    echo "sweep: fresh, 1 round x ${SWEEP_DURATION}s at $SWEEP_CONNS connections"
    for c in $SWEEP_CONNS; do
        run sweep-fresh "$c" 1 plain "$SWEEP_DURATION"
        run sweep-fresh "$c" 1 module "$SWEEP_DURATION"
    done
fi

for scen in tls-fresh tls-replay cluster-fresh cluster-replay; do
    want "$scen" || continue
    case $scen in
        tls-*) what="Redis over TLS (127.0.0.1:$TLS_REDIS_PORT)" ;;
        *) what="a 3-master Redis Cluster (seed 127.0.0.1:$CLUSTER_SEED_PORT)" ;;
    esac
    echo "$scen: $TOPO_ROUNDS round(s) x ${TOPO_DURATION}s, $CONNS connections, $what"
    for round in $(seq "$TOPO_ROUNDS"); do
        run "$scen" "$CONNS" "$round" plain "$TOPO_DURATION"
        run "$scen" "$CONNS" "$round" module "$TOPO_DURATION"
    done
done
CTX=standalone

# --- waiting duplicates -------------------------------------------------------
#
# bench/wait.py is the slow upstream and the client; it prints a WAIT line
# of key=value pairs, WAITCMD lines (Redis commands per waiter, per
# original) and WAITFAIL lines.  Checked here too: the wait edge's logs and
# workers.

WAITS=$DIR/wait.tsv
printf 'trials\tdups\twaiters\tp50_ms\tp90_ms\tp99_ms\tmax_ms\torig_p50_ms\tcmds_per_waiter\tcmds_per_original\tredis_us_per_req\tredis_us_per_waiter\tredis_us_per_original\tok\tproblems\n' > "$WAITS"

wait_scenario() {
    local out=$DIR/wait.txt w0 e0 line k v bad errs p ok=1 problems=()
    declare -A W=()

    echo "wait: $WAIT_TRIALS trials (after $WAIT_BASELINE without duplicates)," \
         "each an original and $WAIT_DUPS duplicates ${WAIT_GAP_MS/:/-} ms later," \
         "upstream ${WAIT_DELAY_MS} ms, idempotency_wait $WAIT_TIMEOUT," \
         "$WAIT_PARALLEL trials at a time"
    redis_reset
    w0=$(wc -l < "$DIR/wait/bad.log" 2>/dev/null || echo 0)
    e0=$(wc -l < "$DIR/wait/error.log" 2>/dev/null || echo 0)

    python3 bench/wait.py --edge "$WAIT_PORT" --upstream "$WAIT_UPSTREAM_PORT" \
        --redis "$REDIS_PORT" --redis-pids "$REDIS_PID" \
        --trials "$WAIT_TRIALS" --baseline "$WAIT_BASELINE" \
        --dups "$WAIT_DUPS" --delay-ms "$WAIT_DELAY_MS" \
        --gap-ms "$WAIT_GAP_MS" --parallel "$WAIT_PARALLEL" \
        --out "$DIR/wait-latency.txt" > "$out" 2>&1 &
    wait_pid=$!
    wait "$wait_pid" || { problems+=("wait.py exited $?"); ok=0; }
    wait_pid=

    while read -r k v; do
        W[$k]=$v
    done < <(kv_of WAIT "$out")
    if [ -z "${W[trials]:-}" ]; then
        fails=$((fails + 1))
        printf '0\t0\t0\t0\t0\t0\t0\t0\t0\t0\t0\t0\t0\t0\tno result\n' >> "$WAITS"
        echo "  wait: FAIL (no result, see $out)"
        return 0
    fi

    if [ "${W[problems]}" -ne 0 ]; then
        ok=0
        problems+=("${W[problems]} problem(s) (see $out), the first:")
        while IFS= read -r line; do
            problems+=("${line#WAITFAIL }")
        done < <(grep '^WAITFAIL ' "$out" | head -3 || true)
    fi
    bad=$(tail -n +"$((w0 + 1))" "$DIR/wait/bad.log" 2>/dev/null | wc -l)
    errs=$(tail -n +"$((e0 + 1))" "$DIR/wait/error.log" |
           grep -cE '\[(error|crit|alert|emerg)\]' || true)
    [ "$bad" -eq 0 ] || { problems+=("$bad unexpected status or \$idempotency_status (see $DIR/wait/bad.log)"); ok=0; }
    [ "$errs" -eq 0 ] || { problems+=("$errs [error]+ lines in wait/error.log"); ok=0; }
    for p in ${PIDS[wait]}; do
        kill -0 "$p" 2>/dev/null || { problems+=("nginx process $p is gone (crash?)"); ok=0; }
    done
    [ "$ok" = 1 ] || fails=$((fails + 1))

    local prob="-"
    if [ ${#problems[@]} -gt 0 ]; then
        prob=$(IFS=';'; echo "${problems[*]}")
    fi
    printf '%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n' \
        "${W[trials]}" "${W[dups]}" "${W[waiters]}" "${W[p50_ms]}" \
        "${W[p90_ms]}" "${W[p99_ms]}" "${W[max_ms]}" "${W[orig_p50_ms]}" \
        "${W[cmds_per_waiter]}" "${W[cmds_per_original]}" \
        "${W[redis_us_per_req]}" "${W[redis_us_per_waiter]}" \
        "${W[redis_us_per_original]}" "$ok" "$prob" >> "$WAITS"
    printf '  wait         %s waiters: after the original p50 %s  p99 %s  max %s ms (original %s ms)  redis cmds/waiter %s (original %s)  redis us/req %s (waiter %s)  %s\n' \
        "${W[waiters]}" "${W[p50_ms]}" "${W[p99_ms]}" "${W[max_ms]}" \
        "${W[orig_p50_ms]}" "${W[cmds_per_waiter]}" "${W[cmds_per_original]}" \
        "${W[redis_us_per_req]}" "${W[redis_us_per_waiter]}" \
        "$([ "$ok" = 1 ] && echo ok || echo "FAIL: $prob")"
}

if has wait; then
    wait_scenario
fi

# --- floors -------------------------------------------------------------------

# What this box charges for the least any implementation must do, measured
# on the bench's own Redis once the scenarios are done: Redis CPU per native
# command (redis-benchmark, 32 clients, like wrk's connections) and SHA-256
# of a large body (openssl speed; the fingerprint covers the body).  The
# report turns them into the best ratio the large scenarios can reach here.
FLOORS=$DIR/floors.tsv
: > "$FLOORS"

redis_cpu_us() {
    redis INFO cpu | awk -F: '/^used_cpu_(sys|user):/ { s += $2 }
                              END { printf "%.0f", s * 1000000 }'
}

# floor_cmd NAME N ARGS...: Redis CPU per call of redis-benchmark ARGS, and
# the client's own (NAME_client: sending the command, reading the reply)
floor_cmd() {
    local name=$1 n=$2 a b c
    shift 2
    a=$(redis_cpu_us)
    c=$(perl -e 'open my $o, ">&", \*STDOUT; open STDOUT, ">", "/dev/null";
                 system(@ARGV); my @t = times;
                 printf $o "%.0f", ($t[2] + $t[3]) * 1000000' \
            "$REDIS_BENCHMARK" -p "$REDIS_PORT" -c 32 -n "$n" -q "$@")
    b=$(redis_cpu_us)
    printf '%s\t%.1f\n%s_client\t%.1f\n' \
        "$name" "$(echo "($b - $a) / $n" | bc -l)" \
        "$name" "$(echo "$c / $n" | bc -l)" >> "$FLOORS"
}

floor_scenario() {
    local kbps

    echo "  floors: redis-benchmark on the bench Redis, openssl speed"
    redis_reset
    floor_cmd set_small 40000 -t set -r 1000000000 -d "$SMALL_BODY"
    redis_reset
    floor_cmd set_large 3000 -t set -r 1000000000 -d "$LARGE_RESPONSE"
    redis_reset
    head -c "$LARGE_RESPONSE" /dev/zero | tr '\0' r |
        "$REDIS_CLI" -p "$REDIS_PORT" -x SET floor-large > /dev/null
    floor_cmd get_large 3000 GET floor-large
    redis_reset

    # the last figure is kB/s for the block size asked
    kbps=$(openssl speed -evp sha256 -bytes "$LARGE_BODY" -seconds 1 \
               2>/dev/null | awk '/^sha256/ { v = $NF } END { printf "%.0f", v }')
    printf 'sha_large\t%.1f\n' \
        "$(echo "$LARGE_BODY / ($kbps * 1000) * 1000000" | bc -l)" >> "$FLOORS"

    # what sealing or opening the 256 KB record costs (idempotency_encrypt_key)
    kbps=$(openssl speed -evp aes-256-gcm -bytes "$LARGE_RESPONSE" -seconds 1 \
               2>/dev/null | awk 'tolower($1) ~ /^aes-256-gcm/ { v = $NF } END { printf "%.0f", v }')
    printf 'gcm_large\t%.1f\n' \
        "$(echo "$LARGE_RESPONSE / ($kbps * 1000) * 1000000" | bc -l)" >> "$FLOORS"
    sed 's/^/    /' "$FLOORS"
}

if has floor && command -v "$REDIS_BENCHMARK" > /dev/null; then
    floor_scenario
fi

redis_reset

# --- report -------------------------------------------------------------------

# per scenario and connection count: medians of each side, and the median
# of the per-round module/plain ratios
summary() {
    awk -F'\t' '
    function median(list,   a, n, i, j, t) {
        n = split(list, a, " ")
        for (i = 2; i <= n; i++)
            for (j = i; j > 1 && a[j] + 0 < a[j - 1] + 0; j--) {
                t = a[j]; a[j] = a[j - 1]; a[j - 1] = t
            }
        if (n == 0) return 0
        return n % 2 ? a[(n + 1) / 2] : (a[n / 2] + a[n / 2 + 1]) / 2
    }
    function add(name, s, x) { l[k, s, name] = l[k, s, name] " " x }
    function m(name, s) { return median(l[k, s, name]) }
    NR == 1 { next }
    {
        k = $1 SUBSEP $2; s = $4
        if (!(k in seen)) { seen[k] = 1; order[++nk] = k }
        add("rps", s, $7); add("p50", s, $8); add("p99", s, $9)
        add("ng", s, $10); add("rd", s, $11); add("box", s, $12)
        add("cl", s, $14); add("da", s, $15); add("rm", s, $22)
        add("up", s, $13)
        v[k, $3, s, "rps"] = $7; v[k, $3, s, "p99"] = $9
        v[k, $3, s, "ng"] = $10
        if ($3 > rounds[k]) rounds[k] = $3
        bad[k] += ($18 != 1)
    }
    END {
        for (i = 1; i <= nk; i++) {
            k = order[i]; split(k, kk, SUBSEP)
            r1 = r2 = r3 = ""
            for (r = 1; r <= rounds[k]; r++) {
                if (v[k, r, "plain", "rps"] > 0 && v[k, r, "plain", "p99"] > 0 \
                    && v[k, r, "plain", "ng"] > 0) {
                    r1 = r1 " " v[k, r, "module", "rps"] / v[k, r, "plain", "rps"]
                    r2 = r2 " " v[k, r, "module", "p99"] / v[k, r, "plain", "p99"]
                    r3 = r3 " " v[k, r, "module", "ng"] / v[k, r, "plain", "ng"]
                }
            }
            # 1-2 scenario conns; 3-5 r/s plain module ratio; 6-7 p50 ms;
            # 8-10 p99 ms and ratio; 11-13 nginx us/req and ratio; 14 redis
            # us/req; 15-16 box us/req; 17-18 redis client and Lua cmds/req;
            # 19 check
            printf "%s\t%s\t%.1f\t%.1f\t%.3f\t%.2f\t%.2f\t%.2f\t%.2f\t%.3f\t%.1f\t%.1f\t%.3f\t%.1f\t%.1f\t%.1f\t%.2f\t%.2f\t%s\t%.1f\t%.1f\n",
                kk[1], kk[2],
                m("rps", "plain"), m("rps", "module"), median(r1),
                m("p50", "plain") / 1000, m("p50", "module") / 1000,
                m("p99", "plain") / 1000, m("p99", "module") / 1000, median(r2),
                m("ng", "plain"), m("ng", "module"), median(r3),
                m("rd", "module"), m("box", "plain"), m("box", "module"),
                m("cl", "module"), m("da", "module"),
                bad[k] ? "FAIL" : "OK", m("rm", "module"), m("up", "plain")
        }
    }' "$RUNS"
}

{
    printf 'scenario\tconns\tplain_rps\tmodule_rps\trps_ratio\tplain_p50_ms\tmodule_p50_ms\tplain_p99_ms\tmodule_p99_ms\tp99_ratio\tplain_nginx_us\tmodule_nginx_us\tnginx_ratio\tredis_us_per_req\tplain_box_us\tmodule_box_us\tclient_cmds_per_req\tdata_cmds_per_req\tcheck\tredis_masters_us_per_req\tplain_upstream_us\n'
    summary
} > "$DIR/summary.tsv"

report() {
    # another server or the native path: the report says which (the
    # default's report is as it was)
    if [ "$NATIVE" = 1 ] || [ "$REDIS_SERVER" != redis-server ]; then
        echo "== $("$REDIS_SERVER" --version | awk '{ print $1, $2, $3 }'); store path:" \
             "$([ "$NATIVE" = 1 ] && echo "native compare-and-set (BENCH_NATIVE=1)" ||
                echo "scripts") =="
    fi
    if [ -n "$SEAL" ]; then
        echo "== records sealed: idempotency_encrypt_key on every module edge (BENCH_ENCRYPT=1) =="
    else
        echo "== records in clear (BENCH_ENCRYPT=1 seals them) =="
    fi
    echo "== results: medians over rounds; ratio = median of per-round module/plain =="
    echo "   (box = CPU of the whole machine per request: wrk, both nginx, Redis, kernel)"
    printf '%-14s %5s | %7s %7s %5s | %13s | %15s %5s | %13s %5s | %6s | %13s | %11s | %s\n' \
        scenario conns "plain" "module" "" "p50 ms" "p99 ms" "" \
        "nginx us/req" "" "redis" "box us/req" "scripts" ""
    printf '%-14s %5s | %7s %7s %5s | %13s | %15s %5s | %13s %5s | %6s | %13s | %11s | %s\n' \
        "" "" "r/s" "r/s" ratio "plain/module" "plain/module" ratio \
        "plain/module" ratio "us/req" "plain/module" "/req (data)" check
    awk -F'\t' '{
        if (NR == 1) next
        printf "%-14s %5s | %7.0f %7.0f %5.2f | %6.2f/%-6.2f | %7.2f/%-7.2f %5.2f | %6.1f/%-6.1f %5.2f | %6.1f | %6.1f/%-6.1f | %4.2f (%4.2f) | %s\n",
            $1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14,
            $15, $16, $17, $18, $19
    }' "$DIR/summary.tsv"
    echo

    # the figure the Redis side is judged by: CPU of the Redis process(es)
    # per request (/proc), sum over every node for the cluster
    echo "== Redis CPU per request (us of Redis process CPU, /proc; cluster: all 6 nodes) =="
    awk -F'\t' 'NR > 1 && $2 == 32 {
        printf "  %-14s %7.1f us/req   %4.2f client cmds/req (%4.2f data)", $1,
            $14, $17, $18
        if ($1 ~ /^cluster/)
            printf "   masters %.1f + replicas %.1f", $20, $14 - $20
        printf "\n"
    }' "$DIR/summary.tsv"
    awk -F'\t' 'NR > 1 && $1 > 0 {
        printf "  %-14s %7.1f us/req   (waiter %.1f us, original %.1f us)\n",
            "wait", $11, $12, $13
    }' "$WAITS"
    echo

    if [ "$(wc -l < "$WAITS")" -gt 1 ]; then
        echo "== waiting duplicates: time from the original's response to each duplicate's =="
        awk -F'\t' 'NR > 1 {
            printf "  %s trials x %s duplicates: p50 %.2f  p90 %.2f  p99 %.2f  max %.2f ms   (original answered in %.1f ms)\n",
                $1, $2, $4, $5, $6, $7, $8
            printf "  Redis commands per waiting duplicate %.2f, %.2f of them while it waits (after the claim that found the key busy; an original alone: %.2f)   %s\n",
                $9, $9 - 1, $10, $14 == 1 ? "OK" : "FAIL: " $15
        }' "$WAITS"
        sed -n 's/^WAITCMD /  /p' "$DIR/wait.txt" |
            awk '{ printf "    %-16s %6.3f per waiter  %6.3f per original\n", $1, $2, $3 }'
        echo
    fi

    echo "== targets (32 connections) =="
    awk -F'\t' -v mon="$(tr '\n' ' ' < "$DIR/monitor.sum")" '
    function t(name, have, value, cmp, limit,   pass) {
        if (!have) { printf "  %-44s %7s  %s\n", name, "-", "NOT RUN"; return }
        pass = cmp == ">=" ? value >= limit : value <= limit
        printf "  %-44s %7.3f  %s\n", name, value, pass ? "PASS" : "FAIL"
    }
    FILENAME == ARGV[2] {
        # while it waits: all but the claim that found the key busy
        if (FNR > 1 && $1 > 0) { w = 1; wp99 = $6; wcmd = $9 - 1 }
        next
    }
    FNR > 1 && $2 == 32 {
        f[$1] = 1; rr[$1] = $5; p99r[$1] = $10; ngr[$1] = $13; cl[$1] = $17
        rd[$1] = $14
    }
    END {
        split(mon, m, " ")
        t("fresh throughput >= 0.80x plain", f["fresh"], rr["fresh"], ">=", 0.80)
        t("fresh p99 latency <= 1.3x plain", f["fresh"], p99r["fresh"], "<=", 1.3)
        t("replay throughput >= 1.5x plain", f["replay"], rr["replay"], ">=", 1.5)
        t("bypass throughput >= 0.99x plain", f["bypass"], rr["bypass"], ">=", 0.99)
        t("large replay throughput >= 1.0x plain", f["large-replay"],
          rr["large-replay"], ">=", 1.0)
        t("large fresh throughput >= 0.5x plain", f["large-fresh"],
          rr["large-fresh"], ">=", 0.5)
        t("fresh nginx CPU/request <= 1.15x plain", f["fresh"], ngr["fresh"], "<=", 1.15)
        # commandstats cannot tell a SET sent by a client from one a script ran:
        # the MONITOR sample counts what the module itself sent
        t("fresh Redis commands/request <= 2 (MONITOR)", 1, m[2], "<=", 2)
        t("replay Redis commands/request <= 1 (MONITOR)", 1, m[4], "<=", 1)
        t("fresh Redis CPU/request <= 10 us", f["fresh"], rd["fresh"], "<=", 10)
        t("wait: duplicate p99 after the original <= 5 ms", w, wp99, "<=", 5)
        t("wait: Redis commands while waiting <= 2", w, wcmd, "<=", 2)
    }' "$DIR/summary.tsv" "$WAITS"
    echo

    # the box is saturated, so throughput follows the box's CPU per
    # request: the best ratio is plain's box CPU over plain's plus the
    # least the module must add (or, on replays, put in the upstream's place)
    if [ -s "$FLOORS" ]; then
        echo "== floors (this box: the ratio if the module added nothing else) =="
        awk -F'\t' '
        FILENAME == ARGV[1] { fl[$1] = $2; next }
        FNR > 1 && $2 == 32 { box[$1] = $15; up[$1] = $21; rr[$1] = $5; have[$1] = 1 }
        END {
            printf "  Redis CPU per native SET of a new 200-byte value  %7.1f us\n", fl["set_small"]
            printf "  Redis CPU per native SET of a new 256 KB value    %7.1f us\n", fl["set_large"]
            printf "  client CPU to send it (redis-benchmark)           %7.1f us\n", fl["set_large_client"]
            printf "  Redis CPU per native GET of a 256 KB value        %7.1f us\n", fl["get_large"]
            printf "  SHA-256 of the 64 KB body (the fingerprint)       %7.1f us\n", fl["sha_large"]
            printf "  AES-256-GCM of the 256 KB response (a seal, an open) %4.1f us\n", fl["gcm_large"]
            if (have["large-fresh"]) {
                b = box["large-fresh"]
                printf "  large fresh:  plain box %.0f us + SET 256 KB (Redis and client) + SHA-256 -> at best %.2fx plain (measured %.2fx)\n",
                    b, b / (b + fl["set_large"] + fl["set_large_client"] + fl["sha_large"]),
                    rr["large-fresh"]
            }
            if (have["large-replay"]) {
                b = box["large-replay"]
                printf "  large replay: plain box %.0f us - upstream %.0f us + GET 256 KB + SHA-256 -> about %.2fx plain (measured %.2fx; the module edge also skips the proxying)\n",
                    b, up["large-replay"],
                    b / (b - up["large-replay"] + fl["get_large"] + fl["sha_large"]),
                    rr["large-replay"]
            }
        }' "$FLOORS" "$DIR/summary.tsv"
        echo
    fi

    echo "load average after: $(cut -d' ' -f1-3 /proc/loadavg)"
}

echo
report | tee "$DIR/report.txt"

echo
if [ "$fails" -ne 0 ]; then
    echo "CORRECTNESS: $fails run(s) FAILED; see $RUNS and $DIR/*/error.log"
    exit 1
fi
echo "CORRECTNESS: all runs OK (statuses, upstream counts, error logs)"
