# Hostile clients and worker shutdown, with real nginx instances:
# - an owner whose client stops reading (send_timeout) must not let a
#   retry execute again: the response is read and stored (buffered and
#   unbuffered proxying);
# - worker_shutdown_timeout ends an owner's request; the claim is kept;
# - an HTTP/2 body over client_max_body_size, after reading went
#   asynchronous, gets its error page and never hangs.
# Plain Test::More: it starts its own nginx instances with master processes.
use strict;
use warnings;
use lib 't/lib';
use Test::More;
use Fleet;
use IO::Socket::INET;
use Socket qw(SOL_SOCKET SO_RCVBUF);
use Time::HiRes qw(sleep time);

plan skip_all => 'TEST_NGINX_LOAD_MODULES must name the module'
    unless have_module();

my $redis_port = $ENV{TEST_NGINX_REDIS_PORT} || 6379;
my $slow = $ENV{TEST_ASAN} ? 3 : 1;    # AddressSanitizer is slow
my ($backend_port, $edge_port, $h2_port) = (19970, 19971, 19972);
my $size = 4 * 1024 * 1024;

my $root = fleet_root('hostile');

sub executions {
    my $uri = shift;
    scalar(grep { index($_, $uri) == 0 } lines_of("$root/backend/logs/exec.log"));
}

my $backend = nginx_conf('backend', <<"EOC", 1);
    log_format exec '\$uri';
    server {
        listen 127.0.0.1:$backend_port;
        access_log logs/exec.log exec;
        location /big {
            alias $root/big.bin;
        }
        location /sleepy {
            echo_sleep 3;
            echo "slept";
        }
        location /page {
            return 413 "too big\\n";
        }
    }
EOC

open my $fh, '>', "$root/big.bin" or die $!;
print $fh join('', map { sprintf "%07d\n", $_ } 0 .. $size / 8 - 1);
close $fh;

my $edge = nginx_conf('edge', <<"EOC", 1, 'worker_shutdown_timeout 1s;');
    idempotency_redis 127.0.0.1:$redis_port;
    server {
        listen 127.0.0.1:$edge_port sndbuf=16k;
        listen 127.0.0.1:$h2_port http2;
        send_timeout 1s;
        idempotency_store_max_size 8m;
        location /big {
            idempotency on;
            proxy_method GET;
            proxy_pass http://127.0.0.1:$backend_port;
        }
        location /unbuffered/ {
            idempotency on;
            proxy_buffering off;
            proxy_method GET;
            proxy_pass http://127.0.0.1:$backend_port/;
        }
        location /sleepy {
            idempotency on;
            proxy_pass http://127.0.0.1:$backend_port;
        }
        location /limited {
            idempotency on;
            client_max_body_size 10;
            error_page 413 /too-big;
            proxy_pass http://127.0.0.1:$backend_port;
        }
        location = /too-big {
            idempotency on;
            proxy_pass http://127.0.0.1:$backend_port/page;
        }
    }
EOC

nginx_start($_) for $backend, $edge;
sleep 0.5;

my $run = "h" . int(time * 1000);

# The owner's client reads the headers, then stops reading for longer than
# send_timeout without closing, then goes away.
sub stalled_owner {
    my ($path, $key) = @_;
    my $s = IO::Socket::INET->new(Proto => 'tcp');
    setsockopt($s, SOL_SOCKET, SO_RCVBUF, 4096);
    $s->connect(Socket::pack_sockaddr_in($edge_port,
                                          Socket::inet_aton('127.0.0.1')))
        or die "connect: $!";
    print $s "POST $path HTTP/1.1\r\nHost: x\r\nIdempotency-Key: $key\r\n"
             . "Content-Length: 1\r\n\r\nx";
    sysread($s, my $head, 1024);
    sleep 2.5 * $slow;
    close $s;
    return $head // '';
}

for my $path ('/big', '/unbuffered/big') {
    my $key = "$run$path";
    my $head = stalled_owner($path, $key);
    like($head, qr{^HTTP/1\.1 200}, "$path: the stalled owner got its header");

    my $r;
    for (1 .. 20 * $slow) {
        $r = http_post($edge_port, $key, 'x', $path, '', 10 * $slow);
        last if $r->{status} != 409;
        sleep 0.25;
    }
    is($r->{status}, 200, "$path: the retry is answered 200");
    like($r->{head}, qr/^Idempotent-Replayed: true/mi,
         "$path: the retry is a replay");
    is(length $r->{body}, $size, "$path: the replay has the whole body");
    is(executions($path =~ s{^/unbuffered}{}r), $path eq '/big' ? 1 : 2,
       "$path: the upstream ran once for the key");
}

# worker_shutdown_timeout ends the owner's request after it was sent: the
# outcome is unknown, and so its retries are told
{
    my $key = "$run-shutdown";
    my $pid = sub { (split ' ', `pgrep -P $_[0] -f 'worker process'`)[0] };
    my $master = join '', lines_of("$edge/logs/nginx.pid");
    chomp $master;
    my $worker = $pid->($master);

    my $s = IO::Socket::INET->new(PeerAddr => "127.0.0.1:$edge_port")
        or die $!;
    print $s "POST /sleepy HTTP/1.1\r\nHost: x\r\nIdempotency-Key: $key\r\n"
             . "Content-Length: 1\r\n\r\nx";
    sleep 0.5;
    my $t0 = time;
    nginx_signal($edge, 'reload');
    my $gone;
    for (1 .. 60) {
        sleep 0.1;
        if (!kill 0, $worker) { $gone = time - $t0; last }
    }
    ok(defined $gone && $gone < 2.5 * $slow,
       "worker_shutdown_timeout ends the owner's request ("
       . (defined $gone ? sprintf("%.1f s", $gone) : "still running") . ")");
    close $s;
    sleep 3;
    my $r;
    for (1 .. 20) {     # the new worker may still be connecting to Redis
        $r = http_post($edge_port, $key, 'x', '/sleepy');
        last if $r->{status} != 503;
        sleep 0.25;
    }
    is($r->{status}, 502, "after the shutdown the retry gets 502");
    like($r->{body}, qr/"code":"outcome-unknown"/, "...outcome-unknown");
    is(executions('/sleepy'), 1, "the upstream ran once");
    my ($line) = grep { /outcome unknown/ } lines_of("$edge/logs/error.log");
    like($line // '', qr/\[error\].*outcome unknown: .* retries get outcome-unknown, key hash [0-9a-f]{64}, client: 127\.0\.0\.1, request: "POST \/sleepy HTTP\/1\.1"/,
         "the unknown outcome is logged at error, with the key hash and request");

    # the same over HTTP/2: the stream's connection is the one closed
    SKIP: {
        skip "curl without HTTP/2", 1 unless `curl -V` =~ /HTTP2/;
        $master = join '', lines_of("$edge/logs/nginx.pid");
        chomp $master;
        $worker = $pid->($master);
        my $curl = fork // die;
        if ($curl == 0) {
            exec("curl -s -o /dev/null -m 10 --http2-prior-knowledge -X POST "
                 . "-d x -H 'Idempotency-Key: $key-h2' "
                 . "http://127.0.0.1:$h2_port/sleepy");
        }
        sleep 0.5;
        $t0 = time;
        nginx_signal($edge, 'reload');
        undef $gone;
        for (1 .. 60) {
            sleep 0.1;
            if (!kill 0, $worker) { $gone = time - $t0; last }
        }
        waitpid $curl, 0;
        ok(defined $gone && $gone < 2.5 * $slow,
           "HTTP/2: worker_shutdown_timeout ends the owner's request ("
           . (defined $gone ? sprintf("%.1f s", $gone) : "still running")
           . ")");
    }
}

# HTTP/2: a body over the limit, sent after reading went asynchronous
SKIP: {
    skip "curl without HTTP/2", 3
        unless `curl -V` =~ /HTTP2/;
    my $cmd = "(printf hello; sleep 0.3; printf '%0100d' 0) | curl -s -m 5 "
              . "--http2-prior-knowledge -X POST -T - "
              . "-H 'Idempotency-Key: $run-h2' -w '\\n%{http_code}' "
              . "http://127.0.0.1:$h2_port/limited";
    # nginx resets the stream after its 413 while curl may still be
    # sending, and curl then reports a failed transfer: what counts is
    # that nginx answered at once, with its error page
    my $t0 = time;
    my $out = `$cmd`;
    my $took = time - $t0;
    ok($took < 3 * $slow, sprintf("HTTP/2: answered in %.1f s, no hang",
                                  $took));
    is(executions('/page'), 1, "HTTP/2: the error page ran");
    my $r = http_post($edge_port, "$run-h2", 'x', '/limited');
    isnt($r->{status}, 409, "HTTP/2: the failed body claimed nothing");
}

nginx_stop($_) for $edge, $backend;

my @problems = (log_problems("$edge/logs/error.log"),
                log_problems("$backend/logs/error.log"));
is(scalar @problems, 0, "no alerts, crashes or sockets left")
    or diag explain \@problems;

done_testing();
