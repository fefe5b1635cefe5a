# idempotency_admin's listing (issue 29, item 6): GET ?list=STATE walks
# the record keys a page at a time (SCAN, never KEYS), each key by its
# hash, with the cursor of the next page or null at the end.
# - records in every state made by real requests: completed (plain and
#   sealed), unknown (an upstream that timed out after it got the
#   request), in_progress (a slow upstream), too_large; each state lists
#   exactly its hashes, the $idempotency_key_hash of the access log
# - keys that are no record (another application's string, a fresh-key
#   record "...}:f") are scanned, never listed
# - count=1 walks every record across pages (two workers: the cursor is
#   good in either) and ends
# - a bad state, count or cursor: 400 problem+json; DELETE: 405; a remote
#   client without allow_remote: 403; a paused Redis: 503 within
#   idempotency_redis_timeout
# - Redis Cluster (util/topology.sh on TOPO_BASE, default 27800): unknown
#   keys spread over several masters are all listed, master after master
# Plain Test::More: its own nginx on 19940-19941 and TOPO_BASE+310/311.
# topology: yes (make test-topologies runs this file)
use strict;
use warnings;
use lib 't/lib';
use Test::More;
use Fleet;
use TopoTest;
use JSON::PP;
use IO::Socket::INET;
use Digest::SHA qw(sha256_hex);
use Time::HiRes qw(sleep time);
use POSIX ();

plan skip_all => 'TEST_NGINX_LOAD_MODULES must name the module'
    unless have_module();
plan skip_all => 'the echo module is needed'
    unless grep { /echo/ } split /\s+/, ($ENV{TEST_NGINX_LOAD_MODULES} || '');

my $slow = $ENV{TEST_ASAN} ? 3 : 1;
my ($port, $be_port) = (19940, 19941);
my $redis_port = $ENV{TEST_NGINX_REDIS_PORT} || 6379;
my $db = 11;
my $root = fleet_root('admin-list');
my $base = 'https://errors.example/idempotency';

sub cli_db {
    my $cmd = join ' ', map { "'$_'" } @_;
    my $out = `$ENV{REDIS_CLI} -p $redis_port -n $db $cmd 2>/dev/null`;
    chomp $out;
    return $out;
}

# a keyspace of this test's own
cli_db('FLUSHDB');

open my $kf, '>', "$root/enc.key" or die;
binmode $kf;
print $kf join '', map { chr int rand 256 } 1 .. 32;
close $kf;
chmod 0600, "$root/enc.key";

# the front and its backend; proxy_read_timeout makes /late unknown
sub front {
    my ($redis, $fport, $bport, $logs) = @_;
    return <<"EOC";
    idempotency_redis $redis;
    idempotency_redis_prefix list:;
    idempotency_redis_timeout 3s;
    idempotency_problem_base_uri $base;
    log_format hashes '\$http_idempotency_key \$idempotency_key_hash';
    server {
        listen 127.0.0.1:$fport;
        access_log $logs/hashes.log hashes;
        add_header X-Idem \$idempotency_status always;
        set_real_ip_from 127.0.0.1;
        real_ip_header X-Real-IP;
        location / {
            idempotency on;
            idempotency_store_max_size 1k;
            proxy_read_timeout @{[ 400 * $slow ]}ms;
            proxy_pass http://127.0.0.1:$bport;
        }
        location /slow {
            idempotency on;
            proxy_read_timeout 30s;
            proxy_pass http://127.0.0.1:$bport;
        }
        location /enc/ {
            idempotency on;
            idempotency_encrypt_key $root/enc.key id=k-1;
            proxy_pass http://127.0.0.1:$bport/;
        }
        location = /admin {
            idempotency_admin;
        }
    }
    server {
        listen 127.0.0.1:$bport;
        location /pay { return 201 '{"id":"ch_1"}'; }
        location /late { echo_sleep @{[ 1.2 * $slow ]}; echo "charged"; }
        location /slow { echo_sleep @{[ 4 * $slow ]}; echo "slow"; }
        location /big { echo_duplicate 4096 "x"; }
    }
EOC
}

my $dir = nginx_conf('list',
                     front("127.0.0.1:$redis_port db=$db", $port, $be_port,
                           "$root/list/logs"));
nginx_start($dir);
sleep 0.3;

sub req {
    my ($method, $path, $extra, $p) = @_;
    my $s = IO::Socket::INET->new("127.0.0.1:" . ($p // $port)) or return {};
    print $s "$method $path HTTP/1.0\r\nHost: x\r\n" . ($extra // '') . "\r\n";
    local $/;
    my $res = <$s> // '';
    my ($status) = $res =~ m{^HTTP/1\.\d (\d+)};
    my ($head, $body) = split /\r\n\r\n/, $res, 2;
    return { status => $status // 0, head => $head // '', body => $body // '' };
}

sub json { eval { decode_json($_[0]{body}) } || {} }

# walk(state, count, port): every page to the end -> (hashes, pages, ok,
# the entries by hash, the masters the cursors named)
sub walk {
    my ($state, $count, $p) = @_;
    my (@hashes, %entry, %masters);
    my ($cursor, $pages, $ok) = (undef, 0, 1);
    while ($pages < 5000) {
        my $q = "/admin?list=$state&count=$count"
                . (defined $cursor ? "&cursor=$cursor" : '');
        my $r = req('GET', $q, undef, $p);
        $pages++;
        my $j = json($r);
        if ($r->{status} != 200 || ref $j->{keys} ne 'ARRAY') {
            diag "$q: $r->{status} $r->{body}";
            $ok = 0;
            last;
        }
        for my $k (@{ $j->{keys} }) {
            push @hashes, $k->{hash};
            $entry{ $k->{hash} } = $k;
        }
        $cursor = $j->{next_cursor};
        last unless defined $cursor;
        $masters{$1} = 1 if $cursor =~ /^(\d+)-/;
    }
    $ok = 0 if defined $cursor;
    return ([sort @hashes], $pages, $ok, \%entry, [sort keys %masters]);
}

# the hash of each key, as the access log wrote it
sub hashes_of {
    my $logs = shift;
    my %h;
    for (lines_of("$logs/hashes.log")) {
        $h{$1} = $2 if /^(\S+) ([0-9a-f]{64})$/;
    }
    return \%h;
}

my $run = int(time * 1000);
my %key = (
    completed => ["$run-c1", "$run-c2", "$run-e1"],
    unknown   => ["$run-u1", "$run-u2"],
    too_large => ["$run-b1"],
    in_progress => ["$run-p1"],
);

# an in-progress claim: its upstream runs while the listing looks
my $pid = fork // die;
if ($pid == 0) {
    http_post($port, "$run-p1", 'x', '/slow');
    POSIX::_exit(0);
}

is(http_post($port, "$run-c1", 'x', '/pay')->{status}, 201, 'stored: c1');
is(http_post($port, "$run-c2", 'x', '/pay')->{status}, 201, 'stored: c2');
is(http_post($port, "$run-e1", 'x', '/enc/pay')->{status}, 201,
   'stored sealed: e1');
is(http_post($port, "$run-u1", 'x', '/late')->{status}, 504,
   'an upstream that timed out after it got the request: u1');
is(http_post($port, "$run-u2", 'x', '/late')->{status}, 504, '...u2');
is(http_post($port, "$run-b1", 'x', '/big')->{status}, 200,
   'too large to store: b1');
sleep 0.3;

# what is no record: never listed, whatever its name
my $foreign = sha256_hex("foreign-$run");
cli_db('SET', "list:{$foreign}", 'not a record of the module');
cli_db('SET', "list:{$foreign}:f", 'a fresh-key record');
cli_db('SET', "other:{$foreign}", 'another prefix');

my $hashes = hashes_of("$dir/logs");
my %want;
for my $state (keys %key) {
    for my $k (@{ $key{$state} }) {
        my $h = $hashes->{$k} // sha256_hex("\0$k");
        is($h, sha256_hex("\0$k"), "$k: \$idempotency_key_hash")
            if exists $hashes->{$k};
        push @{ $want{$state} }, $h;
    }
}
my @all = sort map { @$_ } values %want;

for my $state (sort keys %want) {
    my ($got, $pages, $ok, $entry) = walk($state, 1000);
    ok($ok, "list=$state: walked to the end");
    is_deeply($got, [sort @{ $want{$state} }], "list=$state: exactly its keys")
        or diag explain $got;
    is($entry->{$_}{state}, $state, "...$state in the entry")
        for @{ $want{$state} };
}

my ($got, $pages, $ok, $entry) = walk('all', 1000);
is_deeply($got, \@all, 'list=all: every record, nothing else')
    or diag explain $got;

my $u = $entry->{ $want{unknown}[0] };
is($u->{status}, 504, 'an unknown entry: the status of its outcome');
ok(($u->{ttl_ms} // 0) > 0, '...its time to live in ms');
is($u->{lease_until}, undef, '...no lease');
is($entry->{ $want{completed}[2] }{sealed}, JSON::PP::true,
   'the sealed record: sealed true');
is($entry->{ $want{completed}[0] }{sealed}, JSON::PP::false,
   'a plain one: sealed false');
like($entry->{ $want{in_progress}[0] }{lease_until} // '', qr/^\d{4}-/,
     'the claim in progress: its lease');
is($entry->{ $want{completed}[0] }{status}, undef,
   'a completed entry: no status from the head alone');

# a page at a time: count=1, across both workers, to the end
($got, $pages, $ok) = walk('all', 1);
ok($ok, "count=1: the walk ends ($pages pages)");
is_deeply($got, \@all, '...and found every record once');
cmp_ok($pages, '>', 1, '...over several pages');

my $r = req('GET', '/admin?list=unknown&count=1000');
my $j = json($r);
is($j->{state}, 'unknown', 'the answer names the state');
is($j->{count}, 1000, '...and the count');
is($j->{scanned}, scalar(@all) + 1,
   '...scanned: every key SCAN matched, records or not');
like($r->{head}, qr{^Content-Type: application/json}mi, '...as JSON');

# refusals: problem+json that says what to send
sub problem {
    my ($r, $status, $code, $detail, $name) = @_;
    is($r->{status}, $status, "$name: $status");
    like($r->{head}, qr{^Content-Type: application/problem\+json}mi,
         '...as application/problem+json');
    my $j = json($r);
    is($j->{type}, "$base#$code", "...type $code");
    like($j->{detail} // '', $detail, '...a detail that says what to send');
}

problem(req('GET', '/admin?list=unkown'), 400, 'admin-list-state-invalid',
        qr/unknown, in_progress, completed, too_large or all/, 'a bad state');
problem(req('GET', '/admin?list='), 400, 'admin-list-state-invalid',
        qr/\?list= takes/, 'an empty state');
for my $c ('0', '1001', 'abc', '', '99999999999999999999999') {
    problem(req('GET', "/admin?list=all&count=$c"), 400,
            'admin-list-count-invalid', qr/from 1 to 1000/, "count=$c");
}
for my $c ('xyz', '5', '0-', '-0', '0-1x', '70000-0',
           '0-99999999999999999999')
{
    problem(req('GET', "/admin?list=all&cursor=$c"), 400,
            'admin-list-cursor-invalid', qr/next_cursor of the page before/,
            "cursor=$c");
}
is(req('DELETE', '/admin?list=all')->{status}, 405, 'DELETE of a list: 405');
problem(req('GET', '/admin?list=all', "X-Real-IP: 10.1.2.3\r\n"), 403,
        'admin-remote-refused', qr/allow_remote/,
        'a remote client without allow_remote');

# a Redis that does not answer: 503 within idempotency_redis_timeout (3s),
# before the server wakes; its late replies find no request, and the next
# listing works
system("$ENV{REDIS_CLI} -p $redis_port DEBUG SLEEP 5 >/dev/null 2>&1 &");
sleep 0.3;
my $t0 = time;
problem(req('GET', '/admin?list=all&count=1000'), 503,
        'admin-store-unavailable', qr/idempotency_redis_timeout/,
        'a paused Redis');
cmp_ok(time - $t0, '<', 4.6, '...answered by the timeout, not by Redis');
ok(wait_until(15, sub {
       req('GET', '/admin?list=all&count=1000')->{status} == 200 }),
   '...and the listing works once Redis answers again');

# a cursor past the last master: the walk is over
$j = json(req('GET', '/admin?list=all&cursor=1-0'));
is_deeply($j->{keys}, [], 'a cursor past the last master: no key');
ok(exists $j->{next_cursor} && !defined $j->{next_cursor},
   '...next_cursor null');

waitpid $pid, 0;
nginx_stop($dir);
is(join('', log_problems("$dir/logs/error.log")), '', 'no crash, no alert');
cli_db('FLUSHDB');

# --- Redis Cluster: unknown keys on several masters ---------------------------

SKIP: {
    skip "$ENV{REDIS_SERVER} is needed for a cluster", 6
        unless $ENV{REDIS_SERVER} && `which $ENV{REDIS_SERVER}`;

    my $tbase = $ENV{TOPO_BASE} || 27800;
    $ENV{TOPO_BASE} = $tbase;
    $ENV{TOPO_DIR} ||= "/tmp/ngx-idempotency-topo-cluster-$tbase";
    my $topo = 'util/topology.sh';
    my $seed = $tbase + 11;
    my ($cport, $cbe) = ($tbase + 310, $tbase + 311);

    my $up = 1;
    END {
        local $?;
        system("util/topology.sh down cluster $ENV{TOPO_DIR} >/dev/null 2>&1")
            if $up && $ENV{TOPO_DIR};
    }
    topo('up', 'cluster', $ENV{TOPO_DIR});
    BAIL_OUT('no cluster') if $?;

    my $cdir = nginx_conf('list-cluster',
                          front("127.0.0.1:$seed cluster", $cport, $cbe,
                                "$root/list-cluster/logs"));
    nginx_start($cdir);
    for (1 .. 50) {
        last if http_post($cport, "warm-$run-$_", 'x', '/pay')->{status}
                == 201;
        sleep 0.1;
    }

    # unknown keys, spread by their hashes over the masters
    my (%on, @unknown);
    my @pids;
    for my $i (1 .. 9) {
        my $k = "$run-cu$i";
        push @unknown, sha256_hex("\0$k");
        my $p = fork // die;
        if ($p == 0) {
            http_post($cport, $k, 'x', '/late');
            POSIX::_exit(0);    # no END block: the cluster stays up
        }
        push @pids, $p;
    }
    waitpid $_, 0 for @pids;
    sleep 0.3;

    my %slot_master;
    for my $h (@unknown) {
        my $slot = redis_cli_at($seed, 'CLUSTER', 'KEYSLOT', $h);
        my $owner = 0;
        for my $mp (map { /:(\d+)@/ ? $1 : () }
                    grep { /\bmaster\b/ && !/\bfail/ }
                    split /\n/, redis_cli_at($seed, 'CLUSTER', 'NODES'))
        {
            $owner = $mp
                if redis_cli_at($mp, 'EXISTS', "list:{$h}") eq '1';
        }
        $on{$owner}++;
    }
    cmp_ok(scalar(keys %on), '>=', 2,
           'the unknown keys are on several masters')
        or diag explain \%on;

    my ($cgot, $cpages, $cok, undef, $masters) = walk('unknown', 1000, $cport);
    ok($cok, "cluster: the walk ends ($cpages pages)");
    is_deeply($cgot, [sort @unknown], 'cluster: every unknown key, once')
        or diag explain $cgot;
    cmp_ok(scalar(@$masters), '>=', 2, '...master after master')
        or diag explain $masters;

    ($cgot, $cpages, $cok) = walk('unknown', 1, $cport);
    ok($cok && eq_array($cgot, [sort @unknown]),
       "cluster: count=1 too ($cpages pages)") or diag explain $cgot;

    nginx_stop($cdir);
    is(join('', log_problems("$cdir/logs/error.log")), '',
       'cluster: no crash, no alert');
}

done_testing();
