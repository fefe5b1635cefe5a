# raw_request, request packets and client timeouts.
use Test::Nginx::Socket;

plan tests => repeat_each() * (blocks() * 2 + 1);

run_tests();

__DATA__

=== TEST 1: raw_request with a chunked request body
--- config
    location = /body {
        proxy_pass http://127.0.0.1:$TEST_NGINX_SERVER_PORT/back;
        proxy_set_header X-Body $request_body;
    }
    location = /back {
        return 200 "body=[$http_x_body]\n";
    }
--- raw_request eval
"POST /body HTTP/1.1\r
Host: localhost\r
Connection: close\r
Transfer-Encoding: chunked\r
\r
5\r
hello\r
6\r
 world\r
0\r
\r
"
--- response_body
body=[hello world]



=== TEST 2: raw_request split into packets with a delay
--- config
    location = /t {
        return 200 "ok\n";
    }
--- raw_request eval
["GET /t HTTP/1.1\r\nHo", "st: localhost\r\nConnection: close\r\n\r\n"]
--- raw_request_middle_delay: 0.1
--- response_body
ok
--- error_log
http request line: "GET /t HTTP/1.1"



=== TEST 3: request split into packets (delay_before)
--- config
    location = /body {
        proxy_pass http://127.0.0.1:$TEST_NGINX_SERVER_PORT/back;
        proxy_set_header X-Body $request_body;
    }
    location = /back {
        return 200 "body=[$http_x_body]\n";
    }
--- request eval
[["POST /body\nhel", {value => "lo", delay_before => 0.1}]]
--- response_body
body=[hello]



=== TEST 4: keep-alive raw request: --- abort makes the timeout harmless
--- config
    location = /t {
        return 200 "ok\n";
    }
--- raw_request eval
"GET /t HTTP/1.1\r\nHost: localhost\r\n\r\n"
--- timeout: 300ms
--- abort
--- response_body
ok



=== TEST 5: explicit HTTP/1.0 request line
--- config
    location = /t {
        return 200 "$server_protocol\n";
    }
--- request
GET /t HTTP/1.0
--- response_body
HTTP/1.0
