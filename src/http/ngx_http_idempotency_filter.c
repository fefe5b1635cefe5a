
/*
 * Copyright (C) The ngx_http_idempotency_module authors
 *
 * Capture of the owner's response while it streams to the client, and
 * which end its claim takes: stored, too large, an unknown outcome, or
 * released (end.c ends it).
 */


#include "ngx_http_idempotency_http.h"


static ngx_int_t ngx_http_idempotency_capture(ngx_http_request_t *r,
    ngx_http_idempotency_ctx_t *ctx, ngx_buf_t *b);
static void ngx_http_idempotency_store(ngx_http_request_t *r,
    ngx_http_idempotency_ctx_t *ctx);
static void ngx_http_idempotency_consume(ngx_http_request_t *r,
    ngx_chain_t *in);
static ngx_int_t ngx_http_idempotency_expires(ngx_http_request_t *r,
    ngx_http_idempotency_loc_conf_t *conf);
static void ngx_http_idempotency_too_large(ngx_http_request_t *r,
    ngx_http_idempotency_ctx_t *ctx);
static ngx_int_t ngx_http_idempotency_owner_hints(ngx_http_request_t *r,
    ngx_http_idempotency_ctx_t *ctx);
static ngx_uint_t ngx_http_idempotency_store_status_ok(
    ngx_http_idempotency_loc_conf_t *conf, ngx_uint_t status);
static ngx_int_t ngx_http_idempotency_problem_body(ngx_http_request_t *r,
    ngx_http_idempotency_ctx_t *ctx, ngx_chain_t *in);


/* the next filters, set where the module's filters join the chain */
ngx_http_output_header_filter_pt  ngx_http_idempotency_next_header;
ngx_http_output_body_filter_pt    ngx_http_idempotency_next_body;


ngx_int_t
ngx_http_idempotency_header_filter(ngx_http_request_t *r)
{
    ngx_int_t                    rc;
    ngx_uint_t                   status;
    ngx_http_idempotency_ctx_t  *ctx;

    if (r != r->main) {
        return ngx_http_idempotency_next_header(r);
    }

    ctx = ngx_http_idempotency_get_ctx(r);

    if (ctx == NULL || !ctx->owner || ctx->claim->finished
        || ctx->header_seen)
    {
        return ngx_http_idempotency_next_header(r);
    }

    ctx->header_seen = 1;

    /*
     * What nginx sends is not always the upstream's answer: an upstream
     * never reached frees the key whatever page error_page makes of it,
     * and one that got the request but never answered leaves it unknown.
     */

    switch (ngx_http_idempotency_outcome(r, ctx, &status)) {

    case NGX_HTTP_IDEMPOTENCY_OUT_NOT_SENT:
        ngx_log_debug1(NGX_LOG_DEBUG_HTTP, r->connection->log, 0,
                       "idempotency: upstream never reached (%ui), releasing",
                       r->headers_out.status);

        ngx_http_idempotency_claim_release(ctx->claim);
        return ngx_http_idempotency_next_header(r);

    case NGX_HTTP_IDEMPOTENCY_OUT_SENT:
        ngx_http_idempotency_claim_unknown(ctx->claim, status);

        if (ctx->conf->on_unknown != NGX_HTTP_IDEMPOTENCY_ON_UNKNOWN_KEEP) {
            return ngx_http_idempotency_next_header(r);
        }

        /*
         * Every retry will be told outcome-unknown: so is the owner, in
         * place of nginx's own 502/504 page (no redirect since the start,
         * so no error_page of the operator's made it), and a client
         * library need not spend a request to learn it.  An error_page's
         * page stays, with the hint not to retry.
         */

        if (r->err_status && r->internal == ctx->internal) {
            if (ngx_http_idempotency_problem_unknown(r, ctx->conf, status,
                                                     &ctx->problem)
                != NGX_OK)
            {
                return NGX_ERROR;
            }

        } else if (ngx_http_idempotency_owner_hints(r, ctx) != NGX_OK) {
            return NGX_ERROR;
        }

        return ngx_http_idempotency_next_header(r);

    default:
        break;
    }

    if (!ngx_http_idempotency_store_status_ok(ctx->conf,
                                              r->headers_out.status))
    {
        ngx_log_debug1(NGX_LOG_DEBUG_HTTP, r->connection->log, 0,
                       "idempotency: status %ui not stored, releasing",
                       r->headers_out.status);

        ngx_http_idempotency_claim_release(ctx->claim);
        return ngx_http_idempotency_next_header(r);
    }

    if (ctx->conf->expires_header
        && ngx_http_idempotency_expires(r, ctx->conf) != NGX_OK)
    {
        ngx_http_idempotency_give_up(r, ctx);
        return NGX_ERROR;
    }

    rc = ngx_http_idempotency_capture_header(r, ctx->conf, &ctx->capture,
                                             ctx->claim->head);

    if (rc == NGX_DECLINED) {
        ngx_http_idempotency_too_large(r, ctx);
        return ngx_http_idempotency_next_header(r);
    }

    if (rc != NGX_OK) {
        ngx_http_idempotency_give_up(r, ctx);
        return NGX_ERROR;
    }

    ctx->capturing = 1;

    /* after the record's headers: the replay adds its own hints */

    if (ngx_http_idempotency_status_final(r->headers_out.status)
        && ngx_http_idempotency_owner_hints(r, ctx) != NGX_OK)
    {
        ngx_http_idempotency_give_up(r, ctx);
        return NGX_ERROR;
    }

    /*
     * file buffers are read into memory by the copy filter above us; the
     * range filter below us must not turn what we store into a 206
     */

    r->filter_need_in_memory = 1;
    r->allow_ranges = 0;

    rc = ngx_http_idempotency_next_header(r);

    if (rc == NGX_ERROR && ngx_http_idempotency_client_gone(r, ctx)) {
        rc = NGX_OK;
    }

    if (ctx->capturing && r->header_only) {
        /* no body will follow (204, HEAD) */
        ngx_http_idempotency_store(r, ctx);
    }

    return rc;
}


/*
 * The owner's response already is what its retries will get: the stored
 * 409, 429 or 5xx replayed, or outcome-unknown.  An upstream that gave
 * its own hint is not contradicted.
 */

static ngx_int_t
ngx_http_idempotency_owner_hints(ngx_http_request_t *r,
    ngx_http_idempotency_ctx_t *ctx)
{
    ngx_table_elt_t  *h;

    static ngx_str_t  x_should_retry = ngx_string("x-should-retry");

    if (ngx_http_idempotency_header_lines(&r->headers_out.headers,
                                          &x_should_retry, &h))
    {
        return NGX_OK;
    }

    return ngx_http_idempotency_retry_hints(r, ctx->conf, 0);
}


ngx_int_t
ngx_http_idempotency_body_filter(ngx_http_request_t *r, ngx_chain_t *in)
{
    ngx_int_t                    rc;
    ngx_buf_t                   *b;
    ngx_uint_t                   last;
    ngx_chain_t                 *cl;
    ngx_http_idempotency_ctx_t  *ctx;

    if (r != r->main) {
        return ngx_http_idempotency_next_body(r, in);
    }

    ctx = ngx_http_idempotency_get_ctx(r);

    if (ctx && ctx->problem.data) {
        return ngx_http_idempotency_problem_body(r, ctx, in);
    }

    if (ctx == NULL || !ctx->capturing) {
        return ngx_http_idempotency_next_body(r, in);
    }

    if (in == NULL && !ctx->gone) {
        return ngx_http_idempotency_next_body(r, in);
    }

    last = 0;

    for (cl = in; cl; cl = cl->next) {
        b = cl->buf;

        if (ngx_http_idempotency_capture(r, ctx, b) != NGX_OK) {
            break;
        }

        if (b->last_buf) {
            ngx_http_idempotency_store(r, ctx);
            last = 1;
            break;
        }
    }

    if (!ctx->gone) {
        rc = ngx_http_idempotency_next_body(r, in);

        if (rc != NGX_ERROR || !ngx_http_idempotency_client_gone(r, ctx)) {
            return rc;
        }
    }

    /* the client is gone: the upstream goes on for the record alone */

    ngx_http_idempotency_consume(r, in);

    return (ctx->capturing || last) ? NGX_OK : NGX_ERROR;
}


/*
 * nginx's own error page goes nowhere; the problem document the header
 * filter prepared goes in its place, with its last buffer
 */

static ngx_int_t
ngx_http_idempotency_problem_body(ngx_http_request_t *r,
    ngx_http_idempotency_ctx_t *ctx, ngx_chain_t *in)
{
    ngx_buf_t    *b;
    ngx_uint_t    last;
    ngx_chain_t  *cl, out;

    last = 0;

    for (cl = in; cl; cl = cl->next) {
        cl->buf->pos = cl->buf->last;

        if (cl->buf->in_file) {
            cl->buf->file_pos = cl->buf->file_last;
        }

        last |= cl->buf->last_buf;
    }

    if (!last) {
        return NGX_OK;
    }

    b = ngx_calloc_buf(r->pool);
    if (b == NULL) {
        return NGX_ERROR;
    }

    b->pos = ctx->problem.data;
    b->last = ctx->problem.data + ctx->problem.len;
    b->memory = 1;
    b->last_buf = 1;
    b->last_in_chain = 1;

    ngx_str_null(&ctx->problem);

    out.buf = b;
    out.next = NULL;

    return ngx_http_idempotency_next_body(r, &out);
}


/*
 * Idempotency-Expires: when the record, and the protection of the key with
 * it, ends.  A header of the response like any other, so it is stored and
 * a replay repeats the same date.
 */

static ngx_int_t
ngx_http_idempotency_expires(ngx_http_request_t *r,
    ngx_http_idempotency_loc_conf_t *conf)
{
    u_char           *p;
    ngx_table_elt_t  *h;

    p = ngx_pnalloc(r->pool, sizeof("Mon, 28 Sep 1970 06:00:00 GMT") - 1);
    if (p == NULL) {
        return NGX_ERROR;
    }

    h = ngx_list_push(&r->headers_out.headers);
    if (h == NULL) {
        return NGX_ERROR;
    }

    h->hash = 1;
    ngx_str_set(&h->key, "Idempotency-Expires");
    h->value.data = p;
    h->value.len = ngx_http_time(p, ngx_time() + (time_t) (conf->ttl / 1000))
                   - p;
    h->lowcase_key = NULL;

#if (nginx_version >= 1023000)
    h->next = NULL;
#endif

    return NGX_OK;
}


/*
 * The client is gone: what the write filter holds for it and what comes
 * now are consumed, so that the buffers above us (the copy filter's, the
 * upstream's) are free again and the response reaches its end.
 */

static void
ngx_http_idempotency_consume(ngx_http_request_t *r, ngx_chain_t *in)
{
    ngx_uint_t    i;
    ngx_chain_t  *cl;

    for (i = 0; i < 2; i++) {
        for (cl = i ? in : r->out; cl; cl = cl->next) {
            cl->buf->pos = cl->buf->last;

            if (cl->buf->in_file) {
                cl->buf->file_pos = cl->buf->file_last;
            }
        }
    }

    r->out = NULL;
    r->connection->buffered &= ~NGX_HTTP_WRITE_BUFFERED;
}


static ngx_int_t
ngx_http_idempotency_capture(ngx_http_request_t *r,
    ngx_http_idempotency_ctx_t *ctx, ngx_buf_t *b)
{
    ngx_int_t  rc;

    if (ngx_buf_special(b)) {
        return NGX_OK;
    }

    if (!ngx_buf_in_memory(b)) {
        ngx_log_error(NGX_LOG_ERR, r->connection->log, 0,
                      "idempotency: response body is not in memory, not "
                      "stored, key hash %*s",
                      (size_t) 2 * NGX_HTTP_IDEMPOTENCY_HASH_LEN,
                      ngx_http_idempotency_key_hash(ctx));
        ctx->capturing = 0;
        ngx_http_idempotency_give_up(r, ctx);
        return NGX_ERROR;
    }

    if (b->last == b->pos) {
        return NGX_OK;
    }

    rc = ngx_http_idempotency_builder_body(&ctx->capture, b->pos,
                                           b->last - b->pos);

    if (rc == NGX_OK) {
        return NGX_OK;
    }

    if (rc == NGX_DECLINED) {
        ngx_http_idempotency_too_large(r, ctx);
        return NGX_ERROR;
    }

    if (rc == NGX_ABORT) {
        ngx_log_error(NGX_LOG_ERR, r->connection->log, 0,
                      "idempotency: response body exceeds its "
                      "Content-Length, not stored, key hash %*s",
                      (size_t) 2 * NGX_HTTP_IDEMPOTENCY_HASH_LEN,
                      ngx_http_idempotency_key_hash(ctx));
    }

    ctx->capturing = 0;
    ngx_http_idempotency_give_up(r, ctx);

    return NGX_ERROR;
}


/*
 * The response ended (its last buffer, or its header for a response
 * without a body): its trailers, if any, and the record to the claim,
 * which seals it if keys are set
 */

static void
ngx_http_idempotency_store(ngx_http_request_t *r,
    ngx_http_idempotency_ctx_t *ctx)
{
    u_char                          *value;
    size_t                           len;
    ngx_int_t                        rc;
    ngx_http_idempotency_builder_t  *bd;

    bd = &ctx->capture;
    ctx->capturing = 0;

    /* the upstream's trailers (grpc_pass) are in place with the last buf */

    if (ngx_http_idempotency_capture_trailers(r, ctx->conf, bd) != NGX_OK) {
        ngx_http_idempotency_give_up(r, ctx);
        return;
    }

    rc = ngx_http_idempotency_builder_end(bd, r->header_only, &value, &len);

    if (rc == NGX_DECLINED) {
        ngx_http_idempotency_too_large(r, ctx);
        return;
    }

    if (rc == NGX_ABORT) {
        ngx_log_error(NGX_LOG_WARN, r->connection->log, 0,
                      "idempotency: response body truncated "
                      "(%uz of %O bytes), not stored",
                      bd->body_len, bd->expected);
    }

    if (rc != NGX_OK
        || ngx_http_idempotency_claim_store(ctx->claim, value, len) != NGX_OK)
    {
        ngx_http_idempotency_give_up(r, ctx);
    }
}


static void
ngx_http_idempotency_too_large(ngx_http_request_t *r,
    ngx_http_idempotency_ctx_t *ctx)
{
    ctx->capturing = 0;

    ngx_log_error(NGX_LOG_WARN, r->connection->log, 0,
                  "idempotency: response larger than "
                  "idempotency_store_max_size %uz, stored as too large",
                  ctx->conf->store_max_size);

    if (ngx_http_idempotency_claim_too_large(ctx->claim,
                                             r->headers_out.status)
        != NGX_OK)
    {
        ngx_http_idempotency_give_up(r, ctx);
    }
}


/*
 * Default policy: 2xx 3xx 4xx 5xx except 408, 425, 429 and 503, the
 * answers that say "nothing happened, try later"; those are stored only
 * when listed explicitly.  206 and 304 depend on the client's request
 * headers and are never stored.
 */

static ngx_uint_t
ngx_http_idempotency_store_status_ok(ngx_http_idempotency_loc_conf_t *conf,
    ngx_uint_t status)
{
    ngx_uint_t   i, *codes, cls;

    if (status == NGX_HTTP_PARTIAL_CONTENT
        || status == NGX_HTTP_NOT_MODIFIED
        || status < 200 || status > 599)
    {
        return 0;
    }

    cls = status / 100;

    if (conf->store_status == NULL) {
        /* an upstream's 500 after it may have committed is an answer */
        if (status == 408 || status == 425 || status == 429
            || status == NGX_HTTP_SERVICE_UNAVAILABLE)
        {
            return 0;
        }

        return cls >= 2 && cls <= 5;
    }

    codes = conf->store_status->elts;

    for (i = 0; i < conf->store_status->nelts; i++) {
        if (codes[i] == status) {
            return 1;
        }
    }

    /* "nothing happened, try later": only when named */
    if (status == 408 || status == 425 || status == 429
        || status == NGX_HTTP_SERVICE_UNAVAILABLE)
    {
        return 0;
    }

    for (i = 0; i < conf->store_status->nelts; i++) {
        if (codes[i] == cls) {
            return 1;
        }
    }

    return 0;
}
