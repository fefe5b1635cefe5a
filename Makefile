# ngx_http_idempotency_module
#
#   make            build the module against Debian's nginx (nginx-dev)
#                   into build/ (the same as make module)
#   make module     the same: build/ngx_http_idempotency_module.so
#   make deps       install what is missing of the packages the build, the
#                   tests, the bench and make deb need (util/deps.sh)
#   make clean      remove build/, build-asan/ and the tests' t/servroot*
#   make test       install what is missing, build, run the suite on a
#                   private Redis
#   make test-asan  the same with the module built under AddressSanitizer
#   make demo       a running demo with curl output (installs only what it
#                   needs); make demo KEEP=1 leaves its servers running and
#                   prints what to try and how to stop them
#   make bench      the module's cost, measured with wrk against the same
#                   nginx without it (scenarios and knobs: bench/run.sh's
#                   header; figures: docs/performance.md)
#   make fuzz       libFuzzer targets, FUZZ_SECONDS (300) each (fuzz/README.md)
#   make torture    faults, load, reload, soak at full size, the fault
#                   campaign, then 5 min of fuzzing per parser (about 20 min)
#   make faults     the fault campaign (faults/campaign.py, about 3 min):
#                   retried POSTs through two nginx under one fault per
#                   round, every key judged; regenerates docs/faults.md
#   make durability what each Redis persistence setting loses on kill -9
#   make deb        the Debian package libnginx-mod-http-idempotency in
#                   build/deb/ (dh_nginx); prints the .deb's path last
#   make deb-test   make deb, then install it with apt-get, nginx -t, a smoke
#                   test on a private nginx and Redis, and purge it (root)
#   make install    the .so into $(DESTDIR)$(MODULES_DIR), docs into
#                   $(DESTDIR)$(DOCDIR), for layouts other than Debian's
#   make version-check  src/ngx_http_idempotency_version.h, CHANGELOG.md
#                   and debian/changelog name the same version
#   make check-nginx NGINX_SRC=DIR  build the module with -Werror against
#                   the nginx source tree DIR (a release or a git checkout,
#                   or its tarball) in 3 configurations
#                   (docs/compatibility.md)
#   make test FORK=angie  the suite (or TEST_FILES) against a server built
#                   from its release tarball in FORKS_DIR with this module,
#                   the echo and the perl modules (util/forks.sh; nginx,
#                   freenginx, angie, tengine), in build/forks/NAME
#   make test-forks the same for each of FORKS (all four); FORKS_FILES
#                   picks the files (FORKS_FILES=core: the five files on
#                   the nginx internals the module reads, FORKS_CORE)
#   make test-topologies  the tests that run on Redis topologies (TLS,
#                   Cluster, Sentinel, replicas: util/topology.sh) and
#                   the DNS stub: the files of t/ with a line
#                   "# topology: yes", each on the fixed ports its
#                   header names
#   make model      the protocol model checked by SPIN (model/README.md),
#                   every configuration, about 2 minutes
#   make test-valkey  the whole suite, topologies included, on Valkey
#                   instead of Redis (util/valkey.sh installs it; on
#                   Debian 12 from bookworm-backports)
#   make test-trixie  the whole suite on Debian 13 (trixie) in a cached
#                   debootstrap root, once with its redis-server and once
#                   with its valkey-server, then the server-dependent
#                   files with Valkey 9 and Redis 8.6 (Debian testing and
#                   experimental), each in private network, PID and mount
#                   namespaces (util/trixie.sh; root, ~35 min)
#   make bench-trixie  the bench (fresh, replay, bypass, large-fresh,
#                   large-replay) in that Debian 13 root: Valkey 8.1 on
#                   the script path and on the native path (an ACL user
#                   without @scripting), Redis 8.0 on the script path
#                   (util/trixie.sh bench; root, ~15 min)

SHELL      := /bin/bash
NGINX_SRC  ?= /usr/share/nginx/src
NGINX_BIN  ?= /usr/sbin/nginx
BUILD      ?= $(CURDIR)/build
MODULE      = $(BUILD)/ngx_http_idempotency_module.so
SRCS        = config $(wildcard src/*.[ch] src/*/*.[ch])
EXTRA_CFLAGS ?=
VERSION    := $(shell sed -n \
    's/^\#define NGX_HTTP_IDEMPOTENCY_VERSION *"\(.*\)"/\1/p' \
    src/ngx_http_idempotency_version.h)

# make install: PREFIX/lib/nginx/modules is the distributions' layout
# (Debian, Fedora: /usr/lib/nginx/modules, or lib64); an nginx built from
# source with the defaults looks in /usr/local/nginx/modules: set
# MODULES_DIR to your nginx's --modules-path (nginx -V shows it)
PREFIX      ?= /usr/local
MODULES_DIR ?= $(PREFIX)/lib/nginx/modules
DOCDIR      ?= $(PREFIX)/share/doc/ngx_http_idempotency_module

export TEST_NGINX_REDIS_PORT ?= 16379

# the servers of util/forks.sh, and their release tarballs
FORKS      ?= nginx freenginx angie tengine
export FORKS_DIR ?= $(CURDIR)/../shared/forks
# what the module reads of nginx's internals: the request's lifecycle, the
# upstream's state at most once depends on, the TLS library encryption
# uses, HTTP/2 request bodies and gRPC trailers, reload and worker exit
FORKS_CORE  = t/001-lifecycle.t t/044-at-most-once.t t/048-encrypt.t \
              t/014-grpc.t t/021-hostile.t t/020-torture.t
FORKS_FILES ?=
# what building the servers needs beyond make deps: PCRE, zlib, and perl's
# headers for the perl module
FORKS_DEPS  = libpcre2-dev zlib1g-dev libperl-dev

.PHONY: all module deps clean test test-forks test-asan test-topologies test-valkey \
        test-trixie bench-trixie demo bench durability torture faults fuzz \
        model version-check check-nginx deb deb-test install

all: module

module: $(MODULE)

$(MODULE): $(SRCS)
	./util/build.sh "$(NGINX_SRC)" "$(BUILD)" "$(EXTRA_CFLAGS)"

deps:
	./util/deps.sh

test: deps
ifeq ($(FORK),)
	$(MAKE) module
	./util/test.sh "$(MODULE)"
else
	./util/deps.sh $(FORKS_DEPS)
	./util/forks.sh test $(FORK)
endif

test-forks: deps
	./util/deps.sh $(FORKS_DEPS)
	FORKS_FILES="$(if $(filter core,$(FORKS_FILES)),$(FORKS_CORE),$(FORKS_FILES))" \
	    ./util/forks.sh test $(FORKS)

test-asan: deps
	$(MAKE) module BUILD=$(BUILD)-asan \
	    EXTRA_CFLAGS="-fsanitize=address -fno-omit-frame-pointer"
	TEST_ASAN=1 ./util/test.sh "$(BUILD)-asan/ngx_http_idempotency_module.so"

demo:
	./util/deps.sh --demo
	$(MAKE) module
	DEMO_KEEP="$(or $(DEMO_KEEP),$(KEEP))" ./demo/run.sh "$(MODULE)"

bench: deps
	$(MAKE) module
	./bench/run.sh "$(MODULE)"

durability: deps
	$(MAKE) module
	./bench/durability.sh "$(MODULE)"

torture: deps
	$(MAKE) module
	TORTURE_FULL=1 TEST_FILES="t/004-conflict.t t/005-redis.t \
	    t/007-input.t t/020-torture.t t/030-soak.t" \
	    ./util/test.sh "$(MODULE)"
	./faults/run.sh "$(MODULE)"
	FUZZ_SECONDS=$${FUZZ_SECONDS:-300} ./fuzz/run.sh key record json

faults: deps
	$(MAKE) module
	./faults/run.sh "$(MODULE)" docs/faults.md

clean:
	rm -rf $(BUILD) $(BUILD)-asan t/servroot*

# The tests that run on util/topology.sh's topologies or the DNS stub
# (t/lib/DnsStub.pm): each says so by a line "# topology: yes" in its
# header comment. `make test` runs them too, among all the others.
TOPOLOGY_TESTS = $(sort $(shell grep -l '^\# topology: yes\b' t/*.t))

test-topologies: deps
	$(MAKE) module
	TEST_FILES="$(TOPOLOGY_TESTS)" ./util/test.sh "$(MODULE)"

# REDIS_SERVER, REDIS_SENTINEL and REDIS_CLI choose the server for
# util/redis.sh, util/topology.sh and the tests
test-valkey: deps
	./util/valkey.sh
	$(MAKE) module
	REDIS_SERVER=valkey-server REDIS_SENTINEL=valkey-sentinel \
	    REDIS_CLI=valkey-cli ./util/test.sh "$(MODULE)"

# Debian 13 in a debootstrap root from this machine's own apt sources,
# kept in TRIXIE_ROOT; logs in build/trixie (util/trixie.sh's header)
test-trixie:
	./util/trixie.sh

bench-trixie:
	./util/trixie.sh bench

fuzz: deps
	$(MAKE) module
	FUZZ_SECONDS=$${FUZZ_SECONDS:-300} ./fuzz/run.sh

version-check:
	@./util/version-check.sh

model:
	./model/run.sh

check-nginx:
	./util/check-nginx.sh "$(NGINX_SRC)"

deb:
	@./util/deb.sh "$(BUILD)/deb"

deb-test:
	./util/deb-test.sh "$(BUILD)/deb"

install: $(MODULE)
	install -d "$(DESTDIR)$(MODULES_DIR)" "$(DESTDIR)$(DOCDIR)"
	install -m 644 "$(MODULE)" "$(DESTDIR)$(MODULES_DIR)/"
	install -m 644 README.md CHANGELOG.md LICENSE docs/design.md \
	    docs/directives.md docs/operations.md docs/compatibility.md \
	    "$(DESTDIR)$(DOCDIR)/"
	@echo "installed ngx_http_idempotency_module $(VERSION)" \
	    "into $(DESTDIR)$(MODULES_DIR)"
