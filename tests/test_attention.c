/* Scaled dot-product attention and MultiheadAttention: values against PyTorch 1.13 (Debian's
   python3-torch; it has no F.scaled_dot_product_attention, so the references are computed by
   hand: softmax(q kᵀ scale + mask) v, and torch.nn.MultiheadAttention(batch_first=True)),
   dropout's form, argument errors, and gradient checks (run on every device like all suites). */
#include "test.h"

/* The masks' tables write -∞ as NEG_INF and mask_of puts -INFINITY in at run time: tcc does not
   take -INFINITY in a static initialiser (glibc's is __builtin_inff(), not a constant to tcc). */
#define NEG_INF (-3.0e38f)
static mlc_tensor *mask_of(mlc_ctx *ctx, const float *table, int rows, int cols) {
    float m[64];
    int i;
    for (i = 0; i < rows * cols && i < 64; i++) m[i] = table[i] == NEG_INF ? -INFINITY : table[i];
    return mlc_from_data(ctx, MLC_SHAPE(rows, cols), m);
}

/* Reference values: made by PyTorch 1.13 (the script is in the comment of each block). */
/* Case 1 (q [1, 2, 3, 2], k [1, 2, 4, 2], v [1, 2, 4, 3], mask [3, 4], scale 1/√2) and case 2
   (rank 3, q, k, v [2, 4, 3], causal, scale 0.7); inputs vals(n, a, b)[i] = ((37 i + a) % 23) / 11
   - 1 + b; y and the gradients of Σ y w:
       s = q @ k.transpose(-1, -2) * scale + mask   (case 2: masked_fill(~tril, -inf))
       y = torch.softmax(s, -1) @ v;  (y * w).sum().backward()                                */
/* case 1 */
static const float aq[] = {
    -0.90909094f, 0.36363637f, -0.45454547f, 0.81818181f, 0.0f, -0.81818181f, 0.45454547f, -0.36363637f,
    0.90909094f, 0.090909094f, -0.72727275f, 0.54545456f
};
static const float ak[] = {
    -0.44545454f, 0.82727271f, 0.0090909088f, -0.80909091f, 0.46363637f, -0.35454544f, 0.91818184f, 0.1f,
    -0.71818179f, 0.55454546f, -0.26363635f, 1.0090909f, 0.19090909f, -0.62727273f, 0.64545453f,
    -0.17272727f
};
static const float av[] = {
    -0.28181818f, -1.1f, 0.17272727f, -0.64545453f, 0.62727273f, -0.19090909f, -1.0090909f, 0.26363635f,
    -0.55454546f, 0.71818179f, -0.1f, -0.91818184f, 0.35454544f, -0.46363637f, 0.80909091f, -0.0090909088f,
    -0.82727271f, 0.44545454f, -0.37272727f, 0.89999998f, 0.081818178f, -0.73636365f, 0.53636366f,
    -0.28181818f
};
static const float amask[] = {
    0.0f, -1.5f, 0.0f, NEG_INF, 0.5f, 0.0f, 0.0f, 0.0f, NEG_INF, 0.0f, 2.0f, 0.0f
};
static const float aw[] = {
    -0.72727275f, 0.54545456f, -0.27272728f, 1.0f, 0.18181819f, -0.63636363f, 0.63636363f, -0.18181819f,
    -1.0f, 0.27272728f, -0.54545456f, 0.72727275f, -0.090909094f, -0.90909094f, 0.36363637f, -0.45454547f,
    0.81818181f, 0.0f
};
static const float a1_y[] = {
    -0.50470257f, -0.6068989f, -0.050157152f, -0.2719135f, -0.55533946f, -0.13543832f, -0.81869531f,
    0.28409028f, -0.53409153f, -0.10642508f, 0.32179642f, 0.34812036f, -0.24860948f, 0.11755824f,
    0.20593596f, -0.32410982f, 0.48486835f, 0.13043569f
};
static const float a1_gq[] = {
    0.18909024f, -0.28909376f, 0.19768825f, -0.069360465f, 0.050461285f, 0.050461277f, -0.20533562f,
    0.30732763f, -0.21803486f, 0.29367337f, 0.093238033f, -0.30576229f
};
static const float a1_gk[] = {
    0.26596016f, -0.18765976f, -0.032862827f, 0.029966678f, -0.15628611f, 0.086765185f, -0.076811232f,
    0.070927896f, 0.19903895f, -0.064594492f, 0.27367416f, -0.10640321f, -0.35387892f, 0.17404267f,
    -0.11883417f, -0.0030450062f
};
static const float a1_gv[] = {
    0.11389238f, 0.46633512f, -0.55614573f, 0.15561967f, 0.036119632f, -0.23376602f, 0.43573698f,
    0.030119061f, -0.94109875f, 0.20384194f, 0.012880753f, -0.17808044f, 0.068110779f, -0.39377689f,
    0.32471502f, -0.098188534f, -0.039218247f, 0.12668866f, -0.17275724f, 0.023045063f, 0.52010894f,
    -0.069892295f, -0.22641361f, 0.11939652f
};
/* case 2 */
static const float bq[] = {
    -0.81818181f, 0.45454547f, -0.36363637f, 0.90909094f, 0.090909094f, -0.72727275f, 0.54545456f,
    -0.27272728f, 1.0f, 0.18181819f, -0.63636363f, 0.63636363f, -0.18181819f, -1.0f, 0.27272728f,
    -0.54545456f, 0.72727275f, -0.090909094f, -0.90909094f, 0.36363637f, -0.45454547f, 0.81818181f, 0.0f,
    -0.81818181f
};
static const float bk[] = {
    -0.36363637f, 0.90909094f, 0.090909094f, -0.72727275f, 0.54545456f, -0.27272728f, 1.0f, 0.18181819f,
    -0.63636363f, 0.63636363f, -0.18181819f, -1.0f, 0.27272728f, -0.54545456f, 0.72727275f, -0.090909094f,
    -0.90909094f, 0.36363637f, -0.45454547f, 0.81818181f, 0.0f, -0.81818181f, 0.45454547f, -0.36363637f
};
static const float bv[] = {
    0.2f, -0.61818182f, 0.65454543f, -0.16363636f, 1.1090909f, 0.29090908f, -0.5272727f, 0.74545455f,
    -0.07272727f, 1.2f, 0.38181818f, -0.43636364f, 0.83636361f, 0.018181818f, -0.80000001f, 0.47272727f,
    -0.34545454f, 0.92727274f, 0.10909091f, -0.70909089f, 0.56363636f, -0.25454545f, 1.0181818f, 0.2f
};
static const float bw[] = {
    -0.63636363f, 0.63636363f, -0.18181819f, -1.0f, 0.27272728f, -0.54545456f, 0.72727275f, -0.090909094f,
    -0.90909094f, 0.36363637f, -0.45454547f, 0.81818181f, 0.0f, -0.81818181f, 0.45454547f, -0.36363637f,
    0.90909094f, 0.090909094f, -0.72727275f, 0.54545456f, -0.27272728f, 1.0f, 0.18181819f, -0.63636363f
};
static const float b2_y[] = {
    0.2f, -0.61818182f, 0.65454543f, 0.024490334f, 0.21548909f, 0.47903574f, -0.18409091f, 0.36403233f,
    0.27045453f, 0.18210937f, 0.41147578f, 0.081821233f, 0.83636361f, 0.018181818f, -0.80000001f,
    0.65664905f, -0.16153277f, 0.053644329f, 0.34261748f, -0.47556436f, 0.38900834f, 0.29090908f,
    -0.0045454502f, 0.22272727f
};
static const float b2_gq[] = {
    0.0f, 0.0f, 0.0f, -0.065660909f, -0.065660901f, -0.065660909f, 0.015217578f, -0.001125956f,
    -0.001125958f, -0.13431667f, 0.099474959f, 0.099474952f, 0.0f, 0.0f, 0.0f, 0.0026292484f,
    0.0026292484f, 0.0026292484f, 0.012379336f, 0.0081975888f, 0.01237934f, 0.15383172f, -0.16520472f,
    0.15383171f
};
static const float b2_gk[] = {
    -0.13353251f, -0.1158606f, 0.23419997f, 0.14959867f, 0.046838392f, -0.1708625f, -0.01470357f,
    0.064253084f, -0.058568377f, -0.0013626062f, 0.0047691213f, -0.0047691213f, 0.13880327f, 0.016910575f,
    -0.18709975f, -0.015781093f, -0.016183313f, 0.061350338f, -0.073618554f, -0.00072725967f, 0.076345779f,
    -0.049403645f, 0.0f, 0.049403645f
};
static const float b2_gv[] = {
    -0.81671453f, 0.63975257f, -0.58789062f, -0.21924153f, 0.0074473694f, -0.30861133f, 0.39400885f,
    -0.16294757f, -0.13878874f, 0.09649279f, -0.12061599f, 0.21710877f, -0.075888574f, -0.20644771f,
    0.28819743f, -0.1128341f, 0.63208067f, -0.18283206f, -0.15218645f, 0.34709436f, -0.30991083f, 0.25f,
    0.045454547f, -0.15909091f
};

/* torch.manual_seed(3); m = torch.nn.MultiheadAttention(4, 2, batch_first=True); biases set to
   torch.randn * 0.1; x = torch.randn(2, 3, 4); key, value = torch.randn(2, 5, 4) each:
   m_self = m(x, x, x), m_causal with attn_mask = triu(-inf, 1), m_cross = m(x, key, value,
   key_padding_mask = [[F] * 5, [F, F, F, T, T]]) (need_weights=False) */
static const float m_in_w[] = {
    0.18164244f, -0.34934902f, 0.55028403f, -0.59754241f, -0.39084402f, -0.38246927f, -0.25383487f,
    0.12210543f, -0.46386567f, -0.47177687f, -0.29286146f, 0.37375775f, -0.44168943f, -0.54923457f,
    -0.53074837f, -0.30133945f, -0.16089971f, -0.60707611f, -0.28670517f, 0.011780599f, 0.10094602f,
    -0.087789074f, -0.069433972f, -0.39839381f, 0.31372207f, -0.14752354f, -0.41868931f, -0.1474742f,
    -0.085551821f, 0.56620306f, 0.31914288f, -0.24726841f, -0.086878389f, 0.54113477f, 0.39341056f,
    0.15268555f, -0.21966803f, 0.50954098f, 0.26235893f, -0.27273536f, 0.43457568f, 0.043645456f,
    -0.45288405f, -0.27142632f, -0.45862994f, -0.50719738f, 0.014970502f, -0.43884477f
};
static const float m_in_b[] = {
    0.13420355f, 0.14620037f, 0.043616097f, 0.10170136f, -0.21925269f, 0.021233067f, -0.093949683f,
    -0.032357827f, -0.10547109f, 0.082377277f, -0.05270502f, 0.081072591f
};
static const float m_out_w[] = {
    -0.49573648f, -0.39443064f, -0.21415752f, -0.47304517f, -0.028385639f, -0.43988371f, 0.27186584f,
    0.24369937f, 0.094421208f, 0.38785666f, -0.048968673f, 0.29949063f, -0.35015911f, -0.098531187f,
    -0.44582307f, -0.040594757f
};
static const float m_out_b[] = {
    -0.080459259f, -0.10500642f, -0.010965357f, 0.035296727f
};
static const float m_x[] = {
    0.39315513f, 0.91830486f, -0.26035559f, 0.050992571f, 0.66229397f, 0.62291282f, 0.4462918f, 0.7688117f,
    0.00044318414f, -0.57735032f, 1.0048155f, -0.94648421f, -0.12634651f, 0.31135994f, 2.4666879f,
    -1.0854398f, -0.050172698f, 0.54569393f, 1.0036533f, -0.66791177f, -1.0138646f, -1.1900103f,
    0.46343279f, 0.47954601f
};
static const float m_key[] = {
    -0.004910104f, 1.181324f, 0.74976301f, 1.4698726f, -0.79274404f, 1.0546854f, 1.2911229f, 0.15998074f,
    -0.19182737f, -0.12418174f, 0.95627666f, -0.11481882f, -0.40963158f, -0.035131223f, -0.53135896f,
    0.077629134f, 1.7882675f, 1.2003783f, -0.10646246f, -0.70824075f, -0.45668238f, -0.86403787f,
    -1.4276618f, -1.4490898f, 2.2695966f, -1.2888683f, 2.3588097f, 1.4992919f, 0.25936669f, -1.2482141f,
    -0.61595309f, 0.21589018f, 0.63518494f, -0.025467638f, -0.3331815f, 1.9829663f, 1.2884883f,
    -0.42549583f, -1.3260052f, -1.8426288f
};
static const float m_value[] = {
    1.1501018f, -0.69921207f, 0.49848506f, 1.7821758f, 0.35530502f, 0.66323227f, 0.91923565f, 1.2385943f,
    -0.42392483f, 1.1981275f, -0.62477815f, 2.0241864f, -0.49763641f, 1.7458025f, 1.4514744f, 1.9962282f,
    1.1798197f, 1.3848447f, -0.54354525f, 0.25834152f, 0.42427096f, -0.99682015f, -0.94363803f,
    -0.98953617f, -0.069866084f, 0.57736218f, -0.95821297f, 0.85531145f, -0.7520889f, -1.7852725f,
    0.34896258f, 0.54397285f, -0.16845593f, -1.2134824f, -0.88235694f, -1.7305914f, 1.1246477f,
    0.49499732f, -0.06857004f, -0.9405579f
};
static const float m_self[] = {
    -0.18973905f, -0.30134612f, 0.061977454f, -0.029451583f, -0.19141537f, -0.30060035f, 0.064145952f,
    -0.027190924f, -0.13388042f, -0.3043181f, 0.051215678f, 0.0049965214f, -0.074089728f, -0.10297009f,
    0.16535592f, 0.44498327f, -0.30845773f, -0.26371199f, 0.29463157f, 0.30879733f, -0.5060572f,
    -0.42622194f, 0.38912058f, 0.15124328f
};
static const float m_causal[] = {
    -0.13770068f, -0.35315508f, -0.028041301f, -0.18722302f, -0.025751907f, -0.40352017f, -0.096783802f,
    -0.10731719f, -0.13388042f, -0.3043181f, 0.051215678f, 0.0049965214f, -1.0316713f, -0.79177421f,
    0.73501354f, -0.0032585785f, -0.81998563f, -0.65599042f, 0.56678903f, -0.024151869f, -0.5060572f,
    -0.42622194f, 0.38912058f, 0.15124328f
};
static const float m_cross[] = {
    0.23154253f, -0.56384504f, -0.24435267f, 0.077330634f, 0.25174046f, -0.58915353f, -0.24853441f,
    0.1003636f, -0.073968723f, -0.66966909f, -0.10400616f, -0.10402413f, 0.45504496f, 0.21420217f,
    -0.23018898f, 0.39821917f, 0.34554461f, 0.21095324f, -0.18052256f, 0.34018445f, 0.21296456f,
    0.33799759f, -0.11054686f, 0.27854389f
};

#define T(ctx, data, ...) mlc_requires_grad(mlc_from_data(ctx, MLC_SHAPE(__VA_ARGS__), data), 1)
#define W(ctx, data, ...) mlc_from_data(ctx, MLC_SHAPE(__VA_ARGS__), data)
/* t's gradient equals want within 1e-5 */
#define CHECK_GRAD(t, want) do { const float *g_ = mlc_host_grad(t); size_t i_; CHECK(g_ != NULL); \
    for (i_ = 0; i_ < (t)->size; i_++) CHECK_NEAR(g_[i_], (want)[i_], 1e-5); } while (0)

static mlc_attention_opts opts_of(mlc_tensor *mask, int causal, float dropout, float scale) {
    mlc_attention_opts o;
    o.mask = mask; o.causal = causal; o.dropout = dropout; o.scale = scale;
    return o;
}

static int attention_values_mask(void) {
    mlc_ctx *ctx = test_ctx(1);
    mlc_tensor *q = T(ctx, aq, 1, 2, 3, 2), *k = T(ctx, ak, 1, 2, 4, 2), *v = T(ctx, av, 1, 2, 4, 3);
    mlc_tensor *y = mlc_attention(q, k, v, opts_of(mask_of(ctx, amask, 3, 4), 0, 0.0f, 0.0f));
    CHECK_MSG(y != NULL, "%s", mlc_error_message(ctx));
    CHECK(y->ndim == 4 && y->shape[2] == 3 && y->shape[3] == 3);
    CHECK_TENSOR(y, a1_y, 1e-5);
    CHECK(mlc_backward(mlc_sum_all(mlc_mul(y, W(ctx, aw, 1, 2, 3, 3)))) == MLC_OK);
    CHECK_GRAD(q, a1_gq);
    CHECK_GRAD(k, a1_gk);
    CHECK_GRAD(v, a1_gv);
    test_destroy(ctx);
    return 1;
}

static int attention_values_causal_rank3(void) {
    mlc_ctx *ctx = test_ctx(1);
    mlc_tensor *q = T(ctx, bq, 2, 4, 3), *k = T(ctx, bk, 2, 4, 3), *v = T(ctx, bv, 2, 4, 3);
    mlc_tensor *y = mlc_attention(q, k, v, opts_of(NULL, 1, 0.0f, 0.7f));
    CHECK_MSG(y != NULL, "%s", mlc_error_message(ctx));
    CHECK_TENSOR(y, b2_y, 1e-5);
    CHECK(mlc_backward(mlc_sum_all(mlc_mul(y, W(ctx, bw, 2, 4, 3)))) == MLC_OK);
    CHECK_GRAD(q, b2_gq);
    CHECK_GRAD(k, b2_gk);
    CHECK_GRAD(v, b2_gv);
    test_destroy(ctx);
    return 1;
}

/* With v the identity (S = Dv), y is the weights themselves: each is 0 (dropped) or the weight
   without dropout scaled by 1 / (1 - p); about p of them drop, and the draws repeat per seed. */
static int attention_dropout_form(void) {
    mlc_ctx *ctx = test_ctx(2);
    enum { H = 8, TT = 16, S = 16 };
    static float eye[H * S * S];
    mlc_tensor *q = mlc_randn(ctx, MLC_SHAPE(H, TT, 4)), *k = mlc_randn(ctx, MLC_SHAPE(H, S, 4));
    mlc_tensor *v, *plain, *dropped;
    const float *a, *b;
    size_t i, zeros = 0;
    for (i = 0; i < H * S * S; i++) eye[i] = i / S % S == i % S ? 1.0f : 0.0f;
    v = W(ctx, eye, H, S, S);
    plain = mlc_attention(q, k, v, opts_of(NULL, 0, 0.0f, 0.0f));
    dropped = mlc_attention(q, k, v, opts_of(NULL, 0, 0.25f, 0.0f));
    CHECK_MSG(plain && dropped, "%s", mlc_error_message(ctx));
    a = mlc_host_data(plain); b = mlc_host_data(dropped);
    for (i = 0; i < plain->size; i++) {
        if (b[i] == 0.0f) { zeros++; continue; }
        CHECK_NEAR(b[i], a[i] / 0.75f, 1e-5);
    }
    CHECK_MSG(zeros > 380 && zeros < 640, "%zu of 2048 weights dropped at p = 0.25", zeros);   /* std 20 */
    dropped = mlc_attention(q, k, v, opts_of(NULL, 0, 1.0f, 0.0f));
    b = mlc_host_data(dropped);
    for (i = 0; dropped && i < dropped->size; i++) CHECK(b[i] == 0.0f);
    CHECK(mlc_error(ctx) == MLC_OK);
    test_destroy(ctx);
    return 1;
}

/* A mask [B, 1, 1, S] (padding) broadcasts over heads and queries, as [T, S] does over batch
   and heads: the same as the mask written out whole. */
static int attention_mask_broadcast(void) {
    mlc_ctx *ctx = test_ctx(3);
    float pad[2 * 5] = { 0, 0, 0, 0, 0, 0, 0, 0, -INFINITY, -INFINITY }, full[2 * 3 * 4 * 5];
    mlc_tensor *q = mlc_randn(ctx, MLC_SHAPE(2, 3, 4, 2)), *k = mlc_randn(ctx, MLC_SHAPE(2, 3, 5, 2));
    mlc_tensor *v = mlc_randn(ctx, MLC_SHAPE(2, 3, 5, 3)), *a, *b;
    size_t i;
    for (i = 0; i < sizeof full / sizeof full[0]; i++) full[i] = pad[i / 60 * 5 + i % 5];
    a = mlc_attention(q, k, v, opts_of(W(ctx, pad, 2, 1, 1, 5), 0, 0.0f, 0.0f));
    b = mlc_attention(q, k, v, opts_of(W(ctx, full, 2, 3, 4, 5), 0, 0.0f, 0.0f));
    CHECK_MSG(a && b, "%s", mlc_error_message(ctx));
    CHECK_TENSOR(a, mlc_host_data(b), 1e-6);
    CHECK(mlc_attention(q, k, v, opts_of(W(ctx, pad, 2, 5), 0, 0.0f, 0.0f)) == NULL);
    CHECK(mlc_error(ctx) == MLC_ERR_SHAPE);
    CHECK(strstr(mlc_error_message(ctx), "mlc_attention") && strstr(mlc_error_message(ctx), "[2, 5]"));
    test_destroy(ctx);
    return 1;
}

static int attention_errors(void) {
    mlc_ctx *ctx = test_ctx(4);
    mlc_tensor *q = mlc_randn(ctx, MLC_SHAPE(2, 4, 3)), *k = mlc_randn(ctx, MLC_SHAPE(2, 5, 3));
    mlc_tensor *v = mlc_randn(ctx, MLC_SHAPE(2, 5, 2)), *bad = mlc_randn(ctx, MLC_SHAPE(2, 5, 4));
    mlc_tensor *mask = mlc_requires_grad(mlc_zeros(ctx, MLC_SHAPE(4, 5)), 1);
    CHECK(mlc_attention(q, bad, v, opts_of(NULL, 0, 0.0f, 0.0f)) == NULL && mlc_error(ctx) == MLC_ERR_SHAPE);
    mlc_clear_error(ctx);
    CHECK(mlc_attention(q, k, mlc_randn(ctx, MLC_SHAPE(2, 4, 2)), opts_of(NULL, 0, 0.0f, 0.0f)) == NULL);
    CHECK(mlc_error(ctx) == MLC_ERR_SHAPE);
    mlc_clear_error(ctx);
    CHECK(mlc_attention(mlc_randn(ctx, MLC_SHAPE(3)), k, v, opts_of(NULL, 0, 0.0f, 0.0f)) == NULL);
    CHECK(mlc_error(ctx) == MLC_ERR_SHAPE);
    mlc_clear_error(ctx);
    CHECK(mlc_attention(q, k, v, opts_of(NULL, 0, 1.5f, 0.0f)) == NULL && mlc_error(ctx) == MLC_ERR_ARG);
    CHECK(strstr(mlc_error_message(ctx), "dropout") != NULL);
    mlc_clear_error(ctx);
    CHECK(mlc_attention(q, k, v, opts_of(mask, 0, 0.0f, 0.0f)) == NULL && mlc_error(ctx) == MLC_ERR_ARG);
    mlc_clear_error(ctx);
    CHECK(mlc_attention(NULL, k, v, opts_of(NULL, 0, 0.0f, 0.0f)) == NULL && mlc_error(ctx) == MLC_ERR_NULL);
    test_destroy(ctx);
    return 1;
}

/* Gradient checks: a mask with -∞, causal with S > T, rank 2, dropout, an explicit scale. */
static const float gmask[] = { 0, -1, 0.5f, NEG_INF, 0, 0.25f, 0, 1, 0, -0.5f, 0, 0 };
static mlc_tensor *f_mask(mlc_tensor **x, void *u) {
    (void)u;
    return mlc_attention(x[0], x[1], x[2], opts_of(mask_of(x[0]->ctx, gmask, 3, 4), 0, 0.0f, 0.0f));
}
static mlc_tensor *f_causal(mlc_tensor **x, void *u) {
    (void)u;
    return mlc_attention(x[0], x[1], x[2], opts_of(NULL, 1, 0.0f, 0.8f));
}
static mlc_tensor *f_dropout(mlc_tensor **x, void *u) {
    (void)u;
    return mlc_attention(x[0], x[1], x[2], opts_of(mask_of(x[0]->ctx, gmask, 3, 4), 1, 0.3f, 0.0f));
}
static int check_grad(const char *name, mlc_gradcheck_fn fn, int rank, const int (*shapes)[4]) {
    mlc_ctx *ctx = test_ctx(7);
    mlc_tensor *in[3];
    mlc_gradcheck_opts opts = { 5e-3, 2e-3, 1e-2 };
    mlc_gradcheck_report rep;
    int i;
    for (i = 0; i < 3; i++) in[i] = mlc_requires_grad(mlc_randn(ctx, rank, shapes[i]), 1);
    CHECK_MSG(mlc_gradcheck(ctx, fn, NULL, in, 3, &opts, &rep), "%s: input %d element %zu: analytic %.6g "
              "numeric %.6g (%s)", name, rep.worst_input, rep.worst_index, rep.analytic, rep.numeric,
              mlc_error_message(ctx));
    CHECK(rep.worst_input >= 0);
    test_destroy(ctx);
    return 1;
}
static int attention_grad_mask(void) {
    static const int shapes[3][4] = { { 2, 2, 3, 4 }, { 2, 2, 4, 4 }, { 2, 2, 4, 3 } };
    return check_grad("mask", f_mask, 4, shapes);
}
static int attention_grad_causal(void) {
    static const int shapes[3][4] = { { 3, 5 }, { 6, 5 }, { 6, 2 } };
    return check_grad("causal", f_causal, 2, shapes);
}
static int attention_grad_dropout(void) {
    static const int shapes[3][4] = { { 3, 3, 2 }, { 3, 4, 2 }, { 3, 4, 5 } };
    return check_grad("dropout", f_dropout, 3, shapes);
}

/* MultiheadAttention: PyTorch's weights loaded by name give PyTorch's outputs. */
static int load(mlc_module *m) {
    mlc_named_tensor st[8];
    int n = mlc_module_state(m, st, 8), i;
    const float *src[4];
    src[0] = m_in_w; src[1] = m_in_b; src[2] = m_out_w; src[3] = m_out_b;
    if (n != 4 || strcmp(st[0].name, "in_proj_weight") || strcmp(st[1].name, "in_proj_bias") ||
        strcmp(st[2].name, "out_proj.weight") || strcmp(st[3].name, "out_proj.bias")) return 0;
    for (i = 0; i < 4; i++) if (mlc_write(st[i].tensor, src[i], st[i].tensor->size) != MLC_OK) return 0;
    return 1;
}

static int multihead_attention_values(void) {
    mlc_ctx *ctx = test_ctx(5);
    mlc_module *m = mlc_nn_multihead_attention(ctx, 4, 2);
    mlc_tensor *x = W(ctx, m_x, 2, 3, 4), *key = W(ctx, m_key, 2, 5, 4), *value = W(ctx, m_value, 2, 5, 4);
    mlc_tensor *y;
    float pad[10] = { 0, 0, 0, 0, 0, 0, 0, 0, -INFINITY, -INFINITY };
    CHECK_MSG(m && load(m), "%s", mlc_error_message(ctx));
    CHECK(mlc_module_param_count(m) == 4 * 12 + 12 + 16 + 4);
    y = mlc_forward(m, x);
    CHECK_MSG(y != NULL, "%s", mlc_error_message(ctx));
    CHECK_TENSOR(y, m_self, 1e-5);
    y = mlc_forward_attention(m, x, x, x, NULL, 1);
    CHECK_TENSOR(y, m_causal, 1e-5);
    y = mlc_forward_attention(m, x, key, value, W(ctx, pad, 2, 1, 1, 5), 0);
    CHECK(y && y->shape[0] == 2 && y->shape[1] == 3 && y->shape[2] == 4);
    CHECK_TENSOR(y, m_cross, 1e-5);
    CHECK(mlc_forward_attention(m, x, key, x, NULL, 0) == NULL && mlc_error(ctx) == MLC_ERR_SHAPE);
    CHECK(strstr(mlc_error_message(ctx), "mlc_forward_attention") && strstr(mlc_error_message(ctx), "[2, 3, 4]"));
    mlc_clear_error(ctx);
    CHECK(mlc_nn_multihead_attention(ctx, 6, 4) == NULL && mlc_error(ctx) == MLC_ERR_ARG);
    mlc_clear_error(ctx);
    CHECK(mlc_forward_attention(mlc_nn_relu(ctx), x, x, x, NULL, 0) == NULL && mlc_error(ctx) == MLC_ERR_ARG);
    mlc_clear_error(ctx);
    CHECK(mlc_forward_attention(m, x, NULL, x, NULL, 0) == NULL && mlc_error(ctx) == MLC_ERR_NULL);
    mlc_clear_error(ctx);
    CHECK(mlc_forward_attention(NULL, x, x, x, NULL, 0) == NULL && mlc_error(ctx) == MLC_OK);
    CHECK(mlc_nn_multihead_attention(NULL, 4, 2) == NULL);
    CHECK(mlc_attention(NULL, NULL, NULL, opts_of(NULL, 0, 0.0f, 0.0f)) == NULL);
    test_destroy(ctx);
    return 1;
}

/* Gradients reach every parameter through the module (self- and cross-attention). */
static mlc_module *grad_module;
static mlc_tensor *f_module(mlc_tensor **x, void *u) {
    mlc_tensor *cross = mlc_forward_attention(grad_module, x[0], x[1], x[1], NULL, 1);
    (void)u;
    return mlc_add(mlc_forward(grad_module, x[0]), mlc_sum(cross, 1, 1));
}
static int multihead_attention_grad(void) {
    mlc_ctx *ctx = test_ctx(6);
    mlc_tensor *in[6];
    mlc_named_tensor st[4];
    mlc_gradcheck_opts opts = { 5e-3, 2e-3, 1e-2 };
    mlc_gradcheck_report rep;
    int i;
    grad_module = mlc_nn_multihead_attention(ctx, 4, 2);
    CHECK(mlc_module_parameters(grad_module, st, 4) == 4);
    in[0] = mlc_requires_grad(mlc_randn(ctx, MLC_SHAPE(2, 3, 4)), 1);
    in[1] = mlc_requires_grad(mlc_randn(ctx, MLC_SHAPE(2, 5, 4)), 1);
    for (i = 0; i < 4; i++) in[2 + i] = st[i].tensor;
    mlc_init_uniform(st[1].tensor, -0.5f, 0.5f);
    mlc_init_uniform(st[3].tensor, -0.5f, 0.5f);
    CHECK_MSG(mlc_gradcheck(ctx, f_module, NULL, in, 6, &opts, &rep), "input %d element %zu: analytic %.6g "
              "numeric %.6g (%s)", rep.worst_input, rep.worst_index, rep.analytic, rep.numeric,
              mlc_error_message(ctx));
    test_destroy(ctx);
    return 1;
}

const test_case tests_attention[] = {
    TEST(attention_values_mask)
    TEST(attention_values_causal_rank3)
    TEST(attention_dropout_form)
    TEST(attention_mask_broadcast)
    TEST(attention_errors)
    TEST(attention_grad_mask)
    TEST(attention_grad_causal)
    TEST(attention_grad_dropout)
    TEST(multihead_attention_values)
    TEST(multihead_attention_grad)
    { NULL, NULL }
};
