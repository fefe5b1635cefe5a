
/*
 * libFuzzer target for the JSON pointer's parser and the streaming scanner
 * (src/http/ngx_http_idempotency_json.c).
 *
 * Input: byte 0 chooses max (1..255, or 1024 for 0xff), then the pointer
 * as configured up to the first LF, then the body.  The pointer's text,
 * the body and every piece fed are malloc()ed at exactly their size, so
 * ASan sees a read past what the scanner was given; the pool's
 * allocations are exact too.
 *
 * Checked on every input:
 *   - the pointer's parser agrees with a reference decoder (RFC 6901):
 *     the same verdict, tokens and indexes;
 *   - the scanner gives the same result (rc, key bytes, reason, offset)
 *     for the body fed in one piece, one byte at a time with empty feeds
 *     between, and in three pseudo-random splits derived from the input;
 *   - on NGX_OK the key is 1..max bytes of printable ASCII; the offset is
 *     the body's length unless an error came before its end;
 *   - the result equals that of an independent recursive-descent
 *     reference written from RFC 8259 and RFC 3629's grammars: the same
 *     rc, key, offset of the first error, and its class (the document is
 *     not valid JSON, ends early, is empty, nests too deep) or, for an
 *     error about the key, the same reason.
 */


#include "ngx_http_idempotency_json.h"
#include "fuzz.h"

#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>


#define MAX_KEY     1024
#define MAX_ALLOCS  8
#define DEPTH       NGX_HTTP_IDEMPOTENCY_JSON_DEPTH


static ngx_pool_t  *fake_pool = (ngx_pool_t *) "pool";
static void        *allocs[MAX_ALLOCS];
static ngx_uint_t   nallocs;


/* exact-size allocations, freed after each use of the code under test */

void *
ngx_palloc(ngx_pool_t *pool, size_t size)
{
    void  *p;

    fuzz_assert(pool == fake_pool, "ngx_palloc() with another pool");
    fuzz_assert(nallocs < MAX_ALLOCS, "too many allocations");

    p = malloc(size ? size : 1);
    if (p == NULL) {
        abort();
    }

    allocs[nallocs++] = p;

    return p;
}


void *
ngx_pnalloc(ngx_pool_t *pool, size_t size)
{
    return ngx_palloc(pool, size);
}


static void
free_allocs(ngx_uint_t from)
{
    while (nallocs > from) {
        free(allocs[--nallocs]);
    }
}


/* the reasons about the key; any other is about the document */

static const char  *key_reasons[] = {
    "the member at the pointer is an object",
    "the member at the pointer is an array",
    "the member at the pointer is null",
    "the member at the pointer is a boolean",
    "the member at the pointer is a number with a fraction or exponent",
    "the key has a character outside printable ASCII",
    "the key is empty",
    "the key is longer than idempotency_key_max_length",
    "a member on the pointer appears twice",
    NULL
};

#define R_OBJECT    key_reasons[0]
#define R_ARRAY     key_reasons[1]
#define R_NULL      key_reasons[2]
#define R_BOOLEAN   key_reasons[3]
#define R_FRACTION  key_reasons[4]
#define R_ASCII     key_reasons[5]
#define R_EMPTY     key_reasons[6]
#define R_LONG      key_reasons[7]
#define R_TWICE     key_reasons[8]

#define R_END       "the body ends inside the JSON"
#define R_NOT_JSON  "the body is not JSON"
#define R_DEPTH     "the body nests deeper than 64 levels"


/* --- the reference: the grammars, read recursively from a whole buffer */

typedef struct {
    size_t          ntokens;
    const u_char   *name[DEPTH];
    size_t          len[DEPTH];
    long            index[DEPTH];
    u_char         *names;
} ref_pointer_t;


#define COLLECT_NONE  0
#define COLLECT_NAME  1
#define COLLECT_KEY   2


typedef struct {
    const u_char   *b;
    size_t          len;
    size_t          i;
    ref_pointer_t  *ptr;
    size_t          max;

    const char     *why;       /* NULL: no error */
    size_t          at;

    int             collect;
    u_char         *name;      /* the name being read, decoded */
    size_t          name_len;
    u_char          key[MAX_KEY];
    size_t          key_len;
    int             found;
} ref_t;


static const char  SYNTAX[] = "syntax";


/* "0", or 1 to 9 digits not starting with "0" */

static long
ref_index(const u_char *name, size_t len)
{
    size_t  j;
    long    v;

    if (len == 0 || len > 9 || (name[0] == '0' && len != 1)) {
        return -1;
    }

    v = 0;

    for (j = 0; j < len; j++) {
        if (!isdigit(name[j])) {
            return -1;
        }

        v = v * 10 + (name[j] - '0');
    }

    return v;
}


static int
ref_pointer(const u_char *t, size_t n, ref_pointer_t *rp)
{
    size_t   i, k;
    u_char  *d;

    if (n == 0 || t[0] != '/') {
        return -1;
    }

    rp->ntokens = 0;
    rp->names = malloc(n);
    d = rp->names;

    for (i = 1; i <= n; /* void */ ) {
        if (rp->ntokens == DEPTH) {
            return -1;
        }

        rp->name[rp->ntokens] = d;

        while (i < n && t[i] != '/') {
            if (t[i] == '~') {
                if (i + 1 >= n || (t[i + 1] != '0' && t[i + 1] != '1')) {
                    return -1;
                }

                *d++ = (t[i + 1] == '0') ? '~' : '/';
                i += 2;
                continue;
            }

            *d++ = t[i++];
        }

        k = rp->ntokens++;
        rp->len[k] = d - rp->name[k];
        rp->index[k] = ref_index(rp->name[k], rp->len[k]);

        i++;    /* past the '/', or past the end */
    }

    return 0;
}


static void
ref_fail(ref_t *r, size_t at, const char *why)
{
    if (r->why == NULL) {
        r->why = why;
        r->at = at;
    }
}


static int
ref_end(ref_t *r)
{
    if (r->i >= r->len) {
        ref_fail(r, r->len, R_END);
        return 1;
    }

    return 0;
}


static void
ref_ws(ref_t *r)
{
    while (r->i < r->len && (r->b[r->i] == ' ' || r->b[r->i] == '\t'
                             || r->b[r->i] == '\n' || r->b[r->i] == '\r'))
    {
        r->i++;
    }
}


/* a decoded byte of a string, or an integer's byte, at offset at */

static void
ref_out(ref_t *r, u_char ch, size_t at)
{
    if (r->collect == COLLECT_NAME) {
        r->name[r->name_len++] = ch;

    } else if (r->collect == COLLECT_KEY) {
        if (ch < 0x20 || ch > 0x7e) {
            ref_fail(r, at, R_ASCII);

        } else if (r->key_len == r->max) {
            ref_fail(r, at, R_LONG);

        } else {
            r->key[r->key_len++] = ch;
        }
    }
}


static long
ref_hex4(ref_t *r)
{
    int     k;
    long    v;
    u_char  c;

    v = 0;

    for (k = 0; k < 4; k++) {
        if (ref_end(r)) {
            return -1;
        }

        c = r->b[r->i];

        if (c >= '0' && c <= '9') {
            v = v * 16 + (c - '0');
        } else if (c >= 'a' && c <= 'f') {
            v = v * 16 + (c - 'a' + 10);
        } else if (c >= 'A' && c <= 'F') {
            v = v * 16 + (c - 'A' + 10);
        } else {
            ref_fail(r, r->i, SYNTAX);
            return -1;
        }

        r->i++;
    }

    return v;
}


static void
ref_code_point(ref_t *r, long cp, size_t at)
{
    if (cp < 0x80) {
        ref_out(r, (u_char) cp, at);

    } else if (cp < 0x800) {
        ref_out(r, (u_char) (0xc0 + cp / 64), at);
        ref_out(r, (u_char) (0x80 + cp % 64), at);

    } else if (cp < 0x10000) {
        ref_out(r, (u_char) (0xe0 + cp / 4096), at);
        ref_out(r, (u_char) (0x80 + cp / 64 % 64), at);
        ref_out(r, (u_char) (0x80 + cp % 64), at);

    } else {
        ref_out(r, (u_char) (0xf0 + cp / 262144), at);
        ref_out(r, (u_char) (0x80 + cp / 4096 % 64), at);
        ref_out(r, (u_char) (0x80 + cp / 64 % 64), at);
        ref_out(r, (u_char) (0x80 + cp % 64), at);
    }
}


static void
ref_unicode(ref_t *r)
{
    long  cp, lo;

    cp = ref_hex4(r);

    if (cp < 0) {
        return;
    }

    if (cp >= 0xdc00 && cp <= 0xdfff) {
        ref_fail(r, r->i - 1, SYNTAX);
        return;
    }

    if (cp >= 0xd800 && cp <= 0xdbff) {
        if (ref_end(r)) {
            return;
        }

        if (r->b[r->i] != '\\') {
            ref_fail(r, r->i, SYNTAX);
            return;
        }

        r->i++;

        if (ref_end(r)) {
            return;
        }

        if (r->b[r->i] != 'u') {
            ref_fail(r, r->i, SYNTAX);
            return;
        }

        r->i++;
        lo = ref_hex4(r);

        if (lo < 0) {
            return;
        }

        if (lo < 0xdc00 || lo > 0xdfff) {
            ref_fail(r, r->i - 1, SYNTAX);
            return;
        }

        cp = 0x10000 + (cp - 0xd800) * 1024 + (lo - 0xdc00);
    }

    ref_code_point(r, cp, r->i - 1);
}


/* RFC 3629, section 4: the lead byte, then the range of the second */

static const struct {
    u_char  first, last, n, lo, hi;
} utf8_seq[] = {
    { 0xc2, 0xdf, 1, 0x80, 0xbf },
    { 0xe0, 0xe0, 2, 0xa0, 0xbf },
    { 0xe1, 0xec, 2, 0x80, 0xbf },
    { 0xed, 0xed, 2, 0x80, 0x9f },
    { 0xee, 0xef, 2, 0x80, 0xbf },
    { 0xf0, 0xf0, 3, 0x90, 0xbf },
    { 0xf1, 0xf3, 3, 0x80, 0xbf },
    { 0xf4, 0xf4, 3, 0x80, 0x8f },
};


static void
ref_utf8(ref_t *r)
{
    size_t  s, k;
    u_char  c, lo, hi;

    c = r->b[r->i];

    for (s = 0; s < sizeof(utf8_seq) / sizeof(utf8_seq[0]); s++) {
        if (c >= utf8_seq[s].first && c <= utf8_seq[s].last) {
            break;
        }
    }

    if (s == sizeof(utf8_seq) / sizeof(utf8_seq[0])) {
        ref_fail(r, r->i, SYNTAX);
        return;
    }

    ref_out(r, c, r->i);
    r->i++;

    lo = utf8_seq[s].lo;
    hi = utf8_seq[s].hi;

    for (k = 0; k < utf8_seq[s].n && r->why == NULL; k++) {
        if (ref_end(r)) {
            return;
        }

        c = r->b[r->i];

        if (c < lo || c > hi) {
            ref_fail(r, r->i, SYNTAX);
            return;
        }

        ref_out(r, c, r->i);
        r->i++;
        lo = 0x80;
        hi = 0xbf;
    }
}


/* at the opening quote; on success, after the closing one */

static void
ref_string(ref_t *r)
{
    u_char  c;

    r->i++;

    while (r->why == NULL) {
        if (ref_end(r)) {
            return;
        }

        c = r->b[r->i];

        if (c == '"') {
            r->i++;
            return;
        }

        if (c < 0x20) {
            ref_fail(r, r->i, SYNTAX);
            return;
        }

        if (c >= 0x80) {
            ref_utf8(r);
            continue;
        }

        if (c != '\\') {
            ref_out(r, c, r->i++);
            continue;
        }

        r->i++;

        if (ref_end(r)) {
            return;
        }

        c = r->b[r->i];

        switch (c) {
        case '"': case '\\': case '/':
            ref_out(r, c, r->i++);
            break;
        case 'b':
            ref_out(r, 0x08, r->i++);
            break;
        case 'f':
            ref_out(r, 0x0c, r->i++);
            break;
        case 'n':
            ref_out(r, 0x0a, r->i++);
            break;
        case 'r':
            ref_out(r, 0x0d, r->i++);
            break;
        case 't':
            ref_out(r, 0x09, r->i++);
            break;
        case 'u':
            r->i++;
            ref_unicode(r);
            break;
        default:
            ref_fail(r, r->i, SYNTAX);
            return;
        }
    }
}


static int
ref_digit(ref_t *r)
{
    return r->i < r->len && r->b[r->i] >= '0' && r->b[r->i] <= '9';
}


/* one or more digits; r->collect says whether they are the key's */

static void
ref_digits(ref_t *r)
{
    if (ref_end(r)) {
        return;
    }

    if (!ref_digit(r)) {
        ref_fail(r, r->i, SYNTAX);
        return;
    }

    while (ref_digit(r) && r->why == NULL) {
        ref_out(r, r->b[r->i], r->i);
        r->i++;
    }
}


static void
ref_number(ref_t *r)
{
    if (r->b[r->i] == '-') {
        ref_out(r, '-', r->i);
        r->i++;

        if (r->why != NULL || ref_end(r)) {
            return;
        }
    }

    if (r->b[r->i] == '0') {
        ref_out(r, '0', r->i);
        r->i++;

    } else {
        ref_digits(r);
    }

    if (r->why != NULL || r->i == r->len) {
        return;
    }

    if (r->b[r->i] == '.' || r->b[r->i] == 'e' || r->b[r->i] == 'E') {
        if (r->collect == COLLECT_KEY) {
            ref_fail(r, r->i, R_FRACTION);
            return;
        }
    }

    if (r->b[r->i] == '.') {
        r->i++;
        ref_digits(r);

        if (r->why != NULL) {
            return;
        }
    }

    if (r->i < r->len && (r->b[r->i] == 'e' || r->b[r->i] == 'E')) {
        r->i++;

        if (r->i < r->len && (r->b[r->i] == '+' || r->b[r->i] == '-')) {
            r->i++;
        }

        ref_digits(r);
    }
}


static void
ref_literal(ref_t *r, const char *word)
{
    size_t  k;

    for (k = 0; word[k]; k++) {
        if (ref_end(r)) {
            return;
        }

        if (r->b[r->i] != (u_char) word[k]) {
            ref_fail(r, r->i, SYNTAX);
            return;
        }

        r->i++;
    }

    if (r->collect == COLLECT_KEY) {
        ref_fail(r, r->i - 1, word[0] == 'n' ? R_NULL : R_BOOLEAN);
    }
}


static void ref_value(ref_t *r, size_t depth, int on);


/* after '{' or '[': 1 if a member or an element follows, 0 if not */

static int
ref_open(ref_t *r, u_char close)
{
    ref_ws(r);

    if (ref_end(r)) {
        return 0;
    }

    if (r->b[r->i] == close) {
        r->i++;
        return 0;
    }

    return 1;
}


/* after a member or an element: 1 after ',', 0 after the close or else */

static int
ref_next(ref_t *r, u_char close)
{
    ref_ws(r);

    if (r->why != NULL || ref_end(r)) {
        return 0;
    }

    if (r->b[r->i] == close) {
        r->i++;
        return 0;
    }

    if (r->b[r->i] != ',') {
        ref_fail(r, r->i, SYNTAX);
        return 0;
    }

    r->i++;

    return 1;
}


static void
ref_object(ref_t *r, size_t depth, int on)
{
    int  seen, member_on;

    seen = 0;

    if (!ref_open(r, '}')) {
        return;
    }

    do {
        ref_ws(r);

        if (ref_end(r)) {
            return;
        }

        if (r->b[r->i] != '"') {
            ref_fail(r, r->i, SYNTAX);
            return;
        }

        r->collect = on ? COLLECT_NAME : COLLECT_NONE;
        r->name_len = 0;
        ref_string(r);
        r->collect = COLLECT_NONE;

        if (r->why != NULL) {
            return;
        }

        member_on = on && r->name_len == r->ptr->len[depth - 1]
                    && memcmp(r->name, r->ptr->name[depth - 1],
                              r->name_len) == 0;

        if (member_on) {
            if (seen) {
                ref_fail(r, r->i - 1, R_TWICE);
                return;
            }

            seen = 1;
        }

        ref_ws(r);

        if (ref_end(r)) {
            return;
        }

        if (r->b[r->i] != ':') {
            ref_fail(r, r->i, SYNTAX);
            return;
        }

        r->i++;
        ref_value(r, depth, member_on);

    } while (ref_next(r, '}'));
}


static void
ref_array(ref_t *r, size_t depth, int on)
{
    long  k;

    if (!ref_open(r, ']')) {
        return;
    }

    k = 0;

    do {
        ref_value(r, depth, on && r->ptr->index[depth - 1] == k++);
    } while (ref_next(r, ']'));
}


/* a value inside depth containers; on: on the pointer so far */

static void
ref_value(ref_t *r, size_t depth, int on)
{
    int     key;
    u_char  c;

    ref_ws(r);

    if (ref_end(r)) {
        return;
    }

    key = on && depth == r->ptr->ntokens;
    r->collect = key ? COLLECT_KEY : COLLECT_NONE;
    c = r->b[r->i];

    switch (c) {

    case '{':
    case '[':
        r->collect = COLLECT_NONE;

        if (key) {
            ref_fail(r, r->i, c == '{' ? R_OBJECT : R_ARRAY);
            return;
        }

        if (depth == DEPTH) {
            ref_fail(r, r->i, R_DEPTH);
            return;
        }

        r->i++;

        if (c == '{') {
            ref_object(r, depth + 1, on);
        } else {
            ref_array(r, depth + 1, on);
        }

        return;

    case '"':
        ref_string(r);

        if (key && r->why == NULL) {
            if (r->key_len == 0) {
                ref_fail(r, r->i - 1, R_EMPTY);
            } else {
                r->found = 1;
            }
        }

        break;

    case 't':
        ref_literal(r, "true");
        break;

    case 'f':
        ref_literal(r, "false");
        break;

    case 'n':
        ref_literal(r, "null");
        break;

    default:
        if (c != '-' && (c < '0' || c > '9')) {
            ref_fail(r, r->i, SYNTAX);
            return;
        }

        ref_number(r);

        if (key && r->why == NULL) {
            r->found = 1;
        }

        break;
    }

    r->collect = COLLECT_NONE;
}


static void
ref_document(ref_t *r)
{
    ref_ws(r);

    if (r->i == r->len) {
        ref_fail(r, r->len, R_NOT_JSON);
        return;
    }

    ref_value(r, 0, 1);

    if (r->why == NULL) {
        ref_ws(r);

        if (r->i < r->len) {
            ref_fail(r, r->i, SYNTAX);
        }
    }
}


/* --- the scanner, fed in pieces ------------------------------------------ */

typedef struct {
    ngx_int_t     rc;
    const char   *why;
    off_t         offset;
    size_t        key_len;
    u_char        key[MAX_KEY];
} result_t;


static uint64_t
next_random(uint64_t *s)
{
    *s ^= *s << 13;
    *s ^= *s >> 7;
    *s ^= *s << 17;

    return *s;
}


/*
 * how: 0 in one piece, 1 a byte at a time with empty feeds between, else
 * pieces of pseudo-random sizes; each piece is copied into its own buffer
 */

static void
run(ngx_http_idempotency_json_pointer_t *ptr, size_t max, const u_char *body,
    size_t len, int how, uint64_t seed, result_t *res)
{
    size_t                        i, n;
    u_char                       *piece;
    uint64_t                      s;
    ngx_str_t                     key;
    ngx_uint_t                    mark;
    ngx_http_idempotency_json_t  *js;

    mark = nallocs;

    js = ngx_http_idempotency_json_create(fake_pool, ptr, max);
    fuzz_assert(js != NULL, "create() failed");

    s = seed | 1;

    for (i = 0; i < len; i += n) {
        if (how == 0) {
            n = len;

        } else if (how == 1) {
            n = 1;
            ngx_http_idempotency_json_feed(js, NULL, NULL);

        } else {
            n = next_random(&s) % ((how == 2) ? 4 : 40);
            n = n > len - i ? len - i : n;
        }

        piece = malloc(n ? n : 1);
        if (piece == NULL) {
            abort();
        }

        memcpy(piece, body + i, n);
        ngx_http_idempotency_json_feed(js, piece, piece + n);
        free(piece);
    }

    key.len = 0;
    key.data = NULL;
    res->why = NULL;

    res->rc = ngx_http_idempotency_json_finish(js, &key, &res->why);
    res->offset = ngx_http_idempotency_json_offset(js);
    res->key_len = 0;

    if (res->rc == NGX_OK) {
        fuzz_assert(key.len <= MAX_KEY, "key.len %zu", key.len);
        memcpy(res->key, key.data, key.len);
        res->key_len = key.len;
    }

    free_allocs(mark);
}


static int
is_key_reason(const char *why)
{
    int  i;

    for (i = 0; key_reasons[i]; i++) {
        if (strcmp(why, key_reasons[i]) == 0) {
            return 1;
        }
    }

    return 0;
}


static void
check_pointer(ngx_int_t rc, ngx_http_idempotency_json_pointer_t *ptr,
    int ref_rc, ref_pointer_t *rp)
{
    size_t  i;

    fuzz_assert((rc == NGX_OK) == (ref_rc == 0),
                "pointer: parser says %ld, reference %d", (long) rc, ref_rc);

    if (rc != NGX_OK) {
        return;
    }

    fuzz_assert(ptr->ntokens == rp->ntokens && ptr->ntokens >= 1,
                "pointer: %zu tokens, reference %zu",
                (size_t) ptr->ntokens, rp->ntokens);

    for (i = 0; i < rp->ntokens; i++) {
        fuzz_assert(ptr->tokens[i].name.len == rp->len[i]
                    && memcmp(ptr->tokens[i].name.data, rp->name[i],
                              rp->len[i]) == 0,
                    "pointer: token %zu differs", i);
        fuzz_assert(ptr->tokens[i].index == rp->index[i],
                    "pointer: token %zu index %ld, reference %ld", i,
                    (long) ptr->tokens[i].index, rp->index[i]);
    }
}


static void
check_same(result_t *a, result_t *b, int how)
{
    fuzz_assert(a->rc == b->rc, "split %d: rc %ld, in one piece %ld", how,
                (long) b->rc, (long) a->rc);
    fuzz_assert(a->why == b->why, "split %d: \"%s\", in one piece \"%s\"",
                how, b->why ? b->why : "", a->why ? a->why : "");
    fuzz_assert(a->offset == b->offset, "split %d: offset %lld, in one piece"
                " %lld", how, (long long) b->offset, (long long) a->offset);
    fuzz_assert(a->key_len == b->key_len
                && memcmp(a->key, b->key, a->key_len) == 0,
                "split %d: another key", how);
}


static void
check_reference(result_t *res, ref_t *r)
{
    ngx_int_t  ref_rc;

    ref_rc = r->why ? NGX_ERROR : (r->found ? NGX_OK : NGX_DECLINED);

    fuzz_assert(res->rc == ref_rc, "rc %ld (%s), reference %ld (%s at %zu)",
                (long) res->rc, res->why ? res->why : "-", (long) ref_rc,
                r->why ? r->why : "-", r->at);

    if (res->rc == NGX_OK) {
        fuzz_assert(res->key_len == r->key_len
                    && memcmp(res->key, r->key, r->key_len) == 0,
                    "the key differs from the reference's");
    }

    if (res->rc != NGX_ERROR) {
        return;
    }

    fuzz_assert((size_t) res->offset == r->at,
                "error \"%s\" at %lld, reference \"%s\" at %zu", res->why,
                (long long) res->offset, r->why, r->at);

    if (r->why == SYNTAX) {
        fuzz_assert(!is_key_reason(res->why) && strcmp(res->why, R_END) != 0
                    && strcmp(res->why, R_NOT_JSON) != 0
                    && strcmp(res->why, R_DEPTH) != 0,
                    "\"%s\", reference: a syntax error", res->why);

    } else {
        fuzz_assert(strcmp(res->why, r->why) == 0,
                    "\"%s\", reference \"%s\"", res->why, r->why);
    }
}


int
LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    int                                  ref_rc, how;
    size_t                               max, i, plen, len;
    u_char                              *text, *body, *lf;
    uint64_t                             seed;
    ngx_int_t                            rc;
    ngx_str_t                            ptext;
    ref_t                               *r;
    result_t                            *one, *other;
    ref_pointer_t                        rp;
    ngx_http_idempotency_json_pointer_t  ptr;
    char                                *err;

    if (size < 1) {
        return 0;
    }

    max = data[0] == 0xff ? 1024 : (size_t) data[0] + 1;
    data++;
    size--;

    lf = memchr(data, '\n', size);
    plen = lf ? (size_t) (lf - data) : size;
    len = lf ? size - plen - 1 : 0;

    text = malloc(plen ? plen : 1);
    body = malloc(len ? len : 1);
    if (text == NULL || body == NULL) {
        abort();
    }

    memcpy(text, data, plen);
    memcpy(body, data + plen + (lf ? 1 : 0), len);

    ptext.data = text;
    ptext.len = plen;
    err = NULL;

    rc = ngx_http_idempotency_json_pointer_parse(fake_pool, &ptext, &ptr, &err);

    fuzz_assert(rc == NGX_OK || (rc == NGX_ERROR && err != NULL),
                "pointer: rc %ld", (long) rc);

    memset(&rp, 0, sizeof(rp));
    ref_rc = ref_pointer(text, plen, &rp);
    check_pointer(rc, &ptr, ref_rc, &rp);

    if (rc != NGX_OK) {
        goto done;
    }

    fuzz_assert(ptr.text.data == text && ptr.text.len == plen,
                "pointer: the text is not as configured");

    one = malloc(sizeof(result_t));
    other = malloc(sizeof(result_t));
    r = calloc(1, sizeof(ref_t));
    if (one == NULL || other == NULL || r == NULL) {
        abort();
    }

    /* FNV-1a of the input: the random splits are the same on a rerun */

    seed = 14695981039346656037ULL;

    for (i = 0; i < size; i++) {
        seed = (seed ^ data[i]) * 1099511628211ULL;
    }

    run(&ptr, max, body, len, 0, 0, one);

    for (how = 1; how <= 4; how++) {
        run(&ptr, max, body, len, how, seed + how, other);
        check_same(one, other, how);
    }

    fuzz_assert(one->rc == NGX_OK || one->rc == NGX_DECLINED
                || (one->rc == NGX_ERROR && one->why != NULL),
                "rc %ld", (long) one->rc);
    fuzz_assert(one->offset >= 0 && (size_t) one->offset <= len,
                "offset %lld of %zu bytes", (long long) one->offset, len);

    if (one->rc != NGX_ERROR) {
        fuzz_assert((size_t) one->offset == len, "offset %lld of %zu bytes",
                    (long long) one->offset, len);
    }

    if (one->rc == NGX_OK) {
        fuzz_assert(one->key_len >= 1 && one->key_len <= max,
                    "key of %zu bytes, max %zu", one->key_len, max);

        for (i = 0; i < one->key_len; i++) {
            fuzz_assert(one->key[i] >= 0x20 && one->key[i] <= 0x7e,
                        "key byte %zu is 0x%02x", i, one->key[i]);
        }
    }

    r->b = body;
    r->len = len;
    r->ptr = &rp;
    r->max = max;
    r->name = malloc(len ? len : 1);
    if (r->name == NULL) {
        abort();
    }

    ref_document(r);
    check_reference(one, r);

    free(r->name);
    free(r);
    free(one);
    free(other);

done:

    free_allocs(0);
    free(rp.names);
    free(text);
    free(body);

    return 0;
}
