# Replay fidelity: a replay goes through nginx's filters as the original
# did.  A Location is absolute again only where nginx made the original
# absolute; Content-Type parameters do not hide a replay from gzip_types,
# sub_filter_types or charset_types.  A too-large result says "do not
# retry" and carries no Retry-After, while an in-progress 409 keeps it.
use Test::Nginx::Socket 'no_plan';

use lib 't/lib';
use IdemTest;

# the log lines are checked after each pipelined response: all of them
check_accum_error_log();

run_tests();

__DATA__

=== TEST 1: a relative Location the upstream sent is replayed relative
--- config
    location /pay/ {
        idempotency on;
        add_header X-Idem $idempotency_status always;
        proxy_pass http://127.0.0.1:$TEST_NGINX_SERVER_PORT/b/;
    }
    location /b/ {
        add_header Location "/orders/42";
        return 201 "created\n";
    }
--- more_headers
Idempotency-Key: loc-1
--- pipelined_requests eval
["POST /pay/x\nx", "POST /pay/x\nx"]
--- error_code eval
[201, 201]
--- response_headers eval
["X-Idem: new", "X-Idem: replay"]
--- raw_response_headers_like eval
["\r\nLocation: /orders/42\r\n", "\r\nLocation: /orders/42\r\n"]



=== TEST 2: a Location nginx rewrote and made absolute is absolute again; without absolute_redirect both stay relative; an absolute one keeps its name
--- config
    location /pay/ {
        idempotency on;
        add_header X-Idem $idempotency_status always;
        proxy_pass http://127.0.0.1:$TEST_NGINX_SERVER_PORT/b/;
    }
    location /rel/ {
        idempotency on;
        absolute_redirect off;
        add_header X-Idem $idempotency_status always;
        proxy_pass http://127.0.0.1:$TEST_NGINX_SERVER_PORT/b/;
    }
    location /off/ {
        idempotency on;
        proxy_redirect off;
        add_header X-Idem $idempotency_status always;
        proxy_pass http://127.0.0.1:$TEST_NGINX_SERVER_PORT/b/;
    }
    location /b/ {
        add_header location "http://127.0.0.1:$server_port/b/orders/42";
        return 201 "created\n";
    }
--- pipelined_requests eval
["POST /pay/x\nx", "POST /pay/x\nx", "POST /rel/x\nx", "POST /rel/x\nx",
 "POST /off/x\nx", "POST /off/x\nx"]
--- more_headers eval
["Idempotency-Key: loc-2a", "Idempotency-Key: loc-2a",
 "Idempotency-Key: loc-2b", "Idempotency-Key: loc-2b",
 "Idempotency-Key: loc-2c", "Idempotency-Key: loc-2c"]
--- error_code eval
[201, 201, 201, 201, 201, 201]
--- response_headers eval
["X-Idem: new", "X-Idem: replay", "X-Idem: new", "X-Idem: replay",
 "X-Idem: new", "X-Idem: replay"]
--- raw_response_headers_like eval
["\r\nLocation: http://localhost:$ENV{TEST_NGINX_SERVER_PORT}/pay/orders/42\r\n",
 "\r\nLocation: http://localhost:$ENV{TEST_NGINX_SERVER_PORT}/pay/orders/42\r\n",
 "\r\nlocation: /rel/orders/42\r\n",
 "\r\nlocation: /rel/orders/42\r\n",
 "\r\nlocation: http://127.0.0.1:$ENV{TEST_NGINX_SERVER_PORT}/b/orders/42\r\n",
 "\r\nlocation: http://127.0.0.1:$ENV{TEST_NGINX_SERVER_PORT}/b/orders/42\r\n"]



=== TEST 3: gzip_types matches a replayed Content-Type with a charset
--- config
    location = /pay {
        idempotency on;
        gzip on;
        gzip_types application/json;
        gzip_min_length 1;
        add_header X-Idem $idempotency_status always;
        proxy_pass http://127.0.0.1:$TEST_NGINX_SERVER_PORT/json;
    }
    location = /json {
        default_type "application/json; charset=utf-8";
        return 200 '{"status":"new","note":"long enough to be compressed"}';
    }
--- more_headers
Idempotency-Key: ct-1
Accept-Encoding: gzip
--- pipelined_requests eval
["POST /pay\nx", "POST /pay\nx"]
--- error_code eval
[200, 200]
--- response_headers eval
["X-Idem: new\nContent-Encoding: gzip\nContent-Type: application/json; charset=utf-8",
 "X-Idem: replay\nContent-Encoding: gzip\nContent-Type: application/json; charset=utf-8"]
--- response_body_like eval
[qr/^\x1f\x8b/, qr/^\x1f\x8b/]



=== TEST 4: sub_filter_types matches a replayed Content-Type with a charset
--- config
    location = /pay {
        idempotency on;
        sub_filter '"new"' '"rewritten"';
        sub_filter_types application/json;
        add_header X-Idem $idempotency_status always;
        proxy_pass http://127.0.0.1:$TEST_NGINX_SERVER_PORT/json;
    }
    location = /json {
        default_type "application/json; charset=utf-8";
        return 200 '{"status":"new"}';
    }
--- more_headers
Idempotency-Key: ct-2
--- pipelined_requests eval
["POST /pay\nx", "POST /pay\nx"]
--- error_code eval
[200, 200]
--- response_headers eval
["X-Idem: new\nContent-Type: application/json; charset=utf-8",
 "X-Idem: replay\nContent-Type: application/json; charset=utf-8"]
--- response_body eval
['{"status":"rewritten"}', '{"status":"rewritten"}']



=== TEST 5: charset_types and the upstream's charset recode a replay too
--- http_config
    charset_map koi8-r utf-8 { C1 D0B0; }
--- config
    location = /pay {
        idempotency on;
        charset utf-8;
        charset_types application/json;
        override_charset on;
        add_header X-Idem $idempotency_status always;
        proxy_method GET;
        proxy_pass http://127.0.0.1:$TEST_NGINX_SERVER_PORT/k.json;
    }
    location = /k.json {
        types { }
        default_type "application/json; charset=koi8-r";
    }
--- user_files eval
">>> k.json\n{\"name\":\"\xC1\xC1\"}\n"
--- more_headers
Idempotency-Key: ct-3
--- pipelined_requests eval
["POST /pay\nx", "POST /pay\nx"]
--- error_code eval
[200, 200]
--- response_headers eval
["X-Idem: new\nContent-Type: application/json; charset=utf-8",
 "X-Idem: replay\nContent-Type: application/json; charset=utf-8"]
--- response_body eval
["{\"name\":\"\xD0\xB0\xD0\xB0\"}\n", "{\"name\":\"\xD0\xB0\xD0\xB0\"}\n"]



=== TEST 6: a type with parameters that nginx did not split stays unsplit
--- config
    location = /pay {
        idempotency on;
        gzip on;
        gzip_types application/json;
        gzip_min_length 1;
        default_type "application/json; charset=utf-8";
        add_header X-Idem $idempotency_status always;
        return 200 '{"status":"new","note":"long enough to be compressed"}';
    }
--- more_headers
Idempotency-Key: ct-4
Accept-Encoding: gzip
--- pipelined_requests eval
["POST /pay\nx", "POST /pay\nx"]
--- error_code eval
[200, 200]
--- response_headers eval
["X-Idem: new\n!Content-Encoding\nContent-Type: application/json; charset=utf-8",
 "X-Idem: replay\n!Content-Encoding\nContent-Type: application/json; charset=utf-8"]
--- response_body eval
['{"status":"new","note":"long enough to be compressed"}',
 '{"status":"new","note":"long enough to be compressed"}']



=== TEST 7: a too-large result: 409 without Retry-After, "do not retry"
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



=== TEST 8: an in-progress 409 keeps Retry-After
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
