
/*
 * Copyright (C) The ngx_http_idempotency_module authors
 *
 * One pipelined connection (a node) per worker per target, as the commands
 * see it: the ops and their free list, the FIFO that matches replies to
 * commands, the commands parked with a lost connection and sent again on
 * the next one, nginx timers for every timeout (the watchdog, the connect
 * timeout, a reset outside of any reply handler), reconnect with backoff.
 * The bytes themselves are conn.c's, their format resp.c's and the
 * handshake handshake.c's; hiredis is only the RESP parser.
 */


#include "ngx_http_idempotency_redis.h"


static void ngx_http_idempotency_redis_unsolicited(
    ngx_http_idempotency_target_t *redis, redisReply *reply);
static void ngx_http_idempotency_connect_timeout(ngx_event_t *ev);
static void ngx_http_idempotency_reconnect(ngx_event_t *ev);
static void ngx_http_idempotency_reset_handler(ngx_event_t *ev);
static void ngx_http_idempotency_watchdog(ngx_event_t *ev);
static void ngx_http_idempotency_flush_handler(ngx_event_t *ev);


static ngx_http_idempotency_op_t  *ngx_http_idempotency_free_ops;

/* the layer above's ops begin with an op and may be larger: all are */
size_t  ngx_http_idempotency_op_size = sizeof(ngx_http_idempotency_op_t);


/*
 * A node's timers, and the owner its maker gives it, told of its life (a
 * cluster has one node per master)
 */

void
ngx_http_idempotency_node_init(ngx_http_idempotency_node_t *node,
    ngx_http_idempotency_target_t *redis, ngx_log_t *log,
    ngx_http_idempotency_node_owner_t *owner)
{
    node->redis = redis;
    node->owner = owner;
    node->backoff = NGX_HTTP_IDEMPOTENCY_BACKOFF_MIN;
    node->tail = &node->head;
    node->parked_tail = &node->parked;

    /*
     * connection-level timers are cancelable so that a gracefully exiting
     * worker does not wait for them; the watchdog is not: it bounds the
     * wait for the replies of stores still in flight
     */

    node->connect_ev.handler = ngx_http_idempotency_connect_timeout;
    node->connect_ev.data = node;
    node->connect_ev.log = log;
    node->connect_ev.cancelable = 1;

    node->reconnect_ev.handler = ngx_http_idempotency_reconnect;
    node->reconnect_ev.data = node;
    node->reconnect_ev.log = log;
    node->reconnect_ev.cancelable = 1;

    node->reset_ev.handler = ngx_http_idempotency_reset_handler;
    node->reset_ev.data = node;
    node->reset_ev.log = log;

    node->watchdog_ev.handler = ngx_http_idempotency_watchdog;
    node->watchdog_ev.data = node;
    node->watchdog_ev.log = log;

    node->flush_ev.handler = ngx_http_idempotency_flush_handler;
    node->flush_ev.data = node;
    node->flush_ev.log = log;

    node->ask_ev.handler = ngx_http_idempotency_ask_handler;
    node->ask_ev.data = node;
    node->ask_ev.log = log;
    node->ask_ev.cancelable = 1;
}


void
ngx_http_idempotency_redis_connect(ngx_http_idempotency_node_t *node)
{
    if (node->naddrs == 0 && node->host.len == 0
        && node->redis->naddrs == 0 && node->redis->host.len == 0)
    {
        /* no address known yet (a master not yet named by the Sentinels) */
        return;
    }

    if (ngx_http_idempotency_conn_open(node) != NGX_OK) {
        ngx_http_idempotency_node_resend(node);
        ngx_http_idempotency_node_schedule(node);
        return;
    }

    /* the handshake goes first, whatever queues behind it meanwhile */

    ngx_http_idempotency_redis_handshake(node);
    ngx_http_idempotency_node_resend(node);

    if (node->open) {
        ngx_http_idempotency_conn_start(node);
    }
}


/* a node is connected again after its backoff, if its owner still wants it */

void
ngx_http_idempotency_node_schedule(ngx_http_idempotency_node_t *node)
{
    if (node->redis->exiting || ngx_exiting || ngx_quit || ngx_terminate) {
        return;
    }

    /* a cluster node that left the slot map is not reconnected */

    if (node->owner->wanted && !node->owner->wanted(node)) {
        return;
    }

    if (!node->reconnect_ev.timer_set) {
        ngx_add_timer(&node->reconnect_ev, node->backoff);
    }

    node->backoff = ngx_min(node->backoff * 2,
                            NGX_HTTP_IDEMPOTENCY_BACKOFF_MAX);
}


ngx_http_idempotency_op_t *
ngx_http_idempotency_op_alloc(ngx_http_idempotency_target_t *redis)
{
    ngx_http_idempotency_op_t  *op;

    op = ngx_http_idempotency_free_ops;

    if (op) {
        ngx_http_idempotency_free_ops = op->next;

    } else {
        op = ngx_alloc(ngx_http_idempotency_op_size, redis->log);
        if (op == NULL) {
            return NULL;
        }
    }

    op->next = NULL;
    op->redis = redis;
    op->data = NULL;
    op->handler = NULL;
    op->node = NULL;
    op->rkey_len = 0;
    op->on_reconnect = 0;
    op->resent = 0;
    op->urgent = 0;
    op->block = 0;
    op->buf = NULL;
    op->deadline = 0;
    op->backoff = 0;
    op->redirects = 0;
    op->asking = 0;
    op->keep_bytes = 0;
    op->script = NULL;

    return op;
}


void
ngx_http_idempotency_op_free(ngx_http_idempotency_op_t *op)
{
    if (op->buf) {
        ngx_free(op->buf);
        op->buf = NULL;
    }

    op->next = ngx_http_idempotency_free_ops;
    ngx_http_idempotency_free_ops = op;
}


void
ngx_http_idempotency_ops_done(void)
{
    ngx_http_idempotency_op_t  *op;

    while (ngx_http_idempotency_free_ops) {
        op = ngx_http_idempotency_free_ops;
        ngx_http_idempotency_free_ops = op->next;
        ngx_free(op);
    }
}


/*
 * The command is formatted straight into the node's output buffer (hiredis's
 * own formatter, growing an sds, cost more than the rest of the claim) and
 * written with the others of this event loop iteration by a posted event.
 */

ngx_int_t
ngx_http_idempotency_node_command(ngx_http_idempotency_node_t *node,
    ngx_http_idempotency_op_t *op, int argc, const char **argv,
    const size_t *argvlen)
{
    u_char  *p, *start;
    size_t   len;

    /*
     * a store or release still goes on a connection whose reset is posted
     * (a timer that fired with the watchdog): the reset parks it for the
     * next connection, as any store or release in flight
     */

    if (!node->open || node->handshake_failed
        || (node->reset_ev.posted && !op->keep_bytes))
    {
        ngx_http_idempotency_op_free(op);
        return NGX_ERROR;
    }

    len = argv ? ngx_http_idempotency_format_len(argc, argvlen)
               : op->buf_len;

    if (op->keep_bytes && len >= NGX_HTTP_IDEMPOTENCY_BULK_MIN) {
        /* a large store: formatted once, kept, and written from there */

        if (argv) {
            op->buf = ngx_alloc(len, node->redis->log);
        }

        if (op->buf) {
            if (argv) {
                op->buf_len = ngx_http_idempotency_format(op->buf, argc, argv,
                                                          argvlen)
                              - op->buf;
            }

            if (ngx_http_idempotency_conn_write_now(node, op->buf,
                                                    op->buf_len)
                != NGX_OK)
            {
                ngx_http_idempotency_op_free(op);
                return NGX_ERROR;
            }

            ngx_http_idempotency_node_queue(node, op);

            return NGX_OK;
        }
    }

    start = ngx_http_idempotency_conn_reserve(node, len);
    if (start == NULL) {
        ngx_http_idempotency_op_free(op);
        return NGX_ERROR;
    }

    /* no arguments: the op's kept command (redis_command_kept()) */

    p = argv ? ngx_http_idempotency_format(start, argc, argv, argvlen)
             : ngx_cpymem(start, op->buf, op->buf_len);

    if (op->on_reconnect) {
        if ((size_t) (p - start) <= sizeof(op->cmd)) {
            op->cmd_len = p - start;
            ngx_memcpy(op->cmd, start, op->cmd_len);

        } else {
            op->on_reconnect = 0;
        }
    }

    if (op->keep_bytes && op->buf == NULL) {
        /* a store: the record must outlive its request to be sent again */

        op->buf = ngx_alloc(p - start, node->redis->log);

        if (op->buf) {
            op->buf_len = p - start;
            ngx_memcpy(op->buf, start, op->buf_len);

        } else {
            op->keep_bytes = 0;
            op->script = NULL;
        }
    }

    node->out_last = p;

    ngx_http_idempotency_node_queue(node, op);

    return NGX_OK;
}


void
ngx_http_idempotency_node_queue(ngx_http_idempotency_node_t *node,
    ngx_http_idempotency_op_t *op)
{
    op->node = node;
    op->next = NULL;
    *node->tail = op;
    node->tail = &op->next;

    /* until the connection is ready, the connect timer bounds the wait */

    if (node->pending++ == 0 && node->ready) {
        node->answered = ngx_current_msec;
        ngx_add_timer(&node->watchdog_ev, node->redis->timeout);
    }

    if (node->ready && !node->flush_ev.posted) {
        ngx_post_event(&node->flush_ev, &ngx_posted_events);
    }

    if (op->urgent) {
        ngx_http_idempotency_conn_push(node);
    }
}


/*
 * Claims that lost their connection before the reply go again, once, right
 * behind the handshake of the next one: a claim is safe to repeat (its
 * reply is then either the claim, or this request's own claim record when
 * the first one won).  Without an open node, or for a request that has
 * gone meanwhile, they get a NULL reply now.  Stores and releases go again
 * too, in their order (a staged record's SET before its finish): the finish
 * script accepts its own record already there.
 */

void
ngx_http_idempotency_node_resend(ngx_http_idempotency_node_t *node)
{
    u_char                     *p, *cmd;
    size_t                      len;
    ngx_http_idempotency_op_t  *op;

    while (node->parked) {
        op = node->parked;
        node->parked = op->next;

        p = NULL;
        cmd = op->keep_bytes ? op->buf : op->cmd;
        len = op->keep_bytes ? op->buf_len : op->cmd_len;

        if (node->open && !node->handshake_failed
            && ((op->on_reconnect && op->data) || op->keep_bytes))
        {
            p = ngx_http_idempotency_conn_reserve(node, len);
        }

        if (p == NULL) {
            op->handler(op, NULL);
            ngx_http_idempotency_op_free(op);
            continue;
        }

        node->out_last = ngx_cpymem(p, cmd, len);
        op->resent = 1;

        ngx_http_idempotency_node_queue(node, op);
    }

    node->parked_tail = &node->parked;
}


static void
ngx_http_idempotency_flush_handler(ngx_event_t *ev)
{
    ngx_http_idempotency_conn_flush(ev->data);
}


/*
 * A complete reply from conn.c: it answers the oldest command sent.  A reply
 * that no command asked for (a misbehaving proxy) resets the connection.
 * NGX_ERROR: the node is closed, conn.c must not touch it further.
 */

ngx_int_t
ngx_http_idempotency_node_reply(ngx_http_idempotency_node_t *node,
    redisReply *reply)
{
    ngx_http_idempotency_op_t  *op;

    if (node->owner->reply && node->owner->reply(node, reply) == NGX_DONE) {
        freeReplyObject(reply);
        return node->open ? NGX_OK : NGX_ERROR;
    }

    op = node->head;

    if (op == NULL) {
        if (!node->failed) {
            ngx_http_idempotency_redis_unsolicited(node->redis, reply);
            node->failed = 1;
        }

        freeReplyObject(reply);
        ngx_http_idempotency_conn_close(node);
        return NGX_ERROR;
    }

    node->head = op->next;

    if (node->head == NULL) {
        node->tail = &node->head;
    }

    if (--node->pending == 0) {
        if (node->watchdog_ev.timer_set) {
            ngx_del_timer(&node->watchdog_ev);
        }

    } else {
        /*
         * replies are flowing: the connection is alive; the watchdog
         * counts from here (a timer moved by less than 300 ms stays
         * where it was: nginx's timers are lazy)
         */
        node->answered = ngx_current_msec;
    }

    /* MOVED, ASK, TRYAGAIN...: the cluster router sends it again */

    if (node->owner->redirect && !node->handshake_failed
        && node->owner->redirect(node, op, reply) == NGX_DONE)
    {
        freeReplyObject(reply);
        return node->open ? NGX_OK : NGX_ERROR;
    }

    /* a script not known there (SCRIPT FLUSH, a failover): by EVAL */

    if (op->script && !node->handshake_failed
        && ngx_http_idempotency_reply_is(reply, "NOSCRIPT")
        && ngx_http_idempotency_node_noscript(node, op) == NGX_OK)
    {
        freeReplyObject(reply);
        return node->open ? NGX_OK : NGX_ERROR;
    }

    /*
     * commands pipelined behind a refused AUTH or SELECT ran as the wrong
     * user or in the wrong db: their replies do not count, nor do those of
     * the rest of the handshake
     */

    op->handler(op, node->handshake_failed ? NULL : reply);

    freeReplyObject(reply);
    ngx_http_idempotency_op_free(op);

    return node->open ? NGX_OK : NGX_ERROR;
}


/*
 * The connection is gone: every command sent or queued gets a NULL reply,
 * but a claim not yet sent twice, whose request waits, is parked for the
 * next connection.
 */

void
ngx_http_idempotency_node_closed(ngx_http_idempotency_node_t *node)
{
    ngx_http_idempotency_op_t  *op;

    while (node->head) {
        op = node->head;
        node->head = op->next;

        /* a cluster's ops go back to the router */

        if (node->owner->lost && node->owner->lost(node, op) == NGX_OK) {
            continue;
        }

        if (((op->on_reconnect && op->data) || op->keep_bytes) && !op->resent
            && !node->redis->exiting && !ngx_exiting && !ngx_terminate)
        {
            op->next = NULL;
            *node->parked_tail = op;
            node->parked_tail = &op->next;
            continue;
        }

        op->handler(op, NULL);
        ngx_http_idempotency_op_free(op);
    }

    node->tail = &node->head;
    node->pending = 0;
    node->up = 0;

    /* the next connection's handshake asks everything again */

    node->ask = 0;
    node->ask_backoff = 0;

    if (node->ask_ev.timer_set) {
        ngx_del_timer(&node->ask_ev);
    }

    if (node->watchdog_ev.timer_set) {
        ngx_del_timer(&node->watchdog_ev);
    }

    if (node->reset_ev.posted) {
        ngx_delete_posted_event(&node->reset_ev);
    }

    /* whether and when it connects again is its owner's to say */

    if (node->owner->closed) {
        node->owner->closed(node);
    }
}


/* a stalled connection is torn down outside of any reply handler */

void
ngx_http_idempotency_redis_reset(ngx_http_idempotency_target_t *redis)
{
    /* a cluster's nodes have their own watchdogs */

    if (redis->node) {
        ngx_http_idempotency_node_reset(redis->node);
    }
}


void
ngx_http_idempotency_node_reset(ngx_http_idempotency_node_t *node)
{
    if (node->open && !node->reset_ev.posted) {
        ngx_post_event(&node->reset_ev, &ngx_posted_events);
    }
}


static void
ngx_http_idempotency_reset_handler(ngx_event_t *ev)
{
    ngx_http_idempotency_node_t  *node = ev->data;

    if (node->open) {
        ngx_http_idempotency_conn_close(node);
    }
}


static void
ngx_http_idempotency_watchdog(ngx_event_t *ev)
{
    ngx_http_idempotency_node_t  *node = ev->data;

    ngx_msec_t  limit, waited;

    if (node->pending == 0 || !node->open) {
        return;
    }

    /*
     * Armed for the timeout, it measures when it fires: from the last
     * answer, allowing the reply at the head the time the server may hold
     * it (a WAIT while a replica cannot acknowledge; Redis serves such a
     * timeout from its cron, up to 1000/hz ms late).
     */

    limit = node->redis->timeout + (node->head ? node->head->block : 0);
    waited = ngx_current_msec - node->answered;

    if (waited < limit) {
        ngx_add_timer(ev, limit - waited);
        return;
    }

    ngx_log_error(NGX_LOG_ERR, node->redis->log, 0,
                  "idempotency: redis \"%V\" did not answer within %M ms, "
                  "reconnecting", &node->redis->name, waited);

    node->failed = 1;

    ngx_http_idempotency_node_reset(node);
}


static void
ngx_http_idempotency_redis_unsolicited(ngx_http_idempotency_target_t *redis,
    redisReply *reply)
{
    size_t   len;
    char    *str;

    /* an error reply may be "max number of clients reached" or LOADING */

    if ((reply->type == REDIS_REPLY_ERROR
         || reply->type == REDIS_REPLY_STATUS
         || reply->type == REDIS_REPLY_STRING)
        && reply->str)
    {
        str = reply->str;
        len = ngx_min((size_t) reply->len, 64);

    } else {
        str = "";
        len = 0;
    }

    ngx_log_error(NGX_LOG_ERR, redis->log, 0,
                  "idempotency: redis \"%V\" sent a reply to no command "
                  "(type %d \"%*s\"), reconnecting",
                  &redis->name, reply->type, len, str);
}


/* resolving, connecting or the TLS handshake took too long */

static void
ngx_http_idempotency_connect_timeout(ngx_event_t *ev)
{
    ngx_http_idempotency_node_t  *node = ev->data;

    if (!node->failed) {
        ngx_log_error(NGX_LOG_ERR, node->redis->log, NGX_ETIMEDOUT,
                      "idempotency: timed out %s redis \"%V\"",
                      node->resolving ? "resolving"
                      : node->connected ? "in the TLS handshake with"
                      : "connecting to", &node->redis->name);
        node->failed = 1;
    }

    /* the next attempt tries the next address */

    node->addr++;

    if (node->open) {
        ngx_http_idempotency_conn_close(node);
    }
}


static void
ngx_http_idempotency_reconnect(ngx_event_t *ev)
{
    ngx_http_idempotency_node_t  *node = ev->data;

    if (node->redis->exiting || ngx_exiting || ngx_quit || ngx_terminate
        || node->open)
    {
        return;
    }

    ngx_http_idempotency_redis_connect(node);
}
