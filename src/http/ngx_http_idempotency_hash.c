
/*
 * Copyright (C) The ngx_http_idempotency_module authors
 *
 * The record key and the request fingerprint.
 */


#include "ngx_http_idempotency_http.h"


#define NGX_HTTP_IDEMPOTENCY_MD_CACHE  32


static EVP_MD       *ngx_http_idempotency_sha256;
static EVP_MD_CTX   *ngx_http_idempotency_md_free;  /* one spare context */

/* digest contexts of finished requests, initialised again by the next */
static EVP_MD_CTX  *ngx_http_idempotency_md_cache[
                                               NGX_HTTP_IDEMPOTENCY_MD_CACHE];
static ngx_uint_t   ngx_http_idempotency_md_cached;


/* the next request body filter, set where the module's joins the chain */
ngx_http_request_body_filter_pt   ngx_http_idempotency_next_request_body;


ngx_int_t
ngx_http_idempotency_hash_init(ngx_cycle_t *cycle)
{
    if (ngx_http_idempotency_sha256 == NULL) {
        ngx_http_idempotency_sha256 = EVP_MD_fetch(NULL, "SHA256", NULL);
        if (ngx_http_idempotency_sha256 == NULL) {
            ngx_log_error(NGX_LOG_EMERG, cycle->log, 0,
                          "idempotency: EVP_MD_fetch(SHA256) failed");
            return NGX_ERROR;
        }
    }

    return NGX_OK;
}


void
ngx_http_idempotency_hash_done(void)
{
    while (ngx_http_idempotency_md_cached) {
        EVP_MD_CTX_free(
            ngx_http_idempotency_md_cache[--ngx_http_idempotency_md_cached]);
    }

    if (ngx_http_idempotency_md_free) {
        EVP_MD_CTX_free(ngx_http_idempotency_md_free);
        ngx_http_idempotency_md_free = NULL;
    }

    if (ngx_http_idempotency_sha256) {
        EVP_MD_free(ngx_http_idempotency_sha256);
        ngx_http_idempotency_sha256 = NULL;
    }
}


/*
 * <prefix>{hex(SHA-256(scope NUL key))}, or HMAC-SHA-256 with
 * idempotency_key_secret: client text never reaches Redis
 */

ngx_int_t
ngx_http_idempotency_record_key(ngx_http_request_t *r,
    ngx_http_idempotency_ctx_t *ctx, ngx_str_t *key)
{
    ngx_str_t  scope;

    ngx_str_null(&scope);

    if (ctx->conf->scope
        && ngx_http_complex_value(r, ctx->conf->scope, &scope) != NGX_OK)
    {
        return NGX_ERROR;
    }

    ctx->scope = scope;

    return ngx_http_idempotency_key_name(r, ctx, &scope, key);
}


/*
 * SHA-256(scope NUL fingerprint): the request, whatever key it came with
 * (fresh.c); the scope was kept by record_key().  The fingerprint is clear
 * in every record's head, so with idempotency_key_secret this is the HMAC,
 * as record names are: else a reader of Redis could test guessed scopes
 * against the name of the :f record.
 */

ngx_int_t
ngx_http_idempotency_request_hash(ngx_http_idempotency_ctx_t *ctx,
    u_char *hash)
{
    ngx_str_t      fingerprint;
    unsigned int   len;
    EVP_MD_CTX    *md;

    md = ngx_http_idempotency_md_free;
    if (md == NULL) {
        md = EVP_MD_CTX_new();
        if (md == NULL) {
            return NGX_ERROR;
        }

        ngx_http_idempotency_md_free = md;
    }

    fingerprint.data = ctx->fingerprint;
    fingerprint.len = NGX_HTTP_IDEMPOTENCY_HASH_LEN;

    if (ctx->conf->secret) {
        return ngx_http_idempotency_secret_hash(ctx->conf->secret, md,
                                                &ctx->scope, &fingerprint,
                                                hash);
    }

    if (EVP_DigestInit_ex(md, ngx_http_idempotency_sha256, NULL) != 1
        || EVP_DigestUpdate(md, ctx->scope.data, ctx->scope.len) != 1
        || EVP_DigestUpdate(md, "", 1) != 1
        || EVP_DigestUpdate(md, fingerprint.data, fingerprint.len) != 1
        || EVP_DigestFinal_ex(md, hash, &len) != 1)
    {
        return NGX_ERROR;
    }

    return NGX_OK;
}


/* the record key of a scope and a decoded key, into ctx->rkey */

ngx_int_t
ngx_http_idempotency_key_name(ngx_http_request_t *r,
    ngx_http_idempotency_ctx_t *ctx, ngx_str_t *scope, ngx_str_t *key)
{
    u_char                           *p;
    u_char                            hash[EVP_MAX_MD_SIZE];
    unsigned int                      len;
    EVP_MD_CTX                       *md;
    ngx_http_idempotency_loc_conf_t  *conf;

    conf = ctx->conf;

    md = ngx_http_idempotency_md_free;
    if (md == NULL) {
        md = EVP_MD_CTX_new();
        if (md == NULL) {
            return NGX_ERROR;
        }

        ngx_http_idempotency_md_free = md;
    }

    if (conf->secret) {
        if (ngx_http_idempotency_secret_hash(conf->secret, md, scope, key,
                                             hash)
            != NGX_OK)
        {
            return NGX_ERROR;
        }

    } else if (EVP_DigestInit_ex(md, ngx_http_idempotency_sha256, NULL) != 1
               || EVP_DigestUpdate(md, scope->data, scope->len) != 1
               || EVP_DigestUpdate(md, "", 1) != 1
               || EVP_DigestUpdate(md, key->data, key->len) != 1
               || EVP_DigestFinal_ex(md, hash, &len) != 1)
    {
        return NGX_ERROR;
    }

    ctx->rkey.len = conf->prefix.len + 2 + 2 * NGX_HTTP_IDEMPOTENCY_HASH_LEN;
    ctx->rkey.data = ngx_pnalloc(r->pool, ctx->rkey.len);
    if (ctx->rkey.data == NULL) {
        return NGX_ERROR;
    }

    p = ngx_cpymem(ctx->rkey.data, conf->prefix.data, conf->prefix.len);
    *p++ = '{';
    p = ngx_hex_dump(p, hash, NGX_HTTP_IDEMPOTENCY_HASH_LEN);
    *p = '}';

    return NGX_OK;
}


/*
 * the fingerprint: SHA-256 over method, request URI and the raw body; the
 * body's bytes go to the scanner of a key in the body as well (body_key.c)
 */

ngx_int_t
ngx_http_idempotency_fingerprint_start(ngx_http_request_t *r,
    ngx_http_idempotency_ctx_t *ctx)
{
    if (ngx_http_idempotency_md_cached) {
        ctx->md =
            ngx_http_idempotency_md_cache[--ngx_http_idempotency_md_cached];

    } else {
        ctx->md = EVP_MD_CTX_new();
        if (ctx->md == NULL) {
            return NGX_ERROR;
        }
    }

    if (EVP_DigestInit_ex(ctx->md, ngx_http_idempotency_sha256, NULL) != 1
        || EVP_DigestUpdate(ctx->md, r->method_name.data,
                            r->method_name.len) != 1
        || EVP_DigestUpdate(ctx->md, "\n", 1) != 1
        || EVP_DigestUpdate(ctx->md, r->unparsed_uri.data,
                            r->unparsed_uri.len) != 1
        || EVP_DigestUpdate(ctx->md, "\n", 1) != 1)
    {
        return NGX_ERROR;
    }

    ctx->hashing = 1;

    return NGX_OK;
}


ngx_int_t
ngx_http_idempotency_fingerprint_update(ngx_http_idempotency_ctx_t *ctx,
    ngx_chain_t *in)
{
    ngx_buf_t  *b;

    for ( /* void */ ; in; in = in->next) {
        b = in->buf;

        if (ngx_buf_special(b)) {
            continue;
        }

        if (!ngx_buf_in_memory(b)) {
            /* a body we did not see arrive: refuse rather than guess */
            return NGX_ERROR;
        }

        if (EVP_DigestUpdate(ctx->md, b->pos, b->last - b->pos) != 1) {
            return NGX_ERROR;
        }

        if (ctx->json) {
            ngx_http_idempotency_json_feed(ctx->json, b->pos, b->last);
        }
    }

    return NGX_OK;
}


ngx_int_t
ngx_http_idempotency_fingerprint_finish(ngx_http_idempotency_ctx_t *ctx)
{
    unsigned int  len;

    if (EVP_DigestFinal_ex(ctx->md, ctx->fingerprint, &len) != 1) {
        return NGX_ERROR;
    }

    ngx_http_idempotency_fingerprint_free(ctx);

    /* the claim: the head, with this body's fingerprint and a new owner */

    ngx_http_idempotency_claim_head(ctx->claim, ctx->fingerprint);

    return NGX_OK;
}


void
ngx_http_idempotency_fingerprint_free(ngx_http_idempotency_ctx_t *ctx)
{
    if (ctx->md == NULL) {
        return;
    }

    if (ngx_http_idempotency_md_cached < NGX_HTTP_IDEMPOTENCY_MD_CACHE) {
        ngx_http_idempotency_md_cache[ngx_http_idempotency_md_cached++] =
                                                                    ctx->md;
    } else {
        EVP_MD_CTX_free(ctx->md);
    }

    ctx->md = NULL;
    ctx->hashing = 0;
}


/*
 * Sees every body byte as nginx reads it, before the save filter may spill
 * it to a temp file, so the fingerprint never needs a disk read.
 */

ngx_int_t
ngx_http_idempotency_request_body_filter(ngx_http_request_t *r,
    ngx_chain_t *in)
{
    ngx_http_idempotency_ctx_t  *ctx;

    ctx = ngx_http_get_module_ctx(r, ngx_http_idempotency_module);

    if (ctx && ctx->hashing
        && ngx_http_idempotency_fingerprint_update(ctx, in) != NGX_OK)
    {
        ngx_log_error(NGX_LOG_ERR, r->connection->log, 0,
                      "idempotency: cannot fingerprint the request body");
        return NGX_HTTP_INTERNAL_SERVER_ERROR;
    }

    return ngx_http_idempotency_next_request_body(r, in);
}
