# The store path of t/034-store.t on Redis Cluster: both forms of the store (the
# finish script alone; a staged SET and the script that RENAMEs it) reach
# the master of the record's slot, follow MOVED, and fall back to EVAL
# after a NOSCRIPT.  The moves happen while the upstream is held by the
# test (t/lib/Held.pm), so the store always comes after them, however
# long a migration takes on a busy machine.
# - a 300 KB record: its staging key shares the record's slot (no
#   CROSSSLOT), RENAME on the master, byte-exact replay, no staging key
# - SCRIPT FLUSH on every master: small and large stores still land
# - the slot moved while the upstream runs: the staged SET and the finish
#   both get MOVED and are sent to the new owner; the record replays,
#   nothing logged as lost
# Where the server takes the native path by default (Valkey 9, Redis 8.4:
# t/053) a store is one SET IFEQ of one key: nothing staged or renamed, no
# script to flush, and a store during an open migration lands on the
# source that holds the claim, without TRYAGAIN; this file checks that.
# Plain Test::More: util/topology.sh cluster on TOPO_BASE (default 24000:
# nodes +11..+16), nginx on TOPO_BASE+310 and +311, the held upstream on
# +312.
# topology: yes (make test-topologies runs this file)
use strict;
use warnings;
use lib 't/lib';
use Test::More;
use Fleet;
use TopoTest;
use Held;
use Digest::SHA qw(sha256_hex);
use IO::Socket::INET;
use Time::HiRes qw(sleep);

plan skip_all => 'TEST_NGINX_LOAD_MODULES must name the module'
    unless have_module();
plan skip_all => 'the echo module is needed'
    unless grep { /echo/ } split /\s+/, ($ENV{TEST_NGINX_LOAD_MODULES} || '');
plan skip_all => "$ENV{REDIS_SERVER} is needed" unless `which $ENV{REDIS_SERVER}`;

my $base = $ENV{TOPO_BASE} || 24000;
$ENV{TOPO_BASE} = $base;
$ENV{TOPO_DIR} ||= "/tmp/ngx-idempotency-topo-cluster-$base";
my $topo = 'util/topology.sh';
my $seed = $base + 11;
my ($port, $be_port, $held_port) = ($base + 310, $base + 311, $base + 312);

my $native = server_caps()->{native};

my $up;
END {
    local $?;
    system("$topo down cluster $ENV{TOPO_DIR} >/dev/null 2>&1") if $up;
}
$SIG{$_} = sub { $SIG{PIPE} = 'IGNORE'; exit 1 } for qw(INT TERM HUP PIPE);

$up = 1;
topo('up', 'cluster', $ENV{TOPO_DIR});
BAIL_OUT('no cluster') if $?;

sub cli { my $p = shift; redis_cli_at($p, @_) }

sub masters {
    my $out = cli($seed, 'CLUSTER', 'NODES');
    return sort map { /:(\d+)@/ ? $1 : () }
           grep { /\bmaster\b/ && !/\bfail/ } split /\n/, $out;
}

# a stat summed over the masters
sub stat_of {
    my ($section, $re) = @_;
    my $n = 0;
    for my $p (masters()) {
        $n += $1 if cli($p, 'INFO', $section) =~ $re;
    }
    return $n;
}
sub calls { stat_of('commandstats', qr/^cmdstat_$_[0]:calls=(\d+)/m) }
sub errors { stat_of('errorstats', qr/^errorstat_$_[0]:count=(\d+)/m) }

sub staged_keys {
    return map { grep { /:s:/ } split /\n/, cli($_, '--scan') } masters();
}

sub slot_of { cli($seed, 'CLUSTER', 'KEYSLOT', sha256_hex("\0" . shift)) }

# the length of the value of a key's record (its claim or its record)
# where it lives, 0 if nowhere yet; asks only the masters holding keys of
# its slot, so that it causes no MOVED of its own
sub record_len {
    my $key = shift;
    my $slot = slot_of($key);
    my $rkey = 'idem:{' . sha256_hex("\0$key") . '}';
    for my $p (masters()) {
        next unless cli($p, 'CLUSTER', 'COUNTKEYSINSLOT', $slot) > 0;
        next unless cli($p, 'EXISTS', $rkey) eq '1';
        return cli($p, 'STRLEN', $rkey);
    }
    return 0;
}

# stored(key, size): the record is there, at least size bytes; a store is
# sent after the response left, so it is waited for (with room for a busy
# machine), not slept for
sub stored {
    my ($key, $size) = @_;
    return wait_until(60, sub { record_len($key) >= $size });
}

my $root = fleet_root('store-cluster');
my $big = join '', map { chr($_ % 251) } 0 .. 300 * 1024 - 1;
mkdir "$root/www";
open my $fh, '>', "$root/www/big" or die $!;
binmode $fh;
print $fh $big;
close $fh;

my $dir = nginx_conf('sc', <<"EOC", 1);
    log_format backend '\$http_idempotency_key';
    server {
        listen 127.0.0.1:$port;
        idempotency_redis 127.0.0.1:$seed cluster;
        idempotency_redis_timeout 3s;
        idempotency_store_max_size 1m;
@{[ get_front($be_port) ]}
    }
    server {
        listen 127.0.0.1:$be_port;
        access_log $root/sc/logs/backend.log backend;
        location = /small { return 201 "ok\\n"; }
        location = /big { root $root/www; }
        location = /held { proxy_pass http://127.0.0.1:$held_port; }
    }
EOC
nginx_start($dir);
my $held = Held->new($held_port);

# until the worker learnt the map
my $warm = 0;
wait_until(60, sub {
    http_post($port, 'warm-' . ++$warm, 'x', '/small')->{status} == 201
});

sub runs { upstream_runs($dir)->{$_[0]} // 0 }
sub lost {
    scalar grep { /claim was lost|went away before|refused to (store|stage)/ }
           lines_of("$dir/logs/error.log");
}

# replays(key, path, body): the record is there, byte-exact, run once
sub replays {
    my ($key, $path, $body) = @_;
    my $r = http_post($port, $key, 'x', $path);
    like(idem_status($r), qr/^20[01] replay$/, "$key: replays");
    ok($r->{body} eq $body, "$key: byte-exact") or diag length $r->{body};
    is(runs($key), 1, "$key: the upstream ran once");
}

# 1. a large record is staged on the record's slot and moved by RENAME
cli($_, 'CONFIG', 'RESETSTAT') for masters();
my $r = http_post($port, 'cbig-1', 'x', '/big');
is(idem_status($r), '200 new', "a 300 KB response");
ok(stored('cbig-1', 300 * 1024), "...stored");
is(calls('rename'), $native ? 0 : 1,
   $native ? "native: nothing staged, no RENAME"
           : "one RENAME on the record's master");
is(errors('CROSSSLOT'), 0, "the staging key shares the record's slot");
is_deeply([staged_keys()], [], "no staging key left");
replays('cbig-1', '/big', $big);

# 2. SCRIPT FLUSH on every master: NOSCRIPT, then EVAL
cli($_, 'CONFIG', 'RESETSTAT') for masters();
cli($_, 'SCRIPT', 'FLUSH') for masters();
is(idem_status(http_post($port, 'cflush-small', 'x', '/small')), '201 new',
   "after SCRIPT FLUSH: a small store");
is(idem_status(http_post($port, 'cflush-big', 'x', '/big')), '200 new',
   "and a large one");
ok(stored('cflush-small', 100) && stored('cflush-big', 300 * 1024),
   "...both stored");
if ($native) {
    is(errors('NOSCRIPT') . ' ' . calls('eval'), '0 0',
       "native: no script to miss, no EVAL");
} else {
    cmp_ok(errors('NOSCRIPT'), '>=', 1, "NOSCRIPT was met");
    cmp_ok(calls('eval'), '>=', 1, "and EVAL sent");
}
replays('cflush-small', '/small', "ok\n");
replays('cflush-big', '/big', $big);

# send_held(key) -> the client's socket, once the request reached the held
# upstream: its key is claimed, its store not sent yet
my $held_body = 'x' x 307200;
sub send_held {
    my $key = shift;
    my $s = IO::Socket::INET->new(PeerAddr => "127.0.0.1:$port") or die $!;
    print $s Fleet::_request($key, 'x', '/held');
    my $c = $held->take;
    ok($c, "$key: the upstream holds the request") or return;
    return ($s, $c);
}

# the response to the client's socket, to its end
sub response_of {
    my $s = shift;
    local $/;
    return Fleet::_parse(<$s> // '');
}

# 3. the slot moves while the upstream runs: the staged SET and the finish,
# pipelined together to the old owner, both meet MOVED and go to the new
# one (the finish alone follows MOVED in t/031's resharding).  The worker
# refreshes its map every 60 s: if that refresh falls between the move and
# the store, the store goes straight to the new owner and meets no MOVED;
# the move is then done again with another key (a second refresh is a
# minute away)
my ($key, $moved);
for my $try (1 .. 3) {
    $key = "cmove-big-$try";
    cli($_, 'CONFIG', 'RESETSTAT') for masters();
    my ($s, $c) = send_held($key) or last;
    topo('cluster-migrate-slot', slot_of($key));
    topo('cluster-finish-migration');
    $held->answer($c, $held_body);
    is(idem_status(response_of($s)), '200 new', "a request across the move");
    ok(stored($key, 300 * 1024), "...stored on the new owner");
    # both meet MOVED when they reach the old owner together; the first
    # MOVED may have refreshed the map before the second was sent
    last if ($moved = errors('MOVED')) >= 1;
    note "$key: no MOVED: the map was refreshed in between; again";
}
cmp_ok($moved, '>=', 1, "the staged SET and the finish followed MOVED");
is(calls('rename'), $native ? 0 : 1,
   $native ? "native: no RENAME"
           : "the record was moved in place on the new owner");
is_deeply([staged_keys()], [], "no staging key left");
replays($key, '/held', $held_body);

# 4. a migration that stays open longer than idempotency_redis_timeout
# while a large store is in flight: the claim stays on the source, the
# staged copy goes to the target (ASK), and the finish meets TRYAGAIN
# until the slot has moved; it is sent again until then (the lease lasts
# 2m), and the record replays instead of the key reading as unknown.  The
# migration is opened while the upstream is held, and finished only once
# the finish met TRYAGAIN past the timeout and was kept to be sent again
$key = 'cslow-move-big';
cli($_, 'CONFIG', 'RESETSTAT') for masters();
{
    my ($s, $c) = send_held($key);
    topo('cluster-migrate-slot', slot_of($key));
    $held->answer($c, $held_body) if $c;
    is(idem_status(response_of($s)), '200 new',
       "a large response while its slot migrates");
}
my $kept = sub {
    scalar grep { /did not acknowledge the record/ }
           lines_of("$dir/logs/error.log");
};
if ($native) {
    ok(stored($key, 300 * 1024), "native: stored on the source at once");
    is(errors('TRYAGAIN'), 0, "native: one key, served by its source");
} else {
    # idempotency_redis_timeout (3s), then the store layer keeps it
    ok(wait_until(60, sub { errors('TRYAGAIN') >= 1 && $kept->() }),
       "the finish met TRYAGAIN past the timeout");
    cmp_ok(errors('TRYAGAIN'), '>=', 1, "the finish met TRYAGAIN");
}
topo('cluster-finish-migration');
my $ok = wait_until(60, sub {
    idem_status(http_post($port, $key, 'x', '/held')) eq '200 replay'
});
ok($ok, "the store landed once the slot had moved: a replay");
is(runs($key), 1, "$key: the upstream ran once");
ok($native || $kept->(),
   $native ? "...native: stored at once"
           : "...the store was kept and sent again");

is(lost(), 0, "no store lost or refused");
is(scalar log_problems("$dir/logs/error.log"), 0, "no crash or alert");

done_testing();
