
/*
 * Copyright (C) The ngx_http_idempotency_module authors
 *
 * The Idempotency-Key parser: pure, bounds-checked, fuzzed (fuzz/).
 */


#include "ngx_http_idempotency_http.h"


/*
 * Accepts an RFC 8941 sf-string ("abc", escapes \" and \\) or a bare token
 * as Stripe's clients send it (visible ASCII without '"' and ',', since a
 * comma means several field lines were folded into one).  The decoded key
 * is written to out->data, which must hold in->len bytes.
 */

ngx_int_t
ngx_http_idempotency_parse_key(ngx_str_t *in, ngx_str_t *out, size_t max)
{
    u_char  *p, *last, *d, ch;

    p = in->data;
    last = p + in->len;
    d = out->data;
    out->len = 0;    /* stays 0 unless the form was right: see the caller */

    if (p == last) {
        return NGX_DECLINED;
    }

    if (*p != '"') {
        for ( /* void */ ; p < last; p++) {
            ch = *p;

            if (ch <= 0x20 || ch >= 0x7f || ch == '"' || ch == ',') {
                return NGX_ERROR;
            }

            *d++ = ch;
        }

        goto done;
    }

    for (p++; p < last; p++) {
        ch = *p;

        if (ch == '"') {
            break;
        }

        if (ch < 0x20 || ch >= 0x7f) {
            return NGX_ERROR;
        }

        if (ch == '\\') {
            if (++p == last || (*p != '"' && *p != '\\')) {
                return NGX_ERROR;
            }

            ch = *p;
        }

        *d++ = ch;
    }

    if (p == last || p + 1 != last) {
        /* unterminated, or something after the closing quote */
        return NGX_ERROR;
    }

done:

    out->len = d - out->data;

    if (out->len == 0 || out->len > max) {
        return NGX_ERROR;
    }

    return NGX_OK;
}
