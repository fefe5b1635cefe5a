# A record is on its way to Redis before the last byte of the response it
# stores: a client that retries on another nginx the moment it has read
# the whole response finds the record, and is answered its replay.  The
# store used to be written at the end of the worker's event loop turn,
# after the response; a retry that reached Redis first met the claim and
# got 409 (about 1.5% of immediate retries through another worker).
# Plain Test::More: two nginx (one worker each) on 20600 and 20601, an
# origin on 20602.
use strict;
use warnings;
use lib 't/lib';
use Test::More;
use Fleet;
use IO::Socket::INET;

plan skip_all => 'TEST_NGINX_LOAD_MODULES must name the module'
    unless have_module();

my $rp = $ENV{TEST_NGINX_REDIS_PORT} || 6379;
my @ports = (20600, 20601);
my $origin_port = 20602;
my $rounds = $ENV{TEST_ASAN} ? 100 : 400;
my $root = fleet_root('store-order');

my $origin = nginx_conf('origin', <<"EOC", 1);
    server {
        listen 127.0.0.1:$origin_port;
        location / { return 200 "charged\\n"; }
    }
EOC
nginx_start($origin);

my @dirs;
for my $i (0, 1) {
    push @dirs, nginx_conf("edge$i", <<"EOC", 1);
    idempotency_redis 127.0.0.1:$rp;
    server {
        listen 127.0.0.1:$ports[$i];
        add_header X-Idem \$idempotency_status always;
        location / {
            idempotency on;
            proxy_pass http://127.0.0.1:$origin_port;
        }
    }
EOC
    nginx_start($dirs[-1]);
}

# a POST read to its last byte; its status and $idempotency_status
sub post {
    my ($port, $key) = @_;
    my $s = IO::Socket::INET->new("127.0.0.1:$port") or return '';
    print $s "POST /pay HTTP/1.1\r\nHost: x\r\nIdempotency-Key: $key\r\n"
           . "Content-Length: 1\r\nConnection: close\r\n\r\nx";
    my ($head, $len) = ('', 0);
    while (defined(my $l = <$s>)) {
        $head .= $l;
        $len = $1 if $l =~ /^Content-Length: (\d+)/i;
        last if $l eq "\r\n";
    }
    my $body = '';
    read($s, $body, $len) if $len;
    my ($st) = $head =~ m{^HTTP/1\.1 (\d+)};
    my ($idem) = $head =~ /^X-Idem: (\S+)/mi;
    return ($st // 0) . ' ' . ($idem // '-');
}

my (%got, @late);
for my $n (1 .. $rounds) {
    my $key = "store-order-$$-$n";
    my $a = post($ports[0], $key);
    my $b = post($ports[1], $key);
    $got{"$a, $b"}++;
    push @late, $key if $b =~ /^409/;
}

# The module's part is exact: the record is written before the response.
# The kernel's is not: on a loaded machine a worker moved to another CPU
# between the two writes can have its response delivered first (1 to 6 of
# 400 retries met the claim so, beside five other test runs on two cores;
# none on a quiet one).  Before the record was written first: 9 of 400.

diag join '; ', map { "$_: $got{$_}" } sort keys %got;
is(($got{'200 new, 200 replay'} // 0) + @late, $rounds,
   "$rounds stored responses, each retried at once on the other nginx: "
   . "replayed, or at worst 409");
cmp_ok(scalar @late, '<=', 2,
       'at most 2 in 400 retries met the claim (409), a loaded kernel\'s')
    or diag "@late[0 .. ($#late < 4 ? $#late : 4)]";
is(scalar log_problems("$_/logs/error.log"), 0, 'no crash or alert')
    for @dirs;

nginx_stop($_) for @dirs, $origin;

done_testing();
