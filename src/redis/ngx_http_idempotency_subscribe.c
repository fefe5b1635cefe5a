
/*
 * Copyright (C) The ngx_http_idempotency_module authors
 *
 * Wake-ups of waiting duplicates.  The finish script publishes on the
 * channel named after the record key (SPUBLISH) when it stores or releases
 * a record; each worker keeps, per standalone or Sentinel target, one
 * subscriber connection (a node of redis.c in subscribed mode) and one
 * SSUBSCRIBE per key that has waiters in the worker.  On a cluster the
 * message goes out on the shard of the key's slot: a worker keeps one
 * subscriber per master that owns a waited key's slot (made on demand),
 * and subscribes each key, one per command, where the slot map says; a
 * MOVED, or the sunsubscribe Redis pushes when the slot leaves, sends it
 * where the slot went.  A message, or the confirmation of a
 * subscription, makes every waiter of the key claim again at once.  Polling
 * stays as the safety net: slow while subscribed, as before while not.
 */


#include "ngx_http_idempotency_http.h"


/* while subscribed, only lost messages and expired locks are polled for */
#define NGX_HTTP_IDEMPOTENCY_NOTIFY_POLL         1000
#define NGX_HTTP_IDEMPOTENCY_NOTIFY_BACKOFF_MIN  10


typedef struct ngx_http_idempotency_notify_waiter_s
    ngx_http_idempotency_notify_waiter_t;


typedef struct {
    ngx_str_node_t                   sn;         /* the channel: the rkey */
    ngx_queue_t                      waiters;
    ngx_queue_t                      dirty;      /* in notify->dirty */
    ngx_uint_t                       pending;    /* confirmations to come */
    ngx_uint_t                       epoch;      /* when confirmed */
    ngx_uint_t                       woken;      /* when last woken */
    ngx_http_idempotency_notify_waiter_t  *checker;  /* claims for all */
    ngx_http_idempotency_node_t     *node;       /* a cluster's subscriber */
    ngx_uint_t                       slot;       /* a cluster's */
    unsigned                         in_dirty:1;
    unsigned                         subscribed:1;   /* sent, not undone */
    unsigned                         confirmed:1;
} ngx_http_idempotency_notify_key_t;


struct ngx_http_idempotency_notify_waiter_s {
    ngx_queue_t                      queue;      /* in key->waiters */
    ngx_http_idempotency_ctx_t      *ctx;
    ngx_http_idempotency_notify_key_t  *key;
    unsigned                         checked:1;  /* claimed once subscribed */
    unsigned                         again:1;    /* woken during a claim */
};


typedef struct ngx_http_idempotency_notify_sub_s
    ngx_http_idempotency_notify_sub_t;


/* a cluster's subscriber: one per master, per worker */
struct ngx_http_idempotency_notify_sub_s {
    ngx_http_idempotency_node_t      node;       /* first: a node_t * */
    ngx_http_idempotency_notify_sub_t  *next;
};


typedef struct {
    ngx_http_idempotency_node_t      node;
    ngx_rbtree_t                     tree;
    ngx_rbtree_node_t                sentinel;
    ngx_queue_t                      dirty;
    ngx_event_t                      batch_ev;
    ngx_http_idempotency_notify_sub_t  *subs;    /* a cluster's */
    unsigned                         off:1;      /* refused: poll only */
} ngx_http_idempotency_notify_t;


static ngx_http_idempotency_notify_t *ngx_http_idempotency_notify_create(
    ngx_http_idempotency_redis_t *redis);
static void ngx_http_idempotency_notify_subscriber(
    ngx_http_idempotency_node_t *node);
static void ngx_http_idempotency_notify_reconnect(ngx_event_t *ev);
static ngx_int_t ngx_http_idempotency_notify_addr(
    ngx_http_idempotency_node_t *node, ngx_addr_t *m);
static ngx_uint_t ngx_http_idempotency_notify_moved(
    ngx_http_idempotency_node_t *node);
static ngx_http_idempotency_notify_key_t *ngx_http_idempotency_notify_key(
    ngx_http_idempotency_notify_t *n, ngx_str_t *rkey, ngx_uint_t create);
static void ngx_http_idempotency_notify_dirty(ngx_http_idempotency_notify_t *n,
    ngx_http_idempotency_notify_key_t *key);
static void ngx_http_idempotency_notify_free_key(
    ngx_http_idempotency_notify_t *n, ngx_http_idempotency_notify_key_t *key);
static void ngx_http_idempotency_notify_batch(ngx_event_t *ev);
static void ngx_http_idempotency_notify_cluster_batch(
    ngx_http_idempotency_notify_t *n);
static void ngx_http_idempotency_notify_drop(
    ngx_http_idempotency_node_t *node);
static ngx_http_idempotency_node_t *ngx_http_idempotency_notify_sub(
    ngx_http_idempotency_notify_t *n, ngx_uint_t slot);
static ngx_uint_t ngx_http_idempotency_notify_send_key(
    ngx_http_idempotency_node_t *node, const char *cmd,
    ngx_http_idempotency_notify_key_t *key);
static ngx_uint_t ngx_http_idempotency_notify_cluster_error(
    ngx_http_idempotency_notify_t *n, ngx_http_idempotency_node_t *node,
    redisReply *reply);
static void ngx_http_idempotency_notify_reset(
    ngx_http_idempotency_notify_t *n, ngx_http_idempotency_node_t *node,
    ngx_int_t slot);
static ngx_uint_t ngx_http_idempotency_notify_send(
    ngx_http_idempotency_notify_t *n, const char *cmd, ngx_uint_t subscribe);
static void ngx_http_idempotency_notify_wake_key(
    ngx_http_idempotency_notify_key_t *key);
static void ngx_http_idempotency_notify_check_key(
    ngx_http_idempotency_notify_key_t *key);
static void ngx_http_idempotency_notify_wake(
    ngx_http_idempotency_notify_waiter_t *w);
static ngx_uint_t ngx_http_idempotency_notify_is(redisReply *r,
    const char *s);
static ngx_uint_t ngx_http_idempotency_notify_is_prefix(u_char *p,
    u_char *last, const char *s);


/*
 * Subscriptions confirmed so far in the worker: a claim sent at a later
 * epoch than its key's confirmation ran after the subscription took
 * effect, so a completion after it is published to us (handler.c keeps
 * the epoch of each claim it sends).
 */

ngx_uint_t  ngx_http_idempotency_notify_epoch;


/*
 * A duplicate found the key claimed: NGX_OK and the delay before it claims
 * again (0: at once, to close the race with the subscription), or
 * NGX_DECLINED: no wake-up will come, poll as without notifications.
 */

ngx_int_t
ngx_http_idempotency_notify_watch(ngx_http_idempotency_ctx_t *ctx,
    ngx_msec_t *delay)
{
    ngx_http_idempotency_redis_t          *redis;
    ngx_http_idempotency_notify_t         *n;
    ngx_http_idempotency_notify_key_t     *key;
    ngx_http_idempotency_notify_waiter_t  *w;

    redis = ctx->redis;

    if (redis->exiting) {
        return NGX_DECLINED;
    }

    n = redis->notify;

    if (n == NULL) {
        if (ngx_exiting || ngx_quit || ngx_terminate) {
            return NGX_DECLINED;
        }

        n = ngx_http_idempotency_notify_create(redis);
        if (n == NULL) {
            return NGX_DECLINED;
        }
    }

    if (n->off) {
        return NGX_DECLINED;
    }

    w = ctx->notify;

    if (w == NULL) {
        key = ngx_http_idempotency_notify_key(n, &ctx->rkey, 1);
        if (key == NULL) {
            return NGX_DECLINED;
        }

        w = ngx_pcalloc(ctx->request->pool,
                        sizeof(ngx_http_idempotency_notify_waiter_t));
        if (w == NULL) {
            if (ngx_queue_empty(&key->waiters)) {
                ngx_http_idempotency_notify_dirty(n, key);
            }

            return NGX_DECLINED;
        }

        w->ctx = ctx;
        w->key = key;
        ngx_queue_insert_tail(&key->waiters, &w->queue);
        ctx->notify = w;

        if (!key->subscribed) {
            ngx_http_idempotency_notify_dirty(n, key);
        }
    }

    key = w->key;

    if (key->confirmed) {
        if (ctx->notify_epoch < key->woken) {
            /* a message (or a failed check) came after this claim left */
            w->again = 1;

        } else {
            /*
             * the claim ran after the subscription took effect, or before
             * it, while the check of the key (check_key) was still to come
             */
            w->checked = 1;
        }

        if (key->checker == w && ctx->notify_epoch >= key->epoch) {
            /* the check: the key is still in progress */
            key->checker = NULL;
        }
    }

    if (redis->topology->nodes) {
        /* not subscribed (no map, no subscriber yet, moved): try again */

        if (!key->subscribed) {
            ngx_http_idempotency_notify_dirty(n, key);
        }

    } else {
        if (n->node.open && redis->topology->moves
            && ngx_http_idempotency_notify_moved(&n->node))
        {
            /* subscribed to a master the Sentinels replaced: the new one */
            ngx_http_idempotency_conn_close(&n->node);
        }

        if (!n->node.open && !n->node.reconnect_ev.timer_set) {
            ngx_http_idempotency_notify_reconnect(&n->node.reconnect_ev);
        }
    }

    ngx_log_debug4(NGX_LOG_DEBUG_HTTP, ctx->request->connection->log, 0,
                   "idempotency notify watch: confirmed:%d checked:%d "
                   "again:%d up:%d", key->confirmed, w->checked, w->again,
                   n->node.up);

    if (!key->confirmed) {
        return NGX_DECLINED;
    }

    /*
     * A completion before the subscription took effect was not published
     * to us: the first claim sent after the confirmation tells.  So does a
     * claim sent after a message that came while another was in flight.
     */

    if (w->again || !w->checked) {
        w->again = 0;
        w->checked = 1;
        *delay = 0;
        return NGX_OK;
    }

    *delay = NGX_HTTP_IDEMPOTENCY_NOTIFY_POLL;

    return NGX_OK;
}


/* the request stops waiting: decided, finalized, aborted, timed out */

void
ngx_http_idempotency_notify_unwatch(ngx_http_idempotency_ctx_t *ctx)
{
    ngx_http_idempotency_notify_key_t     *key;
    ngx_http_idempotency_notify_waiter_t  *w;

    w = ctx->notify;

    if (w == NULL) {
        return;
    }

    ctx->notify = NULL;

    /* a wake-up posted for a request that is going away */

    if (ctx->timeout.posted) {
        ngx_delete_posted_event(&ctx->timeout);
    }

    key = w->key;
    ngx_queue_remove(&w->queue);

    if (ngx_queue_empty(&key->waiters)) {
        key->checker = NULL;
        ngx_http_idempotency_notify_dirty(ctx->redis->notify, key);
        return;
    }

    if (key->checker == w) {
        /*
         * the claim the others counted on found the key done, released
         * or taken (or never came): each of them claims for itself
         */

        ngx_http_idempotency_notify_wake_key(key);
    }
}


static ngx_http_idempotency_notify_t *
ngx_http_idempotency_notify_create(ngx_http_idempotency_redis_t *redis)
{
    ngx_http_idempotency_notify_t  *n;

    n = ngx_calloc(sizeof(ngx_http_idempotency_notify_t), redis->log);
    if (n == NULL) {
        return NULL;
    }

    ngx_http_idempotency_node_init(&n->node, redis, redis->log);
    ngx_http_idempotency_notify_subscriber(&n->node);

    ngx_rbtree_init(&n->tree, &n->sentinel, ngx_str_rbtree_insert_value);
    ngx_queue_init(&n->dirty);

    n->batch_ev.handler = ngx_http_idempotency_notify_batch;
    n->batch_ev.data = n;
    n->batch_ev.log = redis->log;

    redis->notify = n;
    redis->exit_handler = ngx_http_idempotency_notify_exit;

    return n;
}


/* a node of its own: the client hands it what no command asked for */

static void
ngx_http_idempotency_notify_subscriber(ngx_http_idempotency_node_t *node)
{
    node->notify = 1;
    node->reconnect_ev.handler = ngx_http_idempotency_notify_reconnect;
    node->push = ngx_http_idempotency_notify_reply;
    node->up_handler = ngx_http_idempotency_notify_up;
    node->closed_handler = ngx_http_idempotency_notify_closed;
}


/*
 * With Sentinels, the subscriber goes to the master the Sentinels named
 * last, as redis.c's node does; a demoted master does not deliver what its
 * new master publishes, so a waiter that finds the master switched closes
 * the subscriber (notify_moved) and it comes here again.
 */

static void
ngx_http_idempotency_notify_reconnect(ngx_event_t *ev)
{
    ngx_http_idempotency_node_t *node = ev->data;

    ngx_addr_t                     *m;
    ngx_http_idempotency_redis_t   *redis;
    ngx_http_idempotency_notify_t  *n;

    redis = node->redis;

    if (redis->exiting || ngx_exiting || ngx_quit || ngx_terminate
        || node->open)
    {
        return;
    }

    if (redis->topology->nodes) {
        /* a cluster's subscriber: if a key still wants it, per the map */
        n = redis->notify;

        if (!ngx_queue_empty(&n->dirty) && !n->batch_ev.posted) {
            ngx_post_event(&n->batch_ev, &ngx_posted_events);
        }

        return;
    }

    if (redis->topology->moves) {
        if (redis->node == NULL || redis->node->naddrs == 0) {
            /* no master named yet: the next waiter tries again */
            return;
        }

        m = &redis->node->addrs[redis->node->addr % redis->node->naddrs];

        if (ngx_http_idempotency_notify_addr(node, m) != NGX_OK) {
            return;
        }
    }

    ngx_http_idempotency_redis_connect(node);
}


/* the subscriber's own copy of an address: conn_free frees it */

static ngx_int_t
ngx_http_idempotency_notify_addr(ngx_http_idempotency_node_t *node,
    ngx_addr_t *m)
{
    ngx_addr_t  *a;

    a = ngx_alloc(sizeof(ngx_addr_t) + m->socklen + m->name.len,
                  node->redis->log);
    if (a == NULL) {
        return NGX_ERROR;
    }

    a->sockaddr = (struct sockaddr *) &a[1];
    a->socklen = m->socklen;
    ngx_memcpy(a->sockaddr, m->sockaddr, m->socklen);
    a->name.data = (u_char *) a->sockaddr + m->socklen;
    a->name.len = m->name.len;
    ngx_memcpy(a->name.data, m->name.data, m->name.len);

    ngx_free(node->addrs);
    node->addrs = a;
    node->naddrs = 1;
    node->addr = 0;

    return NGX_OK;
}


static ngx_uint_t
ngx_http_idempotency_notify_moved(ngx_http_idempotency_node_t *node)
{
    ngx_addr_t                   *m;
    ngx_http_idempotency_node_t  *master;

    master = node->redis->node;

    if (master == NULL || master->naddrs == 0 || node->naddrs == 0) {
        return 0;
    }

    m = &master->addrs[master->addr % master->naddrs];

    return ngx_cmp_sockaddr(m->sockaddr, m->socklen, node->addrs->sockaddr,
                            node->addrs->socklen, 1)
           != NGX_OK;
}


static ngx_http_idempotency_notify_key_t *
ngx_http_idempotency_notify_key(ngx_http_idempotency_notify_t *n,
    ngx_str_t *rkey, ngx_uint_t create)
{
    uint32_t                            hash;
    ngx_http_idempotency_notify_key_t  *key;

    hash = ngx_crc32_short(rkey->data, rkey->len);

    key = (ngx_http_idempotency_notify_key_t *)
              ngx_str_rbtree_lookup(&n->tree, rkey, hash);

    if (key || !create) {
        return key;
    }

    key = ngx_calloc(sizeof(ngx_http_idempotency_notify_key_t) + rkey->len,
                     n->node.redis->log);
    if (key == NULL) {
        return NULL;
    }

    key->sn.str.data = (u_char *) &key[1];
    key->sn.str.len = rkey->len;
    ngx_memcpy(key->sn.str.data, rkey->data, rkey->len);
    key->sn.node.key = hash;

    if (n->node.redis->topology->nodes) {
        key->slot = ngx_http_idempotency_cluster_slot(key->sn.str.data,
                                                      key->sn.str.len);
    }

    ngx_queue_init(&key->waiters);
    ngx_rbtree_insert(&n->tree, &key->sn.node);

    return key;
}


/* (un)subscriptions are batched: one command each per event loop turn */

static void
ngx_http_idempotency_notify_dirty(ngx_http_idempotency_notify_t *n,
    ngx_http_idempotency_notify_key_t *key)
{
    if (!key->in_dirty) {
        key->in_dirty = 1;
        ngx_queue_insert_tail(&n->dirty, &key->dirty);
    }

    if (!n->batch_ev.posted) {
        ngx_post_event(&n->batch_ev, &ngx_posted_events);
    }
}


static void
ngx_http_idempotency_notify_free_key(ngx_http_idempotency_notify_t *n,
    ngx_http_idempotency_notify_key_t *key)
{
    if (key->in_dirty) {
        ngx_queue_remove(&key->dirty);
    }

    ngx_rbtree_delete(&n->tree, &key->sn.node);
    ngx_free(key);
}


static void
ngx_http_idempotency_notify_batch(ngx_event_t *ev)
{
    ngx_http_idempotency_notify_t *n = ev->data;

    ngx_queue_t                        *q, *next;
    ngx_http_idempotency_node_t        *node;
    ngx_http_idempotency_notify_key_t  *key;

    if (n->node.redis->topology->nodes) {
        ngx_http_idempotency_notify_cluster_batch(n);
        return;
    }

    node = &n->node;

    if (node->up) {
        if (!ngx_http_idempotency_notify_send(n, "SSUBSCRIBE", 1)
            || !ngx_http_idempotency_notify_send(n, "SUNSUBSCRIBE", 0))
        {
            /* no memory: the connection and its subscriptions start over */
            ngx_http_idempotency_conn_close(node);
            return;
        }
    }

    /* keys nobody waits for and no confirmation will name */

    for (q = ngx_queue_head(&n->dirty);
         q != ngx_queue_sentinel(&n->dirty);
         q = next)
    {
        next = ngx_queue_next(q);
        key = ngx_queue_data(q, ngx_http_idempotency_notify_key_t, dirty);

        if (ngx_queue_empty(&key->waiters) && !key->subscribed
            && key->pending == 0)
        {
            ngx_http_idempotency_notify_free_key(n, key);
            continue;
        }

        if (node->up) {
            ngx_queue_remove(q);
            key->in_dirty = 0;
        }
    }
}


/*
 * One SSUBSCRIBE with every dirty key that has waiters and no subscription,
 * or one SUNSUBSCRIBE with every subscribed key that has none.  0: no memory.
 */

static ngx_uint_t
ngx_http_idempotency_notify_send(ngx_http_idempotency_notify_t *n,
    const char *cmd, ngx_uint_t subscribe)
{
    u_char                             *p;
    size_t                              len;
    ngx_uint_t                          nkeys, pass;
    ngx_queue_t                        *q;
    ngx_http_idempotency_node_t        *node;
    ngx_http_idempotency_notify_key_t  *key;

    node = &n->node;
    nkeys = 0;
    len = sizeof("*\r\n$\r\n\r\n") - 1 + 2 * NGX_SIZE_T_LEN + ngx_strlen(cmd);
    p = NULL;

    /* the keys are counted, then written */

    for (pass = 0; pass < 2; pass++) {

        for (q = ngx_queue_head(&n->dirty);
             q != ngx_queue_sentinel(&n->dirty);
             q = ngx_queue_next(q))
        {
            key = ngx_queue_data(q, ngx_http_idempotency_notify_key_t, dirty);

            if ((ngx_uint_t) !ngx_queue_empty(&key->waiters) != subscribe
                || key->subscribed == subscribe)
            {
                continue;
            }

            if (pass == 0) {
                nkeys++;
                len += sizeof("$\r\n\r\n") - 1 + NGX_SIZE_T_LEN
                       + key->sn.str.len;
                continue;
            }

            p = ngx_sprintf(p, "$%uz\r\n%V\r\n", key->sn.str.len,
                            &key->sn.str);
            key->subscribed = subscribe;
            key->confirmed = 0;
            key->pending++;
        }

        if (pass == 1) {
            break;
        }

        if (nkeys == 0) {
            return 1;
        }

        p = ngx_http_idempotency_conn_reserve(node, len);
        if (p == NULL) {
            return 0;
        }

        p = ngx_sprintf(p, "*%ui\r\n$%uz\r\n%s\r\n", nkeys + 1,
                        ngx_strlen(cmd), cmd);
    }

    node->out_last = p;

    if (node->ready && !node->flush_ev.posted) {
        ngx_post_event(&node->flush_ev, &ngx_posted_events);
    }

    return 1;
}


/*
 * A cluster: each key on the subscriber of its slot's master, one per
 * command (the channels of one SSUBSCRIBE must share a slot).  A key that
 * cannot go now (no map yet, its subscriber connecting) stays dirty: the
 * subscriber's handshake, its reconnect timer and the key's waiters, which
 * poll meanwhile, run the batch again.
 */

static void
ngx_http_idempotency_notify_cluster_batch(ngx_http_idempotency_notify_t *n)
{
    ngx_queue_t                        *q, *next;
    ngx_http_idempotency_node_t        *sub;
    ngx_http_idempotency_notify_key_t  *key;

    for (q = ngx_queue_head(&n->dirty);
         q != ngx_queue_sentinel(&n->dirty);
         q = next)
    {
        next = ngx_queue_next(q);
        key = ngx_queue_data(q, ngx_http_idempotency_notify_key_t, dirty);

        if (!ngx_queue_empty(&key->waiters) && !key->subscribed) {
            sub = ngx_http_idempotency_notify_sub(n, key->slot);

            if (sub == NULL || !sub->up) {
                continue;
            }

            if (sub != key->node) {
                /* what the former subscriber confirms no longer counts */
                key->node = sub;
                key->pending = 0;
            }

            if (!ngx_http_idempotency_notify_send_key(sub, "SSUBSCRIBE",
                                                      key))
            {
                ngx_http_idempotency_notify_drop(sub);
                continue;
            }

            key->subscribed = 1;

        } else if (ngx_queue_empty(&key->waiters) && key->subscribed) {
            key->subscribed = 0;
            key->confirmed = 0;

            if (key->node->up
                && !ngx_http_idempotency_notify_send_key(key->node,
                                                         "SUNSUBSCRIBE", key))
            {
                ngx_http_idempotency_notify_drop(key->node);
                continue;
            }
        }

        ngx_queue_remove(q);
        key->in_dirty = 0;

        if (ngx_queue_empty(&key->waiters) && !key->subscribed
            && key->pending == 0)
        {
            ngx_http_idempotency_notify_free_key(n, key);
        }
    }
}


/*
 * No memory: the connection and its subscriptions start over, after the
 * loop over the keys that closing it would change
 */

static void
ngx_http_idempotency_notify_drop(ngx_http_idempotency_node_t *node)
{
    if (node->open && !node->reset_ev.posted) {
        ngx_post_event(&node->reset_ev, &ngx_posted_events);
    }
}


/*
 * The subscriber of a slot's master per the map, made and connected on
 * demand; NULL: the map does not know the slot yet, or no memory.
 */

static ngx_http_idempotency_node_t *
ngx_http_idempotency_notify_sub(ngx_http_idempotency_notify_t *n,
    ngx_uint_t slot)
{
    ngx_addr_t                         *m;
    ngx_http_idempotency_node_t        *sub, *master;
    ngx_http_idempotency_redis_t       *redis;
    ngx_http_idempotency_notify_sub_t  *s;

    redis = n->node.redis;

    master = ngx_http_idempotency_cluster_master(redis, slot);
    if (master == NULL || master->naddrs == 0) {
        return NULL;
    }

    m = &master->addrs[master->addr % master->naddrs];

    for (s = n->subs; s; s = s->next) {
        sub = &s->node;

        if (ngx_cmp_sockaddr(sub->addrs->sockaddr, sub->addrs->socklen,
                             m->sockaddr, m->socklen, 1)
            == NGX_OK)
        {
            goto found;
        }
    }

    s = ngx_calloc(sizeof(ngx_http_idempotency_notify_sub_t), redis->log);
    if (s == NULL) {
        return NULL;
    }

    sub = &s->node;

    ngx_http_idempotency_node_init(sub, redis, redis->log);
    ngx_http_idempotency_notify_subscriber(sub);

    if (ngx_http_idempotency_notify_addr(sub, m) != NGX_OK) {
        ngx_free(s);
        return NULL;
    }

    if (master->host.len) {
        /* a master known by name: TLS checks that name, as for its data */

        sub->host.data = ngx_alloc(master->host.len, redis->log);
        if (sub->host.data == NULL) {
            ngx_http_idempotency_conn_free(sub);
            ngx_free(s);
            return NULL;
        }

        ngx_memcpy(sub->host.data, master->host.data, master->host.len);
        sub->host.len = master->host.len;
        sub->port = master->port;
    }

    s->next = n->subs;
    n->subs = s;

found:

    if (!sub->open && !sub->reconnect_ev.timer_set
        && !ngx_exiting && !ngx_quit && !ngx_terminate)
    {
        ngx_http_idempotency_redis_connect(sub);
    }

    return sub;
}


/* one channel per command; 0: no memory */

static ngx_uint_t
ngx_http_idempotency_notify_send_key(ngx_http_idempotency_node_t *node,
    const char *cmd, ngx_http_idempotency_notify_key_t *key)
{
    u_char  *p;
    size_t   len;

    len = sizeof("*2\r\n$\r\n\r\n$\r\n\r\n") - 1 + 2 * NGX_SIZE_T_LEN
          + ngx_strlen(cmd) + key->sn.str.len;

    p = ngx_http_idempotency_conn_reserve(node, len);
    if (p == NULL) {
        return 0;
    }

    node->out_last = ngx_sprintf(p, "*2\r\n$%uz\r\n%s\r\n$%uz\r\n%V\r\n",
                                 ngx_strlen(cmd), cmd, key->sn.str.len,
                                 &key->sn.str);
    key->confirmed = 0;
    key->pending++;

    if (node->ready && !node->flush_ev.posted) {
        ngx_post_event(&node->flush_ev, &ngx_posted_events);
    }

    return 1;
}


/*
 * A cluster's keys on a subscriber (of one slot, all: -1, those not
 * confirmed: -2) are subscribed no longer: to be subscribed again where
 * the map says.
 */

static void
ngx_http_idempotency_notify_reset(ngx_http_idempotency_notify_t *n,
    ngx_http_idempotency_node_t *node, ngx_int_t slot)
{
    ngx_rbtree_node_t                  *rn, *next;
    ngx_http_idempotency_notify_key_t  *key;

    if (n->tree.root == n->tree.sentinel) {
        return;
    }

    for (rn = ngx_rbtree_min(n->tree.root, n->tree.sentinel);
         rn;
         rn = next)
    {
        next = ngx_rbtree_next(&n->tree, rn);
        key = (ngx_http_idempotency_notify_key_t *) rn;

        if (key->node != node
            || (slot >= 0 && key->slot != (ngx_uint_t) slot)
            || (slot == -2 && key->confirmed))
        {
            continue;
        }

        key->node = NULL;
        key->subscribed = 0;
        key->confirmed = 0;
        key->pending = 0;

        if (ngx_queue_empty(&key->waiters)) {
            ngx_http_idempotency_notify_free_key(n, key);
            continue;
        }

        ngx_http_idempotency_notify_dirty(n, key);
    }
}


/*
 * Replies on the subscriber node: confirmations and messages are taken
 * here (NGX_DONE); the handshake's replies go to redis.c (NGX_DECLINED).
 * An error to SSUBSCRIBE (Redis 6, an ACL) turns wake-ups off: polling.
 */

ngx_int_t
ngx_http_idempotency_notify_reply(ngx_http_idempotency_node_t *node,
    redisReply *reply)
{
    ngx_str_t                           channel;
    redisReply                         *kind, *ch;
    ngx_http_idempotency_notify_t      *n;
    ngx_http_idempotency_notify_key_t  *key;

    n = node->redis->notify;

    if (reply->type == REDIS_REPLY_ERROR && node->head == NULL
        && node->redis->topology->nodes && reply->str
        && ngx_http_idempotency_notify_cluster_error(n, node, reply))
    {
        return NGX_DONE;
    }

    if (reply->type == REDIS_REPLY_ERROR && node->head == NULL) {
        ngx_log_error(NGX_LOG_WARN, node->redis->log, 0,
                      "idempotency: redis \"%V\" refused SSUBSCRIBE: %*s "
                      "(waiting duplicates poll; wake-ups need Redis 7 "
                      "and +ssubscribe +spublish)", &node->redis->name,
                      (size_t) ngx_min(reply->len, 128), reply->str);
        n->off = 1;
        ngx_http_idempotency_conn_close(node);
        return NGX_DONE;
    }

    if (reply->type != REDIS_REPLY_ARRAY || reply->elements != 3) {
        return NGX_DECLINED;
    }

    kind = reply->element[0];
    ch = reply->element[1];

    if (kind == NULL || ch == NULL || kind->type != REDIS_REPLY_STRING
        || ch->type != REDIS_REPLY_STRING)
    {
        return NGX_DECLINED;
    }

    channel.data = (u_char *) ch->str;
    channel.len = ch->len;

    if (ngx_http_idempotency_notify_is(kind, "smessage")) {
        key = ngx_http_idempotency_notify_key(n, &channel, 0);

        if (key && key->confirmed) {
            ngx_http_idempotency_notify_wake_key(key);
        }

        return NGX_DONE;
    }

    if (!ngx_http_idempotency_notify_is(kind, "ssubscribe")
        && !ngx_http_idempotency_notify_is(kind, "sunsubscribe"))
    {
        return NGX_DECLINED;
    }

    key = ngx_http_idempotency_notify_key(n, &channel, 0);

    if (node->redis->topology->nodes) {
        if (key == NULL || key->node != node) {
            /* of a former subscriber, or of a key nobody waits for */
            return NGX_DONE;
        }

        if (key->pending == 0 && key->subscribed
            && ngx_http_idempotency_notify_is(kind, "sunsubscribe"))
        {
            /* pushed by Redis: the key's slot left the node */
            ngx_http_idempotency_cluster_moved(node, NULL, 0);
            ngx_http_idempotency_notify_reset(n, node,
                                              (ngx_int_t) key->slot);
            return NGX_DONE;
        }
    }

    if (key == NULL || key->pending == 0) {
        /* nothing waits for it: harmless */
        return NGX_DONE;
    }

    /* confirmed: the last SSUBSCRIBE sent for the key took effect */

    if (--key->pending == 0) {
        if (key->subscribed) {
            key->confirmed = 1;
            key->epoch = ++ngx_http_idempotency_notify_epoch;
            ngx_http_idempotency_notify_check_key(key);

        } else if (ngx_queue_empty(&key->waiters)) {
            ngx_http_idempotency_notify_free_key(n, key);
        }
    }

    return NGX_DONE;
}


/*
 * An error to a cluster's SSUBSCRIBE: a MOVED (the map was stale, its slot
 * is known at once), an ASK, or the errors of a failover or a resharding:
 * the keys go again once the map is asked for.  0: not one of these.
 */

static ngx_uint_t
ngx_http_idempotency_notify_cluster_error(ngx_http_idempotency_notify_t *n,
    ngx_http_idempotency_node_t *node, redisReply *reply)
{
    u_char     *p, *last;
    ngx_int_t   slot;

    p = (u_char *) reply->str;
    last = p + reply->len;

    if (ngx_http_idempotency_notify_is_prefix(p, last, "MOVED ")
        || ngx_http_idempotency_notify_is_prefix(p, last, "ASK "))
    {
        p = ngx_strlchr(p, last, ' ') + 1;
        last = ngx_strlchr(p, last, ' ');
        slot = last ? ngx_atoi(p, last - p) : NGX_ERROR;

        if (reply->str[0] == 'M') {
            ngx_http_idempotency_cluster_moved(node, p,
                                   (u_char *) reply->str + reply->len - p);

        } else {
            /* a migration under way: where it ends, by the map */
            ngx_http_idempotency_cluster_moved(node, NULL, 0);
        }

        ngx_http_idempotency_notify_reset(n, node, slot == NGX_ERROR ? -2
                                                                     : slot);
        return 1;
    }

    if (ngx_http_idempotency_notify_is_prefix(p, last, "TRYAGAIN")
        || ngx_http_idempotency_notify_is_prefix(p, last, "CLUSTERDOWN")
        || ngx_http_idempotency_notify_is_prefix(p, last, "LOADING")
        || ngx_http_idempotency_notify_is_prefix(p, last, "MASTERDOWN"))
    {
        ngx_http_idempotency_cluster_moved(node, NULL, 0);
        ngx_http_idempotency_notify_reset(n, node, -2);
        return 1;
    }

    return 0;
}


static ngx_uint_t
ngx_http_idempotency_notify_is_prefix(u_char *p, u_char *last,
    const char *s)
{
    size_t  len;

    len = ngx_strlen(s);

    return (size_t) (last - p) >= len && ngx_strncmp(p, s, len) == 0;
}


static ngx_uint_t
ngx_http_idempotency_notify_is(redisReply *r, const char *s)
{
    size_t  len;

    len = ngx_strlen(s);

    return (size_t) r->len == len && ngx_strncmp(r->str, s, len) == 0;
}


/* every waiter of the key claims again: at once, or after its claim */

static void
ngx_http_idempotency_notify_wake_key(ngx_http_idempotency_notify_key_t *key)
{
    ngx_queue_t                           *q;
    ngx_http_idempotency_notify_waiter_t  *w;

    key->checker = NULL;
    key->woken = ++ngx_http_idempotency_notify_epoch;

    for (q = ngx_queue_head(&key->waiters);
         q != ngx_queue_sentinel(&key->waiters);
         q = ngx_queue_next(q))
    {
        w = ngx_queue_data(q, ngx_http_idempotency_notify_waiter_t, queue);
        ngx_http_idempotency_notify_wake(w);
    }
}


/*
 * The subscription took effect: one claim sent from now on tells, for
 * every waiter of the key, whether the original completed before.  One
 * waiter sends it; the others sleep until a message, or until that claim
 * finds anything but "in progress" (notify_unwatch wakes them then).
 */

static void
ngx_http_idempotency_notify_check_key(ngx_http_idempotency_notify_key_t *key)
{
    ngx_msec_int_t                         left;
    ngx_queue_t                           *q;
    ngx_http_idempotency_ctx_t            *ctx;
    ngx_http_idempotency_notify_waiter_t  *w;

    key->checker = NULL;

    for (q = ngx_queue_head(&key->waiters);
         q != ngx_queue_sentinel(&key->waiters);
         q = ngx_queue_next(q))
    {
        w = ngx_queue_data(q, ngx_http_idempotency_notify_waiter_t, queue);
        ctx = w->ctx;

        if (key->checker == NULL
            && ctx->state == NGX_HTTP_IDEMPOTENCY_ST_POLLING)
        {
            key->checker = w;
            ngx_http_idempotency_notify_wake(w);
            continue;
        }

        w->checked = 1;

        if (ctx->state != NGX_HTTP_IDEMPOTENCY_ST_POLLING
            || !ctx->timeout.timer_set)
        {
            continue;
        }

        /* from polling to the safety poll, within idempotency_wait */

        left = (ngx_msec_int_t) (ctx->wait_until - ngx_current_msec);

        if (left > 0) {
            ngx_add_timer(&ctx->timeout,
                          ngx_min((ngx_msec_t) left,
                                  NGX_HTTP_IDEMPOTENCY_NOTIFY_POLL));
        }
    }

    if (key->checker == NULL && !ngx_queue_empty(&key->waiters)) {
        /* every claim is in flight, sent before: the first one goes again */

        w = ngx_queue_data(ngx_queue_head(&key->waiters),
                           ngx_http_idempotency_notify_waiter_t, queue);
        w->again = 1;
        key->checker = w;
    }
}


static void
ngx_http_idempotency_notify_wake(ngx_http_idempotency_notify_waiter_t *w)
{
    ngx_http_idempotency_ctx_t  *ctx;

    ctx = w->ctx;

    ngx_log_debug2(NGX_LOG_DEBUG_HTTP, ctx->request->connection->log, 0,
                   "idempotency notify wake: state:%ui confirmed:%d",
                   ctx->state, w->key->confirmed);

    if (ctx->state != NGX_HTTP_IDEMPOTENCY_ST_POLLING) {
        w->again = 1;
        return;
    }

    /* the poll timer's handler, run now: the list is not touched */

    w->checked = 1;
    w->again = 0;

    if (ctx->timeout.timer_set) {
        ngx_del_timer(&ctx->timeout);
    }

    if (!ctx->timeout.posted) {
        ngx_post_event(&ctx->timeout, &ngx_posted_events);
    }
}


void
ngx_http_idempotency_notify_up(ngx_http_idempotency_node_t *node)
{
    ngx_http_idempotency_notify_t  *n;

    n = node->redis->notify;

    node->up = 1;
    node->was_up = 1;
    node->failed = 0;
    node->refused = 0;
    node->backoff = NGX_HTTP_IDEMPOTENCY_NOTIFY_BACKOFF_MIN;

    if (!ngx_queue_empty(&n->dirty) && !n->batch_ev.posted) {
        ngx_post_event(&n->batch_ev, &ngx_posted_events);
    }
}


/*
 * The subscriber connection is gone with its subscriptions: waiters poll
 * as without notifications until it is back and subscribed again.
 * Returns whether to reconnect.
 */

ngx_uint_t
ngx_http_idempotency_notify_closed(ngx_http_idempotency_node_t *node)
{
    ngx_rbtree_node_t                  *rn, *next;
    ngx_http_idempotency_notify_t      *n;
    ngx_http_idempotency_notify_key_t  *key;

    n = node->redis->notify;

    if (node->redis->topology->nodes) {
        /* its keys only, on the master the map names next */
        ngx_http_idempotency_notify_reset(n, node, -1);
        goto done;
    }

    if (n->tree.root == n->tree.sentinel) {
        goto done;
    }

    for (rn = ngx_rbtree_min(n->tree.root, n->tree.sentinel);
         rn;
         rn = next)
    {
        next = ngx_rbtree_next(&n->tree, rn);
        key = (ngx_http_idempotency_notify_key_t *) rn;

        if (ngx_queue_empty(&key->waiters)) {
            ngx_http_idempotency_notify_free_key(n, key);
            continue;
        }

        key->subscribed = 0;
        key->confirmed = 0;
        key->pending = 0;
        ngx_http_idempotency_notify_dirty(n, key);
    }

done:

    return !n->off && !node->redis->exiting;
}


/* worker exit: the subscriber connection and the keys */

void
ngx_http_idempotency_notify_exit(ngx_http_idempotency_redis_t *redis)
{
    ngx_queue_t                           *q;
    ngx_rbtree_node_t                     *rn;
    ngx_http_idempotency_node_t           *node;
    ngx_http_idempotency_notify_t         *n;
    ngx_http_idempotency_notify_sub_t     *s;
    ngx_http_idempotency_notify_key_t     *key;
    ngx_http_idempotency_notify_waiter_t  *w;

    n = redis->notify;

    if (n == NULL) {
        return;
    }

    if (n->node.open) {
        ngx_http_idempotency_conn_close(&n->node);
    }

    if (n->node.reconnect_ev.timer_set) {
        ngx_del_timer(&n->node.reconnect_ev);
    }

    while (n->subs) {
        s = n->subs;
        node = &s->node;

        if (node->open) {
            ngx_http_idempotency_conn_close(node);
        }

        if (node->reconnect_ev.timer_set) {
            ngx_del_timer(&node->reconnect_ev);
        }

        if (node->reset_ev.posted) {
            ngx_delete_posted_event(&node->reset_ev);
        }

        if (node->flush_ev.posted) {
            ngx_delete_posted_event(&node->flush_ev);
        }

        n->subs = s->next;

        ngx_http_idempotency_conn_free(node);
        ngx_free(node->host.data);
        ngx_free(s);
    }

    if (n->batch_ev.posted) {
        ngx_delete_posted_event(&n->batch_ev);
    }

    while (n->tree.root != n->tree.sentinel) {
        rn = ngx_rbtree_min(n->tree.root, n->tree.sentinel);
        key = (ngx_http_idempotency_notify_key_t *) rn;

        /* requests still waiting poll from now on */

        for (q = ngx_queue_head(&key->waiters);
             q != ngx_queue_sentinel(&key->waiters);
             q = ngx_queue_next(q))
        {
            w = ngx_queue_data(q, ngx_http_idempotency_notify_waiter_t,
                               queue);
            w->ctx->notify = NULL;
        }

        ngx_http_idempotency_notify_free_key(n, key);
    }

    ngx_http_idempotency_conn_free(&n->node);
    ngx_free(n);

    redis->notify = NULL;
}
