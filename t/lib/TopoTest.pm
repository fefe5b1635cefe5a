package TopoTest;

# Helpers shared by the plain Test::More suites that run on
# util/topology.sh (t/032, t/037, t/039, t/063): run an action, wait for a condition,
# count log lines, and the closing checks of every nginx they started.

use strict;
use warnings;
use Test::More;
use Fleet;
use Time::HiRes qw(time sleep);
use Exporter 'import';

our @EXPORT = qw(topo wait_until log_count finish_all);

my $script = 'util/topology.sh';

# topo(ARGS...): util/topology.sh ARGS, a passing test, its one line
sub topo {
    Fleet::guard_topology(@_[1, 2]) if $_[0] eq 'up';
    my $out = `$script @_ 2>&1`;
    ok($? == 0, "topology.sh @_") or diag $out;
    chomp $out;
    note $out;
    return $out;
}

sub wait_until {
    my ($secs, $cond) = @_;
    my $deadline = time + $secs;
    while (time < $deadline) {
        return 1 if $cond->();
        sleep 0.1;
    }
    return 0;
}

sub log_count {
    my ($dir, $re) = @_;
    return scalar grep { /$re/ } lines_of("$dir/logs/error.log");
}

# finish_all(dirs...): no key ran twice upstream, then stop each nginx:
# no crash, no alert
sub finish_all {
    for my $dir (@_) {
        my $runs = upstream_runs($dir);
        my @twice = grep { $runs->{$_} > 1 } keys %$runs;
        (my $name = $dir) =~ s{.*/}{};
        is("@twice", '', "$name: no key ran twice upstream");
    }
    for my $dir (@_) {
        nginx_stop($dir);
        is(join('', log_problems("$dir/logs/error.log")), '',
           "$dir: no crash, no alert");
    }
}

1;
