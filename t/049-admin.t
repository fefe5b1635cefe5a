# idempotency_admin: the operator's view of one key. GET by key and scope
# or by the log-safe hash: state, status, times, sizes, fingerprint, the
# stored headers, the body with &body=1; 404 without a record. DELETE
# purges a completed or unknown record (204, logged at warn with the
# client), refuses an in-progress claim (409) unless &force=1.
# Plain Test::More: its own nginx on 19996-19997.
use strict;
use warnings;
use lib 't/lib';
use Test::More;
use Fleet;
use JSON::PP;
use IO::Socket::INET;
use Digest::SHA qw(sha256_hex);
use MIME::Base64 qw(decode_base64);
use Time::HiRes qw(sleep);

plan skip_all => 'TEST_NGINX_LOAD_MODULES must name the module'
    unless have_module();

my $slow = $ENV{TEST_ASAN} ? 3 : 1;
my ($port, $be_port) = (19996, 19997);
my $root = fleet_root('admin');

my $dir = nginx_conf('admin', <<"EOC", 1);
    idempotency_redis 127.0.0.1:$ENV{TEST_NGINX_REDIS_PORT};
    idempotency_redis_prefix admin:;
    server {
        listen 127.0.0.1:$port;
        idempotency_scope \$http_x_tenant;
        location /pay {
            idempotency on;
            proxy_pass http://127.0.0.1:$be_port;
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
    }
    server {
        listen 127.0.0.1:$be_port;
        location /pay {
            add_header X-Charge "ch_1";
            return 201 '{"id":"ch_1"}';
        }
        location /pay/slow {
            echo_sleep @{[ 1.5 * $slow ]};
            echo "slow";
        }
    }
EOC
nginx_start($dir);
sleep 0.3;

my $run = int(time * 1000);

sub req {
    my ($method, $path) = @_;
    my $s = IO::Socket::INET->new("127.0.0.1:$port") or return {};
    print $s "$method $path HTTP/1.0\r\nHost: x\r\n\r\n";
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

is(scalar log_problems("$dir/logs/error.log"), 0, 'no crash or alert');

done_testing();
