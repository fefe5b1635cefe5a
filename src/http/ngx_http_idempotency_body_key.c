
/*
 * Copyright (C) The ngx_http_idempotency_module authors
 *
 * The key read from the request's JSON body (idempotency_key_json_pointer):
 * json.c's scanner sees every body byte the fingerprint sees, in the same
 * pass (hash.c), and the key it found is checked once the body is read,
 * before anything is claimed, like a key from the header.
 */


#include "ngx_http_idempotency_http.h"


static ngx_int_t ngx_http_idempotency_body_key_refuse(ngx_http_request_t *r,
    ngx_http_idempotency_ctx_t *ctx, ngx_uint_t status, ngx_uint_t problem,
    const char *text);


ngx_int_t
ngx_http_idempotency_body_key_start(ngx_http_request_t *r,
    ngx_http_idempotency_ctx_t *ctx)
{
    ctx->json = ngx_http_idempotency_json_create(r->pool,
                                                 ctx->conf->json_pointer,
                                                 ctx->conf->key_max_length);

    return ctx->json ? NGX_OK : NGX_ERROR;
}


/*
 * After the last body byte: NGX_OK, the key is allowed and the record key
 * made; else what the phase handler returns: NGX_DECLINED, the body has
 * no such member and no key is required (the request runs unprotected),
 * or an answer sent (the key is missing or refused) or an error.
 */

ngx_int_t
ngx_http_idempotency_body_key_end(ngx_http_request_t *r,
    ngx_http_idempotency_ctx_t *ctx)
{
    ngx_int_t                             rc;
    ngx_str_t                             key;
    const char                           *why;
    ngx_http_idempotency_json_pointer_t  *ptr;

    ptr = ctx->conf->json_pointer;

    rc = ngx_http_idempotency_json_finish(ctx->json, &key, &why);

    if (rc == NGX_OK) {
        return ngx_http_idempotency_key_allowed(r, ctx, &key, &key);
    }

    if (rc == NGX_DECLINED && !ctx->conf->required) {
        ngx_log_debug1(NGX_LOG_DEBUG_HTTP, r->connection->log, 0,
                       "idempotency: no key at %V in the body, not protected",
                       &ptr->text);

        ctx->status = NGX_HTTP_IDEMPOTENCY_BYPASS;
        ctx->state = NGX_HTTP_IDEMPOTENCY_ST_DONE;

        return NGX_DECLINED;
    }

    if (rc == NGX_DECLINED) {
        ngx_log_error(NGX_LOG_INFO, r->connection->log, 0,
                      "idempotency: request without a key rejected: "
                      "the JSON body has no member at %V", &ptr->text);

        return ngx_http_idempotency_body_key_refuse(r, ctx,
                                        NGX_HTTP_IDEMPOTENCY_MISSING,
                                        NGX_HTTP_IDEMPOTENCY_PROBLEM_MISSING,
                                        NULL);
    }

    ngx_log_error(NGX_LOG_INFO, r->connection->log, 0,
                  "idempotency: key rejected: the key at %V of the JSON "
                  "body: %s (body byte %O)", &ptr->text, why,
                  ngx_http_idempotency_json_offset(ctx->json));

    return ngx_http_idempotency_body_key_refuse(r, ctx,
                                        NGX_HTTP_IDEMPOTENCY_INVALID,
                                        NGX_HTTP_IDEMPOTENCY_PROBLEM_INVALID,
                                        why);
}


/*
 * 400 with a detail that names the pointer, so that a client's developer
 * sees which member was read: without text, missing-key "The JSON body
 * has no member at /id."; with it, invalid-key "The key at /id of the
 * JSON body: text."
 */

static ngx_int_t
ngx_http_idempotency_body_key_refuse(ngx_http_request_t *r,
    ngx_http_idempotency_ctx_t *ctx, ngx_uint_t status, ngx_uint_t problem,
    const char *text)
{
    u_char     *p;
    size_t      len;
    ngx_str_t   detail, *ptr;

    ptr = &ctx->conf->json_pointer->text;
    len = text ? ngx_strlen(text) : 0;

    /* ngx_escape_json() without dst: the bytes escaping adds */

    p = ngx_pnalloc(r->pool, 64 + ptr->len
                             + ngx_escape_json(NULL, ptr->data, ptr->len)
                             + len
                             + ngx_escape_json(NULL, (u_char *) text, len));
    if (p == NULL) {
        return NGX_HTTP_INTERNAL_SERVER_ERROR;
    }

    detail.data = p;

    if (text == NULL) {
        p = ngx_cpymem(p, "The JSON body has no member at ",
                       sizeof("The JSON body has no member at ") - 1);
        p = (u_char *) ngx_escape_json(p, ptr->data, ptr->len);

    } else {
        p = ngx_cpymem(p, "The key at ", sizeof("The key at ") - 1);
        p = (u_char *) ngx_escape_json(p, ptr->data, ptr->len);
        p = ngx_cpymem(p, " of the JSON body: ",
                       sizeof(" of the JSON body: ") - 1);
        p = (u_char *) ngx_escape_json(p, (u_char *) text, len);
    }

    *p++ = '.';

    detail.len = p - detail.data;

    return ngx_http_idempotency_reject_detail(r, ctx, status, problem,
                                              &detail);
}
