
/*
 * Copyright (C) The ngx_http_idempotency_module authors
 *
 * Answers nginx gives itself: RFC 9457 problems and stored replays.  They
 * are sent directly, not through error_page, so they are deterministic.
 * A request refused by its key (missing, invalid: the rule it broke) is
 * answered here too.
 */


#include "ngx_http_idempotency_http.h"


static ngx_int_t ngx_http_idempotency_send(ngx_http_request_t *r,
    u_char *data, size_t len);
static ngx_int_t ngx_http_idempotency_problem_prepare(ngx_http_request_t *r,
    ngx_http_idempotency_loc_conf_t *conf, ngx_http_idempotency_problem_t *pr,
    ngx_uint_t status, ngx_str_t *type, ngx_uint_t retry, ngx_str_t *out);
static ngx_int_t ngx_http_idempotency_add_header(ngx_http_request_t *r,
    ngx_str_t *name, ngx_str_t *value, ngx_table_elt_t **hp);
static ngx_int_t ngx_http_idempotency_add_trailers(ngx_http_request_t *r,
    ngx_http_idempotency_loc_conf_t *conf, ngx_http_idempotency_record_t *rec);
static ngx_uint_t ngx_http_idempotency_hidden(
    ngx_http_idempotency_loc_conf_t *conf, ngx_str_t *name);


static ngx_http_idempotency_problem_t  ngx_http_idempotency_problems[] = {

    { NGX_HTTP_BAD_REQUEST,
      ngx_string("missing-key"),
      ngx_string("Idempotency-Key is missing"),
      ngx_string("This operation requires an Idempotency-Key header.") },

    { NGX_HTTP_BAD_REQUEST,
      ngx_string("invalid-key"),
      ngx_string("Idempotency-Key is invalid"),
      ngx_string("Send one Idempotency-Key header: a quoted string or a "
                 "token of printable ASCII characters, not too long.") },

    { NGX_HTTP_CONFLICT,
      ngx_string("request-in-progress"),
      ngx_string("A request is outstanding for this Idempotency-Key"),
      ngx_string("The first request with this key is still being "
                 "processed. Retry later with the same key.") },

    { NGX_HTTP_CONFLICT,
      ngx_string("response-not-replayable"),
      ngx_string("The response for this Idempotency-Key cannot be replayed"),
      ngx_string("The request with this key was executed, but its response "
                 "was too large to store: the result cannot be replayed. Do "
                 "not retry the request with this key.") },

    { 422,
      ngx_string("key-reused"),
      ngx_string("Idempotency-Key is already used"),
      ngx_string("This key was used for a different request (method, URI "
                 "or body). Use a new key for a new request.") },

    { NGX_HTTP_SERVICE_UNAVAILABLE,
      ngx_string("store-unavailable"),
      ngx_string("The idempotency store is unavailable"),
      ngx_string("The request was not executed. Retry later with the same "
                 "key.") },

    /* the status is the one the first request's nginx saw: 502 or 504 */
    { NGX_HTTP_BAD_GATEWAY,
      ngx_string("outcome-unknown"),
      ngx_string("The outcome of the request with this Idempotency-Key is "
                 "unknown"),
      ngx_string("The first request with this key reached the server, but "
                 "no response came back: it may or may not have been "
                 "executed. Retrying cannot tell; check the state of the "
                 "operation instead.") }
};


static ngx_str_t  ngx_http_idempotency_problem_type =
    ngx_string("application/problem+json");


/*
 * A problem of the module's table, with a detail of this request's own
 * (NULL: the table's).
 */

ngx_int_t
ngx_http_idempotency_send_problem_detail(ngx_http_request_t *r,
    ngx_http_idempotency_loc_conf_t *conf, ngx_uint_t problem,
    ngx_uint_t unknown_status, ngx_str_t *detail)
{
    ngx_str_t                       *type;
    ngx_uint_t                       status, retry;
    ngx_http_idempotency_problem_t  *pr, own;

    static ngx_str_t  idempotency_error = ngx_string("idempotency_error");
    static ngx_str_t  api_error = ngx_string("api_error");

    pr = &ngx_http_idempotency_problems[problem];
    status = pr->status;

    if (detail) {
        own = *pr;
        own.detail = *detail;
        pr = &own;
    }

    if (problem == NGX_HTTP_IDEMPOTENCY_PROBLEM_UNKNOWN
        && unknown_status == NGX_HTTP_GATEWAY_TIME_OUT)
    {
        status = NGX_HTTP_GATEWAY_TIME_OUT;
    }

    /* the store's trouble, or the server's, not a misuse of the key */
    type = (problem == NGX_HTTP_IDEMPOTENCY_PROBLEM_UNAVAILABLE
            || problem == NGX_HTTP_IDEMPOTENCY_PROBLEM_UNKNOWN)
           ? &api_error : &idempotency_error;

    /* retrying helps for "in progress" and "unavailable" alone */
    retry = (problem == NGX_HTTP_IDEMPOTENCY_PROBLEM_CONFLICT
             || problem == NGX_HTTP_IDEMPOTENCY_PROBLEM_UNAVAILABLE);

    return ngx_http_idempotency_send_problem_of(r, conf, pr, status, type,
                                                retry);
}


/*
 * A problem of any table (the admin has its own): the status, the type of
 * the "error" member, and whether retrying can change the answer are the
 * caller's.
 */

ngx_int_t
ngx_http_idempotency_send_problem_of(ngx_http_request_t *r,
    ngx_http_idempotency_loc_conf_t *conf, ngx_http_idempotency_problem_t *pr,
    ngx_uint_t status, ngx_str_t *type, ngx_uint_t retry)
{
    ngx_str_t  body;

    if (ngx_http_discard_request_body(r) != NGX_OK) {
        r->keepalive = 0;
    }

    if (ngx_http_idempotency_problem_prepare(r, conf, pr, status, type, retry,
                                             &body)
        != NGX_OK)
    {
        return NGX_HTTP_INTERNAL_SERVER_ERROR;
    }

    return ngx_http_idempotency_send(r, body.data, body.len);
}


/*
 * The problem document in r's pool and the headers that go with it, for
 * whoever sends it: send_problem_of(), or the owner's body filter, which
 * puts it in place of nginx's own error page (filter.c)
 */

static ngx_int_t
ngx_http_idempotency_problem_prepare(ngx_http_request_t *r,
    ngx_http_idempotency_loc_conf_t *conf, ngx_http_idempotency_problem_t *pr,
    ngx_uint_t status, ngx_str_t *type, ngx_uint_t retry, ngx_str_t *out)
{
    u_char     *body, *p;
    size_t      len;
    uintptr_t   escape;
    ngx_str_t   name, value;

    static ngx_str_t  retry_after = ngx_string("Retry-After");
    static ngx_str_t  one = ngx_string("1");
    static ngx_str_t  cache_control = ngx_string("Cache-Control");
    static ngx_str_t  no_store = ngx_string("no-store");

    escape = ngx_escape_json(NULL, conf->problem_base_uri.data,
                             conf->problem_base_uri.len);

    len = sizeof("{\"type\":\"\",\"title\":\"\",\"status\":,"
                 "\"detail\":\"\",\"code\":\"\"}\n") - 1
          + sizeof("about:blank") - 1
          + conf->problem_base_uri.len + escape + 1 + pr->name.len
          + pr->title.len + 3 + pr->detail.len + pr->name.len;

    if (conf->problem_error_member) {
        len += sizeof(",\"error\":{\"type\":\"\",\"code\":\"\","
                      "\"message\":\"\"}") - 1
               + type->len + pr->name.len + pr->detail.len;
    }

    body = ngx_pnalloc(r->pool, len);
    if (body == NULL) {
        return NGX_ERROR;
    }

    p = ngx_cpymem(body, "{\"type\":\"", sizeof("{\"type\":\"") - 1);

    if (conf->problem_base_uri.len) {
        p = (u_char *) ngx_escape_json(p, conf->problem_base_uri.data,
                                       conf->problem_base_uri.len);
        *p++ = '#';
        p = ngx_cpymem(p, pr->name.data, pr->name.len);

    } else {
        p = ngx_cpymem(p, "about:blank", sizeof("about:blank") - 1);
    }

    p = ngx_sprintf(p, "\",\"title\":\"%V\",\"status\":%ui,"
                    "\"detail\":\"%V\",\"code\":\"%V\"",
                    &pr->title, status, &pr->detail, &pr->name);

    /*
     * Stripe-style client libraries raise an error only when the body has
     * an "error" member: without it, a 409 or 422 problem was handed to
     * the caller as if it were the created object
     */

    if (conf->problem_error_member) {
        p = ngx_sprintf(p, ",\"error\":{\"type\":\"%V\",\"code\":\"%V\","
                        "\"message\":\"%V\"}", type, &pr->name, &pr->detail);
    }

    *p++ = '}';
    *p++ = LF;

    r->headers_out.status = status;

    if (status == 422) {
        /* nginx 1.22 has no reason phrase for 422 */
        ngx_str_set(&r->headers_out.status_line, "422 Unprocessable Content");
    }
    r->headers_out.content_type = ngx_http_idempotency_problem_type;
    r->headers_out.content_type_len = ngx_http_idempotency_problem_type.len;
    r->headers_out.content_type_lowcase = NULL;
    r->headers_out.content_length_n = p - body;

    if (retry) {
        name = retry_after;
        value = one;

        if (ngx_http_idempotency_add_header(r, &name, &value, NULL)
            != NGX_OK)
        {
            return NGX_ERROR;
        }
    }

    name = cache_control;
    value = no_store;

    if (ngx_http_idempotency_add_header(r, &name, &value, NULL) != NGX_OK) {
        return NGX_ERROR;
    }

    if (ngx_http_idempotency_retry_hints(r, conf, retry) != NGX_OK) {
        return NGX_ERROR;
    }

    out->data = body;
    out->len = p - body;

    return NGX_OK;
}


/*
 * outcome-unknown for the owner itself, as its retries will be told: in
 * place of nginx's own 502/504 page (filter.c)
 */

ngx_int_t
ngx_http_idempotency_problem_unknown(ngx_http_request_t *r,
    ngx_http_idempotency_loc_conf_t *conf, ngx_uint_t status, ngx_str_t *body)
{
    static ngx_str_t  api_error = ngx_string("api_error");

    return ngx_http_idempotency_problem_prepare(r, conf,
               &ngx_http_idempotency_problems[
                   NGX_HTTP_IDEMPOTENCY_PROBLEM_UNKNOWN],
               status, &api_error, 0, body);
}


ngx_int_t
ngx_http_idempotency_send_replay(ngx_http_request_t *r,
    ngx_http_idempotency_loc_conf_t *conf, ngx_http_idempotency_record_t *rec)
{
    u_char           *p;
    ngx_str_t         name, value;
    ngx_uint_t        i, location;
    ngx_table_elt_t  *h;

    static ngx_str_t  replayed = ngx_string("Idempotent-Replayed");
    static ngx_str_t  yes = ngx_string("true");

    r->headers_out.status = rec->status;
    r->headers_out.content_length_n = rec->body_len;

    /* what the owner's response got from nginx, the replay gets too */
    r->disable_not_modified = 1;

    p = rec->headers;
    location = 0;

    for (i = 0; i < rec->nheaders; i++) {
        p = ngx_http_idempotency_record_next_header(p, &name, &value);

        /* type and charset as the upstream module splits them */

        if (name.len == sizeof("Content-Type") - 1
            && ngx_strncasecmp(name.data, (u_char *) "Content-Type",
                               name.len) == 0)
        {
            r->headers_out.content_type = value;
            ngx_http_idempotency_content_type(&value,
                &r->headers_out.content_type_len, &r->headers_out.charset);
            r->headers_out.content_type_lowcase = NULL;
            continue;
        }

        if (name.len == sizeof(":content-type") - 1
            && ngx_strncmp(name.data, ":content-type", name.len) == 0)
        {
            r->headers_out.content_type = value;
            r->headers_out.content_type_len = value.len;
            r->headers_out.content_type_lowcase = NULL;
            continue;
        }

        /* the next header was nginx's own Location */

        if (name.len == sizeof(":location") - 1
            && ngx_strncmp(name.data, ":location", name.len) == 0)
        {
            location = 1;
            continue;
        }

        if (name.len == sizeof(":status-line") - 1
            && ngx_strncmp(name.data, ":status-line", name.len) == 0)
        {
            r->headers_out.status_line = value;
            continue;
        }

        if (ngx_http_idempotency_hidden(conf, &name)) {
            location = 0;
            continue;
        }

        if (ngx_http_idempotency_add_header(r, &name, &value, &h) != NGX_OK) {
            return NGX_HTTP_INTERNAL_SERVER_ERROR;
        }

        if (name.len == sizeof("Content-Encoding") - 1
            && ngx_strncasecmp(name.data, (u_char *) "Content-Encoding",
                               name.len) == 0)
        {
            r->headers_out.content_encoding = h;

        } else if (location
                   && name.len == sizeof("Location") - 1
                   && ngx_strncasecmp(name.data, (u_char *) "Location",
                                      name.len) == 0)
        {
            /* the header filter makes it absolute again, as it did then */
            r->headers_out.location = h;
        }

        location = 0;
    }

    name = replayed;
    value = yes;

    if (ngx_http_idempotency_add_header(r, &name, &value, NULL) != NGX_OK) {
        return NGX_HTTP_INTERNAL_SERVER_ERROR;
    }

    if (ngx_http_idempotency_add_trailers(r, conf, rec) != NGX_OK) {
        return NGX_HTTP_INTERNAL_SERVER_ERROR;
    }

    /* a replayed 409, 429 or 5xx would be retried by SDKs, in vain */

    if (ngx_http_idempotency_status_final(rec->status)
        && ngx_http_idempotency_retry_hints(r, conf, 0) != NGX_OK)
    {
        return NGX_HTTP_INTERNAL_SERVER_ERROR;
    }

    return ngx_http_idempotency_send(r, rec->body, rec->body_len);
}


/*
 * The hints that Stripe's and the Stainless-generated client libraries
 * obey, over their own judgement of the status: whether retrying can
 * change this answer.  Also on the owner's own response (filter.c), when
 * what it gets is what every retry will get.
 */

ngx_int_t
ngx_http_idempotency_retry_hints(ngx_http_request_t *r,
    ngx_http_idempotency_loc_conf_t *conf, ngx_uint_t retry)
{
    ngx_str_t  name, value;

    static ngx_str_t  x_should_retry = ngx_string("x-should-retry");
    static ngx_str_t  stripe_should_retry = ngx_string("Stripe-Should-Retry");
    static ngx_str_t  yes = ngx_string("true");
    static ngx_str_t  no = ngx_string("false");

    if (!conf->retry_hints) {
        return NGX_OK;
    }

    name = x_should_retry;
    value = retry ? yes : no;

    if (ngx_http_idempotency_add_header(r, &name, &value, NULL) != NGX_OK) {
        return NGX_ERROR;
    }

    name = stripe_should_retry;

    return ngx_http_idempotency_add_header(r, &name, &value, NULL);
}


/*
 * The stored trailers go with the last buffer: in the trailing HEADERS
 * frame over HTTP/2 (gRPC's grpc-status), after the last chunk over
 * HTTP/1.1, which expect_trailers makes chunked despite the known length.
 */

static ngx_int_t
ngx_http_idempotency_add_trailers(ngx_http_request_t *r,
    ngx_http_idempotency_loc_conf_t *conf, ngx_http_idempotency_record_t *rec)
{
    u_char           *p;
    ngx_str_t         name, value;
    ngx_uint_t        i, n;
    ngx_table_elt_t  *t;

    p = rec->trailers;
    n = 0;

    for (i = 0; i < rec->ntrailers; i++) {
        p = ngx_http_idempotency_record_next_header(p, &name, &value);

        if (ngx_http_idempotency_hidden(conf, &name)) {
            continue;
        }

        t = ngx_list_push(&r->headers_out.trailers);
        if (t == NULL) {
            return NGX_ERROR;
        }

        t->key = name;
        t->value = value;
        t->hash = 1;
        t->lowcase_key = NULL;

#if (nginx_version >= 1023000)
        t->next = NULL;
#endif

        n++;
    }

    if (n) {
        r->expect_trailers = 1;
    }

    return NGX_OK;
}


/*
 * A field this location does not store (Set-Cookie, idempotency_hide_header)
 * is not replayed either, whoever wrote the record: dropped, not refused,
 * as the configuration may have changed since it was stored.  The decoder
 * has bounded the name to NGX_HTTP_IDEMPOTENCY_NAME_MAX bytes.
 */

static ngx_uint_t
ngx_http_idempotency_hidden(ngx_http_idempotency_loc_conf_t *conf,
    ngx_str_t *name)
{
    u_char     buf[NGX_HTTP_IDEMPOTENCY_NAME_MAX];
    ngx_str_t  low;

    if (name->len > sizeof(buf)) {
        return 1;
    }

    low.len = name->len;
    low.data = buf;
    ngx_strlow(buf, name->data, name->len);

    return !ngx_http_idempotency_store_header(conf, &low);
}


static ngx_int_t
ngx_http_idempotency_add_header(ngx_http_request_t *r, ngx_str_t *name,
    ngx_str_t *value, ngx_table_elt_t **hp)
{
    ngx_table_elt_t  *h;

    h = ngx_list_push(&r->headers_out.headers);
    if (h == NULL) {
        return NGX_ERROR;
    }

    h->hash = 1;
    h->key = *name;
    h->value = *value;
    h->lowcase_key = NULL;

#if (nginx_version >= 1023000)
    h->next = NULL;
#endif

    if (hp) {
        *hp = h;
    }

    return NGX_OK;
}


/* sends header and body, then finalizes: the phase handler is done */

static ngx_int_t
ngx_http_idempotency_send(ngx_http_request_t *r, u_char *data, size_t len)
{
    ngx_int_t     rc;
    ngx_buf_t    *b;
    ngx_chain_t   out;

    rc = ngx_http_send_header(r);

    if (rc == NGX_ERROR || rc > NGX_OK || r->header_only) {
        ngx_http_finalize_request(r, rc);
        return NGX_DONE;
    }

    if (len == 0) {
        ngx_http_finalize_request(r, ngx_http_send_special(r, NGX_HTTP_LAST));
        return NGX_DONE;
    }

    b = ngx_calloc_buf(r->pool);
    if (b == NULL) {
        ngx_http_finalize_request(r, NGX_HTTP_INTERNAL_SERVER_ERROR);
        return NGX_DONE;
    }

    b->pos = data;
    b->last = data + len;
    b->memory = 1;
    b->last_buf = 1;
    b->last_in_chain = 1;

    out.buf = b;
    out.next = NULL;

    ngx_http_finalize_request(r, ngx_http_output_filter(r, &out));

    return NGX_DONE;
}


ngx_int_t
ngx_http_idempotency_reject(ngx_http_request_t *r,
    ngx_http_idempotency_ctx_t *ctx, ngx_uint_t status, ngx_uint_t problem)
{
    return ngx_http_idempotency_reject_detail(r, ctx, status, problem, NULL);
}


ngx_int_t
ngx_http_idempotency_reject_detail(ngx_http_request_t *r,
    ngx_http_idempotency_ctx_t *ctx, ngx_uint_t status, ngx_uint_t problem,
    ngx_str_t *detail)
{
    ctx->status = status;
    ctx->state = NGX_HTTP_IDEMPOTENCY_ST_DONE;

    if (ctx->conf->dry_run) {
        /* only $idempotency_status tells what would have happened */
        return NGX_DECLINED;
    }

    return ngx_http_idempotency_send_problem_detail(r, ctx->conf, problem,
                                                    ctx->claim
                                                    ? ctx->claim->status : 0,
                                                    detail);
}


/*
 * 400 invalid-key, with the rule the key broke in the detail, so that a
 * client's developer need not guess; the reason is logged, never the key.
 * rc: NGX_ERROR, several header lines; NGX_DECLINED, a key that does not
 * match idempotency_key_pattern; else what the key's syntax says.
 */

ngx_int_t
ngx_http_idempotency_invalid_key(ngx_http_request_t *r,
    ngx_http_idempotency_ctx_t *ctx, ngx_int_t rc, ngx_str_t *raw,
    ngx_str_t *key)
{
    u_char     *p;
    size_t      max;
    ngx_str_t   detail, *pattern, *ptr;

    max = ctx->conf->key_max_length;
    pattern = NULL;
    ptr = NULL;

    if (rc == NGX_DECLINED) {
        /* the operator's texts: escaped for JSON */
        pattern = &ctx->conf->key_pattern->text;

        if (ctx->conf->json_pointer) {
            ptr = &ctx->conf->json_pointer->text;
        }
    }

    p = ngx_pnalloc(r->pool, 256 + (pattern
                                    ? ngx_escape_json(NULL, pattern->data,
                                                      pattern->len)
                                      + pattern->len
                                    : 0)
                                 + (ptr
                                    ? ngx_escape_json(NULL, ptr->data,
                                                      ptr->len)
                                      + ptr->len
                                    : 0));
    if (p == NULL) {
        return NGX_HTTP_INTERNAL_SERVER_ERROR;
    }

    detail.data = p;

    if (rc == NGX_DECLINED) {
        ngx_log_error(NGX_LOG_INFO, r->connection->log, 0,
                      "idempotency: key rejected: does not match "
                      "idempotency_key_pattern, %uz bytes", key->len);

        if (ptr) {
            p = ngx_cpymem(p, "The key at ", sizeof("The key at ") - 1);
            p = (u_char *) ngx_escape_json(p, ptr->data, ptr->len);
            p = ngx_cpymem(p, " of the JSON body",
                           sizeof(" of the JSON body") - 1);

        } else {
            p = ngx_cpymem(p, "The Idempotency-Key",
                           sizeof("The Idempotency-Key") - 1);
        }

        p = ngx_cpymem(p, " does not have the form this API accepts: it "
                          "must match the pattern ",
                       sizeof(" does not have the form this API accepts: "
                              "it must match the pattern ") - 1);
        p = (u_char *) ngx_escape_json(p, pattern->data, pattern->len);
        *p++ = '.';

    } else if (rc == NGX_ERROR) {
        ngx_log_error(NGX_LOG_INFO, r->connection->log, 0,
                      "idempotency: key rejected: several "
                      "Idempotency-Key headers");

        p = ngx_sprintf(p, "Send one Idempotency-Key header: this request "
                           "has several.");

    } else if (key->len > max) {
        ngx_log_error(NGX_LOG_INFO, r->connection->log, 0,
                      "idempotency: key rejected: longer than "
                      "idempotency_key_max_length, %uz bytes", raw->len);

        p = ngx_sprintf(p, "The Idempotency-Key is %uz characters long; "
                           "at most %uz are accepted.", key->len, max);

    } else if (key->len == 0 && raw->len == 2) {
        ngx_log_error(NGX_LOG_INFO, r->connection->log, 0,
                      "idempotency: key rejected: empty");

        p = ngx_sprintf(p, "The Idempotency-Key is empty: send 1 to %uz "
                           "characters.", max);

    } else {
        ngx_log_error(NGX_LOG_INFO, r->connection->log, 0,
                      "idempotency: key rejected: not a quoted string or "
                      "a token of printable ASCII, %uz bytes", raw->len);

        /* the table's details go out unescaped: no double quote here */

        p = ngx_sprintf(p, "The Idempotency-Key must be visible ASCII "
                           "characters without spaces, double quotes or "
                           "commas, or a quoted string (RFC 8941) of "
                           "printable ASCII.");
    }

    detail.len = p - detail.data;

    return ngx_http_idempotency_reject_detail(r, ctx,
                                        NGX_HTTP_IDEMPOTENCY_INVALID,
                                        NGX_HTTP_IDEMPOTENCY_PROBLEM_INVALID,
                                        &detail);
}
