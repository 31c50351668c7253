"""What vLLM documents, for checking `dspark serve --engine vllm` without vLLM installed.

Each flag is the kebab-case name of a documented config field (vLLM builds `vllm serve`'s options from
its config dataclasses: `--max-model-len` is ModelConfig.max_model_len), with the field's type. Read from
vllm-project/vllm (vllm/config/speculative.py at 002e77c1, vllm/config/multimodal.py,
vllm/config/compilation.py, vllm/entrypoints/openai/cli_args.py) and docs.vllm.ai ("Engine Arguments",
"Speculative Decoding", "Adaptive Verification").
"""

from __future__ import annotations

# flag -> (config field, value kind); kind "flag" takes no value, "json" a JSON object
SERVE_FLAGS: dict[str, tuple[str, str]] = {
    "--host": ("frontend host", "str"),
    "--port": ("frontend port", "int"),
    "--revision": ("ModelConfig.revision", "str"),
    "--tensor-parallel-size": ("ParallelConfig.tensor_parallel_size", "int"),
    "--max-model-len": ("ModelConfig.max_model_len", "int"),
    "--attention-backend": ("AttentionConfig.backend", "attention-backend"),
    "--mm-encoder-attn-backend": ("MultiModalConfig.mm_encoder_attn_backend", "attention-backend"),
    "--max-num-seqs": ("SchedulerConfig.max_num_seqs", "int"),
    "--disable-custom-all-reduce": ("ParallelConfig.disable_custom_all_reduce", "flag"),
    "--compilation-config": ("CompilationConfig", "json"),
    "--default-chat-template-kwargs": ("frontend default_chat_template_kwargs", "json"),
    "--speculative-config": ("SpeculativeConfig", "json"),
}

# vllm.v1.attention.backends.registry.AttentionBackendEnum: the names the two backend flags accept
ATTENTION_BACKENDS = {"FLASH_ATTN", "TRITON_ATTN", "FLASHINFER", "FLEX_ATTENTION", "TORCH_SDPA", "ROCM_AITER_FA"}

# SpeculativeConfig fields (name -> Python type) and the SpeculativeMethod literal
SPECULATIVE_FIELDS: dict[str, type] = {
    "method": str,
    "model": str,
    "num_speculative_tokens": int,
    "revision": str,
    "enable_adaptive_verification": bool,
    "draft_tensor_parallel_size": int,
    "max_model_len": int,
    "draft_sample_method": str,
    "rejection_sample_method": str,
    "dspark_draft_topk": int,
}
SPECULATIVE_METHODS = {
    "ngram",
    "medusa",
    "mlp_speculator",
    "draft_model",
    "suffix",
    "custom_class",
    "eagle",
    "eagle3",
    "extract_hidden_states",
    "mtp",
    "dflash",
    "ngram_gpu",
    "dspark",
}

# CompilationConfig.pass_config (PassConfig) boolean fields the recipe may switch off
PASS_CONFIG_FIELDS = {"fuse_allreduce_rms", "enable_sp", "fuse_gemm_comms", "eliminate_noops"}
