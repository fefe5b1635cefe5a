# idempotency_dry_run: keys are parsed, claimed and stored as usual, but
# every request proceeds as if the module were off; $idempotency_status
# says what would have happened.  $connection_requests tells a run from a
# replay.
use Test::Nginx::Socket 'no_plan';

use lib 't/lib';
use IdemTest;

run_tests();

__DATA__

=== TEST 1: replay and mismatch run the upstream; the status says what would have happened
--- config
    location = /pay {
        idempotency on;
        idempotency_dry_run on;
        add_header X-Idem $idempotency_status always;
        proxy_pass http://127.0.0.1:$TEST_NGINX_SERVER_PORT/backend;
    }
    location = /backend {
        return 201 "ran $connection_requests\n";
    }
--- more_headers
Idempotency-Key: dry-1
--- pipelined_requests eval
["POST /pay\n{\"a\":1}", "POST /pay\n{\"a\":1}", "POST /pay\n{\"a\":2}"]
--- error_code eval
[201, 201, 201]
--- response_headers eval
["X-Idem: new", "X-Idem: replay\n!Idempotent-Replayed",
 "X-Idem: mismatch\n!Content-Type: application/problem+json"]
--- response_body eval
["ran 1\n", "ran 1\n", "ran 1\n"]



=== TEST 2: what a dry run stored is replayed once protection is on
--- config
    location = /pay {
        idempotency on;
        add_header X-Idem $idempotency_status always;
        proxy_pass http://127.0.0.1:$TEST_NGINX_SERVER_PORT/backend;
    }
--- more_headers
Idempotency-Key: dry-1
--- request
POST /pay
{"a":1}
--- error_code: 201
--- response_headers
X-Idem: replay
Idempotent-Replayed: true



=== TEST 3: a missing key passes through
--- config
    location = /pay {
        idempotency on;
        idempotency_required on;
        idempotency_dry_run on;
        add_header X-Idem $idempotency_status always;
        proxy_pass http://127.0.0.1:$TEST_NGINX_SERVER_PORT/backend;
    }
--- request
POST /pay
x
--- error_code: 201
--- response_headers
X-Idem: missing



=== TEST 4: an invalid key passes through; the reason is logged
--- config
    location = /pay {
        idempotency on;
        idempotency_dry_run on;
        add_header X-Idem $idempotency_status always;
        proxy_pass http://127.0.0.1:$TEST_NGINX_SERVER_PORT/backend;
    }
--- more_headers
Idempotency-Key: "unterminated
--- request
POST /pay
x
--- error_code: 201
--- response_headers
X-Idem: invalid
--- error_log
key rejected: not a quoted string or a token of printable ASCII, 13 bytes



=== TEST 5: Redis down with reject: the request runs, the status is error
--- http_config
    idempotency_redis 127.0.0.1:1;
--- config
    location = /pay {
        idempotency on;
        idempotency_dry_run on;
        add_header X-Idem $idempotency_status always;
        proxy_pass http://127.0.0.1:$TEST_NGINX_SERVER_PORT/backend;
    }
--- more_headers
Idempotency-Key: dry-5
--- request
POST /pay
x
--- error_code: 201
--- response_headers
X-Idem: error
--- no_error_log
[alert]
[crit]



=== TEST 6: a key too long: the reason reaches the operator, not the key
--- config
    location = /pay {
        idempotency on;
        idempotency_key_max_length 8;
        proxy_pass http://127.0.0.1:$TEST_NGINX_SERVER_PORT/backend;
    }
--- more_headers
Idempotency-Key: secret-key-too-long
--- request
POST /pay
x
--- error_code: 400
--- error_log
key rejected: longer than idempotency_key_max_length, 19 bytes
--- no_error_log eval
[qr/\[info\].*secret-key-too-long/, "[error]"]



=== TEST 7: several key headers: the reason reaches the operator
--- config
    location = /pay {
        idempotency on;
        proxy_pass http://127.0.0.1:$TEST_NGINX_SERVER_PORT/backend;
    }
--- more_headers
Idempotency-Key: a
Idempotency-Key: b
--- request
POST /pay
x
--- error_code: 400
--- error_log
key rejected: several Idempotency-Key headers
