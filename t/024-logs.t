# Log lines an operator acts on: a claim lost before the store (the request
# may have run twice) is an error naming the key hash, the client and the
# request line, never the key.
use Test::Nginx::Socket 'no_plan';

use lib 't/lib';
use IdemTest;

run_tests();

__DATA__

=== TEST 1: a claim lost while the upstream ran: error, with the request's context
--- main_config
    load_module $TEST_NGINX_PERL_MODULE;
--- config
    location = /pay {
        idempotency on;
        proxy_pass http://127.0.0.1:$TEST_NGINX_SERVER_PORT/backend;
    }
    location = /backend {
        perl 'sub {
            my $r = shift;
            system("$TEST_NGINX_REDIS_CLI -p $TEST_NGINX_REDIS_PORT FLUSHALL >/dev/null");
            $r->send_http_header("text/plain");
            $r->print("ran\n");
            return 0;
        }';
    }
--- more_headers
Idempotency-Key: logs-secret-1
--- request
POST /pay
x
--- error_code: 200
--- error_log eval
qr/\[error\] .*claim was lost before the record was stored \(taken over after its lease expired, or Redis lost the key\), key hash [0-9a-f]{64}, client: 127\.0\.0\.1, request: "POST \/pay HTTP\/1\.1"/
--- no_error_log eval
[qr/\[(?:error|warn|info)\].*logs-secret-1/, "[crit]", "[alert]"]
