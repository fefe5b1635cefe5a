
/*
 * Copyright (C) The ngx_http_idempotency_module authors
 *
 * Redis Cluster, the router: where each command goes, and what is done
 * when its reply comes back.  A command is hashed to its slot and sent to
 * the master that the map (cluster_map.c) names for it.  It keeps its
 * bytes until its reply, so that it can be sent again: to the node a MOVED
 * or an ASK names, after a backoff for the transient errors of a failover
 * or a resharding, and after a lost connection while its request waits.
 * What cannot go now waits here, within its deadline.  Others ask the
 * router the same question about a slot (subscribe.c: the master of a
 * slot, a MOVED to SSUBSCRIBE; scan.c through the table: the masters in
 * walk order), and the topology's table is at the end of this file.
 */


#include "ngx_http_idempotency_cluster.h"


#define NGX_HTTP_IDEMPOTENCY_REDIRECTS      5
#define NGX_HTTP_IDEMPOTENCY_RETRY_MIN      10
#define NGX_HTTP_IDEMPOTENCY_RETRY_MAX      160


static ngx_int_t ngx_http_idempotency_cluster_command(
    ngx_http_idempotency_op_t *op, int argc, const char **argv,
    const size_t *argvlen);
static void ngx_http_idempotency_cluster_load_script(
    ngx_http_idempotency_target_t *redis);
static ngx_int_t ngx_http_idempotency_cluster_walk(
    ngx_http_idempotency_target_t *redis, ngx_uint_t *at,
    ngx_http_idempotency_node_t **node);
static void ngx_http_idempotency_cluster_up(ngx_http_idempotency_node_t *node);
static ngx_int_t ngx_http_idempotency_cluster_reply(
    ngx_http_idempotency_node_t *node, ngx_http_idempotency_op_t *op,
    redisReply *reply);
static ngx_int_t ngx_http_idempotency_cluster_again(
    ngx_http_idempotency_cluster_t *cl, ngx_http_idempotency_op_t *op,
    redisReply *reply);
static ngx_int_t ngx_http_idempotency_cluster_redirect(
    ngx_http_idempotency_node_t *node, ngx_http_idempotency_op_t *op,
    redisReply *reply, u_char *p, ngx_uint_t ask);
static ngx_int_t ngx_http_idempotency_cluster_follow(
    ngx_http_idempotency_cluster_t *cl, ngx_http_idempotency_cnode_t *cn,
    ngx_http_idempotency_op_t *op, ngx_int_t slot, ngx_uint_t ask);
static ngx_int_t ngx_http_idempotency_cluster_lost(
    ngx_http_idempotency_node_t *node, ngx_http_idempotency_op_t *op);
static ngx_uint_t ngx_http_idempotency_cluster_closed(
    ngx_http_idempotency_node_t *node);
static ngx_str_t *ngx_http_idempotency_cluster_tls_name(
    ngx_http_idempotency_node_t *node, ngx_uint_t *ip);
static void ngx_http_idempotency_cluster_route(
    ngx_http_idempotency_cluster_t *cl, ngx_http_idempotency_op_t *op);
static void ngx_http_idempotency_cluster_wait(
    ngx_http_idempotency_cluster_t *cl, ngx_http_idempotency_op_t *op);
static ngx_uint_t ngx_http_idempotency_cluster_expired(
    ngx_http_idempotency_op_t *op);
static void ngx_http_idempotency_cluster_asked(ngx_http_idempotency_op_t *op,
    redisReply *reply);


static ngx_str_t  ngx_http_idempotency_asking_cmd =
    ngx_string("*1\r\n$6\r\nASKING\r\n");


/* CRC16/XMODEM of the hash tag (or of the key), as Redis Cluster does */

uint16_t
ngx_http_idempotency_cluster_slot(u_char *key, size_t len)
{
    u_char      *open, *close;
    uint16_t     crc;
    ngx_uint_t   i, bit;

    open = ngx_strlchr(key, key + len, '{');

    if (open) {
        close = ngx_strlchr(open + 1, key + len, '}');

        if (close && close > open + 1) {
            key = open + 1;
            len = close - key;
        }
    }

    crc = 0;

    for (i = 0; i < len; i++) {
        crc ^= (uint16_t) (key[i] << 8);

        for (bit = 0; bit < 8; bit++) {
            crc = (crc & 0x8000) ? (uint16_t) ((crc << 1) ^ 0x1021)
                                 : (uint16_t) (crc << 1);
        }
    }

    return crc & (NGX_HTTP_IDEMPOTENCY_SLOTS - 1);
}


/* NGX_DECLINED: the node takes no commands now */

ngx_int_t
ngx_http_idempotency_cluster_send(ngx_http_idempotency_node_t *node,
    ngx_http_idempotency_op_t *op, u_char *cmd, size_t len)
{
    u_char  *p;

    if (!node->open || node->handshake_failed || node->reset_ev.posted) {
        return NGX_DECLINED;
    }

    if (len >= NGX_HTTP_IDEMPOTENCY_BULK_MIN) {
        /* a large store: written from the op's copy */

        if (ngx_http_idempotency_conn_write_now(node, cmd, len) != NGX_OK) {
            return NGX_ERROR;
        }

    } else {
        p = ngx_http_idempotency_conn_reserve(node, len);
        if (p == NULL) {
            return NGX_ERROR;
        }

        node->out_last = ngx_cpymem(p, cmd, len);
    }

    ngx_http_idempotency_node_queue(node, op);

    return NGX_OK;
}


/*
 * The command is formatted once into a buffer the op owns until its reply;
 * the first attempt never calls back at once: an op that cannot be sent
 * now waits for the map or its node, within its deadline.
 */

static ngx_int_t
ngx_http_idempotency_cluster_command(ngx_http_idempotency_op_t *op,
    int argc, const char **argv, const size_t *argvlen)
{
    ngx_int_t                        rc;
    ngx_uint_t                       idx;
    ngx_http_idempotency_target_t   *redis;
    ngx_http_idempotency_cluster_t  *cl;

    redis = op->redis;
    cl = redis->cluster;

    if (cl == NULL || redis->exiting) {
        ngx_http_idempotency_op_free(op);
        return NGX_ERROR;
    }

    if (argv) {
        /* with no arguments, the op's kept command (redis_command_kept()) */

        op->buf = ngx_alloc(ngx_http_idempotency_format_len(argc, argvlen),
                            redis->log);
        if (op->buf == NULL) {
            ngx_http_idempotency_op_free(op);
            return NGX_ERROR;
        }

        op->buf_len = ngx_http_idempotency_format(op->buf, argc, argv,
                                                  argvlen)
                      - op->buf;
    }

    op->deadline = ngx_current_msec + redis->timeout;

    idx = cl->slot_node[ngx_http_idempotency_cluster_slot(op->rkey,
                                                          op->rkey_len)];

    if (idx == NGX_HTTP_IDEMPOTENCY_NO_NODE) {
        ngx_http_idempotency_cluster_refresh(cl);
        ngx_http_idempotency_cluster_wait(cl, op);
        return NGX_OK;
    }

    rc = ngx_http_idempotency_cluster_send(&cl->nodes[idx]->node, op,
                                           op->buf, op->buf_len);

    if (rc == NGX_ERROR) {
        ngx_http_idempotency_op_free(op);
        return NGX_ERROR;
    }

    if (rc == NGX_DECLINED) {
        ngx_http_idempotency_cluster_use(cl->nodes[idx]);
        ngx_http_idempotency_cluster_wait(cl, op);
    }

    return NGX_OK;
}


static void
ngx_http_idempotency_cluster_route(ngx_http_idempotency_cluster_t *cl,
    ngx_http_idempotency_op_t *op)
{
    ngx_int_t                      rc;
    ngx_uint_t                     idx;
    ngx_http_idempotency_cnode_t  *cn;

    if (ngx_http_idempotency_cluster_expired(op)) {
        ngx_http_idempotency_cluster_done(op);
        return;
    }

    idx = cl->slot_node[ngx_http_idempotency_cluster_slot(op->rkey,
                                                          op->rkey_len)];

    if (idx == NGX_HTTP_IDEMPOTENCY_NO_NODE) {
        ngx_http_idempotency_cluster_refresh(cl);
        ngx_http_idempotency_cluster_wait(cl, op);
        return;
    }

    cn = cl->nodes[idx];
    op->asking = 0;

    rc = ngx_http_idempotency_cluster_send(&cn->node, op, op->buf,
                                           op->buf_len);

    if (rc == NGX_OK) {
        return;
    }

    if (rc == NGX_DECLINED) {
        ngx_http_idempotency_cluster_use(cn);
        ngx_http_idempotency_cluster_wait(cl, op);
        return;
    }

    ngx_http_idempotency_cluster_done(op);
}


/* past its deadline, or a claim whose request has given up */

static ngx_uint_t
ngx_http_idempotency_cluster_expired(ngx_http_idempotency_op_t *op)
{
    if (op->on_reconnect && op->data == NULL) {
        return 1;
    }

    return (ngx_msec_int_t) (op->deadline - ngx_current_msec) <= 0;
}


/* backoff 10 -> 160 ms */

static void
ngx_http_idempotency_cluster_wait(ngx_http_idempotency_cluster_t *cl,
    ngx_http_idempotency_op_t *op)
{
    op->backoff = op->backoff
                  ? ngx_min(op->backoff * 2, NGX_HTTP_IDEMPOTENCY_RETRY_MAX)
                  : NGX_HTTP_IDEMPOTENCY_RETRY_MIN;
    op->retry_at = ngx_current_msec + op->backoff;
    op->node = NULL;

    op->next = NULL;
    *cl->waiting_tail = op;
    cl->waiting_tail = &op->next;

    if (!cl->retry_ev.timer_set) {
        ngx_add_timer(&cl->retry_ev, NGX_HTTP_IDEMPOTENCY_RETRY_MIN);
    }
}


void
ngx_http_idempotency_cluster_done(ngx_http_idempotency_op_t *op)
{
    op->handler(op, NULL);
    ngx_http_idempotency_op_free(op);
}


void
ngx_http_idempotency_cluster_retry_handler(ngx_event_t *ev)
{
    ngx_http_idempotency_cluster_t  *cl = ev->data;

    ngx_http_idempotency_op_t  *op, *list;

    list = cl->waiting;
    cl->waiting = NULL;
    cl->waiting_tail = &cl->waiting;

    while (list) {
        op = list;
        list = op->next;

        if ((ngx_msec_int_t) (op->retry_at - ngx_current_msec) > 0
            && !ngx_http_idempotency_cluster_expired(op))
        {
            op->next = NULL;
            *cl->waiting_tail = op;
            cl->waiting_tail = &op->next;
            continue;
        }

        ngx_http_idempotency_cluster_route(cl, op);
    }

    if (cl->waiting && !cl->retry_ev.timer_set) {
        ngx_add_timer(&cl->retry_ev, NGX_HTTP_IDEMPOTENCY_RETRY_MIN);
    }
}


/*
 * A reply from a node.  NGX_DONE: the op was taken (sent elsewhere or
 * waiting); else its handler gets the reply.
 */

static ngx_int_t
ngx_http_idempotency_cluster_reply(ngx_http_idempotency_node_t *node,
    ngx_http_idempotency_op_t *op, redisReply *reply)
{
    u_char                          *p;
    ngx_uint_t                       ask;
    ngx_http_idempotency_target_t   *redis;
    ngx_http_idempotency_cluster_t  *cl;

    redis = node->redis;
    cl = redis->cluster;

    /*
     * a node that left the map is closed once drained (a map may bring it
     * back: slots_done closes those it does not)
     */

    if (node->pending == 0 && node->open && !node->reset_ev.posted
        && op->handler != ngx_http_idempotency_cluster_slots_done
        && !((ngx_http_idempotency_cnode_t *) node)->master)
    {
        ngx_post_event(&node->reset_ev, &ngx_posted_events);
    }

    if (cl == NULL || op->buf == NULL || reply->type != REDIS_REPLY_ERROR
        || reply->str == NULL || redis->exiting)
    {
        return NGX_DECLINED;
    }

    p = (u_char *) reply->str;

    if (ngx_http_idempotency_reply_is(reply, "MOVED ")) {
        ask = 0;
        p += sizeof("MOVED ") - 1;

    } else if (ngx_http_idempotency_reply_is(reply, "ASK ")) {
        ask = 1;
        p += sizeof("ASK ") - 1;

    } else if (ngx_http_idempotency_reply_passing(reply, 0)) {
        return ngx_http_idempotency_cluster_again(cl, op, reply);

    } else {
        return NGX_DECLINED;
    }

    return ngx_http_idempotency_cluster_redirect(node, op, reply, p, ask);
}


/* a resharding, a failover, a restart: after a backoff */

static ngx_int_t
ngx_http_idempotency_cluster_again(ngx_http_idempotency_cluster_t *cl,
    ngx_http_idempotency_op_t *op, redisReply *reply)
{
    if (ngx_http_idempotency_reply_is(reply, "CLUSTERDOWN")) {
        ngx_http_idempotency_cluster_refresh(cl);
    }

    if (ngx_http_idempotency_cluster_expired(op)) {
        return NGX_DECLINED;
    }

    ngx_http_idempotency_cluster_wait(cl, op);
    return NGX_DONE;
}


/*
 * A MOVED or an ASK, p at what follows the word.  An invalid one, or one
 * redirect too many, goes to the op's handler; an endpoint not known yet
 * waits for a refresh.
 */

static ngx_int_t
ngx_http_idempotency_cluster_redirect(ngx_http_idempotency_node_t *node,
    ngx_http_idempotency_op_t *op, redisReply *reply, u_char *p,
    ngx_uint_t ask)
{
    u_char                          *last, *host, *colon;
    ngx_int_t                        slot, port;
    ngx_http_idempotency_cnode_t    *cn;
    ngx_http_idempotency_target_t   *redis;
    ngx_http_idempotency_cluster_t  *cl;

    redis = node->redis;
    cl = redis->cluster;

    last = (u_char *) reply->str + reply->len;

    /* "<slot> <host>:<port>"; the host may be empty, "?", or IPv6 */

    host = ngx_strlchr(p, last, ' ');
    colon = NULL;

    if (host) {
        slot = ngx_atoi(p, host - p);
        host++;

        for (p = last; p > host; p--) {
            if (p[-1] == ':') {
                colon = p - 1;
                break;
            }
        }

    } else {
        slot = NGX_ERROR;
    }

    if (slot == NGX_ERROR || slot >= NGX_HTTP_IDEMPOTENCY_SLOTS
        || colon == NULL)
    {
        ngx_log_error(NGX_LOG_ERR, redis->log, 0,
                      "idempotency: redis cluster \"%V\" sent an invalid "
                      "redirect: %*s", &redis->name,
                      (size_t) reply->len, reply->str);
        return NGX_DECLINED;
    }

    port = ngx_atoi(colon + 1, last - colon - 1);

    if (op->redirects++ >= NGX_HTTP_IDEMPOTENCY_REDIRECTS
        || (ask && op->asking))
    {
        ngx_log_error(NGX_LOG_ERR, redis->log, 0,
                      "idempotency: redis cluster \"%V\": too many "
                      "redirects, the last: %*s", &redis->name,
                      (size_t) reply->len, reply->str);
        return NGX_DECLINED;
    }

    cn = ngx_http_idempotency_cluster_node_at(cl, host, colon - host, port,
                                              node);

    if (cn == NULL) {
        /* "?": the endpoint is not known yet; or no resolver */
        ngx_http_idempotency_cluster_refresh(cl);

        if (ngx_http_idempotency_cluster_expired(op)) {
            return NGX_DECLINED;
        }

        ngx_http_idempotency_cluster_wait(cl, op);
        return NGX_DONE;
    }

    return ngx_http_idempotency_cluster_follow(cl, cn, op, slot, ask);
}


/*
 * The op goes to the node a redirect named: after an ASKING for an ASK,
 * and for a MOVED with the slot taken into the map at once
 */

static ngx_int_t
ngx_http_idempotency_cluster_follow(ngx_http_idempotency_cluster_t *cl,
    ngx_http_idempotency_cnode_t *cn, ngx_http_idempotency_op_t *op,
    ngx_int_t slot, ngx_uint_t ask)
{
    ngx_int_t                   rc;
    ngx_http_idempotency_op_t  *aop;

    ngx_http_idempotency_cluster_use(cn);

    op->asking = 0;

    if (ask) {
        /* ASKING is one-shot: it goes right before the command */

        aop = ngx_http_idempotency_op_alloc(cl->redis);
        if (aop == NULL) {
            return NGX_DECLINED;
        }

        aop->handler = ngx_http_idempotency_cluster_asked;

        rc = ngx_http_idempotency_cluster_send(&cn->node, aop,
                                   ngx_http_idempotency_asking_cmd.data,
                                   ngx_http_idempotency_asking_cmd.len);
        if (rc != NGX_OK) {
            ngx_http_idempotency_op_free(aop);
            ngx_http_idempotency_cluster_wait(cl, op);
            return NGX_DONE;
        }

        op->asking = 1;

    } else {
        /* at once for this slot, the rest of the map by a refresh */
        cl->slot_node[slot] = (uint16_t) cn->index;
        ngx_http_idempotency_cluster_refresh(cl);
    }

    rc = ngx_http_idempotency_cluster_send(&cn->node, op, op->buf,
                                           op->buf_len);

    if (rc == NGX_ERROR) {
        return NGX_DECLINED;
    }

    if (rc == NGX_DECLINED) {
        ngx_http_idempotency_cluster_wait(cl, op);
    }

    return NGX_DONE;
}


/* ASKING says OK; a refusal is an ACL without +asking: said once */

static void
ngx_http_idempotency_cluster_asked(ngx_http_idempotency_op_t *op,
    redisReply *reply)
{
    ngx_http_idempotency_cluster_t  *cl;

    cl = op->redis->cluster;

    if (reply == NULL || reply->type != REDIS_REPLY_ERROR || cl == NULL
        || cl->asking_refused)
    {
        return;
    }

    ngx_log_error(NGX_LOG_ERR, op->redis->log, 0,
                  "idempotency: redis cluster \"%V\" (%V) refused ASKING: "
                  "%*s (the ACL needs +asking)", &op->redis->name,
                  &op->node->addrs->name, (size_t) reply->len, reply->str);

    cl->asking_refused = 1;
}


/*
 * The op's connection is gone before its reply.  A claim goes again while
 * its request waits (its own token in the reply tells that the first one
 * won); a store or a release once (the finish script accepts a record that
 * is already there).  NGX_OK: taken.
 */

static ngx_int_t
ngx_http_idempotency_cluster_lost(ngx_http_idempotency_node_t *node,
    ngx_http_idempotency_op_t *op)
{
    ngx_http_idempotency_target_t   *redis;
    ngx_http_idempotency_cluster_t  *cl;

    redis = node->redis;
    cl = redis->cluster;

    if (cl == NULL || op->buf == NULL || redis->exiting || ngx_terminate) {
        return NGX_DECLINED;
    }

    if (op->on_reconnect ? op->data == NULL : op->resent) {
        return NGX_DECLINED;
    }

    op->resent = 1;

    ngx_http_idempotency_cluster_wait(cl, op);

    return NGX_OK;
}


/* a node's connection closed: is it to be opened again? */

static ngx_uint_t
ngx_http_idempotency_cluster_closed(ngx_http_idempotency_node_t *node)
{
    ngx_http_idempotency_cnode_t  *cn;

    cn = (ngx_http_idempotency_cnode_t *) node;

    if (!node->redis->exiting && !ngx_exiting && !ngx_terminate) {
        ngx_http_idempotency_redis_events.master_up(cn->metric, 0);
    }

    if (!cn->master) {
        return 0;
    }

    ngx_http_idempotency_cluster_refresh(cn->cluster);

    return 1;
}


/* a node's handshake is done: the target is up, and so is its master */

static void
ngx_http_idempotency_cluster_up(ngx_http_idempotency_node_t *node)
{
    ngx_http_idempotency_cnode_t  *cn;

    cn = (ngx_http_idempotency_cnode_t *) node;

    ngx_http_idempotency_target_up(node);
    ngx_http_idempotency_redis_events.master_up(cn->metric, 1);
}


static void
ngx_http_idempotency_cluster_load_script(ngx_http_idempotency_target_t *redis)
{
    ngx_uint_t                       i;
    ngx_http_idempotency_cluster_t  *cl;

    cl = redis->cluster;

    if (cl == NULL) {
        return;
    }

    for (i = 0; i < cl->nnodes; i++) {
        if (cl->nodes[i]->node.open) {
            ngx_http_idempotency_node_load_script(&cl->nodes[i]->node);
        }
    }
}


/* subscribe.c: the master of a slot per the map; NULL: not known, asked for */

ngx_http_idempotency_node_t *
ngx_http_idempotency_cluster_master(ngx_http_idempotency_target_t *redis,
    ngx_uint_t slot)
{
    ngx_uint_t                       idx;
    ngx_http_idempotency_cluster_t  *cl;

    cl = redis->cluster;

    if (cl == NULL || slot >= NGX_HTTP_IDEMPOTENCY_SLOTS) {
        return NULL;
    }

    idx = cl->slot_node[slot];

    if (idx == NGX_HTTP_IDEMPOTENCY_NO_NODE) {
        ngx_http_idempotency_cluster_refresh(cl);
        return NULL;
    }

    return &cl->nodes[idx]->node;
}


/*
 * A walk of the keys, master by master in the order of the lowest slot
 * each serves: the same in every worker with the same map, so that the
 * next page of a listing may be asked of another worker.  A master is
 * named by that slot; after a failover its replica, which took the slot,
 * goes on from the same SCAN cursor.
 */

static ngx_int_t
ngx_http_idempotency_cluster_walk(ngx_http_idempotency_target_t *redis,
    ngx_uint_t *at, ngx_http_idempotency_node_t **node)
{
    u_char                           seen[NGX_HTTP_IDEMPOTENCY_MAX_NODES];
    ngx_uint_t                       s, idx;
    ngx_http_idempotency_cluster_t  *cl;

    cl = redis->cluster;

    if (cl == NULL || redis->exiting) {
        return NGX_AGAIN;
    }

    if (!cl->known) {
        ngx_http_idempotency_cluster_refresh(cl);
        return NGX_AGAIN;
    }

    ngx_memzero(seen, sizeof(seen));

    for (s = 0; s < NGX_HTTP_IDEMPOTENCY_SLOTS; s++) {
        idx = cl->slot_node[s];

        if (idx == NGX_HTTP_IDEMPOTENCY_NO_NODE || seen[idx]) {
            continue;
        }

        seen[idx] = 1;

        if (s < *at) {
            continue;
        }

        *at = s;
        *node = &cl->nodes[idx]->node;

        if (!(*node)->open) {
            ngx_http_idempotency_cluster_use(cl->nodes[idx]);
            return NGX_AGAIN;
        }

        return NGX_OK;
    }

    return NGX_DONE;
}


/*
 * subscribe.c: a subscriber was told that a slot is elsewhere (a MOVED to
 * SSUBSCRIBE: "<slot> <host>:<port>", as commands are) or has left
 * (len 0: an unsolicited sunsubscribe): the map is asked for again, and
 * a MOVED is taken at once for its slot.
 */

void
ngx_http_idempotency_cluster_moved(ngx_http_idempotency_node_t *from,
    u_char *p, size_t len)
{
    u_char                          *last, *host, *colon;
    ngx_int_t                        slot, port;
    ngx_http_idempotency_cnode_t    *cn;
    ngx_http_idempotency_cluster_t  *cl;

    cl = from->redis->cluster;

    if (cl == NULL || from->redis->exiting) {
        return;
    }

    ngx_http_idempotency_cluster_refresh(cl);

    if (len == 0) {
        return;
    }

    last = p + len;
    host = ngx_strlchr(p, last, ' ');

    if (host == NULL) {
        return;
    }

    slot = ngx_atoi(p, host - p);
    host++;

    for (colon = last; colon > host && colon[-1] != ':'; colon--) {
        /* void */
    }

    if (slot == NGX_ERROR || slot >= NGX_HTTP_IDEMPOTENCY_SLOTS
        || colon == host)
    {
        return;
    }

    port = ngx_atoi(colon, last - colon);

    cn = ngx_http_idempotency_cluster_node_at(cl, host, colon - 1 - host,
                                              port, from);
    if (cn == NULL) {
        return;
    }

    cl->slot_node[slot] = (uint16_t) cn->index;
    ngx_http_idempotency_cluster_use(cn);
}


/* a node known by name is verified by it, unless a name is configured */

static ngx_str_t *
ngx_http_idempotency_cluster_tls_name(ngx_http_idempotency_node_t *node,
    ngx_uint_t *ip)
{
#if (NGX_SSL)
    if (node->host.len && node->redis->tls_conf.name.len == 0) {
        *ip = 0;
        return &node->host;
    }
#endif

    return NULL;
}


/*
 * A node's replies go through the router (redirect), its commands back to
 * it when the connection is lost, and a node that left the map is not
 * connected again (wanted)
 */

static ngx_http_idempotency_node_owner_t
    ngx_http_idempotency_cluster_owner = {
    NULL,                                  /* handshake */
    ngx_http_idempotency_cluster_up,
    NULL,                                  /* reply */
    ngx_http_idempotency_cluster_reply,
    ngx_http_idempotency_cluster_lost,
    ngx_http_idempotency_cluster_closed,
    ngx_http_idempotency_target_closed
};


ngx_http_idempotency_topology_t  ngx_http_idempotency_cluster_topology = {
    ngx_http_idempotency_cluster_conf_seeds,
    NULL,                                  /* tls */
    ngx_http_idempotency_cluster_tls_name,
    ngx_http_idempotency_cluster_init,
    ngx_http_idempotency_cluster_exit,
    ngx_http_idempotency_cluster_command,
    ngx_http_idempotency_cluster_load_script,
    ngx_http_idempotency_cluster_walk,
    &ngx_http_idempotency_cluster_owner,
    1,                                     /* nodes */
    0,                                     /* moves */
    0                                      /* tls_found */
};
