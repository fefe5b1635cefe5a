
/*
 * Copyright (C) The ngx_http_idempotency_module authors
 *
 * The Redis Cluster topology's own types, shared by its two files and
 * seen by no other: the map (cluster_map.c) makes a worker's cluster and
 * its nodes and fills the slot map; the router (cluster.c) reads them to
 * send each command and keeps its waiting commands in the same struct.  To
 * the rest of the client a cluster is redis->cluster behind the topology's
 * table; the functions the two files call across are in redis.h.
 */


#ifndef _NGX_HTTP_IDEMPOTENCY_CLUSTER_H_INCLUDED_
#define _NGX_HTTP_IDEMPOTENCY_CLUSTER_H_INCLUDED_


#include "ngx_http_idempotency_redis.h"


#define NGX_HTTP_IDEMPOTENCY_SLOTS          16384
#define NGX_HTTP_IDEMPOTENCY_NO_NODE        0xffff
#define NGX_HTTP_IDEMPOTENCY_MAX_NODES      1024


struct ngx_http_idempotency_cnode_s {
    ngx_http_idempotency_node_t      node;       /* first: a node_t * */
    ngx_http_idempotency_cluster_t  *cluster;
    ngx_uint_t                       index;
    void                            *metric;     /* master_add(): in the map */
    unsigned                         master:1;   /* wanted: reconnected */
};


struct ngx_http_idempotency_cluster_s {
    ngx_http_idempotency_target_t   *redis;
    ngx_http_idempotency_cnode_t   **nodes;
    ngx_uint_t                       nnodes;
    ngx_uint_t                       next;       /* asked for the map next */

    /* ops waiting for the map, a connection or the end of a backoff */
    ngx_http_idempotency_op_t       *waiting;
    ngx_http_idempotency_op_t      **waiting_tail;

    ngx_event_t                      retry_ev;
    ngx_event_t                      refresh_ev;
    ngx_msec_t                       last_refresh;

    unsigned                         refreshing:1;   /* one in flight */
    unsigned                         known:1;    /* a map was learnt */
    unsigned                         refused:1;  /* logged once */
    unsigned                         asking_refused:1;
    unsigned                         no_resolver:1;  /* logged once */

    uint16_t                         slot_node[NGX_HTTP_IDEMPOTENCY_SLOTS];
};


#endif /* _NGX_HTTP_IDEMPOTENCY_CLUSTER_H_INCLUDED_ */
