# "return" in a protected location (SPEC §2.9): a protected request's
# return is answered after access control and after the claim, as if it
# were the content handler, so it is stored and replayed; requests the
# module does not protect keep nginx's order (return before access).
# $connection_requests tells a replay (the first answer again) from a run.
use Test::Nginx::Socket 'no_plan';

use lib 't/lib';
use IdemTest;

run_tests();

__DATA__

=== TEST 1: a return is stored and replayed; another body is a mismatch
--- config
    location = /pay {
        idempotency on;
        add_header X-Idem $idempotency_status always;
        return 201 "charged $connection_requests\n";
    }
--- more_headers
Idempotency-Key: return-1
--- pipelined_requests eval
["POST /pay\n{\"amount\":10}", "POST /pay\n{\"amount\":10}",
 "POST /pay\n{\"amount\":99}"]
--- error_code eval
[201, 201, 422]
--- response_headers eval
["X-Idem: new\n!Idempotent-Replayed",
 "X-Idem: replay\nIdempotent-Replayed: true",
 "X-Idem: mismatch\nContent-Type: application/problem+json"]
--- response_body_like eval
["charged 1\n", "charged 1\n", qr/"code":"key-reused"/]



=== TEST 2: a return inside "if" is protected; the other branch proxies
--- config
    location = /pay {
        idempotency on;
        add_header X-Idem $idempotency_status always;
        if ($arg_stub) {
            return 202 "stub $connection_requests\n";
        }
        proxy_pass http://127.0.0.1:$TEST_NGINX_SERVER_PORT/backend;
    }
    location = /backend {
        access_log logs/error.log backend;
        return 201 "ran $connection_requests\n";
    }
--- pipelined_requests eval
["POST /pay?stub=1\nx", "POST /pay?stub=1\nx", "POST /pay\nx", "POST /pay\nx"]
--- more_headers eval
["Idempotency-Key: return-2a", "Idempotency-Key: return-2a",
 "Idempotency-Key: return-2b", "Idempotency-Key: return-2b"]
--- error_code eval
[202, 202, 201, 201]
--- response_headers eval
["X-Idem: new", "X-Idem: replay", "X-Idem: new", "X-Idem: replay"]
--- response_body eval
["stub 1\n", "stub 1\n", "ran 1\n", "ran 1\n"]
--- grep_error_log eval: qr/BACKEND-EXEC \S+/
--- grep_error_log_out eval
qr/\A(?:BACKEND-EXEC \/backend\n)?\z/



=== TEST 3: protected requests meet access control before the return
--- config
    location = /pay {
        idempotency on;
        deny all;
        add_header X-Idem $idempotency_status always;
        return 200 "open\n";
    }
--- pipelined_requests eval
["POST /pay\nx", "GET /pay", "POST /pay\nx"]
--- more_headers eval
["", "Idempotency-Key: return-3", "Idempotency-Key: return-3"]
--- error_code eval
[200, 200, 403]
--- response_body_like eval
["open\n", "open\n", "403 Forbidden"]
--- no_error_log
[alert]
[crit]



=== TEST 4: a refused auth_request never claims: the key is still new
--- config
    location = /pay {
        idempotency on;
        auth_request /auth;
        add_header X-Idem $idempotency_status always;
        return 201 "charged $connection_requests\n";
    }
    location = /auth {
        if ($http_authorization = "") {
            return 401;
        }
        return 204;
    }
--- pipelined_requests eval
["POST /pay\nx", "POST /pay\nx", "POST /pay\nx"]
--- more_headers eval
["Idempotency-Key: return-4", "Idempotency-Key: return-4\nAuthorization: t",
 "Idempotency-Key: return-4\nAuthorization: t"]
--- error_code eval
[401, 201, 201]
--- response_headers eval
["X-Idem: bypass", "X-Idem: new", "X-Idem: replay"]
--- response_body_like eval
["401 Authorization Required", "charged 2\n", "charged 2\n"]



=== TEST 5: a return without text (error page) and a redirect are stored
--- config
    location = /gone {
        idempotency on;
        return 410;
    }
    location = /moved {
        idempotency on;
        return 303 /receipts/$connection_requests;
    }
--- pipelined_requests eval
["POST /gone\nx", "POST /gone\nx", "POST /moved\nx", "POST /moved\nx"]
--- more_headers eval
["Idempotency-Key: return-5a", "Idempotency-Key: return-5a",
 "Idempotency-Key: return-5b", "Idempotency-Key: return-5b"]
--- error_code eval
[410, 410, 303, 303]
--- response_headers_like eval
["Content-Type: text/html", "Idempotent-Replayed: true",
 "Location: http://[^/]+/receipts/3", "Location: http://[^/]+/receipts/3\nIdempotent-Replayed: true"]



=== TEST 6: a rewrite before the return keeps the location, as "break"
--- config
    location = /pay {
        idempotency on;
        rewrite ^ /elsewhere;
        return 201 "uri $uri\n";
    }
    location = /elsewhere {
        return 500;
    }
--- more_headers
Idempotency-Key: return-6
--- request
POST /pay
x
--- error_code: 201
--- response_body
uri /elsewhere



=== TEST 7: Redis down with "pass": the return answers, unprotected
--- http_config
    idempotency_redis 127.0.0.1:1;
--- config
    location = /pay {
        idempotency on;
        idempotency_on_redis_error pass;
        add_header X-Idem $idempotency_status always;
        return 201 "charged\n";
    }
--- more_headers
Idempotency-Key: return-7
--- request
POST /pay
x
--- error_code: 201
--- response_headers
X-Idem: error
--- no_error_log
[alert]
[crit]



=== TEST 8: an error_page redirect to a return: its answer is what is stored
--- config
    location = /pay {
        idempotency on;
        error_page 502 =202 /queued;
        proxy_pass http://127.0.0.1:1;
    }
    location = /queued {
        return 202 "queued $connection_requests\n";
    }
--- more_headers
Idempotency-Key: return-8
--- pipelined_requests eval
["POST /pay\nx", "POST /pay\nx"]
--- error_code eval
[202, 202]
--- response_headers eval
["!Idempotent-Replayed", "Idempotent-Replayed: true"]
--- response_body eval
["queued 1\n", "queued 1\n"]
--- no_error_log
[alert]
[crit]
