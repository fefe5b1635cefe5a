# The Redis topologies the Cluster, Sentinel, TLS and WAIT tests run on
# (util/topology.sh), checked with redis-cli alone: each comes up complete,
# its actions do what they say, and "down" leaves no process behind.
# - standalone-tls: PING over TLS; the client certificate is optional on
#   one port, required on the other; wrong CA, wrong client, plain TCP fail
# - replica: WAIT 1 counts the replica, and 0 while it is paused
# - cluster: keys land on the master owning their slot (CRC16 of the hash
#   tag); MOVED after a reshard; ASK on a migrating slot; a graceful
#   failover keeps the data
# - cluster-tls: the same over TLS, through a kill -9 of a master and its
#   restart as a replica
# - sentinel: a failover changes get-master-addr-by-name on every Sentinel
#   and the old master answers READONLY; so does a kill -9 of the master
# Plain Test::More; ports 23000-23199 (util/topology.sh has the map).
# topology: yes (make test-topologies runs this file)
use strict;
use warnings;
use Test::More;
use IPC::Open2;
use Time::HiRes qw(time);

my $topo = 'util/topology.sh';
$ENV{REDIS_SERVER} ||= 'redis-server';
$ENV{REDIS_CLI} ||= 'redis-cli';

plan skip_all => "$ENV{REDIS_SERVER} and a $ENV{REDIS_CLI} with TLS are needed"
    unless `$ENV{REDIS_CLI} --help 2>&1` =~ /--tls/
        && `which $ENV{REDIS_SERVER}`;

my (%up, $t0);
$t0 = time;

# whatever happens, nothing stays running
END {
    local $?;
    system("$topo down $_ >/dev/null") for sort keys %up;
}
# a signal, or prove gone (SIGPIPE), would skip END: exit instead
$SIG{$_} = sub { $SIG{PIPE} = 'IGNORE'; exit 1 } for qw(INT TERM HUP PIPE);

sub dir_of { "/tmp/ngx-idempotency-topo-$_[0]" }

# topo(args...) -> its one line of output; a failure fails the test
sub topo {
    # the cluster actions act on $ENV{TOPO}
    my $out = `$topo @_ 2>&1`;
    my $ok = $? == 0;
    chomp $out;
    ok($ok, "topology.sh @_") or diag $out;
    note $out;
    return $ok ? $out : '';
}

sub up {
    my $name = shift;
    $up{$name} = 1;
    return topo('up', $name);
}

# down(name): down, then no pid of its pid files is alive
sub down {
    my $name = shift;
    topo('down', $name);
    delete $up{$name};
    my @alive = grep { kill 0, $_ }
                map { open my $f, '<', $_ or return (); scalar <$f> }
                glob(dir_of($name) . '/*/redis.pid');
    chomp @alive;
    is("@alive", '', "$name: no process left");
}

sub tls_for {
    my $t = dir_of(shift) . '/tls';
    return (cacert => "$t/ca.crt", cert => "$t/client.crt",
            key => "$t/client.key", dir => $t);
}

# cli(port, {opts}, args...) -> output, errors included; opts: tls (a
# tls_for() hash, minus the keys set to ''), input (fed on stdin: one
# connection for several commands), cluster (-c)
sub cli {
    my ($port, $o, @args) = @_;
    my $cmd = "$ENV{REDIS_CLI} --no-auth-warning -h 127.0.0.1 -p $port";
    if (my $t = $o->{tls}) {
        $cmd .= ' --tls';
        $cmd .= " --$_ $t->{$_}" for grep { $t->{$_} } qw(cacert cert key);
    }
    $cmd .= ' -c' if $o->{cluster};
    $cmd .= join '', map { " '$_'" } @args;
    my $pid = open2(my $out_fh, my $in_fh, 'sh', '-c', "$cmd 2>&1");
    print $in_fh $o->{input} // '';
    close $in_fh;
    my $out = do { local $/; <$out_fh> } // '';
    waitpid $pid, 0;
    $out =~ s/\s+\z//;
    return $out;
}

# CRC16/XMODEM of the hash tag (the first non-empty {...}) or the key
sub keyslot {
    my $k = shift;
    $k = $1 if $k =~ /^[^{]*\{([^}]+)\}/;
    my $c = 0;
    for my $b (unpack 'C*', $k) {
        $c ^= $b << 8;
        $c = ($c & 0x8000 ? ($c << 1) ^ 0x1021 : $c << 1) & 0xffff for 1 .. 8;
    }
    return $c % 16384;
}

# owner(port, opts, slot): the master owning the slot, as PORT sees it
sub owner {
    my ($port, $o, $slot) = @_;
    for (split /\n/, cli($port, $o, 'CLUSTER', 'NODES')) {
        my ($id, $addr, $flags, @f) = split;
        next unless $flags =~ /master/ && $flags !~ /fail/;
        my ($p) = $addr =~ /:(\d+)/;
        for (@f[5 .. $#f]) {
            next if /^\[/;
            my ($lo, $hi) = split /-/;
            $hi //= $lo;
            return $p if $lo <= $slot && $slot <= $hi;
        }
    }
    return '';
}

# a key of the slot: "prefix{tagN}" for the first N that hashes there
sub key_in {
    my ($slot, $prefix) = @_;
    for my $n (0 .. 1_000_000) {
        return "$prefix\{t$n}" if keyslot("t$n") == $slot;
    }
}

# ---------------------------------------------------------------- TLS
{
    up('standalone-tls');
    my %t = tls_for('standalone-tls');
    is(cli(23000, { tls => \%t }, 'PING'), 'PONG', 'TLS: PING');
    is(cli(23000, { tls => { %t, cert => '', key => '' } }, 'PING'), 'PONG',
       'TLS: client certificate optional on 23000');
    is(cli(23001, { tls => \%t }, 'PING'), 'PONG',
       'TLS: PING with the client certificate on 23001');
    isnt(cli(23001, { tls => { %t, cert => '', key => '' } }, 'PING'), 'PONG',
         'TLS: refused without a client certificate on 23001');
    isnt(cli(23001, { tls => { %t, cert => "$t{dir}/other-client.crt",
                               key => "$t{dir}/other-client.key" } },
             'PING'), 'PONG',
         'TLS: refused with a client certificate of another CA');
    like(cli(23000, { tls => { %t, cacert => "$t{dir}/other-ca.crt" } },
             'PING'), qr/certificate verify failed/,
         'TLS: the server is not trusted under another CA');
    isnt(cli(23000, {}, 'PING'), 'PONG', 'TLS: plain TCP fails');
    is(cli(23000, { tls => \%t }, '--user', 'idem', '--pass', 'idem-password',
           'ACL', 'WHOAMI'), 'idem', 'TLS: the ACL user');
    like(`openssl x509 -noout -ext subjectAltName -in $t{dir}/redis.crt`,
         qr/DNS:localhost, IP Address:127.0.0.1/, 'server certificate SAN');
    down('standalone-tls');
    isnt(cli(23000, { tls => \%t }, 'PING'), 'PONG', 'TLS: down');
}

# ---------------------------------------------------------------- WAIT
{
    up('replica');
    my $wait = sub { (split /\n/, cli(23051, { input =>
                        "SET idem:{w} x\nWAIT 1 100\n" }))[-1] };
    is($wait->(), 1, 'replica: WAIT 1 100 is acknowledged');
    like(topo('replica-pause'), qr/^replica-pause: replica 23052/,
         'replica-pause says what it did');
    is($wait->(), 0, 'replica: WAIT 1 100 is 0 while the replica is paused');
    topo('replica-resume');
    is($wait->(), 1, 'replica: acknowledged again after replica-resume');
    is(cli(23052, {}, 'GET', 'idem:{w}'), 'x', 'the replica has the key');
    down('replica');
}

# ---------------------------------------------------------------- cluster
{
    up('cluster');
    my $c = {};
    is(cli(23011, $c, 'CLUSTER', 'KEYSLOT', 'idem:{abc}'), keyslot('abc'),
       'CLUSTER KEYSLOT hashes the tag only');
    is(keyslot('123456789'), 12739, 'our CRC16 is XMODEM');
    is(cli(23012, $c, 'CLUSTER', 'KEYSLOT', 'a{b}c{d}'), keyslot('b'),
       'the first tag counts');

    # redis-cli -c follows MOVED: the key lands on its slot's master
    my $k = 'idem:{abc}';
    my $s = keyslot('abc');
    my $m = owner(23011, $c, $s);
    like($m, qr/^2301[1-6]$/, "slot $s has a master ($m)");
    is(cli(23011, { cluster => 1 }, 'SET', $k, 'v1'), 'OK', 'SET -c');
    is(cli($m, $c, 'GET', $k), 'v1', 'the key is on the master owning it');
    my $other = $m == 23011 ? 23012 : 23011;
    is(cli($other, $c, 'GET', $k), "MOVED $s 127.0.0.1:$m",
       'another node answers MOVED');

    # reshard: the slots moved and their keys answer MOVED at the source
    my $k0 = key_in(0, 'idem:');
    is(cli(23011, { cluster => 1 }, 'SET', $k0, 'v0'), 'OK', 'a key in slot 0');
    my $out = topo('cluster-reshard', 10);
    my $re = '^cluster-reshard: moved (\d+) slots \(([-\d ]+)\)'
             . ' from (\d+) to (\d+)$';
    my ($n, $ranges, $from, $to) = $out =~ /$re/;
    is($n, 10, "reshard moved 10 slots ($out)");
    my ($lo, $hi) = split /-/, (split / /, $ranges // '')[0] // '';
    $hi //= $lo;
    ok(defined $lo && $hi - $lo < 10, "first range moved: $lo-$hi");
    is(owner(23012, $c, $lo), $to, 'the cluster agrees on the new owner');
    my $km = key_in($lo, 'idem-moved:');
    is(cli($from, $c, 'SET', $km, 'x'), "MOVED $lo 127.0.0.1:$to",
       'MOVED after the reshard');
    is(cli($to, $c, 'SET', $km, 'x'), 'OK', 'the new owner takes it');
    is(cli($to, $c, 'GET', $k0), 'v0', 'slot 0 moved with its key')
        if $lo == 0;

    # ASK: slot of $k MIGRATING on its master
    $m = owner(23011, $c, $s);
    $out = topo('cluster-migrate-slot', $s);
    my ($src, $dst) = $out =~ /MIGRATING on (\d+), IMPORTING on (\d+)/;
    is($src, $m, "the slot migrates from its master ($out)");
    is(cli($src, $c, 'GET', $k), 'v1',
       'an existing key is served by the source');
    my $k2 = 'idem2:{abc}';
    is(cli($src, $c, 'SET', $k2, 'v2'), "ASK $s 127.0.0.1:$dst",
       'a new key: ASK to the target');
    is(cli($dst, $c, 'SET', $k2, 'v2'), "MOVED $s 127.0.0.1:$src",
       'the target without ASKING: MOVED back');
    is(cli($dst, { input => "ASKING\nSET $k2 v2\n" }), "OK\nOK",
       'ASKING then the command: accepted by the target');
    is(topo('cluster-finish-migration'), "cluster-finish-migration: slot $s"
       . " moved from $src to $dst with 1 keys",
       'the migration finishes, moving the key left');
    is(cli($dst, $c, 'GET', $k), 'v1', 'the key moved with the slot');
    is(cli($src, $c, 'GET', $k), "MOVED $s 127.0.0.1:$dst", 'source: MOVED');

    # graceful failover
    $m = $dst;
    $out = topo('cluster-failover', $m);
    my ($r) = $out =~ /^cluster-failover: (\d+) took over from $m/;
    ok($r, "a replica took over ($out)");
    is((split /\n/, cli($r, $c, 'ROLE'))[0], 'master', 'it is a master');
    is(cli($r, $c, 'GET', $k), 'v1', 'the data survived');
    is(cli($m, $c, 'GET', $k), "MOVED $s 127.0.0.1:$r",
       'the old master redirects to it');
    is(join(' ', (split /\n/, cli($m, $c, 'ROLE'))[0, 2]), "slave $r",
       'the old master replicates it');
    down('cluster');
}

# ---------------------------------------------------------------- TLS cluster
{
    up('cluster-tls');
    my %t = tls_for('cluster-tls');
    my $c = { tls => \%t };
    my $k = 'idem:{tls}';
    my $s = keyslot('tls');
    my $m = owner(23021, $c, $s);
    like($m, qr/^2302[1-6]$/, "TLS cluster: slot $s has a master ($m)");
    is(cli(23021, { %$c, cluster => 1 }, 'SET', $k, 'v'), 'OK',
       'TLS cluster: SET -c');
    my $other = $m == 23021 ? 23022 : 23021;
    is(cli($other, $c, 'GET', $k), "MOVED $s 127.0.0.1:$m",
       'TLS cluster: MOVED names the TLS port');
    isnt(cli($m, {}, 'PING'), 'PONG', 'TLS cluster: no plain port');
    is((split /\n/, cli($m, { %$c, input => "SET $k v\nWAIT 1 2000\n" }))[-1],
       1, 'TLS cluster: replication over TLS acknowledges');

    local $ENV{TOPO} = 'cluster-tls';
    my $out = topo('cluster-kill-master', $m);
    my ($r) = $out =~ /^cluster-kill-master: killed $m; (\d+) promoted/;
    ok($r, "TLS cluster: a replica was promoted ($out)");
    is(cli($r, $c, 'GET', $k), 'v', 'TLS cluster: the data survived');
    is(cli($other eq $r ? 23023 : $other, $c, 'GET', $k),
       "MOVED $s 127.0.0.1:$r", 'TLS cluster: MOVED to the new master');
    like(topo('cluster-restart', $m),
         qr/^cluster-restart: $m rejoined as a replica of $r$/,
         'TLS cluster: the killed master rejoins as a replica');
    down('cluster-tls');
}

# ---------------------------------------------------------------- Sentinel
{
    up('sentinel');
    my @sentinels = (23041, 23042, 23043);
    my $master = sub {
        join ' ', split /\n/, cli(shift, {}, 'SENTINEL',
                                  'get-master-addr-by-name', 'idem');
    };
    is($master->($_), '127.0.0.1 23031', "Sentinel $_ names the master")
        for @sentinels;
    is(cli(23031, {}, 'SET', 'idem:{s}', 'v'), 'OK', 'the master writes');
    my $out = topo('sentinel-failover');
    my ($old, $new) = $out =~ /moved from (\d+) to (\d+)/;
    is($old, 23031, "failover from the master ($out)");
    like($new, qr/^2303[23]$/, 'to a replica');
    is($master->($_), "127.0.0.1 $new", "Sentinel $_ names the new master")
        for @sentinels;
    is((split /\n/, cli($new, {}, 'ROLE'))[0], 'master', 'it is a master');
    is(cli($new, {}, 'GET', 'idem:{s}'), 'v', 'the data survived');
    like(cli(23031, {}, 'SET', 'idem:{s}', 'x'), qr/^READONLY/,
         'the old master answers READONLY');

    is((split /\n/, cli($new, { input => "SET idem:{s} v2\nWAIT 2 2000\n" }))
       [-1], 2, 'both replicas have the write');
    $out = topo('sentinel-kill-master');
    my ($next) = $out =~ /^sentinel-kill-master: killed $new; .* to (\d+) /;
    ok($next && $next != $new, "kill -9: another master ($out)");
    is($master->($_), "127.0.0.1 $next", "Sentinel $_ names it")
        for @sentinels;
    is(cli($next, {}, 'GET', 'idem:{s}'), 'v2', 'the data survived');
    down('sentinel');
}

my $took = time - $t0;
note sprintf 'all topologies in %.1f s', $took;
done_testing;
