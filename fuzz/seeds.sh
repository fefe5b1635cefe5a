#!/usr/bin/env bash
# Writes the hand-made seed inputs into fuzz/corpus/<target>/seed-*.
# The committed corpora are these seeds plus what the fuzzers found,
# minimised with -merge=1 (./fuzz/run.sh --merge); rerun this only to
# start over.
set -euo pipefail
cd "$(dirname "$0")"

k=corpus/key r=corpus/record t=corpus/roundtrip s=corpus/resp j=corpus/json
mkdir -p "$k" "$r" "$t" "$s" "$j"

# --- key: byte 0 is max - 1 (0xff: 1024), then the header value -----------
key() { perl -e 'print pack("C", shift), shift' "$1" "$2" > "$k/seed-$3"; }
key 254 'abc'                                   token
key 254 '8e0bd6c4-04a1-4a9f-9d2c-61a1f2e1b7c3'  uuid
key 35  '8e0bd6c4-04a1-4a9f-9d2c-61a1f2e1b7c3'  uuid-max36
key 34  '8e0bd6c4-04a1-4a9f-9d2c-61a1f2e1b7c3'  uuid-max35
key 254 '"abc"'                                 sf-string
key 254 '"a b\"c\\\\d"'                         sf-escapes
key 254 '"\""'                                  sf-quote
key 254 '""'                                    sf-empty
key 254 '"abc'                                  sf-unterminated
key 254 '"abc"x'                                sf-trailing
key 254 '"a\x"'                                 sf-bad-escape
key 254 '"abc\'                                 sf-backslash-end
key 254 'a,b'                                   comma
key 254 'a b'                                   space
key 254 "$(printf 'ab\tc')"                     tab
key 0   'ab'                                    max1
key 255 "$(perl -e 'print "k" x 300')"          long
perl -e 'print "\xfe", "\"ab\x7f\""' > "$k/seed-del"
perl -e 'print "\xfe", "ab\x80"'     > "$k/seed-8bit"
printf '\x10' > "$k/seed-empty"

# --- records: "IDM1" | state | fingerprint[32] | token[16] | ... -----------
head() { perl -e 'printf "IDM1%c%s%s", $ARGV[0], "F" x 32, "T" x 16' "$1"; }

head 1 > "$r/seed-claim"
{ head 3; printf '\x01\xf5'; } > "$r/seed-too-large-501"
{ head 2; perl -e 'print pack("nN", 200, 2),
    pack("N/a*N/a*", "Content-Type", "application/json"),
    pack("N/a*N/a*", "Location", "/v1/charges/ch_1"),
    pack("NN", 0, 14), q({"id":"ch_1"}) . "\n"'; } > "$r/seed-done-2h"
{ head 2; perl -e 'print pack("nN", 201, 0), pack("NN", 0, 0)'; } \
    > "$r/seed-done-empty"
{ head 2; perl -e 'print pack("nN", 422, 1),
    pack("N/a*N/a*", ":status-line", "422 Unprocessable"),
    pack("NN", 0, 2), "no"'; } > "$r/seed-done-status-line"
{ head 2; perl -e 'print pack("nN", 204, 1), pack("N/a*N", "X-Empty", 0),
    pack("NN", 0, 0)'; } > "$r/seed-done-empty-value"
{ head 4; perl -e 'print pack("nN", 200, 1),
    pack("N/a*N/a*", "Content-Type", "application/grpc"),
    pack("NN", 0, 7), "\0\0\0\0\2ok", pack("N", 2),
    pack("N/a*N/a*", "grpc-status", "10"),
    pack("N/a*N/a*", "grpc-message", "aborted")'; } > "$r/seed-done-trailers"
{ head 4; perl -e 'print pack("nN", 200, 0), pack("NN", 0, 0),
    pack("N", 0)'; } > "$r/seed-done-no-trailers"
head 4 > "$r/seed-trailers-head-only"
head 5 > "$r/seed-bad-state"
{ head 1; printf 'x'; } > "$r/seed-claim-trailing"

# --- round trip: flags | status(2) | store_max_size(2) | fields on LF ------
rt() { perl -e 'print pack("Cnn", @ARGV[0..2]), join("\n", @ARGV[3..$#ARGV])' "$@"; }
rt 3 0     4096 'application/json' '200 OK' 'Location' '/v1/x' 'X-Id' '7' \
    '{"ok":true}'                                         > "$t/seed-known"
rt 5 1     4096 'text/plain' 'Set-Cookie' 'a=b' 'Connection' 'close' \
    'Proxy-Foo' '1' 'ETag' '"x"' 'chunked body'           > "$t/seed-unknown"
rt 8 4     4096 'X-A' '1' 'body of a HEAD'                > "$t/seed-header-only"
rt 37 0    4096 'application/grpc' 'grpc-encoding' 'identity' \
    'grpc-status' '0' 'X-Trailer' 'charge-1' 'ok' \
                                                          > "$t/seed-trailers"
rt 36 0    4096 'X-A' '1' 'Set-Cookie' 'c=d' 'body' \
                                                          > "$t/seed-trailer-hidden"
rt 1 0     60   'text/plain' 'too large'                  > "$t/seed-declined"
rt 0 222   4096 "$(printf '\x7fdeleted')" 'v' 'Date' 'x' 'CONTENT-LENGTH' '9' \
    'x-hide-me' 'y' 'te' 'z' ''                           > "$t/seed-skipped"

# --- resp: byte 0 = the argument to replace (bit 7: raw bytes) | pieces ---
printf '\x02EVALSHA\nabc\n1\nkey\nXYZ'                       > "$s/seed-evalsha"
printf '\x04SET\nkey\nvalue\nIFEQ\nold\nGET\nPX\n5\nnewclaim'  > "$s/seed-native"
printf '\x84*3\r\n$3\r\nSET\r\n$1\r\nk\r\n$1\r\nv\r\n'       > "$s/seed-raw"

# --- json: byte 0 is max - 1 (0xff: 1024), the pointer, LF, the body -------
js() { perl -e 'print pack("C", shift), shift, "\n", shift' "$1" "$2" "$3" \
           > "$j/seed-$4"; }
js 254 /id '{"id":"8e0bd6c4-04a1-4a9f-9d2c-61a1f2e1b7c3"}'  string
js 254 /id '{"id":-12}'                                     integer
js 254 /data/object/id \
    '{"type":"charge.succeeded","data":{"object":{"id":"ch_1","amount":1e3,
    "tags":["a","b"],"ok":true,"none":null}},"id":"evt_1"}'   nested
js 254 '/a~1b/~0c/1' '{"a/b":{"~c":["k",17]}}'              escaped-pointer
js 254 /items/0 '{"items":{"0":"by name"}}'                 index-as-name
js 254 /items/1 '[{"items":0},{"items":["x","y"]}]'         array-miss
js 254 /items/- '{"items":["v"]}'                           dash
js 254 / '{"":"empty name"}'                                empty-token
js 254 /id '{"id":"a","id":"b"}'                            twice
js 254 /data/id '{"data":{},"data":{"id":"x"}}'             twice-above
js 254 /id '{"\u0069d":"A\u0042\/\"\\"}'                    escapes
js 254 /id '{"id":"\ud83d\ude00"}'                          surrogates
js 254 /x '{"id":"\ud83d","x":1}'                           lone-high
js 254 /x '{"\udc00":1}'                                    lone-low
js 254 /x '{"\ud83d\ue000":1}'                              high-not-low
js 254 /id '{"id":1.5e-3}'                                  fraction
js 254 /id '{"id":[true,false,null]}'                       array
js 254 /id '{"id":{}}'                                      object
js 254 /id '{"id":""}'                                      empty
js 2   /id '{"id":"abcd"}'                                  too-long
js 254 /id '{"id":"x",}'                                    trailing-comma
js 254 /id '{"id":"x"} {}'                                  two-values
js 254 /id '  -0.5e+7 '                                     top-number
js 254 /id ''                                               no-body
js 254 /id '{"id":"x"'                                      truncated
js 254 ''  '{}'                                             whole-document
js 254 /a~2 '{}'                                            bad-tilde
js 254 /id "$(perl -e 'print "[" x 64, "]" x 64')"          depth-64
js 254 /id "$(perl -e 'print "[" x 65, "]" x 65')"          depth-65
js 254 "$(perl -e 'print "/0" x 64')" \
    "$(perl -e 'print "[" x 64, "1", "]" x 64')"            pointer-64
perl -e 'print "\xfe/id\n{\"id\":\"caf\xc3\xa9\",\"\xf0\x9f\x98\x80\":1}"' \
    > "$j/seed-utf8"
perl -e 'print "\xfe/id\n{\"a\":\"\xc0\xaf\xed\xa0\x80\xf4\x90\x80\x80\"}"' \
    > "$j/seed-bad-utf8"
perl -e 'print "\xfe/id\n\xef\xbb\xbf{\"id\":\"bom\"}"' > "$j/seed-bom"
perl -e 'print "\xfe/id\n{\"id\":\"a\x01b\"}"'          > "$j/seed-control"
