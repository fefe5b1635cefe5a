# Redis Sentinel: "idempotency_redis S1 S2 ... sentinel=NAME" on a real
# master, 2 replicas and 3 Sentinels (util/topology.sh sentinel).
# - discovery: the first Sentinel is down, the next names the master; new
#   then replay, the record on the master
# - ROLE: a Sentinel naming a replica as master: 503, nothing written, and
#   the refusal is logged
# - sentinel_user=/sentinel_password=: an ACL user on the Sentinels works,
#   a wrong password is a refused handshake (503)
# - a graceful failover under light traffic: the workers follow the
#   +switch-master message without a reload, every request is served,
#   nothing more is written to the old master (INFO commandstats) and new
#   keys land on the new one
# - kill -9 of the master: 503s only until the switch, then 201s
# - the Sentinels all killed: the master keeps serving, past the 10 s
#   refresh; made a replica by hand then, it answers READONLY: 503, the
#   request not run
# - no key ever ran twice upstream, and no worker crashed
# - configuration errors: several addresses without sentinel=, a
#   sentinel_user= alone, an empty name, a bad address; tls without a
#   name to verify is valid (t/039 tests Sentinel over TLS)
# Plain Test::More; ports TOPO_BASE+31..+43 (Redis) and TOPO_BASE+300..
# +303 (nginx), TOPO_BASE defaulting to 25000.
# topology: yes (make test-topologies runs this file)
use strict;
use warnings;
use Test::More;
use FindBin;
use lib "$FindBin::Bin/lib";
use Fleet;
use TopoTest;
use Time::HiRes qw(time sleep);
use POSIX ();

plan skip_all => 'the module is not loaded' unless have_module();
plan skip_all => "$ENV{REDIS_SERVER} is needed" unless `which $ENV{REDIS_SERVER}`;

my $base = $ENV{TOPO_BASE} || 25000;
$ENV{TOPO_BASE} = $base;
$ENV{TOPO_DIR} ||= "/tmp/ngx-idempotency-topo-sentinel-$base";
my $topo = 'util/topology.sh';
my @data = map { $base + $_ } 31 .. 33;
my @sentinels = map { $base + $_ } 41 .. 43;
my $dead = $base + 49;               # no Sentinel there
my $port = $base + 300;
my $t0 = time;

my $up;
END {
    local $?;
    system("$topo down sentinel >/dev/null 2>&1") if $up;
}
$SIG{$_} = sub { $SIG{PIPE} = 'IGNORE'; exit 1 } for qw(INT TERM HUP PIPE);

sub cli { my $p = shift; return redis_cli_at($p, @_) }

sub master_port {
    my $out = cli($sentinels[1], qw(SENTINEL get-master-addr-by-name idem));
    my @l = split /\n/, $out;
    return $l[1];
}

sub writes {
    my $stats = cli(shift, qw(INFO commandstats));
    my $n = 0;
    $n += $1 while $stats =~ /^cmdstat_(?:set|eval|evalsha|del):calls=(\d+)/mg;
    return $n;
}

# traffic(port, tag, pause) -> stop(): a request every pause seconds
# (50 ms by default) with a new key each, "key status" lines in a file
# until stop() returns them
sub traffic {
    my ($p, $tag, $pause) = @_;
    my $file = fleet_root_file("traffic-$tag");
    my $pid = fork // die;
    if ($pid == 0) {
        # not exit: END would take the topology down
        $SIG{TERM} = sub { POSIX::_exit(0) };
        open my $fh, '>', $file or POSIX::_exit(1);
        $fh->autoflush(1);
        for (my $i = 0; ; $i++) {
            my $r = http_post($p, "$tag-$i", "amount=$i", undef, undef, 5);
            print $fh "$tag-$i $r->{status}\n";
            sleep($pause // 0.05);
        }
    }
    return sub {
        kill 'TERM', $pid;
        waitpid $pid, 0;
        return map { chomp; [split / /] } lines_of($file);
    };
}

my $root = fleet_root('sentinel');
sub fleet_root_file { "$root/$_[0]" }

# configuration errors, before any Redis runs

sub conf_error {
    my ($args) = @_;
    my $d = nginx_conf('conf', pay_server('conf', $port,
                                          "idempotency_redis $args;"), 1);
    my $bin = $ENV{TEST_NGINX_BINARY} || 'nginx';
    # nginx -t exits without freeing its cycle (a TLS context included)
    local $ENV{ASAN_OPTIONS} = ($ENV{ASAN_OPTIONS} // '') . ':detect_leaks=0';
    return scalar `$bin -t -p $d/ -c conf/nginx.conf 2>&1`;
}

like(conf_error('127.0.0.1:1 127.0.0.1:2'),
     qr/several redis addresses require "cluster" \(seeds\) or "sentinel=NAME"/, 'several addresses alone');
like(conf_error('127.0.0.1:1 sentinel=m sentinel_user=u'),
     qr/"sentinel_user=" requires "sentinel_password="/,
     'sentinel_user= alone');
like(conf_error('127.0.0.1:1 sentinel='),
     qr/"sentinel=" needs a master name/, 'sentinel= without a name');
like(conf_error('999.1.1.1:1 sentinel=m'),
     qr/invalid sentinel address "999\.1\.1\.1:1"/, 'a bad Sentinel address');
# each Sentinel verified by its host, the master by the address named
like(conf_error('127.0.0.1:1 127.0.0.1:2 sentinel=m tls'),
     qr/test is successful/,
     'tls with Sentinel needs no idempotency_redis_tls_name');
like(conf_error('127.0.0.1:1 sentinel=m user=u password=p db=3'),
     qr/test is successful/, 'a valid Sentinel configuration');

$up = 1;
topo('up', 'sentinel');

my $master = master_port();
is($master, $data[0], 'the topology starts with its first master');

# a Sentinel that names a replica as a master; an ACL user on all three

cli($sentinels[0], qw(SENTINEL MONITOR idem2 127.0.0.1), $data[1], 1);
for my $s (@sentinels) {
    cli($s, qw(ACL SETUSER watch on >watch-pw -@all),
        '+sentinel|get-master-addr-by-name', '+subscribe',
        '+client|setname', '&*');
}

my $auth = "user=idem password=idem-password";
# one log_format for the three servers
sub more_pay { (my $s = pay_server(@_)) =~ s/^\s*log_format.*\n//m; $s }

my $checks = nginx_conf('checks', join('',
    pay_server('checks', $port + 1,
        "idempotency_redis 127.0.0.1:$sentinels[0] sentinel=idem2 $auth;"),
    more_pay('checks', $port + 2,
        "idempotency_redis 127.0.0.1:$sentinels[2] sentinel=idem"
        . " sentinel_user=watch sentinel_password=watch-pw $auth;"),
    more_pay('checks', $port + 3,
        "idempotency_redis 127.0.0.1:$sentinels[2] sentinel=idem"
        . " sentinel_user=watch sentinel_password=wrong $auth;")), 1);
nginx_start($checks);

my $before = writes($data[1]);
sleep 1.5;
my $r = http_post($port + 1, 'role-1', 'x');
is($r->{status}, 503, 'a replica named as master: 503');
is(writes($data[1]), $before, 'nothing was written to the replica');
ok(scalar(grep { /127\.0\.0\.1:$data[1] is no master \(ROLE: slave\)/ }
          lines_of("$checks/logs/error.log")),
   'the ROLE refusal is logged');

$r = http_post($port + 2, 'auth-1', 'x');
is($r->{status}, 201, 'sentinel_user= and sentinel_password=: 201');
$r = http_post($port + 3, 'auth-2', 'x');
is($r->{status}, 503, 'a wrong sentinel_password=: 503');
ok(scalar(grep { /redis "sentinel idem" refused the handshake/ }
          lines_of("$checks/logs/error.log")),
   'the refused Sentinel AUTH is logged');
nginx_stop($checks);
is(join('', log_problems("$checks/logs/error.log")), '', 'checks: no crash');
cli($sentinels[0], qw(SENTINEL REMOVE idem2));

# discovery, the first Sentinel down

my $dir = nginx_conf('main', pay_server('main', $port,
    "idempotency_redis 127.0.0.1:$dead "
    . join(' ', map { "127.0.0.1:$_" } @sentinels)
    . " sentinel=idem $auth;"), 2);
nginx_start($dir);
my $log = "$dir/logs/error.log";

# followed(port, since): the workers' lines that name port as the master,
# after the first since lines of the log
sub followed {
    my ($to, $since) = @_;
    my @l = lines_of($log);
    return grep { /the master is (?:now )?127\.0\.0\.1:$to\b/ }
           @l[($since // 0) .. $#l];
}

ok(wait_until(5, sub { followed($master) >= 2 }),
   'both workers found the master');

$r = http_post($port, 'disc-1', 'x');
is($r->{status}, 201, 'discovery: 201');
like($r->{head}, qr/X-Idem: new/, 'discovery: new');
$r = http_post($port, 'disc-1', 'x');
like($r->{head}, qr/X-Idem: replay/, 'discovery: replay');
ok(cli($master, 'DBSIZE') > 0, 'the record is on the master');

# a reload: the old workers let go of both connections, the new ones
# find the master again
my $mark = () = lines_of($log);
nginx_signal($dir, 'reload');
ok(wait_until(10, sub { followed($master, $mark) >= 2 }),
   'after a reload, the new workers found the master');
$r = http_post($port, 'disc-1', 'x');
like($r->{head}, qr/X-Idem: replay/, 'after a reload: replay');

# graceful failover under light traffic

# two clients, 5 ms apart: a request is always on its way, and one that
# found the master's node closed at the switch would get 503
my @stops = (traffic($port, 'graceful', 0.005),
             traffic($port, 'graceful2', 0.005));
sleep 0.5;
$mark = () = lines_of($log);
my $t_switch = time;
my $out = topo('sentinel-failover', '--switch-only');
my $old = $master;
$master = master_port();
isnt($master, $old, "failover: $old -> $master");
ok(wait_until(5, sub { followed($master, $mark) >= 2 }),
   'both workers followed the switch without a reload');
note sprintf 'followed %.1f s after the failover was asked',
             time - $t_switch;
sleep 0.3;
my @graceful = map { $_->() } @stops;

my ($w_old, $db_new) = (writes($old), cli($master, 'DBSIZE'));
my $role_old = (split /\n/, cli($old, 'ROLE'))[0];
for my $i (1 .. 10) {
    $r = http_post($port, "after-$i", 'x');
    is($r->{status}, 201, "after the switch $i: 201") if $i <= 2;
}
SKIP: {
    skip "$old was demoted already", 1
        unless $role_old eq 'master'
               && (split /\n/, cli($old, 'ROLE'))[0] eq 'master';
    is(writes($old), $w_old, "nothing written to $old after the switch");
}
cmp_ok(cli($master, 'DBSIZE'), '>=', $db_new + 10,
       "the new keys are on $master");

my %st;
$st{$_->[1]}++ for @graceful;
note 'graceful failover, statuses: '
     . join(', ', map { "$_ x$st{$_}" } sort keys %st);
# claims in flight at the switch go again on the new connection, which
# is opened at once: not a single 503
is(join(',', grep { $_ != 201 } map { $_->[1] } @graceful), '',
   'graceful failover: every request served');

# the old master is demoted (a Sentinel does so 8 s after the switch)
ok(wait_until(20, sub { (split /\n/, cli($old, 'ROLE'))[0] eq 'slave' }),
   "$old was demoted");

# kill -9 of the master

my $stop = traffic($port, 'killed');
sleep 0.5;
$mark = () = lines_of($log);
my $t_kill = time;
topo('sentinel-kill-master');
$old = $master;
$master = master_port();
isnt($master, $old, "kill -9: $old -> $master");
ok(wait_until(5, sub { followed($master, $mark) >= 2 }),
   'both workers followed the new master');
my $back;
ok(wait_until(5, sub {
       my $x = http_post($port, 'probe-' . int(time * 1000), 'x');
       $back //= time if $x->{status} == 201;
       return $x->{status} == 201;
   }), 'served again after the switch');
note sprintf 'kill -9: served again %.1f s after the kill',
             ($back // time) - $t_kill;
sleep 0.5;
my @killed = $stop->();
%st = ();
$st{$_->[1]}++ for @killed;
note 'kill -9, statuses: ' . join(', ', map { "$_ x$st{$_}" } sort keys %st);
is(join(',', grep { $_ != 201 && $_ != 503 } map { $_->[1] } @killed), '',
   'kill -9: only 201 or 503');
my @tail = map { $_->[1] } @killed[-3 .. -1];
is("@tail", '201 201 201', 'kill -9: the last requests were served');

# the Sentinels all gone: the master keeps serving

for my $s (@sentinels) {
    my $f = "$ENV{TOPO_DIR}/$s/redis.pid";
    open my $fh, '<', $f or next;
    chomp(my $pid = <$fh> // '');
    kill 'KILL', $pid if $pid;
}
my @lone;
my $end = time + 11;
for (my $i = 0; time < $end; $i++) {
    push @lone, http_post($port, "lone-$i", 'x')->{status};
    sleep 0.5;
}
is(join(',', grep { $_ != 201 } @lone), '',
   'Sentinels down: the master serves on, past the 10 s refresh');
cmp_ok(scalar(@lone), '>', 10, 'Sentinels down: requests were sent');
$r = http_post($port, 'lone-0', 'x');
like($r->{head}, qr/X-Idem: replay/, 'Sentinels down: replay');

# and then the master made a replica by hand, unseen by any Sentinel:
# a claim answered READONLY is a 503, and is not run
my ($other) = grep { $_ != $master && $_ != $old } @data;
cli($other, qw(REPLICAOF NO ONE));
cli($master, qw(REPLICAOF 127.0.0.1), $other);
ok(wait_until(5, sub { (split /\n/, cli($master, 'ROLE'))[0] eq 'slave' }),
   "$master is a replica of $other");
$r = http_post($port, 'readonly-1', 'x');
is($r->{status}, 503, 'a claim answered READONLY: 503');
$r = http_post($port, 'lone-0', 'x');
is($r->{status}, 503, 'a retry too: the claim is a write (SET NX GET)');

# no key ran twice

my $runs = upstream_runs($dir);
is(join(',', grep { $runs->{$_} > 1 } sort keys %$runs), '',
   'no key ran twice upstream');
ok(!$runs->{'readonly-1'}, 'the READONLY claim did not run');
cmp_ok(scalar(keys %$runs), '>', 20, 'the backend ran');

nginx_stop($dir);
is(join('', log_problems($log)), '', 'no crash, no alert');
note sprintf 'took %.1f s', time - $t0;

done_testing();
