
/*
 * Copyright (C) The ngx_http_idempotency_module authors
 *
 * What an operator reads of a key, or purges: the record as it is and its
 * time to live, or the record deleted unless a claim is in progress.
 */


#include "ngx_http_idempotency_store.h"


/*
 * purge: KEYS[1] the record key, ARGV[1] "1" to purge an in-progress
 * claim too.  0: no record; -1: in progress, not purged; 1: purged.  A
 * claim is in progress unless it is an unknown outcome (0xC1 'U' at 45).
 */

static ngx_str_t  ngx_http_idempotency_purge_script = ngx_string(
    "local h = redis.call('GETRANGE', KEYS[1], 0, 52)\n"
    "if h == '' then return 0 end\n"
    "if ARGV[1] ~= '1' and string.byte(h, 5) == 1\n"
    "   and string.sub(h, 46, 47) ~= '\\193U' then\n"
    "  return -1\n"
    "end\n"
    "redis.call('DEL', KEYS[1])\n"
    "return 1\n"
);


/* the record as Redis holds it: nil, a claim, an unknown outcome, done */

ngx_int_t
ngx_http_idempotency_fetch_command(ngx_http_idempotency_op_t *op,
    ngx_str_t *rkey)
{
    size_t       argvlen[2];
    const char  *argv[2];

    argv[0] = "GET";
    argvlen[0] = 3;
    argv[1] = (const char *) rkey->data;
    argvlen[1] = rkey->len;

    return ngx_http_idempotency_redis_command(op, 2, argv, argvlen);
}


/* its time to live, in milliseconds: -2 gone, -1 none */

ngx_int_t
ngx_http_idempotency_fetch_ttl_command(ngx_http_idempotency_op_t *op,
    ngx_str_t *rkey)
{
    size_t       argvlen[2];
    const char  *argv[2];

    argv[0] = "PTTL";
    argvlen[0] = 4;
    argv[1] = (const char *) rkey->data;
    argvlen[1] = rkey->len;

    return ngx_http_idempotency_redis_command(op, 2, argv, argvlen);
}


ngx_int_t
ngx_http_idempotency_purge_command(ngx_http_idempotency_op_t *op,
    ngx_str_t *rkey, ngx_uint_t force)
{
    size_t       argvlen[5];
    const char  *argv[5];

    argv[0] = "EVAL";
    argvlen[0] = 4;
    argv[1] = (const char *) ngx_http_idempotency_purge_script.data;
    argvlen[1] = ngx_http_idempotency_purge_script.len;
    argv[2] = "1";
    argvlen[2] = 1;
    argv[3] = (const char *) rkey->data;
    argvlen[3] = rkey->len;
    argv[4] = force ? "1" : "0";
    argvlen[4] = 1;

    return ngx_http_idempotency_redis_command(op, 5, argv, argvlen);
}
