# The README's minimal nginx.conf passes `nginx -t` exactly as written (the
# module path aside), and the module prints nothing about it: an explicit
# Redis address and the default lock outliving proxy_read_timeout.
use strict;
use warnings;
use lib 't/lib';
use Test::More;
use Fleet;
use File::Temp qw(tempdir);

my ($module) = grep { /idempotency/ }
               split /\s+/, ($ENV{TEST_NGINX_LOAD_MODULES} || '');
plan skip_all => 'TEST_NGINX_LOAD_MODULES must name the module'
    unless $module;

open my $fh, '<', 'README.md' or die "README.md: $!";
my $readme = do { local $/; <$fh> };
close $fh;

my ($conf) = $readme =~ /```nginx\n(load_module [^\n]+\n.*?)```/s;
ok(defined $conf, "README has a complete nginx.conf") or BAIL_OUT('no conf');

like($conf, qr{^load_module /usr/lib/nginx/modules/ngx_http_idempotency_module\.so;$}m,
     "it loads the module by the absolute path of Debian's layout");
$conf =~ s{^load_module \S+;$}{load_module $module;}m;
$conf = ($> == 0 ? "user root;\n" : '') . "pid nginx.pid;\nerror_log stderr;\n"
        . $conf;
# port 80 needs root and may be taken: nginx -t does not bind anyway

my $dir = tempdir(CLEANUP => 1);
mkdir "$dir/logs";
open my $out, '>', "$dir/nginx.conf" or die $!;
print $out $conf;
close $out;

my $bin = $ENV{TEST_NGINX_BINARY} || 'nginx';
my $res = `$bin -t -p $dir/ -c $dir/nginx.conf 2>&1`;
my $rc = $? >> 8;
is($rc, 0, "nginx -t accepts it") or diag $res;
like($res, qr/test is successful/, "nginx says the test is successful");
unlike(own_warnings($res), qr/idempotency|\[warn\]|\[emerg\]/,
       "and nothing is printed about the module") or diag $res;

done_testing();
