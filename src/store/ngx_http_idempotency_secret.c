
/*
 * Copyright (C) The ngx_http_idempotency_module authors
 *
 * idempotency_key_secret FILE: keyed record names.  The record key becomes
 * <prefix>{hex HMAC-SHA-256(secret, scope NUL key)}, so that a reader of
 * Redis cannot test guessed keys or scopes against it.
 *
 * HMAC is computed on the digest contexts the module already uses: the
 * inner and outer pads are absorbed once, at configuration time, and each
 * request continues copies of them (RFC 2104), with no MAC object to set
 * up per request.  The file is read by the helper that reads the key files
 * of idempotency_encrypt_key too (crypt.c).
 */


#include "ngx_http_idempotency_store.h"


#define NGX_HTTP_IDEMPOTENCY_SECRET_MIN   32
#define NGX_HTTP_IDEMPOTENCY_SECRET_MAX   4096
#define NGX_HTTP_IDEMPOTENCY_HMAC_BLOCK   64    /* SHA-256's block */
#define NGX_HTTP_IDEMPOTENCY_SECRET_BITS  256


static void ngx_http_idempotency_secret_cleanup(void *data);


char *
ngx_http_idempotency_key_secret_directive(ngx_conf_t *cf, ngx_command_t *cmd,
    void *conf)
{
    u_char                  buf[NGX_HTTP_IDEMPOTENCY_SECRET_MAX + 1];
    u_char                  key[NGX_HTTP_IDEMPOTENCY_HMAC_BLOCK];
    u_char                  pad[NGX_HTTP_IDEMPOTENCY_HMAC_BLOCK];
    char                   *rv;
    size_t                  len, bits;
    ssize_t                 n;
    ngx_str_t              *value, name;
    ngx_uint_t              i;
    unsigned int            dlen;
    ngx_pool_cleanup_t     *cln;
    ngx_http_idempotency_secret_t  *s, **set;

    /* the location's secret, where the command's offset says */
    set = (ngx_http_idempotency_secret_t **) ((char *) conf + cmd->offset);

    if (*set != NGX_CONF_UNSET_PTR) {
        return "is duplicate";
    }

    value = cf->args->elts;

    if (value[1].len == 3 && ngx_strncmp(value[1].data, "off", 3) == 0) {
        *set = NULL;
        return NGX_CONF_OK;
    }

    name = value[1];

    /*
     * From here every way out goes by "done", which wipes what held the
     * secret: a failed reload must not leave it on the master's stack
     */

    rv = NGX_CONF_ERROR;
    ngx_memzero(key, sizeof(key));
    ngx_memzero(pad, sizeof(pad));

    n = ngx_http_idempotency_secret_read(cf, &cmd->name, &name, buf,
                                         sizeof(buf));
    if (n == NGX_ERROR) {
        goto done;
    }

    if (n < NGX_HTTP_IDEMPOTENCY_SECRET_MIN
        || n > NGX_HTTP_IDEMPOTENCY_SECRET_MAX)
    {
        ngx_conf_log_error(NGX_LOG_EMERG, cf, 0,
                           "\"idempotency_key_secret\" file \"%V\" holds %z "
                           "bytes: a secret of %d to %d bytes is expected "
                           "(openssl rand 32 > FILE)", &name, n,
                           NGX_HTTP_IDEMPOTENCY_SECRET_MIN,
                           NGX_HTTP_IDEMPOTENCY_SECRET_MAX);
        goto done;
    }

    /* hex text has 4 bits a byte: "openssl rand -hex 16" passes the size */

    bits = ngx_http_idempotency_secret_hex_bits(buf, n);

    if (bits && bits < NGX_HTTP_IDEMPOTENCY_SECRET_BITS) {
        ngx_conf_log_error(NGX_LOG_EMERG, cf, 0,
                           "\"idempotency_key_secret\" file \"%V\" holds "
                           "%uz hexadecimal digits, %uz bits: a secret of "
                           "%d bits is expected (openssl rand -hex 32 > FILE)",
                           &name, bits / 4, bits,
                           NGX_HTTP_IDEMPOTENCY_SECRET_BITS);
        goto done;
    }

    s = ngx_pcalloc(cf->pool, sizeof(ngx_http_idempotency_secret_t));
    if (s == NULL) {
        goto done;
    }

    cln = ngx_pool_cleanup_add(cf->pool, 0);
    if (cln == NULL) {
        goto done;
    }

    cln->handler = ngx_http_idempotency_secret_cleanup;
    cln->data = s;

    s->inner = EVP_MD_CTX_new();
    s->outer = EVP_MD_CTX_new();

    if (s->inner == NULL || s->outer == NULL) {
        goto done;
    }

    /* a key longer than the block is hashed first (RFC 2104) */

    len = n;

    if (len > NGX_HTTP_IDEMPOTENCY_HMAC_BLOCK) {
        if (EVP_Digest(buf, len, key, &dlen, EVP_sha256(), NULL) != 1) {
            goto done;
        }

    } else {
        ngx_memcpy(key, buf, len);
    }

    for (i = 0; i < NGX_HTTP_IDEMPOTENCY_HMAC_BLOCK; i++) {
        pad[i] = key[i] ^ 0x36;
    }

    if (EVP_DigestInit_ex(s->inner, EVP_sha256(), NULL) != 1
        || EVP_DigestUpdate(s->inner, pad, sizeof(pad)) != 1)
    {
        goto done;
    }

    for (i = 0; i < NGX_HTTP_IDEMPOTENCY_HMAC_BLOCK; i++) {
        pad[i] = key[i] ^ 0x5c;
    }

    if (EVP_DigestInit_ex(s->outer, EVP_sha256(), NULL) != 1
        || EVP_DigestUpdate(s->outer, pad, sizeof(pad)) != 1)
    {
        goto done;
    }

    *set = s;
    rv = NGX_CONF_OK;

done:

    /* the contexts, which hold the pads' state, are wiped when freed */

    ngx_explicit_memzero(buf, sizeof(buf));
    ngx_explicit_memzero(key, sizeof(key));
    ngx_explicit_memzero(pad, sizeof(pad));

    return rv;
}


/*
 * The bits of a file written as hex text ("openssl rand -hex N"): 4 a
 * digit, a final line end aside.  0 if it is anything else, raw bytes
 * whose 8 bits a byte the size checks count.
 */

size_t
ngx_http_idempotency_secret_hex_bits(u_char *p, size_t n)
{
    size_t  i;
    u_char  c;

    if (n && p[n - 1] == '\n') {
        n--;

        if (n && p[n - 1] == '\r') {
            n--;
        }
    }

    if (n == 0) {
        return 0;
    }

    for (i = 0; i < n; i++) {
        c = p[i] | 0x20;

        if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'))) {
            return 0;
        }
    }

    return 4 * n;
}


/*
 * Reads the secret file of a directive (idempotency_key_secret,
 * idempotency_encrypt_key) into buf: at most size bytes, so that a caller
 * asking one byte more than it accepts sees a file too long.  A file that
 * group or others may access is refused.  name becomes the full name.
 * Returns the bytes read, or NGX_ERROR once logged.
 */

ssize_t
ngx_http_idempotency_secret_read(ngx_conf_t *cf, ngx_str_t *directive,
    ngx_str_t *name, u_char *buf, size_t size)
{
    ssize_t          n;
    ngx_fd_t         fd;
    ngx_file_info_t  fi;

    if (ngx_conf_full_name(cf->cycle, name, 1) != NGX_OK) {
        return NGX_ERROR;
    }

    fd = ngx_open_file(name->data, NGX_FILE_RDONLY, NGX_FILE_OPEN, 0);
    if (fd == NGX_INVALID_FILE) {
        ngx_conf_log_error(NGX_LOG_EMERG, cf, ngx_errno,
                           ngx_open_file_n " \"%V\" failed", name);
        return NGX_ERROR;
    }

    if (ngx_fd_info(fd, &fi) == NGX_FILE_ERROR) {
        ngx_conf_log_error(NGX_LOG_EMERG, cf, ngx_errno,
                           ngx_fd_info_n " \"%V\" failed", name);
        (void) ngx_close_file(fd);
        return NGX_ERROR;
    }

    /* a directory opens, and its mode would read as "chmod 600" */

    if (!ngx_is_file(&fi)) {
        ngx_conf_log_error(NGX_LOG_EMERG, cf, 0,
                           "\"%V\" file \"%V\" is %s: name the key file",
                           directive, name,
                           ngx_is_dir(&fi) ? "a directory"
                                           : "not a regular file");
        (void) ngx_close_file(fd);
        return NGX_ERROR;
    }

    /* a secret others can read is no secret */

    if (fi.st_mode & (S_IRWXG | S_IRWXO)) {
        ngx_conf_log_error(NGX_LOG_EMERG, cf, 0,
                           "\"%V\" file \"%V\" must not be accessible to "
                           "group or others (chmod 600)", directive, name);
        (void) ngx_close_file(fd);
        return NGX_ERROR;
    }

    n = ngx_read_fd(fd, buf, size);
    (void) ngx_close_file(fd);

    if (n == -1) {
        ngx_conf_log_error(NGX_LOG_EMERG, cf, ngx_errno,
                           ngx_read_fd_n " \"%V\" failed", name);
        return NGX_ERROR;
    }

    return n;
}


/*
 * HMAC-SHA-256(secret, scope NUL key) into hash: the inner hash continues
 * from the inner pad, the outer one from the outer pad
 */

ngx_int_t
ngx_http_idempotency_secret_hash(ngx_http_idempotency_secret_t *s,
    EVP_MD_CTX *md, ngx_str_t *scope, ngx_str_t *key, u_char *hash)
{
    u_char        inner[EVP_MAX_MD_SIZE];
    unsigned int  len;

    if (EVP_MD_CTX_copy_ex(md, s->inner) != 1
        || EVP_DigestUpdate(md, scope->data, scope->len) != 1
        || EVP_DigestUpdate(md, "", 1) != 1
        || EVP_DigestUpdate(md, key->data, key->len) != 1
        || EVP_DigestFinal_ex(md, inner, &len) != 1
        || EVP_MD_CTX_copy_ex(md, s->outer) != 1
        || EVP_DigestUpdate(md, inner, len) != 1
        || EVP_DigestFinal_ex(md, hash, &len) != 1)
    {
        return NGX_ERROR;
    }

    return NGX_OK;
}


static void
ngx_http_idempotency_secret_cleanup(void *data)
{
    ngx_http_idempotency_secret_t *s = data;

    if (s->inner) {
        EVP_MD_CTX_free(s->inner);
    }

    if (s->outer) {
        EVP_MD_CTX_free(s->outer);
    }
}
