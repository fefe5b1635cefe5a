/*
 * redis62: makes Redis >= 7.0 refuse SET with both NX and GET, as Redis 6.2
 * does ("ERR syntax error"), so that the module's 6.2 fallback (the claim
 * script) can be tested where only Redis 7.x is installed (t/011-redis62.t).
 *
 *   cc -shared -fPIC -O2 -Wall -Werror -o redis62.so redis62.c
 *   redis-server --loadmodule ./redis62.so
 *
 * A command filter sees every command before Redis runs it: from clients,
 * from MULTI/EXEC and from Lua scripts' redis.call(), like 6.2's parser.  For
 * a SET whose options hold both NX and GET it puts an unknown option first,
 * so that Redis's own SET parser answers "ERR syntax error" (and counts a
 * failed call) exactly where 6.2 would.  Everything else is left untouched.
 *
 * Written from the module ABI, without Redis's header: the first word of the
 * context passed to RedisModule_OnLoad is Redis's GetApi function, which
 * returns every other API function by name.
 */

#include <stddef.h>
#include <string.h>
#include <strings.h>


#define RM_OK       0
#define RM_ERR      1
#define RM_APIVER   1

typedef struct rm_ctx_s         rm_ctx_t;      /* RedisModuleCtx */
typedef struct rm_string_s      rm_string_t;   /* RedisModuleString */
typedef struct rm_filter_ctx_s  rm_filter_ctx_t;
typedef void (*rm_filter_pt)(rm_filter_ctx_t *fctx);

static int (*get_api)(const char *name, void *target);

static void (*set_module_attribs)(rm_ctx_t *ctx, const char *name, int ver,
    int apiver);
static void *(*register_filter)(rm_ctx_t *ctx, rm_filter_pt cb, int flags);
static int (*filter_args_count)(rm_filter_ctx_t *fctx);
static rm_string_t *(*filter_arg_get)(rm_filter_ctx_t *fctx, int pos);
static int (*filter_arg_insert)(rm_filter_ctx_t *fctx, int pos,
    rm_string_t *arg);
static rm_string_t *(*create_string)(rm_ctx_t *ctx, const char *ptr,
    size_t len);
static const char *(*string_ptr_len)(const rm_string_t *str, size_t *len);


static const char  refused[] = "redis62-refuses-NX-with-GET";


static int
is(rm_filter_ctx_t *fctx, int pos, const char *word)
{
    size_t       len;
    const char  *p;

    p = string_ptr_len(filter_arg_get(fctx, pos), &len);

    return p != NULL && len == strlen(word) && strncasecmp(p, word, len) == 0;
}


static void
filter(rm_filter_ctx_t *fctx)
{
    int  i, argc, nx, get;

    argc = filter_args_count(fctx);

    if (argc < 5 || !is(fctx, 0, "set")) {
        return;
    }

    nx = 0;
    get = 0;

    /* SET key value [options]: the options as 6.2 reads them */

    for (i = 3; i < argc; i++) {
        if (is(fctx, i, "nx")) {
            nx = 1;

        } else if (is(fctx, i, "get")) {
            get = 1;

        } else if ((is(fctx, i, "ex") || is(fctx, i, "px")
                    || is(fctx, i, "exat") || is(fctx, i, "pxat"))
                   && i + 1 < argc)
        {
            i++;    /* the expiry value is no option */
        }
    }

    if (nx && get) {
        /* the string belongs to the command's argv from now on */
        filter_arg_insert(fctx, 3,
                          create_string(NULL, refused, sizeof(refused) - 1));
    }
}


#define RM_GET(name, var)                                                     \
    if (get_api("RedisModule_" name, (void *) &var) != RM_OK) {              \
        return RM_ERR;                                                        \
    }

int
RedisModule_OnLoad(rm_ctx_t *ctx, rm_string_t **argv, int argc)
{
    (void) argv;
    (void) argc;

    get_api = *(int (**)(const char *, void *)) ctx;

    RM_GET("SetModuleAttribs", set_module_attribs);
    RM_GET("RegisterCommandFilter", register_filter);
    RM_GET("CommandFilterArgsCount", filter_args_count);
    RM_GET("CommandFilterArgGet", filter_arg_get);
    RM_GET("CommandFilterArgInsert", filter_arg_insert);
    RM_GET("CreateString", create_string);
    RM_GET("StringPtrLen", string_ptr_len);

    set_module_attribs(ctx, "redis62", 1, RM_APIVER);

    return register_filter(ctx, filter, 0) ? RM_OK : RM_ERR;
}
