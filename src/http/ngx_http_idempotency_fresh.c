
/*
 * Copyright (C) The ngx_http_idempotency_module authors
 *
 * idempotency_fresh_key_detect: the client that makes a new key per
 * attempt instead of one per operation.  No server can see it from the
 * key alone; it can see the same request under two keys.  With each first
 * claim of a request, pipelined behind it, goes
 *
 *   SET <prefix>{hex SHA-256(scope NUL fingerprint)}:f <key hash> NX GET PX t
 *
 * (HMAC-SHA-256 with idempotency_key_secret, as record names: hash.c),
 * which remembers, for the detection window, which key first carried this
 * exact request (scope, method, URI, body), and answers the key that did.
 * A fresh claim whose request another key carried is counted and logged;
 * it still runs (two identical payments can be meant).
 */


#include "ngx_http_idempotency_http.h"


static void ngx_http_idempotency_fresh_done(void *data, u_char *first);


char *
ngx_http_idempotency_fresh_key_detect_directive(ngx_conf_t *cf,
    ngx_command_t *cmd, void *conf)
{
    ngx_http_idempotency_loc_conf_t *ilcf = conf;

    ngx_str_t   *value;
    ngx_msec_t   t;

    if (ilcf->fresh_detect != NGX_CONF_UNSET_MSEC) {
        return "is duplicate";
    }

    value = cf->args->elts;

    if (value[1].len == 3 && ngx_strncmp(value[1].data, "off", 3) == 0) {
        ilcf->fresh_detect = 0;
        return NGX_CONF_OK;
    }

    t = ngx_parse_time(&value[1], 0);

    if (t == (ngx_msec_t) NGX_ERROR || t == 0) {
        return "expects \"off\" or a time such as 10m";
    }

    ilcf->fresh_detect = t;

    return NGX_CONF_OK;
}


/* with the request's first claim; its scope is kept for it by hash.c */

void
ngx_http_idempotency_fresh_send(ngx_http_request_t *r,
    ngx_http_idempotency_ctx_t *ctx)
{
    u_char  hash[EVP_MAX_MD_SIZE];

    if (ctx->conf->fresh_detect == 0 || ctx->fresh_sent) {
        return;
    }

    ctx->fresh_sent = 1;

    /* the request itself, whatever key it came with */

    if (ngx_http_idempotency_request_hash(ctx, hash) != NGX_OK) {
        return;
    }

    ctx->fresh_op = ngx_http_idempotency_seen_send(ctx->redis,
                                         &ctx->conf->prefix, hash,
                                         ngx_http_idempotency_key_hash(ctx),
                                         ctx->conf->fresh_detect,
                                         ngx_http_idempotency_fresh_done, ctx);
}


/* the store tells which key carried this request first, if one did */

static void
ngx_http_idempotency_fresh_done(void *data, u_char *first)
{
    ngx_http_idempotency_ctx_t *ctx = data;

    ctx->fresh_op = NULL;

    if (first == NULL
        || ngx_memcmp(first, ngx_http_idempotency_key_hash(ctx),
                      NGX_HTTP_IDEMPOTENCY_HEX_LEN)
           == 0)
    {
        /* the first key of this request, its own retry, or no answer */
        return;
    }

    ngx_memcpy(ctx->fresh_other, first, NGX_HTTP_IDEMPOTENCY_HEX_LEN);
    ctx->fresh_seen = 1;

    ngx_http_idempotency_fresh_report(ctx->request, ctx);
}


/* once both are known: this request became the owner of a fresh key */

void
ngx_http_idempotency_fresh_report(ngx_http_request_t *r,
    ngx_http_idempotency_ctx_t *ctx)
{
    if (!ctx->fresh_seen || !ctx->owner || ctx->fresh_reported) {
        return;
    }

    ctx->fresh_reported = 1;

    ngx_http_idempotency_metrics_fresh_key();

    ngx_log_error(NGX_LOG_WARN, r->connection->log, 0,
                  "idempotency: the same request came with another key "
                  "within idempotency_fresh_key_detect: a client that makes "
                  "a new key per attempt? key hash %*s, the other key hash "
                  "%*s", (size_t) NGX_HTTP_IDEMPOTENCY_HEX_LEN,
                  ngx_http_idempotency_key_hash(ctx),
                  (size_t) NGX_HTTP_IDEMPOTENCY_HEX_LEN, ctx->fresh_other);
}


/* the request ends: its answer, if any, no longer finds it */

void
ngx_http_idempotency_fresh_detach(ngx_http_idempotency_ctx_t *ctx)
{
    if (ctx->fresh_op) {
        ctx->fresh_op->data = NULL;
        ctx->fresh_op = NULL;
    }
}
