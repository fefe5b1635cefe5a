
/*
 * Copyright (C) The ngx_http_idempotency_module authors
 *
 * The owner's response outlives its client (SPEC §3): once the request
 * may have run upstream, its result must be stored even if the client
 * went away, or a retry after idempotency_lock_ttl would run it again.
 *
 * Unless proxy_ignore_client_abort (fastcgi_, uwsgi_, scgi_...) is on,
 * the upstream module closes the upstream connection when a client event
 * shows that the client is gone.  While the owner's response is not yet
 * complete we keep those events from it: a read event, or a write event
 * before the response header, that finds the client gone is dropped.
 * Once writing to the client fails, the filters go on capturing without
 * passing the response down (ngx_http_idempotency_client_gone()).
 *
 * An HTTP/3 request runs on a QUIC stream, a connection of its own with
 * no socket of its own: the checks follow nginx's for c->quic.
 */


#include "ngx_http_idempotency_http.h"


static void ngx_http_idempotency_conn_handler(ngx_event_t *ev);
static void ngx_http_idempotency_send_timeout(ngx_http_request_t *r,
    ngx_http_idempotency_ctx_t *ctx, ngx_event_t *wev);
static ngx_uint_t ngx_http_idempotency_closing(ngx_http_request_t *r);
static ngx_uint_t ngx_http_idempotency_quic(ngx_http_request_t *r);
static ngx_uint_t ngx_http_idempotency_peer_closed(ngx_http_request_t *r,
    ngx_event_t *ev);


void
ngx_http_idempotency_keep_upstream(ngx_http_request_t *r,
    ngx_http_idempotency_ctx_t *ctx)
{
    ngx_connection_t  *c;

    c = r->connection;

    if (c->read->handler == ngx_http_idempotency_conn_handler) {
        return;
    }

    ctx->read_handler = c->read->handler;
    ctx->write_handler = c->write->handler;

    c->read->handler = ngx_http_idempotency_conn_handler;
    c->write->handler = ngx_http_idempotency_conn_handler;
}


/* the request ends: the connection's next user gets nginx's handlers */

void
ngx_http_idempotency_keep_done(ngx_http_request_t *r,
    ngx_http_idempotency_ctx_t *ctx)
{
    ngx_connection_t  *c;

    c = r->connection;

    if (c->read->handler == ngx_http_idempotency_conn_handler) {
        c->read->handler = ctx->read_handler;
    }

    if (c->write->handler == ngx_http_idempotency_conn_handler) {
        c->write->handler = ctx->write_handler;
    }
}


static void
ngx_http_idempotency_conn_handler(ngx_event_t *ev)
{
    ngx_connection_t            *c;
    ngx_http_request_t          *r;
    ngx_http_idempotency_ctx_t  *ctx;

    c = ev->data;
    r = c->data;

    ctx = ngx_http_idempotency_get_ctx(r->main);

    if (ctx == NULL) {
        /* cannot happen: nginx resets the handlers with the request */
        ngx_log_error(NGX_LOG_ALERT, c->log, 0,
                      "idempotency: connection event without a request");
        return;
    }

    if (ctx->owner && !ctx->claim->finished && r->main->upstream) {

        if (ngx_exiting && ngx_http_idempotency_closing(r->main)) {
            /* worker_shutdown_timeout: the request ends, the claim stays */

        } else if (ev->timedout) {

            if (ev->write && ctx->capturing) {
                ngx_http_idempotency_send_timeout(r->main, ctx, ev);
            }

        } else if ((!ev->write || !r->main->header_sent
                    || ngx_http_idempotency_quic(r->main))
                   && ngx_http_idempotency_peer_closed(r->main, ev))
        {
            ngx_log_debug0(NGX_LOG_DEBUG_HTTP, c->log, 0,
                           "idempotency: client gone, upstream kept");

            if ((ngx_event_flags & NGX_USE_LEVEL_EVENT) && ev->active) {
                if (ngx_del_event(ev, ev->write ? NGX_WRITE_EVENT
                                                : NGX_READ_EVENT, 0)
                    != NGX_OK)
                {
                    c->error = 1;
                }
            }

            return;
        }
    }

    if (ev->write) {
        ctx->write_handler(ev);

    } else {
        ctx->read_handler(ev);
    }
}


/*
 * send_timeout while the owner's response streams: the client stopped
 * reading, but the upstream has run.  The client is treated as gone, as
 * if it had closed: the upstream is read to its end and the response is
 * captured and stored, never sent.  The write event looks ready so that
 * the upstream module passes on what it holds.
 */

static void
ngx_http_idempotency_send_timeout(ngx_http_request_t *r,
    ngx_http_idempotency_ctx_t *ctx, ngx_event_t *wev)
{
    ngx_connection_t  *c;

    c = r->connection;

    ngx_log_error(NGX_LOG_INFO, c->log, NGX_ETIMEDOUT,
                  "idempotency: client timed out, the response is still "
                  "read and stored");

    c->timedout = 1;
    c->error = 1;
    ctx->gone = 1;

    wev->timedout = 0;
    wev->ready = 1;
}


/*
 * worker_shutdown_timeout marks every client connection to be closed
 * (close and error).  HTTP/2 takes back "close" before it ends the
 * streams, so there the error of the connection that carries the stream
 * tells, while the worker is exiting.  A QUIC stream is itself one of the
 * cycle's connections and is marked so; a QUIC connection that closes
 * (the client's CONNECTION_CLOSE, an idle timeout) marks its streams
 * "close" too, but not "error": that is a client gone, not the timeout.
 */

static ngx_uint_t
ngx_http_idempotency_closing(ngx_http_request_t *r)
{
#if (NGX_HTTP_V2)
    if (r->stream) {
        return r->stream->connection->connection->error;
    }
#endif

#if (NGX_HTTP_V3)
    if (r->connection->quic) {
        return r->connection->close && r->connection->error;
    }
#endif

    return r->connection->close;
}


/*
 * Whether the request runs on a QUIC stream.  Once such a stream cannot
 * be written, a write event is of no use to the response, and one passed
 * on would end the request: a QUIC connection that closes marks its
 * streams "close", which ngx_http_request_handler() obeys at once.
 */

static ngx_uint_t
ngx_http_idempotency_quic(ngx_http_request_t *r)
{
#if (NGX_HTTP_V3)
    if (r->connection->quic) {
        return 1;
    }
#endif

    return 0;
}


/* what the upstream module's broken-connection check would conclude */

static ngx_uint_t
ngx_http_idempotency_peer_closed(ngx_http_request_t *r, ngx_event_t *ev)
{
    int                n;
    char               buf[1];
    ngx_err_t          err;
    ngx_connection_t  *c;

    c = r->connection;

#if (NGX_HTTP_V3)
    if (c->quic) {
        /*
         * A QUIC stream's fd is the UDP socket that every stream and
         * client of the listener shares, and its read event's eof is the
         * end of the request body, not of the client.  As nginx's own
         * check, the client is gone once the stream cannot be written:
         * the client's STOP_SENDING, or the QUIC connection closed.
         */
        return c->error || c->write->error;
    }
#endif

    /* epoll's EPOLLRDHUP: what nginx itself trusts, TLS included */

    if (c->error || ev->eof || ev->pending_eof) {
        return 1;
    }

#if (NGX_HTTP_V2)
    if (r->stream) {
        /* HTTP/2 marks a reset or closed stream with c->error */
        return 0;
    }
#endif

    /* a TLS close_notify not read yet is data, then EOF comes with RDHUP */

    n = recv(c->fd, buf, 1, MSG_PEEK);
    err = ngx_socket_errno;

    if (n > 0 || (n == -1 && err == NGX_EAGAIN)) {
        return 0;
    }

    return 1;
}


/*
 * Called by the filters when passing the response down failed: if the
 * client is gone while the owner's response is still being captured,
 * the rest is captured and not sent.
 */

ngx_uint_t
ngx_http_idempotency_client_gone(ngx_http_request_t *r,
    ngx_http_idempotency_ctx_t *ctx)
{
    if (ctx->gone) {
        return 1;
    }

    if (!ctx->capturing || !r->connection->error) {
        return 0;
    }

    ngx_log_error(NGX_LOG_INFO, r->connection->log, 0,
                  "idempotency: client closed the connection, the response "
                  "is still read and stored");

    ctx->gone = 1;

    return 1;
}
