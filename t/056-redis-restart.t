# A Redis that restarts, is busy, or forbids scripting for a while: nothing
# the module learns while the server cannot answer becomes a conclusion
# that outlives it, and no reload is needed.
#   1. A real restart of a Redis that holds enough data to load for more
#      than a second: the workers reconnect while it answers LOADING (to
#      SCRIPT LOAD too); within seconds of the load's end new keys run once
#      and replay, under idempotency_on_redis_error reject and pass.
#   2. BUSY: the module's connections are killed while a script runs, so
#      that their handshakes meet BUSY; logged at warn as not ready (no
#      refused handshake), and after SCRIPT KILL keys are protected again.
#   3. NOPERM: a user without scripting on a server without SET IFEQ gets
#      no key claimed (the ACL named, the refusals counted); once the ACL
#      allows scripting, claims work again after the backoff.
# Plain Test::More: its own Redis (restarted, on its own port and dir) and
# its own nginx instances.
use strict;
use warnings;
use lib 't/lib';
use Test::More;
use Fleet;
use IO::Socket::INET;
use IO::Select;
use Time::HiRes qw(sleep time);

plan skip_all => 'TEST_NGINX_LOAD_MODULES must name the module'
    unless have_module();

my $slow = $ENV{TEST_ASAN} ? 3 : 1;
my ($rport, $edge, $acl_edge) = (20560, 20561, 20562);
my $root = fleet_root('restart');
my $rdir = "$root/redis";
mkdir $rdir;

my $keys = $ENV{TEST_RESTART_KEYS} || 2_500_000;

# the private Redis: stopped at the end, whatever happened
my $parent = $$;
END {
    if (($parent // 0) == $$) {
        my $rc = $?;
        redis_stop();
        unlink "$rdir/dump.rdb";    # tens of MB
        $? = $rc;
    }
}

sub redis_start {
    system($ENV{REDIS_SERVER}, '--port', $rport, '--bind', '127.0.0.1',
           '--daemonize', 'yes', '--dir', $rdir, '--dbfilename', 'dump.rdb',
           '--save', '', '--appendonly', 'no', '--pidfile', "$rdir/redis.pid",
           '--logfile', "$rdir/redis.log", '--enable-debug-command', 'yes',
           '--lua-time-limit', '100') == 0
        or die "cannot start $ENV{REDIS_SERVER}";
}

sub redis_pidof {
    open my $fh, '<', "$rdir/redis.pid" or return;
    my $pid = <$fh>;
    chomp $pid if defined $pid;
    return $pid;
}

sub redis_stop {
    my $pid = redis_pidof() or return;
    kill 'TERM', $pid;
    for (1 .. 100) {
        last unless kill 0, $pid;
        sleep 0.1;
    }
    kill 'KILL', $pid if kill 0, $pid;
    unlink "$rdir/redis.pid";
}

# one command by RESP on a new connection; its first reply line, or ''
sub ask {
    my @args = @_;
    my $s = IO::Socket::INET->new(PeerAddr => "127.0.0.1:$rport",
                                  Timeout => 2) or return '';
    print $s '*' . @args . "\r\n"
        . join('', map { '$' . length($_) . "\r\n$_\r\n" } @args);
    my $sel = IO::Select->new($s);
    return '' unless $sel->can_read(60 * $slow);
    my $line = <$s> // '';
    $line =~ s/\r?\n\z//;
    return $line;
}

sub cli { return redis_cli_at($rport, @_) }

# poll(seconds, sub): the sub's first true value, or undef after the time
sub poll {
    my ($secs, $f) = @_;
    my $deadline = time + $secs * $slow;
    while (time < $deadline) {
        my $v = $f->();
        return $v if $v;
        sleep 0.05;
    }
    return undef;
}

sub errlog { return join '', lines_of("$_[0]/logs/error.log") }

sub runs {
    my ($dir, $key) = @_;
    return settled(sub {
        scalar grep { /^\Q$key\E$/ } lines_of("$dir/logs/backend.log")
    });
}

sub metric {
    my ($port, $re) = @_;
    my $s = IO::Socket::INET->new("127.0.0.1:$port") or return;
    print $s "GET /metrics HTTP/1.0\r\nHost: x\r\n\r\n";
    local $/;
    my $res = <$s> // '';
    return $res =~ $re ? $1 : undef;
}

sub instance {
    my ($name, $port, $redis) = @_;
    my $dir = "$root/$name";
    # one location per idempotency_on_redis_error, each its own prefix
    my $locations = join '', map { <<"EOL" } qw(reject pass);
        location = /$_ {
            idempotency on;
            idempotency_redis_prefix "$_:";
            idempotency_on_redis_error $_;
            add_header X-Idem \$idempotency_status always;
            proxy_pass http://127.0.0.1:$port/backend;
        }
EOL
    my $d = nginx_conf($name, <<"EOC", 2);
    idempotency_redis $redis;
    log_format backend '\$http_idempotency_key';
    server {
        listen 127.0.0.1:$port;
$locations
        location = /backend {
            access_log $dir/logs/backend.log backend;
            return 201 "ok\\n";
        }
        location = /metrics { idempotency_metrics; }
    }
EOC
    nginx_start($d);
    return $d;
}

# a fresh key at path answered "201 new" (claims work again), polled
my $probe = 0;
sub claims_work {
    my ($port, $path, $secs) = @_;
    return poll($secs, sub {
        my $r = http_post($port, "probe-$path-" . ++$probe . "-$$", 'x',
                          $path, '', 5);
        return idem_status($r) eq '201 new';
    });
}

# each of n fresh keys runs once, then replays, at path
sub protected {
    my ($dir, $port, $path, $prefix, $n) = @_;
    my (@first, @second, @runs);
    for my $i (1 .. $n) {
        my $key = "$prefix-$path-$i-$$";
        push @first, idem_status(http_post($port, $key, 'x', $path));
        # a retry that beats the record's store gets 409 (Retry-After)
        my $again;
        for (1 .. 20) {
            $again = idem_status(http_post($port, $key, 'x', $path));
            last unless $again eq '409 conflict';
            sleep 0.2;
        }
        push @second, $again;
        push @runs, $key;
    }
    is_deeply(\@first, [('201 new') x $n], "$prefix $path: each key runs");
    is_deeply(\@second, [('201 replay') x $n],
              "$prefix $path: each key replays");
    is_deeply([map { runs($dir, $_) } @runs], [(1) x $n],
              "$prefix $path: the upstream ran once per key");
}

redis_start();
ok(poll(10, sub { ask('PING') eq '+PONG' }), 'the private Redis is up');

my $caps = server_caps($rport);
diag "$caps->{kind} $caps->{version}";

# 1. a restart that loads a data set
{
    my $t0 = time;
    like(ask('DEBUG', 'POPULATE', $keys, 'fill'), qr/^\+OK/,
         "$keys keys populated");
    like(ask('SAVE'), qr/^\+OK/, 'saved');
    diag sprintf 'populated and saved in %.1f s', time - $t0;

    my $dir = instance('edge', $edge, "127.0.0.1:$rport");
    ok(claims_work($edge, '/reject', 10), 'claims work before the restart');
    protected($dir, $edge, $_, 'before', 2) for '/reject', '/pass';
    my $mark = length errlog($dir);

    # the same server on the same port, with its dump
    my $old = redis_pidof();
    ask('SHUTDOWN', 'NOSAVE');
    ok(poll(10, sub { !kill 0, $old }), 'Redis stopped');
    unlink "$rdir/redis.pid";

    redis_start();
    my $restarted = time;
    my $loading = poll(5, sub {
        my $p = ask('PING');
        return $p =~ /^-LOADING/ ? $p : undef;
    });
    ok($loading, 'Redis answers LOADING after the restart');

    # while it loads: answered as idempotency_on_redis_error says
    my $during = http_post($edge, "during-$$", 'x', '/reject');
    my $passed = http_post($edge, "during-$$", 'x', '/pass');
    my $still = ask('PING') =~ /^-LOADING/;

    my $loaded = poll(120, sub {
        return cli('INFO', 'persistence') =~ /^loading:0/m;
    });
    ok($loaded, 'the load ended');
    my $took = time - $restarted;
    diag sprintf 'loaded in about %.1f s', $took;
    cmp_ok($took, '>', 1, 'the load took over a second');

    like(substr(errlog($dir), $mark),
         qr/(?:SCRIPT LOAD|the scripts yet): LOADING/,
         'a worker reconnected while Redis was loading (SCRIPT LOAD met '
         . 'LOADING)');
    SKIP: {
        skip 'the load ended before the requests did', 2 unless $still;
        is(idem_status($during), '503 error', 'during the load, reject: 503');
        is(idem_status($passed), '201 error', 'during the load, pass: passed');
    }

    ok(claims_work($edge, '/reject', 10), 'reject: claims work again');
    ok(claims_work($edge, '/pass', 10), 'pass: claims work again');
    protected($dir, $edge, '/reject', 'restart', 6);
    protected($dir, $edge, '/pass', 'restart', 6);

    my $log = substr(errlog($dir), $mark);
    unlike($log, qr/forbids scripting/, 'the ACL is not blamed for LOADING');
    unlike($log, qr/refused SCRIPT LOAD: LOADING/,
           'LOADING is no refused SCRIPT LOAD');
    like($log, qr/\[warn\].*cannot load the scripts yet: LOADING/,
         'LOADING is said at warn, as a state that passes');
    like($log, qr/\[notice\].*loaded the scripts/,
         'and its end at notice');
    is(metric($edge, qr/^nginx_idempotency_redis_claims_refused_total\{redis="[^"]*"\} (\d+)/m),
       0, 'no claim refused for scripting');
    is(scalar log_problems("$dir/logs/error.log"), 0, 'no crash or alert');

    # the data set is not needed any more: the next cases are quicker
    ask('FLUSHALL');

    # 2. BUSY: the module's connections are killed while a script runs
    $mark = length errlog($dir);
    my $s = IO::Socket::INET->new(PeerAddr => "127.0.0.1:$rport",
                                  Timeout => 5);
    ok($s, 'a connection for the script');
    my $script = 'while true do end';
    # in one write: the kill (not of this connection), then the script
    print $s "*4\r\n\$6\r\nCLIENT\r\n\$4\r\nKILL\r\n\$4\r\nTYPE\r\n"
           . "\$6\r\nnormal\r\n"
           . "*3\r\n\$4\r\nEVAL\r\n\$" . length($script) . "\r\n$script\r\n"
           . "\$1\r\n0\r\n";
    ok(poll(10, sub { ask('PING') =~ /^-BUSY/ }), 'Redis is busy');

    ok(poll(10, sub {
        substr(errlog($dir), $mark) =~ /: BUSY \w+ is busy/
    }), 'a worker met BUSY in its handshake');

    my $busy_reject = http_post($edge, "busy-$$", 'x', '/reject', '', 10);
    is($busy_reject->{status}, 503, 'while busy, reject: 503');

    like(ask('SCRIPT', 'KILL'), qr/^\+OK/, 'the script killed');
    close $s;
    ok(poll(10, sub {
        my @l = substr(errlog($dir), $mark) =~ /connected to redis "[^"]+" again/g;
        return @l == 2;
    }), 'both workers connected again');

    ok(claims_work($edge, '/reject', 10), 'BUSY: reject: claims work again');
    ok(claims_work($edge, '/pass', 10), 'BUSY: pass: claims work again');
    protected($dir, $edge, '/reject', 'busy', 4);
    protected($dir, $edge, '/pass', 'busy', 4);

    $log = substr(errlog($dir), $mark);
    unlike($log, qr/\[error\].*refused the handshake: BUSY/,
           'BUSY is no refused handshake');
    # the first command to meet it says it: the handshake's (Redis), or
    # SCRIPT LOAD where the server answers INFO while busy (Valkey 9)
    like($log, qr/\[warn\].*(?:is not ready|cannot load the scripts yet): BUSY/,
         'BUSY is said at warn');
    unlike($log, qr/forbids scripting/, 'the ACL is not blamed for BUSY');
    is(scalar log_problems("$dir/logs/error.log"), 0, 'no crash or alert');
    nginx_stop($dir);
}

# 3. NOPERM: scripting and INFO forbidden, then allowed again, without a
#    reload: INFO is asked again (the version known, a server with SET IFEQ
#    claims natively), then SCRIPT LOAD
{
    like(ask('ACL', 'SETUSER', 'idemrestart', 'reset', 'on', '>s3cret', '~*',
             '+@all', '-@scripting', '-info'), qr/^\+OK/,
         'a user without scripting nor INFO');
    my $dir = instance('acl', $acl_edge,
                       "127.0.0.1:$rport user=idemrestart password=s3cret");
    my $name = qr/redis="[^"]*"/;
    my $server = "$caps->{kind} $caps->{version}";

    # what every worker says (a scrape goes to any of them)
    my $info = sub {
        my @seen = map {
            metric($acl_edge, qr/^(nginx_idempotency_redis_info\{.*)$/m) // ''
        } 1 .. 12;
        return (grep { $_ eq $seen[0] } @seen) == @seen ? $seen[0] : '';
    };

    ok(poll(10, sub { errlog($dir) =~ /refused SCRIPT LOAD: NOPERM/ }),
       'SCRIPT LOAD refused');
    my $r = http_post($acl_edge, "acl-$$", 'x', '/reject');
    is(idem_status($r), '503 error', 'no key is claimed');
    like(errlog($dir),
         qr/\[error\].*\(server not known\) forbids scripting and has no SET IFEQ/,
         'the ACL is named, at error');
    like(errlog($dir), qr/\[warn\].*refused SCRIPT LOAD: NOPERM/,
         'the refused SCRIPT LOAD, at warn');
    cmp_ok(metric($acl_edge,
                  qr/^nginx_idempotency_redis_claims_refused_total\{$name\} (\d+)/m)
           // 0, '>=', 1, 'the refused claim is counted');
    like($info->(), qr/server="unknown",cas="none"/,
         'redis_info: server unknown, cas="none"');

    like(ask('ACL', 'SETUSER', 'idemrestart', '+info'), qr/^\+OK/,
         'INFO allowed');
    ok(poll(30, sub { $info->() =~ /server="\Q$server\E"/ }),
       'INFO asked again: every worker knows the server, without a reload');
    if ($caps->{ifeq}) {
        ok(claims_work($acl_edge, '/reject', 10),
           'SET IFEQ: claims need no scripting');
    } else {
        is(idem_status(http_post($acl_edge, "acl2-$$", 'x', '/reject')),
           '503 error', 'no SET IFEQ: still no key claimed');
    }

    like(ask('ACL', 'SETUSER', 'idemrestart', '+@scripting'), qr/^\+OK/,
         'scripting allowed');
    my $t0 = time;
    # each worker asks again on its own backoff (1 s doubling to 10 s)
    ok(poll(30, sub {
        my @l = errlog($dir) =~ /\[notice\].*allows scripting again/g;
        return @l == 2;
    }), 'each worker sees scripting allowed again, said at notice');
    diag sprintf 'after %.1f s', time - $t0;
    ok(claims_work($acl_edge, '/reject', 10),
       'claims work again, without a reload');
    protected($dir, $acl_edge, '/reject', 'acl', 3);
    is(scalar log_problems("$dir/logs/error.log"), 0, 'no crash or alert');
    nginx_stop($dir);
}

done_testing();
