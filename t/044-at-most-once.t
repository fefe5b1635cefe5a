# At most once under every fault: an upstream that may have run the request
# and never answered leaves the key "unknown", never free; idempotency_on_
# unknown keep | forward | release; leases renewed while the owner lives; a
# dead owner's key reads as unknown; nothing stuck where nothing ran.
# Plain Test::More: its own nginx instances (two edges, one origin).
use strict;
use warnings;
use lib 't/lib';
use Test::More;
use Fleet;
use Time::HiRes qw(sleep time);

plan skip_all => 'TEST_NGINX_LOAD_MODULES must name the module'
    unless have_module();

my $redis_port = $ENV{TEST_NGINX_REDIS_PORT} || 6379;
my $slow = $ENV{TEST_ASAN} ? 3 : 1;    # AddressSanitizer is slow
my ($edge_a, $edge_b, $origin_port, $dead_port, $h2_port)
    = (19980, 19981, 19982, 19983, 19984);

my $root = fleet_root('once');

# the origin: executes (logs the key), then behaves as the path says
my $origin = nginx_conf('origin', <<"EOC", 1);
    log_format exec '\$http_idempotency_key \$uri \$http_idempotency_previous_outcome';
    server {
        listen 127.0.0.1:$origin_port;
        access_log logs/exec.log exec;
        location /late {                   # commits, answers too late
            echo_sleep @{[ 1.2 * $slow ]};
            echo "charged";
        }
        location /reset { return 444; }    # commits, resets
        location /err { return 500 "failed after commit\\n"; }
        location /busy { return 503 "try later\\n"; }
        location /slow {                   # slower than the lock
            echo_sleep @{[ 2.4 * $slow ]};
            echo "charged slowly";
        }
        location /reconcile {              # answers a retry it recognises
            if (\$http_idempotency_previous_outcome = unknown) {
                return 200 "reconciled\\n";
            }
            echo_sleep @{[ 1.2 * $slow ]};
            echo "charged";
        }
        location /quick { return 201 "ok\\n"; }
    }
EOC

my $front = sub {
    my ($port, $extra) = @_;
    $extra //= '';
    return <<"EOC";
    idempotency_redis 127.0.0.1:$redis_port;
    idempotency_redis_timeout @{[ 300 * $slow ]}ms;
    server {
        listen 127.0.0.1:$port;
        idempotency_metrics_zone api;
        add_header X-Idem \$idempotency_status always;
        proxy_read_timeout @{[ 500 * $slow ]}ms;
        $extra
        location / {
            idempotency on;
            proxy_pass http://127.0.0.1:$origin_port;
        }
        location /forward/ {
            idempotency on;
            idempotency_on_unknown forward;
            proxy_pass http://127.0.0.1:$origin_port/;
        }
        location /release/ {
            idempotency on;
            idempotency_on_unknown release;
            proxy_pass http://127.0.0.1:$origin_port/;
        }
        location /dry/ {
            idempotency on;
            idempotency_dry_run on;
            proxy_pass http://127.0.0.1:$origin_port/;
        }
        location /lease/ {
            idempotency on;
            idempotency_lock_ttl @{[ 1000 * $slow ]}ms;
            proxy_read_timeout 10s;
            proxy_pass http://127.0.0.1:$origin_port/;
        }
        location /long/ {
            idempotency on;
            proxy_read_timeout 10s;
            proxy_pass http://127.0.0.1:$origin_port/;
        }
        location /dead {
            idempotency on;
            proxy_pass http://127.0.0.1:$dead_port;
        }
        location /fallback/dead {
            idempotency on;
            error_page 502 504 =200 /fallback-page;
            proxy_pass http://127.0.0.1:$dead_port;
        }
        location /fallback/late {
            idempotency on;
            error_page 502 504 =200 /fallback-page;
            proxy_pass http://127.0.0.1:$origin_port/late;
        }
        location = /fallback-page { return 200 "we will get back to you\\n"; }
        location = /metrics { idempotency_metrics; }
    }
EOC
};

my $a = nginx_conf('a', $front->($edge_a), 2);
my $b = nginx_conf('b', $front->($edge_b, "listen 127.0.0.1:$h2_port http2;"),
                   2);
nginx_start($_) for $origin, $a, $b;
sleep 0.3;

# keys of this run only: the test Redis is shared with the other files
my $run = int(time * 1000) . '-';

sub runs {
    my ($key) = @_;
    sleep 0.2;
    return scalar grep { /^\Q$run$key\E / } lines_of("$origin/logs/exec.log");
}

sub post { http_post($_[0], "$run$_[1]", $_[3] // '{"amount":1000}', $_[2]) }

sub hdr {
    my ($r, $name) = @_;
    my ($v) = $r->{head} =~ /^\Q$name\E: ([^\r\n]*)/mi;
    return $v;
}

sub unknown_ok {
    my ($r, $status, $what) = @_;
    is(idem_status($r), "$status unknown", "$what: $status unknown");
    like($r->{body}, qr/"code":"outcome-unknown"/, "...outcome-unknown");
    like($r->{head}, qr{^Content-Type: application/problem\+json}mi,
         '...a problem document');
    is(hdr($r, 'x-should-retry'), 'false', '...x-should-retry: false');
    is(hdr($r, 'Stripe-Should-Retry'), 'false', '...Stripe-Should-Retry');
    is(hdr($r, 'Retry-After'), undef, '...no Retry-After');
}

# the incident: the payment commits, the answer comes after
# proxy_read_timeout; every retry used to run it again

my $r = post($edge_a, 'late-1', '/late');
is(idem_status($r), '504 new', 'the first request times out: 504');
is(hdr($r, 'x-should-retry'), 'false',
   '...and is told not to retry: a retry gets outcome-unknown');
is(hdr($r, 'Stripe-Should-Retry'), 'false', '...Stripe-Should-Retry');
like($r->{body}, qr/"code":"outcome-unknown"/,
     '...and told outcome-unknown itself, not nginx\'s page');
like($r->{head}, qr{^Content-Type: application/problem\+json}mi,
     '...a problem document');
sleep 1.0 * $slow;
unknown_ok(post($edge_a, 'late-1', '/late'), 504, 'a retry');
unknown_ok(post($edge_b, 'late-1', '/late'), 504, 'a retry on another edge');

# over HTTP/2, the same answer
SKIP: {
    skip "curl without HTTP/2", 3 unless `curl -V` =~ /HTTP2/;
    my $out = `curl -s -i --http2-prior-knowledge -X POST -d '{"amount":1000}' -H 'Idempotency-Key: ${run}late-1' http://127.0.0.1:$h2_port/late`;
    like($out, qr{^HTTP/2 504}m, 'HTTP/2: a retry gets 504');
    like($out, qr/"code":"outcome-unknown"/, '...outcome-unknown');
    like($out, qr/^x-should-retry: false/mi, '...x-should-retry: false');
}
is(runs('late-1'), 1, 'the origin executed once');

# the same with a reset after the request was sent

is(idem_status(post($edge_a, 'reset-1', '/reset')), '502 new',
   'a reset after the request was sent: 502');
unknown_ok(post($edge_b, 'reset-1', '/reset'), 502, 'its retry');
is(runs('reset-1'), 1, 'the origin executed once');

# an unreachable upstream ran nothing: released, with or without an
# error_page that makes a success of it

is(idem_status(post($edge_a, 'dead-1', '/dead')), '502 new',
   'an unreachable upstream: 502');
is(idem_status(post($edge_a, 'dead-1', '/dead')), '502 new',
   '...its retry tries again, nothing ran');
my $fb = post($edge_a, 'dead-2', '/fallback/dead');
is(idem_status($fb), '200 new', 'error_page 502 =200: the fallback page');
$fb = post($edge_b, 'dead-2', '/fallback/dead');
is(idem_status($fb), '200 new', '...not stored: the retry is not a replay');
is(hdr($fb, 'Idempotent-Replayed'), undef, '...no Idempotent-Replayed');

# an error_page in front of an upstream that got the request: unknown

$fb = post($edge_a, 'late-2', '/fallback/late');
is(idem_status($fb), '200 new', 'error_page after a timeout: the fallback');
sleep 1.0 * $slow;
unknown_ok(post($edge_b, 'late-2', '/fallback/late'), 504,
           '...its retry is told the truth');
is(runs('late-2'), 1, '...one execution');

# forward: one retry takes the record over and asks the origin, which
# recognises the key; its answer is stored

is(idem_status(post($edge_a, 'fwd-1', '/forward/reconcile')), '504 new',
   'forward: the first request times out');
sleep 1.0 * $slow;
$r = post($edge_b, 'fwd-1', '/forward/reconcile');
is(idem_status($r), '200 new', '...a retry reaches the origin');
is($r->{body}, "reconciled\n", '...with Idempotency-Previous-Outcome');
$r = post($edge_a, 'fwd-1', '/forward/reconcile');
is(idem_status($r), '200 replay', '...and that answer is replayed');
is($r->{body}, "reconciled\n", '...byte for byte');
# the origin logs a request once it has answered it: read its log until
# the line is there, not at once (a loaded machine)
my @fwd;
for (1 .. 30) {
    @fwd = grep { /^\Q$run\Efwd-1 / } lines_of("$origin/logs/exec.log");
    last if @fwd >= 2;
    sleep 0.1;
}
is(scalar(@fwd), 2, '...the origin saw two requests');
like($fwd[1] // '', qr/ unknown$/, '...the second marked unknown');

# release: the old behaviour, the retry runs again

is(idem_status(post($edge_a, 'rel-1', '/release/late')), '504 new',
   'release: the first request times out');
sleep 1.0 * $slow;
is(idem_status(post($edge_a, 'rel-1', '/release/late')), '504 new',
   '...a retry runs again');
sleep 1.0 * $slow;
is(runs('rel-1'), 2, '...two executions: what release allows');

# the amended default: an upstream's 500 is an answer, replayed as final;
# a 503 says nothing happened

is(idem_status(post($edge_a, 'err-1', '/err')), '500 new', 'a 500');
sleep 0.2;      # the store is sent as the response ends
$r = post($edge_b, 'err-1', '/err');
is(idem_status($r), '500 replay', '...is stored and replayed');
is(hdr($r, 'x-should-retry'), 'false', '...as final: x-should-retry false');
is(hdr($r, 'Stripe-Should-Retry'), 'false', '...Stripe-Should-Retry false');
is(runs('err-1'), 1, '...one execution');
is(idem_status(post($edge_a, 'busy-1', '/busy')), '503 new', 'a 503');
is(idem_status(post($edge_a, 'busy-1', '/busy')), '503 new',
   '...is released: the retry runs');

# a lease lives as long as its owner: duplicates at 1/3, 2/3 and 5/6 of
# an upstream twice as slow as the lock get 409, and it runs once

my $pid = fork // die;
if ($pid == 0) {
    my $o = post($edge_a, 'slow-1', '/lease/slow');
    exit($o->{status} == 200 ? 0 : 1);
}
my $last = 0;
for my $at (0.8, 1.6, 2.0) {
    sleep(($at - $last) * $slow);
    $last = $at;
    my $d = post($edge_b, 'slow-1', '/lease/slow');
    is(idem_status($d), '409 conflict', "a duplicate at ${at}s: 409");
    next if $at != 0.8;
    is(hdr($d, 'Retry-After'), '1', '...with Retry-After: 1');
    is(hdr($d, 'x-should-retry'), 'true', '...x-should-retry: true');
    is(hdr($d, 'Stripe-Should-Retry'), 'true', '...Stripe-Should-Retry: true');
}
waitpid $pid, 0;
is($? >> 8, 0, 'the slow original got its 200');
is(idem_status(post($edge_b, 'slow-1', '/lease/slow')), '200 replay',
   '...and is replayed after');
is(runs('slow-1'), 1, '...one execution, though it outlived the lock');

# dry run: unknown is only told by $idempotency_status

is(idem_status(post($edge_a, 'dry-1', '/dry/late')), '504 new',
   'dry run: the first times out');
sleep 1.0 * $slow;
is(idem_status(post($edge_a, 'dry-1', '/dry/late')), '504 unknown',
   '...its retry runs, marked unknown');

# metrics

my $m = http_get_metrics($edge_a);
like($m, qr/^nginx_idempotency_outcomes_unknown_total\{cause="upstream"\} [1-9]/m,
     'outcomes_unknown_total counts the upstream cause');
like($m, qr/^nginx_idempotency_requests_total\{zone="api",status="unknown"\} [1-9]/m,
     'requests_total has status="unknown"');

sub http_get_metrics {
    my $port = shift;
    my $s = IO::Socket::INET->new("127.0.0.1:$port") or return '';
    print $s "GET /metrics HTTP/1.0\r\nHost: x\r\n\r\n";
    local $/;
    return <$s> // '';
}

# a worker killed while its upstream works: the claim outlives it, and
# after idempotency_lock_ttl a retry on another edge is told "unknown"

$pid = fork // die;
if ($pid == 0) {
    post($edge_a, 'kill-1', '/lease/slow');
    exit 0;
}
sleep 0.5 * $slow;
my @workers = map { /^\s*(\d+)/ ? $1 : () }
              `pgrep -f ': worker process' -P \$(cat $a/logs/nginx.pid)`;
kill 'KILL', @workers;
waitpid $pid, 0;
is(idem_status(post($edge_b, 'kill-1', '/lease/slow')), '409 conflict',
   'a dead owner\'s claim: 409 while its lease lasts');
sleep 1.5 * $slow;      # its lease, and a third of it for the clocks
unknown_ok(post($edge_b, 'kill-1', '/lease/slow'), 502,
           'after the lease: the owner was lost');
sleep 2.0 * $slow;
is(runs('kill-1'), 1, '...one execution');
like(join('', lines_of("$b/logs/error.log")),
     qr/\[error\].*its lease expired.*key hash [0-9a-f]{64}/,
     '...one error line with the key hash');

# a claim whose reply was lost to a Redis stall is released once Redis is
# back: the retry runs instead of a 409 for the lock's lifetime

my $cli = $ENV{REDIS_CLI} || 'redis-cli';
system("$cli -p $redis_port DEBUG SLEEP @{[ 0.8 * $slow ]} >/dev/null &");
sleep 0.1;
is(idem_status(post($edge_a, 'stall-1', '/quick')), '503 error',
   'Redis stalls during the claim: 503');
sleep 1.0 * $slow;
my $ok;
for (1 .. 20) {
    $r = post($edge_a, 'stall-1', '/quick');
    last if ($ok = idem_status($r) eq '201 new');
    sleep 0.2;
}
ok($ok, '...after it recovers, the retry runs normally');
is(runs('stall-1'), 1, '...once');

# Redis stopped while the upstream works: the store is sent again after
# SIGCONT, and the retry is a replay

my $rpid = redis_pid();
$pid = fork // die;
if ($pid == 0) {
    my $o = post($edge_a, 'stop-1', '/long/late');
    exit($o->{status} == 200 ? 0 : 1);
}
sleep 0.3 * $slow;
kill 'STOP', $rpid;
sleep 1.5 * $slow;
kill 'CONT', $rpid;
waitpid $pid, 0;
is($? >> 8, 0, 'Redis stopped during the upstream call: the client got 200');
$ok = 0;
for (1 .. 30) {
    $r = post($edge_b, 'stop-1', '/long/late');
    last if ($ok = idem_status($r) eq '200 replay');
    sleep 0.2;
}
ok($ok, '...the store landed once Redis was back: a replay');
is(runs('stop-1'), 1, '...one execution');

for my $dir ($a, $b, $origin) {
    # the workers of a were killed on purpose
    is(scalar(grep { !/exited on signal 9/ } log_problems("$dir/logs/error.log")),
       0, "no crash or alert in $dir");
}

done_testing();
