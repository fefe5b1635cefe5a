
/*
 * Copyright (C) The ngx_http_idempotency_module authors
 *
 * Redis Cluster, the map: what a worker knows of the cluster and how it
 * learns it.  This file owns the seeds given in the configuration, the
 * nodes (one pipelined node of node.c per address or host name, made the
 * first time it is seen and kept until the worker exits), which master
 * serves each of the 16384 slots, and the refresh that asks CLUSTER SLOTS
 * again when a redirect, a closed master or its timer says the map may be
 * stale.  The worker's cluster is made and freed here, since nearly all of
 * it is the map.  The router (cluster.c) reads the map to send commands
 * and tells it what a MOVED taught.  The map routes nothing itself: its
 * own CLUSTER SLOTS goes through the router's cluster_send(), the commands
 * that waited for a map go back to the router's retry handler, and those
 * still waiting at exit are ended by the router's cluster_done().
 */


#include "ngx_http_idempotency_cluster.h"


#define NGX_HTTP_IDEMPOTENCY_REFRESH_GAP    1000
#define NGX_HTTP_IDEMPOTENCY_REFRESH_FIRST  100
#define NGX_HTTP_IDEMPOTENCY_REFRESH_EVERY  60000


/* a seed given by name, in redis->seed_names */
typedef struct {
    ngx_str_t                        addr;       /* as written */
    ngx_str_t                        host;
    in_port_t                        port;
} ngx_http_idempotency_seed_t;


static ngx_http_idempotency_cnode_t *ngx_http_idempotency_cluster_node(
    ngx_http_idempotency_cluster_t *cl, struct sockaddr *sa,
    socklen_t socklen);
static ngx_http_idempotency_cnode_t *ngx_http_idempotency_cluster_named(
    ngx_http_idempotency_cluster_t *cl, u_char *host, size_t len,
    in_port_t port);
static ngx_int_t ngx_http_idempotency_cluster_add(
    ngx_http_idempotency_cluster_t *cl, ngx_http_idempotency_cnode_t *cn);
static void ngx_http_idempotency_cluster_metric(
    ngx_http_idempotency_cnode_t *cn);
static void ngx_http_idempotency_cluster_refresh_handler(ngx_event_t *ev);
static ngx_int_t ngx_http_idempotency_cluster_slots_valid(redisReply *reply);


static ngx_str_t  ngx_http_idempotency_cluster_slots_cmd =
    ngx_string("*2\r\n$7\r\nCLUSTER\r\n$5\r\nSLOTS\r\n");


/*
 * Seeds by address are taken now; a seed by name waits for the merge
 * (cluster_conf_seeds()), which knows whether a resolver is configured.
 */

ngx_int_t
ngx_http_idempotency_cluster_conf(ngx_conf_t *cf,
    ngx_http_idempotency_target_t *redis, ngx_str_t *addrs, ngx_uint_t n)
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

ngx_int_t
ngx_http_idempotency_cluster_conf_seeds(ngx_conf_t *cf,
    ngx_http_idempotency_target_t *redis, ngx_resolver_t *resolver,
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


ngx_int_t
ngx_http_idempotency_cluster_init(ngx_cycle_t *cycle,
    ngx_http_idempotency_target_t *redis)
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


void
ngx_http_idempotency_cluster_exit(ngx_http_idempotency_target_t *redis)
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
    ngx_http_idempotency_target_t   *redis;

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
    ngx_http_idempotency_target_t  *redis;

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
    ngx_http_idempotency_target_t  *redis;

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

    ngx_http_idempotency_node_init(&cn->node, redis, redis->log,
                                   redis->topology->owner);

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

ngx_http_idempotency_cnode_t *
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

void
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


/*
 * Asks for the map by the refresh timer: at most one CLUSTER SLOTS in
 * flight, at least a second apart once a map is known.
 */

void
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

void
ngx_http_idempotency_cluster_slots_done(ngx_http_idempotency_op_t *op,
    redisReply *reply)
{
    ngx_int_t                        start, end, s;
    ngx_uint_t                       i, n, nslots, nmasters, level;
    redisReply                      *range, *master;
    ngx_http_idempotency_node_t     *node;
    ngx_http_idempotency_cnode_t    *cn;
    ngx_http_idempotency_target_t   *redis;
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
