
/*
 * Copyright (C) The ngx_http_idempotency_module authors
 *
 * The claim, finish and take Lua scripts, which make those steps atomic.
 * Every connection loads the claim and finish scripts, and EVALSHA names
 * them by the SHA1s computed here.  Two more scripts live beside the one
 * command that sends each: the lease's renewal (lease.c) and the touch of
 * a claim before WAIT (claim.c).
 */


#include "ngx_http_idempotency_store.h"


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
 * record (empty: release), ARGV[3] ttl (ms), ARGV[4] "0" when nobody waits
 * for the key (no wake-up; absent: one).  Only the owner of the claim
 * may finish it, whatever its lease says now: the first 45 bytes (magic,
 * state, fingerprint, owner) are compared, not the lease that renewals
 * rewrite.  After a take-over another request owns the key.  A store sent
 * again after a lost connection finds its own record (the head holds our
 * token, in a state other than claim, or our unknown outcome): done.
 *
 * A large record comes staged: KEYS[2] holds it (SET just before, on the
 * same connection and slot), ARGV[2] is its head only.  RENAME moves it
 * without copying it through Lua.  Whatever the outcome, no staged copy is
 * left behind.  Only the 53 bytes of a head are ever read (GETRANGE).
 *
 * Every success that acted ends at the one "return 1" at the bottom,
 * after waiting duplicates, if any may wait, are woken on the key's own
 * channel (watch.c); pcall: Redis 6 has no SPUBLISH, an ACL may forbid
 * it, neither fails the store.
 */

ngx_str_t  ngx_http_idempotency_finish_script = ngx_string(
    "local h = redis.call('GETRANGE', KEYS[1], 0, 52)\n"
    "local s = KEYS[2]\n"
    "if string.sub(h, 1, 45) ~= string.sub(ARGV[1], 1, 45) then\n"
    "  if s then redis.call('DEL', s) end\n"
    "  if ARGV[2] ~= '' and h == string.sub(ARGV[2], 1, 53) then\n"
    "    return 1\n"
    "  end\n"
    "  return 0\n"
    "end\n"
    "if ARGV[2] == '' then\n"
    "  redis.call('DEL', KEYS[1])\n"
    "elseif s then\n"
    "  if redis.call('EXISTS', s) == 0 then\n"
    "    return redis.error_reply('ERR idempotency: staged record missing')\n"
    "  end\n"
    "  redis.call('RENAME', s, KEYS[1])\n"
    "  redis.call('PEXPIRE', KEYS[1], ARGV[3])\n"
    "else\n"
    "  redis.call('SET', KEYS[1], ARGV[2], 'PX', ARGV[3])\n"
    "end\n"
    "if ARGV[4] ~= '0' then\n"
    "  redis.pcall('SPUBLISH', KEYS[1], ARGV[2] == '' and 'r' or 's')\n"
    "end\n"
    "return 1\n"
);


/*
 * take: KEYS[1] record key, ARGV[1] the whole record this request read (an
 * unknown outcome, or a lease past its deadline), ARGV[2] its replacement,
 * ARGV[3] ttl (ms).  Compare-and-set on the whole value: a renewal that
 * came in between changed the deadline, and the owner keeps its claim.
 */

ngx_str_t  ngx_http_idempotency_take_script = ngx_string(
    "if redis.call('GET', KEYS[1]) == ARGV[1] then\n"
    "  redis.call('SET', KEYS[1], ARGV[2], 'PX', ARGV[3])\n"
    "  return 1\n"
    "end\n"
    "return 0\n"
);


u_char  ngx_http_idempotency_claim_sha[41];
u_char  ngx_http_idempotency_finish_sha[41];


static ngx_int_t ngx_http_idempotency_script_sha(ngx_str_t *script,
    u_char *hex);


ngx_int_t
ngx_http_idempotency_script_init(void)
{
    /* the claim script (Redis 6.2), and the finish script of every store */

    static ngx_str_t  load[2];

    load[0] = ngx_http_idempotency_claim_script;
    load[1] = ngx_http_idempotency_finish_script;

    ngx_http_idempotency_redis_scripts = load;
    ngx_http_idempotency_redis_nscripts = 2;

    if (ngx_http_idempotency_script_sha(&ngx_http_idempotency_claim_script,
                                        ngx_http_idempotency_claim_sha)
        != NGX_OK)
    {
        return NGX_ERROR;
    }

    return ngx_http_idempotency_script_sha(&ngx_http_idempotency_finish_script,
                                           ngx_http_idempotency_finish_sha);
}


/* the SHA1 that EVALSHA names a script by, in hex */

static ngx_int_t
ngx_http_idempotency_script_sha(ngx_str_t *script, u_char *hex)
{
    u_char        sha[EVP_MAX_MD_SIZE];
    unsigned int  len;

    if (EVP_Digest(script->data, script->len, sha, &len, EVP_sha1(), NULL)
        != 1)
    {
        return NGX_ERROR;
    }

    ngx_hex_dump(hex, sha, 20);
    hex[40] = '\0';

    return NGX_OK;
}
