# Redis (SPEC §2.7, §4): unreachable, pass mode, unix socket, db, ACL user,
# corrupt records, wrong types, lost scripts, timeouts.
use Test::Nginx::Socket 'no_plan';

use lib 't/lib';
use IdemTest;

use Digest::SHA qw(sha256_hex);

my $cli = "$ENV{REDIS_CLI} -p $ENV{TEST_NGINX_REDIS_PORT}";
system("$cli ACL SETUSER idem on '>s3cret' '~*' '+\@all' >/dev/null");

sub rkey { "idem:{" . sha256_hex("\0" . shift) . "}" }

$ENV{TEST_NGINX_CORRUPT_KEY} = rkey("redis-corrupt");
$ENV{TEST_NGINX_LIST_KEY} = rkey("redis-list");
$ENV{TEST_NGINX_TRUNC_KEY} = rkey("redis-trunc");
$ENV{TEST_NGINX_MAGIC_KEY} = rkey("redis-magic");
$ENV{TEST_NGINX_HUGE_KEY} = rkey("redis-huge");
$ENV{TEST_NGINX_WRAP_KEY} = rkey("redis-wrap");

run_tests();


__DATA__

=== TEST 1: Redis unreachable: 503 store-unavailable, upstream not contacted
--- http_config
    idempotency_redis 127.0.0.1:1;
--- config
    location = /pay {
        idempotency on;
        add_header X-Idem $idempotency_status always;
        proxy_pass http://127.0.0.1:$TEST_NGINX_SERVER_PORT/backend;
    }
    location = /backend {
        access_log logs/error.log backend;
        return 201 "ok\n";
    }
--- more_headers
Idempotency-Key: redis-1
--- request
POST /pay
x
--- error_code: 503
--- response_headers
X-Idem: error
Retry-After: 1
Content-Type: application/problem+json
--- response_body_like: "code":"store-unavailable"
--- error_log
cannot connect to redis "127.0.0.1:1"
--- no_error_log
BACKEND-EXEC



=== TEST 2: idempotency_on_redis_error pass: proxied unprotected
--- http_config
    idempotency_redis 127.0.0.1:1;
--- config
    location = /pay {
        idempotency on;
        idempotency_on_redis_error pass;
        add_header X-Idem $idempotency_status always;
        proxy_pass http://127.0.0.1:$TEST_NGINX_SERVER_PORT/backend;
    }
--- more_headers
Idempotency-Key: redis-2
--- request
POST /pay
x
--- error_code: 201
--- response_headers
X-Idem: error
--- error_log
cannot connect to redis



=== TEST 3: a unix socket, another db, and an ACL user
--- http_config
    idempotency_redis unix:$TEST_NGINX_REDIS_SOCKET db=3 user=idem password=s3cret;
--- config
    location = /pay {
        idempotency on;
        add_header X-Idem $idempotency_status always;
        proxy_pass http://127.0.0.1:$TEST_NGINX_SERVER_PORT/backend;
    }
--- more_headers
Idempotency-Key: redis-3
--- pipelined_requests eval
["POST /pay\nx", "POST /pay\nx"]
--- error_code eval
[201, 201]
--- response_headers eval
["X-Idem: new", "X-Idem: replay"]



=== TEST 4: the record went to db 3, not db 0
--- init
my $n0 = `$ENV{REDIS_CLI} -p $ENV{TEST_NGINX_REDIS_PORT} -n 0 EXISTS '@{[ "idem:{" . Digest::SHA::sha256_hex("\0redis-3") . "}" ]}'`;
my $n3 = `$ENV{REDIS_CLI} -p $ENV{TEST_NGINX_REDIS_PORT} -n 3 EXISTS '@{[ "idem:{" . Digest::SHA::sha256_hex("\0redis-3") . "}" ]}'`;
die "record in db0=$n0 db3=$n3" unless $n0 == 0 && $n3 == 1;
--- config
    location = /t {
        return 200 "ok\n";
    }
--- request
GET /t
--- response_body
ok



=== TEST 5: a wrong password is refused at the handshake: 503
--- http_config
    idempotency_redis 127.0.0.1:$TEST_NGINX_REDIS_PORT user=idem password=wrong;
--- config
    location = /pay {
        idempotency on;
        proxy_pass http://127.0.0.1:$TEST_NGINX_SERVER_PORT/backend;
    }
--- more_headers
Idempotency-Key: redis-5
--- request
POST /pay
x
--- error_code: 503
--- error_log
refused the handshake



=== TEST 6: a corrupt record is a Redis error, never a replay of garbage
--- init
system("$ENV{REDIS_CLI} -p $ENV{TEST_NGINX_REDIS_PORT} SET '$ENV{TEST_NGINX_CORRUPT_KEY}' 'IDM1garbage' >/dev/null");
--- config
    location = /pay {
        idempotency on;
        add_header X-Idem $idempotency_status always;
        proxy_pass http://127.0.0.1:$TEST_NGINX_SERVER_PORT/backend;
    }
--- more_headers
Idempotency-Key: redis-corrupt
--- request
POST /pay
x
--- error_code: 503
--- response_headers
X-Idem: error
--- error_log
corrupt record in redis
--- no_error_log
[alert]
[crit]



=== TEST 7: a record truncated in its body length is corrupt too
--- init
system("printf 'IDM1\\002%048d\\000\\310\\000\\000\\000\\000\\000\\000\\000\\000\\000\\000\\001\\000' 0 | $ENV{REDIS_CLI} -p $ENV{TEST_NGINX_REDIS_PORT} -x SET '$ENV{TEST_NGINX_TRUNC_KEY}' >/dev/null");
--- config
    location = /pay {
        idempotency on;
        proxy_pass http://127.0.0.1:$TEST_NGINX_SERVER_PORT/backend;
    }
--- more_headers
Idempotency-Key: redis-trunc
--- request
POST /pay
x
--- error_code: 503
--- error_log
corrupt record in redis
--- no_error_log
[alert]
[crit]



=== TEST 8: wrong magic, header counts of 2^32-1 and 2^31: corrupt, no crash
--- init
system("printf 'XDM1\\002%048d' 0 | $ENV{REDIS_CLI} -p $ENV{TEST_NGINX_REDIS_PORT} -x SET '$ENV{TEST_NGINX_MAGIC_KEY}' >/dev/null");
system("printf 'IDM1\\002%048d\\000\\310\\377\\377\\377\\377\\000\\000\\000\\001a' 0 | $ENV{REDIS_CLI} -p $ENV{TEST_NGINX_REDIS_PORT} -x SET '$ENV{TEST_NGINX_HUGE_KEY}' >/dev/null");
# 2^31 headers in no bytes: 2 * n wrapped to 0 before the fuzzer found it
system("printf 'IDM1\\002%048d\\000\\310\\200\\000\\000\\000\\000\\000\\000\\000\\000\\000\\000\\000' 0 | $ENV{REDIS_CLI} -p $ENV{TEST_NGINX_REDIS_PORT} -x SET '$ENV{TEST_NGINX_WRAP_KEY}' >/dev/null");
--- config
    location = /pay {
        idempotency on;
        proxy_pass http://127.0.0.1:$TEST_NGINX_SERVER_PORT/backend;
    }
--- pipelined_requests eval
["POST /pay\nx", "POST /pay\nx", "POST /pay\nx"]
--- more_headers eval
["Idempotency-Key: redis-magic", "Idempotency-Key: redis-huge",
 "Idempotency-Key: redis-wrap"]
--- error_code eval
[503, 503, 503]
--- no_error_log
[alert]
[crit]



=== TEST 9: a key of the wrong type is a Redis error, with pass it proxies
--- init
system("$ENV{REDIS_CLI} -p $ENV{TEST_NGINX_REDIS_PORT} RPUSH '$ENV{TEST_NGINX_LIST_KEY}' a >/dev/null");
--- config
    location = /pay {
        idempotency on;
        idempotency_on_redis_error pass;
        add_header X-Idem $idempotency_status always;
        proxy_pass http://127.0.0.1:$TEST_NGINX_SERVER_PORT/backend;
    }
--- more_headers
Idempotency-Key: redis-list
--- request
POST /pay
x
--- error_code: 201
--- response_headers
X-Idem: error
--- error_log
WRONGTYPE



=== TEST 10: SCRIPT FLUSH: the store falls back to EVAL and still works
The store after a NOSCRIPT goes again behind whatever was pipelined after
it: the retry comes in the next block (t/034 tests the fallback itself).
--- init
system("$ENV{REDIS_CLI} -p $ENV{TEST_NGINX_REDIS_PORT} SCRIPT FLUSH >/dev/null");
--- config
    location = /pay {
        idempotency on;
        add_header X-Idem $idempotency_status always;
        proxy_pass http://127.0.0.1:$TEST_NGINX_SERVER_PORT/backend;
    }
--- more_headers
Idempotency-Key: redis-9
--- request
POST /pay
x
--- error_code: 201
--- response_headers
X-Idem: new



=== TEST 10b: ... and the record is there
--- config
    location = /pay {
        idempotency on;
        add_header X-Idem $idempotency_status always;
        proxy_pass http://127.0.0.1:$TEST_NGINX_SERVER_PORT/backend;
    }
--- more_headers
Idempotency-Key: redis-9
--- request
POST /pay
x
--- error_code: 201
--- response_headers
X-Idem: replay



=== TEST 11: idempotency_redis_timeout: a stalled Redis answers 503 in time
--- init
# the worker's connection first finishes its handshake (it names itself
# last), then Redis stalls
for (1 .. 50) {
    last if `$ENV{REDIS_CLI} -p $ENV{TEST_NGINX_REDIS_PORT} CLIENT LIST`
            =~ /name=nginx-idempotency/;
    select(undef, undef, undef, 0.1);
}
system("($ENV{REDIS_CLI} -p $ENV{TEST_NGINX_REDIS_PORT} DEBUG SLEEP 1.5 >/dev/null &)");
select(undef, undef, undef, 0.3);
--- config
    location = /pay {
        idempotency on;
        idempotency_redis_timeout 300ms;
        add_header X-Idem $idempotency_status always;
        proxy_pass http://127.0.0.1:$TEST_NGINX_SERVER_PORT/backend;
    }
--- more_headers
Idempotency-Key: redis-10
--- request
POST /pay
x
--- error_code: 503
--- error_log
timed out
--- timeout: 1
--- wait: 1.5
