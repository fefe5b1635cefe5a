
/*
 * Copyright (C) The ngx_http_idempotency_module authors
 *
 * idempotency_admin: the operator's view of one key, in the spirit of
 * stub_status.  GET ?key=K[&scope=S] or ?hash=H answers with the record as
 * JSON (state, status, times, sizes, fingerprint, stored headers, and the
 * body with &body=1); DELETE purges a completed, unknown or too-large
 * record, an in-progress claim only with &force=1.  Every refusal is a
 * problem+json that says what to send instead.  GET ?list=STATE lists
 * the keys in a state, a page at a time (admin_list.c).  Only loopback
 * clients are answered unless the location says allow_remote, which is the
 * operator's word that nginx's own access control (allow/deny, auth_*)
 * guards it; each purge is logged at warn, by the key hash, never the raw
 * key.
 */


#include "ngx_http_idempotency_http.h"


typedef struct {
    ngx_http_request_t              *request;
    ngx_http_idempotency_loc_conf_t *conf;
    ngx_http_idempotency_fetch_t    *fetch;      /* the store's, in flight */
    ngx_event_t                      timeout;
    ngx_str_t                        rkey;
    ngx_uint_t                       body;       /* &body=1 */
    ngx_uint_t                       force;      /* &force=1 */
    ngx_log_t                        log;        /* without the request */
} ngx_http_idempotency_admin_ctx_t;


/*
 * An operator reads these in a terminal, in the middle of an incident:
 * each says what was wrong and what to send instead.  No double quote in
 * them: the problem's builder copies them as they are.
 */

ngx_http_idempotency_problem_t  ngx_http_idempotency_admin_problems[] =
{
    { NGX_HTTP_BAD_REQUEST,
      ngx_string("admin-key-missing"),
      ngx_string("No key named"),
      ngx_string("Name the record with ?key=K (the Idempotency-Key as the "
                 "client sent it, URL-encoded) and &scope=S where the "
                 "protected location sets idempotency_scope, or with "
                 "?hash=H, the 64 hex digits of $idempotency_key_hash.") },

    { NGX_HTTP_BAD_REQUEST,
      ngx_string("admin-hash-invalid"),
      ngx_string("The hash argument is malformed"),
      ngx_string("?hash= takes exactly 64 lowercase hexadecimal digits: the "
                 "$idempotency_key_hash of the request, as the access log "
                 "shows it.") },

    { NGX_HTTP_BAD_REQUEST,
      ngx_string("admin-key-invalid"),
      ngx_string("The key argument is not a valid Idempotency-Key"),
      ngx_string("?key= URL-decoded must be a key the protected location "
                 "accepts: a quoted string or a token of printable ASCII "
                 "characters, at most idempotency_key_max_length bytes.") },

    { NGX_HTTP_FORBIDDEN,
      ngx_string("admin-remote-refused"),
      ngx_string("This view answers loopback clients only"),
      ngx_string("idempotency_admin answers clients of 127.0.0.0/8, ::1 and "
                 "unix sockets. To serve others, protect the location with "
                 "allow and deny or auth_basic or auth_request, and write "
                 "idempotency_admin allow_remote.") },

    { NGX_HTTP_NOT_FOUND,
      ngx_string("admin-no-record"),
      ngx_string("No record for this key"),
      ngx_string("Redis holds no record under this name: the key expired, "
                 "was purged or never came, or this location names it with "
                 "another Redis, prefix, key secret or scope than the "
                 "protected location does.") },

    { NGX_HTTP_CONFLICT,
      ngx_string("admin-in-progress"),
      ngx_string("A request with this key is in progress"),
      ngx_string("Not purged: the record is the claim of a request still "
                 "running, or it changed between the read and the delete "
                 "(look again). Add &force=1 to purge a claim anyway: the "
                 "next retry then runs the request again, perhaps while the "
                 "first still runs.") },

    { NGX_HTTP_BAD_GATEWAY,
      ngx_string("admin-record-corrupt"),
      ngx_string("The record does not decode"),
      ngx_string("Redis holds something under this name that is no record "
                 "of this module: see the error log. DELETE removes it.") },

    { NGX_HTTP_SERVICE_UNAVAILABLE,
      ngx_string("admin-store-unavailable"),
      ngx_string("Redis did not answer"),
      ngx_string("Redis did not answer within idempotency_redis_timeout, or "
                 "refused the command: see the error log. A DELETE may have "
                 "taken effect: look again.") }
};


static ngx_int_t ngx_http_idempotency_admin_handler(ngx_http_request_t *r);
static ngx_uint_t ngx_http_idempotency_admin_local(ngx_connection_t *c);
static ngx_int_t ngx_http_idempotency_admin_refuse(ngx_http_request_t *r,
    ngx_http_idempotency_loc_conf_t *conf, ngx_uint_t problem);
static void ngx_http_idempotency_admin_problem(ngx_http_request_t *r,
    ngx_http_idempotency_loc_conf_t *conf, ngx_uint_t problem);
static ngx_int_t ngx_http_idempotency_admin_key(ngx_http_request_t *r,
    ngx_http_idempotency_admin_ctx_t *ctx, ngx_uint_t *problem);
static void ngx_http_idempotency_admin_told(ngx_http_idempotency_fetch_t *f,
    ngx_uint_t result);
static void ngx_http_idempotency_admin_show(
    ngx_http_idempotency_admin_ctx_t *ctx, ngx_http_idempotency_fetch_t *f);
static void ngx_http_idempotency_admin_purged(
    ngx_http_idempotency_admin_ctx_t *ctx);
static void ngx_http_idempotency_admin_timeout(ngx_event_t *ev);
static void ngx_http_idempotency_admin_cleanup(void *data);
static void ngx_http_idempotency_admin_finish(
    ngx_http_idempotency_admin_ctx_t *ctx, ngx_int_t rc, ngx_buf_t *b);
static void ngx_http_idempotency_admin_fail(
    ngx_http_idempotency_admin_ctx_t *ctx, ngx_uint_t problem);


char *
ngx_http_idempotency_admin_directive(ngx_conf_t *cf,
    ngx_command_t *cmd, void *conf)
{
    ngx_http_idempotency_loc_conf_t *ilcf = conf;

    ngx_str_t                 *value;
    ngx_http_core_loc_conf_t  *clcf;

    if (ilcf->admin) {
        return "is duplicate";
    }

    value = cf->args->elts;

    if (cf->args->nelts > 1
        && (value[1].len != sizeof("allow_remote") - 1
            || ngx_strncmp(value[1].data, "allow_remote", value[1].len) != 0))
    {
        ngx_conf_log_error(NGX_LOG_EMERG, cf, 0,
                           "invalid parameter \"%V\" of \"idempotency_admin\": "
                           "the only one is \"allow_remote\"", &value[1]);
        return NGX_CONF_ERROR;
    }

    clcf = ngx_http_conf_get_module_loc_conf(cf, ngx_http_core_module);
    clcf->handler = ngx_http_idempotency_admin_handler;

    /* the view is no protected request, even under "idempotency on" */

    if (ilcf->enable == NGX_CONF_UNSET) {
        ilcf->enable = 0;
    }

    ilcf->admin = cf->args->nelts > 1 ? 2 : 1;

    return NGX_CONF_OK;
}


/*
 * nginx -t: a view that names no Redis would read the default
 * 127.0.0.1:6379, whatever the protected locations use, and answer "no
 * record" for every key: refused, as there is nothing sensible to read.
 * The prefix, secret and encryption keys have defaults that mean something
 * (and the protected locations may differ among themselves): documented.
 */

char *
ngx_http_idempotency_admin_merge(ngx_conf_t *cf,
    ngx_http_idempotency_loc_conf_t *conf)
{
    ngx_http_core_loc_conf_t  *clcf;

    if (!conf->admin || !conf->redis_default) {
        return NGX_CONF_OK;
    }

    clcf = ngx_http_conf_get_module_loc_conf(cf, ngx_http_core_module);

    ngx_log_error(NGX_LOG_EMERG, cf->log, 0,
                  "\"idempotency_admin\" in location \"%V\" has no "
                  "\"idempotency_redis\", of its own or inherited: it would "
                  "read the default %V, not the Redis of the locations it "
                  "inspects; set their \"idempotency_redis\" (and prefix, "
                  "key secret and encryption keys) here or in server{} or "
                  "http{} in %V:%ui", &clcf->name, &conf->redis->name,
                  &conf->conf_file, conf->conf_line);

    return NGX_CONF_ERROR;
}


static ngx_int_t
ngx_http_idempotency_admin_handler(ngx_http_request_t *r)
{
    ngx_int_t                          rc;
    ngx_str_t                          arg;
    ngx_uint_t                         problem;
    ngx_pool_cleanup_t                *cln;
    ngx_http_idempotency_loc_conf_t   *conf;
    ngx_http_idempotency_admin_ctx_t  *ctx;

    conf = ngx_http_get_module_loc_conf(r, ngx_http_idempotency_module);

    /*
     * After the access phase: realip, allow and deny have had their say.
     * A remote client is told nothing more, not even the methods.
     */

    if (conf->admin == 1 && !ngx_http_idempotency_admin_local(r->connection))
    {
        return ngx_http_idempotency_admin_refuse(r, conf,
                                          NGX_HTTP_IDEMPOTENCY_ADMIN_REMOTE);
    }

    if (!(r->method & (NGX_HTTP_GET|NGX_HTTP_HEAD|NGX_HTTP_DELETE))) {
        return NGX_HTTP_NOT_ALLOWED;
    }

    rc = ngx_http_discard_request_body(r);
    if (rc != NGX_OK) {
        return rc;
    }

    /* ?list=STATE: a page of the keys in a state (admin_list.c) */

    if (ngx_http_arg(r, (u_char *) "list", 4, &arg) == NGX_OK) {
        return (r->method == NGX_HTTP_DELETE)
               ? NGX_HTTP_NOT_ALLOWED
               : ngx_http_idempotency_admin_list(r, conf, &arg);
    }

    ctx = ngx_pcalloc(r->pool, sizeof(ngx_http_idempotency_admin_ctx_t));
    if (ctx == NULL) {
        return NGX_HTTP_INTERNAL_SERVER_ERROR;
    }

    ctx->request = r;
    ctx->conf = conf;

    /*
     * The module's own lines about this request go without nginx's
     * "request:" context: it holds ?key= and ?scope= as the client sent
     * them, and these lines name the key by its hash alone
     */

    ctx->log = *r->connection->log;
    ctx->log.handler = NULL;
    ctx->log.data = NULL;

    rc = ngx_http_idempotency_admin_key(r, ctx, &problem);

    if (rc == NGX_DECLINED) {
        return ngx_http_idempotency_admin_refuse(r, conf, problem);
    }

    if (rc != NGX_OK) {
        return NGX_HTTP_INTERNAL_SERVER_ERROR;
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

    /* the store says once, through the handler, what came of it */

    if (r->method == NGX_HTTP_DELETE) {
        ctx->fetch = ngx_http_idempotency_purge(conf->redis, &ctx->rkey,
                                             ctx->force, &ctx->log,
                                             ngx_http_idempotency_admin_told,
                                             ctx);

    } else {
        ctx->fetch = ngx_http_idempotency_fetch(conf->redis, &ctx->rkey,
                                             &ctx->log,
                                             ngx_http_idempotency_admin_told,
                                             ctx);
    }

    if (ctx->fetch == NULL) {
        return ngx_http_idempotency_admin_refuse(r, conf,
                                     NGX_HTTP_IDEMPOTENCY_ADMIN_UNAVAILABLE);
    }

    ngx_add_timer(&ctx->timeout, ctx->conf->redis_timeout);

    r->main->count++;

    return NGX_DONE;
}


/*
 * Loopback, as the connection's address is after realip: IPv4 127/8, ::1,
 * 127/8 mapped into IPv6, and a unix socket (its file's mode guards it)
 */

static ngx_uint_t
ngx_http_idempotency_admin_local(ngx_connection_t *c)
{
    struct sockaddr_in   *sin;
#if (NGX_HAVE_INET6)
    struct sockaddr_in6  *sin6;
#endif

    switch (c->sockaddr->sa_family) {

    case AF_INET:
        sin = (struct sockaddr_in *) c->sockaddr;
        return (ntohl(sin->sin_addr.s_addr) >> 24) == 127;

#if (NGX_HAVE_INET6)
    case AF_INET6:
        sin6 = (struct sockaddr_in6 *) c->sockaddr;

        if (IN6_IS_ADDR_V4MAPPED(&sin6->sin6_addr)) {
            return sin6->sin6_addr.s6_addr[12] == 127;
        }

        return IN6_IS_ADDR_LOOPBACK(&sin6->sin6_addr);
#endif

#if (NGX_HAVE_UNIX_DOMAIN)
    case AF_UNIX:
        return 1;
#endif

    default:
        return 0;
    }
}


/* a refusal from the content handler, which then returns NGX_DONE */

static ngx_int_t
ngx_http_idempotency_admin_refuse(ngx_http_request_t *r,
    ngx_http_idempotency_loc_conf_t *conf, ngx_uint_t problem)
{
    r->main->count++;

    ngx_http_idempotency_admin_problem(r, conf, problem);

    return NGX_DONE;
}


/* the problem+json of the module's other answers, finalized */

static void
ngx_http_idempotency_admin_problem(ngx_http_request_t *r,
    ngx_http_idempotency_loc_conf_t *conf, ngx_uint_t problem)
{
    ngx_http_idempotency_admin_answer(r, conf,
                                 &ngx_http_idempotency_admin_problems[problem]);
}


/* the record key: <prefix>{hash} from ?hash=, or from ?key= and ?scope= */

static ngx_int_t
ngx_http_idempotency_admin_key(ngx_http_request_t *r,
    ngx_http_idempotency_admin_ctx_t *ctx, ngx_uint_t *problem)
{
    u_char                      *p, *dst, *src;
    ngx_str_t                    arg, raw, key, scope;
    ngx_uint_t                   i;
    ngx_http_idempotency_ctx_t   kctx;

    if (ngx_http_arg(r, (u_char *) "hash", 4, &arg) == NGX_OK) {

        *problem = NGX_HTTP_IDEMPOTENCY_ADMIN_BAD_HASH;

        if (arg.len != 2 * NGX_HTTP_IDEMPOTENCY_HASH_LEN) {
            return NGX_DECLINED;
        }

        for (i = 0; i < arg.len; i++) {
            if (!((arg.data[i] >= '0' && arg.data[i] <= '9')
                  || (arg.data[i] >= 'a' && arg.data[i] <= 'f')))
            {
                return NGX_DECLINED;
            }
        }

        ctx->rkey.len = ctx->conf->prefix.len + 2 + arg.len;
        ctx->rkey.data = ngx_pnalloc(r->pool, ctx->rkey.len);
        if (ctx->rkey.data == NULL) {
            return NGX_ERROR;
        }

        p = ngx_cpymem(ctx->rkey.data, ctx->conf->prefix.data,
                       ctx->conf->prefix.len);
        *p++ = '{';
        p = ngx_cpymem(p, arg.data, arg.len);
        *p = '}';

        return NGX_OK;
    }

    if (ngx_http_arg(r, (u_char *) "key", 3, &arg) != NGX_OK || arg.len == 0) {
        *problem = NGX_HTTP_IDEMPOTENCY_ADMIN_NO_KEY;
        return NGX_DECLINED;
    }

    /* the key as the client sent it in its header, URL-encoded here */

    raw.data = ngx_pnalloc(r->pool, arg.len + 1);
    key.data = ngx_pnalloc(r->pool, arg.len + 1);
    if (raw.data == NULL || key.data == NULL) {
        return NGX_ERROR;
    }

    dst = raw.data;
    src = arg.data;
    ngx_unescape_uri(&dst, &src, arg.len, 0);
    raw.len = dst - raw.data;

    if (ngx_http_idempotency_parse_key(&raw, &key,
                                       ctx->conf->key_max_length)
        != NGX_OK)
    {
        *problem = NGX_HTTP_IDEMPOTENCY_ADMIN_BAD_KEY;
        return NGX_DECLINED;
    }

    ngx_str_null(&scope);

    if (ngx_http_arg(r, (u_char *) "scope", 5, &arg) == NGX_OK) {
        scope.data = ngx_pnalloc(r->pool, arg.len + 1);
        if (scope.data == NULL) {
            return NGX_ERROR;
        }

        dst = scope.data;
        src = arg.data;
        ngx_unescape_uri(&dst, &src, arg.len, 0);
        scope.len = dst - scope.data;
    }

    ngx_memzero(&kctx, sizeof(ngx_http_idempotency_ctx_t));
    kctx.conf = ctx->conf;

    if (ngx_http_idempotency_key_name(r, &kctx, &scope, &key) != NGX_OK) {
        return NGX_ERROR;
    }

    ctx->rkey = kctx.rkey;

    return NGX_OK;
}


/*
 * What the store's fetch or purge came to, once: the fetch and its value
 * are freed after this returns.  A purge not done because the record
 * changed between the store's read and its delete is the same 409 as a
 * claim in progress: the operator looks again.
 */

static void
ngx_http_idempotency_admin_told(ngx_http_idempotency_fetch_t *f,
    ngx_uint_t result)
{
    ngx_http_idempotency_admin_ctx_t *ctx = f->data;

    ctx->fetch = NULL;

    switch (result) {

    case NGX_HTTP_IDEMPOTENCY_FETCH_FOUND:
        ngx_http_idempotency_admin_show(ctx, f);
        return;

    case NGX_HTTP_IDEMPOTENCY_FETCH_PURGED:
        ngx_http_idempotency_admin_purged(ctx);
        return;

    case NGX_HTTP_IDEMPOTENCY_FETCH_BUSY:
    case NGX_HTTP_IDEMPOTENCY_FETCH_CHANGED:
        ngx_http_idempotency_admin_fail(ctx,
                                        NGX_HTTP_IDEMPOTENCY_ADMIN_IN_PROGRESS);
        return;

    case NGX_HTTP_IDEMPOTENCY_FETCH_NONE:
        ngx_http_idempotency_admin_fail(ctx,
                                        NGX_HTTP_IDEMPOTENCY_ADMIN_NOT_FOUND);
        return;

    default:
        ngx_http_idempotency_admin_fail(ctx,
                                     NGX_HTTP_IDEMPOTENCY_ADMIN_UNAVAILABLE);
    }
}


/* the record and its time to live, as JSON */

static void
ngx_http_idempotency_admin_show(ngx_http_idempotency_admin_ctx_t *ctx,
    ngx_http_idempotency_fetch_t *f)
{
    ngx_int_t   rc;
    ngx_buf_t  *b;

    rc = ngx_http_idempotency_admin_view(ctx->request, ctx->conf, &ctx->log,
                                         &ctx->rkey, f->value, f->len,
                                         f->pttl, ctx->body, &b);

    if (rc == NGX_HTTP_BAD_GATEWAY) {
        ngx_http_idempotency_admin_fail(ctx,
                                        NGX_HTTP_IDEMPOTENCY_ADMIN_CORRUPT);
        return;
    }

    ngx_http_idempotency_admin_finish(ctx, rc, b);
}


/* who purged, where and which key: the location's name is the config's */

static void
ngx_http_idempotency_admin_purged(ngx_http_idempotency_admin_ctx_t *ctx)
{
    ngx_http_request_t        *r;
    ngx_http_core_loc_conf_t  *clcf;

    r = ctx->request;
    clcf = ngx_http_get_module_loc_conf(r, ngx_http_core_module);

    ngx_log_error(NGX_LOG_WARN, &ctx->log, 0,
                  "idempotency: record purged by %V, key hash %*s%s, "
                  "redis \"%V\", location \"%V\"",
                  &r->connection->addr_text,
                  (size_t) 2 * NGX_HTTP_IDEMPOTENCY_HASH_LEN,
                  ctx->rkey.data + ctx->rkey.len - 1
                  - 2 * NGX_HTTP_IDEMPOTENCY_HASH_LEN,
                  ctx->force ? " (forced)" : "",
                  &ctx->conf->redis->name, &clcf->name);

    ngx_http_idempotency_admin_finish(ctx, NGX_HTTP_NO_CONTENT, NULL);
}


static void
ngx_http_idempotency_admin_timeout(ngx_event_t *ev)
{
    ngx_http_idempotency_admin_ctx_t *ctx = ev->data;

    ngx_http_idempotency_admin_fail(ctx,
                                    NGX_HTTP_IDEMPOTENCY_ADMIN_UNAVAILABLE);
}


static void
ngx_http_idempotency_admin_cleanup(void *data)
{
    ngx_http_idempotency_admin_ctx_t *ctx = data;

    if (ctx->fetch) {
        ngx_http_idempotency_fetch_cancel(ctx->fetch);
        ctx->fetch = NULL;
    }

    if (ctx->timeout.timer_set) {
        ngx_del_timer(&ctx->timeout);
    }
}


/* a refusal, once; the replies still out no longer find the request */

static void
ngx_http_idempotency_admin_fail(ngx_http_idempotency_admin_ctx_t *ctx,
    ngx_uint_t problem)
{
    ngx_http_idempotency_admin_cleanup(ctx);

    ngx_http_idempotency_admin_problem(ctx->request, ctx->conf, problem);
}


/* the answer, once; the replies still out no longer find the request */

static void
ngx_http_idempotency_admin_finish(ngx_http_idempotency_admin_ctx_t *ctx,
    ngx_int_t rc, ngx_buf_t *b)
{
    ngx_http_idempotency_admin_cleanup(ctx);

    ngx_http_idempotency_admin_json(ctx->request, rc, b);
}
