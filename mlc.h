/* mlc.h - v0.1.0 - machine learning in one C header - MIT licence (see end of file)

   Do this:
      #define MLC_IMPLEMENTATION
   before you include this file in *one* C or C++ file to create the implementation.
   Every other file includes mlc.h without the define. Link with -lm.

QUICK START

      #define MLC_IMPLEMENTATION
      #include "mlc.h"
      mlc_ctx *ctx = mlc_create(&(mlc_config){ .seed = 42 });
      mlc_module *net = mlc_nn_sequential(ctx, mlc_nn_linear(ctx, 10, 100), mlc_nn_tanh(ctx),
                                          mlc_nn_linear(ctx, 100, 1), NULL);
      mlc_optim *opt = mlc_adam(ctx, net, (mlc_adam_config){ .lr = 1e-3f });
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
   No graph compiler, no double backward (gradients of gradients), no dtypes other than float32
   yet, no views with strides (every tensor is contiguous; reshape shares storage, the other
   shape ops copy), no threads of its own.

CONFIGURATION MACROS (define before including)
   MLC_IMPLEMENTATION    emit the implementation in this translation unit
   MLC_STATIC            make every function static (private copy per translation unit)
   MLC_ASSERT(x)         internal invariants only (default: assert from <assert.h>)
   MLC_NO_STDIO          no <stdio.h>: no default logger, no mlc_print
   MLC_USE_CBLAS         matrix products through cblas_sgemm (OpenBLAS, MKL; Accelerate on
                         Apple); link the BLAS. mlc_config.gemm plugs in any other routine.
   MLC_EXPF MLC_LOGF MLC_SQRTF MLC_TANHF MLC_ERFF MLC_POWF MLC_COSF
                         maths functions (default: the <math.h> float versions, but tanh is
                         mlc's own polynomial: within 4 ulp, and loops of it vectorise)
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
   MLC_ZERO is -0.0f: a zero with its sign bit set, which reads as 0 in arithmetic.
     mlc_sgd_config      lr 0.01; momentum, dampening, weight_decay 0
     mlc_adam_config     lr 1e-3, beta1 0.9, beta2 0.999, eps 1e-8, weight_decay 0 (AdamW: 0.01)
     mlc_rmsprop_config  lr 0.01, alpha 0.99, eps 1e-8; weight_decay, momentum 0
     batch norm          momentum 0.1, eps 1e-5 (mlc_batch_norm's arguments, module fields)
     layer norm          eps 1e-5
     mlc_conv_opts       stride 1, padding 0, dilation 1, groups 1
     mlc_config          arena_block_bytes 1 MiB, device $MLC_DEVICE or "cpu"
   Optimiser settings are checked when it is made (and lr by mlc_optim_set_lr): NaN, infinite,
   negative, betas or alpha outside [0, 1), eps < 0, nesterov without momentum are MLC_ERR_ARG
   naming the call and the field; so are bad module arguments (dropout p outside [0, 1], a conv
   or pool kernel < 1) and norm settings (momentum outside [0, 1], eps < 0) when the op runs.

BACKENDS
   The CPU (reference loops, float32) is always present. mlc_opencl.h adds OpenCL devices.

LIMITS
   Rank up to MLC_MAX_DIMS (6). Element counts fit in size_t, each dimension in int. At most
   64 frames are open at once. A tensor from an ended frame is caught while its arena memory has
   not been handed out again; after that, like any dangling pointer, it may not be.
   mlc_concat(xs, 0, axis) has no tensor to find a context through: NULL with no error set.
   Class indices (cross entropy, embedding, gather) are float tensors holding whole numbers,
   exact up to 2^24.
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
   Public API: context, errors, memory statistics
   ============================================================================================ */

#define MLC_MAX_DIMS 6
/* MLC_SHAPE(2, 3) expands to "2, (int[]){2, 3}": the ndim and shape arguments of a creator. */
#define MLC_SHAPE(...) (int)(sizeof((int[]){__VA_ARGS__}) / sizeof(int)), (const int[]){__VA_ARGS__}

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

typedef struct mlc_config {             /* zero means default for every field */
    uint64_t seed;                      /* RNG seed (the same numbers on every platform)     */
    const char *device;                 /* NULL: $MLC_DEVICE, else "cpu"; see Devices below  */
    mlc_allocator allocator;            /* default: malloc/free                              */
    void (*log)(mlc_log_level level, const char *message, void *user); /* default: stderr */
    void *log_user;
    int quiet;                          /* 1: no default logging (errors are still values)  */
    size_t arena_block_bytes;           /* size of one arena block, default 1 MiB            */
    mlc_gemm_fn gemm;                   /* every matrix product goes here when set (BLAS)    */
    void *gemm_user;
} mlc_config;

typedef struct mlc_stats {
    size_t bytes_current, bytes_peak;   /* heap bytes held by the context, now and at most   */
    size_t allocs, frees;               /* number of calls to the allocator so far           */
    size_t arena_used, arena_peak;      /* bytes of the arena in use, now and at most        */
    size_t tape_nodes;                  /* autograd nodes on the tape now                    */
    size_t device_bytes_current, device_bytes_peak;   /* device buffers, now and at most   */
    size_t uploads, downloads;          /* copies host -> device and device -> host          */
    size_t fallbacks;                   /* device ops that ran on the CPU (no kernel)        */
} mlc_stats;

MLCDEF mlc_ctx *mlc_create(const mlc_config *config);   /* NULL config: all defaults */
MLCDEF void mlc_destroy(mlc_ctx *ctx);
MLCDEF const char *mlc_device_name(const mlc_ctx *ctx);
MLCDEF mlc_result mlc_error(const mlc_ctx *ctx);
MLCDEF const char *mlc_error_message(const mlc_ctx *ctx);
MLCDEF void mlc_clear_error(mlc_ctx *ctx);
MLCDEF mlc_stats mlc_get_stats(const mlc_ctx *ctx);

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
   Public API: tensors
   ============================================================================================ */

struct mlc_tensor {                     /* read the fields; change them only through the API */
    mlc_ctx *ctx;
    int ndim;
    int shape[MLC_MAX_DIMS];
    size_t size;                        /* number of elements */
    float *data;                        /* host copy (on a device: current after mlc_host_data) */
    float *grad;                        /* gradient after mlc_backward, or NULL (likewise)  */
    int requires_grad;
    int persistent;                     /* 1: heap-owned (parameters), 0: in the frame arena */
    struct mlc__node *node;             /* the op that produced it (NULL for leaves) */
    int on_device;                      /* 1: lives on the context's device (see Devices) */
    int level;                          /* how many frames were open when it was made */
    uint64_t frame_id;                  /* the frame it was made in (misuse checks) */
    int graph_used;                     /* 1: a backward ran through the op that made it */
    unsigned stale;                     /* which copies are out of date (MLC__*_STALE bits) */
    void *device_data, *device_grad;    /* the backend's buffers */
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
/* A long-lived copy of t (a leaf; requires_grad copied). */
MLCDEF mlc_tensor *mlc_keep(mlc_tensor *t);
MLCDEF void mlc_tensor_free(mlc_tensor *t);             /* long-lived tensors only */

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
   ("Iris", "gfx1030"), or "best" (the first GPU, else the CPU). New tensors live on the
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
MLCDEF mlc_tensor *mlc_to(mlc_tensor *t, int on_device); /* moves t (and its gradient); returns t */
MLCDEF mlc_result mlc_module_to(mlc_module *m, int on_device); /* every parameter and buffer */
MLCDEF float *mlc_host_data(mlc_tensor *t);             /* t->data, brought up to date (write: mlc_write) */
MLCDEF float *mlc_host_grad(mlc_tensor *t);             /* t->grad, brought up to date */

/* ============================================================================================
   Public API: ops. Each returns a new tensor (NULL on error) and records itself on the tape
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
MLCDEF mlc_tensor *mlc_neg(mlc_tensor *x);
MLCDEF mlc_tensor *mlc_exp(mlc_tensor *x);
MLCDEF mlc_tensor *mlc_log(mlc_tensor *x);
MLCDEF mlc_tensor *mlc_sqrt(mlc_tensor *x);
MLCDEF mlc_tensor *mlc_pow(mlc_tensor *x, float exponent);
MLCDEF mlc_tensor *mlc_abs(mlc_tensor *x);
MLCDEF mlc_tensor *mlc_clamp(mlc_tensor *x, float lo, float hi);
MLCDEF mlc_tensor *mlc_where(mlc_tensor *cond, mlc_tensor *a, mlc_tensor *b); /* cond != 0 ? a : b */
MLCDEF mlc_tensor *mlc_masked_fill(mlc_tensor *x, mlc_tensor *mask, float value); /* mask != 0 */

/* activations */
MLCDEF mlc_tensor *mlc_relu(mlc_tensor *x);
MLCDEF mlc_tensor *mlc_leaky_relu(mlc_tensor *x, float slope);
MLCDEF mlc_tensor *mlc_gelu(mlc_tensor *x);          /* exact, with erf */
MLCDEF mlc_tensor *mlc_gelu_tanh(mlc_tensor *x);     /* the tanh approximation */
MLCDEF mlc_tensor *mlc_sigmoid(mlc_tensor *x);
MLCDEF mlc_tensor *mlc_tanh(mlc_tensor *x);
MLCDEF mlc_tensor *mlc_silu(mlc_tensor *x);
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

/* reductions over one axis (keepdim keeps it with size 1) and over everything */
MLCDEF mlc_tensor *mlc_sum(mlc_tensor *x, int axis, int keepdim);
MLCDEF mlc_tensor *mlc_mean(mlc_tensor *x, int axis, int keepdim);
MLCDEF mlc_tensor *mlc_max(mlc_tensor *x, int axis, int keepdim);
MLCDEF mlc_tensor *mlc_var(mlc_tensor *x, int axis, int keepdim, int unbiased);
MLCDEF mlc_tensor *mlc_sum_all(mlc_tensor *x);
MLCDEF mlc_tensor *mlc_mean_all(mlc_tensor *x);
MLCDEF mlc_tensor *mlc_argmax(mlc_tensor *x, int axis);   /* indices as floats; no gradient */

/* losses */
typedef enum mlc_reduction { MLC_REDUCE_MEAN = 0, MLC_REDUCE_SUM, MLC_REDUCE_NONE } mlc_reduction;
#define MLC_NO_IGNORE (-2147483647 - 1)
/* logits [N, C], target [N] class indices; targets equal to ignore_index add nothing */
MLCDEF mlc_tensor *mlc_cross_entropy(mlc_tensor *logits, mlc_tensor *target,
                                     mlc_reduction reduction, int ignore_index);
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
MLCDEF mlc_tensor *mlc_concat(mlc_tensor *const *xs, int count, int axis);
MLCDEF mlc_tensor *mlc_index_select(mlc_tensor *x, int axis, mlc_tensor *index);  /* index 1-D */
MLCDEF mlc_tensor *mlc_gather(mlc_tensor *x, int axis, mlc_tensor *index);   /* torch.gather */
MLCDEF mlc_tensor *mlc_copy(mlc_tensor *x);

/* neural-network ops */
MLCDEF mlc_tensor *mlc_dropout(mlc_tensor *x, float p, int training);
MLCDEF mlc_tensor *mlc_layer_norm(mlc_tensor *x, mlc_tensor *weight, mlc_tensor *bias, float eps);
/* x [N, C, ...]; training: batch statistics, running stats updated with momentum (no gradient);
   otherwise the running statistics. weight, bias, running stats may be NULL. */
MLCDEF mlc_tensor *mlc_batch_norm(mlc_tensor *x, mlc_tensor *running_mean, mlc_tensor *running_var,
                                  mlc_tensor *weight, mlc_tensor *bias, int training,
                                  float momentum, float eps);
MLCDEF mlc_tensor *mlc_embedding(mlc_tensor *weight, mlc_tensor *index);   /* [V, D], [...] */
typedef struct mlc_conv_opts { int stride, padding, dilation, groups; } mlc_conv_opts; /* 0: 1,0,1,1 */
/* x [N, C, H, W], weight [O, C/groups, KH, KW], bias [O] or NULL */
MLCDEF mlc_tensor *mlc_conv2d(mlc_tensor *x, mlc_tensor *weight, mlc_tensor *bias, mlc_conv_opts opts);
MLCDEF mlc_tensor *mlc_max_pool2d(mlc_tensor *x, int kernel, int stride, int padding); /* stride 0: kernel */
MLCDEF mlc_tensor *mlc_avg_pool2d(mlc_tensor *x, int kernel, int stride, int padding); /* pads count */
MLCDEF mlc_tensor *mlc_global_avg_pool2d(mlc_tensor *x);   /* [N, C, H, W] -> [N, C] */

/* ============================================================================================
   Public API: autograd
   ============================================================================================ */

MLCDEF mlc_result mlc_backward(mlc_tensor *loss);        /* loss has one element */
MLCDEF mlc_result mlc_backward_with(mlc_tensor *out, mlc_tensor *grad_out);
MLCDEF int mlc_set_grad_enabled(mlc_ctx *ctx, int enabled);   /* returns the previous state */

/* Finite-difference gradient check of fn(inputs) against mlc_backward, for any composition.
   The output is projected on fixed random weights and the sums are taken in double. */
typedef mlc_tensor *(*mlc_gradcheck_fn)(mlc_tensor **inputs, void *user);
typedef struct mlc_gradcheck_opts { double eps, atol, rtol; } mlc_gradcheck_opts; /* 0: 1e-3, 1e-3, 1e-2 */
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
   Public API: modules (torch.nn). Parameters are named as in PyTorch ("0.weight"), so a state
   dict maps one to one. Modules belong to the context and are freed by mlc_destroy.
   ============================================================================================ */

typedef mlc_tensor *(*mlc_forward_fn)(mlc_module *self, mlc_tensor *x);
#define MLC_MODULE_MAX_TENSORS 4
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
    mlc_conv_opts conv;                 /* Conv2d; pools use stride and padding */
    int kernel;                         /* pools */
    float alpha, eps, momentum;         /* leaky slope or dropout p; norms */
    void *user;                         /* for modules you write */
};

MLCDEF mlc_module *mlc_nn_linear(mlc_ctx *ctx, int in_features, int out_features);
MLCDEF mlc_module *mlc_nn_linear_nobias(mlc_ctx *ctx, int in_features, int out_features);
MLCDEF mlc_module *mlc_nn_conv2d(mlc_ctx *ctx, int in_channels, int out_channels, int kernel,
                                 mlc_conv_opts opts);
MLCDEF mlc_module *mlc_nn_batch_norm(mlc_ctx *ctx, int features);    /* BatchNorm1d/2d */
MLCDEF mlc_module *mlc_nn_layer_norm(mlc_ctx *ctx, int features);
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
MLCDEF mlc_module *mlc_nn_sequential(mlc_ctx *ctx, ...);   /* modules, then NULL */
/* Your own module: forward gets the module; add parameters, buffers and children by name. */
MLCDEF mlc_module *mlc_nn_custom(mlc_ctx *ctx, const char *type, mlc_forward_fn forward, void *user);
MLCDEF mlc_result mlc_module_add_param(mlc_module *m, const char *name, mlc_tensor *param);
MLCDEF mlc_result mlc_module_add_buffer(mlc_module *m, const char *name, mlc_tensor *buffer);
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
   Public API: optimisers and schedules (zero fields take PyTorch's defaults)
   ============================================================================================ */

/* A config field left 0 takes its default; MLC_ZERO (-0.0f) asks for an explicit zero instead
   (AdamW weight_decay, Adam beta1, RMSprop alpha, lr, eps; also a norm module's eps or momentum).
   Values are checked when the optimiser is made: NaN, infinite or out-of-range is MLC_ERR_ARG. */
#define MLC_ZERO (-0.0f)
typedef struct mlc_sgd_config { float lr, momentum, dampening, weight_decay; int nesterov; } mlc_sgd_config; /* lr 0.01 */
typedef struct mlc_adam_config { float lr, beta1, beta2, eps, weight_decay; } mlc_adam_config; /* 1e-3, .9, .999, 1e-8; AdamW wd 0.01 */
typedef struct mlc_rmsprop_config { float lr, alpha, eps, weight_decay, momentum; int centered; } mlc_rmsprop_config; /* 0.01, .99, 1e-8 */

/* module may be NULL: then add parameters with mlc_optim_add_param */
MLCDEF mlc_optim *mlc_sgd(mlc_ctx *ctx, mlc_module *module, mlc_sgd_config config);
MLCDEF mlc_optim *mlc_adam(mlc_ctx *ctx, mlc_module *module, mlc_adam_config config);
MLCDEF mlc_optim *mlc_adamw(mlc_ctx *ctx, mlc_module *module, mlc_adam_config config);
MLCDEF mlc_optim *mlc_rmsprop(mlc_ctx *ctx, mlc_module *module, mlc_rmsprop_config config);
MLCDEF mlc_result mlc_optim_add_param(mlc_optim *opt, mlc_tensor *param);
MLCDEF void mlc_zero_grad(mlc_optim *opt);
MLCDEF void mlc_step(mlc_optim *opt);
MLCDEF void mlc_optim_set_lr(mlc_optim *opt, float lr);
MLCDEF float mlc_optim_lr(const mlc_optim *opt);
/* Scale all gradients so their global L2 norm is at most max_norm; returns the norm before. */
MLCDEF float mlc_clip_grad_norm(mlc_optim *opt, float max_norm);
/* Learning-rate schedules, as pure functions of the step (or epoch) number. */
MLCDEF float mlc_lr_step(float base_lr, int epoch, int step_size, float gamma);
MLCDEF float mlc_lr_cosine(float base_lr, int step, int warmup_steps, int total_steps, float min_lr);

#ifdef __cplusplus
}
#endif
#endif /* MLC_H */

/* ============================================================================================
   Implementation
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
#define MLC_EXPF expf
#endif
#ifndef MLC_LOGF
#define MLC_LOGF logf
#endif
#ifndef MLC_SQRTF
#define MLC_SQRTF sqrtf
#endif
#ifndef MLC_TANHF
#define MLC_TANHF mlc__tanhf               /* a polynomial; within 4 ulp, and it vectorises */
#endif
#ifndef MLC_ERFF
#define MLC_ERFF erff
#endif
#ifndef MLC_POWF
#define MLC_POWF powf
#endif
#ifndef MLC_COSF
#define MLC_COSF cosf
#endif

/* x86 with GCC or Clang: a few kernels are also compiled for AVX2 (+FMA) and AVX-512 and
   picked at run time (mlc__cpu_avx2), so a plain -O2 build still runs them at full width. */
#if defined(__GNUC__) && (defined(__x86_64__) || defined(__i386__))
#define MLC__X86 1
#include <immintrin.h>
#else
#define MLC__X86 0
#endif

/* OpenMP speeds the hot loops when built with -fopenmp; without it the pragmas vanish. */
#ifdef _OPENMP
#include <omp.h>
#define MLC__OMP(x) _Pragma(#x)
#else
#define MLC__OMP(x)
#endif
#ifdef __cplusplus
#define MLC__RESTRICT __restrict
#else
#define MLC__RESTRICT restrict
#endif

#ifdef __cplusplus
extern "C" {
#endif

/* ============================================================================================
   Memory and errors: the context, a small formatter, tracked allocations, the arena
   ============================================================================================ */

typedef struct mlc__block {            /* one arena block; blocks are kept and reused */
    struct mlc__block *next;
    size_t capacity, used;
    unsigned char *base;
} mlc__block;

typedef struct mlc__owned {            /* long-lived allocations, freed by mlc_destroy */
    struct mlc__owned *prev, *next;
} mlc__owned;

enum { MLC__HOST_STALE = 1, MLC__DEVICE_STALE = 2, MLC__GRAD_HOST_STALE = 4, MLC__GRAD_DEVICE_STALE = 8 };

typedef struct mlc__backend {
    const char *name;
    int (*forward)(mlc_ctx *ctx, struct mlc__node *call); /* 1: ran on the device, 0: no kernel */
    int (*backward)(mlc_ctx *ctx, struct mlc__node *n);   /* for nodes with n->device set */
    int (*step)(mlc_optim *opt, int i);                   /* parameter i's update; 0: no kernel */
    int (*fill)(mlc_tensor *t, int grad, float value);    /* data or gradient = value */
    int (*upload)(mlc_tensor *t, int grad);               /* host copy -> device (mlc__buffer_of) */
    int (*download)(mlc_tensor *t, int grad);             /* device -> host copy (waits) */
    void *(*create)(mlc_ctx *ctx, size_t bytes);          /* a buffer; NULL: out of memory, or */
    void (*free)(mlc_ctx *ctx, void *buffer);             /*   an error it set (mlc__device_alloc) */
    void (*wait)(mlc_ctx *ctx);                           /* a frame ends: finish reading its host memory */
    void (*destroy)(mlc_ctx *ctx);
} mlc__backend;

#ifdef MLC_OPENCL
static int mlc__opencl_open(mlc_ctx *ctx, const char *spec);   /* 1: opened, 0: spec is not OpenCL's */
static int mlc__opencl_devices(mlc_device_info *out, int max);
#endif

typedef struct mlc__device_buffer { void *buffer; size_t bytes; int level; } mlc__device_buffer;
#define MLC__MAX_FRAMES 64              /* frames open at once */
typedef struct mlc__device_buffers {   /* frame temporaries (sorted by level), spares, long-lived */
    mlc__device_buffer *frame, *spare, *kept;
    size_t n_frame, n_spare, n_kept, cap_frame, cap_spare, cap_kept;
} mlc__device_buffers;

struct mlc_ctx {
    mlc_config config;
    mlc_result error;
    char message[512];
    uint64_t rng_state, rng_inc;
    int grad_enabled;
    mlc_stats stats;
    mlc__block *first_block, *block;   /* the arena: a chain, and the block being filled */
    struct mlc__node *tape;            /* the newest node; nodes link to older ones */
    mlc__owned owned;                  /* sentinel of the long-lived list */
    const struct mlc__backend *backend; /* NULL: the CPU only */
    void *device;                      /* the backend's state */
    char device_name[160];             /* set by the backend: "opencl:1 NVIDIA H100 80GB HBM3" */
    int op_device;                     /* where the op being run lives (0 CPU, 1 device) */
    const char *fell_back[64];         /* ops already logged as falling back */
    int n_fell_back;
    int level;                         /* frames open now */
    uint64_t frame_ids[MLC__MAX_FRAMES]; /* the id of each open frame, outermost first */
    uint64_t frames_made;              /* frame ids handed out */
    mlc__device_buffers buffers;       /* the device buffers' books (see mlc__device_alloc) */
};

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
            long long v = is_size ? 0 : *fmt == 'd' ? (long long)va_arg(ap, int) : (long long)va_arg(ap, unsigned);
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
            if (v != v) { s = "nan"; len = 3; }
            else {
                if (v < 0) { tmp[len++] = '-'; v = -v; }
                if (v > DBL_MAX) { memcpy(tmp + len, "inf", 3); len += 3; }
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
    if (ctx->config.log) { ctx->config.log(level, message, ctx->config.log_user); return; }
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

/* Every heap allocation carries its size in front, so the statistics stay exact. */
#define MLC__HEADER 16
static void *mlc__heap_alloc(mlc_ctx *ctx, size_t bytes) {
    unsigned char *p;
    size_t total;
    if (!mlc__size(bytes, 1, MLC__HEADER, &total)) return NULL;
    p = (unsigned char *)(ctx->config.allocator.alloc
            ? ctx->config.allocator.alloc(total, ctx->config.allocator.user)
            : malloc(total));
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
    if (ctx->config.allocator.free) ctx->config.allocator.free(p, ctx->config.allocator.user);
    else free(p);
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
    if (!b) {                                        /* grow: append a new block */
        size_t cap = ctx->config.arena_block_bytes;
        mlc__block *nb, *last = ctx->block;
        if (cap < bytes) cap = bytes;
        nb = mlc__size(cap, 1, sizeof(mlc__block) + 32, &total)
           ? (mlc__block *)mlc__heap_alloc(ctx, total) : NULL;
        if (!nb) return mlc__fail(ctx, MLC_ERR_MEMORY, "%s: out of memory (arena block of %zu bytes)", op, cap);
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
    ctx->backend->free(ctx, b->buffer);
    ctx->stats.device_bytes_current -= b->bytes;
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
             : !mlc__device_room(ctx, &books->frame, &books->cap_frame, books->n_frame + 1) ||   /* spares never need room later */
               !mlc__device_room(ctx, &books->spare, &books->cap_spare, books->n_frame + books->n_spare + 1))
        return mlc__fail(ctx, MLC_ERR_MEMORY, "%s: out of memory for the device buffers' books", op);
    for (i = books->n_spare; !kept && i-- > 0;)
        if (books->spare[i].bytes == b.bytes) { b.buffer = books->spare[i].buffer; books->spare[i] = books->spare[--books->n_spare]; break; }
    if (!b.buffer) {
        if (!(b.buffer = ctx->backend->create(ctx, b.bytes)) && !ctx->error) {
            while (books->n_spare) mlc__device_free(ctx, &books->spare[--books->n_spare]);
            b.buffer = ctx->backend->create(ctx, b.bytes);
        }
        if (!b.buffer) {
            if (!ctx->error) mlc__fail(ctx, MLC_ERR_MEMORY, "%s: out of device memory allocating %zu bytes on %s", op, b.bytes, mlc_device_name(ctx));
            return NULL;
        }
        ctx->stats.device_bytes_current += b.bytes;
        if (ctx->stats.device_bytes_current > ctx->stats.device_bytes_peak) ctx->stats.device_bytes_peak = ctx->stats.device_bytes_current;
    }
    if (kept) { books->kept[books->n_kept++] = b; return b.buffer; }
    for (at = books->n_frame; at > 0 && books->frame[at - 1].level > b.level; at--) {}   /* kept sorted by level */
    memmove(books->frame + at + 1, books->frame + at, (books->n_frame - at) * sizeof b);
    books->frame[at] = b;
    books->n_frame++;
    return b.buffer;
}

/* t's data (grad 0) or gradient buffer, made when missing; backends take theirs from here. */
static void *mlc__buffer_of(mlc_tensor *t, int grad, const char *op) {
    void **slot = grad ? &t->device_grad : &t->device_data;
    if (!*slot) *slot = mlc__device_alloc(t->ctx, t, t->size * sizeof(float), op);
    return *slot;
}

/* Frames above `level` ended: their buffers become spares, once the device has read the host
   memory the frames held. */
static void mlc__device_release_frames(mlc_ctx *ctx, int level) {
    mlc__device_buffers *books = &ctx->buffers;
    if (!books->n_frame || books->frame[books->n_frame - 1].level <= level) return;
    ctx->backend->wait(ctx);
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
    ctx->backend->wait(ctx);
    while (books->n_frame) mlc__device_free(ctx, &books->frame[--books->n_frame]);
    while (books->n_spare) mlc__device_free(ctx, &books->spare[--books->n_spare]);
    while (books->n_kept) mlc__device_free(ctx, &books->kept[--books->n_kept]);
    mlc__heap_free(ctx, books->frame); mlc__heap_free(ctx, books->spare); mlc__heap_free(ctx, books->kept);
    ctx->backend->destroy(ctx);
    ctx->backend = NULL;
}

/* ============================================================================================
   Context, random numbers, frames
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

MLCDEF mlc_ctx *mlc_create(const mlc_config *config) {
    mlc_config cfg;
    mlc_ctx *ctx;
    unsigned char *raw;
    const char *device;
    size_t bytes = sizeof(mlc_ctx) + MLC__HEADER;
    if (config) cfg = *config; else memset(&cfg, 0, sizeof cfg);
    if (!cfg.allocator.alloc != !cfg.allocator.free) return NULL;    /* all or none */
    raw = (unsigned char *)(cfg.allocator.alloc ? cfg.allocator.alloc(bytes, cfg.allocator.user) : malloc(bytes));
    if (!raw) return NULL;
    memset(raw, 0, bytes);
    memcpy(raw, &bytes, sizeof bytes);
    ctx = (mlc_ctx *)(raw + MLC__HEADER);
    ctx->config = cfg;
    if (!ctx->config.arena_block_bytes) ctx->config.arena_block_bytes = (size_t)1 << 20;
    ctx->stats.allocs = 1;
    ctx->stats.bytes_current = ctx->stats.bytes_peak = bytes - MLC__HEADER;
    ctx->grad_enabled = 1;
    ctx->owned.next = ctx->owned.prev = &ctx->owned;
    mlc_seed(ctx, cfg.seed);
    device = cfg.device;
#ifndef MLC_NO_STDIO
    if (!device) device = getenv("MLC_DEVICE");
#endif
    if (device && *device && strcmp(device, "cpu") != 0) {
#ifdef MLC_OPENCL
        if (!mlc__opencl_open(ctx, device) && !ctx->error && strcmp(device, "best") != 0)
            mlc__fail(ctx, MLC_ERR_DEVICE, "mlc_create: no device matches \"%s\" (see mlc_devices)", device);
#else
        if (strcmp(device, "best") != 0)
            mlc__fail(ctx, MLC_ERR_DEVICE, "mlc_create: unknown device \"%s\" (this build has \"cpu\"; "
                      "define MLC_OPENCL for OpenCL devices)", device);
        else mlc__log(ctx, MLC_LOG_WARN, "best: this build has no device backend (define MLC_OPENCL); "
                      "running on the CPU");
#endif
    }
    return ctx;
}

MLCDEF void mlc_destroy(mlc_ctx *ctx) {
    mlc__block *b, *next;
    mlc_allocator a;
    if (!ctx) return;
    if (ctx->backend) mlc__device_close(ctx);
    while (ctx->owned.next != &ctx->owned) mlc__owned_free(ctx, (unsigned char *)ctx->owned.next + sizeof(mlc__owned) + 16);
    for (b = ctx->first_block; b; b = next) { next = b->next; mlc__heap_free(ctx, b); }
    a = ctx->config.allocator;
    if (a.free) a.free((unsigned char *)ctx - MLC__HEADER, a.user);
    else free((unsigned char *)ctx - MLC__HEADER);
}

MLCDEF const char *mlc_device_name(const mlc_ctx *ctx) {
    if (!ctx || !ctx->backend) return "cpu";
    return ctx->device_name[0] ? ctx->device_name : ctx->backend->name;
}
MLCDEF mlc_result mlc_error(const mlc_ctx *ctx) { return ctx ? ctx->error : MLC_ERR_NULL; }
MLCDEF const char *mlc_error_message(const mlc_ctx *ctx) {
    return !ctx ? "no context" : ctx->error ? ctx->message : "no error";
}
MLCDEF void mlc_clear_error(mlc_ctx *ctx) { if (ctx) { ctx->error = MLC_OK; ctx->message[0] = '\0'; } }
MLCDEF int mlc_set_grad_enabled(mlc_ctx *ctx, int enabled) {
    int previous;
    if (!ctx) return 0;
    previous = ctx->grad_enabled;
    ctx->grad_enabled = enabled;
    return previous;
}

typedef struct mlc__node mlc__node;
typedef void (*mlc__backward_fn)(mlc__node *n);
struct mlc__node {                      /* one recorded op: its output, inputs and saved values */
    mlc__node *prev;
    size_t index;                       /* position on the tape, from 0 */
    const char *op;
    mlc__backward_fn backward;
    mlc_tensor *out;
    mlc_tensor *in[6];
    int n_in;
    int iarg[8];
    float farg[4];
    void *saved;                        /* op-specific buffer in the arena (mask, argmax, stats) */
    int device;                         /* 1: ran on the device, and goes back there */
};

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

/* A setting where 0 means the default: MLC_ZERO (-0.0f) is an explicit zero, 0 the default. */
static float mlc__setting(float v, float def) {
    uint32_t bits;
    memcpy(&bits, &v, sizeof bits);
    return bits == 0x80000000u ? 0.0f : v == 0.0f ? def : v;
}

/* A hyper-parameter in [lo, hi] (or [lo, hi) when below_hi), never NaN; else MLC_ERR_ARG naming
   the op and the field. */
static int mlc__in_range(mlc_ctx *ctx, const char *op, const char *field, float v, float lo, float hi,
                         int below_hi) {
    if (v >= lo && (below_hi ? v < hi : v <= hi)) return 1;
    mlc__fail(ctx, MLC_ERR_ARG, "%s: %s = %g is outside [%g, %g%c", op, field, v, lo, hi,
              below_hi ? ')' : ']');
    return 0;
}

/* out becomes a copy of x's header (a view of its data) made now, in the current frame. */
static void mlc__view(mlc_tensor *out, const mlc_tensor *x) {
    mlc_ctx *ctx = x->ctx;
    *out = *x;
    out->level = ctx->level;
    out->frame_id = ctx->level ? ctx->frame_ids[ctx->level - 1] : 0;
    out->graph_used = 0;
}

/* t may be read or used by `op`: not NULL, and not from an ended frame (else an error). */
static int mlc__usable(mlc_tensor *t, const char *op) {
    if (!t) return 0;
    if (!mlc__ended(t->ctx, t)) return 1;
    mlc__fail(t->ctx, MLC_ERR_STATE, "%s: tensor %T was made in a frame that has ended "
              "(mlc_frame_end freed it)", op, t);
    return 0;
}

/* ============================================================================================
   Devices: where tensors live, and the backend table
   A tensor on the device keeps a host copy too; its `stale` bits say which copy is out of
   date. An op on device tensors hands its node to the backend; a backend without that kernel
   declines, the host copies are brought up to date and the CPU code runs (a fallback: counted,
   logged once). A node whose forward ran on the device runs its backward there too.
   ============================================================================================ */


MLCDEF int mlc_devices(mlc_device_info *out, int max) {
#ifdef MLC_OPENCL
    return mlc__opencl_devices(out, max);
#else
    (void)out; (void)max;
    return 0;
#endif
}

MLCDEF int mlc_has_device(const mlc_ctx *ctx) { return ctx && ctx->backend; }

/* The host copy of t's data (or gradient), brought up to date. */
static float *mlc__host(mlc_tensor *t) {
    if ((t->stale & MLC__HOST_STALE) && !t->ctx->error) {
        if (!t->ctx->backend->download(t, 0)) return t->data;
        t->stale &= ~(unsigned)MLC__HOST_STALE;
    }
    return t->data;
}
static float *mlc__host_grad(mlc_tensor *t) {
    if (!t->grad && t->device_grad) {                   /* the gradient so far lives on the device only */
        t->grad = t->persistent ? (float *)mlc__owned_alloc(t->ctx, t->size * sizeof(float), "mlc_host_grad")
                                : (float *)mlc__arena_alloc(t->ctx, t->size * sizeof(float), "mlc_host_grad");
        if (!t->grad) return NULL;
        t->stale |= MLC__GRAD_HOST_STALE;
    }
    if (t->grad && (t->stale & MLC__GRAD_HOST_STALE) && !t->ctx->error) {
        if (!t->ctx->backend->download(t, 1)) return t->grad;
        t->stale &= ~(unsigned)MLC__GRAD_HOST_STALE;
    }
    return t->grad;
}
/* The CPU wrote t's host data (or gradient): the device copy is out of date. */
static void mlc__host_wrote(mlc_tensor *t) {
    t->stale &= ~(unsigned)MLC__HOST_STALE;
    if (t->on_device) t->stale |= MLC__DEVICE_STALE;
}
static void mlc__host_wrote_grad(mlc_tensor *t) {
    t->stale &= ~(unsigned)MLC__GRAD_HOST_STALE;
    if (t->on_device) t->stale |= MLC__GRAD_DEVICE_STALE;
}

/* Zero t's gradient: on the device when it has one there (the host copy is then out of
   date, and only a read brings the zeros home), else on the host. */
static void mlc__clear_grad(mlc_tensor *t) {
    t->stale &= ~(unsigned)(MLC__GRAD_HOST_STALE | MLC__GRAD_DEVICE_STALE);
    if (t->device_grad) {
        if (t->ctx->backend->fill(t, 1, 0.0f) && t->grad) t->stale |= MLC__GRAD_HOST_STALE;
        return;
    }
    if (t->grad) memset(t->grad, 0, t->size * sizeof(float));
    mlc__host_wrote_grad(t);
}

MLCDEF float *mlc_host_data(mlc_tensor *t) { return mlc__usable(t, "mlc_host_data") ? mlc__host(t) : NULL; }
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
        mlc__format(message, sizeof message, "%s has no kernel on %s: it runs on the CPU, through copies", op, mlc_device_name(ctx));
        mlc__log(ctx, MLC_LOG_WARN, message);
    }
}

/* Run the op described by `call` (output allocated, inputs and arguments filled in) on the
   device when it lives there. 1: done; 0: run the CPU code, inputs are current on the host;
   -1: the device failed (the error is set). */
static int mlc__dispatch(mlc_ctx *ctx, mlc__node *call) {
    int k;
    mlc_tensor *out = call->out;
    if (out->on_device) {
        if (ctx->backend->forward(ctx, call)) {
            if (ctx->error) return -1;
            call->device = 1;
            out->stale = MLC__HOST_STALE;
            return 1;
        }
        if (ctx->error) return -1;
        mlc__fall_back(ctx, call->op);
    }
    for (k = 0; k < call->n_in; k++) if (call->in[k]) mlc__host(call->in[k]);
    out->stale = out->on_device ? MLC__DEVICE_STALE : 0;
    return ctx->error ? -1 : 0;
}

MLCDEF mlc_tensor *mlc_to(mlc_tensor *t, int on_device) {
    mlc_ctx *ctx;
    if (!t || t->ctx->error || !mlc__usable(t, "mlc_to")) return NULL;
    ctx = t->ctx;
    on_device = on_device != 0;
    if (on_device && !ctx->backend) return (mlc_tensor *)mlc__fail(ctx, MLC_ERR_DEVICE, "mlc_to: context runs on the CPU only (no device)");
    if (on_device == t->on_device) return t;
    if (!on_device) {                            /* bring both copies home */
        mlc__host(t);
        mlc__host_grad(t);
        if (t->persistent) mlc__device_release(t);
        t->device_data = t->device_grad = NULL;
        t->stale = 0;
        t->on_device = 0;
    } else {
        t->on_device = 1;
        t->stale = MLC__DEVICE_STALE | MLC__GRAD_DEVICE_STALE;
        if (!mlc__buffer_of(t, 0, "mlc_to") || (t->grad && !mlc__buffer_of(t, 1, "mlc_to"))) return NULL;
        if (!ctx->backend->upload(t, 0) || (t->grad && !ctx->backend->upload(t, 1))) return NULL;
        t->stale = 0;
    }
    return ctx->error ? NULL : t;
}

/* ============================================================================================
   Tensors: creation, shapes, reading and writing
   ============================================================================================ */

static size_t mlc__numel(int ndim, const int *shape) {
    size_t n = 1;
    int d;
    for (d = 0; d < ndim; d++) n *= (size_t)shape[d];
    return n;
}

static int mlc__check_shape(mlc_ctx *ctx, const char *op, int ndim, const int *shape) {
    int d;
    if (ndim < 0 || ndim > MLC_MAX_DIMS) { mlc__fail(ctx, MLC_ERR_SHAPE, "%s: rank %d is outside 0..%d", op, ndim, MLC_MAX_DIMS); return 0; }
    if (ndim && !shape) { mlc__fail(ctx, MLC_ERR_NULL, "%s: shape is NULL", op); return 0; }
    for (d = 0; d < ndim; d++)
        if (shape[d] < 0) { mlc__fail(ctx, MLC_ERR_SHAPE, "%s: dimension %d is negative (%d)", op, d, shape[d]); return 0; }
    return 1;
}

/* Make a tensor: in the arena (temporaries) or on the owned heap (long-lived). */
static mlc_tensor *mlc__make(mlc_ctx *ctx, const char *op, int ndim, const int *shape, int persistent) {
    mlc_tensor *t;
    size_t size = 1, bytes;
    int d;
    if (!ctx || ctx->error || !mlc__check_shape(ctx, op, ndim, shape)) return NULL;
    for (d = 0; d < ndim; d++)
        if (!mlc__size(size, (size_t)shape[d], 0, &size)) break;
    if (d < ndim || !mlc__size(size, sizeof(float), (sizeof(mlc_tensor) + 31) & ~(size_t)31, &bytes))
        return (mlc_tensor *)mlc__fail(ctx, MLC_ERR_SHAPE, "%s: a tensor of shape %s has more bytes than "
                                       "size_t counts", op, mlc__shape_text(ndim, shape).text);
    t = (mlc_tensor *)(persistent ? mlc__owned_alloc(ctx, bytes, op) : mlc__arena_alloc(ctx, bytes, op));
    if (!t) return NULL;
    memset(t, 0, sizeof *t);
    t->ctx = ctx;
    t->ndim = ndim;
    if (ndim) memcpy(t->shape, shape, (size_t)ndim * sizeof(int));
    t->size = size;
    t->data = (float *)((unsigned char *)t + ((sizeof(mlc_tensor) + 31) & ~(size_t)31));
    t->persistent = persistent;
    t->on_device = ctx->op_device;
    t->level = ctx->level;
    t->frame_id = ctx->level ? ctx->frame_ids[ctx->level - 1] : 0;
    t->stale = t->on_device ? MLC__DEVICE_STALE : 0;     /* the host copy is written first */
    return t;
}

/* A tensor the user creates: it lives on the context's device. */
static mlc_tensor *mlc__new(mlc_ctx *ctx, const char *op, int ndim, const int *shape, int persistent) {
    if (ctx) ctx->op_device = ctx->backend != NULL;
    return mlc__make(ctx, op, ndim, shape, persistent);
}

static mlc_tensor *mlc__like(mlc_tensor *x, const char *op) { return mlc__make(x->ctx, op, x->ndim, x->shape, 0); }

static float *mlc__floats(mlc_ctx *ctx, size_t count, const char *op) {   /* arena scratch */
    return (float *)mlc__arena_alloc(ctx, count * sizeof(float), op);
}

MLCDEF mlc_tensor *mlc_empty(mlc_ctx *ctx, int ndim, const int *shape) { return mlc__new(ctx, "mlc_empty", ndim, shape, 0); }

MLCDEF mlc_tensor *mlc_full(mlc_ctx *ctx, int ndim, const int *shape, float value) {
    mlc_tensor *t = mlc__new(ctx, "mlc_full", ndim, shape, 0);
    size_t i;
    if (t) for (i = 0; i < t->size; i++) t->data[i] = value;
    return t;
}
MLCDEF mlc_tensor *mlc_zeros(mlc_ctx *ctx, int ndim, const int *shape) { return mlc_full(ctx, ndim, shape, 0.0f); }
MLCDEF mlc_tensor *mlc_ones(mlc_ctx *ctx, int ndim, const int *shape) { return mlc_full(ctx, ndim, shape, 1.0f); }

MLCDEF mlc_tensor *mlc_from_data(mlc_ctx *ctx, int ndim, const int *shape, const float *data) {
    mlc_tensor *t;
    if (ctx && !data) return (mlc_tensor *)mlc__fail(ctx, MLC_ERR_NULL, "mlc_from_data: data is NULL");
    t = mlc__new(ctx, "mlc_from_data", ndim, shape, 0);
    if (t && t->size) memcpy(t->data, data, t->size * sizeof(float));
    return t;
}

MLCDEF mlc_tensor *mlc_arange(mlc_ctx *ctx, float start, float stop, float step) {
    mlc_tensor *t;
    double count;
    int n, i;
    if (!ctx || ctx->error) return NULL;
    count = step != 0.0f ? ceil(((double)stop - start) / step) : -1.0;
    if (step == 0.0f || count > 2147483647.0)
        return (mlc_tensor *)mlc__fail(ctx, MLC_ERR_ARG, "mlc_arange: bad range start %g stop %g step %g", start, stop, step);
    n = count > 0 ? (int)count : 0;
    t = mlc__new(ctx, "mlc_arange", 1, &n, 0);
    if (t) for (i = 0; i < n; i++) t->data[i] = (float)(start + (double)i * step);
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

MLCDEF mlc_tensor *mlc_parameter(mlc_ctx *ctx, int ndim, const int *shape) {
    mlc_tensor *t = mlc__new(ctx, "mlc_parameter", ndim, shape, 1);
    if (!t) return NULL;
    t->requires_grad = 1;
    if (!mlc__alloc_grad(t, "mlc_parameter")) { mlc__owned_free(ctx, t); return NULL; }
    return t;
}

MLCDEF mlc_tensor *mlc_keep(mlc_tensor *x) {
    mlc_tensor *t;
    if (!x || x->ctx->error || !mlc__usable(x, "mlc_keep")) return NULL;
    x->ctx->op_device = x->on_device;
    t = mlc__make(x->ctx, "mlc_keep", x->ndim, x->shape, 1);
    if (!t) return NULL;
    memcpy(t->data, mlc__host(x), x->size * sizeof(float));
    if (x->requires_grad && !mlc_requires_grad(t, 1)) { mlc_tensor_free(t); return NULL; }
    return t;
}

MLCDEF void mlc_tensor_free(mlc_tensor *t) {
    if (!t) return;
    if (!t->persistent) { mlc__fail(t->ctx, MLC_ERR_STATE, "mlc_tensor_free: tensor %T lives in a frame; mlc_frame_end frees it", t); return; }
    if (t->on_device) mlc__device_release(t);
    if (t->grad) mlc__owned_free(t->ctx, t->grad);
    mlc__owned_free(t->ctx, t);
}

MLCDEF mlc_tensor *mlc_requires_grad(mlc_tensor *t, int on) {
    if (!mlc__usable(t, "mlc_requires_grad")) return NULL;
    if (on && t->node == NULL && !mlc__alloc_grad(t, "mlc_requires_grad")) return NULL;
    t->requires_grad = on || t->node;
    return t;
}

MLCDEF float mlc_item(mlc_tensor *t) {
    if (!mlc__usable(t, "mlc_item")) return NAN;
    if (t->size != 1) { mlc__fail(t->ctx, MLC_ERR_SHAPE, "mlc_item: tensor %T has %zu elements, not 1", t, t->size); return NAN; }
    return mlc__host(t)[0];
}

MLCDEF float mlc_get(mlc_tensor *t, size_t i) {
    if (!mlc__usable(t, "mlc_get")) return NAN;
    if (i >= t->size) { mlc__fail(t->ctx, MLC_ERR_INDEX, "mlc_get: index %zu is outside tensor %T (%zu elements)", i, t, t->size); return NAN; }
    return mlc__host(t)[i];
}

MLCDEF mlc_result mlc_read(mlc_tensor *t, float *dst, size_t count) {
    if (!mlc__usable(t, "mlc_read")) return t ? t->ctx->error : MLC_ERR_NULL;
    if (!dst || count != t->size) { mlc__fail(t->ctx, MLC_ERR_ARG, "mlc_read: %zu floats asked of tensor %T (%zu elements)", count, t, t->size); return t->ctx->error; }
    memcpy(dst, mlc__host(t), count * sizeof(float));
    return MLC_OK;
}

MLCDEF mlc_result mlc_write(mlc_tensor *t, const float *src, size_t count) {
    if (!mlc__usable(t, "mlc_write")) return t ? t->ctx->error : MLC_ERR_NULL;
    if (!src || count != t->size) { mlc__fail(t->ctx, MLC_ERR_ARG, "mlc_write: %zu floats given for tensor %T (%zu elements)", count, t, t->size); return t->ctx->error; }
    if (t->device_data) t->ctx->backend->wait(t->ctx);   /* an upload may still read t->data */
    memcpy(t->data, src, count * sizeof(float));
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
    mlc__format(shape, sizeof shape, "%T", t);
    printf("%s %s = [", label ? label : "tensor", shape);
    n = t->size < 16 ? t->size : 16;
    for (i = 0; i < n; i++) printf("%s%.5g", i ? ", " : "", (double)mlc__host(t)[i]);
    printf("%s]\n", t->size > n ? ", ..." : "");
}
#endif

/* ============================================================================================
   Op plumbing: input checks, the tape, gradient buffers, threads
   ============================================================================================ */

/* The context of an op's inputs, or NULL when the op must not run: an input is NULL, the
   inputs come from different contexts, or the context already holds an error. */
static mlc_ctx *mlc__enter(const char *op, int count, mlc_tensor *const *inputs) {
    mlc_ctx *ctx = NULL;
    int i;
    for (i = 0; i < count; i++) if (inputs[i]) { ctx = inputs[i]->ctx; break; }
    if (!ctx || ctx->error) return NULL;
    for (i = 0; i < count; i++) {
        if (!inputs[i]) return (mlc_ctx *)mlc__fail(ctx, MLC_ERR_NULL, "%s: input %d is NULL", op, i);
        if (inputs[i]->ctx != ctx) return (mlc_ctx *)mlc__fail(ctx, MLC_ERR_ARG, "%s: input %d belongs to another context", op, i);
        if (mlc__ended(ctx, inputs[i]))
            return (mlc_ctx *)mlc__fail(ctx, MLC_ERR_STATE, "%s: input %d was made in a frame that has ended "
                                        "(mlc_frame_end freed it)", op, i);
        if (inputs[i]->on_device != inputs[0]->on_device)
            return (mlc_ctx *)mlc__fail(ctx, MLC_ERR_DEVICE, "%s: input 0 is on %s and input %d on %s; move one with mlc_to",
                                        op, inputs[0]->on_device ? mlc_device_name(ctx) : "cpu", i, inputs[i]->on_device ? mlc_device_name(ctx) : "cpu");
    }
    ctx->op_device = inputs[0]->on_device;
    return ctx;
}
#define MLC__ENTER(op, ...) \
    mlc_tensor *const mlc__in_[] = { __VA_ARGS__ }; \
    mlc_ctx *ctx = mlc__enter(op, (int)(sizeof mlc__in_ / sizeof mlc__in_[0]), mlc__in_); \
    if (!ctx) return NULL

/* Describe `out = op(inputs)`: the node the backend runs (mlc__dispatch) and the tape keeps. */
static void mlc__call(mlc__node *call, const char *op, mlc__backward_fn backward, mlc_tensor *out,
                      mlc_tensor *a, mlc_tensor *b, mlc_tensor *c, mlc_tensor *d) {
    int i;
    memset(call, 0, sizeof *call);
    call->op = op;
    call->backward = backward;
    call->out = out;
    call->in[0] = a; call->in[1] = b; call->in[2] = c; call->in[3] = d;
    for (i = 0; i < 4; i++) if (call->in[i]) call->n_in = i + 1;
}

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
    n = (mlc__node *)mlc__arena_alloc(ctx, sizeof(mlc__node), call->op);
    if (!n) return;
    *n = *call;
    n->prev = ctx->tape;
    n->index = ctx->tape ? ctx->tape->index + 1 : 0;
    ctx->tape = n;
    call->out->node = n;
    call->out->requires_grad = 1;
}

/* The gradient buffer of an input that needs one (zeroed on first use), else NULL. */
static float *mlc__grad(mlc_tensor *t) {
    if (!t || !t->requires_grad) return NULL;
    if (!t->grad) {
        t->grad = mlc__floats(t->ctx, t->size, "mlc_backward");
        if (!t->grad) return NULL;
        memset(t->grad, 0, t->size * sizeof(float));
        if (!(t->stale & MLC__GRAD_HOST_STALE)) mlc__host_wrote_grad(t);   /* else the device holds it */
    }
    return mlc__host_grad(t);
}

static int mlc__axis(mlc_ctx *ctx, const char *op, const mlc_tensor *x, int *axis) {
    int a = *axis < 0 ? *axis + x->ndim : *axis;
    if (a < 0 || a >= x->ndim) { mlc__fail(ctx, MLC_ERR_INDEX, "%s: axis %d is out of range for %T", op, *axis, x); return 0; }
    *axis = a;
    return 1;
}

/* View x as [outer, n, inner] around axis. */
static void mlc__split(const mlc_tensor *x, int axis, size_t *outer, int *n, size_t *inner) {
    *outer = mlc__numel(axis, x->shape);
    *n = x->shape[axis];
    *inner = mlc__numel(x->ndim - axis - 1, x->shape + axis + 1);
}

/* An optional input (a norm's weight) must live where x lives. */
static int mlc__same_device(mlc_ctx *ctx, const char *op, const mlc_tensor *x, const mlc_tensor *t) {
    if (!t || t->on_device == x->on_device) return 1;
    mlc__fail(ctx, MLC_ERR_DEVICE, "%s: %T and %T live on different devices; move one with mlc_to", op, x, t);
    return 0;
}

/* Read an index stored as a float: whole and in [0, limit), else an error naming the op. */
static int mlc__index(mlc_ctx *ctx, const char *op, float v, int limit, size_t where) {
    if (!(v >= 0.0f && v < (float)limit) || v != (float)(int)v) {
        mlc__fail(ctx, MLC_ERR_INDEX, "%s: index %g at position %zu is not a whole number in [0, %d)", op, v, where, limit);
        return -1;
    }
    return (int)v;
}

/* Threads (OpenMP when built with -fopenmp). Starting a parallel region costs about 0.4 µs,
   more than a small op's whole work, so work below a size runs on the calling thread and no
   region starts at all. mlc__parallel calls fn(arg, piece, begin, end) on `pieces` even
   slices of [0, n) (one per thread; piece numbers each slice, for per-slice scratch), or once
   on all of [0, n) when n < parallel_from or there is one thread. */
#ifdef _OPENMP
static int mlc__threads(void) { return omp_in_parallel() ? 1 : omp_get_max_threads(); }   /* a share stays on its thread */
#else
static int mlc__threads(void) { return 1; }
#endif

typedef void (*mlc__range_fn)(void *arg, int piece, size_t begin, size_t end);

static int mlc__pieces(size_t n, size_t parallel_from) {
    int threads = n >= parallel_from ? mlc__threads() : 1;
    return n < (size_t)threads ? (int)(n ? n : 1) : threads;
}

static void mlc__parallel(size_t n, size_t parallel_from, mlc__range_fn fn, void *arg) {
    int pieces = mlc__pieces(n, parallel_from), p;
    if (pieces == 1) { if (n) fn(arg, 0, 0, n); return; }
    MLC__OMP(omp parallel for num_threads(pieces) schedule(static, 1))
    for (p = 0; p < pieces; p++) fn(arg, p, n * (size_t)p / (size_t)pieces, n * (size_t)(p + 1) / (size_t)pieces);
}

/* c += v b over n floats (a row of a product, a bias): c and b apart, so it vectorises */
static void mlc__axpy(size_t n, float v, const float *MLC__RESTRICT b, float *MLC__RESTRICT c) {
    size_t j;
    MLC__OMP(omp simd)
    for (j = 0; j < n; j++) c[j] += v * b[j];
}

/* ============================================================================================
   Elementwise ops with broadcasting
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
                if (count == 2) mlc__fail(ctx, MLC_ERR_SHAPE, "%s: shapes %T and %T do not broadcast", op, ts[0], ts[1]);
                else mlc__fail(ctx, MLC_ERR_SHAPE, "%s: shapes %T, %T and %T do not broadcast", op, ts[0], ts[1], ts[2]);
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

enum { MLC__ADD, MLC__SUB, MLC__MUL, MLC__DIV };

/* Each operand's gradient row by row: its stride is 1, or 0 where it was stretched, and then
   the row's values sum into one element. */
static void mlc__binary_backward(mlc__node *n) {
    mlc_tensor *a = n->in[0], *b = n->in[1];
    float *ga = mlc__grad(a), *gb = mlc__grad(b);
    mlc__bcast bc;
    size_t r, j, sa, sb;
    int kind = n->iarg[0];
    mlc__broadcast(n->out->ctx, n->op, &bc, 2, n->in);
    sa = bc.last[0]; sb = bc.last[1];
    for (r = 0; r < bc.rows; r++) {
        size_t oa = mlc__bcast_row(&bc, 0, r), ob = mlc__bcast_row(&bc, 1, r);
        const float *g = n->out->grad + r * bc.inner, *pa = a->data + oa, *pb = b->data + ob;
        float *ra = ga ? ga + oa : NULL, *rb = gb ? gb + ob : NULL;
        switch (kind) {
        case MLC__ADD:
            if (ra) for (j = 0; j < bc.inner; j++) ra[j * sa] += g[j];
            if (rb) for (j = 0; j < bc.inner; j++) rb[j * sb] += g[j];
            break;
        case MLC__SUB:
            if (ra) for (j = 0; j < bc.inner; j++) ra[j * sa] += g[j];
            if (rb) for (j = 0; j < bc.inner; j++) rb[j * sb] -= g[j];
            break;
        case MLC__MUL:
            if (ra) for (j = 0; j < bc.inner; j++) ra[j * sa] += g[j] * pb[j * sb];
            if (rb) for (j = 0; j < bc.inner; j++) rb[j * sb] += g[j] * pa[j * sa];
            break;
        default:
            if (ra) for (j = 0; j < bc.inner; j++) ra[j * sa] += g[j] / pb[j * sb];
            if (rb) for (j = 0; j < bc.inner; j++) rb[j * sb] -= g[j] * pa[j * sa] / (pb[j * sb] * pb[j * sb]);
        }
    }
}

static mlc_tensor *mlc__binary(const char *op, int kind, mlc_tensor *a, mlc_tensor *b) {
    mlc__bcast bc;
    mlc__node call;
    mlc_tensor *out;
    size_t r, j;
    int where;
    MLC__ENTER(op, a, b);
    if (!mlc__broadcast(ctx, op, &bc, 2, mlc__in_)) return NULL;
    out = mlc__make(ctx, op, bc.ndim, bc.shape, 0);
    if (!out) return NULL;
    mlc__call(&call, op, mlc__binary_backward, out, a, b, NULL, NULL);
    call.iarg[0] = kind;
    if ((where = mlc__dispatch(ctx, &call)) < 0) return NULL;
    for (r = 0; where == 0 && r < bc.rows; r++) {
        const float *pa = a->data + mlc__bcast_row(&bc, 0, r), *pb = b->data + mlc__bcast_row(&bc, 1, r);
        size_t sa = bc.last[0], sb = bc.last[1];
        float *o = out->data + r * bc.inner;
        switch (kind) {
        case MLC__ADD: for (j = 0; j < bc.inner; j++) o[j] = pa[j * sa] + pb[j * sb]; break;
        case MLC__SUB: for (j = 0; j < bc.inner; j++) o[j] = pa[j * sa] - pb[j * sb]; break;
        case MLC__MUL: for (j = 0; j < bc.inner; j++) o[j] = pa[j * sa] * pb[j * sb]; break;
        default:       for (j = 0; j < bc.inner; j++) o[j] = pa[j * sa] / pb[j * sb]; break;
        }
    }
    mlc__record(&call);
    return out;
}

MLCDEF mlc_tensor *mlc_add(mlc_tensor *a, mlc_tensor *b) { return mlc__binary("mlc_add", MLC__ADD, a, b); }
MLCDEF mlc_tensor *mlc_sub(mlc_tensor *a, mlc_tensor *b) { return mlc__binary("mlc_sub", MLC__SUB, a, b); }
MLCDEF mlc_tensor *mlc_mul(mlc_tensor *a, mlc_tensor *b) { return mlc__binary("mlc_mul", MLC__MUL, a, b); }
MLCDEF mlc_tensor *mlc_div(mlc_tensor *a, mlc_tensor *b) { return mlc__binary("mlc_div", MLC__DIV, a, b); }

/* where: y = c ? a : b      da = c ? g : 0      db = c ? 0 : g      (c gets no gradient) */
static void mlc__where_backward(mlc__node *n) {
    float *ga = mlc__grad(n->in[1]), *gb = mlc__grad(n->in[2]);
    const float *g = n->out->grad, *c = n->in[0]->data;
    mlc__bcast bc;
    size_t r, j;
    mlc__broadcast(n->out->ctx, n->op, &bc, 3, n->in);
    for (r = 0; r < bc.rows; r++) {
        size_t oc = mlc__bcast_row(&bc, 0, r), oa = mlc__bcast_row(&bc, 1, r), ob = mlc__bcast_row(&bc, 2, r);
        size_t sc = bc.last[0], sa = bc.last[1], sb = bc.last[2];
        for (j = 0; j < bc.inner; j++) {
            if (c[oc + j * sc] != 0.0f) { if (ga) ga[oa + j * sa] += g[r * bc.inner + j]; }
            else if (gb) gb[ob + j * sb] += g[r * bc.inner + j];
        }
    }
}

MLCDEF mlc_tensor *mlc_where(mlc_tensor *cond, mlc_tensor *a, mlc_tensor *b) {
    mlc__bcast bc;
    mlc__node call;
    mlc_tensor *out;
    size_t r, j;
    int where;
    MLC__ENTER("mlc_where", cond, a, b);
    if (!mlc__broadcast(ctx, "mlc_where", &bc, 3, mlc__in_)) return NULL;
    out = mlc__make(ctx, "mlc_where", bc.ndim, bc.shape, 0);
    if (!out) return NULL;
    mlc__call(&call, "mlc_where", mlc__where_backward, out, cond, a, b, NULL);
    if ((where = mlc__dispatch(ctx, &call)) < 0) return NULL;
    for (r = 0; where == 0 && r < bc.rows; r++) {
        const float *pc = cond->data + mlc__bcast_row(&bc, 0, r), *pa = a->data + mlc__bcast_row(&bc, 1, r),
                    *pb = b->data + mlc__bcast_row(&bc, 2, r);
        size_t sc = bc.last[0], sa = bc.last[1], sb = bc.last[2];
        for (j = 0; j < bc.inner; j++) out->data[r * bc.inner + j] = pc[j * sc] != 0.0f ? pa[j * sa] : pb[j * sb];
    }
    mlc__record(&call);
    return out;
}

/* masked_fill: y = m ? v : x      dx = m ? 0 : g      (m broadcasts to x's shape) */
static void mlc__masked_fill_backward(mlc__node *n) {
    float *gx = mlc__grad(n->in[0]);
    const float *g = n->out->grad;
    mlc__bcast bc;
    size_t r, j;
    mlc__broadcast(n->out->ctx, n->op, &bc, 2, n->in);
    for (r = 0; r < bc.rows; r++) {
        const float *pm = n->in[1]->data + mlc__bcast_row(&bc, 1, r);
        size_t sm = bc.last[1];
        for (j = 0; j < bc.inner; j++) if (pm[j * sm] == 0.0f) gx[r * bc.inner + j] += g[r * bc.inner + j];
    }
}

MLCDEF mlc_tensor *mlc_masked_fill(mlc_tensor *x, mlc_tensor *mask, float value) {
    mlc__bcast bc;
    mlc__node call;
    mlc_tensor *out;
    size_t r, j;
    int where;
    MLC__ENTER("mlc_masked_fill", x, mask);
    if (!mlc__broadcast(ctx, "mlc_masked_fill", &bc, 2, mlc__in_)) return NULL;
    if (bc.ndim != x->ndim || memcmp(bc.shape, x->shape, (size_t)x->ndim * sizeof(int)) != 0)
        return (mlc_tensor *)mlc__fail(ctx, MLC_ERR_SHAPE, "mlc_masked_fill: mask %T does not broadcast to x %T", mask, x);
    out = mlc__like(x, "mlc_masked_fill");
    if (!out) return NULL;
    mlc__call(&call, "mlc_masked_fill", mlc__masked_fill_backward, out, x, mask, NULL, NULL);
    call.farg[0] = value;
    if ((where = mlc__dispatch(ctx, &call)) < 0) return NULL;
    for (r = 0; where == 0 && r < bc.rows; r++) {
        const float *pm = mask->data + mlc__bcast_row(&bc, 1, r);
        size_t sm = bc.last[1];
        for (j = 0; j < bc.inner; j++)
            out->data[r * bc.inner + j] = pm[j * sm] != 0.0f ? value : x->data[r * bc.inner + j];
    }
    mlc__record(&call);
    return out;
}

/* ============================================================================================
   Elementwise ops of one tensor, and activations. y = f(x), dx = g f'(x):
     neg      y = -x                  dx = -g
     exp      y = e^x                 dx = g y
     log      y = ln x                dx = g / x
     sqrt     y = √x                  dx = g / (2y)
     pow      y = x^p                 dx = g p x^(p-1)
     abs      y = |x|                 dx = g sign(x)
     clamp    y = min(max(x,lo),hi)   dx = g [lo <= x <= hi]
     +s, *s   y = x + s, x s, s - x   dx = g, g s, -g
     relu     y = max(x, 0)           dx = g [x > 0]
     leaky    y = x > 0 ? x : a x     dx = g (x > 0 ? 1 : a)
     gelu     y = x Φ(x)              dx = g (Φ(x) + x φ(x))
     gelu_t   y = x (1 + tanh u) / 2, u = √(2/π)(x + 0.044715 x³)
                                      dx = g ((1 + t)/2 + x (1 - t²) u' / 2)
     sigmoid  y = 1 / (1 + e^-x)      dx = g y (1 - y)
     tanh     y = tanh x              dx = g (1 - y²)
     silu     y = x σ(x)              dx = g σ(x) (1 + x (1 - σ(x)))
   ============================================================================================ */

typedef enum {
    MLC__NEG, MLC__EXP, MLC__LOG, MLC__SQRT, MLC__POW, MLC__ABS, MLC__CLAMP, MLC__ADDS, MLC__MULS,
    MLC__RSUBS, MLC__RELU, MLC__LEAKY, MLC__GELU, MLC__GELU_TANH, MLC__SIGMOID, MLC__TANH, MLC__SILU
} mlc__unary_kind;

static const char *const mlc__unary_names[] = {
    "mlc_neg", "mlc_exp", "mlc_log", "mlc_sqrt", "mlc_pow", "mlc_abs", "mlc_clamp", "mlc_add_scalar",
    "mlc_mul_scalar", "mlc_rsub_scalar", "mlc_relu", "mlc_leaky_relu", "mlc_gelu", "mlc_gelu_tanh",
    "mlc_sigmoid", "mlc_tanh", "mlc_silu"
};

#define MLC__SQRT_2_OVER_PI 0.7978845608028654f
#define MLC__INV_SQRT_2 0.7071067811865476f
#define MLC__INV_SQRT_2PI 0.3989422804014327f

static float mlc__sigmoidf(float x) {
    if (x >= 0) return 1.0f / (1.0f + MLC_EXPF(-x));
    { float e = MLC_EXPF(x); return e / (1.0f + e); }
}

/* tanh|x| = m / (m + 2) with m = e^(2|x|) - 1, computed whole so that small x loses nothing:
   e^y - 1 = 2^n (e^r - 1) + 2^n - 1, n = round(y / ln 2), |r| <= ln 2 / 2 (degree-7 Taylor).
   |x| is capped at 9 (tanh rounds to 1 there); the sign is put back. No branches and no libm,
   so the loops around it vectorise (the selects are written as GCC's vectoriser reads them);
   at most 3.3 ulp from the true value. */
static inline float mlc__tanhf(float x) {
    uint32_t bits, sign;
    float a, y, k, n, r, m, two_n;
    memcpy(&bits, &x, sizeof bits);
    sign = bits & 0x80000000u;
    bits &= 0x7fffffffu;                                 /* |x| */
    bits = bits < 0x41100000u ? bits : 0x41100000u;      /* at most 9.0f */
    bits |= (uint32_t)(x != x) * 0x7fc00000u;            /* a NaN stays NaN */
    memcpy(&a, &bits, sizeof a);
    y = 2.0f * a;
    k = y * 1.44269504f + 12582912.0f;                   /* 1.5 2^23 + n: n in the low bits */
    n = k - 12582912.0f;
    r = (y - n * 0.693145751953125f) - n * 1.428606765330187e-6f;   /* ln 2 in two parts */
    memcpy(&bits, &k, sizeof bits);
    bits = (bits - 0x4b400000u + 127u) << 23;            /* 2^n */
    memcpy(&two_n, &bits, sizeof two_n);
    m = two_n * (r * (1.0f + r * (0.5f + r * (1.0f / 6 + r * (1.0f / 24 + r * (1.0f / 120 + r * (1.0f / 720 + r * (1.0f / 5040)))))))) + (two_n - 1.0f);
    y = m / (m + 2.0f);
    memcpy(&bits, &y, sizeof bits);
    bits |= sign;
    memcpy(&y, &bits, sizeof y);
    return y;
}

/* d/dx of x (1 + tanh u) / 2 with u = √(2/π)(x + 0.044715 x³) */
static float mlc__gelu_tanh_slope(float x) {
    float u = MLC__SQRT_2_OVER_PI * (x + 0.044715f * x * x * x), t = MLC_TANHF(u);
    return 0.5f * (1.0f + t) + 0.5f * x * (1.0f - t * t) * MLC__SQRT_2_OVER_PI * (1.0f + 3.0f * 0.044715f * x * x);
}

/* One loop per op, so each is a plain, vectorisable loop: y = f(x) forward, and
   gx += g f'(x) backward, given x and y = f(x). Threads share the elements from 64k on. */
#define MLC__MAP(expr) MLC__OMP(omp simd) for (i = 0; i < n; i++) { const float x = xs[i]; ys[i] = (expr); } break
#define MLC__MAP_GRAD(expr) MLC__OMP(omp simd) \
    for (i = 0; i < n; i++) { const float x = xs[i], y = ys[i]; gx[i] += g[i] * (expr); (void)x; (void)y; } break
#define MLC__MAP_PARALLEL 65536

#if MLC__X86
static int mlc__cpu_avx2(void) { return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma"); }

/* the tanh map again, compiled for AVX2 and FMA: 8 floats at a time where the CPU has them */
__attribute__((target("avx2,fma")))
static void mlc__tanh_avx2(size_t n, const float *MLC__RESTRICT xs, float *MLC__RESTRICT ys) {
    size_t i;
    MLC__OMP(omp simd)
    for (i = 0; i < n; i++) ys[i] = MLC_TANHF(xs[i]);
}
#endif

static void mlc__unary_forward(int kind, size_t n, const float *MLC__RESTRICT xs, float *MLC__RESTRICT ys, float p, float q) {
    size_t i;
#if MLC__X86
    if (kind == MLC__TANH && mlc__cpu_avx2()) { mlc__tanh_avx2(n, xs, ys); return; }
#endif
    switch (kind) {
    case MLC__NEG:       MLC__MAP(-x);
    case MLC__EXP:       MLC__MAP(MLC_EXPF(x));
    case MLC__LOG:       MLC__MAP(MLC_LOGF(x));
    case MLC__SQRT:      MLC__MAP(MLC_SQRTF(x));
    case MLC__POW:       MLC__MAP(MLC_POWF(x, p));
    case MLC__ABS:       MLC__MAP(x < 0 ? -x : x);
    case MLC__CLAMP:     MLC__MAP(x < p ? p : x > q ? q : x);
    case MLC__ADDS:      MLC__MAP(x + p);
    case MLC__MULS:      MLC__MAP(x * p);
    case MLC__RSUBS:     MLC__MAP(p - x);
    case MLC__RELU:      MLC__MAP(x > 0 ? x : 0.0f);
    case MLC__LEAKY:     MLC__MAP(x > 0 ? x : p * x);
    case MLC__GELU:      MLC__MAP(0.5f * x * (1.0f + MLC_ERFF(x * MLC__INV_SQRT_2)));
    case MLC__GELU_TANH: MLC__MAP(0.5f * x * (1.0f + MLC_TANHF(MLC__SQRT_2_OVER_PI * (x + 0.044715f * x * x * x))));
    case MLC__SIGMOID:   MLC__MAP(mlc__sigmoidf(x));
    case MLC__TANH:      MLC__MAP(MLC_TANHF(x));
    default:             MLC__MAP(x * mlc__sigmoidf(x));                 /* silu */
    }
}

static void mlc__unary_grad(int kind, size_t n, const float *MLC__RESTRICT xs, const float *MLC__RESTRICT ys,
                            const float *MLC__RESTRICT g, float *MLC__RESTRICT gx, float p, float q) {
    size_t i;
    switch (kind) {
    case MLC__NEG:       MLC__MAP_GRAD(-1.0f);
    case MLC__EXP:       MLC__MAP_GRAD(y);
    case MLC__LOG:       MLC__MAP_GRAD(1.0f / x);
    case MLC__SQRT:      MLC__MAP_GRAD(0.5f / y);
    case MLC__POW:       MLC__MAP_GRAD(p * MLC_POWF(x, p - 1.0f));
    case MLC__ABS:       MLC__MAP_GRAD(x > 0 ? 1.0f : x < 0 ? -1.0f : 0.0f);
    case MLC__CLAMP:     MLC__MAP_GRAD(x >= p && x <= q ? 1.0f : 0.0f);
    case MLC__ADDS:      MLC__MAP_GRAD(1.0f);
    case MLC__MULS:      MLC__MAP_GRAD(p);
    case MLC__RSUBS:     MLC__MAP_GRAD(-1.0f);
    case MLC__RELU:      MLC__MAP_GRAD(x > 0 ? 1.0f : 0.0f);
    case MLC__LEAKY:     MLC__MAP_GRAD(x > 0 ? 1.0f : p);
    case MLC__GELU:      MLC__MAP_GRAD(0.5f * (1.0f + MLC_ERFF(x * MLC__INV_SQRT_2)) + x * MLC__INV_SQRT_2PI * MLC_EXPF(-0.5f * x * x));
    case MLC__GELU_TANH: MLC__MAP_GRAD(mlc__gelu_tanh_slope(x));
    case MLC__SIGMOID:   MLC__MAP_GRAD(y * (1.0f - y));
    case MLC__TANH:      MLC__MAP_GRAD(1.0f - y * y);
    default:             MLC__MAP_GRAD(mlc__sigmoidf(x) * (1.0f + x * (1.0f - mlc__sigmoidf(x))));   /* silu */
    }
}
#undef MLC__MAP
#undef MLC__MAP_GRAD

/* The two maps over a slice [begin, end) of the node's tensors, for mlc__parallel. */
static void mlc__unary_forward_slice(void *node, int piece, size_t begin, size_t end) {
    const mlc__node *n = (const mlc__node *)node;
    (void)piece;
    mlc__unary_forward(n->iarg[0], end - begin, n->in[0]->data + begin, n->out->data + begin, n->farg[0], n->farg[1]);
}
static void mlc__unary_grad_slice(void *node, int piece, size_t begin, size_t end) {
    const mlc__node *n = (const mlc__node *)node;
    const mlc_tensor *x = n->in[0], *y = n->out;
    (void)piece;
    mlc__unary_grad(n->iarg[0], end - begin, x->data + begin, y->data + begin, y->grad + begin, x->grad + begin, n->farg[0], n->farg[1]);
}

static void mlc__unary_backward(mlc__node *n) {
    if (mlc__grad(n->in[0])) mlc__parallel(n->out->size, MLC__MAP_PARALLEL, mlc__unary_grad_slice, n);
}

static mlc_tensor *mlc__unary(int kind, mlc_tensor *x, float p, float q) {
    const char *op = mlc__unary_names[kind];
    mlc_tensor *out;
    mlc__node call;
    int where;
    MLC__ENTER(op, x);
    out = mlc__like(x, op);
    if (!out) return NULL;
    mlc__call(&call, op, mlc__unary_backward, out, x, NULL, NULL, NULL);
    call.iarg[0] = kind; call.farg[0] = p; call.farg[1] = q;
    if ((where = mlc__dispatch(ctx, &call)) < 0) return NULL;
    if (where == 0) mlc__parallel(x->size, MLC__MAP_PARALLEL, mlc__unary_forward_slice, &call);
    mlc__record(&call);
    return out;
}

MLCDEF mlc_tensor *mlc_neg(mlc_tensor *x) { return mlc__unary(MLC__NEG, x, 0, 0); }
MLCDEF mlc_tensor *mlc_exp(mlc_tensor *x) { return mlc__unary(MLC__EXP, x, 0, 0); }
MLCDEF mlc_tensor *mlc_log(mlc_tensor *x) { return mlc__unary(MLC__LOG, x, 0, 0); }
MLCDEF mlc_tensor *mlc_sqrt(mlc_tensor *x) { return mlc__unary(MLC__SQRT, x, 0, 0); }
MLCDEF mlc_tensor *mlc_pow(mlc_tensor *x, float exponent) { return mlc__unary(MLC__POW, x, exponent, 0); }
MLCDEF mlc_tensor *mlc_abs(mlc_tensor *x) { return mlc__unary(MLC__ABS, x, 0, 0); }
MLCDEF mlc_tensor *mlc_clamp(mlc_tensor *x, float lo, float hi) {
    if (x && !x->ctx->error && !(lo <= hi))
        return (mlc_tensor *)mlc__fail(x->ctx, MLC_ERR_ARG, "mlc_clamp: lo %g is above hi %g", lo, hi);
    return mlc__unary(MLC__CLAMP, x, lo, hi);
}
MLCDEF mlc_tensor *mlc_add_scalar(mlc_tensor *x, float s) { return mlc__unary(MLC__ADDS, x, s, 0); }
MLCDEF mlc_tensor *mlc_mul_scalar(mlc_tensor *x, float s) { return mlc__unary(MLC__MULS, x, s, 0); }
MLCDEF mlc_tensor *mlc_rsub_scalar(mlc_tensor *x, float s) { return mlc__unary(MLC__RSUBS, x, s, 0); }
MLCDEF mlc_tensor *mlc_relu(mlc_tensor *x) { return mlc__unary(MLC__RELU, x, 0, 0); }
MLCDEF mlc_tensor *mlc_leaky_relu(mlc_tensor *x, float slope) { return mlc__unary(MLC__LEAKY, x, slope, 0); }
MLCDEF mlc_tensor *mlc_gelu(mlc_tensor *x) { return mlc__unary(MLC__GELU, x, 0, 0); }
MLCDEF mlc_tensor *mlc_gelu_tanh(mlc_tensor *x) { return mlc__unary(MLC__GELU_TANH, x, 0, 0); }
MLCDEF mlc_tensor *mlc_sigmoid(mlc_tensor *x) { return mlc__unary(MLC__SIGMOID, x, 0, 0); }
MLCDEF mlc_tensor *mlc_tanh(mlc_tensor *x) { return mlc__unary(MLC__TANH, x, 0, 0); }
MLCDEF mlc_tensor *mlc_silu(mlc_tensor *x) { return mlc__unary(MLC__SILU, x, 0, 0); }

/* ============================================================================================
   Matrix products
     C = op(A) op(B)          A [M, K], B [K, N] after the optional transposes
     dA = dC op(B)^T          dB = op(A)^T dC     (with transposes, worked out per case below)
   mlc_gemm_reference is the plain loop every faster path is tested against; mlc_gemm is the
   one place every product goes through (the user's hook, BLAS, or mlc's own).
   ============================================================================================ */

/* C[M,N] = op(A) op(B) + beta C; each operand is stored row-major as written, or transposed. */
MLCDEF void mlc_gemm_reference(int ta, int tb, int M, int N, int K, const float *A, const float *B, float beta, float *C) {
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

#ifndef MLC_USE_CBLAS
/* mlc's own matrix product: the Goto/BLIS scheme.
   C is cut into NC-wide column panels and K into KC-deep slices. For each (panel, slice) the
   KC x NC block of op(B) is packed once (shared by all threads) and every thread packs MC x KC
   blocks of op(A) into its own part of `work`. Packing copies a block into slivers: strips MR
   rows (of A) or NR columns (of B) wide, stored k-major, so the micro-kernel reads both
   operands sequentially whatever the transposes were, and an edge sliver is padded with zeros
   so the kernel always runs a full tile. The micro-kernel keeps an MR x NR tile of C in
   registers and adds one rank-1 update (a column of the A sliver times a row of the B sliver)
   per k; a B sliver stays in L1 while the A slivers of the block stream past it from L2.
   The x86-64 kernels are compiled for AVX2+FMA and AVX-512 and picked at run time, so a plain
   -O2 build still runs at full speed; elsewhere the vector-extension kernel is used. */
/* tile bounds; below SMALL multiply-adds the plain loop wins, below PARALLEL one thread does */
enum { MLC__GEMM_MR_MAX = 12, MLC__GEMM_NR_MAX = 32, MLC__GEMM_SMALL = 16 * 16 * 16, MLC__GEMM_PARALLEL = 64 * 64 * 32 };

/* micro-kernel: C[mr, nr] (row stride ldc) = (add ? C : 0) + sum over k of a[k*mr + i] b[k*nr + j] */
typedef void (*mlc__gemm_kernel_fn)(int kc, const float *a, const float *b, float *c, int ldc, int add);
typedef struct mlc__gemm_arch { mlc__gemm_kernel_fn kernel; int mr, nr, mc, kc, nc; } mlc__gemm_arch;

#if defined(__GNUC__)
/* 6 x 16 with GCC/Clang vectors of 4 floats (SSE, NEON): 24 accumulators, four B loads per k */
typedef float mlc__v4 __attribute__((vector_size(16)));

static void mlc__gemm_kernel_6x16(int kc, const float *a, const float *b, float *c, int ldc, int add) {
    const mlc__v4 zero = { 0.0f, 0.0f, 0.0f, 0.0f };
    mlc__v4 acc[6][4], bk[4], t;
    int i, j, k;
    _Pragma("GCC unroll 6") for (i = 0; i < 6; i++) _Pragma("GCC unroll 4") for (j = 0; j < 4; j++) acc[i][j] = zero;
    for (k = 0; k < kc; k++, a += 6, b += 16) {
        memcpy(bk, b, sizeof bk);
        _Pragma("GCC unroll 6") for (i = 0; i < 6; i++) _Pragma("GCC unroll 4") for (j = 0; j < 4; j++) acc[i][j] += bk[j] * a[i];
    }
    _Pragma("GCC unroll 6") for (i = 0; i < 6; i++, c += ldc) _Pragma("GCC unroll 4") for (j = 0; j < 4; j++) {
        if (add) { memcpy(&t, c + 4 * j, sizeof t); acc[i][j] += t; }
        memcpy(c + 4 * j, &acc[i][j], sizeof t);
    }
}
#else
static void mlc__gemm_kernel_6x16(int kc, const float *a, const float *b, float *c, int ldc, int add) {
    float acc[6][16] = {{0}};
    int i, j, k;
    for (k = 0; k < kc; k++, a += 6, b += 16)
        for (i = 0; i < 6; i++)
            for (j = 0; j < 16; j++) acc[i][j] += a[i] * b[j];
    for (i = 0; i < 6; i++, c += ldc)
        for (j = 0; j < 16; j++) c[j] = add ? c[j] + acc[i][j] : acc[i][j];
}
#endif

#if MLC__X86
/* 6 x 16: twelve 8-float accumulators, two B loads and six broadcasts of A per k */
__attribute__((target("avx2,fma")))
static void mlc__gemm_kernel_avx2(int kc, const float *a, const float *b, float *c, int ldc, int add) {
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
}

/* 12 x 32: twenty-four 16-float accumulators, two B loads and twelve broadcasts of A per k */
__attribute__((target("avx512f,avx2,fma")))
static void mlc__gemm_kernel_avx512(int kc, const float *a, const float *b, float *c, int ldc, int add) {
    __m512 acc[12][2];
    int i, k;
    _Pragma("GCC unroll 12") for (i = 0; i < 12; i++) acc[i][0] = acc[i][1] = _mm512_setzero_ps();
    for (k = 0; k < kc; k++, a += 12, b += 32) {
        __m512 b0 = _mm512_loadu_ps(b), b1 = _mm512_loadu_ps(b + 16);
        _Pragma("GCC unroll 12") for (i = 0; i < 12; i++) {
            __m512 ai = _mm512_set1_ps(a[i]);
            acc[i][0] = _mm512_fmadd_ps(ai, b0, acc[i][0]);
            acc[i][1] = _mm512_fmadd_ps(ai, b1, acc[i][1]);
        }
    }
    _Pragma("GCC unroll 12") for (i = 0; i < 12; i++, c += ldc) {
        if (add) {
            acc[i][0] = _mm512_add_ps(acc[i][0], _mm512_loadu_ps(c));
            acc[i][1] = _mm512_add_ps(acc[i][1], _mm512_loadu_ps(c + 16));
        }
        _mm512_storeu_ps(c, acc[i][0]);
        _mm512_storeu_ps(c + 16, acc[i][1]);
    }
}
#endif

/* Kernels with their block sizes: KC x NR of B stays in L1, MC x KC of A in L2, KC x NC in L3. */
static const mlc__gemm_arch mlc__gemm_generic = { mlc__gemm_kernel_6x16, 6, 16, 120, 256, 1024 };
#if MLC__X86
static const mlc__gemm_arch mlc__gemm_avx2 = { mlc__gemm_kernel_avx2, 6, 16, 120, 256, 1024 };
static const mlc__gemm_arch mlc__gemm_avx512 = { mlc__gemm_kernel_avx512, 12, 32, 120, 256, 1024 };
#endif

/* the best kernel this CPU runs */
static const mlc__gemm_arch *mlc__gemm_pick(void) {
#if MLC__X86
    if (__builtin_cpu_supports("avx512f")) return &mlc__gemm_avx512;
    if (mlc__cpu_avx2()) return &mlc__gemm_avx2;
#endif
    return &mlc__gemm_generic;
}

/* this thread's number in the product's parallel region, and how many threads it got */
#ifdef _OPENMP
static int mlc__gemm_thread(void) { return omp_get_thread_num(); }
static int mlc__gemm_team(void) { return omp_get_num_threads(); }
#else
static int mlc__gemm_thread(void) { return 0; }
static int mlc__gemm_team(void) { return 1; }
#endif

static int mlc__gemm_round_up(int x, int m) { return (x + m - 1) / m * m; }

/* How a product (M, K >= 1) is cut for kernel g on `threads` threads: K into equal slices of
   kc <= g->kc, M into A blocks of equal height mc (a multiple of MR, <= g->mc), as many blocks
   as threads at least, so the threads share the work evenly */
static void mlc__gemm_cut(const mlc__gemm_arch *g, int M, int K, int threads, int *kc, int *mc) {
    int kblocks = (K + g->kc - 1) / g->kc, mblocks = (M + g->mc - 1) / g->mc;
    *kc = (K + kblocks - 1) / kblocks;
    if (mblocks < threads) mblocks = threads < (M + g->mr - 1) / g->mr ? threads : (M + g->mr - 1) / g->mr;
    else mblocks = mlc__gemm_round_up(mblocks, threads);
    *mc = mlc__gemm_round_up((M + mblocks - 1) / mblocks, g->mr);
}

/* `work` for kernel g holds one packed B panel, then one packed A block per thread, each as
   large as the product's cut needs and rounded to a multiple of 16 floats so all start 64-byte aligned */
static size_t mlc__gemm_b_floats(const mlc__gemm_arch *g, int N, int kc) {
    return ((size_t)mlc__gemm_round_up(N < g->nc ? N : g->nc, g->nr) * kc + 15) / 16 * 16;
}
static size_t mlc__gemm_a_floats(int mc, int kc) { return ((size_t)mc * kc + 15) / 16 * 16; }
static size_t mlc__gemm_work_floats(const mlc__gemm_arch *g, int M, int N, int K, int threads) {
    int kc, mc;
    if (M < 1 || N < 1 || K < 1) return 0;              /* an empty product packs nothing */
    mlc__gemm_cut(g, M, K, threads, &kc, &mc);
    return mlc__gemm_b_floats(g, N, kc) + (size_t)threads * mlc__gemm_a_floats(mc, kc);
}

/* Packs one sliver: dst[k*w + x] = src[x*sx + k*sk] for x < m, zero for m <= x < w. */
static void mlc__gemm_pack(float *dst, const float *src, size_t sx, size_t sk, int m, int kc, int w) {
    int k, x;
    if (m < w) memset(dst, 0, (size_t)kc * w * sizeof(float));   /* an edge sliver */
    for (k = 0; k < kc; k++, dst += w, src += sk) {
        if (sx == 1) { MLC__OMP(omp simd) for (x = 0; x < m; x++) dst[x] = src[x]; }
        else for (x = 0; x < m; x++) dst[x] = src[x * sx];
    }
}

typedef struct mlc__gemm_job {          /* one packed product, shared by the threads that run it */
    const mlc__gemm_arch *g;
    int M, N, K, kc, mc;
    const float *A, *B;
    size_t a_sx, a_sk, b_sx, b_sk;      /* op(A)[i, k] = A[i*a_sx + k*a_sk], op(B)[k, j] = B[k*b_sk + j*b_sx] */
    float beta, *C, *work;
} mlc__gemm_job;

/* The loops over blocks, run by each of the product's threads (thread of threads): each packs
   its share of the B slivers, all wait, each computes its share of the A blocks, all wait.
   The shares are worked out here rather than with `omp for`, which would bind to a region
   the caller may be in (conv2d's threads each run a product of their own). */
static void mlc__gemm_blocks(const mlc__gemm_job *p, int thread, int threads) {
    const mlc__gemm_arch *g = p->g;
    const int mr = g->mr, nr = g->nr, M = p->M, N = p->N, K = p->K, blocks = (M + p->mc - 1) / p->mc;
    float *bp = p->work, *ap = p->work + mlc__gemm_b_floats(g, N, p->kc) + (size_t)thread * mlc__gemm_a_floats(p->mc, p->kc);
    int jc, pc;
    for (jc = 0; jc < N; jc += g->nc) {
        int nc = N - jc < g->nc ? N - jc : g->nc, slivers = (nc + nr - 1) / nr;
        for (pc = 0; pc < K; pc += p->kc) {
            int kk = K - pc < p->kc ? K - pc : p->kc, add = pc > 0 || p->beta != 0.0f, jr, ic, at;
            for (at = slivers * thread / threads; at < slivers * (thread + 1) / threads; at++) {
                jr = at * nr;
                mlc__gemm_pack(bp + (size_t)jr * kk, p->B + (size_t)pc * p->b_sk + (size_t)(jc + jr) * p->b_sx, p->b_sx, p->b_sk,
                               nc - jr < nr ? nc - jr : nr, kk, nr);
            }
            if (threads > 1) { MLC__OMP(omp barrier) }   /* B's panel is packed */
            for (at = blocks * thread / threads; at < blocks * (thread + 1) / threads; at++) {
                int m, ir;
                ic = at * p->mc;
                m = M - ic < p->mc ? M - ic : p->mc;
                for (ir = 0; ir < m; ir += mr)
                    mlc__gemm_pack(ap + (size_t)ir * kk, p->A + (size_t)(ic + ir) * p->a_sx + (size_t)pc * p->a_sk, p->a_sx, p->a_sk,
                                   m - ir < mr ? m - ir : mr, kk, mr);
                for (jr = 0; jr < nc; jr += nr) {
                    for (ir = 0; ir < m; ir += mr) {
                        float *c = p->C + (size_t)(ic + ir) * N + jc + jr, tile[MLC__GEMM_MR_MAX * MLC__GEMM_NR_MAX];
                        int mm = m - ir < mr ? m - ir : mr, nn = nc - jr < nr ? nc - jr : nr, i, j;
                        if (mm == mr && nn == nr) { g->kernel(kk, ap + (size_t)ir * kk, bp + (size_t)jr * kk, c, N, add); continue; }
                        g->kernel(kk, ap + (size_t)ir * kk, bp + (size_t)jr * kk, tile, nr, 0);   /* edge: full tile aside */
                        for (i = 0; i < mm; i++)
                            for (j = 0; j < nn; j++) c[(size_t)i * N + j] = add ? c[(size_t)i * N + j] + tile[i * nr + j] : tile[i * nr + j];
                    }
                }
            }
            if (threads > 1) { MLC__OMP(omp barrier) }   /* done with the panel */
        }
    }
}

/* the packed product with kernel g on `threads` threads (1: no parallel region), for K >= 1;
   work holds mlc__gemm_work_floats(g, M, N, K, threads) floats */
static void mlc__gemm_packed(const mlc__gemm_arch *g, int ta, int tb, int M, int N, int K, const float *A, const float *B,
                             float beta, float *C, float *work, int threads) {
    mlc__gemm_job p;
    const size_t lda = ta ? (size_t)M : (size_t)K, ldb = tb ? (size_t)K : (size_t)N;
    p.g = g; p.M = M; p.N = N; p.K = K; p.A = A; p.B = B; p.beta = beta; p.C = C; p.work = work;
    p.a_sx = ta ? 1 : lda; p.a_sk = ta ? lda : 1; p.b_sx = tb ? ldb : 1; p.b_sk = tb ? 1 : ldb;
    mlc__gemm_cut(g, M, K, threads, &p.kc, &p.mc);
    if (threads == 1) { mlc__gemm_blocks(&p, 0, 1); return; }
    MLC__OMP(omp parallel num_threads(threads))
    mlc__gemm_blocks(&p, mlc__gemm_thread(), mlc__gemm_team());
}

/* Products with few rows of C, without packing. With M <= 4 each value of op(B) serves at most
   four rows, less than packing it costs (batch-1 inference: linear is x Wᵀ with M = 1), so
   op(B) is read where it lies; columns of C are shared out between threads:
     B stored [N, K] (tb):  C[i, j] += op(A) row i · B row j      dot products of two rows
     B stored [K, N]:       C row i += Σ_k op(A)[i, k] B row k    rows of B scaled and summed
   The same loops serve any M when they are short: dot products for N <= 4 (the tiny MLP's
   output layer), sums of K <= 4 rows (its gradient back through that layer). */
enum { MLC__GEMM_DIRECT_ROWS = 4, MLC__GEMM_DOT_CHUNK = 256 };

typedef struct mlc__gemm_direct_job { int ta, tb, M, N, K; const float *A, *B; float *C; } mlc__gemm_direct_job;

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
static void mlc__gemm_dot4(int K, const float *MLC__RESTRICT a, const float *MLC__RESTRICT b, size_t ldb, float *MLC__RESTRICT c) {
    const float *b0 = b, *b1 = b + ldb, *b2 = b + 2 * ldb, *b3 = b + 3 * ldb;
    float s0 = 0.0f, s1 = 0.0f, s2 = 0.0f, s3 = 0.0f;
    int k;
#if MLC__X86
    if (mlc__cpu_avx2()) { mlc__gemm_dot4_avx2(K, a, b, ldb, c); return; }
#endif
    MLC__OMP(omp simd reduction(+:s0, s1, s2, s3))
    for (k = 0; k < K; k++) { s0 += a[k] * b0[k]; s1 += a[k] * b1[k]; s2 += a[k] * b2[k]; s3 += a[k] * b3[k]; }
    c[0] += s0; c[1] += s1; c[2] += s2; c[3] += s3;
}

static float mlc__gemm_dot(int K, const float *MLC__RESTRICT a, const float *MLC__RESTRICT b) {
    float s = 0.0f;
    int k;
    MLC__OMP(omp simd reduction(+:s))
    for (k = 0; k < K; k++) s += a[k] * b[k];
    return s;
}

/* c += a0 b0 + a1 b1 + a2 b2 + a3 b3 over n floats (rows b_r = b + r ldb): C read once for four rows of B */
static void mlc__gemm_axpy4(size_t n, const float *a, const float *MLC__RESTRICT b, size_t ldb, float *MLC__RESTRICT c) {
    const float *b0 = b, *b1 = b + ldb, *b2 = b + 2 * ldb, *b3 = b + 3 * ldb, a0 = a[0], a1 = a[1], a2 = a[2], a3 = a[3];
    size_t j;
    MLC__OMP(omp simd)
    for (j = 0; j < n; j++) c[j] += a0 * b0[j] + a1 * b1[j] + a2 * b2[j] + a3 * b3[j];
}

/* Columns [begin, end) of C (already scaled by beta), for mlc__parallel. */
static void mlc__gemm_direct_slice(void *job, int piece, size_t begin, size_t end) {
    const mlc__gemm_direct_job *d = (const mlc__gemm_direct_job *)job;
    const int M = d->M, N = d->N, K = d->K, j0 = (int)begin, j1 = (int)end;
    int i, j, k, k0;
    (void)piece;
    if (!d->tb) {
        for (i = 0; i < M; i++)
            for (k = 0; k < K; k += 4) {
                float a[4];
                int r, rows = K - k < 4 ? K - k : 4;
                for (r = 0; r < 4; r++) a[r] = r >= rows ? 0.0f : d->ta ? d->A[(size_t)(k + r) * M + i] : d->A[(size_t)i * K + k + r];
                if (rows == 4) mlc__gemm_axpy4((size_t)(j1 - j0), a, d->B + (size_t)k * N + j0, (size_t)N, d->C + (size_t)i * N + j0);
                else for (r = 0; r < rows; r++) mlc__axpy((size_t)(j1 - j0), a[r], d->B + (size_t)(k + r) * N + j0, d->C + (size_t)i * N + j0);
            }
        return;
    }
    for (i = 0; i < M; i++)
        for (k0 = 0; k0 < K; k0 += MLC__GEMM_DOT_CHUNK) {   /* op(A)'s row in pieces, gathered when A is transposed */
            float row[MLC__GEMM_DOT_CHUNK], *c = d->C + (size_t)i * N;
            const float *a = d->A + (size_t)i * K + k0;
            int kk = K - k0 < MLC__GEMM_DOT_CHUNK ? K - k0 : MLC__GEMM_DOT_CHUNK;
            if (d->ta) { for (k = 0; k < kk; k++) row[k] = d->A[(size_t)(k0 + k) * M + i]; a = row; }
            for (j = j0; j + 4 <= j1; j += 4) mlc__gemm_dot4(kk, a, d->B + (size_t)j * K + k0, (size_t)K, c + j);
            for (; j < j1; j++) c[j] += mlc__gemm_dot(kk, a, d->B + (size_t)j * K + k0);
        }
}

static void mlc__gemm_direct(int ta, int tb, int M, int N, int K, const float *A, const float *B, float beta, float *C) {
    mlc__gemm_direct_job d;
    if (N == 1 && M > 1) {                 /* C [M, 1] is also Cᵀ [1, M] = op(B)ᵀ op(A)ᵀ: one row */
        mlc__gemm_direct(!tb, !ta, 1, M, K, B, A, beta, C);
        return;
    }
    if (beta == 0.0f) memset(C, 0, (size_t)M * N * sizeof(float));
    d.ta = ta; d.tb = tb; d.M = M; d.N = N; d.K = K; d.A = A; d.B = B; d.C = C;
    mlc__parallel((size_t)N, (size_t)(MLC__GEMM_PARALLEL / ((double)M * K)) + 1, mlc__gemm_direct_slice, &d);
}

#endif /* !MLC_USE_CBLAS */

/* mlc_gemm, and with `work` the product of one thread of a caller that runs several at once
   (conv2d over images): on this thread only, packing into work (mlc__gemm_work floats), as
   the arena is not for threads. */
static void mlc__gemm(mlc_ctx *ctx, int ta, int tb, int M, int N, int K, const float *A, const float *B, float beta,
                      float *C, float *work) {
    if (M <= 0 || N <= 0) return;
    if (ctx->config.gemm) { ctx->config.gemm(ta, tb, M, N, K, A, B, beta, C, ctx->config.gemm_user); return; }
#ifdef MLC_USE_CBLAS
    (void)work;
    cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans, M, N, K,
                1.0f, A, ta ? M : K, B, tb ? K : N, beta, C, N);
#else
    if (K <= 0 || (double)M * N * K < MLC__GEMM_SMALL) {   /* too small to repay any setting up */
        mlc_gemm_reference(ta, tb, M, N, K, A, B, beta, C);
        return;
    }
    if (M <= MLC__GEMM_DIRECT_ROWS || (tb ? N : K) <= MLC__GEMM_DIRECT_ROWS) {
        mlc__gemm_direct(ta, tb, M, N, K, A, B, beta, C);
        return;
    }
    if (work) { mlc__gemm_packed(mlc__gemm_pick(), ta, tb, M, N, K, A, B, beta, C, work, 1); return; }
    {   /* the packing workspace: arena scratch, released at once (the arena keeps the block) */
        const mlc__gemm_arch *g = mlc__gemm_pick();
        int threads = (double)M * N * K < MLC__GEMM_PARALLEL ? 1 : mlc__threads();
        mlc_frame scratch = mlc_frame_begin(ctx);
        work = mlc__floats(ctx, mlc__gemm_work_floats(g, M, N, K, threads), "mlc_gemm");
        if (work) mlc__gemm_packed(g, ta, tb, M, N, K, A, B, beta, C, work, threads);
        else mlc_gemm_reference(ta, tb, M, N, K, A, B, beta, C);   /* out of memory: still right */
        mlc_frame_end(scratch);
    }
#endif
}

MLCDEF void mlc_gemm(mlc_ctx *ctx, int ta, int tb, int M, int N, int K, const float *A, const float *B, float beta, float *C) {
    if (!ctx || ctx->error) return;
    if (M < 0 || N < 0 || K < 0 || (beta != 0.0f && beta != 1.0f) || (M && N && (!C || (K && (!A || !B))))) {
        mlc__fail(ctx, MLC_ERR_ARG, "mlc_gemm: M %d, N %d, K %d, beta %g or a NULL matrix is not valid",
                  M, N, K, beta);
        return;
    }
    mlc__gemm(ctx, ta, tb, M, N, K, A, B, beta, C, NULL);
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
    return mlc__gemm_work_floats(mlc__gemm_pick(), M, N, K, 1);
#endif
}

typedef struct mlc__mm { int ta, tb, M, N, K, batches; size_t step_a, step_b, step_c; } mlc__mm;

static void mlc__gemm_batched(mlc_ctx *ctx, const mlc__mm *mm, int ta, int tb, int M, int N, int K,
                              const float *A, size_t sa, const float *B, size_t sb, float beta, float *C, size_t sc) {
    int i;
    for (i = 0; i < mm->batches; i++) mlc_gemm(ctx, ta, tb, M, N, K, A + i * sa, B + i * sb, beta, C + i * sc);
}

static void mlc__matmul_backward(mlc__node *n) {
    const mlc__mm *mm = (const mlc__mm *)n->saved;
    mlc_tensor *a = n->in[0], *b = n->in[1];
    float *ga = mlc__grad(a), *gb = mlc__grad(b);
    const float *gc = n->out->grad;
    if (ga && !mm->ta) mlc__gemm_batched(a->ctx, mm, 0, !mm->tb, mm->M, mm->K, mm->N, gc, mm->step_c, b->data, mm->step_b, 1.0f, ga, mm->step_a);
    if (ga && mm->ta)  mlc__gemm_batched(a->ctx, mm, mm->tb, 1, mm->K, mm->M, mm->N, b->data, mm->step_b, gc, mm->step_c, 1.0f, ga, mm->step_a);
    if (gb && !mm->tb) mlc__gemm_batched(a->ctx, mm, !mm->ta, 0, mm->K, mm->N, mm->M, a->data, mm->step_a, gc, mm->step_c, 1.0f, gb, mm->step_b);
    if (gb && mm->tb)  mlc__gemm_batched(a->ctx, mm, 1, mm->ta, mm->N, mm->K, mm->M, gc, mm->step_c, a->data, mm->step_a, 1.0f, gb, mm->step_b);
    if (mlc__grad(n->in[2])) {                          /* linear's bias: db = column sums of dC */
        float *gbias = n->in[2]->grad;
        size_t rows = n->out->size / (size_t)mm->N, r;
        for (r = 0; r < rows; r++) mlc__axpy((size_t)mm->N, 1.0f, gc + r * mm->N, gbias);
    }
}

/* C = op(A) op(B) (+ bias [N] on every row: linear's bias, fused into the product's pass) */
static mlc_tensor *mlc__matmul(const char *op, mlc_tensor *a, mlc_tensor *b, int transpose_a, int transpose_b, mlc_tensor *bias) {
    mlc__mm mm;
    mlc_tensor *out;
    mlc__node call;
    int shape[MLC_MAX_DIMS], ndim, K2, d, where;
    MLC__ENTER(op, a, b);
    if (a->ndim < 2 || b->ndim < 2)
        return (mlc_tensor *)mlc__fail(ctx, MLC_ERR_SHAPE, "%s: operands need rank >= 2, got %T and %T", op, a, b);
    mm.ta = transpose_a != 0; mm.tb = transpose_b != 0;
    mm.M = a->shape[a->ndim - 2 + mm.ta]; mm.K = a->shape[a->ndim - 1 - mm.ta];
    K2 = b->shape[b->ndim - 2 + mm.tb];   mm.N = b->shape[b->ndim - 1 - mm.tb];
    if (mm.K != K2)
        return (mlc_tensor *)mlc__fail(ctx, MLC_ERR_SHAPE, "%s: inner sizes differ: %T%s @ %T%s (%d vs %d)",
                                       op, a, mm.ta ? "^T" : "", b, mm.tb ? "^T" : "", mm.K, K2);
    if (a->ndim > 2 && b->ndim > 2 && (a->ndim != b->ndim || memcmp(a->shape, b->shape, (size_t)(a->ndim - 2) * sizeof(int))))
        return (mlc_tensor *)mlc__fail(ctx, MLC_ERR_SHAPE, "%s: batch dimensions of %T and %T differ", op, a, b);
    ndim = a->ndim > b->ndim ? a->ndim : b->ndim;
    for (d = 0; d < ndim - 2; d++) shape[d] = a->ndim > 2 ? a->shape[d] : b->shape[d];
    shape[ndim - 2] = mm.M; shape[ndim - 1] = mm.N;
    if (bias && (bias->ctx != ctx || bias->ndim != 1 || bias->shape[0] != mm.N))
        return (mlc_tensor *)mlc__fail(ctx, MLC_ERR_SHAPE, "%s: bias %T does not match the %d outputs", op, bias, mm.N);
    if (!mlc__same_device(ctx, op, a, bias)) return NULL;
    out = mlc__make(ctx, op, ndim, shape, 0);
    if (!out) return NULL;
    mm.batches = (int)mlc__numel(ndim - 2, shape);
    mm.step_a = a->ndim > 2 ? (size_t)mm.M * mm.K : 0;
    mm.step_b = b->ndim > 2 ? (size_t)mm.K * mm.N : 0;
    mm.step_c = (size_t)mm.M * mm.N;
    if (b->ndim == 2 && !mm.ta && mm.batches > 1) {   /* [..., M, K] @ [K, N]: one tall product */
        mm.M *= mm.batches; mm.batches = 1; mm.step_a = mm.step_c = 0;
    }
    mlc__call(&call, op, mlc__matmul_backward, out, a, b, bias, NULL);
    if (!(call.saved = mlc__arena_alloc(ctx, sizeof mm, op))) return NULL;
    memcpy(call.saved, &mm, sizeof mm);
    if ((where = mlc__dispatch(ctx, &call)) < 0) return NULL;
    if (where == 0) {
        mlc__gemm_batched(ctx, &mm, mm.ta, mm.tb, mm.M, mm.N, mm.K, a->data, mm.step_a, b->data, mm.step_b, 0.0f, out->data, mm.step_c);
        if (bias) {
            size_t rows = out->size / (size_t)mm.N, r;
            for (r = 0; r < rows; r++) mlc__axpy((size_t)mm.N, 1.0f, bias->data, out->data + r * mm.N);
        }
    }
    mlc__record(&call);
    return out;
}

MLCDEF mlc_tensor *mlc_matmul(mlc_tensor *a, mlc_tensor *b) { return mlc_matmul_t(a, b, 0, 0); }

/* linear: y = x W^T + b      x [..., in], W [out, in], b [out] */
MLCDEF mlc_tensor *mlc_matmul_t(mlc_tensor *a, mlc_tensor *b, int transpose_a, int transpose_b) {
    return mlc__matmul("mlc_matmul", a, b, transpose_a, transpose_b, NULL);
}

MLCDEF mlc_tensor *mlc_linear(mlc_tensor *x, mlc_tensor *weight, mlc_tensor *bias) {
    return mlc__matmul("mlc_linear", x, weight, 0, 1, bias);
}

/* ============================================================================================
   Reductions over one axis; x is viewed as [outer, n, inner] and the axis is the middle.
     sum   y = Σ x                  dx = g
     mean  y = Σ x / n              dx = g / n
     max   y = max x                dx = g at the (first) argmax, 0 elsewhere
     var   y = Σ (x - μ)² / (n - c) dx = g 2 (x - μ) / (n - c)     (c = 1 when unbiased)
   Sums are taken in double.
   ============================================================================================ */

enum { MLC__SUM, MLC__MEAN, MLC__MAX, MLC__VAR, MLC__ARGMAX };

static void mlc__reduce_backward(mlc__node *n) {
    mlc_tensor *x = n->in[0];
    float *gx = mlc__grad(x);
    const float *g = n->out->grad;
    const int *argmax = (const int *)n->saved;
    int kind = n->iarg[0], len = n->iarg[1], i;
    size_t inner = (size_t)n->iarg[3], outer = len && inner ? x->size / ((size_t)len * inner) : 0, o, k;
    float denom = kind == MLC__VAR ? (float)(len - n->iarg[4]) : (float)len;
    for (o = 0; o < outer; o++)
        for (k = 0; k < inner; k++) {
            size_t base = o * len * inner + k;
            float gv = g[o * inner + k];
            if (kind == MLC__MAX) { gx[base + (size_t)argmax[o * inner + k] * inner] += gv; continue; }
            if (kind == MLC__VAR) {
                double mean = 0.0;
                for (i = 0; i < len; i++) mean += x->data[base + (size_t)i * inner];
                mean /= len;
                for (i = 0; i < len; i++) gx[base + (size_t)i * inner] += gv * 2.0f * (float)(x->data[base + (size_t)i * inner] - mean) / denom;
                continue;
            }
            for (i = 0; i < len; i++) gx[base + (size_t)i * inner] += kind == MLC__SUM ? gv : gv / denom;
        }
}

static mlc_tensor *mlc__reduce(const char *op, int kind, mlc_tensor *x, int axis, int keepdim, int unbiased) {
    int shape[MLC_MAX_DIMS], ndim = 0, d, len, i, *argmax = NULL;
    size_t outer, inner, o, k;
    mlc_tensor *out;
    mlc__node call;
    int where;
    MLC__ENTER(op, x);
    if (!mlc__axis(ctx, op, x, &axis)) return NULL;
    mlc__split(x, axis, &outer, &len, &inner);
    if (len == 0 && kind != MLC__SUM)
        return (mlc_tensor *)mlc__fail(ctx, MLC_ERR_SHAPE, "%s: axis %d of %T is empty", op, axis, x);
    if (kind == MLC__VAR && len <= unbiased)
        return (mlc_tensor *)mlc__fail(ctx, MLC_ERR_SHAPE, "%s: unbiased variance needs 2 or more values along axis %d of %T", op, axis, x);
    for (d = 0; d < x->ndim; d++) {
        if (d != axis) shape[ndim++] = x->shape[d];
        else if (keepdim) shape[ndim++] = 1;
    }
    out = mlc__make(ctx, op, ndim, shape, 0);
    if (!out) return NULL;
    mlc__call(&call, op, mlc__reduce_backward, out, x, NULL, NULL, NULL);
    call.iarg[0] = kind; call.iarg[1] = len; call.iarg[3] = (int)inner; call.iarg[4] = unbiased;
    if ((where = mlc__dispatch(ctx, &call)) < 0) return NULL;
    if (where == 0 && (kind == MLC__MAX || kind == MLC__ARGMAX)) {   /* the device finds it again */
        argmax = (int *)mlc__arena_alloc(ctx, outer * inner * sizeof(int), op);
        if (!argmax) return NULL;
    }
    for (o = 0; where == 0 && o < outer; o++)
        for (k = 0; k < inner; k++) {
            const float *p = x->data + o * len * inner + k;
            double s = 0.0, mean;
            float best;
            int at = 0;
            switch (kind) {
            case MLC__MAX: case MLC__ARGMAX:
                best = p[0];
                for (i = 1; i < len; i++) if (p[(size_t)i * inner] > best || best != best) { best = p[(size_t)i * inner]; at = i; }
                argmax[o * inner + k] = at;
                out->data[o * inner + k] = kind == MLC__MAX ? best : (float)at;
                break;
            case MLC__VAR:
                for (i = 0; i < len; i++) s += p[(size_t)i * inner];
                mean = s / len; s = 0.0;
                for (i = 0; i < len; i++) s += (p[(size_t)i * inner] - mean) * (p[(size_t)i * inner] - mean);
                out->data[o * inner + k] = (float)(s / (len - unbiased));
                break;
            default:
                for (i = 0; i < len; i++) s += p[(size_t)i * inner];
                out->data[o * inner + k] = (float)(kind == MLC__MEAN ? s / len : s);
            }
        }
    if (kind == MLC__ARGMAX) return out;                 /* indices carry no gradient */
    call.saved = argmax;
    mlc__record(&call);
    return out;
}

MLCDEF mlc_tensor *mlc_sum(mlc_tensor *x, int axis, int keepdim) { return mlc__reduce("mlc_sum", MLC__SUM, x, axis, keepdim, 0); }
MLCDEF mlc_tensor *mlc_mean(mlc_tensor *x, int axis, int keepdim) { return mlc__reduce("mlc_mean", MLC__MEAN, x, axis, keepdim, 0); }
MLCDEF mlc_tensor *mlc_max(mlc_tensor *x, int axis, int keepdim) { return mlc__reduce("mlc_max", MLC__MAX, x, axis, keepdim, 0); }
MLCDEF mlc_tensor *mlc_var(mlc_tensor *x, int axis, int keepdim, int unbiased) { return mlc__reduce("mlc_var", MLC__VAR, x, axis, keepdim, unbiased != 0); }
MLCDEF mlc_tensor *mlc_argmax(mlc_tensor *x, int axis) { return mlc__reduce("mlc_argmax", MLC__ARGMAX, x, axis, 0, 0); }
MLCDEF mlc_tensor *mlc_sum_all(mlc_tensor *x) {
    int n = x ? (int)x->size : 0;
    return mlc_sum(mlc_reshape(x, 1, &n), 0, 0);
}
MLCDEF mlc_tensor *mlc_mean_all(mlc_tensor *x) {
    int n = x ? (int)x->size : 0;
    return mlc_mean(mlc_reshape(x, 1, &n), 0, 0);
}

/* ============================================================================================
   Softmax along an axis (max subtracted first, so large logits do not overflow)
     softmax      y = e^(x - max) / Σ e^(x - max)     dx = y (g - Σ g y)
     log_softmax  y = x - max - ln Σ e^(x - max)      dx = g - e^y Σ g
   ============================================================================================ */

static void mlc__softmax_backward(mlc__node *n) {
    mlc_tensor *y = n->out;
    float *gx = mlc__grad(n->in[0]);
    int len = n->iarg[1], i, is_log = n->iarg[0];
    size_t inner = (size_t)n->iarg[2], outer = y->size / ((size_t)len * inner), o, k;
    for (o = 0; o < outer; o++)
        for (k = 0; k < inner; k++) {
            size_t base = o * len * inner + k;
            double s = 0.0;
            for (i = 0; i < len; i++) {
                size_t at = base + (size_t)i * inner;
                s += is_log ? y->grad[at] : y->grad[at] * y->data[at];
            }
            for (i = 0; i < len; i++) {
                size_t at = base + (size_t)i * inner;
                gx[at] += is_log ? y->grad[at] - MLC_EXPF(y->data[at]) * (float)s
                                 : y->data[at] * (y->grad[at] - (float)s);
            }
        }
}

static mlc_tensor *mlc__softmax(const char *op, int is_log, mlc_tensor *x, int axis) {
    size_t outer, inner, o, k;
    int len, i, where;
    mlc_tensor *out;
    mlc__node call;
    MLC__ENTER(op, x);
    if (!mlc__axis(ctx, op, x, &axis)) return NULL;
    mlc__split(x, axis, &outer, &len, &inner);
    out = mlc__like(x, op);
    if (!out || len == 0 || inner == 0) return out;
    mlc__call(&call, op, mlc__softmax_backward, out, x, NULL, NULL, NULL);
    call.iarg[0] = is_log; call.iarg[1] = len; call.iarg[2] = (int)inner;
    if ((where = mlc__dispatch(ctx, &call)) < 0) return NULL;
    for (o = 0; where == 0 && o < outer; o++)
        for (k = 0; k < inner; k++) {
            const float *p = x->data + o * len * inner + k;
            float *q = out->data + o * len * inner + k, m = p[0];
            double s = 0.0;
            for (i = 1; i < len; i++) if (p[(size_t)i * inner] > m) m = p[(size_t)i * inner];
            for (i = 0; i < len; i++) s += MLC_EXPF(p[(size_t)i * inner] - m);
            for (i = 0; i < len; i++)
                q[(size_t)i * inner] = is_log ? p[(size_t)i * inner] - m - (float)log(s)
                                              : MLC_EXPF(p[(size_t)i * inner] - m) / (float)s;
        }
    mlc__record(&call);
    return out;
}

MLCDEF mlc_tensor *mlc_softmax(mlc_tensor *x, int axis) { return mlc__softmax("mlc_softmax", 0, x, axis); }
MLCDEF mlc_tensor *mlc_log_softmax(mlc_tensor *x, int axis) { return mlc__softmax("mlc_log_softmax", 1, x, axis); }

/* ============================================================================================
   Losses. Reduction: mean (over counted elements), sum, or none (one loss per element/row).
     cross_entropy  ℓ_i = -log softmax(x_i)[t_i]        dx_i = g (softmax(x_i) - onehot(t_i))
     nll            ℓ_i = -x_i[t_i]                     dx_i[t_i] = -g
     mse            ℓ = (p - t)²                        dp = 2 g (p - t)      dt = -dp
     bce_logits     ℓ = max(x,0) - x t + ln(1 + e^-|x|) dx = g (σ(x) - t)     dt = -g x
   ============================================================================================ */

/* Per-element weight of the incoming gradient: g_i for none, g / count for mean, g for sum. */
static float mlc__loss_scale(const mlc__node *n, size_t i) {
    const float *g = n->out->grad;
    if (n->iarg[0] == MLC_REDUCE_NONE) return g[i];
    return n->iarg[0] == MLC_REDUCE_MEAN ? g[0] * n->farg[0] : g[0];
}

/* The output of a loss: one value per element (none) or a scalar. */
static mlc_tensor *mlc__loss_make(mlc_ctx *ctx, const char *op, mlc_reduction red, int ndim, const int *shape) {
    if ((int)red < MLC_REDUCE_MEAN || (int)red > MLC_REDUCE_NONE)
        return (mlc_tensor *)mlc__fail(ctx, MLC_ERR_ARG, "%s: unknown reduction %d", op, (int)red);
    return mlc__make(ctx, op, red == MLC_REDUCE_NONE ? ndim : 0, shape, 0);
}

/* ... filled from per-element values l[0..count): l itself for none, else their sum or mean. */
static void mlc__loss_reduce(mlc_tensor *out, mlc_reduction red, const float *l, size_t count, size_t counted) {
    double s = 0.0;
    size_t i;
    if (red == MLC_REDUCE_NONE) { memcpy(out->data, l, count * sizeof(float)); return; }
    for (i = 0; i < count; i++) s += l[i];
    out->data[0] = (float)(red == MLC_REDUCE_MEAN ? s / (double)counted : s);
}

static void mlc__class_loss_backward(mlc__node *n) {   /* cross entropy (saved probs) and nll */
    mlc_tensor *x = n->in[0], *t = n->in[1];
    float *gx = mlc__grad(x);
    const float *probs = (const float *)n->saved;
    int N = x->shape[0], C = x->shape[1], i, c;
    for (i = 0; i < N; i++) {
        int target = (int)t->data[i];
        float g;
        if (target == n->iarg[1]) continue;
        g = mlc__loss_scale(n, (size_t)i);
        if (probs) for (c = 0; c < C; c++) gx[(size_t)i * C + c] += g * probs[(size_t)i * C + c];
        gx[(size_t)i * C + target] -= g;
    }
}

static mlc_tensor *mlc__class_loss(const char *op, int softmax_first, mlc_tensor *x, mlc_tensor *target,
                                   mlc_reduction red, int ignore_index) {
    int N, C, i, c, where;
    size_t counted = 0;
    float *l, *probs = NULL;
    const float *tgt;
    mlc_tensor *out;
    mlc__node call;
    MLC__ENTER(op, x, target);
    if (x->ndim != 2 || target->ndim != 1 || target->shape[0] != x->shape[0])
        return (mlc_tensor *)mlc__fail(ctx, MLC_ERR_SHAPE, "%s: expects input [N, C] and target [N], got %T and %T", op, x, target);
    N = x->shape[0]; C = x->shape[1];
    tgt = mlc__host(target);                             /* targets are checked on the host */
    for (i = 0; i < N; i++) {
        if (tgt[i] == (float)ignore_index && ignore_index != MLC_NO_IGNORE) continue;
        if (mlc__index(ctx, op, tgt[i], C, (size_t)i) < 0) return NULL;
        counted++;
    }
    if (!(out = mlc__loss_make(ctx, op, red, 1, target->shape))) return NULL;
    mlc__call(&call, op, mlc__class_loss_backward, out, x, target, NULL, NULL);   /* target gets no gradient */
    call.iarg[0] = (int)red; call.iarg[1] = ignore_index == MLC_NO_IGNORE ? -1 : ignore_index; call.iarg[2] = softmax_first;
    call.farg[0] = 1.0f / (float)counted;
    if ((where = mlc__dispatch(ctx, &call)) < 0) return NULL;
    if (where == 1) { mlc__record(&call); return out; }
    l = mlc__floats(ctx, (size_t)N, op);
    if (softmax_first) probs = mlc__floats(ctx, (size_t)N * C, op);
    if (!l || (softmax_first && !probs)) return NULL;
    for (i = 0; i < N; i++) {
        const float *row = x->data + (size_t)i * C;
        int tc = (int)tgt[i];
        l[i] = 0.0f;
        if (tgt[i] == (float)ignore_index && ignore_index != MLC_NO_IGNORE) continue;
        if (softmax_first) {
            float m = row[0];
            double s = 0.0;
            for (c = 1; c < C; c++) if (row[c] > m) m = row[c];
            for (c = 0; c < C; c++) s += MLC_EXPF(row[c] - m);
            for (c = 0; c < C; c++) probs[(size_t)i * C + c] = MLC_EXPF(row[c] - m) / (float)s;
            l[i] = (float)(log(s) - (row[tc] - m));
        } else l[i] = -row[tc];
    }
    mlc__loss_reduce(out, red, l, (size_t)N, counted);
    call.saved = probs;
    mlc__record(&call);
    return out;
}

MLCDEF mlc_tensor *mlc_cross_entropy(mlc_tensor *logits, mlc_tensor *target, mlc_reduction reduction, int ignore_index) {
    return mlc__class_loss("mlc_cross_entropy", 1, logits, target, reduction, ignore_index);
}
MLCDEF mlc_tensor *mlc_nll_loss(mlc_tensor *log_probs, mlc_tensor *target, mlc_reduction reduction, int ignore_index) {
    return mlc__class_loss("mlc_nll_loss", 0, log_probs, target, reduction, ignore_index);
}

enum { MLC__MSE, MLC__BCE };

static void mlc__pointwise_loss_backward(mlc__node *n) {
    mlc_tensor *p = n->in[0], *t = n->in[1];
    float *gp = mlc__grad(p), *gt = mlc__grad(t);
    size_t i;
    for (i = 0; i < p->size; i++) {
        float g = mlc__loss_scale(n, i), x = p->data[i], y = t->data[i];
        if (n->iarg[2] == MLC__MSE) {
            if (gp) gp[i] += 2.0f * g * (x - y);
            if (gt) gt[i] -= 2.0f * g * (x - y);
        } else {
            if (gp) gp[i] += g * (mlc__sigmoidf(x) - y);
            if (gt) gt[i] -= g * x;
        }
    }
}

static mlc_tensor *mlc__pointwise_loss(const char *op, int kind, mlc_tensor *p, mlc_tensor *t, mlc_reduction red) {
    float *l;
    mlc_tensor *out;
    mlc__node call;
    size_t i;
    int where;
    MLC__ENTER(op, p, t);
    if (!mlc_same_shape(p, t))
        return (mlc_tensor *)mlc__fail(ctx, MLC_ERR_SHAPE, "%s: input %T and target %T differ in shape", op, p, t);
    if (!(out = mlc__loss_make(ctx, op, red, p->ndim, p->shape))) return NULL;
    mlc__call(&call, op, mlc__pointwise_loss_backward, out, p, t, NULL, NULL);
    call.iarg[0] = (int)red; call.iarg[2] = kind; call.farg[0] = 1.0f / (float)p->size;
    if ((where = mlc__dispatch(ctx, &call)) < 0) return NULL;
    if (where == 1) { mlc__record(&call); return out; }
    l = mlc__floats(ctx, p->size, op);
    if (!l) return NULL;
    for (i = 0; i < p->size; i++) {
        float x = p->data[i], y = t->data[i];
        l[i] = kind == MLC__MSE ? (x - y) * (x - y)
             : (x > 0 ? x : 0.0f) - x * y + (float)log1p(exp(-(double)(x < 0 ? -x : x)));
    }
    mlc__loss_reduce(out, red, l, p->size, p->size);
    mlc__record(&call);
    return out;
}

MLCDEF mlc_tensor *mlc_mse_loss(mlc_tensor *pred, mlc_tensor *target, mlc_reduction reduction) {
    return mlc__pointwise_loss("mlc_mse_loss", MLC__MSE, pred, target, reduction);
}
MLCDEF mlc_tensor *mlc_bce_with_logits(mlc_tensor *logits, mlc_tensor *target, mlc_reduction reduction) {
    return mlc__pointwise_loss("mlc_bce_with_logits", MLC__BCE, logits, target, reduction);
}

/* ============================================================================================
   Shape ops. reshape shares storage; the others copy. Gradients flow back through the same
   index map:  y = x[map(i)]   dx[map(i)] += g[i]
   ============================================================================================ */

static void mlc__accumulate_backward(mlc__node *n) {   /* reshape, copy: dx = g */
    float *gx = mlc__grad(n->in[0]);
    size_t i;
    for (i = 0; i < n->out->size; i++) gx[i] += n->out->grad[i];
}

MLCDEF mlc_tensor *mlc_reshape(mlc_tensor *x, int ndim, const int *shape) {
    int s[MLC_MAX_DIMS] = {0}, d, infer = -1;
    size_t known = 1;
    mlc_tensor *out;
    mlc__node call;
    MLC__ENTER("mlc_reshape", x);
    if (ndim < 0 || ndim > MLC_MAX_DIMS || (ndim && !shape))
        return (mlc_tensor *)mlc__fail(ctx, MLC_ERR_SHAPE, "mlc_reshape: rank %d is outside 0..%d", ndim, MLC_MAX_DIMS);
    for (d = 0; d < ndim; d++) {
        s[d] = shape[d];
        if (s[d] == -1 && infer < 0) infer = d;
        else if (s[d] < 0) return (mlc_tensor *)mlc__fail(ctx, MLC_ERR_SHAPE, "mlc_reshape: bad dimension %d in the new shape of %T", s[d], x);
        else known *= (size_t)s[d];
    }
    if (infer >= 0 && known) s[infer] = (int)(x->size / known);
    if (mlc__numel(ndim, s) != x->size) {
        char want[96] = "[", *w = want + 1;
        for (d = 0; d < ndim && w < want + 80; d++) { mlc__format(w, 12, d ? ", %d" : "%d", shape[d]); w += strlen(w); }
        strcpy(w, "]");
        return (mlc_tensor *)mlc__fail(ctx, MLC_ERR_SHAPE, "mlc_reshape: cannot view %T (%zu elements) as %s", x, x->size, want);
    }
    out = (mlc_tensor *)mlc__arena_alloc(ctx, sizeof(mlc_tensor), "mlc_reshape");
    if (!out) return NULL;
    mlc__view(out, x);                  /* same data, new shape, no gradient of its own */
    out->ndim = ndim;
    memcpy(out->shape, s, (size_t)ndim * sizeof(int));
    out->grad = NULL; out->device_grad = NULL; out->node = NULL; out->requires_grad = 0; out->persistent = 0;
    mlc__call(&call, "mlc_reshape", mlc__accumulate_backward, out, x, NULL, NULL, NULL);
    call.iarg[0] = 1;                   /* a view: the device shares x's buffer too */
    if (mlc__dispatch(ctx, &call) < 0) return NULL;
    out->stale = x->stale & (MLC__HOST_STALE | MLC__DEVICE_STALE);  /* as current as x */
    mlc__record(&call);
    return out;
}

MLCDEF mlc_tensor *mlc_flatten(mlc_tensor *x, int start_axis) {
    int shape[MLC_MAX_DIMS], d;
    if (!x) return NULL;
    if (!mlc__axis(x->ctx, "mlc_flatten", x, &start_axis)) return NULL;
    for (d = 0; d < start_axis; d++) shape[d] = x->shape[d];
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
    out->stale &= ~(unsigned)(MLC__GRAD_HOST_STALE | MLC__GRAD_DEVICE_STALE);
    return out;
}

MLCDEF mlc_tensor *mlc_copy(mlc_tensor *x) {
    mlc_tensor *out;
    mlc__node call;
    int where;
    MLC__ENTER("mlc_copy", x);
    out = mlc__like(x, "mlc_copy");
    if (!out) return NULL;
    mlc__call(&call, "mlc_copy", mlc__accumulate_backward, out, x, NULL, NULL, NULL);
    if ((where = mlc__dispatch(ctx, &call)) < 0) return NULL;
    if (where == 0 && x->size) memcpy(out->data, x->data, x->size * sizeof(float));
    mlc__record(&call);
    return out;
}

/* permute: y[i_0..i_n] = x[i_order^-1...]; walks the output in order, the input by strides. */
static void mlc__permute_walk(const mlc_tensor *x, const int *order, const float *src, float *dst, int backward) {
    size_t xstride[MLC_MAX_DIMS], ostride[MLC_MAX_DIMS], s = 1, i;
    int idx[MLC_MAX_DIMS] = {0}, d, nd = x->ndim;
    for (d = nd - 1; d >= 0; d--) { xstride[d] = s; s *= (size_t)x->shape[d]; }
    for (d = 0; d < nd; d++) ostride[d] = xstride[order[d]];
    for (i = 0; i < x->size; i++) {
        size_t off = 0;
        for (d = 0; d < nd; d++) off += (size_t)idx[d] * ostride[d];
        if (backward) dst[off] += src[i]; else dst[i] = src[off];
        for (d = nd - 1; d >= 0; d--) { if (++idx[d] < x->shape[order[d]]) break; idx[d] = 0; }
    }
}

static void mlc__permute_backward(mlc__node *n) {
    mlc__permute_walk(n->in[0], n->iarg, n->out->grad, mlc__grad(n->in[0]), 1);
}

MLCDEF mlc_tensor *mlc_permute(mlc_tensor *x, const int *order) {
    int shape[MLC_MAX_DIMS], seen[MLC_MAX_DIMS] = {0}, ord[MLC_MAX_DIMS], d, where;
    mlc_tensor *out;
    mlc__node call;
    MLC__ENTER("mlc_permute", x);
    if (!order) return (mlc_tensor *)mlc__fail(ctx, MLC_ERR_NULL, "mlc_permute: order is NULL");
    for (d = 0; d < x->ndim; d++) {
        ord[d] = order[d] < 0 ? order[d] + x->ndim : order[d];
        if (ord[d] < 0 || ord[d] >= x->ndim || seen[ord[d]]++)
            return (mlc_tensor *)mlc__fail(ctx, MLC_ERR_INDEX, "mlc_permute: order is not a permutation of the %d axes of %T", x->ndim, x);
        shape[d] = x->shape[ord[d]];
    }
    out = mlc__make(ctx, "mlc_permute", x->ndim, shape, 0);
    if (!out) return NULL;
    mlc__call(&call, "mlc_permute", mlc__permute_backward, out, x, NULL, NULL, NULL);
    memcpy(call.iarg, ord, sizeof(int) * (size_t)x->ndim);
    if ((where = mlc__dispatch(ctx, &call)) < 0) return NULL;
    if (where == 0) mlc__permute_walk(x, ord, x->data, out->data, 0);
    mlc__record(&call);
    return out;
}

MLCDEF mlc_tensor *mlc_transpose(mlc_tensor *x, int axis0, int axis1) {
    int order[MLC_MAX_DIMS], d;
    MLC__ENTER("mlc_transpose", x);
    if (!mlc__axis(ctx, "mlc_transpose", x, &axis0) || !mlc__axis(ctx, "mlc_transpose", x, &axis1)) return NULL;
    for (d = 0; d < x->ndim; d++) order[d] = d;
    order[axis0] = axis1; order[axis1] = axis0;
    return mlc_permute(x, order);
}

/* slice along an axis: y = x[..., start:end, ...], Python's clamping of start and end */
static void mlc__slice_backward(mlc__node *n) {
    mlc_tensor *x = n->in[0];
    float *gx = mlc__grad(x);
    size_t outer, inner, o;
    int len, start = n->iarg[0], count = n->iarg[1];
    mlc__split(x, n->iarg[2], &outer, &len, &inner);
    for (o = 0; o < outer; o++) {
        const float *g = n->out->grad + o * count * inner;
        float *d = gx + (o * len + start) * inner;
        size_t k;
        for (k = 0; k < (size_t)count * inner; k++) d[k] += g[k];
    }
}

MLCDEF mlc_tensor *mlc_slice(mlc_tensor *x, int axis, int start, int end) {
    int shape[MLC_MAX_DIMS], len, count, where;
    size_t outer, inner, o;
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
    mlc__call(&call, "mlc_slice", mlc__slice_backward, out, x, NULL, NULL, NULL);
    call.iarg[0] = start; call.iarg[1] = count; call.iarg[2] = axis;
    if ((where = mlc__dispatch(ctx, &call)) < 0) return NULL;
    for (o = 0; where == 0 && o < outer; o++)
        memcpy(out->data + o * count * inner, x->data + (o * len + start) * inner, (size_t)count * inner * sizeof(float));
    mlc__record(&call);
    return out;
}

/* concat along an axis; each input's gradient is its slab of g */
static void mlc__concat_backward(mlc__node *n) {
    mlc_tensor **xs = (mlc_tensor **)n->saved;
    int count = n->iarg[0], axis = n->iarg[1], total = n->out->shape[axis], k, offset = 0;
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

MLCDEF mlc_tensor *mlc_concat(mlc_tensor *const *xs, int count, int axis) {
    int shape[MLC_MAX_DIMS], k, d, total = 0, offset = 0, where;
    mlc_ctx *ctx;
    mlc_tensor *out, **saved, *needs_grad = NULL;
    mlc__node call;
    size_t outer, inner, o;
    if (!xs || count < 1 || !(ctx = mlc__enter("mlc_concat", count, xs))) return NULL;
    if (!mlc__axis(ctx, "mlc_concat", xs[0], &axis)) return NULL;
    for (k = 0; k < count; k++) {
        for (d = 0; d < xs[0]->ndim; d++)
            if (xs[k]->ndim != xs[0]->ndim || (d != axis && xs[k]->shape[d] != xs[0]->shape[d]))
                return (mlc_tensor *)mlc__fail(ctx, MLC_ERR_SHAPE, "mlc_concat: input %d %T does not fit input 0 %T along axis %d", k, xs[k], xs[0], axis);
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
    mlc__call(&call, "mlc_concat", mlc__concat_backward, out, needs_grad ? needs_grad : xs[0], NULL, NULL, NULL);
    call.saved = saved; call.iarg[0] = count; call.iarg[1] = axis;
    if ((where = mlc__dispatch(ctx, &call)) < 0) return NULL;
    for (k = 0; where == 0 && k < count; k++) {
        int len;
        const float *src = mlc__host(xs[k]);
        mlc__split(xs[k], axis, &outer, &len, &inner);
        for (o = 0; o < outer; o++)
            memcpy(out->data + (o * total + offset) * inner, src + o * len * inner, (size_t)len * inner * sizeof(float));
        offset += len;
    }
    mlc__record(&call);
    return out;
}

/* ============================================================================================
   Indexing ops. Indices are float tensors holding whole numbers (checked).
     index_select  y[.., l, ..] = x[.., idx[l], ..]        dx[.., idx[l], ..] += g[.., l, ..]
     gather        y[i] = x[i with axis coordinate idx[i]] dx[same] += g[i]
     embedding     y[..., :] = W[idx[...], :]             (index_select on axis 0)
   ============================================================================================ */

static void mlc__index_select_backward(mlc__node *n) {
    mlc_tensor *x = n->in[0], *idx = n->in[1];
    float *gx = mlc__grad(x);
    size_t outer, inner, o, k;
    int len, l, L = (int)idx->size;
    mlc__split(x, n->iarg[0], &outer, &len, &inner);
    for (o = 0; o < outer; o++)
        for (l = 0; l < L; l++) {
            float *d = gx + (o * len + (size_t)idx->data[l]) * inner;
            const float *g = n->out->grad + (o * L + l) * inner;
            for (k = 0; k < inner; k++) d[k] += g[k];
        }
}

MLCDEF mlc_tensor *mlc_index_select(mlc_tensor *x, int axis, mlc_tensor *index) {
    int shape[MLC_MAX_DIMS], len, l, L, where;
    size_t outer, inner, o;
    const float *idx;
    mlc_tensor *out;
    mlc__node call;
    MLC__ENTER("mlc_index_select", x, index);
    if (!mlc__axis(ctx, "mlc_index_select", x, &axis)) return NULL;
    if (index->ndim != 1)
        return (mlc_tensor *)mlc__fail(ctx, MLC_ERR_SHAPE, "mlc_index_select: index must be 1-D, got %T", index);
    mlc__split(x, axis, &outer, &len, &inner);
    L = index->shape[0];
    idx = mlc__host(index);                              /* indices are checked on the host */
    for (l = 0; l < L; l++) if (mlc__index(ctx, "mlc_index_select", idx[l], len, (size_t)l) < 0) return NULL;
    memcpy(shape, x->shape, sizeof shape);
    shape[axis] = L;
    out = mlc__make(ctx, "mlc_index_select", x->ndim, shape, 0);
    if (!out) return NULL;
    mlc__call(&call, "mlc_index_select", mlc__index_select_backward, out, x, index, NULL, NULL);  /* index gets no gradient */
    call.iarg[0] = axis;
    if ((where = mlc__dispatch(ctx, &call)) < 0) return NULL;
    for (o = 0; where == 0 && o < outer; o++)
        for (l = 0; l < L; l++)
            memcpy(out->data + (o * L + l) * inner, x->data + (o * len + (size_t)idx[l]) * inner, inner * sizeof(float));
    mlc__record(&call);
    return out;
}

/* Offset into x of every element of index (gather's map), into an arena array. */
static size_t *mlc__gather_map(mlc_ctx *ctx, const mlc_tensor *x, int axis, const mlc_tensor *index) {
    size_t *map = (size_t *)mlc__arena_alloc(ctx, index->size * sizeof(size_t) + 1, "mlc_gather"), xs[MLC_MAX_DIMS], s = 1, i;
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

MLCDEF mlc_tensor *mlc_gather(mlc_tensor *x, int axis, mlc_tensor *index) {
    mlc_tensor *out;
    mlc__node call;
    size_t *map, i;
    int d, where;
    MLC__ENTER("mlc_gather", x, index);
    if (!mlc__axis(ctx, "mlc_gather", x, &axis)) return NULL;
    if (index->ndim != x->ndim)
        return (mlc_tensor *)mlc__fail(ctx, MLC_ERR_SHAPE, "mlc_gather: index %T must have the rank of x %T", index, x);
    for (d = 0; d < x->ndim; d++)
        if (d != axis && index->shape[d] > x->shape[d])
            return (mlc_tensor *)mlc__fail(ctx, MLC_ERR_SHAPE, "mlc_gather: index %T is larger than x %T on axis %d", index, x, d);
    if (!(map = mlc__gather_map(ctx, x, axis, index))) return NULL;
    out = mlc__like(index, "mlc_gather");
    if (!out) return NULL;
    mlc__call(&call, "mlc_gather", mlc__gather_backward, out, x, NULL, NULL, NULL);
    call.saved = map;                   /* the offsets into x, one per output element */
    if ((where = mlc__dispatch(ctx, &call)) < 0) return NULL;
    for (i = 0; where == 0 && i < index->size; i++) out->data[i] = x->data[map[i]];
    mlc__record(&call);
    return out;
}

MLCDEF mlc_tensor *mlc_embedding(mlc_tensor *weight, mlc_tensor *index) {
    int shape[MLC_MAX_DIMS], d;
    MLC__ENTER("mlc_embedding", weight, index);
    if (weight->ndim != 2 || index->ndim + 1 > MLC_MAX_DIMS)
        return (mlc_tensor *)mlc__fail(ctx, MLC_ERR_SHAPE, "mlc_embedding: weight %T must be [count, dim] and index %T of rank < %d", weight, index, MLC_MAX_DIMS);
    for (d = 0; d < index->ndim; d++) shape[d] = index->shape[d];
    shape[index->ndim] = weight->shape[1];
    for (d = 0; d < (int)index->size; d++)       /* checked here, so the error names this op */
        if (mlc__index(ctx, "mlc_embedding", mlc__host(index)[d], weight->shape[0], (size_t)d) < 0) return NULL;
    d = (int)index->size;
    return mlc_reshape(mlc_index_select(weight, 0, mlc_reshape(index, 1, &d)), index->ndim + 1, shape);
}

/* ============================================================================================
   Dropout and normalisation
     dropout     y = x m / (1 - p), m ~ Bernoulli(1 - p)      dx = g m / (1 - p)
     layer_norm  over the last axis (D values):  x̂ = (x - μ) r,  r = 1/√(σ² + eps),  y = x̂ w + b
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

MLCDEF mlc_tensor *mlc_dropout(mlc_tensor *x, float p, int training) {
    mlc_tensor *out;
    mlc__node call;
    float *mask, scale;
    size_t i;
    int where;
    MLC__ENTER("mlc_dropout", x);
    if (!(p >= 0.0f && p <= 1.0f)) return (mlc_tensor *)mlc__fail(ctx, MLC_ERR_ARG, "mlc_dropout: p = %g is outside [0, 1]", p);
    if (!training || p == 0.0f) return x;
    out = mlc__like(x, "mlc_dropout");
    if (!out) return NULL;
    mlc__call(&call, "mlc_dropout", mlc__dropout_backward, out, x, NULL, NULL, NULL);
    call.farg[0] = p;
    call.iarg[0] = (int)(mlc_rand_u32(ctx) >> 1);      /* a device draws its mask from this seed */
    if ((where = mlc__dispatch(ctx, &call)) < 0) return NULL;
    if (where == 0) {
        if (!(mask = mlc__floats(ctx, x->size, "mlc_dropout"))) return NULL;
        scale = p < 1.0f ? 1.0f / (1.0f - p) : 0.0f;
        for (i = 0; i < x->size; i++) {
            mask[i] = mlc_rand_uniform(ctx) >= p ? scale : 0.0f;
            out->data[i] = x->data[i] * mask[i];
        }
        call.saved = mask;
    }
    mlc__record(&call);
    return out;
}

static void mlc__layer_norm_backward(mlc__node *n) {
    mlc_tensor *x = n->in[0], *w = n->in[1], *b = n->in[2];
    float *gx = mlc__grad(x), *gw = mlc__grad(w), *gb = mlc__grad(b);
    const float *stats = (const float *)n->saved, *g = n->out->grad;
    int D = x->shape[x->ndim - 1], j;
    size_t rows = D ? x->size / (size_t)D : 0, r;
    for (r = 0; r < rows; r++) {
        const float *xr = x->data + r * D, *gr = g + r * D;
        float mu = stats[2 * r], rs = stats[2 * r + 1];
        double mean_gh = 0.0, mean_ghx = 0.0;
        for (j = 0; j < D; j++) {
            float xh = (xr[j] - mu) * rs, gh = gr[j] * (w ? w->data[j] : 1.0f);
            mean_gh += gh; mean_ghx += gh * xh;
            if (gw) gw[j] += gr[j] * xh;
            if (gb) gb[j] += gr[j];
        }
        mean_gh /= D; mean_ghx /= D;
        if (gx)
            for (j = 0; j < D; j++) {
                float xh = (xr[j] - mu) * rs, gh = gr[j] * (w ? w->data[j] : 1.0f);
                gx[r * D + j] += rs * (gh - (float)mean_gh - xh * (float)mean_ghx);
            }
    }
}

MLCDEF mlc_tensor *mlc_layer_norm(mlc_tensor *x, mlc_tensor *weight, mlc_tensor *bias, float eps) {
    mlc_tensor *out;
    mlc__node call;
    float *stats;
    int D, j, where;
    size_t rows, r;
    MLC__ENTER("mlc_layer_norm", x);
    if (!mlc__same_device(ctx, "mlc_layer_norm", x, weight) || !mlc__same_device(ctx, "mlc_layer_norm", x, bias)) return NULL;
    if (x->ndim < 1) return (mlc_tensor *)mlc__fail(ctx, MLC_ERR_SHAPE, "mlc_layer_norm: x %T has no axis to normalise", x);
    D = x->shape[x->ndim - 1];
    if ((weight && (weight->ndim != 1 || weight->shape[0] != D)) || (bias && (bias->ndim != 1 || bias->shape[0] != D)))
        return (mlc_tensor *)mlc__fail(ctx, MLC_ERR_SHAPE, "mlc_layer_norm: weight %T and bias %T must be [%d] for x %T", weight, bias, D, x);
    eps = mlc__setting(eps, 1e-5f);
    if (!mlc__in_range(ctx, "mlc_layer_norm", "eps", eps, 0.0f, FLT_MAX, 0)) return NULL;
    out = mlc__like(x, "mlc_layer_norm");
    if (!out) return NULL;
    mlc__call(&call, "mlc_layer_norm", mlc__layer_norm_backward, out, x, weight, bias, NULL);
    call.farg[0] = eps;
    if ((where = mlc__dispatch(ctx, &call)) < 0) return NULL;
    if (where == 1) { mlc__record(&call); return out; }
    rows = D ? x->size / (size_t)D : 0;
    if (!(stats = mlc__floats(ctx, 2 * rows + 1, "mlc_layer_norm"))) return NULL;
    for (r = 0; r < rows; r++) {
        const float *xr = x->data + r * D;
        double s = 0.0, v = 0.0, mu;
        for (j = 0; j < D; j++) s += xr[j];
        mu = s / D;
        for (j = 0; j < D; j++) v += (xr[j] - mu) * (xr[j] - mu);
        stats[2 * r] = (float)mu;
        stats[2 * r + 1] = (float)(1.0 / sqrt(v / D + eps));
        for (j = 0; j < D; j++)
            out->data[r * D + j] = (xr[j] - stats[2 * r]) * stats[2 * r + 1] * (weight ? weight->data[j] : 1.0f) + (bias ? bias->data[j] : 0.0f);
    }
    call.saved = stats;
    mlc__record(&call);
    return out;
}

static void mlc__batch_norm_backward(mlc__node *n) {
    mlc_tensor *x = n->in[0], *w = n->in[1], *b = n->in[2];
    float *gx = mlc__grad(x), *gw = mlc__grad(w), *gb = mlc__grad(b);
    const float *stats = (const float *)n->saved, *g = n->out->grad;
    int N = x->shape[0], C = x->shape[1], c, i, training = n->iarg[0];
    size_t inner = mlc__numel(x->ndim - 2, x->shape + 2), k, M = (size_t)N * inner;
    for (c = 0; c < C; c++) {
        float mu = stats[2 * c], rs = stats[2 * c + 1], wc = w ? w->data[c] : 1.0f;
        double sum_g = 0.0, sum_gx = 0.0;
        for (i = 0; i < N; i++)
            for (k = 0; k < inner; k++) {
                size_t at = ((size_t)i * C + c) * inner + k;
                float xh = (x->data[at] - mu) * rs;
                sum_g += g[at]; sum_gx += g[at] * xh;
            }
        if (gw) gw[c] += (float)sum_gx;
        if (gb) gb[c] += (float)sum_g;
        if (!gx) continue;
        for (i = 0; i < N; i++)
            for (k = 0; k < inner; k++) {
                size_t at = ((size_t)i * C + c) * inner + k;
                float xh = (x->data[at] - mu) * rs;
                gx[at] += training ? wc * rs * (g[at] - (float)(sum_g / M) - xh * (float)(sum_gx / M))
                                   : wc * rs * g[at];
            }
    }
}

MLCDEF mlc_tensor *mlc_batch_norm(mlc_tensor *x, mlc_tensor *running_mean, mlc_tensor *running_var,
                                  mlc_tensor *weight, mlc_tensor *bias, int training, float momentum, float eps) {
    mlc_tensor *out, *params[4];
    mlc__node call;
    float *stats;
    int N, C, c, i, p, where;
    size_t inner, k, M;
    MLC__ENTER("mlc_batch_norm", x);
    if (x->ndim < 2) return (mlc_tensor *)mlc__fail(ctx, MLC_ERR_SHAPE, "mlc_batch_norm: x %T needs the shape [N, C, ...]", x);
    N = x->shape[0]; C = x->shape[1];
    params[0] = running_mean; params[1] = running_var; params[2] = weight; params[3] = bias;
    for (p = 0; p < 4; p++)
        if (params[p] && (params[p]->ndim != 1 || params[p]->shape[0] != C))
            return (mlc_tensor *)mlc__fail(ctx, MLC_ERR_SHAPE, "mlc_batch_norm: parameter %T does not match the %d channels of x %T", params[p], C, x);
    for (p = 0; p < 4; p++) if (!mlc__same_device(ctx, "mlc_batch_norm", x, params[p])) return NULL;
    inner = mlc__numel(x->ndim - 2, x->shape + 2);
    M = (size_t)N * inner;
    if (!training && (!running_mean || !running_var))
        return (mlc_tensor *)mlc__fail(ctx, MLC_ERR_ARG, "mlc_batch_norm: eval mode needs running_mean and running_var");
    if (training && M < 2)
        return (mlc_tensor *)mlc__fail(ctx, MLC_ERR_SHAPE, "mlc_batch_norm: training needs more than one value per channel, x is %T", x);
    eps = mlc__setting(eps, 1e-5f); momentum = mlc__setting(momentum, 0.1f);
    if (!mlc__in_range(ctx, "mlc_batch_norm", "eps", eps, 0.0f, FLT_MAX, 0) ||
        !mlc__in_range(ctx, "mlc_batch_norm", "momentum", momentum, 0.0f, 1.0f, 0)) return NULL;
    out = mlc__like(x, "mlc_batch_norm");
    if (!out) return NULL;
    mlc__call(&call, "mlc_batch_norm", mlc__batch_norm_backward, out, x, weight, bias, running_mean);
    call.in[4] = running_var; call.n_in = 5;   /* the running statistics are updated in place */
    call.iarg[0] = training != 0; call.farg[0] = momentum; call.farg[1] = eps;
    if ((where = mlc__dispatch(ctx, &call)) < 0) return NULL;
    if (where == 1) {
        if (training && running_mean) running_mean->stale = MLC__HOST_STALE;
        if (training && running_var) running_var->stale = MLC__HOST_STALE;
        mlc__record(&call);
        return out;
    }
    if (training && running_mean) mlc__host_wrote(running_mean);
    if (training && running_var) mlc__host_wrote(running_var);
    if (!(stats = mlc__floats(ctx, 2 * (size_t)C, "mlc_batch_norm"))) return NULL;
    for (c = 0; c < C; c++) {
        double mu, var;
        if (training) {
            double s = 0.0, v = 0.0;
            for (i = 0; i < N; i++) for (k = 0; k < inner; k++) s += x->data[((size_t)i * C + c) * inner + k];
            mu = s / M;
            for (i = 0; i < N; i++)
                for (k = 0; k < inner; k++) { double d = x->data[((size_t)i * C + c) * inner + k] - mu; v += d * d; }
            var = v / M;
            if (running_mean) running_mean->data[c] = (1.0f - momentum) * running_mean->data[c] + momentum * (float)mu;
            if (running_var) running_var->data[c] = (1.0f - momentum) * running_var->data[c] + momentum * (float)(v / (M - 1));
        } else { mu = running_mean->data[c]; var = running_var->data[c]; }
        stats[2 * c] = (float)mu;
        stats[2 * c + 1] = (float)(1.0 / sqrt(var + eps));
        for (i = 0; i < N; i++)
            for (k = 0; k < inner; k++) {
                size_t at = ((size_t)i * C + c) * inner + k;
                out->data[at] = (x->data[at] - stats[2 * c]) * stats[2 * c + 1] * (weight ? weight->data[c] : 1.0f) + (bias ? bias->data[c] : 0.0f);
            }
    }
    call.saved = stats;
    mlc__record(&call);
    return out;
}

/* ============================================================================================
   Convolution and pooling, x [N, C, H, W]
     conv2d   y[n, o] = b[o] + Σ_{c in o's group, i, j} w[o, c, i, j] x[n, c, s·h + d·i - p, s·w + d·j - p]
              computed per image and group as W_g [Og, Cg·KH·KW] @ col [Cg·KH·KW, OH·OW]
              (im2col), so  dW_g += dY_g colᵀ,  dcol = W_gᵀ dY_g  then col2im into dx,  db = Σ dY
     max_pool y = max of the window               dx = g at the window's (first) argmax
     avg_pool y = Σ window / K²  (padding counts)  dx = g / K² over the window
   ============================================================================================ */

typedef struct mlc__conv { int N, C, H, W, O, KH, KW, OH, OW, stride, pad, dil, groups; } mlc__conv;

/* The output columns ow whose input column ow·s + off falls inside [0, W): [*first, *last). */
static void mlc__conv_span(const mlc__conv *cv, int off, int *first, int *last) {
    int s = cv->stride;
    *first = off < 0 ? (-off + s - 1) / s : 0;
    *last = cv->W - off > 0 ? (cv->W - off + s - 1) / s : 0;
    if (*last > cv->OW) *last = cv->OW;
    if (*first > *last) *first = *last;
}

/* col[(c·KH + i)·KW + j, oh·OW + ow] = x[c, oh·s + i·d - p, ow·s + j·d - p] (0 outside), for the
   channels [c0, c1): each row of col is zeros, a (strided) run of an input row, zeros */
static void mlc__im2col(const mlc__conv *cv, int c0, int c1, const float *x, float *col) {
    int c, i, j, oh, ow, first, last, s = cv->stride, P = cv->OH * cv->OW;
    for (c = c0; c < c1; c++)
        for (i = 0; i < cv->KH; i++)
            for (j = 0; j < cv->KW; j++) {
                int off = j * cv->dil - cv->pad;
                float *row = col + ((size_t)(c * cv->KH + i) * cv->KW + j) * P;
                mlc__conv_span(cv, off, &first, &last);
                for (oh = 0; oh < cv->OH; oh++) {
                    int ih = oh * s + i * cv->dil - cv->pad;
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

static void mlc__im2col_channels(void *arg, int piece, size_t begin, size_t end) {
    const mlc__im2col_job *job = (const mlc__im2col_job *)arg;
    (void)piece;
    mlc__im2col(job->cv, (int)begin, (int)end, job->x, job->col);
}

static void mlc__im2col_threads(const mlc__conv *cv, int channels, const float *x, float *col) {
    mlc__im2col_job job;
    size_t per_channel = (size_t)cv->KH * cv->KW * cv->OH * cv->OW;
    job.cv = cv; job.x = x; job.col = col;
    mlc__parallel((size_t)channels, MLC__IM2COL_PARALLEL / per_channel + 1, mlc__im2col_channels, &job);
}

/* dx[c, ih, iw] += every value of col that im2col took from there */
static void mlc__col2im(const mlc__conv *cv, int channels, const float *col, float *dx) {
    int c, i, j, oh, ow, first, last, s = cv->stride, P = cv->OH * cv->OW;
    for (c = 0; c < channels; c++)
        for (i = 0; i < cv->KH; i++)
            for (j = 0; j < cv->KW; j++) {
                int off = j * cv->dil - cv->pad;
                const float *row = col + ((size_t)(c * cv->KH + i) * cv->KW + j) * P;
                mlc__conv_span(cv, off, &first, &last);
                for (oh = 0; oh < cv->OH; oh++) {
                    int ih = oh * s + i * cv->dil - cv->pad;
                    const float *r = row + (size_t)oh * cv->OW;
                    float *d;
                    if (ih < 0 || ih >= cv->H) continue;
                    d = dx + ((size_t)c * cv->H + ih) * cv->W;
                    for (ow = first; ow < last; ow++) d[ow * s + off] += r[ow];
                }
            }
}

/* The images are shared out between threads: each piece of images has scratch of its own (col,
   packing space, and backward its partial dW and db, summed at the end) and runs its products
   on its thread. With one image, or products through a hook or BLAS (one at a time), the
   images go in turn and each product may use the threads itself. */
typedef struct mlc__conv_job {
    mlc_ctx *ctx;
    const mlc__conv *cv;
    size_t parallel_from;               /* mlc__parallel's: 2 images, or never */
    int pieces;
    const float *x, *w, *bias, *dy;     /* forward: y from x, w, bias; backward: gx, gw, gb from dy */
    float *y, *gx, *gw, *gb;
    float *scratch;                     /* per piece: col, packing space, partial dW and db */
    size_t col_floats, work_floats, piece_floats;
} mlc__conv_job;

/* Plan the job: how many pieces, and their scratch (with_grads: room for partial dW and db). */
static int mlc__conv_plan(mlc__conv_job *job, mlc_ctx *ctx, const mlc__conv *cv, int with_grads, const char *op) {
    int Cg = cv->C / cv->groups, Og = cv->O / cv->groups, P = cv->OH * cv->OW, rows = Cg * cv->KH * cv->KW;
    size_t w1 = mlc__gemm_work(Og, P, rows), w2 = mlc__gemm_work(Og, rows, P), w3 = mlc__gemm_work(rows, P, Og);
    memset(job, 0, sizeof *job);
    job->ctx = ctx; job->cv = cv;
    job->parallel_from = mlc__gemm_threadable(ctx) ? 2 : (size_t)-1;
    job->pieces = mlc__pieces((size_t)cv->N, job->parallel_from);
    job->col_floats = ((size_t)rows * P + 15) / 16 * 16;
    job->work_floats = job->pieces > 1 ? (w1 > w2 ? (w1 > w3 ? w1 : w3) : (w2 > w3 ? w2 : w3)) : 0;
    job->piece_floats = job->col_floats + job->work_floats + (with_grads && job->pieces > 1 ? (size_t)cv->O * rows + cv->O : 0);
    job->scratch = mlc__floats(ctx, (size_t)job->pieces * job->piece_floats, op);
    return job->scratch != NULL;
}

/* forward over images [begin, end): y_g = W_g col + b (y starts as the bias, the product adds to it) */
static void mlc__conv2d_images(void *arg, int piece, size_t begin, size_t end) {
    const mlc__conv_job *job = (const mlc__conv_job *)arg;
    const mlc__conv *cv = job->cv;
    int Cg = cv->C / cv->groups, Og = cv->O / cv->groups, P = cv->OH * cv->OW, rows = Cg * cv->KH * cv->KW, g, o, q;
    float *col = job->scratch + (size_t)piece * job->piece_floats, *work = job->work_floats ? col + job->col_floats : NULL;
    size_t i;
    for (i = begin; i < end; i++)
        for (g = 0; g < cv->groups; g++) {
            float *y = job->y + (i * cv->O + (size_t)g * Og) * P;
            for (o = 0; job->bias && o < Og; o++) {
                const float b = job->bias[g * Og + o];
                float *row = y + (size_t)o * P;
                MLC__OMP(omp simd)
                for (q = 0; q < P; q++) row[q] = b;
            }
            mlc__im2col_threads(cv, Cg, job->x + (i * cv->C + (size_t)g * Cg) * cv->H * cv->W, col);
            mlc__gemm(job->ctx, 0, 0, Og, P, rows, job->w + (size_t)g * Og * rows, col, job->bias ? 1.0f : 0.0f, y, work);
        }
}

/* backward over images [begin, end); dW and db go to the piece's partial sums when there are
   several pieces */
static void mlc__conv2d_backward_images(void *arg, int piece, size_t begin, size_t end) {
    const mlc__conv_job *job = (const mlc__conv_job *)arg;
    const mlc__conv *cv = job->cv;
    int Cg = cv->C / cv->groups, Og = cv->O / cv->groups, P = cv->OH * cv->OW, rows = Cg * cv->KH * cv->KW, g, o, q;
    float *col = job->scratch + (size_t)piece * job->piece_floats, *work = job->work_floats ? col + job->col_floats : NULL;
    float *gw = job->pieces > 1 ? work + job->work_floats : job->gw, *gb = job->pieces > 1 ? gw + (size_t)cv->O * rows : job->gb;
    size_t i;
    if (job->pieces > 1) memset(gw, 0, ((size_t)cv->O * rows + cv->O) * sizeof(float));
    for (i = begin; i < end; i++)
        for (g = 0; g < cv->groups; g++) {
            const float *dy = job->dy + (i * cv->O + (size_t)g * Og) * P;
            if (job->gw) {
                mlc__im2col_threads(cv, Cg, job->x + (i * cv->C + (size_t)g * Cg) * cv->H * cv->W, col);
                mlc__gemm(job->ctx, 0, 1, Og, rows, P, dy, col, 1.0f, gw + (size_t)g * Og * rows, work);
            }
            if (job->gx) {
                mlc__gemm(job->ctx, 1, 0, rows, P, Og, job->w + (size_t)g * Og * rows, dy, 0.0f, col, work);
                mlc__col2im(cv, Cg, col, job->gx + (i * cv->C + (size_t)g * Cg) * cv->H * cv->W);
            }
            for (o = 0; job->gb && o < Og; o++) {
                float sum = 0.0f;
                MLC__OMP(omp simd reduction(+:sum))
                for (q = 0; q < P; q++) sum += dy[(size_t)o * P + q];
                gb[g * Og + o] += sum;
            }
        }
}

static void mlc__conv2d_backward(mlc__node *n) {
    const mlc__conv *cv = (const mlc__conv *)n->saved;
    mlc_tensor *x = n->in[0], *w = n->in[1];
    int rows = cv->C / cv->groups * cv->KH * cv->KW, p;
    mlc__conv_job job;
    if (!mlc__conv_plan(&job, x->ctx, cv, 1, "mlc_conv2d backward")) return;
    job.x = x->data; job.w = w->data; job.dy = n->out->grad;
    job.gx = mlc__grad(x); job.gw = mlc__grad(w); job.gb = mlc__grad(n->in[2]);
    mlc__parallel((size_t)cv->N, job.parallel_from, mlc__conv2d_backward_images, &job);
    for (p = 0; job.pieces > 1 && p < job.pieces; p++) {     /* the pieces' partial sums */
        const float *part = job.scratch + (size_t)p * job.piece_floats + job.col_floats + job.work_floats;
        if (job.gw) mlc__axpy((size_t)cv->O * rows, 1.0f, part, job.gw);
        if (job.gb) mlc__axpy((size_t)cv->O, 1.0f, part + (size_t)cv->O * rows, job.gb);
    }
}

/* A window of KH x KW with padding and dilation over an H x W input: every size it leads to fits
   in int (else MLC_ERR_ARG), and the window is not empty (else MLC_ERR_SHAPE: it would divide by 0). */
static int mlc__window_fits(mlc_ctx *ctx, const char *op, int H, int W, int KH, int KW, int pad, int dil) {
    const long long most = 2147483647;
    if (KH < 1 || KW < 1) {
        mlc__fail(ctx, MLC_ERR_SHAPE, "%s: the kernel %d x %d has a zero dimension", op, KH, KW);
        return 0;
    }
    if (pad < 0 || dil < 1 || (long long)H + 2LL * pad > most || (long long)W + 2LL * pad > most ||
        (long long)dil * (KH - 1) + 1 > most || (long long)dil * (KW - 1) + 1 > most) {
        mlc__fail(ctx, MLC_ERR_ARG, "%s: padding %d or dilation %d is too large for an int", op, pad, dil);
        return 0;
    }
    return 1;
}

MLCDEF mlc_tensor *mlc_conv2d(mlc_tensor *x, mlc_tensor *weight, mlc_tensor *bias, mlc_conv_opts opts) {
    mlc__conv cv;
    mlc_tensor *out;
    mlc__node call;
    mlc__conv_job job;
    int shape[4], where;
    MLC__ENTER("mlc_conv2d", x, weight);
    if (!mlc__same_device(ctx, "mlc_conv2d", x, bias)) return NULL;
    cv.stride = opts.stride ? opts.stride : 1; cv.pad = opts.padding;
    cv.dil = opts.dilation ? opts.dilation : 1; cv.groups = opts.groups ? opts.groups : 1;
    if (cv.stride < 1 || cv.pad < 0 || cv.dil < 1 || cv.groups < 1)
        return (mlc_tensor *)mlc__fail(ctx, MLC_ERR_ARG, "mlc_conv2d: stride %d, padding %d, dilation %d, groups %d are not valid",
                                       opts.stride, opts.padding, opts.dilation, opts.groups);
    if (x->ndim != 4 || weight->ndim != 4)
        return (mlc_tensor *)mlc__fail(ctx, MLC_ERR_SHAPE, "mlc_conv2d: x %T must be [N, C, H, W] and weight %T [O, C/groups, KH, KW]", x, weight);
    cv.N = x->shape[0]; cv.C = x->shape[1]; cv.H = x->shape[2]; cv.W = x->shape[3];
    cv.O = weight->shape[0]; cv.KH = weight->shape[2]; cv.KW = weight->shape[3];
    if (cv.C % cv.groups || cv.O % cv.groups || weight->shape[1] * cv.groups != cv.C)
        return (mlc_tensor *)mlc__fail(ctx, MLC_ERR_SHAPE, "mlc_conv2d: x %T and weight %T do not fit groups = %d", x, weight, cv.groups);
    if (bias && (bias->ndim != 1 || bias->shape[0] != cv.O))
        return (mlc_tensor *)mlc__fail(ctx, MLC_ERR_SHAPE, "mlc_conv2d: bias %T must be [%d]", bias, cv.O);
    if (!mlc__window_fits(ctx, "mlc_conv2d", cv.H, cv.W, cv.KH, cv.KW, cv.pad, cv.dil)) return NULL;
    cv.OH = (cv.H + 2 * cv.pad - cv.dil * (cv.KH - 1) - 1) / cv.stride + 1;
    cv.OW = (cv.W + 2 * cv.pad - cv.dil * (cv.KW - 1) - 1) / cv.stride + 1;
    if (cv.H + 2 * cv.pad < cv.dil * (cv.KH - 1) + 1 || cv.W + 2 * cv.pad < cv.dil * (cv.KW - 1) + 1)
        return (mlc_tensor *)mlc__fail(ctx, MLC_ERR_SHAPE, "mlc_conv2d: kernel %T is larger than the padded input %T", weight, x);
    shape[0] = cv.N; shape[1] = cv.O; shape[2] = cv.OH; shape[3] = cv.OW;
    out = mlc__make(ctx, "mlc_conv2d", 4, shape, 0);
    if (!out) return NULL;
    mlc__call(&call, "mlc_conv2d", mlc__conv2d_backward, out, x, weight, bias, NULL);
    if (!(call.saved = mlc__arena_alloc(ctx, sizeof cv, "mlc_conv2d"))) return NULL;
    memcpy(call.saved, &cv, sizeof cv);
    if ((where = mlc__dispatch(ctx, &call)) < 0) return NULL;
    if (where == 1) { mlc__record(&call); return out; }
    if (!mlc__conv_plan(&job, ctx, &cv, 0, "mlc_conv2d")) return NULL;
    job.x = x->data; job.w = weight->data; job.bias = bias ? bias->data : NULL; job.y = out->data;
    mlc__parallel((size_t)cv.N, job.parallel_from, mlc__conv2d_images, &job);
    mlc__record(&call);
    return out;
}

/* The window of output (oh, ow) clipped to the input: rows [*h0, *h1), columns [*w0, *w1). */
static void mlc__pool_window(int oh, int ow, int K, int S, int Pd, int H, int W, int *h0, int *h1, int *w0, int *w1) {
    *h0 = oh * S - Pd; *h1 = *h0 + K; *w0 = ow * S - Pd; *w1 = *w0 + K;
    if (*h0 < 0) *h0 = 0;
    if (*h1 > H) *h1 = H;
    if (*w0 < 0) *w0 = 0;
    if (*w1 > W) *w1 = W;
}

/* The planes (image, channel) are shared out between threads, forward and backward. */
typedef struct mlc__pool_job { mlc_tensor *x, *y; float *gx; int K, S, Pd, is_max, *argmax; } mlc__pool_job;

/* Max pooling along an output row, over the outputs [lo, hi) whose windows lie inside the
   input's columns (rows [h0, h1) of plane p; column of output ow's window: ow·S - Pd + j):
   each window row and column is one pass over the outputs, so it vectorises; the window is
   visited in the same order as one output at a time, so the argmax is the same (first) one.
   2x2 windows with stride 2, the common case, are one pass. */
static void mlc__pool_max_row(const mlc__pool_job *job, const float *p, int h0, int h1, int lo, int hi,
                              float *MLC__RESTRICT y, int *MLC__RESTRICT argmax) {
    const int W = job->x->shape[3], K = job->K, S = job->S, left = -job->Pd;
    int ih, j, ow;
    if (!argmax && K == 2 && S == 2 && h1 - h0 == 2) {
        const float *r0 = p + h0 * W + left, *r1 = r0 + W;
        MLC__OMP(omp simd)
        for (ow = lo; ow < hi; ow++) {     /* in window order, as below (a NaN first stays) */
            float best = r0[2 * ow];
            best = r0[2 * ow + 1] > best ? r0[2 * ow + 1] : best;
            best = r1[2 * ow] > best ? r1[2 * ow] : best;
            y[ow] = r1[2 * ow + 1] > best ? r1[2 * ow + 1] : best;
        }
        return;
    }
    for (ow = lo; ow < hi; ow++) y[ow] = p[h0 * W + ow * S + left];
    for (ow = lo; argmax && ow < hi; ow++) argmax[ow] = h0 * W + ow * S + left;
    for (ih = h0; ih < h1; ih++)
        for (j = 0; j < K; j++) {
            const float *in = p + ih * W + left + j;
            if (argmax) {
                MLC__OMP(omp simd)
                for (ow = lo; ow < hi; ow++) {
                    int take = in[ow * S] > y[ow];
                    y[ow] = take ? in[ow * S] : y[ow];
                    argmax[ow] = take ? ih * W + left + j + ow * S : argmax[ow];
                }
            } else {
                MLC__OMP(omp simd)
                for (ow = lo; ow < hi; ow++) y[ow] = in[ow * S] > y[ow] ? in[ow * S] : y[ow];
            }
        }
}

/* One output, its window clipped to the input: the edges of max pooling, and average pooling. */
static void mlc__pool_one(const mlc__pool_job *job, const float *p, int oh, int ow, float *y, int *argmax) {
    const int W = job->x->shape[3], OW = job->y->shape[3];
    int ih, iw, h0, h1, w0, w1;
    mlc__pool_window(oh, ow, job->K, job->S, job->Pd, job->x->shape[2], W, &h0, &h1, &w0, &w1);
    if (job->is_max) {                      /* the first of the largest; a NaN first stays */
        int at = h0 < h1 && w0 < w1 ? h0 * W + w0 : -1;
        float best = at < 0 ? -INFINITY : p[at];
        for (ih = h0; ih < h1; ih++)
            for (iw = w0; iw < w1; iw++) {
                int take = p[ih * W + iw] > best;
                best = take ? p[ih * W + iw] : best;
                at = take ? ih * W + iw : at;
            }
        if (argmax) argmax[oh * OW + ow] = at;   /* kept when a backward will come */
        y[oh * OW + ow] = best;
    } else {
        double sum = 0.0;
        for (ih = h0; ih < h1; ih++)
            for (iw = w0; iw < w1; iw++) sum += p[ih * W + iw];
        y[oh * OW + ow] = (float)(sum / (job->K * job->K));
    }
}

static void mlc__pool_planes(void *arg, int piece, size_t begin, size_t end) {
    const mlc__pool_job *job = (const mlc__pool_job *)arg;
    const int H = job->x->shape[2], W = job->x->shape[3], OH = job->y->shape[2], OW = job->y->shape[3];
    const int K = job->K, S = job->S, Pd = job->Pd;
    /* max pooling goes by rows over the outputs [lo, hi) whose windows need no clipping at the sides */
    int lo = job->is_max ? (Pd + S - 1) / S : 0, hi = job->is_max && W + Pd >= K ? (W + Pd - K) / S + 1 : 0;
    int oh, ow, h0, h1, w0, w1;
    size_t pl;
    (void)piece;
    if (hi > OW) hi = OW;
    if (lo > hi) lo = hi;
    for (pl = begin; pl < end; pl++) {
        const float *p = job->x->data + pl * H * W;
        float *y = job->y->data + pl * OH * OW;
        int *argmax = job->argmax ? job->argmax + pl * OH * OW : NULL;
        for (oh = 0; oh < OH; oh++) {
            for (ow = 0; ow < lo; ow++) mlc__pool_one(job, p, oh, ow, y, argmax);
            mlc__pool_window(oh, lo, K, S, Pd, H, W, &h0, &h1, &w0, &w1);
            if (lo < hi) mlc__pool_max_row(job, p, h0, h1, lo, hi, y + oh * OW, argmax ? argmax + oh * OW : NULL);
            for (ow = hi; ow < OW; ow++) mlc__pool_one(job, p, oh, ow, y, argmax);
        }
    }
}

static void mlc__pool_planes_backward(void *arg, int piece, size_t begin, size_t end) {
    const mlc__pool_job *job = (const mlc__pool_job *)arg;
    int H = job->x->shape[2], W = job->x->shape[3], OH = job->y->shape[2], OW = job->y->shape[3], oh, ow, ih, iw, h0, h1, w0, w1;
    float share = 1.0f / (float)(job->K * job->K);
    size_t pl;
    (void)piece;
    for (pl = begin; pl < end; pl++) {
        const float *g = job->y->grad + pl * OH * OW;
        float *gx = job->gx + pl * H * W;
        const int *argmax = job->argmax ? job->argmax + pl * OH * OW : NULL;
        for (oh = 0; oh < OH; oh++)
            for (ow = 0; ow < OW; ow++) {
                if (argmax) {
                    if (argmax[oh * OW + ow] >= 0) gx[argmax[oh * OW + ow]] += g[oh * OW + ow];
                    continue;
                }
                mlc__pool_window(oh, ow, job->K, job->S, job->Pd, H, W, &h0, &h1, &w0, &w1);
                for (ih = h0; ih < h1; ih++)
                    for (iw = w0; iw < w1; iw++) gx[ih * W + iw] += g[oh * OW + ow] * share;
            }
    }
}

/* planes go to threads when the output has at least this many values */
#define MLC__POOL_PARALLEL 16384
static size_t mlc__pool_parallel_from(const mlc_tensor *y) { return MLC__POOL_PARALLEL / ((size_t)y->shape[2] * y->shape[3] + 1) + 1; }

static void mlc__pool_backward(mlc__node *n) {
    mlc__pool_job job;
    job.x = n->in[0]; job.y = n->out; job.gx = mlc__grad(n->in[0]);
    job.K = n->iarg[0]; job.S = n->iarg[1]; job.Pd = n->iarg[2]; job.is_max = n->iarg[3]; job.argmax = (int *)n->saved;
    mlc__parallel((size_t)job.x->shape[0] * job.x->shape[1], mlc__pool_parallel_from(job.y), mlc__pool_planes_backward, &job);
}

static mlc_tensor *mlc__pool2d(const char *op, int is_max, mlc_tensor *x, int K, int S, int Pd) {
    int shape[4], H, W, OH, OW, where;
    mlc_tensor *out;
    mlc__node call;
    mlc__pool_job job;
    MLC__ENTER(op, x);
    if (S == 0) S = K;
    if (x->ndim != 4) return (mlc_tensor *)mlc__fail(ctx, MLC_ERR_SHAPE, "%s: x %T must be [N, C, H, W]", op, x);
    if (K >= 1 && Pd > 0 && !mlc__window_fits(ctx, op, x->shape[2], x->shape[3], K, K, Pd, 1)) return NULL;
    if (K < 1 || S < 1 || Pd < 0 || 2 * Pd > K)
        return (mlc_tensor *)mlc__fail(ctx, MLC_ERR_ARG, "%s: kernel %d, stride %d, padding %d are not valid (padding <= kernel/2)", op, K, S, Pd);
    H = x->shape[2]; W = x->shape[3];
    if (H + 2 * Pd < K || W + 2 * Pd < K)
        return (mlc_tensor *)mlc__fail(ctx, MLC_ERR_SHAPE, "%s: kernel %d is larger than the padded input %T", op, K, x);
    OH = (H + 2 * Pd - K) / S + 1; OW = (W + 2 * Pd - K) / S + 1;
    shape[0] = x->shape[0]; shape[1] = x->shape[1]; shape[2] = OH; shape[3] = OW;
    out = mlc__make(ctx, op, 4, shape, 0);
    if (!out) return NULL;
    mlc__call(&call, op, mlc__pool_backward, out, x, NULL, NULL, NULL);
    call.iarg[0] = K; call.iarg[1] = S; call.iarg[2] = Pd; call.iarg[3] = is_max;
    if ((where = mlc__dispatch(ctx, &call)) < 0) return NULL;
    if (where == 1) { mlc__record(&call); return out; }  /* the device finds the argmax again */
    job.x = x; job.y = out; job.gx = NULL; job.K = K; job.S = S; job.Pd = Pd; job.is_max = is_max; job.argmax = NULL;
    if (is_max && mlc__recording(&call) && !(job.argmax = (int *)mlc__arena_alloc(ctx, out->size * sizeof(int) + 1, op))) return NULL;
    mlc__parallel((size_t)shape[0] * shape[1], mlc__pool_parallel_from(out), mlc__pool_planes, &job);
    call.saved = job.argmax;
    mlc__record(&call);
    return out;
}

MLCDEF mlc_tensor *mlc_max_pool2d(mlc_tensor *x, int kernel, int stride, int padding) { return mlc__pool2d("mlc_max_pool2d", 1, x, kernel, stride, padding); }
MLCDEF mlc_tensor *mlc_avg_pool2d(mlc_tensor *x, int kernel, int stride, int padding) { return mlc__pool2d("mlc_avg_pool2d", 0, x, kernel, stride, padding); }

MLCDEF mlc_tensor *mlc_global_avg_pool2d(mlc_tensor *x) {
    int shape[3];
    MLC__ENTER("mlc_global_avg_pool2d", x);
    if (x->ndim != 4) return (mlc_tensor *)mlc__fail(ctx, MLC_ERR_SHAPE, "mlc_global_avg_pool2d: x %T must be [N, C, H, W]", x);
    shape[0] = x->shape[0]; shape[1] = x->shape[1]; shape[2] = x->shape[2] * x->shape[3];
    return mlc_mean(mlc_reshape(x, 3, shape), 2, 0);
}

/* ============================================================================================
   Autograd: walk the tape from the newest node back. A node runs when its output received a
   gradient; it adds into its inputs' gradients (so a tensor used twice gets both parts).
   Leaves keep their gradients; intermediate gradients are dropped at the end.
   ============================================================================================ */

MLCDEF mlc_result mlc_backward_with(mlc_tensor *out, mlc_tensor *grad_out) {
    mlc_ctx *ctx;
    mlc__node *n;
    float *g;
    if (!out) return MLC_ERR_NULL;
    ctx = out->ctx;
    if (ctx->error) return ctx->error;
    if (!mlc__usable(out, "mlc_backward") || (grad_out && !mlc__usable(grad_out, "mlc_backward")))
        return ctx->error;
    if (grad_out && grad_out->ctx != ctx) {
        mlc__fail(ctx, MLC_ERR_ARG, "mlc_backward: the gradient %T belongs to another context", grad_out);
        return ctx->error;
    }
    if (out->node && out->graph_used) {
        mlc__fail(ctx, MLC_ERR_STATE, "mlc_backward: the graph of %T was used by an earlier "
                  "mlc_backward, which frees it; run the forward again", out);
        return ctx->error;
    }
    if (!out->requires_grad) {
        mlc__fail(ctx, MLC_ERR_STATE, "mlc_backward: tensor %T does not require a gradient (no input needed one, or gradients were off)", out);
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
    if (grad_out) { size_t i; const float *go = mlc__host(grad_out); for (i = 0; i < out->size; i++) g[i] += go[i]; }
    else g[0] += 1.0f;
    mlc__host_wrote_grad(out);
    if (!out->node) return MLC_OK;                       /* a leaf: nothing to propagate */
    for (n = out->node; n; n = n->prev) {
        int k;
        if (!(n->out->grad || n->out->device_grad) || ctx->error) continue;
        n->out->graph_used = 1;                          /* this backward uses the node up */
        for (k = 0; k < n->n_in; k++)                    /* an input whose graph a backward used up */
            if (n->in[k] && n->in[k]->node && n->in[k]->requires_grad && n->in[k]->graph_used)
                mlc__fail(ctx, MLC_ERR_STATE, "mlc_backward: input %T of an op comes from a graph an earlier "
                          "mlc_backward used (and freed); run that forward again", n->in[k]);
        if (ctx->error) break;
        if (n->device) {                                 /* the backend allocates and adds */
            if (!ctx->backend->backward(ctx, n) && !ctx->error)
                mlc__fail(ctx, MLC_ERR_DEVICE, "%s: backward failed on %s", n->op, mlc_device_name(ctx));
            continue;
        }
        mlc__host(n->out);
        mlc__host_grad(n->out);
        for (k = 0; k < n->n_in; k++) {      /* input gradients first: one that fails to allocate stops here */
            if (!n->in[k]) continue;
            mlc__host(n->in[k]);
            if (n->in[k]->requires_grad && !mlc__grad(n->in[k])) break;
        }
        if (ctx->error) break;
        n->backward(n);
        for (k = 0; k < n->n_in; k++) if (n->in[k] && n->in[k]->requires_grad) mlc__host_wrote_grad(n->in[k]);
    }
    for (n = ctx->tape; n; n = n->prev) {
        n->out->grad = NULL;
        n->out->device_grad = NULL;
        n->out->stale &= ~(unsigned)(MLC__GRAD_HOST_STALE | MLC__GRAD_DEVICE_STALE);
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
    for (i = 0; i < y->size; i++) s += (double)v[i] * r[i];
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
        else mlc__fail(ctx, MLC_ERR_ARG, "mlc_gradcheck: the output does not depend on an input that requires a gradient");
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
            err = fabs(analytic[k][i] - numeric);
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
   Initialisers (fan_in = shape[1]·receptive field, fan_out = shape[0]·receptive field)
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
    if (t) for (i = 0; i < t->size; i++) t->data[i] = lo + (hi - lo) * mlc_rand_uniform(t->ctx);
    if (t) mlc__host_wrote(t);
}
MLCDEF void mlc_init_normal(mlc_tensor *t, float mean, float std) {
    size_t i;
    if (t) for (i = 0; i < t->size; i++) t->data[i] = mean + std * mlc_rand_normal(t->ctx);
    if (t) mlc__host_wrote(t);
}
MLCDEF void mlc_init_constant(mlc_tensor *t, float value) {
    size_t i;
    if (t) for (i = 0; i < t->size; i++) t->data[i] = value;
    if (t) mlc__host_wrote(t);
}
MLCDEF void mlc_init_kaiming_uniform(mlc_tensor *t, float a) {   /* bound = gain √(3 / fan_in) */
    double fi, fo, bound;
    if (!t) return;
    mlc__fans(t, &fi, &fo);
    bound = sqrt(2.0 / (1.0 + (double)a * a)) * sqrt(3.0 / fi);
    mlc_init_uniform(t, (float)-bound, (float)bound);
}
MLCDEF void mlc_init_kaiming_normal(mlc_tensor *t, float a) {    /* std = gain / √fan_in */
    double fi, fo;
    if (!t) return;
    mlc__fans(t, &fi, &fo);
    mlc_init_normal(t, 0.0f, (float)(sqrt(2.0 / (1.0 + (double)a * a)) / sqrt(fi)));
}
MLCDEF void mlc_init_xavier_uniform(mlc_tensor *t, float gain) { /* bound = gain √(6 / (fan_in + fan_out)) */
    double fi, fo, bound;
    if (!t) return;
    mlc__fans(t, &fi, &fo);
    bound = gain * sqrt(6.0 / (fi + fo));
    mlc_init_uniform(t, (float)-bound, (float)bound);
}
MLCDEF void mlc_init_xavier_normal(mlc_tensor *t, float gain) {  /* std = gain √(2 / (fan_in + fan_out)) */
    double fi, fo;
    if (!t) return;
    mlc__fans(t, &fi, &fo);
    mlc_init_normal(t, 0.0f, (float)(gain * sqrt(2.0 / (fi + fo))));
}

/* ============================================================================================
   Modules
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
    if (!t || !name) { mlc__fail(m->ctx, MLC_ERR_NULL, "mlc_module_add: %s is NULL", t ? "name" : "tensor"); return m->ctx->error ? m->ctx->error : MLC_ERR_NULL; }
    count = is_buffer ? &m->n_buffers : &m->n_params;
    if (*count >= MLC_MODULE_MAX_TENSORS) {
        mlc__fail(m->ctx, MLC_ERR_ARG, "mlc_module_add: %s already holds %d tensors; use a child module", m->type, MLC_MODULE_MAX_TENSORS);
        return m->ctx->error;
    }
    if (!t->persistent) {
        mlc__fail(m->ctx, MLC_ERR_ARG, "mlc_module_add: tensor \"%s\" lives in a frame; use mlc_parameter or mlc_keep", name);
        return m->ctx->error;
    }
    if (t->ctx != m->ctx) {
        mlc__fail(m->ctx, MLC_ERR_ARG, "mlc_module_add: tensor \"%s\" belongs to another context", name);
        return m->ctx->error;
    }
    if (!(name = mlc__strdup(m->ctx, name))) return m->ctx->error;
    if (is_buffer) { m->buffers[*count] = t; m->buffer_names[*count] = name; }
    else { m->params[*count] = t; m->param_names[*count] = name; }
    ++*count;
    return MLC_OK;
}
MLCDEF mlc_result mlc_module_add_param(mlc_module *m, const char *name, mlc_tensor *p) { return mlc__module_add(m, name, p, 0); }
MLCDEF mlc_result mlc_module_add_buffer(mlc_module *m, const char *name, mlc_tensor *b) { return mlc__module_add(m, name, b, 1); }

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
    if (!child || !name) { mlc__fail(m->ctx, MLC_ERR_NULL, "mlc_module_add_child: %s is NULL", child ? "name" : "child"); return m->ctx->error ? m->ctx->error : MLC_ERR_NULL; }
    if (child->ctx != m->ctx || mlc__module_holds(child, m)) {
        mlc__fail(m->ctx, MLC_ERR_ARG, "mlc_module_add_child: %s \"%s\" %s", child->type, name,
                  child->ctx != m->ctx ? "belongs to another context" : "contains the module (a cycle)");
        return m->ctx->error ? m->ctx->error : MLC_ERR_ARG;
    }
    children = (mlc_module **)mlc__owned_alloc(m->ctx, sizeof(mlc_module *) * (size_t)(m->n_children + 1), "mlc_module_add_child");
    names = (char **)mlc__owned_alloc(m->ctx, sizeof(char *) * (size_t)(m->n_children + 1), "mlc_module_add_child");
    if (!children || !names || !(names[m->n_children] = mlc__strdup(m->ctx, name))) return m->ctx->error;
    if (m->n_children) {
        memcpy(children, m->children, sizeof(mlc_module *) * (size_t)m->n_children);
        memcpy(names, m->child_names, sizeof(char *) * (size_t)m->n_children);
        mlc__owned_free(m->ctx, m->children);
        mlc__owned_free(m->ctx, m->child_names);
    }
    children[m->n_children] = child;
    m->children = children; m->child_names = names;
    m->n_children++;
    return MLC_OK;
}

MLCDEF mlc_module *mlc_nn_custom(mlc_ctx *ctx, const char *type, mlc_forward_fn forward, void *user) {
    mlc_module *m = mlc__module(ctx, type ? type : "Custom", forward);
    if (m) m->user = user;
    return m;
}

MLCDEF mlc_tensor *mlc_forward(mlc_module *m, mlc_tensor *x) {
    if (!m || !x)
        return (mlc_tensor *)mlc__fail(m ? m->ctx : x ? x->ctx : NULL, MLC_ERR_NULL,
                                       "mlc_forward: %s is NULL", m ? "the input" : "the module");
    if (x->ctx != m->ctx)
        return (mlc_tensor *)mlc__fail(m->ctx, MLC_ERR_ARG, "mlc_forward: input %T belongs to another "
                                       "context than %s", x, m->type);
    if (!m->forward) return (mlc_tensor *)mlc__fail(m->ctx, MLC_ERR_STATE, "mlc_forward: module %s has no forward function", m->type);
    return m->forward(m, x);
}

/* A parameter with PyTorch's default initialisation U(-1/√fan_in, 1/√fan_in) for biases. */
static mlc_tensor *mlc__param(mlc_module *m, const char *name, int ndim, const int *shape) {
    mlc_tensor *p = mlc_parameter(m->ctx, ndim, shape);
    if (p && mlc__module_add(m, name, p, 0) != MLC_OK) return NULL;
    return p;
}
static mlc_tensor *mlc__buffer(mlc_module *m, const char *name, int ndim, const int *shape, float value) {
    mlc_tensor *b = mlc__new(m->ctx, name, ndim, shape, 1);
    if (!b || mlc__module_add(m, name, b, 1) != MLC_OK) return NULL;
    mlc_init_constant(b, value);
    return b;
}

static mlc_tensor *mlc__linear_forward(mlc_module *m, mlc_tensor *x) { return mlc_linear(x, m->params[0], m->n_params > 1 ? m->params[1] : NULL); }

static mlc_module *mlc__nn_linear(mlc_ctx *ctx, int in, int out, int bias) {
    mlc_module *m = mlc__module(ctx, "Linear", mlc__linear_forward);
    int shape[2];
    mlc_tensor *w, *b = NULL;
    if (!m) return NULL;
    shape[0] = out; shape[1] = in;
    if (!(w = mlc__param(m, "weight", 2, shape)) || (bias && !(b = mlc__param(m, "bias", 1, &out)))) return NULL;
    mlc_init_kaiming_uniform(w, 2.2360679775f);          /* a = √5: bound 1/√in, as PyTorch */
    if (b) mlc_init_uniform(b, -1.0f / sqrtf((float)(in > 0 ? in : 1)), 1.0f / sqrtf((float)(in > 0 ? in : 1)));
    return m;
}
MLCDEF mlc_module *mlc_nn_linear(mlc_ctx *ctx, int in, int out) { return mlc__nn_linear(ctx, in, out, 1); }
MLCDEF mlc_module *mlc_nn_linear_nobias(mlc_ctx *ctx, int in, int out) { return mlc__nn_linear(ctx, in, out, 0); }

static mlc_tensor *mlc__conv2d_forward(mlc_module *m, mlc_tensor *x) { return mlc_conv2d(x, m->params[0], m->params[1], m->conv); }

MLCDEF mlc_module *mlc_nn_conv2d(mlc_ctx *ctx, int in_channels, int out_channels, int kernel, mlc_conv_opts opts) {
    mlc_module *m = mlc__module(ctx, "Conv2d", mlc__conv2d_forward);
    int shape[4], groups = opts.groups ? opts.groups : 1;
    mlc_tensor *w, *b;
    float bound;
    if (!m) return NULL;
    if (in_channels < 1 || out_channels < 1 || kernel < 1 || opts.stride < 0 || opts.padding < 0 ||
        opts.dilation < 0)
        return (mlc_module *)mlc__fail(ctx, MLC_ERR_ARG, "mlc_nn_conv2d: in %d, out %d, kernel %d, "
                                       "stride %d, padding %d, dilation %d are not valid", in_channels,
                                       out_channels, kernel, opts.stride, opts.padding, opts.dilation);
    if (groups < 1 || in_channels % groups) return (mlc_module *)mlc__fail(ctx, MLC_ERR_ARG, "mlc_nn_conv2d: %d input channels do not split into %d groups", in_channels, groups);
    shape[0] = out_channels; shape[1] = in_channels / groups; shape[2] = shape[3] = kernel;
    m->conv = opts;
    if (!(w = mlc__param(m, "weight", 4, shape)) || !(b = mlc__param(m, "bias", 1, &out_channels))) return NULL;
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
    return mlc_batch_norm(x, m->buffers[0], m->buffers[1], m->params[0], m->params[1], m->training, m->momentum, m->eps);
}
MLCDEF mlc_module *mlc_nn_batch_norm(mlc_ctx *ctx, int features) {
    mlc_module *m = mlc__module(ctx, "BatchNorm", mlc__batch_norm_forward);
    mlc_tensor *w, *b;
    if (!m) return NULL;
    m->eps = 1e-5f; m->momentum = 0.1f;
    if (!(w = mlc__param(m, "weight", 1, &features)) || !(b = mlc__param(m, "bias", 1, &features))) return NULL;
    mlc_init_constant(w, 1.0f);
    if (!mlc__buffer(m, "running_mean", 1, &features, 0.0f) || !mlc__buffer(m, "running_var", 1, &features, 1.0f) ||
        !mlc__buffer(m, "num_batches_tracked", 0, NULL, 0.0f)) return NULL;
    return m;
}

static mlc_tensor *mlc__layer_norm_forward(mlc_module *m, mlc_tensor *x) { return mlc_layer_norm(x, m->params[0], m->params[1], m->eps); }
MLCDEF mlc_module *mlc_nn_layer_norm(mlc_ctx *ctx, int features) {
    mlc_module *m = mlc__module(ctx, "LayerNorm", mlc__layer_norm_forward);
    mlc_tensor *w;
    if (!m) return NULL;
    m->eps = 1e-5f;
    if (!(w = mlc__param(m, "weight", 1, &features)) || !mlc__param(m, "bias", 1, &features)) return NULL;
    mlc_init_constant(w, 1.0f);
    return m;
}

static mlc_tensor *mlc__embedding_forward(mlc_module *m, mlc_tensor *x) { return mlc_embedding(m->params[0], x); }
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

static mlc_tensor *mlc__dropout_forward(mlc_module *m, mlc_tensor *x) { return mlc_dropout(x, m->alpha, m->training); }
static mlc_tensor *mlc__relu_forward(mlc_module *m, mlc_tensor *x) { (void)m; return mlc_relu(x); }
static mlc_tensor *mlc__leaky_forward(mlc_module *m, mlc_tensor *x) { return mlc_leaky_relu(x, m->alpha); }
static mlc_tensor *mlc__gelu_forward(mlc_module *m, mlc_tensor *x) { (void)m; return mlc_gelu(x); }
static mlc_tensor *mlc__sigmoid_forward(mlc_module *m, mlc_tensor *x) { (void)m; return mlc_sigmoid(x); }
static mlc_tensor *mlc__tanh_forward(mlc_module *m, mlc_tensor *x) { (void)m; return mlc_tanh(x); }
static mlc_tensor *mlc__silu_forward(mlc_module *m, mlc_tensor *x) { (void)m; return mlc_silu(x); }
static mlc_tensor *mlc__flatten_forward(mlc_module *m, mlc_tensor *x) { (void)m; return mlc_flatten(x, 1); }
static mlc_tensor *mlc__max_pool_forward(mlc_module *m, mlc_tensor *x) { return mlc_max_pool2d(x, m->kernel, m->conv.stride, m->conv.padding); }
static mlc_tensor *mlc__avg_pool_forward(mlc_module *m, mlc_tensor *x) { return mlc_avg_pool2d(x, m->kernel, m->conv.stride, m->conv.padding); }
static mlc_tensor *mlc__gap_forward(mlc_module *m, mlc_tensor *x) { (void)m; return mlc_global_avg_pool2d(x); }

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
    if (m) { m->kernel = kernel; m->conv.stride = stride; }
    return m;
}
MLCDEF mlc_module *mlc_nn_avg_pool2d(mlc_ctx *ctx, int kernel, int stride) {
    mlc_module *m = mlc__module(ctx, "AvgPool2d", mlc__avg_pool_forward);
    if (m && (kernel < 1 || stride < 0))
        return (mlc_module *)mlc__fail(ctx, MLC_ERR_ARG, "mlc_nn_avg_pool2d: kernel %d, stride %d "
                                       "are not valid", kernel, stride);
    if (m) { m->kernel = kernel; m->conv.stride = stride; }
    return m;
}
MLCDEF mlc_module *mlc_nn_global_avg_pool2d(mlc_ctx *ctx) { return mlc__module(ctx, "GlobalAvgPool2d", mlc__gap_forward); }

static mlc_tensor *mlc__sequential_forward(mlc_module *m, mlc_tensor *x) {
    int i;
    for (i = 0; i < m->n_children && x; i++) x = mlc_forward(m->children[i], x);
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

MLCDEF void mlc_module_train(mlc_module *m, int training) {
    int i;
    if (!m) return;
    m->training = training != 0;
    for (i = 0; i < m->n_children; i++) mlc_module_train(m->children[i], training);
}

MLCDEF mlc_result mlc_module_to(mlc_module *m, int on_device) {
    int i;
    if (!m) return MLC_ERR_NULL;
    for (i = 0; i < m->n_params; i++) if (!mlc_to(m->params[i], on_device)) return m->ctx->error;
    for (i = 0; i < m->n_buffers; i++) if (!mlc_to(m->buffers[i], on_device)) return m->ctx->error;
    for (i = 0; i < m->n_children; i++) if (mlc_module_to(m->children[i], on_device) != MLC_OK) return m->ctx->error;
    return MLC_OK;
}

static int mlc__collect(mlc_module *m, const char *prefix, int with_buffers, mlc_named_tensor *out, int max, int count) {
    int i;
    char name[128];
    for (i = 0; i < m->n_params; i++, count++)
        if (count < max) { mlc__format(out[count].name, sizeof out[count].name, "%s%s", prefix, m->param_names[i]); out[count].tensor = m->params[i]; }
    for (i = 0; with_buffers && i < m->n_buffers; i++, count++)
        if (count < max) { mlc__format(out[count].name, sizeof out[count].name, "%s%s", prefix, m->buffer_names[i]); out[count].tensor = m->buffers[i]; }
    for (i = 0; i < m->n_children; i++) {
        mlc__format(name, sizeof name, "%s%s.", prefix, m->child_names[i]);
        count = mlc__collect(m->children[i], name, with_buffers, out, max, count);
    }
    return count;
}
MLCDEF int mlc_module_parameters(mlc_module *m, mlc_named_tensor *out, int max) { return m ? mlc__collect(m, "", 0, out, out ? max : 0, 0) : 0; }
MLCDEF int mlc_module_state(mlc_module *m, mlc_named_tensor *out, int max) { return m ? mlc__collect(m, "", 1, out, out ? max : 0, 0) : 0; }

MLCDEF size_t mlc_module_param_count(mlc_module *m) {
    size_t n = 0;
    int i;
    if (!m) return 0;
    for (i = 0; i < m->n_params; i++) n += m->params[i]->size;
    for (i = 0; i < m->n_children; i++) n += mlc_module_param_count(m->children[i]);
    return n;
}

/* ============================================================================================
   Optimisers (PyTorch's update rules; g = gradient, p = parameter, t = step number)
     SGD      g += wd p;  b = μ b + (1 - τ) g (b = g at t = 1);  g = nesterov ? g + μ b : b;  p -= lr g
     Adam     g += wd p;  m = β1 m + (1-β1) g;  v = β2 v + (1-β2) g²;
              p -= lr m/(1-β1^t) / (√(v/(1-β2^t)) + eps)
     AdamW    p -= lr wd p first; then Adam without the g += wd p
     RMSprop  g += wd p;  v = α v + (1-α) g²;  a = √(v - ḡ²) + eps (centered, ḡ = α ḡ + (1-α) g)
              or √v + eps;  with momentum: b = μ b + g/a, p -= lr b;  else p -= lr g/a
   ============================================================================================ */

typedef enum { MLC__SGD, MLC__ADAM, MLC__ADAMW, MLC__RMSPROP } mlc__optim_kind;

struct mlc_optim {
    mlc_ctx *ctx;
    mlc__optim_kind kind;
    int count, capacity;
    mlc_tensor **params;
    mlc_tensor **state;                 /* three slots per parameter: state[3 i + k], NULL when unused */
    long long t;
    float lr, beta1, beta2, eps, weight_decay, momentum, dampening;
    int nesterov, centered;
};

/* Whether the rule reads state buffer k of each parameter: SGD its b (k = 0) with momentum;
   Adam m (0) and v (1); RMSprop b (0) with momentum, v (1), and ḡ (2) when centered. */
static int mlc__optim_keeps(const mlc_optim *o, int k) {
    if (o->kind == MLC__SGD) return k == 0 && o->momentum != 0.0f;
    if (o->kind == MLC__RMSPROP) return k == 1 || (k == 0 && o->momentum > 0.0f) || (k == 2 && o->centered);
    return k < 2;
}

MLCDEF mlc_result mlc_optim_add_param(mlc_optim *opt, mlc_tensor *p) {
    mlc_ctx *ctx;
    int k;
    if (!opt) return MLC_ERR_NULL;
    ctx = opt->ctx;
    if (!p || !p->persistent || !p->grad || p->ctx != ctx) {
        mlc__fail(ctx, MLC_ERR_ARG, "mlc_optim_add_param: %s", !p ? "parameter is NULL" : p->ctx != ctx
                  ? "the parameter belongs to another context"
                  : "the tensor is not a parameter (use mlc_parameter)");
        return ctx->error ? ctx->error : MLC_ERR_ARG;
    }
    for (k = 0; k < opt->count; k++) if (opt->params[k] == p) return MLC_OK;   /* added before: kept once */
    if (opt->count == opt->capacity) {
        int cap = opt->capacity ? 2 * opt->capacity : 16;
        mlc_tensor **params = (mlc_tensor **)mlc__owned_alloc(ctx, sizeof(mlc_tensor *) * (size_t)cap, "mlc_optim_add_param");
        mlc_tensor **state = (mlc_tensor **)mlc__owned_alloc(ctx, sizeof(mlc_tensor *) * 3 * (size_t)cap, "mlc_optim_add_param");
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
        opt->state[3 * opt->count + k] = st;
    }
    opt->params[opt->count++] = p;
    return MLC_OK;
}

static mlc_result mlc__optim_add_module(mlc_optim *opt, mlc_module *m) {   /* PyTorch's order */
    int i;
    for (i = 0; i < m->n_params; i++) if (mlc_optim_add_param(opt, m->params[i]) != MLC_OK) return opt->ctx->error;
    for (i = 0; i < m->n_children; i++) if (mlc__optim_add_module(opt, m->children[i]) != MLC_OK) return opt->ctx->error;
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

MLCDEF mlc_optim *mlc_sgd(mlc_ctx *ctx, mlc_module *module, mlc_sgd_config c) {
    mlc_optim *opt = mlc__optim(ctx, MLC__SGD, c.lr, 0.01f);
    if (opt) { opt->momentum = c.momentum; opt->dampening = c.dampening; opt->weight_decay = c.weight_decay; opt->nesterov = c.nesterov; }
    return mlc__optim_of(opt, module, "mlc_sgd");
}

static mlc_optim *mlc__adam(mlc_ctx *ctx, mlc_module *module, mlc_adam_config c, mlc__optim_kind kind, float default_wd) {
    mlc_optim *opt = mlc__optim(ctx, kind, c.lr, 1e-3f);
    if (!opt) return NULL;
    opt->beta1 = mlc__setting(c.beta1, 0.9f);
    opt->beta2 = mlc__setting(c.beta2, 0.999f);
    opt->eps = mlc__setting(c.eps, 1e-8f);
    opt->weight_decay = mlc__setting(c.weight_decay, default_wd);
    return mlc__optim_of(opt, module, kind == MLC__ADAM ? "mlc_adam" : "mlc_adamw");
}
MLCDEF mlc_optim *mlc_adam(mlc_ctx *ctx, mlc_module *module, mlc_adam_config c) { return mlc__adam(ctx, module, c, MLC__ADAM, 0.0f); }
MLCDEF mlc_optim *mlc_adamw(mlc_ctx *ctx, mlc_module *module, mlc_adam_config c) { return mlc__adam(ctx, module, c, MLC__ADAMW, 0.01f); }

MLCDEF mlc_optim *mlc_rmsprop(mlc_ctx *ctx, mlc_module *module, mlc_rmsprop_config c) {
    mlc_optim *opt = mlc__optim(ctx, MLC__RMSPROP, c.lr, 0.01f);
    if (!opt) return NULL;
    opt->beta2 = mlc__setting(c.alpha, 0.99f);
    opt->eps = mlc__setting(c.eps, 1e-8f);
    opt->weight_decay = c.weight_decay; opt->momentum = c.momentum; opt->centered = c.centered;
    return mlc__optim_of(opt, module, "mlc_rmsprop");
}

MLCDEF void mlc_zero_grad(mlc_optim *opt) {
    int i;
    if (!opt) return;
    for (i = 0; i < opt->count; i++) mlc__clear_grad(opt->params[i]);
}

/* One parameter's update, a loop per rule over plain arrays, so compilers vectorise it (with
   -fopenmp's simd pragma, or -O3; sqrt in Adam and RMSprop also needs -fno-math-errno). */
static void mlc__sgd_update(const mlc_optim *o, size_t n, float *MLC__RESTRICT p, const float *MLC__RESTRICT g,
                            float *MLC__RESTRICT buf) {
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
        buf[j] = first ? gj : mu * buf[j] + keep * gj;
        p[j] -= lr * (nesterov ? gj + mu * buf[j] : buf[j]);
    }
}

/* Adam and AdamW in one loop: Adam adds wd p to the gradient, AdamW shrinks p by (1 - lr wd). */
static void mlc__adam_update(const mlc_optim *o, size_t n, float *MLC__RESTRICT p, const float *MLC__RESTRICT g,
                             float *MLC__RESTRICT m, float *MLC__RESTRICT v) {
    const float b1 = o->beta1, b2 = o->beta2, eps = o->eps;
    const float l2 = o->kind == MLC__ADAM ? o->weight_decay : 0.0f;
    const float shrink = o->kind == MLC__ADAMW ? 1.0f - o->lr * o->weight_decay : 1.0f;
    const float step = (float)(o->lr / (1.0 - pow((double)b1, (double)o->t)));
    const float inv_bc2 = (float)(1.0 / (1.0 - pow((double)b2, (double)o->t)));
    size_t j;
    MLC__OMP(omp simd)
    for (j = 0; j < n; j++) {
        float gj = g[j] + l2 * p[j];
        m[j] = b1 * m[j] + (1.0f - b1) * gj;
        v[j] = b2 * v[j] + (1.0f - b2) * gj * gj;
        p[j] = p[j] * shrink - step * m[j] / (MLC_SQRTF(v[j] * inv_bc2) + eps);
    }
}

static void mlc__rmsprop_update(const mlc_optim *o, size_t n, float *MLC__RESTRICT p, const float *MLC__RESTRICT g,
                                float *MLC__RESTRICT buf, float *MLC__RESTRICT sq, float *MLC__RESTRICT mean) {
    const float lr = o->lr, wd = o->weight_decay, a = o->beta2, eps = o->eps, mu = o->momentum;
    const int centered = o->centered;
    size_t j;
    MLC__OMP(omp simd)
    for (j = 0; j < n; j++) {
        float gj = g[j] + wd * p[j], avg;
        sq[j] = a * sq[j] + (1.0f - a) * gj * gj;
        if (centered) mean[j] = a * mean[j] + (1.0f - a) * gj;
        avg = MLC_SQRTF(centered ? sq[j] - mean[j] * mean[j] : sq[j]) + eps;
        if (mu > 0.0f) { buf[j] = mu * buf[j] + gj / avg; p[j] -= lr * buf[j]; }
        else p[j] -= lr * gj / avg;
    }
}

/* Parameter i's update over a slice [begin, end), for mlc__parallel (threads from 32k on). */
typedef struct mlc__step_job { const mlc_optim *opt; int i; } mlc__step_job;
#define MLC__STEP_PARALLEL 32768

/* State buffer k of parameter i from `begin` on, NULL when the rule keeps none. */
static float *mlc__state_from(const mlc_optim *o, int i, int k, size_t begin) {
    const mlc_tensor *st = o->state[3 * i + k];
    return st ? st->data + begin : NULL;
}

static void mlc__step_slice(void *job, int piece, size_t begin, size_t end) {
    const mlc_optim *o = ((const mlc__step_job *)job)->opt;
    int i = ((const mlc__step_job *)job)->i;
    float *p = o->params[i]->data + begin, *g = o->params[i]->grad + begin, *s0 = mlc__state_from(o, i, 0, begin);
    size_t n = end - begin;
    (void)piece;
    if (o->kind == MLC__SGD) mlc__sgd_update(o, n, p, g, s0);
    else if (o->kind == MLC__RMSPROP) mlc__rmsprop_update(o, n, p, g, s0, mlc__state_from(o, i, 1, begin), mlc__state_from(o, i, 2, begin));
    else mlc__adam_update(o, n, p, g, s0, mlc__state_from(o, i, 1, begin));
}

MLCDEF void mlc_step(mlc_optim *opt) {
    int i;
    if (!opt || opt->ctx->error) return;
    opt->t++;
    for (i = 0; i < opt->count; i++) {
        mlc_tensor *p = opt->params[i], **st = opt->state + 3 * i;
        mlc__step_job job;
        int k;
        for (k = 0; k < 3; k++)                         /* the module moved after the optimiser was made */
            if (st[k] && st[k]->on_device != p->on_device && !mlc_to(st[k], p->on_device)) return;
        if (p->on_device) {
            if (opt->ctx->backend->step(opt, i)) {
                p->stale = (p->stale & ~(unsigned)MLC__DEVICE_STALE) | MLC__HOST_STALE;
                for (k = 0; k < 3; k++) if (st[k]) st[k]->stale = MLC__HOST_STALE;
                continue;
            }
            if (opt->ctx->error) return;
            mlc__fall_back(opt->ctx, "mlc_step");
        }
        mlc__host(p);
        mlc__host_grad(p);
        for (k = 0; k < 3; k++) if (st[k]) { mlc__host(st[k]); mlc__host_wrote(st[k]); }
        mlc__host_wrote(p);
        job.opt = opt; job.i = i;
        mlc__parallel(p->size, MLC__STEP_PARALLEL, mlc__step_slice, &job);
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
        for (j = 0; j < opt->params[i]->size; j++) total += (double)g[j] * g[j];
    }
    total = sqrt(total);
    scale = (float)(max_norm / (total + 1e-6));
    if (scale < 1.0f)
        for (i = 0; i < opt->count; i++) {
            for (j = 0; j < opt->params[i]->size; j++) opt->params[i]->grad[j] *= scale;
            mlc__host_wrote_grad(opt->params[i]);
        }
    return (float)total;
}

MLCDEF float mlc_lr_step(float base_lr, int epoch, int step_size, float gamma) {
    return step_size > 0 ? base_lr * (float)pow((double)gamma, (double)(epoch / step_size)) : base_lr;
}

MLCDEF float mlc_lr_cosine(float base_lr, int step, int warmup_steps, int total_steps, float min_lr) {
    double progress;
    if (step < warmup_steps) return base_lr * (float)(step + 1) / (float)warmup_steps;
    progress = total_steps > warmup_steps ? (double)(step - warmup_steps) / (total_steps - warmup_steps) : 1.0;
    if (progress > 1.0) progress = 1.0;
    return min_lr + (base_lr - min_lr) * (float)(0.5 * (1.0 + cos(3.141592653589793 * progress)));
}

#ifdef __cplusplus
}
#endif
#ifdef MLC_OPENCL
#include "mlc_opencl.h"                 /* the OpenCL backend: mlc__opencl_open, mlc__opencl_devices */
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
