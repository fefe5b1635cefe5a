# Wake-ups on a Redis Cluster (util/topology.sh cluster): the finish
# script's SPUBLISH goes out on the shard of the key's slot, so each worker
# subscribes each waited key on the master of its slot.
# - duplicates waiting on keys of all 3 masters are replayed soon after
#   the original's completion (1-2 ms on a quiet machine; within 250 ms is
#   asserted, room for a busy one: the safety poll is every second), the
#   upstream runs once per key, and each costs at most 2 claims while it
#   waits
# - the key's slot migrated while they wait (Redis pushes a sunsubscribe,
#   SSUBSCRIBE to the old master gets a MOVED): they are subscribed on the
#   new master, woken, and nothing runs twice
# - the subscribers killed (CLIENT KILL TYPE pubsub) while they wait: the
#   waiters poll, the subscribers come back and subscribe again
# - a graceful failover of the key's master while they wait
# - a kill -9 of a master while they wait: polling until the replica is
#   promoted, then woken through the new master
# In each of the last four the original's upstream is held by the test
# (t/lib/Held.pm) until the topology has changed and the waiters were seen
# subscribed where they should be: however long a migration takes on a
# busy machine, it happens while they wait.
# Plain Test::More; cluster on TOPO_BASE+11..+16 (TOPO_BASE defaulting to
# 25600), nginx on WAKE_CLUSTER_PORT (20520), the held upstream on
# WAKE_CLUSTER_PORT+1.
# topology: yes (make test-topologies runs this file)
use strict;
use warnings;
use Test::More;
use FindBin;
use lib "$FindBin::Bin/lib";
use Fleet;
use Wake;
use Held;
use TopoTest qw(wait_until);
use Digest::SHA qw(sha256_hex);
use Time::HiRes qw(time sleep);

plan skip_all => 'the module is not loaded' unless have_module();
plan skip_all => "$ENV{REDIS_SERVER} is needed" unless `which $ENV{REDIS_SERVER}`;

my $base = $ENV{TOPO_BASE} || 25600;
$ENV{TOPO_BASE} = $base;
$ENV{TOPO_DIR} ||= "/tmp/ngx-idempotency-topo-wake-cluster-$base";
my $port = $ENV{WAKE_CLUSTER_PORT} || 20520;
my $held_port = $port + 1;
my $seed = $base + 11;
my $slow = $ENV{TEST_ASAN} ? 4 : 1;

topo_up('cluster', $ENV{TOPO_DIR}) or BAIL_OUT('no cluster');

sub cli { my $p = shift; redis_cli_at($p, @_) }

# the record key (the channel) of an Idempotency-Key, and its slot
sub rkey { 'idem:{' . sha256_hex("\0" . shift) . '}' }

# {slot => master port} from CLUSTER NODES of a live node
sub slot_map {
    my %own;
    for my $p ($base + 11 .. $base + 16) {
        my $out = cli($p, 'CLUSTER', 'NODES');
        next unless $out =~ /myself/;
        for (split /\n/, $out) {
            my @f = split ' ';
            next unless $f[2] =~ /master/ && $f[2] !~ /fail/;
            my ($mp) = $f[1] =~ /:(\d+)@/;
            for my $r (@f[8 .. $#f]) {
                next if $r =~ /^\[/;
                my ($lo, $hi) = split /-/, $r;
                $own{$_} = $mp for $lo .. ($hi // $lo);
            }
        }
        return \%own;
    }
    return {};
}
# CLUSTER KEYSLOT, asked of a live node
sub server_keyslot {
    my $k = shift;
    for my $p ($base + 11 .. $base + 16) {
        my $slot = cli($p, 'CLUSTER', 'KEYSLOT', $k);
        return $slot if $slot =~ /^\d+$/;
    }
    return -1;
}
# the same computed here (CRC16/XMODEM of the hash tag), so that picking
# hundreds of keys costs no round trips; checked against the server below
sub keyslot {
    my $k = shift;
    $k = $1 if $k =~ /\{([^}]+)\}/;
    my $crc = 0;
    for my $c (unpack 'C*', $k) {
        $crc ^= $c << 8;
        $crc = ($crc & 0x8000 ? ($crc << 1) ^ 0x1021 : $crc << 1) & 0xffff
            for 1 .. 8;
    }
    return $crc % 16384;
}
sub owner {
    my ($name, $map) = @_;
    return ($map // slot_map())->{keyslot(rkey($name))};
}
sub masters { my %m = reverse %{ slot_map() }; sort keys %m }

my $root = fleet_root('wake-cluster');
# duplicates wait up to 90 s: longer than any topology change on a busy
# machine, shorter than the lease (idempotency_lock_ttl 2m)
my $dir = nginx_conf('wake', wake_server($port, "$root/wake",
    "127.0.0.1:$seed cluster; idempotency_redis_timeout 3s", <<"EOC", '90s'), 2);
        location = /backend-long {
            access_log $root/wake/logs/backend.log backend;
            proxy_pass http://127.0.0.1:$held_port;
        }
EOC
nginx_start($dir);
$Wake::port = $port;
my $held = Held->new($held_port);

# hold(sub): in a round's wait, takes the original's held upstream, runs
# sub, then lets the upstream answer; a test that it was held
my $answers = 0;
sub hold {
    my $during = shift;
    return sub {
        my $c = $held->take;
        ok($c, 'the original is held at its upstream');
        $during->();
        $held->answer($c, 'ok held' . ++$answers . "\n") if $c;
    };
}

sub runs { upstream_runs($dir)->{"$_[0] $_[1]"} // 0 }

# wait until the workers learnt the map
my $warm = 0;
wait_until(60 * $slow, sub {
    http_post($port, 'warm-' . ++$warm, 'x')->{status} == 200
});

my @m = masters();
is(scalar @m, 3, '3 masters');

is(join(' ', map { keyslot(rkey("wc-$_")) } 1 .. 5),
   join(' ', map { server_keyslot(rkey("wc-$_")) } 1 .. 5),
   'slots computed as the server does');

# keys by master: $by{port} = [names]
my %by;
my $map = slot_map();
for my $i (1 .. 900) {
    my $o = owner("wc-$i", $map) // next;
    push @{ $by{$o} }, "wc-$i";
}
is(scalar(grep { @{ $by{$_} // [] } >= 4 } @m), 3, 'keys on every master');

my $dups = 6;
my @at = map { 0.08 + 0.005 * $_ } 0 .. $dups - 1;

# one round: every duplicate replayed the original; -> the latest one's
# delay after the original ($done: when the original completed)
my $done;
sub wake_round {
    my ($key, $mode, $during) = @_;
    my ($orig, @d) = round($key, $mode, \@at, $during);
    $done = $orig->{done};
    is(scalar(grep { "$_->{status} $_->{idem}" eq '200 replay'
                     && $_->{body} eq $orig->{body} } @d), $dups,
       "$key: every duplicate replayed the original")
        or diag explain [ map { "$_->{status} $_->{idem}" } $orig, @d ];
    is(runs($key, '/backend' . ($mode // '')), 1,
       "$key: the upstream ran once");
    return (sort { $b <=> $a } map { $_->{done} - $orig->{done} } @d)[0];
}

sub stats {
    my %s;
    for my $p (masters()) {
        my $c = commandstats($p);
        $s{$_} += $c->{$_} for keys %$c;
    }
    return \%s;
}

# 1. the first round on each master connects the worker's subscribers
wake_round(shift @{ $by{$_} }) for @m;
wake_round(shift @{ $by{$_} }) for @m;

my $before = stats();
my @lat;
for my $round (1 .. 2) {
    push @lat, wake_round(shift @{ $by{$_} }) for @m;
}
my $after = stats();
my $max = (sort { $b <=> $a } @lat)[0];
cmp_ok($max, '<', 0.25 * $slow,
       'keys on 3 masters: every duplicate answered < 250 ms after the '
       . 'original') or diag sprintf '%.1f ms', $max * 1000;
diag(sprintf 'cluster: completion to replay: p50 %.1f ms, max %.1f ms',
             pct(0.5, @lat), $max * 1000);

# SET NX GET: 1 by each original and 1 by each duplicate before it waits;
# the finish script's SET counts as a SET too
my $rounds = 2 * @m;
my $n = $rounds * $dups;
my %d = map { $_ => ($after->{$_} // 0) - ($before->{$_} // 0) }
        qw(set ssubscribe sunsubscribe eval evalsha);
my $waiting = $d{set} - $d{eval} - $d{evalsha} - $rounds - $n;
cmp_ok($waiting, '<=', 2 * $n, 'at most 2 claims per duplicate while it '
       . 'waits') or diag explain \%d;
cmp_ok($d{ssubscribe}, '<=', 2 * $rounds, 'one SSUBSCRIBE per key and '
       . 'worker') or diag explain \%d;
diag(sprintf 'per waiting duplicate: %.2f claims while waiting; per key: '
             . '%.1f SSUBSCRIBE', $waiting / $n, $d{ssubscribe} / $rounds);

# subscribers of a key's channel on a master
sub numsub {
    my ($p, $key) = @_;
    my $out = cli($p, 'PUBSUB', 'SHARDNUMSUB', rkey($key));
    return ($out =~ /(\d+)\s*$/)[0] // 0;
}

# numsub once the subscribers had time to move: polled, not a fixed sleep,
# which a loaded machine outlasts; the deadline ends it if they never do
sub numsub_soon {
    my ($p, $key) = @_;
    my $deadline = time + 30 * $slow;
    my $n;
    while (($n = numsub($p, $key)) < 1 && time < $deadline) {
        sleep 0.05;
    }
    return $n;
}

# 2. the key's slot moves to another master while they wait
{
    my $src = $m[0];
    my $key = shift @{ $by{$src} };
    my $slot = keyslot(rkey($key));
    my ($dst) = grep { $_ != $src } @m;
    my ($on_src, $on_dst, $checked) = (0, 0, 0);
    my $late = wake_round($key, '-long', hold(sub {
        $on_src = numsub_soon($src, $key);
        topo('cluster-migrate-slot', $slot, $dst);
        topo('cluster-finish-migration');
        $on_dst = numsub_soon($dst, $key);
        $checked = time;
    }));
    cmp_ok($checked, '<', $done, 'migration: seen while they waited');
    cmp_ok($on_src, '>=', 1, "migration: subscribed on $src before");
    cmp_ok($on_dst, '>=', 1, "migration: subscribed on $dst after (slot "
           . "$slot moved)");
    is(owner($key), $dst, "migration: slot $slot is on $dst");
    cmp_ok($late, '<', 0.25 * $slow, 'migration: woken, not polled')
        or diag sprintf '%.1f ms', $late * 1000;
    note sprintf 'after the migration: %.1f ms', $late * 1000;
}

# 3. a reshard (redis-cli --cluster reshard moves the lowest slots of
# the source) while a key of the moved slots waits
{
    my ($from, $to) = @m[1, 2];
    my %own = %{ slot_map() };
    my %moving = map { $_ => 1 }
                 (sort { $a <=> $b } grep { $own{$_} == $from } keys %own)
                 [0 .. 299];
    my ($key) = grep { $moving{keyslot(rkey($_))} }
                map { "wr-$_" } 1 .. 400;
    my ($on_from, $on_to, $checked) = (0, 0, 0);
    my $late = wake_round($key, '-long', hold(sub {
        $on_from = numsub_soon($from, $key);
        topo('cluster-reshard', 300, $from, $to);
        $on_to = numsub_soon($to, $key);
        $checked = time;
    }));
    cmp_ok($checked, '<', $done, 'reshard: seen while they waited');
    is(owner($key), $to, "reshard: the key's slot moved to $to");
    cmp_ok($on_from, '>=', 1, "reshard: subscribed on $from before");
    cmp_ok($on_to, '>=', 1, "reshard: subscribed on $to after");
    cmp_ok($late, '<', 0.25 * $slow, 'reshard: woken, not polled')
        or diag sprintf '%.1f ms', $late * 1000;
    note sprintf 'after the reshard: %.1f ms', $late * 1000;
}

# 4. the subscriber connections killed while they wait
{
    my @k = map { shift @{ $by{$_} } } @m;
    my ($before, $killed, $again, $checked) = (0, 0, 0, 0);
    my ($orig, @d) = round($k[0], '-long', \@at, hold(sub {
        $before = numsub_soon(owner($k[0]), $k[0]);
        $killed += cli($_, 'CLIENT', 'KILL', 'TYPE', 'pubsub') for @m;
        $again = numsub_soon(owner($k[0]), $k[0]);
        $checked = time;
    }));
    cmp_ok($checked, '<', $orig->{done}, 'CLIENT KILL: seen while they '
           . 'waited');
    cmp_ok($before, '>=', 1, 'CLIENT KILL: they were subscribed');
    cmp_ok($killed, '>=', 1, "CLIENT KILL: $killed subscribers killed");
    cmp_ok($again, '>=', 1, 'CLIENT KILL: subscribed again');
    is(scalar(grep { "$_->{status} $_->{idem}" eq '200 replay' } @d), $dups,
       'CLIENT KILL TYPE pubsub: every duplicate replayed');
    is(runs($k[0], '/backend-long'), 1, 'CLIENT KILL: the upstream ran once');
    my $late = (sort { $b <=> $a } map { $_->{done} - $orig->{done} } @d)[0];
    note sprintf 'after CLIENT KILL: %.1f ms', $late * 1000;
    cmp_ok($late, '<', 0.25 * $slow, 'CLIENT KILL: subscribed again, woken')
        or diag sprintf '%.1f ms', $late * 1000;
    wake_round($k[$_]) for 1 .. 2;
}

# 5. a graceful failover of the key's master while they wait
{
    my $key = shift @{ $by{$m[2]} };
    my $late = wake_round($key, '-long', hold(sub {
        numsub_soon($m[2], $key);
        topo('cluster-failover', $m[2]);
    }));
    note sprintf 'failover of %s: %.1f ms, the slot now on %s', $m[2],
                 $late * 1000, owner($key) // '?';
    my @k = grep { defined owner($_) } map { "wf-$_" } 1 .. 6;
    wake_round($_) for @k;
}

# 6. kill -9 of a master while keys of it wait: its subscribers are lost,
# the waiters poll, the replica is promoted; then the keys of its slots
# are woken through subscribers on the new master
{
    my $victim = $m[0];
    my $key = shift @{ $by{$victim} };
    my ($orig, @d) = round($key, '-long', \@at, hold(sub {
        numsub_soon($victim, $key);
        topo('cluster-kill-master', $victim);
    }));
    # waiters whose claim found no master within idempotency_redis_timeout
    # answer 503, as without wake-ups
    note 'kill -9: ' . join ' ', map { "$_->{status} $_->{idem}" } $orig, @d;
    is(runs($key, '/backend-long'), 1, 'kill -9: the upstream ran once');
    is(scalar(grep { $_->{idem} eq 'new' } @d), 0,
       'kill -9: no duplicate ran it again');
    my $new = owner($key) // 0;
    isnt($new, $victim, "kill -9: the slot is on $new now");
    # until the workers' maps name the promoted master (keys of its slots)
    # (a key each time: those left of its slots last about 30 s)
    wait_until(30 * $slow, sub {
        my $k = shift @{ $by{$victim} } // return 0;
        http_post($port, $k, 'x')->{status} == 200
    });
    wake_round(shift @{ $by{$victim} });
    my $late = wake_round(shift @{ $by{$victim} });
    cmp_ok($late, '<', 0.25 * $slow, "kill -9: woken through $new")
        or diag sprintf '%.1f ms', $late * 1000;
}

nginx_stop($dir);
is(join('', log_problems("$dir/logs/error.log")), '',
   'no crash, alert or socket left');

done_testing();
