
/*
 * Copyright (C) The ngx_http_idempotency_module authors
 *
 * A Redis target in a worker, and the standalone topology.  The rest of the
 * module sees only targets: it starts and stops them, sends its commands
 * and loads its scripts through them, and a target hands each of these to
 * its topology's table, which knows where the nodes are.  The standalone
 * topology fills the table with one node, made when the worker starts and
 * freed when it exits.  Whatever the topology, a target's node is up and
 * closed here (its topology's owner table calls target_up and
 * target_closed).  What a node does with a command is node.c's.
 */


#include "ngx_http_idempotency_redis.h"


static void ngx_http_idempotency_no_event(
    ngx_http_idempotency_target_t *redis);
static void *ngx_http_idempotency_no_master_add(
    ngx_http_idempotency_target_t *redis, ngx_str_t *name);
static void ngx_http_idempotency_no_master_del(void *entry);
static void ngx_http_idempotency_no_master_up(void *entry, ngx_uint_t up);


/* a standalone node is up or closed as any target's */
static ngx_http_idempotency_node_owner_t
    ngx_http_idempotency_standalone_owner = {
    NULL,                                  /* handshake */
    ngx_http_idempotency_target_up,
    NULL,                                  /* reply */
    NULL,                                  /* redirect */
    NULL,                                  /* lost */
    NULL,                                  /* wanted */
    ngx_http_idempotency_target_closed
};


/* nobody listens until metrics_events.c does */
ngx_http_idempotency_redis_events_t  ngx_http_idempotency_redis_events = {
    ngx_http_idempotency_no_event,
    ngx_http_idempotency_no_event,
    ngx_http_idempotency_no_master_add,
    ngx_http_idempotency_no_master_del,
    ngx_http_idempotency_no_master_up
};


ngx_http_idempotency_topology_t  ngx_http_idempotency_standalone_topology = {
    ngx_http_idempotency_conn_conf,
    NULL,                                  /* tls */
    NULL,                                  /* tls_name */
    ngx_http_idempotency_standalone_init,
    ngx_http_idempotency_redis_node_exit,
    ngx_http_idempotency_standalone_command,
    ngx_http_idempotency_redis_node_load_script,
    NULL,                                  /* master */
    &ngx_http_idempotency_standalone_owner,
    0,                                     /* nodes */
    0,                                     /* moves */
    0                                      /* tls_found */
};


ngx_int_t
ngx_http_idempotency_redis_init(ngx_cycle_t *cycle,
    ngx_http_idempotency_target_t *redis)
{
    redis->log = cycle->log;

    /* only workers serve requests: not the cache manager nor the loader */

    if (ngx_process != NGX_PROCESS_WORKER
        && ngx_process != NGX_PROCESS_SINGLE)
    {
        return NGX_OK;
    }

    return redis->topology->init(cycle, redis);
}


/* one target, one node: its connection is made now */

ngx_int_t
ngx_http_idempotency_standalone_init(ngx_cycle_t *cycle,
    ngx_http_idempotency_target_t *redis)
{
    ngx_http_idempotency_node_t  *node;

    node = ngx_http_idempotency_redis_node(cycle, redis);
    if (node == NULL) {
        return NGX_ERROR;
    }

    ngx_http_idempotency_redis_connect(node);

    return NGX_OK;
}


ngx_http_idempotency_node_t *
ngx_http_idempotency_redis_node(ngx_cycle_t *cycle,
    ngx_http_idempotency_target_t *redis)
{
    ngx_http_idempotency_node_t  *node;

    node = ngx_calloc(sizeof(ngx_http_idempotency_node_t), cycle->log);
    if (node == NULL) {
        return NULL;
    }

    ngx_http_idempotency_node_init(node, redis, cycle->log,
                                   redis->topology->owner);

    redis->node = node;

    return node;
}


/*
 * What every target's node does when its handshake passed, whatever the
 * topology (whose up calls it): the target is up.  A subscriber's node is
 * no target's: it is not counted.
 */

void
ngx_http_idempotency_target_up(ngx_http_idempotency_node_t *node)
{
    ngx_http_idempotency_target_t *redis;

    redis = node->redis;

    if (redis->topology->nodes) {
        /* which node of the target */
        ngx_log_error(NGX_LOG_NOTICE, redis->log, 0,
                      "idempotency: connected to redis \"%V\" (%V)%s",
                      &redis->name, &node->addrs->name,
                      node->was_up ? " again" : "");

    } else {
        ngx_log_error(NGX_LOG_NOTICE, redis->log, 0,
                      "idempotency: connected to redis \"%V\"%s",
                      &redis->name, node->was_up ? " again" : "");
    }

    ngx_http_idempotency_redis_events.up(redis);
}


/*
 * And when its connection closed (after node.c answered its commands),
 * before what the topology's closed does: the target is down, unless the
 * node left a cluster's map, and the node connects again after its
 * backoff.
 */

void
ngx_http_idempotency_target_closed(ngx_http_idempotency_node_t *node)
{
    if (node->owner->wanted == NULL || node->owner->wanted(node)) {
        ngx_http_idempotency_redis_events.down(node->redis);
    }

    ngx_http_idempotency_node_schedule(node);
}


void
ngx_http_idempotency_redis_exit(ngx_http_idempotency_target_t *redis)
{
    redis->exiting = 1;

    if (redis->exit_handler) {
        redis->exit_handler(redis);
    }

    redis->topology->exit(redis);
}


void
ngx_http_idempotency_redis_node_exit(ngx_http_idempotency_target_t *redis)
{
    ngx_http_idempotency_node_t  *node;

    node = redis->node;

    if (node == NULL) {
        return;
    }

    if (node->open) {
        /* pending callbacks run with a NULL reply */
        ngx_http_idempotency_conn_close(node);
    }

    if (node->reconnect_ev.timer_set) {
        ngx_del_timer(&node->reconnect_ev);
    }

    ngx_http_idempotency_node_resend(node);

    ngx_http_idempotency_conn_free(node);
    ngx_free(node);

    redis->node = NULL;
}


/* also after a NOSCRIPT: SCRIPT FLUSH, or a failover to another node */

void
ngx_http_idempotency_redis_load_script(ngx_http_idempotency_target_t *redis)
{
    redis->topology->load_script(redis);
}


void
ngx_http_idempotency_redis_node_load_script(
    ngx_http_idempotency_target_t *redis)
{
    if (redis->node) {
        ngx_http_idempotency_node_load_script(redis->node);
    }
}


/*
 * The master a walk of the keys goes to at or after *at (store/scan.c):
 * the topology's, or the one node of a standalone or Sentinel target, at 0
 */

ngx_int_t
ngx_http_idempotency_redis_master(ngx_http_idempotency_target_t *redis,
    ngx_uint_t *at, ngx_http_idempotency_node_t **node)
{
    if (redis->topology->master) {
        return redis->topology->master(redis, at, node);
    }

    if (*at > 0) {
        return NGX_DONE;
    }

    *node = redis->node;

    return (*node && (*node)->open) ? NGX_OK : NGX_AGAIN;
}


/* on NGX_ERROR the op has been freed and no callback will come */

ngx_int_t
ngx_http_idempotency_redis_command(ngx_http_idempotency_op_t *op, int argc,
    const char **argv, const size_t *argvlen)
{
    return op->redis->topology->command(op, argc, argv, argvlen);
}


/*
 * The command the op keeps (op->buf, RESP, from resp.c), sent as a new
 * one: routed as any command is, kept again to be sent after a lost
 * connection.  A topology's command() takes no arguments for it.
 */

ngx_int_t
ngx_http_idempotency_redis_command_kept(ngx_http_idempotency_op_t *op)
{
    if (op->buf == NULL) {
        ngx_http_idempotency_op_free(op);
        return NGX_ERROR;
    }

    op->keep_bytes = 1;

    return op->redis->topology->command(op, 0, NULL, NULL);
}


ngx_int_t
ngx_http_idempotency_standalone_command(ngx_http_idempotency_op_t *op,
    int argc, const char **argv, const size_t *argvlen)
{
    ngx_http_idempotency_node_t  *node;

    node = op->redis->node;

    if (node == NULL) {
        ngx_http_idempotency_op_free(op);
        return NGX_ERROR;
    }

    return ngx_http_idempotency_node_command(node, op, argc, argv, argvlen);
}


static void
ngx_http_idempotency_no_event(ngx_http_idempotency_target_t *redis)
{
}


static void *
ngx_http_idempotency_no_master_add(ngx_http_idempotency_target_t *redis,
    ngx_str_t *name)
{
    return NULL;
}


static void
ngx_http_idempotency_no_master_del(void *entry)
{
}


static void
ngx_http_idempotency_no_master_up(void *entry, ngx_uint_t up)
{
}
