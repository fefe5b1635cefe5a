
/*
 * Copyright (C) The ngx_http_idempotency_module authors
 *
 * The two Lua scripts that make every Redis step atomic.
 */


#include "ngx_http_idempotency_module.h"


/*
 * claim: KEYS[1] record key, ARGV[1] claim record, ARGV[2] lock ttl (ms).
 * Returns nil when the claim was created, else the existing record.  A key
 * of another type makes GET fail, which the module treats as a Redis error.
 */

ngx_str_t  ngx_http_idempotency_claim_script = ngx_string(
    "local v = redis.call('GET', KEYS[1])\n"
    "if v then return v end\n"
    "redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])\n"
    "return false\n"
);


/*
 * finish: KEYS[1] record key, ARGV[1] our claim record, ARGV[2] the final
 * record (empty: release), ARGV[3] ttl (ms).  Only the owner of the claim
 * may finish it: after lock_ttl another request may own the key.  A store
 * sent again after a lost connection finds its own record: done.  Waiting
 * duplicates are woken on the key's own channel (notify.c); pcall: Redis 6
 * has no SPUBLISH, an ACL may forbid it, neither fails the store.
 */

ngx_str_t  ngx_http_idempotency_finish_script = ngx_string(
    "local v = redis.call('GET', KEYS[1])\n"
    "if v and v == ARGV[2] then return 1 end\n"
    "if v ~= ARGV[1] then return 0 end\n"
    "if ARGV[2] == '' then\n"
    "  redis.call('DEL', KEYS[1])\n"
    "else\n"
    "  redis.call('SET', KEYS[1], ARGV[2], 'PX', ARGV[3])\n"
    "end\n"
    "redis.pcall('SPUBLISH', KEYS[1], ARGV[2] == '' and 'r' or 's')\n"
    "return 1\n"
);


u_char  ngx_http_idempotency_claim_sha[41];


ngx_int_t
ngx_http_idempotency_script_init(void)
{
    u_char        sha[EVP_MAX_MD_SIZE];
    unsigned int  len;

    if (EVP_Digest(ngx_http_idempotency_claim_script.data,
                   ngx_http_idempotency_claim_script.len, sha, &len,
                   EVP_sha1(), NULL)
        != 1)
    {
        return NGX_ERROR;
    }

    ngx_hex_dump(ngx_http_idempotency_claim_sha, sha, 20);
    ngx_http_idempotency_claim_sha[40] = '\0';

    return NGX_OK;
}
