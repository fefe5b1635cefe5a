package CutProxy;

# A TCP proxy in front of a Redis that cuts the connection around a claim's
# SET (or the commands named in cut()'s third argument, "EVAL|EVALSHA"):
# "before" the command reaches Redis, or "after" Redis ran it (its reply
# is lost). The mode is read from a file at every SET, so the test changes
# it at run time with cut(). A forked child; the caller kills it.

use strict;
use warnings;
use IO::Socket::INET;
use IO::Select;
use Time::HiRes qw(sleep);
use Exporter 'import';

our @EXPORT = qw(cut_proxy cut);
our @EXPORT_OK = qw(proxy_loop);

my $file;

# cut(mode, times, commands): the next `times` connections that carry one
# of the commands (default SET) are cut
sub cut {
    my ($mode, $times, $cmds) = @_;
    $cmds //= 'SET';
    open my $fh, '>', "$file.tmp" or die $!;
    print $fh "$mode $times $cmds\n";
    close $fh;
    rename "$file.tmp", $file or die $!;
}

# cut_proxy(listen port, redis port, mode file) -> pid
sub cut_proxy {
    my ($port, $rp, $f) = @_;
    $file = $f;
    cut('none', 0);
    return proxy_loop($port, $rp, sub {
        my ($s, $buf, $p, $close, $from_redis) = @_;
        if (!$from_redis) {
            open my $fh, '<', $file or die $!;
            my ($mode, $times, $cmds) = split ' ', scalar <$fh>;
            close $fh;
            my $re = join '|', map { '\$' . length($_) . "\r\n$_\r\n" }
                               split /\|/, $cmds;
            if ($times > 0 && $buf =~ /$re/) {
                open $fh, '>', $file or die $!;
                print $fh "$mode ", $times - 1, " $cmds\n";
                close $fh;
                if ($mode eq 'after') {
                    syswrite($p, $buf);
                    sleep 0.1;    # Redis runs it; its reply is lost
                }
                $close->($s);
                return;
            }
        }
        syswrite($p, $buf);
    });
}

# proxy_loop(listen port, redis port, on_data) -> pid of a forked proxy
# that connects each accepted connection to Redis and calls
# on_data(socket, bytes, peer, close, from_redis) for what either side
# sent (at most read_size(socket) bytes, default 64 KB); close->(socket)
# closes both sides
sub proxy_loop {
    my ($port, $rp, $on_data, $read_size) = @_;
    my $pid = fork // die "fork: $!";
    return $pid if $pid;

    srand($$);
    my $l = IO::Socket::INET->new(LocalAddr => "127.0.0.1:$port",
                                  Listen => 16, ReuseAddr => 1)
        or die "proxy: $!";
    my $sel = IO::Select->new($l);
    my %peer;
    my $close = sub {
        my $s = shift;
        my $p = delete $peer{$s};
        delete $peer{$p} if $p;
        for ($s, $p) {
            next unless $_;
            $sel->remove($_);
            close $_;
        }
    };
    while (1) {
        for my $s ($sel->can_read) {
            if ($s == $l) {
                my $c = $l->accept or next;
                my $r = IO::Socket::INET->new(PeerAddr => "127.0.0.1:$rp")
                    or do { close $c; next };
                $peer{$c} = $r;
                $peer{$r} = $c;
                ${*$r}{redis} = 1;
                $sel->add($c, $r);
                next;
            }
            my $from_redis = ${*$s}{redis} ? 1 : 0;
            my $size = $read_size ? $read_size->($from_redis) : 65536;
            my $n = sysread($s, my $buf, $size);
            if (!$n) {
                $close->($s);
                next;
            }
            my $p = $peer{$s} or next;
            $on_data->($s, $buf, $p, $close, $from_redis);
        }
    }
    exit 0;
}

1;
