#!/usr/bin/perl
# Reads the AddressSanitizer logs in DIR; fails on any memory error and on
# any leak whose allocation stack passes through the module, hiredis or
# libcrypto.  Leaks allocated by nginx alone (its cycle, freed by the OS at
# exit) are counted and reported as such.
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

        } elsif ($para =~ /^(Direct|Indirect) leak of/m) {
            if ($para =~ /idempotency|hiredis|libcrypto/) {
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
