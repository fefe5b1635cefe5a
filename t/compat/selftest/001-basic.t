# Basic request/response handling of the Test::Nginx::Socket runner.
use Test::Nginx::Socket;

repeat_each(2);

# The explicit plan checks that we produce exactly as many tests as the real
# Test::Nginx::Socket does for the same blocks.
plan tests => repeat_each() * 27;

no_long_string();

run_tests();

__DATA__

=== TEST 1: return 200 "hello"
--- config
    location = /t {
        return 200 "hello";
    }
--- request
GET /t
--- response_body chomp
hello



=== TEST 2: response headers present and absent
--- config
    location = /t {
        add_header X-Foo bar;
        return 200 "ok\n";
    }
--- request
GET /t
--- response_headers
X-Foo: bar
Content-Type: text/plain
!X-Bar
!Set-Cookie
--- response_body
ok



=== TEST 3: error_code and response_body_like
--- config
    location = /t {
        return 404;
    }
--- request
GET /t
--- error_code: 404
--- response_body_like: 404 Not Found



=== TEST 4: more_headers; a request body gets a (trimmed) Content-Length
--- config
    location = /t {
        return 200 "foo=$http_x_foo len=$http_content_length host=$host conn=$http_connection\n";
    }
--- more_headers
X-Foo: 42
--- request
POST /t
hello world
--- response_body
foo=42 len=11 host=localhost conn=close



=== TEST 5: several requests (one connection each)
--- config
    location = /a {
        return 200 "a\n";
    }
--- request eval
["GET /a", "GET /b"]
--- error_code eval
[200, 404]
--- response_body eval
["a\n", qr/404 Not Found/]



=== TEST 6: HEAD responses have no body
--- config
    location = /t {
        return 200 "hello";
    }
--- request
HEAD /t
--- response_headers
Content-Length: 5
--- response_body



=== TEST 7: chunked response is de-chunked
--- config
    location = /t {
        sub_filter_types *;
        sub_filter hello world;
        return 200 "hello, hello\n";
    }
--- request
GET /t
--- response_headers
Transfer-Encoding: chunked
!Content-Length
--- response_body
world, hello



=== TEST 8: HTTP/1.0 response without length is read until close
--- config
    location = /t {
        sub_filter_types *;
        sub_filter hello world;
        return 200 "hello, hello\n";
    }
--- request
GET /t HTTP/1.0
--- response_headers
!Transfer-Encoding
!Content-Length
--- response_body
world, hello



=== TEST 9: skipped block (would fail)
--- SKIP
--- config
    location = /t {
        return 500;
    }
--- request
GET /t
--- response_body
never
