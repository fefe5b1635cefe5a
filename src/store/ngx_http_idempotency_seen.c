
/*
 * Copyright (C) The ngx_http_idempotency_module authors
 *
 * Which key first carried a request: for the detection of clients that
 * make a new key per attempt (idempotency_fresh_key_detect).
 */


#include "ngx_http_idempotency_store.h"


static void ngx_http_idempotency_seen_done(ngx_http_idempotency_op_t *op,
    redisReply *reply);


/*
 * SET <prefix>{hex hash}:f <key hash> NX GET PX window: remembers, for the
 * window, the key hash that first carried the request named by hash, and
 * tells handler which key that was.  The op, for its sender to detach
 * (op->data = NULL), or NULL when nothing was sent.
 */

ngx_http_idempotency_op_t *
ngx_http_idempotency_seen_send(ngx_http_idempotency_target_t *redis,
    ngx_str_t *prefix, u_char *hash, u_char *key_hex, ngx_msec_t window,
    ngx_http_idempotency_seen_pt handler, void *data)
{
    u_char                         *p;
    ngx_str_t                       fkey;
    ngx_http_idempotency_key_op_t  *kop;
    u_char                          buf[NGX_HTTP_IDEMPOTENCY_STORE_KEY_MAX
                                        + 2];

    p = ngx_cpymem(buf, prefix->data, prefix->len);
    *p++ = '{';
    p = ngx_hex_dump(p, hash, NGX_HTTP_IDEMPOTENCY_HASH_LEN);
    p = ngx_cpymem(p, "}:f", 3);

    fkey.data = buf;
    fkey.len = p - buf;

    kop = ngx_http_idempotency_key_op_alloc(redis, &fkey);
    if (kop == NULL) {
        return NULL;
    }

    kop->op.data = data;
    kop->op.handler = ngx_http_idempotency_seen_done;
    kop->seen = handler;

    if (ngx_http_idempotency_set_nx_get(&kop->op, &fkey, key_hex,
                                        NGX_HTTP_IDEMPOTENCY_HEX_LEN, window)
        != NGX_OK)
    {
        return NULL;
    }

    return &kop->op;
}


/* nil: no key carried the request before; the key hash of one that did */

static void
ngx_http_idempotency_seen_done(ngx_http_idempotency_op_t *op,
    redisReply *reply)
{
    u_char  *first;

    if (op->data == NULL) {
        return;
    }

    first = NULL;

    if (reply && reply->type == REDIS_REPLY_STRING
        && reply->len == NGX_HTTP_IDEMPOTENCY_HEX_LEN)
    {
        first = (u_char *) reply->str;
    }

    ngx_http_idempotency_key_op(op)->seen(op->data, first);
}
