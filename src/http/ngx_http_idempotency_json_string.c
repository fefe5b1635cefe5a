
/*
 * Copyright (C) The ngx_http_idempotency_module authors
 *
 * idempotency_key_json_pointer: the scanner inside a string (json.c has
 * the rest).  Escapes, UTF-16 surrogate pairs and UTF-8 are validated as
 * RFC 8259 and RFC 3629 say, and decoded into the bytes a parser would
 * see, which go to ngx_http_idempotency_json_byte(): compared with the
 * pointer's token in a member name on the pointer, copied for the key.
 * Pure, bounds-checked, fuzzed (fuzz/fuzz_json.c).
 */


#include "ngx_http_idempotency_json.h"


/* where in a string the scanner is: js->in, 0 between strings */
enum {
    sw_plain = 0,
    sw_escape,           /* after '\' */
    sw_unicode,          /* in \uXXXX */
    sw_low_escape,       /* after a high surrogate: its low one's '\' */
    sw_low_u,            /*   and 'u' */
    sw_utf8              /* in a multi-byte UTF-8 sequence */
};


static u_char *ngx_http_idempotency_json_plain(
    ngx_http_idempotency_json_t *js, u_char *p, u_char *last);
static u_char *ngx_http_idempotency_json_escape(
    ngx_http_idempotency_json_t *js, u_char *p);
static u_char *ngx_http_idempotency_json_unicode(
    ngx_http_idempotency_json_t *js, u_char *p);
static void ngx_http_idempotency_json_code_point(
    ngx_http_idempotency_json_t *js, u_char *p);
static u_char *ngx_http_idempotency_json_utf8_lead(
    ngx_http_idempotency_json_t *js, u_char *p);
static u_char *ngx_http_idempotency_json_utf8(
    ngx_http_idempotency_json_t *js, u_char *p);


static const char  ngx_http_idempotency_json_bad_escape[] =
    "the body has an invalid escape in a string";
static const char  ngx_http_idempotency_json_bad_surrogate[] =
    "the body has an unpaired UTF-16 surrogate in a string";
static const char  ngx_http_idempotency_json_bad_utf8[] =
    "the body has invalid UTF-8 in a string";


/*
 * After the opening quote: returns at the input's end, at an error, or at
 * the closing quote, which it leaves for json.c (the end of a name or of
 * the key means something there).
 */

u_char *
ngx_http_idempotency_json_string(ngx_http_idempotency_json_t *js, u_char *p,
    u_char *last)
{
    while (p < last && js->why == NULL) {

        switch (js->in) {

        case sw_plain:
            if (*p == '"') {
                return p;
            }

            p = ngx_http_idempotency_json_plain(js, p, last);
            break;

        case sw_escape:
        case sw_low_escape:
        case sw_low_u:
            p = ngx_http_idempotency_json_escape(js, p);
            break;

        case sw_unicode:
            p = ngx_http_idempotency_json_unicode(js, p);
            break;

        default: /* sw_utf8 */
            p = ngx_http_idempotency_json_utf8(js, p);
            break;
        }
    }

    return p;
}


/* runs of plain bytes in one loop; it stops at '"' without taking it */

static u_char *
ngx_http_idempotency_json_plain(ngx_http_idempotency_json_t *js, u_char *p,
    u_char *last)
{
    u_char  ch;

    for ( /* void */ ; p < last; p++) {
        ch = *p;

        if (ch == '"') {
            return p;
        }

        if (ch == '\\') {
            js->in = sw_escape;
            return p + 1;
        }

        if (ch < 0x20) {
            return ngx_http_idempotency_json_error(js, p,
                                "the body has a control character in a string");
        }

        if (ch >= 0x80) {
            return ngx_http_idempotency_json_utf8_lead(js, p);
        }

        if (js->mode != NGX_HTTP_IDEMPOTENCY_JSON_SKIP) {
            ngx_http_idempotency_json_byte(js, p, ch);

            if (js->why != NULL) {
                return p;
            }
        }
    }

    return p;
}


/* after '\', and between a high surrogate's escape and its low one's */

static u_char *
ngx_http_idempotency_json_escape(ngx_http_idempotency_json_t *js, u_char *p)
{
    u_char  ch;

    ch = *p;

    if (js->in == sw_low_escape || js->in == sw_low_u) {
        if (ch != (js->in == sw_low_escape ? '\\' : 'u')) {
            return ngx_http_idempotency_json_error(js, p,
                                       ngx_http_idempotency_json_bad_surrogate);
        }

        js->in = (js->in == sw_low_escape) ? sw_low_u : sw_unicode;
        return p + 1;
    }

    switch (ch) {

    case '"':
    case '\\':
    case '/':
        break;

    case 'b':
        ch = '\b';
        break;

    case 'f':
        ch = '\f';
        break;

    case 'n':
        ch = '\n';
        break;

    case 'r':
        ch = '\r';
        break;

    case 't':
        ch = '\t';
        break;

    case 'u':
        js->code = 0;
        js->digits = 0;
        js->in = sw_unicode;
        return p + 1;

    default:
        return ngx_http_idempotency_json_error(js, p,
                                          ngx_http_idempotency_json_bad_escape);
    }

    js->in = sw_plain;
    ngx_http_idempotency_json_byte(js, p, ch);

    return p + 1;
}


static u_char *
ngx_http_idempotency_json_unicode(ngx_http_idempotency_json_t *js, u_char *p)
{
    u_char  ch, c;

    ch = *p;
    c = (u_char) (ch | 0x20);

    if (ch >= '0' && ch <= '9') {
        js->code = js->code * 16 + (ch - '0');

    } else if (c >= 'a' && c <= 'f') {
        js->code = js->code * 16 + (c - 'a' + 10);

    } else {
        return ngx_http_idempotency_json_error(js, p,
                                          ngx_http_idempotency_json_bad_escape);
    }

    if (++js->digits == 4) {
        js->digits = 0;
        ngx_http_idempotency_json_code_point(js, p);
    }

    return p + 1;
}


/*
 * A complete \uXXXX: a high surrogate waits for its low one, a pair or a
 * plain code point goes on as its UTF-8 bytes, as a parser would decode it.
 */

static void
ngx_http_idempotency_json_code_point(ngx_http_idempotency_json_t *js,
    u_char *p)
{
    u_char      utf8[4];
    ngx_uint_t  cp, i, n;

    cp = js->code;
    js->code = 0;

    if (js->high) {
        if (cp < 0xdc00 || cp > 0xdfff) {
            ngx_http_idempotency_json_error(js, p,
                                       ngx_http_idempotency_json_bad_surrogate);
            return;
        }

        cp = 0x10000 + ((js->high - 0xd800) << 10) + (cp - 0xdc00);
        js->high = 0;

    } else if (cp >= 0xd800 && cp <= 0xdbff) {
        js->high = cp;
        js->in = sw_low_escape;
        return;

    } else if (cp >= 0xdc00 && cp <= 0xdfff) {
        ngx_http_idempotency_json_error(js, p,
                                       ngx_http_idempotency_json_bad_surrogate);
        return;
    }

    if (cp < 0x80) {
        utf8[0] = (u_char) cp;
        n = 1;

    } else if (cp < 0x800) {
        utf8[0] = (u_char) (0xc0 | (cp >> 6));
        utf8[1] = (u_char) (0x80 | (cp & 0x3f));
        n = 2;

    } else if (cp < 0x10000) {
        utf8[0] = (u_char) (0xe0 | (cp >> 12));
        utf8[1] = (u_char) (0x80 | ((cp >> 6) & 0x3f));
        utf8[2] = (u_char) (0x80 | (cp & 0x3f));
        n = 3;

    } else {
        utf8[0] = (u_char) (0xf0 | (cp >> 18));
        utf8[1] = (u_char) (0x80 | ((cp >> 12) & 0x3f));
        utf8[2] = (u_char) (0x80 | ((cp >> 6) & 0x3f));
        utf8[3] = (u_char) (0x80 | (cp & 0x3f));
        n = 4;
    }

    js->in = sw_plain;

    for (i = 0; i < n && js->why == NULL; i++) {
        ngx_http_idempotency_json_byte(js, p, utf8[i]);
    }
}


/*
 * RFC 3629's table: the lead byte sets the range of the next one, which
 * keeps out overlong forms, UTF-16 surrogates and what is past U+10FFFF.
 */

static u_char *
ngx_http_idempotency_json_utf8_lead(ngx_http_idempotency_json_t *js,
    u_char *p)
{
    u_char  ch;

    ch = *p;

    if (ch < 0xc2 || ch > 0xf4) {
        return ngx_http_idempotency_json_error(js, p,
                                            ngx_http_idempotency_json_bad_utf8);
    }

    js->lo = 0x80;
    js->hi = 0xbf;

    if (ch < 0xe0) {
        js->digits = 1;

    } else if (ch < 0xf0) {
        js->digits = 2;

        if (ch == 0xe0) {
            js->lo = 0xa0;

        } else if (ch == 0xed) {
            js->hi = 0x9f;
        }

    } else {
        js->digits = 3;

        if (ch == 0xf0) {
            js->lo = 0x90;

        } else if (ch == 0xf4) {
            js->hi = 0x8f;
        }
    }

    js->in = sw_utf8;

    if (js->mode != NGX_HTTP_IDEMPOTENCY_JSON_SKIP) {
        ngx_http_idempotency_json_byte(js, p, ch);
    }

    return p + 1;
}


static u_char *
ngx_http_idempotency_json_utf8(ngx_http_idempotency_json_t *js, u_char *p)
{
    u_char  ch;

    ch = *p;

    if (ch < js->lo || ch > js->hi) {
        return ngx_http_idempotency_json_error(js, p,
                                            ngx_http_idempotency_json_bad_utf8);
    }

    js->lo = 0x80;
    js->hi = 0xbf;

    if (--js->digits == 0) {
        js->in = sw_plain;
    }

    if (js->mode != NGX_HTTP_IDEMPOTENCY_JSON_SKIP) {
        ngx_http_idempotency_json_byte(js, p, ch);
    }

    return p + 1;
}


/*
 * A decoded byte of a string, or a byte of an integer (json.c): compared
 * with the token if it is a name on the pointer, copied if it is the key.
 */

void
ngx_http_idempotency_json_byte(ngx_http_idempotency_json_t *js, u_char *p,
    u_char ch)
{
    ngx_str_t  *name;

    switch (js->mode) {

    case NGX_HTTP_IDEMPOTENCY_JSON_NAME:
        name = &js->ptr->tokens[js->depth - 1].name;

        if (js->npos < name->len && name->data[js->npos] == ch) {
            js->npos++;

        } else {
            /* not the token: the rest of the name is only validated */
            js->mode = NGX_HTTP_IDEMPOTENCY_JSON_SKIP;
        }

        return;

    case NGX_HTTP_IDEMPOTENCY_JSON_KEY:
        if (ch < 0x20 || ch > 0x7e) {
            ngx_http_idempotency_json_error(js, p,
                             "the key has a character outside printable ASCII");
            return;
        }

        if (js->key_len == js->max) {
            ngx_http_idempotency_json_error(js, p,
                           "the key is longer than idempotency_key_max_length");
            return;
        }

        js->key[js->key_len++] = ch;
        return;

    default:
        return;
    }
}
