# The DNS stub the topology tests move Redis names with (t/lib/DnsStub.pm):
# answers follow the map as the test changes it, unknown names are
# NXDOMAIN, a known name without an address of the type asked is NODATA,
# the TTL is the one set; checked with our own client, with dig when it
# is installed, and with nginx's resolver, the client that matters.
# Plain Test::More: ports 23253-23255 (the topology range, util/topology.sh).
# topology: yes (make test-topologies runs this file)
use strict;
use warnings;
use lib 't/lib';
use Test::More;
use Fleet;
use DnsStub;
use Time::HiRes qw(sleep);

my ($dns_port, $backend_port, $proxy_port) = (23253, 23254, 23255);
my $root = fleet_root('dns-stub');

my $dns = DnsStub->start(port => $dns_port, dir => $root, ttl => 1,
                         names => { 'redis.test' => ['127.0.0.1'] });
END { $dns->stop if $dns }

sub ask { DnsStub::query($dns_port, @_) }

my $r = ask('redis.test');
is_deeply($r->{addrs}, ['127.0.0.1'], 'A answer from the map');
is($r->{rcode}, 0, 'NOERROR');
is($r->{ttl}, 1, 'the TTL set');
is(ask('REDIS.test.')->{addrs}[0], '127.0.0.1',
   'case and a trailing dot do not matter');

$dns->set('redis.test' => ['127.0.0.2', '127.0.0.3']);
is_deeply(ask('redis.test')->{addrs}, ['127.0.0.2', '127.0.0.3'],
          'a change is seen by the next query, with several addresses');

$r = ask('redis.test', 'AAAA');
is_deeply([$r->{rcode}, scalar @{ $r->{addrs} }], [0, 0],
          'AAAA of a name with IPv4 addresses only: NODATA');
$dns->set('v6.test' => ['::1', '127.0.0.9']);
is_deeply(ask('v6.test', 'AAAA')->{addrs}, ['::1'], 'AAAA answer');
is_deeply(ask('v6.test')->{addrs}, ['127.0.0.9'], 'A beside it');

is(ask('other.test')->{rcode}, 3, 'a name not in the map: NXDOMAIN');
$dns->set('redis.test' => undef);
is(ask('redis.test')->{rcode}, 3, 'a name removed: NXDOMAIN');
$dns->set('redis.test' => 'servfail');
is(ask('redis.test')->{rcode}, 2, 'SERVFAIL on demand');
$dns->set('redis.test' => 'drop');
is(ask('redis.test', 'A', 0.3), undef, 'no answer on demand');

$dns->set('redis.test' => ['127.0.0.1']);
$dns->ttl(30);
is(ask('redis.test')->{ttl}, 30, 'the TTL changed');
is($dns->queries('redis.test', 'A'), 7, 'the queries are counted');
$dns->ttl(1);

SKIP: {
    skip 'dig is not installed', 2 unless `which dig 2>/dev/null`;
    my $dig = "dig +short +tries=1 +time=2 -p $dns_port \@127.0.0.1";
    is(`$dig redis.test A`, "127.0.0.1\n", 'dig reads the answer');
    like(`$dig +noall +comments nowhere.test A`, qr/status: NXDOMAIN/,
         'dig reads NXDOMAIN');
}

SKIP: {
    my $nginx = $ENV{TEST_NGINX_BINARY} || '/usr/sbin/nginx';
    skip 'no nginx', 5 unless -x $nginx;

    # nginx resolves a variable proxy_pass at run time, asking A and AAAA
    my $dir = nginx_conf('edge', <<"EOC", 1);
    server {
        listen 127.0.0.1:$backend_port;
        location / { return 200 "backend\\n"; }
    }
    server {
        listen 127.0.0.1:$proxy_port;
        resolver 127.0.0.1:$dns_port valid=1s;
        resolver_timeout 1s;
        location / {
            set \$backend backend.test;
            proxy_pass http://\$backend:$backend_port;
        }
    }
EOC
    $dns->set('backend.test' => ['127.0.0.1']);
    nginx_start($dir);
    my $get = sub { http_post($proxy_port, undef, '', '/', '', 5) };

    is($get->()->{status}, 200, 'nginx resolves the name through the stub');
    ok($dns->queries('backend.test', 'AAAA') >= 1,
       'nginx asked AAAA too, and took the A answer beside its NODATA');
    $dns->set('backend.test' => undef);
    sleep 2.2;    # valid=1s, counted in whole seconds
    is($get->()->{status}, 502, 'NXDOMAIN once the TTL expired');
    $dns->set('backend.test' => ['127.0.0.1']);
    sleep 2.2;    # valid=1s, counted in whole seconds
    is($get->()->{status}, 200, 'resolved again');
    nginx_stop($dir);
    ok(scalar(grep { /backend\.test could not be resolved \(3: Host not/ }
              lines_of("$dir/logs/error.log")),
       'nginx logged the NXDOMAIN');
}

done_testing;
