#!/usr/bin/env bash
# make version-check: the version is written once, in
# src/ngx_http_idempotency_version.h; CHANGELOG.md's newest entry and
# debian/changelog's upstream version must name the same one, and so
# must every "idempotency module X.Y.Z" the docs quote from the log.
# Prints the version on success.
set -euo pipefail
cd "$(dirname "$0")/.."

hdr=$(sed -n 's/^#define NGX_HTTP_IDEMPOTENCY_VERSION *"\([^"]*\)".*/\1/p' \
          src/ngx_http_idempotency_version.h)
log=$(sed -n 's/^## \([0-9][^ ]*\).*/\1/p' CHANGELOG.md | head -1)
# "pkg (0.3.0-1) dist; ..." -> 0.3.0 (no epoch, no Debian revision)
deb=$(sed -n '1s/^[^ ]* (\([0-9]*:\)\{0,1\}\([^)]*\)-[^-)]*).*/\2/p' \
          debian/changelog)

if [ -z "$hdr" ]; then
    echo "no NGX_HTTP_IDEMPOTENCY_VERSION in the header" >&2
    exit 1
fi
rc=0
for f in "CHANGELOG.md:$log" "debian/changelog:$deb"; do
    if [ "${f#*:}" != "$hdr" ]; then
        echo "${f%%:*} says '${f#*:}', the header '$hdr'" >&2
        rc=1
    fi
done
# the start-up line as the docs show it
while IFS=: read -r file line text; do
    quoted=$(printf '%s' "$text" |
             sed -n 's/.*idempotency module \([0-9][0-9.]*[0-9]\).*/\1/p')
    if [ -n "$quoted" ] && [ "$quoted" != "$hdr" ]; then
        echo "$file:$line quotes 'idempotency module $quoted'," \
             "the header '$hdr'" >&2
        rc=1
    fi
done < <(grep -Hn 'idempotency module [0-9]' README.md docs/*.md || true)
[ $rc -eq 0 ] && echo "$hdr"
exit $rc
