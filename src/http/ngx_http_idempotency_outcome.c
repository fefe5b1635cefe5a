
/*
 * Copyright (C) The ngx_http_idempotency_module authors
 *
 * What is known of the owner's execution when its response begins or its
 * request ends.  A timeout is no proof that nothing ran: from the moment
 * nginx started sending the request upstream, the operation may have run,
 * and without a response header nobody knows whether it did.
 *
 * The facts come from the upstream module's public state: u->request_sent
 * of the attempt under way, and r->upstream_states, one entry per attempt
 * (bytes_sent, header_time), which survives internal redirects.  Only the
 * attempts of the upstream that served the owner's location count: an
 * error_page that proxies elsewhere starts a new group, after an entry
 * without a peer.
 */


#include "ngx_http_idempotency_http.h"


void
ngx_http_idempotency_outcome_start(ngx_http_request_t *r,
    ngx_http_idempotency_ctx_t *ctx)
{
    ctx->states_from = r->upstream_states ? r->upstream_states->nelts : 0;

    /* an error_page from here on redirects, and makes a page of its own */
    ctx->internal = r->internal;
}


ngx_uint_t
ngx_http_idempotency_outcome(ngx_http_request_t *r,
    ngx_http_idempotency_ctx_t *ctx, ngx_uint_t *status)
{
    ngx_uint_t                  i, n, sent, answered, seen;
    ngx_http_upstream_t        *u;
    ngx_http_upstream_state_t  *st;

    *status = NGX_HTTP_BAD_GATEWAY;

    if (r->upstream_states == NULL
        || r->upstream_states->nelts <= ctx->states_from)
    {
        /* no upstream: what the content handler answers is its outcome */
        return r->upstream ? NGX_HTTP_IDEMPOTENCY_OUT_NOT_SENT
                           : NGX_HTTP_IDEMPOTENCY_OUT_NONE;
    }

    st = r->upstream_states->elts;
    n = r->upstream_states->nelts;
    u = r->upstream;

    sent = 0;
    answered = 0;
    seen = 0;

    for (i = ctx->states_from; i < n; i++) {

        if (st[i].peer == NULL) {
            if (seen) {
                /* a later upstream, after an internal redirect */
                break;
            }

            continue;
        }

        seen = 1;

        if (u && u->state == &st[i]) {
            /* the attempt under way: its counters are not filled in yet */
            sent |= u->request_sent;
            answered |= (u->headers_in.status_n != 0);

        } else {
            /* bytes_sent counts the connection: kept alive, it errs on
             * the side of "may have run" */
            sent |= (st[i].bytes_sent > 0);
            answered |= (st[i].header_time != (ngx_msec_t) -1);
        }

        if (st[i].status >= NGX_HTTP_SPECIAL_RESPONSE) {
            *status = st[i].status;
        }
    }

    if (*status != NGX_HTTP_GATEWAY_TIME_OUT) {
        *status = NGX_HTTP_BAD_GATEWAY;
    }

    if (!seen) {
        return NGX_HTTP_IDEMPOTENCY_OUT_NOT_SENT;
    }

    if (answered) {
        return NGX_HTTP_IDEMPOTENCY_OUT_ANSWERED;
    }

    return sent ? NGX_HTTP_IDEMPOTENCY_OUT_SENT
                : NGX_HTTP_IDEMPOTENCY_OUT_NOT_SENT;
}


/* the response cannot be stored: unknown if it may have run, else free */

void
ngx_http_idempotency_give_up(ngx_http_request_t *r,
    ngx_http_idempotency_ctx_t *ctx)
{
    ngx_uint_t  status;

    switch (ngx_http_idempotency_outcome(r, ctx, &status)) {

    case NGX_HTTP_IDEMPOTENCY_OUT_NONE:
        /* a content handler of its own ran once its response began */
        if (!ctx->header_seen) {
            break;
        }

        /* fall through */

    case NGX_HTTP_IDEMPOTENCY_OUT_SENT:
    case NGX_HTTP_IDEMPOTENCY_OUT_ANSWERED:
        ctx->capturing = 0;
        ngx_http_idempotency_claim_unknown(ctx->claim, status);
        return;

    default:
        break;
    }

    ctx->capturing = 0;
    ngx_http_idempotency_claim_release(ctx->claim);
}
