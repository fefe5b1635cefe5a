
/*
 * Copyright (C) The ngx_http_idempotency_module authors
 *
 * What a new connection says before any command of the module: AUTH,
 * SELECT, CLIENT SETNAME, INFO server and SCRIPT LOAD, pipelined ahead of
 * whatever queued meanwhile, and what their replies mean: whether the node
 * is up, which server and version the target runs, whether scripting is
 * forbidden to the module's user.  What the server could not or would not
 * answer yet is asked again on the same connection after a backoff.  It
 * is apart from node.c because it reads what the server says, not how the
 * commands travel.
 */


#include "ngx_http_idempotency_redis.h"


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


static void ngx_http_idempotency_handshake_done(ngx_http_idempotency_op_t *op,
    redisReply *reply);
static void ngx_http_idempotency_setname_done(ngx_http_idempotency_op_t *op,
    redisReply *reply);
static void ngx_http_idempotency_script_done(ngx_http_idempotency_op_t *op,
    redisReply *reply);
static ngx_int_t ngx_http_idempotency_handshake_send(
    ngx_http_idempotency_node_t *node, ngx_http_idempotency_reply_pt handler,
    int argc, const char **argv, const size_t *argvlen);
static ngx_int_t ngx_http_idempotency_node_info(
    ngx_http_idempotency_node_t *node);
static void ngx_http_idempotency_info_done(ngx_http_idempotency_op_t *op,
    redisReply *reply);
static void ngx_http_idempotency_node_ask(ngx_http_idempotency_node_t *node,
    ngx_uint_t what, ngx_uint_t forbidden);
static ngx_uint_t ngx_http_idempotency_info_field(u_char *p, u_char *last,
    char *name, ngx_str_t *value);


/* the scripts every connection loads ahead of its commands */
ngx_str_t   *ngx_http_idempotency_redis_scripts;
ngx_uint_t   ngx_http_idempotency_redis_nscripts;


/*
 * AUTH, SELECT, CLIENT SETNAME and SCRIPT LOAD are pipelined ahead of every
 * request; the reply to CLIENT SETNAME tells that AUTH and SELECT passed
 */

void
ngx_http_idempotency_redis_handshake(ngx_http_idempotency_node_t *node)
{
    int                            argc;
    u_char                         db[NGX_INT_T_LEN];
    u_char                         name[sizeof("nginx-idempotency-")
                                        + NGX_INT64_LEN];
    size_t                         argvlen[3];
    const char                    *argv[3];
    ngx_http_idempotency_target_t *redis;

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

        if (ngx_http_idempotency_handshake_send(node,
                                        ngx_http_idempotency_handshake_done,
                                        argc, argv, argvlen)
            != NGX_OK)
        {
            return;
        }
    }

    if (redis->db) {
        ngx_http_idempotency_arg(argv, argvlen, 0, "SELECT");
        argv[1] = (const char *) db;
        argvlen[1] = ngx_sprintf(db, "%ui", redis->db) - db;

        if (ngx_http_idempotency_handshake_send(node,
                                        ngx_http_idempotency_handshake_done,
                                        2, argv, argvlen)
            != NGX_OK)
        {
            return;
        }
    }

    ngx_http_idempotency_arg(argv, argvlen, 0, "CLIENT");
    ngx_http_idempotency_arg(argv, argvlen, 1, "SETNAME");
    argv[2] = (const char *) name;
    argvlen[2] = ngx_sprintf(name, "nginx-idempotency-%P", ngx_pid) - name;

    if (ngx_http_idempotency_handshake_send(node,
                                        ngx_http_idempotency_setname_done,
                                        3, argv, argvlen)
        != NGX_OK)
    {
        return;
    }

    if (node->owner->handshake && node->owner->handshake(node) != NGX_OK) {
        /* a Sentinel, a subscriber: no scripts */
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
    size_t       argvlen[2];
    const char  *argv[2];

    ngx_http_idempotency_arg(argv, argvlen, 0, "INFO");
    ngx_http_idempotency_arg(argv, argvlen, 1, "server");

    return ngx_http_idempotency_handshake_send(node,
                                               ngx_http_idempotency_info_done,
                                               2, argv, argvlen);
}


/* one command of the handshake, ahead of whatever is queued */

static ngx_int_t
ngx_http_idempotency_handshake_send(ngx_http_idempotency_node_t *node,
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
    ngx_http_idempotency_target_t *redis;

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
    ngx_http_idempotency_target_t *redis;

    redis = op->redis;
    node = op->node;

    if (reply == NULL || reply->type != REDIS_REPLY_ERROR) {
        return;
    }

    if (!node->refused) {
        if (ngx_http_idempotency_reply_passing(reply, 1)) {
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
    ngx_http_idempotency_target_t *redis;

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

    /* its owner first: it may say whether the node was up before */

    if (node->owner->up) {
        node->owner->up(node);
    }

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
    ngx_http_idempotency_target_t *redis;

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


void
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


/*
 * A server that will answer soon: loading its data set, not a master yet,
 * its cluster reconfiguring or a slot moving, and with busy, running a
 * script.  Every layer that waits for such a server rather than giving up
 * asks here, so that the list is one.  BUSY is asked for apart: a cluster
 * router that sent a command there would only meet it again.
 */

ngx_uint_t
ngx_http_idempotency_reply_passing(redisReply *reply, ngx_uint_t busy)
{
    size_t       len, n;
    ngx_uint_t   i;

    /* BUSY last: without busy, the loop stops before it */

    static char  *codes[] = {
        "LOADING", "MASTERDOWN", "TRYAGAIN", "CLUSTERDOWN", "BUSY"
    };

    if (reply->type != REDIS_REPLY_ERROR || reply->str == NULL) {
        return 0;
    }

    len = reply->len;

    for (i = 0; i < sizeof(codes) / sizeof(codes[0]) - !busy; i++) {
        n = ngx_strlen(codes[i]);

        if (len >= n && ngx_strncmp(reply->str, codes[i], n) == 0
            && (len == n || reply->str[n] == ' '))
        {
            return 1;
        }
    }

    return 0;
}
