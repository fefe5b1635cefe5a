# "return" and "rewrite ... redirect" answer from the rewrite phase: they
# execute nothing and are not protected, so they pass through as bypass
# with nginx's own order (before access control), and the module never
# touches the rewrite module's code.  A return reached after a claim was
# won (an error_page after the owner's upstream failed) is what is stored.
# $connection_requests tells a replay (the first answer again) from a run.
use Test::Nginx::Socket 'no_plan';

use lib 't/lib';
use IdemTest;

run_tests();

__DATA__

=== TEST 1: a return in a protected location answers each time, as bypass
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
[201, 201, 201]
--- response_headers eval
["X-Idem: bypass\n!Idempotent-Replayed", "X-Idem: bypass\n!Idempotent-Replayed",
 "X-Idem: bypass\n!Idempotent-Replayed"]
--- response_body eval
["charged 1\n", "charged 2\n", "charged 3\n"]



=== TEST 2: a return inside "if" answers; the other branch proxies, protected
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
["X-Idem: bypass", "X-Idem: bypass", "X-Idem: new", "X-Idem: replay"]
--- response_body eval
["stub 1\n", "stub 2\n", "ran 1\n", "ran 1\n"]
--- grep_error_log eval: qr/BACKEND-EXEC \S+/
--- grep_error_log_out eval
qr/\A(?:BACKEND-EXEC \/backend\n)?\z/



=== TEST 3: the key a return answered is still free for a protected run
--- config
    location = /stub {
        idempotency on;
        return 200 "stub\n";
    }
    location = /pay {
        idempotency on;
        add_header X-Idem $idempotency_status always;
        proxy_pass http://127.0.0.1:$TEST_NGINX_SERVER_PORT/backend;
    }
--- more_headers
Idempotency-Key: return-3
--- pipelined_requests eval
["POST /stub\nx", "POST /pay\nx"]
--- error_code eval
[200, 201]
--- response_headers eval
["!X-Idem", "X-Idem: new"]



=== TEST 4: return answers before access control, as in stock nginx
--- config
    location = /pay {
        idempotency on;
        deny all;
        add_header X-Idem $idempotency_status always;
        return 200 "open\n";
    }
--- more_headers
Idempotency-Key: return-4
--- pipelined_requests eval
["POST /pay\nx", "POST /pay\nx"]
--- error_code eval
[200, 200]
--- response_headers eval
["X-Idem: bypass", "X-Idem: bypass"]



=== TEST 5: rewrite ... redirect passes through as bypass
--- config
    location = /moved {
        idempotency on;
        add_header X-Idem $idempotency_status always;
        rewrite ^ /receipts/$connection_requests redirect;
    }
--- more_headers
Idempotency-Key: return-5
--- pipelined_requests eval
["POST /moved\nx", "POST /moved\nx"]
--- error_code eval
[302, 302]
--- response_headers_like eval
["X-Idem: bypass\nLocation: http://[^/]+/receipts/1",
 "X-Idem: bypass\nLocation: http://[^/]+/receipts/2"]



=== TEST 6: an error_page redirect to a return after the owner's upstream was never reached: nothing ran, nothing is stored, the retry runs
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
Idempotency-Key: return-6
--- pipelined_requests eval
["POST /pay\nx", "POST /pay\nx"]
--- error_code eval
[202, 202]
--- response_headers eval
["!Idempotent-Replayed", "!Idempotent-Replayed"]
--- response_body eval
["queued 1\n", "queued 2\n"]
--- no_error_log
[alert]
[crit]
