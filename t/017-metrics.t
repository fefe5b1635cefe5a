# Prometheus metrics (idempotency_metrics): counters in shared memory, so a
# scrape answered by either of two workers shows every worker's requests;
# a reload keeps them; Redis up/down/reconnects; the claim latency
# histogram; promtool accepts the scrape and the shipped alert rules.
# What needs a request to be in flight holds it (t/lib/Held.pm) or holds
# Redis (SIGSTOP): nothing depends on how fast this machine is.
# Plain Test::More: it runs its own nginx with a master and 2 workers.
use strict;
use warnings;
use lib 't/lib';
use Test::More;
use Fleet;
use Held;
use IO::Socket::INET;
use IO::Select;
use JSON::PP ();
use Time::HiRes qw(sleep time);

plan skip_all => 'TEST_NGINX_LOAD_MODULES must name the module'
    unless have_module();

my $redis_port = $ENV{TEST_NGINX_REDIS_PORT} || 6379;
my $slow = $ENV{TEST_ASAN} ? 4 : 1;
my ($port, $backend_port, $held_port) = (20500, 20501, 20503);
my $redis = 'util/redis.sh';
my $nginx = $ENV{TEST_NGINX_BINARY} || 'nginx';
my $promtool = `sh -c 'command -v promtool'`;
chomp $promtool;

my $root = fleet_root('metrics');

sub edge_conf {
    my $extra = shift // '';
    return <<"EOC";
    idempotency_redis 127.0.0.1:$redis_port;
    idempotency_redis_timeout 5s;
    log_format served '\$pid \$idempotency_status';
    server {
        listen 127.0.0.1:$port reuseport;
        idempotency_metrics_zone api;
        idempotency on;
        access_log logs/served.log served;
        location = /pay {
            proxy_pass http://127.0.0.1:$backend_port/ok;
        }
        location = /slow {
            idempotency on;
            proxy_pass http://127.0.0.1:$held_port;
        }
        location = /lost {
            idempotency on;
            idempotency_redis_prefix lost:;
            proxy_pass http://127.0.0.1:$held_port;
        }
        location = /big {
            idempotency on;
            idempotency_store_max_size 10;
            proxy_pass http://127.0.0.1:$backend_port/ok;
        }
        location = /fail {
            idempotency on;
            proxy_pass http://127.0.0.1:$backend_port/fail;
        }
        location = /pass {
            idempotency on;
            idempotency_on_redis_error pass;
            proxy_pass http://127.0.0.1:$backend_port/ok;
        }
        location = /req {
            idempotency on;
            idempotency_required on;
            idempotency_metrics_zone strict;
            proxy_pass http://127.0.0.1:$backend_port/ok;
        }
        location = /other {
            idempotency off;
            proxy_pass http://127.0.0.1:$backend_port/ok;
        }
        location = /metrics {
            idempotency_metrics;
            add_header X-Worker \$pid;
        }
        $extra
    }
    server {
        listen 127.0.0.1:$backend_port;
        access_log off;
        location /ok { echo "ok"; }
        location /fail { return 503 "failed\\n"; }
    }
EOC
}

my $dir = nginx_conf('edge', edge_conf());
my $held = Held->new($held_port);

# scrape(): a new connection each time, so either worker may answer
sub scrape {
    my ($method) = @_;
    $method //= 'GET';
    my $s = IO::Socket::INET->new(PeerAddr => "127.0.0.1:$port",
                                  Timeout => 5) or return {};
    print $s "$method /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n"
        . ($method eq 'POST' ? "Content-Length: 0\r\n" : '') . "\r\n";
    my $res = '';
    my $sel = IO::Select->new($s);
    my $deadline = time + 5;
    while (time < $deadline && $sel->can_read($deadline - time)) {
        my $n = sysread($s, my $buf, 65536);
        last unless $n;
        $res .= $buf;
    }
    my ($head, $body) = split /\r\n\r\n/, $res, 2;
    my ($status) = ($head // '') =~ m{^HTTP/1\.1 (\d+)};
    my ($pid) = ($head // '') =~ /^X-Worker: (\d+)/mi;
    my %m;
    for (split /\n/, $body // '') {
        next if /^#/ || !/\S/;
        my ($k, $v) = /^(\S+(?:\{[^}]*\})?) (\S+)$/ or next;
        $m{$k} = $v;
    }
    return { status => $status // 0, head => $head // '', body => $body,
             pid => $pid, m => \%m };
}

sub req { "nginx_idempotency_requests_total{zone=\"$_[0]\",status=\"$_[1]\"}" }
sub store { "nginx_idempotency_stores_total{zone=\"$_[0]\",result=\"$_[1]\"}" }
my $up = "nginx_idempotency_redis_up{redis=\"127.0.0.1:$redis_port\"}";
my $reconnects =
    "nginx_idempotency_redis_reconnects_total{redis=\"127.0.0.1:$redis_port\"}";
my $lat = 'nginx_idempotency_redis_latency_seconds';

# several scrapes: until both workers answered, all must agree
sub scrape_all {
    my (%pids, $first, @diff);
    for (1 .. 40) {
        my $s = scrape();
        $first //= $s;
        $pids{ $s->{pid} // 0 } = 1;
        push @diff, $s->{pid} if join(',', map { "$_=$s->{m}{$_}" }
                                      sort keys %{ $s->{m} })
                                 ne join(',', map { "$_=$first->{m}{$_}" }
                                         sort keys %{ $first->{m} });
        last if keys %pids >= 2 && $_ >= 6;
    }
    return ($first, scalar keys %pids, \@diff);
}

sub wait_for {
    my ($key, $want, $secs) = @_;
    my $deadline = time + $secs;
    while (time < $deadline) {
        my $v = scrape()->{m}{$key};
        return 1 if defined $v && $v == $want;
        sleep 0.1;
    }
    return 0;
}

sub post { http_post($port, @_) }

sub get_pay {
    my $s = IO::Socket::INET->new(PeerAddr => "127.0.0.1:$port") or return;
    print $s "GET /pay HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n";
    local $/;
    my $r = <$s>;
    return $r;
}

nginx_start($dir);

ok(wait_for($up, 1, 30 * $slow), "redis_up is 1 once the workers connected");

my $t = time;
my %st;

# 5 new, 3 replays, 1 mismatch (zone "api")
$st{ post("k$_-$t", "amount=$_")->{status} }++ for 1 .. 5;
$st{ post("k$_-$t", "amount=$_")->{status} }++ for 1 .. 3;
$st{ post("k1-$t", "amount=999")->{status} }++;
is_deeply(\%st, { 200 => 8, 422 => 1 }, "5 new, 3 replays, 1 mismatch");

# 1 new whose upstream is held and 2 duplicates while it runs: 2
# conflicts
{
    my $s = IO::Socket::INET->new(PeerAddr => "127.0.0.1:$port") or die $!;
    print $s Fleet::_request("slow-$t", 'x', '/slow');
    my $c = $held->take;
    my %s;
    $s{ $_->{status} }++ for @{ http_burst([ map { [$port, "slow-$t", 'x',
                                                    '/slow'] } 1 .. 2 ],
                                           30 * $slow) };
    $held->answer($c, "slow\n") if $c;
    $s{ Fleet::_parse(do { local $/; <$s> } // '')->{status} }++;
    is_deeply(\%s, { 200 => 1, 409 => 2 }, "slow: 1 new, 2 conflicts")
        or diag explain \%s;
}

is(post('"unterminated', 'x')->{status}, 400, "1 invalid key");
is(post(undef, 'x', '/req')->{status}, 400, "1 missing key (zone strict)");
like(get_pay() // '', qr{^HTTP/1\.1 200}, "a GET is a bypass");
is(post(undef, 'x')->{status}, 200, "a POST without a key is a bypass");
is(post("other-$t", 'x', '/other')->{status}, 200,
   "a location without idempotency is not counted");
is(post("big-$t", 'x', '/big')->{status}, 200, "too large to store");
is(post("fail-$t", 'x', '/fail')->{status}, 503, "a 503 is released");

# a claim that disappears while its request runs: the store finds it gone
{
    my $s = IO::Socket::INET->new(PeerAddr => "127.0.0.1:$port") or die $!;
    print $s Fleet::_request("lost-$t", 'x', '/lost');
    my $c = $held->take;
    my @keys = grep { /\S/ } split /\n/,
               `$ENV{REDIS_CLI} -p $redis_port --scan --pattern 'lost:*'`;
    is(scalar @keys, 1, "the claim of the held request is in Redis");
    redis_cli('DEL', $_) for @keys;
    $held->answer($c, "slow\n") if $c;
    local $/;
    my $res = <$s>;
}

my %want = (
    req('api', 'new') => 9, req('api', 'replay') => 3,
    req('api', 'conflict') => 2, req('api', 'mismatch') => 1,
    req('api', 'invalid') => 1, req('api', 'missing') => 0,
    req('api', 'error') => 0, req('api', 'bypass') => 2,
    req('strict', 'missing') => 1, req('strict', 'new') => 0,
    req('', 'new') => 0, req('', 'bypass') => 0,
    store('api', 'stored') => 6, store('api', 'too_large') => 1,
    store('api', 'released') => 1, store('api', 'failed') => 1,
    store('strict', 'stored') => 0, store('', 'stored') => 0,
    'nginx_idempotency_claims_lost_total' => 1,
    "${lat}_count" => 15, "${lat}_bucket{le=\"+Inf\"}" => 15,
    $up => 1, $reconnects => 0,
);

# a request is counted in its log phase, which may come a moment after its
# client read the response (lingering close), and a store when its reply
# arrives: wait until one scrape shows them all
sub scrape_settled {
    my ($want) = @_;
    my $deadline = time + 30 * $slow;
    while (time < $deadline) {
        my $m = scrape()->{m};
        return 1 unless grep { ($m->{$_} // -1) != $want->{$_} } keys %$want;
        sleep 0.1;
    }
    return 0;
}

sub check_counts {
    my ($label, $want) = @_;
    scrape_settled($want);
    my ($s, $workers, $diff) = scrape_all();
    is($workers, 2, "$label: both workers answered scrapes");
    is_deeply($diff, [], "$label: every scrape shows the same counts");
    my %got = map { $_ => $s->{m}{$_} } keys %$want;
    is_deeply(\%got, $want, "$label: exact counts") or diag $s->{body};
    return $s;
}

my $s = check_counts('first scrape', \%want);

is($s->{status}, 200, "the metrics location answers 200");
like($s->{head}, qr{^Content-Type: text/plain; version=0\.0\.4; charset=utf-8\r?$}mi,
     "Prometheus text format 0.0.4");
like($s->{body}, qr/^nginx_idempotency_build_info\{version="\d+\.\d+\.\d+[^"]*"\} 1$/m,
     "build_info with the version");
for my $name (qw(requests_total stores_total claims_lost_total redis_up
                 redis_reconnects_total redis_latency_seconds build_info
                 redis_info)) {
    like($s->{body}, qr/^# HELP nginx_idempotency_$name .+\n# TYPE nginx_idempotency_$name \w+$/m,
         "HELP and TYPE for $name");
}

# the server each worker learnt at its handshake, and how a claim ends
{
    my $info = join "\n", redis_cli('INFO', 'server');
    my ($valkey) = $info =~ /^valkey_version:(\d+\.\d+\.\d+)/m;
    my ($redis) = $info =~ /^redis_version:(\d+\.\d+\.\d+)/m;
    my $server = $valkey ? "valkey $valkey" : "redis $redis";
    # scripting is allowed here: native only where the server also
    # compares and deletes (t/053 has the rest)
    my $cas = server_caps()->{native} ? 'native' : 'script';
    my @lines = $s->{body} =~ /^(nginx_idempotency_redis_info\{.*)$/mg;
    is_deeply(\@lines,
              ["nginx_idempotency_redis_info{redis=\"127.0.0.1:$redis_port\","
               . "server=\"$server\",cas=\"$cas\"} 1"],
              "redis_info: $server, finished by $cas compare-and-set");
}

{
    my @b = $s->{body} =~ /^${lat}_bucket\{le="([^"]+)"\} (\d+)$/mg;
    my (@le, @n);
    while (@b) { push @le, shift @b; push @n, shift @b }
    is("@le", "0.0005 0.001 0.0025 0.005 0.01 0.025 0.05 0.1 0.25 0.5 1 +Inf",
       "latency buckets from 0.5 ms to 1 s");
    ok(!grep({ $n[$_] < $n[$_ - 1] } 1 .. $#n), "buckets are cumulative");
    my ($sum) = $s->{body} =~ /^${lat}_sum (\S+)$/m;
    ok($sum > 0 && $sum < 15, "latency sum in seconds ($sum)");
}

{
    my %pids;
    for (lines_of("$dir/logs/served.log")) {
        $pids{$1} = 1 if /^(\d+) (?!bypass)/;
    }
    is(scalar keys %pids, 2, "protected requests were served by both workers");
}

SKIP: {
    skip 'promtool not installed (Debian package prometheus)', 4
        unless $promtool;
    open my $f, '>', "$root/scrape.txt" or die $!;
    print $f $s->{body};
    close $f;
    system("$promtool check metrics < $root/scrape.txt"
           . " > $root/promtool.out 2>&1");
    is($?, 0, "promtool check metrics: clean")
        or diag join '', lines_of("$root/promtool.out");
    my $out = `$promtool check rules docs/prometheus-alerts.yml 2>&1`;
    is($?, 0, "promtool check rules docs/prometheus-alerts.yml")
        or diag $out;

    $out = `$promtool test rules docs/prometheus-alerts.test.yml 2>&1`;
    is($?, 0, "the alerts fire on the module's series (promtool test rules)")
        or diag $out;

    # the dashboard's queries, with its variables filled in, as rules
    open my $fh, '<', 'docs/grafana-dashboard.json' or die $!;
    my $dash = JSON::PP::decode_json(do { local $/; <$fh> });
    my @expr = map { $_->{expr} } map { @{ $_->{targets} } }
               @{ $dash->{panels} };
    open my $rf, '>', "$root/dashboard-rules.yml" or die $!;
    print $rf "groups:\n  - name: dashboard\n    rules:\n";
    for my $i (0 .. $#expr) {
        (my $e = $expr[$i]) =~ s/\$__rate_interval/1m/g;
        $e =~ s/\$(instance|zone)/.*/g;
        $e =~ s/'/''/g;
        print $rf "      - record: dashboard:q$i\n        expr: '$e'\n";
    }
    close $rf;
    $out = `$promtool check rules $root/dashboard-rules.yml 2>&1`;
    ok($? == 0 && @expr >= 10, scalar(@expr) . " dashboard queries parse")
        or diag $out;
}

is(scrape('POST')->{status}, 405, "the metrics location refuses POST");

# reload with one more zone: kept counts, the new zone starts at 0
{
    my %old = map { $_ => 1 } grep { $_ } map { scrape()->{pid} } 1 .. 10;
    nginx_conf('edge', edge_conf(<<"EOC"));
        location = /added {
            idempotency on;
            idempotency_metrics_zone added;
            proxy_pass http://127.0.0.1:$backend_port/ok;
        }
EOC
    nginx_signal($dir, 'reload');
    my $deadline = time + 60 * $slow;
    while (time < $deadline) {
        my $pid = scrape()->{pid};
        last if $pid && !$old{$pid};
        sleep 0.1;
    }
    sleep 0.5;
    $want{ req('added', 'new') } = 0;
    check_counts('after a reload', \%want);

    post("k$_-$t-2", 'x') for 1 .. 2;
    post("added-$t", 'x', '/added');
    $want{ req('api', 'new') } += 2;
    $want{ store('api', 'stored') } += 2;
    $want{ req('added', 'new') } = 1;
    $want{ store('added', 'stored') } = 1;
    $want{"${lat}_count"} += 3;
    $want{"${lat}_bucket{le=\"+Inf\"}"} += 3;
    check_counts('after a reload, counting on', \%want);
}

# a claim that Redis held 0.6 s lands above the 0.5 s bucket, and adds at
# least that to the sum.  Redis is stopped (SIGSTOP) before the request
# and continued 0.6 s after the claim was seen waiting in its socket, so
# the claim took at least that long however loaded the machine is (and at
# most idempotency_redis_timeout, 5 s: no upper bucket is asserted)
my $redis_pid;
END { kill 'CONT', $redis_pid if $redis_pid }

# bytes waiting in Redis's end of an established connection
sub redis_queued {
    my $n = 0;
    my $me = sprintf ':%04X', $redis_port;
    for my $f ('/proc/net/tcp', '/proc/net/tcp6') {
        for (lines_of($f)) {
            my @f = split ' ';
            next unless ($f[1] // '') =~ /\Q$me\E$/ && $f[3] eq '01';
            $n += hex((split /:/, $f[4])[1]);
        }
    }
    return $n;
}

{
    my $before = scrape()->{m};
    $redis_pid = redis_pid() or die "no pid of the test Redis";
    kill 'STOP', $redis_pid;
    my $s = IO::Socket::INET->new(PeerAddr => "127.0.0.1:$port") or die $!;
    print $s Fleet::_request("delayed-$t", 'x');
    my $deadline = time + 30 * $slow;
    sleep 0.01 until redis_queued() || time > $deadline;
    ok(redis_queued(), "the claim waits in the stopped Redis's socket");
    sleep 0.6;
    kill 'CONT', $redis_pid;
    $redis_pid = undef;
    my $res = Fleet::_parse(do { local $/; <$s> } // '');
    is($res->{status}, 200, "a claim Redis held");
    scrape_settled({ "${lat}_count" => $before->{"${lat}_count"} + 1 });
    my $m = scrape()->{m};
    for my $le (qw(0.1 0.25 0.5)) {
        is($m->{"${lat}_bucket{le=\"$le\"}"},
           $before->{"${lat}_bucket{le=\"$le\"}"}, "...not within $le s");
    }
    is($m->{"${lat}_bucket{le=\"+Inf\"}"},
       $before->{"${lat}_bucket{le=\"+Inf\"}"} + 1, "...within +Inf");
    cmp_ok($m->{"${lat}_sum"} - $before->{"${lat}_sum"}, '>=', 0.6,
           "...and adds its time to the sum");
}

# Redis down: redis_up 0, errors counted; back: reconnects counted
{
    system($redis, 'stop', $redis_port);
    ok(wait_for($up, 0, 30 * $slow), "Redis stopped: redis_up is 0");
    is(post("down-$t", 'x')->{status}, 503, "Redis down: 503");
    is(post("down-pass-$t", 'x', '/pass')->{status}, 200,
       "Redis down: passed unprotected");
    ok(wait_for(req('api', 'error'), 2, 30 * $slow), "2 errors counted");

    system($redis, 'start', $redis_port);
    ok(wait_for($up, 1, 30 * $slow), "Redis back: redis_up is 1");
    my $r;
    my $deadline = time + 30 * $slow;
    while (time < $deadline) {
        $r = scrape()->{m}{$reconnects};
        last if $r >= 2;
        sleep 0.1;
    }
    cmp_ok($r, '>=', 2, "reconnects counted, one per worker at least");
    is(post("after-$t", 'x')->{status}, 200, "protected again");
}

# directive errors
{
    my @bad = (
        ['idempotency_metrics_zone "a b";', qr/invalid metrics zone name "a b"/],
        ['idempotency_metrics_zone "";', qr/invalid metrics zone name ""/],
        ['idempotency_metrics_zone ' . ('z' x 65) . ';',
         qr/invalid metrics zone name/],
        ['idempotency_metrics_zone a; idempotency_metrics_zone b;',
         qr/"idempotency_metrics_zone" directive is duplicate/],
        ['location /m { idempotency_metrics on; }',
         qr/invalid number of arguments in "idempotency_metrics"/],
        [join(' ', map { "location /z$_ { idempotency_metrics_zone z$_; }" }
              1 .. 65),
         qr/too many idempotency_metrics_zone names, at most 64/],
    );
    for my $case (@bad) {
        my $d = nginx_conf('bad', <<"EOC");
    server {
        listen 127.0.0.1:@{[ $port + 2 ]};
        $case->[0]
    }
EOC
        my $out = `$nginx -t -p $d/ -c conf/nginx.conf 2>&1`;
        like($out, $case->[1], "nginx -t refuses: $case->[0]");
    }
    my $d = nginx_conf('bad', <<"EOC");
    server {
        listen 127.0.0.1:@{[ $port + 2 ]};
        idempotency_metrics;
    }
EOC
    my $out = `$nginx -t -p $d/ -c conf/nginx.conf 2>&1`;
    like($out, qr/"idempotency_metrics" directive is not allowed here/,
         "idempotency_metrics is a location directive");
}

nginx_stop($dir);

my @p = log_problems("$dir/logs/error.log");
is(scalar @p, 0, "no crash, alert or socket left") or diag @p;

done_testing();
