
/*
 * Copyright (C) The ngx_http_idempotency_module authors
 *
 * Prometheus metrics: the shared memory zone and its registry of slots,
 * and the directives.  Counters live in one shared memory zone with a
 * fixed layout (ngx_http_idempotency_http.h), so that every worker counts
 * into the same place and a reload (same zone name and size) keeps them.
 * The zone is a table of slots, one per metrics zone name and one per
 * Redis address, found by name again on every reload.  What is counted
 * into it is metrics_events.c's; the scrape that reads it is
 * metrics_render.c's.
 */


#include "ngx_http_idempotency_http.h"


/* slot kinds; 0 is a free slot */
#define NGX_HTTP_IDEMPOTENCY_METRICS_ZONE      1
#define NGX_HTTP_IDEMPOTENCY_METRICS_SERVER    2


static ngx_http_idempotency_metrics_conf_t *ngx_http_idempotency_metrics_conf(
    ngx_conf_t *cf);
static ngx_int_t ngx_http_idempotency_metrics_init_zone(
    ngx_shm_zone_t *shm_zone, void *data);
static ngx_http_idempotency_metrics_slot_t *
    ngx_http_idempotency_metrics_slot(ngx_http_idempotency_metrics_shm_t *sh,
    ngx_uint_t kind, ngx_str_t *name, u_char *busy, ngx_uint_t alloc);
static void ngx_http_idempotency_metrics_mark(
    ngx_http_idempotency_metrics_conf_t *mcf, u_char *busy);


static ngx_str_t  ngx_http_idempotency_metrics_zone_name =
    ngx_string("idempotency_metrics");


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


ngx_http_idempotency_metrics_conf_t *
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
ngx_http_idempotency_metrics_directive(ngx_conf_t *cf,
    ngx_command_t *cmd, void *conf)
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
ngx_http_idempotency_metrics_zone_directive(ngx_conf_t *cf, ngx_command_t *cmd,
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
    ngx_http_idempotency_target_t        **rp;
    ngx_http_idempotency_main_conf_t     *imcf;
    ngx_http_idempotency_metrics_conf_t  *mcf;

    /* what the client and the store tell of: metrics_events.c */

    ngx_http_idempotency_metrics_events_init();

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
    ngx_http_idempotency_target_t        **rp;
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
