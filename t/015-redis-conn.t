# The Redis connection (SPEC §6): a refused handshake backs off like a
# refused connect and is logged once; "connected" is logged only after the
# handshake; a refused SCRIPT LOAD is not fatal; only workers connect (not
# the cache manager or loader), under a CLIENT SETNAME name; a reply that no
# command asked for resets the connection instead of aborting the worker.
# Plain Test::More: it starts its own nginx instances (ports 20100-20149).
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

my $rp = $ENV{TEST_NGINX_REDIS_PORT} || 6379;
my $slow = $ENV{TEST_ASAN} ? 4 : 1;
my ($port_badpass, $port_named, $port_noscript, $port_fake, $port_full)
    = (20100, 20101, 20102, 20103, 20104);    # and 20105
my ($fake_redis, $full_redis) = (20120, 20121);    # and 20122

my $root = fleet_root('redisconn');

redis_cli('ACL', 'SETUSER', 'idemconn', 'reset', 'on', '>s3cret', '~*',
          '+@all');
redis_cli('ACL', 'SETUSER', 'idemnoscript', 'reset', 'on', '>s3cret', '~*',
          '+@all', '-@scripting', '-client|setname');

my (@fake_pids, @dirs);

END {
    nginx_stop($_) for @dirs;
    kill 'TERM', @fake_pids;
    redis_cli('ACL', 'DELUSER', 'idemconn', 'idemnoscript');
}

sub instance {
    my ($name, $port, $redis, $extra) = @_;
    my $dir = nginx_conf($name, <<"EOC", 1);
    $redis
    ${\ ($extra // '') }
    server {
        listen 127.0.0.1:$port;
        location = /pay {
            idempotency on;
            add_header X-Idem \$idempotency_status always;
            proxy_pass http://127.0.0.1:$port/backend;
        }
        location = /backend {
            return 201 "ok\\n";
        }
    }
EOC
    nginx_start($dir);
    push @dirs, $dir;
    return $dir;
}

# stopped at the end of its block: a live one would skew the counts of the next
sub retire {
    my $dir = shift;
    nginx_stop($dir);
    @dirs = grep { $_ ne $dir } @dirs;
}

# the server compares and sets natively (Valkey 8.1, Redis 8.4 and later)
sub native_cas { return server_caps()->{ifeq} }

sub log_count {
    my ($dir, $re) = @_;
    return scalar grep { /$re/ } lines_of("$dir/logs/error.log");
}

sub connections_received {
    my ($n) = redis_cli('INFO', 'stats')
        =~ /^total_connections_received:(\d+)/m;
    return $n;
}

sub clients_of {
    my $user = shift;
    return grep { /\buser=\Q$user\E\b/ } split /\n/, redis_cli('CLIENT', 'LIST');
}

# 1. a wrong password: backoff, one log line, never "connected"
{
    my $dir = instance('badpass', $port_badpass,
        "idempotency_redis 127.0.0.1:$rp user=idemconn password=wrong;");

    sleep 1.5;
    my $before = connections_received();
    sleep 1;
    my $made = connections_received() - $before - 1;    # less our own

    cmp_ok($made, '<=', 4, "refused handshake: at most 4 connects a second")
        or diag "$made connections in 1 s";
    diag("refused handshake: $made connections in 1 s");

    my $r = http_post($port_badpass, 'conn-badpass', 'x');
    is($r->{status}, 503, "refused handshake: 503");

    is(log_count($dir, qr/refused the handshake: WRONGPASS/), 1,
       "the refusal is logged once, with the reason");
    is(log_count($dir, qr/connected to redis/), 0,
       "never reported as connected");
    is(scalar log_problems("$dir/logs/error.log"), 0, "no crash or alert");
    retire($dir);
}

# 2. only the worker connects, named, and says so once; again after a kill
{
    my $dir = instance('named', $port_named,
        "idempotency_redis 127.0.0.1:$rp user=idemconn password=s3cret;",
        "proxy_cache_path $root/named/cache keys_zone=idemconn:1m;");

    sleep 0.5 * $slow;
    my @clients = clients_of('idemconn');
    is(scalar @clients, 1,
       "one connection with a cache manager and loader running")
        or diag join "\n", @clients;
    like($clients[0] // '', qr/\bname=nginx-idempotency-\d+\b/,
         "the connection is named by CLIENT SETNAME");
    is(log_count($dir, qr/\[notice\].*connected to redis "[^"]+"$/), 1,
       "\"connected\" logged once, at notice");

    redis_cli('CLIENT', 'KILL', 'USER', 'idemconn');
    sleep 0.3 * $slow;
    is(log_count($dir, qr/lost the connection to redis/), 1,
       "the lost connection is logged");
    is(log_count($dir, qr/\[notice\].*connected to redis "[^"]+" again/), 1,
       "\"connected again\" after the reconnect");
    is(scalar clients_of('idemconn'), 1, "still one connection");

    my $a = http_post($port_named, 'conn-named', 'x');
    my $b = http_post($port_named, 'conn-named', 'x');
    is("$a->{status} $b->{status}", "201 201", "protected after a reconnect");
    like($b->{head}, qr/X-Idem: replay/, "the second is a replay");
    is(scalar log_problems("$dir/logs/error.log"), 0, "no crash or alert");
    retire($dir);
}

# 3. an ACL user without scripting nor CLIENT SETNAME, the connection stays.
#    A server with SET IFEQ (Valkey 8.1 and later) compares and sets
#    natively: every guarantee holds.  Without it no finish could check the
#    owner: no key is claimed (503), and that is said once, at error.
{
    my $dir = instance('noscript', $port_noscript,
        "idempotency_redis 127.0.0.1:$rp user=idemnoscript password=s3cret;");
    my $native = native_cas();

    sleep 0.5 * $slow;
    my $before = connections_received();
    my $a = http_post($port_noscript, 'conn-noscript', 'x');
    sleep 0.2;
    my $b = http_post($port_noscript, 'conn-noscript', 'x');
    my $made = connections_received() - $before - 1;

    if ($native) {
        is("$a->{status} $b->{status}", "201 201",
           "no scripting, SET IFEQ: the request runs, then a replay");
        like($a->{head}, qr/X-Idem: new/, "no scripting, SET IFEQ: new");
        like($b->{head}, qr/X-Idem: replay/,
             "no scripting, SET IFEQ: stored natively, replayed");
        is(log_count($dir, qr/forbids scripting/), 0,
           "no scripting, SET IFEQ: nothing refused");

    } else {
        is("$a->{status} $b->{status}", "503 503",
           "no scripting, no SET IFEQ: no key is claimed");
        like($a->{head}, qr/X-Idem: error/, "no scripting: an error");
        like($b->{head}, qr/X-Idem: error/, "no scripting: still an error");
        is(log_count($dir,
                     qr/\[error\].*redis "[^"]+" \(redis [\d.]+\) forbids scripting and has no SET IFEQ/),
           1, "what is missing is said once, at error");
    }

    is($made, 0, "no scripting: no reconnects");
    is(log_count($dir, qr/\[warn\].*refused SCRIPT LOAD: NOPERM/), 1,
       "the refused SCRIPT LOAD is logged once, at warn");
    is(log_count($dir, qr/refused to store the record/), 0,
       "no store was sent to be refused");
    is(log_count($dir, qr/\[info\].*refused CLIENT SETNAME: NOPERM/), 1,
       "the refused name is logged at info");
    is(log_count($dir, qr/connected to redis/), 1, "reported as connected");
    is(log_count($dir, qr/refused the handshake/), 0, "not a refusal");
    is(scalar log_problems("$dir/logs/error.log"), 0, "no crash or alert");
    retire($dir);
}

# 4. a server that sends a reply no command asked for (a misbehaving proxy):
#    hiredis 0.14 would abort() the worker; the connection is reset instead

# RESP commands in, canned answers out; every SET gets one answer too many.
# With a $greeting, each connection gets it and is closed (and counted in
# $accepts): "-ERR max number..." is what a full Redis sends.
sub fake_redis {
    my ($port, $greeting, $accepts) = @_;
    my $l;
    for (1 .. 30) {     # a previous fake may still be going away
        $l = IO::Socket::INET->new(LocalAddr => "127.0.0.1:$port",
                                   Listen => 16, ReuseAddr => 1) and last;
        sleep 0.1;
    }
    $l or die "fake redis on $port: $!";
    my $pid = fork // die "fork: $!";
    return $pid if $pid;

    alarm 60;
    my $sel = IO::Select->new($l);
    my %buf;
    for (;;) {
        for my $s ($sel->can_read) {
            if ($s == $l) {
                my $c = $l->accept or next;
                if (defined $greeting) {
                    syswrite($c, $greeting);
                    close $c;
                    open my $fh, '>>', $accepts or die;
                    print $fh "accept\n";
                    close $fh;
                    next;
                }
                $sel->add($c);
                $buf{fileno $c} = '';
                next;
            }
            my $n = sysread($s, my $in, 65536);
            if (!$n) {
                $sel->remove($s);
                delete $buf{fileno $s};
                close $s;
                next;
            }
            my $b = \$buf{fileno $s};
            $$b .= $in;
            while ($$b =~ /\A\*(\d+)\r\n/) {
                my ($argc, $pos, @argv) = ($1, length $&);
                for (1 .. $argc) {
                    last unless substr($$b, $pos) =~ /\A\$(\d+)\r\n/;
                    my $len = $1;
                    $pos += length $&;
                    last if length($$b) < $pos + $len + 2;
                    push @argv, substr($$b, $pos, $len);
                    $pos += $len + 2;
                }
                last if @argv < $argc;
                substr($$b, 0, $pos) = '';
                my $cmd = uc $argv[0];
                syswrite($s, $cmd eq 'SET' ? "\$-1\r\n+OK\r\n"
                           : $cmd eq 'SCRIPT' ? "\$40\r\n" . ('0' x 40) . "\r\n"
                           : $cmd =~ /^EVAL/ ? ":1\r\n"
                           : "+OK\r\n");
            }
        }
    }
}

{
    push @fake_pids, fake_redis($fake_redis);
    my $dir = instance('unsolicited', $port_fake,
                       "idempotency_redis 127.0.0.1:$fake_redis;");

    sleep 0.3 * $slow;
    my $r = http_post($port_fake, 'conn-unsolicited', 'x', undef, undef, 5);
    sleep 0.3 * $slow;

    is($r->{status}, 201, "unsolicited reply: the claim's own reply counts");
    is(log_count($dir, qr/exited on signal/), 0, "the worker did not abort");
    is(log_count($dir, qr/\[error\].*sent a reply to no command/), 1,
       "the unsolicited reply is logged, once");
    ok(log_count($dir, qr/connected to redis "[^"]+" again/) >= 1,
       "and the connection is made again");
    retire($dir);
}

# 5. a full Redis refuses a connection without AUTH at its CLIENT SETNAME:
#    a refused handshake too, not "connected"; and a server that does not
#    speak RESP at all
for my $t (['full', "-ERR max number of clients reached\r\n",
            qr/refused the handshake: ERR max number of clients/],
           ['http', "HTTP/1.1 400 Bad Request\r\n\r\n",
            qr/\[error\].*sent an invalid reply: Protocol error/])
{
    my ($name, $greeting, $logged) = @$t;
    my $accepts = "$root/$name-accepts";
    my $redis_port = $name eq 'full' ? $full_redis : $full_redis + 1;
    push @fake_pids, fake_redis($redis_port, $greeting, $accepts);
    my $dir = instance($name, $name eq 'full' ? $port_full : $port_full + 1,
                       "idempotency_redis 127.0.0.1:$redis_port;");

    sleep 1.5;
    my $before = () = lines_of($accepts);
    sleep 1;
    my $made = (() = lines_of($accepts)) - $before;

    cmp_ok($made, '<=', 4, "$name: at most 4 connects a second")
        or diag "$made connections in 1 s";
    is(log_count($dir, $logged), 1, "$name: logged once, with the reason");
    is(log_count($dir, qr/connected to redis/), 0,
       "$name: never reported as connected");
    is(scalar log_problems("$dir/logs/error.log"), 0,
       "$name: no crash or alert");
    retire($dir);
}

done_testing();
