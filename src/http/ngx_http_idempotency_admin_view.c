
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


/* what could be read of a record: all of it, or a sealed one's head */
typedef struct {
    ngx_http_idempotency_record_t    rec;
    ngx_str_t                        id;         /* a sealed one's key id */
    ngx_int_t                        sealed;     /* NGX_DECLINED: clear */
    ngx_uint_t                       opened;
    const char                      *why;        /* not opened: why */
} ngx_http_idempotency_admin_rec_t;


static ngx_int_t ngx_http_idempotency_admin_open(
    ngx_http_idempotency_loc_conf_t *conf, ngx_log_t *log, ngx_str_t *rkey,
    u_char *value, size_t vlen, ngx_http_idempotency_admin_rec_t *v);
static u_char *ngx_http_idempotency_admin_sealed(u_char *p,
    ngx_http_idempotency_admin_rec_t *v);
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
    u_char                            *p;
    size_t                             len;
    uint64_t                           now, expires, lease, stored;
    ngx_str_t                          src, dst;
    ngx_buf_t                         *b;
    ngx_uint_t                         status, hsize;
    const char                        *state;
    ngx_http_idempotency_admin_rec_t   v;

    *out = NULL;

    if (ngx_http_idempotency_admin_open(conf, log, rkey, value, vlen, &v)
        != NGX_OK)
    {
        return NGX_HTTP_BAD_GATEWAY;
    }

    now = ngx_http_idempotency_epoch_msec();
    expires = pttl > 0 ? now + (uint64_t) pttl : 0;
    stored = ngx_http_idempotency_lease_stored_at(value);
    status = v.rec.status;

    state = ngx_http_idempotency_admin_state(v.rec.state, value, now,
                                             conf->lock_ttl / 3, &status,
                                             &lease);

    hsize = v.rec.headers_end ? (ngx_uint_t) (v.rec.headers_end - v.rec.headers)
                            : 0;

    /*
     * the fixed members; the v.sealed one with its id escaped and its
     * detail; the headers, each byte at worst escaped, with their brackets,
     * quotes and commas (8); the body in base64
     */

    len = 512
          + sizeof(",\"sealed\":{\"key_id\":\"\",\"opened\":false,"
                   "\"detail\":\"\"}") - 1
          + NGX_HTTP_IDEMPOTENCY_ADMIN_ESCAPED * v.id.len
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

    p = ngx_sprintf(p, "{\"state\":\"%s\",\"status\":", state);
    p = status ? ngx_sprintf(p, "%ui", status) : ngx_cpymem(p, "null", 4);

    p = ngx_cpymem(p, ",\"stored_at\":", sizeof(",\"stored_at\":") - 1);

    p = stored ? ngx_http_idempotency_admin_time(p, stored)
               : ngx_cpymem(p, "null", 4);

    p = ngx_cpymem(p, ",\"expires_at\":", sizeof(",\"expires_at\":") - 1);
    p = expires ? ngx_http_idempotency_admin_time(p, expires)
                : ngx_cpymem(p, "null", 4);

    p = ngx_cpymem(p, ",\"lease_until\":", sizeof(",\"lease_until\":") - 1);
    p = lease ? ngx_http_idempotency_admin_time(p, lease)
              : ngx_cpymem(p, "null", 4);

    if (v.sealed != NGX_DECLINED && !v.opened) {
        p = ngx_cpymem(p, ",\"size\":null", sizeof(",\"size\":null") - 1);

    } else {
        p = ngx_sprintf(p, ",\"size\":{\"headers\":%ui,\"body\":%uz}",
                        hsize, v.rec.body_len);
    }

    p = ngx_cpymem(p, ",\"fingerprint\":\"", sizeof(",\"fingerprint\":\"") - 1);
    p = ngx_hex_dump(p, v.rec.fingerprint, NGX_HTTP_IDEMPOTENCY_HASH_LEN);
    p = ngx_cpymem(p, "\",\"sealed\":", sizeof("\",\"sealed\":") - 1);

    p = ngx_http_idempotency_admin_sealed(p, &v);

    if (v.sealed != NGX_DECLINED && !v.opened) {
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


/*
 * A sealed record is opened with the location's keys, as on replay;
 * without them, what is clear in it is still worth showing.  NGX_ERROR: a
 * clear record that does not decode, logged.
 */

static ngx_int_t
ngx_http_idempotency_admin_open(ngx_http_idempotency_loc_conf_t *conf,
    ngx_log_t *log, ngx_str_t *rkey, u_char *value, size_t vlen,
    ngx_http_idempotency_admin_rec_t *v)
{
    ngx_int_t  rc;

    ngx_str_null(&v->id);

    v->sealed = ngx_http_idempotency_sealed_id(value, vlen, &v->id);
    v->opened = 0;
    v->why = NULL;

    if (v->sealed == NGX_DECLINED) {
        if (ngx_http_idempotency_record_decode(value, vlen, &v->rec)
            != NGX_OK)
        {
            ngx_log_error(NGX_LOG_ERR, log, 0,
                          "idempotency: corrupt record in redis \"%V\" at "
                          "\"%V\" (%uz bytes)", &conf->redis->name, rkey,
                          vlen);
            return NGX_ERROR;
        }

        return NGX_OK;
    }

    if (v->sealed == NGX_ERROR) {
        ngx_str_null(&v->id);
    }

    if (conf->encrypt_keys == NULL) {
        v->why = "no idempotency_encrypt_key in this location";

    } else {
        /* its line in the error log says why, by the key hash */

        rc = ngx_http_idempotency_crypt_open(conf->encrypt_keys, log, rkey,
                                             value, vlen, &v->rec);
        v->opened = (rc == NGX_OK);
        v->why = "not opened with the keys of this location: see the "
                 "error log";
    }

    if (!v->opened) {
        /* sealed records are completed ones: the head alone is clear */
        ngx_memzero(&v->rec, sizeof(ngx_http_idempotency_record_t));
        v->rec.state = NGX_HTTP_IDEMPOTENCY_REC_DONE;
        v->rec.fingerprint = ngx_http_idempotency_head_fingerprint(value);
    }

    return NGX_OK;
}


/* the "sealed" member: null for a clear record */

static u_char *
ngx_http_idempotency_admin_sealed(u_char *p,
    ngx_http_idempotency_admin_rec_t *v)
{
    if (v->sealed == NGX_DECLINED) {
        return ngx_cpymem(p, "null", 4);
    }

    p = ngx_cpymem(p, "{\"key_id\":", sizeof("{\"key_id\":") - 1);

    if (v->id.len) {
        *p++ = '"';
        p = ngx_http_idempotency_admin_escape(p, v->id.data, v->id.len);
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


/*
 * What the view and the listing call a record: in_progress, unknown (a
 * claim whose owner's lease ran out is one already), completed (sealed
 * or not) or too_large.  The status is an unknown outcome's, or
 * unchanged; the lease's deadline is a claim's, else 0.
 */

const char *
ngx_http_idempotency_admin_state(ngx_uint_t kind, u_char *head, uint64_t now,
    ngx_msec_t margin, ngx_uint_t *status, uint64_t *lease)
{
    ngx_uint_t  lk;

    *lease = 0;

    switch (kind) {

    case NGX_HTTP_IDEMPOTENCY_REC_CLAIM:
        lk = ngx_http_idempotency_lease_read(head, status, now, margin);

        if (lk == NGX_HTTP_IDEMPOTENCY_LEASE_UNKNOWN) {
            return "unknown";
        }

        *lease = ngx_http_idempotency_lease_deadline(head);

        if (lk == NGX_HTTP_IDEMPOTENCY_LEASE_EXPIRED) {
            *status = NGX_HTTP_BAD_GATEWAY;
            return "unknown";
        }

        *status = 0;
        return "in_progress";

    case NGX_HTTP_IDEMPOTENCY_REC_TOO_LARGE:
        return "too_large";

    default:
        return "completed";
    }
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
