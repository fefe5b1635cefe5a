# The layers of src/ (docs/design.md, "The layers"): util/layers.py passes
# on the tree as it is, and fails on copies of it with one breach each, so
# the check itself is known to bite.
use strict;
use warnings;
use Test::More;
use File::Temp qw(tempdir);

my $out = `python3 util/layers.py 2>&1`;
is($? >> 8, 0, 'util/layers.py passes on src/') or diag $out;
like($out, qr/nothing calls up the stack/, 'it says so');

# one breach per copy: the file to change, what to add, what must be said
my @breaches = (
    ['redis/ngx_http_idempotency_conn.c',
     "void f(void) { ngx_http_idempotency_lease_renew(0, 0, 0, 0, 0); }\n",
     qr/conn\.c names ngx_http_idempotency_lease_renew, which store/,
     'redis/ calls a store/ function'],
    ['store/ngx_http_idempotency_retry.c',
     "void f(void) { ngx_http_idempotency_metrics_fresh_key(); }\n",
     qr/retry\.c names ngx_http_idempotency_metrics_fresh_key, which http/,
     'store/ calls an http/ function'],
    ['http/ngx_http_idempotency_reply.c',
     "void f(void) { (void) ngx_http_idempotency_init_module(0); }\n",
     qr/reply\.c names ngx_http_idempotency_init_module, which ngx_http_idem/,
     'http/ calls the wiring'],
    ['store/ngx_http_idempotency_lease.c',
     "#include \"ngx_http_idempotency_http.h\"\n",
     qr/lease\.c:\d+ includes ngx_http_idempotency_http\.h/,
     'store/ includes the http header'],
    ['redis/ngx_http_idempotency_input.c',
     "static ngx_http_request_t  *r;\n",
     qr/input\.c:\d+ sees the request/,
     'redis/ sees a request'],
    ['store/ngx_http_idempotency_record.c',
     "static void *f(ngx_conf_t *cf) { return ngx_http_conf_get_module_loc_conf(cf, ngx_http_core_module); }\n",
     qr/record\.c:\d+ sees the request/,
     'store/ reads the http configuration'],
    ['redis/ngx_http_idempotency_node.c',
     "static int f(ngx_http_idempotency_redis_t *redis) { return redis->seeds != NULL; }\n",
     qr/node\.c:\d+ asks the topology/,
     'the client asks which topology'],
    ['http/ngx_http_idempotency_reply.c',
     "static int f(u_char *head) { return head[4] == 2; }\n",
     qr/reply\.c:\d+ reads a record's bytes/,
     'http/ reads a record head\'s state byte'],
    ['http/ngx_http_idempotency_admin.c',
     "static int f(u_char *p) { return ngx_memcmp(p, NGX_HTTP_IDEMPOTENCY_MAGIC, 4); }\n",
     qr/admin\.c:\d+ reads a record's bytes/,
     'http/ checks the magic itself'],
    ['http/ngx_http_idempotency_outcome.c',
     "static int f(redisReply *reply) { return reply->type == REDIS_REPLY_NIL; }\n",
     qr/outcome\.c:\d+ reads Redis past the store/,
     'http/ reads a reply'],
    ['http/ngx_http_idempotency_key.c',
     "static int\nngx_http_idempotency_long(void)\n{\n" . ("    ;\n" x 148) . "}\n",
     qr/key\.c:\d+ ngx_http_idempotency_long has 151 lines, more than 150/,
     'a function over 150 lines'],
    ['http/ngx_http_idempotency_fresh.c',
     "static void *f(ngx_http_idempotency_redis_t *r) { return ngx_http_idempotency_op_alloc(r); }\n",
     qr/fresh\.c:\d+ reads Redis past the store/,
     'http/ allocates a command of the client'],
);

for my $b (@breaches) {
    my ($file, $add, $want, $name) = @$b;
    my $dir = tempdir(CLEANUP => 1);
    system('cp', '-r', 'src', $dir) == 0 or die "cp: $!";
    open(my $fh, '>>', "$dir/src/$file") or die "$file: $!";
    print $fh "\n$add";
    close $fh;

    my $got = `python3 util/layers.py $dir/src 2>&1`;
    is($? >> 8, 1, "$name: fails") or diag $got;
    like($got, $want, "$name: says where") or diag $got;
}

# a comment or a string naming a higher layer is no breach
my $dir = tempdir(CLEANUP => 1);
system('cp', '-r', 'src', $dir) == 0 or die "cp: $!";
open(my $fh, '>>', "$dir/src/redis/ngx_http_idempotency_conn.c") or die;
print $fh "\n/* ngx_http_idempotency_lease_renew() and ngx_http_request_t */\n"
        . "static char *s = \"ngx_http_idempotency_metrics_fresh_key\";\n";
close $fh;
$out = `python3 util/layers.py $dir/src 2>&1`;
is($? >> 8, 0, 'comments and strings are not read') or diag $out;

done_testing();
