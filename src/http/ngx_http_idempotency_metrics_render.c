
/*
 * Copyright (C) The ngx_http_idempotency_module authors
 *
 * Prometheus metrics: the scrape.  A location with idempotency_metrics
 * answers with the shared zone of metrics.c in Prometheus's text format
 * (version 0.0.4): the build, each metrics zone's requests and stores, the
 * counters of the whole zone, each Redis address's state (and each cluster
 * master's), and the claims' latency.  It only reads, and takes no lock.
 */


#include "ngx_http_idempotency_http.h"
#include "ngx_http_idempotency_version.h"


static size_t ngx_http_idempotency_metrics_size(
    ngx_http_idempotency_metrics_conf_t *mcf,
    ngx_http_idempotency_main_conf_t *imcf);
static u_char *ngx_http_idempotency_metrics_render(u_char *p, u_char *end,
    ngx_http_idempotency_metrics_conf_t *mcf,
    ngx_http_idempotency_main_conf_t *imcf);
static u_char *ngx_http_idempotency_metrics_render_latency(u_char *p,
    u_char *end, ngx_http_idempotency_metrics_shm_t *sh);
static u_char *ngx_http_idempotency_metrics_render_redis(u_char *p,
    u_char *end, ngx_http_idempotency_metrics_conf_t *mcf,
    ngx_http_idempotency_main_conf_t *imcf);
static u_char *ngx_http_idempotency_metrics_escape(u_char *p, u_char *end,
    ngx_str_t *value);
static u_char *ngx_http_idempotency_metrics_masters(u_char *p, u_char *end,
    ngx_http_idempotency_metrics_shm_t *sh, ngx_str_t *target);


static ngx_str_t  ngx_http_idempotency_metrics_results[] = {
    ngx_string("stored"),
    ngx_string("too_large"),
    ngx_string("released"),
    ngx_string("failed")
};


/* bucket bounds as "le" labels (metrics_events.c has them in microseconds) */

static char  *ngx_http_idempotency_metrics_le[] = {
    "0.0005", "0.001", "0.0025", "0.005", "0.01", "0.025", "0.05", "0.1",
    "0.25", "0.5", "1", "+Inf"
};


ngx_int_t
ngx_http_idempotency_metrics_handler(ngx_http_request_t *r)
{
    size_t                                size;
    ngx_int_t                             rc;
    ngx_buf_t                            *b;
    ngx_chain_t                           out;
    ngx_http_idempotency_main_conf_t     *imcf;
    ngx_http_idempotency_metrics_conf_t  *mcf;

    if (!(r->method & (NGX_HTTP_GET|NGX_HTTP_HEAD))) {
        return NGX_HTTP_NOT_ALLOWED;
    }

    rc = ngx_http_discard_request_body(r);

    if (rc != NGX_OK) {
        return rc;
    }

    imcf = ngx_http_get_module_main_conf(r, ngx_http_idempotency_module);
    mcf = imcf->metrics;

    if (mcf == NULL || mcf->sh == NULL) {
        return NGX_HTTP_INTERNAL_SERVER_ERROR;
    }

    size = ngx_http_idempotency_metrics_size(mcf, imcf);

    b = ngx_create_temp_buf(r->pool, size);
    if (b == NULL) {
        return NGX_HTTP_INTERNAL_SERVER_ERROR;
    }

    b->last = ngx_http_idempotency_metrics_render(b->pos, b->end, mcf, imcf);
    b->last_buf = (r == r->main) ? 1 : 0;
    b->last_in_chain = 1;

    r->headers_out.status = NGX_HTTP_OK;
    r->headers_out.content_length_n = b->last - b->pos;
    ngx_str_set(&r->headers_out.content_type,
                "text/plain; version=0.0.4; charset=utf-8");
    r->headers_out.content_type_len = sizeof("text/plain") - 1;

    rc = ngx_http_send_header(r);

    if (rc == NGX_ERROR || rc > NGX_OK || r->header_only) {
        return rc;
    }

    out.buf = b;
    out.next = NULL;

    return ngx_http_output_filter(r, &out);
}


/* an upper bound: fixed text, then a line per counter with its labels */

#define NGX_HTTP_IDEMPOTENCY_METRICS_LINE                                     \
    (sizeof("nginx_idempotency_redis_reconnects_total{zone=\"\","           \
            "status=\"too_large\"} \n") - 1 + NGX_ATOMIC_T_LEN)

static size_t
ngx_http_idempotency_metrics_size(ngx_http_idempotency_metrics_conf_t *mcf,
    ngx_http_idempotency_main_conf_t *imcf)
{
    size_t                           size;
    ngx_str_t                       *name;
    ngx_uint_t                       i;
    ngx_http_idempotency_target_t   **rp;

    size = 4096 + (NGX_HTTP_IDEMPOTENCY_METRICS_BUCKETS + 4)
                  * NGX_HTTP_IDEMPOTENCY_METRICS_LINE;

    name = mcf->zones.elts;

    for (i = 0; i < mcf->zones.nelts; i++) {
        size += (NGX_HTTP_IDEMPOTENCY_METRICS_STATUSES
                 + NGX_HTTP_IDEMPOTENCY_METRICS_RESULTS)
                * (NGX_HTTP_IDEMPOTENCY_METRICS_LINE + name[i].len);
    }

    rp = imcf->servers.elts;

    for (i = 0; i < imcf->servers.nelts; i++) {
        /* escaping at most doubles a label value; and the info line */
        size += (NGX_HTTP_IDEMPOTENCY_METRICS_SERVER_COUNTS + 1)
                * (NGX_HTTP_IDEMPOTENCY_METRICS_LINE + 2 * rp[i]->name.len)
                + sizeof(rp[i]->server);

        if (rp[i]->topology->nodes) {
            size += NGX_HTTP_IDEMPOTENCY_METRICS_MASTERS
                    * (NGX_HTTP_IDEMPOTENCY_METRICS_LINE
                       + 2 * (rp[i]->name.len
                              + NGX_HTTP_IDEMPOTENCY_METRICS_MASTER_LEN));
        }
    }

    return size;
}


static u_char *
ngx_http_idempotency_metrics_render(u_char *p, u_char *end,
    ngx_http_idempotency_metrics_conf_t *mcf,
    ngx_http_idempotency_main_conf_t *imcf)
{
    ngx_str_t                            *name;
    ngx_uint_t                            i, j;
    ngx_http_idempotency_metrics_shm_t   *sh;

    sh = mcf->sh;
    name = mcf->zones.elts;

    p = ngx_slprintf(p, end,
            "# HELP nginx_idempotency_build_info The module's version.\n"
            "# TYPE nginx_idempotency_build_info gauge\n"
            "nginx_idempotency_build_info{version=\"%s\"} 1\n"
            "# HELP nginx_idempotency_requests_total Requests in locations "
            "with idempotency on, by $idempotency_status.\n"
            "# TYPE nginx_idempotency_requests_total counter\n",
            NGX_HTTP_IDEMPOTENCY_VERSION);

    for (i = 0; i < mcf->zones.nelts; i++) {
        for (j = 0; j < NGX_HTTP_IDEMPOTENCY_METRICS_STATUSES; j++) {
            p = ngx_slprintf(p, end,
                    "nginx_idempotency_requests_total"
                    "{zone=\"%V\",status=\"%V\"} %uA\n",
                    &name[i], &ngx_http_idempotency_status_names[j],
                    mcf->zone_slots[i]->count[j]);
        }
    }

    p = ngx_slprintf(p, end,
            "# HELP nginx_idempotency_stores_total Stores and releases of "
            "claims, by result.\n"
            "# TYPE nginx_idempotency_stores_total counter\n");

    for (i = 0; i < mcf->zones.nelts; i++) {
        for (j = 0; j < NGX_HTTP_IDEMPOTENCY_METRICS_RESULTS; j++) {
            p = ngx_slprintf(p, end,
                    "nginx_idempotency_stores_total"
                    "{zone=\"%V\",result=\"%V\"} %uA\n",
                    &name[i], &ngx_http_idempotency_metrics_results[j],
                    mcf->zone_slots[i]->count[
                        NGX_HTTP_IDEMPOTENCY_METRICS_STATUSES + j]);
        }
    }

    p = ngx_slprintf(p, end,
            "# HELP nginx_idempotency_claims_lost_total Stores or releases "
            "that found the claim gone: an operation may have run twice.\n"
            "# TYPE nginx_idempotency_claims_lost_total counter\n"
            "nginx_idempotency_claims_lost_total %uA\n"
            "# HELP nginx_idempotency_outcomes_unknown_total Records that "
            "became unknown outcomes: the request may have run and no "
            "response was stored.\n"
            "# TYPE nginx_idempotency_outcomes_unknown_total counter\n"
            "nginx_idempotency_outcomes_unknown_total{cause=\"upstream\"} "
            "%uA\n"
            "nginx_idempotency_outcomes_unknown_total{cause=\"owner_lost\"} "
            "%uA\n"
            "nginx_idempotency_outcomes_unknown_total{cause=\"store_lost\"} "
            "%uA\n"
            "# HELP nginx_idempotency_suspected_fresh_key_retries_total "
            "Fresh keys that carried the same request (scope, method, URI, "
            "body) as another key within idempotency_fresh_key_detect.\n"
            "# TYPE nginx_idempotency_suspected_fresh_key_retries_total "
            "counter\n"
            "nginx_idempotency_suspected_fresh_key_retries_total %uA\n",
            sh->claims_lost, sh->unknown[0], sh->unknown[1],
            sh->unknown[2], sh->fresh_keys);

    p = ngx_http_idempotency_metrics_render_redis(p, end, mcf, imcf);

    return ngx_http_idempotency_metrics_render_latency(p, end, sh);
}


/* the series of each Redis address, with a cluster's masters */

static u_char *
ngx_http_idempotency_metrics_render_redis(u_char *p, u_char *end,
    ngx_http_idempotency_metrics_conf_t *mcf,
    ngx_http_idempotency_main_conf_t *imcf)
{
    ngx_uint_t                            i, j, k, n;
    ngx_http_idempotency_target_t        **rp;
    ngx_http_idempotency_metrics_shm_t   *sh;
    ngx_http_idempotency_metrics_slot_t  *s;

    static const char  *server_metrics[] = {
        "# HELP nginx_idempotency_redis_up Whether the last connection "
        "attempt to the Redis address succeeded (1) or failed (0).\n"
        "# TYPE nginx_idempotency_redis_up gauge\n",
        "# HELP nginx_idempotency_redis_reconnects_total Connections to the "
        "Redis address established again after one was lost.\n"
        "# TYPE nginx_idempotency_redis_reconnects_total counter\n",
        "# HELP nginx_idempotency_redis_claims_refused_total Keyed requests "
        "whose claim was not sent because the Redis target forbids "
        "scripting to the module's user and has no SET IFEQ; each was "
        "answered as idempotency_on_redis_error says.\n"
        "# TYPE nginx_idempotency_redis_claims_refused_total counter\n"
    };

    static const char  *server_names[] = {
        "nginx_idempotency_redis_up",
        "nginx_idempotency_redis_reconnects_total",
        "nginx_idempotency_redis_claims_refused_total"
    };

    sh = mcf->sh;
    rp = imcf->servers.elts;
    n = ngx_min(imcf->servers.nelts, NGX_HTTP_IDEMPOTENCY_METRICS_REDIS);

    for (k = 0; k < NGX_HTTP_IDEMPOTENCY_METRICS_SERVER_COUNTS; k++) {
        p = ngx_slprintf(p, end, "%s", server_metrics[k]);

        for (i = 0; i < n; i++) {
            s = mcf->server_slots[i];

            if (s == NULL) {
                continue;
            }

            /* one series per address, however many targets share it */

            for (j = 0; j < i; j++) {
                if (mcf->server_slots[j] == s) {
                    break;
                }
            }

            if (j < i) {
                continue;
            }

            p = ngx_slprintf(p, end, "%s{redis=\"", server_names[k]);
            p = ngx_http_idempotency_metrics_escape(p, end, &rp[i]->name);
            p = ngx_slprintf(p, end, "\"} %uA\n", s->count[k]);

            if (k == NGX_HTTP_IDEMPOTENCY_METRICS_UP
                && rp[i]->topology->nodes)
            {
                p = ngx_http_idempotency_metrics_masters(p, end, sh,
                                                         &rp[i]->name);
            }
        }
    }

    /* as this worker learnt it at its connections' handshakes */

    p = ngx_slprintf(p, end,
            "# HELP nginx_idempotency_redis_info The server of each Redis "
            "target, and how its claims are finished: native (SET IFEQ), "
            "script (Lua), or none (no key is claimed).\n"
            "# TYPE nginx_idempotency_redis_info gauge\n");

    for (i = 0; i < imcf->servers.nelts; i++) {
        p = ngx_slprintf(p, end, "nginx_idempotency_redis_info{redis=\"");
        p = ngx_http_idempotency_metrics_escape(p, end, &rp[i]->name);
        p = ngx_slprintf(p, end, "\",server=\"%*s\",cas=\"%s\"} 1\n",
                         rp[i]->server_len ? rp[i]->server_len
                                           : sizeof("unknown") - 1,
                         rp[i]->server_len ? rp[i]->server
                                           : (u_char *) "unknown",
                         ngx_http_idempotency_native_cas(rp[i]) ? "native"
                         : rp[i]->script_refused ? "none" : "script");
    }

    return p;
}


/* the claims' round trips: cumulative buckets, their sum and count */

static u_char *
ngx_http_idempotency_metrics_render_latency(u_char *p, u_char *end,
    ngx_http_idempotency_metrics_shm_t *sh)
{
    ngx_uint_t          i;
    ngx_atomic_uint_t   total, sum;

    p = ngx_slprintf(p, end,
            "# HELP nginx_idempotency_redis_latency_seconds Round trip of "
            "the claim to Redis.\n"
            "# TYPE nginx_idempotency_redis_latency_seconds histogram\n");

    total = 0;

    for (i = 0; i <= NGX_HTTP_IDEMPOTENCY_METRICS_BUCKETS; i++) {
        total += sh->latency[i];
        p = ngx_slprintf(p, end,
                "nginx_idempotency_redis_latency_seconds_bucket"
                "{le=\"%s\"} %uA\n",
                ngx_http_idempotency_metrics_le[i], total);
    }

    sum = sh->latency_usec;

    p = ngx_slprintf(p, end,
            "nginx_idempotency_redis_latency_seconds_sum %uA.%06uA\n"
            "nginx_idempotency_redis_latency_seconds_count %uA\n",
            sum / 1000000, sum % 1000000, total);

    return p;
}


/* label values: backslash, double quote and line feed are escaped */

static u_char *
ngx_http_idempotency_metrics_escape(u_char *p, u_char *end, ngx_str_t *value)
{
    u_char  *s;

    for (s = value->data; s < value->data + value->len; s++) {

        if (end - p < 2) {
            break;
        }

        if (*s == '\\' || *s == '"') {
            *p++ = '\\';
            *p++ = *s;

        } else if (*s == LF) {
            *p++ = '\\';
            *p++ = 'n';

        } else {
            *p++ = *s;
        }
    }

    return p;
}


/* after a cluster target's own redis_up: one series per master */

static u_char *
ngx_http_idempotency_metrics_masters(u_char *p, u_char *end,
    ngx_http_idempotency_metrics_shm_t *sh, ngx_str_t *target)
{
    uint32_t                                hash;
    ngx_str_t                               name;
    ngx_uint_t                              i;
    ngx_http_idempotency_metrics_master_t  *m;

    hash = ngx_crc32_short(target->data, target->len);

    for (i = 0; i < NGX_HTTP_IDEMPOTENCY_METRICS_MASTERS; i++) {
        m = &sh->masters[i];

        if (m->refs == 0 || m->target != hash
            || m->target_len != target->len
            || m->len > NGX_HTTP_IDEMPOTENCY_METRICS_MASTER_LEN)
        {
            continue;
        }

        name.data = m->name;
        name.len = m->len;

        p = ngx_slprintf(p, end, "nginx_idempotency_redis_up{redis=\"");
        p = ngx_http_idempotency_metrics_escape(p, end, target);
        p = ngx_slprintf(p, end, "\",node=\"");
        p = ngx_http_idempotency_metrics_escape(p, end, &name);
        p = ngx_slprintf(p, end, "\"} %uA\n", m->up);
    }

    return p;
}
