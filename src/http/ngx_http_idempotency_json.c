
/*
 * Copyright (C) The ngx_http_idempotency_module authors
 *
 * idempotency_key_json_pointer: the RFC 6901 pointer's parser and the
 * streaming scanner that finds the member it names while the body goes by.
 * Pure, bounds-checked, fuzzed (fuzz/fuzz_json.c).
 *
 * The scanner reads one byte at a time through a state machine, so that
 * any split of the body gives the same result, and validates the whole
 * document as RFC 8259 JSON: the request goes upstream only if the
 * upstream's parser can read nothing else into it than the scanner did.
 * Its memory is allocated once, in create(): the state, a counter per
 * token and the key's bytes.  This file follows the structure, the names
 * and where the key is; json_string.c reads inside strings.
 */


#include "ngx_http_idempotency_json.h"


/* where the scanner is; sw_string to sw_exponent_digits are in a value */
enum {
    sw_start = 0,        /* before the document: a value */
    sw_value,            /* after ':' or an array's ',': a value */
    sw_first_element,    /* after '[': a value or ']' */
    sw_first_name,       /* after '{': a name or '}' */
    sw_name,             /* after an object's ',': a name */
    sw_colon,
    sw_after,            /* after a member or an element: ',' or the close */
    sw_end,              /* after the document: white space only */
    sw_string,           /* json_string.c has its own states inside */
    sw_literal,          /* in true, false or null */
    sw_minus,
    sw_zero,
    sw_integer,
    sw_dot,
    sw_fraction,
    sw_exponent,         /* after 'e' or 'E' */
    sw_exponent_sign,
    sw_exponent_digits
};


/* a token of up to 9 digits is an index: it fits any ngx_int_t */
#define NGX_HTTP_IDEMPOTENCY_JSON_INDEX_DIGITS  9


static ngx_int_t ngx_http_idempotency_json_index(ngx_str_t *name);
static void ngx_http_idempotency_json_fail(ngx_http_idempotency_json_t *js,
    off_t at, const char *why);
static u_char *ngx_http_idempotency_json_structure(
    ngx_http_idempotency_json_t *js, u_char *p, u_char *last);
static u_char *ngx_http_idempotency_json_after(
    ngx_http_idempotency_json_t *js, u_char *p);
static u_char *ngx_http_idempotency_json_value(
    ngx_http_idempotency_json_t *js, u_char *p);
static u_char *ngx_http_idempotency_json_open(
    ngx_http_idempotency_json_t *js, u_char *p);
static u_char *ngx_http_idempotency_json_close(
    ngx_http_idempotency_json_t *js, u_char *p);
static void ngx_http_idempotency_json_element(
    ngx_http_idempotency_json_t *js);
static void ngx_http_idempotency_json_done(ngx_http_idempotency_json_t *js);
static u_char *ngx_http_idempotency_json_string_end(
    ngx_http_idempotency_json_t *js, u_char *p);
static u_char *ngx_http_idempotency_json_literal(
    ngx_http_idempotency_json_t *js, u_char *p);
static u_char *ngx_http_idempotency_json_number(
    ngx_http_idempotency_json_t *js, u_char *p);


static const char  ngx_http_idempotency_json_invalid[] =
    "the body is not valid JSON";
static const char  ngx_http_idempotency_json_bad_number[] =
    "the body has an invalid number";


ngx_int_t
ngx_http_idempotency_json_pointer_parse(ngx_pool_t *pool, ngx_str_t *text,
    ngx_http_idempotency_json_pointer_t *ptr, char **err)
{
    u_char                             *p, *last, *d;
    ngx_uint_t                          i, n;
    ngx_http_idempotency_json_token_t  *tok;

    if (text->len == 0) {
        *err = "the pointer names the whole document";
        return NGX_ERROR;
    }

    if (text->data[0] != '/') {
        *err = "the pointer does not start with \"/\"";
        return NGX_ERROR;
    }

    last = text->data + text->len;
    n = 0;

    for (p = text->data; p < last; p++) {
        if (*p == '/') {
            n++;
        }
    }

    if (n > NGX_HTTP_IDEMPOTENCY_JSON_DEPTH) {
        *err = "the pointer has more than "
               ngx_value(NGX_HTTP_IDEMPOTENCY_JSON_DEPTH) " tokens";
        return NGX_ERROR;
    }

    tok = ngx_palloc(pool, n * sizeof(ngx_http_idempotency_json_token_t));

    /* the decoded tokens together are shorter than the text */
    d = ngx_pnalloc(pool, text->len);

    if (tok == NULL || d == NULL) {
        *err = "no memory";
        return NGX_ERROR;
    }

    p = text->data + 1;

    for (i = 0; i < n; i++) {
        tok[i].name.data = d;

        for ( /* void */ ; p < last && *p != '/'; p++) {
            if (*p != '~') {
                *d++ = *p;
                continue;
            }

            if (p + 1 == last || (p[1] != '0' && p[1] != '1')) {
                *err = "the pointer has a \"~\" not followed by \"0\" or \"1\"";
                return NGX_ERROR;
            }

            *d++ = *++p == '0' ? '~' : '/';
        }

        tok[i].name.len = d - tok[i].name.data;
        tok[i].index = ngx_http_idempotency_json_index(&tok[i].name);

        p++;    /* the next token's '/' */
    }

    ptr->text = *text;
    ptr->ntokens = n;
    ptr->tokens = tok;

    return NGX_OK;
}


/*
 * RFC 6901: "0", or digits without a leading zero; "-" (past the end) and
 * anything longer than fits are names only.
 */

static ngx_int_t
ngx_http_idempotency_json_index(ngx_str_t *name)
{
    size_t     i;
    ngx_int_t  index;

    if (name->len == 0 || name->len > NGX_HTTP_IDEMPOTENCY_JSON_INDEX_DIGITS
        || (name->data[0] == '0' && name->len > 1))
    {
        return -1;
    }

    index = 0;

    for (i = 0; i < name->len; i++) {
        if (name->data[i] < '0' || name->data[i] > '9') {
            return -1;
        }

        index = index * 10 + (name->data[i] - '0');
    }

    return index;
}


ngx_http_idempotency_json_t *
ngx_http_idempotency_json_create(ngx_pool_t *pool,
    ngx_http_idempotency_json_pointer_t *ptr, size_t max)
{
    ngx_http_idempotency_json_t  *js;

    if (ptr->ntokens == 0 || ptr->ntokens > NGX_HTTP_IDEMPOTENCY_JSON_DEPTH) {
        return NULL;
    }

    /* one allocation: the state, a counter per token, then the key */
    js = ngx_palloc(pool, sizeof(ngx_http_idempotency_json_t)
                          + ptr->ntokens * sizeof(ngx_uint_t) + max);
    if (js == NULL) {
        return NULL;
    }

    ngx_memzero(js, sizeof(ngx_http_idempotency_json_t));

    js->ptr = ptr;
    js->count = (ngx_uint_t *) &js[1];
    js->key = (u_char *) &js->count[ptr->ntokens];
    js->max = max;

    /* the document itself is on the pointer: every pointer starts there */
    js->on = 1;

    /* zeroed: sw_start, no container, nothing fed, no key, no error */

    return js;
}


void
ngx_http_idempotency_json_feed(ngx_http_idempotency_json_t *js, u_char *p,
    u_char *last)
{
    /* after an error, and for no bytes (which may be NULL), nothing to do */

    if (js->why != NULL || p >= last) {
        return;
    }

    js->chunk = p;

    /* each step consumes at least one byte or changes the state */

    while (p < last && js->why == NULL) {

        switch (js->state) {

        case sw_string:
            p = ngx_http_idempotency_json_string(js, p, last);

            /* it stops short of the input's end only at the closing quote */

            if (p < last && js->why == NULL) {
                p = ngx_http_idempotency_json_string_end(js, p);
            }

            break;

        case sw_literal:
            p = ngx_http_idempotency_json_literal(js, p);
            break;

        case sw_minus:
        case sw_zero:
        case sw_integer:
        case sw_dot:
        case sw_fraction:
        case sw_exponent:
        case sw_exponent_sign:
        case sw_exponent_digits:
            p = ngx_http_idempotency_json_number(js, p);
            break;

        default:
            p = ngx_http_idempotency_json_structure(js, p, last);
            break;
        }
    }

    if (js->why == NULL) {
        js->fed += last - js->chunk;
    }
}


ngx_int_t
ngx_http_idempotency_json_finish(ngx_http_idempotency_json_t *js,
    ngx_str_t *key, const char **why)
{
    if (js->why == NULL) {

        switch (js->state) {

        case sw_end:
            break;

        case sw_zero:
        case sw_integer:
        case sw_fraction:
        case sw_exponent_digits:

            /* a number that is the whole document ends with the body */

            if (js->depth == 0) {
                break;
            }

            /* fall through */

        default:
            ngx_http_idempotency_json_fail(js, js->fed,
                                           js->state == sw_start
                                           ? "the body is not JSON"
                                           : "the body ends inside the JSON");
        }
    }

    if (js->why != NULL) {
        *why = js->why;
        return NGX_ERROR;
    }

    if (!js->found) {
        return NGX_DECLINED;
    }

    key->data = js->key;
    key->len = js->key_len;

    return NGX_OK;
}


off_t
ngx_http_idempotency_json_offset(ngx_http_idempotency_json_t *js)
{
    return js->why != NULL ? js->error_at : js->fed;
}


/* the first error is final: the request is refused for it */

static void
ngx_http_idempotency_json_fail(ngx_http_idempotency_json_t *js, off_t at,
    const char *why)
{
    if (js->why == NULL) {
        js->why = why;
        js->error_at = at;
    }
}


/* an error at the byte p points to; p is given back for the callers */

u_char *
ngx_http_idempotency_json_error(ngx_http_idempotency_json_t *js, u_char *p,
    const char *why)
{
    ngx_http_idempotency_json_fail(js, js->fed + (p - js->chunk), why);

    return p;
}


/* between values: white space, then punctuation or a value's first byte */

static u_char *
ngx_http_idempotency_json_structure(ngx_http_idempotency_json_t *js,
    u_char *p, u_char *last)
{
    u_char  ch;

    for ( ;; ) {
        ch = *p;

        if (ch != ' ' && ch != '\t' && ch != '\n' && ch != '\r') {
            break;
        }

        if (++p == last) {
            return p;
        }
    }

    switch (js->state) {

    case sw_start:
    case sw_value:
        return ngx_http_idempotency_json_value(js, p);

    case sw_first_element:
        if (ch == ']') {
            return ngx_http_idempotency_json_close(js, p);
        }

        ngx_http_idempotency_json_element(js);
        return ngx_http_idempotency_json_value(js, p);

    case sw_first_name:
        if (ch == '}') {
            return ngx_http_idempotency_json_close(js, p);
        }

        /* fall through */

    case sw_name:
        if (ch != '"') {
            return ngx_http_idempotency_json_error(js, p,
                                             ngx_http_idempotency_json_invalid);
        }

        /* only the names of an object on the pointer are compared */

        js->mode = (js->path == js->depth) ? NGX_HTTP_IDEMPOTENCY_JSON_NAME
                                           : NGX_HTTP_IDEMPOTENCY_JSON_SKIP;
        js->name = 1;
        js->npos = 0;
        js->state = sw_string;
        return p + 1;

    case sw_colon:
        if (ch != ':') {
            return ngx_http_idempotency_json_error(js, p,
                                             ngx_http_idempotency_json_invalid);
        }

        js->state = sw_value;
        return p + 1;

    case sw_after:
        return ngx_http_idempotency_json_after(js, p);

    default: /* sw_end */
        return ngx_http_idempotency_json_error(js, p,
                                            "the body has data after the JSON");
    }
}


static u_char *
ngx_http_idempotency_json_after(ngx_http_idempotency_json_t *js, u_char *p)
{
    if (*p == ']' || *p == '}') {
        return ngx_http_idempotency_json_close(js, p);
    }

    if (*p != ',') {
        return ngx_http_idempotency_json_error(js, p,
                                             ngx_http_idempotency_json_invalid);
    }

    if (js->kind[js->depth - 1] == '[') {
        ngx_http_idempotency_json_element(js);
        js->state = sw_value;

    } else {
        js->state = sw_name;
    }

    return p + 1;
}


/*
 * The first byte of a value; js->on says whether it is on the pointer, and
 * it is the key if it is on the pointer at the pointer's full depth.
 */

static u_char *
ngx_http_idempotency_json_value(ngx_http_idempotency_json_t *js, u_char *p)
{
    u_char      ch;
    ngx_uint_t  key;

    ch = *p;
    key = js->on && js->depth == js->ptr->ntokens;

    js->mode = key ? NGX_HTTP_IDEMPOTENCY_JSON_KEY
                   : NGX_HTTP_IDEMPOTENCY_JSON_SKIP;

    switch (ch) {

    case '{':
    case '[':
        if (key) {
            return ngx_http_idempotency_json_error(js, p, (ch == '{')
                                    ? "the member at the pointer is an object"
                                    : "the member at the pointer is an array");
        }

        return ngx_http_idempotency_json_open(js, p);

    case '"':
        js->name = 0;
        js->state = sw_string;
        return p + 1;

    case 't':
        js->literal = (const u_char *) "rue";
        js->state = sw_literal;
        return p + 1;

    case 'f':
        js->literal = (const u_char *) "alse";
        js->state = sw_literal;
        return p + 1;

    case 'n':
        js->literal = (const u_char *) "ull";
        js->state = sw_literal;
        return p + 1;

    case '-':
        js->state = sw_minus;
        break;

    case '0':
        js->state = sw_zero;
        break;

    default:
        if (ch < '1' || ch > '9') {
            return ngx_http_idempotency_json_error(js, p,
                                             ngx_http_idempotency_json_invalid);
        }

        js->state = sw_integer;
        break;
    }

    /* a number's first byte */

    if (key) {
        ngx_http_idempotency_json_byte(js, p, ch);
    }

    return p + 1;
}


static u_char *
ngx_http_idempotency_json_open(ngx_http_idempotency_json_t *js, u_char *p)
{
    if (js->depth == NGX_HTTP_IDEMPOTENCY_JSON_DEPTH) {
        return ngx_http_idempotency_json_error(js, p,
                                   "the body nests deeper than "
                                   ngx_value(NGX_HTTP_IDEMPOTENCY_JSON_DEPTH)
                                   " levels");
    }

    if (js->on) {
        /* no element or member of the new container seen yet */
        js->count[js->depth] = 0;
        js->path = js->depth + 1;
    }

    js->kind[js->depth++] = *p;
    js->state = (*p == '{') ? sw_first_name : sw_first_element;

    return p + 1;
}


static u_char *
ngx_http_idempotency_json_close(ngx_http_idempotency_json_t *js, u_char *p)
{
    /* in ASCII, '}' and ']' follow their '{' and '[' by two */

    if (js->kind[js->depth - 1] + 2 != *p) {
        return ngx_http_idempotency_json_error(js, p,
                                             ngx_http_idempotency_json_invalid);
    }

    js->depth--;

    if (js->path > js->depth) {
        js->path = js->depth;
    }

    ngx_http_idempotency_json_done(js);

    return p + 1;
}


/*
 * An array's next element: on the pointer if the array is and the token
 * is its index.  The count stops past the index, so it cannot wrap.
 */

static void
ngx_http_idempotency_json_element(ngx_http_idempotency_json_t *js)
{
    ngx_uint_t                          n;
    ngx_http_idempotency_json_token_t  *tok;

    js->on = 0;

    if (js->path != js->depth) {
        return;
    }

    tok = &js->ptr->tokens[js->depth - 1];
    n = js->count[js->depth - 1];

    if (tok->index < 0 || n > (ngx_uint_t) tok->index) {
        return;
    }

    js->count[js->depth - 1] = n + 1;
    js->on = (n == (ngx_uint_t) tok->index);
}


static void
ngx_http_idempotency_json_done(ngx_http_idempotency_json_t *js)
{
    js->state = js->depth ? sw_after : sw_end;
}


static u_char *
ngx_http_idempotency_json_string_end(ngx_http_idempotency_json_t *js,
    u_char *p)
{
    ngx_uint_t  level;

    if (js->name) {
        level = js->depth - 1;

        js->on = js->mode == NGX_HTTP_IDEMPOTENCY_JSON_NAME
                 && js->npos == js->ptr->tokens[level].name.len;

        js->state = sw_colon;

        if (js->on) {

            /*
             * parsers disagree on which of two equal members wins: the
             * upstream could read the other one than the key came from
             */

            if (js->count[level]) {
                return ngx_http_idempotency_json_error(js, p,
                                       "a member on the pointer appears twice");
            }

            js->count[level] = 1;
        }

        return p + 1;
    }

    if (js->mode == NGX_HTTP_IDEMPOTENCY_JSON_KEY) {
        if (js->key_len == 0) {
            return ngx_http_idempotency_json_error(js, p, "the key is empty");
        }

        js->found = 1;
    }

    ngx_http_idempotency_json_done(js);

    return p + 1;
}


static u_char *
ngx_http_idempotency_json_literal(ngx_http_idempotency_json_t *js, u_char *p)
{
    if (*p != *js->literal) {
        return ngx_http_idempotency_json_error(js, p,
                                             ngx_http_idempotency_json_invalid);
    }

    if (*++js->literal != '\0') {
        return p + 1;
    }

    if (js->mode == NGX_HTTP_IDEMPOTENCY_JSON_KEY) {
        /* null is the literal that ends in 'l' */
        return ngx_http_idempotency_json_error(js, p, (*p == 'l')
                                  ? "the member at the pointer is null"
                                  : "the member at the pointer is a boolean");
    }

    ngx_http_idempotency_json_done(js);

    return p + 1;
}


/*
 * -?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)?  A number ends at the
 * first byte that cannot continue it, which is not consumed: it is the
 * next token's.  An integer's bytes as written are a key.
 */

static u_char *
ngx_http_idempotency_json_number(ngx_http_idempotency_json_t *js, u_char *p)
{
    u_char      ch;
    ngx_uint_t  digit;

    ch = *p;
    digit = (ch >= '0' && ch <= '9');

    switch (js->state) {

    case sw_minus:
        if (!digit) {
            goto invalid;
        }

        js->state = (ch == '0') ? sw_zero : sw_integer;
        break;

    case sw_zero:
    case sw_integer:
        if (digit && js->state == sw_integer) {
            break;
        }

        if (ch == '.' || ch == 'e' || ch == 'E') {
            if (js->mode == NGX_HTTP_IDEMPOTENCY_JSON_KEY) {
                return ngx_http_idempotency_json_error(js, p,
                                        "the member at the pointer is a number"
                                        " with a fraction or exponent");
            }

            js->state = (ch == '.') ? sw_dot : sw_exponent;
            return p + 1;
        }

        goto end;

    case sw_dot:
        if (!digit) {
            goto invalid;
        }

        js->state = sw_fraction;
        return p + 1;

    case sw_fraction:
        if (digit) {
            return p + 1;
        }

        if (ch == 'e' || ch == 'E') {
            js->state = sw_exponent;
            return p + 1;
        }

        goto end;

    case sw_exponent:
        if (ch == '+' || ch == '-') {
            js->state = sw_exponent_sign;
            return p + 1;
        }

        /* fall through */

    case sw_exponent_sign:
        if (!digit) {
            goto invalid;
        }

        js->state = sw_exponent_digits;
        return p + 1;

    default: /* sw_exponent_digits */
        if (digit) {
            return p + 1;
        }

        goto end;
    }

    /* a digit of the integer part */

    if (js->mode == NGX_HTTP_IDEMPOTENCY_JSON_KEY) {
        ngx_http_idempotency_json_byte(js, p, ch);
    }

    return p + 1;

end:

    if (js->mode == NGX_HTTP_IDEMPOTENCY_JSON_KEY) {
        js->found = 1;
    }

    ngx_http_idempotency_json_done(js);

    return p;

invalid:

    return ngx_http_idempotency_json_error(js, p,
                                          ngx_http_idempotency_json_bad_number);
}
