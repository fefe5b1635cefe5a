# Large stores and replays over TLS and on a TLS Redis Cluster: a large
# store is written from the op's own copy (what the socket does not take
# at once is queued), a large reply is read in place; both through
# nginx's SSL connection, and through the cluster's routing.
# - records around the 16 KB threshold, 300 KB and 1 MB: stored, replayed
#   byte-exact
# - 48 replays at once, small and large mixed (one worker: one connection
#   per node)
# - 24 large fresh requests at once: every one stored (no staging key
#   left), each replays byte-exact, none ran twice
# Plain Test::More: util/topology.sh standalone-tls and cluster-tls on
# TOPO_BASE (default 26400: +0, +21..+26, buses +121..+126), nginx on
# TOPO_BASE+300..+302.
# topology: yes (make test-topologies runs this file)
use strict;
use warnings;
use lib 't/lib';
use Test::More;
use Fleet;
use TopoTest;
use Time::HiRes qw(sleep);

plan skip_all => 'TEST_NGINX_LOAD_MODULES must name the module'
    unless have_module();
plan skip_all => "$ENV{REDIS_SERVER} is needed" unless `which $ENV{REDIS_SERVER}`;

my $base = $ENV{TOPO_BASE} || 26400;
$ENV{TOPO_BASE} = $base;
my $slow = $ENV{TEST_ASAN} ? 4 : 1;
my ($tls_port, $cl_port, $be_port) = map { $base + 300 + $_ } 0 .. 2;
my %dirs = map { $_ => "/tmp/ngx-idempotency-topo-$_-$base" }
           qw(standalone-tls cluster-tls);

my @up;
END {
    local $?;
    for (@up) {
        $ENV{TOPO_DIR} = $dirs{$_};
        system("util/topology.sh down $_ >/dev/null 2>&1");
    }
}
$SIG{$_} = sub { $SIG{PIPE} = 'IGNORE'; exit 1 } for qw(INT TERM HUP PIPE);

for my $t (qw(standalone-tls cluster-tls)) {
    $ENV{TOPO_DIR} = $dirs{$t};
    push @up, $t;
    topo('up', $t);
}

my $root = fleet_root('large-topo');
my %body;
mkdir "$root/www";
for my $n (10, 16300, 40000, 300 * 1024, 1024 * 1024) {
    my $b = join '', map { chr(($_ * 13 + $n) % 251) } 0 .. $n - 1;
    $body{$n} = $b;
    open my $fh, '>', "$root/www/b$n" or die $!;
    binmode $fh;
    print $fh $b;
    close $fh;
}
my @sizes = sort { $a <=> $b } keys %body;

my $tls = "idempotency_redis_tls_trusted_certificate"
          . " $dirs{'standalone-tls'}/tls/ca.crt;";
# the cluster's nodes ask for a client certificate
my $cl_tls = join ' ', map { "idempotency_redis_tls_$_->[0]"
                             . " $dirs{'cluster-tls'}/tls/$_->[1];" }
             ['trusted_certificate', 'ca.crt'], ['certificate', 'client.crt'],
             ['certificate_key', 'client.key'];

sub front {
    my ($port, $redis) = @_;
    return <<"EOC";
    server {
        listen 127.0.0.1:$port;
        $redis
        idempotency_store_max_size 2m;
@{[ get_front($be_port) ]}
    }
EOC
}

my $dir = nginx_conf('large-topo', <<"EOC", 1);
    log_format backend '\$http_idempotency_key';
@{[ front($tls_port, "idempotency_redis 127.0.0.1:$base tls; $tls") ]}
@{[ front($cl_port, "idempotency_redis 127.0.0.1:" . ($base + 21)
                    . " cluster tls; $cl_tls") ]}
    server {
        listen 127.0.0.1:$be_port;
        access_log $root/large-topo/logs/backend.log backend;
        location / { root $root/www; }
    }
EOC
nginx_start($dir);
sleep 1 * $slow;

for my $case (['TLS', $tls_port], ['TLS cluster', $cl_port]) {
    my ($what, $port) = @$case;
    (my $tag = $what) =~ s/ /-/g;

    # each size alone
    for my $n (@sizes) {
        my $r = http_post($port, "$tag-$n", 'x', "/b$n", '', 20 * $slow);
        is(idem_status($r), '200 new', "$what, $n bytes: stored");
        $r = http_post($port, "$tag-$n", 'x', "/b$n", '', 20 * $slow);
        ok(idem_status($r) eq '200 replay' && $r->{body} eq $body{$n},
           "$what, $n bytes: replays byte-exact")
            or diag idem_status($r) . ' ' . length $r->{body};
    }

    # replays at once, small and large mixed
    my @reqs = map { my $n = $sizes[$_ % @sizes];
                     [$port, "$tag-$n", 'x', "/b$n"] } 0 .. 47;
    my $res = http_burst(\@reqs, 30 * $slow);
    is(scalar(grep { idem_status($res->[$_]) eq '200 replay'
                     && $res->[$_]{body} eq $body{$sizes[$_ % @sizes]} }
              0 .. 47),
       48, "$what: 48 replays at once, each byte-exact");

    # large fresh requests at once: every store lands
    @reqs = map { [$port, "$tag-fresh-$_", 'x', '/b' . 300 * 1024] } 1 .. 24;
    $res = http_burst(\@reqs, 30 * $slow);
    is(scalar(grep { idem_status($_) eq '200 new' } @$res), 24,
       "$what: 24 large fresh requests at once");
    sleep 0.5 * $slow;
    @reqs = map { [$port, "$tag-fresh-$_", 'x', '/b' . 300 * 1024] } 1 .. 24;
    $res = http_burst(\@reqs, 30 * $slow);
    is(scalar(grep { idem_status($_) eq '200 replay'
                     && $_->{body} eq $body{300 * 1024} } @$res),
       24, "$what: each of them stored and replayed byte-exact");
}

is(log_count($dir, qr/invalid reply|cannot store|claim was lost/), 0,
   "no reply misread, no store lost");
finish_all($dir);

done_testing();
