// Host-side check of dspark patch 0008's CUDA graph key: the key function is cut out of the patched
// ggml-cuda.cu (KEY_FUNCTION.inc) and compiled here against ggml's CPU headers.
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include "ggml.h"
#include "ggml-impl.h"

#include "KEY_FUNCTION.inc"

// a llama-like graph: get_rows of n tokens, a matmul, a norm; built into one context, as llama.cpp does
static const void * key_of(ggml_context * ctx_w, ggml_tensor * emb, ggml_tensor * w, int n_tokens) {
    static char mem[8 << 20];
    ggml_init_params p = { sizeof(mem), mem, true };
    ggml_context * ctx = ggml_init(p);
    ggml_tensor * ids = ggml_new_tensor_1d(ctx, GGML_TYPE_I32, n_tokens);
    ggml_tensor * x = ggml_get_rows(ctx, emb, ids);
    x = ggml_mul_mat(ctx, w, x);
    x = ggml_rms_norm(ctx, x, 1e-5f);
    ggml_cgraph * gf = ggml_new_graph(ctx);
    ggml_build_forward_expand(gf, x);
    const void * key = ggml_cuda_graph_get_key(gf);
    std::printf("n_tokens %d first_node %p key %p\n", n_tokens, (void *) gf->nodes[0], key);
    ggml_free(ctx);
    return key;
}

int main() {
    ggml_init_params p = { 16 << 20, nullptr, true };
    ggml_context * ctx_w = ggml_init(p);
    ggml_tensor * emb = ggml_new_tensor_2d(ctx_w, GGML_TYPE_F32, 64, 128);
    ggml_tensor * w = ggml_new_tensor_2d(ctx_w, GGML_TYPE_F32, 64, 64);
    const void * a1 = key_of(ctx_w, emb, w, 1);
    const void * b4 = key_of(ctx_w, emb, w, 4);
    const void * a1again = key_of(ctx_w, emb, w, 1);
    std::printf("same_shape_same_key %d other_shape_other_key %d\n", a1 == a1again, a1 != b4);
    return 0;
}
