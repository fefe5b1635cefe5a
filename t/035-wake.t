# idempotency_wait with wake-ups: the finish script publishes on the
# record key's channel (SPUBLISH) when it stores or releases a record, and
# a worker's subscriber connection wakes the duplicates waiting for that
# key, which claim again at once instead of polling at 10..200 ms.
# Plain Test::More: its own nginx (2 workers, reuseport) on port 20220.
use strict;
use warnings;
use lib 't/lib';
use Test::More;
use Fleet;
use Wake;
use Time::HiRes qw(sleep time);

plan skip_all => 'TEST_NGINX_LOAD_MODULES must name the module'
    unless have_module();

my $rp = $ENV{TEST_NGINX_REDIS_PORT} || 6379;
my $slow = $ENV{TEST_ASAN} ? 4 : 1;
my ($port, $port2) = (20220, 20221);
my $workers = 2;

plan skip_all => 'needs Redis 7 (SPUBLISH, SSUBSCRIBE)'
    unless (redis_cli('INFO', 'server') =~ /redis_version:(\d+)/)[0] >= 7;

my $root = fleet_root('wake');
redis_cli(qw(ACL SETUSER wake_nosub reset on >pw ~* &* +@all -ssubscribe
             -spublish));
END { redis_cli(qw(ACL DELUSER wake_nosub)) }
$Wake::port = $port;

my $dir = nginx_conf('wake', wake_server($port, "$root/wake", "127.0.0.1:$rp",
                                         <<"EOC") . <<"EOC", $workers);
        # a user that may neither SSUBSCRIBE nor SPUBLISH: polling
        location = /pay-acl {
            idempotency on;
            idempotency_wait 5s;
            idempotency_redis 127.0.0.1:$rp user=wake_nosub password=pw;
            add_header X-Idem \$idempotency_status always;
            proxy_pass http://127.0.0.1:$port/backend;
        }
        location = /backend-long {
            access_log $root/wake/logs/backend.log backend;
            echo_sleep 1;
            echo "ok \$request_id";
        }
        location = /backend-fail {
            access_log $root/wake/logs/backend.log backend;
            echo_sleep 0.3;
            echo_status 503;
            echo "failed";
        }
EOC
    server {
        # the same /pay, a wait shorter than the original
        listen 127.0.0.1:$port2;
        idempotency_redis 127.0.0.1:$rp;
        location = /pay {
            idempotency on;
            idempotency_wait 100ms;
            proxy_pass http://127.0.0.1:$port/backend;
        }
    }
EOC

nginx_start($dir);
sleep 0.5 * $slow;

sub runs {
    my ($key, $uri) = @_;
    return upstream_runs($dir)->{"$key $uri"} // 0;
}

sub stats { commandstats($rp) }

my $dups = 8;
my @at = map { 0.08 + 0.005 * $_ } 0 .. $dups - 1;

# 1. duplicates waiting for a slow original are replayed within a few ms
# of its response (polling answered them up to ~150 ms late); the
# upstream runs once; while it waits, a duplicate costs its claim after the
# message, and the waiters of a key in a worker share one check after the
# subscription: 1 + 1/8 claims each here (2 when each checked alone)
my (@lat, $bad, $before, $first);
my $start = stats();
for my $i (0 .. 5) {
    # round 0 connects the subscribers: its waiters poll until then
    $before = stats() if $i == 1;
    my ($orig, @d) = round("wake-$i", undef, \@at);
    is("$orig->{status} $orig->{idem}", '200 new', "round $i: the original");
    $bad += grep { "$_->{status} $_->{idem}" ne '200 replay'
                   || $_->{body} ne $orig->{body} } @d;
    push @lat, map { $_->{done} - $orig->{done} } @d if $i;
    is(runs("wake-$i", '/backend'), 1, "round $i: the upstream ran once");
    $first = stats()->{set} - ($start->{set} // 0) - 2 - $dups if $i == 0;
}
my $after = stats();
is($bad, 0, "every duplicate got the original's response replayed");

my $max = (sort { $b <=> $a } @lat)[0];
cmp_ok($max, '<', 0.05 * $slow,
       "every duplicate answered < 50 ms after the original");
diag(sprintf "completion to replay: p50 %.1f ms, p99 %.1f ms, max %.1f ms "
             . "(%d duplicates)", pct(0.5, @lat), pct(0.99, @lat),
             $max * 1000, scalar @lat);

# SET NX GET is the claim: 1 by the original and 1 by each duplicate
# before the wait; the finish script's SET (one per EVALSHA, or EVAL
# after a NOSCRIPT) counts as a SET
my $n = 5 * $dups;
my %d = map { $_ => ($after->{$_} // 0) - ($before->{$_} // 0) }
        qw(set ssubscribe sunsubscribe eval evalsha);
my $waiting = $d{set} - $d{eval} - $d{evalsha} - 5 - $n;
cmp_ok($waiting, '<=', 1.5 * $n,
       "at most 1.5 claims per duplicate while it waits (one check a key)")
    or diag explain \%d;
cmp_ok($d{ssubscribe}, '<=', 5 * $workers,
       "one SSUBSCRIBE per key per worker");
diag(sprintf "per waiting duplicate: %.2f claims while waiting (%.2f in "
             . "the round that connected the subscribers); per key: "
             . "%d SSUBSCRIBE, %d SUNSUBSCRIBE (%d workers)",
             $waiting / $n, $first / $dups, $d{ssubscribe} / 5,
             $d{sunsubscribe} / 5, $workers);

# 2. a release wakes the waiters: one becomes the owner at once and runs,
# the others get its replay
{
    my ($orig, @d) = round('wake-release', '-fail', \@at);
    is("$orig->{status} $orig->{idem}", '503 new', "the original failed: 503, released");
    my @new = grep { "$_->{status} $_->{idem}" eq '200 new' } @d;
    my @rep = grep { "$_->{status} $_->{idem}" eq '200 replay' } @d;
    is(scalar @new, 1, "one waiter took the released claim");
    is(scalar @rep, $dups - 1, "the others replayed its response");
    is(scalar(grep { $_->{body} ne $new[0]{body} } @rep), 0,
       "the same response") if @new;
    cmp_ok($new[0]{done} - $orig->{done}, '<', (0.3 + 0.05) * $slow,
           "the new owner started within 50 ms of the release") if @new;
    is(runs('wake-release', '/backend-fail'), 1, "the failed run");
    is(runs('wake-release', '/backend'), 1, "one more run, the new owner's");
}

# 3. the subscriber connections killed while duplicates wait: they still
# complete, and the subscriptions come back in time to wake them
{
    my ($subs, $back);
    my ($orig, @d) = round('wake-kill', '-long', \@at, sub {
        sleep 0.1;
        # the channel is the record key: the only one waited for now
        my ($ch) = split /\n/, redis_cli('PUBSUB', 'SHARDCHANNELS');
        $ch //= 'none';
        $subs = redis_cli('PUBSUB', 'SHARDNUMSUB', $ch);
        redis_cli('CLIENT', 'KILL', 'TYPE', 'pubsub');
        # back with the usual reconnect; looked at until the original's
        # second is nearly over, not once after a guess (a loaded machine)
        my $until = time + 0.6 * $slow;
        do {
            sleep 0.05;
            $back = redis_cli('PUBSUB', 'SHARDNUMSUB', $ch);
        } while (($back // '') !~ /[1-9]\d*\s*$/ && time < $until);
    });
    is(scalar(grep { "$_->{status} $_->{idem}" eq '200 replay' } @d), $dups,
       "after CLIENT KILL TYPE pubsub every duplicate was replayed");
    is(runs('wake-kill', '/backend-long'), 1, "the upstream ran once");
    my ($n0) = ($subs // '') =~ /(\d+)\s*$/;
    my ($n1) = ($back // '') =~ /(\d+)\s*$/;
    diag("subscribers of the key: $n0 before the kill, $n1 after");
    cmp_ok($n0 // 0, '>=', 1, "the waiters' key was subscribed");
    cmp_ok($n1 // 0, '>=', 1, "and is subscribed again after the kill");
    my $late = (sort { $b <=> $a } map { $_->{done} - $orig->{done} } @d)[0];
    cmp_ok($late, '<', 0.05 * $slow, "woken, not polled, after the kill");
}

# 4. waiters that leave before the original completes: a client that
# closes its connection, a wait that ends in 409; the others are woken
{
    my $r;
    my ($orig, @d) = round('wake-leave', undef, \@at, sub {
        my $s = Wake::connect_send('wake-leave');
        $r = http_post($port2, 'wake-leave', 'x', '/pay', undef, 5);
        close $s;
    });
    is($r->{status}, 409, "a wait shorter than the original: 409");
    is(scalar(grep { "$_->{status} $_->{idem}" eq '200 replay' } @d), $dups,
       "the waiters that stayed were replayed");
    my $late = (sort { $b <=> $a } map { $_->{done} - $orig->{done} } @d)[0];
    cmp_ok($late, '<', 0.05 * $slow, "and woken");
}

# 5. nothing waits any more: no subscription is left
sleep 0.2;
like(redis_cli('PUBSUB', 'SHARDCHANNELS'), qr/^\s*$/,
     "no channel subscribed once nobody waits");

# 6. SSUBSCRIBE refused (an ACL here, Redis 6 alike) turns wake-ups off
# in the worker: the waiters poll, no reconnect loop; a refused SPUBLISH
# does not fail the store
{
    local $Wake::path = '/pay-acl';
    my ($orig, @d) = round('wake-acl', undef, \@at);
    is("$orig->{status} $orig->{idem}", '200 new', "no wake-ups: the original");
    is(scalar(grep { "$_->{status} $_->{idem}" eq '200 replay' } @d), $dups,
       "no wake-ups: every duplicate polled and was replayed");
    is(runs('wake-acl', '/backend'), 1, "the upstream ran once");
    round('wake-acl-2', undef, [0.08]);
    my $refused = grep { /refused SSUBSCRIBE: NOPERM/ }
                  lines_of("$dir/logs/error.log");
    cmp_ok($refused, '>=', 1, "the refusal is logged");
    cmp_ok($refused, '<=', $workers, "once per worker, not retried");
}

# 7. a reload: the new workers wake waiters too
nginx_signal($dir, 'reload');
sleep 1 * $slow;
{
    my ($orig, @d) = round('wake-reload', undef, \@at);
    is(scalar(grep { "$_->{status} $_->{idem}" eq '200 replay' } @d), $dups,
       "after a reload every duplicate was replayed");
    my $late = (sort { $b <=> $a } map { $_->{done} - $orig->{done} } @d)[0];
    cmp_ok($late, '<', 0.05 * $slow, "woken after the reload");
}

nginx_stop($dir);
is(join('', log_problems("$dir/logs/error.log")), '',
   "no crash, alert or socket left");

done_testing();
