# Redis Sentinel over TLS: "idempotency_redis S1 S2 S3 sentinel=NAME tls"
# on a TLS-only master, 2 replicas and 3 Sentinels (util/topology.sh
# sentinel-tls, one private CA; the server certificate has SAN
# DNS:localhost and IP:127.0.0.1).
# - tls with sentinel= and no idempotency_redis_tls_name is valid: each
#   Sentinel is verified by the host written in its address, the master
#   by the IP address a Sentinel named
# - verified: new then replay, the record on the master, over TLS to the
#   Sentinels (by IP, and by the name "localhost") and to the master
# - idempotency_redis_tls_name: the one name for Sentinels and master;
#   a name the certificate lacks is a quick 503, logged once
# - a graceful failover under traffic: followed without a reload, every
#   request served, new keys on the new master
# - a wrong CA: a quick 503, one log line for the whole failure streak
# - a master the Sentinels name by host name (resolve-hostnames and
#   announce-hostnames yes): resolved with the resolver (t/lib/DnsStub.pm)
#   and verified by that name; without a resolver, 503 and one log line
# - no key ever ran twice upstream, no worker crashed
# Plain Test::More; Redis on TOPO_BASE+61..+73 (TOPO_BASE default 25000),
# nginx on 20420-20428, the DNS stub on 20429.
# topology: yes (make test-topologies runs this file)
use strict;
use warnings;
use Test::More;
use FindBin;
use lib "$FindBin::Bin/lib";
use Fleet;
use TopoTest;
use DnsStub;
use Time::HiRes qw(time sleep);
use POSIX ();

plan skip_all => 'the module is not loaded' unless have_module();
plan skip_all => "$ENV{REDIS_SERVER} is needed" unless `which $ENV{REDIS_SERVER}`;

my $base = $ENV{TOPO_BASE} || 25000;
$ENV{TOPO_BASE} = $base;
$ENV{TOPO_DIR} ||= "/tmp/ngx-idempotency-topo-sentinel-tls-$base";
my $tdir = $ENV{TOPO_DIR};
my $topo = 'util/topology.sh';
my @sentinels = map { $base + $_ } 71 .. 73;
my $next_port = 20420;
my $slow = $ENV{TEST_ASAN} ? 4 : 1;
my $t0 = time;

my $up;
END {
    local $?;
    system("$topo down sentinel-tls >/dev/null 2>&1") if $up;
}
$SIG{$_} = sub { $SIG{PIPE} = 'IGNORE'; exit 1 } for qw(INT TERM HUP PIPE);

# redis-cli over TLS
sub cli {
    my ($p, @args) = @_;
    my $cmd = join ' ', map { "'$_'" } @args;
    my $out = `$ENV{REDIS_CLI} --tls --cacert $tdir/tls/ca.crt -p $p $cmd 2>/dev/null`;
    chomp $out;
    return $out;
}

sub master_port {
    my @l = split /\n/, cli($sentinels[1],
                           qw(SENTINEL get-master-addr-by-name idem));
    return $l[1];
}

my $root = fleet_root('sentinel-tls');
my @dirs;

sub sentinel_list {
    my $host = shift // '127.0.0.1';
    return join ' ', 'idempotency_redis', map { "$host:$_" } @sentinels;
}

# one nginx per scenario: its log is that scenario's only
sub instance {
    my ($name, $redis, $workers) = @_;
    my $port = $next_port++;
    my $dir = nginx_conf($name, pay_server($name, $port,
        "idempotency_redis_timeout 500ms; $redis"), $workers // 1);
    nginx_start($dir);
    push @dirs, $dir;
    return ($dir, $port);
}

# configuration, before any Redis runs

{
    my $d = nginx_conf('conf', pay_server('conf', $next_port,
        "idempotency_redis 127.0.0.1:1 127.0.0.1:2 sentinel=m tls;"), 1);
    my $bin = $ENV{TEST_NGINX_BINARY} || 'nginx';
    # nginx -t exits without freeing its cycle (a TLS context included)
    local $ENV{ASAN_OPTIONS} = ($ENV{ASAN_OPTIONS} // '') . ':detect_leaks=0';
    like(scalar `$bin -t -p $d/ -c conf/nginx.conf 2>&1`,
         qr/test is successful/,
         'tls with sentinel= needs no idempotency_redis_tls_name');
}

$up = 1;
topo('up', 'sentinel-tls');

my $master = master_port();
is($master, $base + 61, 'the topology starts with its first master');
my $ca = "idempotency_redis_tls_trusted_certificate $tdir/tls/ca.crt;";

# works: new then replay, one upstream run, the record on the master
sub works {
    my ($name, $redis) = @_;
    my ($dir, $port) = instance($name, $redis);
    ok(wait_until(5 * $slow, sub {
           log_count($dir, qr/the master is 127\.0\.0\.1:$master\b/) }),
       "$name: the master was named over TLS");

    my $db = cli($master, 'DBSIZE');
    my $a = http_post($port, "stls-$name", 'x');
    my $b = http_post($port, "stls-$name", 'x');
    is(idem_status($a) . ', ' . idem_status($b), '201 new, 201 replay',
       "$name: new, then replay");
    is(upstream_runs($dir)->{"stls-$name"}, 1, "$name: the upstream ran once");
    is(cli($master, 'DBSIZE'), $db + 1, "$name: the record is on the master");
    is(log_count($dir, qr/connected to redis "idem"/), 1,
       "$name: connected to the master");
    is(scalar log_problems("$dir/logs/error.log"), 0, "$name: no alert");
    return ($dir, $port);
}

# refused: every request a quick 503, the upstream never runs, and the
# reason is logged once for the whole failure streak
sub refused {
    my ($name, $redis, $reason) = @_;
    my ($dir, $port) = instance($name, $redis);
    sleep 0.5 * $slow;

    my @st;
    my $slowest = 0;
    for my $i (1 .. 4) {
        my $r = http_post($port, "stls-$name", 'x', undef, undef, 5);
        push @st, $r->{status};
        $slowest = $r->{took} if $r->{took} > $slowest;
        sleep 0.3;
    }
    is("@st", "503 503 503 503", "$name: 503");
    cmp_ok($slowest, '<', 0.5 + 0.5 * $slow, "$name: within the timeout");
    is(upstream_runs($dir)->{"stls-$name"} // 0, 0,
       "$name: the upstream never ran");
    is(log_count($dir, $reason), 1, "$name: the reason, logged once")
        or diag grep { /error|crit/ } lines_of("$dir/logs/error.log");
    is(log_count($dir, qr/connected to redis "idem"/), 0,
       "$name: never connected to a master");
    is(scalar log_problems("$dir/logs/error.log"), 0, "$name: no alert");
    return $dir;
}

my ($main, $port) = works('ip', sentinel_list() . " sentinel=idem tls; $ca");
works('name', sentinel_list('localhost') . " sentinel=idem tls; $ca");
works('tls_name', sentinel_list() . " sentinel=idem tls; $ca"
      . " idempotency_redis_tls_name localhost;");

refused('wrong_name', sentinel_list() . " sentinel=idem tls; $ca"
        . " idempotency_redis_tls_name redis.example.com;",
        qr/\[error\].*redis "sentinel idem" TLS certificate does not match "redis\.example\.com"/);

refused('other_ca', sentinel_list() . " sentinel=idem tls;"
        . " idempotency_redis_tls_trusted_certificate $tdir/tls/other-ca.crt;",
        qr/\[error\].*redis "sentinel idem" TLS certificate verify failed/);

# a graceful failover under traffic, two workers

my $fo;
($fo, $port) = instance('failover',
                        sentinel_list() . " sentinel=idem tls; $ca", 2);
ok(wait_until(5 * $slow, sub {
       log_count($fo, qr/the master is 127\.0\.0\.1:$master\b/) >= 2 }),
   'failover: both workers found the master');

my $traffic = "$root/traffic";
my $pid = fork // die;
if ($pid == 0) {
    $SIG{TERM} = sub { POSIX::_exit(0) };
    open my $fh, '>', $traffic or POSIX::_exit(1);
    $fh->autoflush(1);
    for (my $i = 0; ; $i++) {
        my $r = http_post($port, "fo-$i", 'x', undef, undef, 5);
        print $fh "fo-$i $r->{status}\n";
        sleep 0.01;
    }
}
sleep 0.5;
topo('sentinel-failover', '--switch-only');
my $old = $master;
$master = master_port();
isnt($master, $old, "failover: $old -> $master");
ok(wait_until(5, sub {
       log_count($fo, qr/the master is now 127\.0\.0\.1:$master\b/) >= 2 }),
   'failover: both workers followed the switch');
sleep 0.5;
kill 'TERM', $pid;
waitpid $pid, 0;

my @sent = map { chomp; [split / /] } lines_of($traffic);
cmp_ok(scalar @sent, '>', 20, 'failover: requests were sent');
is(join(',', grep { $_ != 201 } map { $_->[1] } @sent), '',
   'failover: every request served');
my $db = cli($master, 'DBSIZE');
my @after = map { http_post($port, "fo-after-$_", 'x')->{status} } 1 .. 5;
is("@after", '201 201 201 201 201', 'after the switch: 201');
is(cli($master, 'DBSIZE'), $db + 5, "the new keys are on $master");
$db = http_post($port, 'fo-0', 'x');
is(idem_status($db), '201 replay', 'a key of before the switch: replay');

# --- a master named by host name: one Sentinel monitors it as localhost

my $dns = DnsStub->start(port => 20429, dir => $root, ttl => 1,
                         names => { 'localhost' => ['127.0.0.1'] });
cli($sentinels[0], qw(SENTINEL CONFIG SET resolve-hostnames yes));
cli($sentinels[0], qw(SENTINEL CONFIG SET announce-hostnames yes));
cli($sentinels[0], qw(SENTINEL MONITOR idem2 localhost), $master, 1);
like(cli($sentinels[0], qw(SENTINEL get-master-addr-by-name idem2)),
     qr/^localhost\n$master$/, 'the Sentinel names the master localhost');

my $one = "idempotency_redis 127.0.0.1:$sentinels[0] sentinel=idem2 tls; $ca";
my ($hn, $hn_port) = instance('hostname',
    "$one resolver 127.0.0.1:20429 valid=1s ipv6=off; resolver_timeout 1s;");
ok(wait_until(5 * $slow, sub {
       log_count($hn, qr/the master is localhost:$master\b/) }),
   'hostname: the master was named by host name');
$db = cli($master, 'DBSIZE');
my @hs = map { idem_status(http_post($hn_port, 'stls-hn', 'x')) } 1 .. 2;
is("@hs", '201 new 201 replay', 'hostname: new, then replay');
is(cli($master, 'DBSIZE'), $db + 1, 'hostname: the record is on the master');
cmp_ok($dns->queries('localhost', 'A'), '>', 0,
       'hostname: resolved by the resolver');

refused('hostname_no_resolver', $one,
        qr/\[error\].*sentinel named master "idem2" at "localhost", not an IP address \(a host name needs a "resolver"\)/);

cli($sentinels[0], qw(SENTINEL REMOVE idem2));
cli($sentinels[0], qw(SENTINEL CONFIG SET announce-hostnames no));
$dns->stop;

finish_all(@dirs);
note sprintf 'took %.1f s', time - $t0;

done_testing();
