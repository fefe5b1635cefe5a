#!/usr/bin/env bash
# make deb: builds the Debian package libnginx-mod-http-idempotency (and
# its -dbgsym) for the stock nginx with dpkg-buildpackage and dh_nginx,
# out of tree: a copy of the sources in $1 (build/deb), where the .debs
# land too, so the checkout stays clean. Runs lintian on the result; any
# error fails. The last line printed is the path of the .deb.
set -euo pipefail

top=$(cd "$(dirname "$0")/.." && pwd)
out=${1:-$top/build/deb}
cd "$top"

version=$(./util/version-check.sh)
pkg=$(sed -n 's/^Package: *//p' debian/control | head -1)
debver=$(dpkg-parsechangelog -l debian/changelog -SVersion)
arch=$(dpkg-architecture -qDEB_HOST_ARCH)

# only what the package is built from: no build/, t/servroot*, .git
rm -rf "$out"
src=$out/$pkg-$version
mkdir -p "$src"
cp -r config src debian docs README.md CHANGELOG.md LICENSE "$src/"

echo "building $pkg $debver in $out"
(cd "$src" && dpkg-buildpackage -b -us -uc) > "$out/build.log" 2>&1 || {
    tail -40 "$out/build.log"
    echo "dpkg-buildpackage failed: $out/build.log" >&2
    exit 1; }

deb=$out/${pkg}_${debver}_${arch}.deb
[ -f "$deb" ] || { echo "no $deb after the build" >&2; exit 1; }

if command -v lintian >/dev/null 2>&1; then
    # errors fail the build; warnings are shown. As root lintian says it
    # would rather not be: that line is not about the package
    rc=0
    lintian --fail-on error "$deb" "$out/${pkg}-dbgsym_${debver}_${arch}.deb" \
        > "$out/lintian.log" 2>&1 || rc=$?
    grep -v '^running with root privileges' "$out/lintian.log" || true
    [ $rc -eq 0 ] || { echo "lintian reports errors" >&2; exit 1; }
else
    echo "lintian is not installed: not checked (make deps installs it)"
fi

echo "$deb"
