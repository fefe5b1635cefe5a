package IdemTest;

# Shared set-up of the Test::Nginx::Socket suites: one Redis for all
# blocks (flushed once per file), the module pointed at it, a log_format
# that lets a backend location prove how often it ran, a default /backend
# location answering 201 "ok", and no [error]/[alert]/[crit] unless a
# block says otherwise.  Works with CPAN's Test::Nginx and t/compat alike.

use strict;
use warnings;
use Test::Nginx::Socket ();

sub import {
    Test::Nginx::Socket::repeat_each(1);
    Test::Nginx::Socket::no_shuffle();
    Test::Nginx::Socket::no_long_string();

    $ENV{TEST_NGINX_REDIS_PORT} ||= 6379;
    $ENV{REDIS_CLI} ||= 'redis-cli';
    $ENV{TEST_NGINX_REDIS_CLI} ||= $ENV{REDIS_CLI};
    system("$ENV{REDIS_CLI} -p $ENV{TEST_NGINX_REDIS_PORT} FLUSHALL >/dev/null");

    Test::Nginx::Socket::add_block_preprocessor(\&preprocess);
}

sub preprocess {
    my $block = shift;

    my $hc = $block->http_config // '';

    $block->set_value("http_config",
        ($hc =~ /idempotency_redis / ? ''
            : "idempotency_redis 127.0.0.1:\$TEST_NGINX_REDIS_PORT;\n")
        . "log_format backend 'BACKEND-EXEC \$request_uri';\n" . $hc);

    my $config = $block->config // '';

    if ($config =~ m{/backend;} && $config !~ m{location = /backend }) {
        $block->set_value("config", $config . <<'EOC');
    location = /backend {
        idempotency off;
        return 201 "ok\n";
    }
EOC
    }

    $block->set_value("no_error_log", "[error]\n[alert]\n[crit]\n")
        unless defined $block->no_error_log || defined $block->error_log;
}

1;
