# Encrypted records (idempotency_encrypt_key): a stored response is sealed
# with AES-256-GCM, so Redis holds no header, body or trailer in clear; its
# replay is byte-exact (small, staged, 300 KB known and unknown length,
# gRPC trailers); keys rotate (the first writes, all read); a record that
# does not open (a key no longer listed, a changed byte, a cut envelope, a
# record copied to another key) is a Redis error, logged with its key id,
# never replayed nor overwritten; nginx -t refuses bad key files.
# Plain Test::More: its own origin and edge nginx on ports 20480-20489.
use strict;
use warnings;
use lib 't/lib';
use Test::More;
use Fleet;
use RecordBytes;
use MIME::Base64 ();
use IO::Socket::INET;
use JSON::PP;
use File::Temp qw(tempdir);
use Digest::SHA qw(sha256_hex);
use Time::HiRes qw(sleep time);

plan skip_all => 'TEST_NGINX_LOAD_MODULES must name the module'
    unless have_module();

my $slow = $ENV{TEST_ASAN} ? 3 : 1;
my ($origin_port, $a_port, $ba_port, $b_port, $clear_port, $pass_port,
    $grpc_port, $h2c_port) = (20480 .. 20487);
my $redis_port = $ENV{TEST_NGINX_REDIS_PORT} || 6379;
my $native = server_caps()->{native};    # stores by SET IFEQ, never staged
my $root = fleet_root('encrypt');

# --- key files ----------------------------------------------------------------

sub random_bytes { join '', map { chr int rand 256 } 1 .. shift }

my $key_a = write_file("$root/key-a", random_bytes(32), 0600);   # id key-a
my $key_b = write_file("$root/key-b", random_bytes(32), 0600);   # id=kb-2026

# --- the origin: secrets in a header and in the body -------------------------

my $www = "$root/www";
mkdir $www;
my %file;
$file{small} = "charged: PLAINTEXT-BODY-small card 4111111111111111\n";
$file{medium} = join '', map { "PLAINTEXT-BODY-medium line $_\n" } 1 .. 200;
$file{large} = join '', map { sprintf "PLAINTEXT-BODY-large %06d %s\n", $_,
                                      'x' x 64 } 1 .. 3500;
write_file("$www/$_", $file{$_}) for keys %file;
# a chunk of the origin's unknown-length answer (echo_duplicate below)
my $piece = "PLAINTEXT-BODY-chunked-" . ('y' x 77);
my $chunked = $piece x 3000;

ok(length $file{medium} >= 4096 && length $file{medium} < 16384,
   "the medium body is staged (4 KB or more) and read by copy (< 16 KB)");
ok(length $file{large} > 300_000, "the large body is over 300 KB");

my $origin = nginx_conf('origin', <<"EOC", 1);
    log_format exec '\$http_idempotency_key \$uri';
    server {
        listen 127.0.0.1:$origin_port;
        access_log logs/exec.log exec;
        add_header X-Card-Holder "PLAINTEXT-HEADER Jane Q Cardholder";
        root $www;
        default_type application/json;
        location = /chunked {
            echo_duplicate 3000 "$piece";
        }
    }
EOC

# --- the edges: one nginx, a server per key list -----------------------------

my $grpc_ok = system('/usr/bin/python3 -c "import grpc" 2>/dev/null') == 0;

sub edge {
    my ($port, $directives, $extra) = @_;
    $extra //= '';
    return <<"EOC";
    server {
        listen 127.0.0.1:$port;
        $extra
        $directives
        add_header X-Idem \$idempotency_status always;
        location / {
            idempotency on;
            proxy_method GET;
            proxy_pass_request_body off;
            proxy_set_header Content-Length "";
            proxy_pass http://127.0.0.1:$origin_port;
        }
        location /tl/ {
            idempotency on;
            idempotency_store_max_size 1k;
            proxy_method GET;
            proxy_pass_request_body off;
            proxy_set_header Content-Length "";
            proxy_pass http://127.0.0.1:$origin_port/;
        }
        location /idem.Pay/ {
            idempotency on;
            grpc_pass grpc://127.0.0.1:$grpc_port;
        }
        location = /admin {
            idempotency_admin;
        }
    }
EOC
}

my $edge = nginx_conf('edge', <<"EOC", 2);
    idempotency_redis 127.0.0.1:$redis_port;
    idempotency_redis_prefix enc:;
    idempotency_redis_timeout @{[ 1000 * $slow ]}ms;
@{[ edge($a_port, "idempotency_encrypt_key $key_a;",
         "listen 127.0.0.1:$h2c_port http2;") ]}
@{[ edge($ba_port, "idempotency_encrypt_key $key_b id=kb-2026;
        idempotency_encrypt_key $key_a;") ]}
@{[ edge($b_port, "idempotency_encrypt_key $key_b id=kb-2026;") ]}
@{[ edge($clear_port, "") ]}
@{[ edge($pass_port, "idempotency_encrypt_key $key_b id=kb-2026;
        idempotency_on_redis_error pass;") ]}
EOC

nginx_start($origin);
nginx_start($edge);
sleep 0.3 * $slow;

# keys of this run only: the test Redis is shared with the other files
my $run = int(time * 1000) . '-';

sub rkey { 'enc:{' . sha256_hex("\0$run" . shift) . '}' }

sub post {
    my ($port, $key, $path, $extra) = @_;
    return http_post($port, "$run$key", '{"amount":1000}', $path, $extra,
                     10 * $slow);
}

sub runs {
    my $key = shift;
    sleep 0.2;
    return scalar grep { /^\Q$run$key\E / } lines_of("$origin/logs/exec.log");
}

# the envelope: state, version, key id
sub envelope {
    my $v = shift;
    return { state => ord substr($v, 4, 1) } if length $v < 56;
    my $id_len = ord substr($v, 54, 1);
    return { state => ord(substr $v, 4, 1), version => ord(substr $v, 53, 1),
             id => substr($v, 55, $id_len), id_len => $id_len };
}

# changes the value in Redis: byte at offset + 1, or cut to a length
sub tamper {
    my ($k, $offset) = @_;
    redis_cli('EVAL', 'local v = redis.call("GET", KEYS[1]) '
              . 'local i = tonumber(ARGV[1]) + 1 '
              . 'redis.call("SET", KEYS[1], v:sub(1, i - 1) '
              . '.. string.char((v:byte(i) + 1) % 256) .. v:sub(i + 1), '
              . '"KEEPTTL") return 1', 1, $k, $offset);
}

sub truncate_record {
    my ($k, $len) = @_;
    redis_cli('EVAL', 'redis.call("SET", KEYS[1], '
              . 'redis.call("GETRANGE", KEYS[1], 0, tonumber(ARGV[1]) - 1), '
              . '"KEEPTTL") return 1', 1, $k, $len);
}

my $log = "$edge/logs/error.log";
my $log_at = 0;

# the error lines logged since the last call
sub new_errors {
    my @l = lines_of($log);
    my @new = grep { /\[error\]/ } @l[$log_at .. $#l];
    $log_at = @l;
    return join '', @new;
}

sub no_plaintext {
    my ($v, $what) = @_;
    ok($v !~ /PLAINTEXT|Cardholder|X-Card|4111111111111111/i,
       "$what: Redis holds no plaintext of the body or of a header")
        or diag "found: $&";
}

sub replayed_ok {
    my ($r, $body, $what) = @_;
    is(idem_status($r), "200 replay", "$what: replayed");
    ok($r->{body} eq $body, "$what: the body byte for byte ("
                            . length($body) . " bytes)")
        or diag "got " . length($r->{body}) . " bytes";
    is(hdr($r, 'X-Card-Holder'), 'PLAINTEXT-HEADER Jane Q Cardholder',
       "$what: the stored header");
    is(hdr($r, 'Content-Type'), 'application/json', "$what: its type");
}

sub refused_ok {
    my ($r, $what) = @_;
    is(idem_status($r), "503 error", "$what: 503");
    ok($r->{body} =~ /"code":"store-unavailable"/, "$what: store-unavailable")
        or diag substr($r->{body}, 0, 200);
}

# RENAMEs Redis ran: the finish script's of a staged record
sub renames {
    return redis_cli('INFO', 'commandstats') =~ /cmdstat_rename:calls=(\d+)/
           ? $1 : 0;
}

new_errors();

# --- sealed: small, staged by copy, 300 KB known and unknown length ---------

for my $case (['small', '/small'], ['medium', '/medium'],
              ['large', '/large'], ['chunked', '/chunked'])
{
    my ($name, $path) = @$case;
    my $body = $name eq 'chunked' ? $chunked : $file{$name};
    my $renames = renames();

    my $r = post($a_port, "seal-$name", $path);
    is(idem_status($r), "200 new", "$name: stored");
    ok($r->{body} eq $body, "$name: the first response is the upstream's")
        or diag "got " . length($r->{body}) . " bytes";

    my $v = stored(rkey("seal-$name"));
    my $e = envelope($v);
    is($e->{state}, 5, "$name: the record is sealed (state 5)");
    is($e->{version}, 1, "$name: envelope version 1");
    is($e->{id}, 'key-a', "$name: named by the key id, the file's base name");
    no_plaintext($v, $name);
    post($clear_port, "size-$name", $path);
    is(length $v, length(stored(rkey("size-$name"))) + 20 + 16,
       "$name: the clear record and its envelope (version, id length, "
       . "id, nonce, inner state: 20 bytes; tag: 16)");
    cmp_ok(length($v) - length($body), '<', 400,
           "$name: the envelope and headers add little");

    my $renamed = renames() - $renames;
    if ($name eq 'small' || $native) {
        is($renamed, 0, "$name: stored inline, "
                        . ($native ? 'by SET IFEQ' : 'by the finish script'));
    } else {
        cmp_ok($renamed, '>=', 1, "$name: staged, then renamed in place");
    }

    replayed_ok(post($a_port, "seal-$name", $path), $body, $name);
    is(runs("seal-$name"), 1, "$name: the upstream ran once");
}

is(new_errors(), '', 'nothing logged at error so far');

# --- rotation: B first, then A; then B alone ----------------------------------

post($a_port, 'rot-1', '/small');
my $rot1 = stored(rkey('rot-1'));
is(envelope($rot1)->{id}, 'key-a', 'rotation: rot-1 written with key A');

replayed_ok(post($ba_port, 'rot-1', '/small'), $file{small},
            'rotation: B then A reads the record of A');

my $r = post($ba_port, 'rot-2', '/small');
is(idem_status($r), '200 new', 'rotation: a new key under B then A');
is(envelope(stored(rkey('rot-2')))->{id}, 'kb-2026',
   'rotation: ...is written with B, the first key');
replayed_ok(post($b_port, 'rot-2', '/small'), $file{small},
            'rotation: B alone reads it');

$r = post($b_port, 'rot-1', '/small');
refused_ok($r, 'a record of key A where only B is listed');
my $hash = sha256_hex("\0${run}rot-1");
my $why = qr/sealed record not opened: no idempotency_encrypt_key with its id/;
like(new_errors(), qr/$why, key id "key-a", key hash $hash/,
     '...logged at error with the key id and the key hash');
is(record(rkey('rot-1')), $rot1, '...and the record is left as it was');
is(runs('rot-1'), 1, '...and the upstream did not run');

$r = post($b_port, 'rot-1', '/small');
refused_ok($r, 'a second read of it');
like(new_errors(), qr/key id "key-a", key hash $hash/, '...logged again');

$r = post($pass_port, 'rot-1', '/small');
is(idem_status($r), '200 error',
   'idempotency_on_redis_error pass: the request goes on unprotected');
is(runs('rot-1'), 2, '...and runs');
like(new_errors(), qr/key id "key-a"/, '...logged all the same');
is(record(rkey('rot-1')), $rot1, '...the record still not overwritten');

$r = post($clear_port, 'rot-1', '/small');
refused_ok($r, 'a sealed record where no key is listed');
like(new_errors(), qr/no idempotency_encrypt_key here, key id "key-a"/,
     '...says so');

# a record stored in clear (before encryption was on) still replays
post($clear_port, 'clear-1', '/small');
is(envelope(stored(rkey('clear-1')))->{state}, 2,
   'no key: the record is stored in clear (state 2)');
replayed_ok(post($a_port, 'clear-1', '/small'), $file{small},
            'a clear record replays where keys are listed');

# --- changed bytes, a cut envelope, a record copied to another key -----------

for my $case (['ciphertext', sub { 53 + 2 + 5 + 12 + 3 }],
              ['tag', sub { length(shift) - 1 }],
              ['owner token in the clear head', sub { 45 }],
              ['fingerprint in the clear head', sub { 6 }],
              ['key id', sub { 55 }],
              ['nonce', sub { 53 + 2 + 5 + 1 }])
{
    my ($what, $at) = @$case;
    (my $k = "tamper-$what") =~ s/\W+/-/g;
    post($a_port, $k, '/small');
    my $v = stored(rkey($k));
    tamper(rkey($k), $at->($v));
    my $changed = record(rkey($k));
    isnt($changed, $v, "$what: one byte changed");

    $r = post($a_port, $k, '/small');
    refused_ok($r, "$what changed");
    like(new_errors(), qr/sealed record not opened: .*key hash/,
         "$what changed: logged");
    is(record(rkey($k)), $changed, "$what changed: not overwritten");
    is(runs($k), 1, "$what changed: the upstream did not run again");
}

post($a_port, 'cut-1', '/large');
my $v = stored(rkey('cut-1'));
for my $len (length($v) - 1, 53 + 2 + 5 + 12 + 16, 54) {
    truncate_record(rkey('cut-1'), $len);
    $r = post($a_port, 'cut-1', '/large');
    refused_ok($r, "an envelope cut to $len bytes");
    like(new_errors(),
         qr/sealed record not opened: (truncated|it does not authenticate)/,
         "...logged");
}

# the key hash is bound: the same record under another key does not open
post($a_port, 'moved-1', '/small');
stored(rkey('moved-1'));
redis_cli('COPY', rkey('moved-1'), rkey('moved-2'));
$r = post($a_port, 'moved-2', '/small');
refused_ok($r, 'a sealed record copied to another key');
like(new_errors(), qr/it does not authenticate/, '...does not authenticate');
is(runs('moved-2'), 0, '...and nothing ran');

# --- the too-large marker stays clear ----------------------------------------

$r = post($a_port, 'toolarge-1', '/tl/large');
is(idem_status($r), '200 new', 'too large: the response passes');
my $tl = stored(rkey('toolarge-1'));
is(length($tl) . ' ' . ord(substr $tl, 4, 1), '55 3',
   'too large: the 55-byte marker, state 3, in clear');
$r = post($a_port, 'toolarge-1', '/tl/large');
is($r->{status}, 409, 'too large: its retry gets 409');

# --- gRPC: trailers sealed with the rest -------------------------------------

SKIP: {
    skip 'python3-grpcio is not installed', 8 unless $grpc_ok;

    my $counter = "$root/executions";
    my $backend = open(my $ready, '-|', '/usr/bin/python3',
                       't/lib/grpc_backend.py', $grpc_port, $counter)
        or die "cannot start the gRPC backend: $!";
    my $line = <$ready> // '';
    $line =~ /^ready/ or die 'the gRPC backend did not start';

    my $call = sub {
        open my $fh, '-|', '/usr/bin/python3', 't/lib/grpc_client.py',
            "127.0.0.1:$h2c_port", '/idem.Pay/Charge', "${run}grpc-1",
            'pay 5' or die "cannot run the gRPC client: $!";
        my $out = do { local $/; <$fh> };
        close $fh;
        my $c = eval { decode_json($out) } || { code => 'NO-OUTPUT' };
        $c->{meta} = { map { @$_ } @{ $c->{initial} || [] } };
        $c->{trail} = { map { @$_ } @{ $c->{trailing} || [] } };
        return $c;
    };

    my $a = $call->();
    is($a->{code}, 'OK', 'gRPC: the call executes');
    like($a->{trail}{'x-trailer'} // '', qr/^charge-\d+$/,
         'gRPC: with its trailer');
    my $g = stored(rkey('grpc-1'));
    is(envelope($g)->{state}, 5, 'gRPC: sealed');
    ok($g !~ /charge|x-trailer|grpc-status/,
       'gRPC: no trailer and no payload in clear') or diag "found: $&";

    my $b = $call->();
    is($b->{code}, 'OK', 'gRPC: its retry succeeds');
    is($b->{meta}{'idempotent-replayed'}, 'true', 'gRPC: as a replay');
    is($b->{payload}, $a->{payload}, 'gRPC: the same payload');
    is($b->{trail}{'x-trailer'}, $a->{trail}{'x-trailer'},
       'gRPC: the same trailer');

    kill 'TERM', $backend;
    close $ready;
}

is(new_errors() =~ s/^.*sealed record not opened.*\n//mgr, '',
   'no other error logged');
is(join('', log_problems($log)), '', 'no alert, crash or sanitizer report');

# idempotency_admin opens a sealed record with the location's keys, and
# cannot without them
{
    my $get = sub {
        my ($port, $q) = @_;
        my $c = IO::Socket::INET->new("127.0.0.1:$port") or return '';
        print $c "GET /admin?$q HTTP/1.0\r\nHost: x\r\n\r\n";
        local $/;
        return <$c> // '';
    };
    my $res = $get->($a_port, "key=${run}seal-small&body=1");
    like($res, qr/"state":"completed"/, 'admin: a sealed record, opened')
        or diag $res;
    like($res, qr/PLAINTEXT-HEADER Jane Q Cardholder/,
         '...its headers in clear for the operator');
    my ($b64) = $res =~ /"body":"([^"]*)"/;
    is(MIME::Base64::decode_base64($b64 // ''), $file{small},
       '...and its body with &body=1');
    # what is clear in it, not a 502 (issue 29): the id of its key
    $res = $get->($b_port, "key=${run}seal-small&body=1");
    like($res, qr{^HTTP/1\.[01] 200}m, 'admin: without its key, 200');
    like($res, qr/"sealed":\{"key_id":"key-a","opened":false,/,
         '...the id of the key that sealed it, not opened') or diag $res;
    unlike($res, qr/PLAINTEXT|"body":"/, '...its headers and body never shown');
}

nginx_stop($edge);
nginx_stop($origin);

# --- nginx -t -----------------------------------------------------------------

my $dir = tempdir(CLEANUP => 1);

# nginx_t(directives of a protected location)
sub nginx_t {
    return nginx_test($dir, <<"EOC");
    server {
        listen 127.0.0.1:20489;
        location / {
            idempotency on;
            idempotency_redis 127.0.0.1:$redis_port;
$_[0]
        }
    }
EOC
}

my ($ok, $out);
my $good = write_file("$dir/good.key", random_bytes(32), 0600);

($ok, $out) = nginx_t("idempotency_encrypt_key $good;");
ok($ok, 'nginx -t: a 32-byte key, mode 600') or diag $out;

($ok, $out) = nginx_t("idempotency_encrypt_key $good id=2026-12;
            idempotency_encrypt_key $key_a;");
ok($ok, 'nginx -t: two keys, one with an id') or diag $out;

for my $n (31, 33, 0, 64) {
    my $f = write_file("$dir/len$n.key", random_bytes($n), 0600);
    ($ok, $out) = nginx_t("idempotency_encrypt_key $f;");
    ok(!$ok, "nginx -t: a key file of $n bytes is refused");
    my $holds = $n > 32 ? 'more than 32' : $n;
    my $size = qr/bytes: a key of exactly 32 raw bytes/;
    like($out, qr/"idempotency_encrypt_key" file "\Q$f\E" holds $holds $size/,
         '...naming the file and its size') or diag $out;
}

for my $mode (0640, 0604, 0660, 0700 | 0004) {
    my $f = write_file(sprintf("$dir/mode%o.key", $mode), random_bytes(32),
                       $mode);
    ($ok, $out) = nginx_t("idempotency_encrypt_key $f;");
    ok(!$ok, sprintf 'nginx -t: a key file of mode %o is refused', $mode);
    my $mode = qr/must not be accessible to group or others/;
    like($out, qr/"idempotency_encrypt_key" file "\Q$f\E" $mode/,
         '...naming the file') or diag $out;
}

($ok, $out) = nginx_t("idempotency_encrypt_key $dir/missing.key;");
ok(!$ok, 'nginx -t: a missing key file is refused');
like($out, qr/\Q$dir\E\/missing\.key/, '...naming it');

my @bad_ids = (
    ["$good id=" . ('i' x 33),
     qr/id "i{33}" of "[^"]+" must be 1 to 32 printable/],
    ["$good id=", qr/id "" of/],
    ["$good \"id=a b\"", qr/id "a b" of/],
    ["$good name=x", qr/invalid parameter "name=x"/],
);
for my $case (@bad_ids) {
    ($ok, $out) = nginx_t("idempotency_encrypt_key $case->[0];");
    (my $name = $case->[0]) =~ s/^\S+ //;
    ok(!$ok, "nginx -t: refused: FILE $name");
    like($out, $case->[1], '...saying why') or diag $out;
}

my $long = write_file("$dir/" . ('k' x 40), random_bytes(32), 0600);
($ok, $out) = nginx_t("idempotency_encrypt_key $long;");
ok(!$ok, 'nginx -t: a base name longer than 32 bytes is no id');
like($out, qr/name one with id=/, '...and id= is suggested') or diag $out;

($ok, $out) = nginx_t("idempotency_encrypt_key $good id=same;
            idempotency_encrypt_key $key_a id=same;");
ok(!$ok, 'nginx -t: one id for two keys is refused');
like($out, qr/id "same" is listed twice/, '...saying so') or diag $out;

($ok, $out) = nginx_t("idempotency_encrypt_key $good;
            idempotency_encrypt_key off;");
ok(!$ok, 'nginx -t: off next to a key is refused');
like($out, qr/"off" stands alone/, '...saying so') or diag $out;

($ok, $out) = nginx_t("idempotency_encrypt_key off;");
ok($ok, 'nginx -t: off alone') or diag $out;

done_testing();
