
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
    if (ctx->claim) {
        ngx_http_idempotency_claim_detach(ctx->claim);
    }

    ngx_http_idempotency_fresh_detach(ctx);

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

    if (!ctx->owner || ctx->claim->finished) {
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


/*
 * What names the request in the log lines of its store or release, which
 * may come after nginx has freed it: the client, the request line, and
 * the key's hash (never the key).  buf holds INFO_LEN bytes.
 */

u_char *
ngx_http_idempotency_request_info(ngx_http_idempotency_ctx_t *ctx,
    u_char *buf)
{
    u_char              *last;
    ngx_str_t           *line;
    ngx_http_request_t  *r;

    r = ctx->request;
    line = &ctx->request_line;
    last = buf + NGX_HTTP_IDEMPOTENCY_INFO_LEN;

    /*
     * copied, not ngx_slprintf()ed: this runs for every store; the key
     * hash and an address always fit, the line is cut to fit, and the
     * closing quote always goes in
     */

    buf = ngx_cpymem(buf, "key hash ", sizeof("key hash ") - 1);
    buf = ngx_cpymem(buf, ngx_http_idempotency_key_hash(ctx),
                     2 * NGX_HTTP_IDEMPOTENCY_HASH_LEN);
    buf = ngx_cpymem(buf, ", client: ", sizeof(", client: ") - 1);
    buf = ngx_cpymem(buf, r->connection->addr_text.data,
                     ngx_min(r->connection->addr_text.len,
                             (size_t) NGX_SOCKADDR_STRLEN));
    buf = ngx_cpymem(buf, ", request: \"", sizeof(", request: \"") - 1);
    buf = ngx_cpymem(buf, line->data,
                     ngx_min(line->len, (size_t) (last - buf - 1)));
    *buf++ = '"';

    return buf;
}
