
/*
 * Copyright (C) The ngx_http_idempotency_module authors
 */


#ifndef _NGX_HTTP_IDEMPOTENCY_HTTP_H_INCLUDED_
#define _NGX_HTTP_IDEMPOTENCY_HTTP_H_INCLUDED_


#include <ngx_config.h>
#include <ngx_core.h>
#include <ngx_http.h>

#include "ngx_http_idempotency_store.h"
#include "ngx_http_idempotency_json.h"


/* what the owner's upstream did (outcome.c) */
#define NGX_HTTP_IDEMPOTENCY_OUT_NONE       0   /* no upstream: own answer */
#define NGX_HTTP_IDEMPOTENCY_OUT_NOT_SENT   1   /* never reached: nothing ran */
#define NGX_HTTP_IDEMPOTENCY_OUT_SENT       2   /* may have run, no header */
#define NGX_HTTP_IDEMPOTENCY_OUT_ANSWERED   3   /* a response header came */

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


/*
 * request state machine, see docs/design.md; no code sets INIT: it is the
 * state of a ctx as allocated (zeroed), so that 0 never means a body read
 */
typedef enum {
    NGX_HTTP_IDEMPOTENCY_ST_INIT = 0,
    NGX_HTTP_IDEMPOTENCY_ST_READING_BODY,
    NGX_HTTP_IDEMPOTENCY_ST_BODY_DONE,
    NGX_HTTP_IDEMPOTENCY_ST_WAITING_REDIS,
    NGX_HTTP_IDEMPOTENCY_ST_DECIDED,
    NGX_HTTP_IDEMPOTENCY_ST_DONE
} ngx_http_idempotency_state_e;


#define NGX_HTTP_IDEMPOTENCY_ON_ERROR_REJECT  0
#define NGX_HTTP_IDEMPOTENCY_ON_ERROR_PASS    1


typedef enum {
    NGX_HTTP_IDEMPOTENCY_PROBLEM_MISSING = 0,
    NGX_HTTP_IDEMPOTENCY_PROBLEM_INVALID,
    NGX_HTTP_IDEMPOTENCY_PROBLEM_CONFLICT,
    NGX_HTTP_IDEMPOTENCY_PROBLEM_TOO_LARGE,
    NGX_HTTP_IDEMPOTENCY_PROBLEM_MISMATCH,
    NGX_HTTP_IDEMPOTENCY_PROBLEM_UNAVAILABLE,
    NGX_HTTP_IDEMPOTENCY_PROBLEM_UNKNOWN
} ngx_http_idempotency_problem_e;


/* idempotency_key_pattern: compiled once (conf.c), shown in the detail */
typedef struct {
#if (NGX_PCRE)
    ngx_regex_t                     *regex;
#endif
    ngx_str_t                        text;
} ngx_http_idempotency_key_pattern_t;


/* an RFC 9457 problem: the status, the code (also the type's fragment) */
typedef struct {
    ngx_uint_t                       status;
    ngx_str_t                        name;
    ngx_str_t                        title;
    ngx_str_t                        detail;
} ngx_http_idempotency_problem_t;


typedef struct ngx_http_idempotency_ctx_s    ngx_http_idempotency_ctx_t;


typedef struct {
    ngx_array_t                      servers;    /* redis_t * */
    ngx_http_idempotency_target_t   *default_server;

    void                            *metrics;    /* metrics.c */

    /*
     * some location waits for keys in progress (idempotency_wait): only
     * then do finishes publish the key's wake-up
     */
    unsigned                         wakeups:1;
} ngx_http_idempotency_main_conf_t;


typedef struct {
    ngx_flag_t                       enable;
    ngx_http_idempotency_target_t   *redis;
    ngx_msec_t                       redis_timeout;
    ngx_str_t                        prefix;
    ngx_http_complex_value_t        *key;        /* NULL: the header */
    size_t                           key_max_length;
    ngx_http_idempotency_key_pattern_t  *key_pattern;   /* NULL: any */
    ngx_http_idempotency_json_pointer_t *json_pointer;  /* NULL: header */
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
    ngx_flag_t                       store_immediate;
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
    ngx_uint_t                       admin;      /* 1, 2: allow_remote */
    ngx_msec_t                       fresh_detect;   /* 0: off */

    /* WAIT (WAITAOF with aof) after a claim and a store */
    ngx_uint_t                       redis_wait;     /* 0 and !aof: off */
    ngx_uint_t                       redis_wait_aof; /* unsigned:1 */
    ngx_msec_t                       redis_wait_timeout;
    ngx_str_t                        redis_wait_file;  /* for merge errors */
    ngx_uint_t                       redis_wait_line;

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

    /* what the location's claims are, from the above (conf.c) */
    ngx_http_idempotency_claim_conf_t  claim;
} ngx_http_idempotency_loc_conf_t;


struct ngx_http_idempotency_ctx_s {
    ngx_http_request_t              *request;
    ngx_http_idempotency_loc_conf_t *conf;
    ngx_http_idempotency_target_t   *redis;
    ngx_http_idempotency_claim_t    *claim;      /* the store's */

    ngx_uint_t                       state;
    ngx_uint_t                       decision;   /* the claim's answer */
    ngx_uint_t                       status;     /* $idempotency_status */

    EVP_MD_CTX                      *md;
    u_char                           fingerprint[
                                         NGX_HTTP_IDEMPOTENCY_HASH_LEN];
    ngx_http_idempotency_json_t     *json;       /* the key in the body */
    ngx_str_t                        rkey;
    ngx_str_t                        request_line;   /* for logs */

    ngx_event_handler_pt             read_handler;   /* the connection's */
    ngx_event_handler_pt             write_handler;

    /* outcome.c: upstream attempts before the claim are not the owner's */
    ngx_uint_t                       states_from;

    /* filter.c: the outcome-unknown problem in place of nginx's own page */
    ngx_str_t                        problem;

    ngx_http_idempotency_builder_t   capture;    /* the owner's response */

    unsigned                         owner:1;
    unsigned                         hashing:1;
    unsigned                         capturing:1;
    unsigned                         header_seen:1;
    unsigned                         gone:1;     /* the client went away */
    unsigned                         internal:1; /* r->internal at start */

    /* fresh.c: the same request under another key */
    ngx_str_t                        scope;
    ngx_http_idempotency_op_t       *fresh_op;
    u_char                           fresh_other[NGX_HTTP_IDEMPOTENCY_HEX_LEN];
    unsigned                         fresh_sent:1;
    unsigned                         fresh_seen:1;
    unsigned                         fresh_reported:1;
};


extern ngx_module_t  ngx_http_idempotency_module;

extern ngx_http_output_header_filter_pt  ngx_http_idempotency_next_header;
extern ngx_http_output_body_filter_pt    ngx_http_idempotency_next_body;
extern ngx_http_request_body_filter_pt   ngx_http_idempotency_next_request_body;


/* the 64 hex digits between the braces of the record key */
#define ngx_http_idempotency_key_hash(ctx)                                    \
    ngx_http_idempotency_rkey_hash(&(ctx)->rkey)

/* capture.c: the owner's response into a record */
ngx_uint_t ngx_http_idempotency_store_header(void *data, ngx_str_t *lowcase);
ngx_int_t ngx_http_idempotency_capture_header(ngx_http_request_t *r,
    ngx_http_idempotency_loc_conf_t *conf, ngx_http_idempotency_builder_t *bd,
    u_char *head);
void ngx_http_idempotency_content_type(ngx_str_t *value, size_t *type_len,
    ngx_str_t *charset);
ngx_int_t ngx_http_idempotency_capture_trailers(ngx_http_request_t *r,
    ngx_http_idempotency_loc_conf_t *conf, ngx_http_idempotency_builder_t *bd);

/* ctx.c: the request's ctx */
extern ngx_str_t  ngx_http_idempotency_status_names[];   /* by status */
ngx_http_idempotency_ctx_t *ngx_http_idempotency_get_ctx(
    ngx_http_request_t *r);
void ngx_http_idempotency_abandon(ngx_http_idempotency_ctx_t *ctx);
void ngx_http_idempotency_cleanup(void *data);
u_char *ngx_http_idempotency_request_info(ngx_http_idempotency_ctx_t *ctx,
    u_char *buf);

/* handler.c */
ngx_int_t ngx_http_idempotency_handler(ngx_http_request_t *r);
void ngx_http_idempotency_wake(ngx_http_request_t *r);
ngx_uint_t ngx_http_idempotency_header_lines(ngx_list_t *headers,
    ngx_str_t *name, ngx_table_elt_t **last);

/*
 * A stored response with one of these statuses is final: its retries are
 * replayed the same answer, so clients are told not to retry in vain
 */
#define ngx_http_idempotency_status_final(status)                           \
    ((status) == NGX_HTTP_CONFLICT || (status) == 429                        \
     || (status) >= NGX_HTTP_INTERNAL_SERVER_ERROR)

/* reply.c */
ngx_int_t ngx_http_idempotency_reject(ngx_http_request_t *r,
    ngx_http_idempotency_ctx_t *ctx, ngx_uint_t status, ngx_uint_t problem);
ngx_int_t ngx_http_idempotency_reject_detail(ngx_http_request_t *r,
    ngx_http_idempotency_ctx_t *ctx, ngx_uint_t status, ngx_uint_t problem,
    ngx_str_t *detail);
ngx_int_t ngx_http_idempotency_invalid_key(ngx_http_request_t *r,
    ngx_http_idempotency_ctx_t *ctx, ngx_int_t rc, ngx_str_t *raw,
    ngx_str_t *key);
ngx_int_t ngx_http_idempotency_key_allowed(ngx_http_request_t *r,
    ngx_http_idempotency_ctx_t *ctx, ngx_str_t *raw, ngx_str_t *key);
ngx_int_t ngx_http_idempotency_send_problem_detail(ngx_http_request_t *r,
    ngx_http_idempotency_loc_conf_t *conf, ngx_uint_t problem,
    ngx_uint_t unknown_status, ngx_str_t *detail);
ngx_int_t ngx_http_idempotency_send_problem_of(ngx_http_request_t *r,
    ngx_http_idempotency_loc_conf_t *conf, ngx_http_idempotency_problem_t *pr,
    ngx_uint_t status, ngx_str_t *type, ngx_uint_t retry);
ngx_int_t ngx_http_idempotency_problem_unknown(ngx_http_request_t *r,
    ngx_http_idempotency_loc_conf_t *conf, ngx_uint_t status, ngx_str_t *body);
ngx_int_t ngx_http_idempotency_retry_hints(ngx_http_request_t *r,
    ngx_http_idempotency_loc_conf_t *conf, ngx_uint_t retry);
ngx_int_t ngx_http_idempotency_send_replay(ngx_http_request_t *r,
    ngx_http_idempotency_loc_conf_t *conf, ngx_http_idempotency_record_t *rec);

/* key.c */
ngx_int_t ngx_http_idempotency_parse_key(ngx_str_t *in, ngx_str_t *out,
    size_t max);

/* body_key.c: the key read from the JSON body */
ngx_int_t ngx_http_idempotency_body_key_start(ngx_http_request_t *r,
    ngx_http_idempotency_ctx_t *ctx);
ngx_int_t ngx_http_idempotency_body_key_end(ngx_http_request_t *r,
    ngx_http_idempotency_ctx_t *ctx);

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
ngx_int_t ngx_http_idempotency_request_body_filter(ngx_http_request_t *r,
    ngx_chain_t *in);

/* filter.c */
ngx_int_t ngx_http_idempotency_header_filter(ngx_http_request_t *r);
ngx_int_t ngx_http_idempotency_body_filter(ngx_http_request_t *r,
    ngx_chain_t *in);

/* fresh.c: a new key per attempt */
char *ngx_http_idempotency_fresh_key_detect_directive(ngx_conf_t *cf,
    ngx_command_t *cmd, void *conf);
void ngx_http_idempotency_fresh_send(ngx_http_request_t *r,
    ngx_http_idempotency_ctx_t *ctx);
void ngx_http_idempotency_fresh_report(ngx_http_request_t *r,
    ngx_http_idempotency_ctx_t *ctx);
void ngx_http_idempotency_fresh_detach(ngx_http_idempotency_ctx_t *ctx);

/* the admin's refusals, in the order of ngx_http_idempotency_admin_problems */
typedef enum {
    NGX_HTTP_IDEMPOTENCY_ADMIN_NO_KEY = 0,
    NGX_HTTP_IDEMPOTENCY_ADMIN_BAD_HASH,
    NGX_HTTP_IDEMPOTENCY_ADMIN_BAD_KEY,
    NGX_HTTP_IDEMPOTENCY_ADMIN_REMOTE,
    NGX_HTTP_IDEMPOTENCY_ADMIN_NOT_FOUND,
    NGX_HTTP_IDEMPOTENCY_ADMIN_IN_PROGRESS,
    NGX_HTTP_IDEMPOTENCY_ADMIN_CORRUPT,
    NGX_HTTP_IDEMPOTENCY_ADMIN_UNAVAILABLE
} ngx_http_idempotency_admin_problem_e;

/* admin.c: the operator's view of one key */
extern ngx_http_idempotency_problem_t  ngx_http_idempotency_admin_problems[];
char *ngx_http_idempotency_admin_directive(ngx_conf_t *cf, ngx_command_t *cmd,
    void *conf);
char *ngx_http_idempotency_admin_merge(ngx_conf_t *cf,
    ngx_http_idempotency_loc_conf_t *conf);

/* admin_view.c: the record as JSON, the admin's answers */
ngx_int_t ngx_http_idempotency_admin_view(ngx_http_request_t *r,
    ngx_http_idempotency_loc_conf_t *conf, ngx_log_t *log, ngx_str_t *rkey,
    u_char *value, size_t vlen, long long pttl, ngx_uint_t body,
    ngx_buf_t **out);
u_char *ngx_http_idempotency_admin_time(u_char *p, uint64_t msec);
void ngx_http_idempotency_admin_answer(ngx_http_request_t *r,
    ngx_http_idempotency_loc_conf_t *conf, ngx_http_idempotency_problem_t *pr);
void ngx_http_idempotency_admin_json(ngx_http_request_t *r, ngx_int_t rc,
    ngx_buf_t *b);

/* admin_list.c: a page of the keys in a state */
ngx_int_t ngx_http_idempotency_admin_list(ngx_http_request_t *r,
    ngx_http_idempotency_loc_conf_t *conf, ngx_str_t *state);

/* outcome.c: what is known of the owner's execution */
void ngx_http_idempotency_outcome_start(ngx_http_request_t *r,
    ngx_http_idempotency_ctx_t *ctx);
ngx_uint_t ngx_http_idempotency_outcome(ngx_http_request_t *r,
    ngx_http_idempotency_ctx_t *ctx, ngx_uint_t *status);
void ngx_http_idempotency_give_up(ngx_http_request_t *r,
    ngx_http_idempotency_ctx_t *ctx);

/* abort.c */
void ngx_http_idempotency_keep_upstream(ngx_http_request_t *r,
    ngx_http_idempotency_ctx_t *ctx);
void ngx_http_idempotency_keep_done(ngx_http_request_t *r,
    ngx_http_idempotency_ctx_t *ctx);
ngx_uint_t ngx_http_idempotency_client_gone(ngx_http_request_t *r,
    ngx_http_idempotency_ctx_t *ctx);

/*
 * The metrics' shared memory zone (metrics.c), which metrics_events.c
 * counts into and metrics_render.c reads
 */

/* names per configuration (and zone=""); the table holds an old and a new */
#define NGX_HTTP_IDEMPOTENCY_METRICS_ZONES     64
#define NGX_HTTP_IDEMPOTENCY_METRICS_REDIS     64
#define NGX_HTTP_IDEMPOTENCY_METRICS_SLOTS                                    \
    (2 * (NGX_HTTP_IDEMPOTENCY_METRICS_ZONES + 1                              \
          + NGX_HTTP_IDEMPOTENCY_METRICS_REDIS))
#define NGX_HTTP_IDEMPOTENCY_METRICS_NAME_MAX  64

/* cluster masters with a series of their own, for all targets together */
#define NGX_HTTP_IDEMPOTENCY_METRICS_MASTERS   64
#define NGX_HTTP_IDEMPOTENCY_METRICS_MASTER_LEN                               \
    (NGX_SOCKADDR_STRLEN + NGX_HTTP_IDEMPOTENCY_METRICS_NAME_MAX)

/* the values of $idempotency_status, bypass to unknown */
#define NGX_HTTP_IDEMPOTENCY_METRICS_STATUSES  9
#define NGX_HTTP_IDEMPOTENCY_METRICS_RESULTS   4
#define NGX_HTTP_IDEMPOTENCY_METRICS_COUNTS                                   \
    (NGX_HTTP_IDEMPOTENCY_METRICS_STATUSES                                    \
     + NGX_HTTP_IDEMPOTENCY_METRICS_RESULTS)
#define NGX_HTTP_IDEMPOTENCY_METRICS_BUCKETS   11
#define NGX_HTTP_IDEMPOTENCY_METRICS_LE                                       \
    (NGX_HTTP_IDEMPOTENCY_METRICS_BUCKETS + 1)

/* counters of a server slot */
#define NGX_HTTP_IDEMPOTENCY_METRICS_UP        0
#define NGX_HTTP_IDEMPOTENCY_METRICS_RECONNECTS  1
#define NGX_HTTP_IDEMPOTENCY_METRICS_REFUSED   2
#define NGX_HTTP_IDEMPOTENCY_METRICS_SERVER_COUNTS  3

/* a zone slot's stores by result, counted after its requests by status */
#define NGX_HTTP_IDEMPOTENCY_STORE_STORED      0
#define NGX_HTTP_IDEMPOTENCY_STORE_TOO_LARGE   1
#define NGX_HTTP_IDEMPOTENCY_STORE_RELEASED    2
#define NGX_HTTP_IDEMPOTENCY_STORE_FAILED      3


typedef struct {
    uint32_t             kind;
    uint32_t             hash;       /* crc32 of the name */
    size_t               len;
    /* zone: requests by status, then stores by result; server: up, ... */
    ngx_atomic_t         count[NGX_HTTP_IDEMPOTENCY_METRICS_COUNTS];
} ngx_http_idempotency_metrics_slot_t;


/*
 * A cluster master in some worker's slot map: refs counts the workers that
 * have it there (a reload's old and new workers alike), and a free entry
 * has none; up is the last connection event of any worker.
 */
typedef struct {
    ngx_atomic_t         refs;
    ngx_atomic_t         up;
    uint32_t             target;     /* crc32 of the target's name */
    uint32_t             target_len;
    size_t               len;
    u_char               name[NGX_HTTP_IDEMPOTENCY_METRICS_MASTER_LEN];
} ngx_http_idempotency_metrics_master_t;


typedef struct {
    ngx_atomic_t         claims_lost;
    /* records that became unknown outcomes, by cause (1 to 3) */
    ngx_atomic_t         unknown[NGX_HTTP_IDEMPOTENCY_CAUSES];
    ngx_atomic_t         fresh_keys;
    /* claim round trips per bucket (not cumulative), the last above 1s */
    ngx_atomic_t         latency[NGX_HTTP_IDEMPOTENCY_METRICS_LE];
    ngx_atomic_t         latency_usec;
    ngx_http_idempotency_metrics_slot_t
                         slots[NGX_HTTP_IDEMPOTENCY_METRICS_SLOTS];

    /* taken by workers at run time: under the lock */
    ngx_atomic_t         masters_lock;
    ngx_http_idempotency_metrics_master_t
                         masters[NGX_HTTP_IDEMPOTENCY_METRICS_MASTERS];
} ngx_http_idempotency_metrics_shm_t;


typedef struct {
    ngx_http_idempotency_metrics_shm_t   *sh;
    ngx_http_idempotency_main_conf_t     *imcf;
    ngx_array_t                           zones;     /* ngx_str_t, by id */
    ngx_http_idempotency_metrics_slot_t **zone_slots;    /* by zone id */
    ngx_http_idempotency_metrics_slot_t **server_slots;  /* by server */
    u_char                               *server_seen;   /* per worker */
} ngx_http_idempotency_metrics_conf_t;


/* metrics.c: the shared zone, its slots, the directives */
char *ngx_http_idempotency_metrics_directive(ngx_conf_t *cf, ngx_command_t *cmd,
    void *conf);
char *ngx_http_idempotency_metrics_zone_directive(ngx_conf_t *cf,
    ngx_command_t *cmd, void *conf);
ngx_int_t ngx_http_idempotency_metrics_init(ngx_conf_t *cf);
ngx_http_idempotency_metrics_conf_t *ngx_http_idempotency_metrics_get_conf(
    void);

/* metrics_events.c: what is counted */
void ngx_http_idempotency_metrics_events_init(void);
ngx_int_t ngx_http_idempotency_metrics_log(ngx_http_request_t *r);
void ngx_http_idempotency_metrics_fresh_key(void);

/* metrics_render.c: the scrape */
ngx_int_t ngx_http_idempotency_metrics_handler(ngx_http_request_t *r);


#endif /* _NGX_HTTP_IDEMPOTENCY_HTTP_H_INCLUDED_ */
