package Held;

# An upstream that the test itself holds: a listening socket in the test's
# own process.  take() accepts the request nginx sends it and reads its
# head; answer() sends the response when the test says so.  A test that
# needs "the upstream is still running while X happens" does X between the
# two, so the race is forced instead of hoped for (a sleeping backend loses
# it on a busy machine: a slot migration can take longer than the sleep).
#
#   my $h = Held->new($port);
#   ... send a request whose upstream is 127.0.0.1:$port ...
#   my $c = $h->take or die;      # nginx claimed the key and proxied it
#   ... migrate the slot, fail over, kill subscribers ...
#   $h->answer($c, $body);        # now the response (and the store) go

use strict;
use warnings;
use IO::Socket::INET;
use IO::Select;
use Time::HiRes qw(time);

sub new {
    my ($class, $port) = @_;
    my $l = IO::Socket::INET->new(LocalAddr => "127.0.0.1:$port",
                                  Listen => 16, ReuseAddr => 1)
        or die "Held: cannot listen on $port: $!";
    return bless { l => $l, port => $port }, $class;
}

sub port { $_[0]{port} }

# take([seconds]) -> the connection of the next request, its head read, or
# undef when none came in time (60 s: room for a busy machine)
sub take {
    my ($self, $secs) = @_;
    my $deadline = time + ($secs // 60);
    my $sel = IO::Select->new($self->{l});
    $sel->can_read($deadline - time) or return undef;
    my $c = $self->{l}->accept or return undef;
    my $head = '';
    my $cs = IO::Select->new($c);
    while ($head !~ /\r\n\r\n/ && time < $deadline) {
        $cs->can_read($deadline - time) or last;
        sysread($c, my $buf, 65536) or last;
        $head .= $buf;
    }
    return undef unless $head =~ /\r\n\r\n/;
    ${*$c}{held_head} = $head;
    return $c;
}

# head(connection) -> the request head that take() read
sub head { ${*{$_[1]}}{held_head} }

# answer(connection, body[, status]): the response, then the connection
# closed
sub answer {
    my ($self, $c, $body, $status) = @_;
    $status //= 200;
    my $res = "HTTP/1.1 $status X\r\nContent-Type: text/plain\r\n"
        . "Content-Length: " . length($body) . "\r\n"
        . "Connection: close\r\n\r\n$body";
    # blocking: nginx buffers what its client does not read yet
    $c->blocking(1);
    while (length $res) {
        my $n = syswrite($c, $res);
        last unless $n;
        substr($res, 0, $n, '');
    }
    close $c;
}

1;
