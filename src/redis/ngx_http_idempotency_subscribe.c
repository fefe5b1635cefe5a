
/*
 * Copyright (C) The ngx_http_idempotency_module authors
 *
 * Sharded Pub/Sub on nginx's event loop.  A subscriber is made per target
 * and per worker by whoever wants its channels: per standalone or Sentinel
 * target one connection (a node of node.c in subscribed mode), one
 * SSUBSCRIBE per event loop turn with every channel newly wanted.  On a
 * cluster a message goes out on the shard of the channel's slot: one
 * connection per master that owns a wanted channel's slot (made on
 * demand), one channel per command, where the slot map says; a MOVED, or
 * the sunsubscribe Redis pushes when the slot leaves, sends it where the
 * slot went.  The owner is told of each message on a confirmed channel
 * and of each confirmation: what was published before a confirmation (the
 * first, or the one after a lost connection or a moved slot) may not have
 * reached it.  What only a cluster does is subscribe_shard.c's.
 */


#include "ngx_http_idempotency_redis.h"


static void ngx_http_idempotency_subscriber_reconnect(ngx_event_t *ev);
static ngx_uint_t ngx_http_idempotency_subscriber_moved(
    ngx_http_idempotency_node_t *node);
static void ngx_http_idempotency_subscriber_batch(ngx_event_t *ev);
static ngx_uint_t ngx_http_idempotency_subscriber_send(
    ngx_http_idempotency_subscriber_t *n, const char *cmd,
    ngx_uint_t subscribe);
static ngx_int_t ngx_http_idempotency_subscriber_handshake(
    ngx_http_idempotency_node_t *node);
static ngx_int_t ngx_http_idempotency_subscriber_reply(
    ngx_http_idempotency_node_t *node, redisReply *reply);
static void ngx_http_idempotency_subscriber_up(
    ngx_http_idempotency_node_t *node);
static void ngx_http_idempotency_subscriber_closed(
    ngx_http_idempotency_node_t *node);
static void ngx_http_idempotency_subscriber_exit(
    ngx_http_idempotency_target_t *redis);
static ngx_uint_t ngx_http_idempotency_subscriber_is(redisReply *r,
    const char *s);


/*
 * The owner of a subscriber's nodes: no scripts after the handshake, no
 * router and no map: its own replies, up and close
 */

static ngx_http_idempotency_node_owner_t
    ngx_http_idempotency_subscriber_owner = {
    ngx_http_idempotency_subscriber_handshake,
    ngx_http_idempotency_subscriber_up,
    ngx_http_idempotency_subscriber_reply,
    NULL,                                  /* redirect */
    NULL,                                  /* lost */
    NULL,                                  /* wanted */
    ngx_http_idempotency_subscriber_closed
};


/*
 * The target's subscriber, made by its owner when a channel is first
 * wanted; the owner sets the size of its data per channel and its
 * handlers before it adds a channel.
 */

ngx_http_idempotency_subscriber_t *
ngx_http_idempotency_subscriber_create(ngx_http_idempotency_target_t *redis)
{
    ngx_http_idempotency_subscriber_t  *n;

    n = ngx_calloc(sizeof(ngx_http_idempotency_subscriber_t), redis->log);
    if (n == NULL) {
        return NULL;
    }

    ngx_http_idempotency_subscriber_node(&n->node, redis);

    ngx_rbtree_init(&n->tree, &n->sentinel, ngx_str_rbtree_insert_value);
    ngx_queue_init(&n->dirty);

    n->batch_ev.handler = ngx_http_idempotency_subscriber_batch;
    n->batch_ev.data = n;
    n->batch_ev.log = redis->log;

    redis->subscriber = n;
    redis->exit_handler = ngx_http_idempotency_subscriber_exit;

    return n;
}


/*
 * A node of its own, owned by the subscriber: the client hands it what no
 * command asked for, and its reconnects are the subscriber's
 */

void
ngx_http_idempotency_subscriber_node(ngx_http_idempotency_node_t *node,
    ngx_http_idempotency_target_t *redis)
{
    ngx_http_idempotency_node_init(node, redis, redis->log,
                                   &ngx_http_idempotency_subscriber_owner);

    node->reconnect_ev.handler = ngx_http_idempotency_subscriber_reconnect;
}


/*
 * With Sentinels, the subscriber goes to the master the Sentinels named
 * last, as node.c's node does; a demoted master does not deliver what its
 * new master publishes, so an owner that still waits and finds the master
 * switched (subscribe_again) closes the subscriber, and it comes here
 * again.
 */

static void
ngx_http_idempotency_subscriber_reconnect(ngx_event_t *ev)
{
    ngx_http_idempotency_node_t *node = ev->data;

    ngx_addr_t                         *m;
    ngx_http_idempotency_target_t      *redis;
    ngx_http_idempotency_subscriber_t  *n;

    redis = node->redis;

    if (redis->exiting || ngx_exiting || ngx_quit || ngx_terminate
        || node->open)
    {
        return;
    }

    if (redis->topology->nodes) {
        /* a cluster's subscriber: if a channel still wants it, per the map */
        n = redis->subscriber;

        if (!ngx_queue_empty(&n->dirty) && !n->batch_ev.posted) {
            ngx_post_event(&n->batch_ev, &ngx_posted_events);
        }

        return;
    }

    if (redis->topology->moves) {
        if (redis->node == NULL || redis->node->naddrs == 0) {
            /* no master named yet: the owner tries again (subscribe_again) */
            return;
        }

        m = &redis->node->addrs[redis->node->addr % redis->node->naddrs];

        if (ngx_http_idempotency_subscriber_addr(node, m) != NGX_OK) {
            return;
        }
    }

    ngx_http_idempotency_redis_connect(node);
}


/* the subscriber's own copy of an address: conn_free frees it */

ngx_int_t
ngx_http_idempotency_subscriber_addr(ngx_http_idempotency_node_t *node,
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
ngx_http_idempotency_subscriber_moved(ngx_http_idempotency_node_t *node)
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


/*
 * A channel by its name, made if asked (create) with the owner's data
 * after it, zeroed; NULL: not there, or no memory.
 */

ngx_http_idempotency_channel_t *
ngx_http_idempotency_subscriber_channel(ngx_http_idempotency_subscriber_t *n,
    ngx_str_t *name, ngx_uint_t create)
{
    uint32_t                         hash;
    ngx_http_idempotency_channel_t  *ch;

    hash = ngx_crc32_short(name->data, name->len);

    ch = (ngx_http_idempotency_channel_t *)
              ngx_str_rbtree_lookup(&n->tree, name, hash);

    if (ch || !create) {
        return ch;
    }

    ch = ngx_calloc(sizeof(ngx_http_idempotency_channel_t) + n->size
                    + name->len, n->node.redis->log);
    if (ch == NULL) {
        return NULL;
    }

    ch->subscriber = n;
    ch->data = &ch[1];

    ch->sn.str.data = (u_char *) ch->data + n->size;
    ch->sn.str.len = name->len;
    ngx_memcpy(ch->sn.str.data, name->data, name->len);
    ch->sn.node.key = hash;

    if (n->node.redis->topology->nodes) {
        ch->slot = ngx_http_idempotency_cluster_slot(ch->sn.str.data,
                                                     ch->sn.str.len);
    }

    ngx_rbtree_insert(&n->tree, &ch->sn.node);

    return ch;
}


/* the owner wants the channel: subscribed on the next batch, if not yet */

void
ngx_http_idempotency_subscribe(ngx_http_idempotency_channel_t *ch)
{
    ch->wanted = 1;

    if (!ch->subscribed) {
        ngx_http_idempotency_subscriber_dirty(ch->subscriber, ch);
    }
}


/*
 * The owner still waits on the channel, and will until it is confirmed:
 * whatever keeps it from being subscribed is tried again.
 */

void
ngx_http_idempotency_subscribe_again(ngx_http_idempotency_channel_t *ch)
{
    ngx_http_idempotency_target_t      *redis;
    ngx_http_idempotency_subscriber_t  *n;

    n = ch->subscriber;
    redis = n->node.redis;

    if (redis->topology->nodes) {
        /* not subscribed (no map, no subscriber yet, moved): try again */

        if (!ch->subscribed) {
            ngx_http_idempotency_subscriber_dirty(n, ch);
        }

        return;
    }

    if (n->node.open && redis->topology->moves
        && ngx_http_idempotency_subscriber_moved(&n->node))
    {
        /* subscribed to a master the Sentinels replaced: the new one */
        ngx_http_idempotency_conn_close(&n->node);
    }

    if (!n->node.open && !n->node.reconnect_ev.timer_set) {
        ngx_http_idempotency_subscriber_reconnect(&n->node.reconnect_ev);
    }
}


/*
 * The owner wants the channel no more: unsubscribed on the next batch,
 * and freed, with the owner's data, once no confirmation names it.
 */

void
ngx_http_idempotency_unsubscribe(ngx_http_idempotency_channel_t *ch)
{
    ch->wanted = 0;

    ngx_http_idempotency_subscriber_dirty(ch->subscriber, ch);
}


/* (un)subscriptions are batched: one command each per event loop turn */

void
ngx_http_idempotency_subscriber_dirty(ngx_http_idempotency_subscriber_t *n,
    ngx_http_idempotency_channel_t *ch)
{
    if (!ch->in_dirty) {
        ch->in_dirty = 1;
        ngx_queue_insert_tail(&n->dirty, &ch->dirty);
    }

    if (!n->batch_ev.posted) {
        ngx_post_event(&n->batch_ev, &ngx_posted_events);
    }
}


void
ngx_http_idempotency_subscriber_free(ngx_http_idempotency_subscriber_t *n,
    ngx_http_idempotency_channel_t *ch)
{
    if (ch->in_dirty) {
        ngx_queue_remove(&ch->dirty);
    }

    ngx_rbtree_delete(&n->tree, &ch->sn.node);
    ngx_free(ch);
}


static void
ngx_http_idempotency_subscriber_batch(ngx_event_t *ev)
{
    ngx_http_idempotency_subscriber_t *n = ev->data;

    ngx_queue_t                     *q, *next;
    ngx_http_idempotency_node_t     *node;
    ngx_http_idempotency_channel_t  *ch;

    if (n->node.redis->topology->nodes) {
        ngx_http_idempotency_subscriber_cluster_batch(n);
        return;
    }

    node = &n->node;

    if (node->up) {
        if (!ngx_http_idempotency_subscriber_send(n, "SSUBSCRIBE", 1)
            || !ngx_http_idempotency_subscriber_send(n, "SUNSUBSCRIBE", 0))
        {
            /* no memory: the connection and its subscriptions start over */
            ngx_http_idempotency_conn_close(node);
            return;
        }
    }

    /* channels nobody wants and no confirmation will name */

    for (q = ngx_queue_head(&n->dirty);
         q != ngx_queue_sentinel(&n->dirty);
         q = next)
    {
        next = ngx_queue_next(q);
        ch = ngx_queue_data(q, ngx_http_idempotency_channel_t, dirty);

        if (!ch->wanted && !ch->subscribed && ch->pending == 0) {
            ngx_http_idempotency_subscriber_free(n, ch);
            continue;
        }

        if (node->up) {
            ngx_queue_remove(q);
            ch->in_dirty = 0;
        }
    }
}


/*
 * One SSUBSCRIBE with every dirty channel wanted and not subscribed, or
 * one SUNSUBSCRIBE with every subscribed one no longer wanted.  0: no
 * memory.
 */

static ngx_uint_t
ngx_http_idempotency_subscriber_send(ngx_http_idempotency_subscriber_t *n,
    const char *cmd, ngx_uint_t subscribe)
{
    u_char                          *p;
    size_t                           len;
    ngx_uint_t                       nchannels, pass;
    ngx_queue_t                     *q;
    ngx_http_idempotency_node_t     *node;
    ngx_http_idempotency_channel_t  *ch;

    node = &n->node;
    nchannels = 0;
    len = sizeof("*\r\n$\r\n\r\n") - 1 + 2 * NGX_SIZE_T_LEN + ngx_strlen(cmd);
    p = NULL;

    /* the channels are counted, then written */

    for (pass = 0; pass < 2; pass++) {

        for (q = ngx_queue_head(&n->dirty);
             q != ngx_queue_sentinel(&n->dirty);
             q = ngx_queue_next(q))
        {
            ch = ngx_queue_data(q, ngx_http_idempotency_channel_t, dirty);

            if (ch->wanted != subscribe || ch->subscribed == subscribe) {
                continue;
            }

            if (pass == 0) {
                nchannels++;
                len += sizeof("$\r\n\r\n") - 1 + NGX_SIZE_T_LEN
                       + ch->sn.str.len;
                continue;
            }

            p = ngx_sprintf(p, "$%uz\r\n%V\r\n", ch->sn.str.len,
                            &ch->sn.str);
            ch->subscribed = subscribe;
            ch->confirmed = 0;
            ch->pending++;
        }

        if (pass == 1) {
            break;
        }

        if (nchannels == 0) {
            return 1;
        }

        p = ngx_http_idempotency_conn_reserve(node, len);
        if (p == NULL) {
            return 0;
        }

        p = ngx_sprintf(p, "*%ui\r\n$%uz\r\n%s\r\n", nchannels + 1,
                        ngx_strlen(cmd), cmd);
    }

    node->out_last = p;

    if (node->ready && !node->flush_ev.posted) {
        ngx_post_event(&node->flush_ev, &ngx_posted_events);
    }

    return 1;
}


/*
 * Replies on the subscriber node: confirmations and messages are taken
 * here (NGX_DONE); the handshake's replies go to node.c (NGX_DECLINED).
 * An error to SSUBSCRIBE (Redis 6, an ACL) turns the subscriber off: its
 * owner is told, and gets on without it.
 */

static ngx_int_t
ngx_http_idempotency_subscriber_reply(ngx_http_idempotency_node_t *node,
    redisReply *reply)
{
    ngx_str_t                           channel;
    redisReply                         *kind, *name;
    ngx_http_idempotency_channel_t     *ch;
    ngx_http_idempotency_subscriber_t  *n;

    n = node->redis->subscriber;

    if (reply->type == REDIS_REPLY_ERROR && node->head == NULL
        && node->redis->topology->nodes && reply->str
        && ngx_http_idempotency_subscriber_cluster_error(n, node, reply))
    {
        return NGX_DONE;
    }

    if (reply->type == REDIS_REPLY_ERROR && node->head == NULL) {
        if (n->refused) {
            n->refused(n, reply);
        }

        n->off = 1;
        ngx_http_idempotency_conn_close(node);
        return NGX_DONE;
    }

    if (reply->type != REDIS_REPLY_ARRAY || reply->elements != 3) {
        return NGX_DECLINED;
    }

    kind = reply->element[0];
    name = reply->element[1];

    if (kind == NULL || name == NULL || kind->type != REDIS_REPLY_STRING
        || name->type != REDIS_REPLY_STRING)
    {
        return NGX_DECLINED;
    }

    channel.data = (u_char *) name->str;
    channel.len = name->len;

    if (ngx_http_idempotency_subscriber_is(kind, "smessage")) {
        ch = ngx_http_idempotency_subscriber_channel(n, &channel, 0);

        if (ch && ch->confirmed) {
            n->message(ch);
        }

        return NGX_DONE;
    }

    if (!ngx_http_idempotency_subscriber_is(kind, "ssubscribe")
        && !ngx_http_idempotency_subscriber_is(kind, "sunsubscribe"))
    {
        return NGX_DECLINED;
    }

    ch = ngx_http_idempotency_subscriber_channel(n, &channel, 0);

    if (node->redis->topology->nodes) {
        if (ch == NULL || ch->node != node) {
            /* of a former subscriber, or of a channel nobody wants */
            return NGX_DONE;
        }

        if (ch->pending == 0 && ch->subscribed
            && ngx_http_idempotency_subscriber_is(kind, "sunsubscribe"))
        {
            /* pushed by Redis: the channel's slot left the node */
            ngx_http_idempotency_cluster_moved(node, NULL, 0);
            ngx_http_idempotency_subscriber_reset(n, node,
                                                  (ngx_int_t) ch->slot);
            return NGX_DONE;
        }
    }

    if (ch == NULL || ch->pending == 0) {
        /* nothing waits for it: harmless */
        return NGX_DONE;
    }

    /* confirmed: the last SSUBSCRIBE sent for the channel took effect */

    if (--ch->pending == 0) {
        if (ch->subscribed) {
            ch->confirmed = 1;
            n->confirmed(ch);

        } else if (!ch->wanted) {
            ngx_http_idempotency_subscriber_free(n, ch);
        }
    }

    return NGX_DONE;
}


static ngx_uint_t
ngx_http_idempotency_subscriber_is(redisReply *r, const char *s)
{
    size_t  len;

    len = ngx_strlen(s);

    return (size_t) r->len == len && ngx_strncmp(r->str, s, len) == 0;
}


/* a subscriber runs no scripts: nothing follows CLIENT SETNAME */

static ngx_int_t
ngx_http_idempotency_subscriber_handshake(ngx_http_idempotency_node_t *node)
{
    return NGX_DONE;
}


/* not what redis_up counts: the channels waiting go now */

static void
ngx_http_idempotency_subscriber_up(ngx_http_idempotency_node_t *node)
{
    ngx_http_idempotency_subscriber_t  *n;

    n = node->redis->subscriber;

    if (!ngx_queue_empty(&n->dirty) && !n->batch_ev.posted) {
        ngx_post_event(&n->batch_ev, &ngx_posted_events);
    }
}


/*
 * The subscriber connection is gone with its subscriptions: its channels
 * are confirmed no more until it is back and they are subscribed again.
 * It is not back once SSUBSCRIBE was refused, nor counted as the target
 * down.
 */

static void
ngx_http_idempotency_subscriber_closed(ngx_http_idempotency_node_t *node)
{
    ngx_rbtree_node_t                  *rn, *next;
    ngx_http_idempotency_channel_t     *ch;
    ngx_http_idempotency_subscriber_t  *n;

    n = node->redis->subscriber;

    if (node->redis->topology->nodes) {
        /* its channels only, on the master the map names next */
        ngx_http_idempotency_subscriber_reset(n, node, -1);
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
        ch = (ngx_http_idempotency_channel_t *) rn;

        if (!ch->wanted) {
            ngx_http_idempotency_subscriber_free(n, ch);
            continue;
        }

        ch->subscribed = 0;
        ch->confirmed = 0;
        ch->pending = 0;
        ngx_http_idempotency_subscriber_dirty(n, ch);
    }

done:

    if (!n->off) {
        ngx_http_idempotency_node_schedule(node);
    }
}


/* worker exit: the subscriber connections and the channels */

static void
ngx_http_idempotency_subscriber_exit(ngx_http_idempotency_target_t *redis)
{
    ngx_rbtree_node_t                  *rn;
    ngx_http_idempotency_node_t        *node;
    ngx_http_idempotency_shard_t       *s;
    ngx_http_idempotency_channel_t     *ch;
    ngx_http_idempotency_subscriber_t  *n;

    n = redis->subscriber;

    if (n == NULL) {
        return;
    }

    if (n->node.open) {
        ngx_http_idempotency_conn_close(&n->node);
    }

    if (n->node.reconnect_ev.timer_set) {
        ngx_del_timer(&n->node.reconnect_ev);
    }

    while (n->shards) {
        s = n->shards;
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

        n->shards = s->next;

        ngx_http_idempotency_conn_free(node);
        ngx_free(node->host.data);
        ngx_free(s);
    }

    if (n->batch_ev.posted) {
        ngx_delete_posted_event(&n->batch_ev);
    }

    while (n->tree.root != n->tree.sentinel) {
        rn = ngx_rbtree_min(n->tree.root, n->tree.sentinel);
        ch = (ngx_http_idempotency_channel_t *) rn;

        /* the owner's data goes with the channel: it lets go first */

        if (n->gone) {
            n->gone(ch);
        }

        ngx_http_idempotency_subscriber_free(n, ch);
    }

    ngx_http_idempotency_conn_free(&n->node);
    ngx_free(n);

    redis->subscriber = NULL;
}
