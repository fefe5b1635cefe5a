
/*
 * Copyright (C) The ngx_http_idempotency_module authors
 *
 * The watch of a record key.  The finish publishes on the channel named
 * after the record key itself (SPUBLISH, finish.c) when it stores or
 * releases a record, so a watched key is the channel of that name on the
 * target's subscriber (subscribe.c), wanted while it has watchers.  A
 * message wakes every watcher of the key to look at it again (a claim).  A
 * confirmation of the subscription means a completion published before it
 * was not delivered: one look sent from then on settles it for all the
 * key's watchers, so one watcher looks and the others go on sleeping.
 * Whoever watches says, through its handler, whether it can look now.
 */


#include "ngx_http_idempotency_store.h"


/* the subscriber's data of a channel: the watch of one record key */
typedef struct {
    ngx_queue_t                      watchers;
    ngx_http_idempotency_watcher_t  *checker;    /* looks for all */
    ngx_uint_t                       epoch;      /* when confirmed */
    ngx_uint_t                       woken;      /* when last woken */
} ngx_http_idempotency_watch_key_t;


static void ngx_http_idempotency_watch_message(
    ngx_http_idempotency_channel_t *ch);
static void ngx_http_idempotency_watch_confirmed(
    ngx_http_idempotency_channel_t *ch);
static void ngx_http_idempotency_watch_gone(
    ngx_http_idempotency_channel_t *ch);
static void ngx_http_idempotency_watch_refused(
    ngx_http_idempotency_subscriber_t *sub, redisReply *reply);
static void ngx_http_idempotency_watch_wake_key(
    ngx_http_idempotency_watch_key_t *key);
static void ngx_http_idempotency_watch_check_key(
    ngx_http_idempotency_watch_key_t *key);
static void ngx_http_idempotency_watch_wake(
    ngx_http_idempotency_watcher_t *w);


/*
 * Subscriptions confirmed and keys woken so far in the worker: a look sent
 * at a later epoch than its key's confirmation ran after the subscription
 * took effect, so a completion after it is published to us (handler.c
 * keeps the epoch of each claim it sends).
 */

ngx_uint_t  ngx_http_idempotency_watch_epoch;


/* NGX_OK: wake-ups may come from the target; its subscriber on demand */

ngx_int_t
ngx_http_idempotency_watch_ready(ngx_http_idempotency_target_t *redis)
{
    ngx_http_idempotency_subscriber_t  *sub;

    if (redis->exiting) {
        return NGX_DECLINED;
    }

    sub = redis->subscriber;

    if (sub == NULL) {
        if (ngx_exiting || ngx_quit || ngx_terminate) {
            return NGX_DECLINED;
        }

        sub = ngx_http_idempotency_subscriber_create(redis);
        if (sub == NULL) {
            return NGX_DECLINED;
        }

        sub->size = sizeof(ngx_http_idempotency_watch_key_t);
        sub->message = ngx_http_idempotency_watch_message;
        sub->confirmed = ngx_http_idempotency_watch_confirmed;
        sub->gone = ngx_http_idempotency_watch_gone;
        sub->refused = ngx_http_idempotency_watch_refused;
    }

    if (sub->off) {
        return NGX_DECLINED;
    }

    return NGX_OK;
}


/*
 * The watcher (its handler and data set) waits on the record key, after
 * watch_ready(); NGX_ERROR: no memory.
 */

ngx_int_t
ngx_http_idempotency_watch_add(ngx_http_idempotency_target_t *redis,
    ngx_str_t *rkey, ngx_http_idempotency_watcher_t *w)
{
    ngx_http_idempotency_channel_t    *ch;
    ngx_http_idempotency_watch_key_t  *key;

    /* the channel the finish publishes on: the record key */

    ch = ngx_http_idempotency_subscriber_channel(redis->subscriber, rkey, 0);

    if (ch == NULL) {
        ch = ngx_http_idempotency_subscriber_channel(redis->subscriber,
                                                     rkey, 1);
        if (ch == NULL) {
            return NGX_ERROR;
        }

        key = ch->data;
        ngx_queue_init(&key->watchers);
    }

    key = ch->data;

    w->channel = ch;
    ngx_queue_insert_tail(&key->watchers, &w->queue);

    ngx_http_idempotency_subscribe(ch);

    return NGX_OK;
}


/*
 * A look at the key, sent at the epoch "sent", found it in progress:
 * NGX_DECLINED: no wake-up will come, look again as without them;
 * NGX_AGAIN: look again at once, to close the race with the subscription;
 * NGX_OK: the handler is told when, a lost message aside.
 */

ngx_int_t
ngx_http_idempotency_watch_wait(ngx_http_idempotency_watcher_t *w,
    ngx_uint_t sent, ngx_log_t *log)
{
    ngx_http_idempotency_channel_t    *ch;
    ngx_http_idempotency_watch_key_t  *key;

    ch = w->channel;
    key = ch->data;

    if (ch->confirmed) {
        if (sent < key->woken) {
            /* a message (or a failed check) came after this look left */
            w->again = 1;

        } else {
            /*
             * the look ran after the subscription took effect, or before
             * it, while the check of the key (check_key) was still to come
             */
            w->checked = 1;
        }

        if (key->checker == w && sent >= key->epoch) {
            /* the check: the key is still in progress */
            key->checker = NULL;
        }
    }

    ngx_http_idempotency_subscribe_again(ch);

    ngx_log_debug4(NGX_LOG_DEBUG_HTTP, log, 0,
                   "idempotency notify watch: confirmed:%d checked:%d "
                   "again:%d up:%d", ch->confirmed, w->checked, w->again,
                   ch->subscriber->node.up);

    if (!ch->confirmed) {
        return NGX_DECLINED;
    }

    /*
     * A completion before the subscription took effect was not published
     * to us: the first look sent after the confirmation tells.  So does a
     * look sent after a message that came while another was in flight.
     */

    if (w->again || !w->checked) {
        w->again = 0;
        w->checked = 1;
        return NGX_AGAIN;
    }

    return NGX_OK;
}


/* the watcher stops waiting */

void
ngx_http_idempotency_watch_del(ngx_http_idempotency_watcher_t *w)
{
    ngx_http_idempotency_channel_t    *ch;
    ngx_http_idempotency_watch_key_t  *key;

    ch = w->channel;
    key = ch->data;

    ngx_queue_remove(&w->queue);

    if (ngx_queue_empty(&key->watchers)) {
        key->checker = NULL;
        ngx_http_idempotency_unsubscribe(ch);
        return;
    }

    if (key->checker == w) {
        /*
         * the look the others counted on found the key done, released
         * or taken (or never came): each of them looks for itself
         */

        ngx_http_idempotency_watch_wake_key(key);
    }
}


static void
ngx_http_idempotency_watch_message(ngx_http_idempotency_channel_t *ch)
{
    ngx_http_idempotency_watch_wake_key(ch->data);
}


static void
ngx_http_idempotency_watch_confirmed(ngx_http_idempotency_channel_t *ch)
{
    ngx_http_idempotency_watch_key_t  *key;

    key = ch->data;

    key->epoch = ++ngx_http_idempotency_watch_epoch;
    ngx_http_idempotency_watch_check_key(key);
}


/* worker exit: watchers still waiting get on without wake-ups */

static void
ngx_http_idempotency_watch_gone(ngx_http_idempotency_channel_t *ch)
{
    ngx_queue_t                       *q;
    ngx_http_idempotency_watcher_t    *w;
    ngx_http_idempotency_watch_key_t  *key;

    key = ch->data;

    for (q = ngx_queue_head(&key->watchers);
         q != ngx_queue_sentinel(&key->watchers);
         q = ngx_queue_next(q))
    {
        w = ngx_queue_data(q, ngx_http_idempotency_watcher_t, queue);
        w->handler(w, NGX_HTTP_IDEMPOTENCY_WATCH_GONE);
    }
}


static void
ngx_http_idempotency_watch_refused(ngx_http_idempotency_subscriber_t *sub,
    redisReply *reply)
{
    ngx_http_idempotency_target_t *redis;

    redis = sub->node.redis;

    ngx_log_error(NGX_LOG_WARN, redis->log, 0,
                  "idempotency: redis \"%V\" refused SSUBSCRIBE: %*s "
                  "(waiting duplicates poll; wake-ups need Redis 7 "
                  "and +ssubscribe +spublish)", &redis->name,
                  (size_t) ngx_min(reply->len, 128), reply->str);
}


/* every watcher of the key looks again: at once, or after its look */

static void
ngx_http_idempotency_watch_wake_key(ngx_http_idempotency_watch_key_t *key)
{
    ngx_queue_t                     *q;
    ngx_http_idempotency_watcher_t  *w;

    key->checker = NULL;
    key->woken = ++ngx_http_idempotency_watch_epoch;

    for (q = ngx_queue_head(&key->watchers);
         q != ngx_queue_sentinel(&key->watchers);
         q = ngx_queue_next(q))
    {
        w = ngx_queue_data(q, ngx_http_idempotency_watcher_t, queue);
        ngx_http_idempotency_watch_wake(w);
    }
}


/*
 * The subscription took effect: one look sent from now on tells, for
 * every watcher of the key, whether the original completed before.  One
 * watcher that can look now does; the others sleep until a message, or
 * until that look finds anything but "in progress" (watch_del wakes them
 * then).
 */

static void
ngx_http_idempotency_watch_check_key(ngx_http_idempotency_watch_key_t *key)
{
    ngx_queue_t                     *q;
    ngx_http_idempotency_watcher_t  *w;

    key->checker = NULL;

    for (q = ngx_queue_head(&key->watchers);
         q != ngx_queue_sentinel(&key->watchers);
         q = ngx_queue_next(q))
    {
        w = ngx_queue_data(q, ngx_http_idempotency_watcher_t, queue);

        if (key->checker == NULL
            && w->handler(w, NGX_HTTP_IDEMPOTENCY_WATCH_CHECK) == NGX_OK)
        {
            key->checker = w;
            w->checked = 1;
            w->again = 0;
            continue;
        }

        w->checked = 1;

        (void) w->handler(w, NGX_HTTP_IDEMPOTENCY_WATCH_CALM);
    }

    if (key->checker == NULL && !ngx_queue_empty(&key->watchers)) {
        /* every look is in flight, sent before: the first one goes again */

        w = ngx_queue_data(ngx_queue_head(&key->watchers),
                           ngx_http_idempotency_watcher_t, queue);
        w->again = 1;
        key->checker = w;
    }
}


static void
ngx_http_idempotency_watch_wake(ngx_http_idempotency_watcher_t *w)
{
    if (w->handler(w, NGX_HTTP_IDEMPOTENCY_WATCH_WAKE) != NGX_OK) {
        /* its look is in flight: once more if that finds the key claimed */
        w->again = 1;
        return;
    }

    w->checked = 1;
    w->again = 0;
}
