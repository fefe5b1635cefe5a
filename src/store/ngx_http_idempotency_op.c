
/*
 * Copyright (C) The ngx_http_idempotency_module authors
 */


#include "ngx_http_idempotency_store.h"


/*
 * A store command about one record key (rkey: routed by it), from the
 * client's free list: the wiring makes every op large enough (op_size).
 */

ngx_http_idempotency_key_op_t *
ngx_http_idempotency_key_op_alloc(ngx_http_idempotency_target_t *redis,
    ngx_str_t *rkey)
{
    ngx_http_idempotency_op_t      *op;
    ngx_http_idempotency_key_op_t  *kop;

    if (rkey->len > NGX_HTTP_IDEMPOTENCY_RKEY_MAX) {
        return NULL;
    }

    op = ngx_http_idempotency_op_alloc(redis);
    if (op == NULL) {
        return NULL;
    }

    kop = ngx_http_idempotency_key_op(op);

    ngx_memzero((u_char *) kop + sizeof(ngx_http_idempotency_op_t),
                sizeof(ngx_http_idempotency_key_op_t)
                - sizeof(ngx_http_idempotency_op_t));

    op->rkey_len = rkey->len;
    ngx_memcpy(op->rkey, rkey->data, rkey->len);

    return kop;
}


/* a new op for the same key, carrying what the store keeps with it */

ngx_http_idempotency_key_op_t *
ngx_http_idempotency_key_op_copy(ngx_http_idempotency_key_op_t *from)
{
    ngx_http_idempotency_op_t      *op;
    ngx_http_idempotency_key_op_t  *kop;

    op = ngx_http_idempotency_op_alloc(from->op.redis);
    if (op == NULL) {
        return NULL;
    }

    kop = ngx_http_idempotency_key_op(op);

    op->rkey_len = from->op.rkey_len;
    ngx_memcpy(op->rkey, from->op.rkey, from->op.rkey_len);

    ngx_memcpy((u_char *) kop + sizeof(ngx_http_idempotency_op_t),
               (u_char *) from + sizeof(ngx_http_idempotency_op_t),
               sizeof(ngx_http_idempotency_key_op_t)
               - sizeof(ngx_http_idempotency_op_t));

    return kop;
}
