
/*
 * Copyright (C) The ngx_http_idempotency_module authors
 *
 * The grammar of a Redis target, "idempotency_redis ADDRESS... [db=N]
 * [user=NAME password=PASSWORD] [tls] [cluster | sentinel=NAME ...]":
 * which topology its parameters name, and the target they make.  Targets
 * with the same address and credentials are one, with one connection per
 * worker.  The client owns this, so the module's directive only hands it
 * the arguments and the list of targets, and never learns which topology
 * a target is.
 */


#include "ngx_http_idempotency_redis.h"


typedef struct {
    ngx_uint_t                       naddrs;     /* before the parameters */
    ngx_uint_t                       db;
    ngx_str_t                        user;
    ngx_str_t                        password;
    unsigned                         tls:1;
    unsigned                         cluster:1;
    unsigned                         sentinel:1;
} ngx_http_idempotency_target_args_t;


static ngx_int_t ngx_http_idempotency_target_args(ngx_conf_t *cf,
    ngx_uint_t can_tls, ngx_http_idempotency_target_args_t *ta);


/* what an unknown parameter of idempotency_redis is told */
#define NGX_HTTP_IDEMPOTENCY_REDIS_PARAMS                                     \
    "the parameters are db=N, user=NAME, password=PASSWORD, tls, cluster, "   \
    "sentinel=NAME, sentinel_user=NAME and sentinel_password=PASSWORD"


/*
 * The target the directive's arguments (cf->args) name, added to servers
 * or found there; NULL after an error said at its line.  can_tls: nginx
 * was built with TLS for http.
 */

ngx_http_idempotency_target_t *
ngx_http_idempotency_target_conf(ngx_conf_t *cf, ngx_array_t *servers,
    ngx_uint_t can_tls)
{
    ngx_str_t                           *value;
    ngx_uint_t                           nservers;
    ngx_http_idempotency_target_t       *redis;
    ngx_http_idempotency_target_args_t   ta;

    if (ngx_http_idempotency_target_args(cf, can_tls, &ta) != NGX_OK) {
        return NULL;
    }

    value = cf->args->elts;

    if (ta.cluster && ta.sentinel) {
        ngx_conf_log_error(NGX_LOG_EMERG, cf, 0,
                           "\"cluster\" and \"sentinel=\" cannot be used "
                           "together");
        return NULL;
    }

    if (ta.naddrs > 1 && !ta.cluster && !ta.sentinel) {
        ngx_conf_log_error(NGX_LOG_EMERG, cf, 0,
                           "several redis addresses require \"cluster\" "
                           "(seeds) or \"sentinel=NAME\" (Sentinels), and "
                           "\"%V\" is read as an address: %s", &value[2],
                           NGX_HTTP_IDEMPOTENCY_REDIS_PARAMS);
        return NULL;
    }

    if (ta.cluster && ta.db) {
        ngx_conf_log_error(NGX_LOG_EMERG, cf, 0,
                           "\"db=\" cannot be used with \"cluster\": "
                           "a cluster has only db 0");
        return NULL;
    }

    if (ta.user.len && ta.password.len == 0) {
        ngx_conf_log_error(NGX_LOG_EMERG, cf, 0,
                           "\"user=\" requires \"password=\"");
        return NULL;
    }

    if (ta.sentinel) {
        return ngx_http_idempotency_sentinel_conf(cf, &value[1], ta.naddrs,
                                                  cf->args->nelts - 1, ta.db,
                                                  &ta.user, &ta.password,
                                                  ta.tls, servers);
    }

    nservers = servers->nelts;

    redis = ngx_http_idempotency_target_add(cf, servers, &value[1], ta.db,
                                            &ta.user, &ta.password, ta.tls);
    if (redis == NULL) {
        return NULL;
    }

    if ((redis->topology == &ngx_http_idempotency_cluster_topology)
        != ta.cluster)
    {
        if (servers->nelts == nservers) {
            ngx_conf_log_error(NGX_LOG_EMERG, cf, 0,
                               "redis \"%V\" is used both with and without "
                               "\"cluster\"", &value[1]);
            return NULL;
        }

        if (ngx_http_idempotency_cluster_conf(cf, redis, &value[1], ta.naddrs)
            != NGX_OK)
        {
            return NULL;
        }
    }

    return redis;
}


/* the directive's parameters, after its addresses */

static ngx_int_t
ngx_http_idempotency_target_args(ngx_conf_t *cf, ngx_uint_t can_tls,
    ngx_http_idempotency_target_args_t *ta)
{
    u_char      *p;
    size_t       len;
    ngx_str_t   *value;
    ngx_int_t    n;
    ngx_uint_t   i, naddrs;

    value = cf->args->elts;

    ngx_memzero(ta, sizeof(ngx_http_idempotency_target_args_t));

    /* more addresses before the parameters: cluster seeds or Sentinels */

    for (naddrs = 1; naddrs + 1 < cf->args->nelts; naddrs++) {
        if (ngx_strlchr(value[naddrs + 1].data,
                        value[naddrs + 1].data + value[naddrs + 1].len, '=')
            || ngx_strcmp(value[naddrs + 1].data, "tls") == 0
            || ngx_strcmp(value[naddrs + 1].data, "cluster") == 0)
        {
            break;
        }
    }

    ta->naddrs = naddrs;

    for (i = naddrs + 1; i < cf->args->nelts; i++) {

        if (ngx_strncmp(value[i].data, "db=", 3) == 0) {
            n = ngx_atoi(value[i].data + 3, value[i].len - 3);
            if (n == NGX_ERROR || n > 65535) {
                ngx_conf_log_error(NGX_LOG_EMERG, cf, 0,
                                   "invalid parameter \"%V\" of \"%V\": db "
                                   "must be a number from 0 to 65535",
                                   &value[i], &value[0]);
                return NGX_ERROR;
            }

            ta->db = n;
            continue;
        }

        if (ngx_strncmp(value[i].data, "user=", 5) == 0
            && value[i].len > 5)
        {
            ta->user.data = value[i].data + 5;
            ta->user.len = value[i].len - 5;
            continue;
        }

        if (ngx_strncmp(value[i].data, "password=", 9) == 0
            && value[i].len > 9)
        {
            ta->password.data = value[i].data + 9;
            ta->password.len = value[i].len - 9;
            continue;
        }

        if (ngx_strcmp(value[i].data, "tls") == 0) {
            if (can_tls) {
                ta->tls = 1;
                continue;
            }

            ngx_conf_log_error(NGX_LOG_EMERG, cf, 0,
                               "\"tls\" requires nginx built with "
                               "ngx_http_ssl_module");
            return NGX_ERROR;
        }

        if (ngx_strcmp(value[i].data, "cluster") == 0) {
            ta->cluster = 1;
            continue;
        }

        if (ngx_strncmp(value[i].data, "sentinel=", 9) == 0
            || ngx_strncmp(value[i].data, "sentinel_user=", 14) == 0
            || ngx_strncmp(value[i].data, "sentinel_password=", 18) == 0)
        {
            /* read by sentinel.c */
            ta->sentinel = 1;
            continue;
        }

        goto invalid;
    }

    return NGX_OK;

invalid:

    /* a mistyped "password=": its value stays out of the log */

    p = ngx_strlchr(value[i].data, value[i].data + value[i].len, '=');
    len = p ? (size_t) (p + 1 - value[i].data) : value[i].len;

    ngx_conf_log_error(NGX_LOG_EMERG, cf, 0,
                       "invalid parameter \"%*s%s\" of \"%V\": %s",
                       len, value[i].data, len < value[i].len ? "..." : "",
                       &value[0], NGX_HTTP_IDEMPOTENCY_REDIS_PARAMS);

    return NGX_ERROR;
}


/* servers with the same address and credentials share one connection */

ngx_http_idempotency_target_t *
ngx_http_idempotency_target_add(ngx_conf_t *cf, ngx_array_t *servers,
    ngx_str_t *addr, ngx_uint_t db, ngx_str_t *user, ngx_str_t *password,
    ngx_uint_t tls)
{
    ngx_url_t                      u;
    ngx_str_t                      empty = ngx_null_string;
    ngx_uint_t                     i;
    ngx_http_idempotency_target_t *redis, **rp;

    if (user == NULL) {
        user = &empty;
        password = &empty;
    }

    rp = servers->elts;
    for (i = 0; i < servers->nelts; i++) {
        redis = rp[i];

        if (redis->name.len == addr->len
            && ngx_strncmp(redis->name.data, addr->data, addr->len) == 0
            && redis->db == db
            && redis->tls == tls
            && redis->user.len == user->len
            && ngx_strncmp(redis->user.data, user->data, user->len) == 0
            && redis->password.len == password->len
            && ngx_strncmp(redis->password.data, password->data,
                           password->len) == 0)
        {
            return redis;
        }
    }

    redis = ngx_pcalloc(cf->pool, sizeof(ngx_http_idempotency_target_t));
    if (redis == NULL) {
        return NULL;
    }

    redis->name = *addr;
    redis->db = db;
    redis->user = *user;
    redis->password = *password;
    redis->tls = tls;
    redis->topology = &ngx_http_idempotency_standalone_topology;

    if (cf->conf_file && cf->conf_file->file.fd != NGX_INVALID_FILE) {
        redis->conf_file = cf->conf_file->file.name;
        redis->conf_line = cf->conf_file->line;
    }

    /*
     * A name is resolved when the configuration is merged: with the http
     * resolver on each connect if one is configured where it is used, else
     * once, now.
     */

    ngx_memzero(&u, sizeof(ngx_url_t));

    u.url = *addr;
    u.default_port = 6379;
    u.no_resolve = 1;

    if (ngx_parse_url(cf->pool, &u) != NGX_OK
        || (u.naddrs == 0 && u.host.len == 0))
    {
        ngx_conf_log_error(NGX_LOG_EMERG, cf, 0,
                           "invalid redis address \"%V\"%s%s", addr,
                           u.err ? ": " : "", u.err ? u.err : "");
        return NULL;
    }

    /* a unix socket: its one address */
    redis->addrs = u.addrs;
    redis->naddrs = u.naddrs;

    if (u.family != AF_UNIX) {
        redis->host = u.host;
        redis->port = u.port;
    }

    rp = ngx_array_push(servers);
    if (rp == NULL) {
        return NULL;
    }

    *rp = redis;

    return redis;
}
