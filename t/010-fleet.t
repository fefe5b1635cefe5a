# A fleet of nginx instances sharing one Redis (SPEC §1): parallel
# duplicates execute once across instances; Redis restarts are survived
# without a reload; Expect: 100-continue; graceful reload leaves no socket.
# Plain Test::More: it starts its own nginx instances with master processes.
use strict;
use warnings;
use Test::More;
use IO::Socket::INET;
use POSIX qw(:sys_wait_h);
use Time::HiRes qw(sleep time);
use File::Path qw(make_path remove_tree);
use Cwd qw(abs_path);

my $redis_port = $ENV{TEST_NGINX_REDIS_PORT} || 6379;
my $nginx = $ENV{TEST_NGINX_BINARY} || 'nginx';
my @modules = grep { $_ } split /\s+/, ($ENV{TEST_NGINX_LOAD_MODULES} || '');
plan skip_all => 'TEST_NGINX_LOAD_MODULES must name the module'
    unless grep { /idempotency/ } @modules;

my $root = abs_path('t') . '/servroot-fleet';
my $base = 19900;
my ($backend_port, @ports) = ($base, $base + 1, $base + 2);
my $redis = abs_path('util/redis.sh');

remove_tree($root);

sub conf {
    my ($name, $body) = @_;
    my $dir = "$root/$name";
    make_path("$dir/logs", "$dir/conf");
    my $load = join '', map { "load_module $_;\n" } @modules;
    open my $fh, '>', "$dir/conf/nginx.conf" or die $!;
    print $fh <<"EOC";
$load
worker_processes 2;
error_log logs/error.log info;
pid logs/nginx.pid;
events { worker_connections 1024; }
http {
    access_log off;
    client_body_temp_path $dir/body;
    proxy_temp_path $dir/proxy;
    $body
}
EOC
    close $fh;
    return $dir;
}

sub start {
    my $dir = shift;
    system($nginx, '-p', "$dir/", '-c', 'conf/nginx.conf') == 0
        or die "cannot start nginx in $dir";
}

sub stop {
    my $dir = shift;
    system($nginx, '-p', "$dir/", '-c', 'conf/nginx.conf', '-s', 'quit');
    for (1 .. 50) {
        last unless -e "$dir/logs/nginx.pid";
        sleep 0.1;
    }
}

sub post {
    my ($port, $key, $body) = @_;
    my $s = IO::Socket::INET->new(PeerAddr => "127.0.0.1:$port",
                                  Timeout => 10) or return (0, '');
    my $req = "POST /pay HTTP/1.1\r\nHost: x\r\nConnection: close\r\n"
        . "Idempotency-Key: $key\r\nContent-Length: " . length($body)
        . "\r\n\r\n$body";
    print $s $req;
    local $/;
    my $res = <$s> // '';
    my ($status) = $res =~ m{^HTTP/1\.1 (\d+)};
    my ($h, $b) = split /\r\n\r\n/, $res, 2;
    $b //= '';
    if (($h // '') =~ /^Transfer-Encoding: chunked/mi) {
        my $d = '';
        while ($b =~ s/\A([0-9a-f]+)\r\n//i) {
            my $n = hex $1;
            last if $n == 0;
            $d .= substr($b, 0, $n, '');
            $b =~ s/\A\r\n//;
        }
        $b = $d;
    }
    return ($status || 0, $b, $res);
}

sub executions {
    open my $fh, '<', "$root/backend/logs/exec.log" or return 0;
    my @l = <$fh>;
    return scalar @l;
}

my $backend = conf('backend', <<"EOC");
    log_format exec '\$request_id';
    server {
        listen 127.0.0.1:$backend_port;
        location / {
            access_log logs/exec.log exec;
            echo_sleep 0.5;
            echo "charged \$request_id";
        }
    }
EOC

my @edges;
for my $i (0, 1) {
    push @edges, conf("edge$i", <<"EOC");
    idempotency_redis 127.0.0.1:$redis_port;
    idempotency_redis_timeout 500ms;
    server {
        listen 127.0.0.1:$ports[$i];
        location = /pay {
            idempotency on;
            proxy_ignore_client_abort on;
            proxy_pass http://127.0.0.1:$backend_port;
        }
    }
EOC
}

start($_) for $backend, @edges;
sleep 0.5;

# 1. 50 identical POSTs at once, spread over two instances (2 workers each)
{
    my $key = "fleet-" . time();
    my @kids;
    for my $n (1 .. 50) {
        pipe(my $r, my $w);
        my $pid = fork // die;
        if ($pid == 0) {
            close $r;
            my ($st, $b) = post($ports[$n % 2], $key, '{"amount":5}');
            $b =~ s/\n//g;
            print $w "$st $b\n";
            exit 0;
        }
        close $w;
        push @kids, [$pid, $r];
    }
    my (%st, %bodies);
    for (@kids) {
        my ($pid, $r) = @$_;
        my $line = <$r> // "0 none\n";
        waitpid $pid, 0;
        chomp $line;
        my ($s, $b) = split / /, $line, 2;
        $st{$s}++;
        $bodies{$b}++ if $s == 200;
    }
    is(executions(), 1, "50 parallel duplicates on 2 instances executed once")
        or diag explain \%st;
    ok(!grep({ $_ != 200 && $_ != 409 } keys %st),
       "every answer is the original, a replay or a 409")
        or diag explain \%st;
    is(scalar keys %bodies, 1, "every 200 carries the same body");

    # after the original finished every instance replays it
    my ($s0, $b0) = post($ports[0], $key, '{"amount":5}');
    my ($s1, $b1) = post($ports[1], $key, '{"amount":5}');
    is("$s0 $s1", "200 200", "both instances replay once it completed");
    is($b0, $b1, "the replays are identical");
    is(executions(), 1, "still one execution");
}

# 2. Redis stopped: 503 within the timeout; restarted: protected again
{
    system($redis, 'stop', $redis_port);
    my $t0 = time;
    my ($st) = post($ports[0], "fleet-down-" . time(), 'x');
    my $took = time - $t0;
    is($st, 503, "Redis down: 503");
    cmp_ok($took, '<', 0.6 + 0.5, "answered within the redis timeout");

    system($redis, 'start', $redis_port);
    my $back;
    my $t1 = time;
    for (1 .. 40) {
        my ($s) = post($ports[0], "fleet-up-$_-" . time(), 'x');
        if ($s == 200) { $back = time - $t1; last }
        sleep 0.05;
    }
    ok(defined $back, "Redis restarted: protected again without a reload");
    cmp_ok($back // 99, '<', 1.5, "recovered within 1.5 s") ;
    diag(sprintf "recovery after restart: %.2f s", $back // -1);

    my $key = "fleet-after-" . time();
    my ($a) = post($ports[0], $key, 'x');
    my ($b, undef, $raw) = post($ports[1], $key, 'x');
    is("$a $b", "200 200", "new then replay after the restart");
    like($raw, qr/Idempotent-Replayed: true/, "the second one is a replay");
}

# 3. Expect: 100-continue, as curl sends it
{
    my $key = "fleet-expect-" . time();
    my $body = "a" x 2048;
    my @args = ('-s', '--max-time', '10', '-o', '/dev/null', '-w', '%{http_code}',
                '-H', 'Expect: 100-continue', '-H', "Idempotency-Key: $key",
                '--data-binary', $body, "http://127.0.0.1:$ports[0]/pay");
    my $first = `curl @{[ map { "'$_'" } @args ]}`;
    my $hdr = `curl -s --max-time 10 -D - -o /dev/null -H 'Expect: 100-continue' -H 'Idempotency-Key: $key' --data-binary '$body' http://127.0.0.1:$ports[1]/pay`;
    is($first, '200', "100-continue: executed");
    like($hdr, qr/Idempotent-Replayed: true/, "100-continue: replayed");
}

# 4. graceful reload under traffic: no failed request, no socket left
{
    my $pid = fork // die;
    if ($pid == 0) {
        my $fail = 0;
        for my $n (1 .. 16) {
            my ($s) = post($ports[0], "fleet-reload-$n-$$", 'x');
            $fail++ unless $s == 200;
        }
        exit($fail > 255 ? 255 : $fail);
    }
    for (1 .. 3) {
        sleep 1;
        system($nginx, '-p', "$edges[0]/", '-c', 'conf/nginx.conf',
               '-s', 'reload');
    }
    waitpid $pid, 0;
    is($? >> 8, 0, "no request failed during 3 reloads");
}

stop($_) for @edges, $backend;

for my $dir (@edges) {
    open my $fh, '<', "$dir/logs/error.log" or die;
    my @bad = grep { /\[(alert|crit|emerg)\]|open socket|AddressSanitizer/ }
              <$fh>;
    is(scalar @bad, 0, "$dir: no alert, crit or socket left in the log")
        or diag @bad;
}

done_testing();
