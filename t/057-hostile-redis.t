# What a hostile Redis can do, and must not:
# - a Redis writer (no encryption key) overwrites a record with a clear one
#   that reuses its readable head: a record holding a framing, hop-by-hop
#   or nginx-owned header, or a name that is not a token, is corrupt (503,
#   one error line), never replayed with two Content-Length or a
#   Transfer-Encoding; a Set-Cookie the location hides is not replayed;
#   with "idempotency_encrypt_key ... required" a clear completed record is
#   refused (503, logged), without it it replays (the rollout);
# - a fake Redis (t/lib/hostile_redis.py: a real one cannot be made to
#   send these) answers a claim with *2147483647, six nested arrays of
#   200,000 elements, a bulk string far longer than any record (at the
#   top, with 10 digits, inside an array): a protocol error, one error
#   line, the connection made again; the worker keeps answering at once
#   and its peak memory stays small;
# - an error reply with a bare LF cannot forge an error-log line; error
#   text is logged cut to 512 bytes, control bytes as "?".
# Plain Test::More: its own origin and edges on ports 20570-20589.
use strict;
use warnings;
use lib 't/lib';
use Test::More;
use Fleet;
use RecordBytes;
use IO::Socket::INET;
use IO::Select;
use Digest::SHA qw(sha256_hex);
use Time::HiRes qw(sleep time);

plan skip_all => 'TEST_NGINX_LOAD_MODULES must name the module'
    unless have_module();

my $py = $ENV{TEST_PYTHON} || '/usr/bin/python3';
plan skip_all => "$py is needed for the fake Redis" unless -x $py;

my $slow = $ENV{TEST_ASAN} ? 3 : 1;
my ($origin_port, $a_port, $req_port, $clear_port, $fake_edge_port)
    = (20570 .. 20574);
my $fake_base = 20580;
my $redis_port = $ENV{TEST_NGINX_REDIS_PORT} || 6379;
my $root = fleet_root('hostile-redis');

my $key_a = write_file("$root/key-a",
                       join('', map { chr int rand 256 } 1 .. 32), 0600);

my $origin = nginx_conf('origin', <<"EOC", 1);
    server {
        listen 127.0.0.1:$origin_port;
        location / {
            add_header X-Origin yes;
            return 200 "paid\\n";
        }
    }
EOC

sub edge_server {
    my ($port, $directives) = @_;
    return "    server {\n        listen 127.0.0.1:$port;\n        $directives\n"
           . get_front($origin_port) . "    }\n";
}

my $edge = nginx_conf('edge', <<"EOC", 2);
    idempotency_redis 127.0.0.1:$redis_port;
    idempotency_redis_prefix hr:;
    idempotency_redis_timeout @{[ 2000 * $slow ]}ms;
@{[ edge_server($a_port, "idempotency_encrypt_key $key_a id=ka;") ]}
@{[ edge_server($req_port, "idempotency_encrypt_key $key_a id=ka required;") ]}
@{[ edge_server($clear_port, "") ]}
EOC

# keys of this run only; the record key as the module names it
my $run = int(time * 1000) . '-';
sub rkey { 'hr:{' . sha256_hex("\0$run" . shift) . '}' }

nginx_start($_) for $origin, $edge;
sleep 0.3 * $slow;

# a raw answer: every header line as sent, in order
sub post {
    my ($port, $key) = @_;
    return http_post($port, "$run$key", '{"amount":1}', '/pay', '',
                     10 * $slow);
}

sub headers_named {
    my ($r, $name) = @_;
    return scalar(() = $r->{head} =~ /^\Q$name\E:/mgi);
}

sub fields {
    my $f = shift;
    my $out = pack 'N', scalar(@$f) / 2;
    for (my $i = 0; $i < @$f; $i += 2) {
        $out .= pack('N', length $f->[$i]) . $f->[$i]
                . pack('N', length $f->[$i + 1]) . $f->[$i + 1];
    }
    return $out;
}

# a clear completed record (state 2, or 4 with trailers) with the head of a
# real one: its fingerprint matches the retry's request
sub forge {
    my ($head, $headers, $body, $trailers) = @_;
    my $rec = 'IDM1' . chr($trailers ? 4 : 2) . substr($head, 5, 48)
              . pack('n', 200) . fields($headers)
              . pack('NN', 0, length $body) . $body;
    $rec .= fields($trailers) if $trailers;
    return $rec;
}

my $log = "$edge/logs/error.log";
my $log_at = 0;

sub new_errors {
    my $file = shift // $log;
    my @l = lines_of($file);
    my @new = grep { /\[error\]/ } @l[$log_at .. $#l];
    $log_at = @l;
    return @new;
}

new_errors();

# --- a real record, sealed: its head is readable -----------------------------

my $r = post($a_port, 'real');
is(idem_status($r), '200 new', 'the first request runs');
my $real = stored(rkey('real'));
is(ord substr($real, 4, 1), 5, 'its record is sealed');
my $head = substr $real, 0, 53;
new_errors();

# --- the review's forgery: framing headers, a cookie, a Location -----------

write_record(rkey('real'), forge($head,
    ['Location', 'https://evil.example/', 'Set-Cookie', 'session=attacker',
     'Content-Length', '0', 'Transfer-Encoding', 'chunked'], "forged\n"));

for my $case (['rollout', $a_port], ['required', $req_port],
              ['clear', $clear_port])
{
    my ($name, $port) = @{$case};
    $r = post($port, 'real');
    is(idem_status($r), '503 error', "$name: the forged record is refused");
    is(headers_named($r, 'Content-Length'), 1, "$name: one Content-Length");
    is(headers_named($r, 'Transfer-Encoding'), 0,
       "$name: no Transfer-Encoding");
    ok($r->{head} !~ /evil\.example|attacker|Idempotent-Replayed/i,
       "$name: nothing of the record is sent") or diag $r->{head};
    my @e = new_errors();
    is(scalar @e, 1, "$name: one error line")
        or diag join '', @e;
}

# --- one refused field at a time: corrupt, 503 ------------------------------

my @refused = ('Content-Length', 'content-length', 'Transfer-Encoding',
               'Connection', 'Keep-Alive', 'Proxy-Connection', 'TE',
               'Trailer', 'Upgrade', 'Date', 'Server', 'Idempotent-Replayed',
               'Proxy-Authenticate', 'Bad Name', 'X-Bad(', 'X-Bad:',
               "X-\x7f", "X-\xff", 'x' x 257);
my $i = 0;
for my $name (@refused) {
    my $k = 'refused-' . $i++;
    write_record(rkey($k), forge($head, ['X-Ok', 'yes', $name, '1'],
                                 "forged\n"));
    $r = post($a_port, $k);
    my $shown = $name =~ /^[\x21-\x7e ]{1,40}$/ ? $name : sprintf 'name %d', $i;
    is(idem_status($r), '503 error', "a record with \"$shown\" is corrupt");
    my @e = new_errors();
    ok(@e == 1 && $e[0] =~ /corrupt record/,
       "\"$shown\": one corrupt-record line") or diag join '', @e;
}

# capture.c's markers, as it writes them, and not otherwise
for my $case (['a status line of another status', 1,
               [':status-line', '204 No Content']],
              ['a status line with a control byte', 1,
               [':status-line', "200 O\x01K"]],
              ['a marker with a value', 1, [':location', 'x']],
              ['an unknown marker', 1, [':connection', 'close']],
              ['a refused trailer', 1, ['X-Ok', 'yes'],
               ['Transfer-Encoding', 'chunked']],
              ['a marker among the trailers', 1, ['X-Ok', 'yes'],
               [':status-line', '200 OK']],
              ['its own status line', 0,
               [':status-line', '200 Fine', 'X-Ok', 'yes']],
              ['a trailer that is a token', 0, ['X-Ok', 'yes'],
               ['grpc-status', '0']])
{
    my ($what, $bad, $headers, $trailers) = @{$case};
    my $k = 'marker-' . $i++;
    write_record(rkey($k), forge($head, $headers, "forged\n", $trailers));
    $r = http_post($a_port, "$run$k", '{"amount":1}', '/pay', '',
                   10 * $slow);
    my @e = new_errors();
    if ($bad) {
        is(idem_status($r), '503 error', "$what: corrupt");
        ok(@e == 1 && $e[0] =~ /corrupt record/, "$what: one line")
            or diag join '', @e;
    } else {
        is(idem_status($r), '200 replay', "$what: replayed");
        is(scalar @e, 0, "$what: no error line") or diag join '', @e;
    }
}

# --- a clear record of harmless fields: the rollout replays, required not ---

write_record(rkey('benign'), forge($head,
    ['X-Forged', 'yes', 'Set-Cookie', 'session=attacker'], "forged\n"));

$r = post($a_port, 'benign');
is(idem_status($r), '200 replay',
   'without "required", a clear record replays (a fleet rolling out)');
is(hdr($r, 'X-Forged'), 'yes', '...with its stored header');
is(headers_named($r, 'Set-Cookie'), 0,
   '...but not a Set-Cookie the location does not store');
is(scalar(new_errors()), 0, '...and no error line');

$r = post($req_port, 'benign');
is(idem_status($r), '503 error', 'with "required", a clear record is 503');
my @e = new_errors();
ok(@e == 1 && $e[0] =~ /clear record refused: .*required/,
   '...one line says why') or diag join '', @e;
ok($e[0] =~ /key hash [0-9a-f]{64}/, '...naming the key hash')
    or diag $e[0];

$r = post($clear_port, 'benign');
is(idem_status($r), '200 replay', 'without encryption, it replays');

# required changes nothing for sealed records
$r = post($req_port, 'sealed');
is(idem_status($r), '200 new', 'required: a new key runs');
stored(rkey('sealed'));
$r = post($req_port, 'sealed');
is(idem_status($r), '200 replay', 'required: its sealed record replays');
is(hdr($r, 'X-Origin'), 'yes', '...with its headers');
is(scalar(new_errors()), 0, '...and no error line');

# --- nginx -t ----------------------------------------------------------------

my ($ok, $out) = nginx_test($root, <<"EOC");
    server { listen 127.0.0.1:$a_port;
        idempotency_encrypt_key $key_a required id=k1; }
EOC
ok($ok, 'nginx -t: "required" in any place') or diag $out;

($ok, $out) = nginx_test($root, <<"EOC");
    server { listen 127.0.0.1:$a_port;
        idempotency_encrypt_key $key_a id=k1 requierd; }
EOC
ok(!$ok && $out =~ /invalid parameter "requierd" of "idempotency_encrypt_key": "id=NAME" or "required"/,
   'nginx -t: a misspelt parameter is named, with what is expected')
    or diag $out;

($ok, $out) = nginx_test($root, <<"EOC");
    server { listen 127.0.0.1:$a_port;
        idempotency_encrypt_key $key_a required required; }
EOC
ok(!$ok, 'nginx -t: "required" once') or diag $out;

# --- a fake Redis: hostile replies to a claim --------------------------------

my @modes = qw(bigarray nested bigbulk tenbulk nestedbulk error longerror);
my (%fake_port, @fakes);
my $count = "$root/hostile.count";
$ENV{HOSTILE_COUNT} = $count;

for my $n (0 .. $#modes) {
    my $mode = $modes[$n];
    my $port = $fake_base + $n;
    $fake_port{$mode} = $port;
    my $pid = open my $fh, '-|', $py, 't/lib/hostile_redis.py', $port, $mode
        or die "cannot start the fake Redis: $!";
    my $ready = <$fh>;
    die "the fake Redis ($mode) did not start" unless ($ready // '') =~ /ready/;
    push @fakes, [$pid, $fh];
}

END {
    kill 'TERM', map { $_->[0] } @fakes if @fakes;
}

my $locations = join '', map { <<"EOC" } @modes;
        location /$_ {
            idempotency on;
            idempotency_redis 127.0.0.1:$fake_port{$_};
            proxy_pass http://127.0.0.1:$origin_port;
        }
EOC

# one worker: the one the hostile reply reaches must answer the ping
my $fake_edge = nginx_conf('fake-edge', <<"EOC", 1);
    idempotency_redis_timeout @{[ 3000 * $slow ]}ms;
    server {
        listen 127.0.0.1:$fake_edge_port;
        add_header X-Idem \$idempotency_status always;
        location = /ping {
            return 200 "pong\\n";
        }
$locations
    }
EOC

nginx_start($fake_edge);
sleep 0.5 * $slow;

my $fake_log = "$fake_edge/logs/error.log";

sub worker_pid {
    open my $fh, '<', "$fake_edge/logs/nginx.pid" or return;
    chomp(my $master = <$fh>);
    for my $stat (glob '/proc/[0-9]*/stat') {
        open my $s, '<', $stat or next;
        my $line = <$s> // next;
        my ($pid, $ppid) = $line =~ /^(\d+) \(.*\) \S+ (\d+)/;
        return $pid if defined $ppid && $ppid == $master;
    }
    return;
}

sub status_kb {
    my ($pid, $field) = @_;
    open my $fh, '<', "/proc/$pid/status" or return 0;
    for (<$fh>) {
        return $1 if /^\Q$field\E:\s+(\d+) kB/;
    }
    return 0;
}

sub hostile_count {
    my @l = lines_of($count);
    return scalar @l;
}

my $worker = worker_pid();
ok($worker, 'the worker of the fake Redis edge') or diag 'no worker';

$log_at = 0;
new_errors($fake_log);

for my $mode (@modes) {
    my $before = hostile_count();

    # the peak of this case only: "5" resets VmHWM (Linux 4.0)
    if (open my $cr, '>', "/proc/$worker/clear_refs") {
        print $cr "5\n";
        close $cr;
    }
    my $hwm = status_kb($worker, 'VmHWM');

    # the claim is sent; its answer is not read yet
    my $s = IO::Socket::INET->new(PeerAddr => "127.0.0.1:$fake_edge_port",
                                  Timeout => 5);
    my $body = '{"amount":1}';
    print $s "POST /$mode HTTP/1.1\r\nHost: x\r\nConnection: close\r\n"
        . "Idempotency-Key: $run$mode\r\nContent-Length: "
        . length($body) . "\r\n\r\n$body";

    for (1 .. 100 * $slow) {
        last if hostile_count() > $before;
        sleep 0.05;
    }
    ok(hostile_count() > $before, "$mode: the fake Redis sent its reply");
    sleep 0.3;

    my $t0 = time;
    my $ping = IO::Socket::INET->new(PeerAddr => "127.0.0.1:$fake_edge_port",
                                     Timeout => 5);
    print $ping "GET /ping HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n";
    my $pong = '';
    my $sel = IO::Select->new($ping);
    while ($sel->can_read(10 * $slow)) {
        last unless sysread($ping, my $buf, 4096);
        $pong .= $buf;
    }
    my $took = time - $t0;
    ok($pong =~ /pong/ && $took < 2 * $slow,
       "$mode: the worker answers another location at once")
        or diag sprintf 'took %.2f s: %s', $took, $pong;

    my $res = '';
    $sel = IO::Select->new($s);
    while ($sel->can_read(15 * $slow)) {
        last unless sysread($s, my $buf, 65536);
        $res .= $buf;
    }
    my ($status) = $res =~ m{^HTTP/1\.1 (\d+)};
    is($status // 0, 503, "$mode: the claim is answered 503");

    my $grew = status_kb($worker, 'VmHWM') - $hwm;
    ok($grew < 16 * 1024, "$mode: the worker's peak memory stays small")
        or diag "VmHWM grew by $grew kB";

    sleep 0.2;
    my @l = new_errors($fake_log);

    if ($mode eq 'error') {
        my @all = lines_of($fake_log);
        ok(!grep({ /^forged/ } @all), 'error: no log line starts with the '
                                      . 'forged text')
            or diag join '', grep { /forged/ } @all;
        # hiredis 1.x refuses a bare LF in an error line itself
        ok(grep({ /ERR boom\?forged: this line is not nginx's\?\[31m, /
                  || /sent an invalid reply: Bad simple string value/ } @l),
           'error: the text is logged on its line, LF and ESC made "?" '
           . '(or refused by hiredis 1.x)') or diag join '', @l;
        ok(!grep({ /\x1b/ } @all), 'error: no escape byte reaches the log');
        next;
    }

    if ($mode eq 'longerror') {
        my ($text) = map { /redis "[^"]+" error: (ERR [^,]*),/ ? $1 : () } @l;
        is($text, 'ERR ?[31m' . ('A' x 503),
           'longerror: an error text is cut to 512 bytes, ESC made "?"')
            or diag join '', @l;
        next;
    }

    my $why = $mode =~ /array|nested$/ ? 'more array elements than any reply'
                                       : 'a bulk string longer than any record';
    my @invalid = grep { /sent an invalid reply/ } @l;
    ok(@invalid == 1 && $invalid[0] =~ /\Q$why\E/,
       "$mode: one error line, a protocol error: $why")
        or diag join '', @l;
    is(hostile_count() - $before, 1, "$mode: the fake Redis was hostile once");
}

my @crit = log_problems($fake_log);
is(scalar @crit, 0, 'the fake Redis edge logged no alert or crash')
    or diag join '', @crit;

done_testing();
