# idempotency_redis_wait N [TIMEOUT]: after a won claim, WAIT N TIMEOUT on
# the claim's connection. On util/topology.sh's replica topology (a master
# and its replica):
# - replica up: WAIT 1 is acknowledged, claims work (new, replay, one run)
# - replica paused (SIGSTOP): a claim is answered 503 after about the WAIT
#   timeout, the upstream does not run, the claim is released (a retry is
#   503 again, not 409), and after the replica resumes the key is new
# - a replay is delivered without waiting for WAIT
# - with idempotency_on_redis_error pass: the request runs unprotected
#   ($idempotency_status error), and the key stays free
# - a store whose WAIT is not acknowledged is logged at error level with
#   the key hash, the client and the request line
# - a claim sent again after its connection broke (the WAIT behind it lost
#   with it) is followed by a WAIT of its own, behind a rewrite of the
#   claim (since Redis 7.2, and on Valkey, a WAIT on a connection that
#   wrote nothing answers at once): acknowledged, new; replica paused, 503
#   and released
# - the claim's timer fires while WAIT holds it (the master stalls): 503,
#   and the claim is released once the master answers again, not left
#   until idempotency_lock_ttl
# - nginx -t refuses bad values and a TIMEOUT that does not fit in
#   idempotency_redis_timeout, inherited or not (t/043 has "aof")
# Plain Test::More. Ports: the topology at TOPO_BASE (default 26000:
# master 26051, replica 26052), nginx and a slow backend at 26300-26309.
# topology: yes (make test-topologies runs this file)
use strict;
use warnings;
use lib 't/lib';
use Test::More;
use Fleet;
use CutProxy;
use WaitTest;
use Time::HiRes qw(sleep time);
use Digest::SHA ();

plan skip_all => 'TEST_NGINX_LOAD_MODULES must name the module'
    unless have_module();
plan skip_all => "$ENV{REDIS_SERVER} is needed" unless `which $ENV{REDIS_SERVER}`;

my $base = $ENV{TOPO_BASE} || 26000;
$ENV{TOPO_BASE} = $base;
$ENV{TOPO_DIR} ||= '/tmp/idem-topo-wait';
my $master = $base + 51;
my $slow = $ENV{TEST_ASAN} ? 4 : 1;
my $np = $ENV{WAIT_TEST_PORT} || 26300;
my ($reject_port, $pass_port, $store_port, $backend_port, $proxy_port,
    $resend_port) = map { $np + $_ } 0 .. 5;
my ($proxy_pid, $dir);

# whatever happens, nothing stays running (WaitTest stops the topology)
END {
    local $?;
    nginx_stop($dir) if $dir;
    kill 'KILL', $proxy_pid if $proxy_pid;
}
$SIG{$_} = sub { $SIG{PIPE} = 'IGNORE'; exit 1 } for qw(INT TERM HUP PIPE);

my $root = fleet_root('redis-wait');

# ------------------------------------------------------------ nginx -t

# another protected location on the same Redis
my $other_server = sub {
    return "server { listen 127.0.0.1:$pass_port; location / {"
         . " idempotency on; $_[0] } }";
};

my @bad = (
    ['', 'idempotency_redis_wait x;',
     qr/"idempotency_redis_wait" expects "off" or a number of replicas of 1 or more \(0 or more with "aof"\), not "x"/],
    ['', 'idempotency_redis_wait 0;', qr/not "0"/],
    ['', 'idempotency_redis_wait -1;', qr/not "-1"/],
    ['', 'idempotency_redis_wait 1x;', qr/not "1x"/],
    ['', 'idempotency_redis_wait 1 0;',
     qr/"idempotency_redis_wait" timeout must be at least 1ms, not "0"/],
    ['', 'idempotency_redis_wait 1 soon;', qr/not "soon"/],
    ['', 'idempotency_redis_wait off 10ms;', qr/takes no timeout/],
    ['', 'idempotency_redis_wait 1 1 1;', qr/invalid parameter "1"/],
    ['', 'idempotency_redis_wait 1 1 aof 1;',
     qr/invalid number of arguments/],
    ['', 'idempotency_redis_wait 1; idempotency_redis_wait 2;',
     qr/is duplicate/],
    ['', 'idempotency_redis_wait 1 1s;',
     qr/the "idempotency_redis_wait" timeout \(1000 ms\) must be shorter than "idempotency_redis_timeout" \(1000 ms\)/],
    # inherited from http{}, checked against the location's own timeout
    ['idempotency_redis_wait 1 500ms;', 'idempotency_redis_timeout 300ms;',
     qr/\(500 ms\) must be shorter than "idempotency_redis_timeout" \(300 ms\)/],
    # the connection's watchdog is the smallest timeout of the places that
    # use the same Redis: a WAIT elsewhere must fit in it, in either order
    [$other_server->('idempotency_redis_timeout 300ms;'),
     'idempotency_redis_timeout 2s; idempotency_redis_wait 1 500ms;',
     qr/an "idempotency_redis_wait" timeout \(500 ms\) on redis "127\.0\.0\.1:$master" must be shorter than the smallest "idempotency_redis_timeout" \(300 ms\) of the places that use it/],
    [$other_server->('idempotency_redis_timeout 2s; '
                     . 'idempotency_redis_wait 1 500ms;'),
     'idempotency_redis_timeout 300ms;',
     qr/\(500 ms\) on redis "127\.0\.0\.1:$master" must be shorter than the smallest "idempotency_redis_timeout" \(300 ms\)/],
);

my @good = (
    ['', 'idempotency_redis_wait 1;'],
    ['', 'idempotency_redis_wait 2 250ms;'],
    ['', 'idempotency_redis_wait off;'],
    ['idempotency_redis_wait 1 50ms;', ''],
    ['idempotency_redis_wait 1 2s; idempotency_redis_timeout 3s;',
     'idempotency_redis_wait off;'],
    # a shorter timeout where no WAIT is sent is no watchdog issue
    # for a location that is off
    ["server { listen 127.0.0.1:$pass_port; location / {"
     . " idempotency_redis_timeout 300ms; } }",
     'idempotency_redis_timeout 2s; idempotency_redis_wait 1 500ms;'],
);

nginx_t_cases($root, $master, $reject_port, \@bad, \@good);

# ------------------------------------------------------------ topology

topo('up', 'replica') or BAIL_OUT('no replica topology');

# a backend that answers after 1.5 s: time to pause the replica meanwhile
slow_backend($backend_port, 1.5 * $slow);

# cuts the connection of a claim's SET (and its WAIT) after Redis ran it
$proxy_pid = cut_proxy($proxy_port, $master, "$root/cuts.log");

my $wait = " idempotency_redis_timeout 2s; idempotency_redis_wait 1 400ms;";
my $redis = "idempotency_redis 127.0.0.1:$master;$wait";

$dir = nginx_conf('wait',
    pay_server('wait', $reject_port, $redis)
    # the same backend log, declared once
    . (pay_server('wait', $pass_port,
                  "$redis idempotency_on_redis_error pass;")
       =~ s/^\s*log_format.*\n//mr)
    . (pay_server('wait', $resend_port,
                  "idempotency_redis 127.0.0.1:$proxy_port;$wait")
       =~ s/^\s*log_format.*\n//mr)
    . slow_server($store_port, "$redis", $backend_port), 1);
nginx_start($dir);
sleep 0.3 * $slow;

sub runs {
    return upstream_runs($dir)->{$_[0]} // 0;
}

sub wait_errors {
    return grep { /\[error\].*replicas acknowledged/ }
           lines_of("$dir/logs/error.log");
}

# 1. the replica acknowledges: claims work as without WAIT
my $r = http_post($reject_port, 'up-1', 'x', undef, undef, 5);
is(idem_status($r), '201 new', "replica up: the claim is acknowledged, new");
$r = http_post($reject_port, 'up-1', 'x', undef, undef, 5);
is(idem_status($r), '201 replay', "a retry replays");
is(runs('up-1'), 1, "the upstream ran once");
is(scalar wait_errors(), 0, "no WAIT failure logged");

# 2. the replica paused: WAIT returns 0 after its timeout
topo('replica-pause');

$r = http_post($reject_port, 'paused-1', 'x', undef, undef, 5);
is(idem_status($r), '503 error', "replica paused: the claim is refused, 503");
cmp_ok($r->{took}, '>=', 0.38, "after the WAIT timeout ($r->{took} s)");
cmp_ok($r->{took}, '<', 1.5 * $slow, "not after idempotency_redis_timeout");
is(runs('paused-1'), 0, "the upstream did not run");
# the client and the request are the server's own context of the line:
# Angie quotes each value and names the request "request_line"
like(join('', wait_errors()),
     qr/0 of 1 replicas acknowledged the claim, released, key hash [0-9a-f]{64}, client: "?127\.0\.0\.1"?, server: "?"?, request(?:_line)?: "POST \/pay HTTP\/1\.1"/,
     "logged with the key hash, the client and the request");

$r = http_post($reject_port, 'paused-1', 'x', undef, undef, 5);
is(idem_status($r), '503 error',
   "the claim was released: a retry claims again (503, not 409)");

# a replay does not wait for WAIT
$r = http_post($reject_port, 'up-1', 'x', undef, undef, 5);
is(idem_status($r), '201 replay', "replica paused: a stored key still replays");
cmp_ok($r->{took}, '<', 0.3 * $slow, "at once ($r->{took} s)");

# pass: the request runs unprotected
$r = http_post($pass_port, 'paused-pass', 'x', undef, undef, 5);
is(idem_status($r), '201 error', "with pass: the request runs unprotected");
is(runs('paused-pass'), 1, "the upstream ran");

topo('replica-resume');

$r = http_post($reject_port, 'paused-1', 'x', undef, undef, 5);
is(idem_status($r), '201 new', "replica resumed: the released key is new");
is(runs('paused-1'), 1, "and runs once");
$r = http_post($pass_port, 'paused-pass', 'x', undef, undef, 5);
is(idem_status($r), '201 new', "the key that ran unprotected was never stored");
is(runs('paused-pass'), 2, "so it runs again");

# 3. a store whose WAIT fails: the claim was acknowledged, then the replica
# stops while the upstream works
my $s = post_async($store_port, 'store-1', '/slow');
sleep 0.4 * $slow;
topo('replica-pause');
my $res = read_response($s, 5);
like($res, qr{^HTTP/1\.1 201 .*X-Idem: new}s,
     "the claim was acknowledged before the pause: new");
sleep 0.6 * $slow;    # the WAIT timeout, after the store
like(join('', wait_errors()),
     qr/\[error\].*0 of 1 replicas acknowledged the stored record, key hash [0-9a-f]{64}, client: 127\.0\.0\.1, request: "POST \/slow HTTP\/1\.1"/,
     "a store the replica did not acknowledge is logged at error level");
topo('replica-resume');

$r = http_post($store_port, 'store-1', 'x', '/slow', undef, 5);
is(idem_status($r), '201 replay', "the record itself was stored on the master");

# 4. the claim's connection breaks after Redis ran the claim and its WAIT:
# the claim is sent again, finds its own claim (a write of another
# connection), rewrites it, and asks WAIT itself
cut('after', 1);
$r = http_post($resend_port, 'resend-1', 'x', undef, undef, 5);
is(idem_status($r), '201 new', "claim sent again: acknowledged, new");
is(runs('resend-1'), 1, "the upstream ran once");
$r = http_post($resend_port, 'resend-1', 'x', undef, undef, 5);
is(idem_status($r), '201 replay', "a retry replays");

topo('replica-pause');
cut('after', 1);
$r = http_post($resend_port, 'resend-2', 'x', undef, undef, 5);
is(idem_status($r), '503 error',
   "claim sent again, replica paused: its own WAIT fails, 503");
cmp_ok($r->{took}, '>=', 0.38, "after the WAIT timeout ($r->{took} s)");
is(runs('resend-2'), 0, "the upstream did not run");
topo('replica-resume');
$r = http_post($resend_port, 'resend-2', 'x', undef, undef, 5);
is(idem_status($r), '201 new', "the claim was released: new");
is(runs('resend-2'), 1, "and runs once");

# 5. the claim's timer fires while WAIT holds it: the master stalls past
# idempotency_redis_timeout (2s) right after the claim, while the paused
# replica keeps WAIT blocked
topo('replica-pause');
$s = post_async($reject_port, 'stall-1', '/pay');
sleep 0.15 * $slow;
system("$ENV{REDIS_CLI} -p $master DEBUG SLEEP 2.5 >/dev/null 2>&1 &");
$res = read_response($s, 5);
like($res, qr{^HTTP/1\.1 503 .*X-Idem: error}s,
     "master stalled while WAIT held the claim: 503 at the claim's timeout");
is(runs('stall-1'), 0, "the upstream did not run");
topo('replica-resume');

# the release went again on the next connection, once the master woke
my $stall_key = 'idem:{' . Digest::SHA::sha256_hex("\0stall-1") . '}';
my $gone = 0;
for (1 .. 30) {
    last if ($gone = redis_cli_at($master, 'EXISTS', $stall_key) eq '0');
    sleep 0.1;
}
ok($gone, "the claim was released, not left until idempotency_lock_ttl");
$r = http_post($reject_port, 'stall-1', 'x', undef, undef, 5);
is(idem_status($r), '201 new', "so a retry is new (not 409)");

is(scalar log_problems("$dir/logs/error.log"), 0, "no crash or alert");

done_testing();
