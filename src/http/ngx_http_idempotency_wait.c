
/*
 * Copyright (C) The ngx_http_idempotency_module authors
 *
 * idempotency_redis_wait: WAIT N TIMEOUT after a won claim, and after a
 * store; with "aof", WAITAOF 1 N TIMEOUT (fsynced on the primary and on N
 * replicas).  Both count the writes of the connection that sends them, so
 * they always go on the connection of the claim, pipelined right behind
 * it.  A claim that was not acknowledged is released and is an error; a
 * store that was not is logged.
 */


#include "ngx_http_idempotency_http.h"


/* "0 aof" is on: WAITAOF for the primary's fsync alone */
#define ngx_http_idempotency_wait_on(conf)                                    \
    ((conf)->redis_wait || (conf)->redis_wait_aof)


static ngx_http_idempotency_key_op_t *ngx_http_idempotency_wait_issue(
    ngx_http_request_t *r, ngx_http_idempotency_ctx_t *ctx, ngx_str_t *info);
static void ngx_http_idempotency_wait_info(ngx_http_idempotency_ctx_t *ctx,
    ngx_str_t *info, u_char *buf);
static ngx_http_idempotency_key_op_t *ngx_http_idempotency_wait_touch(
    ngx_http_request_t *r, ngx_http_idempotency_ctx_t *ctx);
static void ngx_http_idempotency_wait_touch_done(
    ngx_http_idempotency_op_t *op, redisReply *reply);
static void ngx_http_idempotency_wait_fail(ngx_http_request_t *r,
    ngx_http_idempotency_ctx_t *ctx);
static void ngx_http_idempotency_wait_claim_done(
    ngx_http_idempotency_op_t *op, redisReply *reply);
static void ngx_http_idempotency_wait_store_done(
    ngx_http_idempotency_op_t *op, redisReply *reply);
static void ngx_http_idempotency_wait_conf_error(ngx_conf_t *cf,
    ngx_http_idempotency_loc_conf_t *conf, const char *fmt, ...);


/* idempotency_redis_wait off | N [TIMEOUT] [aof] */

char *
ngx_http_idempotency_redis_wait(ngx_conf_t *cf, ngx_command_t *cmd,
    void *conf)
{
    ngx_http_idempotency_loc_conf_t *ilcf = conf;

    ngx_int_t   n;
    ngx_str_t  *value;
    ngx_uint_t  nelts, aof;
    ngx_msec_t  timeout;

    if (ilcf->redis_wait != NGX_CONF_UNSET_UINT) {
        return "is duplicate";
    }

    /* the timeout is checked at merge, at the end of http{}: name this */

    if (cf->conf_file) {
        ilcf->redis_wait_file = cf->conf_file->file.name;
        ilcf->redis_wait_line = cf->conf_file->line;
    }

    value = cf->args->elts;
    nelts = cf->args->nelts;

    if (value[1].len == 3 && ngx_strncmp(value[1].data, "off", 3) == 0) {

        if (nelts > 2) {
            ngx_conf_log_error(NGX_LOG_EMERG, cf, 0,
                               "\"idempotency_redis_wait off\" takes no "
                               "timeout, not \"%V\"", &value[2]);
            return NGX_CONF_ERROR;
        }

        ilcf->redis_wait = 0;
        ilcf->redis_wait_aof = 0;
        ilcf->redis_wait_timeout = 100;
        return NGX_CONF_OK;
    }

    aof = 0;

    if (nelts > 2 && value[nelts - 1].len == 3
        && ngx_strncmp(value[nelts - 1].data, "aof", 3) == 0)
    {
        aof = 1;
        nelts--;
    }

    if (nelts > 3) {
        ngx_conf_log_error(NGX_LOG_EMERG, cf, 0,
                           "invalid parameter \"%V\" of \"%V\": expected "
                           "off, or N [TIMEOUT] [aof]", &value[3], &cmd->name);
        return NGX_CONF_ERROR;
    }

    n = ngx_atoi(value[1].data, value[1].len);

    /* WAIT 0 asks for nothing; WAITAOF 1 0 for the primary's own fsync */

    if (n == NGX_ERROR || (n == 0 && !aof)) {
        ngx_conf_log_error(NGX_LOG_EMERG, cf, 0,
                           "\"idempotency_redis_wait\" expects \"off\" or "
                           "a number of replicas of 1 or more (0 or more "
                           "with \"aof\"), not \"%V\"", &value[1]);
        return NGX_CONF_ERROR;
    }

    timeout = 100;

    if (nelts == 3) {
        timeout = ngx_parse_time(&value[2], 0);

        /* WAIT with 0 blocks the connection for ever */

        if (timeout == (ngx_msec_t) NGX_ERROR || timeout == 0) {
            ngx_conf_log_error(NGX_LOG_EMERG, cf, 0,
                               "\"idempotency_redis_wait\" timeout must be "
                               "at least 1ms, not \"%V\"", &value[2]);
            return NGX_CONF_ERROR;
        }
    }

    ilcf->redis_wait = n;
    ilcf->redis_wait_aof = aof;
    ilcf->redis_wait_timeout = timeout;

    return NGX_CONF_OK;
}


/*
 * The claim's deadline is idempotency_redis_timeout, and WAIT holds the
 * connection for up to its TIMEOUT: a TIMEOUT that does not fit in it would
 * turn every unacknowledged claim into a timeout and a reconnect.  The
 * connection's watchdog is the smallest idempotency_redis_timeout of the
 * places that use the target, so every WAIT on it must fit in that too;
 * checked whenever either changes, so the last merge sees both final.
 */

char *
ngx_http_idempotency_wait_merge(ngx_conf_t *cf,
    ngx_http_idempotency_loc_conf_t *prev,
    ngx_http_idempotency_loc_conf_t *conf)
{
    ngx_http_idempotency_redis_t  *redis;

    if (conf->redis_wait == NGX_CONF_UNSET_UINT) {
        conf->redis_wait_aof = prev->redis_wait_aof;
        conf->redis_wait_file = prev->redis_wait_file;
        conf->redis_wait_line = prev->redis_wait_line;
    }

    ngx_conf_merge_uint_value(conf->redis_wait, prev->redis_wait, 0);
    ngx_conf_merge_msec_value(conf->redis_wait_timeout,
                              prev->redis_wait_timeout, 100);

    if (ngx_http_idempotency_wait_on(conf)
        && conf->redis_wait_timeout >= conf->redis_timeout)
    {
        ngx_http_idempotency_wait_conf_error(cf, conf,
                           "the \"idempotency_redis_wait\" timeout (%M ms) "
                           "must be shorter than \"idempotency_redis_timeout\""
                           " (%M ms)", conf->redis_wait_timeout,
                           conf->redis_timeout);
        return NGX_CONF_ERROR;
    }

    if (!conf->enable) {
        return NGX_CONF_OK;
    }

    redis = conf->redis;

    if (ngx_http_idempotency_wait_on(conf)
        && conf->redis_wait_timeout > redis->wait_timeout)
    {
        redis->wait_timeout = conf->redis_wait_timeout;
    }

    if (redis->wait_timeout && redis->wait_timeout >= redis->timeout) {
        ngx_http_idempotency_wait_conf_error(cf, conf,
                           "an \"idempotency_redis_wait\" timeout (%M ms) "
                           "on redis \"%V\" must be shorter than the "
                           "smallest \"idempotency_redis_timeout\" (%M ms) "
                           "of the places that use it",
                           redis->wait_timeout, &redis->name, redis->timeout);
        return NGX_CONF_ERROR;
    }

    return NGX_CONF_OK;
}


/*
 * Merging runs at the end of http{}, where ngx_conf_log_error() would
 * point: name the line of idempotency_redis_wait, or else of the location
 * whose idempotency_redis_timeout is too short for a WAIT elsewhere.
 */

static void
ngx_http_idempotency_wait_conf_error(ngx_conf_t *cf,
    ngx_http_idempotency_loc_conf_t *conf, const char *fmt, ...)
{
    u_char      *p, errstr[NGX_MAX_CONF_ERRSTR];
    va_list      args;
    ngx_str_t   *file;
    ngx_uint_t   line;

    va_start(args, fmt);
    p = ngx_vslprintf(errstr, errstr + NGX_MAX_CONF_ERRSTR, fmt, args);
    va_end(args);

    file = &conf->redis_wait_file;
    line = conf->redis_wait_line;

    if (line == 0 || !ngx_http_idempotency_wait_on(conf)) {
        file = &conf->conf_file;
        line = conf->conf_line;
    }

    if (line == 0) {
        ngx_conf_log_error(NGX_LOG_EMERG, cf, 0, "%*s", p - errstr, errstr);
        return;
    }

    ngx_log_error(NGX_LOG_EMERG, cf->log, 0, "%*s in %V:%ui",
                  p - errstr, errstr, file, line);
}


/*
 * Sent with every claim when the directive is on, and acted upon only if
 * the claim is won: a replay, 409 or 422 does not wait for its reply.
 */

void
ngx_http_idempotency_wait_send(ngx_http_request_t *r,
    ngx_http_idempotency_ctx_t *ctx)
{
    ctx->wait_op = ngx_http_idempotency_wait_issue(r, ctx, NULL);
}


/*
 * Right behind the store, on its connection; fire and forget: the response
 * is already on its way, so fewer acknowledgements are only logged.  A
 * store that could not be sent was logged already.
 */

void
ngx_http_idempotency_wait_store(ngx_http_idempotency_ctx_t *ctx,
    ngx_str_t *info)
{
    (void) ngx_http_idempotency_wait_issue(NULL, ctx, info);
}


/* r: WAIT for the claim of r; else for a store, logged with info */

static ngx_http_idempotency_key_op_t *
ngx_http_idempotency_wait_issue(ngx_http_request_t *r,
    ngx_http_idempotency_ctx_t *ctx, ngx_str_t *info)
{
    ngx_http_idempotency_key_op_t  *kop;

    if (!ngx_http_idempotency_wait_on(ctx->conf)) {
        return NULL;
    }

    /* the key: a cluster sends WAIT to the node of the key */
    kop = ngx_http_idempotency_key_op_alloc(ctx->redis, &ctx->rkey);
    if (kop == NULL) {
        return NULL;
    }

    if (r) {
        kop->op.data = ctx;
        kop->op.handler = ngx_http_idempotency_wait_claim_done;
        kop->zone = ctx->conf->metrics_zone;
        kop->info_len = 0;
        ngx_memcpy(kop->claim, ctx->claim, NGX_HTTP_IDEMPOTENCY_HEAD_LEN);

        /* its release, if the claim is lost with WAIT, is sent until then */
        kop->lease_end = ctx->lease_end;

    } else {
        kop->op.handler = ngx_http_idempotency_wait_store_done;
        kop->info_len = info->len;
        ngx_memcpy(kop->info, info->data, info->len);
    }

    if (ngx_http_idempotency_durable_command(kop, ctx->conf->redis_wait,
                                             ctx->conf->redis_wait_timeout,
                                             ctx->conf->redis_wait_aof)
        != NGX_OK)
    {
        return NULL;
    }

    return kop;
}


/*
 * Called with the claim's decision, and whether the claim won by finding
 * itself.  NGX_AGAIN: the claim is won and the request now waits for
 * WAIT's reply, under the claim's own timer.
 */

ngx_int_t
ngx_http_idempotency_wait_hold(ngx_http_request_t *r,
    ngx_http_idempotency_ctx_t *ctx, ngx_uint_t itself)
{
    ngx_str_t                       info;
    ngx_http_idempotency_key_op_t  *kop, *touch;
    u_char                          buf[NGX_HTTP_IDEMPOTENCY_INFO_LEN];

    if (ctx->go != NGX_HTTP_IDEMPOTENCY_GO_OWNER
        || !ngx_http_idempotency_wait_on(ctx->conf))
    {
        ngx_http_idempotency_wait_detach(ctx);
        return NGX_DECLINED;
    }

    touch = NULL;

    if (itself) {
        /*
         * The claim was sent again after a lost connection and found its
         * own claim: it wrote nothing on this connection.  Since Redis 7.2
         * (and in Valkey) WAIT counts only the connection's own writes and
         * answers at once without one, as if every replica had the claim.
         * An owner-checked rewrite of the claim goes first, and WAIT
         * behind it.  A WAIT still pending went with another connection.
         */

        ngx_http_idempotency_wait_detach(ctx);

        touch = ngx_http_idempotency_wait_touch(r, ctx);

        if (touch) {
            ngx_http_idempotency_wait_send(r, ctx);
        }

    } else if (ctx->wait_op == NULL) {
        /*
         * the WAIT sent with the claim went with its connection, and the
         * claim was sent again and won: ask on the connection that answered
         */
        ngx_http_idempotency_wait_send(r, ctx);
    }

    kop = ctx->wait_op;

    if (kop == NULL) {
        if (touch) {
            touch->op.data = NULL;
        }

        ngx_http_idempotency_wait_info(ctx, &info, buf);

        ngx_log_error(NGX_LOG_ERR, r->connection->log, 0,
                      "idempotency: cannot send WAIT to redis \"%V\", "
                      "the claim is released, %V", &ctx->redis->name, &info);

        ngx_http_idempotency_release(r, ctx);
        ctx->go = NGX_HTTP_IDEMPOTENCY_GO_ERROR;
        return NGX_DECLINED;
    }

    /*
     * from now on, a request that goes away releases the claim; the
     * rewrite, if any, answers first: wait_op until then
     */

    kop->won = 1;
    ctx->wait_op = touch;
    ctx->op = kop;
    ctx->state = NGX_HTTP_IDEMPOTENCY_ST_WAITING_REDIS;

    return NGX_AGAIN;
}


static ngx_http_idempotency_key_op_t *
ngx_http_idempotency_wait_touch(ngx_http_request_t *r,
    ngx_http_idempotency_ctx_t *ctx)
{
    ngx_http_idempotency_key_op_t  *kop;

    kop = ngx_http_idempotency_key_op_alloc(ctx->redis, &ctx->rkey);
    if (kop == NULL) {
        return NULL;
    }

    kop->op.data = ctx;
    kop->op.handler = ngx_http_idempotency_wait_touch_done;

    if (ngx_http_idempotency_touch_command(&kop->op, &ctx->rkey, ctx->claim)
        != NGX_OK)
    {
        return NULL;
    }

    return kop;
}


/*
 * Anything but a rewrite leaves the WAIT behind it nothing to count: the
 * claim is refused whatever WAIT says.
 */

static void
ngx_http_idempotency_wait_touch_done(ngx_http_idempotency_op_t *op,
    redisReply *reply)
{
    ngx_str_t                    info;
    ngx_http_request_t          *r;
    ngx_http_idempotency_ctx_t  *ctx;
    u_char                       buf[NGX_HTTP_IDEMPOTENCY_INFO_LEN];

    ctx = op->data;
    r = ctx ? ctx->request : NULL;

    if (r == NULL) {
        /* the request went away: the WAIT behind releases the claim */
        return;
    }

    ctx->wait_op = NULL;

    ngx_http_idempotency_wait_info(ctx, &info, buf);

    if (ngx_http_idempotency_touch_result(ctx->redis, reply, ctx->claim,
                                          r->connection->log, &info)
        == NGX_OK)
    {
        return;
    }

    ngx_http_idempotency_wait_fail(r, ctx);
}


/* the WAIT held is not to be trusted: release the claim, an error */

static void
ngx_http_idempotency_wait_fail(ngx_http_request_t *r,
    ngx_http_idempotency_ctx_t *ctx)
{
    ngx_http_idempotency_wait_detach(ctx);

    if (ctx->op) {
        /* the WAIT's reply finds no request, and no claim to release */
        ctx->op->op.data = NULL;
        ctx->op->won = 0;
        ctx->op = NULL;
    }

    if (ctx->timeout.timer_set) {
        ngx_del_timer(&ctx->timeout);
    }

    ngx_http_idempotency_release(r, ctx);

    ctx->go = NGX_HTTP_IDEMPOTENCY_GO_ERROR;
    ctx->state = NGX_HTTP_IDEMPOTENCY_ST_DECIDED;

    ngx_http_idempotency_wake(r);
}


/*
 * The claim's timer fired while WAIT held it (a stalled Redis): the claim
 * is this request's, and the request will not run protected.  It is
 * released now, on the connection about to be reset, which sends the
 * release again on the next one; the WAIT's own end comes with the
 * connection closed, too late to send anything.
 */

void
ngx_http_idempotency_wait_timedout(ngx_http_request_t *r,
    ngx_http_idempotency_ctx_t *ctx)
{
    ngx_http_idempotency_key_op_t  *kop;

    kop = ctx->op;

    if (kop == NULL
        || kop->op.handler != ngx_http_idempotency_wait_claim_done
        || !kop->won)
    {
        return;
    }

    kop->op.data = NULL;
    kop->won = 0;
    ctx->op = NULL;

    ngx_http_idempotency_release(r, ctx);
}


/* the request no longer waits: a late reply finds nothing to do */

void
ngx_http_idempotency_wait_detach(ngx_http_idempotency_ctx_t *ctx)
{
    if (ctx->wait_op) {
        ctx->wait_op->op.data = NULL;
        ctx->wait_op = NULL;
    }
}


static void
ngx_http_idempotency_wait_claim_done(ngx_http_idempotency_op_t *op,
    redisReply *reply)
{
    ngx_str_t                       info;
    ngx_http_request_t             *r;
    ngx_http_idempotency_ctx_t     *ctx;
    ngx_http_idempotency_key_op_t  *kop;
    u_char                          buf[NGX_HTTP_IDEMPOTENCY_INFO_LEN];

    kop = ngx_http_idempotency_key_op(op);
    ctx = op->data;
    r = ctx ? ctx->request : NULL;

    if (r == NULL) {
        /* a won claim whose request went away never ran: free the key */

        if (kop->won) {
            ngx_http_idempotency_release_orphan(kop);
        }

        return;
    }


    if (!kop->won) {
        /* the claim is not answered yet: this WAIT went with its connection */
        ctx->wait_op = NULL;
        return;
    }

    ctx->op = NULL;

    if (ctx->timeout.timer_set) {
        ngx_del_timer(&ctx->timeout);
    }

    ngx_http_idempotency_wait_info(ctx, &info, buf);

    if (ctx->wait_op) {
        /* a cluster redirected the rewrite: WAIT counted without it */

        ngx_log_error(NGX_LOG_ERR, r->connection->log, 0,
                      "idempotency: redis \"%V\" answered WAIT before the "
                      "rewrite of the claim sent again, the claim is "
                      "released, %V", &ctx->redis->name, &info);

        ngx_http_idempotency_wait_detach(ctx);
        ngx_http_idempotency_release(r, ctx);
        ctx->go = NGX_HTTP_IDEMPOTENCY_GO_ERROR;

    } else if (ngx_http_idempotency_durable_result(kop, reply,
                                                   r->connection->log, &info)
               != NGX_OK)
    {
        ngx_http_idempotency_release(r, ctx);
        ctx->go = NGX_HTTP_IDEMPOTENCY_GO_ERROR;
    }

    ctx->state = NGX_HTTP_IDEMPOTENCY_ST_DECIDED;

    ngx_http_idempotency_wake(r);
}


/* the request's log names the client and the request line already */

static void
ngx_http_idempotency_wait_info(ngx_http_idempotency_ctx_t *ctx,
    ngx_str_t *info, u_char *buf)
{
    info->data = buf;
    info->len = ngx_sprintf(buf, "key hash %*s",
                            (size_t) 2 * NGX_HTTP_IDEMPOTENCY_HASH_LEN,
                            ngx_http_idempotency_key_hash(ctx))
                - buf;
}


static void
ngx_http_idempotency_wait_store_done(ngx_http_idempotency_op_t *op,
    redisReply *reply)
{
    ngx_str_t                       info;
    ngx_http_idempotency_key_op_t  *kop;

    kop = ngx_http_idempotency_key_op(op);

    info.data = kop->info;
    info.len = kop->info_len;

    (void) ngx_http_idempotency_durable_result(kop, reply, op->redis->log,
                                               &info);
}
