
/*
 * Copyright (C) The ngx_http_idempotency_module authors
 *
 * The start-up notice: which release, and which hiredis and OpenSSL.
 */


#include "ngx_http_idempotency_module.h"

#include <openssl/crypto.h>


/*
 * init_module runs in the master (or the single process) once per
 * configuration load: on start, on each reload and under "nginx -t",
 * never in the workers, so the line comes once per load, not per worker
 */

ngx_int_t
ngx_http_idempotency_init_module(ngx_cycle_t *cycle)
{
    ngx_log_error(NGX_LOG_NOTICE, cycle->log, 0,
                  "idempotency module " NGX_HTTP_IDEMPOTENCY_VERSION
                  " (hiredis %d.%d.%d, %s)",
                  HIREDIS_MAJOR, HIREDIS_MINOR, HIREDIS_PATCH,
                  OpenSSL_version(OPENSSL_VERSION));

    return NGX_OK;
}
