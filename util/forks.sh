#!/usr/bin/env bash
# util/forks.sh build NAME...       build each server of the release tarballs
#                                   into build/forks/NAME (below)
# util/forks.sh test NAME...        build, then run the suite against each
#                                   (FORKS_FILES or TEST_FILES: some files)
# util/forks.sh env NAME            print the variables that point
#                                   util/test.sh at that server
# util/forks.sh module-for BINARY TREE OUT
#                                   build the module with exactly the
#                                   configure flags BINARY -V prints, against
#                                   TREE (its release tarball or an unpacked
#                                   tree), into OUT: how a module is made for
#                                   a vendor's package built without
#                                   --with-compat (Angie's)
#
# NAME is nginx, freenginx, angie or tengine; FORKS_DIR (default:
# ../shared/forks beside the repository) holds their release tarballs,
# NAME-VERSION.tar.gz.  Each server is built from its own tree with the
# modules the suite loads or configures (SSL, HTTP/2, gRPC, realip,
# auth_request, sub, stub_status, debug logging, perl as a dynamic module)
# and installed under build/forks/NAME:
#
#   sbin/nginx, sbin/angie or sbin/tengine   the server
#   modules/   this module, the echo module (Debian's libnginx-mod-http-echo
#              source, fetched with apt-get source) and the perl module,
#              each built for this server
#   src/       the unpacked tree, configured; a later build only rebuilds
#              the modules, so a change to src/ costs seconds
#
# FORKS_BUILD (default build/forks) is where the servers are kept: a
# directory outside the clone keeps them across CI runs, and a new clone
# only configures them again and rebuilds the modules (about a minute
# each).  FORKS_JOBS (2) is make's -j.  Everything else stays under build/:
# nothing of a server's tree enters the repository.
set -euo pipefail

top=$(cd "$(dirname "$0")/.." && pwd)
forks_dir=${FORKS_DIR:-$top/../shared/forks}
out=${FORKS_BUILD:-$top/build/forks}
jobs=${FORKS_JOBS:-2}

die() { echo "forks.sh: $*" >&2; exit 1; }

# The echo module is not in any server's tree: take Debian's source package
# (the one libnginx-mod-http-echo is built from) through a private apt
# configuration, so the machine's sources.list is left as it is
echo_src() {
    local apt=$top/build/apt src
    src=$(find "$apt/src" -maxdepth 1 -type d -name 'libnginx-mod-http-echo-*' \
          2>/dev/null | head -1)
    if [ -z "$src" ]; then
        mkdir -p "$apt/lists/partial" "$apt/cache/archives/partial" "$apt/src"
        echo "deb-src [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg]" \
             "http://deb.debian.org/debian bookworm main" > "$apt/sources.list"
        local o=(-o "Dir::Etc::SourceList=$apt/sources.list"
                 -o "Dir::Etc::SourceParts=/dev/null"
                 -o "Dir::State::Lists=$apt/lists"
                 -o "Dir::Cache=$apt/cache")
        apt-get "${o[@]}" -qq update >&2
        (cd "$apt/src" && apt-get "${o[@]}" -qq source libnginx-mod-http-echo \
            >&2 2>/dev/null)
        src=$(find "$apt/src" -maxdepth 1 -type d \
              -name 'libnginx-mod-http-echo-*' | head -1)
        [ -n "$src" ] || die "apt-get source libnginx-mod-http-echo failed"
    fi
    echo "$src"
}

tarball() {
    local t
    t=$(find "$forks_dir" -maxdepth 1 -name "$1-[0-9]*.tar.gz" | sort -V | tail -1)
    [ -n "$t" ] || die "no $1-*.tar.gz in $forks_dir (set FORKS_DIR)"
    echo "$t"
}

# the binary each vendor installs
binary_name() {
    case $1 in
    angie)   echo angie ;;
    tengine) echo tengine ;;
    *)       echo nginx ;;
    esac
}

# What the suite needs of every server.  The paths keep the install inside
# its prefix, perl's nginx.pm beside it (configure compiles the path in);
# the default logs are absolute, as in every vendor's package (Debian's
# error log is stderr), so that "nginx -t -p DIR" of a configuration
# without log directives finds them
common_flags() {
    local prefix=$1
    echo "--prefix=$prefix --sbin-path=$prefix/sbin/$(binary_name "$2")"
    echo "--modules-path=$prefix/modules --with-perl_modules_path=$prefix/perl"
    echo "--error-log-path=stderr --http-log-path=$prefix/logs/access.log"
    echo "--with-debug --with-threads --with-pcre-jit"
    echo "--with-http_ssl_module --with-http_v2_module --with-http_realip_module"
    echo "--with-http_auth_request_module --with-http_stub_status_module"
    echo "--with-http_sub_module --with-http_gunzip_module"
    echo "--with-http_perl_module=dynamic"
}

# The flags of each vendor's own packages, as far as this machine can
# build them
vendor_flags() {
    local tree=$2
    case $1 in
    nginx|freenginx)
        # nginx.org's and freenginx's packages are built --with-compat
        echo "--with-compat" ;;
    angie)
        # Angie's packages are built without --with-compat: a module is
        # built with the flags of angie -V, for each release
        echo "--with-stream --with-stream_ssl_module --with-http_v3_module" ;;
    tengine)
        # the vendor's own list (packages/build/configure-args.sh) less its
        # paths and user, which common_flags sets, and less Tongsuo, xquic
        # and LuaJIT, which no Debian package provides
        TENGINE_WITH_TONGSUO=no TENGINE_WITH_XQUIC=no TENGINE_WITH_LUA=no \
            sh "$tree/packages/build/configure-args.sh" \
            | grep -vE '^--(prefix|sbin-path|modules-path|conf-path|error-log-path|http-log-path|pid-path|lock-path|http-[a-z-]+-temp-path|user|group)=' ;;
    esac
}

configure_in() {
    # release tarballs have ./configure, git snapshots only auto/configure
    if [ -x ./configure ]; then ./configure "$@"; else ./auto/configure "$@"; fi
}

build_one() {
    local name=$1 prefix=$out/$1 t flags start so
    t=$(tarball "$name")
    start=$(date +%s)

    # a full build when the server is missing, or its tarball or flags
    # changed; else only the modules (a change to this module's sources),
    # configured again first if this repository moved (a CI clone using
    # servers kept in FORKS_BUILD)
    flags=
    [ -d "$prefix/src" ] && flags=$(server_flags "$name" "$prefix")
    if [ ! -x "$prefix/sbin/$(binary_name "$name")" ] \
        || [ "$t" -nt "$prefix/flags" ] \
        || [ "$flags" != "$(cat "$prefix/flags" 2>/dev/null)" ]
    then
        rm -rf "$prefix"
        mkdir -p "$prefix/src"
        tar -xzf "$t" -C "$prefix/src" --strip-components=1
        copy_echo "$prefix"
        flags=$(server_flags "$name" "$prefix")
        configure_server "$prefix" "$flags"
        (cd "$prefix/src" && make -j"$jobs" -f objs/Makefile \
            && make -f objs/Makefile install) > "$prefix/make.log" 2>&1 \
            || { grep -E '(error|warning):' "$prefix/make.log" | head -20 >&2
                 tail -5 "$prefix/make.log" >&2; die "$name: build failed"; }
        echo "$flags" > "$prefix/flags"
    else
        [ "$top" = "$(cat "$prefix/top" 2>/dev/null)" ] || configure_server "$prefix" "$flags"
        (cd "$prefix/src" && make -j"$jobs" -f objs/Makefile modules) \
            > "$prefix/make.log" 2>&1 \
            || { grep -E '(error|warning):' "$prefix/make.log" | head -20 >&2
                 die "$name: module build failed"; }
    fi

    # a new inode, not an overwrite: a running server keeps the old one
    for so in "$prefix"/src/objs/*.so; do
        cp "$so" "$prefix/modules/.tmp.so"
        mv -f "$prefix/modules/.tmp.so" "$prefix/modules/$(basename "$so")"
    done
    echo "built $name in $(( $(date +%s) - start ))s:" \
         "$("$prefix/sbin/$(binary_name "$name")" -v 2>&1 | tr '\n' ' ')"
}

configure_server() {
    local prefix=$1 flags=$2
    # shellcheck disable=SC2086
    (cd "$prefix/src" && configure_in $flags --with-cc-opt="-g -O2" \
        --add-dynamic-module="$prefix/echo" --add-dynamic-module="$top") \
        > "$prefix/configure.log" 2>&1 \
        || { tail -20 "$prefix/configure.log" >&2; die "configure failed"; }
    echo "$top" > "$prefix/top"
}

server_flags() {
    echo $(common_flags "$2" "$1") $(vendor_flags "$1" "$2/src")
}

# each server gets its own copy of the echo module's source
copy_echo() {
    local echo=$1/echo
    cp -r "$(echo_src)" "$echo"
    # freenginx keeps a request's start as a monotonic start_time only;
    # echo 0.63 reads r->start_sec for $echo_timer_elapsed (no test uses
    # it): there its timer starts at its first use instead
    if ! grep -q 'start_sec;' "$1/src/src/http/ngx_http_request.h"; then
        sed -i 's/r->start_sec/ngx_time()/;
                s/(ngx_msec_t) r->start_msec/(ngx_timeofday())->msec/' \
            "$echo/src/ngx_http_echo_timer.c"
    fi
}

env_of() {
    local prefix=$out/$1
    [ -x "$prefix/sbin/$(binary_name "$1")" ] || die "$1 is not built: util/forks.sh build $1"
    echo "TEST_NGINX_BINARY=$prefix/sbin/$(binary_name "$1")"
    echo "TEST_NGINX_MODULES_DIR=$prefix/modules"
}

module_for() {
    local bin=$1 tree=$2 dest=$3 scratch args
    mkdir -p "$top/build"
    scratch=$(mktemp -d "$top/build/module-for.XXXXXX")
    trap 'rm -rf "$scratch"' RETURN
    if [ -f "$tree" ]; then
        tar -xzf "$tree" -C "$scratch" --strip-components=1
    else
        cp -r "$tree/." "$scratch"
    fi
    # -V prints the arguments quoted as the shell would take them; the
    # other dynamic modules it was built with are left out (a module's
    # signature does not depend on them), static ones stay
    args=$("$bin" -V 2>&1 | sed -n 's/^configure arguments: //p')
    eval "set -- $args"
    local a keep=()
    for a in "$@"; do
        case $a in --add-dynamic-module=*) ;; *) keep+=("$a") ;; esac
    done
    (cd "$scratch" && configure_in "${keep[@]}" --add-dynamic-module="$top" \
        && make -f objs/Makefile modules) > "$scratch.log" 2>&1 \
        || { tail -20 "$scratch.log" >&2; rm -f "$scratch.log"; die "module-for failed"; }
    mkdir -p "$dest"
    cp "$scratch/objs/ngx_http_idempotency_module.so" "$dest/"
    rm -f "$scratch.log"
    echo "built $dest/ngx_http_idempotency_module.so with the flags of $bin -V"
}

# the suite against each server, one after the other; FORKS_FILES (else
# TEST_FILES, else the whole suite) picks the files
test_forks() {
    local name rc=0 start line summary=()
    for name in "$@"; do
        build_one "$name"
        start=$(date +%s)
        line=ok
        # shellcheck disable=SC2046
        env $(env_of "$name") TEST_FILES="${FORKS_FILES:-${TEST_FILES:-}}" \
            "$top/util/test.sh" "$out/$name/modules/ngx_http_idempotency_module.so" \
            || { line=FAILED; rc=1; }
        summary+=("$name: $line in $(( $(date +%s) - start ))s")
    done
    printf '%s\n' "${summary[@]}"
    return $rc
}

cmd=${1:-}
shift || true
case $cmd in
build)      [ $# -gt 0 ] || set -- nginx freenginx angie tengine
            for n in "$@"; do build_one "$n"; done ;;
env)        env_of "${1:?NAME}" ;;
test)       [ $# -gt 0 ] || set -- nginx freenginx angie tengine
            test_forks "$@" ;;
module-for) module_for "${1:?BINARY}" "${2:?TREE}" "${3:?OUT}" ;;
*)          sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 2 ;;
esac
