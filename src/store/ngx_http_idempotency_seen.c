
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
    u_char     *p;
    ngx_str_t   fkey;

    p = ngx_cpymem(op->rkey, prefix->data, prefix->len);
    *p++ = '{';
    p = ngx_hex_dump(p, hash, NGX_HTTP_IDEMPOTENCY_HASH_LEN);
    p = ngx_cpymem(p, "}:f", 3);
    op->rkey_len = p - op->rkey;

    fkey.data = op->rkey;
    fkey.len = op->rkey_len;

    return ngx_http_idempotency_set_nx_get(op, &fkey, key_hex,
                                           NGX_HTTP_IDEMPOTENCY_HEX_LEN,
                                           window);
}
