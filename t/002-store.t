# What is stored (SPEC §3): status policy, hidden headers, exact bytes,
# the size limit and the too-large tombstone, record TTL.
use Test::Nginx::Socket 'no_plan';

use lib 't/lib';
use IdemTest;

run_tests();

__DATA__

=== TEST 1: an upstream's 500 is an answer: stored and replayed as final
(it may have committed before it failed)
--- config
    location = /pay {
        idempotency on;
        add_header X-Idem $idempotency_status always;
        proxy_pass http://127.0.0.1:$TEST_NGINX_SERVER_PORT/backend;
    }
    location = /backend {
        access_log logs/error.log backend;
        return 500 "boom\n";
    }
--- more_headers
Idempotency-Key: store-1
--- pipelined_requests eval
["POST /pay\nx", "POST /pay\nx"]
--- error_code eval
[500, 500]
--- response_headers eval
["X-Idem: new", "X-Idem: replay\nx-should-retry: false\nStripe-Should-Retry: false"]
--- response_body eval
["boom\n", "boom\n"]
--- grep_error_log eval: qr/BACKEND-EXEC \S+/
--- grep_error_log_out eval
qr/\A(?:BACKEND-EXEC \/backend\n)?\z/



=== TEST 1b: a 503 says nothing happened: released, and a retry runs again
--- config
    location = /pay {
        idempotency on;
        add_header X-Idem $idempotency_status always;
        proxy_pass http://127.0.0.1:$TEST_NGINX_SERVER_PORT/backend;
    }
    location = /backend {
        access_log logs/error.log backend;
        return 503 "later\n";
    }
--- more_headers
Idempotency-Key: store-1b
--- pipelined_requests eval
["POST /pay\nx", "POST /pay\nx"]
--- error_code eval
[503, 503]
--- response_headers eval
["X-Idem: new", "X-Idem: new"]
--- grep_error_log eval: qr/BACKEND-EXEC \S+/
--- grep_error_log_out eval
qr/\A(?:(?:BACKEND-EXEC \/backend\n){2})?\z/



=== TEST 2: 4xx are stored and replayed, 429 is not; a listed 500 is
--- config
    location /pay/ {
        idempotency on;
        idempotency_store_status 2xx 4xx 500;
        add_header X-Idem $idempotency_status always;
        proxy_pass http://127.0.0.1:$TEST_NGINX_SERVER_PORT/b/;
    }
    location = /b/402 { return 402 "declined\n"; }
    location = /b/429 { return 429 "slow down\n"; }
    location = /b/500 { return 500 "stored error\n"; }
--- pipelined_requests eval
["POST /pay/402\nx", "POST /pay/402\nx", "POST /pay/429\nx", "POST /pay/429\nx",
 "POST /pay/500\nx", "POST /pay/500\nx"]
--- more_headers eval
["Idempotency-Key: store-2a", "Idempotency-Key: store-2a",
 "Idempotency-Key: store-2b", "Idempotency-Key: store-2b",
 "Idempotency-Key: store-2c", "Idempotency-Key: store-2c"]
--- error_code eval
[402, 402, 429, 429, 500, 500]
--- response_headers eval
["X-Idem: new", "X-Idem: replay", "X-Idem: new", "X-Idem: new",
 "X-Idem: new", "X-Idem: replay"]
--- response_body eval
["declined\n", "declined\n", "slow down\n", "slow down\n",
 "stored error\n", "stored error\n"]



=== TEST 3: headers are replayed; Set-Cookie is not, unless passed
--- config
    location /pay/ {
        idempotency on;
        add_header X-Idem $idempotency_status always;
        proxy_pass http://127.0.0.1:$TEST_NGINX_SERVER_PORT/b/;
    }
    location /pass/ {
        idempotency on;
        idempotency_pass_header Set-Cookie;
        idempotency_hide_header X-Secret;
        proxy_pass http://127.0.0.1:$TEST_NGINX_SERVER_PORT/b/;
    }
    location /b/ {
        add_header Set-Cookie "session=abc";
        add_header X-Secret "s3cret";
        add_header X-Order "42";
        add_header Location "/orders/42";
        return 201 "created\n";
    }
--- pipelined_requests eval
["POST /pay/x\nx", "POST /pay/x\nx", "POST /pass/x\nx", "POST /pass/x\nx"]
--- more_headers eval
["Idempotency-Key: store-3a", "Idempotency-Key: store-3a",
 "Idempotency-Key: store-3b", "Idempotency-Key: store-3b"]
--- error_code eval
[201, 201, 201, 201]
--- response_headers eval
["Set-Cookie: session=abc\nX-Order: 42",
 "!Set-Cookie\nX-Secret: s3cret\nX-Order: 42\nContent-Type: text/plain\nLocation: /orders/42\nIdempotent-Replayed: true",
 "Set-Cookie: session=abc",
 "Set-Cookie: session=abc\n!X-Secret\nIdempotent-Replayed: true"]



=== TEST 4: a 1 MiB binary response is replayed byte for byte
--- config
    location = /pay {
        idempotency on;
        idempotency_store_max_size 2m;
        proxy_method GET;
        proxy_pass http://127.0.0.1:$TEST_NGINX_SERVER_PORT/blob.bin;
    }
--- user_files eval
">>> blob.bin\n" . CORE::join("", map { chr(($_ * 7 + 3) % 256) } 0 .. 1048575)
--- more_headers
Idempotency-Key: store-4
--- pipelined_requests eval
["POST /pay\nx", "POST /pay\nx"]
--- error_code eval
[200, 200]
--- response_body eval
[CORE::join("", map { chr(($_ * 7 + 3) % 256) } 0 .. 1048575),
 CORE::join("", map { chr(($_ * 7 + 3) % 256) } 0 .. 1048575)]
--- timeout: 10



=== TEST 5: a chunked response of unknown length is stored exactly
--- config
    location = /pay {
        idempotency on;
        add_header X-Idem $idempotency_status always;
        proxy_pass http://127.0.0.1:$TEST_NGINX_SERVER_PORT/backend;
        proxy_http_version 1.1;
    }
    location = /backend {
        echo -n "part one,";
        echo_flush;
        echo -n "part two";
    }
--- more_headers
Idempotency-Key: store-5
--- pipelined_requests eval
["POST /pay\nx", "POST /pay\nx"]
--- error_code eval
[200, 200]
--- response_headers eval
["X-Idem: new", "X-Idem: replay"]
--- response_body eval
["part one,part two", "part one,part two"]



=== TEST 6: larger than idempotency_store_max_size: passed through, then 409
--- config
    location = /pay {
        idempotency on;
        idempotency_store_max_size 1k;
        add_header X-Idem $idempotency_status always;
        proxy_method GET;
        proxy_pass http://127.0.0.1:$TEST_NGINX_SERVER_PORT/big.txt;
    }
--- user_files eval
">>> big.txt\n" . ("x" x 4096)
--- more_headers
Idempotency-Key: store-6
--- pipelined_requests eval
["POST /pay\nx", "POST /pay\nx"]
--- error_code eval
[200, 409]
--- response_headers eval
["X-Idem: new", "X-Idem: conflict\nContent-Type: application/problem+json"]
--- response_body_like eval
[qr/^x{4096}$/, qr/"code":"response-not-replayable"/]



=== TEST 7: the too-large check also holds for bodies of unknown length
--- config
    location = /pay {
        idempotency on;
        idempotency_store_max_size 1k;
        proxy_pass http://127.0.0.1:$TEST_NGINX_SERVER_PORT/backend;
    }
    location = /backend {
        echo_duplicate 300 "0123456789";
    }
--- more_headers
Idempotency-Key: store-7
--- pipelined_requests eval
["POST /pay\nx", "POST /pay\nx"]
--- error_code eval
[200, 409]
--- response_body_like eval
[qr/^(0123456789){300}$/, qr/"code":"response-not-replayable"/]



=== TEST 8: idempotency_ttl: a record expires and the key runs again
--- config
    location = /pay {
        idempotency on;
        idempotency_ttl 1s;
        add_header X-Idem $idempotency_status always;
        proxy_pass http://127.0.0.1:$TEST_NGINX_SERVER_PORT/backend;
    }
    location = /backend {
        return 200 "ok\n";
    }
--- more_headers
Idempotency-Key: store-8
--- init
sleep 0;
--- pipelined_requests eval
["POST /pay\nx", "POST /pay\nx"]
--- error_code eval
[200, 200]
--- response_headers eval
["X-Idem: new", "X-Idem: replay"]



=== TEST 9: after idempotency_ttl the same key is new again
--- config
    location = /pay {
        idempotency on;
        idempotency_ttl 1s;
        add_header X-Idem $idempotency_status always;
        proxy_pass http://127.0.0.1:$TEST_NGINX_SERVER_PORT/backend;
    }
    location = /backend {
        return 200 "ok\n";
    }
--- init
sleep 2;
--- more_headers
Idempotency-Key: store-8
--- request
POST /pay
x
--- error_code: 200
--- response_headers
X-Idem: new



=== TEST 10: a 206 is never stored; a stored 200 is replayed whole to a Range
--- config
    location = /pay {
        idempotency on;
        add_header X-Idem $idempotency_status always;
        proxy_method GET;
        proxy_pass http://127.0.0.1:$TEST_NGINX_SERVER_PORT/file.txt;
    }
--- user_files
>>> file.txt
0123456789
--- pipelined_requests eval
["POST /pay\nx", "POST /pay\nx", "POST /pay\nx"]
--- more_headers eval
["Idempotency-Key: store-10\nRange: bytes=0-3", "Idempotency-Key: store-10",
 "Idempotency-Key: store-10\nRange: bytes=0-3"]
--- error_code eval
[206, 200, 200]
--- response_headers eval
["X-Idem: new", "X-Idem: new", "X-Idem: replay"]
--- response_body eval
["0123", "0123456789\n", "0123456789\n"]



=== TEST 11: gzip is applied after capture: the record holds plain bytes
--- config
    location = /pay {
        idempotency on;
        gzip on;
        gzip_types text/plain;
        gzip_min_length 1;
        add_header X-Idem $idempotency_status always;
        proxy_pass http://127.0.0.1:$TEST_NGINX_SERVER_PORT/backend;
    }
    location = /backend {
        return 200 "a response long enough to be worth compressing\n";
    }
--- pipelined_requests eval
["POST /pay\nx", "POST /pay\nx", "POST /pay\nx"]
--- more_headers eval
["Idempotency-Key: store-11\nAccept-Encoding: gzip",
 "Idempotency-Key: store-11",
 "Idempotency-Key: store-11\nAccept-Encoding: gzip"]
--- error_code eval
[200, 200, 200]
--- response_headers eval
["X-Idem: new\nContent-Encoding: gzip",
 "X-Idem: replay\n!Content-Encoding",
 "X-Idem: replay\nContent-Encoding: gzip"]
--- response_body_like eval
[qr/^\x1f\x8b/, qr/^a response long enough to be worth compressing$/,
 qr/^\x1f\x8b/]



=== TEST 12: a client's If-None-Match never turns a stored 200 into a 304
--- config
    location = /pay {
        idempotency on;
        add_header X-Idem $idempotency_status always;
        proxy_set_header If-None-Match "";
        proxy_pass http://127.0.0.1:$TEST_NGINX_SERVER_PORT/tagged;
    }
    location = /tagged {
        add_header ETag '"v1"';
        return 200 "0123456789\n";
    }
--- pipelined_requests eval
["POST /pay\nx", "POST /pay\nx"]
--- more_headers
Idempotency-Key: store-12
If-None-Match: "v1"
--- error_code eval
[200, 200]
--- response_headers eval
["X-Idem: new\nETag: \"v1\"", "X-Idem: replay\nETag: \"v1\""]
--- response_body eval
["0123456789\n", "0123456789\n"]
