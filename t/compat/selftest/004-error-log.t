# error.log and access.log checks, init, user_files, env expansion,
# block preprocessors.
use Test::Nginx::Socket;

$ENV{TEST_NGINX_GREETING} = 'howdy';
env_to_nginx('TEST_NGINX_GREETING');

repeat_each(2);

# per repeat: 2 + 5 + 4 + 5 + 2 + 2 + 4 tests; the shutdown checks (2) run once
plan tests => repeat_each() * 24 + 2;

add_block_preprocessor(sub {
    my $block = shift;
    if (!defined $block->request) {
        $block->set_value("request", "GET /t\n");
    }
});

no_shuffle();
run_tests();

__DATA__

=== TEST 1: custom $TEST_NGINX_* variables are expanded; default request
--- config
    location = /t {
        return 200 "$TEST_NGINX_GREETING from $TEST_NGINX_SERVER_PORT\n";
    }
--- response_body eval
"howdy from $ENV{TEST_NGINX_SERVER_PORT}\n"



=== TEST 2: error_log, no_error_log and grep_error_log
--- config
--- request
GET /nonexistent.html
--- error_code: 404
--- error_log
No such file or directory
[error]
--- no_error_log
[alert]
--- grep_error_log eval: qr/open\(\) "[^"]+" failed/
--- grep_error_log_out
open() "$TEST_NGINX_SERVER_ROOT/html/nonexistent.html" failed



=== TEST 3: --- log_level and eval'd pattern lists, --- wait
--- config
    location = /t {
        return 200 "ok\n";
    }
--- log_level: warn
--- wait: 0.1
--- response_body
ok
--- no_error_log eval
[qr/\[(?:debug|info)\]/, "[error]"]



=== TEST 4: shutdown_error_log is checked after nginx exits
--- config
    location = /t {
        return 200 "ok\n";
    }
--- response_body
ok
--- error_log eval
[qr/http request line: "GET \/t HTTP\/1\.1"/, "http finalize request"]
--- no_error_log
shutting down
--- shutdown_error_log
shutting down
--- no_shutdown_error_log
[alert]



=== TEST 5: --- init runs before the requests
--- config
--- init
my $f = html_dir() . "/init.txt";
open my $out, '>', $f or die "cannot write $f: $!";
print $out "written by init\n";
close $out;
--- request
GET /init.txt
--- response_body
written by init



=== TEST 6: --- user_files
--- config
--- user_files
>>> sub/foo.txt
hello from user_files
--- request
GET /sub/foo.txt
--- response_body
hello from user_files



=== TEST 7: --- access_log and --- no_access_log
--- config
    location = /t {
        return 200 "ok\n";
    }
--- request
GET /t?from=access_log
--- response_body
ok
--- access_log
"GET /t?from=access_log HTTP/1.1" 200
--- no_access_log
" 404
