# idempotency_redis_wait N [TIMEOUT] aof: WAITAOF 1 N TIMEOUT after a won
# claim (fsynced on the primary and on N replicas; N = 0: the primary
# alone), on util/topology.sh's replica topology (a master and its replica).
# - nginx -t: "aof" after N or N TIMEOUT, N may be 0 only with it
# - a server without WAITAOF (Redis 7.0): every claim is refused, 503, with
#   one error line that says so, and released; never taken as acknowledged
# - with WAITAOF, AOF off on the master: Redis refuses WAITAOF 1 ..., 503
# - AOF on the master only: "0 aof" claims work (new, replay, one run);
#   "1 aof" is refused (the replica fsyncs nothing), 503, released
# - AOF on both: "1 aof" claims work; the replica paused, 503 after the
#   timeout while "0 aof" still works; a store whose WAITAOF is short is
#   logged
# - a claim sent again after its connection broke, replica paused: its own
#   WAITAOF counts a write of its connection, 503 (since Redis 7.2 a
#   connection that wrote nothing is answered at once)
# Plain Test::More. Ports: the topology at TOPO_BASE (default 26600:
# master 26651, replica 26652), nginx and its helpers at 26900-26909.
# topology: yes (make test-topologies runs this file)
use strict;
use warnings;
use lib 't/lib';
use Test::More;
use Fleet;
use CutProxy;
use WaitTest;
use Time::HiRes qw(sleep time);

plan skip_all => 'TEST_NGINX_LOAD_MODULES must name the module'
    unless have_module();
plan skip_all => "$ENV{REDIS_SERVER} is needed"
    unless `which $ENV{REDIS_SERVER}`;

my $base = $ENV{TOPO_BASE} || 26600;
$ENV{TOPO_BASE} = $base;
$ENV{TOPO_DIR} ||= '/tmp/idem-topo-waitaof';
my ($master, $replica) = ($base + 51, $base + 52);
my $slow = $ENV{TEST_ASAN} ? 4 : 1;
my $np = $ENV{WAITAOF_TEST_PORT} || 26900;
my ($one_port, $zero_port, $pass_port, $store_port, $resend_port,
    $backend_port, $proxy_port) = map { $np + $_ } 0 .. 6;
my ($proxy_pid, $dir);

# whatever happens, nothing stays running (WaitTest stops the topology)
END {
    local $?;
    nginx_stop($dir) if $dir;
    kill 'KILL', $proxy_pid if $proxy_pid;
}
$SIG{$_} = sub { $SIG{PIPE} = 'IGNORE'; exit 1 } for qw(INT TERM HUP PIPE);

my $root = fleet_root('waitaof');

# ------------------------------------------------------------ nginx -t

my @bad = (
    ['', 'idempotency_redis_wait 0;', qr/\(0 or more with "aof"\), not "0"/],
    ['', 'idempotency_redis_wait aof;', qr/not "aof"/],
    ['', 'idempotency_redis_wait off aof;', qr/takes no timeout, not "aof"/],
    ['', 'idempotency_redis_wait 1 aof 100ms;',
     qr/invalid parameter "100ms"/],
    ['', 'idempotency_redis_wait 1 0 aof;', qr/at least 1ms, not "0"/],
    ['', 'idempotency_redis_wait 1 aof aof;', qr/at least 1ms, not "aof"/],
    ['', 'idempotency_redis_wait -1 aof;', qr/not "-1"/],
    ['', 'idempotency_redis_wait 1 1s aof;',
     qr/\(1000 ms\) must be shorter than "idempotency_redis_timeout" \(1000 ms\)/],
    # "0 aof" is on: inherited, its timeout must fit in the location's
    ['idempotency_redis_wait 0 500ms aof;', 'idempotency_redis_timeout 300ms;',
     qr/\(500 ms\) must be shorter than "idempotency_redis_timeout" \(300 ms\)/],
);

my @good = (
    ['', 'idempotency_redis_wait 1 aof;'],
    ['', 'idempotency_redis_wait 0 aof;'],
    ['', 'idempotency_redis_wait 2 250ms aof;'],
    ['idempotency_redis_wait 0 50ms aof;', ''],
    # off cancels an inherited "0 aof"
    ['idempotency_redis_wait 0 500ms aof;',
     'idempotency_redis_timeout 300ms; idempotency_redis_wait off;'],
);

nginx_t_cases($root, $master, $one_port, \@bad, \@good);

# ------------------------------------------------------------ topology

topo('up', 'replica') or BAIL_OUT('no replica topology');

sub cli { redis_cli_at(@_) }

my $has_waitaof = cli($master, 'WAITAOF', 0, 0, 1) !~ /unknown command/i;
note("$ENV{REDIS_SERVER}: WAITAOF " . ($has_waitaof ? 'known' : 'unknown'));

# a backend that answers after 2.5 s: time for the claim's WAITAOF, then
# to pause the replica
slow_backend($backend_port, 2.5 * $slow);

$proxy_pid = cut_proxy($proxy_port, $master, "$root/cuts.log");

# a replica acknowledges its fsync in its reply to the master's GETACK, or
# else in its ACK of every second: 1.5 s, not WAIT's usual 100 ms
my $t = " idempotency_redis_timeout 3s;";
my $one = "idempotency_redis 127.0.0.1:$master;$t"
        . " idempotency_redis_wait 1 1500ms aof;";
my $zero = "idempotency_redis 127.0.0.1:$master;$t"
         . " idempotency_redis_wait 0 1500ms aof;";
my $strip = sub { $_[0] =~ s/^\s*log_format.*\n//mr };

$dir = nginx_conf('waitaof',
    pay_server('waitaof', $one_port, $one)
    . $strip->(pay_server('waitaof', $zero_port, $zero))
    . $strip->(pay_server('waitaof', $pass_port,
                          "$one idempotency_on_redis_error pass;"))
    . $strip->(pay_server('waitaof', $resend_port,
                          "idempotency_redis 127.0.0.1:$proxy_port;$t"
                          . " idempotency_redis_wait 1 1500ms aof;"))
    . slow_server($store_port, "$one", $backend_port), 1);
nginx_start($dir);
sleep 0.3 * $slow;

sub runs {
    return upstream_runs($dir)->{$_[0]} // 0;
}

sub errors_like {
    my $re = shift;
    return scalar grep { /\[error\].*$re/ } lines_of("$dir/logs/error.log");
}

# aof(port, yes|no): AOF on or off, fsync at every write (a replica's
# default everysec acknowledges after up to a second), and settled
sub aof {
    my ($port, $on) = @_;
    cli($port, 'CONFIG', 'SET', 'appendfsync', 'always');
    cli($port, 'CONFIG', 'SET', 'appendonly', $on);
    for (1 .. 100) {
        my $p = cli($port, 'INFO', 'persistence');
        return 1 if $p =~ /aof_enabled:@{[ $on eq 'yes' ? 1 : 0 ]}/
                    && $p =~ /aof_rewrite_in_progress:0/
                    && $p =~ /aof_rewrite_scheduled:0/;
        sleep 0.1;
    }
    return 0;
}

# a claim refused: 503, the upstream did not run, and released (a retry is
# refused the same way, not 409)
sub refused {
    my ($port, $key, $what) = @_;
    my $r = http_post($port, $key, 'x', undef, undef, 5);
    is(idem_status($r), '503 error', "$what: 503");
    is(runs($key), 0, "$what: the upstream did not run");
    $r = http_post($port, $key, 'x', undef, undef, 5);
    is(idem_status($r), '503 error', "$what: released, a retry is 503 again");
}

# a claim acknowledged: new, then a replay, one run
sub works {
    my ($port, $key, $what) = @_;
    my $r = http_post($port, $key, 'x', undef, undef, 5);
    is(idem_status($r), '201 new', "$what: new");
    $r = http_post($port, $key, 'x', undef, undef, 5);
    is(idem_status($r), '201 replay', "$what: a retry replays");
    is(runs($key), 1, "$what: the upstream ran once");
}

unless ($has_waitaof) {
    # Redis 7.0: never an acknowledgement, one clear line per claim
    refused($one_port, 'old-1', 'no WAITAOF, "1 aof"');
    is(errors_like(qr/has no WAITAOF \(Redis 7\.2 or later, or Valkey, is needed for "idempotency_redis_wait \.\.\. aof"\), for the claim, released, key hash [0-9a-f]{64}/),
       2, "one error line per refused claim says why");
    is(errors_like(qr/./), 2, "and no other error line");
    refused($zero_port, 'old-0', 'no WAITAOF, "0 aof"');
    my $r = http_post($pass_port, 'old-pass', 'x', undef, undef, 5);
    is(idem_status($r), '201 error', "with pass: the request runs unprotected");
    is(runs('old-pass'), 1, "the upstream ran");
    $r = http_post($pass_port, 'old-pass', 'x', undef, undef, 5);
    is(idem_status($r), '201 error', "the key was released: unprotected again");
    is(scalar log_problems("$dir/logs/error.log"), 0, "no crash or alert");
    done_testing();
    exit 0;
}

# 1. AOF off: WAITAOF 1 ... is refused by the master itself
ok(aof($master, 'no') && aof($replica, 'no'), "AOF off on both");
refused($one_port, 'off-1', 'AOF off, "1 aof"');
refused($zero_port, 'off-0', 'AOF off, "0 aof"');
cmp_ok(errors_like(qr/refused WAITAOF: ERR WAITAOF cannot be used when numlocal is set but appendonly is disabled.*for the claim, released, key hash/),
       '==', 4, "Redis's refusal is logged for each claim");

# 2. AOF on the master only
ok(aof($master, 'yes'), "AOF on the master");
works($zero_port, 'master-0', 'AOF on the master, "0 aof"');
refused($one_port, 'master-1', 'AOF on the master only, "1 aof"');
cmp_ok(errors_like(qr/1 of 1 primary and 0 of 1 replicas fsynced the claim, released, key hash [0-9a-f]{64}, client: 127\.0\.0\.1/),
       '==', 2, "logged with what was fsynced where");

# 3. AOF on both
ok(aof($replica, 'yes'), "AOF on the replica too");
works($one_port, 'both-1', 'AOF on both, "1 aof"');

topo('replica-pause');
my $r = http_post($one_port, 'paused-1', 'x', undef, undef, 5);
is(idem_status($r), '503 error', "replica paused: \"1 aof\" is refused, 503");
cmp_ok($r->{took}, '>=', 1.48, "after the WAITAOF timeout ($r->{took} s)");
is(runs('paused-1'), 0, "the upstream did not run");
works($zero_port, 'paused-0', 'replica paused, "0 aof"');
$r = http_post($pass_port, 'paused-pass', 'x', undef, undef, 5);
is(idem_status($r), '201 error', "with pass: the request runs unprotected");
topo('replica-resume');
works($one_port, 'paused-1', 'replica resumed, the released key');

# a store whose WAITAOF is short: the replica stops while the upstream works
my $s = post_async($store_port, 'store-1', '/slow');
sleep 1.2 * $slow;
topo('replica-pause');
my $res = read_response($s, 5);
like($res, qr{^HTTP/1\.1 201 .*X-Idem: new}s,
     "the claim was fsynced before the pause: new");
sleep 1.7 * $slow;    # the WAITAOF timeout, after the store
is(errors_like(qr/1 of 1 primary and 0 of 1 replicas fsynced the stored record, key hash [0-9a-f]{64}, client: 127\.0\.0\.1, request: "POST \/slow HTTP\/1\.1"/),
   1, "a store the replica did not fsync is logged at error level");

# 4. a claim sent again after its connection broke (after Redis ran it):
# it finds its own claim and writes nothing, so a rewrite goes first
cut('after', 1);
$r = http_post($resend_port, 'resend-1', 'x', undef, undef, 5);
is(idem_status($r), '503 error',
   "claim sent again, replica paused: its own WAITAOF fails, 503");
cmp_ok($r->{took}, '>=', 1.48, "after the WAITAOF timeout ($r->{took} s)");
is(runs('resend-1'), 0, "the upstream did not run");
topo('replica-resume');
cut('after', 1);
works($resend_port, 'resend-1', 'claim sent again, replica up');

aof($master, 'no');
aof($replica, 'no');

is(scalar log_problems("$dir/logs/error.log"), 0, "no crash or alert");

done_testing();
