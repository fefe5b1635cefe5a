
/*
 * Copyright (C) The ngx_http_idempotency_module authors
 *
 * The bytes a node received, turned into replies.  hiredis's reader parses
 * them, except a large bulk string at the top level (a record being
 * replayed): that is read straight into a buffer of its own, which the
 * reply then owns and the claim keeps.  Through hiredis, a 256 KB record
 * was copied into its read buffer (grown by reallocations), then into the
 * reply, then by the claim: most of a large replay's user time.
 *
 * Redis is not trusted with the worker's memory nor its log: a reply may
 * hold no bulk string longer than the longest record (redis->reply_max)
 * and no more array elements than any legitimate reply; either is a
 * protocol error, the connection is dropped and made again.  Error text is
 * made safe to log here, once, for every caller.
 */


#include "ngx_http_idempotency_redis.h"


/*
 * The array elements one reply may declare, nested arrays included: an
 * array header makes hiredis allocate a pointer per element before any
 * arrives, so "*2147483647" alone took 16 GB.  The largest reply the
 * module asks for is CLUSTER SLOTS: at most 16384 slot ranges, each an
 * array of its bounds and of its nodes (address, port, id, metadata):
 * about 23 elements a range with two replicas, 380,000 in all.  2^20
 * leaves room for more replicas and caps the pointers at 8 MB a reply;
 * INFO, ROLE, SENTINEL and pub/sub messages are far smaller.
 */
#define NGX_HTTP_IDEMPOTENCY_ELEMENTS_MAX   (1024 * 1024)

/*
 * The longest bulk string a target without records sends (a Sentinel's
 * INFO or replies): 1 MB, far more than any of them holds
 */
#define NGX_HTTP_IDEMPOTENCY_REPLY_FLOOR    (1024 * 1024)

/* the longest error text passed up, control characters made visible */
#define NGX_HTTP_IDEMPOTENCY_ERROR_MAX      512


#if (HIREDIS_MAJOR >= 1)
typedef size_t  ngx_http_idempotency_elements_t;
#else
typedef int     ngx_http_idempotency_elements_t;
#endif


static void *ngx_http_idempotency_input_array(const redisReadTask *task,
    ngx_http_idempotency_elements_t elements);
static void *ngx_http_idempotency_input_string(const redisReadTask *task,
    char *str, size_t len);
static ngx_int_t ngx_http_idempotency_input_refuse(
    ngx_http_idempotency_node_t *node, const char *what, size_t max);
static size_t ngx_http_idempotency_input_max(
    ngx_http_idempotency_node_t *node);
static u_char *ngx_http_idempotency_input_scan(u_char *p, u_char *last,
    u_char **data, size_t *len);
static ngx_int_t ngx_http_idempotency_input_feed(
    ngx_http_idempotency_node_t *node, u_char *p, u_char *last);
static ngx_int_t ngx_http_idempotency_input_bulk(
    ngx_http_idempotency_node_t *node);


/* hiredis's own object functions, but for arrays and strings */
static redisReplyObjectFunctions   ngx_http_idempotency_input_fn;
static redisReplyObjectFunctions  *ngx_http_idempotency_input_hiredis;


/*
 * A new reader of the node's (conn.c): its arrays are counted and error
 * strings cleaned by wrappers around hiredis's functions, found in the
 * reader itself since hiredis does not export them
 */

void
ngx_http_idempotency_input_init(ngx_http_idempotency_node_t *node)
{
    redisReader  *reader;

    reader = node->reader;

    if (ngx_http_idempotency_input_hiredis == NULL) {
        ngx_http_idempotency_input_hiredis = reader->fn;
        ngx_http_idempotency_input_fn = *reader->fn;
        ngx_http_idempotency_input_fn.createArray =
                                             ngx_http_idempotency_input_array;
        ngx_http_idempotency_input_fn.createString =
                                             ngx_http_idempotency_input_string;
    }

    reader->fn = &ngx_http_idempotency_input_fn;
    reader->privdata = node;

    node->elements = 0;
}


/* refuses an array when the reply's elements would pass the bound */

static void *
ngx_http_idempotency_input_array(const redisReadTask *task,
    ngx_http_idempotency_elements_t elements)
{
    ngx_http_idempotency_node_t  *node = task->privdata;

    if (task->parent == NULL) {
        node->elements = 0;
    }

    if ((long long) elements < 0
        || (size_t) elements
           > NGX_HTTP_IDEMPOTENCY_ELEMENTS_MAX - node->elements)
    {
        /* hiredis says "out of memory": input_feed() says why */
        node->elements = NGX_HTTP_IDEMPOTENCY_ELEMENTS_MAX + 1;
        return NULL;
    }

    node->elements += elements;

    return ngx_http_idempotency_input_hiredis->createArray(task, elements);
}


/*
 * An error's text is logged by many callers (handler.c, claim.c, ...):
 * here, once, it loses what would forge or break a log line (a bare LF
 * starts a line of the server's choosing) and what is longer than any
 * error Redis sends (MOVED with a 255-byte host name is about 280 bytes)
 */

static void *
ngx_http_idempotency_input_string(const redisReadTask *task, char *str,
    size_t len)
{
    u_char      *p, *last;
    redisReply  *reply;

    reply = ngx_http_idempotency_input_hiredis->createString(task, str, len);

    if (reply == NULL || task->type != REDIS_REPLY_ERROR) {
        return reply;
    }

    if (reply->len > NGX_HTTP_IDEMPOTENCY_ERROR_MAX) {
        reply->len = NGX_HTTP_IDEMPOTENCY_ERROR_MAX;
        reply->str[reply->len] = '\0';
    }

    last = (u_char *) reply->str + reply->len;

    for (p = (u_char *) reply->str; p < last; p++) {
        if (*p < 0x20 || *p == 0x7f) {
            *p = '?';
        }
    }

    return reply;
}


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

        if (len > ngx_http_idempotency_input_max(node)) {
            return ngx_http_idempotency_input_refuse(node,
                             "a bulk string longer than any record",
                             ngx_http_idempotency_input_max(node));
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

        /* at most 9 digits: a 10th is more than any reply may hold */

        n = 0;

        while (q < last && *q >= '0' && *q <= '9' && q - start <= 9) {
            n = n * 10 + (*q++ - '0');
        }

        if (q < last && *q >= '0' && *q <= '9') {
            *data = q;
            *len = (size_t) -1;
            return start;
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

            if (node->elements > NGX_HTTP_IDEMPOTENCY_ELEMENTS_MAX) {
                return ngx_http_idempotency_input_refuse(node,
                             "more array elements than any reply holds",
                             NGX_HTTP_IDEMPOTENCY_ELEMENTS_MAX);
            }

            return NGX_DECLINED;
        }

        if (reply == NULL) {
            break;
        }

        if (ngx_http_idempotency_node_reply(node, reply) != NGX_OK) {
            /* the node is closed: nothing more to read on it */
            return NGX_ERROR;
        }
    }

    /*
     * what hiredis keeps of a reply not complete yet: a string inside an
     * array, or a large one whose header came in pieces
     */

    if (node->reader->len - node->reader->pos
        > ngx_http_idempotency_input_max(node) + 32)
    {
        return ngx_http_idempotency_input_refuse(node,
                             "a bulk string longer than any record",
                             ngx_http_idempotency_input_max(node));
    }

    return NGX_OK;
}


/*
 * A reply the module refuses: a protocol error, as hiredis's own, which
 * conn.c logs once and answers by connecting again
 */

static ngx_int_t
ngx_http_idempotency_input_refuse(ngx_http_idempotency_node_t *node,
    const char *what, size_t max)
{
    u_char       *p;
    redisReader  *reader;

    reader = node->reader;

    p = ngx_snprintf((u_char *) reader->errstr, sizeof(reader->errstr) - 1,
                     "%s (at most %uz)", what, max);
    *p = '\0';

    reader->err = REDIS_ERR_PROTOCOL;

    return NGX_DECLINED;
}


/* the longest bulk string a reply may hold: a record of the target's */

static size_t
ngx_http_idempotency_input_max(ngx_http_idempotency_node_t *node)
{
    return ngx_max(node->redis->reply_max, NGX_HTTP_IDEMPOTENCY_REPLY_FLOOR);
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
