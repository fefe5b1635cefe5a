
/*
 * Copyright (C) The ngx_http_idempotency_module authors
 *
 * The Redis record: a length-prefixed binary string, big-endian integers.
 *
 *   "IDM1" | u8 state | fingerprint[32] | token[16]          (every record)
 *   claim:      nothing more
 *   too large:  u16 status
 *   done:       u16 status | u32 n | n * (u32 len, name, u32 len, value)
 *               | u64 body length | body
 *   done with trailers: as done, then u32 t | t * (u32 len, name, u32 len,
 *               value), t >= 1 (a response without trailers is "done", so
 *               records of versions that knew no trailers still decode)
 *   sealed:     either done record, encrypted (crypt.c); it is built with
 *               room for the envelope after its head
 *
 * build.c writes them; this file reads them.
 *
 * Decoding trusts nothing: a record that does not parse exactly is an error,
 * and so is one holding a field capture.c never stores (see field_ok()):
 * a Redis writer must not be able to frame the replay.
 */


#include "ngx_http_idempotency_store.h"


#define ngx_http_idempotency_get16(p)                                         \
    ((ngx_uint_t) (p)[0] << 8 | (p)[1])

#define ngx_http_idempotency_get32(p)                                         \
    ((uint32_t) (p)[0] << 24 | (uint32_t) (p)[1] << 16                        \
     | (uint32_t) (p)[2] << 8 | (p)[3])



static ngx_int_t ngx_http_idempotency_record_done(u_char *p, u_char *last,
    ngx_http_idempotency_record_t *rec);
static u_char *ngx_http_idempotency_record_fields(u_char *p, u_char *last,
    uint32_t n, ngx_uint_t status);
static ngx_uint_t ngx_http_idempotency_record_pseudo(ngx_str_t *name,
    ngx_str_t *value, ngx_uint_t status);
static ngx_uint_t ngx_http_idempotency_record_is(ngx_str_t *name,
    ngx_str_t *lowcase);


/*
 * Never stored, never replayed: the fields that frame the message or
 * belong to one connection (RFC 9110 7.6.1, 6.4.1 and 8.6; proxy-* too),
 * and those nginx writes itself on every answer.  A second Content-Length
 * or a Transfer-Encoding beside nginx's own would let one forged record
 * desync a front proxy's connection or poison a cache.
 */
static ngx_str_t  ngx_http_idempotency_record_refused[] = {
    ngx_string("connection"),
    ngx_string("keep-alive"),
    ngx_string("te"),
    ngx_string("trailer"),
    ngx_string("transfer-encoding"),
    ngx_string("upgrade"),
    ngx_string("content-length"),
    ngx_string("date"),
    ngx_string("server"),
    ngx_string("idempotent-replayed"),
    ngx_null_string
};


/* RFC 9110 5.6.2 tchar */
static uint32_t  ngx_http_idempotency_tchar[] = {
    0x00000000, /* 0000 0000 0000 0000  0000 0000 0000 0000 */

                /* ?>=< ;:98 7654 3210  /.-, +*)( '&%$ #"!  */
    0x03ff6cfa, /* 0000 0011 1111 1111  0110 1100 1111 1010 */

                /* _^]\ [ZYX WVUT SRQP  ONML KJIH GFED CBA@ */
    0xc7fffffe, /* 1100 0111 1111 1111  1111 1111 1111 1110 */

                /*  ~}| {zyx wvut srqp  onml kjih gfed cba` */
    0x57ffffff, /* 0101 0111 1111 1111  1111 1111 1111 1111 */

    0x00000000, 0x00000000, 0x00000000, 0x00000000
};



ngx_int_t
ngx_http_idempotency_record_decode(u_char *data, size_t len,
    ngx_http_idempotency_record_t *rec)
{
    u_char  *p, *last;

    p = data;
    last = data + len;

    if (len < NGX_HTTP_IDEMPOTENCY_HEAD_LEN
        || ngx_memcmp(p, NGX_HTTP_IDEMPOTENCY_MAGIC, 4) != 0)
    {
        return NGX_ERROR;
    }

    ngx_memzero(rec, sizeof(ngx_http_idempotency_record_t));

    rec->state = p[4];
    rec->fingerprint = p + 5;
    rec->token = p + 5 + NGX_HTTP_IDEMPOTENCY_HASH_LEN;

    p += NGX_HTTP_IDEMPOTENCY_HEAD_LEN;

    switch (rec->state) {

    case NGX_HTTP_IDEMPOTENCY_REC_CLAIM:
        return p == last ? NGX_OK : NGX_ERROR;

    case NGX_HTTP_IDEMPOTENCY_REC_TOO_LARGE:
        if (last - p != 2) {
            return NGX_ERROR;
        }

        rec->status = ngx_http_idempotency_get16(p);

        return NGX_OK;

    case NGX_HTTP_IDEMPOTENCY_REC_DONE:
    case NGX_HTTP_IDEMPOTENCY_REC_DONE_TRAILERS:
        return ngx_http_idempotency_record_done(p, last, rec);

    default:
        return NGX_ERROR;
    }
}


/*
 * The plaintext of a sealed record, opened in place (crypt.c): its inner
 * state, then a done record after its head; the head is the clear one
 */

ngx_int_t
ngx_http_idempotency_record_decode_plain(u_char *head, u_char *p, size_t len,
    ngx_http_idempotency_record_t *rec)
{
    if (len == 0) {
        return NGX_ERROR;
    }

    ngx_memzero(rec, sizeof(ngx_http_idempotency_record_t));

    rec->state = p[0];
    rec->fingerprint = head + 5;
    rec->token = head + 5 + NGX_HTTP_IDEMPOTENCY_HASH_LEN;

    if (rec->state != NGX_HTTP_IDEMPOTENCY_REC_DONE
        && rec->state != NGX_HTTP_IDEMPOTENCY_REC_DONE_TRAILERS)
    {
        return NGX_ERROR;
    }

    return ngx_http_idempotency_record_done(p + 1, p + len, rec);
}


/* a done record from its status on; rec->state tells whether trailers */

static ngx_int_t
ngx_http_idempotency_record_done(u_char *p, u_char *last,
    ngx_http_idempotency_record_t *rec)
{
    uint32_t  n;
    uint64_t  body_len;

    if (last - p < 2 + 4) {
        return NGX_ERROR;
    }

    rec->status = ngx_http_idempotency_get16(p);
    p += 2;

    if (rec->status < 200 || rec->status > 599) {
        return NGX_ERROR;
    }

    n = ngx_http_idempotency_get32(p);
    p += 4;

    rec->nheaders = n;
    rec->headers = p;

    p = ngx_http_idempotency_record_fields(p, last, n, rec->status);
    if (p == NULL) {
        return NGX_ERROR;
    }

    rec->headers_end = p;

    if (last - p < 8) {
        return NGX_ERROR;
    }

    body_len = (uint64_t) ngx_http_idempotency_get32(p) << 32
               | ngx_http_idempotency_get32(p + 4);
    p += 8;

    rec->body = p;

    if (rec->state == NGX_HTTP_IDEMPOTENCY_REC_DONE) {

        if (body_len != (uint64_t) (last - p)) {
            return NGX_ERROR;
        }

        rec->body_len = body_len;

        return NGX_OK;
    }

    /* the trailers follow the body: at least one */

    if (last - p < 4 || body_len > (uint64_t) (last - p - 4)) {
        return NGX_ERROR;
    }

    rec->body_len = body_len;
    p += body_len;

    n = ngx_http_idempotency_get32(p);
    p += 4;

    if (n == 0) {
        return NGX_ERROR;
    }

    rec->ntrailers = n;
    rec->trailers = p;

    p = ngx_http_idempotency_record_fields(p, last, n, 0);

    return p == last ? NGX_OK : NGX_ERROR;
}


/*
 * Validates n (name, value) pairs; returns their end, or NULL.  The
 * headers (status set) may hold capture.c's markers, the trailers not.
 */

static u_char *
ngx_http_idempotency_record_fields(u_char *p, u_char *last, uint32_t n,
    ngx_uint_t status)
{
    uint32_t    l;
    ngx_str_t   name, value;
    ngx_uint_t  i;

    /* every field takes at least 8 bytes: bound n before looping on it */
    if (n > (size_t) (last - p) / 8) {
        return NULL;
    }

    ngx_str_null(&name);

    for (i = 0; i < (ngx_uint_t) n * 2; i++) {
        if (last - p < 4) {
            return NULL;
        }

        l = ngx_http_idempotency_get32(p);
        p += 4;

        if ((size_t) (last - p) < l || (i % 2 == 0 && l == 0)) {
            return NULL;
        }

        /* names and values go into a response: no CR, LF or NUL */
        if (ngx_strlchr(p, p + l, CR) || ngx_strlchr(p, p + l, LF)
            || ngx_strlchr(p, p + l, '\0'))
        {
            return NULL;
        }

        if (i % 2 == 0) {
            name.len = l;
            name.data = p;

        } else {
            value.len = l;
            value.data = p;

            if (!ngx_http_idempotency_record_field_ok(&name)
                && !(status
                     && ngx_http_idempotency_record_pseudo(&name, &value,
                                                           status)))
            {
                return NULL;
            }
        }

        p += l;
    }

    return p;
}


/*
 * Whether a field of a response may be stored, and so replayed: a name
 * that is an RFC 9110 token of at most NGX_HTTP_IDEMPOTENCY_NAME_MAX
 * bytes, and not on the refused list.  capture.c asks before storing, the
 * decoder refuses a record with any other: one rule for both.
 */

ngx_uint_t
ngx_http_idempotency_record_field_ok(ngx_str_t *name)
{
    u_char      c, buf[NGX_HTTP_IDEMPOTENCY_NAME_MAX];
    ngx_str_t   low, *s;
    ngx_uint_t  i;

    if (name->len == 0 || name->len > NGX_HTTP_IDEMPOTENCY_NAME_MAX) {
        return 0;
    }

    for (i = 0; i < name->len; i++) {
        c = name->data[i];

        if (!(ngx_http_idempotency_tchar[c >> 5] & (1U << (c & 0x1f)))) {
            return 0;
        }

        buf[i] = (c >= 'A' && c <= 'Z') ? (u_char) (c | 0x20) : c;
    }

    low.len = name->len;
    low.data = buf;

    if (low.len > 6 && ngx_strncmp(low.data, "proxy-", 6) == 0) {
        return 0;
    }

    for (s = ngx_http_idempotency_record_refused; s->len; s++) {
        if (ngx_http_idempotency_record_is(&low, s)) {
            return 0;
        }
    }

    return 1;
}


/*
 * The reason phrase capture.c keeps (":status-line"): the record's status
 * then a space and the phrase, or the status alone, of bytes that may be
 * in a status line (RFC 9112 4: HTAB, SP, VCHAR, obs-text).  nginx decides
 * by the status whether an answer has a body: a line naming another one
 * would frame the replay otherwise.
 */

ngx_uint_t
ngx_http_idempotency_record_status_line_ok(ngx_str_t *line,
    ngx_uint_t status)
{
    u_char  *p, *last;

    if (line->len < 3
        || line->data[0] != '0' + status / 100
        || line->data[1] != '0' + status / 10 % 10
        || line->data[2] != '0' + status % 10
        || (line->len > 3 && line->data[3] != ' '))
    {
        return 0;
    }

    last = line->data + line->len;

    for (p = line->data; p < last; p++) {
        if ((*p < 0x20 && *p != '\t') || *p == 0x7f) {
            return 0;
        }
    }

    return 1;
}


/* capture.c's markers, which are not tokens: each as it writes it */

static ngx_uint_t
ngx_http_idempotency_record_pseudo(ngx_str_t *name, ngx_str_t *value,
    ngx_uint_t status)
{
    static ngx_str_t  content_type = ngx_string(":content-type");
    static ngx_str_t  location = ngx_string(":location");
    static ngx_str_t  status_line = ngx_string(":status-line");

    if (ngx_http_idempotency_record_is(name, &content_type)) {
        return 1;
    }

    if (ngx_http_idempotency_record_is(name, &location)) {
        return value->len == 0;
    }

    if (ngx_http_idempotency_record_is(name, &status_line)) {
        return ngx_http_idempotency_record_status_line_ok(value, status);
    }

    return 0;
}


static ngx_uint_t
ngx_http_idempotency_record_is(ngx_str_t *name, ngx_str_t *lowcase)
{
    return name->len == lowcase->len
           && ngx_strncmp(name->data, lowcase->data, name->len) == 0;
}


/* walks a decoded (so already validated) header region */

u_char *
ngx_http_idempotency_record_next_header(u_char *p, ngx_str_t *name,
    ngx_str_t *value)
{
    name->len = ngx_http_idempotency_get32(p);
    name->data = p + 4;
    p += 4 + name->len;

    value->len = ngx_http_idempotency_get32(p);
    value->data = p + 4;
    p += 4 + value->len;

    return p;
}
