# Configuration errors (issue: "nginx -t must say what is wrong and where"),
# and one configuration that uses every directive at every level.
use strict;
use warnings;
use Test::More;
use File::Temp qw(tempdir);

my $nginx = $ENV{TEST_NGINX_BINARY} || 'nginx';
my ($module) = grep { /idempotency/ }
               split /\s+/, ($ENV{TEST_NGINX_LOAD_MODULES} || '');
plan skip_all => 'TEST_NGINX_LOAD_MODULES must name the module'
    unless $module;

my $dir = tempdir(CLEANUP => 1);

# nginx_t(directives of "location /"): $loc starts at line 9
sub nginx_t {
    my $loc = shift;
    return nginx_t_http(<<"EOC");
    server {
        listen 127.0.0.1:19998;
        location / {
$loc
        }
    }
EOC
}

# nginx_t_http(the inside of http{}): it starts at line 6
sub nginx_t_http {
    my $http = shift;
    open my $fh, '>', "$dir/nginx.conf" or die;
    print $fh <<"EOC";
load_module $module;
error_log $dir/error.log;
pid $dir/nginx.pid;
events {}
http {
$http
}
EOC
    close $fh;
    my $out = `$nginx -t -p $dir/ -c $dir/nginx.conf 2>&1`;

    # Tengine built with its vendor's modules warns of its variables_hash
    # for every configuration without "variables_hash_max_size 2048" (its
    # tengine.conf sets it): the server's own warning, not the module's
    $out =~ s/^.*\[warn\] .*could not build optimal variables_hash.*\n//mg;

    # by what nginx says, not its exit code: under LeakSanitizer nginx's
    # own allocations left at exit change the code
    return ($out =~ /test is successful/ ? 1 : 0, $out);
}

# key files for the cases below, readable by their owner only
sub write_file {
    my ($path, $bytes) = @_;
    open my $fh, '>', $path or die "$path: $!";
    binmode $fh;
    print $fh $bytes;
    close $fh;
    chmod 0600, $path;
    return $path;
}

sub random_bytes { join '', map { chr int rand 256 } 1 .. shift }

my $raw_key = write_file("$dir/raw.key", random_bytes(32));
# openssl rand -hex 16: 128 bits, written with and without its newline
my $hex16 = join '', map { sprintf '%02x', int rand 256 } 1 .. 16;
my $hex16_key = write_file("$dir/hex16.key", $hex16);
my $hex16_secret = write_file("$dir/hex16.secret", "$hex16\n");
my $hex16_bare = write_file("$dir/hex16-bare.secret", $hex16);
my $keydir = "$dir/keys.d";
mkdir $keydir;
chmod 0755, $keydir;    # as mkdir makes them: it read as "chmod 600"

my @bad = (
    # enum-like directives name themselves and their values
    ['idempotency_on_redis_error rejekt;',
     qr/"idempotency_on_redis_error" must be "reject" or "pass", not "rejekt"/],
    ['idempotency_on_unknown kep;',
     qr/"idempotency_on_unknown" must be "keep", "forward" or "release", not "kep"/],
    # an unknown parameter is named, without its value, with the known ones
    ['idempotency_redis 127.0.0.1:6379 pasword=hunter2;',
     qr/invalid parameter "pasword=\.\.\." of "idempotency_redis": the parameters are db=N, user=NAME, password=PASSWORD, tls, cluster, sentinel=NAME, sentinel_user=NAME and sentinel_password=PASSWORD/],
    ['idempotency_redis 127.0.0.1:6379 user=;',
     qr/invalid parameter "user=" of "idempotency_redis": the parameters are db=N, user=NAME/],
    ['idempotency_redis 127.0.0.1:6379 sentinels=m;',
     qr/invalid parameter "sentinels=\.\.\." of "idempotency_redis"/],
    ['idempotency_redis 127.0.0.1:6379 tsl;',
     qr/several redis addresses require "cluster" \(seeds\) or "sentinel=NAME" \(Sentinels\), and "tsl" is read as an address: the parameters are db=N/],
    ["idempotency_encrypt_key $raw_key ID=x;",
     qr/invalid parameter "ID=x" of "idempotency_encrypt_key": "id=NAME" or "required" is expected/],
    # checked when merging, at the end of http{}: named at its own line
    ['idempotency_redis_wait 1 1s;',
     qr/the "idempotency_redis_wait" timeout \(1000 ms\) must be shorter than "idempotency_redis_timeout" \(1000 ms\)/],
    # a directory is not told to chmod 600
    ["idempotency_key_secret $keydir;",
     qr/"idempotency_key_secret" file "\Q$keydir\E" is a directory: name the key file/],
    ["idempotency_encrypt_key $keydir;",
     qr/"idempotency_encrypt_key" file "\Q$keydir\E" is a directory/],
    # hex text of 32 digits is 128 bits, not 256
    ["idempotency_encrypt_key $hex16_key;",
     qr/"idempotency_encrypt_key" file "\Q$hex16_key\E" holds hexadecimal text, 128 bits or fewer: a key of 32 random raw bytes, 256 bits, is expected \(openssl rand 32 > FILE\)/],
    ["idempotency_key_secret $hex16_secret;",
     qr/"idempotency_key_secret" file "\Q$hex16_secret\E" holds 32 hexadecimal digits, 128 bits: a secret of 256 bits is expected \(openssl rand -hex 32 > FILE\)/],
    ["idempotency_key_secret $hex16_bare;",
     qr/"idempotency_key_secret" file "\Q$hex16_bare\E" holds 32 hexadecimal digits, 128 bits/],
    ['idempotency_methods GET;',
     qr/"idempotency_methods" does not accept "GET": the methods allowed are POST, PUT, PATCH and DELETE/],
    ['idempotency_methods POST head;', qr/"idempotency_methods" does not accept "head"/],
    ['idempotency_redis_timeout 0;',
     qr/"idempotency_redis_timeout" must be at least 1ms, not "0"/],
    ['idempotency_ttl 500ms;', qr/"idempotency_ttl" must be at least 1s, not "500ms"/],
    ['idempotency_lock_ttl 0;', qr/"idempotency_lock_ttl" must be at least 1s, not "0"/],
    ['idempotency_lock_ttl 999ms;', qr/"idempotency_lock_ttl" must be at least 1s, not "999ms"/],
    ['idempotency_store_status 2yy;', qr/invalid status "2yy"/],
    ['idempotency_store_status 600;', qr/invalid status "600"/],
    ['idempotency_redis 127.0.0.1:6379 db=x;',
     qr/invalid parameter "db=x" of "idempotency_redis": db must be a number from 0 to 65535/],
    ['idempotency_redis 127.0.0.1:6379 db=70000;',
     qr/invalid parameter "db=70000" of "idempotency_redis": db must be a number from 0 to 65535/],
    ['idempotency_redis 127.0.0.1:6379 user=u;', qr/"user=" requires "password="/],
    ['idempotency_redis 127.0.0.1:6379; idempotency_redis 127.0.0.1:6380;',
     qr/"idempotency_redis" directive is duplicate/],
    ['idempotency_redis 999.1.1.1:6379;', qr/invalid redis address|host not found/],
    ['idempotency_redis_prefix "a{b";', qr/without spaces or braces/],
    ['idempotency_redis_prefix ' . ('p' x 65) . ';', qr/longer than 64 bytes/],
    ['idempotency_key_max_length 0;',
     qr/"idempotency_key_max_length" must be between 1 and 1024, not "0"/],
    ['idempotency_key_max_length 2000;',
     qr/"idempotency_key_max_length" must be between 1 and 1024, not "2000"/],
    ['idempotency_key_pattern "^[a-f0-9";',
     qr/"idempotency_key_pattern": pcre2?_compile\(\) failed: .* in "\^\[a-f0-9"/],
    ['idempotency_key_pattern "";',
     qr/"idempotency_key_pattern" directive takes a regular expression, not an empty string/],
    ['idempotency_key_pattern a; idempotency_key_pattern b;',
     qr/"idempotency_key_pattern" directive is duplicate/],
    ['idempotency_on_redis_error maybe;',
     qr/"idempotency_on_redis_error" must be "reject" or "pass", not "maybe"/],
    ['idempotency maybe;', qr/invalid value "maybe"/],
    ['idempotency_store_max_size 1x;', qr/"idempotency_store_max_size" directive invalid value/],
);

for my $case (@bad) {
    my ($conf, $want) = @$case;
    my ($ok, $out) = nginx_t($conf);
    ok(!$ok, "nginx -t refuses: $conf");
    like($out, $want, "...and says why") or diag $out;
    # the directive's own line, not the end of http{} where merging runs
    like($out, qr/ in \Q$dir\E\/nginx\.conf:9$/m, "...and where");
}

my ($ok, $out) = nginx_t(<<'EOC');
            idempotency on;
            idempotency_redis unix:/tmp/none.sock db=2 user=u password=p;
            idempotency_redis_timeout 250ms;
            idempotency_redis_prefix "pay:";
            idempotency_key $http_x_key;
            idempotency_key_max_length 64;
            idempotency_key_pattern "^[A-Za-z0-9_-]{8,}$";
            idempotency_scope $remote_user;
            idempotency_methods POST PUT PATCH DELETE;
            idempotency_required on;
            idempotency_ttl 7d;
            idempotency_lock_ttl 2m;
            idempotency_wait 5s;
            idempotency_store_status 2xx 3xx 4xx 503;
            idempotency_store_max_size 256k;
            idempotency_hide_header X-Debug;
            idempotency_pass_header Set-Cookie;
            idempotency_on_redis_error pass;
            idempotency_problem_base_uri https://errors.example.com/idem;
            proxy_pass http://127.0.0.1:1;
EOC
ok($ok, "every directive together is accepted") or diag $out;
unlike($out, qr/\[warn\]/, "...without a warning") or diag $out;

# nginx -t warnings (SPEC §7): the test still succeeds, the warning names
# the location and its line, once per location

my $at = qr/ in \Q$dir\E\/nginx\.conf/;
my $warn = qr/\[warn\] (?:\d+#\d+: )?/;
my $redis = '            idempotency_redis 127.0.0.1:6379;';

sub warnings { my $out = shift; return scalar(() = $out =~ /\[warn\]/g) }

($ok, $out) = nginx_t("            idempotency on;");
ok($ok, "the implicit Redis address is accepted") or diag $out;
like($out, qr/$warn"idempotency" is on in location "\/" without "idempotency_redis": using the default 127\.0\.0\.1:6379$at:8$/m,
     "...with a warning that names the default and the location's line");
is(warnings($out), 1, "...once") or diag $out;

($ok, $out) = nginx_t("            idempotency on;\n$redis");
ok($ok, "defaults and an explicit address (the default one, written out)");
unlike($out, qr/\[warn\]|idempotency/, "...nginx -t says nothing of the module")
    or diag $out;

# leases are renewed, so the lock no longer has to outlast the upstream:
# proxy_read_timeout is not compared any more; a renewal that can take
# idempotency_redis_timeout must land before the lease ends

($ok, $out) = nginx_t("            idempotency on;\n$redis\n"
                      . "            proxy_read_timeout 10m;");
ok($ok && warnings($out) == 0,
   "proxy_read_timeout longer than idempotency_lock_ttl: no warning")
    or diag $out;

($ok, $out) = nginx_t("            idempotency on;\n$redis\n"
                      . "            idempotency_lock_ttl 2s;\n"
                      . "            idempotency_redis_timeout 1s;");
ok($ok, "a lock shorter than three Redis timeouts is accepted");
like($out, qr/$warn"idempotency_lock_ttl" 2s is shorter than three times "idempotency_redis_timeout" 1s in location "\/": .*$at:8$/m,
     "...with a warning that names both values and the location's line")
    or diag $out;
is(warnings($out), 1, "...once") or diag $out;

($ok, $out) = nginx_t("            idempotency on;\n$redis\n"
                      . "            idempotency_lock_ttl 1500ms;");
like($out, qr/$warn"idempotency_lock_ttl" 1500ms is shorter than three times "idempotency_redis_timeout" 1s in location "\/"/,
     "a lock_ttl below three default Redis timeouts warns") or diag $out;

($ok, $out) = nginx_t("            proxy_read_timeout 5m;\n"
                      . "            idempotency_lock_ttl 1s;");
ok($ok && warnings($out) == 0, "no warning where idempotency is off")
    or diag $out;

# inherited from http{}: a warning per location, none for server{}, none
# for the "if" inside /b, none for /off
($ok, $out) = nginx_t_http(<<'EOC');
    idempotency on;
    idempotency_lock_ttl 2s;
    server {
        listen 127.0.0.1:19998;
        location /a {
            proxy_pass http://127.0.0.1:1;
        }
        location /b {
            if ($arg_x) { return 404; }
            location /b/c { }
        }
        location /off { idempotency off; }
    }
EOC
ok($ok, "inherited settings are accepted") or diag $out;
for (['/a', 10], ['/b', 13], ['/b/c', 15]) {
    my ($loc, $line) = @$_;
    like($out, qr/$warn"idempotency" is on in location "\Q$loc\E" .*$at:$line$/m,
         "...the default address warning for $loc, at its line");
    like($out, qr/$warn"idempotency_lock_ttl" 2s is shorter than three times "idempotency_redis_timeout" 1s in location "\Q$loc\E".*$at:$line$/m,
         "...the lock_ttl warning for $loc, at its line");
}
is(warnings($out), 6, "...and no other warning") or diag $out;

($ok, $out) = nginx_t_http(<<'EOC');
    idempotency_redis 127.0.0.1:6379;
    server {
        listen 127.0.0.1:19998;
        idempotency on;
        location /a { }
        location /b { idempotency_lock_ttl 4m; proxy_read_timeout 3m; }
    }
EOC
ok($ok && warnings($out) == 0,
   "an address from http{} and lock_ttl = proxy_read_timeout + 1m: silent")
    or diag $out;

# settings that are legal but probably not meant: warned, once per location
{
    my $loc = "            idempotency on;\n$redis\n";

    ($ok, $out) = nginx_t($loc . "            idempotency_ttl 1s;");
    ok($ok, "idempotency_ttl shorter than idempotency_lock_ttl is accepted")
        or diag $out;
    like($out, qr/$warn"idempotency_ttl" 1s is shorter than "idempotency_lock_ttl" 120s in location "\/": a response is kept for less time than its request may hold the key, .*$at:8$/m,
         "...with a warning that names both and the location's line")
        or diag $out;
    is(warnings($out), 1, "...once") or diag $out;

    ($ok, $out) = nginx_t($loc . "            idempotency_ttl 2m;\n"
                          . "            idempotency_wait 2m;");
    ok($ok && warnings($out) == 0,
       "idempotency_ttl and idempotency_wait equal to the lock: silent")
        or diag $out;

    ($ok, $out) = nginx_t($loc . "            idempotency_wait 150s;");
    ok($ok, "idempotency_wait longer than idempotency_lock_ttl is accepted")
        or diag $out;
    like($out, qr/$warn"idempotency_wait" 150s is longer than "idempotency_lock_ttl" 120s in location "\/": waiting out the lock does not free the key, .*$at:8$/m,
         "...with a warning that names both and the location's line")
        or diag $out;
    is(warnings($out), 1, "...once") or diag $out;
}

# the redis_wait check, inherited from http{}: the directive's line there
($ok, $out) = nginx_t_http(<<'EOC');
    idempotency_redis_wait 1 500ms;
    server {
        listen 127.0.0.1:19998;
        location / {
            idempotency on;
            idempotency_redis_timeout 300ms;
        }
    }
EOC
ok(!$ok, "an inherited WAIT timeout too long for the location is refused");
like($out, qr/\(500 ms\) must be shorter than "idempotency_redis_timeout" \(300 ms\)$at:6$/m,
     "...at the line of idempotency_redis_wait, not the end of http{}")
    or diag $out;

# idempotency_key_secret: 32 bytes or more, readable by its owner only
{
    my $f = "$dir/secret";
    my $write = sub {
        my ($bytes, $mode) = @_;
        open my $fh, '>', $f or die $!;
        binmode $fh;
        print $fh $bytes;
        close $fh;
        chmod $mode, $f;
    };
    my $loc = "            idempotency on;\n$redis\n"
              . "            idempotency_key_secret $f;";

    $write->('s' x 32, 0600);
    ($ok, $out) = nginx_t($loc);
    ok($ok, "a 32-byte secret, mode 600, is accepted") or diag $out;

    $write->('s' x 31, 0600);
    ($ok, $out) = nginx_t($loc);
    ok(!$ok, "a 31-byte secret is refused");
    like($out, qr/"idempotency_key_secret" file "\Q$f\E" holds 31 bytes/,
         "...naming the file and its size") or diag $out;

    $write->('s' x 32, 0644);
    ($ok, $out) = nginx_t($loc);
    ok(!$ok, "a world-readable secret is refused");
    like($out, qr/must not be accessible to group or others/, "...saying why")
        or diag $out;

    # openssl rand -hex 32: 64 digits and a newline, 256 bits
    $write->((join '', map { sprintf '%02x', int rand 256 } 1 .. 32) . "\n",
             0600);
    ($ok, $out) = nginx_t($loc);
    ok($ok, "a secret of 64 hexadecimal digits is accepted") or diag $out;
}

# Angie 1.12 gives every place "resolver conf" (the name servers of
# /etc/resolv.conf) unless "resolver off"; that resolver is not one of the
# place's own: a name is resolved once, by the system, and checked by -t,
# as in nginx.  Name servers given to "resolver" are used on each connect.
SKIP: {
    my ($minor) = `$nginx -V 2>&1` =~ m{^Angie version: Angie/1\.(\d+)\.}m;
    skip 'Angie 1.12 and later: "resolver conf" is its default', 3
        unless defined $minor && $minor >= 12;

    my $bad = "            idempotency on;\n"
              . "            idempotency_redis 999.1.1.1:6379;";
    for my $resolver ('', 'resolver conf;') {
        ($ok, $out) = nginx_t("$resolver\n$bad");
        like($out, qr/invalid redis address "999\.1\.1\.1:6379": host not found/,
             "Angie, resolver \"$resolver\": the name is checked by -t")
            or diag $out;
    }
    ($ok, $out) = nginx_t("resolver 127.0.0.1;\n$bad");
    ok($ok, 'Angie, a named resolver: resolved on each connect, not by -t')
        or diag $out;
}

done_testing();
