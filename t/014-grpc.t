# gRPC through grpc_pass (h2c and TLS) and its HTTP/1.1 chunked form: the
# response trailers (grpc-status, grpc-message, custom ones) are stored
# with the response and replayed, so a retried gRPC call gets the original
# status, message and trailing metadata, and the backend runs once.
# Plain Test::More: it starts a Python gRPC backend (python3-grpcio, raw
# bytes, no protoc) and its own nginx on ports 20300-20304.
use strict;
use warnings;
use lib 't/lib';
use Test::More;
use Fleet;
use JSON::PP;
use IO::Socket::INET;
use Time::HiRes qw(sleep time);

plan skip_all => 'TEST_NGINX_LOAD_MODULES must name the module'
    unless have_module();

# Debian's interpreter: python3-grpcio is a Debian package (util/deps.sh)
my $py = $ENV{TEST_PYTHON} || '/usr/bin/python3';
plan skip_all => "python3-grpcio is not installed ($py cannot import grpc)"
    unless system("$py -c 'import grpc' 2>/dev/null") == 0;

my ($grpc_port, $h2c_port, $tls_port, $h1_port, $small_port)
    = (20300, 20301, 20302, 20303, 20304);
my $slow = $ENV{TEST_ASAN} ? 4 : 1;
my $root = fleet_root('grpc');
my $counter = "$root/executions";
my ($nginx, $small, $backend, $ready);

# END names $ready: else perl closes it (waiting for the backend) first
END {
    local $?;    # Test::More's exit code
    nginx_stop($_) for grep { $_ } $nginx, $small;
    if ($backend) {
        kill 'TERM', $backend;
        close $ready;
    }
}

system("openssl req -x509 -newkey rsa:2048 -nodes -days 2 -subj /CN=idem.test"
       . " -addext subjectAltName=DNS:idem.test"
       . " -keyout $root/key.pem -out $root/cert.pem 2>/dev/null") == 0
    or die "openssl req failed";

# the backend says "ready" once it listens
$backend = open($ready, '-|', $py, 't/lib/grpc_backend.py', $grpc_port,
                $counter) or die "cannot start the gRPC backend: $!";
my $line = <$ready> // '';
$line =~ /^ready/ or die "the gRPC backend did not start";

$nginx = nginx_conf('edge', <<"EOC");
    idempotency_redis 127.0.0.1:$ENV{TEST_NGINX_REDIS_PORT};
    idempotency_redis_prefix grpc:;
    idempotency_redis_timeout @{[ 1000 * $slow ]}ms;
    server {
        listen 127.0.0.1:$h2c_port http2;
        listen 127.0.0.1:$tls_port ssl http2;
        listen 127.0.0.1:$h1_port;
        ssl_certificate $root/cert.pem;
        ssl_certificate_key $root/key.pem;
        location /idem.Pay/ {
            idempotency on;
            grpc_pass grpc://127.0.0.1:$grpc_port;
        }
        location = /idem.Pay/Slow {
            idempotency on;
            grpc_read_timeout 500ms;    # the backend answers after 1.5 s
            grpc_pass grpc://127.0.0.1:$grpc_port;
        }
    }
EOC
nginx_start($nginx);
sleep 0.3 * $slow;

sub executions { scalar(my @l = lines_of($counter)) }

sub records {
    return { map { $_ => 1 } split /\n/, redis_cli('KEYS', 'grpc:*') };
}

# the record stored since records() said $before: the one new key (the
# store is sent after the response, so give it a moment)
sub new_record {
    my $before = shift;
    for (1 .. 20 * $slow) {
        my @new = grep { !$before->{$_} } keys %{ records() };
        return $new[0] if @new == 1
                          && redis_cli('GETRANGE', $new[0], 4, 4) ne "\x01";
        sleep 0.05;
    }
    return '';
}

# its state byte: 2 done, 3 too large, 4 done with trailers
sub state_of { return ord(redis_cli('GETRANGE', shift, 4, 4) || "\0") }

# call(transport, method, key, payload) -> {code, details, payload, ...}
sub call {
    my ($how, $method, $key, $payload) = @_;
    my @tls = $how eq 'tls' ? ("$root/cert.pem", 'idem.test') : ();
    my $port = $how eq 'tls' ? $tls_port : $h2c_port;
    $port = $1 if $how =~ /:(\d+)$/;
    open my $fh, '-|', $py, 't/lib/grpc_client.py', "127.0.0.1:$port",
        "/idem.Pay/$method", $key, $payload, @tls
        or die "cannot run the gRPC client: $!";
    my $out = do { local $/; <$fh> };
    close $fh;
    my $r = eval { decode_json($out) } || { code => 'NO-OUTPUT' };
    $r->{meta} = { map { @$_ } @{ $r->{initial} || [] } };
    $r->{trail} = { map { @$_ } @{ $r->{trailing} || [] } };
    return $r;
}

for my $how (qw(h2c tls)) {
    my $k = "$how-" . time();

    # OK with a custom trailer
    my $n = executions();
    my $before = records();
    my $a = call($how, 'Charge', "$k-ok", 'pay 5');
    is($a->{code}, 'OK', "$how: the first call executes");
    like($a->{payload} // '', qr/^charged \d+: pay 5$/, "  its payload");
    like($a->{trail}{'x-trailer'} // '', qr/^charge-\d+$/,
         "  its custom trailer");
    ok(!exists $a->{meta}{'idempotent-replayed'}, "  not a replay");
    is(executions(), $n + 1, "  executed once");
    is(state_of(new_record($before)), 4, "  stored with its trailers");

    my $b = call($how, 'Charge', "$k-ok", 'pay 5');
    is($b->{code}, 'OK', "$how: the retry succeeds");
    is($b->{meta}{'idempotent-replayed'}, 'true', "  as a replay");
    is($b->{payload}, $a->{payload}, "  with the same payload");
    is($b->{trail}{'x-trailer'}, $a->{trail}{'x-trailer'},
       "  and the same custom trailer");
    is(executions(), $n + 1, "  not executed again");

    # the 422 problem is no gRPC answer: the client says UNKNOWN, quietly
    local $ENV{GRPC_VERBOSITY} = 'NONE';
    my $c = call($how, 'Charge', "$k-ok", 'pay 6');
    is($c->{code}, 'UNKNOWN', "$how: same key, other payload: refused")
        or diag explain $c;
    like($c->{details} // '', qr/status: 422/, "  by the HTTP 422");
    is(executions(), $n + 1, "  not executed");

    # a message, then ABORTED in the trailers: a gRPC error is stored too
    # (HTTP status 200)
    $n = executions();
    $a = call($how, 'Fail', "$k-fail", 'pay 7');
    is($a->{code}, 'ABORTED', "$how: a failing call: ABORTED");
    like($a->{details} // '', qr/^insufficient funds \(\d+\)$/,
         "  with its grpc-message");
    like($a->{trail}{'x-trailer'} // '', qr/^fail-\d+$/, "  and trailer");
    is(executions(), $n + 1, "  executed once");

    $b = call($how, 'Fail', "$k-fail", 'pay 7');
    is($b->{code}, 'ABORTED', "$how: its retry: the same grpc-status");
    is($b->{details}, $a->{details}, "  the same grpc-message");
    is($b->{trail}{'x-trailer'}, $a->{trail}{'x-trailer'},
       "  the same custom trailer");
    is($b->{meta}{'idempotent-replayed'}, 'true', "  as a replay");
    is(executions(), $n + 1, "  not executed again");

    # trailers-only (no message): grpc-status comes in the headers
    $n = executions();
    $before = records();
    $a = call($how, 'Abort', "$k-abort", 'pay 8');
    is($a->{code}, 'ABORTED', "$how: a trailers-only answer: ABORTED");
    like($a->{details} // '', qr/^aborted \(\d+\)$/, "  with its message");
    is(state_of(new_record($before)), 2,
       "  stored without trailers, as before");

    $b = call($how, 'Abort', "$k-abort", 'pay 8');
    is($b->{code}, 'ABORTED', "$how: its retry: the same grpc-status");
    is($b->{details}, $a->{details}, "  the same grpc-message");
    # trailers-only: the client sees the headers as trailing metadata
    is($b->{trail}{'idempotent-replayed'}, 'true', "  as a replay");
    is(executions(), $n + 1, "  executed once");
}

# HTTP/1.1 in front of grpc_pass: the response is chunked and the trailers
# follow the last chunk; the replay must be chunked with the same trailers
# although its length is known

sub h1_call {
    my ($method, $key, $payload) = @_;
    my $frame = pack('CN', 0, length $payload) . $payload;
    my $s = IO::Socket::INET->new(PeerAddr => "127.0.0.1:$h1_port",
                                  Timeout => 10 * $slow) or return {};
    print $s "POST /idem.Pay/$method HTTP/1.1\r\nHost: idem.test\r\n"
        . "Connection: close, TE\r\nTE: trailers\r\n"
        . "Content-Type: application/grpc\r\nIdempotency-Key: $key\r\n"
        . "Content-Length: " . length($frame) . "\r\n\r\n$frame";
    my $res = do { local $/; <$s> } // '';
    my ($head, $rest) = split /\r\n\r\n/, $res, 2;
    my %r = (head => $head // '', body => '', trailers => '');
    $rest //= '';
    if ($r{head} =~ /^Transfer-Encoding: chunked\r?$/mi) {
        while ($rest =~ s/\A([0-9a-f]+)\r\n//i) {
            my $len = hex $1;
            if ($len == 0) {
                ($r{trailers} = $rest) =~ s/\r\n\r\n\z//;
                last;
            }
            $r{body} .= substr($rest, 0, $len, '');
            $rest =~ s/\A\r\n//;
        }
    }
    $r{trailer} = { map { /^([^:]+):\s*(.*)$/ ? (lc $1 => $2) : () }
                    split /\r\n/, $r{trailers} };
    return \%r;
}

{
    my $k = "h1-" . time();
    my $n = executions();
    my $a = h1_call('Charge', "$k-ok", 'pay 9');
    like($a->{head}, qr{^HTTP/1\.1 200}, "HTTP/1.1: the first call: 200");
    like($a->{body}, qr/charged \d+: pay 9\z/, "  its message");
    is($a->{trailer}{'grpc-status'}, '0', "  grpc-status 0 in the trailers")
        or diag explain $a;
    like($a->{trailer}{'x-trailer'} // '', qr/^charge-\d+$/,
         "  with the custom trailer");

    my $b = h1_call('Charge', "$k-ok", 'pay 9');
    like($b->{head}, qr{^HTTP/1\.1 200}, "HTTP/1.1: the retry: 200");
    like($b->{head}, qr/^Idempotent-Replayed: true\r?$/m, "  replayed");
    like($b->{head}, qr/^Transfer-Encoding: chunked\r?$/m, "  chunked");
    unlike($b->{head}, qr/^Content-Length:/mi, "  without Content-Length");
    is($b->{body}, $a->{body}, "  the same message");
    is_deeply($b->{trailer}, $a->{trailer}, "  the same trailers")
        or diag explain $b;
    is(executions(), $n + 1, "  executed once");

    $a = h1_call('Fail', "$k-fail", 'pay 10');
    $b = h1_call('Fail', "$k-fail", 'pay 10');
    is($a->{trailer}{'grpc-status'}, '10',
       "HTTP/1.1: ABORTED is grpc-status 10");
    like($a->{body}, qr/declined \d+: pay 10\z/,
         "  after a message the gRPC client never shows");
    is($b->{body}, $a->{body}, "  the retry: the same message");
    is_deeply($b->{trailer}, $a->{trailer}, "  and the same trailers")
        or diag explain $b;
    is(executions(), $n + 2, "  executed once");
}

# the trailers count in idempotency_store_max_size: a limit that holds the
# head and body of a Charge answer (the same sizes give the same record)
# but not its trailers stores it as too large, and the retry is refused

{
    my $k = "small-" . time();
    my $before = records();
    call('h2c', 'Charge', "$k-probe", 'pay 11');
    my $size = redis_cli('STRLEN', new_record($before));
    ok($size > 100, "a Charge record of $size bytes");

    $small = nginx_conf('small', <<"EOC");
    idempotency_redis 127.0.0.1:$ENV{TEST_NGINX_REDIS_PORT};
    idempotency_redis_prefix grpc:;
    server {
        listen 127.0.0.1:$small_port http2;
        location /idem.Pay/ {
            idempotency on;
            idempotency_store_max_size @{[ $size - 3 ]};
            grpc_pass grpc://127.0.0.1:$grpc_port;
        }
    }
EOC
    nginx_start($small);
    sleep 0.3 * $slow;

    my $n = executions();
    $before = records();
    my $a = call("h2c:$small_port", 'Charge', "$k-big", 'pay 12');
    is($a->{code}, 'OK', "too large with its trailers: the call succeeds");
    is($a->{trail}{'x-trailer'} // '', 'charge-' . ($n + 1),
       "  with its trailer");
    is(state_of(new_record($before)), 3, "  stored as too large");

    local $ENV{GRPC_VERBOSITY} = 'NONE';
    my $b = call("h2c:$small_port", 'Charge', "$k-big", 'pay 12');
    like($b->{details} // '', qr/status: 409/, "  the retry: 409");
    is(executions(), $n + 1, "  not executed again");
    is(join('', log_problems("$small/logs/error.log")), '',
       "  no alert, crash or leaked socket");
}

# a call that committed and answered after grpc_read_timeout: its outcome
# is unknown, and a retry is told so without running it again
{
    local $ENV{GRPC_VERBOSITY} = 'NONE';
    my $k = "slow-" . time();
    my $n = scalar grep { /^Slow / } lines_of($counter);
    my $a = call('h2c', 'Slow', $k, 'pay 13');
    is($a->{code}, 'UNAVAILABLE', "slow: the first call times out (504)");
    sleep 1.3 * $slow;
    my $b = call('h2c', 'Slow', $k, 'pay 13');
    isnt($b->{code}, 'OK', "slow: the retry is not run");
    like($b->{details} // '', qr/504/, "  it is told 504 (outcome-unknown)");
    is(scalar(grep { /^Slow / } lines_of($counter)), $n + 1,
       "  the call ran once");
}

is(join('', log_problems("$nginx/logs/error.log")), '',
   "no alert, crash or leaked socket");
unlike(join('', lines_of("$nginx/logs/error.log")), qr/corrupt record/,
       "no record refused");

done_testing();
