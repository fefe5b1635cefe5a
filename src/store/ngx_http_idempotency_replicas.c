
/*
 * Copyright (C) The ngx_http_idempotency_module authors
 *
 * idempotency_redis_wait: WAIT N TIMEOUT after a won claim, and after a
 * store; with "aof", WAITAOF 1 N TIMEOUT (fsynced on the primary and on N
 * replicas).  Both count the writes of the connection that sends them, so
 * they always go on the connection of the claim, pipelined right behind
 * it.  A claim that was not acknowledged is released and is an error; a
 * store that was not is logged.
 */


#include "ngx_http_idempotency_store.h"


static ngx_http_idempotency_key_op_t *ngx_http_idempotency_replicas_issue(
    ngx_http_idempotency_claim_t *c, ngx_uint_t claim);
static void ngx_http_idempotency_replicas_info(
    ngx_http_idempotency_claim_t *c, ngx_str_t *info, u_char *buf);
static ngx_http_idempotency_key_op_t *ngx_http_idempotency_replicas_touch(
    ngx_http_idempotency_claim_t *c);
static void ngx_http_idempotency_replicas_touch_done(
    ngx_http_idempotency_op_t *op, redisReply *reply);
static void ngx_http_idempotency_replicas_fail(
    ngx_http_idempotency_claim_t *c);
static void ngx_http_idempotency_replicas_claim_done(
    ngx_http_idempotency_op_t *op, redisReply *reply);
static void ngx_http_idempotency_replicas_store_done(
    ngx_http_idempotency_op_t *op, redisReply *reply);


/*
 * Sent with every claim when the directive is on, and acted upon only if
 * the claim is won: a replay, 409 or 422 does not wait for its reply.
 */

void
ngx_http_idempotency_replicas_send(ngx_http_idempotency_claim_t *c)
{
    c->wait_op = ngx_http_idempotency_replicas_issue(c, 1);
}


/*
 * Right behind the store, on its connection; fire and forget: the response
 * is already on its way, so fewer acknowledgements are only logged.  A
 * store that could not be sent was logged already.
 */

void
ngx_http_idempotency_replicas_store(ngx_http_idempotency_claim_t *c)
{
    (void) ngx_http_idempotency_replicas_issue(c, 0);
}


/* claim: WAIT for the claim, answered to it; else for a store, logged */

static ngx_http_idempotency_key_op_t *
ngx_http_idempotency_replicas_issue(ngx_http_idempotency_claim_t *c,
    ngx_uint_t claim)
{
    ngx_str_t                       info;
    ngx_http_idempotency_key_op_t  *kop;

    if (!c->conf->replicas_on) {
        return NULL;
    }

    /* the key: a cluster sends WAIT to the node of the key */
    kop = ngx_http_idempotency_key_op_alloc(c->conf->redis, &c->rkey);
    if (kop == NULL) {
        return NULL;
    }

    if (claim) {
        kop->op.data = c;
        kop->op.handler = ngx_http_idempotency_replicas_claim_done;
        kop->zone = c->conf->zone;
        kop->info_len = 0;
        ngx_memcpy(kop->claim, c->head, NGX_HTTP_IDEMPOTENCY_HEAD_LEN);

        /* its release, if the claim is lost with WAIT, is sent until then */
        kop->lease_end = c->lease_end;

    } else {
        kop->op.handler = ngx_http_idempotency_replicas_store_done;

        ngx_http_idempotency_claim_info(c, &info);
        kop->info_len = info.len;
        ngx_memcpy(kop->info, info.data, info.len);
    }

    if (ngx_http_idempotency_durable_command(kop, c->conf->replicas,
                                             c->conf->replicas_timeout,
                                             c->conf->aof)
        != NGX_OK)
    {
        return NULL;
    }

    return kop;
}


/*
 * Called when the claim is won, and whether it won by finding itself.
 * NGX_AGAIN: it now waits for WAIT's reply, under the claim's own timer;
 * NGX_OK: no WAIT is asked for; NGX_ERROR: none could be sent, and the
 * claim is released.
 */

ngx_int_t
ngx_http_idempotency_replicas_hold(ngx_http_idempotency_claim_t *c,
    ngx_uint_t itself)
{
    ngx_str_t                       info;
    ngx_http_idempotency_key_op_t  *kop, *touch;
    u_char                          buf[NGX_HTTP_IDEMPOTENCY_INFO_LEN];

    if (!c->conf->replicas_on) {
        return NGX_OK;
    }

    touch = NULL;

    if (itself) {
        /*
         * The claim was sent again after a lost connection and found its
         * own claim: it wrote nothing on this connection.  Since Redis 7.2
         * (and in Valkey) WAIT counts only the connection's own writes and
         * answers at once without one, as if every replica had the claim.
         * An owner-checked rewrite of the claim goes first, and WAIT
         * behind it.  A WAIT still pending went with another connection.
         */

        ngx_http_idempotency_replicas_detach(c);

        touch = ngx_http_idempotency_replicas_touch(c);

        if (touch) {
            ngx_http_idempotency_replicas_send(c);
        }

    } else if (c->wait_op == NULL) {
        /*
         * the WAIT sent with the claim went with its connection, and the
         * claim was sent again and won: ask on the connection that answered
         */
        ngx_http_idempotency_replicas_send(c);
    }

    kop = c->wait_op;

    if (kop == NULL) {
        if (touch) {
            touch->op.data = NULL;
        }

        ngx_http_idempotency_replicas_info(c, &info, buf);

        ngx_log_error(NGX_LOG_ERR, c->log, 0,
                      "idempotency: cannot send WAIT to redis \"%V\", "
                      "the claim is released, %V", &c->conf->redis->name,
                      &info);

        ngx_http_idempotency_claim_release(c);
        return NGX_ERROR;
    }

    /*
     * from now on, a request that goes away releases the claim; the
     * rewrite, if any, answers first: wait_op until then
     */

    kop->won = 1;
    c->wait_op = touch;
    c->op = kop;

    return NGX_AGAIN;
}


static ngx_http_idempotency_key_op_t *
ngx_http_idempotency_replicas_touch(ngx_http_idempotency_claim_t *c)
{
    ngx_http_idempotency_key_op_t  *kop;

    kop = ngx_http_idempotency_key_op_alloc(c->conf->redis, &c->rkey);
    if (kop == NULL) {
        return NULL;
    }

    kop->op.data = c;
    kop->op.handler = ngx_http_idempotency_replicas_touch_done;

    if (ngx_http_idempotency_touch_command(&kop->op, &c->rkey, c->head)
        != NGX_OK)
    {
        return NULL;
    }

    return kop;
}


/*
 * Anything but a rewrite leaves the WAIT behind it nothing to count: the
 * claim is refused whatever WAIT says.
 */

static void
ngx_http_idempotency_replicas_touch_done(ngx_http_idempotency_op_t *op,
    redisReply *reply)
{
    ngx_str_t                      info;
    ngx_http_idempotency_claim_t  *c;
    u_char                         buf[NGX_HTTP_IDEMPOTENCY_INFO_LEN];

    c = op->data;

    if (c == NULL) {
        /* the request went away: the WAIT behind releases the claim */
        return;
    }

    c->wait_op = NULL;

    ngx_http_idempotency_replicas_info(c, &info, buf);

    if (ngx_http_idempotency_touch_result(c->conf->redis, reply, c->head,
                                          c->log, &info)
        == NGX_OK)
    {
        return;
    }

    ngx_http_idempotency_replicas_fail(c);
}


/* the WAIT held is not to be trusted: release the claim, an error */

static void
ngx_http_idempotency_replicas_fail(ngx_http_idempotency_claim_t *c)
{
    ngx_http_idempotency_replicas_detach(c);

    if (c->op) {
        /* the WAIT's reply finds nobody, and no claim to release */
        c->op->op.data = NULL;
        c->op->won = 0;
        c->op = NULL;
    }

    ngx_http_idempotency_claim_release(c);
    ngx_http_idempotency_claim_answered(c, NGX_HTTP_IDEMPOTENCY_ANSWER_ERROR);
}


/*
 * The claim's timer fired while WAIT held it (a stalled Redis): the claim
 * is this request's, and the request will not run protected.  It is
 * released now, on the connection about to be reset, which sends the
 * release again on the next one; the WAIT's own end comes with the
 * connection closed, too late to send anything.
 */

void
ngx_http_idempotency_replicas_timedout(ngx_http_idempotency_claim_t *c)
{
    ngx_http_idempotency_key_op_t  *kop;

    kop = c->op;

    if (kop == NULL
        || kop->op.handler != ngx_http_idempotency_replicas_claim_done
        || !kop->won)
    {
        return;
    }

    kop->op.data = NULL;
    kop->won = 0;
    c->op = NULL;

    ngx_http_idempotency_claim_release(c);
}


/* nobody waits for the WAIT sent behind the claim any more */

void
ngx_http_idempotency_replicas_detach(ngx_http_idempotency_claim_t *c)
{
    if (c->wait_op) {
        c->wait_op->op.data = NULL;
        c->wait_op = NULL;
    }
}


static void
ngx_http_idempotency_replicas_claim_done(ngx_http_idempotency_op_t *op,
    redisReply *reply)
{
    ngx_str_t                       info;
    ngx_http_idempotency_claim_t   *c;
    ngx_http_idempotency_key_op_t  *kop;
    u_char                          buf[NGX_HTTP_IDEMPOTENCY_INFO_LEN];

    kop = ngx_http_idempotency_key_op(op);
    c = op->data;

    if (c == NULL) {
        /* a won claim whose request went away never ran: free the key */

        if (kop->won) {
            ngx_http_idempotency_release_orphan(kop);
        }

        return;
    }

    if (!kop->won) {
        /* the claim is not answered yet: this WAIT went with its connection */
        c->wait_op = NULL;
        return;
    }

    c->op = NULL;

    ngx_http_idempotency_replicas_info(c, &info, buf);

    if (c->wait_op) {
        /* a cluster redirected the rewrite: WAIT counted without it */

        ngx_log_error(NGX_LOG_ERR, c->log, 0,
                      "idempotency: redis \"%V\" answered WAIT before the "
                      "rewrite of the claim sent again, the claim is "
                      "released, %V", &c->conf->redis->name, &info);

        ngx_http_idempotency_replicas_detach(c);
        ngx_http_idempotency_claim_release(c);
        ngx_http_idempotency_claim_answered(c,
                                           NGX_HTTP_IDEMPOTENCY_ANSWER_ERROR);
        return;
    }

    if (ngx_http_idempotency_durable_result(kop, reply, c->log, &info)
        != NGX_OK)
    {
        ngx_http_idempotency_claim_release(c);
        ngx_http_idempotency_claim_answered(c,
                                           NGX_HTTP_IDEMPOTENCY_ANSWER_ERROR);
        return;
    }

    ngx_http_idempotency_claim_answered(c, NGX_HTTP_IDEMPOTENCY_ANSWER_NEW);
}


/* the request's log names the client and the request line already */

static void
ngx_http_idempotency_replicas_info(ngx_http_idempotency_claim_t *c,
    ngx_str_t *info, u_char *buf)
{
    info->data = buf;
    info->len = ngx_sprintf(buf, "key hash %*s",
                            (size_t) 2 * NGX_HTTP_IDEMPOTENCY_HASH_LEN,
                            ngx_http_idempotency_rkey_hash(&c->rkey))
                - buf;
}


static void
ngx_http_idempotency_replicas_store_done(ngx_http_idempotency_op_t *op,
    redisReply *reply)
{
    ngx_str_t                       info;
    ngx_http_idempotency_key_op_t  *kop;

    kop = ngx_http_idempotency_key_op(op);

    info.data = kop->info;
    info.len = kop->info_len;

    (void) ngx_http_idempotency_durable_result(kop, reply, op->redis->log,
                                               &info);
}
