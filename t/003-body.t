# Request bodies (SPEC §2.5): fingerprinted as read, spilled to disk,
# chunked; the fingerprint covers the decoded body.
use Test::Nginx::Socket 'no_plan';

use lib 't/lib';
use IdemTest;

run_tests();

__DATA__

=== TEST 1: a 5 MB body spilled to a temp file is fingerprinted and replayed
--- config
    client_body_buffer_size 16k;
    location = /pay {
        client_max_body_size 10m;
        idempotency on;
        add_header X-Idem $idempotency_status always;
        proxy_pass http://127.0.0.1:$TEST_NGINX_SERVER_PORT/backend;
    }
    location = /backend {
        client_max_body_size 10m;
        access_log logs/error.log backend;
        # the header: freenginx's $content_length is empty where the
        # body is not read, as before "return"
        return 201 "got $http_content_length\n";
    }
--- more_headers
Idempotency-Key: body-1
--- pipelined_requests eval
["POST /pay\n" . ("a" x 5_000_000), "POST /pay\n" . ("a" x 5_000_000),
 "POST /pay\n" . ("a" x 4_999_999) . "b"]
--- error_code eval
[201, 201, 422]
--- response_headers eval
["X-Idem: new", "X-Idem: replay", "X-Idem: mismatch"]
--- response_body_like eval
[qr/^got 5000000$/, qr/^got 5000000$/, qr/key-reused/]
--- grep_error_log eval: qr/BACKEND-EXEC \S+/
--- grep_error_log_out eval
qr/\A(?:BACKEND-EXEC \/backend\n)?\z/
--- timeout: 30



=== TEST 2: a chunked body is claimed
--- config
    location = /pay {
        idempotency on;
        add_header X-Idem $idempotency_status always;
        proxy_pass http://127.0.0.1:$TEST_NGINX_SERVER_PORT/backend;
    }
    location = /backend {
        return 201 "created\n";
    }
--- raw_request eval
"POST /pay HTTP/1.1\r
Host: localhost\r
Idempotency-Key: body-2\r
Transfer-Encoding: chunked\r
Connection: close\r
\r
5\r
hello\r
6\r
 world\r
0\r
\r
"
--- error_code: 201
--- response_headers
X-Idem: new



=== TEST 3: the same body sent with Content-Length replays the chunked one
--- config
    location = /pay {
        idempotency on;
        add_header X-Idem $idempotency_status always;
        proxy_pass http://127.0.0.1:$TEST_NGINX_SERVER_PORT/backend;
    }
    location = /backend {
        return 201 "created again\n";
    }
--- more_headers
Idempotency-Key: body-2
--- request
POST /pay
hello world
--- error_code: 201
--- response_headers
X-Idem: replay
--- response_body
created



=== TEST 4: a malformed chunked body is a 400 and claims nothing
--- config
    location = /pay {
        idempotency on;
        add_header X-Idem $idempotency_status always;
        proxy_pass http://127.0.0.1:$TEST_NGINX_SERVER_PORT/backend;
    }
    location = /backend {
        return 201 "created\n";
    }
--- raw_request eval
"POST /pay HTTP/1.1\r
Host: localhost\r
Idempotency-Key: body-4\r
Transfer-Encoding: chunked\r
Connection: close\r
\r
zz\r
hello\r
0\r
\r
"
--- error_code: 400
--- no_error_log
[alert]
[crit]



=== TEST 5: after the malformed attempt the key is still free
--- config
    location = /pay {
        idempotency on;
        add_header X-Idem $idempotency_status always;
        proxy_pass http://127.0.0.1:$TEST_NGINX_SERVER_PORT/backend;
    }
    location = /backend {
        return 201 "created\n";
    }
--- more_headers
Idempotency-Key: body-4
--- request
POST /pay
hello
--- error_code: 201
--- response_headers
X-Idem: new



=== TEST 6: a body over client_max_body_size is a 413 and claims nothing
--- config
    location = /pay {
        client_max_body_size 10;
        idempotency on;
        proxy_pass http://127.0.0.1:$TEST_NGINX_SERVER_PORT/backend;
    }
    location = /backend {
        return 201 "created\n";
    }
--- more_headers
Idempotency-Key: body-6
--- request
POST /pay
this body is longer than ten bytes
--- error_code: 413
--- no_error_log
[alert]
[crit]
