# idempotency_fresh_key_detect: a fresh key that carries the same request
# (scope, method, URI, body) as another key within the window is counted
# and logged at warn with both key hashes, and still runs; another body, a
# replay of the same key, or the same body after the window is not.
use Test::Nginx::Socket 'no_plan';

use lib 't/lib';
use IdemTest;

use Digest::SHA qw(sha256 sha256_hex hmac_sha256_hex);

# TEST 4: with idempotency_key_secret the :f record is named by the HMAC
# of scope NUL fingerprint (the raw SHA-256 of method, URI and body, as in
# every record's head), so the scope cannot be guessed from Redis alone
my $secret = join '', map { chr(($_ * 41 + 7) % 256) } 0 .. 31;
$ENV{TEST_NGINX_SECRET_FILE} = "/tmp/ngx-idempotency-051-secret-$$";
open my $sf, '>', $ENV{TEST_NGINX_SECRET_FILE} or die $!;
binmode $sf;
print $sf $secret;
close $sf;
chmod 0600, $ENV{TEST_NGINX_SECRET_FILE};

my $fingerprint = sha256("POST\n/pay\namount=5000");
my $keyed = hmac_sha256_hex("tenant-42\0$fingerprint", $secret);
my $plain = sha256_hex("tenant-42\0$fingerprint");

run_tests();

unlink $ENV{TEST_NGINX_SECRET_FILE};

my $cli = "$ENV{REDIS_CLI} -p $ENV{TEST_NGINX_REDIS_PORT}";
my @keys = sort split /\n/, `$cli KEYS 'fsec:*:f'`;
is_deeply(\@keys, ["fsec:{$keyed}:f"],
          "with a secret, the :f record is named by its HMAC")
    or diag "the plain SHA-256 would be fsec:{$plain}:f";

__DATA__

=== TEST 1: the same body under a second key: flagged, and it runs
--- config
    location = /fanout {
        echo_subrequest POST /p1 -b 'amount=1000';
        echo_subrequest POST /p2 -b 'amount=1000';
        echo_subrequest POST /p3 -b 'amount=2000';
        echo_subrequest POST /p1 -b 'amount=1000';
    }
    location = /p1 {
        proxy_set_header Idempotency-Key fresh-1a;
        proxy_pass http://127.0.0.1:$TEST_NGINX_SERVER_PORT/pay;
    }
    location = /p2 {
        proxy_set_header Idempotency-Key fresh-1b;
        proxy_pass http://127.0.0.1:$TEST_NGINX_SERVER_PORT/pay;
    }
    location = /p3 {
        proxy_set_header Idempotency-Key fresh-1c;
        proxy_pass http://127.0.0.1:$TEST_NGINX_SERVER_PORT/pay;
    }
    location = /pay {
        idempotency on;
        idempotency_fresh_key_detect 10m;
        proxy_pass http://127.0.0.1:$TEST_NGINX_SERVER_PORT/backend;
    }
    location = /backend {
        access_log logs/error.log backend;
        return 201 "ok\n";
    }
--- request
GET /fanout
--- response_body
ok
ok
ok
ok
--- grep_error_log eval: qr/BACKEND-EXEC \S+|the same request came with another key/
--- grep_error_log_out
BACKEND-EXEC /backend
the same request came with another key
BACKEND-EXEC /backend
BACKEND-EXEC /backend
--- no_error_log
[error]



=== TEST 2: the metric
--- config
    location = /fanout {
        echo_subrequest POST /p1 -b 'amount=3000';
        echo_subrequest POST /p2 -b 'amount=3000';
        echo_subrequest GET /metrics;
    }
    location = /p1 {
        proxy_set_header Idempotency-Key fresh-2a;
        proxy_pass http://127.0.0.1:$TEST_NGINX_SERVER_PORT/pay;
    }
    location = /p2 {
        proxy_set_header Idempotency-Key fresh-2b;
        proxy_pass http://127.0.0.1:$TEST_NGINX_SERVER_PORT/pay;
    }
    location = /pay {
        idempotency on;
        idempotency_fresh_key_detect 10m;
        proxy_pass http://127.0.0.1:$TEST_NGINX_SERVER_PORT/backend;
    }
    location = /metrics {
        idempotency_metrics;
    }
--- request
GET /fanout
--- response_body_like chomp
nginx_idempotency_suspected_fresh_key_retries_total 1\b



=== TEST 3: off by default: nothing is sent, nothing flagged
--- config
    location = /fanout {
        echo_subrequest POST /p1 -b 'amount=4000';
        echo_subrequest POST /p2 -b 'amount=4000';
    }
    location = /p1 {
        proxy_set_header Idempotency-Key fresh-3a;
        proxy_pass http://127.0.0.1:$TEST_NGINX_SERVER_PORT/pay;
    }
    location = /p2 {
        proxy_set_header Idempotency-Key fresh-3b;
        proxy_pass http://127.0.0.1:$TEST_NGINX_SERVER_PORT/pay;
    }
    location = /pay {
        idempotency on;
        proxy_pass http://127.0.0.1:$TEST_NGINX_SERVER_PORT/backend;
    }
--- request
GET /fanout
--- response_body
ok
ok
--- no_error_log
another key



=== TEST 4: with idempotency_key_secret, flagged as well (names: below)
--- config
    location = /fanout {
        echo_subrequest POST /p1 -b 'amount=5000';
        echo_subrequest POST /p2 -b 'amount=5000';
    }
    location = /p1 {
        proxy_set_header Idempotency-Key fresh-4a;
        proxy_pass http://127.0.0.1:$TEST_NGINX_SERVER_PORT/pay;
    }
    location = /p2 {
        proxy_set_header Idempotency-Key fresh-4b;
        proxy_pass http://127.0.0.1:$TEST_NGINX_SERVER_PORT/pay;
    }
    location = /pay {
        idempotency on;
        idempotency_redis_prefix fsec:;
        idempotency_scope tenant-42;
        idempotency_key_secret $TEST_NGINX_SECRET_FILE;
        idempotency_fresh_key_detect 10m;
        proxy_pass http://127.0.0.1:$TEST_NGINX_SERVER_PORT/backend;
    }
    location = /backend {
        access_log logs/error.log backend;
        return 201 "ok\n";
    }
--- request
GET /fanout
--- response_body
ok
ok
--- grep_error_log eval: qr/BACKEND-EXEC \S+|the same request came with another key/
--- grep_error_log_out
BACKEND-EXEC /backend
the same request came with another key
BACKEND-EXEC /backend
--- no_error_log
[error]
