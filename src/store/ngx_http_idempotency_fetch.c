
/*
 * Copyright (C) The ngx_http_idempotency_module authors
 *
 * What an operator reads of a key, or purges: the record as it is and its
 * time to live, or the record deleted unless a claim is in progress: by
 * the purge script, or, where scripting is forbidden and the server
 * compares and sets natively, by a read and the delete of what was read.
 */


#include "ngx_http_idempotency_store.h"


/*
 * purge: KEYS[1] the record key, ARGV[1] "1" to purge an in-progress
 * claim too.  0: no record; -1: in progress, not purged; 1: purged.  A
 * claim is in progress unless it is an unknown outcome (0xC1 'U' at 45).
 */

static ngx_str_t  ngx_http_idempotency_purge_script = ngx_string(
    "local h = redis.call('GETRANGE', KEYS[1], 0, 52)\n"
    "if h == '' then return 0 end\n"
    "if ARGV[1] ~= '1' and string.byte(h, 5) == 1\n"
    "   and string.sub(h, 46, 47) ~= '\\193U' then\n"
    "  return -1\n"
    "end\n"
    "redis.call('DEL', KEYS[1])\n"
    "return 1\n"
);


/*
 * The record as Redis holds it (GET: nil, a claim, an unknown outcome,
 * done), or its time to live (PTTL, in milliseconds: -2 gone, -1 none).
 */

ngx_int_t
ngx_http_idempotency_fetch_command(ngx_http_idempotency_op_t *op,
    ngx_str_t *rkey, ngx_uint_t ttl)
{
    size_t       argvlen[2];
    const char  *argv[2];

    if (ttl) {
        ngx_http_idempotency_arg(argv, argvlen, 0, "PTTL");

    } else {
        ngx_http_idempotency_arg(argv, argvlen, 0, "GET");
    }

    argv[1] = (const char *) rkey->data;
    argvlen[1] = rkey->len;

    return ngx_http_idempotency_redis_command(op, 2, argv, argvlen);
}


ngx_int_t
ngx_http_idempotency_purge_command(ngx_http_idempotency_op_t *op,
    ngx_str_t *rkey, ngx_uint_t force)
{
    size_t       argvlen[5];
    const char  *argv[5];

    ngx_http_idempotency_arg(argv, argvlen, 0, "EVAL");
    argv[1] = (const char *) ngx_http_idempotency_purge_script.data;
    argvlen[1] = ngx_http_idempotency_purge_script.len;
    ngx_http_idempotency_arg(argv, argvlen, 2, "1");
    argv[3] = (const char *) rkey->data;
    argvlen[3] = rkey->len;

    if (force) {
        ngx_http_idempotency_arg(argv, argvlen, 4, "1");

    } else {
        ngx_http_idempotency_arg(argv, argvlen, 4, "0");
    }

    return ngx_http_idempotency_redis_command(op, 5, argv, argvlen);
}


/*
 * Without a script: what was read may be purged unless it is a claim in
 * progress (a claim that is no unknown outcome), as the script decides;
 * anything with force.
 */

ngx_uint_t
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
 * The delete of exactly what was read.  With del (the caller knows the
 * server compares and deletes): DELIFEQ or DELEX ... IFEQ, 1 deleted, 0
 * not.  Else SET <key> <value> IFEQ <value> GET PX 1, the record set to itself
 * for a millisecond, its old value back, matched or not: the caller
 * compares it with what it read.  On NGX_ERROR the op has been freed.
 */

ngx_int_t
ngx_http_idempotency_purge_native_command(ngx_http_idempotency_op_t *op,
    ngx_str_t *rkey, u_char *value, size_t len, ngx_uint_t del)
{
    int          argc;
    size_t       argvlen[8];
    const char  *argv[8];

    if (del) {
        argc = ngx_http_idempotency_delifeq_args(op->redis, argv, argvlen,
                                                 rkey, value, len);

        return ngx_http_idempotency_redis_command(op, argc, argv, argvlen);
    }

    ngx_http_idempotency_cas_args(argv, argvlen, rkey, value, len, value);
    argvlen[4] = len;       /* compared with the whole record */
    ngx_http_idempotency_arg(argv, argvlen, 5, "GET");
    ngx_http_idempotency_arg(argv, argvlen, 6, "PX");
    ngx_http_idempotency_arg(argv, argvlen, 7, "1");

    return ngx_http_idempotency_redis_command(op, 8, argv, argvlen);
}


/*
 * A purge's compare-and-delete: NGX_OK deleted; NGX_DECLINED not deleted
 * (0: gone or changed since the read) or the delete refused, and the
 * compare-and-set tells which; NGX_ERROR no reply or another error
 */

ngx_int_t
ngx_http_idempotency_purge_del_result(ngx_http_idempotency_redis_t *redis,
    redisReply *reply)
{
    if (reply == NULL) {
        return NGX_ERROR;
    }

    if (reply->type == REDIS_REPLY_INTEGER) {
        return reply->integer == 1 ? NGX_OK : NGX_DECLINED;
    }

    if (reply->type == REDIS_REPLY_ERROR
        && ngx_http_idempotency_delifeq_refused(redis, reply) == NGX_OK)
    {
        return NGX_DECLINED;
    }

    return NGX_ERROR;
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
