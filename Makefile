# mlc: make (examples), make demo, make test, make bench, make clean
CC      ?= cc
CFLAGS  ?= -O2 -std=c99 -Wall -Wextra -pedantic
LDLIBS  := -lm
BUILD   := build
EXAMPLES := $(BUILD)/mlp $(BUILD)/digits

.PHONY: all examples demo test test-sanitize compile-check bench clean

all: examples
examples: $(EXAMPLES)

$(BUILD):
	mkdir -p $(BUILD)

$(BUILD)/%: examples/%.c mlc.h examples/*.h | $(BUILD)
	$(CC) $(CFLAGS) -I. -o $@ $< $(LDLIBS)

demo: $(BUILD)/digits
	./$(BUILD)/digits

# OpenBLAS is optional: when its header and library link, the BLAS-hook tests run against it.
OPENBLAS := $(shell printf '\043include <cblas.h>\nint main(void){return 0;}\n' | \
              $(CC) -x c - -o /dev/null -lopenblas >/dev/null 2>&1 && echo yes)
TEST_BLAS := $(if $(OPENBLAS),-DMLC_TEST_OPENBLAS -lopenblas)

$(BUILD)/test: tests/*.c tests/test.h mlc.h | $(BUILD)
	$(CC) $(CFLAGS) -g -I. -o $@ tests/*.c $(TEST_BLAS) $(LDLIBS)

compile-check:
	sh tests/compile_check.sh

test: compile-check $(BUILD)/test
	./$(BUILD)/test

# The suites under AddressSanitizer + UndefinedBehaviorSanitizer (leaks included).
test-sanitize: | $(BUILD)
	$(CC) -std=c99 -O1 -g -fsanitize=address,undefined -fno-sanitize-recover=undefined -I. \
	    -o $(BUILD)/test-sanitize tests/*.c $(TEST_BLAS) $(LDLIBS)
	./$(BUILD)/test-sanitize

# The benchmark suite: sgemm, training, inference and memory, OpenBLAS and PyTorch beside
# mlc when installed; one table (bench/RESULTS.md has a run). BENCH_FLAGS=--quick: short runs.
bench: | $(BUILD)
	CC="$(CC)" sh bench/run.sh $(BENCH_FLAGS)

clean:
	rm -rf $(BUILD)
