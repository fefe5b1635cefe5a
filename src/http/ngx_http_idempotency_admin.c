
/*
 * Copyright (C) The ngx_http_idempotency_module authors
 *
 * idempotency_admin: the operator's view of one key, in the spirit of
 * stub_status.  GET ?key=K[&scope=S] or ?hash=H answers with the record as
 * JSON (state, status, times, sizes, fingerprint, stored headers, and the
 * body with &body=1); DELETE purges a completed, unknown or too-large
 * record, an in-progress claim only with &force=1.  Access is nginx's own
 * (allow/deny, auth_basic); each purge is logged at warn.
 */


#include "ngx_http_idempotency_http.h"


typedef struct {
    ngx_http_request_t              *request;
    ngx_http_idempotency_loc_conf_t *conf;
    ngx_http_idempotency_op_t       *get;
    ngx_http_idempotency_op_t       *ttl;
    ngx_event_t                      timeout;
    ngx_str_t                        rkey;
    u_char                          *value;      /* the record, or NULL */
    size_t                           len;
    ngx_uint_t                       body;       /* &body=1 */
    ngx_uint_t                       force;      /* &force=1 */
    unsigned                         found:1;
} ngx_http_idempotency_admin_ctx_t;


static ngx_int_t ngx_http_idempotency_admin_handler(ngx_http_request_t *r);
static ngx_int_t ngx_http_idempotency_admin_key(ngx_http_request_t *r,
    ngx_http_idempotency_admin_ctx_t *ctx);
static ngx_http_idempotency_op_t *ngx_http_idempotency_admin_op(
    ngx_http_idempotency_admin_ctx_t *ctx);
static ngx_int_t ngx_http_idempotency_admin_send(
    ngx_http_idempotency_admin_ctx_t *ctx, ngx_uint_t del);
static void ngx_http_idempotency_admin_got(ngx_http_idempotency_op_t *op,
    redisReply *reply);
static void ngx_http_idempotency_admin_pttl(ngx_http_idempotency_op_t *op,
    redisReply *reply);
static void ngx_http_idempotency_admin_deleted(ngx_http_idempotency_op_t *op,
    redisReply *reply);
static void ngx_http_idempotency_admin_purge_read(
    ngx_http_idempotency_op_t *op, redisReply *reply);
static ngx_int_t ngx_http_idempotency_admin_purge_send(
    ngx_http_idempotency_admin_ctx_t *ctx, ngx_uint_t del);
static void ngx_http_idempotency_admin_purge_del(
    ngx_http_idempotency_op_t *op, redisReply *reply);
static void ngx_http_idempotency_admin_purge_set(
    ngx_http_idempotency_op_t *op, redisReply *reply);
static ngx_http_idempotency_admin_ctx_t *ngx_http_idempotency_admin_value(
    ngx_http_idempotency_op_t *op, redisReply *reply);
static void ngx_http_idempotency_admin_purged(
    ngx_http_idempotency_admin_ctx_t *ctx, ngx_int_t result);
static ngx_int_t ngx_http_idempotency_admin_json(ngx_http_request_t *r,
    ngx_http_idempotency_admin_ctx_t *ctx, long long pttl, ngx_buf_t **out);
static u_char *ngx_http_idempotency_admin_time(u_char *p, uint64_t msec);
static void ngx_http_idempotency_admin_timeout(ngx_event_t *ev);
static void ngx_http_idempotency_admin_cleanup(void *data);
static void ngx_http_idempotency_admin_finish(
    ngx_http_idempotency_admin_ctx_t *ctx, ngx_int_t rc, ngx_buf_t *b);


char *
ngx_http_idempotency_admin(ngx_conf_t *cf, ngx_command_t *cmd, void *conf)
{
    ngx_http_idempotency_loc_conf_t *ilcf = conf;

    ngx_http_core_loc_conf_t  *clcf;

    clcf = ngx_http_conf_get_module_loc_conf(cf, ngx_http_core_module);
    clcf->handler = ngx_http_idempotency_admin_handler;

    /* the view is no protected request, even under "idempotency on" */

    if (ilcf->enable == NGX_CONF_UNSET) {
        ilcf->enable = 0;
    }

    ilcf->admin = 1;

    return NGX_CONF_OK;
}


static ngx_int_t
ngx_http_idempotency_admin_handler(ngx_http_request_t *r)
{
    ngx_int_t                          rc;
    ngx_str_t                          arg;
    ngx_pool_cleanup_t                *cln;
    ngx_http_idempotency_admin_ctx_t  *ctx;

    if (!(r->method & (NGX_HTTP_GET|NGX_HTTP_HEAD|NGX_HTTP_DELETE))) {
        return NGX_HTTP_NOT_ALLOWED;
    }

    rc = ngx_http_discard_request_body(r);
    if (rc != NGX_OK) {
        return rc;
    }

    ctx = ngx_pcalloc(r->pool, sizeof(ngx_http_idempotency_admin_ctx_t));
    if (ctx == NULL) {
        return NGX_HTTP_INTERNAL_SERVER_ERROR;
    }

    ctx->request = r;
    ctx->conf = ngx_http_get_module_loc_conf(r, ngx_http_idempotency_module);

    rc = ngx_http_idempotency_admin_key(r, ctx);
    if (rc != NGX_OK) {
        return rc;
    }

    if (ngx_http_arg(r, (u_char *) "body", 4, &arg) == NGX_OK) {
        ctx->body = (arg.len == 1 && arg.data[0] == '1');
    }

    if (ngx_http_arg(r, (u_char *) "force", 5, &arg) == NGX_OK) {
        ctx->force = (arg.len == 1 && arg.data[0] == '1');
    }

    cln = ngx_pool_cleanup_add(r->pool, 0);
    if (cln == NULL) {
        return NGX_HTTP_INTERNAL_SERVER_ERROR;
    }

    cln->handler = ngx_http_idempotency_admin_cleanup;
    cln->data = ctx;

    ctx->timeout.handler = ngx_http_idempotency_admin_timeout;
    ctx->timeout.data = ctx;
    ctx->timeout.log = r->connection->log;

    if (ngx_http_idempotency_admin_send(ctx, r->method == NGX_HTTP_DELETE)
        != NGX_OK)
    {
        return NGX_HTTP_SERVICE_UNAVAILABLE;
    }

    ngx_add_timer(&ctx->timeout, ctx->conf->redis_timeout);

    r->main->count++;

    return NGX_DONE;
}


/* the record key: <prefix>{hash} from ?hash=, or from ?key= and ?scope= */

static ngx_int_t
ngx_http_idempotency_admin_key(ngx_http_request_t *r,
    ngx_http_idempotency_admin_ctx_t *ctx)
{
    u_char                      *p, *dst, *src;
    ngx_str_t                    arg, raw, key, scope;
    ngx_uint_t                   i;
    ngx_http_idempotency_ctx_t   kctx;

    if (ngx_http_arg(r, (u_char *) "hash", 4, &arg) == NGX_OK) {

        if (arg.len != 2 * NGX_HTTP_IDEMPOTENCY_HASH_LEN) {
            return NGX_HTTP_BAD_REQUEST;
        }

        for (i = 0; i < arg.len; i++) {
            if (!((arg.data[i] >= '0' && arg.data[i] <= '9')
                  || (arg.data[i] >= 'a' && arg.data[i] <= 'f')))
            {
                return NGX_HTTP_BAD_REQUEST;
            }
        }

        ctx->rkey.len = ctx->conf->prefix.len + 2 + arg.len;
        ctx->rkey.data = ngx_pnalloc(r->pool, ctx->rkey.len);
        if (ctx->rkey.data == NULL) {
            return NGX_HTTP_INTERNAL_SERVER_ERROR;
        }

        p = ngx_cpymem(ctx->rkey.data, ctx->conf->prefix.data,
                       ctx->conf->prefix.len);
        *p++ = '{';
        p = ngx_cpymem(p, arg.data, arg.len);
        *p = '}';

        return NGX_OK;
    }

    if (ngx_http_arg(r, (u_char *) "key", 3, &arg) != NGX_OK || arg.len == 0) {
        return NGX_HTTP_BAD_REQUEST;
    }

    /* the key as the client sent it in its header, URL-encoded here */

    raw.data = ngx_pnalloc(r->pool, arg.len + 1);
    key.data = ngx_pnalloc(r->pool, arg.len + 1);
    if (raw.data == NULL || key.data == NULL) {
        return NGX_HTTP_INTERNAL_SERVER_ERROR;
    }

    dst = raw.data;
    src = arg.data;
    ngx_unescape_uri(&dst, &src, arg.len, 0);
    raw.len = dst - raw.data;

    if (ngx_http_idempotency_parse_key(&raw, &key,
                                       ctx->conf->key_max_length)
        != NGX_OK)
    {
        return NGX_HTTP_BAD_REQUEST;
    }

    ngx_str_null(&scope);

    if (ngx_http_arg(r, (u_char *) "scope", 5, &arg) == NGX_OK) {
        scope.data = ngx_pnalloc(r->pool, arg.len + 1);
        if (scope.data == NULL) {
            return NGX_HTTP_INTERNAL_SERVER_ERROR;
        }

        dst = scope.data;
        src = arg.data;
        ngx_unescape_uri(&dst, &src, arg.len, 0);
        scope.len = dst - scope.data;
    }

    ngx_memzero(&kctx, sizeof(ngx_http_idempotency_ctx_t));
    kctx.conf = ctx->conf;

    if (ngx_http_idempotency_key_name(r, &kctx, &scope, &key) != NGX_OK) {
        return NGX_HTTP_INTERNAL_SERVER_ERROR;
    }

    ctx->rkey = kctx.rkey;

    return NGX_OK;
}


/* an op of this view: the key names the node (the slot on a cluster) */

static ngx_http_idempotency_op_t *
ngx_http_idempotency_admin_op(ngx_http_idempotency_admin_ctx_t *ctx)
{
    ngx_http_idempotency_op_t  *op;

    op = ngx_http_idempotency_op_alloc(ctx->conf->redis);
    if (op == NULL) {
        return NULL;
    }

    op->data = ctx;
    op->rkey_len = ctx->rkey.len;
    ngx_memcpy(op->rkey, ctx->rkey.data, ctx->rkey.len);

    return op;
}


/* GET and PTTL, pipelined on the key's node; or the purge */

static ngx_int_t
ngx_http_idempotency_admin_send(ngx_http_idempotency_admin_ctx_t *ctx,
    ngx_uint_t del)
{
    ngx_http_idempotency_op_t  *op;

    op = ngx_http_idempotency_admin_op(ctx);
    if (op == NULL) {
        return NGX_ERROR;
    }

    if (del && ngx_http_idempotency_native_cas(ctx->conf->redis)) {
        /* no script: read, then delete only what was read */
        op->handler = ngx_http_idempotency_admin_purge_read;

        if (ngx_http_idempotency_fetch_command(op, &ctx->rkey, 0) != NGX_OK) {
            return NGX_ERROR;
        }

        ctx->get = op;
        return NGX_OK;
    }

    if (del) {
        op->handler = ngx_http_idempotency_admin_deleted;

        if (ngx_http_idempotency_purge_command(op, &ctx->rkey, ctx->force)
            != NGX_OK)
        {
            return NGX_ERROR;
        }

        ctx->get = op;
        return NGX_OK;
    }

    op->handler = ngx_http_idempotency_admin_got;

    if (ngx_http_idempotency_fetch_command(op, &ctx->rkey, 0) != NGX_OK) {
        return NGX_ERROR;
    }

    ctx->get = op;

    op = ngx_http_idempotency_admin_op(ctx);
    if (op == NULL) {
        return NGX_ERROR;
    }

    op->handler = ngx_http_idempotency_admin_pttl;

    if (ngx_http_idempotency_fetch_command(op, &ctx->rkey, 1) != NGX_OK) {
        return NGX_ERROR;
    }

    ctx->ttl = op;

    return NGX_OK;
}


static void
ngx_http_idempotency_admin_got(ngx_http_idempotency_op_t *op,
    redisReply *reply)
{
    ngx_http_idempotency_admin_ctx_t *ctx = op->data;

    if (ctx == NULL) {
        return;
    }

    ctx->get = NULL;

    if (reply == NULL || reply->type == REDIS_REPLY_ERROR
        || (reply->type != REDIS_REPLY_STRING
            && reply->type != REDIS_REPLY_NIL))
    {
        return;     /* the PTTL's reply answers 503 */
    }

    if (reply->type == REDIS_REPLY_NIL) {
        ctx->found = 0;
        ctx->len = 1;   /* answered */
        return;
    }

    ctx->value = ngx_pnalloc(ctx->request->pool, reply->len);
    if (ctx->value == NULL) {
        return;
    }

    ngx_memcpy(ctx->value, reply->str, reply->len);
    ctx->len = reply->len;
    ctx->found = 1;
}


static void
ngx_http_idempotency_admin_pttl(ngx_http_idempotency_op_t *op,
    redisReply *reply)
{
    ngx_http_idempotency_admin_ctx_t *ctx = op->data;

    ngx_int_t            rc;
    ngx_buf_t           *b;
    ngx_http_request_t  *r;

    if (ctx == NULL) {
        return;
    }

    ctx->ttl = NULL;
    r = ctx->request;

    if (reply == NULL || reply->type != REDIS_REPLY_INTEGER || ctx->len == 0)
    {
        ngx_http_idempotency_admin_finish(ctx, NGX_HTTP_SERVICE_UNAVAILABLE,
                                          NULL);
        return;
    }

    if (!ctx->found) {
        ngx_http_idempotency_admin_finish(ctx, NGX_HTTP_NOT_FOUND, NULL);
        return;
    }

    rc = ngx_http_idempotency_admin_json(r, ctx, reply->integer, &b);

    ngx_http_idempotency_admin_finish(ctx, rc, b);
}


static void
ngx_http_idempotency_admin_deleted(ngx_http_idempotency_op_t *op,
    redisReply *reply)
{
    ngx_http_idempotency_admin_ctx_t *ctx = op->data;

    if (ctx == NULL) {
        return;
    }

    ctx->get = NULL;

    if (reply == NULL || reply->type != REDIS_REPLY_INTEGER) {
        ngx_http_idempotency_admin_finish(ctx, NGX_HTTP_SERVICE_UNAVAILABLE,
                                          NULL);
        return;
    }

    ngx_http_idempotency_admin_purged(ctx, (ngx_int_t) reply->integer);
}


/*
 * the reply to a purge's read or delete, if it is a value: else answered,
 * no record (404) or Redis unavailable (503), or nobody waits
 */

static ngx_http_idempotency_admin_ctx_t *
ngx_http_idempotency_admin_value(ngx_http_idempotency_op_t *op,
    redisReply *reply)
{
    ngx_http_idempotency_admin_ctx_t *ctx = op->data;

    if (ctx == NULL) {
        return NULL;
    }

    ctx->get = NULL;

    if (reply && reply->type == REDIS_REPLY_STRING) {
        return ctx;
    }

    if (reply && reply->type == REDIS_REPLY_NIL) {
        ngx_http_idempotency_admin_purged(ctx, 0);

    } else {
        ngx_http_idempotency_admin_finish(ctx, NGX_HTTP_SERVICE_UNAVAILABLE,
                                          NULL);
    }

    return NULL;
}


/* the record as read: a claim in progress, or deleted */

static void
ngx_http_idempotency_admin_purge_read(ngx_http_idempotency_op_t *op,
    redisReply *reply)
{
    ngx_http_idempotency_admin_ctx_t  *ctx;

    ctx = ngx_http_idempotency_admin_value(op, reply);
    if (ctx == NULL) {
        return;
    }

    if (!ngx_http_idempotency_purge_allowed((u_char *) reply->str,
                                            reply->len, ctx->force))
    {
        ngx_http_idempotency_admin_purged(ctx, -1);
        return;
    }

    /* kept to compare with what the delete finds */

    ctx->value = ngx_pnalloc(ctx->request->pool, reply->len);
    if (ctx->value == NULL) {
        ngx_http_idempotency_admin_finish(ctx,
                                          NGX_HTTP_INTERNAL_SERVER_ERROR,
                                          NULL);
        return;
    }

    ngx_memcpy(ctx->value, reply->str, reply->len);
    ctx->len = reply->len;

    if (ngx_http_idempotency_admin_purge_send(ctx, 1) != NGX_OK) {
        ngx_http_idempotency_admin_finish(ctx, NGX_HTTP_SERVICE_UNAVAILABLE,
                                          NULL);
    }
}


/*
 * 1: purged; 0: gone or changed since the read, and the other way tells
 * which (as it does the purge where the delete is refused)
 */

static void
ngx_http_idempotency_admin_purge_del(ngx_http_idempotency_op_t *op,
    redisReply *reply)
{
    ngx_int_t                          rc;
    ngx_http_idempotency_admin_ctx_t  *ctx = op->data;

    if (ctx == NULL) {
        return;
    }

    ctx->get = NULL;

    rc = ngx_http_idempotency_purge_del_result(op->redis, reply);

    if (rc == NGX_OK) {
        ngx_http_idempotency_admin_purged(ctx, 1);
        return;
    }

    if (rc == NGX_DECLINED
        && ngx_http_idempotency_admin_purge_send(ctx, 0) == NGX_OK)
    {
        return;
    }

    ngx_http_idempotency_admin_finish(ctx, NGX_HTTP_SERVICE_UNAVAILABLE,
                                      NULL);
}


/*
 * The delete of what was read: by compare-and-delete where the server has
 * it (del), else (or to learn what a failed one met) by the compare-and-set
 * that returns the value it found
 */

static ngx_int_t
ngx_http_idempotency_admin_purge_send(ngx_http_idempotency_admin_ctx_t *ctx,
    ngx_uint_t del)
{
    ngx_http_idempotency_op_t  *op;

    del = del && ngx_http_idempotency_has_delifeq(ctx->conf->redis);

    op = ngx_http_idempotency_admin_op(ctx);

    if (op) {
        op->handler = del ? ngx_http_idempotency_admin_purge_del
                          : ngx_http_idempotency_admin_purge_set;

        if (ngx_http_idempotency_purge_native_command(op, &ctx->rkey,
                                                      ctx->value, ctx->len,
                                                      del)
            == NGX_OK)
        {
            ctx->get = op;
            return NGX_OK;
        }
    }

    return NGX_ERROR;
}


/*
 * what the delete found: what was read (deleted), nothing (gone since), or
 * something else (a new claim or record since: not deleted, look again)
 */

static void
ngx_http_idempotency_admin_purge_set(ngx_http_idempotency_op_t *op,
    redisReply *reply)
{
    ngx_http_idempotency_admin_ctx_t  *ctx;

    ctx = ngx_http_idempotency_admin_value(op, reply);
    if (ctx == NULL) {
        return;
    }

    ngx_http_idempotency_admin_purged(ctx,
                                      ((size_t) reply->len == ctx->len
                                       && ngx_memcmp(reply->str, ctx->value,
                                                     ctx->len)
                                          == 0)
                                      ? 1 : -1);
}


/* 1: purged; 0: no record; -1: a claim in progress, not purged */

static void
ngx_http_idempotency_admin_purged(ngx_http_idempotency_admin_ctx_t *ctx,
    ngx_int_t result)
{
    ngx_http_request_t  *r;

    r = ctx->request;

    switch (result) {

    case 1:
        ngx_log_error(NGX_LOG_WARN, r->connection->log, 0,
                      "idempotency: record purged by %V, key hash %*s%s",
                      &r->connection->addr_text,
                      (size_t) 2 * NGX_HTTP_IDEMPOTENCY_HASH_LEN,
                      ctx->rkey.data + ctx->rkey.len - 1
                      - 2 * NGX_HTTP_IDEMPOTENCY_HASH_LEN,
                      ctx->force ? " (forced)" : "");
        ngx_http_idempotency_admin_finish(ctx, NGX_HTTP_NO_CONTENT, NULL);
        return;

    case -1:
        ngx_http_idempotency_admin_finish(ctx, NGX_HTTP_CONFLICT, NULL);
        return;

    default:
        ngx_http_idempotency_admin_finish(ctx, NGX_HTTP_NOT_FOUND, NULL);
    }
}


/*
 * {"state": ..., "status": ..., "stored_at": ..., "expires_at": ...,
 *  "lease_until": ..., "size": {"headers": N, "body": N},
 *  "fingerprint": "...", "headers": [[name, value], ...], "body": base64}
 * stored_at is the expiry less idempotency_ttl of this location.
 */

static ngx_int_t
ngx_http_idempotency_admin_json(ngx_http_request_t *r,
    ngx_http_idempotency_admin_ctx_t *ctx, long long pttl, ngx_buf_t **out)
{
    u_char                         *p, *h;
    size_t                          len;
    uint64_t                        now, expires, lease;
    ngx_int_t                       rc;
    ngx_str_t                       name, value, src, dst;
    ngx_buf_t                      *b;
    ngx_uint_t                      i, kind, status, hsize;
    const char                     *state;
    ngx_http_idempotency_record_t   rec;

    *out = NULL;

    /* a sealed record is opened with the location's keys, as on replay */

    rc = ngx_http_idempotency_crypt_open(ctx->conf->encrypt_keys,
                                         r->connection->log, &ctx->rkey,
                                         ctx->value, ctx->len, &rec);
    if (rc == NGX_ERROR) {
        return NGX_HTTP_BAD_GATEWAY;
    }

    if (rc == NGX_DECLINED
        && ngx_http_idempotency_record_decode(ctx->value, ctx->len, &rec)
           != NGX_OK)
    {
        ngx_log_error(NGX_LOG_ERR, r->connection->log, 0,
                      "idempotency: corrupt record in redis \"%V\" at \"%V\" "
                      "(%uz bytes)", &ctx->conf->redis->name, &ctx->rkey,
                      ctx->len);
        return NGX_HTTP_BAD_GATEWAY;
    }

    now = ngx_http_idempotency_epoch_msec();
    expires = pttl > 0 ? now + (uint64_t) pttl : 0;
    lease = 0;
    status = rec.status;

    switch (rec.state) {

    case NGX_HTTP_IDEMPOTENCY_REC_CLAIM:
        kind = ngx_http_idempotency_lease_read(ctx->value, &status, now,
                                               ctx->conf->lock_ttl / 3);

        if (kind == NGX_HTTP_IDEMPOTENCY_LEASE_UNKNOWN) {
            state = "unknown";

        } else {
            state = (kind == NGX_HTTP_IDEMPOTENCY_LEASE_EXPIRED)
                    ? "unknown" : "in_progress";
            lease = ngx_http_idempotency_lease_deadline(ctx->value);
            status = (kind == NGX_HTTP_IDEMPOTENCY_LEASE_EXPIRED)
                     ? NGX_HTTP_BAD_GATEWAY : 0;
        }

        break;

    case NGX_HTTP_IDEMPOTENCY_REC_TOO_LARGE:
        state = "too_large";
        break;

    default:
        state = "completed";
    }

    hsize = rec.headers_end ? (ngx_uint_t) (rec.headers_end - rec.headers)
                            : 0;

    /* the headers: each at most 6 times itself once escaped, plus quotes */
    len = 512 + 6 * hsize + 8 * rec.nheaders;

    if (ctx->body) {
        len += ngx_base64_encoded_length(rec.body_len);
    }

    b = ngx_create_temp_buf(r->pool, len);
    if (b == NULL) {
        return NGX_HTTP_INTERNAL_SERVER_ERROR;
    }

    p = b->last;

    p = ngx_sprintf(p, "{\"state\":\"%s\",\"status\":", state);
    p = status ? ngx_sprintf(p, "%ui", status) : ngx_cpymem(p, "null", 4);

    p = ngx_cpymem(p, ",\"stored_at\":", sizeof(",\"stored_at\":") - 1);

    if (expires && rec.state != NGX_HTTP_IDEMPOTENCY_REC_CLAIM
        && expires > ctx->conf->ttl)
    {
        p = ngx_http_idempotency_admin_time(p, expires - ctx->conf->ttl);

    } else {
        p = ngx_cpymem(p, "null", 4);
    }

    p = ngx_cpymem(p, ",\"expires_at\":", sizeof(",\"expires_at\":") - 1);
    p = expires ? ngx_http_idempotency_admin_time(p, expires)
                : ngx_cpymem(p, "null", 4);

    p = ngx_cpymem(p, ",\"lease_until\":", sizeof(",\"lease_until\":") - 1);
    p = lease ? ngx_http_idempotency_admin_time(p, lease)
              : ngx_cpymem(p, "null", 4);

    p = ngx_sprintf(p, ",\"size\":{\"headers\":%ui,\"body\":%uz},"
                    "\"fingerprint\":\"", hsize, rec.body_len);
    p = ngx_hex_dump(p, rec.fingerprint, NGX_HTTP_IDEMPOTENCY_HASH_LEN);
    p = ngx_cpymem(p, "\",\"headers\":[", sizeof("\",\"headers\":[") - 1);

    h = rec.headers;

    for (i = 0; i < rec.nheaders; i++) {
        h = ngx_http_idempotency_record_next_header(h, &name, &value);

        *p++ = i ? ',' : '[';

        if (i) {
            *p++ = '[';
        }

        *p++ = '"';
        p = (u_char *) ngx_escape_json(p, name.data, name.len);
        p = ngx_cpymem(p, "\",\"", 3);
        p = (u_char *) ngx_escape_json(p, value.data, value.len);
        *p++ = '"';
        *p++ = ']';
    }

    *p++ = ']';

    if (ctx->body && rec.body) {
        p = ngx_cpymem(p, ",\"body\":\"", sizeof(",\"body\":\"") - 1);
        src.data = rec.body;
        src.len = rec.body_len;
        dst.data = p;
        ngx_encode_base64(&dst, &src);
        p += dst.len;
        *p++ = '"';
    }

    *p++ = '}';
    *p++ = LF;

    b->last = p;
    *out = b;

    return NGX_HTTP_OK;
}


/* RFC 3339, UTC, milliseconds */

static u_char *
ngx_http_idempotency_admin_time(u_char *p, uint64_t msec)
{
    ngx_tm_t  tm;

    ngx_gmtime((time_t) (msec / 1000), &tm);

    return ngx_sprintf(p, "\"%4d-%02d-%02dT%02d:%02d:%02d.%03uDZ\"",
                       tm.ngx_tm_year, tm.ngx_tm_mon, tm.ngx_tm_mday,
                       tm.ngx_tm_hour, tm.ngx_tm_min, tm.ngx_tm_sec,
                       (uint32_t) (msec % 1000));
}


static void
ngx_http_idempotency_admin_timeout(ngx_event_t *ev)
{
    ngx_http_idempotency_admin_ctx_t *ctx = ev->data;

    ngx_http_idempotency_admin_finish(ctx, NGX_HTTP_SERVICE_UNAVAILABLE,
                                      NULL);
}


static void
ngx_http_idempotency_admin_cleanup(void *data)
{
    ngx_http_idempotency_admin_ctx_t *ctx = data;

    if (ctx->get) {
        ctx->get->data = NULL;
        ctx->get = NULL;
    }

    if (ctx->ttl) {
        ctx->ttl->data = NULL;
        ctx->ttl = NULL;
    }

    if (ctx->timeout.timer_set) {
        ngx_del_timer(&ctx->timeout);
    }
}


/* the answer, once; the ops still out no longer find the request */

static void
ngx_http_idempotency_admin_finish(ngx_http_idempotency_admin_ctx_t *ctx,
    ngx_int_t rc, ngx_buf_t *b)
{
    ngx_chain_t          out;
    ngx_http_request_t  *r;

    static ngx_str_t  json = ngx_string("application/json");

    r = ctx->request;

    ngx_http_idempotency_admin_cleanup(ctx);

    if (b == NULL) {
        ngx_http_finalize_request(r, rc);
        return;
    }

    r->headers_out.status = rc;
    r->headers_out.content_type = json;
    r->headers_out.content_type_len = json.len;
    r->headers_out.content_type_lowcase = NULL;
    r->headers_out.content_length_n = b->last - b->pos;

    b->last_buf = (r == r->main) ? 1 : 0;
    b->last_in_chain = 1;

    rc = ngx_http_send_header(r);

    if (rc == NGX_ERROR || rc > NGX_OK || r->header_only) {
        ngx_http_finalize_request(r, rc);
        return;
    }

    out.buf = b;
    out.next = NULL;

    ngx_http_finalize_request(r, ngx_http_output_filter(r, &out));
}
