
/*
 * Copyright (C) The ngx_http_idempotency_module authors
 *
 * Redis Sentinel: the target's one node goes to the master the Sentinels
 * name.  A second target, private to this file, holds the connection to a
 * Sentinel: on every connect it asks for the master and subscribes to
 * +switch-master; it is reopened every 10 s (messages are lost while it is
 * down), and at once, throttled, when the master is lost, answers
 * READONLY or says in ROLE that it is no master.  target.c routes every
 * command to the node; only its address changes.
 */


#include "ngx_http_idempotency_sentinel.h"


#define NGX_HTTP_IDEMPOTENCY_SENTINEL_REFRESH   10000
#define NGX_HTTP_IDEMPOTENCY_SENTINEL_THROTTLE  1000
#define NGX_HTTP_IDEMPOTENCY_SENTINEL_NOT_MASTER  500  /* reconnect delay */




static void ngx_http_idempotency_sentinel_tls(
    ngx_http_idempotency_target_t *redis);
static ngx_str_t *ngx_http_idempotency_sentinel_tls_name(
    ngx_http_idempotency_node_t *node, ngx_uint_t *ip);
static ngx_int_t ngx_http_idempotency_sentinel_init(ngx_cycle_t *cycle,
    ngx_http_idempotency_target_t *redis);
static void ngx_http_idempotency_sentinel_exit(
    ngx_http_idempotency_target_t *redis);
static ngx_int_t ngx_http_idempotency_sentinel_handshake(
    ngx_http_idempotency_node_t *node);
static ngx_int_t ngx_http_idempotency_sentinel_reply(
    ngx_http_idempotency_node_t *node, redisReply *reply);
static void ngx_http_idempotency_sentinel_closed(
    ngx_http_idempotency_node_t *node);
static ngx_int_t ngx_http_idempotency_sentinel_resolver(ngx_conf_t *cf,
    ngx_http_idempotency_target_t *redis, ngx_resolver_t *resolver,
    ngx_msec_t resolver_timeout);
static ngx_int_t ngx_http_idempotency_sentinel_master_init(
    ngx_cycle_t *cycle, ngx_http_idempotency_target_t *redis);
static void ngx_http_idempotency_sentinel_master_exit(
    ngx_http_idempotency_target_t *redis);
static void ngx_http_idempotency_sentinel_timer(
    ngx_http_idempotency_sentinel_t *s, ngx_event_t *ev,
    ngx_event_handler_pt handler, ngx_log_t *log);
static void ngx_http_idempotency_sentinel_ask(
    ngx_http_idempotency_sentinel_t *s, ngx_uint_t stale);
static void ngx_http_idempotency_sentinel_ask_handler(ngx_event_t *ev);
static void ngx_http_idempotency_sentinel_refresh(ngx_event_t *ev);
static void ngx_http_idempotency_sentinel_addr_done(
    ngx_http_idempotency_op_t *op, redisReply *reply);
static void ngx_http_idempotency_sentinel_subscribe_done(
    ngx_http_idempotency_op_t *op, redisReply *reply);
static void ngx_http_idempotency_sentinel_role_done(
    ngx_http_idempotency_op_t *op, redisReply *reply);
static void ngx_http_idempotency_sentinel_message(
    ngx_http_idempotency_sentinel_t *s, redisReply *reply);
static ngx_int_t ngx_http_idempotency_sentinel_set_master(
    ngx_http_idempotency_sentinel_t *s, u_char *ip, size_t ip_len,
    u_char *port, size_t port_len);
static ngx_int_t ngx_http_idempotency_sentinel_set_named(
    ngx_http_idempotency_sentinel_t *s, u_char *host, size_t len,
    ngx_int_t port);
static ngx_int_t ngx_http_idempotency_sentinel_switch(
    ngx_http_idempotency_sentinel_t *s);
static ngx_int_t ngx_http_idempotency_sentinel_send(
    ngx_http_idempotency_node_t *node, ngx_http_idempotency_reply_pt handler,
    int argc, const char **argv, const size_t *argvlen);


/*
 * From tls.c once the master's TLS context exists: the Sentinels of a
 * TLS-only deployment are TLS-only too (tls-port with port 0 is set for
 * the whole server), so they share the master's CA, client certificate
 * and verification.
 */

static void
ngx_http_idempotency_sentinel_tls(ngx_http_idempotency_target_t *redis)
{
#if (NGX_SSL)
    ngx_http_idempotency_target_t *sentinels;

    sentinels = redis->sentinel->sentinels;

    sentinels->tls = redis->tls;
    sentinels->ssl = redis->ssl;
    sentinels->tls_name = redis->tls_name;
    sentinels->tls_name_ip = redis->tls_name_ip;
    sentinels->tls_verify = redis->tls_verify;
    sentinels->tls_conf = redis->tls_conf;
#endif
}


/*
 * Without idempotency_redis_tls_name, the name TLS sends and verifies is
 * the host of the address connected to: a Sentinel's as written, the
 * master's as a Sentinel named it (an IP address, matched to an IP SAN).
 */

static ngx_str_t *
ngx_http_idempotency_sentinel_tls_name(ngx_http_idempotency_node_t *node,
    ngx_uint_t *ip)
{
    ngx_str_t                        *name;
    ngx_http_idempotency_sentinel_t  *s;

#if (NGX_SSL)
    if (node->redis->tls_name.len) {
        /* idempotency_redis_tls_name */
        return NULL;
    }
#endif

    s = node->redis->sentinel;

    if (node->redis == s->redis) {
        name = &s->master_host;

    } else {
        name = &s->hosts[node->addr % node->naddrs];
    }

    *ip = ngx_http_idempotency_is_ip(name);

    return name;
}


/*
 * From redis_init(): for the master's target, start the Sentinel
 * connection and wait for its answer before connecting; NGX_DECLINED for
 * the Sentinels' own target, which connects as any other.
 */

static ngx_int_t
ngx_http_idempotency_sentinel_init(ngx_cycle_t *cycle,
    ngx_http_idempotency_target_t *redis)
{
    ngx_http_idempotency_sentinel_t  *s;

    s = redis->sentinel;

    if (redis != s->redis) {
        return NGX_DECLINED;
    }

    /* "connected to sentinel" every 10 s is not worth a line */

    s->log = *cycle->log;

    if (s->log.log_level > NGX_LOG_WARN) {
        s->log.log_level = NGX_LOG_WARN;
    }

    s->sentinels->timeout = redis->timeout;

    ngx_http_idempotency_sentinel_timer(s, &s->refresh_ev,
                                        ngx_http_idempotency_sentinel_refresh,
                                        cycle->log);
    ngx_http_idempotency_sentinel_timer(s, &s->ask_ev,
                                    ngx_http_idempotency_sentinel_ask_handler,
                                    cycle->log);

    if (ngx_http_idempotency_redis_init(cycle, s->sentinels) != NGX_OK) {
        return NGX_ERROR;
    }

    /* redis_init() set the log to the cycle's */
    s->sentinels->log = &s->log;

    ngx_add_timer(&s->refresh_ev, NGX_HTTP_IDEMPOTENCY_SENTINEL_REFRESH);

    return NGX_OK;
}


static void
ngx_http_idempotency_sentinel_timer(ngx_http_idempotency_sentinel_t *s,
    ngx_event_t *ev, ngx_event_handler_pt handler, ngx_log_t *log)
{
    ev->handler = handler;
    ev->data = s;
    ev->log = log;
    ev->cancelable = 1;
}


static void
ngx_http_idempotency_sentinel_exit(ngx_http_idempotency_target_t *redis)
{
    ngx_http_idempotency_sentinel_t  *s;

    s = redis->sentinel;

    if (redis != s->redis) {
        return;
    }

    if (s->refresh_ev.timer_set) {
        ngx_del_timer(&s->refresh_ev);
    }

    if (s->ask_ev.timer_set) {
        ngx_del_timer(&s->ask_ev);
    }

    if (redis->node && redis->node->reconnect_ev.posted) {
        ngx_delete_posted_event(&redis->node->reconnect_ev);
    }

    ngx_http_idempotency_redis_exit(s->sentinels);
}


/*
 * At the end of handshake.c's handshake (AUTH, SELECT, CLIENT SETNAME): the
 * master is asked for its ROLE, and NGX_OK lets SCRIPT LOAD follow; a
 * Sentinel is asked for the master and subscribed, and NGX_DONE means
 * that nothing follows.
 */

static ngx_int_t
ngx_http_idempotency_sentinel_handshake(ngx_http_idempotency_node_t *node)
{
    size_t                            argvlen[3];
    const char                       *argv[3];
    ngx_http_idempotency_sentinel_t  *s;

    s = node->redis->sentinel;

    if (node->redis == s->redis) {
        ngx_http_idempotency_arg(argv, argvlen, 0, "ROLE");

        (void) ngx_http_idempotency_sentinel_send(node,
                                   ngx_http_idempotency_sentinel_role_done,
                                   1, argv, argvlen);
        return NGX_OK;
    }

    s->answered = 0;
    s->tried = node->addr;

    ngx_http_idempotency_arg(argv, argvlen, 0, "SENTINEL");
    ngx_http_idempotency_arg(argv, argvlen, 1, "get-master-addr-by-name");
    argv[2] = (const char *) s->master.data;
    argvlen[2] = s->master.len;

    if (ngx_http_idempotency_sentinel_send(node,
                                   ngx_http_idempotency_sentinel_addr_done,
                                   3, argv, argvlen)
        != NGX_OK)
    {
        return NGX_DONE;
    }

    ngx_http_idempotency_arg(argv, argvlen, 0, "SUBSCRIBE");
    ngx_http_idempotency_arg(argv, argvlen, 1, "+switch-master");

    (void) ngx_http_idempotency_sentinel_send(node,
                               ngx_http_idempotency_sentinel_subscribe_done,
                               2, argv, argvlen);

    return NGX_DONE;
}


static ngx_int_t
ngx_http_idempotency_sentinel_send(ngx_http_idempotency_node_t *node,
    ngx_http_idempotency_reply_pt handler, int argc, const char **argv,
    const size_t *argvlen)
{
    ngx_http_idempotency_op_t  *op;

    op = ngx_http_idempotency_op_alloc(node->redis);
    if (op == NULL) {
        return NGX_ERROR;
    }

    op->handler = handler;

    return ngx_http_idempotency_node_command(node, op, argc, argv, argvlen);
}


/*
 * Every reply, before node.c matches it to a command: a +switch-master
 * message on the Sentinel connection is taken here (NGX_DONE); READONLY
 * from the master means that it was demoted: the Sentinels are asked
 * again, and the command gets the error.
 */

static ngx_int_t
ngx_http_idempotency_sentinel_reply(ngx_http_idempotency_node_t *node,
    redisReply *reply)
{
    ngx_http_idempotency_sentinel_t  *s;

    s = node->redis->sentinel;

    if (node->redis == s->redis) {
        if (ngx_http_idempotency_reply_is(reply, "READONLY")) {
            ngx_http_idempotency_sentinel_ask(s, 1);
        }

        return NGX_OK;
    }

    if (reply->type == REDIS_REPLY_ARRAY
        && reply->elements == 3
        && reply->element[0]->type == REDIS_REPLY_STRING
        && reply->element[0]->len == 7
        && ngx_strncmp(reply->element[0]->str, "message", 7) == 0)
    {
        ngx_http_idempotency_sentinel_message(s, reply);
        return NGX_DONE;
    }

    return NGX_OK;
}


/* "NAME OLD-IP OLD-PORT NEW-IP NEW-PORT" */

static void
ngx_http_idempotency_sentinel_message(ngx_http_idempotency_sentinel_t *s,
    redisReply *reply)
{
    u_char      *p, *last, *word[5];
    size_t       len[5];
    ngx_uint_t   n;
    redisReply  *payload;

    payload = reply->element[2];

    if (payload->type != REDIS_REPLY_STRING) {
        return;
    }

    p = (u_char *) payload->str;
    last = p + payload->len;

    for (n = 0; n < 5; n++) {
        while (p < last && *p == ' ') {
            p++;
        }

        word[n] = p;

        while (p < last && *p != ' ') {
            p++;
        }

        len[n] = p - word[n];

        if (len[n] == 0) {
            return;
        }
    }

    if (len[0] != s->master.len
        || ngx_strncmp(word[0], s->master.data, len[0]) != 0)
    {
        return;
    }

    (void) ngx_http_idempotency_sentinel_set_master(s, word[3], len[3],
                                                    word[4], len[4]);
}


static void
ngx_http_idempotency_sentinel_addr_done(ngx_http_idempotency_op_t *op,
    redisReply *reply)
{
    ngx_http_idempotency_node_t      *node;
    ngx_http_idempotency_sentinel_t  *s;

    s = op->redis->sentinel;
    node = op->node;

    if (reply == NULL) {
        return;
    }

    if (reply->type == REDIS_REPLY_ARRAY
        && reply->elements == 2
        && reply->element[0]->type == REDIS_REPLY_STRING
        && reply->element[1]->type == REDIS_REPLY_STRING
        && ngx_http_idempotency_sentinel_set_master(s,
                                         (u_char *) reply->element[0]->str,
                                         reply->element[0]->len,
                                         (u_char *) reply->element[1]->str,
                                         reply->element[1]->len)
           == NGX_OK)
    {
        s->answered = 1;
        s->complained = 0;
        return;
    }

    /* an unknown name (nil), an error, NOAUTH: the next Sentinel */

    if (!s->complained) {
        ngx_log_error(NGX_LOG_ERR, s->redis->log, 0,
                      "idempotency: sentinel %V did not name master \"%V\"%s"
                      "%*s, asking the next one",
                      &node->addrs[node->addr % node->naddrs].name,
                      &s->master,
                      reply->type == REDIS_REPLY_ERROR ? ": " : "",
                      reply->type == REDIS_REPLY_ERROR ? (size_t) reply->len
                                                       : 0,
                      reply->type == REDIS_REPLY_ERROR ? reply->str : "");
        s->complained = 1;
    }

    /* throttled: a Sentinel that keeps failing is not hammered */
    ngx_http_idempotency_sentinel_ask(s, 1);
}


static void
ngx_http_idempotency_sentinel_subscribe_done(ngx_http_idempotency_op_t *op,
    redisReply *reply)
{
    ngx_http_idempotency_sentinel_t  *s;

    s = op->redis->sentinel;

    if (reply == NULL || reply->type != REDIS_REPLY_ERROR) {
        return;
    }

    /* the answer stands; switches are then seen within 10 s */

    ngx_log_error(NGX_LOG_WARN, s->redis->log, 0,
                  "idempotency: sentinel refused SUBSCRIBE +switch-master: "
                  "%*s", (size_t) reply->len, reply->str);
}


/*
 * A "master" that is not (yet, or any more) one: whatever was pipelined
 * behind gets no reply (a claim goes again on the next connection), and
 * the Sentinels, starting with the next one, are asked again.
 */

static void
ngx_http_idempotency_sentinel_role_done(ngx_http_idempotency_op_t *op,
    redisReply *reply)
{
    ngx_str_t                         role;
    ngx_http_idempotency_node_t      *node;
    ngx_http_idempotency_sentinel_t  *s;

    s = op->redis->sentinel;
    node = op->node;

    if (reply == NULL) {
        return;
    }

    ngx_str_set(&role, "?");

    if (reply->type == REDIS_REPLY_ARRAY
        && reply->elements > 0
        && (reply->element[0]->type == REDIS_REPLY_STRING
            || reply->element[0]->type == REDIS_REPLY_STATUS))
    {
        role.data = (u_char *) reply->element[0]->str;
        role.len = ngx_min(reply->element[0]->len, 16);

        if (role.len == 6 && ngx_strncmp(role.data, "master", 6) == 0) {
            s->not_master = 0;
            return;
        }

    } else if (reply->type == REDIS_REPLY_ERROR) {
        role.data = (u_char *) reply->str;
        role.len = ngx_min(reply->len, 64);
    }

    if (!s->not_master) {
        ngx_log_error(NGX_LOG_ERR, s->redis->log, 0,
                      "idempotency: redis \"%V\" at %V is no master "
                      "(ROLE: %V), asking the sentinels again",
                      &s->redis->name,
                      &node->addrs[node->addr % node->naddrs].name, &role);
        s->not_master = 1;
    }

    node->failed = 1;
    node->handshake_failed = 1;
    node->backoff = NGX_HTTP_IDEMPOTENCY_SENTINEL_NOT_MASTER;

    ngx_http_idempotency_redis_reset(s->redis);
    ngx_http_idempotency_sentinel_ask(s, 1);
}


/*
 * The master's address, from a Sentinel's answer or message.  A new one
 * replaces the old, whose connection is closed: commands in flight get
 * no reply (claims go again, once, on the new one).
 */

static ngx_int_t
ngx_http_idempotency_sentinel_set_master(ngx_http_idempotency_sentinel_t *s,
    u_char *ip, size_t ip_len, u_char *port, size_t port_len)
{
    u_char                       *p;
    ngx_int_t                     n;
    in_addr_t                     in;
    ngx_addr_t                   *addr;
    ngx_sockaddr_t               *sa;
    ngx_http_idempotency_node_t  *node;
#if (NGX_HAVE_INET6)
    u_char                        in6[16];
#endif

    node = s->redis->node;

    n = ngx_atoi(port, port_len);

    if (node == NULL || n < 1 || n > 65535 || ip_len >= NGX_SOCKADDR_STRLEN) {
        return NGX_ERROR;
    }

    p = ngx_alloc(sizeof(ngx_addr_t) + sizeof(ngx_sockaddr_t)
                  + NGX_SOCKADDR_STRLEN, s->redis->log);
    if (p == NULL) {
        return NGX_ERROR;
    }

    addr = (ngx_addr_t *) p;
    sa = (ngx_sockaddr_t *) (p + sizeof(ngx_addr_t));
    ngx_memzero(sa, sizeof(ngx_sockaddr_t));

    in = ngx_inet_addr(ip, ip_len);

    if (in != INADDR_NONE) {
        sa->sockaddr_in.sin_family = AF_INET;
        sa->sockaddr_in.sin_addr.s_addr = in;
        addr->socklen = sizeof(struct sockaddr_in);

#if (NGX_HAVE_INET6)
    } else if (ngx_inet6_addr(ip, ip_len, in6) == NGX_OK) {
        sa->sockaddr_in6.sin6_family = AF_INET6;
        ngx_memcpy(sa->sockaddr_in6.sin6_addr.s6_addr, in6, 16);
        addr->socklen = sizeof(struct sockaddr_in6);
#endif

    } else if (s->redis->resolver) {
        /* a host name (announce-hostnames yes): resolved on connect */
        ngx_free(p);
        return ngx_http_idempotency_sentinel_set_named(s, ip, ip_len, n);

    } else {
        /* once per streak: it stands for "did not name master" too */

        if (!s->complained) {
            ngx_log_error(NGX_LOG_ERR, s->redis->log, 0,
                          "idempotency: sentinel named master \"%V\" at "
                          "\"%*s\", not an IP address (a host name needs "
                          "a \"resolver\")", &s->master, ip_len, ip);
            s->complained = 1;
        }

        ngx_free(p);
        return NGX_ERROR;
    }

    addr->sockaddr = &sa->sockaddr;
    ngx_inet_set_port(addr->sockaddr, (in_port_t) n);

    addr->name.data = p + sizeof(ngx_addr_t) + sizeof(ngx_sockaddr_t);
    addr->name.len = ngx_sock_ntop(addr->sockaddr, addr->socklen,
                                   addr->name.data, NGX_SOCKADDR_STRLEN, 1);

    if (node->naddrs && s->redis->host.len == 0
        && ngx_cmp_sockaddr(node->addrs[0].sockaddr, node->addrs[0].socklen,
                            addr->sockaddr, addr->socklen, 1)
           == NGX_OK)
    {
        ngx_free(p);
        return NGX_OK;
    }

    /* brackets off, NUL-terminated: for TLS */

    if (ip_len > 2 && ip[0] == '[' && ip[ip_len - 1] == ']') {
        ip++;
        ip_len -= 2;
    }

    *ngx_cpymem(s->master_buf, ip, ip_len) = '\0';
    s->master_host.data = s->master_buf;
    s->master_host.len = ip_len;

    if (node->naddrs) {
        ngx_log_error(NGX_LOG_NOTICE, s->redis->log, 0,
                      "idempotency: redis \"%V\": the master is now %V, "
                      "was %V", &s->redis->name, &addr->name,
                      &node->addrs[0].name);

    } else {
        ngx_log_error(NGX_LOG_NOTICE, s->redis->log, 0,
                      "idempotency: redis \"%V\": the master is %V",
                      &s->redis->name, &addr->name);
    }

    ngx_free(node->addrs);

    node->addrs = addr;
    node->naddrs = 1;

    /* no longer a name to resolve */
    s->redis->host.len = 0;

    return ngx_http_idempotency_sentinel_switch(s);
}


/*
 * A master named by host name: conn.c resolves redis->host with the
 * resolver on every connect, as it does a standalone name; TLS verifies
 * that name
 */

static ngx_int_t
ngx_http_idempotency_sentinel_set_named(ngx_http_idempotency_sentinel_t *s,
    u_char *host, size_t len, ngx_int_t port)
{
    ngx_http_idempotency_node_t   *node;
    ngx_http_idempotency_target_t *redis;

    redis = s->redis;
    node = redis->node;

    if (redis->host.len == len && redis->port == port
        && ngx_strncasecmp(redis->host.data, host, len) == 0)
    {
        return NGX_OK;
    }

    *ngx_cpymem(s->master_buf, host, len) = '\0';
    s->master_host.data = s->master_buf;
    s->master_host.len = len;

    redis->host = s->master_host;
    redis->port = (in_port_t) port;

    ngx_log_error(NGX_LOG_NOTICE, redis->log, 0,
                  "idempotency: redis \"%V\": the master is %s%V:%i",
                  &redis->name, node->naddrs ? "now " : "", &redis->host,
                  port);

    ngx_free(node->addrs);

    node->addrs = NULL;
    node->naddrs = 0;

    return ngx_http_idempotency_sentinel_switch(s);
}


/* the node goes to the master's new address, at once */

static ngx_int_t
ngx_http_idempotency_sentinel_switch(ngx_http_idempotency_sentinel_t *s)
{
    ngx_http_idempotency_node_t  *node;

    node = s->redis->node;

    node->addr = 0;
    node->failed = 0;
    s->not_master = 0;

    if (node->open) {
        /* closed; sentinel_closed() reconnects at once, to the new one */
        s->switching = 1;
        ngx_http_idempotency_redis_reset(s->redis);
        return NGX_OK;
    }

    /* waiting for an address, or backing off from the old one */

    if (node->reconnect_ev.timer_set) {
        ngx_del_timer(&node->reconnect_ev);
    }

    node->backoff = 1;
    ngx_add_timer(&node->reconnect_ev, 1);

    return NGX_OK;
}


/*
 * The end of a connection, after what any target's node does (the next
 * one planned): a Sentinel that gave no usable answer, or one that turned
 * out wrong, is followed by the next one; a lost master makes the
 * Sentinels be asked again.
 */

static void
ngx_http_idempotency_sentinel_closed(ngx_http_idempotency_node_t *node)
{
    ngx_http_idempotency_sentinel_t  *s;

    s = node->redis->sentinel;

    ngx_http_idempotency_target_closed(node);

    if (node->redis->exiting || ngx_exiting || ngx_terminate) {
        return;
    }

    if (node->redis == s->redis) {
        if (!s->switching) {
            ngx_http_idempotency_sentinel_ask(s, 0);
            return;
        }

        /*
         * no backoff: requests in between would find no connection; the
         * posted event runs in this same event loop iteration
         */

        s->switching = 0;

        if (node->reconnect_ev.timer_set) {
            ngx_del_timer(&node->reconnect_ev);
        }

        ngx_post_event(&node->reconnect_ev, &ngx_posted_events);
        return;
    }

    /*
     * once per connection: a connect that failed or timed out has moved
     * on already, and moving twice would skip every other address (of
     * two, such as a name's [::1] and 127.0.0.1, the second forever)
     */

    if ((!s->answered || s->stale) && node->addr == s->tried) {
        node->addr++;
    }

    s->answered = 0;
    s->stale = 0;
}


/* at most once a second: a flapping master must not hammer the Sentinels */

static void
ngx_http_idempotency_sentinel_ask(ngx_http_idempotency_sentinel_t *s,
    ngx_uint_t stale)
{
    ngx_msec_t  elapsed;

    if (stale) {
        s->stale = 1;
    }

    if (s->ask_ev.timer_set || s->redis->exiting || ngx_exiting) {
        return;
    }

    elapsed = ngx_current_msec - s->asked;

    ngx_add_timer(&s->ask_ev,
                  elapsed >= NGX_HTTP_IDEMPOTENCY_SENTINEL_THROTTLE
                  ? 1 : NGX_HTTP_IDEMPOTENCY_SENTINEL_THROTTLE - elapsed);
}


/* a new connection to a Sentinel asks for the master and subscribes */

static void
ngx_http_idempotency_sentinel_ask_handler(ngx_event_t *ev)
{
    ngx_http_idempotency_sentinel_t  *s = ev->data;

    ngx_http_idempotency_node_t  *node;

    s->asked = ngx_current_msec;

    node = s->sentinels->node;

    /* one that is not open is reconnecting, and will ask */

    if (node && node->open) {
        ngx_http_idempotency_redis_reset(s->sentinels);
    }
}


static void
ngx_http_idempotency_sentinel_refresh(ngx_event_t *ev)
{
    ngx_http_idempotency_sentinel_t  *s = ev->data;

    if (s->redis->exiting || ngx_exiting) {
        return;
    }

    ngx_http_idempotency_sentinel_ask(s, 0);

    ngx_add_timer(&s->refresh_ev, NGX_HTTP_IDEMPOTENCY_SENTINEL_REFRESH);
}


/*
 * The master's target: its address comes from the Sentinels, which may
 * name it by host name (resolved with the resolver of where it is used)
 */

static ngx_int_t
ngx_http_idempotency_sentinel_resolver(ngx_conf_t *cf,
    ngx_http_idempotency_target_t *redis, ngx_resolver_t *resolver,
    ngx_msec_t resolver_timeout)
{
    if (redis->resolver == NULL && resolver) {
        redis->resolver = resolver;
        redis->resolver_timeout = resolver_timeout;
    }

    return NGX_OK;
}


static ngx_int_t
ngx_http_idempotency_sentinel_master_init(ngx_cycle_t *cycle,
    ngx_http_idempotency_target_t *redis)
{
    if (ngx_http_idempotency_redis_node(cycle, redis) == NULL) {
        return NGX_ERROR;
    }

    return ngx_http_idempotency_sentinel_init(cycle, redis);
}


static void
ngx_http_idempotency_sentinel_master_exit(ngx_http_idempotency_target_t *redis)
{
    ngx_http_idempotency_sentinel_exit(redis);
    ngx_http_idempotency_redis_node_exit(redis);
}


/*
 * The nodes of both targets: the master's asks for its ROLE, and a
 * READONLY from it has the Sentinels asked again; a Sentinel's asks for
 * the master and takes the +switch-master messages
 */

static ngx_http_idempotency_node_owner_t
    ngx_http_idempotency_sentinel_owner = {
    ngx_http_idempotency_sentinel_handshake,
    ngx_http_idempotency_target_up,
    ngx_http_idempotency_sentinel_reply,
    NULL,                                  /* redirect */
    NULL,                                  /* lost */
    NULL,                                  /* wanted */
    ngx_http_idempotency_sentinel_closed
};


ngx_http_idempotency_topology_t  ngx_http_idempotency_sentinel_topology = {
    ngx_http_idempotency_sentinel_resolver,
    ngx_http_idempotency_sentinel_tls,
    ngx_http_idempotency_sentinel_tls_name,
    ngx_http_idempotency_sentinel_master_init,
    ngx_http_idempotency_sentinel_master_exit,
    ngx_http_idempotency_standalone_command,
    ngx_http_idempotency_redis_node_load_script,
    NULL,                                  /* master */
    &ngx_http_idempotency_sentinel_owner,
    0,                                     /* nodes */
    1,                                     /* moves */
    1                                      /* tls_found */
};


/* the Sentinels' own target: one node, tried address by address */

ngx_http_idempotency_topology_t  ngx_http_idempotency_sentinels_topology = {
    NULL,                                  /* conf */
    NULL,                                  /* tls */
    ngx_http_idempotency_sentinel_tls_name,
    ngx_http_idempotency_standalone_init,
    ngx_http_idempotency_redis_node_exit,
    ngx_http_idempotency_standalone_command,
    ngx_http_idempotency_redis_node_load_script,
    NULL,                                  /* master */
    &ngx_http_idempotency_sentinel_owner,
    0,                                     /* nodes */
    0,                                     /* moves */
    1                                      /* tls_found */
};
