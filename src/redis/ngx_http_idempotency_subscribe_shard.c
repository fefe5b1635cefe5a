
/*
 * Copyright (C) The ngx_http_idempotency_module authors
 *
 * Sharded Pub/Sub on a Redis Cluster (subscribe.c is the rest): a
 * channel goes out on the subscriber of its slot's master, one channel
 * per command, made and connected on demand where the slot map says; a
 * MOVED, a slot that moves, or a subscriber that closes sends its
 * channels where their slots went.
 */


#include "ngx_http_idempotency_redis.h"


static void ngx_http_idempotency_subscriber_drop(
    ngx_http_idempotency_node_t *node);
static ngx_http_idempotency_node_t *ngx_http_idempotency_subscriber_shard(
    ngx_http_idempotency_subscriber_t *n, ngx_uint_t slot);
static ngx_uint_t ngx_http_idempotency_subscriber_send_channel(
    ngx_http_idempotency_node_t *node, const char *cmd,
    ngx_http_idempotency_channel_t *ch);


/*
 * A cluster: each channel on the subscriber of its slot's master, one per
 * command (the channels of one SSUBSCRIBE must share a slot).  A channel
 * that cannot go now (no map yet, its subscriber connecting) stays dirty:
 * the subscriber's handshake, its reconnect timer and the channel's owner,
 * who waits meanwhile (subscribe_again), run the batch again.
 */

void
ngx_http_idempotency_subscriber_cluster_batch(
    ngx_http_idempotency_subscriber_t *n)
{
    ngx_queue_t                     *q, *next;
    ngx_http_idempotency_node_t     *sub;
    ngx_http_idempotency_channel_t  *ch;

    for (q = ngx_queue_head(&n->dirty);
         q != ngx_queue_sentinel(&n->dirty);
         q = next)
    {
        next = ngx_queue_next(q);
        ch = ngx_queue_data(q, ngx_http_idempotency_channel_t, dirty);

        if (ch->wanted && !ch->subscribed) {
            sub = ngx_http_idempotency_subscriber_shard(n, ch->slot);

            if (sub == NULL || !sub->up) {
                continue;
            }

            if (sub != ch->node) {
                /* what the former subscriber confirms no longer counts */
                ch->node = sub;
                ch->pending = 0;
            }

            if (!ngx_http_idempotency_subscriber_send_channel(sub,
                                                        "SSUBSCRIBE", ch))
            {
                ngx_http_idempotency_subscriber_drop(sub);
                continue;
            }

            ch->subscribed = 1;

        } else if (!ch->wanted && ch->subscribed) {
            ch->subscribed = 0;
            ch->confirmed = 0;

            if (ch->node->up
                && !ngx_http_idempotency_subscriber_send_channel(ch->node,
                                                        "SUNSUBSCRIBE", ch))
            {
                ngx_http_idempotency_subscriber_drop(ch->node);
                continue;
            }
        }

        ngx_queue_remove(q);
        ch->in_dirty = 0;

        if (!ch->wanted && !ch->subscribed && ch->pending == 0) {
            ngx_http_idempotency_subscriber_free(n, ch);
        }
    }
}


/*
 * No memory: the connection and its subscriptions start over, after the
 * loop over the channels that closing it would change
 */

static void
ngx_http_idempotency_subscriber_drop(ngx_http_idempotency_node_t *node)
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
ngx_http_idempotency_subscriber_shard(ngx_http_idempotency_subscriber_t *n,
    ngx_uint_t slot)
{
    ngx_addr_t                    *m;
    ngx_http_idempotency_node_t   *sub, *master;
    ngx_http_idempotency_target_t *redis;
    ngx_http_idempotency_shard_t  *s;

    redis = n->node.redis;

    master = ngx_http_idempotency_cluster_master(redis, slot);
    if (master == NULL || master->naddrs == 0) {
        return NULL;
    }

    m = &master->addrs[master->addr % master->naddrs];

    for (s = n->shards; s; s = s->next) {
        sub = &s->node;

        if (ngx_cmp_sockaddr(sub->addrs->sockaddr, sub->addrs->socklen,
                             m->sockaddr, m->socklen, 1)
            == NGX_OK)
        {
            goto found;
        }
    }

    s = ngx_calloc(sizeof(ngx_http_idempotency_shard_t), redis->log);
    if (s == NULL) {
        return NULL;
    }

    sub = &s->node;

    ngx_http_idempotency_subscriber_node(sub, redis);

    if (ngx_http_idempotency_subscriber_addr(sub, m) != NGX_OK) {
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

    s->next = n->shards;
    n->shards = s;

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
ngx_http_idempotency_subscriber_send_channel(
    ngx_http_idempotency_node_t *node, const char *cmd,
    ngx_http_idempotency_channel_t *ch)
{
    u_char  *p;
    size_t   len;

    len = sizeof("*2\r\n$\r\n\r\n$\r\n\r\n") - 1 + 2 * NGX_SIZE_T_LEN
          + ngx_strlen(cmd) + ch->sn.str.len;

    p = ngx_http_idempotency_conn_reserve(node, len);
    if (p == NULL) {
        return 0;
    }

    node->out_last = ngx_sprintf(p, "*2\r\n$%uz\r\n%s\r\n$%uz\r\n%V\r\n",
                                 ngx_strlen(cmd), cmd, ch->sn.str.len,
                                 &ch->sn.str);
    ch->confirmed = 0;
    ch->pending++;

    if (node->ready && !node->flush_ev.posted) {
        ngx_post_event(&node->flush_ev, &ngx_posted_events);
    }

    return 1;
}


/*
 * A cluster's channels on a subscriber (of one slot, all: -1, those not
 * confirmed: -2) are subscribed no longer: to be subscribed again where
 * the map says.
 */

void
ngx_http_idempotency_subscriber_reset(ngx_http_idempotency_subscriber_t *n,
    ngx_http_idempotency_node_t *node, ngx_int_t slot)
{
    ngx_rbtree_node_t               *rn, *next;
    ngx_http_idempotency_channel_t  *ch;

    if (n->tree.root == n->tree.sentinel) {
        return;
    }

    for (rn = ngx_rbtree_min(n->tree.root, n->tree.sentinel);
         rn;
         rn = next)
    {
        next = ngx_rbtree_next(&n->tree, rn);
        ch = (ngx_http_idempotency_channel_t *) rn;

        if (ch->node != node
            || (slot >= 0 && ch->slot != (ngx_uint_t) slot)
            || (slot == -2 && ch->confirmed))
        {
            continue;
        }

        ch->node = NULL;
        ch->subscribed = 0;
        ch->confirmed = 0;
        ch->pending = 0;

        if (!ch->wanted) {
            ngx_http_idempotency_subscriber_free(n, ch);
            continue;
        }

        ngx_http_idempotency_subscriber_dirty(n, ch);
    }
}


/*
 * An error to a cluster's SSUBSCRIBE: a MOVED (the map was stale, its slot
 * is known at once), an ASK, or the errors of a failover or a resharding:
 * the channels go again once the map is asked for.  0: not one of these.
 */

ngx_uint_t
ngx_http_idempotency_subscriber_cluster_error(
    ngx_http_idempotency_subscriber_t *n, ngx_http_idempotency_node_t *node,
    redisReply *reply)
{
    u_char     *p, *last;
    ngx_int_t   slot;

    p = (u_char *) reply->str;
    last = p + reply->len;

    if (ngx_http_idempotency_reply_is(reply, "MOVED ")
        || ngx_http_idempotency_reply_is(reply, "ASK "))
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

        ngx_http_idempotency_subscriber_reset(n, node,
                                              slot == NGX_ERROR ? -2 : slot);
        return 1;
    }

    if (ngx_http_idempotency_reply_passing(reply, 0)) {
        ngx_http_idempotency_cluster_moved(node, NULL, 0);
        ngx_http_idempotency_subscriber_reset(n, node, -2);
        return 1;
    }

    return 0;
}
