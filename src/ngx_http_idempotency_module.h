
/*
 * Copyright (C) The ngx_http_idempotency_module authors
 */


#ifndef _NGX_HTTP_IDEMPOTENCY_MODULE_H_INCLUDED_
#define _NGX_HTTP_IDEMPOTENCY_MODULE_H_INCLUDED_


#include "ngx_http_idempotency_http.h"
#include "ngx_http_idempotency_version.h"


/* conf.c: the directives' values, their bounds, the nginx -t warnings */
void ngx_http_idempotency_warn(ngx_conf_t *cf,
    ngx_http_idempotency_loc_conf_t *conf);
char *ngx_http_idempotency_prefix_directive(ngx_conf_t *cf, ngx_command_t *cmd,
    void *conf);
char *ngx_http_idempotency_store_status_directive(ngx_conf_t *cf,
    ngx_command_t *cmd, void *conf);
char *ngx_http_idempotency_methods_directive(ngx_conf_t *cf, ngx_command_t *cmd,
    void *conf);
char *ngx_http_idempotency_enum_slot(ngx_conf_t *cf, ngx_command_t *cmd,
    void *conf);
char *ngx_http_idempotency_check_msec(ngx_conf_t *cf, void *post,
    void *data);
char *ngx_http_idempotency_check_size(ngx_conf_t *cf, void *post,
    void *data);
size_t ngx_http_idempotency_msec_text(u_char *buf, ngx_msec_t ms);
char *ngx_http_idempotency_header_list_slot(ngx_conf_t *cf, ngx_command_t *cmd,
    void *conf);
char *ngx_http_idempotency_key_pattern_directive(ngx_conf_t *cf,
    ngx_command_t *cmd, void *conf);
char *ngx_http_idempotency_key_json_pointer_directive(ngx_conf_t *cf,
    ngx_command_t *cmd, void *conf);
char *ngx_http_idempotency_redis_wait_directive(ngx_conf_t *cf,
    ngx_command_t *cmd, void *conf);
char *ngx_http_idempotency_wait_merge(ngx_conf_t *cf,
    ngx_http_idempotency_loc_conf_t *prev,
    ngx_http_idempotency_loc_conf_t *conf);
void ngx_http_idempotency_claim_conf(ngx_http_idempotency_loc_conf_t *conf);

/* version.c */
ngx_int_t ngx_http_idempotency_init_module(ngx_cycle_t *cycle);


#endif /* _NGX_HTTP_IDEMPOTENCY_MODULE_H_INCLUDED_ */
