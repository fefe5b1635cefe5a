package WaitTest;

# Helpers shared by t/033 (WAIT) and t/043 (WAITAOF), which run on
# util/topology.sh's replica topology (TOPO_BASE and TOPO_DIR as the test
# sets them): topology actions as tests, the topology down whatever
# happens, nginx -t of a protected location, a backend slow enough to
# pause the replica while it works, and a response read to its end.

use strict;
use warnings;
use Test::More;
use IO::Socket::INET;
use IO::Select;
use Time::HiRes qw(sleep time);
use Fleet ();
use Exporter 'import';

our @EXPORT = qw(topo slow_backend slow_server post_async read_response
                 nginx_t nginx_t_cases);

my $script = 'util/topology.sh';
my ($up, @pids);

# after the test's own END (nginx): down continues a paused replica
END {
    local $?;
    kill 'KILL', @pids if @pids;
    system("$script down replica >/dev/null 2>&1") if $up;
}

# topo(ARGS...): util/topology.sh ARGS as a test; true if it succeeded
sub topo {
    if ($_[0] eq 'up') {
        $up = 1;
        Fleet::guard_topology('replica');
    }
    my $out = `$script @_ 2>&1`;
    my $ok = $? == 0;
    chomp $out;
    ok($ok, "topology.sh @_") or diag $out;
    return $ok;
}

# slow_backend(port, seconds): answers every request 201 after seconds
sub slow_backend {
    my ($port, $secs) = @_;
    my $pid = fork // die "fork: $!";
    if ($pid) {
        push @pids, $pid;
        return $pid;
    }
    my $l = IO::Socket::INET->new(LocalAddr => "127.0.0.1:$port",
                                  Listen => 16, ReuseAddr => 1)
        or die "backend: $!";
    while (my $c = $l->accept) {
        my $req = '';
        while ($req !~ /\r\n\r\n/) {
            sysread($c, my $b, 4096) or last;
            $req .= $b;
        }
        sleep $secs;
        print $c "HTTP/1.1 201 Created\r\nContent-Length: 5\r\n"
            . "Connection: close\r\n\r\nslow\n";
        close $c;
    }
    exit 0;
}

# slow_server(port, directives, backend port): a server whose /slow is
# protected and proxied to slow_backend, with $idempotency_status in X-Idem
sub slow_server {
    my ($port, $directives, $backend) = @_;
    return <<"EOC";
    server {
        listen 127.0.0.1:$port;
        $directives
        location = /slow {
            idempotency on;
            add_header X-Idem \$idempotency_status always;
            proxy_pass http://127.0.0.1:$backend;
        }
    }
EOC
}

# post_async(port, key, path): a POST sent, its socket to read later
sub post_async {
    my ($port, $key, $path) = @_;
    my $s = IO::Socket::INET->new(PeerAddr => "127.0.0.1:$port",
                                  Timeout => 5) or die "connect: $!";
    print $s "POST $path HTTP/1.1\r\nHost: x\r\nConnection: close\r\n"
        . "Idempotency-Key: $key\r\nContent-Length: 1\r\n\r\nx";
    return $s;
}

# read_response(socket, seconds): what it sends until it closes
sub read_response {
    my ($s, $secs) = @_;
    my $res = '';
    my $sel = IO::Select->new($s);
    my $deadline = time + $secs;
    while (time < $deadline && $sel->can_read($deadline - time)) {
        sysread($s, my $b, 65536) or last;
        $res .= $b;
    }
    return $res;
}

# nginx_t(root, redis port, listen port, inside of http{}, inside of
# location{}) -> (ok, output)
sub nginx_t {
    my ($root, $redis, $port, $http, $loc) = @_;
    my $nginx = $ENV{TEST_NGINX_BINARY} || 'nginx';
    my ($module) = grep { /idempotency/ }
                   split /\s+/, ($ENV{TEST_NGINX_LOAD_MODULES} || '');
    open my $fh, '>', "$root/t.conf" or die $!;
    print $fh <<"EOC";
load_module $module;
error_log $root/t.log;
pid $root/t.pid;
events {}
http {
    idempotency_redis 127.0.0.1:$redis;
    $http
    server {
        listen 127.0.0.1:$port;
        location / {
            idempotency on;
            $loc
        }
    }
}
EOC
    close $fh;
    my $out = `$nginx -t -p $root/ -c $root/t.conf 2>&1`;
    return ($out =~ /test is successful/ ? 1 : 0, $out);
}

# nginx_t_cases(root, redis port, listen port, [[http, loc, refusal]...],
# [[http, loc]...]): nginx -t refuses each of the first with a message
# like its refusal, and accepts each of the second
sub nginx_t_cases {
    my ($root, $redis, $port, $bad, $good) = @_;
    for my $c (@$bad) {
        my ($ok, $out) = nginx_t($root, $redis, $port, $c->[0], $c->[1]);
        ok(!$ok, "nginx -t refuses: $c->[0] $c->[1]");
        like($out, $c->[2], "...and says why") or diag $out;
    }
    for my $c (@$good) {
        my ($ok, $out) = nginx_t($root, $redis, $port, @$c);
        ok($ok, "nginx -t accepts: $c->[0] $c->[1]") or diag $out;
    }
}

1;
