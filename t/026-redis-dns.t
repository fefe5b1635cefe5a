# A Redis address given by name is resolved with the http resolver on
# every connect: when the name moves (a failover) and the old server dies,
# the module follows it without a reload. t/lib/DnsStub.pm answers the
# queries for redis.test, which the test moves.
# Plain Test::More: its own nginx, Redis and DNS server (ports 20760-20769,
# Redis on 127.0.0.1 and 127.0.0.2).
# topology: yes (make test-topologies runs this file)
use strict;
use warnings;
use lib 't/lib';
use Test::More;
use Fleet;
use DnsStub;
use File::Path qw(make_path);
use Time::HiRes qw(sleep time);

plan skip_all => 'TEST_NGINX_LOAD_MODULES must name the module'
    unless have_module();

my $slow = $ENV{TEST_ASAN} ? 4 : 1;
my ($dns_port, $redis_port, $port) = (20760, 20761, 20762);

my $root = fleet_root('redisdns');
my $dns = DnsStub->start(port => $dns_port, dir => $root, ttl => 1,
                         names => { 'redis.test' => ['127.0.0.1'] });
sub set_answer { $dns->set('redis.test' => [@_]) }

my @redis_pids;

sub redis_on {
    my $ip = shift;
    my $dir = "$root/redis-$ip";
    make_path($dir);
    system("$ENV{REDIS_SERVER} --bind $ip --port $redis_port --save ''"
           . " --appendonly no --daemonize yes --dir $dir --pidfile $dir/pid"
           . " --logfile $dir/log") == 0 or die "redis on $ip";
    for (1 .. 50) {
        last if -s "$dir/pid";
        sleep 0.1;
    }
    open my $fh, '<', "$dir/pid" or die "redis on $ip did not start";
    chomp(my $pid = <$fh>);
    push @redis_pids, $pid;
    return $pid;
}

sub dbsize {
    my $ip = shift;
    my $n = `$ENV{REDIS_CLI} -h $ip -p $redis_port DBSIZE 2>/dev/null`;
    chomp $n;
    return $n eq '' ? -1 : $n;
}

my $first = redis_on('127.0.0.1');
redis_on('127.0.0.2');

my $dir = nginx_conf('dns', "resolver 127.0.0.1:$dns_port valid=1s ipv6=off;"
    . " resolver_timeout 1s;"
    . pay_server('dns', $port, "idempotency_redis redis.test:$redis_port;"
                 . " idempotency_redis_timeout 500ms;"), 1);

END {
    nginx_stop($dir) if $dir;
    kill 'TERM', @redis_pids;
    $dns->stop if $dns;
}

nginx_start($dir);
sleep 0.5 * $slow;

my $a = http_post($port, 'dns-1', 'x');
my $b = http_post($port, 'dns-1', 'x');
like($a->{head}, qr/X-Idem: new/, "the name resolves: new");
like($b->{head}, qr/X-Idem: replay/, "then replay");
cmp_ok(dbsize('127.0.0.1'), '>=', 1, "stored on the first Redis");
is(dbsize('127.0.0.2'), 0, "nothing on the second");

# the failover: the name moves, the old server dies
set_answer('127.0.0.2');
kill 'TERM', $first;
for (1 .. 50) {
    last unless kill 0, $first;
    sleep 0.1;
}
ok(!kill(0, $first), "the first Redis is gone");

my ($ok, $tries, $t0) = (0, 0, time);
while (time - $t0 < 8 * $slow) {
    my $r = http_post($port, "dns-2-$tries", 'x', undef, undef, 5);
    $tries++;
    if ($r->{status} == 201 && $r->{head} =~ /X-Idem: new/) {
        $ok = 1;
        last;
    }
    sleep 0.2;
}
ok($ok, "the module follows the name to the new Redis, no reload")
    or diag "after $tries tries";
diag(sprintf "moved after %.1f s, %d tries", time - $t0, $tries);
cmp_ok(dbsize('127.0.0.2'), '>=', 1, "stored on the second Redis");

my @log = lines_of("$dir/logs/error.log");
is(scalar(grep { /connected to redis "redis\.test:$redis_port" again/ } @log),
   1, "connected again, once");
is(scalar(grep { /signal process|reconfiguring/ } @log), 0, "no reload");

# an address that refuses: the next one of the answer is tried
set_answer('127.0.0.3', '127.0.0.2');
system("$ENV{REDIS_CLI} -h 127.0.0.2 -p $redis_port CLIENT KILL TYPE normal"
       . " >/dev/null 2>&1");
sleep 1.2;
my @st;
for my $i (1 .. 5) {
    push @st, http_post($port, "dns-3-$i", 'x', undef, undef, 5)->{status};
    sleep 0.1;
}
is("@st", "201 201 201 201 201", "two addresses, one refusing: all served");

my $runs = upstream_runs($dir);
is(scalar(grep { $runs->{$_} > 1 } keys %$runs), 0, "no key ran twice");
is(scalar log_problems("$dir/logs/error.log"), 0, "no crash or alert");

done_testing();
