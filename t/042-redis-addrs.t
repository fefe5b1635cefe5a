# A Redis, a Sentinel or a cluster seed whose address is a name with several addresses,
# or several addresses of which the first is dead: a failed connect moves
# to the next address, as nginx's upstream does, so the live one is found.
# - Sentinels by two addresses, the first refusing: the second is asked;
#   the same for two Redis Cluster seeds
# - a name whose first address refuses, resolved by nginx at startup from
#   /etc/hosts (Debian's: "::1 localhost" with 127.0.0.1, the server on
#   127.0.0.1 only): a standalone Redis, a Sentinel and a cluster seed by
#   that name. nginx runs in a private mount namespace with that hosts
#   file (unshare, as root); skipped where there is none or where ::1 does
#   not come first
# - a name resolved by the http resolver (t/lib/DnsStub.pm) to a dead and
#   a live address: every request served
# Plain Test::More: its own Redis, Sentinel and one-node cluster on
# 127.0.0.1 only (20800-20802), the DNS stub on 20803, nginx on 20804-20809.
# topology: yes (make test-topologies runs this file)
use strict;
use warnings;
use lib 't/lib';
use Test::More;
use Fleet;
use TopoTest;
use DnsStub;
use File::Path qw(make_path);
use Time::HiRes qw(sleep time);

plan skip_all => 'TEST_NGINX_LOAD_MODULES must name the module'
    unless have_module();
plan skip_all => 'redis-server is needed' unless `which redis-server`;

my $slow = $ENV{TEST_ASAN} ? 4 : 1;
my ($cluster_port, $redis_port, $sentinel_port, $dns_port)
    = (20800, 20801, 20802, 20803);
my $next_port = 20804;

my $root = fleet_root('addrs');
my @pids;
my $dns;

END {
    local $?;
    kill 'TERM', @pids;
    $dns->stop if $dns;
}

# redis-server on 127.0.0.1 only: [::1] and 127.0.0.5 refuse
sub server {
    my ($name, $port, @conf) = @_;
    my $dir = "$root/$name";
    make_path($dir);
    open my $fh, '>', "$dir/redis.conf" or die $!;
    print $fh join "\n", "bind 127.0.0.1", "port $port", "save ''",
        "appendonly no", "daemonize yes", "dir $dir",
        "pidfile $dir/redis.pid", "logfile $dir/redis.log", @conf, '';
    close $fh;
    my @mode = (grep { /^sentinel / } @conf) ? ('--sentinel') : ();
    system('redis-server', "$dir/redis.conf", @mode) == 0
        or die "redis-server $name";
    ok(wait_until(5, sub {
           `redis-cli -h 127.0.0.1 -p $port PING 2>/dev/null` =~ /PONG/ }),
       "$name answers on 127.0.0.1:$port");
    open $fh, '<', "$dir/redis.pid" or die "$name: no pid file";
    chomp(my $pid = <$fh>);
    push @pids, $pid;
}

server('redis', $redis_port);
server('sentinel', $sentinel_port,
       "sentinel monitor idem 127.0.0.1 $redis_port 1");

# a cluster of one master that has every slot
server('cluster', $cluster_port, 'cluster-enabled yes',
       "cluster-config-file $root/cluster/nodes.conf");
`redis-cli -p $cluster_port CLUSTER ADDSLOTSRANGE 0 16383`;
ok(wait_until(5, sub {
       `redis-cli -p $cluster_port CLUSTER INFO` =~ /cluster_state:ok/ }),
   'the cluster is up');

sub instance {
    my ($name, $redis, $http) = @_;
    my $port = $next_port++;
    my $dir = nginx_conf($name, ($http // '') . pay_server($name, $port,
        "idempotency_redis_timeout 500ms; $redis"), 1);
    nginx_start($dir);
    return ($dir, $port);
}

# works: the one live address is reached, new then replay, run once
sub works {
    my ($name, $dir, $port, $connected) = @_;
    ok(wait_until(5 * $slow, sub { log_count($dir, $connected) }),
       "$name: connected") or diag join '', lines_of("$dir/logs/error.log");
    my $a = http_post($port, "addrs-$name", 'x', undef, undef, 5);
    my $b = http_post($port, "addrs-$name", 'x', undef, undef, 5);
    is(idem_status($a) . ', ' . idem_status($b), '201 new, 201 replay',
       "$name: new, then replay");
    is(upstream_runs($dir)->{"addrs-$name"}, 1, "$name: the upstream ran once");
}

my @dirs;

# two Sentinels, the first refusing: the second names the master

{
    my ($dir, $port) = instance('sentinels',
        "idempotency_redis 127.0.0.5:$sentinel_port 127.0.0.1:$sentinel_port"
        . " sentinel=idem;");
    push @dirs, $dir;
    works('sentinels', $dir, $port,
          qr/the master is 127\.0\.0\.1:$redis_port\b/);
    ok(log_count($dir, qr/cannot connect to redis "sentinel idem" \(127\.0\.0\.5:/),
       'sentinels: the first was tried');
}

# two cluster seeds, the first refusing

{
    my ($dir, $port) = instance('seeds',
        "idempotency_redis 127.0.0.5:$cluster_port 127.0.0.1:$cluster_port"
        . " cluster;");
    push @dirs, $dir;
    works('seeds', $dir, $port,
          qr/connected to redis .*\(127\.0\.0\.1:$cluster_port\)/);
}

# a name from /etc/hosts whose first address refuses

SKIP: {
    my $hosts = "$root/hosts";
    open my $fh, '>', $hosts or die $!;
    print $fh "127.0.0.1\tlocalhost\n::1\t\tlocalhost ip6-localhost\n";
    close $fh;

    # the hosts file for nginx alone: a private mount namespace
    my $with_hosts = "$root/with-hosts.sh";
    open $fh, '>', $with_hosts or die $!;
    print $fh "#!/bin/sh\nexec unshare -m --propagation private sh -c "
        . "'mount --bind $hosts /etc/hosts && exec \"\$@\"' sh \"\$@\"\n";
    close $fh;
    chmod 0755, $with_hosts;

    my @order = map { (split)[0] }
                `$with_hosts getent ahosts localhost 2>/dev/null`;
    skip 'no private mount namespace with a hosts file of ::1 first'
         . " (got: @order)", 10
        unless @order && $order[0] eq '::1'
               && grep { $_ eq '127.0.0.1' } @order;

    my $bin = Fleet::nginx_bin();
    local $ENV{TEST_NGINX_BINARY} = "$root/nginx-hosts.sh";
    open $fh, '>', $ENV{TEST_NGINX_BINARY} or die $!;
    print $fh "#!/bin/sh\nexec $with_hosts $bin \"\$@\"\n";
    close $fh;
    chmod 0755, $ENV{TEST_NGINX_BINARY};

    my ($dir, $port) = instance('name', "idempotency_redis localhost:$redis_port;");
    push @dirs, $dir;
    works('name', $dir, $port, qr/connected to redis "localhost:$redis_port"/);
    ok(log_count($dir, qr/cannot connect to redis "localhost:$redis_port" \(\[::1\]:/),
       'name: [::1] was tried first');

    ($dir, $port) = instance('sentinel-name',
        "idempotency_redis localhost:$sentinel_port sentinel=idem;");
    push @dirs, $dir;
    works('sentinel-name', $dir, $port,
          qr/the master is 127\.0\.0\.1:$redis_port\b/);

    ($dir, $port) = instance('seed-name',
        "idempotency_redis localhost:$cluster_port cluster;");
    push @dirs, $dir;
    works('seed-name', $dir, $port,
          qr/connected to redis .*\(127\.0\.0\.1:$cluster_port\)/);
}

# the http resolver's answer: a dead address and a live one, in either
# order (nginx's resolver rotates them)

{
    $dns = DnsStub->start(port => $dns_port, dir => $root, ttl => 1,
        names => { 'redis.test' => ['127.0.0.5', '127.0.0.1'] });
    my ($dir, $port) = instance('resolver',
        "idempotency_redis redis.test:$redis_port;",
        "resolver 127.0.0.1:$dns_port valid=1s ipv6=off;"
        . " resolver_timeout 1s;");
    push @dirs, $dir;
    works('resolver', $dir, $port, qr/connected to redis "redis\.test/);
}

finish_all(@dirs);

done_testing();
