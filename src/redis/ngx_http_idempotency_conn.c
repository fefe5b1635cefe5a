
/*
 * Copyright (C) The ngx_http_idempotency_module authors
 *
 * One connection to one Redis server on nginx's own connection machinery:
 * resolve (the http resolver), connect (ngx_event_connect_peer), TLS
 * (tls.c), then write what node.c formatted and feed what comes back to
 * hiredis's RESP reader.  hiredis parses; it never touches the socket.
 */


#include "ngx_http_idempotency_redis.h"


#define NGX_HTTP_IDEMPOTENCY_OUT_SIZE    16384
#define NGX_HTTP_IDEMPOTENCY_OUT_KEEP    262144  /* kept once all is sent */


static void ngx_http_idempotency_conn_resolved(ngx_resolver_ctx_t *ctx);
static void ngx_http_idempotency_conn_connect(
    ngx_http_idempotency_node_t *node);
static void ngx_http_idempotency_conn_connected(
    ngx_http_idempotency_node_t *node);
static void ngx_http_idempotency_conn_read(ngx_event_t *rev);
static void ngx_http_idempotency_conn_write(ngx_event_t *wev);
static ssize_t ngx_http_idempotency_conn_send(
    ngx_http_idempotency_node_t *node);
static void ngx_http_idempotency_conn_log(ngx_log_t *log, ngx_uint_t level,
    u_char *buf, size_t len);


/*
 * At configuration time: a name is given to the resolver of the first
 * place that has one configured (the caller's, or NULL), to be resolved on
 * every connect; without one it is resolved now, once, as a literal
 * address is.
 */

ngx_int_t
ngx_http_idempotency_conn_conf(ngx_conf_t *cf,
    ngx_http_idempotency_target_t *redis, ngx_resolver_t *resolver,
    ngx_msec_t resolver_timeout)
{
    ngx_url_t  u;

    if (redis->resolver == NULL
        && redis->host.len
        && !ngx_http_idempotency_is_ip(&redis->host)
        && resolver)
    {
        redis->resolver = resolver;
        redis->resolver_timeout = resolver_timeout;
    }

    if (redis->naddrs || redis->resolver) {
        return NGX_OK;
    }

    ngx_memzero(&u, sizeof(ngx_url_t));

    u.url = redis->name;
    u.default_port = 6379;

    if (ngx_parse_url(cf->pool, &u) != NGX_OK || u.naddrs == 0) {

        /* merging runs at the end of http{}: name the directive's line */

        if (redis->conf_line) {
            ngx_log_error(NGX_LOG_EMERG, cf->log, 0,
                          "invalid redis address \"%V\"%s%s in %V:%ui",
                          &redis->name, u.err ? ": " : "",
                          u.err ? u.err : "", &redis->conf_file,
                          redis->conf_line);

        } else {
            ngx_conf_log_error(NGX_LOG_EMERG, cf, 0,
                               "invalid redis address \"%V\"%s%s",
                               &redis->name, u.err ? ": " : "",
                               u.err ? u.err : "");
        }

        return NGX_ERROR;
    }

    redis->addrs = u.addrs;
    redis->naddrs = u.naddrs;

    return NGX_OK;
}


/*
 * Cluster seeds and Sentinels: a host:port resolved now, every address of
 * a name added to addrs in turn (a unix socket is refused: what:
 * "redis cluster seed" or "sentinel" for the messages)
 */

ngx_int_t
ngx_http_idempotency_conf_addrs(ngx_conf_t *cf, ngx_str_t *addr,
    in_port_t port, const char *what, ngx_array_t *addrs)
{
    ngx_url_t    u;
    ngx_uint_t   i;
    ngx_addr_t  *a;

    ngx_memzero(&u, sizeof(ngx_url_t));

    u.url = *addr;
    u.default_port = port;

    if (ngx_parse_url(cf->pool, &u) != NGX_OK || u.naddrs == 0) {
        ngx_conf_log_error(NGX_LOG_EMERG, cf, 0,
                           "invalid %s address \"%V\"%s%s", what, addr,
                           u.err ? ": " : "", u.err ? u.err : "");
        return NGX_ERROR;
    }

    if (u.family == AF_UNIX) {
        ngx_conf_log_error(NGX_LOG_EMERG, cf, 0,
                           "a %s must be host:port, not \"%V\"", what, addr);
        return NGX_ERROR;
    }

    for (i = 0; i < u.naddrs; i++) {
        a = ngx_array_push(addrs);
        if (a == NULL) {
            return NGX_ERROR;
        }

        *a = u.addrs[i];
    }

    return NGX_OK;
}


/* the node takes commands from here on; the bytes wait for the connect */

ngx_int_t
ngx_http_idempotency_conn_open(ngx_http_idempotency_node_t *node)
{
    ngx_http_idempotency_target_t *redis;

    redis = node->redis;

    if (node->in == NULL) {
        node->in = ngx_alloc(NGX_HTTP_IDEMPOTENCY_READ_SIZE, redis->log);
        if (node->in == NULL) {
            return NGX_ERROR;
        }

        /*
         * nginx's own lines about the connection (connect(), recv(), SSL)
         * are not written: the most severe of an attempt becomes the
         * reason in our one line per failure streak
         */

        node->log = *redis->log;
        node->log.log_level = NGX_LOG_INFO;
        node->log.writer = ngx_http_idempotency_conn_log;
        node->log.wdata = node;
        node->log.handler = NULL;
        node->log.next = NULL;
    }

    node->reader = redisReaderCreate();
    if (node->reader == NULL) {
        ngx_log_error(NGX_LOG_ERR, redis->log, 0,
                      "idempotency: cannot allocate a redis reader");
        return NGX_ERROR;
    }

    /* bounded to what a reply can hold (input.c) */
    ngx_http_idempotency_input_init(node);

    node->out_pos = node->out;
    node->out_last = node->out;
    node->head = NULL;
    node->tail = &node->head;
    node->pending = 0;
    node->reason_len = 0;
    node->open = 1;
    node->connected = 0;
    node->ready = 0;
    node->handshake_failed = 0;

    ngx_add_timer(&node->connect_ev, redis->timeout);

    return NGX_OK;
}


/*
 * A name is resolved anew on every connect, so that a failover that moves
 * it needs no reload; without a resolver, or when it fails, the addresses
 * known last are used.
 */

void
ngx_http_idempotency_conn_start(ngx_http_idempotency_node_t *node)
{
    ngx_str_t                     *host;
    ngx_resolver_ctx_t            *ctx;
    ngx_http_idempotency_target_t *redis;

    redis = node->redis;

    /* a node by its own name (a cluster's), or the target's one name */
    host = redis->topology->nodes ? &node->host : &redis->host;

    if (redis->resolver == NULL || host->len == 0) {
        ngx_http_idempotency_conn_connect(node);
        return;
    }

    ctx = ngx_resolve_start(redis->resolver, NULL);
    if (ctx == NULL) {
        ngx_http_idempotency_conn_fail(node, 0, "cannot start resolving");
        return;
    }

    if (ctx == NGX_NO_RESOLVER) {
        ngx_http_idempotency_conn_connect(node);
        return;
    }

    ctx->name = *host;
    ctx->handler = ngx_http_idempotency_conn_resolved;
    ctx->data = node;
    ctx->timeout = redis->resolver_timeout;
    ctx->cancelable = 1;

    node->resolving = ctx;

    if (ngx_resolve_name(ctx) != NGX_OK) {
        node->resolving = NULL;
        ngx_http_idempotency_conn_fail(node, 0, "cannot start resolving");
    }
}


static void
ngx_http_idempotency_conn_resolved(ngx_resolver_ctx_t *ctx)
{
    ngx_http_idempotency_node_t  *node = ctx->data;

    size_t                         len;
    ngx_uint_t                     i, n;
    ngx_addr_t                    *addrs;
    struct sockaddr               *sa;
    ngx_http_idempotency_target_t *redis;

    redis = node->redis;
    node->resolving = NULL;

    if (ctx->state || ctx->naddrs == 0) {
        if (!node->failed) {
            ngx_log_error(NGX_LOG_ERR, redis->log, 0,
                          "idempotency: cannot resolve redis \"%V\"%s%V%s: "
                          "%s%s", &redis->name,
                          node->host.len ? " (" : "", &node->host,
                          node->host.len ? ")" : "",
                          ngx_resolver_strerror(ctx->state),
                          node->naddrs ? ", using the last address" : "");
        }

        ngx_resolve_name_done(ctx);

        if (node->naddrs == 0) {
            node->failed = 1;
            ngx_http_idempotency_conn_close(node);
            return;
        }

        ngx_http_idempotency_conn_connect(node);
        return;
    }

    /* one block: the addresses, then their sockaddrs and names */

    n = ctx->naddrs;
    len = n * (sizeof(ngx_addr_t) + sizeof(ngx_sockaddr_t)
               + NGX_SOCKADDR_STRLEN);

    addrs = ngx_alloc(len, redis->log);
    if (addrs == NULL) {
        ngx_resolve_name_done(ctx);
        ngx_http_idempotency_conn_close(node);
        return;
    }

    sa = (struct sockaddr *) &addrs[n];

    for (i = 0; i < n; i++) {
        addrs[i].sockaddr = (struct sockaddr *) ((u_char *) sa
                                                 + i * sizeof(ngx_sockaddr_t));
        addrs[i].socklen = ctx->addrs[i].socklen;
        ngx_memcpy(addrs[i].sockaddr, ctx->addrs[i].sockaddr,
                   ctx->addrs[i].socklen);
        ngx_inet_set_port(addrs[i].sockaddr,
                          node->host.len ? node->port : redis->port);

        addrs[i].name.data = (u_char *) sa + n * sizeof(ngx_sockaddr_t)
                             + i * NGX_SOCKADDR_STRLEN;
        addrs[i].name.len = ngx_sock_ntop(addrs[i].sockaddr,
                                          addrs[i].socklen,
                                          addrs[i].name.data,
                                          NGX_SOCKADDR_STRLEN, 1);
    }

    ngx_resolve_name_done(ctx);

    if (node->addrs != redis->addrs) {
        ngx_free(node->addrs);
    }

    node->addrs = addrs;
    node->naddrs = n;

    if (node->addr >= n) {
        node->addr = 0;
    }

    ngx_http_idempotency_conn_connect(node);
}


static void
ngx_http_idempotency_conn_connect(ngx_http_idempotency_node_t *node)
{
    ngx_int_t                      rc;
    ngx_err_t                      err;
    ngx_addr_t                    *addr;
    ngx_connection_t              *c;
    ngx_peer_connection_t         *pc;
    ngx_http_idempotency_target_t *redis;

    redis = node->redis;

    if (node->naddrs == 0) {
        node->addrs = redis->addrs;
        node->naddrs = redis->naddrs;

        if (node->naddrs == 0) {
            /* a name only the resolver knows, and it did not answer yet */
            ngx_http_idempotency_conn_fail(node, 0, "cannot resolve");
            return;
        }
    }

    addr = &node->addrs[node->addr % node->naddrs];

    pc = &node->peer;
    ngx_memzero(pc, sizeof(ngx_peer_connection_t));

    pc->sockaddr = addr->sockaddr;
    pc->socklen = addr->socklen;
    pc->name = &addr->name;
    pc->get = ngx_event_get_peer;
    pc->log = &node->log;
    pc->log_error = NGX_ERROR_INFO;

    rc = ngx_event_connect_peer(pc);

    err = ngx_socket_errno;

    if (rc == NGX_ERROR || rc == NGX_BUSY || rc == NGX_DECLINED) {
        ngx_http_idempotency_conn_fail(node, rc == NGX_DECLINED ? err : 0,
                                         "cannot connect to");
        return;
    }

    c = pc->connection;

    c->pool = ngx_create_pool(256, &node->log);
    if (c->pool == NULL) {
        ngx_close_connection(c);
        pc->connection = NULL;
        ngx_http_idempotency_conn_close(node);
        return;
    }

    node->conn = c;
    node->pool = c->pool;

    c->data = node;
    c->log_error = NGX_ERROR_INFO;
    c->read->handler = ngx_http_idempotency_conn_read;
    c->write->handler = ngx_http_idempotency_conn_write;

    if (rc == NGX_OK) {
        ngx_http_idempotency_conn_connected(node);
    }

    /* NGX_AGAIN: the write event tells when the connect is done */
}


static void
ngx_http_idempotency_conn_connected(ngx_http_idempotency_node_t *node)
{
    node->connected = 1;

    /*
     * Without Nagle: a finish is written the moment its response goes out
     * (node.c, op->urgent), and held back behind an unacknowledged
     * segment it reached Redis after the retry that the response allowed
     * (t/055, t/060 on a loaded machine: up to 29 of 400 retries met the
     * claim).  Commands are batched per event loop turn anyway.  A unix
     * socket has no Nagle, and a failure here only costs that order.
     */

    if (node->peer.sockaddr->sa_family != AF_UNIX) {
        (void) ngx_tcp_nodelay(node->conn);
    }

#if (NGX_SSL)
    if (node->redis->ssl) {
        ngx_http_idempotency_tls_start(node);
        return;
    }
#endif

    ngx_http_idempotency_conn_ready(node);
}


/* TCP and TLS are up: send the handshake and whatever queued behind it */

void
ngx_http_idempotency_conn_ready(ngx_http_idempotency_node_t *node)
{
    ngx_connection_t  *c;

    c = node->conn;

    node->ready = 1;

    c->read->handler = ngx_http_idempotency_conn_read;
    c->write->handler = ngx_http_idempotency_conn_write;

    if (node->connect_ev.timer_set) {
        ngx_del_timer(&node->connect_ev);
    }

    if (node->pending) {
        node->answered = ngx_current_msec;
        ngx_add_timer(&node->watchdog_ev, node->redis->timeout);
    }

    ngx_http_idempotency_conn_flush(node);

    /* TLS may hold bytes that came with its last handshake record */

    if (node->conn == c) {
        ngx_http_idempotency_conn_read(c->read);
    }
}


/* room for len more bytes of commands; the buffer grows as needed */

u_char *
ngx_http_idempotency_conn_reserve(ngx_http_idempotency_node_t *node,
    size_t len)
{
    u_char  *out;
    size_t   size, used;

    if ((size_t) (node->out_end - node->out_last) >= len) {
        return node->out_last;
    }

    used = node->out_last - node->out_pos;

    if ((size_t) (node->out_end - node->out) >= used + len) {
        /* TLS accepts a moved buffer on a retry: see tls.c */
        ngx_memmove(node->out, node->out_pos, used);
        node->out_pos = node->out;
        node->out_last = node->out + used;
        return node->out_last;
    }

    size = ngx_max((size_t) (node->out_end - node->out) * 2,
                   NGX_HTTP_IDEMPOTENCY_OUT_SIZE);

    while (size < used + len) {
        size *= 2;
    }

    out = ngx_alloc(size, node->redis->log);
    if (out == NULL) {
        return NULL;
    }

    if (used) {
        ngx_memcpy(out, node->out_pos, used);
    }

    ngx_free(node->out);

    node->out = out;
    node->out_pos = out;
    node->out_last = out + used;
    node->out_end = out + size;

    return node->out_last;
}


/*
 * A large command (a staged record) goes from the op's own copy, which it
 * keeps to be sent again: with nothing queued before it, the socket takes
 * what it can now, and only the rest is copied into the output buffer.
 * Errors are left to the flush, as for any queued bytes.
 */

ngx_int_t
ngx_http_idempotency_conn_write_now(ngx_http_idempotency_node_t *node,
    u_char *buf, size_t len)
{
    u_char            *p;
    ssize_t            n;
    ngx_connection_t  *c;

    c = node->conn;

    if (node->ready && c && node->out_pos == node->out_last) {

        while (len) {
            n = c->send(c, buf, len);

            if (n == NGX_AGAIN || n == NGX_ERROR) {
                break;
            }

            buf += n;
            len -= n;
        }

        if (len == 0) {
            return NGX_OK;
        }
    }

    p = ngx_http_idempotency_conn_reserve(node, len);
    if (p == NULL) {
        return NGX_ERROR;
    }

    node->out_last = ngx_cpymem(p, buf, len);

    return NGX_OK;
}


/*
 * What is queued, written now as far as the socket takes it: a release
 * goes before the response that lets its client retry elsewhere, which
 * may otherwise run first and find the claim.  The rest, and any error,
 * are left to the posted flush, so no caller meets a failure here.
 */

void
ngx_http_idempotency_conn_push(ngx_http_idempotency_node_t *node)
{
    if (node->ready && node->conn) {
        (void) ngx_http_idempotency_conn_send(node);
    }
}


/* the queued bytes to the socket: NGX_OK all, NGX_AGAIN, NGX_ERROR */

static ssize_t
ngx_http_idempotency_conn_send(ngx_http_idempotency_node_t *node)
{
    ssize_t            n;
    ngx_connection_t  *c;

    c = node->conn;

    while (node->out_pos < node->out_last) {
        n = c->send(c, node->out_pos, node->out_last - node->out_pos);

        if (n == NGX_AGAIN || n == NGX_ERROR) {
            return n;
        }

        node->out_pos += n;
    }

    return NGX_OK;
}


void
ngx_http_idempotency_conn_flush(ngx_http_idempotency_node_t *node)
{
    ssize_t            n;
    ngx_err_t          err;
    ngx_connection_t  *c;

    c = node->conn;

    if (!node->ready || c == NULL) {
        return;
    }

    n = ngx_http_idempotency_conn_send(node);

    if (n == NGX_AGAIN) {
        if (ngx_handle_write_event(c->write, 0) != NGX_OK) {
            ngx_http_idempotency_conn_fail(node, 0, "lost the connection to");
        }

        return;
    }

    if (n == NGX_ERROR) {
        err = ngx_socket_errno;
        ngx_http_idempotency_conn_fail(node, err, "lost the connection to");
        return;
    }

    /* the buffer a large record needed is not kept for small claims */

    if (node->out_end - node->out > NGX_HTTP_IDEMPOTENCY_OUT_KEEP) {
        ngx_free(node->out);
        node->out = NULL;
        node->out_end = NULL;
    }

    node->out_pos = node->out;
    node->out_last = node->out;
}


static void
ngx_http_idempotency_conn_write(ngx_event_t *wev)
{
    int                            err;
    socklen_t                      len;
    ngx_connection_t              *c = wev->data;
    ngx_http_idempotency_node_t   *node = c->data;

    if (node->connected) {
        ngx_http_idempotency_conn_flush(node);
        return;
    }

    /* the outcome of a non-blocking connect */

    err = 0;
    len = sizeof(int);

    if (getsockopt(c->fd, SOL_SOCKET, SO_ERROR, (void *) &err, &len) == -1) {
        err = ngx_socket_errno;
    }

    if (err) {
        ngx_http_idempotency_conn_fail(node, err, "cannot connect to");
        return;
    }

    ngx_http_idempotency_conn_connected(node);
}


/*
 * Reads until the socket is empty, feeding the reader after every read and
 * handing each complete reply to node.c, which may close the node.
 */

static void
ngx_http_idempotency_conn_read(ngx_event_t *rev)
{
    u_char                        *buf;
    size_t                         size;
    ssize_t                        n;
    ngx_err_t                      err;
    ngx_int_t                      rc;
    ngx_connection_t              *c = rev->data;
    ngx_http_idempotency_node_t   *node = c->data;
    ngx_http_idempotency_target_t *redis;

    redis = node->redis;

    if (!node->connected) {
        /* a failed connect may be reported as readable */
        ngx_http_idempotency_conn_write(c->write);
        return;
    }

    for ( ;; ) {
        buf = ngx_http_idempotency_input_buf(node, &size);

        n = c->recv(c, buf, size);

        if (n == NGX_AGAIN) {
            break;
        }

        if (n == 0 || n == NGX_ERROR) {
            if (n == 0 && node->reason_len == 0) {
                node->reason_level = NGX_LOG_INFO;
                node->reason_len = ngx_sprintf(node->reason,
                                               "closed by the server")
                                   - node->reason;
            }

            err = (n == 0) ? 0 : ngx_socket_errno;
            ngx_http_idempotency_conn_fail(node, err,
                                             "lost the connection to");
            return;
        }

        rc = ngx_http_idempotency_input(node, n);

        if (rc == NGX_ERROR) {
            /* the node is closed: nothing more to read on it */
            return;
        }

        if (rc == NGX_DECLINED) {
            goto invalid;
        }
    }

    if (ngx_handle_read_event(rev, 0) != NGX_OK) {
        ngx_http_idempotency_conn_fail(node, 0, "lost the connection to");
    }

    return;

invalid:

    if (!node->failed) {
        ngx_log_error(NGX_LOG_ERR, redis->log, 0,
                      "idempotency: redis \"%V\" sent an invalid reply: %s, "
                      "reconnecting", &redis->name,
                      node->reader->err ? node->reader->errstr
                                        : "bulk string not ended by CRLF, or "
                                          "no memory for it");
        node->failed = 1;
    }

    ngx_http_idempotency_conn_close(node);
}


/*
 * Logged once per failure streak (what is NULL: the caller has logged);
 * the next attempt tries the next address.
 */

void
ngx_http_idempotency_conn_fail(ngx_http_idempotency_node_t *node,
    ngx_err_t err, const char *what)
{
    ngx_http_idempotency_target_t *redis;

    redis = node->redis;

    if (what && !node->failed && !redis->exiting) {
        if (node->reason_len) {
            /* nginx's own line, errno included */
            err = 0;
        }

        if (node->naddrs
            && (node->naddrs > 1 || redis->resolver
                || redis->topology->nodes))
        {
            ngx_log_error(NGX_LOG_ERR, redis->log, err,
                          "idempotency: %s redis \"%V\" (%V)%s%*s", what,
                          &redis->name,
                          &node->addrs[node->addr % node->naddrs].name,
                          node->reason_len ? ": " : "",
                          node->reason_len, node->reason);

        } else {
            ngx_log_error(NGX_LOG_ERR, redis->log, err,
                          "idempotency: %s redis \"%V\"%s%*s", what,
                          &redis->name, node->reason_len ? ": " : "",
                          node->reason_len, node->reason);
        }
    }

    node->failed = 1;

    if (!node->up) {
        node->addr++;
    }

    ngx_http_idempotency_conn_close(node);
}


/*
 * Closes the connection, cancels a resolve, and lets node.c give a NULL
 * reply to every command sent or queued and plan the next connect.
 */

void
ngx_http_idempotency_conn_close(ngx_http_idempotency_node_t *node)
{
    ngx_connection_t  *c;

    if (node->resolving) {
        ngx_resolve_name_done(node->resolving);
        node->resolving = NULL;
    }

    c = node->conn;

    if (c) {
        node->conn = NULL;

#if (NGX_SSL)
        if (c->ssl) {
            /* no close_notify round trip: the replies no longer matter */
            c->ssl->no_wait_shutdown = 1;
            c->ssl->no_send_shutdown = 1;
            (void) ngx_ssl_shutdown(c);
        }
#endif

        ngx_close_connection(c);
    }

    if (node->pool) {
        ngx_destroy_pool(node->pool);
        node->pool = NULL;
    }

    if (node->reader) {
        redisReaderFree(node->reader);
        node->reader = NULL;
    }

    ngx_http_idempotency_input_reset(node);

    node->open = 0;
    node->connected = 0;
    node->ready = 0;
    node->out_pos = node->out;
    node->out_last = node->out;

    if (node->connect_ev.timer_set) {
        ngx_del_timer(&node->connect_ev);
    }

    if (node->flush_ev.posted) {
        ngx_delete_posted_event(&node->flush_ev);
    }

    ngx_http_idempotency_node_closed(node);
}


/* worker exit: what outlives the connections */

void
ngx_http_idempotency_conn_free(ngx_http_idempotency_node_t *node)
{
    if (node->addrs != node->redis->addrs) {
        ngx_free(node->addrs);
    }

    node->addrs = NULL;
    node->naddrs = 0;

    ngx_free(node->in);
    node->in = NULL;

    ngx_http_idempotency_input_reset(node);

    ngx_free(node->out);
    node->out = NULL;
    node->out_pos = NULL;
    node->out_last = NULL;
    node->out_end = NULL;

#if (NGX_SSL)
    if (node->session) {
        ngx_ssl_free_session(node->session);
        node->session = NULL;
    }
#endif
}


/*
 * Keeps the most severe line of an attempt (an SSL alert rather than the
 * reset that follows), less its time, level and pid.
 */

static void
ngx_http_idempotency_conn_log(ngx_log_t *log, ngx_uint_t level, u_char *buf,
    size_t len)
{
    u_char                       *p, *last;
    ngx_http_idempotency_node_t  *node = log->wdata;

    if (level > NGX_LOG_INFO
        || (node->reason_len && level >= node->reason_level
            && level > NGX_LOG_ALERT))
    {
        return;
    }

    last = buf + len;

    while (last > buf && (last[-1] == LF || last[-1] == CR)) {
        last--;
    }

    p = ngx_strlchr(buf, last, '#');
    p = p ? ngx_strlchr(p, last, ':') : NULL;

    if (p == NULL || last - p < 2) {
        return;
    }

    p += 2;

    if (level <= NGX_LOG_ALERT) {
        /* not about Redis but about nginx itself (epoll_ctl(), memory) */
        ngx_log_error(level, node->redis->log, 0, "%*s", last - p, p);
    }

    node->reason_level = level;
    node->reason_len = ngx_min((size_t) (last - p), sizeof(node->reason));
    ngx_memcpy(node->reason, p, node->reason_len);
}
