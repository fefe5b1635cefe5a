package Test::Nginx::Socket;

# A small stand-in for CPAN's Test::Nginx::Socket, for systems where that
# distribution is not packaged (e.g. Debian).  It understands the same
# Test::Base style .t files (the common subset of sections and functions)
# and produces the same test names and, for passing blocks, the same number
# of tests, so `plan tests => ...` computations stay valid under both.
# See t/compat/README.md for what is and is not supported.

use strict;
use warnings;

# Test::Base gives us the __DATA__ block parser, the filters (eval, chomp, ...),
# --- ONLY / --- SKIP / --- LAST, blocks(), plan() and `use ... 'no_plan'`.
# (-base sets up inheritance without Spiffy's source filter.)
use Test::Base -base;

use Carp ();
use Test::LongString ();
use HTTP::Response ();
use IO::Socket::INET ();
use POSIX qw(:sys_wait_h EAGAIN EWOULDBLOCK EINTR);
use Time::HiRes qw(sleep time);
use File::Path qw(make_path remove_tree);
use File::Spec ();
use List::Util qw(shuffle max);

our $VERSION = '0.01';

our @EXPORT = qw(
    run_tests run_test repeat_each no_shuffle no_long_string log_level
    master_on master_off master_process_enabled workers worker_connections
    no_root_location add_block_preprocessor env_to_nginx config_preamble
    server_port server_port_for_client server_addr server_name server_root
    html_dir timeout is_str bail_out add_cleanup_handler
    add_test_cleanup_handler add_response_body_check check_accum_error_log
    use_hup no_nginx_manager
);

# ---------------------------------------------------------------------------
# Settings (environment first, then the exported setter functions)
# ---------------------------------------------------------------------------

our $NginxBinary = $ENV{TEST_NGINX_BINARY} || find_nginx();
our $ServerAddr  = '127.0.0.1';
our $ServerName  = 'localhost';
our $ServerPort  = $ENV{TEST_NGINX_SERVER_PORT} || $ENV{TEST_NGINX_PORT} || 1984;
our $ServerPortForClient = $ENV{TEST_NGINX_CLIENT_PORT} || $ServerPort;
our $ServRoot    = $ENV{TEST_NGINX_SERVROOT} || File::Spec->rel2abs('t/servroot');
our $Timeout     = $ENV{TEST_NGINX_TIMEOUT} || 3;
our $LogLevel    = $ENV{TEST_NGINX_LOG_LEVEL} || 'debug';
our $MasterProcessEnabled = $ENV{TEST_NGINX_MASTER_PROCESS} || 'off';
our $NoShuffle   = $ENV{TEST_NGINX_NO_SHUFFLE} || 0;
our $UseValgrind = $ENV{TEST_NGINX_USE_VALGRIND};
our $LoadModules = $ENV{TEST_NGINX_LOAD_MODULES};
our $SleepTime   = $ENV{TEST_NGINX_SLEEP} || 0.015;
our $Workers     = 1;
our $WorkerConnections = 64;
our $RepeatEach  = 1;
our $NoRootLocation = 0;
our $ConfigPreamble = '';
our ($NoLongString, $CheckAccumErrLog);
our (@EnvToNginx, @BlockPreprocessors, @CleanupHandlers, @TestCleanupHandlers,
     @ResponseBodyChecks);

# runtime state
our ($NginxVersion, $NginxV, $PrevConfig, $PrevBlock, $ChildPid);
our $ErrLogPos = 0;
our $NginxStarted = 0;          # did this process ever start nginx?
our %RandPorts;
my $MainPid = $$;

$ENV{TEST_NGINX_SERVER_ROOT} = $ServRoot;

# Real Test::Nginx code often refers to these as $Test::Nginx::Util::Foo.
{
    no strict 'refs';
    for my $v (qw(ServerPort ServerPortForClient ServRoot ServerAddr ServerName
                  NginxBinary RepeatEach NoLongString NginxVersion)) {
        *{"Test::Nginx::Util::$v"} = \${"Test::Nginx::Socket::$v"};
    }
}

sub find_nginx {
    for my $dir (split(/:/, $ENV{PATH} || ''), '/usr/sbin', '/usr/local/sbin') {
        return "$dir/nginx" if $dir ne '' && -f "$dir/nginx" && -x _;
    }
    return 'nginx';
}

# getter/setter helpers (same names and behaviour as the real ones)
sub repeat_each (@)            { $RepeatEach = shift if @_; $RepeatEach }
sub workers (@)                { $Workers = shift if @_; $Workers }
sub worker_connections (@)     { $WorkerConnections = shift if @_; $WorkerConnections }
sub log_level (@)              { $LogLevel = shift if @_; $LogLevel }
sub timeout (@)                { $Timeout = shift if @_; $Timeout }
sub server_port (@)            { $ServerPort = shift if @_; $ServerPort }
sub server_port_for_client (@) { $ServerPortForClient = shift if @_; $ServerPortForClient }
sub server_addr (@)            { $ServerAddr = shift if @_; $ServerAddr }
sub server_name (@)            { $ServerName = shift if @_; $ServerName }
sub master_process_enabled (@) { $MasterProcessEnabled = (shift() ? 'on' : 'off') if @_;
                                 $MasterProcessEnabled }
sub master_on ()               { $MasterProcessEnabled = 'on' }
sub master_off ()              { $MasterProcessEnabled = 'off' }
sub no_shuffle ()              { $NoShuffle = 1 }
sub no_long_string ()          { $NoLongString = 1 }
sub no_root_location ()        { $NoRootLocation = 1 }
sub check_accum_error_log ()   { $CheckAccumErrLog = 1 }
sub config_preamble ($)        { $ConfigPreamble = shift }
sub server_root ()             { $ServRoot }
sub html_dir ()                { "$ServRoot/html" }
sub add_block_preprocessor (&) { unshift @BlockPreprocessors, shift }
sub add_cleanup_handler ($)    { unshift @CleanupHandlers, shift }
sub add_test_cleanup_handler ($) { unshift @TestCleanupHandlers, shift }
sub add_response_body_check ($)  { push @ResponseBodyChecks, shift }
sub use_hup ()         { warn "WARNING: use_hup() is not supported by the compat Test::Nginx; ignored\n" }
sub no_nginx_manager () { warn "WARNING: no_nginx_manager() is not supported by the compat Test::Nginx; ignored\n" }

sub env_to_nginx (@) {
    Carp::croak("env_to_nginx: no arguments specified") unless @_;
    for my $v (@_) {
        Carp::croak("env_to_nginx: bad argument value: $v\n")
            if $v !~ /^[A-Za-z_]/ || $v =~ /\n/;
        push @EnvToNginx, $v;
    }
}

# paths inside the server root
sub log_dir ()  { "$ServRoot/logs" }
sub err_log ()  { "$ServRoot/logs/error.log" }
sub pid_file () { "$ServRoot/logs/nginx.pid" }
sub conf_file () { "$ServRoot/conf/nginx.conf" }

sub bail_out (@) {
    cleanup();
    Test::More::BAIL_OUT(join '', @_);
}

sub is_str (@) {
    my ($got, $expected, $desc) = @_;
    return like($got, $expected, $desc) if ref $expected && ref $expected eq 'Regexp';
    return is($got, $expected, $desc) if $NoLongString;   # Test::Base's is (diffs)
    return Test::LongString::is_string($got, $expected, $desc);
}

# "1.5", "1.5s", "500ms" -> seconds
sub parse_time ($) {
    my $t = shift;
    return undef unless defined $t;
    $t =~ s/^\s+|\s+$//g;
    return $1 / 1000 if $t =~ /^([\d.]+)ms$/;
    $t =~ s/s$//;
    return $t;
}

sub fmt_str ($) {
    my $s = shift;
    chomp $s;
    $s =~ s/"/\\"/g; $s =~ s/\r/\\r/g; $s =~ s/\n/\\n/g;
    return $s;
}

# Replace $TEST_NGINX_FOO by the environment value (random ports on demand).
sub expand_env ($$) {
    my ($text, $name) = @_;
    return $text if !defined $text || ref $text;
    $text =~ s{\$(TEST_NGINX_[_A-Z0-9]+)}{
        my $var = $1;
        if ($var =~ /^TEST_NGINX_RAND_PORT_\d+$/) {
            $RandPorts{$var} //= rand_port();
        } else {
            defined $ENV{$var} or bail_out("$name - No environment $var defined.\n");
            $ENV{$var};
        }
    }ge;
    return $text;
}

sub port_free ($) {
    my $port = shift;
    my $s = IO::Socket::INET->new(LocalAddr => $ServerAddr, LocalPort => $port,
                                  Proto => 'tcp', Listen => 1, ReuseAddr => 1);
    return 0 unless $s;
    close $s;
    return 1;
}

sub rand_port () {
    my %used = ($ServerPort => 1, map { $_ => 1 } values %RandPorts);
    for (1 .. 1000) {
        my $p = 1988 + int rand 60000;
        return $p if !$used{$p} && port_free($p);
    }
    bail_out("Cannot find a free port for TEST_NGINX_RAND_PORT_*\n");
}

# ---------------------------------------------------------------------------
# nginx process management
# ---------------------------------------------------------------------------

# The nginx version is the one of the "nginx version:" line, as the real
# Test::Nginx::Util reads it: the first "nginx.../X.Y.Z" (or "openresty"),
# else the first "word/X.Y.Z".  Angie and Tengine print a line of their own
# before it ("Angie version: Angie/1.12.1"), which is not the nginx version
# their skip_nginx specs compare with; freenginx's is "nginx version:
# freenginx/1.29.7".
sub parse_nginx_version ($) {
    my $out = shift;
    return sprintf "%d.%03d%03d", $1, $2, $3
        if $out =~ m{(?:nginx|openresty)[^/]*/(\d+)\.(\d+)\.(\d+)}s
        || $out =~ m{\w+/(\d+)\.(\d+)\.(\d+)}s;
    return undef;
}

sub nginx_version () {
    return $NginxVersion if defined $NginxVersion;
    $NginxV = `$NginxBinary -V 2>&1`;
    $NginxVersion = parse_nginx_version($NginxV // '') if $? == 0;
    defined $NginxVersion
        or bail_out("Failed to run \"$NginxBinary -V\" (set TEST_NGINX_BINARY?): "
                    . ($NginxV // ''));
    return $NginxVersion;
}

# Alive and not a zombie (daemonized nginx may be reparented to a PID 1
# that never reaps).
sub pid_alive ($) {
    my $pid = shift;
    return 0 unless $pid;
    waitpid($pid, WNOHANG) if $ChildPid && $pid == $ChildPid;
    return 0 unless kill 0, $pid;
    if (open my $fh, '<', "/proc/$pid/stat") {
        my $stat = <$fh> // '';
        close $fh;
        return 0 if $stat =~ /^\d+ \(.*\) [ZX] /s;
    }
    return 1;
}

sub read_pid () {
    open my $fh, '<', pid_file() or return undef;
    my $pid = <$fh>;
    close $fh;
    return (defined $pid && $pid =~ /(\d+)/) ? $1 : undef;
}

sub nginx_running () {
    my $pid = read_pid() // $ChildPid;
    return undef unless pid_alive($pid);
    # a stale pid file may name an unrelated process by now
    if (open my $fh, '<', "/proc/$pid/cmdline") {
        my $cmd = do { local $/; <$fh> } // '';
        close $fh;
        my ($bin) = $NginxBinary =~ m{([^/]+)$};
        return undef if $cmd !~ /nginx/ && index($cmd, $bin) < 0;
    }
    return $pid;
}

# Stop the running nginx (QUIT, or TERM with TEST_NGINX_FAST_SHUTDOWN),
# wait for it to exit and for the port to become free.
sub stop_nginx ($) {
    my $name = shift;
    my $pid = nginx_running();
    if ($pid) {
        kill($ENV{TEST_NGINX_FAST_SHUTDOWN} ? 'TERM' : 'QUIT', $pid);
        my $deadline = time + ($UseValgrind ? max($Timeout, 30) : max($Timeout, 3));
        sleep 0.01 while pid_alive($pid) && time < $deadline;
        if (pid_alive($pid)) {
            warn "$name - timeout when waiting for nginx ($pid) to exit; killing it\n";
            my $grp = $ChildPid && $pid == $ChildPid && getpgrp($pid) == $pid;
            kill 'KILL', $grp ? -$pid : $pid;
            $deadline = time + 3;
            sleep 0.01 while pid_alive($pid) && time < $deadline;
        }
    }
    if ($ChildPid) {
        kill 'KILL', $ChildPid if pid_alive($ChildPid);
        waitpid($ChildPid, 0);
        undef $ChildPid;
    }
    unlink pid_file();
    my $deadline = time + 3;
    sleep 0.02 while !port_free($ServerPort) && time < $deadline;
}

sub setup_servroot () {
    # only remove what we create ourselves, in case TEST_NGINX_SERVROOT is
    # pointed somewhere unexpected
    if (-d $ServRoot) {
        remove_tree("$ServRoot/conf", "$ServRoot/logs", "$ServRoot/html",
                    "$ServRoot/cache", glob("$ServRoot/*_temp"),
                    glob("$ServRoot/*_cache"));
    }
    make_path($ServRoot, log_dir(), html_dir(), "$ServRoot/conf");
    -d "$ServRoot/conf" or bail_out("Failed to create $ServRoot/conf: $!\n");
    write_file(html_dir() . "/index.html",
        '<html><head><title>It works!</title></head><body>It works!</body></html>');
}

sub write_file ($$) {
    my ($path, $data) = @_;
    if ($path =~ m{^(.*)/} && !-d $1) {
        make_path($1) or bail_out("Cannot create directory $1\n");
    }
    open my $out, '>', $path or bail_out("Can't open $path for writing: $!\n");
    binmode $out;
    print $out $data;
    close $out;
}

# --- user_files: ">>> name" lines followed by the file body (or an array of
# [name, body] with eval).
sub write_user_files ($) {
    my $block = shift;
    my $files = $block->user_files;
    return unless defined $files;
    if (!ref $files) {
        my @list;
        for my $line (split /^/, $files) {
            if ($line =~ /^>>> (\S+)/) { push @list, [$1, ''] }
            elsif (@list)              { $list[-1][1] .= $line }
        }
        $files = \@list;
    }
    for my $f (@$files) {
        my ($fname, $body) = @$f;
        my $path = $fname =~ m{^/} ? $fname : html_dir() . "/$fname";
        write_file($path, expand_env($body // '', $block->name));
    }
}

sub write_conf ($$) {
    my ($block, $config) = @_;
    my $name = $block->name;
    my $http_config = expand_env($block->http_config // '', $name);
    my $main_config = expand_env($block->main_config // '', $name);
    my $post_main_config = expand_env($block->post_main_config // '', $name);
    my $daemon = $UseValgrind ? 'off' : 'on';
    my $err_log = err_log();
    my $pid = pid_file();

    my $conf = "worker_processes $Workers;\ndaemon $daemon;\n"
             . "master_process $MasterProcessEnabled;\n"
             . "error_log $err_log $LogLevel;\npid $pid;\n";
    $conf .= "user root;\n" if $> == 0;    # workers must be able to use servroot
    for my $v (@EnvToNginx) {
        $conf .= "env " . ($v =~ /\s/ ? "'$v'" : $v) . ";\n";
    }
    for my $m (grep { length } split /\s+/, $LoadModules // '') {
        $conf .= "load_module " . File::Spec->rel2abs($m) . ";\n";
    }

    # temp paths inside the server root so any user can run the tests
    my $temps = '';
    for my $t (qw(client_body proxy fastcgi scgi uwsgi)) {
        next if $http_config =~ /\b${t}_temp_path\b/;
        next if $t ne 'client_body' && $t ne 'proxy'
                && ($NginxV // '') =~ /--without-http_${t}_module/;
        $temps .= "    ${t}_temp_path $ServRoot/${t}_temp;\n";
    }

    my $root_loc = $NoRootLocation ? '' : <<"_EOC_";
        location / {
            root $ServRoot/html;
            index index.html index.htm;
        }
_EOC_

    $conf .= <<"_EOC_";

$main_config

events {
    accept_mutex off;
    worker_connections $WorkerConnections;
}

http {
    access_log $ServRoot/logs/access.log;
$temps
    default_type text/plain;
    keepalive_timeout 68;

$http_config

    server {
        listen $ServerPort;
        server_name '$ServerName';
        client_max_body_size 30M;

$ConfigPreamble

        # test case config
$config
        # end of test case config

$root_loc    }
}

$post_main_config
_EOC_
    write_file(conf_file(), $conf);
}

sub tail_error_log ($) {
    my $n = shift;
    open my $in, '<', err_log() or return '';
    my @lines = <$in>;
    close $in;
    splice @lines, 0, @lines - $n if @lines > $n;
    return join '', @lines;
}

# "... in /path/nginx.conf:36" -> that line of the generated config
sub conf_excerpt ($) {
    my $err = shift;
    return '' unless $err =~ /nginx\.conf:(\d+)/;
    my $n = $1;
    open my $in, '<', conf_file() or return '';
    my @lines = <$in>;
    close $in;
    return $n <= @lines ? "nginx.conf line $n: $lines[$n - 1]" : '';
}

# Start nginx for a block; returns true on success, reports a failed test
# (with the error log excerpt) otherwise.
sub start_nginx ($) {
    my $name = shift;
    my @cmd = ($NginxBinary, '-p', "$ServRoot/", '-c', conf_file());
    push @cmd, '-e', err_log() if nginx_version() >= 1.019005;
    my $errfile = log_dir() . "/startup.stderr";
    $NginxStarted = 1;

    if ($UseValgrind) {
        my @vg = ('valgrind', '-q');
        if ($UseValgrind =~ /^\d+$/) {
            push @vg, qw(--tool=memcheck --leak-check=full --show-possibly-lost=no
                         --keep-debuginfo=yes --num-callers=100 --gen-suppressions=all);
            push @vg, '--suppressions=valgrind.suppress' if -f 'valgrind.suppress';
        } else {
            push @vg, split ' ', $UseValgrind;
        }
        warn "$name\n";
        my $pid = fork // bail_out("fork() failed: $!");
        if (!$pid) {
            setpgrp(0, 0);
            open STDIN, '<', '/dev/null';
            open STDOUT, '>', '/dev/null';
            open STDERR, '>>', err_log();    # valgrind reports go to error.log
            exec @vg, @cmd or POSIX::_exit(127);
        }
        $ChildPid = $pid;
        my $deadline = time + max($Timeout, 30);
        while (time < $deadline) {
            return 1 if !port_free($ServerPort);
            if (waitpid($pid, WNOHANG) == $pid) {
                undef $ChildPid;
                last;
            }
            sleep 0.05;
        }
        fail("$name - failed to start nginx under valgrind");
        diag("error.log tail:\n" . tail_error_log(20));
        stop_nginx($name);
        return 0;
    }

    for my $try (1 .. 10) {
        my $pid = fork // bail_out("fork() failed: $!");
        if (!$pid) {
            open STDIN, '<', '/dev/null';
            open STDOUT, '>', '/dev/null';
            open STDERR, '>', $errfile;
            exec @cmd or POSIX::_exit(127);
        }
        waitpid($pid, 0);
        my $status = $?;
        if ($status == 0) {
            # the daemon writes its pid file right after forking
            my $deadline = time + 3;
            sleep 0.005 while !read_pid() && time < $deadline;
            return 1;
        }
        my $err = do { local $/; open my $in, '<', $errfile; <$in> } // '';
        if ($err =~ /Address already in use/ && $try < 10) {
            warn "$name - port $ServerPort busy, retrying nginx start\n";
            sleep 0.3 * $try;
            next;
        }
        fail("$name - failed to start nginx");
        diag("command: @cmd\nexit status: " . ($status >> 8) . "\n$err"
             . "error.log tail:\n" . tail_error_log(20) . conf_excerpt($err));
        return 0;
    }
}

# valgrind writes its reports (lines starting with ==PID==) into error.log
sub check_valgrind ($) {
    my $name = shift;
    return unless $UseValgrind;
    open my $in, '<', err_log() or return;
    my @errs = grep { /^==\d+==/ && !/^==\d+== Warning: / } <$in>;
    close $in;
    return unless @errs;
    fail("$name - valgrind reported errors");
    diag(join '', @errs);
}

# ---------------------------------------------------------------------------
# Building requests
# ---------------------------------------------------------------------------

# --- more_headers text -> ("Key: value\r\n"..., is_chunked)
sub parse_more_headers ($) {
    my $in = shift // '';
    my ($out, $chunked) = ('', 0);
    for my $line (split /\n+/, $in) {
        $line =~ s/\r$//;
        next if $line =~ /^\s*(?:#|$)/;
        my ($key, $val) = split /:\s*/, $line, 2;
        $val //= '';
        $chunked = 1 if lc $key eq 'transfer-encoding' && $val eq 'chunked';
        $out .= "$key: $val\r\n";
    }
    return ($out, $chunked);
}

# Turn a "METHOD /uri [HTTP/1.x]\nbody" spec (possibly split into packets)
# into a full HTTP request; returns the list of packets to send.
sub build_request ($$$$) {
    my ($name, $packets, $more, $conn) = @_;
    my @vals = map { ref $_ ? $_->{value} : $_ } @$packets;
    my $raw = join '', map { $_ // '' } @vals;

    $raw =~ /\A([^\n]*)(\n?)/;
    my ($line, $nl) = ($1, $2);
    my $lead = $line =~ /^(\s*)/ ? length $1 : 0;
    my @tok = split ' ', $line;
    bail_out("$name - Request line should be non-empty") unless @tok;
    bail_out("$name - Request line is not valid. Should be 'meth [url [version]]' "
             . "but got \"$line\".") if @tok > 3;
    my ($meth, $uri, $ver) = @tok;
    $uri //= '/';
    $ver //= 'HTTP/1.1';

    my $content = substr $raw, length($line) + length($nl);
    my ($hdrs, $chunked) = parse_more_headers($more);
    my ($len_hdr, $trimmed) = ('', 0);
    if (!$chunked && $content ne '' && $hdrs !~ /(?:^|\n)Content-Length:/i) {
        $trimmed = $content =~ /^(\s*)/ ? length $1 : 0;
        $content =~ s/^\s+|\s+$//gs;
        $len_hdr = "Content-Length: " . length($content) . "\r\n";
    }
    my $req_line = "$meth $uri $ver";
    my $head = "$req_line\r\n";
    $head .= "Host: $ServerName\r\n" if $hdrs !~ /(?:^|\n)Host:/i;
    $head .= "Connection: $conn\r\n" if $hdrs !~ /(?:^|\n)Connection/i;
    $head .= "$hdrs$len_hdr\r\n";
    my $full = $head . $content;

    return [{ value => $full }] if @$packets <= 1;

    # Re-split at (approximately) the same places as the original packets:
    # a cut inside the request line stays there, a cut inside the body stays
    # at the same body offset, everything else lands between head and body.
    my (@cuts, $pos);
    $pos = 0;
    for my $i (0 .. $#vals - 1) {
        $pos += length($vals[$i] // '');
        my $cut;
        if ($pos <= length $line) {
            $cut = $pos - $lead;
            $cut = 0 if $cut < 0;
            $cut = length $req_line if $cut > length $req_line;
        } else {
            my $c = $pos - length($line) - length($nl) - $trimmed;
            $c = 0 if $c < 0;
            $c = length $content if $c > length $content;
            $cut = length($head) + $c;
        }
        $cut = $cuts[-1] if @cuts && $cut < $cuts[-1];
        push @cuts, $cut;
    }
    my @out;
    my $prev = 0;
    push @cuts, length $full;
    for my $i (0 .. $#cuts) {
        my %pkt = ref $packets->[$i] ? %{ $packets->[$i] } : ();
        $pkt{value} = substr $full, $prev, $cuts[$i] - $prev;
        push @out, \%pkt;
        $prev = $cuts[$i];
    }
    return \@out;
}

sub is_head_req ($) { my $r = shift // ''; $r =~ /^\s*HEAD\s/ ? 1 : 0 }

# A block's requests: a list of connections, each { packets => [...],
# heads => [is-HEAD flag per expected response] }.
sub block_requests ($) {
    my $block = shift;
    my $name = $block->name;

    my $raw = $block->raw_request;
    if (defined $raw) {
        my @pk = ref $raw eq 'ARRAY' ? @$raw : ($raw);
        return [{ packets => [map { ref $_ ? $_ : { value => $_ } } @pk],
                  heads => [is_head_req(join '', map { ref $_ ? $_->{value} : $_ } @pk)] }];
    }

    my $more = $block->more_headers // '';
    my $hdr = sub {
        my $i = shift;
        return $more unless ref $more eq 'ARRAY';
        defined $more->[$i]
            or bail_out("$name - --- more_headers lacks data for request $i");
        return $more->[$i];
    };

    my $pl = $block->pipelined_requests;
    if (defined $pl) {
        bail_out("$name - invalid entries in --- pipelined_requests")
            unless ref $pl eq 'ARRAY';
        my ($data, @heads) = ('');
        for my $i (0 .. $#$pl) {
            my $r = expand_env($pl->[$i], $name);
            my $conn = $i == $#$pl ? 'close' : 'keep-alive';
            $data .= build_request($name, [$r], $hdr->(0 + $i), $conn)->[0]{value};
            push @heads, is_head_req($r);
        }
        return [{ packets => [{ value => $data }], heads => \@heads }];
    }

    my $req = $block->request;
    bail_out("$name - no --- request, --- raw_request or --- pipelined_requests")
        unless defined $req;
    if (!ref $req) {
        1 while $req =~ s/^\s*\#[^\n]+\s+|^\s+//gs;    # leading comments
        return [{ packets => build_request($name, [$req], $hdr->(0), 'close'),
                  heads => [is_head_req($req)] }];
    }
    bail_out("$name - invalid --- request: MUST be string or array of requests")
        unless ref $req eq 'ARRAY';
    my @conns;
    for my $i (0 .. $#$req) {
        my $one = $req->[$i];
        my $pk = ref $one eq 'ARRAY' ? $one : [$one];
        my $first = ref $pk->[0] ? $pk->[0]{value} : $pk->[0];
        push @conns, { packets => build_request($name, $pk, $hdr->($i), 'close'),
                       heads => [is_head_req($first)] };
    }
    return \@conns;
}

# ---------------------------------------------------------------------------
# The HTTP client: send the packets, read until the server closes
# ---------------------------------------------------------------------------

sub connect_server ($$) {
    my ($name, $timeout) = @_;
    my $deadline = time + ($UseValgrind ? max($Timeout, 30) : 5);
    while (1) {
        my $sock = IO::Socket::INET->new(PeerAddr => $ServerAddr,
                                         PeerPort => $ServerPortForClient,
                                         Proto => 'tcp', Timeout => $timeout);
        return $sock if $sock;
        my $err = $!;
        if (time >= $deadline || ($ChildPid && !pid_alive($ChildPid))) {
            fail("$name - Can't connect to $ServerAddr:$ServerPortForClient: $err (aborted)\n");
            return undef;
        }
        sleep 0.05;
    }
}

# Returns the raw response bytes ('' / undef on failure).  The timeout is an
# inactivity timeout, like the real one's.
sub send_request ($$$) {
    my ($block, $packets, $timeout) = @_;
    my $name = $block->name;
    my $sock = connect_server($name, $timeout) or return undef;
    $sock->blocking(0);
    local $SIG{PIPE} = 'IGNORE';

    my @queue = @$packets;
    my $delay = $block->raw_request_middle_delay;
    my $cur = shift @queue;
    my ($buf, $off, $writing, $resp) = ($cur->{value} // '', 0, 1, '');
    my $fd = fileno $sock;

    while (1) {
        if ($writing && $off >= length $buf) {
            if (!@queue) {
                $writing = 0;
                if (defined(my $how = $block->shutdown)) {
                    shutdown($sock, $how =~ /^\s*(\d)/ ? $1 : 1);
                }
            } else {
                $cur = shift @queue;
                my $wait = $cur->{delay_before} // $delay;
                sleep $wait if $wait;
                ($buf, $off) = ($cur->{value} // '', 0);
                next;
            }
        }
        my ($rin, $win) = ('', '');
        vec($rin, $fd, 1) = 1;
        vec($win, $fd, 1) = 1 if $writing;
        my $nfound = select(my $rout = $rin, my $wout = $win, undef, $timeout);
        if ($nfound < 0) {
            next if $! == EINTR;
            warn "WARNING: $name - select() failed: $!\n";
            last;
        }
        if ($nfound == 0) {
            if (!defined $block->abort) {
                fail("ERROR: client socket timed out - $name\n");
            }
            last;
        }
        if ($writing && vec($wout, $fd, 1)) {
            my $n = syswrite $sock, $buf, length($buf) - $off, $off;
            if (defined $n) {
                $off += $n;
            } elsif ($! != EAGAIN && $! != EWOULDBLOCK && $! != EINTR) {
                warn "WARNING: $name - write failed: $!\n";
                $writing = 0;
            }
        }
        if (vec($rout, $fd, 1)) {
            my $n = sysread $sock, my $chunk, 65536;
            if (!defined $n) {
                next if $! == EAGAIN || $! == EWOULDBLOCK || $! == EINTR;
                warn "WARNING: $name - HTTP response read failure: $!\n";
                last;
            }
            last if $n == 0;    # server closed the connection
            $resp .= $chunk;
        }
    }
    close $sock;
    return $resp;
}

# ---------------------------------------------------------------------------
# Parsing responses
# ---------------------------------------------------------------------------

# Returns ($res, $raw_headers, $left).  $res is an HTTP::Response whose body is
# de-chunked; $left holds bytes after this response (pipelining).
sub parse_response ($$$) {
    my ($name, $raw, $head_req) = @_;
    $raw //= '';
    my ($raw_headers, $rest) = ('', '');
    if ($raw =~ /\A(.*?\r?\n)\r?\n/s) {
        $raw_headers = $1;
        $rest = substr $raw, $+[0];
    } else {
        $raw_headers = $raw;
    }
    my @lines = split /\r?\n/, $raw_headers;
    my $status = shift(@lines) // '';
    my ($proto, $code, $msg) = $status =~ m{^(HTTP/[\d.]+)\s+(\d+)(?:\s+(.*))?$};
    my @hdrs;
    for my $l (@lines) {
        if ($l =~ /^[ \t]+(.*)/ && @hdrs) { $hdrs[-1] .= " $1"; next }
        my ($k, $v) = $l =~ /^([^:\s]+)\s*:\s*(.*?)\s*$/ or next;
        push @hdrs, $k, $v;
    }
    my $res = HTTP::Response->new($code, $msg, \@hdrs);
    $res->protocol($proto) if $proto;
    return ($res, $raw_headers, undef) if !defined $code;

    my $left;
    my $te  = $res->header('Transfer-Encoding');
    my $len = $res->header('Content-Length');
    if ($code == 101) {
        $res->content($rest);
    } elsif ($head_req || $code == 204 || $code == 304 || $code < 200) {
        $left = $rest;    # no body
    } elsif (defined $te && $te =~ /\bchunked\b/i) {
        my ($body, $pos) = ('', 0);
        while (1) {
            pos($rest) = $pos;
            if ($rest !~ /\G[ \t]*([0-9A-Fa-f]+)[^\r\n]*\r\n/gc) {
                fail("$name - invalid chunked body received: "
                     . fmt_str(substr $rest, $pos, 80));
                return (undef, $raw_headers, undef);
            }
            my $size = hex $1;
            $pos = pos $rest;
            if ($size == 0) {
                # skip trailers up to the empty line
                pos($rest) = $pos;
                if ($rest !~ /\G(?:[^\r\n]+\r\n)*\r\n/gc) {
                    fail("$name - no last chunk found - " . fmt_str($rest));
                    return (undef, $raw_headers, undef);
                }
                $left = substr $rest, pos $rest;
                last;
            }
            if (length($rest) < $pos + $size + 2
                || substr($rest, $pos + $size, 2) ne "\r\n")
            {
                fail("$name - invalid chunked data received (truncated chunk or "
                     . "missing CRLF)");
                return (undef, $raw_headers, undef);
            }
            $body .= substr $rest, $pos, $size;
            $pos += $size + 2;
        }
        $res->content($body);
    } elsif (defined $len && $len =~ /^\s*(\d+)/) {
        $len = $1;
        if (length $rest < $len) {
            warn "WARNING: $name - response body truncated: $len expected, but got ",
                 length $rest, "\n";
            $res->content($rest);
        } else {
            $res->content(substr $rest, 0, $len);
            $left = substr $rest, $len;
        }
    } else {
        $res->content($rest);    # read until close
    }
    return ($res, $raw_headers, $left);
}

# ---------------------------------------------------------------------------
# Checks (test names follow the real Test::Nginx::Socket)
# ---------------------------------------------------------------------------

sub indexed ($$$$) {
    my ($name, $value, $idx, $need_array) = @_;
    if (ref $value && ref $value eq 'ARRAY') {
        return $value->[$idx];
    }
    bail_out("$name - You asked for many requests, the expected results should "
             . "be arrays as well.") if $need_array;
    return $value;
}

sub check_error_code ($$$$) {
    my ($block, $res, $idx, $need_array) = @_;
    my $name = $block->name;
    my $code = ($res && $res->code) || '';
    if (defined $block->error_code_like) {
        my $pat = indexed($name, $block->error_code_like, $idx, $need_array);
        like($code, qr/$pat/sm, "$name - status code ok");
    } elsif (defined $block->error_code) {
        is($code, indexed($name, $block->error_code, $idx, $need_array),
           "$name - status code ok");
    } else {
        is($code, 200, "$name - status code ok");
    }
}

# "Name: value" / "!Name" lines -> list of [name, value-or-undef]
sub parse_header_spec ($) {
    my $s = shift // '';
    my (@order, %seen);
    for my $line (split /\n/, $s) {
        $line =~ s/^\s+|\s+$//g;
        next if $line eq '';
        my ($k, $v);
        if ($line =~ s/^!\s*//) { $k = $line }
        else { ($k, $v) = split /\s*:\s*/, $line, 2; $v //= '' }
        push @order, $k unless exists $seen{$k};
        $seen{$k} = $v;
    }
    return map { [$_, $seen{$_}] } @order;
}

sub check_response_headers ($$$$$) {
    my ($block, $res, $raw_headers, $idx, $need_array) = @_;
    my $name = $block->name;
    $raw_headers //= '';
    for my $sec (qw(raw_response_headers_like raw_response_headers_unlike)) {
        next unless defined $block->$sec;
        my $pat = indexed($name, $block->$sec, $idx, $need_array);
        $sec =~ /unlike/
            ? unlike($raw_headers, qr/$pat/s, "$name - raw resp headers unlike")
            : like($raw_headers, qr/$pat/s, "$name - raw resp headers like");
    }
    if (defined $block->response_headers) {
        my $spec = indexed($name, $block->response_headers, $idx, $need_array);
        for my $h (parse_header_spec($spec)) {
            my ($key, $val) = @$h;
            if (!defined $val) {
                unlike($raw_headers, qr/^\s*\Q$key\E\s*:/msi,
                       "$name - header $key not present in the raw headers");
                next;
            }
            $val =~ s/\$ServerPort\b/$ServerPort/g;
            $val =~ s/\$ServerPortForClient\b/$ServerPortForClient/g;
            my $got = $res ? $res->header($key) : undef;
            is($got // '', $val, "$name - header $key ok");
        }
    } elsif (defined $block->response_headers_like) {
        my $spec = indexed($name, $block->response_headers_like, $idx, $need_array);
        for my $h (parse_header_spec($spec)) {
            my ($key, $val) = @$h;
            my $got = $res ? $res->header($key) : undef;
            like($got // '', qr/^$val$/, "$name - header $key like ok");
        }
    }
}

sub check_response_body ($$$$$) {
    my ($block, $res, $idx, $rep, $need_array) = @_;
    my $name = $block->name;
    my $content = $res ? $res->content : undef;

    if (defined $block->response_body) {
        my $expected = indexed($name, $block->response_body, $idx, $need_array);
        if (defined $expected && !ref $expected) {
            $expected =~ s/\$ServerPort\b/$ServerPort/g;
            $expected =~ s/\$ServerPortForClient\b/$ServerPortForClient/g;
            $expected = expand_env($expected, $name);
        }
        my $desc = "$name - response_body - response is expected "
                 . "(repeated req $rep, req $idx)";
        if (ref $expected) {
            like($content, $expected,
                 "$name - response_body - like (repeated req $rep, req $idx)");
        } elsif ($NoLongString) {
            is($content, $expected, $desc);
        } else {
            Test::LongString::is_string($content, $expected, $desc);
        }
    } elsif (defined $block->response_body_like || defined $block->response_body_unlike) {
        my $type = defined $block->response_body_like ? 'like' : 'unlike';
        my $sec = "response_body_$type";
        my $pat = indexed($name, $block->$sec, $idx, $need_array);
        $pat =~ s/\$ServerPort\b/$ServerPort/g;
        $pat =~ s/\$ServerPortForClient\b/$ServerPortForClient/g;
        my $summary = $content // '';
        $summary =~ s/^\s+|\s+$//g;
        $summary =~ s/\s+/ /g;
        my $desc = "$name - response_body_$type - response is expected ($summary)";
        $type eq 'like' ? like($content, qr/$pat/s, $desc)
                        : unlike($content, qr/$pat/s, $desc);
    }

    $_->($block, $content, $idx, $rep, 0) for @ResponseBodyChecks;
}

# New error.log lines since the last read (all lines with check_accum_error_log)
sub error_log_data () {
    sleep $SleepTime * 3;    # let nginx finish logging (log phase etc.)
    open my $in, '<', err_log() or return [];
    seek $in, $ErrLogPos, 0 if $ErrLogPos > 0 && !$CheckAccumErrLog;
    my @lines = <$in>;
    $ErrLogPos = tell $in unless $CheckAccumErrLog;
    close $in;
    return \@lines;
}

# string (one pattern per line) | qr// | array of strings / qr//
sub pattern_list ($) {
    my $pats = shift;
    if (!ref $pats) {
        chomp $pats;
        return grep { length } split /\n+/, $pats;
    }
    return ($pats) if ref $pats eq 'Regexp';
    return @$pats;
}

sub line_matches ($$) {
    my ($line, $pat) = @_;
    return ref $pat ? $line =~ $pat : index($line, $pat) >= 0;
}

# error_log / no_error_log style checks against the lines of $file
# ("error.log" or "access.log"); $suffix is e.g. " (req 0)"
sub check_log_patterns ($$$$$$) {
    my ($name, $file, $lines, $want, $dont, $suffix) = @_;
    for my $pat (defined $want ? pattern_list($want) : ()) {
        next unless defined $pat;
        if (grep { line_matches($_, $pat) } @$lines) {
            pass("$name - pattern \"$pat\" matches a line in $file$suffix");
        } else {
            fail("$name - pattern \"$pat\" should match a line in $file$suffix");
        }
    }
    for my $pat (defined $dont ? pattern_list($dont) : ()) {
        next unless defined $pat;
        my $p = fmt_str($pat);
        my ($hit) = grep { line_matches($_, $pat) } @$lines;
        if (defined $hit) {
            fail("$name - pattern \"$p\" should not match any line in $file "
                 . "but matches line \"" . fmt_str($hit) . "\"$suffix");
        } else {
            pass("$name - pattern \"$p\" does not match a line in $file$suffix");
        }
    }
}

# --- access_log / --- no_access_log (the whole access.log, like the real one)
sub check_access_log ($$) {
    my ($block, $rep) = @_;
    return unless defined $block->access_log || defined $block->no_access_log;
    sleep $SleepTime * 3;
    my @lines;
    if (open my $in, '<', "$ServRoot/logs/access.log") {
        @lines = <$in>;
        close $in;
    }
    check_log_patterns($block->name, 'access.log', \@lines, $block->access_log,
                       $block->no_access_log, " (req $rep)");
}

sub check_error_log ($$) {
    my ($block, $rep) = @_;
    my $name = $block->name;
    my $lines;

    my $grep = $block->grep_error_log;
    $grep = $grep->[$rep] if ref $grep eq 'ARRAY';
    if (defined $grep) {
        my $expected = $block->grep_error_log_out;
        bail_out("$name - No --- grep_error_log_out defined but --- grep_error_log is defined")
            unless defined $expected;
        $expected = $expected->[$rep] if ref $expected eq 'ARRAY';
        $expected = expand_env($expected, $name);
        $lines ||= error_log_data();
        my $out = '';
        for my $line (@$lines) {
            if (ref $grep ? $line =~ $grep : $line =~ /\Q$grep\E/) {
                $out .= "$&\n" if $& !~ /\n/;
            }
        }
        if (ref $expected eq 'Regexp') {
            like($out, $expected, "$name - grep_error_log_out (req $rep)");
        } else {
            is_str($out, $expected, "$name - grep_error_log_out (req $rep)");
        }
    } elsif (defined $block->grep_error_log_out) {
        bail_out("$name - No --- grep_error_log defined but --- grep_error_log_out is defined");
    }

    if (defined $block->error_log || defined $block->no_error_log) {
        $lines ||= error_log_data();
        check_log_patterns($name, 'error.log', $lines, $block->error_log,
                           $block->no_error_log, " (req $rep)");
    }

    # like the real one: warn about alert/crit/emerg lines nobody asked about,
    # and fail on assertion failures
    $lines ||= error_log_data();
    my $asked = join "\n", map { defined $_ ? (ref $_ eq 'ARRAY' ? @$_ : "$_") : () }
                               $block->error_log, $block->no_error_log;
    for my $line (@$lines) {
        for my $lvl (qw(alert crit emerg)) {
            warn "WARNING: $name - " . fmt_str($line) . "\n"
                if $line =~ /\[$lvl\]/ && index($asked, "[$lvl") < 0;
        }
        if ($line =~ /\bAssertion .*?failed\b/) {
            chomp(my $l = $line);
            fail("$name - $l\n");
        }
    }
}

# --- shutdown_error_log / --- no_shutdown_error_log, after nginx has exited
sub check_shutdown_error_log ($$) {
    my ($block, $dry_run) = @_;
    return unless defined $block->shutdown_error_log
               || defined $block->no_shutdown_error_log;
    my $name = $block->name;
    if ($dry_run) {
        my $n = 0;
        $n += () = pattern_list($_)
            for grep { defined } $block->shutdown_error_log, $block->no_shutdown_error_log;
        SKIP: { skip("$name - shutdown_error_log - tests skipped due to $dry_run", $n) }
        return;
    }
    check_log_patterns($name, 'error.log', error_log_data(),
                       $block->shutdown_error_log, $block->no_shutdown_error_log, '');
}

# ---------------------------------------------------------------------------
# Running blocks
# ---------------------------------------------------------------------------

sub version_cmp ($$) {
    my ($op, $ver) = @_;
    my $v = nginx_version();
    return $op eq '<' ? $v < $ver : $op eq '<=' ? $v <= $ver
         : $op eq '>' ? $v > $ver : $v >= $ver;
}

# --- skip_nginx "N: < 1.2.3[: reason]" / --- skip_eval "N: perl code"
sub skip_spec ($) {
    my $block = shift;
    my $name = $block->name;
    if (defined(my $s = $block->skip_nginx)) {
        my ($n, $op, @v, $reason);
        ($n, $op, @v[0 .. 2], $reason) = $s =~
            /^\s*(\d+)\s*:\s*([<>]=?)\s*(\d+)\.(\d+)\.(\d+)(?:\s*:\s*(.*?))?\s*$/
            or bail_out("$name - Invalid --- skip_nginx spec: $s");
        return ($n, $reason || "nginx version $op " . join('.', @v))
            if version_cmp($op, sprintf "%d.%03d%03d", @v);
    }
    if (defined(my $s = $block->skip_eval)) {
        $s =~ /^\s*(\d+)\s*:\s*(.*)/s or bail_out("$name - Invalid --- skip_eval spec: $s");
        my ($n, $code) = ($1, $2);
        my $skip = eval $code;
        bail_out("$name - skip_eval - failed to eval the Perl code \"$code\": $@") if $@;
        return ($n, 'skip_eval') if $skip;
    }
    return;
}

# One round of requests for a block (called repeat_each times).
sub run_requests ($$) {
    my ($block, $rep) = @_;
    my $name = $block->name;
    my $conns = block_requests($block);
    my $timeout = parse_time($block->timeout) // $Timeout;
    my $pl = $block->pipelined_requests;
    my $need_array = $pl ? 1 : @$conns > 1;
    my $total = $pl ? scalar @$pl : scalar @$conns;
    my $idx = 0;

    for my $conn (@$conns) {
        my $raw = send_request($block, $conn->{packets}, $timeout);
        my $nresp = scalar @{ $conn->{heads} };
        for my $k (0 .. $nresp - 1) {
            if (!defined $block->ignore_response) {
                my ($res, $raw_headers, $left) =
                    parse_response($name, $raw, $conn->{heads}[$k]);
                if ($k == $nresp - 1 && defined $left && length $left) {
                    warn "WARNING: $name - unexpected extra bytes after last chunk "
                         . "in response: \"" . fmt_str($left) . "\"\n";
                }
                $raw = $left;
                check_error_code($block, $res, $idx, $need_array);
                check_response_headers($block, $res, $raw_headers, $idx, $need_array);
                check_response_body($block, $res, $idx, $rep, $need_array);
            }
            # the real one also checks the log between multiple responses
            if ($idx < $total - 1) {
                sleep $block->wait if $block->wait;
                check_error_log($block, $rep);
                check_access_log($block, $rep) unless defined $block->ignore_response;
            }
            $idx++;
        }
    }
    sleep $block->wait if $block->wait;
    check_error_log($block, $rep);
    check_access_log($block, $rep) unless defined $block->ignore_response;
}

# Sections of the real Test::Nginx::Socket that this one does not implement;
# a block using them fails rather than passing without checking anything.
our @Unsupported = qw(
    http2 http3 http09 curl_error curl_protocol curl_options
    response_body_filters response_body_json_sort response_body_eval
    request_eval error_log_file server_addr_for_client must_die reload_fails
    todo todo_nginx skip_nginx2 skip_openssl skip_slave
    stap stap_out stap_out_like stap_out_unlike
    tcp_listen tcp_reply tcp_query tcp_query_len tcp_shutdown tcp_no_close
    udp_listen udp_reply udp_query
);

sub run_test ($) {
    my $block = shift;
    my $name = $block->name;
    %RandPorts = ();

    if (my @bad = grep { defined $block->$_ } @Unsupported) {
        fail("$name - section(s) not supported by the compat Test::Nginx::Socket: "
             . join ', ', map { "--- $_" } @bad);
        return;
    }
    local $LogLevel = $block->log_level || $LogLevel;

    if (my ($n, $reason) = skip_spec($block)) {
        for (1 .. $RepeatEach) {
            SKIP: { skip("$name - $reason", $n) }
        }
        return;
    }

    my $config = $block->config;
    if (defined $config) {
        $config = expand_env($config, $name);
        stop_nginx($name);
        check_shutdown_error_log($PrevBlock, 0) if $PrevBlock;
        undef $PrevBlock;
        setup_servroot();
        if (defined(my $code = $block->post_setup_server_root)) {
            eval $code;
            bail_out("$name - post_setup_server_root failed: $@") if $@;
        }
        write_user_files($block);
        write_conf($block, $config);
        $PrevConfig = $config;
        $ErrLogPos = 0;
        return unless start_nginx($name);
    } elsif (!defined $PrevConfig) {
        bail_out("$name - No '--- config' section specified and could not get previous one.");
    }

    if (defined(my $init = $block->init)) {
        eval $init;
        bail_out("$name - init failed: $@") if $@;
    }

    $ErrLogPos = 0;
    for my $rep (0 .. $RepeatEach - 1) {
        write_user_files($block) if $rep > 0;
        run_requests($block, $rep);
    }
    $PrevBlock = $block;

    if ($UseValgrind) {    # valgrind reports leaks on exit: stop after each block
        stop_nginx($name);
        check_valgrind($name);
    }
}

sub run_tests () {
    nginx_version();
    $ENV{TEST_NGINX_SERVER_PORT} //= $ServerPort;

    my @blocks = blocks();
    if (!@blocks) {
        fail("$0 - no test blocks found (nothing to run)");
        return;
    }
    @blocks = shuffle @blocks unless $NoShuffle;

    for my $block (@blocks) {
        $_->($block) for @BlockPreprocessors;
        $block->set_value(name => "$0 " . $block->name);
        run_test($block);
        $_->($block) for @TestCleanupHandlers;
    }
}

sub cleanup () {
    $_->() for @CleanupHandlers;
    @CleanupHandlers = ();
}

END {
    if ($$ == $MainPid && $NginxStarted) {
        local $?;
        cleanup();
        if (!$ENV{TEST_NGINX_NO_CLEAN} || $UseValgrind) {
            stop_nginx('END');
            check_shutdown_error_log($PrevBlock, 0) if $PrevBlock;
        } elsif ($PrevBlock) {
            check_shutdown_error_log($PrevBlock, 'TEST_NGINX_NO_CLEAN');
        }
    }
}

1;
