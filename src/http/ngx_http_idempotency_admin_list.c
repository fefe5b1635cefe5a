
/*
 * Copyright (C) The ngx_http_idempotency_module authors
 *
 * idempotency_admin's listing: GET ?list=STATE[&count=N][&cursor=C]
 * answers one page of a walk of the record keys (store/scan.c: one SCAN
 * step of COUNT N on one master), the records of that page in the state:
 *
 * {"state": ..., "count": N, "scanned": N, "keys": [{"hash": ...,
 *  "state": ..., "status": ..., "ttl_ms": ..., "lease_until": ...,
 *  "sealed": ...}, ...], "next_cursor": "..." | null}
 *
 * A page may be empty while next_cursor is not null: SCAN visits part of
 * the keyspace, whatever it finds there.  Each key is named by its hash,
 * as ?hash= and $idempotency_key_hash name it: Redis holds no raw key.
 */


#include "ngx_http_idempotency_http.h"


/* the most keys one SCAN step visits, and the default */
#define NGX_HTTP_IDEMPOTENCY_LIST_COUNT      100
#define NGX_HTTP_IDEMPOTENCY_LIST_COUNT_MAX  1000

/* a key's entry at most: the hash, state, status, times and commas */
#define NGX_HTTP_IDEMPOTENCY_LIST_ENTRY      256


typedef struct {
    ngx_http_request_t              *request;
    ngx_http_idempotency_loc_conf_t *conf;
    ngx_http_idempotency_scan_t     *scan;
    ngx_event_t                      timeout;
    ngx_uint_t                       state;      /* in the states[] */
} ngx_http_idempotency_list_ctx_t;


typedef enum {
    NGX_HTTP_IDEMPOTENCY_LIST_BAD_STATE = 0,
    NGX_HTTP_IDEMPOTENCY_LIST_BAD_COUNT,
    NGX_HTTP_IDEMPOTENCY_LIST_BAD_CURSOR
} ngx_http_idempotency_list_problem_e;


static ngx_http_idempotency_problem_t  ngx_http_idempotency_list_problems[] =
{
    { NGX_HTTP_BAD_REQUEST,
      ngx_string("admin-list-state-invalid"),
      ngx_string("The list argument names no state"),
      ngx_string("?list= takes unknown, in_progress, completed, too_large "
                 "or all: the state member of the view of one key.") },

    { NGX_HTTP_BAD_REQUEST,
      ngx_string("admin-list-count-invalid"),
      ngx_string("The count argument is malformed"),
      ngx_string("&count= takes a number from 1 to 1000: how many keys one "
                 "page visits (SCAN's COUNT); 100 without it.") },

    { NGX_HTTP_BAD_REQUEST,
      ngx_string("admin-list-cursor-invalid"),
      ngx_string("The cursor argument is malformed"),
      ngx_string("&cursor= takes the next_cursor of the page before, as it "
                 "was answered; leave it out to start a walk.") }
};


/* "all" last: it matches every state */
static ngx_str_t  ngx_http_idempotency_list_states[] = {
    ngx_string("unknown"),
    ngx_string("in_progress"),
    ngx_string("completed"),
    ngx_string("too_large"),
    ngx_string("all")
};

#define NGX_HTTP_IDEMPOTENCY_LIST_ALL                                         \
    (sizeof(ngx_http_idempotency_list_states) / sizeof(ngx_str_t) - 1)


static ngx_int_t ngx_http_idempotency_list_args(ngx_http_request_t *r,
    ngx_http_idempotency_scan_t *scan, ngx_uint_t *problem);
static ngx_int_t ngx_http_idempotency_list_number(ngx_str_t *arg,
    uint64_t max, uint64_t *n);
static void ngx_http_idempotency_list_done(ngx_http_idempotency_scan_t *scan,
    ngx_int_t rc);
static ngx_buf_t *ngx_http_idempotency_list_page(
    ngx_http_idempotency_list_ctx_t *ctx, ngx_http_idempotency_scan_t *scan);
static void ngx_http_idempotency_list_timeout(ngx_event_t *ev);
static void ngx_http_idempotency_list_cleanup(void *data);


ngx_int_t
ngx_http_idempotency_admin_list(ngx_http_request_t *r,
    ngx_http_idempotency_loc_conf_t *conf, ngx_str_t *state)
{
    ngx_int_t                         rc;
    ngx_buf_t                        *b;
    ngx_uint_t                        i, problem;
    ngx_pool_cleanup_t               *cln;
    ngx_http_idempotency_scan_t      *scan;
    ngx_http_idempotency_list_ctx_t  *ctx;

    ctx = ngx_pcalloc(r->pool, sizeof(ngx_http_idempotency_list_ctx_t));
    cln = ngx_pool_cleanup_add(r->pool, 0);
    if (ctx == NULL || cln == NULL) {
        return NGX_HTTP_INTERNAL_SERVER_ERROR;
    }

    ctx->request = r;
    ctx->conf = conf;

    for (i = 0; i <= NGX_HTTP_IDEMPOTENCY_LIST_ALL; i++) {
        if (state->len == ngx_http_idempotency_list_states[i].len
            && ngx_strncmp(state->data,
                           ngx_http_idempotency_list_states[i].data,
                           state->len)
               == 0)
        {
            break;
        }
    }

    r->main->count++;

    if (i > NGX_HTTP_IDEMPOTENCY_LIST_ALL) {
        ngx_http_idempotency_admin_answer(r, conf,
                    &ngx_http_idempotency_list_problems[
                        NGX_HTTP_IDEMPOTENCY_LIST_BAD_STATE]);
        return NGX_DONE;
    }

    ctx->state = i;

    scan = ngx_http_idempotency_scan_create(conf->redis,
                                            ngx_cycle->log);
    if (scan == NULL) {
        r->main->count--;
        return NGX_HTTP_INTERNAL_SERVER_ERROR;
    }

    cln->handler = ngx_http_idempotency_list_cleanup;
    cln->data = ctx;
    ctx->scan = scan;

    scan->prefix = conf->prefix;
    scan->handler = ngx_http_idempotency_list_done;
    scan->data = ctx;

    if (ngx_http_idempotency_list_args(r, scan, &problem) != NGX_OK) {
        ngx_http_idempotency_admin_answer(r, conf,
                                 &ngx_http_idempotency_list_problems[problem]);
        return NGX_DONE;
    }

    rc = ngx_http_idempotency_scan_start(scan);

    if (rc == NGX_DONE) {
        /* past the last master (a map that changed): the walk is over */
        b = ngx_http_idempotency_list_page(ctx, scan);
        ngx_http_idempotency_list_cleanup(ctx);
        ngx_http_idempotency_admin_json(r, b ? NGX_HTTP_OK
                                             : NGX_HTTP_INTERNAL_SERVER_ERROR,
                                        b);
        return NGX_DONE;
    }

    if (rc != NGX_OK) {
        ngx_http_idempotency_list_cleanup(ctx);
        ngx_http_idempotency_admin_answer(r, conf,
                                 &ngx_http_idempotency_admin_problems[
                                     NGX_HTTP_IDEMPOTENCY_ADMIN_UNAVAILABLE]);
        return NGX_DONE;
    }

    ctx->timeout.handler = ngx_http_idempotency_list_timeout;
    ctx->timeout.data = ctx;
    ctx->timeout.log = r->connection->log;

    ngx_add_timer(&ctx->timeout, conf->redis_timeout);

    return NGX_DONE;
}


/* &count=N (1 to 1000), &cursor=M-C as the page before answered it */

static ngx_int_t
ngx_http_idempotency_list_args(ngx_http_request_t *r,
    ngx_http_idempotency_scan_t *scan, ngx_uint_t *problem)
{
    u_char     *dash;
    uint64_t    n;
    ngx_str_t   arg, part;

    scan->count = NGX_HTTP_IDEMPOTENCY_LIST_COUNT;

    if (ngx_http_arg(r, (u_char *) "count", 5, &arg) == NGX_OK) {
        *problem = NGX_HTTP_IDEMPOTENCY_LIST_BAD_COUNT;

        if (ngx_http_idempotency_list_number(&arg,
                                       NGX_HTTP_IDEMPOTENCY_LIST_COUNT_MAX, &n)
            != NGX_OK
            || n == 0)
        {
            return NGX_DECLINED;
        }

        scan->count = (ngx_uint_t) n;
    }

    if (ngx_http_arg(r, (u_char *) "cursor", 6, &arg) != NGX_OK) {
        return NGX_OK;
    }

    /* the master (its position in the walk), "-", SCAN's cursor */

    *problem = NGX_HTTP_IDEMPOTENCY_LIST_BAD_CURSOR;

    dash = ngx_strlchr(arg.data, arg.data + arg.len, '-');
    if (dash == NULL) {
        return NGX_DECLINED;
    }

    part.data = arg.data;
    part.len = dash - arg.data;

    if (ngx_http_idempotency_list_number(&part, 65535, &n) != NGX_OK) {
        return NGX_DECLINED;
    }

    scan->master = (ngx_uint_t) n;

    part.data = dash + 1;
    part.len = arg.data + arg.len - part.data;

    if (ngx_http_idempotency_list_number(&part, UINT64_MAX, &scan->cursor)
        != NGX_OK)
    {
        return NGX_DECLINED;
    }

    return NGX_OK;
}


/* a decimal number of at most 20 digits, not above max */

static ngx_int_t
ngx_http_idempotency_list_number(ngx_str_t *arg, uint64_t max, uint64_t *n)
{
    size_t    i;
    uint64_t  v, d;

    if (arg->len == 0 || arg->len > NGX_INT64_LEN - 1) {
        return NGX_ERROR;
    }

    v = 0;

    for (i = 0; i < arg->len; i++) {
        if (arg->data[i] < '0' || arg->data[i] > '9') {
            return NGX_ERROR;
        }

        d = arg->data[i] - '0';

        if (v > (max - d) / 10) {
            return NGX_ERROR;
        }

        v = v * 10 + d;
    }

    *n = v;

    return NGX_OK;
}


/* the page is read: answered, the scan is freed by the caller after */

static void
ngx_http_idempotency_list_done(ngx_http_idempotency_scan_t *scan,
    ngx_int_t rc)
{
    ngx_http_idempotency_list_ctx_t *ctx = scan->data;

    ngx_buf_t           *b;
    ngx_http_request_t  *r;

    r = ctx->request;
    ctx->scan = NULL;

    if (ctx->timeout.timer_set) {
        ngx_del_timer(&ctx->timeout);
    }

    if (rc != NGX_OK) {
        ngx_http_idempotency_admin_answer(r, ctx->conf,
                                 &ngx_http_idempotency_admin_problems[
                                     NGX_HTTP_IDEMPOTENCY_ADMIN_UNAVAILABLE]);
        return;
    }

    b = ngx_http_idempotency_list_page(ctx, scan);

    ngx_http_idempotency_admin_json(r, b ? NGX_HTTP_OK
                                         : NGX_HTTP_INTERNAL_SERVER_ERROR, b);
}


static ngx_buf_t *
ngx_http_idempotency_list_page(ngx_http_idempotency_list_ctx_t *ctx,
    ngx_http_idempotency_scan_t *scan)
{
    u_char                           *p;
    ngx_buf_t                        *b;
    ngx_str_t                        *want;
    ngx_uint_t                        i, n;
    ngx_http_idempotency_view_t       v;
    ngx_http_idempotency_scan_key_t  *k;

    want = &ngx_http_idempotency_list_states[ctx->state];

    b = ngx_create_temp_buf(ctx->request->pool,
                            256 + NGX_HTTP_IDEMPOTENCY_LIST_ENTRY
                                  * scan->nkeys);
    if (b == NULL) {
        return NULL;
    }

    p = ngx_sprintf(b->last, "{\"state\":\"%V\",\"count\":%ui,"
                    "\"scanned\":%ui,\"keys\":[", want, scan->count,
                    scan->scanned);
    n = 0;

    for (i = 0; i < scan->nkeys; i++) {
        k = &scan->keys[i];

        /* gone since the SCAN, or no record of this module */

        if (k->pttl == -2
            || ngx_http_idempotency_view_head(k->head, k->len, scan->at,
                                              ctx->conf->lock_ttl / 3, &v)
               != NGX_OK)
        {
            continue;
        }

        if (ctx->state != NGX_HTTP_IDEMPOTENCY_LIST_ALL
            && ngx_strcmp(v.state, want->data) != 0)
        {
            continue;
        }

        p = ngx_sprintf(p, "%s{\"hash\":\"%*s\",\"state\":\"%s\",\"status\":",
                        n++ ? "," : "", (size_t) NGX_HTTP_IDEMPOTENCY_HEX_LEN,
                        k->hash, v.state);
        p = v.status ? ngx_sprintf(p, "%ui", v.status)
                     : ngx_cpymem(p, "null", 4);
        p = ngx_cpymem(p, ",\"ttl_ms\":", sizeof(",\"ttl_ms\":") - 1);
        p = k->pttl >= 0 ? ngx_sprintf(p, "%L", (int64_t) k->pttl)
                         : ngx_cpymem(p, "null", 4);
        p = ngx_cpymem(p, ",\"lease_until\":", sizeof(",\"lease_until\":") - 1);
        p = v.lease_until ? ngx_http_idempotency_admin_time(p, v.lease_until)
                          : ngx_cpymem(p, "null", 4);
        p = ngx_sprintf(p, ",\"sealed\":%s}", v.sealed ? "true" : "false");
    }

    p = ngx_cpymem(p, "],\"next_cursor\":", sizeof("],\"next_cursor\":") - 1);
    p = scan->end ? ngx_cpymem(p, "null", 4)
                  : ngx_sprintf(p, "\"%ui-%uL\"", scan->master, scan->cursor);
    *p++ = '}';
    *p++ = LF;

    b->last = p;

    return b;
}


static void
ngx_http_idempotency_list_timeout(ngx_event_t *ev)
{
    ngx_http_idempotency_list_ctx_t *ctx = ev->data;

    ngx_http_idempotency_list_cleanup(ctx);

    ngx_http_idempotency_admin_answer(ctx->request, ctx->conf,
                                 &ngx_http_idempotency_admin_problems[
                                     NGX_HTTP_IDEMPOTENCY_ADMIN_UNAVAILABLE]);
}


/* the request is done or gone: the replies still out find no request */

static void
ngx_http_idempotency_list_cleanup(void *data)
{
    ngx_http_idempotency_list_ctx_t *ctx = data;

    if (ctx->scan) {
        ngx_http_idempotency_scan_cancel(ctx->scan);
        ctx->scan = NULL;
    }

    if (ctx->timeout.timer_set) {
        ngx_del_timer(&ctx->timeout);
    }
}
