#!/bin/sh
# nginx with the AddressSanitizer runtime preloaded, for a module built with
# -fsanitize=address (Debian's nginx itself is not instrumented)
# Leaks must not change nginx's exit status: nginx itself leaves some at
# exit (its PCRE2 compile context, for one), so a daemonizing nginx would
# look as if it failed to start.  util/asan-report.pl judges the leaks.
export LSAN_OPTIONS=${LSAN_OPTIONS:-exitcode=0}

# nginx -t, -T and -s return from main without destroying the cycle they
# parsed (the master and workers destroy theirs, running its cleanups):
# their logs are named apart, for the report to tell the cycle left at
# exit from a leak
for arg in "$@"; do
    case $arg in
    -t|-T|-s)
        ASAN_OPTIONS=$(printf '%s' "${ASAN_OPTIONS:-}" \
                       | sed 's#\(log_path=[^:]*\)/asan#\1/asan-cycle#')
        export ASAN_OPTIONS
        break
        ;;
    esac
done

LD_PRELOAD=$(gcc -print-file-name=libasan.so) exec /usr/sbin/nginx "$@"
