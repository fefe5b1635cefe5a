
/*
 * Copyright (C) The ngx_http_idempotency_module authors
 *
 * A request's claim on its record key.  The request fills it in and
 * starts it; from then on the store conducts the protocol: the claim sent
 * the way the server takes (SET NX GET, the script by SHA, by text), the
 * take-over of an unknown outcome or a dead owner's lease, the replicas'
 * acknowledgement of a claim won, and the round trip's timer.  The request
 * is told one answer per start, through its handler.
 */


#include "ngx_http_idempotency_store.h"

#include <openssl/rand.h>


/* a take-over raced this many times: somebody else is at it */
#define NGX_HTTP_IDEMPOTENCY_TAKES_MAX  3


static ngx_int_t ngx_http_idempotency_claim_send(
    ngx_http_idempotency_claim_t *c);
static ngx_http_idempotency_key_op_t *ngx_http_idempotency_claim_op(
    ngx_http_idempotency_claim_t *c, ngx_http_idempotency_reply_pt handler);
static void ngx_http_idempotency_claim_done(ngx_http_idempotency_op_t *op,
    redisReply *reply);
static void ngx_http_idempotency_claim_found(ngx_http_idempotency_claim_t *c,
    ngx_uint_t answer);
static ngx_int_t ngx_http_idempotency_claim_take(
    ngx_http_idempotency_claim_t *c);
static void ngx_http_idempotency_take_done(ngx_http_idempotency_op_t *op,
    redisReply *reply);
static void ngx_http_idempotency_claim_again(ngx_http_idempotency_claim_t *c);
static void ngx_http_idempotency_claim_timeout(ngx_event_t *ev);


ngx_http_idempotency_claim_t *
ngx_http_idempotency_claim_create(ngx_pool_t *pool, ngx_log_t *log)
{
    ngx_http_idempotency_claim_t  *c;

    c = ngx_pcalloc(pool, sizeof(ngx_http_idempotency_claim_t));
    if (c == NULL) {
        return NULL;
    }

    c->pool = pool;
    c->log = log;

    c->timer.handler = ngx_http_idempotency_claim_timeout;
    c->timer.data = c;
    c->timer.log = log;

    return c;
}


/*
 * Owners are a per-worker random seed moved by a sequence number: unique
 * among the claims of a worker, as unlikely as two random 64-bit numbers
 * to meet another worker's, and without a syscall per request
 */

static uint64_t  ngx_http_idempotency_owner_seq;
static u_char    ngx_http_idempotency_owner_seed[8];


ngx_int_t
ngx_http_idempotency_claim_init(ngx_log_t *log)
{
    if (RAND_bytes(ngx_http_idempotency_owner_seed,
                   sizeof(ngx_http_idempotency_owner_seed))
        != 1)
    {
        ngx_log_error(NGX_LOG_EMERG, log, 0,
                      "idempotency: RAND_bytes() failed");
        return NGX_ERROR;
    }

    return NGX_OK;
}


/*
 * The claim's head: the request's fingerprint and a new owner; the lease
 * follows when it is sent (lease.c)
 */

void
ngx_http_idempotency_claim_head(ngx_http_idempotency_claim_t *c,
    u_char *fingerprint)
{
    u_char      *owner;
    uint64_t     seq;
    ngx_uint_t   i;

    ngx_http_idempotency_head_claim(c->head);

    ngx_memcpy(ngx_http_idempotency_head_fingerprint(c->head), fingerprint,
               NGX_HTTP_IDEMPOTENCY_HASH_LEN);

    owner = ngx_http_idempotency_head_token(c->head);
    seq = ++ngx_http_idempotency_owner_seq;

    for (i = 0; i < 8; i++) {
        owner[i] = ngx_http_idempotency_owner_seed[i] ^ (u_char) (seq >> 8 * i);
    }

    ngx_memzero(owner + 8, NGX_HTTP_IDEMPOTENCY_TOKEN_LEN - 8);
}


/*
 * NGX_AGAIN: sent, and the handler will be told.  NGX_ERROR: not sent (the
 * server may not be claimed on, or is not connected), and nothing is told.
 */

ngx_int_t
ngx_http_idempotency_claim_start(ngx_http_idempotency_claim_t *c)
{
    if (ngx_http_idempotency_claim_send(c) != NGX_OK) {
        return NGX_ERROR;
    }

    ngx_http_idempotency_replicas_send(c);

    if (c->timer.timer_set) {
        ngx_del_timer(&c->timer);
    }

    ngx_add_timer(&c->timer, c->conf->timeout);

    return NGX_AGAIN;
}


static ngx_int_t
ngx_http_idempotency_claim_send(ngx_http_idempotency_claim_t *c)
{
    ngx_http_idempotency_key_op_t  *kop;

    if (ngx_http_idempotency_claim_allowed(c->conf->redis) != NGX_OK) {
        return NGX_ERROR;
    }

    kop = ngx_http_idempotency_claim_op(c, ngx_http_idempotency_claim_done);
    if (kop == NULL) {
        return NGX_ERROR;
    }

    ngx_http_idempotency_store_events.claim_sent(kop);
    c->epoch = ngx_http_idempotency_watch_epoch;

    if (ngx_http_idempotency_claim_command(kop, &c->rkey, c->head,
                                           c->conf->lock_ttl + c->conf->ttl,
                                           &c->mode)
        != NGX_OK)
    {
        ngx_log_error(NGX_LOG_INFO, c->log, 0,
                      "idempotency: redis \"%V\" is not connected",
                      &c->conf->redis->name);
        return NGX_ERROR;
    }

    c->op = kop;

    return NGX_OK;
}


/*
 * An op that writes this claim (a claim, a take-over): a lease from now,
 * and what releases the claim if nobody waits for the reply any more.
 * Redis keeps a dead owner's claim, read as unknown.
 */

static ngx_http_idempotency_key_op_t *
ngx_http_idempotency_claim_op(ngx_http_idempotency_claim_t *c,
    ngx_http_idempotency_reply_pt handler)
{
    ngx_http_idempotency_key_op_t  *kop;

    kop = ngx_http_idempotency_key_op_alloc(c->conf->redis, &c->rkey);
    if (kop == NULL) {
        return NULL;
    }

    ngx_http_idempotency_lease_set(c->head, c->conf->lock_ttl);
    c->sent_at = ngx_http_idempotency_epoch_msec();

    /* until the owner renews it: what a release is sent again within */
    c->lease_end = ngx_current_msec + c->conf->lock_ttl;

    kop->op.data = c;
    kop->op.handler = handler;
    kop->release_lost = 1;
    kop->lease_end = c->lease_end;
    kop->ttl = c->conf->ttl;
    kop->zone = c->conf->zone;
    kop->forward = (c->conf->on_unknown
                    == NGX_HTTP_IDEMPOTENCY_ON_UNKNOWN_FORWARD);
    ngx_memcpy(kop->claim, c->head, NGX_HTTP_IDEMPOTENCY_HEAD_LEN);

    return kop;
}


static void
ngx_http_idempotency_claim_done(ngx_http_idempotency_op_t *op,
    redisReply *reply)
{
    ngx_uint_t                      answer;
    ngx_http_idempotency_claim_t   *c;
    ngx_http_idempotency_answer_t   a;
    ngx_http_idempotency_key_op_t  *kop;

    kop = ngx_http_idempotency_key_op(op);
    c = op->data;

    ngx_http_idempotency_store_events.claim_done(kop, reply != NULL);

    if (c == NULL) {
        /*
         * Nobody waits: a claim that may have won must not leave the key
         * stuck where nothing ran.  Unless its request passed upstream
         * unprotected: then it may run.
         */

        if (kop->release_lost
            && ngx_http_idempotency_claim_maybe_won(reply, kop->claim))
        {
            ngx_http_idempotency_release_orphan(kop);
        }

        return;
    }

    c->op = NULL;

    a.rkey = &c->rkey;
    a.claim = c->head;
    a.mode = &c->mode;
    a.keys = c->conf->keys;
    a.sent_at = c->sent_at;
    a.margin = c->conf->lock_ttl / 3;
    a.pool = c->pool;
    a.log = c->log;
    a.record = &c->record;
    a.status = &c->status;
    a.seen = c->seen;
    a.itself = 0;

    answer = ngx_http_idempotency_claim_answer(c->conf->redis, reply, &a);

    if (reply == NULL && !c->conf->passes && !c->conf->dry_run) {
        /* the claim may have landed before the connection broke */
        ngx_http_idempotency_release_orphan(kop);
    }

    if (answer != NGX_HTTP_IDEMPOTENCY_ANSWER_NEW) {
        ngx_http_idempotency_replicas_detach(c);
        ngx_http_idempotency_claim_found(c, answer);
        return;
    }

    switch (ngx_http_idempotency_replicas_hold(c, a.itself)) {

    case NGX_AGAIN:
        /* won: the replicas acknowledge it first, under the same timer */
        return;

    case NGX_ERROR:
        ngx_http_idempotency_claim_answered(c,
                                            NGX_HTTP_IDEMPOTENCY_ANSWER_ERROR);
        return;

    default:
        ngx_http_idempotency_claim_answered(c,
                                            NGX_HTTP_IDEMPOTENCY_ANSWER_NEW);
        return;
    }
}


/* what the claim found in place of its own */

static void
ngx_http_idempotency_claim_found(ngx_http_idempotency_claim_t *c,
    ngx_uint_t answer)
{
    switch (answer) {

    case NGX_HTTP_IDEMPOTENCY_ANSWER_AGAIN:
        /* refused as sent: claimed again, the way the server takes */
        ngx_http_idempotency_claim_again(c);
        return;

    case NGX_HTTP_IDEMPOTENCY_ANSWER_EXPIRED:
    case NGX_HTTP_IDEMPOTENCY_ANSWER_UNKNOWN:

        if (c->conf->on_unknown != NGX_HTTP_IDEMPOTENCY_ON_UNKNOWN_KEEP
            && !c->conf->dry_run)
        {
            if (c->takes++ >= NGX_HTTP_IDEMPOTENCY_TAKES_MAX) {
                answer = NGX_HTTP_IDEMPOTENCY_ANSWER_CONFLICT;

            } else if (ngx_http_idempotency_claim_take(c) == NGX_OK) {
                return;

            } else {
                answer = NGX_HTTP_IDEMPOTENCY_ANSWER_ERROR;
            }

            break;
        }

        if (answer == NGX_HTTP_IDEMPOTENCY_ANSWER_EXPIRED) {
            /* its owner is gone after it may have run: never a free key */
            if (!c->conf->dry_run) {
                ngx_http_idempotency_owner_lost(c);
            }

            answer = NGX_HTTP_IDEMPOTENCY_ANSWER_UNKNOWN;
        }

        ngx_log_error(NGX_LOG_INFO, c->log, 0,
                      "idempotency: outcome unknown for key hash %*s, "
                      "answered %ui",
                      (size_t) 2 * NGX_HTTP_IDEMPOTENCY_HASH_LEN,
                      ngx_http_idempotency_rkey_hash(&c->rkey), c->status);
        break;

    default:
        break;
    }

    if (answer == NGX_HTTP_IDEMPOTENCY_ANSWER_CONFLICT
        && ngx_http_idempotency_claim_wait(c) == NGX_OK)
    {
        return;
    }

    ngx_http_idempotency_claim_answered(c, answer);
}


/*
 * forward and release: the first retry that finds an unknown outcome (or
 * a dead owner's lease) takes the record over, atomically: only if it
 * still holds exactly what this request read.  A renewal or a store in
 * between makes it fail, and the request claims again.
 */

static ngx_int_t
ngx_http_idempotency_claim_take(ngx_http_idempotency_claim_t *c)
{
    ngx_http_idempotency_key_op_t  *kop;

    kop = ngx_http_idempotency_claim_op(c, ngx_http_idempotency_take_done);
    if (kop == NULL) {
        return NGX_ERROR;
    }

    if (ngx_http_idempotency_take_command(&kop->op, &c->rkey, c->seen,
                                          c->head,
                                          c->conf->lock_ttl + c->conf->ttl)
        != NGX_OK)
    {
        return NGX_ERROR;
    }

    c->op = kop;

    if (c->timer.timer_set) {
        ngx_del_timer(&c->timer);
    }

    ngx_add_timer(&c->timer, c->conf->timeout);

    return NGX_OK;
}


static void
ngx_http_idempotency_take_done(ngx_http_idempotency_op_t *op,
    redisReply *reply)
{
    ngx_int_t                       took;
    ngx_http_idempotency_claim_t   *c;
    ngx_http_idempotency_key_op_t  *kop;

    kop = ngx_http_idempotency_key_op(op);
    c = op->data;
    took = ngx_http_idempotency_take_result(op->redis, reply,
                                            c ? c->log : NULL);

    if (c == NULL) {
        if (kop->release_lost && (reply == NULL || took == NGX_OK)) {
            ngx_http_idempotency_take_lost(kop);
        }

        return;
    }

    c->op = NULL;

    if (took == NGX_OK) {
        ngx_log_error(NGX_LOG_WARN, c->log, 0,
                      "idempotency: outcome unknown for key hash %*s, taken "
                      "over by this request (idempotency_on_unknown %s)",
                      (size_t) 2 * NGX_HTTP_IDEMPOTENCY_HASH_LEN,
                      ngx_http_idempotency_rkey_hash(&c->rkey),
                      c->conf->on_unknown
                      == NGX_HTTP_IDEMPOTENCY_ON_UNKNOWN_FORWARD
                      ? "forward" : "release");

        c->took_over = (c->conf->on_unknown
                        == NGX_HTTP_IDEMPOTENCY_ON_UNKNOWN_FORWARD);

        ngx_http_idempotency_claim_answered(c,
                                            NGX_HTTP_IDEMPOTENCY_ANSWER_NEW);
        return;
    }

    if (took == NGX_DECLINED) {
        /* the record changed since it was read: read it again */
        ngx_http_idempotency_claim_again(c);
        return;
    }

    if (reply == NULL) {
        ngx_http_idempotency_take_lost(kop);
    }

    ngx_http_idempotency_claim_answered(c, NGX_HTTP_IDEMPOTENCY_ANSWER_ERROR);
}


static void
ngx_http_idempotency_claim_again(ngx_http_idempotency_claim_t *c)
{
    if (ngx_http_idempotency_claim_start(c) != NGX_AGAIN) {
        ngx_http_idempotency_claim_answered(c,
                                            NGX_HTTP_IDEMPOTENCY_ANSWER_ERROR);
    }
}


/*
 * The round trip's timer.  The reply will still come, or not: it finds
 * nobody, and releases a claim that landed, unless the request now runs
 * unprotected.
 *
 * The connection is left alone: its watchdog resets it when Redis stops
 * answering.  One that answers slowly (WAITs that cannot be met while a
 * replica resyncs) still carries the releases and stores of other requests
 * behind this one: a reset would lose them all, again at every timeout,
 * until their leases ran out.
 */

static void
ngx_http_idempotency_claim_timeout(ngx_event_t *ev)
{
    ngx_http_idempotency_claim_t *c = ev->data;

    ngx_http_idempotency_replicas_timedout(c);

    if (c->op) {
        c->op->release_lost = !c->conf->passes && !c->conf->dry_run;
        c->op->op.data = NULL;
        c->op = NULL;
    }

    ngx_http_idempotency_replicas_detach(c);

    ngx_log_error(NGX_LOG_ERR, c->log, NGX_ETIMEDOUT,
                  "idempotency: redis \"%V\" timed out", &c->conf->redis->name);

    ngx_http_idempotency_claim_answered(c, NGX_HTTP_IDEMPOTENCY_ANSWER_ERROR);
}


/* the one answer of a start: its timer ends with it */

void
ngx_http_idempotency_claim_answered(ngx_http_idempotency_claim_t *c,
    ngx_uint_t answer)
{
    if (c->timer.timer_set) {
        ngx_del_timer(&c->timer);
    }

    ngx_http_idempotency_claim_unwatch(c);

    if (answer == NGX_HTTP_IDEMPOTENCY_ANSWER_NEW) {
        /* the claim is the request's from now: its lease is kept alive */
        ngx_http_idempotency_renew_start(c);
    }

    c->handler(c, answer);
}


/*
 * The line that names the claim's request in the logs of its ends: asked
 * of the request once, when the first of them needs it, not for every
 * claim (a replay or a 409 ends none).
 */

void
ngx_http_idempotency_claim_info(ngx_http_idempotency_claim_t *c,
    ngx_str_t *info)
{
    if (c->info_len == 0) {
        c->info_len = c->describe(c->data, c->info) - c->info;
    }

    info->data = c->info;
    info->len = c->info_len;
}


/*
 * The request goes away, or on without an answer: a late reply finds
 * nobody, and a claim it shows won is released then (or, taken over under
 * forward, made unknown again).  A claim already won is ended by its
 * request before this, or by its lease.
 */

void
ngx_http_idempotency_claim_detach(ngx_http_idempotency_claim_t *c)
{
    if (c->op) {
        c->op->op.data = NULL;
        c->op = NULL;
    }

    ngx_http_idempotency_replicas_detach(c);
    ngx_http_idempotency_claim_unwatch(c);
    ngx_http_idempotency_renew_stop(c);

    if (c->timer.timer_set) {
        ngx_del_timer(&c->timer);
    }
}
