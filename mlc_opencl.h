/* mlc_opencl.h - the OpenCL backend of mlc.h - MIT licence (see the end of mlc.h)

   Do this:
      #define MLC_IMPLEMENTATION
      #define MLC_OPENCL
      #include "mlc.h"
   in the one file that holds mlc's implementation; mlc.h includes this header at the end of its
   implementation. Nothing else changes: mlc_devices lists the OpenCL devices, and
   config.device (or $MLC_DEVICE) = "opencl", "opencl:N", "best" or a piece of a device's name
   puts a context on one of them.

CONTENTS
   Each section's banner carries "@section cl-<name>": search for that to jump to it.
   cl-library   the OpenCL library, opened at run time: the table of every entry point mlc uses
   cl-devices   every platform's devices, numbered in order; a device's name and properties
   cl-state     a context's state (queue, program, kernel cache, settings), OpenCL errors, buffers
   cl-kernels   the OpenCL C source (formulas from mlc.h's tables, then the kernels), its lazy
                build, and the launcher that sets a kernel's arguments and runs it
   cl-buffers   tensors' buffers: uploads, fills, and a tensor's or gradient's cl_mem for an op
   cl-ops       each op family's forward and backward, as calls of the kernels
   cl-backend   the backend's entries: which ops run here, dispatch by op, optimiser steps, fills,
                copies, waits, closing, and the table mlc.h registers (mlc__opencl_backend)
   cl-open      opening a device: "opencl", "opencl:N", "best", or a piece of a device's name

LINKING
   Nothing at build time: the OpenCL library (libOpenCL.so.1, OpenCL.framework, OpenCL.dll) is
   opened at run time, so one binary runs with or without an OpenCL driver (mlc_devices then
   returns 0). On glibc before 2.34 link with -ldl for dlopen.

WHAT RUNS ON THE DEVICE
   OpenCL 1.2 and OpenCL C 1.2, float32 only, no relaxed maths (the CPU loops are the reference
   and tests compare against them). Every op family of mlc.h has kernels, forward and backward
   (the table mlc__cl_kernels, checked against mlc.h's MLC__OPS), as have the SGD/Adam/AdamW/
   RMSprop steps and fills; an op a future family lacks runs on the CPU through copies
   (mlc_stats.fallbacks). Gradients of broadcast add/sub/mul/div operands are summed by one
   work-item per operand element, in the CPU's order, so they are deterministic; index_select,
   gather and where add their gradients with atomics (a compare-and-swap loop), so those sums
   may differ in the last bits run to run.

MEMORY
   mlc.h keeps the books (mlc__device_alloc): long-lived tensors' buffers go with
   mlc_tensor_free, mlc_to(t, 0) or mlc_destroy; a temporary's buffer lives as long as its
   tensor's frame, then is kept as a spare of its size, so a steady training loop creates no
   buffers after its first step. This file only creates and releases cl_mem objects.
   mlc_stats.device_bytes_current counts every live buffer, spares included. Frame
   temporaries are uploaded without waiting; mlc_frame_end waits for those copies before the
   arena's host memory is reused. Convolutions run a chunk of images at a time through scratch
   of at most MLC_OPENCL_CONV_SCRATCH floats (default 16 Mi = 64 MiB; one image at least);
   #define it smaller for a device with little memory.

LIMITS
   The library table is global and loaded once, on the first mlc_devices or mlc_create that
   asks for OpenCL; make that first call from one thread. Each context is single-threaded.
   The kernels use mlc's own tanh (MLC_TANHF overrides only the CPU's). MLC_OPENCL_OPTIONS in
   the environment adds options to the kernel build (say -cl-mad-enable, trading the last bits
   of agreement with the CPU for speed); a build that fails is MLC_ERR_DEVICE with the log.
   Every kernel's arguments fit in the 256 bytes OpenCL promises (CL_DEVICE_MAX_PARAMETER_SIZE;
   a longer list would be MLC_ERR_DEVICE, never a launch): an optimiser launch takes 8 parameters
   (480 bytes) where the device allows that, else 4.
*/
#ifndef MLC_OPENCL_H
#define MLC_OPENCL_H

#ifndef MLC_IMPLEMENTATION_DONE
#error "mlc_opencl.h is part of mlc's implementation: #define MLC_OPENCL before including mlc.h instead"
#endif

#ifndef CL_TARGET_OPENCL_VERSION
#define CL_TARGET_OPENCL_VERSION 120
#endif
#ifdef __APPLE__
#include <OpenCL/opencl.h>
#else
#include <CL/cl.h>
#endif
#ifdef _WIN32
#ifndef WIN32_LEAN_AND_MEAN
#define WIN32_LEAN_AND_MEAN
#endif
#include <windows.h>
#else
#include <dlfcn.h>
#endif

/* ============================================================================================
   @section cl-library  The OpenCL library, opened at run time: every entry point mlc uses, in one table
   ============================================================================================ */

typedef struct mlc__cl_api {
    int state;                          /* 0: not tried yet, 1: loaded, -1: not available */
    cl_int (CL_API_CALL *GetPlatformIDs)(cl_uint, cl_platform_id *, cl_uint *);
    cl_int (CL_API_CALL *GetPlatformInfo)(cl_platform_id, cl_platform_info, size_t, void *, size_t *);
    cl_int (CL_API_CALL *GetDeviceIDs)(cl_platform_id, cl_device_type, cl_uint, cl_device_id *, cl_uint *);
    cl_int (CL_API_CALL *GetDeviceInfo)(cl_device_id, cl_device_info, size_t, void *, size_t *);
    cl_context (CL_API_CALL *CreateContext)(const cl_context_properties *, cl_uint, const cl_device_id *,
                                            void (CL_CALLBACK *)(const char *, const void *, size_t, void *),
                                            void *, cl_int *);
    cl_int (CL_API_CALL *ReleaseContext)(cl_context);
    cl_command_queue (CL_API_CALL *CreateCommandQueue)(cl_context, cl_device_id, cl_command_queue_properties,
                                                       cl_int *);
    cl_int (CL_API_CALL *ReleaseCommandQueue)(cl_command_queue);
    cl_mem (CL_API_CALL *CreateBuffer)(cl_context, cl_mem_flags, size_t, void *, cl_int *);
    cl_int (CL_API_CALL *ReleaseMemObject)(cl_mem);
    cl_int (CL_API_CALL *EnqueueWriteBuffer)(cl_command_queue, cl_mem, cl_bool, size_t, size_t, const void *,
                                             cl_uint, const cl_event *, cl_event *);
    cl_int (CL_API_CALL *EnqueueReadBuffer)(cl_command_queue, cl_mem, cl_bool, size_t, size_t, void *,
                                            cl_uint, const cl_event *, cl_event *);
    cl_program (CL_API_CALL *CreateProgramWithSource)(cl_context, cl_uint, const char **, const size_t *,
                                                     cl_int *);
    cl_int (CL_API_CALL *BuildProgram)(cl_program, cl_uint, const cl_device_id *, const char *,
                                       void (CL_CALLBACK *)(cl_program, void *), void *);
    cl_int (CL_API_CALL *GetProgramBuildInfo)(cl_program, cl_device_id, cl_program_build_info, size_t, void *,
                                             size_t *);
    cl_int (CL_API_CALL *ReleaseProgram)(cl_program);
    cl_kernel (CL_API_CALL *CreateKernel)(cl_program, const char *, cl_int *);
    cl_int (CL_API_CALL *ReleaseKernel)(cl_kernel);
    cl_int (CL_API_CALL *SetKernelArg)(cl_kernel, cl_uint, size_t, const void *);
    cl_int (CL_API_CALL *GetKernelWorkGroupInfo)(cl_kernel, cl_device_id, cl_kernel_work_group_info, size_t,
                                                void *, size_t *);
    cl_int (CL_API_CALL *EnqueueNDRangeKernel)(cl_command_queue, cl_kernel, cl_uint, const size_t *,
                                              const size_t *, const size_t *, cl_uint, const cl_event *,
                                              cl_event *);
    cl_int (CL_API_CALL *Finish)(cl_command_queue);
} mlc__cl_api;

/* The one mutable global: filled once by mlc__cl_load, never closed (the process keeps it). */
static mlc__cl_api mlc__cl;

/* Open the library and fetch every entry point; 1 when all are there. */
static int mlc__cl_load(void) {
#ifdef _WIN32
    HMODULE lib;
#define MLC__CL_SYM(name) (lib ? (void *)GetProcAddress(lib, name) : NULL)
#else
    void *lib;
#define MLC__CL_SYM(name) (lib ? dlsym(lib, name) : NULL)
#endif
    /* memcpy: ISO C has no cast from an object pointer to a function pointer */
#define MLC__CL_FETCH(field) do { void *sym_ = MLC__CL_SYM("cl" #field); \
        if (!sym_) ok = 0; else memcpy(&mlc__cl.field, &sym_, sizeof sym_); } while (0)
    int ok = 1;
    if (mlc__cl.state) return mlc__cl.state > 0;
#if defined(_WIN32)
    lib = LoadLibraryA("OpenCL.dll");
#elif defined(__APPLE__)
    lib = dlopen("/System/Library/Frameworks/OpenCL.framework/OpenCL", RTLD_NOW | RTLD_LOCAL);
#else
    lib = dlopen("libOpenCL.so.1", RTLD_NOW | RTLD_LOCAL);
    if (!lib) lib = dlopen("libOpenCL.so", RTLD_NOW | RTLD_LOCAL);
#endif
    if (!lib) { mlc__cl.state = -1; return 0; }
    MLC__CL_FETCH(GetPlatformIDs);      MLC__CL_FETCH(GetPlatformInfo);
    MLC__CL_FETCH(GetDeviceIDs);        MLC__CL_FETCH(GetDeviceInfo);
    MLC__CL_FETCH(CreateContext);       MLC__CL_FETCH(ReleaseContext);
    MLC__CL_FETCH(CreateCommandQueue);  MLC__CL_FETCH(ReleaseCommandQueue);
    MLC__CL_FETCH(CreateBuffer);        MLC__CL_FETCH(ReleaseMemObject);
    MLC__CL_FETCH(EnqueueWriteBuffer);  MLC__CL_FETCH(EnqueueReadBuffer);
    MLC__CL_FETCH(CreateProgramWithSource); MLC__CL_FETCH(BuildProgram);
    MLC__CL_FETCH(GetProgramBuildInfo); MLC__CL_FETCH(ReleaseProgram);
    MLC__CL_FETCH(CreateKernel);        MLC__CL_FETCH(ReleaseKernel);
    MLC__CL_FETCH(SetKernelArg);        MLC__CL_FETCH(GetKernelWorkGroupInfo);
    MLC__CL_FETCH(EnqueueNDRangeKernel); MLC__CL_FETCH(Finish);
#undef MLC__CL_FETCH
#undef MLC__CL_SYM
    mlc__cl.state = ok ? 1 : -1;
    return ok;
}

/* ============================================================================================
   @section cl-devices  Devices: every platform's devices, numbered in order (N in "opencl:N")
   ============================================================================================ */

#define MLC__CL_MAX_DEVICES 64

/* Fill ids (up to MLC__CL_MAX_DEVICES) and return how many devices there are. */
static int mlc__cl_enumerate(cl_platform_id *platforms, cl_device_id *devices) {
    cl_platform_id ps[16];
    cl_uint np = 0, p;
    int count = 0;
    if (!mlc__cl_load() || mlc__cl.GetPlatformIDs(16, ps, &np) != CL_SUCCESS) return 0;
    if (np > 16) np = 16;
    for (p = 0; p < np; p++) {
        cl_device_id ds[MLC__CL_MAX_DEVICES];
        cl_uint nd = 0, d;
        if (mlc__cl.GetDeviceIDs(ps[p], CL_DEVICE_TYPE_ALL, MLC__CL_MAX_DEVICES, ds, &nd) != CL_SUCCESS)
            continue;
        if (nd > MLC__CL_MAX_DEVICES) nd = MLC__CL_MAX_DEVICES;
        for (d = 0; d < nd && count < MLC__CL_MAX_DEVICES; d++, count++) {
            platforms[count] = ps[p];
            devices[count] = ds[d];
        }
    }
    return count;
}

/* A string property of a platform (device NULL) or a device, trimmed, cut to fit. */
static void mlc__cl_string(cl_platform_id platform, cl_device_id device, cl_uint param, char *out,
                           size_t cap) {
    char tmp[1024];
    size_t size = 0, start = 0;
    cl_int err = device ? mlc__cl.GetDeviceInfo(device, param, sizeof tmp - 1, tmp, &size)
                        : mlc__cl.GetPlatformInfo(platform, param, sizeof tmp - 1, tmp, &size);
    if (err != CL_SUCCESS || size > sizeof tmp - 1) size = 0;
    tmp[size] = '\0';
    while (size && (tmp[size - 1] == '\0' || tmp[size - 1] == ' ' || tmp[size - 1] == '\n'))
        tmp[--size] = '\0';
    while (tmp[start] == ' ') start++;
    if (size - start >= cap) size = start + cap - 1;
    memcpy(out, tmp + start, size - start);
    out[size - start] = '\0';
}

static void mlc__cl_describe(cl_platform_id platform, cl_device_id device, int index, mlc_device_info *info) {
    cl_device_type type = 0;
    cl_ulong memory = 0;
    cl_uint units = 0;
    memset(info, 0, sizeof *info);
    info->index = index;
    mlc__cl_string(platform, NULL, CL_PLATFORM_NAME, info->platform, sizeof info->platform);
    mlc__cl_string(platform, device, CL_DEVICE_NAME, info->name, sizeof info->name);
    mlc__cl_string(platform, device, CL_DEVICE_VERSION, info->version, sizeof info->version);
    mlc__cl.GetDeviceInfo(device, CL_DEVICE_TYPE, sizeof type, &type, NULL);
    mlc__cl.GetDeviceInfo(device, CL_DEVICE_GLOBAL_MEM_SIZE, sizeof memory, &memory, NULL);
    mlc__cl.GetDeviceInfo(device, CL_DEVICE_MAX_COMPUTE_UNITS, sizeof units, &units, NULL);
    info->type = type & CL_DEVICE_TYPE_GPU ? "gpu" : type & CL_DEVICE_TYPE_CPU ? "cpu"
               : type & CL_DEVICE_TYPE_ACCELERATOR ? "accelerator" : "other";
    info->memory_bytes = memory > (cl_ulong)(size_t)-1 ? (size_t)-1 : (size_t)memory;
    info->compute_units = (int)units;
}

static int mlc__cl_devices(mlc_device_info *out, int max) {
    cl_platform_id platforms[MLC__CL_MAX_DEVICES];
    cl_device_id devices[MLC__CL_MAX_DEVICES];
    int count = mlc__cl_enumerate(platforms, devices), i;
    for (i = 0; out && i < max && i < count; i++) mlc__cl_describe(platforms[i], devices[i], i, &out[i]);
    return count;
}

/* ============================================================================================
   @section cl-state  The context's state: queue, program, kernels, and the buffer lists
   ============================================================================================ */


/* Every kernel of the program by name; the cache is indexed by MLC__CL_K_<name>, so it has
   a slot for each kernel, however many the program holds. */
#define MLC__CL_KERNELS(X) \
    X(gemm_64x64) X(gemm_128x64) X(fill) X(copy) X(cast) X(accumulate) X(unary) X(unary_grad) X(binary) \
    X(binary_grad) X(sgd) X(adam) X(rmsprop) X(gemm_vector) X(column_sums) X(im2col) X(col2im) \
    X(conv_layout) X(conv_bias_grad) X(depthwise) X(depthwise_grad_x) X(depthwise_grad_w) X(pool) \
    X(pool_grad) X(reduce) X(reduce_grad) X(softmax) \
    X(softmax_grad) X(cumsum) X(class_loss) X(class_loss_grad) X(pointwise_loss) X(pointwise_loss_grad) \
    X(loss_total) X(layer_norm) X(layer_norm_grad) X(layer_norm_stats) X(layer_norm_param_grad) \
    X(batch_norm) X(batch_norm_grad) X(dropout) X(dropout_grad) X(copy_rows) X(permute) X(index_select) \
    X(index_select_grad) X(gather) X(gather_grad) X(where) X(where_grad) X(attention) X(attention_grad_q) \
    X(attention_grad_kv)
#define MLC__CL_KERNEL_ID(name) MLC__CL_K_##name,
enum { MLC__CL_KERNELS(MLC__CL_KERNEL_ID) MLC__CL_KERNEL_COUNT };
#undef MLC__CL_KERNEL_ID
#define MLC__CL_KERNEL_NAME(name) "mlc_" #name,
static const char *const mlc__cl_kernel_names[] = { MLC__CL_KERNELS(MLC__CL_KERNEL_NAME) };
#undef MLC__CL_KERNEL_NAME

#define MLC__CL_SLOTS 8                 /* the most parameters an optimiser launch takes */

typedef struct mlc__cl_state {
    cl_context context;
    cl_command_queue queue;             /* in order: each command sees the ones before it */
    cl_device_id device;
    cl_program program;                 /* built on the first kernel use */
    cl_kernel kernels[MLC__CL_KERNEL_COUNT];   /* created on first use */
    size_t kernel_local[MLC__CL_KERNEL_COUNT];  /* their work-group sizes */
    size_t max_alloc;                   /* CL_DEVICE_MAX_MEM_ALLOC_SIZE */
    size_t max_args;                    /* CL_DEVICE_MAX_PARAMETER_SIZE: bytes of a launch's arguments
                                           (tests: smaller, before the first launch) */
    int slots;                          /* parameters an optimiser launch takes (mlc__cl_build) */
    int exact_divide;                   /* the device can round / and sqrt correctly */
    int gemm_vector;                    /* products by mlc_gemm_vector (CPU devices), else tiled */
    int gemm_tile_rows;                 /* tests, bench: 64 or 128 rows a tile; 0: mlc's choice */
    size_t compute_units;               /* CL_DEVICE_MAX_COMPUTE_UNITS */
    int pending;                        /* uploads not waited for since the last wait */
    const char *op;                     /* the op being run, for messages */
    char name[128];
} mlc__cl_state;

static mlc__cl_state *mlc__cl_st(mlc_ctx *ctx) { return (mlc__cl_state *)ctx->device; }

static const char *mlc__cl_error_name(cl_int err) {
    switch (err) {
    case CL_MEM_OBJECT_ALLOCATION_FAILURE: return "CL_MEM_OBJECT_ALLOCATION_FAILURE";
    case CL_OUT_OF_RESOURCES: return "CL_OUT_OF_RESOURCES";
    case CL_OUT_OF_HOST_MEMORY: return "CL_OUT_OF_HOST_MEMORY";
    case CL_INVALID_VALUE: return "CL_INVALID_VALUE";
    case CL_INVALID_MEM_OBJECT: return "CL_INVALID_MEM_OBJECT";
    case CL_INVALID_KERNEL_ARGS: return "CL_INVALID_KERNEL_ARGS";
    case CL_INVALID_ARG_SIZE: return "CL_INVALID_ARG_SIZE";
    case CL_INVALID_WORK_GROUP_SIZE: return "CL_INVALID_WORK_GROUP_SIZE";
    case CL_EXEC_STATUS_ERROR_FOR_EVENTS_IN_WAIT_LIST: return "CL_EXEC_STATUS_ERROR_FOR_EVENTS_IN_WAIT_LIST";
    default: return "see CL/cl.h";
    }
}

/* Turn an OpenCL result into mlc's error; 1 when it is CL_SUCCESS. */
static int mlc__cl_check(mlc_ctx *ctx, cl_int err, const char *what) {
    const char *op = ctx->device && mlc__cl_st(ctx)->op ? mlc__cl_st(ctx)->op : "opencl";
    if (err == CL_SUCCESS) return 1;
    if (err == CL_MEM_OBJECT_ALLOCATION_FAILURE || err == CL_OUT_OF_HOST_MEMORY)
        mlc__fail(ctx, MLC_ERR_MEMORY, "opencl: out of device memory: %s failed (%d) in %s (%s)", what,
                  (int)err, op, mlc__cl_error_name(err));
    else
        mlc__fail(ctx, MLC_ERR_DEVICE, "opencl: %s failed (%d) in %s (%s)", what, (int)err, op,
                  mlc__cl_error_name(err));
    return 0;
}

/* The backend's buffers; mlc__device_alloc keeps the books (frames, spares, long-lived). */
static void *mlc__cl_create(mlc_ctx *ctx, size_t bytes) {
    mlc__cl_state *st = mlc__cl_st(ctx);
    cl_int err = CL_SUCCESS;
    cl_mem mem;
    if (bytes > st->max_alloc) {
        mlc__fail(ctx, MLC_ERR_MEMORY, "opencl: out of device memory allocating %zu bytes for %s "
                  "(the largest buffer %s allows is %zu bytes)", bytes, st->op, st->name, st->max_alloc);
        return NULL;
    }
    mem = mlc__cl.CreateBuffer(st->context, CL_MEM_READ_WRITE, bytes, NULL, &err);
    if (!mem && err != CL_MEM_OBJECT_ALLOCATION_FAILURE && err != CL_OUT_OF_RESOURCES
        && err != CL_OUT_OF_HOST_MEMORY && err != CL_INVALID_BUFFER_SIZE)
        /* not just full */
        mlc__cl_check(ctx, err == CL_SUCCESS ? CL_INVALID_VALUE : err, "clCreateBuffer");
    return (void *)mem;
}
static void mlc__cl_release(mlc_ctx *ctx, void *buffer) {
    (void)ctx;
    mlc__cl.ReleaseMemObject((cl_mem)buffer);
}

/* A tensor's buffer (made when missing), and a scratch one of n floats for the op being run. */
static cl_mem mlc__cl_buffer(mlc_ctx *ctx, mlc_tensor *t, int grad) {
    return (cl_mem)mlc__buffer_of(t, grad, mlc__cl_st(ctx)->op);
}
static cl_mem mlc__cl_scratch(mlc_ctx *ctx, size_t n) {
    return (cl_mem)mlc__device_alloc(ctx, NULL, n * sizeof(float), mlc__cl_st(ctx)->op);
}

/* ============================================================================================
   @section cl-kernels  Kernels: the source, the lazy build, and the launcher
   Every kernel is 1-D over n elements, its global size rounded up to the work-group size and
   guarded with `if (i >= n) return;`. The formulas are mlc.h's, in the same order of
   operations, with contraction into fma turned off, so results match the CPU to a few ulp.
   ============================================================================================ */

#define MLC__CL_STR_(x) #x
#define MLC__CL_STR(x) MLC__CL_STR_(x)

/* Pieces of the program, each under the 4095 characters C99 promises for one literal. The
   program is mlc__cl_formulas then mlc__cl_source. mlc__cl_formulas is made from mlc.h's
   tables alone (MLC__FORMULA_HELPERS, MLC__UNARY_KINDS), so it builds by itself
   (mlc__cl_check_formulas): a formula that calls a helper no row defines fails there, by name. */
static const char *const mlc__cl_formulas[] = {
"/* mlc.h's formula helpers (MLC__FORMULA_HELPERS), the same text compiled here */\n"
"#define MLC__SQRT_2_OVER_PI " MLC__CL_STR(MLC__SQRT_2_OVER_PI) "\n"
"#define MLC__INV_SQRT_2 " MLC__CL_STR(MLC__INV_SQRT_2) "\n"
"#define MLC__INV_SQRT_2PI " MLC__CL_STR(MLC__INV_SQRT_2PI) "\n"
"#define MLC_EXPF exp\n#define MLC_LOGF log\n#define MLC_LOG1PF log1p\n#define MLC_SQRTF sqrt\n"
"#define MLC_ERFF erf\n#define MLC_POWF pow\n#define MLC_TANHF mlc__tanhf\n"
"#define uint32_t uint\n#define int32_t int\n#define MLC__INLINE inline\n"
"#define mlc__float_bits as_uint\n#define mlc__bits_float as_float\n"
/* each helper a piece of its own */
#define MLC__CL_HELPER(type, name, params, ...) #type " " #name #params " " #__VA_ARGS__ "\n",
MLC__FORMULA_HELPERS(MLC__CL_HELPER)
#undef MLC__CL_HELPER
"/* a gradient's element written as v + beta g (beta 1: v added to g; beta 0: g counts as zeros\n"
"   and is not read, so the kernel writes over it: mlc__device_grad_to_overwrite in mlc.h) */\n"
"float mlc_plus(float beta, __global const float *g, float v) { return beta != 0.0f ? beta * *g + v : v; }\n",
"/* unary: y = f(x), each kind's f from MLC__UNARY_KINDS in mlc.h; p, q: the op's parameters */\n"
"__kernel void mlc_unary(int kind, ulong n, __global const float *xs, __global float *ys, float p, float q)"
" {\n"
"    size_t i = get_global_id(0);\n"
"    float x, y = 0.0f;\n"
"    if (i >= n) return;\n"
"    x = xs[i];\n"
"    switch (kind) {\n"
#define MLC__CL_UNARY_FORWARD(NAME, name, f, df) "    case MLC__UNARY_" #NAME ": y = " #f "; break;\n"
MLC__UNARY_KINDS(MLC__CL_UNARY_FORWARD)
#undef MLC__CL_UNARY_FORWARD
"    }\n"
"    ys[i] = y;\n"
"}\n",
"/* unary backward: gx = g f'(x) + beta gx (beta 0: gx is not read), given x and y = f(x), each\n"
"   kind's f' from MLC__UNARY_KINDS */\n"
"__kernel void mlc_unary_grad(int kind, ulong n, __global const float *xs, __global const float *ys,\n"
"                             __global const float *g, __global float *gx, float p, float q, float beta) {\n"
"    size_t i = get_global_id(0);\n"
"    float x, y, d = 0.0f;\n"
"    if (i >= n) return;\n"
"    x = xs[i]; y = ys[i];\n"
"    switch (kind) {\n"
#define MLC__CL_UNARY_GRAD(NAME, name, f, df) "    case MLC__UNARY_" #NAME ": d = " #df "; break;\n"
MLC__UNARY_KINDS(MLC__CL_UNARY_GRAD)
#undef MLC__CL_UNARY_GRAD
"    }\n"
"    gx[i] = mlc_plus(beta, gx + i, g[i] * d);\n"
"}\n",
};

static const char *const mlc__cl_source[] = {
"/* fill: x = v */\n"
"__kernel void mlc_fill(ulong n, __global float *x, float v) {\n"
"    size_t i = get_global_id(0);\n"
"    if (i < n) x[i] = v;\n"
"}\n"
"/* copy: y = x;  accumulate, the backward of reshape and copy: dx += g */\n"
"__kernel void mlc_copy(ulong n, __global const float *x, __global float *y) {\n"
"    size_t i = get_global_id(0);\n"
"    if (i < n) y[i] = x[i];\n"
"}\n"
"__kernel void mlc_accumulate(ulong n, __global const float *g, __global float *gx) {\n"
"    size_t i = get_global_id(0);\n"
"    if (i < n) gx[i] += g[i];\n"
"}\n"
"/* cast: y = x in another dtype (0 float32, 1 bfloat16, 2 float16: mlc_scalar_type), as the CPU\n"
"   rounds: to nearest even, NaN quiet (bf16 0x7fc0; f16 its sign kept, payload dropped) */\n"
"__kernel void mlc_cast(ulong n, int from, int to, __global const uchar *x, __global uchar *y) {\n"
"    size_t i = get_global_id(0);\n"
"    float v;\n"
"    uint b;\n"
"    if (i >= n) return;\n"
"    v = from == 0 ? ((__global const float *)x)[i] : from == 2 ? vload_half(i, (__global const half *)x)\n"
"                  : as_float((uint)((__global const ushort *)x)[i] << 16);\n"
"    b = as_uint(v);\n"
"    if (to == 0) ((__global float *)y)[i] = isnan(v) ? as_float(b | 0x400000u) : v;\n"
"    else if (to == 1)\n"
"        ((__global ushort *)y)[i] = isnan(v) ? 0x7fc0 : (ushort)((b + 0x7fffu + (b >> 16 & 1u)) >> 16);\n"
"    else if (isnan(v)) ((__global ushort *)y)[i] = (ushort)(b >> 16 & 0x8000u | 0x7e00u);\n"
"    else vstore_half_rte(v, i, (__global half *)y);\n"
"}\n",

"/* binary with broadcasting, over nd <= 6 dimensions (size-1 dimensions dropped, contiguous\n"
"   runs merged): operand k's element at output index i is at sum_d c_d stride_k[d], with\n"
"   stride 0 where it is stretched. The ulong8 arguments come first, where they need no padding\n"
"   (then 240 and 248 bytes of arguments, within the 256 every device takes).\n"
"     y = a + b   da = g      db = g\n"
"     y = a - b   da = g      db = -g\n"
"     y = a * b   da = g b    db = g a\n"
"     y = a / b   da = g / b  db = -g a / b^2 */\n"
"#define MLC_LANES(v) { v.s0, v.s1, v.s2, v.s3, v.s4, v.s5, v.s6, v.s7 }   /* a ulong8 as an array */\n"
"__kernel void mlc_binary(ulong8 shape8, ulong8 sa8, ulong8 sb8, int kind, ulong n, int nd,\n"
"                         __global const float *a, __global const float *b, __global float *y) {\n"
"    size_t i = get_global_id(0);\n"
"    ulong shape[8] = MLC_LANES(shape8), sa[8] = MLC_LANES(sa8), sb[8] = MLC_LANES(sb8), r = i, oa = 0, ob ="
" 0;\n"
"    float x, z;\n"
"    int d;\n"
"    if (i >= n) return;\n"
"    for (d = nd - 1; d >= 0; d--) {\n"
"        ulong c = r % shape[d];\n"
"        r /= shape[d];\n"
"        oa += c * sa[d]; ob += c * sb[d];\n"
"    }\n"
"    x = a[oa]; z = b[ob];\n"
"    y[i] = kind == MLC__BINARY_ADD ? x + z : kind == MLC__BINARY_SUB ? x - z\n"
"         : kind == MLC__BINARY_MUL ? x * z : x / z;\n"
"}\n"
"/* binary backward for one operand (side 0: a, 1: b): one work-item per element j of it,\n"
"   summing over the positions it was stretched to, in the output's order (as the CPU does) */\n"
"__kernel void mlc_binary_grad(ulong8 shape8, ulong8 self8, ulong8 other8, int kind, int side, ulong n,\n"
"                              int nd,\n"
"                              __global const float *g, __global const float *a, __global const float *b,\n"
"                              __global float *gs) {\n"
"    size_t j = get_global_id(0);\n"
"    ulong shape[8] = MLC_LANES(shape8), sself[8] = MLC_LANES(self8), sother[8] = MLC_LANES(other8);\n"
"    ulong sout[8], r = j, m = 1, out0 = 0, other0 = 0, s;\n"
"    float acc;\n"
"    int d;\n"
"    if (j >= n) return;\n"
"    for (d = nd - 1, s = 1; d >= 0; d--) { sout[d] = s; s *= shape[d]; }\n"
"    for (d = nd - 1; d >= 0; d--) {             /* j's own coordinates */\n"
"        ulong c;\n"
"        if (sself[d] == 0) { m *= shape[d]; continue; }\n"
"        c = r % shape[d]; r /= shape[d];\n"
"        out0 += c * sout[d]; other0 += c * sother[d];\n"
"    }\n"
"    acc = gs[j];\n"
"    for (s = 0; s < m; s++) {                   /* the stretched coordinates */\n"
"        ulong t = s, o = out0, q = other0;\n"
"        float gv;\n"
"        for (d = nd - 1; d >= 0; d--) if (sself[d] == 0) {\n"
"            ulong c = t % shape[d];\n"
"            t /= shape[d];\n"
"            o += c * sout[d]; q += c * sother[d];\n"
"        }\n"
"        gv = g[o];\n"
"        if (kind == MLC__BINARY_ADD) acc += gv;\n"
"        else if (kind == MLC__BINARY_SUB) acc = side == 0 ? acc + gv : acc - gv;\n"
"        else if (kind == MLC__BINARY_MUL) acc += gv * (side == 0 ? b[q] : a[q]);\n"
"        else if (side == 0) acc += gv / b[q];\n"
"        else acc -= gv * a[q] / (b[j] * b[j]);\n"
"    }\n"
"    gs[j] = acc;\n"
"}\n",

"/* optimisers, as mlc__sgd_update, mlc__adam_update and mlc__rmsprop_update, over a group of up to\n"
"   MLC_SLOT_COUNT parameters in one launch (OpenCL 1.2 passes no array of buffers; 8, or 4 where the\n"
"   device takes too few bytes of arguments: mlc__cl_build says): slot k holds parameter sp<k> of\n"
"   sizes.s<k> elements, its gradient sg<k> and state buffers sa<k>, sb<k>, sc<k> (stand-ins where the\n"
"   rule keeps none), from work-item starts.s<k> on, a multiple of the work-group size, so that a\n"
"   work-group finds one slot (unused slots start past the launch). A work-item finds its slot with\n"
"   selects, not branches (branches keep PoCL from vectorising the work-items), its p, g, state\n"
"   buffers (named as the rule names them) and j, its element there. */\n"
"#define MLC_SLOT(k) __global float *sp##k, __global const float *sg##k, __global float *sa##k, \\\n"
"    __global float *sb##k, __global float *sc##k\n"
"#if MLC_SLOT_COUNT == 8\n"
"#define MLC_SLOTS ulong8 starts, ulong8 sizes, MLC_SLOT(0), MLC_SLOT(1), MLC_SLOT(2), MLC_SLOT(3), \\\n"
"    MLC_SLOT(4), MLC_SLOT(5), MLC_SLOT(6), MLC_SLOT(7)\n"
"#define MLC_PAST_4_TO_7(X, Y, Z) MLC_PAST(4, X, Y, Z) MLC_PAST(5, X, Y, Z) MLC_PAST(6, X, Y, Z) \\\n"
"    MLC_PAST(7, X, Y, Z)\n"
"#else\n"
"#define MLC_SLOTS ulong4 starts, ulong4 sizes, MLC_SLOT(0), MLC_SLOT(1), MLC_SLOT(2), MLC_SLOT(3)\n"
"#define MLC_PAST_4_TO_7(X, Y, Z)\n"
"#endif\n"
"#define MLC_PAST(k, X, Y, Z) in = base >= starts.s##k; \\\n"
"    start = in ? starts.s##k : start; n = in ? sizes.s##k : n; p = in ? sp##k : p; g = in ? sg##k : g; \\\n"
"    X = in ? sa##k : X; Y = in ? sb##k : Y; Z = in ? sc##k : Z;\n"
"#define MLC_FIND_SLOT(X, Y, Z) \\\n"
"    ulong base = get_group_id(0) * get_local_size(0), start = 0, n = sizes.s0; \\\n"
"    __global float *p = sp0, *X = sa0, *Y = sb0, *Z = sc0; \\\n"
"    __global const float *g = sg0; \\\n"
"    size_t j; \\\n"
"    int in; \\\n"
"    MLC_PAST(1, X, Y, Z) MLC_PAST(2, X, Y, Z) MLC_PAST(3, X, Y, Z) MLC_PAST_4_TO_7(X, Y, Z) \\\n"
"    j = get_global_id(0) - start; \\\n"
"    if (j >= n) return;\n",

"/* SGD   g += wd p;  b = mu b + (1 - tau) g (b = g at t = 1);  g = nesterov ? g + mu b : b;  p -= lr g */\n"
"__kernel void mlc_sgd(MLC_SLOTS, float lr, float wd, float mu, float keep, int first, int nesterov) {\n"
"    float gj;\n"
"    MLC_FIND_SLOT(buf, unused_b, unused_c)\n"
"    if (mu == 0.0f) { p[j] -= lr * (g[j] + wd * p[j]); return; }\n"
"    gj = g[j] + wd * p[j];\n"
"    buf[j] = mlc__flush(first ? gj : mu * buf[j] + keep * gj);\n"
"    p[j] -= lr * (nesterov ? gj + mu * buf[j] : buf[j]);\n"
"}\n"
"/* Adam  g += l2 p;  m = b1 m + (1-b1) g;  v = b2 v + (1-b2) g^2;  p = p shrink - step m / (sqrt(v inv_bc2)"
" + eps)\n"
"   (Adam: l2 = wd, shrink = 1; AdamW: l2 = 0, shrink = 1 - lr wd; step = lr / (1 - b1^t), inv_bc2 = 1 / (1"
" - b2^t));\n"
"   amsgrad: vmax = max(vmax, v), and vmax in the place of v */\n"
"__kernel void mlc_adam(MLC_SLOTS, float b1, float b2, float eps, float l2, float shrink, float step,\n"
"                       float inv_bc2, int amsgrad) {\n"
"    float gj;\n"
"    MLC_FIND_SLOT(m, v, vmax)\n"
"    gj = g[j] + l2 * p[j];\n"
"    m[j] = mlc__flush(b1 * m[j] + (1.0f - b1) * gj);\n"
"    v[j] = mlc__flush(b2 * v[j] + (1.0f - b2) * gj * gj);\n"
"    if (amsgrad) vmax[j] = vmax[j] > v[j] ? vmax[j] : v[j];\n"
"    p[j] = p[j] * shrink - step * m[j] / (sqrt((amsgrad ? vmax[j] : v[j]) * inv_bc2) + eps);\n"
"}\n"
"/* RMSprop  g += wd p;  v = a v + (1-a) g^2;  avg = sqrt(v - mean^2) + eps (centered, mean = a mean + (1-a)"
" g)\n"
"   or sqrt(v) + eps;  with momentum: b = mu b + g / avg, p -= lr b;  else p -= lr g / avg */\n"
"__kernel void mlc_rmsprop(MLC_SLOTS, float lr, float wd, float a, float eps, float mu, int centered) {\n"
"    float gj, avg;\n"
"    MLC_FIND_SLOT(buf, sq, mean)\n"
"    gj = g[j] + wd * p[j];\n"
"    sq[j] = mlc__flush(a * sq[j] + (1.0f - a) * gj * gj);\n"
"    if (centered) mean[j] = mlc__flush(a * mean[j] + (1.0f - a) * gj);\n"
"    avg = sqrt(centered ? sq[j] - mean[j] * mean[j] : sq[j]) + eps;\n"
"    if (mu > 0.0f) { buf[j] = mlc__flush(mu * buf[j] + gj / avg); p[j] -= lr * buf[j]; }\n"
"    else p[j] -= lr * gj / avg;\n"
"}\n",
"/* ---- matrix products: C[b] = op(A[b]) op(B[b]) + beta C[b] (+ bias[j]) ---- */\n"
"/* GPUs: a 16 x 16 work-group computes a (16 WM) x (16 WN) tile of C, each work-item WM x WN\n"
"   elements (rows lr + 16 i, columns lc + 16 j), from 16-deep slices of op(A) and op(B) in local\n"
"   memory. Each work-item loads its share of the next slice into registers (ra, rb) while the\n"
"   group multiplies the current one; loads run along whichever index is contiguous in memory\n"
"   (k for A untransposed, the row for A transposed; the column for B, k for B transposed).\n"
"   Tiles of 64 x 64 (WM = WN = 4) and 128 x 64 (WM = 8): the larger 128 x 128 tile (8 x 8 each)\n"
"   measured slower (figures: bench/RESULTS.md). With split > 0, the third index is a slice of\n"
"   k (split deep, from get_global_id(2) split) instead of a batch: each slice's product goes to\n"
"   its own C, which mlc_column_sums then adds up (mlc__cl_gemm). */\n"
"float mlc_gemm_a(__global const float *A, int ta, int M, int K, int k_end, int row, int k) {\n"
"    return row < M && k < k_end ? (ta ? A[k * M + row] : A[row * K + k]) : 0.0f;\n"
"}\n"
"float mlc_gemm_b(__global const float *B, int tb, int N, int K, int k_end, int col, int k) {\n"
"    return col < N && k < k_end ? (tb ? B[col * K + k] : B[k * N + col]) : 0.0f;\n"
"}\n"
"\n",
"void mlc_gemm_tile(const int WM, const int WN, int M, int N, int K, int k_begin, int k_end,\n"
"                   int ta, int tb, __global const float *A, __global const float *B, __global float *C,\n"
"                   float beta, __global const float *bias, int has_bias, __local float *As,\n"
"                   __local float *Bs) {\n"
"    const int TM = 16 * WM, TN = 16 * WN;      /* As[k (TM + 1) + m] = op(A)[row0 + m, k0 + k] */\n"
"    int lc = get_local_id(0), lr = get_local_id(1), id = lr * 16 + lc;\n"
"    int row0 = get_group_id(1) * TM, col0 = get_group_id(0) * TN, k0, k, i, j, t;\n"
"    int am[8], ak[8], bn[8], bk[8];              /* where this work-item's loads go in a slice */\n"
"    float acc[8][8], a[8], b[8], ra[8], rb[8];\n"
"    for (t = 0; t < WM; t++) {\n"
"        int e = t * 256 + id;\n"
"        am[t] = ta ? e % TM : e / 16; ak[t] = ta ? e / TM : e % 16;\n"
"        ra[t] = mlc_gemm_a(A, ta, M, K, k_end, row0 + am[t], k_begin + ak[t]);\n"
"    }\n"
"    for (t = 0; t < WN; t++) {\n"
"        int e = t * 256 + id;\n"
"        bn[t] = tb ? e / 16 : e % TN; bk[t] = tb ? e % 16 : e / TN;\n"
"        rb[t] = mlc_gemm_b(B, tb, N, K, k_end, col0 + bn[t], k_begin + bk[t]);\n"
"    }\n"
"    for (i = 0; i < WM; i++) for (j = 0; j < WN; j++) acc[i][j] = 0.0f;\n"
"    for (k0 = k_begin; k0 < k_end; k0 += 16) {\n"
"        for (t = 0; t < WM; t++) As[ak[t] * (TM + 1) + am[t]] = ra[t];\n"
"        for (t = 0; t < WN; t++) Bs[bk[t] * (TN + 1) + bn[t]] = rb[t];\n"
"        barrier(CLK_LOCAL_MEM_FENCE);\n"
"        for (t = 0; t < WM; t++) ra[t] = mlc_gemm_a(A, ta, M, K, k_end, row0 + am[t], k0 + 16 + ak[t]);\n"
"        for (t = 0; t < WN; t++) rb[t] = mlc_gemm_b(B, tb, N, K, k_end, col0 + bn[t], k0 + 16 + bk[t]);\n"
"        for (k = 0; k < 16; k++) {\n"
"            for (i = 0; i < WM; i++) a[i] = As[k * (TM + 1) + lr + 16 * i];\n"
"            for (j = 0; j < WN; j++) b[j] = Bs[k * (TN + 1) + lc + 16 * j];\n"
"            for (i = 0; i < WM; i++) for (j = 0; j < WN; j++) acc[i][j] = fma(a[i], b[j], acc[i][j]);\n"
"        }\n"
"        barrier(CLK_LOCAL_MEM_FENCE);\n"
"    }\n"
"    for (i = 0; i < WM; i++)\n"
"        for (j = 0; j < WN; j++) {\n"
"            int row = row0 + lr + 16 * i, col = col0 + lc + 16 * j;\n"
"            if (row < M && col < N) {\n"
"                float c = acc[i][j] + (has_bias ? bias[col] : 0.0f);\n"
"                C[row * N + col] = beta != 0.0f ? c + beta * C[row * N + col] : c;\n"
"            }\n"
"        }\n"
"}\n"
"#define MLC_GEMM_ARGS int M, int N, int K, int ta, int tb, __global const float *A, ulong offA, \\\n"
"    ulong stepA, __global const float *B, ulong offB, ulong stepB, __global float *C, ulong offC, \\\n"
"    ulong stepC, float beta, __global const float *bias, int has_bias, int split\n"
"#define MLC_K_BEGIN (split ? (int)get_global_id(2) * split : 0)\n"
"#define MLC_K_END (split ? min(K, (int)get_global_id(2) * split + split) : K)\n"
"#define MLC_GEMM_TILE(WM, WN) mlc_gemm_tile(WM, WN, M, N, K, MLC_K_BEGIN, MLC_K_END, ta, tb, \\\n"
"    A + offA + get_global_id(2) * stepA, B + offB + get_global_id(2) * stepB, \\\n"
"    C + offC + get_global_id(2) * stepC, beta, bias, has_bias, As, Bs)\n"
"__kernel __attribute__((reqd_work_group_size(16, 16, 1))) void mlc_gemm_64x64(MLC_GEMM_ARGS) {\n"
"    __local float As[16 * 65], Bs[16 * 65];\n"
"    MLC_GEMM_TILE(4, 4);\n"
"}\n"
"__kernel __attribute__((reqd_work_group_size(16, 16, 1))) void mlc_gemm_128x64(MLC_GEMM_ARGS) {\n"
"    __local float As[16 * 129], Bs[16 * 65];\n"
"    MLC_GEMM_TILE(8, 4);\n"
"}\n"
"\n",
"/* The same product for CPU devices: each work-item keeps a 4 x 8 block of C in four float8\n"
"   registers (explicit vectors are what a CPU's OpenCL compiler turns into SIMD), k ascending */\n"
"__kernel void mlc_gemm_vector(int M, int N, int K, int ta, int tb,\n"
"                              __global const float *A, ulong offA, ulong stepA,\n"
"                              __global const float *B, ulong offB, ulong stepB,\n"
"                              __global float *C, ulong offC, ulong stepC, float beta,\n"
"                              __global const float *bias, int has_bias, int split) {\n"
"    int c0 = get_global_id(0) * 8, r0 = get_global_id(1) * 4, batch = get_global_id(2), i, j, k;\n"
"    int k_begin = MLC_K_BEGIN, k_end = MLC_K_END;\n"
"    float8 acc[4] = { (float8)(0.0f), (float8)(0.0f), (float8)(0.0f), (float8)(0.0f) };\n"
"    if (r0 >= M || c0 >= N) return;\n"
"    A += offA + batch * stepA; B += offB + batch * stepB; C += offC + batch * stepC;\n"
"    if (r0 + 4 <= M && c0 + 8 <= N) {\n"
"        for (k = k_begin; k < k_end; k++) {\n"
"            float8 b = tb ? (float8)(B[c0 * K + k], B[(c0 + 1) * K + k], B[(c0 + 2) * K + k], B[(c0 + 3) *"
" K + k],\n"
"                                     B[(c0 + 4) * K + k], B[(c0 + 5) * K + k], B[(c0 + 6) * K + k], B[(c0 +"
" 7) * K + k])\n"
"                          : vload8(0, B + k * N + c0);\n"
"            for (i = 0; i < 4; i++) acc[i] += (ta ? A[k * M + r0 + i] : A[(r0 + i) * K + k]) * b;\n"
"        }\n"
"        for (i = 0; i < 4; i++) {\n"
"            float8 c = acc[i] + (has_bias ? vload8(0, bias + c0) : (float8)(0.0f));\n"
"            if (beta != 0.0f) c += beta * vload8(0, C + (r0 + i) * N + c0);\n"
"            vstore8(c, 0, C + (r0 + i) * N + c0);\n"
"        }\n"
"        return;\n"
"    }\n"
"    for (i = r0; i < M && i < r0 + 4; i++)                 /* a block on the edge of C */\n"
"        for (j = c0; j < N && j < c0 + 8; j++) {\n"
"            float s = 0.0f, c;\n"
"            for (k = k_begin; k < k_end; k++)\n"
"                s += (ta ? A[k * M + i] : A[i * K + k]) * (tb ? B[j * K + k] : B[k * N + j]);\n"
"            c = s + (has_bias ? bias[j] : 0.0f);\n"
"            C[i * N + j] = beta != 0.0f ? c + beta * C[i * N + j] : c;\n"
"        }\n"
"}\n"
"\n",
"/* db[j] = Σ_r dC[r, j] + beta db[j]  (linear's bias; a split product's slices, db at offset off;\n"
"   beta 0: db is not read) */\n"
"__kernel void mlc_column_sums(int rows, int N, __global const float *g, __global float *db, ulong off,\n"
"                              float beta) {\n"
"    int j = get_global_id(0), r;\n"
"    float s = 0.0f;\n"
"    if (j >= N) return;\n"
"    db += off;\n"
"    for (r = 0; r < rows; r++) s += g[r * N + j];\n"
"    db[j] = mlc_plus(beta, db + j, s);\n"
"}\n",
"/* ---- sums by work-groups: a kernel launched as one work-group per slice (a channel, a weight;\n"
"   mlc__cl_run_groups) has each work-item sum a share, compensated, then adds the shares in\n"
"   pairs in local memory (work-groups hold at most 256 items: mlc__cl_kernel). Every item calls\n"
"   mlc_group_sum, outside any branch: PoCL loses the items' ids after a barrier under a branch,\n"
"   even one every item takes. ---- */\n"
"/* a sum a = (s, c) plus v, compensated (Kahan): s - c is the sum */\n"
"float2 mlc_kahan_add(float2 a, float v) {\n"
"    float y = v - a.y, t = a.x + y;\n"
"    return (float2)(t, (t - a.x) - y);\n"
"}\n"
"/* [N, C, inner]'s element e of channel c's N inner (image e / inner, place e % inner) */\n"
"int mlc_channel_at(int e, int C, int inner, int c) { return (e / inner * C + c) * inner + e % inner; }\n"
"/* the group's Σ (s - c), returned to every work-item; ps, pc: 256 floats of local memory each */\n"
"float mlc_group_sum(float2 a, __local float *ps, __local float *pc) {\n"
"    int id = get_local_id(0), L = get_local_size(0), step;\n"
"    float total;\n"
"    ps[id] = a.x; pc[id] = a.y;\n"
"    barrier(CLK_LOCAL_MEM_FENCE);\n"
"    for (step = 1; step < L; step *= 2) {\n"
"        if (id % (2 * step) == 0 && id + step < L) {\n"
"            float u = ps[id], v = ps[id + step], t = u + v;\n"
"            ps[id] = t;\n"
"            pc[id] += pc[id + step] - (fabs(u) >= fabs(v) ? (u - t) + v : (v - t) + u);   /* t's loss */\n"
"        }\n"
"        barrier(CLK_LOCAL_MEM_FENCE);\n"
"    }\n"
"    total = ps[0] - pc[0];\n"
"    barrier(CLK_LOCAL_MEM_FENCE);                    /* ps and pc free for the next sum */\n"
"    return total;\n"
"}\n",
"/* ---- convolution over a chunk of nb images: im2col, one GEMM per group, col2im ---- */\n"
"/* q: C H W KH KW OH OW; r: stride, padding, dilation (height, width) Cg nb (mlc__conv's fields and\n"
"   the chunk's images); x_off: the chunk's first image, at the group's first channel; col is\n"
"   [Cg KH KW, nb OH OW] */\n"
"__kernel void mlc_im2col(int8 q, int8 r, __global const float *x, ulong x_off, __global float *col) {\n"
"    int C = q.s0, H = q.s1, W = q.s2, KH = q.s3, KW = q.s4, OH = q.s5, OW = q.s6, sh = r.s0, sw = r.s1;\n"
"    int ph = r.s2, pw = r.s3, dh = r.s4, dw = r.s5, Cg = r.s6, nb = r.s7, P = OH * OW;\n"
"    int at = get_global_id(0), p, n, k, c, i, j, oh, ow, ih, iw;\n"
"    if (at >= Cg * KH * KW * nb * P) return;\n"
"    p = at % P; n = (at / P) % nb; k = at / (P * nb);\n"
"    j = k % KW; i = (k / KW) % KH; c = k / (KW * KH);\n"
"    oh = p / OW; ow = p % OW;\n"
"    ih = oh * sh + i * dh - ph; iw = ow * sw + j * dw - pw;\n"
"    x += x_off + (n * C + c) * H * W;\n"
"    col[at] = ih >= 0 && ih < H && iw >= 0 && iw < W ? x[ih * W + iw] : 0.0f;\n"
"}\n"
"\n"
"/* the output index o that reads input index t at tap k (t + pad - k dil = o stride), or -1 */\n"
"int mlc_conv_tap(int t, int pad, int k, int dil, int stride, int O) {\n"
"    int s = t + pad - k * dil;\n"
"    return s < 0 || s % stride || s / stride >= O ? -1 : s / stride;\n"
"}\n"
"/* dx[n, c, ih, iw] = Σ over kernel taps (i, j) that read it: col[(c KH + i) KW + j, n P + oh OW + ow]\n"
"   + beta dx[n, c, ih, iw]  (each element of dx in one chunk's launch only) */\n"
"__kernel void mlc_col2im(int8 q, int8 r, __global const float *col, __global float *dx, ulong dx_off,\n"
"                         float beta) {\n"
"    int C = q.s0, H = q.s1, W = q.s2, KH = q.s3, KW = q.s4, OH = q.s5, OW = q.s6, sh = r.s0, sw = r.s1;\n"
"    int ph = r.s2, pw = r.s3, dh = r.s4, dw = r.s5, Cg = r.s6, nb = r.s7, P = OH * OW;\n"
"    int at = get_global_id(0), n, c, ih, iw, i, j;\n"
"    float sum = 0.0f;\n"
"    if (at >= nb * Cg * H * W) return;\n"
"    iw = at % W; ih = (at / W) % H; c = (at / (W * H)) % Cg; n = at / (W * H * Cg);\n"
"    for (i = 0; i < KH; i++) {\n"
"        int oh = mlc_conv_tap(ih, ph, i, dh, sh, OH);\n"
"        for (j = 0; j < KW && oh >= 0; j++) {\n"
"            int ow = mlc_conv_tap(iw, pw, j, dw, sw, OW);\n"
"            if (ow >= 0) sum += col[((c * KH + i) * KW + j) * nb * P + n * P + oh * OW + ow];\n"
"        }\n"
"    }\n"
"    dx += dx_off + (n * C + c) * H * W + ih * W + iw;\n"
"    *dx = mlc_plus(beta, dx, sum);\n"
"}\n",
"/* the GEMM's [O, nb, P] and the tensor's [nb, O, P]: to_nop: nop[n, o, p] = onp[o, n, p] (+ b[o]);\n"
"   else onp[o, n, p] = nop[n, o, p] */\n"
"__kernel void mlc_conv_layout(int nb, int O, int P, __global float *nop, ulong nop_off, __global float"
" *onp,\n"
"                              int to_nop, __global const float *b, int has_bias) {\n"
"    int at = get_global_id(0), p, o, n, t;\n"
"    if (at >= nb * O * P) return;\n"
"    p = at % P; o = (at / P) % O; n = at / (P * O);\n"
"    t = (o * nb + n) * P + p;\n"
"    if (to_nop) nop[nop_off + at] = onp[t] + (has_bias ? b[o] : 0.0f);\n"
"    else onp[t] = nop[nop_off + at];\n"
"}\n"
"/* db[o] = Σ_{n, q} dy[n, o, q] + beta db[o]; one work-group per channel o */\n"
"__kernel void mlc_conv_bias_grad(int N, int O, int P, __global const float *dy, __global float *db,\n"
"                                 float beta) {\n"
"    __local float ps[256], pc[256];\n"
"    int o = get_group_id(0), e;\n"
"    float2 a = (float2)(0.0f);\n"
"    float s;\n"
"    for (e = get_local_id(0); e < N * P; e += get_local_size(0))\n"
"        a = mlc_kahan_add(a, dy[mlc_channel_at(e, O, P, o)]);\n"
"    s = mlc_group_sum(a, ps, pc);\n"
"    if (get_local_id(0) == 0) db[o] = mlc_plus(beta, db + o, s);\n"
"}\n",
"/* ---- depthwise convolution (groups = C = O), direct: one work-item an output or an input, a\n"
"   work-group a weight, no im2col and no GEMM per channel. q and r as mlc_im2col's, r.s7 the\n"
"   images N. ---- */\n"
"/* y[n, c, oh, ow] = Σ_{i, j} x[n, c, oh sh - ph + i dh, ow sw - pw + j dw] w[c, i, j] (+ b[c]) */\n"
"__kernel void mlc_depthwise(int8 q, int8 r, __global const float *x, __global const float *w,\n"
"                            __global const float *b, int has_bias, __global float *y) {\n"
"    int C = q.s0, H = q.s1, W = q.s2, KH = q.s3, KW = q.s4, OH = q.s5, OW = q.s6, sh = r.s0, sw = r.s1;\n"
"    int ph = r.s2, pw = r.s3, dh = r.s4, dw = r.s5, N = r.s7;\n"
"    int at = get_global_id(0), ow, oh, c, n, i, j;\n"
"    float sum;\n"
"    if (at >= N * C * OH * OW) return;\n"
"    ow = at % OW; oh = (at / OW) % OH; c = (at / (OW * OH)) % C; n = at / (OW * OH * C);\n"
"    x += (n * C + c) * H * W; w += c * KH * KW;\n"
"    sum = has_bias ? b[c] : 0.0f;\n"
"    for (i = 0; i < KH; i++) {\n"
"        int ih = oh * sh - ph + i * dh;\n"
"        if (ih < 0 || ih >= H) continue;\n"
"        for (j = 0; j < KW; j++) {\n"
"            int iw = ow * sw - pw + j * dw;\n"
"            if (iw >= 0 && iw < W) sum += x[ih * W + iw] * w[i * KW + j];\n"
"        }\n"
"    }\n"
"    y[at] = sum;\n"
"}\n"
"/* dx[n, c, ih, iw] = Σ over the taps (i, j) that read it: dy[n, c, oh, ow] w[c, i, j] + beta dx */\n"
"__kernel void mlc_depthwise_grad_x(int8 q, int8 r, __global const float *dy, __global const float *w,\n"
"                                   __global float *dx, float beta) {\n"
"    int C = q.s0, H = q.s1, W = q.s2, KH = q.s3, KW = q.s4, OH = q.s5, OW = q.s6, sh = r.s0, sw = r.s1;\n"
"    int ph = r.s2, pw = r.s3, dh = r.s4, dw = r.s5, N = r.s7;\n"
"    int at = get_global_id(0), iw, ih, c, n, i, j;\n"
"    float sum = 0.0f;\n"
"    if (at >= N * C * H * W) return;\n"
"    iw = at % W; ih = (at / W) % H; c = (at / (W * H)) % C; n = at / (W * H * C);\n"
"    dy += (n * C + c) * OH * OW; w += c * KH * KW;\n"
"    for (i = 0; i < KH; i++) {\n"
"        int oh = mlc_conv_tap(ih, ph, i, dh, sh, OH);\n"
"        for (j = 0; j < KW && oh >= 0; j++) {\n"
"            int ow = mlc_conv_tap(iw, pw, j, dw, sw, OW);\n"
"            if (ow >= 0) sum += dy[oh * OW + ow] * w[i * KW + j];\n"
"        }\n"
"    }\n"
"    dx[at] = mlc_plus(beta, dx + at, sum);\n"
"}\n"
"/* dw[c, i, j] = Σ_{n, oh, ow} dy[n, c, oh, ow] x[n, c, ih, iw] + beta dw (one work-item a weight) */\n"
"__kernel void mlc_depthwise_grad_w(int8 q, int8 r, __global const float *x, __global const float *dy,\n"
"                                   __global float *dw_, float beta) {\n"
"    int C = q.s0, H = q.s1, W = q.s2, KH = q.s3, KW = q.s4, OH = q.s5, OW = q.s6, sh = r.s0, sw = r.s1;\n"
"    int ph = r.s2, pw = r.s3, dh = r.s4, dw = r.s5, N = r.s7;\n"
"    __local float ps[256], pc[256];\n"
"    int at = get_group_id(0), c, i, j, e;\n"
"    float sum = 0.0f;\n"
"    j = at % KW; i = (at / KW) % KH; c = at / (KW * KH);\n"
"    for (e = get_local_id(0); e < N * OH * OW; e += get_local_size(0)) {   /* image n, output (oh, ow) */\n"
"        int ow = e % OW, oh = e / OW % OH, n = e / (OW * OH);\n"
"        int ih = oh * sh - ph + i * dh, iw = ow * sw - pw + j * dw;\n"
"        if (ih >= 0 && ih < H && iw >= 0 && iw < W)\n"
"            sum += dy[((n * C + c) * OH + oh) * OW + ow] * x[((n * C + c) * H + ih) * W + iw];\n"
"    }\n"
"    sum = mlc_group_sum((float2)(sum, 0.0f), ps, pc);\n"
"    if (get_local_id(0) == 0) dw_[at] = mlc_plus(beta, dw_ + at, sum);\n"
"}\n",
"/* ---- pooling over planes [H, W]; max remembers nothing: backward finds the argmax again ---- */\n"
"/* v: kernel KH KW, stride SH SW, padding PH PW, is_max, exclude_pad (mlc__pool_job's fields) */\n"
"int mlc_pool_argmax(__global const float *x, int H, int W, int8 v, int oh, int ow) {\n"
"    int i, j, at = -1;\n"
"    float best = 0.0f;\n"
"    for (i = 0; i < v.s0; i++)\n"
"        for (j = 0; j < v.s1; j++) {\n"
"            int ih = oh * v.s2 - v.s4 + i, iw = ow * v.s3 - v.s5 + j;\n"
"            if (ih < 0 || ih >= H || iw < 0 || iw >= W) continue;\n"
"            if (at < 0 || x[ih * W + iw] > best || isnan(x[ih * W + iw])) {   /* a NaN: the last */\n"
"                best = x[ih * W + iw]; at = ih * W + iw;\n"
"            }\n"
"        }\n"
"    return at;\n"
"}\n"
"\n"
"/* average pooling's divisor: the window cut at the padded input's far edge, or with exclude_pad\n"
"   at the input's (mlc__pool_count) */\n"
"int mlc_pool_count(int H, int W, int8 v, int oh, int ow) {\n"
"    int h0 = oh * v.s2 - v.s4, w0 = ow * v.s3 - v.s5;\n"
"    int h1 = min(h0 + v.s0, H + v.s4), w1 = min(w0 + v.s1, W + v.s5);\n"
"    if (v.s7) { h0 = max(h0, 0); w0 = max(w0, 0); h1 = min(h1, H); w1 = min(w1, W); }\n"
"    return (h1 - h0) * (w1 - w0);\n"
"}\n"
"\n"
"__kernel void mlc_pool(int planes, int H, int W, int OH, int OW, int8 v, __global const float *x,\n"
"                       __global float *y) {\n"
"    int at = get_global_id(0), pl, oh, ow, i, j;\n"
"    float s = 0.0f;\n"
"    if (at >= planes * OH * OW) return;\n"
"    ow = at % OW; oh = (at / OW) % OH; pl = at / (OW * OH);\n"
"    x += pl * H * W;\n"
"    if (v.s6) { int a = mlc_pool_argmax(x, H, W, v, oh, ow); y[at] = a < 0 ? -INFINITY : x[a]; return; }\n"
"    for (i = 0; i < v.s0; i++)\n"
"        for (j = 0; j < v.s1; j++) {\n"
"            int ih = oh * v.s2 - v.s4 + i, iw = ow * v.s3 - v.s5 + j;\n"
"            if (ih >= 0 && ih < H && iw >= 0 && iw < W) s += x[ih * W + iw];\n"
"        }\n"
"    y[at] = s / (float)mlc_pool_count(H, W, v, oh, ow);\n"
"}\n"
"\n"
"/* dx[ih, iw] = Σ over windows holding it: g (max: where it is the argmax) or g / count (avg),\n"
"   + beta dx[ih, iw]: one work-item per element of dx, so it writes every one (0 in no window) */\n"
"__kernel void mlc_pool_grad(int planes, int H, int W, int OH, int OW, int8 v, __global const float *x,\n"
"                            __global const float *g, __global float *dx, float beta) {\n"
"    int at = get_global_id(0), pl, ih, iw, oh, ow;\n"
"    float s = 0.0f;\n"
"    if (at >= planes * H * W) return;\n"
"    iw = at % W; ih = (at / W) % H; pl = at / (W * H);\n"
"    x += pl * H * W; g += pl * OH * OW;\n"
"    for (oh = 0; oh < OH; oh++) {\n"
"        int i = ih + v.s4 - oh * v.s2;\n"
"        if (i < 0 || i >= v.s0) continue;\n"
"        for (ow = 0; ow < OW; ow++) {\n"
"            int j = iw + v.s5 - ow * v.s3;\n"
"            if (j < 0 || j >= v.s1) continue;\n"
"            if (!v.s6) s += g[oh * OW + ow] / (float)mlc_pool_count(H, W, v, oh, ow);\n"
"            else if (mlc_pool_argmax(x, H, W, v, oh, ow) == ih * W + iw) s += g[oh * OW + ow];\n"
"        }\n"
"    }\n"
"    dx[at] = mlc_plus(beta, dx + at, s);\n"
"}\n",
"/* ---- reductions over an axis, x viewed as [outer, len, inner]; kinds as mlc.h's MLC__REDUCE_SUM... ----"
" */\n""/* Σ x[i inner] for i < len, Kahan-compensated */\n"
"float mlc_sum_strided(__global const float *x, int len, int inner) {\n"
"    float2 a = (float2)(0.0f);\n"
"    int i;\n"
"    for (i = 0; i < len; i++) a = mlc_kahan_add(a, x[i * inner]);\n"
"    return a.x;\n"
"}\n"
"__kernel void mlc_reduce(int kind, int outer, int len, int inner, int unbiased,\n"
"                         __global const float *x, __global float *y) {\n"
"    int at = get_global_id(0), o, k, i, best_at = 0;\n"
"    float s = 0.0f, mean, best;\n"
"    if (at >= outer * inner) return;\n"
"    o = at / inner; k = at % inner;\n"
"    x += o * len * inner + k;\n"
"    if (kind == MLC__REDUCE_MAX || kind == MLC__REDUCE_ARGMAX) {    /* the first NaN wins, like the CPU */\n"
"        best = x[0];\n"
"        for (i = 1; i < len && !isnan(best); i++)\n"
"            if (x[i * inner] > best || isnan(x[i * inner])) { best = x[i * inner]; best_at = i; }\n"
"        y[at] = kind == MLC__REDUCE_MAX ? best : (float)best_at;\n"
"        return;\n"
"    }\n"
"    s = mlc_sum_strided(x, len, inner);                 /* compensated: the CPU sums in double */\n"
"    if (kind == MLC__REDUCE_VAR) {\n"
"        mean = s / len; s = 0.0f;\n"
"        for (i = 0; i < len; i++) s += (x[i * inner] - mean) * (x[i * inner] - mean);\n"
"        y[at] = s / (float)(len - unbiased);\n"
"        return;\n"
"    }\n"
"    y[at] = kind == MLC__REDUCE_MEAN ? s / len : s;\n"
"}\n"
"\n"
"/* pre: per output, max's argmax or var's mean (mlc_reduce's, run first), so that no work-item\n"
"   walks the axis again */\n"
"__kernel void mlc_reduce_grad(int kind, int outer, int len, int inner, int unbiased,\n"
"                              __global const float *x, __global const float *g, __global const float *pre,\n"
"                              __global float *dx) {\n"
"    int at = get_global_id(0), o, k, me;\n"
"    float gv;\n"
"    if (at >= outer * len * inner) return;\n"
"    k = at % inner; me = (at / inner) % len; o = at / (inner * len);\n"
"    gv = g[o * inner + k];\n"
"    x += o * len * inner + k;\n"
"    if (kind == MLC__REDUCE_MAX) {\n"
"        if ((int)pre[o * inner + k] == me) dx[at] += gv;\n"
"        return;\n"
"    }\n"
"    if (kind == MLC__REDUCE_VAR) {\n"
"        dx[at] += gv * 2.0f * (x[me * inner] - pre[o * inner + k]) / (float)(len - unbiased);\n"
"        return;\n"
"    }\n"
"    dx[at] += kind == MLC__REDUCE_MEAN ? gv / len : gv;\n"
"}\n"
"\n"
"/* ---- softmax over an axis: y = e^(x - m) / Σ, log: x - m - log Σ ---- */\n"
"__kernel void mlc_softmax(int is_log, int outer, int len, int inner, __global const float *x, __global"
" float *y) {\n"
"    int at = get_global_id(0), i;\n"
"    float m, s = 0.0f;\n"
"    if (at >= outer * inner) return;\n"
"    x += (at / inner) * len * inner + at % inner;\n"
"    y += (at / inner) * len * inner + at % inner;\n"
"    m = x[0];\n"
"    for (i = 1; i < len; i++) m = fmax(m, x[i * inner]);\n"
"    for (i = 0; i < len; i++) s += exp(x[i * inner] - m);\n"
"    for (i = 0; i < len; i++) y[i * inner] = is_log ? x[i * inner] - m - log(s) : exp(x[i * inner] - m) /"
" s;\n"
"}\n"
"\n"
"/* dx = y (g - Σ g y)  or, for log_softmax, g - e^y Σ g */\n"
"__kernel void mlc_softmax_grad(int is_log, int outer, int len, int inner, __global const float *y,\n"
"                               __global const float *g, __global float *dx) {\n"
"    int at = get_global_id(0), i, base;\n"
"    float s = 0.0f;\n"
"    if (at >= outer * inner) return;\n"
"    base = (at / inner) * len * inner + at % inner;\n"
"    y += base; g += base; dx += base;\n"
"    for (i = 0; i < len; i++) s += is_log ? g[i * inner] : g[i * inner] * y[i * inner];\n"
"    for (i = 0; i < len; i++) dx[i * inner] += is_log ? g[i * inner] - exp(y[i * inner]) * s : y[i * inner]"
" * (g[i * inner] - s);\n"
"}\n",
"/* cumsum, one work-item per row: y_i = Σ_{j<=i} x_j; reversed (the gradient) dx_i += Σ_{j>=i} g_j */\n"
"__kernel void mlc_cumsum(ulong outer, int len, ulong inner, int reverse, __global const float *x,\n"
"                         __global float *y) {\n"
"    size_t at = get_global_id(0), base;\n"
"    float sum = 0.0f, c = 0.0f, v, t;                   /* compensated: the CPU sums in double */\n"
"    int i;\n"
"    if (at >= outer * inner) return;\n"
"    base = (at / inner) * len * inner + at % inner;\n"
"    for (i = 0; i < len; i++) {\n"
"        size_t k = base + (size_t)(reverse ? len - 1 - i : i) * inner;\n"
"        v = x[k] - c; t = sum + v; c = (t - sum) - v; sum = t;\n"
"        y[k] = reverse ? y[k] + sum : sum;\n"
"    }\n"
"}\n",
"/* ---- losses: per-element values l, then reduced (red: 0 mean, 1 sum, 2 none, as mlc_reduction) ---- */\n"
"/* y = Σ l (sum), Σ l / counted (mean: scale = 1 / counted), in order; losses are small */\n"
"float mlc_loss_sum(int n, int red, float scale, __global const float *l) {\n"
"    float s = 0.0f;\n"
"    int i;\n"
"    for (i = 0; i < n; i++) s += l[i];\n"
"    return red == MLC_REDUCE_MEAN ? s * scale : s;\n"
"}\n"
"/* a row's loss: log Σ e^(x - m) - (1 - eps)(x_tc - m) - eps / C Σ (x - m); nll: -x_tc; ignored: 0 */\n"
"float mlc_class_row(int softmax_first, int C, int ignore, float eps, __global const float *x, int tc) {\n"
"    float m, s = 0.0f, sx = 0.0f;\n"
"    int c;\n"
"    if (tc == ignore) return 0.0f;\n"
"    if (!softmax_first) return -x[tc];\n"
"    m = x[0];\n"
"    for (c = 1; c < C; c++) m = fmax(m, x[c]);\n"
"    for (c = 0; c < C; c++) s += exp(x[c] - m);\n"
"    if (eps > 0.0f) for (c = 0; c < C; c++) sx += x[c] - m;\n"
"    return log(s) - (1.0f - eps) * (x[tc] - m) - eps / C * sx;\n"
"}\n"
"/* l_i for the rows i < N; total: one work-group holds every row, and its first work-item then\n"
"   writes y = their sum or mean, so that the loss takes one launch */\n"
"__kernel void mlc_class_loss(int softmax_first, int N, int C, int ignore, float eps,\n"
"                             __global const float *x, __global const float *t, __global float *l,\n"
"                             int total, int red, float scale, __global float *y) {\n"
"    int i = get_global_id(0);\n"
"    if (i < N) l[i] = mlc_class_row(softmax_first, C, ignore, eps, x + i * C, (int)t[i]);\n"
"    if (!total) return;\n"
"    barrier(CLK_GLOBAL_MEM_FENCE);                   /* every row's l written */\n"
"    if (i == 0) y[0] = mlc_loss_sum(N, red, scale, l);\n"
"}\n"
"\n"
"/* dx[i, c] = g_i (softmax(x_i)[c] - (1 - eps) [c = t_i] - eps / C) + beta dx[i, c]  (nll: only the\n"
"   -g_i at t_i; an ignored row: 0; beta 0: dx is not read) */\n"
"__kernel void mlc_class_loss_grad(int softmax_first, int N, int C, int ignore, float eps, int red,\n"
"                                  float scale,\n"
"                                  __global const float *x, __global const float *t, __global const float"
" *g,\n"
"                                  __global float *dx, float beta) {\n"
"    int i = get_global_id(0), c, tc;\n"
"    float m = 0.0f, s = 0.0f, gi, d;\n"
"    if (i >= N) return;\n"
"    tc = (int)t[i];\n"
"    x += i * C; dx += i * C;\n"
"    if (tc == ignore) {\n"
"        if (beta == 0.0f) for (c = 0; c < C; c++) dx[c] = 0.0f;\n"
"        return;\n"
"    }\n"
"    gi = red == MLC_REDUCE_NONE ? g[i] : red == MLC_REDUCE_MEAN ? g[0] * scale : g[0];\n"
"    if (softmax_first) {\n"
"        m = x[0];\n"
"        for (c = 1; c < C; c++) m = fmax(m, x[c]);\n"
"        for (c = 0; c < C; c++) s += exp(x[c] - m);\n"
"    }\n"
"    for (c = 0; c < C; c++) {\n"
"        d = beta != 0.0f ? beta * dx[c] : 0.0f;\n"
"        if (softmax_first) d += gi * (exp(x[c] - m) / s - eps / C);\n"
"        dx[c] = c == tc ? d - gi * (1.0f - eps) : d;\n"
"    }\n"
"}\n",
"/* pointwise losses: l = f(x, t), each kind's f, df/dx and df/dt from MLC__POINTWISE_LOSSES */\n"
"__kernel void mlc_pointwise_loss(int kind, int n, __global const float *p, __global const float *ts,\n"
"                                 __global float *l) {\n"
"    int i = get_global_id(0);\n"
"    float x, t;\n"
"    if (i >= n) return;\n"
"    x = p[i]; t = ts[i];\n"
"    switch (kind) {\n"
#define MLC__CL_LOSS_FORWARD(NAME, name, l, dx, dt) "    case MLC__LOSS_" #NAME ": l[i] = " #l "; break;\n"
MLC__POINTWISE_LOSSES(MLC__CL_LOSS_FORWARD)
#undef MLC__CL_LOSS_FORWARD
"    }\n"
"}\n"
"\n"
"__kernel void mlc_pointwise_loss_grad(int kind, int n, int red, float scale, __global const float *p,\n"
"                                      __global const float *ts, __global const float *g,\n"
"                                      __global float *dp, __global float *dt, int want_dp, int want_dt) {\n"
"    int i = get_global_id(0);\n"
"    float gi, x, t, dx = 0.0f, dt_ = 0.0f;\n"
"    if (i >= n) return;\n"
"    gi = red == MLC_REDUCE_NONE ? g[i] : red == MLC_REDUCE_MEAN ? g[0] * scale : g[0];\n"
"    x = p[i]; t = ts[i];\n"
"    switch (kind) {\n"
#define MLC__CL_LOSS_GRAD(NAME, name, l, dx, dt) \
    "    case MLC__LOSS_" #NAME ": dx = " #dx "; dt_ = " #dt "; break;\n"
MLC__POINTWISE_LOSSES(MLC__CL_LOSS_GRAD)
#undef MLC__CL_LOSS_GRAD
"    }\n"
"    if (want_dp) dp[i] += gi * dx;\n"
"    if (want_dt) dt[i] += gi * dt_;\n"
"}\n"
"\n"
"/* y = the sum or mean of l, by one work-item */\n"
"/* y = Σ l (times scale for a mean), by one work-group */\n"
"__kernel void mlc_loss_total(int n, int red, float scale, __global const float *l, __global float *y) {\n"
"    __local float ps[256], pc[256];\n"
"    float2 a = (float2)(0.0f);\n"
"    float s;\n"
"    int i;\n"
"    for (i = get_local_id(0); i < n; i += get_local_size(0)) a = mlc_kahan_add(a, l[i]);\n"
"    s = mlc_group_sum(a, ps, pc);\n"
"    if (get_local_id(0) == 0) y[0] = red == MLC_REDUCE_MEAN ? s * scale : s;\n"
"}\n"
"\n"
"/* ---- normalisation ---- */\n"
"/* layer_norm over rows of D: y = (x - μ) r w + b */\n"
"__kernel void mlc_layer_norm(int rows, int D, float eps, __global const float *x, __global const float *w,"
" int has_w,\n"
"                             __global const float *b, int has_b, __global float *y) {\n"
"    int r = get_global_id(0), j;\n"
"    float mu = 0.0f, v = 0.0f, rs;\n"
"    if (r >= rows) return;\n"
"    x += r * D; y += r * D;\n"
"    for (j = 0; j < D; j++) mu += x[j];\n"
"    mu /= D;\n"
"    for (j = 0; j < D; j++) v += (x[j] - mu) * (x[j] - mu);\n"
"    rs = rsqrt(v / D + eps);\n"
"    for (j = 0; j < D; j++) y[j] = (x[j] - mu) * rs * (has_w ? w[j] : 1.0f) + (has_b ? b[j] : 0.0f);\n"
"}\n",
"/* dx = r (ĝ - mean ĝ - x̂ mean(ĝ x̂)), ĝ = g w */\n"
"__kernel void mlc_layer_norm_grad(int rows, int D, float eps, __global const float *x, __global const float"
" *w, int has_w,\n"
"                                  __global const float *g, __global float *dx) {\n"
"    int r = get_global_id(0), j;\n"
"    float mu = 0.0f, v = 0.0f, rs, mg = 0.0f, mgx = 0.0f;\n"
"    if (r >= rows) return;\n"
"    x += r * D; g += r * D; dx += r * D;\n"
"    for (j = 0; j < D; j++) mu += x[j];\n"
"    mu /= D;\n"
"    for (j = 0; j < D; j++) v += (x[j] - mu) * (x[j] - mu);\n"
"    rs = rsqrt(v / D + eps);\n"
"    for (j = 0; j < D; j++) { float gh = g[j] * (has_w ? w[j] : 1.0f); mg += gh; mgx += gh * (x[j] - mu) *"
" rs; }\n"
"    mg /= D; mgx /= D;\n"
"    for (j = 0; j < D; j++) dx[j] += rs * (g[j] * (has_w ? w[j] : 1.0f) - mg - (x[j] - mu) * rs * mgx);\n"
"}\n",
"/* each row's μ and r = 1 / sqrt(var + eps), as the kernels above compute them: stats[2 row],\n"
"   stats[2 row + 1] */\n"
"__kernel void mlc_layer_norm_stats(int rows, int D, float eps, __global const float *x,\n"
"                                   __global float *stats) {\n"
"    int r = get_global_id(0), j;\n"
"    float mu = 0.0f, v = 0.0f;\n"
"    if (r >= rows) return;\n"
"    x += r * D;\n"
"    for (j = 0; j < D; j++) mu += x[j];\n"
"    mu /= D;\n"
"    for (j = 0; j < D; j++) v += (x[j] - mu) * (x[j] - mu);\n"
"    stats[2 * r] = mu;\n"
"    stats[2 * r + 1] = rsqrt(v / D + eps);\n"
"}\n"
"/* dw[j] += Σ_r g x̂,  db[j] += Σ_r g  (x̂ from the rows' stats) */\n"
"__kernel void mlc_layer_norm_param_grad(int rows, int D, __global const float *stats,\n"
"                                        __global const float *x, __global const float *g,\n"
"                                        __global float *dw, int want_w, __global float *db, int want_b) {\n"
"    int j = get_global_id(0), r;\n"
"    float sw = 0.0f, sb = 0.0f;\n"
"    if (j >= D) return;\n"
"    for (r = 0; r < rows; r++) {\n"
"        sw += g[r * D + j] * (x[r * D + j] - stats[2 * r]) * stats[2 * r + 1];\n"
"        sb += g[r * D + j];\n"
"    }\n"
"    if (want_w) dw[j] += sw;\n"
"    if (want_b) db[j] += sb;\n"
"}\n"
"\n"

"/* batch statistics of channel c over [N, C, inner]: (μ, the biased variance), the work-group's\n"
"   items summing shares, compensated (the CPU sums a channel's statistics in double) */\n"
"float2 mlc_channel_stats(__global const float *x, int N, int C, int inner, int c, __local float *ps,\n"
"                         __local float *pc) {\n"
"    int e, M = N * inner;\n"
"    float2 s = (float2)(0.0f), v = (float2)(0.0f);\n"
"    float mu;\n"
"    for (e = get_local_id(0); e < M; e += get_local_size(0))\n"
"        s = mlc_kahan_add(s, x[mlc_channel_at(e, C, inner, c)]);\n"
"    mu = mlc_group_sum(s, ps, pc) / (float)M;\n"
"    for (e = get_local_id(0); e < M; e += get_local_size(0)) {\n"
"        float d = x[mlc_channel_at(e, C, inner, c)] - mu;\n"
"        v = mlc_kahan_add(v, d * d);\n"
"    }\n"
"    return (float2)(mu, mlc_group_sum(v, ps, pc) / (float)M);\n"
"}\n"
"\n"
"/* one work-group per channel: y = (x - μ) r w + b; in training, the running statistics move */\n"
"__kernel void mlc_batch_norm(int N, int C, int inner, int training, float momentum, float eps,\n"
"                             __global const float *x, __global const float *w, int has_w, __global const"
" float *b, int has_b,\n"
"                             __global float *rmean, int has_rmean, __global float *rvar, int has_rvar,"
" __global float *y) {\n"
"    __local float ps[256], pc[256];\n"
"    int c = get_group_id(0), first = get_local_id(0) == 0, e;\n"
"    float mu, var, rs, M = (float)N * inner;\n"
"    float2 stats = mlc_channel_stats(x, training ? N : 0, C, inner, c, ps, pc);   /* (eval: no terms) */\n"
"    if (!training) stats = (float2)(rmean[c], rvar[c]);\n"
"    mu = stats.x; var = stats.y;\n"
"    if (training && first && has_rmean) rmean[c] = (1.0f - momentum) * rmean[c] + momentum * mu;\n"
"    if (training && first && has_rvar)\n"
"        rvar[c] = (1.0f - momentum) * rvar[c] + momentum * var * M / (M - 1.0f);\n"
"    rs = rsqrt(var + eps);\n"
"    for (e = get_local_id(0); e < N * inner; e += get_local_size(0)) {\n"
"        int at = mlc_channel_at(e, C, inner, c);\n"
"        y[at] = (x[at] - mu) * rs * (has_w ? w[c] : 1.0f) + (has_b ? b[c] : 0.0f);\n"
"    }\n"
"}\n",
"/* training: dx = w r (g - mean g - x̂ mean(g x̂)); eval: dx = w r g;  dw = Σ g x̂;  db = Σ g; each\n"
"   plus its beta (bx, bw, bb) times what it holds */\n"
"__kernel void mlc_batch_norm_grad(int N, int C, int inner, int training, float eps,\n"
"                                  __global const float *x, __global const float *w, int has_w,\n"
"                                  __global const float *rmean, __global const float *rvar, __global const"
" float *g,\n"
"                                  __global float *dx, int want_x, __global float *dw, int want_w, __global"
" float *db, int want_b,\n"
"                                  float bx, float bw, float bb) {\n"
"    __local float ps[256], pc[256];\n"
"    int c = get_group_id(0), first = get_local_id(0) == 0, e;\n"
"    float mu, var, rs, sg, sgx, wc, M = (float)N * inner;\n"
"    float2 g_sum = (float2)(0.0f), gx_sum = (float2)(0.0f);\n"
"    float2 stats = mlc_channel_stats(x, training ? N : 0, C, inner, c, ps, pc);   /* (eval: no terms) */\n"
"    if (!training) stats = (float2)(rmean[c], rvar[c]);\n"
"    mu = stats.x; var = stats.y;\n"
"    rs = rsqrt(var + eps);\n"
"    wc = has_w ? w[c] : 1.0f;\n"
"    for (e = get_local_id(0); e < N * inner; e += get_local_size(0)) {\n"
"        int at = mlc_channel_at(e, C, inner, c);\n"
"        g_sum = mlc_kahan_add(g_sum, g[at]);\n"
"        gx_sum = mlc_kahan_add(gx_sum, g[at] * (x[at] - mu) * rs);\n"
"    }\n"
"    sg = mlc_group_sum(g_sum, ps, pc);\n"
"    sgx = mlc_group_sum(gx_sum, ps, pc);\n"
"    if (first && want_w) dw[c] = mlc_plus(bw, dw + c, sgx);\n"
"    if (first && want_b) db[c] = mlc_plus(bb, db + c, sg);\n"
"    if (!want_x) return;\n"
"    for (e = get_local_id(0); e < N * inner; e += get_local_size(0)) {\n"
"        int at = mlc_channel_at(e, C, inner, c);\n"
"        float d = training ? wc * rs * (g[at] - sg / M - (x[at] - mu) * rs * sgx / M) : wc * rs * g[at];\n"
"        dx[at] = mlc_plus(bx, dx + at, d);\n"
"    }\n"
"}\n"
"\n"
"/* ---- dropout: the mask comes from a hash of (seed, i), so backward draws the same one ---- */\n"
"__kernel void mlc_dropout(int n, uint seed, float p, __global const float *x, __global float *y) {\n"
"    int i = get_global_id(0);\n"
"    if (i < n) y[i] = x[i] * mlc__dropout_scale(seed, i, p);\n"
"}\n"
"__kernel void mlc_dropout_grad(int n, uint seed, float p, __global const float *g, __global float *dx,\n"
"                               float beta) {\n"
"    int i = get_global_id(0);\n"
"    if (i < n) dx[i] = mlc_plus(beta, dx + i, g[i] * mlc__dropout_scale(seed, i, p));\n"
"}\n"
"\n"
"/* ---- copies and index maps ---- */\n"
"/* strided block copy: y[o, yoff + j] = x[o, xoff + j] for j < width, rows of ylen / xlen\n"
"   (slice, concat: forward adds = 0, backward adds = 1 with the roles swapped) */\n"
"__kernel void mlc_copy_rows(ulong outer, ulong width, __global const float *x, ulong xlen, ulong xoff,\n"
"                            __global float *y, ulong ylen, ulong yoff, int add) {\n"
"    size_t at = get_global_id(0), o, j;\n"
"    if (at >= outer * width) return;\n"
"    o = at / width; j = at % width;\n"
"    if (add) y[o * ylen + yoff + j] += x[o * xlen + xoff + j];\n"
"    else y[o * ylen + yoff + j] = x[o * xlen + xoff + j];\n"
"}\n",
"/* permute: y[i] = x[Σ_d idx_d(i) stride_d], strides of x in the output's axis order (a\n"
"   bijection, so backward adds back through the same map without conflicts) */\n"
"__kernel void mlc_permute(int n, int nd, int s0, int s1, int s2, int s3, int s4, int s5,\n"
"                          int d0, int d1, int d2, int d3, int d4, int d5,\n"
"                          __global const float *x, __global float *y, int backward) {\n"
"    int i = get_global_id(0), r, d, off = 0;\n"
"    int stride[6], dim[6];\n"
"    if (i >= n) return;\n"
"    stride[0] = s0; stride[1] = s1; stride[2] = s2; stride[3] = s3; stride[4] = s4; stride[5] = s5;\n"
"    dim[0] = d0; dim[1] = d1; dim[2] = d2; dim[3] = d3; dim[4] = d4; dim[5] = d5;\n"
"    r = i;\n"
"    for (d = nd - 1; d >= 0; d--) { off += (r % dim[d]) * stride[d]; r /= dim[d]; }\n"
"    if (backward) y[off] += x[i];        /* here x is dY and y is dX */\n"
"    else y[i] = x[off];\n"
"}\n"
"\n"
"/* float atomic add from 32-bit compare-and-swap (OpenCL 1.2 has no float atomics) */\n"
"void mlc_atomic_add(volatile __global float *p, float v) {\n"
"    union { uint u; float f; } old, want;\n"
"    do {\n"
"        old.f = *p;\n"
"        want.f = old.f + v;\n"
"    } while (atomic_cmpxchg((volatile __global uint *)p, old.u, want.u) != old.u);\n"
"}\n"
"\n"
"/* index_select along an axis, x [outer, len, inner], idx [L]: y[o, l, k] = x[o, idx[l], k];\n"
"   backward adds through the same map (indices repeat, so atomically) */\n"
"__kernel void mlc_index_select(int outer, int len, int inner, int L, __global const float *idx,\n"
"                               __global const float *x, __global float *y) {\n"
"    int at = get_global_id(0), o, l, k;\n"
"    if (at >= outer * L * inner) return;\n"
"    k = at % inner; l = (at / inner) % L; o = at / (inner * L);\n"
"    y[at] = x[(o * len + (int)idx[l]) * inner + k];\n"
"}\n"
"__kernel void mlc_index_select_grad(int outer, int len, int inner, int L, __global const float *idx,\n"
"                                    __global const float *g, __global float *dx) {\n"
"    int at = get_global_id(0), o, l, k;\n"
"    if (at >= outer * L * inner) return;\n"
"    k = at % inner; l = (at / inner) % L; o = at / (inner * L);\n"
"    mlc_atomic_add(dx + (o * len + (int)idx[l]) * inner + k, g[at]);\n"
"}\n"
"\n"
"/* gather through a map of offsets into x (computed and checked on the host) */\n"
"__kernel void mlc_gather(int n, __global const int *map, __global const float *x, __global float *y) {\n"
"    int i = get_global_id(0);\n"
"    if (i < n) y[i] = x[map[i]];\n"
"}\n"
"__kernel void mlc_gather_grad(int n, __global const int *map, __global const float *g, __global float *dx)"
" {\n"
"    int i = get_global_id(0);\n"
"    if (i < n) mlc_atomic_add(dx + map[i], g[i]);\n"
"}\n",
"/* ---- where and masked_fill: y = c ? a : b over a broadcast of up to three operands, each\n"
"   with its strides (0 where it is stretched); masked_fill is where(mask, value, x) ---- */\n"
"int mlc_bcast_offset(int i, int nd, int8 shape, int8 stride) {\n"
"    int sh[8], st[8], d, off = 0;\n"
"    vstore8(shape, 0, sh); vstore8(stride, 0, st);\n"
"    for (d = nd - 1; d >= 0; d--) { off += (i % sh[d]) * st[d]; i /= sh[d]; }\n"
"    return off;\n"
"}\n"
"__kernel void mlc_where(int n, int nd, int8 shape, int8 sc, int8 sa, int8 sb, __global const float *c,\n"
"                        __global const float *a, __global const float *b, float fill, int a_is_fill,"
" __global float *y) {\n"
"    int i = get_global_id(0);\n"
"    if (i >= n) return;\n"
"    if (c[mlc_bcast_offset(i, nd, shape, sc)] != 0.0f) y[i] = a_is_fill ? fill : a[mlc_bcast_offset(i, nd,"
" shape, sa)];\n"
"    else y[i] = b[mlc_bcast_offset(i, nd, shape, sb)];\n"
"}\n"
"/* the chosen side's gradient: ga += c ? g : 0 (side 0), gb += c ? 0 : g (side 1); atomically,\n"
"   since a stretched operand takes many outputs' gradients */\n"
"__kernel void mlc_where_grad(int n, int nd, int8 shape, int8 sc, int8 sg, int side, __global const float"
" *c,\n"
"                             __global const float *g, __global float *dg) {\n"
"    int i = get_global_id(0);\n"
"    if (i >= n) return;\n"
"    if ((c[mlc_bcast_offset(i, nd, shape, sc)] != 0.0f) == (side == 0))\n"
"        mlc_atomic_add(dg + mlc_bcast_offset(i, nd, shape, sg), g[i]);\n"
"}\n",
"/* ---- attention (see mlc.h): one work-item per query row r = (b h, i) or per key row; the\n"
"   scores are recomputed where needed, and each row's log-sum-exp is kept between them ---- */\n"
"float mlc_attention_score(__global const float *q, __global const float *k, __global const float *mask,\n"
"                          int has_mask, int4 ms, int H, int T, int S, int D, int causal, float scale,\n"
"                          int bh, int i, int j) {\n"
"    float s = 0.0f;\n"
"    int d;\n"
"    if (causal && j > i) return -INFINITY;\n"
"    for (d = 0; d < D; d++) s += q[(bh * T + i) * D + d] * k[(bh * S + j) * D + d];\n"
"    return s * scale + (has_mask ? mask[bh / H * ms.s0 + bh % H * ms.s1 + i * ms.s2 + j * ms.s3] : 0.0f);\n"
"}\n"
"#define MLC_ATTENTION_PARAMS int BH, int H, int T, int S, int D, int Dv, int causal, float scale, \\\n"
"    float p, uint seed, __global const float *q, __global const float *k, __global const float *v, \\\n"
"    __global const float *mask, int has_mask, int4 ms\n"
"#define MLC_SCORE(i, j) mlc_attention_score(q, k, mask, has_mask, ms, H, T, S, D, causal, scale, bh, i, j)\n"
"#define MLC_KEEP(r, j) (p > 0.0f ? mlc__dropout_scale(seed, (int)((uint)(r) * S + (uint)(j)), p) : 1.0f)\n"
"/* y_i = Σ_j m P_ij v_j, P_ij = e^(s_ij - ℓ_i); ℓ_i saved */\n"
"__kernel void mlc_attention(MLC_ATTENTION_PARAMS, __global float *y, __global float *lse) {\n"
"    int r = get_global_id(0), bh, i, j, e;\n"
"    float m = -INFINITY, L;\n"
"    if (r >= BH * T) return;\n"
"    bh = r / T; i = r % T;\n"
"    for (j = 0; j < S; j++) { float s = MLC_SCORE(i, j); if (s > m) m = s; }\n"
"    L = 0.0f;\n"
"    for (j = 0; j < S; j++) L += exp(MLC_SCORE(i, j) - m);\n"
"    L = m + log(L);\n"
"    lse[r] = L;\n"
"    y += r * Dv;\n"
"    for (e = 0; e < Dv; e++) y[e] = 0.0f;\n"
"    for (j = 0; j < S; j++) {\n"
"        float w = exp(MLC_SCORE(i, j) - L) * MLC_KEEP(r, j);\n"
"        for (e = 0; e < Dv; e++) y[e] += w * v[(bh * S + j) * Dv + e];\n"
"    }\n"
"}\n",
"/* per query row: Δ_i = Σ_j P_ij dP_ij (kept for the key rows), dq_i += s Σ_j dS_ij k_j */\n"
"float mlc_attention_dp(__global const float *g, __global const float *v, int Dv, int r, int c) {\n"
"    float s = 0.0f;\n"
"    int e;\n"
"    for (e = 0; e < Dv; e++) s += g[r * Dv + e] * v[c * Dv + e];\n"
"    return s;\n"
"}\n"
"__kernel void mlc_attention_grad_q(MLC_ATTENTION_PARAMS, __global const float *lse,\n"
"                                   __global const float *g, __global float *delta, __global float *dq,\n"
"                                   int want_q) {\n"
"    int r = get_global_id(0), bh, i, j, d;\n"
"    float dl = 0.0f;\n"
"    if (r >= BH * T) return;\n"
"    bh = r / T; i = r % T;\n"
"    for (j = 0; j < S; j++)\n"
"        dl += exp(MLC_SCORE(i, j) - lse[r]) * mlc_attention_dp(g, v, Dv, r, bh * S + j) * MLC_KEEP(r, j);\n"
"    delta[r] = dl;\n"
"    if (!want_q) return;\n"
"    for (j = 0; j < S; j++) {\n"
"        float P = exp(MLC_SCORE(i, j) - lse[r]);\n"
"        float dS = P * (mlc_attention_dp(g, v, Dv, r, bh * S + j) * MLC_KEEP(r, j) - dl) * scale;\n"
"        for (d = 0; d < D; d++) dq[r * D + d] += dS * k[(bh * S + j) * D + d];\n"
"    }\n"
"}\n"
"/* per key row c = (b h, j): dk_j += s Σ_i dS_ij q_i,  dv_j += Σ_i m P_ij g_i */\n"
"__kernel void mlc_attention_grad_kv(MLC_ATTENTION_PARAMS, __global const float *lse,\n"
"                                    __global const float *g, __global const float *delta,\n"
"                                    __global float *dk, int want_k, __global float *dv, int want_v) {\n"
"    int c = get_global_id(0), bh, i, j, d;\n"
"    if (c >= BH * S) return;\n"
"    bh = c / S; j = c % S;\n"
"    for (i = 0; i < T; i++) {\n"
"        int r = bh * T + i;\n"
"        float P = exp(MLC_SCORE(i, j) - lse[r]), m = MLC_KEEP(r, j);\n"
"        float dS = P * (mlc_attention_dp(g, v, Dv, r, c) * m - delta[r]) * scale;\n"
"        if (want_k) for (d = 0; d < D; d++) dk[c * D + d] += dS * q[r * D + d];\n"
"        if (want_v) for (d = 0; d < Dv; d++) dv[c * Dv + d] += m * P * g[r * Dv + d];\n"
"    }\n"
"}\n"
};

/* "#define MLC__<NAME> i" for each kind of a formula family, so kernels name kinds as mlc.h does */
static void mlc__cl_define_kinds(char *prelude, size_t size, const char *const *names, int count) {
    int i;
    for (i = 0; i < count; i++) {
        size_t used = strlen(prelude);
        mlc__format(prelude + used, size - used, "#define MLC__%s %d\n", names[i], i);
    }
}

/* The bytes of an optimiser launch's arguments with `slots` parameters (mlc__cl_run_group):
   starts and sizes (ulong vectors), 5 buffers a slot, then the rule's at most 8 floats or ints. */
static size_t mlc__cl_group_bytes(int slots) {
    return 2 * (size_t)slots * sizeof(cl_ulong) + 5 * (size_t)slots * sizeof(cl_mem) + 8 * sizeof(cl_float);
}

/* The program's head: mlc.h's enum values (the kinds the formulas switch on) as #defines. */
static void mlc__cl_prelude(char *prelude, size_t size, int slots) {
    mlc__format(prelude, size,
                "#pragma OPENCL FP_CONTRACT OFF\n#define MLC__BINARY_ADD %d\n#define MLC__BINARY_SUB %d\n"
                "#define MLC__BINARY_MUL %d\n#define MLC__BINARY_DIV %d\n#define MLC_REDUCE_MEAN %d\n#define"
                " MLC_REDUCE_NONE %d\n#define MLC_SLOT_COUNT %d\n",
                (int)MLC__BINARY_ADD, (int)MLC__BINARY_SUB, (int)MLC__BINARY_MUL, (int)MLC__BINARY_DIV,
                (int)MLC_REDUCE_MEAN, (int)MLC_REDUCE_NONE, slots);
    mlc__cl_define_kinds(prelude, size, mlc__unary_kind_names, MLC__UNARY_COUNT);
    mlc__cl_define_kinds(prelude, size, mlc__reduce_kind_names, MLC__REDUCE_COUNT);
    mlc__cl_define_kinds(prelude, size, mlc__loss_kind_names, MLC__LOSS_COUNT);
}

/* Build a program from the prelude and `count` pieces, with the build options (the environment
   variable MLC_OPENCL_OPTIONS adds its own, e.g. -cl-mad-enable). NULL on failure, with the
   error set: `what` and the head of the compiler's log (the whole log goes to the logger). */
static cl_program mlc__cl_program(mlc_ctx *ctx, const char *what, const char *const *pieces, int count) {
    mlc__cl_state *st = mlc__cl_st(ctx);
    enum { PIECES = sizeof mlc__cl_formulas / sizeof mlc__cl_formulas[0]
                    + sizeof mlc__cl_source / sizeof mlc__cl_source[0] };
    const char *strings[PIECES + 1], *extra = getenv("MLC_OPENCL_OPTIONS");
    char prelude[4096], options[512];
    cl_program program;
    cl_int err;
    int i;
    MLC_ASSERT(count <= PIECES);
    mlc__format(options, sizeof options, "-cl-std=CL1.2%s %s",
                st->exact_divide ? " -cl-fp32-correctly-rounded-divide-sqrt" : "", extra ? extra : "");
    mlc__cl_prelude(prelude, sizeof prelude, st->slots);
    strings[0] = prelude;
    for (i = 0; i < count; i++) strings[i + 1] = pieces[i];
    program = mlc__cl.CreateProgramWithSource(st->context, (cl_uint)count + 1, strings, NULL, &err);
    if (!program) { mlc__cl_check(ctx, err, "clCreateProgramWithSource"); return NULL; }
    err = mlc__cl.BuildProgram(program, 1, &st->device, options, NULL, NULL);
    if (err != CL_SUCCESS) {
        char excerpt[320] = "(no build log)";
        size_t size = 0;
        if (mlc__cl.GetProgramBuildInfo(program, st->device, CL_PROGRAM_BUILD_LOG, 0, NULL, &size)
                == CL_SUCCESS
            && size > 1) {
            char *log = (char *)mlc__heap_alloc(ctx, size + 1);
            if (log
                && mlc__cl.GetProgramBuildInfo(program, st->device, CL_PROGRAM_BUILD_LOG, size, log, NULL)
                       == CL_SUCCESS) {
                log[size] = '\0';
                mlc__log(ctx, MLC_LOG_INFO, log);                    /* the whole log */
                memcpy(excerpt, log, size < sizeof excerpt ? size : sizeof excerpt - 1);
                excerpt[sizeof excerpt - 1] = '\0';
            }
            mlc__heap_free(ctx, log);
        }
        mlc__cl.ReleaseProgram(program);
        mlc__fail(ctx, MLC_ERR_DEVICE, "opencl: %s failed on %s: %s", what, st->name, excerpt);
        return NULL;
    }
    return program;
}

/* The formulas alone (mlc__cl_formulas): 1 when they build; else 0, and the error names them
   and quotes the compiler (an undefined helper, a formula that is not OpenCL C). */
static int mlc__cl_check_formulas(mlc_ctx *ctx) {
    cl_program program = mlc__cl_program(ctx, "kernel build of mlc.h's formula tables (MLC__FORMULA_HELPERS, "
                                         "MLC__UNARY_KINDS)", mlc__cl_formulas,
                                         (int)(sizeof mlc__cl_formulas / sizeof mlc__cl_formulas[0]));
    if (!program) return 0;
    mlc__cl.ReleaseProgram(program);
    return 1;
}

/* Build the program once per context: the formulas, then the pieces. When it fails, the
   formulas alone are built to say whether a table row is at fault. The optimisers take 8
   parameters a launch (480 bytes of arguments) where the device allows that, else 4 (256
   bytes: what OpenCL's embedded profile promises). */
static int mlc__cl_build(mlc_ctx *ctx) {
    mlc__cl_state *st = mlc__cl_st(ctx);
    enum { FORMULAS = sizeof mlc__cl_formulas / sizeof mlc__cl_formulas[0],
           PIECES = sizeof mlc__cl_source / sizeof mlc__cl_source[0] };
    const char *pieces[FORMULAS + PIECES];
    int i;
    if (st->program) return 1;
    st->slots = mlc__cl_group_bytes(MLC__CL_SLOTS) <= st->max_args ? MLC__CL_SLOTS : MLC__CL_SLOTS / 2;
    for (i = 0; i < FORMULAS; i++) pieces[i] = mlc__cl_formulas[i];
    for (i = 0; i < PIECES; i++) pieces[FORMULAS + i] = mlc__cl_source[i];
    st->program = mlc__cl_program(ctx, "kernel build", pieces, FORMULAS + PIECES);
    if (!st->program) {
        mlc_result code = ctx->error;
        char message[sizeof ctx->message];
        memcpy(message, ctx->message, sizeof message);
        ctx->error = MLC_OK;
        if (mlc__cl_check_formulas(ctx)) { ctx->error = code; memcpy(ctx->message, message, sizeof message); }
        return 0;
    }
    return 1;
}

/* Kernel `id`, created once and cached; its work-group size in *local. */
static cl_kernel mlc__cl_kernel(mlc_ctx *ctx, int id, size_t *local) {
    mlc__cl_state *st = mlc__cl_st(ctx);
    size_t wg = 0;
    cl_kernel k;
    cl_int err;
    if (st->kernels[id]) { *local = st->kernel_local[id]; return st->kernels[id]; }
    if (!mlc__cl_build(ctx)) return NULL;
    k = mlc__cl.CreateKernel(st->program, mlc__cl_kernel_names[id], &err);
    if (!k) { mlc__cl_check(ctx, err, "clCreateKernel"); return NULL; }
    if (mlc__cl.GetKernelWorkGroupInfo(k, st->device, CL_KERNEL_WORK_GROUP_SIZE, sizeof wg, &wg, NULL)
            != CL_SUCCESS
        || !wg)
        wg = 1;
    *local = wg < 256 ? wg : 256;
    st->kernels[id] = k;
    st->kernel_local[id] = *local;
    return k;
}

typedef struct mlc__cl_arg { size_t size; const void *value; } mlc__cl_arg;
#define MLC__CL_ARG(x) { sizeof(x), &(x) }

/* Give kernel k (MLC__CL_K_<name> `kernel`) its arguments, when they fit in the bytes the device
   takes: counted as a struct lays them out, each at a multiple of its size (a vector's alignment
   is its size; pointers counted at the host's size), as a device may count them. */
static int mlc__cl_set_args(mlc_ctx *ctx, cl_kernel k, int kernel, const mlc__cl_arg *args, int count) {
    const mlc__cl_state *st = mlc__cl_st(ctx);
    size_t bytes = 0;
    int i;
    for (i = 0; i < count; i++) {
        size_t size = args[i].size;
        bytes = (bytes + size - 1) / size * size + size;
    }
    if (bytes > st->max_args) {
        mlc__fail(ctx, MLC_ERR_DEVICE, "opencl: %s in %s takes %zu bytes of arguments; %s takes at most %zu",
                  mlc__cl_kernel_names[kernel], st->op, bytes, st->name, st->max_args);
        return 0;
    }
    for (i = 0; i < count; i++)
        if (!mlc__cl_check(ctx, mlc__cl.SetKernelArg(k, (cl_uint)i, args[i].size, args[i].value),
                           "clSetKernelArg"))
            return 0;
    return 1;
}

/* Set the arguments and run `kernel` over n work-items. */
static int mlc__cl_run(mlc_ctx *ctx, int kernel, size_t n, const mlc__cl_arg *args, int count) {
    mlc__cl_state *st = mlc__cl_st(ctx);
    size_t local = 1, global;
    cl_kernel k;
    if (ctx->error) return 0;
    if (n == 0) return 1;
    if (n > 2147483647u) {                               /* work-item ids are ints in the kernels */
        mlc__fail(ctx, MLC_ERR_DEVICE,
                  "opencl: %s needs %zu work-items in %s; the kernels take at most 2^31 - 1", st->op, n,
                  mlc__cl_kernel_names[kernel]);
        return 0;
    }
    if (!(k = mlc__cl_kernel(ctx, kernel, &local)) || !mlc__cl_set_args(ctx, k, kernel, args, count))
        return 0;
    global = (n + local - 1) / local * local;
    ctx->stats.launches++;
    return mlc__cl_check(ctx,
                         mlc__cl.EnqueueNDRangeKernel(st->queue, k, 1, NULL, &global, &local, 0, NULL, NULL),
                         "clEnqueueNDRangeKernel");
}

/* Run `kernel` as `groups` work-groups of its work-group size (mlc__cl_kernel): a kernel whose
   groups each sum one slice (mlc_group_sum) */
static int mlc__cl_run_groups(mlc_ctx *ctx, int kernel, size_t groups, const mlc__cl_arg *args, int count) {
    size_t local = 1;
    if (!ctx->error && groups && !mlc__cl_kernel(ctx, kernel, &local)) return 0;
    return mlc__cl_run(ctx, kernel, groups * local, args, count);
}

/* ============================================================================================
   @section cl-buffers  Tensors' buffers: copies, fills, and the helpers kernels take their arguments from
   ============================================================================================ */

static int mlc__cl_fill_mem(mlc_ctx *ctx, cl_mem mem, size_t count, float value) {
    cl_ulong n = count;
    cl_float v = value;
    mlc__cl_arg args[] = { MLC__CL_ARG(n), MLC__CL_ARG(mem), MLC__CL_ARG(v) };
    return mlc__cl_run(ctx, MLC__CL_K_fill, count, args, 3);
}

/* Host copy -> device (allocating the buffer first). Long-lived tensors wait; temporaries do
   not (their host memory lives until the frame ends, and mlc__cl_wait waits for them). */
static int mlc__cl_upload_(mlc_ctx *ctx, mlc_tensor *t, int grad) {
    mlc__cl_state *st = mlc__cl_st(ctx);
    void **slot = grad ? &t->device_grad : &t->device_data;
    const void *host = mlc__host_copy_of(t, grad);
    cl_bool blocking = t->persistent ? CL_TRUE : CL_FALSE;
    if (!mlc__cl_buffer(ctx, t, grad)) return 0;
    if (!host) return 1;
    ctx->stats.uploads++;
    if (!t->size) return 1;
    if (!mlc__cl_check(ctx,
                       mlc__cl.EnqueueWriteBuffer(st->queue, (cl_mem)*slot, blocking, 0,
                                                  mlc__bytes_of(t, grad), host, 0, NULL, NULL),
                       "clEnqueueWriteBuffer"))
        return 0;
    if (!blocking) st->pending = 1;
    return 1;
}

/* The core's books (mlc__device_in, mlc__device_grad in mlc.h) as OpenCL buffers: t's data,
   current on the device; the buffer an op writes; t's gradient to add into (the host copy
   becomes stale), only to read, or to write as product + beta (0 or 1) times what it holds. */
static cl_mem mlc__cl_in(mlc_ctx *ctx, mlc_tensor *t) { (void)ctx; return (cl_mem)mlc__device_in(t); }
static cl_mem mlc__cl_out(mlc_ctx *ctx, mlc_tensor *t) {
    return (cl_mem)mlc__device_out(t, mlc__cl_st(ctx)->op);
}
static cl_mem mlc__cl_grad(mlc_ctx *ctx, mlc_tensor *t) {
    return (cl_mem)mlc__device_grad(t, 1, mlc__cl_st(ctx)->op);
}
static cl_mem mlc__cl_grad_in(mlc_ctx *ctx, mlc_tensor *t) {
    return (cl_mem)mlc__device_grad(t, 0, mlc__cl_st(ctx)->op);
}
static cl_mem mlc__cl_grad_over(mlc_ctx *ctx, mlc_tensor *t, float *beta) {
    return (cl_mem)mlc__device_grad_to_overwrite(t, beta, mlc__cl_st(ctx)->op);
}

/* ============================================================================================
   @section cl-ops  Op families, each named by its CPU backward function (the node's identity)
   ============================================================================================ */

static int mlc__cl_unary(mlc_ctx *ctx, mlc__node *call) {
    mlc_tensor *x = call->in[0], *y = call->out;
    cl_int kind = call->args.unary.kind;
    cl_ulong n = x->size;
    cl_float p = call->args.unary.p, q = call->args.unary.q;
    cl_mem xm = mlc__cl_in(ctx, x), ym = xm ? mlc__cl_out(ctx, y) : NULL;
    mlc__cl_arg args[] = { MLC__CL_ARG(kind), MLC__CL_ARG(n), MLC__CL_ARG(xm),
                           MLC__CL_ARG(ym),   MLC__CL_ARG(p), MLC__CL_ARG(q) };
    return ym && mlc__cl_run(ctx, MLC__CL_K_unary, x->size, args, 6);
}

static int mlc__cl_unary_backward(mlc_ctx *ctx, mlc__node *nd) {
    mlc_tensor *x = nd->in[0], *y = nd->out;
    cl_int kind = nd->args.unary.kind;
    cl_ulong n = x->size;
    cl_float p = nd->args.unary.p, q = nd->args.unary.q, beta;
    cl_mem xm, ym, gm, gxm;
    if (!x->requires_grad) return 1;
    xm = mlc__cl_in(ctx, x);
    ym = xm ? mlc__cl_in(ctx, y) : NULL;
    gm = ym ? mlc__cl_grad_in(ctx, y) : NULL;
    gxm = gm ? mlc__cl_grad_over(ctx, x, &beta) : NULL;
    {
        mlc__cl_arg args[] = { MLC__CL_ARG(kind), MLC__CL_ARG(n),   MLC__CL_ARG(xm), MLC__CL_ARG(ym),
                               MLC__CL_ARG(gm),   MLC__CL_ARG(gxm), MLC__CL_ARG(p),  MLC__CL_ARG(q),
                               MLC__CL_ARG(beta) };
        return gxm && mlc__cl_run(ctx, MLC__CL_K_unary_grad, x->size, args, 9);
    }
}

/* copy:  y = x   dx += g  (reshape's backward too: mlc_reshape makes the view itself). Between
   dtypes, or of a half tensor, a cast: the one kernel that reads and writes half storage. */
typedef char mlc__cl_cast_codes[MLC_F32 == 0 && MLC_BF16 == 1 && MLC_F16 == 2 ? 1 : -1];
static int mlc__cl_copy(mlc_ctx *ctx, mlc__node *call) {
    mlc_tensor *x = call->in[0], *y = call->out;
    cl_ulong n = x->size;
    cl_int from = (cl_int)x->dtype, to = (cl_int)y->dtype;
    cl_mem xm, ym;
    if (!(xm = mlc__cl_in(ctx, x)) || !(ym = mlc__cl_out(ctx, y))) return 0;
    if (from != MLC_F32 || to != MLC_F32) {
        mlc__cl_arg args[] = { MLC__CL_ARG(n), MLC__CL_ARG(from), MLC__CL_ARG(to), MLC__CL_ARG(xm),
                               MLC__CL_ARG(ym) };
        return mlc__cl_run(ctx, MLC__CL_K_cast, x->size, args, 5);
    } else {
        mlc__cl_arg args[] = { MLC__CL_ARG(n), MLC__CL_ARG(xm), MLC__CL_ARG(ym) };
        return mlc__cl_run(ctx, MLC__CL_K_copy, x->size, args, 3);
    }
}

/* dx += g, or dx = g (a copy) over a gradient that counts as zeros */
static int mlc__cl_accumulate_backward(mlc_ctx *ctx, mlc__node *nd) {
    mlc_tensor *x = nd->in[0], *y = nd->out;
    cl_ulong n = y->size;
    cl_float beta = 0.0f;                   /* read below even when gm is NULL */
    cl_mem gm, gxm;
    if (!x->requires_grad) return 1;
    gm = mlc__cl_grad_in(ctx, y);
    gxm = gm ? mlc__cl_grad_over(ctx, x, &beta) : NULL;
    {
        mlc__cl_arg args[] = { MLC__CL_ARG(n), MLC__CL_ARG(gm), MLC__CL_ARG(gxm) };
        int kernel = beta != 0.0f ? MLC__CL_K_accumulate : MLC__CL_K_copy;
        return gxm && mlc__cl_run(ctx, kernel, y->size, args, 3);
    }
}

/* The broadcast of two operands with size-1 dimensions dropped and contiguous runs merged:
   the same elements in as few dimensions as possible (one for equal shapes). */
typedef struct mlc__cl_dims { cl_int nd; cl_ulong8 shape, stride[2]; } mlc__cl_dims;

static void mlc__cl_dims_of(const mlc__bcast *bc, mlc__cl_dims *dm) {
    int d, k, nd = 0;
    memset(dm, 0, sizeof *dm);
    for (d = 0; d < bc->ndim; d++) {
        cl_ulong size = (cl_ulong)bc->shape[d];
        if (size == 1) continue;
        if (nd > 0 && dm->stride[0].s[nd - 1] == bc->stride[0][d] * size
            && dm->stride[1].s[nd - 1] == bc->stride[1][d] * size) {
            dm->shape.s[nd - 1] *= size;                /* merges with the dimension before */
            for (k = 0; k < 2; k++) dm->stride[k].s[nd - 1] = bc->stride[k][d];
            continue;
        }
        dm->shape.s[nd] = size;
        for (k = 0; k < 2; k++) dm->stride[k].s[nd] = bc->stride[k][d];
        nd++;
    }
    dm->nd = nd;
}

static int mlc__cl_binary(mlc_ctx *ctx, mlc__node *call) {
    mlc_tensor *a = call->in[0], *b = call->in[1], *y = call->out;
    mlc__bcast bc;
    mlc__cl_dims dm;
    cl_int kind = call->args.binary.kind;
    cl_ulong n = y->size;
    cl_mem am, bm, ym;
    if (!mlc__broadcast(ctx, call->name, &bc, 2, call->in)) return 1;   /* the error is set */
    mlc__cl_dims_of(&bc, &dm);
    am = mlc__cl_in(ctx, a);
    bm = am ? mlc__cl_in(ctx, b) : NULL;
    ym = bm ? mlc__cl_out(ctx, y) : NULL;
    {
        mlc__cl_arg args[] = { MLC__CL_ARG(dm.shape),
                               MLC__CL_ARG(dm.stride[0]),
                               MLC__CL_ARG(dm.stride[1]),
                               MLC__CL_ARG(kind),
                               MLC__CL_ARG(n),
                               MLC__CL_ARG(dm.nd),
                               MLC__CL_ARG(am),
                               MLC__CL_ARG(bm),
                               MLC__CL_ARG(ym) };
        return ym && mlc__cl_run(ctx, MLC__CL_K_binary, y->size, args, 9);
    }
}

static int mlc__cl_binary_backward(mlc_ctx *ctx, mlc__node *nd) {
    mlc__bcast bc;
    mlc__cl_dims dm;
    cl_int kind = nd->args.binary.kind, side;
    cl_mem am, bm, gm;
    if (!mlc__broadcast(ctx, nd->name, &bc, 2, nd->in)) return 0;
    mlc__cl_dims_of(&bc, &dm);
    am = mlc__cl_in(ctx, nd->in[0]);
    bm = am ? mlc__cl_in(ctx, nd->in[1]) : NULL;
    gm = bm ? mlc__cl_grad_in(ctx, nd->out) : NULL;
    if (!gm) return 0;
    for (side = 0; side < 2; side++) {
        mlc_tensor *t = nd->in[side];
        cl_ulong n = t->size;
        cl_mem gs;
        if (!t->requires_grad) continue;
        if (!(gs = mlc__cl_grad(ctx, t))) return 0;
        {
            mlc__cl_arg args[] = { MLC__CL_ARG(dm.shape),
                                   MLC__CL_ARG(dm.stride[side]),
                                   MLC__CL_ARG(dm.stride[1 - side]),
                                   MLC__CL_ARG(kind),
                                   MLC__CL_ARG(side),
                                   MLC__CL_ARG(n),
                                   MLC__CL_ARG(dm.nd),
                                   MLC__CL_ARG(gm),
                                   MLC__CL_ARG(am),
                                   MLC__CL_ARG(bm),
                                   MLC__CL_ARG(gs) };
            if (!mlc__cl_run(ctx, MLC__CL_K_binary_grad, t->size, args, 11)) return 0;
        }
    }
    return 1;
}

/* A kernel over a 3-D range, with a fixed work-group (the tiled GEMM) or, local NULL, the
   driver's choice. 0 with no error set: the device cannot take that work-group, and the op
   runs on the CPU instead. */
static int mlc__cl_run3(mlc_ctx *ctx, int kernel, const size_t *global, const size_t *local,
                        const mlc__cl_arg *args, int count) {
    mlc__cl_state *st = mlc__cl_st(ctx);
    size_t wg = 1;
    cl_kernel k;
    if (ctx->error || !(k = mlc__cl_kernel(ctx, kernel, &wg))) return 0;
    if (local && wg < local[0] * local[1] * local[2]) return 0;
    if (!mlc__cl_set_args(ctx, k, kernel, args, count)) return 0;
    ctx->stats.launches++;
    return mlc__cl_check(ctx,
                         mlc__cl.EnqueueNDRangeKernel(st->queue, k, 3, NULL, global, local, 0, NULL, NULL),
                         "clEnqueueNDRangeKernel");
}


/* C[b] = op(A[b]) op(B[b]) + beta C[b] (+ bias) for b < batches, element offsets oa, ob, oc and
   steps sa, sb, sc between batches. A product that adds into one shared C (sc = 0) runs batch
   after batch, so no two work-items add into the same element at once. One product of few
   tiles over a long K (a convolution's weight gradient: 16 x 9 outputs over every image's
   places) would leave most compute units idle while one work-group walks K: it runs in slices
   of K, each slice's product into scratch (the third index), then summed into C. */
static int mlc__cl_gemm(mlc_ctx *ctx, int ta, int tb, int M, int N, int K, cl_mem A, size_t oa, size_t sa,
                        cl_mem B, size_t ob, size_t sb, float beta, cl_mem C, size_t oc, size_t sc,
                        int batches, cl_mem bias) {
    const mlc__cl_state *st = mlc__cl_st(ctx);
    size_t local[3] = { 16, 16, 1 }, global[3], tile_m = (size_t)st->gemm_tile_rows;
    int b, rounds = sc == 0 && batches > 1 ? batches : 1, kernel;
    size_t tall_tiles = ((size_t)M + 127) / 128 * (((size_t)N + 63) / 64);   /* tiles of 128 x 64 */
    size_t tiles = ((size_t)M + 63) / 64 * (((size_t)N + 63) / 64), slices = 1;
    cl_int split = 0;
    cl_mem out = C;
    if (!M || !N || !batches) return 1;
    if (rounds == 1) tall_tiles *= (size_t)batches;
    if (!tile_m) tile_m = tall_tiles >= st->compute_units ? 128 : 64;        /* enough for every unit */
    if (batches == 1 && !bias && 2 * tiles <= st->compute_units && K >= 1024) {   /* slices of K */
        slices = st->compute_units / tiles < (size_t)K / 512 ? st->compute_units / tiles : (size_t)K / 512;
        split = (cl_int)(((size_t)K + slices - 1) / slices + 15) / 16 * 16;   /* whole 16-deep steps */
        slices = ((size_t)K + (size_t)split - 1) / (size_t)split;
        if (!(out = mlc__cl_scratch(ctx, slices * (size_t)M * (size_t)N))) return 0;
    }
    kernel = tile_m == 128 ? MLC__CL_K_gemm_128x64 : MLC__CL_K_gemm_64x64;
    if (st->gemm_vector) {                                                     /* a 4 x 8 block each */
        kernel = MLC__CL_K_gemm_vector;
        global[0] = ((size_t)N + 7) / 8; global[1] = ((size_t)M + 3) / 4;
    } else { global[0] = ((size_t)N + 63) / 64 * 16; global[1] = ((size_t)M + tile_m - 1) / tile_m * 16; }
    global[2] = split ? slices : (size_t)(rounds > 1 ? 1 : batches);
    for (b = 0; b < rounds; b++) {
        cl_int m = M, n = N, k = K, cta = ta, ctb = tb, has_bias = bias != NULL;
        cl_ulong offa = oa + (size_t)b * sa, offb = ob + (size_t)b * sb, offc = split ? 0 : oc,
                 stepa = split ? 0 : sa, stepb = split ? 0 : sb, stepc = split ? (size_t)M * N : sc;
        cl_float be = split ? 0.0f : b ? 1.0f : beta;   /* later rounds add to the first; slices are fresh */
        cl_mem bm = bias ? bias : out;
        mlc__cl_arg args[] = { MLC__CL_ARG(m),    MLC__CL_ARG(n),       MLC__CL_ARG(k),
                               MLC__CL_ARG(cta),  MLC__CL_ARG(ctb),     MLC__CL_ARG(A),
                               MLC__CL_ARG(offa), MLC__CL_ARG(stepa),   MLC__CL_ARG(B),
                               MLC__CL_ARG(offb), MLC__CL_ARG(stepb),   MLC__CL_ARG(out),
                               MLC__CL_ARG(offc), MLC__CL_ARG(stepc),   MLC__CL_ARG(be),
                               MLC__CL_ARG(bm),   MLC__CL_ARG(has_bias), MLC__CL_ARG(split) };
        if (!mlc__cl_run3(ctx, kernel, global, st->gemm_vector ? NULL : local, args, 18))
            return 0;
    }
    if (split) {                                        /* C = Σ over the slices + beta C */
        cl_int rows = (cl_int)slices, n = M * N;
        cl_ulong off = oc;
        cl_float be = beta;
        mlc__cl_arg args[] = { MLC__CL_ARG(rows), MLC__CL_ARG(n), MLC__CL_ARG(out), MLC__CL_ARG(C),
                               MLC__CL_ARG(off),  MLC__CL_ARG(be) };
        return mlc__cl_run(ctx, MLC__CL_K_column_sums, (size_t)M * N, args, 6);
    }
    return 1;
}

static int mlc__cl_matmul(mlc_ctx *ctx, mlc__node *call) {
    const mlc__mm *mm = (const mlc__mm *)call->saved;
    mlc_tensor *bias = call->in[2];
    cl_mem am = mlc__cl_in(ctx, call->in[0]), bm = am ? mlc__cl_in(ctx, call->in[1]) : NULL;
    cl_mem biasm = bm && bias ? mlc__cl_in(ctx, bias) : NULL, cm = bm ? mlc__cl_out(ctx, call->out) : NULL;
    if (!cm || (bias && !biasm)) return 1;                /* the error is set */
    return mlc__cl_gemm(ctx, mm->ta, mm->tb, mm->M, mm->N, mm->K, am, 0, mm->step_a, bm, 0, mm->step_b, 0.0f,
                        cm, 0, mm->step_c, mm->batches, biasm) || ctx->error;
}

/* dA, dB as mlc__matmul_backward has them; db = column sums of dC. Each writes over a gradient
   that counts as zeros (beta 0) and adds to one that holds a value (beta 1). */
static int mlc__cl_matmul_backward(mlc_ctx *ctx, mlc__node *nd) {
    const mlc__mm *mm = (const mlc__mm *)nd->saved;
    mlc_tensor *a = nd->in[0], *b = nd->in[1], *bias = nd->in[2];
    cl_mem am = mlc__cl_in(ctx, a), bm = am ? mlc__cl_in(ctx, b) : NULL,
           gc = bm ? mlc__cl_grad_in(ctx, nd->out) : NULL, g;
    cl_float beta;
    int B = mm->batches;
    if (!gc) return 0;
    if (a->requires_grad) {
        if (!(g = mlc__cl_grad_over(ctx, a, &beta))) return 0;
        if (!mm->ta
            && !mlc__cl_gemm(ctx, 0, !mm->tb, mm->M, mm->K, mm->N, gc, 0, mm->step_c, bm, 0, mm->step_b, beta,
                             g, 0, mm->step_a, B, NULL))
            return 0;
        if (mm->ta
            && !mlc__cl_gemm(ctx, mm->tb, 1, mm->K, mm->M, mm->N, bm, 0, mm->step_b, gc, 0, mm->step_c, beta,
                             g, 0, mm->step_a, B, NULL))
            return 0;
    }
    if (b->requires_grad) {
        if (!(g = mlc__cl_grad_over(ctx, b, &beta))) return 0;
        if (!mm->tb
            && !mlc__cl_gemm(ctx, !mm->ta, 0, mm->K, mm->N, mm->M, am, 0, mm->step_a, gc, 0, mm->step_c, beta,
                             g, 0, mm->step_b, B, NULL))
            return 0;
        if (mm->tb
            && !mlc__cl_gemm(ctx, 1, mm->ta, mm->N, mm->K, mm->M, gc, 0, mm->step_c, am, 0, mm->step_a, beta,
                             g, 0, mm->step_b, B, NULL))
            return 0;
    }
    if (bias && bias->requires_grad) {
        cl_int rows = (cl_int)(nd->out->size / (size_t)mm->N), n = mm->N;
        cl_ulong off = 0;
        mlc__cl_arg args[] = { MLC__CL_ARG(rows), MLC__CL_ARG(n), MLC__CL_ARG(gc), MLC__CL_ARG(g),
                               MLC__CL_ARG(off),  MLC__CL_ARG(beta) };
        if (!(g = mlc__cl_grad_over(ctx, bias, &beta))) return 0;
        if (!mlc__cl_run(ctx, MLC__CL_K_column_sums, (size_t)mm->N, args, 6)) return 0;
    }
    return 1;
}

/* The convolution's shape as the im2col / col2im kernels take it, for chunks of nb images. */
static void mlc__cl_conv_args(const mlc__conv *cv, int nb, cl_int8 *q, cl_int8 *r) {
    memset(q, 0, sizeof *q); memset(r, 0, sizeof *r);
    q->s[0] = cv->C; q->s[1] = cv->H; q->s[2] = cv->W; q->s[3] = cv->KH; q->s[4] = cv->KW;
    q->s[5] = cv->OH; q->s[6] = cv->OW;
    r->s[0] = cv->sh; r->s[1] = cv->sw; r->s[2] = cv->ph; r->s[3] = cv->pw;
    r->s[4] = cv->dh; r->s[5] = cv->dw; r->s[6] = cv->C / cv->groups; r->s[7] = nb;
}

#ifndef MLC_OPENCL_CONV_SCRATCH
#define MLC_OPENCL_CONV_SCRATCH (1 << 24)
#endif

/* Images per chunk: the chunk's columns [Cg KH KW, nb P] and its output in the GEMM's layout
   [O, nb P] take at most MLC_OPENCL_CONV_SCRATCH floats, and a chunk holds one image at least. */
static int mlc__cl_conv_chunk(const mlc__conv *cv) {
    size_t per_image = ((size_t)cv->C / cv->groups * cv->KH * cv->KW + cv->O) * cv->OH * cv->OW, nb;
    nb = per_image ? (size_t)(MLC_OPENCL_CONV_SCRATCH) / per_image : (size_t)cv->N;
    return nb < 1 ? 1 : nb > (size_t)cv->N ? cv->N : (int)nb;
}

/* Between y (or dy) [N, O, P] and the GEMM's layout [O, nb P], for images first .. first + nb. */
static int mlc__cl_conv_layout(mlc_ctx *ctx, const mlc__conv *cv, int first, int nb, cl_mem nop, cl_mem onp,
                               int to_nop, cl_mem bias) {
    cl_int n = nb, O = cv->O, P = cv->OH * cv->OW, to = to_nop, has_bias = bias != NULL;
    cl_ulong off = (size_t)first * cv->O * P;
    cl_mem b = bias ? bias : onp;
    mlc__cl_arg args[] = { MLC__CL_ARG(n),   MLC__CL_ARG(O),   MLC__CL_ARG(P),
                           MLC__CL_ARG(nop), MLC__CL_ARG(off), MLC__CL_ARG(onp),
                           MLC__CL_ARG(to),  MLC__CL_ARG(b),   MLC__CL_ARG(has_bias) };
    return mlc__cl_run(ctx, MLC__CL_K_conv_layout, (size_t)nb * cv->O * P, args, 9);
}

/* col = im2col of nb images' group from x_off on (q, r from mlc__cl_conv_args; by pointer, since
   gcc notes an ABI change for passing 32-byte vector types such as cl_int8 by value) */
static int mlc__cl_im2col(mlc_ctx *ctx, const mlc__conv *cv, int nb, const cl_int8 *q, const cl_int8 *r,
                          cl_mem xm, cl_ulong x_off, cl_mem col) {
    mlc__cl_arg args[] = { MLC__CL_ARG(*q), MLC__CL_ARG(*r), MLC__CL_ARG(xm), MLC__CL_ARG(x_off),
                           MLC__CL_ARG(col) };
    return mlc__cl_run(ctx, MLC__CL_K_im2col,
                       (size_t)cv->C / cv->groups * cv->KH * cv->KW * nb * cv->OH * cv->OW, args, 5);
}

/* Whether the convolution is depthwise (groups = C = O, MobileNet's 3x3s), for the direct
   kernels: one launch each way instead of an im2col and a GEMM per channel; every index of the
   input, the output and the weight within an int */
static int mlc__cl_depthwise(const mlc__conv *cv) {
    const size_t most = (size_t)2147483647;
    return cv->groups > 1 && cv->groups == cv->C && cv->C == cv->O
           && (size_t)cv->N * cv->C * cv->H * cv->W < most && (size_t)cv->N * cv->O * cv->OH * cv->OW < most;
}

/* per chunk of nb images: for each group g, col = im2col(x), Y_g = W_g col ([Og, nb P]); then
   y = Y in [N, O, P] order, plus b. Depthwise: y directly. */
static int mlc__cl_conv2d(mlc_ctx *ctx, mlc__node *call) {
    const mlc__conv *cv = (const mlc__conv *)call->saved;
    mlc_tensor *bias = call->in[2];
    int Cg = cv->C / cv->groups, Og = cv->O / cv->groups, P = cv->OH * cv->OW, rows = Cg * cv->KH * cv->KW;
    int chunk = mlc__cl_conv_chunk(cv), first, g;
    cl_mem xm = mlc__cl_in(ctx, call->in[0]), wm = xm ? mlc__cl_in(ctx, call->in[1]) : NULL;
    cl_mem bm = wm && bias ? mlc__cl_in(ctx, bias) : NULL, ym = wm ? mlc__cl_out(ctx, call->out) : NULL;
    cl_mem col, yg;
    cl_int8 q;
    cl_int8 r;
    if (!ym || (bias && !bm)) return 1;                   /* the error is set */
    if (mlc__cl_depthwise(cv)) {
        cl_int has_bias = bias != NULL;
        cl_mem b = bm ? bm : wm;
        mlc__cl_arg args[] = { MLC__CL_ARG(q),  MLC__CL_ARG(r),        MLC__CL_ARG(xm), MLC__CL_ARG(wm),
                               MLC__CL_ARG(b),  MLC__CL_ARG(has_bias), MLC__CL_ARG(ym) };
        mlc__cl_conv_args(cv, cv->N, &q, &r);
        mlc__cl_run(ctx, MLC__CL_K_depthwise, call->out->size, args, 7);
        return 1;
    }
    col = mlc__cl_scratch(ctx, (size_t)rows * chunk * P);
    yg = col ? mlc__cl_scratch(ctx, (size_t)cv->O * chunk * P) : NULL;
    if (!yg) return 1;
    for (first = 0; first < cv->N; first += chunk) {
        int nb = cv->N - first < chunk ? cv->N - first : chunk;
        mlc__cl_conv_args(cv, nb, &q, &r);
        for (g = 0; g < cv->groups; g++) {
            cl_ulong x_off = ((size_t)first * cv->C + (size_t)g * Cg) * cv->H * cv->W;
            if (!mlc__cl_im2col(ctx, cv, nb, &q, &r, xm, x_off, col)) return 1;
            if (!mlc__cl_gemm(ctx, 0, 0, Og, nb * P, rows, wm, (size_t)g * Og * rows, 0, col, 0, 0, 0.0f,
                              yg, (size_t)g * Og * nb * P, 0, 1, NULL)) return ctx->error != 0;
        }
        if (!mlc__cl_conv_layout(ctx, cv, first, nb, ym, yg, 1, bm)) return 1;
    }
    return 1;
}

/* per chunk: dY = dy in the GEMM's layout; per group dW_g += dY_g colᵀ, dcol = W_gᵀ dY_g and
   col2im into dx; db = Σ dy. Depthwise: dW and dx by the direct kernels. The first chunk writes over a
   gradient that counts as zeros (dW's product, beta 0), col2im writes each element of dx in one chunk only,
   so with beta 0 too. */
static int mlc__cl_conv2d_backward(mlc_ctx *ctx, mlc__node *nd) {
    const mlc__conv *cv = (const mlc__conv *)nd->saved;
    mlc_tensor *x = nd->in[0], *w = nd->in[1], *b = nd->in[2];
    int Cg = cv->C / cv->groups, Og = cv->O / cv->groups, P = cv->OH * cv->OW, rows = Cg * cv->KH * cv->KW;
    int chunk = mlc__cl_conv_chunk(cv), first, g;
    cl_mem xm = mlc__cl_in(ctx, x), wm = xm ? mlc__cl_in(ctx, w) : NULL,
           dy = wm ? mlc__cl_grad_in(ctx, nd->out) : NULL;
    cl_mem gx = NULL, gw = NULL, gb, col = NULL, dyg = NULL;
    cl_float bx = 1.0f, bw = 1.0f, bb;
    cl_int8 q;
    cl_int8 r;
    if (!dy) return 0;
    if (x->requires_grad && !(gx = mlc__cl_grad_over(ctx, x, &bx))) return 0;
    if (w->requires_grad && !(gw = cv->N ? mlc__cl_grad_over(ctx, w, &bw) : mlc__cl_grad(ctx, w)))
        return 0;                                       /* no images: no product writes dW */
    if (mlc__cl_depthwise(cv)) {
        mlc__cl_arg wargs[] = { MLC__CL_ARG(q),  MLC__CL_ARG(r),  MLC__CL_ARG(xm),
                                MLC__CL_ARG(dy), MLC__CL_ARG(gw), MLC__CL_ARG(bw) };
        mlc__cl_arg xargs[] = { MLC__CL_ARG(q),  MLC__CL_ARG(r),  MLC__CL_ARG(dy),
                                MLC__CL_ARG(wm), MLC__CL_ARG(gx), MLC__CL_ARG(bx) };
        mlc__cl_conv_args(cv, cv->N, &q, &r);
        if (gw && cv->N && !mlc__cl_run_groups(ctx, MLC__CL_K_depthwise_grad_w, w->size, wargs, 6)) return 0;
        if (gx && !mlc__cl_run(ctx, MLC__CL_K_depthwise_grad_x, x->size, xargs, 6)) return 0;
    } else if (!(col = mlc__cl_scratch(ctx, (size_t)rows * chunk * P))
               || !(dyg = mlc__cl_scratch(ctx, (size_t)cv->O * chunk * P)))
        return 0;
    for (first = 0; first < cv->N && (gx || gw) && !mlc__cl_depthwise(cv); first += chunk) {
        int nb = cv->N - first < chunk ? cv->N - first : chunk;
        mlc__cl_conv_args(cv, nb, &q, &r);
        if (!mlc__cl_conv_layout(ctx, cv, first, nb, dy, dyg, 0, NULL)) return 0;
        for (g = 0; g < cv->groups; g++) {
            cl_ulong x_off = ((size_t)first * cv->C + (size_t)g * Cg) * cv->H * cv->W;
            size_t dy_off = (size_t)g * Og * nb * P;
            if (gw) {
                if (!mlc__cl_im2col(ctx, cv, nb, &q, &r, xm, x_off, col)) return 0;
                if (!mlc__cl_gemm(ctx, 0, 1, Og, rows, nb * P, dyg, dy_off, 0, col, 0, 0, first ? 1.0f : bw,
                                  gw, (size_t)g * Og * rows, 0, 1, NULL))
                    return 0;
            }
            if (gx) {
                mlc__cl_arg args[] = { MLC__CL_ARG(q),   MLC__CL_ARG(r),     MLC__CL_ARG(col),
                                       MLC__CL_ARG(gx),  MLC__CL_ARG(x_off), MLC__CL_ARG(bx) };
                if (!mlc__cl_gemm(ctx, 1, 0, rows, nb * P, Og, wm, (size_t)g * Og * rows, 0, dyg, dy_off, 0,
                                  0.0f, col, 0, 0, 1, NULL))
                    return 0;
                if (!mlc__cl_run(ctx, MLC__CL_K_col2im, (size_t)nb * Cg * cv->H * cv->W, args, 6)) return 0;
            }
        }
    }
    if (b && b->requires_grad) {
        cl_int N = cv->N, O = cv->O, PP = P;
        mlc__cl_arg args[] = { MLC__CL_ARG(N), MLC__CL_ARG(O),  MLC__CL_ARG(PP),
                               MLC__CL_ARG(dy), MLC__CL_ARG(gb), MLC__CL_ARG(bb) };
        if (!(gb = mlc__cl_grad_over(ctx, b, &bb))) return 0;
        if (!mlc__cl_run_groups(ctx, MLC__CL_K_conv_bias_grad, (size_t)cv->O, args, 6)) return 0;
    }
    return 1;
}

static int mlc__cl_pool(mlc_ctx *ctx, mlc__node *call, int backward) {
    mlc_tensor *x = call->in[0], *y = call->out;
    cl_int planes = x->shape[0] * x->shape[1], H = x->shape[2], W = x->shape[3], OH = y->shape[2],
           OW = y->shape[3];
    cl_int8 v;
    cl_float beta;
    cl_mem xm = mlc__cl_in(ctx, x), ym, gx;
    mlc__cl_arg args[] = { MLC__CL_ARG(planes), MLC__CL_ARG(H),  MLC__CL_ARG(W),  MLC__CL_ARG(OH),
                           MLC__CL_ARG(OW),     MLC__CL_ARG(v),  MLC__CL_ARG(xm), MLC__CL_ARG(ym),
                           MLC__CL_ARG(gx),     MLC__CL_ARG(beta) };
    v.s[0] = call->args.pool.kh; v.s[1] = call->args.pool.kw; v.s[2] = call->args.pool.sh;
    v.s[3] = call->args.pool.sw; v.s[4] = call->args.pool.ph; v.s[5] = call->args.pool.pw;
    v.s[6] = call->args.pool.is_max; v.s[7] = call->args.pool.exclude_pad;
    if (!xm) return backward ? 0 : 1;
    if (!backward) {
        if (!(ym = mlc__cl_out(ctx, y))) return 1;
        mlc__cl_run(ctx, MLC__CL_K_pool, y->size, args, 8);
        return 1;
    }
    if (!x->requires_grad) return 1;
    if (!(ym = mlc__cl_grad_in(ctx, y)) || !(gx = mlc__cl_grad_over(ctx, x, &beta))) return 0;
    return mlc__cl_run(ctx, MLC__CL_K_pool_grad, x->size, args, 10);
}

static int mlc__cl_reduce(mlc_ctx *ctx, mlc__node *call, int backward) {
    mlc_tensor *x = call->in[0], *y = call->out;
    cl_int kind = call->args.reduce.kind, len = call->args.reduce.len, inner = call->args.reduce.inner;
    cl_int unbiased = call->args.reduce.unbiased;
    cl_int outer = len && inner ? (cl_int)(x->size / ((size_t)len * inner)) : 0;
    cl_mem xm = mlc__cl_in(ctx, x), ym, gx;
    if (!xm) return backward ? 0 : 1;
    if (!backward) {
        mlc__cl_arg args[] = { MLC__CL_ARG(kind), MLC__CL_ARG(outer), MLC__CL_ARG(len), MLC__CL_ARG(inner),
                               MLC__CL_ARG(unbiased), MLC__CL_ARG(xm), MLC__CL_ARG(ym) };
        if (!(ym = mlc__cl_out(ctx, y))) return 1;
        mlc__cl_run(ctx, MLC__CL_K_reduce, y->size, args, 7);
        return 1;
    }
    if (!x->requires_grad) return 1;
    {   /* max and var: the argmax or the mean per output first (pre, scratch) */
        cl_int pre_kind = kind == MLC__REDUCE_MAX ? MLC__REDUCE_ARGMAX : MLC__REDUCE_MEAN;
        cl_mem pre = xm;
        mlc__cl_arg pre_args[] = { MLC__CL_ARG(pre_kind), MLC__CL_ARG(outer), MLC__CL_ARG(len),
                                   MLC__CL_ARG(inner),    MLC__CL_ARG(unbiased), MLC__CL_ARG(xm),
                                   MLC__CL_ARG(pre) };
        mlc__cl_arg args[] = { MLC__CL_ARG(kind), MLC__CL_ARG(outer), MLC__CL_ARG(len), MLC__CL_ARG(inner),
                               MLC__CL_ARG(unbiased), MLC__CL_ARG(xm), MLC__CL_ARG(ym), MLC__CL_ARG(pre),
                               MLC__CL_ARG(gx) };
        if (!(ym = mlc__cl_grad_in(ctx, y)) || !(gx = mlc__cl_grad(ctx, x))) return 0;
        if ((kind == MLC__REDUCE_MAX || kind == MLC__REDUCE_VAR)
            && (!(pre = mlc__cl_scratch(ctx, y->size + 1))
                || !mlc__cl_run(ctx, MLC__CL_K_reduce, y->size, pre_args, 7)))
            return 0;
        return mlc__cl_run(ctx, MLC__CL_K_reduce_grad, x->size, args, 9);
    }
}

static int mlc__cl_softmax(mlc_ctx *ctx, mlc__node *call, int backward) {
    mlc_tensor *x = call->in[0], *y = call->out;
    cl_int is_log = call->args.softmax.is_log, len = call->args.softmax.len, inner = call->args.softmax.inner;
    cl_int outer = len && inner ? (cl_int)(x->size / ((size_t)len * inner)) : 0;
    cl_mem a, b, c;
    if (!backward) {
        mlc__cl_arg args[] = { MLC__CL_ARG(is_log), MLC__CL_ARG(outer), MLC__CL_ARG(len),
                               MLC__CL_ARG(inner),  MLC__CL_ARG(a),     MLC__CL_ARG(b) };
        if (!(a = mlc__cl_in(ctx, x)) || !(b = mlc__cl_out(ctx, y))) return 1;
        mlc__cl_run(ctx, MLC__CL_K_softmax, (size_t)outer * inner, args, 6);
        return 1;
    }
    if (!x->requires_grad) return 1;
    {
        mlc__cl_arg args[] = { MLC__CL_ARG(is_log), MLC__CL_ARG(outer), MLC__CL_ARG(len), MLC__CL_ARG(inner),
                               MLC__CL_ARG(a), MLC__CL_ARG(b), MLC__CL_ARG(c) };
        if (!(a = mlc__cl_in(ctx, y)) || !(b = mlc__cl_grad_in(ctx, y)) || !(c = mlc__cl_grad(ctx, x)))
            return 0;
        return mlc__cl_run(ctx, MLC__CL_K_softmax_grad, (size_t)outer * inner, args, 7);
    }
}

/* The buffer for a loss's per-element values: the output itself (none), else scratch. */
static cl_mem mlc__cl_loss_rows(mlc_ctx *ctx, mlc__node *call, size_t count) {
    return call->args.loss.reduction == MLC_REDUCE_NONE ? mlc__cl_out(ctx, call->out)
                                                         : mlc__cl_scratch(ctx, count);
}

/* y = the sum or mean of the per-element losses l (none: l is y already) */
static int mlc__cl_loss_total(mlc_ctx *ctx, mlc__node *call, cl_mem l, size_t count) {
    cl_int n = (cl_int)count, red = call->args.loss.reduction;
    cl_float scale = call->args.loss.scale;
    cl_mem y;
    mlc__cl_arg args[] = { MLC__CL_ARG(n), MLC__CL_ARG(red), MLC__CL_ARG(scale), MLC__CL_ARG(l),
                           MLC__CL_ARG(y) };
    if (red == MLC_REDUCE_NONE || !(y = mlc__cl_out(ctx, call->out))) return 1;
    mlc__cl_run_groups(ctx, MLC__CL_K_loss_total, 1, args, 5);
    return 1;
}

static int mlc__cl_class_loss(mlc_ctx *ctx, mlc__node *call, int backward) {
    mlc_tensor *x = call->in[0], *t = call->in[1];
    cl_int sm = call->args.loss.softmax_first, N = x->shape[0], C = x->shape[1],
           ignore = call->args.loss.ignore_index;
    cl_int red = call->args.loss.reduction;
    cl_float scale = call->args.loss.scale, eps = call->args.loss.smoothing;
    cl_mem xm = mlc__cl_in(ctx, x), tm = xm ? mlc__cl_in(ctx, t) : NULL, l, y, g, gx;
    if (!tm) return backward ? 0 : 1;
    if (!backward) {                   /* a batch one work-group holds: the rows and the total at once */
        size_t local;
        cl_int total;
        mlc__cl_arg args[] = { MLC__CL_ARG(sm), MLC__CL_ARG(N),   MLC__CL_ARG(C),     MLC__CL_ARG(ignore),
                               MLC__CL_ARG(eps), MLC__CL_ARG(xm), MLC__CL_ARG(tm),    MLC__CL_ARG(l),
                               MLC__CL_ARG(total), MLC__CL_ARG(red), MLC__CL_ARG(scale), MLC__CL_ARG(y) };
        if (!mlc__cl_kernel(ctx, MLC__CL_K_class_loss, &local) || !(y = mlc__cl_out(ctx, call->out))
            || !(l = mlc__cl_loss_rows(ctx, call, (size_t)N)))
            return 1;
        total = red != MLC_REDUCE_NONE && (size_t)N <= local;
        if (!mlc__cl_run(ctx, MLC__CL_K_class_loss, total ? local : (size_t)N, args, 12) || total) return 1;
        return mlc__cl_loss_total(ctx, call, l, (size_t)N);
    }
    if (!x->requires_grad) return 1;
    {
        cl_float beta;
        mlc__cl_arg args[] = { MLC__CL_ARG(sm),  MLC__CL_ARG(N),     MLC__CL_ARG(C),  MLC__CL_ARG(ignore),
                               MLC__CL_ARG(eps), MLC__CL_ARG(red),   MLC__CL_ARG(scale), MLC__CL_ARG(xm),
                               MLC__CL_ARG(tm),  MLC__CL_ARG(g),     MLC__CL_ARG(gx), MLC__CL_ARG(beta) };
        if (!(g = mlc__cl_grad_in(ctx, call->out)) || !(gx = mlc__cl_grad_over(ctx, x, &beta))) return 0;
        return mlc__cl_run(ctx, MLC__CL_K_class_loss_grad, (size_t)N, args, 12);
    }
}

static int mlc__cl_pointwise_loss(mlc_ctx *ctx, mlc__node *call, int backward) {
    mlc_tensor *p = call->in[0], *t = call->in[1];
    cl_int kind = call->args.loss.kind, n = (cl_int)p->size, red = call->args.loss.reduction;
    cl_int want_p = p->requires_grad, want_t = t->requires_grad;
    cl_float scale = call->args.loss.scale;
    cl_mem pm = mlc__cl_in(ctx, p), tm = pm ? mlc__cl_in(ctx, t) : NULL, l, g, gp, gt;
    if (!tm) return backward ? 0 : 1;
    if (!backward) {
        mlc__cl_arg args[] = { MLC__CL_ARG(kind), MLC__CL_ARG(n), MLC__CL_ARG(pm), MLC__CL_ARG(tm),
                               MLC__CL_ARG(l) };
        if (!(l = mlc__cl_loss_rows(ctx, call, p->size))) return 1;
        if (!mlc__cl_run(ctx, MLC__CL_K_pointwise_loss, p->size, args, 5)) return 1;
        return mlc__cl_loss_total(ctx, call, l, p->size);
    }
    if (!(g = mlc__cl_grad_in(ctx, call->out))) return 0;
    gp = want_p ? mlc__cl_grad(ctx, p) : g;
    gt = want_t ? mlc__cl_grad(ctx, t) : g;
    if (!gp || !gt) return 0;
    {
        mlc__cl_arg args[] = { MLC__CL_ARG(kind), MLC__CL_ARG(n),      MLC__CL_ARG(red),   MLC__CL_ARG(scale),
                               MLC__CL_ARG(pm),   MLC__CL_ARG(tm),     MLC__CL_ARG(g),     MLC__CL_ARG(gp),
                               MLC__CL_ARG(gt),   MLC__CL_ARG(want_p), MLC__CL_ARG(want_t) };
        return mlc__cl_run(ctx, MLC__CL_K_pointwise_loss_grad, p->size, args, 11);
    }
}

/* An optional input's buffer, or `other` as a placeholder the kernel does not read. */
static cl_mem mlc__cl_maybe(mlc_ctx *ctx, mlc_tensor *t, cl_mem other) {
    return t ? mlc__cl_in(ctx, t) : other;
}

static int mlc__cl_layer_norm(mlc_ctx *ctx, mlc__node *call, int backward) {
    mlc_tensor *x = call->in[0], *w = call->in[1], *b = call->in[2];
    cl_int D = call->args.layer_norm.D, rows = D ? (cl_int)(x->size / (size_t)D) : 0, has_w = w != NULL,
           has_b = b != NULL;
    cl_float eps = call->args.layer_norm.eps;
    cl_mem xm = mlc__cl_in(ctx, x), wm = xm ? mlc__cl_maybe(ctx, w, xm) : NULL,
           bm = wm ? mlc__cl_maybe(ctx, b, xm) : NULL;
    cl_mem ym, g, gx, gw, gb;
    if (!bm) return backward ? 0 : 1;
    if (!backward) {
        mlc__cl_arg args[] = { MLC__CL_ARG(rows), MLC__CL_ARG(D),     MLC__CL_ARG(eps),
                               MLC__CL_ARG(xm),   MLC__CL_ARG(wm),    MLC__CL_ARG(has_w),
                               MLC__CL_ARG(bm),   MLC__CL_ARG(has_b), MLC__CL_ARG(ym) };
        if (!(ym = mlc__cl_out(ctx, call->out))) return 1;
        mlc__cl_run(ctx, MLC__CL_K_layer_norm, (size_t)rows, args, 9);
        return 1;
    }
    if (!(g = mlc__cl_grad_in(ctx, call->out))) return 0;
    if (x->requires_grad) {
        mlc__cl_arg args[] = { MLC__CL_ARG(rows), MLC__CL_ARG(D),     MLC__CL_ARG(eps), MLC__CL_ARG(xm),
                               MLC__CL_ARG(wm),   MLC__CL_ARG(has_w), MLC__CL_ARG(g),   MLC__CL_ARG(gx) };
        if (!(gx = mlc__cl_grad(ctx, x))
            || !mlc__cl_run(ctx, MLC__CL_K_layer_norm_grad, (size_t)rows, args, 8))
            return 0;
    }
    {   /* the rows' statistics once (scratch), then one work-item per column */
        cl_int want_w = w && w->requires_grad, want_b = b && b->requires_grad;
        cl_mem stats;
        mlc__cl_arg stats_args[] = { MLC__CL_ARG(rows), MLC__CL_ARG(D), MLC__CL_ARG(eps), MLC__CL_ARG(xm),
                                     MLC__CL_ARG(stats) };
        mlc__cl_arg args[] = { MLC__CL_ARG(rows),   MLC__CL_ARG(D),  MLC__CL_ARG(stats),
                               MLC__CL_ARG(xm),     MLC__CL_ARG(g),  MLC__CL_ARG(gw),
                               MLC__CL_ARG(want_w), MLC__CL_ARG(gb), MLC__CL_ARG(want_b) };
        if (!want_w && !want_b) return 1;
        gw = want_w ? mlc__cl_grad(ctx, w) : g;
        gb = want_b ? mlc__cl_grad(ctx, b) : g;
        return gw && gb && (stats = mlc__cl_scratch(ctx, 2 * (size_t)rows + 1))
               && mlc__cl_run(ctx, MLC__CL_K_layer_norm_stats, (size_t)rows, stats_args, 5)
               && mlc__cl_run(ctx, MLC__CL_K_layer_norm_param_grad, (size_t)D, args, 9);
    }
}

static int mlc__cl_batch_norm(mlc_ctx *ctx, mlc__node *call, int backward) {
    mlc_tensor *x = call->in[0], *w = call->in[1], *b = call->in[2], *rm = call->in[3], *rv = call->in[4];
    cl_int N = x->shape[0], C = x->shape[1], inner = (cl_int)mlc__numel(x->ndim - 2, x->shape + 2),
           training = call->args.batch_norm.training;
    cl_int has_w = w != NULL, has_b = b != NULL, has_rm = rm != NULL, has_rv = rv != NULL;
    cl_float momentum = call->args.batch_norm.momentum, eps = call->args.batch_norm.eps;
    cl_mem xm = mlc__cl_in(ctx, x), wm = xm ? mlc__cl_maybe(ctx, w, xm) : NULL,
           bm = wm ? mlc__cl_maybe(ctx, b, xm) : NULL;
    cl_mem rmm = bm ? mlc__cl_maybe(ctx, rm, xm) : NULL, rvm = rmm ? mlc__cl_maybe(ctx, rv, xm) : NULL, ym, g,
           gx, gw, gb;
    if (!rvm) return backward ? 0 : 1;
    if (!backward) {
        mlc__cl_arg args[] = { MLC__CL_ARG(N),        MLC__CL_ARG(C),        MLC__CL_ARG(inner),
                               MLC__CL_ARG(training), MLC__CL_ARG(momentum), MLC__CL_ARG(eps),
                               MLC__CL_ARG(xm),       MLC__CL_ARG(wm),       MLC__CL_ARG(has_w),
                               MLC__CL_ARG(bm),       MLC__CL_ARG(has_b),    MLC__CL_ARG(rmm),
                               MLC__CL_ARG(has_rm),   MLC__CL_ARG(rvm),      MLC__CL_ARG(has_rv),
                               MLC__CL_ARG(ym) };
        if (!(ym = mlc__cl_out(ctx, call->out))) return 1;
        mlc__cl_run_groups(ctx, MLC__CL_K_batch_norm, (size_t)C, args, 16);
        return 1;
    }
    {
        cl_int want_x = x->requires_grad, want_w = w && w->requires_grad, want_b = b && b->requires_grad;
        cl_float bx = 1.0f, bw = 1.0f, bb = 1.0f;
        mlc__cl_arg args[] = { MLC__CL_ARG(N),        MLC__CL_ARG(C),     MLC__CL_ARG(inner),
                               MLC__CL_ARG(training), MLC__CL_ARG(eps),   MLC__CL_ARG(xm),
                               MLC__CL_ARG(wm),       MLC__CL_ARG(has_w), MLC__CL_ARG(rmm),
                               MLC__CL_ARG(rvm),      MLC__CL_ARG(g),     MLC__CL_ARG(gx),
                               MLC__CL_ARG(want_x),   MLC__CL_ARG(gw),    MLC__CL_ARG(want_w),
                               MLC__CL_ARG(gb),       MLC__CL_ARG(want_b), MLC__CL_ARG(bx),
                               MLC__CL_ARG(bw),       MLC__CL_ARG(bb) };
        if (!(g = mlc__cl_grad_in(ctx, call->out))) return 0;
        gx = want_x ? mlc__cl_grad_over(ctx, x, &bx) : g;
        gw = want_w ? mlc__cl_grad_over(ctx, w, &bw) : g;
        gb = want_b ? mlc__cl_grad_over(ctx, b, &bb) : g;
        return gx && gw && gb && mlc__cl_run_groups(ctx, MLC__CL_K_batch_norm_grad, (size_t)C, args, 20);
    }
}

/* The shape most one-input families share: forward reads x into y (*a = x, *b = y), backward
   adds dy into dx (*a = dy, *b = dx), or with beta given writes dx as its kernel's result + *beta
   dx (mlc__cl_grad_over); args point at *a, *b and *beta, which are set before the run. */
static int mlc__cl_x_to_y(mlc_ctx *ctx, mlc__node *n, int backward, int forward_kernel, int backward_kernel,
                          size_t work, const mlc__cl_arg *args, int count, cl_mem *a, cl_mem *b,
                          cl_float *beta) {
    mlc_tensor *x = n->in[0];
    if (!backward) {
        if ((*a = mlc__cl_in(ctx, x)) && (*b = mlc__cl_out(ctx, n->out)))
            mlc__cl_run(ctx, forward_kernel, work, args, count);
        return 1;
    }
    if (!x->requires_grad) return 1;
    if (!(*a = mlc__cl_grad_in(ctx, n->out))) return 0;
    if (!(*b = beta ? mlc__cl_grad_over(ctx, x, beta) : mlc__cl_grad(ctx, x))) return 0;
    return mlc__cl_run(ctx, backward_kernel, work, args, count);
}

static int mlc__cl_dropout(mlc_ctx *ctx, mlc__node *call, int backward) {
    mlc_tensor *x = call->in[0];
    cl_int n = (cl_int)x->size;
    cl_uint seed = (cl_uint)call->args.dropout.seed;
    cl_float p = call->args.dropout.p, beta;
    cl_mem a, b;
    mlc__cl_arg args[] = { MLC__CL_ARG(n), MLC__CL_ARG(seed), MLC__CL_ARG(p), MLC__CL_ARG(a),
                           MLC__CL_ARG(b), MLC__CL_ARG(beta) };
    return mlc__cl_x_to_y(ctx, call, backward, MLC__CL_K_dropout, MLC__CL_K_dropout_grad, x->size, args,
                          backward ? 6 : 5, &a, &b, &beta);
}

/* y = cumsum(x) along the axis; backward dx += the reversed running sums of dy */
static int mlc__cl_cumsum(mlc_ctx *ctx, mlc__node *call, int backward) {
    mlc_tensor *x = call->in[0];
    cl_int len = call->args.cumsum.len, reverse = backward;
    cl_ulong inner = (cl_ulong)call->args.cumsum.inner,
             outer = len && inner ? x->size / ((size_t)len * inner) : 0;
    cl_mem a, b;
    mlc__cl_arg args[] = { MLC__CL_ARG(outer), MLC__CL_ARG(len), MLC__CL_ARG(inner), MLC__CL_ARG(reverse),
                           MLC__CL_ARG(a), MLC__CL_ARG(b) };
    return mlc__cl_x_to_y(ctx, call, backward, MLC__CL_K_cumsum, MLC__CL_K_cumsum, (size_t)(outer * inner),
                          args, 6, &a, &b, NULL);
}

/* y[o, yoff + j] (+)= x[o, xoff + j] for j < width, rows of xlen and ylen floats */
static int mlc__cl_copy_rows(mlc_ctx *ctx, size_t outer, size_t width, cl_mem x, size_t xlen, size_t xoff,
                             cl_mem y, size_t ylen, size_t yoff, int add) {
    cl_ulong o = outer, w = width, xl = xlen, xo = xoff, yl = ylen, yo = yoff;
    cl_int a = add;
    mlc__cl_arg args[] = { MLC__CL_ARG(o), MLC__CL_ARG(w), MLC__CL_ARG(x), MLC__CL_ARG(xl), MLC__CL_ARG(xo),
                           MLC__CL_ARG(y), MLC__CL_ARG(yl), MLC__CL_ARG(yo), MLC__CL_ARG(a) };
    return mlc__cl_run(ctx, MLC__CL_K_copy_rows, outer * width, args, 9);
}

static int mlc__cl_slice(mlc_ctx *ctx, mlc__node *call, int backward) {
    mlc_tensor *x = call->in[0];
    size_t outer, inner;
    int len, start = call->args.slice.start, count = call->args.slice.count;
    cl_mem a, b;
    mlc__split(x, call->args.slice.axis, &outer, &len, &inner);
    if (!backward) {
        if (!(a = mlc__cl_in(ctx, x)) || !(b = mlc__cl_out(ctx, call->out))) return 1;
        mlc__cl_copy_rows(ctx, outer, (size_t)count * inner, a, (size_t)len * inner, (size_t)start * inner, b,
                          (size_t)count * inner, 0, 0);
        return 1;
    }
    if (!x->requires_grad) return 1;
    if (!(a = mlc__cl_grad_in(ctx, call->out)) || !(b = mlc__cl_grad(ctx, x))) return 0;
    return mlc__cl_copy_rows(ctx, outer, (size_t)count * inner, a, (size_t)count * inner, 0, b,
                             (size_t)len * inner, (size_t)start * inner, 1);
}

static int mlc__cl_concat(mlc_ctx *ctx, mlc__node *call, int backward) {
    mlc_tensor **xs = (mlc_tensor **)call->saved;
    int count = call->args.concat.count, axis = call->args.concat.axis, total = call->out->shape[axis], k,
        offset = 0;
    cl_mem y = backward ? mlc__cl_grad_in(ctx, call->out) : mlc__cl_out(ctx, call->out), x;
    if (!y) return backward ? 0 : 1;
    for (k = 0; k < count; k++) {
        size_t outer, inner;
        int len;
        mlc__split(xs[k], axis, &outer, &len, &inner);
        if (!backward) {
            if (!(x = mlc__cl_in(ctx, xs[k]))) return 1;
            mlc__cl_copy_rows(ctx, outer, (size_t)len * inner, x, (size_t)len * inner, 0, y,
                              (size_t)total * inner, (size_t)offset * inner, 0);
        } else if (xs[k]->requires_grad) {
            if (!(x = mlc__cl_grad(ctx, xs[k]))) return 0;
            if (!mlc__cl_copy_rows(ctx, outer, (size_t)len * inner, y, (size_t)total * inner,
                                   (size_t)offset * inner, x, (size_t)len * inner, 0, 1))
                return 0;
        }
        offset += len;
    }
    return 1;
}

static int mlc__cl_permute(mlc_ctx *ctx, mlc__node *call, int backward) {
    mlc_tensor *x = call->in[0];
    cl_int n = (cl_int)x->size, nd = x->ndim, s[6] = { 0, 0, 0, 0, 0, 0 }, dims[6] = { 1, 1, 1, 1, 1, 1 },
           back = backward;
    cl_int xstride[MLC_MAX_DIMS];
    cl_mem a, b;
    int d, acc = 1;
    for (d = x->ndim - 1; d >= 0; d--) { xstride[d] = acc; acc *= x->shape[d]; }
    for (d = 0; d < x->ndim; d++) {
        s[d] = xstride[call->args.permute.order[d]];
        dims[d] = call->out->shape[d];
    }
    {
        mlc__cl_arg args[] = { MLC__CL_ARG(n),       MLC__CL_ARG(nd),      MLC__CL_ARG(s[0]),
                               MLC__CL_ARG(s[1]),    MLC__CL_ARG(s[2]),    MLC__CL_ARG(s[3]),
                               MLC__CL_ARG(s[4]),    MLC__CL_ARG(s[5]),    MLC__CL_ARG(dims[0]),
                               MLC__CL_ARG(dims[1]), MLC__CL_ARG(dims[2]), MLC__CL_ARG(dims[3]),
                               MLC__CL_ARG(dims[4]), MLC__CL_ARG(dims[5]), MLC__CL_ARG(a),
                               MLC__CL_ARG(b),       MLC__CL_ARG(back) };
        return mlc__cl_x_to_y(ctx, call, backward, MLC__CL_K_permute, MLC__CL_K_permute, x->size, args, 17,
                              &a, &b, NULL);
    }
}

static int mlc__cl_index_select(mlc_ctx *ctx, mlc__node *call, int backward) {
    mlc_tensor *x = call->in[0], *idx = call->in[1];
    size_t outer, inner;
    int len;
    cl_int o, l, in, L = (cl_int)idx->size;
    cl_mem im, a, b;
    mlc__split(x, call->args.index_select.axis, &outer, &len, &inner);
    o = (cl_int)outer; l = len; in = (cl_int)inner;
    {
        mlc__cl_arg args[] = { MLC__CL_ARG(o),  MLC__CL_ARG(l), MLC__CL_ARG(in), MLC__CL_ARG(L),
                               MLC__CL_ARG(im), MLC__CL_ARG(a), MLC__CL_ARG(b) };
        if (!(im = mlc__cl_in(ctx, idx))) return backward ? 0 : 1;
        return mlc__cl_x_to_y(ctx, call, backward, MLC__CL_K_index_select, MLC__CL_K_index_select_grad,
                              call->out->size, args, 7, &a, &b, NULL);
    }
}

/* gather: the host's offsets (checked there) go to the device as ints; the node keeps that
   buffer in place of the host map, for the backward */
static int mlc__cl_gather(mlc_ctx *ctx, mlc__node *call, int backward) {
    mlc_tensor *x = call->in[0], *y = call->out;
    cl_int n = (cl_int)y->size;
    cl_mem mm = (cl_mem)call->saved, a, b;
    mlc__cl_arg args[] = { MLC__CL_ARG(n), MLC__CL_ARG(mm), MLC__CL_ARG(a), MLC__CL_ARG(b) };
    if (!backward) {
        const size_t *map = (const size_t *)call->saved;
        cl_int *ints = (cl_int *)mlc__arena_alloc(ctx, y->size * sizeof(cl_int) + 4, "mlc_gather");
        size_t i;
        if (!ints || !(mm = mlc__cl_scratch(ctx, y->size + 1))) return 1;
        for (i = 0; i < y->size; i++) ints[i] = (cl_int)map[i];
        if (y->size
            && !mlc__cl_check(ctx,
                              mlc__cl.EnqueueWriteBuffer(mlc__cl_st(ctx)->queue, mm, CL_FALSE, 0,
                                                         y->size * sizeof(cl_int), ints, 0, NULL, NULL),
                              "clEnqueueWriteBuffer"))
            return 1;
        mlc__cl_st(ctx)->pending = 1;
        call->saved = (void *)mm;
        if (!(a = mlc__cl_in(ctx, x)) || !(b = mlc__cl_out(ctx, y))) return 1;
        mlc__cl_run(ctx, MLC__CL_K_gather, y->size, args, 4);
        return 1;
    }
    if (!x->requires_grad) return 1;
    if (!(a = mlc__cl_grad_in(ctx, y)) || !(b = mlc__cl_grad(ctx, x))) return 0;
    return mlc__cl_run(ctx, MLC__CL_K_gather_grad, y->size, args, 4);
}

/* where (cond, a, b) and masked_fill (x, mask, value) through one kernel pair */
static void mlc__cl_bcast_args(const mlc__bcast *bc, int k, cl_int8 *stride) {
    int d;
    memset(stride, 0, sizeof *stride);
    for (d = 0; d < bc->ndim; d++) stride->s[d] = (cl_int)bc->stride[k][d];
}

static int mlc__cl_where(mlc_ctx *ctx, mlc__node *call, int backward) {
    int masked = call->op == MLC__OP_MASKED_FILL, count = masked ? 2 : 3, d, side;
    int ci = masked ? 1 : 0, ai = masked ? 0 : 1, bi = masked ? 0 : 2;  /* masked_fill: cond = mask, b = x */
    mlc__bcast bc;
    cl_int n = (cl_int)call->out->size, nd, a_is_fill = masked;
    cl_int8 shape, sc, sa, sb;
    cl_float fill = call->args.masked_fill.value;
    cl_mem cm, am, bm, ym, g, dg;
    if (!mlc__broadcast(ctx, call->name, &bc, count, call->in)) return backward ? 0 : 1;
    nd = bc.ndim;
    memset(&shape, 0, sizeof shape);
    for (d = 0; d < bc.ndim; d++) shape.s[d] = bc.shape[d];
    mlc__cl_bcast_args(&bc, ci, &sc); mlc__cl_bcast_args(&bc, ai, &sa); mlc__cl_bcast_args(&bc, bi, &sb);
    if (!(cm = mlc__cl_in(ctx, call->in[ci])) || !(am = mlc__cl_in(ctx, call->in[ai]))
        || !(bm = mlc__cl_in(ctx, call->in[bi])))
        return backward ? 0 : 1;
    if (!backward) {
        mlc__cl_arg args[] = { MLC__CL_ARG(n),  MLC__CL_ARG(nd),   MLC__CL_ARG(shape),     MLC__CL_ARG(sc),
                               MLC__CL_ARG(sa), MLC__CL_ARG(sb),   MLC__CL_ARG(cm),        MLC__CL_ARG(am),
                               MLC__CL_ARG(bm), MLC__CL_ARG(fill), MLC__CL_ARG(a_is_fill), MLC__CL_ARG(ym) };
        if (!(ym = mlc__cl_out(ctx, call->out))) return 1;
        mlc__cl_run(ctx, MLC__CL_K_where, call->out->size, args, 12);
        return 1;
    }
    if (!(g = mlc__cl_grad_in(ctx, call->out))) return 0;
    for (side = masked ? 1 : 0; side < 2; side++) {
        mlc_tensor *t = call->in[side == 0 ? ai : bi];
        cl_int s = side;
        cl_int8 *sg = side == 0 ? &sa : &sb;
        mlc__cl_arg args[] = { MLC__CL_ARG(n),  MLC__CL_ARG(nd),         MLC__CL_ARG(shape),
                               MLC__CL_ARG(sc), { sizeof(cl_int8), sg }, MLC__CL_ARG(s),
                               MLC__CL_ARG(cm), MLC__CL_ARG(g),          MLC__CL_ARG(dg) };
        if (!t->requires_grad) continue;
        if (!(dg = mlc__cl_grad(ctx, t)) || !mlc__cl_run(ctx, MLC__CL_K_where_grad, call->out->size, args, 9))
            return 0;
    }
    return 1;
}

/* attention: forward keeps each row's log-sum-exp in a scratch buffer (the node's saved);
   backward: Δ and dq per query row, then dk and dv per key row. The kernels share their first
   16 arguments (sizes, settings, q, k, v, mask); `tail` holds the rest. */
static int mlc__cl_attention_run(mlc_ctx *ctx, int kernel, size_t n, const mlc__cl_arg *head,
                                 const mlc__cl_arg *tail, int count) {
    mlc__cl_arg args[24];
    memcpy(args, head, 16 * sizeof *args);
    memcpy(args + 16, tail, (size_t)count * sizeof *args);
    return mlc__cl_run(ctx, kernel, n, args, 16 + count);
}

static int mlc__cl_attention(mlc_ctx *ctx, mlc__node *call, int backward) {
    mlc_tensor *q = call->in[0], *k = call->in[1], *v = call->in[2], *mask = call->in[3];
    const mlc__attention_args *a = &call->args.attention;
    cl_int H = a->H, T = a->T, S = a->S, D = a->D, Dv = a->Dv, causal = a->causal, BH = a->B * a->H;
    cl_int has_mask = mask != NULL, want_q = q->requires_grad, want_k = k->requires_grad;
    cl_int want_v = v->requires_grad;
    cl_float scale = a->scale, p = a->dropout;
    cl_uint seed = a->seed;
    cl_int4 ms;
    cl_mem qm = mlc__cl_in(ctx, q), km = qm ? mlc__cl_in(ctx, k) : NULL, vm = km ? mlc__cl_in(ctx, v) : NULL;
    cl_mem mm = vm ? mlc__cl_maybe(ctx, mask, qm) : NULL, lse = (cl_mem)call->saved, ym, g, delta, dq, dk, dv;
    mlc__cl_arg head[] = { MLC__CL_ARG(BH), MLC__CL_ARG(H), MLC__CL_ARG(T), MLC__CL_ARG(S), MLC__CL_ARG(D),
                           MLC__CL_ARG(Dv), MLC__CL_ARG(causal), MLC__CL_ARG(scale), MLC__CL_ARG(p),
                           MLC__CL_ARG(seed), MLC__CL_ARG(qm), MLC__CL_ARG(km), MLC__CL_ARG(vm),
                           MLC__CL_ARG(mm), MLC__CL_ARG(has_mask), MLC__CL_ARG(ms) };
    mlc__cl_arg forward[] = { MLC__CL_ARG(ym), MLC__CL_ARG(lse) };
    mlc__cl_arg rows[] = { MLC__CL_ARG(lse), MLC__CL_ARG(g), MLC__CL_ARG(delta), MLC__CL_ARG(dq),
                           MLC__CL_ARG(want_q) };
    mlc__cl_arg keys[] = { MLC__CL_ARG(lse), MLC__CL_ARG(g), MLC__CL_ARG(delta), MLC__CL_ARG(dk),
                           MLC__CL_ARG(want_k), MLC__CL_ARG(dv), MLC__CL_ARG(want_v) };
    ms.s[0] = a->mask_stride[0]; ms.s[1] = a->mask_stride[1]; ms.s[2] = a->mask_stride[2];
    ms.s[3] = a->mask_stride[3];
    if (!mm) return backward ? 0 : 1;
    if (!backward) {
        if (!(lse = mlc__cl_scratch(ctx, (size_t)BH * (size_t)T + 1)) || !(ym = mlc__cl_out(ctx, call->out)))
            return 1;
        call->saved = (void *)lse;
        mlc__cl_attention_run(ctx, MLC__CL_K_attention, (size_t)BH * (size_t)T, head, forward, 2);
        return 1;
    }
    if (!(g = mlc__cl_grad_in(ctx, call->out)) || !(delta = mlc__cl_scratch(ctx, (size_t)BH * (size_t)T + 1)))
        return 0;
    if (!(dq = want_q ? mlc__cl_grad(ctx, q) : g) ||
        !mlc__cl_attention_run(ctx, MLC__CL_K_attention_grad_q, (size_t)BH * (size_t)T, head, rows, 5))
        return 0;
    if (!want_k && !want_v) return 1;
    dk = want_k ? mlc__cl_grad(ctx, k) : g;
    dv = want_v ? mlc__cl_grad(ctx, v) : g;
    return dk && dv && mlc__cl_attention_run(ctx, MLC__CL_K_attention_grad_kv, (size_t)BH * (size_t)S, head,
                                             keys, 7);
}

/* ============================================================================================
   @section cl-backend  The backend table's entries
   ============================================================================================ */

/* Which ops have kernels here: all but the int8 ones, which run on the CPU (each with its
   forward and its backward). */
#define MLC__CL_HAS_KERNELS(name, forward, backward) (MLC__OP_##name != MLC__OP_LINEAR_INT8),
static const unsigned char mlc__cl_kernels[] = { MLC__OPS(MLC__CL_HAS_KERNELS) };
#undef MLC__CL_HAS_KERNELS
typedef char mlc__cl_kernels_cover_every_op[sizeof mlc__cl_kernels == MLC__OP_COUNT ? 1 : -1];

/* Run node n forward or backward. 1: it ran here (or failed, with the error set); 0: the
   device cannot take it (a work-group too large), so mlc.h runs the forward on the CPU (a
   backward only comes for nodes whose forward ran here: it adds into the inputs' gradients). */
static int mlc__cl_run_op(mlc_ctx *ctx, mlc__node *n, int backward) {
    mlc__cl_st(ctx)->op = n->name;
    switch (n->op) {
    case MLC__OP_UNARY:          return backward ? mlc__cl_unary_backward(ctx, n) : mlc__cl_unary(ctx, n);
    case MLC__OP_BINARY:         return backward ? mlc__cl_binary_backward(ctx, n) : mlc__cl_binary(ctx, n);
    case MLC__OP_RESHAPE:                                /* forward: the core made the view */
    case MLC__OP_COPY:           return backward ? mlc__cl_accumulate_backward(ctx, n) : mlc__cl_copy(ctx, n);
    case MLC__OP_MATMUL:         return backward ? mlc__cl_matmul_backward(ctx, n) : mlc__cl_matmul(ctx, n);
    case MLC__OP_CONV2D:         return backward ? mlc__cl_conv2d_backward(ctx, n) : mlc__cl_conv2d(ctx, n);
    case MLC__OP_POOL:           return mlc__cl_pool(ctx, n, backward);
    case MLC__OP_REDUCE:         return mlc__cl_reduce(ctx, n, backward);
    case MLC__OP_CUMSUM:         return mlc__cl_cumsum(ctx, n, backward);
    case MLC__OP_SOFTMAX:        return mlc__cl_softmax(ctx, n, backward);
    case MLC__OP_CLASS_LOSS:     return mlc__cl_class_loss(ctx, n, backward);
    case MLC__OP_POINTWISE_LOSS: return mlc__cl_pointwise_loss(ctx, n, backward);
    case MLC__OP_LAYER_NORM:     return mlc__cl_layer_norm(ctx, n, backward);
    case MLC__OP_BATCH_NORM:     return mlc__cl_batch_norm(ctx, n, backward);
    case MLC__OP_DROPOUT:        return mlc__cl_dropout(ctx, n, backward);
    case MLC__OP_SLICE:          return mlc__cl_slice(ctx, n, backward);
    case MLC__OP_CONCAT:         return mlc__cl_concat(ctx, n, backward);
    case MLC__OP_PERMUTE:        return mlc__cl_permute(ctx, n, backward);
    case MLC__OP_INDEX_SELECT:   return mlc__cl_index_select(ctx, n, backward);
    case MLC__OP_GATHER:         return mlc__cl_gather(ctx, n, backward);
    case MLC__OP_WHERE:
    case MLC__OP_MASKED_FILL:    return mlc__cl_where(ctx, n, backward);
    case MLC__OP_ATTENTION:      return mlc__cl_attention(ctx, n, backward);
    case MLC__OP_LINEAR_INT8:                            /* (no kernel: the CPU's) */
    case MLC__OP_COUNT:          break;
    }
    return 0;
}

/* An optimiser's launch over a group of parameters, as MLC_SLOTS in the kernels: st->slots (8,
   or 4) slots of the buffers of a parameter, its gradient and its state, opt->state[3 i + k]
   (p's buffer stands in where the rule keeps none; slots past the group repeat its first), the
   parameter's size, and the work-item where the slot starts, a multiple of the kernel's
   work-group size (slots past the group start at the launch's end). */
typedef struct mlc__cl_group {
    cl_ulong8 starts, sizes;
    cl_mem mem[MLC__CL_SLOTS][5];       /* p, g, state 0, 1, 2 */
    int count;                          /* parameters in the group */
    size_t items;                       /* the launch's work-items */
} mlc__cl_group;

/* Up to st->slots of the `count` parameters from `first` (all on the device) for `kernel`, while their
   state is there too with their size and the launch stays within 2^31 - 1 work-items. 0
   parameters: the first has no such state, or an error is set. */
static int mlc__cl_group_of(mlc_optim *opt, int first, int count, int kernel, mlc__cl_group *gr) {
    mlc_ctx *ctx = opt->ctx;
    cl_ulong total = 0, padded;
    size_t local;
    int n, k;
    if (!mlc__cl_kernel(ctx, kernel, &local)) return 0;
    for (n = 0; n < count && n < mlc__cl_st(ctx)->slots; n++) {
        mlc_tensor *p = opt->params[first + n], **s = opt->state + 3 * (first + n);
        cl_mem *m = gr->mem[n];
        padded = (p->size + local - 1) / local * local;
        for (k = 0; k < 3; k++) if (s[k] && (!s[k]->on_device || s[k]->size != p->size)) break;
        if (k < 3 || (n && total + padded > 2147483647u)) break;
        if (!(m[0] = mlc__cl_in(ctx, p)) || !(m[1] = mlc__cl_grad_in(ctx, p))) return 0;
        for (k = 0; k < 3; k++) if (!(m[2 + k] = s[k] ? mlc__cl_in(ctx, s[k]) : m[0])) return 0;
        gr->starts.s[n] = total;
        gr->sizes.s[n] = p->size;
        total += padded;
    }
    if (!n) return 0;
    for (k = n; k < MLC__CL_SLOTS; k++) {
        gr->starts.s[k] = total;
        gr->sizes.s[k] = 0;
        memcpy(gr->mem[k], gr->mem[0], sizeof gr->mem[0]);
    }
    gr->items = (size_t)total;
    return gr->count = n;
}

/* Run an optimiser's kernel over the group: the slots' arguments, then the rule's (at most 8). */
static void mlc__cl_run_group(mlc_ctx *ctx, int kernel, mlc__cl_group *gr, const mlc__cl_arg *rule,
                              int count) {
    mlc__cl_arg args[2 + 5 * MLC__CL_SLOTS + 8];
    int k, slots = mlc__cl_st(ctx)->slots;
    MLC_ASSERT(count <= 8);
    args[0].size = args[1].size = (size_t)slots * sizeof(cl_ulong);   /* ulong8's (or ulong4's) lanes */
    args[0].value = &gr->starts;
    args[1].value = &gr->sizes;
    for (k = 0; k < 5 * slots; k++) {
        args[2 + k].size = sizeof(cl_mem);
        args[2 + k].value = &gr->mem[k / 5][k % 5];
    }
    for (k = 0; k < count; k++) args[2 + 5 * slots + k] = rule[k];
    mlc__cl_run(ctx, kernel, gr->items, args, 2 + 5 * slots + count);
}

/* The update of up to st->slots parameters from `first` in one launch. Returns how many (mlc_step then
   marks them and their state stale on the host); 0: none (an error is set, or the first one's
   state is not on the device and the CPU updates it). */
static int mlc__cl_step(mlc_optim *opt, int first, int count) {
    mlc_ctx *ctx = opt->ctx;
    mlc__cl_group gr;
    int kernel = opt->kind == MLC__SGD ? MLC__CL_K_sgd : opt->kind == MLC__RMSPROP ? MLC__CL_K_rmsprop
                                                                                 : MLC__CL_K_adam;
    mlc__cl_st(ctx)->op = "mlc_step";
    if (!mlc__cl_group_of(opt, first, count, kernel, &gr)) return 0;
    if (opt->kind == MLC__SGD) {
        cl_float lr = opt->lr, wd = opt->weight_decay, mu = opt->momentum, keep = 1.0f - opt->dampening;
        cl_int first_step = opt->t == 1, nesterov = opt->nesterov;
        mlc__cl_arg args[] = { MLC__CL_ARG(lr),   MLC__CL_ARG(wd),         MLC__CL_ARG(mu),
                               MLC__CL_ARG(keep), MLC__CL_ARG(first_step), MLC__CL_ARG(nesterov) };
        mlc__cl_run_group(ctx, kernel, &gr, args, 6);
    } else if (opt->kind == MLC__RMSPROP) {
        cl_float lr = opt->lr, wd = opt->weight_decay, a = opt->beta2, eps = opt->eps, mu = opt->momentum;
        cl_int centered = opt->centered;
        mlc__cl_arg args[] = { MLC__CL_ARG(lr),  MLC__CL_ARG(wd), MLC__CL_ARG(a),
                               MLC__CL_ARG(eps), MLC__CL_ARG(mu), MLC__CL_ARG(centered) };
        mlc__cl_run_group(ctx, kernel, &gr, args, 6);
    } else {                                             /* the constants as mlc__adam_update has them */
        cl_float b1 = opt->beta1, b2 = opt->beta2, eps = opt->eps;
        cl_float l2 = opt->kind == MLC__ADAM ? opt->weight_decay : 0.0f;
        cl_float shrink = opt->kind == MLC__ADAMW ? 1.0f - opt->lr * opt->weight_decay : 1.0f;
        cl_float step = (float)((double)opt->lr / (1.0 - pow((double)opt->beta1, (double)opt->t)));
        cl_float inv_bc2 = (float)(1.0 / (1.0 - pow((double)opt->beta2, (double)opt->t)));
        cl_int amsgrad = opt->amsgrad;
        mlc__cl_arg args[] = { MLC__CL_ARG(b1),     MLC__CL_ARG(b2),   MLC__CL_ARG(eps),
                               MLC__CL_ARG(l2),     MLC__CL_ARG(shrink), MLC__CL_ARG(step),
                               MLC__CL_ARG(inv_bc2), MLC__CL_ARG(amsgrad) };
        mlc__cl_run_group(ctx, kernel, &gr, args, 8);
    }
    return ctx->error ? 0 : gr.count;
}

/* For the op being run (mlc__device_grad fills a gradient that a kernel of it reads). */
static int mlc__cl_fill(mlc_tensor *t, int grad, float value) {
    mlc_ctx *ctx = t->ctx;
    cl_mem mem;
    return (mem = mlc__cl_buffer(ctx, t, grad)) && mlc__cl_fill_mem(ctx, mem, t->size, value);
}

static int mlc__cl_upload(mlc_tensor *t, int grad) { return mlc__cl_upload_(t->ctx, t, grad); }

/* Device -> host copy, waiting for it (and so for every command before it). */
static int mlc__cl_download(mlc_tensor *t, int grad) {
    mlc_ctx *ctx = t->ctx;
    mlc__cl_state *st = mlc__cl_st(ctx);
    void *mem = grad ? t->device_grad : t->device_data;
    void *host = mlc__host_copy_of(t, grad);
    if (ctx->error) return 0;
    if (!mem || !host) return 1;                         /* nothing on the device to bring up */
    st->op = "download";
    ctx->stats.downloads++;
    if (!t->size) return 1;
    if (!mlc__cl_check(ctx,
                       mlc__cl.EnqueueReadBuffer(st->queue, (cl_mem)mem, CL_TRUE, 0, mlc__bytes_of(t, grad),
                                                 host, 0, NULL, NULL),
                       "clEnqueueReadBuffer"))
        return 0;
    st->pending = 0;
    return 1;
}

/* A frame ends: the device finishes reading the host memory of its uploads; all (mlc_sync): the
   device finishes everything queued. */
static void mlc__cl_wait(mlc_ctx *ctx, int all) {
    mlc__cl_state *st = mlc__cl_st(ctx);
    if (st->pending || all) { mlc__cl.Finish(st->queue); st->pending = 0; }
}

static void mlc__cl_destroy(mlc_ctx *ctx) {
    mlc__cl_state *st = mlc__cl_st(ctx);
    int i;
    if (!st) return;
    mlc__cl.Finish(st->queue);
    for (i = 0; i < MLC__CL_KERNEL_COUNT; i++) if (st->kernels[i]) mlc__cl.ReleaseKernel(st->kernels[i]);
    if (st->program) mlc__cl.ReleaseProgram(st->program);
    mlc__cl.ReleaseCommandQueue(st->queue);
    mlc__cl.ReleaseContext(st->context);
    mlc__heap_free(ctx, st);
    ctx->device = NULL;
}

static int mlc__cl_open(mlc_ctx *ctx, const char *spec);
static int mlc__cl_devices(mlc_device_info *out, int max);
/* The one internal not named mlc__cl_*: mlc.h's backend registry and the tests know each backend
   by the name mlc__<backend>_backend, so this stays mlc__opencl_backend. */
static const mlc__backend mlc__opencl_backend = { "opencl",        mlc__cl_open,     mlc__cl_devices,
                                                  mlc__cl_kernels, mlc__cl_run_op,   mlc__cl_step,
                                                  mlc__cl_fill,    mlc__cl_upload,   mlc__cl_download,
                                                  mlc__cl_create,  mlc__cl_release,  mlc__cl_wait,
                                                  mlc__cl_destroy };

/* ============================================================================================
   @section cl-open  Opening a device: "opencl", "opencl:N", "best", or a piece of a device's name
   ============================================================================================ */

static int mlc__cl_lower(int c) { return c >= 'A' && c <= 'Z' ? c - 'A' + 'a' : c; }

/* Case-insensitive (ASCII): does `text` contain `piece`? */
static int mlc__cl_contains(const char *text, const char *piece) {
    size_t i, j;
    if (!*piece) return 0;
    for (i = 0; text[i]; i++) {
        for (j = 0; piece[j] && text[i + j] && mlc__cl_lower(text[i + j]) == mlc__cl_lower(piece[j]); j++) {}
        if (!piece[j]) return 1;
    }
    return 0;
}

/* Opens device `index` for `spec`; a driver that fails to open it is an error, or for "best"
   (quiet_failure) a warning, and the next GPU is tried. */
static int mlc__cl_open_device(mlc_ctx *ctx, cl_platform_id platform, cl_device_id device, int index,
                               const char *spec, int quiet_failure) {
    mlc__cl_state *st;
    cl_context_properties props[3];
    cl_ulong max_alloc = 0;
    size_t max_args = 0;
    cl_device_fp_config fp = 0;
    mlc_device_info info;
    cl_int err = CL_SUCCESS;
    char message[400];
    mlc__cl_describe(platform, device, index, &info);
    st = (mlc__cl_state *)mlc__heap_alloc(ctx, sizeof *st);
    if (!st) {
        mlc__fail(ctx, MLC_ERR_MEMORY, "mlc_create: device \"%s\": out of memory opening OpenCL device %d",
                  spec, index);
        return 0;
    }
    memset(st, 0, sizeof *st);
    props[0] = CL_CONTEXT_PLATFORM; props[1] = (cl_context_properties)platform; props[2] = 0;
    st->device = device;
    st->context = mlc__cl.CreateContext(props, 1, &device, NULL, NULL, &err);
    if (st->context) st->queue = mlc__cl.CreateCommandQueue(st->context, device, 0, &err);
    if (!st->queue) {
        mlc__format(message, sizeof message, "mlc_create: device \"%s\": cannot open OpenCL device %d (%s): "
                    "%s failed (%d)", spec, index, info.name,
                    st->context ? "clCreateCommandQueue" : "clCreateContext", (int)err);
        if (st->context) mlc__cl.ReleaseContext(st->context);
        mlc__heap_free(ctx, st);
        if (quiet_failure) { mlc__log(ctx, MLC_LOG_WARN, message); return 0; }
        mlc__fail(ctx, MLC_ERR_DEVICE, "%s", message);
        return 0;
    }
    mlc__cl.GetDeviceInfo(device, CL_DEVICE_MAX_MEM_ALLOC_SIZE, sizeof max_alloc, &max_alloc, NULL);
    mlc__cl.GetDeviceInfo(device, CL_DEVICE_SINGLE_FP_CONFIG, sizeof fp, &fp, NULL);
    mlc__cl.GetDeviceInfo(device, CL_DEVICE_MAX_PARAMETER_SIZE, sizeof max_args, &max_args, NULL);
    st->max_alloc = !max_alloc || max_alloc > (cl_ulong)(size_t)-1 ? (size_t)-1 : (size_t)max_alloc;
    st->max_args = max_args ? max_args : 256;          /* unanswered: the least OpenCL allows */
    st->exact_divide = (fp & CL_FP_CORRECTLY_ROUNDED_DIVIDE_SQRT) != 0;
    st->gemm_vector = strcmp(info.type, "cpu") == 0;
    st->compute_units = info.compute_units > 0 ? (size_t)info.compute_units : 1;
    st->op = "mlc_create";
    memcpy(st->name, info.name, sizeof st->name);
    mlc__format(ctx->device_name, sizeof ctx->device_name, "opencl:%d %s", index, info.name);
    ctx->device = st;
    ctx->backend = &mlc__opencl_backend;
    return 1;
}

static int mlc__cl_open(mlc_ctx *ctx, const char *spec) {
    cl_platform_id platforms[MLC__CL_MAX_DEVICES];
    cl_device_id devices[MLC__CL_MAX_DEVICES];
    int is_best = strcmp(spec, "best") == 0, index = -1, count, i;
    int is_opencl = 1;
    for (i = 0; i < 6; i++) if (mlc__cl_lower(spec[i]) != "opencl"[i]) { is_opencl = 0; break; }
    if (is_opencl && spec[6] != '\0' && spec[6] != ':') is_opencl = 0;
    if (is_opencl) {                                     /* "opencl" or "opencl:N" */
        index = 0;
        if (spec[6] == ':') {
            const char *c = spec + 7;
            for (index = 0; *c >= '0' && *c <= '9' && index < 100000; c++) index = index * 10 + (*c - '0');
            if (c == spec + 7 || *c) {
                mlc__fail(ctx, MLC_ERR_DEVICE,
                          "mlc_create: bad device \"%s\" (write opencl:N, N a row of mlc_devices)", spec);
                return 0;
            }
        }
    }
    if (!mlc__cl_load()) {                               /* "best": the CPU; a name: the next backend */
        if (is_opencl)
            mlc__fail(ctx, MLC_ERR_DEVICE,
                      "mlc_create: device \"%s\": no OpenCL library (libOpenCL.so.1, OpenCL.framework or "
                      "OpenCL.dll could not be loaded, or lacks OpenCL 1.2 functions)", spec);
        else if (is_best) mlc__log(ctx, MLC_LOG_INFO, "best: no OpenCL library");
        return 0;
    }
    count = mlc__cl_enumerate(platforms, devices);
    if (is_opencl) {
        if (count == 0) {
            mlc__fail(ctx, MLC_ERR_DEVICE, "mlc_create: device \"%s\": no OpenCL platform or device found "
                      "(is an OpenCL driver installed?)", spec);
            return 0;
        }
        if (index >= count) {
            mlc__fail(ctx, MLC_ERR_DEVICE, "mlc_create: device \"%s\": no OpenCL device %d (there are %d; "
                      "see mlc_devices)", spec, index, count);
            return 0;
        }
        return mlc__cl_open_device(ctx, platforms[index], devices[index], index, spec, 0);
    }
    for (i = 0; i < count && !ctx->error; i++) {
        if (is_best) {                                   /* a GPU; never an OpenCL CPU driver */
            cl_device_type type = 0;
            mlc__cl.GetDeviceInfo(devices[i], CL_DEVICE_TYPE, sizeof type, &type, NULL);
            if ((type & CL_DEVICE_TYPE_GPU) && mlc__cl_open_device(ctx, platforms[i], devices[i], i, spec, 1))
                return 1;
        } else {
            char name[128];
            mlc__cl_string(platforms[i], devices[i], CL_DEVICE_NAME, name, sizeof name);
            if (mlc__cl_contains(name, spec))
                return mlc__cl_open_device(ctx, platforms[i], devices[i], i, spec, 0);
        }
    }
    if (is_best && count > 0) {
        char message[200];
        mlc__format(message, sizeof message, "best: no OpenCL GPU among %d OpenCL device%s (name one, "
                    "such as \"opencl:0\", to run on an OpenCL CPU driver)", count, count == 1 ? "" : "s");
        mlc__log(ctx, MLC_LOG_INFO, message);
    } else if (is_best) mlc__log(ctx, MLC_LOG_INFO, "best: no OpenCL device");
    return 0;
}

#endif /* MLC_OPENCL_H */
