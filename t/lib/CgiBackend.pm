package CgiBackend;

# Pure-Perl FastCGI, uwsgi and SCGI backends for t/009-handlers.t (SPEC
# §2.9: the module must behave the same in front of every content
# handler).  Each protocol gets one forked process on a fixed 127.0.0.1
# port that serves connections one after the other and counts what it
# executes, so a test can prove that a replay never reached it.
#
# Any request answers 201 with X-Exec and Set-Cookie carrying the counter
# and a JSON body describing what arrived (length and SHA-256 of the body),
# except a GET of a path ending in /count, which answers 200 with the
# counter and does not count.  Only core Perl modules are used.

use strict;
use warnings;
use IO::Socket::INET;
use IO::Select;
use Digest::SHA qw(sha256_hex);
use POSIX ();
use Exporter 'import';

our @EXPORT_OK = qw(start stop reply_body);

# private ports, also exported to nginx.conf as $TEST_NGINX_<PROTO>_PORT
our %PORT = (fastcgi => 19870, uwsgi => 19871, scgi => 19872);

my $IDLE = 10;          # seconds a silent client may hold the server

my %child;              # proto => pid, in the process that forked them
my $starter;            # that process

my %serve = (fastcgi => \&serve_fastcgi, uwsgi => \&serve_uwsgi,
             scgi => \&serve_scgi);

$ENV{'TEST_NGINX_' . uc($_) . '_PORT'} = $PORT{$_} for keys %PORT;

start();

sub start {
    return if %child;
    $starter = $$;
    for my $proto (sort keys %PORT) {
        # listen before forking: the port is ready when start() returns
        my $listener = IO::Socket::INET->new(
            LocalAddr => '127.0.0.1', LocalPort => $PORT{$proto},
            Proto => 'tcp', Listen => 16, ReuseAddr => 1)
            or die "CgiBackend: cannot listen on $PORT{$proto}: $!\n";
        my $pid = fork // die "CgiBackend: fork: $!\n";
        if ($pid == 0) {
            # keep prove's TAP pipe free of us; warnings still go to stderr
            open STDOUT, '>', '/dev/null';
            server_loop($proto, $listener, $starter);
            POSIX::_exit(0);    # never run the test's END blocks here
        }
        close $listener;
        $child{$proto} = $pid;
    }
}

sub stop {
    return unless defined $starter && $$ == $starter;
    kill 'TERM', values %child;
    waitpid $_, 0 for values %child;
    %child = ();
}

END {
    local $?;           # keep the test's exit status
    stop();
}

# The JSON a backend answers with; the tests build their expectations
# with it from the bytes they send.
sub reply_body {
    my ($proto, $exec, $method, $uri, $body) = @_;
    (my $u = $uri) =~ s/(["\\])/\\$1/g;
    return sprintf '{"proto":"%s","exec":%d,"method":"%s","uri":"%s",'
        . '"len":%d,"sha":"%s"}', $proto, $exec, $method, $u,
        length $body, sha256_hex($body);
}

sub server_loop {
    my ($proto, $listener, $parent) = @_;
    $SIG{PIPE} = 'IGNORE';      # a client gone early is an EPIPE, not death
    $SIG{TERM} = sub { POSIX::_exit(0) };
    my $state = { proto => $proto, exec => 0 };
    my $sel = IO::Select->new($listener);
    while (getppid() == $parent) {      # an orphan stops by itself
        next unless $sel->can_read(1);
        my $conn = $listener->accept or next;
        binmode $conn;
        # a broken client only loses its own connection
        my $ok = eval { $serve{$proto}->(CgiBackend::Conn->new($conn), $state); 1 };
        warn "CgiBackend $proto: $@" unless $ok || $@ =~ /^eof\n/;
        close $conn;
    }
}

# What a request does, whatever the protocol: (status, headers, body).
sub handle {
    my ($state, $env, $body) = @_;
    my $method = $env->{REQUEST_METHOD} // '';
    my $uri = $env->{REQUEST_URI} // '';
    (my $path = $uri) =~ s/\?.*//s;

    if ($method eq 'GET' && $path =~ m{/count\z}) {
        return ('200 OK', ['Content-Type: text/plain'], "$state->{exec}\n");
    }

    my $n = ++$state->{exec};
    return ('201 Created',
            ['Content-Type: application/json', "X-Exec: $n",
             "Set-Cookie: s=$n"],
            reply_body($state->{proto}, $n, $method, $uri, $body));
}

sub cgi_response {
    my ($status_line, $status, $headers, $body) = @_;
    return join '', $status_line ? "HTTP/1.1 $status\r\n" : "Status: $status\r\n",
        map({ "$_\r\n" } @$headers), "\r\n", $body;
}

sub body_of {
    my ($conn, $env) = @_;
    my $len = $env->{CONTENT_LENGTH};
    return $conn->read_exact(defined $len && $len =~ /^\d+\z/ ? $len : 0);
}

# SCGI: "<len>:" netstring of NUL-separated pairs, ",", then the body.
sub serve_scgi {
    my ($conn, $state) = @_;
    my $len = $conn->read_until(':');
    die "bad netstring length\n" unless $len =~ /^(\d{1,7}):\z/;
    my $vars = $conn->read_exact($1);
    die "netstring without ','\n" unless $conn->read_exact(1) eq ',';
    die "SCGI headers not NUL-terminated\n" unless $vars =~ s/\0\z//;
    my %env = split /\0/, $vars, -1;
    $conn->write(cgi_response(0, handle($state, \%env, body_of($conn, \%env))));
}

# uwsgi: modifier1, u16le size, modifier2, then u16le-prefixed key/value
# pairs and the body.  nginx accepts an HTTP status line, as uWSGI sends.
sub serve_uwsgi {
    my ($conn, $state) = @_;
    my (undef, $size) = unpack 'C v C', $conn->read_exact(4);
    my $vars = $conn->read_exact($size);
    my @kv;
    while (length $vars) {
        die "truncated uwsgi vars\n" if length $vars < 2;
        my $l = unpack 'v', substr($vars, 0, 2, '');
        die "truncated uwsgi vars\n" if length $vars < $l;
        push @kv, substr($vars, 0, $l, '');
    }
    die "odd uwsgi vars\n" if @kv % 2;
    my %env = @kv;
    $conn->write(cgi_response(1, handle($state, \%env, body_of($conn, \%env))));
}

# FastCGI responder: BEGIN_REQUEST, PARAMS and STDIN streams (each ended
# by an empty record), answered with STDOUT records, an empty STDOUT and
# END_REQUEST.  The connection is kept only if nginx asked (FCGI_KEEP_CONN).
use constant {
    FCGI_BEGIN_REQUEST => 1, FCGI_ABORT_REQUEST => 2, FCGI_END_REQUEST => 3,
    FCGI_PARAMS => 4, FCGI_STDIN => 5, FCGI_STDOUT => 6, FCGI_KEEP_CONN => 1,
};

sub serve_fastcgi {
    my ($conn, $state) = @_;
    while (1) {
        my ($id, $keep, $params, $stdin) = fcgi_read_request($conn);
        return unless defined $id;      # the client closed between requests
        my $out = cgi_response(0, handle($state, fcgi_params($params), $stdin));
        my $reply = '';
        # records hold at most 65535 bytes; nginx must reassemble them
        $reply .= fcgi_record(FCGI_STDOUT, $id, substr($out, 0, 8000, ''))
            while length $out;
        $reply .= fcgi_record(FCGI_STDOUT, $id, '')
            . fcgi_record(FCGI_END_REQUEST, $id, pack 'N C x3', 0, 0);
        $conn->write($reply);
        return unless $keep;
    }
}

sub fcgi_record {
    my ($type, $id, $content) = @_;
    my $pad = (8 - length($content) % 8) % 8;   # aligned, as real apps do
    return pack('C C n n C x', 1, $type, $id, length $content, $pad)
        . $content . "\0" x $pad;
}

# -> (request id, keep-conn flag, params stream, stdin stream), or () at EOF
sub fcgi_read_request {
    my $conn = shift;
    my ($id, $keep, %stream, %done);
    until ($done{+FCGI_PARAMS} && $done{+FCGI_STDIN}) {
        my $head = defined $id ? $conn->read_exact(8) : $conn->read_eof_ok(8);
        return () unless defined $head;
        my ($ver, $type, $rid, $len, $pad) = unpack 'C C n n C x', $head;
        die "FastCGI version $ver\n" unless $ver == 1;
        my $content = $conn->read_exact($len);
        $conn->read_exact($pad);
        if ($type == FCGI_BEGIN_REQUEST) {
            $id = $rid;
            $keep = (unpack 'n C', $content)[1] & FCGI_KEEP_CONN;
        } elsif (!defined $id || $rid != $id) {
            die "FastCGI record type $type before BEGIN_REQUEST\n";
        } elsif ($type == FCGI_ABORT_REQUEST) {
            die "eof\n";
        } elsif ($type == FCGI_PARAMS || $type == FCGI_STDIN) {
            $stream{$type} .= $content;
            $done{$type} = 1 if $len == 0;
        }
    }
    return ($id, $keep, $stream{+FCGI_PARAMS} // '', $stream{+FCGI_STDIN} // '');
}

# name-value pairs: lengths of 1 byte, or 4 bytes with the top bit set
sub fcgi_params {
    my $buf = shift;
    my ($pos, %env) = (0);
    my $length = sub {
        die "truncated FastCGI params\n" if $pos >= length $buf;
        my $l = ord substr $buf, $pos, 1;
        return ($pos += 1, $l)[1] if $l < 128;
        die "truncated FastCGI params\n" if $pos + 4 > length $buf;
        $l = unpack('N', substr $buf, $pos, 4) & 0x7fffffff;
        return ($pos += 4, $l)[1];
    };
    while ($pos < length $buf) {
        my ($kl, $vl) = ($length->(), $length->());
        die "truncated FastCGI params\n" if $pos + $kl + $vl > length $buf;
        my $k = substr $buf, $pos, $kl;
        $env{$k} = substr $buf, $pos + $kl, $vl;
        $pos += $kl + $vl;
    }
    return \%env;
}

# A connection with a read buffer: exact reads over short reads, with an
# idle timeout so a stuck client cannot block the next one for long.
package CgiBackend::Conn;

sub new { my ($class, $sock) = @_; bless { sock => $sock, buf => '' }, $class }

# 1 if more bytes arrived, 0 at EOF; dies on timeout or error
sub fill {
    my $self = shift;
    die "idle timeout\n"
        unless IO::Select->new($self->{sock})->can_read($IDLE);
    my $n = sysread $self->{sock}, $self->{buf}, 65536, length $self->{buf};
    die "read: $!\n" unless defined $n;
    return $n;
}

sub read_exact {
    my ($self, $len) = @_;
    while (length $self->{buf} < $len) {
        $self->fill or die "eof\n";
    }
    return substr $self->{buf}, 0, $len, '';
}

# like read_exact, but undef for an EOF before the first byte
sub read_eof_ok {
    my ($self, $len) = @_;
    return undef unless length $self->{buf} || $self->fill;
    return $self->read_exact($len);
}

sub read_until {
    my ($self, $char) = @_;
    my $i;
    until (($i = index $self->{buf}, $char) >= 0) {
        die "no '$char' in time\n" if length $self->{buf} > 64;
        $self->fill or die "eof\n";
    }
    return substr $self->{buf}, 0, $i + 1, '';
}

sub write {
    my ($self, $data) = @_;
    while (length $data) {
        my $n = syswrite $self->{sock}, $data;
        die "write: $!\n" unless defined $n;
        substr($data, 0, $n) = '';
    }
}

1;
