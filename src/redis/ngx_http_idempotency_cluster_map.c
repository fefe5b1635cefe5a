
/*
 * Copyright (C) The ngx_http_idempotency_module authors
 *
 * Redis Cluster: a per-worker slot map learnt with CLUSTER SLOTS, one
 * pipelined node (node.c) per master, and the router that sends each
 * command to the master of its key's slot and follows MOVED, ASK and the
 * transient errors of a failover or a resharding.  Every routed command
 * keeps its bytes until its reply, so that it can be sent again.
 */


#include "ngx_http_idempotency_redis.h"


#define NGX_HTTP_IDEMPOTENCY_SLOTS          16384
#define NGX_HTTP_IDEMPOTENCY_NO_NODE        0xffff
#define NGX_HTTP_IDEMPOTENCY_MAX_NODES      1024
#define NGX_HTTP_IDEMPOTENCY_REDIRECTS      5
#define NGX_HTTP_IDEMPOTENCY_RETRY_MIN      10
#define NGX_HTTP_IDEMPOTENCY_RETRY_MAX      160
#define NGX_HTTP_IDEMPOTENCY_REFRESH_GAP    1000
#define NGX_HTTP_IDEMPOTENCY_REFRESH_FIRST  100
#define NGX_HTTP_IDEMPOTENCY_REFRESH_EVERY  60000



typedef struct ngx_http_idempotency_cluster_s  ngx_http_idempotency_cluster_t;


/* a seed given by name, in redis->seed_names */
typedef struct {
    ngx_str_t                        addr;       /* as written */
    ngx_str_t                        host;
    in_port_t                        port;
} ngx_http_idempotency_seed_t;


typedef struct {
    ngx_http_idempotency_node_t      node;       /* first: a node_t * */
    ngx_http_idempotency_cluster_t  *cluster;
    ngx_uint_t                       index;
    void                            *metric;     /* master_add(): in the map */
    unsigned                         master:1;   /* wanted: reconnected */
} ngx_http_idempotency_cnode_t;


struct ngx_http_idempotency_cluster_s {
    ngx_http_idempotency_redis_t    *redis;
    ngx_http_idempotency_cnode_t   **nodes;
    ngx_uint_t                       nnodes;
    ngx_uint_t                       next;       /* asked for the map next */

    /* ops waiting for the map, a connection or the end of a backoff */
    ngx_http_idempotency_op_t       *waiting;
    ngx_http_idempotency_op_t      **waiting_tail;

    ngx_event_t                      retry_ev;
    ngx_event_t                      refresh_ev;
    ngx_msec_t                       last_refresh;

    unsigned                         refreshing:1;   /* one in flight */
    unsigned                         known:1;    /* a map was learnt */
    unsigned                         refused:1;  /* logged once */
    unsigned                         asking_refused:1;
    unsigned                         no_resolver:1;  /* logged once */

    uint16_t                         slot_node[NGX_HTTP_IDEMPOTENCY_SLOTS];
};


static ngx_int_t ngx_http_idempotency_cluster_conf_seeds(ngx_conf_t *cf,
    ngx_http_idempotency_redis_t *redis, ngx_resolver_t *resolver,
    ngx_msec_t resolver_timeout);
static ngx_int_t ngx_http_idempotency_cluster_init(ngx_cycle_t *cycle,
    ngx_http_idempotency_redis_t *redis);
static void ngx_http_idempotency_cluster_exit(
    ngx_http_idempotency_redis_t *redis);
static ngx_int_t ngx_http_idempotency_cluster_command(
    ngx_http_idempotency_op_t *op, int argc, const char **argv,
    const size_t *argvlen);
static void ngx_http_idempotency_cluster_load_script(
    ngx_http_idempotency_redis_t *redis);
static ngx_int_t ngx_http_idempotency_cluster_walk(
    ngx_http_idempotency_redis_t *redis, ngx_uint_t *at,
    ngx_http_idempotency_node_t **node);
static void ngx_http_idempotency_cluster_up(ngx_http_idempotency_node_t *node);
static ngx_int_t ngx_http_idempotency_cluster_reply(
    ngx_http_idempotency_node_t *node, ngx_http_idempotency_op_t *op,
    redisReply *reply);
static ngx_int_t ngx_http_idempotency_cluster_lost(
    ngx_http_idempotency_node_t *node, ngx_http_idempotency_op_t *op);
static ngx_uint_t ngx_http_idempotency_cluster_closed(
    ngx_http_idempotency_node_t *node);
static ngx_str_t *ngx_http_idempotency_cluster_tls_name(
    ngx_http_idempotency_node_t *node, ngx_uint_t *ip);
static ngx_http_idempotency_cnode_t *ngx_http_idempotency_cluster_node(
    ngx_http_idempotency_cluster_t *cl, struct sockaddr *sa,
    socklen_t socklen);
static ngx_http_idempotency_cnode_t *ngx_http_idempotency_cluster_named(
    ngx_http_idempotency_cluster_t *cl, u_char *host, size_t len,
    in_port_t port);
static ngx_int_t ngx_http_idempotency_cluster_add(
    ngx_http_idempotency_cluster_t *cl, ngx_http_idempotency_cnode_t *cn);
static ngx_http_idempotency_cnode_t *ngx_http_idempotency_cluster_node_at(
    ngx_http_idempotency_cluster_t *cl, u_char *host, size_t len,
    ngx_int_t port, ngx_http_idempotency_node_t *from);
static void ngx_http_idempotency_cluster_use(
    ngx_http_idempotency_cnode_t *cn);
static void ngx_http_idempotency_cluster_metric(
    ngx_http_idempotency_cnode_t *cn);
static ngx_int_t ngx_http_idempotency_cluster_send(
    ngx_http_idempotency_node_t *node, ngx_http_idempotency_op_t *op,
    u_char *cmd, size_t len);
static void ngx_http_idempotency_cluster_route(
    ngx_http_idempotency_cluster_t *cl, ngx_http_idempotency_op_t *op);
static void ngx_http_idempotency_cluster_wait(
    ngx_http_idempotency_cluster_t *cl, ngx_http_idempotency_op_t *op);
static void ngx_http_idempotency_cluster_done(ngx_http_idempotency_op_t *op);
static ngx_uint_t ngx_http_idempotency_cluster_expired(
    ngx_http_idempotency_op_t *op);
static void ngx_http_idempotency_cluster_refresh(
    ngx_http_idempotency_cluster_t *cl);
static void ngx_http_idempotency_cluster_refresh_handler(ngx_event_t *ev);
static void ngx_http_idempotency_cluster_retry_handler(ngx_event_t *ev);
static void ngx_http_idempotency_cluster_slots_done(
    ngx_http_idempotency_op_t *op, redisReply *reply);
static ngx_int_t ngx_http_idempotency_cluster_slots_valid(redisReply *reply);
static void ngx_http_idempotency_cluster_asked(ngx_http_idempotency_op_t *op,
    redisReply *reply);


static ngx_str_t  ngx_http_idempotency_cluster_slots_cmd =
    ngx_string("*2\r\n$7\r\nCLUSTER\r\n$5\r\nSLOTS\r\n");
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


/*
 * Seeds by address are taken now; a seed by name waits for the merge
 * (cluster_conf_seeds()), which knows whether a resolver is configured.
 */

ngx_int_t
ngx_http_idempotency_cluster_conf(ngx_conf_t *cf,
    ngx_http_idempotency_redis_t *redis, ngx_str_t *addrs, ngx_uint_t n)
{
    ngx_url_t                     u;
    ngx_uint_t                    i;
    ngx_http_idempotency_seed_t  *seed;

    redis->topology = &ngx_http_idempotency_cluster_topology;
    redis->seeds = ngx_array_create(cf->pool, n, sizeof(ngx_addr_t));
    redis->seed_names = ngx_array_create(cf->pool, n,
                                         sizeof(ngx_http_idempotency_seed_t));
    if (redis->seeds == NULL || redis->seed_names == NULL) {
        return NGX_ERROR;
    }

    for (i = 0; i < n; i++) {
        ngx_memzero(&u, sizeof(ngx_url_t));

        u.url = addrs[i];
        u.default_port = 6379;
        u.no_resolve = 1;

        if (ngx_parse_url(cf->pool, &u) == NGX_OK
            && u.naddrs == 0 && u.host.len && u.family != AF_UNIX)
        {
            seed = ngx_array_push(redis->seed_names);
            if (seed == NULL) {
                return NGX_ERROR;
            }

            seed->addr = addrs[i];
            seed->host = u.host;
            seed->port = u.port;
            continue;
        }

        /* an address, or an error to report */

        if (ngx_http_idempotency_conf_addrs(cf, &addrs[i], 6379,
                                            "redis cluster seed",
                                            redis->seeds)
            != NGX_OK)
        {
            return NGX_ERROR;
        }
    }

    return NGX_OK;
}


/*
 * At the merge: with an http resolver where the target is used, the
 * seeds by name are resolved on every connect, and nodes may announce
 * host names; without one, the names are resolved now, once.
 */

static ngx_int_t
ngx_http_idempotency_cluster_conf_seeds(ngx_conf_t *cf,
    ngx_http_idempotency_redis_t *redis, ngx_resolver_t *resolver,
    ngx_msec_t resolver_timeout)
{
    ngx_uint_t                    i;
    ngx_http_idempotency_seed_t  *seed;

    if (redis->resolver) {
        return NGX_OK;
    }

    if (resolver) {
        redis->resolver = resolver;
        redis->resolver_timeout = resolver_timeout;
        return NGX_OK;
    }

    seed = redis->seed_names->elts;

    for (i = 0; i < redis->seed_names->nelts; i++) {
        if (ngx_http_idempotency_conf_addrs(cf, &seed[i].addr, 6379,
                                            "redis cluster seed",
                                            redis->seeds)
            != NGX_OK)
        {
            return NGX_ERROR;
        }
    }

    redis->seed_names->nelts = 0;

    return NGX_OK;
}


static ngx_int_t
ngx_http_idempotency_cluster_init(ngx_cycle_t *cycle,
    ngx_http_idempotency_redis_t *redis)
{
    ngx_uint_t                       i;
    ngx_addr_t                      *seeds;
    ngx_http_idempotency_seed_t     *seed;
    ngx_http_idempotency_cnode_t    *cn;
    ngx_http_idempotency_cluster_t  *cl;

    cl = ngx_calloc(sizeof(ngx_http_idempotency_cluster_t), cycle->log);
    if (cl == NULL) {
        return NGX_ERROR;
    }

    cl->redis = redis;
    cl->waiting_tail = &cl->waiting;

    for (i = 0; i < NGX_HTTP_IDEMPOTENCY_SLOTS; i++) {
        cl->slot_node[i] = NGX_HTTP_IDEMPOTENCY_NO_NODE;
    }

    /* the retries bound a store's wait at exit; the refresh does not */

    cl->retry_ev.handler = ngx_http_idempotency_cluster_retry_handler;
    cl->retry_ev.data = cl;
    cl->retry_ev.log = cycle->log;

    cl->refresh_ev.handler = ngx_http_idempotency_cluster_refresh_handler;
    cl->refresh_ev.data = cl;
    cl->refresh_ev.log = cycle->log;
    cl->refresh_ev.cancelable = 1;

    redis->cluster = cl;

    seeds = redis->seeds->elts;

    for (i = 0; i < redis->seeds->nelts; i++) {
        cn = ngx_http_idempotency_cluster_node(cl, seeds[i].sockaddr,
                                               seeds[i].socklen);
        if (cn == NULL) {
            return NGX_ERROR;
        }

        /* a seed is wanted until the map says whether it is a master */

        if (i == 0) {
            ngx_http_idempotency_cluster_use(cn);
        }
    }

    seed = redis->seed_names->elts;

    for (i = 0; i < redis->seed_names->nelts; i++) {
        cn = ngx_http_idempotency_cluster_named(cl, seed[i].host.data,
                                                seed[i].host.len,
                                                seed[i].port);
        if (cn == NULL) {
            return NGX_ERROR;
        }

        if (cn->index == 0) {
            ngx_http_idempotency_cluster_use(cn);
        }
    }

    ngx_add_timer(&cl->refresh_ev, 1);

    return NGX_OK;
}


static void
ngx_http_idempotency_cluster_exit(ngx_http_idempotency_redis_t *redis)
{
    ngx_uint_t                       i;
    ngx_http_idempotency_op_t       *op;
    ngx_http_idempotency_node_t     *node;
    ngx_http_idempotency_cluster_t  *cl;

    cl = redis->cluster;

    if (cl == NULL) {
        return;
    }

    for (i = 0; i < cl->nnodes; i++) {
        node = &cl->nodes[i]->node;

        if (node->open) {
            /* pending callbacks run with a NULL reply */
            ngx_http_idempotency_conn_close(node);
        }

        if (node->reconnect_ev.timer_set) {
            ngx_del_timer(&node->reconnect_ev);
        }

        ngx_http_idempotency_conn_free(node);
    }

    while (cl->waiting) {
        op = cl->waiting;
        cl->waiting = op->next;
        ngx_http_idempotency_cluster_done(op);
    }

    if (cl->retry_ev.timer_set) {
        ngx_del_timer(&cl->retry_ev);
    }

    if (cl->refresh_ev.timer_set) {
        ngx_del_timer(&cl->refresh_ev);
    }

    for (i = 0; i < cl->nnodes; i++) {
        ngx_http_idempotency_redis_events.master_del(
                                                        cl->nodes[i]->metric);
        ngx_free(cl->nodes[i]->node.host.data);
        ngx_free(cl->nodes[i]);
    }

    ngx_free(cl->nodes);
    ngx_free(cl);

    redis->cluster = NULL;
}


/* the node of an address, made (not connected) on first sight */

static ngx_http_idempotency_cnode_t *
ngx_http_idempotency_cluster_node(ngx_http_idempotency_cluster_t *cl,
    struct sockaddr *sa, socklen_t socklen)
{
    size_t                           size;
    ngx_uint_t                       i;
    ngx_addr_t                      *addr;
    ngx_http_idempotency_cnode_t    *cn;
    ngx_http_idempotency_redis_t    *redis;

    redis = cl->redis;

    for (i = 0; i < cl->nnodes; i++) {
        addr = cl->nodes[i]->node.addrs;

        /* a node by name is known by its name: addresses come and go */

        if (cl->nodes[i]->node.host.len) {
            continue;
        }

        if (ngx_cmp_sockaddr(addr->sockaddr, addr->socklen, sa, socklen, 1)
            == NGX_OK)
        {
            return cl->nodes[i];
        }
    }

    if (socklen > sizeof(ngx_sockaddr_t)) {
        return NULL;
    }

    /* one block, freed by conn.c as resolved addresses are */

    size = sizeof(ngx_addr_t) + sizeof(ngx_sockaddr_t) + NGX_SOCKADDR_STRLEN;

    addr = ngx_alloc(size, redis->log);
    if (addr == NULL) {
        return NULL;
    }

    cn = ngx_calloc(sizeof(ngx_http_idempotency_cnode_t), redis->log);
    if (cn == NULL) {
        ngx_free(addr);
        return NULL;
    }

    addr->sockaddr = (struct sockaddr *) &addr[1];
    addr->socklen = socklen;
    ngx_memcpy(addr->sockaddr, sa, socklen);

    addr->name.data = (u_char *) addr->sockaddr + sizeof(ngx_sockaddr_t);
    addr->name.len = ngx_sock_ntop(addr->sockaddr, socklen, addr->name.data,
                                   NGX_SOCKADDR_STRLEN, 1);

    cn->node.addrs = addr;
    cn->node.naddrs = 1;

    if (ngx_http_idempotency_cluster_add(cl, cn) != NGX_OK) {
        ngx_free(addr);
        ngx_free(cn);
        return NULL;
    }

    return cn;
}


/*
 * The node of a host name (a seed, or a node that announces one): it is
 * resolved on every connect by conn.c, with the http resolver
 */

static ngx_http_idempotency_cnode_t *
ngx_http_idempotency_cluster_named(ngx_http_idempotency_cluster_t *cl,
    u_char *host, size_t len, in_port_t port)
{
    ngx_uint_t                      i;
    ngx_http_idempotency_node_t    *node;
    ngx_http_idempotency_cnode_t   *cn;
    ngx_http_idempotency_redis_t   *redis;

    redis = cl->redis;

    for (i = 0; i < cl->nnodes; i++) {
        node = &cl->nodes[i]->node;

        if (node->port == port && node->host.len == len
            && ngx_strncasecmp(node->host.data, host, len) == 0)
        {
            return cl->nodes[i];
        }
    }

    if (redis->resolver == NULL) {
        if (!cl->no_resolver) {
            ngx_log_error(NGX_LOG_ERR, redis->log, 0,
                          "idempotency: redis cluster \"%V\" names a node "
                          "\"%*s\": host names need a \"resolver\"",
                          &redis->name, len, host);
            cl->no_resolver = 1;
        }

        return NULL;
    }

    cn = ngx_calloc(sizeof(ngx_http_idempotency_cnode_t), redis->log);
    if (cn == NULL) {
        return NULL;
    }

    /* NUL-terminated: the name TLS verifies (tls.c) */

    cn->node.host.data = ngx_alloc(len + 1, redis->log);
    if (cn->node.host.data == NULL) {
        ngx_free(cn);
        return NULL;
    }

    *ngx_cpymem(cn->node.host.data, host, len) = '\0';
    cn->node.host.len = len;
    cn->node.port = port;

    if (ngx_http_idempotency_cluster_add(cl, cn) != NGX_OK) {
        ngx_free(cn->node.host.data);
        ngx_free(cn);
        return NULL;
    }

    return cn;
}


static ngx_int_t
ngx_http_idempotency_cluster_add(ngx_http_idempotency_cluster_t *cl,
    ngx_http_idempotency_cnode_t *cn)
{
    ngx_http_idempotency_cnode_t  **nodes;
    ngx_http_idempotency_redis_t   *redis;

    redis = cl->redis;

    if (cl->nnodes == NGX_HTTP_IDEMPOTENCY_MAX_NODES) {
        return NGX_ERROR;
    }

    if (cl->nnodes % 16 == 0) {
        nodes = ngx_alloc((cl->nnodes + 16) * sizeof(void *), redis->log);
        if (nodes == NULL) {
            return NGX_ERROR;
        }

        if (cl->nnodes) {
            ngx_memcpy(nodes, cl->nodes, cl->nnodes * sizeof(void *));
        }

        ngx_free(cl->nodes);
        cl->nodes = nodes;
    }

    ngx_http_idempotency_node_init(&cn->node, redis, redis->log);

    cn->cluster = cl;
    cn->index = cl->nnodes;

    cl->nodes[cl->nnodes++] = cn;

    return NGX_OK;
}


/*
 * The endpoint of a MOVED, an ASK or a slot range: an empty host (or a
 * nil one, cluster-preferred-endpoint-type unknown-endpoint) is the
 * replying node's, by its name if it has one; "?" (a node that should
 * announce a host name and has none) is not used; a host name is
 * resolved with the resolver.
 */

static ngx_http_idempotency_cnode_t *
ngx_http_idempotency_cluster_node_at(ngx_http_idempotency_cluster_t *cl,
    u_char *host, size_t len, ngx_int_t port,
    ngx_http_idempotency_node_t *from)
{
    in_addr_t             inaddr;
    socklen_t             socklen;
    ngx_sockaddr_t        sa;
#if (NGX_HAVE_INET6)
    u_char                inaddr6[16];
#endif

    if (port < 1 || port > 65535) {
        return NULL;
    }

    ngx_memzero(&sa, sizeof(ngx_sockaddr_t));

    if (len == 0 && from->host.len) {
        host = from->host.data;
        len = from->host.len;
    }

    if (len == 0) {
        socklen = from->addrs->socklen;
        ngx_memcpy(&sa, from->addrs->sockaddr, socklen);

    } else {
        inaddr = ngx_inet_addr(host, len);

        if (inaddr != INADDR_NONE) {
            sa.sockaddr_in.sin_family = AF_INET;
            sa.sockaddr_in.sin_addr.s_addr = inaddr;
            socklen = sizeof(struct sockaddr_in);

#if (NGX_HAVE_INET6)
        } else if (ngx_inet6_addr(host, len, inaddr6) == NGX_OK) {
            sa.sockaddr_in6.sin6_family = AF_INET6;
            ngx_memcpy(sa.sockaddr_in6.sin6_addr.s6_addr, inaddr6, 16);
            socklen = sizeof(struct sockaddr_in6);
#endif

        } else if (len == 1 && host[0] == '?') {
            return NULL;

        } else {
            return ngx_http_idempotency_cluster_named(cl, host, len,
                                                      (in_port_t) port);
        }
    }

    ngx_inet_set_port(&sa.sockaddr, (in_port_t) port);

    return ngx_http_idempotency_cluster_node(cl, &sa.sockaddr, socklen);
}


/* a master: kept connected */

static void
ngx_http_idempotency_cluster_use(ngx_http_idempotency_cnode_t *cn)
{
    ngx_http_idempotency_node_t  *node;

    node = &cn->node;
    cn->master = 1;

    if (!node->open && !node->reconnect_ev.timer_set
        && !node->redis->exiting && !ngx_exiting && !ngx_terminate)
    {
        ngx_http_idempotency_redis_connect(node);
    }
}


/* NGX_DECLINED: the node takes no commands now */

static ngx_int_t
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
    ngx_http_idempotency_redis_t    *redis;
    ngx_http_idempotency_cluster_t  *cl;

    redis = op->redis;
    cl = redis->cluster;

    if (cl == NULL || redis->exiting) {
        ngx_http_idempotency_op_free(op);
        return NGX_ERROR;
    }

    op->buf = ngx_alloc(ngx_http_idempotency_format_len(argc, argvlen),
                        redis->log);
    if (op->buf == NULL) {
        ngx_http_idempotency_op_free(op);
        return NGX_ERROR;
    }

    op->buf_len = ngx_http_idempotency_format(op->buf, argc, argv, argvlen)
                  - op->buf;
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
    if (op->resend && op->data == NULL) {
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


static void
ngx_http_idempotency_cluster_done(ngx_http_idempotency_op_t *op)
{
    op->handler(op, NULL);
    ngx_http_idempotency_op_free(op);
}


static void
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
    u_char                          *p, *last, *host, *colon;
    ngx_int_t                        slot, port, rc;
    ngx_uint_t                       ask;
    ngx_http_idempotency_op_t       *aop;
    ngx_http_idempotency_cnode_t    *cn;
    ngx_http_idempotency_redis_t    *redis;
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
    last = p + reply->len;

    if (ngx_http_idempotency_reply_is(reply, "MOVED ")) {
        ask = 0;
        p += sizeof("MOVED ") - 1;

    } else if (ngx_http_idempotency_reply_is(reply, "ASK ")) {
        ask = 1;
        p += sizeof("ASK ") - 1;

    } else if (ngx_http_idempotency_reply_is(reply, "TRYAGAIN")
               || ngx_http_idempotency_reply_is(reply, "CLUSTERDOWN")
               || ngx_http_idempotency_reply_is(reply, "LOADING")
               || ngx_http_idempotency_reply_is(reply, "MASTERDOWN"))
    {
        /* a resharding, a failover, a restart: after a backoff */

        if (ngx_http_idempotency_reply_is(reply, "CLUSTERDOWN")) {
            ngx_http_idempotency_cluster_refresh(cl);
        }

        if (ngx_http_idempotency_cluster_expired(op)) {
            return NGX_DECLINED;
        }

        ngx_http_idempotency_cluster_wait(cl, op);
        return NGX_DONE;

    } else {
        return NGX_DECLINED;
    }

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

    ngx_http_idempotency_cluster_use(cn);

    op->asking = 0;

    if (ask) {
        /* ASKING is one-shot: it goes right before the command */

        aop = ngx_http_idempotency_op_alloc(redis);
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
    ngx_http_idempotency_redis_t    *redis;
    ngx_http_idempotency_cluster_t  *cl;

    redis = node->redis;
    cl = redis->cluster;

    if (cl == NULL || op->buf == NULL || redis->exiting || ngx_terminate) {
        return NGX_DECLINED;
    }

    if (op->resend ? op->data == NULL : op->resent) {
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


/* a node's handshake is done */

static void
ngx_http_idempotency_cluster_up(ngx_http_idempotency_node_t *node)
{
    ngx_http_idempotency_cnode_t  *cn;

    cn = (ngx_http_idempotency_cnode_t *) node;

    ngx_http_idempotency_redis_events.master_up(cn->metric, 1);
}


/*
 * A series of nginx_idempotency_redis_up per master in the map, by the
 * endpoint the map names; one that left the map loses it.
 */

static void
ngx_http_idempotency_cluster_metric(ngx_http_idempotency_cnode_t *cn)
{
    u_char                        buf[NGX_SOCKADDR_STRLEN + 256 + 8];
    ngx_str_t                     name;
    ngx_http_idempotency_node_t  *node;

    node = &cn->node;

    if (!cn->master) {
        ngx_http_idempotency_redis_events.master_del(cn->metric);
        cn->metric = NULL;
        return;
    }

    if (cn->metric) {
        return;
    }

    if (node->host.len) {
        name.data = buf;
        name.len = ngx_snprintf(buf, sizeof(buf), "%V:%d", &node->host,
                                (int) node->port)
                   - buf;

    } else {
        name = node->addrs->name;
    }

    cn->metric = ngx_http_idempotency_redis_events.master_add(node->redis,
                                                              &name);

    if (node->up) {
        ngx_http_idempotency_redis_events.master_up(cn->metric, 1);
    }
}


static void
ngx_http_idempotency_cluster_load_script(ngx_http_idempotency_redis_t *redis)
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


/*
 * Asks for the map by the refresh timer: at most one CLUSTER SLOTS in
 * flight, at least a second apart once a map is known.
 */

static void
ngx_http_idempotency_cluster_refresh(ngx_http_idempotency_cluster_t *cl)
{
    ngx_msec_t      gap;
    ngx_msec_int_t  delay;

    if (cl->refreshing || cl->redis->exiting) {
        return;
    }

    gap = cl->known ? NGX_HTTP_IDEMPOTENCY_REFRESH_GAP
                    : NGX_HTTP_IDEMPOTENCY_REFRESH_FIRST;

    delay = (ngx_msec_int_t) (cl->last_refresh + gap - ngx_current_msec);

    if (delay < 1 || cl->last_refresh == 0) {
        delay = 1;
    }

    if (cl->refresh_ev.timer_set
        && (ngx_msec_int_t) (cl->refresh_ev.timer.key
                             - (ngx_current_msec + delay)) <= 0)
    {
        return;
    }

    if (cl->refresh_ev.timer_set) {
        ngx_del_timer(&cl->refresh_ev);
    }

    ngx_add_timer(&cl->refresh_ev, delay);
}


/* asked of a master that answers, else of any node that connects */

static void
ngx_http_idempotency_cluster_refresh_handler(ngx_event_t *ev)
{
    ngx_http_idempotency_cluster_t  *cl = ev->data;

    ngx_uint_t                      i, n, pass;
    ngx_http_idempotency_op_t      *op;
    ngx_http_idempotency_node_t    *node;
    ngx_http_idempotency_cnode_t   *cn;

    if (cl->refreshing || cl->redis->exiting || ngx_exiting) {
        return;
    }

    n = cl->nnodes;
    cn = NULL;

    for (pass = 0; pass < 3 && cn == NULL; pass++) {
        for (i = 0; i < n; i++) {
            cn = cl->nodes[(cl->next + i) % n];
            node = &cn->node;

            if (node->handshake_failed || node->reset_ev.posted) {
                cn = NULL;
                continue;
            }

            if ((pass == 0 && node->up)
                || (pass == 1 && node->open))
            {
                break;
            }

            if (pass == 2 && !node->open) {
                if (node->reconnect_ev.timer_set) {
                    ngx_del_timer(&node->reconnect_ev);
                }

                ngx_http_idempotency_redis_connect(node);

                if (node->open) {
                    break;
                }
            }

            cn = NULL;
        }
    }

    cl->last_refresh = ngx_current_msec;

    if (cn == NULL) {
        ngx_add_timer(&cl->refresh_ev, NGX_HTTP_IDEMPOTENCY_REFRESH_GAP);
        return;
    }

    cl->next = cn->index + 1;

    op = ngx_http_idempotency_op_alloc(cl->redis);
    if (op == NULL) {
        ngx_add_timer(&cl->refresh_ev, NGX_HTTP_IDEMPOTENCY_REFRESH_GAP);
        return;
    }

    op->handler = ngx_http_idempotency_cluster_slots_done;

    if (ngx_http_idempotency_cluster_send(&cn->node, op,
                                   ngx_http_idempotency_cluster_slots_cmd.data,
                                   ngx_http_idempotency_cluster_slots_cmd.len)
        != NGX_OK)
    {
        ngx_http_idempotency_op_free(op);
        ngx_add_timer(&cl->refresh_ev, NGX_HTTP_IDEMPOTENCY_REFRESH_GAP);
        return;
    }

    cl->refreshing = 1;
}


/*
 * [[start, end, [host, port, id, ...], replicas...], ...]: the masters
 * take the slots; replicas get no traffic.  A master that left the map is
 * closed once it has no command in flight.
 */

static void
ngx_http_idempotency_cluster_slots_done(ngx_http_idempotency_op_t *op,
    redisReply *reply)
{
    ngx_int_t                        start, end, s;
    ngx_uint_t                       i, n, nslots, nmasters, level;
    redisReply                      *range, *master;
    ngx_http_idempotency_node_t     *node;
    ngx_http_idempotency_cnode_t    *cn;
    ngx_http_idempotency_redis_t    *redis;
    ngx_http_idempotency_cluster_t  *cl;

    redis = op->redis;
    cl = redis->cluster;

    if (cl == NULL || redis->exiting) {
        return;
    }

    cl->refreshing = 0;

    if (reply == NULL
        || ngx_http_idempotency_cluster_slots_valid(reply) != NGX_OK)
    {
        if (reply && !cl->refused) {
            ngx_log_error(NGX_LOG_ERR, redis->log, 0,
                          "idempotency: redis cluster \"%V\" (%V) refused "
                          "CLUSTER SLOTS or sent an invalid map%s%*s",
                          &redis->name, &op->node->addrs->name,
                          reply->type == REDIS_REPLY_ERROR ? ": " : "",
                          reply->type == REDIS_REPLY_ERROR
                          ? (size_t) reply->len : 0, reply->str);
            cl->refused = 1;
        }

        ngx_add_timer(&cl->refresh_ev,
                      cl->known ? NGX_HTTP_IDEMPOTENCY_REFRESH_GAP
                                : NGX_HTTP_IDEMPOTENCY_REFRESH_FIRST);
        return;
    }

    cl->refused = 0;

    for (i = 0; i < NGX_HTTP_IDEMPOTENCY_SLOTS; i++) {
        cl->slot_node[i] = NGX_HTTP_IDEMPOTENCY_NO_NODE;
    }

    n = cl->nnodes;

    for (i = 0; i < n; i++) {
        cl->nodes[i]->master = 0;
    }

    nslots = 0;

    for (i = 0; i < reply->elements; i++) {
        range = reply->element[i];
        master = range->element[2];

        start = range->element[0]->integer;
        end = range->element[1]->integer;

        /* a nil endpoint: str is NULL, len 0 */

        cn = ngx_http_idempotency_cluster_node_at(cl,
                                           (u_char *) master->element[0]->str,
                                           master->element[0]->len,
                                           master->element[1]->integer,
                                           op->node);
        if (cn == NULL) {
            /* "?", or a host name without a resolver: unknown slots */
            continue;
        }

        cn->master = 1;

        for (s = start; s <= end; s++) {
            cl->slot_node[s] = (uint16_t) cn->index;
        }

        nslots += end - start + 1;
    }

    nmasters = 0;

    for (i = 0; i < cl->nnodes; i++) {
        cn = cl->nodes[i];
        node = &cn->node;

        ngx_http_idempotency_cluster_metric(cn);

        if (cn->master) {
            nmasters++;
            ngx_http_idempotency_cluster_use(cn);
            continue;
        }

        if (node->open && node->pending == 0) {
            ngx_http_idempotency_conn_close(node);
        }
    }

    if (!cl->known || nslots != NGX_HTTP_IDEMPOTENCY_SLOTS) {
        level = (nslots == NGX_HTTP_IDEMPOTENCY_SLOTS) ? NGX_LOG_NOTICE
                                                       : NGX_LOG_WARN;

        ngx_log_error(level, redis->log, 0,
                      "idempotency: redis cluster \"%V\": %ui masters, "
                      "%ui of %d slots served", &redis->name, nmasters,
                      nslots, NGX_HTTP_IDEMPOTENCY_SLOTS);
    }

    cl->known = 1;

    /* a partial map (a failover under way) is asked again soon */

    ngx_add_timer(&cl->refresh_ev, nslots == NGX_HTTP_IDEMPOTENCY_SLOTS
                                   ? NGX_HTTP_IDEMPOTENCY_REFRESH_EVERY
                                   : NGX_HTTP_IDEMPOTENCY_REFRESH_GAP);

    /* what waited for the map goes now */

    for (op = cl->waiting; op; op = op->next) {
        op->retry_at = ngx_current_msec;
    }

    if (cl->waiting) {
        ngx_http_idempotency_cluster_retry_handler(&cl->retry_ev);
    }
}


static ngx_int_t
ngx_http_idempotency_cluster_slots_valid(redisReply *reply)
{
    ngx_uint_t   i;
    redisReply  *range, *master;

    if (reply->type != REDIS_REPLY_ARRAY) {
        return NGX_ERROR;
    }

    for (i = 0; i < reply->elements; i++) {
        range = reply->element[i];

        if (range->type != REDIS_REPLY_ARRAY || range->elements < 3
            || range->element[0]->type != REDIS_REPLY_INTEGER
            || range->element[1]->type != REDIS_REPLY_INTEGER
            || range->element[2]->type != REDIS_REPLY_ARRAY
            || range->element[0]->integer < 0
            || range->element[0]->integer > range->element[1]->integer
            || range->element[1]->integer >= NGX_HTTP_IDEMPOTENCY_SLOTS)
        {
            return NGX_ERROR;
        }

        master = range->element[2];

        if (master->elements < 2
            || (master->element[0]->type != REDIS_REPLY_STRING
                && master->element[0]->type != REDIS_REPLY_NIL)
            || master->element[1]->type != REDIS_REPLY_INTEGER)
        {
            return NGX_ERROR;
        }
    }

    return NGX_OK;
}


/* subscribe.c: the master of a slot per the map; NULL: not known, asked for */

ngx_http_idempotency_node_t *
ngx_http_idempotency_cluster_master(ngx_http_idempotency_redis_t *redis,
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
ngx_http_idempotency_cluster_walk(ngx_http_idempotency_redis_t *redis,
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


ngx_http_idempotency_topology_t  ngx_http_idempotency_cluster_topology = {
    ngx_http_idempotency_cluster_conf_seeds,
    NULL,                                  /* tls */
    ngx_http_idempotency_cluster_tls_name,
    ngx_http_idempotency_cluster_init,
    ngx_http_idempotency_cluster_exit,
    ngx_http_idempotency_cluster_command,
    ngx_http_idempotency_cluster_load_script,
    ngx_http_idempotency_cluster_walk,
    NULL,                                  /* handshake */
    ngx_http_idempotency_cluster_up,
    NULL,                                  /* reply */
    ngx_http_idempotency_cluster_reply,
    ngx_http_idempotency_cluster_lost,
    ngx_http_idempotency_cluster_closed,
    NULL,                                  /* closed */
    1,                                     /* nodes */
    0,                                     /* moves */
    0                                      /* tls_found */
};
