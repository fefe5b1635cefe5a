#!/usr/bin/env bash
# make deb-test: builds the package (util/deb.sh into $1), installs it on
# this machine with apt-get, checks the stock nginx loads it (nginx -t),
# smoke-tests the installed .so in a private nginx against a Redis (a POST,
# its replay, a 422), then purges the package and checks nothing is left.
#
# Prints one "ok - ..." or "not ok - ..." line per check (t/016-package.t
# turns them into tests). Exits 0 when all passed, 1 when one failed, 2
# (after "skip: <reason>") when it cannot run here: not root, not Debian,
# no dpkg-buildpackage/dh_nginx, the stock "nginx -t" already failing, or
# the package or its files already on the machine: it never removes what
# it did not install.
#
# The system nginx is left alone: policy-rc.d forbids the service actions
# that the package's nginx-reload trigger would run (invoke-rc.d honours it
# with systemd and with plain init scripts alike), and the master and
# worker pids are compared before and after.
#
# Ports: DEB_TEST_PORT (private nginx; TEST_NGINX_PORT, else 1984),
# DEB_TEST_REDIS_PORT (TEST_NGINX_REDIS_PORT, else 16379). A Redis already
# answering there is used as it is; else util/redis.sh starts one and stops
# it at the end.
set -uo pipefail

top=$(cd "$(dirname "$0")/.." && pwd)
out=${1:-$top/build/deb}
port=${DEB_TEST_PORT:-${TEST_NGINX_PORT:-1984}}
redis_port=${DEB_TEST_REDIS_PORT:-${TEST_NGINX_REDIS_PORT:-16379}}

pkg=libnginx-mod-http-idempotency
so=/usr/lib/nginx/modules/ngx_http_idempotency_module.so
snippet=/usr/share/nginx/modules-available/mod-http-idempotency.conf
link=/etc/nginx/modules-enabled/50-mod-http-idempotency.conf
abi_file=/usr/share/nginx/src/debian/libnginx-mod.abisubstvars

cd "$top"

failed=0
checks=0

# "nginx -t" creates an empty pid file; leave none where none was
had_pidfile=0
[ -e /run/nginx.pid ] && had_pidfile=1

ok() {          # ok <0|1> <description>
    checks=$((checks + 1))
    if [ "$1" -eq 0 ]; then
        echo "ok - $2"
    else
        echo "not ok - $2"
        failed=$((failed + 1))
    fi
}

check() {       # check <description> <command...>
    local what=$1
    shift
    "$@" >/dev/null 2>&1
    ok $? "$what"
}

skip() {
    echo "skip: $*"
    exit 2
}

# ---- can it run here?

[ "$(id -u)" -eq 0 ] || skip "not root (apt-get install needs it)"
[ -f /etc/debian_version ] || skip "not Debian"
for t in dpkg-buildpackage dh_nginx apt-get nginx "${REDIS_SERVER:-redis-server}" \
         curl; do
    command -v "$t" >/dev/null 2>&1 || skip "$t is not installed (make deps)"
done
[ -f "$abi_file" ] || skip "$abi_file missing (nginx-dev)"

status=$(dpkg-query -W -f='${db:Status-Status}' "$pkg" 2>/dev/null)
case $status in
    ""|not-installed) ;;
    *) skip "$pkg is already on this machine ($status): not touching it" ;;
esac
for f in "$so" "$snippet" "$link" "$link.removed"; do
    [ -e "$f" ] || [ -L "$f" ] \
        && skip "$f already exists: installed by hand? not touching it"
done

drop_pidfile() {
    if [ $had_pidfile -eq 0 ] && [ -f /run/nginx.pid ] \
       && [ ! -s /run/nginx.pid ]
    then
        rm -f /run/nginx.pid
    fi
}

if ! nginx -t -q >/dev/null 2>&1; then
    drop_pidfile
    skip "the stock nginx -t fails before installing anything"
fi

# ---- state to restore, and the clean-up

work=$(mktemp -d /tmp/ngx-idempotency-deb-test.XXXXXX)
installed=0
made_policy=0
started_redis=0
private=

cleanup() {
    if [ -n "$private" ] && [ -f "$private/logs/nginx.pid" ]; then
        nginx -p "$private/" -c conf/nginx.conf -s stop 2>/dev/null
        sleep 0.3
    fi
    if [ $installed -eq 1 ] && dpkg-query -W -f='${db:Status-Status}' "$pkg" \
                                   2>/dev/null | grep -qv not-installed
    then
        echo "# purging $pkg after a failure"
        apt-get remove --purge -y -q -o DPkg::Lock::Timeout=300 "$pkg" \
            >/dev/null 2>&1
    fi
    [ $started_redis -eq 1 ] && ./util/redis.sh stop "$redis_port"
    [ $made_policy -eq 1 ] && rm -f /usr/sbin/policy-rc.d
    drop_pidfile
    rm -rf "$work"
}
trap cleanup EXIT

# the system nginx: "master-pid:worker-pids", or "none"
system_nginx() {
    local pid
    pid=$(cat /run/nginx.pid 2>/dev/null)
    if [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null; then
        echo "$pid:$(pgrep -P "$pid" | sort | tr '\n' ' ')"
    else
        echo none
    fi
}

before=$(system_nginx)

# ---- build

if ! ./util/deb.sh "$out" > "$work/deb.log" 2>&1; then
    sed 's/^/# /' "$work/deb.log"
    ok 1 "make deb builds the package"
    exit 1
fi
deb=$(tail -1 "$work/deb.log")
ok 0 "make deb builds the package; its last line is the .deb"
grep -q '^E: ' "$work/deb.log"
ok $((1 - $?)) "lintian reports no errors"
grep -E '^[WE]: ' "$work/deb.log" | sed 's/^/# lintian: /'

# ---- install

if [ ! -e /usr/sbin/policy-rc.d ]; then
    printf '#!/bin/sh\nexit 101\n' > /usr/sbin/policy-rc.d
    chmod +x /usr/sbin/policy-rc.d
    made_policy=1
fi

installed=1
DEBIAN_FRONTEND=noninteractive apt-get install -y -q \
    -o DPkg::Lock::Timeout=300 --no-install-recommends "$deb" \
    > "$work/install.log" 2>&1
rc=$?
[ $rc -eq 0 ] || sed 's/^/# /' "$work/install.log"
ok $rc "apt-get install $(basename "$deb")"
[ $rc -eq 0 ] || exit 1

check "dpkg says it is installed" \
    test "$(dpkg-query -W -f='${db:Status-Status}' "$pkg")" = installed

depends=$(dpkg-query -W -f='${Depends}' "$pkg")
abi=$(sed -n 's/^nginx:abi=//p' "$abi_file")
echo "# Depends: $depends"
check "Depends on the exact nginx ABI ($abi)" \
    grep -qE "(^|, )$abi(,|$)" <<< "$depends"

# the runtime package is what this machine has (libhiredis0.14 on Debian
# 12, libhiredis1.1.0 on 13, libssl3 or libssl3t64): the one that owns the
# library the installed module resolves
for lib in libhiredis libssl; do
    path=$(ldd "$so" 2>/dev/null \
           | awk -v l="$lib" 'index($1, l ".so") == 1 { print $3; exit }')
    owner=
    [ -z "$path" ] || owner=$(dpkg -S "$(readlink -f "$path")" 2>/dev/null \
                              | sed -n '1s/:.*//p')
    if [ -n "$owner" ]; then
        check "Depends on $owner" \
            grep -qE "(^|, )${owner//./\\.}( |,|\$)" <<< "$depends"
    else
        ok 1 "Depends on the package of $lib (dpkg -S names none)"
    fi
done

check "the module is in /usr/lib/nginx/modules" test -f "$so"
check "its libraries all resolve" \
    bash -c "ldd '$so' | grep -q libhiredis \
             && ! ldd '$so' | grep -q 'not found'"
check "it is stripped (symbols are in -dbgsym)" \
    bash -c "! readelf -S '$so' | grep -q '\.symtab'"
check "modules-available has the load_module snippet" \
    grep -qx 'load_module modules/ngx_http_idempotency_module.so;' "$snippet"
check "modules-enabled links to it" \
    test "$(readlink "$link")" = "$snippet"

# the stock layout: nginx.conf includes modules-enabled/*.conf
nginx -t -g 'error_log stderr notice;' > "$work/t.log" 2>&1
rc=$?
[ $rc -eq 0 ] || sed 's/^/# /' "$work/t.log"
ok $rc "nginx -t on the stock configuration, module enabled"
version=$(./util/version-check.sh)
check "the stock nginx loaded it: the $version notice" \
    grep -q "idempotency module $version (hiredis" "$work/t.log"

# ---- smoke test: a private nginx with the installed .so

if "${REDIS_CLI:-redis-cli}" -p "$redis_port" ping 2>/dev/null |
       grep -q PONG; then
    echo "# using the Redis on port $redis_port"
else
    ./util/redis.sh start "$redis_port" >/dev/null && started_redis=1
fi

private=$work/nginx
mkdir -p "$private/logs" "$private/conf"
cat > "$private/conf/nginx.conf" <<EOF
load_module $so;
worker_processes 1;
error_log logs/error.log notice;
pid logs/nginx.pid;
events {}
http {
    access_log off;
    client_body_temp_path $private/body;
    proxy_temp_path $private/proxy;
    fastcgi_temp_path $private/fastcgi;
    uwsgi_temp_path $private/uwsgi;
    scgi_temp_path $private/scgi;
    idempotency_redis 127.0.0.1:$redis_port;
    server {
        listen 127.0.0.1:$port;
        location = /pay {
            idempotency on;
            proxy_pass http://127.0.0.1:$port/backend;
        }
        location = /backend {
            return 201 "charged \$request_id\n";
        }
    }
}
EOF

nginx -p "$private/" -c conf/nginx.conf > "$work/start.log" 2>&1
rc=$?
[ $rc -eq 0 ] || sed 's/^/# /' "$work/start.log"
ok $rc "a private nginx on port $port starts with the installed module"

key="deb-test-$$-$(date +%s%N)"
post() {        # post <name> <body>: status on stdout, body and headers kept
    curl -s -o "$work/$1.body" -D "$work/$1.head" -w '%{http_code}' \
        -X POST -H "Idempotency-Key: $key" --data-binary "$2" \
        "http://127.0.0.1:$port/pay"
}

first=$(post first 'amount=100')
check "a first POST runs: 201" test "$first" = 201
again=$(post again 'amount=100')
check "its retry is replayed: 201" test "$again" = 201
check "  with the first body" cmp -s "$work/first.body" "$work/again.body"
check "  and Idempotent-Replayed: true" \
    grep -qi '^Idempotent-Replayed: true' "$work/again.head"
other=$(post other 'amount=999')
check "the same key with another body: 422" test "$other" = 422
check "  as application/problem+json" \
    grep -qi '^Content-Type: application/problem+json' "$work/other.head"
check "the private nginx logged the version" \
    grep -q "idempotency module $version" "$private/logs/error.log"
check "and no alert, crit or emerg" \
    bash -c "! grep -E '\[(alert|crit|emerg)\]' '$private/logs/error.log'"

nginx -p "$private/" -c conf/nginx.conf -s stop >/dev/null 2>&1
for _ in $(seq 50); do
    [ -f "$private/logs/nginx.pid" ] || break
    sleep 0.1
done
private=

# ---- remove and purge

dpkg -L "$pkg" > "$work/files"
echo "# dpkg -L: $(wc -l < "$work/files") paths"
DEBIAN_FRONTEND=noninteractive apt-get remove --purge -y -q \
    -o DPkg::Lock::Timeout=300 "$pkg" > "$work/remove.log" 2>&1
rc=$?
[ $rc -eq 0 ] || sed 's/^/# /' "$work/remove.log"
ok $rc "apt-get remove --purge $pkg"
[ $rc -eq 0 ] && installed=0

status=$(dpkg-query -W -f='${db:Status-Status}' "$pkg" 2>/dev/null)
check "dpkg no longer knows it (not even its config files)" \
    test -z "$status" -o "$status" = not-installed

left=()
while read -r f; do
    [ -d "$f" ] && continue
    [ -e "$f" ] || [ -L "$f" ] && left+=("$f")
done < "$work/files"
ok ${#left[@]} "every file it installed is gone"
[ ${#left[@]} -eq 0 ] || printf '# left: %s\n' "${left[@]}"

# its own directories go too; shared ones belong to other packages
orphans=()
while read -r f; do
    [ -d "$f" ] && [ "$f" != /. ] || continue
    dpkg -S "$f" >/dev/null 2>&1 || orphans+=("$f")
done < "$work/files"
ok ${#orphans[@]} "no directory of its own is left"
[ ${#orphans[@]} -eq 0 ] || printf '# left: %s\n' "${orphans[@]}"

check "the modules-enabled link is gone" \
    bash -c "[ ! -e '$link' ] && [ ! -L '$link' ] && [ ! -L '$link.removed' ]"
check "nginx -t on the stock configuration still passes" nginx -t -q

drop_pidfile
check "no /run/nginx.pid left where there was none" \
    test $had_pidfile -eq 1 -o ! -e /run/nginx.pid

after=$(system_nginx)
check "the system nginx was not started, restarted or reloaded ($before)" \
    test "$before" = "$after"

echo "# deb-test: $checks checks, $failed failed"
[ $failed -eq 0 ]
