# Pipelined requests on one keep-alive connection.
use Test::Nginx::Socket;

repeat_each(2);

plan tests => repeat_each() * (12 + 6);

run_tests();

__DATA__

=== TEST 1: three pipelined requests
--- config
    location = /a {
        return 200 "a\n";
    }
    location = /b {
        add_header X-B 1;
        return 200 "b\n";
    }
    location = /c {
        return 201 "c:$http_content_length\n";
    }
--- pipelined_requests eval
["GET /a", "GET /b", "POST /c\nhello"]
--- error_code eval
[200, 200, 201]
--- response_headers eval
["!X-B", "X-B: 1", "Connection: close"]
--- response_body eval
["a\n", "b\n", "c:5\n"]
--- no_error_log
[error]



=== TEST 2: chunked, error and plain responses in one pipeline
--- config
    location = /a {
        return 200 "a\n";
    }
    location = /chunked {
        sub_filter_types *;
        sub_filter hello world;
        return 200 "hello\n";
    }
--- pipelined_requests eval
["GET /chunked", "GET /nope", "GET /a"]
--- error_code eval
[200, 404, 200]
--- response_body eval
["world\n", qr/404 Not Found/, "a\n"]
