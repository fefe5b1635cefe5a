
/*
 * Copyright (C) The ngx_http_idempotency_module authors
 */


#ifndef _NGX_HTTP_IDEMPOTENCY_MODULE_H_INCLUDED_
#define _NGX_HTTP_IDEMPOTENCY_MODULE_H_INCLUDED_


#include <ngx_config.h>
#include <ngx_core.h>
#include <ngx_http.h>

#include <openssl/evp.h>
#include <hiredis/hiredis.h>

#include "ngx_http_idempotency_version.h"


#define NGX_HTTP_IDEMPOTENCY_HASH_LEN       32      /* SHA-256 */
#define NGX_HTTP_IDEMPOTENCY_HEX_LEN        64      /* ...in hex */
#define NGX_HTTP_IDEMPOTENCY_TOKEN_LEN      16
#define NGX_HTTP_IDEMPOTENCY_PREFIX_MAX     64

/* a claim kept to be sent again after a broken connection (SET or EVALSHA) */
#define NGX_HTTP_IDEMPOTENCY_RESEND_MAX     384

/* one read from Redis: a 256 KB reply takes 4 reads in one event */
#define NGX_HTTP_IDEMPOTENCY_READ_SIZE      65536

/* from this size a bulk string is read in place (input.c) */
#define NGX_HTTP_IDEMPOTENCY_BULK_MIN       16384

/*
 * "key hash …, client: …, request: "…"" in the log lines of a store or
 * release: 95 fixed bytes and an address of at most NGX_SOCKADDR_STRLEN
 * (113) leave the request line at least 111
 */
#define NGX_HTTP_IDEMPOTENCY_INFO_LEN       320

/* prefix + "{" + 64 hex digits + "}" */
#define NGX_HTTP_IDEMPOTENCY_RKEY_MAX                                         \
    (NGX_HTTP_IDEMPOTENCY_PREFIX_MAX + 2 + 2 * NGX_HTTP_IDEMPOTENCY_HASH_LEN)

/* "IDM1" | state | fingerprint | token: the claim, and every record's head */
#define NGX_HTTP_IDEMPOTENCY_MAGIC          "IDM1"
#define NGX_HTTP_IDEMPOTENCY_HEAD_LEN                                         \
    (4 + 1 + NGX_HTTP_IDEMPOTENCY_HASH_LEN + NGX_HTTP_IDEMPOTENCY_TOKEN_LEN)

#define NGX_HTTP_IDEMPOTENCY_REC_CLAIM      1
#define NGX_HTTP_IDEMPOTENCY_REC_DONE       2
#define NGX_HTTP_IDEMPOTENCY_REC_TOO_LARGE  3
#define NGX_HTTP_IDEMPOTENCY_REC_DONE_TRAILERS  4   /* done, then trailers */
#define NGX_HTTP_IDEMPOTENCY_REC_SEALED     5   /* 2 or 4, encrypted */

/* the GCM tag that ends a sealed record */
#define NGX_HTTP_IDEMPOTENCY_TAG_LEN        16

/*
 * Format 2 claims (lease.c): the token is owner[8] | 0xC1 | kind | word[6];
 * a lease holds its deadline, an unknown outcome its status and cause.  The
 * first OWNER_LEN bytes of a claim name its owner.
 */
#define NGX_HTTP_IDEMPOTENCY_OWNER_LEN                                        \
    (4 + 1 + NGX_HTTP_IDEMPOTENCY_HASH_LEN + 8)
#define NGX_HTTP_IDEMPOTENCY_LEASE_MARK     0xC1

#define NGX_HTTP_IDEMPOTENCY_LEASE_OLD      0   /* format 1: a plain lock */
#define NGX_HTTP_IDEMPOTENCY_LEASE_LIVE     1
#define NGX_HTTP_IDEMPOTENCY_LEASE_EXPIRED  2
#define NGX_HTTP_IDEMPOTENCY_LEASE_UNKNOWN  3

/* why a record became unknown: nginx_idempotency_outcomes_unknown_total */
#define NGX_HTTP_IDEMPOTENCY_CAUSE_UPSTREAM    1
#define NGX_HTTP_IDEMPOTENCY_CAUSE_OWNER_LOST  2
#define NGX_HTTP_IDEMPOTENCY_CAUSE_STORE_LOST  3
#define NGX_HTTP_IDEMPOTENCY_CAUSES            3

/* what the owner's upstream did (outcome.c) */
#define NGX_HTTP_IDEMPOTENCY_OUT_NONE       0   /* no upstream: own answer */
#define NGX_HTTP_IDEMPOTENCY_OUT_NOT_SENT   1   /* never reached: nothing ran */
#define NGX_HTTP_IDEMPOTENCY_OUT_SENT       2   /* may have run, no header */
#define NGX_HTTP_IDEMPOTENCY_OUT_ANSWERED   3   /* a response header came */

#define NGX_HTTP_IDEMPOTENCY_ON_UNKNOWN_KEEP     0
#define NGX_HTTP_IDEMPOTENCY_ON_UNKNOWN_FORWARD  1
#define NGX_HTTP_IDEMPOTENCY_ON_UNKNOWN_RELEASE  2


/* $idempotency_status values */
typedef enum {
    NGX_HTTP_IDEMPOTENCY_BYPASS = 0,
    NGX_HTTP_IDEMPOTENCY_NEW,
    NGX_HTTP_IDEMPOTENCY_REPLAY,
    NGX_HTTP_IDEMPOTENCY_CONFLICT,
    NGX_HTTP_IDEMPOTENCY_MISMATCH,
    NGX_HTTP_IDEMPOTENCY_INVALID,
    NGX_HTTP_IDEMPOTENCY_MISSING,
    NGX_HTTP_IDEMPOTENCY_ERROR,
    NGX_HTTP_IDEMPOTENCY_UNKNOWN
} ngx_http_idempotency_status_e;


/* request state machine, see docs/design.md */
typedef enum {
    NGX_HTTP_IDEMPOTENCY_ST_INIT = 0,
    NGX_HTTP_IDEMPOTENCY_ST_READING_BODY,
    NGX_HTTP_IDEMPOTENCY_ST_BODY_DONE,
    NGX_HTTP_IDEMPOTENCY_ST_WAITING_REDIS,
    NGX_HTTP_IDEMPOTENCY_ST_POLLING,
    NGX_HTTP_IDEMPOTENCY_ST_DECIDED,
    NGX_HTTP_IDEMPOTENCY_ST_DONE
} ngx_http_idempotency_state_e;


/* what the claim round trip decided */
typedef enum {
    NGX_HTTP_IDEMPOTENCY_GO_OWNER = 0,
    NGX_HTTP_IDEMPOTENCY_GO_REPLAY,
    NGX_HTTP_IDEMPOTENCY_GO_CONFLICT,
    NGX_HTTP_IDEMPOTENCY_GO_TOO_LARGE,
    NGX_HTTP_IDEMPOTENCY_GO_MISMATCH,
    NGX_HTTP_IDEMPOTENCY_GO_ERROR,
    NGX_HTTP_IDEMPOTENCY_GO_UNKNOWN,     /* may have run: on_unknown */
    NGX_HTTP_IDEMPOTENCY_GO_TAKE_OVER    /* take(): sent, not answered */
} ngx_http_idempotency_go_e;


/* how the claim is sent; each step down is taken once, on a refusal */
#define NGX_HTTP_IDEMPOTENCY_CLAIM_SET      0
#define NGX_HTTP_IDEMPOTENCY_CLAIM_EVALSHA  1
#define NGX_HTTP_IDEMPOTENCY_CLAIM_EVAL     2


#define NGX_HTTP_IDEMPOTENCY_ON_ERROR_REJECT  0
#define NGX_HTTP_IDEMPOTENCY_ON_ERROR_PASS    1


typedef enum {
    NGX_HTTP_IDEMPOTENCY_PROBLEM_MISSING = 0,
    NGX_HTTP_IDEMPOTENCY_PROBLEM_INVALID,
    NGX_HTTP_IDEMPOTENCY_PROBLEM_CONFLICT,
    NGX_HTTP_IDEMPOTENCY_PROBLEM_TOO_LARGE,
    NGX_HTTP_IDEMPOTENCY_PROBLEM_MISMATCH,
    NGX_HTTP_IDEMPOTENCY_PROBLEM_UNAVAILABLE,
    NGX_HTTP_IDEMPOTENCY_PROBLEM_UNKNOWN,
    NGX_HTTP_IDEMPOTENCY_PROBLEM_BODY
} ngx_http_idempotency_problem_e;


typedef struct ngx_http_idempotency_op_s     ngx_http_idempotency_op_t;
typedef struct ngx_http_idempotency_ctx_s    ngx_http_idempotency_ctx_t;


typedef struct ngx_http_idempotency_redis_s  ngx_http_idempotency_redis_t;
typedef struct ngx_http_idempotency_sentinel_s
    ngx_http_idempotency_sentinel_t;


/*
 * One connection to one Redis server (conn.c moves the bytes, redis.c the
 * commands).  A backend has one node today; a cluster would have one per
 * shard master, each with its own FIFO of sent commands.
 */
typedef struct {
    ngx_http_idempotency_redis_t    *redis;      /* the backend it serves */
    ngx_log_t                        log;        /* keeps the reason */
    ngx_peer_connection_t            peer;
    ngx_connection_t                *conn;       /* NULL: none */
    ngx_pool_t                      *pool;       /* of the connection */
    ngx_resolver_ctx_t              *resolving;
    redisReader                     *reader;
    u_char                          *in;         /* recv buffer */

    /* input.c: a large bulk string read in place */
    u_char                          *bulk;
    size_t                           bulk_size;  /* with its CRLF */
    size_t                           bulk_got;

    /* formatted commands not yet sent */
    u_char                          *out;
    u_char                          *out_pos;
    u_char                          *out_last;
    u_char                          *out_end;

    /* sent or queued commands, in the order of their replies */
    ngx_http_idempotency_op_t       *head;
    ngx_http_idempotency_op_t      **tail;
    ngx_uint_t                       pending;

    /* claims lost with a connection, sent again on the next one */
    ngx_http_idempotency_op_t       *parked;
    ngx_http_idempotency_op_t      **parked_tail;

    ngx_addr_t                      *addrs;      /* last resolved */
    ngx_uint_t                       naddrs;
    ngx_uint_t                       addr;       /* the one to try next */
#if (NGX_HTTP_SSL)
    ngx_ssl_session_t               *session;
#endif

    ngx_event_t                      connect_ev;
    ngx_event_t                      reconnect_ev;
    ngx_event_t                      reset_ev;
    ngx_event_t                      watchdog_ev;
    ngx_event_t                      flush_ev;
    ngx_msec_t                       backoff;

    /* cluster.c: a node known by name, resolved on every connect */
    ngx_str_t                        host;
    in_port_t                        port;

    /* what nginx said about the connection last: the failure's reason */
    size_t                           reason_len;
    ngx_uint_t                       reason_level;
    u_char                           reason[160];

    unsigned                         open:1;     /* takes commands */
    unsigned                         connected:1;    /* TCP */
    unsigned                         ready:1;    /* TCP and TLS */
    unsigned                         handshake_failed:1;
    unsigned                         failed:1;   /* failure logged */
    unsigned                         up:1;       /* handshake succeeded */
    unsigned                         was_up:1;
    unsigned                         refused:1;  /* refusal logged */
    unsigned                         notify:1;   /* notify.c's subscriber */
} ngx_http_idempotency_node_t;


/* one Redis target; the runtime part is per worker (after fork) */
struct ngx_http_idempotency_redis_s {
    ngx_str_t                        name;       /* for logs */
    ngx_str_t                        host;       /* to resolve, or empty */
    ngx_addr_t                      *addrs;      /* resolved when parsed */
    ngx_uint_t                       naddrs;
    in_port_t                        port;
    ngx_uint_t                       db;
    ngx_str_t                        user;
    ngx_str_t                        password;
    ngx_msec_t                       timeout;    /* connect, watchdog */
    ngx_uint_t                       used;       /* unsigned  used:1; */
    ngx_resolver_t                  *resolver;   /* NULL: addrs only */
    ngx_msec_t                       resolver_timeout;
    ngx_str_t                        conf_file;  /* where it is written */
    ngx_uint_t                       conf_line;

    ngx_uint_t                       tls;        /* unsigned  tls:1; */
#if (NGX_HTTP_SSL)
    ngx_ssl_t                       *ssl;
    ngx_str_t                        tls_name;   /* NUL-terminated */
    ngx_flag_t                       tls_verify;
    void                            *tls_conf;   /* the loc conf it is of */
    unsigned                         tls_name_ip:1;
#endif

    ngx_http_idempotency_node_t     *node;       /* per worker */
    ngx_msec_t                       wait_timeout;   /* the longest WAIT */
    ngx_http_idempotency_sentinel_t *sentinel;   /* sentinel.c, or NULL */
    ngx_uint_t                       claim_mode;

    /* cluster.c: the seeds (ngx_addr_t), NULL if not a cluster */
    ngx_array_t                     *seeds;
    ngx_array_t                     *seed_names;    /* given by name */
    void                            *cluster;    /* per worker */
    void                            *notify;     /* notify.c, per worker */

    ngx_log_t                       *log;

    unsigned                         exiting:1;
    unsigned                         script_refused:1;
};


/* secret.c: the HMAC pads of idempotency_key_secret, absorbed once */
typedef struct {
    EVP_MD_CTX                      *inner;
    EVP_MD_CTX                      *outer;
} ngx_http_idempotency_secret_t;


typedef struct {
    ngx_array_t                      servers;    /* redis_t * */
    ngx_http_idempotency_redis_t    *default_server;

    void                            *metrics;    /* metrics.c */
} ngx_http_idempotency_main_conf_t;


typedef struct {
    ngx_flag_t                       enable;
    ngx_http_idempotency_redis_t    *redis;
    ngx_msec_t                       redis_timeout;
    ngx_str_t                        prefix;
    ngx_http_complex_value_t        *key;        /* NULL: the header */
    size_t                           key_max_length;
    ngx_http_complex_value_t        *scope;
    ngx_http_idempotency_secret_t   *secret;     /* NULL: plain SHA-256 */
    ngx_array_t                     *encrypt_keys;   /* crypt.c, or NULL */
    ngx_uint_t                       methods;
    ngx_flag_t                       required;
    ngx_msec_t                       ttl;
    ngx_msec_t                       lock_ttl;
    ngx_msec_t                       wait;
    ngx_array_t                     *store_status;   /* ngx_uint_t */
    size_t                           store_max_size;
    ngx_array_t                     *hide_headers;   /* ngx_str_t */
    ngx_array_t                     *pass_headers;   /* ngx_str_t */
    ngx_uint_t                       metrics_zone;   /* id, metrics.c */
    ngx_uint_t                       on_redis_error;
    ngx_str_t                        problem_base_uri;
    ngx_flag_t                       dry_run;
    ngx_uint_t                       on_unknown;

    /* reply.c: what the client libraries read in the module's answers */
    ngx_flag_t                       problem_error_member;
    ngx_flag_t                       retry_hints;
    ngx_flag_t                       expires_header;
    ngx_uint_t                       admin;      /* idempotency_admin */
    ngx_msec_t                       fresh_detect;   /* 0: off */

    /* wait.c: WAIT (WAITAOF with aof) after a claim and a store */
    ngx_uint_t                       redis_wait;     /* 0 and !aof: off */
    ngx_uint_t                       redis_wait_aof; /* unsigned:1 */
    ngx_msec_t                       redis_wait_timeout;

    /* the TLS of the Redis connection, applied to conf->redis */
    ngx_flag_t                       tls_verify;
    ngx_str_t                        tls_trusted_certificate;
    ngx_str_t                        tls_name;
    ngx_str_t                        tls_certificate;
    ngx_str_t                        tls_certificate_key;

    /* for the nginx -t warnings */
    ngx_str_t                        conf_file;  /* where the block starts */
    ngx_uint_t                       conf_line;
    ngx_uint_t                       redis_default;  /* unsigned:1 */
} ngx_http_idempotency_loc_conf_t;


/* a decoded record; pointers refer to a copy in r->pool */
typedef struct {
    ngx_uint_t                       state;
    u_char                          *fingerprint;
    u_char                          *token;
    ngx_uint_t                       status;
    ngx_uint_t                       nheaders;
    u_char                          *headers;
    u_char                          *headers_end;
    u_char                          *body;
    size_t                           body_len;
    ngx_uint_t                       ntrailers;
    u_char                          *trailers;   /* up to the record's end */
} ngx_http_idempotency_record_t;


/* the captured response of the owner */
typedef struct {
    u_char                          *start;      /* the record being built */
    u_char                          *last;
    u_char                          *end;
    ngx_chain_t                     *chunks;     /* body of unknown length */
    ngx_chain_t                    **chunks_last;
    ngx_buf_t                       *tail;
    size_t                           body_len;
    off_t                            expected;   /* Content-Length or -1 */
} ngx_http_idempotency_capture_t;


struct ngx_http_idempotency_ctx_s {
    ngx_http_request_t              *request;
    ngx_http_idempotency_loc_conf_t *conf;
    ngx_http_idempotency_redis_t    *redis;
    ngx_http_idempotency_op_t       *op;
    ngx_http_idempotency_op_t       *wait_op;    /* sent behind the claim */

    ngx_uint_t                       state;
    ngx_uint_t                       go;
    ngx_uint_t                       claim_mode;
    ngx_uint_t                       status;     /* $idempotency_status */

    EVP_MD_CTX                      *md;
    ngx_str_t                        rkey;
    ngx_str_t                        request_line;   /* for logs */
    u_char                           claim[NGX_HTTP_IDEMPOTENCY_HEAD_LEN];

    ngx_event_t                      timeout;
    ngx_event_handler_pt             read_handler;   /* the connection's */
    ngx_event_handler_pt             write_handler;
    ngx_msec_t                       wait_until;
    ngx_msec_t                       poll_delay;
    void                            *notify;     /* notify.c: a waiter */
    ngx_uint_t                       notify_epoch;   /* of the last claim */

    /* lease.c: the owner's renewals */
    ngx_event_t                      lease;
    ngx_msec_t                       lease_end;  /* as Redis holds it */
    ngx_http_idempotency_op_t       *renew_op;

    /* outcome.c: upstream attempts before the claim are not the owner's */
    ngx_uint_t                       states_from;

    /* an unknown outcome read, and the record to take over under forward */
    ngx_uint_t                       unknown_status;
    ngx_uint_t                       takes;
    uint64_t                         sent_at;    /* epoch ms, the last claim */
    u_char                           seen[NGX_HTTP_IDEMPOTENCY_HEAD_LEN];

    ngx_http_idempotency_record_t    record;
    ngx_http_idempotency_capture_t   capture;

    unsigned                         owner:1;
    unsigned                         hashing:1;
    unsigned                         capturing:1;
    unsigned                         finished:1;
    unsigned                         header_seen:1;
    unsigned                         gone:1;     /* the client went away */
    unsigned                         expired:1;  /* seen: a dead owner's */
    unsigned                         previous_unknown:1;
    unsigned                         took_over:1;    /* forward: never free */

    /* fresh.c: the same request under another key */
    ngx_str_t                        scope;
    ngx_http_idempotency_op_t       *fresh_op;
    u_char                           fresh_other[NGX_HTTP_IDEMPOTENCY_HEX_LEN];
    unsigned                         fresh_sent:1;
    unsigned                         fresh_seen:1;
    unsigned                         fresh_reported:1;
};


typedef void (*ngx_http_idempotency_reply_pt)(ngx_http_idempotency_op_t *op,
    redisReply *reply);


/* a store, an unknown outcome or a release: what finish_key() sends */
typedef struct {
    ngx_str_t                        rkey;
    u_char                          *claim;
    u_char                          *value;      /* NULL: release */
    size_t                           len;
    ngx_msec_t                       ttl;
    ngx_msec_t                       lease_end;  /* sent again until then */
    ngx_str_t                       *info;       /* for the log, or NULL */
    unsigned                         orphan:1;   /* a lost claim's release */
} ngx_http_idempotency_finish_t;


/* hiredis privdata: lives outside r->pool so late replies are harmless */
struct ngx_http_idempotency_op_s {
    ngx_http_idempotency_op_t       *next;       /* free list */
    ngx_http_idempotency_redis_t    *redis;
    ngx_http_request_t              *request;    /* NULL once detached */
    ngx_http_idempotency_ctx_t      *ctx;
    void                            *data;       /* another caller's */
    ngx_http_idempotency_reply_pt    handler;
    ngx_http_idempotency_node_t     *node;       /* sent on */
    size_t                           rkey_len;
    unsigned                         store:1;
    unsigned                         resend:1;   /* safe to send twice */
    unsigned                         resent:1;
    unsigned                         orphan:1;   /* a lost claim's release */
    unsigned                         rechecked:1;    /* ...sent once more */
    unsigned                         release_lost:1; /* claim: if lost */
    unsigned                         cause:2;    /* finish: unknown, why */

    /* retry.c: a finish is sent again until acknowledged or until then */
    ngx_msec_t                       lease_end;
    ngx_msec_t                       retry_backoff;

    /* a take whose reply is lost: its unknown outcome's ttl (forward) */
    ngx_msec_t                       ttl;
    unsigned                         forward:1;
    u_char                           rkey[NGX_HTTP_IDEMPOTENCY_RKEY_MAX];
    u_char                           claim[NGX_HTTP_IDEMPOTENCY_HEAD_LEN];
    size_t                           info_len;
    u_char                           info[NGX_HTTP_IDEMPOTENCY_INFO_LEN];

    /* metrics.c: when the claim was sent, where the store is counted */
    uint64_t                         sent;
    ngx_uint_t                       zone;
    unsigned                         too_large:1;

    /* redis.c: the command as sent, when resend is set */
    size_t                           cmd_len;
    u_char                           cmd[NGX_HTTP_IDEMPOTENCY_RESEND_MAX];

    /* wait.c: the acknowledgements asked for; set by wait.c alone */
    ngx_uint_t                       replicas;
    unsigned                         won:1;      /* the claim it follows */
    unsigned                         aof:1;      /* WAITAOF */
    /* cluster.c: the command, owned by the op until its reply */
    u_char                          *buf;
    size_t                           buf_len;
    ngx_msec_t                       deadline;
    ngx_msec_t                       retry_at;
    ngx_msec_t                       backoff;
    ngx_uint_t                       redirects;
    unsigned                         asking:1;   /* sent after ASKING */

    /*
     * filter.c: a store or release keeps its command in buf; redis.c sends
     * it again once after a lost connection (again), and by EVAL after a
     * NOSCRIPT (sha)
     */
    unsigned                         again:1;
    unsigned                         sha:1;
};


extern ngx_module_t  ngx_http_idempotency_module;

extern ngx_http_output_header_filter_pt  ngx_http_idempotency_next_header;
extern ngx_http_output_body_filter_pt    ngx_http_idempotency_next_body;
extern ngx_http_request_body_filter_pt   ngx_http_idempotency_next_request_body;


/* module.c */
extern ngx_str_t  ngx_http_idempotency_status_names[];   /* by status */
ngx_uint_t ngx_http_idempotency_store_header(void *data, ngx_str_t *lowcase);
ngx_uint_t ngx_http_idempotency_store_status_ok(
    ngx_http_idempotency_loc_conf_t *conf, ngx_uint_t status);

/* handler.c */
ngx_int_t ngx_http_idempotency_handler(ngx_http_request_t *r);
ngx_http_idempotency_ctx_t *ngx_http_idempotency_get_ctx(
    ngx_http_request_t *r);
void ngx_http_idempotency_wake(ngx_http_request_t *r);
void ngx_http_idempotency_release_orphan(ngx_http_idempotency_op_t *op);

/* reply.c */
ngx_int_t ngx_http_idempotency_send_problem(ngx_http_request_t *r,
    ngx_http_idempotency_loc_conf_t *conf, ngx_uint_t problem,
    ngx_uint_t status);
ngx_int_t ngx_http_idempotency_send_replay(ngx_http_request_t *r,
    ngx_http_idempotency_loc_conf_t *conf, ngx_http_idempotency_record_t *rec);

/* key.c */
ngx_int_t ngx_http_idempotency_parse_key(ngx_str_t *in, ngx_str_t *out,
    size_t max);

/* hash.c */
ngx_int_t ngx_http_idempotency_hash_init(ngx_cycle_t *cycle);
void ngx_http_idempotency_hash_done(void);
ngx_int_t ngx_http_idempotency_record_key(ngx_http_request_t *r,
    ngx_http_idempotency_ctx_t *ctx, ngx_str_t *key);
ngx_int_t ngx_http_idempotency_key_name(ngx_http_request_t *r,
    ngx_http_idempotency_ctx_t *ctx, ngx_str_t *scope, ngx_str_t *key);
ngx_int_t ngx_http_idempotency_request_hash(ngx_http_idempotency_ctx_t *ctx,
    u_char *hash);
ngx_int_t ngx_http_idempotency_fingerprint_start(ngx_http_request_t *r,
    ngx_http_idempotency_ctx_t *ctx);
ngx_int_t ngx_http_idempotency_fingerprint_update(
    ngx_http_idempotency_ctx_t *ctx, ngx_chain_t *in);
ngx_int_t ngx_http_idempotency_fingerprint_finish(
    ngx_http_idempotency_ctx_t *ctx);
void ngx_http_idempotency_fingerprint_free(ngx_http_idempotency_ctx_t *ctx);
void ngx_http_idempotency_new_token(u_char *token);
ngx_int_t ngx_http_idempotency_request_body_filter(ngx_http_request_t *r,
    ngx_chain_t *in);

/* record.c */
ngx_int_t ngx_http_idempotency_record_decode(u_char *data, size_t len,
    ngx_http_idempotency_record_t *rec);
ngx_int_t ngx_http_idempotency_record_decode_plain(u_char *head, u_char *p,
    size_t len, ngx_http_idempotency_record_t *rec);
ngx_int_t ngx_http_idempotency_record_header(ngx_http_request_t *r,
    ngx_http_idempotency_loc_conf_t *conf, ngx_http_idempotency_capture_t *cap,
    u_char *head);
void ngx_http_idempotency_record_set_body_len(
    ngx_http_idempotency_capture_t *cap, u_char *body);
u_char *ngx_http_idempotency_record_next_header(u_char *p, ngx_str_t *name,
    ngx_str_t *value);
void ngx_http_idempotency_record_tombstone(u_char *buf, u_char *head,
    ngx_uint_t status);
void ngx_http_idempotency_content_type(ngx_str_t *value, size_t *type_len,
    ngx_str_t *charset);
size_t ngx_http_idempotency_record_trailers_size(ngx_http_request_t *r,
    ngx_http_idempotency_loc_conf_t *conf);
void ngx_http_idempotency_record_add_trailers(ngx_http_request_t *r,
    ngx_http_idempotency_loc_conf_t *conf, u_char *rec, u_char *p);

/* filter.c */
ngx_int_t ngx_http_idempotency_header_filter(ngx_http_request_t *r);
ngx_int_t ngx_http_idempotency_body_filter(ngx_http_request_t *r,
    ngx_chain_t *in);
void ngx_http_idempotency_finish(ngx_http_idempotency_ctx_t *ctx,
    u_char *value, size_t len, ngx_msec_t ttl, ngx_log_t *log);
void ngx_http_idempotency_release(ngx_http_request_t *r,
    ngx_http_idempotency_ctx_t *ctx);
void ngx_http_idempotency_finish_key(ngx_http_idempotency_redis_t *redis,
    ngx_http_idempotency_finish_t *f, ngx_log_t *log);

/* retry.c: finishes sent again until acknowledged or their lease ends */
ngx_int_t ngx_http_idempotency_finish_retry(ngx_http_idempotency_op_t *op,
    redisReply *reply);
ngx_int_t ngx_http_idempotency_retry_command(ngx_http_idempotency_op_t *op,
    int argc, const char **argv, const size_t *argvlen);
void ngx_http_idempotency_retry_exit(void);
u_char *ngx_http_idempotency_request_info(ngx_http_idempotency_ctx_t *ctx,
    u_char *buf);

/* the 64 hex digits between the braces of the record key */
#define ngx_http_idempotency_key_hash(ctx)                                    \
    ((ctx)->rkey.data + (ctx)->rkey.len - 1                                   \
     - 2 * NGX_HTTP_IDEMPOTENCY_HASH_LEN)

/* redis.c */
ngx_int_t ngx_http_idempotency_redis_init(ngx_cycle_t *cycle,
    ngx_http_idempotency_redis_t *redis);
void ngx_http_idempotency_redis_exit(ngx_http_idempotency_redis_t *redis);
ngx_http_idempotency_op_t *ngx_http_idempotency_op_alloc(
    ngx_http_idempotency_redis_t *redis);
void ngx_http_idempotency_op_free(ngx_http_idempotency_op_t *op);
ngx_int_t ngx_http_idempotency_redis_command(ngx_http_idempotency_op_t *op,
    int argc, const char **argv, const size_t *argvlen);
void ngx_http_idempotency_redis_reset(ngx_http_idempotency_redis_t *redis);
void ngx_http_idempotency_redis_load_script(
    ngx_http_idempotency_redis_t *redis);
void ngx_http_idempotency_ops_done(void);
ngx_int_t ngx_http_idempotency_node_reply(ngx_http_idempotency_node_t *node,
    redisReply *reply);
void ngx_http_idempotency_node_closed(ngx_http_idempotency_node_t *node);
ngx_int_t ngx_http_idempotency_node_command(ngx_http_idempotency_node_t *node,
    ngx_http_idempotency_op_t *op, int argc, const char **argv,
    const size_t *argvlen);

/* sentinel.c: the master of a Redis Sentinel setup */
ngx_http_idempotency_redis_t *ngx_http_idempotency_sentinel_conf(
    ngx_conf_t *cf, ngx_str_t *args, ngx_uint_t naddrs, ngx_uint_t nargs,
    ngx_uint_t db, ngx_str_t *user, ngx_str_t *password, ngx_uint_t tls);
ngx_int_t ngx_http_idempotency_sentinel_init(ngx_cycle_t *cycle,
    ngx_http_idempotency_redis_t *redis);
void ngx_http_idempotency_sentinel_exit(ngx_http_idempotency_redis_t *redis);
ngx_int_t ngx_http_idempotency_sentinel_handshake(
    ngx_http_idempotency_node_t *node);
ngx_int_t ngx_http_idempotency_sentinel_reply(
    ngx_http_idempotency_node_t *node, redisReply *reply);
void ngx_http_idempotency_sentinel_closed(ngx_http_idempotency_node_t *node);
void ngx_http_idempotency_sentinel_tls(ngx_http_idempotency_redis_t *redis);
ngx_str_t *ngx_http_idempotency_sentinel_tls_name(
    ngx_http_idempotency_node_t *node);
void ngx_http_idempotency_node_init(ngx_http_idempotency_node_t *node,
    ngx_http_idempotency_redis_t *redis, ngx_log_t *log);
void ngx_http_idempotency_redis_connect(ngx_http_idempotency_node_t *node);
void ngx_http_idempotency_node_load_script(
    ngx_http_idempotency_node_t *node);
void ngx_http_idempotency_node_queue(ngx_http_idempotency_node_t *node,
    ngx_http_idempotency_op_t *op);
size_t ngx_http_idempotency_format_len(int argc, const size_t *argvlen);
u_char *ngx_http_idempotency_decimal(u_char *p, size_t n);
u_char *ngx_http_idempotency_format(u_char *p, int argc, const char **argv,
    const size_t *argvlen);

/* cluster.c: slot map and routing for "idempotency_redis ... cluster" */
ngx_int_t ngx_http_idempotency_conf_addrs(ngx_conf_t *cf, ngx_str_t *addr,
    in_port_t port, const char *what, ngx_array_t *addrs);
ngx_int_t ngx_http_idempotency_cluster_conf(ngx_conf_t *cf,
    ngx_http_idempotency_redis_t *redis, ngx_str_t *addrs, ngx_uint_t n);
ngx_int_t ngx_http_idempotency_cluster_init(ngx_cycle_t *cycle,
    ngx_http_idempotency_redis_t *redis);
ngx_int_t ngx_http_idempotency_cluster_conf_seeds(ngx_conf_t *cf,
    ngx_http_idempotency_redis_t *redis);
void ngx_http_idempotency_cluster_exit(ngx_http_idempotency_redis_t *redis);
ngx_int_t ngx_http_idempotency_cluster_command(ngx_http_idempotency_op_t *op,
    int argc, const char **argv, const size_t *argvlen);
ngx_int_t ngx_http_idempotency_cluster_reply(ngx_http_idempotency_node_t *node,
    ngx_http_idempotency_op_t *op, redisReply *reply);
ngx_int_t ngx_http_idempotency_cluster_lost(ngx_http_idempotency_node_t *node,
    ngx_http_idempotency_op_t *op);
ngx_uint_t ngx_http_idempotency_cluster_closed(
    ngx_http_idempotency_node_t *node);
void ngx_http_idempotency_cluster_load_script(
    ngx_http_idempotency_redis_t *redis);
void ngx_http_idempotency_cluster_up(ngx_http_idempotency_node_t *node);
uint16_t ngx_http_idempotency_cluster_slot(u_char *key, size_t len);
ngx_http_idempotency_node_t *ngx_http_idempotency_cluster_master(
    ngx_http_idempotency_redis_t *redis, ngx_uint_t slot);
void ngx_http_idempotency_cluster_moved(ngx_http_idempotency_node_t *from,
    u_char *p, size_t len);

/* conn.c: one connection, its bytes and its replies */
ngx_int_t ngx_http_idempotency_conn_conf(ngx_conf_t *cf,
    ngx_http_idempotency_redis_t *redis);
ngx_int_t ngx_http_idempotency_conn_open(ngx_http_idempotency_node_t *node);
void ngx_http_idempotency_conn_start(ngx_http_idempotency_node_t *node);
void ngx_http_idempotency_conn_ready(ngx_http_idempotency_node_t *node);
void ngx_http_idempotency_conn_fail(ngx_http_idempotency_node_t *node,
    ngx_err_t err, const char *what);
void ngx_http_idempotency_conn_close(ngx_http_idempotency_node_t *node);
void ngx_http_idempotency_conn_flush(ngx_http_idempotency_node_t *node);
u_char *ngx_http_idempotency_conn_reserve(ngx_http_idempotency_node_t *node,
    size_t len);
ngx_int_t ngx_http_idempotency_conn_write_now(
    ngx_http_idempotency_node_t *node, u_char *buf, size_t len);
void ngx_http_idempotency_conn_free(ngx_http_idempotency_node_t *node);

/* input.c: received bytes into replies */
u_char *ngx_http_idempotency_input_buf(ngx_http_idempotency_node_t *node,
    size_t *size);
ngx_int_t ngx_http_idempotency_input(ngx_http_idempotency_node_t *node,
    size_t n);
void ngx_http_idempotency_input_reset(ngx_http_idempotency_node_t *node);

/* tls.c */
char *ngx_http_idempotency_tls_merge(ngx_conf_t *cf,
    ngx_http_idempotency_loc_conf_t *conf);
ngx_uint_t ngx_http_idempotency_is_ip(ngx_str_t *host);
#if (NGX_HTTP_SSL)
void ngx_http_idempotency_tls_start(ngx_http_idempotency_node_t *node);
#endif

/* fresh.c: a new key per attempt */
char *ngx_http_idempotency_fresh_key_detect(ngx_conf_t *cf,
    ngx_command_t *cmd, void *conf);
void ngx_http_idempotency_fresh_send(ngx_http_request_t *r,
    ngx_http_idempotency_ctx_t *ctx);
void ngx_http_idempotency_fresh_report(ngx_http_request_t *r,
    ngx_http_idempotency_ctx_t *ctx);
void ngx_http_idempotency_fresh_detach(ngx_http_idempotency_ctx_t *ctx);

/* admin.c: the operator's view of one key */
char *ngx_http_idempotency_admin(ngx_conf_t *cf, ngx_command_t *cmd,
    void *conf);

/* secret.c: keyed record names */
char *ngx_http_idempotency_key_secret(ngx_conf_t *cf, ngx_command_t *cmd,
    void *conf);
ngx_int_t ngx_http_idempotency_secret_hash(ngx_http_idempotency_secret_t *s,
    EVP_MD_CTX *md, ngx_str_t *scope, ngx_str_t *key, u_char *hash);
ssize_t ngx_http_idempotency_secret_read(ngx_conf_t *cf,
    ngx_str_t *directive, ngx_str_t *name, u_char *buf, size_t size);

/* crypt.c: completed records sealed with AES-256-GCM */
char *ngx_http_idempotency_encrypt_key(ngx_conf_t *cf, ngx_command_t *cmd,
    void *conf);
size_t ngx_http_idempotency_crypt_room(ngx_array_t *keys);
ngx_int_t ngx_http_idempotency_crypt_seal(ngx_array_t *keys, ngx_str_t *rkey,
    u_char *rec, size_t *len);
ngx_int_t ngx_http_idempotency_crypt_open(ngx_array_t *keys, ngx_log_t *log,
    ngx_str_t *rkey, u_char *data, size_t len,
    ngx_http_idempotency_record_t *rec);

/* lease.c: the owner's lease inside its claim */
extern ngx_str_t  ngx_http_idempotency_renew_script;
uint64_t ngx_http_idempotency_epoch_msec(void);
void ngx_http_idempotency_lease_set(u_char *claim, ngx_msec_t lock_ttl);
void ngx_http_idempotency_lease_unknown(u_char *buf, u_char *claim,
    ngx_uint_t status, ngx_uint_t cause);
ngx_uint_t ngx_http_idempotency_lease_read(u_char *head, ngx_uint_t *status,
    uint64_t at, ngx_msec_t margin);
uint64_t ngx_http_idempotency_lease_deadline(u_char *head);
void ngx_http_idempotency_lease_start(ngx_http_request_t *r,
    ngx_http_idempotency_ctx_t *ctx);
void ngx_http_idempotency_lease_stop(ngx_http_idempotency_ctx_t *ctx);

/* outcome.c: what is known of the owner's execution */
void ngx_http_idempotency_outcome_start(ngx_http_request_t *r,
    ngx_http_idempotency_ctx_t *ctx);
ngx_uint_t ngx_http_idempotency_outcome(ngx_http_request_t *r,
    ngx_http_idempotency_ctx_t *ctx, ngx_uint_t *status);
void ngx_http_idempotency_unknown(ngx_http_request_t *r,
    ngx_http_idempotency_ctx_t *ctx, ngx_uint_t status);
void ngx_http_idempotency_give_up(ngx_http_request_t *r,
    ngx_http_idempotency_ctx_t *ctx);

/* abort.c */
void ngx_http_idempotency_keep_upstream(ngx_http_request_t *r,
    ngx_http_idempotency_ctx_t *ctx);
void ngx_http_idempotency_keep_done(ngx_http_request_t *r,
    ngx_http_idempotency_ctx_t *ctx);
ngx_uint_t ngx_http_idempotency_client_gone(ngx_http_request_t *r,
    ngx_http_idempotency_ctx_t *ctx);

/* version.c */
ngx_int_t ngx_http_idempotency_init_module(ngx_cycle_t *cycle);

/* metrics.c */
char *ngx_http_idempotency_metrics(ngx_conf_t *cf, ngx_command_t *cmd,
    void *conf);
char *ngx_http_idempotency_metrics_zone(ngx_conf_t *cf, ngx_command_t *cmd,
    void *conf);
ngx_int_t ngx_http_idempotency_metrics_init(ngx_conf_t *cf);
void ngx_http_idempotency_metrics_claim_sent(ngx_http_idempotency_op_t *op,
    ngx_http_idempotency_ctx_t *ctx);
void ngx_http_idempotency_metrics_claim_done(ngx_http_idempotency_op_t *op,
    redisReply *reply);
void ngx_http_idempotency_metrics_attribute(ngx_uint_t zone);
void ngx_http_idempotency_metrics_store_sent(ngx_http_idempotency_op_t *op,
    u_char *value);
void ngx_http_idempotency_metrics_store_failed(void);
void ngx_http_idempotency_metrics_store_done(ngx_http_idempotency_op_t *op,
    redisReply *reply);
void ngx_http_idempotency_metrics_unknown(ngx_uint_t cause);
void ngx_http_idempotency_metrics_fresh_key(void);
void ngx_http_idempotency_metrics_redis_up(
    ngx_http_idempotency_redis_t *redis);
void ngx_http_idempotency_metrics_redis_down(
    ngx_http_idempotency_redis_t *redis);
void *ngx_http_idempotency_metrics_master_add(
    ngx_http_idempotency_redis_t *redis, ngx_str_t *name);
void ngx_http_idempotency_metrics_master_del(void *entry);
void ngx_http_idempotency_metrics_master_up(void *entry, ngx_uint_t up);

/* wait.c: WAIT or WAITAOF, replicas acknowledge a claim or a store */
char *ngx_http_idempotency_redis_wait(ngx_conf_t *cf, ngx_command_t *cmd,
    void *conf);
char *ngx_http_idempotency_wait_merge(ngx_conf_t *cf,
    ngx_http_idempotency_loc_conf_t *prev,
    ngx_http_idempotency_loc_conf_t *conf);
void ngx_http_idempotency_wait_send(ngx_http_request_t *r,
    ngx_http_idempotency_ctx_t *ctx);
ngx_int_t ngx_http_idempotency_wait_hold(ngx_http_request_t *r,
    ngx_http_idempotency_ctx_t *ctx, redisReply *reply);
void ngx_http_idempotency_wait_timedout(ngx_http_request_t *r,
    ngx_http_idempotency_ctx_t *ctx);
void ngx_http_idempotency_wait_detach(ngx_http_idempotency_ctx_t *ctx);
void ngx_http_idempotency_wait_store(ngx_http_idempotency_ctx_t *ctx,
    ngx_str_t *info);

/* notify.c: waiting duplicates woken by the finish script's SPUBLISH */
extern ngx_uint_t  ngx_http_idempotency_notify_epoch;
ngx_int_t ngx_http_idempotency_notify_watch(ngx_http_idempotency_ctx_t *ctx,
    ngx_msec_t *delay);
void ngx_http_idempotency_notify_unwatch(ngx_http_idempotency_ctx_t *ctx);
ngx_int_t ngx_http_idempotency_notify_reply(ngx_http_idempotency_node_t *node,
    redisReply *reply);
void ngx_http_idempotency_notify_up(ngx_http_idempotency_node_t *node);
ngx_uint_t ngx_http_idempotency_notify_closed(
    ngx_http_idempotency_node_t *node);
void ngx_http_idempotency_notify_exit(ngx_http_idempotency_redis_t *redis);

/* script.c: the Lua that makes claim and finish atomic */
extern ngx_str_t  ngx_http_idempotency_claim_script;
extern ngx_str_t  ngx_http_idempotency_finish_script;
extern ngx_str_t  ngx_http_idempotency_take_script;
extern u_char     ngx_http_idempotency_claim_sha[41];
extern u_char     ngx_http_idempotency_finish_sha[41];
ngx_int_t ngx_http_idempotency_script_init(void);


#endif /* _NGX_HTTP_IDEMPOTENCY_MODULE_H_INCLUDED_ */
