# Soak: a long mix of new keys, replays and conflicts through one worker.
# Its RSS must stop growing after warm-up (< 5 MB), and every record the
# module wrote must carry a TTL.  Fast by default; TORTURE_FULL=1 runs
# 1,000,000 requests.
use strict;
use warnings;
use lib 't/lib';
use Test::More;
use Fleet;
use Time::HiRes qw(sleep time);

plan skip_all => 'TEST_NGINX_LOAD_MODULES must name the module'
    unless have_module();
plan skip_all => 'wrk is not installed' unless `which wrk` =~ /wrk/;

my $full = $ENV{TORTURE_FULL};
my $target = $full ? 1_000_000 : 40_000;
my $redis_port = $ENV{TEST_NGINX_REDIS_PORT} || 6379;
my ($backend_port, $edge_port) = (19960, 19961);

my $root = fleet_root('soak');

my $backend = nginx_conf('backend', <<"EOC", 1);
    server {
        listen 127.0.0.1:$backend_port;
        location / { echo "ok \$request_id"; }
    }
EOC

my $edge = nginx_conf('edge', <<"EOC", 1);
    idempotency_redis 127.0.0.1:$redis_port;
    idempotency_ttl 120s;
    upstream backend { server 127.0.0.1:$backend_port; keepalive 16; }
    server {
        listen 127.0.0.1:$edge_port;
        location /pay {
            idempotency on;
            proxy_http_version 1.1;
            proxy_set_header Connection "";
            proxy_pass http://backend;
        }
    }
EOC

# both wrk threads walk the same key sequence, each key twice per thread:
# new, replays, and conflicts when the threads meet on a key in flight
my $lua = "$root/soak.lua";
open my $fh, '>', $lua or die;
print $fh <<'EOL';
local n = 0
local run = tostring(os.time())
function setup(thread) end
request = function()
    n = n + 1
    local key = "soak-" .. run .. "-" .. math.floor(n / 4)
    return wrk.format("POST", "/pay",
        { ["Idempotency-Key"] = key, ["Content-Type"] = "application/json" },
        '{"amount":42}')
end
local bad = 0
response = function(status, headers, body)
    if status ~= 200 and status ~= 409 then bad = bad + 1 end
end
done = function(summary, latency, requests)
    io.write(string.format("BAD %d\n", bad))
end
EOL
close $fh;

nginx_start($_) for $backend, $edge;
sleep 0.5;

sub worker_rss {
    open my $p, '<', "$edge/logs/nginx.pid" or return 0;
    my $master = <$p>;
    chomp $master;
    my ($pid) = `pgrep -P $master`;
    chomp $pid;
    open my $s, '<', "/proc/$pid/status" or return 0;
    my ($kb) = map { /^VmRSS:\s+(\d+)/ ? $1 : () } <$s>;
    return $kb;
}

my ($total, $bad, $rss0, $rss) = (0, 0, 0, 0);
my $chunk = $full ? 20 : 3;
my ($t0, $chunks) = (time, 0);

# the first chunk is the warm-up; at least two more are measured
while (($total < $target || $chunks < 3)
       && time - $t0 < ($full ? 900 : 120))
{
    $chunks++;
    my $out = `wrk -t2 -c16 -d${chunk}s -s $lua http://127.0.0.1:$edge_port/pay 2>&1`;
    my ($n) = $out =~ /(\d+) requests in/;
    my ($b) = $out =~ /BAD (\d+)/;
    $total += $n // 0;
    $bad += $b // 0;
    $rss = worker_rss();
    $rss0 ||= $rss;
    last unless $n;
}

ok($total >= $target, "soak: $total requests (target $target)");
is($bad, 0, "soak: every answer was a 200 (new or replay) or a 409");
SKIP: {
    skip "RSS means nothing under AddressSanitizer (quarantine)", 1
        if $ENV{TEST_ASAN};
    cmp_ok($rss - $rss0, '<', 5 * 1024,
           "soak: worker RSS grew less than 5 MB after warm-up");
}
diag(sprintf "soak: %d requests in %.0f s, worker RSS %d kB -> %d kB",
     $total, time - $t0, $rss0, $rss);

my ($no_ttl, $seen) = (0, 0);
for (1 .. 300) {
    my $k = redis_cli('RANDOMKEY');
    next unless $k =~ /^idem:/;
    $seen++;
    $no_ttl++ if redis_cli('PTTL', $k) < 0;
}
is($no_ttl, 0, "soak: all $seen sampled records carry a TTL");

nginx_stop($_) for $edge, $backend;
my @p = log_problems("$edge/logs/error.log");
is(scalar @p, 0, "soak: no crash, alert or socket left") or diag @p;

done_testing();
