# shellcheck shell=bash
# util/apt-sources.sh, sourced by util/valkey.sh and util/trixie.sh: what
# they read of this machine's own apt sources, so that no archive is named
# in the repository.

# apt_source_files: the files apt reads its sources from (files renamed
# to disable them aside)
apt_source_files() {
    local f
    for f in /etc/apt/sources.list /etc/apt/sources.list.d/*.list \
             /etc/apt/sources.list.d/*.sources; do
        if [ -f "$f" ]; then
            echo "$f"
        fi
    done
}

# awk, for a one-line entry "deb [OPTIONS] URI SUITE COMPONENTS...":
# uri_field() is the index of its URI field, past the options
# shellcheck disable=SC2034 # used by the scripts that source this file
apt_oneline_awk='
    function uri_field(  i) {
        i = 2
        if ($i ~ /^\[/) {
            while (i < NF && $i !~ /\]$/) i++
            i++
        }
        return i
    }'
