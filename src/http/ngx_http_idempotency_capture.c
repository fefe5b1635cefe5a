
/*
 * Copyright (C) The ngx_http_idempotency_module authors
 *
 * What of the owner's response goes into its record, through the store's
 * builder (the format is the store's): its status, the headers that are
 * worth replaying, and the trailers; filter.c passes the body.
 */


#include "ngx_http_idempotency_http.h"


static ngx_int_t ngx_http_idempotency_capture_list(ngx_http_request_t *r,
    ngx_list_t *list, ngx_http_idempotency_loc_conf_t *conf,
    ngx_http_idempotency_builder_t *bd);
static ngx_int_t ngx_http_idempotency_capture_content_type(
    ngx_http_request_t *r, ngx_str_t *name, ngx_str_t *value);
static ngx_uint_t ngx_http_idempotency_unsafe(ngx_str_t *s);


static ngx_str_t  ngx_http_idempotency_default_hide = ngx_string("set-cookie");



/*
 * The status and the headers worth replaying, into a new record at header
 * time (the store's builder sizes and writes it).  NGX_DECLINED: the
 * response cannot fit in idempotency_store_max_size.
 */

ngx_int_t
ngx_http_idempotency_capture_header(ngx_http_request_t *r,
    ngx_http_idempotency_loc_conf_t *conf, ngx_http_idempotency_builder_t *bd,
    u_char *head)
{
    ngx_str_t  ct_name, ct, status_line;

    static ngx_str_t  status_name = ngx_string(":status-line");

    if (ngx_http_idempotency_builder_init(bd, r->pool, conf->encrypt_keys,
                                          conf->store_max_size,
                                          r->headers_out.content_length_n)
        != NGX_OK
        || ngx_http_idempotency_capture_content_type(r, &ct_name, &ct)
           != NGX_OK)
    {
        return NGX_ERROR;
    }

    /* the upstream's reason phrase, e.g. for a 422 nginx has none for */
    status_line = r->headers_out.status_line;

    /* the rule the decoder applies: its status, then a phrase */

    if (ngx_http_idempotency_unsafe(&status_line)) {
        ngx_log_error(NGX_LOG_WARN, r->connection->log, 0,
                      "idempotency: status line has CR, LF or NUL, "
                      "not stored");
        status_line.len = 0;

    } else if (status_line.len
               && !ngx_http_idempotency_record_status_line_ok(&status_line,
                                                   r->headers_out.status))
    {
        ngx_log_error(NGX_LOG_WARN, r->connection->log, 0,
                      "idempotency: status line does not begin with the "
                      "status %ui or has control characters, not stored",
                      r->headers_out.status);
        status_line.len = 0;
    }

    if ((ct.len && ngx_http_idempotency_builder_field(bd, &ct_name, &ct)
                   != NGX_OK)
        || (status_line.len
            && ngx_http_idempotency_builder_field(bd, &status_name,
                                                  &status_line)
               != NGX_OK)
        || ngx_http_idempotency_capture_list(r, &r->headers_out.headers,
                                             conf, bd)
           != NGX_OK)
    {
        return NGX_ERROR;
    }

    return ngx_http_idempotency_builder_head(bd, head, r->headers_out.status);
}


/*
 * The trailers the owner's response ended with (grpc_pass), kept by the
 * rules for headers
 */

ngx_int_t
ngx_http_idempotency_capture_trailers(ngx_http_request_t *r,
    ngx_http_idempotency_loc_conf_t *conf, ngx_http_idempotency_builder_t *bd)
{
    return ngx_http_idempotency_capture_list(r, &r->headers_out.trailers,
                                             conf, bd);
}


/* the fields of a header or trailer list that are kept, to the builder */

static ngx_int_t
ngx_http_idempotency_capture_list(ngx_http_request_t *r, ngx_list_t *list,
    ngx_http_idempotency_loc_conf_t *conf, ngx_http_idempotency_builder_t *bd)
{
    u_char            buf[NGX_HTTP_IDEMPOTENCY_NAME_MAX];
    ngx_str_t         low;
    ngx_uint_t        i;
    ngx_list_part_t  *part;
    ngx_table_elt_t  *h;

    static ngx_str_t  location = ngx_string(":location");
    static ngx_str_t  empty = ngx_null_string;

    part = &list->part;
    h = part->elts;

    for (i = 0; /* void */ ; i++) {

        if (i >= part->nelts) {
            if (part->next == NULL) {
                break;
            }

            part = part->next;
            h = part->elts;
            i = 0;
        }

        if (h[i].hash == 0 || h[i].key.len == 0) {
            continue;
        }

        /* absurdly long names are dropped, not checked half-way */

        low.len = h[i].key.len;

        if (low.len > sizeof(buf)) {
            continue;
        }

        low.data = buf;
        ngx_strlow(buf, h[i].key.data, low.len);

        /*
         * hop-by-hop, framing, nginx's own, or not a token: record.c's
         * list, which its decoder refuses, so no record ever has them
         */

        if (!ngx_http_idempotency_record_field_ok(&low)
            || !ngx_http_idempotency_store_header(conf, &low))
        {
            continue;
        }

        /* the decoder refuses these bytes: drop the field only */

        if (ngx_http_idempotency_unsafe(&h[i].value)) {
            /* a token: safe to log */
            ngx_log_error(NGX_LOG_WARN, r->connection->log, 0,
                          "idempotency: header \"%V\" has CR, LF or NUL, "
                          "not stored", &h[i].key);
            continue;
        }

        /*
         * nginx's own Location (r->headers_out.location), which the header
         * filter may make absolute: a marker says so to the replay
         */

        if (&h[i] == r->headers_out.location
            && ngx_http_idempotency_builder_field(bd, &location, &empty)
               != NGX_OK)
        {
            return NGX_ERROR;
        }

        if (ngx_http_idempotency_builder_field(bd, &h[i].key, &h[i].value)
            != NGX_OK)
        {
            return NGX_ERROR;
        }
    }

    return NGX_OK;
}


/*
 * The Content-Type as nginx sends it: with the charset appended when a
 * module set it apart.  Named "Content-Type" when splitting it again (as
 * the replay does) gives the type and charset the filters saw, else
 * ":content-type", which the replay takes whole, as perl or default_type
 * do.  A value with CR, LF or NUL is not stored.
 */

static ngx_int_t
ngx_http_idempotency_capture_content_type(ngx_http_request_t *r,
    ngx_str_t *name, ngx_str_t *value)
{
    u_char                  *p;
    size_t                   type_len;
    ngx_str_t                charset;
    ngx_http_headers_out_t  *ho;

    ho = &r->headers_out;

    ngx_str_set(name, "Content-Type");
    *value = ho->content_type;

    if (value->len == 0) {
        return NGX_OK;
    }

    if (ho->content_type_len == ho->content_type.len && ho->charset.len) {
        value->len += sizeof("; charset=") - 1 + ho->charset.len;

        value->data = ngx_pnalloc(r->pool, value->len);
        if (value->data == NULL) {
            return NGX_ERROR;
        }

        p = ngx_cpymem(value->data, ho->content_type.data,
                       ho->content_type.len);
        p = ngx_cpymem(p, "; charset=", sizeof("; charset=") - 1);
        ngx_memcpy(p, ho->charset.data, ho->charset.len);
    }

    if (ngx_http_idempotency_unsafe(value)) {
        ngx_log_error(NGX_LOG_WARN, r->connection->log, 0,
                      "idempotency: header \"Content-Type\" has CR, LF "
                      "or NUL, not stored");
        value->len = 0;
        return NGX_OK;
    }

    ngx_http_idempotency_content_type(value, &type_len, &charset);

    if (type_len != ho->content_type_len
        || charset.len != ho->charset.len
        || (charset.len
            && ngx_strncmp(charset.data, ho->charset.data, charset.len) != 0))
    {
        ngx_str_set(name, ":content-type");
    }

    return NGX_OK;
}


/*
 * Splits a Content-Type as ngx_http_upstream_copy_content_type() does: the
 * type ends before a "charset=" parameter, whose value, unquoted, is the
 * charset.  Type filters (gzip_types, charset_types, sub_filter_types)
 * then match a replay as they matched the original.
 */

void
ngx_http_idempotency_content_type(ngx_str_t *value, size_t *type_len,
    ngx_str_t *charset)
{
    u_char  *p, *semi, *last;

    *type_len = value->len;
    ngx_str_null(charset);

    last = value->data + value->len;

    for (p = value->data; p < last; p++) {

        if (*p != ';') {
            continue;
        }

        semi = p;

        do {
            p++;
        } while (p < last && *p == ' ');

        if (p == last) {
            return;
        }

        if (last - p < 8
            || ngx_strncasecmp(p, (u_char *) "charset=", 8) != 0)
        {
            continue;
        }

        p += 8;

        *type_len = semi - value->data;

        if (p < last && *p == '"') {
            p++;
        }

        if (last > p && *(last - 1) == '"') {
            last--;
        }

        charset->len = last - p;
        charset->data = p;

        return;
    }
}


static ngx_uint_t
ngx_http_idempotency_unsafe(ngx_str_t *s)
{
    u_char  *p, *last;

    if (s->len == 0) {
        return 0;
    }

    last = s->data + s->len;

    for (p = s->data; p < last; p++) {
        if (*p == CR || *p == LF || *p == '\0') {
            return 1;
        }
    }

    return 0;
}


/*
 * Whether a header is kept in the stored record: Set-Cookie and every
 * idempotency_hide_header are not, unless idempotency_pass_header names them.
 */

ngx_uint_t
ngx_http_idempotency_store_header(void *data, ngx_str_t *lowcase)
{
    ngx_http_idempotency_loc_conf_t *conf = data;

    ngx_str_t   *h;
    ngx_uint_t   i;

    if (conf->pass_headers) {
        h = conf->pass_headers->elts;
        for (i = 0; i < conf->pass_headers->nelts; i++) {
            if (h[i].len == lowcase->len
                && ngx_strncmp(h[i].data, lowcase->data, lowcase->len) == 0)
            {
                return 1;
            }
        }
    }

    if (lowcase->len == ngx_http_idempotency_default_hide.len
        && ngx_strncmp(lowcase->data, ngx_http_idempotency_default_hide.data,
                       lowcase->len) == 0)
    {
        return 0;
    }

    if (conf->hide_headers) {
        h = conf->hide_headers->elts;
        for (i = 0; i < conf->hide_headers->nelts; i++) {
            if (h[i].len == lowcase->len
                && ngx_strncmp(h[i].data, lowcase->data, lowcase->len) == 0)
            {
                return 0;
            }
        }
    }

    return 1;
}
