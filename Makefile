# ngx_http_idempotency_module
#
#   make            build the module against Debian's nginx (nginx-dev)
#   make test       install what is missing, build, run the suite on a
#                   private Redis
#   make test-asan  the same with the module built under AddressSanitizer
#   make demo       a running demo with curl output
#   make fuzz       libFuzzer targets, FUZZ_SECONDS (300) each (fuzz/README.md)
#   make torture    faults, load, reload, soak at full size, then 5 min of
#                   fuzzing per parser (about 13 min)

SHELL      := /bin/bash
NGINX_SRC  ?= /usr/share/nginx/src
NGINX_BIN  ?= /usr/sbin/nginx
BUILD      ?= $(CURDIR)/build
MODULE      = $(BUILD)/ngx_http_idempotency_module.so
SRCS        = config $(wildcard src/*.c src/*.h)
EXTRA_CFLAGS ?=

export TEST_NGINX_REDIS_PORT ?= 16379

.PHONY: all module deps test test-asan demo bench torture clean fuzz

all: module

module: $(MODULE)

$(MODULE): $(SRCS)
	./util/build.sh "$(NGINX_SRC)" "$(BUILD)" "$(EXTRA_CFLAGS)"

deps:
	./util/deps.sh

test: deps
	$(MAKE) module
	./util/test.sh "$(MODULE)"

test-asan: deps
	$(MAKE) module BUILD=$(BUILD)-asan \
	    EXTRA_CFLAGS="-fsanitize=address -fno-omit-frame-pointer"
	TEST_ASAN=1 ./util/test.sh "$(BUILD)-asan/ngx_http_idempotency_module.so"

demo: deps
	$(MAKE) module
	./demo/run.sh "$(MODULE)"

bench: deps
	$(MAKE) module
	./bench/run.sh "$(MODULE)"

torture: deps
	$(MAKE) module
	TORTURE_FULL=1 TEST_FILES="t/004-conflict.t t/005-redis.t \
	    t/007-input.t t/020-torture.t t/030-soak.t" \
	    ./util/test.sh "$(MODULE)"
	FUZZ_SECONDS=$${FUZZ_SECONDS:-300} ./fuzz/run.sh key record

clean:
	rm -rf $(BUILD) $(BUILD)-asan t/servroot*

fuzz: deps
	$(MAKE) module
	FUZZ_SECONDS=$${FUZZ_SECONDS:-300} ./fuzz/run.sh
