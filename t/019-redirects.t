# Internal redirects: the request is judged by the location it is in now.
# A claim already won carries over and is finished by the response the
# request ends with; an error page (access refused, a failed body, any
# error_page) never starts a claim; a body that fails while it is read
# always gets its answer, whatever error_page says.
use Test::Nginx::Socket 'no_plan';

use lib 't/lib';
use IdemTest;

run_tests();

__DATA__

=== TEST 1: access refused, error_page to a protected named location: never claimed
--- config
    idempotency on;
    location = /pay {
        deny all;
        error_page 403 = @login;
        proxy_pass http://127.0.0.1:$TEST_NGINX_SERVER_PORT/backend;
    }
    location = /basic {
        auth_basic "pay";
        auth_basic_user_file /dev/null;
        error_page 401 = @login;
        proxy_pass http://127.0.0.1:$TEST_NGINX_SERVER_PORT/backend;
    }
    location @login {
        add_header X-Idem $idempotency_status always;
        set $target /login;
        proxy_pass http://127.0.0.1:$TEST_NGINX_SERVER_PORT$target;
    }
    location = /login {
        idempotency off;
        access_log logs/error.log backend;
        return 200 "login page\n";
    }
    location = /open {
        add_header X-Idem $idempotency_status always;
        proxy_pass http://127.0.0.1:$TEST_NGINX_SERVER_PORT/backend;
    }
--- more_headers
Idempotency-Key: redirect-1
--- pipelined_requests eval
["POST /pay\nx", "POST /pay\nx", "POST /basic\nx", "POST /open\nx"]
--- error_code eval
[200, 200, 200, 201]
--- response_headers eval
["X-Idem: bypass\n!Idempotent-Replayed", "X-Idem: bypass\n!Idempotent-Replayed",
 "X-Idem: bypass\n!Idempotent-Replayed", "X-Idem: new"]
--- response_body eval
["login page\n", "login page\n", "login page\n", "ok\n"]
--- grep_error_log eval: qr/BACKEND-EXEC \S+/
--- grep_error_log_out eval
qr/\A(?:(?:BACKEND-EXEC \/login\n){3})?\z/
--- no_error_log
[alert]
[crit]



=== TEST 2: error_page to a protected location is an error page: not claimed
--- config
    location = /pay {
        idempotency on;
        return 404;
        error_page 404 = @app;
    }
    location @app {
        idempotency on;
        add_header X-Idem $idempotency_status always;
        set $target /backend;
        proxy_pass http://127.0.0.1:$TEST_NGINX_SERVER_PORT$target;
    }
    location = /backend {
        access_log logs/error.log backend;
        return 201 "ok\n";
    }
--- more_headers
Idempotency-Key: redirect-2
--- pipelined_requests eval
["POST /pay\nx", "POST /pay\nx"]
--- error_code eval
[201, 201]
--- response_headers eval
["X-Idem: bypass", "X-Idem: bypass\n!Idempotent-Replayed"]
--- grep_error_log eval: qr/BACKEND-EXEC \S+/
--- grep_error_log_out eval
qr/\A(?:(?:BACKEND-EXEC \/backend\n){2})?\z/



=== TEST 3: try_files to a named location: the claim won carries over
--- config
    location = /pay {
        idempotency on;
        add_header X-Idem $idempotency_status always;
        try_files /no-such-file @app;
    }
    location @app {
        idempotency off;
        add_header X-Idem $idempotency_status always;
        set $target /backend;
        proxy_pass http://127.0.0.1:$TEST_NGINX_SERVER_PORT$target;
    }
    location = /backend {
        access_log logs/error.log backend;
        return 201 "ok\n";
    }
--- more_headers
Idempotency-Key: redirect-3
--- pipelined_requests eval
["POST /pay\nx", "POST /pay\nx"]
--- error_code eval
[201, 201]
--- response_headers eval
["X-Idem: new", "X-Idem: replay\nIdempotent-Replayed: true"]
--- grep_error_log eval: qr/BACKEND-EXEC \S+/
--- grep_error_log_out eval
qr/\A(?:BACKEND-EXEC \/backend\n)?\z/



=== TEST 4: a decision that did not claim is made again in the new location
--- config
    location = /pay {
        idempotency on;
        idempotency_redis 127.0.0.1:1;
        idempotency_on_redis_error pass;
        add_header X-Idem $idempotency_status always;
        try_files /no-such-file @app;
    }
    location @app {
        idempotency on;
        add_header X-Idem $idempotency_status always;
        set $target /backend;
        proxy_pass http://127.0.0.1:$TEST_NGINX_SERVER_PORT$target;
    }
    location = /backend {
        access_log logs/error.log backend;
        return 201 "ok\n";
    }
--- more_headers
Idempotency-Key: redirect-4
--- pipelined_requests eval
["POST /pay\nx", "POST /pay\nx"]
--- error_code eval
[201, 201]
--- response_headers eval
["X-Idem: new", "X-Idem: replay\nIdempotent-Replayed: true"]
--- grep_error_log eval: qr/BACKEND-EXEC \S+/
--- grep_error_log_out eval
qr/\A(?:BACKEND-EXEC \/backend\n)?\z/
--- no_error_log
[alert]
[crit]



=== TEST 5: X-Accel-Redirect: the final response is what is stored
--- config
    location = /pay {
        idempotency on;
        add_header X-Idem $idempotency_status always;
        proxy_pass http://127.0.0.1:$TEST_NGINX_SERVER_PORT/accel;
    }
    location = /accel {
        access_log logs/error.log backend;
        add_header X-Accel-Redirect /final;
        return 200;
    }
    # $uri, not $request_method: Tengine keeps the method's name (POST)
    # after X-Accel-Redirect, nginx says GET
    location = /final {
        internal;
        return 200 "final $uri\n";
    }
--- more_headers
Idempotency-Key: redirect-5
--- pipelined_requests eval
["POST /pay\nx", "POST /pay\nx"]
--- error_code eval
[200, 200]
--- response_headers eval
["!Idempotent-Replayed", "Idempotent-Replayed: true"]
--- response_body eval
["final /final\n", "final /final\n"]
--- grep_error_log eval: qr/BACKEND-EXEC \S+/
--- grep_error_log_out eval
qr/\A(?:BACKEND-EXEC \/accel\n)?\z/



=== TEST 6: unknown methods are never protected
--- config
    location = /pay {
        idempotency on;
        add_header X-Idem $idempotency_status always;
        set $target /backend;
        proxy_pass http://127.0.0.1:$TEST_NGINX_SERVER_PORT$target;
    }
    location = /backend {
        access_log logs/error.log backend;
        return 201 "ok\n";
    }
--- more_headers
Idempotency-Key: redirect-6
--- pipelined_requests eval
["PURGE /pay\nx", "PURGE /pay\nx"]
--- error_code eval
[201, 201]
--- response_headers eval
["X-Idem: bypass", "X-Idem: bypass\n!Idempotent-Replayed"]
--- grep_error_log eval: qr/BACKEND-EXEC \S+/
--- grep_error_log_out eval
qr/\A(?:(?:BACKEND-EXEC \/backend\n){2})?\z/



=== TEST 7: a chunked body over the limit, after reading went asynchronous, gets its error page
--- config
    location = /pay {
        idempotency on;
        client_max_body_size 10;
        error_page 413 /too-big;
        proxy_pass http://127.0.0.1:$TEST_NGINX_SERVER_PORT/backend;
    }
    location = /too-big {
        idempotency on;
        add_header X-Idem $idempotency_status always;
        proxy_pass http://127.0.0.1:$TEST_NGINX_SERVER_PORT/page;
    }
    location = /page {
        return 413 "too big\n";
    }
--- raw_request eval
["POST /pay HTTP/1.1\r
Host: localhost\r
Idempotency-Key: redirect-7\r
Transfer-Encoding: chunked\r
Connection: close\r
\r
5\r
hello\r
",
"10\r
0123456789abcdef\r
0\r
\r
"]
--- raw_request_middle_delay: 0.2
--- timeout: 3
--- error_code: 413
--- response_headers
X-Idem: invalid
--- response_body
too big
--- no_error_log
[alert]
[crit]



=== TEST 8: a malformed chunk after reading went asynchronous gets its error page
--- config
    location = /pay {
        idempotency on;
        error_page 400 = @bad;
        proxy_pass http://127.0.0.1:$TEST_NGINX_SERVER_PORT/backend;
    }
    location @bad {
        idempotency on;
        set $target /page;
        proxy_pass http://127.0.0.1:$TEST_NGINX_SERVER_PORT$target;
    }
    location = /page {
        return 400 "bad body\n";
    }
--- raw_request eval
["POST /pay HTTP/1.1\r
Host: localhost\r
Idempotency-Key: redirect-8\r
Transfer-Encoding: chunked\r
Connection: close\r
\r
5\r
hello\r
",
"zz\r
0123456789abcdef\r
0\r
\r
"]
--- raw_request_middle_delay: 0.2
--- timeout: 3
--- error_code: 400
--- response_body
bad body
--- no_error_log
[alert]
[crit]



=== TEST 9: the key of the failed bodies above was never claimed
--- config
    location = /pay {
        idempotency on;
        add_header X-Idem $idempotency_status always;
        proxy_pass http://127.0.0.1:$TEST_NGINX_SERVER_PORT/backend;
    }
--- more_headers eval
["Idempotency-Key: redirect-7", "Idempotency-Key: redirect-8"]
--- pipelined_requests eval
["POST /pay\nx", "POST /pay\nx"]
--- error_code eval
[201, 201]
--- response_headers eval
["X-Idem: new", "X-Idem: new"]
