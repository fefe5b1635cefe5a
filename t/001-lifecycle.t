# The request lifecycle of SPEC §2: new, replay, mismatch, bypass, and the
# $idempotency_status variable.
use Test::Nginx::Socket 'no_plan';

use lib 't/lib';
use IdemTest;

run_tests();

__DATA__

=== TEST 1: a retried POST is replayed from Redis; the backend runs once
--- config
    location = /pay {
        idempotency on;
        add_header X-Idem $idempotency_status always;
        proxy_pass http://127.0.0.1:$TEST_NGINX_SERVER_PORT/backend;
    }
    location = /backend {
        access_log logs/error.log backend;
        add_header X-Upstream yes;
        return 201 "charged\n";
    }
--- more_headers
Idempotency-Key: lifecycle-1
--- pipelined_requests eval
["POST /pay\n{\"amount\":10}", "POST /pay\n{\"amount\":10}"]
--- error_code eval
[201, 201]
--- response_headers eval
["X-Idem: new\n!Idempotent-Replayed\nX-Upstream: yes",
 "X-Idem: replay\nIdempotent-Replayed: true\nX-Upstream: yes"]
--- response_body eval
["charged\n", "charged\n"]
--- grep_error_log eval: qr/BACKEND-EXEC \S+/
--- grep_error_log_out eval
qr/\A(?:BACKEND-EXEC \/backend\n)?\z/



=== TEST 2: same key, different body: 422 problem+json, backend not run again
--- config
    location = /pay {
        idempotency on;
        add_header X-Idem $idempotency_status always;
        proxy_pass http://127.0.0.1:$TEST_NGINX_SERVER_PORT/backend;
    }
    location = /backend {
        access_log logs/error.log backend;
        return 201 "ok\n";
    }
--- more_headers
Idempotency-Key: lifecycle-2
--- pipelined_requests eval
["POST /pay\n{\"amount\":10}", "POST /pay\n{\"amount\":99}"]
--- error_code eval
[201, 422]
--- response_headers eval
["X-Idem: new", "X-Idem: mismatch\nContent-Type: application/problem+json"]
--- response_body_like eval
[qr/^ok$/, qr/^\{"type":"about:blank","title":"Idempotency-Key is already used","status":422,"detail":"[^"]+","code":"key-reused","error":\{"type":"idempotency_error","code":"key-reused","message":"[^"]+"\}\}$/]
--- grep_error_log eval: qr/BACKEND-EXEC \S+/
--- grep_error_log_out eval
qr/\A(?:BACKEND-EXEC \/backend\n)?\z/



=== TEST 3: same key, same body, different URI is a mismatch too
--- config
    location /pay/ {
        idempotency on;
        proxy_pass http://127.0.0.1:$TEST_NGINX_SERVER_PORT/b/;
    }
    location /b/ {
        return 201 "ok\n";
    }
--- more_headers
Idempotency-Key: lifecycle-3
--- pipelined_requests eval
["POST /pay/a\nsame", "POST /pay/b\nsame"]
--- error_code eval
[201, 422]



=== TEST 4: GET and requests without a key pass through untouched
--- config
    location = /pay {
        idempotency on;
        add_header X-Idem $idempotency_status always;
        proxy_pass http://127.0.0.1:$TEST_NGINX_SERVER_PORT/backend;
    }
    location = /backend {
        access_log logs/error.log backend;
        return 200 "ok\n";
    }
--- pipelined_requests eval
["GET /pay", "POST /pay\nx", "POST /pay\nx"]
--- more_headers eval
["Idempotency-Key: lifecycle-4", "", ""]
--- error_code eval
[200, 200, 200]
--- response_headers eval
["X-Idem: bypass", "X-Idem: bypass", "X-Idem: bypass"]
--- grep_error_log eval: qr/BACKEND-EXEC \S+/
--- grep_error_log_out eval
qr/\A(?:(?:BACKEND-EXEC \/backend\n){3})?\z/



=== TEST 5: idempotency_required: a POST without a key gets 400 missing-key
--- config
    location = /pay {
        idempotency on;
        idempotency_required on;
        add_header X-Idem $idempotency_status always;
        proxy_pass http://127.0.0.1:$TEST_NGINX_SERVER_PORT/backend;
    }
--- request
POST /pay
{"amount":1}
--- error_code: 400
--- response_headers
X-Idem: missing
Content-Type: application/problem+json
--- response_body_like: "code":"missing-key"



=== TEST 6: an sf-string key and the same bare token are the same key
--- config
    location = /pay {
        idempotency on;
        add_header X-Idem $idempotency_status always;
        proxy_pass http://127.0.0.1:$TEST_NGINX_SERVER_PORT/backend;
    }
--- pipelined_requests eval
["POST /pay\nx", "POST /pay\nx", "POST /pay\nx"]
--- more_headers eval
["Idempotency-Key: \"lifecycle-6 a\\\\b\\\"c\"",
 "Idempotency-Key: \"lifecycle-6 a\\\\b\\\"c\"",
 "Idempotency-Key: lifecycle-6"]
--- error_code eval
[201, 201, 201]
--- response_headers eval
["X-Idem: new", "X-Idem: replay", "X-Idem: new"]



=== TEST 7: invalid keys get 400 invalid-key and claim nothing
--- config
    location = /pay {
        idempotency on;
        idempotency_key_max_length 8;
        add_header X-Idem $idempotency_status always;
        proxy_pass http://127.0.0.1:$TEST_NGINX_SERVER_PORT/backend;
    }
--- pipelined_requests eval
["POST /pay\nx", "POST /pay\nx", "POST /pay\nx", "POST /pay\nx",
 "POST /pay\nx", "POST /pay\nx", "POST /pay\nx", "POST /pay\nx"]
--- more_headers eval
["Idempotency-Key: \"unterminated",
 "Idempotency-Key: \"bad\\escape\"",
 "Idempotency-Key: \"x\";param=1",
 "Idempotency-Key: a,b",
 "Idempotency-Key: 123456789",
 "Idempotency-Key: \"\"",
 "Idempotency-Key: caf\xc3\xa9",
 "Idempotency-Key: one\r\nIdempotency-Key: two"]
--- error_code eval
[400, 400, 400, 400, 400, 400, 400, 400]
--- response_headers eval
[("X-Idem: invalid\nContent-Type: application/problem+json") x 8]
--- response_body_like eval
[(qr/"detail":"The Idempotency-Key must be visible ASCII characters without spaces, double quotes or commas, or a quoted string \(RFC 8941\) of printable ASCII\.".*"code":"invalid-key"/) x 4,
 qr/"detail":"The Idempotency-Key is 9 characters long; at most 8 are accepted\.".*"code":"invalid-key"/,
 qr/"detail":"The Idempotency-Key is empty: send 1 to 8 characters\.".*"code":"invalid-key"/,
 qr/"detail":"The Idempotency-Key must be visible ASCII.*"code":"invalid-key"/,
 qr/"detail":"Send one Idempotency-Key header: this request has several\.".*"code":"invalid-key"/]



=== TEST 8: idempotency_methods: PUT protected, POST then bypassed
--- config
    location = /pay {
        idempotency on;
        idempotency_methods PUT;
        add_header X-Idem $idempotency_status always;
        proxy_pass http://127.0.0.1:$TEST_NGINX_SERVER_PORT/backend;
    }
    location = /backend {
        idempotency off;
        return 200 "ok\n";
    }
--- more_headers
Idempotency-Key: lifecycle-8
--- pipelined_requests eval
["PUT /pay\nx", "PUT /pay\nx", "POST /pay\nx"]
--- error_code eval
[200, 200, 200]
--- response_headers eval
["X-Idem: new", "X-Idem: replay", "X-Idem: bypass"]



=== TEST 9: idempotency_scope: two tenants with one key never share records
--- config
    location = /pay {
        idempotency on;
        idempotency_scope $http_x_tenant;
        add_header X-Idem $idempotency_status always;
        proxy_pass http://127.0.0.1:$TEST_NGINX_SERVER_PORT/backend;
    }
    location = /backend {
        return 201 "for $http_x_tenant\n";
    }
--- pipelined_requests eval
["POST /pay\nx", "POST /pay\nx", "POST /pay\nx"]
--- more_headers eval
["Idempotency-Key: lifecycle-9\nX-Tenant: alice",
 "Idempotency-Key: lifecycle-9\nX-Tenant: bob",
 "Idempotency-Key: lifecycle-9\nX-Tenant: alice"]
--- error_code eval
[201, 201, 201]
--- response_headers eval
["X-Idem: new", "X-Idem: new", "X-Idem: replay"]
--- response_body eval
["for alice\n", "for bob\n", "for alice\n"]



=== TEST 10: idempotency_key from another source; idempotency off inherits
--- config
    idempotency on;
    idempotency_key $http_x_request_key;
    location = /pay {
        add_header X-Idem $idempotency_status always;
        proxy_pass http://127.0.0.1:$TEST_NGINX_SERVER_PORT/backend;
    }
    location = /free {
        idempotency off;
        add_header X-Idem $idempotency_status always;
        proxy_pass http://127.0.0.1:$TEST_NGINX_SERVER_PORT/backend;
    }
    location = /backend {
        idempotency off;
        return 201 "ok\n";
    }
--- pipelined_requests eval
["POST /pay\nx", "POST /pay\nx", "POST /free\nx"]
--- more_headers
X-Request-Key: lifecycle-10
--- error_code eval
[201, 201, 201]
--- response_headers eval
["X-Idem: new", "X-Idem: replay", "X-Idem: bypass"]



=== TEST 11: idempotency_problem_base_uri names the problem type
--- config
    location = /pay {
        idempotency on;
        idempotency_problem_base_uri https://errors.example.com/idempotency;
        proxy_pass http://127.0.0.1:$TEST_NGINX_SERVER_PORT/backend;
    }
--- more_headers
Idempotency-Key: lifecycle-11
--- pipelined_requests eval
["POST /pay\na", "POST /pay\nb"]
--- error_code eval
[201, 422]
--- response_body_like eval
[qr/^ok$/, qr/^\{"type":"https:\/\/errors\.example\.com\/idempotency#key-reused","title":"Idempotency-Key is already used","status":422,/]



=== TEST 12: idempotency_redis_prefix: the record is stored under the prefix
--- config
    location = /pay {
        idempotency on;
        idempotency_redis_prefix "shop1:";
        proxy_pass http://127.0.0.1:$TEST_NGINX_SERVER_PORT/backend;
    }
--- more_headers
Idempotency-Key: lifecycle-12
--- request
POST /pay
x
--- error_code: 201



=== TEST 13: (the record of TEST 12 is at shop1:{sha256(NUL key)})
--- init
use Digest::SHA ();
my $k = "shop1:{" . Digest::SHA::sha256_hex("\0lifecycle-12") . "}";
my $n = `$ENV{REDIS_CLI} -p $ENV{TEST_NGINX_REDIS_PORT} EXISTS '$k'`;
die "no record at $k" unless $n == 1;
--- config
    location = /t {
        return 200 "ok\n";
    }
--- request
GET /t
--- response_body
ok
