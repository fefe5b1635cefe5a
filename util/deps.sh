#!/usr/bin/env bash
# util/deps.sh [--demo] [PACKAGE...]: installs the Debian packages that are
# missing, plus any named as arguments (fuzz/run.sh adds clang); does
# nothing when they are all there already.  Without --demo: what the build,
# the tests, the bench and make deb need.  With --demo: only what make demo
# needs (the build, nginx with the echo module, Redis, curl).
set -euo pipefail

# make demo: build the module, run nginx, Redis and curl
demo_pkgs=(gcc make nginx nginx-dev libhiredis-dev libssl-dev redis-server
           libnginx-mod-http-echo curl)

if [ "${1:-}" = --demo ]; then
    shift
    pkgs=("${demo_pkgs[@]}" "$@")
    need_npm=
else
    pkgs=("${demo_pkgs[@]}"
          libnginx-mod-http-perl wrk
          prometheus    # promtool: t/017 checks the metrics and alert rules
          libtest-base-perl libtext-diff-perl liblist-moreutils-perl
          libtest-longstring-perl libhttp-message-perl liburi-perl libwww-perl
          libipc-run-perl openssl python3 python3-grpcio
          build-essential debhelper dpkg-dev fakeroot lintian
          nodejs        # t/047, t/068: libraries from npm
          spin          # t/050: the protocol model, checked by SPIN
          "$@")
    need_npm=1
fi

missing=()
for p in "${pkgs[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "ok installed" \
        || missing+=("$p")
done

# Debian's nodejs comes without npm; some builds of nodejs bring their own
[ -z "$need_npm" ] || command -v npm >/dev/null 2>&1 || missing+=(npm)

[ ${#missing[@]} -eq 0 ] && exit 0

if [ "$(id -u)" -ne 0 ]; then
    echo "missing packages: ${missing[*]} (run as root, or install them)" >&2
    exit 1
fi

echo "installing: ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
# policy-rc.d keeps the packaged nginx and redis services from starting
printf '#!/bin/sh\nexit 101\n' > /usr/sbin/policy-rc.d
chmod +x /usr/sbin/policy-rc.d
trap 'rm -f /usr/sbin/policy-rc.d' EXIT
apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
