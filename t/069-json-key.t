# idempotency_key_json_pointer: the key is a member of the request's JSON
# body (RFC 6901), as Stripe's events carry their id ("/id") and Square's
# requests their "idempotency_key". It is found as the body streams
# through the fingerprint, whatever the framing (Content-Length, chunked,
# a body that trickles in, Expect: 100-continue, HTTP/2, a body spilled
# to a temporary file), and checked like a key from the header. A member
# that is missing is a missing key; a body that is not JSON, is cut, or
# has no string or integer at the pointer is 400 invalid-key with the
# pointer in the detail: nothing upstream, nothing in Redis.
# Plain Test::More: its own nginx on 20840 (HTTP/1.1) and 20842 (HTTP/2),
# the upstream on 20841.
use strict;
use warnings;
use lib 't/lib';
use Test::More;
use Fleet;
use JSON::PP;
use IO::Socket::INET;
use Digest::SHA qw(sha256_hex);
use File::Temp qw(tempdir);
use Time::HiRes qw(sleep);

plan skip_all => 'TEST_NGINX_LOAD_MODULES must name the module'
    unless have_module();

my $slow = $ENV{TEST_ASAN} ? 3 : 1;
my ($port, $be_port, $h2_port) = (20840, 20841, 20842);
my $redis_port = $ENV{TEST_NGINX_REDIS_PORT} || 6379;
my $root = fleet_root('json-key');
my $run = int(time * 1000);
my $prefix = "json$run:";

# --- nginx -t: a pointer that is no RFC 6901 pointer is refused -------------

my $tdir = tempdir(CLEANUP => 1);
for my $bad ('id', '/a~2b', '""') {
    my ($ok, $out) = nginx_test($tdir, <<"EOC");
    server {
        listen 127.0.0.1:$port;
        location /x {
            idempotency on;
            idempotency_key_json_pointer $bad;
            proxy_pass http://127.0.0.1:$be_port;
        }
    }
EOC
    ok(!$ok, "nginx -t: the pointer $bad is refused");
    like($out, qr/invalid JSON pointer .* in "idempotency_key_json_pointer": \S/,
         '...saying why') or diag $out;
}

# --- the running module ---------------------------------------------------------

my $dir = nginx_conf('json', <<"EOC", 1);
    idempotency_redis 127.0.0.1:$redis_port;
    idempotency_redis_prefix $prefix;
    log_format runs '\$http_x_evt';
    server {
        listen 127.0.0.1:$port;
        listen 127.0.0.1:$h2_port http2;
        client_body_buffer_size 1k;
        add_header X-Idem \$idempotency_status always;
        add_header X-Hash \$idempotency_key_hash always;
        location /events {
            idempotency on;
            idempotency_key_json_pointer /id;
            proxy_pass http://127.0.0.1:$be_port/backend;
        }
        location /nested {
            idempotency on;
            idempotency_key_json_pointer /data/object/id;
            proxy_pass http://127.0.0.1:$be_port/backend;
        }
        location /escaped {
            idempotency on;
            idempotency_key_json_pointer "/a~1b/~0c/1";
            proxy_pass http://127.0.0.1:$be_port/backend;
        }
        location /required {
            idempotency on;
            idempotency_required on;
            idempotency_key_json_pointer /id;
            proxy_pass http://127.0.0.1:$be_port/backend;
        }
        location /short {
            idempotency on;
            idempotency_key_max_length 8;
            idempotency_key_json_pointer /id;
            proxy_pass http://127.0.0.1:$be_port/backend;
        }
        location /pattern {
            idempotency on;
            idempotency_key_pattern "^evt_[A-Za-z0-9_]+\$";
            idempotency_key_json_pointer /id;
            proxy_pass http://127.0.0.1:$be_port/backend;
        }
        location /inherit/ {
            idempotency on;
            idempotency_key_json_pointer /id;
            proxy_pass http://127.0.0.1:$be_port/backend;
            location /inherit/header {
                idempotency_key_json_pointer off;
                proxy_pass http://127.0.0.1:$be_port/backend;
            }
        }
    }
    server {
        listen 127.0.0.1:$be_port;
        location /backend {
            access_log $root/json/logs/runs.log runs;
            return 201 "ran\\n";
        }
    }
EOC
nginx_start($dir);
sleep 0.3;

sub raw {
    my ($bytes, @parts) = @_;
    my $s = IO::Socket::INET->new("127.0.0.1:$port") or return {};
    print $s $bytes;
    for (@parts) {
        sleep 0.15;
        print $s $_;
    }
    local $/;
    my $res = <$s> // '';
    my ($status) = $res =~ m{^HTTP/1\.\d (\d+)};
    my ($head, $body) = split /\r\n\r\n/, $res, 2;
    my ($idem) = ($head // '') =~ /^X-Idem: (\S+)/mi;
    my ($hash) = ($head // '') =~ /^X-Hash: (\S*)/mi;
    return { status => $status // 0, head => $head // '', body => $body // '',
             idem => $idem // '', hash => $hash // '' };
}

# post(path, body, extra headers): one POST with Content-Length
sub post {
    my ($path, $body, $extra) = @_;
    return raw("POST $path HTTP/1.0\r\nHost: x\r\n" . ($extra // '')
               . "Content-Length: " . length($body) . "\r\n\r\n$body");
}

# how many times the upstream ran for an X-Evt
sub runs {
    my $evt = shift;
    sleep 0.2;
    return scalar grep { $_ eq "$evt\n" } lines_of("$dir/logs/runs.log");
}

# the Redis keys under this run's prefix
sub stored_keys {
    my @k = grep { length } split /\n/,
        redis_cli('--scan', '--pattern', "$prefix*");
    return scalar @k;
}

sub detail { my $j = eval { decode_json($_[0]{body}) } || {}; $j }

# --- a Stripe event: its id is the key ---------------------------------------

my $evt = "evt_${run}_1";
my $event = qq({"id":"$evt","object":"event","type":"payment_intent.succeeded"});
my $r = post('/events', $event, "X-Evt: $evt\r\n");
is($r->{status}, 201, 'an event with its id at /id: run');
is($r->{idem}, 'new', '...as a new key');
is($r->{hash}, sha256_hex("\0$evt"), '...the key is the member, decoded');
$r = post('/events', $event, "X-Evt: $evt\r\n");
is($r->{idem}, 'replay', 'its redelivery: replayed');
is(runs($evt), 1, '...the receiver ran once');

$r = post('/events', $event, "X-Evt: $evt\r\nIdempotency-Key: other\r\n");
is($r->{idem}, 'replay', 'an Idempotency-Key header beside it is not read');

(my $changed = $event) =~ s/succeeded/failed/;
$r = post('/events', $changed, "X-Evt: $evt\r\n");
is($r->{status}, 422, 'the same id with another body: 422');

(my $escaped = $changed) =~ s/evt_/evt\\u005f/;
$r = post('/events', $escaped, "X-Evt: $evt\r\n");
is($r->{status}, 422, 'the id written with a \\u escape is the same key');
is(runs($evt), 1, '...and nothing ran again');

# --- the framings a body arrives in: the same key, the same body ---------------

$r = raw("POST /events HTTP/1.1\r\nHost: x\r\nConnection: close\r\n"
         . "X-Evt: $evt\r\nTransfer-Encoding: chunked\r\n\r\n"
         . sprintf("%x\r\n%s\r\n", 12, substr($event, 0, 12)),
         sprintf("%x\r\n%s\r\n0\r\n\r\n", length($event) - 12,
                 substr($event, 12)));
is($r->{idem}, 'replay', 'chunked, cut inside the id, in two reads: replayed');

$r = raw("POST /events HTTP/1.0\r\nHost: x\r\nX-Evt: $evt\r\n"
         . "Content-Length: " . length($event) . "\r\n\r\n"
         . substr($event, 0, 9), substr($event, 9, 5), substr($event, 14));
is($r->{idem}, 'replay', 'a body that trickles in three reads: replayed');

SKIP: {
    skip 'curl is not installed', 3 unless `curl --version 2>/dev/null`;
    my $out = `curl -s -m 10 -o /dev/null -w '%{http_code} %{http_version}' -H 'Expect: 100-continue' -H 'X-Evt: $evt' --data-binary '$event' http://127.0.0.1:$port/events -D $root/h1.txt 2>&1`;
    like($out, qr/^201 /, 'Expect: 100-continue: 201');
    like(join('', lines_of("$root/h1.txt")), qr/^X-Idem: replay/mi,
         '...replayed');

    skip 'curl without HTTP/2', 1 unless `curl -V` =~ /HTTP2/;
    $out = `curl -s -m 10 -o /dev/null -w '%{http_code} %{http_version}' --http2-prior-knowledge -H 'X-Evt: $evt' --data-binary '$event' http://127.0.0.1:$h2_port/events -D $root/h2.txt 2>&1`;
    ok($out =~ /^201 2/ && join('', lines_of("$root/h2.txt"))
                           =~ /^x-idem: replay/mi,
       'HTTP/2: replayed') or diag $out;
}
is(runs($evt), 1, 'every framing found the same key: one run');

# a body larger than client_body_buffer_size (1k), spilled to a file, its
# id after 200 KB of other members
my $big = '{"pad":"' . ('x' x 200_000) . qq(","id":"evt_${run}_big"});
$r = post('/events', $big, "X-Evt: big$run\r\n");
is($r->{idem}, 'new', 'a 200 KB body with the id at its end: new');
$r = post('/events', $big, "X-Evt: big$run\r\n");
is($r->{idem}, 'replay', '...replayed');
is($r->{hash}, sha256_hex("\0evt_${run}_big"), '...by that id');

# --- other members, other pointers -----------------------------------------

$r = post('/events', qq({"id":$run,"n":1}), "X-Evt: int$run\r\n");
is($r->{idem}, 'new', 'an integer id');
is($r->{hash}, sha256_hex("\0$run"), '...is its digits');

my $obj = "in_${run}";
my $nested = qq({"id":"evt_$run","data":{"object":{"id":"$obj","amount":5}}});
$r = post('/nested', $nested, "X-Evt: $obj\r\n");
is($r->{hash}, sha256_hex("\0$obj"), '/data/object/id: the nested member');

$r = post('/escaped', qq({"a/b":{"~c":["zero","k$run"]},"a":{"b":1}}),
          "X-Evt: esc$run\r\n");
is($r->{hash}, sha256_hex("\0k$run"),
   '/a~1b/~0c/1: "a/b", then "~c", then the element at index 1');

# --- no member: a missing key ---------------------------------------------

$r = post('/events', '{"type":"ping"}', "X-Evt: none$run\r\n");
is($r->{status}, 201, 'no member at /id: passed through');
is($r->{idem}, 'bypass', '...unprotected, as a request without a key');
post('/events', '{"type":"ping"}', "X-Evt: none$run\r\n");
is(runs("none$run"), 2, '...so each one runs');

$r = post('/required', '{"type":"ping"}', "X-Evt: req$run\r\n");
is($r->{status}, 400, 'with idempotency_required on: 400');
is(detail($r)->{code}, 'missing-key', '...missing-key');
is(detail($r)->{detail}, 'The JSON body has no member at /id.',
   '...naming the pointer');

# --- what is not a key: 400 invalid-key, nothing upstream, nothing stored -----

my $before = stored_keys();
my @bad = (
    ['/events', 'hello', qr/not valid JSON/, 'a body that is not JSON'],
    ['/events', '', qr/not JSON/, 'an empty body'],
    ['/events', qq({"id":"evt_$run"), qr/ends inside the JSON/,
     'a body cut inside the JSON'],
    ['/events', qq({"id":"evt_$run"} {}), qr/./, 'a second value after it'],
    ['/events', '{"id":{"x":1}}', qr/object/, 'an object at the pointer'],
    ['/events', '{"id":["a"]}', qr/array/, 'an array at the pointer'],
    ['/events', '{"id":null}', qr/null/, 'null at the pointer'],
    ['/events', '{"id":1.5}', qr/fraction|exponent|integer/,
     'a number that is no integer'],
    ['/events', '{"id":true}', qr/boolean|string/, 'true'],
    ['/events', '{"id":""}', qr/empty/, 'an empty string'],
    ['/events', qq({"id":"\xc3\xa9vt"}), qr/printable ASCII/,
     'a key outside printable ASCII'],
    ['/events', qq({"id":"a","id":"b"}), qr/twice/,
     'the member twice (parsers disagree on which wins)'],
    ['/events', ('[' x 100) . (']' x 100), qr/deeper/,
     'nesting deeper than 64 levels'],
    ['/events', qq({"id":"evt","x":"\x01"}), qr/./,
     'a control character in a string'],
    ['/short', qq({"id":"evt_123456789"}), qr/longer/,
     'a key longer than idempotency_key_max_length'],
);
for (@bad) {
    my ($path, $body, $why, $name) = @$_;
    $r = post($path, $body, "X-Evt: bad$run\r\n");
    is($r->{status}, 400, "$name: 400");
    my $d = detail($r);
    is($d->{code}, 'invalid-key', '...invalid-key');
    like($d->{detail} // '', qr/^The key at \/id of the JSON body: /,
         '...naming the pointer');
    like($d->{detail} // '', $why, '...and why') or diag $d->{detail};
    is($r->{idem}, 'invalid', '...$idempotency_status invalid');
}
is(runs("bad$run"), 0, 'none of them ran upstream');
is(stored_keys(), $before, '...or left anything in Redis');

$r = post('/pattern', '{"id":"order-7"}', "X-Evt: pat$run\r\n");
is($r->{status}, 400, 'idempotency_key_pattern applies to the key: 400');
like(detail($r)->{detail} // '',
     qr/^The key at \/id of the JSON body does not have the form this API accepts: it must match the pattern \^evt_/,
     '...naming the pointer and the pattern');
$r = post('/pattern', qq({"id":"evt_p$run"}), "X-Evt: pat$run\r\n");
is($r->{idem}, 'new', '...a key of the form is claimed');

# --- off: an inherited pointer is dropped, the header is read ----------------

$r = post('/inherit/x', qq({"id":"evt_i$run"}), "X-Evt: inh$run\r\n");
is($r->{hash}, sha256_hex("\0evt_i$run"), 'an inherited pointer');
$r = post('/inherit/header', qq({"id":"evt_i$run"}),
          "X-Evt: inh$run\r\nIdempotency-Key: hk-$run\r\n");
is($r->{hash}, sha256_hex("\0hk-$run"),
   'idempotency_key_json_pointer off: the header again');

is(scalar log_problems("$dir/logs/error.log"), 0, 'no crash or alert');
my @rej = grep { /key rejected: the key at \/id of the JSON body/ }
          lines_of("$dir/logs/error.log");
like($rej[0] // '', qr/\[info\].*not valid JSON \(body byte \d+\).*client: 127\.0\.0\.1/,
     'a refused key is logged at info, with where in the body, and the client')
    or diag explain \@rej;

done_testing();
