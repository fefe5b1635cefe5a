# Replay fidelity.  A too-large result says "do not retry" and carries no
# Retry-After, while an in-progress 409 keeps it.
use Test::Nginx::Socket 'no_plan';

use lib 't/lib';
use IdemTest;

# the log lines are checked after each pipelined response: all of them
check_accum_error_log();

run_tests();

__DATA__

=== TEST 1: a too-large result: 409 without Retry-After, "do not retry"
--- config
    location = /pay {
        idempotency on;
        idempotency_store_max_size 64;
        add_header X-Idem $idempotency_status always;
        proxy_pass http://127.0.0.1:$TEST_NGINX_SERVER_PORT/big;
    }
    location = /big {
        return 200 "a response that is larger than the store's limit of sixty-four bytes\n";
    }
--- more_headers
Idempotency-Key: big-1
--- pipelined_requests eval
["POST /pay\nx", "POST /pay\nx"]
--- error_code eval
[200, 409]
--- response_headers eval
["X-Idem: new", "X-Idem: conflict\n!Retry-After\nCache-Control: no-store\nContent-Type: application/problem+json"]
--- response_body_like eval
[qr/larger than/,
 qr/^\{"type":"about:blank","title":"The response for this Idempotency-Key cannot be replayed","status":409,"detail":"[^"]*the result cannot be replayed\. Do not retry the request with this key\.","code":"response-not-replayable"\}$/]
--- error_log
stored as too large
--- no_error_log
[error]



=== TEST 2: an in-progress 409 keeps Retry-After
--- http_config
    log_format ra 'RA $upstream_status $upstream_http_retry_after';
--- config
    location = /fanout {
        echo_subrequest_async POST /p -b 'same';
        echo_sleep 0.3;
        echo_subrequest_async POST /p -b 'same';
    }
    location = /p {
        log_subrequest on;
        access_log logs/error.log ra;
        proxy_set_header Idempotency-Key progress-1;
        proxy_pass http://127.0.0.1:$TEST_NGINX_SERVER_PORT/pay;
    }
    location = /pay {
        idempotency on;
        proxy_pass http://127.0.0.1:$TEST_NGINX_SERVER_PORT/slow;
    }
    location = /slow {
        echo_sleep 1;
        echo "done";
    }
--- request
GET /fanout
--- response_body_like chomp
"code":"request-in-progress"
--- grep_error_log eval: qr/RA \d+ \S*/
--- grep_error_log_out eval
qr/^RA 409 1$/m
--- timeout: 5
