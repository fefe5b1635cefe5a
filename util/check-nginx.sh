#!/usr/bin/env bash
# Builds the module against the nginx source tree at $1 (a release tarball
# or a git checkout) with warnings as errors, once per configure set that
# changes what the module sees: the compat ABI with SSL and HTTP/2, the
# same with stream, threads and HTTP/3, and a minimal nginx without SSL
# or the compat ABI (the module's TLS to Redis is then compiled out).
# Prints one line per configuration, with its flags; exits non-zero if
# any fails.
set -euo pipefail

src=${1:?usage: check-nginx.sh NGINX_SOURCE_TREE_OR_TARBALL}
top=$(cd "$(dirname "$0")/.." && pwd)

# configure writes objs/ and a Makefile into the tree: build in a copy,
# in this repository's build/ (ignored by git), never in the tree itself
mkdir -p "$top/build"
scratch=$(mktemp -d "$top/build/check-nginx.XXXXXX")
trap 'rm -rf "$scratch"' EXIT

# a release tarball (nginx, freenginx, Angie, Tengine) is unpacked there
if [ -f "$src" ]; then
    mkdir "$scratch/tree"
    tar -xzf "$src" -C "$scratch/tree"
    src=$(find "$scratch/tree" -mindepth 1 -maxdepth 1 -type d | head -1)
fi
src=$(cd "$src" && pwd)

# release tarballs have ./configure, a git tree only auto/configure
configure=./configure
[ -x "$src/configure" ] || configure=./auto/configure

version=$(sed -n 's/^#define NGINX_VERSION *"\(.*\)"/\1/p' \
    "$src/src/core/nginx.h")

# the forks say which they are beside the nginx version they are based on
if [ -f "$src/src/core/angie.h" ]; then
    version="$version (Angie $(sed -n 's/^#define ANGIE_VERSION *"\(.*\)"/\1/p' "$src/src/core/angie.h"))"
elif grep -q 'TENGINE_VERSION' "$src/src/core/nginx.h"; then
    version="$version (Tengine $(sed -n 's/^#define TENGINE_VERSION *"\(.*\)"/\1/p' "$src/src/core/nginx.h"))"
elif grep -qi 'freenginx' "$src/src/core/nginx.h"; then
    version="$version (freenginx)"
fi

# --with-debug compiles the module's debug log lines (Debian's nginx has
# it); HTTP/3 is added where the tree knows it (1.25 and newer)
v3=
grep -q 'with-http_v3_module' "$src/auto/options" && v3=" --with-http_v3_module"

declare -A sets=(
    [compat-ssl-v2]="--with-compat --with-debug --with-http_ssl_module --with-http_v2_module"
    [compat-ssl-v2-stream]="--with-compat --with-debug --with-http_ssl_module --with-http_v2_module$v3 --with-threads --with-stream --with-stream_ssl_module"
    [minimal]="--without-http_rewrite_module --without-http_gzip_module"
)

rc=0
for name in compat-ssl-v2 compat-ssl-v2-stream minimal; do
    dir=$scratch/$name
    cp -r "$src" "$dir"
    log=$scratch/$name.log

    # shellcheck disable=SC2086
    if (cd "$dir" && $configure ${sets[$name]} \
            --with-cc-opt="-O2" \
            --add-dynamic-module="$top" \
        && make -f objs/Makefile modules) > "$log" 2>&1
    then
        # nginx's auto/cc/gcc adds -Werror to CFLAGS (not to configure's
        # own feature tests, so they detect what they would on a distro)
        if ! grep -q -- '^CFLAGS.*-Werror' "$dir/objs/Makefile"; then
            echo "nginx $version $name: FAILED (built without -Werror)"
            rc=1
        else
            echo "nginx $version $name: ok (${sets[$name]})"
        fi
    else
        echo "nginx $version $name: FAILED"
        grep -E '(warning|error):' "$log" | head -20 >&2 \
            || tail -20 "$log" >&2
        rc=1
    fi
    rm -rf "$dir"
done

exit $rc
