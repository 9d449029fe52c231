/* mlc.h - v0.1.0 - machine learning in one C header - MIT licence (see end of file)

   Do this:
      #define MLC_IMPLEMENTATION
   before you include this file in *one* C or C++ file to create the implementation.
   Every other file includes mlc.h without the define. Link with -lm.

CONTENTS (each section's banner carries "@section <name>": search for it to jump there)
   The declarations, in the order a user meets them:
   api-context   context, configuration, errors, devices, memory statistics
   api-tensors   creating, reading, writing and shaping tensors
   api-ops       the ops: maps, arithmetic, products, reductions, losses, shapes, networks
   api-autograd  backward, gradients, gradient checking
   api-modules   torch.nn's layers, containers and state dicts
   api-optim     SGD, Adam(W), RMSprop, schedules, clipping
   api-data      gzip, IDX and CSV readers, batches
   api-files     safetensors and checkpoints
   The implementation, in data-flow order:
   implementation  includes, maths macros, the build's switches (x86, OpenMP, threads)
   op-types      the op table (MLC__OPS: each op's CPU forward and backward), the tape node, the
                 backend table (a backend's contract: docs/backends.md)
   memory        the context's memory: errors, a formatter, tracked allocations, the arena
   context       creating a context, random numbers, frames
   devices       where tensors live: host and device copies, uploads, fallback to the CPU
   tensors       creation, shapes, reading and writing
   op-plumbing   input checks, mlc__run (device or CPU forward), the tape, gradient buffers
   threads       the thread pool and mlc__parallel
   binary        elementwise ops with broadcasting (add, sub, mul, div, where, masked_fill)
   formulas      helpers the formulas share with the device kernels (MLC__FORMULA_HELPERS)
   unary         maps and activations, one table row each (MLC__UNARY_KINDS)
   matmul        matrix products: the reference loop, mlc's blocked GEMM, BLAS, bf16 and int8, linear
   reduce        sum, mean, max, argmax, var, cumsum
   softmax       softmax and log_softmax
   losses        cross entropy, nll, and the pointwise losses (MLC__POINTWISE_LOSSES)
   shape         reshape, permute, slice, concat, copy
   indexing      index_select, gather, embedding
   norm          dropout, layer norm, batch norm
   conv          convolution and pooling
   attention     scaled dot-product attention
   autograd      mlc_backward: the tape walked back
   init          initialisers
   modules       modules, the recurrent layers, state dicts
   optim         optimisers and schedules
   data          IDX and CSV data, batches
   safetensors   safetensors files and checkpoints
   registry      the backends mlc_create can open (mlc_opencl.h adds OpenCL)

QUICK START

      #define MLC_IMPLEMENTATION
      #include "mlc.h"
      mlc_ctx *ctx = mlc_create(&(mlc_config){ .seed = 42 });
      mlc_module *l1 = mlc_nn_linear(ctx, 10, 100), *l2 = mlc_nn_linear(ctx, 100, 1);  // in order
      mlc_module *net = mlc_nn_sequential(ctx, l1, mlc_nn_tanh(ctx), l2, NULL);
      mlc_optim *opt = mlc_adam(ctx, net, (mlc_adam_opts){ .lr = 1e-3f });
      mlc_tensor *x = mlc_randn(ctx, MLC_SHAPE(64, 10)), *y = mlc_randn(ctx, MLC_SHAPE(64, 1));
      for (int epoch = 0; epoch < 100; epoch++) {
          mlc_frame f = mlc_frame_begin(ctx);          // temporaries of one step
          mlc_tensor *loss = mlc_mse_loss(mlc_forward(net, x), y, MLC_REDUCE_MEAN);
          mlc_zero_grad(opt); mlc_backward(loss); mlc_step(opt);
          if (epoch % 10 == 0) printf("Epoch %d, Loss: %.4f\n", epoch, mlc_item(loss));
          mlc_frame_end(f);                            // frees the step's tensors and tape
      }
      if (mlc_error(ctx)) printf("%s\n", mlc_error_message(ctx));
      mlc_destroy(ctx);

WHAT MLC DOES NOT DO
   No graph compiler, no double backward (gradients of gradients), no integer tensors (indices
   are whole floats), no half-precision arithmetic (half tensors compute in float32), no views with
   strides (every tensor is contiguous; reshape shares storage, the other shape ops copy).

DTYPES AND MIXED PRECISION
   A tensor stores float32 (default), bfloat16 or float16 (mlc_dtype, mlc_to_dtype). Arithmetic
   is float32 whatever the storage: an op on half tensors computes in float32 and rounds its
   result once (bf16 products use AVX-512 BF16 where the CPU has it); gradients are float32.
   On a device half tensors take half the memory too: the kernels read float32 copies made on
   the device (OpenCL: vload_half/vstore_half, bf16 by shifts) and round into half storage.
   Conversions are PyTorch's .to() bit for bit; promotion is PyTorch's. mlc_autocast_begin/end
   is torch.autocast, mlc_grad_scaler_create its GradScaler, mlc_module_to_dtype and
   mlc_set_default_dtype model.to(dtype) and torch.set_default_dtype.

CONFIGURATION MACROS (define before including)
   MLC_IMPLEMENTATION    emit the implementation in this translation unit
   MLC_STATIC            make every function static (private copy per translation unit)
   MLC_ASSERT(x)         internal invariants only (default: assert from <assert.h>)
   MLC_NO_STDIO          no <stdio.h>: no default logger, no mlc_print, no file reading
                         (mlc_idx_load, mlc_csv_load; parsing from memory stays)
   MLC_USE_CBLAS         matrix products through cblas_sgemm (OpenBLAS, MKL; Accelerate on
                         Apple); link the BLAS. mlc_config.gemm plugs in any other routine.
   MLC_EXPF MLC_LOGF MLC_LOG1PF MLC_SQRTF MLC_TANHF MLC_ERFF MLC_POWF MLC_COSF
                         maths functions (default: the <math.h> float versions, but exp, tanh
                         and erf are mlc's own polynomials: within 4 ulp, and loops of them
                         vectorise)
   MLC_FLOAT_ONLY        long sums (reductions, softmax, norms, losses) in float instead of
                         double, for FPUs without double (Cortex-M4F: no soft-float calls)
   MLC_NO_THREADS        every op on the caller's thread (default: a pool of POSIX threads
                         where the C library has them without -pthread, of Win32 threads on
                         Windows with MinGW-w64 or clang; see mlc_set_threads)
   MLC_THREADS           the pool on other POSIX systems too (link with -pthread)
   MLC_NO_MALLOC         for bare-metal builds: no reference to malloc, free, getenv, x86
                         intrinsics (<immintrin.h>) or cpuid in the object. Heap memory comes
                         only from mlc_config.allocator (mlc_create returns NULL without one);
                         with mlc_config.arena the arena is a buffer of yours (see MEMORY).
   MLC_INT8_PATCH_BYTES  the int8 convolution's im2col scratch, in bytes (default 8192: it
                         takes as many output positions a pass as fit)
   MLC_FREED_KEPT        how many freed tensors' records (a struct each) a context keeps, so
                         that a second mlc_tensor_free or a use of a freed tensor is refused
                         (default 256, 8 under MLC_NO_MALLOC; in the context; 0: none, a
                         second free is undefined)
   Memory comes from the allocator in mlc_config (malloc/free when none is given).

MEMORY
   Op results and the autograd tape live in the context's arena. mlc_frame_begin marks it;
   mlc_frame_end releases everything allocated since, at once. Frames nest. The arena keeps its
   blocks, so a steady training loop reaches its high-water mark in the first step and then
   allocates nothing (mlc_get_stats(ctx).allocs stops growing). Parameters (mlc_parameter,
   modules) and optimiser state are long-lived and freed by mlc_destroy (or mlc_tensor_free).
   Frames end innermost first: ending an outer frame while an inner one is open is MLC_ERR_STATE
   and ends the inner ones too; ending a frame twice is MLC_ERR_STATE. A tensor remembers its
   frame: an op (or mlc_item, mlc_read, mlc_backward...) given a tensor whose frame has ended
   refuses it with MLC_ERR_STATE naming the op. mlc_backward uses up the graph it runs through
   (PyTorch's default, no retain_graph): a second backward through any op of it is
   MLC_ERR_STATE (run the forward again); once every op on the tape is used up, the tape is
   empty. Two independent graphs on one tape each take their own backward. Sizes are computed
   with overflow checks: a shape whose byte count does not fit in size_t is MLC_ERR_SHAPE.
   Fixed memory (microcontrollers): mlc_config.arena and arena_bytes make a buffer of yours the
   whole arena; it never grows, and running out is MLC_ERR_MEMORY naming the op (mlc_stats'
   arena_peak says how much a run needed). mlc_from_const wraps weights in read-only memory
   (flash) without copying them: a leaf for inference that nothing writes (mlc_write, the
   initialisers, requires_grad, optimisers, loading, batch norm's running statistics in
   training refuse it with MLC_ERR_STATE naming the call). With gradients off
   (mlc_set_grad_enabled(ctx, 0)) or no input needing one, an op records nothing: its output
   (and a little scratch for convolutions) is all it takes from the arena. A long-lived
   convolution weight used so keeps a copy packed for mlc's products (as many bytes again, on the
   heap, in mlc_stats' bytes) until its values are written, moved or freed.

ERRORS
   Errors are values. A bad shape, an out-of-range index, a NULL input or a failed allocation
   sets a sticky error on the context (a code and a message naming the op and the shapes),
   logs it, and the op returns NULL. Every op given NULL returns NULL and no op runs while the
   error is set, so a chained expression fails cleanly and the caller checks once:
   mlc_error(ctx) / mlc_error_message(ctx), then mlc_clear_error(ctx). Nothing aborts or exits.
   Every public function accepts NULL where it takes a context or an object (nothing happens,
   and an error is set where there is a context). Objects of two contexts never mix: a module,
   parameter, optimiser or tensor given to another context's call is MLC_ERR_ARG; so is a
   module added inside itself (a cycle). A parameter added to an optimiser twice (by hand, or
   shared by two modules) is kept once, so it is updated once.

DEFAULTS (a config field or setting left 0 takes the default; MLC_ZERO asks for a real zero)
   MLC_ZERO is the smallest float above 0 (1.4e-45, a subnormal; under -ffast-math's flush of
   subnormals it is 0 in arithmetic), which mlc reads as an exact 0. It is not -0.0f: under
   -ffast-math or -fno-signed-zeros a compiler may write -0.0f as +0.0f (GCC does when it
   zero-fills a config struct), and the zero would silently become the default.
     mlc_sgd_opts      lr 0.01; momentum, dampening, weight_decay 0
     mlc_adam_opts     lr 1e-3, beta1 0.9, beta2 0.999, eps 1e-8, weight_decay 0 (AdamW: 0.01),
                         amsgrad 0
     mlc_rmsprop_opts  lr 0.01, alpha 0.99, eps 1e-8; weight_decay, momentum 0
     batch norm          momentum 0.1, eps 1e-5 (mlc_batch_norm's arguments, module fields)
     layer norm          eps 1e-5
     mlc_conv_opts       stride 1, padding 0, dilation 1, groups 1; the _w fields: the height's
                         (an int field's explicit 0 is MLC_ZERO_INT, -1: MLC_ZERO would read as 0)
     mlc_ce_opts         reduction mean, no class ignored, label_smoothing 0
     mlc_config          arena_block_bytes 1 MiB, device $MLC_DEVICE or "cpu" ("best": a GPU
                         if there is one, else the CPU)
   Optimiser settings are checked when it is made (and lr by mlc_optim_set_lr): NaN, infinite,
   negative, betas or alpha outside [0, 1), eps < 0, nesterov without momentum are MLC_ERR_ARG
   naming the call and the field; so are bad module arguments (dropout p outside [0, 1], a conv
   or pool kernel < 1) and norm settings (momentum outside [0, 1], eps < 0) when the op runs.
   Every options struct has an initialiser, mlc_<name>_defaults() (mlc_adam_defaults(), ...,
   mlc_config_defaults()), returning it with every field zero, that is default. Start from it,
   from = {0} or from a designated initialiser (which zero the fields you leave), never from an
   uninitialised variable set field by field: a field a later version adds would hold garbage
   (an Adam run could become AMSGrad).

BACKENDS
   The CPU (reference loops, float32) is always present. mlc_opencl.h adds OpenCL devices.
   Builds warning-free as C99 (gcc, clang, tcc, arm-none-eabi-gcc) and as C++11/C++20, and
   passes its suite on x86-64, i686 (x87) and s390x (big-endian); make embedded runs the digits
   CNN bare-metal on a Cortex-M4F under qemu (see README).

ADDING AN OP (the places to touch, in order)
   A map of one tensor without parameters: one line in MLC__UNARY_MAPS (public API, ops): its
   name, y = f(x) and dy/dx. That line makes the function, the CPU loops and the OpenCL kernel
   cases. A helper function the formula calls (as sigmoid calls mlc__sigmoidf) is one row of
   MLC__FORMULA_HELPERS (@section formulas), the one place it is written for C and OpenCL;
   test device.opencl_formulas_build_alone builds the formulas alone on OpenCL, so a helper
   written anywhere else fails there, by name. Add a gradient check (tests/test_grad.c) and a
   value test against PyTorch.
   Any other op:
   1. its prototype in the public API;
   2. a line in MLC__OPS: the op's enum value, its CPU forward and its CPU backward; its
      arguments as a member of mlc__args;
   3. in its section: the backward (maths line first), the CPU forward (int mlc__<op>_cpu(node):
      reads n->in, n->args and n->saved, writes n->out, may keep a buffer in n->saved for the
      backward; 0 with the error set when it fails), then the builder: MLC__ENTER, check shapes,
      make the output, mlc__call + its args, mlc__run (the device's kernel or the CPU forward),
      mlc__record;
   4. each backend: its kernels (mlc_opencl.h: the kernel source, its name in MLC__CL_KERNELS,
      a launcher, a case in mlc__cl_run_op); a backend without them falls back to the CPU
      (docs/backends.md);
   5. tests: a gradient check, a value test, a line in tests/test_onectx.c (every device).

LIMITS
   Rank up to MLC_MAX_DIMS (6). Element counts fit in size_t, each dimension in int. At most
   64 frames are open at once. A tensor from an ended frame is caught while its arena memory has
   not been handed out again; after that, like any dangling pointer, it may not be.
   Class indices (cross entropy, embedding, gather) are float tensors holding whole numbers,
   exact up to 2^24.
   safetensors files are untrusted input: the loader checks everything before it reads and is
   fuzzed (make fuzz); report any crash. mlc_safetensors_open reads a whole file into memory.
   The data readers (gzip, IDX, CSV) take untrusted bytes and check every size; they are tested
   against every cut and every flipped bit of a sample stream, but not fuzzed yet: report crashes.
*/
#ifndef MLC_H
#define MLC_H

#define MLC_VERSION_MAJOR 0
#define MLC_VERSION_MINOR 1
#define MLC_VERSION_PATCH 0
#define MLC_VERSION_STRING "0.1.0"

#include <stddef.h>
#include <stdint.h>

#ifndef MLCDEF
#if defined(MLC_STATIC) && (defined(__GNUC__) || defined(__clang__))
#define MLCDEF static __attribute__((unused))   /* a unit need not call every function */
#elif defined(MLC_STATIC)
#define MLCDEF static
#else
#define MLCDEF extern
#endif
#endif

#ifdef __cplusplus
extern "C" {
#endif

/* ============================================================================================
   @section api-context  Public API: context, errors, memory statistics
   ============================================================================================ */

#define MLC_MAX_DIMS 6
/* MLC_SHAPE(2, 3) expands to "2, (int[]){2, 3}": the ndim and shape arguments of a creator.
   C++ has no compound literals: there a temporary holds the sizes (run-time ones too) until
   the end of the full expression. */
#ifdef __cplusplus
extern "C++" {
struct mlc__dims { int d[MLC_MAX_DIMS]; };
template <typename... T> constexpr int mlc__count(T...) { return (int)sizeof...(T); }
}
#define MLC_SHAPE(...) mlc__count(__VA_ARGS__), mlc__dims{ { __VA_ARGS__ } }.d
#else
#define MLC_SHAPE(...) (int)(sizeof((int[]){__VA_ARGS__}) / sizeof(int)), (const int[]){__VA_ARGS__}
#endif

typedef struct mlc_ctx mlc_ctx;
typedef struct mlc_tensor mlc_tensor;
typedef struct mlc_module mlc_module;
typedef struct mlc_optim mlc_optim;

typedef enum mlc_result {
    MLC_OK = 0,
    MLC_ERR_NULL,     /* an input was NULL                                   */
    MLC_ERR_SHAPE,    /* shapes or ranks do not fit the op                    */
    MLC_ERR_INDEX,    /* an index (class, axis, position) is out of range     */
    MLC_ERR_ARG,      /* another argument is invalid                          */
    MLC_ERR_MEMORY,   /* an allocation failed                                 */
    MLC_ERR_STATE,    /* the call does not fit the context's state            */
    MLC_ERR_DEVICE,   /* a device or backend failed                           */
    MLC_ERR_IO        /* a file could not be read or is corrupt               */
} mlc_result;

typedef enum mlc_log_level { MLC_LOG_INFO, MLC_LOG_WARN, MLC_LOG_ERROR } mlc_log_level;

typedef struct mlc_allocator {          /* all or none; user is passed through */
    void *(*alloc)(size_t bytes, void *user);
    void (*free)(void *ptr, void *user);
    void *user;
} mlc_allocator;

/* A matrix-product routine (a BLAS hook): C[M,N] = op(A) op(B) + beta C, all row-major,
   op(A) = A [M,K] or, transposed, A stored [K,M]; op(B) = B [K,N] or B stored [N,K]; beta 0 or 1. */
typedef void (*mlc_gemm_fn)(int transpose_a, int transpose_b, int M, int N, int K, const float *A,
                            const float *B, float beta, float *C, void *user);

typedef struct mlc_config {             /* zero: default; start from mlc_config_defaults() */
    uint64_t seed;                      /* RNG seed (the same numbers on every platform)     */
    const char *device;                 /* NULL: $MLC_DEVICE, else "cpu"; see Devices below  */
    mlc_allocator allocator;            /* default: malloc/free                              */
    void (*log)(mlc_log_level level, const char *message, void *user); /* default: stderr */
    void *log_user;
    int quiet;                          /* 1: no default logging (errors are still values)  */
    size_t arena_block_bytes;           /* size of one arena block, default 1 MiB            */
    void *arena;                        /* a fixed arena: this buffer of arena_bytes, never  */
    size_t arena_bytes;                 /*   grown (full: MLC_ERR_MEMORY); see MEMORY        */
    mlc_gemm_fn gemm;                   /* every matrix product goes here when set (BLAS)    */
    void *gemm_user;
    int threads;                        /* threads for ops; 0: see mlc_set_threads           */
    char *error;                        /* where mlc_create, returning NULL, writes why (a  */
    size_t error_bytes;                 /*   C string of at most error_bytes); see Devices   */
} mlc_config;

typedef struct mlc_stats {
    size_t bytes_current, bytes_peak;   /* heap bytes held by the context, now and at most   */
    size_t allocs, frees;               /* number of calls to the allocator so far           */
    size_t arena_used, arena_peak;      /* bytes of the arena in use, now and at most        */
    size_t tape_nodes;                  /* autograd nodes on the tape now                    */
    size_t device_bytes_current, device_bytes_peak;   /* device buffers, now and at most   */
    size_t uploads, downloads;          /* copies host -> device and device -> host          */
    size_t fallbacks;                   /* device ops that ran on the CPU (no kernel)        */
    size_t widened;                     /* CPU ops on bf16/f16 tensors run on float32 copies */
    size_t launches;                    /* kernels the device was given to run               */
    size_t jobs_shared, jobs_alone;     /* CPU ops' work shared with worker threads, and run on
                                           the caller alone after a worker lost its core (see
                                           mlc_set_threads)                                   */
} mlc_stats;

/* NULL config: all defaults. NULL when the context cannot be had: a device asked for by name
   that is not there (see Devices), the allocator refusing; the reason is logged (stderr by
   default) and written to config.error. */
MLCDEF mlc_ctx *mlc_create(const mlc_config *config);
MLCDEF void mlc_destroy(mlc_ctx *ctx);
/* "cpu", "opencl:0 NVIDIA H100 ..." (the device the context's ops run on); "none" for NULL */
MLCDEF const char *mlc_device_name(const mlc_ctx *ctx);
/* The library's version, "0.1.0" (MLC_VERSION_STRING of the mlc.h the implementation was built
   from: a program can compare it with the header it includes) */
MLCDEF const char *mlc_version(void);
MLCDEF mlc_result mlc_error(const mlc_ctx *ctx);
MLCDEF const char *mlc_error_message(const mlc_ctx *ctx);
MLCDEF void mlc_clear_error(mlc_ctx *ctx);
/* Set ctx's error as mlc's own functions do, for code built on mlc (mlc_mpi.h, your own ops):
   the first error stays, the message is logged; MLC_OK sets nothing. Returns ctx's error. */
MLCDEF mlc_result mlc_set_error(mlc_ctx *ctx, mlc_result code, const char *message);
MLCDEF mlc_stats mlc_get_stats(const mlc_ctx *ctx);
/* Threads the ops share their work with (the caller's and workers mlc starts on first use):
   n >= 1, or 0 for the default: $OMP_NUM_THREADS when set (under -fopenmp, OpenMP's own
   setting, omp_set_num_threads included), else every CPU the caller may run on (on Linux its
   affinity: taskset, cpusets; on Windows the process's affinity mask; elsewhere every online
   CPU). Builds without POSIX or Win32 threads (MSVC's cl, tcc, or MLC_NO_THREADS) run on the
   caller only; mlc_threads says what a context uses. When
   the caller had to wait for a worker whose core was taken away (another program, a VM's
   vCPU), the next 1000 ops that would share their work run on the caller alone, counted in
   mlc_stats.jobs_alone (jobs_shared counts those shared). Under -fopenmp with OMP_PROC_BIND or
   OMP_PLACES set, worker k runs where OpenMP binds its thread k. */
MLCDEF void mlc_set_threads(mlc_ctx *ctx, int n);
MLCDEF int mlc_threads(const mlc_ctx *ctx);

/* Per-context random numbers (PCG32): reproducible across platforms and runs. */
MLCDEF void mlc_seed(mlc_ctx *ctx, uint64_t seed);
MLCDEF uint32_t mlc_rand_u32(mlc_ctx *ctx);
MLCDEF float mlc_rand_uniform(mlc_ctx *ctx);            /* [0, 1) */
MLCDEF float mlc_rand_normal(mlc_ctx *ctx);             /* N(0, 1) */

/* Frames: everything an op allocates between begin and end is released by end. */
typedef struct mlc_frame { mlc_ctx *ctx; void *block; size_t block_used, arena_used; void *tape; int level;
                           uint64_t id; } mlc_frame;
MLCDEF mlc_frame mlc_frame_begin(mlc_ctx *ctx);
MLCDEF void mlc_frame_end(mlc_frame frame);

/* ============================================================================================
   @section api-tensors  Public API: tensors
   ============================================================================================ */

/* What a tensor stores: float32 (the default), bfloat16 or float16. Arithmetic is float32
   whatever the storage (an op on half tensors computes in float32 and rounds its result once,
   to nearest even, as PyTorch does on the CPU); gradients are float32 for every dtype. Mixing
   dtypes in an op promotes as PyTorch does: the same dtype stays, anything else is float32.
   MLC_I8 is a quantized tensor (see "int8" below): int8 values q standing for scale · (q - zero
   point), per tensor or per row; only the quantized ops take it, and mlc_read dequantizes. */
typedef enum mlc_scalar_type { MLC_F32 = 0, MLC_BF16, MLC_F16, MLC_I8 } mlc_scalar_type;

struct mlc_tensor {                     /* read the fields; change them only through the API */
    mlc_ctx *ctx;
    int ndim;
    int shape[MLC_MAX_DIMS];
    size_t size;                        /* number of elements */
    float *data;                        /* host copy (on a device: current after mlc_host_data) */
    float *grad;                        /* gradient after mlc_backward, or NULL; read it    */
                                        /* with mlc_host_grad: after mlc_zero_grad it counts */
                                        /* as zeros, written by the next reader or product  */
    int requires_grad;
    int persistent;                     /* 1: heap-owned (parameters), 0: in the frame arena */
    struct mlc__node *node;             /* the op that produced it (NULL for leaves) */
    int on_device;                      /* 1: lives on the context's device (see Devices) */
    int level;                          /* how many frames were open when it was made */
    uint64_t frame_id;                  /* the frame it was made in (misuse checks) */
    int graph_used;                     /* 1: a backward ran through the op that made it */
    unsigned stale;                     /* which copies are out of date (MLC__*_STALE bits) */
    void *device_data, *device_grad;    /* the backend's buffers */
    int read_only;                      /* 1: data is the caller's read-only memory (mlc_from_const) */
    mlc_scalar_type dtype;              /* MLC_F32: values in data; else in half, and data is NULL */
    uint16_t *half;                     /* a bf16 or f16 tensor's values (read them with mlc_read) */
    int8_t *int8;                       /* an MLC_I8 tensor's values, which stand for          */
    float qscale;                       /*   qscale · (q - qzero) (per tensor), or, when        */
    int qzero;                          /*   qscales is set, qscales[r] · q in row r (axis 0)   */
    struct mlc_tensor *qscales;
    int32_t *qsums;                     /* a long-lived int8 weight's row sums, kept between uses */
    float *packed;                      /* a long-lived convolution weight packed for mlc's products, */
                                        /* kept between calls in inference (dropped when written) */
    const struct mlc_tensor *stands_for;/* a float32 stand-in for a half tensor: that one (else NULL) */
    const char *owner, *owner_name;     /* who holds it ("Linear", "an Adam optimiser"; NULL: you), */
                                        /* and its name there ("weight", "exp_avg", "params")  */
    int freed;                          /* 1: mlc_tensor_free released it (a second free is refused) */
    struct mlc__node *last_use;         /* a leaf during mlc_backward: the oldest node that reads it */
};

MLCDEF mlc_tensor *mlc_empty(mlc_ctx *ctx, int ndim, const int *shape);   /* uninitialised */
MLCDEF mlc_tensor *mlc_zeros(mlc_ctx *ctx, int ndim, const int *shape);
MLCDEF mlc_tensor *mlc_ones(mlc_ctx *ctx, int ndim, const int *shape);
MLCDEF mlc_tensor *mlc_full(mlc_ctx *ctx, int ndim, const int *shape, float value);
MLCDEF mlc_tensor *mlc_from_data(mlc_ctx *ctx, int ndim, const int *shape, const float *data);
MLCDEF mlc_tensor *mlc_arange(mlc_ctx *ctx, float start, float stop, float step);
MLCDEF mlc_tensor *mlc_rand(mlc_ctx *ctx, int ndim, const int *shape);    /* U[0, 1) */
MLCDEF mlc_tensor *mlc_randn(mlc_ctx *ctx, int ndim, const int *shape);   /* N(0, 1) */
/* A long-lived leaf (heap, not the arena) with requires_grad set, filled with zeros. */
MLCDEF mlc_tensor *mlc_parameter(mlc_ctx *ctx, int ndim, const int *shape);
/* A long-lived leaf over the caller's read-only data (weights in flash), no copy: data must
   outlive it. For inference: whatever would write it is MLC_ERR_STATE naming the call. */
MLCDEF mlc_tensor *mlc_from_const(mlc_ctx *ctx, int ndim, const int *shape, const float *data);
/* A long-lived copy of t (a leaf; requires_grad copied). */
MLCDEF mlc_tensor *mlc_keep(mlc_tensor *t);
/* dtypes: a tensor's, its name ("float32", "bfloat16", "float16"), creation in a dtype (values
   rounded to nearest even), and the differentiable cast (x itself when x has that dtype; the
   gradient flows back in float32) */
MLCDEF mlc_scalar_type mlc_dtype(const mlc_tensor *t);
MLCDEF const char *mlc_dtype_name(mlc_scalar_type dtype);
MLCDEF mlc_tensor *mlc_full_dtype(mlc_ctx *ctx, int ndim, const int *shape, float value,
                                  mlc_scalar_type dtype);
MLCDEF mlc_tensor *mlc_from_data_dtype(mlc_ctx *ctx, int ndim, const int *shape, const float *data,
                                       mlc_scalar_type dtype);
MLCDEF mlc_tensor *mlc_to_dtype(mlc_tensor *x, mlc_scalar_type dtype);
/* The dtype of parameters and module buffers made from now on (torch.set_default_dtype; a
   count such as num_batches_tracked stays float32); returns the previous one. A model built
   under MLC_BF16 and loaded from a file is bf16 from the start, never float32 in between; half
   parameters get a gradient buffer only when a backward needs one. */
MLCDEF mlc_scalar_type mlc_set_default_dtype(mlc_ctx *ctx, mlc_scalar_type dtype);
/* One value's conversions, bit-exact with PyTorch's .to(): round to nearest even, subnormals
   kept, overflow to infinity, signed zero kept, NaN stays NaN (bf16: 0x7fc0, PyTorch's scalar
   rounding; f16: quiet, its sign kept, payload dropped; widening is exact, f16 NaNs quieted). */
MLCDEF uint16_t mlc_float_to_bf16(float v);
MLCDEF uint16_t mlc_float_to_f16(float v);
MLCDEF float mlc_bf16_to_float(uint16_t bits);
MLCDEF float mlc_f16_to_float(uint16_t bits);
/* Long-lived tensors you made only: a module's parameter or buffer and an optimiser's parameter
   or state belong to it until mlc_destroy, so freeing one is MLC_ERR_STATE naming the owner (to
   replace a module's tensor, assign the new one; the old stays until mlc_destroy), and so is a
   second free or a use of a freed tensor while its record is kept (its struct, no values: until
   MLC_FREED_KEPT later frees, or mlc_destroy; after that a second free is undefined, as free's). */
MLCDEF void mlc_tensor_free(mlc_tensor *t);

MLCDEF mlc_tensor *mlc_requires_grad(mlc_tensor *t, int on);   /* returns t */
MLCDEF mlc_tensor *mlc_detach(mlc_tensor *t);   /* shares data, cut from the tape */
MLCDEF float mlc_item(mlc_tensor *t);           /* the value of a one-element tensor (NaN on error) */
MLCDEF float mlc_get(mlc_tensor *t, size_t flat_index);
MLCDEF mlc_result mlc_read(mlc_tensor *t, float *dst, size_t count);        /* copy out */
MLCDEF mlc_result mlc_write(mlc_tensor *t, const float *src, size_t count); /* copy in */
MLCDEF int mlc_same_shape(const mlc_tensor *a, const mlc_tensor *b);
#ifndef MLC_NO_STDIO
MLCDEF void mlc_print(mlc_tensor *t, const char *label);
#endif

/* ---- Devices -------------------------------------------------------------------------------
   A context runs on one device, picked by config.device or, when that is NULL, by the
   environment variable MLC_DEVICE: "cpu" (the default); with MLC_OPENCL defined also "opencl"
   (the first OpenCL device), "opencl:N" (row N of mlc_devices), a piece of a device's name
   ("Iris", "gfx1030"), or "best". "best" is PyTorch's
       device = "cuda" if torch.cuda.is_available() else "cpu"
   in one word: the first GPU if there is one, else the CPU, silently (it says which at the INFO
   level of the log hook). It never takes an OpenCL driver that runs on the CPU (PoCL, Intel's
   CPU runtime): name one ("opencl", "opencl:N", a piece of its name) to use it. A device named
   explicitly that cannot be had (no such device, no OpenCL library, no MLC_OPENCL in the
   build, a driver that fails to open it) makes mlc_create return NULL with the reason, which
   names the device asked for, logged and written to config.error:
       char why[256];
       mlc_ctx *ctx = mlc_create(&(mlc_config){ .device = "opencl", .error = why,
                                                 .error_bytes = sizeof why });
       if (!ctx) { fprintf(stderr, "%s\n", why); return 1; }
   so a program never runs on a device it did not ask for. New tensors live on the
   context's device; ops run where their inputs live (inputs on two devices are an error); each
   tensor on a device keeps a host copy that reads (mlc_item, mlc_read, mlc_host_data) bring up
   to date, so only reads wait for the device. An op the device has no kernel for runs on the
   CPU through copies: counted in mlc_stats.fallbacks and logged once per op. */
typedef struct mlc_device_info {
    int index;                          /* N in "opencl:N" */
    char platform[64], name[128], version[64];
    const char *type;                   /* "gpu", "cpu", "accelerator" or "other" */
    size_t memory_bytes;
    int compute_units;
} mlc_device_info;
/* Fills up to max rows and returns how many devices there are (0 without MLC_OPENCL, or when no
   OpenCL library or platform is found; one binary runs either way). */
MLCDEF int mlc_devices(mlc_device_info *out, int max);
MLCDEF int mlc_has_device(const mlc_ctx *ctx);          /* 1 when the context runs on a device */
MLCDEF void mlc_sync(mlc_ctx *ctx);     /* waits until the device has run every op given so far */
MLCDEF mlc_tensor *mlc_to(mlc_tensor *t, int on_device); /* moves t (and its gradient); returns t */
MLCDEF mlc_result mlc_module_to(mlc_module *m, int on_device); /* every parameter and buffer */
/* Every parameter and buffer converted to dtype (model.to(torch.bfloat16)): the values rounded,
   the old storage freed; a half parameter keeps no gradient buffer until a backward needs one.
   For inference, or loading a half checkpoint at half the memory: optimisers update float32
   parameters only (train with mlc_autocast_begin). On the CPU in this version. */
MLCDEF mlc_result mlc_module_to_dtype(mlc_module *m, mlc_scalar_type dtype);
/* Every Linear in m (children's too) gets an int8 weight, scaled per output row as by
   mlc_quantize_weight (the float weight freed), and a buffer "weight_scale" [out] with the
   scales; so do the recurrent layers' weight_ih_lN and weight_hh_lN ("weight_ih_l0_scale"):
   torch.ao.quantization.quantize_dynamic(m, {nn.Linear, nn.LSTM, ...}, dtype=torch.qint8). Their
   products then run dynamically quantized (mlc_linear with an int8 weight). Save and load it as
   any module (its weights as I8 safetensors entries, the scales F32). For inference: optimisers
   refuse int8 weights. */
MLCDEF mlc_result mlc_quantize_dynamic(mlc_module *m);
/* Static quantization of a Sequential (torch.ao.quantization's prepare, calibrate, convert):
   the model is put in eval mode and run on the calibration batches (at least one: without them
   it is an error) to observe every child's output range (min and max, 0 included), a
   BatchNorm right after a Conv2d folded into it first and a ReLU right after a Conv2d or Linear
   observed with it. Then the model runs in int8: its input quantized at the observed range,
   Conv2d and Linear as mlc_conv2d_int8 / mlc_linear_int8 (weights as mlc_quantize_weight's),
   pooling and Flatten on int8, any other child in float32 between a dequantize and a quantize
   (PyTorch's stubs), and the output dequantized: mlc_forward still takes and returns float32.
   The ranges are buffers ("input_scale", "input_zero_point" on the Sequential; "scale",
   "zero_point" on each child; a file holds the zero points as I32): a saved model loads
   into one quantized the same way. The folded BatchNorms keep their tensors but run as the
   identity. */
MLCDEF mlc_result mlc_quantize_static(mlc_module *m, mlc_tensor *const *calibration, int count);
/* The observer: percentile 0 (or 100) takes each range's min and max (MinMaxObserver);
   percentile p in [50, 100) clips it where (100 - p) % of the values lie outside, split between
   the two ends (all at the top for a range that starts at 0, as after a ReLU), from a
   2048-bin histogram of each output (PyTorch's HistogramObserver keeps one too): outliers no
   longer stretch the scale. */
typedef struct mlc_quant_opts { float percentile; } mlc_quant_opts;
MLCDEF mlc_result mlc_quantize_static_opts(mlc_module *m, mlc_tensor *const *calibration, int count,
                                           mlc_quant_opts opts);
/* t->data, brought up to date; float32. Write t through mlc_write: a write through this pointer
   is seen neither by t's device copy nor by the packed copy a convolution weight keeps in
   inference. */
MLCDEF float *mlc_host_data(mlc_tensor *t);
MLCDEF float *mlc_host_grad(mlc_tensor *t);             /* t->grad, brought up to date */
/* t's gradient becomes count = t->size floats from src (which may be mlc_host_grad(t) itself,
   written in place), made when t has none; t must require a gradient. The device copy follows,
   as mlc_write's does (data-parallel training writes averaged gradients so). */
MLCDEF mlc_result mlc_write_grad(mlc_tensor *t, const float *src, size_t count);

/* ============================================================================================
   @section api-ops  Public API: ops. Each returns a new tensor (NULL on error) and records itself on the tape
   when an input requires a gradient. Axis arguments may be negative (counted from the end).
   ============================================================================================ */

/* elementwise, NumPy broadcasting */
MLCDEF mlc_tensor *mlc_add(mlc_tensor *a, mlc_tensor *b);
MLCDEF mlc_tensor *mlc_sub(mlc_tensor *a, mlc_tensor *b);
MLCDEF mlc_tensor *mlc_mul(mlc_tensor *a, mlc_tensor *b);
MLCDEF mlc_tensor *mlc_div(mlc_tensor *a, mlc_tensor *b);
MLCDEF mlc_tensor *mlc_add_scalar(mlc_tensor *x, float s);
MLCDEF mlc_tensor *mlc_mul_scalar(mlc_tensor *x, float s);
MLCDEF mlc_tensor *mlc_rsub_scalar(mlc_tensor *x, float s);    /* s - x */
MLCDEF mlc_tensor *mlc_pow(mlc_tensor *x, float exponent);
MLCDEF mlc_tensor *mlc_clamp(mlc_tensor *x, float lo, float hi);
MLCDEF mlc_tensor *mlc_where(mlc_tensor *cond, mlc_tensor *a, mlc_tensor *b); /* cond != 0 ? a : b */
MLCDEF mlc_tensor *mlc_masked_fill(mlc_tensor *x, mlc_tensor *mask, float value); /* mask != 0 */

/* maps and activations: mlc_neg(x), mlc_exp(x), ... one per line below, as PyTorch has them
   (NaN in, NaN out). f is y = f(x); df is dy/dx, written with x and y. */
#define MLC__UNARY_MAPS(X) \
    X(NEG,        neg,        -x,                          -1.0f) \
    X(EXP,        exp,        MLC_EXPF(x),                 y) \
    X(LOG,        log,        MLC_LOGF(x),                 1.0f / x) \
    X(SQRT,       sqrt,       MLC_SQRTF(x),                0.5f / y) \
    X(ABS,        abs,        x < 0 ? -x : x,              x > 0 ? 1.0f : x < 0 ? -1.0f : 0.0f) \
    X(RELU,       relu,       x < 0 ? 0.0f : x,            x <= 0 ? 0.0f : 1.0f) \
    X(RELU6,      relu6,      x < 0 ? 0.0f : x > 6 ? 6.0f : x,         x <= 0 || x >= 6 ? 0.0f : 1.0f) \
    X(GELU,       gelu,       0.5f * x * (1.0f + MLC_ERFF(x * MLC__INV_SQRT_2)),          /* exact */ \
                  0.5f * (1.0f + MLC_ERFF(x * MLC__INV_SQRT_2)) \
                  + x * MLC__INV_SQRT_2PI * MLC_EXPF(-0.5f * x * x)) \
    X(GELU_TANH,  gelu_tanh, \
                  0.5f * x * (1.0f + MLC_TANHF(MLC__SQRT_2_OVER_PI * (x + 0.044715f * x * x * x))), \
                  mlc__gelu_tanh_slope(x)) \
    X(SIGMOID,    sigmoid,    mlc__sigmoidf(x),            y * (1.0f - y)) \
    X(TANH,       tanh,       MLC_TANHF(x),                1.0f - y * y) \
    X(SILU,       silu,       x * mlc__sigmoidf(x), \
                  mlc__sigmoidf(x) * (1.0f + x * (1.0f - mlc__sigmoidf(x)))) \
    X(SOFTPLUS,   softplus,   x > 20.0f ? x : MLC_LOG1PF(MLC_EXPF(x)),                  mlc__sigmoidf(x)) \
    X(LOGSIGMOID, logsigmoid, (x < 0 ? x : 0.0f) - MLC_LOG1PF(MLC_EXPF(x < 0 ? x : -x)), mlc__sigmoidf(-x)) \
    X(HARDSWISH,  hardswish,  x * (x + 3 < 0 ? 0.0f : x + 3 > 6 ? 6.0f : x + 3) / 6, \
                  x < -3 ? 0.0f : x <= 3 ? (2 * x + 3) / 6 : 1.0f)
#define MLC__UNARY_DECLARE(NAME, name, f, df) MLCDEF mlc_tensor *mlc_##name(mlc_tensor *x);
MLC__UNARY_MAPS(MLC__UNARY_DECLARE)
#undef MLC__UNARY_DECLARE
MLCDEF mlc_tensor *mlc_leaky_relu(mlc_tensor *x, float slope);
MLCDEF mlc_tensor *mlc_softmax(mlc_tensor *x, int axis);
MLCDEF mlc_tensor *mlc_log_softmax(mlc_tensor *x, int axis);

/* matrix products: a [..., M, K] @ b [..., K, N] (a or b may be 2-D; batch dims must match);
   transpose_a / transpose_b read that operand's last two dims swapped */
MLCDEF mlc_tensor *mlc_matmul(mlc_tensor *a, mlc_tensor *b);
MLCDEF mlc_tensor *mlc_matmul_t(mlc_tensor *a, mlc_tensor *b, int transpose_a, int transpose_b);
MLCDEF mlc_tensor *mlc_linear(mlc_tensor *x, mlc_tensor *weight, mlc_tensor *bias); /* x W^T + b */
/* The matrix product every op uses, on raw row-major arrays (see mlc_gemm_fn): the config's
   gemm hook when set, else cblas_sgemm under MLC_USE_CBLAS, else mlc's own loop. */
MLCDEF void mlc_gemm(mlc_ctx *ctx, int transpose_a, int transpose_b, int M, int N, int K,
                     const float *A, const float *B, float beta, float *C);
/* The plain triple loop: the reference every fast path (and your hook) is tested against. */
MLCDEF void mlc_gemm_reference(int transpose_a, int transpose_b, int M, int N, int K,
                               const float *A, const float *B, float beta, float *C);
/* mlc_gemm with bfloat16 A and B (mlc_float_to_bf16's bits) and float32 C: C = op(A) op(B) +
   beta C (beta 0 or 1), sums in float32. On x86-64 with AVX-512 BF16 and no gemm hook it runs
   mlc's vdpbf16ps kernel (matmul and linear on bf16 tensors run it too); that instruction
   treats subnormal inputs (bf16 below 2^-126) as zero and flushes subnormal sums to zero.
   Elsewhere, under MLC_USE_CBLAS or with a hook, A and B are widened to float32 (exactly) in
   arena scratch and multiplied by mlc_gemm. */
MLCDEF void mlc_gemm_bf16(mlc_ctx *ctx, int transpose_a, int transpose_b, int M, int N, int K,
                          const uint16_t *A, const uint16_t *B, float beta, float *C);
/* C[M, N] (int32) = A[M, K] · B[N, K]^T: A and B int8, row-major with K contiguous (B as a
   Linear's weight is stored, one row per output). Exact integer sums; B's values must lie in
   [-127, 127] (symmetric weights; a -128 there may give other sums on some CPUs), A's
   anywhere in [-128, 127]. The same bits on every CPU and for any thread count. K is at most
   65536 (2^16: no int32 sum can overflow; more is MLC_ERR_ARG). On x86-64 it runs mlc's
   AVX-512 VNNI, AVX-VNNI or AVX2 kernel, the best the CPU has (workspace from the arena; with
   a fixed arena the portable loops), elsewhere portable C loops (int16 x int16 products
   summed in int32, as a Cortex-M4 multiplies). */
MLCDEF void mlc_gemm_i8(mlc_ctx *ctx, int M, int N, int K, const int8_t *A, const int8_t *B, int32_t *C);
/* The plain loop: the reference every int8 kernel is tested against. */
MLCDEF void mlc_gemm_i8_reference(int M, int N, int K, const int8_t *A, const int8_t *B, int32_t *C);

/* reductions over one axis (keepdim keeps it with size 1) and over everything */
MLCDEF mlc_tensor *mlc_sum(mlc_tensor *x, int axis, int keepdim);
MLCDEF mlc_tensor *mlc_mean(mlc_tensor *x, int axis, int keepdim);
MLCDEF mlc_tensor *mlc_max(mlc_tensor *x, int axis, int keepdim);
MLCDEF mlc_tensor *mlc_var(mlc_tensor *x, int axis, int keepdim, int unbiased);
MLCDEF mlc_tensor *mlc_sum_all(mlc_tensor *x);
MLCDEF mlc_tensor *mlc_mean_all(mlc_tensor *x);
MLCDEF mlc_tensor *mlc_argmax(mlc_tensor *x, int axis);   /* indices as floats; no gradient */
MLCDEF mlc_tensor *mlc_cumsum(mlc_tensor *x, int axis);   /* running sums, torch.cumsum */

/* losses */
typedef enum mlc_reduction { MLC_REDUCE_MEAN = 0, MLC_REDUCE_SUM, MLC_REDUCE_NONE } mlc_reduction;
#define MLC_NO_IGNORE (-2147483647 - 1)
/* logits [N, C], target [N] class indices; targets equal to ignore_index add nothing */
MLCDEF mlc_tensor *mlc_cross_entropy(mlc_tensor *logits, mlc_tensor *target,
                                     mlc_reduction reduction, int ignore_index);
/* Cross entropy with PyTorch's other options; zero means default: reduction mean, no class
   ignored, no smoothing. ignore 1: rows whose target is ignore_index add nothing (a separate
   switch, so a zeroed struct ignores no class). label_smoothing ε in [0, 1]: the target is
   (1 - ε) onehot + ε / C, as torch's F.cross_entropy(..., label_smoothing=ε). Start from
   mlc_ce_defaults(). */
typedef struct mlc_ce_opts {
    mlc_reduction reduction;
    int ignore, ignore_index;
    float label_smoothing;
} mlc_ce_opts;
MLCDEF mlc_tensor *mlc_cross_entropy_opts(mlc_tensor *logits, mlc_tensor *target, mlc_ce_opts opts);
MLCDEF mlc_tensor *mlc_nll_loss(mlc_tensor *log_probs, mlc_tensor *target,
                                mlc_reduction reduction, int ignore_index);
MLCDEF mlc_tensor *mlc_mse_loss(mlc_tensor *pred, mlc_tensor *target, mlc_reduction reduction);
MLCDEF mlc_tensor *mlc_bce_with_logits(mlc_tensor *logits, mlc_tensor *target,
                                       mlc_reduction reduction);

/* shape ops */
MLCDEF mlc_tensor *mlc_reshape(mlc_tensor *x, int ndim, const int *shape); /* one dim may be -1 */
MLCDEF mlc_tensor *mlc_flatten(mlc_tensor *x, int start_axis);   /* [N, C, H, W], 1 -> [N, CHW] */
MLCDEF mlc_tensor *mlc_transpose(mlc_tensor *x, int axis0, int axis1);
MLCDEF mlc_tensor *mlc_permute(mlc_tensor *x, const int *order);
MLCDEF mlc_tensor *mlc_slice(mlc_tensor *x, int axis, int start, int end);   /* Python-style */
/* xs[0..count) joined along axis; the context is an argument, so count 0 is an error too */
MLCDEF mlc_tensor *mlc_concat(mlc_ctx *ctx, mlc_tensor *const *xs, int count, int axis);
MLCDEF mlc_tensor *mlc_index_select(mlc_tensor *x, int axis, mlc_tensor *index);  /* index 1-D */
MLCDEF mlc_tensor *mlc_gather(mlc_tensor *x, int axis, mlc_tensor *index);   /* torch.gather */
MLCDEF mlc_tensor *mlc_copy(mlc_tensor *x);

/* neural-network ops */
MLCDEF mlc_tensor *mlc_dropout(mlc_tensor *x, float p, int training);
MLCDEF mlc_tensor *mlc_layer_norm(mlc_tensor *x, mlc_tensor *weight, mlc_tensor *bias, float eps);
/* over the last `dims` axes (PyTorch's normalized_shape = x.shape[-dims:]); weight and bias, when
   given, have that shape. mlc_layer_norm is dims = 1. */
MLCDEF mlc_tensor *mlc_layer_norm_dims(mlc_tensor *x, int dims, mlc_tensor *weight, mlc_tensor *bias,
                                       float eps);
/* x [N, C, ...]; training: batch statistics, running stats updated with momentum (no gradient);
   otherwise the running statistics. weight, bias, running stats may be NULL. */
MLCDEF mlc_tensor *mlc_batch_norm(mlc_tensor *x, mlc_tensor *running_mean, mlc_tensor *running_var,
                                  mlc_tensor *weight, mlc_tensor *bias, int training,
                                  float momentum, float eps);
MLCDEF mlc_tensor *mlc_embedding(mlc_tensor *weight, mlc_tensor *index);   /* [V, D], [...] */
/* Convolution options, zero meaning default: stride 1, padding 0, dilation 1, groups 1. stride,
   padding and dilation set both axes, or the height's where the width's field is set: stride_w,
   padding_w, dilation_w (0: as the height's; padding_w = MLC_ZERO_INT: 0), as torch's tuples:
   stride=(2, 1), padding=(1, 0), dilation=(1, 2) is { 2, 1, 1, 0, 1, MLC_ZERO_INT, 2 }. Start
   from mlc_conv_defaults(). */
typedef struct mlc_conv_opts { int stride, padding, dilation, groups, stride_w, padding_w, dilation_w; }
    mlc_conv_opts;
/* An int option's explicit zero where 0 means default (padding_w of mlc_conv_opts and
   mlc_pool_opts: 0 is "as the height's"). MLC_ZERO is a float: in an int field it reads as 0. */
#define MLC_ZERO_INT (-1)
/* x [N, C, H, W], weight [O, C/groups, KH, KW], bias [O] or NULL */
MLCDEF mlc_tensor *mlc_conv2d(mlc_tensor *x, mlc_tensor *weight, mlc_tensor *bias, mlc_conv_opts opts);
/* relu6(conv2d(...)) as one op on the CPU (no pass of its own over the output; MobileNets'
   Conv2d + ReLU6 once BatchNorm is folded into the conv); on a device the two run in turn */
MLCDEF mlc_tensor *mlc_conv2d_relu6(mlc_tensor *x, mlc_tensor *weight, mlc_tensor *bias, mlc_conv_opts opts);
MLCDEF mlc_tensor *mlc_max_pool2d(mlc_tensor *x, int kernel, int stride, int padding); /* stride 0: kernel */
MLCDEF mlc_tensor *mlc_avg_pool2d(mlc_tensor *x, int kernel, int stride, int padding); /* pads count */
/* Pooling with PyTorch's other options; zero means default: stride = kernel, padding 0,
   ceil_mode 0 (floor), exclude_pad 0 (padding counts). ceil_mode 1: output size rounded up (a
   last window may hang over the right or bottom edge; none starts in the padding there), as
   torch's ceil_mode=True. exclude_pad 1 (average pooling): divide by the values inside the
   input only, torch's count_include_pad=False. The kernel argument, stride and padding are the
   height's, and the width's too where kernel_w, stride_w, padding_w are 0 (stride_w 0 with
   stride 0: kernel_w; padding_w MLC_ZERO_INT: 0), as torch's kernel_size=(3, 2), stride=(2, 1),
   padding=(1, 0): mlc_max_pool2d_opts(x, 3, (mlc_pool_opts){ .stride = 2, .padding = 1,
   .kernel_w = 2, .stride_w = 1, .padding_w = MLC_ZERO_INT }). Start from mlc_pool_defaults(). */
typedef struct mlc_pool_opts { int stride, padding, ceil_mode, exclude_pad, kernel_w, stride_w, padding_w; }
    mlc_pool_opts;
MLCDEF mlc_tensor *mlc_max_pool2d_opts(mlc_tensor *x, int kernel, mlc_pool_opts opts);
MLCDEF mlc_tensor *mlc_avg_pool2d_opts(mlc_tensor *x, int kernel, mlc_pool_opts opts);
MLCDEF mlc_tensor *mlc_global_avg_pool2d(mlc_tensor *x);   /* [N, C, H, W] -> [N, C] */
/* Scaled dot-product attention, torch.nn.functional.scaled_dot_product_attention:
   softmax(q kᵀ scale + mask) v with q [..., T, D], k [..., S, D], v [..., S, Dv] -> [..., T, Dv];
   rank 2 to 4, the same leading dims (batch, heads) on all three. opts (zero: none, default):
   mask is added to the scores and broadcasts to [..., T, S] ([T, S]; [B, 1, 1, S] for padding;
   -INFINITY hides a key); it takes no gradient (one that requires a gradient is MLC_ERR_ARG).
   causal hides the keys j > i from query i, top-left aligned as PyTorch's is_causal (all keys
   hidden gives NaN, as in PyTorch). dropout zeroes that share of the weights, drawn from the
   context's RNG, and scales the rest by 1 / (1 - dropout). scale 0: 1/√D (MLC_ZERO: 0). The CPU
   holds one head's [T, S] scores per thread; backward recomputes them from each row's saved
   log-sum-exp. Start from mlc_attention_defaults(). */
typedef struct mlc_attention_opts { mlc_tensor *mask; int causal; float dropout, scale; } mlc_attention_opts;
MLCDEF mlc_tensor *mlc_attention(mlc_tensor *q, mlc_tensor *k, mlc_tensor *v, mlc_attention_opts opts);

/* int8 (torch.ao.quantization's int8 schemes). An MLC_I8 tensor holds int8 values q standing for
   scale · (q - zero point): per tensor, or per row of axis 0 with zero point 0 (a weight's
   output channels: symmetric, q in [-127, 127]). A value is divided by its scale as v · (1/s),
   rounded to nearest even, clamped. Only the ops below take int8 tensors (any other names the
   op and refuses); mlc_read and mlc_get give the dequantized values; no gradient flows into an
   int8 tensor.
     mlc_quantize         x -> int8 with scale and zero point (torch.quantize_per_tensor, qint8)
     mlc_quantize_weight  w [rows, ...] -> int8 per row, scale max|row| / 127 (1 for zeros);
                          a NaN or an infinity is MLC_ERR_ARG naming the row
     mlc_dequantize       q -> float32
   mlc_linear with an int8 weight (mlc_quantize_weight's) is the dynamically quantized linear
   (torch.ao.nn.quantized.dynamic.Linear): each row of x is quantized as the op runs over its
   range [lo, hi] (0 included: scale (hi - lo) / 255, zero point -128 - round(lo / scale), as
   PyTorch quantizes the whole input), multiplied in int32 (mlc_gemm_i8), scaled back to
   float32 and the bias added. The gradient reaches x (through W's dequantized values, the
   rounding counted as identity) and the bias. */
MLCDEF mlc_tensor *mlc_quantize(mlc_tensor *x, float scale, int zero_point);
MLCDEF mlc_tensor *mlc_quantize_weight(mlc_tensor *w);
MLCDEF mlc_tensor *mlc_dequantize(mlc_tensor *q);
/* Static quantization (torch.ao.nn.quantized.Conv2d, Linear, FloatFunctional.add): int8 in,
   int8 out with the given output scale and zero point (calibrated; after a ReLU or ReLU6 the
   range [0, max] makes the activation part of the clamp). weight: mlc_quantize_weight's; bias:
   float32, rounded to int32 at s_x s_w. Integer sums, then fixed-point requantization (a
   multiplier's 24-bit mantissa and a shift, one rounding): the same integers on every
   platform. mlc_max_pool2d, mlc_avg_pool2d (and _opts), mlc_global_avg_pool2d, mlc_reshape
   and mlc_flatten take int8 tensors too, keeping their scale and zero point. No gradient; on
   the CPU (a device counts a fallback). */
MLCDEF mlc_tensor *mlc_conv2d_int8(mlc_tensor *x, mlc_tensor *weight, mlc_tensor *bias, mlc_conv_opts opts,
                                   float scale, int zero_point);
MLCDEF mlc_tensor *mlc_linear_int8(mlc_tensor *x, mlc_tensor *weight, mlc_tensor *bias, float scale,
                                   int zero_point);
MLCDEF mlc_tensor *mlc_add_int8(mlc_tensor *a, mlc_tensor *b, float scale, int zero_point);
/* An int8 tensor over the caller's read-only memory (weights in flash), as mlc_from_const: per
   tensor (scale, zero_point), or per row with row_scales (float32 [shape[0]]; zero point 0) */
MLCDEF mlc_tensor *mlc_from_const_int8(mlc_ctx *ctx, int ndim, const int *shape, const int8_t *data,
                                       float scale, int zero_point, mlc_tensor *row_scales);

/* ============================================================================================
   @section api-autograd  Public API: autograd
   ============================================================================================ */

MLCDEF mlc_result mlc_backward(mlc_tensor *loss);        /* loss has one element */
MLCDEF mlc_result mlc_backward_with(mlc_tensor *out, mlc_tensor *grad_out);
MLCDEF int mlc_set_grad_enabled(mlc_ctx *ctx, int enabled);   /* returns the previous state */
/* A hook mlc_backward calls for each leaf that requires a gradient (a parameter) as soon as its
   gradient is complete: after the oldest node that reads it, which may be long before the walk
   ends. Data-parallel training starts sending a gradient from here while backward goes on
   (MPI data parallelism). Leaves the walk never reaches are not reported; a leaf whose nodes got no
   gradient is reported with its gradient unchanged. fn NULL removes the hook. */
typedef void (*mlc_grad_ready_fn)(mlc_tensor *leaf, void *user);
MLCDEF void mlc_set_grad_ready_hook(mlc_ctx *ctx, mlc_grad_ready_fn fn, void *user);

/* Mixed precision, as torch.autocast: from begin to end, the products (matmul, linear, conv2d,
   attention, and the recurrent layers' products through them) run on dtype copies of their
   float32 inputs and return dtype, accumulating in float32; softmax, log_softmax, the losses,
   the norms and the reductions take float32 (a half input is cast up). A parameter's copy is
   made once and reused until mlc_step, mlc_autocast_end or the end of the frame it was made in,
   so a step casts each weight once. dtype: MLC_BF16 or MLC_F16 (with mlc_grad_scaler). Master
   weights and the optimiser stay float32. On a device the copies are made there. */
MLCDEF mlc_result mlc_autocast_begin(mlc_ctx *ctx, mlc_scalar_type dtype);
MLCDEF void mlc_autocast_end(mlc_ctx *ctx);

/* Finite-difference gradient check of fn(inputs) against mlc_backward, for any composition.
   The output is projected on fixed random weights and the sums are taken in double. */
typedef mlc_tensor *(*mlc_gradcheck_fn)(mlc_tensor **inputs, void *user);
/* 0: 1e-3, 1e-3, 1e-2; start from mlc_gradcheck_defaults() */
typedef struct mlc_gradcheck_opts { double eps, atol, rtol; } mlc_gradcheck_opts;
typedef struct mlc_gradcheck_report {
    double max_abs_error;               /* worst |analytic - numeric| */
    int worst_input;                    /* which input it was in (-1: fn failed) */
    size_t worst_index;                 /* which element */
    double analytic, numeric;           /* the two values there */
} mlc_gradcheck_report;
/* Returns 1 when every gradient element agrees within atol + rtol * |numeric|. */
MLCDEF int mlc_gradcheck(mlc_ctx *ctx, mlc_gradcheck_fn fn, void *user, mlc_tensor **inputs,
                         int count, const mlc_gradcheck_opts *opts, mlc_gradcheck_report *report);

/* ============================================================================================
   @section api-modules
   Public API: modules (torch.nn). Parameters are named as in PyTorch ("0.weight"), so a state
   dict maps one to one. Modules belong to the context and are freed by mlc_destroy.
   ============================================================================================ */

typedef mlc_tensor *(*mlc_forward_fn)(mlc_module *self, mlc_tensor *x);
/* The parameters, and the buffers, a module holds (a quantized BatchNorm: 3 buffers and 2 more) */
#define MLC_MODULE_MAX_TENSORS 6
/* How many levels of children a module may have under it (PyTorch's models have about 10). A
   walk over the tree (train, to, parameters, an optimiser, a forward) recurses once a level, so
   a deeper tree is an error (MLC_ERR_ARG naming the call), never a stack overflow. */
#define MLC_MODULE_MAX_DEPTH 100
struct mlc_module {
    mlc_ctx *ctx;
    const char *type;                   /* "Linear", "Conv2d", ... */
    mlc_forward_fn forward;
    int training;
    int n_params, n_buffers, n_children;
    mlc_tensor *params[MLC_MODULE_MAX_TENSORS];
    const char *param_names[MLC_MODULE_MAX_TENSORS];
    mlc_tensor *buffers[MLC_MODULE_MAX_TENSORS];     /* state without gradient (running stats) */
    const char *buffer_names[MLC_MODULE_MAX_TENSORS];
    mlc_module **children;
    char **child_names;
    mlc_conv_opts conv;                 /* Conv2d */
    int kernel;                         /* pools; MultiheadAttention: num_heads */
    mlc_pool_opts pool;                 /* pools: set padding, ceil_mode, exclude_pad after making one */
    int cell, directions;               /* RNN, LSTM, GRU: their mlc_cell and 1 or 2 (else 0) */
    float alpha, eps, momentum;         /* leaky slope or dropout p (recurrent: between layers); norms */
    void *user;                         /* for modules you write */
};

MLCDEF mlc_module *mlc_nn_linear(mlc_ctx *ctx, int in_features, int out_features);
MLCDEF mlc_module *mlc_nn_linear_nobias(mlc_ctx *ctx, int in_features, int out_features);
MLCDEF mlc_module *mlc_nn_conv2d(mlc_ctx *ctx, int in_channels, int out_channels, int kernel,
                                 mlc_conv_opts opts);
MLCDEF mlc_module *mlc_nn_batch_norm(mlc_ctx *ctx, int features);    /* BatchNorm1d/2d */
MLCDEF mlc_module *mlc_nn_layer_norm(mlc_ctx *ctx, int features);
MLCDEF mlc_module *mlc_nn_layer_norm_shape(mlc_ctx *ctx, int ndim, const int *normalized_shape);
MLCDEF mlc_module *mlc_nn_embedding(mlc_ctx *ctx, int count, int dim);
MLCDEF mlc_module *mlc_nn_dropout(mlc_ctx *ctx, float p);
MLCDEF mlc_module *mlc_nn_relu(mlc_ctx *ctx);
MLCDEF mlc_module *mlc_nn_leaky_relu(mlc_ctx *ctx, float slope);
MLCDEF mlc_module *mlc_nn_gelu(mlc_ctx *ctx);
MLCDEF mlc_module *mlc_nn_sigmoid(mlc_ctx *ctx);
MLCDEF mlc_module *mlc_nn_tanh(mlc_ctx *ctx);
MLCDEF mlc_module *mlc_nn_silu(mlc_ctx *ctx);
MLCDEF mlc_module *mlc_nn_flatten(mlc_ctx *ctx);
MLCDEF mlc_module *mlc_nn_max_pool2d(mlc_ctx *ctx, int kernel, int stride);
MLCDEF mlc_module *mlc_nn_avg_pool2d(mlc_ctx *ctx, int kernel, int stride);
MLCDEF mlc_module *mlc_nn_global_avg_pool2d(mlc_ctx *ctx);
/* torch.nn.MultiheadAttention(embed_dim, num_heads, batch_first=True) with its parameter names
   (in_proj_weight [3E, E], in_proj_bias [3E], out_proj.weight [E, E], out_proj.bias [E]), so its
   state dict loads. mlc_forward(m, x [B, T, E]) is self-attention; mlc_forward_attention takes
   query [B, T, E], key and value [B, S, E], an additive mask broadcasting to [B, heads, T, S]
   (or NULL; mlc_attention's rules) and the causal flag. Gives the output only (no weights).
   m->alpha is the dropout on the attention weights in training (default 0). */
MLCDEF mlc_module *mlc_nn_multihead_attention(mlc_ctx *ctx, int embed_dim, int num_heads);
MLCDEF mlc_tensor *mlc_forward_attention(mlc_module *m, mlc_tensor *query, mlc_tensor *key, mlc_tensor *value,
                                         mlc_tensor *mask, int causal);
MLCDEF mlc_module *mlc_nn_sequential(mlc_ctx *ctx, ...);   /* modules, then NULL */
/* Recurrent layers as torch.nn.RNN, LSTM and GRU with batch_first=True: x [B, T, input_size],
   num_layers stacked, PyTorch's gate order (LSTM i, f, g, o; GRU r, z, n), parameter names
   (weight_ih_l0 [G·hidden, input_size], weight_hh_l0 [G·hidden, hidden], bias_ih_l0, bias_hh_l0,
   then _l1 ...; G = 1, 4, 3; bidirectional adds weight_ih_l0_reverse ...) and initialisation
   U(-1/√hidden, 1/√hidden), so PyTorch's state dict loads. mlc_forward returns the output
   sequence [B, T, D·hidden] (the last layer's h; D = 2 directions side by side when
   bidirectional, else 1). The shorthands below take num_layers as mlc_rnn_opts does (0: 1).
   dropout applies to each layer's output but the last's, in training mode, as in PyTorch. No
   proj_size yet. */
typedef enum mlc_cell { MLC_CELL_RNN_TANH = 1, MLC_CELL_RNN_RELU, MLC_CELL_LSTM, MLC_CELL_GRU } mlc_cell;
typedef struct mlc_rnn_opts {           /* zero: 1 layer, 1 direction, no dropout; mlc_rnn_defaults() */
    int num_layers, bidirectional;
    float dropout;                      /* p, in [0, 1] */
} mlc_rnn_opts;
MLCDEF mlc_module *mlc_nn_recurrent(mlc_ctx *ctx, mlc_cell cell, int input_size, int hidden_size,
                                    mlc_rnn_opts opts);
MLCDEF mlc_module *mlc_nn_rnn(mlc_ctx *ctx, int input_size, int hidden_size, int num_layers);  /* tanh */
MLCDEF mlc_module *mlc_nn_rnn_relu(mlc_ctx *ctx, int input_size, int hidden_size, int num_layers);
MLCDEF mlc_module *mlc_nn_lstm(mlc_ctx *ctx, int input_size, int hidden_size, int num_layers);
MLCDEF mlc_module *mlc_nn_gru(mlc_ctx *ctx, int input_size, int hidden_size, int num_layers);
/* The same with initial states h0 (and c0, LSTM only) [D·num_layers, B, hidden] (layer l's
   direction d at l·D + d, as PyTorch), NULL for zeros; *h_n and *c_n receive the final states,
   same shapes (pass NULL for those you do not want). */
MLCDEF mlc_tensor *mlc_rnn_forward(mlc_module *m, mlc_tensor *x, mlc_tensor *h0, mlc_tensor *c0,
                                   mlc_tensor **h_n, mlc_tensor **c_n);
/* Your own module: forward gets the module; add parameters, buffers and children by name. */
MLCDEF mlc_module *mlc_nn_custom(mlc_ctx *ctx, const char *type, mlc_forward_fn forward, void *user);
MLCDEF mlc_result mlc_module_add_param(mlc_module *m, const char *name, mlc_tensor *param);
MLCDEF mlc_result mlc_module_add_buffer(mlc_module *m, const char *name, mlc_tensor *buffer);
/* A child named "" adds its tensors under its parent's names (the recurrent modules keep one
   child per layer this way, each with its four tensors, all named as PyTorch names them). */
MLCDEF mlc_result mlc_module_add_child(mlc_module *m, const char *name, mlc_module *child);

MLCDEF mlc_tensor *mlc_forward(mlc_module *m, mlc_tensor *x);
MLCDEF void mlc_module_train(mlc_module *m, int training);   /* recursive; eval is 0 */
typedef struct mlc_named_tensor { char name[128]; mlc_tensor *tensor; } mlc_named_tensor;
/* Fill out[0..max) in PyTorch's order; return the total count (which may exceed max). */
MLCDEF int mlc_module_parameters(mlc_module *m, mlc_named_tensor *out, int max);
MLCDEF int mlc_module_state(mlc_module *m, mlc_named_tensor *out, int max);  /* params + buffers */
MLCDEF size_t mlc_module_param_count(mlc_module *m);      /* number of scalars */

/* initialisers (fans from the shape as PyTorch computes them) */
MLCDEF void mlc_init_uniform(mlc_tensor *t, float lo, float hi);
MLCDEF void mlc_init_normal(mlc_tensor *t, float mean, float std);
MLCDEF void mlc_init_constant(mlc_tensor *t, float value);
MLCDEF void mlc_init_kaiming_uniform(mlc_tensor *t, float a);   /* leaky-relu slope a, fan_in */
MLCDEF void mlc_init_kaiming_normal(mlc_tensor *t, float a);
MLCDEF void mlc_init_xavier_uniform(mlc_tensor *t, float gain);
MLCDEF void mlc_init_xavier_normal(mlc_tensor *t, float gain);

/* ============================================================================================
   @section api-optim  Public API: optimisers and schedules (zero fields take PyTorch's defaults)
   ============================================================================================ */

/* A config field left 0 takes its default; MLC_ZERO asks for an explicit zero instead (AdamW
   weight_decay, Adam beta1, RMSprop alpha, lr, eps; also a norm module's eps or momentum; any
   other field reads it as 0 too). It is the smallest float above 0, read as an exact 0 (see
   DEFAULTS at the top for why not -0.0f). Values are checked when the optimiser is made: NaN,
   infinite or out-of-range is MLC_ERR_ARG. */
#define MLC_ZERO 1.40129846e-45f
/* lr 0.01. Each optimiser's options: start from mlc_sgd_defaults(), mlc_adam_defaults(),
   mlc_rmsprop_defaults(). */
typedef struct mlc_sgd_opts { float lr, momentum, dampening, weight_decay; int nesterov; } mlc_sgd_opts;
/* 1e-3, .9, .999, 1e-8; AdamW wd 0.01; amsgrad 1: divide by the largest v so far (PyTorch's
   amsgrad=True, one more state buffer, max_exp_avg_sq) */
typedef struct mlc_adam_opts {
    float lr, beta1, beta2, eps, weight_decay;
    int amsgrad;
} mlc_adam_opts;
/* 0.01, .99, 1e-8 */
typedef struct mlc_rmsprop_opts {
    float lr, alpha, eps, weight_decay, momentum;
    int centered;
} mlc_rmsprop_opts;

/* module may be NULL: then add parameters with mlc_optim_add_param */
MLCDEF mlc_optim *mlc_sgd(mlc_ctx *ctx, mlc_module *module, mlc_sgd_opts config);
MLCDEF mlc_optim *mlc_adam(mlc_ctx *ctx, mlc_module *module, mlc_adam_opts config);
MLCDEF mlc_optim *mlc_adamw(mlc_ctx *ctx, mlc_module *module, mlc_adam_opts config);
MLCDEF mlc_optim *mlc_rmsprop(mlc_ctx *ctx, mlc_module *module, mlc_rmsprop_opts config);
MLCDEF mlc_result mlc_optim_add_param(mlc_optim *opt, mlc_tensor *param);
MLCDEF void mlc_zero_grad(mlc_optim *opt);
MLCDEF void mlc_step(mlc_optim *opt);
MLCDEF void mlc_optim_set_lr(mlc_optim *opt, float lr);
MLCDEF float mlc_optim_lr(const mlc_optim *opt);
/* Scale all gradients so their global L2 norm is at most max_norm; returns the norm before. */
MLCDEF float mlc_clip_grad_norm(mlc_optim *opt, float max_norm);
/* Gradient scaling for float16 autocast (torch.amp.GradScaler): the loss is multiplied by the
   scale before backward, so small gradients survive float16; step unscales the gradients and
   skips the optimiser's update when one is infinite or NaN; update lowers the scale after such a
   step (backoff) and raises it after growth_interval clean ones. Fields left 0 take PyTorch's
   defaults: init_scale 65536, growth_factor 2, backoff_factor 0.5, growth_interval 2000.
     mlc_grad_scaler *scaler = mlc_grad_scaler_create(opt, (mlc_grad_scaler_opts){ 0 });
     ... mlc_backward(mlc_grad_scaler_scale(scaler, loss));
     mlc_grad_scaler_step(scaler); mlc_grad_scaler_update(scaler);
   A scaler belongs to the optimiser it steps (one each; freed with the context), and that
   optimiser's checkpoints keep its scale and clean steps. */
typedef struct mlc_grad_scaler_opts {   /* start from mlc_grad_scaler_defaults() */
    float init_scale, growth_factor, backoff_factor;
    int growth_interval;
} mlc_grad_scaler_opts;
typedef struct mlc_grad_scaler {
    mlc_optim *opt;                     /* the optimiser it steps                           */
    float scale;                        /* the loss's multiplier now                        */
    long long growth_tracker;           /* clean steps since the scale last changed         */
    mlc_grad_scaler_opts opts;          /* with the defaults filled in                      */
    int found_inf, unscaled;            /* this step: a gradient is inf/NaN; grads unscaled */
} mlc_grad_scaler;
MLCDEF mlc_grad_scaler *mlc_grad_scaler_create(mlc_optim *opt, mlc_grad_scaler_opts opts);
MLCDEF mlc_tensor *mlc_grad_scaler_scale(mlc_grad_scaler *scaler, mlc_tensor *loss);   /* loss * scale */
/* Divide the gradients by the scale now (before mlc_clip_grad_norm); step does it otherwise. */
MLCDEF mlc_result mlc_grad_scaler_unscale(mlc_grad_scaler *scaler);
MLCDEF int mlc_grad_scaler_step(mlc_grad_scaler *scaler);     /* 1: the optimiser stepped; 0: skipped */
MLCDEF void mlc_grad_scaler_update(mlc_grad_scaler *scaler);
/* Learning-rate schedules, as pure functions of the step (or epoch) number. */
MLCDEF float mlc_lr_step(float base_lr, int epoch, int step_size, float gamma);
MLCDEF float mlc_lr_cosine(float base_lr, int step, int warmup_steps, int total_steps, float min_lr);

/* ============================================================================================
   @section api-data
   Public API: data files (gzip, IDX, CSV) and batches. File bytes are untrusted: every size is
   checked before it is used, and a corrupt file is MLC_ERR_IO with a message naming the file
   and the byte offset (for CSV also the line and field). The tensors the readers return are
   long-lived (mlc_tensor_free, or mlc_destroy). Reading files (*_load) is left out by
   MLC_NO_STDIO; parsing from memory (*_from_memory, mlc_gunzip) stays.
   ============================================================================================ */

/* Receives output in order, in pieces; returns 0 to go on, nonzero to stop (an error). */
typedef int (*mlc_sink_fn)(const unsigned char *bytes, size_t size, void *user);
/* Decompress gzip data (RFC 1952 members around deflate, RFC 1951) from memory, handing the
   output to sink in pieces of at most 32 KiB; each member's CRC-32 and length are checked.
   name labels the messages (a file name; NULL: "memory"). Uses 35 KiB of heap while it runs. */
MLCDEF mlc_result mlc_gunzip(mlc_ctx *ctx, const void *data, size_t size, const char *name,
                             mlc_sink_fn sink, void *user);

/* IDX (the MNIST family's format: bytes 0 0 type ndim, ndim big-endian uint32 dimensions, then
   the values big-endian; types u8 i8 i16 i32 f32 f64), raw or gzipped (told by the magic), as a
   float tensor of the file's shape. Flags: MLC_IDX_SCALE_U8 divides u8 values by 255. */
#define MLC_IDX_SCALE_U8 1
MLCDEF mlc_tensor *mlc_idx_from_memory(mlc_ctx *ctx, const void *data, size_t size, int flags,
                                       const char *name);
/* Numeric CSV: comma-separated numbers, every row as long as the first, blank lines skipped;
   header 1 skips the first line. Gives [rows, columns]. */
MLCDEF mlc_tensor *mlc_csv_from_memory(mlc_ctx *ctx, const char *text, size_t size, int header,
                                       const char *name);
#ifndef MLC_NO_STDIO
MLCDEF mlc_tensor *mlc_idx_load(mlc_ctx *ctx, const char *path, int flags);
MLCDEF mlc_tensor *mlc_csv_load(mlc_ctx *ctx, const char *path, int header);
#endif

/* Batches of rows of x [N, ...] and y [N, ...] (y may be NULL), in order or shuffled with the
   context's RNG (Fisher-Yates from 0..N-1 at each epoch's start, so a run repeats from its
   seed). x and y must outlive the iterator, which lives until mlc_batches_free or mlc_destroy. */
typedef struct mlc_batches mlc_batches;
typedef struct mlc_batch_opts {         /* start from mlc_batch_defaults() */
    int batch_size;                     /* 0: 32 */
    int shuffle;                        /* 1: a new order every epoch */
    int drop_last;                      /* 1: no short last batch */
} mlc_batch_opts;
MLCDEF mlc_batches *mlc_batches_create(mlc_tensor *x, mlc_tensor *y, mlc_batch_opts config);
/* The epoch's next batch, as new tensors in the current frame ([B, ...] rows of x and y): 1.
   0 when the epoch is over (or on an error), with *x and *y NULL; the next call starts the
   next epoch. */
MLCDEF int mlc_batches_next(mlc_batches *b, mlc_tensor **x, mlc_tensor **y);
MLCDEF int mlc_batches_count(const mlc_batches *b);     /* batches per epoch */
MLCDEF void mlc_batches_free(mlc_batches *b);

/* ============================================================================================
   @section api-files  Public API: files (safetensors and checkpoints)
   safetensors: an 8-byte little-endian header length N, N bytes of JSON
   {"name": {"dtype": "F32", "shape": [2, 3], "data_offsets": [begin, end]}, ...,
   "__metadata__": {"key": "value"}}, then the tensors' raw little-endian bytes. A file is
   untrusted input: the header, every dtype, shape and offset are checked (overflow included)
   before any tensor is touched, and a bad file gives MLC_ERR_IO with a message naming the
   file, the tensor and the byte offset. The data must be indexed whole: tensors may not
   overlap and may leave no gap or trailing bytes (as the reference implementation demands).
   Loading converts F32, F16, BF16, F64 and the integer dtypes (PyTorch's num_batches_tracked
   is I64) to float32. Memory buffers need no stdio; paths are left out by MLC_NO_STDIO.
   ============================================================================================ */

typedef struct mlc_safetensors mlc_safetensors;   /* a checked file: names, shapes, metadata */

typedef struct mlc_load_report {        /* what a module load matched (filled in both modes) */
    int loaded, missing, unexpected, mismatched;
    char names[512];                    /* "missing: 0.bias; unexpected: x; shape: 1.weight [2] vs [3]" */
} mlc_load_report;

typedef struct mlc_load_opts {          /* zero: strict; start from mlc_load_defaults() */
    int partial;                        /* 1: load what matches by name and shape, skip the rest */
    mlc_load_report *report;            /* optional */
} mlc_load_opts;

/* The options structs with every field zero, which means default (see DEFAULTS at the top): start
   from these, and never from an uninitialised variable set field by field. */
#define MLC__OPTIONS_STRUCTS(X) \
    X(mlc_config_defaults, mlc_config) X(mlc_ce_defaults, mlc_ce_opts) X(mlc_conv_defaults, mlc_conv_opts) \
    X(mlc_pool_defaults, mlc_pool_opts) X(mlc_attention_defaults, mlc_attention_opts) \
    X(mlc_gradcheck_defaults, mlc_gradcheck_opts) X(mlc_rnn_defaults, mlc_rnn_opts) \
    X(mlc_sgd_defaults, mlc_sgd_opts) X(mlc_adam_defaults, mlc_adam_opts) \
    X(mlc_rmsprop_defaults, mlc_rmsprop_opts) X(mlc_grad_scaler_defaults, mlc_grad_scaler_opts) \
    X(mlc_batch_defaults, mlc_batch_opts) X(mlc_load_defaults, mlc_load_opts) \
    X(mlc_quant_defaults, mlc_quant_opts)
#define MLC__DEFAULTS_DECLARE(name, type) MLCDEF type name(void);
MLC__OPTIONS_STRUCTS(MLC__DEFAULTS_DECLARE)
#undef MLC__DEFAULTS_DECLARE

/* Parse and check a file held in memory (data must outlive the result); label names it in
   messages. NULL on error (the context's error says why). */
MLCDEF mlc_safetensors *mlc_safetensors_from_memory(mlc_ctx *ctx, const void *data, size_t size,
                                                    const char *label);
MLCDEF void mlc_safetensors_close(mlc_safetensors *st);
MLCDEF int mlc_safetensors_count(const mlc_safetensors *st);                    /* tensors */
MLCDEF const char *mlc_safetensors_name(const mlc_safetensors *st, int i);      /* in file order */
MLCDEF const char *mlc_safetensors_metadata(const mlc_safetensors *st, const char *key); /* or NULL */
/* A float32 copy of a tensor of the file (a temporary of the current frame). */
MLCDEF mlc_tensor *mlc_safetensors_get(mlc_safetensors *st, const char *name);
/* Copy the file's tensors into m's parameters and buffers (mlc_module_state names). Strict:
   every state tensor is present with its shape and the file holds no other (names under the
   reserved prefix "__mlc__." excepted), else an error naming them and nothing is changed.
   Partial: matching tensors load; missing, unexpected and wrongly shaped ones are skipped. */
MLCDEF mlc_result mlc_safetensors_load(mlc_safetensors *st, mlc_module *m, const mlc_load_opts *opts);
MLCDEF mlc_result mlc_module_load_from_memory(mlc_module *m, const void *data, size_t size,
                                              const mlc_load_opts *opts);
/* Encode tensors as a safetensors file into buf (when cap is large enough); returns the
   file's size (0 on error). metadata: key, value, key, value, ..., NULL (or NULL). */
MLCDEF size_t mlc_safetensors_encode(mlc_ctx *ctx, const mlc_named_tensor *tensors, int count,
                                     const char *const *metadata, void *buf, size_t cap);
MLCDEF size_t mlc_module_encode(mlc_module *m, const char *const *metadata, void *buf, size_t cap);

/* Checkpoints: model state, optimiser state (state buffers, step count, learning rate), the
   training position and the context's RNG in one safetensors file, so a resumed run continues
   bit for bit. Reserved names: "__mlc__.optim.<i>.<slot>" (i: the parameter's index in the
   optimiser, slot: PyTorch's momentum_buffer, exp_avg, exp_avg_sq, max_exp_avg_sq (AMSGrad),
   square_avg, grad_avg),
   "__mlc__.optim.t" and "__mlc__.train" (I64), "__mlc__.optim.lr" (F32), "__mlc__.rng" (U64). */
typedef struct mlc_train_state { long long step, epoch; } mlc_train_state;   /* yours to count */
MLCDEF size_t mlc_checkpoint_encode(mlc_module *m, mlc_optim *opt, const mlc_train_state *state,
                                    void *buf, size_t cap);   /* as mlc_safetensors_encode */
MLCDEF mlc_result mlc_checkpoint_load_from_memory(const void *data, size_t size, mlc_module *m,
                                                  mlc_optim *opt, mlc_train_state *state);
#ifndef MLC_NO_STDIO
MLCDEF mlc_safetensors *mlc_safetensors_open(mlc_ctx *ctx, const char *path);  /* reads it whole */
MLCDEF mlc_result mlc_module_load(mlc_module *m, const char *path, const mlc_load_opts *opts);
/* Saving is atomic: a temporary file of its own beside path ("path.tmp-PID-N", created
   exclusively, never through a link) is written, flushed (and fsync'd where <unistd.h> declares
   it), closed and renamed over path, so a failed save leaves the previous file as it was and
   processes saving one path at once each leave a whole file. Each tensor's CRC-32 goes into
   the metadata ("mlc.crc32:NAME"); a file that has them is checked when it opens. */
MLCDEF mlc_result mlc_safetensors_save(mlc_ctx *ctx, const char *path, const mlc_named_tensor *tensors,
                                       int count, const char *const *metadata);
MLCDEF mlc_result mlc_module_save(mlc_module *m, const char *path, const char *const *metadata);
MLCDEF mlc_result mlc_checkpoint_save(const char *path, mlc_module *m, mlc_optim *opt,
                                      const mlc_train_state *state);   /* opt, state may be NULL */
MLCDEF mlc_result mlc_checkpoint_load(const char *path, mlc_module *m, mlc_optim *opt,
                                      mlc_train_state *state);
#endif

/* ============================================================================================
   @section api-deprecated  Old names, kept for one release (0.2 removes them; CHANGELOG lists
   them). Each still works and makes the compiler say the new name.
   ============================================================================================ */
#if defined(__GNUC__) || defined(__clang__)
#define MLC__DEPRECATED(use) __attribute__((deprecated("use " use)))
#else
#define MLC__DEPRECATED(use)
#endif
typedef mlc_sgd_opts mlc_sgd_config MLC__DEPRECATED("mlc_sgd_opts");
typedef mlc_adam_opts mlc_adam_config MLC__DEPRECATED("mlc_adam_opts");
typedef mlc_rmsprop_opts mlc_rmsprop_config MLC__DEPRECATED("mlc_rmsprop_opts");
typedef mlc_batch_opts mlc_batch_config MLC__DEPRECATED("mlc_batch_opts");
MLC__DEPRECATED("mlc_module_load_from_memory")
static inline mlc_result mlc_module_load_memory(mlc_module *m, const void *data, size_t size,
                                                const mlc_load_opts *opts) {
    return mlc_module_load_from_memory(m, data, size, opts);
}
MLC__DEPRECATED("mlc_checkpoint_load_from_memory")
static inline mlc_result mlc_checkpoint_load_memory(const void *data, size_t size, mlc_module *m,
                                                    mlc_optim *opt, mlc_train_state *state) {
    return mlc_checkpoint_load_from_memory(data, size, m, opt, state);
}

#ifdef __cplusplus
}
#endif
#endif /* MLC_H */

/* ============================================================================================
   @section implementation  Implementation
   ============================================================================================ */
#ifdef MLC_IMPLEMENTATION
#ifndef MLC_IMPLEMENTATION_DONE
#define MLC_IMPLEMENTATION_DONE

#include <math.h>
#include <stdarg.h>
#include <string.h>
#include <float.h>
#include <stdlib.h>
#ifndef MLC_NO_STDIO
#include <stdio.h>
#include <errno.h>
#endif
#ifdef MLC_USE_CBLAS
#ifdef __APPLE__
#include <Accelerate/Accelerate.h>
#else
#include <cblas.h>
#endif
#endif
#ifndef MLC_ASSERT
#include <assert.h>
#define MLC_ASSERT(x) assert(x)
#endif
#ifndef MLC_EXPF
#define MLC_EXPF mlc__expf                 /* mlc's own (formula helpers): within 1.05 ulp, vectorises */
#endif
#ifndef MLC_LOGF
#define MLC_LOGF logf
#endif
#ifndef MLC_LOG1PF
#define MLC_LOG1PF log1pf
#endif
#ifndef MLC_SQRTF
#define MLC_SQRTF sqrtf
#endif
#ifndef MLC_TANHF
#define MLC_TANHF mlc__tanhf               /* a polynomial; within 4 ulp, and it vectorises */
#endif
#ifndef MLC_ERFF
#define MLC_ERFF mlc__erff                 /* the same: within 1.6 ulp */
#endif
#ifndef MLC_POWF
#define MLC_POWF powf
#endif
#ifndef MLC_COSF
#define MLC_COSF cosf
#endif

/* Sums of many floats (reductions, softmax, norms, losses) run in mlc__sum_t: double by
   default, so long sums keep their digits; float under MLC_FLOAT_ONLY, for FPUs without double
   (Cortex-M4F), where every double operation is a call into software emulation. */
#ifdef MLC_FLOAT_ONLY
typedef float mlc__sum_t;
#define MLC__SUM_LOG MLC_LOGF
#define MLC__SUM_SQRT MLC_SQRTF
#else
typedef double mlc__sum_t;
#define MLC__SUM_LOG log
#define MLC__SUM_SQRT sqrt
#endif

/* x86 with GCC or Clang: a few kernels are also compiled for AVX2 (+FMA) and AVX-512 and
   picked at run time (mlc__cpu_avx2), so a plain -O2 build still runs them at full width. */
#if defined(__GNUC__) && (defined(__x86_64__) || defined(__i386__)) && !defined(MLC_NO_MALLOC)
#define MLC__X86 1
#include <immintrin.h>
#include <cpuid.h>          /* AVX-VNNI's bit (Clang's __builtin_cpu_supports does not know it) */
#else
#define MLC__X86 0
#endif

/* With -fopenmp, OpenMP gives `omp simd` hints and the default thread count (the threads are
   mlc's own, see "Threads"; MLC__OMP_THREAD numbers OpenMP's, 0 without); without it the
   pragmas vanish. An `omp simd` is a hint: Clang warns (-Wpass-failed) where a map with
   branches or libm calls stays scalar, so that warning is off inside the implementation
   (popped at its end). */
#ifdef _OPENMP
#include <omp.h>
#define MLC__OMP(x) _Pragma(#x)
#define MLC__OMP_THREAD omp_get_thread_num()
#if defined(__clang__)
#pragma clang diagnostic push
#pragma clang diagnostic ignored "-Wpass-failed"
#define MLC__OMP_DIAGNOSTIC_PUSHED 1
#endif
#else
#define MLC__OMP(x)
#define MLC__OMP_THREAD 0
#endif

/* Threads of mlc's own (see "Threads"): POSIX threads where the C library has them without
   -pthread (glibc 2.34 on, Apple, and an OpenMP build, which links them anyway); Win32 threads
   on Windows (MinGW-w64, clang; the pool's atomics are GCC's __atomic builtins, so MSVC's cl
   runs on the caller only); MLC_THREADS asks for POSIX threads elsewhere (link with -pthread),
   MLC_NO_THREADS keeps every op on the caller. */
#if !defined(MLC_NO_THREADS) && !defined(MLC_NO_MALLOC) && (defined(__GNUC__) || defined(__clang__)) \
    && !defined(__TINYC__) && defined(_WIN32)
#define MLC__THREADS 1
#define MLC__WIN32_THREADS 1
#ifndef WIN32_LEAN_AND_MEAN
#define WIN32_LEAN_AND_MEAN
#endif
#include <windows.h>
#elif !defined(MLC_NO_THREADS) && !defined(MLC_NO_MALLOC) && (defined(__GNUC__) || defined(__clang__)) \
    && !defined(__TINYC__) && (defined(__unix__) || defined(__APPLE__)) \
    && (defined(MLC_THREADS) || defined(_OPENMP) || defined(__APPLE__) \
        || (defined(__GLIBC__) && (__GLIBC__ > 2 || __GLIBC_MINOR__ >= 34)))
#define MLC__THREADS 1
#include <pthread.h>
#include <unistd.h>
#else
#define MLC__THREADS 0
#endif
#ifdef __cplusplus
#define MLC__RESTRICT __restrict
#else
#define MLC__RESTRICT restrict
#endif

/* MLC__INLINE: inlined into every loop that calls it (GCC weighs a big loop's callees, and a
   call in a loop stops its vectorisation) */
#if defined(__GNUC__)
#define MLC__INLINE inline __attribute__((always_inline))
#else
#define MLC__INLINE inline
#endif

#ifdef __cplusplus
extern "C" {
#endif

/* ============================================================================================
   @section op-types
   Op plumbing, the types: the op table, the tape node, the backend table. An op is a value of
   mlc__op with its arguments in mlc__args; the tape keeps a node per op run; a backend says per
   op whether it has a kernel and runs it. mlc__dispatch (after Devices) joins them.
   ============================================================================================ */

/* Every op, with the two CPU functions that run it: forward (int f(mlc__node *): 1, or 0 with
   the error set) and backward (void b(mlc__node *)). An op is one of these values; its
   arguments are the named fields of its member of mlc__args; a backend says per op whether it
   has a kernel (mlc__backend.kernels) and switches on the op to run it; mlc__run runs the
   forward on the device or the CPU, mlc_backward the backward. */
#define MLC__OPS(X) \
    X(UNARY,          mlc__unary_cpu,          mlc__unary_backward) \
    X(BINARY,         mlc__binary_cpu,         mlc__binary_backward) \
    X(WHERE,          mlc__where_cpu,          mlc__where_backward) \
    X(MASKED_FILL,    mlc__masked_fill_cpu,    mlc__masked_fill_backward) \
    X(MATMUL,         mlc__matmul_cpu,         mlc__matmul_backward) \
    X(REDUCE,         mlc__reduce_cpu,         mlc__reduce_backward) \
    X(CUMSUM,         mlc__cumsum_cpu,         mlc__cumsum_backward) \
    X(SOFTMAX,        mlc__softmax_cpu,        mlc__softmax_backward) \
    X(CLASS_LOSS,     mlc__class_loss_cpu,     mlc__class_loss_backward) \
    X(POINTWISE_LOSS, mlc__pointwise_loss_cpu, mlc__pointwise_loss_backward) \
    X(RESHAPE,        mlc__reshape_cpu,        mlc__accumulate_backward) \
    X(COPY,           mlc__copy_cpu,           mlc__accumulate_backward) \
    X(PERMUTE,        mlc__permute_cpu,        mlc__permute_backward) \
    X(SLICE,          mlc__slice_cpu,          mlc__slice_backward) \
    X(CONCAT,         mlc__concat_cpu,         mlc__concat_backward) \
    X(INDEX_SELECT,   mlc__index_select_cpu,   mlc__index_select_backward) \
    X(GATHER,         mlc__gather_cpu,         mlc__gather_backward) \
    X(DROPOUT,        mlc__dropout_cpu,        mlc__dropout_backward) \
    X(LAYER_NORM,     mlc__layer_norm_cpu,     mlc__layer_norm_backward) \
    X(BATCH_NORM,     mlc__batch_norm_cpu,     mlc__batch_norm_backward) \
    X(CONV2D,         mlc__conv2d_cpu,         mlc__conv2d_backward) \
    X(POOL,           mlc__pool_cpu,           mlc__pool_backward) \
    X(ATTENTION,      mlc__attention_cpu,      mlc__attention_backward) \
    X(LINEAR_INT8,    mlc__linear_int8_cpu,    mlc__linear_int8_backward)
#define MLC__OP_ENUM(name, forward, backward) MLC__OP_##name,
typedef enum mlc__op { MLC__OPS(MLC__OP_ENUM) MLC__OP_COUNT } mlc__op;
#undef MLC__OP_ENUM

typedef struct mlc__attention_args {  /* heads [B, H]; q [T, D], k [S, D], v [S, Dv] per head */
    int B, H, T, S, D, Dv, causal;
    int mask_stride[4];                 /* the mask's strides along b, h, i, j (0: broadcast) */
    unsigned seed;                      /* dropout's draws */
    float scale, dropout;
} mlc__attention_args;

/* An op's arguments, by op (loss: class_loss and pointwise_loss) */
typedef union mlc__args {
    struct { int kind; float p, q; } unary;                 /* mlc__unary_kind; its parameters */
    struct { int kind; } binary;                            /* MLC__BINARY_ADD ... MLC__BINARY_DIV */
    struct { float value; } masked_fill;
    struct { int kind, len, inner, unbiased; } reduce;      /* x viewed as [outer, len, inner] */
    struct { int len, inner; } cumsum;
    struct { int is_log, len, inner; } softmax;
    struct { int reduction, ignore_index, softmax_first, kind; float scale, smoothing; } loss;
    struct { int order[MLC_MAX_DIMS]; } permute;
    struct { int start, count, axis; } slice;
    struct { int count, axis; } concat;
    struct { int axis; } index_select;
    struct { float p; unsigned seed; } dropout;
    struct { float eps; int D; } layer_norm;                /* D: values per row (the last axes) */
    struct { int training; float momentum, eps; } batch_norm;
    struct { int kh, kw, sh, sw, ph, pw, is_max, exclude_pad; } pool;   /* kernel, stride, padding */
    mlc__attention_args attention;
    struct { int relu; } linear_int8;
} mlc__args;

typedef struct mlc__node mlc__node;
typedef void (*mlc__backward_fn)(mlc__node *n);
struct mlc__node {                      /* one recorded op: its output, inputs and saved values */
    mlc__node *prev;
    size_t index;                       /* position on the tape, from 0 */
    mlc__op op;
    const char *name;                   /* the public op, for messages ("mlc_relu") */
    mlc_tensor *out;
    mlc_tensor *in[6];
    int n_in;
    mlc__args args;
    void *saved;                        /* op-specific buffer in the arena (mask, argmax, stats) */
    int device;                         /* 1: ran on the device, and goes back there */
};

/* The CPU functions of every op (defined in the ops' sections), and the tables that find them
   by op: mlc__cpu_of[op] runs its forward, mlc__backward_of[op] its backward. */
#define MLC__OP_DECLARE(name, forward, backward) \
    static int forward(mlc__node *n); static void backward(mlc__node *n);
MLC__OPS(MLC__OP_DECLARE)
#undef MLC__OP_DECLARE
static int mlc__recording(const mlc__node *call);    /* whether the tape will keep the op */
#define MLC__OP_FORWARD(name, forward, backward) forward,
static int (*const mlc__cpu_of[])(mlc__node *n) = { MLC__OPS(MLC__OP_FORWARD) };
#undef MLC__OP_FORWARD
#define MLC__OP_BACKWARD(name, forward, backward) backward,
static const mlc__backward_fn mlc__backward_of[] = { MLC__OPS(MLC__OP_BACKWARD) };
#undef MLC__OP_BACKWARD
typedef char mlc__op_tables_cover_every_op[sizeof mlc__cpu_of / sizeof mlc__cpu_of[0] == MLC__OP_COUNT
                                           && sizeof mlc__backward_of / sizeof mlc__backward_of[0]
                                                  == MLC__OP_COUNT ? 1 : -1];

/* The backend contract (docs/backends.md has it member by member and op by op; start a new
   backend from examples/backend_skeleton.c). A backend is its devices, its buffers, and one
   launcher for the ops it has kernels for. The core keeps the books (which copy is current,
   uploads, downloads, views, spares: see Devices), so a new backend (Vulkan, Metal, CUDA) adds a
   header and a line in the registry at the end of this file, and touches no op.
   - It implements the members below. kernels[op] says which ops run() takes; run(ctx, n, 0)
     computes n->out from n->in[] and n->args (n->saved: the op's sizes for MATMUL and CONV2D,
     the list of inputs for CONCAT, the offsets for GATHER), run(ctx, n, 1) adds the
     gradients of n->out into those of n->in[].
   - Fallback: where kernels[op] is 0, or run() returns 0 with no error set, the core brings the
     inputs' host copies up to date, runs the op's CPU forward (mlc__cpu_of[op]) or backward,
     marks the device copy stale and counts a fallback (mlc_stats.fallbacks, logged once).
     Results are then right on any backend that implements only the buffers.
   - The core helpers a backend may call, and no others (tools/check_backend_api.sh checks
     mlc_opencl.h and the skeleton against the list in docs/backends.md): the types mlc__node,
     mlc__mm, mlc__conv, mlc__attention_args, mlc__bcast, mlc__pool_job and the kind names
     (mlc__unary_kind_names, mlc__reduce_kind_names, mlc__loss_kind_names); buffers
     mlc__buffer_of, mlc__device_alloc, mlc__device_in, mlc__device_out, mlc__device_grad,
     mlc__device_grad_to_overwrite; memory and errors mlc__heap_alloc, mlc__heap_free,
     mlc__arena_alloc, mlc__fail, mlc__log, mlc__format; shapes mlc__numel, mlc__split,
     mlc__broadcast, mlc__pool_count; the CPU code it mirrors mlc__update (and the three rules'
     loops), mlc__matmul_backward; and the rows of MLC__FORMULA_HELPERS, as text. */
typedef struct mlc__backend {
    const char *name;
    int (*open)(mlc_ctx *ctx, const char *spec);          /* 1: opened; 0: spec is none of its */
    int (*devices)(mlc_device_info *out, int max);        /* its rows of mlc_devices */
    const unsigned char *kernels;                         /* [MLC__OP_COUNT]: 1: run has the op */
    int (*run)(mlc_ctx *ctx, struct mlc__node *n, int backward);  /* 1: ran here; 0: declined */
    /* the update of `count` parameters from `first`, all on the device: how many of them from the
       first it updated (one launch may take several); 0: none, and the CPU updates `first` */
    int (*step)(mlc_optim *opt, int first, int count);
    int (*fill)(mlc_tensor *t, int grad, float value);    /* data or gradient = value */
    int (*upload)(mlc_tensor *t, int grad);               /* host copy -> device (mlc__buffer_of) */
    int (*download)(mlc_tensor *t, int grad);             /* device -> host copy (waits) */
    void *(*create)(mlc_ctx *ctx, size_t bytes);          /* a buffer; NULL: out of memory, or */
    void (*release)(mlc_ctx *ctx, void *buffer);          /*   an error it set (mlc__device_alloc) */
    void (*wait)(mlc_ctx *ctx, int all);                  /* finish reading host memory; all: every op */
    void (*destroy)(mlc_ctx *ctx);
} mlc__backend;

static const mlc__backend *mlc__registry(int i);         /* backend i, or NULL past the last */
#ifdef MLC_EXTRA_BACKEND
static const mlc__backend *MLC_EXTRA_BACKEND(void);      /* a program's own backend */
#endif

/* ============================================================================================
   @section memory  Memory and errors: the context, a small formatter, tracked allocations, the arena
   ============================================================================================ */

typedef struct mlc__block {            /* one arena block; blocks are kept and reused */
    struct mlc__block *next;
    size_t capacity, used;
    unsigned char *base;
} mlc__block;

typedef struct mlc__owned {            /* long-lived allocations, freed by mlc_destroy */
    struct mlc__owned *prev, *next;
} mlc__owned;

/* What is out of date: the host or device copy of the data or gradient; GRAD_ZERO: the gradient
   counts as zeros whatever its buffers, host and device, hold (neither copy is then stale):
   mlc_zero_grad, and backward for a fresh gradient, leave the writing of the zeros to the first
   reader, or to a backward that overwrites the buffer (mlc__grad_to_overwrite,
   mlc__device_grad_to_overwrite) */
enum { MLC__HOST_STALE = 1, MLC__DEVICE_STALE = 2, MLC__GRAD_HOST_STALE = 4, MLC__GRAD_DEVICE_STALE = 8,
       MLC__GRAD_ZERO = 16 };

typedef struct mlc__device_buffer { void *buffer; size_t bytes; int level; } mlc__device_buffer;
#define MLC__MAX_FRAMES 64              /* frames open at once */
typedef struct mlc__device_buffers {   /* frame temporaries (sorted by level), spares, long-lived */
    mlc__device_buffer *frame, *spare, *kept;
    size_t n_frame, n_spare, n_kept, cap_frame, cap_spare, cap_kept;
    long made, released;               /* buffers the backend made and released so far */
    long refuse_from;                  /* fault injection (tests/test_device.c sets it): >= 0:
                                          buffer number refuse_from and every later one are
                                          refused as if the device were full; -1: none */
} mlc__device_buffers;

struct mlc__autocast_copy { mlc_tensor *of, *copy; };   /* autocast's copy of a parameter */
#ifndef MLC_INT8_PATCH_BYTES
#define MLC_INT8_PATCH_BYTES 8192
#endif
#ifndef MLC_FREED_KEPT
#ifdef MLC_NO_MALLOC
#define MLC_FREED_KEPT 8                /* bare metal: a few, the context's memory is the user's */
#else
#define MLC_FREED_KEPT 256
#endif
#endif

struct mlc_ctx {
    mlc_config config;
    mlc_result error;
    char message[512];
    uint64_t rng_state, rng_inc;
    int grad_enabled;
    mlc_tensor *freed[MLC_FREED_KEPT > 0 ? MLC_FREED_KEPT : 1];  /* the last ones freed (records), a ring */
    int freed_next;
    mlc_stats stats;
    mlc__block *first_block, *block;   /* the arena: a chain, and the block being filled */
    struct mlc__node *tape;            /* the newest node; nodes link to older ones */
    int forward_depth;                 /* mlc_forward calls under way, one inside another */
    mlc_grad_ready_fn grad_ready;      /* mlc_set_grad_ready_hook's, or NULL */
    void *grad_ready_user;
    mlc__owned owned;                  /* sentinel of the long-lived list */
    const struct mlc__backend *backend; /* NULL: the CPU only */
    void *device;                      /* the backend's state */
    char device_name[160];             /* set by the backend: "opencl:1 NVIDIA H100 80GB HBM3" */
    int op_device;                     /* where the op being run lives (0 CPU, 1 device) */
    mlc_scalar_type op_dtype;          /* the dtype of the op's output (mlc__make) */
    mlc_scalar_type default_dtype;     /* parameters' and buffers' (mlc_set_default_dtype) */
    mlc_scalar_type autocast;          /* MLC_F32: off; else the products' dtype */
    struct mlc__autocast_copy *autocast_copies;   /* parameters' copies */
    int n_autocast_copies, autocast_capacity;
    const char *fell_back[64];         /* ops already logged as falling back */
    int n_fell_back;
    int level;                         /* frames open now */
    uint64_t frame_ids[MLC__MAX_FRAMES]; /* the id of each open frame, outermost first */
    uint64_t frames_made;              /* frame ids handed out */
    mlc__device_buffers buffers;       /* the device buffers' books (see mlc__device_alloc) */
    int threads;                       /* threads for ops (mlc_set_threads), at least 1 */
    struct mlc__workers *workers;      /* the worker threads, started on first use (see Threads) */
    int i8_kernel;                     /* mlc_gemm_i8's kernel (MLC__I8_KERNELS): the best the CPU has,
                                          found by mlc_create; tests/test_device.c sets each in turn */
};
#if MLC__THREADS
static void mlc__workers_stop(mlc_ctx *ctx);
#endif

/* A float's bits: the one way mlc tests for NaN, infinity, zero and MLC_ZERO, since -ffast-math
   (-ffinite-math-only, -fno-signed-zeros, subnormals flushed) may fold x != x and isnan(x), or
   read NaN or MLC_ZERO as == 0, but never a memcpy. mlc__is_nan and mlc__is_finite read them. */
static uint32_t mlc__bits(float v) {
    uint32_t b;
    memcpy(&b, &v, sizeof b);
    return b;
}
static int mlc__is_nan(float v) { return (mlc__bits(v) & 0x7fffffffu) > 0x7f800000u; }
static int mlc__is_finite(float v) { return (mlc__bits(v) & 0x7f800000u) != 0x7f800000u; }

/* A vsnprintf subset that needs no stdio: %s %d %u %zu %g %c %% and %T (a tensor's shape). */
static void mlc__vformat(char *buf, size_t cap, const char *fmt, va_list ap) {
    size_t n = 0;
    char tmp[64];
#define MLC__PUT(ch) do { if (n + 1 < cap) buf[n++] = (ch); } while (0)
    for (; *fmt; fmt++) {
        const char *s = tmp;
        int len = 0;
        if (*fmt != '%') { MLC__PUT(*fmt); continue; }
        fmt++;
        if (*fmt == 'z') fmt++;
        if (*fmt == 's') {
            s = va_arg(ap, const char *);
            if (!s) s = "(null)";
            len = (int)strlen(s);
        } else if (*fmt == 'd' || *fmt == 'u') {
            int is_size = fmt[-1] == 'z';
            long long v = is_size       ? 0
                          : *fmt == 'd' ? (long long)va_arg(ap, int)
                                        : (long long)va_arg(ap, unsigned);
            unsigned long long u = is_size ? (unsigned long long)va_arg(ap, size_t)
                                 : v < 0 ? (unsigned long long)(-v) : (unsigned long long)v;
            char rev[24]; int r = 0;
            do { rev[r++] = (char)('0' + u % 10); u /= 10; } while (u);
            if (v < 0) tmp[len++] = '-';
            while (r) tmp[len++] = rev[--r];
        } else if (*fmt == 'c') {
            tmp[len++] = (char)va_arg(ap, int);
        } else if (*fmt == 'g') {          /* up to 6 significant digits, fixed or e-notation */
            double v = va_arg(ap, double);
            int e = 0, i, digits;
            unsigned long long m;
            if (mlc__is_nan((float)v)) { s = "nan"; len = 3; }    /* (every %g is a float's) */
            else {
                if (v < 0) { tmp[len++] = '-'; v = -v; }
                if (!mlc__is_finite((float)v)) { memcpy(tmp + len, "inf", 3); len += 3; }
                else if (v == 0) tmp[len++] = '0';
                else {
                    while (v >= 10) { v /= 10; e++; }
                    while (v < 1) { v *= 10; e--; }
                    m = (unsigned long long)(v * 100000 + 0.5);
                    if (m >= 1000000) { m /= 10; e++; }
                    digits = 6;
                    while (digits > 1 && m % 10 == 0) { m /= 10; digits--; }
                    if (e >= -4 && e < 6) {   /* fixed notation */
                        char d[8]; int k;
                        for (k = digits - 1; k >= 0; k--) { d[k] = (char)('0' + m % 10); m /= 10; }
                        if (e < 0) {
                            tmp[len++] = '0'; tmp[len++] = '.';
                            for (i = -1; i > e; i--) tmp[len++] = '0';
                            for (k = 0; k < digits; k++) tmp[len++] = d[k];
                        } else {
                            for (k = 0; k < digits || k <= e; k++) {
                                if (k == e + 1) tmp[len++] = '.';
                                tmp[len++] = k < digits ? d[k] : '0';
                            }
                        }
                    } else {
                        char d[8]; int k;
                        for (k = digits - 1; k >= 0; k--) { d[k] = (char)('0' + m % 10); m /= 10; }
                        tmp[len++] = d[0];
                        if (digits > 1) tmp[len++] = '.';
                        for (k = 1; k < digits; k++) tmp[len++] = d[k];
                        tmp[len++] = 'e';
                        if (e < 0) { tmp[len++] = '-'; e = -e; }
                        if (e >= 100) tmp[len++] = (char)('0' + e / 100);
                        if (e >= 10) tmp[len++] = (char)('0' + e / 10 % 10);
                        tmp[len++] = (char)('0' + e % 10);
                    }
                }
            }
        } else if (*fmt == 'T') {          /* a tensor's shape: [2, 3] */
            const mlc_tensor *t = va_arg(ap, const mlc_tensor *);
            int d;
            if (!t) { s = "NULL"; len = 4; }
            else {
                tmp[len++] = '[';
                for (d = 0; d < t->ndim; d++) {
                    int v = t->shape[d], r = 0; char rev[12];
                    if (d) { tmp[len++] = ','; tmp[len++] = ' '; }
                    do { rev[r++] = (char)('0' + v % 10); v /= 10; } while (v);
                    while (r) tmp[len++] = rev[--r];
                }
                tmp[len++] = ']';
            }
        } else { MLC__PUT('%'); if (!*fmt) break; MLC__PUT(*fmt); continue; }
        while (len-- > 0) MLC__PUT(*s++);
    }
    if (cap) buf[n] = '\0';
#undef MLC__PUT
}

static void mlc__format(char *buf, size_t cap, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    mlc__vformat(buf, cap, fmt, ap);
    va_end(ap);
}

static void mlc__log(mlc_ctx *ctx, mlc_log_level level, const char *message) {
    if (ctx->config.log) { (ctx->config.log)(level, message, ctx->config.log_user); return; }
#ifndef MLC_NO_STDIO
    if (!ctx->config.quiet && level != MLC_LOG_INFO)
        fprintf(stderr, "mlc: %s: %s\n", level == MLC_LOG_ERROR ? "error" : "warning", message);
#endif
}

/* Set the sticky error (the first one wins), log it, and return NULL for the op to return. */
static void *mlc__fail(mlc_ctx *ctx, mlc_result code, const char *fmt, ...) {
    va_list ap;
    if (!ctx || ctx->error) return NULL;
    ctx->error = code;
    va_start(ap, fmt);
    mlc__vformat(ctx->message, sizeof ctx->message, fmt, ap);
    va_end(ap);
    mlc__log(ctx, MLC_LOG_ERROR, ctx->message);
    return NULL;
}

/* The one place sizes are computed with overflow checks: *out = a * b + c; 0 when it overflows
   size_t (element and byte counts of a shape, arena blocks, heap headers). */
static int mlc__size(size_t a, size_t b, size_t c, size_t *out) {
    if (b && a > ((size_t)-1 - c) / b) return 0;
    *out = a * b + c;
    return 1;
}

/* The allocator of the config, else malloc/free (none under MLC_NO_MALLOC: NULL). */
static void *mlc__sys_alloc(const mlc_allocator *a, size_t bytes) {
    if (a->alloc) return (a->alloc)(bytes, a->user);
#ifdef MLC_NO_MALLOC
    return NULL;
#else
    return malloc(bytes);
#endif
}
static void mlc__sys_free(const mlc_allocator *a, void *p) {
    if (a->free) (a->free)(p, a->user);
#ifndef MLC_NO_MALLOC
    else free(p);
#endif
}

/* Every heap allocation carries its size in front, so the statistics stay exact. */
#define MLC__HEADER 16
static void *mlc__heap_alloc(mlc_ctx *ctx, size_t bytes) {
    unsigned char *p;
    size_t total;
    if (!mlc__size(bytes, 1, MLC__HEADER, &total)) return NULL;
    p = (unsigned char *)mlc__sys_alloc(&ctx->config.allocator, total);
    if (!p) return NULL;
    memcpy(p, &bytes, sizeof bytes);
    ctx->stats.allocs++;
    ctx->stats.bytes_current += bytes;
    if (ctx->stats.bytes_current > ctx->stats.bytes_peak) ctx->stats.bytes_peak = ctx->stats.bytes_current;
    return p + MLC__HEADER;
}

static void mlc__heap_free(mlc_ctx *ctx, void *ptr) {
    unsigned char *p = (unsigned char *)ptr;
    size_t bytes;
    if (!p) return;
    p -= MLC__HEADER;
    memcpy(&bytes, p, sizeof bytes);
    ctx->stats.frees++;
    ctx->stats.bytes_current -= bytes;
    mlc__sys_free(&ctx->config.allocator, p);
}

/* Long-lived memory: linked into the context so mlc_destroy frees whatever the user kept. */
static void *mlc__owned_alloc(mlc_ctx *ctx, size_t bytes, const char *op) {
    size_t total;
    mlc__owned *o = mlc__size(bytes, 1, sizeof(mlc__owned) + 16, &total)
                  ? (mlc__owned *)mlc__heap_alloc(ctx, total) : NULL;
    if (!o) return mlc__fail(ctx, MLC_ERR_MEMORY, "%s: out of memory allocating %zu bytes", op, bytes);
    o->next = ctx->owned.next; o->prev = &ctx->owned;
    ctx->owned.next->prev = o; ctx->owned.next = o;
    memset((unsigned char *)o + sizeof(mlc__owned) + 16, 0, bytes);
    return (unsigned char *)o + sizeof(mlc__owned) + 16;
}

static void mlc__owned_free(mlc_ctx *ctx, void *ptr) {
    mlc__owned *o;
    if (!ptr) return;
    o = (mlc__owned *)((unsigned char *)ptr - 16 - sizeof(mlc__owned));
    o->prev->next = o->next; o->next->prev = o->prev;
    mlc__heap_free(ctx, o);
}

/* The arena: bump allocation in a chain of blocks, 32-byte aligned. */
static void *mlc__arena_alloc(mlc_ctx *ctx, size_t bytes, const char *op) {
    mlc__block *b = ctx->block;
    size_t total;
    if (!mlc__size(bytes, 1, 31, &bytes))
        return mlc__fail(ctx, MLC_ERR_MEMORY, "%s: out of memory (%zu bytes asked)", op, bytes);
    bytes &= ~(size_t)31;
    while (b && b->capacity - b->used < bytes) {      /* try the next kept block */
        b = b->next;
        if (b) b->used = 0;
    }
    if (!b && ctx->config.arena)                     /* a fixed arena never grows */
        return mlc__fail(ctx, MLC_ERR_MEMORY, "%s: out of memory: the fixed arena (mlc_config.arena, %zu "
                         "bytes) is full (%zu bytes asked)", op, ctx->config.arena_bytes, bytes);
    if (!b) {                                        /* grow: append a new block */
        size_t cap = ctx->config.arena_block_bytes;
        mlc__block *nb, *last = ctx->block;
        if (cap < bytes) cap = bytes;
        nb = mlc__size(cap, 1, sizeof(mlc__block) + 32, &total)
           ? (mlc__block *)mlc__heap_alloc(ctx, total) : NULL;
        if (!nb)
            return mlc__fail(ctx, MLC_ERR_MEMORY, "%s: out of memory (arena block of %zu bytes)", op, cap);
        nb->next = NULL; nb->capacity = cap; nb->used = 0;
        nb->base = (unsigned char *)(((uintptr_t)(nb + 1) + 31) & ~(uintptr_t)31);
        if (!last) ctx->first_block = nb;
        else { while (last->next) last = last->next; last->next = nb; }
        b = nb;
    }
    ctx->block = b;
    b->used += bytes;
    ctx->stats.arena_used += bytes;
    if (ctx->stats.arena_used > ctx->stats.arena_peak) ctx->stats.arena_peak = ctx->stats.arena_used;
    return b->base + b->used - bytes;
}

/* mlc_config.arena: the caller's buffer is the arena's one block (its header at the start). */
static void mlc__arena_fixed(mlc_ctx *ctx) {
    uintptr_t start = (uintptr_t)ctx->config.arena, end = start + ctx->config.arena_bytes;
    uintptr_t head = (start + 15) & ~(uintptr_t)15, base = (head + sizeof(mlc__block) + 31) & ~(uintptr_t)31;
    mlc__block *b = (mlc__block *)head;
    if (ctx->config.arena_bytes < 64 + sizeof(mlc__block) || base > end) {
        mlc__fail(ctx, MLC_ERR_MEMORY, "mlc_create: the fixed arena (mlc_config.arena) of %zu bytes is too "
                  "small", ctx->config.arena_bytes);
        return;
    }
    b->next = NULL; b->used = 0;
    b->base = (unsigned char *)base;
    b->capacity = (size_t)(end - base) & ~(size_t)31;
    ctx->first_block = ctx->block = b;
}

/* Device buffers. The backend makes and frees them; the books are kept here, the same for
   every backend. A temporary's buffer lives as long as its tensor: it is filed under the frame
   level the tensor was made at (a tensor made before a frame may get its buffer inside it) and,
   when that frame ends, goes to the spares, reused by exact size, so a steady training loop
   makes no new buffers. A long-lived tensor's buffers are kept until it is freed. */
/* Room for one more entry in a list (doubling); 0 when out of memory. */
static int mlc__device_room(mlc_ctx *ctx, mlc__device_buffer **items, size_t *cap, size_t need) {
    mlc__device_buffer *p;
    size_t n = *cap ? *cap : 64;
    if (need <= *cap) return 1;
    while (n < need) n *= 2;
    if (!(p = (mlc__device_buffer *)mlc__heap_alloc(ctx, n * sizeof *p))) return 0;
    if (*cap) memcpy(p, *items, *cap * sizeof *p);
    mlc__heap_free(ctx, *items);
    *items = p; *cap = n;
    return 1;
}

static void mlc__device_free(mlc_ctx *ctx, const mlc__device_buffer *b) {
    ctx->backend->release(ctx, b->buffer);
    ctx->buffers.released++;
    ctx->stats.device_bytes_current -= b->bytes;
}

/* A new buffer from the backend (NULL: the device is full, or an error it set); counted, and
   refused from books->refuse_from on (fault injection). */
static void *mlc__device_create(mlc_ctx *ctx, size_t bytes) {
    mlc__device_buffers *books = &ctx->buffers;
    void *buffer;
    if (books->refuse_from >= 0 && books->made >= books->refuse_from) return NULL;
    if ((buffer = ctx->backend->create(ctx, bytes)) != NULL) books->made++;
    return buffer;
}

/* A buffer of `bytes` for tensor t (NULL: scratch for the op being run): a spare of that size,
   else a new one; when the device is full the spares go back and it tries once more. */
static void *mlc__device_alloc(mlc_ctx *ctx, const mlc_tensor *t, size_t bytes, const char *op) {
    mlc__device_buffers *books = &ctx->buffers;
    mlc__device_buffer b;
    size_t i, at;
    int kept = t && t->persistent;
    if (ctx->error) return NULL;
    b.buffer = NULL; b.bytes = bytes < 4 ? 4 : bytes; b.level = t ? t->level : ctx->level;
    if (kept ? !mlc__device_room(ctx, &books->kept, &books->cap_kept, books->n_kept + 1)
             /* spares never need room later */
             : !mlc__device_room(ctx, &books->frame, &books->cap_frame, books->n_frame + 1) ||
               !mlc__device_room(ctx, &books->spare, &books->cap_spare, books->n_frame + books->n_spare + 1))
        return mlc__fail(ctx, MLC_ERR_MEMORY, "%s: out of memory for the device buffers' books", op);
    for (i = books->n_spare; !kept && i-- > 0;)
        if (books->spare[i].bytes == b.bytes) {
            b.buffer = books->spare[i].buffer;
            books->spare[i] = books->spare[--books->n_spare];
            break;
        }
    if (!b.buffer) {
        if (!(b.buffer = mlc__device_create(ctx, b.bytes)) && !ctx->error) {
            while (books->n_spare) mlc__device_free(ctx, &books->spare[--books->n_spare]);
            b.buffer = mlc__device_create(ctx, b.bytes);
        }
        if (!b.buffer) {
            if (!ctx->error)
                mlc__fail(ctx, MLC_ERR_MEMORY, "%s: out of device memory allocating %zu bytes on %s", op,
                          b.bytes, mlc_device_name(ctx));
            return NULL;
        }
        ctx->stats.device_bytes_current += b.bytes;
        if (ctx->stats.device_bytes_current > ctx->stats.device_bytes_peak)
            ctx->stats.device_bytes_peak = ctx->stats.device_bytes_current;
    }
    if (kept) { books->kept[books->n_kept++] = b; return b.buffer; }
    /* kept sorted by level */
    for (at = books->n_frame; at > 0 && books->frame[at - 1].level > b.level; at--) {}
    memmove(books->frame + at + 1, books->frame + at, (books->n_frame - at) * sizeof b);
    books->frame[at] = b;
    books->n_frame++;
    return b.buffer;
}

/* The bytes of one value of dtype */
static size_t mlc__width(mlc_scalar_type dtype) {
    return dtype == MLC_I8 ? 1 : dtype == MLC_F32 ? sizeof(float) : sizeof(uint16_t);
}
/* The bytes of t's values (grad 0; a bf16 or f16 tensor holds two bytes a value, an int8 one
   one byte, on the host and on the device) or of its gradient (float32 in every dtype): what a
   backend copies. */
static size_t mlc__bytes_of(const mlc_tensor *t, int grad) {
    return t->size * (grad ? sizeof(float) : mlc__width(t->dtype));
}

/* t's data (grad 0) or gradient buffer, made when missing; backends take theirs from here. */
static void *mlc__buffer_of(mlc_tensor *t, int grad, const char *op) {
    void **slot = grad ? &t->device_grad : &t->device_data;
    if (!*slot) *slot = mlc__device_alloc(t->ctx, t, mlc__bytes_of(t, grad), op);
    return *slot;
}

/* Frames above `level` ended: their buffers become spares, once the device has read the host
   memory the frames held. */
static void mlc__device_release_frames(mlc_ctx *ctx, int level) {
    mlc__device_buffers *books = &ctx->buffers;
    if (!books->n_frame || books->frame[books->n_frame - 1].level <= level) return;
    ctx->backend->wait(ctx, 0);
    while (books->n_frame && books->frame[books->n_frame - 1].level > level)
        books->spare[books->n_spare++] = books->frame[--books->n_frame];
}

/* A long-lived tensor is freed or moves to the CPU: its buffers go. */
static void mlc__device_release(mlc_tensor *t) {
    mlc__device_buffers *books = &t->ctx->buffers;
    size_t i = 0;
    while (i < books->n_kept)
        if (books->kept[i].buffer == t->device_data || books->kept[i].buffer == t->device_grad) {
            mlc__device_free(t->ctx, &books->kept[i]);
            books->kept[i] = books->kept[--books->n_kept];
        } else i++;
    t->device_data = t->device_grad = NULL;
}

/* The context ends: every buffer goes, then the backend. */
static void mlc__device_close(mlc_ctx *ctx) {
    mlc__device_buffers *books = &ctx->buffers;
    ctx->backend->wait(ctx, 0);
    while (books->n_frame) mlc__device_free(ctx, &books->frame[--books->n_frame]);
    while (books->n_spare) mlc__device_free(ctx, &books->spare[--books->n_spare]);
    while (books->n_kept) mlc__device_free(ctx, &books->kept[--books->n_kept]);
    mlc__heap_free(ctx, books->frame); mlc__heap_free(ctx, books->spare); mlc__heap_free(ctx, books->kept);
    ctx->backend->destroy(ctx);
    ctx->backend = NULL;
}

/* ============================================================================================
   @section context  Context, random numbers, frames
   ============================================================================================ */

MLCDEF void mlc_seed(mlc_ctx *ctx, uint64_t seed) {    /* PCG32 (O'Neill), the reference seeding */
    if (!ctx) return;
    ctx->rng_state = 0;
    ctx->rng_inc = (seed << 1u) | 1u;
    (void)mlc_rand_u32(ctx);
    ctx->rng_state += seed;
    (void)mlc_rand_u32(ctx);
}

MLCDEF uint32_t mlc_rand_u32(mlc_ctx *ctx) {
    uint64_t old = ctx ? ctx->rng_state : 0;
    uint32_t xorshifted = (uint32_t)(((old >> 18u) ^ old) >> 27u), rot = (uint32_t)(old >> 59u);
    if (!ctx) return 0;
    ctx->rng_state = old * 6364136223846793005ULL + ctx->rng_inc;
    return (xorshifted >> rot) | (xorshifted << ((32u - rot) & 31u));
}

MLCDEF float mlc_rand_uniform(mlc_ctx *ctx) { return (float)(mlc_rand_u32(ctx) >> 8) * (1.0f / 16777216.0f); }

/* Box-Muller in double, rounded once to float, so libm's last bits cannot change the result. */
MLCDEF float mlc_rand_normal(mlc_ctx *ctx) {
    double u1 = ((double)(mlc_rand_u32(ctx) >> 8) + 1.0) / 16777217.0;
    double u2 = (double)(mlc_rand_u32(ctx) >> 8) / 16777216.0;
    return (float)(sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2));
}

static int mlc__i8_best(void);          /* mlc_gemm_i8's fastest kernel here (@section matmul) */

MLCDEF mlc_ctx *mlc_create(const mlc_config *config) {
    mlc_config cfg;
    mlc_ctx *ctx;
    unsigned char *raw;
    const char *device;
    size_t bytes = sizeof(mlc_ctx) + MLC__HEADER;
    if (config) cfg = *config; else memset(&cfg, 0, sizeof cfg);
    if (!cfg.allocator.alloc != !cfg.allocator.free) {             /* all or none */
        if (cfg.error && cfg.error_bytes)
            mlc__format(cfg.error, cfg.error_bytes, "mlc_create: mlc_config.allocator has %s but no %s",
                        cfg.allocator.alloc ? "alloc" : "free", cfg.allocator.alloc ? "free" : "alloc");
        return NULL;
    }
    raw = (unsigned char *)mlc__sys_alloc(&cfg.allocator, bytes);
    if (!raw) {
        if (cfg.error && cfg.error_bytes)
            mlc__format(cfg.error, cfg.error_bytes, "mlc_create: the allocator refused %zu bytes for the "
                        "context", bytes);
        return NULL;
    }
    memset(raw, 0, bytes);
    memcpy(raw, &bytes, sizeof bytes);
    ctx = (mlc_ctx *)(raw + MLC__HEADER);
    ctx->config = cfg;
    if (!ctx->config.arena_block_bytes) ctx->config.arena_block_bytes = (size_t)1 << 20;
    ctx->stats.allocs = 1;
    ctx->stats.bytes_current = ctx->stats.bytes_peak = bytes - MLC__HEADER;
    ctx->grad_enabled = 1;
    ctx->owned.next = ctx->owned.prev = &ctx->owned;
    ctx->buffers.refuse_from = -1;
    ctx->i8_kernel = mlc__i8_best();
    mlc_seed(ctx, cfg.seed);
    mlc_set_threads(ctx, cfg.threads);
    if (cfg.arena) mlc__arena_fixed(ctx);
    device = cfg.device;
#if !defined(MLC_NO_STDIO) && !defined(MLC_NO_MALLOC)
    if (!device) device = getenv("MLC_DEVICE");
#endif
    if (device && *device && strcmp(device, "cpu") != 0 && !ctx->error) {
        int i;
        const mlc__backend *be;
        for (i = 0; (be = mlc__registry(i)) != NULL && !ctx->error; i++) if (be->open(ctx, device)) break;
        if (!be && !ctx->error && strcmp(device, "best") != 0)
            mlc__fail(ctx, MLC_ERR_DEVICE, "mlc_create: no device matches \"%s\"%s (see mlc_devices; \"cpu\" "
                      "is always there, OpenCL's devices when built with MLC_OPENCL)", device,
                      cfg.device ? "" : " ($MLC_DEVICE)");
        else if (!be && !ctx->error)
            mlc__log(ctx, MLC_LOG_INFO, "best: no GPU; running on the CPU");
        if (ctx->error) {               /* never a context on a device it did not ask for */
            if (cfg.error && cfg.error_bytes) mlc__format(cfg.error, cfg.error_bytes, "%s", ctx->message);
            mlc_destroy(ctx);
            return NULL;
        }
    }
    return ctx;
}

MLCDEF void mlc_destroy(mlc_ctx *ctx) {
    mlc__block *b, *next;
    mlc_allocator a;
    if (!ctx) return;
    if (ctx->backend) mlc__device_close(ctx);
#if MLC__THREADS
    mlc__workers_stop(ctx);
#endif
    while (ctx->owned.next != &ctx->owned)
        mlc__owned_free(ctx, (unsigned char *)ctx->owned.next + sizeof(mlc__owned) + 16);
    for (b = ctx->config.arena ? NULL : ctx->first_block; b; b = next) {   /* a fixed arena is the caller's */
        next = b->next;
        mlc__heap_free(ctx, b);
    }
    a = ctx->config.allocator;
    mlc__sys_free(&a, (unsigned char *)ctx - MLC__HEADER);
}

MLCDEF const char *mlc_version(void) { return MLC_VERSION_STRING; }

MLCDEF const char *mlc_device_name(const mlc_ctx *ctx) {
    if (!ctx) return "none";
    if (!ctx->backend) return "cpu";
    return ctx->device_name[0] ? ctx->device_name : ctx->backend->name;
}
MLCDEF mlc_result mlc_error(const mlc_ctx *ctx) { return ctx ? ctx->error : MLC_ERR_NULL; }
MLCDEF const char *mlc_error_message(const mlc_ctx *ctx) {
    return !ctx ? "no context" : ctx->error ? ctx->message : "no error";
}
MLCDEF void mlc_clear_error(mlc_ctx *ctx) { if (ctx) { ctx->error = MLC_OK; ctx->message[0] = '\0'; } }
MLCDEF mlc_result mlc_set_error(mlc_ctx *ctx, mlc_result code, const char *message) {
    if (!ctx) return MLC_ERR_NULL;
    if (code != MLC_OK) mlc__fail(ctx, code, "%s", message ? message : "(no message)");
    return ctx->error;
}
MLCDEF int mlc_set_grad_enabled(mlc_ctx *ctx, int enabled) {
    int previous;
    if (!ctx) return 0;
    previous = ctx->grad_enabled;
    ctx->grad_enabled = enabled;
    return previous;
}

MLCDEF mlc_result mlc_autocast_begin(mlc_ctx *ctx, mlc_scalar_type dtype) {
    if (!ctx) return MLC_ERR_NULL;
    if (ctx->error) return ctx->error;
    if (dtype != MLC_BF16 && dtype != MLC_F16) {
        mlc__fail(ctx, MLC_ERR_ARG, "mlc_autocast_begin: dtype %d is not MLC_BF16 or MLC_F16", (int)dtype);
        return ctx->error;
    }
    ctx->autocast = dtype;
    ctx->n_autocast_copies = 0;
    return MLC_OK;
}

MLCDEF void mlc_autocast_end(mlc_ctx *ctx) {
    if (!ctx) return;
    ctx->autocast = MLC_F32;
    ctx->n_autocast_copies = 0;
}

MLCDEF mlc_stats mlc_get_stats(const mlc_ctx *ctx) {
    mlc_stats s;
    if (!ctx) { memset(&s, 0, sizeof s); return s; }
    s = ctx->stats;
    s.tape_nodes = ctx->tape ? ctx->tape->index + 1 : 0;
    return s;
}

/* Frames end in order, innermost first. Ending an outer frame while inner ones are open is
   MLC_ERR_STATE and ends the inner ones too (their memory is released); ending a frame twice is
   MLC_ERR_STATE and does nothing. At most MLC__MAX_FRAMES (64) are open at once. */
/* mlc_<name>_defaults(): each options struct zeroed, which is every field's default */
#define MLC__DEFAULTS_DEFINE(name, type) \
    MLCDEF type name(void) { type o; memset(&o, 0, sizeof o); return o; }
MLC__OPTIONS_STRUCTS(MLC__DEFAULTS_DEFINE)
#undef MLC__DEFAULTS_DEFINE

MLCDEF mlc_frame mlc_frame_begin(mlc_ctx *ctx) {
    mlc_frame f;
    memset(&f, 0, sizeof f);
    if (!ctx) return f;
    if (ctx->level >= MLC__MAX_FRAMES) {
        mlc__fail(ctx, MLC_ERR_STATE, "mlc_frame_begin: %d frames are open already (the most at once)",
                  ctx->level);
        return f;
    }
    f.ctx = ctx;
    f.block = ctx->block;
    f.block_used = ctx->block ? ctx->block->used : 0;
    f.arena_used = ctx->stats.arena_used;
    f.tape = ctx->tape;
    f.id = ctx->frame_ids[ctx->level] = ++ctx->frames_made;
    f.level = ctx->level++;
    return f;
}

MLCDEF void mlc_frame_end(mlc_frame f) {
    mlc_ctx *ctx = f.ctx;
    if (!ctx) return;
    if (f.level < 0 || f.level >= ctx->level || ctx->frame_ids[f.level] != f.id) {
        mlc__fail(ctx, MLC_ERR_STATE, "mlc_frame_end: the frame has ended already");
        return;
    }
    if (f.level != ctx->level - 1)
        mlc__fail(ctx, MLC_ERR_STATE, "mlc_frame_end: %d inner frame(s) still open; frames end "
                  "innermost first (the inner ones were ended too)", ctx->level - 1 - f.level);
    ctx->block = f.block ? (mlc__block *)f.block : ctx->first_block;
    if (ctx->block) ctx->block->used = f.block_used;
    ctx->stats.arena_used = f.arena_used;
    ctx->tape = (mlc__node *)f.tape;
    ctx->level = f.level;
    if (ctx->backend) mlc__device_release_frames(ctx, f.level);
}

/* A shape as text, "[2, 3]", for messages about shapes that have no tensor yet. */
typedef struct mlc__text { char text[96]; } mlc__text;
static mlc__text mlc__shape_text(int ndim, const int *shape) {
    mlc__text s;
    size_t n = 0;
    int d;
    s.text[n++] = '[';
    for (d = 0; d < ndim && n < sizeof s.text - 16; d++) {
        mlc__format(s.text + n, sizeof s.text - n, d ? ", %d" : "%d", shape[d]);
        n += strlen(s.text + n);
    }
    s.text[n++] = ']';
    s.text[n] = '\0';
    return s;
}

/* Whether t was made in a frame that has ended (its memory is the arena's again). Reliable while
   that memory has not been handed out again; like any dangling pointer, not always after. */
static int mlc__ended(const mlc_ctx *ctx, const mlc_tensor *t) {
    return !t->persistent && t->level > 0
        && (t->level > ctx->level || ctx->frame_ids[t->level - 1] != t->frame_id);
}

/* A setting where 0 means the default: MLC_ZERO (bits 0x00000001) is an explicit zero, 0 (or
   -0) the default. */
static float mlc__setting(float v, float def) {
    uint32_t b = mlc__bits(v);
    return b == 1u ? 0.0f : (b & 0x7fffffffu) == 0 ? def : v;
}

/* A hyper-parameter in [lo, hi] (or [lo, hi) when below_hi), never NaN; else MLC_ERR_ARG naming
   the op and the field. */
static int mlc__in_range(mlc_ctx *ctx, const char *op, const char *field, float v, float lo, float hi,
                         int below_hi) {
    if (mlc__is_finite(v) && v >= lo && (below_hi ? v < hi : v <= hi)) return 1;
    mlc__fail(ctx, MLC_ERR_ARG, "%s: %s = %g is outside [%g, %g%c", op, field, (double)v, (double)lo,
              (double)hi, below_hi ? ')' : ']');
    return 0;
}

/* out becomes a copy of x's header (a view of its data) made now, in the current frame. */
static void mlc__view(mlc_tensor *out, const mlc_tensor *x) {
    mlc_ctx *ctx = x->ctx;
    *out = *x;
    out->level = ctx->level;
    out->frame_id = ctx->level ? ctx->frame_ids[ctx->level - 1] : 0;
    out->graph_used = 0;
    out->qsums = NULL;                  /* (x keeps its own) */
    out->packed = NULL;
}

/* t may be read or used by `op`: not NULL, and not from an ended frame (else an error). */
static int mlc__usable(mlc_tensor *t, const char *op) {
    if (!t) return 0;
    if (t->freed)
        return mlc__fail(t->ctx, MLC_ERR_STATE, "%s: tensor %T was freed (mlc_tensor_free)", op, t) != NULL;
    if (!mlc__ended(t->ctx, t)) return 1;
    mlc__fail(t->ctx, MLC_ERR_STATE, "%s: tensor %T was made in a frame that has ended "
              "(mlc_frame_end freed it)", op, t);
    return 0;
}

/* ============================================================================================
   @section dtypes  bfloat16 and float16: one value's conversions, and arrays of them
   bf16 is float32's upper half: 1 sign, 8 exponent, 7 mantissa bits; rounding adds half an ulp
   of bf16 (plus the tie's evenness) to the float's bits and keeps the top 16. f16 has 5 exponent
   bits (bias 15) and 10 mantissa bits: below 2^-14 it is subnormal (steps of 2^-24), from 65520
   on it overflows. Both are PyTorch's rounding bit for bit (tests/dtype_table.h).
   ============================================================================================ */

MLCDEF uint16_t mlc_float_to_bf16(float v) {
    uint32_t b = mlc__bits(v);
    if ((b & 0x7fffffffu) > 0x7f800000u) return 0x7fc0u;                  /* NaN */
    return (uint16_t)((b + 0x7fffu + (b >> 16 & 1u)) >> 16);            /* to nearest, ties to even */
}

MLCDEF float mlc_bf16_to_float(uint16_t bits) {
    uint32_t b = (uint32_t)bits << 16;
    float v;
    memcpy(&v, &b, sizeof v);
    return v;
}

MLCDEF uint16_t mlc_float_to_f16(float v) {
    uint32_t b = mlc__bits(v), sign = b >> 16 & 0x8000u, a = b & 0x7fffffffu, e = a >> 23, m, shift, q, rest;
    if (a > 0x7f800000u) return (uint16_t)(sign | 0x7e00u);             /* NaN: quiet, payload dropped */
    if (a >= 0x477ff000u) return (uint16_t)(sign | 0x7c00u);            /* 65520 and up: infinity */
    if (e >= 113) {                                                      /* normal in f16: 2^-14 and up */
        m = a + 0x0fffu + (a >> 13 & 1u) - (112u << 23);                 /* rebias, round to 10 bits */
        return (uint16_t)(sign | m >> 13);
    }
    if (e < 102) return (uint16_t)sign;                                  /* below 2^-25: a signed zero */
    m = (a & 0x7fffffu) | 0x800000u;                                     /* subnormal: steps of 2^-24 */
    shift = 126 - e;                                                     /* 14..24 */
    q = m >> shift;
    rest = m & ((1u << shift) - 1);
    q += rest > 1u << (shift - 1) || (rest == 1u << (shift - 1) && (q & 1u));
    return (uint16_t)(sign | q);
}

MLCDEF float mlc_f16_to_float(uint16_t h) {
    uint32_t sign = (uint32_t)(h >> 15) << 31, exponent = h >> 10 & 31u, mantissa = h & 1023u, bits;
    float f;
    if (exponent == 0) {                                 /* the sign as a bit: -0 stays -0 under fast-math */
        f = (float)mantissa * 5.9604644775390625e-8f;
        bits = sign | mlc__bits(f);
    } else if (exponent == 31)
        bits = sign | 0x7f800000u | mantissa << 13 | (mantissa ? 0x400000u : 0u);   /* NaN comes back quiet */
    else bits = sign | (exponent + 112) << 23 | mantissa << 13;
    memcpy(&f, &bits, sizeof f);
    return f;
}

static int mlc__is_half(mlc_scalar_type dtype) { return dtype == MLC_BF16 || dtype == MLC_F16; }

#if MLC__X86
/* float16 through F16C, 8 at a time: vcvtph2ps is exact and quiets a NaN as PyTorch does;
   vcvtps2ph rounds to nearest even as PyTorch does but keeps a NaN's payload, so NaN lanes are
   set to PyTorch's quiet NaN (0x7e00 and the sign). The rest of n goes one by one. Taken on
   CPUs with AVX2 (every one has F16C; Clang's __builtin_cpu_supports does not know "f16c"). */
__attribute__((target("avx2,f16c")))
static size_t mlc__f16_widen_f16c(const uint16_t *src, float *dst, size_t n) {
    size_t i;
    for (i = 0; i + 8 <= n; i += 8)
        _mm256_storeu_ps(dst + i, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(const void *)(src + i))));
    return i;
}
__attribute__((target("avx2,f16c")))
static size_t mlc__f16_narrow_f16c(const float *src, uint16_t *dst, size_t n) {
    const __m256i magnitude = _mm256_set1_epi32(0x7fffffff), infinity = _mm256_set1_epi32(0x7f800000);
    const __m256i quiet = _mm256_set1_epi32(0x7e00);
    size_t i;
    for (i = 0; i + 8 <= n; i += 8) {
        __m256i bits = _mm256_loadu_si256((const __m256i *)(const void *)(src + i));
        __m256i nan = _mm256_cmpgt_epi32(_mm256_and_si256(bits, magnitude), infinity);
        __m256i sign = _mm256_srli_epi32(_mm256_andnot_si256(magnitude, bits), 16);
        __m256i canonical = _mm256_or_si256(sign, quiet);
        __m128i h = _mm256_cvtps_ph(_mm256_castsi256_ps(bits), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
        __m128i nan16 = _mm_packs_epi32(_mm256_castsi256_si128(nan), _mm256_extracti128_si256(nan, 1));
        __m128i canonical16 = _mm_packus_epi32(_mm256_castsi256_si128(canonical),
                                               _mm256_extracti128_si256(canonical, 1));
        _mm_storeu_si128((__m128i *)(void *)(dst + i), _mm_blendv_epi8(h, canonical16, nan16));
    }
    return i;
}
#endif

/* bf16 <-> float32 for element i, the conversions written out for loops that vectorise */
#define MLC__BF16_WIDEN(i) do { uint32_t b_ = (uint32_t)src[i] << 16; memcpy(dst + (i), &b_, 4); } while (0)
#define MLC__BF16_NARROW(i) do { \
        uint32_t b_; \
        memcpy(&b_, src + (i), 4); \
        dst[i] = (uint16_t)((b_ & 0x7fffffffu) > 0x7f800000u ? 0x7fc0u \
                                                              : (b_ + 0x7fffu + (b_ >> 16 & 1u)) >> 16); \
    } while (0)

/* bf16 in blocks of 16 (a count GCC's -O2 vectorises), for any CPU and for AVX2 (2.4 times as
   fast to round), picked at run time; the rest of n one by one */
static MLC__INLINE void mlc__bf16_widen_blocks(const uint16_t *MLC__RESTRICT src, float *MLC__RESTRICT dst,
                                               size_t n) {
    size_t i, k;
    for (i = 0; i + 16 <= n; i += 16) for (k = i; k < i + 16; k++) MLC__BF16_WIDEN(k);
    for (; i < n; i++) MLC__BF16_WIDEN(i);
}
static MLC__INLINE void mlc__bf16_narrow_blocks(const float *MLC__RESTRICT src, uint16_t *MLC__RESTRICT dst,
                                                size_t n) {
    size_t i, k;
    for (i = 0; i + 16 <= n; i += 16) for (k = i; k < i + 16; k++) MLC__BF16_NARROW(k);
    for (; i < n; i++) MLC__BF16_NARROW(i);
}
#if MLC__X86
__attribute__((target("avx2")))
static void mlc__bf16_widen_avx2(const uint16_t *MLC__RESTRICT src, float *MLC__RESTRICT dst, size_t n) {
    mlc__bf16_widen_blocks(src, dst, n);
}
__attribute__((target("avx2")))
static void mlc__bf16_narrow_avx2(const float *MLC__RESTRICT src, uint16_t *MLC__RESTRICT dst, size_t n) {
    mlc__bf16_narrow_blocks(src, dst, n);
}
/* The same with AVX-512 BW and VL, 16 at a time, the rest under a mask: short rows (a
   convolution's 14 or 28) in vectors too. (GCC 12 as C++ reads the placeholder operand of its
   own AVX-512 conversion intrinsics as "may be used uninitialized": silenced for the two.) */
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif
#define MLC__BF16_AVX512_TARGET "avx512f,avx512bw,avx512vl"
static int mlc__cpu_avx512bw(void) {
    return __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vl");
}
__attribute__((target(MLC__BF16_AVX512_TARGET)))
static void mlc__bf16_widen_avx512(const uint16_t *MLC__RESTRICT src, float *MLC__RESTRICT dst, size_t n) {
    size_t i;
    for (i = 0; i < n; i += 16) {
        const __mmask16 m = n - i >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << (n - i)) - 1);
        const __m512i b = _mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(m, src + i)), 16);
        _mm512_mask_storeu_ps(dst + i, m, _mm512_castsi512_ps(b));
    }
}
__attribute__((target(MLC__BF16_AVX512_TARGET)))
static void mlc__bf16_narrow_avx512(const float *MLC__RESTRICT src, uint16_t *MLC__RESTRICT dst, size_t n) {
    const __m512i magnitude = _mm512_set1_epi32(0x7fffffff), infinity = _mm512_set1_epi32(0x7f800000),
                  half = _mm512_set1_epi32(0x7fff), one = _mm512_set1_epi32(1),
                  nan = _mm512_set1_epi32(0x7fc0);
    size_t i;
    for (i = 0; i < n; i += 16) {                        /* MLC__BF16_NARROW, 16 lanes */
        const __mmask16 m = n - i >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << (n - i)) - 1);
        const __m512i b = _mm512_castps_si512(_mm512_maskz_loadu_ps(m, src + i)),
                      lsb = _mm512_and_si512(_mm512_srli_epi32(b, 16), one),
                      up = _mm512_srli_epi32(_mm512_add_epi32(b, _mm512_add_epi32(half, lsb)), 16);
        const __mmask16 is_nan = _mm512_cmpgt_epu32_mask(_mm512_and_si512(b, magnitude), infinity);
        _mm256_mask_storeu_epi16(dst + i, m, _mm512_cvtepi32_epi16(_mm512_mask_mov_epi32(up, is_nan, nan)));
    }
}
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic pop
#endif
#endif

/* n values of dtype at src, widened to float32 at dst; and rounded back (bf16: mlc_float_to_bf16,
   as a select). float16 takes F16C where the CPU has it. */
static void mlc__widen(mlc_scalar_type dtype, const uint16_t *MLC__RESTRICT src, float *MLC__RESTRICT dst,
                       size_t n) {
    size_t i = 0;
    if (dtype == MLC_BF16) {
#if MLC__X86
        if (mlc__cpu_avx512bw()) { mlc__bf16_widen_avx512(src, dst, n); return; }
        if (__builtin_cpu_supports("avx2")) { mlc__bf16_widen_avx2(src, dst, n); return; }
#endif
        mlc__bf16_widen_blocks(src, dst, n);
        return;
    }
#if MLC__X86
    if (__builtin_cpu_supports("avx2")) i = mlc__f16_widen_f16c(src, dst, n);   /* AVX2 CPUs have F16C */
#endif
    for (; i < n; i++) dst[i] = mlc_f16_to_float(src[i]);
}
static void mlc__narrow(mlc_scalar_type dtype, const float *MLC__RESTRICT src, uint16_t *MLC__RESTRICT dst,
                        size_t n) {
    size_t i = 0;
    if (dtype == MLC_BF16) {
#if MLC__X86
        if (mlc__cpu_avx512bw()) { mlc__bf16_narrow_avx512(src, dst, n); return; }
        if (__builtin_cpu_supports("avx2")) { mlc__bf16_narrow_avx2(src, dst, n); return; }
#endif
        mlc__bf16_narrow_blocks(src, dst, n);
        return;
    }
#if MLC__X86
    if (__builtin_cpu_supports("avx2")) i = mlc__f16_narrow_f16c(src, dst, n);
#endif
    for (; i < n; i++) dst[i] = mlc_float_to_f16(src[i]);
}

static int8_t mlc__quantize_value(float v, float inverse_scale, int zero_point, int lowest);
/* The scale of element i of an int8 tensor (per row, or per tensor; the scales' host copy is current) */
static float mlc__qscale_at(const mlc_tensor *t, size_t i) {
    return t->qscales ? t->qscales->data[i / (t->size / (size_t)t->shape[0])] : t->qscale;
}

/* Element i of t becomes v, rounded to t's dtype (t's host copy is written) */
static void mlc__set(mlc_tensor *t, size_t i, float v) {
    if (t->dtype == MLC_F32) t->data[i] = v;
    else if (t->dtype == MLC_I8)
        t->int8[i] = mlc__quantize_value(v, 1.0f / mlc__qscale_at(t, i), t->qzero, t->qscales ? -127 : -128);
    else t->half[i] = t->dtype == MLC_BF16 ? mlc_float_to_bf16(v) : mlc_float_to_f16(v);
}

/* Element i of t as a float, whatever its dtype (t's host copy is current; int8: dequantized) */
static float mlc__value(const mlc_tensor *t, size_t i) {
    return t->dtype == MLC_F32    ? t->data[i]
           : t->dtype == MLC_I8   ? mlc__qscale_at(t, i) * (float)(t->int8[i] - t->qzero)
           : t->dtype == MLC_BF16 ? mlc_bf16_to_float(t->half[i])
                                  : mlc_f16_to_float(t->half[i]);
}

static void mlc__host_sync(mlc_tensor *t);
/* t's values as float32 at dst (half: widened; int8: dequantized), and back (rounded) */
static void mlc__values_out(mlc_tensor *t, float *dst) {
    size_t i;
    if (t->dtype == MLC_F32) memcpy(dst, t->data, t->size * sizeof(float));
    else if (t->dtype != MLC_I8) mlc__widen(t->dtype, t->half, dst, t->size);
    else {
        if (t->qscales) mlc__host_sync(t->qscales);
        for (i = 0; i < t->size; i++) dst[i] = mlc__value(t, i);
    }
}
static void mlc__values_in(mlc_tensor *t, const float *src) {
    size_t i;
    if (t->dtype == MLC_F32) memcpy(t->data, src, t->size * sizeof(float));
    else if (t->dtype != MLC_I8) mlc__narrow(t->dtype, src, t->half, t->size);
    else {
        if (t->qscales) mlc__host_sync(t->qscales);
        for (i = 0; i < t->size; i++) mlc__set(t, i, src[i]);
    }
}

MLCDEF mlc_scalar_type mlc_dtype(const mlc_tensor *t) { return t ? t->dtype : MLC_F32; }
MLCDEF const char *mlc_dtype_name(mlc_scalar_type dtype) {
    return dtype == MLC_F32 ? "float32" : dtype == MLC_BF16 ? "bfloat16" : dtype == MLC_F16 ? "float16"
           : dtype == MLC_I8 ? "int8" : "?";
}

/* ============================================================================================
   @section devices  Devices: where tensors live, and the backend table
   A tensor on the device keeps a host copy too; its `stale` bits say which copy is out of
   date. An op on device tensors hands its node to the backend; a backend without that kernel
   declines, the host copies are brought up to date and the CPU code runs (a fallback: counted,
   logged once). A node whose forward ran on the device runs its backward there too.
   ============================================================================================ */


MLCDEF int mlc_devices(mlc_device_info *out, int max) {
    const mlc__backend *be;
    int i, n = 0;
    for (i = 0; (be = mlc__registry(i)) != NULL; i++) {
        int rows = be->devices ? be->devices(out ? out + n : NULL, max > n ? max - n : 0) : 0;
        n += rows;
    }
    return n;
}

MLCDEF int mlc_has_device(const mlc_ctx *ctx) { return ctx && ctx->backend; }
MLCDEF void mlc_sync(mlc_ctx *ctx) { if (ctx && ctx->backend) ctx->backend->wait(ctx, 1); }

/* The CPU wrote t's host data (or gradient): the device copy is out of date. */
static void mlc__int8_sum_rows(const mlc_tensor *w, int32_t *sums);   /* (@section int8) */
static int mlc__int8_keep_sums(mlc_tensor *w);
static void mlc__drop_packed(mlc_tensor *t) {
    mlc__owned_free(t->ctx, t->packed);
    t->packed = NULL;
}
static void mlc__host_wrote(mlc_tensor *t) {
    t->stale &= ~(unsigned)MLC__HOST_STALE;
    if (t->on_device) t->stale |= MLC__DEVICE_STALE;
    if (t->qsums) mlc__int8_sum_rows(t, t->qsums);      /* (int8: its row sums follow) */
    mlc__drop_packed(t);                                /* (and a packed copy is out of date) */
}
static void mlc__host_wrote_grad(mlc_tensor *t) {
    t->stale &= ~(unsigned)MLC__GRAD_HOST_STALE;
    if (t->on_device) t->stale |= MLC__GRAD_DEVICE_STALE;
}

/* A gradient that counts as zeros becomes zeros in its host buffer, when it has one (then the
   device copy is out of date). */
static void mlc__settle_grad(mlc_tensor *t) {
    if (!(t->stale & MLC__GRAD_ZERO) || !t->grad) return;
    t->stale &= ~(unsigned)MLC__GRAD_ZERO;
    memset(t->grad, 0, t->size * sizeof(float));
    mlc__host_wrote_grad(t);
}

/* The host copy of t's data (or gradient), brought up to date. A bf16 or f16 tensor's values
   come as a float32 copy in the frame's arena, for reading (NULL when out of memory); a caller
   that only needs the copy current (before the CPU runs an op) calls mlc__host_sync, which
   makes none. */
static void mlc__host_sync(mlc_tensor *t) {   /* only the copy brought up to date (half: on the host) */
    if ((t->stale & MLC__HOST_STALE) && !t->ctx->error && t->ctx->backend->download(t, 0))
        t->stale &= ~(unsigned)MLC__HOST_STALE;
}
static float *mlc__host(mlc_tensor *t) {
    mlc__host_sync(t);
    if (t->dtype != MLC_F32) {
        float *copy = (float *)mlc__arena_alloc(t->ctx, t->size * sizeof(float) + 1, "mlc_read");
        if (copy) mlc__values_out(t, copy);
        return copy;
    }
    return t->data;
}
static float *mlc__host_grad(mlc_tensor *t) {
    if (!t->grad && t->device_grad) {                   /* the gradient so far lives on the device only */
        t->grad = t->persistent ? (float *)mlc__owned_alloc(t->ctx, t->size * sizeof(float), "mlc_host_grad")
                                : (float *)mlc__arena_alloc(t->ctx, t->size * sizeof(float), "mlc_host_grad");
        if (!t->grad) return NULL;
        if (!(t->stale & MLC__GRAD_ZERO)) t->stale |= MLC__GRAD_HOST_STALE;   /* zeros: nothing to fetch */
    }
    if (t->grad && (t->stale & MLC__GRAD_HOST_STALE) && !t->ctx->error) {
        if (!t->ctx->backend->download(t, 1)) return t->grad;
        t->stale &= ~(unsigned)MLC__GRAD_HOST_STALE;
    }
    mlc__settle_grad(t);
    return t->grad;
}

/* For backends: t's data on the device, current (its buffer made when missing, the host copy
   uploaded when it is newer); the buffer an op writes t into; t's gradient on the device,
   current (a new buffer takes the host gradient when that is current; one that counts as zeros,
   or a new one with nothing on the host, is filled with zeros), and with writes set the kernel
   will add into it, so the host copy becomes stale; or, for a kernel that writes t's gradient
   as C = product + beta C, that buffer and *beta: 0 where the fill would be needed (the kernel
   writes over the buffer, and no zeros are written first), else 1. NULL: the error is set. */
#if defined(__GNUC__) || defined(__clang__)
#define MLC__FOR_BACKENDS static __attribute__((unused))   /* a build without a backend calls none */
#else
#define MLC__FOR_BACKENDS static
#endif
MLC__FOR_BACKENDS void *mlc__device_in(mlc_tensor *t) {
    if (!t->device_data || (t->stale & MLC__DEVICE_STALE)) {
        if (!t->ctx->backend->upload(t, 0)) return NULL;
        t->stale &= ~(unsigned)MLC__DEVICE_STALE;
    }
    return t->device_data;
}
MLC__FOR_BACKENDS void *mlc__device_out(mlc_tensor *t, const char *op) { return mlc__buffer_of(t, 0, op); }
MLC__FOR_BACKENDS int mlc__device_grad_blank(const mlc_tensor *t) {   /* nothing to keep on the device */
    return (t->stale & MLC__GRAD_ZERO) != 0
        || (!t->device_grad && (!t->grad || (t->stale & MLC__GRAD_HOST_STALE)));
}
MLC__FOR_BACKENDS void *mlc__device_grad(mlc_tensor *t, int writes, const char *op) {
    int fresh = t->device_grad == NULL, blank = mlc__device_grad_blank(t);
    if (!mlc__buffer_of(t, 1, op)) return NULL;
    if (blank) {
        if (!t->ctx->backend->fill(t, 1, 0.0f)) return NULL;
    } else if (t->grad && (fresh || (t->stale & MLC__GRAD_DEVICE_STALE)) && !t->ctx->backend->upload(t, 1))
        return NULL;
    t->stale &= ~(unsigned)(MLC__GRAD_DEVICE_STALE | MLC__GRAD_ZERO);
    if (writes || blank) t->stale |= MLC__GRAD_HOST_STALE;
    return t->device_grad;
}
MLC__FOR_BACKENDS void *mlc__device_grad_to_overwrite(mlc_tensor *t, float *beta, const char *op) {
    *beta = 1.0f;
    if (!mlc__device_grad_blank(t)) return mlc__device_grad(t, 1, op);
    if (!mlc__buffer_of(t, 1, op)) return NULL;
    *beta = 0.0f;
    t->stale = (t->stale & ~(unsigned)(MLC__GRAD_DEVICE_STALE | MLC__GRAD_ZERO)) | MLC__GRAD_HOST_STALE;
    return t->device_grad;
}

/* Zero t's gradient: it only counts as zeros (MLC__GRAD_ZERO), wherever it has buffers, until a
   reader brings the zeros where it reads (the host copy: mlc__settle_grad; the device copy:
   mlc__device_grad) or a product overwrites the buffer. */
static void mlc__clear_grad(mlc_tensor *t) {
    t->stale &= ~(unsigned)(MLC__GRAD_HOST_STALE | MLC__GRAD_DEVICE_STALE);
    if (t->grad || t->device_grad) t->stale |= MLC__GRAD_ZERO;
}

MLCDEF float *mlc_host_data(mlc_tensor *t) {
    if (!mlc__usable(t, "mlc_host_data")) return NULL;
    if (t->dtype == MLC_F32) return mlc__host(t);
    return (float *)mlc__fail(t->ctx, MLC_ERR_ARG, "mlc_host_data: tensor %T is %s, not float32: read it "
                              "with mlc_read or mlc_get", t, mlc_dtype_name(t->dtype));
}
MLCDEF float *mlc_host_grad(mlc_tensor *t) {
    return mlc__usable(t, "mlc_host_grad") ? mlc__host_grad(t) : NULL;
}

static void mlc__fall_back(mlc_ctx *ctx, const char *op) {
    int i;
    ctx->stats.fallbacks++;
    for (i = 0; i < ctx->n_fell_back; i++) if (ctx->fell_back[i] == op) return;
    if (ctx->n_fell_back < 64) ctx->fell_back[ctx->n_fell_back++] = op;
    {
        char message[160];
        mlc__format(message, sizeof message, "%s has no kernel on %s: it runs on the CPU, through copies", op,
                    mlc_device_name(ctx));
        mlc__log(ctx, MLC_LOG_WARN, message);
    }
}

MLCDEF mlc_tensor *mlc_to(mlc_tensor *t, int on_device) {
    mlc_ctx *ctx;
    if (!t || t->ctx->error || !mlc__usable(t, "mlc_to")) return NULL;
    ctx = t->ctx;
    on_device = on_device != 0;
    if (on_device && !ctx->backend)
        return (mlc_tensor *)mlc__fail(ctx, MLC_ERR_DEVICE,
                                       "mlc_to: context runs on the CPU only (no device)");
    if (on_device == t->on_device) return t;
    if (!on_device) {                            /* bring both copies home */
        mlc__host_sync(t);
        mlc__host_grad(t);
        if (t->persistent) mlc__device_release(t);
        t->device_data = t->device_grad = NULL;
        t->stale = 0;
        t->on_device = 0;
    } else {
        mlc__settle_grad(t);
        mlc__drop_packed(t);                    /* (the device may change the values) */
        t->on_device = 1;
        t->stale = MLC__DEVICE_STALE | MLC__GRAD_DEVICE_STALE;
        if (!mlc__buffer_of(t, 0, "mlc_to") || (t->grad && !mlc__buffer_of(t, 1, "mlc_to"))) return NULL;
        if (!ctx->backend->upload(t, 0) || (t->grad && !ctx->backend->upload(t, 1))) return NULL;
        t->stale = 0;
    }
    return ctx->error ? NULL : t;
}

/* ============================================================================================
   @section tensors  Tensors: creation, shapes, reading and writing
   ============================================================================================ */

static size_t mlc__numel(int ndim, const int *shape) {
    size_t n = 1;
    int d;
    for (d = 0; d < ndim; d++) n *= (size_t)shape[d];
    return n;
}

static int mlc__check_shape(mlc_ctx *ctx, const char *op, int ndim, const int *shape) {
    int d;
    if (ndim < 0 || ndim > MLC_MAX_DIMS) {
        mlc__fail(ctx, MLC_ERR_SHAPE, "%s: rank %d is outside 0..%d", op, ndim, MLC_MAX_DIMS);
        return 0;
    }
    if (ndim && !shape) { mlc__fail(ctx, MLC_ERR_NULL, "%s: shape is NULL", op); return 0; }
    for (d = 0; d < ndim; d++)
        if (shape[d] < 0) {
            mlc__fail(ctx, MLC_ERR_SHAPE, "%s: dimension %d is negative (%d)", op, d, shape[d]);
            return 0;
        }
    return 1;
}

/* Make a tensor of ctx->op_dtype: in the arena (temporaries: the values right after the struct)
   or on the owned heap (long-lived: the values in a block of their own, which
   mlc_module_to_dtype can replace); over (not NULL): a long-lived float32 one whose data is the
   caller's read-only memory (only the struct is allocated). */
static mlc_tensor *mlc__make_over(mlc_ctx *ctx, const char *op, int ndim, const int *shape, int persistent,
                                  const float *over) {
    const size_t header = (sizeof(mlc_tensor) + 31) & ~(size_t)31;
    mlc_tensor *t;
    size_t size = 1, bytes, width;
    unsigned char *values;
    int d;
    if (!ctx || ctx->error || !mlc__check_shape(ctx, op, ndim, shape)) return NULL;
    width = over ? sizeof(float) : mlc__width(ctx->op_dtype);
    for (d = 0; d < ndim; d++)
        if (!mlc__size(size, (size_t)shape[d], 0, &size)) break;
    if (d < ndim || !mlc__size(size, width, header, &bytes))
        return (mlc_tensor *)mlc__fail(ctx, MLC_ERR_SHAPE, "%s: a tensor of shape %s has more bytes than "
                                       "size_t counts", op, mlc__shape_text(ndim, shape).text);
    if (over || persistent) bytes = sizeof(mlc_tensor);
    t = (mlc_tensor *)(persistent ? mlc__owned_alloc(ctx, bytes, op) : mlc__arena_alloc(ctx, bytes, op));
    if (!t) return NULL;
    values = persistent ? over ? (unsigned char *)(uintptr_t)over
                               : (unsigned char *)mlc__owned_alloc(ctx, size * width + 1, op)
                        : (unsigned char *)t + header;
    if (!values) { mlc__owned_free(ctx, t); return NULL; }
    memset(t, 0, sizeof *t);
    t->ctx = ctx;
    t->ndim = ndim;
    if (ndim) memcpy(t->shape, shape, (size_t)ndim * sizeof(int));
    t->size = size;
    t->dtype = over ? MLC_F32 : ctx->op_dtype;
    if (mlc__is_half(t->dtype)) t->half = (uint16_t *)(void *)values;
    else if (t->dtype == MLC_I8) t->int8 = (int8_t *)(void *)values;
    else t->data = (float *)(void *)values;
    t->read_only = over != NULL;
    t->persistent = persistent;
    t->on_device = ctx->op_device;
    t->level = ctx->level;
    t->frame_id = ctx->level ? ctx->frame_ids[ctx->level - 1] : 0;
    t->stale = t->on_device ? MLC__DEVICE_STALE : 0;     /* the host copy is written first */
    return t;
}

static mlc_tensor *mlc__make(mlc_ctx *ctx, const char *op, int ndim, const int *shape, int persistent) {
    return mlc__make_over(ctx, op, ndim, shape, persistent, NULL);
}

/* A tensor's values on the host (data, half or int8; a long-lived one owns them apart from its struct) */
static void *mlc__storage(const mlc_tensor *t) {
    return t->half ? (void *)t->half : t->int8 ? (void *)t->int8 : (void *)t->data;
}
/* For backends: the host memory upload and download copy, mlc__bytes_of(t, grad) bytes */
MLC__FOR_BACKENDS void *mlc__host_copy_of(mlc_tensor *t, int grad) {
    return grad ? (void *)t->grad : mlc__storage(t);
}

/* A float32 tensor the user creates: it lives on the context's device. */
static mlc_tensor *mlc__new(mlc_ctx *ctx, const char *op, int ndim, const int *shape, int persistent) {
    if (ctx) { ctx->op_device = ctx->backend != NULL; ctx->op_dtype = MLC_F32; }
    return mlc__make(ctx, op, ndim, shape, persistent);
}

static mlc_tensor *mlc__like(mlc_tensor *x, const char *op) {
    return mlc__make(x->ctx, op, x->ndim, x->shape, 0);
}

static float *mlc__floats(mlc_ctx *ctx, size_t count, const char *op) {   /* arena scratch */
    return (float *)mlc__arena_alloc(ctx, count * sizeof(float), op);
}

MLCDEF mlc_tensor *mlc_empty(mlc_ctx *ctx, int ndim, const int *shape) {
    return mlc__new(ctx, "mlc_empty", ndim, shape, 0);
}

MLCDEF mlc_tensor *mlc_full(mlc_ctx *ctx, int ndim, const int *shape, float value) {
    mlc_tensor *t = mlc__new(ctx, "mlc_full", ndim, shape, 0);
    size_t i;
    if (t) for (i = 0; i < t->size; i++) t->data[i] = value;
    return t;
}
MLCDEF mlc_tensor *mlc_zeros(mlc_ctx *ctx, int ndim, const int *shape) {
    return mlc_full(ctx, ndim, shape, 0.0f);
}
MLCDEF mlc_tensor *mlc_ones(mlc_ctx *ctx, int ndim, const int *shape) {
    return mlc_full(ctx, ndim, shape, 1.0f);
}

MLCDEF mlc_tensor *mlc_from_data(mlc_ctx *ctx, int ndim, const int *shape, const float *data) {
    mlc_tensor *t;
    if (ctx && !data) return (mlc_tensor *)mlc__fail(ctx, MLC_ERR_NULL, "mlc_from_data: data is NULL");
    t = mlc__new(ctx, "mlc_from_data", ndim, shape, 0);
    if (t && t->size) memcpy(t->data, data, t->size * sizeof(float));
    return t;
}

/* In a dtype: float32 values made, then rounded on the host (the device copy follows) */
static mlc_tensor *mlc__new_dtype(mlc_ctx *ctx, const char *op, int ndim, const int *shape,
                                  mlc_scalar_type dtype, const float *data, float value) {
    mlc_tensor *t;
    size_t i;
    if (!ctx || ctx->error) return NULL;
    if ((unsigned)dtype > (unsigned)MLC_F16)
        return (mlc_tensor *)mlc__fail(ctx, MLC_ERR_ARG, "%s: %d is not a dtype", op, (int)dtype);
    if (dtype == MLC_F32)
        return data ? mlc_from_data(ctx, ndim, shape, data) : mlc_full(ctx, ndim, shape, value);
    ctx->op_device = ctx->backend != NULL;
    ctx->op_dtype = dtype;
    if (!(t = mlc__make(ctx, op, ndim, shape, 0))) return NULL;
    if (data) mlc__narrow(dtype, data, t->half, t->size);
    else {
        const uint16_t bits = dtype == MLC_BF16 ? mlc_float_to_bf16(value) : mlc_float_to_f16(value);
        for (i = 0; i < t->size; i++) t->half[i] = bits;
    }
    return t;
}
MLCDEF mlc_tensor *mlc_full_dtype(mlc_ctx *ctx, int ndim, const int *shape, float value,
                                  mlc_scalar_type dtype) {
    return mlc__new_dtype(ctx, "mlc_full_dtype", ndim, shape, dtype, NULL, value);
}
MLCDEF mlc_tensor *mlc_from_data_dtype(mlc_ctx *ctx, int ndim, const int *shape, const float *data,
                                       mlc_scalar_type dtype) {
    if (ctx && !data) return (mlc_tensor *)mlc__fail(ctx, MLC_ERR_NULL, "mlc_from_data_dtype: data is NULL");
    return mlc__new_dtype(ctx, "mlc_from_data_dtype", ndim, shape, dtype, data, 0.0f);
}

MLCDEF mlc_tensor *mlc_from_const(mlc_ctx *ctx, int ndim, const int *shape, const float *data) {
    if (ctx && !data) return (mlc_tensor *)mlc__fail(ctx, MLC_ERR_NULL, "mlc_from_const: data is NULL");
    if (ctx) { ctx->op_device = ctx->backend != NULL; ctx->op_dtype = MLC_F32; }
    return mlc__make_over(ctx, "mlc_from_const", ndim, shape, 1, data);
}

/* Whatever writes t's data asks here first: a tensor over read-only memory refuses. */
static int mlc__writable(mlc_tensor *t, const char *op) {
    if (!mlc__usable(t, op)) return 0;
    if (!t->read_only) return 1;
    mlc__fail(t->ctx, MLC_ERR_STATE, "%s: tensor %T wraps read-only memory (mlc_from_const): it cannot be "
              "written or trained", op, t);
    return 0;
}

MLCDEF mlc_tensor *mlc_arange(mlc_ctx *ctx, float start, float stop, float step) {
    mlc_tensor *t;
    double count;
    int n, i;
    if (!ctx || ctx->error) return NULL;
    count = step != 0.0f ? ceil(((double)stop - (double)start) / (double)step) : -1.0;
    if (!mlc__is_finite(start) || !mlc__is_finite(stop) || !mlc__is_finite(step) || step == 0.0f
        || count > 2147483647.0)
        return (mlc_tensor *)mlc__fail(ctx, MLC_ERR_ARG, "mlc_arange: bad range start %g stop %g step %g",
                                       (double)start, (double)stop, (double)step);
    n = count > 0 ? (int)count : 0;
    t = mlc__new(ctx, "mlc_arange", 1, &n, 0);
    if (t) for (i = 0; i < n; i++) t->data[i] = (float)((double)start + (double)i * (double)step);
    return t;
}

MLCDEF mlc_tensor *mlc_rand(mlc_ctx *ctx, int ndim, const int *shape) {
    mlc_tensor *t = mlc__new(ctx, "mlc_rand", ndim, shape, 0);
    size_t i;
    if (t) for (i = 0; i < t->size; i++) t->data[i] = mlc_rand_uniform(ctx);
    return t;
}

MLCDEF mlc_tensor *mlc_randn(mlc_ctx *ctx, int ndim, const int *shape) {
    mlc_tensor *t = mlc__new(ctx, "mlc_randn", ndim, shape, 0);
    size_t i;
    if (t) for (i = 0; i < t->size; i++) t->data[i] = mlc_rand_normal(ctx);
    return t;
}

/* Leaves that want a gradient get their buffer now, with the same lifetime as their data. */
static int mlc__alloc_grad(mlc_tensor *t, const char *op) {
    if (t->grad) return 1;
    t->grad = t->persistent ? (float *)mlc__owned_alloc(t->ctx, t->size * sizeof(float), op)
                            : mlc__floats(t->ctx, t->size, op);
    if (!t->grad) return 0;
    memset(t->grad, 0, t->size * sizeof(float));
    mlc__host_wrote_grad(t);
    return 1;
}

MLCDEF mlc_scalar_type mlc_set_default_dtype(mlc_ctx *ctx, mlc_scalar_type dtype) {
    mlc_scalar_type previous;
    if (!ctx) return MLC_F32;
    previous = ctx->default_dtype;
    if ((unsigned)dtype > (unsigned)MLC_F16)
        mlc__fail(ctx, MLC_ERR_ARG, "mlc_set_default_dtype: %d is not a dtype", (int)dtype);
    else ctx->default_dtype = dtype;
    return previous;
}

/* A long-lived tensor of the default dtype for a parameter or a buffer */
static mlc_tensor *mlc__new_default(mlc_ctx *ctx, const char *op, int ndim, const int *shape) {
    if (!ctx) return NULL;
    ctx->op_device = ctx->backend != NULL;
    ctx->op_dtype = ctx->default_dtype;
    return mlc__make(ctx, op, ndim, shape, 1);
}

MLCDEF mlc_tensor *mlc_parameter(mlc_ctx *ctx, int ndim, const int *shape) {
    mlc_tensor *t = mlc__new_default(ctx, "mlc_parameter", ndim, shape);
    if (!t) return NULL;
    t->requires_grad = 1;
    if (t->dtype == MLC_F32 && !mlc__alloc_grad(t, "mlc_parameter")) { mlc_tensor_free(t); return NULL; }
    return t;
}

MLCDEF mlc_tensor *mlc_keep(mlc_tensor *x) {
    mlc_tensor *t;
    if (!x || x->ctx->error || !mlc__usable(x, "mlc_keep")) return NULL;
    x->ctx->op_device = x->on_device;
    x->ctx->op_dtype = x->dtype;
    t = mlc__make(x->ctx, "mlc_keep", x->ndim, x->shape, 1);
    if (!t) return NULL;
    mlc__host_sync(x);
    memcpy(mlc__storage(t), mlc__storage(x), mlc__bytes_of(x, 0));
    t->qscale = x->qscale; t->qzero = x->qzero;
    if (x->qscales && (!(t->qscales = x->qscales->persistent ? x->qscales : mlc_keep(x->qscales))
                       || !mlc__int8_keep_sums(t))) {
        mlc_tensor_free(t);
        return NULL;
    }
    if (x->requires_grad && !mlc_requires_grad(t, 1)) { mlc_tensor_free(t); return NULL; }
    return t;
}

/* A freed tensor's struct is kept as a record (freed = 1, no values) among the context's last
   MLC_FREED_KEPT frees, so a second free or a use reads live memory and is refused. */
MLCDEF void mlc_tensor_free(mlc_tensor *t) {
    mlc_ctx *ctx;
    if (!t) return;
    ctx = t->ctx;
    if (t->freed) {
        mlc__fail(ctx, MLC_ERR_STATE, "mlc_tensor_free: tensor %T was freed already", t);
        return;
    }
    if (!t->persistent) {
        mlc__fail(ctx, MLC_ERR_STATE,
                  "mlc_tensor_free: tensor %T lives in a frame; mlc_frame_end frees it", t);
        return;
    }
    if (t->owner) {
        mlc__fail(ctx, MLC_ERR_STATE, "mlc_tensor_free: tensor %T \"%s\" is held by %s, which frees it at "
                  "mlc_destroy", t, t->owner_name, t->owner);
        return;
    }
    if (t->on_device) mlc__device_release(t);
    if (t->grad) mlc__owned_free(ctx, t->grad);
    if (t->qsums) mlc__owned_free(ctx, t->qsums);
    mlc__drop_packed(t);
    if (!t->read_only) mlc__owned_free(ctx, mlc__storage(t));
    if (MLC_FREED_KEPT < 1) {                /* no records kept */
        mlc__owned_free(ctx, t);
        return;
    }
    t->freed = 1;
    t->data = t->grad = NULL;
    t->half = NULL;
    t->int8 = NULL;
    t->qsums = NULL;
    t->device_data = t->device_grad = NULL;
    t->on_device = 0; t->requires_grad = 0; t->node = NULL;
    if (ctx->freed[ctx->freed_next]) mlc__owned_free(ctx, ctx->freed[ctx->freed_next]);
    ctx->freed[ctx->freed_next] = t;
    ctx->freed_next = ctx->freed_next + 1 < MLC_FREED_KEPT ? ctx->freed_next + 1 : 0;
}

MLCDEF mlc_tensor *mlc_requires_grad(mlc_tensor *t, int on) {
    if (!mlc__usable(t, "mlc_requires_grad") || (on && !mlc__writable(t, "mlc_requires_grad"))) return NULL;
    if (on && t->dtype == MLC_I8)
        return (mlc_tensor *)mlc__fail(t->ctx, MLC_ERR_ARG, "mlc_requires_grad: tensor %T is int8: no "
                                       "gradient flows into a quantized tensor", t);
    if (on && t->node == NULL && !mlc__alloc_grad(t, "mlc_requires_grad")) return NULL;
    t->requires_grad = on || t->node;
    return t;
}

MLCDEF float mlc_item(mlc_tensor *t) {
    if (!mlc__usable(t, "mlc_item")) return NAN;
    if (t->size != 1) {
        mlc__fail(t->ctx, MLC_ERR_SHAPE, "mlc_item: tensor %T has %zu elements, not 1", t, t->size);
        return NAN;
    }
    if (t->dtype == MLC_I8 && t->qscales) mlc__host_sync(t->qscales);
    return t->dtype != MLC_F32 ? (mlc__host_sync(t), mlc__value(t, 0)) : mlc__host(t)[0];
}

MLCDEF float mlc_get(mlc_tensor *t, size_t i) {
    if (!mlc__usable(t, "mlc_get")) return NAN;
    if (i >= t->size) {
        mlc__fail(t->ctx, MLC_ERR_INDEX, "mlc_get: index %zu is outside tensor %T (%zu elements)", i, t,
                  t->size);
        return NAN;
    }
    mlc__host_sync(t);
    if (t->dtype == MLC_I8 && t->qscales) mlc__host_sync(t->qscales);
    return t->dtype != MLC_F32 ? mlc__value(t, i) : t->data[i];
}

MLCDEF mlc_result mlc_read(mlc_tensor *t, float *dst, size_t count) {
    if (!mlc__usable(t, "mlc_read")) return t ? t->ctx->error : MLC_ERR_NULL;
    if (!dst || count != t->size) {
        mlc__fail(t->ctx, MLC_ERR_ARG, "mlc_read: %zu floats asked of tensor %T (%zu elements)", count, t,
                  t->size);
        return t->ctx->error;
    }
    mlc__host_sync(t);
    mlc__values_out(t, dst);
    return MLC_OK;
}

MLCDEF mlc_result mlc_write(mlc_tensor *t, const float *src, size_t count) {
    if (!mlc__usable(t, "mlc_write")) return t ? t->ctx->error : MLC_ERR_NULL;
    if (!src || count != t->size) {
        mlc__fail(t->ctx, MLC_ERR_ARG, "mlc_write: %zu floats given for tensor %T (%zu elements)", count, t,
                  t->size);
        return t->ctx->error;
    }
    if (!mlc__writable(t, "mlc_write")) return t->ctx->error;
    if (t->device_data) t->ctx->backend->wait(t->ctx, 0);   /* an upload may still read t->data */
    mlc__values_in(t, src);                             /* rounded (int8: quantized) */
    mlc__host_wrote(t);
    return MLC_OK;
}

MLCDEF int mlc_same_shape(const mlc_tensor *a, const mlc_tensor *b) {
    return a && b && a->ndim == b->ndim && memcmp(a->shape, b->shape, (size_t)a->ndim * sizeof(int)) == 0;
}

#ifndef MLC_NO_STDIO
MLCDEF void mlc_print(mlc_tensor *t, const char *label) {
    char shape[96];
    size_t i, n;
    if (!t) { printf("%s: NULL\n", label ? label : "tensor"); return; }
    if (!mlc__usable(t, "mlc_print")) {
        printf("%s: %s\n", label ? label : "tensor", mlc_error_message(t->ctx));
        return;
    }
    mlc__format(shape, sizeof shape, "%T", t);
    printf("%s %s = [", label ? label : "tensor", shape);
    n = t->size < 16 ? t->size : 16;
    mlc__host_sync(t);
    for (i = 0; i < n; i++) printf("%s%.5g", i ? ", " : "", (double)mlc__value(t, i));
    printf("%s]\n", t->size > n ? ", ..." : "");
}
#endif

/* ============================================================================================
   @section op-plumbing
   Op plumbing, the code: dispatch to the device or the CPU, input checks, the tape, gradient
   buffers, threads
   ============================================================================================ */

static void mlc__convert_shared(mlc_ctx *ctx, mlc_scalar_type dtype, int narrow, const void *src, void *dst,
                                size_t n);   /* (below, with the threads) */

/* A float32 stand-in for half tensor t in the frame's arena: its header, with data a widened
   copy of its values (and t's float32 gradient, shared); NULL when out of memory. */
static mlc_tensor *mlc__widened(mlc_tensor *t, int with_values) {
    mlc_tensor *w = (mlc_tensor *)mlc__arena_alloc(t->ctx, sizeof(mlc_tensor), "mlc_to_dtype");
    if (!w) return NULL;
    *w = *t;
    w->stands_for = t;
    w->dtype = MLC_F32;
    w->half = NULL;
    w->data = mlc__floats(t->ctx, t->size + 1, "mlc_to_dtype");
    if (!w->data) return NULL;
    if (with_values) mlc__convert_shared(t->ctx, t->dtype, 0, t->half, w->data, t->size);
    return w;
}

static int mlc__backward_reads(const mlc__node *n, int k);   /* (@section backward) */

/* Float32 stand-ins for the node's half tensors: w[k] for in[k] (in[k] itself when float32) and
   *w_out for out. Forward: the inputs with their values; backward: the tensors whose values
   its backward reads (mlc__backward_reads). 0 when out of memory. */
static int mlc__stand_ins(const mlc__node *n, mlc_tensor **w, mlc_tensor **w_out, int backward) {
    int k;
    for (k = 0; k < n->n_in; k++) {
        w[k] = n->in[k] && mlc__is_half(n->in[k]->dtype)
                 ? mlc__widened(n->in[k], !backward || mlc__backward_reads(n, k)) : n->in[k];
        if (n->in[k] && !w[k]) return 0;
    }
    *w_out = mlc__is_half(n->out->dtype) ? mlc__widened(n->out, backward && mlc__backward_reads(n, -1))
                                         : n->out;
    return *w_out != NULL;
}

/* The CPU forward of an op with bf16 or f16 tensors: on float32 stand-ins for them, the result
   rounded once into the output (counted in mlc_stats.widened). Batch norm updates its running
   statistics in place: those are rounded back too. An op the tape will not keep (inference)
   makes its stand-ins in a frame of their own, so they take no memory after it. */
static int mlc__cpu_widened(mlc__node *call) {
    mlc_ctx *ctx = call->out->ctx;
    const int recording = mlc__recording(call);
    mlc__node w = *call;
    mlc_frame scratch;
    int k, ok;
    ctx->stats.widened++;
    if (!recording) scratch = mlc_frame_begin(ctx);     /* nothing is kept: the stand-ins go at once */
    ok = mlc__stand_ins(call, w.in, &w.out, 0) && mlc__cpu_of[call->op](&w);
    if (ok && w.out != call->out)
        mlc__convert_shared(ctx, call->out->dtype, 1, w.out->data, call->out->half, call->out->size);
    for (k = 3; ok && call->op == MLC__OP_BATCH_NORM && k < 5; k++)
        if (w.in[k] != call->in[k])
            mlc__narrow(call->in[k]->dtype, w.in[k]->data, call->in[k]->half, w.in[k]->size);
    if (recording) call->saved = w.saved;               /* what the forward keeps for backward */
    else mlc_frame_end(scratch);
    return ok;
}

/* An int8 tensor reaches only the quantized ops: any other refuses it, naming the op */
static int mlc__not_int8(mlc_ctx *ctx, const char *op, const mlc_tensor *t) {
    if (!t || t->dtype != MLC_I8) return 1;
    mlc__fail(ctx, MLC_ERR_ARG, "%s: tensor %T is int8 (quantized): only the int8 ops take it; "
              "mlc_dequantize gives its float32 values", op, t);
    return 0;
}

/* Whether the node has a bf16 or f16 tensor */
static int mlc__has_half(const mlc__node *n) {
    int k;
    if (mlc__is_half(n->out->dtype)) return 1;
    for (k = 0; k < n->n_in; k++) if (n->in[k] && mlc__is_half(n->in[k]->dtype)) return 1;
    return 0;
}

static int mlc__bf16_kernel_usable(const mlc_ctx *ctx);   /* (@section matmul) */

/* Values an elementwise op with half tensors widens on the stack at a time (mlc__cpu_takes_half) */
#define MLC__HALF_BLOCK 256

/* Whether the node's CPU forward (backward 0) or backward (1) takes its half tensors as they
   are, without float32 stand-ins: the forward of a map, an add, sub, mul or div, a layer norm,
   or a softmax along the last axis (a block or a row at a time in float32, mlc__unary_map_half,
   mlc__binary_half_row, mlc__layer_norm_rows, mlc__softmax_rows: the stand-ins' values), a permute
   or an index_select (the values moved as they are; gradients are float32 in any case), a copy
   that converts to or from float32 (mlc__copy_cpu), or a product or convolution of bf16 tensors
   (bias bf16 or none) where mlc's bf16 kernel runs (a convolution off its fast path makes the
   stand-ins itself, mlc__conv2d_cpu). mlc__matmul_cpu then sums in float32 scratch and rounds
   into the output once, as the stand-ins would; only the order of the float32 sums differs (and
   subnormals, see mlc_gemm_bf16). Its backward rounds the output's gradient to bf16 for the
   products (a convolution's for dx; its dW sums float32 products of the widened values). */
static int mlc__cpu_takes_half(const mlc__node *n, int backward) {
    if (n->op == MLC__OP_COPY)           /* mlc_to_dtype: from or to float32, or a half copy */
        return n->in[0]->dtype == n->out->dtype || n->in[0]->dtype == MLC_F32 || n->out->dtype == MLC_F32;
    if (n->op == MLC__OP_PERMUTE) return n->in[0]->dtype == n->out->dtype;
    if (n->op == MLC__OP_INDEX_SELECT) return n->in[0]->dtype == n->out->dtype && n->in[1]->dtype == MLC_F32;
    if (n->op == MLC__OP_LAYER_NORM || n->op == MLC__OP_UNARY || n->op == MLC__OP_BINARY) return !backward;
    if (n->op == MLC__OP_SOFTMAX) return !backward && n->args.softmax.inner == 1;
    return (n->op == MLC__OP_MATMUL || n->op == MLC__OP_CONV2D) && n->in[0]->dtype == MLC_BF16
           && n->in[1]->dtype == MLC_BF16 && (!n->in[2] || n->in[2]->dtype == MLC_BF16)
           && n->out->dtype == MLC_BF16 && mlc__bf16_kernel_usable(n->out->ctx);
}

/* Describe `out = op(inputs)`: the node the backend runs (mlc__dispatch) and the tape keeps. */
static void mlc__call(mlc__node *call, mlc__op op, const char *name, mlc_tensor *out,
                      mlc_tensor *a, mlc_tensor *b, mlc_tensor *c, mlc_tensor *d) {
    int i;
    memset(call, 0, sizeof *call);
    call->op = op;
    call->name = name;
    call->out = out;
    call->in[0] = a; call->in[1] = b; call->in[2] = c; call->in[3] = d;
    for (i = 0; i < 4; i++) if (call->in[i]) call->n_in = i + 1;
}

/* Half tensors on a device: the backend converts between dtypes (a COPY node whose input and
   output dtypes differ) and runs every other kernel in float32, on float32 stand-ins made on the
   device, as mlc__cpu_widened does on the host. A backend that does not convert declines the
   COPY, and the op falls back to the CPU (counted). mlc__device_convert runs one conversion:
   1 done, 0 declined, -1 failed (the error is set). */
static int mlc__device_convert(mlc_tensor *from, mlc_tensor *to) {
    mlc_ctx *ctx = from->ctx;
    mlc__node copy;
    mlc__call(&copy, MLC__OP_COPY, "mlc_to_dtype", to, from, NULL, NULL, NULL);
    if (!ctx->backend->kernels[MLC__OP_COPY] || !ctx->backend->run(ctx, &copy, 0)) return ctx->error ? -1 : 0;
    if (ctx->error) return -1;
    to->stale = (to->stale & ~(unsigned)MLC__DEVICE_STALE) | MLC__HOST_STALE;
    return 1;
}

/* A float32 device stand-in for half tensor t: its header (in the frame's arena) with a float32
   scratch buffer of its own, holding t's values when with_values, and t's gradient buffers and
   books, shared. 1, 0, -1 as mlc__device_convert. */
static int mlc__device_widened_tensor(mlc_tensor *t, int with_values, mlc_tensor **w) {
    mlc_ctx *ctx = t->ctx;
    *w = (mlc_tensor *)mlc__arena_alloc(ctx, sizeof(mlc_tensor), "mlc_to_dtype");
    if (!*w) return -1;
    **w = *t;
    (*w)->dtype = MLC_F32;
    (*w)->half = NULL;
    (*w)->data = NULL;                                   /* never read on the host: a decline goes back */
    (*w)->stale = (t->stale & ~(unsigned)MLC__DEVICE_STALE) | MLC__HOST_STALE;
    if (!((*w)->device_data = mlc__device_alloc(ctx, NULL, t->size * sizeof(float), "mlc_to_dtype")))
        return -1;
    return with_values ? mlc__device_convert(t, *w) : 1;
}

/* Device stand-ins for node n's half tensors, as mlc__stand_ins, in node w (a copy of n);
   concat's inputs, which its saved list holds, get a list of their own (in[0], one of them,
   shares its stand-in: one cast each). */
static int mlc__device_stand_ins(const mlc__node *n, mlc__node *w, int out_values) {
    mlc_tensor **list = (mlc_tensor **)n->saved, **wide = NULL;
    const int count = n->op == MLC__OP_CONCAT ? n->args.concat.count : 0;
    int k, j, made = 1;
    if (count) {
        wide = (mlc_tensor **)mlc__arena_alloc(n->out->ctx, (size_t)count * sizeof *wide, "mlc_concat");
        if (!wide) return -1;
        for (k = 0; k < count && made > 0; k++)
            if (!mlc__is_half(list[k]->dtype)) wide[k] = list[k];
            else made = mlc__device_widened_tensor(list[k], 1, &wide[k]);
        w->saved = wide;
    }
    for (k = 0; k < n->n_in && made > 0; k++) {
        for (j = 0; j < count && list[j] != n->in[k]; j++) {}
        if (j < count) w->in[k] = wide[j];
        else if (!n->in[k] || !mlc__is_half(n->in[k]->dtype)) w->in[k] = n->in[k];
        else made = mlc__device_widened_tensor(n->in[k], 1, &w->in[k]);
    }
    if (made > 0 && mlc__is_half(n->out->dtype))
        made = mlc__device_widened_tensor(n->out, out_values, &w->out);
    return made;
}

/* The gradient buffers and books a stand-in's backward made or changed go back to the tensor */
static void mlc__take_grad(mlc_tensor *t, const mlc_tensor *w) {
    const unsigned grad_bits = MLC__GRAD_HOST_STALE | MLC__GRAD_DEVICE_STALE | MLC__GRAD_ZERO;
    if (w == t) return;
    t->grad = w->grad;
    t->device_grad = w->device_grad;
    t->stale = (t->stale & ~grad_bits) | (w->stale & grad_bits);
}

/* The device forward of an op with half tensors: stand-ins, the float32 kernel, the result
   rounded into the output (and batch norm's running statistics back into theirs). An op the
   tape will not keep makes its stand-ins in a frame of their own. 1, 0, -1 as above. */
static int mlc__device_widened(mlc_ctx *ctx, mlc__node *call) {
    const int recording = mlc__recording(call);
    mlc__node w = *call;
    mlc_frame scratch;
    int k, ran;
    if (!recording) scratch = mlc_frame_begin(ctx);
    ran = mlc__device_stand_ins(call, &w, 0);
    if (ran > 0) ran = ctx->backend->run(ctx, &w, 0) ? 1 : ctx->error ? -1 : 0;
    if (ran > 0 && !ctx->error && w.out != call->out) ran = mlc__device_convert(w.out, call->out);
    for (k = 3; ran > 0 && call->op == MLC__OP_BATCH_NORM && k < 5; k++)
        if (w.in[k] != call->in[k]) ran = mlc__device_convert(w.in[k], call->in[k]);
    if (!recording) mlc_frame_end(scratch);
    else if (call->op != MLC__OP_CONCAT) call->saved = w.saved;   /* (concat's: its inputs, kept) */
    if (ran > 0) ctx->stats.widened++;
    return ctx->error ? -1 : ran;
}

/* Node n's backward on the device (its forward ran there). 1: done; 0: the backend declined;
   the error may be set. Copies and reshapes take half tensors as they are (gradients are
   float32 in every dtype). */
static int mlc__device_backward(mlc_ctx *ctx, mlc__node *n) {
    mlc__node w = *n;
    int k, ran;
    if (!mlc__has_half(n) || n->op == MLC__OP_COPY || n->op == MLC__OP_RESHAPE)
        return ctx->backend->run(ctx, n, 1);
    ran = mlc__device_stand_ins(n, &w, 1);
    if (ran > 0 && ctx->backend->run(ctx, &w, 1)) {
        for (k = 0; k < n->n_in; k++) if (n->in[k]) mlc__take_grad(n->in[k], w.in[k]);
        for (k = 0; n->op == MLC__OP_CONCAT && k < n->args.concat.count; k++)
            mlc__take_grad(((mlc_tensor **)n->saved)[k], ((mlc_tensor **)w.saved)[k]);
        mlc__take_grad(n->out, w.out);
        ctx->stats.widened++;
        return 1;
    }
    return 0;
}

/* Run the op described by `call` (output allocated, inputs and arguments filled in) on the
   device when it lives there. 1: done; 0: run the CPU code, inputs are current on the host;
   -1: the device failed (the error is set). */
static int mlc__dispatch(mlc_ctx *ctx, mlc__node *call) {
    int k;
    mlc_tensor *out = call->out;
    if (out->on_device) {
        int ran = !ctx->backend->kernels[call->op] ? 0
                  : mlc__has_half(call) && call->op != MLC__OP_COPY ? mlc__device_widened(ctx, call)
                  : ctx->backend->run(ctx, call, 0) ? 1 : 0;
        if (ran > 0 && !ctx->error) {
            call->device = 1;
            out->stale = MLC__HOST_STALE;
            return 1;
        }
        if (ctx->error) return -1;
        mlc__fall_back(ctx, call->name);
    }
    for (k = 0; k < call->n_in; k++) if (call->in[k]) mlc__host_sync(call->in[k]);
    out->stale = out->on_device ? MLC__DEVICE_STALE : 0;
    return ctx->error ? -1 : 0;
}

/* Run the op described by `call`: on the device (mlc__dispatch), else its CPU forward from the
   op table (through float32 stand-ins where it has half tensors it does not take). 1: its
   output holds the result; 0: it failed, with the error set. The builder then records it
   (mlc__record). */
static int mlc__run(mlc_ctx *ctx, mlc__node *call) {
    int where, k;
    for (k = 0; k < call->n_in && call->op != MLC__OP_LINEAR_INT8; k++)   /* (optional inputs too) */
        if (!mlc__not_int8(ctx, call->name, call->in[k])) return 0;
    where = mlc__dispatch(ctx, call);
    if (where == 0 && !(mlc__has_half(call) && !mlc__cpu_takes_half(call, 0) ? mlc__cpu_widened(call)
                                                                          : mlc__cpu_of[call->op](call)))
        return 0;
    return where >= 0 && !ctx->error;
}

/* Autocast's casts, at the start of an op: a product's input to the autocast dtype (a long-lived
   tensor's copy kept and reused while its frame lives and no backward has run through it), and
   a float32 op's half input to float32. Off, or already so: t itself. */
static mlc_tensor *mlc__autocast_low(mlc_tensor *t) {
    mlc_ctx *ctx;
    mlc_tensor *copy;
    int i;
    if (!t || t->ctx->autocast == MLC_F32 || t->dtype == t->ctx->autocast || t->freed
        || mlc__ended(t->ctx, t))
        return t;                                        /* (a bad tensor goes on to the op's checks) */
    ctx = t->ctx;
    for (i = 0; t->persistent && i < ctx->n_autocast_copies; i++)
        if (ctx->autocast_copies[i].of == t) {
            copy = ctx->autocast_copies[i].copy;
            if (!mlc__ended(ctx, copy) && !copy->graph_used) return copy;
            break;
        }
    copy = mlc_to_dtype(t, ctx->autocast);
    if (!copy || !t->persistent) return copy;
    if (i == ctx->autocast_capacity) {                   /* a new entry, in a larger list */
        int capacity = 2 * ctx->autocast_capacity + 16;
        struct mlc__autocast_copy *list = (struct mlc__autocast_copy *)mlc__owned_alloc(
            ctx, (size_t)capacity * sizeof *list, "mlc_autocast");
        if (!list) return NULL;
        if (ctx->n_autocast_copies)
            memcpy(list, ctx->autocast_copies, (size_t)ctx->n_autocast_copies * sizeof *list);
        if (ctx->autocast_copies) mlc__owned_free(ctx, ctx->autocast_copies);
        ctx->autocast_copies = list;
        ctx->autocast_capacity = capacity;
    }
    ctx->autocast_copies[i].of = t;
    ctx->autocast_copies[i].copy = copy;
    if (i == ctx->n_autocast_copies) ctx->n_autocast_copies++;
    return copy;
}
static mlc_tensor *mlc__autocast_f32(mlc_tensor *t) {
    if (!t || t->ctx->autocast == MLC_F32 || t->dtype == MLC_F32 || t->freed || mlc__ended(t->ctx, t))
        return t;
    return mlc_to_dtype(t, MLC_F32);
}

/* The dtype of an op's result (PyTorch's promotion among float dtypes): the inputs' when they
   all have one, else float32 (bf16 with f16, or either with float32). */
static mlc_scalar_type mlc__promote(int count, mlc_tensor *const *inputs) {
    int i;
    for (i = 1; i < count; i++) if (inputs[i]->dtype != inputs[0]->dtype) return MLC_F32;
    return inputs[0]->dtype;
}

/* The context of an op's inputs, or NULL when the op must not run: an input is NULL, the
   inputs come from different contexts, or the context already holds an error, or one is int8
   and the op is not one of the quantized ops (int8_ok). Sets the op's device and result dtype
   (ctx->op_device, ctx->op_dtype). */
static mlc_ctx *mlc__enter_as(const char *op, int count, mlc_tensor *const *inputs, int int8_ok) {
    mlc_ctx *ctx = NULL;
    int i;
    for (i = 0; i < count; i++) if (inputs[i]) { ctx = inputs[i]->ctx; break; }
    if (!ctx || ctx->error) return NULL;
    for (i = 0; i < count; i++) {
        if (!inputs[i]) return (mlc_ctx *)mlc__fail(ctx, MLC_ERR_NULL, "%s: input %d is NULL", op, i);
        if (inputs[i]->ctx != ctx)
            return (mlc_ctx *)mlc__fail(ctx, MLC_ERR_ARG, "%s: input %d belongs to another context", op, i);
        if (mlc__ended(ctx, inputs[i]))
            return (mlc_ctx *)mlc__fail(ctx, MLC_ERR_STATE, "%s: input %d was made in a frame that has ended "
                                        "(mlc_frame_end freed it)", op, i);
        if (inputs[i]->freed)
            return (mlc_ctx *)mlc__fail(ctx, MLC_ERR_STATE, "%s: input %d was freed (mlc_tensor_free)", op,
                                        i);
        if (!int8_ok && !mlc__not_int8(ctx, op, inputs[i])) return NULL;
        if (inputs[i]->on_device != inputs[0]->on_device)
            return (mlc_ctx *)mlc__fail(ctx, MLC_ERR_DEVICE,
                                        "%s: input 0 is on %s and input %d on %s; move one with mlc_to", op,
                                        inputs[0]->on_device ? mlc_device_name(ctx) : "cpu", i,
                                        inputs[i]->on_device ? mlc_device_name(ctx) : "cpu");
    }
    ctx->op_device = inputs[0]->on_device;
    ctx->op_dtype = mlc__promote(count, inputs);
    return ctx;
}
static mlc_ctx *mlc__enter(const char *op, int count, mlc_tensor *const *inputs) {
    return mlc__enter_as(op, count, inputs, 0);
}
#define MLC__ENTER(op, ...) \
    mlc_tensor *const mlc__in_[] = { __VA_ARGS__ }; \
    mlc_ctx *ctx = mlc__enter(op, (int)(sizeof mlc__in_ / sizeof mlc__in_[0]), mlc__in_); \
    if (!ctx) return NULL

/* Whether the op will go on the tape: gradients are on and an input needs one (else an op
   need not keep what only its backward reads, such as max pooling's argmax). */
static int mlc__recording(const mlc__node *call) {
    int i;
    if (!call->out->ctx->grad_enabled || call->out->ctx->error) return 0;
    for (i = 0; i < call->n_in; i++) if (call->in[i] && call->in[i]->requires_grad) return 1;
    return 0;
}

/* Record the op on the tape when gradients are on and an input needs one. */
static void mlc__record(const mlc__node *call) {
    mlc_ctx *ctx = call->out->ctx;
    mlc__node *n;
    if (!mlc__recording(call)) return;
    n = (mlc__node *)mlc__arena_alloc(ctx, sizeof(mlc__node), call->name);
    if (!n) return;
    *n = *call;
    n->prev = ctx->tape;
    n->index = ctx->tape ? ctx->tape->index + 1 : 0;
    ctx->tape = n;
    call->out->node = n;
    call->out->requires_grad = 1;
}

/* An op's sizes (a struct on the caller's stack) for its kernels: the call points at them, and
   when the op will be recorded, at a copy in the arena that the tape keeps; inference keeps
   none. 0: out of memory. */
static int mlc__save(mlc__node *call, const void *sizes, size_t bytes) {
    call->saved = (void *)(uintptr_t)sizes;
    if (!mlc__recording(call)) return 1;
    if (!(call->saved = mlc__arena_alloc(call->out->ctx, bytes, call->name))) return 0;
    memcpy(call->saved, sizes, bytes);
    return 1;
}

/* A host buffer for t's gradient where it has none anywhere yet: it counts as zeros
   (MLC__GRAD_ZERO), written only by a reader (mlc__grad) or overwritten by the first op that
   writes it (mlc__grad_to_overwrite). 0 when out of memory. */
static int mlc__grad_fresh(mlc_tensor *t) {
    if (t->grad || t->device_grad) return 1;
    if (!(t->grad = mlc__floats(t->ctx, t->size, "mlc_backward"))) return 0;
    t->stale |= MLC__GRAD_ZERO;
    return 1;
}

/* The gradient buffer of an input that needs one (zeros on first use), else NULL. */
static float *mlc__grad(mlc_tensor *t) {
    if (!t || !t->requires_grad || !mlc__grad_fresh(t)) return NULL;
    return mlc__host_grad(t);
}

MLCDEF mlc_result mlc_write_grad(mlc_tensor *t, const float *src, size_t count) {
    float *grad;
    if (!mlc__usable(t, "mlc_write_grad")) return t ? t->ctx->error : MLC_ERR_NULL;
    if (!src || count != t->size || !t->requires_grad) {
        mlc__fail(t->ctx, MLC_ERR_ARG,
                  "mlc_write_grad: %zu floats given for tensor %T (%zu elements; it must require a gradient)",
                  count, t, t->size);
        return t->ctx->error;
    }
    if (!(grad = mlc__grad(t))) return t->ctx->error;    /* (made, or brought up to date) */
    if (grad != src) memmove(grad, src, count * sizeof(float));
    mlc__host_wrote_grad(t);
    return MLC_OK;
}

/* Whether t's gradient exists (made when missing): one that counts as zeros stays so, for the
   op's backward to read (mlc__grad) or overwrite (mlc__grad_to_overwrite) */
static int mlc__grad_made(mlc_tensor *t) {
    return mlc__grad_fresh(t) && ((t->grad && (t->stale & MLC__GRAD_ZERO)) || mlc__grad(t) != NULL);
}

/* t's gradient for a backward that adds into it with *beta: 0 when the gradient counts as zeros
   (a fresh one, or after mlc_zero_grad): the backward writes over all of it, and no zeros are
   written first; else 1 */
static float *mlc__grad_to_overwrite(mlc_tensor *t, float *beta) {
    *beta = 1.0f;
    if (!t || !t->requires_grad || !mlc__grad_fresh(t) || !t->grad || !(t->stale & MLC__GRAD_ZERO))
        return mlc__grad(t);
    t->stale &= ~(unsigned)MLC__GRAD_ZERO;
    *beta = 0.0f;
    return t->grad;
}

static int mlc__axis(mlc_ctx *ctx, const char *op, const mlc_tensor *x, int *axis) {
    int a = *axis < 0 ? *axis + x->ndim : *axis;
    if (a < 0 || a >= x->ndim) {
        mlc__fail(ctx, MLC_ERR_INDEX, "%s: axis %d is out of range for %T", op, *axis, x);
        return 0;
    }
    *axis = a;
    return 1;
}

/* View x as [outer, n, inner] around axis. */
static void mlc__split(const mlc_tensor *x, int axis, size_t *outer, int *n, size_t *inner) {
    *outer = mlc__numel(axis, x->shape);
    *n = x->shape[axis];
    *inner = mlc__numel(x->ndim - axis - 1, x->shape + axis + 1);
}

/* An optional input t (NULL: none) of op, checked as mlc__enter checks the others: from ctx
   (before any shape, so the error names the cause), not ended or freed, on x's device. */
static int mlc__same_device(mlc_ctx *ctx, const char *op, const mlc_tensor *x, const mlc_tensor *t) {
    if (!t) return 1;
    if (t->ctx != ctx)
        return mlc__fail(ctx, MLC_ERR_ARG, "%s: tensor %T belongs to another context", op, t) != NULL;
    if (mlc__ended(ctx, t) || t->freed)
        return mlc__fail(ctx, MLC_ERR_STATE, "%s: tensor %T was %s", op, t,
                         t->freed ? "freed (mlc_tensor_free)"
                                  : "made in a frame that has ended (mlc_frame_end freed it)") != NULL;
    if (t->on_device == x->on_device) return 1;
    mlc__fail(ctx, MLC_ERR_DEVICE, "%s: %T and %T live on different devices; move one with mlc_to", op, x, t);
    return 0;
}

/* The checks every tensor argument gets, optional ones included, in a public function that
   hands its tensors on to others (so the message names the function called): of ctx, not
   freed, not from an ended frame. count tensors follow; NULL ones are skipped. */
static int mlc__args_ok(mlc_ctx *ctx, const char *op, int count, ...) {
    va_list ap;
    int i, ok = 1;
    va_start(ap, count);
    for (i = 0; i < count && ok; i++) {
        mlc_tensor *t = va_arg(ap, mlc_tensor *);
        ok = !t || mlc__same_device(ctx, op, t, t);
    }
    va_end(ap);
    return ok;
}
#define MLC__COUNT_ARGS(...) MLC__COUNT_ARGS_(__VA_ARGS__, 4, 3, 2, 1, 0)
#define MLC__COUNT_ARGS_(a, b, c, d, n, ...) n
#define MLC__ARGS_OK(ctx, op, ...) mlc__args_ok(ctx, op, MLC__COUNT_ARGS(__VA_ARGS__), __VA_ARGS__)

/* Read an index stored as a float: whole and in [0, limit), else an error naming the op. */
static int mlc__index(mlc_ctx *ctx, const char *op, float v, int limit, size_t where) {
    if (!mlc__is_finite(v) || !(v >= 0.0f && v < (float)limit) || v != (float)(int)v) {
        mlc__fail(ctx, MLC_ERR_INDEX, "%s: index %g at position %zu is not a whole number in [0, %d)", op,
                  (double)v, where, limit);
        return -1;
    }
    return (int)v;
}

/* ============================================================================================
   @section threads  Threads
   Ops share their work out through mlc__parallel: fn(arg, slot, begin, end) on even pieces
   of [0, n), MLC__PIECES_PER_THREAD for each of the `slots` threads it uses (slot: the number
   of the thread running the piece, 0 to slots - 1, for per-thread scratch), or once on all of
   [0, n) when n < parallel_from or there is one thread (work below a size runs on the caller:
   handing it out costs more than it saves). Which piece ran on which thread changes no result:
   the pieces are the same on every run.
   The threads are the caller and a pool of workers the context starts on first use (POSIX
   threads, or Win32's on Windows: the same pool over mlc__lock, mlc__cond_wait and
   mlc__thread_start below). Each thread of a job owns an even run of its pieces, the same run in every job of
   that size, so the part of a weight, a gradient or an optimiser state that one thread wrote
   in one op is what it reads in the next, from its own core's cache. A thread claims its own
   pieces from the front of its run, then takes the others' from the back of theirs, each
   claim one atomic swap: a thread that runs slower (another process on its core, a VM's vCPU
   taken away) ends up with fewer pieces instead of holding the others up, and a worker the
   system has not run yet leaves its pieces to the caller; only a piece already begun is
   waited for.
   Between jobs the workers spin a moment (ops follow each other within microseconds), then
   sleep until the next. A piece's own products and maps stay on its thread.
   When the caller had to do nearly all of a job and then still sleep until a worker's piece
   was done, that worker's core is busy with something else (the system took it away in the
   middle of a piece): sharing costs more than it gives, so the next MLC__ALONE_JOBS jobs run on
   the caller alone, and then the workers are tried again.
   Without threads (MLC_NO_THREADS, or no POSIX or Win32 threads) the pieces run in turn, or under OpenMP
   where that is what the build has.
   ============================================================================================ */
enum { MLC__MAX_THREADS = 64, MLC__PIECES_PER_THREAD = 4, MLC__SPINS = 20000, MLC__ALONE_JOBS = 1000 };

typedef void (*mlc__range_fn)(void *arg, int slot, size_t begin, size_t end);

/* Where piece p of `pieces` even pieces of [0, n) begins (piece p + 1's begin is its end) */
static size_t mlc__piece_begin(size_t n, int p, int pieces) { return n * (size_t)p / (size_t)pieces; }

#if MLC__THREADS
/* A job is announced as its number (mod 4096) and piece count, job << 20 | pieces << 10, and
   each thread's run of unclaimed pieces [next, end) as job << 20 | end << 10 | next (pieces <=
   MLC__MAX_THREADS * MLC__PIECES_PER_THREAD < 1024): 32 bits, which every CPU with threads can
   swap atomically (a 64-bit one on i386 sits at a 4-byte offset in the struct, and qemu-i386
   hangs on it). A claim swaps one exact value for the next (next + 1 by the owner, end - 1 by
   another thread), so a value seen again 4096 jobs later can only be claimed as a piece of the
   job that holds it. */
typedef struct mlc__workers mlc__workers;
typedef struct mlc__worker { mlc__workers *pool; int slot; } mlc__worker;   /* slot: 1 on */
static void mlc__worker_main(mlc__worker *w);

/* The few thread calls the pool makes, on POSIX threads or Win32's (a slim reader/writer lock
   taken exclusively is a mutex; its condition variables are POSIX's; _init: 1 when done) */
#ifdef MLC__WIN32_THREADS
typedef SRWLOCK mlc__mutex;
typedef CONDITION_VARIABLE mlc__cond;
typedef HANDLE mlc__thread;
static int mlc__mutex_init(mlc__mutex *m) { InitializeSRWLock(m); return 1; }
static void mlc__mutex_destroy(mlc__mutex *m) { (void)m; }
static void mlc__lock(mlc__mutex *m) { AcquireSRWLockExclusive(m); }
static void mlc__unlock(mlc__mutex *m) { ReleaseSRWLockExclusive(m); }
static int mlc__cond_init(mlc__cond *c) { InitializeConditionVariable(c); return 1; }
static void mlc__cond_destroy(mlc__cond *c) { (void)c; }
static void mlc__cond_wait(mlc__cond *c, mlc__mutex *m) { SleepConditionVariableSRW(c, m, INFINITE, 0); }
static void mlc__cond_signal(mlc__cond *c) { WakeConditionVariable(c); }
static void mlc__cond_broadcast(mlc__cond *c) { WakeAllConditionVariable(c); }
static DWORD WINAPI mlc__thread_entry(LPVOID w) { mlc__worker_main((mlc__worker *)w); return 0; }
static int mlc__thread_start(mlc__thread *t, mlc__worker *w) {
    return (*t = CreateThread(NULL, 0, mlc__thread_entry, w, 0, NULL)) != NULL;
}
static void mlc__thread_join(mlc__thread t) { WaitForSingleObject(t, INFINITE); CloseHandle(t); }
#else
typedef pthread_mutex_t mlc__mutex;
typedef pthread_cond_t mlc__cond;
typedef pthread_t mlc__thread;
static int mlc__mutex_init(mlc__mutex *m) { return pthread_mutex_init(m, NULL) == 0; }
static void mlc__mutex_destroy(mlc__mutex *m) { pthread_mutex_destroy(m); }
static void mlc__lock(mlc__mutex *m) { pthread_mutex_lock(m); }
static void mlc__unlock(mlc__mutex *m) { pthread_mutex_unlock(m); }
static int mlc__cond_init(mlc__cond *c) { return pthread_cond_init(c, NULL) == 0; }
static void mlc__cond_destroy(mlc__cond *c) { pthread_cond_destroy(c); }
static void mlc__cond_wait(mlc__cond *c, mlc__mutex *m) { pthread_cond_wait(c, m); }
static void mlc__cond_signal(mlc__cond *c) { pthread_cond_signal(c); }
static void mlc__cond_broadcast(mlc__cond *c) { pthread_cond_broadcast(c); }
static void *mlc__thread_entry(void *w) { mlc__worker_main((mlc__worker *)w); return NULL; }
static int mlc__thread_start(mlc__thread *t, mlc__worker *w) {
    return pthread_create(t, NULL, mlc__thread_entry, w) == 0;
}
static void mlc__thread_join(mlc__thread t) { pthread_join(t, NULL); }
#endif

struct mlc__workers {
    mlc__mutex lock;
    mlc__cond wake, finished;           /* a job for sleeping workers; the caller's last piece */
    mlc__thread thread[MLC__MAX_THREADS - 1];
    mlc__worker worker[MLC__MAX_THREADS - 1];
    int started, sleeping, caller_waiting, quit; /* under lock */
    int busy;                           /* a job is running: what its pieces start stays on their thread */
    mlc__range_fn fn;                   /* the job: fn(arg, slot, begin, end) over pieces of [0, n) */
    void *arg;
    size_t n;
    int slots;                          /* the threads it may use: workers of a higher slot stay out
                                           (a claim that saw a value from the next job fails anyway) */
    unsigned job;                       /* job << 20 | pieces << 10 */
    unsigned run[MLC__MAX_THREADS];     /* per slot: job << 20 | end << 10 | next, its unclaimed pieces */
    int done;                           /* pieces finished */
    int caller_ran;                     /* pieces the caller ran */
    int alone;                          /* jobs still to run on the caller alone (only it writes it) */
};

static void mlc__pause(void) {
#if MLC__X86
    _mm_pause();
#endif
}

/* Run piece p of the current job on the thread of this slot (0: the caller, which does not
   signal itself); the job stays as it is until its last piece is done. */
static void mlc__run_piece(mlc__workers *pool, int slot, int p, int pieces) {
    size_t n = pool->n;
    if (!slot) pool->caller_ran++;
    pool->fn(pool->arg, slot, mlc__piece_begin(n, p, pieces), mlc__piece_begin(n, p + 1, pieces));
    if (__atomic_add_fetch(&pool->done, 1, __ATOMIC_ACQ_REL) == pieces && slot) {
        mlc__lock(&pool->lock);
        if (pool->caller_waiting) mlc__cond_signal(&pool->finished);
        mlc__unlock(&pool->lock);
    }
}

/* Claim and run pieces of the job until none is left: this slot's own run from its front, then
   the other threads' runs from their backs; returns the number of the job it saw. */
static unsigned mlc__claim_pieces(mlc__workers *pool, int slot) {
    const unsigned announced = __atomic_load_n(&pool->job, __ATOMIC_ACQUIRE), job = announced >> 20;
    const int pieces = (int)(announced >> 10 & 1023), slots = __atomic_load_n(&pool->slots, __ATOMIC_RELAXED);
    int i;                              /* (slots maybe of the next job: its runs hold another number) */
    for (i = 0; i < slots && slot < slots; i++) {
        unsigned *run = &pool->run[(slot + i) % slots], r = __atomic_load_n(run, __ATOMIC_ACQUIRE);
        while (r >> 20 == job && (r & 1023) < (r >> 10 & 1023)) {
            const int own = i == 0, p = own ? (int)(r & 1023) : (int)(r >> 10 & 1023) - 1;
            if (__atomic_compare_exchange_n(run, &r, own ? r + 1 : r - (1u << 10), 0, __ATOMIC_ACQ_REL,
                                            __ATOMIC_ACQUIRE)) {
                mlc__run_piece(pool, slot, p, pieces);
                r = __atomic_load_n(run, __ATOMIC_ACQUIRE);
            }
        }
    }
    return job;
}

static void mlc__worker_main(mlc__worker *w) {
    mlc__workers *pool = w->pool;
    const int slot = w->slot;
    unsigned seen = __atomic_load_n(&pool->job, __ATOMIC_ACQUIRE) >> 20;
    for (;;) {
        int spins = 0;
        while ((__atomic_load_n(&pool->job, __ATOMIC_ACQUIRE) >> 20) == seen && spins++ < MLC__SPINS)
            mlc__pause();
        if ((__atomic_load_n(&pool->job, __ATOMIC_ACQUIRE) >> 20) == seen) {
            int quit;
            mlc__lock(&pool->lock);
            pool->sleeping++;
            while ((__atomic_load_n(&pool->job, __ATOMIC_ACQUIRE) >> 20) == seen && !pool->quit)
                mlc__cond_wait(&pool->wake, &pool->lock);
            pool->sleeping--;
            quit = pool->quit;
            mlc__unlock(&pool->lock);
            if (quit) return;
        }
        seen = mlc__claim_pieces(pool, slot);
    }
}

/* Starts the pool's next worker (slot started + 1) on a thread that inherits the caller's
   binding; 0 when the system would not start one */
static int mlc__workers_start_next(mlc__workers *pool) {
    mlc__worker *w = &pool->worker[pool->started];
    w->pool = pool; w->slot = pool->started + 1;
    if (!mlc__thread_start(&pool->thread[pool->started], w)) return 0;
    pool->started++;
    return 1;
}

#ifdef _OPENMP
/* Where OpenMP binds its threads to places (OMP_PROC_BIND or OMP_PLACES set), it has bound the
   program's first thread to one place, and a thread inherits the binding of the one that
   starts it: workers started by the caller would all share its core, slower than one thread
   (bench/RESULTS.md). So OpenMP's thread k starts worker k, in turn, and each worker runs
   where OpenMP put that thread. */
static void mlc__workers_start_on_places(mlc__workers *pool, int workers) {
    int k;
    MLC__OMP(omp parallel for ordered schedule(static, 1) num_threads(workers + 1))
    for (k = 0; k <= workers; k++) {                  /* thread k runs k; the caller is 0 */
        MLC__OMP(omp ordered)
        if (k > 0 && k - 1 == pool->started) mlc__workers_start_next(pool);
    }
}
#endif

/* The context's pool with at least `workers` workers (as many as could start); 0 when none */
static int mlc__workers_start(mlc_ctx *ctx, int workers) {
    mlc__workers *pool = ctx->workers;
    if (!pool) {
        pool = (mlc__workers *)mlc__heap_alloc(ctx, sizeof *pool);
        if (!pool) return 0;
        memset(pool, 0, sizeof *pool);
        if (!mlc__mutex_init(&pool->lock)) { mlc__heap_free(ctx, pool); return 0; }
        if (!mlc__cond_init(&pool->wake)) {
            mlc__mutex_destroy(&pool->lock);
            mlc__heap_free(ctx, pool);
            return 0;
        }
        if (!mlc__cond_init(&pool->finished)) {
            mlc__cond_destroy(&pool->wake);
            mlc__mutex_destroy(&pool->lock);
            mlc__heap_free(ctx, pool);
            return 0;
        }
        ctx->workers = pool;
    }
#ifdef _OPENMP
    if (pool->started < workers && omp_get_proc_bind() != omp_proc_bind_false)
        mlc__workers_start_on_places(pool, workers);
#endif
    while (pool->started < workers && mlc__workers_start_next(pool)) {}
    return pool->started;
}

static void mlc__workers_stop(mlc_ctx *ctx) {
    mlc__workers *pool = ctx->workers;
    int i;
    if (!pool) return;
    mlc__lock(&pool->lock);
    pool->quit = 1;
    mlc__cond_broadcast(&pool->wake);
    mlc__unlock(&pool->lock);
    for (i = 0; i < pool->started; i++) mlc__thread_join(pool->thread[i]);
    mlc__cond_destroy(&pool->finished);
    mlc__cond_destroy(&pool->wake);
    mlc__mutex_destroy(&pool->lock);
    mlc__heap_free(ctx, pool);
    ctx->workers = NULL;
}

/* One job on the pool: publish it, wake sleeping workers, take pieces, wait for the rest. */
static void mlc__workers_run(mlc__workers *pool, size_t n, int slots, int pieces, mlc__range_fn fn,
                             void *arg) {
    unsigned job = ((__atomic_load_n(&pool->job, __ATOMIC_RELAXED) >> 20) + 1) & 4095;
    int spins = 0, s;
    pool->fn = fn; pool->arg = arg; pool->n = n; pool->caller_ran = 0;
    __atomic_store_n(&pool->slots, slots, __ATOMIC_RELAXED);   /* read before a claim, maybe of a job gone */
    __atomic_store_n(&pool->done, 0, __ATOMIC_RELAXED);
    __atomic_store_n(&pool->busy, 1, __ATOMIC_RELAXED);
    for (s = 0; s < slots; s++) {      /* slot s owns pieces [pieces s / slots, pieces (s + 1) / slots) */
        unsigned first = (unsigned)mlc__piece_begin((size_t)pieces, s, slots),
                 end = (unsigned)mlc__piece_begin((size_t)pieces, s + 1, slots);
        __atomic_store_n(&pool->run[s], job << 20 | end << 10 | first, __ATOMIC_RELAXED);
    }
    mlc__lock(&pool->lock);
    __atomic_store_n(&pool->job, job << 20 | (unsigned)pieces << 10, __ATOMIC_RELEASE);
    if (pool->sleeping) mlc__cond_broadcast(&pool->wake);
    mlc__unlock(&pool->lock);
    mlc__claim_pieces(pool, 0);
    while (__atomic_load_n(&pool->done, __ATOMIC_ACQUIRE) < pieces) {
        if (spins++ < MLC__SPINS) { mlc__pause(); continue; }
        mlc__lock(&pool->lock);             /* a worker was preempted inside its piece: sleep */
        pool->caller_waiting = 1;
        while (__atomic_load_n(&pool->done, __ATOMIC_ACQUIRE) < pieces)
            mlc__cond_wait(&pool->finished, &pool->lock);
        pool->caller_waiting = 0;
        mlc__unlock(&pool->lock);
        if (pool->caller_ran >= pieces - pieces / (2 * slots)) pool->alone = MLC__ALONE_JOBS;
    }
    __atomic_store_n(&pool->busy, 0, __ATOMIC_RELAXED);
}
#endif

#if MLC__THREADS && !defined(_OPENMP) && !defined(MLC_NO_STDIO)
/* The CPUs the calling thread may run on (Linux: what taskset, a cpuset or a binding allows;
   its Cpus_allowed_list, such as "0-3,8"), 0 where that is not known. Counting every online
   CPU instead can put two threads on one allowed CPU (under `taskset -c 0`), slower than one
   thread (bench/RESULTS.md). */
static long mlc__cpus_allowed(void) {
    long count = 0;
#ifdef MLC__WIN32_THREADS
    DWORD_PTR mine = 0, all = 0;        /* the process's affinity mask (its first 64 CPUs) */
    if (GetProcessAffinityMask(GetCurrentProcess(), &mine, &all))
        for (; mine; mine &= mine - 1) count++;
#elif defined(__linux__)
    char line[4096];
    FILE *f = fopen("/proc/thread-self/status", "r");
    if (!f) f = fopen("/proc/self/status", "r");
    if (!f) return 0;
    while (fgets(line, sizeof line, f))
        if (strncmp(line, "Cpus_allowed_list:", 18) == 0) {
            char *p = line + 18;
            for (;;) {
                long first = strtol(p, &p, 10), last = *p == '-' ? strtol(p + 1, &p, 10) : first;
                if (last >= first) count += last - first + 1;
                if (*p != ',') break;
                p++;
            }
            break;
        }
    fclose(f);
#endif
    return count;
}
#endif

MLCDEF void mlc_set_threads(mlc_ctx *ctx, int n) {
    if (!ctx) return;
    if (n < 0) { mlc__fail(ctx, MLC_ERR_ARG, "mlc_set_threads: %d threads is not valid", n); return; }
    ctx->threads = n;
#if MLC__THREADS && !defined(_OPENMP) && !defined(MLC_NO_STDIO)
    if (n == 0) {                       /* the default, read once (OpenMP's is read at each op) */
        const char *env = getenv("OMP_NUM_THREADS");
#ifdef MLC__WIN32_THREADS
        SYSTEM_INFO info;
        long cpus, allowed = mlc__cpus_allowed();
        GetSystemInfo(&info);           /* the CPUs of the process's group */
        cpus = (long)info.dwNumberOfProcessors;
#else
        long cpus = sysconf(_SC_NPROCESSORS_ONLN), allowed = mlc__cpus_allowed();
#endif
        if (allowed > 0 && (cpus <= 0 || allowed < cpus)) cpus = allowed;
        ctx->threads = env && atoi(env) > 0 ? atoi(env) : cpus > 0 ? (int)(cpus < 4096 ? cpus : 4096) : 1;
    }
#endif
}

/* The threads an op may use now: 1 inside a piece of a job */
static int mlc__threads(const mlc_ctx *ctx) {
    int n = ctx->threads;
#if MLC__THREADS
    if (ctx->workers && __atomic_load_n(&ctx->workers->busy, __ATOMIC_RELAXED)) return 1;
#endif
#ifdef _OPENMP
    if (n == 0) n = omp_get_max_threads();
#elif !MLC__THREADS
    n = 1;
#endif
    return n < 1 ? 1 : n > MLC__MAX_THREADS ? MLC__MAX_THREADS : n;
}

MLCDEF int mlc_threads(const mlc_ctx *ctx) { return ctx ? mlc__threads(ctx) : 0; }

/* The threads (slots of per-thread scratch) mlc__parallel uses for n units */
static int mlc__slots(const mlc_ctx *ctx, size_t n, size_t parallel_from) {
    int threads = n >= parallel_from ? mlc__threads(ctx) : 1;
    return n < (size_t)threads ? (int)(n ? n : 1) : threads;
}

/* The pieces mlc__parallel cuts n units into on `slots` threads */
static int mlc__pieces(size_t n, int slots) {
    int most = slots > 1 ? slots * MLC__PIECES_PER_THREAD : 1;
    return n < (size_t)most ? (int)(n ? n : 1) : most;
}

/* The op's scratch is sized for `slots` threads and a piece's share of n, so a job run alone
   still runs piece by piece (on slot 0). */
static void mlc__parallel(mlc_ctx *ctx, size_t n, size_t parallel_from, mlc__range_fn fn, void *arg) {
    int slots = mlc__slots(ctx, n, parallel_from), pieces = mlc__pieces(n, slots), p;
    if (slots == 1) { if (n) fn(arg, 0, 0, n); return; }
#if MLC__THREADS
    if (ctx->workers && ctx->workers->alone) {
        ctx->workers->alone--;
        ctx->stats.jobs_alone++;
        slots = 1;
    } else if (mlc__workers_start(ctx, slots - 1)) {
        ctx->stats.jobs_shared++;
        mlc__workers_run(ctx->workers, n, slots, pieces, fn, arg);
        return;
    }
#endif
    MLC__OMP(omp parallel for num_threads(slots) schedule(dynamic, 1))   /* no pool: OpenMP, or in turn */
    for (p = 0; p < pieces; p++)
        fn(arg, MLC__OMP_THREAD, mlc__piece_begin(n, p, pieces), mlc__piece_begin(n, p + 1, pieces));
}

/* mlc__narrow (narrow) or mlc__widen of n values of dtype, the threads sharing out blocks of 16
   from MLC__CONVERT_PARALLEL values */
#define MLC__CONVERT_PARALLEL 65536
typedef struct mlc__convert_job {
    mlc_scalar_type dtype;
    int narrow;
    const void *src;
    void *dst;
    size_t n;
} mlc__convert_job;
static void mlc__convert_blocks(void *arg, int slot, size_t begin, size_t end) {
    const mlc__convert_job *job = (const mlc__convert_job *)arg;
    const size_t at = 16 * begin, count = (16 * end < job->n ? 16 * end : job->n) - at;
    (void)slot;
    if (job->narrow) mlc__narrow(job->dtype, (const float *)job->src + at, (uint16_t *)job->dst + at, count);
    else mlc__widen(job->dtype, (const uint16_t *)job->src + at, (float *)job->dst + at, count);
}
static void mlc__convert_shared(mlc_ctx *ctx, mlc_scalar_type dtype, int narrow, const void *src, void *dst,
                                size_t n) {
    mlc__convert_job job;
    job.dtype = dtype; job.narrow = narrow; job.src = src; job.dst = dst; job.n = n;
    mlc__parallel(ctx, (n + 15) / 16, MLC__CONVERT_PARALLEL / 16, mlc__convert_blocks, &job);
}

/* for (i = from; i < to; i++) body, as blocks of 4 (or `lanes`, a constant) and then the rest:
   a loop of a count the compiler knows vectorises at plain -O2 (GCC 12 vectorises no loop of
   unknown count there), with or without -fopenmp; i is any integer type, to >= from. Clang is
   told not to unroll the block's loop: unrolled, it vectorised the outer loop across blocks,
   with gathers (mlc_relu at a ninth of the speed). */
#if defined(__clang__)
#define MLC__LANES_PRAGMA _Pragma("clang loop unroll(disable)")
#else
#define MLC__LANES_PRAGMA
#endif
#define MLC__VECTOR_LOOP_OF(lanes, i, from, to, ...) do { \
        i = (from); \
        while ((to) - i >= (lanes)) { \
            int mlc__lane_; \
            MLC__LANES_PRAGMA \
            for (mlc__lane_ = 0; mlc__lane_ < (int)(lanes); mlc__lane_++, i++) __VA_ARGS__ \
        } \
        for (; i < (to); i++) __VA_ARGS__ \
    } while (0)
#define MLC__VECTOR_LOOP(i, from, to, ...) MLC__VECTOR_LOOP_OF(4, i, from, to, __VA_ARGS__)

/* c += v b over n floats (a row of a product, a bias): c and b apart, so it vectorises */
static void mlc__axpy(size_t n, float v, const float *MLC__RESTRICT b, float *MLC__RESTRICT c) {
    size_t j;
    MLC__VECTOR_LOOP(j, 0, n, { c[j] += v * b[j]; });
}

/* relu fused into an op (conv2d, linear's product), in place: v = relu(v) over n floats, the
   bits of mlc_relu's map (its MLC__UNARY_KINDS line; mlc__unary_map's operands may not
   overlap) */
static void mlc__relu_row(size_t n, float *v) {
    size_t j;
    MLC__VECTOR_LOOP(j, 0, n, { const float x = v[j]; v[j] = x < 0 ? 0.0f : x; });
}
/* v = relu6(v) in place, the bits of mlc_relu6's map */
static void mlc__relu6_row(size_t n, float *v) {
    size_t j;
    MLC__VECTOR_LOOP(j, 0, n, { const float x = v[j]; v[j] = x < 0 ? 0.0f : x > 6 ? 6.0f : x; });
}

/* ============================================================================================
   @section binary  Elementwise ops with broadcasting
   Shapes align from the right; a dimension of 1 stretches. Each operand is walked by rows of
   the output's last dimension, with stride 0 along stretched dimensions.
     y = a + b   da = g          db = g
     y = a - b   da = g          db = -g
     y = a * b   da = g b        db = g a
     y = a / b   da = g / b      db = -g a / b^2
   Gradients of a stretched operand are summed over the dimensions it was stretched along.
   ============================================================================================ */

typedef struct mlc__bcast {
    int ndim, shape[MLC_MAX_DIMS];
    size_t stride[3][MLC_MAX_DIMS];     /* per operand; 0 where it is stretched */
    size_t last[3];                     /* per operand: the stride along the last dimension */
    size_t rows, inner;                 /* the output as [rows, inner] */
} mlc__bcast;

static int mlc__broadcast(mlc_ctx *ctx, const char *op, mlc__bcast *bc, int count, mlc_tensor *const *ts) {
    int d, k;
    memset(bc, 0, sizeof *bc);
    for (k = 0; k < count; k++) if (ts[k]->ndim > bc->ndim) bc->ndim = ts[k]->ndim;
    for (d = 0; d < bc->ndim; d++) {
        int size = 1;
        for (k = 0; k < count; k++) {
            int kd = d - (bc->ndim - ts[k]->ndim), s = kd >= 0 ? ts[k]->shape[kd] : 1;
            if (s != 1 && size != 1 && s != size) {
                if (count == 2)
                    mlc__fail(ctx, MLC_ERR_SHAPE, "%s: shapes %T and %T do not broadcast", op, ts[0], ts[1]);
                else
                    mlc__fail(ctx, MLC_ERR_SHAPE, "%s: shapes %T, %T and %T do not broadcast", op, ts[0],
                              ts[1], ts[2]);
                return 0;
            }
            if (s != 1) size = s;
        }
        bc->shape[d] = size;
    }
    for (k = 0; k < count; k++) {
        size_t s = 1;
        for (d = bc->ndim - 1; d >= 0; d--) {
            int kd = d - (bc->ndim - ts[k]->ndim), dim = kd >= 0 ? ts[k]->shape[kd] : 1;
            bc->stride[k][d] = dim == 1 ? 0 : s;
            s *= (size_t)dim;
        }
    }
    for (k = 0; k < count; k++) bc->last[k] = bc->ndim ? bc->stride[k][bc->ndim - 1] : 0;
    bc->inner = bc->ndim ? (size_t)bc->shape[bc->ndim - 1] : 1;
    bc->rows = bc->inner ? mlc__numel(bc->ndim, bc->shape) / bc->inner : 0;
    return 1;
}

/* Offset of operand k at the start of output row r. */
static size_t mlc__bcast_row(const mlc__bcast *bc, int k, size_t r) {
    size_t off = 0;
    int d;
    for (d = bc->ndim - 2; d >= 0; d--) {
        off += (r % (size_t)bc->shape[d]) * bc->stride[k][d];
        r /= (size_t)bc->shape[d];
    }
    return off;
}

enum { MLC__BINARY_ADD, MLC__BINARY_SUB, MLC__BINARY_MUL, MLC__BINARY_DIV };

/* Each operand's gradient row by row: its stride is 1, or 0 where it was stretched, and then
   the row's values sum into one element. */
static void mlc__binary_backward(mlc__node *n) {
    mlc_tensor *a = n->in[0], *b = n->in[1];
    float *ga = mlc__grad(a), *gb = mlc__grad(b);
    mlc__bcast bc;
    size_t r, j, sa, sb;
    int kind = n->args.binary.kind;
    mlc__broadcast(n->out->ctx, n->name, &bc, 2, n->in);
    sa = bc.last[0]; sb = bc.last[1];
    for (r = 0; r < bc.rows; r++) {
        size_t oa = mlc__bcast_row(&bc, 0, r), ob = mlc__bcast_row(&bc, 1, r);
        const float *g = n->out->grad + r * bc.inner, *pa = a->data + oa, *pb = b->data + ob;
        float *ra = ga ? ga + oa : NULL, *rb = gb ? gb + ob : NULL;
        switch (kind) {
        case MLC__BINARY_ADD:
            if (ra) for (j = 0; j < bc.inner; j++) ra[j * sa] += g[j];
            if (rb) for (j = 0; j < bc.inner; j++) rb[j * sb] += g[j];
            break;
        case MLC__BINARY_SUB:
            if (ra) for (j = 0; j < bc.inner; j++) ra[j * sa] += g[j];
            if (rb) for (j = 0; j < bc.inner; j++) rb[j * sb] -= g[j];
            break;
        case MLC__BINARY_MUL:
            if (ra) for (j = 0; j < bc.inner; j++) ra[j * sa] += g[j] * pb[j * sb];
            if (rb) for (j = 0; j < bc.inner; j++) rb[j * sb] += g[j] * pa[j * sa];
            break;
        default:
            if (ra) for (j = 0; j < bc.inner; j++) ra[j * sa] += g[j] / pb[j * sb];
            if (rb)
                for (j = 0; j < bc.inner; j++) rb[j * sb] -= g[j] * pa[j * sa] / (pb[j * sb] * pb[j * sb]);
        }
    }
}

/* o = a op b over count values, a's sa apart and b's sb apart (1, or 0 where stretched) */
static void mlc__binary_values(int kind, size_t count, const float *pa, size_t sa, const float *pb,
                               size_t sb, float *o) {
    size_t j;
    switch (kind) {
    case MLC__BINARY_ADD: for (j = 0; j < count; j++) o[j] = pa[j * sa] + pb[j * sb]; break;
    case MLC__BINARY_SUB: for (j = 0; j < count; j++) o[j] = pa[j * sa] - pb[j * sb]; break;
    case MLC__BINARY_MUL: for (j = 0; j < count; j++) o[j] = pa[j * sa] * pb[j * sb]; break;
    default:       for (j = 0; j < count; j++) o[j] = pa[j * sa] / pb[j * sb]; break;
    }
}

/* A half operand's values [at, at + count) of a row (`stride` apart, one where stretched)
   widened into buf; a float32 operand's own */
static const float *mlc__binary_operand(const mlc_tensor *t, size_t at, size_t stride, size_t count,
                                        float *buf) {
    if (!mlc__is_half(t->dtype)) return t->data + at;
    mlc__widen(t->dtype, t->half + at, buf, stride ? count : 1);
    return buf;
}

/* Output row r of an op with half tensors (mlc__cpu_takes_half, forward), a block at a time
   widened on the stack and rounded back: the stand-ins' values */
static void mlc__binary_half_row(const mlc__node *n, const mlc__bcast *bc, size_t r) {
    float xa[MLC__HALF_BLOCK], xb[MLC__HALF_BLOCK], y[MLC__HALF_BLOCK];
    const size_t oa = mlc__bcast_row(bc, 0, r), ob = mlc__bcast_row(bc, 1, r);
    const size_t sa = bc->last[0], sb = bc->last[1];
    const int half_out = mlc__is_half(n->out->dtype);
    size_t j, count;
    for (j = 0; j < bc->inner; j += count) {
        const float *pa, *pb;
        count = bc->inner - j < MLC__HALF_BLOCK ? bc->inner - j : MLC__HALF_BLOCK;
        pa = mlc__binary_operand(n->in[0], oa + j * sa, sa, count, xa);
        pb = mlc__binary_operand(n->in[1], ob + j * sb, sb, count, xb);
        mlc__binary_values(n->args.binary.kind, count, pa, sa, pb, sb,
                           half_out ? y : n->out->data + r * bc->inner + j);
        if (half_out) mlc__narrow(n->out->dtype, y, n->out->half + r * bc->inner + j, count);
    }
}

static int mlc__binary_cpu(mlc__node *n) {
    const mlc_tensor *a = n->in[0], *b = n->in[1];
    mlc__bcast bc;
    size_t r;
    const int half = mlc__has_half(n);
    mlc__broadcast(n->out->ctx, n->name, &bc, 2, n->in);
    for (r = 0; r < bc.rows; r++)
        if (half) mlc__binary_half_row(n, &bc, r);
        else mlc__binary_values(n->args.binary.kind, bc.inner, a->data + mlc__bcast_row(&bc, 0, r),
                                bc.last[0], b->data + mlc__bcast_row(&bc, 1, r), bc.last[1],
                                n->out->data + r * bc.inner);
    return 1;
}

static mlc_tensor *mlc__binary(const char *op, int kind, mlc_tensor *a, mlc_tensor *b) {
    mlc__bcast bc;
    mlc__node call;
    mlc_tensor *out;
    MLC__ENTER(op, a, b);
    if (!mlc__broadcast(ctx, op, &bc, 2, mlc__in_)) return NULL;
    out = mlc__make(ctx, op, bc.ndim, bc.shape, 0);
    if (!out) return NULL;
    mlc__call(&call, MLC__OP_BINARY, op, out, a, b, NULL, NULL);
    call.args.binary.kind = kind;
    if (!mlc__run(ctx, &call)) return NULL;
    mlc__record(&call);
    return out;
}

MLCDEF mlc_tensor *mlc_add(mlc_tensor *a, mlc_tensor *b) {
    return mlc__binary("mlc_add", MLC__BINARY_ADD, a, b);
}
MLCDEF mlc_tensor *mlc_sub(mlc_tensor *a, mlc_tensor *b) {
    return mlc__binary("mlc_sub", MLC__BINARY_SUB, a, b);
}
MLCDEF mlc_tensor *mlc_mul(mlc_tensor *a, mlc_tensor *b) {
    return mlc__binary("mlc_mul", MLC__BINARY_MUL, a, b);
}
MLCDEF mlc_tensor *mlc_div(mlc_tensor *a, mlc_tensor *b) {
    return mlc__binary("mlc_div", MLC__BINARY_DIV, a, b);
}

/* where: y = c ? a : b      da = c ? g : 0      db = c ? 0 : g      (c gets no gradient) */
static void mlc__where_backward(mlc__node *n) {
    float *ga = mlc__grad(n->in[1]), *gb = mlc__grad(n->in[2]);
    const float *g = n->out->grad, *c = n->in[0]->data;
    mlc__bcast bc;
    size_t r, j;
    mlc__broadcast(n->out->ctx, n->name, &bc, 3, n->in);
    for (r = 0; r < bc.rows; r++) {
        size_t oc = mlc__bcast_row(&bc, 0, r), oa = mlc__bcast_row(&bc, 1, r), ob = mlc__bcast_row(&bc, 2, r);
        size_t sc = bc.last[0], sa = bc.last[1], sb = bc.last[2];
        for (j = 0; j < bc.inner; j++) {
            if (c[oc + j * sc] != 0.0f) { if (ga) ga[oa + j * sa] += g[r * bc.inner + j]; }
            else if (gb) gb[ob + j * sb] += g[r * bc.inner + j];
        }
    }
}

static int mlc__where_cpu(mlc__node *n) {
    mlc__bcast bc;
    size_t r, j;
    mlc__broadcast(n->out->ctx, n->name, &bc, 3, n->in);
    for (r = 0; r < bc.rows; r++) {
        const float *pc = n->in[0]->data + mlc__bcast_row(&bc, 0, r),
                    *pa = n->in[1]->data + mlc__bcast_row(&bc, 1, r),
                    *pb = n->in[2]->data + mlc__bcast_row(&bc, 2, r);
        size_t sc = bc.last[0], sa = bc.last[1], sb = bc.last[2];
        for (j = 0; j < bc.inner; j++)
            n->out->data[r * bc.inner + j] = pc[j * sc] != 0.0f ? pa[j * sa] : pb[j * sb];
    }
    return 1;
}

MLCDEF mlc_tensor *mlc_where(mlc_tensor *cond, mlc_tensor *a, mlc_tensor *b) {
    mlc__bcast bc;
    mlc__node call;
    mlc_tensor *out;
    MLC__ENTER("mlc_where", cond, a, b);
    ctx->op_dtype = mlc__promote(2, mlc__in_ + 1);        /* (cond is a condition) */
    if (!mlc__broadcast(ctx, "mlc_where", &bc, 3, mlc__in_)) return NULL;
    out = mlc__make(ctx, "mlc_where", bc.ndim, bc.shape, 0);
    if (!out) return NULL;
    mlc__call(&call, MLC__OP_WHERE, "mlc_where", out, cond, a, b, NULL);
    if (!mlc__run(ctx, &call)) return NULL;
    mlc__record(&call);
    return out;
}

/* masked_fill: y = m ? v : x      dx = m ? 0 : g      (m broadcasts to x's shape) */
static void mlc__masked_fill_backward(mlc__node *n) {
    float *gx = mlc__grad(n->in[0]);
    const float *g = n->out->grad;
    mlc__bcast bc;
    size_t r, j;
    mlc__broadcast(n->out->ctx, n->name, &bc, 2, n->in);
    for (r = 0; r < bc.rows; r++) {
        const float *pm = n->in[1]->data + mlc__bcast_row(&bc, 1, r);
        size_t sm = bc.last[1];
        for (j = 0; j < bc.inner; j++) if (pm[j * sm] == 0.0f) gx[r * bc.inner + j] += g[r * bc.inner + j];
    }
}

static int mlc__masked_fill_cpu(mlc__node *n) {
    const float value = n->args.masked_fill.value, *x = n->in[0]->data;
    mlc__bcast bc;
    size_t r, j;
    mlc__broadcast(n->out->ctx, n->name, &bc, 2, n->in);
    for (r = 0; r < bc.rows; r++) {
        const float *pm = n->in[1]->data + mlc__bcast_row(&bc, 1, r);
        size_t sm = bc.last[1];
        for (j = 0; j < bc.inner; j++)
            n->out->data[r * bc.inner + j] = pm[j * sm] != 0.0f ? value : x[r * bc.inner + j];
    }
    return 1;
}

MLCDEF mlc_tensor *mlc_masked_fill(mlc_tensor *x, mlc_tensor *mask, float value) {
    mlc__bcast bc;
    mlc__node call;
    mlc_tensor *out;
    MLC__ENTER("mlc_masked_fill", x, mask);
    ctx->op_dtype = x->dtype;                            /* (the mask is a condition) */
    if (!mlc__broadcast(ctx, "mlc_masked_fill", &bc, 2, mlc__in_)) return NULL;
    if (bc.ndim != x->ndim || memcmp(bc.shape, x->shape, (size_t)x->ndim * sizeof(int)) != 0)
        return (mlc_tensor *)mlc__fail(ctx, MLC_ERR_SHAPE,
                                       "mlc_masked_fill: mask %T does not broadcast to x %T", mask, x);
    out = mlc__like(x, "mlc_masked_fill");
    if (!out) return NULL;
    mlc__call(&call, MLC__OP_MASKED_FILL, "mlc_masked_fill", out, x, mask, NULL, NULL);
    call.args.masked_fill.value = value;
    if (!mlc__run(ctx, &call)) return NULL;
    mlc__record(&call);
    return out;
}

/* ============================================================================================
   @section formulas  Helpers the formulas share with the device kernels, written once
   Each row of MLC__FORMULA_HELPERS is one helper function: its return type, name, parameters,
   and body, written in the C that OpenCL C also compiles (no libm names: MLC_EXPF and the
   others; bits through mlc__float_bits and mlc__bits_float). This file compiles each row as a
   static function; mlc_opencl.h puts the same rows, as text, at the head of its program.
   A formula (a row of MLC__UNARY_KINDS, a kernel) that needs a new helper adds one row here.
   ============================================================================================ */

#define MLC__SQRT_2_OVER_PI 0.7978845608028654f
#define MLC__INV_SQRT_2 0.7071067811865476f
#define MLC__INV_SQRT_2PI 0.3989422804014327f

static inline uint32_t mlc__float_bits(float x) { uint32_t b; memcpy(&b, &x, sizeof b); return b; }
static inline float mlc__bits_float(uint32_t b) { float x; memcpy(&x, &b, sizeof x); return x; }

/* pick: pick_a ? a : b, as bits: GCC's vectoriser takes a choice between two computed values
   written this way, but not as ?: (which it leaves a branch).
   exp: e^x = 2^n e^r, n = round(x / ln 2), |r| <= ln 2 / 2, e^r = 1 + r + r^2 P(r) (P fitted to
   e^r on that interval, degree 4); x is clamped to [-104, 89] (e^x is 0 and inf beyond). 2^n is
   added to e^r's exponent (exact), or for results below FLT_MIN applied as two powers of two, so
   that they come out subnormal; above ln FLT_MAX the result is inf. (No product of powers of two
   that -ffast-math could fold into one that overflows.) Within 1.05 ulp of e^x for every float.
   erf: odd, so computed for a = |x| and the sign put back. Below 1, erf a = a + a Q(a^2)
   (Q fitted to erf(a)/a - 1, degree 6); from 1, erf a = 1 - e^(-a^2) B(1/a) / a (B fitted to
   erfc(a) e^(a^2) a, degree 8); from 3.921875 it is 1 in float. Both are computed and one is
   chosen, so there is no branch. Within 1.6 ulp for every float (checked against double erf).
   sigmoid: the exponential of a negative number only, so it never overflows.
   tanh: tanh|x| = m / (m + 2) with m = e^(2|x|) - 1, computed whole so that small x loses
   nothing: e^y - 1 = 2^n (e^r - 1) + 2^n - 1, n = round(y / ln 2), |r| <= ln 2 / 2 (degree-7
   Taylor). |x| is capped at 10 (tanh is 1 there in any precision); the sign is put back. No
   branches and no libm, so the loops around it vectorise (the selects are written as GCC's
   vectoriser reads them); at most 3.3 ulp from the true value. NaN is found in the bits, n and
   2^n - 1 by conversions to int, so -ffast-math (which folds x != x, rounding tricks and
   (2^n (e^r - 1)) + (2^n - 1) into 2^n e^r - 1) and x87's wider registers change nothing.
   gelu_tanh_slope: d/dx of x (1 + tanh u) / 2 with u = √(2/π)(x + 0.044715 x³).
   dropout_scale: the keep-scale of element `at` for dropout p with `seed`, from a hash of the
   two, so backward and every device draw the mask the forward used without storing it.
   flush: optimiser state below FLT_MIN is stored as 0 (see Optimisers). */
#define MLC__FORMULA_HELPERS(X) \
    X(MLC__INLINE float, mlc__pick, (int pick_a, float a, float b), { \
        uint32_t mask = 0u - (uint32_t)(pick_a != 0); \
        return mlc__bits_float((mlc__float_bits(a) & mask) | (mlc__float_bits(b) & ~mask)); \
    }) \
    X(MLC__INLINE float, mlc__expf, (float x), { \
        uint32_t nan_mask = 0u - (uint32_t)((mlc__float_bits(x) & 0x7fffffffu) > 0x7f800000u); \
        float a = mlc__pick(x > 89.0f, 89.0f, mlc__pick(x < -104.0f, -104.0f, x)), r, e, tiny; \
        int32_t n, k; \
        a = mlc__bits_float(mlc__float_bits(a) & ~nan_mask);                 /* 0 for a NaN */ \
        n = (int32_t)(a * 1.44269504f + 256.5f) - 256;               /* positive: truncation floors */ \
        r = (a - (float)n * 0.693145751953125f) - (float)n * 1.428606765330187e-6f;  /* ln 2, two parts */ \
        e = 1.0f + (r + r * r * (0.5f + r * (0.166665778f + r * (0.0416665561f + r * (0.00836317334f \
            + r * 0.00139261759f))))); \
        k = n / 2;                                     /* below FLT_MIN: 2^n as 2^k 2^(n - k) */ \
        tiny = e * mlc__bits_float((uint32_t)(k + 127) << 23) \
               * mlc__bits_float((uint32_t)(n - k + 127) << 23); \
        e = mlc__bits_float(mlc__float_bits(e) + ((uint32_t)n << 23));            /* exact: 2^n e */ \
        e = mlc__pick(a > 88.72283172607421875f, mlc__bits_float(0x7f800000u), e); /* (a float's exact \
            digits: x87 and s390x evaluate a constant to their wider precision) */ \
        e = mlc__pick(n < -125, tiny, e); \
        return mlc__bits_float((mlc__float_bits(e) & ~nan_mask) | (0x7fc00000u & nan_mask)); \
    }) \
    X(MLC__INLINE float, mlc__erff, (float x), { \
        uint32_t bits = mlc__float_bits(x) & 0x7fffffffu, sign = mlc__float_bits(x) & 0x80000000u; \
        uint32_t nan_mask = 0u - (uint32_t)(bits > 0x7f800000u); \
        float a = mlc__bits_float(bits < 0x407b0000u ? bits : 0x407b0000u);   /* at most 3.921875 */ \
        float t = a * a, below, above, y; \
        float u = 1.0f / mlc__bits_float(bits > 0x3f800000u ? bits : 0x3f800000u);   /* 1 / max(a, 1) */ \
        below = a + a * (0.128379166f + t * (-0.37612626f + t * (0.112835944f + t * (-0.0268542115f \
                + t * (0.00518908724f + t * (-0.00080168643f + t * 7.87587487e-05f)))))); \
        above = 0.563951731f + u * (0.00356379827f + u * (-0.301237553f + u * (0.0256657694f \
                + u * (0.602145433f + u * (-0.956277668f + u * (0.740977168f + u * (-0.30413121f \
                + u * 0.0529261045f))))))); \
        above = 1.0f - mlc__expf(-t) * above * u; \
        y = mlc__pick(a < 1.0f, below, mlc__pick(a < 3.921875f, above, 1.0f)); \
        return mlc__bits_float(((mlc__float_bits(y) | sign) & ~nan_mask) | (0x7fc00000u & nan_mask)); \
    }) \
    X(MLC__INLINE float, mlc__sigmoidf, (float x), { \
        float e = MLC_EXPF(x < 0 ? x : -x); \
        return mlc__pick(x < 0, e, 1.0f) / (1.0f + e); \
    }) \
    X(MLC__INLINE float, mlc__tanhf, (float x), { \
        uint32_t bits = mlc__float_bits(x) & 0x7fffffffu, sign = mlc__float_bits(x) & 0x80000000u; \
        uint32_t nan_mask = 0u - (uint32_t)(bits > 0x7f800000u);   /* all ones for a NaN */ \
        int32_t n; \
        float a, y, r, m, two_n; \
        a = mlc__bits_float(bits < 0x41200000u ? bits : 0x41200000u);   /* at most 10.0f */ \
        y = 2.0f * a; \
        n = (int32_t)(y * 1.44269504f + 0.5f);               /* y >= 0: truncation rounds */ \
        r = (y - (float)n * 0.693145751953125f) - (float)n * 1.428606765330187e-6f;  /* ln 2, two parts */ \
        two_n = mlc__bits_float((uint32_t)(n + 127) << 23); \
        m = two_n * (r * (1.0f + r * (0.5f + r * (1.0f / 6 + r * (1.0f / 24 + r * (1.0f / 120 \
            + r * (1.0f / 720 + r * (1.0f / 5040)))))))) + (float)((int32_t)two_n - 1);   /* exact */ \
        y = m / (m + 2.0f); \
        return mlc__bits_float(((mlc__float_bits(y) | sign) & ~nan_mask) | (0x7fc00000u & nan_mask)); \
    }) \
    X(MLC__INLINE float, mlc__gelu_tanh_slope, (float x), { \
        float u = MLC__SQRT_2_OVER_PI * (x + 0.044715f * x * x * x), t = MLC_TANHF(u); \
        return 0.5f * (1.0f + t) \
               + 0.5f * x * (1.0f - t * t) * MLC__SQRT_2_OVER_PI * (1.0f + 3.0f * 0.044715f * x * x); \
    }) \
    X(float, mlc__dropout_scale, (uint32_t seed, uint32_t at, float p), { \
        uint32_t h = seed ^ (at * 0x9E3779B9u); \
        h ^= h >> 16; h *= 0x7feb352du; h ^= h >> 15; h *= 0x846ca68bu; h ^= h >> 16; \
        return (float)(h >> 8) * (1.0f / 16777216.0f) >= p ? (p < 1.0f ? 1.0f / (1.0f - p) : 0.0f) : 0.0f; \
    }) \
    X(float, mlc__flush, (float x), { return x < FLT_MIN && x > -FLT_MIN ? 0.0f : x; })

#define MLC__FORMULA_HELPER_DEFINE(type, name, params, ...) static type name params __VA_ARGS__
MLC__FORMULA_HELPERS(MLC__FORMULA_HELPER_DEFINE)
#undef MLC__FORMULA_HELPER_DEFINE

/* ============================================================================================
   @section unary  Elementwise ops of one tensor, and activations: y = f(x), dx += g f'(x). Each kind is one
   line of MLC__UNARY_KINDS: its public name, f(x), and f'(x) written with x, y = f(x) and the
   op's parameters p, q. That line makes the enum value, the CPU loops forward and backward,
   and the OpenCL kernels' cases (the same text, compiled for the device). Kinds without
   parameters get their public function from the line too (MLC__UNARY_MAPS, with the maths in
   the public API section); the rest (MLC__UNARY_SCALED) are written out below.
   ============================================================================================ */

#define MLC__UNARY_SCALED(X) \
    X(POW,        pow,          MLC_POWF(x, p),         p == 0.0f ? 0.0f : p * MLC_POWF(x, p - 1.0f)) \
    X(CLAMP,      clamp,        x < p ? p : x > q ? q : x,                  x >= p && x <= q ? 1.0f : 0.0f) \
    X(ADD_SCALAR, add_scalar,   x + p,                                      1.0f) \
    X(MUL_SCALAR, mul_scalar,   x * p,                                      p) \
    X(RSUB_SCALAR, rsub_scalar,  p - x,                                      -1.0f) \
    X(LEAKY_RELU, leaky_relu,   x > 0 ? x : p * x,                          x > 0 ? 1.0f : p)
#define MLC__UNARY_KINDS(X) MLC__UNARY_MAPS(X) MLC__UNARY_SCALED(X)

#define MLC__UNARY_ENUM(NAME, name, f, df) MLC__UNARY_##NAME,
typedef enum mlc__unary_kind { MLC__UNARY_KINDS(MLC__UNARY_ENUM) MLC__UNARY_COUNT } mlc__unary_kind;
#undef MLC__UNARY_ENUM
#define MLC__UNARY_NAME(NAME, name, f, df) "mlc_" #name,
static const char *const mlc__unary_names[] = { MLC__UNARY_KINDS(MLC__UNARY_NAME) };
#undef MLC__UNARY_NAME
#define MLC__UNARY_KIND_NAME(NAME, name, f, df) "UNARY_" #NAME,
/* for kernels */
static const char *const mlc__unary_kind_names[] = { MLC__UNARY_KINDS(MLC__UNARY_KIND_NAME) };
#undef MLC__UNARY_KIND_NAME

/* One loop per op, so each is a plain, vectorisable loop: y = f(x) forward, and
   gx += g f'(x) backward, given x and y = f(x) (or, onto a fresh gradient, gx = 0 + g f'(x):
   the same bits, without zeros written first and read back). Threads share the elements from
   64k on. f'(x) goes through a variable: GCC 12 keeps g·(x > 0 ? 1 : 0) written inline as a
   branch (a scalar loop that mispredicts at every sign change), and vectorises it this way. */
#define MLC__MAP(expr) MLC__VECTOR_LOOP_OF(lanes, i, 0, n, { const float x = xs[i]; ys[i] = (expr); }); break
#define MLC__MAP_GRAD_LOOP(expr, start) MLC__VECTOR_LOOP_OF(lanes, i, 0, n, { \
        const float x = xs[i], y = ys[i], slope = (expr); \
        gx[i] = (start) + g[i] * slope; (void)x; (void)y; \
    })
#define MLC__MAP_GRAD(expr) \
    if (overwrite) MLC__MAP_GRAD_LOOP(expr, 0.0f); else MLC__MAP_GRAD_LOOP(expr, gx[i]); \
    break
#define MLC__MAP_PARALLEL 65536

/* The maps are written once, for `lanes` floats a step, and compiled three times: 4 lanes for
   any CPU, 8 with AVX2 and FMA, 16 with AVX-512, picked at run time where the CPU has them (the
   last two give the same bits: both may contract into FMAs, which the first has not). */
static MLC__INLINE void mlc__unary_map_lanes(mlc__unary_kind kind, size_t n, const float *MLC__RESTRICT xs,
                                             float *MLC__RESTRICT ys, float p, float q, const size_t lanes) {
    size_t i;
#define MLC__UNARY_FORWARD_CASE(NAME, name, f, df) case MLC__UNARY_##NAME: MLC__MAP(f);
    switch (kind) {
    MLC__UNARY_KINDS(MLC__UNARY_FORWARD_CASE)
    case MLC__UNARY_COUNT: break;
    }
#undef MLC__UNARY_FORWARD_CASE
}

static MLC__INLINE void mlc__unary_grad_lanes(mlc__unary_kind kind, size_t n, const float *MLC__RESTRICT xs,
                                              const float *MLC__RESTRICT ys, const float *MLC__RESTRICT g,
                                              float *MLC__RESTRICT gx, int overwrite, float p, float q,
                                              const size_t lanes) {
    size_t i;
#define MLC__UNARY_GRAD_CASE(NAME, name, f, df) case MLC__UNARY_##NAME: MLC__MAP_GRAD(df);
    switch (kind) {
    MLC__UNARY_KINDS(MLC__UNARY_GRAD_CASE)
    case MLC__UNARY_COUNT: break;
    }
#undef MLC__UNARY_GRAD_CASE
}
#undef MLC__MAP
#undef MLC__MAP_GRAD
#undef MLC__MAP_GRAD_LOOP

#if MLC__X86
static int mlc__cpu_avx2(void) { return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma"); }

/* (GCC 12 runs GELU's erf in half the time at 16 lanes as at 8) */
__attribute__((target("avx2,fma")))
static void mlc__unary_map_avx2(mlc__unary_kind kind, size_t n, const float *MLC__RESTRICT xs,
                                float *MLC__RESTRICT ys, float p, float q) {
    mlc__unary_map_lanes(kind, n, xs, ys, p, q, 8);
}
__attribute__((target("avx2,fma")))
static void mlc__unary_grad_avx2(mlc__unary_kind kind, size_t n, const float *MLC__RESTRICT xs,
                                 const float *MLC__RESTRICT ys, const float *MLC__RESTRICT g,
                                 float *MLC__RESTRICT gx, int overwrite, float p, float q) {
    mlc__unary_grad_lanes(kind, n, xs, ys, g, gx, overwrite, p, q, 8);
}
__attribute__((target("avx512f,avx2,fma")))
static void mlc__unary_map_avx512(mlc__unary_kind kind, size_t n, const float *MLC__RESTRICT xs,
                                  float *MLC__RESTRICT ys, float p, float q) {
    mlc__unary_map_lanes(kind, n, xs, ys, p, q, 16);
}
__attribute__((target("avx512f,avx2,fma")))
static void mlc__unary_grad_avx512(mlc__unary_kind kind, size_t n, const float *MLC__RESTRICT xs,
                                   const float *MLC__RESTRICT ys, const float *MLC__RESTRICT g,
                                   float *MLC__RESTRICT gx, int overwrite, float p, float q) {
    mlc__unary_grad_lanes(kind, n, xs, ys, g, gx, overwrite, p, q, 16);
}
#endif

static void mlc__unary_map(mlc__unary_kind kind, size_t n, const float *MLC__RESTRICT xs,
                           float *MLC__RESTRICT ys, float p, float q) {
#if MLC__X86
    if (mlc__cpu_avx2()) {
        if (__builtin_cpu_supports("avx512f")) mlc__unary_map_avx512(kind, n, xs, ys, p, q);
        else mlc__unary_map_avx2(kind, n, xs, ys, p, q);
        return;
    }
#endif
    mlc__unary_map_lanes(kind, n, xs, ys, p, q, 4);
}
static void mlc__unary_grad(mlc__unary_kind kind, size_t n, const float *MLC__RESTRICT xs,
                            const float *MLC__RESTRICT ys, const float *MLC__RESTRICT g,
                            float *MLC__RESTRICT gx, int overwrite, float p, float q) {
#if MLC__X86
    if (mlc__cpu_avx2()) {
        if (__builtin_cpu_supports("avx512f"))
            mlc__unary_grad_avx512(kind, n, xs, ys, g, gx, overwrite, p, q);
        else mlc__unary_grad_avx2(kind, n, xs, ys, g, gx, overwrite, p, q);
        return;
    }
#endif
    mlc__unary_grad_lanes(kind, n, xs, ys, g, gx, overwrite, p, q, 4);
}

/* The map over values [begin, end) of a half x into y (mlc__cpu_takes_half, forward), a block at
   a time widened on the stack and rounded back: the stand-ins' values */
static void mlc__unary_map_half(const mlc__node *n, size_t begin, size_t end) {
    float xs[MLC__HALF_BLOCK], ys[MLC__HALF_BLOCK];
    size_t at, count;
    for (at = begin; at < end; at += count) {
        count = end - at < MLC__HALF_BLOCK ? end - at : MLC__HALF_BLOCK;
        mlc__widen(n->in[0]->dtype, n->in[0]->half + at, xs, count);
        mlc__unary_map((mlc__unary_kind)n->args.unary.kind, count, xs, ys, n->args.unary.p, n->args.unary.q);
        mlc__narrow(n->out->dtype, ys, n->out->half + at, count);
    }
}

/* The two maps over a slice [begin, end) of the node's tensors, for mlc__parallel (backward:
   onto x's gradient, or over it when beta is 0). */
static void mlc__unary_map_slice(void *node, int slot, size_t begin, size_t end) {
    const mlc__node *n = (const mlc__node *)node;
    (void)slot;
    if (mlc__is_half(n->out->dtype)) mlc__unary_map_half(n, begin, end);
    else mlc__unary_map((mlc__unary_kind)n->args.unary.kind, end - begin, n->in[0]->data + begin,
                        n->out->data + begin, n->args.unary.p, n->args.unary.q);
}
typedef struct mlc__unary_grad_job { const mlc__node *n; float *gx, beta; } mlc__unary_grad_job;
static void mlc__unary_grad_slice(void *arg, int slot, size_t begin, size_t end) {
    const mlc__unary_grad_job *job = (const mlc__unary_grad_job *)arg;
    const mlc__node *n = job->n;
    (void)slot;
    mlc__unary_grad((mlc__unary_kind)n->args.unary.kind, end - begin, n->in[0]->data + begin,
                    n->out->data + begin, n->out->grad + begin, job->gx + begin, job->beta == 0.0f,
                    n->args.unary.p, n->args.unary.q);
}

static void mlc__unary_backward(mlc__node *n) {
    mlc__unary_grad_job job;
    job.n = n;
    if ((job.gx = mlc__grad_to_overwrite(n->in[0], &job.beta)))
        mlc__parallel(n->out->ctx, n->out->size, MLC__MAP_PARALLEL, mlc__unary_grad_slice, &job);
}

static int mlc__unary_cpu(mlc__node *n) {
    mlc__parallel(n->out->ctx, n->out->size, MLC__MAP_PARALLEL, mlc__unary_map_slice, n);
    return 1;
}

static mlc_tensor *mlc__unary(mlc__unary_kind kind, mlc_tensor *x, float p, float q) {
    const char *op = mlc__unary_names[kind];
    mlc_tensor *out;
    mlc__node call;
    MLC__ENTER(op, x);
    out = mlc__like(x, op);
    if (!out) return NULL;
    mlc__call(&call, MLC__OP_UNARY, op, out, x, NULL, NULL, NULL);
    call.args.unary.kind = kind; call.args.unary.p = p; call.args.unary.q = q;
    if (!mlc__run(ctx, &call)) return NULL;
    mlc__record(&call);
    return out;
}

#define MLC__UNARY_DEFINE(NAME, name, f, df) \
    MLCDEF mlc_tensor *mlc_##name(mlc_tensor *x) { return mlc__unary(MLC__UNARY_##NAME, x, 0, 0); }
MLC__UNARY_MAPS(MLC__UNARY_DEFINE)
#undef MLC__UNARY_DEFINE
MLCDEF mlc_tensor *mlc_pow(mlc_tensor *x, float exponent) {
    return mlc__unary(MLC__UNARY_POW, x, exponent, 0);
}
MLCDEF mlc_tensor *mlc_clamp(mlc_tensor *x, float lo, float hi) {
    if (x && !x->ctx->error && (mlc__is_nan(lo) || mlc__is_nan(hi) || !(lo <= hi)))
        return (mlc_tensor *)mlc__fail(x->ctx, MLC_ERR_ARG, "mlc_clamp: lo %g is above hi %g", (double)lo,
                                       (double)hi);
    return mlc__unary(MLC__UNARY_CLAMP, x, lo, hi);
}
MLCDEF mlc_tensor *mlc_add_scalar(mlc_tensor *x, float s) {
    return mlc__unary(MLC__UNARY_ADD_SCALAR, x, s, 0);
}
MLCDEF mlc_tensor *mlc_mul_scalar(mlc_tensor *x, float s) {
    return mlc__unary(MLC__UNARY_MUL_SCALAR, x, s, 0);
}
MLCDEF mlc_tensor *mlc_rsub_scalar(mlc_tensor *x, float s) {
    return mlc__unary(MLC__UNARY_RSUB_SCALAR, x, s, 0);
}
MLCDEF mlc_tensor *mlc_leaky_relu(mlc_tensor *x, float slope) {
    return mlc__unary(MLC__UNARY_LEAKY_RELU, x, slope, 0);
}

/* ============================================================================================
   @section matmul  Matrix products
     C = op(A) op(B)          A [M, K], B [K, N] after the optional transposes
     dA = dC op(B)^T          dB = op(A)^T dC     (with transposes, worked out per case below)
   mlc_gemm_reference is the plain loop every faster path is tested against; mlc_gemm is the
   one place every product goes through (the user's hook, BLAS, or mlc's own). Products of bf16
   matrices go through mlc_gemm_bf16: mlc's bf16 kernel where the CPU has one, else mlc_gemm.
   mlc_gemm_i8 multiplies int8 matrices into exact int32 sums (after the bf16 kernels).
   ============================================================================================ */

/* C[M,N] = op(A) op(B) + beta C; each operand is stored row-major as written, or transposed. */
MLCDEF void mlc_gemm_reference(int ta, int tb, int M, int N, int K, const float *A, const float *B,
                               float beta, float *C) {
    int i, j, k;
    int lda = ta ? M : K, ldb = tb ? K : N;
    for (i = 0; i < M; i++) {
        float *c = C + (size_t)i * N;
        if (beta == 0.0f) memset(c, 0, (size_t)N * sizeof(float));
        if (tb && !ta) {                             /* rows of A against rows of B */
            const float *a = A + (size_t)i * lda;
            for (j = 0; j < N; j++) {
                const float *b = B + (size_t)j * ldb;
                float s = 0.0f;
                for (k = 0; k < K; k++) s += a[k] * b[k];
                c[j] += s;
            }
            continue;
        }
        for (k = 0; k < K; k++) {
            float a = ta ? A[(size_t)k * lda + i] : A[(size_t)i * lda + k];
            if (!tb) { const float *b = B + (size_t)k * ldb; for (j = 0; j < N; j++) c[j] += a * b[j]; }
            else for (j = 0; j < N; j++) c[j] += a * B[(size_t)j * ldb + k];
        }
    }
}

/* A product's epilogue on rows x cols of C (row stride ldc): linear's C += bias on every row
   (NULL: none), a convolution's C += row_bias[i] along row i (its channel's bias; NULL: none),
   then relu 1: C = relu(C), 6: relu6(C); vectorised passes over each row while it is in cache,
   the bits of mlc_add's and the maps' */
static void mlc__gemm_epilogue(float *C, size_t ldc, int rows, int cols, const float *bias,
                               const float *row_bias, int relu) {
    int i, j;
    for (i = 0; i < rows && (bias || row_bias || relu); i++, C += ldc) {
        if (bias) mlc__axpy((size_t)cols, 1.0f, bias, C);
        if (row_bias) { const float b = row_bias[i]; MLC__VECTOR_LOOP(j, 0, cols, { C[j] += b; }); }
        if (relu == 6) mlc__relu6_row((size_t)cols, C);
        else if (relu) mlc__relu_row((size_t)cols, C);
    }
}

/* mlc's bf16 kernel (below) needs x86-64, mlc's own products and a compiler that knows
   AVX-512 BF16 (GCC 10, Clang 11); elsewhere bf16 products are widened to float32 */
#if MLC__X86 && defined(__x86_64__) && !defined(MLC_USE_CBLAS) \
    && ((defined(__clang__) && __clang_major__ >= 11) || (!defined(__clang__) && __GNUC__ >= 10))
#define MLC__BF16_X86 1
#else
#define MLC__BF16_X86 0
#endif

#ifndef MLC_USE_CBLAS
/* mlc's own matrix product: the Goto/BLIS scheme.
   C is cut into NC-wide column panels and K into KC-deep slices. For each (panel, slice) the
   KC x NC block of op(B) is packed once and MC x KC blocks of op(A) in turn into `work` (on
   threads, what each packs is in mlc__gemm_part). Packing copies a block into slivers: strips
   MR rows (of A) or NR columns (of B) wide, stored k-major, so the micro-kernel reads both
   operands sequentially whatever the transposes were, and an edge sliver is padded with zeros
   so the kernel always runs a full tile. The micro-kernel keeps an MR x NR tile of C in
   registers and adds one rank-1 update (a column of the A sliver times a row of the B sliver)
   per k; a B sliver stays in L1 while the A slivers of the block stream past it from L2.
   The x86-64 kernels are compiled for AVX2+FMA and AVX-512 and picked at run time, so a plain
   -O2 build still runs at full speed; elsewhere the vector-extension kernel is used. */
/* tile bounds; below SMALL multiply-adds the plain loop wins, below PARALLEL one thread does */
enum {
    MLC__GEMM_MR_MAX = 12,
    MLC__GEMM_NR_MAX = 32,
    MLC__GEMM_SMALL = 16 * 16 * 16,
    MLC__GEMM_PARALLEL = 64 * 64 * 32,
    MLC__GEMM_COPY_MAX = 1 << 15,       /* floats of a shared operand each thread packs a copy of, at most */
    MLC__GEMM_SHARED_MAX = 1 << 20      /* floats of one the threads pack once together, at most */
};

/* micro-kernel: C[mr, nr] (row stride ldc) = (add ? C : 0) + sum over k of a[k*mr + i] b[k*nr + j],
   then, on the last slice of K, the product's epilogue for the tile (tail; NULL: none) */
typedef struct mlc__gemm_tail { const float *bias, *row_bias; int relu; } mlc__gemm_tail;
typedef void (*mlc__gemm_kernel_fn)(int kc, const float *a, const float *b, float *c, int ldc, int add,
                                    const mlc__gemm_tail *tail);
typedef struct mlc__gemm_arch { mlc__gemm_kernel_fn kernel; int mr, nr, mc, kc, nc; } mlc__gemm_arch;

#if defined(__GNUC__)
/* 6 x 16 with GCC/Clang vectors of 4 floats (SSE, NEON): 24 accumulators, four B loads per k */
typedef float mlc__v4 __attribute__((vector_size(16)));

static void mlc__gemm_kernel_6x16(int kc, const float *a, const float *b, float *c, int ldc, int add,
                                  const mlc__gemm_tail *tail) {
    float *const c0 = c;
    const mlc__v4 zero = { 0.0f, 0.0f, 0.0f, 0.0f };
    mlc__v4 acc[6][4], bk[4], t;
    int i, j, k;
    _Pragma("GCC unroll 6") for (i = 0; i < 6; i++) _Pragma("GCC unroll 4") for (j = 0; j < 4; j++)
        acc[i][j] = zero;
    for (k = 0; k < kc; k++, a += 6, b += 16) {
        memcpy(bk, b, sizeof bk);
        _Pragma("GCC unroll 6") for (i = 0; i < 6; i++) {
            const mlc__v4 ai = { a[i], a[i], a[i], a[i] };   /* a vector: no excess-precision scalar */
            _Pragma("GCC unroll 4") for (j = 0; j < 4; j++) acc[i][j] += bk[j] * ai;
        }
    }
    _Pragma("GCC unroll 6") for (i = 0; i < 6; i++, c += ldc)
        _Pragma("GCC unroll 4") for (j = 0; j < 4; j++) {
        if (add) { memcpy(&t, c + 4 * j, sizeof t); acc[i][j] += t; }
        memcpy(c + 4 * j, &acc[i][j], sizeof t);
    }
    if (tail) mlc__gemm_epilogue(c0, (size_t)ldc, 6, 16, tail->bias, tail->row_bias, tail->relu);
}
#else
static void mlc__gemm_kernel_6x16(int kc, const float *a, const float *b, float *c, int ldc, int add,
                                  const mlc__gemm_tail *tail) {
    float acc[6][16] = {{0}}, *const c0 = c;
    int i, j, k;
    for (k = 0; k < kc; k++, a += 6, b += 16)
        for (i = 0; i < 6; i++)
            for (j = 0; j < 16; j++) acc[i][j] += a[i] * b[j];
    for (i = 0; i < 6; i++, c += ldc)
        for (j = 0; j < 16; j++) c[j] = add ? c[j] + acc[i][j] : acc[i][j];
    if (tail) mlc__gemm_epilogue(c0, (size_t)ldc, 6, 16, tail->bias, tail->row_bias, tail->relu);
}
#endif

#if MLC__X86
/* 6 x 16: twelve 8-float accumulators, two B loads and six broadcasts of A per k */
__attribute__((target("avx2,fma")))
static void mlc__gemm_kernel_avx2(int kc, const float *a, const float *b, float *c, int ldc, int add,
                                  const mlc__gemm_tail *tail) {
    float *const c0 = c;
    __m256 acc[6][2];
    int i, k;
    _Pragma("GCC unroll 6") for (i = 0; i < 6; i++) acc[i][0] = acc[i][1] = _mm256_setzero_ps();
    for (k = 0; k < kc; k++, a += 6, b += 16) {
        __m256 b0 = _mm256_loadu_ps(b), b1 = _mm256_loadu_ps(b + 8);
        _Pragma("GCC unroll 6") for (i = 0; i < 6; i++) {
            __m256 ai = _mm256_broadcast_ss(a + i);
            acc[i][0] = _mm256_fmadd_ps(ai, b0, acc[i][0]);
            acc[i][1] = _mm256_fmadd_ps(ai, b1, acc[i][1]);
        }
    }
    _Pragma("GCC unroll 6") for (i = 0; i < 6; i++, c += ldc) {
        if (add) {
            acc[i][0] = _mm256_add_ps(acc[i][0], _mm256_loadu_ps(c));
            acc[i][1] = _mm256_add_ps(acc[i][1], _mm256_loadu_ps(c + 8));
        }
        _mm256_storeu_ps(c, acc[i][0]);
        _mm256_storeu_ps(c + 8, acc[i][1]);
    }
    if (tail) mlc__gemm_epilogue(c0, (size_t)ldc, 6, 16, tail->bias, tail->row_bias, tail->relu);
}

/* MLC__FOR_ROWS(i, rows): for (i = 0; i < rows; i++) over a product tile's accumulators, rows a
   constant (at most 12) once the tile is inlined, as a loop of 12 that unrolls whole and a test
   that folds away, so that the accumulators stay in registers. (Clang unrolled a loop of `rows`
   by 2 before the constant reached it: its product kernels kept their sums in memory, at 40 %
   of GCC's speed.) */
#define MLC__FOR_ROWS(i, rows) _Pragma("GCC unroll 12") for (i = 0; i < 12; i++) if (i < (rows))

/* GCC 12 as C++ reads the placeholder operand of its own AVX-512 max/min intrinsics as "may be
   used uninitialized" (see the depthwise kernels): silenced for the tile */
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif
/* rows x 32 (rows <= 12, a constant where it is inlined): 2·rows 16-float accumulators, two B
   loads and `rows` broadcasts of A per k; the epilogue in registers, the same operations in the
   same order as mlc__gemm_epilogue's (max(0, x): a NaN stays NaN, as x < 0 ? 0 : x keeps it) */
__attribute__((target("avx512f,avx2,fma"), always_inline))
static inline void mlc__gemm_tile_avx512(int rows, int kc, const float *a, const float *b, float *c, int ldc,
                                         int add, const mlc__gemm_tail *tail) {
    __m512 acc[12][2];
    int i, k;
    MLC__FOR_ROWS(i, rows) acc[i][0] = acc[i][1] = _mm512_setzero_ps();
    for (k = 0; k < kc; k++, a += rows, b += 32) {
        __m512 b0 = _mm512_loadu_ps(b), b1 = _mm512_loadu_ps(b + 16);
        MLC__FOR_ROWS(i, rows) {
            __m512 ai = _mm512_set1_ps(a[i]);
            acc[i][0] = _mm512_fmadd_ps(ai, b0, acc[i][0]);
            acc[i][1] = _mm512_fmadd_ps(ai, b1, acc[i][1]);
        }
    }
    _Pragma("GCC unroll 12") for (i = 0; i < rows; i++, c += ldc) {
        if (add) {
            acc[i][0] = _mm512_add_ps(acc[i][0], _mm512_loadu_ps(c));
            acc[i][1] = _mm512_add_ps(acc[i][1], _mm512_loadu_ps(c + 16));
        }
        if (tail) {
            if (tail->bias) {
                acc[i][0] = _mm512_add_ps(acc[i][0], _mm512_loadu_ps(tail->bias));
                acc[i][1] = _mm512_add_ps(acc[i][1], _mm512_loadu_ps(tail->bias + 16));
            }
            if (tail->row_bias) {
                const __m512 r = _mm512_set1_ps(tail->row_bias[i]);
                acc[i][0] = _mm512_add_ps(acc[i][0], r);
                acc[i][1] = _mm512_add_ps(acc[i][1], r);
            }
            if (tail->relu) {
                acc[i][0] = _mm512_max_ps(_mm512_setzero_ps(), acc[i][0]);
                acc[i][1] = _mm512_max_ps(_mm512_setzero_ps(), acc[i][1]);
            }
            if (tail->relu == 6) {
                acc[i][0] = _mm512_min_ps(_mm512_set1_ps(6.0f), acc[i][0]);
                acc[i][1] = _mm512_min_ps(_mm512_set1_ps(6.0f), acc[i][1]);
            }
        }
        _mm512_storeu_ps(c, acc[i][0]);
        _mm512_storeu_ps(c + 16, acc[i][1]);
    }
}
/* 12 x 32, and 8 x 32 for products whose rows 8 divides with fewer padded ones (16, 32, 64,
   256: 12 rows would pad them to 24, 36, 72, 264). The same sums in the same order either way. */
__attribute__((target("avx512f,avx2,fma")))
static void mlc__gemm_kernel_avx512(int kc, const float *a, const float *b, float *c, int ldc, int add,
                                    const mlc__gemm_tail *tail) {
    mlc__gemm_tile_avx512(12, kc, a, b, c, ldc, add, tail);
}
__attribute__((target("avx512f,avx2,fma")))
static void mlc__gemm_kernel_avx512_8(int kc, const float *a, const float *b, float *c, int ldc, int add,
                                      const mlc__gemm_tail *tail) {
    mlc__gemm_tile_avx512(8, kc, a, b, c, ldc, add, tail);
}
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic pop
#endif
#endif

/* Kernels with their block sizes: KC x NR of B stays in L1, MC x KC of A in L2, KC x NC in L3. */
static const mlc__gemm_arch mlc__gemm_generic = { mlc__gemm_kernel_6x16, 6, 16, 120, 256, 1024 };
#if MLC__X86
static const mlc__gemm_arch mlc__gemm_avx2 = { mlc__gemm_kernel_avx2, 6, 16, 120, 256, 1024 };
static const mlc__gemm_arch mlc__gemm_avx512 = { mlc__gemm_kernel_avx512, 12, 32, 120, 256, 1024 };
static const mlc__gemm_arch mlc__gemm_avx512_8 = { mlc__gemm_kernel_avx512_8, 8, 32, 120, 256, 1024 };
#endif

static int mlc__gemm_round_up(int x, int m) { return (x + m - 1) / m * m; }

/* the best kernel this CPU runs for a product of M rows */
static const mlc__gemm_arch *mlc__gemm_pick(int M) {
#if MLC__X86
    if (__builtin_cpu_supports("avx512f"))
        return mlc__gemm_round_up(M, 8) < mlc__gemm_round_up(M, 12) ? &mlc__gemm_avx512_8 : &mlc__gemm_avx512;
    if (mlc__cpu_avx2()) return &mlc__gemm_avx2;
#endif
    (void)M;
    return &mlc__gemm_generic;
}

/* How a product (M, K >= 1) is cut for kernel g: K into equal slices of kc <= g->kc, M into A
   blocks of equal height mc (a multiple of MR, <= g->mc) */
static void mlc__gemm_cut(const mlc__gemm_arch *g, int M, int K, int *kc, int *mc) {
    int kblocks = (K + g->kc - 1) / g->kc, mblocks = (M + g->mc - 1) / g->mc;
    *kc = (K + kblocks - 1) / kblocks;
    *mc = mlc__gemm_round_up((M + mblocks - 1) / mblocks, g->mr);
}

/* `work` for kernel g holds one packed B panel, then one packed A block, rounded to a multiple
   of 16 floats so both start 64-byte aligned; the block is sized for any M up to the given one
   (a thread's share of rows has its own cut) */
static size_t mlc__gemm_b_floats(const mlc__gemm_arch *g, int N, int kc) {
    return ((size_t)mlc__gemm_round_up(N < g->nc ? N : g->nc, g->nr) * kc + 15) / 16 * 16;
}
static size_t mlc__gemm_work_floats(const mlc__gemm_arch *g, int M, int N, int K) {
    int kc, mc, tallest = mlc__gemm_round_up(M < g->mc ? M : g->mc, g->mr);   /* any share's block */
    if (M < 1 || N < 1 || K < 1) return 0;              /* an empty product packs nothing */
    mlc__gemm_cut(g, M, K, &kc, &mc);                   /* kc: the same for every share of M */
    return mlc__gemm_b_floats(g, N, kc) + ((size_t)tallest * kc + 15) / 16 * 16;
}

#if MLC__X86
/* The sliver of a transposed operand (sk = 1: each of its m rows runs along k) in 8 x 8
   blocks: eight rows of eight floats loaded, transposed in registers, stored as eight runs
   along x; then 4 x 8 blocks for the next four rows (an AVX-512 A sliver is 12 rows). Does
   rows [0, m - m % 4) over k in [0, kc - kc % 8); the loop below does the rest. */
__attribute__((target("avx")))
static void mlc__gemm_pack_rows_avx(float *dst, const float *src, size_t sx, int m, int kc, int w) {
    int x, k;
    for (x = m - m % 8; x + 4 <= m; x += 4)
        for (k = 0; k + 8 <= kc; k += 8) {
            const float *s = src + (size_t)x * sx + k;
            float *d = dst + (size_t)k * w + x;
            __m256 r0 = _mm256_loadu_ps(s), r1 = _mm256_loadu_ps(s + sx), r2 = _mm256_loadu_ps(s + 2 * sx),
                   r3 = _mm256_loadu_ps(s + 3 * sx);
            __m256 t0 = _mm256_unpacklo_ps(r0, r1), t1 = _mm256_unpackhi_ps(r0, r1),
                   t2 = _mm256_unpacklo_ps(r2, r3), t3 = _mm256_unpackhi_ps(r2, r3);
            __m256 u0 = _mm256_shuffle_ps(t0, t2, 0x44), u1 = _mm256_shuffle_ps(t0, t2, 0xee),
                   u2 = _mm256_shuffle_ps(t1, t3, 0x44), u3 = _mm256_shuffle_ps(t1, t3, 0xee);
            _mm_storeu_ps(d, _mm256_castps256_ps128(u0));
            _mm_storeu_ps(d + w, _mm256_castps256_ps128(u1));
            _mm_storeu_ps(d + 2 * w, _mm256_castps256_ps128(u2));
            _mm_storeu_ps(d + 3 * w, _mm256_castps256_ps128(u3));
            _mm_storeu_ps(d + 4 * w, _mm256_extractf128_ps(u0, 1));
            _mm_storeu_ps(d + 5 * w, _mm256_extractf128_ps(u1, 1));
            _mm_storeu_ps(d + 6 * w, _mm256_extractf128_ps(u2, 1));
            _mm_storeu_ps(d + 7 * w, _mm256_extractf128_ps(u3, 1));
        }
    for (x = 0; x + 8 <= m; x += 8)
        for (k = 0; k + 8 <= kc; k += 8) {
            const float *s = src + (size_t)x * sx + k;
            float *d = dst + (size_t)k * w + x;
            __m256 r0 = _mm256_loadu_ps(s), r1 = _mm256_loadu_ps(s + sx), r2 = _mm256_loadu_ps(s + 2 * sx),
                   r3 = _mm256_loadu_ps(s + 3 * sx), r4 = _mm256_loadu_ps(s + 4 * sx),
                   r5 = _mm256_loadu_ps(s + 5 * sx), r6 = _mm256_loadu_ps(s + 6 * sx),
                   r7 = _mm256_loadu_ps(s + 7 * sx);
            __m256 t0 = _mm256_unpacklo_ps(r0, r1), t1 = _mm256_unpackhi_ps(r0, r1),
                   t2 = _mm256_unpacklo_ps(r2, r3), t3 = _mm256_unpackhi_ps(r2, r3),
                   t4 = _mm256_unpacklo_ps(r4, r5), t5 = _mm256_unpackhi_ps(r4, r5),
                   t6 = _mm256_unpacklo_ps(r6, r7), t7 = _mm256_unpackhi_ps(r6, r7);
            __m256 u0 = _mm256_shuffle_ps(t0, t2, 0x44), u1 = _mm256_shuffle_ps(t0, t2, 0xee),
                   u2 = _mm256_shuffle_ps(t1, t3, 0x44), u3 = _mm256_shuffle_ps(t1, t3, 0xee),
                   u4 = _mm256_shuffle_ps(t4, t6, 0x44), u5 = _mm256_shuffle_ps(t4, t6, 0xee),
                   u6 = _mm256_shuffle_ps(t5, t7, 0x44), u7 = _mm256_shuffle_ps(t5, t7, 0xee);
            _mm256_storeu_ps(d, _mm256_permute2f128_ps(u0, u4, 0x20));
            _mm256_storeu_ps(d + w, _mm256_permute2f128_ps(u1, u5, 0x20));
            _mm256_storeu_ps(d + 2 * w, _mm256_permute2f128_ps(u2, u6, 0x20));
            _mm256_storeu_ps(d + 3 * w, _mm256_permute2f128_ps(u3, u7, 0x20));
            _mm256_storeu_ps(d + 4 * w, _mm256_permute2f128_ps(u0, u4, 0x31));
            _mm256_storeu_ps(d + 5 * w, _mm256_permute2f128_ps(u1, u5, 0x31));
            _mm256_storeu_ps(d + 6 * w, _mm256_permute2f128_ps(u2, u6, 0x31));
            _mm256_storeu_ps(d + 7 * w, _mm256_permute2f128_ps(u3, u7, 0x31));
        }
}
#endif

/* Packs one sliver: dst[k*w + x] = src[x*sx + k*sk] for x < m, zero for m <= x < w. */
static void mlc__gemm_pack(float *dst, const float *src, size_t sx, size_t sk, int m, int kc, int w) {
    int k, x, blocked_x = 0, blocked_k = 0;
    if (m < w) memset(dst, 0, (size_t)kc * w * sizeof(float));   /* an edge sliver */
    if (sx == 1) {
        for (k = 0; k < kc; k++) memcpy(dst + (size_t)k * w, src + (size_t)k * sk, (size_t)m * sizeof(float));
        return;
    }
#if MLC__X86
    if (sk == 1 && __builtin_cpu_supports("avx")) {
        mlc__gemm_pack_rows_avx(dst, src, sx, m, kc, w);
        blocked_x = m - m % 4; blocked_k = kc - kc % 8;
    }
#endif
    for (k = 0; k < kc; k++)
        for (x = k < blocked_k ? blocked_x : 0; x < m; x++) dst[(size_t)k * w + x] = src[x * sx + k * sk];
}

typedef struct mlc__gemm_job {          /* one packed product (or a block of columns or rows of one) */
    const mlc__gemm_arch *g;
    int M, N, K;
    const float *A, *B;
    /* op(A)[i, k] = A[i*a_sx + k*a_sk], op(B)[k, j] = B[k*b_sk + j*b_sx], C[i, j] = C[i*ldc + j] */
    size_t a_sx, a_sk, b_sx, b_sk, ldc;
    float beta, *C, *work;
    int split_rows;                     /* threads share: 1 rows of C (MR at a time), 0 columns (NR) */
    size_t work_floats;                 /* each thread's share of work */
    float *shared;                      /* the operand all threads read whole, packed (NULL: each piece
                                           packs its blocks): op(B) when they share rows, op(A) columns;
                                           one copy that all threads pack first, or with shared_packed a
                                           copy per thread (slot s's at shared + s * shared_floats) */
    size_t shared_padded, shared_units, shared_floats;  /* its extent (N or M) rounded up to whole
                                                           slivers; its slivers; a copy's floats */
    unsigned char *shared_packed;       /* per slot: its copy is packed (by its first piece) */
    const float *a_packed;              /* op(A) packed whole beforehand (mlc__gemm_pack_a), or NULL */
    size_t a_padded;                    /*   its rows rounded up to whole slivers */
    int a_first;                        /*   the row of it this part's row 0 is */
    const float *bias, *row_bias;       /* the epilogue on each tile as it is done (NULL, NULL, 0: none) */
    int relu;
} mlc__gemm_job;

/* The loops over blocks: for each panel of B (packed), each block of A (packed), the kernel
   over the tiles of C. */
/* An edge tile of mm x nn values, computed whole in tile (row stride nr), into C (or added) */
static void mlc__gemm_edge(float *c, size_t ldc, const float *tile, int nr, int mm, int nn, int add) {
    int i, j;
    for (i = 0; i < mm; i++)
        for (j = 0; j < nn; j++)
            c[(size_t)i * ldc + j] = add ? c[(size_t)i * ldc + j] + tile[i * nr + j] : tile[i * nr + j];
}

static void mlc__gemm_blocks(const mlc__gemm_job *p) {
    const mlc__gemm_arch *g = p->g;
    const int mr = g->mr, nr = g->nr, M = p->M, N = p->N, K = p->K;
    const float *shared_b = p->split_rows ? p->shared : NULL,
                *shared_a = p->a_packed ? p->a_packed : p->split_rows ? NULL : p->shared;
    const size_t a_padded = p->a_packed ? p->a_padded : p->shared_padded;
    int jc, pc, kc, mc;
    float *bp = p->work, *ap;
    mlc__gemm_tail tail;
    tail.relu = p->relu;
    mlc__gemm_cut(g, M, K, &kc, &mc);
    ap = p->work + mlc__gemm_b_floats(g, N, kc);
    for (jc = 0; jc < N; jc += g->nc) {
        int nc = N - jc < g->nc ? N - jc : g->nc;
        for (pc = 0; pc < K; pc += kc) {
            int kk = K - pc < kc ? K - pc : kc, add = pc > 0 || p->beta != 0.0f, jr, ic,
                last = pc + kk == K && (p->bias || p->row_bias || p->relu);     /* then the epilogue */
            if (shared_b) bp = (float *)shared_b + (size_t)pc * p->shared_padded + (size_t)jc * kk;
            for (jr = 0; jr < nc && !shared_b; jr += nr)
                mlc__gemm_pack(bp + (size_t)jr * kk,
                               p->B + (size_t)pc * p->b_sk + (size_t)(jc + jr) * p->b_sx, p->b_sx, p->b_sk,
                               nc - jr < nr ? nc - jr : nr, kk, nr);
            for (ic = 0; ic < M; ic += mc) {
                int m = M - ic < mc ? M - ic : mc, ir;
                if (shared_a) ap = (float *)shared_a + (size_t)pc * a_padded + (size_t)(p->a_first + ic) * kk;
                for (ir = 0; ir < m && !shared_a; ir += mr)
                    mlc__gemm_pack(ap + (size_t)ir * kk,
                                   p->A + (size_t)(ic + ir) * p->a_sx + (size_t)pc * p->a_sk, p->a_sx,
                                   p->a_sk, m - ir < mr ? m - ir : mr, kk, mr);
                for (jr = 0; jr < nc; jr += nr) {
                    for (ir = 0; ir < m; ir += mr) {
                        float *c = p->C + (size_t)(ic + ir) * p->ldc + jc + jr,
                              tile[MLC__GEMM_MR_MAX * MLC__GEMM_NR_MAX];
                        int mm = m - ir < mr ? m - ir : mr, nn = nc - jr < nr ? nc - jr : nr;
                        tail.bias = p->bias ? p->bias + jc + jr : NULL;
                        tail.row_bias = p->row_bias ? p->row_bias + ic + ir : NULL;
                        if (mm == mr && nn == nr) {
                            g->kernel(kk, ap + (size_t)ir * kk, bp + (size_t)jr * kk, c, (int)p->ldc, add,
                                      last ? &tail : NULL);
                            continue;
                        }
                        /* edge: full tile aside */
                        g->kernel(kk, ap + (size_t)ir * kk, bp + (size_t)jr * kk, tile, nr, 0, NULL);
                        mlc__gemm_edge(c, p->ldc, tile, nr, mm, nn, add);
                        if (last) mlc__gemm_epilogue(c, p->ldc, mm, nn, tail.bias, tail.row_bias, p->relu);
                    }
                }
            }
        }
    }
}

/* The product with kernel g, its operands' layout set up in p (all but the split) */
static void mlc__gemm_layout(mlc__gemm_job *p, const mlc__gemm_arch *g, int ta, int tb, int M, int N, int K,
                             const float *A, const float *B, float beta, float *C) {
    const size_t lda = ta ? (size_t)M : (size_t)K, ldb = tb ? (size_t)K : (size_t)N;
    p->g = g; p->M = M; p->N = N; p->K = K; p->A = A; p->B = B; p->beta = beta; p->C = C; p->ldc = (size_t)N;
    p->a_sx = ta ? 1 : lda; p->a_sk = ta ? lda : 1; p->b_sx = tb ? ldb : 1; p->b_sk = tb ? 1 : ldb;
    p->split_rows = 0; p->work = NULL; p->work_floats = 0;
    p->shared = NULL; p->shared_padded = p->shared_units = p->shared_floats = 0; p->shared_packed = NULL;
    p->a_packed = NULL; p->a_padded = 0; p->a_first = 0;
    p->bias = p->row_bias = NULL; p->relu = 0;
}

/* The extent of the operand the threads share (op(B) when they split rows, else op(A)) in p:
   rounded up to whole slivers (shared_padded) and its slivers over the slices of K
   (shared_units), as mlc__gemm_share packs it */
static void mlc__gemm_shared_extent(mlc__gemm_job *p) {
    const int w = p->split_rows ? p->g->nr : p->g->mr;
    int kc, mc;
    mlc__gemm_cut(p->g, p->M, p->K, &kc, &mc);
    p->shared_padded = (size_t)mlc__gemm_round_up(p->split_rows ? p->N : p->M, w);
    p->shared_units = p->shared_padded / (size_t)w * (size_t)((p->K + kc - 1) / kc);
}

/* Packs slivers [begin, end) of shared_units of the operand the threads share into p->shared,
   for mlc__parallel: slice pc of it (kk deep) at pc * shared_padded, sliver x (w wide) at x * kk
   within, the layout mlc__gemm_blocks packs one block in. Unit u: slice u / slivers, sliver
   u % slivers. */
static void mlc__gemm_share(void *arg, int slot, size_t begin, size_t end) {
    const mlc__gemm_job *p = (const mlc__gemm_job *)arg;
    const int w = p->split_rows ? p->g->nr : p->g->mr, extent = p->split_rows ? p->N : p->M;
    const size_t slivers = (size_t)(extent + w - 1) / (size_t)w, sx = p->split_rows ? p->b_sx : p->a_sx,
                 sk = p->split_rows ? p->b_sk : p->a_sk;
    const float *src = p->split_rows ? p->B : p->A;
    int kc, mc;
    size_t u;
    (void)slot;
    mlc__gemm_cut(p->g, p->M, p->K, &kc, &mc);
    for (u = begin; u < end; u++) {
        int pc = (int)(u / slivers) * kc, x = (int)(u % slivers) * w, kk = p->K - pc < kc ? p->K - pc : kc;
        mlc__gemm_pack((float *)p->shared + (size_t)pc * p->shared_padded + (size_t)x * kk,
                       src + (size_t)x * sx + (size_t)pc * sk, sx, sk, extent - x < w ? extent - x : w, kk,
                       w);
    }
}

/* Units [begin, end) of a product's rows (MR each) or columns (NR each), as a product of its
   own on this thread with the thread's share of the work, for mlc__parallel. Each thread packs
   its part of the operand it does not share, so the threads never wait for each other inside
   a product; a small shared operand it packs whole into a copy of its own in its first piece,
   so that its kernel reads none out of another core's cache, which is slow (bench/RESULTS.md). */
static void mlc__gemm_part(void *arg, int slot, size_t begin, size_t end) {
    mlc__gemm_job part = *(const mlc__gemm_job *)arg;
    int unit = part.split_rows ? part.g->mr : part.g->nr, from = (int)begin * unit,
        to = (int)end * unit;
    part.work += (size_t)slot * part.work_floats;
    if (part.shared && part.shared_packed) {
        part.shared += (size_t)slot * part.shared_floats;
        if (!part.shared_packed[slot]) {
            mlc__gemm_share(&part, slot, 0, part.shared_units);
            part.shared_packed[slot] = 1;
        }
    }
    if (part.split_rows) {
        if (to > part.M) to = part.M;
        part.A += (size_t)from * part.a_sx; part.C += (size_t)from * part.ldc; part.M = to - from;
        part.a_first += from;
        if (part.row_bias) part.row_bias += from;
    } else {
        if (to > part.N) to = part.N;
        part.B += (size_t)from * part.b_sx; part.C += from; part.N = to - from;
        if (part.bias) part.bias += from;
    }
    mlc__gemm_blocks(&part);                           /* (the epilogue tile by tile) */
}

/* op(A) of a product of M rows, K deep (ta: A transposed), packed whole beforehand for the
   kernel mlc__gemm_pick(M) gives, laid out as a shared A (mlc__gemm_share): products that
   multiply by the same A again (a convolution's weight, over its images and, in inference,
   between calls) take it through mlc__gemm_then instead of packing it every time.
   mlc__gemm_a_floats(M, K) floats; the threads pack it together. */
static size_t mlc__gemm_a_floats(int M, int K) {
    return (size_t)mlc__gemm_round_up(M, mlc__gemm_pick(M)->mr) * (size_t)K;
}
static void mlc__gemm_pack_a(mlc_ctx *ctx, int ta, int M, int K, const float *A, float *packed) {
    mlc__gemm_job job;
    mlc__gemm_layout(&job, mlc__gemm_pick(M), ta, 0, M, 1, K, A, NULL, 0.0f, NULL);   /* (split_rows 0) */
    mlc__gemm_shared_extent(&job);
    job.shared = packed;
    mlc__parallel(ctx, job.shared_units, 2, mlc__gemm_share, &job);
}

/* Products with few rows of C, without packing. With M <= 4 each value of op(B) serves at most
   four rows, less than packing it costs (batch-1 inference: linear is x Wᵀ with M = 1), so
   op(B) is read where it lies; columns of C are shared out between threads:
     B stored [N, K] (tb):  C[i, j] += op(A) row i · B row j      dot products of two rows
     B stored [K, N]:       C row i += Σ_k op(A)[i, k] B row k    rows of B scaled and summed
   The same loops serve any M when they are short: dot products for N <= 4 (the tiny MLP's
   output layer), sums of K <= 4 rows (its gradient back through that layer). */
enum { MLC__GEMM_DIRECT_ROWS = 4, MLC__GEMM_DOT_CHUNK = 256 };

typedef struct mlc__gemm_direct_job {
    int ta, tb, M, N, K;
    const float *A, *B;
    float *C;
} mlc__gemm_direct_job;

#if MLC__X86
/* mlc__gemm_dot4 with 8-float FMAs (the four sums are added across their lanes at the end) */
__attribute__((target("avx2,fma")))
static void mlc__gemm_dot4_avx2(int K, const float *a, const float *b, size_t ldb, float *c) {
    __m256 s0 = _mm256_setzero_ps(), s1 = s0, s2 = s0, s3 = s0, ak, h;
    __m128 sums;
    float tail[4];
    int k, r;
    for (k = 0; k + 8 <= K; k += 8) {
        ak = _mm256_loadu_ps(a + k);
        s0 = _mm256_fmadd_ps(ak, _mm256_loadu_ps(b + k), s0);
        s1 = _mm256_fmadd_ps(ak, _mm256_loadu_ps(b + ldb + k), s1);
        s2 = _mm256_fmadd_ps(ak, _mm256_loadu_ps(b + 2 * ldb + k), s2);
        s3 = _mm256_fmadd_ps(ak, _mm256_loadu_ps(b + 3 * ldb + k), s3);
    }
    h = _mm256_hadd_ps(_mm256_hadd_ps(s0, s1), _mm256_hadd_ps(s2, s3));   /* per half: s0, s1, s2, s3 */
    sums = _mm_add_ps(_mm256_castps256_ps128(h), _mm256_extractf128_ps(h, 1));
    _mm_storeu_ps(tail, sums);
    for (r = 0; r < 4; r++) {
        const float *br = b + (size_t)r * ldb;
        int t;
        for (t = k; t < K; t++) tail[r] += a[t] * br[t];
        c[r] += tail[r];
    }
}
#endif

/* c[r] += a · b_r for the rows b_r = b + r ldb, r < 4 */
static void mlc__gemm_dot4(int K, const float *MLC__RESTRICT a, const float *MLC__RESTRICT b, size_t ldb,
                           float *MLC__RESTRICT c) {
    const float *b0 = b, *b1 = b + ldb, *b2 = b + 2 * ldb, *b3 = b + 3 * ldb;
    float s0 = 0.0f, s1 = 0.0f, s2 = 0.0f, s3 = 0.0f;
    int k;
#if MLC__X86
    if (mlc__cpu_avx2()) { mlc__gemm_dot4_avx2(K, a, b, ldb, c); return; }
#endif
    MLC__OMP(omp simd reduction(+:s0, s1, s2, s3))
    for (k = 0; k < K; k++) {
        s0 += a[k] * b0[k];
        s1 += a[k] * b1[k];
        s2 += a[k] * b2[k];
        s3 += a[k] * b3[k];
    }
    c[0] += s0; c[1] += s1; c[2] += s2; c[3] += s3;
}

#if MLC__X86
/* mlc__gemm_dot with 8-float FMAs, the lanes added at the end */
__attribute__((target("avx2,fma")))
static float mlc__gemm_dot_avx2(int K, const float *a, const float *b) {
    __m256 s = _mm256_setzero_ps();
    __m128 h;
    float sum;
    int k;
    for (k = 0; k + 8 <= K; k += 8) s = _mm256_fmadd_ps(_mm256_loadu_ps(a + k), _mm256_loadu_ps(b + k), s);
    h = _mm_add_ps(_mm256_castps256_ps128(s), _mm256_extractf128_ps(s, 1));
    h = _mm_add_ps(h, _mm_movehl_ps(h, h));
    sum = _mm_cvtss_f32(_mm_add_ss(h, _mm_shuffle_ps(h, h, 1)));
    for (; k < K; k++) sum += a[k] * b[k];
    return sum;
}
#endif

static float mlc__gemm_dot(int K, const float *MLC__RESTRICT a, const float *MLC__RESTRICT b) {
    float s = 0.0f;
    int k;
#if MLC__X86
    if (mlc__cpu_avx2()) return mlc__gemm_dot_avx2(K, a, b);
#endif
    MLC__OMP(omp simd reduction(+:s))
    for (k = 0; k < K; k++) s += a[k] * b[k];
    return s;
}

/* c += a0 b0 + a1 b1 + a2 b2 + a3 b3 over n floats (rows b_r = b + r ldb): C read once for four rows of B */
static void mlc__gemm_axpy4(size_t n, const float *a, const float *MLC__RESTRICT b, size_t ldb,
                            float *MLC__RESTRICT c) {
    const float *b0 = b, *b1 = b + ldb, *b2 = b + 2 * ldb, *b3 = b + 3 * ldb, a0 = a[0], a1 = a[1], a2 = a[2],
                a3 = a[3];
    size_t j;
    MLC__OMP(omp simd)
    for (j = 0; j < n; j++) c[j] += a0 * b0[j] + a1 * b1[j] + a2 * b2[j] + a3 * b3[j];
}

/* Columns [begin, end) of C (already scaled by beta), for mlc__parallel. */
static void mlc__gemm_direct_slice(void *job, int slot, size_t begin, size_t end) {
    const mlc__gemm_direct_job *d = (const mlc__gemm_direct_job *)job;
    const int M = d->M, N = d->N, K = d->K, j0 = (int)begin, j1 = (int)end;
    int i, j, k, k0;
    (void)slot;
    if (!d->tb) {
        for (i = 0; i < M; i++)
            for (k = 0; k < K; k += 4) {
                float a[4];
                int r, rows = K - k < 4 ? K - k : 4;
                for (r = 0; r < 4; r++)
                    a[r] = r >= rows ? 0.0f
                           : d->ta   ? d->A[(size_t)(k + r) * M + i]
                                     : d->A[(size_t)i * K + k + r];
                if (rows == 4)
                    mlc__gemm_axpy4((size_t)(j1 - j0), a, d->B + (size_t)k * N + j0, (size_t)N,
                                    d->C + (size_t)i * N + j0);
                else
                    for (r = 0; r < rows; r++)
                        mlc__axpy((size_t)(j1 - j0), a[r], d->B + (size_t)(k + r) * N + j0,
                                  d->C + (size_t)i * N + j0);
            }
        return;
    }
    for (i = 0; i < M; i++)
        /* op(A)'s row in pieces, gathered when A is transposed */
        for (k0 = 0; k0 < K; k0 += MLC__GEMM_DOT_CHUNK) {
            float row[MLC__GEMM_DOT_CHUNK], *c = d->C + (size_t)i * N;
            const float *a = d->A + (size_t)i * K + k0;
            int kk = K - k0 < MLC__GEMM_DOT_CHUNK ? K - k0 : MLC__GEMM_DOT_CHUNK;
            if (d->ta) { for (k = 0; k < kk; k++) row[k] = d->A[(size_t)(k0 + k) * M + i]; a = row; }
            for (j = j0; j + 4 <= j1; j += 4)
                mlc__gemm_dot4(kk, a, d->B + (size_t)j * K + k0, (size_t)K, c + j);
            for (; j < j1; j++) c[j] += mlc__gemm_dot(kk, a, d->B + (size_t)j * K + k0);
        }
}

static void mlc__gemm_direct(mlc_ctx *ctx, int ta, int tb, int M, int N, int K, const float *A,
                             const float *B, float beta, float *C) {
    mlc__gemm_direct_job d;
    if (N == 1 && M > 1) {                 /* C [M, 1] is also Cᵀ [1, M] = op(B)ᵀ op(A)ᵀ: one row */
        mlc__gemm_direct(ctx, !tb, !ta, 1, M, K, B, A, beta, C);
        return;
    }
    if (beta == 0.0f) memset(C, 0, (size_t)M * N * sizeof(float));
    d.ta = ta; d.tb = tb; d.M = M; d.N = N; d.K = K; d.A = A; d.B = B; d.C = C;
    mlc__parallel(ctx, (size_t)N, (size_t)(MLC__GEMM_PARALLEL / ((long long)M * K + 1)) + 1,
                  mlc__gemm_direct_slice, &d);
}

/* M·N·K < limit, in integers (a float-only FPU has no double), for M, N > 0 */
static int mlc__product_below(int M, int N, int K, long long limit) {
    return K <= 0 || (long long)M * N < (limit + K - 1) / K;
}

#if MLC__BF16_X86
/* bfloat16 products on AVX-512 BF16 (mlc_gemm_bf16; matmul and linear on bf16 tensors):
     C[M,N] = op(A) op(B) + beta C     A, B bf16, C float32, sums in float32
   The scheme above on vdpbf16ps, which adds to each of 16 float lanes the dot product of a
   *pair* of bf16 values from each source, a[2j] b[2j] + a[2j+1] b[2j+1]; so packing
   interleaves pairs of k, and a sliver holds 32-bit words:
     A sliver (MR rows):    word [p*MR + i] = op(A)[i, 2p] | op(A)[i, 2p+1] << 16
     B sliver (NR columns): word [p*NR + j] = op(B)[2p, j] | op(B)[2p+1, j] << 16
   The micro-kernel broadcasts row i's word of A against two vectors of B (16 columns' pairs
   each) per pair of k: twice the multiply-adds of a float32 FMA per instruction, from half the
   bytes. An odd K pads the last pair with zero in both operands. bf16 halves the bytes, so KC
   is twice the float32 kernels'. K is cut into slices by its size alone, and every value of C
   is one lane's sums over them in order, so no split of C between threads changes a bit. */
enum { MLC__BF16_MR_MAX = 12, MLC__BF16_NR = 32 };

/* micro-kernel: C[mr, 32] (row stride ldc) = (add ? C : 0) + the sums over kp pairs of k of
   a[p*mr + i] and b[p*32 + j] (packed as above) */
typedef void (*mlc__bf16_kernel_fn)(int kp, const uint32_t *a, const uint32_t *b, float *c, int ldc, int add);
typedef struct mlc__bf16_arch { mlc__bf16_kernel_fn kernel; int mr, nr, mc, kc, nc; } mlc__bf16_arch;

#define MLC__BF16_TARGET "avx512f,avx512bw,avx512vl,avx512bf16"
/* rows x 32 (rows <= 12, a constant where it is inlined): 2·rows accumulators; per pair of k
   two B loads, then `rows` broadcasts of a word of A, each against both */
__attribute__((target(MLC__BF16_TARGET), always_inline))
static inline void mlc__bf16_tile(int rows, int kp, const uint32_t *a, const uint32_t *b, float *c, int ldc,
                                  int add) {
    __m512 acc[MLC__BF16_MR_MAX][2];
    int i, p;
    MLC__FOR_ROWS(i, rows) acc[i][0] = acc[i][1] = _mm512_setzero_ps();
    for (p = 0; p < kp; p++, a += rows, b += 32) {
        const __m512bh b0 = (__m512bh)_mm512_loadu_si512(b), b1 = (__m512bh)_mm512_loadu_si512(b + 16);
        MLC__FOR_ROWS(i, rows) {
            const __m512bh ai = (__m512bh)_mm512_set1_epi32((int)a[i]);
            acc[i][0] = _mm512_dpbf16_ps(acc[i][0], ai, b0);
            acc[i][1] = _mm512_dpbf16_ps(acc[i][1], ai, b1);
        }
    }
    _Pragma("GCC unroll 12") for (i = 0; i < rows; i++, c += ldc) {
        if (add) {
            acc[i][0] = _mm512_add_ps(acc[i][0], _mm512_loadu_ps(c));
            acc[i][1] = _mm512_add_ps(acc[i][1], _mm512_loadu_ps(c + 16));
        }
        _mm512_storeu_ps(c, acc[i][0]);
        _mm512_storeu_ps(c + 16, acc[i][1]);
    }
}
/* 12 x 32, and 8 x 32 where 8 divides M with fewer padded rows (as mlc__gemm_pick) */
__attribute__((target(MLC__BF16_TARGET)))
static void mlc__bf16_kernel_12(int kp, const uint32_t *a, const uint32_t *b, float *c, int ldc, int add) {
    mlc__bf16_tile(12, kp, a, b, c, ldc, add);
}
__attribute__((target(MLC__BF16_TARGET)))
static void mlc__bf16_kernel_8(int kp, const uint32_t *a, const uint32_t *b, float *c, int ldc, int add) {
    mlc__bf16_tile(8, kp, a, b, c, ldc, add);
}
/* block sizes in bf16 values of k (kc even): a KC x NR sliver of B in L1, MC x KC of A in L2 */
static const mlc__bf16_arch mlc__bf16_12 = { mlc__bf16_kernel_12, 12, 32, 192, 512, 2048 };
static const mlc__bf16_arch mlc__bf16_8 = { mlc__bf16_kernel_8, 8, 32, 192, 512, 2048 };
static const mlc__bf16_arch *mlc__bf16_pick(int M) {
    return mlc__gemm_round_up(M, 8) < mlc__gemm_round_up(M, 12) ? &mlc__bf16_8 : &mlc__bf16_12;
}

/* GCC 12 as C++ at -O2 reads its own AVX-512 unpack intrinsics' placeholder operand as "may be used
   uninitialized"; the transposes below are where it says so (popped after mlc__bf16_pack). */
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif

/* v[c] = column c of the 16 x 16 matrix of 32-bit words whose row r is v[r] */
__attribute__((target(MLC__BF16_TARGET), always_inline))
static inline void mlc__bf16_transpose16(__m512i v[16]) {
    __m512i t[16], u[16];
    int r, j;
    _Pragma("GCC unroll 8") for (r = 0; r < 16; r += 2) {          /* pairs of rows, words interleaved */
        t[r] = _mm512_unpacklo_epi32(v[r], v[r + 1]);
        t[r + 1] = _mm512_unpackhi_epi32(v[r], v[r + 1]);
    }
    _Pragma("GCC unroll 4") for (r = 0; r < 16; r += 4) {          /* u[r + j]: word j of each 128-bit */
        u[r] = _mm512_unpacklo_epi64(t[r], t[r + 2]);             /* lane, rows r..r+3 */
        u[r + 1] = _mm512_unpackhi_epi64(t[r], t[r + 2]);
        u[r + 2] = _mm512_unpacklo_epi64(t[r + 1], t[r + 3]);
        u[r + 3] = _mm512_unpackhi_epi64(t[r + 1], t[r + 3]);
    }
    _Pragma("GCC unroll 4") for (j = 0; j < 4; j++) {              /* gather lane l of the four groups */
        const __m512i a0 = _mm512_shuffle_i32x4(u[j], u[4 + j], 0x88),
                      a1 = _mm512_shuffle_i32x4(u[j], u[4 + j], 0xdd),
                      b0 = _mm512_shuffle_i32x4(u[8 + j], u[12 + j], 0x88),
                      b1 = _mm512_shuffle_i32x4(u[8 + j], u[12 + j], 0xdd);
        v[j] = _mm512_shuffle_i32x4(a0, b0, 0x88);
        v[8 + j] = _mm512_shuffle_i32x4(a0, b0, 0xdd);
        v[4 + j] = _mm512_shuffle_i32x4(a1, b1, 0x88);
        v[12 + j] = _mm512_shuffle_i32x4(a1, b1, 0xdd);
    }
}

/* Two rows of 32 bf16 values r0, r1 as the 32 words r0[x] | r1[x] << 16: x < 16 in lo, the rest
   in hi (two vpermt2w) */
__attribute__((target(MLC__BF16_TARGET), always_inline))
static inline void mlc__bf16_pairs(__m512i r0, __m512i r1, __m512i *lo, __m512i *hi) {
    const __m512i first = _mm512_set_epi16(47, 15, 46, 14, 45, 13, 44, 12, 43, 11, 42, 10, 41, 9, 40, 8,
                                           39, 7, 38, 6, 37, 5, 36, 4, 35, 3, 34, 2, 33, 1, 32, 0);
    *lo = _mm512_permutex2var_epi16(r0, first, r1);
    *hi = _mm512_permutex2var_epi16(r0, _mm512_add_epi16(first, _mm512_set1_epi16(16)), r1);
}

/* Packs one sliver: dst[p*w + x] = the pair (src[x*sx + 2p*sk], src[x*sx + (2p+1)*sk]) for
   x < m and p < (kc+1)/2; zero for m <= x < w and for the missing half of an odd kc's last
   pair. One of sx, sk is 1. Where x runs along contiguous values (sx = 1: B as stored, or Aᵀ),
   32 values of rows 2p and 2p+1 are interleaved by two vpermt2w; where k does (sk = 1: A as
   stored, or Bᵀ), each pair is already a 32-bit word, and 16 rows x 16 pairs are transposed as
   words in registers. Edges are masked loads of zeros; a sliver narrower than 16 (w = 12, 8)
   is written through a store mask. */
__attribute__((target(MLC__BF16_TARGET)))
static void mlc__bf16_pack(uint32_t *dst, const uint16_t *src, size_t sx, size_t sk, int m, int kc, int w) {
    const int pairs = kc / 2, kp = (kc + 1) / 2;
    int p, x;
    if (sx == 1) {
        for (x = 0; x < w; x += 32) {
            const __mmask32 in = m - x >= 32 ? 0xffffffffu
                                 : m - x <= 0 ? 0u : (__mmask32)((1u << (m - x)) - 1);
            const __mmask16 out0 = w - x >= 16 ? 0xffff : (__mmask16)((1u << (w - x)) - 1),
                            out1 = w - x >= 32 ? 0xffff
                                   : w - x <= 16 ? 0 : (__mmask16)((1u << (w - x - 16)) - 1);
            for (p = 0; p < kp; p++) {
                const uint16_t *s0 = src + (size_t)2 * p * sk + x;
                uint32_t *d = dst + (size_t)p * w + x;
                const __m512i r0 = _mm512_maskz_loadu_epi16(in, s0),
                              r1 = p < pairs ? _mm512_maskz_loadu_epi16(in, s0 + sk) : _mm512_setzero_si512();
                __m512i lo, hi;
                mlc__bf16_pairs(r0, r1, &lo, &hi);
                _mm512_mask_storeu_epi32(d, out0, lo);
                _mm512_mask_storeu_epi32(d + 16, out1, hi);
            }
        }
        return;
    }
    for (x = 0; x < w; x += 16) {
        const __mmask16 out = w - x >= 16 ? 0xffff : (__mmask16)((1u << (w - x)) - 1);
        int p0, r;
        for (p0 = 0; p0 < kp; p0 += 16) {
            const int nk = kc - 2 * p0 < 32 ? kc - 2 * p0 : 32, np = (nk + 1) / 2;   /* values, pairs */
            const __mmask32 in = nk == 32 ? 0xffffffffu : (__mmask32)((1u << nk) - 1);
            __m512i v[16];
            _Pragma("GCC unroll 16") for (r = 0; r < 16; r++)
                v[r] = x + r < m ? _mm512_maskz_loadu_epi16(in, src + (size_t)(x + r) * sx + 2 * p0)
                                 : _mm512_setzero_si512();
            mlc__bf16_transpose16(v);
            for (p = 0; p < np; p++) _mm512_mask_storeu_epi32(dst + (size_t)(p0 + p) * w + x, out, v[p]);
        }
    }
}
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic pop
#endif

typedef struct mlc__bf16_job {          /* one product, or a block of its rows or columns */
    const mlc__bf16_arch *g;
    int M, N, K, kc;                    /* kc: the depth of K's slices (even), the same in every part */
    const uint16_t *A, *B;
    /* op(A)[i, k] = A[i*a_sx + k*a_sk], op(B)[k, j] = B[k*b_sk + j*b_sx], C[i, j] = C[i*ldc + j] */
    size_t a_sx, a_sk, b_sx, b_sk, ldc;
    float beta, *C;
    int split_rows;                     /* threads share: 1 rows of C (MR at a time), 0 columns (NR) */
    uint32_t *work;                     /* per slot: one B panel then one A block, work_words in all */
    size_t work_words;
    uint32_t *shared;                   /* with threads, the operand every part reads whole, packed
                                           once by all first (op(B) when they share rows, op(A)
                                           columns): slice pc at (pc/2)·padded, sliver x at x·kp
                                           within it; NULL: a part packs its blocks */
    size_t padded;                      /* its extent (N or M) rounded up to whole slivers */
    const float *bias;                  /* each part's epilogue, as mlc__gemm_part's (NULL, 0: none), */
    int relu;
    uint16_t *half;                     /* then its C rounded into half (NULL: C is the result) */
} mlc__bf16_job;

/* the words of one packed B panel of N columns, and of one A block of M rows, kc deep, each a
   whole number of 64-byte lines */
static size_t mlc__bf16_panel_words(const mlc__bf16_arch *g, int N, int kc) {
    return ((size_t)mlc__gemm_round_up(N < g->nc ? N : g->nc, g->nr) * (size_t)(kc / 2) + 15) / 16 * 16;
}
static size_t mlc__bf16_block_words(const mlc__bf16_arch *g, int M, int kc) {
    return ((size_t)mlc__gemm_round_up(M < g->mc ? M : g->mc, g->mr) * (size_t)(kc / 2) + 15) / 16 * 16;
}

/* The loops over blocks, as mlc__gemm_blocks: for each panel of B (packed, or the shared
   copy's), each block of A (likewise), the kernel over the tiles of C; an edge tile runs in
   full aside. */
static void mlc__bf16_blocks(const mlc__bf16_job *p, uint32_t *work) {
    const mlc__bf16_arch *g = p->g;
    const int mr = g->mr, nr = g->nr, M = p->M, N = p->N, K = p->K, kc = p->kc,
              mblocks = (M + g->mc - 1) / g->mc, mc = mlc__gemm_round_up((M + mblocks - 1) / mblocks, mr);
    const uint32_t *shared_b = p->split_rows ? p->shared : NULL, *shared_a = p->split_rows ? NULL : p->shared;
    uint32_t *block = work + mlc__bf16_panel_words(g, N, kc);
    int jc, pc;
    for (jc = 0; jc < N; jc += g->nc) {
        const int nc = N - jc < g->nc ? N - jc : g->nc;
        for (pc = 0; pc < K; pc += kc) {
            const int kk = K - pc < kc ? K - pc : kc, kp = (kk + 1) / 2, add = pc > 0 || p->beta != 0.0f;
            const size_t slice = (size_t)(pc / 2) * p->padded;
            const uint32_t *bp = shared_b ? shared_b + slice + (size_t)jc * kp : work;
            int jr, ic;
            for (jr = 0; jr < nc && !shared_b; jr += nr)
                mlc__bf16_pack(work + (size_t)jr * kp,
                               p->B + (size_t)pc * p->b_sk + (size_t)(jc + jr) * p->b_sx, p->b_sx,
                               p->b_sk, nc - jr < nr ? nc - jr : nr, kk, nr);
            for (ic = 0; ic < M; ic += mc) {
                const int m = M - ic < mc ? M - ic : mc;
                const uint32_t *ap = shared_a ? shared_a + slice + (size_t)ic * kp : block;
                int ir;
                for (ir = 0; ir < m && !shared_a; ir += mr)
                    mlc__bf16_pack(block + (size_t)ir * kp,
                                   p->A + (size_t)(ic + ir) * p->a_sx + (size_t)pc * p->a_sk, p->a_sx,
                                   p->a_sk, m - ir < mr ? m - ir : mr, kk, mr);
                for (jr = 0; jr < nc; jr += nr)
                    for (ir = 0; ir < m; ir += mr) {
                        float *c = p->C + (size_t)(ic + ir) * p->ldc + jc + jr,
                              tile[MLC__BF16_MR_MAX * MLC__BF16_NR];
                        const int mm = m - ir < mr ? m - ir : mr, nn = nc - jr < nr ? nc - jr : nr;
                        if (mm == mr && nn == nr) {
                            g->kernel(kp, ap + (size_t)ir * kp, bp + (size_t)jr * kp, c, (int)p->ldc, add);
                            continue;
                        }
                        g->kernel(kp, ap + (size_t)ir * kp, bp + (size_t)jr * kp, tile, nr, 0);
                        mlc__gemm_edge(c, p->ldc, tile, nr, mm, nn, add);
                    }
            }
        }
    }
}

/* Packs slivers [begin, end) of the shared operand into p->shared, for mlc__parallel (unit u:
   slice u / slivers, sliver u % slivers) */
static void mlc__bf16_share(void *arg, int slot, size_t begin, size_t end) {
    const mlc__bf16_job *p = (const mlc__bf16_job *)arg;
    const int w = p->split_rows ? p->g->nr : p->g->mr, extent = p->split_rows ? p->N : p->M;
    const size_t slivers = p->padded / (size_t)w, sx = p->split_rows ? p->b_sx : p->a_sx,
                 sk = p->split_rows ? p->b_sk : p->a_sk;
    const uint16_t *src = p->split_rows ? p->B : p->A;
    size_t u;
    (void)slot;
    for (u = begin; u < end; u++) {
        const int pc = (int)(u / slivers) * p->kc, x = (int)(u % slivers) * w,
                  kk = p->K - pc < p->kc ? p->K - pc : p->kc;
        mlc__bf16_pack(p->shared + (size_t)(pc / 2) * p->padded + (size_t)x * (size_t)((kk + 1) / 2),
                       src + (size_t)x * sx + (size_t)pc * sk, sx, sk, extent - x < w ? extent - x : w, kk,
                       w);
    }
}

/* Units [begin, end) of the product's rows (MR each) or columns (NR each), for mlc__parallel:
   the product, then the epilogue and the rounding, of that part of C on this thread */
static void mlc__bf16_part(void *arg, int slot, size_t begin, size_t end) {
    mlc__bf16_job part = *(const mlc__bf16_job *)arg;
    const int unit = part.split_rows ? part.g->mr : part.g->nr, from = (int)begin * unit;
    int to = (int)end * unit, i;
    if (part.split_rows) {
        if (to > part.M) to = part.M;
        part.A += (size_t)from * part.a_sx; part.C += (size_t)from * part.ldc; part.M = to - from;
        if (part.half) part.half += (size_t)from * part.ldc;
    } else {
        if (to > part.N) to = part.N;
        part.B += (size_t)from * part.b_sx; part.C += from; part.N = to - from;
        if (part.half) part.half += from;
        if (part.bias) part.bias += from;
    }
    mlc__bf16_blocks(&part, part.work + (size_t)slot * part.work_words);
    mlc__gemm_epilogue(part.C, part.ldc, part.M, part.N, part.bias, NULL, part.relu);
    for (i = 0; part.half && i < part.M; i++)
        mlc__narrow(MLC_BF16, part.C + (size_t)i * part.ldc, part.half + (size_t)i * part.ldc,
                    (size_t)part.N);
}

/* The product on the kernel (M, N, K >= 1): the threads share C's rows, or its columns when it
   has more of those in tiles, each packing its own part of that operand; with several threads
   the other operand is packed once, by all, first. Workspace from the arena, released at once;
   out of memory: the error is set and C is left. */
static void mlc__bf16_gemm_kernel(mlc_ctx *ctx, int ta, int tb, int M, int N, int K, const uint16_t *A,
                                  const uint16_t *B, float beta, float *C, const float *bias, int relu,
                                  uint16_t *half) {
    const mlc__bf16_arch *g = mlc__bf16_pick(M);
    const int rows = (M + g->mr - 1) / g->mr, cols = (N + g->nr - 1) / g->nr,
              kblocks = (K + g->kc - 1) / g->kc;
    const size_t lda = ta ? (size_t)M : (size_t)K, ldb = tb ? (size_t)K : (size_t)N,
                 from = mlc__product_below(M, N, K, MLC__GEMM_PARALLEL) ? (size_t)-1 : 2;
    mlc_frame scratch = mlc_frame_begin(ctx);
    mlc__bf16_job job;
    size_t units;
    int slots, per;
    job.g = g; job.M = M; job.N = N; job.K = K; job.A = A; job.B = B; job.beta = beta; job.C = C;
    job.kc = mlc__gemm_round_up((K + kblocks - 1) / kblocks, 2);          /* equal even slices */
    job.a_sx = ta ? 1 : lda; job.a_sk = ta ? lda : 1; job.b_sx = tb ? ldb : 1; job.b_sk = tb ? 1 : ldb;
    job.ldc = (size_t)N; job.bias = bias; job.relu = relu; job.half = half;
    job.split_rows = rows >= cols;
    units = (size_t)(job.split_rows ? rows : cols);
    slots = mlc__slots(ctx, units, from);
    per = (int)((units + (size_t)mlc__pieces(units, slots) - 1) / (size_t)mlc__pieces(units, slots));
    job.work_words = mlc__bf16_panel_words(g, job.split_rows ? N : per * g->nr, job.kc)
                     + mlc__bf16_block_words(g, job.split_rows ? per * g->mr : M, job.kc);
    job.work = (uint32_t *)mlc__arena_alloc(ctx, job.work_words * (size_t)slots * sizeof(uint32_t),
                                            "mlc_gemm_bf16");
    job.shared = NULL;
    job.padded = (size_t)(job.split_rows ? cols * g->nr : rows * g->mr);
    if (job.work && slots > 1) {
        const size_t slices = (size_t)((K + job.kc - 1) / job.kc),
                     slivers = job.padded / (size_t)(job.split_rows ? g->nr : g->mr);
        job.shared = (uint32_t *)mlc__arena_alloc(ctx, job.padded * slices * (size_t)(job.kc / 2)
                                                  * sizeof(uint32_t), "mlc_gemm_bf16");
        if (job.shared) mlc__parallel(ctx, slivers * slices, 2, mlc__bf16_share, &job);
    }
    if (job.work && (slots == 1 || job.shared)) mlc__parallel(ctx, units, from, mlc__bf16_part, &job);
    mlc_frame_end(scratch);
}
#endif

#endif /* !MLC_USE_CBLAS */

#ifndef MLC_USE_CBLAS
/* Whether mlc__gemm_then multiplies on mlc's packed kernels, which take a packed op(A)
   (with_work: on one thread of a caller's, with packing space of its own) */
static int mlc__gemm_packs(const mlc_ctx *ctx, int tb, int M, int N, int K, int with_work) {
    return !ctx->config.gemm && !mlc__product_below(M, N, K, MLC__GEMM_SMALL) && M > MLC__GEMM_DIRECT_ROWS
           && (tb ? N : K) > MLC__GEMM_DIRECT_ROWS && (with_work || !ctx->config.arena);
}
#endif

/* mlc_gemm, and with `work` the product of one thread of a caller that runs several at once
   (conv2d over images): on this thread only, packing into work (mlc__gemm_work floats), as
   the arena is not for threads. Then the epilogue (mlc__gemm_epilogue: bias, row_bias, relu),
   tile by tile as the packed product finishes each, else after the product. a_packed: op(A)
   as mlc__gemm_pack_a packs it, taken when the product runs on the packed kernels (else NULL). */
static void mlc__gemm_then(mlc_ctx *ctx, int ta, int tb, int M, int N, int K, const float *A, const float *B,
                           float beta, float *C, float *work, const float *bias, const float *row_bias,
                           int relu, const float *a_packed) {
    if (M <= 0 || N <= 0) return;
    if (ctx->config.gemm) ctx->config.gemm(ta, tb, M, N, K, A, B, beta, C, ctx->config.gemm_user);
#ifdef MLC_USE_CBLAS
    else
        cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans, M, N, K,
                    1.0f, A, ta ? M : K, B, tb ? K : N, beta, C, N);
    (void)work; (void)a_packed;
#else
    else if (mlc__product_below(M, N, K, MLC__GEMM_SMALL))   /* too small to repay any setting up */
        mlc_gemm_reference(ta, tb, M, N, K, A, B, beta, C);
    else if (!mlc__gemm_packs(ctx, tb, M, N, K, work != NULL))   /* (few rows; a fixed arena: no
                                                                    packing workspace) */
        mlc__gemm_direct(ctx, ta, tb, M, N, K, A, B, beta, C);
    else {
        mlc__gemm_job job;
        mlc__gemm_layout(&job, mlc__gemm_pick(M), ta, tb, M, N, K, A, B, beta, C);
        job.bias = bias; job.row_bias = row_bias; job.relu = relu;
        job.a_packed = a_packed;
        job.a_padded = (size_t)mlc__gemm_round_up(M, job.g->mr);
        if (work) { job.work = work; mlc__gemm_blocks(&job); return; }
        else {  /* the threads share the rows of C, or its columns when op(B) is the largest matrix,
                   so that each thread keeps to one part of the largest (and of a weight: the rows of
                   W in x Wᵀ, and of its gradient dYᵀ X, which the optimiser then shares out the same
                   way); the packing workspace is arena scratch, released at once (the arena keeps
                   the block) */
            const int mr = job.g->mr, nr = job.g->nr, rows = (M + mr - 1) / mr, cols = (N + nr - 1) / nr;
            const long long a = (long long)M * K, b = (long long)K * N, c = (long long)M * N;
            size_t units, from = mlc__product_below(M, N, K, MLC__GEMM_PARALLEL) ? (size_t)-1 : 2;
            int slots, pieces, per;
            unsigned char shared_packed[MLC__MAX_THREADS];
            mlc_frame scratch = mlc_frame_begin(ctx);
            job.split_rows = rows > 1 && (cols < 2 || b < a || b < c);
            units = (size_t)(job.split_rows ? rows : cols);
            slots = mlc__slots(ctx, units, from);
            pieces = mlc__pieces(units, slots);
            per = (int)((units + (size_t)pieces - 1) / (size_t)pieces);    /* units a piece, at most */
            job.work_floats = mlc__gemm_work_floats(job.g, job.split_rows ? per * mr : M,
                                                    job.split_rows ? N : per * nr, K);
            job.work = mlc__floats(ctx, job.work_floats * (size_t)slots, "mlc_gemm");
            if (slots > 1 && (job.split_rows || !a_packed)) {
                                /* the operand every thread reads whole (unless packed already): a
                                   copy for each thread when it is small, else one that all threads
                                   pack together first (copies of a large one gain no speed and cost
                                   memory) */
                size_t copy;
                mlc__gemm_shared_extent(&job);
                copy = (job.shared_padded * (size_t)K + 15) / 16 * 16;     /* whole 64-byte lines */
                if (copy <= MLC__GEMM_COPY_MAX) {
                    job.shared = mlc__floats(ctx, copy * (size_t)slots, "mlc_gemm");
                    job.shared_floats = copy;
                    job.shared_packed = (unsigned char *)memset(shared_packed, 0, (size_t)slots);
                } else if (copy <= MLC__GEMM_SHARED_MAX && (job.shared = mlc__floats(ctx, copy, "mlc_gemm")))
                    mlc__parallel(ctx, job.shared_units, 2, mlc__gemm_share, &job);
            }
            if (job.work) mlc__parallel(ctx, units, from, mlc__gemm_part, &job);
            else mlc_gemm_reference(ta, tb, M, N, K, A, B, beta, C);   /* out of memory: still right */
            mlc_frame_end(scratch);
            if (job.work) return;       /* the parts applied the epilogue */
        }
    }
#endif
    mlc__gemm_epilogue(C, (size_t)N, M, N, bias, row_bias, relu);
}

static void mlc__gemm(mlc_ctx *ctx, int ta, int tb, int M, int N, int K, const float *A, const float *B,
                      float beta, float *C, float *work) {
    mlc__gemm_then(ctx, ta, tb, M, N, K, A, B, beta, C, work, NULL, NULL, 0, NULL);
}

MLCDEF void mlc_gemm(mlc_ctx *ctx, int ta, int tb, int M, int N, int K, const float *A, const float *B,
                     float beta, float *C) {
    if (!ctx || ctx->error) return;
    if (M < 0 || N < 0 || K < 0 || (beta != 0.0f && beta != 1.0f) || (M && N && (!C || (K && (!A || !B))))) {
        mlc__fail(ctx, MLC_ERR_ARG, "mlc_gemm: M %d, N %d, K %d, beta %g or a NULL matrix is not valid",
                  M, N, K, (double)beta);
        return;
    }
    mlc__gemm(ctx, ta, tb, M, N, K, A, B, beta, C, NULL);
}

/* Whether products of bf16 matrices run on mlc's bf16 kernel: x86-64 with AVX-512 BF16, and no
   gemm hook to take them */
static int mlc__bf16_kernel_usable(const mlc_ctx *ctx) {
#if MLC__BF16_X86
    return !ctx->config.gemm && __builtin_cpu_supports("avx512bf16");
#else
    (void)ctx;
    return 0;
#endif
}

/* mlc_gemm_bf16, then linear's epilogue (bias on every row, relu) and, with half, C rounded
   into half: on the kernel where it runs, else on float32 copies of A and B (arena scratch)
   through mlc__gemm_then */
static void mlc__gemm_bf16_then(mlc_ctx *ctx, int ta, int tb, int M, int N, int K, const uint16_t *A,
                                const uint16_t *B, float beta, float *C, const float *bias, int relu,
                                uint16_t *half) {
    mlc_frame scratch;
    float *a, *b;
    if (M <= 0 || N <= 0) return;
#if MLC__BF16_X86
    if (K > 0 && mlc__bf16_kernel_usable(ctx)) {
        mlc__bf16_gemm_kernel(ctx, ta, tb, M, N, K, A, B, beta, C, bias, relu, half);
        return;
    }
#endif
    scratch = mlc_frame_begin(ctx);
    a = mlc__floats(ctx, (size_t)M * K + 1, "mlc_gemm_bf16");
    b = mlc__floats(ctx, (size_t)K * N + 1, "mlc_gemm_bf16");
    if (a && b) {
        mlc__widen(MLC_BF16, A, a, (size_t)M * K);
        mlc__widen(MLC_BF16, B, b, (size_t)K * N);
        mlc__gemm_then(ctx, ta, tb, M, N, K, a, b, beta, C, NULL, bias, NULL, relu, NULL);
        if (half) mlc__narrow(MLC_BF16, C, half, (size_t)M * N);
    }
    mlc_frame_end(scratch);
}

MLCDEF void mlc_gemm_bf16(mlc_ctx *ctx, int ta, int tb, int M, int N, int K, const uint16_t *A,
                          const uint16_t *B, float beta, float *C) {
    if (!ctx || ctx->error) return;
    if (M < 0 || N < 0 || K < 0 || (beta != 0.0f && beta != 1.0f) || (M && N && (!C || (K && (!A || !B))))) {
        mlc__fail(ctx, MLC_ERR_ARG, "mlc_gemm_bf16: M %d, N %d, K %d, beta %g or a NULL matrix is not valid",
                  M, N, K, (double)beta);
        return;
    }
    mlc__gemm_bf16_then(ctx, ta, tb, M, N, K, A, B, beta, C, NULL, 0, NULL);
}

/* ---- int8 products: mlc_gemm_i8 ------------------------------------------------------------ */
/* C[M, N] (int32) = A[M, K] · B[N, K]ᵀ, the product of quantized Linear and convolution layers
   (issue 26): A int8 activations, B an int8 weight stored as a Linear stores it, one row per
   output, both with K contiguous; C their exact int32 sums. Integer sums do not round, so every
   kernel, every cut of K into slices and every split of C between threads gives the same bits.
   K <= 2^16 keeps every sum inside int32: a product is at most 128 · 127 < 2^14 in size, the
   VNNI kernels' shifted ones (a + 128) b (below) at most 255 · 127 < 2^15, and no sum of 2^16
   of either reaches 2^31.
   The kernels, the best one the CPU has found by mlc_create (ctx->i8_kernel):
     portable      dot products of rows, one row of A against four of B, each product int16 x
                   int16 summed into int32 (one SMLABB on a Cortex-M4); no workspace
     AVX2          vpmaddubsw, with the sign trick
     AVX-VNNI      vpdpbusd on 256 bits, with A shifted by 128
     AVX-512 VNNI  vpdpbusd on 512 bits, with A shifted by 128
   Multiplying bytes on x86: both instructions multiply unsigned bytes of their first operand by
   signed bytes of their second. vpmaddubsw adds each pair of neighbouring products into an
   int16 *with saturation*; vpdpbusd adds each group of four into an int32 lane, exactly. So:
     the sign trick (AVX2): a b = |a| (sign(a) b). |a| <= 128 fits an unsigned byte; sign(a) b
       (vpsignb: b negated where a < 0, zeroed where a = 0) fits a signed one while b != -128,
       hence B's range [-127, 127]. A pair of products then sums to at most 2 · 128 · 127 =
       32512 < 32767: the int16 never saturates. vpmaddwd against ones adds the pairs into int32.
     the shift (VNNI): (a + 128) b = a b + 128 b. A is packed as the unsigned bytes a + 128 (its
       top bits flipped) and each column starts from -128 Σ_k b instead of 0.
   The x86 kernels use the scheme of mlc's float GEMM: a panel of B and a block of A are packed
   into slivers of 32-bit words, each the four bytes of k = 4p .. 4p+3 of one row, zero past K:
     A sliver (MR rows):    word [p*MR + i] = A[i, 4p .. 4p+3]      (+ 128 each for VNNI)
     B sliver (NR columns): word [p*NR + j] = B[j, 4p .. 4p+3], then NR int32 the columns start
                            from: -128 Σ B[j, k] over the sliver's k for VNNI, 0 for AVX2
   The micro-kernel keeps an MR x NR tile of C in registers over a slice of K, broadcasting a
   word of A against vectors of B: each 32-bit lane sums its column's four products of a word.
   A product of at most MLC__I8_DOT_ROWS rows of A (a batch-1 Linear) packs nothing: dot
   products of A's rows against four of B's at a time, as they lie (mlc__i8_dots_*). */
enum {
    MLC__I8_K_MAX = 1 << 16,            /* the longest K */
    MLC__I8_PARALLEL = 64 * 64 * 32     /* the multiply-adds from which threads share a product */
};
enum { MLC__I8_PORTABLE, MLC__I8_AVX2, MLC__I8_AVXVNNI, MLC__I8_AVX512VNNI, MLC__I8_KERNELS };

MLCDEF void mlc_gemm_i8_reference(int M, int N, int K, const int8_t *A, const int8_t *B, int32_t *C) {
    int i, j, k;
    for (i = 0; i < M; i++)
        for (j = 0; j < N; j++) {
            const int8_t *a = A + (size_t)i * K, *b = B + (size_t)j * K;
            int32_t sum = 0;
            for (k = 0; k < K; k++) sum += (int32_t)a[k] * (int32_t)b[k];
            C[(size_t)i * N + j] = sum;
        }
}

/* the SIMD kernels need x86-64 and a compiler that knows AVX-VNNI (GCC 11, Clang 12) */
#if MLC__X86 && defined(__x86_64__) \
    && ((defined(__clang__) && __clang_major__ >= 12) || (!defined(__clang__) && __GNUC__ >= 11))
#define MLC__I8_X86 1
#else
#define MLC__I8_X86 0
#endif

typedef struct mlc__i8_arch mlc__i8_arch;
typedef struct mlc__i8_job {            /* one product, or a block of its rows or columns */
    const mlc__i8_arch *g;              /* the packed kernel; NULL: the portable one */
    int M, N, K, kc;                    /* kc: the depth of K's slices (a multiple of 4), in every part */
    const int8_t *A, *B;                /* A[i, k] at A[i*K + k], B[j, k] at B[j*K + k] */
    int32_t *C;                         /* C[i, j] at C[i*ldc + j] */
    size_t ldc;
    int split_rows;                     /* threads share: 1 rows of C, 0 its columns */
    uint32_t *work;                     /* per slot: one B panel then one A block, work_words in all */
    size_t work_words;
} mlc__i8_job;

/* c[r] = a · b_r for the four rows b_r = b + r ldb: a's bytes are read once for the four sums */
static void mlc__i8_dot4(int K, const int8_t *MLC__RESTRICT a, const int8_t *MLC__RESTRICT b, size_t ldb,
                         int32_t *MLC__RESTRICT c) {
    const int8_t *b0 = b, *b1 = b + ldb, *b2 = b + 2 * ldb, *b3 = b + 3 * ldb;
    int32_t s0 = 0, s1 = 0, s2 = 0, s3 = 0;
    int k;
    for (k = 0; k < K; k++) {
        const int16_t x = a[k];
        s0 += x * (int16_t)b0[k];
        s1 += x * (int16_t)b1[k];
        s2 += x * (int16_t)b2[k];
        s3 += x * (int16_t)b3[k];
    }
    c[0] = s0; c[1] = s1; c[2] = s2; c[3] = s3;
}

/* The portable kernel on the job's rows and columns: four rows of B at a time against every row
   of A, so that those four stay in cache while A streams past */
static void mlc__i8_portable(const mlc__i8_job *p) {
    const int M = p->M, N = p->N, K = p->K;
    int i, j, r;
    for (j = 0; j < N; j += 4)
        for (i = 0; i < M; i++) {
            const int8_t *a = p->A + (size_t)i * K;
            int32_t *c = p->C + (size_t)i * p->ldc + j;
            if (N - j >= 4) { mlc__i8_dot4(K, a, p->B + (size_t)j * K, (size_t)K, c); continue; }
            for (r = 0; r < N - j; r++) {
                const int8_t *b = p->B + (size_t)(j + r) * K;
                int32_t sum = 0;
                int k;
                for (k = 0; k < K; k++) sum += (int16_t)a[k] * (int16_t)b[k];
                c[r] = sum;
            }
        }
}

#if MLC__I8_X86
/* x rounded up to a multiple of m (the float GEMM's helpers are left out under MLC_USE_CBLAS) */
static int mlc__i8_round_up(int x, int m) { return (x + m - 1) / m * m; }

/* micro-kernel: C[mr, nr] (row stride ldc) = (add ? C : 0) + the sliver's start values + the sums
   over kq words of k of the slivers a (mr rows) and b (nr columns), packed as above */
typedef void (*mlc__i8_kernel_fn)(int kq, const uint32_t *a, const uint32_t *b, int32_t *c, int ldc, int add);
/* the few-rows path (NULL: none): the job's C by dot products of A's and B's rows as they lie */
typedef void (*mlc__i8_dots_fn)(const mlc__i8_job *p);
struct mlc__i8_arch {
    mlc__i8_kernel_fn kernel;
    int mr, nr, mc, kc, nc, shift;                     /* shift: 128 or 0 */
    mlc__i8_dots_fn dots;
};
enum { MLC__I8_DOT_ROWS = 4 };          /* A's rows up to which dots beat packing (B read once a row) */
enum { MLC__I8_MR_MAX = 12, MLC__I8_NR_MAX = 32 };
/* 32 bytes (or 8 int32) at p, aligned or not */
#define MLC__I8_LOAD256(p) _mm256_loadu_si256((const __m256i *)(const void *)(p))
#define MLC__I8_STORE256(p, v) _mm256_storeu_si256((__m256i *)(void *)(p), (v))

/* Each kernel starts its accumulators from the B sliver's start values (after its kq·NR
   words), not from zero: so GCC 12 keeps them in registers (started from zero, it stored all of
   them to the stack at every step, a third of the speed).
   4 x 16 with the sign trick: eight 8-lane accumulators; per word of k two B loads, then for
   each row a broadcast word of A, its magnitude, and per B vector vpsignb, vpmaddubsw, vpmaddwd
   and an add (six rows would need more than the 16 registers) */
__attribute__((target("avx2")))
static void mlc__i8_kernel_avx2(int kq, const uint32_t *a, const uint32_t *b, int32_t *c, int ldc, int add) {
    const __m256i ones = _mm256_set1_epi16(1),
                  start0 = MLC__I8_LOAD256(b + (size_t)kq * 16),
                  start1 = MLC__I8_LOAD256(b + (size_t)kq * 16 + 8);
    __m256i acc[4][2];
    int i, p;
    _Pragma("GCC unroll 4") for (i = 0; i < 4; i++) { acc[i][0] = start0; acc[i][1] = start1; }
    for (p = 0; p < kq; p++, a += 4, b += 16) {
        const __m256i b0 = MLC__I8_LOAD256(b), b1 = MLC__I8_LOAD256(b + 8);
        _Pragma("GCC unroll 4") for (i = 0; i < 4; i++) {
            const __m256i ai = _mm256_set1_epi32((int)a[i]), magnitude = _mm256_abs_epi8(ai);
            const __m256i pairs0 = _mm256_maddubs_epi16(magnitude, _mm256_sign_epi8(b0, ai)),
                          pairs1 = _mm256_maddubs_epi16(magnitude, _mm256_sign_epi8(b1, ai));
            acc[i][0] = _mm256_add_epi32(acc[i][0], _mm256_madd_epi16(pairs0, ones));
            acc[i][1] = _mm256_add_epi32(acc[i][1], _mm256_madd_epi16(pairs1, ones));
        }
    }
    _Pragma("GCC unroll 4") for (i = 0; i < 4; i++, c += ldc) {
        if (add) {
            acc[i][0] = _mm256_add_epi32(acc[i][0], MLC__I8_LOAD256(c));
            acc[i][1] = _mm256_add_epi32(acc[i][1], MLC__I8_LOAD256(c + 8));
        }
        MLC__I8_STORE256(c, acc[i][0]);
        MLC__I8_STORE256(c + 8, acc[i][1]);
    }
}

/* 6 x 16 on AVX-VNNI: twelve 8-lane accumulators; per word of k two B loads and six broadcast
   words of A, each against both */
__attribute__((target("avx2,avxvnni")))
static void mlc__i8_kernel_avxvnni(int kq, const uint32_t *a, const uint32_t *b, int32_t *c, int ldc,
                                   int add) {
    const __m256i start0 = MLC__I8_LOAD256(b + (size_t)kq * 16),
                  start1 = MLC__I8_LOAD256(b + (size_t)kq * 16 + 8);
    __m256i acc[6][2];
    int i, p;
    _Pragma("GCC unroll 6") for (i = 0; i < 6; i++) { acc[i][0] = start0; acc[i][1] = start1; }
    for (p = 0; p < kq; p++, a += 6, b += 16) {
        const __m256i b0 = MLC__I8_LOAD256(b), b1 = MLC__I8_LOAD256(b + 8);
        _Pragma("GCC unroll 6") for (i = 0; i < 6; i++) {
            const __m256i ai = _mm256_set1_epi32((int)a[i]);
            acc[i][0] = _mm256_dpbusd_avx_epi32(acc[i][0], ai, b0);
            acc[i][1] = _mm256_dpbusd_avx_epi32(acc[i][1], ai, b1);
        }
    }
    _Pragma("GCC unroll 6") for (i = 0; i < 6; i++, c += ldc) {
        if (add) {
            acc[i][0] = _mm256_add_epi32(acc[i][0], MLC__I8_LOAD256(c));
            acc[i][1] = _mm256_add_epi32(acc[i][1], MLC__I8_LOAD256(c + 8));
        }
        MLC__I8_STORE256(c, acc[i][0]);
        MLC__I8_STORE256(c + 8, acc[i][1]);
    }
}

/* 12 x 32 on AVX-512 VNNI: 24 16-lane accumulators; per word of k two B loads and twelve
   broadcast words of A, each against both */
#define MLC__I8_AVX512_TARGET "avx512f,avx512bw,avx512vnni"
__attribute__((target(MLC__I8_AVX512_TARGET)))
static void mlc__i8_kernel_avx512vnni(int kq, const uint32_t *a, const uint32_t *b, int32_t *c, int ldc,
                                      int add) {
    const __m512i start0 = _mm512_loadu_si512(b + (size_t)kq * 32),
                  start1 = _mm512_loadu_si512(b + (size_t)kq * 32 + 16);
    __m512i acc[12][2];
    int i, p;
    _Pragma("GCC unroll 12") for (i = 0; i < 12; i++) { acc[i][0] = start0; acc[i][1] = start1; }
    for (p = 0; p < kq; p++, a += 12, b += 32) {
        const __m512i b0 = _mm512_loadu_si512(b), b1 = _mm512_loadu_si512(b + 16);
        _Pragma("GCC unroll 12") for (i = 0; i < 12; i++) {
            const __m512i ai = _mm512_set1_epi32((int)a[i]);
            acc[i][0] = _mm512_dpbusd_epi32(acc[i][0], ai, b0);
            acc[i][1] = _mm512_dpbusd_epi32(acc[i][1], ai, b1);
        }
    }
    _Pragma("GCC unroll 12") for (i = 0; i < 12; i++, c += ldc) {
        if (add) {
            acc[i][0] = _mm512_add_epi32(acc[i][0], _mm512_loadu_si512(c));
            acc[i][1] = _mm512_add_epi32(acc[i][1], _mm512_loadu_si512(c + 16));
        }
        _mm512_storeu_si512(c, acc[i][0]);
        _mm512_storeu_si512(c + 16, acc[i][1]);
    }
}

/* C = A Bᵀ for A's few rows (a batch-1 linear) with AVX-512 VNNI, B's rows read where they lie
   (packing B, as the blocks do, would cost more than the product): four rows of B at a time,
   64 bytes of k a step (the last step masked), a + 128 as unsigned bytes against b, and Σ b
   beside (ones against b) for the -128 Σ b that makes the sum Σ a b */
__attribute__((target(MLC__I8_AVX512_TARGET)))
static void mlc__i8_dots_avx512vnni(const mlc__i8_job *p) {
    const __m512i flip = _mm512_set1_epi8((char)0x80), ones = _mm512_set1_epi8(1);
    const int K = p->K, whole = K - K % 64;
    const __mmask64 last = ((__mmask64)1 << (K % 64)) - 1;    /* the bytes of the last, partial step */
    int i, j, r, k;
    for (i = 0; i < p->M; i++)
        for (j = 0; j < p->N; j += 4) {
            const int rows = p->N - j < 4 ? p->N - j : 4;
            const int8_t *a = p->A + (size_t)i * K, *b[4];
            __m512i acc[4], sum[4];
            _Pragma("GCC unroll 4") for (r = 0; r < 4; r++) {   /* (past N: row j again, not stored) */
                b[r] = p->B + (size_t)(j + (r < rows ? r : 0)) * K;
                acc[r] = _mm512_setzero_si512();
                sum[r] = _mm512_setzero_si512();
            }
            for (k = 0; k < whole; k += 64) {
                const __m512i ua = _mm512_xor_si512(_mm512_loadu_si512(a + k), flip);
                _Pragma("GCC unroll 4") for (r = 0; r < 4; r++) {
                    const __m512i br = _mm512_loadu_si512(b[r] + k);
                    acc[r] = _mm512_dpbusd_epi32(acc[r], ua, br);
                    sum[r] = _mm512_dpbusd_epi32(sum[r], ones, br);
                }
            }
            if (last) {
                const __m512i ua = _mm512_maskz_mov_epi8(
                    last, _mm512_xor_si512(_mm512_maskz_loadu_epi8(last, a + k), flip));
                _Pragma("GCC unroll 4") for (r = 0; r < 4; r++) {
                    const __m512i br = _mm512_maskz_loadu_epi8(last, b[r] + k);
                    acc[r] = _mm512_dpbusd_epi32(acc[r], ua, br);
                    sum[r] = _mm512_dpbusd_epi32(sum[r], ones, br);
                }
            }
            for (r = 0; r < rows; r++) { /* Σ a b per lane, added across (unsigned: wraps to the int32) */
                uint32_t lanes[16], bs[16], total = 0;
                int l;
                _mm512_storeu_si512(lanes, acc[r]);
                _mm512_storeu_si512(bs, sum[r]);
                for (l = 0; l < 16; l++) total += lanes[l] - 128u * bs[l];
                p->C[(size_t)i * p->ldc + j + r] = (int32_t)total;
            }
        }
}

/* The same with AVX2 (the AVX2 and AVX-VNNI kernels' CPUs), by the sign trick: 32 bytes of k a
   step, |a| against b signed as a (B's values in [-127, 127]), the pairs' int16 sums widened
   into int32 lanes; the last K % 32 bytes in plain C */
__attribute__((target("avx2")))
static void mlc__i8_dots_avx2(const mlc__i8_job *p) {
    const __m256i ones = _mm256_set1_epi16(1);
    const int K = p->K, whole = K - K % 32;
    int i, j, r, k;
    for (i = 0; i < p->M; i++)
        for (j = 0; j < p->N; j += 4) {
            const int rows = p->N - j < 4 ? p->N - j : 4;
            const int8_t *a = p->A + (size_t)i * K, *b[4];
            __m256i acc[4];
            _Pragma("GCC unroll 4") for (r = 0; r < 4; r++) {   /* (past N: row j again, not stored) */
                b[r] = p->B + (size_t)(j + (r < rows ? r : 0)) * K;
                acc[r] = _mm256_setzero_si256();
            }
            for (k = 0; k < whole; k += 32) {
                const __m256i av = MLC__I8_LOAD256(a + k), magnitude = _mm256_abs_epi8(av);
                _Pragma("GCC unroll 4") for (r = 0; r < 4; r++) acc[r] = _mm256_add_epi32(
                    acc[r], _mm256_madd_epi16(_mm256_maddubs_epi16(
                                                  magnitude, _mm256_sign_epi8(MLC__I8_LOAD256(b[r] + k), av)),
                                              ones));
            }
            for (r = 0; r < rows; r++) {
                int32_t lanes[8], total = 0;
                int l;
                MLC__I8_STORE256(lanes, acc[r]);
                for (l = 0; l < 8; l++) total += lanes[l];
                for (l = whole; l < K; l++) total += (int32_t)a[l] * b[r][l];
                p->C[(size_t)i * p->ldc + j + r] = total;
            }
        }
}

/* The kernels with their block sizes in bytes of k: a KC x NR sliver of B in L1, MC x KC of A
   in L2, KC x NC of B in L3 (indexed by MLC__I8_AVX2 on) */
static const mlc__i8_arch mlc__i8_archs[MLC__I8_KERNELS - 1] = {
    { mlc__i8_kernel_avx2, 4, 16, 192, 1024, 2048, 0, mlc__i8_dots_avx2 },
    { mlc__i8_kernel_avxvnni, 6, 16, 192, 1024, 2048, 128, mlc__i8_dots_avx2 },
    { mlc__i8_kernel_avx512vnni, 12, 32, 192, 512, 2048, 128, mlc__i8_dots_avx512vnni }
};

/* mlc__i8_pack's words [0, words - words % 8) of rows [0, rows - rows % 4), in blocks of 4 rows
   x 8 words: loaded, flipped, transposed in registers (the words as 32-bit lanes) and stored as
   8 runs of 4 along x. (Every CPU of the x86 kernels has AVX2.) */
__attribute__((target("avx2")))
static void mlc__i8_pack_avx2(uint32_t *dst, const int8_t *src, size_t ld, int rows, int words, int w,
                              uint32_t flips) {
    const __m256i flip = _mm256_set1_epi32((int)flips);
    int x, p;
    for (x = 0; x + 4 <= rows; x += 4)
        for (p = 0; p + 8 <= words; p += 8) {
            const int8_t *s = src + (size_t)x * ld + 4 * p;
            uint32_t *d = dst + (size_t)p * w + x;
            const __m256i r0 = _mm256_xor_si256(MLC__I8_LOAD256(s), flip),
                          r1 = _mm256_xor_si256(MLC__I8_LOAD256(s + ld), flip),
                          r2 = _mm256_xor_si256(MLC__I8_LOAD256(s + 2 * ld), flip),
                          r3 = _mm256_xor_si256(MLC__I8_LOAD256(s + 3 * ld), flip);
            /* per 128-bit half: t0 words 0, 1 of rows 0, 1 interleaved; t1 words 2, 3; t2, t3 rows 2, 3 */
            const __m256i t0 = _mm256_unpacklo_epi32(r0, r1), t1 = _mm256_unpackhi_epi32(r0, r1),
                          t2 = _mm256_unpacklo_epi32(r2, r3), t3 = _mm256_unpackhi_epi32(r2, r3);
            /* u_q: word q of rows 0..3 in the low half, word q + 4 in the high one */
            const __m256i u0 = _mm256_unpacklo_epi64(t0, t2), u1 = _mm256_unpackhi_epi64(t0, t2),
                          u2 = _mm256_unpacklo_epi64(t1, t3), u3 = _mm256_unpackhi_epi64(t1, t3);
            _mm_storeu_si128((__m128i *)(void *)d, _mm256_castsi256_si128(u0));
            _mm_storeu_si128((__m128i *)(void *)(d + w), _mm256_castsi256_si128(u1));
            _mm_storeu_si128((__m128i *)(void *)(d + 2 * w), _mm256_castsi256_si128(u2));
            _mm_storeu_si128((__m128i *)(void *)(d + 3 * w), _mm256_castsi256_si128(u3));
            _mm_storeu_si128((__m128i *)(void *)(d + 4 * w), _mm256_extracti128_si256(u0, 1));
            _mm_storeu_si128((__m128i *)(void *)(d + 5 * w), _mm256_extracti128_si256(u1, 1));
            _mm_storeu_si128((__m128i *)(void *)(d + 6 * w), _mm256_extracti128_si256(u2, 1));
            _mm_storeu_si128((__m128i *)(void *)(d + 7 * w), _mm256_extracti128_si256(u3, 1));
        }
}

/* Packs `rows` rows of src (row stride ld, kk bytes each) into a sliver w wide: word [p*w + x] =
   bytes 4p .. 4p+3 of row x, each xor flip (0x80: a + 128 as an unsigned byte), zero past kk
   and for rows x >= rows. mlc__i8_pack_avx2 does the blocks it can, the loop below the rest. */
static void mlc__i8_pack(uint32_t *dst, const int8_t *src, size_t ld, int rows, int kk, int w,
                         unsigned char flip) {
    const int whole = kk / 4, kq = (kk + 3) / 4;
    const int blocked_rows = rows - rows % 4, blocked_words = whole - whole % 8;   /* the AVX2 blocks' */
    const uint32_t flips = flip * 0x01010101u;
    int x, p, t;
    if (rows < w) memset(dst, 0, (size_t)kq * (size_t)w * sizeof(uint32_t));
    mlc__i8_pack_avx2(dst, src, ld, rows, whole, w, flips);
    for (x = 0; x < rows; x++) {
        const int8_t *s = src + (size_t)x * ld;
        uint32_t word;
        for (p = x < blocked_rows ? blocked_words : 0; p < whole; p++) {
            memcpy(&word, s + 4 * p, 4);
            dst[(size_t)p * w + x] = word ^ flips;
        }
        if (whole < kq) {                       /* the last 1 to 3 bytes, then zeros */
            unsigned char last[4] = { 0, 0, 0, 0 };
            for (t = 0; t < kk - 4 * whole; t++)
                last[t] = (unsigned char)((unsigned char)s[4 * whole + t] ^ flip);
            memcpy(&word, last, 4);
            dst[(size_t)whole * w + x] = word;
        }
    }
}

/* Σ s[k] over n bytes, 32 at a time: vpmaddubsw of ones and the bytes (pairs, at most 254 in
   size), vpmaddwd of those and ones into int32 lanes, added across at the end */
__attribute__((target("avx2")))
static int32_t mlc__i8_sum_avx2(const int8_t *s, int n) {
    const __m256i ones8 = _mm256_set1_epi8(1), ones16 = _mm256_set1_epi16(1);
    __m256i lanes = _mm256_setzero_si256();
    __m128i h;
    int32_t sum;
    int k;
    for (k = 0; k + 32 <= n; k += 32) {
        const __m256i bytes = MLC__I8_LOAD256(s + k);
        lanes = _mm256_add_epi32(lanes, _mm256_madd_epi16(_mm256_maddubs_epi16(ones8, bytes), ones16));
    }
    h = _mm_add_epi32(_mm256_castsi256_si128(lanes), _mm256_extracti128_si256(lanes, 1));
    h = _mm_add_epi32(h, _mm_shuffle_epi32(h, 0x4e));
    h = _mm_add_epi32(h, _mm_shuffle_epi32(h, 0xb1));
    sum = _mm_cvtsi128_si32(h);
    for (; k < n; k++) sum += s[k];
    return sum;
}

/* Packs a B sliver as mlc__i8_pack, then its w start values: -shift Σ_k B[x, k] (shift 128 for
   the VNNI kernels, whose CPUs all have AVX2; 0 for AVX2's) */
static void mlc__i8_pack_b(uint32_t *dst, const int8_t *src, size_t ld, int rows, int kk, int w, int shift) {
    uint32_t *start = dst + (size_t)((kk + 3) / 4) * (size_t)w;
    int x;
    mlc__i8_pack(dst, src, ld, rows, kk, w, 0);
    for (x = 0; x < w; x++)
        start[x] = shift && x < rows ? (uint32_t)(-shift * mlc__i8_sum_avx2(src + (size_t)x * ld, kk)) : 0;
}

/* the words of one packed B panel of N columns and one A block of M rows, kc deep, each a whole
   number of 64-byte lines */
static size_t mlc__i8_panel_words(const mlc__i8_arch *g, int N, int kc) {
    return ((size_t)mlc__i8_round_up(N < g->nc ? N : g->nc, g->nr) * (size_t)(kc / 4 + 1) + 15) / 16 * 16;
}
static size_t mlc__i8_block_words(const mlc__i8_arch *g, int M, int kc) {
    return ((size_t)mlc__i8_round_up(M < g->mc ? M : g->mc, g->mr) * (size_t)(kc / 4) + 15) / 16 * 16;
}

/* The loops over blocks, as mlc__gemm_blocks: for each panel of B (packed), each block of A
   (packed), the kernel over the tiles of C; an edge tile runs in full aside. */
static void mlc__i8_blocks(const mlc__i8_job *p, uint32_t *work) {
    const mlc__i8_arch *g = p->g;
    const int mr = g->mr, nr = g->nr, M = p->M, N = p->N, K = p->K, kc = p->kc,
              mblocks = (M + g->mc - 1) / g->mc, mc = mlc__i8_round_up((M + mblocks - 1) / mblocks, mr);
    const unsigned char flip = g->shift ? 0x80 : 0;
    uint32_t *panel = work, *block = work + mlc__i8_panel_words(g, N, kc);
    int jc, pc;
    for (jc = 0; jc < N; jc += g->nc) {
        const int nc = N - jc < g->nc ? N - jc : g->nc;
        for (pc = 0; pc < K; pc += kc) {
            const int kk = K - pc < kc ? K - pc : kc, kq = (kk + 3) / 4, add = pc > 0;
            const size_t sliver = (size_t)nr * (size_t)(kq + 1);      /* a B sliver's words */
            int jr, ic;
            for (jr = 0; jr < nc; jr += nr)
                mlc__i8_pack_b(panel + (size_t)(jr / nr) * sliver, p->B + (size_t)(jc + jr) * K + pc,
                               (size_t)K, nc - jr < nr ? nc - jr : nr, kk, nr, g->shift);
            for (ic = 0; ic < M; ic += mc) {
                const int m = M - ic < mc ? M - ic : mc;
                int ir;
                for (ir = 0; ir < m; ir += mr)
                    mlc__i8_pack(block + (size_t)ir * kq, p->A + (size_t)(ic + ir) * K + pc, (size_t)K,
                                 m - ir < mr ? m - ir : mr, kk, mr, flip);
                for (jr = 0; jr < nc; jr += nr)
                    for (ir = 0; ir < m; ir += mr) {
                        const int mm = m - ir < mr ? m - ir : mr, nn = nc - jr < nr ? nc - jr : nr;
                        const uint32_t *a = block + (size_t)ir * kq, *b = panel + (size_t)(jr / nr) * sliver;
                        int32_t *c = p->C + (size_t)(ic + ir) * p->ldc + jc + jr,
                                tile[MLC__I8_MR_MAX * MLC__I8_NR_MAX];
                        int i, j;
                        if (mm == mr && nn == nr) {
                            g->kernel(kq, a, b, c, (int)p->ldc, add);
                            continue;
                        }
                        g->kernel(kq, a, b, tile, nr, 0);
                        for (i = 0; i < mm; i++)
                            for (j = 0; j < nn; j++) {
                                int32_t *to = c + (size_t)i * p->ldc + j;
                                *to = tile[i * nr + j] + (add ? *to : 0);
                            }
                    }
            }
        }
    }
}
#endif

/* Whether this build and CPU run int8 kernel k */
static int mlc__i8_kernel_runs(int k) {
#if MLC__I8_X86
    unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
    switch (k) {
    case MLC__I8_AVX2: return __builtin_cpu_supports("avx2") != 0;
    case MLC__I8_AVXVNNI:                       /* CPUID leaf 7, subleaf 1: EAX bit 4 */
        return __builtin_cpu_supports("avx2") && __get_cpuid_count(7, 1, &eax, &ebx, &ecx, &edx)
               && (eax >> 4 & 1);
    case MLC__I8_AVX512VNNI:
        return __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vnni");
    default: break;
    }
#endif
    return k == MLC__I8_PORTABLE;
}

static int mlc__i8_best(void) {
    int k = MLC__I8_KERNELS - 1;
    while (k > MLC__I8_PORTABLE && !mlc__i8_kernel_runs(k)) k--;
    return k;
}

/* Units [begin, end) of the product's rows or columns (MR or NR each for a packed kernel, 1 for
   the portable one), for mlc__parallel: that part of C on this thread */
static void mlc__i8_part(void *arg, int slot, size_t begin, size_t end) {
    mlc__i8_job part = *(const mlc__i8_job *)arg;
#if MLC__I8_X86
    const int unit = !part.g ? 1 : part.split_rows ? part.g->mr : part.g->nr;
#else
    const int unit = 1;
#endif
    const int from = (int)begin * unit;
    int to = (int)end * unit;
    if (part.split_rows) {
        if (to > part.M) to = part.M;
        part.A += (size_t)from * (size_t)part.K; part.C += (size_t)from * part.ldc; part.M = to - from;
    } else {
        if (to > part.N) to = part.N;
        part.B += (size_t)from * (size_t)part.K; part.C += from; part.N = to - from;
    }
#if MLC__I8_X86
    if (part.g && part.M <= MLC__I8_DOT_ROWS && part.g->dots) { part.g->dots(&part); return; }
    if (part.g) { mlc__i8_blocks(&part, part.work + (size_t)slot * part.work_words); return; }
#endif
    (void)slot;
    mlc__i8_portable(&part);
}

/* The product (M, N, K >= 1) on the context's kernel: the threads share C's rows, or its
   columns when it has more of those in tiles, each packing its own blocks of both operands into
   arena scratch (released at once; out of memory: the error is set and C is left). The portable
   kernel, and any product with a fixed arena (no room promised for packing), packs nothing. */
static void mlc__i8_gemm(mlc_ctx *ctx, int M, int N, int K, const int8_t *A, const int8_t *B, int32_t *C) {
    const size_t from = (long long)M * N < (MLC__I8_PARALLEL + K - 1) / K ? (size_t)-1 : 2;
    mlc__i8_job job;
    job.g = NULL; job.M = M; job.N = N; job.K = K; job.kc = K; job.A = A; job.B = B; job.C = C;
    job.ldc = (size_t)N; job.work = NULL; job.work_words = 0;
#if MLC__I8_X86
    if (ctx->i8_kernel != MLC__I8_PORTABLE && !ctx->config.arena) {
        const mlc__i8_arch *g = &mlc__i8_archs[ctx->i8_kernel - 1];
        const int rows = (M + g->mr - 1) / g->mr, cols = (N + g->nr - 1) / g->nr,
                  kblocks = (K + g->kc - 1) / g->kc;
        mlc_frame scratch = mlc_frame_begin(ctx);
        size_t units;
        int slots, per;
        job.g = g;
        job.kc = mlc__i8_round_up((K + kblocks - 1) / kblocks, 4);        /* equal slices, whole words */
        job.split_rows = rows >= cols;
        units = (size_t)(job.split_rows ? rows : cols);
        slots = mlc__slots(ctx, units, from);
        per = (int)((units + (size_t)mlc__pieces(units, slots) - 1) / (size_t)mlc__pieces(units, slots));
        job.work_words = mlc__i8_panel_words(g, job.split_rows ? N : per * g->nr, job.kc)
                         + mlc__i8_block_words(g, job.split_rows ? per * g->mr : M, job.kc);
        job.work = (uint32_t *)mlc__arena_alloc(ctx, job.work_words * (size_t)slots * sizeof(uint32_t),
                                                "mlc_gemm_i8");
        if (job.work) mlc__parallel(ctx, units, from, mlc__i8_part, &job);
        mlc_frame_end(scratch);
        return;
    }
#endif
    job.split_rows = M > N;
    mlc__parallel(ctx, (size_t)(job.split_rows ? M : N), from, mlc__i8_part, &job);
}

MLCDEF void mlc_gemm_i8(mlc_ctx *ctx, int M, int N, int K, const int8_t *A, const int8_t *B, int32_t *C) {
    if (!ctx || ctx->error) return;
    if (M < 0 || N < 0 || K < 0 || (M && N && (!C || (K && (!A || !B))))) {
        mlc__fail(ctx, MLC_ERR_ARG, "mlc_gemm_i8: M %d, N %d, K %d or a NULL matrix is not valid", M, N, K);
        return;
    }
    if (K > MLC__I8_K_MAX) {
        mlc__fail(ctx, MLC_ERR_ARG, "mlc_gemm_i8: M %d, N %d, K %d: K may be at most %d (so that no int32 "
                  "sum overflows)", M, N, K, MLC__I8_K_MAX);
        return;
    }
    if (!M || !N) return;
    if (!K) { memset(C, 0, (size_t)M * (size_t)N * sizeof(int32_t)); return; }
    mlc__i8_gemm(ctx, M, N, K, A, B, C);
}

/* Whether products may run on several threads at once: mlc's own may; a hook or BLAS gets
   one product at a time (and may use threads inside it). */
static int mlc__gemm_threadable(const mlc_ctx *ctx) {
#ifdef MLC_USE_CBLAS
    (void)ctx;
    return 0;
#else
    return !ctx->config.gemm;
#endif
}

/* The `work` floats mlc__gemm needs for a product of this size on one thread. */
static size_t mlc__gemm_work(int M, int N, int K) {
#ifdef MLC_USE_CBLAS
    (void)M; (void)N; (void)K;
    return 0;
#else
    return mlc__gemm_work_floats(mlc__gemm_pick(M), M, N, K);
#endif
}

typedef struct mlc__mm {
    int ta, tb, M, N, K, batches;
    size_t step_a, step_b, step_c;
    int relu;                           /* linear's output is relu(x Wᵀ + b), fused on the CPU */
} mlc__mm;

static void mlc__gemm_batched(mlc_ctx *ctx, const mlc__mm *mm, int ta, int tb, int M, int N, int K,
                              const float *A, size_t sa, const float *B, size_t sb, float beta, float *C,
                              size_t sc) {
    int i;
    for (i = 0; i < mm->batches; i++)   /* into one C (sc 0): the later products add to the first */
        mlc_gemm(ctx, ta, tb, M, N, K, A + i * sa, B + i * sb, i && !sc ? 1.0f : beta, C + i * sc);
}

/* Columns [begin, end) of linear's output gradient, for mlc__parallel: (relu) dc = g·(y > 0),
   relu's own map with y for x (y > 0 where x > 0), and (db) db += dc row by row, the order of
   the sums on one thread; each thread keeps to the columns its part of the forward product
   wrote. */
#define MLC__LINEAR_GRAD_PARALLEL 8192  /* elements of the gradient from which threads share its columns */
typedef struct mlc__linear_grad_job {
    const float *g, *y;
    float *dc, *db;
    size_t rows, cols;
} mlc__linear_grad_job;

static void mlc__linear_grad_columns(void *arg, int slot, size_t begin, size_t end) {
    const mlc__linear_grad_job *job = (const mlc__linear_grad_job *)arg;
    size_t r, at;
    (void)slot;
    for (r = 0, at = begin; r < job->rows; r++, at += job->cols) {
        const float *dc = job->g + at;
        if (job->y) {
            const float *y = job->y + at;
            mlc__unary_grad(MLC__UNARY_RELU, end - begin, y, y, dc, job->dc + at, 1, 0.0f, 0.0f);
            dc = job->dc + at;
        }
        if (job->db) mlc__axpy(end - begin, 1.0f, dc, job->db + begin);
    }
}

/* The backward products of bf16 operands (a node mlc__cpu_takes_half): dC rounded to bf16, as
   PyTorch's gradient of a bf16 output is, then each product on the bf16 kernel into the float32
   gradients. Arguments as mlc__gemm_batched's, with bf16 A and B. */
static void mlc__gemm_batched_bf16(mlc_ctx *ctx, const mlc__mm *mm, int ta, int tb, int M, int N, int K,
                                   const uint16_t *A, size_t sa, const uint16_t *B, size_t sb, float beta,
                                   float *C, size_t sc) {
    int i;
    for (i = 0; i < mm->batches; i++)
        mlc__gemm_bf16_then(ctx, ta, tb, M, N, K, A + i * sa, B + i * sb, i && !sc ? 1.0f : beta,
                            C + i * sc, NULL, 0, NULL);
}
static void mlc__matmul_backward_bf16(mlc__node *n, const float *gc, float *ga, float beta_a, float *gb,
                                      float beta_b) {
    const mlc__mm *mm = (const mlc__mm *)n->saved;
    const uint16_t *a = n->in[0]->half, *b = n->in[1]->half;
    const size_t sa = mm->step_a, sb = mm->step_b, sc = mm->step_c;
    mlc_ctx *ctx = n->out->ctx;
    uint16_t *g = (uint16_t *)mlc__arena_alloc(ctx, n->out->size * sizeof(uint16_t) + 1, n->name);
    if (!g) return;
    mlc__narrow(MLC_BF16, gc, g, n->out->size);
    if (ga && !mm->ta)
        mlc__gemm_batched_bf16(ctx, mm, 0, !mm->tb, mm->M, mm->K, mm->N, g, sc, b, sb, beta_a, ga, sa);
    if (ga && mm->ta)
        mlc__gemm_batched_bf16(ctx, mm, mm->tb, 1, mm->K, mm->M, mm->N, b, sb, g, sc, beta_a, ga, sa);
    if (gb && !mm->tb)
        mlc__gemm_batched_bf16(ctx, mm, !mm->ta, 0, mm->K, mm->N, mm->M, a, sa, g, sc, beta_b, gb, sb);
    if (gb && mm->tb)
        mlc__gemm_batched_bf16(ctx, mm, 1, mm->ta, mm->N, mm->K, mm->M, g, sc, a, sa, beta_b, gb, sb);
}

static void mlc__matmul_backward(mlc__node *n) {
    const mlc__mm *mm = (const mlc__mm *)n->saved;
    mlc_tensor *a = n->in[0], *b = n->in[1];
    mlc_ctx *ctx = n->out->ctx;
    float beta_a, beta_b, *ga = mlc__grad_to_overwrite(a, &beta_a), *gb = mlc__grad_to_overwrite(b, &beta_b);
    const float *gc = n->out->grad;
    mlc__linear_grad_job job;
    mlc_frame scratch;
    job.db = mlc__grad(n->in[2]);       /* (mlc_backward made it before this node ran) */
    scratch = mlc_frame_begin(ctx);
    job.g = gc; job.y = mm->relu ? n->out->data : NULL; job.dc = NULL;
    if (mm->relu && n->out->dtype != MLC_F32) job.y = mlc__host(n->out);   /* (bf16: y widened) */
    job.cols = (size_t)mm->N; job.rows = n->out->size / job.cols;
    if (mm->relu && (!job.y || !(job.dc = mlc__floats(ctx, n->out->size, "mlc_linear")))) {
        mlc_frame_end(scratch);
        return;
    }
    if ((job.y || job.db) && job.rows) {  /* (an empty batch: no rows, nothing to sum) */
        mlc__parallel(ctx, job.cols, MLC__LINEAR_GRAD_PARALLEL / job.rows + 1, mlc__linear_grad_columns,
                      &job);
        if (job.y) gc = job.dc;
    }
    if (a->dtype == MLC_BF16) {                          /* (mlc__cpu_takes_half: both bf16) */
        mlc__matmul_backward_bf16(n, gc, ga, beta_a, gb, beta_b);
        mlc_frame_end(scratch);
        return;
    }
    if (ga && !mm->ta)
        mlc__gemm_batched(a->ctx, mm, 0, !mm->tb, mm->M, mm->K, mm->N, gc, mm->step_c, b->data, mm->step_b,
                          beta_a, ga, mm->step_a);
    if (ga && mm->ta)
        mlc__gemm_batched(a->ctx, mm, mm->tb, 1, mm->K, mm->M, mm->N, b->data, mm->step_b, gc, mm->step_c,
                          beta_a, ga, mm->step_a);
    if (gb && !mm->tb)
        mlc__gemm_batched(a->ctx, mm, !mm->ta, 0, mm->K, mm->N, mm->M, a->data, mm->step_a, gc, mm->step_c,
                          beta_b, gb, mm->step_b);
    if (gb && mm->tb)
        mlc__gemm_batched(a->ctx, mm, 1, mm->ta, mm->N, mm->K, mm->M, gc, mm->step_c, a->data, mm->step_a,
                          beta_b, gb, mm->step_b);
    mlc_frame_end(scratch);
}

/* C = op(A) op(B) (+ bias [N] on every row: linear's bias, and (relu) then relu(C): both fused
   into the product's parts on the CPU; on a device relu runs as an op of its own). bf16
   operands come here as they are only where mlc__cpu_takes_half: each product is summed on the
   bf16 kernel in float32 scratch, and its parts rounded into the output as they are done. */
static int mlc__matmul_cpu(mlc__node *n) {
    const mlc__mm *mm = (const mlc__mm *)n->saved;
    mlc_tensor *a = n->in[0], *b = n->in[1], *bias = n->in[2];
    if (a->dtype == MLC_BF16) {
        mlc_ctx *ctx = n->out->ctx;
        mlc_frame scratch = mlc_frame_begin(ctx);
        float *c = mlc__floats(ctx, (size_t)mm->M * mm->N + 1, n->name);
        const mlc_tensor *bias_wide = bias ? mlc__widened(bias, 1) : NULL;
        int i;
        for (i = 0; c && (bias_wide || !bias) && i < mm->batches; i++)
            mlc__gemm_bf16_then(ctx, mm->ta, mm->tb, mm->M, mm->N, mm->K, a->half + i * mm->step_a,
                                b->half + i * mm->step_b, 0.0f, c, bias_wide ? bias_wide->data : NULL,
                                mm->relu, n->out->half + i * mm->step_c);
        mlc_frame_end(scratch);
        return 1;
    }
    if (mm->batches == 1)                /* (linear's always: its 2-D weight makes one product) */
        mlc__gemm_then(n->out->ctx, mm->ta, mm->tb, mm->M, mm->N, mm->K, a->data, b->data, 0.0f, n->out->data,
                       NULL, bias ? bias->data : NULL, NULL, mm->relu, NULL);
    else                                 /* (mlc_matmul's: no bias, no relu) */
        mlc__gemm_batched(n->out->ctx, mm, mm->ta, mm->tb, mm->M, mm->N, mm->K, a->data, mm->step_a, b->data,
                          mm->step_b, 0.0f, n->out->data, mm->step_c);
    return 1;
}

static mlc_tensor *mlc__linear_int8(const char *op, mlc_tensor *x, mlc_tensor *w, mlc_tensor *bias, int relu);
static mlc_tensor *mlc__matmul(const char *op, mlc_tensor *a, mlc_tensor *b, int transpose_a, int transpose_b,
                               mlc_tensor *bias, int relu) {
    mlc__mm mm;
    mlc_tensor *out;
    mlc__node call;
    int shape[MLC_MAX_DIMS], ndim, K2, d;
    if (b && b->dtype == MLC_I8 && !transpose_a && transpose_b && !strcmp(op, "mlc_linear"))
        return mlc__linear_int8(op, a, b, bias, relu);   /* (@section int8) */
    a = mlc__autocast_low(a); b = mlc__autocast_low(b); bias = mlc__autocast_low(bias);
    MLC__ENTER(op, a, b);
    if (!mlc__same_device(ctx, op, a, bias)) return NULL;
    if (a->ndim < 2 || b->ndim < 2)
        return (mlc_tensor *)mlc__fail(ctx, MLC_ERR_SHAPE, "%s: operands need rank >= 2, got %T and %T", op,
                                       a, b);
    mm.ta = transpose_a != 0; mm.tb = transpose_b != 0;
    mm.M = a->shape[a->ndim - 2 + mm.ta]; mm.K = a->shape[a->ndim - 1 - mm.ta];
    K2 = b->shape[b->ndim - 2 + mm.tb];   mm.N = b->shape[b->ndim - 1 - mm.tb];
    if (mm.K != K2)
        return (mlc_tensor *)mlc__fail(ctx, MLC_ERR_SHAPE, "%s: inner sizes differ: %T%s @ %T%s (%d vs %d)",
                                       op, a, mm.ta ? "^T" : "", b, mm.tb ? "^T" : "", mm.K, K2);
    if (a->ndim > 2 && b->ndim > 2
        && (a->ndim != b->ndim || memcmp(a->shape, b->shape, (size_t)(a->ndim - 2) * sizeof(int))))
        return (mlc_tensor *)mlc__fail(ctx, MLC_ERR_SHAPE, "%s: batch dimensions of %T and %T differ", op, a,
                                       b);
    ndim = a->ndim > b->ndim ? a->ndim : b->ndim;
    for (d = 0; d < ndim - 2; d++) shape[d] = a->ndim > 2 ? a->shape[d] : b->shape[d];
    shape[ndim - 2] = mm.M; shape[ndim - 1] = mm.N;
    if (bias && (bias->ndim != 1 || bias->shape[0] != mm.N))
        return (mlc_tensor *)mlc__fail(ctx, MLC_ERR_SHAPE, "%s: bias %T does not match the %d outputs", op,
                                       bias, mm.N);
    if (relu && a->on_device) return mlc_relu(mlc__matmul(op, a, b, transpose_a, transpose_b, bias, 0));
    out = mlc__make(ctx, op, ndim, shape, 0);
    if (!out) return NULL;
    mm.relu = relu;
    mm.batches = (int)mlc__numel(ndim - 2, shape);
    mm.step_a = a->ndim > 2 ? (size_t)mm.M * mm.K : 0;
    mm.step_b = b->ndim > 2 ? (size_t)mm.K * mm.N : 0;
    mm.step_c = (size_t)mm.M * mm.N;
    if (b->ndim == 2 && !mm.ta && mm.batches > 1) {   /* [..., M, K] @ [K, N]: one tall product */
        mm.M *= mm.batches; mm.batches = 1; mm.step_a = mm.step_c = 0;
    }
    mlc__call(&call, MLC__OP_MATMUL, op, out, a, b, bias, NULL);
    if (!mlc__save(&call, &mm, sizeof mm) || !mlc__run(ctx, &call)) return NULL;
    mlc__record(&call);
    return out;
}

MLCDEF mlc_tensor *mlc_matmul(mlc_tensor *a, mlc_tensor *b) {
    return mlc__matmul("mlc_matmul", a, b, 0, 0, NULL, 0);
}

/* linear: y = x W^T + b      x [..., in], W [out, in], b [out] */
MLCDEF mlc_tensor *mlc_matmul_t(mlc_tensor *a, mlc_tensor *b, int transpose_a, int transpose_b) {
    return mlc__matmul("mlc_matmul_t", a, b, transpose_a, transpose_b, NULL, 0);
}

MLCDEF mlc_tensor *mlc_linear(mlc_tensor *x, mlc_tensor *weight, mlc_tensor *bias) {
    return mlc__matmul("mlc_linear", x, weight, 0, 1, bias, 0);
}

/* ============================================================================================
   @section reduce  Reductions over one axis; x is viewed as [outer, n, inner] and the axis is the middle.
     sum   y = Σ x                  dx = g
     mean  y = Σ x / n              dx = g / n
     max   y = max x                dx = g at the (first) argmax, 0 elsewhere (a NaN is the max:
                                    the first NaN, as in PyTorch; argmax likewise)
     var   y = Σ (x - μ)² / (n - c) dx = g 2 (x - μ) / (n - c)     (c = 1 when unbiased)
   Sums are taken in double.
   ============================================================================================ */

#define MLC__REDUCE_KINDS(X) X(SUM) X(MEAN) X(MAX) X(VAR) X(ARGMAX)
#define MLC__REDUCE_ENUM(NAME) MLC__REDUCE_##NAME,
typedef enum mlc__reduce_kind { MLC__REDUCE_KINDS(MLC__REDUCE_ENUM) MLC__REDUCE_COUNT } mlc__reduce_kind;
#undef MLC__REDUCE_ENUM
#define MLC__REDUCE_KIND_NAME(NAME) "REDUCE_" #NAME,
/* for kernels */
static const char *const mlc__reduce_kind_names[] = { MLC__REDUCE_KINDS(MLC__REDUCE_KIND_NAME) };
#undef MLC__REDUCE_KIND_NAME

static void mlc__reduce_backward(mlc__node *n) {
    mlc_tensor *x = n->in[0];
    float *gx = mlc__grad(x);
    const float *g = n->out->grad;
    const int *argmax = (const int *)n->saved;
    int kind = n->args.reduce.kind, len = n->args.reduce.len, i;
    size_t inner = (size_t)n->args.reduce.inner, outer = len && inner ? x->size / ((size_t)len * inner) : 0,
           o, k;
    float denom = kind == MLC__REDUCE_VAR ? (float)(len - n->args.reduce.unbiased) : (float)len;
    for (o = 0; o < outer; o++)
        for (k = 0; k < inner; k++) {
            size_t base = o * len * inner + k;
            float gv = g[o * inner + k];
            if (kind == MLC__REDUCE_MAX) { gx[base + (size_t)argmax[o * inner + k] * inner] += gv; continue; }
            if (kind == MLC__REDUCE_VAR) {
                mlc__sum_t mean = 0;
                for (i = 0; i < len; i++) mean += (mlc__sum_t)x->data[base + (size_t)i * inner];
                mean /= (mlc__sum_t)len;
                for (i = 0; i < len; i++)
                    gx[base + (size_t)i * inner] +=
                        gv * 2.0f * (float)((mlc__sum_t)x->data[base + (size_t)i * inner] - mean) / denom;
                continue;
            }
            for (i = 0; i < len; i++)
                gx[base + (size_t)i * inner] += kind == MLC__REDUCE_SUM ? gv : gv / denom;
        }
}

static int mlc__reduce_cpu(mlc__node *n) {
    const mlc__reduce_kind kind = (mlc__reduce_kind)n->args.reduce.kind;
    const int len = n->args.reduce.len, unbiased = n->args.reduce.unbiased;
    const size_t inner = (size_t)n->args.reduce.inner, outer = inner ? n->out->size / inner : 0;
    const float *x = n->in[0]->data;
    float *y = n->out->data;
    int i, *argmax = NULL;
    size_t o, k;
    if (kind == MLC__REDUCE_MAX || kind == MLC__REDUCE_ARGMAX) {   /* (a device finds it again) */
        argmax = (int *)mlc__arena_alloc(n->out->ctx, outer * inner * sizeof(int), n->name);
        if (!argmax) return 0;
    }
    for (o = 0; o < outer; o++)
        for (k = 0; k < inner; k++) {
            const float *p = x + o * len * inner + k;
            mlc__sum_t s = 0, mean, d;
            float best;
            int at = 0;
            switch (kind) {
            case MLC__REDUCE_MAX: case MLC__REDUCE_ARGMAX:
                best = p[0];
                for (i = 1; i < len && !mlc__is_nan(best); i++)     /* the first NaN wins, as in PyTorch */
                    if (mlc__is_nan(p[(size_t)i * inner]) || p[(size_t)i * inner] > best) {
                        best = p[(size_t)i * inner]; at = i;
                    }
                argmax[o * inner + k] = at;
                y[o * inner + k] = kind == MLC__REDUCE_MAX ? best : (float)at;
                break;
            case MLC__REDUCE_VAR:
                for (i = 0; i < len; i++) s += (mlc__sum_t)p[(size_t)i * inner];
                mean = s / (mlc__sum_t)len; s = 0;
                for (i = 0; i < len; i++) { d = (mlc__sum_t)p[(size_t)i * inner] - mean; s += d * d; }
                y[o * inner + k] = (float)(s / (mlc__sum_t)(len - unbiased));
                break;
            case MLC__REDUCE_SUM: case MLC__REDUCE_MEAN:
                for (i = 0; i < len; i++) s += (mlc__sum_t)p[(size_t)i * inner];
                y[o * inner + k] = (float)(kind == MLC__REDUCE_MEAN ? s / (mlc__sum_t)len : s);
                break;
            case MLC__REDUCE_COUNT: break;
            }
        }
    n->saved = argmax;
    return 1;
}

static mlc_tensor *mlc__reduce(const char *op, mlc__reduce_kind kind, mlc_tensor *x, int axis, int keepdim,
                               int unbiased) {
    int shape[MLC_MAX_DIMS], ndim = 0, d, len;
    size_t outer, inner;
    mlc_tensor *out;
    mlc__node call;
    x = mlc__autocast_f32(x);
    MLC__ENTER(op, x);
    if (!mlc__axis(ctx, op, x, &axis)) return NULL;
    mlc__split(x, axis, &outer, &len, &inner);
    if (len == 0 && kind != MLC__REDUCE_SUM)
        return (mlc_tensor *)mlc__fail(ctx, MLC_ERR_SHAPE, "%s: axis %d of %T is empty", op, axis, x);
    if (kind == MLC__REDUCE_VAR && len <= unbiased)
        return (mlc_tensor *)mlc__fail(ctx, MLC_ERR_SHAPE,
                                       "%s: unbiased variance needs 2 or more values along axis %d of %T", op,
                                       axis, x);
    for (d = 0; d < x->ndim; d++) {
        if (d != axis) shape[ndim++] = x->shape[d];
        else if (keepdim) shape[ndim++] = 1;
    }
    if (kind == MLC__REDUCE_ARGMAX) ctx->op_dtype = MLC_F32;   /* indices, as float32 */
    out = mlc__make(ctx, op, ndim, shape, 0);
    if (!out) return NULL;
    mlc__call(&call, MLC__OP_REDUCE, op, out, x, NULL, NULL, NULL);
    call.args.reduce.kind = kind; call.args.reduce.len = len; call.args.reduce.inner = (int)inner;
    call.args.reduce.unbiased = unbiased;
    if (!mlc__run(ctx, &call)) return NULL;
    if (kind == MLC__REDUCE_ARGMAX) return out;                 /* indices carry no gradient */
    mlc__record(&call);
    return out;
}

MLCDEF mlc_tensor *mlc_sum(mlc_tensor *x, int axis, int keepdim) {
    return mlc__reduce("mlc_sum", MLC__REDUCE_SUM, x, axis, keepdim, 0);
}
MLCDEF mlc_tensor *mlc_mean(mlc_tensor *x, int axis, int keepdim) {
    return mlc__reduce("mlc_mean", MLC__REDUCE_MEAN, x, axis, keepdim, 0);
}
MLCDEF mlc_tensor *mlc_max(mlc_tensor *x, int axis, int keepdim) {
    return mlc__reduce("mlc_max", MLC__REDUCE_MAX, x, axis, keepdim, 0);
}
MLCDEF mlc_tensor *mlc_var(mlc_tensor *x, int axis, int keepdim, int unbiased) {
    return mlc__reduce("mlc_var", MLC__REDUCE_VAR, x, axis, keepdim, unbiased != 0);
}
MLCDEF mlc_tensor *mlc_argmax(mlc_tensor *x, int axis) {
    return mlc__reduce("mlc_argmax", MLC__REDUCE_ARGMAX, x, axis, 0, 0);
}
MLCDEF mlc_tensor *mlc_sum_all(mlc_tensor *x) {
    int n = x ? (int)x->size : 0;
    return x && !MLC__ARGS_OK(x->ctx, "mlc_sum_all", x) ? NULL : mlc_sum(mlc_reshape(x, 1, &n), 0, 0);
}
MLCDEF mlc_tensor *mlc_mean_all(mlc_tensor *x) {
    int n = x ? (int)x->size : 0;
    return x && !MLC__ARGS_OK(x->ctx, "mlc_mean_all", x) ? NULL : mlc_mean(mlc_reshape(x, 1, &n), 0, 0);
}

/* cumsum: y_i = Σ_{j<=i} x_j along the axis      dx_i += Σ_{j>=i} g_j
   Running sums in float, in index order (reversed for the gradient), as a device takes them. */
static void mlc__cumsum_rows(const float *x, float *y, size_t outer, int len, size_t inner, int reverse,
                             int add) {
    size_t o, k;
    int i;
    for (o = 0; o < outer; o++)
        for (k = 0; k < inner; k++) {
            mlc__sum_t sum = 0;                          /* in double, as PyTorch's CPU cumsum */
            for (i = 0; i < len; i++) {
                size_t at = (o * (size_t)len + (size_t)(reverse ? len - 1 - i : i)) * inner + k;
                sum += (mlc__sum_t)x[at];
                y[at] = add ? y[at] + (float)sum : (float)sum;
            }
        }
}

static void mlc__cumsum_backward(mlc__node *n) {
    float *gx = mlc__grad(n->in[0]);
    int len = n->args.cumsum.len;
    size_t inner = (size_t)n->args.cumsum.inner,
           outer = len && inner ? n->out->size / ((size_t)len * inner) : 0;
    if (gx) mlc__cumsum_rows(n->out->grad, gx, outer, len, inner, 1, 1);
}

static int mlc__cumsum_cpu(mlc__node *n) {
    int len = n->args.cumsum.len;
    size_t inner = (size_t)n->args.cumsum.inner,
           outer = len && inner ? n->out->size / ((size_t)len * inner) : 0;
    mlc__cumsum_rows(n->in[0]->data, n->out->data, outer, len, inner, 0, 0);
    return 1;
}

MLCDEF mlc_tensor *mlc_cumsum(mlc_tensor *x, int axis) {
    size_t outer, inner;
    int len;
    mlc_tensor *out;
    mlc__node call;
    x = mlc__autocast_f32(x);
    MLC__ENTER("mlc_cumsum", x);
    if (!mlc__axis(ctx, "mlc_cumsum", x, &axis)) return NULL;
    mlc__split(x, axis, &outer, &len, &inner);
    if (!(out = mlc__like(x, "mlc_cumsum"))) return NULL;
    mlc__call(&call, MLC__OP_CUMSUM, "mlc_cumsum", out, x, NULL, NULL, NULL);
    call.args.cumsum.len = len; call.args.cumsum.inner = (int)inner;
    if (!mlc__run(ctx, &call)) return NULL;
    mlc__record(&call);
    return out;
}

/* ============================================================================================
   @section softmax  Softmax along an axis (max subtracted first, so large logits do not overflow)
     softmax      y = e^(x - max) / Σ e^(x - max)     dx = y (g - Σ g y)
     log_softmax  y = x - max - ln Σ e^(x - max)      dx = g - e^y Σ g
   ============================================================================================ */

static void mlc__softmax_backward(mlc__node *n) {
    mlc_tensor *y = n->out;
    float *gx = mlc__grad(n->in[0]);
    int len = n->args.softmax.len, i, is_log = n->args.softmax.is_log;
    size_t inner = (size_t)n->args.softmax.inner, outer = y->size / ((size_t)len * inner), o, k;
    for (o = 0; o < outer; o++)
        for (k = 0; k < inner; k++) {
            size_t base = o * len * inner + k;
            mlc__sum_t s = 0;
            for (i = 0; i < len; i++) {
                size_t at = base + (size_t)i * inner;
                s += (mlc__sum_t)(is_log ? y->grad[at] : y->grad[at] * y->data[at]);
            }
            for (i = 0; i < len; i++) {
                size_t at = base + (size_t)i * inner;
                gx[at] += is_log ? y->grad[at] - MLC_EXPF(y->data[at]) * (float)s
                                 : y->data[at] * (y->grad[at] - (float)s);
            }
        }
}

/* e_i = e^(e_i - m) over n floats `stride` apart, and Σ e_i: written once for `lanes` floats a
   step and compiled for any CPU and for AVX2 (as the maps are; not for AVX-512: rows as short as
   attention's lose more in a 16-lane loop's scalar rest than they gain); the sum in double
   after the exponentials, as a sum in double does not vectorise */
static MLC__INLINE void mlc__exp_shifted_lanes(int n, float *e, float m, const int lanes) {
    int i;
    MLC__VECTOR_LOOP_OF(lanes, i, 0, n, { e[i] = MLC_EXPF(e[i] - m); });
}
#if MLC__X86
__attribute__((target("avx2,fma")))
static void mlc__exp_shifted_avx2(int n, float *e, float m) { mlc__exp_shifted_lanes(n, e, m, 8); }
#endif
static mlc__sum_t mlc__exp_shifted(int n, size_t stride, float *e, float m) {
    mlc__sum_t s = 0;
    int i;
    if (stride == 1) {
#if MLC__X86
        if (mlc__cpu_avx2()) mlc__exp_shifted_avx2(n, e, m); else
#endif
        mlc__exp_shifted_lanes(n, e, m, 4);
        for (i = 0; i < n; i++) s += (mlc__sum_t)e[i];
    } else
        for (i = 0; i < n; i++) {
            e[(size_t)i * stride] = MLC_EXPF(e[(size_t)i * stride] - m);
            s += (mlc__sum_t)e[(size_t)i * stride];
        }
    return s;
}

/* rows [begin, end) of the op: row r is (o, k) = (r / inner, r % inner), len floats inner apart;
   a half x and y (mlc__cpu_takes_half, forward: rows of inner 1) widened and rounded a row at a
   time in the thread's scratch (2 len floats), the stand-ins' values */
typedef struct mlc__softmax_job { const mlc__node *n; float *rows; } mlc__softmax_job;
static void mlc__softmax_rows(void *arg, int slot, size_t begin, size_t end) {
    const mlc__softmax_job *job = (const mlc__softmax_job *)arg;
    const mlc__node *n = job->n;
    const int len = n->args.softmax.len, is_log = n->args.softmax.is_log;
    const size_t inner = (size_t)n->args.softmax.inner;
    float *x_row = job->rows ? job->rows + (size_t)slot * 2 * (size_t)len : NULL;
    float *y_row = x_row ? x_row + len : NULL;
    size_t r;
    int i;
    for (r = begin; r < end; r++) {
        const size_t at = r / inner * (size_t)len * inner + r % inner;
        const float *p = x_row ? x_row : n->in[0]->data + at;
        float *q = y_row ? y_row : n->out->data + at, m, log_s, inverse_s;
        mlc__sum_t s;
        if (x_row) mlc__widen(n->in[0]->dtype, n->in[0]->half + at, x_row, (size_t)len);
        m = p[0];
        for (i = 1; i < len; i++) if (p[(size_t)i * inner] > m) m = p[(size_t)i * inner];
        for (i = 0; i < len; i++) q[(size_t)i * inner] = p[(size_t)i * inner];
        s = mlc__exp_shifted(len, inner, q, m);
        log_s = (float)MLC__SUM_LOG(s);
        inverse_s = (float)(1 / s);
        for (i = 0; i < len; i++) {
            const size_t j = (size_t)i * inner;
            q[j] = is_log ? p[j] - m - log_s : q[j] * inverse_s;
        }
        if (y_row) mlc__narrow(n->out->dtype, y_row, n->out->half + at, (size_t)len);
    }
}

static int mlc__softmax_cpu(mlc__node *n) {
    mlc_ctx *ctx = n->out->ctx;
    const size_t len = (size_t)n->args.softmax.len, rows = n->out->size / len;
    const size_t from = MLC__MAP_PARALLEL / len + 1;
    const int half = mlc__is_half(n->out->dtype);
    mlc__softmax_job job;
    mlc_frame scratch = mlc_frame_begin(ctx);            /* a half op's rows go at once */
    job.n = n;
    job.rows = half ? mlc__floats(ctx, 2 * len * (size_t)mlc__slots(ctx, rows, from), n->name) : NULL;
    if (job.rows || !half) mlc__parallel(ctx, rows, from, mlc__softmax_rows, &job);
    mlc_frame_end(scratch);
    return job.rows || !half;
}

static mlc_tensor *mlc__softmax(const char *op, int is_log, mlc_tensor *x, int axis) {
    size_t outer, inner;
    int len;
    mlc_tensor *out;
    mlc__node call;
    x = mlc__autocast_f32(x);
    MLC__ENTER(op, x);
    if (!mlc__axis(ctx, op, x, &axis)) return NULL;
    mlc__split(x, axis, &outer, &len, &inner);
    out = mlc__like(x, op);
    if (!out || len == 0 || inner == 0) return out;
    mlc__call(&call, MLC__OP_SOFTMAX, op, out, x, NULL, NULL, NULL);
    call.args.softmax.is_log = is_log; call.args.softmax.len = len; call.args.softmax.inner = (int)inner;
    if (!mlc__run(ctx, &call)) return NULL;
    mlc__record(&call);
    return out;
}

MLCDEF mlc_tensor *mlc_softmax(mlc_tensor *x, int axis) { return mlc__softmax("mlc_softmax", 0, x, axis); }
MLCDEF mlc_tensor *mlc_log_softmax(mlc_tensor *x, int axis) {
    return mlc__softmax("mlc_log_softmax", 1, x, axis);
}

/* ============================================================================================
   @section losses  Losses. Reduction: mean (over counted elements), sum, or none (one loss per element/row).
     cross_entropy  ℓ_i = -Σ_c q_c log softmax(x_i)[c]  dx_i = g (softmax(x_i) - q),
                    q = (1 - ε) onehot(t_i) + ε / C (label smoothing ε; 0: q is the one-hot)
     nll            ℓ_i = -x_i[t_i]                     dx_i[t_i] = -g
     mse            ℓ = (p - t)²                        dp = 2 g (p - t)      dt = -dp
     bce_logits     ℓ = max(x,0) - x t + ln(1 + e^-|x|) dx = g (σ(x) - t)     dt = -g x
   ============================================================================================ */

/* Per-element weight of the incoming gradient: g_i for none, g / count for mean, g for sum. */
static float mlc__loss_scale(const mlc__node *n, size_t i) {
    const float *g = n->out->grad;
    if (n->args.loss.reduction == MLC_REDUCE_NONE) return g[i];
    return n->args.loss.reduction == MLC_REDUCE_MEAN ? g[0] * n->args.loss.scale : g[0];
}

/* The output of a loss: one value per element (none) or a scalar. */
static mlc_tensor *mlc__loss_make(mlc_ctx *ctx, const char *op, mlc_reduction red, int ndim,
                                  const int *shape) {
    if ((unsigned)red > (unsigned)MLC_REDUCE_NONE)            /* negative too */
        return (mlc_tensor *)mlc__fail(ctx, MLC_ERR_ARG, "%s: unknown reduction %d", op, (int)red);
    return mlc__make(ctx, op, red == MLC_REDUCE_NONE ? ndim : 0, shape, 0);
}

/* ... filled from per-element values l[0..count): l itself for none, else their sum or mean. */
static void mlc__loss_reduce(mlc_tensor *out, mlc_reduction red, const float *l, size_t count,
                             size_t counted) {
    mlc__sum_t s = 0;
    size_t i;
    if (red == MLC_REDUCE_NONE) { memcpy(out->data, l, count * sizeof(float)); return; }
    for (i = 0; i < count; i++) s += (mlc__sum_t)l[i];
    out->data[0] = (float)(red == MLC_REDUCE_MEAN ? s / (mlc__sum_t)counted : s);
}

static void mlc__class_loss_backward(mlc__node *n) {   /* cross entropy (saved probs) and nll */
    mlc_tensor *x = n->in[0], *t = n->in[1];
    float *gx = mlc__grad(x);
    const float *probs = (const float *)n->saved;
    float eps = n->args.loss.smoothing;
    int N = x->shape[0], C = x->shape[1], i, c;
    for (i = 0; i < N; i++) {
        int target = (int)t->data[i];
        float g;
        if (target == n->args.loss.ignore_index) continue;
        g = mlc__loss_scale(n, (size_t)i);
        if (probs) for (c = 0; c < C; c++) gx[(size_t)i * C + c] += g * (probs[(size_t)i * C + c] - eps / C);
        gx[(size_t)i * C + target] -= g * (1.0f - eps);
    }
}

/* The rows' losses (cross entropy keeps its probabilities for backward), reduced. A row whose
   target is ignore_index (-1 when none is) counts for nothing. */
static int mlc__class_loss_cpu(mlc__node *n) {
    const mlc_tensor *x = n->in[0];
    const float *tgt = n->in[1]->data, eps = n->args.loss.smoothing;
    const int N = x->shape[0], C = x->shape[1], softmax_first = n->args.loss.softmax_first;
    const float ignore = (float)n->args.loss.ignore_index;
    float *l = mlc__floats(n->out->ctx, (size_t)N, n->name), *probs = NULL;
    size_t counted = 0;
    int i, c;
    if (softmax_first) probs = mlc__floats(n->out->ctx, (size_t)N * C, n->name);
    if (!l || (softmax_first && !probs)) return 0;
    for (i = 0; i < N; i++) {
        const float *row = x->data + (size_t)i * C;
        int tc = (int)tgt[i];
        l[i] = 0.0f;
        if (tgt[i] == ignore) continue;
        counted++;
        if (softmax_first) {
            float m = row[0], *p = probs + (size_t)i * C, inverse_s;
            mlc__sum_t s, sx = 0;                        /* sx: Σ_c (x_c - m), for smoothing */
            for (c = 1; c < C; c++) if (row[c] > m) m = row[c];
            memcpy(p, row, (size_t)C * sizeof *p);
            s = mlc__exp_shifted(C, 1, p, m);
            inverse_s = (float)(1 / s);
            for (c = 0; c < C; c++) p[c] *= inverse_s;
            if (eps > 0.0f) for (c = 0; c < C; c++) sx += (mlc__sum_t)(row[c] - m);
            l[i] = (float)(MLC__SUM_LOG(s) - (mlc__sum_t)(1.0f - eps) * (mlc__sum_t)(row[tc] - m)
                           - (mlc__sum_t)eps / C * sx);
        } else l[i] = -row[tc];
    }
    mlc__loss_reduce(n->out, (mlc_reduction)n->args.loss.reduction, l, (size_t)N, counted);
    n->saved = probs;
    return 1;
}

static mlc_tensor *mlc__class_loss(const char *op, int softmax_first, mlc_tensor *x, mlc_tensor *target,
                                   mlc_reduction red, int ignore_index, float eps) {
    int N, C, i;
    size_t counted = 0;
    const float *tgt;
    mlc_tensor *out;
    mlc__node call;
    x = mlc__autocast_f32(x);
    MLC__ENTER(op, x, target);
    ctx->op_dtype = x->dtype;                            /* (target: classes, not values) */
    if (x->ndim != 2 || target->ndim != 1 || target->shape[0] != x->shape[0])
        return (mlc_tensor *)mlc__fail(
            ctx, MLC_ERR_SHAPE, "%s: expects input [N, C] and target [N], got %T and %T", op, x, target);
    if (!mlc__in_range(ctx, op, "label_smoothing", eps, 0.0f, 1.0f, 0)) return NULL;
    N = x->shape[0]; C = x->shape[1];
    tgt = mlc__host(target);                             /* targets are checked on the host */
    for (i = 0; i < N; i++) {
        if (tgt[i] == (float)ignore_index && ignore_index != MLC_NO_IGNORE) continue;
        if (mlc__index(ctx, op, tgt[i], C, (size_t)i) < 0) return NULL;
        counted++;
    }
    if (!(out = mlc__loss_make(ctx, op, red, 1, target->shape))) return NULL;
    mlc__call(&call, MLC__OP_CLASS_LOSS, op, out, x, target, NULL, NULL);   /* target gets no gradient */
    call.args.loss.reduction = (int)red;
    call.args.loss.ignore_index = ignore_index == MLC_NO_IGNORE ? -1 : ignore_index;
    call.args.loss.softmax_first = softmax_first; call.args.loss.scale = 1.0f / (float)counted;
    call.args.loss.smoothing = eps;
    if (!mlc__run(ctx, &call)) return NULL;
    mlc__record(&call);
    return out;
}

MLCDEF mlc_tensor *mlc_cross_entropy(mlc_tensor *logits, mlc_tensor *target, mlc_reduction reduction,
                                     int ignore_index) {
    return mlc__class_loss("mlc_cross_entropy", 1, logits, target, reduction, ignore_index, 0.0f);
}
MLCDEF mlc_tensor *mlc_cross_entropy_opts(mlc_tensor *logits, mlc_tensor *target, mlc_ce_opts opts) {
    return mlc__class_loss("mlc_cross_entropy_opts", 1, logits, target, opts.reduction,
                           opts.ignore ? opts.ignore_index : MLC_NO_IGNORE, opts.label_smoothing);
}
MLCDEF mlc_tensor *mlc_nll_loss(mlc_tensor *log_probs, mlc_tensor *target, mlc_reduction reduction,
                                int ignore_index) {
    return mlc__class_loss("mlc_nll_loss", 0, log_probs, target, reduction, ignore_index, 0.0f);
}

/* The pointwise losses, one line each: ℓ(x, t), ∂ℓ/∂x and ∂ℓ/∂t, for input x and target t.
   The line makes the enum value, the public function, the CPU loops and the OpenCL cases. */
#define MLC__POINTWISE_LOSSES(X) \
    X(MSE, mse_loss,        (x - t) * (x - t),           2.0f * (x - t),        -2.0f * (x - t)) \
    X(BCE, bce_with_logits, (x > 0 ? x : 0.0f) - x * t + MLC_LOG1PF(MLC_EXPF(x < 0 ? x : -x)), \
                            mlc__sigmoidf(x) - t,        -x)
#define MLC__LOSS_ENUM(NAME, name, l, dx, dt) MLC__LOSS_##NAME,
typedef enum mlc__loss_kind { MLC__POINTWISE_LOSSES(MLC__LOSS_ENUM) MLC__LOSS_COUNT } mlc__loss_kind;
#undef MLC__LOSS_ENUM
#define MLC__LOSS_KIND_NAME(NAME, name, l, dx, dt) "LOSS_" #NAME,
/* for kernels */
static const char *const mlc__loss_kind_names[] = { MLC__POINTWISE_LOSSES(MLC__LOSS_KIND_NAME) };
#undef MLC__LOSS_KIND_NAME

static void mlc__pointwise_loss_backward(mlc__node *n) {
    mlc_tensor *p = n->in[0], *target = n->in[1];
    float *gp = mlc__grad(p), *gt = mlc__grad(target);
    size_t i;
    for (i = 0; i < p->size; i++) {
        const float g = mlc__loss_scale(n, i), x = p->data[i], t = target->data[i];
        float dx = 0.0f, dt = 0.0f;
        switch ((mlc__loss_kind)n->args.loss.kind) {
#define MLC__LOSS_GRAD(NAME, name, l, dx_, dt_) case MLC__LOSS_##NAME: dx = (dx_); dt = (dt_); break;
        MLC__POINTWISE_LOSSES(MLC__LOSS_GRAD)
#undef MLC__LOSS_GRAD
        case MLC__LOSS_COUNT: break;
        }
        if (gp) gp[i] += g * dx;
        if (gt) gt[i] += g * dt;
    }
}

static int mlc__pointwise_loss_cpu(mlc__node *n) {
    const mlc_tensor *p = n->in[0], *target = n->in[1];
    float *l = mlc__floats(n->out->ctx, p->size, n->name);
    size_t i;
    if (!l) return 0;
    for (i = 0; i < p->size; i++) {
        const float x = p->data[i], t = target->data[i];
        switch ((mlc__loss_kind)n->args.loss.kind) {
#define MLC__LOSS_FORWARD(NAME, name, l_, dx, dt) case MLC__LOSS_##NAME: l[i] = (l_); break;
        MLC__POINTWISE_LOSSES(MLC__LOSS_FORWARD)
#undef MLC__LOSS_FORWARD
        case MLC__LOSS_COUNT: break;
        }
    }
    mlc__loss_reduce(n->out, (mlc_reduction)n->args.loss.reduction, l, p->size, p->size);
    return 1;
}

static mlc_tensor *mlc__pointwise_loss(const char *op, mlc__loss_kind kind, mlc_tensor *p, mlc_tensor *target,
                                       mlc_reduction red) {
    mlc_tensor *out;
    mlc__node call;
    p = mlc__autocast_f32(p); target = mlc__autocast_f32(target);
    MLC__ENTER(op, p, target);
    if (!mlc_same_shape(p, target))
        return (mlc_tensor *)mlc__fail(ctx, MLC_ERR_SHAPE, "%s: input %T and target %T differ in shape", op,
                                       p, target);
    if (!(out = mlc__loss_make(ctx, op, red, p->ndim, p->shape))) return NULL;
    mlc__call(&call, MLC__OP_POINTWISE_LOSS, op, out, p, target, NULL, NULL);
    call.args.loss.reduction = (int)red;
    call.args.loss.kind = kind;
    call.args.loss.scale = 1.0f / (float)p->size;
    if (!mlc__run(ctx, &call)) return NULL;
    mlc__record(&call);
    return out;
}

#define MLC__LOSS_FUNCTION(NAME, name, l, dx, dt) \
    MLCDEF mlc_tensor *mlc_##name(mlc_tensor *x, mlc_tensor *target, mlc_reduction reduction) { \
        return mlc__pointwise_loss("mlc_" #name, MLC__LOSS_##NAME, x, target, reduction); \
    }
MLC__POINTWISE_LOSSES(MLC__LOSS_FUNCTION)
#undef MLC__LOSS_FUNCTION

/* ============================================================================================
   @section shape  Shape ops. reshape shares storage; the others copy. Gradients flow back through the same
   index map:  y = x[map(i)]   dx[map(i)] += g[i]
   ============================================================================================ */

/* reshape's output is a view of its input that mlc_reshape makes: nothing to compute, and no
   call to run (its row in MLC__OPS has this for its forward) */
static int mlc__reshape_cpu(mlc__node *n) { (void)n; return 1; }

static void mlc__accumulate_backward(mlc__node *n) {   /* reshape, copy: dx = g */
    float beta, *gx = mlc__grad_to_overwrite(n->in[0], &beta);
    if (!gx) return;
    if (beta == 0.0f) memcpy(gx, n->out->grad, n->out->size * sizeof(float));
    else mlc__axpy(n->out->size, 1.0f, n->out->grad, gx);
}

MLCDEF mlc_tensor *mlc_reshape(mlc_tensor *x, int ndim, const int *shape) {
    int s[MLC_MAX_DIMS] = {0}, d, infer = -1, fits = 1;
    size_t known = 1;
    mlc_tensor *out, *const in[1] = { x };
    mlc__node call;
    mlc_ctx *ctx = mlc__enter_as("mlc_reshape", 1, in, 1);   /* (an int8 view too) */
    if (!ctx) return NULL;
    if (ndim < 0 || ndim > MLC_MAX_DIMS || (ndim && !shape))
        return (mlc_tensor *)mlc__fail(ctx, MLC_ERR_SHAPE, "mlc_reshape: rank %d is outside 0..%d", ndim,
                                       MLC_MAX_DIMS);
    for (d = 0; d < ndim; d++) {
        s[d] = shape[d];
        if (s[d] == -1 && infer < 0) infer = d;
        else if (s[d] < 0)
            return (mlc_tensor *)mlc__fail(ctx, MLC_ERR_SHAPE,
                                           "mlc_reshape: bad dimension %d in the new shape of %T", s[d], x);
        /* a product that overflows: no fit */
        else fits = fits && mlc__size(known, (size_t)s[d], 0, &known);
    }
    if (infer < 0) fits = fits && known == x->size;
    else if ((fits = fits && known && x->size % known == 0 && x->size / known <= 2147483647u) != 0)
        s[infer] = (int)(x->size / known);      /* a dimension fits in an int */
    if (!fits) {
        char want[96] = "[", *w = want + 1;
        for (d = 0; d < ndim && w < want + 80; d++) {
            mlc__format(w, 12, d ? ", %d" : "%d", shape[d]);
            w += strlen(w);
        }
        strcpy(w, "]");
        return (mlc_tensor *)mlc__fail(ctx, MLC_ERR_SHAPE, "mlc_reshape: cannot view %T (%zu elements) as %s",
                                       x, x->size, want);
    }
    out = (mlc_tensor *)mlc__arena_alloc(ctx, sizeof(mlc_tensor), "mlc_reshape");
    if (!out) return NULL;
    mlc__view(out, x);                  /* same data, new shape, no gradient of its own */
    out->ndim = ndim;
    memcpy(out->shape, s, (size_t)ndim * sizeof(int));
    out->grad = NULL; out->device_grad = NULL; out->node = NULL; out->requires_grad = 0; out->persistent = 0;
    mlc__call(&call, MLC__OP_RESHAPE, "mlc_reshape", out, x, NULL, NULL, NULL);
    if (x->on_device) {                 /* a view of x's device buffer too, as current as x's */
        out->device_data = x->device_data;
        call.device = ctx->backend->kernels[MLC__OP_RESHAPE];   /* dx += g runs there */
    }
    out->stale = x->stale & (MLC__HOST_STALE | MLC__DEVICE_STALE);  /* as current as x */
    mlc__record(&call);
    return out;
}

MLCDEF mlc_tensor *mlc_flatten(mlc_tensor *x, int start_axis) {
    int shape[MLC_MAX_DIMS], d;
    if (!x || !MLC__ARGS_OK(x->ctx, "mlc_flatten", x)) return NULL;
    if (!mlc__axis(x->ctx, "mlc_flatten", x, &start_axis)) return NULL;
    for (d = 0; d < start_axis; d++) shape[d] = x->shape[d];
    if (mlc__numel(x->ndim - start_axis, x->shape + start_axis) > 2147483647u)
        return (mlc_tensor *)mlc__fail(x->ctx, MLC_ERR_SHAPE,
                                       "mlc_flatten: %T from axis %d has more elements "
                                       "than one dimension (an int) holds",
                                       x, start_axis);
    shape[start_axis] = (int)mlc__numel(x->ndim - start_axis, x->shape + start_axis);
    return mlc_reshape(x, start_axis + 1, shape);
}

MLCDEF mlc_tensor *mlc_detach(mlc_tensor *x) {
    mlc_tensor *out;
    MLC__ENTER("mlc_detach", x);
    out = (mlc_tensor *)mlc__arena_alloc(ctx, sizeof(mlc_tensor), "mlc_detach");
    if (!out) return NULL;
    mlc__view(out, x);
    out->grad = NULL; out->device_grad = NULL; out->node = NULL; out->requires_grad = 0; out->persistent = 0;
    out->stale &= ~(unsigned)(MLC__GRAD_HOST_STALE | MLC__GRAD_DEVICE_STALE | MLC__GRAD_ZERO);
    return out;
}

/* copy and to_dtype: the values as they are, widened or rounded (mlc__cpu_takes_half) */
static int mlc__copy_cpu(mlc__node *n) {
    const mlc_tensor *x = n->in[0];
    mlc_tensor *y = n->out;
    if (!y->size) return 1;
    if (x->dtype == MLC_F32 && y->dtype == MLC_F32) memcpy(y->data, x->data, y->size * sizeof(float));
    else if (x->dtype == y->dtype) memcpy(y->half, x->half, y->size * sizeof(uint16_t));
    else if (x->dtype == MLC_F32) mlc__convert_shared(y->ctx, y->dtype, 1, x->data, y->half, y->size);
    else mlc__convert_shared(y->ctx, x->dtype, 0, x->half, y->data, y->size);
    return 1;
}

MLCDEF mlc_tensor *mlc_copy(mlc_tensor *x) {
    mlc_tensor *out;
    mlc__node call;
    MLC__ENTER("mlc_copy", x);
    out = mlc__like(x, "mlc_copy");
    if (!out) return NULL;
    mlc__call(&call, MLC__OP_COPY, "mlc_copy", out, x, NULL, NULL, NULL);
    if (!mlc__run(ctx, &call)) return NULL;
    mlc__record(&call);
    return out;
}

/* to_dtype: a copy of x in another dtype (COPY with a bf16 or f16 side runs through
   mlc__cpu_widened, which rounds)      dx += g */
MLCDEF mlc_tensor *mlc_to_dtype(mlc_tensor *x, mlc_scalar_type dtype) {
    mlc_tensor *out;
    mlc__node call;
    MLC__ENTER("mlc_to_dtype", x);
    if ((unsigned)dtype > (unsigned)MLC_F16)
        return (mlc_tensor *)mlc__fail(ctx, MLC_ERR_ARG, "mlc_to_dtype: %d is not a dtype", (int)dtype);
    if (dtype == x->dtype) return x;
    ctx->op_dtype = dtype;
    if (!(out = mlc__like(x, "mlc_to_dtype"))) return NULL;
    mlc__call(&call, MLC__OP_COPY, "mlc_to_dtype", out, x, NULL, NULL, NULL);
    if (!mlc__run(ctx, &call)) return NULL;
    mlc__record(&call);
    return out;
}

/* permute: y[i_0..i_n] = x[i_order^-1...]; walks the output in order, the input by strides. */
/* dst = src permuted (forward: floats, or with src16 and dst16 the 16-bit values of a half tensor,
   moved as they are), or backward src (the output's gradient) added into dst where it came from */
static void mlc__permute_walk(const mlc_tensor *x, const int *order, const float *src, float *dst,
                              const uint16_t *src16, uint16_t *dst16, int backward) {
    size_t xstride[MLC_MAX_DIMS], ostride[MLC_MAX_DIMS], s = 1, i, j, step;
    int idx[MLC_MAX_DIMS] = {0}, d, nd = x->ndim;
    const size_t inner = nd ? (size_t)x->shape[order[nd - 1]] : 1;   /* the output's last axis */
    for (d = nd - 1; d >= 0; d--) { xstride[d] = s; s *= (size_t)x->shape[d]; }
    for (d = 0; d < nd; d++) ostride[d] = xstride[order[d]];
    step = nd ? ostride[nd - 1] : 1;
    for (i = 0; i < x->size; i += inner) {      /* row by row of the output */
        size_t off = 0;
        for (d = 0; d < nd - 1; d++) off += (size_t)idx[d] * ostride[d];
        if (backward) for (j = 0; j < inner; j++) dst[off + j * step] += src[i + j];
        else if (dst16) for (j = 0; j < inner; j++) dst16[i + j] = src16[off + j * step];
        else for (j = 0; j < inner; j++) dst[i + j] = src[off + j * step];
        for (d = nd - 2; d >= 0; d--) { if (++idx[d] < x->shape[order[d]]) break; idx[d] = 0; }
    }
}

static void mlc__permute_backward(mlc__node *n) {
    mlc__permute_walk(n->in[0], n->args.permute.order, n->out->grad, mlc__grad(n->in[0]), NULL, NULL, 1);
}

static int mlc__permute_cpu(mlc__node *n) {
    const int half = mlc__is_half(n->out->dtype);         /* (mlc__cpu_takes_half) */
    mlc__permute_walk(n->in[0], n->args.permute.order, n->in[0]->data, n->out->data,
                      half ? n->in[0]->half : NULL, half ? n->out->half : NULL, 0);
    return 1;
}

MLCDEF mlc_tensor *mlc_permute(mlc_tensor *x, const int *order) {
    int shape[MLC_MAX_DIMS], seen[MLC_MAX_DIMS] = {0}, ord[MLC_MAX_DIMS], d;
    mlc_tensor *out;
    mlc__node call;
    MLC__ENTER("mlc_permute", x);
    if (!order) return (mlc_tensor *)mlc__fail(ctx, MLC_ERR_NULL, "mlc_permute: order is NULL");
    for (d = 0; d < x->ndim; d++) {
        ord[d] = order[d] < 0 ? order[d] + x->ndim : order[d];
        if (ord[d] < 0 || ord[d] >= x->ndim || seen[ord[d]]++)
            return (mlc_tensor *)mlc__fail(ctx, MLC_ERR_INDEX,
                                           "mlc_permute: order is not a permutation of the %d axes of %T",
                                           x->ndim, x);
        shape[d] = x->shape[ord[d]];
    }
    out = mlc__make(ctx, "mlc_permute", x->ndim, shape, 0);
    if (!out) return NULL;
    mlc__call(&call, MLC__OP_PERMUTE, "mlc_permute", out, x, NULL, NULL, NULL);
    memcpy(call.args.permute.order, ord, sizeof(int) * (size_t)x->ndim);
    if (!mlc__run(ctx, &call)) return NULL;
    mlc__record(&call);
    return out;
}

MLCDEF mlc_tensor *mlc_transpose(mlc_tensor *x, int axis0, int axis1) {
    int order[MLC_MAX_DIMS], d;
    MLC__ENTER("mlc_transpose", x);
    if (!mlc__axis(ctx, "mlc_transpose", x, &axis0) || !mlc__axis(ctx, "mlc_transpose", x, &axis1))
        return NULL;
    for (d = 0; d < x->ndim; d++) order[d] = d;
    order[axis0] = axis1; order[axis1] = axis0;
    return mlc_permute(x, order);
}

/* slice along an axis: y = x[..., start:end, ...], Python's clamping of start and end */
static void mlc__slice_backward(mlc__node *n) {
    mlc_tensor *x = n->in[0];
    float *gx = mlc__grad(x);
    size_t outer, inner, o;
    int len, start = n->args.slice.start, count = n->args.slice.count;
    mlc__split(x, n->args.slice.axis, &outer, &len, &inner);
    for (o = 0; o < outer; o++) {
        const float *g = n->out->grad + o * count * inner;
        float *d = gx + (o * len + start) * inner;
        size_t k;
        for (k = 0; k < (size_t)count * inner; k++) d[k] += g[k];
    }
}

static int mlc__slice_cpu(mlc__node *n) {
    const int start = n->args.slice.start, count = n->args.slice.count;
    size_t outer, inner, o;
    int len;
    mlc__split(n->in[0], n->args.slice.axis, &outer, &len, &inner);
    for (o = 0; o < outer; o++)
        memcpy(n->out->data + o * count * inner, n->in[0]->data + (o * len + start) * inner,
               (size_t)count * inner * sizeof(float));
    return 1;
}

MLCDEF mlc_tensor *mlc_slice(mlc_tensor *x, int axis, int start, int end) {
    int shape[MLC_MAX_DIMS], len, count;
    size_t outer, inner;
    mlc_tensor *out;
    mlc__node call;
    MLC__ENTER("mlc_slice", x);
    if (!mlc__axis(ctx, "mlc_slice", x, &axis)) return NULL;
    mlc__split(x, axis, &outer, &len, &inner);
    if (start < 0) start += len;
    if (end < 0) end += len;
    start = start < 0 ? 0 : start > len ? len : start;
    end = end < start ? start : end > len ? len : end;
    count = end - start;
    memcpy(shape, x->shape, sizeof shape);
    shape[axis] = count;
    out = mlc__make(ctx, "mlc_slice", x->ndim, shape, 0);
    if (!out) return NULL;
    mlc__call(&call, MLC__OP_SLICE, "mlc_slice", out, x, NULL, NULL, NULL);
    call.args.slice.start = start; call.args.slice.count = count; call.args.slice.axis = axis;
    if (!mlc__run(ctx, &call)) return NULL;
    mlc__record(&call);
    return out;
}

/* concat along an axis; each input's gradient is its slab of g */
static void mlc__concat_backward(mlc__node *n) {
    mlc_tensor **xs = (mlc_tensor **)n->saved;
    int count = n->args.concat.count, axis = n->args.concat.axis, total = n->out->shape[axis], k, offset = 0;
    for (k = 0; k < count; k++) {
        size_t outer, inner, o, j;
        int len;
        float *gx = mlc__grad(xs[k]);
        mlc__split(xs[k], axis, &outer, &len, &inner);
        if (gx)
            for (o = 0; o < outer; o++)
                for (j = 0; j < (size_t)len * inner; j++)
                    gx[o * len * inner + j] += n->out->grad[(o * total + offset) * inner + j];
        if (gx) mlc__host_wrote_grad(xs[k]);          /* the node lists only one of them */
        offset += len;
    }
}

/* (the inputs are the saved list; in[0] is one of them, the one the tape follows) */
static int mlc__concat_cpu(mlc__node *n) {
    mlc_tensor *const *xs = (mlc_tensor *const *)n->saved;
    int k, axis = n->args.concat.axis, total = n->out->shape[axis], offset = 0;
    for (k = 0; k < n->args.concat.count; k++) {
        size_t outer, inner, o;
        int len;
        const float *src = mlc__host(xs[k]);
        mlc__split(xs[k], axis, &outer, &len, &inner);
        for (o = 0; o < outer; o++)
            memcpy(n->out->data + (o * total + offset) * inner, src + o * len * inner,
                   (size_t)len * inner * sizeof(float));
        offset += len;
    }
    return 1;
}

MLCDEF mlc_tensor *mlc_concat(mlc_ctx *ctx, mlc_tensor *const *xs, int count, int axis) {
    int shape[MLC_MAX_DIMS], k, d, total = 0;
    mlc_tensor *out, **saved, *needs_grad = NULL;
    mlc__node call;
    if (!ctx || ctx->error) return NULL;
    if (!xs || count < 1)
        return (mlc_tensor *)mlc__fail(ctx, xs ? MLC_ERR_ARG : MLC_ERR_NULL, "mlc_concat: %s (count %d)",
                                       xs ? "no inputs" : "the list of inputs is NULL", count);
    for (k = 0; k < count; k++)
        if (xs[k] && xs[k]->ctx != ctx)
            return (mlc_tensor *)mlc__fail(ctx, MLC_ERR_ARG,
                                           "mlc_concat: input %d belongs to another context", k);
    if (!mlc__enter("mlc_concat", count, xs)) return NULL;
    if (!mlc__axis(ctx, "mlc_concat", xs[0], &axis)) return NULL;
    for (k = 0; k < count; k++) {
        for (d = 0; d < xs[0]->ndim; d++)
            if (xs[k]->ndim != xs[0]->ndim || (d != axis && xs[k]->shape[d] != xs[0]->shape[d]))
                return (mlc_tensor *)mlc__fail(
                    ctx, MLC_ERR_SHAPE, "mlc_concat: input %d %T does not fit input 0 %T along axis %d", k,
                    xs[k], xs[0], axis);
        total += xs[k]->shape[axis];
        if (xs[k]->requires_grad) needs_grad = xs[k];
    }
    memcpy(shape, xs[0]->shape, sizeof shape);
    shape[axis] = total;
    out = mlc__make(ctx, "mlc_concat", xs[0]->ndim, shape, 0);
    if (!out) return NULL;
    saved = (mlc_tensor **)mlc__arena_alloc(ctx, (size_t)count * sizeof(mlc_tensor *), "mlc_concat");
    if (!saved) return NULL;
    memcpy(saved, xs, (size_t)count * sizeof(mlc_tensor *));  /* the inputs, in a list of their own */
    mlc__call(&call, MLC__OP_CONCAT, "mlc_concat", out, needs_grad ? needs_grad : xs[0], NULL, NULL, NULL);
    call.saved = saved; call.args.concat.count = count; call.args.concat.axis = axis;
    if (!mlc__run(ctx, &call)) return NULL;
    mlc__record(&call);
    return out;
}

/* ============================================================================================
   @section indexing  Indexing ops. Indices are float tensors holding whole numbers (checked).
     index_select  y[.., l, ..] = x[.., idx[l], ..]        dx[.., idx[l], ..] += g[.., l, ..]
     gather        y[i] = x[i with axis coordinate idx[i]] dx[same] += g[i]
     embedding     y[..., :] = W[idx[...], :]             (index_select on axis 0)
   ============================================================================================ */

static void mlc__index_select_backward(mlc__node *n) {
    mlc_tensor *x = n->in[0], *idx = n->in[1];
    float *gx = mlc__grad(x);
    size_t outer, inner, o, k;
    int len, l, L = (int)idx->size;
    mlc__split(x, n->args.index_select.axis, &outer, &len, &inner);
    for (o = 0; o < outer; o++)
        for (l = 0; l < L; l++) {
            float *d = gx + (o * len + (size_t)idx->data[l]) * inner;
            const float *g = n->out->grad + (o * L + l) * inner;
            for (k = 0; k < inner; k++) d[k] += g[k];
        }
}

/* (half x: its 16-bit values moved as they are, mlc__cpu_takes_half; an embedding table in bf16
   is not widened whole to gather a few rows) */
static int mlc__index_select_cpu(mlc__node *n) {
    const float *idx = n->in[1]->data;
    const int L = n->in[1]->shape[0], half = mlc__is_half(n->out->dtype);
    const size_t size = half ? sizeof(uint16_t) : sizeof(float);
    const char *x = half ? (const char *)n->in[0]->half : (const char *)n->in[0]->data;
    char *y = half ? (char *)n->out->half : (char *)n->out->data;
    size_t outer, inner, o;
    int len, l;
    mlc__split(n->in[0], n->args.index_select.axis, &outer, &len, &inner);
    for (o = 0; o < outer; o++)
        for (l = 0; l < L; l++)
            memcpy(y + (o * L + l) * inner * size, x + (o * len + (size_t)idx[l]) * inner * size,
                   inner * size);
    return 1;
}

MLCDEF mlc_tensor *mlc_index_select(mlc_tensor *x, int axis, mlc_tensor *index) {
    int shape[MLC_MAX_DIMS], len, l, L;
    size_t outer, inner;
    const float *idx;
    mlc_tensor *out;
    mlc__node call;
    MLC__ENTER("mlc_index_select", x, index);
    ctx->op_dtype = x->dtype;                            /* (index: positions, not values) */
    if (!mlc__axis(ctx, "mlc_index_select", x, &axis)) return NULL;
    if (index->ndim != 1)
        return (mlc_tensor *)mlc__fail(ctx, MLC_ERR_SHAPE, "mlc_index_select: index must be 1-D, got %T",
                                       index);
    mlc__split(x, axis, &outer, &len, &inner);
    L = index->shape[0];
    idx = mlc__host(index);                              /* indices are checked on the host */
    for (l = 0; l < L; l++) if (mlc__index(ctx, "mlc_index_select", idx[l], len, (size_t)l) < 0) return NULL;
    memcpy(shape, x->shape, sizeof shape);
    shape[axis] = L;
    out = mlc__make(ctx, "mlc_index_select", x->ndim, shape, 0);
    if (!out) return NULL;
    /* index gets no gradient */
    mlc__call(&call, MLC__OP_INDEX_SELECT, "mlc_index_select", out, x, index, NULL, NULL);
    call.args.index_select.axis = axis;
    if (!mlc__run(ctx, &call)) return NULL;
    mlc__record(&call);
    return out;
}

/* Offset into x of every element of index (gather's map), into an arena array. */
static size_t *mlc__gather_map(mlc_ctx *ctx, const mlc_tensor *x, int axis, const mlc_tensor *index) {
    size_t *map = (size_t *)mlc__arena_alloc(ctx, index->size * sizeof(size_t) + 1, "mlc_gather"),
           xs[MLC_MAX_DIMS], s = 1, i;
    int idx[MLC_MAX_DIMS] = {0}, d;
    const float *where = mlc__host((mlc_tensor *)index);         /* indices are checked on the host */
    if (!map) return NULL;
    for (d = x->ndim - 1; d >= 0; d--) { xs[d] = s; s *= (size_t)x->shape[d]; }
    for (i = 0; i < index->size; i++) {
        size_t off = 0;
        int at = mlc__index(ctx, "mlc_gather", where[i], x->shape[axis], i);
        if (at < 0) return NULL;
        for (d = 0; d < x->ndim; d++) off += (size_t)(d == axis ? at : idx[d]) * xs[d];
        map[i] = off;
        for (d = x->ndim - 1; d >= 0; d--) { if (++idx[d] < index->shape[d]) break; idx[d] = 0; }
    }
    return map;
}

static void mlc__gather_backward(mlc__node *n) {
    const size_t *map = (const size_t *)n->saved;
    float *gx = mlc__grad(n->in[0]);
    size_t i;
    for (i = 0; i < n->out->size; i++) gx[map[i]] += n->out->grad[i];
}

static int mlc__gather_cpu(mlc__node *n) {
    const size_t *map = (const size_t *)n->saved;
    size_t i;
    for (i = 0; i < n->out->size; i++) n->out->data[i] = n->in[0]->data[map[i]];
    return 1;
}

MLCDEF mlc_tensor *mlc_gather(mlc_tensor *x, int axis, mlc_tensor *index) {
    mlc_tensor *out;
    mlc__node call;
    size_t *map;
    int d;
    MLC__ENTER("mlc_gather", x, index);
    ctx->op_dtype = x->dtype;                            /* (index: positions, not values) */
    if (!mlc__axis(ctx, "mlc_gather", x, &axis)) return NULL;
    if (index->ndim != x->ndim)
        return (mlc_tensor *)mlc__fail(ctx, MLC_ERR_SHAPE, "mlc_gather: index %T must have the rank of x %T",
                                       index, x);
    for (d = 0; d < x->ndim; d++)
        if (d != axis && index->shape[d] > x->shape[d])
            return (mlc_tensor *)mlc__fail(
                ctx, MLC_ERR_SHAPE, "mlc_gather: index %T is larger than x %T on axis %d", index, x, d);
    if (!(map = mlc__gather_map(ctx, x, axis, index))) return NULL;
    out = mlc__like(index, "mlc_gather");
    if (!out) return NULL;
    mlc__call(&call, MLC__OP_GATHER, "mlc_gather", out, x, NULL, NULL, NULL);
    call.saved = map;                   /* the offsets into x, one per output element */
    if (!mlc__run(ctx, &call)) return NULL;
    mlc__record(&call);
    return out;
}

MLCDEF mlc_tensor *mlc_embedding(mlc_tensor *weight, mlc_tensor *index) {
    int shape[MLC_MAX_DIMS], d;
    MLC__ENTER("mlc_embedding", weight, index);
    if (weight->ndim != 2 || index->ndim + 1 > MLC_MAX_DIMS)
        return (mlc_tensor *)mlc__fail(
            ctx, MLC_ERR_SHAPE, "mlc_embedding: weight %T must be [count, dim] and index %T of rank < %d",
            weight, index, MLC_MAX_DIMS);
    for (d = 0; d < index->ndim; d++) shape[d] = index->shape[d];
    shape[index->ndim] = weight->shape[1];
    for (d = 0; d < (int)index->size; d++)       /* checked here, so the error names this op */
        if (mlc__index(ctx, "mlc_embedding", mlc__host(index)[d], weight->shape[0], (size_t)d) < 0)
            return NULL;
    d = (int)index->size;
    return mlc_reshape(mlc_index_select(weight, 0, mlc_reshape(index, 1, &d)), index->ndim + 1, shape);
}

/* ============================================================================================
   @section norm  Dropout and normalisation
     dropout     y = x m / (1 - p), m ~ Bernoulli(1 - p)      dx = g m / (1 - p)
     layer_norm  over the last axes (D values):  x̂ = (x - μ) r,  r = 1/√(σ² + eps),  y = x̂ w + b
                 dx = r (ĝ - mean(ĝ) - x̂ mean(ĝ x̂)),  ĝ = g w;   dw = Σ g x̂;   db = Σ g
     batch_norm  the same per channel (axis 1) over the batch and spatial axes in training;
                 with the running statistics in eval, where dx = g w r
   ============================================================================================ */

static void mlc__dropout_backward(mlc__node *n) {
    float *gx = mlc__grad(n->in[0]);
    const float *m = (const float *)n->saved;
    size_t i;
    for (i = 0; i < n->out->size; i++) gx[i] += n->out->grad[i] * m[i];
}

/* The CPU draws its mask from the context's generator and keeps it for backward. */
static int mlc__dropout_cpu(mlc__node *n) {
    mlc_ctx *ctx = n->out->ctx;
    const float p = n->args.dropout.p, scale = p < 1.0f ? 1.0f / (1.0f - p) : 0.0f;
    float *mask = mlc__floats(ctx, n->out->size, n->name);
    size_t i;
    if (!mask) return 0;
    for (i = 0; i < n->out->size; i++) {
        mask[i] = mlc_rand_uniform(ctx) >= p ? scale : 0.0f;
        n->out->data[i] = n->in[0]->data[i] * mask[i];
    }
    n->saved = mask;
    return 1;
}

MLCDEF mlc_tensor *mlc_dropout(mlc_tensor *x, float p, int training) {
    mlc_tensor *out;
    mlc__node call;
    MLC__ENTER("mlc_dropout", x);
    if (!mlc__in_range(ctx, "mlc_dropout", "p", p, 0.0f, 1.0f, 0)) return NULL;
    if (!training || p == 0.0f) return x;
    out = mlc__like(x, "mlc_dropout");
    if (!out) return NULL;
    mlc__call(&call, MLC__OP_DROPOUT, "mlc_dropout", out, x, NULL, NULL, NULL);
    call.args.dropout.p = p;
    call.args.dropout.seed = mlc_rand_u32(ctx) >> 1;      /* a device draws its mask from this seed */
    if (!mlc__run(ctx, &call)) return NULL;
    mlc__record(&call);
    return out;
}

/* The norms' sums over n floats, in eight running sums of mlc__sum_t (double unless
   MLC_FLOAT_ONLY, as every long sum in mlc): lanes a[k] += u and b[k] += u·v for values k, k + 8,
   ..., where (u, v) are
     MLC__LANES_SUM       (x, -)                 a block's mean (b untouched)
     MLC__LANES_SQUARES   (x - mu, x - mu)       its squares about that mean
     MLC__LANES_GRAD      (g, g (x - mu) rs)     backward: Σ g and Σ g x̂ (v the product, in float)
   with x - mu and g (x - mu) rs in float, then widened. The last n % 8 values go in padded to 8
   with values that add nothing (x = mu, or 0 for a plain sum; g = 0). On AVX2 the lanes are
   four registers; the portable loop's arrays, which GCC keeps in memory (a store and a load every
   step), take the same operations in the same order, so both give the same bits. */
enum { MLC__LANES_SUM, MLC__LANES_SQUARES, MLC__LANES_GRAD };
#if MLC__X86 && !defined(MLC_FLOAT_ONLY)
/* (a += the 8 floats of v, widened: 4 to a pair of registers each) */
#define MLC__LANES_ADD(lo, hi, v)                                                  \
    do {                                                                           \
        lo = _mm256_add_pd(lo, _mm256_cvtps_pd(_mm256_castps256_ps128(v)));        \
        hi = _mm256_add_pd(hi, _mm256_cvtps_pd(_mm256_extractf128_ps(v, 1)));      \
    } while (0)
__attribute__((target("avx2")))
static size_t mlc__lanes8_avx2(int kind, const float *x, const float *g, size_t n, float mu, float rs,
                               double *a, double *b) {
    const __m256 m = _mm256_set1_ps(mu), r = _mm256_set1_ps(rs);
    __m256d a0 = _mm256_loadu_pd(a), a1 = _mm256_loadu_pd(a + 4), b0 = _mm256_loadu_pd(b),
            b1 = _mm256_loadu_pd(b + 4);
    size_t q = 0;
    if (kind == MLC__LANES_SUM)
        for (; q + 8 <= n; q += 8) MLC__LANES_ADD(a0, a1, _mm256_loadu_ps(x + q));
    else if (kind == MLC__LANES_SQUARES)
        for (; q + 8 <= n; q += 8) {
            const __m256 d = _mm256_sub_ps(_mm256_loadu_ps(x + q), m);
            const __m256d d0 = _mm256_cvtps_pd(_mm256_castps256_ps128(d)),
                          d1 = _mm256_cvtps_pd(_mm256_extractf128_ps(d, 1));
            a0 = _mm256_add_pd(a0, d0); a1 = _mm256_add_pd(a1, d1);
            b0 = _mm256_add_pd(b0, _mm256_mul_pd(d0, d0)); b1 = _mm256_add_pd(b1, _mm256_mul_pd(d1, d1));
        }
    else
        for (; q + 8 <= n; q += 8) {
            const __m256 gq = _mm256_loadu_ps(g + q), d = _mm256_sub_ps(_mm256_loadu_ps(x + q), m);
            MLC__LANES_ADD(a0, a1, gq);
            MLC__LANES_ADD(b0, b1, _mm256_mul_ps(gq, _mm256_mul_ps(d, r)));
        }
    _mm256_storeu_pd(a, a0); _mm256_storeu_pd(a + 4, a1);
    _mm256_storeu_pd(b, b0); _mm256_storeu_pd(b + 4, b1);
    return q;
}
#undef MLC__LANES_ADD
#endif
static void mlc__lanes8(int kind, const float *x, const float *g, size_t n, float mu, float rs, mlc__sum_t *a,
                        mlc__sum_t *b) {
    float xt[8], gt[8];
    size_t q = 0, k;
#if MLC__X86 && !defined(MLC_FLOAT_ONLY)
    if (n >= 32 && __builtin_cpu_supports("avx2")) q = mlc__lanes8_avx2(kind, x, g, n, mu, rs, a, b);
#endif
    for (; q < n; q += 8) {
        const float *xs = x + q, *gs = g ? g + q : NULL;
        if (n - q < 8) {                                 /* the last values, padded */
            for (k = 0; k < 8; k++) {
                xt[k] = k < n - q ? xs[k] : kind == MLC__LANES_SUM ? 0.0f : mu;
                gt[k] = k < n - q && gs ? gs[k] : 0.0f;
            }
            xs = xt; gs = gt;
        }
        for (k = 0; k < 8; k++) {
            const float d = xs[k] - mu;
            if (kind == MLC__LANES_SUM) a[k] += (mlc__sum_t)xs[k];
            else if (kind == MLC__LANES_SQUARES) {
                a[k] += (mlc__sum_t)d;
                b[k] += (mlc__sum_t)d * (mlc__sum_t)d;
            }
            else { a[k] += (mlc__sum_t)gs[k]; b[k] += (mlc__sum_t)(gs[k] * (d * rs)); }
        }
    }
}

/* The sum of the eight lanes, in a fixed order */
static mlc__sum_t mlc__lanes_total(const mlc__sum_t *a) {
    return ((a[0] + a[4]) + (a[1] + a[5])) + ((a[2] + a[6]) + (a[3] + a[7]));
}

/* A norm's statistics (a layer norm's row, a batch norm channel's runs): the values are cut
   into blocks of at most MLC__NORM_BLOCK floats (still in L1 for a second look), a block's mean
   and its squares about that mean taken in two passes (mlc__lanes8), and the blocks combined in
   mlc__sum_t (Chan, Golub and LeVeque's update: merging counts n_a, n_b with means m_a, m_b adds
   n_a n_b / (n_a + n_b) (m_b - m_a)² to the sum of squares). */
#define MLC__NORM_BLOCK 1024

typedef struct mlc__norm_stats { mlc__sum_t count, mean, squares; } mlc__norm_stats;

/* st takes in the n floats at x */
static void mlc__norm_stats_add(mlc__norm_stats *st, const float *x, size_t n) {
    size_t at;
    for (at = 0; at < n; at += MLC__NORM_BLOCK) {
        const size_t count = n - at < MLC__NORM_BLOCK ? n - at : MLC__NORM_BLOCK;
        mlc__sum_t a[8] = { 0, 0, 0, 0, 0, 0, 0, 0 }, b[8] = { 0, 0, 0, 0, 0, 0, 0, 0 };
        mlc__sum_t d, squares, block_mean, delta, total = st->count + (mlc__sum_t)count;
        float mean;
        mlc__lanes8(MLC__LANES_SUM, x + at, NULL, count, 0.0f, 0.0f, a, b);
        mean = (float)(mlc__lanes_total(a) / (mlc__sum_t)count);
        memset(a, 0, sizeof a);
        mlc__lanes8(MLC__LANES_SQUARES, x + at, NULL, count, mean, 1.0f, a, b);
        d = mlc__lanes_total(a);                          /* what is left of the mean's rounding */
        squares = mlc__lanes_total(b) - d * d / (mlc__sum_t)count;
        block_mean = (mlc__sum_t)mean + d / (mlc__sum_t)count;
        delta = block_mean - st->mean;
        st->mean += delta * (mlc__sum_t)count / total;
        st->squares += squares + delta * delta * st->count * (mlc__sum_t)count / total;
        st->count = total;
    }
}

/* sum_g += Σ g, sum_gx += Σ g x̂ over n floats, x̂ = (x - mu) rs (one pass: no blocks needed) */
static void mlc__norm_grad_sums(const float *x, const float *g, size_t n, float mu, float rs,
                                mlc__sum_t *sum_g, mlc__sum_t *sum_gx) {
    mlc__sum_t a[8] = { 0, 0, 0, 0, 0, 0, 0, 0 }, b[8] = { 0, 0, 0, 0, 0, 0, 0, 0 };
    mlc__lanes8(MLC__LANES_GRAD, x, g, n, mu, rs, a, b);
    *sum_g += mlc__lanes_total(a); *sum_gx += mlc__lanes_total(b);
}

/* dx = (overwrite ? 0 : dx) + scale (g - mean_g - x̂ mean_gx) over n floats, x̂ = (x - mu) rs */
static void mlc__norm_grad_x(size_t n, const float *MLC__RESTRICT x, const float *MLC__RESTRICT g,
                             float *MLC__RESTRICT dx, int overwrite, float mu, float rs, float scale,
                             float mean_g, float mean_gx) {
    size_t k;
    if (overwrite)
        MLC__VECTOR_LOOP(k, 0, n, { dx[k] = scale * (g[k] - mean_g - (x[k] - mu) * rs * mean_gx); });
    else MLC__VECTOR_LOOP(k, 0, n, { dx[k] += scale * (g[k] - mean_g - (x[k] - mu) * rs * mean_gx); });
}

/* Row by row: ĝ = g w (in scratch; g itself without a weight), its two means in eight running
   sums (mlc__norm_grad_sums) */
static void mlc__layer_norm_backward(mlc__node *n) {
    mlc_tensor *x = n->in[0], *w = n->in[1], *b = n->in[2];
    float *gx = mlc__grad(x), *gw = mlc__grad(w), *gb = mlc__grad(b);
    const float *stats = (const float *)n->saved, *g = n->out->grad;
    const size_t D = (size_t)n->args.layer_norm.D, rows = D ? x->size / D : 0;
    mlc_frame scratch = mlc_frame_begin(n->out->ctx);
    float *gh_row = w ? mlc__floats(n->out->ctx, D + 1, n->name) : NULL;
    size_t r, j;
    for (r = 0; (gh_row || !w) && r < rows; r++) {
        const float *xr = x->data + r * D, *gr = g + r * D, mu = stats[2 * r], rs = stats[2 * r + 1];
        const float *gh = w ? gh_row : gr;
        mlc__sum_t sum_gh = 0, sum_ghx = 0;
        if (w) MLC__VECTOR_LOOP(j, 0, D, { gh_row[j] = gr[j] * w->data[j]; });
        mlc__norm_grad_sums(xr, gh, D, mu, rs, &sum_gh, &sum_ghx);
        if (gw) MLC__VECTOR_LOOP(j, 0, D, { gw[j] += gr[j] * ((xr[j] - mu) * rs); });
        if (gb) MLC__VECTOR_LOOP(j, 0, D, { gb[j] += gr[j]; });
        if (gx)
            mlc__norm_grad_x(D, xr, gh, gx + r * D, 0, mu, rs, rs, (float)(sum_gh / (mlc__sum_t)D),
                             (float)(sum_ghx / (mlc__sum_t)D));
    }
    mlc_frame_end(scratch);
}

static mlc_tensor *mlc__layer_norm(const char *op, mlc_tensor *x, int dims, mlc_tensor *weight,
                                   mlc_tensor *bias, float eps);
MLCDEF mlc_tensor *mlc_layer_norm(mlc_tensor *x, mlc_tensor *weight, mlc_tensor *bias, float eps) {
    return mlc__layer_norm("mlc_layer_norm", x, 1, weight, bias, eps);
}

/* weight or bias of x's trailing `dims` dimensions, or NULL */
static int mlc__fits_last_dims(const mlc_tensor *t, const mlc_tensor *x, int dims) {
    return !t
        || (t->ndim == dims && memcmp(t->shape, x->shape + x->ndim - dims, (size_t)dims * sizeof(int)) == 0);
}

/* The threads share out the rows. Each row's mean and 1/σ (mlc__norm_stats_add: eight running
   sums) are kept for backward (stats: [rows, 2]). A half x and y (mlc__cpu_takes_half, forward)
   are widened and rounded a row at a time in the thread's scratch, a half weight and bias once:
   the float32 op's values, rounded once, as the stand-ins give. */
typedef struct mlc__layer_norm_job {
    const mlc__node *n;
    const float *w, *b;                 /* float32 weight and bias, or NULL */
    float *stats, *rows;                /* rows: a half x and y, 2 D floats per thread (else NULL) */
} mlc__layer_norm_job;

static void mlc__layer_norm_rows(void *arg, int slot, size_t begin, size_t end) {
    const mlc__layer_norm_job *job = (const mlc__layer_norm_job *)arg;
    const mlc_tensor *x = job->n->in[0], *out = job->n->out;
    const float *w = job->w, *b = job->b;
    const size_t D = (size_t)job->n->args.layer_norm.D;
    float *x_row = job->rows ? job->rows + (size_t)slot * 2 * D : NULL, *y_row = x_row ? x_row + D : NULL;
    size_t r, j;
    for (r = begin; r < end; r++) {
        mlc__norm_stats st = { 0, 0, 0 };
        const float *xr = x_row ? x_row : x->data + r * D;
        float *y = y_row ? y_row : out->data + r * D, mu, rs;
        if (x_row) mlc__widen(x->dtype, x->half + r * D, x_row, D);
        mlc__norm_stats_add(&st, xr, D);
        mu = job->stats[2 * r] = (float)st.mean;
        rs = job->stats[2 * r + 1] = (float)(1 / MLC__SUM_SQRT(st.squares / (mlc__sum_t)D
                                                                + (mlc__sum_t)job->n->args.layer_norm.eps));
        if (w && b) MLC__VECTOR_LOOP(j, 0, D, { y[j] = (xr[j] - mu) * rs * w[j] + b[j]; });
        else if (w) MLC__VECTOR_LOOP(j, 0, D, { y[j] = (xr[j] - mu) * rs * w[j]; });
        else if (b) MLC__VECTOR_LOOP(j, 0, D, { y[j] = (xr[j] - mu) * rs + b[j]; });
        else MLC__VECTOR_LOOP(j, 0, D, { y[j] = (xr[j] - mu) * rs; });
        if (y_row) mlc__narrow(out->dtype, y_row, out->half + r * D, D);
    }
}

static int mlc__layer_norm_cpu(mlc__node *n) {
    mlc_ctx *ctx = n->out->ctx;
    mlc_tensor *weight = n->in[1], *bias = n->in[2];
    const size_t D = (size_t)n->args.layer_norm.D, rows = D ? n->out->size / D : 0,
                 from = MLC__MAP_PARALLEL / (D + 1) + 1;
    mlc__layer_norm_job job;
    mlc_frame scratch;
    int ok;
    job.n = n;
    if (!(job.stats = mlc__floats(ctx, 2 * rows + 1, n->name))) return 0;
    scratch = mlc_frame_begin(ctx);                      /* the half rows and weights go at once */
    if (weight && mlc__is_half(weight->dtype)) weight = mlc__widened(weight, 1);
    if (bias && mlc__is_half(bias->dtype)) bias = mlc__widened(bias, 1);
    job.w = weight ? weight->data : NULL;
    job.b = bias ? bias->data : NULL;
    job.rows = mlc__is_half(n->out->dtype)
                 ? mlc__floats(ctx, 2 * D * (size_t)mlc__slots(ctx, rows, from), n->name) : NULL;
    ok = (weight || !n->in[1]) && (bias || !n->in[2]) && (job.rows || !mlc__is_half(n->out->dtype));
    if (ok) mlc__parallel(ctx, rows, from, mlc__layer_norm_rows, &job);
    mlc_frame_end(scratch);
    n->saved = job.stats;
    return ok;
}

MLCDEF mlc_tensor *mlc_layer_norm_dims(mlc_tensor *x, int dims, mlc_tensor *weight, mlc_tensor *bias,
                                       float eps) {
    return mlc__layer_norm("mlc_layer_norm_dims", x, dims, weight, bias, eps);
}
static mlc_tensor *mlc__layer_norm(const char *op, mlc_tensor *x, int dims, mlc_tensor *weight,
                                   mlc_tensor *bias, float eps) {
    mlc_tensor *out;
    mlc__node call;
    int D, j;
    size_t per_row = 1;
    x = mlc__autocast_f32(x); weight = mlc__autocast_f32(weight); bias = mlc__autocast_f32(bias);
    MLC__ENTER(op, x);
    if (!mlc__same_device(ctx, op, x, weight) || !mlc__same_device(ctx, op, x, bias))
        return NULL;
    if (dims < 1 || dims > x->ndim)
        return (mlc_tensor *)mlc__fail(ctx, MLC_ERR_SHAPE,
                                       "mlc_layer_norm: x %T has no %d last axes to normalise", x, dims);
    for (j = x->ndim - dims; j < x->ndim; j++) per_row *= (size_t)x->shape[j];   /* <= x->size */
    if (per_row > 2147483647u)
        return (mlc_tensor *)mlc__fail(ctx, MLC_ERR_SHAPE, "mlc_layer_norm: %zu values per row of x %T",
                                       per_row, x);
    D = (int)per_row;
    if (!mlc__fits_last_dims(weight, x, dims) || !mlc__fits_last_dims(bias, x, dims))
        return (mlc_tensor *)mlc__fail(ctx, MLC_ERR_SHAPE,
                                       "mlc_layer_norm: weight %T and bias %T must be x's last %d dimensions "
                                       "for x %T", weight, bias, dims, x);
    eps = mlc__setting(eps, 1e-5f);
    if (!mlc__in_range(ctx, "mlc_layer_norm", "eps", eps, 0.0f, FLT_MAX, 0)) return NULL;
    out = mlc__like(x, "mlc_layer_norm");
    if (!out) return NULL;
    mlc__call(&call, MLC__OP_LAYER_NORM, "mlc_layer_norm", out, x, weight, bias, NULL);
    call.args.layer_norm.eps = eps; call.args.layer_norm.D = D;
    if (!mlc__run(ctx, &call)) return NULL;
    mlc__record(&call);
    return out;
}


/* y = (x - mu) rs w + b over n floats */
static void mlc__bn_normalise(size_t n, const float *MLC__RESTRICT x, float *MLC__RESTRICT y, float mu,
                              float rs, float w, float b) {
    size_t k;
    MLC__VECTOR_LOOP(k, 0, n, { y[k] = (x[k] - mu) * rs * w + b; });
}

/* Batch norm runs channel by channel, the threads sharing out the channels (a channel's values
   are N runs of `inner` floats, one per image), and reads a channel once for its statistics
   (mlc__norm_stats_add over its runs). */
#define MLC__BN_PARALLEL 16384          /* values from which threads share out the channels */

/* A channel's values as runs: in place, N runs of `inner` floats C·inner apart; or, where runs
   are shorter than MLC__BN_GATHER floats (a [N, C] batch has runs of one), first copied into one
   run of N·inner floats in the thread's scratch, so the sums and maps below work on long runs.
   A [N, C] batch is copied MLC__BN_COLUMNS channels at a time, a row's part at a time (a column
   alone would read a cache line for every value). */
#define MLC__BN_GATHER 64
#define MLC__BN_COLUMNS 16
typedef struct mlc__bn_job {
    const mlc__node *n;
    float *gx, *gw, *gb;                /* backward's gradients (made before the threads start) */
    int gx_overwrite;                   /* gx is fresh: written, not added to */
    float *scratch;                     /* gathering: 3 group·N·inner floats per thread */
    int group;                          /* channels gathered at a time (1 in place) */
} mlc__bn_job;

/* channels [c, c + count) of t ([N, C, inner]) into dst (channel c + k at k·N·inner), or (back)
   dst into them, added where add */
static void mlc__bn_gather(float *t, float *dst, const mlc_tensor *x, size_t c, int count, int back,
                           int add) {
    const int N = x->shape[0], C = x->shape[1];
    const size_t inner = mlc__numel(x->ndim - 2, x->shape + 2), M = (size_t)N * inner;
    int i, k;
    if (inner == 1) {                                    /* a [N, C] batch: columns */
        for (i = 0; i < N; i++) {
            float *row = t + (size_t)i * C + c;
            for (k = 0; k < count; k++) {
                if (!back) dst[k * M + (size_t)i] = row[k];
                else if (add) row[k] += dst[k * M + (size_t)i];
                else row[k] = dst[k * M + (size_t)i];
            }
        }
        return;
    }
    for (k = 0; k < count; k++)
        for (i = 0; i < N; i++) {
            float *run = t + ((size_t)i * C + c + (size_t)k) * inner, *part = dst + k * M + (size_t)i * inner;
            if (!back) memcpy(part, run, inner * sizeof(float));
            else if (add) mlc__axpy(inner, 1.0f, part, run);
            else memcpy(run, part, inner * sizeof(float));
        }
}

/* Channels gathered together from channel c on (of [c, end)) */
static int mlc__bn_group(const mlc__bn_job *job, size_t c, size_t end) {
    return (int)(end - c < (size_t)job->group ? end - c : (size_t)job->group);
}

/* The job over C channels, its scratch from the arena (the threads take none); 0: out of memory */
static int mlc__bn_run(mlc__bn_job *job, mlc__range_fn fn) {
    const mlc_tensor *x = job->n->in[0];
    const size_t C = (size_t)x->shape[1], values = C ? x->size / C : 0,
                 from = MLC__BN_PARALLEL / (values + 1) + 1;
    job->scratch = NULL;
    job->group = mlc__numel(x->ndim - 2, x->shape + 2) == 1 ? MLC__BN_COLUMNS : 1;
    if (mlc__numel(x->ndim - 2, x->shape + 2) < MLC__BN_GATHER
        && !(job->scratch = mlc__floats(x->ctx, 3 * (size_t)job->group * values
                                                    * (size_t)mlc__slots(x->ctx, C, from) + 1,
                                        job->n->name)))
        return 0;
    mlc__parallel(x->ctx, C, from, fn, job);
    return 1;
}

/* backward over channels [begin, end):
     dW = Σ g x̂    db = Σ g    dx += w rs (g - mean(g) - x̂ mean(g x̂))   (eval: dx += w rs g) */
static void mlc__batch_norm_backward_channels(void *arg, int slot, size_t begin, size_t end) {
    const mlc__bn_job *job = (const mlc__bn_job *)arg;
    const mlc__node *n = job->n;
    const mlc_tensor *x = n->in[0], *w = n->in[1];
    const float *stats = (const float *)n->saved;
    const int C = x->shape[1], training = n->args.batch_norm.training;
    const size_t inner = mlc__numel(x->ndim - 2, x->shape + 2), M = (size_t)x->shape[0] * inner;
    const size_t runs = job->scratch ? 1 : (size_t)x->shape[0], len = job->scratch ? M : inner,
                 step = (size_t)C * inner, G = (size_t)(job->scratch ? job->group : 1) * M;
    float *buf = job->scratch ? job->scratch + (size_t)slot * 3 * G : NULL;
    size_t c, i, first = begin;
    for (c = begin; c < end; c++) {
        const size_t k = buf ? c - first : 0;           /* (gathered: channel c's place in the group) */
        const float mu = stats[2 * c], rs = stats[2 * c + 1], scale = (w ? w->data[c] : 1.0f) * rs;
        const float *xc = buf ? buf + k * M : x->data + c * inner,
                    *gc = buf ? buf + G + k * M : n->out->grad + c * inner;
        float *dx = buf ? buf + 2 * G + k * M : job->gx ? job->gx + c * inner : NULL;
        mlc__sum_t sum_g = 0, sum_gx = 0;
        float mean_g, mean_gx;
        if (buf && c == first) {                         /* the next group in */
            mlc__bn_gather(x->data, buf, x, c, mlc__bn_group(job, c, end), 0, 0);
            mlc__bn_gather(n->out->grad, buf + G, x, c, mlc__bn_group(job, c, end), 0, 0);
        }
        for (i = 0; i < runs; i++)
            mlc__norm_grad_sums(xc + i * step, gc + i * step, len, mu, rs, &sum_g, &sum_gx);
        if (job->gw) job->gw[c] += (float)sum_gx;
        if (job->gb) job->gb[c] += (float)sum_g;
        if (job->gx) {
            mean_g = training ? (float)(sum_g / (mlc__sum_t)M) : 0.0f;
            mean_gx = training ? (float)(sum_gx / (mlc__sum_t)M) : 0.0f;
            for (i = 0; i < runs; i++)
                mlc__norm_grad_x(len, xc + i * step, gc + i * step, dx + i * step, buf || job->gx_overwrite,
                                 mu, rs, scale, mean_g, mean_gx);
        }
        if (buf && (c + 1 == end || k + 1 == (size_t)job->group)) {   /* the group out */
            if (job->gx)
                mlc__bn_gather(job->gx, buf + 2 * G, x, first, (int)(c + 1 - first), 1, !job->gx_overwrite);
            first = c + 1;
        }
    }
}

static void mlc__batch_norm_backward(mlc__node *n) {
    mlc__bn_job job;                      /* (the gradients made here: the threads make nothing) */
    float beta;
    job.n = n; job.gx = mlc__grad_to_overwrite(n->in[0], &beta); job.gw = mlc__grad(n->in[1]);
    job.gb = mlc__grad(n->in[2]); job.gx_overwrite = beta == 0.0f;
    mlc__bn_run(&job, mlc__batch_norm_backward_channels);
}

/* forward over channels [begin, end): the batch's mean and variance in training (the running
   statistics move towards them, in place), else the running ones; mean and 1/σ are kept for
   backward.  y = (x - mean) / σ · w + b */
static void mlc__batch_norm_channels(void *arg, int slot, size_t begin, size_t end) {
    const mlc__bn_job *job = (const mlc__bn_job *)arg;
    const mlc__node *n = job->n;
    const mlc_tensor *x = n->in[0], *weight = n->in[1], *bias = n->in[2];
    mlc_tensor *running_mean = n->in[3], *running_var = n->in[4];
    const int C = x->shape[1], training = n->args.batch_norm.training;
    const float momentum = n->args.batch_norm.momentum, eps = n->args.batch_norm.eps;
    const size_t inner = mlc__numel(x->ndim - 2, x->shape + 2), M = (size_t)x->shape[0] * inner;
    const size_t runs = job->scratch ? 1 : (size_t)x->shape[0], len = job->scratch ? M : inner,
                 step = (size_t)C * inner, G = (size_t)(job->scratch ? job->group : 1) * M;
    float *stats = (float *)n->saved, *buf = job->scratch ? job->scratch + (size_t)slot * 3 * G : NULL;
    size_t c, i, first = begin;
    for (c = begin; c < end; c++) {
        const size_t k = buf ? c - first : 0;           /* (gathered: channel c's place in the group) */
        const float *xc = buf ? buf + k * M : x->data + c * inner;
        float *y = buf ? buf + G + k * M : n->out->data + c * inner;
        float mu, rs, wc = weight ? weight->data[c] : 1.0f, bc = bias ? bias->data[c] : 0.0f;
        if (buf && c == first)                           /* the next group in */
            mlc__bn_gather(x->data, buf, x, c, mlc__bn_group(job, c, end), 0, 0);
        if (training) {
            mlc__norm_stats st = { 0, 0, 0 };
            for (i = 0; i < runs; i++) mlc__norm_stats_add(&st, xc + i * step, len);
            if (running_mean)
                running_mean->data[c] = (1.0f - momentum) * running_mean->data[c] + momentum * (float)st.mean;
            if (running_var)
                running_var->data[c] = (1.0f - momentum) * running_var->data[c]
                                       + momentum * (float)(st.squares / (mlc__sum_t)(M - 1));
            stats[2 * c] = (float)st.mean;
            stats[2 * c + 1] = (float)(1 / MLC__SUM_SQRT(st.squares / (mlc__sum_t)M + (mlc__sum_t)eps));
        } else {                                /* in float: no double on a float-only FPU */
            stats[2 * c] = running_mean->data[c];
            stats[2 * c + 1] = 1.0f / MLC_SQRTF(running_var->data[c] + eps);
        }
        mu = stats[2 * c]; rs = stats[2 * c + 1];
        for (i = 0; i < runs; i++) mlc__bn_normalise(len, xc + i * step, y + i * step, mu, rs, wc, bc);
        if (buf && (c + 1 == end || k + 1 == (size_t)job->group)) {   /* the group out */
            mlc__bn_gather(n->out->data, buf + G, x, first, (int)(c + 1 - first), 1, 0);
            first = c + 1;
        }
    }
}

static int mlc__batch_norm_cpu(mlc__node *n) {
    mlc__bn_job job;
    memset(&job, 0, sizeof job);
    job.n = n;
    n->saved = mlc__floats(n->out->ctx, 2 * (size_t)n->in[0]->shape[1] + 1, n->name);
    if (!n->saved) return 0;
    if (n->args.batch_norm.training && n->in[3]) mlc__host_wrote(n->in[3]);
    if (n->args.batch_norm.training && n->in[4]) mlc__host_wrote(n->in[4]);
    return mlc__bn_run(&job, mlc__batch_norm_channels);
}

MLCDEF mlc_tensor *mlc_batch_norm(mlc_tensor *x, mlc_tensor *running_mean, mlc_tensor *running_var,
                                  mlc_tensor *weight, mlc_tensor *bias, int training, float momentum,
                                  float eps) {
    mlc_tensor *out, *params[4];
    mlc__node call;
    int N, C, p;
    size_t inner, M;
    x = mlc__autocast_f32(x); weight = mlc__autocast_f32(weight); bias = mlc__autocast_f32(bias);
    MLC__ENTER("mlc_batch_norm", x);
    params[0] = running_mean; params[1] = running_var; params[2] = weight; params[3] = bias;
    for (p = 0; p < 4; p++) if (!mlc__same_device(ctx, "mlc_batch_norm", x, params[p])) return NULL;
    if (x->ndim < 2)
        return (mlc_tensor *)mlc__fail(ctx, MLC_ERR_SHAPE, "mlc_batch_norm: x %T needs the shape [N, C, ...]",
                                       x);
    N = x->shape[0]; C = x->shape[1];
    for (p = 0; p < 4; p++)
        if (params[p] && (params[p]->ndim != 1 || params[p]->shape[0] != C))
            return (mlc_tensor *)mlc__fail(
                ctx, MLC_ERR_SHAPE, "mlc_batch_norm: parameter %T does not match the %d channels of x %T",
                params[p], C, x);
    inner = mlc__numel(x->ndim - 2, x->shape + 2);
    M = (size_t)N * inner;
    if (!training && (!running_mean || !running_var))
        return (mlc_tensor *)mlc__fail(ctx, MLC_ERR_ARG,
                                       "mlc_batch_norm: eval mode needs running_mean and running_var");
    if (training && M < 2)
        return (mlc_tensor *)mlc__fail(
            ctx, MLC_ERR_SHAPE, "mlc_batch_norm: training needs more than one value per channel, x is %T", x);
    if (training && ((running_mean && !mlc__writable(running_mean, "mlc_batch_norm")) ||
                     (running_var && !mlc__writable(running_var, "mlc_batch_norm")))) return NULL;
    eps = mlc__setting(eps, 1e-5f); momentum = mlc__setting(momentum, 0.1f);
    if (!mlc__in_range(ctx, "mlc_batch_norm", "eps", eps, 0.0f, FLT_MAX, 0) ||
        !mlc__in_range(ctx, "mlc_batch_norm", "momentum", momentum, 0.0f, 1.0f, 0)) return NULL;
    out = mlc__like(x, "mlc_batch_norm");
    if (!out) return NULL;
    mlc__call(&call, MLC__OP_BATCH_NORM, "mlc_batch_norm", out, x, weight, bias, running_mean);
    call.in[4] = running_var; call.n_in = 5;   /* the running statistics are updated in place */
    call.args.batch_norm.training = training != 0; call.args.batch_norm.momentum = momentum;
    call.args.batch_norm.eps = eps;
    if (!mlc__run(ctx, &call)) return NULL;
    if (call.device && training) {             /* the running statistics changed there */
        if (running_mean) running_mean->stale = MLC__HOST_STALE;
        if (running_var) running_var->stale = MLC__HOST_STALE;
    }
    mlc__record(&call);
    return out;
}

/* ============================================================================================
   @section conv  Convolution and pooling, x [N, C, H, W]
     conv2d   y[n, o] = b[o] + Σ_{c in o's group, i, j} w[o, c, i, j]
                                   x[n, c, sh·h + dh·i - ph, sw·w + dw·j - pw]
              computed per image and group as W_g [Og, Cg·KH·KW] @ col [Cg·KH·KW, OH·OW]
              (im2col), so  dW_g += dY_g colᵀ,  dcol = W_gᵀ dY_g  then col2im into dx,  db = Σ dY
              (stride 1, groups 1, mlc's own products: y and dx without col, mlc__conv_fast)
     max_pool y = max of the window               dx = g at the window's (first) argmax, or at its
                                                   last NaN (y NaN), as PyTorch's CPU kernel does
     avg_pool y = Σ window / KH·KW (padding counts)  dx = g / KH·KW over the window (ceil_mode's last
              windows count only what lies inside the padded input; exclude_pad: only the input)
   ============================================================================================ */

/* stride, padding, dilation: sh, ph, dh along the height, sw, pw, dw along the width; relu 1: the
   output is relu(y), fused on the CPU (Sequential's Conv2d then ReLU), and backward takes
   dy = g·(y > 0) image by image; relu 6: relu6(y) (mlc_conv2d_relu6), dy = g·(0 < y < 6) */
typedef struct mlc__conv {
    int N, C, H, W, O, KH, KW, OH, OW, sh, sw, ph, pw, dh, dw, groups, relu;
} mlc__conv;

/* The fused activation over n outputs in place: relu, or relu6 */
static void mlc__conv_activate(const mlc__conv *cv, size_t n, float *y) {
    if (cv->relu == 6) mlc__relu6_row(n, y);
    else if (cv->relu) mlc__relu_row(n, y);
}
/* dy = g·activation'(y), the map's own rule with y for x (y = x where the slope is 1) */
static void mlc__conv_activate_grad(const mlc__conv *cv, size_t n, const float *y, const float *g,
                                    float *dy) {
    mlc__unary_grad(cv->relu == 6 ? MLC__UNARY_RELU6 : MLC__UNARY_RELU, n, y, y, g, dy, 1, 0.0f, 0.0f);
}

/* The output columns ow whose input column ow·s + off falls inside [0, W): [*first, *last). */
static void mlc__conv_span(const mlc__conv *cv, int off, int *first, int *last) {
    int s = cv->sw;
    *first = off < 0 ? (-off + s - 1) / s : 0;
    *last = cv->W - off > 0 ? (cv->W - off + s - 1) / s : 0;
    if (*last > cv->OW) *last = cv->OW;
    if (*first > *last) *first = *last;
}

/* col[(c·KH + i)·KW + j, oh·OW + ow] = x[c, oh·sh + i·dh - ph, ow·sw + j·dw - pw] (0 outside), for the
   channels [c0, c1): each row of col is zeros, a (strided) run of an input row, zeros */
static void mlc__im2col(const mlc__conv *cv, int c0, int c1, const float *x, float *col) {
    int c, i, j, oh, ow, first, last, s = cv->sw, P = cv->OH * cv->OW;
    for (c = c0; c < c1; c++)
        for (i = 0; i < cv->KH; i++)
            for (j = 0; j < cv->KW; j++) {
                int off = j * cv->dw - cv->pw;
                float *row = col + ((size_t)(c * cv->KH + i) * cv->KW + j) * P;
                mlc__conv_span(cv, off, &first, &last);
                for (oh = 0; oh < cv->OH; oh++) {
                    int ih = oh * cv->sh + i * cv->dh - cv->ph;
                    float *r = row + (size_t)oh * cv->OW;
                    const float *in;
                    if (ih < 0 || ih >= cv->H) { memset(r, 0, (size_t)cv->OW * sizeof(float)); continue; }
                    in = x + ((size_t)c * cv->H + ih) * cv->W;
                    for (ow = 0; ow < first; ow++) r[ow] = 0.0f;
                    if (s == 1) memcpy(r + first, in + first + off, (size_t)(last - first) * sizeof(float));
                    else for (ow = first; ow < last; ow++) r[ow] = in[ow * s + off];
                    for (ow = last; ow < cv->OW; ow++) r[ow] = 0.0f;
                }
            }
}

/* im2col of one image's group, its channels shared out between threads from this many values of col */
#define MLC__IM2COL_PARALLEL 8192
typedef struct mlc__im2col_job { const mlc__conv *cv; const float *x; float *col; } mlc__im2col_job;

static void mlc__im2col_channels(void *arg, int slot, size_t begin, size_t end) {
    const mlc__im2col_job *job = (const mlc__im2col_job *)arg;
    (void)slot;
    mlc__im2col(job->cv, (int)begin, (int)end, job->x, job->col);
}

static void mlc__im2col_threads(mlc_ctx *ctx, const mlc__conv *cv, int channels, const float *x, float *col) {
    mlc__im2col_job job;
    size_t per_channel = (size_t)cv->KH * cv->KW * cv->OH * cv->OW;
    job.cv = cv; job.x = x; job.col = col;
    mlc__parallel(ctx, (size_t)channels, MLC__IM2COL_PARALLEL / per_channel + 1, mlc__im2col_channels, &job);
}

/* The sum of n floats in eight running sums (bias gradients): no chain of dependent adds, and
   the eight are one vector add even where loops are not vectorised (plain -O2). */
static float mlc__sum8(const float *v, int n) {
    float s[8] = { 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f }, sum = 0.0f;
    int q, k;
    for (q = 0; q + 8 <= n; q += 8)
        for (k = 0; k < 8; k++) s[k] += v[q + k];
    for (; q < n; q++) sum += v[q];
    return sum + (((s[0] + s[4]) + (s[1] + s[5])) + ((s[2] + s[6]) + (s[3] + s[7])));
}

/* dx[c, ih, iw] += every value of col that im2col took from there */
static void mlc__col2im(const mlc__conv *cv, int channels, const float *col, float *dx) {
    int c, i, j, oh, ow, first, last, s = cv->sw, P = cv->OH * cv->OW;
    for (c = 0; c < channels; c++)
        for (i = 0; i < cv->KH; i++)
            for (j = 0; j < cv->KW; j++) {
                int off = j * cv->dw - cv->pw;
                const float *row = col + ((size_t)(c * cv->KH + i) * cv->KW + j) * P;
                mlc__conv_span(cv, off, &first, &last);
                for (oh = 0; oh < cv->OH; oh++) {
                    int ih = oh * cv->sh + i * cv->dh - cv->ph;
                    const float *r = row + (size_t)oh * cv->OW;
                    float *d;
                    if (ih < 0 || ih >= cv->H) continue;
                    d = dx + ((size_t)c * cv->H + ih) * cv->W;
                    if (s == 1) mlc__axpy((size_t)(last - first), 1.0f, r + first, d + first + off);
                    else for (ow = first; ow < last; ow++) d[ow * s + off] += r[ow];
                }
            }
}

/* ---- Depthwise convolution (groups = C = O, one kernel per channel: MobileNets' 3x3), plane by
   plane without im2col (whose product would be one row of KH·KW per group):
     y[n, c, oh, ·]   = b[c] + Σ_ij w[c, i, j] x[n, c, oh·sh + i·dh - ph, ··sw + j·dw - pw]
     dx[n, c, ih, ·] += w[c, i, j] dy[n, c, oh, ·] at the same pairs      db[c] += Σ dy[n, c]
     dw[c, i, j]     += Σ_{n, oh, ow} dy[n, c, oh, ow] x[n, c, oh·sh + i·dh - ph, ow·sw + j·dw - pw]
   each a run of an output row against a (strided) run of an input row, the runs of
   mlc__conv_span. Forward shares the planes (n, c) out between threads; backward shares the
   channels, each thread going through every image of its own, so dw and db are summed in one
   order whatever the thread count. A fused activation is applied row by row, and backward takes
   each plane's g·activation' into the thread's scratch. With AVX-512 a 3x3 kernel at stride 1
   or 2 copies each plane into the thread's scratch with its zero padding around it, so that every
   output is the same nine FMAs with no edges to treat apart; its backward (dilation 1, the same
   stride down and across) takes dW from x's padded copy and dx as a forward convolution of dy,
   padded (and spread out by the stride), with the kernel flipped. */
#define MLC__DEPTHWISE_MAX_K 16             /* kernel rows and columns the fast path takes */
static int mlc__conv_depthwise_fits(const mlc__conv *cv) {
    return cv->groups == cv->C && cv->O == cv->C && cv->KH <= MLC__DEPTHWISE_MAX_K
           && cv->KW <= MLC__DEPTHWISE_MAX_K;
}

typedef struct mlc__depthwise_job {
    const mlc__conv *cv;
    const float *x, *w, *bias, *dy;
    float *y, *gx, *gw, *gb;
    float *scratch;                     /* per thread: backward with an activation, a plane of g·act';
                                           with AVX-512, padded_floats */
    size_t padded_floats;               /* per thread, forward: a padded plane (Hp x Wp) and 64 + 2·dw
                                           floats beside; backward through padded planes
                                           (mlc__depthwise_padded_backward): xp, dyp, a masked dy, dx */
    int gx_overwrite;                   /* backward: gx is fresh, each plane written over */
    int avx512;                         /* 3x3 kernels at stride 1 or 2 across: forward through a
                                           zero-padded copy of each plane (mlc__depthwise_3_padded) */
    int first[MLC__DEPTHWISE_MAX_K], last[MLC__DEPTHWISE_MAX_K];   /* column j's span */
    int lo, hi;                         /* the output columns every column of the kernel reaches */
} mlc__depthwise_job;

#if MLC__X86                            /* (for the AVX-512 kernels below) */
/* dst (`rows` rows of `cols` floats, then zeros up to `floats` in all) = the plane src [R, C] with
   its row r and column c at dst's row r·spread + top and column c·spread + left (spread 1, or 2:
   a zero between each two), zeros around it (top and left may be negative: what falls outside
   dst is left out) */
__attribute__((target("avx512f,avx2,fma")))
static void mlc__plane_place(float *dst, int rows, int cols, size_t floats, const float *src, int R, int C,
                             int top, int left, int spread) {
    const int c0 = left < 0 ? (-left + spread - 1) / spread : 0,            /* src's columns kept */
              c1 = C < (cols - left + spread - 1) / spread ? C : (cols - left + spread - 1) / spread;
    size_t k;
    int r, c;
    for (r = 0; r < rows; r++) {
        float *to = dst + (size_t)r * cols;
        const int from = (r - top) / spread,
                  inside = r >= top && (r - top) % spread == 0 && from < R && c0 < c1;
        if (!inside || spread > 1)
            for (k = 0; k < (size_t)cols; k++) to[k] = 0.0f;
        if (!inside) continue;
        if (spread > 1) {                    /* eight floats at a time, a zero after each */
            const __m512i twice = _mm512_setr_epi32(0, 0, 1, 1, 2, 2, 3, 3, 4, 4, 5, 5, 6, 6, 7, 7);
            for (c = c0; c < c1; c += 8) {
                const int m = c1 - c < 8 ? c1 - c : 8;
                const __m512 v = _mm512_maskz_loadu_ps((__mmask16)((1u << m) - 1),
                                                       src + (size_t)from * C + c);
                _mm512_mask_storeu_ps(to + 2 * c + left, (__mmask16)((1u << (2 * m - 1)) - 1),
                                      _mm512_maskz_permutexvar_ps((__mmask16)0x5555, twice, v));
            }
            continue;
        }
        for (k = 0; k < (size_t)(c0 + left); k++) to[k] = 0.0f;
        memcpy(to + c0 + left, src + (size_t)from * C + c0, (size_t)(c1 - c0) * sizeof(float));
        for (k = (size_t)(c1 + left); k < (size_t)cols; k++) to[k] = 0.0f;
    }
    for (k = (size_t)rows * cols; k < floats; k++) dst[k] = 0.0f;
}
#endif

/* GCC 12 as C++ at -O2 reads the placeholder operand of its own AVX-512 max/min intrinsics as
   "may be used uninitialized" (as in the bf16 transposes): silenced for the kernels below */
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif
#if MLC__X86
/* The first n of 16 floats at p, zeros after (n <= 0: none read): a plain load for a whole
   block, a masked one only at the end of a run (masked loads cost more on some CPUs) */
__attribute__((target("avx512f,avx2,fma"), always_inline))
static inline __m512 mlc__load16(const float *p, int n) {
    return n >= 16 ? _mm512_loadu_ps(p)
         : n <= 0  ? _mm512_setzero_ps() : _mm512_maskz_loadu_ps((__mmask16)((1u << n) - 1), p);
}
/* The n outputs (at most 16) from p with stride s (1 or 2): stride 2 takes the even floats of 32 */
__attribute__((target("avx512f,avx2,fma"), always_inline))
static inline __m512 mlc__load16_strided(const float *p, int n, int s) {
    const __m512i even = _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30);
    if (s == 1) return mlc__load16(p, n);
    return _mm512_permutex2var_ps(mlc__load16(p, 2 * n - 1), even, mlc__load16(p + 16, 2 * n - 17));
}

/* 16 outputs at p with stride s (1, or 2: the even floats of 32), whole (plain loads) */
__attribute__((target("avx512f,avx2,fma"), always_inline))
static inline __m512 mlc__load16_whole(const float *p, int s) {
    const __m512i even = _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30);
    return s == 1 ? _mm512_loadu_ps(p)
                  : _mm512_permutex2var_ps(_mm512_loadu_ps(p), even, _mm512_loadu_ps(p + 16));
}

/* A plane's 3x3 outputs y [OH, OW] from its zero-padded copy (rows Wp apart, read past their ends:
   mlc__depthwise_job's padded_floats; lanes past OW are not stored), four output rows at a time
   (past OH: the last again, stored twice) a block of 16 columns at a time: four chains of FMAs side
   by side, the nine weights in registers. Each sum b, then w[i][j] by row and column (the padding
   adding zeros). Stride s is a constant in each of the two copies. */
__attribute__((target("avx512f,avx2,fma"), always_inline))
static inline void mlc__depthwise_3_strips(const mlc__conv *cv, const float *padded, int Wp, const float *w,
                                           float b, float *y, const int s) {
    const int OH = cv->OH, OW = cv->OW, row_step = cv->sh * Wp;
    __m512 wv[9];
    int oh, ow, t, k;
    for (t = 0; t < 9; t++) wv[t] = _mm512_set1_ps(w[t]);
    for (oh = 0; oh < OH; oh += 4) {
        const float *in[4];
        float *out[4];
        _Pragma("GCC unroll 4") for (k = 0; k < 4; k++) {
            const int v = oh + k < OH ? oh + k : OH - 1;
            in[k] = padded + (size_t)v * row_step;
            out[k] = y + (size_t)v * OW;
        }
        for (ow = 0; ow < OW; ow += 16) {
            __m512 acc[4];
            _Pragma("GCC unroll 4") for (k = 0; k < 4; k++) acc[k] = _mm512_set1_ps(b);
            _Pragma("GCC unroll 9") for (t = 0; t < 9; t++) {
                const size_t tap = (size_t)(t / 3) * cv->dh * Wp + (size_t)(t % 3) * cv->dw + (size_t)ow * s;
                _Pragma("GCC unroll 4") for (k = 0; k < 4; k++)
                    acc[k] = _mm512_fmadd_ps(wv[t], mlc__load16_whole(in[k] + tap, s), acc[k]);
            }
            _Pragma("GCC unroll 4") for (k = 0; k < 4; k++) {
                if (cv->relu) acc[k] = _mm512_max_ps(_mm512_setzero_ps(), acc[k]);
                if (cv->relu == 6) acc[k] = _mm512_min_ps(_mm512_set1_ps(6.0f), acc[k]);
                if (OW - ow >= 16) _mm512_storeu_ps(out[k] + ow, acc[k]);
                else _mm512_mask_storeu_ps(out[k] + ow, (__mmask16)((1u << (OW - ow)) - 1), acc[k]);
            }
        }
    }
}
/* The same sums where the kernel's rows are adjacent (dh 1), the stride is the same down and across
   and OH >= 4 (mlc__depthwise_3_padded picks; the kernel above takes the rest): a strip of four output
   rows (the last strip moved up to end at OH) reads each input row's three taps once and adds them
   to every output row they reach, in the same order (i, then j); meanwhile it fetches the next
   plane's x (when there is one) into the cache, a strip's share at a time, so that the copy of
   the next plane does not wait on memory. Stride s and row stride sh are constants. */
__attribute__((target("avx512f,avx2,fma"), always_inline))
static inline void mlc__depthwise_3_shared(const mlc__conv *cv, const float *padded, int Wp, const float *w,
                                           float b, float *y, const float *next, const int s, const int sh) {
    const int OH = cv->OH, OW = cv->OW;
    const size_t next_floats = next ? (size_t)cv->H * cv->W : 0;
    __m512 wv[9];
    int oh, ow, q, i, j, k;
    size_t f;
    for (k = 0; k < 9; k++) wv[k] = _mm512_set1_ps(w[k]);
    for (oh = 0; oh < OH; oh += 4) {
        const int top = oh + 4 <= OH ? oh : OH - 4;
        const float *in = padded + (size_t)top * sh * Wp;
        float *out = y + (size_t)top * OW;
        for (f = next_floats * oh / OH; f < next_floats * (oh + 4) / OH && f < next_floats; f += 16)
            _mm_prefetch((const char *)(next + f), _MM_HINT_T0);
        for (ow = 0; ow < OW; ow += 16) {
            __m512 acc[4];
            _Pragma("GCC unroll 4") for (k = 0; k < 4; k++) acc[k] = _mm512_set1_ps(b);
            _Pragma("GCC unroll 9") for (q = 0; q <= 3 * sh + 2; q++)
                _Pragma("GCC unroll 3") for (j = 0; j < 3; j++) {
                    const float *p = in + (size_t)q * Wp + (size_t)j * cv->dw + (size_t)ow * s;
                    const __m512 v = mlc__load16_whole(p, s);
                    _Pragma("GCC unroll 4") for (k = 0; k < 4; k++)
                        _Pragma("GCC unroll 3") for (i = 0; i < 3; i++)
                            if (k * sh + i == q) acc[k] = _mm512_fmadd_ps(wv[i * 3 + j], v, acc[k]);
                }
            _Pragma("GCC unroll 4") for (k = 0; k < 4; k++) {
                float *to = out + (size_t)k * OW + ow;
                if (cv->relu) acc[k] = _mm512_max_ps(_mm512_setzero_ps(), acc[k]);
                if (cv->relu == 6) acc[k] = _mm512_min_ps(_mm512_set1_ps(6.0f), acc[k]);
                if (OW - ow >= 16) _mm512_storeu_ps(to, acc[k]);
                else _mm512_mask_storeu_ps(to, (__mmask16)((1u << (OW - ow)) - 1), acc[k]);
            }
        }
    }
}
__attribute__((target("avx512f,avx2,fma")))
static void mlc__depthwise_3_padded(const mlc__conv *cv, const float *padded, int Wp, const float *w, float b,
                                    float *y, const float *next) {
    const int shared = cv->dh == 1 && cv->OH >= 4 && cv->sh == cv->sw;
    if (shared && cv->sw == 1) mlc__depthwise_3_shared(cv, padded, Wp, w, b, y, next, 1, 1);
    else if (shared) mlc__depthwise_3_shared(cv, padded, Wp, w, b, y, next, 2, 2);
    else if (cv->sw == 1) mlc__depthwise_3_strips(cv, padded, Wp, w, b, y, 1);
    else mlc__depthwise_3_strips(cv, padded, Wp, w, b, y, 2);
}
#endif
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic pop
#endif

/* The spans of the kernel's columns (mlc__conv_span), and the output columns all of them reach */
static void mlc__depthwise_spans(const mlc__conv *cv, mlc__depthwise_job *job) {
    int j;
    job->lo = 0; job->hi = cv->OW;
    for (j = 0; j < cv->KW; j++) {
        mlc__conv_span(cv, j * cv->dw - cv->pw, &job->first[j], &job->last[j]);
        job->lo = job->first[j] > job->lo ? job->first[j] : job->lo;
        job->hi = job->last[j] < job->hi ? job->last[j] : job->hi;
    }
    if (job->lo > job->hi) job->lo = job->hi;
}

/* row[ow] = act(b + Σ_r Σ_j w[r][j] in[r][ow·s + j·dw - pw]) over the output row's columns, for
   `rows` input rows: the columns every tap reaches a row at a time (or all rows at once), then
   each edge column in one sum of the taps that reach it */
static void mlc__depthwise_row(const mlc__depthwise_job *job, const float *const *in, const float *const *w,
                               int rows, float b, float *MLC__RESTRICT row) {
    const mlc__conv *cv = job->cv;
    const int s = cv->sw, lo = job->lo, hi = job->hi;
    int r, j, ow;
    MLC__VECTOR_LOOP(ow, lo, hi, { row[ow] = b; });
    for (r = 0; r < rows; r++) {
        const float *a = in[r], *wr = w[r];
        if (cv->KW == 3 && s == 1) {
            const float w0 = wr[0], w1 = wr[1], w2 = wr[2];
            const int o0 = -cv->pw, o1 = o0 + cv->dw, o2 = o1 + cv->dw;
            MLC__VECTOR_LOOP(ow, lo, hi,
                             { row[ow] += w0 * a[ow + o0] + w1 * a[ow + o1] + w2 * a[ow + o2]; });
        } else
            for (ow = lo; ow < hi; ow++)
                for (j = 0; j < cv->KW; j++) row[ow] += wr[j] * a[ow * s + j * cv->dw - cv->pw];
    }
    mlc__conv_activate(cv, (size_t)(hi - lo), row + lo);
    for (ow = 0; ow < cv->OW; ow++) {                     /* the edges */
        float sum = b;
        if (ow == lo && lo < hi) { ow = hi - 1; continue; }
        for (r = 0; r < rows; r++)
            for (j = 0; j < cv->KW; j++)
                if (ow >= job->first[j] && ow < job->last[j])
                    sum += w[r][j] * in[r][ow * s + j * cv->dw - cv->pw];
        row[ow] = sum;
        mlc__conv_activate(cv, 1, row + ow);
    }
}

static void mlc__depthwise_planes(void *arg, int slot, size_t begin, size_t end) {
    const mlc__depthwise_job *job = (const mlc__depthwise_job *)arg;
    const mlc__conv *cv = job->cv;
    const float *in[MLC__DEPTHWISE_MAX_K], *w_rows[MLC__DEPTHWISE_MAX_K];
#if MLC__X86
    const int Wp = cv->W + 2 * cv->pw;
    float *padded = job->scratch ? job->scratch + (size_t)slot * job->padded_floats : NULL;
#endif
    int oh, i, rows;
    size_t pl;
    (void)slot;
    for (pl = begin; pl < end; pl++) {
        const int c = (int)(pl % (size_t)cv->C);
        const float *x = job->x + pl * cv->H * cv->W, *w = job->w + (size_t)c * cv->KH * cv->KW;
        const float b = job->bias ? job->bias[c] : 0.0f;
#if MLC__X86
        if (padded) {
            mlc__plane_place(padded, cv->H + 2 * cv->ph, Wp, job->padded_floats, x, cv->H, cv->W, cv->ph,
                             cv->pw, 1);
            mlc__depthwise_3_padded(cv, padded, Wp, w, b, job->y + pl * cv->OH * cv->OW,
                                    pl + 1 < end ? x + (size_t)cv->H * cv->W : NULL);
            continue;
        }
#endif
        for (oh = 0; oh < cv->OH; oh++) {
            float *row = job->y + (pl * cv->OH + oh) * cv->OW;
            for (i = rows = 0; i < cv->KH; i++) {              /* the input rows inside */
                int ih = oh * cv->sh + i * cv->dh - cv->ph;
                if (ih < 0 || ih >= cv->H) continue;
                in[rows] = x + (size_t)ih * cv->W;
                w_rows[rows++] = w + i * cv->KW;
            }
            mlc__depthwise_row(job, in, w_rows, rows, b, row);
        }
    }
}

/* Σ a[k] b[k·s] over k in [0, n), in eight running sums (as mlc__sum8) */
static float mlc__dot_strided(const float *a, const float *b, int n, int s) {
    float part[8] = { 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f }, sum = 0.0f;
    int q, k;
    for (q = 0; q + 8 <= n; q += 8)
        for (k = 0; k < 8; k++) part[k] += a[q + k] * b[(q + k) * s];
    for (; q < n; q++) sum += a[q] * b[q * s];
    return sum + (((part[0] + part[4]) + (part[1] + part[5])) + ((part[2] + part[6]) + (part[3] + part[7])));
}

/* (GCC 12's C++ warning, as above) */
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif
#if MLC__X86
/* dW[i, j] += Σ_{oh, ow} dy[oh, ow] xp[oh·s + i, ow·s + j] (3x3, stride s 1 or 2, dilation 1)
   over the R output rows from oh0, into nine running vectors acc[i·3 + j], xp being x zero-padded
   (rows Wp apart): each input row's three taps loaded once for the R rows of dy that reach it.
   Lanes past OW are masked off in dy and xp alike (so an infinity past a row's end reaches no
   sum). */
__attribute__((target("avx512f,avx2,fma"), always_inline))
static inline void mlc__depthwise_3_gw_rows(const float *dy, int OW, const float *xp, int Wp, int oh0,
                                            __m512 *acc, const int R, const int s) {
    int ow, q, i, j, k;
    for (ow = 0; ow < OW; ow += 16) {
        __m512 g[4];
        _Pragma("GCC unroll 4") for (k = 0; k < R; k++)
            g[k] = mlc__load16(dy + (size_t)(oh0 + k) * OW + ow, OW - ow);
        _Pragma("GCC unroll 9") for (q = 0; q < (R - 1) * s + 3; q++)
            _Pragma("GCC unroll 3") for (j = 0; j < 3; j++) {
                const float *p = xp + (size_t)(oh0 * s + q) * Wp + (size_t)ow * s + j;
                const __m512 v = OW - ow >= 16 ? mlc__load16_whole(p, s) : mlc__load16_strided(p, OW - ow, s);
                _Pragma("GCC unroll 4") for (k = 0; k < R; k++)
                    _Pragma("GCC unroll 3") for (i = 0; i < 3; i++)
                        if (k * s + i == q) acc[i * 3 + j] = _mm512_fmadd_ps(g[k], v, acc[i * 3 + j]);
            }
    }
}

/* Channel c's backward over every image for a 3x3 kernel at stride s (1 or 2, the same down and
   across) and dilation 1, through zero-padded copies as the forward: with xp, x padded by p, and
   dyp, dy spread out by s (s - 1 zeros between neighbours) and padded by 2 - p (cut where p > 2;
   (H + 2) x (W + 2)),
     dW[i, j] += Σ_oh dy[oh, :] · xp[oh·s + i, j :: s]           (nine running vectors, four rows of
                                                                 dy at a time)
     dx[h, t]  = Σ_ij w[2 - i, 2 - j] dyp[h + i, t + j]           (the forward's kernel at stride 1,
                                                                 w flipped)
   dx written straight into gx when gx is fresh, else into scratch and added. */
__attribute__((target("avx512f,avx2,fma")))
static void mlc__depthwise_padded_backward(const mlc__depthwise_job *job, float *scratch, size_t c) {
    const mlc__conv *cv = job->cv;
    const int H = cv->H, W = cv->W, OH = cv->OH, OW = cv->OW, P = OH * OW, Wp = W + 2 * cv->pw;
    const size_t xp_floats = (size_t)(H + 2 * cv->ph) * Wp + 64, dyp_floats = (size_t)(H + 2) * (W + 2) + 64;
    float *xp = scratch, *dyp = xp + xp_floats, *masked = dyp + dyp_floats, *dx = masked + P;
    const float *w = job->w + c * 9;
    const float flipped[9] = { w[8], w[7], w[6], w[5], w[4], w[3], w[2], w[1], w[0] };
    mlc__conv transposed = *cv;                 /* dx as a forward convolution of dyp */
    __m512 acc[9];
    float lanes[16];
    int n, oh, k;
    size_t t;
    transposed.OH = H; transposed.OW = W; transposed.relu = 0; transposed.sh = transposed.sw = 1;
    for (k = 0; k < 9; k++) acc[k] = _mm512_setzero_ps();
    for (n = 0; n < cv->N; n++) {
        const size_t pl = (size_t)n * cv->C + c;
        const float *dy = job->dy + pl * P, *x = job->x + pl * H * W;
        float *gx = job->gx ? job->gx + pl * H * W : NULL;
        if (cv->relu) {
            mlc__conv_activate_grad(cv, (size_t)P, job->y + pl * P, dy, masked);
            dy = masked;
        }
        if (job->gb) job->gb[c] += mlc__sum8(dy, P);
        if (job->gw) {
            mlc__plane_place(xp, H + 2 * cv->ph, Wp, xp_floats, x, H, W, cv->ph, cv->pw, 1);
            for (oh = 0; oh + 4 <= OH; oh += 4)
                if (cv->sw == 1) mlc__depthwise_3_gw_rows(dy, OW, xp, Wp, oh, acc, 4, 1);
                else mlc__depthwise_3_gw_rows(dy, OW, xp, Wp, oh, acc, 4, 2);
            for (; oh < OH; oh++)
                if (cv->sw == 1) mlc__depthwise_3_gw_rows(dy, OW, xp, Wp, oh, acc, 1, 1);
                else mlc__depthwise_3_gw_rows(dy, OW, xp, Wp, oh, acc, 1, 2);
        }
        if (!gx) continue;
        mlc__plane_place(dyp, H + 2, W + 2, dyp_floats, dy, OH, OW, 2 - cv->ph, 2 - cv->pw, cv->sw);
        mlc__depthwise_3_padded(&transposed, dyp, W + 2, flipped, 0.0f, job->gx_overwrite ? gx : dx, NULL);
        if (!job->gx_overwrite) MLC__VECTOR_LOOP(t, 0, (size_t)H * W, { gx[t] += dx[t]; });
    }
    for (k = 0; job->gw && k < 9; k++) {                 /* the lanes in mlc__sum8's order */
        _mm512_storeu_ps(lanes, acc[k]);
        job->gw[c * 9 + k] += mlc__sum8(lanes, 16);
    }
}
#endif
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic pop
#endif

static void mlc__depthwise_channels_backward(void *arg, int slot, size_t begin, size_t end) {
    const mlc__depthwise_job *job = (const mlc__depthwise_job *)arg;
    const mlc__conv *cv = job->cv;
    const int s = cv->sw, T = cv->KH * cv->KW, P = cv->OH * cv->OW;
    int n, oh, i, j, ow;
    size_t c;
    for (c = begin; c < end; c++) {
        const float *w = job->w + c * T;
#if MLC__X86
        if (job->padded_floats) {
            mlc__depthwise_padded_backward(job, job->scratch + (size_t)slot * job->padded_floats, c);
            continue;
        }
#endif
        for (n = 0; n < cv->N; n++) {
            const size_t pl = (size_t)n * cv->C + c;
            const float *dy = job->dy + pl * P, *x = job->x + pl * cv->H * cv->W;
            float *gx = job->gx ? job->gx + pl * cv->H * cv->W : NULL;
            if (cv->relu) {
                float *masked = job->scratch + (size_t)slot * P;
                mlc__conv_activate_grad(cv, (size_t)P, job->y + pl * P, dy, masked);
                dy = masked;
            }
            if (job->gb) job->gb[c] += mlc__sum8(dy, P);
            if (gx && job->gx_overwrite) memset(gx, 0, (size_t)cv->H * cv->W * sizeof(float));
            for (oh = 0; oh < cv->OH; oh++)
                for (i = 0; i < cv->KH; i++) {
                    const int ih = oh * cv->sh + i * cv->dh - cv->ph;
                    const float *g = dy + (size_t)oh * cv->OW;
                    if (ih < 0 || ih >= cv->H) continue;
                    for (j = 0; j < cv->KW; j++) {
                        const int off = j * cv->dw - cv->pw, first = job->first[j], last = job->last[j];
                        if (first == last) continue;
                        if (job->gw)
                            job->gw[c * T + i * cv->KW + j] += mlc__dot_strided(
                                g + first, x + (size_t)ih * cv->W + first * s + off, last - first, s);
                        if (gx && s == 1)
                            mlc__axpy((size_t)(last - first), w[i * cv->KW + j], g + first,
                                      gx + (size_t)ih * cv->W + first + off);
                        else if (gx)
                            for (ow = first; ow < last; ow++)
                                gx[(size_t)ih * cv->W + ow * s + off] += w[i * cv->KW + j] * g[ow];
                    }
                }
        }
    }
}

/* planes (forward) or channels (backward) go to threads from this many values of y each */
#define MLC__DEPTHWISE_PARALLEL 16384

/* 0 when out of memory (the context's error says so) */
static int mlc__conv_depthwise(mlc_ctx *ctx, mlc__depthwise_job *job, int backward) {
    const mlc__conv *cv = job->cv;
    const size_t plane = (size_t)cv->OH * cv->OW,
                 channels_from = MLC__DEPTHWISE_PARALLEL / (plane * cv->N + 1) + 1,
                 planes_from = MLC__DEPTHWISE_PARALLEL / (plane + 1) + 1;
    mlc__depthwise_spans(cv, job);
#if MLC__X86
    job->avx512 = cv->KH == 3 && cv->KW == 3 && (cv->sw == 1 || cv->sw == 2)
                  && __builtin_cpu_supports("avx512f");
#endif
    if (backward && job->avx512 && cv->sh == cv->sw && cv->dh == 1 && cv->dw == 1)
        job->padded_floats = (size_t)(cv->H + 2 * cv->ph) * (cv->W + 2 * cv->pw) + 64       /* xp */
                             + (size_t)(cv->H + 2) * (cv->W + 2) + 64                      /* dyp */
                             + plane + (size_t)cv->H * cv->W;                             /* dy, dx */
    if (backward && (cv->relu || job->padded_floats)
        && !(job->scratch = mlc__floats(ctx, (size_t)mlc__slots(ctx, (size_t)cv->C, channels_from)
                                                 * (job->padded_floats ? job->padded_floats : plane) + 1,
                                        "mlc_conv2d backward")))
        return 0;
    if (!backward && job->avx512) {
        job->padded_floats = (size_t)(cv->H + 2 * cv->ph) * (cv->W + 2 * cv->pw) + 64 + 2 * (size_t)cv->dw;
        job->scratch = mlc__floats(ctx, (size_t)mlc__slots(ctx, (size_t)cv->N * cv->C, planes_from)
                                            * job->padded_floats, "mlc_conv2d");
        if (!job->scratch) return 0;
    }
    if (backward)
        mlc__parallel(ctx, (size_t)cv->C, channels_from, mlc__depthwise_channels_backward, (void *)job);
    else mlc__parallel(ctx, (size_t)cv->N * cv->C, planes_from, mlc__depthwise_planes, (void *)job);
    return 1;
}

/* A 1x1 convolution with stride 1 and no padding: image i's group g is the product
   W_g [Og, Cg] @ x_g [Cg, H·W] with x as it lies (no im2col), dx_g = W_gᵀ dY_g straight into dx,
   dW_g += dY_g x_gᵀ. */
static int mlc__conv_pointwise(const mlc__conv *cv) {
    return cv->KH == 1 && cv->KW == 1 && cv->sh == 1 && cv->sw == 1 && cv->ph == 0 && cv->pw == 0;
}

typedef struct mlc__conv_fast mlc__conv_fast;   /* mlc's own stride-1 path, below */

/* The images are shared out between threads: each thread has scratch of its own (col, packing
   space) and runs the products of its pieces of images itself. With one image, or products
   through a hook or BLAS (one at a time), the images go in turn and each product may use the
   threads itself. Backward adds dW and db up over the images in groups fixed by the batch alone (at
   most MLC__CONV_SUMS, each its own partial sum, added in order at the end), and the threads
   share out groups, so any thread count gives the same sums (a fixed arena: one group). */
#define MLC__CONV_SUMS 8
typedef struct mlc__conv_job {
    mlc_ctx *ctx;
    const mlc__conv *cv;
    size_t parallel_from;               /* mlc__parallel's: 2 images (groups), or never */
    int slots, sums;                    /* threads (scratch slots); backward: groups of images */
    const float *x, *w, *bias, *dy;     /* forward: y from x, w, bias; backward: gx, gw, gb from dy */
    const float *w_packed;              /* forward, groups 1: w packed for the products, or NULL */
    float *y, *gx, *gw, *gb;
    const uint16_t *x16;                /* bf16 (the fast path's, else NULL): x, and y (written forward, */
    uint16_t *y16;                      /* read backward with an activation), in place of x and y */
    float *scratch;                     /* per thread: col, packing space, fast's; then each group's dW, db */
    size_t col_floats, work_floats, slot_floats, fast_at, rows_at, relu_at, wide_at, sums_at;
    const mlc__conv_fast *fast;         /* forward: y, backward: dx without im2col (or NULL) */
    int by_rows;                        /* backward: dW through mlc__im2row */
    int gx_overwrite;                   /* backward: gx is fresh, each image written over */
} mlc__conv_job;

/* Plan the job: how many threads, and their scratch (with_grads: the groups and their partial dW
   and db; fast_floats for the fast path's and mlc__im2row's, which forward needs no col or
   packing space beside; a pointwise convolution needs no col). */
static int mlc__conv_plan(mlc__conv_job *job, mlc_ctx *ctx, const mlc__conv *cv, int with_grads,
                          size_t fast_floats, const char *op) {
    int Cg = cv->C / cv->groups, Og = cv->O / cv->groups, P = cv->OH * cv->OW, rows = Cg * cv->KH * cv->KW;
    size_t w1 = mlc__gemm_work(Og, P, rows), w2 = mlc__gemm_work(Og, rows, P),
           w3 = mlc__gemm_work(rows, P, Og);
    memset(job, 0, sizeof *job);
    job->ctx = ctx; job->cv = cv;
    job->parallel_from = mlc__gemm_threadable(ctx) ? 2 : (size_t)-1;
    job->sums = !with_grads || ctx->config.arena ? 1 : cv->N < MLC__CONV_SUMS ? cv->N : MLC__CONV_SUMS;
    job->slots = mlc__slots(ctx, (size_t)(with_grads ? job->sums : cv->N), job->parallel_from);
    job->col_floats = (fast_floats && !with_grads) || mlc__conv_pointwise(cv) ? 0
                    : ((size_t)rows * P + 15) / 16 * 16;
    job->work_floats = w1 > w2 ? (w1 > w3 ? w1 : w3) : (w2 > w3 ? w2 : w3);
    if (job->slots < 2 || (!job->col_floats && !mlc__conv_pointwise(cv))) job->work_floats = 0;
    job->fast_at = job->col_floats + job->work_floats;
    job->slot_floats = job->fast_at + (fast_floats + 15) / 16 * 16;
    job->sums_at = (size_t)job->slots * job->slot_floats;
    job->scratch = mlc__floats(ctx, job->sums_at + (job->sums > 1 ? (size_t)job->sums * (cv->O * (size_t)rows
                                                                                     + cv->O) : 0), op);
    return job->scratch != NULL;
}

/* ---- Paths for mlc's own products: everything in the convolutions that depends on
   MLC_USE_CBLAS is in this one switch. Under it, products go through cblas_sgemm, and none of
   these paths fits (each says 0 and the general im2col path runs). */
#ifndef MLC_USE_CBLAS
/* Stride 1 without im2col (mlc's own products, groups 1): the input's planes are copied once
   into zero-padded planes Hp x Wp, and the output is computed at every column of the padded
   width, OH x Wp "extended" columns of which the last Wp - OW of each row are thrown away. Then
   row r = (c, i, j) of col, at extended column q = oh·Wp + ow, is plane c at q + i·dh·Wp + j·dw:
   contiguous in q, so each NR-wide sliver of the product's B is NR floats copied per row, and
   the weights are packed once per op for all the images. The product writes a scratch C
   [O rounded to MR, columns rounded to NR] (no edge tiles), copied out with the bias added.
   The same serves dx: stride 1 makes dx = conv(dy, w flipped, its channels swapped) with
   padding dh·(KH-1) - ph (when not negative), dx += its output. */
struct mlc__conv_fast {
    const mlc__gemm_arch *g;
    int C, H, W, M, KH, KW, ph, pw, dh, dw;   /* input planes C x H x W, M output planes */
    int Hp, Wp, OH, Pn, R, kc, Mr;            /* padded plane, output rows, columns, col rows, slice, M */
    size_t plane, planes_floats, piece_floats;   /* values per padded plane; floats the planes take,
                                                    and all of an image in flight */
    float *wp;                                /* packed weights: per k slice, per MR rows */
    int *off;                                 /* per row of col: its offset in the planes */
#if MLC__BF16_X86
    const mlc__bf16_arch *g16;                /* bf16 (NULL: float32): planes of bf16 values, the
                                                 weights packed in pairs of k (wp16, as mlc__bf16_pack
                                                 packs A) and the products on g16's kernel */
    uint32_t *wp16;
#endif
};

/* The weight at row r of the product, column k (row r of col): its index in w [M, C, KH, KW] as
   stored, or (flip) in w [C, M, KH, KW] read as dx needs it: A[m, (c, i, j)] = w[c, m, KH-1-i,
   KW-1-j] */
static size_t mlc__conv_fast_weight(const mlc__conv_fast *f, int flip, int r, int k) {
    const int T = f->KH * f->KW;
    return flip ? ((size_t)(k / T) * f->M + r) * T + T - 1 - k % T : (size_t)r * f->R + k;
}

/* Plan it and pack the weights, float32 w or bf16 w16 (the bf16 path), as mlc__conv_fast_weight
   reads them. 0 when out of memory. */
static int mlc__conv_fast_plan(mlc__conv_fast *f, mlc_ctx *ctx, const float *w, const uint16_t *w16, int flip,
                               const char *op) {
    const mlc__gemm_arch *g = mlc__gemm_pick(f->M);
    int mr = g->mr, nr = g->nr, kc = g->kc, kblocks, r, m, k, pc, T = f->KH * f->KW;
    size_t value_bytes = sizeof(float), weight_floats;
    float *dst;
    f->g = g;
#if MLC__BF16_X86
    f->g16 = w16 ? mlc__bf16_pick(f->M) : NULL;
    if (w16) { mr = f->g16->mr; nr = f->g16->nr; kc = f->g16->kc; value_bytes = sizeof(uint16_t); }
#endif
    f->Hp = f->H + 2 * f->ph; f->Wp = f->W + 2 * f->pw;
    f->OH = f->Hp - f->dh * (f->KH - 1);
    f->Pn = mlc__gemm_round_up(f->OH * f->Wp, nr);
    f->R = f->C * T; f->Mr = mlc__gemm_round_up(f->M, mr);
    kblocks = (f->R + kc - 1) / kc;
    f->kc = (f->R + kblocks - 1) / kblocks;
    if (w16) f->kc = mlc__gemm_round_up(f->kc, 2);        /* (pairs of k) */
    f->plane = (size_t)f->Hp * f->Wp + (size_t)(f->Pn - f->OH * f->Wp) + (size_t)f->dw * (f->KW - 1);
    f->plane = (f->plane + 31) / 32 * 32;
    f->planes_floats = ((size_t)f->C * f->plane * value_bytes + 63) / 64 * 16;   /* (whole lines) */
    f->piece_floats = f->planes_floats + (size_t)f->kc * nr * value_bytes / sizeof(float)
                      + (size_t)f->Mr * f->Pn;
    weight_floats = (size_t)f->Mr * (w16 ? (size_t)(f->R + 1) / 2 : (size_t)f->R);   /* (an odd R pads) */
    f->wp = mlc__floats(ctx, weight_floats + ((size_t)f->R * sizeof(int) + 3) / 4, op);
    if (!f->wp) return 0;
    f->off = (int *)(f->wp + weight_floats);
    for (r = 0; r < f->R; r++)
        f->off[r] = (int)((size_t)(r / T) * f->plane) + (r % T / f->KW) * f->dh * f->Wp + r % f->KW * f->dw;
#if MLC__BF16_X86
    if (w16) {     /* word [p·MR + i] of slice pc's sliver: the pair (A[i, pc + 2p], A[i, pc + 2p + 1]) */
        uint32_t *word = f->wp16 = (uint32_t *)(void *)f->wp;
        for (pc = 0; pc < f->R; pc += f->kc) {
            int kk = f->R - pc < f->kc ? f->R - pc : f->kc, p;
            for (m = 0; m < f->Mr; m += mr)
                for (p = 0; p < (kk + 1) / 2; p++)
                    for (r = m, k = pc + 2 * p; r < m + mr; r++, word++) {
                        const uint32_t second = r < f->M && 2 * p + 1 < kk
                                                ? w16[mlc__conv_fast_weight(f, flip, r, k + 1)] : 0u;
                        *word = r >= f->M ? 0u : w16[mlc__conv_fast_weight(f, flip, r, k)] | second << 16;
                    }
        }
        return 1;
    }
#endif
    for (pc = 0, dst = f->wp; pc < f->R; pc += f->kc) {
        int kk = f->R - pc < f->kc ? f->R - pc : f->kc;
        for (m = 0; m < f->Mr; m += mr)
            for (k = pc; k < pc + kk; k++)
                for (r = m; r < m + mr; r++, dst++)
                    *dst = r >= f->M ? 0.0f : w[mlc__conv_fast_weight(f, flip, r, k)];
    }
    return 1;
}

#if MLC__BF16_X86
/* The bf16 path's image: the planes hold bf16 values (x16 as it is, or float32 x rounded: dy for
   dx, rounded as PyTorch's gradient of a bf16 output is), and each sliver of col pairs rows
   2p, 2p+1 of a slice for vdpbf16ps */
__attribute__((target(MLC__BF16_TARGET)))
static float *mlc__conv_fast_image_bf16(const mlc__conv_fast *f, const float *x, const uint16_t *x16,
                                        float *scratch) {
    const mlc__bf16_arch *g = f->g16;
    uint16_t *planes = (uint16_t *)(void *)scratch;
    uint32_t *bs = (uint32_t *)(void *)(scratch + f->planes_floats);
    float *cs = scratch + f->planes_floats + (size_t)f->kc / 2 * 32;
    int c, h, q, pc, p, m;
    memset(planes, 0, (size_t)f->C * f->plane * sizeof(uint16_t));
    for (c = 0; c < f->C; c++)
        for (h = 0; h < f->H; h++) {
            uint16_t *row = planes + c * f->plane + (size_t)(h + f->ph) * f->Wp + f->pw;
            const size_t at = ((size_t)c * f->H + h) * f->W;
            if (x16) memcpy(row, x16 + at, (size_t)f->W * sizeof(uint16_t));
            else mlc__narrow(MLC_BF16, x + at, row, (size_t)f->W);
        }
    for (q = 0; q < f->Pn; q += 32)
        for (pc = 0; pc < f->R; pc += f->kc) {
            const int kk = f->R - pc < f->kc ? f->R - pc : f->kc, kp = (kk + 1) / 2;
            for (p = 0; p < kp; p++) {
                const uint16_t *r0 = planes + f->off[pc + 2 * p] + q;
                const __m512i v0 = _mm512_loadu_si512(r0),
                              v1 = 2 * p + 1 < kk ? _mm512_loadu_si512(planes + f->off[pc + 2 * p + 1] + q)
                                                  : _mm512_setzero_si512();
                __m512i lo, hi;
                mlc__bf16_pairs(v0, v1, &lo, &hi);
                _mm512_storeu_si512(bs + p * 32, lo);
                _mm512_storeu_si512(bs + p * 32 + 16, hi);
            }
            for (m = 0; m < f->Mr; m += g->mr)
                g->kernel(kp, f->wp16 + (size_t)(pc / 2) * f->Mr + (size_t)m * kp, bs,
                          cs + (size_t)m * f->Pn + q, f->Pn, pc > 0);
        }
    return cs;
}
#endif

/* One image: x [C, H, W] (float32 x, or the bf16 path's x16 or x) -> the scratch C of plan f,
   [Mr, Pn] at the returned address (row stride Pn; output (m, oh, ow) at m·Pn + oh·Wp + ow);
   scratch holds f->piece_floats. */
static float *mlc__conv_fast_image(const mlc__conv_fast *f, const float *x, const uint16_t *x16,
                                   float *scratch) {
    const mlc__gemm_arch *g = f->g;
    const int nr = g->nr;
    float *planes = scratch, *bs = planes + f->planes_floats, *cs = bs + (size_t)f->kc * nr;
    int c, h, q, pc, r, m;
#if MLC__BF16_X86
    if (f->g16) return mlc__conv_fast_image_bf16(f, x, x16, scratch);
#endif
    (void)x16;
    memset(planes, 0, (size_t)f->C * f->plane * sizeof(float));
    for (c = 0; c < f->C; c++)
        for (h = 0; h < f->H; h++)
            memcpy(planes + c * f->plane + (size_t)(h + f->ph) * f->Wp + f->pw,
                   x + ((size_t)c * f->H + h) * f->W, (size_t)f->W * sizeof(float));
    for (q = 0; q < f->Pn; q += nr)
        for (pc = 0; pc < f->R; pc += f->kc) {
            const int kk = f->R - pc < f->kc ? f->R - pc : f->kc;
            for (r = 0; r < kk; r++) {               /* constant sizes: copied in registers */
                const float *src = planes + f->off[pc + r] + q;
                if (nr == 32) memcpy(bs + r * 32, src, 32 * sizeof(float));
                else if (nr == 16) memcpy(bs + r * 16, src, 16 * sizeof(float));
                else memcpy(bs + r * nr, src, (size_t)nr * sizeof(float));
            }
            for (m = 0; m < f->Mr; m += g->mr)
                g->kernel(kk, f->wp + (size_t)pc * f->Mr + (size_t)m * kk, bs, cs + (size_t)m * f->Pn + q,
                          f->Pn, pc > 0, NULL);
        }
    return cs;
}

/* Whether the fast path takes this convolution (dx: its backward to dx), with f's shapes set:
   mlc's own products, groups 1, stride 1, more than one image or one thread (one image is
   left to the general path, whose products use the threads), channels in and out (an empty
   product is the general path's), offsets within an int, and no fixed arena (its scratch, a
   whole output per image in flight, can outgrow col where input channels are few: a fixed
   arena keeps to im2col's). */
static int mlc__conv_fast_fits(mlc_ctx *ctx, const mlc__conv *cv, int dx, mlc__conv_fast *f) {
    if (ctx->config.gemm || ctx->config.arena || cv->groups != 1 || cv->sh != 1 || cv->sw != 1
        || (cv->N < 2 && mlc__threads(ctx) > 1) || mlc__conv_pointwise(cv))
        return 0;
    f->KH = cv->KH; f->KW = cv->KW; f->dh = cv->dh; f->dw = cv->dw;
    f->C = dx ? cv->O : cv->C; f->H = dx ? cv->OH : cv->H; f->W = dx ? cv->OW : cv->W;
    f->M = dx ? cv->C : cv->O;
    f->ph = dx ? cv->dh * (cv->KH - 1) - cv->ph : cv->ph;
    f->pw = dx ? cv->dw * (cv->KW - 1) - cv->pw : cv->pw;
    return f->ph >= 0 && f->pw >= 0 && f->C > 0 && f->M > 0
           && ((long long)f->H + 2LL * f->ph + 1) * ((long long)f->W + 2LL * f->pw + 64)
                  <= 2147483647LL / f->C;
}

/* image i (its input: x or x16, or dy) through the fast path: forward y = its output + b (then
   the activation; y16: rounded to bf16), backward dx += its output. The bias and the activation
   go over a whole plane of the scratch output, its thrown-away columns too (and so does the
   rounding to bf16, into the image's input planes, read no more). */
static void mlc__conv_fast_out(const mlc__conv_job *job, float *scratch, const float *in,
                               const uint16_t *in16, size_t i, int dx) {
    const mlc__conv_fast *f = job->fast;
    float *cs = mlc__conv_fast_image(f, in, in16, scratch);
    uint16_t *staged = (uint16_t *)(void *)scratch;      /* (y16) a plane rounded, where the planes were */
    const int OW = dx ? job->cv->W : job->cv->OW;
    const size_t extent = (size_t)f->OH * f->Wp;
    size_t q;
    int m, oh;
    for (m = 0; m < f->M; m++) {
        float *plane = cs + (size_t)m * f->Pn;
        const size_t at = (i * f->M + m) * f->OH * OW;
        if (!dx && job->bias) {
            const float b = job->bias[m];
            MLC__VECTOR_LOOP(q, 0, extent, { plane[q] += b; });
        }
        if (!dx) mlc__conv_activate(job->cv, extent, plane);
        if (job->y16) mlc__narrow(MLC_BF16, plane, staged, extent);   /* (rows too short to round alone) */
        for (oh = 0; oh < f->OH; oh++) {
            const float *src = plane + (size_t)oh * f->Wp;
            const size_t to = at + (size_t)oh * OW;
            if (dx && job->gx_overwrite) memcpy(job->gx + to, src, (size_t)OW * sizeof(float));
            else if (dx) mlc__axpy((size_t)OW, 1.0f, src, job->gx + to);
            else if (job->y16)
                memcpy(job->y16 + to, staged + (size_t)oh * f->Wp, (size_t)OW * sizeof(uint16_t));
            else memcpy(job->y + to, src, (size_t)OW * sizeof(float));
        }
    }
}

/* dW_g += dY_g colᵀ (Og x rows, over P pixels) by dot products, with few rows of col (a first
   layer's C·KH·KW: 9 for one channel): they read both operands where they lie, where packing
   would gather colᵀ and pad its few columns to a kernel's 16 or 32. 0: not taken. */
#define MLC__CONV_DOT_ROWS 16
static int mlc__conv_grad_w_dots(mlc_ctx *ctx, int Og, int rows, int P, const float *dy, const float *col,
                                 float *gw) {
    if (ctx->config.gemm || rows > MLC__CONV_DOT_ROWS) return 0;
    mlc__gemm_direct(ctx, 0, 1, Og, rows, P, dy, col, 1.0f, gw);
    return 1;
}

/* Whether dW goes through mlc__im2row (x channels last, both operands as they lie): groups 1,
   more rows than the dot products take, mlc's own products, no fixed arena (its scratch). */
static int mlc__conv_im2row_fits(mlc_ctx *ctx, const mlc__conv *cv, int rows) {
    return !ctx->config.gemm && !ctx->config.arena && cv->groups == 1 && rows > MLC__CONV_DOT_ROWS;
}

/* The weight W (O x C·KH·KW) of a forward with groups 1 on the general path, packed once for the
   products of all its images (NULL: they pack their own, or multiply without packing; always
   with a fixed arena, which keeps to what it needed before). Without a tape (inference) a
   long-lived weight keeps it between calls in w->packed, which writing its values drops
   (mlc__host_wrote); else it is the call's scratch, for two images or more (one image would
   pack it once either way). */
static const float *mlc__conv_packed_weight(const mlc__node *n, const mlc__conv_job *job) {
    mlc_tensor *w = n->in[1];
    const mlc__conv *cv = job->cv;
    const int rows = cv->C * cv->KH * cv->KW;
    const int keep = w->persistent && !w->on_device && !w->stands_for && !mlc__recording(n);
    float *packed;
    if (cv->groups != 1 || job->fast || job->ctx->config.arena    /* (a fixed arena: what it took before) */
        || (!keep && cv->N < 2)
        || !mlc__gemm_packs(job->ctx, 0, cv->O, cv->OH * cv->OW, rows, job->work_floats != 0))
        return NULL;
    if (keep && w->packed) return w->packed;
    packed = keep ? (float *)mlc__owned_alloc(job->ctx, mlc__gemm_a_floats(cv->O, rows) * sizeof(float),
                                              n->name)
                  : mlc__floats(job->ctx, mlc__gemm_a_floats(cv->O, rows), n->name);
    if (!packed) return NULL;
    mlc__gemm_pack_a(job->ctx, 0, cv->O, rows, w->data, packed);
    if (keep) w->packed = packed;
    return packed;
}
#else
struct mlc__conv_fast { size_t piece_floats; };
static int mlc__conv_fast_fits(mlc_ctx *ctx, const mlc__conv *cv, int dx, mlc__conv_fast *f) {
    (void)ctx; (void)cv; (void)dx; (void)f;
    return 0;
}
static int mlc__conv_fast_plan(mlc__conv_fast *f, mlc_ctx *ctx, const float *w, const uint16_t *w16, int flip,
                               const char *op) {
    (void)f; (void)ctx; (void)w; (void)w16; (void)flip; (void)op;
    return 0;
}
static void mlc__conv_fast_out(const mlc__conv_job *job, float *scratch, const float *in,
                               const uint16_t *in16, size_t i, int dx) {
    (void)job; (void)scratch; (void)in; (void)in16; (void)i; (void)dx;
}
static int mlc__conv_grad_w_dots(mlc_ctx *ctx, int Og, int rows, int P, const float *dy, const float *col,
                                 float *gw) {
    (void)ctx; (void)Og; (void)rows; (void)P; (void)dy; (void)col; (void)gw;
    return 0;
}
static int mlc__conv_im2row_fits(mlc_ctx *ctx, const mlc__conv *cv, int rows) {
    (void)ctx; (void)cv; (void)rows;
    return 0;
}
static const float *mlc__conv_packed_weight(const mlc__node *n, const mlc__conv_job *job) {
    (void)n; (void)job;
    return NULL;
}
#endif /* !MLC_USE_CBLAS */


/* forward over images [begin, end): y_g = W_g col + b, then the activation (the product's epilogue,
   on each tile as it is done) */
static void mlc__conv2d_images(void *arg, int slot, size_t begin, size_t end) {
    const mlc__conv_job *job = (const mlc__conv_job *)arg;
    const mlc__conv *cv = job->cv;
    int Cg = cv->C / cv->groups, Og = cv->O / cv->groups, P = cv->OH * cv->OW, rows = Cg * cv->KH * cv->KW, g;
    float *col = job->scratch + (size_t)slot * job->slot_floats,
          *work = job->work_floats ? col + job->col_floats : NULL;
    size_t i;
    for (i = begin; i < end; i++) {
        if (job->fast) {
            const size_t at = i * cv->C * cv->H * cv->W;
            mlc__conv_fast_out(job, col + job->fast_at, job->x16 ? NULL : job->x + at,
                               job->x16 ? job->x16 + at : NULL, i, 0);
            continue;
        }
        for (g = 0; g < cv->groups; g++) {
            float *y = job->y + (i * cv->O + (size_t)g * Og) * P;
            const float *x = job->x + (i * cv->C + (size_t)g * Cg) * cv->H * cv->W;
            if (!mlc__conv_pointwise(cv)) mlc__im2col_threads(job->ctx, cv, Cg, x, col);
            mlc__gemm_then(job->ctx, 0, 0, Og, P, rows, job->w + (size_t)g * Og * rows,
                           mlc__conv_pointwise(cv) ? x : col, 0.0f, y, work, NULL,
                           job->bias ? job->bias + g * Og : NULL, cv->relu, job->w_packed);
        }
    }
}

/* colᵀ with its rows in the order (i, j, c), for groups 1: colT[oh·OW + ow, (i·KW + j)·C + c] =
   x[c, oh·sh + i·dh - ph, ow·sw + j·dw - pw] (0 outside), through xt, x with its channels last
   ([H, W, C]), so each window position is C floats copied. Then dW = dY colT takes both
   operands of the product as they lie (packing col's transpose gathers every value), with dW's
   columns in (i, j, c) order, put back in (c, i, j) order once per piece. */
static void mlc__im2row(const mlc__conv *cv, const float *x, float *xt, float *colT) {
    const int C = cv->C, T = cv->KH * cv->KW;
    int c, q, oh, ow, i, j;
    for (c = 0; c < C; c++)
        for (q = 0; q < cv->H * cv->W; q++) xt[(size_t)q * C + c] = x[(size_t)c * cv->H * cv->W + q];
    for (oh = 0; oh < cv->OH; oh++)
        for (ow = 0; ow < cv->OW; ow++) {
            float *row = colT + ((size_t)oh * cv->OW + ow) * C * T;
            for (i = 0; i < cv->KH; i++)
                for (j = 0; j < cv->KW; j++) {
                    int ih = oh * cv->sh + i * cv->dh - cv->ph, iw = ow * cv->sw + j * cv->dw - cv->pw;
                    float *dst = row + (size_t)(i * cv->KW + j) * C;
                    if (ih < 0 || ih >= cv->H || iw < 0 || iw >= cv->W) {
                        memset(dst, 0, (size_t)C * sizeof(float));
                        continue;
                    }
                    memcpy(dst, xt + ((size_t)ih * cv->W + iw) * C, (size_t)C * sizeof(float));
                }
        }
}

/* dW_g += dY_g colᵀ (Og x rows, over P pixels) */
static void mlc__conv_grad_w(mlc_ctx *ctx, int Og, int rows, int P, const float *dy, const float *col,
                             float *gw, float *work) {
    if (!mlc__conv_grad_w_dots(ctx, Og, rows, P, dy, col, gw))
        mlc__gemm(ctx, 0, 1, Og, rows, P, dy, col, 1.0f, gw, work);
}

/* backward over the groups of images [begin, end); each group's dW and db go to its partial sums
   when there are several groups */
static void mlc__conv2d_backward_images(void *arg, int slot, size_t begin, size_t end) {
    const mlc__conv_job *job = (const mlc__conv_job *)arg;
    const mlc__conv *cv = job->cv;
    int Cg = cv->C / cv->groups, Og = cv->O / cv->groups, P = cv->OH * cv->OW, rows = Cg * cv->KH * cv->KW, g,
        o;
    float *col = job->scratch + (size_t)slot * job->slot_floats,
          *work = job->work_floats ? col + job->col_floats : NULL;
    float *xt = col + job->rows_at, *gh_rows = xt + (size_t)cv->C * cv->H * cv->W;   /* (by_rows) */
    float *dy_relu = col + job->relu_at;                 /* (relu) the image's g·(y > 0) */
    float *x_wide = col + job->wide_at, *y_wide = x_wide + (size_t)cv->C * cv->H * cv->W;   /* (bf16) */
    const size_t sum_floats = (size_t)cv->O * rows + cv->O;
    size_t i, s;
    int c, t, T = cv->KH * cv->KW;
    for (s = begin; s < end; s++) {                      /* group s: images [first, last) */
        float *gw = job->sums > 1 ? job->scratch + job->sums_at + s * sum_floats : job->gw,
              *gb = job->sums > 1 ? gw + (size_t)cv->O * rows : job->gb;
        const size_t first = mlc__piece_begin((size_t)cv->N, (int)s, job->sums),
                     last = mlc__piece_begin((size_t)cv->N, (int)s + 1, job->sums);
        if (job->sums > 1) memset(gw, 0, sum_floats * sizeof(float));
        if (job->by_rows) memset(gh_rows, 0, (size_t)cv->O * rows * sizeof(float));
        for (i = first; i < last; i++) {
            const size_t x_at = i * cv->C * cv->H * cv->W, y_at = i * cv->O * P;
            const float *dy_image = job->dy + y_at, *x_image = job->x16 ? x_wide : job->x + x_at;
            if (job->x16 && job->gw)
                mlc__widen(MLC_BF16, job->x16 + x_at, x_wide, (size_t)cv->C * cv->H * cv->W);
            if (cv->relu) {
                const float *y = job->y16 ? y_wide : job->y + y_at;
                if (job->y16) mlc__widen(MLC_BF16, job->y16 + y_at, y_wide, (size_t)cv->O * P);
                mlc__conv_activate_grad(cv, (size_t)cv->O * P, y, dy_image, dy_relu);
                dy_image = dy_relu;
            }
            for (g = 0; g < cv->groups; g++) {
                const float *dy = dy_image + (size_t)g * Og * P;
                if (job->by_rows) {
                    mlc__im2row(cv, x_image, xt, col);
                    mlc__gemm(job->ctx, 0, 0, Og, rows, P, dy, col, 1.0f, gh_rows, work);
                } else if (job->gw) {
                    const float *x = x_image + (size_t)g * Cg * cv->H * cv->W;
                    if (!mlc__conv_pointwise(cv)) mlc__im2col_threads(job->ctx, cv, Cg, x, col);
                    mlc__conv_grad_w(job->ctx, Og, rows, P, dy, mlc__conv_pointwise(cv) ? x : col,
                                     gw + (size_t)g * Og * rows, work);
                }
                if (job->gx && job->fast) mlc__conv_fast_out(job, col + job->fast_at, dy_image, NULL, i, 1);
                else if (job->gx && mlc__conv_pointwise(cv))
                    mlc__gemm(job->ctx, 1, 0, rows, P, Og, job->w + (size_t)g * Og * rows, dy,
                              job->gx_overwrite ? 0.0f : 1.0f,
                              job->gx + (i * cv->C + (size_t)g * Cg) * cv->H * cv->W, work);
                else if (job->gx) {
                    float *gx = job->gx + (i * cv->C + (size_t)g * Cg) * cv->H * cv->W;
                    mlc__gemm(job->ctx, 1, 0, rows, P, Og, job->w + (size_t)g * Og * rows, dy, 0.0f, col,
                              work);
                    if (job->gx_overwrite) memset(gx, 0, (size_t)Cg * cv->H * cv->W * sizeof(float));
                    mlc__col2im(cv, Cg, col, gx);          /* (which adds) */
                }
                for (o = 0; job->gb && o < Og; o++) gb[g * Og + o] += mlc__sum8(dy + (size_t)o * P, P);
            }
        }
        for (o = 0; job->by_rows && o < cv->O; o++)        /* (i, j, c) back to (c, i, j) */
            for (c = 0; c < cv->C; c++)
                for (t = 0; t < T; t++)
                    gw[((size_t)o * cv->C + c) * T + t] += gh_rows[((size_t)o * T + t) * cv->C + c];
    }
}

static void mlc__backward_widened(mlc__node *n);   /* (@section backward) */

/* Whether a bf16 convolution (mlc__cpu_takes_half) runs on the bf16 path: the fast path takes it
   forward and, where x wants a gradient, its dx too; else it runs on float32 stand-ins, forward
   and backward alike. Backward on the bf16 path takes dx there, and dW, db on float32: each
   image's x (and y, for the activation) widened in the thread's scratch. */
static int mlc__conv_on_bf16_path(const mlc__node *n, int backward, mlc__conv_fast *f) {
    const mlc__conv *cv = (const mlc__conv *)n->saved;
    mlc_ctx *ctx = n->out->ctx;
    return !mlc__conv_depthwise_fits(cv) && mlc__conv_fast_fits(ctx, cv, 0, f)
           && (!backward || !n->in[0]->requires_grad || mlc__conv_fast_fits(ctx, cv, 1, f));
}

static void mlc__conv2d_backward(mlc__node *n) {
    const mlc__conv *cv = (const mlc__conv *)n->saved;
    mlc_tensor *x = n->in[0], *w = n->in[1];
    const int half = n->out->dtype != MLC_F32;          /* (mlc__cpu_takes_half: x, w and y bf16) */
    int rows = cv->C / cv->groups * cv->KH * cv->KW, s;
    mlc__conv_job job;
    size_t fast_floats = 0, rows_floats, relu_floats = cv->relu ? (size_t)cv->O * cv->OH * cv->OW : 0,
           wide_floats = half ? (size_t)cv->C * cv->H * cv->W + relu_floats : 0;
    int by_rows = mlc__grad(w) && !mlc__conv_pointwise(cv) && mlc__conv_im2row_fits(x->ctx, cv, rows);
    float gx_beta;
    mlc__conv_fast fast;
    if (half && !mlc__conv_on_bf16_path(n, 1, &fast)) {
        mlc__backward_widened(n);
        return;
    }
    if (mlc__conv_depthwise_fits(cv)) {
        mlc__depthwise_job dw;
        memset(&dw, 0, sizeof dw);
        dw.cv = cv; dw.x = x->data; dw.w = w->data; dw.dy = n->out->grad; dw.y = n->out->data;
        dw.gx = mlc__grad_to_overwrite(x, &gx_beta); dw.gx_overwrite = gx_beta == 0.0f;
        dw.gw = mlc__grad(w); dw.gb = mlc__grad(n->in[2]);
        mlc__conv_depthwise(x->ctx, &dw, 1);
        return;
    }
    if (x->requires_grad && mlc__conv_fast_fits(x->ctx, cv, 1, &fast)) {
        if (!mlc__conv_fast_plan(&fast, x->ctx, half ? NULL : w->data, half ? w->half : NULL, 1,
                                 "mlc_conv2d backward"))
            return;
        fast_floats = (fast.piece_floats + 15) / 16 * 16;
    }
    rows_floats = by_rows ? (size_t)cv->C * cv->H * cv->W + (size_t)cv->O * rows : 0;
    if (!mlc__conv_plan(&job, x->ctx, cv, 1, fast_floats + rows_floats + relu_floats + wide_floats,
                        "mlc_conv2d backward"))
        return;
    job.fast = fast_floats ? &fast : NULL;
    job.by_rows = by_rows; job.rows_at = job.fast_at + fast_floats; job.relu_at = job.rows_at + rows_floats;
    job.wide_at = job.relu_at + relu_floats;
    if (half) { job.x16 = x->half; job.y16 = n->out->half; }
    else { job.x = x->data; job.w = w->data; job.y = n->out->data; }
    job.dy = n->out->grad;
    job.gx = mlc__grad_to_overwrite(x, &gx_beta); job.gx_overwrite = gx_beta == 0.0f;
    job.gw = mlc__grad(w); job.gb = mlc__grad(n->in[2]);
    mlc__parallel(x->ctx, (size_t)job.sums, job.parallel_from, mlc__conv2d_backward_images, &job);
    for (s = 0; job.sums > 1 && s < job.sums; s++) {   /* the groups' partial sums, in order */
        const float *part = job.scratch + job.sums_at + (size_t)s * ((size_t)cv->O * rows + cv->O);
        if (job.gw) mlc__axpy((size_t)cv->O * rows, 1.0f, part, job.gw);
        if (job.gb) mlc__axpy((size_t)cv->O, 1.0f, part + (size_t)cv->O * rows, job.gb);
    }
}

/* A window of KH x KW with padding ph, pw and dilation dh, dw over an H x W input: every size it
   leads to fits in int (else MLC_ERR_ARG), and the window is not empty (else MLC_ERR_SHAPE: it would
   divide by 0). */
static int mlc__window_fits(mlc_ctx *ctx, const char *op, int H, int W, int KH, int KW, int ph, int pw,
                            int dh, int dw) {
    const long long most = 2147483647;
    if (KH < 1 || KW < 1) {
        mlc__fail(ctx, MLC_ERR_SHAPE, "%s: the kernel %d x %d has a zero dimension", op, KH, KW);
        return 0;
    }
    if (ph < 0 || pw < 0 || dh < 1 || dw < 1 || (long long)H + 2LL * ph > most
        || (long long)W + 2LL * pw > most || (long long)dh * (KH - 1) + 1 > most
        || (long long)dw * (KW - 1) + 1 > most) {
        mlc__fail(ctx, MLC_ERR_ARG, "%s: padding (%d, %d) or dilation (%d, %d) is too large for an int", op,
                  ph, pw, dh, dw);
        return 0;
    }
    return 1;
}

/* An option where 0 takes def (the height's value for a width's field) and MLC_ZERO_INT is 0 */
static int mlc__int_setting(int v, int def) { return v == MLC_ZERO_INT ? 0 : v ? v : def; }

/* float32, or bf16 (mlc__cpu_takes_half: x, w, the bias and y) on the fast path's bf16 kernel;
   a bf16 convolution off that path (mlc__conv_on_bf16_path) runs on float32 stand-ins */
static int mlc__conv2d_cpu(mlc__node *n) {
    const mlc__conv *cv = (const mlc__conv *)n->saved;
    mlc_ctx *ctx = n->out->ctx;
    mlc_tensor *bias = n->in[2];
    const int half = n->out->dtype != MLC_F32;
    mlc__conv_job job;
    size_t fast_floats = 0;
    mlc__conv_fast fast;
    if (half && !mlc__conv_on_bf16_path(n, 0, &fast)) return mlc__cpu_widened(n);
    if (mlc__conv_depthwise_fits(cv)) {
        mlc__depthwise_job dw;
        memset(&dw, 0, sizeof dw);
        dw.cv = cv; dw.x = n->in[0]->data; dw.w = n->in[1]->data; dw.y = n->out->data;
        dw.bias = n->in[2] ? n->in[2]->data : NULL;
        return mlc__conv_depthwise(ctx, &dw, 0);
    }
    if (mlc__conv_fast_fits(ctx, cv, 0, &fast)) {
        if (!mlc__conv_fast_plan(&fast, ctx, half ? NULL : n->in[1]->data, half ? n->in[1]->half : NULL, 0,
                                 n->name))
            return 0;
        fast_floats = fast.piece_floats;
    }
    if (!mlc__conv_plan(&job, ctx, cv, 0, fast_floats, n->name)) return 0;
    job.fast = fast_floats ? &fast : NULL;
    if (half) {
        const mlc_tensor *bias_wide = bias ? mlc__widened(bias, 1) : NULL;
        if (bias && !bias_wide) return 0;
        job.x16 = n->in[0]->half; job.bias = bias_wide ? bias_wide->data : NULL; job.y16 = n->out->half;
    } else {
        job.x = n->in[0]->data; job.w = n->in[1]->data; job.bias = bias ? bias->data : NULL;
        job.y = n->out->data;
    }
    job.w_packed = mlc__conv_packed_weight(n, &job);
    if (ctx->error) return 0;
    mlc__parallel(ctx, (size_t)cv->N, job.parallel_from, mlc__conv2d_images, &job);
    return 1;
}

/* conv2d, then (relu) relu fused into it on the CPU; on a device the two ops run in turn */
/* A convolution's sizes in *cv from its operands and options, checked (errors name op). */
static int mlc__conv_setup(mlc_ctx *ctx, const char *op, const mlc_tensor *x, const mlc_tensor *weight,
                           const mlc_tensor *bias, mlc_conv_opts opts, mlc__conv *cv_out) {
    mlc__conv cv;
    cv.relu = 0;
    cv.sh = opts.stride ? opts.stride : 1; cv.ph = opts.padding;
    cv.dh = opts.dilation ? opts.dilation : 1; cv.groups = opts.groups ? opts.groups : 1;
    cv.sw = mlc__int_setting(opts.stride_w, cv.sh); cv.pw = mlc__int_setting(opts.padding_w, cv.ph);
    cv.dw = mlc__int_setting(opts.dilation_w, cv.dh);
    if (cv.sh < 1 || cv.sw < 1 || cv.ph < 0 || cv.pw < 0 || cv.dh < 1 || cv.dw < 1 || cv.groups < 1
        || opts.padding_w < MLC_ZERO_INT)
        return mlc__fail(ctx, MLC_ERR_ARG,
                         "%s: stride (%d, %d), padding (%d, %d), dilation (%d, %d), groups %d "
                         "are not valid",
                         op, opts.stride, opts.stride_w, opts.padding, opts.padding_w, opts.dilation,
                         opts.dilation_w, opts.groups)
               != NULL;
    if (x->ndim != 4 || weight->ndim != 4)
        return mlc__fail(ctx, MLC_ERR_SHAPE,
                         "%s: x %T must be [N, C, H, W] and weight %T [O, C/groups, KH, KW]", op, x, weight)
               != NULL;
    cv.N = x->shape[0]; cv.C = x->shape[1]; cv.H = x->shape[2]; cv.W = x->shape[3];
    cv.O = weight->shape[0]; cv.KH = weight->shape[2]; cv.KW = weight->shape[3];
    if (cv.C % cv.groups || cv.O % cv.groups || weight->shape[1] * cv.groups != cv.C)
        return mlc__fail(ctx, MLC_ERR_SHAPE, "%s: x %T and weight %T do not fit groups = %d", op, x, weight,
                         cv.groups) != NULL;
    if (bias && (bias->ndim != 1 || bias->shape[0] != cv.O))
        return mlc__fail(ctx, MLC_ERR_SHAPE, "%s: bias %T must be [%d]", op, bias, cv.O) != NULL;
    if (!mlc__window_fits(ctx, op, cv.H, cv.W, cv.KH, cv.KW, cv.ph, cv.pw, cv.dh, cv.dw)) return 0;
    cv.OH = (cv.H + 2 * cv.ph - cv.dh * (cv.KH - 1) - 1) / cv.sh + 1;
    cv.OW = (cv.W + 2 * cv.pw - cv.dw * (cv.KW - 1) - 1) / cv.sw + 1;
    if (cv.H + 2 * cv.ph < cv.dh * (cv.KH - 1) + 1 || cv.W + 2 * cv.pw < cv.dw * (cv.KW - 1) + 1)
        return mlc__fail(ctx, MLC_ERR_SHAPE, "%s: kernel %T is larger than the padded input %T", op, weight,
                         x)
               != NULL;
    *cv_out = cv;
    return 1;
}

static mlc_tensor *mlc__conv2d(mlc_tensor *x, mlc_tensor *weight, mlc_tensor *bias, mlc_conv_opts opts,
                               int relu) {
    mlc__conv cv;
    mlc_tensor *out;
    mlc__node call;
    int shape[4];
    x = mlc__autocast_low(x); weight = mlc__autocast_low(weight); bias = mlc__autocast_low(bias);
    MLC__ENTER("mlc_conv2d", x, weight);
    if (!mlc__same_device(ctx, "mlc_conv2d", x, bias)) return NULL;
    if (relu && x->on_device)
        return relu == 6 ? mlc_relu6(mlc__conv2d(x, weight, bias, opts, 0))
                         : mlc_relu(mlc__conv2d(x, weight, bias, opts, 0));
    if (!mlc__conv_setup(ctx, "mlc_conv2d", x, weight, bias, opts, &cv)) return NULL;
    cv.relu = relu;
    shape[0] = cv.N; shape[1] = cv.O; shape[2] = cv.OH; shape[3] = cv.OW;
    out = mlc__make(ctx, "mlc_conv2d", 4, shape, 0);
    if (!out) return NULL;
    mlc__call(&call, MLC__OP_CONV2D, "mlc_conv2d", out, x, weight, bias, NULL);
    if (!mlc__save(&call, &cv, sizeof cv) || !mlc__run(ctx, &call)) return NULL;
    mlc__record(&call);
    return out;
}
MLCDEF mlc_tensor *mlc_conv2d(mlc_tensor *x, mlc_tensor *weight, mlc_tensor *bias, mlc_conv_opts opts) {
    return mlc__conv2d(x, weight, bias, opts, 0);
}
MLCDEF mlc_tensor *mlc_conv2d_relu6(mlc_tensor *x, mlc_tensor *weight, mlc_tensor *bias, mlc_conv_opts opts) {
    return mlc__conv2d(x, weight, bias, opts, 6);
}

/* The planes (image, channel) are shared out between threads, forward and backward. Kernel KH x
   KW, stride SH, SW, padding PH, PW (height, width). */
typedef struct mlc__pool_job {
    mlc_tensor *x, *y;
    float *gx;
    int KH, KW, SH, SW, PH, PW, is_max, exclude_pad, *argmax;
    int overwrite;                      /* backward: gx is fresh, each plane zeroed before it adds */
} mlc__pool_job;

/* The job of pooling node n (its arguments, input and output), with gx and argmax */
static void mlc__pool_job_of(mlc__pool_job *job, const mlc__node *n, float *gx, int *argmax) {
    job->x = n->in[0]; job->y = n->out; job->gx = gx; job->argmax = argmax;
    job->KH = n->args.pool.kh; job->KW = n->args.pool.kw; job->SH = n->args.pool.sh;
    job->SW = n->args.pool.sw; job->PH = n->args.pool.ph; job->PW = n->args.pool.pw;
    job->is_max = n->args.pool.is_max; job->exclude_pad = n->args.pool.exclude_pad; job->overwrite = 0;
}

/* The window of output (oh, ow) clipped to the input: rows [*h0, *h1), columns [*w0, *w1). */
static inline void mlc__pool_window(const mlc__pool_job *job, int oh, int ow, int *h0, int *h1, int *w0,
                                    int *w1) {
    const int H = job->x->shape[2], W = job->x->shape[3];
    *h0 = oh * job->SH - job->PH; *h1 = *h0 + job->KH; *w0 = ow * job->SW - job->PW; *w1 = *w0 + job->KW;
    if (*h0 < 0) *h0 = 0;
    if (*h1 > H) *h1 = H;
    if (*w0 < 0) *w0 = 0;
    if (*w1 > W) *w1 = W;
}

/* Average pooling's divisor for output (oh, ow): its window cut at the padded input's far edge,
   as PyTorch counts with count_include_pad (KH·KW but for ceil_mode's last windows), or with
   exclude_pad cut to the input itself. */
static int mlc__pool_count(const mlc__pool_job *job, int oh, int ow) {
    int H = job->x->shape[2], W = job->x->shape[3], h0 = oh * job->SH - job->PH, w0 = ow * job->SW - job->PW;
    int h1 = h0 + job->KH < H + job->PH ? h0 + job->KH : H + job->PH;
    int w1 = w0 + job->KW < W + job->PW ? w0 + job->KW : W + job->PW;
    if (job->exclude_pad) {
        h0 = h0 < 0 ? 0 : h0; w0 = w0 < 0 ? 0 : w0; h1 = h1 > H ? H : h1; w1 = w1 > W ? W : w1;
    }
    return (h1 - h0) * (w1 - w0);
}

/* Whether v replaces best in a max-pooling window: larger, or a NaN (PyTorch's CPU rule: the
   last NaN wins and the output is NaN); the NaN test reads bits, which -ffast-math keeps. */
static int mlc__pool_takes(float v, float best) { return (v > best) | mlc__is_nan(v); }

/* NaN when window rows [h0, h1), columns [w0, w0 + KW) of plane p (width W) hold a NaN, else
   best. The paths without an argmax take the largest by compare-and-select, which passes a NaN
   over, and ask this only where the window's sum is not finite (a NaN, an infinity or an
   overflow: rare), so NaN costs them one add per value. */
static float mlc__pool_nan(const float *p, int W, int h0, int h1, int w0, int KW, float best) {
    int ih, j;
    for (ih = h0; ih < h1; ih++)
        for (j = 0; j < KW; j++) if (mlc__is_nan(p[ih * W + w0 + j])) return NAN;
    return best;
}

#if MLC__X86
/* The even (0x88) or odd (0xdd) floats of x then y, in order: shuffle_ps picks them within each
   128-bit lane, permute4x64 puts the lanes' pairs in order */
#define MLC__DEINTERLEAVE(x, y, pick) \
    _mm256_castpd_ps(_mm256_permute4x64_pd(_mm256_castps_pd(_mm256_shuffle_ps(x, y, pick)), 0xd8))

/* The 2 x 2, stride 2 windows of output columns [lo, hi) over input rows r0 and r1 (at0: r0's
   index in the plane), with their argmax (NULL: none), 8 at a time: 16 floats of each row
   loaded (masked past hi), split into even and odd columns, and taken in window order as the
   loop below does. */
__attribute__((target("avx2")))
static void mlc__pool_2x2_avx2(const float *r0, const float *r1, int at0, int W, int lo, int hi, float *y,
                               int *argmax) {
    const __m256i lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
    const int step[3] = { 1, W, W + 1 };                       /* (0, 1), (1, 0), (1, 1) from (0, 0) */
    int ow, k;
    for (ow = lo; ow < hi; ow += 8) {
        int n = hi - ow < 8 ? hi - ow : 8;
        const float *a = r0 + 2 * ow, *b = r1 + 2 * ow;
        __m256i out = _mm256_cmpgt_epi32(_mm256_set1_epi32(n), lane),        /* n outputs from 2n floats */
                first = _mm256_cmpgt_epi32(_mm256_set1_epi32(2 * n), lane),
                second = _mm256_cmpgt_epi32(_mm256_set1_epi32(2 * n - 8), lane);
        __m256 a0 = _mm256_maskload_ps(a, first), a1 = _mm256_maskload_ps(a + 8, second),
               b0 = _mm256_maskload_ps(b, first), b1 = _mm256_maskload_ps(b + 8, second);
        __m256 best = MLC__DEINTERLEAVE(a0, a1, 0x88), v[3], take;
        __m256i at = _mm256_add_epi32(_mm256_set1_epi32(at0 + 2 * ow), _mm256_add_epi32(lane, lane)),
                where = at;
        v[0] = MLC__DEINTERLEAVE(a0, a1, 0xdd); v[1] = MLC__DEINTERLEAVE(b0, b1, 0x88);
        v[2] = MLC__DEINTERLEAVE(b0, b1, 0xdd);
        for (k = 0; k < 3; k++) {
            take = _mm256_or_ps(_mm256_cmp_ps(v[k], best, _CMP_GT_OQ),        /* larger, or a NaN */
                                _mm256_cmp_ps(v[k], v[k], _CMP_UNORD_Q));
            best = _mm256_blendv_ps(best, v[k], take);
            where = _mm256_castps_si256(_mm256_blendv_ps(_mm256_castsi256_ps(where), _mm256_castsi256_ps(
                _mm256_add_epi32(at, _mm256_set1_epi32(step[k]))), take));
        }
        _mm256_maskstore_ps(y + ow, out, best);
        if (argmax) _mm256_maskstore_epi32(argmax + ow, out, where);
    }
}
#undef MLC__DEINTERLEAVE
#endif

/* Max pooling along an output row, over the outputs [lo, hi) whose windows lie inside the
   input's columns (rows [h0, h1) of plane p; column of output ow's window: ow·SW - PW + j).
   With an argmax each window row and column is one pass over the outputs, visited in the same
   order as one output at a time, so the argmax is the same (first) one; without, each window
   is taken whole in registers. 2x2 with stride 2, the common case, is unrolled either way (with
   an argmax its four values are visited in window order, as above), 8 outputs at a time where
   the CPU has AVX2. */
static void mlc__pool_max_row(const mlc__pool_job *job, const float *p, int h0, int h1, int lo, int hi,
                              float *MLC__RESTRICT y, int *MLC__RESTRICT argmax) {
    const int W = job->x->shape[3], K = job->KW, S = job->SW, left = -job->PW;
    int ih, j, ow;
#if MLC__X86
    if (K == 2 && S == 2 && h1 - h0 == 2 && mlc__cpu_avx2()) {
        mlc__pool_2x2_avx2(p + h0 * W + left, p + h0 * W + left + W, h0 * W + left, W, lo, hi, y, argmax);
        return;
    }
#endif
    if (argmax && K == 2 && S == 2 && h1 - h0 == 2) {
        const float *r0 = p + h0 * W + left, *r1 = r0 + W;
        const int at0 = h0 * W + left;
        MLC__VECTOR_LOOP(ow, lo, hi, {
            float a = r0[2 * ow], b = r0[2 * ow + 1], c = r1[2 * ow], d = r1[2 * ow + 1], best = a;
            int at = at0 + 2 * ow, take = mlc__pool_takes(b, best);
            best = take ? b : best; at = take ? at0 + 2 * ow + 1 : at;
            take = mlc__pool_takes(c, best);
            best = take ? c : best; at = take ? at0 + W + 2 * ow : at;
            take = mlc__pool_takes(d, best);
            y[ow] = take ? d : best; argmax[ow] = take ? at0 + W + 2 * ow + 1 : at;
        });
        return;
    }
    if (!argmax && K == 2 && S == 2 && h1 - h0 == 2) {
        const float *r0 = p + h0 * W + left, *r1 = r0 + W;
        for (ow = lo; ow < hi; ow++) {     /* in window order, as below */
            float a = r0[2 * ow], b = r0[2 * ow + 1], c = r1[2 * ow], d = r1[2 * ow + 1], best = a;
            best = b > best ? b : best;
            best = c > best ? c : best;
            y[ow] = d > best ? d : best;
            if (!mlc__is_finite(a + b + c + d)) y[ow] = mlc__pool_nan(p, W, h0, h1, 2 * ow + left, K, y[ow]);
        }
        return;
    }
    if (!argmax) {
        for (ow = lo; ow < hi; ow++) {
            const float *w = p + h0 * W + ow * S + left;
            float best = w[0], sum = 0.0f;
            for (ih = 0; ih < h1 - h0; ih++)
                for (j = 0; j < K; j++) {
                    best = w[ih * W + j] > best ? w[ih * W + j] : best;
                    sum += w[ih * W + j];
                }
            y[ow] = mlc__is_finite(sum) ? best : mlc__pool_nan(p, W, h0, h1, ow * S + left, K, best);
        }
        return;
    }
    for (ow = lo; ow < hi; ow++) { y[ow] = p[h0 * W + ow * S + left]; argmax[ow] = h0 * W + ow * S + left; }
    for (ih = h0; ih < h1; ih++)
        for (j = 0; j < K; j++) {
            const float *in = p + ih * W + left + j;
            MLC__OMP(omp simd)
            for (ow = lo; ow < hi; ow++) {
                int take = mlc__pool_takes(in[ow * S], y[ow]);
                y[ow] = take ? in[ow * S] : y[ow];
                argmax[ow] = take ? ih * W + left + j + ow * S : argmax[ow];
            }
        }
}

/* One output, its window clipped to the input: the edges of max pooling, and average pooling. */
static void mlc__pool_one(const mlc__pool_job *job, const float *p, int oh, int ow, float *y, int *argmax) {
    const int W = job->x->shape[3], OW = job->y->shape[3];
    int ih, iw, h0, h1, w0, w1;
    mlc__pool_window(job, oh, ow, &h0, &h1, &w0, &w1);
    if (job->is_max) {                      /* the first of the largest, or the last NaN */
        int at = h0 < h1 && w0 < w1 ? h0 * W + w0 : -1;
        float best = at < 0 ? -INFINITY : p[at];
        for (ih = h0; ih < h1; ih++)
            for (iw = w0; iw < w1; iw++) {
                int take = mlc__pool_takes(p[ih * W + iw], best);
                best = take ? p[ih * W + iw] : best;
                at = take ? ih * W + iw : at;
            }
        if (argmax) argmax[oh * OW + ow] = at;   /* kept when a backward will come */
        y[oh * OW + ow] = best;
    } else {
        mlc__sum_t sum = 0;
        for (ih = h0; ih < h1; ih++)
            for (iw = w0; iw < w1; iw++) sum += (mlc__sum_t)p[ih * W + iw];
        y[oh * OW + ow] = (float)(sum / (mlc__sum_t)mlc__pool_count(job, oh, ow));
    }
}

static void mlc__pool_planes(void *arg, int slot, size_t begin, size_t end) {
    const mlc__pool_job *job = (const mlc__pool_job *)arg;
    const int H = job->x->shape[2], W = job->x->shape[3], OH = job->y->shape[2], OW = job->y->shape[3];
    const int K = job->KW, S = job->SW, Pd = job->PW;
    /* max pooling goes by rows over the outputs [lo, hi) whose windows need no clipping at the sides */
    int lo = job->is_max ? (Pd + S - 1) / S : 0, hi = job->is_max && W + Pd >= K ? (W + Pd - K) / S + 1 : 0;
    int oh, ow, h0, h1, w0, w1;
    size_t pl;
    (void)slot;
    if (hi > OW) hi = OW;
    if (lo > hi) lo = hi;
    for (pl = begin; pl < end; pl++) {
        const float *p = job->x->data + pl * H * W;
        float *y = job->y->data + pl * OH * OW;
        int *argmax = job->argmax ? job->argmax + pl * OH * OW : NULL;
        for (oh = 0; oh < OH; oh++) {
            for (ow = 0; ow < lo; ow++) mlc__pool_one(job, p, oh, ow, y, argmax);
            mlc__pool_window(job, oh, lo, &h0, &h1, &w0, &w1);
            if (lo < hi)
                mlc__pool_max_row(job, p, h0, h1, lo, hi, y + oh * OW, argmax ? argmax + oh * OW : NULL);
            for (ow = hi; ow < OW; ow++) mlc__pool_one(job, p, oh, ow, y, argmax);
        }
    }
}

static void mlc__pool_planes_backward(void *arg, int slot, size_t begin, size_t end) {
    const mlc__pool_job *job = (const mlc__pool_job *)arg;
    int H = job->x->shape[2], W = job->x->shape[3], OH = job->y->shape[2], OW = job->y->shape[3], oh, ow, ih,
        iw, h0, h1, w0, w1;
    float share;
    size_t pl;
    (void)slot;
    for (pl = begin; pl < end; pl++) {
        const float *g = job->y->grad + pl * OH * OW;
        float *gx = job->gx + pl * H * W;
        const int *argmax = job->argmax ? job->argmax + pl * OH * OW : NULL;
        if (job->overwrite) memset(gx, 0, (size_t)H * W * sizeof(float));
        for (oh = 0; oh < OH; oh++)
            for (ow = 0; ow < OW; ow++) {
                if (argmax) {
                    if (argmax[oh * OW + ow] >= 0) gx[argmax[oh * OW + ow]] += g[oh * OW + ow];
                    continue;
                }
                mlc__pool_window(job, oh, ow, &h0, &h1, &w0, &w1);
                share = 1.0f / (float)mlc__pool_count(job, oh, ow);
                for (ih = h0; ih < h1; ih++)
                    for (iw = w0; iw < w1; iw++) gx[ih * W + iw] += g[oh * OW + ow] * share;
            }
    }
}

/* planes go to threads when the output has at least this many values */
#define MLC__POOL_PARALLEL 16384
static size_t mlc__pool_parallel_from(const mlc_tensor *y) {
    return MLC__POOL_PARALLEL / ((size_t)y->shape[2] * y->shape[3] + 1) + 1;
}

static void mlc__pool_backward(mlc__node *n) {
    mlc__pool_job job;
    float beta;
    mlc__pool_job_of(&job, n, mlc__grad_to_overwrite(n->in[0], &beta), (int *)n->saved);
    job.overwrite = beta == 0.0f;
    if (!job.gx) return;
    mlc__parallel(n->out->ctx, (size_t)job.x->shape[0] * job.x->shape[1], mlc__pool_parallel_from(job.y),
                  mlc__pool_planes_backward, &job);
}

/* PyTorch's output size along one side: (H + 2P - K) / S + 1 rounded down, or up with ceil_mode
   but then without a last window that would start in the padding past the far edge. */
static int mlc__pool_size(int H, int K, int S, int Pd, int ceil_mode) {
    long long n = ((long long)H + 2LL * Pd - K + (ceil_mode ? S - 1 : 0)) / S + 1;
    if (ceil_mode && (n - 1) * S >= (long long)H + Pd) n--;
    return (int)n;
}

/* (max pooling keeps each window's argmax for backward; a device finds it again) */
static int mlc__pool_cpu(mlc__node *n) {
    mlc__pool_job job;
    mlc__pool_job_of(&job, n, NULL, NULL);
    if (n->args.pool.is_max && mlc__recording(n)
        && !(job.argmax = (int *)mlc__arena_alloc(n->out->ctx, n->out->size * sizeof(int) + 1, n->name)))
        return 0;
    mlc__parallel(n->out->ctx, (size_t)n->out->shape[0] * n->out->shape[1], mlc__pool_parallel_from(n->out),
                  mlc__pool_planes, &job);
    n->saved = job.argmax;
    return 1;
}

static int mlc__pool_int8(mlc__node *call);   /* (@section int8) */
static mlc_tensor *mlc__pool2d(const char *op, int is_max, mlc_tensor *x, int K, mlc_pool_opts opts) {
    int shape[4], H, W, KW = opts.kernel_w ? opts.kernel_w : K, SH = opts.stride ? opts.stride : K;
    int SW = opts.stride_w ? opts.stride_w : opts.stride ? opts.stride : KW, PH = opts.padding;
    int PW = mlc__int_setting(opts.padding_w, PH);
    mlc_tensor *out, *const in[1] = { x };
    mlc__node call;
    mlc_ctx *ctx = mlc__enter_as(op, 1, in, 1);
    if (!ctx) return NULL;
    if (x->ndim != 4)
        return (mlc_tensor *)mlc__fail(ctx, MLC_ERR_SHAPE, "%s: x %T must be [N, C, H, W]", op, x);
    if (K >= 1 && KW >= 1 && PH >= 0 && PW >= 0 && (PH > 0 || PW > 0)
        && !mlc__window_fits(ctx, op, x->shape[2], x->shape[3], K, KW, PH, PW, 1, 1))
        return NULL;
    if (K < 1 || KW < 1 || SH < 1 || SW < 1 || PH < 0 || PW < 0 || 2 * PH > K || 2 * PW > KW
        || opts.padding_w < MLC_ZERO_INT)
        return (mlc_tensor *)mlc__fail(ctx, MLC_ERR_ARG,
                                       "%s: kernel (%d, %d), stride (%d, %d), padding (%d, %d) are not valid "
                                       "(padding <= kernel/2)", op, K, KW, SH, SW, PH, opts.padding_w);
    H = x->shape[2]; W = x->shape[3];
    if (H + 2 * PH < K || W + 2 * PW < KW)
        return (mlc_tensor *)mlc__fail(ctx, MLC_ERR_SHAPE,
                                       "%s: kernel (%d, %d) is larger than the padded input %T", op, K, KW,
                                       x);
    shape[0] = x->shape[0]; shape[1] = x->shape[1];
    shape[2] = mlc__pool_size(H, K, SH, PH, opts.ceil_mode);
    shape[3] = mlc__pool_size(W, KW, SW, PW, opts.ceil_mode);
    out = mlc__make(ctx, op, 4, shape, 0);
    if (!out) return NULL;
    mlc__call(&call, MLC__OP_POOL, op, out, x, NULL, NULL, NULL);
    call.args.pool.kh = K; call.args.pool.kw = KW; call.args.pool.sh = SH; call.args.pool.sw = SW;
    call.args.pool.ph = PH; call.args.pool.pw = PW;
    call.args.pool.is_max = is_max;
    call.args.pool.exclude_pad = opts.exclude_pad != 0 && !is_max;
    if (x->dtype == MLC_I8) return mlc__pool_int8(&call) ? out : NULL;   /* (@section int8) */
    if (!mlc__run(ctx, &call)) return NULL;
    mlc__record(&call);
    return out;
}

MLCDEF mlc_tensor *mlc_max_pool2d_opts(mlc_tensor *x, int kernel, mlc_pool_opts opts) {
    return mlc__pool2d("mlc_max_pool2d_opts", 1, x, kernel, opts);
}
MLCDEF mlc_tensor *mlc_avg_pool2d_opts(mlc_tensor *x, int kernel, mlc_pool_opts opts) {
    return mlc__pool2d("mlc_avg_pool2d_opts", 0, x, kernel, opts);
}
MLCDEF mlc_tensor *mlc_max_pool2d(mlc_tensor *x, int kernel, int stride, int padding) {
    mlc_pool_opts opts;
    memset(&opts, 0, sizeof opts);
    opts.stride = stride; opts.padding = padding;
    return mlc_max_pool2d_opts(x, kernel, opts);
}
MLCDEF mlc_tensor *mlc_avg_pool2d(mlc_tensor *x, int kernel, int stride, int padding) {
    mlc_pool_opts opts;
    memset(&opts, 0, sizeof opts);
    opts.stride = stride; opts.padding = padding;
    return mlc_avg_pool2d_opts(x, kernel, opts);
}

MLCDEF mlc_tensor *mlc_global_avg_pool2d(mlc_tensor *x) {
    int shape[3];
    mlc_tensor *const in[1] = { x };
    mlc_ctx *ctx = mlc__enter_as("mlc_global_avg_pool2d", 1, in, 1);
    if (!ctx) return NULL;
    if (x->ndim != 4)
        return (mlc_tensor *)mlc__fail(ctx, MLC_ERR_SHAPE, "mlc_global_avg_pool2d: x %T must be [N, C, H, W]",
                                       x);
    if (x->dtype == MLC_I8) {                            /* one window the size of the plane */
        mlc_pool_opts plane;
        memset(&plane, 0, sizeof plane);
        plane.kernel_w = x->shape[3];
        return mlc_reshape(mlc_avg_pool2d_opts(x, x->shape[2], plane), 2, x->shape);
    }
    shape[0] = x->shape[0]; shape[1] = x->shape[1]; shape[2] = x->shape[2] * x->shape[3];
    return mlc_mean(mlc_reshape(x, 3, shape), 2, 0);
}

/* ============================================================================================
   @section attention  Attention, per head (b, h): q [T, D], k [S, D], v [S, Dv]; M the additive mask, causal
   positions j > i at -∞, m the dropout keep-scale (0 or 1 / (1 - p)), scale s
     s_ij = s q_i·k_j + M_ij,  ℓ_i = log Σ_j e^(s_ij),  P_ij = e^(s_ij - ℓ_i),  y_i = Σ_j m_ij P_ij v_j
     dP_ij = m_ij g_i·v_j,  Δ_i = Σ_j P_ij dP_ij,  dS_ij = P_ij (dP_ij - Δ_i)
     dq_i = s Σ_j dS_ij k_j,  dk_j = s Σ_i dS_ij q_i,  dv_j = Σ_i m_ij P_ij g_i
   Forward saves only ℓ ([B, H, T]); backward recomputes P. Each thread takes whole heads and
   holds one head's [T, S] scores (backward: two such blocks); the products are mlc's GEMM.
   Dropout draws m from a hash of (seed, position), the same on every backend, so backward and
   the device see the mask the forward used without storing it.
   ============================================================================================ */

typedef struct mlc__attention_job {
    mlc_ctx *ctx;
    const mlc__attention_args *a;
    const float *q, *k, *v, *mask, *lse, *g;   /* g: the output's gradient (backward) */
    float *y, *save_lse, *gq, *gk, *gv;
    float *scratch;                     /* per thread: blocks of [T, S], then the GEMM's packing space */
    size_t block_floats, work_floats, slot_floats;
} mlc__attention_job;

/* Head bh's scores into s [T, S]: s q kᵀ + mask, -∞ where causal hides the key. */
static void mlc__attention_scores(const mlc__attention_job *job, size_t bh, float *s, float *work) {
    const mlc__attention_args *a = job->a;
    const int T = a->T, S = a->S, D = a->D, *ms = a->mask_stride;
    const size_t b = bh / (size_t)a->H, h = bh % (size_t)a->H;
    const float *mask = job->mask ? job->mask + b * (size_t)ms[0] + h * (size_t)ms[1] : NULL;
    int i, j;
    mlc__gemm(job->ctx, 0, 1, T, S, D, job->q + bh * T * D, job->k + bh * S * D, 0.0f, s, work);
    for (i = 0; i < T; i++)
        for (j = 0; j < S; j++) {
            float *at = s + (size_t)i * S + j, add = mask ? mask[i * (size_t)ms[2] + j * (size_t)ms[3]] : 0;
            *at = a->causal && j > i ? -INFINITY : *at * a->scale + add;
        }
}

static void mlc__attention_heads(void *arg, int slot, size_t begin, size_t end) {
    const mlc__attention_job *job = (const mlc__attention_job *)arg;
    const int T = job->a->T, S = job->a->S, Dv = job->a->Dv;
    float *s = job->scratch + (size_t)slot * job->slot_floats;
    float *work = job->work_floats ? s + job->block_floats : NULL;
    size_t bh;
    int i, j;
    for (bh = begin; bh < end; bh++) {
        mlc__attention_scores(job, bh, s, work);
        for (i = 0; i < T; i++) {       /* row i becomes P_i = e^(s - m) / Σ e^(s - m), m its max */
            const uint32_t first = (uint32_t)((bh * (size_t)T + (size_t)i) * (size_t)S);
            const float p = job->a->dropout;
            float *row = s + (size_t)i * S, m = -INFINITY, inverse_sum;
            mlc__sum_t sum;
            for (j = 0; j < S; j++) if (row[j] > m) m = row[j];
            sum = mlc__exp_shifted(S, 1, row, m);
            job->save_lse[bh * T + (size_t)i] = m + (float)MLC__SUM_LOG(sum);   /* ℓ_i: P = e^(s - ℓ) */
            inverse_sum = (float)(1 / sum);
            for (j = 0; j < S; j++) row[j] *= inverse_sum;
            if (p > 0.0f)                                /* times the dropout mask */
                for (j = 0; j < S; j++) row[j] *= mlc__dropout_scale(job->a->seed, first + (uint32_t)j, p);
        }
        mlc__gemm(job->ctx, 0, 0, T, Dv, S, s, job->v + bh * S * Dv, 0.0f, job->y + bh * T * Dv, work);
    }
}

static void mlc__attention_backward_heads(void *arg, int slot, size_t begin, size_t end) {
    const mlc__attention_job *job = (const mlc__attention_job *)arg;
    const mlc__attention_args *a = job->a;
    const int T = a->T, S = a->S, D = a->D, Dv = a->Dv;
    float *P = job->scratch + (size_t)slot * job->slot_floats, *dS = P + job->block_floats;
    float *work = job->work_floats ? dS + job->block_floats : NULL;
    size_t bh;
    int i, j;
    for (bh = begin; bh < end; bh++) {
        const float *g = job->g + bh * T * Dv, *q = job->q + bh * T * D, *k = job->k + bh * S * D;
        mlc__attention_scores(job, bh, P, work);
        mlc__gemm(job->ctx, 0, 1, T, S, Dv, g, job->v + bh * S * Dv, 0.0f, dS, work);   /* g vᵀ */
        for (i = 0; i < T; i++) {
            float *prow = P + (size_t)i * S, *drow = dS + (size_t)i * S;
            const uint32_t first = (uint32_t)((bh * (size_t)T + (size_t)i) * (size_t)S);
            const float p = a->dropout;
            mlc__sum_t delta = 0;
            (void)mlc__exp_shifted(S, 1, prow, job->lse[bh * T + (size_t)i]);   /* P = e^(s - ℓ) */
            for (j = 0; j < S; j++) {
                if (p > 0.0f) drow[j] *= mlc__dropout_scale(a->seed, first + (uint32_t)j, p);
                delta += (mlc__sum_t)prow[j] * (mlc__sum_t)drow[j];
            }
            for (j = 0; j < S; j++) {                    /* dS (times s), and P becomes m P for dv */
                drow[j] = prow[j] * (drow[j] - (float)delta) * a->scale;
                if (p > 0.0f) prow[j] *= mlc__dropout_scale(a->seed, first + (uint32_t)j, p);
            }
        }
        if (job->gv) mlc__gemm(job->ctx, 1, 0, S, Dv, T, P, g, 1.0f, job->gv + bh * S * Dv, work);
        if (job->gq) mlc__gemm(job->ctx, 0, 0, T, D, S, dS, k, 1.0f, job->gq + bh * T * D, work);
        if (job->gk) mlc__gemm(job->ctx, 1, 0, S, D, T, dS, q, 1.0f, job->gk + bh * S * D, work);
    }
}

/* Plan the job over the heads of node n: threads take whole heads (their products on their
   thread) unless products go through a hook or BLAS; each thread has `blocks` [T, S] blocks. */
static int mlc__attention_plan(mlc__attention_job *job, size_t *parallel_from, const mlc__node *n, int blocks,
                               const char *op) {
    const mlc__attention_args *a = &n->args.attention;
    mlc_ctx *ctx = n->out->ctx;
    size_t products[6], most = 0;
    int i, slots;
    memset(job, 0, sizeof *job);
    job->ctx = ctx; job->a = a;
    job->q = n->in[0]->data; job->k = n->in[1]->data; job->v = n->in[2]->data;
    job->mask = n->in[3] ? n->in[3]->data : NULL;
    *parallel_from = mlc__gemm_threadable(ctx) ? 2 : (size_t)-1;
    slots = mlc__slots(ctx, (size_t)a->B * (size_t)a->H, *parallel_from);
    products[0] = mlc__gemm_work(a->T, a->S, a->D); products[1] = mlc__gemm_work(a->T, a->Dv, a->S);
    products[2] = mlc__gemm_work(a->T, a->S, a->Dv); products[3] = mlc__gemm_work(a->S, a->Dv, a->T);
    products[4] = mlc__gemm_work(a->T, a->D, a->S); products[5] = mlc__gemm_work(a->S, a->D, a->T);
    for (i = 0; i < 6; i++) if (products[i] > most) most = products[i];
    job->block_floats = ((size_t)a->T * (size_t)a->S + 15) / 16 * 16;
    job->work_floats = slots > 1 ? most : 0;
    job->slot_floats = (size_t)blocks * job->block_floats + job->work_floats;
    job->scratch = mlc__floats(ctx, (size_t)slots * job->slot_floats, op);
    return job->scratch != NULL;
}

static void mlc__attention_backward(mlc__node *n) {
    mlc__attention_job job;
    size_t parallel_from, heads = (size_t)n->args.attention.B * (size_t)n->args.attention.H;
    if (!mlc__attention_plan(&job, &parallel_from, n, 2, "mlc_attention backward")) return;
    job.lse = (const float *)n->saved; job.g = n->out->grad;
    job.gq = mlc__grad(n->in[0]); job.gk = mlc__grad(n->in[1]); job.gv = mlc__grad(n->in[2]);
    mlc__parallel(job.ctx, heads, parallel_from, mlc__attention_backward_heads, &job);
}

/* The mask's strides along b, h, i, j of the scores [B, H, T, S] (0 where it broadcasts); 0
   when it does not broadcast. */
static int mlc__attention_mask(mlc__attention_args *a, const mlc_tensor *mask) {
    size_t stride = 1;
    int want[4], d;
    want[0] = a->B; want[1] = a->H; want[2] = a->T; want[3] = a->S;
    for (d = 0; d < mask->ndim; d++) {
        int m = mask->shape[mask->ndim - 1 - d], axis = 3 - d;
        if (m != 1 && m != want[axis]) return 0;
        a->mask_stride[axis] = m == 1 ? 0 : (int)stride;
        stride *= (size_t)m;
    }
    return 1;
}

/* (each head's log-sum-exp ℓ is kept for backward) */
static int mlc__attention_cpu(mlc__node *n) {
    const mlc__attention_args *a = &n->args.attention;
    mlc__attention_job job;
    size_t parallel_from, heads = (size_t)a->B * (size_t)a->H;
    if (!mlc__attention_plan(&job, &parallel_from, n, 1, n->name)) return 0;
    job.y = n->out->data;
    job.save_lse = mlc__floats(n->out->ctx, heads * (size_t)a->T + 1, n->name);
    if (!job.save_lse) return 0;
    mlc__parallel(n->out->ctx, heads, parallel_from, mlc__attention_heads, &job);
    n->saved = job.save_lse;
    return 1;
}

MLCDEF mlc_tensor *mlc_attention(mlc_tensor *q, mlc_tensor *k, mlc_tensor *v, mlc_attention_opts opts) {
    mlc_tensor *out, *mask = opts.mask;
    mlc__node call;
    mlc__attention_args *a = &call.args.attention;
    int shape[MLC_MAX_DIMS], lead, d;
    q = mlc__autocast_low(q); k = mlc__autocast_low(k); v = mlc__autocast_low(v);
    mask = mlc__autocast_low(mask);
    MLC__ENTER("mlc_attention", q, k, v);
    if (!mlc__same_device(ctx, "mlc_attention", q, mask)) return NULL;
    lead = q->ndim - 2;
    if (q->ndim < 2 || q->ndim > 4 || k->ndim != q->ndim || v->ndim != q->ndim)
        return (mlc_tensor *)mlc__fail(ctx, MLC_ERR_SHAPE, "mlc_attention: q %T, k %T and v %T must all be "
                                       "[T, D], [N, T, D] or [B, H, T, D] (k and v with S rows)", q, k, v);
    for (d = 0; d < lead; d++)
        if (k->shape[d] != q->shape[d] || v->shape[d] != q->shape[d]) break;
    if (d < lead || k->shape[lead + 1] != q->shape[lead + 1] || v->shape[lead] != k->shape[lead])
        return (mlc_tensor *)mlc__fail(ctx, MLC_ERR_SHAPE, "mlc_attention: q %T, k %T and v %T do not fit "
                                       "q [..., T, D], k [..., S, D], v [..., S, Dv]", q, k, v);
    if (mask && (mask->requires_grad || mask->ndim > q->ndim))
        return (mlc_tensor *)mlc__fail(ctx, mask->requires_grad ? MLC_ERR_ARG : MLC_ERR_SHAPE,
                                       "mlc_attention: mask %T %s", mask, mask->requires_grad
                                       ? "requires a gradient (a mask takes none)" : "has more axes than q");
    if (!mlc__in_range(ctx, "mlc_attention", "dropout", opts.dropout, 0.0f, 1.0f, 0)) return NULL;
    memcpy(shape, q->shape, sizeof shape);
    shape[lead + 1] = v->shape[lead + 1];
    out = mlc__make(ctx, "mlc_attention", q->ndim, shape, 0);
    if (!out) return NULL;
    mlc__call(&call, MLC__OP_ATTENTION, "mlc_attention", out, q, k, v, mask);
    a->B = lead == 2 ? q->shape[0] : 1; a->H = lead >= 1 ? q->shape[lead - 1] : 1;
    a->T = q->shape[lead]; a->S = k->shape[lead]; a->D = q->shape[lead + 1]; a->Dv = v->shape[lead + 1];
    a->causal = opts.causal != 0;
    if (mask && !mlc__attention_mask(a, mask))
        return (mlc_tensor *)mlc__fail(ctx, MLC_ERR_SHAPE, "mlc_attention: mask %T does not broadcast to the "
                                       "scores [..., %d, %d] of q %T", mask, a->T, a->S, q);
    a->scale = mlc__setting(opts.scale, 1.0f / MLC_SQRTF((float)(a->D ? a->D : 1)));
    a->dropout = opts.dropout;
    if (opts.dropout > 0.0f) a->seed = mlc_rand_u32(ctx);
    if (!mlc__run(ctx, &call)) return NULL;
    mlc__record(&call);
    return out;
}

/* ============================================================================================
   @section int8  int8: quantized tensors, and the dynamic quantized linear
   A quantized tensor (MLC_I8) holds int8 values q for the real values s (q - z): per tensor
   (activations: qscale s, qzero z) or per row of axis 0 with z = 0 (weights: qscales,
   symmetric, q in [-127, 127], so the integer products of mlc_gemm_i8 stay exact on every
   kernel). A value is divided by its scale as v · (1 / s) and rounded to nearest, ties to even.
     quantize     q = clamp(round(x / s) + z, -128, 127)                      (no gradient)
     weight       s_r = max|w_r| / 127 (1 for a row of zeros), q = clamp(round(w / s_r), ±127)
     dequantize   x = s (q - z)
     linear       y[m, n] = s_m s_n Σ_k (q[m, k] - z_m) W[n, k] + b[n]: each row of x quantized as
                  the op runs (dynamic quantization) over its range [lo, hi] (0 included),
                  s_m = (hi - lo) / 255, z_m = -128 - round(lo / s_m); int32 sums
                  dx = Σ_n g[m, n] s_n W[n, k] (the rounding counted as identity), db = Σ_m g
   ============================================================================================ */

/* v / scale (as v · inverse_scale) rounded to nearest even, plus zero_point, clamped into
   [lowest, 127]; NaN gives the zero point. Integer steps only after the product, so every
   platform rounds alike. */
/* r (|r| <= 2^30) rounded to the nearest integer, ties to even, in integer steps */
static int32_t mlc__round_even(float r) {
    int32_t q = (int32_t)r;                              /* toward zero, then down to the floor */
    if ((float)q > r) q--;
    r -= (float)q;                                       /* the fraction, exact */
    return r > 0.5f || (r == 0.5f && (q & 1)) ? q + 1 : q;
}
static int8_t mlc__quantize_value(float v, float inverse_scale, int zero_point, int lowest) {
    float r = v * inverse_scale;
    int32_t q;
    if (!(r > -512.0f)) r = r != r ? 0.0f : -512.0f;    /* (clamped before the conversion to int) */
    if (r > 512.0f) r = 512.0f;
    q = mlc__round_even(r) + zero_point;
    return (int8_t)(q < lowest ? lowest : q > 127 ? 127 : q);
}

/* Rows of v ([rows, per_row], weights) each quantized symmetrically into q with its scale in
   scales; a NaN or an infinity is an error naming op and t. 0 on error. */
static int mlc__quantize_rows(mlc_ctx *ctx, const char *op, const mlc_tensor *t, const float *v, size_t rows,
                              size_t per_row, int8_t *q, float *scales) {
    size_t r, i;
    for (r = 0; r < rows; r++, v += per_row, q += per_row) {
        float top = 0.0f, inverse;
        int finite = 1;
        for (i = 0; i < per_row; i++) {
            const float a = v[i] < 0.0f ? -v[i] : v[i];
            top = a > top ? a : top;
            finite &= mlc__is_finite(v[i]);
        }
        if (!finite)
            return mlc__fail(ctx, MLC_ERR_ARG, "%s: row %zu of %T holds a NaN or an infinity", op, r, t)
                   != NULL;
        scales[r] = top > 0.0f ? top / 127.0f : 1.0f;
        inverse = 1.0f / scales[r];
        for (i = 0; i < per_row; i++) q[i] = mlc__quantize_value(v[i], inverse, 0, -127);
    }
    return 1;
}

#if MLC__X86 && defined(__x86_64__)
/* mlc__quantize_rows_affine's two passes over a row, 8 values a step (the rest left to the
   caller): its range and whether all are finite; and the values quantized as
   mlc__quantize_value does it with lowest -128 (a product, a NaN made 0, the clamp,
   vcvtps2dq's rounding to nearest even, the zero point, a saturating pack): the same bits.
   Return how many values they took. */
__attribute__((target("avx2")))
static size_t mlc__row_range_avx2(const float *v, size_t K, float *lo, float *hi, int *finite) {
    const __m256 exponent = _mm256_castsi256_ps(_mm256_set1_epi32(0x7f800000));
    __m256 low = _mm256_setzero_ps(), high = _mm256_setzero_ps(), special = _mm256_setzero_ps();
    float l[8], h[8], e[8];
    size_t i;
    int j;
    for (i = 0; i + 8 <= K; i += 8) {
        const __m256 x = _mm256_loadu_ps(v + i);
        low = _mm256_min_ps(low, x);
        high = _mm256_max_ps(high, x);
        special = _mm256_or_ps(special, _mm256_cmp_ps(_mm256_and_ps(x, exponent), exponent, _CMP_EQ_OQ));
    }
    _mm256_storeu_ps(l, low);
    _mm256_storeu_ps(h, high);
    _mm256_storeu_ps(e, special);
    for (j = 0; j < 8; j++) {
        *lo = l[j] < *lo ? l[j] : *lo;
        *hi = h[j] > *hi ? h[j] : *hi;
        *finite &= mlc__bits(e[j]) == 0;
    }
    return i;
}
__attribute__((target("avx2")))
static size_t mlc__quantize_row_avx2(const float *v, size_t K, float inverse, int32_t zero, int8_t *q) {
    const __m256 scale = _mm256_set1_ps(inverse), top = _mm256_set1_ps(512.0f),
                 bottom = _mm256_set1_ps(-512.0f);
    const __m256i zeros = _mm256_set1_epi32(zero);
    size_t i;
    for (i = 0; i + 8 <= K; i += 8) {
        const __m256 product = _mm256_mul_ps(_mm256_loadu_ps(v + i), scale),
                     r = _mm256_max_ps(_mm256_min_ps(_mm256_and_ps(product, _mm256_cmp_ps(product, product,
                                                                                           _CMP_ORD_Q)),
                                                     top),
                                       bottom);
        const __m256i n = _mm256_add_epi32(_mm256_cvtps_epi32(r), zeros);
        const __m128i n16 = _mm_packs_epi32(_mm256_castsi256_si128(n), _mm256_extracti128_si256(n, 1));
        _mm_storel_epi64((__m128i *)(void *)(q + i), _mm_packs_epi16(n16, n16));
    }
    return i;
}
#endif

/* Rows of v ([rows, K], activations) each quantized over its range [lo, hi] (0 included):
   scale (hi - lo) / 255, zero point -128 - round(lo / scale), into q, scales and zeros. A row
   with a NaN or an infinity gets scale NaN (its products come out NaN) and values 0. */
static void mlc__quantize_rows_affine(const float *v, size_t rows, size_t K, int8_t *q, float *scales,
                                      int32_t *zeros) {
    size_t r, i;
#if MLC__X86 && defined(__x86_64__)
    const int avx2 = __builtin_cpu_supports("avx2");
#endif
    for (r = 0; r < rows; r++, v += K, q += K) {
        float lo = 0.0f, hi = 0.0f, inverse;
        int finite = 1;
        i = 0;
#if MLC__X86 && defined(__x86_64__)
        if (avx2) i = mlc__row_range_avx2(v, K, &lo, &hi, &finite);
#endif
        for (; i < K; i++) {
            lo = v[i] < lo ? v[i] : lo;
            hi = v[i] > hi ? v[i] : hi;
            finite &= mlc__is_finite(v[i]);
        }
        if (!finite) {
            scales[r] = NAN;
            zeros[r] = 0;
            memset(q, 0, K);
            continue;
        }
        scales[r] = hi > lo ? (hi - lo) / 255.0f : 1.0f;
        inverse = 1.0f / scales[r];
        zeros[r] = -128 - mlc__round_even(lo * inverse);
        i = 0;
#if MLC__X86 && defined(__x86_64__)
        if (avx2) i = mlc__quantize_row_avx2(v, K, inverse, zeros[r], q);
#endif
        for (; i < K; i++) q[i] = mlc__quantize_value(v[i], inverse, zeros[r], -128);
    }
}

/* A new tensor of x's shape in dtype, on x's device (written on the host first), or NULL */
static mlc_tensor *mlc__like_in(mlc_ctx *ctx, const char *op, const mlc_tensor *x, mlc_scalar_type dtype) {
    ctx->op_device = x->on_device;
    ctx->op_dtype = dtype;
    return mlc__make(ctx, op, x->ndim, x->shape, 0);
}

MLCDEF mlc_tensor *mlc_quantize(mlc_tensor *x, float scale, int zero_point) {
    const float *v;
    mlc_tensor *q;
    size_t i;
    MLC__ENTER("mlc_quantize", x);
    if (!(scale > 0.0f) || !mlc__is_finite(scale) || !mlc__is_finite(1.0f / scale) || zero_point < -128
        || zero_point > 127)
        return (mlc_tensor *)mlc__fail(ctx, MLC_ERR_ARG, "mlc_quantize: scale %g must be positive, finite "
                                       "and invertible, and zero point %d in [-128, 127]", (double)scale,
                                       zero_point);
    if (!(v = mlc__host(x)) || !(q = mlc__like_in(ctx, "mlc_quantize", x, MLC_I8))) return NULL;
    if (x->on_device) mlc__fall_back(ctx, "mlc_quantize");   /* (on the CPU, as the int8 ops) */
    q->qscale = scale;
    q->qzero = zero_point;
    i = 0;
#if MLC__X86 && defined(__x86_64__)
    if (__builtin_cpu_supports("avx2"))
        i = mlc__quantize_row_avx2(v, x->size, 1.0f / scale, zero_point, q->int8);
#endif
    for (; i < x->size; i++) q->int8[i] = mlc__quantize_value(v[i], 1.0f / scale, zero_point, -128);
    return q;
}

MLCDEF mlc_tensor *mlc_quantize_weight(mlc_tensor *w) {
    const float *v;
    mlc_tensor *q, *scales;
    MLC__ENTER("mlc_quantize_weight", w);
    if (w->ndim < 1 || w->shape[0] == 0)
        return (mlc_tensor *)mlc__fail(ctx, MLC_ERR_SHAPE, "mlc_quantize_weight: %T has no rows (axis 0) to "
                                       "scale", w);
    if (!(v = mlc__host(w))) return NULL;
    if (w->on_device) mlc__fall_back(ctx, "mlc_quantize_weight");
    ctx->op_device = w->on_device;
    ctx->op_dtype = MLC_F32;
    if (!(scales = mlc__make(ctx, "mlc_quantize_weight", 1, w->shape, 0))
        || !(q = mlc__like_in(ctx, "mlc_quantize_weight", w, MLC_I8))
        || !mlc__quantize_rows(ctx, "mlc_quantize_weight", w, v, (size_t)w->shape[0], w->size / w->shape[0],
                               q->int8, scales->data))
        return NULL;
    q->qscales = scales;
    return q;
}

MLCDEF mlc_tensor *mlc_dequantize(mlc_tensor *q) {
    mlc_tensor *x, *const in[1] = { q };
    mlc_ctx *ctx = mlc__enter_as("mlc_dequantize", 1, in, 1);
    if (!ctx) return NULL;
    if (q->dtype != MLC_I8)
        return (mlc_tensor *)mlc__fail(ctx, MLC_ERR_ARG, "mlc_dequantize: tensor %T is %s, not int8", q,
                                       mlc_dtype_name(q->dtype));
    if (!(x = mlc__like_in(ctx, "mlc_dequantize", q, MLC_F32))) return NULL;
    if (q->on_device) mlc__fall_back(ctx, "mlc_dequantize");
    mlc__host_sync(q);
    mlc__values_out(q, x->data);
    return x;
}

/* The dynamic quantized linear (mlc_linear with an int8 weight): x [..., K] float, w [N, K] int8
   with a scale per row, bias [N] (optional) */
static mlc_tensor *mlc__linear_int8(const char *op, mlc_tensor *x, mlc_tensor *w, mlc_tensor *bias,
                                    int relu) {
    mlc_tensor *out, *const in[2] = { x, w };
    mlc_ctx *ctx = mlc__enter_as(op, 2, in, 1);
    mlc__node call;
    int shape[MLC_MAX_DIMS];
    if (!ctx || !mlc__not_int8(ctx, op, x) || !mlc__same_device(ctx, op, x, bias)
        || !mlc__not_int8(ctx, op, bias))
        return NULL;
    if (w->ndim != 2 || !w->qscales || x->ndim < 1 || x->shape[x->ndim - 1] != w->shape[1])
        return (mlc_tensor *)mlc__fail(ctx, MLC_ERR_SHAPE, "%s: input %T and int8 weight %T do not match: "
                                       "[..., in] and [out, in], scaled per row (mlc_quantize_weight)", op, x,
                                       w);
    if (bias && (bias->ndim != 1 || bias->shape[0] != w->shape[0]))
        return (mlc_tensor *)mlc__fail(ctx, MLC_ERR_SHAPE, "%s: bias %T does not match the %d outputs", op,
                                       bias, w->shape[0]);
    memcpy(shape, x->shape, (size_t)x->ndim * sizeof(int));
    shape[x->ndim - 1] = w->shape[0];
    ctx->op_dtype = MLC_F32;
    if (!(out = mlc__make(ctx, op, x->ndim, shape, 0))) return NULL;
    mlc__call(&call, MLC__OP_LINEAR_INT8, op, out, x, w, bias, w->qscales);
    call.args.linear_int8.relu = relu;
    if (!mlc__run(ctx, &call)) return NULL;
    mlc__record(&call);
    return out;
}

/* Σ_k W[r, k] for each row r of int8 weight w [rows, K], what a zero point's share takes off:
   into sums; and kept with a long-lived weight scaled per row, made with it (so inference
   allocates nothing) and summed again whenever its values are written (mlc__host_wrote). */
static void mlc__int8_sum_rows(const mlc_tensor *w, int32_t *sums) {
    const size_t rows = (size_t)w->shape[0], K = rows ? w->size / rows : 0;
    size_t r, k;
    for (r = 0; r < rows; r++) {
        const int8_t *row = w->int8 + r * K;
        int32_t sum = 0;
        for (k = 0; k < K; k++) sum += row[k];
        sums[r] = sum;
    }
}
static int mlc__int8_keep_sums(mlc_tensor *w) {
    if (!(w->qsums
          = (int32_t *)mlc__owned_alloc(w->ctx, (size_t)w->shape[0] * sizeof(int32_t) + 1, "mlc_int8")))
        return 0;
    mlc__int8_sum_rows(w, w->qsums);
    return 1;
}
/* w's row sums: kept, or made in the current frame (NULL when out of memory) */
static const int32_t *mlc__int8_row_sums(const mlc_tensor *w) {
    int32_t *sums;
    if (w->qsums) return w->qsums;
    sums = (int32_t *)mlc__arena_alloc(w->ctx, (size_t)w->shape[0] * sizeof(int32_t) + 1, "mlc_int8");
    if (sums) mlc__int8_sum_rows(w, sums);
    return sums;
}

static int mlc__linear_int8_cpu(mlc__node *n) {
    const mlc_tensor *x = n->in[0], *w = n->in[1], *bias = n->in[2];
    const int N = w->shape[0], K = w->shape[1], M = (int)mlc__numel(x->ndim - 1, x->shape);
    const float *w_scales = n->in[3]->data, *b = bias ? bias->data : NULL;
    mlc_ctx *ctx = n->out->ctx;
    mlc_frame scratch = mlc_frame_begin(ctx);
    int8_t *xq = (int8_t *)mlc__arena_alloc(ctx, (size_t)M * K + 1, n->name);
    float *x_scales = mlc__floats(ctx, (size_t)M + 1, n->name), *y = n->out->data;
    int32_t *sums = (int32_t *)mlc__arena_alloc(ctx, (size_t)M * N * sizeof(int32_t) + 1, n->name);
    int32_t *x_zeros = (int32_t *)mlc__arena_alloc(ctx, (size_t)M * sizeof(int32_t) + 1, n->name);
    const int32_t *w_sums = mlc__int8_row_sums(n->in[1]);
    int m, j;
    if (xq && x_scales && sums && x_zeros && w_sums) {
        mlc__quantize_rows_affine(x->data, (size_t)M, (size_t)K, xq, x_scales, x_zeros);
        mlc_gemm_i8(ctx, M, N, K, xq, w->int8, sums);
        for (m = 0; m < M; m++, y += N)
            for (j = 0; j < N; j++) {
                const int64_t dot = sums[(size_t)m * N + j] - (int64_t)x_zeros[m] * w_sums[j];
                float v = (float)dot * (x_scales[m] * w_scales[j]) + (b ? b[j] : 0.0f);
                y[j] = n->args.linear_int8.relu && !(v > 0.0f) && v == v ? 0.0f : v;
            }
    }
    mlc_frame_end(scratch);
    return !ctx->error;
}

static void mlc__linear_int8_backward(mlc__node *n) {
    const mlc_tensor *w = n->in[1];
    const int N = w->shape[0], K = w->shape[1], M = (int)mlc__numel(n->out->ndim - 1, n->out->shape);
    const float *w_scales = n->in[3]->data, *g = n->out->grad, *y = n->out->data;
    mlc_ctx *ctx = n->out->ctx;
    float beta, *dx = mlc__grad_to_overwrite(n->in[0], &beta), *db = mlc__grad(n->in[2]), *gm, *wd;
    mlc_frame scratch = mlc_frame_begin(ctx);
    size_t i;
    int m, j;
    if (n->args.linear_int8.relu) {                      /* g where y > 0 */
        if (!(gm = mlc__floats(ctx, n->out->size + 1, n->name))) goto done;
        for (i = 0; i < n->out->size; i++) gm[i] = y[i] > 0.0f ? g[i] : 0.0f;
        g = gm;
    }
    if (db)
        for (m = 0; m < M; m++) for (j = 0; j < N; j++) db[j] += g[(size_t)m * N + j];
    if (dx) {
        if (!(wd = mlc__floats(ctx, (size_t)N * K + 1, n->name))) goto done;
        for (i = 0; i < (size_t)N * K; i++) wd[i] = w_scales[i / (size_t)K] * (float)w->int8[i];
        mlc_gemm(ctx, 0, 0, M, K, N, g, wd, beta, dx);
    }
done:
    mlc_frame_end(scratch);
}

/* ---- Static quantization: int8 in, int8 out -------------------------------------------------
   Activations carry a scale and a zero point per tensor. A product's integer sums
     acc[o] = Σ_k (x_k - z_x) W[o, k] + round(b[o] / (s_x s_w[o]))
   become its output through the real multiplier M[o] = s_x s_w[o] / s_y, held in integers:
     M = M0 · 2^-t, M0 the float's 24-bit mantissa shifted into [2^30, 2^31),
     y = clamp(z_y + ⌊(acc · M0 + 2^(t-1)) / 2^t⌋, -128, 127)          (one rounding, ties up)
   Only the scales' product and quotient are float operations (IEEE single, the same
   everywhere); the rest is integer, so the host and a Cortex-M get the same bits (the TFLite /
   CMSIS-NN scheme). A fused ReLU or ReLU6 is the output's range: calibrated after the
   activation, [0, max] gives z_y = -128 and the clamp does the rest. Pooling keeps the scale and
   zero point (max of integers; averages rounded half away from zero). These functions keep no
   tape (no gradient) and run on the CPU: on a device each counts a fallback.
   --------------------------------------------------------------------------------------------- */

typedef struct mlc__requant { int64_t m0; int shift; } mlc__requant;

/* M as M0 · 2^-shift; 0 when M is not a normal positive float with the shift in [1, 62] */
static int mlc__requant_of(float M, mlc__requant *r) {
    const uint32_t bits = mlc__bits(M);
    const int exponent = (int)((bits >> 23) & 255u) - 127;          /* M = 1.f · 2^exponent */
    if (!(M > 0.0f) || !mlc__is_finite(M) || !(bits & 0x7f800000u)) return 0;
    r->m0 = (int64_t)((bits & 0x7fffffu) | 0x800000u) << 7;
    r->shift = 30 - exponent;
    return r->shift >= 1 && r->shift <= 62;
}

/* z + acc · M rounded (ties up), clamped to int8; |acc| < 2^32 (the shift of a negative value is
   arithmetic on every compiler mlc supports) */
static int8_t mlc__requantize(int64_t acc, const mlc__requant *r, int zero_point) {
    const int64_t q = ((acc * r->m0 + ((int64_t)1 << (r->shift - 1))) >> r->shift) + zero_point;
    return (int8_t)(q < -128 ? -128 : q > 127 ? 127 : q);
}

#if MLC__I8_X86
/* mlc__requantize over rows of n sums + offset, 8 at a time, for a multiplier below 1 (shift
   >= 31) and |sums + offset| < 2^31, so that every result fits an int32 lane: the products
   acc · M0 (|.| < 2^62) in 64-bit lanes, even and odd apart, with 2^62 added so that a logical
   shift (AVX2 has no arithmetic one on 64 bits) divides them; the 2^(62 - shift) that leaves
   is taken off with the zero point added in 32 bits; the packs then clamp to int8. A row of
   8 or more ends with the 8 that end it (overlapping the step before: the same bits written
   again); a shorter one goes through mlc__requantize. */
__attribute__((target("avx2")))
static void mlc__requantize_avx2(int8_t *out, size_t out_stride, const int32_t *sums, size_t sums_stride,
                                 int rows, int n, int32_t offset, const mlc__requant *r, int zero_point) {
    const __m256i m0 = _mm256_set1_epi64x(r->m0), add = _mm256_set1_epi32(offset),
                  half = _mm256_set1_epi64x((int64_t)(((uint64_t)1 << 62) + ((uint64_t)1 << (r->shift - 1)))),
                  base
                  = _mm256_set1_epi32((int32_t)((uint32_t)zero_point - ((uint32_t)1 << (62 - r->shift)))),
                  order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
    const __m128i shift = _mm_cvtsi32_si128(r->shift);
    int row, p, step;
    for (row = 0; row < rows; row++, out += out_stride, sums += sums_stride) {
        for (p = 0; p < n - 7; p += step) {
            const __m256i acc = _mm256_add_epi32(MLC__I8_LOAD256(sums + p), add);
            const __m256i even
                = _mm256_srl_epi64(_mm256_add_epi64(_mm256_mul_epi32(acc, m0), half), shift),
                odd = _mm256_srl_epi64(
                    _mm256_add_epi64(_mm256_mul_epi32(_mm256_srli_epi64(acc, 32), m0), half), shift);
            const __m256i q
                = _mm256_add_epi32(_mm256_blend_epi32(even, _mm256_slli_epi64(odd, 32), 0xaa), base);
            const __m256i words = _mm256_packs_epi32(q, q), bytes = _mm256_packs_epi16(words, words);
            _mm_storel_epi64((__m128i *)(void *)(out + p),
                             _mm256_castsi256_si128(_mm256_permutevar8x32_epi32(bytes, order)));
            step = n - p >= 16 || n - p == 8 ? 8 : n - p - 8;
        }
        for (; p < n; p++) out[p] = mlc__requantize((int64_t)sums[p] + offset, r, zero_point);
    }
}

/* The same with AVX-512, 16 at a time (the last step of a row masked): an arithmetic shift of
   the 64-bit products, and a saturating conversion to int8 for the clamp. (The masked forms of
   the intrinsics: GCC 12 warns, as C++, of the unmasked ones' undefined sources.) */
__attribute__((target(MLC__I8_AVX512_TARGET)))
static void mlc__requantize_avx512(int8_t *out, size_t out_stride, const int32_t *sums, size_t sums_stride,
                                   int rows, int n, int32_t offset, const mlc__requant *r, int zero_point) {
    const __m512i m0 = _mm512_set1_epi64(r->m0), add = _mm512_set1_epi32(offset),
                  half = _mm512_set1_epi64((int64_t)1 << (r->shift - 1)),
                  zero = _mm512_set1_epi32(zero_point);
    const __m128i shift = _mm_cvtsi32_si128(r->shift);
    const __mmask8 all = 0xff;
    int row, p;
    for (row = 0; row < rows; row++, out += out_stride, sums += sums_stride)
        for (p = 0; p < n; p += 16) {
            const __mmask16 live = n - p >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << (n - p)) - 1);
            const __m512i acc = _mm512_add_epi32(_mm512_maskz_loadu_epi32(live, sums + p), add);
            const __m512i even
                = _mm512_maskz_sra_epi64(all, _mm512_add_epi64(_mm512_maskz_mul_epi32(all, acc, m0), half),
                                         shift),
                odd = _mm512_maskz_sra_epi64(
                    all,
                    _mm512_add_epi64(_mm512_maskz_mul_epi32(all, _mm512_maskz_srli_epi64(all, acc, 32), m0),
                                     half),
                    shift);
            const __m512i q = _mm512_add_epi32(
                _mm512_mask_blend_epi32(0xaaaa, even, _mm512_maskz_slli_epi64(all, odd, 32)), zero);
            _mm512_mask_cvtsepi32_storeu_epi8(out + p, live, q);
        }
}
#endif

/* One output channel: rows of n outputs out[p] = mlc__requantize(sums[p] + offset) (strides
   apart), the sums from a product over K bytes of k. Where the bounds above hold (a product
   over K <= 2^14 has |sums| <= 16256 K <= 2^28), vectors as the context's int8 kernel (its
   CPU's): AVX-512 beside AVX-512 VNNI, AVX2 beside AVX2 and AVX-VNNI; the same bits. */
static void mlc__requantize_rows(const mlc_ctx *ctx, int8_t *out, size_t out_stride, const int32_t *sums,
                                 size_t sums_stride, int rows, int n, int64_t offset, const mlc__requant *r,
                                 int zero_point, int K) {
    int row, p;
#if MLC__I8_X86
    if (K <= 16384 && r->shift >= 31 && offset <= ((int64_t)1 << 30) && offset >= -((int64_t)1 << 30)) {
        if (ctx->i8_kernel == MLC__I8_AVX512VNNI) {
            mlc__requantize_avx512(out, out_stride, sums, sums_stride, rows, n, (int32_t)offset, r,
                                   zero_point);
            return;
        }
        if (ctx->i8_kernel != MLC__I8_PORTABLE) {
            mlc__requantize_avx2(out, out_stride, sums, sums_stride, rows, n, (int32_t)offset, r, zero_point);
            return;
        }
    }
#endif
    (void)ctx; (void)K;
    for (row = 0; row < rows; row++, out += out_stride, sums += sums_stride)
        for (p = 0; p < n; p++) out[p] = mlc__requantize(sums[p] + offset, r, zero_point);
}

/* a / b rounded half away from zero (b > 0) */
static int64_t mlc__divide_rounded(int64_t a, int64_t b) {
    return a >= 0 ? (a + b / 2) / b : -((b / 2 - a) / b);
}

/* The input's on-device check: the int8 functions run on the host, a device counts a fallback */
static mlc_ctx *mlc__int8_enter(const char *op, int count, mlc_tensor *const *inputs) {
    mlc_ctx *ctx = mlc__enter_as(op, count, inputs, 1);
    int i;
    if (!ctx) return NULL;
    for (i = 0; i < count; i++)
        if (inputs[i]->dtype != MLC_I8)
            return (mlc_ctx *)mlc__fail(ctx, MLC_ERR_ARG, "%s: input %d %T is %s, not int8 (mlc_quantize)",
                                        op, i, inputs[i], mlc_dtype_name(inputs[i]->dtype));
    for (i = 0; i < count; i++) mlc__host_sync(inputs[i]);
    if (inputs[0]->on_device) mlc__fall_back(ctx, op);
    return ctx;
}

/* The output's scale and zero point, checked */
static int mlc__qout_ok(mlc_ctx *ctx, const char *op, float scale, int zero_point) {
    if (scale > 0.0f && mlc__is_finite(scale) && zero_point >= -128 && zero_point <= 127) return 1;
    return mlc__fail(ctx, MLC_ERR_ARG, "%s: output scale %g must be positive and finite, zero point %d in "
                     "[-128, 127]", op, (double)scale, zero_point) != NULL;
}

/* A product's per-output constants: offset[o] = round(b[o] / (s_x s_w[o])) - z_x Σ_k W[o, k] and
   the multipliers s_x s_w[o] / s_y. 0 (the error set) when a multiplier is out of range. */
static int mlc__qproduct_plan(mlc_ctx *ctx, const char *op, const mlc_tensor *x, mlc_tensor *w,
                              mlc_tensor *bias, float scale, int64_t *offset, mlc__requant *rq) {
    const int O = w->shape[0];
    const float *b = bias ? mlc__host(bias) : NULL, *ws = mlc__host(w->qscales);
    const int32_t *row_sums = mlc__int8_row_sums(w);
    int o;
    if ((bias && !b) || !ws || !row_sums) return 0;
    for (o = 0; o < O; o++) {
        const float s = x->qscale * ws[o];
        offset[o] = -(int64_t)x->qzero * row_sums[o];
        if (b) {
            const float inverse = 1.0f / s;              /* (each step stored: rounded to float where */
            float r = b[o] * inverse;                    /*  FLT_EVAL_METHOD is 1 or 2, as elsewhere) */
            r = r != r ? 0.0f : r > 1073741824.0f ? 1073741824.0f : r < -1073741824.0f ? -1073741824.0f : r;
            offset[o] += mlc__round_even(r);
        }
        if (!mlc__requant_of(s / scale, &rq[o]))
            return mlc__fail(ctx, MLC_ERR_ARG,
                             "%s: output %d's multiplier %g (input scale %g x weight scale %g / "
                             "output scale %g) is outside [2^-32, 2^30)",
                             op, o, (double)(s / scale), (double)x->qscale, (double)ws[o], (double)scale)
                   != NULL;
    }
    return 1;
}

/* An int8 result of the given shape on x's device (written on the host), with its scale */
static mlc_tensor *mlc__int8_result(mlc_ctx *ctx, const char *op, const mlc_tensor *x, int ndim,
                                    const int *shape, float scale, int zero_point) {
    mlc_tensor *y;
    ctx->op_device = x->on_device;
    ctx->op_dtype = MLC_I8;
    if (!(y = mlc__make(ctx, op, ndim, shape, 0))) return NULL;
    y->qscale = scale;
    y->qzero = zero_point;
    return y;
}

/* A weight for the static products: int8, scaled per row */
static int mlc__int8_weight_ok(mlc_ctx *ctx, const char *op, const mlc_tensor *w, const mlc_tensor *bias) {
    if (w->dtype == MLC_I8 && w->qscales && w->shape[0] > 0 && (!bias || bias->dtype != MLC_I8)) return 1;
    return mlc__fail(ctx, MLC_ERR_ARG,
                     "%s: weight %T must be int8 scaled per row (mlc_quantize_weight) and the "
                     "bias float",
                     op, w)
           != NULL;
}

#if MLC__I8_X86
/* ---- The int8 convolution without im2col: stride 1, groups 1, a VNNI kernel ----
   As mlc__conv_fast for float32: the image is copied once into planes Hp x Wp padded with its
   zero point (real 0), and the output computed at every column of the padded width, OH x Wp
   "extended" columns q = oh·Wp + ow of which the last Wp - OW of each row are thrown away. Row
   r = (c, i, j) of the patches at column q is then plane c at q + i·dh·Wp + j·dw: contiguous
   in q, so a B sliver's words (four rows' bytes of one column) are four runs of NR bytes
   interleaved. The weights are A (a + 128, packed once a call), the activations B: vpdpbusd
   multiplies signed bytes there exactly, -128 included (mlc_gemm_i8's AVX2 kernel, whose sign
   trick cannot, is not used), each column starting from -128 Σ_r B[r, q]. */
typedef struct mlc__i8_conv {
    const mlc__i8_arch *g;
    const int8_t *planes, *zeros;       /* the padded planes (plane bytes each), NR zero bytes */
    const uint32_t *wp;                 /* packed weights: per slice of k, per MR rows */
    const int *off;                     /* per row of the patches: its offset in the planes */
    int32_t *cs;                        /* C: [Mr, Pn] */
    uint32_t *slivers;                  /* per slot: one packed B sliver */
    int R, kc, Mr, Pn;                  /* patch rows, slice depth, A's rows and C's columns rounded */
} mlc__i8_conv;

/* Columns [begin, end) (in slivers of NR) of C = A B: each slice of k's B sliver packed from
   the planes, then the kernel against every MR rows of A */
__attribute__((target("avx2")))
static void mlc__i8_conv_part(void *arg, int slot, size_t begin, size_t end) {
    const mlc__i8_conv *f = (const mlc__i8_conv *)arg;
    const int nr = f->g->nr, kq_max = f->kc / 4;
    const __m128i ones = _mm_set1_epi8(1), pairs = _mm_set1_epi16(1);
    uint32_t *b = f->slivers + (size_t)slot * (size_t)nr * (size_t)(kq_max + 1);
    size_t s;
    int pc, p, x, t, m;
    for (s = begin; s < end; s++) {
        const int q = (int)s * nr;
        for (pc = 0; pc < f->R; pc += f->kc) {
            const int kk = f->R - pc < f->kc ? f->R - pc : f->kc, kq = (kk + 3) / 4;
            for (x = 0; x < nr; x += 16) {            /* 16 columns: 4 runs of 16 bytes interleaved */
                __m128i colsum[4];                      /* Σ_r B[r, q], 4 columns each */
                _Pragma("GCC unroll 4") for (t = 0; t < 4; t++) colsum[t] = _mm_setzero_si128();
                for (p = 0; p < kq; p++) {
                    const int row = pc + 4 * p;
                    const int8_t *r0 = f->planes + f->off[row] + q + x,
                                 *r1 = row + 1 < pc + kk ? f->planes + f->off[row + 1] + q + x : f->zeros,
                                 *r2 = row + 2 < pc + kk ? f->planes + f->off[row + 2] + q + x : f->zeros,
                                 *r3 = row + 3 < pc + kk ? f->planes + f->off[row + 3] + q + x : f->zeros;
                    const __m128i b0 = _mm_loadu_si128((const __m128i *)(const void *)r0),
                                  b1 = _mm_loadu_si128((const __m128i *)(const void *)r1),
                                  b2 = _mm_loadu_si128((const __m128i *)(const void *)r2),
                                  b3 = _mm_loadu_si128((const __m128i *)(const void *)r3);
                    const __m128i lo01 = _mm_unpacklo_epi8(b0, b1), hi01 = _mm_unpackhi_epi8(b0, b1),
                                  lo23 = _mm_unpacklo_epi8(b2, b3), hi23 = _mm_unpackhi_epi8(b2, b3);
                    const __m128i w[4] = { _mm_unpacklo_epi16(lo01, lo23), _mm_unpackhi_epi16(lo01, lo23),
                                           _mm_unpacklo_epi16(hi01, hi23), _mm_unpackhi_epi16(hi01, hi23) };
                    _Pragma("GCC unroll 4") for (t = 0; t < 4; t++) {
                        _mm_storeu_si128((__m128i *)(void *)(b + (size_t)p * nr + x + 4 * t), w[t]);
                        colsum[t]
                            = _mm_add_epi32(colsum[t], _mm_madd_epi16(_mm_maddubs_epi16(ones, w[t]), pairs));
                    }
                }
                _Pragma("GCC unroll 4") for (t = 0; t < 4; t++)   /* the start values: -128 Σ_r B[r, q] */
                    _mm_storeu_si128((__m128i *)(void *)(b + (size_t)kq * nr + x + 4 * t),
                                     _mm_sub_epi32(_mm_setzero_si128(), _mm_slli_epi32(colsum[t], 7)));
            }
            for (m = 0; m < f->Mr; m += f->g->mr)
                f->g->kernel(kq, f->wp + (size_t)pc / 4 * f->Mr + (size_t)m * kq, b,
                             f->cs + (size_t)m * f->Pn + q, f->Pn, pc > 0);
        }
    }
}

/* y (made, [N, O, OH, OW]) from x by the path above, with the products' constants; 0 when it
   does not fit (the im2col path runs) or is out of memory (the error set) */
static int mlc__conv2d_int8_direct(mlc_ctx *ctx, const char *op, const mlc__conv *cv, const mlc_tensor *x,
                                   const mlc_tensor *w, const int64_t *offset, const mlc__requant *rq,
                                   mlc_tensor *y) {
    const mlc__i8_arch *g;
    const int Hp = cv->H + 2 * cv->ph, Wp = cv->W + 2 * cv->pw, R = cv->C * cv->KH * cv->KW;
    mlc__i8_conv f;
    mlc_frame scratch;
    int8_t *planes;
    int32_t *cs;
    uint32_t *wp;
    int *off, kblocks, slots, r, pc, m, n, c, h, o;
    size_t plane, units, from;
    if ((ctx->i8_kernel != MLC__I8_AVXVNNI && ctx->i8_kernel != MLC__I8_AVX512VNNI) || ctx->config.arena
        || cv->groups != 1 || cv->sh != 1 || cv->sw != 1 || R > MLC__I8_K_MAX
        || (long long)Hp * (Wp + 64) > 2147483647LL / (cv->C + 1))
        return 0;
    f.g = g = &mlc__i8_archs[ctx->i8_kernel - 1];
    f.R = R;
    f.Pn = mlc__i8_round_up(cv->OH * Wp, g->nr); f.Mr = mlc__i8_round_up(cv->O, g->mr);
    kblocks = (R + g->kc - 1) / g->kc;
    f.kc = mlc__i8_round_up((R + kblocks - 1) / kblocks, 4);
    plane = ((size_t)Hp * Wp + (size_t)(f.Pn - cv->OH * Wp) + (size_t)cv->dw * (cv->KW - 1) + 15) / 16 * 16;
    units = (size_t)(f.Pn / g->nr);
    from = (long long)f.Mr * f.Pn < (MLC__I8_PARALLEL + R - 1) / R ? (size_t)-1 : 2;
    slots = mlc__slots(ctx, units, from);
    scratch = mlc_frame_begin(ctx);
    planes = (int8_t *)mlc__arena_alloc(ctx, (size_t)cv->C * plane + MLC__I8_NR_MAX, op);
    off = (int *)mlc__arena_alloc(ctx, (size_t)R * sizeof *off, op);
    wp = (uint32_t *)mlc__arena_alloc(ctx, (size_t)kblocks * (size_t)(f.kc / 4) * (size_t)f.Mr * sizeof *wp,
                                      op);
    cs = (int32_t *)mlc__arena_alloc(ctx, (size_t)f.Mr * (size_t)f.Pn * sizeof *cs, op);
    f.slivers = (uint32_t *)mlc__arena_alloc(
        ctx, (size_t)slots * (size_t)g->nr * (size_t)(f.kc / 4 + 1) * sizeof(uint32_t), op);
    if (planes && off && wp && cs && f.slivers) {
        memset(planes + (size_t)cv->C * plane, 0, MLC__I8_NR_MAX);
        f.planes = planes; f.zeros = planes + (size_t)cv->C * plane; f.off = off; f.wp = wp; f.cs = cs;
        for (r = 0; r < R; r++) {
            const int c_ = r / (cv->KH * cv->KW), i = r / cv->KW % cv->KH, j = r % cv->KW;
            off[r] = (int)((size_t)c_ * plane) + i * cv->dh * Wp + j * cv->dw;
        }
        for (pc = 0; pc < R; pc += f.kc) {                  /* the weights: a + 128, per slice, per MR */
            const int kk = R - pc < f.kc ? R - pc : f.kc, kq = (kk + 3) / 4;
            for (m = 0; m < f.Mr; m += g->mr)
                mlc__i8_pack(wp + (size_t)pc / 4 * f.Mr + (size_t)m * kq, w->int8 + (size_t)m * R + pc,
                             (size_t)R, cv->O - m < g->mr ? cv->O - m : g->mr, kk, g->mr, 0x80);
        }
        memset(planes, x->qzero, (size_t)cv->C * plane);
        for (n = 0; n < cv->N; n++) {
            for (c = 0; c < cv->C; c++)
                for (h = 0; h < cv->H; h++)
                    memcpy(planes + (size_t)c * plane + (size_t)(h + cv->ph) * Wp + cv->pw,
                           x->int8 + (((size_t)n * cv->C + c) * cv->H + h) * cv->W, (size_t)cv->W);
            mlc__parallel(ctx, units, from, mlc__i8_conv_part, &f);
            for (o = 0; o < cv->O; o++)
                mlc__requantize_rows(ctx, y->int8 + ((size_t)n * cv->O + o) * cv->OH * cv->OW, (size_t)cv->OW,
                                     cs + (size_t)o * f.Pn, (size_t)Wp, cv->OH, cv->OW, offset[o], &rq[o],
                                     y->qzero, R);
        }
    }
    mlc_frame_end(scratch);
    return 1;
}
#endif

MLCDEF mlc_tensor *mlc_conv2d_int8(mlc_tensor *x, mlc_tensor *weight, mlc_tensor *bias, mlc_conv_opts opts,
                                   float scale, int zero_point) {
    static const char *const op = "mlc_conv2d_int8";
    mlc_tensor *y, *const in[2] = { x, weight };
    mlc_ctx *ctx = mlc__int8_enter(op, 1, in);
    mlc__conv cv;
    mlc__requant *rq;
    int64_t *offset;
    int32_t *sums;
    int8_t *patches;
    int shape[4], n, g, Cg, Og, P, block, p0, p, o, c, i, j, weights_first;
    size_t Kg;
    mlc_frame scratch;
    if (!ctx || !MLC__ARGS_OK(ctx, op, weight, bias) || !mlc__same_device(ctx, op, x, weight)
        || !mlc__same_device(ctx, op, x, bias) || !mlc__int8_weight_ok(ctx, op, weight, bias)
        || !mlc__qout_ok(ctx, op, scale, zero_point) || !mlc__conv_setup(ctx, op, x, weight, bias, opts, &cv))
        return NULL;
    mlc__host_sync(weight);
    shape[0] = cv.N; shape[1] = cv.O; shape[2] = cv.OH; shape[3] = cv.OW;
    if (!(y = mlc__int8_result(ctx, op, x, 4, shape, scale, zero_point))) return NULL;
    Cg = cv.C / cv.groups; Og = cv.O / cv.groups; P = cv.OH * cv.OW;
    Kg = (size_t)Cg * cv.KH * cv.KW;
    block = Kg ? (int)(MLC_INT8_PATCH_BYTES / Kg) : P;   /* output positions a pass, in the scratch */
    block = block < 1 ? 1 : block > P ? P : block;
    scratch = mlc_frame_begin(ctx);
    rq = (mlc__requant *)mlc__arena_alloc(ctx, (size_t)cv.O * sizeof *rq + 1, op);
    offset = (int64_t *)mlc__arena_alloc(ctx, (size_t)cv.O * sizeof *offset + 1, op);
    if (!rq || !offset || !mlc__qproduct_plan(ctx, op, x, weight, bias, scale, offset, rq)
#if MLC__I8_X86
        || mlc__conv2d_int8_direct(ctx, op, &cv, x, weight, offset, rq, y)
#endif
    ) {
        mlc_frame_end(scratch);
        return ctx->error ? NULL : y;
    }
    /* mlc_gemm_i8's B takes the weights on its AVX2 kernel (no -128 there); elsewhere the
       activations, so that the sums come out a channel at a time, contiguous */
    weights_first = ctx->i8_kernel != MLC__I8_AVX2;
    patches = (int8_t *)mlc__arena_alloc(ctx, (size_t)block * Kg + 1, op);
    sums = (int32_t *)mlc__arena_alloc(ctx, (size_t)block * Og * sizeof *sums + 1, op);
    if (patches && sums)
        for (n = 0; n < cv.N; n++)
            for (g = 0; g < cv.groups; g++)
                for (p0 = 0; p0 < P; p0 += block) {
                    const int count = P - p0 < block ? P - p0 : block;
                    for (p = 0; p < count; p++) {         /* im2col: patch p, in the weight's order */
                        const int oh = (p0 + p) / cv.OW, ow = (p0 + p) % cv.OW;
                        const int ih0 = oh * cv.sh - cv.ph, iw0 = ow * cv.sw - cv.pw;
                        int8_t *patch = patches + (size_t)p * Kg;
                        if (ih0 >= 0 && iw0 >= 0 && ih0 + (cv.KH - 1) * cv.dh < cv.H
                            && iw0 + (cv.KW - 1) * cv.dw < cv.W) {   /* inside: no padding to check */
                            for (c = 0; c < Cg; c++) {
                                const int8_t *plane
                                    = x->int8 + ((size_t)n * cv.C + (size_t)g * Cg + c) * cv.H * cv.W + iw0;
                                for (i = 0; i < cv.KH; i++, patch += cv.KW) {
                                    const int8_t *in = plane + (size_t)(ih0 + i * cv.dh) * cv.W;
                                    for (j = 0; j < cv.KW; j++) patch[j] = in[j * cv.dw];
                                }
                            }
                            continue;
                        }
                        for (c = 0; c < Cg; c++) {
                            const int8_t *plane
                                = x->int8 + ((size_t)n * cv.C + (size_t)g * Cg + c) * cv.H * cv.W;
                            for (i = 0; i < cv.KH; i++)
                                for (j = 0; j < cv.KW; j++) {
                                    const int ih = oh * cv.sh - cv.ph + i * cv.dh,
                                              iw = ow * cv.sw - cv.pw + j * cv.dw;
                                    *patch++ = ih >= 0 && ih < cv.H && iw >= 0 && iw < cv.W
                                                   ? plane[(size_t)ih * cv.W + iw] : (int8_t)x->qzero;
                                }
                        }
                    }
                    if (weights_first) {                  /* sums [o, p]: a channel's row at a time */
                        mlc_gemm_i8(ctx, Og, count, (int)Kg, weight->int8 + (size_t)g * Og * Kg, patches,
                                    sums);
                        for (o = 0; o < Og; o++)
                            mlc__requantize_rows(ctx, y->int8 + ((size_t)n * cv.O + g * Og + o) * P + p0, 0,
                                                 sums + (size_t)o * count, 0, 1, count, offset[g * Og + o],
                                                 &rq[g * Og + o], zero_point, (int)Kg);
                        continue;
                    }
                    mlc_gemm_i8(ctx, count, Og, (int)Kg, patches, weight->int8 + (size_t)g * Og * Kg, sums);
                    for (o = 0; o < Og; o++) {
                        const int oc = g * Og + o;
                        int8_t *out = y->int8 + ((size_t)n * cv.O + oc) * P + p0;
                        for (p = 0; p < count; p++)
                            out[p]
                                = mlc__requantize(sums[(size_t)p * Og + o] + offset[oc], &rq[oc], zero_point);
                    }
                }
    mlc_frame_end(scratch);
    return ctx->error ? NULL : y;
}

MLCDEF mlc_tensor *mlc_linear_int8(mlc_tensor *x, mlc_tensor *weight, mlc_tensor *bias, float scale,
                                   int zero_point) {
    static const char *const op = "mlc_linear_int8";
    mlc_tensor *y, *const in[1] = { x };
    mlc_ctx *ctx = mlc__int8_enter(op, 1, in);
    mlc__requant *rq;
    int64_t *offset;
    int32_t *sums;
    int shape[MLC_MAX_DIMS], M, N, m, o;
    mlc_frame scratch;
    if (!ctx || !MLC__ARGS_OK(ctx, op, weight, bias) || !mlc__same_device(ctx, op, x, weight)
        || !mlc__same_device(ctx, op, x, bias) || !mlc__int8_weight_ok(ctx, op, weight, bias)
        || !mlc__qout_ok(ctx, op, scale, zero_point))
        return NULL;
    mlc__host_sync(weight);
    if (weight->ndim != 2 || x->ndim < 1 || x->shape[x->ndim - 1] != weight->shape[1]
        || (bias && (bias->ndim != 1 || bias->shape[0] != weight->shape[0])))
        return (mlc_tensor *)mlc__fail(ctx, MLC_ERR_SHAPE,
                                       "%s: x %T, weight %T and bias %T do not match: [..., in], "
                                       "[out, in], [out]",
                                       op, x, weight, bias);
    N = weight->shape[0];
    M = (int)mlc__numel(x->ndim - 1, x->shape);
    memcpy(shape, x->shape, (size_t)x->ndim * sizeof(int));
    shape[x->ndim - 1] = N;
    if (!(y = mlc__int8_result(ctx, op, x, x->ndim, shape, scale, zero_point))) return NULL;
    scratch = mlc_frame_begin(ctx);
    rq = (mlc__requant *)mlc__arena_alloc(ctx, (size_t)N * sizeof *rq + 1, op);
    offset = (int64_t *)mlc__arena_alloc(ctx, (size_t)N * sizeof *offset + 1, op);
    sums = (int32_t *)mlc__arena_alloc(ctx, (size_t)M * N * sizeof *sums + 1, op);
    if (rq && offset && sums && mlc__qproduct_plan(ctx, op, x, weight, bias, scale, offset, rq)) {
        mlc_gemm_i8(ctx, M, N, weight->shape[1], x->int8, weight->int8, sums);
        for (m = 0; m < M; m++)
            for (o = 0; o < N; o++)
                y->int8[(size_t)m * N + o]
                    = mlc__requantize(sums[(size_t)m * N + o] + offset[o], &rq[o], zero_point);
    }
    mlc_frame_end(scratch);
    return ctx->error ? NULL : y;
}

/* y = z_y + (s_a (a - z_a) + s_b (b - z_b)) / s_y: both terms in fixed point at one shift, one rounding */
MLCDEF mlc_tensor *mlc_add_int8(mlc_tensor *a, mlc_tensor *b, float scale, int zero_point) {
    static const char *const op = "mlc_add_int8";
    mlc_tensor *y, *const in[2] = { a, b };
    mlc_ctx *ctx = mlc__int8_enter(op, 2, in);
    mlc__requant ra, rb;
    size_t i;
    int shift;
    if (!ctx || !mlc__qout_ok(ctx, op, scale, zero_point)) return NULL;
    if (!mlc_same_shape(a, b))
        return (mlc_tensor *)mlc__fail(ctx, MLC_ERR_SHAPE, "%s: %T and %T differ in shape", op, a, b);
    if (a->qscales || b->qscales || !mlc__requant_of(a->qscale / scale, &ra)
        || !mlc__requant_of(b->qscale / scale, &rb) || ra.shift - rb.shift > 23 || rb.shift - ra.shift > 23)
        return (mlc_tensor *)mlc__fail(ctx, MLC_ERR_ARG,
                                       "%s: scales %g and %g (per tensor) are too far from the "
                                       "output's %g",
                                       op, (double)a->qscale, (double)b->qscale, (double)scale);
    if (!(y = mlc__int8_result(ctx, op, a, a->ndim, a->shape, scale, zero_point))) return NULL;
    shift = ra.shift > rb.shift ? ra.shift : rb.shift;
    for (i = 0; i < a->size; i++) {
        const int64_t va = (int64_t)(a->int8[i] - a->qzero) * ra.m0 * ((int64_t)1 << (shift - ra.shift));
        const int64_t vb = (int64_t)(b->int8[i] - b->qzero) * rb.m0 * ((int64_t)1 << (shift - rb.shift));
        const int64_t q = ((va + vb + ((int64_t)1 << (shift - 1))) >> shift) + zero_point;
        y->int8[i] = (int8_t)(q < -128 ? -128 : q > 127 ? 127 : q);
    }
    return y;
}

/* The rows' part of int8 pooling: columns[i] = max(columns[i], row[i]), or += row[i] */
static void mlc__pool_int8_row(int32_t *MLC__RESTRICT columns, const int8_t *MLC__RESTRICT row, int W,
                               int is_max) {
    int i;
    if (is_max)
        MLC__VECTOR_LOOP(i, 0, W, { columns[i] = row[i] > columns[i] ? row[i] : columns[i]; });
    else
        MLC__VECTOR_LOOP(i, 0, W, { columns[i] += row[i]; });
}

#if MLC__X86
/* mlc__pool_int8_2x2 for n >= 8, 8 outputs a step (the last step ending at n, overlapping the
   one before): the rows' larger bytes, then each pair's larger as 16-bit lanes, packed back */
__attribute__((target("avx2")))
static void mlc__pool_int8_2x2_avx2(int8_t *out, const int8_t *r0, const int8_t *r1, int n) {
    int o = 0;
    for (;;) {
        const __m128i v = _mm_max_epi8(_mm_loadu_si128((const __m128i *)(const void *)(r0 + 2 * o)),
                                       _mm_loadu_si128((const __m128i *)(const void *)(r1 + 2 * o)));
        const __m128i pairs = _mm_max_epi16(_mm_srai_epi16(_mm_slli_epi16(v, 8), 8), _mm_srai_epi16(v, 8));
        _mm_storel_epi64((__m128i *)(void *)(out + o), _mm_packs_epi16(pairs, pairs));
        if (o == n - 8) return;
        o = n - o >= 16 ? o + 8 : n - 8;
    }
}
#endif

/* 2 x 2, stride-2 max pooling of input rows r0 and r1 into out[0, n) (whole windows) */
static void mlc__pool_int8_2x2(int8_t *MLC__RESTRICT out, const int8_t *MLC__RESTRICT r0,
                               const int8_t *MLC__RESTRICT r1, int n) {
    int o;
#if MLC__X86
    if (n >= 8 && mlc__cpu_avx2()) { mlc__pool_int8_2x2_avx2(out, r0, r1, n); return; }
#endif
    MLC__VECTOR_LOOP(o, 0, n, {
        const int8_t a = r0[2 * o] > r0[2 * o + 1] ? r0[2 * o] : r0[2 * o + 1],
                     b = r1[2 * o] > r1[2 * o + 1] ? r1[2 * o] : r1[2 * o + 1];
        out[o] = a > b ? a : b;
    });
}

/* Pooling an int8 tensor (mlc_max_pool2d / mlc_avg_pool2d and their _opts; node `call` holds the
   sizes and the output, made int8): the input's scale and zero point kept; padding counts as
   the zero point (real 0) where average pooling counts it. Each output row's window rows are
   reduced column by column first (their max, or sum), then each window's columns: KH + KW
   steps an output, not KH·KW. */
static int mlc__pool_int8(mlc__node *call) {
    mlc_tensor *x = call->in[0], *y = call->out;
    mlc_ctx *ctx = mlc__int8_enter(call->name, 1, call->in);
    mlc__pool_job job;
    const int OH = y->shape[2], OW = y->shape[3], H = x->shape[2], W = x->shape[3];
    mlc_frame scratch;
    int32_t *columns;                   /* the current output row's window rows, reduced */
    size_t plane;
    int oh, ow, ih, iw, h0, h1, w0, w1, two_by_two, paired;
    if (!ctx) return 0;
    mlc__pool_job_of(&job, call, NULL, NULL);
    two_by_two = job.is_max && job.KH == 2 && job.KW == 2 && job.SW == 2 && job.PW == 0;
    y->qscale = x->qscale;
    y->qzero = x->qzero;
    scratch = mlc_frame_begin(ctx);
    columns = (int32_t *)mlc__arena_alloc(ctx, (size_t)W * sizeof *columns, call->name);
    for (plane = 0; columns && plane < (size_t)x->shape[0] * x->shape[1]; plane++) {
        const int8_t *in = x->int8 + plane * H * W;
        int8_t *out = y->int8 + plane * OH * OW;
        for (oh = 0; oh < OH; oh++) {
            mlc__pool_window(&job, oh, 0, &h0, &h1, &w0, &w1);
            paired = two_by_two && h1 - h0 == 2 ? W / 2 : 0;     /* the common case: whole windows */
            if (paired)
                mlc__pool_int8_2x2(out + oh * OW, in + (size_t)h0 * W, in + (size_t)h0 * W + W, paired);
            if (paired == OW) continue;
            MLC__VECTOR_LOOP(iw, 0, W, { columns[iw] = job.is_max ? -128 : 0; });
            for (ih = h0; ih < h1; ih++) mlc__pool_int8_row(columns, in + (size_t)ih * W, W, job.is_max);
            for (ow = paired; ow < OW; ow++) {
                int64_t sum = 0;
                int32_t best = -128;
                mlc__pool_window(&job, oh, ow, &h0, &h1, &w0, &w1);
                for (iw = w0; iw < w1; iw++) {
                    sum += columns[iw];
                    best = columns[iw] > best ? columns[iw] : best;
                }
                if (!job.is_max) {
                    const int count = mlc__pool_count(&job, oh, ow);
                    best = (int32_t)mlc__divide_rounded(
                        sum + (int64_t)(count - (h1 - h0) * (w1 - w0)) * x->qzero, count);
                }
                out[oh * OW + ow] = (int8_t)best;
            }
        }
    }
    mlc_frame_end(scratch);
    return columns != NULL;
}

/* A read-only int8 tensor over the caller's memory (weights in flash) */
MLCDEF mlc_tensor *mlc_from_const_int8(mlc_ctx *ctx, int ndim, const int *shape, const int8_t *data,
                                       float scale, int zero_point, mlc_tensor *row_scales) {
    static const char *const op = "mlc_from_const_int8";
    mlc_tensor *t;
    if (!ctx || ctx->error) return NULL;
    if (!data) return (mlc_tensor *)mlc__fail(ctx, MLC_ERR_NULL, "%s: data is NULL", op);
    if (row_scales && !MLC__ARGS_OK(ctx, op, row_scales)) return NULL;
    if (row_scales ? row_scales->dtype != MLC_F32 || row_scales->ndim != 1 || ndim < 1
                         || row_scales->shape[0] != shape[0]
                   : !mlc__qout_ok(ctx, op, scale, zero_point))
        return (mlc_tensor *)mlc__fail(
            ctx, MLC_ERR_ARG, "%s: row scales %T must be float32, one per row (axis 0)", op, row_scales);
    ctx->op_device = ctx->backend != NULL;
    ctx->op_dtype = MLC_F32;
    if (!(t = mlc__make_over(ctx, op, ndim, shape, 1, (const float *)(const void *)data))) return NULL;
    t->dtype = MLC_I8;
    t->data = NULL;
    t->int8 = (int8_t *)(uintptr_t)data;
    t->qscale = row_scales ? 1.0f : scale;
    t->qzero = row_scales ? 0 : zero_point;
    t->qscales = row_scales;
    return !row_scales || mlc__int8_keep_sums(t) ? t : NULL;
}

/* ============================================================================================
   @section autograd
   Autograd: walk the tape from the newest node back. A node runs when its output received a
   gradient; it adds into its inputs' gradients (so a tensor used twice gets both parts).
   Leaves keep their gradients; intermediate gradients are dropped at the end.
   ============================================================================================ */

/* Whether the CPU backward of node n reads the values of its input k (k = -1: its output): all
   but pooling's (its argmax and sizes), copy's and reshape's (the gradient passes) and a
   convolution's output without a fused activation. */
static int mlc__backward_reads(const mlc__node *n, int k) {
    if (n->op == MLC__OP_POOL || n->op == MLC__OP_COPY || n->op == MLC__OP_RESHAPE) return 0;
    return n->op != MLC__OP_CONV2D || k >= 0 || ((const mlc__conv *)n->saved)->relu;
}

/* The CPU backward of a node with bf16 or f16 tensors: on float32 stand-ins for them, which
   share their (float32) gradients; what the backward did to a gradient's buffer and books goes
   back to the tensor. */
static void mlc__backward_widened(mlc__node *n) {
    const unsigned grad_bits = MLC__GRAD_HOST_STALE | MLC__GRAD_DEVICE_STALE | MLC__GRAD_ZERO;
    mlc__node w = *n;
    int k;
    n->out->ctx->stats.widened++;
    if (!mlc__stand_ins(n, w.in, &w.out, 1)) return;
    mlc__backward_of[n->op](&w);
    for (k = 0; k < n->n_in; k++)
        if (w.in[k] != n->in[k]) {
            n->in[k]->grad = w.in[k]->grad;
            n->in[k]->stale = (n->in[k]->stale & ~grad_bits) | (w.in[k]->stale & grad_bits);
        }
}

/* For the grad-ready hook: each leaf's oldest reader on the tape, from the newest node n down */
static void mlc__mark_last_uses(mlc__node *n) {
    int k;
    for (; n; n = n->prev)
        for (k = 0; k < n->n_in; k++)
            if (n->in[k] && !n->in[k]->node && n->in[k]->requires_grad) n->in[k]->last_use = n;
}

/* After node n's backward: the leaves it was the last to add to have their whole gradient */
static void mlc__report_ready(mlc__node *n) {
    mlc_ctx *ctx = n->out->ctx;
    int k;
    for (k = 0; k < n->n_in; k++)
        if (n->in[k] && n->in[k]->last_use == n && !ctx->error) {
            n->in[k]->last_use = NULL;
            ctx->grad_ready(n->in[k], ctx->grad_ready_user);
        }
}

MLCDEF void mlc_set_grad_ready_hook(mlc_ctx *ctx, mlc_grad_ready_fn fn, void *user) {
    if (!ctx) return;
    ctx->grad_ready = fn;
    ctx->grad_ready_user = user;
}

MLCDEF mlc_result mlc_backward_with(mlc_tensor *out, mlc_tensor *grad_out) {
    mlc_ctx *ctx;
    mlc__node *n, *done = NULL;
    float *g;
    if (!out) return MLC_ERR_NULL;
    ctx = out->ctx;
    if (ctx->error) return ctx->error;
    if (!MLC__ARGS_OK(ctx, grad_out ? "mlc_backward_with" : "mlc_backward", out, grad_out)) return ctx->error;
    if (out->node && out->graph_used) {
        mlc__fail(ctx, MLC_ERR_STATE, "mlc_backward: the graph of %T was used by an earlier "
                  "mlc_backward, which frees it; run the forward again", out);
        return ctx->error;
    }
    if (!out->requires_grad) {
        mlc__fail(ctx, MLC_ERR_STATE,
                  "mlc_backward: tensor %T does not require a gradient (no input needed one, or gradients "
                  "were off)",
                  out);
        return ctx->error;
    }
    if (grad_out && !mlc_same_shape(out, grad_out)) {
        mlc__fail(ctx, MLC_ERR_SHAPE, "mlc_backward: gradient %T does not match output %T", grad_out, out);
        return ctx->error;
    }
    if (!grad_out && out->size != 1) {
        mlc__fail(ctx, MLC_ERR_SHAPE, "mlc_backward: output %T is not a scalar; use mlc_backward_with", out);
        return ctx->error;
    }
    if (!mlc__same_device(ctx, "mlc_backward", out, grad_out)) return ctx->error;
    if (!(g = mlc__grad(out))) return ctx->error;
    if (grad_out) {
        size_t i;
        const float *go = mlc__host(grad_out);
        for (i = 0; i < out->size; i++) g[i] += go[i];
    } else g[0] += 1.0f;
    mlc__host_wrote_grad(out);
    if (!out->node) return MLC_OK;                       /* a leaf: nothing to propagate */
    if (ctx->grad_ready) mlc__mark_last_uses(out->node);
    for (n = out->node; n; done = n, n = n->prev) {
        int k;
        if (ctx->grad_ready && done) mlc__report_ready(done);
        if (!(n->out->grad || n->out->device_grad) || ctx->error) continue;
        n->out->graph_used = 1;                          /* this backward uses the node up */
        for (k = 0; k < n->n_in; k++)                    /* an input whose graph a backward used up */
            if (n->in[k] && n->in[k]->node && n->in[k]->requires_grad && n->in[k]->graph_used)
                mlc__fail(ctx, MLC_ERR_STATE, "mlc_backward: input %T of an op comes from a graph an earlier "
                          "mlc_backward used (and freed); run that forward again", n->in[k]);
        if (ctx->error) break;
        if (n->device) {                                 /* the backend allocates and adds, */
            if (mlc__device_backward(ctx, n) || ctx->error) continue;
            mlc__fall_back(ctx, n->name);                /* or declines: the CPU runs it */
        }
        mlc__host_sync(n->out);
        mlc__host_grad(n->out);
        /* input gradients first: one that fails to allocate stops here */
        for (k = 0; k < n->n_in; k++) {
            if (!n->in[k]) continue;
            mlc__host_sync(n->in[k]);
            if (n->in[k]->requires_grad && !mlc__grad_made(n->in[k])) break;
        }
        if (ctx->error) break;
        if (mlc__has_half(n) && !mlc__cpu_takes_half(n, 1)) mlc__backward_widened(n);
        else mlc__backward_of[n->op](n);
        for (k = 0; k < n->n_in; k++) if (n->in[k] && n->in[k]->requires_grad) mlc__host_wrote_grad(n->in[k]);
    }
    if (ctx->grad_ready && done && !ctx->error) mlc__report_ready(done);
    for (n = ctx->tape; n; n = n->prev) {
        n->out->grad = NULL;
        n->out->device_grad = NULL;
        n->out->stale &= ~(unsigned)(MLC__GRAD_HOST_STALE | MLC__GRAD_DEVICE_STALE | MLC__GRAD_ZERO);
    }
    for (n = ctx->tape; n && n->out->graph_used; n = n->prev) {}
    if (!n) ctx->tape = NULL;                            /* every node is used up: the tape is empty */
    return ctx->error;
}

MLCDEF mlc_result mlc_backward(mlc_tensor *loss) { return mlc_backward_with(loss, NULL); }

/* The output projected on weights r, summed in double: L = Σ y·r. */
static double mlc__project(mlc_tensor *y, const float *r) {
    const float *v = mlc__host(y);
    double s = 0.0;
    size_t i;
    for (i = 0; i < y->size; i++) s += (double)v[i] * (double)r[i];
    return s;
}

MLCDEF int mlc_gradcheck(mlc_ctx *ctx, mlc_gradcheck_fn fn, void *user, mlc_tensor **inputs, int count,
                         const mlc_gradcheck_opts *opts, mlc_gradcheck_report *report) {
    mlc_gradcheck_report rep;
    mlc_frame outer;
    mlc_gradcheck_opts o;
    uint64_t rng_state, rng_inc;
    mlc_tensor *y, *r;
    float **analytic;
    int k, ok = 1, grad_was;
    size_t i;
    memset(&rep, 0, sizeof rep);
    rep.worst_input = -1;
    if (report) *report = rep;
    if (!ctx || ctx->error) return 0;
    if (!fn || !inputs || count < 1) {
        mlc__fail(ctx, MLC_ERR_ARG, "mlc_gradcheck: %s", !fn ? "fn is NULL" : "no inputs");
        return 0;
    }
    for (k = 0; k < count; k++)
        if (!inputs[k] || inputs[k]->ctx != ctx || !mlc__usable(inputs[k], "mlc_gradcheck")) {
            mlc__fail(ctx, inputs[k] ? MLC_ERR_ARG : MLC_ERR_NULL, "mlc_gradcheck: input %d is %s", k,
                      inputs[k] ? "from another context" : "NULL");
            return 0;
        } else if (inputs[k]->dtype != MLC_F32) {           /* it nudges the inputs by eps */
            mlc__fail(ctx, MLC_ERR_ARG, "mlc_gradcheck: input %d %T is %s; check float32 inputs (cast inside "
                      "fn with mlc_to_dtype)", k, inputs[k], mlc_dtype_name(inputs[k]->dtype));
            return 0;
        }
    outer = mlc_frame_begin(ctx);
    if (!outer.ctx) return 0;
    rng_state = ctx->rng_state; rng_inc = ctx->rng_inc;
    o.eps = opts && opts->eps > 0 ? opts->eps : 1e-3;
    o.atol = opts && opts->atol > 0 ? opts->atol : 1e-3;
    o.rtol = opts && opts->rtol > 0 ? opts->rtol : 1e-2;
    for (k = 0; k < count; k++) if (inputs[k]) mlc__clear_grad(inputs[k]);
    y = fn(inputs, user);
    if (!y || !y->requires_grad) {
        if (!y) mlc__fail(ctx, MLC_ERR_ARG, "mlc_gradcheck: the function returned NULL");
        else
            mlc__fail(ctx, MLC_ERR_ARG,
                      "mlc_gradcheck: the output does not depend on an input that requires a gradient");
        mlc_frame_end(outer);
        if (report) *report = rep;
        return 0;
    }
    mlc_seed(ctx, 0x9e3779b97f4a7c15ULL);                 /* fixed projection weights */
    r = mlc_rand(ctx, y->ndim, y->shape);
    analytic = (float **)mlc__arena_alloc(ctx, (size_t)count * sizeof(float *) + 1, "mlc_gradcheck");
    if (!r || !analytic) { mlc_frame_end(outer); return 0; }
    for (i = 0; i < r->size; i++) r->data[i] = r->data[i] * 2.0f - 1.0f;
    mlc__host_wrote(r);
    if (mlc_backward_with(y, r) != MLC_OK) { mlc_frame_end(outer); return 0; }
    for (k = 0; k < count; k++) {
        analytic[k] = mlc__floats(ctx, inputs[k]->size + 1, "mlc_gradcheck");
        if (!analytic[k]) { mlc_frame_end(outer); return 0; }
        if (inputs[k]->grad) memcpy(analytic[k], mlc__host_grad(inputs[k]), inputs[k]->size * sizeof(float));
        else memset(analytic[k], 0, inputs[k]->size * sizeof(float));
    }
    grad_was = mlc_set_grad_enabled(ctx, 0);
    for (k = 0; k < count && ok; k++) {
        if (!inputs[k]->requires_grad) continue;
        mlc__host(inputs[k]);                          /* perturbed on the host, one value at a time */
        for (i = 0; i < inputs[k]->size; i++) {
            float saved = inputs[k]->data[i];
            double plus, minus, numeric, err;
            mlc_frame f = mlc_frame_begin(ctx);
            inputs[k]->data[i] = saved + (float)o.eps;
            mlc__host_wrote(inputs[k]);
            ctx->rng_state = rng_state; ctx->rng_inc = rng_inc;   /* same dropout masks each time */
            y = fn(inputs, user);
            plus = y ? mlc__project(y, r->data) : 0.0;
            inputs[k]->data[i] = saved - (float)o.eps;
            mlc__host_wrote(inputs[k]);
            ctx->rng_state = rng_state; ctx->rng_inc = rng_inc;
            y = fn(inputs, user);
            minus = y ? mlc__project(y, r->data) : 0.0;
            inputs[k]->data[i] = saved;
            mlc__host_wrote(inputs[k]);
            mlc_frame_end(f);
            if (ctx->error) { ok = 0; break; }
            numeric = (plus - minus) / (2.0 * o.eps);
            err = fabs((double)analytic[k][i] - numeric);
            if (rep.worst_input < 0 || err > rep.max_abs_error) {
                rep.max_abs_error = err; rep.worst_input = k; rep.worst_index = i;
                rep.analytic = analytic[k][i]; rep.numeric = numeric;
            }
            if (err > o.atol + o.rtol * fabs(numeric)) ok = 0;
        }
    }
    mlc_set_grad_enabled(ctx, grad_was);
    ctx->rng_state = rng_state; ctx->rng_inc = rng_inc;
    mlc_frame_end(outer);
    if (report) *report = rep;
    return ok;
}

/* ============================================================================================
   @section init  Initialisers (fan_in = shape[1]·receptive field, fan_out = shape[0]·receptive field)
   ============================================================================================ */

static void mlc__fans(const mlc_tensor *t, double *fan_in, double *fan_out) {
    double receptive = t->ndim > 2 ? (double)mlc__numel(t->ndim - 2, t->shape + 2) : 1.0;
    *fan_in = t->ndim >= 2 ? t->shape[1] * receptive : t->ndim == 1 ? t->shape[0] : 1.0;
    *fan_out = t->ndim >= 2 ? t->shape[0] * receptive : *fan_in;
    if (*fan_in < 1) *fan_in = 1;
    if (*fan_out < 1) *fan_out = 1;
}

MLCDEF void mlc_init_uniform(mlc_tensor *t, float lo, float hi) {
    size_t i;
    if (!t || !mlc__writable(t, "mlc_init_uniform")) return;
    for (i = 0; i < t->size; i++) mlc__set(t, i, lo + (hi - lo) * mlc_rand_uniform(t->ctx));
    mlc__host_wrote(t);
}
MLCDEF void mlc_init_normal(mlc_tensor *t, float mean, float std) {
    size_t i;
    if (!t || !mlc__writable(t, "mlc_init_normal")) return;
    for (i = 0; i < t->size; i++) mlc__set(t, i, mean + std * mlc_rand_normal(t->ctx));
    mlc__host_wrote(t);
}
MLCDEF void mlc_init_constant(mlc_tensor *t, float value) {
    size_t i;
    if (!t || !mlc__writable(t, "mlc_init_constant")) return;
    for (i = 0; i < t->size; i++) mlc__set(t, i, value);
    mlc__host_wrote(t);
}
MLCDEF void mlc_init_kaiming_uniform(mlc_tensor *t, float a) {   /* bound = gain √(3 / fan_in) */
    double fi, fo, bound;
    if (!t || !mlc__writable(t, "mlc_init_kaiming_uniform")) return;
    mlc__fans(t, &fi, &fo);
    bound = sqrt(2.0 / (1.0 + (double)a * (double)a)) * sqrt(3.0 / fi);
    mlc_init_uniform(t, (float)-bound, (float)bound);
}
MLCDEF void mlc_init_kaiming_normal(mlc_tensor *t, float a) {    /* std = gain / √fan_in */
    double fi, fo;
    if (!t || !mlc__writable(t, "mlc_init_kaiming_normal")) return;
    mlc__fans(t, &fi, &fo);
    mlc_init_normal(t, 0.0f, (float)(sqrt(2.0 / (1.0 + (double)a * (double)a)) / sqrt(fi)));
}
/* bound = gain √(6 / (fan_in + fan_out)) */
MLCDEF void mlc_init_xavier_uniform(mlc_tensor *t, float gain) {
    double fi, fo, bound;
    if (!t || !mlc__writable(t, "mlc_init_xavier_uniform")) return;
    mlc__fans(t, &fi, &fo);
    bound = (double)gain * sqrt(6.0 / (fi + fo));
    mlc_init_uniform(t, (float)-bound, (float)bound);
}
MLCDEF void mlc_init_xavier_normal(mlc_tensor *t, float gain) {  /* std = gain √(2 / (fan_in + fan_out)) */
    double fi, fo;
    if (!t || !mlc__writable(t, "mlc_init_xavier_normal")) return;
    mlc__fans(t, &fi, &fo);
    mlc_init_normal(t, 0.0f, (float)((double)gain * sqrt(2.0 / (fi + fo))));
}

/* ============================================================================================
   @section modules  Modules
   ============================================================================================ */

static mlc_module *mlc__module(mlc_ctx *ctx, const char *type, mlc_forward_fn forward) {
    mlc_module *m;
    if (!ctx || ctx->error) return NULL;
    m = (mlc_module *)mlc__owned_alloc(ctx, sizeof(mlc_module), type);
    if (!m) return NULL;
    m->ctx = ctx; m->type = type; m->forward = forward; m->training = 1;
    return m;
}

static char *mlc__strdup(mlc_ctx *ctx, const char *s) {
    char *d = (char *)mlc__owned_alloc(ctx, strlen(s) + 1, "mlc_module");
    if (d) memcpy(d, s, strlen(s) + 1);
    return d;
}

static mlc_result mlc__module_add(mlc_module *m, const char *name, mlc_tensor *t, int is_buffer) {
    int *count;
    if (!m) return MLC_ERR_NULL;
    if (!t || !name) {
        mlc__fail(m->ctx, MLC_ERR_NULL, "mlc_module_add: %s is NULL", t ? "name" : "tensor");
        return m->ctx->error ? m->ctx->error : MLC_ERR_NULL;
    }
    count = is_buffer ? &m->n_buffers : &m->n_params;
    if (*count >= MLC_MODULE_MAX_TENSORS) {
        mlc__fail(m->ctx, MLC_ERR_ARG, "mlc_module_add: %s already holds %d tensors; use a child module",
                  m->type, MLC_MODULE_MAX_TENSORS);
        return m->ctx->error;
    }
    if (t->freed) {
        mlc__fail(m->ctx, MLC_ERR_STATE, "mlc_module_add: tensor \"%s\" was freed (mlc_tensor_free)", name);
        return m->ctx->error;
    }
    if (!t->persistent) {
        mlc__fail(m->ctx, MLC_ERR_ARG,
                  "mlc_module_add: tensor \"%s\" lives in a frame; use mlc_parameter or mlc_keep", name);
        return m->ctx->error;
    }
    if (t->ctx != m->ctx) {
        mlc__fail(m->ctx, MLC_ERR_ARG, "mlc_module_add: tensor \"%s\" belongs to another context", name);
        return m->ctx->error;
    }
    if (!(name = mlc__strdup(m->ctx, name))) return m->ctx->error;
    if (!t->owner) { t->owner = m->type; t->owner_name = name; }  /* mlc_tensor_free refuses it */
    if (is_buffer) { m->buffers[*count] = t; m->buffer_names[*count] = name; }
    else { m->params[*count] = t; m->param_names[*count] = name; }
    ++*count;
    return MLC_OK;
}
MLCDEF mlc_result mlc_module_add_param(mlc_module *m, const char *name, mlc_tensor *p) {
    if (m && p && !MLC__ARGS_OK(m->ctx, "mlc_module_add_param", p)) return m->ctx->error;
    return mlc__module_add(m, name, p, 0);
}
MLCDEF mlc_result mlc_module_add_buffer(mlc_module *m, const char *name, mlc_tensor *b) {
    if (m && b && !MLC__ARGS_OK(m->ctx, "mlc_module_add_buffer", b)) return m->ctx->error;
    return mlc__module_add(m, name, b, 1);
}

/* Whether the tree under m is more than `levels` deep; it looks no deeper than that. */
static int mlc__module_deeper(const mlc_module *m, int levels) {
    int i;
    if (levels < 0) return 1;
    for (i = 0; i < m->n_children; i++) if (mlc__module_deeper(m->children[i], levels - 1)) return 1;
    return 0;
}
/* The walks' entry check: m's tree within MLC_MODULE_MAX_DEPTH, else an error naming op */
static int mlc__module_walkable(mlc_module *m, const char *op) {
    if (!mlc__module_deeper(m, MLC_MODULE_MAX_DEPTH)) return 1;
    mlc__fail(m->ctx, MLC_ERR_ARG, "%s: modules under %s nest more than %d deep (MLC_MODULE_MAX_DEPTH)", op,
              m->type, MLC_MODULE_MAX_DEPTH);
    return 0;
}

/* Whether `inner` is m or inside it (modules form a tree: adding such a child would make a cycle). */
static int mlc__module_holds(const mlc_module *m, const mlc_module *inner) {
    int i;
    if (m == inner) return 1;
    for (i = 0; i < m->n_children; i++) if (mlc__module_holds(m->children[i], inner)) return 1;
    return 0;
}

MLCDEF mlc_result mlc_module_add_child(mlc_module *m, const char *name, mlc_module *child) {
    mlc_module **children;
    char **names;
    if (!m) return MLC_ERR_NULL;
    if (!child || !name) {
        mlc__fail(m->ctx, MLC_ERR_NULL, "mlc_module_add_child: %s is NULL", child ? "name" : "child");
        return m->ctx->error ? m->ctx->error : MLC_ERR_NULL;
    }
    if (child->ctx == m->ctx && mlc__module_deeper(child, MLC_MODULE_MAX_DEPTH - 1)) {
        mlc__fail(m->ctx, MLC_ERR_ARG, "mlc_module_add_child: adding %s \"%s\" would nest modules more "
                  "than %d deep (MLC_MODULE_MAX_DEPTH)", child->type, name, MLC_MODULE_MAX_DEPTH);
        return m->ctx->error;
    }
    if (child->ctx != m->ctx || mlc__module_holds(child, m)) {
        mlc__fail(m->ctx, MLC_ERR_ARG, "mlc_module_add_child: %s \"%s\" %s", child->type, name,
                  child->ctx != m->ctx ? "belongs to another context" : "contains the module (a cycle)");
        return m->ctx->error ? m->ctx->error : MLC_ERR_ARG;
    }
    if (!(m->n_children & (m->n_children - 1))) {       /* 0 or a power of two: full, so double */
        const size_t cap = m->n_children ? 2 * (size_t)m->n_children : 1;
        children = (mlc_module **)mlc__owned_alloc(m->ctx, sizeof(mlc_module *) * cap,
                                                   "mlc_module_add_child");
        names = (char **)mlc__owned_alloc(m->ctx, sizeof(char *) * cap, "mlc_module_add_child");
        if (!children || !names) return m->ctx->error;
        if (m->n_children) {
            memcpy(children, m->children, sizeof(mlc_module *) * (size_t)m->n_children);
            memcpy(names, m->child_names, sizeof(char *) * (size_t)m->n_children);
            mlc__owned_free(m->ctx, m->children);
            mlc__owned_free(m->ctx, m->child_names);
        }
        m->children = children; m->child_names = names;
    }
    if (!(m->child_names[m->n_children] = mlc__strdup(m->ctx, name))) return m->ctx->error;
    m->children[m->n_children++] = child;
    return MLC_OK;
}

MLCDEF mlc_module *mlc_nn_custom(mlc_ctx *ctx, const char *type, mlc_forward_fn forward, void *user) {
    mlc_module *m = mlc__module(ctx, type ? type : "Custom", forward);
    if (m) m->user = user;
    return m;
}

MLCDEF mlc_tensor *mlc_forward(mlc_module *m, mlc_tensor *x) {
    mlc_tensor *y;
    if (!m || !x)
        return (mlc_tensor *)mlc__fail(m ? m->ctx : x ? x->ctx : NULL, MLC_ERR_NULL,
                                       "mlc_forward: %s is NULL", m ? "the input" : "the module");
    if (x->ctx != m->ctx)
        return (mlc_tensor *)mlc__fail(m->ctx, MLC_ERR_ARG, "mlc_forward: input %T belongs to another "
                                       "context than %s", x, m->type);
    if (!MLC__ARGS_OK(m->ctx, "mlc_forward", x)) return NULL;
    if (!m->forward)
        return (mlc_tensor *)mlc__fail(m->ctx, MLC_ERR_STATE,
                                       "mlc_forward: module %s has no forward function", m->type);
    if (m->ctx->forward_depth > MLC_MODULE_MAX_DEPTH)   /* the root's call, then one a level */
        return (mlc_tensor *)mlc__fail(m->ctx, MLC_ERR_ARG, "mlc_forward: modules run inside one another "
                                       "more than %d deep (MLC_MODULE_MAX_DEPTH), at %s",
                                       MLC_MODULE_MAX_DEPTH, m->type);
    m->ctx->forward_depth++;
    y = m->forward(m, x);
    m->ctx->forward_depth--;
    return y;
}

/* A parameter with PyTorch's default initialisation U(-1/√fan_in, 1/√fan_in) for biases. */
static mlc_tensor *mlc__param(mlc_module *m, const char *name, int ndim, const int *shape) {
    mlc_tensor *p = mlc_parameter(m->ctx, ndim, shape);
    if (p && mlc__module_add(m, name, p, 0) != MLC_OK) return NULL;
    return p;
}
static mlc_tensor *mlc__buffer(mlc_module *m, const char *name, int ndim, const int *shape, float value) {
    mlc_tensor *b = strcmp(name, "num_batches_tracked") ? mlc__new_default(m->ctx, name, ndim, shape)
                                                        : mlc__new(m->ctx, name, ndim, shape, 1);
    if (!b || mlc__module_add(m, name, b, 1) != MLC_OK) return NULL;
    mlc_init_constant(b, value);
    return b;
}

static mlc_tensor *mlc__linear_forward(mlc_module *m, mlc_tensor *x) {
    return mlc_linear(x, m->params[0], m->n_params > 1 ? m->params[1] : NULL);
}

static mlc_module *mlc__nn_linear(mlc_ctx *ctx, int in, int out, int bias) {
    mlc_module *m = mlc__module(ctx, "Linear", mlc__linear_forward);
    int shape[2];
    mlc_tensor *w, *b = NULL;
    if (!m) return NULL;
    shape[0] = out; shape[1] = in;
    if (!(w = mlc__param(m, "weight", 2, shape)) || (bias && !(b = mlc__param(m, "bias", 1, &out))))
        return NULL;
    mlc_init_kaiming_uniform(w, 2.2360679775f);          /* a = √5: bound 1/√in, as PyTorch */
    if (b)
        mlc_init_uniform(b, -1.0f / sqrtf((float)(in > 0 ? in : 1)), 1.0f / sqrtf((float)(in > 0 ? in : 1)));
    return m;
}
MLCDEF mlc_module *mlc_nn_linear(mlc_ctx *ctx, int in, int out) { return mlc__nn_linear(ctx, in, out, 1); }
MLCDEF mlc_module *mlc_nn_linear_nobias(mlc_ctx *ctx, int in, int out) {
    return mlc__nn_linear(ctx, in, out, 0);
}

static mlc_tensor *mlc__conv2d_forward(mlc_module *m, mlc_tensor *x) {
    return mlc_conv2d(x, m->params[0], m->params[1], m->conv);
}

MLCDEF mlc_module *mlc_nn_conv2d(mlc_ctx *ctx, int in_channels, int out_channels, int kernel,
                                 mlc_conv_opts opts) {
    mlc_module *m = mlc__module(ctx, "Conv2d", mlc__conv2d_forward);
    int shape[4], groups = opts.groups ? opts.groups : 1;
    mlc_tensor *w, *b;
    float bound;
    if (!m) return NULL;
    if (in_channels < 1 || out_channels < 1 || kernel < 1 || opts.stride < 0 || opts.padding < 0 ||
        opts.dilation < 0 || opts.stride_w < 0 || opts.padding_w < MLC_ZERO_INT || opts.dilation_w < 0)
        return (mlc_module *)mlc__fail(ctx, MLC_ERR_ARG, "mlc_nn_conv2d: in %d, out %d, kernel %d, "
                                       "stride (%d, %d), padding (%d, %d), dilation (%d, %d) are not valid",
                                       in_channels, out_channels, kernel, opts.stride, opts.stride_w,
                                       opts.padding, opts.padding_w, opts.dilation, opts.dilation_w);
    if (groups < 1 || in_channels % groups)
        return (mlc_module *)mlc__fail(ctx, MLC_ERR_ARG,
                                       "mlc_nn_conv2d: %d input channels do not split into %d groups",
                                       in_channels, groups);
    shape[0] = out_channels; shape[1] = in_channels / groups; shape[2] = shape[3] = kernel;
    m->conv = opts;
    if (!(w = mlc__param(m, "weight", 4, shape)) || !(b = mlc__param(m, "bias", 1, &out_channels)))
        return NULL;
    mlc_init_kaiming_uniform(w, 2.2360679775f);
    bound = 1.0f / sqrtf((float)(shape[1] * kernel * kernel > 0 ? shape[1] * kernel * kernel : 1));
    mlc_init_uniform(b, -bound, bound);
    return m;
}

static mlc_tensor *mlc__batch_norm_forward(mlc_module *m, mlc_tensor *x) {
    if (m->training && x && m->buffers[2]) {                                     /* num_batches_tracked */
        mlc__host(m->buffers[2])[0] += 1.0f;
        mlc__host_wrote(m->buffers[2]);
    }
    return mlc_batch_norm(x, m->buffers[0], m->buffers[1], m->params[0], m->params[1], m->training,
                          m->momentum, m->eps);
}
MLCDEF mlc_module *mlc_nn_batch_norm(mlc_ctx *ctx, int features) {
    mlc_module *m = mlc__module(ctx, "BatchNorm", mlc__batch_norm_forward);
    mlc_tensor *w, *b;
    if (!m) return NULL;
    m->eps = 1e-5f; m->momentum = 0.1f;
    if (!(w = mlc__param(m, "weight", 1, &features)) || !(b = mlc__param(m, "bias", 1, &features)))
        return NULL;
    mlc_init_constant(w, 1.0f);
    if (!mlc__buffer(m, "running_mean", 1, &features, 0.0f)
        || !mlc__buffer(m, "running_var", 1, &features, 1.0f)
        || !mlc__buffer(m, "num_batches_tracked", 0, NULL, 0.0f))
        return NULL;
    return m;
}

static mlc_tensor *mlc__layer_norm_forward(mlc_module *m, mlc_tensor *x) {
    return mlc_layer_norm_dims(x, m->params[0]->ndim, m->params[0], m->params[1], m->eps);
}
MLCDEF mlc_module *mlc_nn_layer_norm_shape(mlc_ctx *ctx, int ndim, const int *normalized_shape) {
    mlc_module *m = mlc__module(ctx, "LayerNorm", mlc__layer_norm_forward);
    mlc_tensor *w;
    if (!m) return NULL;
    if (ndim < 1)
        return (mlc_module *)mlc__fail(ctx, MLC_ERR_SHAPE, "mlc_nn_layer_norm_shape: %d dimensions", ndim);
    m->eps = 1e-5f;
    if (!(w = mlc__param(m, "weight", ndim, normalized_shape))
        || !mlc__param(m, "bias", ndim, normalized_shape))
        return NULL;
    mlc_init_constant(w, 1.0f);
    return m;
}
MLCDEF mlc_module *mlc_nn_layer_norm(mlc_ctx *ctx, int features) {
    return mlc_nn_layer_norm_shape(ctx, 1, &features);
}

static mlc_tensor *mlc__embedding_forward(mlc_module *m, mlc_tensor *x) {
    return mlc_embedding(m->params[0], x);
}
MLCDEF mlc_module *mlc_nn_embedding(mlc_ctx *ctx, int count, int dim) {
    mlc_module *m = mlc__module(ctx, "Embedding", mlc__embedding_forward);
    int shape[2];
    mlc_tensor *w;
    if (!m) return NULL;
    shape[0] = count; shape[1] = dim;
    if (!(w = mlc__param(m, "weight", 2, shape))) return NULL;
    mlc_init_normal(w, 0.0f, 1.0f);
    return m;
}

static mlc_tensor *mlc__dropout_forward(mlc_module *m, mlc_tensor *x) {
    return mlc_dropout(x, m->alpha, m->training);
}
static mlc_tensor *mlc__relu_forward(mlc_module *m, mlc_tensor *x) { (void)m; return mlc_relu(x); }
static mlc_tensor *mlc__leaky_forward(mlc_module *m, mlc_tensor *x) { return mlc_leaky_relu(x, m->alpha); }
static mlc_tensor *mlc__gelu_forward(mlc_module *m, mlc_tensor *x) { (void)m; return mlc_gelu(x); }
static mlc_tensor *mlc__sigmoid_forward(mlc_module *m, mlc_tensor *x) { (void)m; return mlc_sigmoid(x); }
static mlc_tensor *mlc__tanh_forward(mlc_module *m, mlc_tensor *x) { (void)m; return mlc_tanh(x); }
static mlc_tensor *mlc__silu_forward(mlc_module *m, mlc_tensor *x) { (void)m; return mlc_silu(x); }
static mlc_tensor *mlc__flatten_forward(mlc_module *m, mlc_tensor *x) { (void)m; return mlc_flatten(x, 1); }
static mlc_tensor *mlc__max_pool_forward(mlc_module *m, mlc_tensor *x) {
    return mlc_max_pool2d_opts(x, m->kernel, m->pool);
}
static mlc_tensor *mlc__avg_pool_forward(mlc_module *m, mlc_tensor *x) {
    return mlc_avg_pool2d_opts(x, m->kernel, m->pool);
}
static mlc_tensor *mlc__gap_forward(mlc_module *m, mlc_tensor *x) {
    (void)m;
    return mlc_global_avg_pool2d(x);
}

MLCDEF mlc_module *mlc_nn_dropout(mlc_ctx *ctx, float p) {
    mlc_module *m = mlc__module(ctx, "Dropout", mlc__dropout_forward);
    if (m && !mlc__in_range(ctx, "mlc_nn_dropout", "p", p, 0.0f, 1.0f, 0)) return NULL;
    if (m) m->alpha = p;
    return m;
}
MLCDEF mlc_module *mlc_nn_relu(mlc_ctx *ctx) { return mlc__module(ctx, "ReLU", mlc__relu_forward); }
MLCDEF mlc_module *mlc_nn_leaky_relu(mlc_ctx *ctx, float slope) {
    mlc_module *m = mlc__module(ctx, "LeakyReLU", mlc__leaky_forward);
    if (m && !mlc__in_range(ctx, "mlc_nn_leaky_relu", "slope", slope, -FLT_MAX, FLT_MAX, 0)) return NULL;
    if (m) m->alpha = slope;
    return m;
}
MLCDEF mlc_module *mlc_nn_gelu(mlc_ctx *ctx) { return mlc__module(ctx, "GELU", mlc__gelu_forward); }
MLCDEF mlc_module *mlc_nn_sigmoid(mlc_ctx *ctx) { return mlc__module(ctx, "Sigmoid", mlc__sigmoid_forward); }
MLCDEF mlc_module *mlc_nn_tanh(mlc_ctx *ctx) { return mlc__module(ctx, "Tanh", mlc__tanh_forward); }
MLCDEF mlc_module *mlc_nn_silu(mlc_ctx *ctx) { return mlc__module(ctx, "SiLU", mlc__silu_forward); }
MLCDEF mlc_module *mlc_nn_flatten(mlc_ctx *ctx) { return mlc__module(ctx, "Flatten", mlc__flatten_forward); }
MLCDEF mlc_module *mlc_nn_max_pool2d(mlc_ctx *ctx, int kernel, int stride) {
    mlc_module *m = mlc__module(ctx, "MaxPool2d", mlc__max_pool_forward);
    if (m && (kernel < 1 || stride < 0))
        return (mlc_module *)mlc__fail(ctx, MLC_ERR_ARG, "mlc_nn_max_pool2d: kernel %d, stride %d "
                                       "are not valid", kernel, stride);
    if (m) { m->kernel = kernel; m->pool.stride = stride; }
    return m;
}
MLCDEF mlc_module *mlc_nn_avg_pool2d(mlc_ctx *ctx, int kernel, int stride) {
    mlc_module *m = mlc__module(ctx, "AvgPool2d", mlc__avg_pool_forward);
    if (m && (kernel < 1 || stride < 0))
        return (mlc_module *)mlc__fail(ctx, MLC_ERR_ARG, "mlc_nn_avg_pool2d: kernel %d, stride %d "
                                       "are not valid", kernel, stride);
    if (m) { m->kernel = kernel; m->pool.stride = stride; }
    return m;
}
MLCDEF mlc_module *mlc_nn_global_avg_pool2d(mlc_ctx *ctx) {
    return mlc__module(ctx, "GlobalAvgPool2d", mlc__gap_forward);
}

/* MultiheadAttention (batch_first). x [B, L, E] becomes its heads [B, H, L, E/H] by a reshape
   and a permute; self-attention makes q, k and v with one product, x W_inᵀ + b_in viewed as
   [B, T, 3, H, E/H] and permuted to [3, B, H, T, E/H]; otherwise W_in's rows [0, E), [E, 2E)
   and [2E, 3E) project query, key and value. */
static mlc_tensor *mlc__mha_heads(mlc_tensor *x, int heads) {
    static const int order[] = { 0, 2, 1, 3 };
    int shape[4];
    if (!x) return NULL;
    shape[0] = x->shape[0]; shape[1] = x->shape[1]; shape[2] = heads; shape[3] = x->shape[2] / heads;
    return mlc_permute(mlc_reshape(x, 4, shape), order);
}

static mlc_tensor *mlc__mha_project(mlc_tensor *x, mlc_tensor *w, mlc_tensor *b, int part, int heads) {
    int E = w->shape[1];
    mlc_tensor *rows = mlc_slice(w, 0, part * E, (part + 1) * E);
    return mlc__mha_heads(mlc_linear(x, rows, mlc_slice(b, 0, part * E, (part + 1) * E)), heads);
}

MLCDEF mlc_tensor *mlc_forward_attention(mlc_module *m, mlc_tensor *query, mlc_tensor *key, mlc_tensor *value,
                                         mlc_tensor *mask, int causal) {
    static const int split[] = { 2, 0, 3, 1, 4 }, merge[] = { 0, 2, 1, 3 };
    mlc_tensor *w, *b, *q, *k, *v, *y;
    mlc_attention_opts opts;
    int E, H, B, T, shape[5];
    if (!m || m->ctx->error) return NULL;
    if (!query || !key || !value)
        return (mlc_tensor *)mlc__fail(m->ctx, MLC_ERR_NULL, "mlc_forward_attention: query, key or value "
                                       "is NULL");
    if (!MLC__ARGS_OK(m->ctx, "mlc_forward_attention", query, key, value, mask)) return NULL;
    if (strcmp(m->type, "MultiheadAttention") != 0)
        return (mlc_tensor *)mlc__fail(m->ctx, MLC_ERR_ARG, "mlc_forward_attention: module %s is not a "
                                       "MultiheadAttention", m->type);
    if (query->ctx != m->ctx || key->ctx != m->ctx || value->ctx != m->ctx || (mask && mask->ctx != m->ctx))
        return (mlc_tensor *)mlc__fail(m->ctx, MLC_ERR_ARG, "mlc_forward_attention: the %s belongs to "
                                       "another context than the MultiheadAttention",
                                       query->ctx != m->ctx ? "query" : key->ctx != m->ctx ? "key"
                                       : value->ctx != m->ctx ? "value" : "mask");
    if (m->n_params != 2 || m->n_children != 1 || m->params[0]->ndim != 2 || m->params[1]->ndim != 1
        || m->params[0]->shape[0] != 3 * m->params[0]->shape[1]
        || m->params[1]->shape[0] != m->params[0]->shape[0])
        return (mlc_tensor *)mlc__fail(m->ctx, MLC_ERR_ARG, "mlc_forward_attention: MultiheadAttention's "
                                       "in_proj_weight and in_proj_bias were changed (want [3E, E], [3E])");
    w = m->params[0]; b = m->params[1]; E = w->shape[1]; H = m->kernel;
    if (H < 1 || E % H)                  /* the fields are the user's to change: checked each time */
        return (mlc_tensor *)mlc__fail(m->ctx, MLC_ERR_ARG, "mlc_forward_attention: MultiheadAttention's "
                                       "num_heads (field kernel) %d does not split embed_dim %d", H, E);
    if (!mlc__in_range(m->ctx, "mlc_forward_attention: MultiheadAttention", "dropout (field alpha)", m->alpha,
                       0.0f, 1.0f, 0))
        return NULL;
    if (query->ndim != 3 || key->ndim != 3 || value->ndim != 3 || query->shape[2] != E || key->shape[2] != E
        || value->shape[2] != E || key->shape[0] != query->shape[0] || !mlc_same_shape(key, value))
        return (mlc_tensor *)mlc__fail(m->ctx, MLC_ERR_SHAPE, "mlc_forward_attention: query %T, key %T "
                                       "and value %T must be [B, T, %d], [B, S, %d] and [B, S, %d]",
                                       query, key, value, E, E, E);
    B = query->shape[0]; T = query->shape[1];
    if (query == key && key == value) {
        shape[0] = B; shape[1] = T; shape[2] = 3; shape[3] = H; shape[4] = E / H;
        y = mlc_permute(mlc_reshape(mlc_linear(query, w, b), 5, shape), split);
        shape[0] = B; shape[1] = H; shape[2] = T; shape[3] = E / H;
        q = mlc_reshape(mlc_slice(y, 0, 0, 1), 4, shape);
        k = mlc_reshape(mlc_slice(y, 0, 1, 2), 4, shape);
        v = mlc_reshape(mlc_slice(y, 0, 2, 3), 4, shape);
    } else {
        q = mlc__mha_project(query, w, b, 0, H);
        k = mlc__mha_project(key, w, b, 1, H);
        v = mlc__mha_project(value, w, b, 2, H);
    }
    memset(&opts, 0, sizeof opts);
    opts.mask = mask; opts.causal = causal; opts.dropout = m->training ? m->alpha : 0.0f;
    y = mlc_permute(mlc_attention(q, k, v, opts), merge);           /* [B, T, H, E/H] */
    shape[0] = B; shape[1] = T; shape[2] = E;
    return mlc_forward(m->children[0], mlc_reshape(y, 3, shape));   /* out_proj */
}

static mlc_tensor *mlc__mha_forward(mlc_module *m, mlc_tensor *x) {
    return mlc_forward_attention(m, x, x, x, NULL, 0);
}

MLCDEF mlc_module *mlc_nn_multihead_attention(mlc_ctx *ctx, int embed_dim, int num_heads) {
    mlc_module *m = mlc__module(ctx, "MultiheadAttention", mlc__mha_forward), *out;
    int shape[2];
    mlc_tensor *w;
    if (!m) return NULL;
    if (embed_dim < 1 || num_heads < 1 || embed_dim % num_heads || embed_dim > 2147483647 / 3)
        return (mlc_module *)mlc__fail(ctx, MLC_ERR_ARG, "mlc_nn_multihead_attention: embed_dim %d does not "
                                       "split into %d heads, or 3 embed_dim rows overflow an int", embed_dim,
                                       num_heads);
    m->kernel = num_heads;
    shape[0] = 3 * embed_dim; shape[1] = embed_dim;
    if (!(w = mlc__param(m, "in_proj_weight", 2, shape)) || !mlc__param(m, "in_proj_bias", 1, shape) ||
        !(out = mlc_nn_linear(ctx, embed_dim, embed_dim)) ||
        mlc_module_add_child(m, "out_proj", out) != MLC_OK) return NULL;
    mlc_init_xavier_uniform(w, 1.0f);           /* as PyTorch: biases 0, out_proj.weight as Linear's */
    mlc_init_constant(out->params[1], 0.0f);
    return m;
}

/* The children in turn; a Conv2d or a Linear followed by a ReLU is one op (relu fused into it) */
static mlc_tensor *mlc__sequential_forward(mlc_module *m, mlc_tensor *x) {
    int i;
    for (i = 0; i < m->n_children && x; i++) {
        const mlc_module *c = m->children[i];
        int relu_next = i + 1 < m->n_children && m->children[i + 1]->forward == mlc__relu_forward
                        && x->ctx == m->ctx;
        if (relu_next && c->forward == mlc__conv2d_forward)
            x = mlc__conv2d(x, c->params[0], c->params[1], c->conv, 1), i++;
        else if (relu_next && c->forward == mlc__linear_forward)
            x = mlc__matmul("mlc_linear", x, c->params[0], 0, 1, c->n_params > 1 ? c->params[1] : NULL, 1),
            i++;
        else x = mlc_forward(m->children[i], x);
    }
    return x;
}

MLCDEF mlc_module *mlc_nn_sequential(mlc_ctx *ctx, ...) {
    mlc_module *m = mlc__module(ctx, "Sequential", mlc__sequential_forward), *child;
    va_list ap;
    char name[16];
    int i = 0, ok = m != NULL;
    va_start(ap, ctx);
    while ((child = va_arg(ap, mlc_module *)) != NULL) {   /* a NULL child (failed) ends the list early */
        mlc__format(name, sizeof name, "%d", i++);
        if (ok && mlc_module_add_child(m, name, child) != MLC_OK) ok = 0;
    }
    va_end(ap);
    if (ok && ctx->error) ok = 0;                          /* a child failed to build */
    return ok ? m : NULL;
}

/* ---- Recurrent layers (torch.nn.RNN, LSTM, GRU; batch first) ------------------------------
   Per layer and direction one matrix product projects the whole input sequence,
   gi = x W_ih^T + b_ih [B, T, G·H]; then each step t (from T - 1 down for the reverse direction)
   takes gh = h W_hh^T + b_hh [B, G·H] and the cell's maths:
     RNN   h' = tanh(gi + gh)                         (relu for MLC_CELL_RNN_RELU)
     LSTM  i, f, g, o = σ, σ, tanh, σ of the H-wide quarters of gi + gh
           c' = f c + i g;  h' = o tanh(c')
     GRU   r, z = σ of the first two H-wide thirds of gi + gh;  n = tanh(gi_n + r gh_n)
           h' = (1 - z) n + z h = n + z (h - n)
   The steps' h, side by side (and the two directions' outputs side by side), are the layer's
   output and the next layer's input. Everything is made of existing ops, so backpropagation
   through time, every device and the CPU fallback come with them. */
static int mlc__cell_gates(int cell) { return cell == MLC_CELL_LSTM ? 4 : cell == MLC_CELL_GRU ? 3 : 1; }

/* One step: gi, gh [B, G·H], h [B, H]; *c [B, H] is the LSTM's cell state (updated). */
static mlc_tensor *mlc__cell_step(int cell, int H, mlc_tensor *gi, mlc_tensor *gh, mlc_tensor *h,
                                  mlc_tensor **c) {
    mlc_tensor *s, *gates, *n;
    if (cell == MLC_CELL_RNN_TANH) return mlc_tanh(mlc_add(gi, gh));
    if (cell == MLC_CELL_RNN_RELU) return mlc_relu(mlc_add(gi, gh));
    if (cell == MLC_CELL_LSTM) {
        s = mlc_add(gi, gh);
        gates = mlc_sigmoid(s);                                  /* i, f and o (g's quarter unused) */
        *c = mlc_add(mlc_mul(mlc_slice(gates, 1, H, 2 * H), *c),
                     mlc_mul(mlc_slice(gates, 1, 0, H), mlc_tanh(mlc_slice(s, 1, 2 * H, 3 * H))));
        return mlc_mul(mlc_slice(gates, 1, 3 * H, 4 * H), mlc_tanh(*c));
    }
    gates = mlc_sigmoid(mlc_add(mlc_slice(gi, 1, 0, 2 * H), mlc_slice(gh, 1, 0, 2 * H)));    /* r, z */
    n = mlc_tanh(mlc_add(mlc_slice(gi, 1, 2 * H, 3 * H),
                         mlc_mul(mlc_slice(gates, 1, 0, H), mlc_slice(gh, 1, 2 * H, 3 * H))));
    return mlc_add(n, mlc_mul(mlc_slice(gates, 1, H, 2 * H), mlc_sub(h, n)));
}

/* An initial state: entry k of s [L·D, B, H], or zero when s is NULL. */
static mlc_tensor *mlc__rnn_state(mlc_tensor *s, int k, mlc_tensor *zero) {
    return s ? mlc_reshape(mlc_slice(s, 0, k, k + 1), 2, zero->shape) : zero;
}

MLCDEF mlc_tensor *mlc_rnn_forward(mlc_module *m, mlc_tensor *x, mlc_tensor *h0, mlc_tensor *c0,
                                   mlc_tensor **h_n, mlc_tensor **c_n) {
    mlc_ctx *ctx = m ? m->ctx : x ? x->ctx : NULL;
    mlc_tensor **steps, **finals, *zero, *out = x, *gi, *h, *c = NULL, *outs[2];
    int L, D, B, T, F, H, G, l, d, t, k, lstm, bh[2], bgh[2], bth[3], lbh[3];
    if (h_n) *h_n = NULL;
    if (c_n) *c_n = NULL;
    if (!m || !x)
        return (mlc_tensor *)mlc__fail(ctx, MLC_ERR_NULL, "mlc_rnn_forward: %s is NULL",
                                       m ? "the input" : "the module");
    if (!MLC__ARGS_OK(ctx, "mlc_rnn_forward", x, h0, c0)) return NULL;
    if (!m->cell)
        return (mlc_tensor *)mlc__fail(ctx, MLC_ERR_ARG, "mlc_rnn_forward: %s is not an RNN, LSTM or GRU",
                                       m->type);
    if (m->cell < MLC_CELL_RNN_TANH || m->cell > MLC_CELL_GRU || (m->directions != 1 && m->directions != 2)
        || m->n_children < 1 || m->n_children % m->directions)   /* fields the user may have changed */
        return (mlc_tensor *)mlc__fail(ctx, MLC_ERR_ARG, "mlc_rnn_forward: %s's cell %d, directions %d or "
                                       "layers (%d children) are not valid", m->type, m->cell, m->directions,
                                       m->n_children);
    if (!mlc__in_range(ctx, "mlc_rnn_forward", "dropout (field alpha)", m->alpha, 0.0f, 1.0f, 0)) return NULL;
    lstm = m->cell == MLC_CELL_LSTM;
    D = m->directions; L = m->n_children / D; G = mlc__cell_gates(m->cell);
    if (m->children[0]->n_params != 4 || m->children[0]->params[0]->ndim != 2
        || m->children[0]->params[1]->ndim != 2)
        return (mlc_tensor *)mlc__fail(ctx, MLC_ERR_ARG, "mlc_rnn_forward: %s's layer 0 was changed",
                                       m->type);
    F = m->children[0]->params[0]->shape[1]; H = m->children[0]->params[1]->shape[1];
    for (l = 0; l < L * D; l++) {            /* each layer: W_ih [G·H, in], W_hh [G·H, H], biases [G·H] */
        const mlc_module *c = m->children[l];
        int in = l < D ? F : D * H;
        if (c->n_params != 4 || c->params[0]->ndim != 2 || c->params[0]->shape[0] != G * H
            || c->params[0]->shape[1] != in || c->params[1]->ndim != 2 || c->params[1]->shape[0] != G * H
            || c->params[1]->shape[1] != H || c->params[2]->ndim != 1 || c->params[2]->shape[0] != G * H
            || c->params[3]->ndim != 1 || c->params[3]->shape[0] != G * H)
            return (mlc_tensor *)mlc__fail(ctx, MLC_ERR_ARG, "mlc_rnn_forward: %s's layer %d (direction %d) "
                                           "does not fit cell %d with hidden_size %d (field cell or its "
                                           "tensors changed)", m->type, l / D, l % D, m->cell, H);
    }
    if (x->ctx != ctx || (h0 && h0->ctx != ctx) || (c0 && c0->ctx != ctx))
        return (mlc_tensor *)mlc__fail(ctx, MLC_ERR_ARG, "mlc_rnn_forward: a tensor belongs to another "
                                       "context than %s", m->type);
    if (ctx->error) return NULL;
    if (c0 && !lstm)
        return (mlc_tensor *)mlc__fail(ctx, MLC_ERR_ARG, "mlc_rnn_forward: c0 given to %s (LSTM only)",
                                       m->type);
    if (x->ndim != 3 || x->shape[1] < 1 || x->shape[2] != F)
        return (mlc_tensor *)mlc__fail(ctx, MLC_ERR_SHAPE, "mlc_rnn_forward: input %T does not fit %s with "
                                       "input_size %d (want [B, T >= 1, %d])", x, m->type, F, F);
    B = x->shape[0]; T = x->shape[1];
    bh[0] = bgh[0] = bth[0] = lbh[1] = B;            /* shapes [B, H], [B, G·H], [B, T, H], [L·D, B, H] */
    bh[1] = bth[2] = lbh[2] = H; bgh[1] = G * H; bth[1] = T; lbh[0] = L * D;
    for (k = 0; k < 2; k++) {
        mlc_tensor *s = k ? c0 : h0;
        if (s && (s->ndim != 3 || s->shape[0] != L * D || s->shape[1] != B || s->shape[2] != H))
            return (mlc_tensor *)mlc__fail(ctx, MLC_ERR_SHAPE, "mlc_rnn_forward: %s %T does not fit %s "
                                           "(want [%d, %d, %d])", k ? "c0" : "h0", s, m->type, L * D, B, H);
    }
    steps = (mlc_tensor **)mlc__arena_alloc(ctx, sizeof(mlc_tensor *) * ((size_t)T + 2 * (size_t)(L * D)),
                                            "mlc_rnn_forward");
    zero = mlc_to(mlc_zeros(ctx, 2, bh), x->on_device);
    if (!steps || !zero) return NULL;
    finals = steps + T;                                          /* h of each layer, then c */
    for (l = 0; l < L && !ctx->error; l++) {
        for (d = 0; d < D; d++) {
            mlc_tensor *const *p = m->children[l * D + d]->params;   /* W_ih, W_hh, b_ih, b_hh */
            h = mlc__rnn_state(h0, l * D + d, zero);
            if (lstm) c = mlc__rnn_state(c0, l * D + d, zero);
            gi = mlc_linear(out, p[0], p[2]);
            for (k = 0; k < T; k++) {
                mlc_tensor *gi_t;
                t = d ? T - 1 - k : k;
                gi_t = mlc_reshape(mlc_slice(gi, 1, t, t + 1), 2, bgh);
                h = steps[t] = mlc__cell_step(m->cell, H, gi_t, mlc_linear(h, p[1], p[3]), h, &c);
            }
            finals[l * D + d] = h; finals[L * D + l * D + d] = c;
            outs[d] = mlc_reshape(mlc_concat(ctx, steps, T, 1), 3, bth);   /* [B, T·H] is [B, T, H] */
        }
        out = D == 1 ? outs[0] : mlc_concat(ctx, outs, D, 2);
        if (m->alpha > 0 && l < L - 1) out = mlc_dropout(out, m->alpha, m->training);
    }
    if (ctx->error) return NULL;
    if (h_n) *h_n = mlc_reshape(mlc_concat(ctx, finals, L * D, 0), 3, lbh);
    if (c_n && lstm) *c_n = mlc_reshape(mlc_concat(ctx, finals + L * D, L * D, 0), 3, lbh);
    return ctx->error ? NULL : out;
}

static mlc_tensor *mlc__rnn_module_forward(mlc_module *m, mlc_tensor *x) {
    return mlc_rnn_forward(m, x, NULL, NULL, NULL, NULL);
}

/* The module, with a child per layer and direction named "" (so that its tensors carry
   PyTorch's flat names), in PyTorch's order: l0, l0_reverse, l1, ... */
MLCDEF mlc_module *mlc_nn_recurrent(mlc_ctx *ctx, mlc_cell cell, int in, int hidden, mlc_rnn_opts opts) {
    static const char *const kinds[] = { "weight_ih", "weight_hh", "bias_ih", "bias_hh" };
    static const char *const types[] = { "", "RNN", "RNN", "LSTM", "GRU" };
    int l, d, k, shape[2], D = opts.bidirectional ? 2 : 1, G = mlc__cell_gates((int)cell);
    int layers = opts.num_layers ? opts.num_layers : 1;
    mlc_module *m, *layer;
    char name[40];
    mlc_tensor *p;
    if (!ctx || ctx->error) return NULL;
    if (cell < MLC_CELL_RNN_TANH || cell > MLC_CELL_GRU || in < 1 || hidden < 1 || layers < 1 ||
        hidden > 2147483647 / (G * D) || layers > 2147483647 / D)
        return (mlc_module *)mlc__fail(ctx, MLC_ERR_ARG, "mlc_nn_recurrent: cell %d, input_size %d, "
                                       "hidden_size %d, num_layers %d are not valid", (int)cell, in, hidden,
                                       layers);
    if (!mlc__in_range(ctx, "mlc_nn_recurrent", "dropout", opts.dropout, 0.0f, 1.0f, 0)) return NULL;
    {   /* the whole model counted first (values, gradients, the layers' structs): absurd sizes are
           refused before anything is made, not after hours of building */
        const size_t gh = (size_t)G * (size_t)hidden;
        size_t first, later, floats, structs, bytes;
        int ok = mlc__size(gh, (size_t)in + (size_t)hidden + 2, 0, &first)          /* layer 0's */
                 && mlc__size(gh, (size_t)D * (size_t)hidden + (size_t)hidden + 2, 0, &later)
                 && mlc__size(later, (size_t)layers - 1, first, &floats)            /* one direction's */
                 && mlc__size((size_t)layers, sizeof(mlc_module) + 256, 0, &structs)
                 && mlc__size(floats, 2 * sizeof(float), structs, &bytes)
                 && mlc__size(bytes, (size_t)D, 0, &bytes);
        void *probe = ok && bytes >> 20 < (size_t)1 << 20 ? mlc__heap_alloc(ctx, bytes) : NULL;   /* 1 TiB */
        if (!probe)
            return (mlc_module *)mlc__fail(ctx, MLC_ERR_MEMORY, "mlc_nn_recurrent: %d layers of hidden_size "
                                           "%d need more %s", layers, hidden,
                                           ok ? "memory than the allocator gives (or 1 TiB)"
                                              : "bytes than size_t counts");
        mlc__heap_free(ctx, probe);
    }
    if (!(m = mlc__module(ctx, types[cell], mlc__rnn_module_forward))) return NULL;
    m->cell = (int)cell; m->directions = D; m->alpha = opts.dropout;
    for (l = 0; l < layers; l++)
        for (d = 0; d < D; d++) {
            layer = mlc__module(ctx, types[cell], NULL);
            if (!layer || mlc_module_add_child(m, "", layer) != MLC_OK) return NULL;
            for (k = 0; k < 4; k++) {
                shape[0] = G * hidden; shape[1] = k ? hidden : l ? D * hidden : in;
                mlc__format(name, sizeof name, "%s_l%d%s", kinds[k], l, d ? "_reverse" : "");
                if (!(p = mlc__param(layer, name, k < 2 ? 2 : 1, shape))) return NULL;
                mlc_init_uniform(p, -1.0f / sqrtf((float)hidden), 1.0f / sqrtf((float)hidden));
            }
        }
    return m;
}
static mlc_module *mlc__nn_cell(mlc_ctx *ctx, mlc_cell cell, int in, int hidden, int layers) {
    mlc_rnn_opts opts;
    memset(&opts, 0, sizeof opts);
    opts.num_layers = layers;
    return mlc_nn_recurrent(ctx, cell, in, hidden, opts);
}
MLCDEF mlc_module *mlc_nn_rnn(mlc_ctx *ctx, int in, int hidden, int layers) {
    return mlc__nn_cell(ctx, MLC_CELL_RNN_TANH, in, hidden, layers);
}
MLCDEF mlc_module *mlc_nn_rnn_relu(mlc_ctx *ctx, int in, int hidden, int layers) {
    return mlc__nn_cell(ctx, MLC_CELL_RNN_RELU, in, hidden, layers);
}
MLCDEF mlc_module *mlc_nn_lstm(mlc_ctx *ctx, int in, int hidden, int layers) {
    return mlc__nn_cell(ctx, MLC_CELL_LSTM, in, hidden, layers);
}
MLCDEF mlc_module *mlc_nn_gru(mlc_ctx *ctx, int in, int hidden, int layers) {
    return mlc__nn_cell(ctx, MLC_CELL_GRU, in, hidden, layers);
}

MLCDEF void mlc_module_train(mlc_module *m, int training) {
    int i;
    if (!m || !mlc__module_walkable(m, "mlc_module_train")) return;
    m->training = training != 0;
    for (i = 0; i < m->n_children; i++) mlc_module_train(m->children[i], training);
}

MLCDEF mlc_result mlc_module_to(mlc_module *m, int on_device) {
    int i;
    if (!m) return MLC_ERR_NULL;
    if (!mlc__module_walkable(m, "mlc_module_to")) return m->ctx->error;
    for (i = 0; i < m->n_params; i++) if (!mlc_to(m->params[i], on_device)) return m->ctx->error;
    for (i = 0; i < m->n_buffers; i++) if (!mlc_to(m->buffers[i], on_device)) return m->ctx->error;
    for (i = 0; i < m->n_children; i++)
        if (mlc_module_to(m->children[i], on_device) != MLC_OK) return m->ctx->error;
    return MLC_OK;
}

/* t's values in dtype, in storage of their own (the old freed) */
static int mlc__convert_storage(mlc_tensor *t, mlc_scalar_type dtype) {
    mlc_ctx *ctx = t->ctx;
    const int on_device = t->on_device;
    void *values;
    if (t->dtype == dtype || t->dtype == MLC_I8) return 1;   /* (int8 stays: PyTorch's .to converts floats) */
    if (t->read_only || !t->persistent) {
        mlc__fail(ctx, MLC_ERR_STATE, "mlc_module_to_dtype: tensor %T %s", t,
                  t->read_only ? "wraps read-only memory (mlc_from_const)" : "is not long-lived");
        return 0;
    }
    if (on_device && !mlc_to(t, 0)) return 0;           /* converted on the host, then back */
    if (!(values = mlc__owned_alloc(ctx, t->size * (dtype == MLC_F32 ? 4 : 2) + 1, "mlc_module_to_dtype")))
        return 0;
    if (dtype == MLC_F32) mlc__widen(t->dtype, t->half, (float *)values, t->size);
    else if (t->dtype == MLC_F32) mlc__narrow(dtype, t->data, (uint16_t *)values, t->size);
    else {                                               /* bf16 <-> f16: through float32, exact */
        size_t i;
        for (i = 0; i < t->size; i++)
            ((uint16_t *)values)[i] = dtype == MLC_BF16 ? mlc_float_to_bf16(mlc__value(t, i))
                                                          : mlc_float_to_f16(mlc__value(t, i));
    }
    mlc__owned_free(ctx, mlc__storage(t));
    mlc__drop_packed(t);
    t->dtype = dtype;
    t->data = dtype == MLC_F32 ? (float *)values : NULL;
    t->half = dtype == MLC_F32 ? NULL : (uint16_t *)values;
    if (dtype != MLC_F32 && t->grad) { mlc__owned_free(ctx, t->grad); t->grad = NULL; }
    return (dtype != MLC_F32 || !t->requires_grad || mlc__alloc_grad(t, "mlc_module_to_dtype"))
           && (!on_device || mlc_to(t, 1));
}

/* Whether t holds the scales of one of m's int8 parameters */
static int mlc__scales_of_int8(const mlc_module *m, const mlc_tensor *t) {
    int i;
    for (i = 0; i < m->n_params; i++) if (m->params[i]->qscales == t) return 1;
    return 0;
}

MLCDEF mlc_result mlc_module_to_dtype(mlc_module *m, mlc_scalar_type dtype) {
    int i;
    if (!m) return MLC_ERR_NULL;
    if (m->ctx->error || !mlc__module_walkable(m, "mlc_module_to_dtype")) return m->ctx->error;
    if ((unsigned)dtype > (unsigned)MLC_F16) {
        mlc__fail(m->ctx, MLC_ERR_ARG, "mlc_module_to_dtype: %d is not a dtype", (int)dtype);
        return m->ctx->error;
    }
    for (i = 0; i < m->n_params; i++) if (!mlc__convert_storage(m->params[i], dtype)) return m->ctx->error;
    for (i = 0; i < m->n_buffers; i++)   /* (a count stays float32: PyTorch's is int64; int8 scales too) */
        if (strcmp(m->buffer_names[i], "num_batches_tracked") != 0 && !mlc__scales_of_int8(m, m->buffers[i])
            && !mlc__convert_storage(m->buffers[i], dtype))
            return m->ctx->error;
    for (i = 0; i < m->n_children; i++)
        if (mlc_module_to_dtype(m->children[i], dtype) != MLC_OK) return m->ctx->error;
    return MLC_OK;
}

/* Parameter `index` of m (a product's weight) quantized in place (mlc_quantize_weight's scheme):
   int8 storage, the float one freed, and its scales in a new buffer named after it ("weight"'s
   "weight_scale"). The values are read in the caller's frame. */
static int mlc__quantize_param(mlc_module *m, int index) {
    mlc_ctx *ctx = m->ctx;
    mlc_tensor *w = m->params[index], *scales;
    const size_t rows = (size_t)w->shape[0], length = strlen(m->param_names[index]);
    const int on_device = w->on_device;
    const float *v;
    int8_t *q = NULL;
    char *name;
    if (w->dtype == MLC_I8) return 1;                    /* quantized before */
    if (on_device && !mlc_to(w, 0)) return 0;           /* quantized on the host, then back */
    if (!(v = mlc__host(w)) || !(scales = mlc__new(ctx, "mlc_quantize_dynamic", 1, w->shape, 1))) return 0;
    if ((name = (char *)mlc__owned_alloc(ctx, length + sizeof "_scale", "mlc_quantize_dynamic")) != NULL) {
        memcpy(name, m->param_names[index], length);
        memcpy(name + length, "_scale", sizeof "_scale");
    }
    if (!name || !(q = (int8_t *)mlc__owned_alloc(ctx, w->size + 1, "mlc_quantize_dynamic"))
        || !mlc__quantize_rows(ctx, "mlc_quantize_dynamic", w, v, rows, rows ? w->size / rows : 0, q,
                               scales->data)
        || mlc__module_add(m, name, scales, 1) != MLC_OK) {
        if (q) mlc__owned_free(ctx, q);
        if (!scales->owner) mlc_tensor_free(scales);
        return 0;
    }
    if (!w->read_only) mlc__owned_free(ctx, mlc__storage(w));
    if (w->grad) mlc__owned_free(ctx, w->grad);
    mlc__drop_packed(w);
    w->data = w->grad = NULL;
    w->half = NULL;
    w->int8 = q;
    w->dtype = MLC_I8;
    w->qscales = scales;
    w->qscale = 1.0f;
    w->qzero = 0;
    w->requires_grad = w->read_only = 0;
    w->stale = 0;
    return mlc__int8_keep_sums(w) && (!on_device || (mlc_to(w, 1) && mlc_to(scales, 1)));
}

/* A Linear's weight; a recurrent layer's children's weight_ih and weight_hh (its products) */
static int mlc__quantize_dynamic(mlc_module *m, int recurrent) {
    int i;
    if (m->forward == mlc__linear_forward && !mlc__quantize_param(m, 0)) return 0;
    if (recurrent && (!mlc__quantize_param(m, 0) || !mlc__quantize_param(m, 1))) return 0;
    for (i = 0; i < m->n_children; i++)
        if (!mlc__quantize_dynamic(m->children[i], m->forward == mlc__rnn_module_forward)) return 0;
    return 1;
}
MLCDEF mlc_result mlc_quantize_dynamic(mlc_module *m) {
    mlc_frame f;
    if (!m) return MLC_ERR_NULL;
    if (m->ctx->error || !mlc__module_walkable(m, "mlc_quantize_dynamic")) return m->ctx->error;
    f = mlc_frame_begin(m->ctx);
    mlc__quantize_dynamic(m, 0);
    mlc_frame_end(f);
    return m->ctx->error;
}

/* ---- Static quantization of a Sequential (mlc_quantize_static) ------------------------------
   Each child's output range is observed on the calibration batches (float32, eval mode), then
   the child runs in int8: Conv2d and Linear as mlc_conv2d_int8 / mlc_linear_int8 (a BatchNorm
   right after a Conv2d folded into it first, a ReLU right after observed with it, so the range
   [0, max] is the activation), pooling and Flatten on int8 as they are; any other child runs in
   float32 between a dequantize and a quantize at its observed range (PyTorch's DeQuantStub /
   QuantStub around a float module). A range [lo, hi] (0 included) gives scale (hi - lo) / 255
   and zero point -128 - round(lo / scale). The Sequential keeps "input_scale" and
   "input_zero_point", each child "scale" and "zero_point" (float32, [1]).
   --------------------------------------------------------------------------------------------- */

/* BatchNorm bn (eval) folded into Conv2d conv, per output:
   w' = w γ/√(var + ε),  b' = (b - mean) γ/√(var + ε) + β */
static int mlc__fold_batch_norm(mlc_module *conv, mlc_module *bn) {
    mlc_ctx *ctx = conv->ctx;
    mlc_tensor *w = conv->params[0], *bias = conv->n_params > 1 ? conv->params[1] : NULL;
    const int out = w->shape[0];
    const size_t per = w->size / (size_t)out;
    const float *gamma = mlc__host(bn->params[0]), *beta = mlc__host(bn->params[1]);
    const float *mean = mlc__host(bn->buffers[0]), *var = mlc__host(bn->buffers[1]);
    float *wd = mlc__floats(ctx, w->size + 1, "mlc_quantize_static"),
          *bd = mlc__floats(ctx, (size_t)out + 1, "mlc_quantize_static");
    int o;
    size_t k;
    if (!gamma || !beta || !mean || !var || !wd || !bd || mlc_read(w, wd, w->size) != MLC_OK) return 0;
    if (bias && mlc_read(bias, bd, (size_t)out) != MLC_OK) return 0;
    if (!bias) {
        memset(bd, 0, (size_t)out * sizeof(float));
        if (!(bias = mlc_parameter(ctx, 1, &out)) || mlc_module_add_param(conv, "bias", bias) != MLC_OK)
            return 0;
    }
    for (o = 0; o < out; o++) {
        const float s = gamma[o] / MLC_SQRTF(var[o] + bn->eps);
        for (k = 0; k < per; k++) wd[(size_t)o * per + k] *= s;
        bd[o] = (bd[o] - mean[o]) * s + beta[o];
    }
    return mlc_write(w, wd, w->size) == MLC_OK && mlc_write(bias, bd, (size_t)out) == MLC_OK;
}

static mlc_tensor *mlc__identity_forward(mlc_module *m, mlc_tensor *x) { (void)m; return x; }

/* A quantized child's output scale or zero point (the Sequential's: its input's), by name */
static float mlc__qparam(const mlc_module *m, const char *name) {
    int i;
    for (i = 0; i < m->n_buffers; i++)
        if (!strcmp(m->buffer_names[i], name)) return mlc_get(m->buffers[i], 0);
    return NAN;                                          /* (not quantized: the op refuses the scale) */
}

static mlc_tensor *mlc__qconv_forward(mlc_module *m, mlc_tensor *x) {
    return mlc_conv2d_int8(x, m->params[0], m->n_params > 1 ? m->params[1] : NULL, m->conv,
                           mlc__qparam(m, "scale"), (int)mlc__qparam(m, "zero_point"));
}
static mlc_tensor *mlc__qlinear_forward(mlc_module *m, mlc_tensor *x) {
    return mlc_linear_int8(x, m->params[0], m->n_params > 1 ? m->params[1] : NULL, mlc__qparam(m, "scale"),
                           (int)mlc__qparam(m, "zero_point"));
}
/* ReLU after a product observed with it: the product's clamp did it (zero point -128); else max(q, z) */
static mlc_tensor *mlc__qrelu_forward(mlc_module *m, mlc_tensor *x) {
    mlc_tensor *y;
    size_t i;
    (void)m;
    if (!x || x->dtype != MLC_I8 || x->qzero == -128) return x;
    if (!(y = mlc__int8_result(x->ctx, "mlc_relu", x, x->ndim, x->shape, x->qscale, x->qzero))) return NULL;
    mlc__host_sync(x);
    for (i = 0; i < x->size; i++) y->int8[i] = x->int8[i] > x->qzero ? x->int8[i] : (int8_t)x->qzero;
    return y;
}

/* Whether child c runs on int8 as it is (pooling, flatten, dropout in eval, the folded BatchNorm) */
static int mlc__int8_as_is(const mlc_module *c) {
    return c->forward == mlc__max_pool_forward || c->forward == mlc__avg_pool_forward
           || c->forward == mlc__gap_forward || c->forward == mlc__flatten_forward
           || c->forward == mlc__identity_forward || c->forward == mlc__qconv_forward
           || c->forward == mlc__qlinear_forward || c->forward == mlc__qrelu_forward;
}

static mlc_tensor *mlc__qsequential_forward(mlc_module *m, mlc_tensor *x) {
    int i;
    x = mlc_quantize(x, mlc__qparam(m, "input_scale"), (int)mlc__qparam(m, "input_zero_point"));
    for (i = 0; i < m->n_children && x; i++) {
        mlc_module *c = m->children[i];
        if (c->forward == mlc__dropout_forward) continue;                     /* (eval: the identity) */
        x = mlc__int8_as_is(c) ? mlc_forward(c, x)
                               : mlc_quantize(mlc_forward(c, mlc_dequantize(x)), mlc__qparam(c, "scale"),
                                              (int)mlc__qparam(c, "zero_point"));
    }
    return mlc_dequantize(x);
}

/* [lo, hi] as a scale and a zero point, into two new buffers of m ("scale", "zero_point", or with prefix) */
static int mlc__add_qparams(mlc_module *m, const char *scale_name, const char *zero_name, float lo,
                            float hi) {
    static const int one = 1;
    mlc_tensor *s = mlc__new(m->ctx, "mlc_quantize_static", 1, &one, 1);
    mlc_tensor *z = mlc__new(m->ctx, "mlc_quantize_static", 1, &one, 1);
    float scale;
    int32_t zero;
    lo = lo < 0.0f ? lo : 0.0f;
    hi = hi > 0.0f ? hi : 0.0f;
    scale = hi > lo ? (hi - lo) / 255.0f : 1.0f;
    zero = -128 - mlc__round_even(lo / scale);
    if (!s || !z) return 0;
    s->data[0] = scale;
    z->data[0] = (float)(zero < -128 ? -128 : zero > 127 ? 127 : zero);
    return mlc__module_add(m, scale_name, s, 1) == MLC_OK && mlc__module_add(m, zero_name, z, 1) == MLC_OK;
}

/* The range of t's values into [*lo, *hi] (widened) */
static int mlc__observe(mlc_tensor *t, float *lo, float *hi) {
    const float *v = t ? mlc__host(t) : NULL;
    size_t i;
    if (!v) return 0;
    for (i = 0; i < t->size; i++) {
        *lo = v[i] < *lo ? v[i] : *lo;
        *hi = v[i] > *hi ? v[i] : *hi;
    }
    return 1;
}

/* Histogram bins per observed range (the percentile observer) */
#define MLC__QUANT_BINS 2048
/* The values of t counted into bins over [lo, hi] */
static int mlc__histogram(mlc_tensor *t, float lo, float hi, double *bins) {
    const float *v = t ? mlc__host(t) : NULL;
    const float per = hi > lo ? (float)MLC__QUANT_BINS / (hi - lo) : 0.0f;
    size_t i;
    if (!v) return 0;
    for (i = 0; i < t->size; i++) {
        const float at = (v[i] - lo) * per;
        bins[at >= (float)MLC__QUANT_BINS ? MLC__QUANT_BINS - 1 : at > 0.0f ? (int)at : 0] += 1.0;
    }
    return 1;
}
/* [*lo, *hi] narrowed to where the share `tail` of the histogram's values lies outside: half
   below and half above, or all above for a range that starts at 0 */
static void mlc__clip_range(const double *bins, double tail, float *lo, float *hi) {
    const float start = *lo, width = (*hi - *lo) / (float)MLC__QUANT_BINS;
    double total = 0.0, low_tail, high_tail, seen;
    int a, b;
    for (a = 0; a < MLC__QUANT_BINS; a++) total += bins[a];
    low_tail = start < 0.0f ? total * tail / 2.0 : 0.0;
    high_tail = total * tail - low_tail;
    for (a = 0, seen = 0.0; a < MLC__QUANT_BINS - 1 && seen + bins[a] <= low_tail; a++) seen += bins[a];
    for (b = MLC__QUANT_BINS - 1, seen = 0.0; b > a && seen + bins[b] <= high_tail; b--) seen += bins[b];
    *lo = start + width * (float)a;                      /* (mlc__add_qparams puts 0 back in) */
    *hi = start + width * (float)(b + 1);
}

MLCDEF mlc_result mlc_quantize_static(mlc_module *m, mlc_tensor *const *calibration, int count) {
    return mlc_quantize_static_opts(m, calibration, count, mlc_quant_defaults());
}

MLCDEF mlc_result mlc_quantize_static_opts(mlc_module *m, mlc_tensor *const *calibration, int count,
                                           mlc_quant_opts opts) {
    static const char *const op = "mlc_quantize_static";
    mlc_ctx *ctx;
    float *lo = NULL, *hi = NULL;
    int i, b, n;
    mlc_frame f;
    if (!m) return MLC_ERR_NULL;
    ctx = m->ctx;
    if (ctx->error || !mlc__module_walkable(m, op)) return ctx->error;
    if (m->forward != mlc__sequential_forward)
        return mlc__fail(ctx, MLC_ERR_ARG,
                         "%s: the model is a %s: a Sequential (mlc_nn_sequential) is quantized", op, m->type),
               ctx->error;
    if (!calibration || count < 1)
        return mlc__fail(ctx, MLC_ERR_ARG,
                         "%s: no calibration batches: the activations' ranges come from them", op),
               ctx->error;
    for (b = 0; b < count; b++)
        if (!MLC__ARGS_OK(ctx, op, calibration[b])) return ctx->error;
    if (!(opts.percentile == 0.0f || (opts.percentile >= 50.0f && opts.percentile <= 100.0f)))
        return mlc__fail(ctx, MLC_ERR_ARG, "%s: percentile %g is not 0 (min and max) or in [50, 100]", op,
                         (double)opts.percentile), ctx->error;
    n = m->n_children;
    mlc_module_train(m, 0);
    f = mlc_frame_begin(ctx);
    lo = mlc__floats(ctx, (size_t)n + 2, op);
    hi = mlc__floats(ctx, (size_t)n + 2, op);
    for (i = 0; lo && hi && i < n; i++) {        /* folds: a BatchNorm into the Conv2d or Linear before it */
        mlc_module *c = m->children[i], *next = i + 1 < n ? m->children[i + 1] : NULL;
        if ((c->forward == mlc__conv2d_forward || c->forward == mlc__linear_forward) && next
            && next->forward == mlc__batch_norm_forward
            && next->params[0]->size == (size_t)c->params[0]->shape[0]) {   /* (its features: c's outputs) */
            if (!mlc__fold_batch_norm(c, next)) break;
            next->forward = mlc__identity_forward;
        }
    }
    for (i = 0; lo && hi && i <= n; i++) lo[i] = hi[i] = 0.0f;
    for (b = 0; lo && hi && !ctx->error && b < count;
         b++) { /* the ranges: [0] the input, [i + 1] child i's */
        mlc_frame batch = mlc_frame_begin(ctx);
        mlc_tensor *x = calibration[b];
        mlc__observe(x, &lo[0], &hi[0]);
        for (i = 0; i < n && x; i++) {
            x = mlc_forward(m->children[i], x);
            mlc__observe(x, &lo[i + 1], &hi[i + 1]);
        }
        mlc_frame_end(batch);
    }
    if (opts.percentile != 0.0f && opts.percentile != 100.0f && lo && hi && !ctx->error) {
        const size_t bytes = ((size_t)n + 1) * MLC__QUANT_BINS * sizeof(double);
        double *bins = (double *)mlc__arena_alloc(ctx, bytes, op);
        if (bins) memset(bins, 0, bytes);
        for (b = 0; bins && !ctx->error && b < count; b++) {  /* again, counting into the histograms */
            mlc_frame batch = mlc_frame_begin(ctx);
            mlc_tensor *x = calibration[b];
            mlc__histogram(x, lo[0], hi[0], bins);
            for (i = 0; i < n && x; i++) {
                x = mlc_forward(m->children[i], x);
                mlc__histogram(x, lo[i + 1], hi[i + 1], bins + (size_t)(i + 1) * MLC__QUANT_BINS);
            }
            mlc_frame_end(batch);
        }
        for (i = 0; bins && i <= n; i++)
            mlc__clip_range(bins + (size_t)i * MLC__QUANT_BINS, (100.0 - (double)opts.percentile) / 100.0,
                            &lo[i], &hi[i]);
    }
    for (i = n - 1; lo && hi && !ctx->error && i >= 0; i--) {   /* a ReLU's range is its product's too */
        mlc_module *c = m->children[i];
        int j = i + 1;                                   /* (past a BatchNorm folded into c) */
        while (j < n && m->children[j]->forward == mlc__identity_forward) j++;
        if ((c->forward == mlc__conv2d_forward || c->forward == mlc__linear_forward) && j < n
            && m->children[j]->forward == mlc__relu_forward)
            lo[i + 1] = lo[j + 1], hi[i + 1] = hi[j + 1];
    }
    if (lo && hi && !ctx->error && mlc__add_qparams(m, "input_scale", "input_zero_point", lo[0], hi[0]))
        for (i = 0; i < n && !ctx->error; i++) {
            mlc_module *c = m->children[i];
            if (c->forward == mlc__identity_forward || c->forward == mlc__dropout_forward) continue;
            if (!mlc__add_qparams(c, "scale", "zero_point", lo[i + 1], hi[i + 1])) break;
            if (c->forward == mlc__conv2d_forward || c->forward == mlc__linear_forward) {
                if (!mlc__quantize_param(c, 0)) break;
                c->forward = c->forward == mlc__conv2d_forward ? mlc__qconv_forward : mlc__qlinear_forward;
            } else if (c->forward == mlc__relu_forward)
                c->forward = mlc__qrelu_forward;
        }
    mlc_frame_end(f);
    if (!ctx->error) m->forward = mlc__qsequential_forward;
    return ctx->error;
}

/* A name that does not fit mlc_named_tensor's 127 bytes is an error, never cut short (two cut
   names could match one entry of a file). long: a prefix that did not fit either. */
static int mlc__name_fits(mlc_module *m, char *out, const char *prefix, int long_prefix, const char *name) {
    size_t n = strlen(prefix) + strlen(name);
    mlc__format(out, 128, "%s%s", prefix, name);
    if (n < 128 && !long_prefix) return 1;
    mlc__fail(m->ctx, MLC_ERR_ARG, "mlc_module_state: the name \"%s...\" (%s \"%s\") is longer than the "
              "127 bytes of mlc_named_tensor; use shorter names", out, m->type, name);
    return 0;
}

static int mlc__collect(mlc_module *m, const char *prefix, int long_prefix, int with_buffers,
                        mlc_named_tensor *out, int max, int count) {
    int i, fits;
    char name[128];
    for (i = 0; i < m->n_params; i++, count++)
        if (count < max) {
            mlc__name_fits(m, out[count].name, prefix, long_prefix, m->param_names[i]);
            out[count].tensor = m->params[i];
        }
    for (i = 0; with_buffers && i < m->n_buffers; i++, count++)
        if (count < max) {
            mlc__name_fits(m, out[count].name, prefix, long_prefix, m->buffer_names[i]);
            out[count].tensor = m->buffers[i];
        }
    for (i = 0; i < m->n_children; i++) {
        size_t n = strlen(prefix) + strlen(m->child_names[i]) + (m->child_names[i][0] ? 1 : 0);
        fits = n < sizeof name && !long_prefix;
        mlc__format(name, sizeof name, "%s%s%s", prefix, m->child_names[i], m->child_names[i][0] ? "." : "");
        count = mlc__collect(m->children[i], name, !fits, with_buffers, out, max, count);
    }
    return count;
}
MLCDEF int mlc_module_parameters(mlc_module *m, mlc_named_tensor *out, int max) {
    if (!m || !mlc__module_walkable(m, "mlc_module_parameters")) return 0;
    return mlc__collect(m, "", 0, 0, out, out ? max : 0, 0);
}
MLCDEF int mlc_module_state(mlc_module *m, mlc_named_tensor *out, int max) {
    if (!m || !mlc__module_walkable(m, "mlc_module_state")) return 0;
    return mlc__collect(m, "", 0, 1, out, out ? max : 0, 0);
}

MLCDEF size_t mlc_module_param_count(mlc_module *m) {
    size_t n = 0;
    int i;
    if (!m || !mlc__module_walkable(m, "mlc_module_param_count")) return 0;
    for (i = 0; i < m->n_params; i++) n += m->params[i]->size;
    for (i = 0; i < m->n_children; i++) n += mlc_module_param_count(m->children[i]);
    return n;
}

/* ============================================================================================
   @section optim  Optimisers (PyTorch's update rules; g = gradient, p = parameter, t = step number)
     SGD      g += wd p;  b = μ b + (1 - τ) g (b = g at t = 1);  g = nesterov ? g + μ b : b;  p -= lr g
     Adam     g += wd p;  m = β1 m + (1-β1) g;  v = β2 v + (1-β2) g²;
              p -= lr m/(1-β1^t) / (√(v/(1-β2^t)) + eps)
     AdamW    p -= lr wd p first; then Adam without the g += wd p
     RMSprop  g += wd p;  v = α v + (1-α) g²;  a = √(v - ḡ²) + eps (centered, ḡ = α ḡ + (1-α) g)
              or √v + eps;  with momentum: b = μ b + g/a, p -= lr b;  else p -= lr g/a
   ============================================================================================ */

typedef enum { MLC__SGD, MLC__ADAM, MLC__ADAMW, MLC__RMSPROP } mlc__optim_kind;

static const char *const mlc__optim_kind_names[] = { "sgd", "adam", "adamw", "rmsprop" };
static const char *const mlc__optim_owner_names[] = { "an SGD optimiser", "an Adam optimiser",
                                                      "an AdamW optimiser", "an RMSprop optimiser" };
static const char *const mlc__optim_slot_names[4][3] = {   /* PyTorch's names for state[3 i + k] */
    { "momentum_buffer", NULL, NULL }, { "exp_avg", "exp_avg_sq", "max_exp_avg_sq" },
    { "exp_avg", "exp_avg_sq", "max_exp_avg_sq" }, { "momentum_buffer", "square_avg", "grad_avg" } };

struct mlc_optim {
    mlc_ctx *ctx;
    mlc__optim_kind kind;
    int count, capacity;
    mlc_tensor **params;
    mlc_tensor **state;                 /* three slots per parameter: state[3 i + k], NULL when unused */
    long long t;
    float lr, beta1, beta2, eps, weight_decay, momentum, dampening;
    int nesterov, centered, amsgrad;
    mlc_grad_scaler *scaler;            /* NULL, or its gradient scaler (mlc_grad_scaler_create) */
};

/* Whether the rule reads state buffer k of each parameter: SGD its b (k = 0) with momentum;
   Adam m (0), v (1), and max v (2) with amsgrad; RMSprop b (0) with momentum, v (1), and ḡ (2)
   when centered. */
static int mlc__optim_keeps(const mlc_optim *o, int k) {
    if (o->kind == MLC__SGD) return k == 0 && o->momentum != 0.0f;
    if (o->kind == MLC__RMSPROP) return k == 1 || (k == 0 && o->momentum > 0.0f) || (k == 2 && o->centered);
    return k < 2 || o->amsgrad;
}

MLCDEF mlc_result mlc_optim_add_param(mlc_optim *opt, mlc_tensor *p) {
    mlc_ctx *ctx;
    int k;
    if (!opt) return MLC_ERR_NULL;
    ctx = opt->ctx;
    if (p && (!MLC__ARGS_OK(ctx, "mlc_optim_add_param", p) || !mlc__writable(p, "mlc_optim_add_param")))
        return ctx->error;
    if (!p || !p->persistent || !p->grad || p->ctx != ctx) {
        mlc__fail(ctx, MLC_ERR_ARG, "mlc_optim_add_param: %s", !p ? "parameter is NULL" : p->ctx != ctx
                  ? "the parameter belongs to another context"
                  : "the tensor is not a parameter (use mlc_parameter)");
        return ctx->error ? ctx->error : MLC_ERR_ARG;
    }
    for (k = 0; k < opt->count; k++) if (opt->params[k] == p) return MLC_OK;   /* added before: kept once */
    if (opt->count == opt->capacity) {
        int cap = opt->capacity ? 2 * opt->capacity : 16;
        mlc_tensor **params = (mlc_tensor **)mlc__owned_alloc(ctx, sizeof(mlc_tensor *) * (size_t)cap,
                                                              "mlc_optim_add_param");
        mlc_tensor **state = (mlc_tensor **)mlc__owned_alloc(ctx, sizeof(mlc_tensor *) * 3 * (size_t)cap,
                                                             "mlc_optim_add_param");
        if (!params || !state) return ctx->error;
        if (opt->count) {
            memcpy(params, opt->params, sizeof(mlc_tensor *) * (size_t)opt->count);
            memcpy(state, opt->state, sizeof(mlc_tensor *) * 3 * (size_t)opt->count);
            mlc__owned_free(ctx, opt->params);
            mlc__owned_free(ctx, opt->state);
        }
        opt->params = params; opt->state = state; opt->capacity = cap;
    }
    ctx->op_device = p->on_device;                      /* the state lives with its parameter */
    for (k = 0; k < 3; k++) {                           /* zeroed by the allocator */
        mlc_tensor *st;
        opt->state[3 * opt->count + k] = NULL;
        if (!mlc__optim_keeps(opt, k)) continue;
        if (!(st = mlc__make(ctx, "mlc_optim_add_param", p->ndim, p->shape, 1))) return ctx->error;
        if (st->on_device && (!mlc__buffer_of(st, 0, "mlc_optim_add_param") || !ctx->backend->upload(st, 0)))
            return ctx->error;                          /* zeros on the device */
        st->stale = 0;
        st->owner = mlc__optim_owner_names[opt->kind];
        st->owner_name = mlc__optim_slot_names[opt->kind][k];
        opt->state[3 * opt->count + k] = st;
    }
    if (!p->owner) { p->owner = mlc__optim_owner_names[opt->kind]; p->owner_name = "params"; }
    opt->params[opt->count++] = p;
    return MLC_OK;
}

static mlc_result mlc__optim_add_module(mlc_optim *opt, mlc_module *m) {   /* PyTorch's order */
    int i;
    if (!mlc__module_walkable(m, "mlc_optim")) return opt->ctx->error;
    for (i = 0; i < m->n_params; i++)
        if (mlc_optim_add_param(opt, m->params[i]) != MLC_OK) return opt->ctx->error;
    for (i = 0; i < m->n_children; i++)
        if (mlc__optim_add_module(opt, m->children[i]) != MLC_OK) return opt->ctx->error;
    return MLC_OK;
}

static mlc_optim *mlc__optim(mlc_ctx *ctx, mlc__optim_kind kind, float lr, float default_lr) {
    mlc_optim *opt;
    if (!ctx || ctx->error) return NULL;
    if (!(opt = (mlc_optim *)mlc__owned_alloc(ctx, sizeof(mlc_optim), "mlc_optim"))) return NULL;
    opt->ctx = ctx; opt->kind = kind; opt->lr = mlc__setting(lr, default_lr);
    return opt;
}

/* The settings every rule shares are checked (and the module's context), then the module's
   parameters join once the rule is set up, as it decides which state they keep. */
static mlc_optim *mlc__optim_of(mlc_optim *opt, mlc_module *module, const char *op) {
    mlc_ctx *ctx = opt ? opt->ctx : NULL;
    int sgd = opt && opt->kind == MLC__SGD, rms = opt && opt->kind == MLC__RMSPROP;
    if (!opt) return NULL;
    if (module && module->ctx != ctx)
        mlc__fail(ctx, MLC_ERR_ARG, "%s: the module belongs to another context", op);
    if (ctx->error || !mlc__in_range(ctx, op, "lr", opt->lr, 0.0f, FLT_MAX, 0) ||
        !mlc__in_range(ctx, op, "eps", opt->eps, 0.0f, FLT_MAX, 0) ||
        !mlc__in_range(ctx, op, "weight_decay", opt->weight_decay, 0.0f, FLT_MAX, 0) ||
        !mlc__in_range(ctx, op, "momentum", opt->momentum, 0.0f, FLT_MAX, 0) ||
        (sgd && !mlc__in_range(ctx, op, "dampening", opt->dampening, -FLT_MAX, FLT_MAX, 0)) ||
        (!sgd && !mlc__in_range(ctx, op, rms ? "alpha" : "beta2", opt->beta2, 0.0f, 1.0f, !rms)) ||
        (!sgd && !rms && !mlc__in_range(ctx, op, "beta1", opt->beta1, 0.0f, 1.0f, 1))) {
        mlc__owned_free(ctx, opt);
        return NULL;
    }
    if (opt->nesterov && (opt->momentum <= 0.0f || opt->dampening != 0.0f)) {
        mlc__owned_free(ctx, opt);
        return (mlc_optim *)mlc__fail(ctx, MLC_ERR_ARG, "%s: nesterov needs momentum > 0 and dampening 0",
                                      op);
    }
    if (module && mlc__optim_add_module(opt, module) != MLC_OK) return NULL;
    return opt;
}

MLCDEF mlc_optim *mlc_sgd(mlc_ctx *ctx, mlc_module *module, mlc_sgd_opts c) {
    mlc_optim *opt = mlc__optim(ctx, MLC__SGD, c.lr, 0.01f);
    if (opt) {                                          /* 0 is the default: MLC_ZERO reads as 0 too */
        opt->momentum = mlc__setting(c.momentum, 0.0f); opt->dampening = mlc__setting(c.dampening, 0.0f);
        opt->weight_decay = mlc__setting(c.weight_decay, 0.0f); opt->nesterov = c.nesterov;
    }
    return mlc__optim_of(opt, module, "mlc_sgd");
}

static mlc_optim *mlc__adam(mlc_ctx *ctx, mlc_module *module, mlc_adam_opts c, mlc__optim_kind kind,
                            float default_wd) {
    mlc_optim *opt = mlc__optim(ctx, kind, c.lr, 1e-3f);
    if (!opt) return NULL;
    opt->beta1 = mlc__setting(c.beta1, 0.9f);
    opt->beta2 = mlc__setting(c.beta2, 0.999f);
    opt->eps = mlc__setting(c.eps, 1e-8f);
    opt->weight_decay = mlc__setting(c.weight_decay, default_wd);
    opt->amsgrad = c.amsgrad != 0;
    return mlc__optim_of(opt, module, kind == MLC__ADAM ? "mlc_adam" : "mlc_adamw");
}
MLCDEF mlc_optim *mlc_adam(mlc_ctx *ctx, mlc_module *module, mlc_adam_opts c) {
    return mlc__adam(ctx, module, c, MLC__ADAM, 0.0f);
}
MLCDEF mlc_optim *mlc_adamw(mlc_ctx *ctx, mlc_module *module, mlc_adam_opts c) {
    return mlc__adam(ctx, module, c, MLC__ADAMW, 0.01f);
}

MLCDEF mlc_optim *mlc_rmsprop(mlc_ctx *ctx, mlc_module *module, mlc_rmsprop_opts c) {
    mlc_optim *opt = mlc__optim(ctx, MLC__RMSPROP, c.lr, 0.01f);
    if (!opt) return NULL;
    opt->beta2 = mlc__setting(c.alpha, 0.99f);
    opt->eps = mlc__setting(c.eps, 1e-8f);
    opt->weight_decay = mlc__setting(c.weight_decay, 0.0f); opt->momentum = mlc__setting(c.momentum, 0.0f);
    opt->centered = c.centered;
    return mlc__optim_of(opt, module, "mlc_rmsprop");
}

MLCDEF void mlc_zero_grad(mlc_optim *opt) {
    int i;
    if (!opt) return;
    for (i = 0; i < opt->count; i++) mlc__clear_grad(opt->params[i]);
}

/* One parameter's update, a loop per rule over plain arrays, so compilers vectorise it (with
   -fopenmp's simd pragma, or -O3; sqrt in Adam and RMSprop also needs -fno-math-errno).
   State below FLT_MIN is stored as 0 (mlc__flush): a moment that small moves no parameter,
   but one that decays while the gradient stays 0 (a pixel that is always black) ends stuck at
   the smallest denormal (0.9 x that rounds back to it), and denormal arithmetic is slow on x86
   (bench/RESULTS.md). */

static void mlc__sgd_update(const mlc_optim *o, size_t n, float *MLC__RESTRICT p,
                            const float *MLC__RESTRICT g, float *MLC__RESTRICT buf) {
    const float lr = o->lr, wd = o->weight_decay, mu = o->momentum, keep = 1.0f - o->dampening;
    const int first = o->t == 1, nesterov = o->nesterov;
    size_t j;
    if (mu == 0.0f) {
        MLC__OMP(omp simd)
        for (j = 0; j < n; j++) p[j] -= lr * (g[j] + wd * p[j]);
        return;
    }
    MLC__OMP(omp simd)
    for (j = 0; j < n; j++) {
        float gj = g[j] + wd * p[j];
        buf[j] = mlc__flush(first ? gj : mu * buf[j] + keep * gj);
        p[j] -= lr * (nesterov ? gj + mu * buf[j] : buf[j]);
    }
}

/* Adam's constants for step t: the betas, eps, L2 weight decay (Adam), the shrink factor
   1 - lr wd (AdamW), the step lr / (1 - b1^t) and 1 / (1 - b2^t) */
typedef struct mlc__adam_consts { float b1, b2, eps, l2, shrink, step, inv_bc2; } mlc__adam_consts;

#if MLC__X86
/* The Adam loop below 8 floats at a time, with plain AVX multiplies and adds in the loop's
   order, so every value rounds as there; it does the first n - n % 8 floats. */
__attribute__((target("avx")))
static __m256 mlc__flush_avx(__m256 x) {                /* mlc__flush: |x| < FLT_MIN -> 0 */
    const __m256 magnitude = _mm256_and_ps(x, _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff)));
    return _mm256_and_ps(x, _mm256_cmp_ps(magnitude, _mm256_set1_ps(FLT_MIN), _CMP_GE_OQ));
}

__attribute__((target("avx")))
static size_t mlc__adam_update_avx(const mlc__adam_consts *k, size_t n, float *MLC__RESTRICT p,
                                   const float *MLC__RESTRICT g, float *MLC__RESTRICT m,
                                   float *MLC__RESTRICT v, float *MLC__RESTRICT vmax) {
    const __m256 b1 = _mm256_set1_ps(k->b1), b2 = _mm256_set1_ps(k->b2), c1 = _mm256_set1_ps(1.0f - k->b1),
                 c2 = _mm256_set1_ps(1.0f - k->b2), eps = _mm256_set1_ps(k->eps), l2 = _mm256_set1_ps(k->l2),
                 shrink = _mm256_set1_ps(k->shrink), step = _mm256_set1_ps(k->step),
                 inv_bc2 = _mm256_set1_ps(k->inv_bc2);
    size_t j;
    for (j = 0; j + 8 <= n; j += 8) {
        __m256 pj = _mm256_loadu_ps(p + j), gj = _mm256_add_ps(_mm256_loadu_ps(g + j), _mm256_mul_ps(l2, pj)),
               mj = mlc__flush_avx(_mm256_add_ps(_mm256_mul_ps(b1, _mm256_loadu_ps(m + j)),
                                                 _mm256_mul_ps(c1, gj))),
               vj = mlc__flush_avx(_mm256_add_ps(_mm256_mul_ps(b2, _mm256_loadu_ps(v + j)),
                                                 _mm256_mul_ps(_mm256_mul_ps(c2, gj), gj))), dj = vj;
        _mm256_storeu_ps(m + j, mj);
        _mm256_storeu_ps(v + j, vj);
        if (vmax) { dj = _mm256_max_ps(_mm256_loadu_ps(vmax + j), vj); _mm256_storeu_ps(vmax + j, dj); }
        dj = _mm256_add_ps(_mm256_sqrt_ps(_mm256_mul_ps(dj, inv_bc2)), eps);
        _mm256_storeu_ps(p + j, _mm256_sub_ps(_mm256_mul_ps(pj, shrink),
                                              _mm256_div_ps(_mm256_mul_ps(step, mj), dj)));
    }
    return j;
}
#endif

/* Adam and AdamW in one loop: Adam adds wd p to the gradient, AdamW shrinks p by (1 - lr wd);
   AMSGrad (vmax not NULL) divides by the largest v so far instead of v. */
static void mlc__adam_update(const mlc_optim *o, size_t n, float *MLC__RESTRICT p,
                             const float *MLC__RESTRICT g, float *MLC__RESTRICT m, float *MLC__RESTRICT v,
                             float *MLC__RESTRICT vmax) {
    mlc__adam_consts k;
    size_t j = 0;
    k.b1 = o->beta1; k.b2 = o->beta2; k.eps = o->eps;
    k.l2 = o->kind == MLC__ADAM ? o->weight_decay : 0.0f;
    k.shrink = o->kind == MLC__ADAMW ? 1.0f - o->lr * o->weight_decay : 1.0f;
    k.step = (float)((double)o->lr / (1.0 - pow((double)k.b1, (double)o->t)));
    k.inv_bc2 = (float)(1.0 / (1.0 - pow((double)k.b2, (double)o->t)));
#if MLC__X86
    if (__builtin_cpu_supports("avx")) j = mlc__adam_update_avx(&k, n, p, g, m, v, vmax);
#endif
    for (; j < n; j++) {
        float gj = g[j] + k.l2 * p[j];
        m[j] = mlc__flush(k.b1 * m[j] + (1.0f - k.b1) * gj);
        v[j] = mlc__flush(k.b2 * v[j] + (1.0f - k.b2) * gj * gj);
        if (vmax) vmax[j] = vmax[j] > v[j] ? vmax[j] : v[j];
        p[j] = p[j] * k.shrink - k.step * m[j] / (MLC_SQRTF((vmax ? vmax[j] : v[j]) * k.inv_bc2) + k.eps);
    }
}

static void mlc__rmsprop_update(const mlc_optim *o, size_t n, float *MLC__RESTRICT p,
                                const float *MLC__RESTRICT g, float *MLC__RESTRICT buf,
                                float *MLC__RESTRICT sq, float *MLC__RESTRICT mean) {
    const float lr = o->lr, wd = o->weight_decay, a = o->beta2, eps = o->eps, mu = o->momentum;
    const int centered = o->centered;
    size_t j;
    MLC__OMP(omp simd)
    for (j = 0; j < n; j++) {
        float gj = g[j] + wd * p[j], avg;
        sq[j] = mlc__flush(a * sq[j] + (1.0f - a) * gj * gj);
        if (centered) mean[j] = mlc__flush(a * mean[j] + (1.0f - a) * gj);
        avg = MLC_SQRTF(centered ? sq[j] - mean[j] * mean[j] : sq[j]) + eps;
        if (mu > 0.0f) { buf[j] = mlc__flush(mu * buf[j] + gj / avg); p[j] -= lr * buf[j]; }
        else p[j] -= lr * gj / avg;
    }
}

/* The rule's update of n elements: parameter p, gradient g and the state buffers s0, s1, s2
   (NULL where the rule keeps none); a backend may run it on its own buffers (a test's fake one). */
static void mlc__update(const mlc_optim *o, size_t n, float *p, const float *g, float *s0, float *s1,
                        float *s2) {
    if (o->kind == MLC__SGD) mlc__sgd_update(o, n, p, g, s0);
    else if (o->kind == MLC__RMSPROP) mlc__rmsprop_update(o, n, p, g, s0, s1, s2);
    else mlc__adam_update(o, n, p, g, s0, s1, s2);
}

/* Parameter i's update over a slice [begin, end), for mlc__parallel (threads from 32k on). */
typedef struct mlc__step_job { const mlc_optim *opt; int i; } mlc__step_job;
#define MLC__STEP_PARALLEL 32768

/* State buffer k of parameter i from `begin` on, NULL when the rule keeps none. */
static float *mlc__state_from(const mlc_optim *o, int i, int k, size_t begin) {
    const mlc_tensor *st = o->state[3 * i + k];
    return st ? st->data + begin : NULL;
}

static void mlc__step_slice(void *job, int slot, size_t begin, size_t end) {
    const mlc_optim *o = ((const mlc__step_job *)job)->opt;
    int i = ((const mlc__step_job *)job)->i;
    const mlc_tensor *p = o->params[i];
    (void)slot;
    mlc__update(o, end - begin, p->data + begin, p->grad + begin, mlc__state_from(o, i, 0, begin),
                mlc__state_from(o, i, 1, begin), mlc__state_from(o, i, 2, begin));
}

/* Parameter i and its state were updated on the device: their host copies are out of date. */
static void mlc__stepped_on_device(mlc_optim *opt, int i) {
    mlc_tensor *p = opt->params[i], **st = opt->state + 3 * i;
    int k;
    p->stale = (p->stale & ~(unsigned)MLC__DEVICE_STALE) | MLC__HOST_STALE;
    for (k = 0; k < 3; k++) if (st[k]) st[k]->stale = MLC__HOST_STALE;
}

/* Each run of consecutive parameters on the device goes to the backend, which updates as many
   of them from the first as it can (one launch may take several: OpenCL's takes up to 8); a
   parameter it leaves, and one on the host, the CPU updates. */
MLCDEF void mlc_step(mlc_optim *opt) {
    int i, k, done;
    if (!opt || opt->ctx->error) return;
    for (i = 0; i < opt->count; i++)
        if (opt->params[i]->dtype != MLC_F32) {
            mlc__fail(opt->ctx, MLC_ERR_ARG, "mlc_step: parameter %d %T is %s: optimisers update float32 "
                      "(master) weights; %s", i, opt->params[i], mlc_dtype_name(opt->params[i]->dtype),
                      opt->params[i]->dtype == MLC_I8
                          ? "an int8 model is for inference (train it before mlc_quantize_dynamic)"
                          : "train in float32 with mlc_autocast_begin, or convert back with "
                            "mlc_module_to_dtype");
            return;
        }
    opt->ctx->n_autocast_copies = 0;                     /* the weights change: autocast copies them anew */
    opt->t++;
    for (i = 0; i < opt->count; i++)                    /* the module moved after the optimiser was made */
        for (k = 0; k < 3; k++) {
            mlc_tensor *st = opt->state[3 * i + k];
            if (st && st->on_device != opt->params[i]->on_device && !mlc_to(st, opt->params[i]->on_device))
                return;
        }
    for (i = 0; i < opt->count; i += done) {
        mlc_tensor *p = opt->params[i], **st = opt->state + 3 * i;
        mlc__step_job job;
        int run = 0;
        if (p->on_device) {
            while (i + run < opt->count && opt->params[i + run]->on_device) run++;
            done = opt->ctx->backend->step(opt, i, run);
            MLC_ASSERT(done >= 0 && done <= run);
            for (k = i; k < i + done; k++) mlc__stepped_on_device(opt, k);
            if (done) continue;
            if (opt->ctx->error) return;
            mlc__fall_back(opt->ctx, "mlc_step");
        }
        done = 1;
        mlc__host_sync(p);
        mlc__host_grad(p);
        for (k = 0; k < 3; k++) if (st[k]) { mlc__host_sync(st[k]); mlc__host_wrote(st[k]); }
        mlc__host_wrote(p);
        job.opt = opt; job.i = i;
        mlc__parallel(opt->ctx, p->size, MLC__STEP_PARALLEL, mlc__step_slice, &job);
    }
}

MLCDEF void mlc_optim_set_lr(mlc_optim *opt, float lr) {
    if (opt && mlc__in_range(opt->ctx, "mlc_optim_set_lr", "lr", lr, 0.0f, FLT_MAX, 0)) opt->lr = lr;
}
MLCDEF float mlc_optim_lr(const mlc_optim *opt) { return opt ? opt->lr : 0.0f; }

MLCDEF float mlc_clip_grad_norm(mlc_optim *opt, float max_norm) {
    double total = 0.0;
    float scale;
    int i;
    size_t j;
    if (!opt || opt->ctx->error) return 0.0f;
    if (!mlc__in_range(opt->ctx, "mlc_clip_grad_norm", "max_norm", max_norm, 0.0f, FLT_MAX, 0)) return 0.0f;
    for (i = 0; i < opt->count; i++) {
        const float *g = mlc__host_grad(opt->params[i]);   /* the norm is read on the host */
        if (!g) return 0.0f;
        for (j = 0; j < opt->params[i]->size; j++) total += (double)g[j] * (double)g[j];
    }
    total = sqrt(total);
    scale = (float)((double)max_norm / (total + 1e-6));
    if (scale < 1.0f)
        for (i = 0; i < opt->count; i++) {
            for (j = 0; j < opt->params[i]->size; j++) opt->params[i]->grad[j] *= scale;
            mlc__host_wrote_grad(opt->params[i]);
        }
    return (float)total;
}

MLCDEF mlc_grad_scaler *mlc_grad_scaler_create(mlc_optim *opt, mlc_grad_scaler_opts opts) {
    const char *op = "mlc_grad_scaler_create";
    mlc_grad_scaler *s;
    if (!opt || opt->ctx->error) return NULL;
    if (opt->scaler)
        return (mlc_grad_scaler *)mlc__fail(opt->ctx, MLC_ERR_STATE, "%s: the optimiser has a scaler already",
                                            op);
    opts.init_scale = mlc__setting(opts.init_scale, 65536.0f);
    opts.growth_factor = mlc__setting(opts.growth_factor, 2.0f);
    opts.backoff_factor = mlc__setting(opts.backoff_factor, 0.5f);
    if (opts.growth_interval == 0) opts.growth_interval = 2000;
    if (!mlc__in_range(opt->ctx, op, "init_scale", opts.init_scale, FLT_MIN, FLT_MAX, 0)
        || !mlc__in_range(opt->ctx, op, "growth_factor", opts.growth_factor, 1.0f, FLT_MAX, 0)
        || !mlc__in_range(opt->ctx, op, "backoff_factor", opts.backoff_factor, FLT_MIN, 1.0f, 0))
        return NULL;
    if (opts.growth_interval < 1)
        return (mlc_grad_scaler *)mlc__fail(opt->ctx, MLC_ERR_ARG, "%s: growth_interval %d is not positive",
                                            op, opts.growth_interval);
    if (!(s = (mlc_grad_scaler *)mlc__owned_alloc(opt->ctx, sizeof *s, op))) return NULL;
    memset(s, 0, sizeof *s);
    s->opt = opt;
    s->opts = opts;
    s->scale = opts.init_scale;
    opt->scaler = s;
    return s;
}

MLCDEF mlc_tensor *mlc_grad_scaler_scale(mlc_grad_scaler *scaler, mlc_tensor *loss) {
    if (!scaler || !loss)
        return loss ? (mlc_tensor *)mlc__fail(loss->ctx, MLC_ERR_NULL, "mlc_grad_scaler_scale: no scaler")
                    : NULL;
    if (!MLC__ARGS_OK(scaler->opt->ctx, "mlc_grad_scaler_scale", loss)) return NULL;
    scaler->found_inf = scaler->unscaled = 0;
    return mlc_mul_scalar(loss, scaler->scale);
}

/* g *= 1/scale (the reciprocal in double, rounded once, as PyTorch's); found_inf when any
   gradient is infinite or NaN */
MLCDEF mlc_result mlc_grad_scaler_unscale(mlc_grad_scaler *scaler) {
    mlc_optim *opt = scaler ? scaler->opt : NULL;
    float inv;
    int i;
    size_t j;
    if (!opt) return MLC_ERR_NULL;
    if (opt->ctx->error) return opt->ctx->error;
    if (scaler->unscaled) {
        mlc__fail(opt->ctx, MLC_ERR_STATE, "mlc_grad_scaler_unscale: the gradients are unscaled already "
                  "this step (once between mlc_grad_scaler_scale and _step)");
        return opt->ctx->error;
    }
    inv = (float)(1.0 / (double)scaler->scale);
    for (i = 0; i < opt->count; i++) {
        float *g = mlc__host_grad(opt->params[i]);
        if (!g) { if (opt->ctx->error) return opt->ctx->error; continue; }
        for (j = 0; j < opt->params[i]->size; j++) {
            if (!mlc__is_finite(g[j])) scaler->found_inf = 1;
            g[j] *= inv;
        }
        mlc__host_wrote_grad(opt->params[i]);
    }
    scaler->unscaled = 1;
    return MLC_OK;
}

MLCDEF int mlc_grad_scaler_step(mlc_grad_scaler *scaler) {
    if (!scaler || scaler->opt->ctx->error) return 0;
    if (!scaler->unscaled && mlc_grad_scaler_unscale(scaler) != MLC_OK) return 0;
    if (scaler->found_inf) return 0;
    mlc_step(scaler->opt);
    return !scaler->opt->ctx->error;
}

MLCDEF void mlc_grad_scaler_update(mlc_grad_scaler *scaler) {
    if (!scaler) return;
    if (scaler->found_inf) {
        scaler->scale *= scaler->opts.backoff_factor;
        scaler->growth_tracker = 0;
    } else if (++scaler->growth_tracker == scaler->opts.growth_interval) {
        float grown = scaler->scale * scaler->opts.growth_factor;
        if (mlc__is_finite(grown)) scaler->scale = grown;
        scaler->growth_tracker = 0;
    }
    scaler->found_inf = scaler->unscaled = 0;
}

MLCDEF float mlc_lr_step(float base_lr, int epoch, int step_size, float gamma) {
    return step_size > 0 ? base_lr * (float)pow((double)gamma, (double)(epoch / step_size)) : base_lr;
}

MLCDEF float mlc_lr_cosine(float base_lr, int step, int warmup_steps, int total_steps, float min_lr) {
    double progress;
    if (step < warmup_steps) return base_lr * (float)(step + 1) / (float)warmup_steps;
    progress = total_steps > warmup_steps ? (double)(step - warmup_steps) / (total_steps - warmup_steps)
                                          : 1.0;
    if (progress > 1.0) progress = 1.0;
    return min_lr + (base_lr - min_lr) * (float)(0.5 * (1.0 + cos(3.141592653589793 * progress)));
}

/* ============================================================================================
   @section data  Files: IDX and CSV data, batches
   A small gzip reader (RFC 1952 around deflate, RFC 1951), the IDX and CSV parsers on top of
   it, reading whole files, and the batch iterator. Input is untrusted: each read is checked
   against the input's length before it happens, and corrupt data stops with an MLC_ERR_IO
   naming the file and the byte offset.
   ============================================================================================ */

/* ---- CRC-32, gzip's checksum (polynomial 0xEDB88320, bits reflected), by a table ---------- */
static void mlc__crc32_table(uint32_t table[256]) {
    uint32_t c;
    int n, k;
    for (n = 0; n < 256; n++) {
        for (c = (uint32_t)n, k = 0; k < 8; k++) c = (c & 1u) ? 0xEDB88320u ^ (c >> 1) : c >> 1;
        table[n] = c;
    }
}
static uint32_t mlc__crc32(const uint32_t table[256], uint32_t crc, const unsigned char *p, size_t n) {
    crc = ~crc;
    while (n--) crc = table[(crc ^ *p++) & 0xffu] ^ (crc >> 8);
    return ~crc;
}
static uint32_t mlc__le32(const unsigned char *p) {
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}
static uint32_t mlc__be32(const unsigned char *p) {
    return (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | (uint32_t)p[3];
}

/* ---- Inflate (RFC 1951) ---------------------------------------------------------------------
   Deflate data is a chain of blocks: stored (raw bytes), or Huffman-coded with the RFC's fixed
   codes or with codes sent at the block's start (dynamic). A coded block is a stream of
   literals (a byte), matches (a length 3..258 and a distance 1..32768 back into the output)
   and an end-of-block symbol. Bits come from the least significant end of each byte.
   A Huffman code here is canonical: the code lengths alone define it, so the decoder keeps
   how many codes each length has and the symbols in code order, and walks the code one bit at
   a time (zlib's puff.c does it so: slower than a lookup table, and plain to read). Output
   goes through a 32 KiB window (a match reaches back at most that far), handed to the sink
   each time the window fills, so memory stays small whatever the data's size. */
#define MLC__WINDOW 32768
typedef struct mlc__huffman {
    short count[16];                    /* count[n]: codes of length n (count[0]: unused symbols) */
    short symbol[288];                  /* the symbols, in the order of their codes */
    int longest;                        /* the longest code's length */
} mlc__huffman;

typedef struct mlc__inflate {
    mlc_ctx *ctx;
    const char *op, *name;
    const unsigned char *in;            /* the whole input, its size, the next byte to read */
    size_t size, pos;
    uint32_t bits;                      /* bits of in[pos - 1] not used yet (always fewer than 8) */
    int nbits;
    size_t out, flushed;                /* bytes produced in this member; those handed to the sink */
    uint32_t crc;                       /* CRC-32 of the bytes handed over */
    mlc_sink_fn sink;
    void *user;
    int bad;                            /* an error was reported: every loop stops */
    mlc__huffman lencode, distcode;
    uint32_t crc_table[256];
    unsigned char window[MLC__WINDOW];  /* out's last 32 KiB: byte i of the member at i % 32768 */
} mlc__inflate;

/* The offset of the input byte that holds the last bit read. */
static size_t mlc__inflate_at(const mlc__inflate *s) {
    size_t back = 1 + (size_t)s->nbits / 8;
    return s->pos >= back ? s->pos - back : 0;
}

/* A corrupt file: MLC_ERR_IO, "op: name: byte N<where>: " and the rest of the message. */
static void mlc__fail_io(mlc_ctx *ctx, const char *op, const char *name, size_t at, const char *where,
                         const char *fmt, va_list ap) {
    char what[200];
    mlc__vformat(what, sizeof what, fmt, ap);
    mlc__fail(ctx, MLC_ERR_IO, "%s: %s: byte %zu%s: %s", op, name, at, where, what);
}

static int mlc__inflate_fail(mlc__inflate *s, size_t at, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    if (!s->bad) mlc__fail_io(s->ctx, s->op, s->name, at, "", fmt, ap);
    va_end(ap);
    s->bad = 1;
    return 0;
}

/* The next `need` bits (0..13), first bit lowest. */
static unsigned mlc__inflate_bits(mlc__inflate *s, int need) {
    uint32_t value = s->bits;
    if (s->bad) return 0;
    while (s->nbits < need) {
        if (s->pos >= s->size)
            return (unsigned)mlc__inflate_fail(s, s->size, "the data ends inside a block (truncated)");
        value |= (uint32_t)s->in[s->pos++] << s->nbits;
        s->nbits += 8;
    }
    s->bits = value >> need;
    s->nbits -= need;
    return (unsigned)(value & ((1u << need) - 1u));
}

/* Hand the window's bytes not yet handed over to the sink (they never wrap: this runs each
   time the window fills, and at a member's end). */
static void mlc__inflate_flush(mlc__inflate *s) {
    const unsigned char *start = s->window + s->flushed % MLC__WINDOW;
    size_t n = s->out - s->flushed;
    if (s->bad || !n) return;
    s->crc = mlc__crc32(s->crc_table, s->crc, start, n);
    s->flushed = s->out;
    if (s->sink(start, n, s->user) != 0)
        mlc__inflate_fail(s, mlc__inflate_at(s), "the reader of the output stopped (%zu bytes in)", s->out);
}

static void mlc__inflate_put(mlc__inflate *s, unsigned char byte) {
    s->window[s->out % MLC__WINDOW] = byte;
    if (++s->out % MLC__WINDOW == 0) mlc__inflate_flush(s);
}

/* Code lengths to a code. 0: complete; > 0: incomplete (codes left over); < 0: over-subscribed
   (more codes than the lengths allow). No lengths at all counts as complete: decoding fails. */
static int mlc__huffman_build(mlc__huffman *h, const short *length, int n) {
    short offset[16];
    int symbol, len, left = 1;
    memset(h->count, 0, sizeof h->count);
    for (symbol = 0; symbol < n; symbol++) h->count[length[symbol]]++;
    for (h->longest = 15; h->longest > 0 && !h->count[h->longest]; h->longest--) {}
    if (h->count[0] == n) return 0;
    for (len = 1; len < 16; len++) {                /* codes of each length still free */
        left = 2 * left - h->count[len];
        if (left < 0) return left;
    }
    offset[1] = 0;
    for (len = 1; len < 15; len++) offset[len + 1] = (short)(offset[len] + h->count[len]);
    for (symbol = 0; symbol < n; symbol++)
        if (length[symbol]) h->symbol[offset[length[symbol]]++] = (short)symbol;
    return left;
}

/* One symbol: read bits until the code so far is one of the codes of its length (canonical
   codes of one length are consecutive numbers, after those of the shorter lengths). Past the
   longest length no symbol has the bits read: the error is at the byte of the last bit. */
static int mlc__huffman_decode(mlc__inflate *s, const mlc__huffman *h) {
    int code = 0, first = 0, index = 0, len;
    for (len = 1; len <= h->longest; len++) {
        code |= (int)mlc__inflate_bits(s, 1);
        if (s->bad) return -1;
        if (code - h->count[len] < first) return h->symbol[index + (code - first)];
        index += h->count[len];
        first = (first + h->count[len]) << 1;
        code <<= 1;
    }
    mlc__inflate_fail(s, mlc__inflate_at(s), "invalid Huffman code (no symbol has it)");
    return -1;
}

/* A coded block's symbols, up to end-of-block (256). */
static void mlc__inflate_codes(mlc__inflate *s, const mlc__huffman *lencode, const mlc__huffman *distcode) {
    static const short len_base[29] = { 3, 4, 5, 6, 7, 8, 9, 10, 11, 13, 15, 17, 19, 23, 27, 31, 35,
                                        43, 51, 59, 67, 83, 99, 115, 131, 163, 195, 227, 258 };
    static const short len_extra[29] = { 0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3,
                                         4, 4, 4, 4, 5, 5, 5, 5, 0 };
    static const unsigned short dist_base[30] = { 1, 2, 3, 4, 5, 7, 9, 13, 17, 25, 33, 49, 65, 97, 129,
        193, 257, 385, 513, 769, 1025, 1537, 2049, 3073, 4097, 6145, 8193, 12289, 16385, 24577 };
    static const short dist_extra[30] = { 0, 0, 0, 0, 1, 1, 2, 2, 3, 3, 4, 4, 5, 5, 6, 6, 7, 7, 8, 8,
                                          9, 9, 10, 10, 11, 11, 12, 12, 13, 13 };
    for (;;) {
        int symbol = mlc__huffman_decode(s, lencode);
        size_t len, dist;
        if (s->bad || symbol == 256) return;
        if (symbol < 256) { mlc__inflate_put(s, (unsigned char)symbol); continue; }
        symbol -= 257;                              /* a match: its length, then its distance */
        if (symbol >= 29) {
            mlc__inflate_fail(s, mlc__inflate_at(s), "length symbol %d is reserved", symbol + 257);
            return;
        }
        len = (size_t)len_base[symbol] + mlc__inflate_bits(s, len_extra[symbol]);
        symbol = mlc__huffman_decode(s, distcode);
        if (s->bad) return;
        if (symbol >= 30) {
            mlc__inflate_fail(s, mlc__inflate_at(s), "distance symbol %d is reserved", symbol);
            return;
        }
        dist = (size_t)dist_base[symbol] + mlc__inflate_bits(s, dist_extra[symbol]);
        if (s->bad) return;
        if (dist > s->out) {
            mlc__inflate_fail(s, mlc__inflate_at(s), "a match reaches %zu bytes back, but only %zu were "
                              "written (distance too far)", dist, s->out);
            return;
        }
        while (len--) mlc__inflate_put(s, s->window[(s->out - dist) % MLC__WINDOW]);
    }
}

static void mlc__inflate_stored(mlc__inflate *s) {   /* LEN, ~LEN (16 bits each), LEN bytes */
    size_t len;
    s->bits = 0;                                    /* to the next byte boundary */
    s->nbits = 0;
    if (s->size - s->pos < 4) {
        mlc__inflate_fail(s, s->size, "the data ends inside a stored block's header (truncated)");
        return;
    }
    len = (size_t)s->in[s->pos] | (size_t)s->in[s->pos + 1] << 8;
    if ((len ^ 0xffffu) != ((size_t)s->in[s->pos + 2] | (size_t)s->in[s->pos + 3] << 8)) {
        mlc__inflate_fail(s, s->pos, "a stored block's length %zu does not match its complement", len);
        return;
    }
    s->pos += 4;
    if (s->size - s->pos < len) {
        mlc__inflate_fail(s, s->size, "a stored block of %zu bytes is cut off after %zu (truncated)",
                          len, s->size - s->pos);
        return;
    }
    while (len-- && !s->bad) mlc__inflate_put(s, s->in[s->pos++]);
}

static void mlc__inflate_fixed(mlc__inflate *s) {   /* the RFC's codes (section 3.2.6) */
    short lengths[288];
    int symbol;
    for (symbol = 0; symbol < 144; symbol++) lengths[symbol] = 8;
    for (; symbol < 256; symbol++) lengths[symbol] = 9;
    for (; symbol < 280; symbol++) lengths[symbol] = 7;
    for (; symbol < 288; symbol++) lengths[symbol] = 8;
    mlc__huffman_build(&s->lencode, lengths, 288);
    for (symbol = 0; symbol < 30; symbol++) lengths[symbol] = 5;
    mlc__huffman_build(&s->distcode, lengths, 30);
    mlc__inflate_codes(s, &s->lencode, &s->distcode);
}

/* A dynamic block starts with its codes: the code lengths of the literal/length and distance
   codes, themselves Huffman-coded (with run-length symbols 16, 17, 18) by a code-length code
   whose own lengths come first, 3 bits each, in a fixed order. */
static void mlc__inflate_dynamic(mlc__inflate *s) {
    static const unsigned char order[19] = { 16, 17, 18, 0, 8, 7, 9, 6, 10, 5, 11, 4, 12, 3, 13, 2, 14, 1,
                                             15 };
    short lengths[286 + 30];
    int nlen, ndist, ncode, index, err;
    size_t at = mlc__inflate_at(s);
    nlen = (int)mlc__inflate_bits(s, 5) + 257;
    ndist = (int)mlc__inflate_bits(s, 5) + 1;
    ncode = (int)mlc__inflate_bits(s, 4) + 4;
    if (s->bad) return;
    if (nlen > 286 || ndist > 30) {
        mlc__inflate_fail(s, at, "a block declares %d length and %d distance codes (at most 286 and 30)",
                          nlen, ndist);
        return;
    }
    for (index = 0; index < 19; index++)
        lengths[order[index]] = (short)(index < ncode ? mlc__inflate_bits(s, 3) : 0);
    if (s->bad) return;
    if (mlc__huffman_build(&s->lencode, lengths, 19) != 0) {
        mlc__inflate_fail(s, mlc__inflate_at(s), "the code-length code is incomplete or over-subscribed");
        return;
    }
    for (index = 0; index < nlen + ndist;) {
        int symbol = mlc__huffman_decode(s, &s->lencode), repeat;
        short len = 0;
        if (s->bad) return;
        if (symbol < 16) { lengths[index++] = (short)symbol; continue; }
        if (symbol == 16) {                         /* the previous length, 3..6 times */
            if (index == 0) {
                mlc__inflate_fail(s, mlc__inflate_at(s), "a repeat comes before any code length");
                return;
            }
            len = lengths[index - 1];
            repeat = 3 + (int)mlc__inflate_bits(s, 2);
        } else if (symbol == 17) repeat = 3 + (int)mlc__inflate_bits(s, 3);   /* zeros */
        else repeat = 11 + (int)mlc__inflate_bits(s, 7);
        if (s->bad) return;
        if (index + repeat > nlen + ndist) {
            mlc__inflate_fail(s, mlc__inflate_at(s), "code lengths run past the %d declared", nlen + ndist);
            return;
        }
        while (repeat--) lengths[index++] = len;
    }
    if (lengths[256] == 0) {
        mlc__inflate_fail(s, mlc__inflate_at(s), "a block has no end-of-block code");
        return;
    }
    /* An incomplete code is allowed only as a single code of one bit (RFC 1951 and zlib). */
    err = mlc__huffman_build(&s->lencode, lengths, nlen);
    if (err < 0 || (err > 0 && nlen != s->lencode.count[0] + s->lencode.count[1])) {
        mlc__inflate_fail(s, mlc__inflate_at(s), "the literal/length code is incomplete or over-subscribed");
        return;
    }
    err = mlc__huffman_build(&s->distcode, lengths + nlen, ndist);
    if (err < 0 || (err > 0 && ndist != s->distcode.count[0] + s->distcode.count[1])) {
        mlc__inflate_fail(s, mlc__inflate_at(s), "the distance code is incomplete or over-subscribed");
        return;
    }
    mlc__inflate_codes(s, &s->lencode, &s->distcode);
}

static void mlc__inflate_blocks(mlc__inflate *s) {
    int last;
    do {
        size_t at;
        int type;
        last = (int)mlc__inflate_bits(s, 1);
        type = (int)mlc__inflate_bits(s, 2);
        at = mlc__inflate_at(s);
        if (s->bad) return;
        if (type == 0) mlc__inflate_stored(s);
        else if (type == 1) mlc__inflate_fixed(s);
        else if (type == 2) mlc__inflate_dynamic(s);
        else mlc__inflate_fail(s, at, "block type 3 is reserved");
    } while (!last && !s->bad);
}

/* ---- gzip (RFC 1952): members of header, deflate data, CRC-32 and length -------------------- */
enum { MLC__GZ_FHCRC = 2, MLC__GZ_FEXTRA = 4, MLC__GZ_FNAME = 8, MLC__GZ_FCOMMENT = 16 };

/* A zero-terminated header field (file name, comment): skip it, inside the input. */
static void mlc__gzip_skip_string(mlc__inflate *s, const char *what) {
    const unsigned char *end = (const unsigned char *)memchr(s->in + s->pos, 0, s->size - s->pos);
    if (!end) { mlc__inflate_fail(s, s->size, "the header's %s has no end (truncated)", what); return; }
    s->pos = (size_t)(end - s->in) + 1;
}

static void mlc__gzip_member(mlc__inflate *s) {
    size_t start = s->pos;
    int flags;
    if ((s->size - start >= 1 && s->in[start] != 0x1f)
        || (s->size - start >= 2 && s->in[start + 1] != 0x8b)) {
        mlc__inflate_fail(s, start, "not gzip data (it does not start with the bytes 31 139)");
        return;
    }
    if (s->size - s->pos < 10) {
        mlc__inflate_fail(s, s->size, "the gzip header is cut off (truncated)");
        return;
    }
    if (s->in[start + 2] != 8) {
        mlc__inflate_fail(s, start + 2, "compression method %u is not deflate (8)", s->in[start + 2]);
        return;
    }
    flags = s->in[start + 3];
    if (flags & 0xe0) {
        mlc__inflate_fail(s, start + 3, "reserved header flags are set (%d)", flags);
        return;
    }
    s->pos += 10;                                   /* magic, method, flags, time, extra flags, OS */
    if (flags & MLC__GZ_FEXTRA) {                   /* XLEN, then XLEN bytes */
        size_t xlen;
        if (s->size - s->pos < 2) {
            mlc__inflate_fail(s, s->size, "the header's extra field is cut off");
            return;
        }
        xlen = (size_t)s->in[s->pos] | (size_t)s->in[s->pos + 1] << 8;
        if (s->size - s->pos - 2 < xlen) {
            mlc__inflate_fail(s, s->size, "the header's extra field of %zu bytes is cut off", xlen);
            return;
        }
        s->pos += 2 + xlen;
    }
    if (flags & MLC__GZ_FNAME) mlc__gzip_skip_string(s, "file name");
    if (!s->bad && (flags & MLC__GZ_FCOMMENT)) mlc__gzip_skip_string(s, "comment");
    if (!s->bad && (flags & MLC__GZ_FHCRC)) {       /* the low 16 bits of the header's CRC-32 */
        uint32_t crc = mlc__crc32(s->crc_table, 0, s->in + start, s->pos - start) & 0xffffu;
        if (s->size - s->pos < 2) { mlc__inflate_fail(s, s->size, "the header's CRC is cut off"); return; }
        if (crc != ((uint32_t)s->in[s->pos] | (uint32_t)s->in[s->pos + 1] << 8)) {
            mlc__inflate_fail(s, s->pos, "the header's CRC-16 does not match");
            return;
        }
        s->pos += 2;
    }
    if (s->bad) return;
    s->bits = 0; s->nbits = 0; s->out = 0; s->flushed = 0; s->crc = 0;
    mlc__inflate_blocks(s);
    mlc__inflate_flush(s);
    if (s->bad) return;
    s->bits = 0; s->nbits = 0;                      /* the trailer starts at a byte boundary */
    if (s->size - s->pos < 8) {
        mlc__inflate_fail(s, s->size, "the gzip trailer is cut off (truncated)");
        return;
    }
    if (mlc__le32(s->in + s->pos) != s->crc) {
        mlc__inflate_fail(s, s->pos, "CRC-32 mismatch: the data is corrupt");
        return;
    }
    if (mlc__le32(s->in + s->pos + 4) != (uint32_t)s->out) {
        mlc__inflate_fail(s, s->pos + 4, "the trailer gives the length %zu, but %zu bytes came out",
                          (size_t)mlc__le32(s->in + s->pos + 4), s->out);
        return;
    }
    s->pos += 8;
}

static int mlc__gunzip(mlc_ctx *ctx, const char *op, const void *data, size_t size, const char *name,
                       mlc_sink_fn sink, void *user) {
    mlc__inflate *s;
    int ok;
    if (!ctx || ctx->error) return 0;
    if ((!data && size) || !sink) {
        mlc__fail(ctx, MLC_ERR_NULL, "%s: %s is NULL", op, sink ? "data" : "sink");
        return 0;
    }
    if (!(s = (mlc__inflate *)mlc__heap_alloc(ctx, sizeof *s))) {
        mlc__fail(ctx, MLC_ERR_MEMORY, "%s: out of memory for the inflate state", op);
        return 0;
    }
    memset(s, 0, sizeof *s - sizeof s->window);
    s->ctx = ctx; s->op = op; s->name = name ? name : "memory";
    s->in = (const unsigned char *)data; s->size = size;
    s->sink = sink; s->user = user;
    mlc__crc32_table(s->crc_table);
    do mlc__gzip_member(s); while (!s->bad && s->pos < s->size);   /* members follow each other */
    ok = !s->bad;
    mlc__heap_free(ctx, s);
    return ok;
}

MLCDEF mlc_result mlc_gunzip(mlc_ctx *ctx, const void *data, size_t size, const char *name,
                             mlc_sink_fn sink, void *user) {
    if (!ctx) return MLC_ERR_NULL;
    return mlc__gunzip(ctx, "mlc_gunzip", data, size, name, sink, user) ? MLC_OK : ctx->error;
}

/* ---- IDX ------------------------------------------------------------------------------------
   Bytes 0 0, a type code, ndim; ndim big-endian uint32 dimensions; then the values, big-endian,
   row-major. The reader takes the bytes in pieces (straight from inflate's window when the
   file is gzipped), so the decompressed file is never held whole: the header first, then the
   tensor is made and each value converted as it arrives. */
typedef struct mlc__idx {
    mlc_ctx *ctx;
    const char *op, *name;
    int flags, gzipped;
    size_t limit;                       /* the most bytes the input can hold after the header */
    unsigned char head[4 + 4 * MLC_MAX_DIMS];
    size_t head_size;                   /* 4 until ndim is known */
    size_t offset;                      /* bytes taken so far */
    int type, width;                    /* the type code, and its bytes per value */
    mlc_tensor *t;
    size_t done;                        /* values written */
    unsigned char part[8];              /* a value split between two pieces */
    int part_len;
} mlc__idx;

static int mlc__idx_fail(mlc__idx *r, size_t at, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    mlc__fail_io(r->ctx, r->op, r->name, at, r->gzipped ? " of the decompressed data" : "", fmt, ap);
    va_end(ap);
    return 1;                                        /* for the sink: stop */
}

static int mlc__idx_width(int type) {
    switch (type) {
    case 0x08: case 0x09: return 1;                  /* u8, i8 */
    case 0x0B: return 2;                             /* i16 */
    case 0x0C: case 0x0D: return 4;                  /* i32, f32 */
    case 0x0E: return 8;                             /* f64 */
    default: return 0;
    }
}

static float mlc__idx_value(const unsigned char *p, int type, int scale_u8) {
    uint32_t u;
    float f;
    double d;
    switch (type) {
    case 0x08: return scale_u8 ? (float)p[0] / 255.0f : (float)p[0];
    case 0x09: return (float)((int)p[0] - (p[0] >= 128 ? 256 : 0));
    case 0x0B: u = (uint32_t)p[0] << 8 | p[1]; return (float)((long)u - (u >= 32768u ? 65536L : 0L));
    case 0x0C: u = mlc__be32(p); return (float)((double)u - (u >= 0x80000000u ? 4294967296.0 : 0.0));
    case 0x0D: u = mlc__be32(p); memcpy(&f, &u, 4); return f;
    default: {
        uint64_t w = (uint64_t)mlc__be32(p) << 32 | mlc__be32(p + 4);
        memcpy(&d, &w, 8);
        return (float)d;
    }
    }
}

/* The header is whole: check the shape against the input and make the tensor. */
static int mlc__idx_shape(mlc__idx *r) {
    mlc_tensor shape_of;                /* only for %T in messages */
    size_t count = 1, d, ndim = r->head[3];
    memset(&shape_of, 0, sizeof shape_of);
    shape_of.ndim = (int)ndim;
    for (d = 0; d < ndim; d++) {
        uint32_t v = mlc__be32(r->head + 4 + 4 * d);
        if (v > 2147483647u)
            return mlc__idx_fail(r, 4 + 4 * d, "dimension %zu is %zu, more than a tensor dimension holds "
                                 "(2^31 - 1)", d, (size_t)v);
        shape_of.shape[d] = (int)v;
        if (v && count > (size_t)-1 / (size_t)r->width / v)
            return mlc__idx_fail(r, 4 + 4 * d, "the dimensions' product overflows at dimension %zu", d);
        count *= v;
    }
    if (r->gzipped ? count * (size_t)r->width > r->limit - r->offset
                   : count * (size_t)r->width != r->limit - r->offset)
        return mlc__idx_fail(r, r->offset, "the shape %T needs %zu bytes of values, but the input holds "
                             "%s%zu",
                             &shape_of, count * (size_t)r->width, r->gzipped ? "at most " : "",
                             r->limit - r->offset);
    r->t = mlc__new(r->ctx, r->op, (int)ndim, shape_of.shape, 1);
    return r->t == NULL;
}

/* The sink: takes the next piece of the file. */
static int mlc__idx_take(const unsigned char *p, size_t n, void *user) {
    mlc__idx *r = (mlc__idx *)user;
    while (n) {
        size_t whole, i;
        if (!r->t) {                                /* the header, a byte at a time */
            r->head[r->offset++] = *p++;
            n--;
            if (r->offset == 4) {                   /* the magic: 0 0 type ndim */
                r->type = r->head[2];
                r->width = mlc__idx_width(r->type);
                if (r->head[0] || r->head[1])
                    return mlc__idx_fail(r, 0, "not an IDX file (it starts with %u %u, not 0 0)",
                                         r->head[0], r->head[1]);
                if (!r->width) return mlc__idx_fail(r, 2, "unknown type code %u", r->head[2]);
                if (r->head[3] < 1 || r->head[3] > MLC_MAX_DIMS)
                    return mlc__idx_fail(r, 3, "%u dimensions (a tensor has 1 to %d)", r->head[3],
                                         MLC_MAX_DIMS);
                r->head_size = 4 + 4 * (size_t)r->head[3];
            } else if (r->offset == r->head_size && mlc__idx_shape(r)) return 1;
            continue;
        }
        if (r->done == r->t->size)
            return mlc__idx_fail(r, r->offset, "more bytes follow the %zu values of shape %T", r->t->size,
                                 r->t);
        if (r->part_len || n < (size_t)r->width) {  /* a value split across pieces */
            while (n && r->part_len < r->width) { r->part[r->part_len++] = *p++; n--; r->offset++; }
            if (r->part_len == r->width) {
                r->t->data[r->done++] = mlc__idx_value(r->part, r->type, r->flags & MLC_IDX_SCALE_U8);
                r->part_len = 0;
            }
            continue;
        }
        whole = n / (size_t)r->width;
        if (whole > r->t->size - r->done) whole = r->t->size - r->done;
        for (i = 0; i < whole; i++)
            r->t->data[r->done + i] = mlc__idx_value(p + i * (size_t)r->width, r->type,
                                                     r->flags & MLC_IDX_SCALE_U8);
        r->done += whole;
        p += whole * (size_t)r->width;
        n -= whole * (size_t)r->width;
        r->offset += whole * (size_t)r->width;
    }
    return 0;
}

static mlc_tensor *mlc__idx_parse(mlc_ctx *ctx, const char *op, const void *data, size_t size, int flags,
                                  const char *name) {
    mlc__idx r;
    const unsigned char *bytes = (const unsigned char *)data;
    if (!ctx || ctx->error) return NULL;
    if (!data && size) return (mlc_tensor *)mlc__fail(ctx, MLC_ERR_NULL, "%s: data is NULL", op);
    memset(&r, 0, sizeof r);
    r.ctx = ctx; r.op = op; r.name = name ? name : "memory"; r.flags = flags; r.head_size = 4;
    r.gzipped = size >= 2 && bytes[0] == 0x1f && bytes[1] == 0x8b;
    if (r.gzipped) {                                /* deflate expands 1032 times at the most */
        r.limit = size > (size_t)-1 / 1032 ? (size_t)-1 : size * 1032;
        mlc__gunzip(ctx, op, data, size, r.name, mlc__idx_take, &r);
    } else {
        r.limit = size;
        if (size) mlc__idx_take(bytes, size, &r);
    }
    if (!ctx->error && !r.t)
        mlc__idx_fail(&r, r.offset, "the header ends early (%zu of %zu bytes)", r.offset, r.head_size);
    else if (!ctx->error && r.done < r.t->size)
        mlc__idx_fail(&r, r.offset, "the data ends early: shape %T needs %zu bytes of values, %zu are there",
                      r.t, r.t->size * (size_t)r.width, r.offset - r.head_size);
    if (ctx->error) {
        if (r.t) mlc_tensor_free(r.t);
        return NULL;
    }
    mlc__host_wrote(r.t);
    return r.t;
}

MLCDEF mlc_tensor *mlc_idx_from_memory(mlc_ctx *ctx, const void *data, size_t size, int flags,
                                       const char *name) {
    return mlc__idx_parse(ctx, "mlc_idx_from_memory", data, size, flags, name);
}

/* ---- CSV ------------------------------------------------------------------------------------ */

/* A decimal number as strtod reads one (sign, digits, point, exponent; nan, inf), without the
   locale. 1 when [p, end) is exactly one number, 2 when it is nan or inf spelled out, else 0. */
static int mlc__parse_number(const char *p, const char *end, double *out) {
    unsigned long long mantissa = 0;
    int digits = 0, scale = 0, negative = 0;
    long exponent = 0;
    if (p < end && (*p == '+' || *p == '-')) negative = *p++ == '-';
    if (end - p == 3 || end - p == 8) {             /* nan, inf, infinity (any case) */
        char word[9];
        int i, n = (int)(end - p);
        for (i = 0; i < n; i++) word[i] = (char)(p[i] | 0x20);
        word[n] = '\0';
        if (!strcmp(word, "nan") || !strcmp(word, "inf") || !strcmp(word, "infinity")) {
            *out = word[0] == 'n' ? (double)NAN : negative ? -(double)INFINITY : (double)INFINITY;
            return 2;
        }
    }
    for (; p < end && *p >= '0' && *p <= '9'; p++, digits++)     /* 19 digits are kept, */
        if (mantissa < 1000000000000000000ULL) mantissa = mantissa * 10 + (unsigned)(*p - '0');
        else scale++;                                             /* the rest only scale */
    if (p < end && *p == '.')
        for (p++; p < end && *p >= '0' && *p <= '9'; p++, digits++)
            if (mantissa < 1000000000000000000ULL) {
                mantissa = mantissa * 10 + (unsigned)(*p - '0');
                scale--;
            }
    if (!digits) return 0;
    if (p < end && (*p == 'e' || *p == 'E')) {
        int esign = 1, edigits = 0;
        p++;
        if (p < end && (*p == '+' || *p == '-')) esign = *p++ == '-' ? -1 : 1;
        for (; p < end && *p >= '0' && *p <= '9'; p++, edigits++)
            if (exponent < 100000) exponent = exponent * 10 + (*p - '0');
        if (!edigits) return 0;
        scale += (int)(esign * exponent);
    }
    if (p != end) return 0;
    *out = mantissa == 0 ? 0.0 : scale < 0 ? (double)mantissa / pow(10.0, -scale)
                                           : (double)mantissa * pow(10.0, scale);
    if (negative) *out = -*out;
    return 1;
}

typedef struct mlc__csv {
    mlc_ctx *ctx;
    const char *op, *name, *text;
    size_t size;
    int header, rows, cols;
} mlc__csv;

/* One pass over the text: without out it counts and checks rows and fields; with out (after
   such a pass) it fills out. 1: fine. */
static int mlc__csv_scan(mlc__csv *c, float *out) {
    const char *p = c->text, *end = c->text + c->size;
    int line = 0, rows = 0, cols = -1;
    for (; p < end; line++) {
        const char *eol = (const char *)memchr(p, '\n', (size_t)(end - p));
        const char *stop = eol ? eol : end, *next = eol ? eol + 1 : end, *q;
        int fields = 0;
        if (stop > p && stop[-1] == '\r') stop--;
        for (q = p; q < stop && (*q == ' ' || *q == '\t'); q++) {}
        if ((line == 0 && c->header) || q == stop) { p = next; continue; }   /* header, blank line */
        for (q = p;; q++) {                         /* each field up to a comma or the line's end */
            const char *comma = (const char *)memchr(q, ',', (size_t)(stop - q));
            const char *from = q, *to = comma ? comma : stop;
            double v = 0.0;
            int kind;
            fields++;
            while (from < to && (*from == ' ' || *from == '\t')) from++;
            while (to > from && (to[-1] == ' ' || to[-1] == '\t')) to--;
            kind = mlc__parse_number(from, to, &v);
            if (!kind || (kind == 1 && fabs(v) > (double)FLT_MAX)) {                  /* 1e39 is no float */
                char field[40];
                size_t n = (size_t)(to - from) < sizeof field - 4 ? (size_t)(to - from) : sizeof field - 4;
                memcpy(field, from, n);
                strcpy(field + n, (size_t)(to - from) > n ? "..." : "");
                mlc__fail(c->ctx, MLC_ERR_IO, "%s: %s: line %d, field %d (byte %zu): \"%s\" is %s", c->op,
                          c->name, line + 1, fields, (size_t)(from - c->text), field,
                          from == to ? "empty, not a number"
                                     : kind ? "outside float's range" : "not a number");
                return 0;
            }
            if (out) out[(size_t)rows * (size_t)c->cols + (size_t)fields - 1] = (float)v;
            if (!comma) break;
            q = comma;
        }
        if (cols < 0) cols = fields;
        else if (fields != cols) {
            mlc__fail(c->ctx, MLC_ERR_IO, "%s: %s: line %d (byte %zu) has %d fields, but the first row "
                      "has %d",
                      c->op, c->name, line + 1, (size_t)(p - c->text), fields, cols);
            return 0;
        }
        if (rows == 2147483647) {
            mlc__fail(c->ctx, MLC_ERR_IO, "%s: %s: more than 2^31 - 1 rows", c->op, c->name);
            return 0;
        }
        rows++;
        p = next;
    }
    if (!rows) { mlc__fail(c->ctx, MLC_ERR_IO, "%s: %s: no rows of numbers", c->op, c->name); return 0; }
    c->rows = rows;
    c->cols = cols;
    return 1;
}

static mlc_tensor *mlc__csv_parse(mlc_ctx *ctx, const char *op, const char *text, size_t size, int header,
                                  const char *name) {
    mlc__csv c;
    mlc_tensor *t;
    int shape[2];
    if (!ctx || ctx->error) return NULL;
    if (!text && size) return (mlc_tensor *)mlc__fail(ctx, MLC_ERR_NULL, "%s: text is NULL", op);
    memset(&c, 0, sizeof c);
    c.ctx = ctx; c.op = op; c.name = name ? name : "memory"; c.text = text; c.size = size; c.header = header;
    if (!mlc__csv_scan(&c, NULL)) return NULL;
    shape[0] = c.rows;
    shape[1] = c.cols;
    if (!(t = mlc__new(ctx, op, 2, shape, 1))) return NULL;
    mlc__csv_scan(&c, t->data);
    mlc__host_wrote(t);
    return t;
}

MLCDEF mlc_tensor *mlc_csv_from_memory(mlc_ctx *ctx, const char *text, size_t size, int header,
                                       const char *name) {
    return mlc__csv_parse(ctx, "mlc_csv_from_memory", text, size, header, name);
}

/* ---- Whole files ---------------------------------------------------------------------------- */
#ifndef MLC_NO_STDIO
/* Whether an open file's first byte reads (a directory opens on POSIX but does not read: EISDIR,
   and its "size" would read as a huge allocation); back at the start after. */
static int mlc__readable(FILE *f) {
    int c;
    errno = 0;
    c = getc(f);
    if (c == EOF && ferror(f)) {
        if (!errno) errno = EIO;
        return 0;
    }
    return fseek(f, 0, SEEK_SET) == 0;
}

/* The file's bytes on the heap (mlc__heap_free them), or NULL with the error set. */
static unsigned char *mlc__read_file(mlc_ctx *ctx, const char *op, const char *path, size_t *size) {
    FILE *f;
    long n;
    unsigned char *bytes = NULL;
    if (!ctx || ctx->error) return NULL;
    if (!path) return (unsigned char *)mlc__fail(ctx, MLC_ERR_NULL, "%s: path is NULL", op);
    if (!(f = fopen(path, "rb")))
        return (unsigned char *)mlc__fail(ctx, MLC_ERR_IO, "%s: cannot open %s: %s", op, path,
                                          strerror(errno));
    if (!mlc__readable(f))
        mlc__fail(ctx, MLC_ERR_IO, "%s: cannot read %s: %s", op, path, strerror(errno));
    else if (fseek(f, 0, SEEK_END) != 0 || (n = ftell(f)) < 0 || fseek(f, 0, SEEK_SET) != 0)
        mlc__fail(ctx, MLC_ERR_IO, "%s: %s: cannot find the file's size", op, path);
    else if (!(bytes = (unsigned char *)mlc__heap_alloc(ctx, (size_t)n + 1)))
        mlc__fail(ctx, MLC_ERR_MEMORY, "%s: %s: out of memory reading %zu bytes", op, path, (size_t)n);
    else if (fread(bytes, 1, (size_t)n, f) != (size_t)n) {
        mlc__fail(ctx, MLC_ERR_IO, "%s: %s: read error before byte %zu", op, path, (size_t)n);
        mlc__heap_free(ctx, bytes);
        bytes = NULL;
    }
    fclose(f);
    if (bytes) *size = (size_t)n;
    return bytes;
}

MLCDEF mlc_tensor *mlc_idx_load(mlc_ctx *ctx, const char *path, int flags) {
    size_t size = 0;
    unsigned char *bytes = mlc__read_file(ctx, "mlc_idx_load", path, &size);
    mlc_tensor *t = bytes ? mlc__idx_parse(ctx, "mlc_idx_load", bytes, size, flags, path) : NULL;
    if (bytes) mlc__heap_free(ctx, bytes);
    return t;
}

MLCDEF mlc_tensor *mlc_csv_load(mlc_ctx *ctx, const char *path, int header) {
    size_t size = 0;
    unsigned char *bytes = mlc__read_file(ctx, "mlc_csv_load", path, &size);
    mlc_tensor *t = bytes ? mlc__csv_parse(ctx, "mlc_csv_load", (const char *)bytes, size, header, path)
                          : NULL;
    if (bytes) mlc__heap_free(ctx, bytes);
    return t;
}
#endif

/* ---- Batches -------------------------------------------------------------------------------- */
struct mlc_batches {
    mlc_ctx *ctx;
    mlc_tensor *x, *y;
    int n, batch_size, shuffle, drop_last;
    int next;                           /* the next position in order; -1: an epoch starts */
    int *order;                         /* this epoch's permutation of 0..n-1 */
};

/* A uniform integer in [0, bound), bound > 0: rejection, so no value is favoured. */
static uint32_t mlc__rand_below(mlc_ctx *ctx, uint32_t bound) {
    uint32_t threshold = (0u - bound) % bound, r;
    do r = mlc_rand_u32(ctx); while (r < threshold);
    return r % bound;
}

MLCDEF mlc_batches *mlc_batches_create(mlc_tensor *x, mlc_tensor *y, mlc_batch_opts config) {
    mlc_ctx *ctx;
    mlc_batches *b;
    if (!x) return NULL;
    ctx = x->ctx;
    if (ctx->error || !MLC__ARGS_OK(ctx, "mlc_batches_create", x, y)) return NULL;
    if (config.batch_size < 0)
        return (mlc_batches *)mlc__fail(ctx, MLC_ERR_ARG, "mlc_batches_create: batch_size %d is negative",
                                        config.batch_size);
    if (x->ndim < 1 || (y && (y->ndim < 1 || y->shape[0] != x->shape[0])))
        return (mlc_batches *)mlc__fail(ctx, MLC_ERR_SHAPE, "mlc_batches_create: x %T and y %T need the same "
                                        "first dimension", x, y);
    if (!(b = (mlc_batches *)mlc__owned_alloc(ctx, sizeof *b, "mlc_batches_create"))) return NULL;
    b->order = (int *)mlc__owned_alloc(ctx, sizeof(int) * ((size_t)x->shape[0] + 1), "mlc_batches_create");
    if (!b->order) { mlc__owned_free(ctx, b); return NULL; }
    b->ctx = ctx; b->x = x; b->y = y; b->n = x->shape[0];
    b->batch_size = config.batch_size ? config.batch_size : 32;
    b->shuffle = config.shuffle; b->drop_last = config.drop_last;
    b->next = -1;
    return b;
}

/* Rows order[from, from + count) of t as a new [count, ...] tensor of its dtype in the current
   frame, on the context's device. */
static mlc_tensor *mlc__gather_rows(mlc_tensor *t, const int *order, int count) {
    int shape[MLC_MAX_DIMS], i;
    const size_t width = t->dtype == MLC_F32 ? sizeof(float) : sizeof(uint16_t);
    const size_t row = t->shape[0] ? t->size / (size_t)t->shape[0] * width : 0;   /* bytes */
    mlc_tensor *out;
    memcpy(shape, t->shape, sizeof shape);
    shape[0] = count;
    mlc__host_sync(t);
    t->ctx->op_device = t->ctx->backend != NULL;
    t->ctx->op_dtype = t->dtype;
    if (t->ctx->error || !(out = mlc__make(t->ctx, "mlc_batches_next", t->ndim, shape, 0))) return NULL;
    for (i = 0; i < count; i++)
        memcpy((char *)mlc__storage(out) + (size_t)i * row,
               (const char *)mlc__storage(t) + (size_t)order[i] * row, row);
    mlc__host_wrote(out);
    return out;
}

MLCDEF int mlc_batches_next(mlc_batches *b, mlc_tensor **x, mlc_tensor **y) {
    int count, i;
    if (x) *x = NULL;
    if (y) *y = NULL;
    if (!b || b->ctx->error) return 0;
    if (b->next < 0) {                              /* a new epoch: 0..n-1, shuffled (Fisher-Yates) */
        for (i = 0; i < b->n; i++) b->order[i] = i;
        for (i = b->n - 1; b->shuffle && i > 0; i--) {
            int j = (int)mlc__rand_below(b->ctx, (uint32_t)i + 1u), keep = b->order[i];
            b->order[i] = b->order[j];
            b->order[j] = keep;
        }
        b->next = 0;
    }
    count = b->n - b->next < b->batch_size ? b->n - b->next : b->batch_size;
    if (count == 0 || (b->drop_last && count < b->batch_size)) { b->next = -1; return 0; }
    if (x && !(*x = mlc__gather_rows(b->x, b->order + b->next, count))) return 0;
    if (y && b->y && !(*y = mlc__gather_rows(b->y, b->order + b->next, count))) return 0;
    b->next += count;
    return 1;
}

MLCDEF int mlc_batches_count(const mlc_batches *b) {
    if (!b) return 0;
    return b->n / b->batch_size + (!b->drop_last && b->n % b->batch_size != 0);   /* (no n + size - 1) */
}

MLCDEF void mlc_batches_free(mlc_batches *b) {
    if (!b) return;
    mlc__owned_free(b->ctx, b->order);
    mlc__owned_free(b->ctx, b);
}

/* ============================================================================================
   @section safetensors  Files: safetensors and checkpoints
   Reading checks before it touches anything: the header length (8 bytes, little-endian, at
   most 100 MiB and inside the file), then a strict JSON parser (nesting at most 64 deep,
   escapes with \uXXXX and surrogate pairs, UTF-8 checked, no NUL in a string) fills a table
   of entries; each entry's dtype, shape (element count and byte count without overflow) and
   data_offsets are checked, the table is sorted by offset (no overlap, no gap, no bytes after
   the last tensor) and by name (no duplicates). Only then is tensor data read, converted to
   float32 from little-endian bytes on any host. Writing builds the header twice (once to
   measure), pads it with spaces to a multiple of 8, then streams the data.
   ============================================================================================ */

#define MLC__ST_MAX_HEADER ((size_t)100 << 20)   /* the reference implementation's limit */
#define MLC__ST_MAX_DEPTH 64
#define MLC__ST_RESERVED "__mlc__."

typedef enum { MLC__F32, MLC__F16, MLC__BF16, MLC__F64, MLC__I64, MLC__I32, MLC__I16, MLC__I8, MLC__U64,
               MLC__U32, MLC__U16, MLC__U8, MLC__BOOL, MLC__F8_E4M3, MLC__F8_E5M2,
               MLC__DTYPE_COUNT } mlc__dtype;
static const char *const mlc__dtype_names[] = { "F32", "F16", "BF16", "F64", "I64", "I32", "I16", "I8", "U64",
                                                "U32", "U16", "U8", "BOOL", "F8_E4M3", "F8_E5M2" };
static const unsigned char mlc__dtype_sizes[] = { 4, 2, 2, 8, 8, 4, 2, 1, 8, 4, 2, 1, 1, 1, 1 };
typedef char mlc__dtype_names_check[sizeof mlc__dtype_names / sizeof(char *) == MLC__DTYPE_COUNT ? 1 : -1];
typedef char mlc__dtype_sizes_check[sizeof mlc__dtype_sizes == MLC__DTYPE_COUNT ? 1 : -1];

typedef struct mlc__st_entry {
    const char *name;
    int dtype, ndim;
    int shape[MLC_MAX_DIMS];
    size_t begin, end;                  /* data_offsets, from the start of the data */
    size_t at;                          /* where its name starts in the file, for messages */
} mlc__st_entry;

struct mlc_safetensors {
    mlc_ctx *ctx;
    const char *label;                  /* the file's name in messages */
    const unsigned char *body;          /* the tensors' bytes */
    size_t body_size, body_at;          /* their size and offset in the file (8 + header) */
    void *copy;                         /* the file's bytes, when mlc_safetensors_open read them */
    mlc__st_entry *entries, **by_name;  /* in file order, and sorted by name */
    int count, capacity;
    const char **meta;                  /* __metadata__: key, value, key, value, ... */
    int n_meta, cap_meta;
    char *pool;                         /* decoded strings; never longer than the header */
    size_t pool_used, pool_cap;
};

/* A corrupt file: MLC_ERR_IO naming the file, the tensor (when known) and the byte offset. */
static void *mlc__st_fail(mlc_safetensors *st, const char *tensor, size_t at, const char *fmt, ...) {
    char what[200], name[84];
    size_t n;
    va_list ap;
    va_start(ap, fmt);
    mlc__vformat(what, sizeof what, fmt, ap);
    va_end(ap);
    if (!tensor) return mlc__fail(st->ctx, MLC_ERR_IO, "safetensors %s: %s (byte %zu)", st->label, what, at);
    n = strlen(tensor);
    mlc__format(name, sizeof name, "%s%s", n > 80 ? "..." : "", tensor + (n > 80 ? n - 77 : 0));
    return mlc__fail(st->ctx, MLC_ERR_IO, "safetensors %s: tensor \"%s\": %s (byte %zu)", st->label, name,
                     what, at);
}

static uint64_t mlc__le(const unsigned char *p, int bytes) {   /* a little-endian unsigned integer */
    uint64_t v = 0;
    while (bytes-- > 0) v = v << 8 | p[bytes];
    return v;
}

/* The length of the UTF-8 sequence at s (n bytes left), 0 when it is not valid UTF-8
   (overlong forms, surrogates and code points above U+10FFFF are not). */
static size_t mlc__utf8_len(const unsigned char *s, size_t n) {
    unsigned long cp;
    size_t len, k;
    if (s[0] < 0x80) return 1;
    if (s[0] >= 0xC2 && s[0] <= 0xDF) { len = 2; cp = s[0] & 0x1Fu; }
    else if (s[0] >= 0xE0 && s[0] <= 0xEF) { len = 3; cp = s[0] & 0x0Fu; }
    else if (s[0] >= 0xF0 && s[0] <= 0xF4) { len = 4; cp = s[0] & 0x07u; }
    else return 0;
    if (n < len) return 0;
    for (k = 1; k < len; k++) {
        if ((s[k] & 0xC0) != 0x80) return 0;
        cp = cp << 6 | (s[k] & 0x3Fu);
    }
    if (len == 3 && (cp < 0x800 || (cp >= 0xD800 && cp <= 0xDFFF))) return 0;
    if (len == 4 && (cp < 0x10000 || cp > 0x10FFFF)) return 0;
    return len;
}

static int mlc__utf8_valid(const char *s) {
    size_t n = strlen(s), i = 0, len;
    while (i < n) {
        if (!(len = mlc__utf8_len((const unsigned char *)s + i, n - i))) return 0;
        i += len;
    }
    return 1;
}

/* ---- The JSON header: a strict parser for what safetensors needs -------------------------- */

typedef struct mlc__json {
    mlc_safetensors *st;
    const unsigned char *s;
    size_t n, i;
    const char *tensor;                 /* the entry being read, for messages */
} mlc__json;

static int mlc__json_fail(mlc__json *j, const char *what) {
    if (j->i >= j->n)
        mlc__st_fail(j->st, j->tensor, 8 + j->i, "header JSON: %s, found the header's end", what);
    else mlc__st_fail(j->st, j->tensor, 8 + j->i, "header JSON: %s", what);
    return 0;
}

static int mlc__json_peek(mlc__json *j) {
    while (j->i < j->n &&
           (j->s[j->i] == ' ' || j->s[j->i] == '\t' || j->s[j->i] == '\n' || j->s[j->i] == '\r'))
        j->i++;
    return j->i < j->n ? j->s[j->i] : -1;
}

static int mlc__json_expect(mlc__json *j, int c, const char *what) {
    if (mlc__json_peek(j) != c) return mlc__json_fail(j, what);
    j->i++;
    return 1;
}

static int mlc__json_hex4(mlc__json *j, unsigned long *cp) {
    int k;
    *cp = 0;
    for (k = 0; k < 4; k++, j->i++) {
        int c = j->i < j->n ? j->s[j->i] : -1;
        int v = c >= '0' && c <= '9' ? c - '0'
            : c >= 'a' && c <= 'f'   ? c - 'a' + 10
            : c >= 'A' && c <= 'F'   ? c - 'A' + 10
                                     : -1;
        if (v < 0) return mlc__json_fail(j, "expected four hex digits after \\u");
        *cp = *cp << 4 | (unsigned long)v;
    }
    return 1;
}

/* A string, decoded into the pool (NUL-terminated); NULL on error. Decoding never makes a
   string longer than its JSON form, so the pool (the header's size) always has room. */
static const char *mlc__json_string(mlc__json *j) {
    mlc_safetensors *st = j->st;
    char *out = st->pool + st->pool_used;
    size_t k = 0, len;
    if (mlc__json_peek(j) != '"') { mlc__json_fail(j, "expected a string"); return NULL; }
    j->i++;
    for (;;) {
        unsigned long cp;
        int c = j->i < j->n ? j->s[j->i] : -1;
        MLC_ASSERT(st->pool_used + k + 4 <= st->pool_cap);
        if (c < 0) { mlc__json_fail(j, "unterminated string"); return NULL; }
        if (c == '"') { j->i++; break; }
        if (c < 0x20) { mlc__json_fail(j, "control character in a string"); return NULL; }
        if (c != '\\') {
            if (!(len = mlc__utf8_len(j->s + j->i, j->n - j->i))) {
                mlc__json_fail(j, "a string is not valid UTF-8");
                return NULL;
            }
            memcpy(out + k, j->s + j->i, len);
            k += len; j->i += len;
            continue;
        }
        j->i++;
        c = j->i < j->n ? j->s[j->i++] : -1;
        switch (c) {
        case '"': case '\\': case '/': out[k++] = (char)c; continue;
        case 'b': out[k++] = '\b'; continue;
        case 'f': out[k++] = '\f'; continue;
        case 'n': out[k++] = '\n'; continue;
        case 'r': out[k++] = '\r'; continue;
        case 't': out[k++] = '\t'; continue;
        case 'u': break;
        default: mlc__json_fail(j, "unknown escape in a string"); return NULL;
        }
        if (!mlc__json_hex4(j, &cp)) return NULL;
        if (cp >= 0xDC00 && cp <= 0xDFFF) {
            mlc__json_fail(j, "a low surrogate without its high half");
            return NULL;
        }
        if (cp >= 0xD800 && cp <= 0xDBFF) {                 /* a pair: \uD83D\uDE00 */
            unsigned long lo;
            if (j->i + 2 > j->n || j->s[j->i] != '\\' || j->s[j->i + 1] != 'u') {
                mlc__json_fail(j, "a high surrogate without its low half"); return NULL;
            }
            j->i += 2;
            if (!mlc__json_hex4(j, &lo)) return NULL;
            if (lo < 0xDC00 || lo > 0xDFFF) {
                mlc__json_fail(j, "a high surrogate without its low half");
                return NULL;
            }
            cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
        }
        if (cp == 0) { mlc__json_fail(j, "\\u0000 in a string"); return NULL; }
        if (cp < 0x80) out[k++] = (char)cp;
        else if (cp < 0x800) { out[k++] = (char)(0xC0 | cp >> 6); out[k++] = (char)(0x80 | (cp & 0x3F)); }
        else if (cp < 0x10000) {
            out[k++] = (char)(0xE0 | cp >> 12);
            out[k++] = (char)(0x80 | (cp >> 6 & 0x3F));
            out[k++] = (char)(0x80 | (cp & 0x3F));
        } else {
            out[k++] = (char)(0xF0 | cp >> 18); out[k++] = (char)(0x80 | (cp >> 12 & 0x3F));
            out[k++] = (char)(0x80 | (cp >> 6 & 0x3F)); out[k++] = (char)(0x80 | (cp & 0x3F));
        }
    }
    out[k] = '\0';
    st->pool_used += k + 1;
    return out;
}

/* A non-negative integer without sign, fraction or exponent. */
static int mlc__json_uint(mlc__json *j, uint64_t *v) {
    int c = mlc__json_peek(j);
    if (c == '-') return mlc__json_fail(j, "a negative number");
    if (c < '0' || c > '9') return mlc__json_fail(j, "expected a non-negative integer");
    if (c == '0' && j->i + 1 < j->n && j->s[j->i + 1] >= '0' && j->s[j->i + 1] <= '9')
        return mlc__json_fail(j, "a number with a leading zero");
    for (*v = 0; j->i < j->n && j->s[j->i] >= '0' && j->s[j->i] <= '9'; j->i++) {
        unsigned d = (unsigned)(j->s[j->i] - '0');
        if (*v > (UINT64_MAX - d) / 10) return mlc__json_fail(j, "a number above 2^64");
        *v = *v * 10 + d;
    }
    if (j->i < j->n && (j->s[j->i] == '.' || j->s[j->i] == 'e' || j->s[j->i] == 'E'))
        return mlc__json_fail(j, "expected an integer");
    return 1;
}

/* Any value (a key this reader does not use), nested at most MLC__ST_MAX_DEPTH deep. */
static int mlc__json_skip(mlc__json *j, int depth) {
    int c = mlc__json_peek(j), close;
    size_t mark = j->st->pool_used;
    if (depth > MLC__ST_MAX_DEPTH) return mlc__json_fail(j, "nested more than 64 deep");
    if (c == '"') { const char *s = mlc__json_string(j); j->st->pool_used = mark; return s != NULL; }
    if (c == '{' || c == '[') {
        close = c == '{' ? '}' : ']';
        j->i++;
        if (mlc__json_peek(j) == close) { j->i++; return 1; }
        for (;;) {
            if (close == '}') {
                const char *key = mlc__json_string(j);
                j->st->pool_used = mark;
                if (!key || !mlc__json_expect(j, ':', "expected ':'")) return 0;
            }
            if (!mlc__json_skip(j, depth + 1)) return 0;
            if (mlc__json_peek(j) != ',') break;
            j->i++;
        }
        return mlc__json_expect(j, close, close == '}' ? "expected ',' or '}'" : "expected ',' or ']'");
    }
    if (c == 't' || c == 'f' || c == 'n') {
        const char *word = c == 't' ? "true" : c == 'f' ? "false" : "null";
        size_t len = strlen(word);
        if (j->n - j->i < len || memcmp(j->s + j->i, word, len) != 0)
            return mlc__json_fail(j, "expected a value");
        j->i += len;
        return 1;
    }
    if (c == '-' || (c >= '0' && c <= '9')) {           /* -?(0|[1-9][0-9]*)(.[0-9]+)?([eE][+-]?[0-9]+)? */
        size_t digits;
        if (c == '-') j->i++;
        if (j->i < j->n && j->s[j->i] == '0') j->i++;
        else {
            for (digits = 0; j->i < j->n && j->s[j->i] >= '0' && j->s[j->i] <= '9'; j->i++) digits++;
            if (!digits) return mlc__json_fail(j, "expected digits");
        }
        if (j->i < j->n && j->s[j->i] == '.') {
            for (j->i++, digits = 0; j->i < j->n && j->s[j->i] >= '0' && j->s[j->i] <= '9'; j->i++) digits++;
            if (!digits) return mlc__json_fail(j, "expected digits after '.'");
        }
        if (j->i < j->n && (j->s[j->i] == 'e' || j->s[j->i] == 'E')) {
            j->i++;
            if (j->i < j->n && (j->s[j->i] == '+' || j->s[j->i] == '-')) j->i++;
            for (digits = 0; j->i < j->n && j->s[j->i] >= '0' && j->s[j->i] <= '9'; j->i++) digits++;
            if (!digits) return mlc__json_fail(j, "expected digits in an exponent");
        }
        return 1;
    }
    return mlc__json_fail(j, "expected a value");
}

/* ---- Reading: the table of entries, checked --------------------------------------------- */

static int mlc__st_dims(mlc__json *j, mlc__st_entry *e) {
    uint64_t v;
    if (!mlc__json_expect(j, '[', "expected '[' to open shape")) return 0;
    if (mlc__json_peek(j) == ']') { j->i++; return 1; }
    for (;;) {
        if (e->ndim == MLC_MAX_DIMS)
            return mlc__json_fail(j, "shape has more than 6 dimensions (MLC_MAX_DIMS)");
        if (!mlc__json_uint(j, &v)) return 0;
        if (v > 2147483647u) return mlc__json_fail(j, "a dimension above 2^31 - 1");
        e->shape[e->ndim++] = (int)v;
        if (mlc__json_peek(j) != ',') break;
        j->i++;
    }
    return mlc__json_expect(j, ']', "expected ',' or ']' in shape");
}

static int mlc__st_offsets(mlc__json *j, mlc__st_entry *e) {
    uint64_t a, b;
    if (!mlc__json_expect(j, '[', "expected '[' to open data_offsets") || !mlc__json_uint(j, &a) ||
        !mlc__json_expect(j, ',', "data_offsets needs two numbers") || !mlc__json_uint(j, &b) ||
        !mlc__json_expect(j, ']', "data_offsets needs two numbers")) return 0;
    if (a > b) return mlc__json_fail(j, "data_offsets begins after it ends");
    if (b > (uint64_t)(size_t)-1)
        return mlc__json_fail(j, "data_offsets beyond this machine's address space");
    e->begin = (size_t)a; e->end = (size_t)b;
    return 1;
}

/* One tensor's entry: {"dtype": "F32", "shape": [...], "data_offsets": [b, e]}; other keys
   are skipped; each of the three appears once. */
static int mlc__st_entry_parse(mlc__json *j, mlc__st_entry *e) {
    int have = 0, bit;
    size_t mark = j->st->pool_used;
    if (!mlc__json_expect(j, '{', "expected '{' to open a tensor's entry")) return 0;
    if (mlc__json_peek(j) != '}')
        for (;;) {
            size_t key_at = j->i;
            const char *key = mlc__json_string(j);
            if (!key || !mlc__json_expect(j, ':', "expected ':'")) return 0;
            bit = strcmp(key, "dtype") == 0        ? 1
                : strcmp(key, "shape") == 0        ? 2
                : strcmp(key, "data_offsets") == 0 ? 4
                                                   : 0;
            j->st->pool_used = mark;
            if (bit & have) { j->i = key_at; return mlc__json_fail(j, "a key given twice"); }
            have |= bit;
            if (bit == 1) {
                const char *dtype = mlc__json_string(j);
                if (!dtype) return 0;
                for (e->dtype = 0; e->dtype < MLC__DTYPE_COUNT && strcmp(dtype, mlc__dtype_names[e->dtype]);
                     e->dtype++) {}
                j->st->pool_used = mark;
                if (e->dtype == MLC__DTYPE_COUNT) return mlc__json_fail(j, "unknown dtype");
            } else if (bit == 2) { if (!mlc__st_dims(j, e)) return 0; }
            else if (bit == 4) { if (!mlc__st_offsets(j, e)) return 0; }
            else if (!mlc__json_skip(j, 3)) return 0;
            if (mlc__json_peek(j) != ',') break;
            j->i++;
        }
    if (!mlc__json_expect(j, '}', "expected ',' or '}' in a tensor's entry")) return 0;
    if (have != 7) {
        j->i--;
        return mlc__json_fail(j, !(have & 1) ? "no dtype" : !(have & 2) ? "no shape" : "no data_offsets");
    }
    return 1;
}

/* Room for `need` items in an owned array of `size`-byte items holding `used` (doubling). */
static int mlc__st_grow(mlc_ctx *ctx, void **items, int *cap, int used, int need, size_t size) {
    void *p;
    int n = *cap ? *cap : 16;
    if (need <= *cap) return 1;
    while (n < need) {
        if (n > 0x3FFFFFFF) return mlc__fail(ctx, MLC_ERR_MEMORY, "safetensors: too many entries") != NULL;
        n *= 2;
    }
    if (!(p = mlc__owned_alloc(ctx, (size_t)n * size, "safetensors"))) return 0;
    if (used) memcpy(p, *items, (size_t)used * size);
    mlc__owned_free(ctx, *items);
    *items = p; *cap = n;
    return 1;
}

static int mlc__st_metadata(mlc__json *j) {
    mlc_safetensors *st = j->st;
    if (!mlc__json_expect(j, '{', "expected '{' to open __metadata__")) return 0;
    if (mlc__json_peek(j) == '}') { j->i++; return 1; }
    for (;;) {
        const char *key, *value;
        if (!mlc__st_grow(st->ctx, (void **)&st->meta, &st->cap_meta, st->n_meta, st->n_meta + 2,
                          sizeof(char *)))
            return 0;
        if (!(key = mlc__json_string(j)) || !mlc__json_expect(j, ':', "expected ':'")) return 0;
        if (mlc__json_peek(j) != '"') return mlc__json_fail(j, "a __metadata__ value is not a string");
        if (!(value = mlc__json_string(j))) return 0;
        st->meta[st->n_meta++] = key; st->meta[st->n_meta++] = value;
        if (mlc__json_peek(j) != ',') break;
        j->i++;
    }
    return mlc__json_expect(j, '}', "expected ',' or '}' in __metadata__");
}

static int mlc__st_header(mlc_safetensors *st, const unsigned char *header, size_t n) {
    mlc__json j;
    int have_meta = 0;
    j.st = st; j.s = header; j.n = n; j.i = 0; j.tensor = NULL;
    if (!mlc__json_expect(&j, '{', "expected '{' to open the header")) return 0;
    if (mlc__json_peek(&j) != '}')
        for (;;) {
            size_t at = j.i;
            const char *name = mlc__json_string(&j);
            if (!name || !mlc__json_expect(&j, ':', "expected ':'")) return 0;
            if (strcmp(name, "__metadata__") == 0) {
                if (have_meta) { j.i = at; return mlc__json_fail(&j, "__metadata__ given twice"); }
                have_meta = 1;
                if (!mlc__st_metadata(&j)) return 0;
            } else {
                mlc__st_entry *e;
                if (!mlc__st_grow(st->ctx, (void **)&st->entries, &st->capacity, st->count, st->count + 1,
                                  sizeof *e))
                    return 0;
                e = &st->entries[st->count++];
                memset(e, 0, sizeof *e);
                e->name = name; e->at = 8 + at;
                j.tensor = name;
                if (!mlc__st_entry_parse(&j, e)) return 0;
                j.tensor = NULL;
            }
            if (mlc__json_peek(&j) != ',') break;
            j.i++;
        }
    if (!mlc__json_expect(&j, '}', "expected ',' or '}' in the header")) return 0;
    if (mlc__json_peek(&j) != -1) return mlc__json_fail(&j, "bytes after the header's JSON");
    return 1;
}

static int mlc__st_by_name(const void *a, const void *b) {
    return strcmp((*(const mlc__st_entry *const *)a)->name, (*(const mlc__st_entry *const *)b)->name);
}
static int mlc__st_by_offset(const void *a, const void *b) {
    const mlc__st_entry *x = *(const mlc__st_entry *const *)a, *y = *(const mlc__st_entry *const *)b;
    return x->begin != y->begin ? (x->begin < y->begin ? -1 : 1)
        : x->end != y->end      ? (x->end < y->end ? -1 : 1)
                                : 0;
}

/* Every entry's size from dtype and shape (no overflow) matches its offsets, which lie in the
   file; sorted by offset they tile the data exactly; no name comes twice. */
static int mlc__st_check(mlc_safetensors *st) {
    mlc__st_entry **order;
    size_t expected = 0;
    int i, d;
    for (i = 0; i < st->count; i++) {
        mlc__st_entry *e = &st->entries[i];
        size_t count = 1, bytes;
        for (d = 0; d < e->ndim; d++) {
            if (e->shape[d] && count > (size_t)-1 / (size_t)e->shape[d])
                return mlc__st_fail(st, e->name, e->at, "its shape's element count overflows") != NULL;
            count *= (size_t)e->shape[d];
        }
        if (count > (size_t)-1 / mlc__dtype_sizes[e->dtype])
            return mlc__st_fail(st, e->name, e->at, "its byte count overflows") != NULL;
        bytes = count * mlc__dtype_sizes[e->dtype];
        if (e->end > st->body_size)
            return mlc__st_fail(st, e->name, st->body_at + e->begin,
                                "data_offsets [%zu, %zu] run past the data's "
                                "%zu bytes (a truncated file?)",
                                e->begin, e->end, st->body_size) != NULL;
        if (e->end - e->begin != bytes)
            return mlc__st_fail(st, e->name, st->body_at + e->begin,
                                "data_offsets [%zu, %zu] hold %zu bytes, "
                                "but %s of %zu elements needs %zu",
                                e->begin, e->end, e->end - e->begin, mlc__dtype_names[e->dtype], count,
                                bytes) != NULL;
    }
    if (!(order = (mlc__st_entry **)mlc__owned_alloc(st->ctx, ((size_t)st->count + 1) * sizeof *order,
                                                     "safetensors")))
        return 0;
    for (i = 0; i < st->count; i++) order[i] = &st->entries[i];
    qsort(order, (size_t)st->count, sizeof *order, mlc__st_by_offset);
    for (i = 0; i < st->count; i++) {
        const mlc__st_entry *e = order[i];
        if (e->begin < expected) {
            mlc__st_fail(st, e->name, st->body_at + e->begin, "its data overlaps tensor \"%s\"",
                         order[i - 1]->name);
            break;
        }
        if (e->begin > expected) {
            mlc__st_fail(st, e->name, st->body_at + expected, "a gap of %zu bytes before its data",
                         e->begin - expected);
            break;
        }
        expected = e->end;
    }
    if (i == st->count && expected != st->body_size)
        mlc__st_fail(st, NULL, st->body_at + expected, "%zu bytes after the last tensor",
                     st->body_size - expected);
    qsort(order, (size_t)st->count, sizeof *order, mlc__st_by_name);
    for (i = 1; !st->ctx->error && i < st->count; i++)
        if (strcmp(order[i - 1]->name, order[i]->name) == 0) {
            const mlc__st_entry *later = order[i - 1]->at > order[i]->at ? order[i - 1] : order[i];
            mlc__st_fail(st, later->name, later->at, "the name appears twice");
        }
    st->by_name = order;
    return !st->ctx->error;
}

MLCDEF void mlc_safetensors_close(mlc_safetensors *st) {
    mlc_ctx *ctx;
    if (!st) return;
    ctx = st->ctx;
    mlc__owned_free(ctx, st->entries);
    mlc__owned_free(ctx, st->by_name);
    mlc__owned_free(ctx, (void *)st->meta);
    mlc__owned_free(ctx, st->pool);
    mlc__owned_free(ctx, st->copy);
    mlc__owned_free(ctx, st);
}

/* Checksums: mlc writes "mlc.crc32:NAME": "8 hex digits" into __metadata__ for each tensor, the
   CRC-32 of its bytes in the file (other readers ignore the keys). A file that has them is
   checked whole when it opens: a flipped bit fails by name and offset, never loads. */
#define MLC__ST_CRC_KEY "mlc.crc32:"
static const mlc__st_entry *mlc__st_find(const mlc_safetensors *st, const char *name);
static int mlc__st_verify(mlc_safetensors *st) {
    const size_t prefix = sizeof MLC__ST_CRC_KEY - 1;
    uint32_t table[256];
    int i, made = 0;
    for (i = 0; i < st->n_meta; i += 2) {
        const char *key = st->meta[i], *value = st->meta[i + 1];
        const mlc__st_entry *e;
        unsigned long stored = 0;
        uint32_t crc;
        int k;
        if (strncmp(key, MLC__ST_CRC_KEY, prefix) != 0) continue;
        if (!(e = mlc__st_find(st, key + prefix)))
            return mlc__st_fail(st, key + prefix, 0, "the metadata holds a checksum for it, but the file has "
                                "no such tensor (a name corrupted?)") != NULL;
        for (k = 0; k < 8 && value[k]; k++) {
            const int c = value[k];
            const int digit = c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : -1;
            if (digit < 0) break;
            stored = stored << 4 | (unsigned long)digit;
        }
        if (k != 8 || value[8])
            return mlc__st_fail(st, e->name, e->at, "its checksum \"%s\" is not 8 hex digits", value) != NULL;
        if (!made) { mlc__crc32_table(table); made = 1; }
        crc = mlc__crc32(table, 0, st->body + e->begin, e->end - e->begin);
        if (crc != stored)
            return mlc__st_fail(st, e->name, st->body_at + e->begin, "its bytes [%zu, %zu) fail their CRC-32 "
                                "(stored %08lx, computed %08lx): the file is corrupt", st->body_at + e->begin,
                                st->body_at + e->end, stored, (unsigned long)crc) != NULL;
    }
    return 1;
}

MLCDEF mlc_safetensors *mlc_safetensors_from_memory(mlc_ctx *ctx, const void *data, size_t size,
                                                    const char *label) {
    mlc_safetensors *st;
    const unsigned char *p = (const unsigned char *)data;
    uint64_t n;
    size_t label_len;
    if (!ctx || ctx->error) return NULL;
    if (!data && size)
        return (mlc_safetensors *)mlc__fail(ctx, MLC_ERR_NULL, "mlc_safetensors_from_memory: data is NULL");
    if (!label) label = "(memory)";
    label_len = strlen(label);
    if (!(st = (mlc_safetensors *)mlc__owned_alloc(ctx, sizeof *st + label_len + 1, "safetensors")))
        return NULL;
    st->ctx = ctx;
    memcpy((char *)(st + 1), label, label_len + 1);
    st->label = (const char *)(st + 1);
    if (size < 8) {
        mlc__st_fail(st, NULL, 0, "the file is %zu bytes, too short for the 8-byte header length", size);
        goto fail;
    }
    n = mlc__le(p, 8);
    if (n > MLC__ST_MAX_HEADER) {
        mlc__st_fail(st, NULL, 0, "the header length %zu is above the 100 MiB limit", (size_t)n);
        goto fail;
    }
    if (n > size - 8) {
        mlc__st_fail(st, NULL, 0, "the header length %zu runs past the file's end (%zu bytes; truncated?)",
                     (size_t)n, size);
        goto fail;
    }
    st->body = p + 8 + n; st->body_at = 8 + (size_t)n; st->body_size = size - 8 - (size_t)n;
    st->pool_cap = (size_t)n + 8;
    if (!(st->pool = (char *)mlc__owned_alloc(ctx, st->pool_cap, "safetensors"))) goto fail;
    if (!mlc__st_header(st, p + 8, (size_t)n) || !mlc__st_check(st) || !mlc__st_verify(st)) goto fail;
    return st;
fail:
    mlc_safetensors_close(st);
    return NULL;
}

MLCDEF int mlc_safetensors_count(const mlc_safetensors *st) { return st ? st->count : 0; }
MLCDEF const char *mlc_safetensors_name(const mlc_safetensors *st, int i) {
    return st && i >= 0 && i < st->count ? st->entries[i].name : NULL;
}
MLCDEF const char *mlc_safetensors_metadata(const mlc_safetensors *st, const char *key) {
    int i;
    for (i = 0; st && key && i < st->n_meta; i += 2)
        if (strcmp(st->meta[i], key) == 0) return st->meta[i + 1];
    return NULL;
}

static const mlc__st_entry *mlc__st_find(const mlc_safetensors *st, const char *name) {
    int lo = 0, hi = st->count;
    while (lo < hi) {
        int mid = lo + (hi - lo) / 2, c = strcmp(st->by_name[mid]->name, name);
        if (!c) return st->by_name[mid];
        if (c < 0) lo = mid + 1; else hi = mid;
    }
    return NULL;
}

static int mlc__st_loadable(int dtype) { return dtype != MLC__F8_E4M3 && dtype != MLC__F8_E5M2; }

/* count elements of dtype at p, to float32. */
static void mlc__st_convert(const unsigned char *p, int dtype, float *out, size_t count) {
    const uint32_t one = 1;
    size_t i, w = mlc__dtype_sizes[dtype];
    if (dtype == MLC__F32 && *(const unsigned char *)&one == 1) {   /* a little-endian host */
        if (count) memcpy(out, p, 4 * count);
        return;
    }
    for (i = 0; i < count; i++, p += w) {
        uint64_t v = mlc__le(p, (int)w);
        uint32_t bits;
        double d;
        switch (dtype) {
        case MLC__F32: bits = (uint32_t)v; memcpy(&out[i], &bits, 4); continue;
        case MLC__F16: out[i] = mlc_f16_to_float((uint16_t)v); continue;
        case MLC__BF16: bits = (uint32_t)v << 16; memcpy(&out[i], &bits, 4); continue;
        case MLC__F64: memcpy(&d, &v, 8); break;
        case MLC__I64: d = (double)(int64_t)v; break;
        case MLC__I32: d = (double)(int32_t)(uint32_t)v; break;
        case MLC__I16: d = (double)(int16_t)(uint16_t)v; break;
        case MLC__I8: d = (double)(int8_t)(uint8_t)v; break;
        case MLC__BOOL: d = v != 0; break;
        default: d = (double)v; break;                  /* the unsigned integers */
        }
        out[i] = d > (double)FLT_MAX ? HUGE_VALF : d < -(double)FLT_MAX ? -HUGE_VALF : (float)d;
    }
}

MLCDEF mlc_tensor *mlc_safetensors_get(mlc_safetensors *st, const char *name) {
    const mlc__st_entry *e;
    mlc_tensor *t;
    if (!st || st->ctx->error) return NULL;
    if (!name || !(e = mlc__st_find(st, name)))
        return (mlc_tensor *)mlc__fail(st->ctx, MLC_ERR_ARG, "mlc_safetensors_get: %s has no tensor \"%s\"",
                                       st->label, name);
    if (!mlc__st_loadable(e->dtype))
        return (mlc_tensor *)mlc__st_fail(st, name, e->at, "dtype %s cannot be read as float32",
                                          mlc__dtype_names[e->dtype]);
    if (!(t = mlc_empty(st->ctx, e->ndim, e->shape))) return NULL;
    mlc__st_convert(st->body + e->begin, e->dtype, t->data, t->size);
    mlc__host_wrote(t);
    return t;
}

/* ---- Loading a module's state ------------------------------------------------------------ */

static void mlc__st_note(mlc_load_report *r, const char *kind, const char *name, const mlc_tensor *file_shape,
                         const mlc_tensor *shape) {
    size_t n = strlen(r->names);
    if (n + 4 >= sizeof r->names) return;
    if (n + 40 + strlen(name) >= sizeof r->names) { memcpy(r->names + n, "...", 4); return; }
    if (shape)
        mlc__format(r->names + n, sizeof r->names - n, "%s%s %s %T in the file, %T here", n ? "; " : "", kind,
                    name, file_shape, shape);
    else mlc__format(r->names + n, sizeof r->names - n, "%s%s %s", n ? "; " : "", kind, name);
}

static int mlc__st_reserved(const char *name) {
    return strncmp(name, MLC__ST_RESERVED, sizeof MLC__ST_RESERVED - 1) == 0;
}

/* A tensor's host copy is about to be overwritten: wait for an upload that may read it. */
static float *mlc__st_host_for_write(mlc_tensor *t) {
    if (t->device_data) t->ctx->backend->wait(t->ctx, 0);
    return t->data;
}

/* t's values from a file's at p, of its dtype: a bf16 or f16 tensor takes the bits of its own
   dtype as they are (no widening on the way), other dtypes through float32, rounded. */
static void mlc__st_load_values(const unsigned char *p, int dtype, mlc_tensor *t) {
    float chunk[256];
    size_t i, n, w = mlc__dtype_sizes[dtype];
    if (t->dtype == MLC_I8) {                            /* (an I8 entry: checked before) */
        if (t->device_data) t->ctx->backend->wait(t->ctx, 0);
        memcpy(t->int8, p, t->size);
        return;
    }
    if (t->dtype == MLC_F32) { mlc__st_convert(p, dtype, mlc__st_host_for_write(t), t->size); return; }
    if (dtype == (t->dtype == MLC_BF16 ? MLC__BF16 : MLC__F16)) {
        for (i = 0; i < t->size; i++) t->half[i] = (uint16_t)(p[2 * i] | p[2 * i + 1] << 8);
        return;
    }
    for (i = 0; i < t->size; i += n) {
        n = t->size - i < 256 ? t->size - i : 256;
        mlc__st_convert(p + i * w, dtype, chunk, n);
        mlc__narrow(t->dtype, chunk, t->half + i, n);
    }
}

/* A quantized module's scales and zero points from a file, checked before anything is loaded:
   in a module that holds int8 tensors, a tensor named *scale (weight_scale, scale, input_scale,
   weight_ih_l0_scale, ...) must hold positive finite values and one named *zero_point whole
   numbers in [-128, 127]; else an error naming the entry, the value and its place. */
static int mlc__st_quant_params_ok(mlc_safetensors *st, const mlc_named_tensor *state, int n,
                                   const mlc__st_entry *e, const char *name) {
    const size_t length = strlen(name), width = mlc__dtype_sizes[e->dtype];
    const int is_scale = length >= 5 && !strcmp(name + length - 5, "scale");
    const int is_zero = length >= 10 && !strcmp(name + length - 10, "zero_point");
    size_t i;
    int k, quantized = 0;
    for (k = 0; k < n && !quantized; k++) quantized = state[k].tensor->dtype == MLC_I8;
    if (!quantized || (!is_scale && !is_zero)) return 1;
    for (i = 0; i < (e->end - e->begin) / width; i++) {
        float v;
        mlc__st_convert(st->body + e->begin + i * width, e->dtype, &v, 1);
        if (is_scale ? v > 0.0f && mlc__is_finite(v) && mlc__is_finite(1.0f / v)
                     : v >= -128.0f && v <= 127.0f && v == (float)(int)v)
            continue;
        mlc__st_fail(st, e->name, st->body_at + e->begin + i * width, "value %g at index %zu is not a %s",
                     (double)v, i,
                     is_scale ? "positive finite scale" : "zero point (a whole number in [-128, 127])");
        return 0;
    }
    return 1;
}

MLCDEF mlc_result mlc_safetensors_load(mlc_safetensors *st, mlc_module *m, const mlc_load_opts *opts) {
    mlc_ctx *ctx;
    mlc_named_tensor *state = NULL;
    unsigned char *used = NULL;
    const mlc__st_entry **match = NULL;
    mlc_load_report report;
    int n, i, partial = opts && opts->partial;
    if (!st || !m)
        return st             ? mlc__fail(st->ctx, MLC_ERR_NULL, "mlc_safetensors_load: module is NULL"),
               st->ctx->error : MLC_ERR_NULL;
    ctx = st->ctx;
    if (ctx->error) return ctx->error;
    memset(&report, 0, sizeof report);
    n = mlc_module_state(m, NULL, 0);
    state = (mlc_named_tensor *)mlc__owned_alloc(ctx, ((size_t)n + 1) * sizeof *state,
                                                 "mlc_safetensors_load");
    match = (const mlc__st_entry **)mlc__owned_alloc(ctx, ((size_t)n + 1) * sizeof *match,
                                                     "mlc_safetensors_load");
    used = (unsigned char *)mlc__owned_alloc(ctx, (size_t)st->count + 1, "mlc_safetensors_load");
    if (!state || !match || !used) goto done;
    mlc_module_state(m, state, n);
    if (ctx->error) goto done;                                   /* a name too long */
    for (i = 0; i < n; i++) { /* every state tensor: in the file, shaped so? */
        const mlc__st_entry *e = mlc__st_find(st, state[i].name);
        mlc_tensor *t = state[i].tensor, file_shape;
        if (!e) { report.missing++; mlc__st_note(&report, "missing", state[i].name, NULL, NULL); continue; }
        used[e - st->entries] = 1;
        if (!mlc__st_loadable(e->dtype)) {
            mlc__st_fail(st, e->name, e->at, "dtype %s cannot be loaded as float32",
                         mlc__dtype_names[e->dtype]);
            goto done;
        }
        if ((e->dtype == MLC__I8) != (t->dtype == MLC_I8)) {   /* quantized values are not numbers */
            mlc__st_fail(st, e->name, e->at, "the entry is %s and the module's tensor %s: %s",
                         mlc__dtype_names[e->dtype], mlc_dtype_name(t->dtype),
                         t->dtype == MLC_I8 ? "load the float model, then quantize it"
                                            : "quantize the module first (mlc_quantize_dynamic)");
            goto done;
        }
        if (e->ndim != t->ndim || memcmp(e->shape, t->shape, (size_t)t->ndim * sizeof(int)) != 0) {
            memset(&file_shape, 0, sizeof file_shape);
            file_shape.ndim = e->ndim;
            memcpy(file_shape.shape, e->shape, sizeof e->shape);
            report.mismatched++;
            mlc__st_note(&report, "shape", state[i].name, &file_shape, t);
            continue;
        }
        match[i] = e;
    }
    for (i = 0; i < st->count; i++)
        if (!used[i] && !mlc__st_reserved(st->entries[i].name)) {
            report.unexpected++;
            mlc__st_note(&report, "unexpected", st->entries[i].name, NULL, NULL);
        }
    if (!partial && (report.missing || report.unexpected || report.mismatched)) {
        mlc__fail(ctx, report.mismatched ? MLC_ERR_SHAPE : MLC_ERR_ARG,
                  "mlc_safetensors_load: %s does not fit the "
                  "module (nothing loaded): %s",
                  st->label, report.names);
        goto done;
    }
    for (i = 0; i < n; i++)                               /* nothing changes unless all can change */
        if (match[i] && (!mlc__writable(state[i].tensor, "mlc_safetensors_load")
                         || !mlc__st_quant_params_ok(st, state, n, match[i], state[i].name)))
            goto done;
    for (i = 0; i < n; i++) {
        mlc_tensor *t = state[i].tensor;
        if (!match[i]) continue;
        mlc__st_load_values(st->body + match[i]->begin, match[i]->dtype, t);
        mlc__host_wrote(t);
        report.loaded++;
    }
done:
    if (opts && opts->report) *opts->report = report;
    mlc__owned_free(ctx, state);
    mlc__owned_free(ctx, (void *)match);
    mlc__owned_free(ctx, used);
    return ctx->error;
}

MLCDEF mlc_result mlc_module_load_from_memory(mlc_module *m, const void *data, size_t size,
                                         const mlc_load_opts *opts) {
    mlc_safetensors *st;
    if (!m) return MLC_ERR_NULL;
    if (!(st = mlc_safetensors_from_memory(m->ctx, data, size, NULL))) return m->ctx->error;
    mlc_safetensors_load(st, m, opts);
    mlc_safetensors_close(st);
    return m->ctx->error;
}

/* ---- Writing ------------------------------------------------------------------------------ */

typedef struct mlc__st_item {           /* one tensor to write: float32 data, or raw bytes */
    const char *name;
    int dtype, ndim;
    int shape[MLC_MAX_DIMS];
    mlc_tensor *t;
    const unsigned char *raw;
    size_t bytes;
} mlc__st_item;

typedef struct mlc__out { unsigned char *buf; size_t n, cap; } mlc__out;   /* measures when buf is NULL */

static void mlc__out_bytes(mlc__out *o, const void *p, size_t len) {
    if (o->buf && o->n <= o->cap && len <= o->cap - o->n) memcpy(o->buf + o->n, p, len);
    o->n += len;
}
static void mlc__out_str(mlc__out *o, const char *s) { mlc__out_bytes(o, s, strlen(s)); }
static void mlc__out_uint(mlc__out *o, size_t v) {
    char text[24];
    mlc__format(text, sizeof text, "%zu", v);
    mlc__out_str(o, text);
}
static void mlc__out_json_text(mlc__out *o, const char *s) {   /* inside a JSON string (valid UTF-8) */
    static const char hex[] = "0123456789abcdef";
    for (; *s; s++) {
        unsigned char c = (unsigned char)*s;
        char esc[6] = { '\\', 'u', '0', '0', 0, 0 };
        if (c == '"' || c == '\\') { esc[1] = (char)c; mlc__out_bytes(o, esc, 2); }
        else if (c < 0x20) { esc[4] = hex[c >> 4]; esc[5] = hex[c & 15]; mlc__out_bytes(o, esc, 6); }
        else mlc__out_bytes(o, s, 1);
    }
}
static void mlc__out_json(mlc__out *o, const char *s) {   /* a JSON string */
    mlc__out_str(o, "\"");
    mlc__out_json_text(o, s);
    mlc__out_str(o, "\"");
}

/* The header's JSON, padded with spaces so the data starts at a multiple of 8; __metadata__
   holds the caller's pairs, then each tensor's checksum (mlc__st_verify). */
static void mlc__st_build_header(mlc__out *o, const mlc__st_item *items, int count,
                                 const char *const *metadata, const uint32_t *crcs) {
    static const char hex[] = "0123456789abcdef";
    size_t offset = 0;
    int i, d, pairs = 0;
    mlc__out_str(o, "{");
    if ((metadata && metadata[0]) || count) {
        mlc__out_str(o, "\"__metadata__\":{");
        for (i = 0; metadata && metadata[i] && metadata[i + 1]; i += 2, pairs++) {
            if (pairs) mlc__out_str(o, ",");
            mlc__out_json(o, metadata[i]); mlc__out_str(o, ":"); mlc__out_json(o, metadata[i + 1]);
        }
        for (i = 0; i < count; i++, pairs++) {
            char value[11] = "\"00000000\"";
            for (d = 0; d < 8; d++) value[8 - d] = hex[crcs[i] >> (4 * d) & 15u];
            if (pairs) mlc__out_str(o, ",");
            mlc__out_str(o, "\"" MLC__ST_CRC_KEY);
            mlc__out_json_text(o, items[i].name);
            mlc__out_str(o, "\":");
            mlc__out_str(o, value);
        }
        mlc__out_str(o, count ? "}," : "}");
    }
    for (i = 0; i < count; i++) {
        if (i) mlc__out_str(o, ",");
        mlc__out_json(o, items[i].name);
        mlc__out_str(o, ":{\"dtype\":\"");
        mlc__out_str(o, mlc__dtype_names[items[i].dtype]);
        mlc__out_str(o, "\",\"shape\":[");
        for (d = 0; d < items[i].ndim; d++) {
            if (d) mlc__out_str(o, ",");
            mlc__out_uint(o, (size_t)items[i].shape[d]);
        }
        mlc__out_str(o, "],\"data_offsets\":["); mlc__out_uint(o, offset); mlc__out_str(o, ",");
        offset += items[i].bytes;
        mlc__out_uint(o, offset); mlc__out_str(o, "]}");
    }
    mlc__out_str(o, "}");
    while (o->n % 8) mlc__out_str(o, " ");
}

/* Names and metadata are UTF-8, names unique and not "__metadata__"; the tensors exist. */
static int mlc__st_check_items(mlc_ctx *ctx, const char *op, const mlc__st_item *items, int count,
                               const char *const *metadata) {
    int i, k;
    for (i = 0; metadata && metadata[i]; i++) {
        if (!mlc__utf8_valid(metadata[i]))
            return mlc__fail(ctx, MLC_ERR_ARG, "%s: metadata string %d is not UTF-8", op, i) != NULL;
        if (i % 2 == 0 && !metadata[i + 1])
            return mlc__fail(ctx, MLC_ERR_ARG, "%s: metadata key \"%s\" has no value", op, metadata[i]) !=
                NULL;
    }
    for (i = 0; i < count; i++) {
        if (!items[i].name || !mlc__utf8_valid(items[i].name) || strcmp(items[i].name, "__metadata__") == 0)
            return mlc__fail(ctx, MLC_ERR_ARG, "%s: tensor %d's name is NULL, not UTF-8 or __metadata__", op,
                             i) != NULL;
        if (!items[i].t && !items[i].raw)
            return mlc__fail(ctx, MLC_ERR_NULL, "%s: tensor \"%s\" is NULL", op, items[i].name) != NULL;
        if (items[i].t && !mlc__args_ok(ctx, op, 1, items[i].t)) return 0;
        for (k = 0; k < i; k++)
            if (strcmp(items[k].name, items[i].name) == 0)
                return mlc__fail(ctx, MLC_ERR_ARG, "%s: the name \"%s\" comes twice", op, items[i].name) !=
                    NULL;
    }
    return 1;
}

typedef int (*mlc__sink)(void *user, const void *bytes, size_t len);   /* 1: written */

/* One tensor's bytes, little-endian, through sink */
static int mlc__st_item_bytes(mlc_ctx *ctx, const mlc__st_item *item, mlc__sink sink, void *user) {
    unsigned char chunk[4096];
    const float *data;
    size_t j, k, n;
    int ok = 1;
    if (item->raw) return !item->bytes || sink(user, item->raw, item->bytes);
    mlc__host_sync(item->t);
    if (item->t->dtype == MLC_I8) return !item->bytes || sink(user, item->t->int8, item->bytes);
    if (item->t->dtype != MLC_F32) {                     /* bf16, f16: their bits */
        const uint16_t *bits = item->t->half;
        for (j = 0; ok && j < item->t->size; j += n) {
            n = item->t->size - j < sizeof chunk / 2 ? item->t->size - j : sizeof chunk / 2;
            for (k = 0; k < n; k++) {
                chunk[2 * k] = (unsigned char)bits[j + k];
                chunk[2 * k + 1] = (unsigned char)(bits[j + k] >> 8);
            }
            ok = sink(user, chunk, 2 * n);
        }
        return ok && !ctx->error;
    }
    if (!(data = mlc__host(item->t)) || ctx->error) return 0;
    for (j = 0; ok && j < item->t->size; j += n) {
        n = item->t->size - j < sizeof chunk / 4 ? item->t->size - j : sizeof chunk / 4;
        for (k = 0; k < n; k++) {
            uint32_t bits = item->dtype == MLC__I32 ? (uint32_t)(int32_t)data[j + k] : 0;   /* (whole) */
            if (item->dtype != MLC__I32) memcpy(&bits, &data[j + k], 4);
            chunk[4 * k] = (unsigned char)bits; chunk[4 * k + 1] = (unsigned char)(bits >> 8);
            chunk[4 * k + 2] = (unsigned char)(bits >> 16);
            chunk[4 * k + 3] = (unsigned char)(bits >> 24);
        }
        ok = sink(user, chunk, 4 * n);
    }
    return ok;
}

typedef struct mlc__crc_sink { uint32_t table[256], crc; } mlc__crc_sink;
static int mlc__sink_crc(void *user, const void *bytes, size_t len) {
    mlc__crc_sink *c = (mlc__crc_sink *)user;
    c->crc = mlc__crc32(c->table, c->crc, (const unsigned char *)bytes, len);
    return 1;
}

/* The whole file through sink: length, header (with each tensor's checksum, a first pass over
   its bytes), then each tensor as little-endian bytes. */
static int mlc__st_write(mlc_ctx *ctx, const char *op, const mlc__st_item *items, int count,
                         const char *const *metadata, mlc__sink sink, void *user) {
    mlc__out header = { NULL, 0, 0 };
    mlc__crc_sink *crc;
    uint32_t *crcs;
    unsigned char length[8];
    int i, ok = 1;
    if (!mlc__st_check_items(ctx, op, items, count, metadata)) return 0;
    if (!(crc = (mlc__crc_sink *)mlc__owned_alloc(ctx, sizeof *crc + ((size_t)count + 1) * sizeof *crcs, op)))
        return 0;
    crcs = (uint32_t *)(void *)(crc + 1);
    mlc__crc32_table(crc->table);
    for (i = 0; ok && i < count; i++) {
        crc->crc = 0;
        ok = mlc__st_item_bytes(ctx, &items[i], mlc__sink_crc, crc);
        crcs[i] = crc->crc;
    }
    if (ok) mlc__st_build_header(&header, items, count, metadata, crcs);
    if (ok && !(header.buf = (unsigned char *)mlc__owned_alloc(ctx, header.n, op))) ok = 0;
    if (ok) {
        header.cap = header.n; header.n = 0;
        mlc__st_build_header(&header, items, count, metadata, crcs);
        for (i = 0; i < 8; i++) length[i] = (unsigned char)((uint64_t)header.n >> (8 * i));
        ok = sink(user, length, 8) && sink(user, header.buf, header.n);
    }
    if (header.buf) mlc__owned_free(ctx, header.buf);
    mlc__owned_free(ctx, crc);
    for (i = 0; ok && i < count; i++) ok = mlc__st_item_bytes(ctx, &items[i], sink, user);
    return ok && !ctx->error;
}

static int mlc__sink_memory(void *user, const void *bytes, size_t len) {
    mlc__out_bytes((mlc__out *)user, bytes, len);
    return 1;
}

/* Whether t, named name, is a quantized module's zero points (float32, named *zero_point as
   mlc__st_quant_params_ok finds them) holding whole numbers in [-128, 127]: written as I32, as
   PyTorch keeps zero points in integers (read back by any float32 tensor) */
static int mlc__st_whole_zero_points(mlc_tensor *t, const char *name) {
    const size_t length = strlen(name);
    const float *v;
    size_t i;
    if (!t || t->dtype != MLC_F32 || length < 10 || strcmp(name + length - 10, "zero_point") != 0
        || !(v = mlc__host(t)))
        return 0;
    for (i = 0; i < t->size; i++)
        if (!(v[i] >= -128.0f && v[i] <= 127.0f && v[i] == (float)(int)v[i])) return 0;
    return 1;
}

/* Items for tensors (each in its dtype; a quantized module's zero points I32); NULL on error. */
static mlc__st_item *mlc__st_items(mlc_ctx *ctx, const mlc_named_tensor *tensors, int count, int extra,
                                   const char *op) {
    mlc__st_item *items;
    int i, quantized = 0;
    if (count < 0 || (count && !tensors))
        return (mlc__st_item *)mlc__fail(ctx, MLC_ERR_ARG, "%s: %d tensors at %s", op, count,
                                         tensors ? "an address" : "NULL");
    if (!(items = (mlc__st_item *)mlc__owned_alloc(ctx, ((size_t)count + (size_t)extra + 1) * sizeof *items,
                                                   op)))
        return NULL;
    for (i = 0; i < count && !quantized; i++)
        quantized = tensors[i].tensor && tensors[i].tensor->dtype == MLC_I8;
    for (i = 0; i < count; i++) {
        mlc_tensor *t = tensors[i].tensor;
        items[i].name = tensors[i].name;
        items[i].dtype = !t || t->dtype == MLC_F32 ? MLC__F32
                         : t->dtype == MLC_BF16   ? MLC__BF16
                         : t->dtype == MLC_F16    ? MLC__F16
                                                  : MLC__I8;
        if (quantized && mlc__st_whole_zero_points(t, tensors[i].name)) items[i].dtype = MLC__I32;
        items[i].t = t;
        if (t) {
            items[i].ndim = t->ndim;
            memcpy(items[i].shape, t->shape, sizeof t->shape);
            items[i].bytes = mlc__dtype_sizes[items[i].dtype] * t->size;
        }
    }
    return items;
}

static size_t mlc__st_encode_items(mlc_ctx *ctx, const char *op, const mlc__st_item *items, int count,
                                   const char *const *metadata, void *buf, size_t cap) {
    mlc__out out;
    out.buf = (unsigned char *)buf; out.n = 0; out.cap = buf ? cap : 0;
    if (!mlc__st_write(ctx, op, items, count, metadata, mlc__sink_memory, &out)) return 0;
    return out.n;
}

MLCDEF size_t mlc_safetensors_encode(mlc_ctx *ctx, const mlc_named_tensor *tensors, int count,
                                     const char *const *metadata, void *buf, size_t cap) {
    mlc__st_item *items;
    size_t n;
    if (!ctx || ctx->error || !(items = mlc__st_items(ctx, tensors, count, 0, "mlc_safetensors_encode")))
        return 0;
    n = mlc__st_encode_items(ctx, "mlc_safetensors_encode", items, count, metadata, buf, cap);
    mlc__owned_free(ctx, items);
    return n;
}

/* A module's state as a list (owned; free it with mlc__owned_free). */
static mlc_named_tensor *mlc__module_state_list(mlc_module *m, int *count, const char *op) {
    mlc_named_tensor *state;
    *count = mlc_module_state(m, NULL, 0);
    if (!(state = (mlc_named_tensor *)mlc__owned_alloc(m->ctx, ((size_t)*count + 1) * sizeof *state, op)))
        return NULL;
    mlc_module_state(m, state, *count);
    if (m->ctx->error) { mlc__owned_free(m->ctx, state); return NULL; }   /* a name too long */
    return state;
}

MLCDEF size_t mlc_module_encode(mlc_module *m, const char *const *metadata, void *buf, size_t cap) {
    mlc_named_tensor *state;
    size_t n;
    int count;
    if (!m || m->ctx->error || !(state = mlc__module_state_list(m, &count, "mlc_module_encode"))) return 0;
    n = mlc_safetensors_encode(m->ctx, state, count, metadata, buf, cap);
    mlc__owned_free(m->ctx, state);
    return n;
}

/* ---- Checkpoints ------------------------------------------------------------------------- */


typedef struct mlc__ckpt {              /* a checkpoint's items and the bytes of its scalars */
    mlc_named_tensor *list;             /* the module's state, then the optimiser's buffers */
    mlc__st_item *items;
    int count;
    unsigned char t[8], lr[4], train[16], rng[16], scale[4], tracker[8];
    char *params;                       /* the optimiser's parameters, by name and shape */
    const char *metadata[7];
} mlc__ckpt;

/* The optimiser's fingerprint: each of its parameters in order as "name[d0,d1]\n", the name the
   module's state gives it ("?" when not in the module). Owned; NULL and an error when out of memory. */
static char *mlc__ckpt_params(mlc_ctx *ctx, const mlc_optim *opt, const mlc_named_tensor *list, int n,
                              const char *op) {
    size_t cap = 1, at = 0;
    char *text;
    int i, j, d;
    for (i = 0; i < opt->count; i++) {
        for (j = 0; j < n && list[j].tensor != opt->params[i]; j++) continue;
        cap += (j < n ? strlen(list[j].name) : 1) + 3 + 12 * (size_t)opt->params[i]->ndim;
    }
    if (!(text = (char *)mlc__owned_alloc(ctx, cap, op))) return NULL;
    for (i = 0; i < opt->count; i++) {
        const mlc_tensor *p = opt->params[i];
        for (j = 0; j < n && list[j].tensor != p; j++) continue;
        mlc__format(text + at, cap - at, "%s[", j < n ? list[j].name : "?");
        at += strlen(text + at);
        for (d = 0; d < p->ndim; d++) {
            mlc__format(text + at, cap - at, d ? ",%d" : "%d", p->shape[d]);
            at += strlen(text + at);
        }
        mlc__format(text + at, cap - at, "]\n");
        at += strlen(text + at);
    }
    return text;
}

static void mlc__put_le(unsigned char *p, uint64_t v, int bytes) {
    int i;
    for (i = 0; i < bytes; i++) p[i] = (unsigned char)(v >> (8 * i));
}

static void mlc__ckpt_raw(mlc__ckpt *c, const char *name, int dtype, int dim, const unsigned char *raw,
                          size_t bytes) {
    mlc__st_item *it = &c->items[c->count++];
    memset(it, 0, sizeof *it);
    it->name = name;
    it->dtype = dtype;
    it->ndim = dim ? 1 : 0;
    it->shape[0] = dim;
    it->raw = raw;
    it->bytes = bytes;
}

static void mlc__ckpt_free(mlc_ctx *ctx, mlc__ckpt *c) {
    mlc__owned_free(ctx, c->list);
    mlc__owned_free(ctx, c->items);
    mlc__owned_free(ctx, c->params);
}

static int mlc__ckpt_build(mlc__ckpt *c, mlc_module *m, mlc_optim *opt, const mlc_train_state *state,
                           const char *op) {
    mlc_ctx *ctx = m->ctx;
    int n = mlc_module_state(m, NULL, 0), extra = 0, i, k;
    float lr = opt ? opt->lr : 0.0f;
    uint32_t lr_bits;
    memset(c, 0, sizeof *c);
    if (opt && opt->ctx != ctx)
        return mlc__fail(ctx, MLC_ERR_ARG, "%s: the optimiser belongs to another context", op) != NULL;
    for (i = 0; opt && i < opt->count; i++) for (k = 0; k < 3; k++) extra += opt->state[3 * i + k] != NULL;
    if (!(c->list = (mlc_named_tensor *)mlc__owned_alloc(
              ctx, ((size_t)n + (size_t)extra + 1) * sizeof *c->list, op)))
        return 0;
    mlc_module_state(m, c->list, n);
    if (ctx->error) return 0;                                    /* a name too long */
    for (i = 0, c->count = n; opt && i < opt->count; i++)
        for (k = 0; k < 3; k++)
            if (opt->state[3 * i + k]) {
                mlc__format(c->list[c->count].name, sizeof c->list[0].name, MLC__ST_RESERVED "optim.%d.%s", i,
                            mlc__optim_slot_names[opt->kind][k]);
                c->list[c->count++].tensor = opt->state[3 * i + k];
            }
    if (!(c->items = mlc__st_items(ctx, c->list, c->count, 6, op))) return 0;
    mlc__put_le(c->t, opt ? (uint64_t)opt->t : 0, 8);
    memcpy(&lr_bits, &lr, 4);
    mlc__put_le(c->lr, lr_bits, 4);
    mlc__put_le(c->train, state ? (uint64_t)state->step : 0, 8);
    mlc__put_le(c->train + 8, state ? (uint64_t)state->epoch : 0, 8);
    mlc__put_le(c->rng, ctx->rng_state, 8);
    mlc__put_le(c->rng + 8, ctx->rng_inc, 8);
    if (opt) {
        mlc__ckpt_raw(c, MLC__ST_RESERVED "optim.t", MLC__I64, 0, c->t, 8);
        mlc__ckpt_raw(c, MLC__ST_RESERVED "optim.lr", MLC__F32, 0, c->lr, 4);
    }
    mlc__ckpt_raw(c, MLC__ST_RESERVED "train", MLC__I64, 2, c->train, 16);
    mlc__ckpt_raw(c, MLC__ST_RESERVED "rng", MLC__U64, 2, c->rng, 16);
    if (opt && opt->scaler) {                            /* the gradient scaler's scale and clean steps */
        mlc__put_le(c->scale, mlc__bits(opt->scaler->scale), 4);
        mlc__put_le(c->tracker, (uint64_t)opt->scaler->growth_tracker, 8);
        mlc__ckpt_raw(c, MLC__ST_RESERVED "scaler.scale", MLC__F32, 0, c->scale, 4);
        mlc__ckpt_raw(c, MLC__ST_RESERVED "scaler.growth_tracker", MLC__I64, 0, c->tracker, 8);
    }
    c->metadata[0] = "format"; c->metadata[1] = "mlc-checkpoint";
    c->metadata[2] = "mlc.optim"; c->metadata[3] = opt ? mlc__optim_kind_names[opt->kind] : "none";
    if (opt) {
        if (!(c->params = mlc__ckpt_params(ctx, opt, c->list, n, op))) return 0;
        c->metadata[4] = "mlc.optim.params"; c->metadata[5] = c->params;
    }
    return 1;
}

MLCDEF size_t mlc_checkpoint_encode(mlc_module *m, mlc_optim *opt, const mlc_train_state *state, void *buf,
                                    size_t cap) {
    mlc__ckpt c;
    size_t n = 0;
    if (!m || m->ctx->error) return 0;
    if (mlc__ckpt_build(&c, m, opt, state, "mlc_checkpoint_encode"))
        n = mlc__st_encode_items(m->ctx, "mlc_checkpoint_encode", c.items, c.count, c.metadata, buf, cap);
    mlc__ckpt_free(m->ctx, &c);
    return n;
}

/* A reserved entry of the given dtype and shape ([] or [dim]), or NULL and an error. */
static const mlc__st_entry *mlc__ckpt_entry(mlc_safetensors *st, const char *name, int dtype, int dim) {
    const mlc__st_entry *e = mlc__st_find(st, name);
    if (!e)
        return (const mlc__st_entry *)mlc__st_fail(st, name, st->body_at, "the checkpoint lacks this entry");
    if (e->dtype != dtype || e->ndim != (dim ? 1 : 0) || (dim && e->shape[0] != dim))
        return (const mlc__st_entry *)mlc__st_fail(st, name, e->at, "expected %s of shape [%s%d]",
                                                   mlc__dtype_names[dtype], dim ? "" : "scalar ", dim);
    return e;
}

/* The optimiser's parameters must be the ones it saved, by name and shape, in order (a file
   from before mlc 0.1.1 has no "mlc.optim.params": then the entries' shapes are all checked). */
static mlc_result mlc__ckpt_check_params(mlc_safetensors *st, mlc_module *m, mlc_optim *opt) {
    mlc_ctx *ctx = st->ctx;
    const char *saved = mlc_safetensors_metadata(st, "mlc.optim.params"), *a, *b;
    mlc_named_tensor *list;
    char *here = NULL;
    int n, i;
    if (!saved) return MLC_OK;
    if ((list = mlc__module_state_list(m, &n, "mlc_checkpoint_load")))
        here = mlc__ckpt_params(ctx, opt, list, n, "mlc_checkpoint_load");
    mlc__owned_free(ctx, list);
    if (!here) return ctx->error;
    for (a = here, b = saved, i = 0; strcmp(a, b) != 0; i++) {   /* find the first line that differs */
        size_t la = strcspn(a, "\n"), lb = strcspn(b, "\n");
        if (la != lb || memcmp(a, b, la) || a[la] != b[lb] || !a[la]) {
            char x[128], y[128];
            mlc__format(x, la < sizeof x ? la + 1 : sizeof x, "%s", a);
            mlc__format(y, lb < sizeof y ? lb + 1 : sizeof y, "%s", b);
            mlc__st_fail(st, NULL, 8, "the optimiser's parameter %d is %s here but %s in the checkpoint "
                         "(another model's or another optimiser's state)", i, *a ? x : "(none)",
                         *b ? y : "(none)");
            break;
        }
        a += la + 1; b += lb + 1;
    }
    mlc__owned_free(ctx, here);
    return ctx->error;
}

static mlc_result mlc__checkpoint_load(mlc_safetensors *st, mlc_module *m, mlc_optim *opt,
                                       mlc_train_state *state) {
    mlc_ctx *ctx = st->ctx;
    const char *format = mlc_safetensors_metadata(st, "format"),
               *kind = mlc_safetensors_metadata(st, "mlc.optim");
    const mlc__st_entry *train, *rng, *t = NULL, *lr = NULL, *scale = NULL, *tracker = NULL;
    int i, k, found = 0, expected = 0;
    char name[128];
    if (!format || strcmp(format, "mlc-checkpoint") != 0) {
        mlc__st_fail(st, NULL, 8,
                     "not an mlc checkpoint (no \"format\": \"mlc-checkpoint\" in __metadata__)");
        return ctx->error;
    }
    if (!(train = mlc__ckpt_entry(st, MLC__ST_RESERVED "train", MLC__I64, 2)) ||
        !(rng = mlc__ckpt_entry(st, MLC__ST_RESERVED "rng", MLC__U64, 2))) return ctx->error;
    if (opt && opt->scaler
        && (!(scale = mlc__ckpt_entry(st, MLC__ST_RESERVED "scaler.scale", MLC__F32, 0))
            || !(tracker = mlc__ckpt_entry(st, MLC__ST_RESERVED "scaler.growth_tracker", MLC__I64, 0))))
        return ctx->error;
    if (scale) {                                         /* a scale must be a positive number */
        const long long growth = (long long)mlc__le(st->body + tracker->begin, 8);
        float v;
        mlc__st_convert(st->body + scale->begin, MLC__F32, &v, 1);
        if (!mlc__is_finite(v) || !(v > 0.0f) || growth < 0 || growth > (1LL << 53)) {
            mlc__st_fail(st, MLC__ST_RESERVED "scaler.scale", scale->at, "the gradient scaler's scale %g or "
                         "growth tracker is not valid", (double)v);
            return ctx->error;
        }
    }
    {                                                   /* every scalar, before anything changes */
        long long step = (long long)mlc__le(st->body + train->begin, 8),
                  epoch = (long long)mlc__le(st->body + train->begin + 8, 8);
        if (step < 0 || epoch < 0 || step > (1LL << 53) || epoch > (1LL << 53)) {
            mlc__st_fail(st, MLC__ST_RESERVED "train", train->at, "the step or epoch count is not in "
                         "[0, 2^53] (a count that could wrap as it goes on)");
            return ctx->error;
        }
        if (!(mlc__le(st->body + rng->begin + 8, 8) & 1u)) {   /* PCG's increment is odd */
            mlc__st_fail(st, MLC__ST_RESERVED "rng", rng->at, "not a random generator's state (even "
                         "increment)");
            return ctx->error;
        }
    }
    if (opt) {                                          /* check all of it before changing anything */
        if (opt->ctx != ctx)
            return mlc__fail(ctx, MLC_ERR_ARG,
                             "mlc_checkpoint_load: the optimiser belongs to another context"),
                   ctx->error;
        if (!kind || strcmp(kind, mlc__optim_kind_names[opt->kind]) != 0) {
            mlc__st_fail(st, NULL, 8, "the checkpoint holds optimiser \"%s\", not %s", kind ? kind : "(none)",
                         mlc__optim_kind_names[opt->kind]);
            return ctx->error;
        }
        if (!(t = mlc__ckpt_entry(st, MLC__ST_RESERVED "optim.t", MLC__I64, 0)) ||
            !(lr = mlc__ckpt_entry(st, MLC__ST_RESERVED "optim.lr", MLC__F32, 0))) return ctx->error;
        {
            long long steps = (long long)mlc__le(st->body + t->begin, 8);
            float rate;
            mlc__st_convert(st->body + lr->begin, MLC__F32, &rate, 1);
            if (!mlc__is_finite(rate) || rate < 0.0f) {
                mlc__st_fail(st, MLC__ST_RESERVED "optim.lr", lr->at, "the learning rate %g is not a finite "
                             "number >= 0", (double)rate);
                return ctx->error;
            }
            if (steps < 0 || steps > (1LL << 53)) {
                mlc__st_fail(st, MLC__ST_RESERVED "optim.t", t->at, "the optimiser's step count is not in "
                             "[0, 2^53]");
                return ctx->error;
            }
        }
        if (mlc__ckpt_check_params(st, m, opt) != MLC_OK) return ctx->error;
        for (i = 0; i < opt->count; i++)
            for (k = 0; k < 3; k++) {
                const mlc__st_entry *e;
                const mlc_tensor *s = opt->state[3 * i + k];
                if (!s) continue;
                expected++;
                mlc__format(name, sizeof name, MLC__ST_RESERVED "optim.%d.%s", i,
                            mlc__optim_slot_names[opt->kind][k]);
                if (!(e = mlc__st_find(st, name))) {
                    mlc__st_fail(st, name, st->body_at, "the checkpoint lacks this entry");
                    return ctx->error;
                }
                if (e->dtype != MLC__F32 || e->ndim != s->ndim ||
                    memcmp(e->shape, s->shape, sizeof(int) * (size_t)s->ndim)) {
                    mlc__st_fail(st, name, e->at, "expected F32 of shape %T", s);
                    return ctx->error;
                }
            }
        for (i = 0; i < st->count; i++)
            found += strncmp(st->entries[i].name, MLC__ST_RESERVED "optim.", sizeof MLC__ST_RESERVED + 5) ==
                0;
        if (found != expected + 2) {
            mlc__st_fail(st, NULL, 8, "the checkpoint holds %d optimiser entries, this optimiser has %d",
                         found - 2, expected);
            return ctx->error;
        }
    }
    if (mlc_safetensors_load(st, m, NULL) != MLC_OK) return ctx->error;      /* strict */
    for (i = 0; opt && i < opt->count; i++)
        for (k = 0; k < 3; k++) {
            mlc_tensor *s = opt->state[3 * i + k];
            if (!s) continue;
            mlc__format(name, sizeof name, MLC__ST_RESERVED "optim.%d.%s", i,
                        mlc__optim_slot_names[opt->kind][k]);
            mlc__st_convert(st->body + mlc__st_find(st, name)->begin, MLC__F32, mlc__st_host_for_write(s),
                            s->size);
            mlc__host_wrote(s);
        }
    if (scale) {
        mlc__st_convert(st->body + scale->begin, MLC__F32, &opt->scaler->scale, 1);
        opt->scaler->growth_tracker = (long long)mlc__le(st->body + tracker->begin, 8);
        opt->scaler->found_inf = opt->scaler->unscaled = 0;
    }
    if (opt) {
        float rate;
        opt->t = (long long)mlc__le(st->body + t->begin, 8);
        mlc__st_convert(st->body + lr->begin, MLC__F32, &rate, 1);
        opt->lr = rate;
    }
    if (state) {
        state->step = (long long)mlc__le(st->body + train->begin, 8);
        state->epoch = (long long)mlc__le(st->body + train->begin + 8, 8);

    }
    ctx->rng_state = mlc__le(st->body + rng->begin, 8);
    ctx->rng_inc = mlc__le(st->body + rng->begin + 8, 8);
    return ctx->error;
}

MLCDEF mlc_result mlc_checkpoint_load_from_memory(const void *data, size_t size, mlc_module *m,
                                                  mlc_optim *opt, mlc_train_state *state) {
    mlc_safetensors *st;
    if (!m) return MLC_ERR_NULL;
    if (!(st = mlc_safetensors_from_memory(m->ctx, data, size, NULL))) return m->ctx->error;
    mlc__checkpoint_load(st, m, opt, state);
    mlc_safetensors_close(st);
    return m->ctx->error;
}

/* ---- Files: reading whole, writing atomically -------------------------------------------- */
#ifndef MLC_NO_STDIO
#include <errno.h>
/* fsync where <stdio.h> declared fileno (POSIX, not strict ISO C): glibc says so in __USE_POSIX,
   fixed when stdio.h came in (a later header defining _POSIX_C_SOURCE does not change it). */
#if defined(__GLIBC__) ? defined(__USE_POSIX) : defined(__APPLE__) || (defined(__unix__) && \
    (defined(_POSIX_C_SOURCE) || defined(_GNU_SOURCE) || defined(_DEFAULT_SOURCE) || defined(_BSD_SOURCE)))
#include <unistd.h>
#include <fcntl.h>
#define MLC__FSYNC(f) fsync(fileno(f))   /* the data reaches the disk before the rename */
#define MLC__POSIX_FILES 1
#ifndef O_NOFOLLOW
#define O_NOFOLLOW 0
#endif
#ifndef O_CLOEXEC
#define O_CLOEXEC 0
#endif
#elif defined(_WIN32)
#include <io.h>
#include <fcntl.h>
#include <sys/stat.h>
#define MLC__FSYNC(f) _commit(_fileno(f))
#else
#define MLC__FSYNC(f) 0                  /* strict ISO C: no fsync declared; fflush only */
#endif
#ifdef _WIN32                           /* MoveFileExA: rename does not replace a file there */
#ifndef WIN32_LEAN_AND_MEAN
#define WIN32_LEAN_AND_MEAN
#endif
#include <windows.h>
#endif

MLCDEF mlc_safetensors *mlc_safetensors_open(mlc_ctx *ctx, const char *path) {
    FILE *f;
    long size = 0;
    unsigned char *copy = NULL;
    mlc_safetensors *st;
    if (!ctx || ctx->error) return NULL;
    if (!path) return (mlc_safetensors *)mlc__fail(ctx, MLC_ERR_NULL, "mlc_safetensors_open: path is NULL");
    if (!(f = fopen(path, "rb")))
        return (mlc_safetensors *)mlc__fail(ctx, MLC_ERR_IO, "safetensors %s: cannot open it: %s", path,
                                            strerror(errno));
    if (!mlc__readable(f))
        mlc__fail(ctx, MLC_ERR_IO, "safetensors %s: cannot read it: %s", path, strerror(errno));
    else if (fseek(f, 0, SEEK_END) != 0 || (size = ftell(f)) < 0 || fseek(f, 0, SEEK_SET) != 0)
        mlc__fail(ctx, MLC_ERR_IO, "safetensors %s: cannot find its size: %s", path, strerror(errno));
    else if ((copy = (unsigned char *)mlc__owned_alloc(ctx, (size_t)size + 1, "mlc_safetensors_open")) &&
             fread(copy, 1, (size_t)size, f) != (size_t)size)
        mlc__fail(ctx, MLC_ERR_IO, "safetensors %s: read error after %zu bytes", path, (size_t)ftell(f));
    fclose(f);
    if (ctx->error || !(st = mlc_safetensors_from_memory(ctx, copy, (size_t)size, path))) {
        mlc__owned_free(ctx, copy);
        return NULL;
    }
    st->copy = copy;
    return st;
}

MLCDEF mlc_result mlc_module_load(mlc_module *m, const char *path, const mlc_load_opts *opts) {
    mlc_safetensors *st;
    if (!m) return MLC_ERR_NULL;
    if (!(st = mlc_safetensors_open(m->ctx, path))) return m->ctx->error;
    mlc_safetensors_load(st, m, opts);
    mlc_safetensors_close(st);
    return m->ctx->error;
}

static int mlc__sink_file(void *user, const void *bytes, size_t len) {
    return fwrite(bytes, 1, len, (FILE *)user) == len;
}

/* A temporary file beside path for this save alone, "path.tmp-PID-N", created exclusively: a
   name that exists (a link included) is never opened, so a save never writes through a link
   or into another process's temporary; N counts past names that exist. Strict ISO C has no
   exclusive create: there it checks that the name is free, then creates it. NULL: errno set. */
static FILE *mlc__create_temp(const char *path, char *tmp, size_t cap) {
    static unsigned long next;                           /* a clash only costs a retry */
    unsigned long pid, tries;
    FILE *f = NULL;
#if defined(MLC__POSIX_FILES)
    pid = (unsigned long)getpid();
#elif defined(_WIN32)
    pid = (unsigned long)GetCurrentProcessId();
#else
    pid = (unsigned long)(uintptr_t)&next;
#endif
    for (tries = 0; tries < 1000; tries++) {
        int fd;
        mlc__format(tmp, cap, "%s.tmp-%zu-%zu", path, (size_t)pid, (size_t)next++);
#if defined(MLC__POSIX_FILES)
        fd = open(tmp, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0666);
        if (fd >= 0 && !(f = fdopen(fd, "wb"))) close(fd);
#elif defined(_WIN32)
        fd = _open(tmp, _O_WRONLY | _O_CREAT | _O_EXCL | _O_BINARY, _S_IREAD | _S_IWRITE);
        if (fd >= 0 && !(f = _fdopen(fd, "wb"))) _close(fd);
#else
        fd = -1;
        if ((f = fopen(tmp, "rb")) != NULL) { fclose(f); f = NULL; errno = EEXIST; }
        else if ((f = fopen(tmp, "wb")) != NULL) fd = 0;
#endif
        if (fd >= 0 || errno != EEXIST) return f;
    }
    return NULL;
}

/* Write a temporary file (mlc__create_temp), flush, fsync, close, rename over path (one step that
   replaces the old file or leaves it: rename on POSIX, then the directory synced so the rename
   survives a crash; MoveFileEx with write-through on Windows); on failure remove the
   temporary. Two processes saving one path each write their own file: the last rename wins,
   and a reader sees one whole file or the other. */
static mlc_result mlc__st_save(mlc_ctx *ctx, const char *op, const char *path, const mlc__st_item *items,
                               int count, const char *const *metadata) {
    size_t cap;
    char *tmp, reason[64] = "";
    FILE *f;
    int ok, err = 0;
    if (ctx->error) return ctx->error;
    if (!path) return mlc__fail(ctx, MLC_ERR_NULL, "%s: path is NULL", op), ctx->error;
    cap = strlen(path) + 48;
    if (!(tmp = (char *)mlc__owned_alloc(ctx, cap, op))) return ctx->error;
    if (!(f = mlc__create_temp(path, tmp, cap))) {
        mlc__fail(ctx, MLC_ERR_IO, "%s: cannot create %s: %s", op, tmp, strerror(errno));
        mlc__owned_free(ctx, tmp);
        return ctx->error;
    }
    errno = 0;
    ok = mlc__st_write(ctx, op, items, count, metadata, mlc__sink_file, f) && fflush(f) == 0 &&
        MLC__FSYNC(f) == 0;
    if (!ok) err = errno;
    if (fclose(f) != 0 && ok) { ok = 0; err = errno; }
#ifdef _WIN32
    if (ok && !MoveFileExA(tmp, path, MOVEFILE_REPLACE_EXISTING | MOVEFILE_WRITE_THROUGH)) {
        ok = 0;
        mlc__format(reason, sizeof reason, "MoveFileEx: Windows error %lu", (unsigned long)GetLastError());
    }
#else
    if (ok && rename(tmp, path) != 0) { ok = 0; err = errno; }
#endif
#if defined(MLC__POSIX_FILES)
    if (ok) {                                            /* the directory's entry reaches the disk too */
        const char *slash = strrchr(path, '/');
        int dir;
        if (slash) { memcpy(tmp, path, (size_t)(slash - path) + 1); tmp[slash - path + 1] = '\0'; }
        else memcpy(tmp, ".", 2);
        if ((dir = open(tmp, O_RDONLY | O_CLOEXEC)) >= 0) { (void)fsync(dir); close(dir); }
    }
#endif
    if (!ok) {
        remove(tmp);
        mlc__fail(ctx, MLC_ERR_IO, "%s: writing %s failed (%s); %s is as it was", op, tmp,
                  reason[0] ? reason : err ? strerror(err) : "error", path);
    }
    mlc__owned_free(ctx, tmp);
    return ctx->error;
}

MLCDEF mlc_result mlc_safetensors_save(mlc_ctx *ctx, const char *path, const mlc_named_tensor *tensors,
                                       int count, const char *const *metadata) {
    mlc__st_item *items;
    if (!ctx) return MLC_ERR_NULL;
    if (ctx->error || !(items = mlc__st_items(ctx, tensors, count, 0, "mlc_safetensors_save")))
        return ctx->error;
    mlc__st_save(ctx, "mlc_safetensors_save", path, items, count, metadata);
    mlc__owned_free(ctx, items);
    return ctx->error;
}

MLCDEF mlc_result mlc_module_save(mlc_module *m, const char *path, const char *const *metadata) {
    mlc_named_tensor *state;
    int count;
    if (!m) return MLC_ERR_NULL;
    if (m->ctx->error || !(state = mlc__module_state_list(m, &count, "mlc_module_save")))
        return m->ctx->error;
    mlc_safetensors_save(m->ctx, path, state, count, metadata);
    mlc__owned_free(m->ctx, state);
    return m->ctx->error;
}

MLCDEF mlc_result mlc_checkpoint_save(const char *path, mlc_module *m, mlc_optim *opt,
                                      const mlc_train_state *state) {
    mlc__ckpt c;
    if (!m) return MLC_ERR_NULL;
    if (m->ctx->error) return m->ctx->error;
    if (mlc__ckpt_build(&c, m, opt, state, "mlc_checkpoint_save"))
        mlc__st_save(m->ctx, "mlc_checkpoint_save", path, c.items, c.count, c.metadata);
    mlc__ckpt_free(m->ctx, &c);
    return m->ctx->error;
}

MLCDEF mlc_result mlc_checkpoint_load(const char *path, mlc_module *m, mlc_optim *opt,
                                      mlc_train_state *state) {
    mlc_safetensors *st;
    if (!m) return MLC_ERR_NULL;
    if (!(st = mlc_safetensors_open(m->ctx, path))) return m->ctx->error;
    mlc__checkpoint_load(st, m, opt, state);
    mlc_safetensors_close(st);
    return m->ctx->error;
}
#endif /* MLC_NO_STDIO */

#ifdef __cplusplus
}
#endif

/* ============================================================================================
   @section registry
   Backends: the registry, the one place that names them. mlc_create offers the device spec to
   each in turn; mlc_devices lists theirs. A program adds its own backend by defining
   MLC_EXTRA_BACKEND as the name of a function that returns it (examples/backend_skeleton.c does).
   ============================================================================================ */
#ifdef MLC_OPENCL
#include "mlc_opencl.h"                 /* mlc__opencl_backend */
#endif

static const mlc__backend *mlc__registry(int i) {
    const mlc__backend *const list[] = {
#ifdef MLC_OPENCL
        &mlc__opencl_backend,
#endif
#ifdef MLC_EXTRA_BACKEND
        MLC_EXTRA_BACKEND(),
#endif
        NULL
    };
    return i >= 0 && i < (int)(sizeof list / sizeof list[0]) ? list[i] : NULL;
}
#ifdef MLC__OMP_DIAGNOSTIC_PUSHED
#pragma clang diagnostic pop
#endif
#endif /* MLC_IMPLEMENTATION_DONE */
#endif /* MLC_IMPLEMENTATION */

/*
MIT License

Copyright (c) 2026 the mlc authors

Permission is hereby granted, free of charge, to any person obtaining a copy of this software and
associated documentation files (the "Software"), to deal in the Software without restriction,
including without limitation the rights to use, copy, modify, merge, publish, distribute,
sublicense, and/or sell copies of the Software, and to permit persons to whom the Software is
furnished to do so, subject to the following conditions:

The above copyright notice and this permission notice shall be included in all copies or
substantial portions of the Software.

THE SOFTWARE IS PROVIDED "AS IS", WITHOUT WARRANTY OF ANY KIND, EXPRESS OR IMPLIED, INCLUDING BUT
NOT LIMITED TO THE WARRANTIES OF MERCHANTABILITY, FITNESS FOR A PARTICULAR PURPOSE AND
NONINFRINGEMENT. IN NO EVENT SHALL THE AUTHORS OR COPYRIGHT HOLDERS BE LIABLE FOR ANY CLAIM, DAMAGES
OR OTHER LIABILITY, WHETHER IN AN ACTION OF CONTRACT, TORT OR OTHERWISE, ARISING FROM, OUT OF OR IN
CONNECTION WITH THE SOFTWARE OR THE USE OR OTHER DEALINGS IN THE SOFTWARE.
*/
