
/*
 * Copyright (C) The ngx_http_idempotency_module authors
 *
 * What the Sentinel topology's two files share: its state, made by the
 * configuration (sentinel_conf.c) and run by the topology (sentinel.c).
 */


#ifndef _NGX_HTTP_IDEMPOTENCY_SENTINEL_H_INCLUDED_
#define _NGX_HTTP_IDEMPOTENCY_SENTINEL_H_INCLUDED_


#include "ngx_http_idempotency_redis.h"


#define NGX_HTTP_IDEMPOTENCY_SENTINEL_PORT      26379


struct ngx_http_idempotency_sentinel_s {
    ngx_http_idempotency_target_t   *redis;      /* the master's target */
    ngx_http_idempotency_target_t   *sentinels;  /* the Sentinel connection */
    ngx_str_t                        master;     /* its name */
    ngx_str_t                        args;       /* for sharing a target */
    ngx_str_t                       *hosts;      /* of each Sentinel addr */
    ngx_str_t                        master_host;    /* as last named */
    u_char                           master_buf[NGX_SOCKADDR_STRLEN + 1];
    ngx_log_t                        log;        /* NOTICE and up */

    ngx_event_t                      refresh_ev;
    ngx_event_t                      ask_ev;
    ngx_msec_t                       asked;
    ngx_uint_t                       tried;      /* the Sentinel's addr */

    unsigned                         answered:1; /* by this connection */
    unsigned                         stale:1;    /* its answer was wrong */
    unsigned                         complained:1;   /* no answer logged */
    unsigned                         not_master:1;   /* logged */
    unsigned                         switching:1;    /* to a new master */
};


#endif /* _NGX_HTTP_IDEMPOTENCY_SENTINEL_H_INCLUDED_ */
