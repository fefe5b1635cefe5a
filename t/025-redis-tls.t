# TLS to Redis: "idempotency_redis ADDRESS tls" and the
# idempotency_redis_tls_* directives. A private CA signs the server
# certificate (SAN DNS:localhost, IP:127.0.0.1) and a client certificate;
# an unrelated CA signs nothing we use. Two TLS Redis instances, one that
# asks for a client certificate. Every refusal is a 503 within the timeout
# with one log line per failure streak; no key ever runs twice.
# Plain Test::More: its own nginx and Redis instances (ports 20700-20759).
# topology: yes (make test-topologies runs this file)
use strict;
use warnings;
use lib 't/lib';
use Test::More;
use Fleet;
use File::Path qw(make_path);
use Time::HiRes qw(sleep time);

plan skip_all => 'TEST_NGINX_LOAD_MODULES must name the module'
    unless have_module();

my $rp = $ENV{TEST_NGINX_REDIS_PORT} || 6379;
my $slow = $ENV{TEST_ASAN} ? 4 : 1;
my ($tls_port, $auth_port) = (20750, 20751);
my $next_port = 20700;

my $root = fleet_root('redistls');
my $pki = "$root/pki";
make_path($pki);

sub run { system(@_) == 0 or die "failed: @_" }

# certificates: a private CA, a server and a client certificate, and an
# unrelated CA
for my $ca (qw(ca other)) {
    run("openssl req -x509 -newkey rsa:2048 -nodes -days 2 -subj /CN=$ca"
        . " -keyout $pki/$ca.key -out $pki/$ca.crt 2>/dev/null");
}
for my $n (qw(redis client)) {
    run("openssl req -newkey rsa:2048 -nodes -subj /CN=$n"
        . " -keyout $pki/$n.key -out $pki/$n.csr 2>/dev/null");
}
open my $ext, '>', "$pki/san.ext" or die $!;
print $ext "subjectAltName=DNS:localhost,IP:127.0.0.1\n";
close $ext;
run("openssl x509 -req -in $pki/redis.csr -CA $pki/ca.crt -CAkey $pki/ca.key"
    . " -CAcreateserial -days 2 -extfile $pki/san.ext -out $pki/redis.crt"
    . " 2>/dev/null");
run("openssl x509 -req -in $pki/client.csr -CA $pki/ca.crt"
    . " -CAkey $pki/ca.key -CAcreateserial -days 2 -out $pki/client.crt"
    . " 2>/dev/null");

my @redis_pids;

sub redis_tls {
    my ($port, $auth) = @_;
    my $dir = "$root/redis-$port";
    make_path($dir);
    run("$ENV{REDIS_SERVER} --bind 127.0.0.1 --port 0 --tls-port $port"
        . " --tls-cert-file $pki/redis.crt --tls-key-file $pki/redis.key"
        . " --tls-ca-cert-file $pki/ca.crt --tls-auth-clients $auth"
        . " --save '' --appendonly no --daemonize yes --dir $dir"
        . " --pidfile $dir/pid --logfile $dir/log");
    for (1 .. 50) {
        last if -s "$dir/pid";
        sleep 0.1;
    }
    open my $fh, '<', "$dir/pid" or die "redis on $port did not start";
    my $pid = <$fh>;
    chomp $pid;
    push @redis_pids, $pid;
}

redis_tls($tls_port, 'no');
redis_tls($auth_port, 'yes');
sleep 0.3;

my @dirs;

END {
    nginx_stop($_) for @dirs;
    kill 'TERM', @redis_pids;
}

# one nginx per scenario: its log is that scenario's only
sub instance {
    my ($name, $redis) = @_;
    my $port = $next_port++;
    my $dir = nginx_conf($name, pay_server($name, $port,
        "idempotency_redis_timeout 500ms; $redis"), 1);
    nginx_start($dir);
    push @dirs, $dir;
    return ($dir, $port);
}

sub log_count {
    my ($dir, $re) = @_;
    return scalar grep { /$re/ } lines_of("$dir/logs/error.log");
}

sub runs { upstream_runs(@_) }

sub at_most_once {
    my ($dir, $what) = @_;
    my $runs = runs($dir);
    my @twice = grep { $runs->{$_} > 1 } keys %$runs;
    is(scalar @twice, 0, "$what: no key ran twice") or diag "@twice";
}

# works: new then replay, one upstream run
sub works {
    my ($name, $redis) = @_;
    my ($dir, $port) = instance($name, $redis);
    sleep 0.3 * $slow;

    my $a = http_post($port, "tls-$name", 'x');
    my $b = http_post($port, "tls-$name", 'x');
    is("$a->{status} $b->{status}", "201 201", "$name: new, then replay");
    like($a->{head}, qr/X-Idem: new/, "$name: the first is new");
    like($b->{head}, qr/X-Idem: replay/, "$name: the second a replay");
    is(runs($dir)->{"tls-$name"}, 1, "$name: the upstream ran once");
    is(log_count($dir, qr/connected to redis/), 1, "$name: connected");
    is(scalar log_problems("$dir/logs/error.log"), 0, "$name: no alert");
    return $dir;
}

# refused: every request a quick 503, the upstream never runs, and the
# reason is logged once for the whole failure streak
sub refused {
    my ($name, $redis, $reason) = @_;
    my ($dir, $port) = instance($name, $redis);
    sleep 0.3 * $slow;

    my @st;
    my $slowest = 0;
    for my $i (1 .. 3) {
        my $r = http_post($port, "tls-$name", 'x', undef, undef, 5);
        push @st, $r->{status};
        $slowest = $r->{took} if $r->{took} > $slowest;
        sleep 0.2;
    }
    is("@st", "503 503 503", "$name: 503");
    cmp_ok($slowest, '<', 0.5 + 0.5 * $slow, "$name: within the timeout");
    is(runs($dir)->{"tls-$name"} // 0, 0, "$name: the upstream never ran");
    is(log_count($dir, $reason), 1, "$name: the reason, logged once")
        or diag grep { /error|crit/ } lines_of("$dir/logs/error.log");
    is(log_count($dir, qr/connected to redis/), 0, "$name: never connected");
    is(scalar log_problems("$dir/logs/error.log"), 0, "$name: no alert");
    return $dir;
}

my $ca = "idempotency_redis_tls_trusted_certificate $pki/ca.crt;";

{
    my $dir = works('ip', "idempotency_redis 127.0.0.1:$tls_port tls; $ca");

    # a reload: new workers connect, the old ones leave no socket behind
    nginx_signal($dir, 'reload');
    sleep 1 * $slow;
    my $port = $next_port - 1;
    my $r = http_post($port, 'tls-ip', 'x');
    like($r->{head}, qr/X-Idem: replay/, "ip: replayed after a reload");
    is(log_count($dir, qr/connected to redis/), 2,
       "ip: the new worker connected");
    is(scalar log_problems("$dir/logs/error.log"), 0,
       "ip: no alert, no open socket left");
}
works('name', "idempotency_redis localhost:$tls_port tls; $ca");
works('tls_name', "idempotency_redis 127.0.0.1:$tls_port tls; $ca"
      . " idempotency_redis_tls_name localhost;");

refused('other_ca', "idempotency_redis 127.0.0.1:$tls_port tls;"
        . " idempotency_redis_tls_trusted_certificate $pki/other.crt;",
        qr/\[error\].*TLS certificate verify failed/);

refused('wrong_name', "idempotency_redis 127.0.0.1:$tls_port tls; $ca"
        . " idempotency_redis_tls_name redis.example.com;",
        qr/\[error\].*does not match "redis\.example\.com"/);

# a plain-text Redis answers a ClientHello with an error or not at all
refused('plain', "idempotency_redis 127.0.0.1:$rp tls; $ca",
        qr/\[error\].*(TLS handshake failed with|timed out in the TLS)/);

# and plain text to a TLS port: Redis drops it
refused('no_tls', "idempotency_redis 127.0.0.1:$tls_port;",
        qr/\[error\].*(lost the connection to|did not answer)/);

works('verify_off', "idempotency_redis 127.0.0.1:$tls_port tls;"
      . " idempotency_redis_tls_trusted_certificate $pki/other.crt;"
      . " idempotency_redis_tls_verify off;");

works('client_cert', "idempotency_redis 127.0.0.1:$auth_port tls; $ca"
      . " idempotency_redis_tls_certificate $pki/client.crt;"
      . " idempotency_redis_tls_certificate_key $pki/client.key;");

# TLS 1.3: the server refuses the missing certificate after the handshake
refused('no_client_cert', "idempotency_redis 127.0.0.1:$auth_port tls; $ca",
        qr/\[error\].*(TLS handshake failed with|lost the connection to)/);

# the configuration is checked by nginx -t
{
    my $dir = nginx_conf('badconf', <<"EOC", 1);
    server {
        listen 127.0.0.1:$next_port;
        location / {
            idempotency on;
            idempotency_redis unix:/tmp/none.sock tls;
        }
    }
EOC
    my $out = `${\ ($ENV{TEST_NGINX_BINARY} || 'nginx')} -t -p $dir/ -c conf/nginx.conf 2>&1`;
    like($out, qr/needs "idempotency_redis_tls_name"/,
         "a verified unix socket needs a name");
}

# one connection per target: its TLS settings are the same everywhere
{
    my $dir = nginx_conf('twoconf', <<"EOC", 1);
    server {
        listen 127.0.0.1:$next_port;
        idempotency_redis 127.0.0.1:$tls_port tls;
        idempotency_redis_tls_trusted_certificate $pki/ca.crt;
        location /a {
            idempotency on;
        }
        location /b {
            idempotency on;
            idempotency_redis_tls_name localhost;
        }
    }
EOC
    my $out = `${\ ($ENV{TEST_NGINX_BINARY} || 'nginx')} -t -p $dir/ -c conf/nginx.conf 2>&1`;
    like($out, qr/is used with different idempotency_redis_tls_\* settings/,
         "different TLS settings for one target are refused");
}

at_most_once($_, $_) for @dirs;

done_testing();
