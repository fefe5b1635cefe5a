#!/usr/bin/env bash
# util/valkey.sh: installs Valkey (valkey-server, valkey-sentinel, and
# valkey-cli from valkey-tools) beside Redis for `make test-valkey`, with
# util/deps.sh.  Debian 12 has Valkey in bookworm-backports only: that
# suite is added to the machine's apt sources, taken from the machine's
# own bookworm entry (same archive, same signing key, component main), so
# no archive is named here.  Later releases have it in main.
set -euo pipefail

pkgs=(valkey-server valkey-sentinel valkey-tools)
here=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=util/apt-sources.sh
. "$here/apt-sources.sh"

# shellcheck source=/dev/null
. /etc/os-release
codename=${VERSION_CODENAME:?no VERSION_CODENAME in /etc/os-release}

has_suite() { # has_suite SUITE: some enabled source already lists it
    local f
    while read -r f; do
        if grep -v '^[[:space:]]*#' "$f" | grep -qw -- "$1"; then
            return 0
        fi
    done < <(apt_source_files)
    return 1
}

# backports_of FILE: FILE's entries for $codename, as $codename-backports
# entries of component main.  A deb822 stanza is copied whole (URIs,
# Signed-By, Architectures...), with only Suites and Components replaced;
# a one-line entry keeps its options and URI.
backports_of() {
    case $1 in
        *.sources)
            awk -v want="$codename" '
                BEGIN { RS = ""; FS = "\n" }
                {
                    ok = 0; deb = 0; out = ""
                    for (i = 1; i <= NF; i++) {
                        if ($i ~ /^[ \t]*#/) continue
                        l = tolower($i)
                        if (l ~ /^types:/ && (" " l " ") ~ /[ \t]deb[ \t]/)
                            deb = 1
                        if (l ~ /^enabled:[ \t]*no/) { ok = 0; break }
                        if (l ~ /^suites:/) {
                            if ((" " $i " ") ~ ("[ \t]" want "[ \t]")) ok = 1
                            $i = "Suites: " want "-backports"
                        }
                        if (l ~ /^components:/) $i = "Components: main"
                        out = out $i "\n"
                    }
                    if (ok && deb) { printf "%s%s", sep, out; sep = "\n" }
                }' "$1"
            ;;
        *)
            awk -v want="$codename" "$apt_oneline_awk"'
                $1 == "deb" {
                    i = uri_field()
                    if ($(i + 1) != want) next
                    line = $1
                    for (j = 2; j <= i; j++) line = line " " $j
                    print line " " want "-backports main"
                }' "$1"
            ;;
    esac
}

# Debian 12: the suite first, then deps.sh installs from it (the only
# source of these packages, so no -t is needed)
if [ "$codename" = bookworm ] && ! has_suite "$codename-backports" &&
   ! dpkg-query -W -f='${Status}' valkey-server 2>/dev/null |
       grep -q "ok installed"; then
    if [ "$(id -u)" -ne 0 ]; then
        echo "$codename-backports is needed for ${pkgs[*]} (run as root)" >&2
        exit 1
    fi

    entries=""
    ext=""
    while read -r f; do
        entries=$(backports_of "$f")
        if [ -n "$entries" ]; then
            ext=${f##*.}
            break
        fi
    done < <(apt_source_files)

    if [ -z "$entries" ]; then
        echo "no apt source for $codename to take $codename-backports" \
             "from" >&2
        exit 1
    fi

    [ "$ext" = sources ] || ext=list
    out=/etc/apt/sources.list.d/$codename-backports.$ext
    printf '%s\n' "$entries" > "$out"
    echo "added $codename-backports to $out"
fi

exec "$here/deps.sh" "${pkgs[@]}"
