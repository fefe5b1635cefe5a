# Bad input (SPEC §2.3): every malformed key shape is a 400 that claims
# nothing; a body that never finishes claims nothing either.
use Test::Nginx::Socket 'no_plan';

use lib 't/lib';
use IdemTest;

run_tests();

__DATA__

=== TEST 1: keys of 256 and 10,000 characters, control bytes, DEL: 400
--- config
    large_client_header_buffers 4 16k;
    location = /pay {
        idempotency on;
        add_header X-Idem $idempotency_status always;
        proxy_pass http://127.0.0.1:$TEST_NGINX_SERVER_PORT/backend;
    }
--- pipelined_requests eval
["POST /pay\nx", "POST /pay\nx", "POST /pay\nx", "POST /pay\nx",
 "POST /pay\nx", "POST /pay\nx"]
--- more_headers eval
["Idempotency-Key: " . ("k" x 256),
 "Idempotency-Key: " . ("k" x 10000),
 "Idempotency-Key: \"a\tb\"",
 "Idempotency-Key: \"a\x7fb\"",
 "Idempotency-Key: a\x01b",
 "Idempotency-Key: \"a\\nb\""]
--- error_code eval
[400, 400, 400, 400, 400, 400]
--- response_headers eval
[("X-Idem: invalid") x 6]



=== TEST 2: 255 characters is the longest accepted key by default
--- config
    location = /pay {
        idempotency on;
        add_header X-Idem $idempotency_status always;
        proxy_pass http://127.0.0.1:$TEST_NGINX_SERVER_PORT/backend;
    }
--- more_headers eval
"Idempotency-Key: " . ("k" x 255)
--- request
POST /pay
x
--- error_code: 201
--- response_headers
X-Idem: new



=== TEST 3: a body that stops arriving: 408 after client_body_timeout
--- config
    location = /pay {
        client_body_timeout 500ms;
        idempotency on;
        proxy_pass http://127.0.0.1:$TEST_NGINX_SERVER_PORT/backend;
    }
--- raw_request eval
"POST /pay HTTP/1.1\r
Host: localhost\r
Idempotency-Key: input-3\r
Content-Length: 10\r
Connection: close\r
\r
abc"
--- ignore_response
--- wait: 1
--- error_log
http finalize request: 408
--- no_error_log
[alert]
[crit]



=== TEST 4: the key of the timed-out body was never claimed
--- config
    location = /pay {
        idempotency on;
        add_header X-Idem $idempotency_status always;
        proxy_pass http://127.0.0.1:$TEST_NGINX_SERVER_PORT/backend;
    }
--- more_headers
Idempotency-Key: input-3
--- request
POST /pay
abcdefghij
--- error_code: 201
--- response_headers
X-Idem: new



=== TEST 5: a keep-alive pipeline mixing keys, methods and versions
--- config
    location = /pay {
        idempotency on;
        add_header X-Idem $idempotency_status always;
        proxy_pass http://127.0.0.1:$TEST_NGINX_SERVER_PORT/backend;
    }
--- pipelined_requests eval
["POST /pay\na", "POST /pay\nb", "GET /pay", "POST /pay\na", "POST /pay\nb"]
--- more_headers eval
["Idempotency-Key: input-5a", "Idempotency-Key: input-5b",
 "Idempotency-Key: input-5a", "Idempotency-Key: input-5a",
 "Idempotency-Key: input-5b"]
--- error_code eval
[201, 201, 201, 201, 201]
--- response_headers eval
["X-Idem: new", "X-Idem: new", "X-Idem: bypass", "X-Idem: replay",
 "X-Idem: replay"]
