
/*
 * Copyright (C) The ngx_http_idempotency_module authors
 *
 * Where a request's ctx lives and how it ends.  It is allocated in
 * r->pool with a pool cleanup, so the filters, the variables and the
 * metrics find the newest one of the request after an internal redirect
 * cleared r->ctx, and so that a request that ends, however it ends, lets
 * go of everything that could still call it back.
 */


#include "ngx_http_idempotency_http.h"


/* $idempotency_status, by status */
ngx_str_t  ngx_http_idempotency_status_names[] = {
    ngx_string("bypass"),
    ngx_string("new"),
    ngx_string("replay"),
    ngx_string("conflict"),
    ngx_string("mismatch"),
    ngx_string("invalid"),
    ngx_string("missing"),
    ngx_string("error"),
    ngx_string("unknown")
};


/*
 * The request's newest ctx: r->ctx, or, after an internal redirect
 * cleared it, the one that its pool cleanup holds.
 */

ngx_http_idempotency_ctx_t *
ngx_http_idempotency_get_ctx(ngx_http_request_t *r)
{
    ngx_pool_cleanup_t          *cln;
    ngx_http_idempotency_ctx_t  *ctx;

    ctx = ngx_http_get_module_ctx(r, ngx_http_idempotency_module);

    if (ctx || !r->internal) {
        return ctx;
    }

    for (cln = r->pool->cleanup; cln; cln = cln->next) {
        if (cln->handler == ngx_http_idempotency_cleanup) {
            ctx = cln->data;

            if (ctx->request == r) {
                return ctx;
            }
        }
    }

    return NULL;
}


/* a late reply finds no request; a claim it won is released then */

void
ngx_http_idempotency_abandon(ngx_http_idempotency_ctx_t *ctx)
{
    if (ctx->op) {
        ctx->op->op.data = NULL;
        ctx->op = NULL;
    }

    ngx_http_idempotency_wait_detach(ctx);
    ngx_http_idempotency_notify_unwatch(ctx);
    ngx_http_idempotency_fresh_detach(ctx);

    if (ctx->timeout.timer_set) {
        ngx_del_timer(&ctx->timeout);
    }

    ctx->state = NGX_HTTP_IDEMPOTENCY_ST_DONE;
}


void
ngx_http_idempotency_cleanup(void *data)
{
    ngx_http_idempotency_ctx_t *ctx = data;

    ngx_http_request_t  *r;

    r = ctx->request;

    ngx_http_idempotency_abandon(ctx);
    ngx_http_idempotency_fingerprint_free(ctx);
    ngx_http_idempotency_keep_done(r, ctx);
    ngx_http_idempotency_lease_stop(ctx);

    if (!ctx->owner || ctx->finished) {
        return;
    }

    /*
     * The owner ends without a stored response (the upstream timed out or
     * reset after it got the request, the client went away and the
     * capture could not finish, the worker shut down): if the operation
     * may have run, its outcome is unknown; else the claim is released.
     */

    ngx_http_idempotency_give_up(r, ctx);
}
