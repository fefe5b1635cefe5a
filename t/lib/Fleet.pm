package Fleet;

# Helpers for the plain Test::More suites that run their own nginx
# instances (master process, several workers) against the test Redis:
# config, start/stop/reload, raw HTTP clients (blocking and concurrent),
# and log scanning.
#
# What a test starts dies with it, however it ends: its END stops every
# nginx it started (gracefully, then fast, then a kill of the master's
# process group); SIGINT, SIGTERM, SIGHUP, SIGALRM and SIGPIPE end it
# through END unless the test handles them itself; and a watchdog process
# (guard()) stops them, and runs the cleanups registered with it (a
# topology's "down"), if the test went without its END: killed with
# SIGKILL, or its harness gone (then the test gets SIGTERM first).

use strict;
use warnings;
use IO::Socket::INET;
use IO::Select;
use File::Path qw(make_path remove_tree);
use Cwd qw(abs_path);
use Time::HiRes qw(sleep time);
use POSIX ();
use Exporter 'import';

our @EXPORT = qw(fleet_root nginx_conf nginx_start nginx_stop nginx_signal
                 http_post http_burst lines_of log_problems redis_cli
                 redis_cli_at redis_pid have_module settled pay_server
                 upstream_runs npm_library);
our @EXPORT_OK = qw(guard guard_topology);

my $root;

# the server and client util/test.sh names (valkey-server for Valkey)
$ENV{REDIS_SERVER} ||= 'redis-server';
$ENV{REDIS_CLI} ||= 'redis-cli';

sub have_module {
    return grep { /idempotency/ }
           split /\s+/, ($ENV{TEST_NGINX_LOAD_MODULES} || '');
}

# npm_library(driver): the npm library a node driver in t/lib drives
# (stripe_client.js, webhooks.js), installed by "node DRIVER install"
# into the cache t/lib/npm_cache.js names; the test bails out if it cannot
sub npm_library {
    my $driver = shift;
    my $out = `node $driver install 2>&1`;
    require Test::More;
    Test::More::BAIL_OUT("node $driver install: $out") if $?;
    chomp $out;
    return $out;
}

sub fleet_root {
    my $name = shift;
    $root = abs_path('t') . "/servroot-$name";
    remove_tree($root);
    make_path($root);
    return $root;
}

sub nginx_bin { $ENV{TEST_NGINX_BINARY} || 'nginx' }

# nginx_conf(name, http_body, workers, main_directives) -> dir
sub nginx_conf {
    my ($name, $body, $workers, $main) = @_;
    my $dir = "$root/$name";
    make_path("$dir/logs", "$dir/conf");
    my $load = join '', map { "load_module $_;\n" }
               grep { $_ } split /\s+/, ($ENV{TEST_NGINX_LOAD_MODULES} || '');
    $workers //= 2;
    # as root, workers would run as nobody, which cannot reach a checkout
    # under a 0700 directory (a clone in /root): Test::Nginx does the same
    my $user = $> == 0 ? "user root;" : "";
    open my $fh, '>', "$dir/conf/nginx.conf" or die $!;
    print $fh <<"EOC";
$load
$user
worker_processes $workers;
@{[ $main // '' ]}
error_log logs/error.log @{[ $ENV{FLEET_LOG_LEVEL} || "info" ]};
pid logs/nginx.pid;
worker_rlimit_nofile 8192;
events { worker_connections 4096; }
http {
    access_log off;
    client_body_temp_path $dir/body;
    proxy_temp_path $dir/proxy;
    $body
}
EOC
    close $fh;
    return $dir;
}

# instances this test started, stopped at its end even when it dies, so
# that a failed run leaves no nginx behind on the fixed ports
my (@started, $owner, $signalled);

# the watchdog's pipe and pid, and what it was told (guard() below)
my ($guard_w, $guard_pid, @guarded);

sub nginx_start {
    my $dir = shift;
    system(nginx_bin(), '-p', "$dir/", '-c', 'conf/nginx.conf') == 0
        or die "cannot start nginx in $dir";
    $owner //= $$;
    push @started, $dir;
    guard("nginx $dir");
}

# a signal ends the test through its END blocks (Perl's default would skip
# them and leave every nginx and Redis running), unless the test has a
# handler of its own; the nginx are then stopped fast.  A fork of the test
# (a proxy, a backend) dies as it did: its END blocks are the test's.
my $loader = $$;
for my $sig (qw(INT TERM HUP ALRM PIPE)) {
    next if defined $SIG{$sig} && $SIG{$sig} ne 'DEFAULT';
    $SIG{$sig} = sub {
        if ($$ != $loader) {
            $SIG{$sig} = 'DEFAULT';
            kill $sig, $$;
            return;
        }
        $SIG{PIPE} = 'IGNORE';
        $signalled = $sig;
        print STDERR "# SIG$sig: stopping what the test started\n"
            unless $sig eq 'PIPE';
        exit 1;
    };
}

END {
    if (defined $owner && $$ == $owner) {
        my $rc = $?;
        for my $dir (@started) {
            nginx_stop($dir, $signalled) if -e "$dir/logs/nginx.pid";
        }
        # what the test's own END blocks (run before this one: Fleet is
        # loaded first) may not have cleaned up: a topology's "down" is
        # harmless twice
        for (reverse @guarded) {
            system('sh', '-c', "$1 >/dev/null 2>&1") if /^run (.*)/;
        }
        _guard_say('done');
        $? = $rc;
    }
}

sub nginx_signal {
    my ($dir, $sig) = @_;
    system(nginx_bin(), '-p', "$dir/", '-c', 'conf/nginx.conf', '-s', $sig);
}

# nginx_stop(dir[, fast]): a graceful stop (fast: at once), then a fast
# one if requests still hold it, then SIGKILL of its process group
sub nginx_stop {
    my ($dir, $fast) = @_;
    nginx_signal($dir, $fast ? 'stop' : 'quit');
    return if _stopped($dir, 20);
    nginx_signal($dir, 'stop');
    return if _stopped($dir, 10);
    _kill_group($dir);
}

sub _master {
    my $dir = shift;
    my ($pid) = lines_of("$dir/logs/nginx.pid");
    return $pid && $pid =~ /^(\d+)$/ ? $1 : undef;
}

# the pid file gone (nginx removes it as it exits), within secs
sub _stopped {
    my ($dir, $secs) = @_;
    my $deadline = time + $secs;
    while (time < $deadline) {
        return 1 unless -e "$dir/logs/nginx.pid";
        sleep 0.1;
    }
    return 0;
}

# a daemon master leads its own process group (setsid): the group is the
# master and its workers
sub _kill_group {
    my $dir = shift;
    my $pid = _master($dir) or return;
    kill 'KILL', -$pid;
    kill 'KILL', $pid;
    unlink "$dir/logs/nginx.pid";
}

# guard(line): something to clean up at the test's end, by its END or, if
# it goes without, by the watchdog: "nginx DIR" (stopped as
# nginx_stop(DIR, fast) does) or "run COMMAND" (run by sh, from the
# test's directory)
sub guard {
    my $line = shift;
    $owner //= $$;
    return unless $$ == $owner;
    _guard_start() unless $guard_w;
    push @guarded, $line;
    _guard_say($line);
}

# guard_topology(name[, dir]): util/topology.sh down, if the test goes
# without its END (the topology's ports are on TOPO_BASE)
sub guard_topology {
    my ($name, $dir) = @_;
    $dir //= $ENV{TOPO_DIR} // "/tmp/ngx-idempotency-topo-$name";
    guard('run TOPO_BASE=' . ($ENV{TOPO_BASE} // 23000)
          . " util/topology.sh down $name $dir");
}

sub _guard_say {
    syswrite($guard_w, "$_[0]\n") if $guard_w;
}

sub _guard_start {
    # Perl opens both ends close-on-exec: nginx and the commands the test
    # runs do not hold the pipe
    pipe(my $r, my $w) or die "pipe: $!";
    my ($test, $harness) = ($$, getppid());
    my $pid = fork // die "fork: $!";
    if ($pid) {
        close $r;
        ($guard_w, $guard_pid) = ($w, $pid);
        return;
    }
    close $w;
    # its own session: a Ctrl-C or a kill of the test's process group does
    # not reach it; and nothing of the test's held open by it (the TAP
    # pipe to prove, listening sockets)
    POSIX::setsid();
    $SIG{$_} = 'IGNORE' for qw(INT HUP ALRM PIPE);
    $SIG{TERM} = 'DEFAULT';
    open STDIN, '<', '/dev/null';
    open STDOUT, '>', '/dev/null';
    open STDERR, '>', '/dev/null';
    my $keep = fileno $r;
    $_ == $keep or POSIX::close($_) for 3 .. 1023;
    _guard_watch($r, $test, $harness);
    POSIX::_exit(0);
}

sub _guard_watch {
    my ($r, $test, $harness) = @_;
    my (@todo, $buf, $told);
    my $sel = IO::Select->new($r);
    $buf = '';
    while (1) {
        if ($sel->can_read(0.2)) {
            # EOF: the test and every fork of it closed the pipe
            sysread($r, my $b, 4096) or last;
            $buf .= $b;
            while ($buf =~ s/^(.*)\n//) {
                return if $1 eq 'done';
                push @todo, $1;
            }
            next;
        }
        # the test is gone, its forks may live on
        last if getppid() != $test;
        # its harness is gone (a prove killed by a timeout): end the test,
        # whose END cleans up
        if (!$told && $harness > 1 && !kill 0, $harness) {
            kill 'TERM', $test;
            $told = 1;
        }
    }
    for (reverse @todo) {
        my ($what, $arg) = split ' ', $_, 2;
        if ($what eq 'nginx') {
            next unless -e "$arg/logs/nginx.pid";
            my $pid = _master($arg) or next;
            kill 'TERM', $pid;
            _kill_group($arg) unless _stopped($arg, 10);
        } elsif ($what eq 'run') {
            system('sh', '-c', $arg);
        }
    }
}

sub _request {
    my ($key, $body, $path, $extra) = @_;
    $path //= '/pay';
    $extra //= '';
    my $k = defined $key ? "Idempotency-Key: $key\r\n" : '';
    return "POST $path HTTP/1.1\r\nHost: x\r\nConnection: close\r\n$k$extra"
        . "Content-Length: " . length($body) . "\r\n\r\n$body";
}

sub _parse {
    my $res = shift;
    my ($status) = $res =~ m{^HTTP/1\.[01] (\d+)};
    my ($h, $b) = split /\r\n\r\n/, $res, 2;
    $b //= '';
    if (($h // '') =~ /^Transfer-Encoding: chunked/mi) {
        my $d = '';
        while ($b =~ s/\A([0-9a-f]+)\r\n//i) {
            my $n = hex $1;
            last if $n == 0;
            $d .= substr($b, 0, $n, '');
            $b =~ s/\A\r\n//;
        }
        $b = $d;
    }
    return { status => $status || 0, body => $b, head => $h // '' };
}

# http_post(port, key, body, path, extra_headers, timeout) -> {status,...}
sub http_post {
    my ($port, $key, $body, $path, $extra, $timeout) = @_;
    my $t0 = time;
    my $s = IO::Socket::INET->new(PeerAddr => "127.0.0.1:$port",
                                  Timeout => $timeout // 10)
        or return { status => 0, body => '', head => '', took => 0 };
    print $s _request($key, $body, $path, $extra);
    my $res = '';
    my $sel = IO::Select->new($s);
    my $deadline = time + ($timeout // 10);
    while (time < $deadline && $sel->can_read($deadline - time)) {
        my $n = sysread($s, my $buf, 65536);
        last unless $n;
        $res .= $buf;
    }
    my $r = _parse($res);
    $r->{took} = time - $t0;
    return $r;
}

# http_burst([[port, key, body], ...], timeout): sends all requests at once
# on separate connections, then collects every answer.
sub http_burst {
    my ($reqs, $timeout) = @_;
    $timeout //= 10;
    my (@socks, %buf, %idx);
    my $sel = IO::Select->new;
    for my $i (0 .. $#$reqs) {
        my ($port, $key, $body, $path) = @{ $reqs->[$i] };
        my $s = IO::Socket::INET->new(PeerAddr => "127.0.0.1:$port",
                                      Timeout => $timeout) or next;
        $socks[$i] = $s;
        $idx{fileno $s} = $i;
        $buf{$i} = '';
    }
    for my $i (0 .. $#$reqs) {
        next unless $socks[$i];
        my ($port, $key, $body, $path) = @{ $reqs->[$i] };
        syswrite($socks[$i], _request($key, $body, $path));
        $sel->add($socks[$i]);
    }
    my $deadline = time + $timeout;
    while ($sel->count && time < $deadline) {
        for my $s ($sel->can_read($deadline - time)) {
            my $i = $idx{fileno $s};
            my $n = sysread($s, my $b, 65536);
            if ($n) { $buf{$i} .= $b; next }
            $sel->remove($s);
            close $s;
        }
    }
    return [ map { defined $buf{$_} ? _parse($buf{$_})
                                    : { status => 0, body => '' } }
             0 .. $#$reqs ];
}

# settled(sub): a count once it stopped moving.  A backend logs an
# execution after it sent the response, so the count can lag the answers.
sub settled {
    my $count = shift;
    my $v = $count->();
    for my $i (1 .. 40) {
        sleep 0.1;
        my $n = $count->();
        return $n if $n == $v && $i >= 3;
        $v = $n;
    }
    return $v;
}

sub lines_of {
    my $f = shift;
    open my $fh, '<', $f or return ();
    return <$fh>;
}

# worker crashes, alerts, sockets left, sanitizer reports
sub log_problems {
    my $f = shift;
    return grep { /\[(alert|crit|emerg)\]|exited on signal|open socket|
                   AddressSanitizer/x } lines_of($f);
}

sub redis_cli {
    return redis_cli_at($ENV{TEST_NGINX_REDIS_PORT} || 6379, @_);
}

# redis_cli_at(port, command, args...): the same against another Redis
sub redis_cli_at {
    my ($port, @args) = @_;
    my $cmd = join ' ', map { "'$_'" } @args;
    my $out = `$ENV{REDIS_CLI} -p $port $cmd 2>/dev/null`;
    chomp $out;
    return $out;
}

# pay_server(name, port, directives): an http body with a server on port
# whose /pay is protected and proxied to its own /backend, which logs each
# request's Idempotency-Key to logs/backend.log (see upstream_runs)
sub pay_server {
    my ($name, $port, $directives) = @_;
    return <<"EOC";
    log_format backend '\$http_idempotency_key';
    server {
        listen 127.0.0.1:$port;
        $directives
        location = /pay {
            idempotency on;
            add_header X-Idem \$idempotency_status always;
            proxy_pass http://127.0.0.1:$port/backend;
        }
        location = /backend {
            access_log $root/$name/logs/backend.log backend;
            return 201 "ok\\n";
        }
    }
EOC
}

# upstream_runs(dir): how many times the backend of pay_server ran, by key;
# it logs once its connection closes, which may be after our answer
sub upstream_runs {
    my $dir = shift;
    sleep 0.2;
    my %n;
    for (lines_of("$dir/logs/backend.log")) {
        chomp;
        $n{$_}++;
    }
    return \%n;
}

sub redis_pid {
    my $port = $ENV{TEST_NGINX_REDIS_PORT} || 6379;
    my $f = "/tmp/ngx-idempotency-redis-$port/redis.pid";
    open my $fh, '<', $f or return;
    my $pid = <$fh>;
    chomp $pid;
    return $pid;
}

# idem_status(response of http_post) -> "201 new": the status code and the
# X-Idem header ($idempotency_status) that pay_server adds
push @EXPORT, 'idem_status';
sub idem_status {
    my $r = shift;
    my ($idem) = $r->{head} =~ /X-Idem: (\w+)/;
    return "$r->{status} " . ($idem // '-');
}

# get_front(backend port): a protected location that sends each POST to
# the backend as a GET of the same path (a file there is the response),
# with $idempotency_status in X-Idem
push @EXPORT, 'get_front';
sub get_front {
    my $be = shift;
    return <<"EOC";
        location / {
            idempotency on;
            add_header X-Idem \$idempotency_status always;
            proxy_method GET;
            proxy_pass_request_body off;
            proxy_set_header Content-Length "";
            proxy_pass http://127.0.0.1:$be;
        }
EOC
}

# own_warnings(output of nginx -t) -> the output less the warning that
# Tengine built with its vendor's modules prints for every configuration
# without "variables_hash_max_size 2048" (its own tengine.conf sets it):
# it is about the server's variables, not about the configuration tested
push @EXPORT, 'own_warnings';
sub own_warnings {
    return $_[0] =~ s/^.*\[warn\] .*could not build optimal variables_hash.*\n//mgr;
}

# nginx_test(dir, inside of http{}) -> (ok, output): nginx -t of a
# configuration that loads the modules; judged by what nginx says, not
# its exit code, which LeakSanitizer changes
push @EXPORT, 'nginx_test';
sub nginx_test {
    my ($dir, $http) = @_;
    my $load = join '', map { "load_module $_;\n" }
               grep { $_ } split /\s+/, ($ENV{TEST_NGINX_LOAD_MODULES} || '');
    open my $fh, '>', "$dir/nginx-t.conf" or die $!;
    print $fh "${load}error_log $dir/nginx-t.log;\npid $dir/nginx-t.pid;\n"
              . "events {}\nhttp {\n$http\n}\n";
    close $fh;
    my $out = `@{[ nginx_bin() ]} -t -p $dir/ -c $dir/nginx-t.conf 2>&1`;
    return ($out =~ /test is successful/ ? 1 : 0, $out);
}

# server_caps([port]) -> {kind, version ("8.1.1"), ifeq, delifeq, native}:
# what the server at port (the suite's by default) has of the commands the
# store picks at its handshake: SET IFEQ (Valkey 8.1, Redis 8.4), a
# compare-and-delete (DELIFEQ on Valkey 9.0, DELEX on Redis 8.4) and so
# the native path even where scripts may run
push @EXPORT, 'server_caps';
sub server_caps {
    my $port = shift // ($ENV{TEST_NGINX_REDIS_PORT} || 6379);
    my $info = redis_cli_at($port, 'INFO', 'server');
    my ($kind, $v) = ('valkey', $info =~ /^valkey_version:([\d.]+)/m);
    ($kind, $v) = ('redis', $info =~ /^redis_version:([\d.]+)/m)
        unless defined $v;
    my ($maj, $min) = split /\./, $v // '0.0';
    my $n = $maj * 100 + $min;
    my %c = (kind => $kind, version => $v // 'unknown',
             ifeq => $n >= ($kind eq 'valkey' ? 801 : 804),
             delifeq => $n >= ($kind eq 'valkey' ? 900 : 804));
    $c{native} = $c{ifeq} && $c{delifeq};
    $c{del} = $kind eq 'valkey' ? 'delifeq' : 'delex';
    return \%c;
}

1;
