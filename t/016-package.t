# Packaging and release (the version, make install, make deb).
# Plain Test::More:
# - the version is written once (src/ngx_http_idempotency_version.h) and
#   CHANGELOG.md and debian/changelog agree with it; the module logs it at
#   notice when nginx loads it;
# - make install DESTDIR=... PREFIX=... (and MODULES_DIR=...) puts a
#   loadable module and the docs where it says;
# - as root on Debian with dpkg-buildpackage: util/deb-test.sh builds the
#   package, installs it with apt-get, runs nginx -t on the stock layout,
#   smoke-tests the installed module (POST, replay, 422) on a private nginx,
#   purges it and checks nothing is left. It refuses (skips) when the
#   package or its files were on the machine before it started.
use strict;
use warnings;
use lib 't/lib';
use Test::More;
use File::Temp qw(tempdir);
use Cwd qw(abs_path);

my $top = abs_path('.');
my ($module) = $ENV{TEST_NGINX_MODULE}
    || grep { /idempotency/ }
       split /\s+/, ($ENV{TEST_NGINX_LOAD_MODULES} || '');
my $nginx = $ENV{TEST_NGINX_BINARY} || 'nginx';

sub slurp { local (@ARGV, $/) = @_; return <> // '' }

# nginx -t of a configuration that loads $so; returns (exit code, output)
sub nginx_t {
    my $so = shift;
    my $dir = tempdir(CLEANUP => 1);
    mkdir "$dir/logs";
    open my $fh, '>', "$dir/nginx.conf" or die $!;
    print $fh "load_module $so;\nerror_log stderr notice;\n"
            . "pid $dir/logs/nginx.pid;\nevents {}\n";
    close $fh;
    my $out = `$nginx -p $dir/ -c $dir/nginx.conf -t 2>&1`;
    return ($? >> 8, $out);
}

# ---- one version

my $version = `./util/version-check.sh 2>&1`;
is($?, 0, 'header, CHANGELOG.md and debian/changelog name one version')
    or diag $version;
chomp $version;
like($version, qr/^\d+\.\d+\.\d+$/, "it looks like a version: $version");

my ($hdr) = slurp('src/ngx_http_idempotency_version.h')
    =~ /^#define NGX_HTTP_IDEMPOTENCY_VERSION\s+"([^"]+)"/m;
is(`make -s --no-print-directory version-check`, "$hdr\n",
   'make version-check prints the header\'s version');

SKIP: {
    skip 'TEST_NGINX_MODULE is not set', 1 unless $module && -f $module;
    my ($rc, $out) = nginx_t($module);
    like($out, qr/\[notice\] .*idempotency\ module\ \Q$version\E
                  \ \(hiredis\ \d+\.\d+\.\d+,\ OpenSSL\ \d/x,
         'nginx -t logs "idempotency module <version> (hiredis, OpenSSL)"');
}

# ---- make install

SKIP: {
    skip 'TEST_NGINX_MODULE is not set', 9 unless $module && -f $module;

    my $dest = tempdir(CLEANUP => 1);
    # -o: install what the suite tests, do not rebuild it
    my $make = "make -s --no-print-directory install MODULE=$module -o $module";
    my $out = `$make DESTDIR=$dest PREFIX=/opt/idem 2>&1`;
    is($?, 0, 'make install DESTDIR=... PREFIX=/opt/idem') or diag $out;

    my $so = "$dest/opt/idem/lib/nginx/modules/ngx_http_idempotency_module.so";
    ok(-f $so, '  the .so in $(PREFIX)/lib/nginx/modules');
    is((stat $so)[2] & 07777, 0644, '  mode 644');
    my $doc = "$dest/opt/idem/share/doc/ngx_http_idempotency_module";
    ok(-f "$doc/$_", "  $_ in \$(PREFIX)/share/doc/ngx_http_idempotency_module")
        for qw(LICENSE README.md CHANGELOG.md);
    my ($rc, $t) = nginx_t($so);
    is($rc, 0, '  nginx loads the installed .so') or diag $t;

    my $dest2 = tempdir(CLEANUP => 1);
    $out = `$make DESTDIR=$dest2 MODULES_DIR=/etc/nginx/modules 2>&1`;
    ok(-f "$dest2/etc/nginx/modules/ngx_http_idempotency_module.so",
       'MODULES_DIR=... puts the .so there') or diag $out;
    ok(-f "$dest2/usr/local/share/doc/ngx_http_idempotency_module/LICENSE",
       '  and PREFIX defaults to /usr/local');
}

# ---- make deb, installed, smoke-tested, purged

SKIP: {
    my $why = $> != 0                       ? 'not root'
            : !-f '/etc/debian_version'     ? 'not Debian'
            : system('command -v dpkg-buildpackage dh_nginx >/dev/null 2>&1')
                                            ? 'no dpkg-buildpackage or dh_nginx'
            : '';
    skip "package test: $why", 1 if $why;

    my @out = `./util/deb-test.sh $top/t/servroot-package/deb 2>&1`;
    my $rc = $? >> 8;
    if ($rc == 2) {
        my ($reason) = map { /^skip: (.*)/ ? $1 : () } @out;
        skip "package test: " . ($reason // 'cannot run here'), 1;
    }
    my $n = 0;
    for (@out) {
        chomp;
        if (/^(not )?ok - (.*)/) {
            ok(!$1, "deb: $2");
            $n++;
        } elsif (/^#/) {
            note $_;
        } else {
            diag $_;
        }
    }
    ok($n >= 25, "deb-test ran its checks ($n)");
    is($rc, 0, 'util/deb-test.sh exits 0');
}

done_testing();
