#!/usr/bin/env bash
# Installs the Debian packages the build, tests, demo, bench and make deb
# need, plus any named as arguments (fuzz/run.sh adds clang); does nothing
# when they are all there already.
set -euo pipefail

pkgs=(gcc make nginx nginx-dev libhiredis-dev libssl-dev redis-server
      libnginx-mod-http-echo libnginx-mod-http-perl curl wrk
      prometheus    # promtool: t/017 checks the metrics and alert rules
      libtest-base-perl libtext-diff-perl liblist-moreutils-perl
      libtest-longstring-perl libhttp-message-perl liburi-perl libwww-perl
      libipc-run-perl openssl python3 python3-grpcio
      build-essential debhelper dpkg-dev fakeroot lintian
      nodejs        # t/047: Stripe's own Node.js library, from npm
      spin          # t/050: the protocol model, checked by SPIN
      "$@")

missing=()
for p in "${pkgs[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "ok installed" \
        || missing+=("$p")
done

# Debian's nodejs comes without npm; some builds of nodejs bring their own
command -v npm >/dev/null 2>&1 || missing+=(npm)

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
