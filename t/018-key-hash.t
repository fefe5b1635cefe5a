# $idempotency_key_hash (SPEC §7): the hex SHA-256 in the record key, safe
# to log.  Checked against a hash computed here over scope NUL key (the
# decoded key, as the module hashes it) and against the keys in Redis.
# The access log is checked one request per block: with several, the
# runner checks the log between the responses.
# TEST 7 also checks the default idempotency_lock_ttl (2m, SPEC §4) on
# the claim it names.
use Test::Nginx::Socket 'no_plan';

use lib 't/lib';
use IdemTest;

use Digest::SHA qw(sha256_hex hmac_sha256_hex);

# an sf-string key: the hash is over the decoded text, quotes unescaped
$ENV{TEST_NGINX_HASH_1} = sha256_hex("tenant-a\0hash \"1\"");
$ENV{TEST_NGINX_HASH_2} = sha256_hex("\0hash-2");
$ENV{TEST_NGINX_HASH_7} = sha256_hex("\0hash-7");

# TEST 8: keyed record names, HMAC-SHA-256 with idempotency_key_secret
my $secret = join '', map { chr(($_ * 37 + 11) % 256) } 0 .. 31;
$ENV{TEST_NGINX_SECRET_FILE} = "/tmp/ngx-idempotency-018-secret-$$";
open my $sf, '>', $ENV{TEST_NGINX_SECRET_FILE} or die $!;
binmode $sf;
print $sf $secret;
close $sf;
chmod 0600, $ENV{TEST_NGINX_SECRET_FILE};
$ENV{TEST_NGINX_HASH_8} = hmac_sha256_hex("\0hash-8", $secret);

# TEST 7 polls the claim's PTTL from the side while the request runs
$ENV{TEST_NGINX_PTTL_FILE} = "/tmp/ngx-idempotency-018-pttl-$$";
unlink $ENV{TEST_NGINX_PTTL_FILE};

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
my $cli = "$ENV{REDIS_CLI} -p $ENV{TEST_NGINX_REDIS_PORT}";
my @keys = sort split /\n/, `$cli KEYS 'idem:*'`;
is_deeply(\@keys, [sort map { "idem:{$ENV{$_}}" }
                         qw(TEST_NGINX_HASH_1 TEST_NGINX_HASH_7)],
          "KEYS 'idem:*' holds the records under the logged hashes");
@keys = sort split /\n/, `$cli KEYS 'keyed:*'`;
is_deeply(\@keys, ["keyed:{$ENV{TEST_NGINX_HASH_8}}"],
          "KEYS 'keyed:*' holds the record under its HMAC, not its SHA-256");
unlink $ENV{TEST_NGINX_SECRET_FILE};
@keys = sort split /\n/, `$cli KEYS 'shop1:*'`;
is_deeply(\@keys, ["shop1:{$ENV{TEST_NGINX_HASH_2}}"],
          "KEYS 'shop1:*' holds the record under the logged hash");

# a claim lives in Redis for idempotency_lock_ttl + idempotency_ttl (2m +
# 24h by default): its lease is inside it, and a dead owner's claim must
# read as an unknown outcome for a day, not vanish after the lock
my $pttl = -e $ENV{TEST_NGINX_PTTL_FILE}
           ? `cat $ENV{TEST_NGINX_PTTL_FILE}` : 'none';
unlink $ENV{TEST_NGINX_PTTL_FILE};
chomp $pttl;
ok($pttl =~ /^\d+$/ && $pttl > 86400000 && $pttl <= 86520000,
   "the claim's PTTL ($pttl ms) is above 24h and at most 24h 2m");


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



=== TEST 7: the claim under that hash lives the default idempotency_lock_ttl
(2m; its PTTL is checked at the end of this file)
--- init
system("for i in \$(seq 100); do "
       . "v=\$($ENV{REDIS_CLI} -p $ENV{TEST_NGINX_REDIS_PORT} PTTL "
       . "'idem:{$ENV{TEST_NGINX_HASH_7}}'); "
       . "if [ \"\$v\" -gt 0 ]; then "
       . "echo \$v > $ENV{TEST_NGINX_PTTL_FILE}; break; fi; "
       . "sleep 0.05; done >/dev/null 2>&1 &");
--- config
    location = /pay {
        idempotency on;
        add_header X-Key-Hash $idempotency_key_hash always;
        proxy_pass http://127.0.0.1:$TEST_NGINX_SERVER_PORT/slow;
    }
    location = /slow {
        echo_sleep 2;
        echo done;
    }
--- more_headers
Idempotency-Key: hash-7
--- request
POST /pay
x
--- response_headers eval
"X-Key-Hash: $ENV{TEST_NGINX_HASH_7}"
--- response_body
done
--- timeout: 6



=== TEST 8: idempotency_key_secret: the record is named by HMAC-SHA-256 of
scope NUL key, and $idempotency_key_hash says so
--- config
    location = /pay {
        idempotency on;
        idempotency_redis_prefix keyed:;
        idempotency_key_secret $TEST_NGINX_SECRET_FILE;
        add_header X-Key-Hash $idempotency_key_hash always;
        add_header X-Idem $idempotency_status always;
        proxy_pass http://127.0.0.1:$TEST_NGINX_SERVER_PORT/backend;
    }
    location = /backend {
        idempotency off;
        return 201 "ok\n";
    }
--- more_headers
Idempotency-Key: hash-8
--- pipelined_requests eval
["POST /pay\nx", "POST /pay\nx"]
--- error_code eval
[201, 201]
--- response_headers eval
["X-Key-Hash: $ENV{TEST_NGINX_HASH_8}\nX-Idem: new", "X-Key-Hash: $ENV{TEST_NGINX_HASH_8}\nX-Idem: replay"]
