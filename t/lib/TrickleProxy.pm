package TrickleProxy;

# A TCP proxy in front of a Redis that hands Redis's bytes to nginx in
# pieces, so that replies arrive split at every kind of place, or cuts the
# connection in the middle of a reply.  Its mode is read from a file before
# each write towards nginx, so the test changes it at run time with
# trickle():
#   pass             bytes go through as read
#   split N          Redis's bytes go in pieces of 1 .. N bytes (random),
#                    each written alone, 1 ms apart (pieces of up to 100
#                    bytes: every 8th, 1 ms apart)
#   slow N           nginx's bytes are read N at a time, 5 ms apart, so
#                    that a large command fills nginx's socket
#   cut N            the next connection to carry more than N bytes from
#                    Redis since the mode was set gets the first N, then is
#                    closed both ways (once; the mode then becomes pass)
# A forked child; the caller kills it.

use strict;
use warnings;
use Time::HiRes qw(sleep);
use IO::Socket::INET;
use IO::Select;
use Exporter 'import';

our @EXPORT = qw(trickle_proxy trickle);

my $file;

sub trickle {
    my ($mode, $n) = @_;
    open my $fh, '>', "$file.tmp" or die $!;
    print $fh "$mode ", $n // 0, "\n";
    close $fh;
    rename "$file.tmp", $file or die $!;
}

sub mode {
    open my $fh, '<', $file or return ('pass', 0);
    my ($mode, $n) = split ' ', scalar(<$fh>) // '';
    close $fh;
    my @st = stat $file;
    return ($mode // 'pass', $n // 0, "$st[1]:$st[9]");
}

# trickle_proxy(listen port, redis port, mode file) -> pid
sub trickle_proxy {
    my ($port, $rp, $f) = @_;
    $file = $f;
    trickle('pass');
    my (%sent, %seen);
    my $read_size = sub {
        my ($mode, $arg) = mode();
        return $mode eq 'slow' && !$_[0] ? $arg : 65536;
    };
    return proxy_loop($port, $rp, sub {
        my ($s, $buf, $p, $close, $from_redis) = @_;
        my ($mode, $arg, $gen) = mode();
        if (!$from_redis) {
            syswrite($p, $buf);
            sleep 0.005 if $mode eq 'slow';
            return;
        }
        if ($mode eq 'cut') {
            # bytes counted per connection from the moment of the mode
            $sent{$s} = 0 if ($seen{$s} // '') ne $gen;
            $seen{$s} = $gen;
            if ($sent{$s} + length($buf) > $arg) {
                syswrite($p, substr($buf, 0, $arg - $sent{$s}));
                trickle('pass');
                $close->($s);
                return;
            }
            $sent{$s} += length $buf;
            syswrite($p, $buf);
        } elsif ($mode eq 'split') {
            my $i = 0;
            while (length $buf) {
                my $piece = substr($buf, 0, 1 + int(rand($arg)), '');
                syswrite($p, $piece);
                sleep 0.001 if $arg > 100 || ++$i % 8 == 0;
            }
        } else {
            syswrite($p, $buf);
        }
    }, $read_size);
}

# proxy_loop(listen port, redis port, on_data, read_size) -> pid of a
# forked proxy that connects each accepted connection to Redis and calls
# on_data(socket, bytes, peer, close, from_redis) for what either side
# sent (at most read_size(from_redis) bytes, default 64 KB);
# close->(socket) closes both sides
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
