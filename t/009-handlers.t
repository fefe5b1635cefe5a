# SPEC §2.9: the module behaves the same in front of fastcgi_pass,
# uwsgi_pass and scgi_pass as in front of proxy_pass.  t/lib/CgiBackend.pm
# runs one Perl backend per protocol; each counts its executions (X-Exec,
# the JSON "exec" and GET .../count) for the whole file, so the numbers
# below follow the order of the blocks.  A backend echoes the length and
# SHA-256 of the body it got, compared with those of the bytes sent.
#
# Blocks without a config get the three locations built below.
use Test::Nginx::Socket 'no_plan';

use lib 't/lib';
use IdemTest;
use CgiBackend ();

# what every handler needs to see; scgi_pass adds CONTENT_LENGTH itself
my %params = (
    fastcgi => [qw(REQUEST_METHOD REQUEST_URI CONTENT_LENGTH)],
    uwsgi   => [qw(REQUEST_METHOD REQUEST_URI CONTENT_LENGTH)],
    scgi    => [qw(REQUEST_METHOD REQUEST_URI SCGI)],
);
my %value = (REQUEST_METHOD => '$request_method',
             REQUEST_URI => '$request_uri',
             CONTENT_LENGTH => '$content_length', SCGI => 1);

# location /<proto>/ with idempotency on and <proto>_pass to its backend;
# the directive names are the protocol names
sub location {
    my $p = shift;
    return "    location /$p/ {\n        idempotency on;\n"
        . "        client_max_body_size 10m;\n"
        . join('', map { "        ${p}_param $_ $value{$_};\n" } @{$params{$p}})
        . "        ${p}_pass 127.0.0.1:\$TEST_NGINX_\U$p\E_PORT;\n    }\n";
}

# a small buffer: the 5 MB bodies go through temp files
my $config = <<'EOC' . join '', map { location($_) } sort keys %params;
    client_body_buffer_size 16k;
    add_header X-Idem $idempotency_status always;
EOC

add_block_preprocessor(sub {
    my $block = shift;
    $block->set_value(config => $config) unless defined $block->config;
});

# the backend's answer to a POST, computed from the bytes the test sends
sub posted { CgiBackend::reply_body($_[0], $_[1], 'POST', @_[2, 3]) }

# "hello world" in chunks, with key <proto>-4, to /<proto>/chunked
sub chunked_post {
    my $p = shift;
    return "POST /$p/chunked HTTP/1.1\r\nHost: localhost\r\n"
        . "Idempotency-Key: $p-4\r\nTransfer-Encoding: chunked\r\n"
        . "Connection: close\r\n\r\n"
        . "5\r\nhello\r\n6\r\n world\r\n0\r\n\r\n";
}

# 5,000,000 bytes that are not all alike, so a lost or moved piece shows;
# no final newline, which the runners would trim
my $big;
sub big_body { $big //= join '', map { sprintf "%07d;", $_ } 0 .. 624_999 }

# log checks run after each response of a pipelined block; let each see
# the whole log of the block, so "buffered to a temporary file" counts
check_accum_error_log();

run_tests();

__DATA__

=== TEST 1: fastcgi: a first POST executes, its retry is an exact replay
--- more_headers
Idempotency-Key: fastcgi-1
--- pipelined_requests eval
["POST /fastcgi/pay?a=1\n{\"amount\":10}",
 "POST /fastcgi/pay?a=1\n{\"amount\":10}", "GET /fastcgi/count"]
--- error_code eval
[201, 201, 200]
--- response_headers eval
["X-Idem: new\nX-Exec: 1\nSet-Cookie: s=1\nContent-Type: application/json\n!Idempotent-Replayed",
 "X-Idem: replay\nX-Exec: 1\n!Set-Cookie\nContent-Type: application/json\nIdempotent-Replayed: true",
 "X-Idem: bypass"]
--- response_body eval
my $r = main::posted("fastcgi", 1, "/fastcgi/pay?a=1", "{\"amount\":10}");
[$r, $r, "1\n"]



=== TEST 2: fastcgi: same key, different body: 422, not executed
--- more_headers
Idempotency-Key: fastcgi-2
--- pipelined_requests eval
["POST /fastcgi/pay\nfirst", "POST /fastcgi/pay\nsecond", "GET /fastcgi/count"]
--- error_code eval
[201, 422, 200]
--- response_headers eval
["X-Idem: new\nX-Exec: 2",
 "X-Idem: mismatch\nContent-Type: application/problem+json\n!X-Exec", ""]
--- response_body_like eval
my $r = quotemeta main::posted("fastcgi", 2, "/fastcgi/pay", "first");
[qr/^$r\z/,
 qr/^\{"type":"about:blank",.*"status":422,.*"code":"key-reused","error":\{"type":"idempotency_error","code":"key-reused","message":"[^"]+"\}\}$/, qr/^2$/]



=== TEST 3: fastcgi: a 5 MB body spilled to disk arrives intact and is replayed
--- more_headers
Idempotency-Key: fastcgi-3
--- pipelined_requests eval
["POST /fastcgi/big\n" . main::big_body(), "POST /fastcgi/big\n" . main::big_body(),
 "GET /fastcgi/count"]
--- error_code eval
[201, 201, 200]
--- response_headers eval
["X-Idem: new\nX-Exec: 3", "X-Idem: replay\nX-Exec: 3\nIdempotent-Replayed: true", ""]
--- response_body eval
my $r = main::posted("fastcgi", 3, "/fastcgi/big", main::big_body());
[$r, $r, "3\n"]
--- error_log
a client request body is buffered to a temporary file
--- no_error_log
[error]
[alert]
[crit]
--- timeout: 60



=== TEST 4: fastcgi: a chunked body is forwarded intact
--- raw_request eval
main::chunked_post("fastcgi")
--- error_code: 201
--- response_headers
X-Idem: new
X-Exec: 4
--- response_body eval
main::posted("fastcgi", 4, "/fastcgi/chunked", "hello world")



=== TEST 5: uwsgi: a first POST executes, its retry is an exact replay
--- more_headers
Idempotency-Key: uwsgi-1
--- pipelined_requests eval
["POST /uwsgi/pay?a=1\n{\"amount\":10}",
 "POST /uwsgi/pay?a=1\n{\"amount\":10}", "GET /uwsgi/count"]
--- error_code eval
[201, 201, 200]
--- response_headers eval
["X-Idem: new\nX-Exec: 1\nSet-Cookie: s=1\nContent-Type: application/json\n!Idempotent-Replayed",
 "X-Idem: replay\nX-Exec: 1\n!Set-Cookie\nContent-Type: application/json\nIdempotent-Replayed: true",
 "X-Idem: bypass"]
--- response_body eval
my $r = main::posted("uwsgi", 1, "/uwsgi/pay?a=1", "{\"amount\":10}");
[$r, $r, "1\n"]



=== TEST 6: uwsgi: same key, different body: 422, not executed
--- more_headers
Idempotency-Key: uwsgi-2
--- pipelined_requests eval
["POST /uwsgi/pay\nfirst", "POST /uwsgi/pay\nsecond", "GET /uwsgi/count"]
--- error_code eval
[201, 422, 200]
--- response_headers eval
["X-Idem: new\nX-Exec: 2",
 "X-Idem: mismatch\nContent-Type: application/problem+json\n!X-Exec", ""]
--- response_body_like eval
my $r = quotemeta main::posted("uwsgi", 2, "/uwsgi/pay", "first");
[qr/^$r\z/,
 qr/^\{"type":"about:blank",.*"status":422,.*"code":"key-reused","error":\{"type":"idempotency_error","code":"key-reused","message":"[^"]+"\}\}$/, qr/^2$/]



=== TEST 7: uwsgi: a 5 MB body spilled to disk arrives intact and is replayed
--- more_headers
Idempotency-Key: uwsgi-3
--- pipelined_requests eval
["POST /uwsgi/big\n" . main::big_body(), "POST /uwsgi/big\n" . main::big_body(),
 "GET /uwsgi/count"]
--- error_code eval
[201, 201, 200]
--- response_headers eval
["X-Idem: new\nX-Exec: 3", "X-Idem: replay\nX-Exec: 3\nIdempotent-Replayed: true", ""]
--- response_body eval
my $r = main::posted("uwsgi", 3, "/uwsgi/big", main::big_body());
[$r, $r, "3\n"]
--- error_log
a client request body is buffered to a temporary file
--- no_error_log
[error]
[alert]
[crit]
--- timeout: 60



=== TEST 8: uwsgi: a chunked body is forwarded intact
--- raw_request eval
main::chunked_post("uwsgi")
--- error_code: 201
--- response_headers
X-Idem: new
X-Exec: 4
--- response_body eval
main::posted("uwsgi", 4, "/uwsgi/chunked", "hello world")



=== TEST 9: scgi: a first POST executes, its retry is an exact replay
--- more_headers
Idempotency-Key: scgi-1
--- pipelined_requests eval
["POST /scgi/pay?a=1\n{\"amount\":10}",
 "POST /scgi/pay?a=1\n{\"amount\":10}", "GET /scgi/count"]
--- error_code eval
[201, 201, 200]
--- response_headers eval
["X-Idem: new\nX-Exec: 1\nSet-Cookie: s=1\nContent-Type: application/json\n!Idempotent-Replayed",
 "X-Idem: replay\nX-Exec: 1\n!Set-Cookie\nContent-Type: application/json\nIdempotent-Replayed: true",
 "X-Idem: bypass"]
--- response_body eval
my $r = main::posted("scgi", 1, "/scgi/pay?a=1", "{\"amount\":10}");
[$r, $r, "1\n"]



=== TEST 10: scgi: same key, different body: 422, not executed
--- more_headers
Idempotency-Key: scgi-2
--- pipelined_requests eval
["POST /scgi/pay\nfirst", "POST /scgi/pay\nsecond", "GET /scgi/count"]
--- error_code eval
[201, 422, 200]
--- response_headers eval
["X-Idem: new\nX-Exec: 2",
 "X-Idem: mismatch\nContent-Type: application/problem+json\n!X-Exec", ""]
--- response_body_like eval
my $r = quotemeta main::posted("scgi", 2, "/scgi/pay", "first");
[qr/^$r\z/,
 qr/^\{"type":"about:blank",.*"status":422,.*"code":"key-reused","error":\{"type":"idempotency_error","code":"key-reused","message":"[^"]+"\}\}$/, qr/^2$/]



=== TEST 11: scgi: a 5 MB body spilled to disk arrives intact and is replayed
--- more_headers
Idempotency-Key: scgi-3
--- pipelined_requests eval
["POST /scgi/big\n" . main::big_body(), "POST /scgi/big\n" . main::big_body(),
 "GET /scgi/count"]
--- error_code eval
[201, 201, 200]
--- response_headers eval
["X-Idem: new\nX-Exec: 3", "X-Idem: replay\nX-Exec: 3\nIdempotent-Replayed: true", ""]
--- response_body eval
my $r = main::posted("scgi", 3, "/scgi/big", main::big_body());
[$r, $r, "3\n"]
--- error_log
a client request body is buffered to a temporary file
--- no_error_log
[error]
[alert]
[crit]
--- timeout: 60



=== TEST 12: scgi: a chunked body is forwarded intact
--- raw_request eval
main::chunked_post("scgi")
--- error_code: 201
--- response_headers
X-Idem: new
X-Exec: 4
--- response_body eval
main::posted("scgi", 4, "/scgi/chunked", "hello world")
