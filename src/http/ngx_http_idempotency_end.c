
/*
 * Copyright (C) The ngx_http_idempotency_module authors
 *
 * How a claim ends, every way it can: its response stored or marked too
 * large (filter.c hands the record here), its outcome written down as
 * unknown, or the claim released; and the ends of a claim whose request
 * is gone: an orphan's release, a lost take-over, a dead owner's lease.
 * Each is one finish for the store, which sends it again until Redis
 * acknowledges it or the lease ends.
 */


#include "ngx_http_idempotency_http.h"


static void ngx_http_idempotency_owner_lost_done(ngx_http_idempotency_op_t *op,
    redisReply *reply);


void
ngx_http_idempotency_release(ngx_http_request_t *r,
    ngx_http_idempotency_ctx_t *ctx)
{
    if (ctx->took_over) {
        /*
         * It took over a key that may have run: whatever this request did
         * or did not, the key never becomes free again (the model found a
         * taker's release letting a third request run without the header)
         */
        ngx_http_idempotency_unknown(r, ctx, NGX_HTTP_BAD_GATEWAY);
        return;
    }

    ngx_http_idempotency_finish(ctx, NULL, 0, 0, r->connection->log);
}


void
ngx_http_idempotency_finish(ngx_http_idempotency_ctx_t *ctx, u_char *value,
    size_t len, ngx_msec_t ttl, ngx_log_t *log)
{
    ngx_str_t                      info;
    ngx_http_idempotency_finish_t  f;
    u_char                         buf[NGX_HTTP_IDEMPOTENCY_INFO_LEN];

    if (ctx->finished) {
        return;
    }

    ctx->finished = 1;
    ctx->capturing = 0;

    ngx_http_idempotency_lease_stop(ctx);

    info.data = buf;
    info.len = ngx_http_idempotency_request_info(ctx, buf) - buf;

    f.rkey = ctx->rkey;
    f.claim = ctx->claim;
    f.value = value;
    f.len = len;
    f.ttl = ttl;
    f.lease_end = ctx->lease_end;
    f.info = &info;
    f.orphan = 0;
    f.immediate = ctx->conf->store_immediate;

    ngx_http_idempotency_metrics_attribute(ctx->conf->metrics_zone);
    ngx_http_idempotency_finish_key(ctx->redis, &f, log);

    if (value) {
        ngx_http_idempotency_wait_store(ctx, &info);
    }
}


/*
 * What names the request in the log lines of its store or release, which
 * may come after nginx has freed it: the client, the request line, and
 * the key's hash (never the key).  buf holds INFO_LEN bytes.
 */

u_char *
ngx_http_idempotency_request_info(ngx_http_idempotency_ctx_t *ctx,
    u_char *buf)
{
    u_char              *last;
    ngx_str_t           *line;
    ngx_http_request_t  *r;

    r = ctx->request;
    line = &ctx->request_line;
    last = buf + NGX_HTTP_IDEMPOTENCY_INFO_LEN;

    /*
     * copied, not ngx_slprintf()ed: this runs for every store; the key
     * hash and an address always fit, the line is cut to fit, and the
     * closing quote always goes in
     */

    buf = ngx_cpymem(buf, "key hash ", sizeof("key hash ") - 1);
    buf = ngx_cpymem(buf, ngx_http_idempotency_key_hash(ctx),
                     2 * NGX_HTTP_IDEMPOTENCY_HASH_LEN);
    buf = ngx_cpymem(buf, ", client: ", sizeof(", client: ") - 1);
    buf = ngx_cpymem(buf, r->connection->addr_text.data,
                     ngx_min(r->connection->addr_text.len,
                             (size_t) NGX_SOCKADDR_STRLEN));
    buf = ngx_cpymem(buf, ", request: \"", sizeof(", request: \"") - 1);
    buf = ngx_cpymem(buf, line->data,
                     ngx_min(line->len, (size_t) (last - buf - 1)));
    *buf++ = '"';

    return buf;
}


/*
 * The request may have run and its result cannot be stored: the claim
 * becomes an unknown outcome, kept for idempotency_ttl, unless the
 * location says "release" (the old behaviour: a retry runs again).
 */

void
ngx_http_idempotency_unknown(ngx_http_request_t *r,
    ngx_http_idempotency_ctx_t *ctx, ngx_uint_t status)
{
    ngx_str_t  info;
    u_char     buf[NGX_HTTP_IDEMPOTENCY_HEAD_LEN];
    u_char     line[NGX_HTTP_IDEMPOTENCY_INFO_LEN];

    if (ctx->finished) {
        return;
    }

    if (ctx->conf->on_unknown == NGX_HTTP_IDEMPOTENCY_ON_UNKNOWN_RELEASE) {
        ngx_http_idempotency_release(r, ctx);
        return;
    }

    /*
     * on the stack: this also runs in the request pool's cleanup, when
     * r->pool is gone; finish() copies what it sends
     */

    ngx_http_idempotency_lease_unknown(buf, ctx->claim, status,
                                       NGX_HTTP_IDEMPOTENCY_CAUSE_UPSTREAM);

    info.data = line;
    info.len = ngx_http_idempotency_request_info(ctx, line) - line;

    ngx_log_error(NGX_LOG_ERR, r->connection->log, 0,
                  "idempotency: outcome unknown: the request was sent "
                  "upstream and no complete response came (%ui); retries "
                  "get outcome-unknown, %V", status, &info);

    ngx_http_idempotency_finish(ctx, buf, NGX_HTTP_IDEMPOTENCY_HEAD_LEN,
                                ctx->conf->ttl, r->connection->log);
}


/* the response cannot be stored: unknown if it may have run, else free */

void
ngx_http_idempotency_give_up(ngx_http_request_t *r,
    ngx_http_idempotency_ctx_t *ctx)
{
    ngx_uint_t  status;

    switch (ngx_http_idempotency_outcome(r, ctx, &status)) {

    case NGX_HTTP_IDEMPOTENCY_OUT_NONE:
        /* a content handler of its own ran once its response began */
        if (!ctx->header_seen) {
            break;
        }

        /* fall through */

    case NGX_HTTP_IDEMPOTENCY_OUT_SENT:
    case NGX_HTTP_IDEMPOTENCY_OUT_ANSWERED:
        ngx_http_idempotency_unknown(r, ctx, status);
        return;

    default:
        break;
    }

    ngx_http_idempotency_release(r, ctx);
}


/*
 * A claim whose request never reached the upstream, and whose reply was
 * lost or came too late: released, owner-checked, and sent again until
 * Redis answers or its lease would have ended.
 */

void
ngx_http_idempotency_release_orphan(ngx_http_idempotency_key_op_t *kop)
{
    ngx_http_idempotency_finish_t  f;

    ngx_memzero(&f, sizeof(ngx_http_idempotency_finish_t));

    f.rkey.data = kop->op.rkey;
    f.rkey.len = kop->op.rkey_len;
    f.claim = kop->claim;
    f.lease_end = kop->lease_end;
    f.orphan = 1;

    ngx_http_idempotency_metrics_attribute(kop->zone);
    ngx_http_idempotency_finish_key(kop->op.redis, &f, kop->op.redis->log);
}


/*
 * A take whose reply was lost may have landed.  It took over a key that
 * may have run: under forward the key must never become free (the model
 * found a taker's release letting a third request run without the
 * header), so it goes back to an unknown outcome, owner-checked; under
 * release it is released like any lost claim.
 */

void
ngx_http_idempotency_take_lost(ngx_http_idempotency_key_op_t *kop)
{
    ngx_http_idempotency_finish_t    f;
    u_char                           value[NGX_HTTP_IDEMPOTENCY_HEAD_LEN];

    if (!kop->forward) {
        ngx_http_idempotency_release_orphan(kop);
        return;
    }

    ngx_http_idempotency_lease_unknown(value, kop->claim, NGX_HTTP_BAD_GATEWAY,
                                       NGX_HTTP_IDEMPOTENCY_CAUSE_UPSTREAM);

    ngx_memzero(&f, sizeof(ngx_http_idempotency_finish_t));

    f.rkey.data = kop->op.rkey;
    f.rkey.len = kop->op.rkey_len;
    f.claim = kop->claim;
    f.value = value;
    f.len = NGX_HTTP_IDEMPOTENCY_HEAD_LEN;
    f.ttl = kop->ttl;
    f.lease_end = kop->lease_end;

    ngx_http_idempotency_metrics_attribute(kop->zone);
    ngx_http_idempotency_finish_key(kop->op.redis, &f, kop->op.redis->log);
}


/*
 * keep: the first request that finds a dead owner's lease writes down what
 * is known, an unknown outcome (the owner's own bytes stay, so a late store
 * of a live but cut-off owner still lands).  Its answer does not wait.
 */

void
ngx_http_idempotency_owner_lost(ngx_http_request_t *r,
    ngx_http_idempotency_ctx_t *ctx)
{
    u_char                          value[NGX_HTTP_IDEMPOTENCY_HEAD_LEN];
    ngx_http_idempotency_key_op_t  *kop;

    if (ctx->conf->dry_run) {
        return;
    }

    kop = ngx_http_idempotency_key_op_alloc(ctx->redis, &ctx->rkey);
    if (kop == NULL) {
        return;
    }

    kop->op.handler = ngx_http_idempotency_owner_lost_done;
    kop->info_len = ngx_http_idempotency_request_info(ctx, kop->info)
                    - kop->info;

    ngx_memcpy(value, ctx->seen, NGX_HTTP_IDEMPOTENCY_HEAD_LEN);
    ngx_http_idempotency_lease_unknown(value, ctx->seen, NGX_HTTP_BAD_GATEWAY,
                                       NGX_HTTP_IDEMPOTENCY_CAUSE_OWNER_LOST);

    (void) ngx_http_idempotency_take_command(&kop->op, &ctx->rkey, ctx->seen,
                                             value, ctx->conf->ttl);
}


static void
ngx_http_idempotency_owner_lost_done(ngx_http_idempotency_op_t *op,
    redisReply *reply)
{
    ngx_str_t                       info;
    ngx_http_idempotency_key_op_t  *kop;

    if (ngx_http_idempotency_take_result(op->redis, reply, NULL) != NGX_OK) {
        /* another request wrote it first, or it is read again next time */
        return;
    }

    kop = ngx_http_idempotency_key_op(op);

    info.data = kop->info;
    info.len = kop->info_len;

    ngx_http_idempotency_metrics_unknown(
                                       NGX_HTTP_IDEMPOTENCY_CAUSE_OWNER_LOST);

    ngx_log_error(NGX_LOG_ERR, op->redis->log, 0,
                  "idempotency: outcome unknown: the claim's owner went away "
                  "(its lease expired) after the request may have run; "
                  "retries get outcome-unknown, %V", &info);
}
