
/*
 * Copyright (C) The ngx_http_idempotency_module authors
 *
 * The owner's renewals: every third of idempotency_lock_ttl while its
 * request is alive (the lease itself is lease.c's).
 */


#include "ngx_http_idempotency_store.h"


static void ngx_http_idempotency_renew(ngx_event_t *ev);
static void ngx_http_idempotency_renew_done(void *data, ngx_uint_t result,
    ngx_msec_t lease_end);


/*
 * Renewal starts with the owner and stops with its claim's end or its
 * request's: a request shorter than a third of the lock never renews.  The
 * timer is not cancelable: a worker that shuts down keeps renewing for the
 * requests it still serves, until worker_shutdown_timeout.
 */

void
ngx_http_idempotency_renew_start(ngx_http_idempotency_claim_t *c)
{
    ngx_event_t  *ev;

    c->lease_end = ngx_current_msec + c->conf->lock_ttl;

    ev = &c->renewal;
    ev->handler = ngx_http_idempotency_renew;
    ev->data = c;
    ev->log = c->log;

    ngx_add_timer(ev, ngx_max(c->conf->lock_ttl / 3, 1));
}


void
ngx_http_idempotency_renew_stop(ngx_http_idempotency_claim_t *c)
{
    if (c->renewal.timer_set) {
        ngx_del_timer(&c->renewal);
    }

    if (c->renew_op) {
        c->renew_op->data = NULL;
        c->renew_op = NULL;
    }
}


static void
ngx_http_idempotency_renew(ngx_event_t *ev)
{
    ngx_http_idempotency_claim_t *c = ev->data;

    ngx_http_idempotency_key_op_t  *kop;

    if (c->finished) {
        return;
    }

    ngx_add_timer(ev, ngx_max(c->conf->lock_ttl / 3, 1));

    if (c->renew_op) {
        /* the last one is not answered yet: its deadline still holds */
        return;
    }

    kop = ngx_http_idempotency_key_op_alloc(c->conf->redis, &c->rkey);
    if (kop == NULL) {
        return;
    }

    if (ngx_http_idempotency_lease_renew(kop, &c->rkey, c->head,
                                         c->conf->lock_ttl, c->conf->ttl,
                                         ngx_http_idempotency_renew_done, c)
        != NGX_OK)
    {
        ngx_log_error(NGX_LOG_WARN, ev->log, 0,
                      "idempotency: cannot renew the claim, redis \"%V\" is "
                      "not connected, key hash %*s", &c->conf->redis->name,
                      (size_t) 2 * NGX_HTTP_IDEMPOTENCY_HASH_LEN,
                      ngx_http_idempotency_rkey_hash(&c->rkey));
        return;
    }

    c->renew_op = &kop->op;
}


/* lease.c read the reply, and keeps c->head as Redis holds it */

static void
ngx_http_idempotency_renew_done(void *data, ngx_uint_t result,
    ngx_msec_t lease_end)
{
    ngx_http_idempotency_claim_t *c = data;

    c->renew_op = NULL;

    if (result == NGX_HTTP_IDEMPOTENCY_RENEWED) {
        c->lease_end = lease_end;
        return;
    }

    if (result == NGX_HTTP_IDEMPOTENCY_RENEW_LANDED) {
        /* a renewal thought lost had landed: the next one goes from it */
        return;
    }

    if (c->finished) {
        /* a store or unknown outcome is there now: nothing to renew */
        return;
    }

    ngx_log_error((ngx_uint_t) (result == NGX_HTTP_IDEMPOTENCY_RENEW_GONE
                                ? NGX_LOG_WARN : NGX_LOG_ERR),
                  c->log, 0,
                  "idempotency: the claim was not renewed: %s, key hash %*s",
                  result == NGX_HTTP_IDEMPOTENCY_RENEW_GONE
                  ? "redis went away"
                  : result == NGX_HTTP_IDEMPOTENCY_RENEW_ERROR
                  ? "redis error"
                  : "the key is no longer this request's",
                  (size_t) 2 * NGX_HTTP_IDEMPOTENCY_HASH_LEN,
                  ngx_http_idempotency_rkey_hash(&c->rkey));
}
