# Redis Cluster: "idempotency_redis SEED cluster" learns the slot map from
# one seed and sends each key to the master of its slot, through a
# resharding, a slot left migrating (ASK), a graceful failover and a kill -9
# of a master. Every scenario counts the backend's executions: never more
# than one per key, and every key that got its 201 replays afterwards.
# - spread: records of 60 keys land on all 3 masters, with no MOVED at all
#   (the module's CRC16 slots match the cluster's)
# - duplicates from two nginx instances (2 workers each) execute once
# - connections killed (CLIENT KILL) under traffic: claims and stores are
#   sent again, no error, no store lost
# - reshard under traffic, ASK on a migrating slot, failover, kill -9
# - a dead first seed: the next one gives the map
# - TLS and an ACL user (AUTH) on every node of a TLS-only cluster
# - nginx -t: "db=1 cluster" and several addresses without "cluster"
# Plain Test::More: util/topology.sh cluster on TOPO_BASE (default 24000:
# nodes 24011-24016, +19 a dead seed; cluster-tls +21 to +26), nginx on
# TOPO_BASE+300 to +303.
# topology: yes (make test-topologies runs this file)
use strict;
use warnings;
use lib 't/lib';
use Test::More;
use Fleet;
use IO::Socket::INET;
use Digest::SHA qw(sha256_hex);
use POSIX qw(WNOHANG);
use Time::HiRes qw(sleep time);

plan skip_all => 'TEST_NGINX_LOAD_MODULES must name the module'
    unless have_module();
plan skip_all => "$ENV{REDIS_SERVER} is needed" unless `which $ENV{REDIS_SERVER}`;

my $base = $ENV{TOPO_BASE} || 24000;
$ENV{TOPO_BASE} = $base;
$ENV{TOPO_DIR} ||= "/tmp/ngx-idempotency-topo-cluster-$base";
my $topo = 'util/topology.sh';
my ($pa, $pb) = ($base + 300, $base + 301);
my $seed = $base + 11;
my $t0 = time;

my $tls_dir = "$ENV{TOPO_DIR}-tls";
my ($up, $up_tls);
END {
    local $?;
    system("$topo down cluster $ENV{TOPO_DIR} >/dev/null 2>&1") if $up;
    system("$topo down cluster-tls $tls_dir >/dev/null 2>&1") if $up_tls;
}
$SIG{$_} = sub { $SIG{PIPE} = 'IGNORE'; exit 1 } for qw(INT TERM HUP PIPE);

sub topo {
    my $out = `$topo @_ 2>&1`;
    my $ok = $? == 0;
    chomp $out;
    ok($ok, "topology.sh @_") or diag $out;
    note $out;
    return $ok ? $out : '';
}

$up = 1;
topo('up', 'cluster', $ENV{TOPO_DIR}) or BAIL_OUT('no cluster');

# CRC16/XMODEM of the hash tag, as Redis Cluster computes slots
my @crc;
for my $i (0 .. 255) {
    my $c = $i << 8;
    $c = ($c & 0x8000) ? (($c << 1) ^ 0x1021) & 0xffff : ($c << 1) & 0xffff
        for 1 .. 8;
    $crc[$i] = $c;
}
sub crc16 {
    my $c = 0;
    $c = (($c << 8) & 0xffff) ^ $crc[(($c >> 8) ^ $_) & 0xff]
        for unpack 'C*', shift;
    return $c;
}
is(crc16('123456789'), 12739, 'CRC16/XMODEM of "123456789"');
sub slot_of_key { crc16(sha256_hex("\0" . shift)) & 16383 }

sub cli { my $p = shift; redis_cli_at($p, @_) }

# the live masters, from CLUSTER NODES of any live node
sub masters {
    for my $p ($base + 11 .. $base + 16) {
        my $out = cli($p, 'CLUSTER', 'NODES');
        next unless $out =~ /myself/;
        return sort map { /:(\d+)@/ ? $1 : () }
               grep { /\bmaster\b/ && !/\bfail/ } split /\n/, $out;
    }
    return ();
}
sub errorstat {
    my $what = shift;
    my $n = 0;
    for my $p (masters()) {
        $n += $1 if cli($p, 'INFO', 'errorstats') =~ /errorstat_$what:count=(\d+)/;
    }
    return $n;
}
sub resetstat { cli($_, 'CONFIG', 'RESETSTAT') for masters() }

my $root = fleet_root('cluster');
my %dirs;
for ([a => $pa], [b => $pb]) {
    my ($name, $port) = @$_;
    $dirs{$name} = nginx_conf($name, pay_server($name, $port,
        "idempotency_redis 127.0.0.1:$seed cluster;\n"
        . "        idempotency_redis_timeout 3s;\n"
        . "        location = /admin { idempotency_admin; }"), 2);
    nginx_start($dirs{$name});
}

# runs(): executions of the backend by key, over both instances
sub runs {
    my %n;
    for my $d (values %dirs) {
        my $r = upstream_runs($d);
        $n{$_} += $r->{$_} for keys %$r;
    }
    return \%n;
}
# keys that ran more than once (of one scenario's tag, or all)
sub twice {
    my $tag = shift;
    my $r = runs();
    return grep { (!defined $tag || /^\Q$tag\E-/) && $r->{$_} > 1 }
           sort keys %$r;
}

# wait until both instances answer (their workers learnt the map)
for (1 .. 50) {
    last if http_post($pa, "warm-a-$_", 'x')->{status} == 201
         && http_post($pb, "warm-b-$_", 'x')->{status} == 201;
    sleep 0.1;
}
resetstat();

# --- spread: 60 keys from one seed, on every master, no MOVED
my @m = masters();
is(scalar @m, 3, '3 masters');
my @keys = map { "spread-$_" } 1 .. 60;
my @st = map { http_post($_ % 2 ? $pa : $pb, $keys[$_], 'x')->{status} }
         0 .. $#keys;
is(scalar(grep { $_ == 201 } @st), 60, 'spread: 60 keys stored')
    or diag "@st";
my @db = map { cli($_, 'DBSIZE') } @m;
is(scalar(grep { $_ > 0 } @db), 3, "spread: records on every master (@db)");
is(errorstat('MOVED'), 0, 'spread: no MOVED: the slots match the cluster');
my $on = 0;
for my $k (@keys) {
    my $slot = slot_of_key($k);
    my $rk = "idem:{" . sha256_hex("\0$k") . "}";
    my $got = `$ENV{REDIS_CLI} -c -p $seed EXISTS '$rk' 2>/dev/null`;
    $on++ if $got =~ /^1/ && cli($seed, 'CLUSTER', 'KEYSLOT', $rk) == $slot;
}
is($on, 60, 'spread: every record at its slot');

# --- a dead first seed: the map comes from the next one
{
    my $pc = $base + 302;
    my $d = nginx_conf('c', pay_server('c', $pc,
        "idempotency_redis 127.0.0.1:" . ($base + 19) . " 127.0.0.1:"
        . ($seed + 1) . " cluster;\n        idempotency_redis_timeout 3s;"),
        1);
    nginx_start($d);
    my @c = map { http_post($pc, "seed-$_", 'x', undef, undef, 5)->{status} }
            1 .. 10;
    is("@c", join(' ', (201) x 10), 'a dead first seed: served by the next');
    nginx_stop($d);
}

# --- duplicates from two instances, 2 workers each
my @dup = map { "dup-$_" } 1 .. 20;
my $res = http_burst([ map { my $k = $_; map { [$_, $k, 'x'] } $pa, $pb, $pa,
                       $pb } @dup ], 10);
my %new;
$new{$dup[int($_ / 4)]}++
    for grep { $res->[$_]{head} =~ /X-Idem: new/i } 0 .. $#$res;
is(scalar(grep { $new{$_} == 1 } @dup), 20,
   'duplicates: one 201 per key');
is(scalar(grep { $_->{status} == 201 || $_->{status} == 409 } @$res),
   scalar @$res, 'duplicates: the others 201 (replayed) or 409');
is(join(' ', twice()), '', 'duplicates: no key ran twice');

# traffic(tag, sub): requests while sub runs (in a child); each key goes to
# both instances at once. -> (keys, {status => count})
sub traffic {
    my ($tag, $action) = @_;
    my $pid = fork // die "fork: $!";
    if ($pid == 0) {
        $action->();
        POSIX::_exit(0);
    }
    my (@k, %status, @failed, $i);
    my $slow = 0;
    while (1) {
        my $done = waitpid($pid, WNOHANG) == $pid;
        my @batch = map { "$tag-" . ++$i } 1 .. 4;
        my $t = time;
        my $r = http_burst([ map { [$pa, $_, 'x'], [$pb, $_, 'x'] } @batch ],
                           8);
        $slow++ if time - $t > 5;
        $status{$_->{status}}++ for @$r;
        push @failed, map { $batch[int($_ / 2)] }
                      grep { $r->[$_]{status} == 503 } 0 .. $#$r;
        push @k, @batch;
        last if $done;
    }
    ok(!$slow, "$tag: no request hung");
    return (\@k, \%status, \@failed);
}

my ($k, $s);

# the keys that ran but do not replay now (their record was lost)
sub lost {
    my $k = shift;
    my $r = runs();
    return grep { $r->{$_}
                  && http_post($pa, $_, 'x', undef, undef, 5)->{head}
                     !~ /X-Idem: replay/i } @$k;
}

# every key with a 201 replays now (its record was not lost)
sub replayed {
    my ($tag, $k) = @_;
    is(join(' ', lost($k)), '', "$tag: every executed key replays");
    is(join(' ', twice($tag)), '', "$tag: no key ran twice");
}

# --- connections killed under traffic: claims and stores are sent again
sub log_count {
    my $re = shift;
    return scalar grep { /$re/ } map { lines_of("$_/logs/error.log") }
                                 values %dirs;
}
($k, $s) = traffic('conn', sub {
    for (1 .. 12) {
        cli($_, 'CLIENT', 'KILL', 'TYPE', 'normal') for masters();
        sleep 0.25;
    }
});
note explain $s;
ok(!$s->{503} && !$s->{0}, 'client kill: no error') or diag explain $s;
ok(log_count(qr/lost the connection/) > 0, 'client kill: connections lost');
is(log_count(qr/claim was lost|went away before/), 0,
   'client kill: every store made it');
replayed('conn', $k);

# --- resharding under traffic (MOVED, and ASK while slots move)
resetstat();
($k, $s) = traffic('reshard',
                      sub { system("$topo cluster-reshard 200 >/dev/null") });
note explain $s;
ok(!$s->{503} && !$s->{0}, 'reshard: no error') or diag explain $s;
ok(errorstat('MOVED') > 0, 'reshard: MOVED was followed');
replayed('reshard', $k);

# --- a slot left migrating: new keys of the slot go to the target (ASK)
my $slot = slot_of_key('spread-1');
topo('cluster-migrate-slot', $slot);
resetstat();
my @ask;
for (my $i = 0; @ask < 6; $i++) {
    push @ask, "ask-$i" if slot_of_key("ask-$i") == $slot;
}
$res = http_burst([ map { [$pa, $_, 'x'], [$pb, $_, 'x'] } @ask, 'spread-1' ],
                  8);
is(scalar(grep { $_->{status} == 201 || $_->{status} == 409 } @$res),
   scalar @$res, 'ask: answered') or diag explain [map { $_->{status} } @$res];
ok(errorstat('ASK') > 0, 'ask: ASK was followed');
like(http_post($pa, 'spread-1', 'x')->{head}, qr/X-Idem: replay/i,
     'ask: a record still on the source replays');
topo('cluster-finish-migration');
replayed('ask', [@ask, 'spread-1']);

# --- graceful failover under traffic
($k, $s) = traffic('failover',
                   sub { system("$topo cluster-failover >/dev/null") });
note explain $s;
ok(!$s->{0}, 'failover: every request answered') or diag explain $s;
replayed('failover', $k);

# --- kill -9 of a master: 503 only for its slots until the promotion
# slots_of(): port => [[start, end], ...] of the live masters
sub slots_of {
    my %s;
    for (split /\n/, cli($seed + 1, 'CLUSTER', 'NODES')) {
        my @f = split ' ';
        next unless $f[2] =~ /master/ && $f[2] !~ /fail/;
        my ($port) = $f[1] =~ /:(\d+)@/;
        $s{$port} = [ map { /^(\d+)(?:-(\d+))?$/ ? [$1, $2 // $1] : () }
                      @f[8 .. $#f] ];
    }
    return \%s;
}
my $before = slots_of();
my $failed;
($k, $s, $failed) = traffic('kill',
                   sub { system("$topo cluster-kill-master >/dev/null") });
note explain $s;
ok(!$s->{0}, 'kill: every request answered') or diag explain $s;
my @after = masters();
is(scalar @after, 3, 'kill: a replica was promoted');
my ($dead) = grep { my $p = $_; !grep { $_ == $p } @after } keys %$before;
my $on_dead = sub {
    grep { my $sl = slot_of_key($_);
           !grep { $sl >= $_->[0] && $sl <= $_->[1] }
            @{ $before->{$dead // 0} || [] } } @_;
};
my @elsewhere = $on_dead->(@$failed);
is("@elsewhere", '', "kill: 503 only for the slots of the dead master "
   . "($dead, " . scalar(@$failed) . " requests)");

# replication is asynchronous: a record the dead master acknowledged but
# had not passed on is lost with it (WAIT is what prevents that); every
# other record replays.  No key ran twice under the traffic; the probe
# for replays may itself run a key whose claim was lost too.
is(join(' ', twice('kill')), '', "kill: no key ran twice");
my @lost = lost($k);
@elsewhere = $on_dead->(@lost);
is("@elsewhere", '', "kill: only records of the dead master can be lost ("
   . scalar(@lost) . " lost)");
$res = http_burst([ map { [$pa, "after-kill-$_", 'x'] } 1 .. 30 ], 8);
is(scalar(grep { $_->{status} == 201 } @$res), 30,
   'kill: every shard serves again after the promotion');

# --- TLS and an ACL user on every node
$up_tls = 1;
if (topo('up', 'cluster-tls', $tls_dir)) {
    my $pd = $base + 303;
    my $t = "$tls_dir/tls";
    my $d = nginx_conf('d', pay_server('d', $pd,
        "idempotency_redis 127.0.0.1:" . ($base + 21) . " cluster tls "
        . "user=idem password=idem-password;
        idempotency_redis_tls_trusted_certificate $t/ca.crt;
        idempotency_redis_tls_certificate $t/client.crt;
        idempotency_redis_tls_certificate_key $t/client.key;
        idempotency_redis_timeout 3s;"), 1);
    nginx_start($d);
    my @tk = map { "tls-$_" } 1 .. 30;
    my @ts = map { http_post($pd, $_, 'x', undef, undef, 5)->{status} } @tk;
    is(scalar(grep { $_ == 201 } @ts), 30, 'tls: 30 keys stored')
        or diag "@ts";
    my @tdb = map {
        `$ENV{REDIS_CLI} --tls --cacert $t/ca.crt --cert $t/client.crt --key $t/client.key -p $_ DBSIZE 2>/dev/null` =~ /(\d+)/ ? $1 : -1
    } $base + 21 .. $base + 23;
    is(scalar(grep { $_ > 0 } @tdb), 3, "tls: records on every master (@tdb)");
    my @p = log_problems("$d/logs/error.log");
    is("@p", '', 'tls: no alert or crash');
    nginx_stop($d);
}
system("$topo down cluster-tls $tls_dir >/dev/null 2>&1");
$up_tls = 0;

for my $d (values %dirs) {
    my @p = log_problems("$d/logs/error.log");
    is("@p", '', "no alert or crash in $d");
}

# --- nginx -t
sub conf_test {
    my ($name, $directive) = @_;
    my $d = nginx_conf($name, "server { listen 127.0.0.1:$pa; "
                       . "location / { idempotency on; $directive } }", 1);
    my $out = `@{[ $ENV{TEST_NGINX_BINARY} || 'nginx' ]} -t -p $d/ -c conf/nginx.conf 2>&1`;
    return ($? >> 8, $out);
}
my ($rc, $out) = conf_test('t-db',
                           "idempotency_redis 127.0.0.1:$seed db=1 cluster;");
ok($rc && $out =~ /"db=" cannot be used with "cluster"/,
   'nginx -t: db=1 with cluster') or diag $out;
($rc, $out) = conf_test('t-several', "idempotency_redis 127.0.0.1:$seed "
                        . "127.0.0.1:" . ($seed + 1) . ";");
ok($rc && $out =~ /several redis addresses require "cluster"/,
   'nginx -t: several addresses without cluster') or diag $out;
($rc, $out) = conf_test('t-seeds', "idempotency_redis 127.0.0.1:$seed "
                        . "127.0.0.1:" . ($seed + 1) . " cluster;");
is($rc, 0, 'nginx -t: several seeds with cluster') or diag $out;

note sprintf 'took %.1f s', time - $t0;
# idempotency_admin on a cluster: each key is read on its slot's master
{
    my @seen;
    for my $k (@dup[0 .. 4]) {
        my $s = IO::Socket::INET->new("127.0.0.1:$pa") or next;
        print $s "GET /admin?key=$k HTTP/1.0\r\nHost: x\r\n\r\n";
        local $/;
        my $res = <$s> // '';
        push @seen, $res =~ /"state":"(\w+)"/ ? $1 : 'none';
    }
    is("@seen", join(' ', ('completed') x 5),
       'idempotency_admin reads each key on its own master');
}

done_testing();
