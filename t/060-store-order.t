# idempotency_store_immediate on: a record is on its way to Redis before
# the last byte of the response it stores, so a client that retries on
# another nginx the moment it has read the whole response finds the record
# and is answered its replay.  Off (the default), the store is written at
# the end of the worker's event loop turn, after the response; a retry
# that reaches Redis first meets the claim and gets the documented 409
# with Retry-After: 1 (6 to 78 of these 400, usually about 25), and its
# next try is replayed.
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
        location /now/ {
            idempotency on;
            idempotency_store_immediate on;
            proxy_pass http://127.0.0.1:$origin_port;
        }
    }
EOC
    nginx_start($dirs[-1]);
}

# a POST read to its last byte: its status and $idempotency_status, and
# for a 409 its Retry-After and problem code
sub post {
    my ($port, $key, $path) = @_;
    my $s = IO::Socket::INET->new("127.0.0.1:$port") or return '';
    print $s "POST $path HTTP/1.1\r\nHost: x\r\nIdempotency-Key: $key\r\n"
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
    my $got = ($st // 0) . ' ' . ($idem // '-');
    if (($st // 0) == 409) {
        my ($ra) = $head =~ /^Retry-After: (\S+)/mi;
        my ($type) = $body =~ /"code":"([\w-]+)"/;
        $got .= ' ' . ($ra // '-') . ' ' . ($type // '-');
    }
    return $got;
}

# each key POSTed on one nginx, then at once on the other
sub rounds {
    my ($path, $tag) = @_;
    my (%got, @late);
    for my $n (1 .. $rounds) {
        my $key = "store-order-$tag-$$-$n";
        my $a = post($ports[0], $key, $path);
        my $b = post($ports[1], $key, $path);
        $got{"$a, $b"}++;
        push @late, $key if $b =~ /^409/;
    }
    diag "$path: " . join '; ', map { "$_: $got{$_}" } sort keys %got;
    return (\%got, \@late);
}

my ($got, $late) = rounds('/now/pay', 'now');

# The module's part is exact: the record is written before the response.
# The kernel's is not: on a loaded machine a worker moved to another CPU
# between the two writes can have its response delivered first (1 to 6 of
# 400 retries met the claim so, beside five other test runs on two cores;
# none on a quiet one).  Written with the turn: 6 to 78.

is(($got->{'200 new, 200 replay'} // 0) + @$late, $rounds,
   "immediate: $rounds stored responses, each retried at once on the "
   . "other nginx: replayed, or at worst 409");
cmp_ok(scalar @$late, '<=', 2,
       'immediate: at most 2 in 400 retries met the claim (409), a loaded '
       . 'kernel\'s')
    or diag "@$late[0 .. ($#$late < 4 ? $#$late : 4)]";

# The default: the window is documented, and what a retry meets in it is
# the in-progress answer that tells it when to come back, which replays.

($got, $late) = rounds('/pay', 'turn');
my $told = $got->{'200 new, 200 replay'} // 0;
$told += $got->{$_} for grep /^200 new, 409 conflict 1 request-in-progress$/,
                        keys %$got;
is($told, $rounds,
   "with the turn: every immediate retry replayed or told 409 "
   . "request-in-progress with Retry-After: 1");
my @again = map { post($ports[1], $_, '/pay') } @$late;
is(scalar(grep { $_ ne '200 replay' } @again), 0,
   scalar(@$late) . ' retries that met the claim: the next try replayed');

is(scalar log_problems("$_/logs/error.log"), 0, 'no crash or alert')
    for @dirs;

nginx_stop($_) for @dirs, $origin;

done_testing();
