# The protocol model (model/idempotency.pml) checked by SPIN: every correct
# configuration passes, every mutant, hole and setting outside the promise
# fails with the property it is meant to break (model/run.sh judges that).
# Plain Test::More around model/run.sh: one test per configuration.
use strict;
use warnings;
use Test::More;

plan skip_all => 'spin is not installed (util/deps.sh installs it)'
    unless `which spin 2>/dev/null`;

my $out = `./model/run.sh 2>&1`;
my $rc = $? >> 8;

my @lines = grep { /^model: / } split /\n/, $out;
ok(@lines >= 20, scalar(@lines) . ' configurations checked') or diag $out;

for (@lines) {
    my ($name) = /^model: (\S+)/;
    unlike($_, qr/check failed/, $name) or diag $_;
}

my ($passed, $failed) = $out =~ /^(\d+) passed, (\d+) failed$/m;
is($failed, 0, "the model's own count: $passed passed") or diag $out;
is($rc, 0, 'model/run.sh exits 0');

done_testing();
