# kvq - GNU Makefile. Targets:
#   make            build/libkvq.a, build/libkvq.so, build/kvq
#   make examples   the example programs $(BUILD)/examples/<name> (examples/*.c)
#   make deps       installs (as root) or names what the test suites need (tests/deps.sh)
#   make check      tests/deps.sh, then every suite (SUITES="tests python": only those) (tests, examples, install, Python, ASan+UBSan, TSan,
#                   valgrind), each logged to $(BUILD)/check-logs/<suite>.log, then one
#                   summary line; it fails when any suite failed
#   make bench      the benchmarks (kvq bench ...)
#   make vs-llamacpp  kvq against the real llama.cpp's KV caches (docs/vs-llamacpp.md)
#   make demo       the main job, printed as a table
#   make install PREFIX=/usr/local [DESTDIR=...]   headers, libraries, kvq, kvq.pc, kvq.1
#   make uninstall PREFIX=/usr/local [DESTDIR=...] removes what install put there
#   make fuzz       libFuzzer targets $(BUILD)/fuzz_<target> (clang); make fuzz-long FUZZ_SECONDS=N
# BUILD=dir selects the build folder (helpers and sanitizer builds use their own).
# SAN=1 builds with AddressSanitizer + UndefinedBehaviorSanitizer.
# HIREDIS=0 builds without the Redis store even when pkg-config finds hiredis.
# The build runs JOBS jobs at once (default: the number of CPUs) unless the
# command line gives -j: make -j1 or make JOBS=1 builds one thing at a time.

JOBS ?= $(shell nproc 2>/dev/null || getconf _NPROCESSORS_ONLN 2>/dev/null || echo 1)
ifeq ($(MAKELEVEL),0)
  ifeq ($(filter -j% j%,$(MAKEFLAGS)),)
    ifeq ($(filter clean,$(MAKECMDGOALS)),)
      MAKEFLAGS += -j$(JOBS)
    endif
  endif
endif

CC       ?= cc
BUILD    ?= build
PREFIX   ?= /usr/local
BINDIR   ?= $(PREFIX)/bin
LIBDIR   ?= $(PREFIX)/lib
INCLUDEDIR ?= $(PREFIX)/include
MANDIR   ?= $(PREFIX)/share/man
DATA     ?= ../shared/data
PYTHON   ?= /usr/bin/python3

OPT      ?= -O2
WARN     := -Wall -Wextra -Wshadow -Wstrict-prototypes -Wmissing-prototypes -Wno-missing-field-initializers
BASEFLAGS := -std=c11 -D_GNU_SOURCE -ffp-contract=off -fPIC -fvisibility=hidden -Iinclude -g
ifeq ($(SAN),1)
  OPT    := -O1
  SANFLAGS := -fsanitize=address,undefined -fno-sanitize-recover=all -fno-omit-frame-pointer
endif
ifeq ($(TSAN),1)
  OPT    := -O1
  SANFLAGS := -fsanitize=thread -fno-omit-frame-pointer
endif
CFLAGS_ALL := $(BASEFLAGS) $(OPT) $(WARN) $(SANFLAGS) $(CFLAGS)
LDLIBS   := -lm -lpthread

# The Redis store (src/tier/store_redis.c) needs hiredis, found with pkg-config.
HIREDIS  ?= auto
ifneq ($(HIREDIS),0)
  HIREDIS_FOUND := $(shell pkg-config --exists hiredis 2>/dev/null && echo 1)
endif
ifeq ($(HIREDIS_FOUND),1)
  HIREDIS_CFLAGS := -DKVQ_HAVE_HIREDIS $(shell pkg-config --cflags hiredis)
  LDLIBS += $(shell pkg-config --libs hiredis)
else ifneq ($(filter check-suites,$(MAKECMDGOALS))$(if $(filter 0,$(MAKELEVEL)),$(if $(filter check deps clean uninstall,$(MAKECMDGOALS)),,1)),)
  # said once: by the make that builds (make check's is the one after deps.sh)
  ifeq ($(HIREDIS),0)
    $(info HIREDIS=0: the Redis store is disabled)
  else
    $(info hiredis not found: the Redis store is disabled)
  endif
endif
AVX2FLAGS := -mavx2 -mfma -mf16c -mbmi2
FUZZ_CC  ?= clang

# The build tracks its configuration: $(BUILD)/config.txt holds what the
# objects depend on besides their sources (the compiler and its version,
# every flag, hiredis found or not, SIMDe present or not). It is rewritten
# when that text changes, and every object, library, program and test
# depends on it, so installing or removing hiredis or SIMDe, another CC or
# other CFLAGS rebuild what they change; an unchanged configuration builds
# nothing.
SIMDE_FOUND := $(if $(wildcard /usr/include/simde/x86/avx512.h),1,0)
CONFIG   := $(BUILD)/config.txt
CONFIG_TEXT := cc=$(CC) [$(shell $(CC) --version 2>/dev/null | head -n 1)] cflags=$(CFLAGS_ALL) \
               avx2=$(AVX2FLAGS) ldlibs=$(LDLIBS) hiredis=$(if $(HIREDIS_FOUND),1,0) \
               hiredis_cflags=$(HIREDIS_CFLAGS) simde=$(SIMDE_FOUND) fuzz_cc=$(FUZZ_CC) \
               fuzz_cc_version=[$(shell $(FUZZ_CC) --version 2>/dev/null | head -n 1)]
ifeq ($(filter clean uninstall deps,$(MAKECMDGOALS)),)
  ifneq ($(strip $(CONFIG_TEXT)),$(strip $(file <$(CONFIG))))
    $(shell mkdir -p $(BUILD))
    $(file >$(CONFIG),$(strip $(CONFIG_TEXT)))
  endif
endif

LIB_SRC  := $(sort $(shell find src -name '*.c'))
LIB_OBJ  := $(LIB_SRC:%.c=$(BUILD)/obj/%.o)
TOOL_SRC := $(sort $(wildcard tools/*.c))
TOOL_OBJ := $(TOOL_SRC:%.c=$(BUILD)/obj/%.o)
TEST_SRC := $(sort $(wildcard tests/test_*.c))
TEST_BIN := $(TEST_SRC:tests/%.c=$(BUILD)/tests/%)
TEST_HELP := $(filter-out $(TEST_SRC) tests/inspect_demo.c,$(wildcard tests/*.c))
EX_SRC   := $(sort $(wildcard examples/*.c))
EX_BIN   := $(EX_SRC:examples/%.c=$(BUILD)/examples/%)

VERSION  := $(shell sed -n 's/^\#define KVQ_VERSION_\(MAJOR\|MINOR\|PATCH\) \([0-9]*\).*/\2/p' include/kvq.h | paste -sd. -)
SOMAJOR  := $(firstword $(subst ., ,$(VERSION)))

.PHONY: vs-llamacpp all deps check-suites check check-run check-run-inner check-san check-tsan tsan check-valgrind bench demo \
        install uninstall clean python-test fuzz fuzz-long fuzz-corpus examples check-examples

all: $(BUILD)/libkvq.a $(BUILD)/libkvq.so $(BUILD)/kvq

$(BUILD)/obj/src/kernels/x86/%.o: src/kernels/x86/%.c $(CONFIG)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS_ALL) $(AVX2FLAGS) -MMD -MP -c $< -o $@

$(BUILD)/obj/src/tier/store_redis.o: CFLAGS_ALL += $(HIREDIS_CFLAGS)

$(BUILD)/obj/%.o: %.c $(CONFIG)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS_ALL) -MMD -MP -c $< -o $@

$(BUILD)/libkvq.a: $(LIB_OBJ) $(CONFIG)
	@rm -f $@
	ar rcs $@ $(LIB_OBJ)

$(BUILD)/libkvq.so: $(LIB_OBJ) $(CONFIG)
	$(CC) -shared $(SANFLAGS) -Wl,-soname,libkvq.so.$(SOMAJOR) -o $@ $(LIB_OBJ) $(LDLIBS)

$(BUILD)/kvq: $(TOOL_OBJ) $(BUILD)/libkvq.a $(CONFIG)
	$(CC) $(SANFLAGS) -o $@ $(TOOL_OBJ) $(BUILD)/libkvq.a $(LDLIBS)

$(BUILD)/tests/%: tests/%.c $(TEST_HELP) tests/testutil.h $(BUILD)/libkvq.a $(CONFIG)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS_ALL) -Isrc -o $@ $< $(TEST_HELP) $(BUILD)/libkvq.a $(LDLIBS)

# The examples see only the public header (no -Isrc, no _GNU_SOURCE: each
# says what it needs), as a program built against an installed kvq does.
EX_CFLAGS := -std=c11 -Iinclude -g $(OPT) $(WARN) $(SANFLAGS) $(CFLAGS)
$(BUILD)/examples/%: examples/%.c include/kvq.h $(BUILD)/libkvq.a $(CONFIG)
	@mkdir -p $(dir $@)
	$(CC) $(EX_CFLAGS) -o $@ $< $(BUILD)/libkvq.a $(LDLIBS)

examples: $(EX_BIN)

# Runs every example (each checks what it shows) and compares the README's
# C block with the example it must be (tests/examples_test.sh).
check-examples: $(EX_BIN)
	@sh tests/examples_test.sh $(BUILD)

# Runs every test binary of $(BUILD); fails at the end if any failed.
# Every test of one build, with a private redis-server when one is installed
# (tests/with_redis.sh exports KVQ_TEST_REDIS for the tier tests).
check-run: $(TEST_BIN) $(BUILD)/kvq $(BUILD)/tests/inspect_demo
	@sh tests/with_redis.sh $(MAKE) --no-print-directory check-run-inner BUILD=$(BUILD) SAN=$(SAN)

check-run-inner:
	@fail=0; for t in $(TEST_BIN); do \
	  echo "== $$t"; KVQ_DATA=$(DATA) $$t --data $(DATA) || fail=1; \
	done; \
	echo "== tests/cli_test.sh ($(BUILD))"; KVQ_DATA=$(DATA) sh tests/cli_test.sh $(BUILD)/kvq || fail=1; \
	echo "== tests/simulate_test.sh ($(BUILD))"; KVQ_DATA=$(DATA) sh tests/simulate_test.sh $(BUILD)/kvq || fail=1; \
	echo "== tests/bench_attend_test.sh ($(BUILD))"; sh tests/bench_attend_test.sh $(BUILD)/kvq || fail=1; \
	echo "== tests/inspect_test.sh ($(BUILD))"; sh tests/inspect_test.sh $(BUILD) || fail=1; \
	echo "== tests/tier_restart_test.sh ($(BUILD))"; sh tests/tier_restart_test.sh $(BUILD)/kvq || fail=1; \
	if [ "$(SAN)" != 1 ]; then echo "== tests/model_cli_test.sh ($(BUILD))"; \
	  KVQ_DATA=$(DATA) sh tests/model_cli_test.sh $(BUILD)/kvq || fail=1; \
	  echo "== tests/build_config_test.sh"; sh tests/build_config_test.sh "$(MAKE)" || fail=1; fi; \
	if [ $$fail -ne 0 ]; then echo "SOME TESTS FAILED ($(BUILD))"; exit 1; fi; \
	echo "all test binaries passed ($(BUILD))"

check-san:
	$(MAKE) BUILD=build-san SAN=1 check-run

# Every suite runs, even after one failed; each one's output is shown and
# logged (tests/check_suite.sh), and tests/check_summary.sh ends with one
# line of every suite's passed/failed/skipped counts and fails if any
# suite failed. Another suite: a line here and its name in CHECK_SUITES.
CHECK_LOGS   := $(BUILD)/check-logs
# SUITES="tests install" runs only those (default: all of them).
CHECK_SUITES := tests examples install python asan asan-examples tsan valgrind
SUITES       ?= $(CHECK_SUITES)
RUN_SUITE    := sh tests/check_suite.sh $(CHECK_LOGS) "$(SUITES)"
# `make check` first runs tests/deps.sh (the one list of the Debian packages
# the suites need: installed when run as root, otherwise it stops with the
# apt-get command), then the suites in a new make, which sees what was just
# installed (hiredis, SIMDe). DEPS=0 skips that step.
DEPS ?= 1
check:
	@if [ "$(DEPS)" != 0 ]; then sh tests/deps.sh; fi
	@$(MAKE) --no-print-directory check-suites

deps:
	@sh tests/deps.sh

check-suites: all
	$(if $(filter-out $(CHECK_SUITES),$(SUITES)),$(error SUITES: unknown suite '$(filter-out $(CHECK_SUITES),$(SUITES))' (the suites: $(CHECK_SUITES))))
	@rm -rf $(CHECK_LOGS)
	@$(RUN_SUITE) tests $(MAKE) --no-print-directory check-run
	@$(RUN_SUITE) examples $(MAKE) --no-print-directory check-examples
	@$(RUN_SUITE) install sh tests/install_test.sh $(MAKE) $(BUILD)
	@$(RUN_SUITE) python $(MAKE) --no-print-directory python-test
	@$(RUN_SUITE) asan $(MAKE) --no-print-directory check-san
	@$(RUN_SUITE) asan-examples $(MAKE) --no-print-directory BUILD=build-san SAN=1 check-examples
	@$(RUN_SUITE) tsan $(MAKE) --no-print-directory check-tsan
	@$(RUN_SUITE) valgrind $(MAKE) --no-print-directory check-valgrind
	@sh tests/check_summary.sh $(CHECK_LOGS) $(filter $(SUITES),$(CHECK_SUITES))

# ThreadSanitizer over the tests that run attention on worker threads.
TSAN_TESTS := test_cache test_tier test_hpool test_pool
check-tsan tsan:
	$(MAKE) BUILD=build-tsan TSAN=1 $(TSAN_TESTS:%=build-tsan/tests/%)
	@for t in $(TSAN_TESTS); do echo "== tsan $$t"; \
	  TSAN_OPTIONS=halt_on_error=1 build-tsan/tests/$$t --data $(DATA) || exit 1; done

# A short run under valgrind (memcheck, leaks included) when it is installed.
check-valgrind: $(BUILD)/tests/test_cache $(BUILD)/tests/test_tier
	@if command -v valgrind >/dev/null 2>&1; then \
	  for t in test_cache test_tier; do echo "== valgrind $$t"; \
	    valgrind -q --error-exitcode=9 --leak-check=full $(BUILD)/tests/$$t --data $(DATA) || exit 1; done; \
	else echo "SKIP suite: valgrind is not installed"; fi

# libFuzzer targets (clang, ASan+UBSan), one per reader of untrusted bytes:
# page records, store segments, model checkpoints, tokenizers, codec state
# blobs and calibration files, .npy files, --alloc JSON files and snapshot
# manifests (fuzz/fuzz_<target>.c). The library and the tool sources they
# need are compiled for fuzzing (coverage + sanitizers) in $(BUILD)/fuzzobj.
#   make fuzz                            builds $(BUILD)/fuzz_<target> for every target
#   make fuzz-long FUZZ_SECONDS=N        runs each for N seconds on a copy of its corpus
#                                        (FUZZ_PARALLEL=1: all at once) under $(FUZZ_OUT),
#                                        then prints executions and crashes per target
#   cp -r fuzz/corpus/record /tmp/c && $(BUILD)/fuzz_record -max_total_time=300 /tmp/c
# tests/test_fuzz_replay.c replays every committed corpus (fuzz/corpus/<target>/)
# through the same property checks in `make check`, without libFuzzer.
FUZZ_TARGETS  := record segment model tokenizer codec_state npy alloc_json snapshot filestore prefix redis_reply
FUZZ_SECONDS  ?= 60
FUZZ_PARALLEL ?= 0
FUZZ_OUT      ?= /tmp/kvq-fuzz-long
FUZZ_FLAGS    := -std=c11 -D_GNU_SOURCE -Iinclude -Isrc -Itools -g -O1 -fno-omit-frame-pointer \
                 -fsanitize=address,undefined -fno-sanitize-recover=undefined
FUZZ_OBJ      := $(BUILD)/fuzzobj
FUZZ_LIB_OBJ  := $(LIB_SRC:%.c=$(FUZZ_OBJ)/%.o)
FUZZ_TOOLS    := npy json alloc_json cacheopts
FUZZ_TOOL_OBJ := $(FUZZ_TOOLS:%=$(FUZZ_OBJ)/tools/%.o)
FUZZ_BIN      := $(FUZZ_TARGETS:%=$(BUILD)/fuzz_%)

fuzz: $(FUZZ_BIN)

$(FUZZ_OBJ)/src/kernels/x86/%.o: src/kernels/x86/%.c $(CONFIG)
	@mkdir -p $(dir $@)
	$(FUZZ_CC) $(FUZZ_FLAGS) -fsanitize=fuzzer-no-link $(AVX2FLAGS) -MMD -MP -c $< -o $@

# the Redis store's reply handling is a fuzz target too (redis_reply)
$(FUZZ_OBJ)/src/tier/store_redis.o: FUZZ_FLAGS += $(HIREDIS_CFLAGS)

$(FUZZ_OBJ)/%.o: %.c $(CONFIG)
	@mkdir -p $(dir $@)
	$(FUZZ_CC) $(FUZZ_FLAGS) -fsanitize=fuzzer-no-link -MMD -MP -c $< -o $@

$(FUZZ_OBJ)/libkvq.a: $(FUZZ_LIB_OBJ) $(CONFIG)
	@rm -f $@
	ar rcs $@ $(FUZZ_LIB_OBJ)

$(BUILD)/fuzz_%: fuzz/fuzz_%.c $(wildcard fuzz/*.h) $(FUZZ_TOOL_OBJ) $(FUZZ_OBJ)/libkvq.a
	$(FUZZ_CC) $(FUZZ_FLAGS) -fsanitize=fuzzer -o $@ $< $(FUZZ_TOOL_OBJ) $(FUZZ_OBJ)/libkvq.a $(LDLIBS)

# Rewrites the seed corpora of the file readers (fuzz/make_corpus.c).
fuzz-corpus: $(BUILD)/make_corpus
	$(BUILD)/make_corpus fuzz/corpus

$(BUILD)/make_corpus: fuzz/make_corpus.c fuzz/fuzz_snapshot.c fuzz/fuzz_prefix.c fuzz/snapshot_forge.h \
                      fuzz/fuzz_dir.h $(BUILD)/libkvq.a
	$(CC) $(CFLAGS_ALL) -Isrc -o $@ $< $(BUILD)/libkvq.a $(LDLIBS)

fuzz-long: fuzz
	@sh fuzz/fuzz_long.sh $(BUILD) $(FUZZ_SECONDS) $(FUZZ_PARALLEL) $(FUZZ_OUT) $(FUZZ_TARGETS)

# The corpus replay includes the fuzz targets and needs the tool sources
# that some of them read through.
FUZZ_REPLAY_TOOL_OBJ := $(FUZZ_TOOLS:%=$(BUILD)/obj/tools/%.o)
$(BUILD)/tests/test_fuzz_replay: tests/test_fuzz_replay.c $(wildcard fuzz/*.c fuzz/*.h) $(TEST_HELP) \
                                 tests/testutil.h $(FUZZ_REPLAY_TOOL_OBJ) $(BUILD)/libkvq.a
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS_ALL) -Isrc -Itools -o $@ $< $(TEST_HELP) $(FUZZ_REPLAY_TOOL_OBJ) $(BUILD)/libkvq.a $(LDLIBS)

# The AVX-512 and AVX-VNNI kernel files built through SIMDe (simd_avx512.h,
# int_avxvnni.c): their selectors get a _simde suffix and are linked into
# the tiled-kernel tests, so that every machine compiles and checks those
# sources against the scalar reference (natively too where the CPU has them).
SIMDE_KERNELS := $(filter $(wildcard src/kernels/x86/*_avx512.c),$(patsubst %,src/kernels/x86/%_avx512.c,float int tq vmath)) \
                 src/kernels/x86/int_avxvnni.c
SIMDE_OBJ     := $(SIMDE_KERNELS:src/kernels/x86/%.c=$(BUILD)/simde/%.o)
$(SIMDE_OBJ): $(BUILD)/simde/%.o: src/kernels/x86/%.c $(CONFIG)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS_ALL) $(AVX2FLAGS) -DKVQ_SIMDE -Wno-unused-function -Wno-psabi -MMD -MP -c $< -o $@
-include $(SIMDE_OBJ:.o=.d)

$(BUILD)/tests/test_tile%: tests/test_tile%.c $(TEST_HELP) tests/testutil.h $(SIMDE_OBJ) $(BUILD)/libkvq.a
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS_ALL) -Isrc -o $@ $< $(TEST_HELP) $(SIMDE_OBJ) $(BUILD)/libkvq.a $(LDLIBS)

# The JSON reader and allocation-file test links the tool sources it tests.
$(BUILD)/tests/test_json: tests/test_json.c $(TEST_HELP) tests/testutil.h $(FUZZ_REPLAY_TOOL_OBJ) \
                          $(BUILD)/libkvq.a
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS_ALL) -Isrc -Itools -o $@ $< $(TEST_HELP) $(FUZZ_REPLAY_TOOL_OBJ) $(BUILD)/libkvq.a $(LDLIBS)

# The Python binding's tests (python/tests/run.py) against this build's libkvq.so.
python-test: $(BUILD)/libkvq.so $(BUILD)/kvq
	@echo "== python/tests/run.py"
	KVQ_LIB=$(abspath $(BUILD))/libkvq.so KVQ_DATA=$(DATA) $(PYTHON) python/tests/run.py
	@echo "== examples/torch_stories15M.py"
	KVQ_LIB=$(abspath $(BUILD))/libkvq.so $(PYTHON) examples/torch_stories15M.py --check --data $(DATA) --skip 18 --max-lines 1 --kvq $(BUILD)/kvq

bench: all
	$(BUILD)/kvq bench codecs --head-dim 128 --data gauss
	$(BUILD)/kvq bench codecs --head-dim 128 --data outlier
	$(BUILD)/kvq bench codecs --head-dim 8 --data gauss
	$(BUILD)/kvq bench attend
	$(BUILD)/kvq simulate --k-codec tq4 --v-codec tq3 --policy utility --budget 1024

# kvq against the real llama.cpp's KV caches on stories15M (builds the peer
# from ../shared/peers/llamacpp/ into PEER_DIR when missing; writes
# docs/vs-llamacpp.md). About 6 minutes, 8 with the peer's build.
vs-llamacpp: all
	sh bench/vs-llamacpp.sh --kvq $(BUILD)/kvq --data $(DATA)

# The main job: a prefill + decode session through a compressed cache with
# utility eviction, against exact f32 attention and an f32 cache.
demo: all
	$(BUILD)/kvq simulate --k-codec int8 --v-codec tq3 --policy utility --budget 1024

# The kvq binary is linked statically against libkvq.a, so it runs from
# any prefix without libkvq.so; programs linked with -lkvq use libkvq.so
# (soname libkvq.so.$(SOMAJOR)), and install says what the loader needs.
INSTALLED := $(INCLUDEDIR)/kvq.h $(LIBDIR)/libkvq.a $(LIBDIR)/libkvq.so.$(VERSION) \
             $(LIBDIR)/libkvq.so.$(SOMAJOR) $(LIBDIR)/libkvq.so $(BINDIR)/kvq \
             $(LIBDIR)/pkgconfig/kvq.pc $(MANDIR)/man1/kvq.1
install: all
	install -d $(DESTDIR)$(INCLUDEDIR) $(DESTDIR)$(LIBDIR)/pkgconfig $(DESTDIR)$(BINDIR) \
	           $(DESTDIR)$(MANDIR)/man1
	install -m 644 include/kvq.h $(DESTDIR)$(INCLUDEDIR)/kvq.h
	install -m 644 $(BUILD)/libkvq.a $(DESTDIR)$(LIBDIR)/libkvq.a
	install -m 755 $(BUILD)/libkvq.so $(DESTDIR)$(LIBDIR)/libkvq.so.$(VERSION)
	ln -sf libkvq.so.$(VERSION) $(DESTDIR)$(LIBDIR)/libkvq.so.$(SOMAJOR)
	ln -sf libkvq.so.$(SOMAJOR) $(DESTDIR)$(LIBDIR)/libkvq.so
	install -m 755 $(BUILD)/kvq $(DESTDIR)$(BINDIR)/kvq
	install -m 644 kvq.1 $(DESTDIR)$(MANDIR)/man1/kvq.1
	sed -e 's|@PREFIX@|$(PREFIX)|' \
	    -e 's|@LIBDIR@|$(LIBDIR:$(PREFIX)/%=$${prefix}/%)|' \
	    -e 's|@INCLUDEDIR@|$(INCLUDEDIR:$(PREFIX)/%=$${prefix}/%)|' \
	    -e 's|@VERSION@|$(VERSION)|' -e 's|@LIBS_PRIVATE@|$(strip $(LDLIBS))|' \
	    kvq.pc.in > $(DESTDIR)$(LIBDIR)/pkgconfig/kvq.pc
	@echo "kvq $(VERSION) installed in $(DESTDIR)$(PREFIX)."
	@echo "The kvq binary has libkvq linked in statically: it needs no libkvq.so."
	@echo "To build a program against libkvq:  cc prog.c \$$(pkg-config --cflags --libs kvq)"
	@echo "  (pkg-config reads $(LIBDIR)/pkgconfig/kvq.pc; when that folder is not on its"
	@echo "  search path: export PKG_CONFIG_PATH=$(LIBDIR)/pkgconfig)"
	@echo "At run time the loader must find libkvq.so.$(SOMAJOR) in $(LIBDIR): either"
	@echo "  run ldconfig (as root), when $(LIBDIR) is a system library folder, or"
	@echo "  link with -Wl,-rpath,$(LIBDIR), or"
	@echo "  export LD_LIBRARY_PATH=$(LIBDIR)"
	@echo "To link statically:  cc prog.c $(LIBDIR)/libkvq.a $(strip $(LDLIBS))"
	@echo "The Python binding loads libkvq.so the same way, or from KVQ_LIB=$(LIBDIR)/libkvq.so."

# Removes exactly the files install wrote (the folders stay: they may hold
# other packages' files).
uninstall:
	rm -f $(INSTALLED:%=$(DESTDIR)%)

clean:
	rm -rf build build-san build-tsan

-include $(LIB_OBJ:.o=.d) $(TOOL_OBJ:.o=.d) $(FUZZ_LIB_OBJ:.o=.d) $(FUZZ_TOOL_OBJ:.o=.d)
