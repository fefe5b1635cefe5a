# $idempotency_key_hash (SPEC §7): the hex SHA-256 in the record key, safe
# to log.  Checked against a hash computed here over scope NUL key (the
# decoded key, as the module hashes it) and against the keys in Redis.
# The access log is checked one request per block: with several, the
# runner checks the log between the responses.
use Test::Nginx::Socket 'no_plan';

use lib 't/lib';
use IdemTest;

use Digest::SHA qw(sha256_hex);

# an sf-string key: the hash is over the decoded text, quotes unescaped
$ENV{TEST_NGINX_HASH_1} = sha256_hex("tenant-a\0hash \"1\"");
$ENV{TEST_NGINX_HASH_2} = sha256_hex("\0hash-2");

# the location of every block that has no config of its own
my $pay = <<'EOC';
    location = /pay {
        idempotency on;
        idempotency_scope $http_x_tenant;
        add_header X-Key-Hash $idempotency_key_hash always;
        add_header X-Idem $idempotency_status always;
        access_log logs/error.log keyhash;
        proxy_pass http://127.0.0.1:$TEST_NGINX_SERVER_PORT/backend;
    }
    location = /backend {
        idempotency off;
        return 201 "ok\n";
    }
EOC

add_block_preprocessor(sub {
    my $block = shift;

    $block->set_value('http_config', ($block->http_config // '')
        . "log_format keyhash "
        . "'KEY-HASH \"\$idempotency_key_hash\" \$idempotency_status';\n");
    $block->set_value('config', $pay) unless defined $block->config;
});

run_tests();

# every record this file made, and only those, by the hashes above
my $cli = "redis-cli -p $ENV{TEST_NGINX_REDIS_PORT}";
my @keys = sort split /\n/, `$cli KEYS 'idem:*'`;
is_deeply(\@keys, ["idem:{$ENV{TEST_NGINX_HASH_1}}"],
          "KEYS 'idem:*' holds the record under the logged hash");
@keys = sort split /\n/, `$cli KEYS 'shop1:*'`;
is_deeply(\@keys, ["shop1:{$ENV{TEST_NGINX_HASH_2}}"],
          "KEYS 'shop1:*' holds the record under the logged hash");


__DATA__

=== TEST 1: the hash of scope and key, the same for the replay
--- more_headers
X-Tenant: tenant-a
Idempotency-Key: "hash \"1\""
--- pipelined_requests eval
["POST /pay\nx", "POST /pay\nx"]
--- error_code eval
[201, 201]
--- response_headers eval
["X-Key-Hash: $ENV{TEST_NGINX_HASH_1}\nX-Idem: new",
 "X-Key-Hash: $ENV{TEST_NGINX_HASH_1}\nX-Idem: replay"]



=== TEST 2: in the access log
--- more_headers
X-Tenant: tenant-a
Idempotency-Key: "hash \"1\""
--- request
POST /pay
x
--- error_code: 201
--- error_log eval
"KEY-HASH \"$ENV{TEST_NGINX_HASH_1}\" replay"



=== TEST 3: only the hash: neither the prefix nor the braces
--- config
    location = /pay {
        idempotency on;
        idempotency_redis_prefix "shop1:";
        add_header X-Key-Hash $idempotency_key_hash always;
        access_log logs/error.log keyhash;
        proxy_pass http://127.0.0.1:$TEST_NGINX_SERVER_PORT/backend;
    }
--- more_headers
Idempotency-Key: hash-2
--- request
POST /pay
x
--- error_code: 201
--- response_headers eval
"X-Key-Hash: $ENV{TEST_NGINX_HASH_2}"
--- error_log eval
"KEY-HASH \"$ENV{TEST_NGINX_HASH_2}\" new"



=== TEST 4: not found without a key
--- request
POST /pay
x
--- error_code: 201
--- response_headers
!X-Key-Hash
--- error_log
KEY-HASH "-" bypass



=== TEST 5: not found with an invalid key
--- more_headers
Idempotency-Key: a,b
--- request
POST /pay
x
--- error_code: 400
--- response_headers
!X-Key-Hash
--- error_log
KEY-HASH "-" invalid



=== TEST 6: not found for a method the module does not handle
--- more_headers
Idempotency-Key: hash-6
--- request
GET /pay
--- error_code: 201
--- response_headers
!X-Key-Hash
--- error_log
KEY-HASH "-" bypass
