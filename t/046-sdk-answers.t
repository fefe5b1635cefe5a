# Answers client libraries understand: the "error" member of every problem
# (idempotency_error, api_error for 503 and outcome-unknown), the retry
# hints x-should-retry / Stripe-Should-Retry on every answer the module
# makes itself, their switches, and Idempotency-Expires.
use Test::Nginx::Socket 'no_plan';

use lib 't/lib';
use IdemTest;

run_tests();

__DATA__

=== TEST 1: 422: an error member of type idempotency_error, told not to retry
--- config
    location = /pay {
        idempotency on;
        proxy_pass http://127.0.0.1:$TEST_NGINX_SERVER_PORT/backend;
    }
--- more_headers
Idempotency-Key: sdk-1
--- pipelined_requests eval
["POST /pay\na", "POST /pay\nb"]
--- error_code eval
[201, 422]
--- response_headers eval
["!x-should-retry", "x-should-retry: false\nStripe-Should-Retry: false\n!Retry-After"]
--- response_body_like eval
[qr/^ok$/, qr/^\{.*"code":"key-reused","error":\{"type":"idempotency_error","code":"key-reused","message":"This key was used for a different request[^"]*"\}\}$/]



=== TEST 2: 400: told not to retry
--- config
    location = /pay {
        idempotency on;
        proxy_pass http://127.0.0.1:$TEST_NGINX_SERVER_PORT/backend;
    }
--- more_headers
Idempotency-Key: "unterminated
--- request
POST /pay
x
--- error_code: 400
--- response_headers
x-should-retry: false
Stripe-Should-Retry: false
--- response_body_like chomp
"error":\{"type":"idempotency_error","code":"invalid-key"



=== TEST 3: 503: api_error, Retry-After, told to retry
--- http_config
    idempotency_redis 127.0.0.1:1;
--- config
    location = /pay {
        idempotency on;
        idempotency_redis_timeout 200ms;
        proxy_pass http://127.0.0.1:$TEST_NGINX_SERVER_PORT/backend;
    }
--- more_headers
Idempotency-Key: sdk-5
--- request
POST /pay
x
--- error_code: 503
--- response_headers
Retry-After: 1
x-should-retry: true
Stripe-Should-Retry: true
--- response_body_like chomp
"error":\{"type":"api_error","code":"store-unavailable","message":"The request was not executed
--- no_error_log
[alert]
[crit]



=== TEST 4: idempotency_retry_hints off and idempotency_problem_error_member
off: a bare RFC 9457 document, Retry-After stays
--- http_config
    idempotency_redis 127.0.0.1:1;
--- config
    location = /pay {
        idempotency on;
        idempotency_redis_timeout 200ms;
        idempotency_retry_hints off;
        idempotency_problem_error_member off;
        proxy_pass http://127.0.0.1:$TEST_NGINX_SERVER_PORT/backend;
    }
--- more_headers
Idempotency-Key: sdk-6
--- request
POST /pay
x
--- error_code: 503
--- response_headers
Retry-After: 1
!x-should-retry
!Stripe-Should-Retry
--- response_body_like chomp
\A\{"type":"about:blank","title":"[^"]+","status":503,"detail":"[^"]+","code":"store-unavailable"\}\n\z
--- no_error_log
[alert]
[crit]



=== TEST 5: a replayed 500 is final
--- config
    location = /pay {
        idempotency on;
        proxy_pass http://127.0.0.1:$TEST_NGINX_SERVER_PORT/b500;
    }
    location = /b500 { return 500 "failed\n"; }
--- more_headers
Idempotency-Key: sdk-7
--- pipelined_requests eval
["POST /pay\nx", "POST /pay\nx"]
--- error_code eval
[500, 500]
--- response_headers eval
["x-should-retry: false\nStripe-Should-Retry: false\n!Idempotent-Replayed", "Idempotent-Replayed: true\nx-should-retry: false\nStripe-Should-Retry: false"]



=== TEST 5a: an upstream's own hint on a stored 500 is not contradicted
--- config
    location = /pay {
        idempotency on;
        proxy_pass http://127.0.0.1:$TEST_NGINX_SERVER_PORT/b500;
    }
    location = /b500 {
        add_header x-should-retry true always;
        return 500 "failed\n";
    }
--- more_headers
Idempotency-Key: sdk-7a
--- request
POST /pay
x
--- error_code: 500
--- response_headers
x-should-retry: true
!Stripe-Should-Retry



=== TEST 5aa: a 500 that is not stored is not told final
--- config
    location = /pay {
        idempotency on;
        idempotency_store_status 2xx;
        proxy_pass http://127.0.0.1:$TEST_NGINX_SERVER_PORT/b500;
    }
    location = /b500 { return 500 "failed\n"; }
--- more_headers
Idempotency-Key: sdk-7aa
--- request
POST /pay
x
--- error_code: 500
--- response_headers
!x-should-retry
!Stripe-Should-Retry



=== TEST 5b: ...and with idempotency_retry_hints off it is not marked
--- config
    location = /pay {
        idempotency on;
        idempotency_retry_hints off;
        proxy_pass http://127.0.0.1:$TEST_NGINX_SERVER_PORT/b500;
    }
    location = /b500 { return 500 "failed\n"; }
--- more_headers
Idempotency-Key: sdk-7b
--- pipelined_requests eval
["POST /pay\nx", "POST /pay\nx"]
--- error_code eval
[500, 500]
--- response_headers eval
["!x-should-retry", "Idempotent-Replayed: true\n!x-should-retry\n!Stripe-Should-Retry"]



=== TEST 6: Idempotency-Expires: on the first response and, the same date,
on its replay; now + idempotency_ttl
--- config
    location = /pay {
        idempotency on;
        idempotency_ttl 1h;
        idempotency_expires_header on;
        proxy_pass http://127.0.0.1:$TEST_NGINX_SERVER_PORT/backend;
    }
--- more_headers
Idempotency-Key: sdk-8
--- pipelined_requests eval
["POST /pay\nx", "POST /pay\nx"]
--- error_code eval
[201, 201]
--- response_headers_like eval
["Idempotency-Expires: \\w{3}, \\d\\d \\w{3} \\d{4} \\d\\d:\\d\\d:\\d\\d GMT", "Idempotency-Expires: \\w{3}, \\d\\d \\w{3} \\d{4} \\d\\d:\\d\\d:\\d\\d GMT"]



=== TEST 7: Idempotency-Expires is not on a response that is not stored
--- config
    location = /pay {
        idempotency on;
        idempotency_expires_header on;
        proxy_pass http://127.0.0.1:$TEST_NGINX_SERVER_PORT/b503;
    }
    location = /b503 { return 503 "later\n"; }
--- more_headers
Idempotency-Key: sdk-9
--- request
POST /pay
x
--- error_code: 503
--- response_headers
!Idempotency-Expires



=== TEST 8: ...nor on the module's own answers
--- config
    location = /pay {
        idempotency on;
        idempotency_expires_header on;
        proxy_pass http://127.0.0.1:$TEST_NGINX_SERVER_PORT/backend;
    }
--- more_headers
Idempotency-Key: sdk-10
--- pipelined_requests eval
["POST /pay\na", "POST /pay\nb"]
--- error_code eval
[201, 422]
--- response_headers_like eval
["Idempotency-Expires: .+ GMT", ""]
--- response_headers eval
["", "!Idempotency-Expires"]
