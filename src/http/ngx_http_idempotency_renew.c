
/*
 * Copyright (C) The ngx_http_idempotency_module authors
 *
 * The owner's renewals: every third of idempotency_lock_ttl while its
 * request is alive (the lease itself is store/lease.c's).
 */


#include "ngx_http_idempotency_http.h"


static void ngx_http_idempotency_renew(ngx_event_t *ev);
static void ngx_http_idempotency_renew_done(void *data, ngx_uint_t result,
    ngx_msec_t lease_end);



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

    if (ngx_http_idempotency_lease_renew(kop, &ctx->rkey, ctx->claim,
                                         ctx->conf->lock_ttl, ctx->conf->ttl,
                                         ngx_http_idempotency_renew_done, ctx)
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


/* the store read the reply, and keeps ctx->claim as Redis holds it */

static void
ngx_http_idempotency_renew_done(void *data, ngx_uint_t result,
    ngx_msec_t lease_end)
{
    ngx_http_idempotency_ctx_t *ctx = data;

    ctx->renew_op = NULL;

    if (result == NGX_HTTP_IDEMPOTENCY_RENEWED) {
        ctx->lease_end = lease_end;
        return;
    }

    if (result == NGX_HTTP_IDEMPOTENCY_RENEW_LANDED) {
        /* a renewal thought lost had landed: the next one goes from it */
        return;
    }

    if (ctx->finished) {
        /* a store or unknown outcome is there now: nothing to renew */
        return;
    }

    ngx_log_error((ngx_uint_t) (result == NGX_HTTP_IDEMPOTENCY_RENEW_GONE
                                ? NGX_LOG_WARN : NGX_LOG_ERR),
                  ctx->request->connection->log, 0,
                  "idempotency: the claim was not renewed: %s, key hash %*s",
                  result == NGX_HTTP_IDEMPOTENCY_RENEW_GONE
                  ? "redis went away"
                  : result == NGX_HTTP_IDEMPOTENCY_RENEW_ERROR
                  ? "redis error"
                  : "the key is no longer this request's",
                  (size_t) 2 * NGX_HTTP_IDEMPOTENCY_HASH_LEN,
                  ngx_http_idempotency_key_hash(ctx));
}
