# The production nginx.conf of docs/operations.md ("A production
# configuration", its first ```nginx block) works as written: only what
# must differ on a test machine is replaced (the module's path, addresses
# and ports, file paths, a shorter proxy_read_timeout), each replacement
# must match exactly once, and the key files and certificate are made
# here with openssl.  Then real requests check what its comments promise.
# Plain Test::More: the edge on 20610 (TLS), metrics 20611, admin 20612,
# the payments upstream 20613 and the auth service 20614 (echo module).
use strict;
use warnings;
use lib 't/lib';
use Test::More;
use Fleet;
use JSON::PP;
use Time::HiRes qw(sleep);

my ($module) = have_module();
plan skip_all => 'TEST_NGINX_LOAD_MODULES must name the module'
    unless $module;

my $rp = $ENV{TEST_NGINX_REDIS_PORT} || 6379;
my ($edge, $metrics, $admin, $pay, $auth) = (20610 .. 20614);
my $root = fleet_root('production');
my $dir = "$root/edge";
mkdir $_ for $dir, "$dir/conf", "$dir/logs", "$dir/keys", "$dir/tls";

open my $fh, '<', 'docs/operations.md' or die "docs/operations.md: $!";
my $doc = do { local $/; <$fh> };
close $fh;

my ($section) = $doc =~ /^## A production configuration\n(.*?)^## /ms;
my ($conf) = ($section // '') =~ /```nginx\n(.*?)```/s;
ok(defined $conf && $conf =~ /^load_module /m,
   'operations.md has a complete nginx.conf under "A production '
   . 'configuration"') or BAIL_OUT('no conf');

# subst(pattern, replacement, what): exactly one match, or the docs changed
# under the test
sub subst {
    my ($re, $to, $what) = @_;
    my $n = () = $conf =~ /$re/g;
    is($n, 1, "the conf has one $what") or return;
    $conf =~ s/$re/$to/;
}

subst(qr{^load_module \S+;$}m, "load_module $module;", 'load_module');
subst(qr{^pid \S+;$}m, 'pid logs/nginx.pid;', 'pid');
$conf =~ s{^user \S+;\n}{}m unless $> == 0;
subst(qr{idempotency_redis +\K[\d.]+:6379}, "127.0.0.1:$rp", 'Redis');
subst(qr{upstream payments \{\s*server \K[\d.]+:\d+}, "127.0.0.1:$pay",
      'payments server');
subst(qr{upstream auth \{\s*server \K[\d.]+:\d+}, "127.0.0.1:$auth",
      'auth server');
subst(qr{^ *listen \K443 }m, "127.0.0.1:$edge ", 'listen 443');
# nginx 1.25.1 deprecated "listen ... http2": the conf's comment says what
# to write there instead, and that is what this nginx gets.  The version
# is the "nginx version:" line of -V: Angie's -v prints only its own
my $bin = $ENV{TEST_NGINX_BINARY} || 'nginx';
my ($version) = `$bin -V 2>&1` =~ m{^nginx version: \S*?/(\d+\.\d+\.\d+)}m;
my $h2 = sprintf('%03d%03d%03d', split /\./, $version // '0.0.0')
         ge '001025001';
if ($h2) {
    like($conf,
         qr/# nginx 1\.25\.1 and later: "listen 443 ssl;" and "http2 on;"/,
         'the conf says what nginx 1.25.1 and later want for HTTP/2');
    is($conf =~ s/(listen \S+ ssl) http2;/$1;\n        http2 on;/g, 1,
       'listen ... http2 becomes listen ... ssl and http2 on');
}
subst(qr{listen 9145;}, "listen 127.0.0.1:$metrics;", 'listen 9145');
subst(qr{listen 127\.0\.0\.1:9146;}, "listen 127.0.0.1:$admin;",
      'listen 9146');
subst(qr{proxy_read_timeout 60s;}, 'proxy_read_timeout 2s;',
      'proxy_read_timeout');
$conf =~ s{/var/log/nginx/}{$dir/logs/}g;
$conf =~ s{/etc/nginx/idempotency/}{$dir/keys/}g;
$conf =~ s{/etc/nginx/tls/}{$dir/tls/}g;
unlike($conf =~ s/#.*//gr, qr{/etc/|/var/|/run/}, 'no system path is left');

my ($password) = $conf =~ /user=idem password=(\S+);/;
ok($password, 'Redis is used by the ACL user "idem"');

# the key files as the comments say: openssl rand 32 > FILE, mode 600
for my $f ($conf =~ m{(\Q$dir\E/keys/\S+);}g) {
    system("openssl rand 32 > '$f' && chmod 600 '$f'") == 0
        or die "openssl rand: $?";
}
my ($crt) = $conf =~ /ssl_certificate +(\S+);/;
my ($key) = $conf =~ /ssl_certificate_key +(\S+);/;
system("openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 "
       . "-nodes -days 2 -subj /CN=api.example.com -keyout '$key' "
       . "-out '$crt' >/dev/null 2>&1") == 0 or die 'openssl req failed';

# the ACL user of operations.md's Security section, with the conf's
# password: the configuration runs with the rights the docs give it
my ($acl) = $doc =~ /`(ACL SETUSER idem on >secret [^`]+)`/;
ok($acl, 'Security has the ACL line') or BAIL_OUT('no ACL');
$acl =~ s/\s+/ /g;
$acl =~ s/>secret/>$password/;
redis_cli('ACL', 'DELUSER', 'idem');
is(redis_cli(split / /, $acl), 'OK', 'the ACL user is created');

open my $out, '>', "$dir/conf/nginx.conf" or die $!;
print $out $conf;
close $out;

my $t = `$bin -t -p $dir/ -c conf/nginx.conf 2>&1`;
like($t, qr/test is successful/, 'nginx -t accepts it') or diag $t;
unlike(own_warnings($t), qr/\[(warn|emerg|alert|crit)\]/, 'and prints no warning')
    or diag $t;

# the stand-ins: an auth service that maps tokens to accounts (two
# tokens of one account: a refreshed token), and a payments API that
# logs every execution by key; /v1/payments/slow outlives the timeout
my $authd = nginx_conf('auth', <<"EOC", 1);
    map \$http_authorization \$account {
        "Bearer tok-alice-1" acct_alice;
        "Bearer tok-alice-2" acct_alice;
        "Bearer tok-bob"     acct_bob;
    }
    server {
        listen 127.0.0.1:$auth;
        location = /v1/introspect {
            if (\$account = "") { return 401; }
            add_header X-Account-Id \$account;
            return 204;
        }
    }
EOC
my $payd = nginx_conf('payments', <<"EOC", 1);
    log_format runs '\$http_idempotency_key \$uri';
    server {
        listen 127.0.0.1:$pay;
        access_log $root/payments/logs/runs.log runs;
        default_type application/json;
        location /v1/payments {
            echo_status 201;
            echo '{"id":"pay_\$request_id"}';
        }
        location = /v1/payments/slow {
            echo_sleep 4;
            echo_status 201;
            echo '{"id":"pay_\$request_id"}';
        }
    }
EOC
nginx_start($authd);
nginx_start($payd);
nginx_start($dir);

# req(url, [headers], body) -> {status, head, body, json}: curl, the way
# a client would send it
sub req {
    my ($url, $headers, $body, @extra) = @_;
    my @cmd = ('curl', '-sk', '--http1.1', '-m', '20', '-i', '-H', 'Expect:',
               @extra);
    push @cmd, map { ('-H', $_) } @{ $headers || [] };
    push @cmd, '-X', 'POST', '--data-binary', $body if defined $body;
    open my $c, '-|', @cmd, $url or die "curl: $!";
    my $res = do { local $/; <$c> } // '';
    close $c;
    my ($h, $b) = split /\r\n\r\n/, $res, 2;
    my ($status) = ($h // '') =~ m{^HTTP/\S+ (\d+)};
    my $json = eval { decode_json($b // '') };
    return { status => $status // 0, head => $h // '', body => $b // '',
             json => $json };
}

sub header {
    my ($r, $name) = @_;
    my ($v) = $r->{head} =~ /^\Q$name\E: *([^\r\n]*)/mi;
    return $v;
}

# runs(key, expected): the executions of key that the payments API
# logged, once there are as many as expected (it logs after it answered;
# a busy machine gets up to 10 s), and a moment more for any beyond
sub runs {
    my ($k, $want) = @_;
    my $n = sub {
        scalar grep { /^\Q$k\E / } lines_of("$payd/logs/runs.log");
    };
    for (1 .. 100) {
        last if $n->() >= ($want // 0);
        sleep 0.1;
    }
    sleep 0.3;
    return $n->();
}

# a problem document as RFC 9457 has it, with status
sub is_problem {
    my ($r, $status, $name) = @_;
    is($r->{status}, $status, "$name: $status");
    like(header($r, 'Content-Type') // '', qr{^application/problem\+json},
         "$name: application/problem+json");
    is(ref $r->{json} && $r->{json}{status}, $status,
       "$name: a JSON body with status $status") or diag $r->{body};
    ok(ref $r->{json} && $r->{json}{title} && $r->{json}{detail}
       && $r->{json}{type}, "$name: type, title and detail");
}

my $url = "https://127.0.0.1:$edge/v1/payments";
my @alice = ('Authorization: Bearer tok-alice-1',
             'Content-Type: application/json');
my $k = "prod-$$";

# a POST runs once; its retry, with a refreshed token, replays
my $r1 = req($url, [@alice, "Idempotency-Key: $k-1"], '{"amount":1000}');
is($r1->{status}, 201, 'a first POST runs') or diag $r1->{head};
my $r2 = req($url, ['Authorization: Bearer tok-alice-2',
                    "Idempotency-Key: $k-1"], '{"amount":1000}');
is($r2->{status}, 201, 'its retry with a refreshed token: 201');
is(header($r2, 'Idempotent-Replayed'), 'true', 'replayed');
is($r2->{body}, $r1->{body}, 'the same body, the same payment id');
my $r3 = req($url, [@alice, "Idempotency-Key: $k-1"], '{"amount":1000}',
             '--http2');
like($r3->{head}, qr{^HTTP/2 201}, 'a retry over HTTP/2: 201');
is(header($r3, 'Idempotent-Replayed'), 'true', 'replayed over HTTP/2');
is(runs("$k-1", 1), 1, 'the upstream ran it once');

my $bob = req($url, ['Authorization: Bearer tok-bob',
                     "Idempotency-Key: $k-1"], '{"amount":1000}');
is($bob->{status}, 201, 'another tenant with the same key: its own');
isnt(header($bob, 'Idempotent-Replayed'), 'true', 'not replayed');

# idempotency_required on
my $nokey = req($url, [@alice], '{"amount":1000}');
is_problem($nokey, 400, 'no key');
is($nokey->{json}{code}, 'missing-key', 'missing-key');

# the access log: status and the key's hash, never the key
my ($line) = grep { /idem=new / } lines_of("$dir/logs/api.log");
my ($hash) = ($line // '') =~ /key=([0-9a-f]{64}) tenant=acct_alice /;
ok($hash, 'the access log has the status, the key hash and the tenant')
    or diag $line;
unlike(join('', lines_of("$dir/logs/api.log")), qr/\Q$k\E/,
       'and never the raw key');

# metrics on their own port
my $m = req("http://127.0.0.1:$metrics/metrics");
is($m->{status}, 200, 'metrics answer');
like(header($m, 'Content-Type'), qr{^text/plain; version=0\.0\.4},
     'in the Prometheus text format');
like($m->{body},
     qr/^nginx_idempotency_requests_total\{[^}]*zone="payments"[^}]*status="replay"[^}]*\} 2$/m,
     'counting the two replays in zone "payments"');

# the admin on loopback shows the key by its hash, opened with the key
my $adm = req("http://127.0.0.1:$admin/idempotency/admin?hash="
            . ($hash // ''));
is($adm->{status}, 200, 'the admin shows the key by ?hash=')
    or diag $adm->{body}, redis_cli('ACL', 'LOG', '3');
is(ref $adm->{json} && $adm->{json}{state}, 'completed', 'completed');
is(ref $adm->{json} && $adm->{json}{status}, 201, 'status 201');
ok(ref $adm->{json} && ref $adm->{json}{sealed} && $adm->{json}{sealed}{opened},
   'sealed, and opened with the configured key') or diag $adm->{body};
unlike(join('', lines_of("$dir/logs/admin.log")), qr/hash=/,
       'the admin log has no query');

# a body over client_max_body_size: 413, by Content-Length and chunked
open my $bf, '>', "$dir/big" or die $!;
print $bf 'x' x (1024 * 1024 + 1);
close $bf;
my $big = "\@$dir/big";
my $r413 = req($url, [@alice, "Idempotency-Key: $k-big"], $big);
is_problem($r413, 413, 'a body over the limit');
my $r413c = req($url, [@alice, "Idempotency-Key: $k-bigc",
                       'Transfer-Encoding: chunked'], $big);
is_problem($r413c, 413, 'a chunked body over the limit');
is(runs("$k-big") + runs("$k-bigc"), 0, 'neither ran');

# the upstream down: 502, released, and the retry runs once it is back
nginx_stop($payd);
sleep 0.3;
my $down = req($url, [@alice, "Idempotency-Key: $k-2"], '{"amount":2}');
is_problem($down, 502, 'the upstream down');
isnt(lc(header($down, 'x-should-retry') // ''), 'false',
     'no "do not retry" hint: nothing ran');
nginx_start($payd);
sleep 0.3;
my $back = req($url, [@alice, "Idempotency-Key: $k-2"], '{"amount":2}');
is($back->{status}, 201, 'the retry runs once the upstream is back')
    or diag $back->{head};
is(runs("$k-2", 1), 1, 'once');

# an upstream that got the request and never answered: 504, unknown
my $slow = "$url/slow";
my $t504 = req($slow, [@alice, "Idempotency-Key: $k-3"], '{"amount":3}');
is_problem($t504, 504, 'a timeout after the request was sent');
is(header($t504, 'x-should-retry'), 'false', 'x-should-retry: false');
is(header($t504, 'Stripe-Should-Retry'), 'false',
   'Stripe-Should-Retry: false');
is(header($t504, 'Cache-Control'), 'no-store', 'Cache-Control: no-store');
my $u = req($slow, [@alice, "Idempotency-Key: $k-3"], '{"amount":3}');
is_problem($u, 504, 'its retry');
is(ref $u->{json} && $u->{json}{code}, 'outcome-unknown',
   'outcome-unknown, from the module');
is(runs("$k-3", 1), 1, 'the slow request ran once, the retry never');

# Redis too slow: the module's own 503, not the error page's
redis_cli('CLIENT', 'PAUSE', '1500', 'WRITE');
my $busy = req($url, [@alice, "Idempotency-Key: $k-4"], '{"amount":4}');
is_problem($busy, 503, 'Redis paused');
is(ref $busy->{json} && $busy->{json}{code}, 'store-unavailable',
   'the module\'s store-unavailable, error_page does not replace it');
is(header($busy, 'Retry-After'), '1', 'with Retry-After: 1');
sleep 1.5;

# what the access log says of each: the owner's 502 and 504 were claims
# (new), the 413s never were
my %idem;
for (lines_of("$dir/logs/api.log")) {
    my ($st, $idem, $key) = /" (\d+) idem=(\w+) key=(\S+)/ or next;
    push @{ $idem{$st} }, $idem;
}
is("@{ $idem{413} || [] }", 'bypass invalid',
   'logged 413s: bypass (Content-Length), invalid (chunked)');
is("@{ $idem{502} || [] }", 'new', 'logged 502: new (released)');
is("@{ $idem{504} || [] }", 'new unknown',
   'logged 504s: new (unknown outcome), unknown (its retry)');

my @problems = log_problems("$dir/logs/error.log");
is(scalar @problems, 0, 'no crash or alert') or diag @problems;

nginx_stop($_) for $dir, $payd, $authd;
redis_cli('ACL', 'DELUSER', 'idem');

done_testing();
