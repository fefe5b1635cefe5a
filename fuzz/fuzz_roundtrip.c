
/*
 * libFuzzer round trip through src/http/ngx_http_idempotency_capture.c,
 * src/store/ngx_http_idempotency_build.c and
 * src/store/ngx_http_idempotency_record.c: a response built from the input
 * is serialised with ngx_http_idempotency_capture_header(), its body given
 * to the builder the way filter.c gives it (in two pieces), the record
 * ended with ngx_http_idempotency_builder_end(), then read back with
 * ngx_http_idempotency_record_decode().
 *
 * Input:
 *   byte 0      bit 0: Content-Type set, bit 1: a status line set,
 *               bits 2-3: 0 body with Content-Length, 1 body of unknown
 *               length (chunks), 2 header-only response (HEAD, 204),
 *               bit 4: the type and charset split as the upstream module
 *               does (else the whole value is the type, as default_type),
 *               bit 5: the first header is r->headers_out.location,
 *               bits 6-7: how many of the last pairs are trailers
 *   bytes 1-2   status, 200 + n % 400
 *   bytes 3-4   idempotency_store_max_size
 *   the rest    fields split on LF: [Content-Type] [status line]
 *               name value name value ... body (the last field)
 *               A name starting with 0x7f is a deleted header (hash 0).
 *
 * Checked: capture_header() declines exactly when the head, or the head and
 * the announced body, exceed store_max_size; otherwise it writes exactly the
 * computed head, and the record decodes to the status, the headers nginx
 * would keep (not hop-by-hop, not proxy-*, not hidden, name <= 256 bytes,
 * Content-Type and status line first, ":location" before the Location) in
 * order, and the body.  A name or value with CR or NUL (LF splits the
 * input) is not stored, with one warning each; the rest must decode.  The
 * stored Content-Type, split again as the replay does, gives back the type
 * length and charset the filters saw, or is ":content-type", the whole
 * value being the type.  A header-only response (HEAD, 204) ends with no
 * body whatever its Content-Length said.  Then, unless the response is
 * header-only, the trailers are added as filter.c adds them at the last
 * buffer and the record ended again: builder_end() declines exactly when
 * their section would take the record past store_max_size (filter.c then
 * stores "too large"), else the record decodes as "done with trailers" to
 * the same status, headers and body and to the trailers kept by the same
 * rules (CR or NUL dropped), in order.
 */


#include "ngx_http_idempotency_module.h"
#include "fuzz.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <ctype.h>


#define MAX_FIELDS   64
#define PART_NALLOC  3
#define MAX_ALLOCS   256


static ngx_pool_t  *fake_pool = (ngx_pool_t *) "pool";
static void        *allocs[MAX_ALLOCS];
static ngx_uint_t   nallocs;


/* exact-size allocations, so that ASan sees a write past the record */

void *
ngx_pnalloc(ngx_pool_t *pool, size_t size)
{
    void  *p;

    fuzz_assert(pool == fake_pool, "ngx_pnalloc() with another pool");
    fuzz_assert(nallocs < MAX_ALLOCS, "too many allocations");

    p = malloc(size ? size : 1);
    if (p == NULL) {
        abort();
    }

    allocs[nallocs++] = p;

    return p;
}


void *
ngx_palloc(ngx_pool_t *pool, size_t size)
{
    return ngx_pnalloc(pool, size);
}


/* the builder's field list grows as nginx's arrays do, by copying */

void *
ngx_array_push(ngx_array_t *a)
{
    void  *elts;

    if (a->nelts == a->nalloc) {
        elts = ngx_pnalloc(a->pool, 2 * a->size * a->nalloc);
        memcpy(elts, a->elts, a->size * a->nalloc);
        a->elts = elts;
        a->nalloc *= 2;
    }

    return (u_char *) a->elts + a->size * a->nelts++;
}


ngx_buf_t *
ngx_create_temp_buf(ngx_pool_t *pool, size_t size)
{
    ngx_buf_t  *b;

    b = ngx_pnalloc(pool, sizeof(ngx_buf_t));
    memset(b, 0, sizeof(ngx_buf_t));

    b->start = ngx_pnalloc(pool, size);
    b->pos = b->start;
    b->last = b->start;
    b->end = b->start + size;
    b->temporary = 1;

    return b;
}


ngx_chain_t *
ngx_alloc_chain_link(ngx_pool_t *pool)
{
    return ngx_pnalloc(pool, sizeof(ngx_chain_t));
}


void
ngx_strlow(u_char *dst, u_char *src, size_t n)
{
    while (n) {
        *dst = ngx_tolower(*src);
        dst++;
        src++;
        n--;
    }
}


/* the default (set-cookie hidden), and idempotency_hide_header x-hide-me */

static ngx_str_t    fuzz_hide[] = { ngx_string("x-hide-me") };
static ngx_array_t  fuzz_hide_headers = { fuzz_hide, 1, sizeof(ngx_str_t), 1,
                                          NULL };
static ngx_http_idempotency_loc_conf_t  fuzz_conf;


/* records are built in clear here: crypt.c (sealing) is not linked */

size_t
ngx_http_idempotency_crypt_room(ngx_array_t *keys)
{
    return 0;
}


ngx_int_t
ngx_strncasecmp(u_char *s1, u_char *s2, size_t n)
{
    ngx_uint_t  c1, c2;

    while (n) {
        c1 = tolower(*s1++);
        c2 = tolower(*s2++);

        if (c1 != c2) {
            return c1 < c2 ? -1 : 1;
        }

        if (c1 == 0) {
            return 0;
        }

        n--;
    }

    return 0;
}


static ngx_uint_t  nwarnings;


void
ngx_log_error_core(ngx_uint_t level, ngx_log_t *log, ngx_err_t err,
    const char *fmt, ...)
{
    fuzz_assert(level == NGX_LOG_WARN, "log level %lu", (unsigned long) level);
    nwarnings++;
}


/* the harness's own idea of what is stored: a token, not refused */

static int
stored(ngx_table_elt_t *h)
{
    u_char       c, low[256];
    size_t       i;
    ngx_str_t    s;

    static const char  *skip[] = {
        "connection", "keep-alive", "te", "trailer", "transfer-encoding",
        "upgrade", "content-length", "date", "server", "idempotent-replayed",
        NULL
    };

    if (h->hash == 0 || h->key.len == 0 || h->key.len > 256) {
        return 0;
    }

    for (i = 0; i < h->key.len; i++) {
        c = h->key.data[i];

        if (c == '\0' || c >= 0x80
            || !(isalnum(c) || strchr("!#$%&'*+-.^_`|~", c)))
        {
            return 0;
        }

        low[i] = (u_char) tolower(h->key.data[i]);
    }

    if (h->key.len > 6 && memcmp(low, "proxy-", 6) == 0) {
        return 0;
    }

    for (i = 0; skip[i]; i++) {
        if (strlen(skip[i]) == h->key.len
            && memcmp(skip[i], low, h->key.len) == 0)
        {
            return 0;
        }
    }

    s.len = h->key.len;
    s.data = low;

    return ngx_http_idempotency_store_header(&fuzz_conf, &s) ? 1 : 0;
}


/* a status line stored: its status, then a space and a phrase, no CTL */

static int
status_line_stored(ngx_str_t *line, ngx_uint_t status)
{
    size_t  i;
    char    digits[4];

    snprintf(digits, sizeof(digits), "%03lu", (unsigned long) status);

    if (line->len < 3 || memcmp(line->data, digits, 3) != 0
        || (line->len > 3 && line->data[3] != ' '))
    {
        return 0;
    }

    for (i = 0; i < line->len; i++) {
        if ((line->data[i] < 0x20 && line->data[i] != '\t')
            || line->data[i] == 0x7f)
        {
            return 0;
        }
    }

    return 1;
}


/* a list in parts of PART_NALLOC, as ngx_list_push makes them */

static void
build_list(ngx_list_t *list, ngx_table_elt_t *elts, ngx_list_part_t *parts,
    ngx_uint_t n)
{
    ngx_uint_t        i;
    ngx_list_part_t  *part;

    list->part.elts = elts;
    list->part.nelts = ngx_min(n, PART_NALLOC);
    list->part.next = NULL;
    list->size = sizeof(ngx_table_elt_t);
    list->nalloc = PART_NALLOC;
    list->pool = fake_pool;
    part = &list->part;

    for (i = PART_NALLOC; i < n; i += PART_NALLOC) {
        parts[i].elts = &elts[i];
        parts[i].nelts = ngx_min(n - i, PART_NALLOC);
        parts[i].next = NULL;
        part->next = &parts[i];
        part = &parts[i];
    }

    list->last = part;
}


/* the n fields at p are the expected ones, in order; returns their end */

static u_char *
same_fields(const char *what, u_char *p, size_t n, ngx_str_t *exp_name,
    ngx_str_t *exp_value)
{
    size_t      i;
    ngx_str_t   name, value;

    for (i = 0; i < n; i++) {
        p = ngx_http_idempotency_record_next_header(p, &name, &value);

        fuzz_assert(name.len == exp_name[i].len
                    && memcmp(name.data, exp_name[i].data, name.len) == 0
                    && value.len == exp_value[i].len
                    && memcmp(value.data, exp_value[i].data, value.len) == 0,
                    "%s %zu differs", what, i);
    }

    return p;
}


static int
bad_bytes(ngx_str_t *s)
{
    return memchr(s->data, '\r', s->len) != NULL
           || memchr(s->data, '\n', s->len) != NULL
           || memchr(s->data, '\0', s->len) != NULL;
}


int
LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    u_char                           *copy, *p, *last, *rec_data, *q;
    u_char                            head[NGX_HTTP_IDEMPOTENCY_HEAD_LEN];
    size_t                            i, nfields, head_size, rec_len, nexp;
    size_t                            ntexp, tsize, tlen, hoff, boff;
    ngx_int_t                         rc;
    ngx_uint_t                        flags, mode, nh, nt;
    ngx_str_t                         fields[MAX_FIELDS], body;
    ngx_str_t                         exp_name[MAX_FIELDS];
    ngx_str_t                         exp_value[MAX_FIELDS];
    ngx_list_part_t                   parts[MAX_FIELDS], tparts[MAX_FIELDS];
    ngx_table_elt_t                  *h, elts[MAX_FIELDS];
    ngx_http_request_t               *r;
    ngx_http_idempotency_record_t     rec;
    ngx_http_idempotency_builder_t    bd;
    ngx_http_idempotency_loc_conf_t   conf;
    ngx_connection_t                  c;
    ngx_uint_t                        nbad;
    ngx_str_t                         charset;
    ngx_log_t                         log;
    size_t                            type_len;

    if (size < 5) {
        return 0;
    }

    flags = data[0];
    mode = (flags >> 2) & 3;

    if (mode == 3) {
        return 0;
    }

    copy = malloc(size - 5);
    if (copy == NULL && size > 5) {
        abort();
    }

    memcpy(copy, data + 5, size - 5);

    /* split on LF */

    nfields = 0;
    p = copy;
    last = copy + (size - 5);

    for ( ;; ) {
        q = memchr(p, '\n', last - p);

        if (nfields == MAX_FIELDS) {
            break;
        }

        fields[nfields].data = p;
        fields[nfields].len = (q ? q : last) - p;
        nfields++;

        if (q == NULL) {
            break;
        }

        p = q + 1;
    }

    r = calloc(1, sizeof(ngx_http_request_t));
    if (r == NULL) {
        abort();
    }

    ngx_memzero(&log, sizeof(ngx_log_t));
    ngx_memzero(&c, sizeof(ngx_connection_t));
    log.log_level = NGX_LOG_WARN;
    c.log = &log;

    r->connection = &c;
    r->pool = fake_pool;
    r->headers_out.status = 200 + (((ngx_uint_t) data[1] << 8 | data[2]) % 400);

    ngx_memzero(&conf, sizeof(conf));
    conf.store_max_size = (size_t) data[3] << 8 | data[4];
    conf.hide_headers = &fuzz_hide_headers;
    fuzz_conf = conf;

    i = 0;

    if ((flags & 1) && i < nfields) {
        r->headers_out.content_type = fields[i++];
        r->headers_out.content_type_len = r->headers_out.content_type.len;

        if (flags & 0x10) {
            ngx_http_idempotency_content_type(&r->headers_out.content_type,
                                          &r->headers_out.content_type_len,
                                          &r->headers_out.charset);
        }
    }

    if ((flags & 2) && i < nfields) {
        r->headers_out.status_line = fields[i++];
    }

    /* the last field is the body; the ones before it pairs of headers */

    body.len = 0;
    body.data = NULL;

    if (i < nfields) {
        body = fields[--nfields];
    }

    nh = 0;

    for ( /* void */ ; i + 1 < nfields; i += 2) {
        h = &elts[nh];
        h->key = fields[i];
        h->value = fields[i + 1];
        h->hash = (h->key.len && h->key.data[0] == 0x7f) ? 0 : 1;
        h->lowcase_key = NULL;
        nh++;
    }

    /* the last pairs are trailers, as many as byte 0 says */

    nt = ngx_min(flags >> 6, nh);
    nh -= nt;

    build_list(&r->headers_out.headers, elts, parts, nh);
    build_list(&r->headers_out.trailers, &elts[nh], tparts, nt);

    if ((flags & 0x20) && nh) {
        r->headers_out.location = &elts[0];
    }

    /* what should be stored */

    nexp = 0;
    nbad = 0;
    head_size = NGX_HTTP_IDEMPOTENCY_HEAD_LEN + 2 + 4 + 8;

    if (r->headers_out.content_type.len) {
        if (bad_bytes(&r->headers_out.content_type)) {
            nbad++;

        } else {
            /*
             * "Content-Type" if the replay, splitting it again, gets back
             * the type and charset the filters saw; else taken whole
             */

            ngx_http_idempotency_content_type(&r->headers_out.content_type,
                                              &type_len, &charset);

            if (type_len == r->headers_out.content_type_len
                && charset.len == r->headers_out.charset.len
                && (charset.len == 0
                    || memcmp(charset.data, r->headers_out.charset.data,
                              charset.len) == 0))
            {
                exp_name[nexp].data = (u_char *) "Content-Type";
                exp_name[nexp].len = 12;

            } else {
                fuzz_assert(!(flags & 0x10), "an upstream type taken whole");
                fuzz_assert(r->headers_out.content_type_len
                            == r->headers_out.content_type.len
                            && r->headers_out.charset.len == 0,
                            "a split type taken whole");
                exp_name[nexp].data = (u_char *) ":content-type";
                exp_name[nexp].len = 13;
            }

            exp_value[nexp++] = r->headers_out.content_type;
        }
    }

    if (r->headers_out.status_line.len) {
        if (!status_line_stored(&r->headers_out.status_line,
                                r->headers_out.status))
        {
            nbad++;

        } else {
            exp_name[nexp].data = (u_char *) ":status-line";
            exp_name[nexp].len = 12;
            exp_value[nexp++] = r->headers_out.status_line;
        }
    }

    for (i = 0; i < nh; i++) {
        if (!stored(&elts[i])) {
            continue;
        }

        if (bad_bytes(&elts[i].key) || bad_bytes(&elts[i].value)) {
            nbad++;
            continue;
        }

        if (&elts[i] == r->headers_out.location) {
            exp_name[nexp].data = (u_char *) ":location";
            exp_name[nexp].len = 9;
            exp_value[nexp].data = (u_char *) "";
            exp_value[nexp++].len = 0;
        }

        exp_name[nexp] = elts[i].key;
        exp_value[nexp++] = elts[i].value;
    }

    for (i = 0; i < nexp; i++) {
        head_size += 8 + exp_name[i].len + exp_value[i].len;
    }

    /* capture_header(), as the header filter calls it */

    for (i = 0; i < sizeof(head); i++) {
        head[i] = (u_char) (i * 7 + 1);
    }

    memcpy(head, NGX_HTTP_IDEMPOTENCY_MAGIC, 4);
    head[4] = NGX_HTTP_IDEMPOTENCY_REC_CLAIM;

    r->headers_out.content_length_n = (mode == 1) ? -1 : (off_t) body.len;
    nallocs = 0;
    nwarnings = 0;

    rc = ngx_http_idempotency_capture_header(r, &conf, &bd, head);

    fuzz_assert(rc == NGX_OK || rc == NGX_DECLINED, "rc %ld", (long) rc);
    fuzz_assert(nwarnings == nbad, "%lu warnings for %lu bad headers",
                (unsigned long) nwarnings, (unsigned long) nbad);

    if (head_size > conf.store_max_size
        || (bd.expected > 0
            && (size_t) bd.expected > conf.store_max_size - head_size))
    {
        fuzz_assert(rc == NGX_DECLINED,
                    "head of %zu bytes and body of %ld fit in %zu?",
                    head_size, (long) bd.expected, conf.store_max_size);
        goto done;
    }

    fuzz_assert(rc == NGX_OK, "declined a head of %zu bytes and a body of "
                "%ld in %zu", head_size, (long) bd.expected,
                conf.store_max_size);
    fuzz_assert(bd.last - bd.start == (ptrdiff_t) head_size,
                "head of %td bytes, expected %zu", bd.last - bd.start,
                head_size);

    /* the body, as the body filter gives it, then the end */

    if (mode == 0) {
        fuzz_assert(bd.end - bd.last == (ptrdiff_t) body.len,
                    "room for %td body bytes, expected %zu",
                    bd.end - bd.last, body.len);
    }

    if (mode != 2 && body.len) {
        rc = ngx_http_idempotency_builder_body(&bd, body.data, body.len / 2);

        if (rc == NGX_OK) {
            rc = ngx_http_idempotency_builder_body(&bd,
                                                   body.data + body.len / 2,
                                                   body.len - body.len / 2);
        }

        if (mode == 1 && head_size + body.len > conf.store_max_size) {
            fuzz_assert(rc == NGX_DECLINED, "a body of %zu past %zu taken",
                        body.len, conf.store_max_size);
            goto done;
        }

        fuzz_assert(rc == NGX_OK, "the body: %ld", (long) rc);
    }

    if (mode == 2) {
        body.len = 0;
    }

    rc = ngx_http_idempotency_builder_end(&bd, mode == 2, &rec_data,
                                          &rec_len);

    fuzz_assert(rc == NGX_OK, "end without trailers: %ld", (long) rc);
    fuzz_assert(rec_len == head_size + body.len, "a record of %zu bytes, "
                "expected %zu", rec_len, head_size + body.len);

    rc = ngx_http_idempotency_record_decode(rec_data, rec_len, &rec);

    fuzz_assert(rc == NGX_OK, "a record of %zu bytes does not decode",
                rec_len);
    fuzz_assert(rec.state == NGX_HTTP_IDEMPOTENCY_REC_DONE, "state %lu",
                (unsigned long) rec.state);
    fuzz_assert(memcmp(rec.fingerprint, head + 5,
                       NGX_HTTP_IDEMPOTENCY_HASH_LEN) == 0
                && memcmp(rec.token, head + 5 + NGX_HTTP_IDEMPOTENCY_HASH_LEN,
                          NGX_HTTP_IDEMPOTENCY_TOKEN_LEN) == 0,
                "fingerprint or token changed");
    fuzz_assert(rec.status == r->headers_out.status, "status %lu, not %lu",
                (unsigned long) rec.status,
                (unsigned long) r->headers_out.status);
    fuzz_assert(rec.nheaders == nexp, "%lu headers, expected %zu",
                (unsigned long) rec.nheaders, nexp);

    p = same_fields("header", rec.headers, nexp, exp_name, exp_value);

    fuzz_assert(p == rec.headers_end, "headers end misplaced");
    fuzz_assert(rec.body_len == body.len
                && (body.len == 0
                    || memcmp(rec.body, body.data, body.len) == 0),
                "body differs (%zu bytes, expected %zu)", rec.body_len,
                body.len);

    hoff = rec.headers - rec_data;
    boff = rec.body - rec_data;

    if (mode == 2) {
        /* header-only: stored by the header filter, no trailers follow */
        goto done;
    }

    /* the trailers, as ngx_http_idempotency_store() appends them */

    ntexp = 0;
    tsize = 4;

    for (i = nh; i < nh + nt; i++) {
        if (stored(&elts[i])
            && !bad_bytes(&elts[i].key) && !bad_bytes(&elts[i].value))
        {
            exp_name[ntexp] = elts[i].key;
            exp_value[ntexp] = elts[i].value;
            tsize += 8 + elts[i].key.len + elts[i].value.len;
            ntexp++;
        }
    }

    if (ntexp == 0) {
        tsize = 0;
    }

    if (tsize == 0) {
        goto done;
    }

    rc = ngx_http_idempotency_capture_trailers(r, &conf, &bd);
    fuzz_assert(rc == NGX_OK, "trailers: %ld", (long) rc);

    rc = ngx_http_idempotency_builder_end(&bd, 0, &q, &tlen);

    if (tsize > conf.store_max_size - rec_len) {
        fuzz_assert(rc == NGX_DECLINED, "a trailer section of %zu past %zu "
                    "taken", tsize, conf.store_max_size);
        goto done;
    }

    fuzz_assert(rc == NGX_OK, "end with trailers: %ld", (long) rc);
    fuzz_assert(tlen == rec_len + tsize, "a record of %zu bytes with "
                "trailers, expected %zu", tlen, rec_len + tsize);

    rc = ngx_http_idempotency_record_decode(q, rec_len + tsize, &rec);

    fuzz_assert(rc == NGX_OK, "a record of %zu bytes with trailers does not "
                "decode", rec_len + tsize);
    fuzz_assert(rec.state == NGX_HTTP_IDEMPOTENCY_REC_DONE_TRAILERS,
                "state %lu", (unsigned long) rec.state);
    fuzz_assert(rec.status == r->headers_out.status
                && rec.nheaders == nexp
                && rec.headers == q + hoff
                && rec.body_len == body.len
                && rec.body == q + boff,
                "status, headers or body moved by the trailers");
    fuzz_assert(rec.ntrailers == ntexp, "%lu trailers, expected %zu",
                (unsigned long) rec.ntrailers, ntexp);

    p = same_fields("trailer", rec.trailers, ntexp, exp_name, exp_value);

    fuzz_assert(p == q + rec_len + tsize, "trailers end misplaced");

done:

    for (i = 0; i < nallocs; i++) {
        free(allocs[i]);
    }

    free(r);
    free(copy);

    return 0;
}
