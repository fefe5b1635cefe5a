# A release after a failed WAIT is sent again like any other finish.  A
# claim won on the master whose WAIT never answers (the replica paused,
# the connection closed by CLIENT KILL TYPE normal, as the Sentinels do
# while they reconfigure a failover) is answered 503 and released; the
# release finds no connection at that moment and must be kept and sent
# once the worker has reconnected.  Otherwise the claim outlives its
# request: 409 until the lock's lifetime ends, then outcome-unknown for a
# request that never reached the upstream.  The fault campaign's
# sentinel-failover round meets it many times (docs/faults.md).
# Plain Test::More. Ports: util/topology.sh replica at TOPO_BASE (default
# 27500: master 27551, replica 27552), nginx on TOPO_BASE+300.
# topology: yes (make test-topologies runs this file)
use strict;
use warnings;
use lib 't/lib';
use Test::More;
use Fleet;
use Digest::SHA qw(sha256_hex);
use POSIX ();
use Time::HiRes qw(sleep time);

plan skip_all => 'TEST_NGINX_LOAD_MODULES must name the module'
    unless have_module();
plan skip_all => "$ENV{REDIS_SERVER} is needed" unless `which $ENV{REDIS_SERVER}`;

my $base = $ENV{TOPO_BASE} || 27500;
$ENV{TOPO_BASE} = $base;
$ENV{TOPO_DIR} ||= "/tmp/idem-topo-wait-release-$base";
my $master = $base + 51;
my $port = $base + 300;
my $slow = $ENV{TEST_ASAN} ? 4 : 1;
my $topo = 'util/topology.sh';

my ($up, $dir);
END {
    local $?;
    nginx_stop($dir) if $dir;
    system("$topo down replica >/dev/null 2>&1") if $up;
}
$SIG{$_} = sub { $SIG{PIPE} = 'IGNORE'; exit 1 } for qw(INT TERM HUP PIPE);

sub topo {
    my $out = `$topo @_ 2>&1`;
    ok($? == 0, "topology.sh @_") or diag $out;
}

my $root = fleet_root('wait-release');
$up = 1;
topo('up', 'replica');

# edge(name, redis timeout ms, WAIT timeout ms, lock s): one worker on
# the master, WAIT 1, started
sub edge {
    my ($name, $timeout, $wait, $lock) = @_;
    my $d = nginx_conf($name, pay_server($name, $port, <<"EOC"), 1);
        idempotency_redis 127.0.0.1:$master;
        idempotency_redis_timeout @{[ $timeout * $slow ]}ms;
        idempotency_redis_wait 1 @{[ $wait * $slow ]}ms;
        idempotency_lock_ttl @{[ $lock * $slow ]}s;
EOC
    nginx_start($d);
    sleep 0.5;
    return $d;
}

$dir = edge('nginx', 1000, 500, 3);

my $run = 'wr' . int(time * 1000);
is(idem_status(http_post($port, "$run-warm", 'x')), '201 new',
   'the replica acknowledges: 201 new');

# the record key: prefix, then the hash of the (empty) scope, NUL, the key
my $key = "$run-1";
my $rkey = 'idem:{' . sha256_hex("\0$key") . '}';

topo('replica-pause');
my $pid = fork // die;
if ($pid == 0) {
    my $r = http_post($port, $key, 'x');
    # not exit: END would take nginx and the topology down
    POSIX::_exit($r->{status} == 503 ? 0 : 1);
}
sleep 0.2 * $slow;    # the claim answered, WAIT blocked on the replica
redis_cli_at($master, qw(CLIENT KILL TYPE normal));
waitpid $pid, 0;
is($? >> 8, 0, 'WAIT lost with its connection: 503');
topo('replica-resume');

my $gone;
for (1 .. 30) {
    last if ($gone = redis_cli_at($master, 'EXISTS', $rkey) eq '0');
    sleep 0.1;
}
ok($gone, '...and the claim was released once the worker reconnected');

my $log = join '', lines_of("$dir/logs/error.log");
like($log, qr/went away before WAIT answered for the claim, released/,
     '...as the log says');
unlike($log, qr/cannot release the record/,
       '...the release was not given up');

# after the lock's lifetime, a retry runs: no 409, no outcome-unknown
sleep 3.2 * $slow;
is(idem_status(http_post($port, $key, 'x')), '201 new',
   'a retry after the lock\'s lifetime runs normally');
is(upstream_runs($dir)->{$key}, 1, '...once');

nginx_stop($dir);
is(join('', log_problems("$root/nginx/logs/error.log")), '',
   'no crash, no alert');

# A WAIT held by the server is not a dead connection.  With the replica
# paused every WAIT answers 0 after its timeout, which Redis serves from
# its cron, up to 100 ms late: about 200 ms for 100.  Queued behind each
# other on the worker's one connection, they hold every reply behind
# them, and requests whose claims wait there time out (503).  Neither
# that timeout nor the watchdog may close the connection: either loses
# the releases queued on it, again at the next timeout, as long as
# requests keep coming, until the claims' leases end and their keys read
# outcome-unknown although nothing ran.
$dir = edge('slow', 300, 100, 2);
is(idem_status(http_post($port, "$run-slow-warm", 'x')), '201 new',
   'slow WAIT: the replica acknowledges, 201 new');
my $mark = -s "$dir/logs/error.log";

topo('replica-pause');
my (@keys, %answers);
my $until = time + 3 * $slow;    # longer than a lease
while (time < $until) {
    my @batch = map { "$run-slow-" . scalar(@keys) . "-$_" } 1 .. 4;
    push @keys, @batch;
    $answers{ idem_status($_) }++
        for @{ http_burst([ map { [$port, $_, 'x'] } @batch ], 5) };
}
topo('replica-resume');
is_deeply([ keys %answers ], ['503 error'],
          scalar(@keys) . ' keys while WAIT cannot be met: all 503')
    or diag explain \%answers;

my $left;
for (1 .. 30) {
    $left = grep {
        redis_cli_at($master, 'EXISTS',
                     'idem:{' . sha256_hex("\0$_") . '}') ne '0'
    } @keys;
    last if $left == 0;
    sleep 0.1;
}
is($left, 0, '...and every claim was released');

open my $fh, '<', "$dir/logs/error.log" or die $!;
seek $fh, $mark, 0;
my $slow_log = join '', <$fh>;
close $fh;
like($slow_log, qr/0 of 1 replicas acknowledged the claim, released/,
     '...WAIT answered 0 for some');
like($slow_log, qr/redis "[^"]+" timed out/,
     '...and some requests timed out behind the held WAITs');
unlike($slow_log, qr/did not answer within|connected to redis .* again/,
       '...without closing the connection Redis kept answering on');

my %again;
$again{ idem_status(http_post($port, $_, 'x')) }++ for @keys[0 .. 3];
is_deeply([ keys %again ], ['201 new'],
          'retries of the first keys run: no 409, no outcome-unknown')
    or diag explain \%again;
is(scalar(grep { $_ } @{ upstream_runs($dir) }{ @keys }), 4,
   '...and only those ran');

nginx_stop($dir);
undef $dir;
is(join('', log_problems("$root/slow/logs/error.log")), '',
   'no crash, no alert');

done_testing();
