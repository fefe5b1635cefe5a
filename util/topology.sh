#!/usr/bin/env bash
# util/topology.sh: throw-away Redis topologies on loopback for the tests.
#
#   util/topology.sh up|down|status NAME [DIR]
#       NAME: standalone-tls | cluster | cluster-tls | sentinel |
#             sentinel-tls | replica
#       DIR:  where the instances, their pid files, logs and certificates
#             live ($TOPO_DIR, default /tmp/ngx-idempotency-topo-NAME)
#   util/topology.sh ACTION [ARGS]   on a running topology (the DIR is
#       $TOPO_DIR, else /tmp/ngx-idempotency-topo-$TOPO, TOPO defaulting
#       to the topology the action is for):
#       cluster-failover [MASTER]      graceful CLUSTER FAILOVER by its replica
#       cluster-kill-master [MASTER]   kill -9, wait for the promotion
#       cluster-restart PORT           start a killed node again (rejoins)
#       cluster-migrate-slot SLOT [TO] leave SLOT MIGRATING/IMPORTING (ASK)
#       cluster-finish-migration       move its keys, assign the slot to TO
#       cluster-reshard N [FROM TO]    redis-cli --cluster reshard N slots
#       sentinel-failover [--switch-only]  SENTINEL FAILOVER, wait until
#                                      every Sentinel announced
#                                      +switch-master and, unless
#                                      --switch-only, the old master is a
#                                      replica (about 9 s more)
#       sentinel-kill-master           kill -9 the master, wait until every
#                                      Sentinel announced its successor
#       replica-pause|replica-resume   SIGSTOP/SIGCONT the replica
#   The cluster-* actions apply to cluster or cluster-tls, the sentinel-*
#   ones to sentinel or sentinel-tls: the one in the DIR ($TOPO selects
#   the default DIR).
#   MASTER defaults to the master owning slot 0, FROM to the owner of slot
#   0, TO to the owner of slot 16383 (or, for a migration, another master).
#   Every command prints what it did on one line; non-zero exit on failure.
#
# Port map (TOPO_BASE, default 23000, plus the offsets below); the
# topologies use distinct ports, so all of them can run at once:
#   standalone-tls  +0 TLS only, client certificate optional
#                   +1 TLS only, client certificate required
#   cluster         +11..+16 (3 masters, 3 replicas), bus +111..+116
#   cluster-tls     +21..+26 TLS only (also bus and replication), bus
#                   +121..+126
#   sentinel        +31 master, +32 +33 replicas; Sentinels +41..+43,
#                   master name "idem"
#   replica         +51 master, +52 its replica
#   sentinel-tls    +61 master, +62 +63 replicas; Sentinels +71..+73; all
#                   TLS only (replication and Sentinel links too), client
#                   certificate optional; master name "idem"
#   +200..+499      not used here: left to the tests (nginx, DNS stub)
#
# REDIS_SERVER, REDIS_SENTINEL and REDIS_CLI name the server, the Sentinel
# and the client: redis-server, redis-server (run with --sentinel) and
# redis-cli by default; valkey-server, valkey-sentinel and valkey-cli for
# Valkey, whose configuration and commands are the same here.
#
# Every data node also has the ACL user "idem", password "idem-password",
# with every command and key; the default user needs no password. The TLS
# topologies' DIR/tls holds ca.crt, redis.crt/.key (SAN DNS:localhost,
# IP:127.0.0.1), client.crt/.key (signed by ca.crt), and other-ca.crt,
# other-client.crt/.key: an unrelated CA and a client it signed.
#
# Timings suit a loaded 2-core machine: cluster-node-timeout 2000 (lower
# fails over by mistake), repl-diskless-sync-delay 0 (replicas sync at
# once), repl-ping-replica-period 1 (CLUSTER SLOTS lists a replica only
# once its offset is not 0, which an idle master's pings make it).
set -euo pipefail

base=${TOPO_BASE:-23000}
server_bin=${REDIS_SERVER:-redis-server}
sentinel_bin=${REDIS_SENTINEL:-$server_bin}
cli_base=("${REDIS_CLI:-redis-cli}" --no-auth-warning -h 127.0.0.1)
tls_args=()
me=${0##*/}
# shellcheck source=util/lib.sh
. "$(dirname "$0")/lib.sh"

# wait_for TENTHS CMD...: until CMD succeeds, at most TENTHS x 0.1 s
wait_for() {
    local n=$1
    shift
    for ((i = 0; i < n; i++)); do
        if "$@" >/dev/null 2>&1; then
            return 0
        fi
        sleep 0.1
    done
    return 1
}

now_ms() { echo $(($(date +%s%N) / 1000000)); }

# cli PORT ARGS...: redis-cli, bounded: a node stopped or wedged must not
# hang the tests (cli_timeout is longer for redis-cli --cluster)
cli_timeout=10
cli() {
    local port=$1
    shift
    timeout "$cli_timeout" "${cli_base[@]}" -p "$port" "${tls_args[@]}" "$@"
}

# ------------------------------------------------------------ the layout

# ports NAME [data|sentinel]: the instances of a topology
ports() {
    local o
    case $1:${2:-data} in
        standalone-tls:data) o="0 1" ;;
        cluster:data) o="11 12 13 14 15 16" ;;
        cluster-tls:data) o="21 22 23 24 25 26" ;;
        sentinel:data) o="31 32 33" ;;
        sentinel:sentinel) o="41 42 43" ;;
        replica:data) o="51 52" ;;
        sentinel-tls:data) o="61 62 63" ;;
        sentinel-tls:sentinel) o="71 72 73" ;;
        *) o="" ;;
    esac
    for i in $o; do
        echo $((base + i))
    done
}

is_tls() { [[ $name == *-tls ]]; }

# redis-cli over TLS: the client certificate suits both servers, those
# that require one and those that do not
use_tls() {
    if is_tls; then
        tls_args=(--tls --cacert "$dir/tls/ca.crt"
                  --cert "$dir/tls/client.crt" --key "$dir/tls/client.key")
    fi
}

node_dir() { echo "$dir/$1"; }

# pid_of PORT: the pid of a running instance, or nothing. The pid file
# may outlive its process (kill -9), and a pid may be reused: check that
# it is still a Redis (or a Valkey).
pid_of() {
    local f pid comm state
    f=$(node_dir "$1")/redis.pid
    [ -f "$f" ] || return 0
    pid=$(cat "$f")
    [[ $pid =~ ^[0-9]+$ ]] || return 0
    comm=$(cat "/proc/$pid/comm" 2>/dev/null) || return 0
    [[ $comm == redis-* || $comm == valkey-* ]] || return 0
    state=$(awk '{ print $3 }' "/proc/$pid/stat" 2>/dev/null) || return 0
    [ "$state" != Z ] || return 0
    echo "$pid"
}

# live PORTS...: those running and not stopped
live() {
    local p pid
    for p in "$@"; do
        pid=$(pid_of "$p")
        [ -n "$pid" ] || continue
        [ "$(awk '{ print $3 }' "/proc/$pid/stat" 2>/dev/null)" != T ] \
            || continue
        echo "$p"
    done
}

all_ports() {
    ports "$name"
    ports "$name" sentinel
}

live_data() {
    local all
    mapfile -t all < <(ports "$name")
    live "${all[@]}"
}

gone() { [ -z "$(pid_of "$1")" ]; }

stopped() { [ -z "$(live "$1")" ]; }

# ------------------------------------------------------------ certificates

make_certs() {
    local t=$dir/tls
    mkdir -p "$t"
    # ECDSA P-256: key generation is instant, unlike RSA on a busy machine
    local key=(-newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes)
    for ca in ca other-ca; do
        openssl req -x509 "${key[@]}" -days 3 -subj "/CN=idem-test-$ca" \
            -keyout "$t/$ca.key" -out "$t/$ca.crt" 2>/dev/null
    done
    sign() { # sign NAME CA CN EXTENSIONS
        openssl req "${key[@]}" -subj "/CN=$3" -keyout "$t/$1.key" \
            -out "$t/$1.csr" 2>/dev/null
        printf '%s\n' "$4" > "$t/$1.ext"
        openssl x509 -req -in "$t/$1.csr" -CA "$t/$2.crt" -CAkey "$t/$2.key" \
            -CAcreateserial -days 3 -extfile "$t/$1.ext" \
            -out "$t/$1.crt" 2>/dev/null
        rm -f "$t/$1.csr" "$t/$1.ext"
    }
    sign redis ca localhost "subjectAltName=DNS:localhost,IP:127.0.0.1
extendedKeyUsage=serverAuth,clientAuth"
    sign client ca idem-client "extendedKeyUsage=clientAuth"
    sign other-client other-ca idem-other-client "extendedKeyUsage=clientAuth"
    # the workers of a root nginx run as nobody
    chmod 644 "$t"/*.key
}

# ------------------------------------------------------------ instances

# conf PORT [LINES...]: the configuration of a data node
conf() {
    local port=$1 d
    shift
    d=$(node_dir "$port")
    mkdir -p "$d"
    {
        echo "bind 127.0.0.1"
        if is_tls; then
            echo "port 0"
            echo "tls-port $port"
            echo "tls-cert-file $dir/tls/redis.crt"
            echo "tls-key-file $dir/tls/redis.key"
            echo "tls-ca-cert-file $dir/tls/ca.crt"
            echo "tls-replication yes"
            # nginx connects with or without a client certificate
            [ "$name" != sentinel-tls ] || echo "tls-auth-clients optional"
        else
            echo "port $port"
        fi
        echo "daemonize yes"
        echo "pidfile $d/redis.pid"
        echo "logfile $d/redis.log"
        echo "dir $d"
        echo 'save ""'
        echo "appendonly no"
        echo "enable-debug-command local"
        echo "repl-diskless-sync yes"
        echo "repl-diskless-sync-delay 0"
        # a master would wait up to 10 s for its replicas before exiting
        echo "shutdown-timeout 0"
        echo "user idem on >idem-password ~* &* +@all"
        printf '%s\n' "$@"
    } > "$d/redis.conf"
}

cluster_conf() {
    local port=$1 tls=()
    shift
    # the bus over TLS too: otherwise a TLS-only node (port 0) announces
    # port 0, and its replicas cannot sync
    if is_tls; then
        tls=("tls-cluster yes")
    fi
    conf "$port" "cluster-enabled yes" "cluster-port $((port + 100))" \
        "cluster-config-file $(node_dir "$port")/nodes.conf" \
        "cluster-node-timeout 2000" "cluster-replica-validity-factor 0" \
        "repl-ping-replica-period 1" "${tls[@]}" "$@"
}

sentinel_conf() {
    local port=$1 master=$2 d listen
    d=$(node_dir "$port")
    mkdir -p "$d"
    listen="port $port"
    # TLS to the clients, the other Sentinels and the data nodes (which
    # get the server certificate as a client certificate)
    if is_tls; then
        listen="port 0
tls-port $port
tls-cert-file $dir/tls/redis.crt
tls-key-file $dir/tls/redis.key
tls-ca-cert-file $dir/tls/ca.crt
tls-replication yes
tls-auth-clients optional"
    fi
    # a Sentinel rewrites its own file: each has its own
    cat > "$d/redis.conf" <<EOF
bind 127.0.0.1
$listen
daemonize yes
pidfile $d/redis.pid
logfile $d/redis.log
dir $d
sentinel monitor idem 127.0.0.1 $master 2
sentinel down-after-milliseconds idem 2000
sentinel failover-timeout idem 6000
sentinel parallel-syncs idem 2
EOF
}

start() { # start PORT: from its configuration, until it answers PING
    local port=$1 d bin=$server_bin extra=()
    d=$(node_dir "$port")
    if grep -q '^sentinel monitor' "$d/redis.conf"; then
        bin=$sentinel_bin
        extra=(--sentinel)
    fi
    "$bin" "$d/redis.conf" "${extra[@]}" >/dev/null
    # our pid file first: a PING could be answered by a stranger on the
    # port, and a Redis that cannot bind exits before writing it
    wait_for 100 answers "$port" ||
        die "redis on port $port did not start (see $d/redis.log)"
}

answers() { [ -n "$(pid_of "$1")" ] && cli "$1" PING; }

# ------------------------------------------------------------ cluster

# slot_map PORT: "first last master-port" lines, as PORT sees them
slot_map() {
    cli "$1" CLUSTER NODES | awk '
        $3 ~ /master/ && $3 !~ /fail/ {
            split($2, a, "[:@,]")
            for (i = 9; i <= NF; i++) {
                if ($i ~ /^\[/) continue
                n = split($i, r, "-")
                print r[1], (n == 2 ? r[2] : r[1]), a[2]
            }
        }' | sort -n
}

slot_owner() { # slot_owner SLOT
    local p
    p=$(live_data | sed -n 1p)
    slot_map "$p" | awk -v s="$1" '$1 <= s + 0 && s + 0 <= $2 { print $3 }'
}

masters() {
    local p
    p=$(live_data | sed -n 1p)
    slot_map "$p" | awk '{ print $3 }' | sort -u
}

node_id() { cli "$1" CLUSTER MYID; }

role() { cli "$1" ROLE 2>/dev/null | sed -n 1p; }

is_master() { [ "$(role "$1")" = master ]; }

# replica_of PORT: a live node replicating PORT, by its own ROLE
replica_of() {
    local p
    for p in $(live_data); do
        if [ "$(cli "$p" ROLE 2>/dev/null | sed -n '1p;3p' | tr '\n' ' ')" \
             = "slave $1 " ]; then
            echo "$p"
            return 0
        fi
    done
}

# cluster_settled: every live node says cluster_state:ok, sees the same
# slot owners, and lists every live node in CLUSTER SLOTS (a replica is
# listed once it has synced: that is what clients discover)
cluster_settled() {
    local p all ref="" map listed
    all=$(live_data | sort)
    for p in $all; do
        cli "$p" CLUSTER INFO | grep -q '^cluster_state:ok' || return 1
        map=$(slot_map "$p")
        [ -n "$map" ] || return 1
        [ -z "$ref" ] && ref=$map
        [ "$map" = "$ref" ] || return 1
        # ports are above 16383, so no slot number is mistaken for one
        listed=$(cli "$p" CLUSTER SLOTS | grep -xE '[0-9]+' |
                 awk '$1 > 16383' | sort -u)
        [ "$listed" = "$all" ] || return 1
    done
}

cluster_up() {
    local p all=() addrs=()
    for p in $(ports "$name"); do
        cluster_conf "$p"
        start "$p"
        addrs+=("127.0.0.1:$p")
        all+=("$p")
    done
    cli_timeout=120 cli "${all[0]}" --cluster create "${addrs[@]}" \
        --cluster-replicas 1 --cluster-yes >"$dir/create.log" 2>&1 ||
        die "redis-cli --cluster create failed (see $dir/create.log)"
    wait_for 300 cluster_settled || die "the cluster did not settle"
}

# wait_promoted OLD NEW: NEW is a master, OLD (if alive) its replica, and
# the cluster agrees
wait_promoted() {
    wait_for 300 promoted "$@"
}

promoted() {
    [ "$(role "$2")" = master ] || return 1
    if [ -n "$(live "$1")" ]; then
        [ "$(cli "$1" ROLE | sed -n '1p;3p' | tr '\n' ' ')" = "slave $2 " ] ||
            return 1
    fi
    cluster_settled
}

# pair [MASTER]: "MASTER REPLICA", MASTER defaulting to the owner of slot 0
pair() {
    local m=${1:-$(slot_owner 0)} r
    [ "$(role "$m")" = master ] || die "$m is not a master"
    r=$(replica_of "$m")
    [ -n "$r" ] || die "master $m has no live replica"
    echo "$m $r"
}

cluster_failover() {
    local m r t0 mr
    mr=$(pair "${1:-}")
    read -r m r <<< "$mr"
    t0=$(now_ms)
    cli "$r" CLUSTER FAILOVER | grep -qx OK || die "CLUSTER FAILOVER refused"
    wait_promoted "$m" "$r" || die "$r did not take over from $m"
    echo "cluster-failover: $r took over from $m, now its replica," \
         "in $(($(now_ms) - t0)) ms"
}

cluster_kill_master() {
    local m r t0 mr
    mr=$(pair "${1:-}")
    read -r m r <<< "$mr"
    t0=$(now_ms)
    kill -9 "$(pid_of "$m")"
    wait_for 50 gone "$m"
    wait_promoted "$m" "$r" || die "$r was not promoted after $m died"
    echo "cluster-kill-master: killed $m; $r promoted in" \
         "$(($(now_ms) - t0)) ms"
}

cluster_restart() {
    local p=${1:?PORT}
    [ -z "$(pid_of "$p")" ] || die "$p is running"
    [ -f "$(node_dir "$p")/nodes.conf" ] || die "$p is not a cluster node"
    start "$p"
    wait_for 300 restarted "$p" || die "$p did not rejoin"
    echo "cluster-restart: $p rejoined as a replica of" \
         "$(cli "$p" ROLE | sed -n 3p)"
}

restarted() {
    [ "$(role "$1")" = slave ] && cluster_settled
}

cluster_migrate_slot() {
    local slot=${1:?SLOT} src dst
    src=$(slot_owner "$slot")
    [ -n "$src" ] || die "nobody owns slot $slot"
    dst=${2:-$(masters | grep -vx "$src" | sed -n 1p)}
    [ "$dst" != "$src" ] || die "slot $slot is already on $dst"
    [ ! -f "$dir/migration" ] ||
        die "a migration is open: $(cat "$dir/migration")"
    # the target first, so that an ASK never points to a node unaware
    cli "$dst" CLUSTER SETSLOT "$slot" IMPORTING "$(node_id "$src")" |
        grep -qx OK || die "SETSLOT IMPORTING refused by $dst"
    cli "$src" CLUSTER SETSLOT "$slot" MIGRATING "$(node_id "$dst")" |
        grep -qx OK || die "SETSLOT MIGRATING refused by $src"
    echo "$slot $src $dst" > "$dir/migration"
    echo "cluster-migrate-slot: slot $slot MIGRATING on $src," \
         "IMPORTING on $dst"
}

cluster_finish_migration() {
    local slot src dst keys n=0 p id
    [ -f "$dir/migration" ] || die "no migration is open"
    read -r slot src dst < "$dir/migration"
    while :; do
        mapfile -t keys < <(cli "$src" CLUSTER GETKEYSINSLOT "$slot" 100)
        if [ "${#keys[@]}" -eq 0 ] || [ -z "${keys[0]}" ]; then
            break
        fi
        cli "$src" MIGRATE 127.0.0.1 "$dst" "" 0 5000 KEYS "${keys[@]}" |
            grep -qx OK || die "MIGRATE from $src to $dst failed"
        n=$((n + ${#keys[@]}))
    done
    id=$(node_id "$dst")
    # the target, then the source, then the others: as redis-cli does
    for p in "$dst" "$src" $(masters | grep -vxE "$src|$dst"); do
        cli "$p" CLUSTER SETSLOT "$slot" NODE "$id" | grep -qx OK ||
            die "SETSLOT NODE refused by $p"
    done
    rm -f "$dir/migration"
    wait_for 300 cluster_settled || die "the cluster did not settle"
    echo "cluster-finish-migration: slot $slot moved from $src to $dst" \
         "with $n keys"
}

# ranges OLD NEW FROM TO: the slots owned by FROM in the map OLD and by TO
# in NEW, as "a-b c ..."
ranges() {
    awk -v from="$3" -v to="$4" '
        FNR == 1 { f++ }
        { for (s = $1; s <= $2; s++) own[f, s] = $3 }
        END {
            for (s = 0; s <= 16384; s++) {
                hit = s < 16384 && own[1, s] == from && own[2, s] == to
                if (hit && lo == "") lo = s
                if (!hit && lo != "") {
                    out = out sep lo (s - 1 > lo ? "-" (s - 1) : "")
                    sep = " "; lo = ""
                }
            }
            print out
        }' <(echo "$1") <(echo "$2")
}

cluster_reshard() {
    local n=${1:?N} from=${2:-} to=${3:-} p before after moved
    from=${from:-$(slot_owner 0)}
    to=${to:-$(slot_owner 16383)}
    [ "$from" != "$to" ] || die "FROM and TO are the same node"
    p=$(live_data | sed -n 1p)
    before=$(slot_map "$p")
    cli_timeout=120 cli "$p" --cluster reshard "127.0.0.1:$p" \
        --cluster-from "$(node_id "$from")" --cluster-to "$(node_id "$to")" \
        --cluster-slots "$n" --cluster-yes >"$dir/reshard.log" 2>&1 ||
        die "redis-cli --cluster reshard failed (see $dir/reshard.log)"
    wait_for 300 cluster_settled || die "the cluster did not settle"
    after=$(slot_map "$p")
    moved=$(ranges "$before" "$after" "$from" "$to")
    [ -n "$moved" ] || die "no slot moved"
    echo "cluster-reshard: moved $n slots ($moved) from $from to $to"
}

# ------------------------------------------------------------ sentinel

# sentinel_settled N: the Sentinels agree on a master that N replicas
# acknowledge
sentinel_settled() {
    local s m
    m=$(cli "$(ports "$name" sentinel | sed -n 1p)" \
            SENTINEL get-master-addr-by-name idem | tail -1)
    for s in $(ports "$name" sentinel); do
        [ "$(cli "$s" SENTINEL get-master-addr-by-name idem | tail -1)" \
            = "$m" ] || return 1
        cli "$s" SENTINEL master idem | tr '\n' ' ' |
            grep -qE ' flags master .*num-slaves 2 .*num-other-sentinels 2 ' ||
            return 1
    done
    [ "$(role "$m")" = master ] || return 1
    [ "$(cli "$m" INFO replication | grep -c '^slave[0-9]*:.*state=online')" \
        = "$1" ] || return 1
    acked "$m" "$1"
}

sentinel_up() {
    local p master
    master=$(ports "$name" | sed -n 1p)
    for p in $(ports "$name"); do
        if [ "$p" = "$master" ]; then
            conf "$p"
        else
            conf "$p" "replicaof 127.0.0.1 $master"
        fi
        start "$p"
    done
    for p in $(ports "$name" sentinel); do
        sentinel_conf "$p" "$master"
        start "$p"
    done
    wait_for 300 sentinel_settled 2 || die "the sentinels did not settle"
}

# switch ACTION...: runs ACTION while subscribed to every Sentinel, and
# waits until each has published +switch-master away from the old master;
# sets old, new, t0 and t1 (the switch seen by all, in ms)
switch() {
    local s p f i pids=() logs=()
    s=$(ports "$name" sentinel | sed -n 1p)
    old=$(cli "$s" SENTINEL get-master-addr-by-name idem | tail -1)
    for p in $(ports "$name" sentinel); do
        logs+=("$dir/switch-$p.log")
        timeout 60 "${cli_base[@]}" -p "$p" "${tls_args[@]}" \
            SUBSCRIBE +switch-master \
            > "$dir/switch-$p.log" 2>&1 &
        pids+=($!)
    done
    for f in "${logs[@]}"; do
        wait_for 50 grep -q '^subscribe' "$f" || die "cannot subscribe"
    done
    t0=$(now_ms)
    "$@" || die "$* failed"
    for f in "${logs[@]}"; do
        wait_for 300 grep -q "^idem 127.0.0.1 $old " "$f" ||
            die "+switch-master did not reach $f"
    done
    for i in "${pids[@]}"; do
        kill "$i" 2>/dev/null || true
        wait "$i" 2>/dev/null || true
    done
    new=$(cli "$s" SENTINEL get-master-addr-by-name idem | tail -1)
    wait_for 100 is_master "$new" || die "$new is not a master"
    t1=$(now_ms)
}

ask_failover() {
    cli "$(ports "$name" sentinel | sed -n 1p)" SENTINEL failover idem |
        grep -qx OK
}

kill_master() {
    kill -9 "$(pid_of "$old")"
}

sentinel_failover() {
    local old new t0 t1
    switch ask_failover
    if [ "${1:-}" = --switch-only ]; then
        echo "sentinel-failover: master idem moved from $old to $new;" \
             "+switch-master seen by 3 sentinels in $((t1 - t0)) ms;" \
             "$old may still accept writes"
        return 0
    fi
    # settled: the old master demoted (READONLY), both replicas attached.
    # A Sentinel converts a master it wants as a replica 8 s after it
    # last reported its role (a fixed period in Redis 7.0).
    wait_for 300 demoted "$old" "$new" ||
        die "$old was not demoted under $new"
    wait_for 300 sentinel_settled 2 || die "the sentinels did not settle"
    echo "sentinel-failover: master idem moved from $old to $new;" \
         "+switch-master seen by 3 sentinels in $((t1 - t0)) ms," \
         "$old demoted, settled in $(($(now_ms) - t0)) ms"
}

sentinel_kill_master() {
    local old new t0 t1
    switch kill_master
    wait_for 300 sentinel_settled 1 || die "the sentinels did not settle"
    echo "sentinel-kill-master: killed $old; +switch-master to $new seen" \
         "by 3 sentinels in $((t1 - t0)) ms"
}

demoted() {
    [ "$(cli "$1" ROLE | sed -n '1p;3p' | tr '\n' ' ')" = "slave $2 " ]
}

# acked PORT N: N replicas acknowledge a write of this connection. A
# replica "online" after a diskless sync gets the stream only once its
# first REPLCONF ACK arrived; PUBLISH is propagated and leaves no key.
acked() {
    [ "$(printf 'PUBLISH __topology__ ready\nWAIT %s 100\n' "$2" |
         cli "$1" | tail -1)" = "$2" ]
}

# ------------------------------------------------------------ replica

replica_settled() {
    local m r
    read -r m r <<< "$(ports replica | tr '\n' ' ')"
    cli "$r" INFO replication | grep -q '^master_link_status:up' &&
        cli "$m" INFO replication | grep -q "^slave0:.*port=$r,state=online" &&
        acked "$m" 1
}

replica_up() {
    local m r
    read -r m r <<< "$(ports replica | tr '\n' ' ')"
    conf "$m"
    start "$m"
    conf "$r" "replicaof 127.0.0.1 $m"
    start "$r"
    wait_for 300 replica_settled || die "the replica did not sync"
}

replica_signal() { # replica_signal STOP|CONT
    local r pid
    r=$(ports replica | tail -1)
    pid=$(pid_of "$r")
    [ -n "$pid" ] || die "the replica $r is not running"
    kill -"$1" "$pid"
    if [ "$1" = CONT ]; then
        wait_for 300 replica_settled || die "the replica did not catch up"
        echo "replica-resume: replica $r (pid $pid) continued and in sync"
    else
        wait_for 50 stopped "$r" || die "$r did not stop"
        echo "replica-pause: replica $r (pid $pid) stopped"
    fi
}

# ------------------------------------------------------------ standalone

standalone_up() {
    local p opt
    opt=optional
    for p in $(ports standalone-tls); do
        conf "$p" "tls-auth-clients $opt"
        start "$p"
        opt=yes
    done
}

# ------------------------------------------------------------ up/down

down() {
    local p pid pids=()
    [ -d "$dir" ] || return 0
    for p in $(all_ports); do
        pid=$(pid_of "$p")
        [ -n "$pid" ] || continue
        # a stopped process would keep its SIGTERM pending
        kill -CONT "$pid" 2>/dev/null || true
        kill "$pid" 2>/dev/null || true
        pids+=("$p")
    done
    for p in "${pids[@]}"; do
        if ! wait_for 100 gone "$p"; then
            pid=$(pid_of "$p")
            [ -z "$pid" ] || kill -9 "$pid" 2>/dev/null || true
            wait_for 50 gone "$p" || die "$p does not exit"
        fi
    done
    echo "down: $name stopped (${#pids[@]} instances) in $dir"
}

up() {
    local t0
    t0=$(now_ms)
    down >/dev/null
    # a node must not find an old nodes.conf or Sentinel state; refuse to
    # empty a directory that is not ours
    if [ -d "$dir" ] && [ -n "$(ls -A "$dir")" ] &&
       [ ! -f "$dir/topology" ]; then
        die "$dir is not empty and not a topology directory"
    fi
    rm -rf "$dir"
    mkdir -p "$dir"
    echo "$name" > "$dir/topology"
    if is_tls; then
        make_certs
    fi
    use_tls
    case $name in
        standalone-tls) standalone_up ;;
        cluster | cluster-tls) cluster_up ;;
        sentinel | sentinel-tls) sentinel_up ;;
        replica) replica_up ;;
    esac
    echo "up: $name on ports $(all_ports | tr '\n' ' ')in $dir," \
         "ready in $(($(now_ms) - t0)) ms"
}

status() {
    local p pid state bad=0 line
    for p in $(all_ports); do
        pid=$(pid_of "$p")
        if [ -z "$pid" ]; then
            echo "$p down"
            bad=1
            continue
        fi
        if [ -z "$(live "$p")" ]; then
            echo "$p pid $pid stopped"
            continue
        fi
        line=$(cli "$p" ROLE 2>/dev/null | sed -n '1p;2p;3p' | tr '\n' ' ')
        case $line in
            master*) state=master ;;
            slave*) state="replica of $(echo "$line" | cut -d' ' -f3)" ;;
            sentinel*) state=sentinel ;;
            *) state="not answering"; bad=1 ;;
        esac
        echo "$p pid $pid $state"
    done
    return $bad
}

# ------------------------------------------------------------ main

usage() {
    sed -n '2,/^# Port map/p' "$0" | sed '$d; s/^# \{0,1\}//' >&2
    exit 2
}

cmd=${1:-}
[ -n "$cmd" ] || usage
shift

case $cmd in
    up | down | status)
        name=${1:-}
        [ -n "$(ports "$name")" ] || usage
        dir=${2:-${TOPO_DIR:-/tmp/ngx-idempotency-topo-$name}}
        ;;
    cluster-*) name=${TOPO:-cluster} ;;
    sentinel-*) name=${TOPO:-sentinel} ;;
    replica-*) name=replica ;;
    *) usage ;;
esac

if [ "$cmd" != up ]; then
    dir=${dir:-${TOPO_DIR:-/tmp/ngx-idempotency-topo-$name}}
    if [ -f "$dir/topology" ]; then
        name=$(cat "$dir/topology")
    elif [ "$cmd" != down ] && [ "$cmd" != status ]; then
        die "no topology in $dir"
    fi
    use_tls
    case $cmd:$name in
        cluster-*:cluster | cluster-*:cluster-tls | sentinel-*:sentinel | \
        sentinel-*:sentinel-tls | replica-*:replica | down:* | status:*) ;;
        *) die "$cmd does not apply to the topology $name in $dir" ;;
    esac
fi

if [[ $cmd != up && $cmd != down && $cmd != status ]]; then
    [ -n "$(live_data)" ] || die "$name is not running in $dir"
fi

# what set -e stops without a word
trap 'echo "$me: $cmd failed" >&2' ERR

case $cmd in
    up) up ;;
    down) down ;;
    status) status || exit 1 ;;
    cluster-failover) cluster_failover "$@" ;;
    cluster-kill-master) cluster_kill_master "$@" ;;
    cluster-restart) cluster_restart "$@" ;;
    cluster-migrate-slot) cluster_migrate_slot "$@" ;;
    cluster-finish-migration) cluster_finish_migration ;;
    cluster-reshard) cluster_reshard "$@" ;;
    sentinel-failover) sentinel_failover "$@" ;;
    sentinel-kill-master) sentinel_kill_master ;;
    replica-pause) replica_signal STOP ;;
    replica-resume) replica_signal CONT ;;
    *) usage ;;
esac
