# The fault campaign, reduced (faults/campaign.py --short; the full one is
# make faults): two nginx instances of two workers against a Redis with
# AOF and an origin that counts executions; clients that retry like
# Stripe's libraries; one fault per round (origin timeout, reset, 500,
# 503, a worker killed, Redis stopped, connections to Redis cut); keep
# and release.  One test per round and policy, as judged by
# faults/judge.py, then what the campaign must show: keep never ran a key
# twice, and release did run one again after the origin timed out.
# Ports FAULTS_PORT_BASE (27000) +201..+220.
use strict;
use warnings;
use lib 't/lib';
use Test::More;
use Fleet;
use JSON::PP;
use Time::HiRes qw(time);

plan skip_all => 'TEST_NGINX_LOAD_MODULES must name the module'
    unless have_module();
plan skip_all => "python3 and $ENV{REDIS_SERVER} are needed"
    unless `which python3` && `which $ENV{REDIS_SERVER}`;

my $out = 't/servroot-faults';
# the module named for the other tests, whichever runner set it
($ENV{FAULTS_MODULE}) = grep { /idempotency/ }
                        split /\s+/, $ENV{TEST_NGINX_LOAD_MODULES};
my $t0 = time;
my $log = `python3 faults/campaign.py --short --out $out 2>&1`;
my $rc = $? >> 8;
my $took = time - $t0;

my $res = eval {
    open my $fh, '<', "$out/results.json" or die $!;
    local $/;
    decode_json(<$fh>);
};
ok($res, 'the campaign wrote its results') or diag $log;
my @rows = @{ $res->{rows} // [] };
ok(@rows >= 10, scalar(@rows) . ' rounds x policies judged');

for my $r (@rows) {
    ok($r->{ok}, "$r->{fault}, $r->{policy}: $r->{keys} keys, "
       . "$r->{executions} executions, $r->{new} new, $r->{replay} replay, "
       . "$r->{unknown} unknown, $r->{'retry-later'} retry later");
}
for my $f (@{ $res->{failing} // [] }) {
    diag("$f->[0]: @{ $f->[1] }");
}

my @twice = grep { $_->{policy} eq 'keep' && $_->{twice} } @rows;
is(scalar @twice, 0, 'keep: no key ran twice, in any round');
my ($rel) = grep { $_->{fault} eq 'origin-timeout'
                   && $_->{policy} eq 'release' } @rows;
ok($rel && $rel->{twice} >= 1,
   'release: the origin-timeout round ran a key again ('
   . ($rel ? $rel->{twice} : 0) . ' keys), as release allows');
is($rc, 0, 'the campaign exits 0') or diag $log;
like($log, qr/^\d+ passed, 0 failed$/m, '...and says so on its last line');
cmp_ok($took, '<', $ENV{TEST_ASAN} ? 360 : 120,
       sprintf('in %.0f s', $took));

done_testing();
