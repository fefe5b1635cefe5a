# Faults, load and reload (issue: "Prove it under fire").  The default run is
# the fast subset that `make test` includes; TORTURE_FULL=1 (make torture)
# runs the full sizes.  Nothing may execute twice, nothing may crash or hang.
use strict;
use warnings;
use lib 't/lib';
use Test::More;
use Fleet;
use IO::Socket::INET;
use POSIX qw(:sys_wait_h);
use Time::HiRes qw(sleep time);

plan skip_all => 'TEST_NGINX_LOAD_MODULES must name the module'
    unless have_module();

my $full = $ENV{TORTURE_FULL};
my $redis_port = $ENV{TEST_NGINX_REDIS_PORT} || 6379;
my $redis_sh = 'util/redis.sh';
my ($backend_port, $fake_port, @edge_ports) = (19950, 19951, 19952, 19953);
# under AddressSanitizer everything is several times slower
my $slow = $ENV{TEST_ASAN} ? 4 : 1;
my $timeout_ms = 500 * $slow;

my $root = fleet_root('torture');

# a misbehaving upstream: resets, truncates, hangs; counts its hits
my $hits_file = "$root/fake-hits";
my $parent = $$;
my $fake = fork // die;
if ($fake == 0) {
    my $l = IO::Socket::INET->new(LocalAddr => "127.0.0.1:$fake_port",
                                  Listen => 128, ReuseAddr => 1) or die $!;
    $SIG{CHLD} = 'IGNORE';
    while (my $c = $l->accept) {
        if (fork) {
            close $c;
            next;
        }
        my $req = '';
        while ($req !~ /\r\n\r\n/) {
            sysread($c, my $b, 4096) or last;
            $req .= $b;
        }
        my ($path) = $req =~ m{^\w+ (\S+)};
        open my $h, '>>', $hits_file;
        print $h "$path\n";
        close $h;
        if ($path =~ /reset/) {
            setsockopt($c, Socket::SOL_SOCKET(), Socket::SO_LINGER(),
                       pack('ii', 1, 0));
        } elsif ($path =~ /midbody/) {
            syswrite($c, "HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\n"
                         . "only ten b");
        } elsif ($path =~ /hang/) {
            sleep 2;
        }
        close $c;
        exit 0;
    }
    exit 0;
}

# a test that dies must not leave its fake upstream on the port
END {
    kill 'TERM', $fake if $$ == $parent && $fake;
}

my $backend = nginx_conf('backend', <<"EOC", 2);
    log_format exec '\$http_idempotency_key \$request_uri';
    server {
        listen 127.0.0.1:$backend_port;
        location / {
            access_log logs/exec.log exec;
            echo_sleep 0.02;
            echo "ran \$request_id";
        }
        location /slow {
            access_log logs/exec.log exec;
            echo_sleep 0.5;
            echo "slow \$request_id";
        }
        location /slow-big {
            access_log logs/exec.log exec;
            echo_sleep 0.5;
            echo_duplicate 50000 "0123456789";
        }
    }
EOC

my @edges;
for my $i (0, 1) {
    # edge1 passes requests through unprotected while Redis is unusable
    my $on_error = $i ? 'pass' : 'reject';
    push @edges, nginx_conf("edge$i", <<"EOC", 2);
    idempotency_redis 127.0.0.1:$redis_port;
    idempotency_redis_timeout ${timeout_ms}ms;
    idempotency_on_redis_error $on_error;
    proxy_http_version 1.1;
    server {
        listen 127.0.0.1:$edge_ports[$i];
        location /pay {
            idempotency on;
            proxy_ignore_client_abort on;
            proxy_pass http://127.0.0.1:$backend_port;
        }
        location /slow {
            idempotency on;
            proxy_ignore_client_abort on;
            proxy_pass http://127.0.0.1:$backend_port;
        }
        location /slow-abortable {
            idempotency on;
            idempotency_lock_ttl 2s;
            proxy_pass http://127.0.0.1:$backend_port/slow;
        }
        location /slow-big-abortable {
            idempotency on;
            idempotency_lock_ttl 2s;
            proxy_pass http://127.0.0.1:$backend_port/slow-big;
        }
        location /refused {
            idempotency on;
            proxy_pass http://127.0.0.1:1;
        }
        location /fake/ {
            idempotency on;
            proxy_read_timeout 300ms;
            proxy_pass http://127.0.0.1:$fake_port;
        }
    }
EOC
}

nginx_start($_) for $backend, @edges;
sleep 0.5;

sub execs {
    my %n;
    for (lines_of("$backend/logs/exec.log")) {
        my ($k) = split / /;
        $n{$k}++;
    }
    return \%n;
}

my $run = "r" . int(time);

# 1. duplicate storms: 20 identical POSTs at once, per round a new key
{
    my $rounds = $full ? 1000 : 50;
    my (%status, %bodies, $bad_bodies);
    for my $r (1 .. $rounds) {
        my $key = "$run-storm-$r";
        my $res = http_burst([ map { [$edge_ports[$_ % 2], $key, '{"a":1}'] }
                               1 .. 20 ]);
        my %b;
        for (@$res) {
            $status{ $_->{status} }++;
            $b{ $_->{body} }++ if $_->{status} == 200;
        }
        $bad_bodies++ if keys %b != 1;
    }
    settled(sub { scalar grep { /-storm-/ } keys %{ execs() } });
    my $n = execs();
    my @twice = grep { /-storm-/ && $n->{$_} != 1 } keys %$n;
    my $ran = grep { /^$run-storm-/ } keys %$n;
    is($ran, $rounds, "storm: every one of $rounds keys executed");
    is(scalar @twice, 0, "storm: no key executed twice")
        or diag explain { map { $_ => $n->{$_} } @twice[0 .. 4] };
    ok(!grep({ $_ != 200 && $_ != 409 } keys %status),
       "storm: every answer is the original, a replay or a 409")
        or diag explain \%status;
    ok(!$bad_bodies, "storm: all 200s of a key carry the same body");
    diag("storm: $rounds rounds x 20: " . join ', ',
         map { "$_ x $status{$_}" } sort keys %status);
}

# 2. upstream failures: one never reached is released and a retry runs;
# one that got the request and failed may have run: its retries are told
# the outcome is unknown, with the status the first one got
{
    for my $case (['/refused', 502, 'new'], ['/fake/reset', 502, 'unknown'],
                  ['/fake/hang', 504, 'unknown'])
    {
        my ($path, $code, $then) = @$case;
        my $key = "$run-up$path";
        my $a = http_post($edge_ports[0], $key, 'x', $path);
        my $b = http_post($edge_ports[1], $key, 'x', $path);
        is("$a->{status} $b->{status}", "$code $code", "$path: $code twice");
        is($b->{body} =~ /"code":"outcome-unknown"/ ? 'unknown' : 'new',
           $then, "...the retry: $then");
    }

    my $key = "$run-midbody";
    my $a = http_post($edge_ports[0], $key, 'x', '/fake/midbody');

    # the unknown outcome is written as the request ends, after the client
    # saw the connection close: a retry at once may still meet the claim
    sleep 0.3;
    my $b = http_post($edge_ports[0], $key, 'x', '/fake/midbody');
    is("$a->{status} $b->{status}", "200 502",
       "mid-body: the header, then outcome-unknown");
    like($b->{body}, qr/"code":"outcome-unknown"/, "...as a problem");
    my $hits = grep { /midbody/ } lines_of($hits_file);
    is($hits, 1, "upstream closing mid-body: it ran once, never again");
    unlike($b->{head}, qr/Idempotent-Replayed/, "...and is no replay");
}

# 3. client aborts
{
    my $key = "$run-abort";
    my $s = IO::Socket::INET->new("127.0.0.1:$edge_ports[0]") or die;
    print $s "POST /slow HTTP/1.1\r\nHost: x\r\nIdempotency-Key: $key\r\n"
        . "Content-Length: 1\r\n\r\nx";
    sleep 0.1;
    close $s;
    sleep 0.8;
    my $r = http_post($edge_ports[1], $key, 'x', '/slow');
    is($r->{status}, 200, "client gone (ignore_client_abort on): retry 200");
    like($r->{head}, qr/Idempotent-Replayed: true/,
         "...replayed: the first client's result was stored");
    is(execs()->{$key}, 1, "...and executed once");

    # proxy_ignore_client_abort off (*-abortable): the owner's upstream is
    # kept anyway; 500 KB cannot be written to the gone client, it is
    # captured alone (/slow-big: with proxy_ignore_client_abort on)
    for my $case (['/slow-abortable', qr/^slow [0-9a-f]{32}\n\z/],
                  ['/slow-big-abortable', qr/\A(?:0123456789){50000}\z/],
                  ['/slow-big', qr/\A(?:0123456789){50000}\z/])
    {
        my ($path, $body) = @$case;
        $key = "$run-abort-noignore$path";
        $s = IO::Socket::INET->new("127.0.0.1:$edge_ports[0]") or die;
        print $s "POST $path HTTP/1.1\r\nHost: x\r\n"
            . "Idempotency-Key: $key\r\nContent-Length: 1\r\n\r\nx";
        sleep 0.1;
        close $s;
        sleep 0.8;
        $r = http_post($edge_ports[1], $key, 'x', $path);
        is($r->{status}, 200, "$path: client gone: retry 200");
        like($r->{head}, qr/Idempotent-Replayed: true/,
             "...replayed: the upstream's answer was read and stored");
        like($r->{body}, $body, "...byte-exact");
        is(execs()->{$key}, 1, "...and executed once");
    }
}

# load generator: unique keys, one at a time, records each answer
sub load {
    my ($seconds, $tag) = @_;
    pipe(my $rd, my $wr);
    my $pid = fork // die;
    if ($pid == 0) {
        close $rd;
        my $end = time + $seconds;
        my $n = 0;
        while (time < $end) {
            my $t = time;
            my $r = http_post($edge_ports[$n % 2], "$run-$tag-$n", 'x',
                              '/pay', '', 5);
            printf $wr "%.3f %d %.3f %d\n", $t, $r->{status}, $r->{took},
                $n % 2;
            $n++;
        }
        exit 0;
    }
    close $wr;
    return sub {
        my @rows = map { [split] } <$rd>;
        waitpid $pid, 0;
        return \@rows;
    };
}

# 4. Redis killed with SIGKILL under load, restarted 2 s later
{
    my $done = load(6, 'kill');
    sleep 1.5;
    my $pid = redis_pid();
    kill 'KILL', $pid;
    my $down = time;
    sleep 2;
    system($redis_sh, 'start', $redis_port);
    my $up = time;
    my $rows = $done->();

    my @slow = grep { $_->[2] > ($timeout_ms / 1000 + 0.2) * $slow } @$rows;
    my @bad = grep { $_->[1] != 200 && $_->[1] != 503 } @$rows;
    my @late = grep { $_->[1] != 200 && $_->[0] > $up + $slow } @$rows;
    my @early = grep { $_->[1] != 200 && $_->[0] < $down - 0.05 } @$rows;
    ok(@$rows > 50, "kill -9: load ran (" . scalar(@$rows) . " requests)");
    is(scalar @bad, 0, "kill -9: only 200 or 503, no other failure")
        or diag explain [ @bad[0 .. 4] ];
    is(scalar @slow, 0, "kill -9: no answer slower than the redis timeout")
        or diag explain [ @slow[0 .. 4] ];
    is(scalar @early + scalar @late, 0,
       "kill -9: 503 only while Redis was down, protected within 1 s after");
    my @down = grep { $_->[0] > $down + 0.1 && $_->[0] < $up - 0.1 } @$rows;
    my @rejected = grep { $_->[3] == 0 && $_->[1] == 503 } @down;
    my @passed = grep { $_->[3] == 1 && $_->[1] == 200 } @down;
    ok(@rejected && !grep({ $_->[3] == 0 && $_->[1] != 503 } @down),
       "kill -9: reject: every request while down got 503");
    ok(@passed && !grep({ $_->[3] == 1 && $_->[1] != 200 } @down),
       "kill -9: pass: every request while down was proxied (200)");
    my ($first_ok) = grep { $_->[1] == 200 && $_->[0] > $up } @$rows;
    diag(sprintf "kill -9: recovered %.2f s after the restart",
         $first_ok ? $first_ok->[0] - $up : -1);
}

# 5. Redis stalls (SIGSTOP): timeouts fire, the connection is re-made, late
# replies are dropped
{
    my $stall = $full ? 3 : 1.5;
    my $done = load($stall + 3, 'stall');
    sleep 1;
    my $pid = redis_pid();
    kill 'STOP', $pid;
    my $t0 = time;
    sleep $stall;
    kill 'CONT', $pid;
    my $t1 = time;
    my $rows = $done->();
    my @slow = grep { $_->[2] > ($timeout_ms / 1000 + 0.2) * $slow } @$rows;
    my @late = grep { $_->[1] != 200 && $_->[0] > $t1 + $slow } @$rows;
    my @bad = grep { $_->[1] != 200 && $_->[1] != 503 } @$rows;
    is(scalar @bad, 0, "stall: only 200 or 503");
    is(scalar @slow, 0, "stall: every answer within the redis timeout");
    is(scalar @late, 0, "stall: protected again within 1 s of SIGCONT");
}

# 6. graceful reload under load: nothing fails, nothing runs twice
{
    my $secs = $full ? 20 : 5;
    my $done = load($secs + 0.5, 'reload');
    for (1 .. $secs) {
        sleep 1;
        nginx_signal($edges[0], 'reload');
    }
    my $rows = $done->();
    my @bad = grep { $_->[1] != 200 } @$rows;
    is(scalar @bad, 0, "reload x $secs under load: no failed request")
        or diag explain [ @bad[0 .. 4] ];
    my $n = execs();
    is(scalar(grep { /-reload-/ && $n->{$_} > 1 } keys %$n), 0,
       "reload: no double execution");
    sleep 1;
    # old workers of this test's masters only: other nginx may run
    my %ours = map { my ($p) = lines_of("$_/logs/nginx.pid"); chomp $p;
                     ($p => 1) } @edges;
    my @old = grep { /shutting down/ && /^\s*\d+\s+(\d+)/ && $ours{$1} }
              `ps ax -o pid,ppid,args`;
    is(scalar @old, 0, "reload: old workers have exited");
}

# 7. every key the module wrote carries a TTL
{
    my ($no_ttl, $seen) = (0, 0);
    for (1 .. 200) {
        my $k = redis_cli('RANDOMKEY');
        next unless $k =~ /^idem:/;
        $seen++;
        $no_ttl++ if redis_cli('PTTL', $k) < 0;
    }
    ok($seen > 0, "records sampled: $seen");
    is($no_ttl, 0, "every sampled record has a TTL");
}

nginx_stop($_) for @edges, $backend;
kill 'TERM', $fake;
waitpid $fake, 0;

for my $dir (@edges, $backend) {
    my @p = log_problems("$dir/logs/error.log");
    is(scalar @p, 0, "$dir: no crash, alert or socket left") or diag @p;
}

done_testing();
