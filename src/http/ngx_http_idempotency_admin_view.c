
/*
 * Copyright (C) The ngx_http_idempotency_module authors
 *
 * idempotency_admin's view of one record, as JSON:
 *
 * {"state": ..., "status": ..., "stored_at": ..., "expires_at": ...,
 *  "lease_until": ..., "size": {"headers": N, "body": N},
 *  "fingerprint": "...", "sealed": null | {"key_id": ..., "opened": ...,
 *  "detail": ...}, "headers": [[name, value], ...], "body": base64}
 *
 * stored_at is the time the record's head keeps (null for a record of a
 * version that kept none, and for claims); expires_at is Redis's PTTL from
 * now, lease_until a live claim's deadline.  A sealed record that does not
 * open here shows what is clear in it (state, times, fingerprint, the key
 * id), its size and headers null.  Stored names and
 * values are any bytes but CR, LF and NUL: every byte from 0x7f up is
 * written \u00XX, so the answer is always JSON, and the bytes come back as
 * the code points of the string (ISO 8859-1).
 */


#include "ngx_http_idempotency_http.h"


static u_char *ngx_http_idempotency_admin_sealed(u_char *p,
    ngx_http_idempotency_view_t *v);
static u_char *ngx_http_idempotency_admin_headers(u_char *p,
    ngx_http_idempotency_record_t *rec);
static u_char *ngx_http_idempotency_admin_escape(u_char *dst, u_char *src,
    size_t size);


/* the worst escaped byte: \u00XX */
#define NGX_HTTP_IDEMPOTENCY_ADMIN_ESCAPED  6


ngx_int_t
ngx_http_idempotency_admin_view(ngx_http_request_t *r,
    ngx_http_idempotency_loc_conf_t *conf, ngx_log_t *log, ngx_str_t *rkey,
    u_char *value, size_t vlen, long long pttl, ngx_uint_t body,
    ngx_buf_t **out)
{
    u_char                       *p;
    size_t                        len;
    uint64_t                      now, expires;
    ngx_str_t                     src, dst;
    ngx_buf_t                    *b;
    ngx_uint_t                    hsize;
    ngx_time_t                   *tp;
    ngx_http_idempotency_view_t   v;

    *out = NULL;

    tp = ngx_timeofday();
    now = (uint64_t) tp->sec * 1000 + tp->msec;
    expires = pttl > 0 ? now + (uint64_t) pttl : 0;

    if (ngx_http_idempotency_view(value, vlen, conf->encrypt_keys, rkey, now,
                                  conf->lock_ttl / 3, log, &v)
        != NGX_OK)
    {
        ngx_log_error(NGX_LOG_ERR, log, 0,
                      "idempotency: corrupt record in redis \"%V\" at "
                      "\"%V\" (%uz bytes)", &conf->redis->name, rkey, vlen);
        return NGX_HTTP_BAD_GATEWAY;
    }

    hsize = v.rec.headers_end ? (ngx_uint_t) (v.rec.headers_end - v.rec.headers)
                              : 0;

    /*
     * the fixed members; the sealed one with its id escaped and its
     * detail; the headers, each byte at worst escaped, with their brackets,
     * quotes and commas (8); the body in base64
     */

    len = 512
          + sizeof(",\"sealed\":{\"key_id\":\"\",\"opened\":false,"
                   "\"detail\":\"\"}") - 1
          + NGX_HTTP_IDEMPOTENCY_ADMIN_ESCAPED * v.key_id.len
          + (v.why ? ngx_strlen(v.why) : 0)
          + NGX_HTTP_IDEMPOTENCY_ADMIN_ESCAPED * hsize + 8 * v.rec.nheaders;

    if (body) {
        len += ngx_base64_encoded_length(v.rec.body_len);
    }

    b = ngx_create_temp_buf(r->pool, len);
    if (b == NULL) {
        return NGX_HTTP_INTERNAL_SERVER_ERROR;
    }

    p = b->last;

    p = ngx_sprintf(p, "{\"state\":\"%s\",\"status\":", v.state);
    p = v.status ? ngx_sprintf(p, "%ui", v.status) : ngx_cpymem(p, "null", 4);

    p = ngx_cpymem(p, ",\"stored_at\":", sizeof(",\"stored_at\":") - 1);
    p = v.stored_at ? ngx_http_idempotency_admin_time(p, v.stored_at)
                    : ngx_cpymem(p, "null", 4);

    p = ngx_cpymem(p, ",\"expires_at\":", sizeof(",\"expires_at\":") - 1);
    p = expires ? ngx_http_idempotency_admin_time(p, expires)
                : ngx_cpymem(p, "null", 4);

    p = ngx_cpymem(p, ",\"lease_until\":", sizeof(",\"lease_until\":") - 1);
    p = v.lease_until ? ngx_http_idempotency_admin_time(p, v.lease_until)
                      : ngx_cpymem(p, "null", 4);

    if (!v.read) {
        p = ngx_cpymem(p, ",\"size\":null", sizeof(",\"size\":null") - 1);

    } else {
        p = ngx_sprintf(p, ",\"size\":{\"headers\":%ui,\"body\":%uz}",
                        hsize, v.rec.body_len);
    }

    p = ngx_cpymem(p, ",\"fingerprint\":\"", sizeof(",\"fingerprint\":\"") - 1);
    p = ngx_hex_dump(p, v.fingerprint, NGX_HTTP_IDEMPOTENCY_HASH_LEN);
    p = ngx_cpymem(p, "\",\"sealed\":", sizeof("\",\"sealed\":") - 1);

    p = ngx_http_idempotency_admin_sealed(p, &v);

    if (!v.read) {
        p = ngx_cpymem(p, ",\"headers\":null}\n",
                       sizeof(",\"headers\":null}\n") - 1);
        goto done;
    }

    p = ngx_http_idempotency_admin_headers(p, &v.rec);

    if (body && v.rec.body) {
        p = ngx_cpymem(p, ",\"body\":\"", sizeof(",\"body\":\"") - 1);
        src.data = v.rec.body;
        src.len = v.rec.body_len;
        dst.data = p;
        ngx_encode_base64(&dst, &src);
        p += dst.len;
        *p++ = '"';
    }

    *p++ = '}';
    *p++ = LF;

done:

    b->last = p;
    *out = b;

    return NGX_HTTP_OK;
}


/* the "sealed" member: null for a clear record */

static u_char *
ngx_http_idempotency_admin_sealed(u_char *p, ngx_http_idempotency_view_t *v)
{
    if (!v->sealed) {
        return ngx_cpymem(p, "null", 4);
    }

    p = ngx_cpymem(p, "{\"key_id\":", sizeof("{\"key_id\":") - 1);

    if (v->key_id.len) {
        *p++ = '"';
        p = ngx_http_idempotency_admin_escape(p, v->key_id.data,
                                              v->key_id.len);
        *p++ = '"';

    } else {
        p = ngx_cpymem(p, "null", 4);
    }

    p = ngx_sprintf(p, ",\"opened\":%s", v->opened ? "true" : "false");

    if (!v->opened) {
        p = ngx_sprintf(p, ",\"detail\":\"%s\"", v->why);
    }

    *p++ = '}';

    return p;
}


/* the "headers" member: [name, value] pairs, every byte escaped as JSON */

static u_char *
ngx_http_idempotency_admin_headers(u_char *p,
    ngx_http_idempotency_record_t *rec)
{
    u_char      *h;
    ngx_str_t    name, value;
    ngx_uint_t   i;

    p = ngx_cpymem(p, ",\"headers\":[", sizeof(",\"headers\":[") - 1);

    h = rec->headers;

    for (i = 0; i < rec->nheaders; i++) {
        h = ngx_http_idempotency_record_next_header(h, &name, &value);

        *p++ = i ? ',' : '[';

        if (i) {
            *p++ = '[';
        }

        *p++ = '"';
        p = ngx_http_idempotency_admin_escape(p, name.data, name.len);
        p = ngx_cpymem(p, "\",\"", 3);
        p = ngx_http_idempotency_admin_escape(p, value.data, value.len);
        *p++ = '"';
        *p++ = ']';
    }

    *p++ = ']';

    return p;
}


/* a refusal as problem+json, finalized */

void
ngx_http_idempotency_admin_answer(ngx_http_request_t *r,
    ngx_http_idempotency_loc_conf_t *conf, ngx_http_idempotency_problem_t *pr)
{
    ngx_int_t  rc;

    static ngx_str_t  invalid_request = ngx_string("invalid_request_error");
    static ngx_str_t  api_error = ngx_string("api_error");

    rc = ngx_http_idempotency_send_problem_of(r, conf, pr, pr->status,
                                              pr->status < 500
                                              ? &invalid_request : &api_error,
                                              pr->status
                                              == NGX_HTTP_SERVICE_UNAVAILABLE);
    if (rc != NGX_DONE) {
        ngx_http_finalize_request(r, rc);
    }
}


/* a JSON answer (b), or a status alone (b NULL), finalized */

void
ngx_http_idempotency_admin_json(ngx_http_request_t *r, ngx_int_t rc,
    ngx_buf_t *b)
{
    ngx_chain_t  out;

    static ngx_str_t  json = ngx_string("application/json");

    if (b == NULL) {
        ngx_http_finalize_request(r, rc);
        return;
    }

    r->headers_out.status = rc;
    r->headers_out.content_type = json;
    r->headers_out.content_type_len = json.len;
    r->headers_out.content_type_lowcase = NULL;
    r->headers_out.content_length_n = b->last - b->pos;

    b->last_buf = (r == r->main) ? 1 : 0;
    b->last_in_chain = 1;

    rc = ngx_http_send_header(r);

    if (rc == NGX_ERROR || rc > NGX_OK || r->header_only) {
        ngx_http_finalize_request(r, rc);
        return;
    }

    out.buf = b;
    out.next = NULL;

    ngx_http_finalize_request(r, ngx_http_output_filter(r, &out));
}


/* RFC 3339, UTC, milliseconds */

u_char *
ngx_http_idempotency_admin_time(u_char *p, uint64_t msec)
{
    ngx_tm_t  tm;

    ngx_gmtime((time_t) (msec / 1000), &tm);

    return ngx_sprintf(p, "\"%4d-%02d-%02dT%02d:%02d:%02d.%03uDZ\"",
                       tm.ngx_tm_year, tm.ngx_tm_mon, tm.ngx_tm_mday,
                       tm.ngx_tm_hour, tm.ngx_tm_min, tm.ngx_tm_sec,
                       (uint32_t) (msec % 1000));
}


/*
 * A JSON string's inside, whatever the bytes: ngx_escape_json() leaves
 * 0x7f and the bytes above it as they are, and a stored header that is no
 * UTF-8 made the whole answer unreadable.  At most 6 bytes per byte.
 */

static u_char *
ngx_http_idempotency_admin_escape(u_char *dst, u_char *src, size_t size)
{
    u_char  c;

    static u_char  hex[] = "0123456789abcdef";

    while (size--) {
        c = *src++;

        if (c == '"' || c == '\\') {
            *dst++ = '\\';
            *dst++ = c;

        } else if (c < 0x20 || c >= 0x7f) {
            *dst++ = '\\';
            *dst++ = 'u';
            *dst++ = '0';
            *dst++ = '0';
            *dst++ = hex[c >> 4];
            *dst++ = hex[c & 0xf];

        } else {
            *dst++ = c;
        }
    }

    return dst;
}
