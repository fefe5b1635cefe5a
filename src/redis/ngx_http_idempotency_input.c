
/*
 * Copyright (C) The ngx_http_idempotency_module authors
 *
 * The bytes a node received, turned into replies.  hiredis's reader parses
 * them, except a large bulk string at the top level (a record being
 * replayed): that is read straight into a buffer of its own, which the
 * reply then owns and the claim keeps.  Through hiredis, a 256 KB record
 * was copied into its read buffer (grown by reallocations), then into the
 * reply, then by the claim: most of a large replay's user time.
 */


#include "ngx_http_idempotency_redis.h"


static u_char *ngx_http_idempotency_input_scan(u_char *p, u_char *last,
    u_char **data, size_t *len);
static ngx_int_t ngx_http_idempotency_input_feed(
    ngx_http_idempotency_node_t *node, u_char *p, u_char *last);
static ngx_int_t ngx_http_idempotency_input_bulk(
    ngx_http_idempotency_node_t *node);


/*
 * Where the next recv() should put its bytes: the rest of a large bulk
 * string, or the node's read buffer
 */

u_char *
ngx_http_idempotency_input_buf(ngx_http_idempotency_node_t *node,
    size_t *size)
{
    if (node->bulk) {
        *size = node->bulk_size - node->bulk_got;
        return node->bulk + node->bulk_got;
    }

    *size = NGX_HTTP_IDEMPOTENCY_READ_SIZE;
    return node->in;
}


/*
 * n bytes have arrived where input_buf() said.  NGX_ERROR: the node was
 * closed by a reply's handler; NGX_DECLINED: the stream is not RESP.
 */

ngx_int_t
ngx_http_idempotency_input(ngx_http_idempotency_node_t *node, size_t n)
{
    u_char     *p, *q, *last, *data;
    size_t      len, size;
    ngx_int_t   rc;

    if (node->bulk) {
        node->bulk_got += n;

        if (node->bulk_got < node->bulk_size) {
            return NGX_OK;
        }

        return ngx_http_idempotency_input_bulk(node);
    }

    p = node->in;
    last = p + n;

    while (p < last) {
        data = NULL;
        q = last;

        if (node->reader->ridx == -1
            && node->reader->pos == node->reader->len)
        {
            /* at a reply's start: hiredis takes what precedes a large one */
            q = ngx_http_idempotency_input_scan(p, last, &data, &len);
        }

        rc = ngx_http_idempotency_input_feed(node, p, q);
        if (rc != NGX_OK || data == NULL) {
            return rc;
        }

        node->bulk_size = len + 2;
        node->bulk = ngx_alloc(node->bulk_size, node->redis->log);
        if (node->bulk == NULL) {
            return NGX_DECLINED;
        }

        size = ngx_min((size_t) (last - data), node->bulk_size);
        ngx_memcpy(node->bulk, data, size);
        node->bulk_got = size;
        p = data + size;

        if (node->bulk_got < node->bulk_size) {
            return NGX_OK;
        }

        rc = ngx_http_idempotency_input_bulk(node);
        if (rc != NGX_OK) {
            return rc;
        }
    }

    return NGX_OK;
}


/*
 * Skips the complete replies of simple types and small bulk strings from p.
 * Returns where a large bulk string's header starts (*data and *len name its
 * payload), or last: nothing large in what is here, or something (an
 * array, a header not complete yet) hiredis parses anyway.
 */

static u_char *
ngx_http_idempotency_input_scan(u_char *p, u_char *last, u_char **data,
    size_t *len)
{
    u_char  *q, *start;
    size_t   n;

    while (p < last) {

        switch (*p) {

        case '+':
        case '-':
        case ':':
            q = ngx_strlchr(p, last, LF);
            if (q == NULL) {
                return last;
            }

            p = q + 1;
            continue;

        case '$':
            break;

        default:
            return last;
        }

        start = p;
        q = p + 1;

        if (q < last && *q == '-') {
            /* nil */
            q = ngx_strlchr(q, last, LF);
            if (q == NULL) {
                return last;
            }

            p = q + 1;
            continue;
        }

        /* at most 9 digits: larger lengths are left to hiredis */

        n = 0;

        while (q < last && *q >= '0' && *q <= '9' && q - start <= 9) {
            n = n * 10 + (*q++ - '0');
        }

        if (q == start + 1 || last - q < 2 || q[0] != CR || q[1] != LF) {
            return last;
        }

        q += 2;

        if (n >= NGX_HTTP_IDEMPOTENCY_BULK_MIN) {
            *data = q;
            *len = n;
            return start;
        }

        if ((size_t) (last - q) < n + 2) {
            return last;
        }

        p = q + n + 2;
    }

    return last;
}


/* hiredis's part, and the replies it completes */

static ngx_int_t
ngx_http_idempotency_input_feed(ngx_http_idempotency_node_t *node,
    u_char *p, u_char *last)
{
    redisReply  *reply;

    if (p == last) {
        return NGX_OK;
    }

    if (redisReaderFeed(node->reader, (const char *) p, last - p)
        != REDIS_OK)
    {
        return NGX_DECLINED;
    }

    for ( ;; ) {
        if (redisReaderGetReply(node->reader, (void **) &reply) != REDIS_OK) {
            return NGX_DECLINED;
        }

        if (reply == NULL) {
            return NGX_OK;
        }

        if (ngx_http_idempotency_node_reply(node, reply) != NGX_OK) {
            /* the node is closed: nothing more to read on it */
            return NGX_ERROR;
        }
    }
}


/* a large bulk string is complete: its reply owns the buffer */

static ngx_int_t
ngx_http_idempotency_input_bulk(ngx_http_idempotency_node_t *node)
{
    u_char      *bulk;
    size_t       len;
    redisReply  *reply;

    bulk = node->bulk;
    len = node->bulk_size - 2;

    node->bulk = NULL;

    if (bulk[len] != CR || bulk[len + 1] != LF) {
        ngx_free(bulk);
        return NGX_DECLINED;
    }

    /* freeReplyObject() frees both with free(), as hiredis's own */

    reply = ngx_calloc(sizeof(redisReply), node->redis->log);
    if (reply == NULL) {
        ngx_free(bulk);
        return NGX_DECLINED;
    }

    bulk[len] = '\0';

    reply->type = REDIS_REPLY_STRING;
    reply->str = (char *) bulk;
    reply->len = len;

    if (ngx_http_idempotency_node_reply(node, reply) != NGX_OK) {
        return NGX_ERROR;
    }

    return NGX_OK;
}


/* the connection is gone: so is a bulk string half read */

void
ngx_http_idempotency_input_reset(ngx_http_idempotency_node_t *node)
{
    if (node->bulk) {
        ngx_free(node->bulk);
        node->bulk = NULL;
    }
}
