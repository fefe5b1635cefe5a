
/*
 * Copyright (C) The ngx_http_idempotency_module authors
 *
 * TLS to Redis: the SSL context of a target, built once at configuration
 * time from the idempotency_redis_tls_* directives, and the client side of
 * the handshake on each new connection, with the certificate checked
 * against the CA and the name afterwards as proxy_ssl_verify does.
 */


#include "ngx_http_idempotency_redis.h"


#if (NGX_SSL)

static ngx_int_t ngx_http_idempotency_tls_same(
    ngx_http_idempotency_tls_conf_t *a, ngx_http_idempotency_tls_conf_t *b);
static void ngx_http_idempotency_tls_done(ngx_connection_t *c);
static ngx_int_t ngx_http_idempotency_tls_check_name(ngx_connection_t *c,
    ngx_str_t *name, ngx_uint_t ip);
static ngx_str_t *ngx_http_idempotency_tls_name(
    ngx_http_idempotency_node_t *node, ngx_uint_t *ip);

#endif


/* a literal address is not sent as SNI, and is matched to an IP SAN */

ngx_uint_t
ngx_http_idempotency_is_ip(ngx_str_t *host)
{
#if (NGX_HAVE_INET6)
    u_char  addr6[16];
#endif

    if (host->len == 0 || host->data[0] == '[') {
        return host->len != 0;
    }

    if (ngx_inet_addr(host->data, host->len) != INADDR_NONE) {
        return 1;
    }

#if (NGX_HAVE_INET6)
    if (ngx_inet6_addr(host->data, host->len, addr6) == NGX_OK) {
        return 1;
    }
#endif

    return 0;
}


char *
ngx_http_idempotency_tls_merge(ngx_conf_t *cf,
    ngx_http_idempotency_target_t *redis, ngx_http_idempotency_tls_conf_t *tc)
{
#if (NGX_SSL)
    ngx_str_t                     *name, host;
    ngx_ssl_t                     *ssl;
    ngx_pool_cleanup_t            *cln;

    if (!redis->tls) {
        return NGX_CONF_OK;
    }

    /* one connection per target: its TLS settings cannot differ by place */

    if (redis->ssl) {
        if (ngx_http_idempotency_tls_same(&redis->tls_conf, tc) != NGX_OK) {
            ngx_conf_log_error(NGX_LOG_EMERG, cf, 0,
                               "\"idempotency_redis %V\" is used with "
                               "different idempotency_redis_tls_* settings",
                               &redis->name);
            return NGX_CONF_ERROR;
        }

        return NGX_CONF_OK;
    }

    ssl = ngx_pcalloc(cf->pool, sizeof(ngx_ssl_t));
    if (ssl == NULL) {
        return NGX_CONF_ERROR;
    }

    ssl->log = cf->log;

    if (ngx_ssl_create(ssl, NGX_SSL_TLSv1_2|NGX_SSL_TLSv1_3, NULL) != NGX_OK) {
        return NGX_CONF_ERROR;
    }

    cln = ngx_pool_cleanup_add(cf->pool, 0);
    if (cln == NULL) {
        ngx_ssl_cleanup_ctx(ssl);
        return NGX_CONF_ERROR;
    }

    cln->handler = ngx_ssl_cleanup_ctx;
    cln->data = ssl;

    /* commands are appended to a buffer that may move between retries */
    SSL_CTX_set_mode(ssl->ctx, SSL_MODE_ACCEPT_MOVING_WRITE_BUFFER);

    if (tc->certificate.len) {
        if (tc->certificate_key.len == 0) {
            ngx_conf_log_error(NGX_LOG_EMERG, cf, 0,
                               "no \"idempotency_redis_tls_certificate_key\" "
                               "for the certificate \"%V\"",
                               &tc->certificate);
            return NGX_CONF_ERROR;
        }

        if (ngx_ssl_certificate(cf, ssl, &tc->certificate,
                                &tc->certificate_key, NULL)
            != NGX_OK)
        {
            return NGX_CONF_ERROR;
        }
    }

    name = tc->name.len ? &tc->name : &redis->host;

    if (tc->verify) {
        if (tc->trusted_certificate.len) {
            if (ngx_ssl_trusted_certificate(cf, ssl,
                                            &tc->trusted_certificate, 9)
                != NGX_OK)
            {
                return NGX_CONF_ERROR;
            }

        } else if (SSL_CTX_set_default_verify_paths(ssl->ctx) != 1) {
            ngx_ssl_error(NGX_LOG_EMERG, cf->log, 0,
                          "SSL_CTX_set_default_verify_paths() failed");
            return NGX_CONF_ERROR;
        }

        /* with Sentinel: the host of each address, see sentinel.c */

        if (name->len == 0 && !redis->topology->tls_found) {
            ngx_conf_log_error(NGX_LOG_EMERG, cf, 0,
                               "\"idempotency_redis %V ... tls\" with a "
                               "verified certificate needs "
                               "\"idempotency_redis_tls_name\"",
                               &redis->name);
            return NGX_CONF_ERROR;
        }
    }

    /* NUL-terminated for SSL_set_tlsext_host_name() and X509_check_*() */

    if (name->len > 2 && name->data[0] == '['
        && name->data[name->len - 1] == ']')
    {
        host.data = name->data + 1;
        host.len = name->len - 2;
        name = &host;
    }

    redis->tls_name.data = ngx_pnalloc(cf->pool, name->len + 1);
    if (redis->tls_name.data == NULL) {
        return NGX_CONF_ERROR;
    }

    *ngx_cpymem(redis->tls_name.data, name->data, name->len) = '\0';
    redis->tls_name.len = name->len;
    redis->tls_name_ip = ngx_http_idempotency_is_ip(name);
    redis->tls_verify = tc->verify;
    redis->tls_conf = *tc;
    redis->ssl = ssl;

    if (redis->topology->tls) {
        redis->topology->tls(redis);
    }

    return NGX_CONF_OK;

#else

    return NGX_CONF_OK;

#endif
}


#if (NGX_SSL)

static ngx_int_t
ngx_http_idempotency_tls_same(ngx_http_idempotency_tls_conf_t *a,
    ngx_http_idempotency_tls_conf_t *b)
{
    ngx_uint_t   i;
    ngx_str_t   *sa, *sb;
    ngx_str_t   *as[4], *bs[4];

    if (a->verify != b->verify) {
        return NGX_DECLINED;
    }

    as[0] = &a->trusted_certificate;
    as[1] = &a->name;
    as[2] = &a->certificate;
    as[3] = &a->certificate_key;
    bs[0] = &b->trusted_certificate;
    bs[1] = &b->name;
    bs[2] = &b->certificate;
    bs[3] = &b->certificate_key;

    for (i = 0; i < 4; i++) {
        sa = as[i];
        sb = bs[i];

        if (sa->len != sb->len
            || ngx_strncmp(sa->data, sb->data, sa->len) != 0)
        {
            return NGX_DECLINED;
        }
    }

    return NGX_OK;
}


void
ngx_http_idempotency_tls_start(ngx_http_idempotency_node_t *node)
{
    ngx_int_t                      rc;
    ngx_str_t                     *name;
    ngx_uint_t                     ip;
    ngx_connection_t              *c;
    ngx_http_idempotency_target_t *redis;

    c = node->conn;
    redis = node->redis;

    if (ngx_ssl_create_connection(redis->ssl, c, NGX_SSL_CLIENT) != NGX_OK) {
        ngx_http_idempotency_conn_fail(node, 0, "cannot start TLS with");
        return;
    }

    name = ngx_http_idempotency_tls_name(node, &ip);

    if (name->len && !ip
        && SSL_set_tlsext_host_name(c->ssl->connection, (char *) name->data)
           != 1)
    {
        ngx_ssl_error(NGX_LOG_ERR, redis->log, 0,
                      "SSL_set_tlsext_host_name(\"%V\") failed", name);
        ngx_http_idempotency_conn_fail(node, 0, "cannot start TLS with");
        return;
    }

    if (node->session
        && ngx_ssl_set_session(c, node->session) != NGX_OK)
    {
        ngx_http_idempotency_conn_fail(node, 0, "cannot start TLS with");
        return;
    }

    rc = ngx_ssl_handshake(c);

    if (rc == NGX_AGAIN) {
        /* the connect timer of the node bounds the handshake */
        c->ssl->handler = ngx_http_idempotency_tls_done;
        return;
    }

    ngx_http_idempotency_tls_done(c);
}


static void
ngx_http_idempotency_tls_done(ngx_connection_t *c)
{
    long                           rc;
    ngx_str_t                     *name;
    ngx_uint_t                     ip;
    ngx_ssl_session_t             *session;
    ngx_http_idempotency_node_t   *node = c->data;
    ngx_http_idempotency_target_t *redis;

    redis = node->redis;

    if (!c->ssl->handshaked) {
        ngx_http_idempotency_conn_fail(node, 0, "TLS handshake failed with");
        return;
    }

    if (redis->tls_verify) {
        rc = SSL_get_verify_result(c->ssl->connection);

        if (rc != X509_V_OK) {
            if (!node->failed) {
                ngx_log_error(NGX_LOG_ERR, redis->log, 0,
                              "idempotency: redis \"%V\" TLS certificate "
                              "verify failed: (%l:%s)", &redis->name,
                              rc, X509_verify_cert_error_string(rc));
                node->failed = 1;
            }

            ngx_http_idempotency_conn_fail(node, 0, NULL);
            return;
        }

        name = ngx_http_idempotency_tls_name(node, &ip);

        if (ngx_http_idempotency_tls_check_name(c, name, ip) != NGX_OK) {
            if (!node->failed) {
                ngx_log_error(NGX_LOG_ERR, redis->log, 0,
                              "idempotency: redis \"%V\" TLS certificate "
                              "does not match \"%V\"", &redis->name, name);
                node->failed = 1;
            }

            ngx_http_idempotency_conn_fail(node, 0, NULL);
            return;
        }
    }

    /* resumed next time; a TLS 1.3 session without a ticket is harmless */

    session = ngx_ssl_get_session(c);

    if (session) {
        if (node->session) {
            ngx_ssl_free_session(node->session);
        }

        node->session = session;
    }

    ngx_http_idempotency_conn_ready(node);
}


/*
 * idempotency_redis_tls_name, else the host of the address: for a
 * Sentinel setup that of the address connected to, for a cluster node
 * known by name (cluster.c) its name
 */

static ngx_str_t *
ngx_http_idempotency_tls_name(ngx_http_idempotency_node_t *node,
    ngx_uint_t *ip)
{
    ngx_str_t                     *name;
    ngx_http_idempotency_target_t *redis;

    redis = node->redis;

    if (redis->topology->tls_name) {
        name = redis->topology->tls_name(node, ip);

        if (name) {
            return name;
        }
    }

    *ip = redis->tls_name_ip;
    return &redis->tls_name;
}


static ngx_int_t
ngx_http_idempotency_tls_check_name(ngx_connection_t *c, ngx_str_t *name,
    ngx_uint_t ip)
{
    int    rc;
    X509  *cert;

    if (!ip) {
        return ngx_ssl_check_host(c, name);
    }

    /* X509_check_host() does not look at IP addresses */

    cert = SSL_get_peer_certificate(c->ssl->connection);
    if (cert == NULL) {
        return NGX_ERROR;
    }

    rc = X509_check_ip_asc(cert, (char *) name->data, 0);

    X509_free(cert);

    return (rc == 1) ? NGX_OK : NGX_ERROR;
}

#endif
