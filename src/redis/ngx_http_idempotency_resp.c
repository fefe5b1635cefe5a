
/*
 * Copyright (C) The ngx_http_idempotency_module authors
 *
 * The commands as RESP bytes: formatted by hand, straight into a node's
 * output buffer or an op's kept copy; a kept command copied for another
 * op, or one of its arguments replaced; a kept EVALSHA rewritten into EVAL
 * with the script's text after a NOSCRIPT.  All know the layout of a RESP
 * array of bulk strings, so they are kept together, and apart from the
 * FIFO that sends them (node.c).  Nothing above the client reads them.
 */


#include "ngx_http_idempotency_redis.h"


static u_char *ngx_http_idempotency_format_size(u_char *p, size_t n);


/* the most a command can take once formatted */

size_t
ngx_http_idempotency_format_len(int argc, const size_t *argvlen)
{
    int     i;
    size_t  len;

    len = sizeof("*\r\n") - 1 + NGX_INT_T_LEN;

    for (i = 0; i < argc; i++) {
        len += sizeof("$\r\n\r\n") - 1 + NGX_SIZE_T_LEN + argvlen[i];
    }

    return len;
}


/*
 * RESP by hand: ngx_sprintf's format parsing was the largest part of a
 * command's formatting (two commands and some 15 lengths per request)
 */

u_char *
ngx_http_idempotency_format(u_char *p, int argc, const char **argv,
    const size_t *argvlen)
{
    int  i;

    *p++ = '*';
    p = ngx_http_idempotency_format_size(p, (size_t) argc);

    for (i = 0; i < argc; i++) {
        *p++ = '$';
        p = ngx_http_idempotency_format_size(p, argvlen[i]);
        p = ngx_cpymem(p, argv[i], argvlen[i]);
        *p++ = CR;
        *p++ = LF;
    }

    return p;
}


/* a decimal number and CRLF */

static u_char *
ngx_http_idempotency_format_size(u_char *p, size_t n)
{
    p = ngx_http_idempotency_decimal(p, n);
    *p++ = CR;
    *p++ = LF;

    return p;
}


/* what ngx_sprintf("%uz") writes, without parsing a format per number */

u_char *
ngx_http_idempotency_decimal(u_char *p, size_t n)
{
    u_char   buf[NGX_SIZE_T_LEN];
    u_char  *d;

    d = buf + NGX_SIZE_T_LEN;

    do {
        *--d = (u_char) ('0' + n % 10);
        n /= 10;
    } while (n);

    return ngx_cpymem(p, d, buf + NGX_SIZE_T_LEN - d);
}


/*
 * NOSCRIPT: Redis did not run the script, so the same command goes again
 * on the same node, by EVAL with the script's text: "*N", "EVALSHA", the
 * SHA, then the arguments as they were.  EVAL caches the script, so the
 * EVALSHAs after it find it again: no SCRIPT LOAD is needed.
 */

ngx_int_t
ngx_http_idempotency_node_noscript(ngx_http_idempotency_node_t *node,
    ngx_http_idempotency_op_t *op)
{
    u_char     *p, *buf, *last, *args;
    size_t      len;
    ngx_str_t  *script;

    static u_char  evalsha[] = "$7\r\nEVALSHA\r\n$40\r\n";

    script = op->script;
    last = op->buf + op->buf_len;

    p = ngx_strlchr(op->buf, last, LF);

    if (p == NULL
        || (size_t) (last - ++p) < sizeof(evalsha) - 1 + 40 + 2
        || ngx_strncmp(p, evalsha, sizeof(evalsha) - 1) != 0)
    {
        return NGX_DECLINED;
    }

    args = p + sizeof(evalsha) - 1 + 40 + 2;

    len = (p - op->buf) + sizeof("$4\r\nEVAL\r\n$\r\n\r\n") - 1
          + NGX_SIZE_T_LEN + script->len + (last - args);

    buf = ngx_alloc(len, node->redis->log);
    if (buf == NULL) {
        return NGX_DECLINED;
    }

    p = ngx_cpymem(buf, op->buf, p - op->buf);
    p = ngx_sprintf(p, "$4\r\nEVAL\r\n$%uz\r\n", script->len);
    p = ngx_cpymem(p, script->data, script->len);
    *p++ = CR;
    *p++ = LF;
    p = ngx_cpymem(p, args, last - args);

    ngx_free(op->buf);
    op->buf = buf;
    op->buf_len = p - buf;
    op->script = NULL;

    p = ngx_http_idempotency_conn_reserve(node, op->buf_len);
    if (p == NULL) {
        /* op->buf is freed with the op */
        return NGX_DECLINED;
    }

    node->out_last = ngx_cpymem(p, op->buf, op->buf_len);

    ngx_http_idempotency_node_queue(node, op);

    return NGX_OK;
}


/*
 * The op keeps its own copy of a command another op kept (data, len), to
 * send it again (redis_command_kept())
 */

ngx_int_t
ngx_http_idempotency_resp_keep(ngx_http_idempotency_op_t *op, u_char *data,
    size_t len)
{
    if (data == NULL || len == 0) {
        return NGX_ERROR;
    }

    op->buf = ngx_alloc(len, op->redis->log);
    if (op->buf == NULL) {
        return NGX_ERROR;
    }

    op->buf_len = len;
    ngx_memcpy(op->buf, data, len);

    return NGX_OK;
}


/*
 * Argument n (0: the command's name) of the kept command replaced by
 * data: "*N\r\n" then N times "$len\r\n" bytes "\r\n", as format() wrote
 * it.  Every length is checked against the bytes there.
 */

ngx_int_t
ngx_http_idempotency_resp_replace(ngx_http_idempotency_op_t *op,
    ngx_uint_t n, u_char *data, size_t len)
{
    u_char      *p, *last, *arg, *next, *buf;
    size_t       size, alen;
    ngx_uint_t   i, argc;

    if (op->buf == NULL) {
        return NGX_ERROR;
    }

    p = op->buf;
    last = op->buf + op->buf_len;

    if (last - p < 4 || *p++ != '*') {
        return NGX_ERROR;
    }

    for (argc = 0; p < last && *p >= '0' && *p <= '9'; p++) {
        argc = argc * 10 + (*p - '0');

        if (argc > NGX_MAX_INT32_VALUE) {
            return NGX_ERROR;
        }
    }

    if (n >= argc || last - p < 2 || *p != CR) {
        return NGX_ERROR;
    }

    p += 2;
    arg = NULL;
    alen = 0;

    for (i = 0; i <= n; i++) {
        arg = p;

        if (last - p < 4 || *p++ != '$') {
            return NGX_ERROR;
        }

        for (alen = 0; p < last && *p >= '0' && *p <= '9'; p++) {
            alen = alen * 10 + (*p - '0');

            if (alen > (size_t) (last - p)) {
                return NGX_ERROR;
            }
        }

        if (last - p < 2 || *p != CR) {
            return NGX_ERROR;
        }

        p += 2;

        if ((size_t) (last - p) < alen + 2) {
            return NGX_ERROR;
        }

        p += alen + 2;
    }

    /* arg: where argument n starts ("$"), p: where the next one does */

    next = p;

    if (alen == len) {
        ngx_memcpy(next - 2 - len, data, len);
        return NGX_OK;
    }

    size = (arg - op->buf) + sizeof("$\r\n\r\n") - 1 + NGX_SIZE_T_LEN + len
           + (last - next);

    buf = ngx_alloc(size, op->redis->log);
    if (buf == NULL) {
        return NGX_ERROR;
    }

    p = ngx_cpymem(buf, op->buf, arg - op->buf);
    *p++ = '$';
    p = ngx_http_idempotency_format_size(p, len);
    p = ngx_cpymem(p, data, len);
    *p++ = CR;
    *p++ = LF;
    p = ngx_cpymem(p, next, last - next);

    ngx_free(op->buf);
    op->buf = buf;
    op->buf_len = p - buf;

    return NGX_OK;
}
