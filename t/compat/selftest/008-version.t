# The nginx version that skip_nginx compares with is the one of the
# "nginx version:" line of -V, as the real Test::Nginx reads it, whatever
# the server prints before it: Angie and Tengine print their own version
# first ("Angie version: Angie/1.12.1"), freenginx names itself in that
# line.  Each case runs a tiny .t file in a child perl (same implementation
# as this run) with TEST_NGINX_BINARY set to a wrapper that prints that
# server's -V and runs the real nginx for everything else; blocks below,
# above and at the expected version show which version was read.
use strict;
use warnings;
use Test::More;
use File::Temp qw(tempdir);
use File::Spec;
use IO::Socket::INET;
use IPC::Run ();

my ($lib) = grep { !ref && -f "$_/Test/Nginx/Socket.pm" } @INC;
BAIL_OUT("Test/Nginx/Socket.pm not found in \@INC") unless $lib;
$lib = File::Spec->rel2abs($lib);

my $nginx = $ENV{TEST_NGINX_BINARY} || '/usr/sbin/nginx';
my $tmp = tempdir(CLEANUP => 1);
my $port = do {
    my $s = IO::Socket::INET->new(LocalAddr => '127.0.0.1', LocalPort => 0,
                                  Listen => 1, ReuseAddr => 1) or die $!;
    $s->sockport;
};

my @cases = (
    [ 'Angie', '1.31.2', "Angie version: Angie/1.12.1\n"
      . "nginx version: nginx/1.31.2\nbuilt by gcc 12.2.0 (Debian 12.2.0-14)\n" ],
    [ 'Tengine', '1.31.3', "Tengine version: Tengine/3.2.0\n"
      . "nginx version: nginx/1.31.3\nbuilt by gcc 12.2.0 (Debian 12.2.0-14)\n" ],
    [ 'freenginx', '1.29.7', "nginx version: freenginx/1.29.7\n"
      . "built by gcc 12.2.0 (Debian 12.2.0-14)\n" ],
    [ 'nginx', '1.22.1', "nginx version: nginx/1.22.1\n"
      . "built with OpenSSL 3.0.2 15 Mar 2022\n" ],
);

plan tests => 2 * @cases;

my $n = 0;
for my $case (@cases) {
    my ($server, $v, $dash_v) = @$case;
    $n++;

    my $bin = "$tmp/server$n";
    open my $fh, '>', "$bin.V" or die "$bin.V: $!";
    print $fh $dash_v;
    close $fh;
    open $fh, '>', $bin or die "$bin: $!";
    print $fh "#!/bin/sh\n[ \"\$1\" = -V ] && exec cat $bin.V >&2\n"
              . "exec $nginx \"\$@\"\n";
    close $fh;
    chmod 0755, $bin;

    my $block = '';
    for my $t ([1, '<', 'below'], [2, '>', 'above'], [3, '>=', 'at']) {
        $block .= <<_EOC_;
=== TEST $t->[0]: skipped $t->[2] $v
--- skip_nginx: 2: $t->[1] $v: $t->[2]
--- config
    location = /t {
        return 200 "hello\\n";
    }
--- request
GET /t
--- response_body
hello

_EOC_
    }

    my $file = "$tmp/case$n.t";
    open $fh, '>', $file or die "$file: $!";
    print $fh "use Test::Nginx::Socket 'no_plan';\nrun_tests();\n__DATA__\n\n$block";
    close $fh;

    local $ENV{TEST_NGINX_BINARY} = $bin;
    local $ENV{TEST_NGINX_SERVER_PORT} = $port;
    local $ENV{TEST_NGINX_SERVROOT} = "$tmp/servroot";
    delete local $ENV{TEST_NGINX_USE_VALGRIND};
    delete local $ENV{TEST_NGINX_NO_CLEAN};
    my $output = '';
    IPC::Run::run([$^X, "-I$lib", $file], \undef, '>&', \$output,
                  IPC::Run::timeout(120));

    ok($? == 0 && $output !~ /^not ok/m, "$server: the blocks pass")
        or diag $output;
    # only the block at the version is skipped: it was read exactly
    my @skipped = $output =~ /^ok \d+ # skip .* - (\w+)$/mg;
    is("@skipped", 'at at', "$server: the nginx version read is $v")
        or diag $output;
}
