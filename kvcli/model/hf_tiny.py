"""Write a tiny random Hugging Face checkpoint folder with its own tokenizer and chat template, offline.

For trying ``--model PATH`` without downloading weights, and for the tests::

    python -m kvcli.model.hf_tiny /tmp/tiny-llama
    kvcli replay sample_traces/ --model /tmp/tiny-llama

The folder is what ``save_pretrained`` writes for a ``LlamaForCausalLM`` (``config.json``, ``model.safetensors``)
and a ``PreTrainedTokenizerFast`` (``tokenizer.json``, ``tokenizer_config.json``, the chat template):

* model: Llama, 2 layers, hidden 64, 4 query heads and 2 KV heads of head_dim 16 (grouped-query attention),
  MLP 128, RoPE theta 500,000, untied LM head, weights drawn with ``torch.manual_seed(seed)`` (std 0.02), saved
  in ``dtype``. KV bytes per token: ``2 * 2 layers * 2 heads * 16 * element size`` = 512 in float32.
  ``vocab`` (default 100,352, as kvcli's presets) is the embedding size: at least 100,256 so the synthesized
  token ids of Mooncake traces fit; the tokenizer itself uses the first few hundred ids.
* tokenizer: byte-level BPE (any text encodes) trained in memory on :data:`CORPUS` with Llama 3's
  pre-tokenization regex, special tokens ``<|begin_of_text|>`` (BOS, added to completion prompts),
  ``<|end_of_text|>``, ``<|start_header_id|>``, ``<|end_header_id|>``, ``<|eot_id|>``, and a Llama-3-style
  chat template (:data:`CHAT_TEMPLATE`).

The weights are random: prefill time, KV shapes and bytes are real, the text it would generate is not.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

import torch

from kvcli.model.hf_offline import transformers

SPECIAL_TOKENS = ["<|begin_of_text|>", "<|end_of_text|>", "<|start_header_id|>", "<|end_header_id|>",
                  "<|eot_id|>"]
#: Llama 3's chat template in substance: BOS, then per message a role header and the stripped content ended by
#: <|eot_id|>, then the assistant header as the generation prompt.
CHAT_TEMPLATE = (
    "{{- bos_token }}"
    "{%- for message in messages %}"
    "{{- '<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n' + (message['content'] or '') | trim"
    " + '<|eot_id|>' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}{%- endif %}"
)
#: Llama 3's pre-tokenization regex (its tokenizer.json ``Split`` pattern).
_PRETOKENIZE = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|"
                r"\s*[\r\n]+|\s+(?!\S)|\s+")
CORPUS = [
    "You are a helpful assistant. Answer briefly and accurately.",
    "A KV cache stores the keys and values of every token a transformer has already seen.",
    "Prefix caching reuses the KV cache of a shared prompt prefix, so only the new suffix is prefilled.",
    "The quick brown fox jumps over the lazy dog. Pack my box with five dozen liquor jugs.",
    "def main():\n    for i in range(10):\n        print(i, 'hello world')\n    return 0\n",
    "User: What is the capital of France?\nAssistant: The capital of France is Paris.",
    "Please summarize the following document in three sentences, then list the open questions.",
    "Error: file not found. Traceback (most recent call last): File \"main.py\", line 3, in <module>",
]


def build_tokenizer(vocab_size: int = 512):
    """A ``PreTrainedTokenizerFast`` trained in memory on :data:`CORPUS` (module docstring)."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(_PRETOKENIZE), behavior="isolated"),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=SPECIAL_TOKENS, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(CORPUS, trainer)
    bos = SPECIAL_TOKENS[0]
    tok.post_processor = processors.TemplateProcessing(single=f"{bos} $A", pair=f"{bos} $A $B",
                                                       special_tokens=[(bos, tok.token_to_id(bos))])
    fast = transformers().PreTrainedTokenizerFast(tokenizer_object=tok, bos_token=bos, eos_token="<|eot_id|>")
    fast.chat_template = CHAT_TEMPLATE
    return fast


#: The architectures :func:`tiny_config` builds: transformers config class and its shapes beyond the common ones
#: (hidden 64, 4 query heads, MLP 128, untied LM head). KV bytes per token in bfloat16, 2 layers: llama 256
#: (2 x 2 KV heads x 16 x 2 x 2 B); deepseek_v3 192 (2 x (latent 32 + RoPE key 16) x 2 B); the others 256.
TINY_ARCHS: dict[str, tuple[str, dict[str, Any]]] = {
    "llama": ("LlamaConfig", {"num_key_value_heads": 2, "head_dim": 16, "rope_theta": 500000.0}),
    # latent attention (MLA) with experts: layer 0 dense, layer 1 with 8 routed experts (2 per token) and 1 shared
    "deepseek_v3": ("DeepseekV3Config", {
        "num_key_value_heads": 4, "kv_lora_rank": 32, "q_lora_rank": 48, "qk_rope_head_dim": 16,
        "qk_nope_head_dim": 16, "v_head_dim": 24, "moe_intermediate_size": 32, "n_routed_experts": 8,
        "num_experts_per_tok": 2, "n_shared_experts": 1, "n_group": 2, "topk_group": 1, "first_k_dense_replace": 1}),
    # alternating sliding (window 8) and full layers, attention sinks, 4 experts (2 per token)
    "gpt_oss": ("GptOssConfig", {"num_key_value_heads": 2, "head_dim": 16, "sliding_window": 8,
                                 "num_local_experts": 4, "num_experts_per_tok": 2, "intermediate_size": 32}),
    # Gemma 3's pattern shortened: layer 0 local (window 8), layer 1 global
    "gemma3_text": ("Gemma3TextConfig", {"num_key_value_heads": 2, "head_dim": 16, "sliding_window": 8,
                                         "sliding_window_pattern": 2}),
    # use_sliding_window with max_window_layers = layers: transformers builds every layer as full attention
    "qwen2": ("Qwen2Config", {"num_key_value_heads": 2, "use_sliding_window": True, "sliding_window": 8,
                              "max_window_layers": 2}),
    # hybrid: three Gated DeltaNet layers to one gated attention layer (give layers=4 for one attention layer),
    # 4 experts (2 per token) of 16 and a gated shared expert of 16 in every layer
    "qwen3_next": ("Qwen3NextConfig", {
        "num_key_value_heads": 2, "head_dim": 16, "linear_num_key_heads": 2, "linear_num_value_heads": 4,
        "linear_key_head_dim": 8, "linear_value_head_dim": 8, "linear_conv_kernel_dim": 4, "num_experts": 4,
        "num_experts_per_tok": 2, "moe_intermediate_size": 16, "shared_expert_intermediate_size": 16}),
    # hybrid of one mixer or one MLP per block, "M-*E" (the pattern sets the layers): Mamba-2 (4 heads of 8,
    # 2 groups, state 16, chunks of 16), squared-ReLU MLP, attention, 4 experts (2 per token) of 16 and a shared
    # one of 24
    "nemotron_h": ("NemotronHConfig", {
        "num_key_value_heads": 2, "head_dim": 16, "mamba_num_heads": 4, "mamba_head_dim": 8, "ssm_state_size": 16,
        "n_groups": 2, "conv_kernel": 4, "chunk_size": 16, "hybrid_override_pattern": "M-*E", "n_routed_experts": 4,
        "num_experts_per_tok": 2, "moe_intermediate_size": 16, "moe_shared_expert_intermediate_size": 24}),
    # hybrid of Mamba-2 layers (4 heads of 32 = 2 x hidden, 2 groups, state 16, chunks of 16) with layer 1 full
    # attention (RoPE), each layer with 4 experts (2 per token) of 128 and a shared MLP of 24 (Granite 4)
    "granitemoehybrid": ("GraniteMoeHybridConfig", {
        "num_key_value_heads": 2, "mamba_n_heads": 4, "mamba_d_head": 32, "mamba_n_groups": 2, "mamba_d_state": 16,
        "mamba_d_conv": 4, "mamba_expand": 2, "mamba_chunk_size": 16, "num_local_experts": 4,
        "num_experts_per_tok": 2, "shared_intermediate_size": 24, "position_embedding_type": "rope"}),
    # the same Mamba-2 layers with layer 1 full attention (RoPE on half of each head), a SwiGLU MLP in each (Bamba)
    "bamba": ("BambaConfig", {
        "num_key_value_heads": 2, "mamba_n_heads": 4, "mamba_d_head": 32, "mamba_n_groups": 2, "mamba_d_state": 16,
        "mamba_d_conv": 4, "mamba_expand": 2, "mamba_chunk_size": 16, "attn_layer_indices": [1]}),
}


def tiny_config(arch: str, vocab: int = 100352, layers: int = 2, **extra):
    """A tiny transformers config of architecture ``arch`` (:data:`TINY_ARCHS`), ``layers`` layers.

    Raises:
        ValueError: an unknown ``arch`` (the message lists them).
    """
    if arch not in TINY_ARCHS:
        raise ValueError(f"unknown tiny architecture {arch!r}; valid: {', '.join(TINY_ARCHS)}")
    cls, shapes = TINY_ARCHS[arch]
    if arch == "granitemoehybrid":  # its layer pattern is a list: layer 1 attention, the others Mamba-2
        shapes = shapes | {"layer_types": ["full_attention" if i == 1 else "linear_attention" for i in range(layers)]}
    common: dict[str, Any] = {
        "vocab_size": vocab, "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": layers,
        "num_attention_heads": 4, "max_position_embeddings": 131072, "rms_norm_eps": 1e-5,
        "tie_word_embeddings": False}
    return getattr(transformers(), cls)(**(common | shapes | extra))


def write_tiny_checkpoint(folder: str | Path, vocab: int = 100352, seed: int = 0, dtype: str = "float32",
                          layers: int = 2, tokenizer_vocab: int = 512, arch: str = "llama", **extra) -> Path:
    """Write the tiny checkpoint and tokenizer into ``folder`` (created; existing files overwritten).

    Args:
        vocab: embedding rows (>= the tokenizer's size). seed: weight seed (two seeds, two checkpoints).
        dtype: ``"float32"``, ``"bfloat16"`` or ``"float16"``: the weights' dtype and the config's default.
        layers: decoder layers. tokenizer_vocab: BPE vocabulary target (the corpus may stop it earlier).
        arch: the architecture (:data:`TINY_ARCHS`; default Llama, the module docstring's).
        extra: config fields over the architecture's (e.g. Nemotron-H's ``hybrid_override_pattern``).

    Returns:
        The folder's path.
    """
    tf = transformers()
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    tokenizer = build_tokenizer(tokenizer_vocab)
    if vocab < len(tokenizer):
        raise ValueError(f"vocab {vocab} is smaller than the tokenizer's {len(tokenizer)} tokens")
    config = tiny_config(arch, vocab, layers, bos_token_id=tokenizer.bos_token_id,
                         eos_token_id=tokenizer.eos_token_id, **extra)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = tf.AutoModelForCausalLM.from_config(config)
    model.to(getattr(torch, dtype)).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


def main(argv: list[str] | None = None) -> int:
    """``python -m kvcli.model.hf_tiny DIR [--vocab N] [--seed S] [--dtype D] [--arch A] [--layers L]``."""
    parser = argparse.ArgumentParser(prog="python -m kvcli.model.hf_tiny", description=__doc__.split("\n")[0])
    parser.add_argument("folder")
    parser.add_argument("--vocab", type=int, default=100352, help="embedding rows (default 100352)")
    parser.add_argument("--seed", type=int, default=0, help="weight seed (default 0)")
    parser.add_argument("--dtype", default="float32", choices=("float32", "bfloat16", "float16"))
    parser.add_argument("--arch", default="llama", choices=tuple(TINY_ARCHS), help="architecture (default llama)")
    parser.add_argument("--layers", type=int, help="decoder layers (default 2; qwen3_next: 4, one attention layer "
                        "after three linear ones, the fewest kvcli runs)")
    args = parser.parse_args(argv)
    layers = args.layers or (4 if args.arch == "qwen3_next" else 2)
    folder = write_tiny_checkpoint(args.folder, args.vocab, args.seed, args.dtype, layers=layers, arch=args.arch)
    print(f"wrote a tiny random {args.arch} checkpoint and tokenizer to {folder}; try: kvcli replay sample_traces/ "
          f"--model {folder}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
