
/*
 * Copyright (C) The ngx_http_idempotency_module authors
 *
 * "return" runs in the rewrite phase: before access control and before
 * our precontent handler.  In a location where the module is on, the
 * return codes of the location's rewrite program are swapped, at
 * configuration time, for one that defers the return of a protected
 * request to the precontent phase: after access control and after the
 * claim, as if "return" were the content handler.  Requests the module
 * does not protect keep nginx's own order.
 */


#include "ngx_http_idempotency_module.h"


/* the first field of ngx_http_rewrite_module's (private) loc conf */
typedef struct {
    ngx_array_t                      *codes;
} ngx_http_idempotency_rewrite_conf_t;


static void ngx_http_idempotency_return_code(ngx_http_script_engine_t *e);


/* a NULL code ends a program (nginx's own end marker is static) */
static uintptr_t  ngx_http_idempotency_exit_code = (uintptr_t) NULL;


ngx_int_t
ngx_http_idempotency_return_patch(ngx_conf_t *cf)
{
    uintptr_t                            *word;
    ngx_uint_t                            i, n;
    ngx_module_t                        **modules;
    ngx_http_conf_ctx_t                  *ctx;
    ngx_http_core_srv_conf_t             *cscf;
    ngx_http_idempotency_rewrite_conf_t  *rlcf;

    ctx = cf->ctx;
    cscf = ngx_http_conf_get_module_srv_conf(cf, ngx_http_core_module);

    if (ctx->loc_conf == cscf->ctx->loc_conf) {
        /* a server-level return answers before any location is chosen */
        return NGX_OK;
    }

    modules = cf->cycle->modules;

    for (i = 0; modules[i]; i++) {
        if (ngx_strcmp(modules[i]->name, "ngx_http_rewrite_module") == 0) {
            break;
        }
    }

    if (modules[i] == NULL) {
        return NGX_OK;
    }

    rlcf = ctx->loc_conf[modules[i]->ctx_index];

    if (rlcf == NULL || rlcf->codes == NULL) {
        return NGX_OK;
    }

    /*
     * Codes are word-aligned structures that start with their handler;
     * "if" blocks share the location's program, so one pass finds every
     * return.  No operand can equal a function's address.
     */

    word = rlcf->codes->elts;
    n = rlcf->codes->nelts / sizeof(uintptr_t);

    for (i = 0; i < n; i++) {
        if (word[i] == (uintptr_t) ngx_http_script_return_code) {
            word[i] = (uintptr_t) ngx_http_idempotency_return_code;
        }
    }

    return NGX_OK;
}


static void
ngx_http_idempotency_return_code(ngx_http_script_engine_t *e)
{
    ngx_http_request_t  *r;

    r = e->request;

    if (ngx_http_idempotency_defer_return(r, e->ip) != NGX_OK) {
        ngx_http_script_return_code(e);
        return;
    }

    /* the program ends here, as after a return; the phases go on */

    e->ip = (u_char *) &ngx_http_idempotency_exit_code;
    e->status = NGX_DECLINED;

    /* a rewrite before the return must not select another location */
    r->uri_changed = 0;
}


/* what ngx_http_script_return_code() does, from the precontent phase */

ngx_int_t
ngx_http_idempotency_run_return(ngx_http_request_t *r, void *data)
{
    ngx_int_t                       rc;
    ngx_http_script_return_code_t  *code;

    code = data;

    if (code->status < NGX_HTTP_BAD_REQUEST
        || code->text.value.len
        || code->text.lengths)
    {
        rc = ngx_http_send_response(r, code->status, NULL, &code->text);

    } else {
        rc = code->status;
    }

    ngx_http_finalize_request(r, rc);

    return NGX_DONE;
}
