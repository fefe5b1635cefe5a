
/*
 * Copyright (C) The ngx_http_idempotency_module authors
 *
 * Prometheus metrics.  Counters live in one shared memory zone with a fixed
 * layout, so that every worker counts into the same place and a reload
 * (same zone name and size) keeps them.  The zone is a table of slots, one
 * per metrics zone name and one per Redis address, found by name again on
 * every reload.
 */


#include "ngx_http_idempotency_http.h"
#include "ngx_http_idempotency_version.h"


/* names per configuration (and zone=""); the table holds an old and a new */
#define NGX_HTTP_IDEMPOTENCY_METRICS_ZONES     64
#define NGX_HTTP_IDEMPOTENCY_METRICS_REDIS     64
#define NGX_HTTP_IDEMPOTENCY_METRICS_SLOTS                                    \
    (2 * (NGX_HTTP_IDEMPOTENCY_METRICS_ZONES + 1                              \
          + NGX_HTTP_IDEMPOTENCY_METRICS_REDIS))
#define NGX_HTTP_IDEMPOTENCY_METRICS_NAME_MAX  64

/* cluster masters with a series of their own, for all targets together */
#define NGX_HTTP_IDEMPOTENCY_METRICS_MASTERS   64
#define NGX_HTTP_IDEMPOTENCY_METRICS_MASTER_LEN                               \
    (NGX_SOCKADDR_STRLEN + NGX_HTTP_IDEMPOTENCY_METRICS_NAME_MAX)

/* the values of $idempotency_status, bypass to unknown */
#define NGX_HTTP_IDEMPOTENCY_METRICS_STATUSES  9
#define NGX_HTTP_IDEMPOTENCY_METRICS_RESULTS   4
#define NGX_HTTP_IDEMPOTENCY_METRICS_COUNTS                                   \
    (NGX_HTTP_IDEMPOTENCY_METRICS_STATUSES                                    \
     + NGX_HTTP_IDEMPOTENCY_METRICS_RESULTS)
#define NGX_HTTP_IDEMPOTENCY_METRICS_BUCKETS   11
#define NGX_HTTP_IDEMPOTENCY_METRICS_LE                                       \
    (NGX_HTTP_IDEMPOTENCY_METRICS_BUCKETS + 1)

/* slot kinds; 0 is a free slot */
#define NGX_HTTP_IDEMPOTENCY_METRICS_ZONE      1
#define NGX_HTTP_IDEMPOTENCY_METRICS_SERVER    2

/* counters of a server slot */
#define NGX_HTTP_IDEMPOTENCY_METRICS_UP        0
#define NGX_HTTP_IDEMPOTENCY_METRICS_RECONNECTS  1
#define NGX_HTTP_IDEMPOTENCY_METRICS_REFUSED   2
#define NGX_HTTP_IDEMPOTENCY_METRICS_SERVER_COUNTS  3

#define NGX_HTTP_IDEMPOTENCY_STORE_STORED      0
#define NGX_HTTP_IDEMPOTENCY_STORE_TOO_LARGE   1
#define NGX_HTTP_IDEMPOTENCY_STORE_RELEASED    2
#define NGX_HTTP_IDEMPOTENCY_STORE_FAILED      3


typedef struct {
    uint32_t             kind;
    uint32_t             hash;       /* crc32 of the name */
    size_t               len;
    /* zone: requests by status, then stores by result; server: up, ... */
    ngx_atomic_t         count[NGX_HTTP_IDEMPOTENCY_METRICS_COUNTS];
} ngx_http_idempotency_metrics_slot_t;


/*
 * A cluster master in some worker's slot map: refs counts the workers that
 * have it there (a reload's old and new workers alike), and a free entry
 * has none; up is the last connection event of any worker.
 */
typedef struct {
    ngx_atomic_t         refs;
    ngx_atomic_t         up;
    uint32_t             target;     /* crc32 of the target's name */
    uint32_t             target_len;
    size_t               len;
    u_char               name[NGX_HTTP_IDEMPOTENCY_METRICS_MASTER_LEN];
} ngx_http_idempotency_metrics_master_t;


typedef struct {
    ngx_atomic_t         claims_lost;
    /* records that became unknown outcomes, by cause (1 to 3) */
    ngx_atomic_t         unknown[NGX_HTTP_IDEMPOTENCY_CAUSES];
    ngx_atomic_t         fresh_keys;
    /* claim round trips per bucket (not cumulative), the last above 1s */
    ngx_atomic_t         latency[NGX_HTTP_IDEMPOTENCY_METRICS_LE];
    ngx_atomic_t         latency_usec;
    ngx_http_idempotency_metrics_slot_t
                         slots[NGX_HTTP_IDEMPOTENCY_METRICS_SLOTS];

    /* taken by workers at run time: under the lock */
    ngx_atomic_t         masters_lock;
    ngx_http_idempotency_metrics_master_t
                         masters[NGX_HTTP_IDEMPOTENCY_METRICS_MASTERS];
} ngx_http_idempotency_metrics_shm_t;


typedef struct {
    ngx_http_idempotency_metrics_shm_t   *sh;
    ngx_http_idempotency_main_conf_t     *imcf;
    ngx_array_t                           zones;     /* ngx_str_t, by id */
    ngx_http_idempotency_metrics_slot_t **zone_slots;    /* by zone id */
    ngx_http_idempotency_metrics_slot_t **server_slots;  /* by server */
    u_char                               *server_seen;   /* per worker */
} ngx_http_idempotency_metrics_conf_t;


static ngx_http_idempotency_metrics_conf_t *ngx_http_idempotency_metrics_conf(
    ngx_conf_t *cf);
static ngx_http_idempotency_metrics_conf_t *
    ngx_http_idempotency_metrics_get_conf(void);
static ngx_int_t ngx_http_idempotency_metrics_init_zone(
    ngx_shm_zone_t *shm_zone, void *data);
static ngx_http_idempotency_metrics_slot_t *
    ngx_http_idempotency_metrics_slot(ngx_http_idempotency_metrics_shm_t *sh,
    ngx_uint_t kind, ngx_str_t *name, u_char *busy, ngx_uint_t alloc);
static void ngx_http_idempotency_metrics_mark(
    ngx_http_idempotency_metrics_conf_t *mcf, u_char *busy);
static ngx_int_t ngx_http_idempotency_metrics_log(ngx_http_request_t *r);
static ngx_int_t ngx_http_idempotency_metrics_handler(ngx_http_request_t *r);
static size_t ngx_http_idempotency_metrics_size(
    ngx_http_idempotency_metrics_conf_t *mcf,
    ngx_http_idempotency_main_conf_t *imcf);
static u_char *ngx_http_idempotency_metrics_render(u_char *p, u_char *end,
    ngx_http_idempotency_metrics_conf_t *mcf,
    ngx_http_idempotency_main_conf_t *imcf);
static u_char *ngx_http_idempotency_metrics_escape(u_char *p, u_char *end,
    ngx_str_t *value);
static ngx_http_idempotency_metrics_slot_t *
    ngx_http_idempotency_metrics_server(ngx_http_idempotency_redis_t *redis,
    u_char **seen);
static void ngx_http_idempotency_metrics_store(ngx_uint_t zone,
    ngx_uint_t result);
static uint64_t ngx_http_idempotency_metrics_usec(void);
static u_char *ngx_http_idempotency_metrics_masters(u_char *p, u_char *end,
    ngx_http_idempotency_metrics_shm_t *sh, ngx_str_t *target);
static void ngx_http_idempotency_metrics_redis_up(
    ngx_http_idempotency_redis_t *redis);
static void ngx_http_idempotency_metrics_redis_down(
    ngx_http_idempotency_redis_t *redis);
static void *ngx_http_idempotency_metrics_master_add(
    ngx_http_idempotency_redis_t *redis, ngx_str_t *name);
static void ngx_http_idempotency_metrics_master_del(void *entry);
static void ngx_http_idempotency_metrics_master_up(void *entry, ngx_uint_t up);
static void ngx_http_idempotency_metrics_store_sent(
    ngx_http_idempotency_key_op_t *kop, u_char *value);
static void ngx_http_idempotency_metrics_store_done(
    ngx_http_idempotency_key_op_t *kop, redisReply *reply);
static void ngx_http_idempotency_metrics_store_failed(void);
static void ngx_http_idempotency_metrics_claim_refused(
    ngx_http_idempotency_redis_t *redis);


static ngx_str_t  ngx_http_idempotency_metrics_zone_name =
    ngx_string("idempotency_metrics");


static ngx_str_t  ngx_http_idempotency_metrics_results[] = {
    ngx_string("stored"),
    ngx_string("too_large"),
    ngx_string("released"),
    ngx_string("failed")
};


/* bucket bounds in microseconds, and as "le" labels */

static ngx_uint_t  ngx_http_idempotency_metrics_bounds[] = {
    500, 1000, 2500, 5000, 10000, 25000, 50000, 100000, 250000, 500000,
    1000000
};


static char  *ngx_http_idempotency_metrics_le[] = {
    "0.0005", "0.001", "0.0025", "0.005", "0.01", "0.025", "0.05", "0.1",
    "0.25", "0.5", "1", "+Inf"
};


/* the zone the next finish_key() call is counted in (see finish()) */
static ngx_uint_t  ngx_http_idempotency_metrics_next_zone;


static ngx_http_idempotency_metrics_conf_t *
ngx_http_idempotency_metrics_conf(ngx_conf_t *cf)
{
    ngx_str_t                            *name;
    ngx_http_idempotency_main_conf_t     *imcf;
    ngx_http_idempotency_metrics_conf_t  *mcf;

    imcf = ngx_http_conf_get_module_main_conf(cf, ngx_http_idempotency_module);

    if (imcf->metrics) {
        return imcf->metrics;
    }

    mcf = ngx_pcalloc(cf->pool, sizeof(ngx_http_idempotency_metrics_conf_t));
    if (mcf == NULL) {
        return NULL;
    }

    if (ngx_array_init(&mcf->zones, cf->pool, 4, sizeof(ngx_str_t))
        != NGX_OK)
    {
        return NULL;
    }

    /* zone id 0: zone="" */

    name = ngx_array_push(&mcf->zones);
    if (name == NULL) {
        return NULL;
    }

    ngx_str_null(name);

    imcf->metrics = mcf;

    return mcf;
}


static ngx_http_idempotency_metrics_conf_t *
ngx_http_idempotency_metrics_get_conf(void)
{
    ngx_http_idempotency_main_conf_t     *imcf;
    ngx_http_idempotency_metrics_conf_t  *mcf;

    imcf = ngx_http_cycle_get_module_main_conf(ngx_cycle,
                                               ngx_http_idempotency_module);
    if (imcf == NULL) {
        return NULL;
    }

    mcf = imcf->metrics;

    if (mcf == NULL || mcf->sh == NULL) {
        return NULL;
    }

    return mcf;
}


char *
ngx_http_idempotency_metrics(ngx_conf_t *cf, ngx_command_t *cmd, void *conf)
{
    ngx_http_idempotency_loc_conf_t *ilcf = conf;

    ngx_http_core_loc_conf_t             *clcf;
    ngx_http_idempotency_metrics_conf_t  *mcf;

    mcf = ngx_http_idempotency_metrics_conf(cf);
    if (mcf == NULL) {
        return NGX_CONF_ERROR;
    }

    clcf = ngx_http_conf_get_module_loc_conf(cf, ngx_http_core_module);
    clcf->handler = ngx_http_idempotency_metrics_handler;

    /* scrapes are not protected requests, even under "idempotency on" */

    if (ilcf->enable == NGX_CONF_UNSET) {
        ilcf->enable = 0;
    }

    return NGX_CONF_OK;
}


char *
ngx_http_idempotency_metrics_zone(ngx_conf_t *cf, ngx_command_t *cmd,
    void *conf)
{
    ngx_http_idempotency_loc_conf_t *ilcf = conf;

    u_char                               *p;
    ngx_str_t                            *value, *name;
    ngx_uint_t                            i;
    ngx_http_idempotency_metrics_conf_t  *mcf;

    if (ilcf->metrics_zone != NGX_CONF_UNSET_UINT) {
        return "is duplicate";
    }

    value = cf->args->elts;

    if (value[1].len == 0
        || value[1].len > NGX_HTTP_IDEMPOTENCY_METRICS_NAME_MAX)
    {
        goto invalid;
    }

    /* a label value that needs no escaping and reads well in a dashboard */

    for (p = value[1].data; p < value[1].data + value[1].len; p++) {
        if (!((*p >= 'a' && *p <= 'z') || (*p >= 'A' && *p <= 'Z')
              || (*p >= '0' && *p <= '9')
              || *p == '_' || *p == '-' || *p == '.' || *p == ':'))
        {
            goto invalid;
        }
    }

    mcf = ngx_http_idempotency_metrics_conf(cf);
    if (mcf == NULL) {
        return NGX_CONF_ERROR;
    }

    name = mcf->zones.elts;

    for (i = 1; i < mcf->zones.nelts; i++) {
        if (name[i].len == value[1].len
            && ngx_strncmp(name[i].data, value[1].data, value[1].len) == 0)
        {
            ilcf->metrics_zone = i;
            return NGX_CONF_OK;
        }
    }

    if (mcf->zones.nelts > NGX_HTTP_IDEMPOTENCY_METRICS_ZONES) {
        ngx_conf_log_error(NGX_LOG_EMERG, cf, 0,
                           "too many idempotency_metrics_zone names, "
                           "at most %d", NGX_HTTP_IDEMPOTENCY_METRICS_ZONES);
        return NGX_CONF_ERROR;
    }

    name = ngx_array_push(&mcf->zones);
    if (name == NULL) {
        return NGX_CONF_ERROR;
    }

    *name = value[1];
    ilcf->metrics_zone = mcf->zones.nelts - 1;

    return NGX_CONF_OK;

invalid:

    ngx_conf_log_error(NGX_LOG_EMERG, cf, 0,
                       "invalid metrics zone name \"%V\": expected 1 to %d "
                       "letters, digits, \"_\", \"-\", \".\" or \":\"",
                       &value[1], NGX_HTTP_IDEMPOTENCY_METRICS_NAME_MAX);

    return NGX_CONF_ERROR;
}


/*
 * Postconfiguration: the shared zone and the log phase handler, when a
 * location protects requests or serves the metrics.
 */

ngx_int_t
ngx_http_idempotency_metrics_init(ngx_conf_t *cf)
{
    size_t                                size;
    ngx_str_t                            *name;
    ngx_uint_t                            i, n, used;
    ngx_shm_zone_t                       *shm_zone;
    ngx_http_handler_pt                  *h;
    ngx_http_core_main_conf_t            *cmcf;
    ngx_http_idempotency_redis_t        **rp;
    ngx_http_idempotency_main_conf_t     *imcf;
    ngx_http_idempotency_metrics_conf_t  *mcf;

    /* what the client and the store tell of, counted here */

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
    ngx_http_idempotency_store_events.sent =
                                        ngx_http_idempotency_metrics_store_sent;
    ngx_http_idempotency_store_events.done =
                                        ngx_http_idempotency_metrics_store_done;
    ngx_http_idempotency_store_events.failed =
                                      ngx_http_idempotency_metrics_store_failed;
    ngx_http_idempotency_store_events.unknown =
                                          ngx_http_idempotency_metrics_unknown;
    ngx_http_idempotency_store_events.claim_refused =
                                   ngx_http_idempotency_metrics_claim_refused;

    imcf = ngx_http_conf_get_module_main_conf(cf, ngx_http_idempotency_module);

    used = 0;
    rp = imcf->servers.elts;

    for (i = 0; i < imcf->servers.nelts; i++) {
        used |= rp[i]->used;
    }

    if (!used && imcf->metrics == NULL) {
        return NGX_OK;
    }

    mcf = ngx_http_idempotency_metrics_conf(cf);
    if (mcf == NULL) {
        return NGX_ERROR;
    }

    /* a size that never depends on the configuration: reloads reuse it */

    size = 8 * ngx_pagesize
           + ngx_align(sizeof(ngx_http_idempotency_metrics_shm_t),
                       ngx_pagesize);

    name = &ngx_http_idempotency_metrics_zone_name;

    shm_zone = ngx_shared_memory_add(cf, name, size,
                                     &ngx_http_idempotency_module);
    if (shm_zone == NULL) {
        return NGX_ERROR;
    }

    if (shm_zone->data) {
        ngx_conf_log_error(NGX_LOG_EMERG, cf, 0,
                           "shared memory zone \"%V\" is already in use",
                           name);
        return NGX_ERROR;
    }

    shm_zone->init = ngx_http_idempotency_metrics_init_zone;
    shm_zone->data = mcf;
    mcf->imcf = imcf;

    n = imcf->servers.nelts + 1;

    mcf->zone_slots = ngx_pcalloc(cf->pool, mcf->zones.nelts * sizeof(void *));
    mcf->server_slots = ngx_pcalloc(cf->pool, n * sizeof(void *));
    mcf->server_seen = ngx_pcalloc(cf->pool, n);

    if (mcf->zone_slots == NULL || mcf->server_slots == NULL
        || mcf->server_seen == NULL)
    {
        return NGX_ERROR;
    }

    cmcf = ngx_http_conf_get_module_main_conf(cf, ngx_http_core_module);

    h = ngx_array_push(&cmcf->phases[NGX_HTTP_LOG_PHASE].handlers);
    if (h == NULL) {
        return NGX_ERROR;
    }

    *h = ngx_http_idempotency_metrics_log;

    return NGX_OK;
}


/*
 * In the master, for every cycle.  On a reload "data" is the previous
 * cycle's conf, whose workers still count into its slots: those slots are
 * never recycled, and a name the new configuration still uses finds its
 * old slot, with its counts.
 */

static ngx_int_t
ngx_http_idempotency_metrics_init_zone(ngx_shm_zone_t *shm_zone, void *data)
{
    ngx_http_idempotency_metrics_conf_t  *omcf = data;

    ngx_str_t                            *name;
    ngx_uint_t                            i, n, alloc;
    ngx_slab_pool_t                      *shpool;
    ngx_http_idempotency_redis_t        **rp;
    ngx_http_idempotency_metrics_conf_t  *mcf;
    u_char                    busy[NGX_HTTP_IDEMPOTENCY_METRICS_SLOTS];

    mcf = shm_zone->data;
    shpool = (ngx_slab_pool_t *) shm_zone->shm.addr;

    ngx_memzero(busy, sizeof(busy));

    if (omcf) {
        mcf->sh = omcf->sh;
        ngx_http_idempotency_metrics_mark(omcf, busy);

    } else if (shm_zone->shm.exists) {
        mcf->sh = shpool->data;

    } else {
        mcf->sh = ngx_slab_calloc(shpool,
                                  sizeof(ngx_http_idempotency_metrics_shm_t));
        if (mcf->sh == NULL) {
            return NGX_ERROR;
        }

        shpool->data = mcf->sh;
    }

    name = mcf->zones.elts;
    rp = mcf->imcf->servers.elts;
    n = ngx_min(mcf->imcf->servers.nelts, NGX_HTTP_IDEMPOTENCY_METRICS_REDIS);

    /* known names first, so that a new name never takes a known one's slot */

    for (alloc = 0; alloc < 2; alloc++) {

        for (i = 0; i < mcf->zones.nelts; i++) {
            if (mcf->zone_slots[i] == NULL) {
                mcf->zone_slots[i] = ngx_http_idempotency_metrics_slot(mcf->sh,
                                         NGX_HTTP_IDEMPOTENCY_METRICS_ZONE,
                                         &name[i], busy, alloc);
            }
        }

        for (i = 0; i < n; i++) {
            if (rp[i]->used && mcf->server_slots[i] == NULL) {
                mcf->server_slots[i] = ngx_http_idempotency_metrics_slot(
                                           mcf->sh,
                                           NGX_HTTP_IDEMPOTENCY_METRICS_SERVER,
                                           &rp[i]->name, busy, alloc);
            }
        }
    }

    for (i = 0; i < mcf->zones.nelts; i++) {
        if (mcf->zone_slots[i] == NULL) {
            ngx_log_error(NGX_LOG_EMERG, shm_zone->shm.log, 0,
                          "idempotency: no room left in shared memory zone "
                          "\"%V\"", &shm_zone->shm.name);
            return NGX_ERROR;
        }
    }

    return NGX_OK;
}


static ngx_http_idempotency_metrics_slot_t *
ngx_http_idempotency_metrics_slot(ngx_http_idempotency_metrics_shm_t *sh,
    ngx_uint_t kind, ngx_str_t *name, u_char *busy, ngx_uint_t alloc)
{
    uint32_t                              hash;
    ngx_uint_t                            i;
    ngx_http_idempotency_metrics_slot_t  *s, *free, *spare;

    hash = ngx_crc32_short(name->data, name->len);
    free = NULL;
    spare = NULL;

    for (i = 0; i < NGX_HTTP_IDEMPOTENCY_METRICS_SLOTS; i++) {
        s = &sh->slots[i];

        if (s->kind == kind && s->hash == hash && s->len == name->len) {
            busy[i] = 1;
            return s;
        }

        if (s->kind == 0) {
            if (free == NULL) {
                free = s;
            }

        } else if (!busy[i] && spare == NULL) {
            spare = s;
        }
    }

    if (!alloc) {
        return NULL;
    }

    /* a name neither the old nor the new configuration uses gives way */

    s = free ? free : spare;

    if (s == NULL) {
        return NULL;
    }

    ngx_memzero(s, sizeof(ngx_http_idempotency_metrics_slot_t));

    s->kind = kind;
    s->hash = hash;
    s->len = name->len;

    busy[s - sh->slots] = 1;

    return s;
}


static void
ngx_http_idempotency_metrics_mark(ngx_http_idempotency_metrics_conf_t *mcf,
    u_char *busy)
{
    ngx_uint_t                            i;
    ngx_http_idempotency_metrics_slot_t  *s;

    for (i = 0; i < mcf->zones.nelts; i++) {
        s = mcf->zone_slots[i];

        if (s) {
            busy[s - mcf->sh->slots] = 1;
        }
    }

    for (i = 0; i < mcf->imcf->servers.nelts; i++) {
        s = mcf->server_slots[i];

        if (s) {
            busy[s - mcf->sh->slots] = 1;
        }
    }
}


/* once per main request, with the status it ended with */

static ngx_int_t
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


static ngx_int_t
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
    ngx_http_idempotency_redis_t   **rp;

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
    ngx_uint_t                            i, j, k, n;
    ngx_atomic_uint_t                     total, sum;
    ngx_http_idempotency_redis_t        **rp;
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


/* the hooks the rest of the module calls */

void
ngx_http_idempotency_metrics_claim_sent(
    ngx_http_idempotency_key_op_t *kop, ngx_http_idempotency_ctx_t *ctx)
{
    kop->sent = ngx_http_idempotency_metrics_usec();
    kop->zone = ctx->conf->metrics_zone;
}


void
ngx_http_idempotency_metrics_claim_done(
    ngx_http_idempotency_key_op_t *kop, redisReply *reply)
{
    uint64_t                              usec;
    ngx_uint_t                            i;
    ngx_http_idempotency_metrics_conf_t  *mcf;

    mcf = ngx_http_idempotency_metrics_get_conf();

    if (mcf == NULL || reply == NULL) {
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
ngx_http_idempotency_metrics_attribute(ngx_uint_t zone)
{
    ngx_http_idempotency_metrics_next_zone = zone;
}


static void
ngx_http_idempotency_metrics_store_sent(
    ngx_http_idempotency_key_op_t *kop, u_char *value)
{
    kop->zone = ngx_http_idempotency_metrics_next_zone;
    kop->too_large = (value && value[4] == NGX_HTTP_IDEMPOTENCY_REC_TOO_LARGE);

    /* an unknown outcome: a claim-shaped record, its cause in the token */
    kop->cause = (value && value[4] == NGX_HTTP_IDEMPOTENCY_REC_CLAIM)
                 ? value[NGX_HTTP_IDEMPOTENCY_OWNER_LEN + 2] : 0;
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


void
ngx_http_idempotency_metrics_unknown(ngx_uint_t cause)
{
    ngx_http_idempotency_metrics_conf_t  *mcf;

    mcf = ngx_http_idempotency_metrics_get_conf();

    if (mcf && cause >= 1 && cause <= NGX_HTTP_IDEMPOTENCY_CAUSES) {
        (void) ngx_atomic_fetch_add(&mcf->sh->unknown[cause - 1], 1);
    }
}


static void
ngx_http_idempotency_metrics_store_failed(void)
{
    ngx_http_idempotency_metrics_store(ngx_http_idempotency_metrics_next_zone,
                                       NGX_HTTP_IDEMPOTENCY_STORE_FAILED);
}


/* the script answers 1 when it acted, 0 when the claim was not ours */

static void
ngx_http_idempotency_metrics_store_done(
    ngx_http_idempotency_key_op_t *kop, redisReply *reply)
{
    ngx_uint_t                            result;
    ngx_http_idempotency_metrics_conf_t  *mcf;

    if (reply == NULL || reply->type == REDIS_REPLY_ERROR) {
        result = NGX_HTTP_IDEMPOTENCY_STORE_FAILED;

    } else if (reply->type == REDIS_REPLY_INTEGER && reply->integer == 0) {
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
ngx_http_idempotency_metrics_redis_up(ngx_http_idempotency_redis_t *redis)
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
ngx_http_idempotency_metrics_claim_refused(ngx_http_idempotency_redis_t *redis)
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
ngx_http_idempotency_metrics_redis_down(ngx_http_idempotency_redis_t *redis)
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
ngx_http_idempotency_metrics_server(ngx_http_idempotency_redis_t *redis,
    u_char **seen)
{
    ngx_uint_t                            i, n;
    ngx_http_idempotency_redis_t        **rp;
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
 * cluster.c: a master entered a worker's slot map (its entry, or NULL
 * when the table is full), and left it; the label is "host:port" as the
 * map names it.  A crashed worker's entries stay until the next restart.
 */

static void *
ngx_http_idempotency_metrics_master_add(ngx_http_idempotency_redis_t *redis,
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
