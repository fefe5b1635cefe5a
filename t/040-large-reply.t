# Large replies read in place: a bulk string of 16 KB or more at the start
# of a reply is received straight into a buffer of its own, which the
# replay then sends; smaller replies and everything else go through
# hiredis's reader.  Each replay must be byte-exact whichever path it took
# and wherever the bytes were split:
# - records just under, at and over the threshold, 300 KB and 1 MB
# - 48 replays of small and large records at once on one worker: their
#   replies share one connection, back to back
# - the same through a proxy that hands Redis's bytes over in pieces of 1
#   to 7 bytes (records around the threshold) and of up to 20 KB (all):
#   headers, lengths and CRLFs split
# - large stores (300 KB, 8 MB) into a proxy that reads 64 KB every 5 ms:
#   the socket takes part of the 8 MB command (more than its buffer can
#   hold), the rest is queued; the record is whole
# - a connection cut in the middle of a large reply: the claim goes again
#   on the next connection, the replay is exact (or a 503, never a wrong
#   body), nothing hangs, no worker dies, and the next replay is exact
# Plain Test::More: its own nginx (one worker) and proxy (ports
# LARGE_TEST_PORT, default 20600-20603) against the test Redis.
use strict;
use warnings;
use lib 't/lib';
use Test::More;
use Fleet;
use TrickleProxy;
use Time::HiRes qw(sleep);

plan skip_all => 'TEST_NGINX_LOAD_MODULES must name the module'
    unless have_module();

my $rp = $ENV{TEST_NGINX_REDIS_PORT} || 6379;
my $slow = $ENV{TEST_ASAN} ? 4 : 1;
my $base = $ENV{LARGE_TEST_PORT} || 20600;
my ($port, $proxy_port, $split_port, $be_port) = map { $base + $_ } 0 .. 3;

my $root = fleet_root('large');
my $proxy_pid = trickle_proxy($proxy_port, $rp, "$root/mode");

# bodies around the 16 KB threshold (the record adds its head, about 150
# bytes: 16100 is stored under it, 16300 over it), and larger ones; every
# byte value in a pattern that shows any shift
my %body;
mkdir "$root/www";
for my $n (10, 16100, 16234, 16300, 40000, 300 * 1024, 1024 * 1024,
           8 * 1024 * 1024)
{
    # byte i is chr((7i + n) % 251): a period of 251
    my $pat = join '', map { chr(($_ * 7 + $n) % 251) } 0 .. 250;
    my $b = substr($pat x (int($n / 251) + 1), 0, $n);
    $body{$n} = $b;
    open my $fh, '>', "$root/www/b$n" or die $!;
    binmode $fh;
    print $fh $b;
    close $fh;
}
# 8 MB is for the slow socket only (more than a socket buffer holds)
my @sizes = sort { $a <=> $b } grep { $_ < 8 * 1024 * 1024 } keys %body;

my $dir = nginx_conf('large', <<"EOC", 1);
    log_format backend '\$http_idempotency_key';
    idempotency_store_max_size 16m;
    server {
        listen 127.0.0.1:$port;
        idempotency_redis 127.0.0.1:$rp;
@{[ get_front($be_port) ]}
    }
    server {
        listen 127.0.0.1:$split_port;
        idempotency_redis 127.0.0.1:$proxy_port;
        idempotency_redis_timeout 5s;
@{[ get_front($be_port) ]}
    }
    server {
        listen 127.0.0.1:$be_port;
        access_log $root/large/logs/backend.log backend;
        location / { root $root/www; }
    }
EOC

END {
    nginx_stop($dir) if $dir;
    kill 'KILL', $proxy_pid if $proxy_pid;
}

redis_cli('FLUSHALL');
nginx_start($dir);
sleep 0.5 * $slow;

sub runs { upstream_runs($dir)->{$_[0]} // 0 }

# the record's size in Redis, to show which side of the threshold it is
sub record_len {
    my ($len) = sort { $b <=> $a }
                map { redis_cli('STRLEN', $_) } split /\n/, redis_cli('--scan');
    return $len;
}

# 1. alone: each size stored, then replayed byte-exact
for my $n (@sizes) {
    redis_cli('FLUSHALL');
    my $r = http_post($port, "one-$n", 'x', "/b$n");
    is(idem_status($r), '200 new', "$n bytes: stored");
    sleep 0.2;
    my $len = record_len();
    $r = http_post($port, "one-$n", 'x', "/b$n");
    is(idem_status($r), '200 replay', "$n bytes: a record of $len replays");
    ok($r->{body} eq $body{$n}, "$n bytes: byte-exact")
        or diag length $r->{body};
}
cmp_ok(record_len(), '>', 16384, "the largest record is over the threshold");

# the keys the rest replays: one per size
redis_cli('FLUSHALL');
for my $n (@sizes) {
    my $r = http_post($port, "k$n", 'x', "/b$n");
    is(idem_status($r), '200 new', "k$n stored");
}
sleep 0.3;

# 48 replays at once, small and large mixed, on one worker's connection
sub burst {
    my ($p, $what) = @_;
    my @reqs = map { my $n = $sizes[$_ % @sizes]; [$p, "k$n", 'x', "/b$n"] }
               0 .. 47;
    my $res = http_burst(\@reqs, 30 * $slow);
    my ($exact, $replay) = (0, 0);
    for my $i (0 .. $#reqs) {
        my $n = $sizes[$i % @sizes];
        $replay++ if idem_status($res->[$i]) eq '200 replay';
        $exact++ if $res->[$i]{body} eq $body{$n};
    }
    is($replay, 48, "$what: 48 replays");
    is($exact, 48, "$what: every body byte-exact");
}

burst($port, "at once");

# 2. through the proxy, Redis's bytes in pieces (of up to 7 bytes only
# around the threshold: they go slowly)
for my $piece (7, 20000) {
    trickle('split', $piece);
    for my $n (grep { $piece > 7 || $_ <= 16300 } @sizes) {
        my $r = http_post($split_port, "k$n", 'x', "/b$n", '', 30 * $slow);
        ok(idem_status($r) eq '200 replay' && $r->{body} eq $body{$n},
           "pieces of up to $piece bytes: $n bytes replay byte-exact")
            or diag idem_status($r) . ' ' . length $r->{body};
    }
    burst($split_port, "pieces of up to $piece bytes, at once") if $piece > 7;
}
trickle('pass');

# 3. large stores into a socket that takes them slowly: nginx writes what
# it can (8 MB is more than a socket buffer holds), queues the rest, and
# the record is whole
trickle('slow', 65536);
for my $n (300 * 1024, 8 * 1024 * 1024) {
    my $r = http_post($split_port, "slow-$n", 'x', "/b$n", '', 30 * $slow);
    is(idem_status($r), '200 new', "a slow socket: $n bytes stored");
}
trickle('pass');
sleep 0.5 * $slow;
for my $n (300 * 1024, 8 * 1024 * 1024) {
    my $r = http_post($port, "slow-$n", 'x', "/b$n", '', 30 * $slow);
    ok(idem_status($r) eq '200 replay' && $r->{body} eq $body{$n},
       "a slow socket: the $n-byte record replays byte-exact")
        or diag idem_status($r) . ' ' . length $r->{body};
}

# 4. a connection cut in the middle of a large reply
for my $at (5, 30000, 200 * 1024) {
    my $n = 300 * 1024;
    trickle('cut', $at);
    my $r = http_post($split_port, "k$n", 'x', "/b$n", '', 20 * $slow);
    my $st = idem_status($r);
    ok($st eq '503 error' || ($st eq '200 replay' && $r->{body} eq $body{$n}),
       "cut after $at bytes: an exact replay or a 503 ($st)")
        or diag length $r->{body};
    cmp_ok($r->{took}, '<', 10, "cut after $at bytes: no hang");
    trickle('pass');
    sleep 0.3 * $slow;
    $r = http_post($split_port, "k$n", 'x', "/b$n", '', 20 * $slow);
    ok(idem_status($r) eq '200 replay' && $r->{body} eq $body{$n},
       "cut after $at bytes: the next replay is exact");
}

# nothing ran twice, nothing crashed, no reply misread
is(runs("k$_"), 1, "k$_ ran once") for @sizes;
is(scalar(grep { /invalid reply/ } lines_of("$dir/logs/error.log")), 0,
   "no reply was misread");
is_deeply([log_problems("$dir/logs/error.log")], [], "no crash or alert");

done_testing();
