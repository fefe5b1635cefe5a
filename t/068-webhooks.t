# The webhook recipe of docs/operations.md ("Receiving webhooks", its
# ```nginx block) works as written: its upstream is pointed at a receiver
# on a test port, and nothing else is changed.  The receiver and the
# senders are t/lib/webhooks.js, with the official Standard Webhooks
# library (npm "standardwebhooks", installed by the driver into a cache
# outside the repository, as t/047 does Stripe's): every delivery is
# signed afresh as a sender signs a redelivery, and the receiver verifies
# it (Standard Webhooks and Svix with the library, GitHub and Shopify with
# their documented HMACs, Stripe with Stripe's own library, which reads
# the event's id from the body), answers 400 to a bad signature, counts its
# executions per event id, and holds or fails an execution when the
# event's payload asks it to.  Variants of the recipe (a line changed,
# the path renamed) show what each line is for.
# Plain Test::More: its own nginx on 20830, the receiver on 20831.
use strict;
use warnings;
use utf8;
use lib 't/lib';
use Test::More;
use Fleet;
use JSON::PP;
use Time::HiRes qw(sleep);

plan skip_all => 'TEST_NGINX_LOAD_MODULES must name the module'
    unless have_module();

my $driver = 't/lib/webhooks.js';
npm_library($driver);
my $slow = $ENV{TEST_ASAN} ? 3 : 1;
my ($edge, $origin_port) = (20830, 20831);
my $root = fleet_root('webhooks');
my $log = "$root/receiver.log";
my $run = int(time * 1000);
# the receiver's hold on the execution that duplicates must overlap
my $hold = 400 * $slow;

# --- the recipe, from the doc
open my $fh, '<', 'docs/operations.md' or die "docs/operations.md: $!";
my $doc = do { local $/; <$fh> };
close $fh;
my ($section) = $doc =~ /^## Receiving webhooks\n(.*?)^## /ms;
my ($recipe) = ($section // '') =~ /```nginx\n(.*?)```/s;
my ($upstream) = ($recipe // '') =~ /^(upstream webhook_receiver \{.*?^\})/ms;
my ($location) = ($recipe // '') =~ /^(location \/webhooks\/ \{.*?^\})/ms;
ok($upstream && $location,
   'operations.md has the recipe: an upstream and location /webhooks/')
    or BAIL_OUT('no recipe');
is($upstream =~ s/server 127\.0\.0\.1:8080;/server 127.0.0.1:$origin_port;/g,
   1, 'the receiver is the test\'s');

# variant(name, [pattern, replacement]...): the recipe under /name/, each
# change matching exactly once
sub variant {
    my ($name, @changes) = @_;
    (my $v = $location) =~ s{/webhooks/}{/$name/}g;
    for (@changes) {
        my ($re, $to) = @$_;
        my $n = () = $v =~ /$re/g;
        is($n, 1, "variant $name: $re matches once") or next;
        $v =~ s/$re/$to/;
    }
    return $v;
}

my $timeout = "    proxy_read_timeout @{[ 300 * $slow ]}ms;\n";
my $locations = join "\n", $location,
    variant('nowait', [qr/idempotency_wait\s+\S+;/, 'idempotency_wait 0;']),
    variant('storeall', [qr/^ *idempotency_store_status[^\n]*\n/m, '']),
    variant('forward', [qr/^ *idempotency_on_unknown[^\n]*\n\K/m, $timeout]),
    variant('keep', [qr/^ *idempotency_on_unknown[^\n]*\n/m, $timeout]);

# --- the receiver, then nginx
my ($receiver, $ready);
END {
    local $?;
    if ($receiver) {
        kill 'TERM', $receiver;
        close $ready;
    }
}
$receiver = open($ready, '-|', 'node', $driver, 'origin', $origin_port, $log)
    or die "cannot start the receiver: $!";
(<$ready> // '') =~ /^ready/ or die 'the receiver did not start';
open my $touch, '>', $log or die "$log: $!";
close $touch;

my $dir = nginx_conf('edge', <<"EOC");
    log_format hooks '\$uri \$idempotency_status \$status \$request_time';
    idempotency_redis 127.0.0.1:$ENV{TEST_NGINX_REDIS_PORT};
    idempotency_redis_prefix webhooks:;
$upstream
    server {
        listen 127.0.0.1:$edge;
        access_log logs/hooks.log hooks;
$locations
    }
EOC
my $bin = $ENV{TEST_NGINX_BINARY} || 'nginx';
my $check = `$bin -p $dir/ -c conf/nginx.conf -t 2>&1`;
unlike(own_warnings($check), qr/\[(warn|emerg)\]/,
       'nginx -t: the recipe draws no warning')
    or diag $check;
nginx_start($dir);
sleep 0.3 * $slow;

# --- senders and counts
my $sent = 0;

# deliver(delivery...): all at once, through nginx -> their answers
sub deliver {
    my @d = @_;
    my $file = "$root/deliveries-" . $sent++ . '.json';
    open my $out, '>:raw', $file or die "$file: $!";
    print $out JSON::PP->new->utf8->encode(\@d);
    close $out;
    my $got = `node $driver send $edge $file 2>&1`;
    my @r = map { decode_json($_) } grep { /^\{/ } split /\n/, $got;
    @r == @d or diag "send: $got";
    return @r;
}

# d(sender, id, body, options): a delivery to the sender's recipe, signed
# with a timestamp of its own (Standard Webhooks, Svix), as a sender signs
# each redelivery afresh: the fingerprint does not cover it
my $age = 0;
sub d {
    my ($sender, $id, $body, %o) = @_;
    return { path => "/webhooks/$sender", sender => $sender, id => $id,
             body => $body, age => $age++ % 240, %o };
}

# a Standard Webhooks payload, pretty-printed and not ASCII: what the
# receiver verifies is the body byte for byte; "test" steers the receiver
sub payload {
    my ($type, %test) = @_;
    my $test = %test ? ",\n  \"test\": "
        . JSON::PP->new->canonical->encode(\%test) : '';
    return "{\n  \"type\": \"$type\",\n"
        . "  \"timestamp\": \"2027-01-05T10:00:00.000000Z\",\n"
        . "  \"data\": { \"note\": \"café ✓,  two spaces\" }$test\n}\n";
}

# executions (verified) or refusals (rejected) of an event at the receiver
sub count {
    my ($what, $sender, $id) = @_;
    return scalar grep { $_ eq "$what $sender $id\n" } lines_of($log);
}

sub statuses { join ' ', map { $_->{status} } @_ }
sub bodies { my %b = map { $_->{body} => 1 } @_; scalar keys %b }

# at_once(sender, path, id, n): n deliveries of one event while its first
# execution is held; then 3 more, one by one -> (first answers, later)
sub at_once {
    my ($sender, $path, $id, $n) = @_;
    my $body = payload("$sender.event", hold_ms => $hold);
    my @first = deliver(map { d($sender, $id, $body, path => $path) } 1 .. $n);
    my @later = map { sleep 0.1;
                      deliver(d($sender, $id, $body, path => $path)) } 1 .. 3;
    return (\@first, \@later);
}

# --- 1. duplicates at once and later: one execution, the first 2xx to all
{
    my $id = "msg_${run}_once";
    my ($first, $later) = at_once('standard', '/webhooks/standard', $id, 5);
    is(statuses(@$first), '200 200 200 200 200',
       '5 deliveries at once: all get 200');
    is(bodies(@$first), 1, '...the same body');
    is(scalar(grep { $_->{replayed} } @$first), 4,
       '...4 of them the replay of the first');
    ok(!grep({ $_->{ms} < 0.6 * $hold } @$first),
       '...each waited for the first execution: they overlapped it')
        or diag explain [map { $_->{ms} } @$first];
    is(statuses(@$later), '200 200 200', '3 deliveries later: 200');
    ok(!grep({ $_->{body} ne $first->[0]{body} || !$_->{replayed} } @$later),
       '...replays of the same body');
    is(count('verified', 'standard', $id), 1, 'the receiver ran it once');
    like($first->[0]{body}, qr/"run":1/, '...and every answer is that run\'s');

    # without idempotency_wait: the duplicates in flight get 409
    $id = "msg_${run}_nowait";
    ($first, $later) = at_once('standard', '/nowait/standard', $id, 5);
    my @ok = grep { $_->{status} == 200 } @$first;
    my @busy = grep { $_->{status} == 409 } @$first;
    is(scalar(@ok) . ' ' . scalar(@busy), '1 4',
       'without the wait: one 200, and 4 duplicates in flight get 409');
    ok(!grep({ ($_->{retry_after} // '') ne '1' } @busy),
       '...with Retry-After: 1');
    ok(@ok && !grep({ $_->{status} != 200 || $_->{body} ne $ok[0]{body} }
                    @$later),
       '...and the redeliveries get the first 2xx');
    is(count('verified', 'standard', $id), 1, '...run once');
}

# --- 2. a 500 is not stored: the next redelivery runs
{
    my $id = "msg_${run}_500";
    my $body = payload('invoice.paid', fail_runs => 1);
    my ($a) = deliver(d('standard', $id, $body));
    is($a->{status}, 500, 'the receiver fails the first delivery: 500');
    my ($b) = deliver(d('standard', $id, $body));
    is($b->{status}, 200, '...the redelivery runs: 200');
    ok(!$b->{replayed} && $b->{body} =~ /"run":2/, '...a second execution');
    my ($c) = deliver(d('standard', $id, $body));
    ok($c->{status} == 200 && $c->{replayed} && $c->{body} eq $b->{body},
       '...whose 2xx is stored: the next gets its replay');
    is(count('verified', 'standard', $id), 2, '...run twice in all');

    # the default idempotency_store_status stores the 500
    $id = "msg_${run}_500_default";
    ($a) = deliver(d('standard', $id, $body, path => '/storeall/standard'));
    ($b) = deliver(d('standard', $id, $body, path => '/storeall/standard'));
    ok($a->{status} == 500 && $b->{status} == 500 && $b->{replayed},
       'with the default store status, the 500 is replayed to redeliveries')
        or diag explain [$a, $b];
    is(count('verified', 'standard', $id), 1,
       '...and the event never runs again');
}

# --- 3. bad signatures reach the receiver and leave nothing behind
{
    my $id = "msg_${run}_forged";
    my $body = payload('invoice.paid');
    my $other = payload('invoice.refunded');
    my ($a) = deliver(d('standard', $id, $other, bad => 1));
    my ($b) = deliver(d('standard', $id, $body, bad => 1));
    is("$a->{status} $b->{status}", '400 400',
       'a forged and a tampered delivery get the receiver\'s 400');
    like($a->{body}, qr/No matching signature found/,
         '...the library\'s refusal');
    is(count('rejected', 'standard', $id), 2, '...both reached the receiver');
    my ($c) = deliver(d('standard', $id, $body));
    ok($c->{status} == 200 && !$c->{replayed},
       'the genuine delivery then runs: nothing was stored')
        or diag explain $c;
    is(count('verified', 'standard', $id), 1, '...once');

    # a replay is answered without the receiver: no signature check
    my ($d) = deliver(d('standard', $id, $body, bad => 1));
    ok($d->{status} == 200 && $d->{replayed} && $d->{body} eq $c->{body},
       'the same id and body with a bad signature get the stored 2xx');
    is(count('rejected', 'standard', $id), 2, '...without the receiver');
    is(count('verified', 'standard', $id), 1, '...and nothing runs');

    # the default stores the forged 400: the genuine body gets 422
    $id = "msg_${run}_forged_default";
    ($a) = deliver(d('standard', $id, $other, bad => 1,
                     path => '/storeall/standard'));
    ($b) = deliver(d('standard', $id, $body, path => '/storeall/standard'));
    ok($a->{status} == 400 && $b->{status} == 422
       && $b->{body} =~ /key-reused/,
       'with the default store status, a forgery gets the genuine one 422')
        or diag explain [$a, $b];
    is(count('verified', 'standard', $id), 0, '...and it never runs');
    $id = "msg_${run}_tampered_default";
    ($a) = deliver(d('standard', $id, $body, bad => 1,
                     path => '/storeall/standard'));
    ($b) = deliver(d('standard', $id, $body, path => '/storeall/standard'));
    ok($a->{status} == 400 && $b->{status} == 400 && $b->{replayed},
       '...and a tampered one gets it the stored 400')
        or diag explain [$a, $b];
    is(count('verified', 'standard', $id), 0, '...and it never runs');

    # no id: the module's 400; another path: 404; the receiver sees neither
    my $before = () = lines_of($log);
    ($a) = deliver(d('standard', "msg_${run}_noid", $body, noid => 1));
    ok($a->{status} == 400 && $a->{body} =~ /missing-key/,
       'a delivery without webhook-id: 400 missing-key');
    ($b) = deliver(d('standard', "msg_${run}_404", $body,
                     path => '/webhooks/other'));
    is($b->{status}, 404, 'another path under /webhooks/: 404');
    is(scalar(() = lines_of($log)), $before,
       '...neither reaches the receiver');
}

# --- 4. the other senders' header keys
for my $sender (qw(svix github shopify)) {
    my $id = $sender eq 'svix' ? "msg_${run}_svix"
           : "$run-0000-4000-8000-$sender";
    my ($first, $later) = at_once($sender, "/webhooks/$sender", $id, 3);
    is(statuses(@$first, @$later), '200 200 200 200 200 200',
       "$sender: 3 deliveries at once and 3 later get 200");
    is(bodies(@$first, @$later), 1, '...the same body');
    ok(!grep({ $_->{ms} < 0.6 * $hold } @$first),
       '...the duplicates overlapped the first execution');
    is(count('verified', $sender, $id), 1, '...the receiver ran it once');
    my ($bad) = deliver(d($sender, "$id-bad", payload('x'), bad => 1));
    is($bad->{status}, 400, '...a bad signature gets the receiver\'s 400');
    is(count('rejected', $sender, "$id-bad"), 1, '...which it checked');
}
{
    # one scope per sender: another sender's id is another event
    my ($a) = deliver(d('standard', "msg_${run}_svix", payload('x')));
    ok($a->{status} == 200 && !$a->{replayed},
       'the svix event\'s id sent to the standard recipe runs there');
}
{
    # GitHub's delivery id is shared by every webhook of the event
    my $id = "$run-0000-4000-8000-github";
    my $body = payload('github.event');
    my ($a) = deliver(d('github', $id, $body, hook => '2'));
    my ($b) = deliver(d('github', $id, $body, hook => '2'));
    ok($a->{status} == 200 && !$a->{replayed} && $a->{body} =~ /"run":2/,
       'github: the same delivery id for another webhook runs');
    ok($b->{replayed} && $b->{body} eq $a->{body},
       '...and that webhook\'s redelivery replays its own answer');
}

# --- 5. a receiver slower than its sender, and than nginx
{
    my $id = "msg_${run}_slow";
    my $body = payload('invoice.paid', hold_ms => 1200 * $slow);
    my ($a) = deliver(d('standard', $id, $body, timeout => 200 * $slow));
    is($a->{status}, 0, 'a sender that gives up before the receiver answers');
    sleep 1.5 * $slow;
    my ($b) = deliver(d('standard', $id, $body));
    ok($b->{status} == 200 && $b->{replayed},
       '...gets the stored 2xx on its redelivery') or diag explain $b;
    is(count('verified', 'standard', $id), 1, '...run once');

    # longer than proxy_read_timeout: an unknown outcome
    $body = payload('invoice.paid', hold_ms => 900 * $slow);
    for my $on (qw(forward keep)) {
        $id = "msg_${run}_$on";
        my @r = map { my @x = deliver(d('standard', $id, $body,
                                        path => "/$on/standard"));
                      sleep 1.2 * $slow; @x } 1 .. 3;
        is($r[0]{status}, 504, "$on: nginx's 504 after proxy_read_timeout");
        if ($on eq 'forward') {
            ok($r[1]{status} == 200 && $r[1]{body} =~ /"previous":"unknown"/,
               '...the redelivery reaches the receiver, told '
               . 'Idempotency-Previous-Outcome: unknown') or diag explain \@r;
            ok($r[2]{replayed} && $r[2]{body} eq $r[1]{body},
               '...and its 2xx is stored');
            is(count('verified', 'standard', $id), 2, '...run twice in all');
        } else {
            ok($r[1]{status} == 504 && $r[1]{body} =~ /outcome-unknown/
               && $r[2]{status} == 504,
               '...every redelivery gets 504 outcome-unknown')
                or diag explain \@r;
            is(count('verified', 'standard', $id), 1, '...and nothing runs');
        }
    }
}

# --- 6. Stripe: the event's id in its body, signed by Stripe's library
{
    # a Stripe event; "test" steers the receiver as for the others
    my $event = sub {
        my ($id, %test) = @_;
        my $test = %test ? ",\n  \"test\": "
            . JSON::PP->new->canonical->encode(\%test) : '';
        return "{\n  \"id\": \"$id\",\n  \"object\": \"event\",\n"
            . "  \"type\": \"payment_intent.succeeded\",\n"
            . "  \"data\": { \"object\": { \"id\": \"pi_$run\", "
            . "\"description\": \"café ✓\" } }$test\n}\n";
    };
    my $id = "evt_${run}_once";
    my $body = $event->($id, hold_ms => $hold);
    my @first = deliver(map { d('stripe', $id, $body) } 1 .. 5);
    my @later = map { sleep 0.1; deliver(d('stripe', $id, $body)) } 1 .. 3;
    is(statuses(@first, @later), join(' ', ('200') x 8),
       'stripe: 5 deliveries at once and 3 later, each signed afresh, '
       . 'get 200');
    is(bodies(@first, @later), 1, '...the same body');
    ok(!grep({ $_->{ms} < 0.6 * $hold } @first),
       '...the duplicates overlapped the first execution');
    is(count('verified', 'stripe', $id), 1,
       '...constructEvent() verified one execution: the id came from /id');

    $id = "evt_${run}_500";
    $body = $event->($id, fail_runs => 1);
    my ($a) = deliver(d('stripe', $id, $body));
    my ($b) = deliver(d('stripe', $id, $body));
    my ($c) = deliver(d('stripe', $id, $body));
    ok($a->{status} == 500 && $b->{status} == 200 && !$b->{replayed}
       && $c->{replayed} && $c->{body} eq $b->{body},
       'stripe: a 500 is not stored, the redelivery runs and is stored')
        or diag explain [$a, $b, $c];
    is(count('verified', 'stripe', $id), 2, '...run twice in all');

    $id = "evt_${run}_forged";
    $body = $event->($id);
    ($a) = deliver(d('stripe', $id, $body, bad => 1));
    like($a->{body}, qr/No signatures found matching the expected signature/,
         'stripe: a forged delivery gets constructEvent()\'s refusal');
    ($b) = deliver(d('stripe', $id, $body));
    ok($b->{status} == 200 && !$b->{replayed},
       '...and the genuine one then runs');

    my $before = () = lines_of($log);
    (my $noid = $body) =~ s/"id": "\Q$id\E",\n//;
    ($a) = deliver(d('stripe', $id, $noid));
    ok($a->{status} == 400 && $a->{body} =~ /missing-key/
       && $a->{body} =~ /no member at \/id/,
       'stripe: an event without an id: 400 missing-key, naming /id')
        or diag explain $a;
    ($b) = deliver(d('stripe', $id, 'not json'));
    ok($b->{status} == 400 && $b->{body} =~ /invalid-key/,
       '...a body that is not JSON: 400 invalid-key');
    is(scalar(() = lines_of($log)), $before,
       '...neither reaches the receiver');
}

is(scalar log_problems("$dir/logs/error.log"), 0, 'no crash or alert');

done_testing();
