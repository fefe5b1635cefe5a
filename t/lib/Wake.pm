package Wake;

# Helpers of the wake-up tests (t/035, t/036): an original and its waiting
# duplicates sent to one nginx, with the time each response completed.

use strict;
use warnings;
use IO::Socket::INET;
use IO::Select;
use Time::HiRes qw(sleep time);
use Exporter 'import';
use Test::More;
use Fleet qw(redis_cli_at);

our @EXPORT = qw(commandstats round pct wake_server topo topo_up);

our $port;              # the nginx to send to
our $path = '/pay';

# wake_server(port, dir, redis, more locations[, wait]): an http body
# whose /pay waits (idempotency_wait 5s, or wait) and is proxied to
# /backend plus the X-Mode header's value (headers are not in the
# fingerprint); /backend answers after 0.3 s; each backend location logs
# "key uri" to dir/logs/backend.log
sub wake_server {
    my ($port, $dir, $redis, $more, $wait) = @_;
    $wait //= '5s';
    return <<"EOC";
    log_format backend '\$http_idempotency_key \$uri';
    server {
        listen 127.0.0.1:$port reuseport;
        idempotency_redis $redis;
        location = /pay {
            idempotency on;
            idempotency_wait $wait;
            add_header X-Idem \$idempotency_status always;
            proxy_pass http://127.0.0.1:$port/backend\$http_x_mode;
        }
        location = /backend {
            access_log $dir/logs/backend.log backend;
            echo_sleep 0.3;
            echo "ok \$request_id";
        }
        @{[ $more // '' ]}
    }
EOC
}

# commandstats(redis port) -> {command => calls}
sub commandstats {
    my %s;
    for (split /\r?\n/, redis_cli_at(shift, 'INFO', 'commandstats')) {
        $s{$1} = $2 if /^cmdstat_(\w+):calls=(\d+)/;
    }
    return \%s;
}

sub connect_send {
    my ($key, $mode) = @_;
    my $s = IO::Socket::INET->new(PeerAddr => "127.0.0.1:$port")
        or die "connect: $!";
    my $extra = $mode ? "X-Mode: $mode\r\n" : '';
    syswrite($s, "POST $path HTTP/1.1\r\nHost: x\r\nConnection: close\r\n"
                 . "Idempotency-Key: $key\r\n${extra}Content-Length: 1"
                 . "\r\n\r\nx");
    return $s;
}

# one original, then duplicates at $at seconds after it (a list); during
# the wait $during->() runs.  Returns the original and the duplicates,
# each {status, idem, body, done: when its response was complete}
sub round {
    my ($key, $mode, $at, $during) = @_;
    my $t0 = time;
    my @conns = ({ s => connect_send($key, $mode), t => $t0 });
    for my $off (@$at) {
        my $left = $t0 + $off - time;
        sleep $left if $left > 0;
        push @conns, { s => connect_send($key) };
    }
    $during->() if $during;
    my $sel = IO::Select->new(map { $_->{s} } @conns);
    my %by = map { fileno($_->{s}) => $_ } @conns;
    my $deadline = time + 10 * ($ENV{TEST_ASAN} ? 4 : 1);
    while ($sel->count && time < $deadline) {
        for my $s ($sel->can_read($deadline - time)) {
            my $c = $by{fileno $s};
            my $n = sysread($s, my $b, 65536);
            if ($n) { $c->{buf} .= $b; next }
            $c->{done} = time;
            $sel->remove($s);
            close $s;
        }
    }
    for my $c (@conns) {
        my $res = $c->{buf} // '';
        ($c->{status}) = $res =~ m{^HTTP/1\.[01] (\d+)};
        ($c->{idem}) = $res =~ /^X-Idem: (\w+)/mi;
        # chunked or not: the backend's answer names its request
        ($c->{body}) = $res =~ /^(ok \w+|failed)$/m;
        $c->{body} //= '';
        $c->{status} //= 0;
        $c->{idem} //= '-';
        $c->{done} //= time;
    }
    return @conns;
}

sub pct {
    my ($p, @v) = @_;
    @v = sort { $a <=> $b } @v;
    return $v[int($p * $#v + 0.5)] * 1000;
}


# topo(args): util/topology.sh ARGS, a test of its exit status; its
# output ('' on failure)
sub topo {
    Fleet::guard_topology(@_[1, 2]) if $_[0] eq 'up';
    my $out = `util/topology.sh @_ 2>&1`;
    my $ok = $? == 0;
    chomp $out;
    ok($ok, "topology.sh @_") or diag $out;
    note $out;
    return $ok ? $out : '';
}

# topo_up(name, dir): topo('up', ...), taken down when the test exits,
# also on a signal
my @up;
END {
    local $?;
    system("util/topology.sh down $_ >/dev/null 2>&1") for @up;
}
sub topo_up {
    my ($name, $dir) = @_;
    push @up, "$name $dir";
    $SIG{$_} = sub { $SIG{PIPE} = 'IGNORE'; exit 1 } for qw(INT TERM HUP PIPE);
    return topo('up', $name, $dir);
}


1;
