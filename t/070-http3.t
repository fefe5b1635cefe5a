# HTTP/3: a protected location behind `listen ... quic` behaves as it does
# over HTTP/1.1 and HTTP/2, with real clients: curl --http3-only for the
# first request, its replay (over HTTP/3 and HTTP/1.1 alike), a 409 while
# the original is held upstream, a 422 for the same key with another body,
# and outcome-unknown after an upstream timeout; aioquic
# (t/lib/h3_client.py) for a client that goes away once its request
# reached the upstream: by STOP_SENDING on its stream, by closing the QUIC
# connection, and by closing it while nginx stops gracefully.  Each time
# the upstream's late answer is stored and replayed, and it ran once.  And
# worker_shutdown_timeout still ends a held request (its claim kept, the
# retry told outcome-unknown).
# The upstream is the test's own (t/lib/Held.pm): every request that
# reaches it is taken by the test and answered when the test says, so
# "held", "still running" and "ran once" are facts, not timing.
# Skips where nginx has no HTTP/3 or curl speaks none (Debian 12); runs in
# util/trixie.sh's Debian 13 root, which has both, and python3-aioquic.
# Plain Test::More: its own nginx on 20860 (QUIC and HTTP/1.1), the
# upstream on 20861.
use strict;
use warnings;
use lib 't/lib';
use Test::More;
use Fleet;
use Held;
use IO::Select;
use IPC::Open2;
use Time::HiRes qw(sleep time);

plan skip_all => 'TEST_NGINX_LOAD_MODULES must name the module'
    unless have_module();

my $bin = $ENV{TEST_NGINX_BINARY} || 'nginx';
my $v = `$bin -V 2>&1`;
plan skip_all => 'nginx without HTTP/3 (nginx -V lacks '
    . '--with-http_v3_module)' unless $v =~ /--with-http_v3_module/;
plan skip_all => 'curl without HTTP/3 (no HTTP3 in curl -V\'s features)'
    unless `curl -V 2>/dev/null` =~ /^Features:.*\bHTTP3\b/m;

my $slow = $ENV{TEST_ASAN} ? 3 : 1;
my $py = $ENV{TEST_PYTHON} || '/usr/bin/python3';
my $aioquic = system("$py -c 'import aioquic' 2>/dev/null") == 0;
my $debug = $v =~ /--with-debug/;
my ($port, $up_port) = (20860, 20861);
my $redis_port = $ENV{TEST_NGINX_REDIS_PORT} || 6379;
my $root = fleet_root('http3');
my $run = int(time * 1000) . '-';

# QUIC has no plain text: a certificate of the test's own
my $req = 'openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1'
    . " -nodes -days 1 -subj /CN=localhost -keyout $root/key.pem"
    . " -out $root/cert.pem 2>&1";
$req = `$req`;
BAIL_OUT("openssl req failed: $req") if $?;

my $up = Held->new($up_port);

# one worker: a client's datagrams and the next connection's meet in the
# same worker, in the order they were sent (the barrier of the close case)
# worker_shutdown_timeout: room for a quit whose request the test answers
my $shutdown = 3 * $slow;
my $main = "worker_shutdown_timeout ${shutdown}s;";
my $dir = nginx_conf('edge', <<"EOC", 1, $main);
    idempotency_redis 127.0.0.1:$redis_port;
    server {
        listen 127.0.0.1:$port quic;
        listen 127.0.0.1:$port;
        ssl_certificate $root/cert.pem;
        ssl_certificate_key $root/key.pem;
        error_log logs/error.log info;
        @{[ $debug ? 'error_log logs/debug.log debug;' : '' ]}
        add_header X-Idem \$idempotency_status always;
        proxy_read_timeout @{[ 10 * $slow ]}s;
        location /pay {
            idempotency on;
            proxy_pass http://127.0.0.1:$up_port;
        }
        location /late {
            idempotency on;
            proxy_read_timeout @{[ 300 * $slow ]}ms;
            proxy_pass http://127.0.0.1:$up_port;
        }
        location /gone {
            idempotency on;
            # the retry waits for the stored answer of a client gone
            idempotency_wait @{[ 10 * $slow ]}s;
            proxy_pass http://127.0.0.1:$up_port;
        }
        location = /ping { return 200 "pong\\n"; }
    }
EOC
nginx_start($dir);

# a request goes out over HTTP/3 once nginx answers it there
my $up_h3 = 0;
for (1 .. 50) {
    last if $up_h3 = `curl -sk --http3-only -m 2 https://127.0.0.1:$port/ping`
                     eq "pong\n";
    sleep 0.1;
}
ok($up_h3, 'nginx answers over HTTP/3') or BAIL_OUT('no HTTP/3');

# h3(key, body, path): curl --http3-only in the background -> its handle;
# done(handle) -> {status, idem, body, head}
sub h3 {
    my ($key, $body, $path) = @_;
    open(my $fh, '-|', 'curl', '-sk', '-i', '--http3-only', '-m',
         15 * $slow, '-X', 'POST', '-H', "Idempotency-Key: $run$key",
         '-H', 'Content-Type: application/json', '--data-binary', $body,
         "https://127.0.0.1:$port" . ($path // '/pay'))
        or die "curl: $!";
    return $fh;
}

sub done {
    my $fh = shift;
    my $out = do { local $/; <$fh> } // '';
    close $fh;
    my ($head, $b) = split /\r\n\r\n/, $out, 2;
    my ($status) = ($head // '') =~ m{^HTTP/3 (\d+)};
    my ($idem) = ($head // '') =~ /^x-idem: (\w+)/mi;
    return { status => $status // 0, idem => $idem // '-', body => $b // '',
             head => $head // '' };
}

sub post { done(h3(@_)) }

sub st { "$_[0]{status} $_[0]{idem}" }

# served(body[, status]): the upstream takes the next request, answers it
# -> the request's head
sub served {
    my ($body, $status) = @_;
    my $c = $up->take(10 * $slow) or return '';
    my $head = $up->head($c);
    $up->answer($c, $body, $status // 201);
    return $head;
}

# nothing more reached the upstream
sub upstream_idle {
    my $c = $up->take(0.3) or return 1;
    diag 'an unexpected request upstream: ' . $up->head($c);
    close $c;
    return 0;
}

# --- the first request, its replay ------------------------------------------

my $first = h3('first-1', '{"amount":1000}');
like(served("paid 1\n"), qr/^Idempotency-Key: \Q${run}first-1\E\r$/mi,
     'the first request reaches the upstream, with its key');
my $r = done($first);
is(st($r), '201 new', 'HTTP/3: the first request, 201 new');
is($r->{body}, "paid 1\n", '...with the upstream\'s body');

$r = post('first-1', '{"amount":1000}');
is(st($r), '201 replay', 'its retry over HTTP/3 is a replay');
is($r->{body}, "paid 1\n", '...of the same body');
like($r->{head}, qr/^idempotent-replayed: true\r?$/mi,
     '...marked Idempotent-Replayed');
my $h1 = http_post($port, "${run}first-1", '{"amount":1000}');
is(idem_status($h1), '201 replay', 'over HTTP/1.1, the same replay');
is($h1->{body}, "paid 1\n", '...the same body');
ok(upstream_idle(), 'the upstream ran once');

# --- 409: a duplicate while the original is held upstream -------------------

my $orig = h3('held-1', '{"amount":2000}');
my $c = $up->take(10 * $slow);
ok($c, 'the original is held upstream');
$r = post('held-1', '{"amount":2000}');
is(st($r), '409 conflict', 'a duplicate at once over HTTP/3: 409');
like($r->{body}, qr/"code":"request-in-progress"/, '...request-in-progress');
like($r->{head}, qr/^retry-after: 1\r?$/mi, '...Retry-After: 1');
$up->answer($c, "paid 2\n", 201) if $c;
is(st(done($orig)), '201 new', 'the original is answered');
is(st(post('held-1', '{"amount":2000}')), '201 replay',
   'the duplicate, retried, is a replay');
ok(upstream_idle(), 'the upstream ran once');

# --- 422: the same key, another body -----------------------------------------

$r = post('first-1', '{"amount":9999}');
is(st($r), '422 mismatch', 'the same key with another body: 422');
like($r->{body}, qr/"code":"key-reuse-mismatch"|"status":422/,
     '...a problem document');
ok(upstream_idle(), 'the upstream did not run');

# --- outcome-unknown: the upstream got the request, then timed out ----------

my $late = h3('late-1', '{"amount":3000}', '/late');
$c = $up->take(10 * $slow);
ok($c, 'the request reached the upstream, which does not answer');
$r = done($late);
is(st($r), '504 new', 'proxy_read_timeout: 504');
like($r->{body}, qr/"code":"outcome-unknown"/, '...outcome-unknown');
close $c if $c;
$r = post('late-1', '{"amount":3000}', '/late');
is(st($r), '504 unknown', 'its retry over HTTP/3: 504 unknown');
like($r->{body}, qr/"code":"outcome-unknown"/, '...outcome-unknown');
like($r->{head}, qr/^x-should-retry: false\r?$/mi, '...x-should-retry: false');
ok(upstream_idle(), 'the upstream did not run again');

# --- a client that goes away once its request reached the upstream ---------

# gone(key, mode, %hooks): an aioquic client sends its request; once the
# upstream holds it (then before_go runs), the client goes away (mode:
# stop, close), and nginx has seen it go (its RESET_STREAM, a later
# connection's answer, or what before_answer waits for) before the
# upstream answers -> (held, what the client printed)
sub gone {
    my ($key, $mode, %hook) = @_;
    # a client that exits early must not end the test through Fleet's
    # SIGPIPE handler: what it printed says what went wrong
    local $SIG{PIPE} = 'IGNORE';
    my $pid = open2(my $out, my $in, $py, 't/lib/h3_client.py', $port,
                    '/gone', "$run$key", '{"amount":4000}', $mode);
    my $sel = IO::Select->new($out);
    my $said = '';
    my $read = sub {
        my $l = $sel->can_read(15 * $slow) ? <$out> // '' : '';
        chomp $l;
        $said .= "$l ";
        return $l;
    };
    my $sent = $read->();
    my $held = $sent eq 'sent' ? $up->take(10 * $slow) : undef;
    if ($held) {
        $hook{before_go}->() if $hook{before_go};
        print $in "go\n";
        $in->flush;
        my $went = $read->();
        if ($hook{before_answer}) {
            $hook{before_answer}->();
        } elsif ($went eq 'closed') {
            # the client's last datagrams are read before the next
            # connection's, whose answer takes round trips more
            `curl -sk --http3-only -m 5 https://127.0.0.1:$port/ping`;
        }
        $up->answer($held, "paid once ($mode)\n", 201);
    }
    print $in "bye\n";
    close $in;
    waitpid $pid, 0;
    $said =~ s/\s+$//;
    return ($held ? 1 : 0, $said);
}

# wait_for(file, pattern, count): until file has more than count lines
# that match, 10 s at most -> whether it did
sub wait_for {
    my ($file, $re, $was) = @_;
    my $t = time + 10 * $slow;
    while (time < $t) {
        my $n = () = grep { /$re/ } lines_of($file);
        return 1 if $n > $was;
        sleep 0.05;
    }
    return 0;
}

sub count_of {
    my ($file, $re) = @_;
    my $n = () = grep { /$re/ } lines_of($file);
    return $n;
}

# replayed(key, mode, what): the retries of a client gone
sub replayed {
    my ($key, $mode, $what) = @_;
    my $r = post($key, '{"amount":4000}', '/gone');
    is(st($r), '201 replay', "$what: the retry over HTTP/3 gets the stored "
       . 'answer');
    is($r->{body}, "paid once ($mode)\n", '...the upstream\'s own');
    $r = http_post($port, "$run$key", '{"amount":4000}', '/gone');
    is(idem_status($r), '201 replay', '...over HTTP/1.1 too');
    ok(upstream_idle(), '...and the upstream ran once');
}

# stopped_within(seconds): nginx, told to quit, is gone by then
sub stopped_within {
    my $t = time + shift;
    sleep 0.05 while -e "$dir/logs/nginx.pid" && time < $t;
    return !-e "$dir/logs/nginx.pid";
}

# the module's word, in a debug log, that it kept the upstream of a client
# gone: the check this file is about
my $kept = qr/idempotency: client gone, upstream kept/;

# kept_since(count): the module said so since
sub kept_since {
    my $was = shift;
    SKIP: {
        skip 'nginx without --with-debug', 1 unless $debug;
        ok(count_of("$dir/logs/debug.log", $kept) > $was,
           '...the module saw the client go and kept the upstream');
    }
}

SKIP: {
    skip 'no python3-aioquic (util/trixie.sh\'s root has it)', 20
        unless $aioquic;

    my $was = $debug ? count_of("$dir/logs/debug.log", $kept) : 0;
    my ($held, $said) = gone('stop-1', 'stop');
    ok($held, 'STOP_SENDING: the request was held upstream');
    is($said, 'sent reset', '...the client stopped the stream, and nginx '
       . 'reset it before the upstream answered');
    kept_since($was);
    replayed('stop-1', 'stop', 'STOP_SENDING');

    $was = $debug ? count_of("$dir/logs/debug.log", $kept) : 0;
    ($held, $said) = gone('close-1', 'close');
    ok($held, 'CONNECTION_CLOSE: the request was held upstream');
    is($said, 'sent closed', '...the client closed its QUIC connection');
    kept_since($was);
    replayed('close-1', 'close', 'CONNECTION_CLOSE');

    # nginx -s quit: the worker exits once its requests are done, and a
    # QUIC connection closed then marks its streams "close", as the
    # worker_shutdown_timeout would: the module tells the two apart
    SKIP: {
        skip 'nginx without --with-debug: nothing tells when it saw the '
            . 'client go', 6 unless $debug;
        my $quit = qr/gracefully shutting down/;
        my $quits = count_of("$dir/logs/error.log", $quit);
        $was = count_of("$dir/logs/debug.log", $kept);
        my ($exiting, $saw);
        ($held, $said) = gone('quit-1', 'close',
            before_go => sub {
                nginx_signal($dir, 'quit');
                $exiting = wait_for("$dir/logs/error.log", $quit, $quits);
            },
            before_answer => sub {
                $saw = wait_for("$dir/logs/debug.log", $kept, $was);
            });
        ok($held && $exiting, 'nginx -s quit while the request is held '
           . 'upstream: the worker is exiting');
        ok($saw, '...the client closed its connection, and the module kept '
           . 'the upstream');
        ok(stopped_within(10 * $slow), '...the worker stored it and exited');
        nginx_start($dir);
        replayed('quit-1', 'close', 'while nginx quits');
    }
}

# --- worker_shutdown_timeout ends a request that is still held -------------

# its stream is one of the worker's connections, marked to close: the
# request ends, the claim stays, and the retry is told outcome-unknown
{
    my $held = h3('shut-1', '{"amount":5000}');
    $c = $up->take(10 * $slow);
    ok($c, 'worker_shutdown_timeout: the request is held upstream');
    my $t0 = time;
    nginx_signal($dir, 'quit');
    ok(stopped_within($shutdown + 5 * $slow),
       'nginx ends the request once worker_shutdown_timeout passed');
    ok(time - $t0 > $shutdown - 0.5, '...not before');
    done($held);
    close $c if $c;
    nginx_start($dir);
    for (1 .. 40) {     # the new worker connects to Redis first
        $r = post('shut-1', '{"amount":5000}');
        last if $r->{status} != 503;
        sleep 0.1;
    }
    is(st($r), '502 unknown', 'its retry: 502 unknown');
    like($r->{body}, qr/"code":"outcome-unknown"/, '...outcome-unknown');
    ok(upstream_idle(), '...and the upstream did not run again');
}

my @problems = log_problems("$dir/logs/error.log");
is(scalar @problems, 0, 'no alert, no crash') or diag @problems;

done_testing();
