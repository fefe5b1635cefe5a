# Failures must be reported.  Each case below is a tiny .t file run in a
# child perl (with the same Test::Nginx::Socket implementation as this run,
# on its own port and server root); we check that the broken ones fail with
# the expected "not ok"/bail-out message and that the correct one passes.
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

my $tmp = tempdir(CLEANUP => 1);
my $port = do {
    my $s = IO::Socket::INET->new(LocalAddr => '127.0.0.1', LocalPort => 0,
                                  Listen => 1, ReuseAddr => 1) or die $!;
    $s->sockport;
};

my $simple = <<'_EOC_';
--- config
    location = /t {
        return 200 "hello\n";
    }
_EOC_

my @cases = (
    [ 'a correct block passes', 0, qr/^ok 1 .* status code ok/m, <<_EOC_ ],
=== TEST 1: good
$simple--- request
GET /t
--- response_body
hello
_EOC_

    [ 'wrong response body', 1, qr/^not ok \d+ .*response_body/m, <<_EOC_ ],
=== TEST 1: bad body
$simple--- request
GET /t
--- response_body
bye
_EOC_

    [ 'wrong status code', 1, qr/^not ok \d+ .*status code ok/m, <<_EOC_ ],
=== TEST 1: bad status
$simple--- request
GET /t
--- error_code: 404
_EOC_

    [ 'header that must be absent', 1,
      qr/^not ok \d+ .*header Content-Type not present/m, <<_EOC_ ],
=== TEST 1: bad header
$simple--- request
GET /t
--- response_headers
!Content-Type
_EOC_

    [ 'pattern found by no_error_log', 1,
      qr/^not ok \d+ .*should not match any line in error\.log/m, <<_EOC_ ],
=== TEST 1: unexpected error
$simple--- request
GET /missing.html
--- error_code: 404
--- no_error_log
[error]
_EOC_

    [ 'pattern missing for error_log', 1,
      qr/^not ok \d+ .*should match a line in error\.log/m, <<_EOC_ ],
=== TEST 1: missing log line
$simple--- request
GET /t
--- error_log
this line is never logged
_EOC_

    [ 'second pipelined response wrong', 1,
      qr/^not ok \d+ .*response_body .*req 1\)/m, <<_EOC_ ],
=== TEST 1: pipelined
$simple--- pipelined_requests eval
["GET /t", "GET /t"]
--- response_body eval
["hello\\n", "bye\\n"]
_EOC_

    [ 'client timeout without --- abort', 1,
      qr/^not ok \d+ .*client socket timed out/m, <<_EOC_ ],
=== TEST 1: keep-alive never closes
$simple--- raw_request eval
"GET /t HTTP/1.1\\r\\nHost: localhost\\r\\n\\r\\n"
--- timeout: 0.3
_EOC_

    [ 'no test blocks at all', 1, qr/./, '' ],

    [ 'nginx fails to start', 1,
      qr/failed to start nginx|Cannot start nginx/, <<_EOC_ ],
=== TEST 1: broken config
--- config
    no_such_directive_here on;
--- request
GET /t
_EOC_
);

plan tests => 2 * @cases;

my $n = 0;
for my $case (@cases) {
    my ($desc, $want_fail, $pat, $blocks) = @$case;
    my $file = "$tmp/case" . ++$n . ".t";
    open my $out, '>', $file or die "$file: $!";
    print $out "use Test::Nginx::Socket 'no_plan';\nrun_tests();\n__DATA__\n\n$blocks";
    close $out;

    local $ENV{TEST_NGINX_SERVER_PORT} = $port;
    local $ENV{TEST_NGINX_SERVROOT} = "$tmp/servroot";
    local $ENV{TEST_NGINX_TIMEOUT} = 1;
    delete local $ENV{TEST_NGINX_USE_VALGRIND};
    delete local $ENV{TEST_NGINX_NO_CLEAN};
    my $output = '';
    IPC::Run::run([$^X, "-I$lib", $file], \undef, '>&', \$output,
                  IPC::Run::timeout(120));
    # what prove looks at: the exit status and "not ok" lines (the real
    # Test::Nginx sets no_ending on a client timeout, so the exit status
    # alone is not enough there)
    my $failed = $? != 0 || $output =~ /^not ok/m || $output =~ /^Bail out!/m;

    is($failed ? 1 : 0, $want_fail, "$desc: reported as "
       . ($want_fail ? "failure" : "success")) or diag $output;
    like($output, $pat, "$desc: expected output") or diag $output;
}
