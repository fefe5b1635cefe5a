
/*
 * Copyright (C) The ngx_http_idempotency_module authors
 *
 * The commands of one Redis target: one pipelined connection (a node) per
 * worker per target, its handshake, the FIFO that matches replies to
 * commands, nginx timers for every timeout, reconnect with backoff.  The
 * bytes themselves are conn.c's; hiredis is only the RESP parser.
 */


#include "ngx_http_idempotency_redis.h"


#define NGX_HTTP_IDEMPOTENCY_BACKOFF_MIN  10
#define NGX_HTTP_IDEMPOTENCY_BACKOFF_MAX  500

/*
 * What the handshake asks again on the same connection (INFO, SCRIPT LOAD):
 * soon while the server loads its data set or is busy, seldom while it
 * forbids it to the module's user, so that an ACL changed back, or a
 * renamed command restored, is seen without a reload
 */
#define NGX_HTTP_IDEMPOTENCY_ASK_MIN            50
#define NGX_HTTP_IDEMPOTENCY_ASK_MAX            1000
#define NGX_HTTP_IDEMPOTENCY_ASK_FORBIDDEN_MIN  1000
#define NGX_HTTP_IDEMPOTENCY_ASK_FORBIDDEN_MAX  10000

#define NGX_HTTP_IDEMPOTENCY_ASK_INFO           1
#define NGX_HTTP_IDEMPOTENCY_ASK_SCRIPT         2


static void ngx_http_idempotency_redis_schedule(
    ngx_http_idempotency_node_t *node);
static void ngx_http_idempotency_redis_handshake(
    ngx_http_idempotency_node_t *node);
static void ngx_http_idempotency_node_resend(ngx_http_idempotency_node_t *node);
static void ngx_http_idempotency_node_reset(ngx_http_idempotency_node_t *node);
static void ngx_http_idempotency_handshake_done(ngx_http_idempotency_op_t *op,
    redisReply *reply);
static void ngx_http_idempotency_setname_done(ngx_http_idempotency_op_t *op,
    redisReply *reply);
static void ngx_http_idempotency_script_done(ngx_http_idempotency_op_t *op,
    redisReply *reply);
static ngx_int_t ngx_http_idempotency_node_info(
    ngx_http_idempotency_node_t *node);
static void ngx_http_idempotency_info_done(ngx_http_idempotency_op_t *op,
    redisReply *reply);
static void ngx_http_idempotency_node_ask(ngx_http_idempotency_node_t *node,
    ngx_uint_t what, ngx_uint_t forbidden);
static void ngx_http_idempotency_ask_handler(ngx_event_t *ev);
static ngx_uint_t ngx_http_idempotency_redis_busy(redisReply *reply);
static ngx_uint_t ngx_http_idempotency_info_field(u_char *p, u_char *last,
    char *name, ngx_str_t *value);
static ngx_int_t ngx_http_idempotency_node_noscript(
    ngx_http_idempotency_node_t *node, ngx_http_idempotency_op_t *op);
static void ngx_http_idempotency_redis_unsolicited(
    ngx_http_idempotency_redis_t *redis, redisReply *reply);
static void ngx_http_idempotency_connect_timeout(ngx_event_t *ev);
static void ngx_http_idempotency_reconnect(ngx_event_t *ev);
static void ngx_http_idempotency_reset_handler(ngx_event_t *ev);
static void ngx_http_idempotency_watchdog(ngx_event_t *ev);
static void ngx_http_idempotency_flush_handler(ngx_event_t *ev);
static u_char *ngx_http_idempotency_format_size(u_char *p, size_t n);


static void ngx_http_idempotency_no_event(
    ngx_http_idempotency_redis_t *redis);
static void *ngx_http_idempotency_no_master_add(
    ngx_http_idempotency_redis_t *redis, ngx_str_t *name);
static void ngx_http_idempotency_no_master_del(void *entry);
static void ngx_http_idempotency_no_master_up(void *entry, ngx_uint_t up);


static ngx_http_idempotency_op_t  *ngx_http_idempotency_free_ops;

/* the layer above's ops begin with an op and may be larger: all are */
size_t  ngx_http_idempotency_op_size = sizeof(ngx_http_idempotency_op_t);

/* the scripts every connection loads ahead of its commands */
ngx_str_t   *ngx_http_idempotency_redis_scripts;
ngx_uint_t   ngx_http_idempotency_redis_nscripts;

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
    NULL,                                  /* handshake */
    NULL,                                  /* up */
    NULL,                                  /* reply */
    NULL,                                  /* redirect */
    NULL,                                  /* lost */
    NULL,                                  /* wanted */
    NULL,                                  /* closed */
    0,                                     /* nodes */
    0,                                     /* moves */
    0                                      /* tls_found */
};


ngx_int_t
ngx_http_idempotency_redis_init(ngx_cycle_t *cycle,
    ngx_http_idempotency_redis_t *redis)
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
    ngx_http_idempotency_redis_t *redis)
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
    ngx_http_idempotency_redis_t *redis)
{
    ngx_http_idempotency_node_t  *node;

    node = ngx_calloc(sizeof(ngx_http_idempotency_node_t), cycle->log);
    if (node == NULL) {
        return NULL;
    }

    ngx_http_idempotency_node_init(node, redis, cycle->log);

    redis->node = node;

    return node;
}


/* a node's timers; a cluster has one node per master */

void
ngx_http_idempotency_node_init(ngx_http_idempotency_node_t *node,
    ngx_http_idempotency_redis_t *redis, ngx_log_t *log)
{
    node->redis = redis;
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
ngx_http_idempotency_redis_exit(ngx_http_idempotency_redis_t *redis)
{
    redis->exiting = 1;

    if (redis->exit_handler) {
        redis->exit_handler(redis);
    }

    redis->topology->exit(redis);
}


void
ngx_http_idempotency_redis_node_exit(ngx_http_idempotency_redis_t *redis)
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
        ngx_http_idempotency_redis_schedule(node);
        return;
    }

    /* the handshake goes first, whatever queues behind it meanwhile */

    ngx_http_idempotency_redis_handshake(node);
    ngx_http_idempotency_node_resend(node);

    if (node->open) {
        ngx_http_idempotency_conn_start(node);
    }
}


/*
 * AUTH, SELECT, CLIENT SETNAME and SCRIPT LOAD are pipelined ahead of every
 * request; the reply to CLIENT SETNAME tells that AUTH and SELECT passed
 */

static void
ngx_http_idempotency_redis_handshake(ngx_http_idempotency_node_t *node)
{
    int                            argc;
    u_char                         db[NGX_INT_T_LEN];
    u_char                         name[sizeof("nginx-idempotency-")
                                        + NGX_INT64_LEN];
    size_t                         argvlen[3];
    const char                    *argv[3];
    ngx_http_idempotency_op_t     *op;
    ngx_http_idempotency_redis_t  *redis;

    redis = node->redis;

    if (redis->password.len) {
        argc = 0;
        ngx_http_idempotency_arg(argv, argvlen, argc++, "AUTH");

        if (redis->user.len) {
            argv[argc] = (const char *) redis->user.data;
            argvlen[argc++] = redis->user.len;
        }

        argv[argc] = (const char *) redis->password.data;
        argvlen[argc++] = redis->password.len;

        op = ngx_http_idempotency_op_alloc(redis);
        if (op == NULL) {
            return;
        }

        op->handler = ngx_http_idempotency_handshake_done;

        if (ngx_http_idempotency_node_command(node, op, argc, argv, argvlen)
            != NGX_OK)
        {
            return;
        }
    }

    if (redis->db) {
        ngx_http_idempotency_arg(argv, argvlen, 0, "SELECT");
        argv[1] = (const char *) db;
        argvlen[1] = ngx_sprintf(db, "%ui", redis->db) - db;

        op = ngx_http_idempotency_op_alloc(redis);
        if (op == NULL) {
            return;
        }

        op->handler = ngx_http_idempotency_handshake_done;

        if (ngx_http_idempotency_node_command(node, op, 2, argv, argvlen)
            != NGX_OK)
        {
            return;
        }
    }

    ngx_http_idempotency_arg(argv, argvlen, 0, "CLIENT");
    ngx_http_idempotency_arg(argv, argvlen, 1, "SETNAME");
    argv[2] = (const char *) name;
    argvlen[2] = ngx_sprintf(name, "nginx-idempotency-%P", ngx_pid) - name;

    op = ngx_http_idempotency_op_alloc(redis);
    if (op == NULL) {
        return;
    }

    op->handler = ngx_http_idempotency_setname_done;

    if (ngx_http_idempotency_node_command(node, op, 3, argv, argvlen)
        != NGX_OK)
    {
        return;
    }

    if (node->subscriber) {
        /* a subscriber runs no scripts */
        return;
    }

    if (redis->topology->handshake
        && redis->topology->handshake(node) != NGX_OK)
    {
        /* a Sentinel has no scripts */
        return;
    }

    if (ngx_http_idempotency_node_info(node) != NGX_OK) {
        return;
    }

    ngx_http_idempotency_node_load_script(node);
}


/* which server, for the commands the store may use (store/claim.c) */

static ngx_int_t
ngx_http_idempotency_node_info(ngx_http_idempotency_node_t *node)
{
    size_t                      argvlen[2];
    const char                 *argv[2];
    ngx_http_idempotency_op_t  *op;

    ngx_http_idempotency_arg(argv, argvlen, 0, "INFO");
    ngx_http_idempotency_arg(argv, argvlen, 1, "server");

    op = ngx_http_idempotency_op_alloc(node->redis);
    if (op == NULL) {
        return NGX_ERROR;
    }

    op->handler = ngx_http_idempotency_info_done;

    return ngx_http_idempotency_node_command(node, op, 2, argv, argvlen);
}


/*
 * "valkey_version:8.1.1" (Valkey also says redis_version:7.2.4, for
 * clients that know only Redis), else "redis_version:7.0.15".  A target
 * keeps the lowest version its nodes said: a cluster in a rolling upgrade
 * is as old as its oldest node.  An error (BUSY, or INFO forbidden to the
 * module's user) is asked again later; meanwhile the version stays what it
 * was, or unknown.
 */

static void
ngx_http_idempotency_info_done(ngx_http_idempotency_op_t *op,
    redisReply *reply)
{
    u_char                        *p, *last;
    ngx_str_t                      v;
    ngx_uint_t                     i, n, part, version, valkey, forbidden;
    ngx_http_idempotency_redis_t  *redis;

    redis = op->redis;

    if (reply == NULL) {
        return;
    }

    if (reply->type == REDIS_REPLY_ERROR) {
        forbidden = ngx_http_idempotency_redis_forbidden(reply);
        ngx_http_idempotency_node_ask(op->node, NGX_HTTP_IDEMPOTENCY_ASK_INFO,
                                      forbidden);
        return;
    }

    if (reply->type != REDIS_REPLY_STRING) {
        return;
    }

    p = (u_char *) reply->str;
    last = p + reply->len;

    valkey = ngx_http_idempotency_info_field(p, last, "valkey_version:", &v);

    if (!valkey && !ngx_http_idempotency_info_field(p, last,
                                                    "redis_version:", &v))
    {
        return;
    }

    /* "X.Y.Z": each part below 100 */

    version = 0;
    part = 0;
    n = 0;

    for (i = 0; i <= v.len; i++) {
        if (i < v.len && v.data[i] >= '0' && v.data[i] <= '9') {
            part = part * 10 + v.data[i] - '0';

            if (part > 99) {
                return;
            }

            continue;
        }

        if (i < v.len && v.data[i] != '.') {
            break;
        }

        version = version * 100 + part;
        part = 0;

        if (++n == 3) {
            break;
        }
    }

    if (n != 3 || version == 0) {
        return;
    }

    if (redis->server_version) {
        /*
         * a mix of servers: the oldest decides, and Redis over Valkey; a
         * mix of both kinds has no compare-and-delete common to all
         */

        if (valkey != redis->valkey) {
            redis->mixed = 1;
        }

        valkey = valkey && redis->valkey;
        version = ngx_min(version, redis->server_version);

        if (version == redis->server_version && valkey == redis->valkey) {
            return;
        }

        ngx_log_error(NGX_LOG_NOTICE, redis->log, 0,
                      "idempotency: redis \"%V\" has a node running %V",
                      &redis->name, &v);

    }

    redis->server_version = version;
    redis->valkey = valkey;
    redis->server_len = ngx_snprintf(redis->server, sizeof(redis->server),
                                     "%s %ui.%ui.%ui",
                                     valkey ? "valkey" : "redis",
                                     version / 10000, version / 100 % 100,
                                     version % 100)
                        - redis->server;
}


/* the value of a "name:value" line of INFO, up to its CRLF */

static ngx_uint_t
ngx_http_idempotency_info_field(u_char *p, u_char *last, char *name,
    ngx_str_t *value)
{
    u_char  *q;
    size_t   len;

    len = ngx_strlen(name);

    while (p < last) {
        q = ngx_strlchr(p, last, LF);

        if (q == NULL) {
            q = last;
        }

        if ((size_t) (q - p) > len && ngx_strncmp(p, name, len) == 0) {
            value->data = p + len;
            value->len = q - value->data;

            if (value->len && value->data[value->len - 1] == CR) {
                value->len--;
            }

            return value->len != 0;
        }

        p = q + 1;
    }

    return 0;
}


/* also after a NOSCRIPT: SCRIPT FLUSH, or a failover to another node */

void
ngx_http_idempotency_redis_load_script(ngx_http_idempotency_redis_t *redis)
{
    redis->topology->load_script(redis);
}


void
ngx_http_idempotency_redis_node_load_script(
    ngx_http_idempotency_redis_t *redis)
{
    if (redis->node) {
        ngx_http_idempotency_node_load_script(redis->node);
    }
}


void
ngx_http_idempotency_node_load_script(ngx_http_idempotency_node_t *node)
{
    size_t                      argvlen[3];
    ngx_str_t                  *script;
    ngx_uint_t                  i;
    const char                 *argv[3];
    ngx_http_idempotency_op_t  *op;

    ngx_http_idempotency_arg(argv, argvlen, 0, "SCRIPT");
    ngx_http_idempotency_arg(argv, argvlen, 1, "LOAD");

    for (i = 0; i < ngx_http_idempotency_redis_nscripts; i++) {
        script = &ngx_http_idempotency_redis_scripts[i];

        argv[2] = (const char *) script->data;
        argvlen[2] = script->len;

        op = ngx_http_idempotency_op_alloc(node->redis);
        if (op == NULL) {
            return;
        }

        op->handler = ngx_http_idempotency_script_done;

        if (ngx_http_idempotency_node_command(node, op, 3, argv, argvlen)
            != NGX_OK)
        {
            return;
        }
    }
}


/*
 * A refused AUTH leaves the connection open as the default user: drop it,
 * and the replies of whatever was pipelined behind it.  The backoff goes on
 * growing as for a refused connect, and the refusal is logged once.  A
 * server busy with a script (BUSY, also to SELECT and CLIENT SETNAME) or
 * not a usable master yet is no refusal: it is said at warn, and the next
 * connection tries again the same way.
 */

static void
ngx_http_idempotency_handshake_done(ngx_http_idempotency_op_t *op,
    redisReply *reply)
{
    ngx_http_idempotency_node_t   *node;
    ngx_http_idempotency_redis_t  *redis;

    redis = op->redis;
    node = op->node;

    if (reply == NULL || reply->type != REDIS_REPLY_ERROR) {
        return;
    }

    if (!node->refused) {
        if (ngx_http_idempotency_redis_busy(reply)) {
            ngx_log_error(NGX_LOG_WARN, redis->log, 0,
                          "idempotency: redis \"%V\" is not ready: %*s; "
                          "connecting again", &redis->name,
                          (size_t) ngx_min(reply->len, 128), reply->str);

        } else {
            ngx_log_error(NGX_LOG_ERR, redis->log, 0,
                          "idempotency: redis \"%V\" refused the handshake: "
                          "%*s", &redis->name,
                          (size_t) ngx_min(reply->len, 128), reply->str);
        }

        node->refused = 1;
    }

    node->failed = 1;
    node->handshake_failed = 1;
    ngx_http_idempotency_node_reset(node);
}


/*
 * Not being allowed to name the connection (an ACL, a renamed command) is
 * harmless, and means AUTH and SELECT have passed.  Any other error, such
 * as "max number of clients reached" sent on accept to a connection
 * without AUTH or SELECT, or BUSY, is a failed handshake.
 */

static void
ngx_http_idempotency_setname_done(ngx_http_idempotency_op_t *op,
    redisReply *reply)
{
    ngx_http_idempotency_node_t   *node;
    ngx_http_idempotency_redis_t  *redis;

    redis = op->redis;
    node = op->node;

    if (reply == NULL) {
        return;
    }

    if (reply->type == REDIS_REPLY_ERROR) {
        if (!ngx_http_idempotency_redis_forbidden(reply)) {
            ngx_http_idempotency_handshake_done(op, reply);
            return;
        }

        ngx_log_error(NGX_LOG_INFO, redis->log, 0,
                      "idempotency: redis \"%V\" refused CLIENT SETNAME: %*s",
                      &redis->name, (size_t) ngx_min(reply->len, 128),
                      reply->str);
    }

    if (node->subscriber) {
        /* subscribe.c's subscriber: not what redis_up counts */
        node->up_handler(node);
        return;
    }

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

    if (redis->topology->up) {
        redis->topology->up(node);
    }

    ngx_http_idempotency_redis_events.up(redis);

    node->up = 1;
    node->was_up = 1;
    node->failed = 0;
    node->refused = 0;
    node->backoff = NGX_HTTP_IDEMPOTENCY_BACKOFF_MIN;
}


/*
 * A refused SCRIPT LOAD is no reason to drop the connection: claims do not
 * need the scripts on Redis >= 7 (SET NX GET), and a finish sends a script
 * it does not find by its text.  Only a permission error (an ACL without
 * scripting, a renamed command) says scripting is forbidden, for the layer
 * above to decide what it may claim (store/claim.c), and even that is asked
 * again, seldom.  Anything else (LOADING after a restart, BUSY, a replica
 * that lost its master) will pass: the scripts are loaded again soon, and
 * nothing is concluded from it.
 */

static void
ngx_http_idempotency_script_done(ngx_http_idempotency_op_t *op,
    redisReply *reply)
{
    ngx_uint_t                     forbidden;
    ngx_http_idempotency_node_t   *node;
    ngx_http_idempotency_redis_t  *redis;

    redis = op->redis;
    node = op->node;

    if (reply == NULL) {
        /* the connection is gone: the next one loads them */
        return;
    }

    if (reply->type != REDIS_REPLY_ERROR) {
        if (redis->script_refused) {
            ngx_log_error(NGX_LOG_NOTICE, redis->log, 0,
                          "idempotency: redis \"%V\" allows scripting again",
                          &redis->name);
            redis->script_refused = 0;

        } else if (node->ask_logged) {
            ngx_log_error(NGX_LOG_NOTICE, redis->log, 0,
                          "idempotency: redis \"%V\" loaded the scripts",
                          &redis->name);
        }

        node->ask_logged = 0;
        node->ask_backoff = 0;
        return;
    }

    forbidden = ngx_http_idempotency_redis_forbidden(reply);

    if (forbidden) {
        if (!redis->script_refused) {
            ngx_log_error(NGX_LOG_WARN, redis->log, 0,
                          "idempotency: redis \"%V\" refused SCRIPT LOAD: "
                          "%*s (scripting forbidden to the module's user; "
                          "asked again every %M s)", &redis->name,
                          (size_t) ngx_min(reply->len, 200), reply->str,
                          (ngx_msec_t)
                          NGX_HTTP_IDEMPOTENCY_ASK_FORBIDDEN_MAX / 1000);
            redis->script_refused = 1;
        }

    } else if (!node->ask_logged && !redis->script_refused) {
        ngx_log_error(NGX_LOG_WARN, redis->log, 0,
                      "idempotency: redis \"%V\" cannot load the scripts "
                      "yet: %*s; trying again", &redis->name,
                      (size_t) ngx_min(reply->len, 200), reply->str);
        node->ask_logged = 1;
    }

    ngx_http_idempotency_node_ask(node, NGX_HTTP_IDEMPOTENCY_ASK_SCRIPT,
                                  forbidden);
}


/*
 * What the handshake asked is asked again on the same connection after a
 * backoff: a short one, doubling up to a second, for what will pass; at
 * least a second, up to ten, for what is forbidden.  The timer never holds
 * a worker's exit, and goes with the connection.
 */

static void
ngx_http_idempotency_node_ask(ngx_http_idempotency_node_t *node,
    ngx_uint_t what, ngx_uint_t forbidden)
{
    ngx_msec_t  min, max;

    if (node->redis->exiting || ngx_exiting || ngx_quit || ngx_terminate) {
        return;
    }

    node->ask |= what;

    if (node->ask_ev.timer_set) {
        return;
    }

    if (forbidden) {
        min = NGX_HTTP_IDEMPOTENCY_ASK_FORBIDDEN_MIN;
        max = NGX_HTTP_IDEMPOTENCY_ASK_FORBIDDEN_MAX;

    } else {
        min = NGX_HTTP_IDEMPOTENCY_ASK_MIN;
        max = NGX_HTTP_IDEMPOTENCY_ASK_MAX;
    }

    node->ask_backoff = ngx_min(ngx_max(node->ask_backoff * 2, min), max);

    ngx_add_timer(&node->ask_ev, node->ask_backoff);
}


static void
ngx_http_idempotency_ask_handler(ngx_event_t *ev)
{
    ngx_http_idempotency_node_t  *node = ev->data;

    ngx_uint_t  ask;

    ask = node->ask;
    node->ask = 0;

    if (node->redis->exiting || ngx_exiting || ngx_quit || ngx_terminate
        || !node->open || node->handshake_failed)
    {
        return;
    }

    if ((ask & NGX_HTTP_IDEMPOTENCY_ASK_INFO)
        && ngx_http_idempotency_node_info(node) != NGX_OK)
    {
        return;
    }

    if (ask & NGX_HTTP_IDEMPOTENCY_ASK_SCRIPT) {
        ngx_http_idempotency_node_load_script(node);
    }
}


/*
 * A permission error: NOPERM (an ACL), or a command the server does not
 * know (renamed or disabled, a proxy that does not pass it).  Nothing
 * else means "forbidden": LOADING, BUSY, MASTERDOWN, TRYAGAIN pass.
 */

ngx_uint_t
ngx_http_idempotency_redis_forbidden(redisReply *reply)
{
    size_t  len;
    char   *p;

    if (reply->type != REDIS_REPLY_ERROR || reply->str == NULL) {
        return 0;
    }

    p = reply->str;
    len = reply->len;

    return ngx_http_idempotency_reply_is(reply, "NOPERM")
           || (len >= 12 && ngx_strncasecmp((u_char *) p,
                                            (u_char *) "ERR unknown ", 12)
                            == 0);
}


/* a server that will answer soon: loading, busy, or not a master yet */

static ngx_uint_t
ngx_http_idempotency_redis_busy(redisReply *reply)
{
    size_t       len, n;
    ngx_uint_t   i;

    static char  *codes[] = {
        "LOADING", "BUSY", "MASTERDOWN", "TRYAGAIN", "CLUSTERDOWN"
    };

    len = reply->len;

    for (i = 0; i < sizeof(codes) / sizeof(codes[0]); i++) {
        n = ngx_strlen(codes[i]);

        if (len >= n && ngx_strncmp(reply->str, codes[i], n) == 0
            && (len == n || reply->str[n] == ' '))
        {
            return 1;
        }
    }

    return 0;
}


static void
ngx_http_idempotency_redis_schedule(ngx_http_idempotency_node_t *node)
{
    if (node->redis->exiting || ngx_exiting || ngx_quit || ngx_terminate) {
        return;
    }

    /*
     * a cluster node that left the slot map is not reconnected;
     * subscribe.c's subscribers are no cluster nodes
     */

    if (!node->subscriber && node->redis->topology->wanted
        && !node->redis->topology->wanted(node))
    {
        return;
    }

    if (!node->reconnect_ev.timer_set) {
        ngx_add_timer(&node->reconnect_ev, node->backoff);
    }

    node->backoff = ngx_min(node->backoff * 2,
                            NGX_HTTP_IDEMPOTENCY_BACKOFF_MAX);
}




ngx_http_idempotency_op_t *
ngx_http_idempotency_op_alloc(ngx_http_idempotency_redis_t *redis)
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
    op->resend = 0;
    op->resent = 0;
    op->urgent = 0;
    op->block = 0;
    op->buf = NULL;
    op->deadline = 0;
    op->backoff = 0;
    op->redirects = 0;
    op->asking = 0;
    op->again = 0;
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
 * The master a walk of the keys goes to at or after *at (store/scan.c):
 * the topology's, or the one node of a standalone or Sentinel target, at 0
 */

ngx_int_t
ngx_http_idempotency_redis_master(ngx_http_idempotency_redis_t *redis,
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
        || (node->reset_ev.posted && !op->again))
    {
        ngx_http_idempotency_op_free(op);
        return NGX_ERROR;
    }

    len = ngx_http_idempotency_format_len(argc, argvlen);

    if (op->again && len >= NGX_HTTP_IDEMPOTENCY_BULK_MIN) {
        /* a large store: formatted once, kept, and written from there */

        op->buf = ngx_alloc(len, node->redis->log);

        if (op->buf) {
            op->buf_len = ngx_http_idempotency_format(op->buf, argc, argv,
                                                      argvlen)
                          - op->buf;

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

    p = ngx_http_idempotency_format(start, argc, argv, argvlen);

    if (op->resend) {
        if ((size_t) (p - start) <= sizeof(op->cmd)) {
            op->cmd_len = p - start;
            ngx_memcpy(op->cmd, start, op->cmd_len);

        } else {
            op->resend = 0;
        }
    }

    if (op->again && op->buf == NULL) {
        /* a store: the record must outlive its request to be sent again */

        op->buf = ngx_alloc(p - start, node->redis->log);

        if (op->buf) {
            op->buf_len = p - start;
            ngx_memcpy(op->buf, start, op->buf_len);

        } else {
            op->again = 0;
            op->script = NULL;
        }
    }

    node->out_last = p;

    ngx_http_idempotency_node_queue(node, op);

    return NGX_OK;
}


/* the most a command can take once formatted */

size_t
ngx_http_idempotency_format_len(int argc, const size_t *argvlen)
{
    int     i;
    size_t  len;

    len = sizeof("*\r\n") - 1 + NGX_INT_T_LEN;

    for (i = 0; i < argc; i++) {
        len += sizeof("$\r\n\r\n") - 1 + NGX_SIZE_T_LEN + argvlen[i];
    }

    return len;
}


/*
 * RESP by hand: ngx_sprintf's format parsing was the largest part of a
 * command's formatting (two commands and some 15 lengths per request)
 */

u_char *
ngx_http_idempotency_format(u_char *p, int argc, const char **argv,
    const size_t *argvlen)
{
    int  i;

    *p++ = '*';
    p = ngx_http_idempotency_format_size(p, (size_t) argc);

    for (i = 0; i < argc; i++) {
        *p++ = '$';
        p = ngx_http_idempotency_format_size(p, argvlen[i]);
        p = ngx_cpymem(p, argv[i], argvlen[i]);
        *p++ = CR;
        *p++ = LF;
    }

    return p;
}


/* a decimal number and CRLF */

static u_char *
ngx_http_idempotency_format_size(u_char *p, size_t n)
{
    p = ngx_http_idempotency_decimal(p, n);
    *p++ = CR;
    *p++ = LF;

    return p;
}


/* what ngx_sprintf("%uz") writes, without parsing a format per number */

u_char *
ngx_http_idempotency_decimal(u_char *p, size_t n)
{
    u_char   buf[NGX_SIZE_T_LEN];
    u_char  *d;

    d = buf + NGX_SIZE_T_LEN;

    do {
        *--d = (u_char) ('0' + n % 10);
        n /= 10;
    } while (n);

    return ngx_cpymem(p, d, buf + NGX_SIZE_T_LEN - d);
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

static void
ngx_http_idempotency_node_resend(ngx_http_idempotency_node_t *node)
{
    u_char                     *p, *cmd;
    size_t                      len;
    ngx_http_idempotency_op_t  *op;

    while (node->parked) {
        op = node->parked;
        node->parked = op->next;

        p = NULL;
        cmd = op->again ? op->buf : op->cmd;
        len = op->again ? op->buf_len : op->cmd_len;

        if (node->open && !node->handshake_failed
            && ((op->resend && op->data) || op->again))
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

    if (node->subscriber
        && node->push(node, reply) == NGX_DONE)
    {
        freeReplyObject(reply);
        return node->open ? NGX_OK : NGX_ERROR;
    }

    if (node->redis->topology->reply
        && node->redis->topology->reply(node, reply) == NGX_DONE)
    {
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

    if (node->redis->topology->redirect && !node->handshake_failed
        && !node->subscriber
        && node->redis->topology->redirect(node, op, reply) == NGX_DONE)
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
 * NOSCRIPT: Redis did not run the script, so the same command goes again
 * on the same node, by EVAL with the script's text: "*N", "EVALSHA", the
 * SHA, then the arguments as they were.  EVAL caches the script, so the
 * EVALSHAs after it find it again: no SCRIPT LOAD is needed.
 */

static ngx_int_t
ngx_http_idempotency_node_noscript(ngx_http_idempotency_node_t *node,
    ngx_http_idempotency_op_t *op)
{
    u_char     *p, *buf, *last, *args;
    size_t      len;
    ngx_str_t  *script;

    static u_char  evalsha[] = "$7\r\nEVALSHA\r\n$40\r\n";

    script = op->script;
    last = op->buf + op->buf_len;

    p = ngx_strlchr(op->buf, last, LF);

    if (p == NULL
        || (size_t) (last - ++p) < sizeof(evalsha) - 1 + 40 + 2
        || ngx_strncmp(p, evalsha, sizeof(evalsha) - 1) != 0)
    {
        return NGX_DECLINED;
    }

    args = p + sizeof(evalsha) - 1 + 40 + 2;

    len = (p - op->buf) + sizeof("$4\r\nEVAL\r\n$\r\n\r\n") - 1
          + NGX_SIZE_T_LEN + script->len + (last - args);

    buf = ngx_alloc(len, node->redis->log);
    if (buf == NULL) {
        return NGX_DECLINED;
    }

    p = ngx_cpymem(buf, op->buf, p - op->buf);
    p = ngx_sprintf(p, "$4\r\nEVAL\r\n$%uz\r\n", script->len);
    p = ngx_cpymem(p, script->data, script->len);
    *p++ = CR;
    *p++ = LF;
    p = ngx_cpymem(p, args, last - args);

    ngx_free(op->buf);
    op->buf = buf;
    op->buf_len = p - buf;
    op->script = NULL;

    p = ngx_http_idempotency_conn_reserve(node, op->buf_len);
    if (p == NULL) {
        /* op->buf is freed with the op */
        return NGX_DECLINED;
    }

    node->out_last = ngx_cpymem(p, op->buf, op->buf_len);

    ngx_http_idempotency_node_queue(node, op);

    return NGX_OK;
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

        if (node->redis->topology->lost && !node->subscriber
            && node->redis->topology->lost(node, op) == NGX_OK)
        {
            continue;
        }

        if (((op->resend && op->data) || op->again) && !op->resent
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

    if (node->subscriber) {
        if (node->closed_handler(node)) {
            ngx_http_idempotency_redis_schedule(node);
        }

        return;
    }

    /* a cluster node that left the slot map is no lost Redis */

    if (node->redis->topology->wanted == NULL
        || node->redis->topology->wanted(node))
    {
        ngx_http_idempotency_redis_events.down(node->redis);
    }

    ngx_http_idempotency_redis_schedule(node);

    if (node->redis->topology->closed) {
        node->redis->topology->closed(node);
    }
}


/* a stalled connection is torn down outside of any reply handler */

void
ngx_http_idempotency_redis_reset(ngx_http_idempotency_redis_t *redis)
{
    /* a cluster's nodes have their own watchdogs */

    if (redis->node) {
        ngx_http_idempotency_node_reset(redis->node);
    }
}


static void
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
ngx_http_idempotency_redis_unsolicited(ngx_http_idempotency_redis_t *redis,
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


static void
ngx_http_idempotency_no_event(ngx_http_idempotency_redis_t *redis)
{
}


static void *
ngx_http_idempotency_no_master_add(ngx_http_idempotency_redis_t *redis,
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
