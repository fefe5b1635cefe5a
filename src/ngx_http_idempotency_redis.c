
/*
 * Copyright (C) The ngx_http_idempotency_module authors
 *
 * hiredis's async API on nginx's event loop: one pipelined connection per
 * worker per Redis target, nginx timers for every timeout, reconnect with
 * backoff.  hiredis owns the socket; we only borrow an ngx_connection_t for
 * its events and never close the fd ourselves.
 */


#include "ngx_http_idempotency_module.h"


#define NGX_HTTP_IDEMPOTENCY_BACKOFF_MIN  10
#define NGX_HTTP_IDEMPOTENCY_BACKOFF_MAX  500
#define NGX_HTTP_IDEMPOTENCY_CMD_STACK    4096    /* claims, small stores */


static void ngx_http_idempotency_redis_connect(
    ngx_http_idempotency_redis_t *redis);
static void ngx_http_idempotency_redis_schedule(
    ngx_http_idempotency_redis_t *redis);
static void ngx_http_idempotency_redis_handshake(
    ngx_http_idempotency_redis_t *redis);
static void ngx_http_idempotency_handshake_done(ngx_http_idempotency_op_t *op,
    redisReply *reply);
static void ngx_http_idempotency_setname_done(ngx_http_idempotency_op_t *op,
    redisReply *reply);
static void ngx_http_idempotency_script_done(ngx_http_idempotency_op_t *op,
    redisReply *reply);
static void ngx_http_idempotency_redis_reply(redisAsyncContext *ac,
    void *reply, void *data);
static void ngx_http_idempotency_on_connect(const redisAsyncContext *ac,
    int status);
static void ngx_http_idempotency_on_disconnect(const redisAsyncContext *ac,
    int status);
static void ngx_http_idempotency_add_read(void *data);
static void ngx_http_idempotency_del_read(void *data);
static void ngx_http_idempotency_add_write(void *data);
static void ngx_http_idempotency_del_write(void *data);
static void ngx_http_idempotency_cleanup(void *data);
static void ngx_http_idempotency_read_handler(ngx_event_t *ev);
static void ngx_http_idempotency_redis_unsolicited(
    ngx_http_idempotency_redis_t *redis, redisReply *reply);
static void ngx_http_idempotency_write_handler(ngx_event_t *ev);
static void ngx_http_idempotency_connect_timeout(ngx_event_t *ev);
static void ngx_http_idempotency_reconnect(ngx_event_t *ev);
static void ngx_http_idempotency_reset_handler(ngx_event_t *ev);
static void ngx_http_idempotency_watchdog(ngx_event_t *ev);
static void ngx_http_idempotency_flush_handler(ngx_event_t *ev);


static ngx_http_idempotency_op_t  *ngx_http_idempotency_free_ops;


ngx_int_t
ngx_http_idempotency_redis_init(ngx_cycle_t *cycle,
    ngx_http_idempotency_redis_t *redis)
{
    redis->log = cycle->log;
    redis->backoff = NGX_HTTP_IDEMPOTENCY_BACKOFF_MIN;

    /* only workers serve requests: not the cache manager nor the loader */

    if (ngx_process != NGX_PROCESS_WORKER
        && ngx_process != NGX_PROCESS_SINGLE)
    {
        return NGX_OK;
    }

    /*
     * connection-level timers are cancelable so that a gracefully exiting
     * worker does not wait for them; the watchdog is not: it bounds the
     * wait for the replies of stores still in flight
     */

    redis->connect_ev.handler = ngx_http_idempotency_connect_timeout;
    redis->connect_ev.data = redis;
    redis->connect_ev.log = cycle->log;
    redis->connect_ev.cancelable = 1;

    redis->reconnect_ev.handler = ngx_http_idempotency_reconnect;
    redis->reconnect_ev.data = redis;
    redis->reconnect_ev.log = cycle->log;
    redis->reconnect_ev.cancelable = 1;

    redis->reset_ev.handler = ngx_http_idempotency_reset_handler;
    redis->reset_ev.data = redis;
    redis->reset_ev.log = cycle->log;

    redis->watchdog_ev.handler = ngx_http_idempotency_watchdog;
    redis->watchdog_ev.data = redis;
    redis->watchdog_ev.log = cycle->log;

    redis->flush_ev.handler = ngx_http_idempotency_flush_handler;
    redis->flush_ev.data = redis;
    redis->flush_ev.log = cycle->log;

    ngx_http_idempotency_redis_connect(redis);

    return NGX_OK;
}


void
ngx_http_idempotency_redis_exit(ngx_http_idempotency_redis_t *redis)
{
    redis->exiting = 1;

    if (redis->ac) {
        /* pending callbacks run with a NULL reply, then our cleanup */
        redisAsyncFree(redis->ac);
    }

    if (redis->reconnect_ev.timer_set) {
        ngx_del_timer(&redis->reconnect_ev);
    }

    if (redis->reset_ev.posted) {
        ngx_delete_posted_event(&redis->reset_ev);
    }

    if (redis->flush_ev.posted) {
        ngx_delete_posted_event(&redis->flush_ev);
    }
}


static void
ngx_http_idempotency_redis_connect(ngx_http_idempotency_redis_t *redis)
{
    ngx_connection_t   *c;
    redisAsyncContext  *ac;

    /* numeric address or unix path only: no DNS in a worker */

    if (redis->path) {
        ac = redisAsyncConnectUnix((char *) redis->path);

    } else {
        ac = redisAsyncConnect((char *) redis->host, (int) redis->port);
    }

    if (ac == NULL) {
        ngx_log_error(NGX_LOG_ERR, redis->log, 0,
                      "idempotency: cannot allocate a redis context");
        ngx_http_idempotency_redis_schedule(redis);
        return;
    }

    if (ac->err) {
        if (!redis->failed) {
            ngx_log_error(NGX_LOG_ERR, redis->log, 0,
                          "idempotency: cannot connect to redis \"%V\": %s",
                          &redis->name, ac->errstr);
            redis->failed = 1;
        }

        redisAsyncFree(ac);
        ngx_http_idempotency_redis_schedule(redis);
        return;
    }

    c = ngx_get_connection(ac->c.fd, redis->log);
    if (c == NULL) {
        redisAsyncFree(ac);
        ngx_http_idempotency_redis_schedule(redis);
        return;
    }

    c->log = redis->log;
    c->read->log = redis->log;
    c->write->log = redis->log;
    c->data = redis;
    c->read->handler = ngx_http_idempotency_read_handler;
    c->write->handler = ngx_http_idempotency_write_handler;
    c->number = ngx_atomic_fetch_add(ngx_connection_counter, 1);

    redis->conn = c;
    redis->ac = ac;
    redis->handshake_failed = 0;
    ac->data = redis;

    /* hooks first: setting the connect callback already arms a write */

    ac->ev.data = redis;
    ac->ev.addRead = ngx_http_idempotency_add_read;
    ac->ev.delRead = ngx_http_idempotency_del_read;
    ac->ev.addWrite = ngx_http_idempotency_add_write;
    ac->ev.delWrite = ngx_http_idempotency_del_write;
    ac->ev.cleanup = ngx_http_idempotency_cleanup;

    redisAsyncSetConnectCallback(ac, ngx_http_idempotency_on_connect);
    redisAsyncSetDisconnectCallback(ac, ngx_http_idempotency_on_disconnect);

    ngx_add_timer(&redis->connect_ev, redis->timeout);

    ngx_http_idempotency_redis_handshake(redis);
}


/*
 * AUTH, SELECT, CLIENT SETNAME and SCRIPT LOAD are pipelined ahead of every
 * request; the reply to CLIENT SETNAME tells that AUTH and SELECT passed
 */

static void
ngx_http_idempotency_redis_handshake(ngx_http_idempotency_redis_t *redis)
{
    int                         argc;
    u_char                      db[NGX_INT_T_LEN];
    u_char                      name[sizeof("nginx-idempotency-")
                                     + NGX_INT64_LEN];
    size_t                      argvlen[3];
    const char                 *argv[3];
    ngx_http_idempotency_op_t  *op;

    if (redis->password.len) {
        argc = 0;
        argv[argc] = "AUTH";
        argvlen[argc++] = 4;

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
        op->handshake = 1;

        if (ngx_http_idempotency_redis_command(op, argc, argv, argvlen)
            != NGX_OK)
        {
            return;
        }
    }

    if (redis->db) {
        argv[0] = "SELECT";
        argvlen[0] = 6;
        argv[1] = (const char *) db;
        argvlen[1] = ngx_sprintf(db, "%ui", redis->db) - db;

        op = ngx_http_idempotency_op_alloc(redis);
        if (op == NULL) {
            return;
        }

        op->handler = ngx_http_idempotency_handshake_done;
        op->handshake = 1;

        if (ngx_http_idempotency_redis_command(op, 2, argv, argvlen)
            != NGX_OK)
        {
            return;
        }
    }

    argv[0] = "CLIENT";
    argvlen[0] = 6;
    argv[1] = "SETNAME";
    argvlen[1] = 7;
    argv[2] = (const char *) name;
    argvlen[2] = ngx_sprintf(name, "nginx-idempotency-%P", ngx_pid) - name;

    op = ngx_http_idempotency_op_alloc(redis);
    if (op == NULL) {
        return;
    }

    op->handler = ngx_http_idempotency_setname_done;
    op->handshake = 1;

    if (ngx_http_idempotency_redis_command(op, 3, argv, argvlen) != NGX_OK) {
        return;
    }

    ngx_http_idempotency_redis_load_script(redis);
}


/* also after a NOSCRIPT: SCRIPT FLUSH, or a failover to another node */

void
ngx_http_idempotency_redis_load_script(ngx_http_idempotency_redis_t *redis)
{
    size_t                      argvlen[3];
    const char                 *argv[3];
    ngx_http_idempotency_op_t  *op;

    argv[0] = "SCRIPT";
    argvlen[0] = 6;
    argv[1] = "LOAD";
    argvlen[1] = 4;
    argv[2] = (const char *) ngx_http_idempotency_claim_script.data;
    argvlen[2] = ngx_http_idempotency_claim_script.len;

    op = ngx_http_idempotency_op_alloc(redis);
    if (op == NULL) {
        return;
    }

    op->handler = ngx_http_idempotency_script_done;
    op->handshake = 1;

    (void) ngx_http_idempotency_redis_command(op, 3, argv, argvlen);
}


/*
 * A refused AUTH leaves the connection open as the default user: drop it,
 * and the replies of whatever was pipelined behind it.  The backoff goes on
 * growing as for a refused connect, and the refusal is logged once.
 */

static void
ngx_http_idempotency_handshake_done(ngx_http_idempotency_op_t *op,
    redisReply *reply)
{
    ngx_http_idempotency_redis_t  *redis;

    redis = op->redis;

    if (reply == NULL || reply->type != REDIS_REPLY_ERROR) {
        return;
    }

    if (!redis->refused) {
        ngx_log_error(NGX_LOG_ERR, redis->log, 0,
                      "idempotency: redis \"%V\" refused the handshake: %*s",
                      &redis->name, (size_t) reply->len, reply->str);
        redis->refused = 1;
    }

    redis->failed = 1;
    redis->handshake_failed = 1;
    ngx_http_idempotency_redis_reset(redis);
}


/*
 * Not being allowed to name the connection (an ACL, a renamed command) is
 * harmless, and means AUTH and SELECT have passed.  Any other error, such
 * as "max number of clients reached" sent on accept to a connection
 * without AUTH or SELECT, is a refused handshake.
 */

static void
ngx_http_idempotency_setname_done(ngx_http_idempotency_op_t *op,
    redisReply *reply)
{
    ngx_str_t                      err;
    ngx_http_idempotency_redis_t  *redis;

    redis = op->redis;

    if (reply == NULL) {
        return;
    }

    if (reply->type == REDIS_REPLY_ERROR) {
        err.data = (u_char *) reply->str;
        err.len = reply->len;

        if (!(err.len >= 6 && ngx_strncmp(err.data, "NOPERM", 6) == 0)
            && ngx_strlcasestrn(err.data, err.data + err.len,
                                (u_char *) "unknown", 7 - 1)
               == NULL)
        {
            ngx_http_idempotency_handshake_done(op, reply);
            return;
        }

        ngx_log_error(NGX_LOG_INFO, redis->log, 0,
                      "idempotency: redis \"%V\" refused CLIENT SETNAME: %V",
                      &redis->name, &err);
    }

    ngx_log_error(NGX_LOG_NOTICE, redis->log, 0,
                  "idempotency: connected to redis \"%V\"%s",
                  &redis->name, redis->was_up ? " again" : "");

    ngx_http_idempotency_metrics_redis_up(redis);

    redis->up = 1;
    redis->was_up = 1;
    redis->failed = 0;
    redis->refused = 0;
    redis->backoff = NGX_HTTP_IDEMPOTENCY_BACKOFF_MIN;
}


/*
 * Claims do not need the script on Redis >= 7 (SET NX GET), so an ACL that
 * forbids scripting is no reason to drop the connection; the finish script
 * (EVAL) is refused then too, and each refused store says so.
 */

static void
ngx_http_idempotency_script_done(ngx_http_idempotency_op_t *op,
    redisReply *reply)
{
    ngx_http_idempotency_redis_t  *redis;

    redis = op->redis;

    if (reply == NULL) {
        return;
    }

    if (reply->type != REDIS_REPLY_ERROR) {
        redis->script_refused = 0;
        return;
    }

    if (!redis->script_refused) {
        ngx_log_error(NGX_LOG_WARN, redis->log, 0,
                      "idempotency: redis \"%V\" refused SCRIPT LOAD: %*s "
                      "(claims on Redis 7 do not need it; records are "
                      "stored with EVAL)",
                      &redis->name, (size_t) reply->len, reply->str);
        redis->script_refused = 1;
    }
}


static void
ngx_http_idempotency_redis_schedule(ngx_http_idempotency_redis_t *redis)
{
    if (redis->exiting || ngx_exiting || ngx_quit || ngx_terminate) {
        return;
    }

    if (!redis->reconnect_ev.timer_set) {
        ngx_add_timer(&redis->reconnect_ev, redis->backoff);
    }

    redis->backoff = ngx_min(redis->backoff * 2,
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
        op = ngx_alloc(sizeof(ngx_http_idempotency_op_t), redis->log);
        if (op == NULL) {
            return NULL;
        }
    }

    op->next = NULL;
    op->redis = redis;
    op->request = NULL;
    op->ctx = NULL;
    op->handler = NULL;
    op->rkey_len = 0;
    op->handshake = 0;
    op->store = 0;

    return op;
}


void
ngx_http_idempotency_op_free(ngx_http_idempotency_op_t *op)
{
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


/* on NGX_ERROR the op has been freed and no callback will come */

ngx_int_t
ngx_http_idempotency_redis_command(ngx_http_idempotency_op_t *op, int argc,
    const char **argv, const size_t *argvlen)
{
    int                            i, rc;
    u_char                        *buf, *p;
    size_t                         len;
    redisAsyncContext             *ac;
    ngx_http_idempotency_redis_t  *redis;
    u_char                         stack[NGX_HTTP_IDEMPOTENCY_CMD_STACK];

    redis = op->redis;
    ac = redis->ac;

    if (ac == NULL
        || redis->handshake_failed
        || (ac->c.flags & (REDIS_DISCONNECTING|REDIS_FREEING))
        || redis->reset_ev.posted)
    {
        ngx_http_idempotency_op_free(op);
        return NGX_ERROR;
    }

    /*
     * The command is formatted here: hiredis's own formatter (sdscatfmt,
     * growing an sds) cost more instructions than the rest of the claim.
     */

    len = sizeof("*\r\n") - 1 + NGX_INT_T_LEN;

    for (i = 0; i < argc; i++) {
        len += sizeof("$\r\n\r\n") - 1 + NGX_SIZE_T_LEN + argvlen[i];
    }

    if (len <= sizeof(stack)) {
        buf = stack;

    } else {
        buf = ngx_alloc(len, redis->log);
        if (buf == NULL) {
            ngx_http_idempotency_op_free(op);
            return NGX_ERROR;
        }
    }

    p = ngx_sprintf(buf, "*%d\r\n", argc);

    for (i = 0; i < argc; i++) {
        p = ngx_sprintf(p, "$%uz\r\n", argvlen[i]);
        p = ngx_cpymem(p, argv[i], argvlen[i]);
        *p++ = CR;
        *p++ = LF;
    }

    rc = redisAsyncFormattedCommand(ac, ngx_http_idempotency_redis_reply, op,
                                    (char *) buf, p - buf);

    if (buf != stack) {
        ngx_free(buf);
    }

    if (rc != REDIS_OK) {
        ngx_http_idempotency_op_free(op);
        return NGX_ERROR;
    }

    if (redis->pending++ == 0) {
        ngx_add_timer(&redis->watchdog_ev, redis->timeout);
    }

    return NGX_OK;
}


static void
ngx_http_idempotency_redis_reply(redisAsyncContext *ac, void *reply,
    void *data)
{
    ngx_http_idempotency_op_t     *op = data;
    ngx_http_idempotency_redis_t  *redis;

    redis = op->redis;

    if (--redis->pending == 0) {
        if (redis->watchdog_ev.timer_set) {
            ngx_del_timer(&redis->watchdog_ev);
        }

    } else {
        /* replies are flowing: the connection is alive */
        ngx_add_timer(&redis->watchdog_ev, redis->timeout);
    }

    /*
     * commands pipelined behind a refused AUTH or SELECT ran as the wrong
     * user or in the wrong db: their replies do not count, nor do those of
     * the rest of the handshake
     */

    if (redis->handshake_failed) {
        reply = NULL;
    }

    op->handler(op, reply);

    ngx_http_idempotency_op_free(op);
}


/* a stalled connection is torn down outside of any hiredis call */

void
ngx_http_idempotency_redis_reset(ngx_http_idempotency_redis_t *redis)
{
    if (redis->ac && !redis->reset_ev.posted) {
        ngx_post_event(&redis->reset_ev, &ngx_posted_events);
    }
}


static void
ngx_http_idempotency_reset_handler(ngx_event_t *ev)
{
    ngx_http_idempotency_redis_t  *redis = ev->data;

    if (redis->ac) {
        redisAsyncFree(redis->ac);
    }
}


static void
ngx_http_idempotency_watchdog(ngx_event_t *ev)
{
    ngx_http_idempotency_redis_t  *redis = ev->data;

    if (redis->pending == 0 || redis->ac == NULL) {
        return;
    }

    ngx_log_error(NGX_LOG_ERR, redis->log, 0,
                  "idempotency: redis \"%V\" did not answer within %M ms, "
                  "reconnecting", &redis->name, redis->timeout);

    redis->failed = 1;

    ngx_http_idempotency_redis_reset(redis);
}


static void
ngx_http_idempotency_on_connect(const redisAsyncContext *ac, int status)
{
    ngx_http_idempotency_redis_t  *redis = ac->data;

    if (redis->connect_ev.timer_set) {
        ngx_del_timer(&redis->connect_ev);
    }

    if (status != REDIS_OK) {
        /* hiredis frees the context next; our cleanup reschedules */

        if (!redis->failed) {
            ngx_log_error(NGX_LOG_ERR, redis->log, 0,
                          "idempotency: cannot connect to redis \"%V\": %s",
                          &redis->name, ac->errstr);
            redis->failed = 1;
        }

        return;
    }

    /* the backoff and the "connected" notice wait for the handshake */

    redis->connected = 1;
}


static void
ngx_http_idempotency_on_disconnect(const redisAsyncContext *ac, int status)
{
    ngx_http_idempotency_redis_t  *redis = ac->data;

    if (status == REDIS_OK || redis->exiting || redis->failed) {
        return;
    }

    ngx_log_error(NGX_LOG_ERR, redis->log, 0,
                  "idempotency: lost the connection to redis \"%V\": %s",
                  &redis->name, ac->errstr);

    redis->failed = 1;
}


static void
ngx_http_idempotency_add_read(void *data)
{
    ngx_http_idempotency_redis_t  *redis = data;

    ngx_connection_t  *c;

    c = redis->conn;

    /* level-triggered: hiredis reads 16 KB a call, the rest must re-fire */

    if (c && !c->read->active) {
        (void) ngx_add_event(c->read, NGX_READ_EVENT, NGX_LEVEL_EVENT);
    }
}


static void
ngx_http_idempotency_del_read(void *data)
{
    ngx_http_idempotency_redis_t  *redis = data;

    ngx_connection_t  *c;

    c = redis->conn;

    if (c && c->read->active) {
        (void) ngx_del_event(c->read, NGX_READ_EVENT, NGX_LEVEL_EVENT);
    }
}


/*
 * Once connected, commands queued during one event loop iteration are
 * written together by a posted event at its end, without an epoll_ctl
 * round; the write event is armed only when a write leaves data behind
 * (and while connecting, as hiredis detects the connect with it).
 */

static void
ngx_http_idempotency_add_write(void *data)
{
    ngx_http_idempotency_redis_t  *redis = data;

    ngx_connection_t  *c;

    c = redis->conn;

    if (c == NULL) {
        return;
    }

    if (redis->connected && !redis->flushing) {
        if (!redis->flush_ev.posted) {
            ngx_post_event(&redis->flush_ev, &ngx_posted_events);
        }

        return;
    }

    if (!c->write->active) {
        (void) ngx_add_event(c->write, NGX_WRITE_EVENT, NGX_LEVEL_EVENT);
    }
}


static void
ngx_http_idempotency_flush_handler(ngx_event_t *ev)
{
    ngx_http_idempotency_redis_t  *redis = ev->data;

    if (redis->ac == NULL) {
        return;
    }

    /* may free the context; redis itself lives as long as the cycle */

    redis->flushing = 1;
    redisAsyncHandleWrite(redis->ac);
    redis->flushing = 0;
}


static void
ngx_http_idempotency_del_write(void *data)
{
    ngx_http_idempotency_redis_t  *redis = data;

    ngx_connection_t  *c;

    c = redis->conn;

    if (c && c->write->active) {
        (void) ngx_del_event(c->write, NGX_WRITE_EVENT, NGX_LEVEL_EVENT);
    }
}


/*
 * Called by hiredis while it frees the context, after the pending callbacks
 * and before it closes the fd: forget the context, give back the
 * connection without closing the fd, and plan the next connect.
 */

static void
ngx_http_idempotency_cleanup(void *data)
{
    ngx_http_idempotency_redis_t  *redis = data;

    ngx_connection_t  *c;

    c = redis->conn;

    if (c) {
        if (c->read->active) {
            (void) ngx_del_event(c->read, NGX_READ_EVENT, NGX_CLOSE_EVENT);
        }

        if (c->write->active) {
            (void) ngx_del_event(c->write, NGX_WRITE_EVENT, NGX_CLOSE_EVENT);
        }

        if (c->read->timer_set) {
            ngx_del_timer(c->read);
        }

        if (c->write->timer_set) {
            ngx_del_timer(c->write);
        }

        if (c->read->posted) {
            ngx_delete_posted_event(c->read);
        }

        if (c->write->posted) {
            ngx_delete_posted_event(c->write);
        }

        ngx_free_connection(c);
        c->fd = (ngx_socket_t) -1;

        redis->conn = NULL;
    }

    redis->ac = NULL;
    redis->connected = 0;
    redis->up = 0;
    redis->pending = 0;

    if (redis->connect_ev.timer_set) {
        ngx_del_timer(&redis->connect_ev);
    }

    if (redis->watchdog_ev.timer_set) {
        ngx_del_timer(&redis->watchdog_ev);
    }

    if (redis->reset_ev.posted) {
        ngx_delete_posted_event(&redis->reset_ev);
    }

    if (redis->flush_ev.posted) {
        ngx_delete_posted_event(&redis->flush_ev);
    }

    ngx_http_idempotency_metrics_redis_down(redis);
    ngx_http_idempotency_redis_schedule(redis);
}


/*
 * Replies are matched to their commands here rather than in hiredis 0.14's
 * redisProcessCallbacks(), which abort()s the worker on a reply that no
 * command asked for (a misbehaving proxy).  Only the public API is used:
 * the reader, and the callback list of async.h.
 */

static void
ngx_http_idempotency_read_handler(ngx_event_t *ev)
{
    ngx_connection_t              *c = ev->data;
    ngx_http_idempotency_redis_t  *redis = c->data;

    redisAsyncContext  *ac;
    redisCallbackFn    *fn;
    redisCallback      *cb;
    void               *reply, *privdata;

    ac = redis->ac;

    if (ac == NULL) {
        return;
    }

    if (!(ac->c.flags & REDIS_CONNECTED)) {
        /*
         * complete the connect as a write event does (hiredis may free the
         * context); being level-triggered, the read event fires again
         */
        ngx_http_idempotency_write_handler(c->write);
        return;
    }

    if (redisBufferRead(&ac->c) != REDIS_OK) {
        if (!redis->failed) {
            ngx_log_error(NGX_LOG_ERR, redis->log, 0,
                          "idempotency: lost the connection to redis "
                          "\"%V\": %s", &redis->name, ac->c.errstr);
            redis->failed = 1;
        }

        redisAsyncFree(ac);
        return;
    }

    for ( ;; ) {
        if (redisGetReplyFromReader(&ac->c, &reply) != REDIS_OK) {
            if (!redis->failed) {
                ngx_log_error(NGX_LOG_ERR, redis->log, 0,
                              "idempotency: redis \"%V\" sent an invalid "
                              "reply: %s, reconnecting",
                              &redis->name, ac->c.errstr);
                redis->failed = 1;
            }

            redisAsyncFree(ac);
            return;
        }

        if (reply == NULL) {
            return;
        }

        cb = ac->replies.head;

        if (cb == NULL) {
            if (!redis->failed) {
                ngx_http_idempotency_redis_unsolicited(redis, reply);
                redis->failed = 1;
            }

            freeReplyObject(reply);

            /* pending commands, if any, get a NULL reply */
            redisAsyncFree(ac);
            return;
        }

        ac->replies.head = cb->next;

        if (cb->next == NULL) {
            ac->replies.tail = NULL;
        }

        fn = cb->fn;
        privdata = cb->privdata;

        /* hiredis 0.14 allocates callbacks with malloc() */
        free(cb);

        /* as hiredis does: a redisAsyncFree() inside only marks the context */

        if (fn) {
            ac->c.flags |= REDIS_IN_CALLBACK;
            fn(ac, reply, privdata);
            ac->c.flags &= ~REDIS_IN_CALLBACK;
        }

        freeReplyObject(reply);

        if (ac->c.flags & REDIS_FREEING) {
            redisAsyncFree(ac);
            return;
        }
    }
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


static void
ngx_http_idempotency_write_handler(ngx_event_t *ev)
{
    ngx_connection_t              *c = ev->data;
    ngx_http_idempotency_redis_t  *redis = c->data;

    if (redis->ac) {
        redis->flushing = 1;
        redisAsyncHandleWrite(redis->ac);
        redis->flushing = 0;
    }
}


static void
ngx_http_idempotency_connect_timeout(ngx_event_t *ev)
{
    ngx_http_idempotency_redis_t  *redis = ev->data;

    if (!redis->failed) {
        ngx_log_error(NGX_LOG_ERR, redis->log, NGX_ETIMEDOUT,
                      "idempotency: timed out connecting to redis \"%V\"",
                      &redis->name);
        redis->failed = 1;
    }

    if (redis->ac) {
        redisAsyncFree(redis->ac);
    }
}


static void
ngx_http_idempotency_reconnect(ngx_event_t *ev)
{
    ngx_http_idempotency_redis_t  *redis = ev->data;

    if (redis->exiting || ngx_exiting || ngx_quit || ngx_terminate
        || redis->ac)
    {
        return;
    }

    ngx_http_idempotency_redis_connect(redis);
}
