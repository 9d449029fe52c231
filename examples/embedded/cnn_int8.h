/* The int8 digits CNN, shared by export.c (the host's int8 predictions and test accuracy) and
   main_int8.c (the Cortex-M4F's), so both make the same calls and get the same integers:
     x float32 [N, 1, 8, 8] -> int8 at the input's scale and zero point
     -> conv 3x3 (batch norm folded in), ReLU as the output range [0, max] -> max pool 2
     -> conv 3x3 (batch norm folded in), ReLU as the output range [0, max] -> max pool 2
     -> flatten -> linear -> int8 logits [N, 10]
   Each layer's weight is int8 scaled per output row (mlc_quantize_weight's), its bias float32;
   the scales and zero points of the input and of each layer's output were calibrated by
   export.c on the training digits. Included after mlc.h. */
typedef struct { mlc_tensor *w, *b; float scale; int zero_point; } cnn_int8_layer;
typedef struct {
    float input_scale;
    int input_zero_point;
    cnn_int8_layer conv1, conv2, fc;
} cnn_int8;

static mlc_tensor *cnn_int8_logits(const cnn_int8 *net, mlc_tensor *x) {
    const mlc_conv_opts same = { .padding = 1 };
    const cnn_int8_layer *c1 = &net->conv1, *c2 = &net->conv2, *fc = &net->fc;
    mlc_tensor *h = mlc_quantize(x, net->input_scale, net->input_zero_point);
    h = mlc_max_pool2d(mlc_conv2d_int8(h, c1->w, c1->b, same, c1->scale, c1->zero_point), 2, 2, 0);
    h = mlc_max_pool2d(mlc_conv2d_int8(h, c2->w, c2->b, same, c2->scale, c2->zero_point), 2, 2, 0);
    return mlc_linear_int8(mlc_flatten(h, 1), fc->w, fc->b, fc->scale, fc->zero_point);
}

/* Row n's class: its first largest int8 logit (quantizing is monotone: no dequantize needed) */
static int cnn_int8_class(const mlc_tensor *logits, int n) {
    const int classes = logits->shape[1];
    const int8_t *row = logits->int8 + (size_t)n * classes;
    int k, best = 0;
    for (k = 1; k < classes; k++) best = row[k] > row[best] ? k : best;
    return best;
}

/* FNV-1a over row n's int8 logits, going on from hash (CNN_INT8_HASH at first): the host and
   the microcontroller compare every integer they computed, not only the classes */
#define CNN_INT8_HASH 2166136261u
static uint32_t cnn_int8_hash(const mlc_tensor *logits, int n, uint32_t hash) {
    const int classes = logits->shape[1];
    const int8_t *row = logits->int8 + (size_t)n * classes;
    int k;
    for (k = 0; k < classes; k++) hash = (hash ^ (uint8_t)row[k]) * 16777619u;
    return hash;
}
