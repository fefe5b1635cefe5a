
/*
 * Copyright (C) The ngx_http_idempotency_module authors
 *
 * A result is not lost while its owner lives.  A store, an unknown outcome
 * or a release that Redis did not acknowledge (the connection broke, Redis
 * stalled past its timeout, a failover, READONLY, TRYAGAIN during a slot
 * migration, a failed ROLE check) is kept and sent again, with backoff,
 * until Redis answers or the owner's lease ends.  The finish script is
 * owner-checked and a resend of a store that landed finds its own record,
 * so sending one twice is harmless.  Past the lease a duplicate reads the
 * claim as an unknown outcome, never as a free key.
 *
 * The client keeps the command as it sent it; a retry hands it back to the
 * client as a new command (redis_command_kept()), so that a cluster routes
 * it to whichever node has the slot by then.  The store never reads those
 * bytes.  What is kept is bounded per worker.
 */


#include "ngx_http_idempotency_store.h"


#define NGX_HTTP_IDEMPOTENCY_RETRY_FIRST   50
#define NGX_HTTP_IDEMPOTENCY_RETRY_MAX     1000

#ifndef NGX_HTTP_IDEMPOTENCY_RETRY_BUDGET
#define NGX_HTTP_IDEMPOTENCY_RETRY_BUDGET  (8 * 1024 * 1024)
#endif


typedef struct {
    ngx_event_t                      ev;
    ngx_queue_t                      queue;
    u_char                          *buf;        /* the client's, kept */
    size_t                           len;
    ngx_msec_t                       backoff;
    ngx_http_idempotency_key_op_t    kop;        /* what the op carried */
} ngx_http_idempotency_retry_t;


static ngx_uint_t ngx_http_idempotency_retryable(redisReply *reply);
static void ngx_http_idempotency_retry_handler(ngx_event_t *ev);
static void ngx_http_idempotency_retry_free(ngx_http_idempotency_retry_t *rt);


static size_t       ngx_http_idempotency_retry_bytes;
static ngx_queue_t  ngx_http_idempotency_retries;
static ngx_uint_t   ngx_http_idempotency_retries_init;


/*
 * Called by a finish's reply handler first: NGX_OK when the op was taken
 * to be sent again (the handler then says nothing), NGX_DECLINED when the
 * reply is final or the lease is over.
 */

ngx_int_t
ngx_http_idempotency_finish_retry(ngx_http_idempotency_op_t *op,
    redisReply *reply)
{
    ngx_msec_int_t                  left;
    ngx_http_idempotency_retry_t   *rt;
    ngx_http_idempotency_key_op_t  *kop;

    if (reply && !ngx_http_idempotency_retryable(reply)) {
        return NGX_DECLINED;
    }

    kop = ngx_http_idempotency_key_op(op);

    left = (ngx_msec_int_t) (kop->lease_end - ngx_current_msec);

    if (op->buf == NULL || kop->lease_end == 0 || left <= 0
        || op->redis->exiting || ngx_terminate)
    {
        return NGX_DECLINED;
    }

    if (ngx_http_idempotency_retry_bytes + op->buf_len
        > NGX_HTTP_IDEMPOTENCY_RETRY_BUDGET)
    {
        ngx_log_error(NGX_LOG_ERR, op->redis->log, 0,
                      "idempotency: %uz bytes of finishes wait to be sent "
                      "again to redis \"%V\" already: this one is not kept",
                      ngx_http_idempotency_retry_bytes, &op->redis->name);
        return NGX_DECLINED;
    }

    rt = ngx_alloc(sizeof(ngx_http_idempotency_retry_t), op->redis->log);
    if (rt == NULL) {
        return NGX_DECLINED;
    }

    if (!ngx_http_idempotency_retries_init) {
        ngx_queue_init(&ngx_http_idempotency_retries);
        ngx_http_idempotency_retries_init = 1;
    }

    ngx_memcpy(&rt->kop, kop, sizeof(ngx_http_idempotency_key_op_t));

    /* the command is the retry's now */
    rt->buf = op->buf;
    rt->len = op->buf_len;
    op->buf = NULL;
    rt->kop.op.buf = NULL;

    rt->backoff = kop->retry_backoff ? ngx_min(kop->retry_backoff * 2,
                                               NGX_HTTP_IDEMPOTENCY_RETRY_MAX)
                                     : NGX_HTTP_IDEMPOTENCY_RETRY_FIRST;

    ngx_memzero(&rt->ev, sizeof(ngx_event_t));
    rt->ev.handler = ngx_http_idempotency_retry_handler;
    rt->ev.data = rt;
    rt->ev.log = op->redis->log;

    /* a worker that exits gracefully does not wait for Redis to return */
    rt->ev.cancelable = 1;

    ngx_add_timer(&rt->ev, ngx_min(rt->backoff, (ngx_msec_t) left));

    ngx_queue_insert_tail(&ngx_http_idempotency_retries, &rt->queue);
    ngx_http_idempotency_retry_bytes += rt->len;

    if (kop->retry_backoff == 0) {
        ngx_log_error(NGX_LOG_WARN, op->redis->log, 0,
                      "idempotency: redis \"%V\" did not acknowledge the "
                      "%s (%s), sending it again for up to %M ms, %*s",
                      &op->redis->name,
                      kop->orphan ? "release of a lost claim"
                      : kop->store ? "record" : "release",
                      reply ? "error reply" : "no reply", (ngx_msec_t) left,
                      kop->info_len ? kop->info_len : op->rkey_len,
                      kop->info_len ? kop->info : op->rkey);
    }

    return NGX_OK;
}


/*
 * The first send of a finish found no connection: it is formatted and
 * kept to be sent again, as if its reply had been lost.
 */

ngx_int_t
ngx_http_idempotency_retry_command(ngx_http_idempotency_op_t *op, int argc,
    const char **argv, const size_t *argvlen)
{
    ngx_int_t  rc;

    op->buf = ngx_alloc(ngx_http_idempotency_format_len(argc, argvlen),
                        op->redis->log);
    if (op->buf == NULL) {
        ngx_http_idempotency_op_free(op);
        return NGX_ERROR;
    }

    /* the length is an upper bound: the command is what format() wrote */
    op->buf_len = ngx_http_idempotency_format(op->buf, argc, argv, argvlen)
                  - op->buf;

    rc = ngx_http_idempotency_finish_retry(op, NULL);

    ngx_http_idempotency_op_free(op);

    return rc == NGX_OK ? NGX_OK : NGX_ERROR;
}


static ngx_uint_t
ngx_http_idempotency_retryable(redisReply *reply)
{
    size_t       i;
    ngx_str_t   *s;

    /* beside a server that will answer soon (the client's list) */

    static ngx_str_t  transient[] = {
        ngx_string("READONLY"),
        ngx_string("NOREPLICAS"),
        ngx_string("ERR idempotency: staged record missing"),
        ngx_null_string
    };

    if (reply->type != REDIS_REPLY_ERROR) {
        return 0;
    }

    if (ngx_http_idempotency_reply_passing(reply, 1)) {
        return 1;
    }

    for (s = transient; s->len; s++) {
        i = s->len;

        if ((size_t) reply->len >= i
            && ngx_strncmp(reply->str, s->data, i) == 0)
        {
            return 1;
        }
    }

    return 0;
}


static void
ngx_http_idempotency_retry_handler(ngx_event_t *ev)
{
    ngx_http_idempotency_retry_t *rt = ev->data;

    ngx_msec_int_t                  left;
    ngx_http_idempotency_op_t      *op;
    ngx_http_idempotency_key_op_t  *kop, *saved;

    saved = &rt->kop;

    kop = ngx_http_idempotency_key_op_copy(saved);
    if (kop == NULL) {
        goto again;
    }

    op = &kop->op;
    op->handler = saved->op.handler;
    kop->retry_backoff = rt->backoff;
    kop->cas = 0;
    op->resent = 1;

    /* an EVALSHA still (its EVAL after a NOSCRIPT needs no script) */
    op->script = saved->op.script;

    /* a copy: a command the client cannot send is freed with its op */

    if (ngx_http_idempotency_resp_keep(op, rt->buf, rt->len) != NGX_OK) {
        ngx_http_idempotency_op_free(op);
        goto again;
    }

    if (ngx_http_idempotency_redis_command_kept(op) == NGX_OK)
    {
        /* the op carries it now; its reply decides what comes next */
        ngx_http_idempotency_retry_free(rt);
        return;
    }

again:

    left = (ngx_msec_int_t) (saved->lease_end - ngx_current_msec);

    if (left <= 0 || saved->op.redis->exiting) {
        ngx_log_error(NGX_LOG_ERR, ev->log, 0,
                      "idempotency: redis \"%V\" stayed unreachable until "
                      "the claim's lease ended: the %s was not sent; a "
                      "retry gets outcome-unknown, %*s",
                      &saved->op.redis->name,
                      saved->orphan ? "release of a lost claim"
                      : saved->store ? "record" : "release",
                      saved->info_len ? saved->info_len : saved->op.rkey_len,
                      saved->info_len ? saved->info : saved->op.rkey);

        if (saved->store || !saved->orphan) {
            ngx_http_idempotency_store_events.unknown(
                                       NGX_HTTP_IDEMPOTENCY_CAUSE_STORE_LOST);
        }

        ngx_http_idempotency_retry_free(rt);
        return;
    }

    rt->backoff = ngx_min(rt->backoff * 2, NGX_HTTP_IDEMPOTENCY_RETRY_MAX);
    ngx_add_timer(ev, ngx_min(rt->backoff, (ngx_msec_t) left));
}


static void
ngx_http_idempotency_retry_free(ngx_http_idempotency_retry_t *rt)
{
    if (rt->ev.timer_set) {
        ngx_del_timer(&rt->ev);
    }

    ngx_queue_remove(&rt->queue);
    ngx_http_idempotency_retry_bytes -= rt->len;

    ngx_free(rt->buf);
    ngx_free(rt);
}


/* the worker exits: what is still kept is said, then freed */

void
ngx_http_idempotency_retry_exit(void)
{
    ngx_uint_t                     n;
    ngx_queue_t                   *q;
    ngx_http_idempotency_retry_t  *rt;

    if (!ngx_http_idempotency_retries_init) {
        return;
    }

    n = 0;

    while (!ngx_queue_empty(&ngx_http_idempotency_retries)) {
        q = ngx_queue_head(&ngx_http_idempotency_retries);
        rt = ngx_queue_data(q, ngx_http_idempotency_retry_t, queue);
        n++;
        ngx_http_idempotency_retry_free(rt);
    }

    if (n) {
        ngx_log_error(NGX_LOG_ERR, ngx_cycle->log, 0,
                      "idempotency: the worker exits with %ui finishes not "
                      "acknowledged by redis; their keys read as "
                      "outcome-unknown once their leases end", n);
    }
}
