
/*
 * Copyright (C) The ngx_http_idempotency_module authors
 *
 * The owner's renewals: every third of idempotency_lock_ttl while its
 * request is alive (the lease itself is store/lease.c's).
 */


#include "ngx_http_idempotency_http.h"


static void ngx_http_idempotency_renew(ngx_event_t *ev);
static void ngx_http_idempotency_renew_done(ngx_http_idempotency_op_t *op,
    redisReply *reply);



/*
 * Renewal starts with the owner and stops with its request: a request
 * shorter than a third of the lock never renews.  The timer is not
 * cancelable: a worker that shuts down keeps renewing for the requests it
 * still serves, until worker_shutdown_timeout.
 */

void
ngx_http_idempotency_lease_start(ngx_http_request_t *r,
    ngx_http_idempotency_ctx_t *ctx)
{
    ngx_event_t  *ev;

    ctx->lease_end = ngx_current_msec + ctx->conf->lock_ttl;

    ev = &ctx->lease;
    ev->handler = ngx_http_idempotency_renew;
    ev->data = ctx;
    ev->log = r->connection->log;

    ngx_add_timer(ev, ngx_max(ctx->conf->lock_ttl / 3, 1));
}


void
ngx_http_idempotency_lease_stop(ngx_http_idempotency_ctx_t *ctx)
{
    if (ctx->lease.timer_set) {
        ngx_del_timer(&ctx->lease);
    }

    if (ctx->renew_op) {
        ctx->renew_op->data = NULL;
        ctx->renew_op = NULL;
    }
}


static void
ngx_http_idempotency_renew(ngx_event_t *ev)
{
    ngx_http_idempotency_ctx_t *ctx = ev->data;

    ngx_http_idempotency_key_op_t  *kop;

    if (ctx->finished) {
        return;
    }

    ngx_add_timer(ev, ngx_max(ctx->conf->lock_ttl / 3, 1));

    if (ctx->renew_op) {
        /* the last one is not answered yet: its deadline still holds */
        return;
    }

    kop = ngx_http_idempotency_key_op_alloc(ctx->redis, &ctx->rkey);
    if (kop == NULL) {
        return;
    }

    kop->op.data = ctx;
    kop->op.handler = ngx_http_idempotency_renew_done;
    if (ngx_http_idempotency_lease_renew(kop, &ctx->rkey, ctx->claim,
                                         ctx->conf->lock_ttl, ctx->conf->ttl)
        != NGX_OK)
    {
        ngx_log_error(NGX_LOG_WARN, ev->log, 0,
                      "idempotency: cannot renew the claim, redis \"%V\" is "
                      "not connected, key hash %*s", &ctx->redis->name,
                      (size_t) 2 * NGX_HTTP_IDEMPOTENCY_HASH_LEN,
                      ngx_http_idempotency_key_hash(ctx));
        return;
    }

    ctx->renew_op = &kop->op;
}


static void
ngx_http_idempotency_renew_done(ngx_http_idempotency_op_t *op,
    redisReply *reply)
{
    ngx_int_t                    rc;
    ngx_http_idempotency_ctx_t  *ctx;

    ctx = op->data;

    if (ctx == NULL) {
        /* the request ended meanwhile */
        return;
    }

    ctx->renew_op = NULL;

    rc = ngx_http_idempotency_lease_renewed(ngx_http_idempotency_key_op(op),
                                            reply, ctx->claim);

    if (rc == NGX_OK) {
        ctx->lease_end = ngx_http_idempotency_key_op(op)->lease_end;
        return;
    }

    if (rc == NGX_AGAIN) {
        /* a renewal thought lost had landed: the next one goes from it */
        return;
    }

    if (ctx->finished) {
        /* a store or unknown outcome is there now: nothing to renew */
        return;
    }

    ngx_log_error((ngx_uint_t) (reply ? NGX_LOG_ERR : NGX_LOG_WARN),
                  ctx->request->connection->log, 0,
                  "idempotency: the claim was not renewed: %s, key hash %*s",
                  reply == NULL ? "redis went away"
                  : reply->type == REDIS_REPLY_ERROR ? "redis error"
                  : "the key is no longer this request's",
                  (size_t) 2 * NGX_HTTP_IDEMPOTENCY_HASH_LEN,
                  ngx_http_idempotency_key_hash(ctx));
}

