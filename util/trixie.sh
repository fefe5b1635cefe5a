#!/usr/bin/env bash
# util/trixie.sh: the suite (`make test`) on Debian 13 "trixie", in a
# debootstrap root kept between runs, once per server: every file with
# trixie's valkey-server, the files the server's commands matter to with
# its redis-server and with the newest servers Debian has (valkey-newest:
# Valkey 9 from the testing release, forky; redis-newest: Redis 8.4 or
# later from experimental).  `make test-trixie` runs it, as root; .ci/run runs it after `make
# test` on the CI's Debian 12.
#
# 1. The root: debootstrap --variant=minbase trixie ROOT MIRROR, MIRROR
#    being the URI of this machine's own apt entry for its own release
#    (deb822 URIs: or one-line entries); trixie-updates from the same
#    archive and trixie-security from the URI of the machine's own
#    -security entry (no such entry: no trixie-security).  No archive is
#    named here.  Then a standard Debian /etc/hosts, util/deps.sh in the
#    root, valkey-server and valkey-tools (and valkey-sentinel where it is a
#    package of its own), with a policy-rc.d that starts no service; and
#    the npm libraries t/047 and t/068 install (the runs have no
#    network), by this machine's npm, whose configuration reaches the
#    registry.  The newest servers: their packages (server, tools,
#    sentinel) downloaded by apt from the same archive's forky and
#    experimental suites (a list of
#    their own, never the root's sources), unpacked into
#    /opt/ngx-idempotency/valkey-newest and .../redis-newest, and checked:
#    they run on trixie's libraries, and are Valkey 9.0 or later and Redis
#    8.4 or later (else the setup fails: no run could test what it is
#    for).  The root
#    is kept in TRIXIE_ROOT with a stamp naming its package list, and built
#    anew (into ROOT.new, renamed when complete) when that list changes.
# 2. Each run: a tmpfs overlay on the root (the kept root is never written
#    by a run, although the package test installs and purges a package),
#    the checkout (tracked and untracked non-ignored files, as the work
#    tree has them) copied to /build/repo in it, and `make test` there,
#    inside private network, PID and mount namespaces (unshare): lo up, a
#    fresh /proc, /dev, /dev/pts and /sys bound, a fresh tmpfs on /tmp and
#    /dev/shm.  The suite's fixed ports
#    collide with nothing on the machine, and every process and mount of a
#    run ends with its namespaces; the exit trap still unmounts whatever is
#    left under the root and kills any process still chrooted there.
#    `timeout` bounds each run (TRIXIE_TIMEOUT) and the setup.
# 3. A summary: per server, prove's Files=/Tests= line and its result, and
#    t/016's (make deb and the package test); the tail of a failing run's
#    log; the exit status is non-zero when any run failed.
#
# Knobs (environment):
#   TRIXIE_ROOT      the root (/var/cache/ngx-idempotency/trixie-root)
#   TRIXIE_SERVERS   the runs, in order ("redis valkey redis-newest
#                    valkey-newest")
#   TRIXIE_WHOLE     the runs that run every file ("valkey"); the others
#                    run TRIXIE_SERVER_FILES.  One whole suite on trixie
#                    tests its nginx, hiredis and OpenSSL; the server
#                    files test each server's commands, and CI's time
#                    stays under the hour
#   TRIXIE_SERVER_FILES  the files the other runs run (those where the
#                    server's commands differ: the store, its native
#                    compare-and-set and -delete, WAIT and WAITAOF, the
#                    admin and its listing, a restart's LOADING and BUSY,
#                    the topologies' finishes); "all": every file
#   TRIXIE_OUT       where the logs go (build/trixie): setup.log,
#                    test-redis.log, test-valkey.log, and tap-SERVER/, the
#                    TAP of every test file
#   TRIXIE_TIMEOUT   seconds a run may take before it is killed (1200)
#   TRIXIE_REBUILD=1 build the root anew even when its stamp matches
#   TEST_FILES       passed to util/test.sh in the root, in every run
#                    (default: as TRIXIE_WHOLE says)
#   TRIXIE_TARGET    the make target each run runs (test; test-asan: the
#                    module under AddressSanitizer)
#
# `util/trixie.sh bench` (`make bench-trixie`) runs the bench instead of
# the suite, in the same root, overlay and namespaces: the module built
# once in the root against trixie's nginx, then bench/run.sh once per
# entry of TRIXIE_BENCH_RUNS, SERVER:PATH with SERVER redis (trixie's
# redis-server, its redis-cli and redis-benchmark) or valkey (valkey-server,
# valkey-cli, valkey-benchmark) and PATH scripts (the module's default
# user: Lua scripts) or native (BENCH_NATIVE=1: an ACL user without
# @scripting, so SET IFEQ; Valkey 8.1 and later).  The list is run
# TRIXIE_BENCH_REPEAT times over, one entry after the other, so that the
# machine's other load falls on every entry alike.  Bench knobs:
#   TRIXIE_BENCH_RUNS    ("valkey:scripts valkey:native redis:scripts")
#   TRIXIE_BENCH_REPEAT  (1)
#   BENCH_SCENARIOS      ("fresh replay bypass large-fresh large-replay")
#   BENCH_ROUNDS, BENCH_DURATION, BENCH_LARGE_DURATION, BENCH_QUICK,
#   BENCH_SWEEP_CONNS, BENCH_ENCRYPT, BENCH_MODULE_DIRECTIVES: passed on
#   TRIXIE_TIMEOUT       seconds each bench run may take (1800)
# Each run's results (bench/run.sh's BENCH_DIR: report.txt, runs.tsv,
# summary.tsv, wrk/) go to TRIXIE_OUT/bench/N-SERVER-PATH, the whole log to
# TRIXIE_OUT/bench.log; the summary (TRIXIE_OUT/bench-summary.txt) has
# each run's module/plain throughput ratios and Redis CPU per request,
# then per entry the medians over every round of every repeat.
set -euo pipefail

top=$(cd "$(dirname "$0")/.." && pwd)
# shellcheck source=util/apt-sources.sh
. "$top/util/apt-sources.sh"
# shellcheck source=util/lib.sh
. "$top/util/lib.sh"
self=$top/util/trixie.sh
me=${0##*/}

mode='test'
if [ "${1:-}" = bench ]; then
    mode=bench
    shift
fi
root=${TRIXIE_ROOT:-/var/cache/ngx-idempotency/trixie-root}
servers=${TRIXIE_SERVERS:-redis valkey redis-newest valkey-newest}
whole=${TRIXIE_WHOLE-valkey}
server_files=${TRIXIE_SERVER_FILES:-t/001-lifecycle.t t/002-store.t \
t/004-conflict.t t/005-redis.t t/015-redis-conn.t t/017-metrics.t \
t/020-torture.t \
t/027-redis-resend.t t/031-redis-cluster.t t/033-redis-wait.t \
t/034-store.t t/035-wake.t t/040-large-reply.t \
t/043-waitaof.t t/044-at-most-once.t t/045-faults.t t/048-encrypt.t \
t/049-admin.t t/053-native-cas.t t/054-wake-quiet.t t/055-release-order.t \
t/056-redis-restart.t t/062-admin-list.t t/063-store-cluster.t \
t/064-wait-release.t}
out=${TRIXIE_OUT:-$top/build/trixie}
if [ "$mode" = bench ]; then
    run_timeout=${TRIXIE_TIMEOUT:-1800}
else
    run_timeout=${TRIXIE_TIMEOUT:-1200}
fi
target=${TRIXIE_TARGET:-test}
bench_runs=${TRIXIE_BENCH_RUNS:-valkey:scripts valkey:native redis:scripts}
bench_repeat=${TRIXIE_BENCH_REPEAT:-1}
# what bench/run.sh reads that the bench mode passes on into the root
bench_knobs=(BENCH_SCENARIOS BENCH_ROUNDS BENCH_DURATION BENCH_LARGE_DURATION
             BENCH_QUICK BENCH_SWEEP_CONNS BENCH_SWEEP_DURATION BENCH_ENCRYPT
             BENCH_MODULE_DIRECTIVES BENCH_UPSTREAM_WORKERS)
setup_timeout=1200
release=trixie
stamp_file=.ngx-idempotency-stamp
valkey_pkgs=(valkey-server valkey-tools)
# the newest servers: KIND/SUITE/LOWEST, unpacked in the root under
# /opt/ngx-idempotency/KIND-newest
newest=(valkey/forky/9.0 redis/experimental/8.4)
newest_dir=/opt/ngx-idempotency
newest_list=/etc/apt/ngx-idempotency-newest.list
# what the suite calls that no package of deps.sh names: pgrep and ps
# (t/020, t/021, t/030, t/044, util/deb-test.sh); `ip`, which brings
# lo up in a run's network namespace; and aioquic, t/070's HTTP/3 client
# that goes away mid-request (only trixie's nginx has HTTP/3: Debian 12
# skips t/070, and has no python3-aioquic)
extra_pkgs=(procps iproute2 python3-aioquic)

now() { date +%s; }

# ------------------------------------------------ inside the namespaces
# `util/trixie.sh __inside setup|run ARGS...` is what unshare runs: PID 1
# of the new PID namespace, in its own mount namespace, so the mounts made
# here vanish with it whatever happens.

# mount_root: what a chroot needs, in this (private) mount namespace
mount_root() {
    mount -t proc proc "$root/proc"
    mount --bind /dev "$root/dev"
    mount --bind /dev/pts "$root/dev/pts"
    mount --bind /sys "$root/sys"
    mount -t tmpfs -o mode=1777,size=4g tmpfs "$root/tmp"
    mount -t tmpfs -o mode=1777,size=1g tmpfs "$root/dev/shm"
    cp -L /etc/resolv.conf "$root/etc/resolv.conf" 2>/dev/null || true
}

# in_root CMD...: CMD in the root with a clean environment
in_root() {
    chroot "$root" /usr/bin/env -i \
        PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
        HOME=/root LANG=C.UTF-8 TERM=dumb DEBIAN_FRONTEND=noninteractive \
        ${CI:+CI=$CI} "$@"
}

inside() {
    inside_what=$1
    shift
    trap 'umount -R "$root/proc" "$root/dev/shm" "$root/dev/pts" \
              "$root/dev" "$root/sys" "$root/tmp" 2>/dev/null || true
          [ "$inside_what" = setup ] || umount -R "$root" "${root%/merged}" \
              2>/dev/null || true' EXIT
    case $inside_what in
        setup)
            mount_root
            inside_setup "$@"
            ;;
        run)
            overlay_root
            local server=$1
            local envs=()
            case $server in
                redis) ;;
                valkey)
                    envs=(REDIS_SERVER=valkey-server REDIS_CLI=valkey-cli
                          "REDIS_SENTINEL=$(in_root sh -c \
                              'command -v valkey-sentinel || echo valkey-server')")
                    ;;
                *-newest)
                    envs=("$(newest_path "$server")")
                    [ "$server" = redis-newest ] ||
                        envs+=(REDIS_SERVER=valkey-server REDIS_CLI=valkey-cli
                               REDIS_SENTINEL=valkey-sentinel)
                    ;;
            esac
            [ -z "${TEST_FILES:-}" ] || envs+=("TEST_FILES=$TEST_FILES")
            local rc=0
            in_root "${envs[@]}" PERL_TEST_HARNESS_DUMP_TAP=/tmp/tap \
                timeout -k 30 "$run_timeout" make -C /build/repo "$target" ||
                rc=$?
            # every file's TAP (prove's dump), for what the summary checks
            rm -rf "$out/tap-$server"
            [ ! -d "$root/tmp/tap" ] || cp -r "$root/tmp/tap" "$out/tap-$server"
            return $rc
            ;;
        bench)
            overlay_root
            inside_bench "$@"
            ;;
    esac
}

# overlay_root: the kept root stays as it is: a run writes to a tmpfs
# overlay on it (the package test installs and purges a package, the build
# writes to /build/repo), with the checkout in /build/repo, lo up
overlay_root() {
    local run_dir=$root.run
    mount -t tmpfs -o mode=755,size=8g tmpfs "$run_dir"
    mkdir "$run_dir/upper" "$run_dir/work" "$run_dir/merged"
    mount -t overlay overlay -o "lowerdir=$root" \
        -o "upperdir=$run_dir/upper,workdir=$run_dir/work" \
        "$run_dir/merged"
    root=$run_dir/merged
    copy_checkout "$root/build/repo"
    mount_root
    # the new network namespace has only lo, down until now
    in_root ip link set lo up
}

# inside_bench RUN...: the module built once, then bench/run.sh per RUN
# (N:SERVER:PATH), each run's BENCH_DIR copied to $out/bench/N-SERVER-PATH
inside_bench() {
    local spec n server path envs k rc=0 dir
    in_root timeout -k 30 "$run_timeout" make -C /build/repo module ||
        return 1
    rm -rf "$out/bench"
    mkdir -p "$out/bench"
    for spec in "$@"; do
        IFS=: read -r n server path <<< "$spec"
        envs=()
        case $server in
            redis|redis-newest) ;;
            valkey|valkey-newest)
                envs=(REDIS_SERVER=valkey-server REDIS_CLI=valkey-cli
                      REDIS_BENCHMARK=valkey-benchmark)
                ;;
        esac
        case $server in
            *-newest) envs+=("$(newest_path "$server")") ;;
        esac
        [ "$path" != native ] || envs+=(BENCH_NATIVE=1)
        envs+=("BENCH_SCENARIOS=${BENCH_SCENARIOS:-fresh replay bypass large-fresh large-replay}")
        for k in "${bench_knobs[@]}"; do
            [ "$k" = BENCH_SCENARIOS ] || [ -z "${!k:-}" ] ||
                envs+=("$k=${!k}")
        done
        dir=/tmp/bench-$n-$server-$path
        echo "== trixie bench $n: $server, $path path ($(date -u +%H:%M:%S) UTC," \
             "load average $(cut -d' ' -f1-3 /proc/loadavg))"
        in_root "${envs[@]}" BENCH_DIR="$dir" timeout -k 30 "$run_timeout" \
            /build/repo/bench/run.sh \
            /build/repo/build/ngx_http_idempotency_module.so || rc=1
        cp -r "$root$dir" "$out/bench/$n-$server-$path" 2>/dev/null || rc=1
        in_root "${envs[@]}" sh -c "${server%-newest}-server --version" \
            > "$out/bench/$n-$server-$path/server.txt" 2>&1 || true
    done
    return $rc
}

# inside_setup: the packages, in the root: extra_pkgs, util/deps.sh's,
# Valkey's
inside_setup() {
    local policy=$root/usr/sbin/policy-rc.d
    printf '#!/bin/sh\nexit 101\n' > "$policy"
    chmod +x "$policy"
    in_root apt-get update -qq
    in_root apt-get install -y -qq --no-install-recommends \
        "${extra_pkgs[@]}" >/dev/null
    in_root /build/repo/util/deps.sh
    local v=("${valkey_pkgs[@]}")
    if [ -n "$(in_root apt-cache show --no-all-versions valkey-sentinel \
                   2>/dev/null)" ]; then
        v+=(valkey-sentinel)
    fi
    in_root /build/repo/util/deps.sh "${v[@]}"
    # deps.sh removes policy-rc.d on exit: put it back for what follows
    printf '#!/bin/sh\nexit 101\n' > "$policy"
    chmod +x "$policy"
    newest_setup
    echo "in the root: $(in_root dpkg-query -W -f '${Package} ${Version}\n' \
        redis-server valkey-server nginx libhiredis-dev openssl gcc-14 \
        2>/dev/null | tr '\n' ';')"
}

# newest_path KIND-newest: the PATH of a run on that server
newest_path() {
    local base=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
    echo "PATH=$newest_dir/$1/usr/bin:$base"
}

# newest_setup: the newest servers' packages, by apt from their suites
# (newest_list, written by the host: this root's own sources stay trixie's)
# with lists and caches of their own, unpacked under newest_dir; each must
# run here (trixie's libraries, which trixie's redis and valkey brought)
# and be at least as new as the commands it is there for
newest_setup() {
    local spec kind suite lowest dir ver apt d
    # signatures checked as ever; the suites' Valid-Until (a week: they
    # change daily) is not, as a mirror that is a snapshot serves it past
    apt=(apt-get -q -o "Dir::Etc::SourceList=$newest_list"
         -o Acquire::Check-Valid-Until=false
         -o Dir::Etc::SourceParts=/nonexistent
         -o Dir::State::Lists=/var/lib/apt/ngx-idempotency-newest
         -o Dir::Cache=/var/cache/apt/ngx-idempotency-newest)
    mkdir -p "$root/var/lib/apt/ngx-idempotency-newest/partial" \
             "$root/var/cache/apt/ngx-idempotency-newest/archives/partial"
    in_root "${apt[@]}" update >/dev/null
    for spec in "${newest[@]}"; do
        IFS=/ read -r kind suite lowest <<< "$spec"
        dir=$newest_dir/$kind-newest
        d=$root/tmp/newest-$kind
        rm -rf "$d" "${root:?}$dir"
        mkdir -p "$d" "$root$dir"
        in_root sh -c "cd /tmp/newest-$kind && ${apt[*]} download \
            $kind-server/$suite $kind-tools/$suite $kind-sentinel/$suite" \
            >/dev/null
        for f in "$d"/*.deb; do
            dpkg-deb -x "$f" "$root$dir"
        done
        rm -rf "$d"
        if in_root ldd "$dir/usr/bin/$kind-check-rdb" | grep -q 'not found'
        then
            in_root ldd "$dir/usr/bin/$kind-check-rdb" >&2
            echo "$me: $kind from $suite lacks a library here" >&2
            return 1
        fi
        ver=$(in_root "$dir/usr/bin/$kind-server" --version |
              sed -n 's/.* v=\([0-9.]*\).*/\1/p')
        if [ "$(printf '%s\n%s\n' "$lowest" "$ver" | sort -V | head -1)" \
             != "$lowest" ]; then
            echo "$me: $kind from $suite is ${ver:-unknown}, not $lowest" \
                 "or later: nothing new to test" >&2
            return 1
        fi
        echo "newest: $kind-server $ver from $suite in $dir"
    done
    rm -rf "$root/var/lib/apt/ngx-idempotency-newest" \
           "$root/var/cache/apt/ngx-idempotency-newest"
}

# the npm libraries the tests install when they are missing, one
# name@version a line, as t/lib/npm_cache.js names them (t/047's Stripe
# library, t/068's Standard Webhooks and Stripe libraries)
npm_libs() {
    node "$top/t/lib/npm_cache.js" list
}

# copy_checkout DIR: the work tree's tracked and untracked non-ignored
# files (deleted ones aside) into DIR, afresh
copy_checkout() {
    rm -rf --one-file-system "$1"
    mkdir -p "$1"
    git -C "$top" ls-files -z -co --exclude-standard |
        (cd "$top" && while IFS= read -r -d '' f; do
             if [ -e "$f" ] || [ -L "$f" ]; then printf '%s\0' "$f"; fi
         done) |
        tar -C "$top" --null -T - -cf - | tar -C "$1" -xf -
}

if [ "${1:-}" = __inside ]; then
    shift
    inside "$@"
    exit $?
fi

# ------------------------------------------------------------- the host

[ "$(id -u)" -eq 0 ] || die "run as root (debootstrap, chroot, unshare)"

# apt_uri SUITE: the URI of this machine's first enabled deb entry that
# lists SUITE
apt_uri() {
    local f
    apt_source_files | while read -r f; do
        case $f in
            *.sources)
                awk -v want="$1" '
                    BEGIN { RS = ""; FS = "\n" }
                    {
                        deb = 0; ok = 0; off = 0; uri = ""
                        for (i = 1; i <= NF; i++) {
                            if ($i ~ /^[ \t]*#/ || $i !~ /:/) continue
                            key = tolower(substr($i, 1, index($i, ":") - 1))
                            val = " " substr($i, index($i, ":") + 1) " "
                            gsub(/[ \t]+/, " ", val)
                            if (key == "types" && val ~ / deb /) deb = 1
                            if (key == "enabled" && tolower(val) ~ / no /)
                                off = 1
                            if (key == "suites" && index(val, " " want " "))
                                ok = 1
                            if (key == "uris") {
                                split(val, u, " ")
                                uri = u[1]
                            }
                        }
                        if (deb && ok && !off && uri != "") {
                            print uri
                            exit
                        }
                    }' "$f"
                ;;
            *)
                awk -v want="$1" "$apt_oneline_awk"'
                    $1 == "deb" {
                        i = uri_field()
                        if ($(i + 1) == want) { print $i; exit }
                    }' "$f"
                ;;
        esac
    done | head -1
}

# the package list the root is built for: the stamp's content
package_list() {
    echo "debootstrap --variant=minbase $release"
    # deps.sh's pkgs=( ... ) array, comments aside
    sed -n '/^pkgs=(/,/)/p' "$top/util/deps.sh" |
        sed 's/#.*//; s/pkgs=(//; s/"\$@")//; s/)//' | tr -s ' \t' '\n' |
        grep -v '^$'
    printf '%s\n' "${valkey_pkgs[@]}" "${extra_pkgs[@]}"
    printf 'newest %s\n' "${newest[@]}"
    npm_libs | sed 's/^/npm /'
}

# mounts_under DIR: mount points at or under DIR, deepest first
mounts_under() {
    awk -v d="$1" '$5 == d || index($5, d "/") == 1 { print $5 }' \
        /proc/self/mountinfo | sort -r
}

# procs_in DIR: processes whose root is DIR
procs_in() {
    local p r
    for p in /proc/[0-9]*; do
        r=$(readlink "$p/root" 2>/dev/null) || continue
        [ "$r" = "$1" ] && echo "${p#/proc/}"
    done
    return 0
}

# the exit trap: nothing of ours stays mounted or running under the roots
cleanup() {
    local d m p
    # a namespace still running (a signal, a failure here): its unshare
    # killed, the kernel kills its PID 1 (--kill-child) and all in it
    if [ -n "$ns_pid" ]; then
        for p in $(pgrep -P "$ns_pid"); do
            kill -9 "$p" 2>/dev/null || true
        done
        kill -9 "$ns_pid" 2>/dev/null || true
        wait "$ns_pid" 2>/dev/null || true
    fi
    for d in "$root" "$root.new" "$root.run"; do
        for p in $(procs_in "$d") $(procs_in "$d/merged"); do
            echo "$me: killing $p, left running in $d" >&2
            kill -9 "$p" 2>/dev/null || true
        done
        for m in $(mounts_under "$d"); do
            echo "$me: unmounting $m" >&2
            umount -l "$m" 2>/dev/null || true
        done
    done
}
ns_pid=
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

# ns DIR [--net] ARGS...: this script's __inside ARGS on the root DIR, in
# new PID and mount namespaces (and a network one with --net), bounded by
# timeout; the namespaces' PID 1 is killed when unshare dies
ns() {
    local dir=$1 net=() limit=$setup_timeout
    shift
    if [ "$1" = --net ]; then
        net=(--net)
        # the run's own timeout comes first (the bench: one per run)
        limit=$((${ns_runs:-1} * run_timeout + 120))
        shift
    fi
    # in the background, so that a signal reaches the traps at once
    TRIXIE_ROOT=$dir TRIXIE_TIMEOUT=$run_timeout \
        timeout -s KILL "$limit" unshare "${net[@]}" --pid --fork \
        --kill-child --mount --propagation private "$self" __inside "$@" &
    ns_pid=$!
    local rc=0
    wait "$ns_pid" || rc=$?
    ns_pid=
    return $rc
}

need() { # need CMD PACKAGE: install PACKAGE when CMD is missing
    command -v "$1" >/dev/null 2>&1 && return 0
    echo "installing $2 on this machine"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq --no-install-recommends "$2" >/dev/null
}

mkdir -p "$out"
setup_log=$out/setup.log
: > "$setup_log"
t_start=$(now)
t_root=0
t_deps=0

stamp=$(package_list)
if [ -z "${TRIXIE_REBUILD:-}" ] && [ -f "$root/$stamp_file" ] &&
   [ "$(cat "$root/$stamp_file")" = "$stamp" ]; then
    echo "== trixie root: $root (cached; its package list is unchanged)"
else
    need debootstrap debootstrap
    host_release=$(. /etc/os-release && echo "${VERSION_CODENAME:-}")
    [ -n "$host_release" ] || die "no VERSION_CODENAME in /etc/os-release"
    mirror=$(apt_uri "$host_release")
    [ -n "$mirror" ] || die "no apt source of this machine lists" \
        "$host_release: nothing to take the mirror from"
    security=$(apt_uri "$host_release-security")

    new=$root.new
    [ -z "$(mounts_under "$new")" ] || die "$new has mounts: refusing"
    [ -z "$(mounts_under "$root")" ] || die "$root has mounts: refusing"
    rm -rf --one-file-system "$new"
    mkdir -p "$(dirname "$root")"
    echo "== trixie root: debootstrap --variant=minbase $release into $new" \
         "(setup log: $setup_log)"
    t0=$(now)
    if ! timeout -k 30 "$setup_timeout" unshare --pid --fork --kill-child \
            --mount --propagation private \
            debootstrap --variant=minbase "$release" "$new" "$mirror" \
            >> "$setup_log" 2>&1; then
        tail -n 30 "$setup_log"
        die "debootstrap failed"
    fi
    t_root=$(($(now) - t0))

    keyring=/usr/share/keyrings/debian-archive-keyring.gpg
    signed=""
    [ ! -f "$new$keyring" ] || signed="Signed-By: $keyring"
    rm -f "$new/etc/apt/sources.list"
    {
        printf 'Types: deb\nURIs: %s\nSuites: %s %s-updates\n' \
            "$mirror" "$release" "$release"
        printf 'Components: main\n%s\n' "$signed"
        if [ -n "$security" ]; then
            printf '\nTypes: deb\nURIs: %s\nSuites: %s-security\n' \
                "$security" "$release"
            printf 'Components: main\n%s\n' "$signed"
        fi
    } > "$new/etc/apt/sources.list.d/debian.sources"
    [ -n "$security" ] ||
        echo "$me: no $host_release-security entry here: no $release-security"
    # the newest servers' suites: a list only newest_setup reads
    for spec in "${newest[@]}"; do
        IFS=/ read -r _ suite _ <<< "$spec"
        printf 'deb [signed-by=%s] %s %s main\n' "$keyring" "$mirror" "$suite"
    done | sort -u > "$new$newest_list"
    cat > "$new/etc/hosts" <<'EOF'
127.0.0.1	localhost
::1		localhost ip6-localhost ip6-loopback
ff02::1		ip6-allnodes
ff02::2		ip6-allrouters
EOF

    echo "== trixie root: util/deps.sh, Valkey, the newest servers, npm" \
         $(npm_libs)
    t0=$(now)
    copy_checkout "$new/build/repo"
    if ! ns "$new" setup >> "$setup_log" 2>&1; then
        tail -n 30 "$setup_log"
        die "setting up the root failed"
    fi
    # the tests' npm libraries, by this machine's npm with its own
    # configuration (registry, CA) into the directory the tests read in
    # the root
    mapfile -t libs < <(npm_libs)
    if [ ${#libs[@]} -gt 0 ]; then
        need npm npm
        mkdir -p "$new/var/cache/ngx-idempotency-npm"
        if ! (cd "$new/var/cache/ngx-idempotency-npm" &&
              timeout 600 npm install --no-audit --no-fund --silent \
                  "${libs[@]}") >> "$setup_log" 2>&1; then
            tail -n 30 "$setup_log"
            die "npm install ${libs[*]} failed"
        fi
    fi
    t_deps=$(($(now) - t0))
    grep -E '^(in the root|newest):' "$setup_log" || true

    rm -rf --one-file-system "$new/build"
    printf '%s\n' "$stamp" > "$new/$stamp_file"
    [ -z "$(mounts_under "$root")" ] || die "$root has mounts: refusing"
    rm -rf --one-file-system "$root"
    mv "$new" "$root"
fi

# ------------------------------------------------------------ the bench

# bench_summary: per run, then per entry of TRIXIE_BENCH_RUNS over every
# round of every repeat: the median module/plain throughput ratio of the
# rounds and the median Redis CPU per request of the module runs
bench_summary() {
    local d
    # the median of a space-separated list, for both tables
    local median='
        function median(list,   a, n, i, j, t) {
            n = split(list, a, " ")
            for (i = 2; i <= n; i++)
                for (j = i; j > 1 && a[j] + 0 < a[j - 1] + 0; j--) {
                    t = a[j]; a[j] = a[j - 1]; a[j - 1] = t
                }
            return n % 2 ? a[(n + 1) / 2] : (a[n / 2] + a[n / 2 + 1]) / 2
        }'
    echo "== make bench-trixie: Debian 13 ($release), nginx" \
         "$(chroot "$root" nginx -v 2>&1 | sed 's/.*nginx\///'), $(nproc) cores"
    echo "   ratio = module/plain r/s (median of the rounds); redis = us of" \
         "server CPU per module request (median)"
    for d in "$out"/bench/*/; do
        [ -f "$d/runs.tsv" ] || continue
        awk -F'\t' -v run="$(basename "$d")" \
            -v ver="$(awk '{ print $1, $3 }' "$d/server.txt" 2>/dev/null)" \
            "$median"'
        NR > 1 {
            k = $1; if (!(k in seen)) { seen[k] = 1; order[++nk] = k }
            rps[k, $3, $4] = $7
            if ($4 == "module") rd[k] = rd[k] " " $11
            if ($3 > rounds[k]) rounds[k] = $3
            if ($18 != 1) bad++
        }
        END {
            printf "%-22s %-14s", run, ver
            for (i = 1; i <= nk; i++) {
                k = order[i]; r = ""
                for (j = 1; j <= rounds[k]; j++)
                    if (rps[k, j, "plain"] > 0)
                        r = r " " rps[k, j, "module"] / rps[k, j, "plain"]
                printf "  %s %.2f (redis %.1f)", k, median(r), median(rd[k])
            }
            printf "%s\n", bad ? "  CHECKS FAILED" : ""
        }' "$d/runs.tsv"
    done
    echo
    echo "   per entry, over every round of every repeat: ratio [each round]," \
         "redis us/req"
    local spec
    for spec in $bench_runs; do
        awk -F'\t' -v spec="$spec" "$median"'
        FNR == 1 { f++; next }
        {
            k = $1; if (!(k in seen)) { seen[k] = 1; order[++nk] = k }
            rps[k, f, $3, $4] = $7
            if ($4 == "module") rd[k] = rd[k] " " $11
            if ($3 > rounds[k, f]) rounds[k, f] = $3
        }
        END {
            for (i = 1; i <= nk; i++) {
                k = order[i]; r = ""; each = ""
                for (g = 1; g <= f; g++)
                    for (j = 1; j <= rounds[k, g]; j++)
                        if (rps[k, g, j, "plain"] > 0) {
                            x = rps[k, g, j, "module"] / rps[k, g, j, "plain"]
                            r = r " " x; each = each sprintf(" %.2f", x)
                        }
                printf "   %-15s %-13s %5.2f [%s ]  redis %6.1f\n", spec, k,
                    median(r), each, median(rd[k])
            }
        }' "$out"/bench/*-"${spec%%:*}"-"${spec#*:}"/runs.tsv
    done
}

if [ "$mode" = bench ]; then
    specs=()
    for ((i = 1; i <= bench_repeat; i++)); do
        for spec in $bench_runs; do
            case $spec in
                redis:scripts|valkey:scripts|valkey:native|redis:native) ;;
                redis-newest:*|valkey-newest:*) ;;
                *) die "TRIXIE_BENCH_RUNS: $spec is not SERVER:PATH" \
                       "(redis, valkey, redis-newest or valkey-newest;" \
                       "scripts or native)" ;;
            esac
            specs+=("$(( ${#specs[@]} + 1 )):$spec")
        done
    done
    log=$out/bench.log
    echo "== trixie bench: ${specs[*]} (log: $log)"
    mkdir -p "$root.run"
    ns_runs=$((${#specs[@]} + 1))
    rc=0
    # in this shell (not a pipeline's), so that the exit trap knows ns_pid
    ns "$root" --net bench "${specs[@]}" > >(tee "$log") 2>&1 || rc=$?
    left=$(procs_in "$root"; procs_in "$root.run/merged")
    [ -z "$left" ] || { echo "$me: processes left in the root: $left" >&2; rc=1; }
    echo
    bench_summary | tee "$out/bench-summary.txt"
    echo "   total: $(($(now) - t_start)) s"
    [ "$rc" -eq 0 ] || echo "$me: a bench run failed (exit $rc): see $log"
    exit "$rc"
fi

# ------------------------------------------------------------- the runs

declare -A result summary took
failed=0
for server in $servers; do
    case $server in
        redis|valkey|redis-newest|valkey-newest) ;;
        *) die "TRIXIE_SERVERS: unknown server $server (redis, valkey," \
               "redis-newest, valkey-newest)" ;;
    esac
    run_files=${TEST_FILES:-}
    # TEST_FILES, when given, is every run's
    [ -n "$run_files" ] || [[ " $whole " == *" $server "* ]] ||
        [ "$server_files" = all ] || run_files=$server_files
    log=$out/test-$server.log
    echo "== trixie, $server: make test (log: $log)"
    mkdir -p "$root.run"
    t0=$(now)
    rc=0
    TEST_FILES=$run_files ns "$root" --net run "$server" > "$log" 2>&1 ||
        rc=$?
    took[$server]=$(($(now) - t0))
    left=$(procs_in "$root"; procs_in "$root.run/merged")
    [ -z "$left" ] || { echo "$me: processes left in the root: $left" >&2; rc=1; }
    files=$(grep -E '^Files=[0-9]+, Tests=[0-9]+' "$log" | tail -1 || true)
    res=$(grep -E '^Result: ' "$log" | tail -1 || true)
    pkg=$(grep -E '^t/016-package\.t' "$log" | tail -1 || true)
    # its TAP tells the package test ran rather than skipped
    deb=$(grep -hE '^ok [0-9]+ - deb-test ran its checks' \
              "$out/tap-$server/t/016-package.t" 2>/dev/null || true)
    [ -z "$deb" ] || pkg="$pkg (${deb#ok * - })"
    [ "$rc" -ne 124 ] && [ "$rc" -ne 137 ] ||
        res="TIMEOUT after ${run_timeout} s${res:+ ($res)}"
    # the whole suite includes make deb and the package test: t/016
    # skipped or missing is a failure of the run, not a pass
    if [ -z "$run_files" ] && [ "$rc" -eq 0 ] &&
       { ! [[ $pkg =~ \.\ ok ]] || [ -z "$deb" ]; }; then
        echo "$me: t/016 (make deb, the package test) did not pass: $pkg"
        rc=1
    fi
    # a newest server is there for its native commands: t/053 skipped
    # (the server without them after all) is a failure too
    if [[ $server == *-newest ]] && [ "$rc" -eq 0 ] &&
       { [ -z "$run_files" ] ||
         [[ " $run_files " == *" t/053-native-cas.t "* ]]; } &&
       ! grep -qE '^ok [0-9]+ - ' \
           "$out/tap-$server/t/053-native-cas.t" 2>/dev/null; then
        echo "$me: t/053 (native compare-and-set) did not run on $server"
        rc=1
    fi
    if [ "$rc" -eq 0 ]; then
        result[$server]=PASS
    else
        result[$server]="FAIL (exit $rc)"
        failed=1
        echo "---- the last 60 lines of $log"
        tail -n 60 "$log"
        echo "----"
    fi
    summary[$server]="${files:-no Files= line}; ${res:-no Result: line}; ${pkg:-t/016 did not run}"
done

echo
echo "== make test-trixie: Debian 13 ($release) summary"
[ "$t_root" -eq 0 ] || echo "   root: debootstrap ${t_root} s, deps ${t_deps} s"
for server in $servers; do
    [ -n "${result[$server]:-}" ] || continue
    case $server in
        redis) ver=$(chroot "$root" redis-server --version | awk '{print $3}') ;;
        valkey) ver=$(chroot "$root" valkey-server --version | awk '{print $3}') ;;
        *-newest)
            ver=$(chroot "$root" \
                      "$newest_dir/$server/usr/bin/${server%-newest}-server" \
                      --version | awk '{print $3}') ;;
    esac
    echo "   $server-server ${ver#v=}: ${result[$server]} in ${took[$server]} s"
    echo "      ${summary[$server]}"
done
echo "   total: $(($(now) - t_start)) s"
exit $failed
