# Wake-ups on Redis topologies (util/topology.sh):
# - sentinel: the worker's subscriber connection goes to the master the
#   Sentinels named, waiting duplicates are woken within a few ms of the
#   original's completion, and still after a failover (the subscriber
#   follows the new master)
# - standalone-tls: the subscriber connects with TLS, a client
#   certificate and an ACL user, and wakes the waiters
# Plain Test::More; Redis on TOPO_BASE+0..+1 and +31..+43, nginx on
# TOPO_BASE+310..+311 (TOPO_BASE defaulting to 25000).
# topology: yes (make test-topologies runs this file)
use strict;
use warnings;
use Test::More;
use FindBin;
use lib "$FindBin::Bin/lib";
use Fleet;
use Wake;
use Time::HiRes qw(time sleep);

plan skip_all => 'the module is not loaded' unless have_module();
plan skip_all => "$ENV{REDIS_SERVER} is needed" unless `which $ENV{REDIS_SERVER}`;

my $base = $ENV{TOPO_BASE} || 25000;
$ENV{TOPO_BASE} = $base;
$ENV{TOPO_DIR} ||= "/tmp/ngx-idempotency-topo-wake-$base";
my $topo = 'util/topology.sh';
my @sentinels = map { $base + $_ } 41 .. 43;
my $port = $base + 310;
my $slow = $ENV{TEST_ASAN} ? 4 : 1;

my @up;
END {
    local $?;
    system("$topo down $_ >/dev/null 2>&1") for @up;
}

sub master_port {
    my $out = redis_cli_at($sentinels[1],
                           qw(SENTINEL get-master-addr-by-name idem));
    return (split /\n/, $out)[1];
}

push @up, 'sentinel';
topo('up', 'sentinel');
my $master = master_port();

my $root = fleet_root('wake-sentinel');
my $dir = nginx_conf('wake', wake_server($port, "$root/wake",
    join(' ', map { "127.0.0.1:$_" } @sentinels)
    . ' sentinel=idem user=idem password=idem-password'), 2);
nginx_start($dir);
$Wake::port = $port;
sleep 1 * $slow;

my @at = map { 0.08 + 0.005 * $_ } 0 .. 5;

# round(key) -> the latest duplicate's delay after the original, and the
# subscribers of the key's channel on $on while they waited
sub wake_round {
    my ($key, $on) = @_;
    my $subs = 0;
    my ($orig, @d) = round($key, undef, \@at, $on && sub {
        # looked at until the subscription is there, while the original
        # still runs, not once after a guess (a loaded machine)
        my $until = time + 0.15;
        do {
            sleep 0.02;
            my ($ch) = split /\n/,
                       redis_cli_at($on, 'PUBSUB', 'SHARDCHANNELS');
            my $n = redis_cli_at($on, 'PUBSUB', 'SHARDNUMSUB',
                                 $ch // 'none');
            ($subs) = $n =~ /(\d+)\s*$/;
        } while (!$subs && time < $until);
    });
    is(scalar(grep { "$_->{status} $_->{idem}" eq '200 replay'
                     && $_->{body} eq $orig->{body} } @d), scalar @at,
       "$key: every duplicate replayed the original");
    return ((sort { $b <=> $a } map { $_->{done} - $orig->{done} } @d)[0],
            $subs // 0);
}

# the first round connects the subscribers
wake_round('ws-0', $master);

my ($late, $subs) = wake_round('ws-1', $master);
cmp_ok($subs, '>=', 1, "the waiters subscribed on the master ($master)");
cmp_ok($late, '<', 0.05 * $slow, 'woken within 50 ms')
    or diag sprintf '%.1f ms', $late * 1000;
note sprintf 'latest duplicate: %.1f ms after the original', $late * 1000;

topo('sentinel-failover', '--switch-only');
my $new = master_port();
isnt($new, $master, "failover: $master -> $new");
sleep 2 * $slow;

for my $i (2 .. 3) {
    my ($late, $subs) = wake_round("ws-$i", $new);
    note sprintf 'after the failover: %.1f ms, %d subscribers on %s',
                 $late * 1000, $subs, $new;
    cmp_ok($late, '<', 0.05 * $slow, "after the failover: woken ($i)");
}

nginx_stop($dir);
is(join('', log_problems("$dir/logs/error.log")), '',
   'no crash, alert or socket left');
topo('down', 'sentinel');
@up = ();

# TLS with a required client certificate, as the ACL user
push @up, 'standalone-tls';
topo('up', 'standalone-tls');
my $pki = "$ENV{TOPO_DIR}/tls";
my $tls = nginx_conf('tls', wake_server($port + 1, "$root/tls",
    "127.0.0.1:@{[ $base + 1 ]} tls user=idem password=idem-password;"
    . " idempotency_redis_tls_trusted_certificate $pki/ca.crt;"
    . " idempotency_redis_tls_certificate $pki/client.crt;"
    . " idempotency_redis_tls_certificate_key $pki/client.key"), 2);
nginx_start($tls);
$Wake::port = $port + 1;
sleep 1 * $slow;
wake_round('wt-0');
($late) = wake_round('wt-1');
cmp_ok($late, '<', 0.05 * $slow, 'TLS: woken within 50 ms')
    or diag sprintf '%.1f ms', $late * 1000;
note sprintf 'TLS: latest duplicate %.1f ms after the original',
             $late * 1000;
nginx_stop($tls);
is(join('', log_problems("$tls/logs/error.log")), '',
   'TLS: no crash, alert or socket left');

done_testing();
