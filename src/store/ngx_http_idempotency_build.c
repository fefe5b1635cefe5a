
/*
 * Copyright (C) The ngx_http_idempotency_module authors
 *
 * Writing records: a completed response's record, built as the response
 * passes (its status and header fields, its body, its trailers), and the
 * too-large marker.  The format is record.c's, which reads them; no other
 * file knows where a byte goes.
 *
 * The fields are kept as they come (pointers into the response, which
 * lives as long as the request) and written when the header ends: the
 * record is allocated once at its size, with room for its body when the
 * body's length is known, which is then copied straight into place.  A
 * body of unknown length is kept in chunks and the record assembled at
 * its end, once.  A sealed record is encrypted where it is (crypt.c):
 * room is left after the head for its envelope and after the end for its
 * tag, neither counted in idempotency_store_max_size.
 */


#include "ngx_http_idempotency_store.h"


/* chunks of a body of unknown length */
#define NGX_HTTP_IDEMPOTENCY_CHUNK  16384


static size_t ngx_http_idempotency_build_size(ngx_http_idempotency_field_t *f,
    ngx_uint_t n);
static u_char *ngx_http_idempotency_build_fields(u_char *p,
    ngx_http_idempotency_field_t *f, ngx_uint_t n);
static u_char *ngx_http_idempotency_put32(u_char *p, uint32_t v);
static void ngx_http_idempotency_put64(u_char *p, uint64_t v);


/* the claim's head: magic and state; the caller fills the rest */

void
ngx_http_idempotency_head_claim(u_char *head)
{
    ngx_memcpy(head, NGX_HTTP_IDEMPOTENCY_MAGIC, 4);
    head[4] = NGX_HTTP_IDEMPOTENCY_REC_CLAIM;
}


/*
 * A record to build in pool: at most max bytes (envelope aside), sealed
 * with keys if set, for a body of expected bytes (-1: not known yet)
 */

ngx_int_t
ngx_http_idempotency_builder_init(ngx_http_idempotency_builder_t *bd,
    ngx_pool_t *pool, ngx_array_t *keys, size_t max, off_t expected)
{
    ngx_memzero(bd, sizeof(ngx_http_idempotency_builder_t));

    bd->pool = pool;
    bd->max = max;
    bd->room = ngx_http_idempotency_crypt_room(keys);
    bd->expected = expected;
    bd->chunks_last = &bd->chunks;

    return ngx_array_init(&bd->fields, pool, 8,
                          sizeof(ngx_http_idempotency_field_t));
}


/* a header field before the head is written, a trailer after the body */

ngx_int_t
ngx_http_idempotency_builder_field(ngx_http_idempotency_builder_t *bd,
    ngx_str_t *name, ngx_str_t *value)
{
    ngx_http_idempotency_field_t  *f;

    f = ngx_array_push(&bd->fields);
    if (f == NULL) {
        return NGX_ERROR;
    }

    f->name = *name;
    f->value = *value;

    return NGX_OK;
}


/*
 * The response's header is in: the record is allocated and written up to
 * its body, with the claim's head.  NGX_DECLINED: it cannot fit in max.
 */

ngx_int_t
ngx_http_idempotency_builder_head(ngx_http_idempotency_builder_t *bd,
    u_char *head, ngx_uint_t status)
{
    u_char  *p;
    size_t   size;

    bd->nheaders = bd->fields.nelts;

    size = NGX_HTTP_IDEMPOTENCY_DONE_FIXED
           + ngx_http_idempotency_build_size(bd->fields.elts, bd->nheaders);

    if (size > bd->max
        || (bd->expected > 0 && (size_t) bd->expected > bd->max - size))
    {
        return NGX_DECLINED;
    }

    if (bd->expected >= 0) {
        size += bd->expected;
    }

    size += bd->room;

    bd->start = ngx_pnalloc(bd->pool,
                            size + (bd->room ? NGX_HTTP_IDEMPOTENCY_TAG_LEN
                                             : 0));
    if (bd->start == NULL) {
        return NGX_ERROR;
    }

    bd->end = bd->start + size;

    p = ngx_cpymem(bd->start, head, NGX_HTTP_IDEMPOTENCY_HEAD_LEN);
    bd->start[4] = NGX_HTTP_IDEMPOTENCY_REC_DONE;
    p += bd->room;

    *p++ = (u_char) (status >> 8);
    *p++ = (u_char) status;

    p = ngx_http_idempotency_put32(p, bd->nheaders);
    p = ngx_http_idempotency_build_fields(p, bd->fields.elts, bd->nheaders);

    /* the body's length: now if it is known, else at the end */

    ngx_http_idempotency_put64(p, bd->expected >= 0 ? bd->expected : 0);
    bd->last = p + 8;

    return NGX_OK;
}


/*
 * The next n bytes of the body.  NGX_DECLINED: the record grew past max;
 * NGX_ABORT: the body is longer than its Content-Length; NGX_ERROR: no
 * memory.
 */

ngx_int_t
ngx_http_idempotency_builder_body(ngx_http_idempotency_builder_t *bd,
    u_char *pos, size_t n)
{
    size_t      room;
    ngx_buf_t  *cb;
    ngx_chain_t  *cl;

    if (bd->expected >= 0) {

        if ((size_t) (bd->end - bd->last) < n) {
            return NGX_ABORT;
        }

        bd->last = ngx_cpymem(bd->last, pos, n);
        bd->body_len += n;

        return NGX_OK;
    }

    if (n > bd->max - (bd->last - bd->start - bd->room) - bd->body_len) {
        return NGX_DECLINED;
    }

    while (n) {
        cb = bd->tail;

        if (cb == NULL || cb->last == cb->end) {
            cb = ngx_create_temp_buf(bd->pool,
                                     ngx_max(n, NGX_HTTP_IDEMPOTENCY_CHUNK));
            if (cb == NULL) {
                return NGX_ERROR;
            }

            cl = ngx_alloc_chain_link(bd->pool);
            if (cl == NULL) {
                return NGX_ERROR;
            }

            cl->buf = cb;
            cl->next = NULL;

            *bd->chunks_last = cl;
            bd->chunks_last = &cl->next;
            bd->tail = cb;
        }

        room = ngx_min(n, (size_t) (cb->end - cb->last));
        cb->last = ngx_cpymem(cb->last, pos, room);
        pos += room;
        bd->body_len += room;
        n -= room;
    }

    return NGX_OK;
}


/*
 * The response ended; fields added since the head are its trailers.  The
 * record, with room for a seal's tag, in *value.  header_only: no body
 * followed (204, HEAD), whatever Content-Length said.  NGX_DECLINED: the
 * trailers made it larger than max; NGX_ABORT: the body was shorter than
 * its Content-Length; NGX_ERROR: no memory.
 */

ngx_int_t
ngx_http_idempotency_builder_end(ngx_http_idempotency_builder_t *bd,
    ngx_uint_t header_only, u_char **value, size_t *len)
{
    u_char                        *p, *rec;
    size_t                         size, tlen;
    ngx_uint_t                     nt;
    ngx_chain_t                   *cl;
    ngx_http_idempotency_field_t  *f;

    f = (ngx_http_idempotency_field_t *) bd->fields.elts + bd->nheaders;
    nt = bd->fields.nelts - bd->nheaders;

    if (header_only && bd->expected >= 0) {
        /* the body's place, allocated for nothing, is given up */
        bd->end = bd->last;
        ngx_http_idempotency_put64(bd->last - 8, 0);
    }

    if (bd->expected >= 0 && bd->last != bd->end) {
        return NGX_ABORT;
    }

    size = (bd->expected >= 0) ? (size_t) (bd->end - bd->start)
                               : (size_t) (bd->last - bd->start) + bd->body_len;

    tlen = nt ? NGX_HTTP_IDEMPOTENCY_TRAILERS_FIXED
                + ngx_http_idempotency_build_size(f, nt)
              : 0;

    if (tlen > bd->max - (size - bd->room)) {
        return NGX_DECLINED;
    }

    if (bd->expected >= 0 && tlen == 0) {
        *value = bd->start;
        *len = size;
        return NGX_OK;
    }

    /* the record grows once, here: chunks or trailers */

    rec = ngx_pnalloc(bd->pool, size + tlen
                                + (bd->room ? NGX_HTTP_IDEMPOTENCY_TAG_LEN
                                            : 0));
    if (rec == NULL) {
        return NGX_ERROR;
    }

    p = ngx_cpymem(rec, bd->start, bd->last - bd->start);

    if (bd->expected < 0) {
        ngx_http_idempotency_put64(p - 8, bd->body_len);

        for (cl = bd->chunks; cl; cl = cl->next) {
            p = ngx_cpymem(p, cl->buf->pos, cl->buf->last - cl->buf->pos);
        }
    }

    if (nt) {
        /* a response without trailers stays state 2: older readers */
        rec[4] = NGX_HTTP_IDEMPOTENCY_REC_DONE_TRAILERS;
        p = ngx_http_idempotency_put32(p, nt);
        p = ngx_http_idempotency_build_fields(p, f, nt);
    }

    *value = rec;
    *len = p - rec;

    return NGX_OK;
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


static size_t
ngx_http_idempotency_build_size(ngx_http_idempotency_field_t *f,
    ngx_uint_t n)
{
    size_t      size;
    ngx_uint_t  i;

    size = 0;

    for (i = 0; i < n; i++) {
        size += 8 + f[i].name.len + f[i].value.len;
    }

    return size;
}


static u_char *
ngx_http_idempotency_build_fields(u_char *p, ngx_http_idempotency_field_t *f,
    ngx_uint_t n)
{
    ngx_uint_t  i;

    for (i = 0; i < n; i++) {
        p = ngx_http_idempotency_put32(p, f[i].name.len);
        p = ngx_cpymem(p, f[i].name.data, f[i].name.len);
        p = ngx_http_idempotency_put32(p, f[i].value.len);

        /* a marker's value is empty, with no data to copy from */

        if (f[i].value.len) {
            p = ngx_cpymem(p, f[i].value.data, f[i].value.len);
        }
    }

    return p;
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


static void
ngx_http_idempotency_put64(u_char *p, uint64_t v)
{
    p = ngx_http_idempotency_put32(p, (uint32_t) (v >> 32));
    (void) ngx_http_idempotency_put32(p, (uint32_t) v);
}
