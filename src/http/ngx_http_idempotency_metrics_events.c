
/*
 * Copyright (C) The ngx_http_idempotency_module authors
 *
 * Prometheus metrics: what is counted.  The store and the Redis client know
 * nothing of metrics; they tell of finishes, targets and cluster masters
 * through their handler tables (ngx_http_idempotency_store_events and
 * ngx_http_idempotency_redis_events), and the sinks here, set at
 * configuration, count it into the shared zone of metrics.c.  The log
 * phase handler counts each request by its $idempotency_status, and the
 * request handler times its claims through the hooks below.
 */


#include "ngx_http_idempotency_http.h"


static void ngx_http_idempotency_metrics_store_failed(ngx_uint_t zone);
static void ngx_http_idempotency_metrics_unknown(ngx_uint_t cause);
static void ngx_http_idempotency_metrics_claim_sent(
    ngx_http_idempotency_key_op_t *kop);
static void ngx_http_idempotency_metrics_claim_done(
    ngx_http_idempotency_key_op_t *kop, ngx_uint_t answered);
static void ngx_http_idempotency_metrics_store_done(
    ngx_http_idempotency_key_op_t *kop, ngx_uint_t result);
static void ngx_http_idempotency_metrics_store(ngx_uint_t zone,
    ngx_uint_t result);
static void ngx_http_idempotency_metrics_redis_up(
    ngx_http_idempotency_target_t *redis);
static void ngx_http_idempotency_metrics_claim_refused(
    ngx_http_idempotency_target_t *redis);
static void ngx_http_idempotency_metrics_redis_down(
    ngx_http_idempotency_target_t *redis);
static ngx_http_idempotency_metrics_slot_t *
    ngx_http_idempotency_metrics_server(ngx_http_idempotency_target_t *redis,
    u_char **seen);
static void *ngx_http_idempotency_metrics_master_add(
    ngx_http_idempotency_target_t *redis, ngx_str_t *name);
static void ngx_http_idempotency_metrics_master_del(void *entry);
static void ngx_http_idempotency_metrics_master_up(void *entry, ngx_uint_t up);
static uint64_t ngx_http_idempotency_metrics_usec(void);


/* bucket bounds in microseconds (metrics_render.c has them as "le" labels) */

static ngx_uint_t  ngx_http_idempotency_metrics_bounds[] = {
    500, 1000, 2500, 5000, 10000, 25000, 50000, 100000, 250000, 500000,
    1000000
};


/* what the client and the store tell of, counted here (metrics_init) */

void
ngx_http_idempotency_metrics_events_init(void)
{
    ngx_http_idempotency_redis_events.up =
                                          ngx_http_idempotency_metrics_redis_up;
    ngx_http_idempotency_redis_events.down =
                                        ngx_http_idempotency_metrics_redis_down;
    ngx_http_idempotency_redis_events.master_add =
                                        ngx_http_idempotency_metrics_master_add;
    ngx_http_idempotency_redis_events.master_del =
                                        ngx_http_idempotency_metrics_master_del;
    ngx_http_idempotency_redis_events.master_up =
                                        ngx_http_idempotency_metrics_master_up;
    ngx_http_idempotency_store_events.done =
                                        ngx_http_idempotency_metrics_store_done;
    ngx_http_idempotency_store_events.failed =
                                      ngx_http_idempotency_metrics_store_failed;
    ngx_http_idempotency_store_events.unknown =
                                          ngx_http_idempotency_metrics_unknown;
    ngx_http_idempotency_store_events.claim_refused =
                                   ngx_http_idempotency_metrics_claim_refused;
    ngx_http_idempotency_store_events.claim_sent =
                                      ngx_http_idempotency_metrics_claim_sent;
    ngx_http_idempotency_store_events.claim_done =
                                      ngx_http_idempotency_metrics_claim_done;
}


/* once per main request, with the status it ended with */

ngx_int_t
ngx_http_idempotency_metrics_log(ngx_http_request_t *r)
{
    ngx_uint_t                            status, zone;
    ngx_http_idempotency_ctx_t           *ctx;
    ngx_http_idempotency_loc_conf_t      *conf;
    ngx_http_idempotency_metrics_conf_t  *mcf;

    if (r != r->main) {
        return NGX_OK;
    }

    mcf = ngx_http_idempotency_metrics_get_conf();
    if (mcf == NULL) {
        return NGX_OK;
    }

    ctx = ngx_http_idempotency_get_ctx(r);

    if (ctx) {
        /* judged where it was claimed, even if it ended elsewhere */
        status = ctx->status;
        zone = ctx->conf->metrics_zone;

    } else {
        conf = ngx_http_get_module_loc_conf(r, ngx_http_idempotency_module);

        if (!conf->enable) {
            return NGX_OK;
        }

        status = NGX_HTTP_IDEMPOTENCY_BYPASS;
        zone = conf->metrics_zone;
    }

    if (status < NGX_HTTP_IDEMPOTENCY_METRICS_STATUSES
        && zone < mcf->zones.nelts)
    {
        (void) ngx_atomic_fetch_add(&mcf->zone_slots[zone]->count[status], 1);
    }

    return NGX_OK;
}


/* a claim's round trip starts (the claim set kop->zone) */

static void
ngx_http_idempotency_metrics_claim_sent(ngx_http_idempotency_key_op_t *kop)
{
    kop->sent = ngx_http_idempotency_metrics_usec();
}


/* a claim's round trip is timed when a reply came, whatever it said */

static void
ngx_http_idempotency_metrics_claim_done(
    ngx_http_idempotency_key_op_t *kop, ngx_uint_t answered)
{
    uint64_t                              usec;
    ngx_uint_t                            i;
    ngx_http_idempotency_metrics_conf_t  *mcf;

    mcf = ngx_http_idempotency_metrics_get_conf();

    if (mcf == NULL || !answered) {
        return;
    }

    usec = ngx_http_idempotency_metrics_usec() - kop->sent;

    for (i = 0; i < NGX_HTTP_IDEMPOTENCY_METRICS_BUCKETS; i++) {
        if (usec <= ngx_http_idempotency_metrics_bounds[i]) {
            break;
        }
    }

    (void) ngx_atomic_fetch_add(&mcf->sh->latency[i], 1);
    (void) ngx_atomic_fetch_add(&mcf->sh->latency_usec,
                                (ngx_atomic_int_t) usec);
}


void
ngx_http_idempotency_metrics_fresh_key(void)
{
    ngx_http_idempotency_metrics_conf_t  *mcf;

    mcf = ngx_http_idempotency_metrics_get_conf();

    if (mcf) {
        (void) ngx_atomic_fetch_add(&mcf->sh->fresh_keys, 1);
    }
}


static void
ngx_http_idempotency_metrics_unknown(ngx_uint_t cause)
{
    ngx_http_idempotency_metrics_conf_t  *mcf;

    mcf = ngx_http_idempotency_metrics_get_conf();

    if (mcf && cause >= 1 && cause <= NGX_HTTP_IDEMPOTENCY_CAUSES) {
        (void) ngx_atomic_fetch_add(&mcf->sh->unknown[cause - 1], 1);
    }
}


static void
ngx_http_idempotency_metrics_store_failed(ngx_uint_t zone)
{
    ngx_http_idempotency_metrics_store(zone, NGX_HTTP_IDEMPOTENCY_STORE_FAILED);
}


/* what the finish's reply said, as the store read it (FINISH_*) */

static void
ngx_http_idempotency_metrics_store_done(
    ngx_http_idempotency_key_op_t *kop, ngx_uint_t finish)
{
    ngx_uint_t                            result;
    ngx_http_idempotency_metrics_conf_t  *mcf;

    if (finish == NGX_HTTP_IDEMPOTENCY_FINISH_FAILED) {
        result = NGX_HTTP_IDEMPOTENCY_STORE_FAILED;

    } else if (finish == NGX_HTTP_IDEMPOTENCY_FINISH_LOST) {
        result = NGX_HTTP_IDEMPOTENCY_STORE_FAILED;

        mcf = ngx_http_idempotency_metrics_get_conf();

        if (mcf) {
            (void) ngx_atomic_fetch_add(&mcf->sh->claims_lost, 1);
        }

    } else if (kop->cause) {
        /* not a store: what is known is that nothing is known */
        ngx_http_idempotency_metrics_unknown(kop->cause);
        return;

    } else if (!kop->store) {
        result = NGX_HTTP_IDEMPOTENCY_STORE_RELEASED;

    } else if (kop->too_large) {
        result = NGX_HTTP_IDEMPOTENCY_STORE_TOO_LARGE;

    } else {
        result = NGX_HTTP_IDEMPOTENCY_STORE_STORED;
    }

    ngx_http_idempotency_metrics_store(kop->zone, result);
}


static void
ngx_http_idempotency_metrics_store(ngx_uint_t zone, ngx_uint_t result)
{
    ngx_http_idempotency_metrics_conf_t  *mcf;

    mcf = ngx_http_idempotency_metrics_get_conf();

    if (mcf == NULL || zone >= mcf->zones.nelts) {
        return;
    }

    (void) ngx_atomic_fetch_add(&mcf->zone_slots[zone]->count[
                                    NGX_HTTP_IDEMPOTENCY_METRICS_STATUSES
                                    + result], 1);
}


/* when the connection is ready for commands */

static void
ngx_http_idempotency_metrics_redis_up(ngx_http_idempotency_target_t *redis)
{
    u_char                               *seen;
    ngx_http_idempotency_metrics_slot_t  *s;

    s = ngx_http_idempotency_metrics_server(redis, &seen);

    if (s == NULL) {
        return;
    }

    s->count[NGX_HTTP_IDEMPOTENCY_METRICS_UP] = 1;

    if (*seen) {
        (void) ngx_atomic_fetch_add(
                   &s->count[NGX_HTTP_IDEMPOTENCY_METRICS_RECONNECTS], 1);
    }

    *seen = 1;
}


/*
 * A claim the store did not send (store/claim.c): the server forbids
 * scripting and cannot compare and set natively.  Whichever worker learnt
 * it, it is counted by the target's address, as redis_up is.
 */

static void
ngx_http_idempotency_metrics_claim_refused(ngx_http_idempotency_target_t *redis)
{
    u_char                               *seen;
    ngx_http_idempotency_metrics_slot_t  *s;

    s = ngx_http_idempotency_metrics_server(redis, &seen);

    if (s) {
        (void) ngx_atomic_fetch_add(
                   &s->count[NGX_HTTP_IDEMPOTENCY_METRICS_REFUSED], 1);
    }
}


/*
 * Whenever a connection or an attempt ends; not when the worker exits: the
 * address is as reachable as before, and the next workers say so.
 */

static void
ngx_http_idempotency_metrics_redis_down(ngx_http_idempotency_target_t *redis)
{
    u_char                               *seen;
    ngx_http_idempotency_metrics_slot_t  *s;

    if (redis->exiting || ngx_exiting || ngx_quit || ngx_terminate) {
        return;
    }

    s = ngx_http_idempotency_metrics_server(redis, &seen);

    if (s) {
        s->count[NGX_HTTP_IDEMPOTENCY_METRICS_UP] = 0;
    }
}


static ngx_http_idempotency_metrics_slot_t *
ngx_http_idempotency_metrics_server(ngx_http_idempotency_target_t *redis,
    u_char **seen)
{
    ngx_uint_t                            i, n;
    ngx_http_idempotency_target_t        **rp;
    ngx_http_idempotency_metrics_conf_t  *mcf;

    mcf = ngx_http_idempotency_metrics_get_conf();
    if (mcf == NULL) {
        return NULL;
    }

    rp = mcf->imcf->servers.elts;
    n = ngx_min(mcf->imcf->servers.nelts, NGX_HTTP_IDEMPOTENCY_METRICS_REDIS);

    for (i = 0; i < n; i++) {
        if (rp[i] == redis) {
            *seen = &mcf->server_seen[i];
            return mcf->server_slots[i];
        }
    }

    return NULL;
}


/*
 * cluster_map.c: a master entered a worker's slot map (its entry, or NULL
 * when the table is full), and left it; the label is "host:port" as the
 * map names it.  A crashed worker's entries stay until the next restart.
 */

static void *
ngx_http_idempotency_metrics_master_add(ngx_http_idempotency_target_t *redis,
    ngx_str_t *name)
{
    uint32_t                                target;
    ngx_uint_t                              i;
    ngx_http_idempotency_metrics_shm_t     *sh;
    ngx_http_idempotency_metrics_conf_t    *mcf;
    ngx_http_idempotency_metrics_master_t  *m, *unused;

    mcf = ngx_http_idempotency_metrics_get_conf();
    if (mcf == NULL || name->len > NGX_HTTP_IDEMPOTENCY_METRICS_MASTER_LEN) {
        return NULL;
    }

    sh = mcf->sh;
    target = ngx_crc32_short(redis->name.data, redis->name.len);
    unused = NULL;

    ngx_spinlock(&sh->masters_lock, ngx_pid, 1024);

    for (i = 0; i < NGX_HTTP_IDEMPOTENCY_METRICS_MASTERS; i++) {
        m = &sh->masters[i];

        if (m->refs == 0) {
            if (unused == NULL) {
                unused = m;
            }

            continue;
        }

        if (m->target == target && m->target_len == redis->name.len
            && m->len == name->len
            && ngx_strncmp(m->name, name->data, name->len) == 0)
        {
            m->refs++;
            ngx_unlock(&sh->masters_lock);
            return m;
        }
    }

    if (unused) {
        /* a scrape reads without the lock: the entry is whole when seen */
        unused->up = 0;
        unused->target = target;
        unused->target_len = (uint32_t) redis->name.len;
        unused->len = name->len;
        ngx_memcpy(unused->name, name->data, name->len);
        ngx_memory_barrier();
        unused->refs = 1;
    }

    ngx_unlock(&sh->masters_lock);

    return unused;
}


static void
ngx_http_idempotency_metrics_master_del(void *entry)
{
    ngx_http_idempotency_metrics_conf_t    *mcf;
    ngx_http_idempotency_metrics_master_t  *m = entry;

    mcf = ngx_http_idempotency_metrics_get_conf();
    if (mcf == NULL || m == NULL) {
        return;
    }

    ngx_spinlock(&mcf->sh->masters_lock, ngx_pid, 1024);

    if (m->refs) {
        m->refs--;
    }

    ngx_unlock(&mcf->sh->masters_lock);
}


static void
ngx_http_idempotency_metrics_master_up(void *entry, ngx_uint_t up)
{
    ngx_http_idempotency_metrics_master_t  *m = entry;

    if (m) {
        m->up = up;
    }
}


/* monotonic: a clock step must not make a round trip negative */

static uint64_t
ngx_http_idempotency_metrics_usec(void)
{
    struct timespec  ts;

    if (clock_gettime(CLOCK_MONOTONIC, &ts) != 0) {
        return 0;
    }

    return (uint64_t) ts.tv_sec * 1000000 + ts.tv_nsec / 1000;
}
