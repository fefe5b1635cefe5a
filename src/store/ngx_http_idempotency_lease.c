
/*
 * Copyright (C) The ngx_http_idempotency_module authors
 *
 * The owner's lease.  A format 2 claim's token is
 *
 *   owner[8] | 0xC1 | 'L' | u48 deadline (ms since the epoch)
 *   owner[8] | 0xC1 | 'U' | cause status_hi status_lo 0 0 0
 *
 * A lease lives as long as its owner: the owner renews it every third of
 * idempotency_lock_ttl while its request is alive.  A lease past its
 * deadline is an owner that died after it may have run the request: read
 * as an unknown outcome, never as a free key.  Both stay state 1 and 53
 * bytes, so a worker that knows only format 1 reads them as in progress.
 */


#include "ngx_http_idempotency_module.h"


#define NGX_HTTP_IDEMPOTENCY_KIND_LEASE    'L'
#define NGX_HTTP_IDEMPOTENCY_KIND_UNKNOWN  'U'

/* where the mark and the word stand in a claim */
#define NGX_HTTP_IDEMPOTENCY_MARK_AT   NGX_HTTP_IDEMPOTENCY_OWNER_LEN
#define NGX_HTTP_IDEMPOTENCY_WORD_AT   (NGX_HTTP_IDEMPOTENCY_OWNER_LEN + 2)

/* 2020-09-13: no lease of this format was written before it */
#define NGX_HTTP_IDEMPOTENCY_LEASE_EPOCH  1600000000000ULL


static void ngx_http_idempotency_renew(ngx_event_t *ev);
static void ngx_http_idempotency_renew_done(ngx_http_idempotency_op_t *op,
    redisReply *reply);
static void ngx_http_idempotency_lease_word(u_char *p, uint64_t v);


/*
 * renew: KEYS[1] record key, ARGV[1] the claim's first 47 bytes (owner,
 * mark, 'L'), ARGV[2] the new deadline, ARGV[3] the key's TTL (lock + ttl,
 * ms): an owner that outlives idempotency_ttl must not see its claim
 * expire under it.  An unknown outcome or a stored record is never turned
 * back into a lease.  A deadline only moves forward: a renewal that
 * stalled in Redis and lands after later ones must not move it back (the
 * model found it); the big-endian bytes are compared one by one, as Lua's
 * string order follows the server's locale.
 */

ngx_str_t  ngx_http_idempotency_renew_script = ngx_string(
    "if redis.call('GETRANGE', KEYS[1], 0, 46) ~= ARGV[1] then\n"
    "  return 0\n"
    "end\n"
    "local w = redis.call('GETRANGE', KEYS[1], 47, 52)\n"
    "for i = 1, 6 do\n"
    "  local a, b = string.byte(w, i), string.byte(ARGV[2], i)\n"
    "  if a > b then return 1 end\n"
    "  if a < b then break end\n"
    "end\n"
    "redis.call('SETRANGE', KEYS[1], 47, ARGV[2])\n"
    "redis.call('PEXPIRE', KEYS[1], ARGV[3])\n"
    "return 1\n"
);


uint64_t
ngx_http_idempotency_epoch_msec(void)
{
    ngx_time_t  *tp;

    tp = ngx_timeofday();

    return (uint64_t) tp->sec * 1000 + tp->msec;
}


/* a lease until now + lock_ttl, written into the claim before it is sent */

void
ngx_http_idempotency_lease_set(u_char *claim, ngx_msec_t lock_ttl)
{
    claim[NGX_HTTP_IDEMPOTENCY_MARK_AT] = NGX_HTTP_IDEMPOTENCY_LEASE_MARK;
    claim[NGX_HTTP_IDEMPOTENCY_MARK_AT + 1] = NGX_HTTP_IDEMPOTENCY_KIND_LEASE;

    ngx_http_idempotency_lease_word(claim + NGX_HTTP_IDEMPOTENCY_WORD_AT,
                                ngx_http_idempotency_epoch_msec() + lock_ttl);
}


/* the owner's claim turned into an unknown outcome: same owner, 'U' */

void
ngx_http_idempotency_lease_unknown(u_char *buf, u_char *claim,
    ngx_uint_t status, ngx_uint_t cause)
{
    u_char  *p;

    ngx_memcpy(buf, claim, NGX_HTTP_IDEMPOTENCY_OWNER_LEN);

    p = buf + NGX_HTTP_IDEMPOTENCY_MARK_AT;
    *p++ = NGX_HTTP_IDEMPOTENCY_LEASE_MARK;
    *p++ = NGX_HTTP_IDEMPOTENCY_KIND_UNKNOWN;
    *p++ = (u_char) cause;
    *p++ = (u_char) (status >> 8);
    *p++ = (u_char) status;
    *p++ = 0;
    *p++ = 0;
    *p = 0;
}


/*
 * What a claim record says: a format 1 lock, a live lease, an expired one
 * (the owner is presumed dead: 502) or an unknown outcome with its status.
 * A token that does not parse as format 2 is a format 1 lock: its bytes
 * are random, and Redis expires it.
 *
 * A lease is judged at "at", when the reader sent the request that read
 * it, not when the reply came (a slow reply must not make a live lease
 * look expired), and only past a margin for the difference of the two
 * hosts' clocks: the model checker found both.
 */

ngx_uint_t
ngx_http_idempotency_lease_read(u_char *head, ngx_uint_t *status,
    uint64_t at, ngx_msec_t margin)
{
    u_char      *w;
    uint64_t     deadline;
    ngx_uint_t   st;

    *status = NGX_HTTP_BAD_GATEWAY;

    if (head[NGX_HTTP_IDEMPOTENCY_MARK_AT] != NGX_HTTP_IDEMPOTENCY_LEASE_MARK)
    {
        return NGX_HTTP_IDEMPOTENCY_LEASE_OLD;
    }

    w = head + NGX_HTTP_IDEMPOTENCY_WORD_AT;

    switch (head[NGX_HTTP_IDEMPOTENCY_MARK_AT + 1]) {

    case NGX_HTTP_IDEMPOTENCY_KIND_LEASE:
        deadline = ngx_http_idempotency_lease_deadline(head);

        if (deadline == 0) {
            /* an older worker's sequence number, not a deadline */
            return NGX_HTTP_IDEMPOTENCY_LEASE_OLD;
        }

        return at > deadline + margin ? NGX_HTTP_IDEMPOTENCY_LEASE_EXPIRED
                                      : NGX_HTTP_IDEMPOTENCY_LEASE_LIVE;

    case NGX_HTTP_IDEMPOTENCY_KIND_UNKNOWN:
        st = (ngx_uint_t) w[1] << 8 | w[2];

        if (w[3] || w[4] || w[5]
            || w[0] == 0 || w[0] > NGX_HTTP_IDEMPOTENCY_CAUSES
            || st < 500 || st > 599)
        {
            return NGX_HTTP_IDEMPOTENCY_LEASE_OLD;
        }

        *status = st;

        return NGX_HTTP_IDEMPOTENCY_LEASE_UNKNOWN;

    default:
        return NGX_HTTP_IDEMPOTENCY_LEASE_OLD;
    }
}


/* the deadline of a format 2 lease, ms since the epoch; 0 for others */

uint64_t
ngx_http_idempotency_lease_deadline(u_char *head)
{
    u_char      *w;
    uint64_t     deadline;
    ngx_uint_t   i;

    if (head[NGX_HTTP_IDEMPOTENCY_MARK_AT] != NGX_HTTP_IDEMPOTENCY_LEASE_MARK
        || head[NGX_HTTP_IDEMPOTENCY_MARK_AT + 1]
           != NGX_HTTP_IDEMPOTENCY_KIND_LEASE)
    {
        return 0;
    }

    w = head + NGX_HTTP_IDEMPOTENCY_WORD_AT;
    deadline = 0;

    for (i = 0; i < 6; i++) {
        deadline = deadline << 8 | w[i];
    }

    return deadline < NGX_HTTP_IDEMPOTENCY_LEASE_EPOCH ? 0 : deadline;
}


/*
 * Renewal starts with the owner and stops with its request: a request
 * shorter than a third of the lock never renews.  The timer is not
 * cancelable: a worker that shuts down keeps renewing for the requests it
 * still serves, until worker_shutdown_timeout.
 */

void
ngx_http_idempotency_lease_start(ngx_http_request_t *r,
    ngx_http_idempotency_ctx_t *ctx)
{
    ngx_event_t  *ev;

    ctx->lease_end = ngx_current_msec + ctx->conf->lock_ttl;

    ev = &ctx->lease;
    ev->handler = ngx_http_idempotency_renew;
    ev->data = ctx;
    ev->log = r->connection->log;

    ngx_add_timer(ev, ngx_max(ctx->conf->lock_ttl / 3, 1));
}


void
ngx_http_idempotency_lease_stop(ngx_http_idempotency_ctx_t *ctx)
{
    if (ctx->lease.timer_set) {
        ngx_del_timer(&ctx->lease);
    }

    if (ctx->renew_op) {
        ctx->renew_op->ctx = NULL;
        ctx->renew_op = NULL;
    }
}


static void
ngx_http_idempotency_renew(ngx_event_t *ev)
{
    ngx_http_idempotency_ctx_t *ctx = ev->data;

    u_char                      word[6], ttl[NGX_INT_T_LEN];
    size_t                      argvlen[7];
    const char                 *argv[7];
    ngx_http_idempotency_op_t  *op;

    if (ctx->finished) {
        return;
    }

    ngx_add_timer(ev, ngx_max(ctx->conf->lock_ttl / 3, 1));

    if (ctx->renew_op) {
        /* the last one is not answered yet: its deadline still holds */
        return;
    }

    op = ngx_http_idempotency_op_alloc(ctx->redis);
    if (op == NULL) {
        return;
    }

    op->ctx = ctx;
    op->handler = ngx_http_idempotency_renew_done;
    op->rkey_len = ctx->rkey.len;
    ngx_memcpy(op->rkey, ctx->rkey.data, ctx->rkey.len);
    op->lease_end = ngx_current_msec + ctx->conf->lock_ttl;

    ngx_http_idempotency_lease_word(word, ngx_http_idempotency_epoch_msec()
                                          + ctx->conf->lock_ttl);

    argv[0] = "EVAL";
    argvlen[0] = 4;
    argv[1] = (const char *) ngx_http_idempotency_renew_script.data;
    argvlen[1] = ngx_http_idempotency_renew_script.len;
    argv[2] = "1";
    argvlen[2] = 1;
    argv[3] = (const char *) ctx->rkey.data;
    argvlen[3] = ctx->rkey.len;
    argv[4] = (const char *) ctx->claim;
    argvlen[4] = NGX_HTTP_IDEMPOTENCY_WORD_AT;
    argv[5] = (const char *) word;
    argvlen[5] = 6;
    argv[6] = (const char *) ttl;
    argvlen[6] = ngx_http_idempotency_decimal(ttl, ctx->conf->lock_ttl
                                                   + ctx->conf->ttl)
                 - ttl;

    if (ngx_http_idempotency_redis_command(op, 7, argv, argvlen) != NGX_OK) {
        ngx_log_error(NGX_LOG_WARN, ev->log, 0,
                      "idempotency: cannot renew the claim, redis \"%V\" is "
                      "not connected, key hash %*s", &ctx->redis->name,
                      (size_t) 2 * NGX_HTTP_IDEMPOTENCY_HASH_LEN,
                      ngx_http_idempotency_key_hash(ctx));
        return;
    }

    ctx->renew_op = op;
}


static void
ngx_http_idempotency_renew_done(ngx_http_idempotency_op_t *op,
    redisReply *reply)
{
    ngx_http_idempotency_ctx_t  *ctx;

    ctx = op->ctx;

    if (ctx == NULL) {
        /* the request ended meanwhile */
        return;
    }

    ctx->renew_op = NULL;

    if (reply && reply->type == REDIS_REPLY_INTEGER && reply->integer == 1) {
        ctx->lease_end = op->lease_end;
        return;
    }

    if (ctx->finished) {
        /* a store or unknown outcome is there now: nothing to renew */
        return;
    }

    ngx_log_error((ngx_uint_t) (reply ? NGX_LOG_ERR : NGX_LOG_WARN),
                  ctx->request->connection->log, 0,
                  "idempotency: the claim was not renewed: %s, key hash %*s",
                  reply == NULL ? "redis went away"
                  : reply->type == REDIS_REPLY_ERROR ? "redis error"
                  : "the key is no longer this request's",
                  (size_t) 2 * NGX_HTTP_IDEMPOTENCY_HASH_LEN,
                  ngx_http_idempotency_key_hash(ctx));
}


/* six bytes, big-endian: milliseconds until the year 10889 */

static void
ngx_http_idempotency_lease_word(u_char *p, uint64_t v)
{
    ngx_uint_t  i;

    for (i = 6; i-- > 0; /* void */) {
        p[i] = (u_char) v;
        v >>= 8;
    }
}
