#!/bin/sh
# nginx with the AddressSanitizer runtime preloaded, for a module built with
# -fsanitize=address (Debian's nginx itself is not instrumented)
# Leaks must not change nginx's exit status: nginx itself leaves some at
# exit (its PCRE2 compile context, for one), so a daemonizing nginx would
# look as if it failed to start.  util/asan-report.pl judges the leaks.
export LSAN_OPTIONS=${LSAN_OPTIONS:-exitcode=0}
LD_PRELOAD=$(gcc -print-file-name=libasan.so) exec /usr/sbin/nginx "$@"
