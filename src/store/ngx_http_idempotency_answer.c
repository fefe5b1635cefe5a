
/*
 * Copyright (C) The ngx_http_idempotency_module authors
 *
 * What a claim's reply means for its request, read in one place: won,
 * claim again the way the server takes, or the record that is there,
 * opened if sealed, decoded, compared with the request's fingerprint and
 * its lease read.  The layer above is told one answer and gets the record
 * it may replay; it never reads the reply or the record's bytes.
 */


#include "ngx_http_idempotency_store.h"


static ngx_int_t ngx_http_idempotency_claim_result(
    ngx_http_idempotency_target_t *redis, ngx_uint_t *mode, redisReply *reply,
    u_char *claim, ngx_log_t *log);
static u_char *ngx_http_idempotency_answer_keep(redisReply *reply,
    ngx_pool_t *pool);
static void ngx_http_idempotency_answer_free(void *data);


/*
 * The answer to the claim a->claim sent as *a->mode: NGX_HTTP_IDEMPOTENCY_
 * ANSWER_*.  A record found is kept in a->pool, decoded into a->record;
 * for an unknown outcome a->status is its status and a->seen its head.
 * A lost connection (reply NULL) and every error are logged here.
 */

ngx_uint_t
ngx_http_idempotency_claim_answer(ngx_http_idempotency_target_t *redis,
    redisReply *reply, ngx_http_idempotency_answer_t *a)
{
    u_char                         *data;
    ngx_int_t                       rc;
    ngx_http_idempotency_record_t  *rec;

    if (reply == NULL) {
        ngx_log_error(NGX_LOG_INFO, a->log, 0,
                      "idempotency: redis \"%V\" connection lost",
                      &redis->name);
        return NGX_HTTP_IDEMPOTENCY_ANSWER_ERROR;
    }

    switch (ngx_http_idempotency_claim_result(redis, a->mode, reply,
                                              a->claim, a->log))
    {
    case NGX_OK:
        /* its own claim found: sent again after a lost connection */
        a->itself = (reply->type != REDIS_REPLY_NIL);
        return NGX_HTTP_IDEMPOTENCY_ANSWER_NEW;

    case NGX_AGAIN:
        return NGX_HTTP_IDEMPOTENCY_ANSWER_AGAIN;

    case NGX_DECLINED:
        break;

    default:
        return NGX_HTTP_IDEMPOTENCY_ANSWER_ERROR;
    }

    data = ngx_http_idempotency_answer_keep(reply, a->pool);
    if (data == NULL) {
        return NGX_HTTP_IDEMPOTENCY_ANSWER_ERROR;
    }

    rec = a->record;

    /* a sealed record is opened in place, or refused as a Redis error */

    rc = ngx_http_idempotency_crypt_open(a->keys, a->log, a->rkey, data,
                                         reply->len, rec);
    if (rc == NGX_ERROR) {
        return NGX_HTTP_IDEMPOTENCY_ANSWER_ERROR;
    }

    if (rc == NGX_DECLINED
        && ngx_http_idempotency_record_decode(data, reply->len, rec)
           != NGX_OK)
    {
        ngx_log_error(NGX_LOG_ERR, a->log, 0,
                      "idempotency: corrupt record in redis \"%V\" "
                      "at \"%V\" (%uz bytes)",
                      &redis->name, a->rkey, (size_t) reply->len);
        return NGX_HTTP_IDEMPOTENCY_ANSWER_ERROR;
    }

    /* before the state: a claim for another request is a mismatch too */

    if (ngx_memcmp(rec->fingerprint,
                   ngx_http_idempotency_head_fingerprint(a->claim),
                   NGX_HTTP_IDEMPOTENCY_HASH_LEN)
        != 0)
    {
        return NGX_HTTP_IDEMPOTENCY_ANSWER_MISMATCH;
    }

    switch (rec->state) {

    case NGX_HTTP_IDEMPOTENCY_REC_DONE:
    case NGX_HTTP_IDEMPOTENCY_REC_DONE_TRAILERS:
        return NGX_HTTP_IDEMPOTENCY_ANSWER_REPLAY;

    case NGX_HTTP_IDEMPOTENCY_REC_TOO_LARGE:
        return NGX_HTTP_IDEMPOTENCY_ANSWER_TOO_LARGE;

    default: /* NGX_HTTP_IDEMPOTENCY_REC_CLAIM */
        break;
    }

    switch (ngx_http_idempotency_lease_read(data, a->status, a->sent_at,
                                            a->margin))
    {

    case NGX_HTTP_IDEMPOTENCY_LEASE_EXPIRED:
        /* its owner is gone after it may have run: never a free key */
        ngx_memcpy(a->seen, data, NGX_HTTP_IDEMPOTENCY_HEAD_LEN);
        return NGX_HTTP_IDEMPOTENCY_ANSWER_EXPIRED;

    case NGX_HTTP_IDEMPOTENCY_LEASE_UNKNOWN:
        ngx_memcpy(a->seen, data, NGX_HTTP_IDEMPOTENCY_HEAD_LEN);
        return NGX_HTTP_IDEMPOTENCY_ANSWER_UNKNOWN;

    default:
        return NGX_HTTP_IDEMPOTENCY_ANSWER_CONFLICT;
    }
}


/*
 * A claim's reply: NGX_OK claimed (nil, or this claim itself, sent again
 * after a broken connection, found); NGX_DECLINED a record is there, the
 * reply's string; NGX_AGAIN refused the way it was sent, to be sent again
 * (*mode moved on); NGX_ERROR an error, logged.
 */

static ngx_int_t
ngx_http_idempotency_claim_result(ngx_http_idempotency_target_t *redis,
    ngx_uint_t *mode, redisReply *reply, u_char *claim, ngx_log_t *log)
{
    switch (reply->type) {

    case REDIS_REPLY_NIL:
        return NGX_OK;

    case REDIS_REPLY_STRING:
        return ngx_http_idempotency_claim_own(reply, claim) ? NGX_OK
                                                            : NGX_DECLINED;

    case REDIS_REPLY_ERROR:
        /* "ERR syntax error": not LOADING, BUSY or another passing state */

        if (*mode == NGX_HTTP_IDEMPOTENCY_CLAIM_SET
            && ngx_http_idempotency_reply_is(reply, "ERR ")
            && ngx_strlcasestrn((u_char *) reply->str,
                                (u_char *) reply->str + reply->len,
                                (u_char *) "syntax", 6 - 1)
               != NULL)
        {
            /*
             * Redis 6.2: no NX with GET; the script from now on.  Claims
             * already pipelined meet the same refusal: one notice is enough.
             */

            if (!redis->nx_get_refused) {
                ngx_log_error(NGX_LOG_NOTICE, log, 0,
                              "idempotency: redis \"%V\" refuses SET NX GET, "
                              "claiming with a script", &redis->name);
                redis->nx_get_refused = 1;
            }

            *mode = NGX_HTTP_IDEMPOTENCY_CLAIM_EVALSHA;
            return NGX_AGAIN;
        }

        if (*mode == NGX_HTTP_IDEMPOTENCY_CLAIM_EVALSHA
            && ngx_http_idempotency_reply_is(reply, "NOSCRIPT"))
        {
            /* SCRIPT FLUSH or a failover: send the script itself */
            ngx_http_idempotency_redis_load_script(redis);
            *mode = NGX_HTTP_IDEMPOTENCY_CLAIM_EVAL;
            return NGX_AGAIN;
        }

        ngx_log_error(NGX_LOG_ERR, log, 0,
                      "idempotency: redis \"%V\" error: %*s",
                      &redis->name, (size_t) reply->len, reply->str);
        return NGX_ERROR;

    default:
        ngx_log_error(NGX_LOG_ERR, log, 0,
                      "idempotency: unexpected redis reply type %d",
                      reply->type);
        return NGX_ERROR;
    }
}


/*
 * The reply is freed after its handler returns: a large record is taken
 * from it, to be freed with the pool, a small one copied.
 */

static u_char *
ngx_http_idempotency_answer_keep(redisReply *reply, ngx_pool_t *pool)
{
    u_char              *data;
    ngx_pool_cleanup_t  *cln;

    if (reply->len < NGX_HTTP_IDEMPOTENCY_BULK_MIN) {
        data = ngx_pnalloc(pool, reply->len);
        if (data == NULL) {
            return NULL;
        }

        ngx_memcpy(data, reply->str, reply->len);

        return data;
    }

    cln = ngx_pool_cleanup_add(pool, 0);
    if (cln == NULL) {
        return NULL;
    }

    data = (u_char *) reply->str;
    reply->str = NULL;

    cln->handler = ngx_http_idempotency_answer_free;
    cln->data = data;

    return data;
}


static void
ngx_http_idempotency_answer_free(void *data)
{
    ngx_free(data);
}
