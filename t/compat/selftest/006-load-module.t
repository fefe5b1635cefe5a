# Loading a dynamic module through TEST_NGINX_LOAD_MODULES.  Uses Debian's
# libnginx-mod-http-echo with the stock nginx, or the echo module built for
# another server in TEST_NGINX_MODULES_DIR (util/forks.sh); skipped when
# not available.
BEGIN {
    my $dir = $ENV{TEST_NGINX_MODULES_DIR};
    my $so = ($dir // '/usr/lib/nginx/modules') . '/ngx_http_echo_module.so';
    my $bin = $ENV{TEST_NGINX_BINARY};
    if (!-f $so || (!defined $dir && defined $bin && $bin ne '/usr/sbin/nginx')) {
        print "1..0 # SKIP needs the echo module built for TEST_NGINX_BINARY\n";
        exit 0;
    }
    my $mods = $ENV{TEST_NGINX_LOAD_MODULES} // '';
    $ENV{TEST_NGINX_LOAD_MODULES} = "$mods $so"
        unless $mods =~ /ngx_http_echo_module/;
}

use Test::Nginx::Socket;

plan tests => repeat_each() * 8;

run_tests();

__DATA__

=== TEST 1: the module is loaded (echo sends a chunked response)
--- config
    location = /t {
        echo hello;
        echo world;
    }
--- request
GET /t
--- response_headers
Transfer-Encoding: chunked
--- response_body
hello
world



=== TEST 2: chunked request body given in --- request (no Content-Length added)
--- config
    location = /t {
        echo_read_request_body;
        echo "[$request_body]";
    }
--- more_headers
Transfer-Encoding: chunked
--- request eval
"POST /t
5\r
hello\r
0\r
\r
"
--- response_body
[hello]



=== TEST 3: --- abort with a response slower than --- timeout
--- config
    location = /t {
        echo_sleep 1;
        echo ok;
    }
--- request
GET /t
--- timeout: 0.2
--- abort
--- ignore_response
--- error_log
http request line: "GET /t HTTP/1.1"



=== TEST 4: slow response within the timeout
--- config
    location = /t {
        echo_sleep 0.3;
        echo ok;
    }
--- request
GET /t
--- timeout: 2
--- response_body
ok
