
/*
 * Copyright (C) The ngx_http_idempotency_module authors
 *
 * A claim or a record on the replicas before it counts: WAIT, or WAITAOF
 * for their disks, on the connection that wrote it.
 */


#include "ngx_http_idempotency_store.h"


/*
 * WAIT number timeout, or WAITAOF 1 number timeout (numlocal 1: the
 * primary's own fsync is always asked for).  On NGX_ERROR the op has been
 * freed.
 */

ngx_int_t
ngx_http_idempotency_durable_command(ngx_http_idempotency_key_op_t *kop,
    ngx_uint_t number, ngx_msec_t timeout_ms, ngx_uint_t aof)
{
    int          n;
    u_char       replicas[NGX_INT_T_LEN], timeout[NGX_INT_T_LEN];
    size_t       argvlen[4];
    const char  *argv[4];

    kop->replicas = number;
    kop->aof = aof;
    kop->won = 0;

    n = 0;

    if (kop->aof) {
        ngx_http_idempotency_arg(argv, argvlen, n++, "WAITAOF");
        ngx_http_idempotency_arg(argv, argvlen, n++, "1");

    } else {
        ngx_http_idempotency_arg(argv, argvlen, n++, "WAIT");
    }

    argv[n] = (const char *) replicas;
    argvlen[n++] = ngx_sprintf(replicas, "%ui", number) - replicas;
    argv[n] = (const char *) timeout;
    argvlen[n++] = ngx_sprintf(timeout, "%M", timeout_ms) - timeout;

    kop->op.block = timeout_ms;

    return ngx_http_idempotency_redis_command(&kop->op, n, argv, argvlen);
}


/*
 * NGX_OK: enough replicas acknowledged (and, with WAITAOF, the primary
 * fsynced); else the reason is logged, naming what was waited for
 */

ngx_int_t
ngx_http_idempotency_durable_result(ngx_http_idempotency_key_op_t *kop,
    redisReply *reply, ngx_log_t *log, ngx_str_t *info)
{
    const char  *what, *cmd;
    redisReply  *local, *replicas;

    what = kop->won ? "claim, released" : "stored record";
    cmd = kop->aof ? "WAITAOF" : "WAIT";

    if (reply == NULL) {
        ngx_log_error(NGX_LOG_ERR, log, 0,
                      "idempotency: redis \"%V\" went away before %s "
                      "answered for the %s, %V", &kop->op.redis->name, cmd,
                      what, info);
        return NGX_ERROR;
    }

    if (!kop->aof && reply->type == REDIS_REPLY_INTEGER) {

        if (reply->integer >= (long long) kop->replicas) {
            return NGX_OK;
        }

        ngx_log_error(NGX_LOG_ERR, log, 0,
                      "idempotency: redis \"%V\": %L of %ui replicas "
                      "acknowledged the %s, %V", &kop->op.redis->name,
                      (int64_t) reply->integer, kop->replicas, what, info);
        return NGX_ERROR;
    }

    /* WAITAOF: [fsynced on the primary (0 or 1), replicas that fsynced] */

    if (kop->aof && reply->type == REDIS_REPLY_ARRAY && reply->elements == 2
        && reply->element[0]->type == REDIS_REPLY_INTEGER
        && reply->element[1]->type == REDIS_REPLY_INTEGER)
    {
        local = reply->element[0];
        replicas = reply->element[1];

        if (local->integer >= 1
            && replicas->integer >= (long long) kop->replicas)
        {
            return NGX_OK;
        }

        ngx_log_error(NGX_LOG_ERR, log, 0,
                      "idempotency: redis \"%V\": %L of 1 primary and %L "
                      "of %ui replicas fsynced the %s, %V",
                      &kop->op.redis->name,
                      (int64_t) local->integer, (int64_t) replicas->integer,
                      kop->replicas, what, info);
        return NGX_ERROR;
    }

    if (reply->type == REDIS_REPLY_ERROR && kop->aof
        && ngx_strlcasestrn((u_char *) reply->str,
                            (u_char *) reply->str + reply->len,
                            (u_char *) "unknown command",
                            sizeof("unknown command") - 1 - 1)
           != NULL)
    {
        /* Redis before 7.2: never taken for an acknowledgement */

        ngx_log_error(NGX_LOG_ERR, log, 0,
                      "idempotency: redis \"%V\" has no WAITAOF (Redis 7.2 "
                      "or later, or Valkey, is needed for "
                      "\"idempotency_redis_wait ... aof\"), for the %s, %V",
                      &kop->op.redis->name, what, info);
        return NGX_ERROR;
    }

    if (reply->type == REDIS_REPLY_ERROR) {
        ngx_log_error(NGX_LOG_ERR, log, 0,
                      "idempotency: redis \"%V\" refused %s: %*s, "
                      "for the %s, %V", &kop->op.redis->name, cmd,
                      (size_t) reply->len, reply->str, what, info);
        return NGX_ERROR;
    }

    ngx_log_error(NGX_LOG_ERR, log, 0,
                  "idempotency: unexpected redis reply type %d to %s, "
                  "for the %s, %V", reply->type, cmd, what, info);

    return NGX_ERROR;
}
