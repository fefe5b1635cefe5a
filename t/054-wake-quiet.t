# Wake-ups are published only where somebody may wait: a finish sends the
# key's SPUBLISH (on the script path, from inside the finish script) only
# when some location of the nginx configuration has idempotency_wait.
# - no location waits: stores and releases publish nothing, and still
#   store and release (a replay, a new run after a release)
# - one location waits: every finish publishes, also those of the other
#   locations, once per finish
# On the default user's path (the scripts; native where the server
# compares and deletes: Valkey 9, Redis 8.4) and, where the server has SET
# IFEQ (Valkey 8.1, Redis 8.4), on the native path of a user without
# scripting.
# Counted by the server's own command statistics.
# Plain Test::More: its own nginx on 20540-20543.
use strict;
use warnings;
use lib 't/lib';
use Test::More;
use Fleet;
use Time::HiRes qw(sleep);

plan skip_all => 'TEST_NGINX_LOAD_MODULES must name the module'
    unless have_module();

my $rp = $ENV{TEST_NGINX_REDIS_PORT} || 6379;
my $info = join "\n", redis_cli('INFO', 'server');

plan skip_all => 'needs Redis 7 or Valkey (SPUBLISH)'
    unless ($info =~ /^(?:redis|valkey)_version:(\d+)/m)[0] >= 7;

my $slow = $ENV{TEST_ASAN} ? 3 : 1;
my $root = fleet_root('wake-quiet');

my @paths = ('scripts');
my $caps = server_caps();
if ($caps->{ifeq}) {
    push @paths, 'native';
    redis_cli('ACL', 'SETUSER', 'quietnolua', 'reset', 'on', '>pw', '~*',
              '&*', '+@all', '-@scripting');
}
my $parent = $$;
END {
    redis_cli('ACL', 'DELUSER', 'quietnolua')
        if ($parent // 0) == $$ && grep { $_ eq 'native' } @paths;
}

my $port = 20540;

# an edge whose /pay stores (201) and /busy releases (503 is not stored);
# with $waits, another location waits for keys in progress
sub edge {
    my ($name, $path, $waits) = @_;
    my $p = $port++;
    my $user = $path eq 'native' ? ' user=quietnolua password=pw' : '';
    my $wait = $waits ? <<"EOC" : '';
        location = /pay-wait {
            idempotency on;
            idempotency_wait 2s;
            proxy_pass http://127.0.0.1:$p/backend;
        }
EOC
    my $dir = nginx_conf($name, <<"EOC", 1);
    server {
        listen 127.0.0.1:$p;
        idempotency_redis 127.0.0.1:$rp$user;
        idempotency_redis_prefix "quiet-$name:";
        location = /pay {
            idempotency on;
            add_header X-Idem \$idempotency_status always;
            proxy_pass http://127.0.0.1:$p/backend;
        }
        location = /busy {
            idempotency on;
            add_header X-Idem \$idempotency_status always;
            proxy_pass http://127.0.0.1:$p/backend-busy;
        }
$wait
        location = /backend { return 201 "charged\\n"; }
        location = /backend-busy { return 503 "try later\\n"; }
    }
EOC
    nginx_start($dir);
    sleep 0.3 * $slow;
    return ($dir, $p);
}

sub calls {
    my %n;
    for (split /\r?\n/, join "\n", redis_cli('INFO', 'commandstats')) {
        $n{$1} = $2 if /^cmdstat_(\w+):calls=(\d+)/;
    }
    return \%n;
}

# three stores and two releases, each key then asked again; the number
# of SPUBLISH calls they made
sub finishes {
    my ($p, $tag) = @_;
    my @st;

    redis_cli('CONFIG', 'RESETSTAT');
    push @st, idem_status(http_post($p, "$tag-s$_", 'x', '/pay')) for 1 .. 3;
    push @st, idem_status(http_post($p, "$tag-r$_", 'x', '/busy')) for 1 .. 2;
    sleep 0.3 * $slow;
    my $n = calls();
    push @st, idem_status(http_post($p, "$tag-s$_", 'x', '/pay')) for 1 .. 3;
    push @st, idem_status(http_post($p, "$tag-r$_", 'x', '/busy')) for 1 .. 2;
    return ("@st", $n);
}

my $expect = join ' ', ('201 new') x 3, ('503 new') x 2, ('201 replay') x 3,
                       ('503 new') x 2;

for my $path (@paths) {
    my ($dir, $p) = edge("quiet-$path", $path, 0);
    my ($st, $n) = finishes($p, "q-$path");

    # a release is not a store: the release's retry runs again (503 again)
    is($st, $expect, "$path, no location waits: stored, released, replayed");
    is($n->{spublish} // 0, 0, "$path, no location waits: no SPUBLISH");
    if ($path eq 'native' || $caps->{native}) {
        # native where scripting is forbidden, or by default where the
        # server compares and deletes too
        is(($n->{evalsha} // 0) + ($n->{eval} // 0), 0,
           "$path: no script ran");
    } else {
        is($n->{evalsha} // 0, 5, "$path: five finishes by the script");
    }
    is(scalar log_problems("$dir/logs/error.log"), 0,
       "$path, no location waits: no error");
    nginx_stop($dir);

    ($dir, $p) = edge("waits-$path", $path, 1);
    ($st, $n) = finishes($p, "w-$path");
    is($st, $expect, "$path, a location waits: stored, released, replayed");
    is($n->{spublish} // 0, 5,
       "$path, a location waits: one SPUBLISH per finish, also from the "
       . "locations that do not wait");
    is(scalar log_problems("$dir/logs/error.log"), 0,
       "$path, a location waits: no error");
    nginx_stop($dir);
}

done_testing();
