
/*
 * Copyright (C) The ngx_http_idempotency_module authors
 *
 * What an operator reads of a key, or purges: the record as it is and its
 * time to live, or the record deleted unless a claim is in progress: by
 * the purge script, or, where scripting is forbidden and the server
 * compares and sets natively, by a read and the delete of what was read.
 *
 * The layer above asks once and is told once, through the handler it
 * gave, what came of it: it reads no reply and knows none of these
 * commands.  A fetch lives outside any request's memory, as a page of
 * scan.c does: the replies of one whose request has gone still find it,
 * and the last one frees it.
 */


#include "ngx_http_idempotency_store.h"


static ngx_http_idempotency_fetch_t *ngx_http_idempotency_fetch_create(
    ngx_http_idempotency_target_t *redis, ngx_str_t *rkey, ngx_log_t *log,
    ngx_http_idempotency_fetch_pt handler, void *data);
static ngx_int_t ngx_http_idempotency_fetch_send(
    ngx_http_idempotency_fetch_t *f, ngx_http_idempotency_reply_pt handler,
    int argc, const char **argv, size_t *argvlen);
static ngx_int_t ngx_http_idempotency_fetch_key(
    ngx_http_idempotency_fetch_t *f, ngx_http_idempotency_reply_pt handler,
    ngx_uint_t ttl);
static void ngx_http_idempotency_fetch_got(ngx_http_idempotency_op_t *op,
    redisReply *reply);
static void ngx_http_idempotency_fetch_pttl(ngx_http_idempotency_op_t *op,
    redisReply *reply);
static void ngx_http_idempotency_purge_deleted(ngx_http_idempotency_op_t *op,
    redisReply *reply);
static void ngx_http_idempotency_purge_read(ngx_http_idempotency_op_t *op,
    redisReply *reply);
static ngx_uint_t ngx_http_idempotency_purge_allowed(u_char *value,
    size_t len, ngx_uint_t force);
static ngx_int_t ngx_http_idempotency_purge_send(
    ngx_http_idempotency_fetch_t *f, ngx_uint_t del);
static void ngx_http_idempotency_purge_del(ngx_http_idempotency_op_t *op,
    redisReply *reply);
static void ngx_http_idempotency_purge_set(ngx_http_idempotency_op_t *op,
    redisReply *reply);
static ngx_http_idempotency_fetch_t *ngx_http_idempotency_purge_value(
    ngx_http_idempotency_op_t *op, redisReply *reply);
static ngx_http_idempotency_fetch_t *ngx_http_idempotency_fetch_reply(
    ngx_http_idempotency_op_t *op);
static ngx_int_t ngx_http_idempotency_fetch_keep(
    ngx_http_idempotency_fetch_t *f, redisReply *reply);
static void ngx_http_idempotency_fetch_refused(
    ngx_http_idempotency_fetch_t *f, redisReply *reply, const char *command);
static void ngx_http_idempotency_fetch_done(ngx_http_idempotency_fetch_t *f,
    ngx_uint_t result);


/*
 * purge: KEYS[1] the record key, ARGV[1] "1" to purge an in-progress
 * claim too.  0: no record; -1: in progress, not purged; 1: purged.  A
 * claim is in progress unless it is an unknown outcome (0xC1 'U' at 45).
 * GETRANGE reads nothing of a missing key and of an empty value alike:
 * DEL tells them apart, and removes the empty value, as the read and
 * delete of the native path do.
 */

static ngx_str_t  ngx_http_idempotency_purge_script = ngx_string(
    "local h = redis.call('GETRANGE', KEYS[1], 0, 52)\n"
    "if h == '' then return redis.call('DEL', KEYS[1]) end\n"
    "if ARGV[1] ~= '1' and string.byte(h, 5) == 1\n"
    "   and string.sub(h, 46, 47) ~= '\\193U' then\n"
    "  return -1\n"
    "end\n"
    "redis.call('DEL', KEYS[1])\n"
    "return 1\n"
);


/*
 * The record as Redis holds it (GET: nil, a claim, an unknown outcome,
 * done) and its time to live (PTTL, in milliseconds: -2 gone, -1 none),
 * pipelined on the key's node, so that their replies come in this order.
 * The handler is told FOUND, NONE or ERROR.  NULL: nothing was sent, or
 * what was is forgotten; the handler will not be called.
 */

ngx_http_idempotency_fetch_t *
ngx_http_idempotency_fetch(ngx_http_idempotency_target_t *redis,
    ngx_str_t *rkey, ngx_log_t *log, ngx_http_idempotency_fetch_pt handler,
    void *data)
{
    ngx_http_idempotency_fetch_t  *f;

    f = ngx_http_idempotency_fetch_create(redis, rkey, log, handler, data);
    if (f == NULL) {
        return NULL;
    }

    if (ngx_http_idempotency_fetch_key(f, ngx_http_idempotency_fetch_got, 0)
        != NGX_OK
        || ngx_http_idempotency_fetch_key(f, ngx_http_idempotency_fetch_pttl,
                                          1)
           != NGX_OK)
    {
        ngx_http_idempotency_fetch_cancel(f);
        return NULL;
    }

    return f;
}


/*
 * The record deleted, unless it is a claim in progress and force is not
 * given.  The handler is told PURGED, NONE, BUSY, CHANGED (between the
 * read and the delete, where there is no script: not deleted) or ERROR.
 * NULL as for a fetch.
 */

ngx_http_idempotency_fetch_t *
ngx_http_idempotency_purge(ngx_http_idempotency_target_t *redis,
    ngx_str_t *rkey, ngx_uint_t force, ngx_log_t *log,
    ngx_http_idempotency_fetch_pt handler, void *data)
{
    size_t                         argvlen[5];
    ngx_int_t                      rc;
    const char                    *argv[5];
    ngx_http_idempotency_fetch_t  *f;

    f = ngx_http_idempotency_fetch_create(redis, rkey, log, handler, data);
    if (f == NULL) {
        return NULL;
    }

    f->force = force ? 1 : 0;

    if (ngx_http_idempotency_native_cas(redis)) {
        /* no script: read, then delete only what was read */
        rc = ngx_http_idempotency_fetch_key(f,
                                          ngx_http_idempotency_purge_read, 0);

    } else {
        ngx_http_idempotency_arg(argv, argvlen, 0, "EVAL");
        argv[1] = (const char *) ngx_http_idempotency_purge_script.data;
        argvlen[1] = ngx_http_idempotency_purge_script.len;
        ngx_http_idempotency_arg(argv, argvlen, 2, "1");
        argv[3] = (const char *) f->rkey.data;
        argvlen[3] = f->rkey.len;

        if (force) {
            ngx_http_idempotency_arg(argv, argvlen, 4, "1");

        } else {
            ngx_http_idempotency_arg(argv, argvlen, 4, "0");
        }

        rc = ngx_http_idempotency_fetch_send(f,
                                             ngx_http_idempotency_purge_deleted,
                                             5, argv, argvlen);
    }

    if (rc != NGX_OK) {
        ngx_http_idempotency_fetch_cancel(f);
        return NULL;
    }

    return f;
}


/*
 * The caller no longer waits (its request is done or gone): the handler
 * is not called, and the replies still out free the fetch
 */

void
ngx_http_idempotency_fetch_cancel(ngx_http_idempotency_fetch_t *f)
{
    f->handler = NULL;

    if (f->pending == 0) {
        ngx_free(f->value);
        ngx_free(f);
    }
}


static ngx_http_idempotency_fetch_t *
ngx_http_idempotency_fetch_create(ngx_http_idempotency_target_t *redis,
    ngx_str_t *rkey, ngx_log_t *log, ngx_http_idempotency_fetch_pt handler,
    void *data)
{
    ngx_http_idempotency_fetch_t  *f;

    if (rkey->len > NGX_HTTP_IDEMPOTENCY_STORE_KEY_MAX) {
        return NULL;
    }

    f = ngx_calloc(sizeof(ngx_http_idempotency_fetch_t), log);
    if (f == NULL) {
        return NULL;
    }

    f->redis = redis;
    f->log = log;
    f->handler = handler;
    f->data = data;
    f->pttl = -1;

    f->rkey.len = rkey->len;
    f->rkey.data = f->key;
    ngx_memcpy(f->key, rkey->data, rkey->len);

    return f;
}


/* a command about the key, routed by it (its slot on a cluster) */

static ngx_int_t
ngx_http_idempotency_fetch_send(ngx_http_idempotency_fetch_t *f,
    ngx_http_idempotency_reply_pt handler, int argc, const char **argv,
    size_t *argvlen)
{
    ngx_http_idempotency_key_op_t  *kop;

    kop = ngx_http_idempotency_key_op_alloc(f->redis, &f->rkey);
    if (kop == NULL) {
        return NGX_ERROR;
    }

    kop->op.data = f;
    kop->op.handler = handler;

    if (ngx_http_idempotency_redis_command(&kop->op, argc, argv, argvlen)
        != NGX_OK)
    {
        return NGX_ERROR;
    }

    f->pending++;

    return NGX_OK;
}


/* GET <key>, or PTTL <key> */

static ngx_int_t
ngx_http_idempotency_fetch_key(ngx_http_idempotency_fetch_t *f,
    ngx_http_idempotency_reply_pt handler, ngx_uint_t ttl)
{
    size_t       argvlen[2];
    const char  *argv[2];

    if (ttl) {
        ngx_http_idempotency_arg(argv, argvlen, 0, "PTTL");

    } else {
        ngx_http_idempotency_arg(argv, argvlen, 0, "GET");
    }

    argv[1] = (const char *) f->rkey.data;
    argvlen[1] = f->rkey.len;

    return ngx_http_idempotency_fetch_send(f, handler, 2, argv, argvlen);
}


/* the GET's value kept for the PTTL's reply, which tells the caller */

static void
ngx_http_idempotency_fetch_got(ngx_http_idempotency_op_t *op,
    redisReply *reply)
{
    ngx_http_idempotency_fetch_t  *f;

    f = ngx_http_idempotency_fetch_reply(op);
    if (f == NULL) {
        return;
    }

    if (reply == NULL
        || (reply->type != REDIS_REPLY_STRING
            && reply->type != REDIS_REPLY_NIL))
    {
        ngx_http_idempotency_fetch_refused(f, reply, "GET");
        return;
    }

    if (reply->type == REDIS_REPLY_STRING) {
        if (ngx_http_idempotency_fetch_keep(f, reply) != NGX_OK) {
            return;
        }

        f->found = 1;
    }

    f->got = 1;
}


static void
ngx_http_idempotency_fetch_pttl(ngx_http_idempotency_op_t *op,
    redisReply *reply)
{
    ngx_http_idempotency_fetch_t  *f;

    f = ngx_http_idempotency_fetch_reply(op);
    if (f == NULL) {
        return;
    }

    if (reply == NULL || reply->type != REDIS_REPLY_INTEGER || !f->got) {
        ngx_http_idempotency_fetch_refused(f, reply, "PTTL");
        ngx_http_idempotency_fetch_done(f, NGX_HTTP_IDEMPOTENCY_FETCH_ERROR);
        return;
    }

    if (!f->found) {
        ngx_http_idempotency_fetch_done(f, NGX_HTTP_IDEMPOTENCY_FETCH_NONE);
        return;
    }

    f->pttl = reply->integer;

    ngx_http_idempotency_fetch_done(f, NGX_HTTP_IDEMPOTENCY_FETCH_FOUND);
}


/* the purge script's: 1 purged, -1 in progress, 0 (or else) no record */

static void
ngx_http_idempotency_purge_deleted(ngx_http_idempotency_op_t *op,
    redisReply *reply)
{
    ngx_http_idempotency_fetch_t  *f;

    f = ngx_http_idempotency_fetch_reply(op);
    if (f == NULL) {
        return;
    }

    if (reply == NULL || reply->type != REDIS_REPLY_INTEGER) {
        ngx_http_idempotency_fetch_refused(f, reply, "delete");
        ngx_http_idempotency_fetch_done(f, NGX_HTTP_IDEMPOTENCY_FETCH_ERROR);
        return;
    }

    switch (reply->integer) {

    case 1:
        ngx_http_idempotency_fetch_done(f, NGX_HTTP_IDEMPOTENCY_FETCH_PURGED);
        return;

    case -1:
        ngx_http_idempotency_fetch_done(f, NGX_HTTP_IDEMPOTENCY_FETCH_BUSY);
        return;

    default:
        ngx_http_idempotency_fetch_done(f, NGX_HTTP_IDEMPOTENCY_FETCH_NONE);
    }
}


/* the record as read: a claim in progress, or deleted */

static void
ngx_http_idempotency_purge_read(ngx_http_idempotency_op_t *op,
    redisReply *reply)
{
    ngx_http_idempotency_fetch_t  *f;

    f = ngx_http_idempotency_purge_value(op, reply);
    if (f == NULL) {
        return;
    }

    if (!ngx_http_idempotency_purge_allowed((u_char *) reply->str,
                                            reply->len, f->force))
    {
        ngx_http_idempotency_fetch_done(f, NGX_HTTP_IDEMPOTENCY_FETCH_BUSY);
        return;
    }

    /* kept to compare with what the delete finds */

    if (ngx_http_idempotency_fetch_keep(f, reply) != NGX_OK
        || ngx_http_idempotency_purge_send(f, 1) != NGX_OK)
    {
        ngx_http_idempotency_fetch_done(f, NGX_HTTP_IDEMPOTENCY_FETCH_ERROR);
    }
}


/*
 * Without a script: what was read may be purged unless it is a claim in
 * progress (a claim that is no unknown outcome), as the script decides;
 * anything with force.
 */

static ngx_uint_t
ngx_http_idempotency_purge_allowed(u_char *value, size_t len,
    ngx_uint_t force)
{
    ngx_uint_t  status;

    if (force || len < 5 || value[4] != NGX_HTTP_IDEMPOTENCY_REC_CLAIM) {
        return 1;
    }

    return len == NGX_HTTP_IDEMPOTENCY_HEAD_LEN
           && ngx_http_idempotency_lease_read(value, &status, 0, 0)
              == NGX_HTTP_IDEMPOTENCY_LEASE_UNKNOWN;
}


/*
 * The delete of exactly what was read.  With del, where the server
 * compares and deletes: DELIFEQ or DELEX ... IFEQ, 1 deleted, 0 not.  Else
 * (or to learn what a failed one met) SET <key> <value> IFEQ <value> GET
 * PX 1, the record set to itself for a millisecond, its old value back,
 * matched or not, to be compared with what was read.
 */

static ngx_int_t
ngx_http_idempotency_purge_send(ngx_http_idempotency_fetch_t *f,
    ngx_uint_t del)
{
    int          argc;
    size_t       argvlen[8];
    const char  *argv[8];

    if (del && ngx_http_idempotency_has_delifeq(f->redis)) {
        argc = ngx_http_idempotency_delifeq_args(f->redis, argv, argvlen,
                                                 &f->rkey, f->value, f->len);

        return ngx_http_idempotency_fetch_send(f,
                                               ngx_http_idempotency_purge_del,
                                               argc, argv, argvlen);
    }

    ngx_http_idempotency_cas_args(argv, argvlen, &f->rkey, f->value, f->len,
                                  f->value);
    argvlen[4] = f->len;        /* compared with the whole record */
    ngx_http_idempotency_arg(argv, argvlen, 5, "GET");
    ngx_http_idempotency_arg(argv, argvlen, 6, "PX");
    ngx_http_idempotency_arg(argv, argvlen, 7, "1");

    return ngx_http_idempotency_fetch_send(f, ngx_http_idempotency_purge_set,
                                           8, argv, argvlen);
}


/*
 * The compare-and-delete's: 1 purged; 0 gone or changed since the read,
 * or the delete refused (an ACL without it), and the compare-and-set
 * tells which (as it does the purge where the delete is refused)
 */

static void
ngx_http_idempotency_purge_del(ngx_http_idempotency_op_t *op,
    redisReply *reply)
{
    ngx_http_idempotency_fetch_t  *f;

    f = ngx_http_idempotency_fetch_reply(op);
    if (f == NULL) {
        return;
    }

    if (reply && reply->type == REDIS_REPLY_INTEGER && reply->integer == 1) {
        ngx_http_idempotency_fetch_done(f, NGX_HTTP_IDEMPOTENCY_FETCH_PURGED);
        return;
    }

    if (reply
        && (reply->type == REDIS_REPLY_INTEGER
            || (reply->type == REDIS_REPLY_ERROR
                && ngx_http_idempotency_delifeq_refused(f->redis, reply)
                   == NGX_OK))
        && ngx_http_idempotency_purge_send(f, 0) == NGX_OK)
    {
        return;
    }

    ngx_http_idempotency_fetch_refused(f, reply, "delete");
    ngx_http_idempotency_fetch_done(f, NGX_HTTP_IDEMPOTENCY_FETCH_ERROR);
}


/*
 * What the compare-and-set found: what was read (deleted), nothing (gone
 * since), or something else (a new claim or record since: not deleted)
 */

static void
ngx_http_idempotency_purge_set(ngx_http_idempotency_op_t *op,
    redisReply *reply)
{
    ngx_http_idempotency_fetch_t  *f;

    f = ngx_http_idempotency_purge_value(op, reply);
    if (f == NULL) {
        return;
    }

    ngx_http_idempotency_fetch_done(f,
                                    ((size_t) reply->len == f->len
                                     && ngx_memcmp(reply->str, f->value,
                                                   f->len)
                                        == 0)
                                    ? NGX_HTTP_IDEMPOTENCY_FETCH_PURGED
                                    : NGX_HTTP_IDEMPOTENCY_FETCH_CHANGED);
}


/*
 * A purge's read or compare-and-set, if its reply is a value: else the
 * caller is told (no record, or an error), or nobody waits
 */

static ngx_http_idempotency_fetch_t *
ngx_http_idempotency_purge_value(ngx_http_idempotency_op_t *op,
    redisReply *reply)
{
    ngx_http_idempotency_fetch_t  *f;

    f = ngx_http_idempotency_fetch_reply(op);
    if (f == NULL) {
        return NULL;
    }

    if (reply && reply->type == REDIS_REPLY_STRING) {
        return f;
    }

    if (reply && reply->type == REDIS_REPLY_NIL) {
        ngx_http_idempotency_fetch_done(f, NGX_HTTP_IDEMPOTENCY_FETCH_NONE);

    } else {
        ngx_http_idempotency_fetch_refused(f, reply, "read");
        ngx_http_idempotency_fetch_done(f, NGX_HTTP_IDEMPOTENCY_FETCH_ERROR);
    }

    return NULL;
}


/* a reply's fetch; NULL: cancelled (freed with the last reply) */

static ngx_http_idempotency_fetch_t *
ngx_http_idempotency_fetch_reply(ngx_http_idempotency_op_t *op)
{
    ngx_http_idempotency_fetch_t  *f = op->data;

    f->pending--;

    if (f->handler == NULL) {
        ngx_http_idempotency_fetch_cancel(f);
        return NULL;
    }

    return f;
}


/* a value in the fetch's memory: its reply is freed when it returns */

static ngx_int_t
ngx_http_idempotency_fetch_keep(ngx_http_idempotency_fetch_t *f,
    redisReply *reply)
{
    /* one byte more: an empty value is kept too */

    f->value = ngx_alloc(reply->len + 1, f->log);
    if (f->value == NULL) {
        return NGX_ERROR;
    }

    ngx_memcpy(f->value, reply->str, reply->len);
    f->len = reply->len;

    return NGX_OK;
}


/*
 * Redis refused one of the admin's commands (an ACL without +pttl, say):
 * the caller's answer sends the operator to the error log, which must then
 * say why
 */

static void
ngx_http_idempotency_fetch_refused(ngx_http_idempotency_fetch_t *f,
    redisReply *reply, const char *command)
{
    if (reply == NULL || reply->type != REDIS_REPLY_ERROR) {
        return;
    }

    ngx_log_error(NGX_LOG_ERR, f->log, 0,
                  "idempotency: redis \"%V\" refused the admin's %s: %*s, "
                  "at \"%V\"", &f->redis->name, command,
                  (size_t) reply->len, reply->str, &f->rkey);
}


/* the caller told, once; the fetch is freed after, with its value */

static void
ngx_http_idempotency_fetch_done(ngx_http_idempotency_fetch_t *f,
    ngx_uint_t result)
{
    f->handler(f, result);

    ngx_http_idempotency_fetch_cancel(f);
}


/*
 * What can be read of a sealed record without its key: the id of the key
 * that sealed it, clear after the head (version 1 | id_len | id, as
 * crypt.c writes it).  NGX_DECLINED: not sealed; NGX_ERROR: sealed, but no
 * envelope this module knows, or its id is not printable.
 */

ngx_int_t
ngx_http_idempotency_sealed_id(u_char *data, size_t len, ngx_str_t *id)
{
    u_char  *p;
    size_t   i;

    if (len <= NGX_HTTP_IDEMPOTENCY_HEAD_LEN
        || data[4] != NGX_HTTP_IDEMPOTENCY_REC_SEALED
        || ngx_memcmp(data, NGX_HTTP_IDEMPOTENCY_MAGIC, 4) != 0)
    {
        return NGX_DECLINED;
    }

    p = data + NGX_HTTP_IDEMPOTENCY_HEAD_LEN;

    if (len < NGX_HTTP_IDEMPOTENCY_HEAD_LEN + 2 || p[0] != 1) {
        return NGX_ERROR;
    }

    id->len = p[1];
    id->data = p + 2;

    if (id->len == 0 || id->len > 32
        || (size_t) (data + len - id->data) < id->len)
    {
        return NGX_ERROR;
    }

    for (i = 0; i < id->len; i++) {
        if (id->data[i] <= 0x20 || id->data[i] >= 0x7f) {
            return NGX_ERROR;
        }
    }

    return NGX_OK;
}
