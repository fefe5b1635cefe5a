
/*
 * Copyright (C) The ngx_http_idempotency_module authors
 *
 * The finish of a claim: the final record stored, an unknown outcome
 * written, or the claim released, each only while the key still holds the
 * claim's owner.  The request does not wait for it.
 */


#include "ngx_http_idempotency_store.h"


/*
 * From this size a record is staged by a native SET and moved in place by
 * the finish script, not copied through Lua (docs/performance.md)
 */
#ifndef NGX_HTTP_IDEMPOTENCY_STAGE_MIN
#define NGX_HTTP_IDEMPOTENCY_STAGE_MIN  4096
#endif

/* the staged copy expires if its finish never comes: at least this */
#define NGX_HTTP_IDEMPOTENCY_STAGE_TTL  60000

/* SET key value IFEQ claim GET PX ttl (DELEX key IFEQ claim: fewer) */
#define NGX_HTTP_IDEMPOTENCY_FINISH_ARGS  8

/* compares made again on the owner's own claim under another word */
#define NGX_HTTP_IDEMPOTENCY_CAS_TRIES    3


static ngx_http_idempotency_op_t *ngx_http_idempotency_finish_op(
    ngx_http_idempotency_target_t *redis, ngx_http_idempotency_finish_t *f,
    ngx_http_idempotency_reply_pt handler);
static ngx_int_t ngx_http_idempotency_stage(
    ngx_http_idempotency_target_t *redis, ngx_http_idempotency_finish_t *f,
    ngx_str_t *skey);
static void ngx_http_idempotency_finish_done(ngx_http_idempotency_op_t *op,
    redisReply *reply);
static void ngx_http_idempotency_stage_done(ngx_http_idempotency_op_t *op,
    redisReply *reply);
static ngx_uint_t ngx_http_idempotency_finish_result(redisReply *reply);
static ngx_int_t ngx_http_idempotency_finish_native(
    ngx_http_idempotency_target_t *redis, ngx_http_idempotency_finish_t *f);
static int ngx_http_idempotency_native_args(const char **argv,
    size_t *argvlen, ngx_str_t *rkey, u_char *value, size_t len,
    u_char *claim, ngx_msec_t ttl, u_char *px);
static void ngx_http_idempotency_native_released(
    ngx_http_idempotency_op_t *op, redisReply *reply);
static void ngx_http_idempotency_native_done(ngx_http_idempotency_op_t *op,
    redisReply *reply);
static ngx_int_t ngx_http_idempotency_native_again(
    ngx_http_idempotency_op_t *op, redisReply *reply);
static void ngx_http_idempotency_publish(ngx_http_idempotency_target_t *redis,
    ngx_str_t *rkey, ngx_uint_t store);
static void ngx_http_idempotency_published(ngx_http_idempotency_op_t *op,
    redisReply *reply);
static void ngx_http_idempotency_no_done(ngx_http_idempotency_key_op_t *kop,
    ngx_uint_t result);
static void ngx_http_idempotency_no_failed(ngx_uint_t zone);
static void ngx_http_idempotency_no_unknown(ngx_uint_t cause);
static void ngx_http_idempotency_no_claim_refused(
    ngx_http_idempotency_target_t *redis);
static void ngx_http_idempotency_no_claim_sent(
    ngx_http_idempotency_key_op_t *kop);
static void ngx_http_idempotency_no_claim_done(
    ngx_http_idempotency_key_op_t *kop, ngx_uint_t answered);


/* nobody counts until metrics_events.c does */
ngx_http_idempotency_store_events_t  ngx_http_idempotency_store_events = {
    ngx_http_idempotency_no_done,
    ngx_http_idempotency_no_failed,
    ngx_http_idempotency_no_unknown,
    ngx_http_idempotency_no_claim_refused,
    ngx_http_idempotency_no_claim_sent,
    ngx_http_idempotency_no_claim_done
};


/*
 * Stores the final record (or an unknown outcome), or releases the claim
 * when f->value is NULL.  The script only acts if the key still holds our
 * own claim.  Fire and forget: the request does not wait for the reply,
 * and one that does not come sends it again (retry.c).  The script goes by
 * EVALSHA (by EVAL after a NOSCRIPT, resp.c); a large record is staged
 * first.
 */

void
ngx_http_idempotency_finish_key(ngx_http_idempotency_target_t *redis,
    ngx_http_idempotency_finish_t *f, ngx_log_t *log)
{
    int                         n;
    u_char                      ttl_buf[NGX_INT_T_LEN];
    u_char                      stage[NGX_HTTP_IDEMPOTENCY_RKEY_MAX + 3
                                      + 2 * NGX_HTTP_IDEMPOTENCY_TOKEN_LEN];
    size_t                      len, argvlen[9];
    ngx_str_t                   skey;
    const char                 *argv[9];
    ngx_http_idempotency_op_t  *op;

    if (ngx_http_idempotency_native_cas(redis)) {
        if (ngx_http_idempotency_finish_native(redis, f) == NGX_OK) {
            return;
        }

        goto failed;
    }

    skey.len = 0;
    skey.data = stage;
    len = f->len;

    if (f->value && len >= NGX_HTTP_IDEMPOTENCY_STAGE_MIN
        && ngx_http_idempotency_stage(redis, f, &skey) != NGX_OK)
    {
        goto failed;
    }

    n = 0;
    ngx_http_idempotency_arg(argv, argvlen, n++, "EVALSHA");
    argv[n] = (const char *) ngx_http_idempotency_finish_sha;
    argvlen[n++] = 40;

    if (skey.len) {
        ngx_http_idempotency_arg(argv, argvlen, n++, "2");

    } else {
        ngx_http_idempotency_arg(argv, argvlen, n++, "1");
    }

    argv[n] = (const char *) f->rkey.data;
    argvlen[n++] = f->rkey.len;

    if (skey.len) {
        /* the record is there already: its head names it */
        argv[n] = (const char *) skey.data;
        argvlen[n++] = skey.len;
        len = NGX_HTTP_IDEMPOTENCY_HEAD_LEN;
    }

    argv[n] = (const char *) f->claim;
    argvlen[n++] = NGX_HTTP_IDEMPOTENCY_HEAD_LEN;
    argv[n] = f->value ? (const char *) f->value : "";
    argvlen[n++] = f->value ? len : 0;
    argv[n] = (const char *) ttl_buf;
    argvlen[n++] = ngx_http_idempotency_decimal(ttl_buf, f->ttl) - ttl_buf;

    if (redis->quiet) {
        ngx_http_idempotency_arg(argv, argvlen, n++, "0");
    }

    op = ngx_http_idempotency_finish_op(redis, f,
                                        ngx_http_idempotency_finish_done);
    if (op == NULL) {
        goto failed;
    }

    if (ngx_http_idempotency_redis_command(op, n, argv, argvlen) == NGX_OK) {
        return;
    }

    /* no connection now: kept, and sent when there is one */

    op = ngx_http_idempotency_finish_op(redis, f,
                                        ngx_http_idempotency_finish_done);

    if (op && ngx_http_idempotency_retry_command(op, n, argv, argvlen)
              == NGX_OK)
    {
        return;
    }

failed:

    ngx_http_idempotency_store_events.failed(f->zone);

    ngx_log_error(NGX_LOG_ERR, log, 0,
                  "idempotency: cannot %s the record, redis unavailable; "
                  "the key stays claimed and reads as outcome-unknown once "
                  "its lease ends, %V",
                  f->value ? "store" : "release",
                  f->info ? f->info : &f->rkey);
}


/* an op that names its key and request for the log, sent again if lost */

static ngx_http_idempotency_op_t *
ngx_http_idempotency_finish_op(ngx_http_idempotency_target_t *redis,
    ngx_http_idempotency_finish_t *f, ngx_http_idempotency_reply_pt handler)
{
    ngx_http_idempotency_op_t      *op;
    ngx_http_idempotency_key_op_t  *kop;

    kop = ngx_http_idempotency_key_op_alloc(redis, &f->rkey);
    if (kop == NULL) {
        return NULL;
    }

    op = &kop->op;
    op->handler = handler;
    op->keep_bytes = 1;

    /*
     * A release is written at once, not with the rest of the event loop
     * turn: its response goes out in this turn, and a client that retries
     * on another nginx the moment it has it must find the key free.  A
     * record is too when the location asks (idempotency_store_immediate):
     * then that retry is replayed instead of answered 409, for a system
     * call per store and smaller writes to Redis (about a tenth of the
     * bench's fresh-key throughput).
     */
    op->urgent = (f->value == NULL || f->immediate);

    kop->info_len = f->info ? f->info->len : 0;

    if (f->info) {
        ngx_memcpy(kop->info, f->info->data, f->info->len);
    }

    ngx_memcpy(kop->claim, f->claim, NGX_HTTP_IDEMPOTENCY_HEAD_LEN);
    kop->lease_end = f->lease_end;
    kop->orphan = f->orphan;
    kop->zone = f->zone;

    if (handler == ngx_http_idempotency_finish_done) {
        op->script = &ngx_http_idempotency_finish_script;
    }

    if (handler != ngx_http_idempotency_stage_done) {
        kop->store = f->value ? 1 : 0;
        /* what the count of its reply says it was */
        kop->too_large = (f->value
                          && ngx_http_idempotency_head_state(f->value)
                             == NGX_HTTP_IDEMPOTENCY_REC_TOO_LARGE);
        kop->cause = f->value ? ngx_http_idempotency_lease_cause(f->value)
                              : 0;

        /* a native store sent again may find this very record there */
        kop->head_kept = (f->value && f->len >= NGX_HTTP_IDEMPOTENCY_HEAD_LEN);

        if (kop->head_kept) {
            ngx_memcpy(kop->value_head, f->value,
                       NGX_HTTP_IDEMPOTENCY_HEAD_LEN);
        }
    }

    return op;
}


/*
 * SET <record key>:s:<token> <record> PX, pipelined right before the finish
 * script on the same connection.  The key's {hash} tag puts it in the
 * record's cluster slot; the token makes it this request's alone.  If the
 * finish never runs, the copy expires.
 */

static ngx_int_t
ngx_http_idempotency_stage(ngx_http_idempotency_target_t *redis,
    ngx_http_idempotency_finish_t *f, ngx_str_t *skey)
{
    u_char                     *p, ttl[NGX_INT_T_LEN];
    size_t                      argvlen[5];
    const char                 *argv[5];
    ngx_http_idempotency_op_t  *op;

    p = ngx_cpymem(skey->data, f->rkey.data, f->rkey.len);
    p = ngx_cpymem(p, ":s:", 3);
    p = ngx_hex_dump(p, f->claim + NGX_HTTP_IDEMPOTENCY_HEAD_LEN
                        - NGX_HTTP_IDEMPOTENCY_TOKEN_LEN,
                     NGX_HTTP_IDEMPOTENCY_TOKEN_LEN);
    skey->len = p - skey->data;

    ngx_http_idempotency_arg(argv, argvlen, 0, "SET");
    argv[1] = (const char *) skey->data;
    argvlen[1] = skey->len;
    argv[2] = (const char *) f->value;
    argvlen[2] = f->len;
    ngx_http_idempotency_arg(argv, argvlen, 3, "PX");
    argv[4] = (const char *) ttl;
    argvlen[4] = ngx_http_idempotency_decimal(ttl,
                                      ngx_max(NGX_HTTP_IDEMPOTENCY_STAGE_TTL,
                                              4 * redis->timeout))
                 - ttl;

    op = ngx_http_idempotency_finish_op(redis, f,
                                        ngx_http_idempotency_stage_done);
    if (op == NULL) {
        return NGX_ERROR;
    }

    if (ngx_http_idempotency_redis_command(op, 5, argv, argvlen) == NGX_OK) {
        return NGX_OK;
    }

    op = ngx_http_idempotency_finish_op(redis, f,
                                        ngx_http_idempotency_stage_done);
    if (op == NULL) {
        return NGX_ERROR;
    }

    return ngx_http_idempotency_retry_command(op, 5, argv, argvlen);
}


static void
ngx_http_idempotency_finish_done(ngx_http_idempotency_op_t *op,
    redisReply *reply)
{
    ngx_log_t                      *log;
    ngx_str_t                       info;
    redisReply                      released;
    ngx_http_idempotency_key_op_t  *kop;

    if (ngx_http_idempotency_finish_retry(op, reply) == NGX_OK) {
        return;
    }

    kop = ngx_http_idempotency_key_op(op);
    log = op->redis->log;

    info.data = kop->info_len ? kop->info : op->rkey;
    info.len = kop->info_len ? kop->info_len : op->rkey_len;

    if (kop->orphan && reply && reply->type == REDIS_REPLY_INTEGER) {

        if (reply->integer == 0 && !kop->rechecked) {
            /*
             * Not there: it never landed, or it still waits in Redis on
             * the connection that broke, to be run after this release
             * (both were pending when Redis stalled).  Once more, later.
             */

            kop->rechecked = 1;
            kop->retry_backoff = 500;    /* a second later, quietly */

            if (ngx_http_idempotency_finish_retry(op, NULL) == NGX_OK) {
                return;
            }
        }

        /* 0: the claim never landed, or a retry took it over since */
        ngx_log_error(NGX_LOG_INFO, log, 0,
                      "idempotency: a claim whose reply was lost was %s, %V",
                      reply->integer ? "released" : "not there", &info);

        if (reply->integer == 1) {
            ngx_http_idempotency_store_events.done(kop,
                                             NGX_HTTP_IDEMPOTENCY_FINISH_DONE);
        }

        return;
    }

    if (reply && !kop->store && op->resent
        && reply->type == REDIS_REPLY_INTEGER && reply->integer == 0)
    {
        /*
         * a release sent again finds the key no longer ours: most likely
         * the first attempt ran; either way the key is not this claim's
         */

        ngx_log_error(NGX_LOG_INFO, log, 0,
                      "idempotency: a release sent again after a lost "
                      "connection found the key released already, %V",
                      &info);

        ngx_memzero(&released, sizeof(redisReply));
        released.type = REDIS_REPLY_INTEGER;
        released.integer = 1;
        reply = &released;
    }

    ngx_http_idempotency_store_events.done(kop,
                                    ngx_http_idempotency_finish_result(reply));

    if (reply == NULL) {
        ngx_log_error(NGX_LOG_ERR, log, 0,
                      "idempotency: redis \"%V\" went away before the "
                      "record was %s, %V", &op->redis->name,
                      kop->store ? "stored" : "released", &info);
        return;
    }

    if (reply->type == REDIS_REPLY_ERROR) {
        ngx_log_error(NGX_LOG_ERR, log, 0,
                      "idempotency: redis \"%V\" refused to %s the record: "
                      "%*s, %V", &op->redis->name,
                      kop->store ? "store" : "release",
                      (size_t) reply->len, reply->str, &info);
        return;
    }

    if (reply->type == REDIS_REPLY_INTEGER && reply->integer == 0) {
        ngx_log_error(NGX_LOG_ERR, log, 0,
                      "idempotency: claim was lost before the record was "
                      "%s (taken over after its lease expired, or Redis "
                      "lost the key), %V",
                      kop->store ? "stored" : "released", &info);
    }
}


/*
 * What a finish's reply says, for whoever counts it: the script answers 1
 * when it acted, 0 when the claim was not ours (a native finish's reply
 * comes here read into the same)
 */

static ngx_uint_t
ngx_http_idempotency_finish_result(redisReply *reply)
{
    if (reply == NULL || reply->type == REDIS_REPLY_ERROR) {
        return NGX_HTTP_IDEMPOTENCY_FINISH_FAILED;
    }

    if (reply->type == REDIS_REPLY_INTEGER && reply->integer == 0) {
        return NGX_HTTP_IDEMPOTENCY_FINISH_LOST;
    }

    return NGX_HTTP_IDEMPOTENCY_FINISH_DONE;
}


/* a refused SET: the finish that follows finds no staged record */

static void
ngx_http_idempotency_stage_done(ngx_http_idempotency_op_t *op,
    redisReply *reply)
{
    ngx_str_t                       info;
    ngx_http_idempotency_key_op_t  *kop;

    if (ngx_http_idempotency_finish_retry(op, reply) == NGX_OK) {
        return;
    }

    if (reply == NULL || reply->type != REDIS_REPLY_ERROR) {
        return;
    }

    kop = ngx_http_idempotency_key_op(op);

    info.data = kop->info_len ? kop->info : op->rkey;
    info.len = kop->info_len ? kop->info_len : op->rkey_len;

    ngx_log_error(NGX_LOG_ERR, op->redis->log, 0,
                  "idempotency: redis \"%V\" refused to stage the record: "
                  "%*s, %V", &op->redis->name, (size_t) reply->len,
                  reply->str, &info);
}


/*
 * The finish by a native compare-and-set: SET <key> <value> IFEQ <claim>
 * GET PX <ttl>, then the key's wake-up.  A release sets the claim to
 * itself for one millisecond: owner-checked, and gone at once.  The old
 * value comes back whether or not it matched (Valkey), and the reply
 * handler compares it: the claim itself means done, as does the head of
 * this very record (sent again after a lost connection); the owner's
 * claim with another lease word (a renewal this finish did not know of)
 * or the owner's own unknown outcome is taken and the compare made again;
 * anything else is no longer this owner's.
 */

static ngx_int_t
ngx_http_idempotency_finish_native(ngx_http_idempotency_target_t *redis,
    ngx_http_idempotency_finish_t *f)
{
    int                            argc;
    u_char                         px[NGX_INT_T_LEN];
    size_t                         argvlen[NGX_HTTP_IDEMPOTENCY_FINISH_ARGS];
    const char                    *argv[NGX_HTTP_IDEMPOTENCY_FINISH_ARGS];
    ngx_http_idempotency_op_t     *op;
    ngx_http_idempotency_reply_pt  handler;

    if (f->value == NULL && ngx_http_idempotency_has_delifeq(redis)) {
        /* a release: the claim deleted at once, if it is still the claim */
        argc = ngx_http_idempotency_delifeq_args(redis, argv, argvlen,
                                                 &f->rkey, f->claim,
                                                 NGX_HTTP_IDEMPOTENCY_HEAD_LEN);
        handler = ngx_http_idempotency_native_released;

    } else {
        argc = ngx_http_idempotency_native_args(argv, argvlen, &f->rkey,
                                                f->value, f->len, f->claim,
                                                f->ttl, px);
        handler = ngx_http_idempotency_native_done;
    }

    op = ngx_http_idempotency_finish_op(redis, f, handler);
    if (op == NULL) {
        return NGX_ERROR;
    }

    if (ngx_http_idempotency_redis_command(op, argc, argv, argvlen)
        != NGX_OK)
    {
        /* no connection now: kept, and sent when there is one */

        op = ngx_http_idempotency_finish_op(redis, f, handler);

        if (op == NULL
            || ngx_http_idempotency_retry_command(op, argc, argv, argvlen)
               != NGX_OK)
        {
            return NGX_ERROR;
        }

        return NGX_OK;
    }

    ngx_http_idempotency_publish(redis, &f->rkey, f->value != NULL);

    return NGX_OK;
}


/*
 * SET <key> <value> IFEQ <claim> GET PX <ttl>; a release (no value) sets
 * the claim to itself for a millisecond
 */

static int
ngx_http_idempotency_native_args(const char **argv, size_t *argvlen,
    ngx_str_t *rkey, u_char *value, size_t len, u_char *claim, ngx_msec_t ttl,
    u_char *px)
{
    ngx_http_idempotency_cas_args(argv, argvlen, rkey,
                                  value ? value : claim,
                                  value ? len : NGX_HTTP_IDEMPOTENCY_HEAD_LEN,
                                  claim);
    ngx_http_idempotency_arg(argv, argvlen, 5, "GET");
    ngx_http_idempotency_arg(argv, argvlen, 6, "PX");
    argv[7] = (const char *) px;
    argvlen[7] = ngx_http_idempotency_decimal(px, value ? ttl : 1) - px;

    return NGX_HTTP_IDEMPOTENCY_FINISH_ARGS;
}


/*
 * A release's compare-and-delete: 1 released.  0: the key holds something
 * other than the claim as known, and only a renewal this release did not
 * know of is still the owner's; the compare-and-set that returns what is
 * there (as where the server has no compare-and-delete) tells, and follows
 * it.  A refused delete goes that way too, once said.
 */

static void
ngx_http_idempotency_native_released(ngx_http_idempotency_op_t *op,
    redisReply *reply)
{
    int                             argc;
    u_char                          px[NGX_INT_T_LEN];
    size_t                          argvlen[NGX_HTTP_IDEMPOTENCY_FINISH_ARGS];
    ngx_str_t                       rkey;
    const char                     *argv[NGX_HTTP_IDEMPOTENCY_FINISH_ARGS];
    ngx_http_idempotency_key_op_t  *kop, *again;

    if (reply && reply->type == REDIS_REPLY_ERROR) {
        if (ngx_http_idempotency_delifeq_refused(op->redis, reply)
            != NGX_OK)
        {
            ngx_http_idempotency_finish_done(op, reply);
            return;
        }

    } else if (reply == NULL
               || reply->type != REDIS_REPLY_INTEGER
               || reply->integer != 0)
    {
        /* released (1), or no reply: as the script's */
        ngx_http_idempotency_finish_done(op, reply);
        return;
    }

    kop = ngx_http_idempotency_key_op(op);

    again = ngx_http_idempotency_key_op_copy(kop);

    if (again) {
        again->op.handler = ngx_http_idempotency_native_done;
        again->op.keep_bytes = 1;

        /* sent again, its own first attempt may be what freed the key */
        again->op.resent = op->resent;

        rkey.data = op->rkey;
        rkey.len = op->rkey_len;

        argc = ngx_http_idempotency_native_args(argv, argvlen, &rkey, NULL, 0,
                                                again->claim, 0, px);

        if (ngx_http_idempotency_redis_command(&again->op, argc, argv,
                                               argvlen)
            == NGX_OK)
        {
            return;
        }
    }

    ngx_http_idempotency_finish_done(op, reply);
}


static void
ngx_http_idempotency_native_done(ngx_http_idempotency_op_t *op,
    redisReply *reply)
{
    u_char                         *old;
    redisReply                      result;
    ngx_http_idempotency_key_op_t  *kop;

    if (reply == NULL
        || (reply->type != REDIS_REPLY_STRING
            && reply->type != REDIS_REPLY_NIL))
    {
        /* no reply or an error: sent again or said, as the script's */
        ngx_http_idempotency_finish_done(op, reply);
        return;
    }

    ngx_memzero(&result, sizeof(redisReply));
    result.type = REDIS_REPLY_INTEGER;
    result.integer = 0;

    kop = ngx_http_idempotency_key_op(op);
    old = (u_char *) reply->str;

    if (reply->type == REDIS_REPLY_STRING
        && (size_t) reply->len >= NGX_HTTP_IDEMPOTENCY_HEAD_LEN)
    {
        if ((size_t) reply->len == NGX_HTTP_IDEMPOTENCY_HEAD_LEN
            && ngx_memcmp(old, kop->claim, NGX_HTTP_IDEMPOTENCY_HEAD_LEN) == 0)
        {
            /* it was the claim: set */
            result.integer = 1;

        } else if (ngx_http_idempotency_native_again(op, reply) == NGX_OK) {
            /* the owner's claim under another word: compared again */
            return;

        } else if (kop->head_kept
                   && ngx_memcmp(old, kop->value_head,
                                 NGX_HTTP_IDEMPOTENCY_HEAD_LEN)
                      == 0)
        {
            /* this very record, stored by an attempt whose reply was lost */
            result.integer = 1;
        }
    }

    ngx_http_idempotency_finish_done(op, &result);
}


/*
 * The owner's claim (its first 45 bytes: magic, state, fingerprint and
 * owner), in the claim state, holding another lease word or the owner's
 * own unknown outcome: the same finish again, compared with it, a few
 * times at most.
 */

static ngx_int_t
ngx_http_idempotency_native_again(ngx_http_idempotency_op_t *op,
    redisReply *reply)
{
    ngx_str_t                       rkey;
    ngx_http_idempotency_key_op_t  *kop, *again;

    kop = ngx_http_idempotency_key_op(op);

    if ((size_t) reply->len != NGX_HTTP_IDEMPOTENCY_HEAD_LEN
        || reply->str[4] != NGX_HTTP_IDEMPOTENCY_REC_CLAIM
        || ngx_memcmp(reply->str, kop->claim, NGX_HTTP_IDEMPOTENCY_OWNER_LEN)
           != 0
        || kop->cas >= NGX_HTTP_IDEMPOTENCY_CAS_TRIES)
    {
        return NGX_DECLINED;
    }

    again = ngx_http_idempotency_key_op_copy(kop);
    if (again == NULL) {
        return NGX_DECLINED;
    }

    again->op.handler = op->handler;
    again->cas = kop->cas + 1;
    ngx_memcpy(again->claim, reply->str, NGX_HTTP_IDEMPOTENCY_HEAD_LEN);

    /*
     * the same SET, compared with what is there (its 5th argument); a
     * release sets it to itself (its 3rd)
     */

    if (ngx_http_idempotency_resp_keep(&again->op, op->buf, op->buf_len)
        != NGX_OK
        || ngx_http_idempotency_resp_replace(&again->op, 4, again->claim,
                                             NGX_HTTP_IDEMPOTENCY_HEAD_LEN)
           != NGX_OK
        || (!kop->store
            && ngx_http_idempotency_resp_replace(&again->op, 2, again->claim,
                                                 NGX_HTTP_IDEMPOTENCY_HEAD_LEN)
               != NGX_OK))
    {
        ngx_http_idempotency_op_free(&again->op);
        return NGX_DECLINED;
    }

    if (ngx_http_idempotency_redis_command_kept(&again->op) != NGX_OK) {
        return NGX_DECLINED;
    }

    rkey.data = op->rkey;
    rkey.len = op->rkey_len;

    ngx_http_idempotency_publish(op->redis, &rkey, kop->store);

    return NGX_OK;
}


/*
 * waiting duplicates learn of it on the key's own channel (watch.c), where
 * any may wait
 */

static void
ngx_http_idempotency_publish(ngx_http_idempotency_target_t *redis,
    ngx_str_t *rkey, ngx_uint_t store)
{
    size_t                      argvlen[3];
    const char                 *argv[3];
    ngx_http_idempotency_op_t  *op;

    if (redis->quiet) {
        return;
    }

    op = ngx_http_idempotency_op_alloc(redis);
    if (op == NULL) {
        return;
    }

    op->handler = ngx_http_idempotency_published;

    /* the key routes it, in a cluster too */
    op->rkey_len = rkey->len;
    ngx_memcpy(op->rkey, rkey->data, rkey->len);

    ngx_http_idempotency_arg(argv, argvlen, 0, "SPUBLISH");
    argv[1] = (const char *) rkey->data;
    argvlen[1] = rkey->len;

    if (store) {
        ngx_http_idempotency_arg(argv, argvlen, 2, "s");

    } else {
        ngx_http_idempotency_arg(argv, argvlen, 2, "r");
    }

    (void) ngx_http_idempotency_redis_command(op, 3, argv, argvlen);
}


static void
ngx_http_idempotency_published(ngx_http_idempotency_op_t *op,
    redisReply *reply)
{
    /* a hint: a waiter that misses it polls */
}


static void
ngx_http_idempotency_no_done(ngx_http_idempotency_key_op_t *kop,
    ngx_uint_t result)
{
}


static void
ngx_http_idempotency_no_failed(ngx_uint_t zone)
{
}


static void
ngx_http_idempotency_no_unknown(ngx_uint_t cause)
{
}


static void
ngx_http_idempotency_no_claim_refused(ngx_http_idempotency_target_t *redis)
{
}


static void
ngx_http_idempotency_no_claim_sent(ngx_http_idempotency_key_op_t *kop)
{
}


static void
ngx_http_idempotency_no_claim_done(ngx_http_idempotency_key_op_t *kop,
    ngx_uint_t answered)
{
}
