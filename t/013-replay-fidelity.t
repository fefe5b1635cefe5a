# Replay fidelity: a replay goes through nginx's filters as the original
# did.  A Location is absolute again only where nginx made the original
# absolute; Content-Type parameters do not hide a replay from gzip_types,
# sub_filter_types or charset_types; a too-large result says "do not
# retry"; a header with CR, LF or NUL from another module is dropped from
# the record instead of making it corrupt (503 until it expires).
use Test::Nginx::Socket 'no_plan';

use lib 't/lib';
use IdemTest;
use IO::Socket::INET;
use POSIX ();

# A raw HTTP backend for what nginx cannot send itself: a reason phrase
# with a NUL byte, which nginx's upstream parser lets through.
my $raw_port = 20200;
my $starter = $$;
my $raw_pid;

{
    my $l = IO::Socket::INET->new(LocalAddr => '127.0.0.1',
                                  LocalPort => $raw_port, Listen => 8,
                                  ReuseAddr => 1, Proto => 'tcp',
                                  Timeout => 1)
        or die "raw backend on $raw_port: $!";

    $raw_pid = fork() // die "fork: $!";

    if ($raw_pid == 0) {
        # accept() times out every second: gone with the test's process
        while (getppid() == $starter) {
            my $c = $l->accept or next;
            my $req = '';
            local $SIG{ALRM} = sub { die "idle\n" };
            eval {
                alarm 5;
                while ($req !~ /\r\n\r\n/) {
                    sysread($c, $req, 4096, length $req) or last;
                }
                my ($len) = $req =~ /^Content-Length:\s*(\d+)/mi;
                my $want = index($req, "\r\n\r\n") + 4 + ($len // 0);
                while (length $req < $want) {
                    sysread($c, $req, 4096, length $req) or last;
                }
                alarm 0;
            };
            print $c "HTTP/1.1 201 Cre\0ated\r\n"
                . "Content-Type: text/plain\r\nContent-Length: 3\r\n"
                . "Connection: close\r\n\r\nok\n";
            close $c;
        }
        POSIX::_exit(0);    # never run the test's END blocks here
    }

    close $l;
}

END {
    local $?;
    if (defined $raw_pid && $$ == $starter) {
        kill 'TERM', $raw_pid;
        waitpid $raw_pid, 0;
    }
}

$ENV{TEST_NGINX_RAW_PORT} = $raw_port;

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
        echo -n '{"status":"new","note":"long enough to be compressed"}';
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
 qr/^\{"type":"about:blank","title":"The response for this Idempotency-Key cannot be replayed","status":409,"detail":"[^"]*the result cannot be replayed\. Do not retry the request with this key\.","code":"response-not-replayable","error":\{"type":"idempotency_error","code":"response-not-replayable","message":"[^"]+"\}\}$/]
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



=== TEST 9: a header with CR, LF or NUL from another module is dropped, the rest replayed
--- main_config
    load_module $TEST_NGINX_PERL_MODULE;
--- config
    location = /pay {
        idempotency on;
        add_header X-Idem $idempotency_status always;
        perl 'sub {
            my $r = shift;
            $r->header_out("X-Nul", "a\0b");
            $r->header_out("X-Split", "1\r\nX-Injected: 1");
            $r->header_out("X-Good", "kept");
            $r->send_http_header("text/plain");
            $r->print("done\n");
            return 0;
        }';
    }
--- more_headers
Idempotency-Key: bad-1
--- pipelined_requests eval
["POST /pay\nx", "POST /pay\nx"]
--- error_code eval
[200, 200]
--- response_headers eval
["X-Idem: new\nX-Good: kept\nX-Injected: 1",
 "X-Idem: replay\nX-Good: kept\n!X-Nul\n!X-Split\n!X-Injected\nContent-Type: text/plain"]
--- response_body eval
["done\n", "done\n"]
--- error_log
header "X-Nul" has CR, LF or NUL, not stored
header "X-Split" has CR, LF or NUL, not stored
--- no_error_log
[error]
[crit]



=== TEST 10: a Location with CR LF is dropped, not fatal
--- main_config
    load_module $TEST_NGINX_PERL_MODULE;
--- config
    location = /pay {
        idempotency on;
        add_header X-Idem $idempotency_status always;
        perl 'sub {
            my $r = shift;
            $r->header_out("Location", "/next\r\nX-Injected: 1");
            return 302;
        }';
    }
--- more_headers
Idempotency-Key: bad-2
--- pipelined_requests eval
["POST /pay\nx", "POST /pay\nx"]
--- error_code eval
[302, 302]
--- response_headers eval
["X-Idem: new\nX-Injected: 1", "X-Idem: replay\n!Location\n!X-Injected"]
--- response_body_like eval
[qr/302 Found/, qr/302 Found/]
--- error_log
header "Location" has CR, LF or NUL, not stored
--- no_error_log
[error]
[crit]



=== TEST 11: a Content-Type with CR LF is dropped, not fatal
--- config
    location = /pay {
        idempotency on;
        default_type "text/plain\r\nX-Injected: 2";
        add_header X-Idem $idempotency_status always;
        echo "typed";
    }
--- more_headers
Idempotency-Key: bad-3
--- pipelined_requests eval
["POST /pay\nx", "POST /pay\nx"]
--- error_code eval
[200, 200]
--- response_headers eval
["X-Idem: new\nX-Injected: 2", "X-Idem: replay\n!Content-Type\n!X-Injected"]
--- response_body eval
["typed\n", "typed\n"]
--- error_log
header "Content-Type" has CR, LF or NUL, not stored
--- no_error_log
[error]
[crit]



=== TEST 12: an upstream reason phrase with a NUL is not stored; the rest is
--- config
    location = /pay {
        idempotency on;
        add_header X-Idem $idempotency_status always;
        proxy_pass http://127.0.0.1:$TEST_NGINX_RAW_PORT;
    }
--- more_headers
Idempotency-Key: bad-4
--- pipelined_requests eval
["POST /pay\nx", "POST /pay\nx"]
--- error_code eval
[201, 201]
--- response_headers eval
["X-Idem: new", "X-Idem: replay\nContent-Type: text/plain"]
--- raw_response_headers_like eval
["^HTTP/1.1 201 Cre\0ated\r\n", "^HTTP/1.1 201 Created\r\n"]
--- response_body eval
["ok\n", "ok\n"]
--- error_log
status line has CR, LF or NUL, not stored
--- no_error_log
[error]
[crit]
