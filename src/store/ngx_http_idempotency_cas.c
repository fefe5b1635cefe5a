
/*
 * Copyright (C) The ngx_http_idempotency_module authors
 *
 * The commands that claim a key: the claim itself, and the take-over of a
 * record whose outcome is unknown (or whose owner's lease ended).
 */


#include "ngx_http_idempotency_store.h"


/*
 * The claim rewritten as it is, TTL kept, if it is still ours: a write of
 * this connection for the WAIT behind it to count.  1: written.
 */

static ngx_str_t  ngx_http_idempotency_touch_script = ngx_string(
    "if redis.call('GET', KEYS[1]) ~= ARGV[1] then return 0 end\n"
    "redis.call('SET', KEYS[1], ARGV[1], 'KEEPTTL')\n"
    "return 1\n"
);


/*
 * The claim: nil when this request claimed the key, else the record there,
 * untouched.  Redis >= 7.0 and Valkey: SET NX GET PX, one native command;
 * 6.2 refuses NX with GET, and the claim script does the same, by SHA
 * (mode EVALSHA), or by its text after a NOSCRIPT (mode EVAL).  *mode is
 * the request's own (0 at first); answer.c moves it on.
 */

ngx_int_t
ngx_http_idempotency_claim_command(ngx_http_idempotency_key_op_t *kop,
    ngx_str_t *rkey, u_char *claim, ngx_msec_t ttl, ngx_uint_t *mode)
{
    u_char       px[NGX_INT_T_LEN];
    size_t       argvlen[6];
    const char  *argv[6];

    if (*mode == NGX_HTTP_IDEMPOTENCY_CLAIM_SET
        && kop->op.redis->nx_get_refused)
    {
        *mode = NGX_HTTP_IDEMPOTENCY_CLAIM_EVALSHA;
    }

    /* sent again as it is after a broken connection: claims are the same */
    kop->op.on_reconnect = 1;

    if (*mode == NGX_HTTP_IDEMPOTENCY_CLAIM_SET) {
        return ngx_http_idempotency_set_nx_get(&kop->op, rkey, claim,
                                               NGX_HTTP_IDEMPOTENCY_HEAD_LEN,
                                               ttl);
    }

    argv[3] = (const char *) rkey->data;
    argvlen[3] = rkey->len;
    argv[4] = (const char *) claim;
    argvlen[4] = NGX_HTTP_IDEMPOTENCY_HEAD_LEN;

    if (*mode == NGX_HTTP_IDEMPOTENCY_CLAIM_EVALSHA) {
        ngx_http_idempotency_arg(argv, argvlen, 0, "EVALSHA");
        argv[1] = (const char *) ngx_http_idempotency_claim_sha;
        argvlen[1] = 40;

    } else {
        ngx_http_idempotency_arg(argv, argvlen, 0, "EVAL");
        argv[1] = (const char *) ngx_http_idempotency_claim_script.data;
        argvlen[1] = ngx_http_idempotency_claim_script.len;
    }

    ngx_http_idempotency_arg(argv, argvlen, 2, "1");
    argv[5] = (const char *) px;
    argvlen[5] = ngx_http_idempotency_decimal(px, ttl) - px;

    return ngx_http_idempotency_redis_command(&kop->op, 6, argv, argvlen);
}


/*
 * SET <key> <value> NX GET PX <ttl>: set where nothing is, and what is
 * there back (nil: set).  On NGX_ERROR the op has been freed.
 */

ngx_int_t
ngx_http_idempotency_set_nx_get(ngx_http_idempotency_op_t *op,
    ngx_str_t *key, u_char *value, size_t len, ngx_msec_t ttl)
{
    u_char       px[NGX_INT_T_LEN];
    size_t       argvlen[7];
    const char  *argv[7];

    ngx_http_idempotency_arg(argv, argvlen, 0, "SET");
    argv[1] = (const char *) key->data;
    argvlen[1] = key->len;
    argv[2] = (const char *) value;
    argvlen[2] = len;
    ngx_http_idempotency_arg(argv, argvlen, 3, "NX");
    ngx_http_idempotency_arg(argv, argvlen, 4, "GET");
    ngx_http_idempotency_arg(argv, argvlen, 5, "PX");
    argv[6] = (const char *) px;
    argvlen[6] = ngx_http_idempotency_decimal(px, ttl) - px;

    return ngx_http_idempotency_redis_command(op, 7, argv, argvlen);
}


/*
 * this request's own lease, owner included: only this request wrote it (a
 * claim sent again after a broken connection carries the same bytes)
 */

ngx_uint_t
ngx_http_idempotency_claim_own(redisReply *reply, u_char *claim)
{
    return reply->type == REDIS_REPLY_STRING
           && (size_t) reply->len == NGX_HTTP_IDEMPOTENCY_HEAD_LEN
           && ngx_memcmp(reply->str, claim, NGX_HTTP_IDEMPOTENCY_OWNER_LEN + 2)
              == 0;
}


/*
 * A claim whose request went away before its reply: whether it may have
 * won (no reply, nil, or itself found), so that it must be released.
 */

ngx_uint_t
ngx_http_idempotency_claim_maybe_won(redisReply *reply, u_char *claim)
{
    return reply == NULL
           || reply->type == REDIS_REPLY_NIL
           || ngx_http_idempotency_claim_own(reply, claim);
}


/*
 * A finish must compare the owner: by a native compare-and-set, or by the
 * finish script.  Without both (scripting forbidden by an ACL on a server
 * older than Valkey 8.1 or Redis 8.4) a claim could be stored or released
 * by nobody's check: NGX_DECLINED, counted, and said at error once until
 * claims are allowed again.  Only a permission error marks scripting as
 * forbidden (handshake.c), never a server that is loading or busy, and the
 * client asks again: an ACL that allows scripting again needs no reload.
 */

ngx_int_t
ngx_http_idempotency_claim_allowed(ngx_http_idempotency_target_t *redis)
{
    if (!redis->script_refused || ngx_http_idempotency_has_ifeq(redis)) {
        redis->cas_missing = 0;
        return NGX_OK;
    }

    if (!redis->cas_missing) {
        ngx_log_error(NGX_LOG_ERR, redis->log, 0,
                      "idempotency: redis \"%V\" (%s%*s) forbids scripting "
                      "and has no SET IFEQ (Valkey 8.1, Redis 8.4 or "
                      "later): a record could not be stored or released "
                      "only by its owner, so no key is claimed until "
                      "scripting is allowed again; allow EVAL and EVALSHA "
                      "to the module's user, or move to Valkey 8.1 or "
                      "Redis 8.4",
                      &redis->name,
                      redis->server_len ? "" : "server not known",
                      redis->server_len, redis->server);
        redis->cas_missing = 1;
    }

    ngx_http_idempotency_store_events.claim_refused(redis);

    return NGX_DECLINED;
}


/*
 * take: only if the key still holds exactly the record this request read
 * (an unknown outcome, or a lease past its deadline): SET IFEQ where the
 * server has it, else the take script.  A renewal or a store in between
 * makes it fail, and the request reads the key again.
 */

ngx_int_t
ngx_http_idempotency_take_command(ngx_http_idempotency_op_t *op,
    ngx_str_t *rkey, u_char *seen, u_char *value, ngx_msec_t ttl)
{
    u_char       px[NGX_INT_T_LEN];
    size_t       argvlen[7];
    const char  *argv[7];

    if (ngx_http_idempotency_native_cas(op->redis)) {
        ngx_http_idempotency_cas_args(argv, argvlen, rkey, value,
                                      NGX_HTTP_IDEMPOTENCY_HEAD_LEN, seen);
        ngx_http_idempotency_arg(argv, argvlen, 5, "PX");
        argv[6] = (const char *) px;
        argvlen[6] = ngx_http_idempotency_decimal(px, ttl) - px;

        return ngx_http_idempotency_redis_command(op, 7, argv, argvlen);
    }

    ngx_http_idempotency_eval_args(argv, argvlen,
                                   &ngx_http_idempotency_take_script, rkey);
    argv[4] = (const char *) seen;
    argvlen[4] = NGX_HTTP_IDEMPOTENCY_HEAD_LEN;
    argv[5] = (const char *) value;
    argvlen[5] = NGX_HTTP_IDEMPOTENCY_HEAD_LEN;
    argv[6] = (const char *) px;
    argvlen[6] = ngx_http_idempotency_decimal(px, ttl) - px;

    return ngx_http_idempotency_redis_command(op, 7, argv, argvlen);
}


/*
 * A take's reply: NGX_OK taken (the script's 1, SET's OK), NGX_DECLINED
 * the key holds something else now (0, nil), NGX_ERROR no reply or an
 * error (logged when there is a log: a request that went away has none)
 */

ngx_int_t
ngx_http_idempotency_take_result(ngx_http_idempotency_target_t *redis,
    redisReply *reply, ngx_log_t *log)
{
    if (reply == NULL) {
        return NGX_ERROR;
    }

    switch (reply->type) {

    case REDIS_REPLY_INTEGER:
        return reply->integer == 1 ? NGX_OK : NGX_DECLINED;

    case REDIS_REPLY_STATUS:
        if (reply->len == 2 && ngx_strncmp(reply->str, "OK", 2) == 0) {
            return NGX_OK;
        }

        break;

    case REDIS_REPLY_NIL:
        return NGX_DECLINED;

    default:
        break;
    }

    if (log) {
        ngx_log_error(NGX_LOG_ERR, log, 0,
                      "idempotency: redis \"%V\" error: %*s",
                      &redis->name, (size_t) reply->len, reply->str);
    }

    return NGX_ERROR;
}


/*
 * A claim sent again that found itself: rewritten as it is, TTL kept, if
 * it is still this owner's, so that the connection has written something
 * for a WAIT behind it to count (Redis 7.2 and later answer a WAIT on a
 * connection that wrote nothing at once).  SET IFEQ KEEPTTL GET where the
 * server has it; else a script, by text: this follows only a claim sent
 * again, rarely.
 */

ngx_int_t
ngx_http_idempotency_touch_command(ngx_http_idempotency_op_t *op,
    ngx_str_t *rkey, u_char *claim)
{
    size_t       argvlen[7];
    const char  *argv[7];

    op->rkey_len = rkey->len;
    ngx_memcpy(op->rkey, rkey->data, rkey->len);

    if (ngx_http_idempotency_native_cas(op->redis)) {
        ngx_http_idempotency_cas_args(argv, argvlen, rkey, claim,
                                      NGX_HTTP_IDEMPOTENCY_HEAD_LEN, claim);
        ngx_http_idempotency_arg(argv, argvlen, 5, "KEEPTTL");
        ngx_http_idempotency_arg(argv, argvlen, 6, "GET");

        return ngx_http_idempotency_redis_command(op, 7, argv, argvlen);
    }

    ngx_http_idempotency_eval_args(argv, argvlen,
                                   &ngx_http_idempotency_touch_script, rkey);
    argv[4] = (const char *) claim;
    argvlen[4] = NGX_HTTP_IDEMPOTENCY_HEAD_LEN;

    return ngx_http_idempotency_redis_command(op, 5, argv, argvlen);
}


/*
 * NGX_OK: rewritten (the script's 1, or the claim itself back from GET).
 * Anything else leaves the WAIT behind it nothing to count, and the claim
 * is released: said here at error, with info naming the request.
 */

ngx_int_t
ngx_http_idempotency_touch_result(ngx_http_idempotency_target_t *redis,
    redisReply *reply, u_char *claim, ngx_log_t *log, ngx_str_t *info)
{
    if (reply != NULL) {
        if (reply->type == REDIS_REPLY_INTEGER && reply->integer == 1) {
            return NGX_OK;
        }

        if (reply->type == REDIS_REPLY_STRING
            && (size_t) reply->len == NGX_HTTP_IDEMPOTENCY_HEAD_LEN
            && ngx_memcmp(reply->str, claim, NGX_HTTP_IDEMPOTENCY_HEAD_LEN)
               == 0)
        {
            return NGX_OK;
        }

        if (reply->type == REDIS_REPLY_ERROR) {
            ngx_log_error(NGX_LOG_ERR, log, 0,
                          "idempotency: redis \"%V\" refused to rewrite "
                          "the claim sent again, for WAIT to count: %*s, "
                          "the claim is released, %V", &redis->name,
                          (size_t) reply->len, reply->str, info);
            return NGX_ERROR;
        }
    }

    ngx_log_error(NGX_LOG_ERR, log, 0,
                  "idempotency: redis \"%V\": the claim sent again "
                  "was %s before WAIT, the claim is released, %V",
                  &redis->name,
                  reply ? "no longer ours" : "lost with its connection",
                  info);

    return reply ? NGX_DECLINED : NGX_ERROR;
}


/*
 * The first five arguments of every native compare-and-set: SET <key>
 * <value> IFEQ <the whole claim as last known>
 */

void
ngx_http_idempotency_cas_args(const char **argv, size_t *argvlen,
    ngx_str_t *rkey, u_char *value, size_t len, u_char *expected)
{
    ngx_http_idempotency_arg(argv, argvlen, 0, "SET");
    argv[1] = (const char *) rkey->data;
    argvlen[1] = rkey->len;
    argv[2] = (const char *) value;
    argvlen[2] = len;
    ngx_http_idempotency_arg(argv, argvlen, 3, "IFEQ");
    argv[4] = (const char *) expected;
    argvlen[4] = NGX_HTTP_IDEMPOTENCY_HEAD_LEN;
}


/*
 * The first four arguments of a script sent by its text, on one key:
 * EVAL <script> 1 <key>
 */

void
ngx_http_idempotency_eval_args(const char **argv, size_t *argvlen,
    ngx_str_t *script, ngx_str_t *rkey)
{
    ngx_http_idempotency_arg(argv, argvlen, 0, "EVAL");
    argv[1] = (const char *) script->data;
    argvlen[1] = script->len;
    ngx_http_idempotency_arg(argv, argvlen, 2, "1");
    argv[3] = (const char *) rkey->data;
    argvlen[3] = rkey->len;
}


/*
 * A compare-and-delete of exactly <expected>: DELIFEQ <key> <expected>
 * (Valkey), DELEX <key> IFEQ <expected> (Redis); 1 deleted, 0 not.  The
 * number of arguments.
 */

int
ngx_http_idempotency_delifeq_args(ngx_http_idempotency_target_t *redis,
    const char **argv, size_t *argvlen, ngx_str_t *rkey, u_char *expected,
    size_t len)
{
    int  n;

    n = 0;

    if (redis->valkey) {
        ngx_http_idempotency_arg(argv, argvlen, n++, "DELIFEQ");

    } else {
        ngx_http_idempotency_arg(argv, argvlen, n++, "DELEX");
    }

    argv[n] = (const char *) rkey->data;
    argvlen[n++] = rkey->len;

    if (!redis->valkey) {
        ngx_http_idempotency_arg(argv, argvlen, n++, "IFEQ");
    }

    argv[n] = (const char *) expected;
    argvlen[n++] = len;

    return n;
}


/*
 * A compare-and-delete refused (an ACL written before the server had it,
 * without +delifeq or +delex; or a server that lacks it after all): said
 * once at warn, and tried again by this worker only once a minute
 * (ngx_http_idempotency_has_delifeq()); NGX_OK to do without it.  Any
 * other error (LOADING, BUSY) concludes nothing: NGX_DECLINED.
 */

ngx_int_t
ngx_http_idempotency_delifeq_refused(ngx_http_idempotency_target_t *redis,
    redisReply *reply)
{
    if (!ngx_http_idempotency_redis_forbidden(reply)) {
        return NGX_DECLINED;
    }

    if (!redis->del_refused) {
        ngx_log_error(NGX_LOG_WARN, redis->log, 0,
                      "idempotency: redis \"%V\" refused %s: %*s; releases "
                      "go by SET IFEQ (or by script where scripting is "
                      "allowed), and %s is tried again every %M s; allow "
                      "it to the module's user",
                      &redis->name, redis->valkey ? "DELIFEQ" : "DELEX",
                      (size_t) ngx_min(reply->len, 200), reply->str,
                      redis->valkey ? "DELIFEQ" : "DELEX",
                      (ngx_msec_t) NGX_HTTP_IDEMPOTENCY_DEL_ASK / 1000);
        redis->del_refused = 1;
    }

    redis->del_refused_at = ngx_current_msec;

    return NGX_OK;
}
