# A fleet of nginx instances sharing one Redis (SPEC §1): parallel
# duplicates execute once across instances; Redis restarts are survived
# without a reload; Expect: 100-continue.
# Plain Test::More: it starts its own nginx instances with master processes.
use strict;
use warnings;
use lib 't/lib';
use Test::More;
use Fleet;
use Time::HiRes qw(sleep time);

plan skip_all => 'TEST_NGINX_LOAD_MODULES must name the module'
    unless have_module();

my $redis_port = $ENV{TEST_NGINX_REDIS_PORT} || 6379;
my $slow = $ENV{TEST_ASAN} ? 4 : 1;    # AddressSanitizer is slow
my $timeout_ms = 500 * $slow;
my ($backend_port, @ports) = (19900, 19901, 19902);
my ($tls_port, $h2c_port) = (19903, 19904);
my $redis = 'util/redis.sh';

my $root = fleet_root('fleet');

system("openssl req -x509 -newkey rsa:2048 -nodes -days 2 -subj /CN=localhost"
       . " -keyout $root/key.pem -out $root/cert.pem 2>/dev/null") == 0
    or die "openssl req failed";

sub executions { scalar(my @l = lines_of("$root/backend/logs/exec.log")) }

my $backend = nginx_conf('backend', <<"EOC");
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
    push @edges, nginx_conf("edge$i", <<"EOC");
    idempotency_redis 127.0.0.1:$redis_port;
    idempotency_redis_timeout ${timeout_ms}ms;
    server {
        listen 127.0.0.1:$ports[$i];
        location = /pay {
            idempotency on;
            proxy_ignore_client_abort on;
            proxy_pass http://127.0.0.1:$backend_port;
        }
    }
    server {
        listen 127.0.0.1:@{[ $i ? $h2c_port : $tls_port ]}
               @{[ $i ? '' : 'ssl' ]} http2;
        ssl_certificate $root/cert.pem;
        ssl_certificate_key $root/key.pem;
        location = /pay {
            idempotency on;
            add_header X-Idem \$idempotency_status always;
            proxy_pass http://127.0.0.1:$backend_port;
        }
    }
EOC
}

nginx_start($_) for $backend, @edges;
sleep 0.5;

# 1. 50 identical POSTs at once, spread over two instances (2 workers each)
{
    my $key = "fleet-" . time();
    my $res = http_burst([ map { [$ports[$_ % 2], $key, '{"amount":5}'] }
                           1 .. 50 ]);
    my (%st, %bodies);
    for (@$res) {
        $st{ $_->{status} }++;
        $bodies{ $_->{body} }++ if $_->{status} == 200;
    }
    is(settled(\&executions), 1,
       "50 parallel duplicates on 2 instances executed once")
        or diag explain \%st;
    ok(!grep({ $_ != 200 && $_ != 409 } keys %st),
       "every answer is the original, a replay or a 409")
        or diag explain \%st;
    is(scalar keys %bodies, 1, "every 200 carries the same body");

    # after the original finished every instance replays it
    my $r0 = http_post($ports[0], $key, '{"amount":5}');
    my $r1 = http_post($ports[1], $key, '{"amount":5}');
    is("$r0->{status} $r1->{status}", "200 200",
       "both instances replay once it completed");
    is($r0->{body}, $r1->{body}, "the replays are identical");
    is(executions(), 1, "still one execution");
}

# 2. Redis stopped: 503 within the timeout; restarted: protected again
{
    system($redis, 'stop', $redis_port);
    my $r = http_post($ports[0], "fleet-down-" . time(), 'x');
    is($r->{status}, 503, "Redis down: 503");
    cmp_ok($r->{took}, '<', ($timeout_ms / 1000 + 0.1) * $slow,
           "answered within the redis timeout");

    system($redis, 'start', $redis_port);
    my ($back, $t1) = (undef, time);
    for (1 .. 40) {
        if (http_post($ports[0], "fleet-up-$_-" . time(), 'x')->{status}
            == 200)
        {
            $back = time - $t1;
            last;
        }
        sleep 0.05;
    }
    ok(defined $back, "Redis restarted: protected again without a reload");
    cmp_ok($back // 99, '<', 1 * $slow, "recovered within 1 s");
    diag(sprintf "recovery after restart: %.2f s", $back // -1);

    my $key = "fleet-after-" . time();
    my $a = http_post($ports[0], $key, 'x');
    my $b = http_post($ports[1], $key, 'x');
    is("$a->{status} $b->{status}", "200 200", "new, then replay elsewhere");
    like($b->{head}, qr/Idempotent-Replayed: true/, "the second is a replay");
}

# 3. Expect: 100-continue, as curl sends it
{
    my $key = "fleet-expect-" . time();
    my $curl = "curl -s --max-time 10 -o /dev/null -H 'Expect: 100-continue'"
        . " -H 'Idempotency-Key: $key' --data-binary '" . ("a" x 2048) . "'";
    my $first = `$curl -w '%{http_code}' http://127.0.0.1:$ports[0]/pay`;
    my $hdr = `$curl -D - http://127.0.0.1:$ports[1]/pay`;
    is($first, '200', "100-continue: executed");
    like($hdr, qr/Idempotent-Replayed: true/, "100-continue: replayed");
}

# 4. HTTP/2 over TLS and in clear text, HTTP/1.0: same key, same answers
{
    my $key = "fleet-h2-" . time();
    my $curl = "curl -sk --max-time 10 -D - -H 'Idempotency-Key: $key'"
        . " --data-binary '" . ("b" x 70000) . "'";
    my $a = `$curl --http2 https://127.0.0.1:$tls_port/pay`;
    my $b = `$curl --http2-prior-knowledge http://127.0.0.1:$h2c_port/pay`;
    my $c = `$curl --http1.0 http://127.0.0.1:$ports[0]/pay`;
    like($a, qr{^HTTP/2 200.*^x-idem: new}ms, "h2 over TLS: executed");
    like($b, qr{^HTTP/2 200.*^x-idem: replay}ms, "h2c: replayed");
    like($c, qr{^HTTP/1\.[01] 200.*^Idempotent-Replayed: true}ms,
         "HTTP/1.0: replayed");
    my ($ba) = $a =~ /\r\n\r\n(.*)\z/s;
    my ($bc) = $c =~ /\r\n\r\n(.*)\z/s;
    is($bc, $ba, "the same body over every protocol");
}

# 5. an HTTP/2 or TLS client that goes away while its request runs upstream
# (proxy_ignore_client_abort off): the answer is still read and stored
for my $proto (["--http2-prior-knowledge", "http://127.0.0.1:$h2c_port"],
               ["--http2", "https://127.0.0.1:$tls_port"],
               ["--http1.1", "https://127.0.0.1:$tls_port"])
{
    my ($flag, $url) = @$proto;
    my $key = "fleet-h2-abort-$flag-" . time();
    my $before = executions();
    system("curl -sk --max-time 0.2 -o /dev/null $flag"
           . " -H 'Idempotency-Key: $key' --data-binary x $url/pay");
    sleep 0.8 * $slow;
    my $r = http_post($ports[0], $key, 'x');
    is($r->{status}, 200, "$flag: client gone, retry 200");
    like($r->{head}, qr/Idempotent-Replayed: true/,
         "...a replay of the answer read after the client left");
    is(settled(\&executions) - $before, 1, "...executed once");
}

nginx_stop($_) for @edges, $backend;

for my $dir (@edges) {
    my @p = log_problems("$dir/logs/error.log");
    is(scalar @p, 0, "$dir: no crash, alert or socket left") or diag @p;
}

done_testing();
