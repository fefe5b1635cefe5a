
/*
 * Copyright (C) The ngx_http_idempotency_module authors
 */


#ifndef _NGX_HTTP_IDEMPOTENCY_REDIS_H_INCLUDED_
#define _NGX_HTTP_IDEMPOTENCY_REDIS_H_INCLUDED_


#include <ngx_config.h>
#include <ngx_core.h>
#include <ngx_event.h>
#include <ngx_event_connect.h>

#include <hiredis/hiredis.h>


/* a claim kept to be sent again after a broken connection (SET or EVALSHA) */
#define NGX_HTTP_IDEMPOTENCY_RESEND_MAX     384

/* the longest key a command is routed by (a cluster's slot) */
#define NGX_HTTP_IDEMPOTENCY_RKEY_MAX       256

/* one read from Redis: a 256 KB reply takes 4 reads in one event */
#define NGX_HTTP_IDEMPOTENCY_READ_SIZE      65536

/* from this size a bulk string is read in place (input.c) */
#define NGX_HTTP_IDEMPOTENCY_BULK_MIN       16384

/* a node's reconnect backoff, ms: doubled on each failure up to the max */
#define NGX_HTTP_IDEMPOTENCY_BACKOFF_MIN    10
#define NGX_HTTP_IDEMPOTENCY_BACKOFF_MAX    500


/*
 * One argument of a command, a string literal, with its length taken from
 * the literal rather than counted by hand ("" s refuses anything else).
 * i is evaluated once, so "n++" may be passed.
 */
#define ngx_http_idempotency_arg(argv, argvlen, i, s)                         \
    do {                                                                      \
        size_t  ngx_http_idempotency_i = (i);                                 \
        (argv)[ngx_http_idempotency_i] = "" s;                                \
        (argvlen)[ngx_http_idempotency_i] = sizeof(s) - 1;                    \
    } while (0)

/*
 * An error reply whose text starts with the string literal s ("NOSCRIPT",
 * "MOVED "): exactly that prefix, as case-sensitive as the server's codes
 */
#define ngx_http_idempotency_reply_is(reply, s)                               \
    ((reply)->type == REDIS_REPLY_ERROR                                       \
     && (size_t) (reply)->len >= sizeof(s) - 1                                \
     && ngx_strncmp((reply)->str, "" s, sizeof(s) - 1) == 0)

typedef struct ngx_http_idempotency_op_s     ngx_http_idempotency_op_t;
typedef struct ngx_http_idempotency_target_s  ngx_http_idempotency_target_t;
typedef struct ngx_http_idempotency_sentinel_s
    ngx_http_idempotency_sentinel_t;
typedef struct ngx_http_idempotency_node_s   ngx_http_idempotency_node_t;
typedef struct ngx_http_idempotency_subscriber_s
    ngx_http_idempotency_subscriber_t;
typedef struct ngx_http_idempotency_channel_s
    ngx_http_idempotency_channel_t;
typedef struct ngx_http_idempotency_shard_s  ngx_http_idempotency_shard_t;
typedef struct ngx_http_idempotency_cluster_s
    ngx_http_idempotency_cluster_t;
typedef struct ngx_http_idempotency_cnode_s  ngx_http_idempotency_cnode_t;


/*
 * A node's owner: what node.c and handshake.c tell of the node's life to
 * whoever made it, the hiredis way (a context's callbacks).  The owner
 * gives its table to node_init() and the client calls through it, never
 * asking what kind of node it has: a target's nodes have their
 * topology's table, a subscriber's nodes the subscriber's (subscribe.c).
 * A NULL handler is not called.
 */
typedef struct {
    /* after CLIENT SETNAME (NGX_OK: INFO server and the scripts follow) */
    ngx_int_t                      (*handshake)(
                                       ngx_http_idempotency_node_t *node);

    /* the handshake passed; node.c marks the node up after it */
    void                           (*up)(ngx_http_idempotency_node_t *node);

    /* a reply before the FIFO sees it, then one to its command (NGX_DONE) */
    ngx_int_t                      (*reply)(ngx_http_idempotency_node_t *node,
                                       redisReply *reply);
    ngx_int_t                      (*redirect)(
                                       ngx_http_idempotency_node_t *node,
                                       ngx_http_idempotency_op_t *op,
                                       redisReply *reply);

    /*
     * a closed node: its commands (NGX_OK: taken back), then the node,
     * which its owner reconnects (node_schedule) or not; wanted: whether
     * the node is still wanted, asked before any reconnect
     */
    ngx_int_t                      (*lost)(ngx_http_idempotency_node_t *node,
                                       ngx_http_idempotency_op_t *op);
    ngx_uint_t                     (*wanted)(ngx_http_idempotency_node_t *node);
    void                           (*closed)(ngx_http_idempotency_node_t *node);
} ngx_http_idempotency_node_owner_t;


/*
 * A topology: how a target finds its nodes, routes its commands and
 * follows its changes.  Standalone (target.c), a Sentinel-managed master
 * and its Sentinels (sentinel.c) and Cluster (cluster.c) each fill one;
 * the client calls through it and never asks which one a target has.  A
 * NULL handler is not called.
 */
typedef struct {
    /* at configuration, where the target is used: how to find it */
    ngx_int_t                      (*conf)(ngx_conf_t *cf,
                                       ngx_http_idempotency_target_t *redis,
                                       ngx_resolver_t *resolver,
                                       ngx_msec_t resolver_timeout);
    void                           (*tls)(ngx_http_idempotency_target_t *redis);
    ngx_str_t                     *(*tls_name)(
                                       ngx_http_idempotency_node_t *node,
                                       ngx_uint_t *ip);

    /* in a worker */
    ngx_int_t                      (*init)(ngx_cycle_t *cycle,
                                       ngx_http_idempotency_target_t *redis);
    void                           (*exit)(
                                       ngx_http_idempotency_target_t *redis);
    ngx_int_t                      (*command)(ngx_http_idempotency_op_t *op,
                                       int argc, const char **argv,
                                       const size_t *argvlen);
    void                           (*load_script)(
                                       ngx_http_idempotency_target_t *redis);

    /*
     * a walk of every key (SCAN is per server): the first master at or
     * after *at, by a number that is the same in every worker; NULL: the
     * one node at 0.  NGX_DONE: none left; NGX_AGAIN: not known yet.
     */
    ngx_int_t                      (*master)(
                                       ngx_http_idempotency_target_t *redis,
                                       ngx_uint_t *at,
                                       ngx_http_idempotency_node_t **node);

    /*
     * the owner of the target's nodes, given to each as it is made
     * (target.c, cluster_map.c); its up and closed call target_up() and
     * target_closed(), what every target's node does
     */
    ngx_http_idempotency_node_owner_t  *owner;

    /* many nodes, each by its own address or name (logs name the node) */
    ngx_uint_t                       nodes;
    /* the node's address is learned at run time and moves */
    ngx_uint_t                       moves;
    /* the TLS name may come from where the node was found */
    ngx_uint_t                       tls_found;
} ngx_http_idempotency_topology_t;


/* the idempotency_redis_tls_* settings of a target */
typedef struct {
    ngx_flag_t                       verify;
    ngx_str_t                        trusted_certificate;
    ngx_str_t                        name;
    ngx_str_t                        certificate;
    ngx_str_t                        certificate_key;
} ngx_http_idempotency_tls_conf_t;



/*
 * One connection to one Redis server (conn.c moves the bytes, node.c the
 * commands).  A backend has one node today; a cluster would have one per
 * shard master, each with its own FIFO of sent commands.
 */
struct ngx_http_idempotency_node_s {
    ngx_http_idempotency_target_t   *redis;      /* the backend it serves */
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
    ngx_uint_t                       elements;   /* of the reply in parse */

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
#if (NGX_SSL)
    ngx_ssl_session_t               *session;
#endif

    ngx_event_t                      connect_ev;
    ngx_event_t                      reconnect_ev;
    ngx_event_t                      reset_ev;
    ngx_event_t                      watchdog_ev;
    ngx_event_t                      flush_ev;
    ngx_event_t                      ask_ev;     /* the handshake's again */
    ngx_msec_t                       backoff;
    ngx_msec_t                       ask_backoff;
    ngx_msec_t                       answered;   /* the watchdog's start */

    /* cluster_map.c: a node known by name, resolved on every connect */
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

    /*
     * what the handshake asks again on this connection after a backoff
     * (a server loading its data set, busy, or forbidding it), and whether
     * a failure that will pass was logged
     */
    unsigned                         ask:2;
    unsigned                         ask_logged:1;

    /* whoever made the node: its topology's table, or a subscriber's */
    ngx_http_idempotency_node_owner_t  *owner;
};


/* one Redis target; the runtime part is per worker (after fork) */
struct ngx_http_idempotency_target_s {
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
#if (NGX_SSL)
    ngx_ssl_t                       *ssl;
    ngx_str_t                        tls_name;   /* NUL-terminated */
    ngx_flag_t                       tls_verify;
    ngx_http_idempotency_tls_conf_t  tls_conf;   /* as configured */
    unsigned                         tls_name_ip:1;
#endif

    ngx_http_idempotency_topology_t *topology;
    ngx_http_idempotency_node_t     *node;       /* per worker */
    ngx_msec_t                       wait_timeout;   /* the longest WAIT */
    size_t                           reply_max;  /* the longest record */
    ngx_http_idempotency_sentinel_t *sentinel;   /* sentinel.c, or NULL */

    /* cluster_map.c: the seeds (ngx_addr_t), NULL if not a cluster */
    ngx_array_t                     *seeds;
    ngx_array_t                     *seed_names;    /* given by name */
    void                            *cluster;    /* per worker */
    ngx_http_idempotency_subscriber_t  *subscriber;  /* per worker */
    void                           (*exit_handler)(
                                       ngx_http_idempotency_target_t *redis);

    ngx_log_t                       *log;

    /*
     * the server, as INFO server names it at each data connection's
     * handshake: "valkey" or "redis", and the lowest version of the nodes
     * that answered (major * 10000 + minor * 100 + patch); 0: not known yet
     */
    ngx_uint_t                       server_version;
    size_t                           server_len;
    u_char                           server[32];     /* "valkey 8.1.1" */

    unsigned                         exiting:1;
    unsigned                         script_refused:1;
    unsigned                         valkey:1;
    unsigned                         mixed:1;        /* Redis and Valkey */

    /* what the layer above learned of the server: it refused SET NX GET
       (Redis 6.2); it has no compare-and-set and was told so; it refused
       a compare-and-delete (an ACL without DELIFEQ or DELEX) */
    unsigned                         nx_get_refused:1;
    unsigned                         cas_missing:1;
    unsigned                         del_refused:1;

    /* when the compare-and-delete was last refused: asked again later */
    ngx_msec_t                       del_refused_at;

    /* the layer above's: nobody waits for its keys, a finish wakes none */
    unsigned                         quiet:1;
};


typedef void (*ngx_http_idempotency_reply_pt)(ngx_http_idempotency_op_t *op,
    redisReply *reply);


/* hiredis privdata: lives outside r->pool so late replies are harmless */
struct ngx_http_idempotency_op_s {
    ngx_http_idempotency_op_t       *next;       /* free list */
    ngx_http_idempotency_target_t   *redis;
    void                            *data;       /* the sender's; NULL:
                                                    nobody waits */
    ngx_http_idempotency_reply_pt    handler;
    ngx_http_idempotency_node_t     *node;       /* sent on */
    /*
     * a claim: copied into cmd, sent again on the next connection while
     * its sender waits (safe to send twice: it finds itself)
     */
    unsigned                         on_reconnect:1;
    unsigned                         resent:1;   /* was sent again */

    /* written at once, not at the end of the event loop's turn */
    unsigned                         urgent:1;

    /* the server may hold the reply this long (WAIT's timeout) */
    ngx_msec_t                       block;

    /* the key it is routed by (a cluster's slot): rkey_len 0, none */
    size_t                           rkey_len;
    u_char                           rkey[NGX_HTTP_IDEMPOTENCY_RKEY_MAX];

    /* node.c: the command as sent, when on_reconnect is set */
    size_t                           cmd_len;
    u_char                           cmd[NGX_HTTP_IDEMPOTENCY_RESEND_MAX];

    /* cluster.c: the command, owned by the op until its reply */
    u_char                          *buf;
    size_t                           buf_len;
    ngx_msec_t                       deadline;
    ngx_msec_t                       retry_at;
    ngx_msec_t                       backoff;
    ngx_uint_t                       redirects;
    unsigned                         asking:1;   /* sent after ASKING */

    /*
     * a store or release keeps its command's bytes in buf (keep_bytes);
     * node.c sends them again once after a lost connection, and resp.c
     * by EVAL of the script's text after a NOSCRIPT to its EVALSHA
     * (script)
     */
    ngx_str_t                       *script;
    unsigned                         keep_bytes:1;
};


typedef void (*ngx_http_idempotency_channel_pt)(
    ngx_http_idempotency_channel_t *ch);


/*
 * A channel of a subscriber (subscribe.c), by its name; the owner's data
 * (subscriber->size bytes) follows it and lives as long
 */
struct ngx_http_idempotency_channel_s {
    ngx_str_node_t                   sn;         /* the channel's name */
    ngx_http_idempotency_subscriber_t  *subscriber;
    void                            *data;       /* the owner's */
    ngx_queue_t                      dirty;      /* in subscriber->dirty */
    ngx_uint_t                       pending;    /* confirmations to come */
    ngx_http_idempotency_node_t     *node;       /* a cluster's subscriber */
    ngx_uint_t                       slot;       /* a cluster's */
    unsigned                         in_dirty:1;
    unsigned                         wanted:1;   /* by its owner */
    unsigned                         subscribed:1;   /* sent, not undone */
    unsigned                         confirmed:1;
};


/*
 * Sharded Pub/Sub of a target, per worker: made by its owner, which sets
 * the size of its data per channel and its handlers.  message: on a
 * confirmed channel; confirmed: a subscription took effect, and what was
 * published before it may be missed; gone: worker exit, the channel and
 * its data are freed next; refused: SSUBSCRIBE refused, the subscriber is
 * off (off) until a reload.
 */
struct ngx_http_idempotency_subscriber_s {
    ngx_http_idempotency_node_t      node;       /* standalone, Sentinel */
    ngx_rbtree_t                     tree;       /* of channels */
    ngx_rbtree_node_t                sentinel;
    ngx_queue_t                      dirty;
    ngx_event_t                      batch_ev;
    ngx_http_idempotency_shard_t    *shards;     /* a cluster's */

    size_t                           size;
    ngx_http_idempotency_channel_pt  message;
    ngx_http_idempotency_channel_pt  confirmed;
    ngx_http_idempotency_channel_pt  gone;
    void                           (*refused)(
                                       ngx_http_idempotency_subscriber_t *sub,
                                       redisReply *reply);

    unsigned                         off:1;      /* refused */
};


/* a cluster's subscriber: one per master, per worker */
struct ngx_http_idempotency_shard_s {
    ngx_http_idempotency_node_t      node;       /* first: a node_t * */
    ngx_http_idempotency_shard_t    *next;
};


/*
 * What the client tells the layers above of its targets
 * (metrics_events.c counts them), set at configuration; by default nobody
 * listens.  A cluster master's entry is whatever master_add() returned.
 */
typedef struct {
    void                          (*up)(ngx_http_idempotency_target_t *redis);
    void                          (*down)(ngx_http_idempotency_target_t *redis);
    void                         *(*master_add)(
                                      ngx_http_idempotency_target_t *redis,
                                      ngx_str_t *name);
    void                          (*master_del)(void *entry);
    void                          (*master_up)(void *entry, ngx_uint_t up);
} ngx_http_idempotency_redis_events_t;


extern ngx_http_idempotency_redis_events_t  ngx_http_idempotency_redis_events;

/* set at configuration by the layer whose ops extend the client's */
extern size_t  ngx_http_idempotency_op_size;

/* the scripts every connection loads ahead of its commands (SCRIPT LOAD) */
extern ngx_str_t   *ngx_http_idempotency_redis_scripts;
extern ngx_uint_t   ngx_http_idempotency_redis_nscripts;


/* the topologies */
extern ngx_http_idempotency_topology_t
    ngx_http_idempotency_standalone_topology;
extern ngx_http_idempotency_topology_t  ngx_http_idempotency_sentinel_topology;
extern ngx_http_idempotency_topology_t
    ngx_http_idempotency_sentinels_topology;
extern ngx_http_idempotency_topology_t  ngx_http_idempotency_cluster_topology;

/* target.c: a target in a worker, the standalone topology */
ngx_int_t ngx_http_idempotency_redis_init(ngx_cycle_t *cycle,
    ngx_http_idempotency_target_t *redis);
void ngx_http_idempotency_redis_exit(ngx_http_idempotency_target_t *redis);
ngx_int_t ngx_http_idempotency_standalone_init(ngx_cycle_t *cycle,
    ngx_http_idempotency_target_t *redis);
ngx_int_t ngx_http_idempotency_standalone_command(
    ngx_http_idempotency_op_t *op, int argc, const char **argv,
    const size_t *argvlen);
ngx_http_idempotency_node_t *ngx_http_idempotency_redis_node(
    ngx_cycle_t *cycle, ngx_http_idempotency_target_t *redis);
void ngx_http_idempotency_target_up(ngx_http_idempotency_node_t *node);
void ngx_http_idempotency_target_closed(ngx_http_idempotency_node_t *node);
void ngx_http_idempotency_redis_node_exit(
    ngx_http_idempotency_target_t *redis);
void ngx_http_idempotency_redis_node_load_script(
    ngx_http_idempotency_target_t *redis);
ngx_int_t ngx_http_idempotency_redis_command(ngx_http_idempotency_op_t *op,
    int argc, const char **argv, const size_t *argvlen);
ngx_int_t ngx_http_idempotency_redis_command_kept(
    ngx_http_idempotency_op_t *op);
void ngx_http_idempotency_redis_load_script(
    ngx_http_idempotency_target_t *redis);
ngx_int_t ngx_http_idempotency_redis_master(
    ngx_http_idempotency_target_t *redis, ngx_uint_t *at,
    ngx_http_idempotency_node_t **node);

/* node.c: a node's ops, FIFO, timers and reconnect */
ngx_http_idempotency_op_t *ngx_http_idempotency_op_alloc(
    ngx_http_idempotency_target_t *redis);
void ngx_http_idempotency_op_free(ngx_http_idempotency_op_t *op);
void ngx_http_idempotency_ops_done(void);
void ngx_http_idempotency_redis_reset(ngx_http_idempotency_target_t *redis);
ngx_int_t ngx_http_idempotency_node_reply(ngx_http_idempotency_node_t *node,
    redisReply *reply);
void ngx_http_idempotency_node_closed(ngx_http_idempotency_node_t *node);
ngx_int_t ngx_http_idempotency_node_command(ngx_http_idempotency_node_t *node,
    ngx_http_idempotency_op_t *op, int argc, const char **argv,
    const size_t *argvlen);
void ngx_http_idempotency_node_init(ngx_http_idempotency_node_t *node,
    ngx_http_idempotency_target_t *redis, ngx_log_t *log,
    ngx_http_idempotency_node_owner_t *owner);
void ngx_http_idempotency_node_schedule(ngx_http_idempotency_node_t *node);
void ngx_http_idempotency_redis_connect(ngx_http_idempotency_node_t *node);
void ngx_http_idempotency_node_queue(ngx_http_idempotency_node_t *node,
    ngx_http_idempotency_op_t *op);
void ngx_http_idempotency_node_resend(ngx_http_idempotency_node_t *node);
void ngx_http_idempotency_node_reset(ngx_http_idempotency_node_t *node);

/* handshake.c: what a new connection asks first, and its replies */
ngx_uint_t ngx_http_idempotency_redis_forbidden(redisReply *reply);
ngx_uint_t ngx_http_idempotency_reply_passing(redisReply *reply,
    ngx_uint_t busy);
void ngx_http_idempotency_node_load_script(
    ngx_http_idempotency_node_t *node);
void ngx_http_idempotency_redis_handshake(
    ngx_http_idempotency_node_t *node);
void ngx_http_idempotency_ask_handler(ngx_event_t *ev);

/* resp.c: commands as RESP bytes, and EVALSHA rewritten into EVAL */
size_t ngx_http_idempotency_format_len(int argc, const size_t *argvlen);
u_char *ngx_http_idempotency_decimal(u_char *p, size_t n);
u_char *ngx_http_idempotency_format(u_char *p, int argc, const char **argv,
    const size_t *argvlen);
ngx_int_t ngx_http_idempotency_node_noscript(
    ngx_http_idempotency_node_t *node, ngx_http_idempotency_op_t *op);
ngx_int_t ngx_http_idempotency_resp_replace(ngx_http_idempotency_op_t *op,
    ngx_uint_t n, u_char *data, size_t len);
ngx_int_t ngx_http_idempotency_resp_keep(ngx_http_idempotency_op_t *op,
    u_char *data, size_t len);

/* target_conf.c: "idempotency_redis ..." into a target */
ngx_http_idempotency_target_t *ngx_http_idempotency_target_conf(ngx_conf_t *cf,
    ngx_array_t *servers, ngx_uint_t can_tls);
ngx_http_idempotency_target_t *ngx_http_idempotency_target_add(ngx_conf_t *cf,
    ngx_array_t *servers, ngx_str_t *addr, ngx_uint_t db, ngx_str_t *user,
    ngx_str_t *password, ngx_uint_t tls);

/* sentinel.c: the master of a Redis Sentinel setup */
ngx_http_idempotency_target_t *ngx_http_idempotency_sentinel_conf(
    ngx_conf_t *cf, ngx_str_t *args, ngx_uint_t naddrs, ngx_uint_t nargs,
    ngx_uint_t db, ngx_str_t *user, ngx_str_t *password, ngx_uint_t tls,
    ngx_array_t *servers);

/*
 * cluster_map.c: a cluster's seeds, nodes and slot map for
 * "idempotency_redis ... cluster" (cluster.h has its types)
 */
ngx_int_t ngx_http_idempotency_cluster_conf(ngx_conf_t *cf,
    ngx_http_idempotency_target_t *redis, ngx_str_t *addrs, ngx_uint_t n);
ngx_int_t ngx_http_idempotency_cluster_conf_seeds(ngx_conf_t *cf,
    ngx_http_idempotency_target_t *redis, ngx_resolver_t *resolver,
    ngx_msec_t resolver_timeout);
ngx_int_t ngx_http_idempotency_cluster_init(ngx_cycle_t *cycle,
    ngx_http_idempotency_target_t *redis);
void ngx_http_idempotency_cluster_exit(ngx_http_idempotency_target_t *redis);
ngx_http_idempotency_cnode_t *ngx_http_idempotency_cluster_node_at(
    ngx_http_idempotency_cluster_t *cl, u_char *host, size_t len,
    ngx_int_t port, ngx_http_idempotency_node_t *from);
void ngx_http_idempotency_cluster_use(ngx_http_idempotency_cnode_t *cn);
void ngx_http_idempotency_cluster_refresh(ngx_http_idempotency_cluster_t *cl);
void ngx_http_idempotency_cluster_slots_done(ngx_http_idempotency_op_t *op,
    redisReply *reply);

/* cluster.c: a cluster's router, its redirects and its waiting commands */
uint16_t ngx_http_idempotency_cluster_slot(u_char *key, size_t len);
ngx_int_t ngx_http_idempotency_cluster_send(ngx_http_idempotency_node_t *node,
    ngx_http_idempotency_op_t *op, u_char *cmd, size_t len);
void ngx_http_idempotency_cluster_done(ngx_http_idempotency_op_t *op);
void ngx_http_idempotency_cluster_retry_handler(ngx_event_t *ev);
ngx_http_idempotency_node_t *ngx_http_idempotency_cluster_master(
    ngx_http_idempotency_target_t *redis, ngx_uint_t slot);
void ngx_http_idempotency_cluster_moved(ngx_http_idempotency_node_t *from,
    u_char *p, size_t len);

/* conn.c: one connection, its bytes and its replies */
ngx_int_t ngx_http_idempotency_conf_addrs(ngx_conf_t *cf, ngx_str_t *addr,
    in_port_t port, const char *what, ngx_array_t *addrs);
ngx_int_t ngx_http_idempotency_conn_conf(ngx_conf_t *cf,
    ngx_http_idempotency_target_t *redis, ngx_resolver_t *resolver,
    ngx_msec_t resolver_timeout);
ngx_int_t ngx_http_idempotency_conn_open(ngx_http_idempotency_node_t *node);
void ngx_http_idempotency_conn_start(ngx_http_idempotency_node_t *node);
void ngx_http_idempotency_conn_ready(ngx_http_idempotency_node_t *node);
void ngx_http_idempotency_conn_fail(ngx_http_idempotency_node_t *node,
    ngx_err_t err, const char *what);
void ngx_http_idempotency_conn_close(ngx_http_idempotency_node_t *node);
void ngx_http_idempotency_conn_flush(ngx_http_idempotency_node_t *node);
void ngx_http_idempotency_conn_push(ngx_http_idempotency_node_t *node);
u_char *ngx_http_idempotency_conn_reserve(ngx_http_idempotency_node_t *node,
    size_t len);
ngx_int_t ngx_http_idempotency_conn_write_now(
    ngx_http_idempotency_node_t *node, u_char *buf, size_t len);
void ngx_http_idempotency_conn_free(ngx_http_idempotency_node_t *node);

/* subscribe.c: sharded Pub/Sub */
ngx_http_idempotency_subscriber_t *ngx_http_idempotency_subscriber_create(
    ngx_http_idempotency_target_t *redis);
ngx_http_idempotency_channel_t *ngx_http_idempotency_subscriber_channel(
    ngx_http_idempotency_subscriber_t *n, ngx_str_t *name, ngx_uint_t create);
void ngx_http_idempotency_subscribe(ngx_http_idempotency_channel_t *ch);
void ngx_http_idempotency_subscribe_again(ngx_http_idempotency_channel_t *ch);
void ngx_http_idempotency_unsubscribe(ngx_http_idempotency_channel_t *ch);
void ngx_http_idempotency_subscriber_node(ngx_http_idempotency_node_t *node,
    ngx_http_idempotency_target_t *redis);
ngx_int_t ngx_http_idempotency_subscriber_addr(
    ngx_http_idempotency_node_t *node, ngx_addr_t *m);
void ngx_http_idempotency_subscriber_dirty(
    ngx_http_idempotency_subscriber_t *n, ngx_http_idempotency_channel_t *ch);
void ngx_http_idempotency_subscriber_free(
    ngx_http_idempotency_subscriber_t *n, ngx_http_idempotency_channel_t *ch);

/* subscribe_shard.c: a cluster's subscribers, one per master */
void ngx_http_idempotency_subscriber_cluster_batch(
    ngx_http_idempotency_subscriber_t *n);
void ngx_http_idempotency_subscriber_reset(
    ngx_http_idempotency_subscriber_t *n, ngx_http_idempotency_node_t *node,
    ngx_int_t slot);
ngx_uint_t ngx_http_idempotency_subscriber_cluster_error(
    ngx_http_idempotency_subscriber_t *n, ngx_http_idempotency_node_t *node,
    redisReply *reply);

/* input.c: received bytes into replies */
void ngx_http_idempotency_input_init(ngx_http_idempotency_node_t *node);
u_char *ngx_http_idempotency_input_buf(ngx_http_idempotency_node_t *node,
    size_t *size);
ngx_int_t ngx_http_idempotency_input(ngx_http_idempotency_node_t *node,
    size_t n);
void ngx_http_idempotency_input_reset(ngx_http_idempotency_node_t *node);

/* tls.c */
char *ngx_http_idempotency_tls_merge(ngx_conf_t *cf,
    ngx_http_idempotency_target_t *redis, ngx_http_idempotency_tls_conf_t *tc);
ngx_uint_t ngx_http_idempotency_is_ip(ngx_str_t *host);
#if (NGX_SSL)
void ngx_http_idempotency_tls_start(ngx_http_idempotency_node_t *node);
#endif


#endif /* _NGX_HTTP_IDEMPOTENCY_REDIS_H_INCLUDED_ */
