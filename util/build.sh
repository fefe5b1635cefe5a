#!/usr/bin/env bash
# Builds the module as a dynamic module compatible with the nginx whose
# configure tree is at $1 (Debian: /usr/share/nginx/src from nginx-dev),
# with the same configure flags, so that the stock binary loads it.
set -euo pipefail

src=$1
build=$2
extra=${3:-}
top=$(cd "$(dirname "$0")/.." && pwd)

mkdir -p "$build"
rm -rf "$build/nginx"
cp -r "$src" "$build/nginx"
cd "$build/nginx"

flags=()
if [ -f conf_flags ]; then
    # shellcheck disable=SC1091
    . ./conf_flags
    flags=("${NGX_CONF_FLAGS[@]}")
fi

./configure "${flags[@]}" --with-compat \
    --with-cc-opt="-g -O2 -fPIC $extra" --with-ld-opt="$extra" \
    --add-dynamic-module="$top" > "$build/configure.log" 2>&1 || {
    tail -20 "$build/configure.log"; exit 1; }

make -f objs/Makefile modules > "$build/make.log" 2>&1 || {
    grep -E "error|warning" "$build/make.log" | head -40; exit 1; }

# a new inode, not an overwrite: an nginx running the old one keeps it
cp objs/ngx_http_idempotency_module.so "$build/.module.so.tmp"
mv -f "$build/.module.so.tmp" "$build/ngx_http_idempotency_module.so"
echo "built $build/ngx_http_idempotency_module.so"
