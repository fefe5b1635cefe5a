# A claim whose connection breaks before its reply is sent again, once, on
# the next connection: the claim is safe to repeat. When the first one had
# reached Redis, the second finds this request's own claim record (its
# token) and the request goes on as the owner. A TCP proxy in this test
# cuts the connection around the claim's SET, before or after Redis ran it.
# Plain Test::More: its own nginx and proxy (ports 20780-20789).
# topology: yes (make test-topologies runs this file)
use strict;
use warnings;
use lib 't/lib';
use Test::More;
use Fleet;
use CutProxy;
use Time::HiRes qw(sleep time);

plan skip_all => 'TEST_NGINX_LOAD_MODULES must name the module'
    unless have_module();

my $rp = $ENV{TEST_NGINX_REDIS_PORT} || 6379;
my $slow = $ENV{TEST_ASAN} ? 4 : 1;
my ($proxy_port, $port) = (20780, 20781);

my $root = fleet_root('redisresend');
my $proxy_pid = cut_proxy($proxy_port, $rp, "$root/cuts.log");

my $dir = nginx_conf('resend',
    pay_server('resend', $port, "idempotency_redis 127.0.0.1:$proxy_port;"
               . " idempotency_redis_timeout 1s;"), 1);

END {
    nginx_stop($dir) if $dir;
    kill 'KILL', $proxy_pid if $proxy_pid;
}

nginx_start($dir);
sleep 0.5 * $slow;

sub runs {
    return upstream_runs($dir)->{$_[0]} // 0;
}

sub status_of {
    my $r = shift;
    my ($idem) = $r->{head} =~ /X-Idem: (\w+)/;
    return "$r->{status} " . ($idem // '-');
}

# 1. the SET ran, its reply was lost: the claim sent again finds its own
# claim record, the request is the owner
cut('after', 1);
my $r = http_post($port, 'resend-after', 'x', undef, undef, 5);
is(status_of($r), '201 new', "cut after the claim ran: the request runs");
is(runs('resend-after'), 1, "the upstream ran once");
$r = http_post($port, 'resend-after', 'x', undef, undef, 5);
is(status_of($r), '201 replay', "its record was stored: a retry replays");
is(runs('resend-after'), 1, "the retry did not run");

# 2. the SET never reached Redis: the claim sent again claims the key
cut('before', 1);
$r = http_post($port, 'resend-before', 'x', undef, undef, 5);
is(status_of($r), '201 new', "cut before the claim ran: the request runs");
is(runs('resend-before'), 1, "the upstream ran once");

# 3. sent again only once: a second break is an error, and nothing ran
cut('before', 2);
$r = http_post($port, 'resend-twice', 'x', undef, undef, 5);
is($r->{status}, 503, "a claim is sent again only once: 503");
cmp_ok($r->{took}, '<', 1.5, "within the timeout");
is(runs('resend-twice'), 0, "the upstream did not run");
sleep 0.1;    # the reconnect
$r = http_post($port, 'resend-twice', 'x', undef, undef, 5);
is(status_of($r), '201 new', "nothing was claimed: the retry runs");
is(runs('resend-twice'), 1, "once");

# 4. a concurrent duplicate still sees a conflict, never a second run
cut('after', 1);
my $res = http_burst([ map { [$port, 'resend-dup', 'x'] } 1 .. 4 ], 5);
my @st = sort map { status_of($_) } @$res;
cmp_ok(runs('resend-dup'), '<=', 1, "duplicates around a cut: at most one run")
    or diag "@st";
is(scalar(grep { /^201 new$/ } @st), runs('resend-dup'),
   "one new per run") or diag "@st";

is(scalar log_problems("$dir/logs/error.log"), 0, "no crash or alert");

done_testing();
