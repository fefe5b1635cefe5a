
/*
 * Copyright (C) The ngx_http_idempotency_module authors
 *
 * How a claim ends, every way it can: its response stored (or marked too
 * large), its outcome written down as unknown, or the claim released; and
 * the ends of a claim whose request is gone: an orphan's release, a lost
 * take-over, a dead owner's lease.  Each is one finish, which finish.c
 * sends again until Redis acknowledges it or the lease ends.
 */


#include "ngx_http_idempotency_store.h"


static void ngx_http_idempotency_claim_finish(ngx_http_idempotency_claim_t *c,
    u_char *value, size_t len);
static void ngx_http_idempotency_owner_lost_done(ngx_http_idempotency_op_t *op,
    redisReply *reply);


/*
 * The record (a completed response, or the too-large marker) as the key's
 * answer from now on.  Its head is told when it was stored, then a
 * completed record is sealed where it is if the location has keys: the
 * seal authenticates the head, time included.  NGX_ERROR: it cannot be
 * sealed (logged), nothing was sent, and the claim has not ended.
 */

ngx_int_t
ngx_http_idempotency_claim_store(ngx_http_idempotency_claim_t *c,
    u_char *value, size_t len)
{
    ngx_str_t  info;

    if (c->finished) {
        return NGX_OK;
    }

    ngx_http_idempotency_lease_stored(value);

    if (c->conf->keys
        && ngx_http_idempotency_head_state(value)
           != NGX_HTTP_IDEMPOTENCY_REC_TOO_LARGE
        && ngx_http_idempotency_crypt_seal(c->conf->keys, &c->rkey, value,
                                           &len)
           != NGX_OK)
    {
        ngx_http_idempotency_claim_info(c, &info);

        ngx_log_error(NGX_LOG_ERR, c->log, 0,
                      "idempotency: cannot seal the record, not stored, %V",
                      &info);
        return NGX_ERROR;
    }

    ngx_http_idempotency_claim_finish(c, value, len);
    ngx_http_idempotency_replicas_store(c);

    return NGX_OK;
}


/*
 * The response ran but is larger than idempotency_store_max_size: its
 * status is kept, and retries are told it cannot be replayed
 */

ngx_int_t
ngx_http_idempotency_claim_too_large(ngx_http_idempotency_claim_t *c,
    ngx_uint_t status)
{
    u_char  *buf;

    buf = ngx_pnalloc(c->pool, NGX_HTTP_IDEMPOTENCY_TOO_LARGE_LEN);
    if (buf == NULL) {
        return NGX_ERROR;
    }

    ngx_http_idempotency_build_too_large(buf, c->head, status);

    return ngx_http_idempotency_claim_store(c, buf,
                                            NGX_HTTP_IDEMPOTENCY_TOO_LARGE_LEN);
}


void
ngx_http_idempotency_claim_release(ngx_http_idempotency_claim_t *c)
{
    if (c->took_over) {
        /*
         * It took over a key that may have run: whatever this request did
         * or did not, the key never becomes free again (the model found a
         * taker's release letting a third request run without the header)
         */
        ngx_http_idempotency_claim_unknown(c,
                                           NGX_HTTP_IDEMPOTENCY_STATUS_UNKNOWN);
        return;
    }

    ngx_http_idempotency_claim_finish(c, NULL, 0);
}


/*
 * The request may have run and its result cannot be stored: the claim
 * becomes an unknown outcome, kept for idempotency_ttl, unless the
 * location says "release" (the old behaviour: a retry runs again).
 */

void
ngx_http_idempotency_claim_unknown(ngx_http_idempotency_claim_t *c,
    ngx_uint_t status)
{
    ngx_str_t  info;
    u_char     buf[NGX_HTTP_IDEMPOTENCY_HEAD_LEN];

    if (c->finished) {
        return;
    }

    if (c->conf->on_unknown == NGX_HTTP_IDEMPOTENCY_ON_UNKNOWN_RELEASE) {
        ngx_http_idempotency_claim_release(c);
        return;
    }

    /*
     * on the stack: this also runs in the request pool's cleanup;
     * finish_key() copies what it sends
     */

    ngx_http_idempotency_lease_unknown(buf, c->head, status,
                                       NGX_HTTP_IDEMPOTENCY_CAUSE_UPSTREAM);

    ngx_http_idempotency_claim_info(c, &info);

    ngx_log_error(NGX_LOG_ERR, c->log, 0,
                  "idempotency: outcome unknown: the request was sent "
                  "upstream and no complete response came (%ui); retries "
                  "get outcome-unknown, %V", status, &info);

    ngx_http_idempotency_claim_finish(c, buf, NGX_HTTP_IDEMPOTENCY_HEAD_LEN);
}


static void
ngx_http_idempotency_claim_finish(ngx_http_idempotency_claim_t *c,
    u_char *value, size_t len)
{
    ngx_str_t                      info;
    ngx_http_idempotency_finish_t  f;

    if (c->finished) {
        return;
    }

    c->finished = 1;

    ngx_http_idempotency_renew_stop(c);

    ngx_http_idempotency_claim_info(c, &info);

    f.zone = c->conf->zone;
    f.rkey = c->rkey;
    f.claim = c->head;
    f.value = value;
    f.len = len;
    f.ttl = value ? c->conf->ttl : 0;
    f.lease_end = c->lease_end;
    f.info = &info;
    f.orphan = 0;
    f.immediate = c->conf->immediate;

    ngx_http_idempotency_finish_key(c->conf->redis, &f, c->log);
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

    f.zone = kop->zone;
    f.rkey.data = kop->op.rkey;
    f.rkey.len = kop->op.rkey_len;
    f.claim = kop->claim;
    f.lease_end = kop->lease_end;
    f.orphan = 1;

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

    ngx_http_idempotency_lease_unknown(value, kop->claim,
                                       NGX_HTTP_IDEMPOTENCY_STATUS_UNKNOWN,
                                       NGX_HTTP_IDEMPOTENCY_CAUSE_UPSTREAM);

    ngx_memzero(&f, sizeof(ngx_http_idempotency_finish_t));

    f.zone = kop->zone;
    f.rkey.data = kop->op.rkey;
    f.rkey.len = kop->op.rkey_len;
    f.claim = kop->claim;
    f.value = value;
    f.len = NGX_HTTP_IDEMPOTENCY_HEAD_LEN;
    f.ttl = kop->ttl;
    f.lease_end = kop->lease_end;

    ngx_http_idempotency_finish_key(kop->op.redis, &f, kop->op.redis->log);
}


/*
 * keep: the first request that finds a dead owner's lease writes down what
 * is known, an unknown outcome (the owner's own bytes stay, so a late store
 * of a live but cut-off owner still lands).  Its answer does not wait.
 */

void
ngx_http_idempotency_owner_lost(ngx_http_idempotency_claim_t *c)
{
    u_char                          value[NGX_HTTP_IDEMPOTENCY_HEAD_LEN];
    ngx_str_t                       info;
    ngx_http_idempotency_key_op_t  *kop;

    kop = ngx_http_idempotency_key_op_alloc(c->conf->redis, &c->rkey);
    if (kop == NULL) {
        return;
    }

    kop->op.handler = ngx_http_idempotency_owner_lost_done;

    ngx_http_idempotency_claim_info(c, &info);
    kop->info_len = info.len;
    ngx_memcpy(kop->info, info.data, info.len);

    ngx_memcpy(value, c->seen, NGX_HTTP_IDEMPOTENCY_HEAD_LEN);
    ngx_http_idempotency_lease_unknown(value, c->seen,
                                       NGX_HTTP_IDEMPOTENCY_STATUS_UNKNOWN,
                                       NGX_HTTP_IDEMPOTENCY_CAUSE_OWNER_LOST);

    (void) ngx_http_idempotency_take_command(&kop->op, &c->rkey, c->seen,
                                             value, c->conf->ttl);
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

    ngx_http_idempotency_store_events.unknown(
                                       NGX_HTTP_IDEMPOTENCY_CAUSE_OWNER_LOST);

    ngx_log_error(NGX_LOG_ERR, op->redis->log, 0,
                  "idempotency: outcome unknown: the claim's owner went away "
                  "(its lease expired) after the request may have run; "
                  "retries get outcome-unknown, %V", &info);
}
