
/*
 * Copyright (C) The ngx_http_idempotency_module authors
 *
 * A claim that finds its key in progress waits for it, within
 * idempotency_wait, and claims again: woken by the finish that stores or
 * releases the record (watch.c: the finish publishes on the record key),
 * or by its own poll timer, the safety net: slow while subscribed, from
 * 10 ms doubling to 200 ms while not.  The request sees none of it: it is
 * told the claim's answer once the wait is over.
 */


#include "ngx_http_idempotency_store.h"


#define NGX_HTTP_IDEMPOTENCY_POLL_MIN            10
#define NGX_HTTP_IDEMPOTENCY_POLL_MAX            200

/* while subscribed, only lost messages and expired locks are polled for */
#define NGX_HTTP_IDEMPOTENCY_NOTIFY_POLL         1000


static ngx_int_t ngx_http_idempotency_claim_watch(
    ngx_http_idempotency_claim_t *c, ngx_msec_t *delay);
static ngx_int_t ngx_http_idempotency_claim_woken(
    ngx_http_idempotency_watcher_t *w, ngx_uint_t event);
static void ngx_http_idempotency_claim_poll(ngx_event_t *ev);


/*
 * The key is in progress: NGX_OK, the claim waits and claims again;
 * NGX_DECLINED, no wait time is left (or none is set), and CONFLICT is
 * the answer.
 */

ngx_int_t
ngx_http_idempotency_claim_wait(ngx_http_idempotency_claim_t *c)
{
    ngx_msec_t      delay;
    ngx_msec_int_t  left;

    if (c->conf->wait == 0) {
        return NGX_DECLINED;
    }

    if (c->wait_until == 0) {
        c->wait_until = ngx_current_msec + c->conf->wait;
        c->poll_delay = NGX_HTTP_IDEMPOTENCY_POLL_MIN;

        c->poll.handler = ngx_http_idempotency_claim_poll;
        c->poll.data = c;
        c->poll.log = c->log;
    }

    left = (ngx_msec_int_t) (c->wait_until - ngx_current_msec);

    if (left <= 0) {
        return NGX_DECLINED;
    }

    /* woken by the original's completion, or polling */

    if (ngx_http_idempotency_claim_watch(c, &delay) != NGX_OK) {
        delay = c->poll_delay;
        c->poll_delay = ngx_min(c->poll_delay * 2,
                                NGX_HTTP_IDEMPOTENCY_POLL_MAX);
    }

    /* the round trip is over: its timer must not fire while the key waits */

    if (c->timer.timer_set) {
        ngx_del_timer(&c->timer);
    }

    c->polling = 1;
    ngx_add_timer(&c->poll, ngx_min(delay, (ngx_msec_t) left));

    return NGX_OK;
}


/*
 * NGX_OK and the delay before the claim goes again (0: at once, to close
 * the race with the subscription), or NGX_DECLINED: no wake-up will come,
 * poll as without notifications.
 */

static ngx_int_t
ngx_http_idempotency_claim_watch(ngx_http_idempotency_claim_t *c,
    ngx_msec_t *delay)
{
    ngx_int_t                        rc;
    ngx_http_idempotency_watcher_t  *w;

    if (ngx_http_idempotency_watch_ready(c->conf->redis) != NGX_OK) {
        return NGX_DECLINED;
    }

    w = c->watcher;

    if (w == NULL) {
        w = ngx_pcalloc(c->pool, sizeof(ngx_http_idempotency_watcher_t));
        if (w == NULL) {
            return NGX_DECLINED;
        }

        w->handler = ngx_http_idempotency_claim_woken;
        w->data = c;

        if (ngx_http_idempotency_watch_add(c->conf->redis, &c->rkey, w)
            != NGX_OK)
        {
            return NGX_DECLINED;
        }

        c->watcher = w;
    }

    rc = ngx_http_idempotency_watch_wait(w, c->epoch, c->log);

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


/* the claim waits no more: answered, or its request went away */

void
ngx_http_idempotency_claim_unwatch(ngx_http_idempotency_claim_t *c)
{
    ngx_http_idempotency_watcher_t  *w;

    c->polling = 0;

    if (c->poll.timer_set) {
        ngx_del_timer(&c->poll);
    }

    /* a wake-up posted for a claim that is going away */

    if (c->poll.posted) {
        ngx_delete_posted_event(&c->poll);
    }

    w = c->watcher;

    if (w == NULL) {
        return;
    }

    c->watcher = NULL;

    ngx_http_idempotency_watch_del(w);
}


static void
ngx_http_idempotency_claim_poll(ngx_event_t *ev)
{
    ngx_http_idempotency_claim_t *c = ev->data;

    c->polling = 0;

    if (ngx_http_idempotency_claim_start(c) != NGX_AGAIN) {
        ngx_http_idempotency_claim_answered(c,
                                            NGX_HTTP_IDEMPOTENCY_ANSWER_ERROR);
    }
}


/* what the watch of the key asks of the claim (watch.c) */

static ngx_int_t
ngx_http_idempotency_claim_woken(ngx_http_idempotency_watcher_t *w,
    ngx_uint_t event)
{
    ngx_msec_int_t                 left;
    ngx_http_idempotency_claim_t  *c;

    c = w->data;

    switch (event) {

    case NGX_HTTP_IDEMPOTENCY_WATCH_GONE:
        /* worker exit: the claim polls from now on */
        c->watcher = NULL;
        return NGX_OK;

    case NGX_HTTP_IDEMPOTENCY_WATCH_CALM:

        if (!c->polling || !c->poll.timer_set) {
            return NGX_OK;
        }

        /* from polling to the safety poll, within idempotency_wait */

        left = (ngx_msec_int_t) (c->wait_until - ngx_current_msec);

        if (left > 0) {
            ngx_add_timer(&c->poll,
                          ngx_min((ngx_msec_t) left,
                                  NGX_HTTP_IDEMPOTENCY_NOTIFY_POLL));
        }

        return NGX_OK;

    case NGX_HTTP_IDEMPOTENCY_WATCH_CHECK:

        if (!c->polling) {
            return NGX_BUSY;
        }

        break;

    default: /* NGX_HTTP_IDEMPOTENCY_WATCH_WAKE */
        break;
    }

    ngx_log_debug2(NGX_LOG_DEBUG_HTTP, c->log, 0,
                   "idempotency notify wake: polling:%d confirmed:%d",
                   c->polling, w->channel->confirmed);

    if (!c->polling) {
        return NGX_BUSY;
    }

    /* the poll timer's handler, run now: the list is not touched */

    if (c->poll.timer_set) {
        ngx_del_timer(&c->poll);
    }

    if (!c->poll.posted) {
        ngx_post_event(&c->poll, &ngx_posted_events);
    }

    return NGX_OK;
}
