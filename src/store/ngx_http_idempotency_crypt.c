
/*
 * Copyright (C) The ngx_http_idempotency_module authors
 *
 * idempotency_encrypt_key FILE [id=NAME] [required]: completed records
 * sealed with AES-256-GCM.  The first key of a location seals, every key
 * it lists opens the records that name it, so keys rotate without a flag
 * day.  "required" ends the rollout: a completed record in clear is then
 * refused as a Redis writer's forgery.
 *
 *   head[53], state 5 | u8 version | u8 id_len | id | nonce[12]
 *   | ciphertext of (u8 state 2 or 4 | the done record after its head)
 *   | tag[16]
 *
 * The head stays clear: the finish script compares it.  The associated
 * data is the key hash between the record key's braces, then everything
 * clear before the nonce: a record copied to another key, or whose head,
 * version or id was changed, does not open.  The record is sealed where
 * it was captured and opened where it was received: no copy.
 */


#include "ngx_http_idempotency_store.h"

#include <openssl/rand.h>


#define NGX_HTTP_IDEMPOTENCY_CRYPT_VERSION  1
#define NGX_HTTP_IDEMPOTENCY_CRYPT_KEY_LEN  32     /* AES-256 */
#define NGX_HTTP_IDEMPOTENCY_CRYPT_ID_MAX   32
#define NGX_HTTP_IDEMPOTENCY_NONCE_LEN      12

/* one byte more than a key: a longer file is seen */
#define NGX_HTTP_IDEMPOTENCY_CRYPT_READ                                       \
    (NGX_HTTP_IDEMPOTENCY_CRYPT_KEY_LEN + 1)

/* version, id length, nonce and the inner state: the id is added */
#define NGX_HTTP_IDEMPOTENCY_CRYPT_ROOM                                       \
    (1 + 1 + NGX_HTTP_IDEMPOTENCY_NONCE_LEN + 1)

/* GCM takes an int per call */
#define NGX_HTTP_IDEMPOTENCY_CRYPT_STEP     (1 << 30)


/*
 * One key: its AES key schedule lives in ctx alone (the file's bytes are
 * wiped once it is set), and every record of the worker reuses it
 */
typedef struct {
    ngx_str_t                        id;
    EVP_CIPHER_CTX                  *ctx;
    ngx_uint_t                       required;   /* the first key's */
} ngx_http_idempotency_crypt_key_t;


static ngx_int_t ngx_http_idempotency_crypt_args(ngx_conf_t *cf,
    ngx_str_t *id, ngx_uint_t *required);
static ngx_int_t ngx_http_idempotency_crypt_id(ngx_conf_t *cf,
    ngx_str_t *file, ngx_str_t *arg, ngx_str_t *id);
static ngx_int_t ngx_http_idempotency_crypt_run(EVP_CIPHER_CTX *ctx,
    u_char *p, size_t len);
static ngx_int_t ngx_http_idempotency_crypt_aad(EVP_CIPHER_CTX *ctx,
    ngx_str_t *rkey, u_char *data, size_t len);
static void ngx_http_idempotency_crypt_cleanup(void *data);


char *
ngx_http_idempotency_encrypt_key_directive(ngx_conf_t *cf, ngx_command_t *cmd,
    void *conf)
{
    u_char                             buf[NGX_HTTP_IDEMPOTENCY_CRYPT_READ];
    ssize_t                            n;
    ngx_str_t                         *value, name, id;
    ngx_uint_t                         i, required;
    ngx_array_t                      **set;
    ngx_pool_cleanup_t                *cln;
    ngx_http_idempotency_crypt_key_t  *key, *keys;

    /* the location's keys, where the command's offset says */
    set = (ngx_array_t **) ((char *) conf + cmd->offset);

    value = cf->args->elts;

    if (value[1].len == 3 && ngx_strncmp(value[1].data, "off", 3) == 0) {

        if (*set != NGX_CONF_UNSET_PTR || cf->args->nelts > 2) {
            return "\"off\" stands alone";
        }

        *set = NULL;
        return NGX_CONF_OK;
    }

    if (*set == NULL) {
        return "\"off\" stands alone";
    }

    if (ngx_http_idempotency_crypt_args(cf, &id, &required) != NGX_OK) {
        return NGX_CONF_ERROR;
    }

    if (*set == NGX_CONF_UNSET_PTR) {
        *set = ngx_array_create(cf->pool, 2,
                                      sizeof(ngx_http_idempotency_crypt_key_t));
        if (*set == NULL) {
            return NGX_CONF_ERROR;
        }
    }

    /* a record names its key by id: one id, one key */

    keys = (*set)->elts;

    for (i = 0; i < (*set)->nelts; i++) {
        if (keys[i].id.len == id.len
            && ngx_strncmp(keys[i].id.data, id.data, id.len) == 0)
        {
            ngx_conf_log_error(NGX_LOG_EMERG, cf, 0,
                               "\"idempotency_encrypt_key\" id \"%V\" is "
                               "listed twice", &id);
            return NGX_CONF_ERROR;
        }
    }

    name = value[1];

    n = ngx_http_idempotency_secret_read(cf, &cmd->name, &name, buf,
                                         sizeof(buf));
    if (n == NGX_ERROR) {
        return NGX_CONF_ERROR;
    }

    if (n != NGX_HTTP_IDEMPOTENCY_CRYPT_KEY_LEN) {
        ngx_explicit_memzero(buf, sizeof(buf));
        ngx_conf_log_error(NGX_LOG_EMERG, cf, 0,
                           "\"idempotency_encrypt_key\" file \"%V\" holds "
                           "%s%z bytes: a key of exactly %d raw bytes is "
                           "expected (openssl rand 32 > FILE)", &name,
                           n > NGX_HTTP_IDEMPOTENCY_CRYPT_KEY_LEN
                           ? "more than " : "",
                           ngx_min(n, NGX_HTTP_IDEMPOTENCY_CRYPT_KEY_LEN),
                           NGX_HTTP_IDEMPOTENCY_CRYPT_KEY_LEN);
        return NGX_CONF_ERROR;
    }

    /* 32 hex digits ("openssl rand -hex 16") are 32 bytes of 128 bits */

    if (ngx_http_idempotency_secret_hex_bits(buf, n)) {
        ngx_explicit_memzero(buf, sizeof(buf));
        ngx_conf_log_error(NGX_LOG_EMERG, cf, 0,
                           "\"idempotency_encrypt_key\" file \"%V\" holds "
                           "hexadecimal text, 128 bits or fewer: a key of "
                           "32 random raw bytes, 256 bits, is expected "
                           "(openssl rand 32 > FILE)", &name);
        return NGX_CONF_ERROR;
    }

    key = ngx_array_push(*set);
    if (key == NULL) {
        ngx_explicit_memzero(buf, sizeof(buf));
        return NGX_CONF_ERROR;
    }

    key->id = id;
    key->ctx = NULL;
    key->required = 0;

    /* on any of its lines, it is the location's: the first key keeps it */

    if (required) {
        ((ngx_http_idempotency_crypt_key_t *) (*set)->elts)->required = 1;
    }

    cln = ngx_pool_cleanup_add(cf->pool, 0);
    if (cln == NULL) {
        ngx_explicit_memzero(buf, sizeof(buf));
        return NGX_CONF_ERROR;
    }

    key->ctx = EVP_CIPHER_CTX_new();

    cln->handler = ngx_http_idempotency_crypt_cleanup;
    cln->data = key->ctx;

    if (key->ctx == NULL
        || EVP_CipherInit_ex(key->ctx, EVP_aes_256_gcm(), NULL, buf, NULL, 1)
           != 1)
    {
        ngx_explicit_memzero(buf, sizeof(buf));
        ngx_conf_log_error(NGX_LOG_EMERG, cf, 0,
                           "\"idempotency_encrypt_key\" file \"%V\": "
                           "AES-256-GCM is not available", &name);
        return NGX_CONF_ERROR;
    }

    ngx_explicit_memzero(buf, sizeof(buf));

    return NGX_CONF_OK;
}


/* the parameters after FILE: id=NAME and "required", each at most once */

static ngx_int_t
ngx_http_idempotency_crypt_args(ngx_conf_t *cf, ngx_str_t *id,
    ngx_uint_t *required)
{
    ngx_str_t   *value, *arg;
    ngx_uint_t   i;

    value = cf->args->elts;
    arg = NULL;
    *required = 0;

    for (i = 2; i < cf->args->nelts; i++) {

        if (value[i].len == 8
            && ngx_strncmp(value[i].data, "required", 8) == 0
            && !*required)
        {
            *required = 1;
            continue;
        }

        if (value[i].len >= 3 && ngx_strncmp(value[i].data, "id=", 3) == 0
            && arg == NULL)
        {
            arg = &value[i];
            continue;
        }

        ngx_conf_log_error(NGX_LOG_EMERG, cf, 0,
                           "invalid parameter \"%V\" of "
                           "\"idempotency_encrypt_key\": \"id=NAME\" or "
                           "\"required\" is expected, each once", &value[i]);
        return NGX_ERROR;
    }

    return ngx_http_idempotency_crypt_id(cf, &value[1], arg, id);
}


/* id=NAME, or the file's base name: 1 to 32 printable bytes, no space */

static ngx_int_t
ngx_http_idempotency_crypt_id(ngx_conf_t *cf, ngx_str_t *file,
    ngx_str_t *arg, ngx_str_t *id)
{
    u_char  *p, *last;

    if (arg) {
        id->data = arg->data + 3;
        id->len = arg->len - 3;

    } else {
        last = file->data + file->len;

        for (p = last; p > file->data && *(p - 1) != '/'; p--) {
            /* void */
        }

        id->data = p;
        id->len = last - p;
    }

    last = id->data + id->len;

    for (p = id->data; p < last; p++) {
        if (*p <= 0x20 || *p >= 0x7f) {
            break;
        }
    }

    if (id->len == 0 || id->len > NGX_HTTP_IDEMPOTENCY_CRYPT_ID_MAX
        || p != last)
    {
        ngx_conf_log_error(NGX_LOG_EMERG, cf, 0,
                           "\"idempotency_encrypt_key\" id \"%V\" of \"%V\" "
                           "must be 1 to %d printable characters without "
                           "spaces%s", id, file,
                           NGX_HTTP_IDEMPOTENCY_CRYPT_ID_MAX,
                           arg ? "" : ": name one with id=");
        return NGX_ERROR;
    }

    return NGX_OK;
}


/* what the record header reserves after the head: 0 when not sealed */

size_t
ngx_http_idempotency_crypt_room(ngx_array_t *keys)
{
    ngx_http_idempotency_crypt_key_t  *key;

    if (keys == NULL) {
        return 0;
    }

    key = keys->elts;

    return NGX_HTTP_IDEMPOTENCY_CRYPT_ROOM + key->id.len;
}


/*
 * Seals the done record rec of *len bytes in place, with the first key:
 * it was built with crypt_room() bytes after its head, and has room for
 * the tag after its end, which *len then includes.
 */

ngx_int_t
ngx_http_idempotency_crypt_seal(ngx_array_t *keys, ngx_str_t *rkey,
    u_char *rec, size_t *len)
{
    int                                n;
    u_char                            *p, *nonce, *plain;
    ngx_http_idempotency_crypt_key_t  *key;

    key = keys->elts;

    p = rec + NGX_HTTP_IDEMPOTENCY_HEAD_LEN;

    *p++ = NGX_HTTP_IDEMPOTENCY_CRYPT_VERSION;
    *p++ = (u_char) key->id.len;
    p = ngx_cpymem(p, key->id.data, key->id.len);

    /* a nonce never used before with this key: 96 random bits */

    nonce = p;

    if (RAND_bytes(nonce, NGX_HTTP_IDEMPOTENCY_NONCE_LEN) != 1) {
        return NGX_ERROR;
    }

    plain = nonce + NGX_HTTP_IDEMPOTENCY_NONCE_LEN;

    /* the inner state goes inside, the head says "sealed" */

    *plain = rec[4];
    rec[4] = NGX_HTTP_IDEMPOTENCY_REC_SEALED;

    if (EVP_CipherInit_ex(key->ctx, NULL, NULL, NULL, nonce, 1) != 1
        || ngx_http_idempotency_crypt_aad(key->ctx, rkey, rec, nonce - rec)
           != NGX_OK
        || ngx_http_idempotency_crypt_run(key->ctx, plain,
                                          rec + *len - plain)
           != NGX_OK
        || EVP_CipherFinal_ex(key->ctx, rec + *len, &n) != 1
        || EVP_CIPHER_CTX_ctrl(key->ctx, EVP_CTRL_AEAD_GET_TAG,
                               NGX_HTTP_IDEMPOTENCY_TAG_LEN, rec + *len)
           != 1)
    {
        return NGX_ERROR;
    }

    *len += NGX_HTTP_IDEMPOTENCY_TAG_LEN;

    return NGX_OK;
}


/*
 * A record read by the claim: NGX_DECLINED if it is not sealed (decoded
 * as it is); else opened in place and decoded into rec (NGX_OK), or
 * refused and logged (NGX_ERROR): never replayed, never overwritten.  Where
 * encryption is required, a completed record in clear is refused so too:
 * only a Redis writer without the key makes one once every worker seals.
 */

ngx_int_t
ngx_http_idempotency_crypt_open(ngx_array_t *keys, ngx_log_t *log,
    ngx_str_t *rkey, u_char *data, size_t len,
    ngx_http_idempotency_record_t *rec)
{
    int                                n;
    u_char                            *p, *nonce, *plain, *tag;
    size_t                             id_len;
    ngx_uint_t                         i;
    const char                        *why;
    ngx_http_idempotency_crypt_key_t  *key;

    if (len <= NGX_HTTP_IDEMPOTENCY_HEAD_LEN
        || ngx_memcmp(data, NGX_HTTP_IDEMPOTENCY_MAGIC, 4) != 0)
    {
        return NGX_DECLINED;
    }

    if (data[4] != NGX_HTTP_IDEMPOTENCY_REC_SEALED) {

        if (keys == NULL
            || !((ngx_http_idempotency_crypt_key_t *) keys->elts)->required
            || (data[4] != NGX_HTTP_IDEMPOTENCY_REC_DONE
                && data[4] != NGX_HTTP_IDEMPOTENCY_REC_DONE_TRAILERS))
        {
            return NGX_DECLINED;
        }

        ngx_log_error(NGX_LOG_ERR, log, 0,
                      "idempotency: clear record refused: a completed "
                      "record must be sealed here (idempotency_encrypt_key "
                      "... required), key hash %*s, %uz bytes",
                      (size_t) 2 * NGX_HTTP_IDEMPOTENCY_HASH_LEN,
                      rkey->data + rkey->len - 1
                      - 2 * NGX_HTTP_IDEMPOTENCY_HASH_LEN, len);

        return NGX_ERROR;
    }

    p = data + NGX_HTTP_IDEMPOTENCY_HEAD_LEN;
    id_len = 0;
    key = NULL;

    if (len < NGX_HTTP_IDEMPOTENCY_HEAD_LEN + 2) {
        why = "truncated";
        goto refused;
    }

    if (p[0] != NGX_HTTP_IDEMPOTENCY_CRYPT_VERSION) {
        why = "an envelope version this module does not know";
        goto refused;
    }

    id_len = p[1];
    p += 2;

    if (id_len == 0 || id_len > NGX_HTTP_IDEMPOTENCY_CRYPT_ID_MAX
        || (size_t) (data + len - p) < id_len + NGX_HTTP_IDEMPOTENCY_NONCE_LEN
                                       + 1 + NGX_HTTP_IDEMPOTENCY_TAG_LEN)
    {
        id_len = 0;
        why = "truncated";
        goto refused;
    }

    for (i = 0; i < id_len; i++) {
        if (p[i] <= 0x20 || p[i] >= 0x7f) {
            id_len = 0;
            why = "its key id is not printable";
            goto refused;
        }
    }

    if (keys == NULL) {
        why = "no idempotency_encrypt_key here";
        goto refused;
    }

    key = keys->elts;

    for (i = 0; i < keys->nelts; i++) {
        if (key[i].id.len == id_len
            && ngx_strncmp(key[i].id.data, p, id_len) == 0)
        {
            break;
        }
    }

    if (i == keys->nelts) {
        key = NULL;
        why = "no idempotency_encrypt_key with its id";
        goto refused;
    }

    key = &key[i];

    nonce = p + id_len;
    plain = nonce + NGX_HTTP_IDEMPOTENCY_NONCE_LEN;
    tag = data + len - NGX_HTTP_IDEMPOTENCY_TAG_LEN;

    /* the plaintext replaces the ciphertext before the tag is checked */

    if (EVP_CipherInit_ex(key->ctx, NULL, NULL, NULL, nonce, 0) != 1
        || EVP_CIPHER_CTX_ctrl(key->ctx, EVP_CTRL_AEAD_SET_TAG,
                               NGX_HTTP_IDEMPOTENCY_TAG_LEN, tag)
           != 1
        || ngx_http_idempotency_crypt_aad(key->ctx, rkey, data, nonce - data)
           != NGX_OK
        || ngx_http_idempotency_crypt_run(key->ctx, plain, tag - plain)
           != NGX_OK)
    {
        why = "decryption failed";
        goto refused;
    }

    if (EVP_CipherFinal_ex(key->ctx, tag, &n) != 1) {
        why = "it does not authenticate (another key, or changed)";
        goto refused;
    }

    /* sealed by a key of ours: only a bug makes it fail here */

    if (ngx_http_idempotency_record_decode_plain(data, plain, tag - plain,
                                                 rec)
        != NGX_OK)
    {
        why = "a corrupt record inside";
        goto refused;
    }

    return NGX_OK;

refused:

    ngx_log_error(NGX_LOG_ERR, log, 0,
                  "idempotency: sealed record not opened: %s, key id "
                  "\"%*s\", key hash %*s, %uz bytes", why, id_len,
                  id_len ? data + NGX_HTTP_IDEMPOTENCY_HEAD_LEN + 2 : data,
                  (size_t) 2 * NGX_HTTP_IDEMPOTENCY_HASH_LEN,
                  rkey->data + rkey->len - 1
                  - 2 * NGX_HTTP_IDEMPOTENCY_HASH_LEN, len);

    return NGX_ERROR;
}


/* the key hash of the record key (between its braces), then the clear part */

static ngx_int_t
ngx_http_idempotency_crypt_aad(EVP_CIPHER_CTX *ctx, ngx_str_t *rkey,
    u_char *data, size_t len)
{
    int  n;

    if (EVP_CipherUpdate(ctx, NULL, &n,
                         rkey->data + rkey->len - 1
                         - 2 * NGX_HTTP_IDEMPOTENCY_HASH_LEN,
                         2 * NGX_HTTP_IDEMPOTENCY_HASH_LEN)
        != 1
        || EVP_CipherUpdate(ctx, NULL, &n, data, (int) len) != 1)
    {
        return NGX_ERROR;
    }

    return NGX_OK;
}


/* in place: GCM writes each block where it read it */

static ngx_int_t
ngx_http_idempotency_crypt_run(EVP_CIPHER_CTX *ctx, u_char *p, size_t len)
{
    int     n;
    size_t  step;

    while (len) {
        step = ngx_min(len, (size_t) NGX_HTTP_IDEMPOTENCY_CRYPT_STEP);

        if (EVP_CipherUpdate(ctx, p, &n, p, (int) step) != 1
            || (size_t) n != step)
        {
            return NGX_ERROR;
        }

        p += step;
        len -= step;
    }

    return NGX_OK;
}


/* the context wipes its key schedule as it is freed */

static void
ngx_http_idempotency_crypt_cleanup(void *data)
{
    EVP_CIPHER_CTX  *ctx = data;

    if (ctx) {
        EVP_CIPHER_CTX_free(ctx);
    }
}
