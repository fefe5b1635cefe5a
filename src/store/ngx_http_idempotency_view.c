
/*
 * Copyright (C) The ngx_http_idempotency_module authors
 *
 * A record as an operator sees it (idempotency_admin): what it is (in
 * progress, unknown, completed, too large), its status, when it was stored,
 * its lease, its fingerprint and seal, and its response when it can be
 * read.  The admin writes the JSON; what the bytes mean is said here.
 */


#include "ngx_http_idempotency_store.h"


/*
 * What a record's head alone says, as a listing reads it (a SCAN brings
 * heads only).  A claim is in_progress while its lease lives, unknown
 * once it ran out (502) or was written down as unknown; the status of a
 * completed record is in its body, 0 here.  NGX_DECLINED: no record of
 * this module.
 */

ngx_int_t
ngx_http_idempotency_view_head(u_char *head, size_t len, uint64_t at,
    ngx_msec_t margin, ngx_http_idempotency_view_t *v)
{
    ngx_uint_t  lk;

    ngx_memzero(v, sizeof(ngx_http_idempotency_view_t));

    if (!ngx_http_idempotency_head_valid(head, len)) {
        return NGX_DECLINED;
    }

    v->fingerprint = ngx_http_idempotency_head_fingerprint(head);
    v->stored_at = ngx_http_idempotency_lease_stored_at(head);
    v->sealed = (ngx_http_idempotency_head_state(head)
                 == NGX_HTTP_IDEMPOTENCY_REC_SEALED);

    switch (ngx_http_idempotency_head_state(head)) {

    case NGX_HTTP_IDEMPOTENCY_REC_CLAIM:
        lk = ngx_http_idempotency_lease_read(head, &v->status, at, margin);

        if (lk == NGX_HTTP_IDEMPOTENCY_LEASE_UNKNOWN) {
            v->state = "unknown";
            break;
        }

        v->lease_until = ngx_http_idempotency_lease_deadline(head);

        if (lk == NGX_HTTP_IDEMPOTENCY_LEASE_EXPIRED) {
            v->status = NGX_HTTP_IDEMPOTENCY_STATUS_UNKNOWN;
            v->state = "unknown";
            break;
        }

        v->status = 0;
        v->state = "in_progress";
        break;

    case NGX_HTTP_IDEMPOTENCY_REC_TOO_LARGE:
        v->state = "too_large";
        break;

    default:
        v->state = "completed";
    }

    return NGX_OK;
}


/*
 * The whole record: its head's view, then its response, decoded; a sealed
 * one is opened with keys (the location's) if it can be, else v->why says
 * why not, and only its head is known.  NGX_ERROR: a value that is no
 * record, or a clear record that does not decode: the caller logs it.
 */

ngx_int_t
ngx_http_idempotency_view(u_char *value, size_t len, ngx_array_t *keys,
    ngx_str_t *rkey, uint64_t at, ngx_msec_t margin, ngx_log_t *log,
    ngx_http_idempotency_view_t *v)
{
    ngx_int_t  sealed;

    if (ngx_http_idempotency_view_head(value, len, at, margin, v) != NGX_OK) {
        return NGX_ERROR;
    }

    sealed = ngx_http_idempotency_sealed_id(value, len, &v->key_id);

    if (sealed == NGX_DECLINED) {
        if (ngx_http_idempotency_record_decode(value, len, &v->rec)
            != NGX_OK)
        {
            return NGX_ERROR;
        }

        goto done;
    }

    if (sealed == NGX_ERROR) {
        ngx_str_null(&v->key_id);
    }

    if (keys == NULL) {
        v->why = "no idempotency_encrypt_key in this location";
        return NGX_OK;
    }

    /* crypt_open() logs why, by the key hash */

    if (ngx_http_idempotency_crypt_open(keys, log, rkey, value, len, &v->rec)
        != NGX_OK)
    {
        ngx_memzero(&v->rec, sizeof(ngx_http_idempotency_record_t));
        v->why = "not opened with the keys of this location: see the "
                 "error log";
        return NGX_OK;
    }

    v->opened = 1;

done:

    v->read = 1;

    if (v->status == 0) {
        v->status = v->rec.status;
    }

    return NGX_OK;
}
