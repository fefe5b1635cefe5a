
/*
 * libFuzzer target for ngx_http_idempotency_resp_replace()
 * (src/redis/ngx_http_idempotency_resp.c): one argument of a command the
 * client kept, replaced, as the store's retries ask for it.
 *
 * Input:
 *   byte 0      bit 7: the kept bytes are the rest of the input as they
 *               are (anything at all); else a command made of the rest,
 *               split on LF into arguments, formatted by
 *               ngx_http_idempotency_format()
 *               bits 0-6: the argument to replace
 *   the rest    (a command) the arguments, the last one the replacement
 *
 * Checked: on any bytes, nothing is read or written outside the kept
 * buffer and the replacement (ASan), and a refusal leaves the kept bytes
 * as they were.  On a formatted command: an argument that exists is
 * replaced, and the result is byte for byte the command formatted with
 * that argument in its place; one that does not is refused.
 */


#include "ngx_http_idempotency_module.h"
#include "fuzz.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>


#define MAX_ARGS  32


/* exact-size allocations, so that ASan sees a write past the end */

void *
ngx_alloc(size_t size, ngx_log_t *log)
{
    void  *p;

    p = malloc(size ? size : 1);
    if (p == NULL) {
        abort();
    }

    return p;
}


void
ngx_log_error_core(ngx_uint_t level, ngx_log_t *log, ngx_err_t err,
    const char *fmt, ...)
{
}


/* the NOSCRIPT rewrite's neighbours in resp.c: not reached here */

u_char *
ngx_sprintf(u_char *buf, const char *fmt, ...)
{
    abort();
}


u_char *
ngx_http_idempotency_conn_reserve(ngx_http_idempotency_node_t *node,
    size_t len)
{
    abort();
}


void
ngx_http_idempotency_node_queue(ngx_http_idempotency_node_t *node,
    ngx_http_idempotency_op_t *op)
{
    abort();
}


static u_char *
format(int argc, const char **argv, size_t *argvlen, size_t *len)
{
    u_char  *buf, *p;

    buf = malloc(ngx_http_idempotency_format_len(argc, argvlen));
    if (buf == NULL) {
        abort();
    }

    p = ngx_http_idempotency_format(buf, argc, argv, argvlen);
    *len = p - buf;

    return buf;
}


int
LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    int                           argc;
    u_char                       *p, *last, *copy, *want, *rep;
    size_t                        argvlen[MAX_ARGS], replen, want_len;
    ngx_int_t                     rc;
    ngx_uint_t                    n;
    const char                   *argv[MAX_ARGS];
    ngx_http_idempotency_op_t     op;
    ngx_http_idempotency_target_t redis;

    if (size < 1) {
        return 0;
    }

    n = data[0] & 0x7f;

    ngx_memzero(&op, sizeof(ngx_http_idempotency_op_t));
    ngx_memzero(&redis, sizeof(ngx_http_idempotency_target_t));
    op.redis = &redis;

    if (data[0] & 0x80) {
        /* any bytes: bounds only, and a refusal changes nothing */

        op.buf_len = size - 1;
        op.buf = malloc(op.buf_len ? op.buf_len : 1);
        copy = malloc(op.buf_len ? op.buf_len : 1);
        if (op.buf == NULL || copy == NULL) {
            abort();
        }

        ngx_memcpy(op.buf, data + 1, op.buf_len);
        ngx_memcpy(copy, data + 1, op.buf_len);

        rep = malloc(7);
        if (rep == NULL) {
            abort();
        }

        ngx_memcpy(rep, "replace", 7);

        rc = ngx_http_idempotency_resp_replace(&op, n, rep, 7);

        if (rc != NGX_OK) {
            fuzz_assert(op.buf_len == size - 1
                        && ngx_memcmp(op.buf, copy, op.buf_len) == 0,
                        "a refusal changed the kept bytes");
        }

        free(rep);
        free(copy);
        free(op.buf);

        return 0;
    }

    /* a command: the arguments, split on LF, then the replacement */

    p = (u_char *) data + 1;
    last = (u_char *) data + size;
    argc = 0;

    while (argc < MAX_ARGS) {
        u_char  *lf;

        lf = memchr(p, '\n', last - p);

        argv[argc] = (const char *) p;
        argvlen[argc] = (lf ? lf : last) - p;
        argc++;

        if (lf == NULL) {
            break;
        }

        p = lf + 1;
    }

    if (argc < 2) {
        return 0;
    }

    /* the last piece is the replacement, in a buffer of its own size */

    argc--;
    replen = argvlen[argc];
    rep = malloc(replen ? replen : 1);
    if (rep == NULL) {
        abort();
    }

    ngx_memcpy(rep, argv[argc], replen);

    op.buf = format(argc, argv, argvlen, &op.buf_len);

    rc = ngx_http_idempotency_resp_replace(&op, n, rep, replen);

    if ((int) n >= argc) {
        fuzz_assert(rc == NGX_ERROR, "argument %d of %d replaced", (int) n,
                    argc);

    } else {
        fuzz_assert(rc == NGX_OK, "argument %d of %d refused", (int) n,
                    argc);

        argv[n] = (const char *) rep;
        argvlen[n] = replen;

        want = format(argc, argv, argvlen, &want_len);

        fuzz_assert(op.buf_len == want_len
                    && ngx_memcmp(op.buf, want, want_len) == 0,
                    "argument %d of %d replaced into other bytes",
                    (int) n, argc);

        free(want);
    }

    free(op.buf);
    free(rep);

    return 0;
}
