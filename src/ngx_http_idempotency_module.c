
/*
 * Copyright (C) The ngx_http_idempotency_module authors
 *
 * The module's wiring into nginx: its directive table, the configuration
 * created and merged per location, the variables, the phase handler and
 * the filters, and the worker's start and exit.  What a directive's value
 * means is conf.c's; what a Redis target is, the client's (target_conf.c).
 */


#include "ngx_http_idempotency_module.h"


/*
 * A place has a resolver of its own when the "resolver" directive named
 * servers: nginx keeps them in an array, Angie in a list (its resolvers
 * can change at run time), empty where none was named.
 *
 * Angie 1.12.0 gives every place "resolver conf" unless "resolver off":
 * the name servers of /etc/resolv.conf, after a placeholder that heads the
 * list and is its last configured entry when no server was named.  Such a
 * resolver does not count, so that a configuration means what it means in
 * nginx: a name is resolved once, by the system (with /etc/hosts), and
 * "nginx -t" refuses one that does not resolve.
 */
#if defined(angie_version) && (angie_version >= 1012000)
#define ngx_http_idempotency_resolver_set(r)                                  \
    ((r)->connections != NULL                                                 \
     && ((r)->resolv_conf.len == 0                                            \
         || (r)->last_conf_connection != (r)->connections))
#elif defined(angie_version)
#define ngx_http_idempotency_resolver_set(r)  ((r)->connections != NULL)
#else
#define ngx_http_idempotency_resolver_set(r)  ((r)->connections.nelts != 0)
#endif


static ngx_int_t ngx_http_idempotency_add_variables(ngx_conf_t *cf);
static ngx_int_t ngx_http_idempotency_status_variable(ngx_http_request_t *r,
    ngx_http_variable_value_t *v, uintptr_t data);
static ngx_int_t ngx_http_idempotency_key_hash_variable(ngx_http_request_t *r,
    ngx_http_variable_value_t *v, uintptr_t data);
static void *ngx_http_idempotency_create_main_conf(ngx_conf_t *cf);
static void *ngx_http_idempotency_create_loc_conf(ngx_conf_t *cf);
static char *ngx_http_idempotency_merge_loc_conf(ngx_conf_t *cf,
    void *parent, void *child);
static char *ngx_http_idempotency_redis_directive(ngx_conf_t *cf,
    ngx_command_t *cmd, void *conf);
static ngx_int_t ngx_http_idempotency_init(ngx_conf_t *cf);
static ngx_int_t ngx_http_idempotency_init_process(ngx_cycle_t *cycle);
static void ngx_http_idempotency_exit_process(ngx_cycle_t *cycle);


/* safe methods (GET, HEAD, OPTIONS) change nothing: nothing to protect */

static ngx_conf_bitmask_t  ngx_http_idempotency_methods_mask[] = {
    { ngx_string("POST"), NGX_HTTP_POST },
    { ngx_string("PUT"), NGX_HTTP_PUT },
    { ngx_string("DELETE"), NGX_HTTP_DELETE },
    { ngx_string("PATCH"), NGX_HTTP_PATCH },
    { ngx_null_string, 0 }
};


static ngx_conf_enum_t  ngx_http_idempotency_on_error[] = {
    { ngx_string("reject"), NGX_HTTP_IDEMPOTENCY_ON_ERROR_REJECT },
    { ngx_string("pass"), NGX_HTTP_IDEMPOTENCY_ON_ERROR_PASS },
    { ngx_null_string, 0 }
};


static ngx_conf_enum_t  ngx_http_idempotency_on_unknown_values[] = {
    { ngx_string("keep"), NGX_HTTP_IDEMPOTENCY_ON_UNKNOWN_KEEP },
    { ngx_string("forward"), NGX_HTTP_IDEMPOTENCY_ON_UNKNOWN_FORWARD },
    { ngx_string("release"), NGX_HTTP_IDEMPOTENCY_ON_UNKNOWN_RELEASE },
    { ngx_null_string, 0 }
};


/*
 * Bounds are checked as each directive is read, so that an error names the
 * directive's own line rather than the end of http{}, where merging runs.
 */

static ngx_conf_num_bounds_t  ngx_http_idempotency_key_length_bounds = {
    ngx_http_idempotency_check_size, 1, 1024
};


static ngx_conf_num_bounds_t  ngx_http_idempotency_ttl_bounds = {
    ngx_http_idempotency_check_msec, 1000, -1
};


static ngx_conf_num_bounds_t  ngx_http_idempotency_timeout_bounds = {
    ngx_http_idempotency_check_msec, 1, -1
};


static ngx_command_t  ngx_http_idempotency_commands[] = {

    { ngx_string("idempotency"),
      NGX_HTTP_MAIN_CONF|NGX_HTTP_SRV_CONF|NGX_HTTP_LOC_CONF|NGX_CONF_FLAG,
      ngx_conf_set_flag_slot,
      NGX_HTTP_LOC_CONF_OFFSET,
      offsetof(ngx_http_idempotency_loc_conf_t, enable),
      NULL },

    { ngx_string("idempotency_redis"),
      NGX_HTTP_MAIN_CONF|NGX_HTTP_SRV_CONF|NGX_HTTP_LOC_CONF|NGX_CONF_1MORE,
      ngx_http_idempotency_redis_directive,
      NGX_HTTP_LOC_CONF_OFFSET,
      0,
      NULL },

    { ngx_string("idempotency_redis_timeout"),
      NGX_HTTP_MAIN_CONF|NGX_HTTP_SRV_CONF|NGX_HTTP_LOC_CONF|NGX_CONF_TAKE1,
      ngx_conf_set_msec_slot,
      NGX_HTTP_LOC_CONF_OFFSET,
      offsetof(ngx_http_idempotency_loc_conf_t, redis_timeout),
      &ngx_http_idempotency_timeout_bounds },

    { ngx_string("idempotency_fresh_key_detect"),
      NGX_HTTP_MAIN_CONF|NGX_HTTP_SRV_CONF|NGX_HTTP_LOC_CONF|NGX_CONF_TAKE1,
      ngx_http_idempotency_fresh_key_detect_directive,
      NGX_HTTP_LOC_CONF_OFFSET,
      0,
      NULL },

    { ngx_string("idempotency_admin"),
      NGX_HTTP_LOC_CONF|NGX_CONF_NOARGS|NGX_CONF_TAKE1,
      ngx_http_idempotency_admin_directive,
      NGX_HTTP_LOC_CONF_OFFSET,
      0,
      NULL },

    { ngx_string("idempotency_key_secret"),
      NGX_HTTP_MAIN_CONF|NGX_HTTP_SRV_CONF|NGX_HTTP_LOC_CONF|NGX_CONF_TAKE1,
      ngx_http_idempotency_key_secret_directive,
      NGX_HTTP_LOC_CONF_OFFSET,
      offsetof(ngx_http_idempotency_loc_conf_t, secret),
      NULL },

    { ngx_string("idempotency_encrypt_key"),
      NGX_HTTP_MAIN_CONF|NGX_HTTP_SRV_CONF|NGX_HTTP_LOC_CONF|NGX_CONF_TAKE123,
      ngx_http_idempotency_encrypt_key_directive,
      NGX_HTTP_LOC_CONF_OFFSET,
      offsetof(ngx_http_idempotency_loc_conf_t, encrypt_keys),
      NULL },

    { ngx_string("idempotency_redis_prefix"),
      NGX_HTTP_MAIN_CONF|NGX_HTTP_SRV_CONF|NGX_HTTP_LOC_CONF|NGX_CONF_TAKE1,
      ngx_http_idempotency_prefix_directive,
      NGX_HTTP_LOC_CONF_OFFSET,
      offsetof(ngx_http_idempotency_loc_conf_t, prefix),
      NULL },

    { ngx_string("idempotency_key"),
      NGX_HTTP_MAIN_CONF|NGX_HTTP_SRV_CONF|NGX_HTTP_LOC_CONF|NGX_CONF_TAKE1,
      ngx_http_set_complex_value_slot,
      NGX_HTTP_LOC_CONF_OFFSET,
      offsetof(ngx_http_idempotency_loc_conf_t, key),
      NULL },

    { ngx_string("idempotency_key_max_length"),
      NGX_HTTP_MAIN_CONF|NGX_HTTP_SRV_CONF|NGX_HTTP_LOC_CONF|NGX_CONF_TAKE1,
      ngx_conf_set_size_slot,
      NGX_HTTP_LOC_CONF_OFFSET,
      offsetof(ngx_http_idempotency_loc_conf_t, key_max_length),
      &ngx_http_idempotency_key_length_bounds },

    { ngx_string("idempotency_key_pattern"),
      NGX_HTTP_MAIN_CONF|NGX_HTTP_SRV_CONF|NGX_HTTP_LOC_CONF|NGX_CONF_TAKE1,
      ngx_http_idempotency_key_pattern_directive,
      NGX_HTTP_LOC_CONF_OFFSET,
      0,
      NULL },

    { ngx_string("idempotency_key_json_pointer"),
      NGX_HTTP_MAIN_CONF|NGX_HTTP_SRV_CONF|NGX_HTTP_LOC_CONF|NGX_CONF_TAKE1,
      ngx_http_idempotency_key_json_pointer_directive,
      NGX_HTTP_LOC_CONF_OFFSET,
      0,
      NULL },

    { ngx_string("idempotency_scope"),
      NGX_HTTP_MAIN_CONF|NGX_HTTP_SRV_CONF|NGX_HTTP_LOC_CONF|NGX_CONF_TAKE1,
      ngx_http_set_complex_value_slot,
      NGX_HTTP_LOC_CONF_OFFSET,
      offsetof(ngx_http_idempotency_loc_conf_t, scope),
      NULL },

    { ngx_string("idempotency_methods"),
      NGX_HTTP_MAIN_CONF|NGX_HTTP_SRV_CONF|NGX_HTTP_LOC_CONF|NGX_CONF_1MORE,
      ngx_http_idempotency_methods_directive,
      NGX_HTTP_LOC_CONF_OFFSET,
      offsetof(ngx_http_idempotency_loc_conf_t, methods),
      &ngx_http_idempotency_methods_mask },

    { ngx_string("idempotency_required"),
      NGX_HTTP_MAIN_CONF|NGX_HTTP_SRV_CONF|NGX_HTTP_LOC_CONF|NGX_CONF_FLAG,
      ngx_conf_set_flag_slot,
      NGX_HTTP_LOC_CONF_OFFSET,
      offsetof(ngx_http_idempotency_loc_conf_t, required),
      NULL },

    { ngx_string("idempotency_ttl"),
      NGX_HTTP_MAIN_CONF|NGX_HTTP_SRV_CONF|NGX_HTTP_LOC_CONF|NGX_CONF_TAKE1,
      ngx_conf_set_msec_slot,
      NGX_HTTP_LOC_CONF_OFFSET,
      offsetof(ngx_http_idempotency_loc_conf_t, ttl),
      &ngx_http_idempotency_ttl_bounds },

    { ngx_string("idempotency_lock_ttl"),
      NGX_HTTP_MAIN_CONF|NGX_HTTP_SRV_CONF|NGX_HTTP_LOC_CONF|NGX_CONF_TAKE1,
      ngx_conf_set_msec_slot,
      NGX_HTTP_LOC_CONF_OFFSET,
      offsetof(ngx_http_idempotency_loc_conf_t, lock_ttl),
      &ngx_http_idempotency_ttl_bounds },

    { ngx_string("idempotency_wait"),
      NGX_HTTP_MAIN_CONF|NGX_HTTP_SRV_CONF|NGX_HTTP_LOC_CONF|NGX_CONF_TAKE1,
      ngx_conf_set_msec_slot,
      NGX_HTTP_LOC_CONF_OFFSET,
      offsetof(ngx_http_idempotency_loc_conf_t, wait),
      NULL },

    { ngx_string("idempotency_store_status"),
      NGX_HTTP_MAIN_CONF|NGX_HTTP_SRV_CONF|NGX_HTTP_LOC_CONF|NGX_CONF_1MORE,
      ngx_http_idempotency_store_status_directive,
      NGX_HTTP_LOC_CONF_OFFSET,
      0,
      NULL },

    { ngx_string("idempotency_store_max_size"),
      NGX_HTTP_MAIN_CONF|NGX_HTTP_SRV_CONF|NGX_HTTP_LOC_CONF|NGX_CONF_TAKE1,
      ngx_conf_set_size_slot,
      NGX_HTTP_LOC_CONF_OFFSET,
      offsetof(ngx_http_idempotency_loc_conf_t, store_max_size),
      NULL },

    { ngx_string("idempotency_store_immediate"),
      NGX_HTTP_MAIN_CONF|NGX_HTTP_SRV_CONF|NGX_HTTP_LOC_CONF|NGX_CONF_FLAG,
      ngx_conf_set_flag_slot,
      NGX_HTTP_LOC_CONF_OFFSET,
      offsetof(ngx_http_idempotency_loc_conf_t, store_immediate),
      NULL },

    { ngx_string("idempotency_hide_header"),
      NGX_HTTP_MAIN_CONF|NGX_HTTP_SRV_CONF|NGX_HTTP_LOC_CONF|NGX_CONF_TAKE1,
      ngx_http_idempotency_header_list_slot,
      NGX_HTTP_LOC_CONF_OFFSET,
      offsetof(ngx_http_idempotency_loc_conf_t, hide_headers),
      NULL },

    { ngx_string("idempotency_pass_header"),
      NGX_HTTP_MAIN_CONF|NGX_HTTP_SRV_CONF|NGX_HTTP_LOC_CONF|NGX_CONF_TAKE1,
      ngx_http_idempotency_header_list_slot,
      NGX_HTTP_LOC_CONF_OFFSET,
      offsetof(ngx_http_idempotency_loc_conf_t, pass_headers),
      NULL },

    { ngx_string("idempotency_on_redis_error"),
      NGX_HTTP_MAIN_CONF|NGX_HTTP_SRV_CONF|NGX_HTTP_LOC_CONF|NGX_CONF_TAKE1,
      ngx_http_idempotency_enum_slot,
      NGX_HTTP_LOC_CONF_OFFSET,
      offsetof(ngx_http_idempotency_loc_conf_t, on_redis_error),
      &ngx_http_idempotency_on_error },

    { ngx_string("idempotency_on_unknown"),
      NGX_HTTP_MAIN_CONF|NGX_HTTP_SRV_CONF|NGX_HTTP_LOC_CONF|NGX_CONF_TAKE1,
      ngx_http_idempotency_enum_slot,
      NGX_HTTP_LOC_CONF_OFFSET,
      offsetof(ngx_http_idempotency_loc_conf_t, on_unknown),
      &ngx_http_idempotency_on_unknown_values },

    /* wait.c */

    { ngx_string("idempotency_redis_wait"),
      NGX_HTTP_MAIN_CONF|NGX_HTTP_SRV_CONF|NGX_HTTP_LOC_CONF|NGX_CONF_TAKE123,
      ngx_http_idempotency_redis_wait_directive,
      NGX_HTTP_LOC_CONF_OFFSET,
      0,
      NULL },

    /* metrics.c */

    { ngx_string("idempotency_metrics"),
      NGX_HTTP_LOC_CONF|NGX_CONF_NOARGS,
      ngx_http_idempotency_metrics_directive,
      NGX_HTTP_LOC_CONF_OFFSET,
      0,
      NULL },

    { ngx_string("idempotency_metrics_zone"),
      NGX_HTTP_SRV_CONF|NGX_HTTP_LOC_CONF|NGX_CONF_TAKE1,
      ngx_http_idempotency_metrics_zone_directive,
      NGX_HTTP_LOC_CONF_OFFSET,
      0,
      NULL },

    { ngx_string("idempotency_problem_base_uri"),
      NGX_HTTP_MAIN_CONF|NGX_HTTP_SRV_CONF|NGX_HTTP_LOC_CONF|NGX_CONF_TAKE1,
      ngx_conf_set_str_slot,
      NGX_HTTP_LOC_CONF_OFFSET,
      offsetof(ngx_http_idempotency_loc_conf_t, problem_base_uri),
      NULL },

    { ngx_string("idempotency_problem_error_member"),
      NGX_HTTP_MAIN_CONF|NGX_HTTP_SRV_CONF|NGX_HTTP_LOC_CONF|NGX_CONF_FLAG,
      ngx_conf_set_flag_slot,
      NGX_HTTP_LOC_CONF_OFFSET,
      offsetof(ngx_http_idempotency_loc_conf_t, problem_error_member),
      NULL },

    { ngx_string("idempotency_retry_hints"),
      NGX_HTTP_MAIN_CONF|NGX_HTTP_SRV_CONF|NGX_HTTP_LOC_CONF|NGX_CONF_FLAG,
      ngx_conf_set_flag_slot,
      NGX_HTTP_LOC_CONF_OFFSET,
      offsetof(ngx_http_idempotency_loc_conf_t, retry_hints),
      NULL },

    { ngx_string("idempotency_expires_header"),
      NGX_HTTP_MAIN_CONF|NGX_HTTP_SRV_CONF|NGX_HTTP_LOC_CONF|NGX_CONF_FLAG,
      ngx_conf_set_flag_slot,
      NGX_HTTP_LOC_CONF_OFFSET,
      offsetof(ngx_http_idempotency_loc_conf_t, expires_header),
      NULL },

    { ngx_string("idempotency_dry_run"),
      NGX_HTTP_MAIN_CONF|NGX_HTTP_SRV_CONF|NGX_HTTP_LOC_CONF|NGX_CONF_FLAG,
      ngx_conf_set_flag_slot,
      NGX_HTTP_LOC_CONF_OFFSET,
      offsetof(ngx_http_idempotency_loc_conf_t, dry_run),
      NULL },

    /* tls.c: TLS to Redis, as proxy_ssl_* */

    { ngx_string("idempotency_redis_tls_verify"),
      NGX_HTTP_MAIN_CONF|NGX_HTTP_SRV_CONF|NGX_HTTP_LOC_CONF|NGX_CONF_FLAG,
      ngx_conf_set_flag_slot,
      NGX_HTTP_LOC_CONF_OFFSET,
      offsetof(ngx_http_idempotency_loc_conf_t, tls_verify),
      NULL },

    { ngx_string("idempotency_redis_tls_trusted_certificate"),
      NGX_HTTP_MAIN_CONF|NGX_HTTP_SRV_CONF|NGX_HTTP_LOC_CONF|NGX_CONF_TAKE1,
      ngx_conf_set_str_slot,
      NGX_HTTP_LOC_CONF_OFFSET,
      offsetof(ngx_http_idempotency_loc_conf_t, tls_trusted_certificate),
      NULL },

    { ngx_string("idempotency_redis_tls_name"),
      NGX_HTTP_MAIN_CONF|NGX_HTTP_SRV_CONF|NGX_HTTP_LOC_CONF|NGX_CONF_TAKE1,
      ngx_conf_set_str_slot,
      NGX_HTTP_LOC_CONF_OFFSET,
      offsetof(ngx_http_idempotency_loc_conf_t, tls_name),
      NULL },

    { ngx_string("idempotency_redis_tls_certificate"),
      NGX_HTTP_MAIN_CONF|NGX_HTTP_SRV_CONF|NGX_HTTP_LOC_CONF|NGX_CONF_TAKE1,
      ngx_conf_set_str_slot,
      NGX_HTTP_LOC_CONF_OFFSET,
      offsetof(ngx_http_idempotency_loc_conf_t, tls_certificate),
      NULL },

    { ngx_string("idempotency_redis_tls_certificate_key"),
      NGX_HTTP_MAIN_CONF|NGX_HTTP_SRV_CONF|NGX_HTTP_LOC_CONF|NGX_CONF_TAKE1,
      ngx_conf_set_str_slot,
      NGX_HTTP_LOC_CONF_OFFSET,
      offsetof(ngx_http_idempotency_loc_conf_t, tls_certificate_key),
      NULL },

      ngx_null_command
};


static ngx_http_module_t  ngx_http_idempotency_module_ctx = {
    ngx_http_idempotency_add_variables,    /* preconfiguration */
    ngx_http_idempotency_init,             /* postconfiguration */

    ngx_http_idempotency_create_main_conf, /* create main configuration */
    NULL,                                  /* init main configuration */

    NULL,                                  /* create server configuration */
    NULL,                                  /* merge server configuration */

    ngx_http_idempotency_create_loc_conf,  /* create location configuration */
    ngx_http_idempotency_merge_loc_conf    /* merge location configuration */
};


ngx_module_t  ngx_http_idempotency_module = {
    NGX_MODULE_V1,
    &ngx_http_idempotency_module_ctx,      /* module context */
    ngx_http_idempotency_commands,         /* module directives */
    NGX_HTTP_MODULE,                       /* module type */
    NULL,                                  /* init master */
    ngx_http_idempotency_init_module,      /* init module */
    ngx_http_idempotency_init_process,     /* init process */
    NULL,                                  /* init thread */
    NULL,                                  /* exit thread */
    ngx_http_idempotency_exit_process,     /* exit process */
    NULL,                                  /* exit master */
    NGX_MODULE_V1_PADDING
};


/* not cacheable: both change while the request runs */

static ngx_http_variable_t  ngx_http_idempotency_vars[] = {

    { ngx_string("idempotency_status"), NULL,
      ngx_http_idempotency_status_variable, 0,
      NGX_HTTP_VAR_NOCACHEABLE, 0 },

    { ngx_string("idempotency_key_hash"), NULL,
      ngx_http_idempotency_key_hash_variable, 0,
      NGX_HTTP_VAR_NOCACHEABLE, 0 },

      ngx_http_null_variable
};


static ngx_int_t
ngx_http_idempotency_add_variables(ngx_conf_t *cf)
{
    ngx_http_variable_t  *var, *v;

    for (v = ngx_http_idempotency_vars; v->name.len; v++) {
        var = ngx_http_add_variable(cf, &v->name, v->flags);
        if (var == NULL) {
            return NGX_ERROR;
        }

        var->get_handler = v->get_handler;
        var->data = v->data;
    }

    return NGX_OK;
}


static ngx_int_t
ngx_http_idempotency_status_variable(ngx_http_request_t *r,
    ngx_http_variable_value_t *v, uintptr_t data)
{
    ngx_uint_t                   status;
    ngx_http_idempotency_ctx_t  *ctx;

    ctx = ngx_http_idempotency_get_ctx(r->main);

    status = ctx ? ctx->status : NGX_HTTP_IDEMPOTENCY_BYPASS;

    v->len = ngx_http_idempotency_status_names[status].len;
    v->valid = 1;
    v->no_cacheable = 1;
    v->not_found = 0;
    v->data = ngx_http_idempotency_status_names[status].data;

    return NGX_OK;
}


/*
 * The hex SHA-256 between the braces of the record key: it names the
 * record in Redis without revealing the client's key.  Not found until a
 * valid key was hashed.
 */

static ngx_int_t
ngx_http_idempotency_key_hash_variable(ngx_http_request_t *r,
    ngx_http_variable_value_t *v, uintptr_t data)
{
    size_t                       len;
    ngx_str_t                   *rkey;
    ngx_http_idempotency_ctx_t  *ctx;

    ctx = ngx_http_idempotency_get_ctx(r->main);

    len = 2 * NGX_HTTP_IDEMPOTENCY_HASH_LEN;

    if (ctx == NULL || ctx->rkey.len < len + 2) {
        v->not_found = 1;
        return NGX_OK;
    }

    rkey = &ctx->rkey;

    if (rkey->data[rkey->len - 1] != '}'
        || rkey->data[rkey->len - len - 2] != '{')
    {
        v->not_found = 1;
        return NGX_OK;
    }

    v->len = len;
    v->valid = 1;
    v->no_cacheable = 1;
    v->not_found = 0;
    v->data = ngx_http_idempotency_key_hash(ctx);

    return NGX_OK;
}


static void *
ngx_http_idempotency_create_main_conf(ngx_conf_t *cf)
{
    ngx_http_idempotency_main_conf_t  *imcf;

    imcf = ngx_pcalloc(cf->pool, sizeof(ngx_http_idempotency_main_conf_t));
    if (imcf == NULL) {
        return NULL;
    }

    if (ngx_array_init(&imcf->servers, cf->pool, 2,
                       sizeof(ngx_http_idempotency_target_t *))
        != NGX_OK)
    {
        return NULL;
    }

    return imcf;
}


static void *
ngx_http_idempotency_create_loc_conf(ngx_conf_t *cf)
{
    ngx_http_idempotency_loc_conf_t  *conf;

    conf = ngx_pcalloc(cf->pool, sizeof(ngx_http_idempotency_loc_conf_t));
    if (conf == NULL) {
        return NULL;
    }

    /*
     * set by ngx_pcalloc():
     *
     *     conf->redis = NULL;
     *     conf->prefix = { 0, NULL };
     *     conf->key = NULL;
     *     conf->scope = NULL;
     *     conf->methods = 0;
     *     conf->problem_base_uri = { 0, NULL };
     *     conf->redis_default = 0;
     */

    if (cf->conf_file) {
        conf->conf_file = cf->conf_file->file.name;
        conf->conf_line = cf->conf_file->line;
    }

    conf->enable = NGX_CONF_UNSET;
    conf->redis_timeout = NGX_CONF_UNSET_MSEC;
    conf->key = NGX_CONF_UNSET_PTR;
    conf->key_max_length = NGX_CONF_UNSET_SIZE;
    conf->key_pattern = NGX_CONF_UNSET_PTR;
    conf->json_pointer = NGX_CONF_UNSET_PTR;
    conf->scope = NGX_CONF_UNSET_PTR;
    conf->required = NGX_CONF_UNSET;
    conf->ttl = NGX_CONF_UNSET_MSEC;
    conf->lock_ttl = NGX_CONF_UNSET_MSEC;
    conf->wait = NGX_CONF_UNSET_MSEC;
    conf->store_status = NGX_CONF_UNSET_PTR;
    conf->store_max_size = NGX_CONF_UNSET_SIZE;
    conf->store_immediate = NGX_CONF_UNSET;
    conf->hide_headers = NGX_CONF_UNSET_PTR;
    conf->pass_headers = NGX_CONF_UNSET_PTR;
    conf->metrics_zone = NGX_CONF_UNSET_UINT;
    conf->on_redis_error = NGX_CONF_UNSET_UINT;
    conf->on_unknown = NGX_CONF_UNSET_UINT;
    conf->dry_run = NGX_CONF_UNSET;
    conf->secret = NGX_CONF_UNSET_PTR;
    conf->fresh_detect = NGX_CONF_UNSET_MSEC;
    conf->encrypt_keys = NGX_CONF_UNSET_PTR;
    conf->problem_error_member = NGX_CONF_UNSET;
    conf->retry_hints = NGX_CONF_UNSET;
    conf->expires_header = NGX_CONF_UNSET;
    conf->tls_verify = NGX_CONF_UNSET;
    conf->redis_wait = NGX_CONF_UNSET_UINT;
    conf->redis_wait_timeout = NGX_CONF_UNSET_MSEC;

    return conf;
}


static char *
ngx_http_idempotency_merge_loc_conf(ngx_conf_t *cf, void *parent,
    void *child)
{
    ngx_http_idempotency_loc_conf_t *prev = parent;
    ngx_http_idempotency_loc_conf_t *conf = child;

    ngx_str_t                          addr;
    ngx_http_core_loc_conf_t          *clcf;
    ngx_http_idempotency_tls_conf_t    tc;
    ngx_http_idempotency_main_conf_t  *imcf;

    ngx_conf_merge_value(conf->enable, prev->enable, 0);
    ngx_conf_merge_msec_value(conf->redis_timeout, prev->redis_timeout,
                              1000);
    ngx_conf_merge_str_value(conf->prefix, prev->prefix, "idem:");
    ngx_conf_merge_ptr_value(conf->key, prev->key, NULL);
    ngx_conf_merge_size_value(conf->key_max_length, prev->key_max_length,
                              255);

    ngx_conf_merge_ptr_value(conf->key_pattern, prev->key_pattern, NULL);
    ngx_conf_merge_ptr_value(conf->json_pointer, prev->json_pointer, NULL);
    ngx_conf_merge_ptr_value(conf->scope, prev->scope, NULL);
    ngx_conf_merge_bitmask_value(conf->methods, prev->methods,
                                 (NGX_CONF_BITMASK_SET
                                  |NGX_HTTP_POST|NGX_HTTP_PATCH));

    /* the "set" bit is NGX_HTTP_UNKNOWN's: unknown methods are never ours */
    conf->methods &= ~NGX_CONF_BITMASK_SET;
    ngx_conf_merge_value(conf->required, prev->required, 0);
    ngx_conf_merge_msec_value(conf->ttl, prev->ttl, 86400000);
    ngx_conf_merge_msec_value(conf->lock_ttl, prev->lock_ttl, 120000);
    ngx_conf_merge_msec_value(conf->wait, prev->wait, 0);
    ngx_conf_merge_ptr_value(conf->store_status, prev->store_status, NULL);
    ngx_conf_merge_size_value(conf->store_max_size, prev->store_max_size,
                              1024 * 1024);
    ngx_conf_merge_value(conf->store_immediate, prev->store_immediate, 0);
    ngx_conf_merge_ptr_value(conf->hide_headers, prev->hide_headers, NULL);
    ngx_conf_merge_ptr_value(conf->pass_headers, prev->pass_headers, NULL);
    ngx_conf_merge_uint_value(conf->metrics_zone, prev->metrics_zone, 0);
    ngx_conf_merge_uint_value(conf->on_redis_error, prev->on_redis_error,
                              NGX_HTTP_IDEMPOTENCY_ON_ERROR_REJECT);
    ngx_conf_merge_uint_value(conf->on_unknown, prev->on_unknown,
                              NGX_HTTP_IDEMPOTENCY_ON_UNKNOWN_KEEP);
    ngx_conf_merge_str_value(conf->problem_base_uri, prev->problem_base_uri,
                             "");
    ngx_conf_merge_value(conf->dry_run, prev->dry_run, 0);
    ngx_conf_merge_ptr_value(conf->secret, prev->secret, NULL);
    ngx_conf_merge_msec_value(conf->fresh_detect, prev->fresh_detect, 0);
    ngx_conf_merge_ptr_value(conf->encrypt_keys, prev->encrypt_keys, NULL);
    ngx_conf_merge_value(conf->problem_error_member,
                         prev->problem_error_member, 1);
    ngx_conf_merge_value(conf->retry_hints, prev->retry_hints, 1);
    ngx_conf_merge_value(conf->expires_header, prev->expires_header, 0);

    if (conf->redis == NULL) {
        conf->redis = prev->redis;
        conf->redis_default = prev->redis_default;
    }

    if (conf->redis == NULL) {
        imcf = ngx_http_conf_get_module_main_conf(cf,
                                                  ngx_http_idempotency_module);

        if (imcf->default_server == NULL) {
            ngx_str_set(&addr, "127.0.0.1:6379");
            imcf->default_server = ngx_http_idempotency_target_add(cf,
                                     &imcf->servers, &addr, 0, NULL, NULL, 0);
            if (imcf->default_server == NULL) {
                return NGX_CONF_ERROR;
            }
        }

        conf->redis = imcf->default_server;
        conf->redis_default = 1;
        prev->redis = imcf->default_server;
        prev->redis_default = 1;
    }

    if (conf->enable && conf->wait) {
        imcf = ngx_http_conf_get_module_main_conf(cf,
                                                  ngx_http_idempotency_module);
        imcf->wakeups = 1;
    }

    if (ngx_http_idempotency_admin_merge(cf, conf) != NGX_CONF_OK) {
        return NGX_CONF_ERROR;
    }

    if (conf->enable || conf->admin) {
        conf->redis->used = 1;

        /* a longer reply is a protocol error (input.c) */
        conf->redis->reply_max = ngx_max(conf->redis->reply_max,
                                         conf->store_max_size
                                         + NGX_HTTP_IDEMPOTENCY_SEAL_MAX);

        if (conf->redis->timeout == 0
            || conf->redis_timeout < conf->redis->timeout)
        {
            conf->redis->timeout = conf->redis_timeout;
        }
    }

    if (ngx_http_idempotency_wait_merge(cf, prev, conf) != NGX_CONF_OK) {
        return NGX_CONF_ERROR;
    }

    ngx_http_idempotency_claim_conf(conf);

    ngx_conf_merge_value(conf->tls_verify, prev->tls_verify, 1);
    ngx_conf_merge_str_value(conf->tls_trusted_certificate,
                             prev->tls_trusted_certificate, "");
    ngx_conf_merge_str_value(conf->tls_name, prev->tls_name, "");
    ngx_conf_merge_str_value(conf->tls_certificate, prev->tls_certificate,
                             "");
    ngx_conf_merge_str_value(conf->tls_certificate_key,
                             prev->tls_certificate_key, "");

    /* the http resolver of the place, if it has one */

    clcf = ngx_http_conf_get_module_loc_conf(cf, ngx_http_core_module);

    if (conf->redis->topology->conf
        && conf->redis->topology->conf(cf, conf->redis,
                                       clcf->resolver
                                       && ngx_http_idempotency_resolver_set(
                                              clcf->resolver)
                                       ? clcf->resolver : NULL,
                                       clcf->resolver_timeout)
           != NGX_OK)
    {
        return NGX_CONF_ERROR;
    }

    tc.verify = conf->tls_verify;
    tc.trusted_certificate = conf->tls_trusted_certificate;
    tc.name = conf->tls_name;
    tc.certificate = conf->tls_certificate;
    tc.certificate_key = conf->tls_certificate_key;

    if (ngx_http_idempotency_tls_merge(cf, conf->redis, &tc) != NGX_CONF_OK) {
        return NGX_CONF_ERROR;
    }

    ngx_http_idempotency_warn(cf, conf);

    return NGX_CONF_OK;
}


static char *
ngx_http_idempotency_redis_directive(ngx_conf_t *cf,
    ngx_command_t *cmd, void *conf)
{
    ngx_http_idempotency_loc_conf_t *ilcf = conf;

    ngx_uint_t                         tls;
    ngx_http_idempotency_main_conf_t  *imcf;

    if (ilcf->redis) {
        return "is duplicate";
    }

    /* the Redis client speaks TLS with the http module's OpenSSL build */
#if (NGX_HTTP_SSL)
    tls = 1;
#else
    tls = 0;
#endif

    imcf = ngx_http_conf_get_module_main_conf(cf, ngx_http_idempotency_module);

    ilcf->redis = ngx_http_idempotency_target_conf(cf, &imcf->servers, tls);

    return ilcf->redis ? NGX_CONF_OK : NGX_CONF_ERROR;
}


static ngx_int_t
ngx_http_idempotency_init(ngx_conf_t *cf)
{
    ngx_http_handler_pt        *h;
    ngx_http_core_main_conf_t  *cmcf;

    cmcf = ngx_http_conf_get_module_main_conf(cf, ngx_http_core_module);

    /*
     * precontent runs after every access check (allow/deny, auth_basic,
     * auth_request, satisfy), so refused requests never touch Redis
     */

    h = ngx_array_push(&cmcf->phases[NGX_HTTP_PRECONTENT_PHASE].handlers);
    if (h == NULL) {
        return NGX_ERROR;
    }

    *h = ngx_http_idempotency_handler;

    ngx_http_idempotency_next_header = ngx_http_top_header_filter;
    ngx_http_top_header_filter = ngx_http_idempotency_header_filter;

    ngx_http_idempotency_next_body = ngx_http_top_body_filter;
    ngx_http_top_body_filter = ngx_http_idempotency_body_filter;

    ngx_http_idempotency_next_request_body = ngx_http_top_request_body_filter;
    ngx_http_top_request_body_filter = ngx_http_idempotency_request_body_filter;

    if (ngx_http_idempotency_script_init() != NGX_OK) {
        return NGX_ERROR;
    }

    /* every op of the client can be the store's */
    ngx_http_idempotency_op_size = sizeof(ngx_http_idempotency_key_op_t);

    if (ngx_http_idempotency_metrics_init(cf) != NGX_OK) {
        return NGX_ERROR;
    }

    return NGX_OK;
}


static ngx_int_t
ngx_http_idempotency_init_process(ngx_cycle_t *cycle)
{
    ngx_uint_t                          i;
    ngx_http_idempotency_target_t      **rp;
    ngx_http_idempotency_main_conf_t   *imcf;

    imcf = ngx_http_cycle_get_module_main_conf(cycle,
                                               ngx_http_idempotency_module);
    if (imcf == NULL) {
        return NGX_OK;
    }

    if (ngx_http_idempotency_hash_init(cycle) != NGX_OK
        || ngx_http_idempotency_claim_init(cycle->log) != NGX_OK)
    {
        return NGX_ERROR;
    }

    rp = imcf->servers.elts;
    for (i = 0; i < imcf->servers.nelts; i++) {
        /*
         * the whole configuration's, not the target's: keys may be shared
         * by locations on targets that name the same server
         */
        rp[i]->quiet = !imcf->wakeups;

        if (rp[i]->used
            && ngx_http_idempotency_redis_init(cycle, rp[i]) != NGX_OK)
        {
            return NGX_ERROR;
        }
    }

    return NGX_OK;
}


static void
ngx_http_idempotency_exit_process(ngx_cycle_t *cycle)
{
    ngx_uint_t                          i;
    ngx_http_idempotency_target_t      **rp;
    ngx_http_idempotency_main_conf_t   *imcf;

    imcf = ngx_http_cycle_get_module_main_conf(cycle,
                                               ngx_http_idempotency_module);
    if (imcf == NULL) {
        return;
    }

    rp = imcf->servers.elts;
    for (i = 0; i < imcf->servers.nelts; i++) {
        if (rp[i]->used) {
            ngx_http_idempotency_redis_exit(rp[i]);
        }
    }

    ngx_http_idempotency_retry_exit();
    ngx_http_idempotency_ops_done();
    ngx_http_idempotency_hash_done();
}
