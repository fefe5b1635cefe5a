# shellcheck shell=bash
# util/lib.sh, sourced by bench/run.sh, bench/profile.sh, demo/run.sh,
# util/topology.sh and util/trixie.sh: the shell helpers they share.  Each
# finds it from its own location, so they run from any directory:
#     top=$(cd "$(dirname "$0")/.." && pwd)
#     . "$top/util/lib.sh"

# module_arg "$@": the one argument of a script that takes the module,
# made absolute into $module (call it before any cd); anything else is
# a usage message and exit 2
module_arg() {
    if [ $# -ne 1 ] || [ ! -f "$1" ]; then
        echo "usage: $0 path/to/ngx_http_idempotency_module.so" >&2
        exit 2
    fi
    # shellcheck disable=SC2034 # used by the scripts that source this file
    module=$(cd "$(dirname "$1")" && pwd)/$(basename "$1")
}

# die MESSAGE...: the script's name and MESSAGE on stderr, exit 1
die() {
    echo "${0##*/}: $*" >&2
    exit 1
}

# port_of NAME: the port of the bench's nginx NAME (upstream, plain,
# module, tls, cluster, wait), from the *_PORT variables of bench/run.sh
# and bench/profile.sh
port_of() {
    case $1 in
        upstream) echo "$UPSTREAM_PORT" ;;
        plain) echo "$PLAIN_PORT" ;;
        module) echo "$MODULE_PORT" ;;
        tls) echo "$TLS_PORT" ;;
        cluster) echo "$CLUSTER_PORT" ;;
        wait) echo "$WAIT_PORT" ;;
    esac
}
