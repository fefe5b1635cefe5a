
/*
 * Copyright (C) The ngx_http_idempotency_module authors
 *
 * A walk of the record keys, a page at a time, for the admin's listing:
 *
 *   SCAN <cursor> MATCH <prefix>{*} COUNT <n>
 *
 * on one master, then GETRANGE (the head, and a sealed record's key id)
 * and PTTL of each record it found, pipelined on the same node.  SCAN
 * visits a bounded part of the keyspace per call and never blocks the
 * server; a cluster is walked master after master (the redis layer's
 * order, the same in every worker).  Keys SCAN brings that are no record
 * of this module (a fresh-key record "...}:f", a staged copy, another
 * application's) are counted as scanned and not read.
 */


#include "ngx_http_idempotency_store.h"


static void ngx_http_idempotency_scan_step(ngx_http_idempotency_op_t *op,
    redisReply *reply);
static ngx_int_t ngx_http_idempotency_scan_cursor(redisReply *reply,
    uint64_t *cursor);
static ngx_uint_t ngx_http_idempotency_scan_record(
    ngx_http_idempotency_scan_t *scan, redisReply *key);
static ngx_int_t ngx_http_idempotency_scan_read(
    ngx_http_idempotency_scan_t *scan, redisReply *key);
static void ngx_http_idempotency_scan_got(ngx_http_idempotency_op_t *op,
    redisReply *reply);
static void ngx_http_idempotency_scan_next(ngx_http_idempotency_scan_t *scan,
    uint64_t cursor);
static void ngx_http_idempotency_scan_done(ngx_http_idempotency_scan_t *scan);


/*
 * Outside any request's pool: the replies of a page whose request has
 * gone still find it, and the last one frees it
 */

ngx_http_idempotency_scan_t *
ngx_http_idempotency_scan_create(ngx_http_idempotency_target_t *redis,
    ngx_log_t *log)
{
    ngx_http_idempotency_scan_t  *scan;

    scan = ngx_calloc(sizeof(ngx_http_idempotency_scan_t), log);
    if (scan == NULL) {
        return NULL;
    }

    scan->redis = redis;
    scan->log = log;

    return scan;
}


/*
 * NGX_OK: the handler will be called; NGX_DONE: no master at or after the
 * cursor's, an empty last page (the caller cancels the scan); NGX_ERROR:
 * no master to send to now
 */

ngx_int_t
ngx_http_idempotency_scan_start(ngx_http_idempotency_scan_t *scan)
{
    u_char                       *p;
    size_t                        i, argvlen[6];
    ngx_int_t                     rc;
    const char                   *argv[6];
    ngx_http_idempotency_op_t    *op;
    ngx_http_idempotency_node_t  *node;
    u_char                        cursor[NGX_INT64_LEN];
    u_char                        count[NGX_INT_T_LEN];
    u_char                        match[2 * NGX_HTTP_IDEMPOTENCY_PREFIX_MAX
                                        + 3];

    rc = ngx_http_idempotency_redis_master(scan->redis, &scan->master, &node);

    if (rc == NGX_DONE) {
        scan->end = 1;
        scan->cursor = 0;
        return NGX_DONE;
    }

    if (rc != NGX_OK || scan->prefix.len > NGX_HTTP_IDEMPOTENCY_PREFIX_MAX) {
        return NGX_ERROR;
    }

    /* the prefix matched as it is: its glob characters escaped */

    p = match;

    for (i = 0; i < scan->prefix.len; i++) {
        switch (scan->prefix.data[i]) {
        case '*': case '?': case '[': case ']': case '\\':
            *p++ = '\\';
        }

        *p++ = scan->prefix.data[i];
    }

    p = ngx_cpymem(p, "{*}", 3);

    op = ngx_http_idempotency_op_alloc(scan->redis);
    if (op == NULL) {
        return NGX_ERROR;
    }

    op->data = scan;
    op->handler = ngx_http_idempotency_scan_step;

    ngx_http_idempotency_arg(argv, argvlen, 0, "SCAN");
    argv[1] = (const char *) cursor;
    argvlen[1] = ngx_sprintf(cursor, "%uL", scan->cursor) - cursor;
    ngx_http_idempotency_arg(argv, argvlen, 2, "MATCH");
    argv[3] = (const char *) match;
    argvlen[3] = p - match;
    ngx_http_idempotency_arg(argv, argvlen, 4, "COUNT");
    argv[5] = (const char *) count;
    argvlen[5] = ngx_sprintf(count, "%ui", scan->count) - count;

    if (ngx_http_idempotency_node_command(node, op, 6, argv, argvlen)
        != NGX_OK)
    {
        return NGX_ERROR;
    }

    scan->node = node;
    scan->pending = 1;
    scan->at = ngx_http_idempotency_epoch_msec();

    return NGX_OK;
}


/* the request is gone: the replies still out free the scan */

void
ngx_http_idempotency_scan_cancel(ngx_http_idempotency_scan_t *scan)
{
    scan->handler = NULL;

    if (scan->pending == 0) {
        ngx_free(scan->keys);
        ngx_free(scan);
    }
}


/* [cursor, [key, ...]]: each record read, the walk's next place noted */

static void
ngx_http_idempotency_scan_step(ngx_http_idempotency_op_t *op,
    redisReply *reply)
{
    uint64_t                      cursor;
    ngx_uint_t                    i, n;
    ngx_http_idempotency_scan_t  *scan = op->data;

    scan->pending--;

    if (scan->handler == NULL) {
        ngx_http_idempotency_scan_cancel(scan);
        return;
    }

    if (reply == NULL || reply->type != REDIS_REPLY_ARRAY
        || reply->elements != 2
        || ngx_http_idempotency_scan_cursor(reply->element[0], &cursor)
           != NGX_OK
        || reply->element[1]->type != REDIS_REPLY_ARRAY
        || reply->element[1]->elements > NGX_HTTP_IDEMPOTENCY_SCAN_KEYS_MAX)
    {
        if (reply && reply->type == REDIS_REPLY_ERROR) {
            ngx_log_error(NGX_LOG_ERR, scan->log, 0,
                          "idempotency: redis \"%V\" refused SCAN: %*s",
                          &scan->redis->name, (size_t) reply->len,
                          reply->str);
        }

        scan->failed = 1;
        ngx_http_idempotency_scan_done(scan);
        return;
    }

    reply = reply->element[1];
    n = reply->elements;
    scan->scanned = n;

    if (n) {
        scan->keys = ngx_alloc(n * sizeof(ngx_http_idempotency_scan_key_t),
                               scan->log);
        if (scan->keys == NULL) {
            scan->failed = 1;
            ngx_http_idempotency_scan_done(scan);
            return;
        }
    }

    for (i = 0; i < n; i++) {
        if (!ngx_http_idempotency_scan_record(scan, reply->element[i])) {
            continue;
        }

        if (ngx_http_idempotency_scan_read(scan, reply->element[i])
            != NGX_OK)
        {
            scan->failed = 1;
            break;
        }
    }

    ngx_http_idempotency_scan_next(scan, cursor);

    if (scan->pending == 0) {
        ngx_http_idempotency_scan_done(scan);
    }
}


/* SCAN's cursor: an unsigned 64-bit decimal number */

static ngx_int_t
ngx_http_idempotency_scan_cursor(redisReply *reply, uint64_t *cursor)
{
    size_t     i;
    uint64_t   c;

    if (reply->type != REDIS_REPLY_STRING || reply->len == 0
        || reply->len > NGX_INT64_LEN - 1)
    {
        return NGX_ERROR;
    }

    c = 0;

    for (i = 0; i < reply->len; i++) {
        if (reply->str[i] < '0' || reply->str[i] > '9'
            || c > (UINT64_MAX - (reply->str[i] - '0')) / 10)
        {
            return NGX_ERROR;
        }

        c = c * 10 + (reply->str[i] - '0');
    }

    *cursor = c;

    return NGX_OK;
}


/* a record's key, exactly: <prefix>{64 lowercase hex digits} */

static ngx_uint_t
ngx_http_idempotency_scan_record(ngx_http_idempotency_scan_t *scan,
    redisReply *key)
{
    u_char  *p;
    size_t   i;

    if (key->type != REDIS_REPLY_STRING
        || (size_t) key->len
           != scan->prefix.len + 2 + NGX_HTTP_IDEMPOTENCY_HEX_LEN)
    {
        return 0;
    }

    p = (u_char *) key->str;

    if (ngx_memcmp(p, scan->prefix.data, scan->prefix.len) != 0) {
        return 0;
    }

    p += scan->prefix.len;

    if (p[0] != '{' || p[1 + NGX_HTTP_IDEMPOTENCY_HEX_LEN] != '}') {
        return 0;
    }

    for (i = 1; i <= NGX_HTTP_IDEMPOTENCY_HEX_LEN; i++) {
        if (!((p[i] >= '0' && p[i] <= '9') || (p[i] >= 'a' && p[i] <= 'f'))) {
            return 0;
        }
    }

    return 1;
}


/*
 * GETRANGE and PTTL on the node SCAN went to: its replies come in order,
 * two per record, and say which record they are about
 */

static ngx_int_t
ngx_http_idempotency_scan_read(ngx_http_idempotency_scan_t *scan,
    redisReply *key)
{
    size_t                            argvlen[4];
    ngx_uint_t                        i;
    const char                       *argv[4];
    ngx_http_idempotency_op_t        *op;
    ngx_http_idempotency_scan_key_t  *k;
    u_char                            last[NGX_INT_T_LEN];

    k = &scan->keys[scan->nkeys++];
    ngx_memcpy(k->hash, key->str + scan->prefix.len + 1,
               NGX_HTTP_IDEMPOTENCY_HEX_LEN);
    k->len = 0;
    k->pttl = -2;

    ngx_http_idempotency_arg(argv, argvlen, 0, "GETRANGE");
    argv[1] = key->str;
    argvlen[1] = key->len;
    ngx_http_idempotency_arg(argv, argvlen, 2, "0");
    argv[3] = (const char *) last;
    argvlen[3] = ngx_sprintf(last, "%uz", NGX_HTTP_IDEMPOTENCY_SCAN_HEAD - 1)
                 - last;

    for (i = 0; i < 2; i++) {
        op = ngx_http_idempotency_op_alloc(scan->redis);
        if (op == NULL) {
            return NGX_ERROR;
        }

        op->data = scan;
        op->handler = ngx_http_idempotency_scan_got;

        if (i == 1) {
            ngx_http_idempotency_arg(argv, argvlen, 0, "PTTL");
        }

        if (ngx_http_idempotency_node_command(scan->node, op, i ? 2 : 4,
                                              argv, argvlen)
            != NGX_OK)
        {
            return NGX_ERROR;
        }

        scan->pending++;
    }

    return NGX_OK;
}


static void
ngx_http_idempotency_scan_got(ngx_http_idempotency_op_t *op,
    redisReply *reply)
{
    ngx_uint_t                        n;
    ngx_http_idempotency_scan_t      *scan = op->data;
    ngx_http_idempotency_scan_key_t  *k;

    n = scan->replies++;
    scan->pending--;

    if (scan->handler == NULL) {
        ngx_http_idempotency_scan_cancel(scan);
        return;
    }

    k = &scan->keys[n / 2];

    if (reply == NULL || reply->type == REDIS_REPLY_ERROR) {
        /* a key moved to another master: the rest of the page still is */
        scan->failed = scan->failed || reply == NULL;

    } else if (n % 2 == 0 && reply->type == REDIS_REPLY_STRING) {
        k->len = ngx_min((size_t) reply->len,
                         (size_t) NGX_HTTP_IDEMPOTENCY_SCAN_HEAD);
        ngx_memcpy(k->head, reply->str, k->len);

    } else if (n % 2 == 1 && reply->type == REDIS_REPLY_INTEGER) {
        k->pttl = reply->integer;
    }

    if (scan->pending == 0) {
        ngx_http_idempotency_scan_done(scan);
    }
}


/*
 * Where the next page starts: on this master, or the next one from its
 * start, or nowhere (the walk is over)
 */

static void
ngx_http_idempotency_scan_next(ngx_http_idempotency_scan_t *scan,
    uint64_t cursor)
{
    ngx_uint_t                    next;
    ngx_http_idempotency_node_t  *node;

    scan->cursor = cursor;

    if (cursor != 0) {
        return;
    }

    next = scan->master + 1;

    /* not known now (a cluster's map): the next page looks again */

    if (ngx_http_idempotency_redis_master(scan->redis, &next, &node)
        == NGX_DONE)
    {
        scan->end = 1;
    }

    scan->master = next;
}


static void
ngx_http_idempotency_scan_done(ngx_http_idempotency_scan_t *scan)
{
    scan->handler(scan, scan->failed ? NGX_ERROR : NGX_OK);

    ngx_free(scan->keys);
    ngx_free(scan);
}
