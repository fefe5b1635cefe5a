# A test that is killed mid-run leaves nothing behind: no nginx it started
# (master or worker), no Redis topology, no port held.  A victim test
# (written here, run as its own perl) starts an nginx through t/lib/Fleet.pm
# with a request in flight (held at its upstream, so a graceful stop alone
# would wait for it) and, in some cases, a util/topology.sh replica
# topology through t/lib/TopoTest.pm; it is then ended as a run can be:
# - SIGTERM (a timeout), SIGALRM (an alarm), SIGHUP: its END blocks stop
#   what it started
# - SIGINT to its process group (Ctrl-C): the same; nginx, a daemon in its
#   own session, gets nothing from the terminal
# - SIGKILL: no END runs; Fleet's watchdog stops nginx and takes the
#   topology down
# - its harness (prove) killed: the watchdog sends the test SIGTERM
# Plain Test::More: nginx on 20590..20595, held upstreams on 20570..20575,
# the replica topology on TOPO_BASE 27000 (+51, +52).
use strict;
use warnings;
use lib 't/lib';
use Test::More;
use Fleet;
use IO::Socket::INET;
use IO::Select;
use POSIX ();
use Time::HiRes qw(sleep time);

plan skip_all => 'TEST_NGINX_LOAD_MODULES must name the module'
    unless have_module();

my $slow = $ENV{TEST_ASAN} ? 4 : 1;
my $redis = `sh -c 'command -v $ENV{REDIS_SERVER}'` ne '';
my $topo_base = 27000;
my @redis_ports = ($topo_base + 51, $topo_base + 52);
my $root = fleet_root('cleanup');

# the victim: started with its ports and whether to bring a topology up;
# it prints "ready" and the pids of its nginx, then waits to be killed
my $victim = "$root/victim.pl";
open my $fh, '>', $victim or die $!;
print $fh <<'EOV';
use strict;
use warnings;
use lib 't/lib';
use Test::More;
use Fleet;
use TopoTest;
use Held;
use IO::Socket::INET;

my ($tag, $port, $held_port, $topo) = @ARGV;
$| = 1;
Test::More->builder->no_ending(1);
fleet_root("cleanup-$tag");
my $dir = nginx_conf('v', <<"EOC", 1);
    server {
        listen 127.0.0.1:$port;
        location = /pid { return 200 "\$pid"; }
        location = /held { proxy_pass http://127.0.0.1:$held_port; }
    }
EOC
nginx_start($dir);
my $held = Held->new($held_port);
my $s = IO::Socket::INET->new(PeerAddr => "127.0.0.1:$port") or die $!;
print $s "GET /held HTTP/1.1\r\nHost: x\r\n\r\n";
$held->take or die "nothing held";
if ($topo) {
    $ENV{TOPO_BASE} = $topo;
    $ENV{TOPO_DIR} = "/tmp/ngx-idempotency-topo-cleanup-$topo";
    topo('up', 'replica', $ENV{TOPO_DIR});
}
my $worker = http_post($port, undef, '', '/pid')->{body};
open my $p, '<', "$dir/logs/nginx.pid" or die $!;
my $master = <$p>;
chomp $master;
print "ready $master $worker\n";
sleep 1 while 1;
EOV
close $fh;

# alive(pid): a process that runs (a zombie does not); where /proc is not
# this PID namespace's, kill 0 alone
sub alive {
    my $pid = shift;
    return 0 unless kill 0, $pid;
    my ($self) = split ' ', (lines_of('/proc/self/stat'))[0] // '';
    return 1 unless ($self // '') eq $$;
    my $stat = (lines_of("/proc/$pid/stat"))[0] // return 0;
    return (split ' ', $stat =~ s/.*\)//sr)[0] ne 'Z';
}

sub port_free {
    my $port = shift;
    return 0 if IO::Socket::INET->new(PeerAddr => "127.0.0.1:$port",
                                      Timeout => 2);
    my $l = IO::Socket::INET->new(LocalAddr => "127.0.0.1:$port",
                                  Listen => 1, ReuseAddr => 1);
    return $l ? 1 : 0;
}

sub within {
    my ($secs, $cond) = @_;
    my $deadline = time + $secs * $slow;
    while (time < $deadline) {
        return 1 if $cond->();
        sleep 0.1;
    }
    return $cond->();
}

# run(tag, n, topology?, how): the victim started (through a harness of
# its own for "harness"), ended, and what it started checked
sub run {
    my ($tag, $n, $topo, $how) = @_;
    my ($port, $held_port) = (20590 + $n, 20570 + $n);
    pipe(my $r, my $w) or die $!;
    my $harness = fork // die $!;
    if (!$harness) {
        # a harness of its own: a process group for Ctrl-C, a parent for
        # "harness"; the victim's stdout (TAP) comes to us
        setpgrp(0, 0);
        close $r;
        # as a terminal's job would: a run started in the background has
        # SIGINT ignored, and an ignored signal stays so across exec
        $SIG{$_} = 'DEFAULT' for qw(INT TERM HUP ALRM);
        open STDOUT, '>&', $w or die $!;
        my $pid = fork // POSIX::_exit(1);
        if ($pid) {
            syswrite STDOUT, "victim $pid\n";
        } else {
            exec($^X, $victim, $tag, $port, $held_port,
                 $topo ? $topo_base : 0) or POSIX::_exit(1);
        }
        waitpid $pid, 0;
        POSIX::_exit($? >> 8);
    }
    close $w;
    my ($master, $worker, $out, $victim_pid) = (0, 0, '');
    my $deadline = time + 120 * $slow;
    my $sel = IO::Select->new($r);
    while (time < $deadline) {
        $sel->can_read($deadline - time) or last;
        my $line = <$r>;
        last unless defined $line;
        $out .= $line;
        $victim_pid = $1 if $line =~ /^victim (\d+)$/;
        if ($line =~ /^ready (\d+) (\d+)$/) {
            ($master, $worker) = ($1, $2);
            last;
        }
    }
    ok($master && $worker, "$tag: the victim runs nginx (master $master, "
       . "worker $worker)") or diag $out;
    ok(!port_free($port), "$tag: its port is taken");
    ok(!port_free($redis_ports[0]), "$tag: its topology runs") if $topo;

    if ($how eq 'INT') {
        kill 'INT', -$harness;              # Ctrl-C: the whole group
    } elsif ($how eq 'harness') {
        kill 'KILL', $harness;              # prove killed
    } else {
        kill $how, $victim_pid // -$harness;
    }
    # the harness ends when the victim does (or at once when killed)
    my $reaped = 0;
    ok(within(60, sub {
        $reaped ||= waitpid($harness, POSIX::WNOHANG()) != 0;
        $reaped && (!$victim_pid || !alive($victim_pid));
    }), "$tag: the victim has ended");
    # whatever failed, nothing of it is left for the next case
    if (!$reaped) {
        kill 'KILL', -$harness;
        waitpid $harness, 0;
    }
    ok(within(60, sub { !alive($master) && !alive($worker) }),
       "$tag: its nginx master and worker are gone");
    ok(within(60, sub { port_free($port) }), "$tag: its port is free");
    ok(within(60, sub { port_free($held_port) }),
       "$tag: its upstream's port is free");
    if ($topo) {
        ok(within(60, sub { !grep { !port_free($_) } @redis_ports }),
           "$tag: its topology is down, ports @redis_ports free");
    }
    kill 'KILL', $victim_pid if $victim_pid && alive($victim_pid);
    kill 'KILL', -$master if $master && alive($master);
    close $r;
}

run('term', 0, 0, 'TERM');
run('alrm', 1, 0, 'ALRM');
run('hup', 2, 0, 'HUP');
run('ctrl-c', 3, $redis, 'INT');
run('kill', 4, $redis, 'KILL');
run('harness', 5, 0, 'harness');

done_testing();
