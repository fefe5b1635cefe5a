package CutProxy;

# The cut proxy (t/lib/cutproxy.py, which says what it does) for a test:
# cut_proxy(listen port, redis port, log) starts it and returns its pid
# once it listens; cut(mode, times, names) puts a cut in force before it
# returns: the next `times` commands that hold one of the names
# ("EVAL|EVALSHA", default SET) are cut "before" they reach Redis, or
# "after" Redis answered them (the reply is lost). The proxy ends with
# the test, when its input closes.

use strict;
use warnings;
use IO::Handle;
use IPC::Open2;
use Exporter 'import';

our @EXPORT = qw(cut_proxy cut);

my ($to, $from);

sub expect {
    my $want = shift;
    my $line = <$from> // '(nothing)';
    chomp $line;
    $line eq $want or die "the cut proxy said $line, not $want\n";
}

sub cut_proxy {
    my ($port, $rp, $log) = @_;
    my $py = $ENV{TEST_PYTHON} || '/usr/bin/python3';
    my $pid = open2($from, $to, $py, 't/lib/cutproxy.py', $port, $rp, $log);
    $to->autoflush(1);
    expect('ready');
    return $pid;
}

sub cut {
    my ($mode, $times, $names) = @_;
    print $to "cut $mode $times ", $names // 'SET', "\n";
    expect('ok');
}

1;
