# idempotency_admin: the operator's view of one key. GET by key and scope
# or by the log-safe hash: state, status, times, sizes, fingerprint, the
# stored headers, the body with &body=1; 404 without a record. DELETE
# purges a completed or unknown record (204, logged at warn with the
# client), refuses an in-progress claim (409) unless &force=1.
# What an operator needs in an incident (issue 29, items 2, 3 and 9):
# nginx -t refuses a view that names no Redis; every refusal is
# problem+json that says what to send instead (no key, a malformed hash,
# a claim in flight: &force=1, no record, a client not on loopback without
# allow_remote); a sealed record without its key shows what is clear in
# it, not a 502; the purge's log line names the key by its hash, never the
# raw key or scope; the JSON stays JSON whatever bytes an upstream put in a
# header.
# Plain Test::More: its own nginx on 19996-19997.
use strict;
use warnings;
use lib 't/lib';
use Test::More;
use Fleet;
use RecordBytes;
use JSON::PP;
use IO::Socket::INET;
use Digest::SHA qw(sha256_hex);
use MIME::Base64 qw(decode_base64);
use File::Temp qw(tempdir);
use Time::HiRes qw(sleep time);
use Time::Local qw(timegm);

plan skip_all => 'TEST_NGINX_LOAD_MODULES must name the module'
    unless have_module();

my $slow = $ENV{TEST_ASAN} ? 3 : 1;
my $py = $ENV{TEST_PYTHON} || '/usr/bin/python3';
my ($port, $be_port) = (19996, 19997);
my $redis_port = $ENV{TEST_NGINX_REDIS_PORT} || 6379;
my $root = fleet_root('admin');
my $base = 'https://errors.example/idempotency';

# --- nginx -t: the view must name the Redis of what it inspects -------------

my $tdir = tempdir(CLEANUP => 1);
my ($ok, $out) = nginx_test($tdir, <<"EOC");
    server {
        listen 127.0.0.1:$port;
        location /pay {
            idempotency on;
            idempotency_redis 127.0.0.1:$redis_port;
            proxy_pass http://127.0.0.1:$be_port;
        }
        location = /admin {
            idempotency_admin;
        }
    }
EOC
ok(!$ok, 'nginx -t: an admin without idempotency_redis is refused');
like($out, qr/"idempotency_admin" in location "\/admin" has no "idempotency_redis", of its own or inherited: it would read the default 127\.0\.0\.1:6379, not the Redis of the locations it inspects/,
     '...saying which location and what it would read') or diag $out;
like($out, qr/nginx-t\.conf:\d+/, '...and where') or diag $out;

($ok, $out) = nginx_test($tdir, <<"EOC");
    server {
        listen 127.0.0.1:$port;
        idempotency_redis 127.0.0.1:$redis_port;
        location /pay { idempotency on; proxy_pass http://127.0.0.1:$be_port; }
        location = /admin { idempotency_admin; }
        location = /admin-remote {
            idempotency_admin allow_remote;
            allow 10.0.0.0/8;
            deny all;
        }
    }
EOC
ok($ok, 'nginx -t: an inherited idempotency_redis, and allow_remote')
    or diag $out;

($ok, $out) = nginx_test($tdir, <<"EOC");
    server {
        listen 127.0.0.1:$port;
        idempotency_redis 127.0.0.1:$redis_port;
        location = /admin { idempotency_admin remote; }
    }
EOC
like($out, qr/invalid parameter "remote" of "idempotency_admin": the only one is "allow_remote"/,
     'nginx -t: an unknown parameter is named') or diag $out;

# --- the running view ---------------------------------------------------------

open my $kf, '>', "$root/enc.key" or die;
binmode $kf;
print $kf join '', map { chr int rand 256 } 1 .. 32;
close $kf;
chmod 0600, "$root/enc.key";

# an upstream header with 0x7f and bytes that are no UTF-8
my $odd = "a\x7f\xff\xfeb";

my $dir = nginx_conf('admin', <<"EOC", 1);
    idempotency_redis 127.0.0.1:$redis_port;
    idempotency_redis_prefix admin:;
    idempotency_problem_base_uri $base;
    server {
        listen 127.0.0.1:$port;
        idempotency_scope \$http_x_tenant;
        set_real_ip_from 127.0.0.1;
        real_ip_header X-Real-IP;
        location /pay {
            idempotency on;
            proxy_pass http://127.0.0.1:$be_port;
        }
        location /pay-hour {
            idempotency on;
            idempotency_ttl 1h;
            proxy_pass http://127.0.0.1:$be_port/pay;
        }
        location /pay-big {
            idempotency on;
            idempotency_store_max_size 8;
            proxy_pass http://127.0.0.1:$be_port/pay;
        }
        location /enc/ {
            idempotency on;
            idempotency_encrypt_key $root/enc.key id=k-2026;
            proxy_pass http://127.0.0.1:$be_port/pay/;
        }
        location = /admin {
            idempotency_admin;
            allow 127.0.0.1;
            deny all;
        }
        location = /admin-closed {
            idempotency_admin;
            deny all;
        }
        location = /admin-open {
            idempotency_admin;
        }
        location = /admin-enc {
            idempotency_admin;
            idempotency_encrypt_key $root/enc.key id=k-2026;
        }
        location = /admin-acl {
            idempotency_admin;
            idempotency_redis 127.0.0.1:$redis_port user=admin-no-pttl
                              password=pw;
        }
        location = /admin-remote {
            idempotency_admin allow_remote;
            allow 10.0.0.0/8;
            deny all;
        }
    }
    server {
        listen 127.0.0.1:$be_port;
        location /pay {
            add_header X-Charge "ch_1";
            return 201 '{"id":"ch_1"}';
        }
        location /pay/odd {
            add_header X-Odd "$odd";
            return 201 'odd';
        }
        location /pay/slow {
            echo_sleep @{[ 1.5 * $slow ]};
            echo "slow";
        }
    }
EOC
# the user of /admin-acl, before its worker connects as it
my $cli = $ENV{REDIS_CLI} || 'redis-cli';
my $acl = `$cli -p $redis_port ACL SETUSER admin-no-pttl on '>pw' '~*' '&*' +\@all -pttl 2>&1`;
like($acl, qr/OK/, 'an ACL user that may not PTTL') or diag $acl;

nginx_start($dir);
sleep 0.3;

my $run = int(time * 1000);

sub req {
    my ($method, $path, $extra) = @_;
    my $s = IO::Socket::INET->new("127.0.0.1:$port") or return {};
    print $s "$method $path HTTP/1.0\r\nHost: x\r\n" . ($extra // '') . "\r\n";
    local $/;
    my $res = <$s> // '';
    my ($status) = $res =~ m{^HTTP/1\.\d (\d+)};
    my ($head, $body) = split /\r\n\r\n/, $res, 2;
    return { status => $status // 0, head => $head // '', body => $body // '' };
}

sub json { eval { decode_json($_[0]{body}) } || {} }

my $key = "$run-a";
my $r = http_post($port, $key, 'x', '/pay', "X-Tenant: t1\r\n");
is($r->{status}, 201, 'a charge is stored');
sleep 0.2;

$r = req('GET', "/admin?key=$key&scope=t1");
is($r->{status}, 200, 'GET by key and scope: 200');
like($r->{head}, qr{^Content-Type: application/json}mi, '...as JSON');
my $j = json($r);
is($j->{state}, 'completed', '...state completed');
is($j->{status}, 201, '...the stored status');
like($j->{stored_at} // '', qr/^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z$/,
     '...stored_at in RFC 3339');
like($j->{expires_at} // '', qr/^\d{4}-/, '...expires_at');
is($j->{lease_until}, undef, '...no lease');
is($j->{size}{body}, length('{"id":"ch_1"}'), '...the body size');
like($j->{fingerprint} // '', qr/^[0-9a-f]{64}$/, '...the fingerprint');
ok(scalar(grep { $_->[0] eq 'X-Charge' && $_->[1] eq 'ch_1' }
          @{ $j->{headers} || [] }), '...the stored headers');
ok(!exists $j->{body}, '...no body unless asked');

my $hash = sha256_hex("t1\0$key");
$r = req('GET', "/admin?hash=$hash&body=1");
$j = json($r);
is($j->{state}, 'completed', 'GET by the hash of $idempotency_key_hash');
is(decode_base64($j->{body} // ''), '{"id":"ch_1"}', '...&body=1: base64');

is(req('GET', "/admin?key=$key")->{status}, 404,
   'another scope: no record, 404');
is(req('GET', '/admin?hash=xyz')->{status}, 400, 'a malformed hash: 400');
is(req('GET', '/admin')->{status}, 400, 'no key: 400');
is(req('POST', "/admin?key=$key")->{status}, 405, 'POST: 405');
is(req('GET', "/admin-closed?key=$key")->{status}, 403,
   "nginx's own access control applies");

# purge a completed record: the key runs again
$r = req('DELETE', "/admin?key=$key&scope=t1");
is($r->{status}, 204, 'DELETE of a completed record: 204');
is(req('GET', "/admin?key=$key&scope=t1")->{status}, 404, '...it is gone');
like(join('', lines_of("$dir/logs/error.log")),
     qr/\[warn\].*record purged by 127\.0\.0\.1, key hash \Q$hash\E/,
     '...logged at warn with the client and the key hash');

# an in-progress claim: shown with its lease, purged only with force=1
my $pid = fork // die;
if ($pid == 0) {
    http_post($port, "$run-slow", 'x', '/pay/slow', "X-Tenant: t1\r\n");
    exit 0;
}
sleep 0.4 * $slow;
$j = json(req('GET', "/admin?key=$run-slow&scope=t1"));
is($j->{state}, 'in_progress', 'an in-progress claim');
like($j->{lease_until} // '', qr/^\d{4}-/, '...with its lease');
is(req('DELETE', "/admin?key=$run-slow&scope=t1")->{status}, 409,
   '...DELETE refuses it: 409');
is(req('DELETE', "/admin?key=$run-slow&scope=t1&force=1")->{status}, 204,
   '...unless &force=1');
waitpid $pid, 0;

# a problem+json answer: its status, content type, type and detail
sub problem {
    my ($r, $status, $code, $detail, $name) = @_;
    is($r->{status}, $status, "$name: $status");
    like($r->{head}, qr{^Content-Type: application/problem\+json}mi,
         '...as application/problem+json');
    my $j = json($r);
    is($j->{type}, "$base#$code", "...type $code");
    is($j->{status}, $status, '...its status member');
    like($j->{detail} // '', $detail, '...a detail that says what to send');
}

$key = "$run-b";
$r = http_post($port, $key, 'x', '/pay', "X-Tenant: tenant-42\r\n");
is($r->{status}, 201, 'a charge is stored');
sleep 0.2;

problem(req('GET', '/admin'), 400, 'admin-key-missing',
        qr/\?key=K .*\?hash=H/, 'no key');
problem(req('GET', '/admin?hash=XYZ'), 400, 'admin-hash-invalid',
        qr/\?hash= takes exactly 64 lowercase hexadecimal digits/,
        'a malformed hash');
problem(req('GET', '/admin?key=a%20b'), 400, 'admin-key-invalid',
        qr/\?key= URL-decoded must be a key/, 'a key that is no key');
problem(req('GET', "/admin?key=$key&scope=other"), 404, 'admin-no-record',
        qr/another Redis, prefix, key secret or scope/, 'no record');

# --- loopback only, unless allow_remote -------------------------------------

is(req('GET', "/admin?key=$key&scope=tenant-42")->{status}, 200,
   'a loopback client is answered');
problem(req('GET', "/admin-open?key=$key&scope=tenant-42",
            "X-Real-IP: 10.1.2.3\r\n"),
        403, 'admin-remote-refused', qr/idempotency_admin allow_remote/,
        'a client not on loopback, without allow_remote');
$r = req('GET', "/admin-remote?key=$key&scope=tenant-42",
         "X-Real-IP: 10.1.2.3\r\n");
is($r->{status}, 200, 'allow_remote: a client that allow lets in is answered');
is(json($r)->{state}, 'completed', '...with the record');
$r = req('GET', "/admin-remote?key=$key&scope=tenant-42",
         "X-Real-IP: 192.168.7.7\r\n");
is($r->{status}, 403, '...one that deny keeps out is not');
unlike($r->{body}, qr/"state"/, '...and sees no record');

# --- a sealed record, with and without its key -------------------------------

$r = http_post($port, "$run-enc", 'x', '/enc/x', "X-Tenant: tenant-42\r\n");
is($r->{status}, 201, 'a sealed charge is stored');
sleep 0.2;
$r = req('GET', "/admin?key=$run-enc&scope=tenant-42&body=1");
is($r->{status}, 200, 'a sealed record where no key is configured: 200');
like($r->{head}, qr{^Content-Type: application/json}mi, '...as JSON');
$j = json($r);
is($j->{state}, 'completed', '...its state');
like($j->{expires_at} // '', qr/^\d{4}-\d\d-\d\dT/, '...its expiry');
like($j->{stored_at} // '', qr/^\d{4}-\d\d-\d\dT/, '...when it was stored');
like($j->{fingerprint} // '', qr/^[0-9a-f]{64}$/, '...its fingerprint');
is($j->{sealed}{key_id}, 'k-2026', '...the id of the key that sealed it');
ok(defined $j->{sealed} && !$j->{sealed}{opened}, '...not opened');
like($j->{sealed}{detail} // '', qr/no idempotency_encrypt_key/,
     '...and why');
ok(!defined $j->{headers} && !defined $j->{body}, '...no header or body');
$j = json(req('GET', "/admin-enc?key=$run-enc&scope=tenant-42"));
ok($j->{sealed}{opened}, 'with the key: opened');
is($j->{status}, 201, '...its status');
ok(scalar(grep { $_->[0] eq 'X-Charge' } @{ $j->{headers} || [] }),
   '...its headers');
$j = json(req('GET', "/admin?key=$key&scope=tenant-42"));
ok(exists $j->{sealed} && !defined $j->{sealed}, 'a clear record: sealed null');

# --- a claim in flight: 409 says &force=1 --------------------------------------

$pid = fork // die;
if ($pid == 0) {
    http_post($port, "$run-slow", 'x', '/pay/slow', "X-Tenant: tenant-42\r\n");
    exit 0;
}
sleep 0.4 * $slow;
problem(req('DELETE', "/admin?key=$run-slow&scope=tenant-42"), 409,
        'admin-in-progress', qr/Add &force=1/, 'DELETE of a claim in flight');
waitpid $pid, 0;

# --- the purge's log line: the hash, never the raw key or scope -------------

$hash = sha256_hex("tenant-42\0$key");
is(req('DELETE', "/admin?key=$key&scope=tenant-42")->{status}, 204,
   'DELETE by key and scope: 204');
my @purged = grep { /record purged.*\Q$hash\E/ }
             lines_of("$dir/logs/error.log");
is(scalar @purged, 1, 'its purge line');
like($purged[0] // '', qr/\[warn\].*record purged by 127\.0\.0\.1, key hash \Q$hash\E, redis "127\.0\.0\.1:$redis_port", location "\/admin"/,
     '...with the client, the key hash, the Redis and the location');
unlike($purged[0] // '', qr/\Q$key\E|tenant-42|request:/,
       '...and neither the raw key, nor the scope, nor the request line');

# --- stored header bytes that are no UTF-8 ------------------------------------

$r = http_post($port, "$run-odd", 'x', '/pay/odd', "X-Tenant: tenant-42\r\n");
is($r->{status}, 201, 'an upstream header with 0x7f, 0xff and 0xfe is stored');
sleep 0.2;
$r = req('GET', "/admin?key=$run-odd&scope=tenant-42");
is($r->{status}, 200, '...and viewed');
open my $fh, '>', "$root/odd.json" or die;
binmode $fh;
print $fh $r->{body};
close $fh;
my $seen = `$py -c 'import json, sys
d = json.load(open(sys.argv[1], "rb"))
print([v for n, v in d["headers"] if n == "X-Odd"][0].encode("latin-1").hex())
' $root/odd.json 2>&1`;
chomp $seen;
is($seen, unpack('H*', $odd),
   "...python3's json.loads reads the view, and the bytes come back");

# --- every member says what happened (issue 31) ------------------------------
# A record of a location whose idempotency_ttl (1h) is not the view's (the
# default 24h): stored_at used to be the expiry less the view's own ttl,
# 23 hours in the past.

# an RFC 3339 time of the view, in seconds since the epoch
sub epoch_of {
    my ($y, $mo, $d, $h, $mi, $s, $ms) = ($_[0] // '')
        =~ /^(\d{4})-(\d\d)-(\d\d)T(\d\d):(\d\d):(\d\d)\.(\d{3})Z$/
        or return -1;
    return timegm($s, $mi, $h, $d, $mo - 1, $y) + $ms / 1000;
}

my $t0 = time;
$r = http_post($port, "$run-hour", 'paid', '/pay-hour', "X-Tenant: t9\r\n");
my $t1 = time;
is($r->{status}, 201, 'a charge stored under idempotency_ttl 1h');
sleep 0.3;
$j = json(req('GET', "/admin?key=$run-hour&scope=t9"));
my $at = epoch_of($j->{stored_at});
ok($at >= $t0 - 0.5 && $at <= $t1 + 0.5 * $slow,
   '...stored_at is when it was stored, whatever the view\'s idempotency_ttl')
    or diag "stored_at $j->{stored_at}, request between $t0 and $t1";
$at = epoch_of($j->{expires_at});
ok($at >= $t0 + 3600 - 1 && $at <= $t1 + 3600 + 1,
   '...expires_at is an hour later, from Redis\'s PTTL')
    or diag "expires_at $j->{expires_at}";
is($j->{state}, 'completed', '...state');
is($j->{status}, 201, '...status');
is($j->{lease_until}, undef, '...lease_until null');
is($j->{fingerprint}, sha256_hex("POST\n/pay-hour\npaid"),
   '...the fingerprint: SHA-256 of method, URI and body');
my $hbytes = 0;
$hbytes += 8 + length($_->[0]) + length($_->[1]) for @{ $j->{headers} || [] };
is($j->{size}{headers}, $hbytes, '...size.headers: the fields as encoded');
is($j->{size}{body}, length('{"id":"ch_1"}'), '...size.body');
ok(exists $j->{sealed} && !defined $j->{sealed}, '...sealed null');

$t0 = time;
$r = http_post($port, "$run-big", 'x', '/pay-big', "X-Tenant: t9\r\n");
$t1 = time;
is($r->{status}, 201, 'a response larger than idempotency_store_max_size');
sleep 0.3;
$j = json(req('GET', "/admin?key=$run-big&scope=t9"));
is($j->{state}, 'too_large', '...is kept as too_large');
$at = epoch_of($j->{stored_at});
ok($at >= $t0 - 0.5 && $at <= $t1 + 0.5 * $slow, '...with its stored_at')
    or diag "stored_at $j->{stored_at}";

# a completed record of a version that kept no time: its token a lease
my $oh = sha256_hex("t9\0$run-old");
write_record("admin:{$oh}", "IDM1\x02" . ("\xab" x 32) . ("\x11" x 8)
             . "\xc1L" . pack('nN', 0x0190, 0x3c6a_0000)
             . pack('nN', 201, 0) . pack('NN', 0, 2) . 'ok');
$j = json(req('GET', "/admin?hash=$oh"));
is($j->{state}, 'completed', 'a record stored by an earlier version');
ok(exists $j->{stored_at} && !defined $j->{stored_at},
   '...stored_at null: it kept no time, and none is made up');
is($j->{status}, 201, '...and the rest as stored');

# --- an ACL that forbids a command of the view: 503, and the log says why -----

$r = req('GET', "/admin-acl?key=$run-odd&scope=tenant-42");
problem($r, 503, 'admin-store-unavailable', qr/see the error log/,
        'the view refused a command by the ACL');
my @refused = grep { /refused the admin's PTTL/ }
              lines_of("$dir/logs/error.log");
like($refused[0] // '', qr/\[error\].*redis "127\.0\.0\.1:$redis_port" refused the admin's PTTL: NOPERM.*at "admin:\{[0-9a-f]{64}\}"/,
     '...and the error log says which command Redis refused, and why')
    or diag explain \@refused;
`$cli -p $redis_port ACL DELUSER admin-no-pttl`;

# --- a value under a record's name that is no record: 502, DELETE removes it --
# (an empty one too: it was once taken for a GET never answered, a 503 with
# nothing in the error log)

for my $v ('', 'not a record') {
    my $h = sha256_hex("admin-corrupt-$run-$v");
    `$cli -p $redis_port SET 'admin:{$h}' '$v'`;
    my $n = length $v;
    problem(req('GET', "/admin?hash=$h"), 502, 'admin-record-corrupt',
            qr/DELETE removes it/, "a value of $n bytes");
    ok((grep { /corrupt record in redis .* at "admin:\{$h\}" \($n bytes\)/ }
        lines_of("$dir/logs/error.log")),
       '...and the error log says so');
    is(req('DELETE', "/admin?hash=$h")->{status}, 204, '...DELETE removes it');
    is(req('GET', "/admin?hash=$h")->{status}, 404, '...it is gone');
}

# --- Redis stalled beyond idempotency_redis_timeout (1s): 503 ------------------

system("$cli -p $redis_port DEBUG SLEEP @{[ 2.5 * $slow ]} >/dev/null &");
sleep 0.2;
$r = req('GET', "/admin?key=$run-odd&scope=tenant-42");
problem($r, 503, 'admin-store-unavailable', qr/idempotency_redis_timeout/,
        'Redis stalled');
like($r->{head}, qr/^Retry-After: 1\r?$/mi, '...with Retry-After');
sleep 2.5 * $slow;

is(scalar log_problems("$dir/logs/error.log"), 0, 'no crash or alert');

done_testing();
