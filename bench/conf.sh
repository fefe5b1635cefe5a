# bench/conf.sh: what bench/run.sh and bench/profile.sh share (sourced):
# request bodies and the nginx configurations of the stand-in API and of
# the two edges, so that the profile measures the shapes the bench runs.

# body FILE SIZE: a JSON object of exactly SIZE bytes
body() {
    local head='{"amount":1000,"currency":"EUR","customer":"cus_bench","description":"'
    local pad=$(($2 - ${#head} - 2))
    { printf '%s' "$head"; head -c "$pad" /dev/zero | tr '\0' x; printf '"}'; } > "$1"
}

# upstream_conf DIR PORT WORKERS: the stand-in API in DIR/upstream, as
# cheap as nginx can answer, so that it is not what is measured
upstream_conf() {
    cat > "$1/upstream/nginx.conf" <<EOF
worker_processes $3;
worker_rlimit_nofile 16384;
pid $1/upstream/nginx.pid;
error_log $1/upstream/error.log warn;
events { worker_connections 8192; }
http {
    access_log off;
    log_format keys '\$http_idempotency_key';
    client_body_buffer_size 128k;

    server {
        listen 127.0.0.1:$2 backlog=4096;

        # one line per request that reached the upstream, flushed by USR1
        access_log $1/upstream/requests.log keys buffer=256k;

        location / {
            default_type application/json;
            return 201 '{"id":"ok"}';
        }

        # a 256 KB answer to a POST: error_page turns the 405 into a 201
        # carrying the file (an internal redirect makes it a GET)
        location = /large {
            error_page 405 =201 /large.json;
            return 405;
        }

        location = /large.json {
            internal;
            root $1/www;
            default_type application/json;
        }
    }
}
EOF
}

# edge_conf DIR NAME PORT UPSTREAM_PORT HEAD MAP_INPUT MAP_KEYS LOCATION:
# an edge in DIR/NAME proxying to the upstream; HEAD goes before the
# events block (load_module, daemon); with MAP_INPUT set, requests whose
# MAP_INPUT is not one of MAP_KEYS are logged to NAME/bad.log
edge_conf() {
    local bad_map='' bad_log=''

    if [ -n "$6" ]; then
        bad_map="    map \"$6\" \$bench_bad {
$7
        default 1;
    }
    log_format bad '\$status \"$6\" \$request_method \$uri '
                   '\$http_idempotency_key';"
        bad_log="            access_log $1/$2/bad.log bad if=\$bench_bad;"
    fi

    cat > "$1/$2/nginx.conf" <<EOF
$5
worker_processes 1;
worker_rlimit_nofile 16384;
pid $1/$2/nginx.pid;
error_log $1/$2/error.log warn;
events { worker_connections 8192; }
http {
    access_log off;

$bad_map

    upstream backend {
        server 127.0.0.1:$4;
        # enough idle connections for the sweep's 1024 clients: with 32,
        # requests released together (claim replies read in one batch)
        # opened a new upstream connection each, and the sweep measured
        # connect() more than either edge
        keepalive 1024;
    }

    # the 64 KB request and the 256 KB response stay in memory on both edges
    client_body_buffer_size 128k;
    proxy_buffer_size 16k;
    proxy_buffers 32 16k;
    proxy_busy_buffers_size 64k;

    server {
        listen 127.0.0.1:$3 backlog=4096;

        # the bench reads the number of requests the edge handled here
        location = /bench-status {
            stub_status;
        }

        location / {
$bad_log
$8
            proxy_http_version 1.1;
            proxy_set_header Connection "";
            proxy_pass http://backend;
        }
    }
}
EOF
}
