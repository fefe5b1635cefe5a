
/*
 * Copyright (C) The ngx_http_idempotency_module authors
 *
 * Writing records: the claim head, a completed response's record (status,
 * fields, body length, trailers) and the too-large marker.  The format is
 * record.c's, which reads them; no other file knows where a byte goes.
 *
 * A record is built in two passes over the same fields: a builder that
 * measures (build_measure()) only adds up their sizes, so that the record
 * can be allocated once at its full size, and then one that writes
 * (build_begin()) puts them in place.
 */


#include "ngx_http_idempotency_store.h"


static u_char *ngx_http_idempotency_put32(u_char *p, uint32_t v);


/* the claim's head: magic and state; the caller fills the rest */

void
ngx_http_idempotency_head_claim(u_char *head)
{
    ngx_memcpy(head, NGX_HTTP_IDEMPOTENCY_MAGIC, 4);
    head[4] = NGX_HTTP_IDEMPOTENCY_REC_CLAIM;
}


void
ngx_http_idempotency_build_measure(ngx_http_idempotency_build_t *b,
    size_t fixed)
{
    b->pos = NULL;
    b->count = NULL;
    b->size = fixed;
    b->n = 0;
}


/*
 * A completed record at rec, with the claim's head: room bytes are left
 * after the head for a sealed record's envelope (crypt.c), then the status
 * and the place of the field count, filled by build_headers_end().
 */

void
ngx_http_idempotency_build_begin(ngx_http_idempotency_build_t *b,
    u_char *rec, u_char *head, size_t room, ngx_uint_t status)
{
    u_char  *p;

    p = ngx_cpymem(rec, head, NGX_HTTP_IDEMPOTENCY_HEAD_LEN);
    rec[4] = NGX_HTTP_IDEMPOTENCY_REC_DONE;
    p += room;

    *p++ = (u_char) (status >> 8);
    *p++ = (u_char) status;

    b->count = p;
    b->pos = p + 4;
    b->size = 0;
    b->n = 0;
}


void
ngx_http_idempotency_build_field(ngx_http_idempotency_build_t *b,
    ngx_str_t *name, ngx_str_t *value)
{
    u_char  *p;

    b->n++;

    if (b->pos == NULL) {
        b->size += 8 + name->len + value->len;
        return;
    }

    p = ngx_http_idempotency_put32(b->pos, name->len);
    p = ngx_cpymem(p, name->data, name->len);
    p = ngx_http_idempotency_put32(p, value->len);

    /* a marker's value is empty, with no data to copy from */

    if (value->len) {
        p = ngx_cpymem(p, value->data, value->len);
    }

    b->pos = p;
}


/*
 * The field count, then the body's length (0 until build_body_len() when
 * it is not known yet); returns where the body goes.
 */

u_char *
ngx_http_idempotency_build_headers_end(ngx_http_idempotency_build_t *b,
    uint64_t body_len)
{
    u_char  *body;

    (void) ngx_http_idempotency_put32(b->count, b->n);

    body = b->pos + 8;
    ngx_http_idempotency_build_body_len(body, body_len);

    return body;
}


void
ngx_http_idempotency_build_body_len(u_char *body, uint64_t len)
{
    u_char  *p;

    p = ngx_http_idempotency_put32(body - 8, (uint32_t) (len >> 32));
    (void) ngx_http_idempotency_put32(p, (uint32_t) len);
}


/*
 * The trailer section at p, the end of the completed record at rec: the
 * record's state says that one follows, then its count and its fields.
 */

void
ngx_http_idempotency_build_trailers(ngx_http_idempotency_build_t *b,
    u_char *rec, u_char *p)
{
    rec[4] = NGX_HTTP_IDEMPOTENCY_REC_DONE_TRAILERS;

    b->count = p;
    b->pos = p + 4;
    b->size = 0;
    b->n = 0;
}


void
ngx_http_idempotency_build_trailers_end(ngx_http_idempotency_build_t *b)
{
    (void) ngx_http_idempotency_put32(b->count, b->n);
}


/* "completed, too large to replay": the head and the status */

void
ngx_http_idempotency_build_too_large(u_char *buf, u_char *head,
    ngx_uint_t status)
{
    ngx_memcpy(buf, head, NGX_HTTP_IDEMPOTENCY_HEAD_LEN);
    buf[4] = NGX_HTTP_IDEMPOTENCY_REC_TOO_LARGE;
    buf[NGX_HTTP_IDEMPOTENCY_HEAD_LEN] = (u_char) (status >> 8);
    buf[NGX_HTTP_IDEMPOTENCY_HEAD_LEN + 1] = (u_char) status;
}


static u_char *
ngx_http_idempotency_put32(u_char *p, uint32_t v)
{
    *p++ = (u_char) (v >> 24);
    *p++ = (u_char) (v >> 16);
    *p++ = (u_char) (v >> 8);
    *p++ = (u_char) v;

    return p;
}
