
/*
 * libFuzzer target for ngx_http_idempotency_record_decode()
 * (src/store/ngx_http_idempotency_record.c): the input is a record as read back
 * from Redis, copied into a malloc()ed buffer of exactly its size.
 *
 * Checked on every input:
 *   - the result is NGX_OK or NGX_ERROR;
 *   - on NGX_OK: state is claim, done, done with trailers or too-large;
 *     fingerprint and token point into the head; a claim is exactly the
 *     head, a too-large record the head and a status; for a done record
 *     200 <= status <= 599, headers <= headers_end <= body,
 *     body + body_len == data + len, no trailers; with trailers, at least
 *     one, and they start 4 bytes after the body;
 *   - walking rec->nheaders headers with
 *     ngx_http_idempotency_record_next_header(), as the replay does
 *     (reply.c), stays within [rec->headers, rec->headers_end) -- hence
 *     within [data, data + len) -- never yields an empty name nor a CR, LF
 *     or NUL, nor a name that is not a token (but for capture.c's three
 *     markers among the headers) or is one nginx frames the answer with,
 *     and ends exactly at rec->headers_end; the same for the
 *     rec->ntrailers trailers, which end exactly at data + len;
 *   - the record is canonical: encoding the decoded fields again gives back
 *     the input byte for byte (the format has no slack, so a decoder that
 *     accepts something else has skipped or misread part of it).
 */


#include "ngx_http_idempotency_module.h"
#include "fuzz.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>


/* the decoder must never log */

void
ngx_log_error_core(ngx_uint_t level, ngx_log_t *log, ngx_err_t err,
    const char *fmt, ...)
{
    fprintf(stderr, "fuzz_record: unexpected call to ngx_log_error_core()\n");
    abort();
}


static u_char *
put32(u_char *p, uint64_t v)
{
    p[0] = (u_char) (v >> 24);
    p[1] = (u_char) (v >> 16);
    p[2] = (u_char) (v >> 8);
    p[3] = (u_char) v;

    return p + 4;
}


static int
in_range(const u_char *p, size_t n, const u_char *start, const u_char *end)
{
    return p >= start && p <= end && n <= (size_t) (end - p);
}


/* the harness's own idea of a name a replay may send */

static int
sendable(const char *what, ngx_str_t *name)
{
    size_t       i;
    u_char       c, low[300];

    static const char  *markers[] = {
        ":content-type", ":location", ":status-line", NULL
    };
    static const char  *refused[] = {
        "connection", "keep-alive", "te", "trailer", "transfer-encoding",
        "upgrade", "content-length", "date", "server", "idempotent-replayed",
        NULL
    };

    if (strcmp(what, "header") == 0) {
        for (i = 0; markers[i]; i++) {
            if (strlen(markers[i]) == name->len
                && memcmp(markers[i], name->data, name->len) == 0)
            {
                return 1;
            }
        }
    }

    if (name->len > 256) {
        return 0;
    }

    for (i = 0; i < name->len; i++) {
        c = name->data[i];

        if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'z')
              || (c >= 'A' && c <= 'Z')
              || (c && strchr("!#$%&'*+-.^_`|~", c))))
        {
            return 0;
        }

        low[i] = (c >= 'A' && c <= 'Z') ? c + 32 : c;
    }

    if (name->len > 6 && memcmp(low, "proxy-", 6) == 0) {
        return 0;
    }

    for (i = 0; refused[i]; i++) {
        if (strlen(refused[i]) == name->len
            && memcmp(refused[i], low, name->len) == 0)
        {
            return 0;
        }
    }

    return 1;
}


/* the walk the replay does (reply.c) over n fields in [start, end) */

static void
walk(const char *what, u_char *start, u_char *end, size_t n, u_char *buf,
    u_char *last)
{
    u_char     *p;
    size_t      i;
    ngx_str_t   name, value;

    p = start;

    for (i = 0; i < n; i++) {
        /* a field is at least two 4-byte lengths */
        fuzz_assert(end - p >= 8,
                    "%s walk runs past its end: the count is %zu but the "
                    "region (%td bytes) ends after %zu", what, n,
                    end - start, i);

        p = ngx_http_idempotency_record_next_header(p, &name, &value);

        fuzz_assert(in_range(name.data, name.len, start, end)
                    && in_range(name.data, name.len, buf, last),
                    "%s %zu: name outside the region", what, i);
        fuzz_assert(in_range(value.data, value.len, start, end)
                    && in_range(value.data, value.len, buf, last),
                    "%s %zu: value outside the region", what, i);
        fuzz_assert(p <= end, "%s %zu ends past the region", what, i);
        fuzz_assert(name.len > 0, "%s %zu: empty name", what, i);
        fuzz_assert(memchr(name.data, '\r', name.len) == NULL
                    && memchr(name.data, '\n', name.len) == NULL
                    && memchr(name.data, '\0', name.len) == NULL
                    && memchr(value.data, '\r', value.len) == NULL
                    && memchr(value.data, '\n', value.len) == NULL
                    && memchr(value.data, '\0', value.len) == NULL,
                    "%s %zu: CR, LF or NUL", what, i);
        fuzz_assert(sendable(what, &name),
                    "%s %zu: a name no replay may send", what, i);
    }

    fuzz_assert(p == end, "the walk of %zu %ss ends %td bytes before its end",
                n, what, end - p);
}


/* encodes n fields again */

static u_char *
encode(u_char *e, u_char *p, size_t n)
{
    size_t      i;
    ngx_str_t   name, value;

    e = put32(e, n);

    for (i = 0; i < n; i++) {
        p = ngx_http_idempotency_record_next_header(p, &name, &value);
        e = put32(e, name.len);
        memcpy(e, name.data, name.len);
        e += name.len;
        e = put32(e, value.len);
        memcpy(e, value.data, value.len);
        e += value.len;
    }

    return e;
}


int
LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    u_char                         *buf, *last, *enc, *e;
    ngx_int_t                       rc;
    ngx_http_idempotency_record_t   rec;

    /* exactly size bytes: ASan flags any access past the record */
    buf = malloc(size);
    if (buf == NULL && size) {
        abort();
    }

    memcpy(buf, data, size);
    last = buf + size;

    memset(&rec, 0xa5, sizeof(rec));

    rc = ngx_http_idempotency_record_decode(buf, size, &rec);

    fuzz_assert(rc == NGX_OK || rc == NGX_ERROR, "rc %ld", (long) rc);
    fuzz_assert(memcmp(buf, data, size) == 0, "the decoder modified the data");

    if (rc != NGX_OK) {
        free(buf);
        return 0;
    }

    fuzz_assert(size >= NGX_HTTP_IDEMPOTENCY_HEAD_LEN
                && memcmp(buf, NGX_HTTP_IDEMPOTENCY_MAGIC, 4) == 0,
                "accepted without a head");
    fuzz_assert(rec.state == buf[4], "state %lu", (unsigned long) rec.state);
    fuzz_assert(rec.fingerprint == buf + 5, "fingerprint misplaced");
    fuzz_assert(rec.token == buf + 5 + NGX_HTTP_IDEMPOTENCY_HASH_LEN,
                "token misplaced");

    switch (rec.state) {

    case NGX_HTTP_IDEMPOTENCY_REC_CLAIM:
        fuzz_assert(size == NGX_HTTP_IDEMPOTENCY_HEAD_LEN,
                    "claim of %zu bytes", size);
        free(buf);
        return 0;

    case NGX_HTTP_IDEMPOTENCY_REC_TOO_LARGE:
        fuzz_assert(size == NGX_HTTP_IDEMPOTENCY_HEAD_LEN + 2,
                    "too-large record of %zu bytes", size);
        fuzz_assert(rec.status == ((ngx_uint_t) buf[53] << 8 | buf[54]),
                    "status %lu", (unsigned long) rec.status);
        free(buf);
        return 0;

    case NGX_HTTP_IDEMPOTENCY_REC_DONE:
    case NGX_HTTP_IDEMPOTENCY_REC_DONE_TRAILERS:
        break;

    default:
        fuzz_assert(0, "accepted state %lu", (unsigned long) rec.state);
    }

    fuzz_assert(rec.status >= 200 && rec.status <= 599,
                "status %lu", (unsigned long) rec.status);
    fuzz_assert(rec.headers == buf + NGX_HTTP_IDEMPOTENCY_HEAD_LEN + 6,
                "headers misplaced");
    fuzz_assert(rec.headers <= rec.headers_end && rec.headers_end <= last,
                "headers_end outside the record");
    fuzz_assert(rec.body == rec.headers_end + 8, "body misplaced");
    fuzz_assert(rec.body >= buf && rec.body <= last
                && rec.body_len <= (size_t) (last - rec.body),
                "body outside the record (body at +%td, %zu bytes, "
                "record of %zu)", rec.body - buf, rec.body_len, size);

    if (rec.state == NGX_HTTP_IDEMPOTENCY_REC_DONE) {
        fuzz_assert(rec.body + rec.body_len == last,
                    "body + body_len != data + len (body at +%td, %zu bytes, "
                    "record of %zu)", rec.body - buf, rec.body_len, size);
        fuzz_assert(rec.ntrailers == 0, "%lu trailers without the state",
                    (unsigned long) rec.ntrailers);

    } else {
        fuzz_assert(rec.ntrailers > 0, "the trailer state without trailers");
        fuzz_assert(rec.trailers == rec.body + rec.body_len + 4,
                    "trailers misplaced");
    }

    walk("header", rec.headers, rec.headers_end, rec.nheaders, buf, last);

    if (rec.ntrailers) {
        walk("trailer", rec.trailers, last, rec.ntrailers, buf, last);
    }

    /* encode the decoded fields again: must give back the input */

    enc = malloc(size);
    if (enc == NULL) {
        abort();
    }

    e = enc;
    memcpy(e, NGX_HTTP_IDEMPOTENCY_MAGIC, 4);
    e += 4;
    *e++ = (u_char) rec.state;
    memcpy(e, rec.fingerprint, NGX_HTTP_IDEMPOTENCY_HASH_LEN);
    e += NGX_HTTP_IDEMPOTENCY_HASH_LEN;
    memcpy(e, rec.token, NGX_HTTP_IDEMPOTENCY_TOKEN_LEN);
    e += NGX_HTTP_IDEMPOTENCY_TOKEN_LEN;
    *e++ = (u_char) (rec.status >> 8);
    *e++ = (u_char) rec.status;
    e = encode(e, rec.headers, rec.nheaders);
    e = put32(e, (uint64_t) rec.body_len >> 32);
    e = put32(e, rec.body_len);
    memcpy(e, rec.body, rec.body_len);
    e += rec.body_len;

    if (rec.ntrailers) {
        e = encode(e, rec.trailers, rec.ntrailers);
    }

    fuzz_assert(e == enc + size && memcmp(enc, buf, size) == 0,
                "re-encoding the decoded record differs from the input");

    free(enc);
    free(buf);

    return 0;
}
