
/*
 * Copyright (C) The ngx_http_idempotency_module authors
 *
 * "idempotency_redis HOST:PORT ... sentinel=NAME": the master's target,
 * whose address the Sentinels name at run time, and the second target
 * that holds the connection to a Sentinel (sentinel.c runs both).  The
 * same arguments in several places make one pair of targets.
 */


#include "ngx_http_idempotency_sentinel.h"


static ngx_int_t ngx_http_idempotency_sentinel_addrs(ngx_conf_t *cf,
    ngx_str_t *args, ngx_uint_t naddrs, ngx_array_t *addrs,
    ngx_array_t *hosts);
static ngx_int_t ngx_http_idempotency_sentinel_host(ngx_pool_t *pool,
    ngx_str_t *addr, ngx_str_t *host);


/*
 * "idempotency_redis HOST:PORT ... sentinel=NAME [sentinel_user=U]
 * [sentinel_password=P] [user= password= db= tls]": args are the
 * directive's arguments, the first naddrs of them the Sentinels; db,
 * user, password and tls, parsed by target_conf.c, are the master's
 */

ngx_http_idempotency_target_t *
ngx_http_idempotency_sentinel_conf(ngx_conf_t *cf, ngx_str_t *args,
    ngx_uint_t naddrs, ngx_uint_t nargs, ngx_uint_t db, ngx_str_t *user,
    ngx_str_t *password, ngx_uint_t tls, ngx_array_t *servers)
{
    u_char                             *p;
    size_t                              len;
    ngx_str_t                           master, suser, spassword;
    ngx_uint_t                          i;
    ngx_array_t                         addrs, hosts;
    ngx_http_idempotency_target_t      *redis, *sentinels, **rp;
    ngx_http_idempotency_sentinel_t    *s;

    ngx_str_null(&master);
    ngx_str_null(&suser);
    ngx_str_null(&spassword);

    len = 0;

    for (i = 0; i < nargs; i++) {
        len += args[i].len + 1;

        if (ngx_strncmp(args[i].data, "sentinel=", 9) == 0) {
            master.data = args[i].data + 9;
            master.len = args[i].len - 9;

        } else if (ngx_strncmp(args[i].data, "sentinel_user=", 14) == 0) {
            suser.data = args[i].data + 14;
            suser.len = args[i].len - 14;

        } else if (ngx_strncmp(args[i].data, "sentinel_password=", 18) == 0)
        {
            spassword.data = args[i].data + 18;
            spassword.len = args[i].len - 18;
        }
    }

    if (master.len == 0) {
        ngx_conf_log_error(NGX_LOG_EMERG, cf, 0,
                           naddrs > 1 ? "several addresses need "
                                        "\"sentinel=NAME\""
                                      : "\"sentinel=\" needs a master name");
        return NULL;
    }

    if (suser.len && spassword.len == 0) {
        ngx_conf_log_error(NGX_LOG_EMERG, cf, 0,
                           "\"sentinel_user=\" requires "
                           "\"sentinel_password=\"");
        return NULL;
    }

    /* the same arguments in several places share one target */

    p = ngx_pnalloc(cf->pool, len);
    if (p == NULL) {
        return NULL;
    }

    s = ngx_pcalloc(cf->pool, sizeof(ngx_http_idempotency_sentinel_t));
    if (s == NULL) {
        return NULL;
    }

    s->args.data = p;

    for (i = 0; i < nargs; i++) {
        p = ngx_cpymem(p, args[i].data, args[i].len);
        *p++ = ' ';
    }

    s->args.len = len;

    rp = servers->elts;
    for (i = 0; i < servers->nelts; i++) {
        if (rp[i]->sentinel
            && rp[i]->sentinel->redis == rp[i]
            && rp[i]->sentinel->args.len == s->args.len
            && ngx_strncmp(rp[i]->sentinel->args.data, s->args.data,
                           s->args.len) == 0)
        {
            return rp[i];
        }
    }

    if (ngx_http_idempotency_sentinel_addrs(cf, args, naddrs, &addrs, &hosts)
        != NGX_OK)
    {
        return NULL;
    }

    redis = ngx_pcalloc(cf->pool, sizeof(ngx_http_idempotency_target_t));
    sentinels = ngx_pcalloc(cf->pool, sizeof(ngx_http_idempotency_target_t));
    if (redis == NULL || sentinels == NULL) {
        return NULL;
    }

    /* the master: found at run time, so no address of its own */

    redis->name = master;
    redis->db = db;
    redis->user = *user;
    redis->password = *password;
    redis->tls = tls;
    redis->sentinel = s;
    redis->topology = &ngx_http_idempotency_sentinel_topology;

    /* the Sentinels: tried in turn by conn.c; TLS as the master's */

    sentinels->name.len = sizeof("sentinel ") - 1 + master.len;
    sentinels->name.data = ngx_pnalloc(cf->pool, sentinels->name.len);
    if (sentinels->name.data == NULL) {
        return NULL;
    }

    ngx_sprintf(sentinels->name.data, "sentinel %V", &master);

    sentinels->addrs = addrs.elts;
    sentinels->naddrs = addrs.nelts;
    sentinels->user = suser;
    sentinels->password = spassword;
    sentinels->sentinel = s;
    sentinels->topology = &ngx_http_idempotency_sentinels_topology;

    s->redis = redis;
    s->sentinels = sentinels;
    s->master = master;
    s->hosts = hosts.elts;

    rp = ngx_array_push(servers);
    if (rp == NULL) {
        return NULL;
    }

    *rp = redis;

    return redis;
}


/* the Sentinels' addresses, and the host of each as written */

static ngx_int_t
ngx_http_idempotency_sentinel_addrs(ngx_conf_t *cf, ngx_str_t *args,
    ngx_uint_t naddrs, ngx_array_t *addrs, ngx_array_t *hosts)
{
    ngx_str_t   *host;
    ngx_uint_t   i;

    if (ngx_array_init(addrs, cf->pool, naddrs, sizeof(ngx_addr_t))
        != NGX_OK)
    {
        return NGX_ERROR;
    }

    if (ngx_array_init(hosts, cf->pool, naddrs, sizeof(ngx_str_t))
        != NGX_OK)
    {
        return NGX_ERROR;
    }

    for (i = 0; i < naddrs; i++) {
        if (ngx_http_idempotency_conf_addrs(cf, &args[i],
                                            NGX_HTTP_IDEMPOTENCY_SENTINEL_PORT,
                                            "sentinel", addrs)
            != NGX_OK)
        {
            return NGX_ERROR;
        }

        /* the name TLS verifies by default: the host as written */

        while (hosts->nelts < addrs->nelts) {
            host = ngx_array_push(hosts);
            if (host == NULL
                || ngx_http_idempotency_sentinel_host(cf->pool, &args[i],
                                                      host)
                   != NGX_OK)
            {
                return NGX_ERROR;
            }
        }
    }

    return NGX_OK;
}


/* "host:port", "[v6]:port" or "host": the host, NUL-terminated */

static ngx_int_t
ngx_http_idempotency_sentinel_host(ngx_pool_t *pool, ngx_str_t *addr,
    ngx_str_t *host)
{
    u_char  *p, *last;

    p = addr->data;
    last = addr->data + addr->len;

    if (p < last && *p == '[') {
        p++;
        last = ngx_strlchr(p, last, ']');

        if (last == NULL) {
            return NGX_ERROR;
        }

    } else {
        while (last > p && *(last - 1) != ':') {
            last--;
        }

        last = (last > p) ? last - 1 : addr->data + addr->len;
    }

    host->len = last - p;
    host->data = ngx_pnalloc(pool, host->len + 1);
    if (host->data == NULL) {
        return NGX_ERROR;
    }

    *ngx_cpymem(host->data, p, host->len) = '\0';

    return NGX_OK;
}
