#!/usr/bin/perl
# Reads the AddressSanitizer logs in DIR; fails on any memory error and on
# any leak whose allocation stack passes through the module, hiredis or
# libcrypto, unless the memory is a block of an nginx pool.  Leaks
# allocated by nginx alone (its cycle and pools, freed by the OS at exit)
# are counted and reported as such.
use strict;
use warnings;

my $dir = shift or die "usage: $0 DIR\n";
my ($errors, $ours, $nginx) = (0, 0, 0);

for my $f (glob "$dir/asan*") {
    open my $fh, '<', $f or die "$f: $!";
    local $/;
    my $log = <$fh>;

    for my $para (split /\n\n/, $log) {
        if ($para =~ /ERROR: AddressSanitizer/) {
            $errors++;
            print STDERR "$f:\n$para\n\n";

        } elsif ($f =~ m{/asan-cycle\.[^/]*$}
                 && $para =~ /^Indirect leak of/m)
        {
            # nginx -t, -T or -s (util/nginx-asan.sh) never destroys the
            # cycle it parsed: what its pool blocks (direct, nginx's) held
            # is left with them, freed by pool cleanups everywhere else;
            # a direct leak there still counts
            $nginx++;

        } elsif ($para =~ /^(Direct|Indirect) leak of/m) {
            # a block of an nginx pool (the cycle's, left to the OS) is
            # nginx's, whichever allocation happened to need a new block;
            # arrays and lists in a pool grow by new pool blocks too
            my @top = grep { /^\s+#[0-4] / } split /\n/, $para;
            my $pool = grep { /\bngx_(?:palloc|pcalloc|pnalloc|pmemalign|create_pool|array_push|array_push_n|list_push)\b/ }
                       @top;

            # nginx's PCRE2 compile context: made by the first
            # ngx_regex_compile() of a process, whoever calls it (map,
            # idempotency_key_pattern), kept by nginx, left at exit
            $pool ||= grep { /\bpcre2_compile_context_create/ } @top;
            if (!$pool && $para =~ /idempotency|hiredis|libcrypto/) {
                $ours++;
                print STDERR "$f:\n$para\n\n";
            } else {
                $nginx++;
            }
        }
    }
}

print "AddressSanitizer: $errors errors, $ours leaks from the module, "
    . "$nginx allocations left by nginx itself at exit (not ours)\n";

exit($errors || $ours ? 1 : 0);
