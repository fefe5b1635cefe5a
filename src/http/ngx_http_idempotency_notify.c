
/*
 * Copyright (C) The ngx_http_idempotency_module authors
 *
 * Wake-ups of waiting duplicates.  A duplicate that finds the key claimed
 * watches the record key (watch.c), which the finish publishes on when it
 * stores or releases a record; a wake-up makes it claim again at once, as
 * its poll timer would.  Polling stays as the safety net: slow while
 * subscribed, as before while not.
 */


#include "ngx_http_idempotency_http.h"


/* while subscribed, only lost messages and expired locks are polled for */
#define NGX_HTTP_IDEMPOTENCY_NOTIFY_POLL         1000


static ngx_int_t ngx_http_idempotency_notify_handler(
    ngx_http_idempotency_watcher_t *w, ngx_uint_t event);


/*
 * A duplicate found the key claimed: NGX_OK and the delay before it claims
 * again (0: at once, to close the race with the subscription), or
 * NGX_DECLINED: no wake-up will come, poll as without notifications.
 */

ngx_int_t
ngx_http_idempotency_notify_watch(ngx_http_idempotency_ctx_t *ctx,
    ngx_msec_t *delay)
{
    ngx_int_t                        rc;
    ngx_http_idempotency_watcher_t  *w;

    if (ngx_http_idempotency_watch_ready(ctx->redis) != NGX_OK) {
        return NGX_DECLINED;
    }

    w = ctx->notify;

    if (w == NULL) {
        w = ngx_pcalloc(ctx->request->pool,
                        sizeof(ngx_http_idempotency_watcher_t));
        if (w == NULL) {
            return NGX_DECLINED;
        }

        w->handler = ngx_http_idempotency_notify_handler;
        w->data = ctx;

        if (ngx_http_idempotency_watch_add(ctx->redis, &ctx->rkey, w)
            != NGX_OK)
        {
            return NGX_DECLINED;
        }

        ctx->notify = w;
    }

    rc = ngx_http_idempotency_watch_wait(w, ctx->claim->epoch,
                                         ctx->request->connection->log);

    switch (rc) {

    case NGX_AGAIN:
        *delay = 0;
        return NGX_OK;

    case NGX_OK:
        *delay = NGX_HTTP_IDEMPOTENCY_NOTIFY_POLL;
        return NGX_OK;

    default:
        return NGX_DECLINED;
    }
}


/* the request stops waiting: decided, finalized, aborted, timed out */

void
ngx_http_idempotency_notify_unwatch(ngx_http_idempotency_ctx_t *ctx)
{
    ngx_http_idempotency_watcher_t  *w;

    w = ctx->notify;

    if (w == NULL) {
        return;
    }

    ctx->notify = NULL;

    /* a wake-up posted for a request that is going away */

    if (ctx->poll.posted) {
        ngx_delete_posted_event(&ctx->poll);
    }

    ngx_http_idempotency_watch_del(w);
}


/* what the watch of the key asks of the request (watch.c) */

static ngx_int_t
ngx_http_idempotency_notify_handler(ngx_http_idempotency_watcher_t *w,
    ngx_uint_t event)
{
    ngx_msec_int_t               left;
    ngx_http_idempotency_ctx_t  *ctx;

    ctx = w->data;

    switch (event) {

    case NGX_HTTP_IDEMPOTENCY_WATCH_GONE:
        /* worker exit: the request polls from now on */
        ctx->notify = NULL;
        return NGX_OK;

    case NGX_HTTP_IDEMPOTENCY_WATCH_CALM:

        if (ctx->state != NGX_HTTP_IDEMPOTENCY_ST_POLLING
            || !ctx->poll.timer_set)
        {
            return NGX_OK;
        }

        /* from polling to the safety poll, within idempotency_wait */

        left = (ngx_msec_int_t) (ctx->wait_until - ngx_current_msec);

        if (left > 0) {
            ngx_add_timer(&ctx->poll,
                          ngx_min((ngx_msec_t) left,
                                  NGX_HTTP_IDEMPOTENCY_NOTIFY_POLL));
        }

        return NGX_OK;

    case NGX_HTTP_IDEMPOTENCY_WATCH_CHECK:

        if (ctx->state != NGX_HTTP_IDEMPOTENCY_ST_POLLING) {
            return NGX_BUSY;
        }

        break;

    default: /* NGX_HTTP_IDEMPOTENCY_WATCH_WAKE */
        break;
    }

    ngx_log_debug2(NGX_LOG_DEBUG_HTTP, ctx->request->connection->log, 0,
                   "idempotency notify wake: state:%ui confirmed:%d",
                   ctx->state, w->channel->confirmed);

    if (ctx->state != NGX_HTTP_IDEMPOTENCY_ST_POLLING) {
        return NGX_BUSY;
    }

    /* the poll timer's handler, run now: the list is not touched */

    if (ctx->poll.timer_set) {
        ngx_del_timer(&ctx->poll);
    }

    if (!ctx->poll.posted) {
        ngx_post_event(&ctx->poll, &ngx_posted_events);
    }

    return NGX_OK;
}
