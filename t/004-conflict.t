# Concurrency (SPEC §2.6-7): in-flight duplicates get 409, or wait for the
# original with idempotency_wait; an expired lock can be taken over.
use Test::Nginx::Socket 'no_plan';

use lib 't/lib';
use IdemTest;

run_tests();

__DATA__

=== TEST 1: a duplicate while the first is running gets 409 with Retry-After
--- config
    location = /fanout {
        echo_subrequest_async POST /p -b 'same';
        echo_sleep 0.3;
        echo_subrequest_async POST /p -b 'same';
    }
    location = /p {
        proxy_set_header Idempotency-Key conflict-1;
        proxy_pass http://127.0.0.1:$TEST_NGINX_SERVER_PORT/pay;
    }
    location = /pay {
        idempotency on;
        proxy_pass http://127.0.0.1:$TEST_NGINX_SERVER_PORT/slow;
    }
    location = /slow {
        access_log logs/error.log backend;
        echo_sleep 1;
        echo "done";
    }
--- request
GET /fanout
--- response_body_like chomp
\Adone\n\{"type":"about:blank","title":"A request is outstanding for this Idempotency-Key","status":409,"detail":"[^"]+","code":"request-in-progress","error":\{"type":"idempotency_error","code":"request-in-progress","message":"[^"]+"\}\}\n\z
--- grep_error_log eval: qr/BACKEND-EXEC \S+/
--- grep_error_log_out
BACKEND-EXEC /slow
--- timeout: 5



=== TEST 2: with idempotency_wait the duplicate waits and gets the replay
--- config
    location = /fanout {
        echo_subrequest_async POST /p -b 'same';
        echo_sleep 0.3;
        echo_subrequest_async POST /p -b 'same';
    }
    location = /p {
        proxy_set_header Idempotency-Key conflict-2;
        proxy_pass http://127.0.0.1:$TEST_NGINX_SERVER_PORT/pay;
    }
    location = /pay {
        idempotency on;
        idempotency_wait 3s;
        add_header X-Idem $idempotency_status always;
        proxy_pass http://127.0.0.1:$TEST_NGINX_SERVER_PORT/slow;
    }
    location = /slow {
        access_log logs/error.log backend;
        echo_sleep 1;
        echo "done $request_id";
    }
--- request
GET /fanout
--- response_body_like chomp
\Adone (\w+)\ndone \1\n\z
--- grep_error_log eval: qr/BACKEND-EXEC \S+/
--- grep_error_log_out
BACKEND-EXEC /slow
--- timeout: 6



=== TEST 3: a wait shorter than the original still ends in 409
--- config
    location = /fanout {
        echo_subrequest_async POST /p -b 'same';
        echo_sleep 0.2;
        echo_subrequest_async POST /p -b 'same';
    }
    location = /p {
        proxy_set_header Idempotency-Key conflict-3;
        proxy_pass http://127.0.0.1:$TEST_NGINX_SERVER_PORT/pay;
    }
    location = /pay {
        idempotency on;
        idempotency_wait 300ms;
        proxy_pass http://127.0.0.1:$TEST_NGINX_SERVER_PORT/slow;
    }
    location = /slow {
        echo_sleep 1.5;
        echo "done";
    }
--- request
GET /fanout
--- response_body_like chomp
\Adone\n\{.*"code":"request-in-progress","error":\{"type":"idempotency_error","code":"request-in-progress","message":"[^"]+"\}\}\n\z
--- timeout: 6



=== TEST 4: idempotency_lock_ttl: the lease of an owner slower than the lock
is renewed, so a duplicate after the lock's time still gets 409 and the
request runs once
--- config
    location = /fanout {
        echo_subrequest_async POST /p -b 'same';
        echo_sleep 1.3;
        echo_subrequest_async POST /p -b 'same';
    }
    location = /p {
        proxy_set_header Idempotency-Key conflict-4;
        proxy_pass http://127.0.0.1:$TEST_NGINX_SERVER_PORT/pay;
    }
    location = /pay {
        idempotency on;
        idempotency_lock_ttl 1s;
        idempotency_redis_timeout 300ms;
        proxy_pass http://127.0.0.1:$TEST_NGINX_SERVER_PORT/slow;
    }
    location = /slow {
        access_log logs/error.log backend;
        echo_sleep 2;
        echo "run $request_id";
    }
--- request
GET /fanout
--- response_body_like chomp
\Arun \w+\n\{.*"code":"request-in-progress","error":\{"type":"idempotency_error","code":"request-in-progress","message":"[^"]+"\}\}\n\z
--- grep_error_log eval: qr/BACKEND-EXEC \S+/
--- grep_error_log_out
BACKEND-EXEC /slow
--- timeout: 8



=== TEST 5: a duplicate that waits longer than idempotency_redis_timeout still gets the replay
--- config
    location = /fanout {
        echo_subrequest_async POST /p -b 'same';
        echo_sleep 0.3;
        echo_subrequest_async POST /p -b 'same';
    }
    location = /p {
        proxy_set_header Idempotency-Key conflict-5;
        proxy_pass http://127.0.0.1:$TEST_NGINX_SERVER_PORT/pay;
    }
    location = /pay {
        idempotency on;
        idempotency_wait 5s;
        idempotency_redis_timeout 200ms;
        add_header X-Idem $idempotency_status always;
        proxy_pass http://127.0.0.1:$TEST_NGINX_SERVER_PORT/slow;
    }
    location = /slow {
        access_log logs/error.log backend;
        echo_sleep 1.5;
        echo "done $request_id";
    }
--- request
GET /fanout
--- response_body_like chomp
\Adone (\w+)\ndone \1\n\z
--- grep_error_log eval: qr/BACKEND-EXEC \S+|redis "[^"]*" timed out/
--- grep_error_log_out
BACKEND-EXEC /slow
--- timeout: 8
