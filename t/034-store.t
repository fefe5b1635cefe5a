# The store path: the finish script goes by EVALSHA (loaded in the
# handshake), by EVAL once after a NOSCRIPT; a large record is staged by a
# native SET and moved in place by RENAME, never copied through Lua; a
# store or release whose connection breaks is sent again on the next one.
# - a store is an EVALSHA: no EVAL, no Lua copy of the record
# - SCRIPT FLUSH between the claim and the store: NOSCRIPT, then EVAL; the
#   record replays byte-exact, the upstream ran once; the next store is an
#   EVALSHA again (EVAL cached the script)
# - a 300 KB response: SET of a staging key, RENAME; byte-exact replay; no
#   staging key left
# - a store cut before or after Redis ran it (CutProxy), small and large:
#   sent again, the record is there, nothing logged as lost; a release cut
#   after it ran is sent again and is no lost claim
# - a user with the ACL rules of docs/operations.md stores both forms
# - a store too late (the key was taken meanwhile): the existing error,
#   the other record untouched, no staging key left
# Where the server takes the native path by default (Valkey 9, Redis 8.4:
# t/053) the same file checks the native store instead: one SET IFEQ, no
# script, nothing staged, no NOSCRIPT to meet; the cuts are of the SET
# IFEQ and of the DELIFEQ or DELEX.
# Plain Test::More: its own nginx and proxy (ports STORE_TEST_PORT, default
# 20130-20139) against the test Redis.
use strict;
use warnings;
use lib 't/lib';
use Test::More;
use Fleet;
use CutProxy;
use IO::Socket::INET;
use Time::HiRes qw(sleep);

plan skip_all => 'TEST_NGINX_LOAD_MODULES must name the module'
    unless have_module();
plan skip_all => 'the echo module is needed'
    unless grep { /echo/ } split /\s+/, ($ENV{TEST_NGINX_LOAD_MODULES} || '');

my $rp = $ENV{TEST_NGINX_REDIS_PORT} || 6379;
my $native = server_caps()->{native};
my $finish_cmds = $native ? 'IFEQ' : 'EVAL|EVALSHA';
my $slow = $ENV{TEST_ASAN} ? 4 : 1;
my $base = $ENV{STORE_TEST_PORT} || 20130;
my ($port, $proxy_port, $cut_port, $be_port, $acl_port) =
    map { $base + $_ } 0 .. 4;

my $root = fleet_root('store');
my $proxy_pid = cut_proxy($proxy_port, $rp, "$root/cuts.log");

# 300 KB, every byte value, in a pattern that shows any shift
my $big = join '', map { chr($_ % 251) } 0 .. 300 * 1024 - 1;
mkdir "$root/www";
open my $fh, '>', "$root/www/big" or die $!;
binmode $fh;
print $fh $big;
close $fh;

my $front = <<"EOC";
        idempotency_store_max_size 1m;
@{[ get_front($be_port) ]}
EOC

my $dir = nginx_conf('store', <<"EOC", 1);
    log_format backend '\$http_idempotency_key';
    server {
        listen 127.0.0.1:$port;
        idempotency_redis 127.0.0.1:$rp;
$front
    }
    server {
        listen 127.0.0.1:$cut_port;
        idempotency_redis 127.0.0.1:$proxy_port;
        idempotency_redis_timeout 1s;
$front
    }
    server {
        listen 127.0.0.1:$acl_port;
        idempotency_redis 127.0.0.1:$rp user=store-acl password=store-pw;
        idempotency_lock_ttl 1s;
        idempotency_redis_timeout 300ms;
$front
    }
    server {
        listen 127.0.0.1:$be_port;
        access_log $root/store/logs/backend.log backend;
        location = /small { return 201 "ok\\n"; }
        location = /fail { return 503 "no\\n"; }
        location = /big { root $root/www; }
        location = /slow { echo_sleep 0.5; echo "slow"; }
        location = /slower { echo_sleep 2.5; echo "slower"; }
        location = /slowbig { echo_sleep 0.5; echo_duplicate 307200 "x"; }
    }
EOC

END {
    nginx_stop($dir) if $dir;
    kill 'KILL', $proxy_pid if $proxy_pid;
}

redis_cli('FLUSHALL');
# the ACL rules of docs/operations.md, nothing more
redis_cli(qw(ACL SETUSER store-acl reset on >store-pw ~idem:* +get +set +del
             +eval +evalsha +script|load +getrange +setrange +exists +rename
             +pexpire +client|setname));
nginx_start($dir);
sleep 0.5 * $slow;

sub runs { upstream_runs($dir)->{$_[0]} // 0 }

# calls of a command since the last reset, from INFO commandstats
sub calls {
    my $cmd = shift;
    my ($n) = redis_cli('INFO', 'commandstats')
              =~ /^cmdstat_$cmd:calls=(\d+)/m;
    return $n // 0;
}

sub errorstat {
    my $e = shift;
    my ($n) = redis_cli('INFO', 'errorstats') =~ /^errorstat_$e:count=(\d+)/m;
    return $n // 0;
}

sub staged_keys {
    return grep { /:s:/ } split /\n/, redis_cli('--scan');
}

sub error_lines {
    my $re = shift;
    return scalar grep { /$re/ } lines_of("$dir/logs/error.log");
}

# a request sent now, its answer read later
sub post_start {
    my ($p, $key, $path) = @_;
    my $s = IO::Socket::INET->new(PeerAddr => "127.0.0.1:$p") or die $!;
    print $s Fleet::_request($key, 'x', $path);
    return $s;
}

sub post_finish {
    my $s = shift;
    local $/;
    my $res = <$s>;
    return Fleet::_parse($res // '');
}

# 1. a store is an EVALSHA, not an EVAL
redis_cli('CONFIG', 'RESETSTAT');
my $r = http_post($port, 'sha-1', 'x', '/small');
is(idem_status($r), '201 new', "a fresh request");
sleep 0.2;
if ($native) {
    is(calls('evalsha') . ' ' . calls('set'), '0 2',
       "its store is one SET IFEQ (after the claim's SET), no EVALSHA");
} else {
    is(calls('evalsha'), 1, "its store is one EVALSHA");
}
is(calls('eval'), 0, "no EVAL");
$r = http_post($port, 'sha-1', 'x', '/small');
is(idem_status($r) . " $r->{body}", "201 replay ok\n", "the record replays");

# 2. SCRIPT FLUSH between the claim and the store
redis_cli('CONFIG', 'RESETSTAT');
my $s = post_start($port, 'flush-1', '/slow');
sleep 0.25;
is(redis_cli('SCRIPT', 'FLUSH'), 'OK', "the scripts are flushed");
$r = post_finish($s);
is(idem_status($r), '200 new', "the request ran");
sleep 0.2;
is(errorstat('NOSCRIPT'), $native ? 0 : 1,
   $native ? "the native store met no NOSCRIPT"
           : "the store by EVALSHA met a NOSCRIPT");
is(calls('eval'), $native ? 0 : 1,
   $native ? "and needed no EVAL" : "and went again by EVAL");
$r = http_post($port, 'flush-1', 'x', '/slow');
is(idem_status($r) . " $r->{body}", "200 replay slow\n",
   "the record is stored and replays byte-exact");
is(runs('flush-1'), 1, "the upstream ran once");
is(error_lines(qr/flush-1|claim was lost|refused to store/), 0,
   "nothing logged as lost");
$r = http_post($port, 'flush-2', 'x', '/small');
sleep 0.2;
is(calls('eval') . ' ' . errorstat('NOSCRIPT'), $native ? '0 0' : '1 1',
   "the next store is an EVALSHA again: EVAL cached the script"
   . ($native ? ' (native: no script at all)' : ''));

# 3. a large record is stored natively: SET of a staging key, RENAME
redis_cli('CONFIG', 'RESETSTAT');
$r = http_post($port, 'big-1', 'x', '/big');
is(idem_status($r), '200 new', "a 300 KB response");
ok($r->{body} eq $big, "sent whole");
sleep 0.2;
is(calls('set'), 2, $native ? "two SETs: the claim and the record (IFEQ)"
                             : "two SETs: the claim and the staged record");
is(calls('rename'), $native ? 0 : 1,
   $native ? "nothing staged, nothing renamed"
           : "one RENAME moved it in place");
is(calls('eval'), 0, "no EVAL");
is_deeply([staged_keys()], [], "no staging key left");
$r = http_post($port, 'big-1', 'x', '/big');
is(idem_status($r), '200 replay', "the record replays");
ok($r->{body} eq $big, "byte-exact") or diag length $r->{body};
is(runs('big-1'), 1, "the upstream ran once");
my ($rec) = grep { redis_cli('STRLEN', $_) > 300 * 1024 }
            split /\n/, redis_cli('--scan');
cmp_ok(redis_cli('PTTL', $rec // 'none'), '>', 3600 * 1000,
       "the record has the record's ttl, not the staging key's");

# 4. stores cut before or after Redis ran them are sent again
for my $case (['before', '/small', "ok\n"], ['after', '/small', "ok\n"],
              ['before', '/big', $big], ['after', '/big', $big])
{
    my ($mode, $path, $body) = @$case;
    my $key = "cut-$mode$path";
    $key =~ s{/}{-}g;
    cut($mode, 1, $finish_cmds);
    $r = http_post($cut_port, $key, 'x', $path, undef, 5);
    like(idem_status($r), qr/^20[01] new$/, "$key: the request ran");
    sleep 0.5 * $slow;    # the reconnect and the store sent again
    $r = http_post($cut_port, $key, 'x', $path, undef, 5);
    like(idem_status($r), qr/^20[01] replay$/, "$key: the record is stored");
    ok($r->{body} eq $body, "$key: byte-exact");
    is(runs($key), 1, "$key: the upstream ran once");
    is(error_lines(qr/went away before the record was stored/), 0,
       "$key: no store lost");
    is_deeply([staged_keys()], [], "$key: no staging key left");
}

# a release cut after Redis ran it: sent again, it finds the key free,
# which is no lost claim
cut('after', 1, $native ? 'DELIFEQ|DELEX' : 'EVAL|EVALSHA');
$r = http_post($cut_port, 'cut-release', 'x', '/fail', undef, 5);
is($r->{status}, 503, "cut-release: a 503 is released");
sleep 0.5 * $slow;
is(error_lines(qr/claim was lost|went away before the record was released/),
   0, "cut-release: the release sent again is no lost claim");
$r = http_post($cut_port, 'cut-release', 'x', '/fail', undef, 5);
is(idem_status($r), '503 new', "cut-release: the key is free");

# 5. the documented ACL rules are enough for both forms of the store
for my $case (['/small', "ok\n"], ['/big', $big]) {
    my ($path, $body) = @$case;
    my $key = "acl$path";
    http_post($acl_port, $key, 'x', $path);
    sleep 0.2;
    $r = http_post($acl_port, $key, 'x', $path);
    like(idem_status($r), qr/^20[01] replay$/, "$key: stored as store-acl");
    ok($r->{body} eq $body, "$key: byte-exact");
}

# ...and for the renewal of a lease: a duplicate after the lock's time
# still meets a live claim (a renewal refused would have let it expire)
{
    my $s = post_start($acl_port, 'acl-lease', '/slower');
    sleep 1.6;      # past the lock (1s) and its margin (a third): renewed?
    $r = http_post($acl_port, 'acl-lease', 'x', '/slower');
    is(idem_status($r), '409 conflict', "acl-lease: renewed as store-acl");
    is(idem_status(post_finish($s)), '200 new', "acl-lease: the original");
}
is(error_lines(qr/NOPERM|refused|not renewed/), 0, "nothing refused");

# 6. too late: the key was taken while the upstream ran
redis_cli('CONFIG', 'RESETSTAT');
my %before = map { $_ => 1 } split /\n/, redis_cli('--scan');
$s = post_start($port, 'late-1', '/slowbig');
sleep 0.25;
my @keys = grep { !$before{$_} } split /\n/, redis_cli('--scan');
is(scalar @keys, 1, "one new key: the claim");
my $claimed = $keys[0];
redis_cli('SET', $claimed, 'another') if $claimed;
$r = post_finish($s);
is(idem_status($r), '200 new', "the request ran");
sleep 0.3;
is(calls('set'), 3, "the record was staged (claim, our SET, the test's)");
is(redis_cli('GET', $claimed // 'none'), 'another', "the other record stays");
is_deeply([staged_keys()], [], "no staging key left");
is(error_lines(qr/claim was lost before the record was stored/), 1,
   "the lost claim is logged");

is(scalar log_problems("$dir/logs/error.log"), 0, "no crash or alert");

done_testing();
