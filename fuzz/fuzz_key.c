
/*
 * libFuzzer target for ngx_http_idempotency_parse_key()
 * (src/http/ngx_http_idempotency_key.c).
 *
 * Input: byte 0 chooses max (1..255, or 1024 for 0xff), the rest is the
 * Idempotency-Key header value.  Both the value and the output buffer are
 * malloc()ed at exactly in.len bytes, so ASan sees any read past the value
 * or any write past the in.len bytes the caller provides.
 *
 * Checked on every input:
 *   - the result is NGX_DECLINED exactly for an empty value, else NGX_OK or
 *     NGX_ERROR;
 *   - on NGX_OK: 1 <= out.len <= max, out.len <= in.len, every byte of the
 *     key is 0x20..0x7e, out.data was not moved; a bare (unquoted) value
 *     is returned unchanged;
 *   - the result and the key equal those of an independent reference
 *     decoder written from the grammar (RFC 8941 sf-string, or a bare token
 *     of visible ASCII without '"' and ',').
 */


#include "ngx_http_idempotency_module.h"
#include "fuzz.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>


/* the grammar, written independently of the module's parser */

static ngx_int_t
reference_parse(const u_char *in, size_t len, u_char *key, size_t *key_len,
    size_t max)
{
    size_t  i, n;

    if (len == 0) {
        return NGX_DECLINED;
    }

    n = 0;

    if (in[0] != '"') {
        /* bare token: 0x21..0x7e except '"' and ',' */
        for (i = 0; i < len; i++) {
            if (in[i] < 0x21 || in[i] > 0x7e || in[i] == '"' || in[i] == ',') {
                return NGX_ERROR;
            }
            key[n++] = in[i];
        }

    } else {
        /* sf-string: DQUOTE *( unescaped / "\" ( DQUOTE / "\" ) ) DQUOTE */
        if (len < 2 || in[len - 1] != '"') {
            return NGX_ERROR;
        }

        for (i = 1; i < len - 1; i++) {
            if (in[i] == '\\') {
                if (i + 1 >= len - 1
                    || (in[i + 1] != '"' && in[i + 1] != '\\'))
                {
                    return NGX_ERROR;
                }
                key[n++] = in[++i];
                continue;
            }

            if (in[i] < 0x20 || in[i] > 0x7e || in[i] == '"') {
                return NGX_ERROR;
            }

            key[n++] = in[i];
        }
    }

    if (n == 0 || n > max) {
        return NGX_ERROR;
    }

    *key_len = n;

    return NGX_OK;
}


int
LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    size_t      max, i, ref_len;
    u_char     *ref, *out_start;
    ngx_int_t   rc, ref_rc;
    ngx_str_t   in, out;

    if (size < 1) {
        return 0;
    }

    max = data[0] == 0xff ? 1024 : (size_t) data[0] + 1;

    /* exactly in.len bytes each (ASan's malloc(0) is not NULL either) */
    in.len = size - 1;
    in.data = malloc(in.len);
    out.data = malloc(in.len);
    ref = malloc(in.len);

    if (in.data == NULL || out.data == NULL || ref == NULL) {
        abort();
    }

    memcpy(in.data, data + 1, in.len);
    out.len = (size_t) -1;
    out_start = out.data;

    rc = ngx_http_idempotency_parse_key(&in, &out, max);

    fuzz_assert(rc == NGX_OK || rc == NGX_ERROR || rc == NGX_DECLINED,
                "rc %ld", (long) rc);
    fuzz_assert((rc == NGX_DECLINED) == (in.len == 0),
                "rc %ld for a value of %zu bytes", (long) rc, in.len);
    fuzz_assert(memcmp(in.data, data + 1, in.len) == 0,
                "the parser modified its input");
    fuzz_assert(out.data == out_start, "out.data moved");

    if (rc == NGX_OK) {
        fuzz_assert(out.len >= 1 && out.len <= max,
                    "out.len %zu, max %zu", out.len, max);
        fuzz_assert(out.len <= in.len, "out.len %zu > in.len %zu",
                    out.len, in.len);

        for (i = 0; i < out.len; i++) {
            fuzz_assert(out.data[i] >= 0x20 && out.data[i] <= 0x7e,
                        "key byte %zu is 0x%02x", i, out.data[i]);
        }

        if (in.data[0] != '"') {
            fuzz_assert(out.len == in.len
                        && memcmp(out.data, in.data, in.len) == 0,
                        "a bare key was changed");
        } else {
            fuzz_assert(out.len <= in.len - 2,
                        "quoted key longer than its contents");
        }
    }

    ref_len = 0;
    ref_rc = reference_parse(in.data, in.len, ref, &ref_len, max);

    fuzz_assert(rc == ref_rc, "parser says %ld, reference says %ld",
                (long) rc, (long) ref_rc);

    if (rc == NGX_OK) {
        fuzz_assert(out.len == ref_len
                    && memcmp(out.data, ref, ref_len) == 0,
                    "key differs from the reference (%zu vs %zu bytes)",
                    out.len, ref_len);
    }

    free(in.data);
    free(out.data);
    free(ref);

    return 0;
}
