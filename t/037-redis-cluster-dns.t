# Redis Cluster by name: seeds given by host name and nodes that announce
# host names (cluster-announce-hostname with cluster-preferred-endpoint-type
# hostname) or no endpoint at all (unknown-endpoint: a nil endpoint, "the
# node you asked, on this port"), on util/topology.sh cluster with names
# from t/lib/DnsStub.pm.
# - unknown-endpoint: every key served from an IP seed, no resolver needed
# - hostname: with a resolver, CLUSTER SLOTS and MOVED name the nodes,
#   each is resolved on connect; every key served, on its master
# - without a resolver, host names are logged once and the keys get 503
# - a seed by name is resolved again when the map is needed: a seed that
#   resolves to a dead address first, moved by DNS to the cluster, is
#   followed without a reload
# - a failover: the promoted replica, known by its name, takes the keys
# - nginx_idempotency_redis_up has one series per master in the slot map
#   (node="ip:port" or "name:port"), all 1; after the failover the old
#   master's series is gone and the new one's is there; promtool accepts
#   the scrape
# - over TLS (util/topology.sh cluster-tls, certificate for localhost and
#   127.0.0.1 only), a node known by name is verified by that name: nodes
#   announced as node-N.test are refused (503, logged), unless
#   idempotency_redis_tls_name names what the certificate has; nodes
#   announced as localhost are served
# - no key ever ran twice upstream, no worker crashed
# Plain Test::More; Redis on TOPO_BASE+11..+16 (TOPO_BASE default 25000),
# DNS stub and nginx on 20440-20449.
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
use IO::Socket::INET;

plan skip_all => 'the module is not loaded' unless have_module();
plan skip_all => "$ENV{REDIS_SERVER} is needed" unless `which $ENV{REDIS_SERVER}`;

my $base = $ENV{TOPO_BASE} || 25000;
$ENV{TOPO_BASE} = $base;
$ENV{TOPO_DIR} = ($ENV{TOPO_DIR} || "/tmp/ngx-idempotency-topo-cluster-$base")
                 . '-dns';
my $topo = 'util/topology.sh';
my @nodes = map { $base + $_ } 11 .. 16;
my ($dns_port, $next_port) = (20440, 20441);
my $slow = $ENV{TEST_ASAN} ? 4 : 1;
my $t0 = time;

my $root = fleet_root('cluster-dns');
my %names = map { ("node-$_.test" => ['127.0.0.1']) } @nodes;
my $dns = DnsStub->start(port => $dns_port, dir => $root, ttl => 1,
                         names => { %names,
                                    'seed.test' => ['127.0.0.1'],
                                    'moving.test' => ['127.0.0.9'],
                                    'localhost' => ['127.0.0.1'],
                                    map { ("node-$_.test" => ['127.0.0.1']) }
                                        map { $base + $_ } 21 .. 26 });

my ($up, $up_tls, @dirs);
my $tls_dir = "$ENV{TOPO_DIR}-tls";
END {
    local $?;
    nginx_stop($_) for @dirs;
    system("$topo down cluster >/dev/null 2>&1") if $up;
    system("$topo down cluster-tls $tls_dir >/dev/null 2>&1") if $up_tls;
    $dns->stop if $dns;
}

sub cli { my $p = shift; redis_cli_at($p, @_) }

my $resolver = "resolver 127.0.0.1:$dns_port valid=1s ipv6=off;"
               . " resolver_timeout 1s;";

sub instance {
    my ($name, $http, $redis) = @_;
    my $port = $next_port++;
    my $dir = nginx_conf($name, $http . pay_server($name, $port,
        "idempotency_redis_timeout 1s; idempotency_redis $redis"
        . ($redis =~ / cluster / ? ';' : ' cluster;')
        . " location = /metrics { idempotency_metrics; }"),
        1);
    nginx_start($dir);
    push @dirs, $dir;
    return ($dir, $port);
}

sub masters {
    return grep { (split /\n/, cli($_, 'ROLE'))[0] eq 'master' } @nodes;
}

# spread(name, port, n): n new keys, then each once more; the statuses
sub spread {
    my ($tag, $port, $n) = @_;
    my @st = map { idem_status(http_post($port, "$tag-$_", 'x', undef,
                                         undef, 5)) } 1 .. $n;
    push @st, map { idem_status(http_post($port, "$tag-$_", 'x', undef,
                                          undef, 5)) } 1 .. $n;
    return join(' ', sort { $a cmp $b } @st);
}

# master_series(port, target) -> { node => value, promtool => ... }: the
# per-master redis_up of a scrape, and what promtool says of it
my $promtool = `sh -c 'command -v promtool'`;
chomp $promtool;

sub master_series {
    my ($port, $target) = @_;
    my $s = IO::Socket::INET->new(PeerAddr => "127.0.0.1:$port", Timeout => 5)
        or return {};
    print $s "GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n";
    local $/;
    my $res = <$s> // '';
    my ($body) = $res =~ /\r\n\r\n(.*)/s;
    $body //= '';
    my %m;
    $m{$1} = $2 while $body =~ /^nginx_idempotency_redis_up\{redis="\Q$target\E",node="([^"]+)"\} (\d+)$/mg;
    if ($promtool) {
        open my $f, '>', "$root/scrape.txt" or die $!;
        print $f $body;
        close $f;
        my $out = `$promtool check metrics < $root/scrape.txt 2>&1`;
        $m{promtool} = $? == 0 ? 'clean' : $out;
    }
    return \%m;
}

sub series_of { my $m = shift; join ' ', map { "$_=$m->{$_}" } sort keys %$m }

# the series wanted: one per master, its port for each P of the pattern
sub wanted {
    my $pattern = shift;
    my %w = map { (my $n = $pattern) =~ s/P/$_/g; ($n => 1) } masters();
    $w{promtool} = 'clean' if $promtool;
    return series_of(\%w);
}

sub served { join ' ', sort(('201 new') x $_[0], ('201 replay') x $_[0]) }

$up = 1;
topo('up', 'cluster');

# --- unknown-endpoint: nil endpoints, the node asked with their port

cli($_, qw(CONFIG SET cluster-preferred-endpoint-type unknown-endpoint))
    for @nodes;
like(cli($nodes[0], qw(CLUSTER SLOTS)), qr/^0\n5460\n\n$nodes[0]\n/,
     'unknown-endpoint: CLUSTER SLOTS names no host');

my ($dir, $port) = instance('unknown', '', "127.0.0.1:$nodes[0]");
my %before = map { $_ => cli($_, 'DBSIZE') } masters();
is(spread('unknown', $port, 12), served(12),
   'unknown-endpoint: every key served');
is(scalar(grep { cli($_, 'DBSIZE') > $before{$_} } keys %before), 3,
   'unknown-endpoint: the keys are on the three masters');
is(log_count($dir, qr/invalid map/), 0, 'unknown-endpoint: a valid map');
is(series_of(master_series($port, "127.0.0.1:$nodes[0]")),
   wanted('127.0.0.1:P'), 'unknown-endpoint: redis_up, one per master');

# --- hostname: the nodes are known by name

for my $p (@nodes) {
    cli($p, qw(CONFIG SET cluster-announce-hostname), "node-$p.test");
    cli($p, qw(CONFIG SET cluster-preferred-endpoint-type hostname));
}
# every node, since each instance below asks its own seed: a node that has
# not yet heard another's host name by gossip answers "?" for its slots
ok(wait_until(10, sub {
       !grep {
           my @named = cli($_, qw(CLUSTER SLOTS))
                       =~ /^\d+\n\d+\nnode-\d+\.test\n/mg;
           @named != 3 } @nodes }),
   'hostname: CLUSTER SLOTS names the masters by host name');

# an IP seed with a resolver: the map names the nodes
my ($dir_ip, $port_ip) = instance('hostname-ip', $resolver,
                                  "127.0.0.1:$nodes[1]");
is(spread('hostname-ip', $port_ip, 6), served(6),
   'hostname, an IP seed: every key served');

# and a seed by name
($dir, $port) = instance('hostname', $resolver, "seed.test:$nodes[0]");
%before = map { $_ => cli($_, 'DBSIZE') } masters();
is(spread('hostname', $port, 12), served(12), 'hostname: every key served');
is(scalar(grep { cli($_, 'DBSIZE') > $before{$_} } keys %before), 3,
   'hostname: the keys are on the three masters');
cmp_ok($dns->queries("node-$nodes[1].test", 'A'), '>', 0,
       'hostname: the nodes were resolved by the resolver');
is(log_count($dir, qr/\[(error|warn)\]/), 0, 'hostname: no error');
is(series_of(master_series($port, "seed.test:$nodes[0]")),
   wanted('node-P.test:P'), 'hostname: redis_up, one per master, by name');

# --- hostname without a resolver: said once, 503

my ($dir_nr, $port_nr) = instance('no-resolver', '', "127.0.0.1:$nodes[0]");
my @nr = map { http_post($port_nr, "nr-$_", 'x', undef, undef, 5)->{status} }
         1 .. 3;
is("@nr", '503 503 503', 'hostname, no resolver: 503');
is(log_count($dir_nr, qr/\[error\].*names a node "node-\d+\.test": host names need a "resolver"/),
   1, 'hostname, no resolver: logged once');

# --- a seed resolved again: first to a dead address, then to the cluster

my ($dir_mv, $port_mv) = instance('moving', $resolver,
                                  "moving.test:$nodes[0]");
sleep 0.5 * $slow;
is(http_post($port_mv, 'mv-0', 'x', undef, undef, 5)->{status}, 503,
   'a seed at a dead address: 503');
my $asked = $dns->queries('moving.test', 'A');
$dns->set('moving.test' => ['127.0.0.1']);
my $t_move = time;
ok(wait_until(8, sub {
       http_post($port_mv, 'mv-probe-' . int(time * 1000), 'x', undef,
                 undef, 5)->{status} == 201 }),
   'the seed moved by DNS: served without a reload');
note sprintf 'served %.1f s after the DNS change', time - $t_move;
cmp_ok($dns->queries('moving.test', 'A'), '>', $asked,
       'the seed name was resolved again');
is(spread('mv', $port_mv, 6), served(6), 'after the move: every key served');

# --- a failover: the promoted replica is known by its name

topo('cluster-failover');
my %st;
my $end = time + 3;
for (my $i = 0; time < $end; $i++) {
    $st{http_post($port, "fo-$i", 'x', undef, undef, 5)->{status}}++;
}
note 'after the failover: ' . join(', ', map { "$_ x$st{$_}" } sort keys %st);
is(spread('after-fo', $port, 9), served(9),
   'after a failover: every key served');
ok(wait_until(5, sub {
       series_of(master_series($port, "seed.test:$nodes[0]"))
       eq wanted('node-P.test:P') }),
   'after a failover: the new master has a series, the old one none')
    or diag series_of(master_series($port, "seed.test:$nodes[0]"));

# --- TLS: a node known by name is verified by its name

system("$topo down cluster >/dev/null 2>&1");
$up = 0;
$up_tls = 1;
topo('up', 'cluster-tls', $tls_dir);
my @tnodes = map { $base + $_ } 21 .. 26;
my $t = "$tls_dir/tls";
my $tcli = "$ENV{REDIS_CLI} --tls --cacert $t/ca.crt --cert $t/client.crt"
           . " --key $t/client.key";

sub announce {
    my $fmt = shift;
    for my $p (@tnodes) {
        (my $h = $fmt) =~ s/P/$p/g;
        system("$tcli -p $p CONFIG SET cluster-announce-hostname $h"
               . " >/dev/null 2>&1");
        system("$tcli -p $p CONFIG SET cluster-preferred-endpoint-type"
               . " hostname >/dev/null 2>&1");
    }
    (my $re = quotemeta $fmt) =~ s/P/\\d+/g;
    return wait_until(10, sub {
        !grep {
            my @named = `$tcli -p $_ CLUSTER SLOTS 2>/dev/null`
                        =~ /^\d+\n\d+\n$re\n/mg;
            @named != 3 } @tnodes });
}

my $tls = "tls; idempotency_redis_tls_trusted_certificate $t/ca.crt;"
          . " idempotency_redis_tls_certificate $t/client.crt;"
          . " idempotency_redis_tls_certificate_key $t/client.key";

ok(announce('node-P.test'), 'tls: the nodes announce node-N.test');
my ($dir_tn, $port_tn) = instance('tls-names', $resolver,
                                  "127.0.0.1:$tnodes[0] cluster $tls");
my @tn = map { http_post($port_tn, "tn-$_", 'x', undef, undef, 5)->{status} }
         1 .. 6;
is("@tn", '503 503 503 503 503 503',
   'tls: nodes not named in the certificate: 503');
cmp_ok(log_count($dir_tn,
                 qr/\[error\].*TLS certificate does not match "node-\d+\.test"/),
       '>=', 1, 'tls: the name that did not match is logged');

my ($dir_tl, $port_tl) = instance('tls-name', $resolver,
                                  "127.0.0.1:$tnodes[0] cluster $tls;"
                                  . " idempotency_redis_tls_name localhost");
is(spread('tl', $port_tl, 6), served(6),
   'tls: idempotency_redis_tls_name for every node: served');

ok(announce('localhost'), 'tls: the nodes announce localhost');
my ($dir_lh, $port_lh) = instance('tls-localhost', $resolver,
                                  "127.0.0.1:$tnodes[0] cluster $tls");
is(spread('lh', $port_lh, 6), served(6),
   'tls: nodes announced by a name the certificate has: served');

finish_all(@dirs);
@dirs = ();
note sprintf 'took %.1f s', time - $t0;

done_testing();
