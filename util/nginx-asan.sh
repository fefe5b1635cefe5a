#!/bin/sh
# nginx with the AddressSanitizer runtime preloaded, for a module built with
# -fsanitize=address (Debian's nginx itself is not instrumented)
LD_PRELOAD=$(gcc -print-file-name=libasan.so) exec /usr/sbin/nginx "$@"
