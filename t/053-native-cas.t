# Compare-and-set without Lua: on a server with SET ... IFEQ (Valkey 8.1
# and Redis 8.4 and later) an ACL user who may not run scripts keeps every
# guarantee: every finish, renewal, release and take-over is a native
# command, checked here by the server's own command statistics.  A finish
# that finds the owner's claim under another lease word compares again.
# The admin's purge reads the record and deletes exactly what it read.
# Where the server also compares and deletes (DELIFEQ on Valkey 9.0, DELEX
# on Redis 8.4) a release deletes the claim at once, and the native path is
# the default even for a user who may run scripts (the last part).  On
# other servers the script path is the whole suite's, and t/015 checks
# that a scripting-blocked server without IFEQ claims nothing.
# Plain Test::More: its own nginx instances (an edge and an origin).
use strict;
use warnings;
use lib 't/lib';
use Test::More;
use Fleet;
use IO::Socket::INET;
use Time::HiRes qw(sleep time);

plan skip_all => 'TEST_NGINX_LOAD_MODULES must name the module'
    unless have_module();

my $redis_port = $ENV{TEST_NGINX_REDIS_PORT} || 6379;
my $caps = server_caps();

plan skip_all => "$caps->{kind} $caps->{version} has no SET IFEQ (Valkey 8.1 "
               . 'or Redis 8.4 and later): the script path is every other '
               . 'file\'s'
    unless $caps->{ifeq};
diag "$caps->{kind} $caps->{version}: SET IFEQ"
     . ($caps->{delifeq} ? ", \U$caps->{del}\E" : ', no compare-and-delete');

my $slow = $ENV{TEST_ASAN} ? 3 : 1;
my ($edge, $origin_port) = (20530, 20531);
my $root = fleet_root('nativecas');

redis_cli('ACL', 'SETUSER', 'idemnolua', 'reset', 'on', '>s3cret', '~*',
          '+@all', '-@scripting');

my $parent = $$;
END { redis_cli('ACL', 'DELUSER', 'idemnolua') if ($parent // 0) == $$ }

my $origin = nginx_conf('origin', <<"EOC", 1);
    log_format exec '\$http_idempotency_key \$uri \$http_idempotency_previous_outcome';
    server {
        listen 127.0.0.1:$origin_port;
        access_log logs/exec.log exec;
        location /quick { return 201 "charged\\n"; }
        location /busy { return 503 "try later\\n"; }
        location /slowbusy {               # fails after a renewal
            echo_sleep @{[ 2.6 * $slow ]};
            echo_status 503;
            echo "try later";
        }
        location /slow {                   # longer than twice the lock
            echo_sleep @{[ 2.6 * $slow ]};
            echo "charged slowly";
        }
        location /late {                   # answers after the read timeout
            echo_sleep @{[ 1.0 * $slow ]};
            echo "charged";
        }
        location /reconcile {              # answers a retry it recognises
            if (\$http_idempotency_previous_outcome = unknown) {
                return 200 "reconciled\\n";
            }
            echo_sleep @{[ 1.0 * $slow ]};
            echo "charged";
        }
    }
EOC
nginx_start($origin);

my $dir = nginx_conf('edge', <<"EOC", 2);
    idempotency_redis 127.0.0.1:$redis_port user=idemnolua password=s3cret;
    server {
        listen 127.0.0.1:$edge;
        add_header X-Idem \$idempotency_status always;
        idempotency_lock_ttl 1s;
        proxy_read_timeout @{[ 500 * $slow ]}ms;
        location / {
            idempotency on;
            idempotency_redis_prefix "cas:";
            proxy_pass http://127.0.0.1:$origin_port;
        }
        location /long/ {
            idempotency on;
            idempotency_redis_prefix "long:";
            proxy_read_timeout 10s;
            proxy_pass http://127.0.0.1:$origin_port/;
        }
        location /held/ {
            idempotency on;
            idempotency_redis_prefix "held:";
            idempotency_lock_ttl 30s;
            proxy_read_timeout 10s;
            proxy_pass http://127.0.0.1:$origin_port/;
        }
        location /forward/ {
            idempotency on;
            idempotency_redis_prefix "fwd:";
            idempotency_on_unknown forward;
            proxy_pass http://127.0.0.1:$origin_port/;
        }
        location = /admin {
            idempotency_admin;
            idempotency_redis_prefix "cas:";
        }
        location = /admin-held {
            idempotency_admin;
            idempotency_redis_prefix "held:";
        }
    }
EOC
nginx_start($dir);
sleep 0.5 * $slow;

sub runs {
    my $key = shift;
    sleep 0.2;
    return scalar grep { /^\Q$key\E / } lines_of("$origin/logs/exec.log");
}

sub stats {
    my %n;
    for (split /\n/, join "\n", redis_cli('INFO', 'commandstats')) {
        $n{$1} = $2 if /^cmdstat_(\w+(?:\|\w+)?):calls=(\d+)/;
    }
    return \%n;
}

sub admin {
    my ($method, $path) = @_;
    my $s = IO::Socket::INET->new("127.0.0.1:$edge") or return {};
    print $s "$method $path HTTP/1.0\r\nHost: x\r\n\r\n";
    local $/;
    my $res = <$s> // '';
    my ($status) = $res =~ m{^HTTP/1\.\d (\d+)};
    return { status => $status // 0 };
}

sub raw_redis {    # a command with binary arguments, by RESP
    my @args = @_;
    my $s = IO::Socket::INET->new(PeerAddr => "127.0.0.1:$redis_port")
        or return;
    print $s '*' . @args . "\r\n"
        . join('', map { '$' . length($_) . "\r\n$_\r\n" } @args);
    my $line = <$s>;
    return $line;
}

# another edge on port, one worker, its Redis user's words, its prefix
sub simple_edge {
    my ($name, $port, $user, $prefix) = @_;
    my $d = nginx_conf($name, <<"EOC", 1);
    idempotency_redis 127.0.0.1:$redis_port$user;
    server {
        listen 127.0.0.1:$port;
        add_header X-Idem \$idempotency_status always;
        location / {
            idempotency on;
            idempotency_redis_prefix "$prefix";
            proxy_pass http://127.0.0.1:$origin_port;
        }
        location = /metrics { idempotency_metrics; }
    }
EOC
    nginx_start($d);
    sleep 0.3 * $slow;
    return $d;
}

# the owner of key runs path (under held:, the only claim there) while
# its claim's lease word is rewritten to a later deadline, as a renewal
# whose reply was lost would leave it; the owner answers want
sub word_rewritten {
    my ($key, $path, $want) = @_;
    my $pid = fork // die;
    if (!$pid) {
        my $r = http_post($edge, $key, 'x', $path, '', 10);
        exit(idem_status($r) eq $want ? 0 : 1);
    }
    my @keys;
    for (1 .. 20) {
        @keys = grep { /\S/ } split /\n/, redis_cli('KEYS', 'held:*');
        last if @keys;
        sleep 0.05;
    }
    is(scalar @keys, 1, 'the claim is there');
    my $set = raw_redis('SETRANGE', $keys[0] // 'none', 47,
                        "\x00\xff\xff\xff\xff\x00");
    like($set // '', qr/^:53/, 'its lease word rewritten');
    waitpid $pid, 0;
    is($? >> 8, 0, "the owner: $want");
}

redis_cli('CONFIG', 'RESETSTAT');

# 1. stored and replayed, by a user who may not run scripts
{
    my $t = time;
    my $a = http_post($edge, "cas-a-$t", 'amount=1', '/quick');
    my $b = http_post($edge, "cas-a-$t", 'amount=1', '/quick');
    my $c = http_post($edge, "cas-a-$t", 'amount=2', '/quick');
    is(idem_status($a) . ', ' . idem_status($b) . ', ' . idem_status($c),
       '201 new, 201 replay, 422 mismatch', 'new, replay, mismatch');
    is($b->{body}, "charged\n", 'the replay is the response');
    is(runs("cas-a-$t"), 1, 'the origin ran once');
}

# 2. not stored (503): released natively, and a retry runs again; where
#    the server compares and deletes, the claim is deleted at once (a retry
#    right behind finds the key free), else set to itself for a millisecond
{
    my $t = time;
    my $before = stats()->{$caps->{del}} // 0;
    my $a = http_post($edge, "cas-b-$t", 'x', '/busy');
    sleep 0.05 unless $caps->{delifeq};
    my $b = http_post($edge, "cas-b-$t", 'x', '/busy');
    is(idem_status($a) . ', ' . idem_status($b), '503 new, 503 new',
       'a 503 is released: the retry runs');
    is(runs("cas-b-$t"), 2, 'the origin ran twice, as asked');
    if ($caps->{delifeq}) {
        is((stats()->{$caps->{del}} // 0) - $before, 2,
           "released by \U$caps->{del}\E, once each");
    }
}

# 2b. released when the claim holds another lease word (a renewal whose
#     reply was lost that landed after all): the release's compare fails
#     on the word, the owner's claim is recognised, and it is released
#     all the same: the retry runs again rather than meeting a stuck key
{
    my $t = time;
    word_rewritten("cas-r-$t", '/held/slowbusy', '503 new');
    sleep 0.05;    # released by the compare-and-set: a millisecond later
    my $r = http_post($edge, "cas-r-$t", 'x', '/held/slowbusy', '', 10);
    is(idem_status($r), '503 new', 'released all the same: the retry runs');
    is(runs("cas-r-$t"), 2, 'the origin ran twice, as asked');
}

# 3. longer than the lock: renewed natively, a duplicate meanwhile gets
#    409, and the store lands on the renewed claim
{
    my $t = time;
    my $pid = fork // die;
    if (!$pid) {
        my $r = http_post($edge, "cas-c-$t", 'x', '/long/slow', '', 10);
        exit(idem_status($r) eq '200 new' ? 0 : 1);
    }
    sleep 1.5 * $slow;
    my $dup = http_post($edge, "cas-c-$t", 'x', '/long/slow');
    waitpid $pid, 0;
    is($? >> 8, 0, 'the slow owner: 200 new');
    is(idem_status($dup), '409 conflict',
       'a duplicate past the first lock: the renewed claim holds');
    my $r = http_post($edge, "cas-c-$t", 'x', '/long/slow');
    is(idem_status($r), '200 replay', 'then the stored response');
    is(runs("cas-c-$t"), 1, 'the origin ran once');
}

# 4. the claim under another lease word when the owner finishes (a
#    renewal whose reply was lost that landed after all): the finish
#    compares again with the owner's own claim, and stores
{
    my $t = time;
    word_rewritten("cas-d-$t", '/held/slow', '200 new');
    my $r = http_post($edge, "cas-d-$t", 'x', '/held/slow');
    is(idem_status($r), '200 replay', 'its response was stored');
    is(scalar(grep { /claim was lost/ } lines_of("$dir/logs/error.log")), 0,
       'not taken for a lost claim');
}

# 5. the upstream answered too late: the unknown outcome is written
#    natively; under forward a retry takes the key over natively, tells the
#    origin, and its answer is stored
{
    my $t = time;
    my $a = http_post($edge, "cas-e-$t", 'x', '/late');
    sleep 1.0 * $slow;
    my $b = http_post($edge, "cas-e-$t", 'x', '/late');
    is(idem_status($a) . ', ' . idem_status($b), '504 new, 504 unknown',
       'a timeout is an unknown outcome, kept');
    my $f = http_post($edge, "cas-f-$t", 'x', '/forward/reconcile');
    sleep 1.0 * $slow;
    my $g = http_post($edge, "cas-f-$t", 'x', '/forward/reconcile');
    my $h = http_post($edge, "cas-f-$t", 'x', '/forward/reconcile');
    is(idem_status($f), '504 new', 'forward: the first times out');
    is(idem_status($g), '200 new', 'forward: a retry takes the key over');
    is($g->{body}, "reconciled\n", '...told of the unknown outcome');
    is(idem_status($h), '200 replay', '...and its answer is stored');
}

# 6. the admin's purge without a script: a completed record is deleted
#    and its key runs again; a claim in progress is refused (409) unless
#    forced; a key without a record is 404
{
    my $t = time;
    my $a = http_post($edge, "cas-g-$t", 'x', '/quick');
    is(admin('GET', "/admin?key=cas-g-$t")->{status}, 200,
       'the admin sees the record');
    is(admin('DELETE', "/admin?key=cas-g-$t")->{status}, 204,
       'DELETE of a completed record: 204');
    sleep 0.05;
    is(admin('GET', "/admin?key=cas-g-$t")->{status}, 404, '...it is gone');
    my $b = http_post($edge, "cas-g-$t", 'x', '/quick');
    is(idem_status($a) . ', ' . idem_status($b), '201 new, 201 new',
       '...and the key runs again');
    is(admin('DELETE', "/admin?key=cas-none-$t")->{status}, 404,
       'DELETE without a record: 404');

    my $pid = fork // die;
    if (!$pid) {
        http_post($edge, "cas-h-$t", 'x', '/held/slow', '', 10);
        exit 0;
    }
    my $seen = 0;
    for (1 .. 40) {
        $seen = admin('GET', "/admin-held?key=cas-h-$t")->{status} == 200
            and last;
        sleep 0.05;
    }
    ok($seen, 'a claim in progress is there');
    is(admin('DELETE', "/admin-held?key=cas-h-$t")->{status}, 409,
       'DELETE of a claim in progress: 409');
    is(admin('DELETE', "/admin-held?key=cas-h-$t&force=1")->{status}, 204,
       '...unless &force=1');
    waitpid $pid, 0;
    is(scalar(grep { /record purged by .*\(forced\)/ }
              lines_of("$dir/logs/error.log")), 1, 'the forced purge logged');
}

# none of it ran a script: the module's user may not, and needs not
{
    my $n = stats();
    is($n->{eval} // 0, 0, 'no EVAL');
    is($n->{evalsha} // 0, 0, 'no EVALSHA');
    ok(($n->{set} // 0) >= 10, "SET did it all ($n->{set} calls)");
    is(scalar(grep { /forbids scripting|refused to (store|release)/ }
              lines_of("$dir/logs/error.log")), 0,
       'nothing refused, nothing missing');
    is(scalar log_problems("$dir/logs/error.log"), 0, 'no crash or alert');
}

# 7. a user who may run scripts: where the server compares and sets and
#    deletes, the native path all the same (no script runs); where it only
#    compares and sets, the scripts (they release a key at once)
{
    my $port2 = 20532;
    my $d2 = simple_edge('edge-scripts', $port2, '', 'dflt:');
    redis_cli('CONFIG', 'RESETSTAT');
    my $t = time;
    my @r = (http_post($port2, "dflt-a-$t", 'x', '/quick'),
             http_post($port2, "dflt-a-$t", 'x', '/quick'),
             http_post($port2, "dflt-b-$t", 'x', '/busy'),
             http_post($port2, "dflt-b-$t", 'x', '/busy'));
    is(join(', ', map { idem_status($_) } @r),
       '201 new, 201 replay, 503 new, 503 new',
       'scripts allowed: stored, replayed, released at once');
    is(runs("dflt-a-$t") . ' ' . runs("dflt-b-$t"), '1 2',
       '...the origin ran once, then twice as asked');
    my $n = stats();
    my $s = IO::Socket::INET->new("127.0.0.1:$port2");
    print $s "GET /metrics HTTP/1.0\r\nHost: x\r\n\r\n" if $s;
    my $metrics = $s ? do { local $/; <$s> // '' } : '';
    if ($caps->{native}) {
        is($n->{evalsha} // 0, 0, 'no script ran: native by default');
        is($n->{eval} // 0, 0, '...no EVAL either');
        is($n->{$caps->{del}} // 0, 2, "the releases: \U$caps->{del}\E");
        like($metrics, qr/^nginx_idempotency_redis_info\{.*cas="native"\} 1/m,
             'redis_info says native');
    } else {
        ok(($n->{evalsha} // 0) >= 2,
           "no compare-and-delete: the scripts finish ($n->{evalsha} EVALSHA)");
        like($metrics, qr/^nginx_idempotency_redis_info\{.*cas="script"\} 1/m,
             'redis_info says script');
    }
    is(scalar log_problems("$d2/logs/error.log"), 0, 'no crash or alert');
    nginx_stop($d2);
}

# 8. an ACL written before the server could compare and delete (scripts
#    allowed, DELIFEQ or DELEX not): the release is refused, said once at
#    warn, and done all the same, by the compare-and-set; then by script
if ($caps->{native}) {
    my $port3 = 20533;
    redis_cli('ACL', 'SETUSER', 'idemnodel', 'reset', 'on', '>s3cret', '~*',
              '&*', '+@all', "-$caps->{del}");
    my $d3 = simple_edge('edge-nodel', $port3,
                         ' user=idemnodel password=s3cret', 'nodel:');
    my $t = time;
    my @r = (http_post($port3, "nodel-a-$t", 'x', '/busy'));
    sleep 0.05;
    push @r, http_post($port3, "nodel-a-$t", 'x', '/busy'),
             http_post($port3, "nodel-a-$t", 'x', '/busy');
    is(join(', ', map { idem_status($_) } @r), '503 new, 503 new, 503 new',
       'the delete refused: released all the same, each time');
    is(runs("nodel-a-$t"), 3, '...the origin ran each, as asked');
    is(scalar(grep { /\[warn\].*refused \U$caps->{del}\E: NOPERM/ }
              lines_of("$d3/logs/error.log")), 1, '...said once at warn');
    is(scalar log_problems("$d3/logs/error.log"), 0, 'no crash or alert');
    nginx_stop($d3);
    redis_cli('ACL', 'DELUSER', 'idemnodel');
}

diag "the edge's log:\n",
     grep { /\[(warn|error|crit|alert|emerg)\]/ } lines_of("$dir/logs/error.log")
    unless Test::More->builder->is_passing;

nginx_stop($dir);
nginx_stop($origin);

done_testing();
