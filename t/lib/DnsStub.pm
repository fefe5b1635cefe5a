package DnsStub;

# A DNS responder for the tests that move a Redis name at run time: a
# forked child answering UDP queries on 127.0.0.1:PORT from a map file
# that it reads again for every query, so the test changes an answer with
# set() and the next query sees it. Core Perl only.
#
#   my $dns = DnsStub->start(port => 23253, dir => $dir, ttl => 1,
#                            names => { 'redis.test' => ['127.0.0.1'] });
#   $dns->set('redis.test' => ['127.0.0.2']);  # addresses (A, or AAAA
#                                              # for IPv6 ones)
#   $dns->set('redis.test' => undef);          # NXDOMAIN
#   $dns->set('redis.test' => 'servfail');     # SERVFAIL
#   $dns->set('redis.test' => 'drop');         # no answer at all
#   $dns->ttl(5);                              # the TTL of every answer
#   $dns->queries('redis.test', 'A');          # how many were asked
#   $dns->stop;
#
# A name in the map answers NOERROR with no records for the types it has
# no address of (nginx asks A and AAAA: an NXDOMAIN for AAAA would void
# the A answer); a name not in the map is NXDOMAIN.

use strict;
use warnings;
use IO::Socket::INET;
use IO::Select;
use Socket qw(inet_pton inet_ntop AF_INET AF_INET6);
use POSIX ();

my %TYPE = (A => 1, AAAA => 28);
my %NAME = reverse %TYPE;

sub start {
    my ($class, %o) = @_;
    my $port = $o{port} or die "DnsStub: port required";
    my $dir = $o{dir} || '/tmp';
    my $self = bless {
        port  => $port,
        file  => "$dir/dns-$port.map",
        log   => "$dir/dns-$port.log",
        ttl   => $o{ttl} // 1,
        names => {},
        owner => $$,
    }, $class;
    unlink $self->{log};
    $self->set(%{ $o{names} || {} });
    # bound before the fork: queries sent once start() returns are answered
    my $sock = IO::Socket::INET->new(Proto => 'udp', LocalAddr => '127.0.0.1',
                                     LocalPort => $port)
        or die "DnsStub: cannot bind 127.0.0.1:$port/udp: $!";
    my $pid = fork // die "DnsStub: fork: $!";
    if ($pid == 0) {
        $SIG{TERM} = sub { POSIX::_exit(0) };
        _serve($self, $sock);
        POSIX::_exit(0);
    }
    close $sock;
    $self->{pid} = $pid;
    return $self;
}

sub stop {
    my $self = shift;
    my $pid = delete $self->{pid} or return;
    return unless $$ == $self->{owner};
    kill 'TERM', $pid;
    waitpid $pid, 0;
}

sub DESTROY { $_[0]->stop }

sub port { $_[0]{port} }

# set(name => [addresses] | undef | 'servfail' | 'drop', ...)
sub set {
    my ($self, %names) = @_;
    while (my ($n, $v) = each %names) {
        $n = lc $n;
        $n =~ s/\.$//;
        if (defined $v) {
            $self->{names}{$n} = ref $v ? join(' ', @$v) : $v;
        } else {
            delete $self->{names}{$n};
        }
    }
    $self->_write;
}

sub ttl {
    my ($self, $ttl) = @_;
    $self->{ttl} = $ttl;
    $self->_write;
}

# queries(name [, type]): how many queries for the name (of that type)
sub queries {
    my ($self, $name, $type) = @_;
    open my $fh, '<', $self->{log} or return 0;
    my $n = 0;
    while (<$fh>) {
        my ($q, $t) = split;
        $n++ if $q eq lc $name && (!$type || $t eq $type);
    }
    return $n;
}

# written aside and renamed: the child never reads half a file
sub _write {
    my $self = shift;
    my $tmp = "$self->{file}.tmp";
    open my $fh, '>', $tmp or die "DnsStub: $tmp: $!";
    print $fh "ttl $self->{ttl}\n";
    print $fh "$_ $self->{names}{$_}\n" for sort keys %{ $self->{names} };
    close $fh;
    rename $tmp, $self->{file} or die "DnsStub: rename: $!";
}

sub _map {
    my $self = shift;
    my (%map, $ttl);
    open my $fh, '<', $self->{file} or return ({}, 0);
    while (<$fh>) {
        my ($k, @v) = split;
        next unless defined $k;
        if ($k eq 'ttl') { $ttl = $v[0]; next }
        $map{$k} = \@v;
    }
    return (\%map, $ttl // 0);
}

sub _serve {
    my ($self, $sock) = @_;
    my $sel = IO::Select->new($sock);
    while (1) {
        # a test killed without stop() must not leave us on the port
        return if getppid() != $self->{owner};
        next unless $sel->can_read(1);
        my $from = $sock->recv(my $q, 512) or next;
        my $r = $self->_answer($q);
        $sock->send($r, 0, $from) if defined $r;
    }
}

# _answer(query) -> the response packet, or undef to say nothing
sub _answer {
    my ($self, $q) = @_;
    return undef if length $q < 12;
    my ($id, $flags, $qd) = unpack 'n n n', $q;
    return undef if $flags & 0x8000;                  # a response
    my $rd = $flags & 0x0100;
    my $head = sub {
        my ($rcode, $an) = @_;
        return pack 'n n n n n n', $id, 0x8400 | $rd | $rcode,
                    $qd == 1 ? 1 : 0, $an, 0, 0;
    };
    return $head->(4, 0) if ($flags >> 11) & 0xf;     # NOTIMP: not QUERY
    return $head->(1, 0) if $qd != 1;                 # FORMERR

    my ($pos, @labels) = (12);
    while (1) {
        return $head->(1, 0) if $pos >= length $q;
        my $len = ord substr $q, $pos, 1;
        $pos++;
        last if $len == 0;
        # a query carries no compression pointers
        return $head->(1, 0) if $len > 63 || $pos + $len > length $q;
        push @labels, substr $q, $pos, $len;
        $pos += $len;
    }
    return $head->(1, 0) if $pos + 4 > length $q;
    my ($type, $class) = unpack 'n n', substr $q, $pos, 4;
    my $question = substr $q, 12, $pos + 4 - 12;
    my $name = lc join '.', @labels;

    if (open my $log, '>>', $self->{log}) {
        print $log "$name ", $NAME{$type} // $type, "\n";
        close $log;
    }

    my ($map, $ttl) = $self->_map;
    my $v = $map->{$name};
    my $head_q = sub { $head->(@_) . $question };
    return $head_q->(3, 0) unless $v;                 # NXDOMAIN
    return undef if $v->[0] eq 'drop';
    return $head_q->(2, 0) if $v->[0] eq 'servfail';

    my @rr;
    for my $a (@$v) {
        my $six = $a =~ /:/;
        next unless $class == 1 && $type == ($six ? 28 : 1);
        my $rdata = inet_pton($six ? AF_INET6 : AF_INET, $a) // next;
        # the owner name points to the question's (offset 12)
        push @rr, pack('n n n N n', 0xc00c, $type, 1, $ttl, length $rdata)
                  . $rdata;
    }
    return $head_q->(0, scalar @rr) . join '', @rr;
}

# query(port, name [, type [, timeout]]) -> { rcode, addrs => [...],
# ttl } or undef without an answer: the test's own client
sub query {
    my ($port, $name, $type, $timeout) = @_;
    $type = $TYPE{$type // 'A'} // die "DnsStub: type $type";
    my $id = int rand 65536;
    my $q = pack('n n n n n n', $id, 0x0100, 1, 0, 0, 0)
            . join('', map { chr(length) . $_ } split /\./, $name)
            . "\0" . pack('n n', $type, 1);
    my $s = IO::Socket::INET->new(Proto => 'udp',
                                  PeerAddr => "127.0.0.1:$port")
        or die "DnsStub: socket: $!";
    $s->send($q);
    return undef unless IO::Select->new($s)->can_read($timeout // 2);
    $s->recv(my $r, 4096) // return undef;
    return undef if length $r < 12;
    my ($rid, $flags, $qd, $an) = unpack 'n n n n', $r;
    return undef if $rid != $id || !($flags & 0x8000);
    my $pos = 12;
    my $skip_name = sub {
        while ($pos < length $r) {
            my $len = ord substr $r, $pos, 1;
            if ($len >= 0xc0) { $pos += 2; return }
            $pos += 1 + $len;
            return if $len == 0;
        }
    };
    for (1 .. $qd) { $skip_name->(); $pos += 4 }
    my %res = (rcode => $flags & 0xf, addrs => [], ttl => undef);
    for (1 .. $an) {
        $skip_name->();
        last if $pos + 10 > length $r;
        my ($t, $c, $ttl, $len) = unpack 'n n N n', substr $r, $pos, 10;
        $pos += 10;
        my $rdata = substr $r, $pos, $len;
        $pos += $len;
        next unless $t == $type;
        push @{ $res{addrs} },
             inet_ntop($t == 28 ? AF_INET6 : AF_INET, $rdata);
        $res{ttl} = $ttl;
    }
    return \%res;
}

1;
