
/*
 * Copyright (C) The ngx_http_idempotency_module authors
 *
 * Which key first carried a request: for the detection of clients that
 * make a new key per attempt (idempotency_fresh_key_detect).
 */


#include "ngx_http_idempotency_store.h"


/*
 * SET <prefix>{hex hash}:f <key hash> NX GET PX window: remembers, for the
 * window, the key hash that first carried the request named by hash, and
 * answers it (nil: this key is the first).  On NGX_ERROR the op has been
 * freed.
 */

ngx_int_t
ngx_http_idempotency_seen_command(ngx_http_idempotency_op_t *op,
    ngx_str_t *prefix, u_char *hash, u_char *key_hex, ngx_msec_t window)
{
    u_char      *p, px[NGX_INT_T_LEN];
    size_t       argvlen[7];
    const char  *argv[7];

    p = ngx_cpymem(op->rkey, prefix->data, prefix->len);
    *p++ = '{';
    p = ngx_hex_dump(p, hash, NGX_HTTP_IDEMPOTENCY_HASH_LEN);
    p = ngx_cpymem(p, "}:f", 3);
    op->rkey_len = p - op->rkey;

    argv[0] = "SET";
    argvlen[0] = 3;
    argv[1] = (const char *) op->rkey;
    argvlen[1] = op->rkey_len;
    argv[2] = (const char *) key_hex;
    argvlen[2] = NGX_HTTP_IDEMPOTENCY_HEX_LEN;
    argv[3] = "NX";
    argvlen[3] = 2;
    argv[4] = "GET";
    argvlen[4] = 3;
    argv[5] = "PX";
    argvlen[5] = 2;
    argv[6] = (const char *) px;
    argvlen[6] = ngx_http_idempotency_decimal(px, window) - px;

    return ngx_http_idempotency_redis_command(op, 7, argv, argvlen);
}
