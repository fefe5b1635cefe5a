package RecordBytes;

# Bytes as they are: the module's records in the test Redis (redis-cli
# could add or eat newlines, so values travel in hex through Lua), files
# (key files, bodies), and a header of a raw answer of Fleet's http_post.

use strict;
use warnings;
use Fleet qw(redis_cli);
use Time::HiRes qw(sleep);
use Exporter 'import';

our @EXPORT = qw(hdr record write_record stored write_file);

my $slow = $ENV{TEST_ASAN} ? 3 : 1;

# write_file(path, bytes, mode) -> path
sub write_file {
    my ($path, $bytes, $mode) = @_;
    open my $fh, '>', $path or die "$path: $!";
    binmode $fh;
    print $fh $bytes;
    close $fh;
    chmod $mode, $path if defined $mode;
    return $path;
}

# hdr(answer, name) -> the value of its first such header, or undef
sub hdr {
    my ($r, $name) = @_;
    my ($v) = $r->{head} =~ /^\Q$name\E: ([^\r\n]*)/mi;
    return $v;
}

# record(key) -> the stored value ("" if none)
sub record {
    my $k = shift;
    my $hex = redis_cli('EVAL', 'local v = redis.call("GET", KEYS[1]) '
                        . 'if not v then return "" end '
                        . 'return (v:gsub(".", function(c) '
                        . 'return string.format("%02x", c:byte()) end))',
                        1, $k);
    return pack 'H*', $hex;
}

# write_record(key, bytes): what a Redis writer does, any bytes, 10 minutes
sub write_record {
    my ($k, $bytes) = @_;
    redis_cli('EVAL', 'redis.call("SET", KEYS[1], (ARGV[1]:gsub("..", '
              . 'function(h) return string.char(tonumber(h, 16)) end)), '
              . '"PX", 600000) return 1', 1, $k, unpack('H*', $bytes));
}

# stored(key) -> the record once stored (the store is sent after the
# response): more than a head, and no longer a claim
sub stored {
    my $k = shift;
    for (1 .. 40 * $slow) {
        my $v = record($k);
        return $v if length $v > 53 && substr($v, 4, 1) ne "\x01";
        sleep 0.05;
    }
    return record($k);
}

1;
