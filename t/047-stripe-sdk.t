# Stripe's own Node.js library (npm "stripe", which puts an Idempotency-Key
# on every POST and retries network errors, 409 and 5xx unless told not to)
# against a fake payments origin behind the module: it stops on
# outcome-unknown and on 422, raising the error its type names, and retries
# a 409 until the replay. It is driven by t/lib/stripe_client.js, which
# has npm install it into a cache outside the repository (STRIPE_NODE_DIR,
# default /var/cache/ngx-idempotency-npm).
# Plain Test::More: its own nginx (edges on 19990-19992, origin on 19993).
use strict;
use warnings;
use lib 't/lib';
use Test::More;
use Fleet;
use JSON::PP;
use Time::HiRes qw(sleep);

plan skip_all => 'TEST_NGINX_LOAD_MODULES must name the module'
    unless have_module();

my $client = 't/lib/stripe_client.js';
npm_library($client);
my $slow = $ENV{TEST_ASAN} ? 3 : 1;
my ($late_port, $fast_port, $slow_port, $origin_port)
    = (19990, 19991, 19992, 19993);
my $root = fleet_root('stripe');

my $dir = nginx_conf('stripe', <<"EOC", 2);
    log_format exec '\$http_idempotency_key \$uri';
    idempotency_redis 127.0.0.1:$ENV{TEST_NGINX_REDIS_PORT};
    idempotency_redis_prefix stripe:;
    server {
        listen 127.0.0.1:$origin_port;
        access_log logs/exec.log exec;
        default_type application/json;
        location = /fast { return 200 '{"id":"ch_\$request_id","object":"charge"}'; }
        location = /slow {
            echo_sleep @{[ 1.0 * $slow ]};
            echo '{"id":"ch_\$request_id","object":"charge"}';
        }
        location = /late {
            echo_sleep @{[ 1.5 * $slow ]};
            echo '{"id":"ch_\$request_id","object":"charge"}';
        }
    }
@{[ join '', map { my ($p, $to, $rt) = @$_; <<"EOS" } [$late_port, 'late', 500], [$fast_port, 'fast', 10000], [$slow_port, 'slow', 10000] ]}
    server {
        listen 127.0.0.1:$p;
        location = /v1/charges {
            idempotency on;
            proxy_read_timeout @{[ $rt * $slow ]}ms;
            proxy_pass http://127.0.0.1:$origin_port/$to;
        }
    }
EOS
EOC
nginx_start($dir);
sleep 0.3;

my $run = int(time * 1000);

# one call per amount with the key -> what the library handed back last
sub sdk {
    my ($port, $key, @amounts) = @_;
    my $out = `node $client $port $key:@{[ join ',', @amounts ]} 2>&1`;
    my ($line) = $out =~ /^(\{.*\})$/m;
    return eval { decode_json($line // '') } || { raw => $out };
}

sub runs {
    my ($key, $path) = @_;
    return scalar grep { /^\Q$key\E \/\Q$path\E$/ } lines_of("$dir/logs/exec.log");
}

# 1. a charge that commits and answers after proxy_read_timeout: the
# library retries nginx's 504 once, is told outcome-unknown with
# Stripe-Should-Retry: false, and stops
my $r = sdk($late_port, "$run-late", 100);
is($r->{resolved}, JSON::PP::false, 'outcome unknown: the library raises')
    or diag explain $r;
is($r->{error}, 'StripeAPIError', '...a StripeAPIError');
is($r->{type}, 'api_error', '...of type api_error');
is($r->{code}, 'outcome-unknown', '...with code outcome-unknown');
is($r->{status}, 504, '...status 504');
sleep 1.5 * $slow;
is(runs("$run-late", 'late'), 1, '...and the charge ran once');

# 2. the same key for another amount: 422, an idempotency error, no retry
# (stripe-node names StripeIdempotencyError only for 400 and 404, Stripe's
# own statuses; a 422 is raised as an API error of type idempotency_error)
$r = sdk($fast_port, "$run-mismatch", 100, 200);
is($r->{resolved}, JSON::PP::false,
   '422: the library raises, no charge returned')
    or diag explain $r;
is($r->{type}, 'idempotency_error', '...an error of type idempotency_error');
is($r->{code}, 'key-reused', '...code key-reused');
is($r->{status}, 422, '...status 422');
is(runs("$run-mismatch", 'fast'), 1, '...the first charge ran once');

# 3. a retry while the first is in progress: 409, retried by the library
# (x-should-retry: true, Retry-After) until it gets the replay
my $pid = open(my $first, '-|', "node $client $slow_port $run-slow:100")
    // die;
sleep 0.3 * $slow;
$r = sdk($slow_port, "$run-slow", 100);
my $o = eval { decode_json(scalar <$first> // '') } || {};
close $first;
ok($o->{resolved} && $r->{resolved},
   'in progress: both calls return the charge')
    or diag explain [$o, $r];
is($r->{id}, $o->{id}, '...the same charge: the second is the replay');
is(runs("$run-slow", 'slow'), 1, '...which ran once');

is(scalar log_problems("$dir/logs/error.log"), 0, 'no crash or alert');

done_testing();
