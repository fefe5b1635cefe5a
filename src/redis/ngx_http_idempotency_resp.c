
/*
 * Copyright (C) The ngx_http_idempotency_module authors
 *
 * The commands as RESP bytes: formatted by hand, straight into a node's
 * output buffer or a store's kept copy, and a kept EVALSHA rewritten into
 * EVAL with the script's text after a NOSCRIPT.  Both know the layout of
 * a RESP array of bulk strings, so they are kept together, and apart from
 * the FIFO that sends them (node.c).
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
