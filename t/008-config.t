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

sub nginx_t {
    my $loc = shift;
    open my $fh, '>', "$dir/nginx.conf" or die;
    print $fh <<"EOC";
load_module $module;
error_log $dir/error.log;
pid $dir/nginx.pid;
events {}
http {
    server {
        listen 127.0.0.1:19998;
        location / {
$loc
        }
    }
}
EOC
    close $fh;
    my $out = `$nginx -t -p $dir/ -c $dir/nginx.conf 2>&1`;

    # by what nginx says, not its exit code: under LeakSanitizer nginx's
    # own allocations left at exit change the code
    return ($out =~ /test is successful/ ? 1 : 0, $out);
}

my @bad = (
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
    ['idempotency_on_redis_error maybe;', qr/invalid value "maybe"/],
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

done_testing();
