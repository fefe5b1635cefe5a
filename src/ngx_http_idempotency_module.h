
/*
 * Copyright (C) The ngx_http_idempotency_module authors
 */


#ifndef _NGX_HTTP_IDEMPOTENCY_MODULE_H_INCLUDED_
#define _NGX_HTTP_IDEMPOTENCY_MODULE_H_INCLUDED_


#include "ngx_http_idempotency_http.h"
#include "ngx_http_idempotency_version.h"


/* version.c */
ngx_int_t ngx_http_idempotency_init_module(ngx_cycle_t *cycle);


#endif /* _NGX_HTTP_IDEMPOTENCY_MODULE_H_INCLUDED_ */
