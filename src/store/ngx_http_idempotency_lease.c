
/*
 * Copyright (C) The ngx_http_idempotency_module authors
 *
 * The owner's lease.  A format 2 claim's token is
 *
 *   owner[8] | 0xC1 | 'L' | u48 deadline (ms since the epoch)
 *   owner[8] | 0xC1 | 'U' | cause status_hi status_lo 0 0 0
 *
 * and a completed record's or a too-large marker's, from 0.4.0 on,
 *
 *   owner[8] | 0xC1 | 'S' | u48 when it was stored (ms since the epoch)
 *
 * A lease lives as long as its owner: the owner renews it every third of
 * idempotency_lock_ttl while its request is alive.  A lease past its
 * deadline is an owner that died after it may have run the request: read
 * as an unknown outcome, never as a free key.  Both stay state 1 and 53
 * bytes, so a worker that knows only format 1 reads them as in progress.
 * Nothing reads the token of a stored record but the admin view, so the
 * time it keeps there is new to no worker: earlier ones replay it as ever.
 */


#include "ngx_http_idempotency_store.h"


#define NGX_HTTP_IDEMPOTENCY_KIND_LEASE    'L'
#define NGX_HTTP_IDEMPOTENCY_KIND_UNKNOWN  'U'
#define NGX_HTTP_IDEMPOTENCY_KIND_STORED   'S'

/* where the mark and the word stand in a claim */
#define NGX_HTTP_IDEMPOTENCY_MARK_AT   NGX_HTTP_IDEMPOTENCY_OWNER_LEN
#define NGX_HTTP_IDEMPOTENCY_WORD_AT   (NGX_HTTP_IDEMPOTENCY_OWNER_LEN + 2)

/* 2020-09-13: no lease of this format was written before it */
#define NGX_HTTP_IDEMPOTENCY_LEASE_EPOCH  1600000000000ULL


static void ngx_http_idempotency_lease_renew_done(
    ngx_http_idempotency_op_t *op, redisReply *reply);
static ngx_uint_t ngx_http_idempotency_lease_renewed(
    ngx_http_idempotency_key_op_t *kop, redisReply *reply, u_char *claim);
static void ngx_http_idempotency_lease_word(u_char *p, uint64_t v);
static uint64_t ngx_http_idempotency_lease_time(u_char *head,
    ngx_uint_t kind);


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

static ngx_str_t  ngx_http_idempotency_renew_script = ngx_string(
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
 * A completed record or a too-large marker, written just before it is
 * stored: the owner stays, the lease gives way to the time it was stored
 */

void
ngx_http_idempotency_lease_stored(u_char *head)
{
    head[NGX_HTTP_IDEMPOTENCY_MARK_AT] = NGX_HTTP_IDEMPOTENCY_LEASE_MARK;
    head[NGX_HTTP_IDEMPOTENCY_MARK_AT + 1] = NGX_HTTP_IDEMPOTENCY_KIND_STORED;

    ngx_http_idempotency_lease_word(head + NGX_HTTP_IDEMPOTENCY_WORD_AT,
                                    ngx_http_idempotency_epoch_msec());
}


/* when a stored record was stored; 0 for one of a version that kept none */

uint64_t
ngx_http_idempotency_lease_stored_at(u_char *head)
{
    return ngx_http_idempotency_lease_time(head,
                                           NGX_HTTP_IDEMPOTENCY_KIND_STORED);
}


/*
 * Why a finish's value is an unknown outcome (CAUSE_*), for its count; 0
 * for a value that is none (a completed record, a too-large marker)
 */

ngx_uint_t
ngx_http_idempotency_lease_cause(u_char *value)
{
    if (ngx_http_idempotency_head_state(value)
        != NGX_HTTP_IDEMPOTENCY_REC_CLAIM)
    {
        return 0;
    }

    return value[NGX_HTTP_IDEMPOTENCY_WORD_AT];
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

    *status = NGX_HTTP_IDEMPOTENCY_STATUS_UNKNOWN;

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
    return ngx_http_idempotency_lease_time(head,
                                           NGX_HTTP_IDEMPOTENCY_KIND_LEASE);
}


/*
 * The time in a token of that kind; 0 for another kind, or for a word
 * before this format existed (an older worker's sequence number)
 */

static uint64_t
ngx_http_idempotency_lease_time(u_char *head, ngx_uint_t kind)
{
    u_char      *w;
    uint64_t     t;
    ngx_uint_t   i;

    if (head[NGX_HTTP_IDEMPOTENCY_MARK_AT] != NGX_HTTP_IDEMPOTENCY_LEASE_MARK
        || head[NGX_HTTP_IDEMPOTENCY_MARK_AT + 1] != kind)
    {
        return 0;
    }

    w = head + NGX_HTTP_IDEMPOTENCY_WORD_AT;
    t = 0;

    for (i = 0; i < 6; i++) {
        t = t << 8 | w[i];
    }

    return t < NGX_HTTP_IDEMPOTENCY_LEASE_EPOCH ? 0 : t;
}

/*
 * Sends the renewal of an owner's lease for lock_ttl more, the key's TTL
 * to lock_ttl + ttl.  With a native compare-and-set, SET ... IFEQ GET the
 * claim as the owner last knew it; else the renew script, which compares
 * the owner's bytes only.  The reply is read here: claim, the owner's
 * copy, is kept as Redis holds it, and handler is told what became of the
 * renewal, unless the owner detached the op (op.data NULL) before; claim
 * is not touched then.  On NGX_ERROR the op has been freed.
 */

ngx_int_t
ngx_http_idempotency_lease_renew(ngx_http_idempotency_key_op_t *kop,
    ngx_str_t *rkey, u_char *claim, ngx_msec_t lock_ttl, ngx_msec_t ttl,
    ngx_http_idempotency_renewed_pt handler, void *data)
{
    u_char       word[6], pttl[NGX_INT_T_LEN];
    size_t       argvlen[8];
    const char  *argv[8];

    kop->op.data = data;
    kop->op.handler = ngx_http_idempotency_lease_renew_done;
    kop->renewed = handler;
    kop->owner = claim;
    kop->lease_end = ngx_current_msec + lock_ttl;

    ngx_http_idempotency_lease_word(word, ngx_http_idempotency_epoch_msec()
                                          + lock_ttl);

    argvlen[0] = ngx_http_idempotency_decimal(pttl, lock_ttl + ttl) - pttl;

    if (ngx_http_idempotency_native_cas(kop->op.redis)) {
        /* the new claim, kept to be the owner's once Redis has it */
        ngx_memcpy(kop->claim, claim, NGX_HTTP_IDEMPOTENCY_WORD_AT);
        ngx_memcpy(kop->claim + NGX_HTTP_IDEMPOTENCY_WORD_AT, word, 6);

        ngx_http_idempotency_arg(argv, argvlen, 6, "PX");
        argv[7] = (const char *) pttl;
        argvlen[7] = argvlen[0];

        ngx_http_idempotency_cas_args(argv, argvlen, rkey, kop->claim,
                                      NGX_HTTP_IDEMPOTENCY_HEAD_LEN, claim);
        ngx_http_idempotency_arg(argv, argvlen, 5, "GET");

        return ngx_http_idempotency_redis_command(&kop->op, 8, argv,
                                                  argvlen);
    }

    argv[6] = (const char *) pttl;
    argvlen[6] = argvlen[0];

    ngx_http_idempotency_eval_args(argv, argvlen,
                                   &ngx_http_idempotency_renew_script, rkey);
    argv[4] = (const char *) claim;
    argvlen[4] = NGX_HTTP_IDEMPOTENCY_WORD_AT;
    argv[5] = (const char *) word;
    argvlen[5] = 6;

    return ngx_http_idempotency_redis_command(&kop->op, 7, argv, argvlen);
}


/* the owner is told, if it still waits; the request may have ended */

static void
ngx_http_idempotency_lease_renew_done(ngx_http_idempotency_op_t *op,
    redisReply *reply)
{
    ngx_http_idempotency_key_op_t  *kop;

    if (op->data == NULL) {
        return;
    }

    kop = ngx_http_idempotency_key_op(op);

    kop->renewed(op->data,
                 ngx_http_idempotency_lease_renewed(kop, reply, kop->owner),
                 kop->lease_end);
}


/*
 * The reply to a renewal: RENEWED when the lease holds for lock_ttl more
 * (claim, the owner's copy, is then what Redis holds), RENEW_LOST when the
 * key is no longer this owner's lease (a record, an unknown outcome,
 * another owner, gone), RENEW_ERROR on an error, RENEW_GONE on no reply.
 * A native compare that failed on the owner's own lease (a renewal whose
 * reply was lost landed after all) takes what Redis holds: RENEW_LANDED,
 * and the next renewal compares with it.  A deadline never moves back: the
 * compare is on the whole claim, so a renewal that stalled finds a later
 * one there.
 */

static ngx_uint_t
ngx_http_idempotency_lease_renewed(ngx_http_idempotency_key_op_t *kop,
    redisReply *reply, u_char *claim)
{
    if (reply == NULL) {
        return NGX_HTTP_IDEMPOTENCY_RENEW_GONE;
    }

    if (reply->type == REDIS_REPLY_ERROR) {
        return NGX_HTTP_IDEMPOTENCY_RENEW_ERROR;
    }

    if (reply->type == REDIS_REPLY_INTEGER) {
        /* the script */
        return reply->integer == 1 ? NGX_HTTP_IDEMPOTENCY_RENEWED
                                   : NGX_HTTP_IDEMPOTENCY_RENEW_LOST;
    }

    if (reply->type != REDIS_REPLY_STRING
        || (size_t) reply->len != NGX_HTTP_IDEMPOTENCY_HEAD_LEN
        || ngx_memcmp(reply->str, claim, NGX_HTTP_IDEMPOTENCY_WORD_AT) != 0)
    {
        return NGX_HTTP_IDEMPOTENCY_RENEW_LOST;
    }

    if (ngx_memcmp(reply->str, claim, NGX_HTTP_IDEMPOTENCY_HEAD_LEN) == 0) {
        ngx_memcpy(claim, kop->claim, NGX_HTTP_IDEMPOTENCY_HEAD_LEN);
        return NGX_HTTP_IDEMPOTENCY_RENEWED;
    }

    ngx_memcpy(claim, reply->str, NGX_HTTP_IDEMPOTENCY_HEAD_LEN);

    return NGX_HTTP_IDEMPOTENCY_RENEW_LANDED;
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
