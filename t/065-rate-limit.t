# Retries the rate limiter must not punish: limit_req counts executions,
# not replays, when it is applied on the way to the upstream only, in a
# named location the protected one hands its new claims to.  A replay or a
# 409 is answered before the request gets there; a new key past the rate
# gets 429, and its claim is released (the upstream was never reached).
use Test::Nginx::Socket 'no_plan';

use lib 't/lib';
use IdemTest;

run_tests();

__DATA__

=== TEST 1: at 1 request per second, the retries of a payment are replayed and a new key gets 429
--- http_config
    limit_req_zone $binary_remote_addr zone=payments:1m rate=1r/s;
--- config
    location = /pay {
        idempotency on;
        add_header X-Idem $idempotency_status always;
        try_files /.idempotency-execute @pay;
    }
    location @pay {
        limit_req zone=payments nodelay;
        limit_req_status 429;
        limit_req_log_level warn;
        add_header X-Idem $idempotency_status always;
        rewrite ^ /backend break;
        proxy_pass http://127.0.0.1:$TEST_NGINX_SERVER_PORT;
    }
    location = /backend {
        access_log logs/error.log backend;
        return 201 "charged\n";
    }
--- pipelined_requests eval
["POST /pay\n{\"amount\":10}", "POST /pay\n{\"amount\":10}",
 "POST /pay\n{\"amount\":10}", "POST /pay\n{\"amount\":10}",
 "POST /pay\n{\"amount\":20}"]
--- more_headers eval
["Idempotency-Key: rl-1", "Idempotency-Key: rl-1", "Idempotency-Key: rl-1",
 "Idempotency-Key: rl-1", "Idempotency-Key: rl-2"]
--- error_code eval
[201, 201, 201, 201, 429]
--- response_headers eval
["X-Idem: new", "X-Idem: replay", "X-Idem: replay", "X-Idem: replay",
 "X-Idem: new"]
--- grep_error_log eval: qr/BACKEND-EXEC \S+|limiting requests/
--- grep_error_log_out eval
qr/\A(?:(?:BACKEND-EXEC \/backend\n)?limiting requests\n)?\z/



=== TEST 2: limit_req in the protected location itself spends the quota on retries: they get 429
--- http_config
    limit_req_zone $binary_remote_addr zone=payments:1m rate=1r/s;
--- config
    location = /pay {
        limit_req zone=payments nodelay;
        limit_req_status 429;
        limit_req_log_level warn;
        idempotency on;
        add_header X-Idem $idempotency_status always;
        proxy_pass http://127.0.0.1:$TEST_NGINX_SERVER_PORT/backend;
    }
    location = /backend {
        return 201 "charged\n";
    }
--- pipelined_requests eval
["POST /pay\n{\"amount\":10}", "POST /pay\n{\"amount\":10}"]
--- more_headers eval
["Idempotency-Key: rl-3", "Idempotency-Key: rl-3"]
--- error_code eval
[201, 429]
