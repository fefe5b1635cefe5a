# Redis 6.2 (SPEC §1: Redis >= 6.2): 6.2 refuses SET with NX and GET
# ("ERR syntax error"), so each worker falls back to the claim script
# (EVALSHA, and EVAL after NOSCRIPT).  Only Redis 7 is installed: a tiny
# Redis module (t/redis62/redis62.c) makes it refuse SET NX GET exactly as
# 6.2 does, and the whole lifecycle must still hold.
# Plain Test::More: it starts its own Redis and nginx (master, 2 workers).
use strict;
use warnings;
use lib 't/lib';
use Test::More;
use Fleet;
use Time::HiRes qw(sleep time);

plan skip_all => 'TEST_NGINX_LOAD_MODULES must name the module'
    unless have_module();

my $cc = (grep { `command -v $_ 2>/dev/null` } qw(cc gcc clang))[0];
plan skip_all => 'no C compiler to build the Redis 6.2 emulation module'
    unless $cc;
plan skip_all => "$ENV{REDIS_SERVER} is not installed"
    unless `command -v $ENV{REDIS_SERVER} 2>/dev/null`;

my $slow = $ENV{TEST_ASAN} ? 4 : 1;    # AddressSanitizer is slow
my $workers = 2;
my $redis_port = 19910;
my ($port, $backend_port) = (19911, 19912);
my $redis_dir = "/tmp/ngx-idempotency-redis-$redis_port";
my $redis_sock = "$redis_dir/redis.sock";   # short: sun_path is 108 bytes
my $tcp = "127.0.0.1:$redis_port";

my $root = fleet_root('redis62');
my $nginx;

sub give_up {
    fail(shift);
    diag(@_) if @_;
    done_testing();
    exit 1;
}

sub redis { redis_cli_at($redis_port, @_) }

sub redis_stop {
    open my $fh, '<', "$redis_dir/redis.pid" or return;
    chomp(my $pid = <$fh> // '');
    return unless $pid =~ /^\d+$/;
    kill 'TERM', $pid;
    for (1 .. 50) {
        last unless kill 0, $pid;
        sleep 0.1;
    }
}

END {
    local $?;    # Test::More's exit code
    nginx_stop($nginx) if $nginx;
    redis_stop();
}

# 1. the emulation: Redis 7 with the module answers as 6.2 does

system($cc, qw(-shared -fPIC -O2 -Wall -Werror -o), "$root/redis62.so",
       't/redis62/redis62.c') == 0
    or give_up("compile t/redis62/redis62.c with $cc");

redis_stop();
system('mkdir', '-p', $redis_dir);
system($ENV{REDIS_SERVER}, '--port', $redis_port, '--bind', '127.0.0.1',
       '--save', '', '--appendonly', 'no', '--daemonize', 'yes',
       '--dir', $redis_dir, '--pidfile', "$redis_dir/redis.pid",
       '--logfile', "$redis_dir/redis.log", '--unixsocket', $redis_sock,
       '--unixsocketperm', '777',
       '--loadmodule', "$root/redis62.so") == 0
    or give_up("start $ENV{REDIS_SERVER}");
for (1 .. 50) {
    last if redis('PING') eq 'PONG';
    sleep 0.1;
}
redis('PING') eq 'PONG'
    or give_up("Redis on $redis_port with the module",
               lines_of("$redis_dir/redis.log"));

like(redis(qw(SET redis62:a b NX GET PX 1000)), qr/^ERR syntax error/,
     "SET NX GET: syntax error, as on 6.2");
like(redis(qw(set redis62:a b get nx)), qr/^ERR syntax error/,
     "in any case and order");
is(redis(qw(SET redis62:a b NX PX 1000)), 'OK', "SET NX still works");
is(redis(qw(SET redis62:a c GET)), 'b', "SET GET still works");
is(redis('EVAL', 'return redis.call("SET", KEYS[1], "d", "NX")', 1,
         'redis62:b'), 'OK', "SET NX from a script still works");

redis('FLUSHALL');
redis('CONFIG', 'RESETSTAT');

# 2. one nginx, two workers, in front of a backend that counts executions

sub executions { scalar(my @l = lines_of("$nginx/logs/exec.log")) }

sub stats {
    my %s;
    for (split /\r?\n/, redis('INFO', 'commandstats')) {
        next unless /^cmdstat_(\w+):calls=(\d+),.*rejected_calls=(\d+),
                     failed_calls=(\d+)/x;
        $s{$1} = { calls => $2, failed => $3 + $4 };
    }
    return \%s;
}

sub notices {
    my $target = shift;
    return grep { /refuses SET NX GET, claiming with a script/
                  && /redis "\Q$target\E"/ } lines_of("$nginx/logs/error.log");
}

$nginx = nginx_conf('edge', <<"EOC", $workers);
    log_format exec '\$request_id';
    server {
        listen 127.0.0.1:$port reuseport;
        idempotency_redis_timeout @{[ 1000 * $slow ]}ms;
        add_header X-Idem \$idempotency_status always;
        location = /pay {
            idempotency on;
            idempotency_redis $tcp;
            proxy_pass http://127.0.0.1:$backend_port;
        }
        location = /pay-unix {
            idempotency on;
            idempotency_redis unix:$redis_sock;
            proxy_pass http://127.0.0.1:$backend_port;
        }
    }
    server {
        listen 127.0.0.1:$backend_port;
        location / {
            access_log logs/exec.log exec;
            echo_status 201;
            echo_sleep 0.5;
            echo "charged \$request_id";
        }
    }
EOC
nginx_start($nginx);
sleep 0.5 * $slow;

my $t0 = time;
my $timeout = 10 * $slow;

# the first request, its retry, a different body
{
    my $key = "r62-first-" . time();
    my $a = http_post($port, $key, '{"amount":5}', undef, undef, $timeout);
    is($a->{status}, 201, "first POST executes");
    like($a->{head}, qr/^X-Idem: new\r?$/m, "  as new");
    like($a->{body}, qr/^charged \w+$/, "  with the backend's body");

    my $b = http_post($port, $key, '{"amount":5}', undef, undef, $timeout);
    is($b->{status}, 201, "retry: the stored status");
    like($b->{head}, qr/^Idempotent-Replayed: true\r?$/m, "  replayed");
    is($b->{body}, $a->{body}, "  byte-exact body");
    is(settled(\&executions), 1, "the upstream executed once");

    my $c = http_post($port, $key, '{"amount":6}', undef, undef, $timeout);
    is($c->{status}, 422, "same key, different body: 422");
}

# every worker meets the refusal once, serially (reuseport spreads the
# connections); from then on it claims with the script
{
    my %pids;
    for my $i (1 .. 30) {
        last if keys %pids == $workers;
        http_post($port, "r62-warm-$i-" . time(), 'w', undef, undef,
                  $timeout);
        %pids = map { /\[notice\] (\d+)#/ ? ($1 => 1) : () } notices($tcp);
    }
    is(scalar keys %pids, $workers, "each worker switched to the script");
}

# a parallel burst of one key executes once; an in-flight duplicate is 409
{
    my $before = settled(\&executions);
    my $key = "r62-burst-" . time();
    my $res = http_burst([ map { [$port, $key, 'burst'] } 1 .. 30 ],
                         $timeout);
    my %st;
    $st{ $_->{status} }++ for @$res;
    is(settled(\&executions) - $before, 1,
       "30 parallel duplicates executed once")
        or diag explain \%st;
    ok(!grep({ $_ != 201 && $_ != 409 } keys %st),
       "every answer is the original or a 409") or diag explain \%st;

    $key = "r62-inflight-" . time();
    $res = http_burst([ map { [$port, $key, 'once'] } 1 .. 2 ], $timeout);
    my ($dup) = grep { $_->{status} == 409 } @$res;
    is(join(' ', sort map { $_->{status} } @$res), '201 409',
       "an in-flight duplicate: 409");
    like($dup ? $dup->{head} : '', qr/^Retry-After: 1\r?$/m,
         "  with Retry-After: 1");
}

# what Redis saw: the script, and at most one refused SET per worker
{
    my $s = stats();
    cmp_ok($s->{evalsha}{calls} // 0, '>', 0, "claims went by EVALSHA");
    cmp_ok($s->{set}{failed} // 0, '>=', 1, "SET NX GET was refused");
    cmp_ok($s->{set}{failed} // 0, '<=', $workers,
           "  at most once per worker");
    my @n = notices($tcp);
    cmp_ok(scalar @n, '<=', $workers, "the notice at most once per worker")
        or diag @n;
}

# SCRIPT FLUSH: the next claim meets NOSCRIPT and sends the script itself
{
    redis('SCRIPT', 'FLUSH');
    my $s0 = stats();
    my $key = "r62-flushed-" . time();
    my $r = http_post($port, $key, 'f', undef, undef, $timeout);
    is($r->{status}, 201, "after SCRIPT FLUSH a new key executes");
    like($r->{head}, qr/^X-Idem: new\r?$/m, "  as new");
    my $s1 = stats();
    cmp_ok(($s1->{evalsha}{failed} // 0) - ($s0->{evalsha}{failed} // 0),
           '>=', 1, "  EVALSHA met NOSCRIPT");
    # the claim by EVAL; the store by EVALSHA once the scripts are loaded
    # again, or by EVAL after its own NOSCRIPT
    cmp_ok(($s1->{eval}{calls} // 0) - ($s0->{eval}{calls} // 0), '>=', 1,
           "  the claim went by EVAL");
    my $b = http_post($port, $key, 'f', undef, undef, $timeout);
    like($b->{head}, qr/^Idempotent-Replayed: true\r?$/m,
         "  and its retry is replayed");
    is($b->{body}, $r->{body}, "  byte-exact");
}

# a worker whose first claims on a target arrive together: all are served
# (each retried by script), and the notice still comes once per worker
{
    my $res = http_burst([ map { [$port, "r62-cold-$_-" . time(), 'c',
                                  '/pay-unix'] } 1 .. 20 ], $timeout);
    my %st;
    $st{ $_->{status} }++ for @$res;
    is($st{201} // 0, 20, "a first burst on a fresh target: all executed")
        or diag explain \%st;
    my @n = notices("unix:$redis_sock");
    cmp_ok(scalar @n, '<=', $workers, "  the notice at most once per worker");
}

diag(sprintf "requests took %.1f s", time - $t0);

nginx_stop($nginx);
undef $nginx;

my @p = grep { /\[(error|crit|alert|emerg)\]/ }
        lines_of("$root/edge/logs/error.log");
is(scalar @p, 0, "no [error], [crit] or [alert] in the error log") or diag @p;
@p = log_problems("$root/edge/logs/error.log");
is(scalar @p, 0, "no crash or socket left") or diag @p;

done_testing();
