
/*
 * Copyright (C) The ngx_http_idempotency_module authors
 */


#ifndef _NGX_HTTP_IDEMPOTENCY_STORE_H_INCLUDED_
#define _NGX_HTTP_IDEMPOTENCY_STORE_H_INCLUDED_


#include "ngx_http_idempotency_redis.h"

/* after nginx's headers: they define _GNU_SOURCE for the system's */
#include <openssl/evp.h>


#define NGX_HTTP_IDEMPOTENCY_HASH_LEN       32      /* SHA-256 */
#define NGX_HTTP_IDEMPOTENCY_HEX_LEN        64      /* ...in hex */
#define NGX_HTTP_IDEMPOTENCY_TOKEN_LEN      16
#define NGX_HTTP_IDEMPOTENCY_PREFIX_MAX     64

/*
 * "key hash …, client: …, request: "…"" in the log lines of a store or
 * release: 95 fixed bytes and an address of at most NGX_SOCKADDR_STRLEN
 * (113) leave the request line at least 111
 */
#define NGX_HTTP_IDEMPOTENCY_INFO_LEN       320

/*
 * a record's key, prefix + "{" + 64 hex digits + "}" (130), fits the
 * client's NGX_HTTP_IDEMPOTENCY_RKEY_MAX (256)
 */
#define NGX_HTTP_IDEMPOTENCY_STORE_KEY_MAX                                    \
    (NGX_HTTP_IDEMPOTENCY_PREFIX_MAX + 2 + 2 * NGX_HTTP_IDEMPOTENCY_HASH_LEN)

/* "IDM1" | state | fingerprint | token: the claim, and every record's head */
#define NGX_HTTP_IDEMPOTENCY_HEAD_LEN                                         \
    (4 + 1 + NGX_HTTP_IDEMPOTENCY_HASH_LEN + NGX_HTTP_IDEMPOTENCY_TOKEN_LEN)


/* how the claim is sent; each step down is taken once, on a refusal */
#define NGX_HTTP_IDEMPOTENCY_CLAIM_SET      0
#define NGX_HTTP_IDEMPOTENCY_CLAIM_EVALSHA  1
#define NGX_HTTP_IDEMPOTENCY_CLAIM_EVAL     2


#define NGX_HTTP_IDEMPOTENCY_MAGIC          "IDM1"

/* idempotency_on_unknown: what a claim does with an unknown outcome */
#define NGX_HTTP_IDEMPOTENCY_ON_UNKNOWN_KEEP     0
#define NGX_HTTP_IDEMPOTENCY_ON_UNKNOWN_FORWARD  1
#define NGX_HTTP_IDEMPOTENCY_ON_UNKNOWN_RELEASE  2

/* the status of an unknown outcome that names none: 502 Bad Gateway */
#define NGX_HTTP_IDEMPOTENCY_STATUS_UNKNOWN  502

#define NGX_HTTP_IDEMPOTENCY_REC_CLAIM      1
#define NGX_HTTP_IDEMPOTENCY_REC_DONE       2
#define NGX_HTTP_IDEMPOTENCY_REC_TOO_LARGE  3
#define NGX_HTTP_IDEMPOTENCY_REC_DONE_TRAILERS  4   /* done, then trailers */
#define NGX_HTTP_IDEMPOTENCY_REC_SEALED     5   /* 2 or 4, encrypted */

/* the longest field name a record holds (capture.c drops longer ones) */
#define NGX_HTTP_IDEMPOTENCY_NAME_MAX       256

/* the GCM tag that ends a sealed record */
#define NGX_HTTP_IDEMPOTENCY_TAG_LEN        16

/*
 * what sealing adds to a record of idempotency_store_max_size bytes at
 * most (crypt.c): version, id length, an id of 32, nonce, state and tag
 */
#define NGX_HTTP_IDEMPOTENCY_SEAL_MAX                                         \
    (1 + 1 + 32 + 12 + 1 + NGX_HTTP_IDEMPOTENCY_TAG_LEN)

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

/* what became of a renewal (lease.c) */
#define NGX_HTTP_IDEMPOTENCY_RENEWED        0   /* lock_ttl more */
#define NGX_HTTP_IDEMPOTENCY_RENEW_LANDED   1   /* a lost one had landed */
#define NGX_HTTP_IDEMPOTENCY_RENEW_LOST     2   /* the key is not the lease */
#define NGX_HTTP_IDEMPOTENCY_RENEW_ERROR    3   /* Redis answered an error */
#define NGX_HTTP_IDEMPOTENCY_RENEW_GONE     4   /* no reply: Redis went away */

/* why a record became unknown: nginx_idempotency_outcomes_unknown_total */
#define NGX_HTTP_IDEMPOTENCY_CAUSE_UPSTREAM    1
#define NGX_HTTP_IDEMPOTENCY_CAUSE_OWNER_LOST  2
#define NGX_HTTP_IDEMPOTENCY_CAUSE_STORE_LOST  3
#define NGX_HTTP_IDEMPOTENCY_CAUSES            3


/* secret.c: the HMAC pads of idempotency_key_secret, absorbed once */
typedef struct {
    EVP_MD_CTX                      *inner;
    EVP_MD_CTX                      *outer;
} ngx_http_idempotency_secret_t;


/*
 * What the layer above is told of a command whose reply the store reads:
 * data is the op's (op.data), and nobody is told once it is NULL.  seen.c:
 * the key hash that first carried a request, NULL when none did before
 * this one (or no answer came); lease.c: what became of a renewal
 * (RENEW_*), and until when the lease holds if it was renewed.
 */
typedef void (*ngx_http_idempotency_seen_pt)(void *data, u_char *first);
typedef void (*ngx_http_idempotency_renewed_pt)(void *data,
    ngx_uint_t result, ngx_msec_t lease_end);


/*
 * A store command about one record key: the client's op first (its reply
 * handler gets the op, ngx_http_idempotency_key_op() the rest), then what
 * the store and the layers above keep with the command until its reply.
 */
typedef struct {
    ngx_http_idempotency_op_t        op;

    u_char                           claim[NGX_HTTP_IDEMPOTENCY_HEAD_LEN];

    /* a store's: the first bytes of its value (head_kept) */
    u_char                           value_head[NGX_HTTP_IDEMPOTENCY_HEAD_LEN];
    size_t                           info_len;
    u_char                           info[NGX_HTTP_IDEMPOTENCY_INFO_LEN];

    /* retry.c: a finish is sent again until acknowledged or until then */
    ngx_msec_t                       lease_end;
    ngx_msec_t                       retry_backoff;

    /* a take whose reply is lost: its unknown outcome's ttl (forward) */
    ngx_msec_t                       ttl;

    /* metrics: when the claim was sent, where the store is counted */
    uint64_t                         sent;
    ngx_uint_t                       zone;

    /* the acknowledgements (WAIT, WAITAOF) asked for */
    ngx_uint_t                       replicas;

    /* seen.c, lease.c: whom the store tells what the reply decided */
    ngx_http_idempotency_seen_pt     seen;
    ngx_http_idempotency_renewed_pt  renewed;

    /* lease.c: the owner's copy of its claim, written while op.data is set */
    u_char                          *owner;

    unsigned                         store:1;
    unsigned                         orphan:1;   /* a lost claim's release */
    unsigned                         rechecked:1;    /* ...sent once more */
    unsigned                         release_lost:1; /* claim: if lost */
    unsigned                         cause:2;    /* finish: unknown, why */
    unsigned                         cas:2;      /* finish: compared again */
    unsigned                         forward:1;
    unsigned                         too_large:1;
    unsigned                         won:1;      /* WAIT: after a claim won */
    unsigned                         head_kept:1;
    unsigned                         aof:1;      /* WAITAOF */
} ngx_http_idempotency_key_op_t;


#define ngx_http_idempotency_key_op(o)  ((ngx_http_idempotency_key_op_t *) (o))


/*
 * A record's head, read through these and written only by build.c: no
 * other file knows its offsets (record.c holds the format).
 */
#define ngx_http_idempotency_head_valid(h, len)                               \
    ((len) >= NGX_HTTP_IDEMPOTENCY_HEAD_LEN                                   \
     && ngx_memcmp(h, NGX_HTTP_IDEMPOTENCY_MAGIC, 4) == 0)
#define ngx_http_idempotency_head_state(h)  ((ngx_uint_t) (h)[4])
#define ngx_http_idempotency_head_fingerprint(h)  ((h) + 5)
#define ngx_http_idempotency_head_token(h)                                    \
    ((h) + 5 + NGX_HTTP_IDEMPOTENCY_HASH_LEN)

/* a completed record without its fields and body: head, status, counts */
#define NGX_HTTP_IDEMPOTENCY_DONE_FIXED                                       \
    (NGX_HTTP_IDEMPOTENCY_HEAD_LEN + 2 + 4 + 8)
/* the trailer section without its fields: the count */
#define NGX_HTTP_IDEMPOTENCY_TRAILERS_FIXED  4
/* a too-large marker: head and status */
#define NGX_HTTP_IDEMPOTENCY_TOO_LARGE_LEN  (NGX_HTTP_IDEMPOTENCY_HEAD_LEN + 2)


/* build.c: a header field or trailer of a record */
typedef struct {
    ngx_str_t                        name;
    ngx_str_t                        value;
} ngx_http_idempotency_field_t;


/* build.c: a completed response's record, built as the response passes */
typedef struct {
    ngx_pool_t                      *pool;
    size_t                           max;        /* the envelope aside */
    size_t                           room;       /* a sealed one's envelope */
    off_t                            expected;   /* the body's length, or -1 */
    ngx_array_t                      fields;     /* headers, then trailers */
    ngx_uint_t                       nheaders;
    u_char                          *start;      /* the record */
    u_char                          *last;
    u_char                          *end;
    ngx_chain_t                     *chunks;     /* a body of unknown length */
    ngx_chain_t                    **chunks_last;
    ngx_buf_t                       *tail;
    size_t                           body_len;
} ngx_http_idempotency_builder_t;


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


/*
 * What a claim's reply says (answer.c), and what a claim tells its request
 * (claim.c): every answer but AGAIN and EXPIRED, which the claim acts on
 */
#define NGX_HTTP_IDEMPOTENCY_ANSWER_NEW        0   /* the claim won */
#define NGX_HTTP_IDEMPOTENCY_ANSWER_AGAIN      1   /* claim again, *mode */
#define NGX_HTTP_IDEMPOTENCY_ANSWER_REPLAY     2   /* completed: record */
#define NGX_HTTP_IDEMPOTENCY_ANSWER_TOO_LARGE  3
#define NGX_HTTP_IDEMPOTENCY_ANSWER_MISMATCH   4   /* another request's */
#define NGX_HTTP_IDEMPOTENCY_ANSWER_CONFLICT   5   /* in progress */
#define NGX_HTTP_IDEMPOTENCY_ANSWER_UNKNOWN    6   /* may have run: status */
#define NGX_HTTP_IDEMPOTENCY_ANSWER_EXPIRED    7   /* unknown: owner gone */
#define NGX_HTTP_IDEMPOTENCY_ANSWER_ERROR      8   /* logged */


/* a claim's reply read for its request: what that takes, where it goes */
typedef struct {
    ngx_str_t                       *rkey;
    u_char                          *claim;      /* the request's own */
    ngx_uint_t                      *mode;       /* as sent; moved on */
    ngx_array_t                     *keys;       /* opening sealed records */
    uint64_t                         sent_at;    /* reading a lease */
    ngx_msec_t                       margin;
    ngx_pool_t                      *pool;       /* the record's memory */
    ngx_log_t                       *log;

    ngx_http_idempotency_record_t   *record;     /* found: decoded */
    ngx_uint_t                      *status;     /* unknown: its status */
    u_char                          *seen;       /* unknown: its head */
    unsigned                         itself:1;   /* new: found, not made */
} ngx_http_idempotency_answer_t;


/* a store, an unknown outcome or a release: what finish_key() sends */
typedef struct {
    ngx_uint_t                       zone;       /* where it is counted */
    ngx_str_t                        rkey;
    u_char                          *claim;
    u_char                          *value;      /* NULL: release */
    size_t                           len;
    ngx_msec_t                       ttl;
    ngx_msec_t                       lease_end;  /* sent again until then */
    ngx_str_t                       *info;       /* for the log, or NULL */
    unsigned                         orphan:1;   /* a lost claim's release */
    unsigned                         immediate:1;    /* not with the turn */
} ngx_http_idempotency_finish_t;


/* one waiting for a record key to change (watch.c) */
typedef struct ngx_http_idempotency_watcher_s
    ngx_http_idempotency_watcher_t;


/*
 * What a location's claims are, set once when its configuration is read:
 * every claim of the location points to it
 */
typedef struct {
    ngx_http_idempotency_target_t   *redis;
    ngx_array_t                     *keys;       /* opening sealed records */
    ngx_msec_t                       lock_ttl;
    ngx_msec_t                       ttl;
    ngx_msec_t                       timeout;    /* each round trip's */
    ngx_msec_t                       wait;       /* for a key in progress */
    ngx_uint_t                       replicas;   /* WAIT, WAITAOF */
    ngx_msec_t                       replicas_timeout;
    ngx_uint_t                       zone;       /* metrics */
    ngx_uint_t                       on_unknown;
    unsigned                         replicas_on:1;
    unsigned                         aof:1;
    unsigned                         immediate:1;    /* stores at once */
    unsigned                         dry_run:1;  /* reads, never writes */
    unsigned                         passes:1;   /* runs unprotected when
                                                    Redis fails */
} ngx_http_idempotency_claim_conf_t;


typedef struct ngx_http_idempotency_claim_s  ngx_http_idempotency_claim_t;

/* told once per start: NGX_HTTP_IDEMPOTENCY_ANSWER_* */
typedef void (*ngx_http_idempotency_claim_pt)(ngx_http_idempotency_claim_t *c,
    ngx_uint_t answer);

/* what names the claim's request in a log line, into INFO_LEN bytes */
typedef u_char *(*ngx_http_idempotency_describe_pt)(void *data, u_char *buf);


/*
 * A request's claim on its record key (claim.c), in the request's pool.
 * The request sets what it is and starts it; the store sends the claim in
 * the way the server takes, takes over an unknown outcome, holds a won
 * claim until the replicas acknowledge it, renews its lease, and tells the
 * handler one answer.  A claim won ends once: stored, unknown or released
 * (claim_end.c); a request that goes away detaches it, and the store
 * releases what a late reply shows it won.
 */
struct ngx_http_idempotency_claim_s {
    /* set by the request before the first start */
    ngx_http_idempotency_claim_conf_t  *conf;
    ngx_str_t                        rkey;
    u_char                           head[NGX_HTTP_IDEMPOTENCY_HEAD_LEN];
    ngx_http_idempotency_claim_pt    handler;
    ngx_http_idempotency_describe_pt describe;
    void                            *data;

    /* told with the answer */
    ngx_http_idempotency_record_t    record;     /* REPLAY */
    ngx_uint_t                       status;     /* UNKNOWN */
    ngx_uint_t                       epoch;      /* watch.c's, at the send */
    unsigned                         took_over:1;    /* NEW, under forward:
                                                        it may have run */
    unsigned                         finished:1;

    /* the store's own */
    ngx_pool_t                      *pool;
    ngx_log_t                       *log;
    ngx_http_idempotency_key_op_t   *op;         /* the claim, take, WAIT */
    ngx_http_idempotency_key_op_t   *wait_op;    /* sent behind the claim */
    ngx_http_idempotency_op_t       *renew_op;
    ngx_event_t                      timer;
    ngx_event_t                      renewal;
    ngx_msec_t                       lease_end;  /* as Redis holds it */
    uint64_t                         sent_at;    /* epoch ms, the last send */
    ngx_uint_t                       mode;       /* how the claim is sent */
    ngx_uint_t                       takes;
    u_char                           seen[NGX_HTTP_IDEMPOTENCY_HEAD_LEN];

    /* describe()'s, made when a log line or an end first needs it */
    size_t                           info_len;
    u_char                           info[NGX_HTTP_IDEMPOTENCY_INFO_LEN];

    /* claim_wait.c: a key in progress waited for */
    ngx_event_t                      poll;
    ngx_msec_t                       wait_until;
    ngx_msec_t                       poll_delay;
    ngx_http_idempotency_watcher_t  *watcher;
    unsigned                         polling:1;
};


/* the key hash's hex digits, inside a record key's braces */
#define ngx_http_idempotency_rkey_hash(rkey)                                  \
    ((rkey)->data + (rkey)->len - 1 - 2 * NGX_HTTP_IDEMPOTENCY_HASH_LEN)


/*
 * What a watcher's handler is told (watch.c).  WAKE: look at the key again
 * now; CHECK: the same, unless a look is in flight; NGX_OK: it looks,
 * NGX_BUSY: its look is in flight.  CALM: another watcher looks for it,
 * only a lost message is to be looked for.  GONE: worker exit, no wake-up
 * will come.
 */
#define NGX_HTTP_IDEMPOTENCY_WATCH_WAKE     0
#define NGX_HTTP_IDEMPOTENCY_WATCH_CHECK    1
#define NGX_HTTP_IDEMPOTENCY_WATCH_CALM     2
#define NGX_HTTP_IDEMPOTENCY_WATCH_GONE     3


typedef ngx_int_t (*ngx_http_idempotency_watch_pt)(
    ngx_http_idempotency_watcher_t *w, ngx_uint_t event);


/* one waiting for a record key to change (watch.c); the caller's memory */
struct ngx_http_idempotency_watcher_s {
    ngx_queue_t                      queue;      /* in the key's */
    ngx_http_idempotency_channel_t  *channel;    /* the key's */
    ngx_http_idempotency_watch_pt    handler;
    void                            *data;
    unsigned                         checked:1;  /* looked once subscribed */
    unsigned                         again:1;    /* woken during a look */
};


/* record.c */
ngx_int_t ngx_http_idempotency_record_decode(u_char *data, size_t len,
    ngx_http_idempotency_record_t *rec);
ngx_int_t ngx_http_idempotency_record_decode_plain(u_char *head, u_char *p,
    size_t len, ngx_http_idempotency_record_t *rec);
u_char *ngx_http_idempotency_record_next_header(u_char *p, ngx_str_t *name,
    ngx_str_t *value);
ngx_uint_t ngx_http_idempotency_record_field_ok(ngx_str_t *name);
ngx_uint_t ngx_http_idempotency_record_status_line_ok(ngx_str_t *line,
    ngx_uint_t status);

/* build.c */
void ngx_http_idempotency_head_claim(u_char *head);
ngx_int_t ngx_http_idempotency_builder_init(ngx_http_idempotency_builder_t *bd,
    ngx_pool_t *pool, ngx_array_t *keys, size_t max, off_t expected);
ngx_int_t ngx_http_idempotency_builder_field(
    ngx_http_idempotency_builder_t *bd, ngx_str_t *name, ngx_str_t *value);
ngx_int_t ngx_http_idempotency_builder_head(ngx_http_idempotency_builder_t *bd,
    u_char *head, ngx_uint_t status);
ngx_int_t ngx_http_idempotency_builder_body(ngx_http_idempotency_builder_t *bd,
    u_char *pos, size_t n);
ngx_int_t ngx_http_idempotency_builder_end(ngx_http_idempotency_builder_t *bd,
    ngx_uint_t header_only, u_char **value, size_t *len);
void ngx_http_idempotency_build_too_large(u_char *buf, u_char *head,
    ngx_uint_t status);

/* what a finish's reply says, for whoever counts them (finish.c) */
#define NGX_HTTP_IDEMPOTENCY_FINISH_DONE    0   /* it acted */
#define NGX_HTTP_IDEMPOTENCY_FINISH_FAILED  1   /* no reply, or an error */
#define NGX_HTTP_IDEMPOTENCY_FINISH_LOST    2   /* the claim was not ours */


/*
 * What the store tells whoever counts (metrics_events.c): what a finish's
 * reply says (FINISH_*; the key op says what the finish was), one that
 * could not be sent, an outcome that became unknown, a claim refused, and
 * a claim's round trip; nobody by default
 */
typedef struct {
    void                           (*done)(ngx_http_idempotency_key_op_t *kop,
                                       ngx_uint_t result);
    void                           (*failed)(ngx_uint_t zone);
    void                           (*unknown)(ngx_uint_t cause);

    /* a claim not sent: the server forbids scripting, has no SET IFEQ */
    void                           (*claim_refused)(
                                       ngx_http_idempotency_target_t *redis);

    /* a claim's round trip: sent, and answered (or not) */
    void                           (*claim_sent)(
                                       ngx_http_idempotency_key_op_t *kop);
    void                           (*claim_done)(
                                       ngx_http_idempotency_key_op_t *kop,
                                       ngx_uint_t answered);
} ngx_http_idempotency_store_events_t;


extern ngx_http_idempotency_store_events_t  ngx_http_idempotency_store_events;


/*
 * The server compares and sets natively (SET ... IFEQ, its old value back
 * with GET, matched or not): Valkey 8.1 and Redis 8.4 and later.  It
 * compares and deletes (DELIFEQ on Valkey 9.0, DELEX ... IFEQ on Redis
 * 8.4; not where a target mixes both kinds, each lacking the other's).
 * Where both are there, finishes, renewals, take-overs and releases are
 * native commands, cheaper than the scripts and needing none (until the
 * server refuses the delete: an ACL from before, said once at warn, and
 * the delete tried again a minute later).
 * Where only SET IFEQ is, the scripts stay while they may run: a release
 * by SET IFEQ lets a key expire a millisecond later, not at once; where
 * scripting is forbidden (SCRIPT LOAD refused) it is the way, and no
 * guarantee is lost.
 */
#define ngx_http_idempotency_has_ifeq(redis)                                  \
    ((redis)->server_version >= ((redis)->valkey ? 80100 : 80400))

#define ngx_http_idempotency_has_delifeq(redis)                               \
    (!(redis)->mixed                                                          \
     && (!(redis)->del_refused                                                \
         || ngx_current_msec - (redis)->del_refused_at                        \
            >= NGX_HTTP_IDEMPOTENCY_DEL_ASK)                                  \
     && (redis)->server_version >= ((redis)->valkey ? 90000 : 80400))

/* a refused compare-and-delete is tried again after this long (ms) */
#define NGX_HTTP_IDEMPOTENCY_DEL_ASK        60000

#define ngx_http_idempotency_native_cas(redis)                                \
    (ngx_http_idempotency_has_ifeq(redis)                                     \
     && ((redis)->script_refused || ngx_http_idempotency_has_delifeq(redis)))


/* op.c: the store's commands */
ngx_http_idempotency_key_op_t *ngx_http_idempotency_key_op_alloc(
    ngx_http_idempotency_target_t *redis, ngx_str_t *rkey);
ngx_http_idempotency_key_op_t *ngx_http_idempotency_key_op_copy(
    ngx_http_idempotency_key_op_t *from);

/* answer.c: what a claim's reply means for its request */
ngx_uint_t ngx_http_idempotency_claim_answer(
    ngx_http_idempotency_target_t *redis, redisReply *reply,
    ngx_http_idempotency_answer_t *a);

/* claim.c: a request's claim */
ngx_int_t ngx_http_idempotency_claim_init(ngx_log_t *log);
void ngx_http_idempotency_claim_head(ngx_http_idempotency_claim_t *c,
    u_char *fingerprint);
ngx_http_idempotency_claim_t *ngx_http_idempotency_claim_create(
    ngx_pool_t *pool, ngx_log_t *log);
ngx_int_t ngx_http_idempotency_claim_start(ngx_http_idempotency_claim_t *c);
void ngx_http_idempotency_claim_detach(ngx_http_idempotency_claim_t *c);
void ngx_http_idempotency_claim_answered(ngx_http_idempotency_claim_t *c,
    ngx_uint_t answer);
void ngx_http_idempotency_claim_info(ngx_http_idempotency_claim_t *c,
    ngx_str_t *info);

/* claim_wait.c: a claim that waits for its key in progress */
ngx_int_t ngx_http_idempotency_claim_wait(ngx_http_idempotency_claim_t *c);
void ngx_http_idempotency_claim_unwatch(ngx_http_idempotency_claim_t *c);

/* claim_end.c: how a claim won ends, and how one whose request is gone */
ngx_int_t ngx_http_idempotency_claim_store(ngx_http_idempotency_claim_t *c,
    u_char *value, size_t len);
ngx_int_t ngx_http_idempotency_claim_too_large(
    ngx_http_idempotency_claim_t *c, ngx_uint_t status);
void ngx_http_idempotency_claim_unknown(ngx_http_idempotency_claim_t *c,
    ngx_uint_t status);
void ngx_http_idempotency_claim_release(ngx_http_idempotency_claim_t *c);
void ngx_http_idempotency_release_orphan(ngx_http_idempotency_key_op_t *kop);
void ngx_http_idempotency_take_lost(ngx_http_idempotency_key_op_t *kop);
void ngx_http_idempotency_owner_lost(ngx_http_idempotency_claim_t *c);

/* replicas.c: WAIT or WAITAOF after a claim and after a store */
void ngx_http_idempotency_replicas_send(ngx_http_idempotency_claim_t *c);
ngx_int_t ngx_http_idempotency_replicas_hold(ngx_http_idempotency_claim_t *c,
    ngx_uint_t itself);
void ngx_http_idempotency_replicas_timedout(ngx_http_idempotency_claim_t *c);
void ngx_http_idempotency_replicas_detach(ngx_http_idempotency_claim_t *c);
void ngx_http_idempotency_replicas_store(ngx_http_idempotency_claim_t *c);

/* renew.c: the owner renews its lease while its request lives */
void ngx_http_idempotency_renew_start(ngx_http_idempotency_claim_t *c);
void ngx_http_idempotency_renew_stop(ngx_http_idempotency_claim_t *c);

/* cas.c: the claim's commands, and the take-over of an unknown outcome */
ngx_int_t ngx_http_idempotency_claim_command(
    ngx_http_idempotency_key_op_t *kop, ngx_str_t *rkey, u_char *claim,
    ngx_msec_t ttl, ngx_uint_t *mode);
ngx_uint_t ngx_http_idempotency_claim_own(redisReply *reply, u_char *claim);
ngx_uint_t ngx_http_idempotency_claim_maybe_won(redisReply *reply,
    u_char *claim);
ngx_int_t ngx_http_idempotency_set_nx_get(ngx_http_idempotency_op_t *op,
    ngx_str_t *key, u_char *value, size_t len, ngx_msec_t ttl);
ngx_int_t ngx_http_idempotency_claim_allowed(
    ngx_http_idempotency_target_t *redis);
ngx_int_t ngx_http_idempotency_take_command(ngx_http_idempotency_op_t *op,
    ngx_str_t *rkey, u_char *seen, u_char *value, ngx_msec_t ttl);
ngx_int_t ngx_http_idempotency_take_result(
    ngx_http_idempotency_target_t *redis, redisReply *reply, ngx_log_t *log);
void ngx_http_idempotency_cas_args(const char **argv, size_t *argvlen,
    ngx_str_t *rkey, u_char *value, size_t len, u_char *expected);
void ngx_http_idempotency_eval_args(const char **argv, size_t *argvlen,
    ngx_str_t *script, ngx_str_t *rkey);
int ngx_http_idempotency_delifeq_args(ngx_http_idempotency_target_t *redis,
    const char **argv, size_t *argvlen, ngx_str_t *rkey, u_char *expected,
    size_t len);
ngx_int_t ngx_http_idempotency_delifeq_refused(
    ngx_http_idempotency_target_t *redis, redisReply *reply);
ngx_int_t ngx_http_idempotency_touch_command(ngx_http_idempotency_op_t *op,
    ngx_str_t *rkey, u_char *claim);
ngx_int_t ngx_http_idempotency_touch_result(
    ngx_http_idempotency_target_t *redis, redisReply *reply, u_char *claim,
    ngx_log_t *log, ngx_str_t *info);

/* durable.c: WAIT, WAITAOF */
ngx_int_t ngx_http_idempotency_durable_command(
    ngx_http_idempotency_key_op_t *kop, ngx_uint_t number,
    ngx_msec_t timeout_ms, ngx_uint_t aof);
ngx_int_t ngx_http_idempotency_durable_result(
    ngx_http_idempotency_key_op_t *kop, redisReply *reply, ngx_log_t *log,
    ngx_str_t *info);

/*
 * fetch.c: what an operator reads of a key (GET and PTTL), or purges, told
 * to the layer above once, by a callback, with one of these
 */
#define NGX_HTTP_IDEMPOTENCY_FETCH_FOUND    0   /* value, len, pttl */
#define NGX_HTTP_IDEMPOTENCY_FETCH_NONE     1   /* no record */
#define NGX_HTTP_IDEMPOTENCY_FETCH_PURGED   2
#define NGX_HTTP_IDEMPOTENCY_FETCH_BUSY     3   /* a claim in progress */
#define NGX_HTTP_IDEMPOTENCY_FETCH_CHANGED  4   /* since the read: kept */
#define NGX_HTTP_IDEMPOTENCY_FETCH_ERROR    5   /* logged, if Redis said */

typedef struct ngx_http_idempotency_fetch_s  ngx_http_idempotency_fetch_t;

/* the fetch is freed after the handler returns, and its value with it */
typedef void (*ngx_http_idempotency_fetch_pt)(
    ngx_http_idempotency_fetch_t *f, ngx_uint_t result);

struct ngx_http_idempotency_fetch_s {
    ngx_http_idempotency_target_t   *redis;
    ngx_str_t                        rkey;       /* in key[] */
    ngx_log_t                       *log;        /* the caller's */

    ngx_http_idempotency_fetch_pt    handler;    /* NULL: cancelled */
    void                            *data;

    /* FOUND: the record, in the fetch's memory, and its time to live */
    u_char                          *value;
    size_t                           len;
    long long                        pttl;       /* -1: none */

    ngx_uint_t                       pending;    /* ops out */

    unsigned                         force:1;    /* purge a claim too */
    unsigned                         got:1;      /* GET answered */
    unsigned                         found:1;    /* ...with a value */

    u_char                           key[NGX_HTTP_IDEMPOTENCY_STORE_KEY_MAX];
};

ngx_http_idempotency_fetch_t *ngx_http_idempotency_fetch(
    ngx_http_idempotency_target_t *redis, ngx_str_t *rkey, ngx_log_t *log,
    ngx_http_idempotency_fetch_pt handler, void *data);
ngx_http_idempotency_fetch_t *ngx_http_idempotency_purge(
    ngx_http_idempotency_target_t *redis, ngx_str_t *rkey, ngx_uint_t force,
    ngx_log_t *log, ngx_http_idempotency_fetch_pt handler, void *data);
void ngx_http_idempotency_fetch_cancel(ngx_http_idempotency_fetch_t *f);
ngx_int_t ngx_http_idempotency_sealed_id(u_char *data, size_t len,
    ngx_str_t *id);

/*
 * scan.c: a page of a walk of the record keys, one SCAN step on one
 * master, and each record's head and time to live read on the same node
 */

/* what is read of each record: its head and a sealed one's key id */
#define NGX_HTTP_IDEMPOTENCY_SCAN_HEAD                                        \
    (NGX_HTTP_IDEMPOTENCY_HEAD_LEN + 2 + 32)

/* the most keys one SCAN step may bring: far above COUNT 1000 */
#define NGX_HTTP_IDEMPOTENCY_SCAN_KEYS_MAX  8192

typedef struct ngx_http_idempotency_scan_s  ngx_http_idempotency_scan_t;

/* the page is read (NGX_OK) or not (NGX_ERROR); the scan is freed after */
typedef void (*ngx_http_idempotency_scan_pt)(ngx_http_idempotency_scan_t *s,
    ngx_int_t rc);

typedef struct {
    u_char                           hash[NGX_HTTP_IDEMPOTENCY_HEX_LEN];
    u_char                           head[NGX_HTTP_IDEMPOTENCY_SCAN_HEAD];
    size_t                           len;        /* 0: gone since */
    long long                        pttl;       /* -1: none */
} ngx_http_idempotency_scan_key_t;

struct ngx_http_idempotency_scan_s {
    ngx_http_idempotency_target_t   *redis;
    ngx_str_t                        prefix;
    ngx_uint_t                       count;      /* SCAN's COUNT */

    /* in: where the walk is; out: where it goes on */
    ngx_uint_t                       master;
    uint64_t                         cursor;

    ngx_http_idempotency_scan_pt     handler;    /* NULL: cancelled */
    void                            *data;

    ngx_http_idempotency_scan_key_t *keys;       /* the records found */
    ngx_uint_t                       nkeys;
    ngx_uint_t                       scanned;    /* every key SCAN gave */
    uint64_t                         at;         /* the epoch ms of the
                                                    reads, for leases */

    ngx_http_idempotency_node_t     *node;
    ngx_uint_t                       pending;    /* ops out */
    ngx_uint_t                       replies;    /* to the reads */
    ngx_log_t                       *log;

    unsigned                         end:1;      /* no page after this */
    unsigned                         failed:1;
};

ngx_http_idempotency_scan_t *ngx_http_idempotency_scan_create(
    ngx_http_idempotency_target_t *redis, ngx_log_t *log);
ngx_int_t ngx_http_idempotency_scan_start(ngx_http_idempotency_scan_t *scan);
void ngx_http_idempotency_scan_cancel(ngx_http_idempotency_scan_t *scan);

/* seen.c: which key first carried a request */
ngx_http_idempotency_op_t *ngx_http_idempotency_seen_send(
    ngx_http_idempotency_target_t *redis, ngx_str_t *prefix, u_char *hash,
    u_char *key_hex, ngx_msec_t window, ngx_http_idempotency_seen_pt handler,
    void *data);

/* finish.c: a claim stored, made an unknown outcome, or released */
void ngx_http_idempotency_finish_key(ngx_http_idempotency_target_t *redis,
    ngx_http_idempotency_finish_t *f, ngx_log_t *log);

/* retry.c: finishes sent again until acknowledged or their lease ends */
ngx_int_t ngx_http_idempotency_finish_retry(ngx_http_idempotency_op_t *op,
    redisReply *reply);
ngx_int_t ngx_http_idempotency_retry_command(ngx_http_idempotency_op_t *op,
    int argc, const char **argv, const size_t *argvlen);
void ngx_http_idempotency_retry_exit(void);

/* view.c: a record as the admin shows it */
typedef struct {
    const char                      *state;      /* in_progress, unknown,
                                                    completed, too_large */
    ngx_uint_t                       status;     /* 0: none */
    uint64_t                         stored_at;  /* ms; 0: not kept */
    uint64_t                         lease_until;    /* ms; 0: no lease */
    u_char                          *fingerprint;
    ngx_str_t                        key_id;     /* a sealed one's */
    const char                      *why;        /* sealed, not opened */
    ngx_http_idempotency_record_t    rec;        /* read: decoded */
    unsigned                         sealed:1;
    unsigned                         opened:1;
    unsigned                         read:1;     /* rec holds the record */
} ngx_http_idempotency_view_t;

ngx_int_t ngx_http_idempotency_view_head(u_char *head, size_t len,
    uint64_t at, ngx_msec_t margin, ngx_http_idempotency_view_t *v);
ngx_int_t ngx_http_idempotency_view(u_char *value, size_t len,
    ngx_array_t *keys, ngx_str_t *rkey, uint64_t at, ngx_msec_t margin,
    ngx_log_t *log, ngx_http_idempotency_view_t *v);


/* watch.c: waiting for a record key to change, woken by the finish */
extern ngx_uint_t  ngx_http_idempotency_watch_epoch;
ngx_int_t ngx_http_idempotency_watch_ready(
    ngx_http_idempotency_target_t *redis);
ngx_int_t ngx_http_idempotency_watch_add(ngx_http_idempotency_target_t *redis,
    ngx_str_t *rkey, ngx_http_idempotency_watcher_t *w);
ngx_int_t ngx_http_idempotency_watch_wait(ngx_http_idempotency_watcher_t *w,
    ngx_uint_t sent, ngx_log_t *log);
void ngx_http_idempotency_watch_del(ngx_http_idempotency_watcher_t *w);

/* secret.c: keyed record names */
char *ngx_http_idempotency_key_secret_directive(ngx_conf_t *cf,
    ngx_command_t *cmd, void *conf);
ngx_int_t ngx_http_idempotency_secret_hash(ngx_http_idempotency_secret_t *s,
    EVP_MD_CTX *md, ngx_str_t *scope, ngx_str_t *key, u_char *hash);
ssize_t ngx_http_idempotency_secret_read(ngx_conf_t *cf,
    ngx_str_t *directive, ngx_str_t *name, u_char *buf, size_t size);
size_t ngx_http_idempotency_secret_hex_bits(u_char *p, size_t n);

/* crypt.c: completed records sealed with AES-256-GCM */
char *ngx_http_idempotency_encrypt_key_directive(ngx_conf_t *cf,
    ngx_command_t *cmd, void *conf);
size_t ngx_http_idempotency_crypt_room(ngx_array_t *keys);
ngx_int_t ngx_http_idempotency_crypt_seal(ngx_array_t *keys, ngx_str_t *rkey,
    u_char *rec, size_t *len);
ngx_int_t ngx_http_idempotency_crypt_open(ngx_array_t *keys, ngx_log_t *log,
    ngx_str_t *rkey, u_char *data, size_t len,
    ngx_http_idempotency_record_t *rec);

/* lease.c: the owner's lease inside its claim */
uint64_t ngx_http_idempotency_epoch_msec(void);
void ngx_http_idempotency_lease_set(u_char *claim, ngx_msec_t lock_ttl);
void ngx_http_idempotency_lease_unknown(u_char *buf, u_char *claim,
    ngx_uint_t status, ngx_uint_t cause);
ngx_uint_t ngx_http_idempotency_lease_read(u_char *head, ngx_uint_t *status,
    uint64_t at, ngx_msec_t margin);
uint64_t ngx_http_idempotency_lease_deadline(u_char *head);
void ngx_http_idempotency_lease_stored(u_char *head);
uint64_t ngx_http_idempotency_lease_stored_at(u_char *head);
ngx_uint_t ngx_http_idempotency_lease_cause(u_char *value);
ngx_int_t ngx_http_idempotency_lease_renew(
    ngx_http_idempotency_key_op_t *kop, ngx_str_t *rkey, u_char *claim,
    ngx_msec_t lock_ttl, ngx_msec_t ttl,
    ngx_http_idempotency_renewed_pt handler, void *data);

/* script.c: the Lua that makes claim and finish atomic */
extern ngx_str_t  ngx_http_idempotency_claim_script;
extern ngx_str_t  ngx_http_idempotency_finish_script;
extern ngx_str_t  ngx_http_idempotency_take_script;
extern u_char     ngx_http_idempotency_claim_sha[41];
extern u_char     ngx_http_idempotency_finish_sha[41];
ngx_int_t ngx_http_idempotency_script_init(void);


#endif /* _NGX_HTTP_IDEMPOTENCY_STORE_H_INCLUDED_ */
