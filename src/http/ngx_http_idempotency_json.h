
/*
 * Copyright (C) The ngx_http_idempotency_module authors
 *
 * idempotency_key_json_pointer: the key is a member of the request's JSON
 * body, found by a streaming scanner that validates the whole document
 * (json.c).  Pure, bounds-checked, fuzzed (fuzz/fuzz_json.c); this header
 * needs no http header, so that the fuzz target builds without them.
 */


#ifndef _NGX_HTTP_IDEMPOTENCY_JSON_H_INCLUDED_
#define _NGX_HTTP_IDEMPOTENCY_JSON_H_INCLUDED_


#include <ngx_config.h>
#include <ngx_core.h>


#define NGX_HTTP_IDEMPOTENCY_JSON_DEPTH  64   /* nesting the scanner follows */

/* what the bytes of the string or number being read are for */
#define NGX_HTTP_IDEMPOTENCY_JSON_SKIP   0    /* validated only */
#define NGX_HTTP_IDEMPOTENCY_JSON_NAME   1    /* compared with the token */
#define NGX_HTTP_IDEMPOTENCY_JSON_KEY    2    /* copied: the key */


typedef struct {
    ngx_str_t                           name;     /* ~1 and ~0 decoded */
    ngx_int_t                           index;    /* array index, or -1 */
} ngx_http_idempotency_json_token_t;


typedef struct {
    ngx_str_t                           text;     /* as configured */
    ngx_uint_t                          ntokens;  /* >= 1 */
    ngx_http_idempotency_json_token_t  *tokens;
} ngx_http_idempotency_json_pointer_t;


/*
 * The scanner's state, opaque to callers: everything is allocated by
 * ngx_http_idempotency_json_create() and never grows.
 */

typedef struct {
    ngx_http_idempotency_json_pointer_t  *ptr;

    ngx_uint_t                          state;
    ngx_uint_t                          in;       /* json_string.c's state */
    ngx_uint_t                          mode;     /* skip, name or key */
    ngx_uint_t                          depth;    /* open containers */
    ngx_uint_t                          path;     /* of them on the pointer */
    u_char                              kind[NGX_HTTP_IDEMPOTENCY_JSON_DEPTH];

    /*
     * per container on the pointer (ptr->ntokens of them): an array's
     * elements so far, or 1 once an object had the token's member
     */
    ngx_uint_t                         *count;

    size_t                              npos;     /* name bytes matched */
    ngx_uint_t                          code;     /* of a \uXXXX escape */
    ngx_uint_t                          high;     /* a high surrogate */
    ngx_uint_t                          digits;   /* hex or UTF-8 to come */
    const u_char                       *literal;  /* the rest of "true"... */
    u_char                              lo;       /* the next UTF-8 byte's */
    u_char                              hi;       /*   range */

    unsigned                            on:1;     /* on the pointer */
    unsigned                            name:1;   /* the string is a name */
    unsigned                            found:1;

    u_char                             *key;      /* max bytes */
    size_t                              key_len;
    size_t                              max;

    u_char                             *chunk;    /* what feed() was given */
    off_t                               fed;      /* bytes before it */
    off_t                               error_at;
    const char                         *why;      /* the first error */
} ngx_http_idempotency_json_t;


/* config time: NGX_OK, or NGX_ERROR with *err a static reason */
ngx_int_t ngx_http_idempotency_json_pointer_parse(ngx_pool_t *pool,
    ngx_str_t *text, ngx_http_idempotency_json_pointer_t *ptr, char **err);

/* per request: the scanner, with room for a key of at most max bytes */
ngx_http_idempotency_json_t *ngx_http_idempotency_json_create(
    ngx_pool_t *pool, ngx_http_idempotency_json_pointer_t *ptr, size_t max);

/* the next body bytes; may be called with any split, including 0 bytes */
void ngx_http_idempotency_json_feed(ngx_http_idempotency_json_t *js,
    u_char *p, u_char *last);

/*
 * After the last byte: NGX_OK with *key (pointing into js's memory) the
 * key; NGX_DECLINED: the document is valid JSON and has no member at the
 * pointer; NGX_ERROR: *why is a static, human-readable reason, suitable for
 * a problem+json "detail" after "the key at <pointer>: ".
 */
ngx_int_t ngx_http_idempotency_json_finish(ngx_http_idempotency_json_t *js,
    ngx_str_t *key, const char **why);

/*
 * For log lines: the body offset of the first error (the bytes fed before
 * it), or, while there is none, the bytes fed so far.
 */
off_t ngx_http_idempotency_json_offset(ngx_http_idempotency_json_t *js);


/* the scanner's own: json.c reads the structure, json_string.c strings */
u_char *ngx_http_idempotency_json_error(ngx_http_idempotency_json_t *js,
    u_char *p, const char *why);
u_char *ngx_http_idempotency_json_string(ngx_http_idempotency_json_t *js,
    u_char *p, u_char *last);
void ngx_http_idempotency_json_byte(ngx_http_idempotency_json_t *js,
    u_char *p, u_char ch);


#endif /* _NGX_HTTP_IDEMPOTENCY_JSON_H_INCLUDED_ */
