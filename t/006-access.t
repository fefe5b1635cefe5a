# Access control runs first (SPEC §2.2): refused requests never touch
# Redis, so the same key is still free afterwards.
use Test::Nginx::Socket 'no_plan';

use lib 't/lib';
use IdemTest;

run_tests();

__DATA__

=== TEST 1: deny: 403 and nothing claimed
--- config
    location = /pay {
        deny all;
        idempotency on;
        proxy_pass http://127.0.0.1:$TEST_NGINX_SERVER_PORT/backend;
    }
--- more_headers
Idempotency-Key: access-1
--- request
POST /pay
x
--- error_code: 403
--- no_error_log
[alert]



=== TEST 2: auth_basic: 401 and nothing claimed
--- config
    location = /pay {
        auth_basic "pay";
        auth_basic_user_file /dev/null;
        idempotency on;
        proxy_pass http://127.0.0.1:$TEST_NGINX_SERVER_PORT/backend;
    }
--- more_headers
Idempotency-Key: access-1
--- request
POST /pay
x
--- error_code: 401
--- no_error_log
[alert]



=== TEST 3: satisfy any with a failing auth_request: 403, nothing claimed
--- config
    location = /pay {
        satisfy any;
        deny all;
        auth_request /auth;
        idempotency on;
        proxy_pass http://127.0.0.1:$TEST_NGINX_SERVER_PORT/backend;
    }
    location = /auth {
        return 403;
    }
--- more_headers
Idempotency-Key: access-1
--- request
POST /pay
x
--- error_code: 403
--- no_error_log
[alert]



=== TEST 4: the key refused three times above is still new
--- config
    location = /pay {
        idempotency on;
        add_header X-Idem $idempotency_status always;
        proxy_pass http://127.0.0.1:$TEST_NGINX_SERVER_PORT/backend;
    }
--- more_headers
Idempotency-Key: access-1
--- request
POST /pay
x
--- error_code: 201
--- response_headers
X-Idem: new
