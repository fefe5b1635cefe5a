# master_on() / workers(): the master process is stopped gracefully between
# blocks and its shutdown messages can be checked.
use Test::Nginx::Socket;

master_on();
workers(2);
worker_connections(128);
log_level('notice');

plan tests => repeat_each() * (2 + 9) + 2 * 2;

run_tests();

__DATA__

=== TEST 1: simple request
--- config
    location = /t {
        return 200 "ok\n";
    }
--- request
GET /t
--- response_body
ok
--- shutdown_error_log
gracefully shutting down
--- no_shutdown_error_log
[alert]



=== TEST 2: pipelined requests
--- config
    location = /t {
        return 200 "$uri\n";
    }
--- pipelined_requests eval
["GET /t", "GET /t?a=1", "GET /t"]
--- response_body eval
["/t\n", "/t\n", "/t\n"]
--- error_code eval
[200, 200, 200]
--- no_error_log
[error]
--- shutdown_error_log
gracefully shutting down
--- no_shutdown_error_log
[alert]
