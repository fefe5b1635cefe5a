#!/usr/bin/env bash
# Runs the whole suite against a private Redis with the module at $1.
# Uses CPAN's Test::Nginx when installed, else the bundled t/compat one.
set -euo pipefail

module=$(cd "$(dirname "$1")" && pwd)/$(basename "$1")
top=$(cd "$(dirname "$0")/.." && pwd)
cd "$top"

export TEST_NGINX_REDIS_PORT=${TEST_NGINX_REDIS_PORT:-16379}
# the server, Sentinel and client of util/redis.sh, util/topology.sh and
# the tests: valkey-server, valkey-sentinel and valkey-cli for Valkey
export REDIS_SERVER=${REDIS_SERVER:-redis-server}
export REDIS_SENTINEL=${REDIS_SENTINEL:-$REDIS_SERVER}
export REDIS_CLI=${REDIS_CLI:-redis-cli}
export TEST_NGINX_REDIS_CLI=$REDIS_CLI
export TEST_NGINX_REDIS_SOCKET=/tmp/ngx-idempotency-redis-$TEST_NGINX_REDIS_PORT/redis.sock
export TEST_NGINX_BINARY=${TEST_NGINX_BINARY:-/usr/sbin/nginx}
export TEST_NGINX_MODULE=$module
# the echo and perl modules the tests load, built for TEST_NGINX_BINARY:
# Debian's packages for its nginx, build/forks/NAME/modules for a server
# that util/forks.sh built
modules_dir=${TEST_NGINX_MODULES_DIR:-/usr/lib/nginx/modules}
export TEST_NGINX_PERL_MODULE=$modules_dir/ngx_http_perl_module.so
export TEST_NGINX_LOAD_MODULES="$module $modules_dir/ngx_http_echo_module.so"
export TEST_NGINX_SERVROOT=${TEST_NGINX_SERVROOT:-$top/t/servroot}

asan_dir=${TEST_ASAN_DIR:-/tmp/ngx-idempotency-asan}
if [ -n "${TEST_ASAN:-}" ]; then
    # the stock nginx is not instrumented: preload the runtime; its own
    # leaks at exit are nginx's (pools freed by the OS), not ours
    rm -rf "$asan_dir"; mkdir -p "$asan_dir"
    chmod 1777 "$asan_dir"        # workers run as nobody
    export TEST_NGINX_BINARY=$top/util/nginx-asan.sh
    export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1:fast_unwind_on_malloc=0:log_path=$asan_dir/asan}
fi

inc=()
perl -MTest::Nginx::Socket -e1 2>/dev/null || inc=(-I "$top/t/compat")

./util/redis.sh start "$TEST_NGINX_REDIS_PORT"
trap './util/redis.sh stop "$TEST_NGINX_REDIS_PORT"' EXIT

rc=0
prove "${inc[@]}" ${TEST_FILES:-t/*.t t/compat/selftest/*.t} || rc=$?

if [ -n "${TEST_ASAN:-}" ]; then
    # every error counts; a leak counts when the module, hiredis or
    # libcrypto allocated it: nginx itself leaves its cycle to the OS
    if ! ./util/asan-report.pl "$asan_dir"; then
        rc=1
    fi
fi

exit $rc
