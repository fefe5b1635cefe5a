# idempotency_key_pattern: an API that accepts only some keys (UUID v4,
# a minimum length) says so once, and a key of another form is refused
# before anything is claimed or sent upstream: 400 invalid-key, with the
# rule in the detail (escaped for JSON), one info line, nothing in Redis.
use Test::Nginx::Socket 'no_plan';

use lib 't/lib';
use IdemTest;

run_tests();

__DATA__

=== TEST 1: a UUID v4 key is claimed and replayed; another form gets 400 invalid-key, nothing upstream
--- config
    location = /pay {
        idempotency on;
        idempotency_key_pattern "^[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$";
        add_header X-Idem $idempotency_status always;
        proxy_pass http://127.0.0.1:$TEST_NGINX_SERVER_PORT/backend;
    }
    location = /backend {
        access_log logs/error.log backend;
        return 201 "charged\n";
    }
--- pipelined_requests eval
["POST /pay\n{\"amount\":10}", "POST /pay\n{\"amount\":10}",
 "POST /pay\n{\"amount\":10}", "POST /pay\n{\"amount\":10}"]
--- more_headers eval
["Idempotency-Key: 0f8fad5b-d9cb-469f-a165-70867728950e",
 "Idempotency-Key: 0f8fad5b-d9cb-469f-a165-70867728950e",
 "Idempotency-Key: order-42",
 "Idempotency-Key: 0f8fad5b-d9cb-169f-a165-70867728950e"]
--- error_code eval
[201, 201, 400, 400]
--- response_headers eval
["X-Idem: new", "X-Idem: replay",
 "X-Idem: invalid\nContent-Type: application/problem+json",
 "X-Idem: invalid\nContent-Type: application/problem+json"]
--- response_body_like eval
[qr/^charged$/, qr/^charged$/,
 qr/"detail":"The Idempotency-Key does not have the form this API accepts: it must match the pattern \^\[0-9a-f\]\{8\}-.*"code":"invalid-key"/s,
 qr/"status":400/]
--- grep_error_log eval: qr/BACKEND-EXEC \S+|key rejected: [a-z_ ]+/
--- grep_error_log_out eval
qr/\A(?:(?:BACKEND-EXEC \/backend\n)?(?:key rejected: does not match idempotency_key_pattern\n){2})?\z/



=== TEST 2: the pattern in the detail is escaped for JSON (backslashes, quotes)
--- config
    location = /pay {
        idempotency on;
        idempotency_key_pattern '^k\d{3,}"?$';
        proxy_pass http://127.0.0.1:$TEST_NGINX_SERVER_PORT/backend;
    }
    location = /backend {
        return 201 "ok\n";
    }
--- more_headers
Idempotency-Key: k12
--- request
POST /pay
{}
--- error_code: 400
--- response_body_like eval
qr/it must match the pattern \^k\\\\d\{3,\}\\"\?\$\."/
--- no_error_log
[error]



=== TEST 3: inherited from server{}, and a key that matches is the same key (quoted or not)
--- config
    idempotency_key_pattern "^[A-Za-z0-9_-]{8,64}$";

    location = /pay {
        idempotency on;
        add_header X-Idem $idempotency_status always;
        proxy_pass http://127.0.0.1:$TEST_NGINX_SERVER_PORT/backend;
    }
    location = /backend {
        return 201 "ok\n";
    }
--- pipelined_requests eval
["POST /pay\nx", "POST /pay\nx", "POST /pay\nx"]
--- more_headers eval
["Idempotency-Key: order_12345", "Idempotency-Key: \"order_12345\"",
 "Idempotency-Key: short"]
--- error_code eval
[201, 201, 400]
--- response_headers eval
["X-Idem: new", "X-Idem: replay", "X-Idem: invalid"]
