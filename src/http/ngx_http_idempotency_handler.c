
/*
 * Copyright (C) The ngx_http_idempotency_module authors
 *
 * The precontent phase handler: key, body fingerprint, one claim round trip,
 * and the decision.  The handler re-enters on every wake-up and only reads
 * ctx->state, so spurious wake-ups are harmless.
 */


#include "ngx_http_idempotency_http.h"


static ngx_http_idempotency_ctx_t *ngx_http_idempotency_redirected(
    ngx_http_request_t *r);
static ngx_int_t ngx_http_idempotency_start(ngx_http_request_t *r,
    ngx_http_idempotency_loc_conf_t *conf);
static ngx_int_t ngx_http_idempotency_header_key(ngx_http_request_t *r,
    ngx_http_idempotency_loc_conf_t *conf,
    ngx_http_idempotency_ctx_t **ctxp);
static ngx_int_t ngx_http_idempotency_get_key(ngx_http_request_t *r,
    ngx_http_idempotency_loc_conf_t *conf, ngx_str_t *key);
static ngx_http_idempotency_ctx_t *ngx_http_idempotency_create_ctx(
    ngx_http_request_t *r, ngx_http_idempotency_loc_conf_t *conf);
static void ngx_http_idempotency_body_handler(ngx_http_request_t *r);
static void ngx_http_idempotency_claim_setup(ngx_http_request_t *r,
    ngx_http_idempotency_ctx_t *ctx);
static ngx_int_t ngx_http_idempotency_claim(ngx_http_request_t *r,
    ngx_http_idempotency_ctx_t *ctx);
static void ngx_http_idempotency_claimed(ngx_http_idempotency_claim_t *c,
    ngx_uint_t answer);
static u_char *ngx_http_idempotency_describe(void *data, u_char *buf);
static ngx_int_t ngx_http_idempotency_previous_outcome(ngx_http_request_t *r);
static ngx_int_t ngx_http_idempotency_act(ngx_http_request_t *r,
    ngx_http_idempotency_ctx_t *ctx);
static void ngx_http_idempotency_suspend(ngx_http_request_t *r);


static ngx_str_t  ngx_http_idempotency_header = ngx_string("idempotency-key");


ngx_int_t
ngx_http_idempotency_handler(ngx_http_request_t *r)
{
    ngx_http_idempotency_ctx_t       *ctx;
    ngx_http_idempotency_loc_conf_t  *conf;

    if (r != r->main) {
        return NGX_DECLINED;
    }

    ctx = ngx_http_get_module_ctx(r, ngx_http_idempotency_module);

    if (ctx == NULL && r->internal) {
        ctx = ngx_http_idempotency_redirected(r);
    }

    if (ctx == NULL) {
        conf = ngx_http_get_module_loc_conf(r, ngx_http_idempotency_module);

        if (!conf->enable || !(r->method & conf->methods)) {
            return NGX_DECLINED;
        }

        /*
         * An error page (access refused, a body that failed, a 404 sent
         * to a named location) answers for a request that did not run:
         * it never starts an execution of its own.  "error_page 403 =
         * @named" clears err_status, but not error_page.
         */

        if (r->err_status || r->error_page) {
            ngx_log_debug1(NGX_LOG_DEBUG_HTTP, r->connection->log, 0,
                           "idempotency: error page %ui, not protected",
                           r->err_status);
            return NGX_DECLINED;
        }

        return ngx_http_idempotency_start(r, conf);
    }

    switch (ctx->state) {

    case NGX_HTTP_IDEMPOTENCY_ST_BODY_DONE:
        return ngx_http_idempotency_claim(r, ctx);

    case NGX_HTTP_IDEMPOTENCY_ST_DECIDED:
        return ngx_http_idempotency_act(r, ctx);

    case NGX_HTTP_IDEMPOTENCY_ST_READING_BODY:
    case NGX_HTTP_IDEMPOTENCY_ST_WAITING_REDIS:
        return NGX_AGAIN;

    default: /* NGX_HTTP_IDEMPOTENCY_ST_DONE */
        return NGX_DECLINED;
    }
}


/*
 * An internal redirect (error_page, try_files, rewrite ... last,
 * X-Accel-Redirect, a named location) clears r->ctx, and the request is
 * judged by the location it is in now.  Only a claim already won
 * carries over: it is finished by whatever response the request ends
 * with, under the rules of the location that claimed.
 */

static ngx_http_idempotency_ctx_t *
ngx_http_idempotency_redirected(ngx_http_request_t *r)
{
    ngx_http_idempotency_ctx_t  *ctx;

    ctx = ngx_http_idempotency_get_ctx(r);

    if (ctx == NULL) {
        return NULL;
    }

    if (!ctx->owner) {
        /* a body that failed left its handler waiting: nothing waits now */
        ngx_http_idempotency_abandon(ctx);
        return NULL;
    }

    ngx_http_set_ctx(r, ctx, ngx_http_idempotency_module);

    return ctx;
}


static ngx_int_t
ngx_http_idempotency_start(ngx_http_request_t *r,
    ngx_http_idempotency_loc_conf_t *conf)
{
    ngx_int_t                    rc;
    ngx_http_idempotency_ctx_t  *ctx;

    ctx = NULL;

    if (conf->json_pointer) {
        /* the key is in the body: known once the body has been read */

        ctx = ngx_http_idempotency_create_ctx(r, conf);
        if (ctx == NULL
            || ngx_http_idempotency_body_key_start(r, ctx) != NGX_OK)
        {
            return NGX_HTTP_INTERNAL_SERVER_ERROR;
        }

    } else {
        rc = ngx_http_idempotency_header_key(r, conf, &ctx);
        if (rc != NGX_OK) {
            return rc;
        }
    }

    ctx->claim = ngx_http_idempotency_claim_create(r->pool,
                                                   r->connection->log);
    if (ctx->claim == NULL
        || ngx_http_idempotency_fingerprint_start(r, ctx) != NGX_OK)
    {
        return NGX_HTTP_INTERNAL_SERVER_ERROR;
    }

    /* a body another module already read was not seen by our filter */

    if (r->request_body
        && ngx_http_idempotency_fingerprint_update(ctx, r->request_body->bufs)
           != NGX_OK)
    {
        ngx_log_error(NGX_LOG_ERR, r->connection->log, 0,
                      "idempotency: the request body was read to a file "
                      "before the idempotency phase, cannot fingerprint it");
        return NGX_HTTP_INTERNAL_SERVER_ERROR;
    }

    /* until the body is read, a failure is the client's (400, 413, 408) */
    ctx->status = NGX_HTTP_IDEMPOTENCY_INVALID;
    ctx->state = NGX_HTTP_IDEMPOTENCY_ST_READING_BODY;

    rc = ngx_http_read_client_request_body(r,
                                           ngx_http_idempotency_body_handler);

    if (rc >= NGX_HTTP_SPECIAL_RESPONSE) {
        ctx->state = NGX_HTTP_IDEMPOTENCY_ST_DONE;
        return rc;
    }

    ngx_http_finalize_request(r, NGX_DONE);

    return NGX_DONE;
}


/*
 * The key of the Idempotency-Key header or of idempotency_key, checked,
 * and the record key made of it.  NGX_OK: *ctxp is the request's ctx;
 * else what the phase handler returns: NGX_DECLINED, no key and none
 * required; an answer sent (the key refused) or an error.
 */

static ngx_int_t
ngx_http_idempotency_header_key(ngx_http_request_t *r,
    ngx_http_idempotency_loc_conf_t *conf, ngx_http_idempotency_ctx_t **ctxp)
{
    ngx_int_t                    rc;
    ngx_str_t                    raw, key;
    ngx_http_idempotency_ctx_t  *ctx;

    rc = ngx_http_idempotency_get_key(r, conf, &raw);

    if (rc == NGX_DECLINED && !conf->required) {
        return NGX_DECLINED;
    }

    if (rc == NGX_ERROR && raw.data == NULL) {
        return NGX_HTTP_INTERNAL_SERVER_ERROR;
    }

    ctx = ngx_http_idempotency_create_ctx(r, conf);
    if (ctx == NULL) {
        return NGX_HTTP_INTERNAL_SERVER_ERROR;
    }

    if (rc == NGX_DECLINED) {
        ngx_log_error(NGX_LOG_INFO, r->connection->log, 0,
                      "idempotency: request without a key rejected");
        return ngx_http_idempotency_reject(r, ctx,
                                        NGX_HTTP_IDEMPOTENCY_MISSING,
                                        NGX_HTTP_IDEMPOTENCY_PROBLEM_MISSING);
    }

    key.data = ngx_pnalloc(r->pool, raw.len + 1);
    if (key.data == NULL) {
        return NGX_HTTP_INTERNAL_SERVER_ERROR;
    }

    if (rc == NGX_ERROR
        || ngx_http_idempotency_parse_key(&raw, &key, conf->key_max_length)
           != NGX_OK)
    {
        return ngx_http_idempotency_invalid_key(r, ctx, rc, &raw, &key);
    }

    rc = ngx_http_idempotency_key_allowed(r, ctx, &raw, &key);
    if (rc != NGX_OK) {
        return rc;
    }

    *ctxp = ctx;

    return NGX_OK;
}


/*
 * A key of the right syntax, from the header or the body: the API's own
 * rule (idempotency_key_pattern), then the record key.  NGX_OK, or what
 * the phase handler returns.
 */

ngx_int_t
ngx_http_idempotency_key_allowed(ngx_http_request_t *r,
    ngx_http_idempotency_ctx_t *ctx, ngx_str_t *raw, ngx_str_t *key)
{
#if (NGX_PCRE)
    ngx_int_t                         rc;
    ngx_http_idempotency_loc_conf_t  *conf;

    conf = ctx->conf;

    if (conf->key_pattern) {
        rc = ngx_regex_exec(conf->key_pattern->regex, key, NULL, 0);

        if (rc == NGX_REGEX_NO_MATCHED) {
            return ngx_http_idempotency_invalid_key(r, ctx, NGX_DECLINED,
                                                    raw, key);
        }

        if (rc < 0) {
            ngx_log_error(NGX_LOG_ALERT, r->connection->log, 0,
                          ngx_regex_exec_n " failed: %i on the key, "
                          "idempotency_key_pattern \"%V\"", rc,
                          &conf->key_pattern->text);
            return NGX_HTTP_INTERNAL_SERVER_ERROR;
        }
    }

#endif

    if (ngx_http_idempotency_record_key(r, ctx, key) != NGX_OK) {
        return NGX_HTTP_INTERNAL_SERVER_ERROR;
    }

    return NGX_OK;
}


/*
 * NGX_OK: raw holds the value; NGX_DECLINED: no key; NGX_ERROR with
 * raw.data set: several header lines; with raw.data NULL: internal error.
 */

static ngx_int_t
ngx_http_idempotency_get_key(ngx_http_request_t *r,
    ngx_http_idempotency_loc_conf_t *conf, ngx_str_t *key)
{
    ngx_uint_t        n;
    ngx_table_elt_t  *h;

    ngx_str_null(key);

    if (conf->key) {
        if (ngx_http_complex_value(r, conf->key, key) != NGX_OK) {
            return NGX_ERROR;
        }

        return key->len ? NGX_OK : NGX_DECLINED;
    }

    /* the header itself, so that repeated field lines can be refused */

    n = ngx_http_idempotency_header_lines(&r->headers_in.headers,
                                          &ngx_http_idempotency_header, &h);
    if (n) {
        *key = h->value;
    }

    if (n > 1) {
        return NGX_ERROR;
    }

    return n ? NGX_OK : NGX_DECLINED;
}


/* how many lines of a header name a list holds; *last: the last of them */

ngx_uint_t
ngx_http_idempotency_header_lines(ngx_list_t *headers, ngx_str_t *name,
    ngx_table_elt_t **last)
{
    ngx_uint_t        i, n;
    ngx_list_part_t  *part;
    ngx_table_elt_t  *h;

    n = 0;
    part = &headers->part;
    h = part->elts;

    for (i = 0; /* void */ ; i++) {

        if (i >= part->nelts) {
            if (part->next == NULL) {
                break;
            }

            part = part->next;
            h = part->elts;
            i = 0;
        }

        if (h[i].hash != 0
            && h[i].key.len == name->len
            && ngx_strncasecmp(h[i].key.data, name->data, name->len) == 0)
        {
            *last = &h[i];
            n++;
        }
    }

    return n;
}


static ngx_http_idempotency_ctx_t *
ngx_http_idempotency_create_ctx(ngx_http_request_t *r,
    ngx_http_idempotency_loc_conf_t *conf)
{
    ngx_pool_cleanup_t          *cln;
    ngx_http_idempotency_ctx_t  *ctx;

    ctx = ngx_pcalloc(r->pool, sizeof(ngx_http_idempotency_ctx_t));
    if (ctx == NULL) {
        return NULL;
    }

    cln = ngx_pool_cleanup_add(r->pool, 0);
    if (cln == NULL) {
        return NULL;
    }

    cln->handler = ngx_http_idempotency_cleanup;
    cln->data = ctx;

    ctx->request = r;
    ctx->request_line = r->request_line;
    ctx->conf = conf;
    ctx->redis = conf->redis;

    ngx_http_set_ctx(r, ctx, ngx_http_idempotency_module);

    return ctx;
}


static void
ngx_http_idempotency_body_handler(ngx_http_request_t *r)
{
    ngx_http_idempotency_ctx_t  *ctx;

    ctx = ngx_http_get_module_ctx(r, ngx_http_idempotency_module);

    if (ngx_http_idempotency_fingerprint_finish(ctx) != NGX_OK) {
        ngx_http_finalize_request(r, NGX_HTTP_INTERNAL_SERVER_ERROR);
        return;
    }

    ctx->state = NGX_HTTP_IDEMPOTENCY_ST_BODY_DONE;

    /* a request with a key is never "bypass", even if its client leaves */
    ctx->status = NGX_HTTP_IDEMPOTENCY_CONFLICT;

    r->write_event_handler = ngx_http_core_run_phases;
    ngx_http_core_run_phases(r);
}


/* what the claim is, from the location that claims */

static void
ngx_http_idempotency_claim_setup(ngx_http_request_t *r,
    ngx_http_idempotency_ctx_t *ctx)
{
    ngx_http_idempotency_claim_t  *c;

    c = ctx->claim;

    c->conf = &ctx->conf->claim;
    c->rkey = ctx->rkey;
    c->handler = ngx_http_idempotency_claimed;
    c->describe = ngx_http_idempotency_describe;
    c->data = ctx;
}


static u_char *
ngx_http_idempotency_describe(void *data, u_char *buf)
{
    return ngx_http_idempotency_request_info(data, buf);
}


/* one round trip: create the claim, or get the record that is there */

static ngx_int_t
ngx_http_idempotency_claim(ngx_http_request_t *r,
    ngx_http_idempotency_ctx_t *ctx)
{
    ngx_int_t  rc;

    if (ctx->json) {
        rc = ngx_http_idempotency_body_key_end(r, ctx);
        if (rc != NGX_OK) {
            return rc;
        }
    }

    ngx_http_idempotency_claim_setup(r, ctx);

    if (ngx_http_idempotency_claim_start(ctx->claim) != NGX_AGAIN) {
        ctx->decision = NGX_HTTP_IDEMPOTENCY_ANSWER_ERROR;
        ctx->state = NGX_HTTP_IDEMPOTENCY_ST_DECIDED;

        return ngx_http_idempotency_act(r, ctx);
    }

    ctx->state = NGX_HTTP_IDEMPOTENCY_ST_WAITING_REDIS;

    ngx_http_idempotency_fresh_send(r, ctx);
    ngx_http_idempotency_suspend(r);

    return NGX_AGAIN;
}


/* the claim's one answer: the request goes on from it */

static void
ngx_http_idempotency_claimed(ngx_http_idempotency_claim_t *c,
    ngx_uint_t answer)
{
    ngx_http_idempotency_ctx_t *ctx = c->data;

    ctx->decision = answer;
    ctx->state = NGX_HTTP_IDEMPOTENCY_ST_DECIDED;

    ngx_http_idempotency_wake(ctx->request);
}


/* forward: the upstream learns that this key may have run before */

static ngx_int_t
ngx_http_idempotency_previous_outcome(ngx_http_request_t *r)
{
    ngx_table_elt_t  *h;

    h = ngx_list_push(&r->headers_in.headers);
    if (h == NULL) {
        return NGX_ERROR;
    }

    ngx_str_set(&h->key, "Idempotency-Previous-Outcome");
    ngx_str_set(&h->value, "unknown");
    h->lowcase_key = (u_char *) "idempotency-previous-outcome";
    h->hash = ngx_hash_key(h->lowcase_key, h->key.len);

#if (nginx_version >= 1023000)
    h->next = NULL;
#endif

    return NGX_OK;
}


static ngx_int_t
ngx_http_idempotency_act(ngx_http_request_t *r,
    ngx_http_idempotency_ctx_t *ctx)
{
    ngx_http_idempotency_loc_conf_t  *conf;

    conf = ctx->conf;

    switch (ctx->decision) {

    case NGX_HTTP_IDEMPOTENCY_ANSWER_NEW:
        ctx->owner = 1;
        ctx->status = NGX_HTTP_IDEMPOTENCY_NEW;
        ctx->state = NGX_HTTP_IDEMPOTENCY_ST_DONE;

        /* the not_modified filter runs above ours: never store a 304 */
        r->disable_not_modified = 1;

        if (ctx->claim->took_over
            && ngx_http_idempotency_previous_outcome(r) != NGX_OK)
        {
            return NGX_HTTP_INTERNAL_SERVER_ERROR;
        }

        ngx_http_idempotency_keep_upstream(r, ctx);
        ngx_http_idempotency_outcome_start(r, ctx);
        ngx_http_idempotency_fresh_report(r, ctx);

        return NGX_DECLINED;

    case NGX_HTTP_IDEMPOTENCY_ANSWER_UNKNOWN:
        return ngx_http_idempotency_reject(r, ctx,
                                        NGX_HTTP_IDEMPOTENCY_UNKNOWN,
                                        NGX_HTTP_IDEMPOTENCY_PROBLEM_UNKNOWN);

    case NGX_HTTP_IDEMPOTENCY_ANSWER_REPLAY:
        ctx->status = NGX_HTTP_IDEMPOTENCY_REPLAY;
        ctx->state = NGX_HTTP_IDEMPOTENCY_ST_DONE;

        if (conf->dry_run) {
            return NGX_DECLINED;
        }

        return ngx_http_idempotency_send_replay(r, conf, &ctx->claim->record);

    case NGX_HTTP_IDEMPOTENCY_ANSWER_CONFLICT:
        /* the claim waited for it already, within idempotency_wait */
        return ngx_http_idempotency_reject(r, ctx,
                                        NGX_HTTP_IDEMPOTENCY_CONFLICT,
                                        NGX_HTTP_IDEMPOTENCY_PROBLEM_CONFLICT);

    case NGX_HTTP_IDEMPOTENCY_ANSWER_TOO_LARGE:
        return ngx_http_idempotency_reject(r, ctx,
                                        NGX_HTTP_IDEMPOTENCY_CONFLICT,
                                        NGX_HTTP_IDEMPOTENCY_PROBLEM_TOO_LARGE);

    case NGX_HTTP_IDEMPOTENCY_ANSWER_MISMATCH:
        return ngx_http_idempotency_reject(r, ctx,
                                        NGX_HTTP_IDEMPOTENCY_MISMATCH,
                                        NGX_HTTP_IDEMPOTENCY_PROBLEM_MISMATCH);

    default: /* NGX_HTTP_IDEMPOTENCY_ANSWER_ERROR */

        if (conf->on_redis_error == NGX_HTTP_IDEMPOTENCY_ON_ERROR_PASS) {
            ctx->status = NGX_HTTP_IDEMPOTENCY_ERROR;
            ctx->state = NGX_HTTP_IDEMPOTENCY_ST_DONE;
            return NGX_DECLINED;
        }

        return ngx_http_idempotency_reject(r, ctx,
                                    NGX_HTTP_IDEMPOTENCY_ERROR,
                                    NGX_HTTP_IDEMPOTENCY_PROBLEM_UNAVAILABLE);
    }
}


/* the claim is the store's until it answers; a client abort ends it */

static void
ngx_http_idempotency_suspend(ngx_http_request_t *r)
{
    r->read_event_handler = ngx_http_test_reading;
    r->write_event_handler = ngx_http_request_empty_handler;
}


void
ngx_http_idempotency_wake(ngx_http_request_t *r)
{
    ngx_connection_t  *c;

    c = r->connection;

    ngx_http_set_log_request(c->log, r);

    r->read_event_handler = ngx_http_block_reading;
    r->write_event_handler = ngx_http_core_run_phases;

    ngx_http_core_run_phases(r);
    ngx_http_run_posted_requests(c);
}
