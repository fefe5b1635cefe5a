
/*
 * Copyright (C) The ngx_http_idempotency_module authors
 *
 * The values of the module's directives, as nginx -t reads them: the
 * parsers of the directives that take more than a flag, a size or a time,
 * their bounds, and the warnings a merged location gets when its settings
 * contradict each other.  Each message names the directive, the value and
 * what it may be, at the directive's own line.
 */


#include "ngx_http_idempotency_module.h"


/* "0 aof" is on: WAITAOF for the primary's fsync alone */
#define ngx_http_idempotency_wait_on(conf)                                    \
    ((conf)->redis_wait || (conf)->redis_wait_aof)


static void ngx_http_idempotency_wait_conf_error(ngx_conf_t *cf,
    ngx_http_idempotency_loc_conf_t *conf, const char *fmt, ...);


/*
 * nginx -t warnings, once per location: not for http{} and server{}, whose
 * settings the locations inherit, nor for "if" and "limit_except" blocks,
 * which cannot set these directives.  They name the location's own line.
 *
 * An upstream slower than idempotency_lock_ttl keeps its claim (the lease
 * is renewed every third of it), so the lock no longer has to outlast
 * proxy_read_timeout.  What still matters: a renewal that waits
 * idempotency_redis_timeout must land before the lease ends, or a live
 * owner's key reads as an unknown outcome.
 */

void
ngx_http_idempotency_warn(ngx_conf_t *cf,
    ngx_http_idempotency_loc_conf_t *conf)
{
    u_char                     lock[NGX_INT64_LEN + 2];
    u_char                     other[NGX_INT64_LEN + 2];
    size_t                     lock_len, other_len;
    ngx_uint_t                 slow, short_ttl, long_wait;
    ngx_conf_file_t            file, *saved;
    ngx_http_core_loc_conf_t  *clcf;

    clcf = ngx_http_conf_get_module_loc_conf(cf, ngx_http_core_module);

    if (!conf->enable || clcf->name.len == 0 || clcf->noname) {
        return;
    }

    slow = (conf->lock_ttl < 3 * conf->redis_timeout);
    short_ttl = (conf->ttl < conf->lock_ttl);
    long_wait = (conf->wait > conf->lock_ttl);

    if (!conf->redis_default && !slow && !short_ttl && !long_wait) {
        return;
    }

    saved = cf->conf_file;

    if (saved && conf->conf_file.data) {
        file = *saved;
        file.file.name = conf->conf_file;
        file.line = conf->conf_line;
        cf->conf_file = &file;
    }

    if (conf->redis_default) {
        ngx_conf_log_error(NGX_LOG_WARN, cf, 0,
                           "\"idempotency\" is on in location \"%V\" "
                           "without \"idempotency_redis\": using the default "
                           "%V", &clcf->name, &conf->redis->name);
    }

    lock_len = ngx_http_idempotency_msec_text(lock, conf->lock_ttl);

    if (slow) {
        other_len = ngx_http_idempotency_msec_text(other,
                                                   conf->redis_timeout);

        ngx_conf_log_error(NGX_LOG_WARN, cf, 0,
                           "\"idempotency_lock_ttl\" %*s is shorter than "
                           "three times \"idempotency_redis_timeout\" %*s "
                           "in location \"%V\": a slow renewal can land "
                           "after the lease ended, and a retry is then told "
                           "the outcome is unknown while the request still "
                           "runs", lock_len, lock, other_len, other,
                           &clcf->name);
    }

    /*
     * Legal, and sometimes meant (a short ttl dedups only retries that
     * come at once), so warned rather than refused; see directives.md
     */

    if (short_ttl) {
        other_len = ngx_http_idempotency_msec_text(other, conf->ttl);

        ngx_conf_log_error(NGX_LOG_WARN, cf, 0,
                           "\"idempotency_ttl\" %*s is shorter than "
                           "\"idempotency_lock_ttl\" %*s in location "
                           "\"%V\": a response is kept for less time than "
                           "its request may hold the key, and a retry that "
                           "comes later runs the request again", other_len,
                           other, lock_len, lock, &clcf->name);
    }

    if (long_wait) {
        other_len = ngx_http_idempotency_msec_text(other, conf->wait);

        ngx_conf_log_error(NGX_LOG_WARN, cf, 0,
                           "\"idempotency_wait\" %*s is longer than "
                           "\"idempotency_lock_ttl\" %*s in location "
                           "\"%V\": waiting out the lock does not free the "
                           "key, a dead owner's claim becomes an unknown "
                           "outcome (idempotency_on_unknown), and until then "
                           "the duplicate holds its connection", other_len,
                           other, lock_len, lock, &clcf->name);
    }

    cf->conf_file = saved;
}


char *
ngx_http_idempotency_prefix_directive(ngx_conf_t *cf,
    ngx_command_t *cmd, void *conf)
{
    ngx_str_t  *value, *prefix;
    u_char     *p;

    prefix = (ngx_str_t *) ((char *) conf + cmd->offset);

    if (prefix->data) {
        return "is duplicate";
    }

    value = cf->args->elts;

    if (value[1].len > NGX_HTTP_IDEMPOTENCY_PREFIX_MAX) {
        ngx_conf_log_error(NGX_LOG_EMERG, cf, 0,
                           "prefix \"%V\" is longer than %d bytes",
                           &value[1], NGX_HTTP_IDEMPOTENCY_PREFIX_MAX);
        return NGX_CONF_ERROR;
    }

    for (p = value[1].data; p < value[1].data + value[1].len; p++) {
        if (*p <= ' ' || *p >= 0x7f || *p == '{' || *p == '}') {
            ngx_conf_log_error(NGX_LOG_EMERG, cf, 0,
                               "prefix \"%V\" must be printable ASCII "
                               "without spaces or braces", &value[1]);
            return NGX_CONF_ERROR;
        }
    }

    *prefix = value[1];

    return NGX_CONF_OK;
}


char *
ngx_http_idempotency_store_status_directive(ngx_conf_t *cf, ngx_command_t *cmd,
    void *conf)
{
    ngx_http_idempotency_loc_conf_t *ilcf = conf;

    ngx_str_t   *value;
    ngx_int_t    n;
    ngx_uint_t   i, *code;

    if (ilcf->store_status != NGX_CONF_UNSET_PTR) {
        return "is duplicate";
    }

    ilcf->store_status = ngx_array_create(cf->pool, cf->args->nelts - 1,
                                          sizeof(ngx_uint_t));
    if (ilcf->store_status == NULL) {
        return NGX_CONF_ERROR;
    }

    value = cf->args->elts;

    for (i = 1; i < cf->args->nelts; i++) {

        /* a class "2xx" is stored as 2, a code as itself */

        if (value[i].len == 3
            && value[i].data[0] >= '1' && value[i].data[0] <= '5'
            && (value[i].data[1] | 0x20) == 'x'
            && (value[i].data[2] | 0x20) == 'x')
        {
            n = value[i].data[0] - '0';

        } else {
            n = ngx_atoi(value[i].data, value[i].len);
            if (n < 100 || n > 599) {
                ngx_conf_log_error(NGX_LOG_EMERG, cf, 0,
                                   "invalid status \"%V\": expected a code "
                                   "from 100 to 599 or a class such as 2xx",
                                   &value[i]);
                return NGX_CONF_ERROR;
            }
        }

        code = ngx_array_push(ilcf->store_status);
        if (code == NULL) {
            return NGX_CONF_ERROR;
        }

        *code = n;
    }

    return NGX_CONF_OK;
}


/* says which methods are allowed, where the bitmask slot would not */

char *
ngx_http_idempotency_methods_directive(ngx_conf_t *cf,
    ngx_command_t *cmd, void *conf)
{
    ngx_str_t           *value;
    ngx_uint_t           i, m;
    ngx_conf_bitmask_t  *mask;

    value = cf->args->elts;
    mask = cmd->post;

    for (i = 1; i < cf->args->nelts; i++) {

        for (m = 0; mask[m].name.len; m++) {
            if (mask[m].name.len == value[i].len
                && ngx_strcasecmp(mask[m].name.data, value[i].data) == 0)
            {
                break;
            }
        }

        if (mask[m].name.len == 0) {
            ngx_conf_log_error(NGX_LOG_EMERG, cf, 0,
                               "\"%V\" does not accept \"%V\": the methods "
                               "allowed are POST, PUT, PATCH and DELETE",
                               &value[0], &value[i]);
            return NGX_CONF_ERROR;
        }
    }

    return ngx_conf_set_bitmask_slot(cf, cmd, conf);
}


/*
 * Names the directive and its values, where the enum slot says only
 * "invalid value" (nginx adds the directive's name to the errors that
 * handlers return as text, not to those they log)
 */

char *
ngx_http_idempotency_enum_slot(ngx_conf_t *cf, ngx_command_t *cmd, void *conf)
{
    u_char           *p, *last, values[128];
    ngx_str_t        *value;
    ngx_uint_t        i;
    ngx_conf_enum_t  *e;

    value = cf->args->elts;
    e = cmd->post;

    for (i = 0; e[i].name.len; i++) {
        if (e[i].name.len == value[1].len
            && ngx_strcasecmp(e[i].name.data, value[1].data) == 0)
        {
            return ngx_conf_set_enum_slot(cf, cmd, conf);
        }
    }

    /* "a" or "b"; "a", "b" or "c" */

    p = values;
    last = values + sizeof(values);

    for (i = 0; e[i].name.len; i++) {
        p = ngx_slprintf(p, last, "%s\"%V\"",
                         i == 0 ? "" : e[i + 1].name.len ? ", " : " or ",
                         &e[i].name);
    }

    ngx_conf_log_error(NGX_LOG_EMERG, cf, 0,
                       "\"%V\" must be %*s, not \"%V\"",
                       &cmd->name, p - values, values, &value[1]);

    return NGX_CONF_ERROR;
}


char *
ngx_http_idempotency_check_msec(ngx_conf_t *cf, void *post, void *data)
{
    ngx_conf_num_bounds_t  *bounds = post;
    ngx_msec_t             *ms = data;

    u_char      min[NGX_INT64_LEN + 2];
    size_t      len;
    ngx_str_t  *value;

    if (*ms >= (ngx_msec_t) bounds->low) {
        return NGX_CONF_OK;
    }

    value = cf->args->elts;
    len = ngx_http_idempotency_msec_text(min, bounds->low);

    ngx_conf_log_error(NGX_LOG_EMERG, cf, 0,
                       "\"%V\" must be at least %*s, not \"%V\"",
                       &value[0], len, min, &value[1]);

    return NGX_CONF_ERROR;
}


char *
ngx_http_idempotency_check_size(ngx_conf_t *cf, void *post, void *data)
{
    ngx_conf_num_bounds_t  *bounds = post;
    size_t                 *sp = data;

    ngx_str_t  *value;

    if (*sp >= (size_t) bounds->low && *sp <= (size_t) bounds->high) {
        return NGX_CONF_OK;
    }

    value = cf->args->elts;

    ngx_conf_log_error(NGX_LOG_EMERG, cf, 0,
                       "\"%V\" must be between %i and %i, not \"%V\"",
                       &value[0], bounds->low, bounds->high, &value[1]);

    return NGX_CONF_ERROR;
}


/* a time as an operator would write it: "1s", "250ms" */

size_t
ngx_http_idempotency_msec_text(u_char *buf, ngx_msec_t ms)
{
    if (ms % 1000) {
        return ngx_sprintf(buf, "%Mms", ms) - buf;
    }

    return ngx_sprintf(buf, "%Ms", ms / 1000) - buf;
}


char *
ngx_http_idempotency_header_list_slot(ngx_conf_t *cf, ngx_command_t *cmd,
    void *conf)
{
    ngx_str_t     *value, *name;
    ngx_array_t  **a;

    a = (ngx_array_t **) ((char *) conf + cmd->offset);

    if (*a == NGX_CONF_UNSET_PTR) {
        *a = ngx_array_create(cf->pool, 2, sizeof(ngx_str_t));
        if (*a == NULL) {
            return NGX_CONF_ERROR;
        }
    }

    value = cf->args->elts;

    name = ngx_array_push(*a);
    if (name == NULL) {
        return NGX_CONF_ERROR;
    }

    name->len = value[1].len;
    name->data = ngx_pnalloc(cf->pool, name->len);
    if (name->data == NULL) {
        return NGX_CONF_ERROR;
    }

    ngx_strlow(name->data, value[1].data, name->len);

    return NGX_CONF_OK;
}


/* idempotency_redis_wait off | N [TIMEOUT] [aof] */

char *
ngx_http_idempotency_redis_wait_directive(ngx_conf_t *cf, ngx_command_t *cmd,
    void *conf)
{
    ngx_http_idempotency_loc_conf_t *ilcf = conf;

    ngx_int_t   n;
    ngx_str_t  *value;
    ngx_uint_t  nelts, aof;
    ngx_msec_t  timeout;

    if (ilcf->redis_wait != NGX_CONF_UNSET_UINT) {
        return "is duplicate";
    }

    /* the timeout is checked at merge, at the end of http{}: name this */

    if (cf->conf_file) {
        ilcf->redis_wait_file = cf->conf_file->file.name;
        ilcf->redis_wait_line = cf->conf_file->line;
    }

    value = cf->args->elts;
    nelts = cf->args->nelts;

    if (value[1].len == 3 && ngx_strncmp(value[1].data, "off", 3) == 0) {

        if (nelts > 2) {
            ngx_conf_log_error(NGX_LOG_EMERG, cf, 0,
                               "\"idempotency_redis_wait off\" takes no "
                               "timeout, not \"%V\"", &value[2]);
            return NGX_CONF_ERROR;
        }

        ilcf->redis_wait = 0;
        ilcf->redis_wait_aof = 0;
        ilcf->redis_wait_timeout = 100;
        return NGX_CONF_OK;
    }

    aof = 0;

    if (nelts > 2 && value[nelts - 1].len == 3
        && ngx_strncmp(value[nelts - 1].data, "aof", 3) == 0)
    {
        aof = 1;
        nelts--;
    }

    if (nelts > 3) {
        ngx_conf_log_error(NGX_LOG_EMERG, cf, 0,
                           "invalid parameter \"%V\" of \"%V\": expected "
                           "off, or N [TIMEOUT] [aof]", &value[3], &cmd->name);
        return NGX_CONF_ERROR;
    }

    n = ngx_atoi(value[1].data, value[1].len);

    /* WAIT 0 asks for nothing; WAITAOF 1 0 for the primary's own fsync */

    if (n == NGX_ERROR || (n == 0 && !aof)) {
        ngx_conf_log_error(NGX_LOG_EMERG, cf, 0,
                           "\"idempotency_redis_wait\" expects \"off\" or "
                           "a number of replicas of 1 or more (0 or more "
                           "with \"aof\"), not \"%V\"", &value[1]);
        return NGX_CONF_ERROR;
    }

    timeout = 100;

    if (nelts == 3) {
        timeout = ngx_parse_time(&value[2], 0);

        /* WAIT with 0 blocks the connection for ever */

        if (timeout == (ngx_msec_t) NGX_ERROR || timeout == 0) {
            ngx_conf_log_error(NGX_LOG_EMERG, cf, 0,
                               "\"idempotency_redis_wait\" timeout must be "
                               "at least 1ms, not \"%V\"", &value[2]);
            return NGX_CONF_ERROR;
        }
    }

    ilcf->redis_wait = n;
    ilcf->redis_wait_aof = aof;
    ilcf->redis_wait_timeout = timeout;

    return NGX_CONF_OK;
}


/*
 * The claim's deadline is idempotency_redis_timeout, and WAIT holds the
 * connection for up to its TIMEOUT: a TIMEOUT that does not fit in it would
 * turn every unacknowledged claim into a timeout and a reconnect.  The
 * connection's watchdog is the smallest idempotency_redis_timeout of the
 * places that use the target, so every WAIT on it must fit in that too;
 * checked whenever either changes, so the last merge sees both final.
 */

char *
ngx_http_idempotency_wait_merge(ngx_conf_t *cf,
    ngx_http_idempotency_loc_conf_t *prev,
    ngx_http_idempotency_loc_conf_t *conf)
{
    ngx_http_idempotency_target_t *redis;

    if (conf->redis_wait == NGX_CONF_UNSET_UINT) {
        conf->redis_wait_aof = prev->redis_wait_aof;
        conf->redis_wait_file = prev->redis_wait_file;
        conf->redis_wait_line = prev->redis_wait_line;
    }

    ngx_conf_merge_uint_value(conf->redis_wait, prev->redis_wait, 0);
    ngx_conf_merge_msec_value(conf->redis_wait_timeout,
                              prev->redis_wait_timeout, 100);

    if (ngx_http_idempotency_wait_on(conf)
        && conf->redis_wait_timeout >= conf->redis_timeout)
    {
        ngx_http_idempotency_wait_conf_error(cf, conf,
                           "the \"idempotency_redis_wait\" timeout (%M ms) "
                           "must be shorter than \"idempotency_redis_timeout\""
                           " (%M ms)", conf->redis_wait_timeout,
                           conf->redis_timeout);
        return NGX_CONF_ERROR;
    }

    if (!conf->enable) {
        return NGX_CONF_OK;
    }

    redis = conf->redis;

    if (ngx_http_idempotency_wait_on(conf)
        && conf->redis_wait_timeout > redis->wait_timeout)
    {
        redis->wait_timeout = conf->redis_wait_timeout;
    }

    if (redis->wait_timeout && redis->wait_timeout >= redis->timeout) {
        ngx_http_idempotency_wait_conf_error(cf, conf,
                           "an \"idempotency_redis_wait\" timeout (%M ms) "
                           "on redis \"%V\" must be shorter than the "
                           "smallest \"idempotency_redis_timeout\" (%M ms) "
                           "of the places that use it",
                           redis->wait_timeout, &redis->name, redis->timeout);
        return NGX_CONF_ERROR;
    }

    return NGX_CONF_OK;
}


/*
 * Merging runs at the end of http{}, where ngx_conf_log_error() would
 * point: name the line of idempotency_redis_wait, or else of the location
 * whose idempotency_redis_timeout is too short for a WAIT elsewhere.
 */

static void
ngx_http_idempotency_wait_conf_error(ngx_conf_t *cf,
    ngx_http_idempotency_loc_conf_t *conf, const char *fmt, ...)
{
    u_char      *p, errstr[NGX_MAX_CONF_ERRSTR];
    va_list      args;
    ngx_str_t   *file;
    ngx_uint_t   line;

    va_start(args, fmt);
    p = ngx_vslprintf(errstr, errstr + NGX_MAX_CONF_ERRSTR, fmt, args);
    va_end(args);

    file = &conf->redis_wait_file;
    line = conf->redis_wait_line;

    if (line == 0 || !ngx_http_idempotency_wait_on(conf)) {
        file = &conf->conf_file;
        line = conf->conf_line;
    }

    if (line == 0) {
        ngx_conf_log_error(NGX_LOG_EMERG, cf, 0, "%*s", p - errstr, errstr);
        return;
    }

    ngx_log_error(NGX_LOG_EMERG, cf->log, 0, "%*s in %V:%ui",
                  p - errstr, errstr, file, line);
}


/* what every claim of the location is, set once here, not per request */

void
ngx_http_idempotency_claim_conf(ngx_http_idempotency_loc_conf_t *conf)
{
    ngx_http_idempotency_claim_conf_t  *cc;

    cc = &conf->claim;

    cc->redis = conf->redis;
    cc->keys = conf->encrypt_keys;
    cc->lock_ttl = conf->lock_ttl;
    cc->ttl = conf->ttl;
    cc->timeout = conf->redis_timeout;
    cc->wait = conf->dry_run ? 0 : conf->wait;
    cc->replicas = conf->redis_wait;
    cc->replicas_timeout = conf->redis_wait_timeout;
    cc->zone = conf->metrics_zone;
    cc->on_unknown = conf->on_unknown;
    cc->replicas_on = ngx_http_idempotency_wait_on(conf);
    cc->aof = conf->redis_wait_aof ? 1 : 0;
    cc->immediate = conf->store_immediate ? 1 : 0;
    cc->dry_run = conf->dry_run ? 1 : 0;
    cc->passes = (conf->on_redis_error == NGX_HTTP_IDEMPOTENCY_ON_ERROR_PASS);
}


/*
 * idempotency_key_pattern REGEX: the keys this API accepts (a UUID, a
 * minimum length), as PCRE, a search as "map" makes it: anchored where the
 * pattern says ^ and $.  Checked on the decoded key.
 */

char *
ngx_http_idempotency_key_pattern_directive(ngx_conf_t *cf, ngx_command_t *cmd,
    void *conf)
{
#if (NGX_PCRE)
    ngx_http_idempotency_loc_conf_t *ilcf = conf;

    ngx_str_t                           *value;
    ngx_regex_compile_t                  rc;
    ngx_http_idempotency_key_pattern_t  *kp;
    u_char                               errstr[NGX_MAX_CONF_ERRSTR];

    if (ilcf->key_pattern != NGX_CONF_UNSET_PTR) {
        return "is duplicate";
    }

    value = cf->args->elts;

    if (value[1].len == 0) {
        return "takes a regular expression, not an empty string";
    }

    ngx_memzero(&rc, sizeof(ngx_regex_compile_t));

    rc.pattern = value[1];
    rc.pool = cf->pool;
    rc.err.len = NGX_MAX_CONF_ERRSTR;
    rc.err.data = errstr;

    if (ngx_regex_compile(&rc) != NGX_OK) {
        ngx_conf_log_error(NGX_LOG_EMERG, cf, 0, "\"%V\": %V", &cmd->name,
                           &rc.err);
        return NGX_CONF_ERROR;
    }

    kp = ngx_palloc(cf->pool, sizeof(ngx_http_idempotency_key_pattern_t));
    if (kp == NULL) {
        return NGX_CONF_ERROR;
    }

    kp->regex = rc.regex;
    kp->text = value[1];
    ilcf->key_pattern = kp;

    return NGX_CONF_OK;

#else

    ngx_conf_log_error(NGX_LOG_EMERG, cf, 0,
                       "\"%V\" requires nginx built with PCRE", &cmd->name);
    return NGX_CONF_ERROR;

#endif
}


/*
 * idempotency_key_json_pointer POINTER | off: the key is that member of
 * the request's JSON body (RFC 6901), in place of the header's; "off"
 * stops an inherited one (a pointer always starts with "/")
 */

char *
ngx_http_idempotency_key_json_pointer_directive(ngx_conf_t *cf,
    ngx_command_t *cmd, void *conf)
{
    ngx_http_idempotency_loc_conf_t *ilcf = conf;

    char                                 *err;
    ngx_str_t                            *value;
    ngx_http_idempotency_json_pointer_t  *ptr;

    if (ilcf->json_pointer != NGX_CONF_UNSET_PTR) {
        return "is duplicate";
    }

    value = cf->args->elts;

    if (value[1].len == 3 && ngx_strncmp(value[1].data, "off", 3) == 0) {
        ilcf->json_pointer = NULL;
        return NGX_CONF_OK;
    }

    ptr = ngx_palloc(cf->pool, sizeof(ngx_http_idempotency_json_pointer_t));
    if (ptr == NULL) {
        return NGX_CONF_ERROR;
    }

    err = NULL;

    if (ngx_http_idempotency_json_pointer_parse(cf->pool, &value[1], ptr,
                                                &err)
        != NGX_OK)
    {
        if (err) {
            ngx_conf_log_error(NGX_LOG_EMERG, cf, 0,
                               "invalid JSON pointer \"%V\" in \"%V\": %s",
                               &value[1], &cmd->name, err);
        }

        return NGX_CONF_ERROR;
    }

    ilcf->json_pointer = ptr;

    return NGX_CONF_OK;
}
