#!/usr/bin/env bash
# Builds the libFuzzer targets into fuzz/.build/ with Debian's clang:
#
#   fuzz_key        ngx_http_idempotency_parse_key()        (key.c)
#   fuzz_record     ngx_http_idempotency_record_decode()    (record.c)
#   fuzz_roundtrip  capture_header() -> record_decode()     (record.c)
#   fuzz_resp       ngx_http_idempotency_resp_replace()     (resp.c)
#   fuzz_json       the JSON pointer and body scanner       (json*.c)
#
# The nginx headers come from the configure tree "make module" leaves in
# build/nginx (NGX_TREE to override).  That tree is rm -rf'd and recreated by
# every module build, so its headers are first copied to fuzz/.build/nginx:
# a concurrent "make module" cannot break the compile half-way.
set -euo pipefail

top=$(cd "$(dirname "$0")/.." && pwd)
out=$top/fuzz/.build
tree=${NGX_TREE:-$top/build/nginx}
CC=${CC:-clang}
SAN=${FUZZ_SANITIZERS:-fuzzer,address,undefined}

if [ ! -f "$tree/objs/ngx_auto_config.h" ]; then
    echo "no configure tree at $tree: building the module first"
    make -C "$top" module
fi

mkdir -p "$out"

# snapshot the headers; retry if someone rebuilds the tree meanwhile
for try in 1 2 3 4 5; do
    rm -rf "$out/nginx.tmp"
    mkdir -p "$out/nginx.tmp"
    if (cd "$tree" && find src objs -name '*.h' -print0 \
            | xargs -0 cp --parents -t "$out/nginx.tmp") 2>/dev/null \
        && [ -f "$out/nginx.tmp/objs/ngx_auto_config.h" ] \
        && [ -f "$out/nginx.tmp/src/http/ngx_http.h" ]
    then
        rm -rf "$out/nginx"
        mv "$out/nginx.tmp" "$out/nginx"
        break
    fi
    [ "$try" = 5 ] && { echo "cannot copy the headers from $tree" >&2; exit 1; }
    sleep 3
done

ngx=$out/nginx
incs=(-I "$ngx/src/core" -I "$ngx/src/event" -I "$ngx/src/event/modules"
      -I "$ngx/src/os/unix" -I "$ngx/objs" -I "$ngx/src/http"
      -I "$ngx/src/http/modules" -I "$ngx/src/http/v2" -I "$top/src"
      -I "$top/src/http" -I "$top/src/store" -I "$top/src/redis")

cflags=(-g -O1 -fno-omit-frame-pointer -fsanitize="$SAN"
        -fno-sanitize-recover=undefined
        -Wall -Wextra -Wno-unused-parameter -Wno-sign-compare
        -Wno-missing-field-initializers)

build() {
    local name=$1; shift
    "$CC" "${cflags[@]}" "${incs[@]}" -o "$out/$name" "$@"
    echo "built $out/$name"
}

src=$top/src
build fuzz_key       "$top/fuzz/fuzz_key.c"   "$src/http/ngx_http_idempotency_key.c"
build fuzz_record    "$top/fuzz/fuzz_record.c" \
                     "$src/store/ngx_http_idempotency_record.c"
build fuzz_roundtrip "$top/fuzz/fuzz_roundtrip.c" \
                     "$src/store/ngx_http_idempotency_record.c" \
                     "$src/store/ngx_http_idempotency_build.c" \
                     "$src/http/ngx_http_idempotency_capture.c"
build fuzz_resp      "$top/fuzz/fuzz_resp.c" \
                     "$src/redis/ngx_http_idempotency_resp.c"
build fuzz_json      "$top/fuzz/fuzz_json.c" \
                     "$src/http/ngx_http_idempotency_json.c" \
                     "$src/http/ngx_http_idempotency_json_string.c"
