"""A small real GLM checkpoint whose greedy output is a known script: for tests of the server's
reasoning and tool-call handling, which a random model never exercises.

Every attention and MLP output projection is zero, so the residual stream stays the token's
embedding and the next token depends on the current one alone; lm_head maps each script piece's
embedding to the next piece with a margin of ~60 logits. The script pieces are single added tokens,
so the chain `<think>` -> reasoning -> `</think>` -> a GLM-4.7-style tool call -> `<|observation|>`
is first-order. The chat template is GLM-4.7's shape (no newlines after roles, generation prompt
`<|assistant|><think>`)."""
from __future__ import annotations

import json
import pathlib

import numpy as np
from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, trainers

from trellisforge import safetensors_io

SPECIAL = ["<|endoftext|>", "[MASK]", "[gMASK]", "[sMASK]", "<sop>", "<eop>", "<|system|>", "<|user|>",
           "<|assistant|>", "<|observation|>"]
SCRIPT = ["<think>", "Let me check the weather first.", "</think>", "<tool_call>", "get_weather", "<arg_key>", "city",
          "</arg_key>", "<arg_value>", "Paris", "</arg_value>", "</tool_call>", "<|observation|>"]
PIECES = ["<tool_response>", "</tool_response>"]
REASONING = SCRIPT[1]
TOOL_CALL = {"name": "get_weather", "arguments": {"city": "Paris"}}

TEMPLATE = """[gMASK]<sop>
{%- if tools -%}
<|system|>
# Tools

You may call one or more functions to assist with the user query.
<tools>
{% for tool in tools %}{{ tool | tojson }}
{% endfor %}</tools>
{%- endif -%}
{%- for m in messages -%}
{%- if m.role == 'system' -%}<|system|>{{ m.content }}
{%- elif m.role == 'user' -%}<|user|>{{ m.content }}
{%- elif m.role == 'assistant' -%}<|assistant|></think>{{ m.content or '' }}
{%- for call in m.tool_calls or [] -%}<tool_call>{{ call.function.name }}
{%- for key, value in call.function.arguments.items() -%}<arg_key>{{ key }}</arg_key><arg_value>{{ value if value is string else value | tojson }}</arg_value>{%- endfor -%}
</tool_call>
{%- endfor -%}
{%- elif m.role == 'tool' -%}
{%- if loop.first or messages[loop.index0 - 1].role != 'tool' -%}<|observation|>{%- endif -%}
<tool_response>{{ m.content }}</tool_response>
{%- endif -%}
{%- endfor -%}
{%- if add_generation_prompt -%}<|assistant|><think>{%- endif -%}"""

CORPUS = ["What is the weather in Paris today? Please tell me, and be brief.",
          "The quick brown fox jumps over the lazy dog. 0123456789 {\"city\": \"Paris\"}",
          "Sunny, 21 degrees. # Tools You may call one or more functions to assist with the user query."]


def write(path: pathlib.Path, seed: int = 0, repeat_calls: bool = False) -> pathlib.Path:
    """repeat_calls: after `</tool_call>` comes `<tool_call>` again (the same call, over and over)
    instead of `<|observation|>`: a model that calls tools in parallel until stopped."""
    path.mkdir(parents=True, exist_ok=True)
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=400, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tokenizer.train_from_iterator(CORPUS, trainer)
    tokenizer.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in SPECIAL])
    tokenizer.add_tokens([AddedToken(t, special=False, normalized=False) for t in SCRIPT[:-1] + PIECES])
    tokenizer.save(str(path / "tokenizer.json"))
    ids = [tokenizer.token_to_id(piece) for piece in SCRIPT]
    vocab = tokenizer.get_vocab_size(with_added_tokens=True)

    hidden, heads, kv_heads, head_dim, experts = 64, 2, 1, 32, 4
    config = {
        "architectures": ["Glm4MoeForCausalLM"], "model_type": "glm4_moe", "hidden_size": hidden, "num_hidden_layers": 2,
        "num_attention_heads": heads, "num_key_value_heads": kv_heads, "head_dim": head_dim, "partial_rotary_factor": 0.5,
        "rope_theta": 1e6, "rms_norm_eps": 1e-5, "attention_bias": False, "use_qk_norm": False, "vocab_size": vocab,
        "intermediate_size": 64, "moe_intermediate_size": 32, "n_routed_experts": experts, "n_shared_experts": 1,
        "num_experts_per_tok": 2, "first_k_dense_replace": 1, "n_group": 1, "topk_group": 1, "norm_topk_prob": True,
        "routed_scaling_factor": 1.0, "tie_word_embeddings": False, "max_position_embeddings": 1024, "hidden_act": "silu",
        "eos_token_id": [tokenizer.token_to_id(t) for t in ("<|endoftext|>", "<|user|>", "<|observation|>")],
    }
    rng = np.random.default_rng(seed)
    embeddings = rng.standard_normal((vocab, hidden)).astype(np.float32)
    normed = embeddings / np.sqrt(np.mean(embeddings ** 2, axis=1, keepdims=True))
    lm_head = (rng.standard_normal((vocab, hidden)) * 0.05).astype(np.float32)
    chain = list(zip(ids, ids[1:]))
    if repeat_calls:
        chain[-1] = (ids[SCRIPT.index("</tool_call>")], ids[SCRIPT.index("<tool_call>")])
    for following in {f for _, f in chain}:  # a piece that follows two pieces answers to both
        lm_head[following] = sum(normed[previous] for previous, f in chain if f == following)
    tensors = {"model.embed_tokens.weight": embeddings, "model.norm.weight": np.ones(hidden, np.float32), "lm_head.weight": lm_head}

    def linear(name, out_features, in_features, zero=False):
        tensors[f"{name}.weight"] = np.zeros((out_features, in_features), np.float32) if zero else \
            (rng.standard_normal((out_features, in_features)) * 0.1).astype(np.float32)

    def mlp(prefix, intermediate):
        linear(f"{prefix}.gate_proj", intermediate, hidden)
        linear(f"{prefix}.up_proj", intermediate, hidden)
        linear(f"{prefix}.down_proj", hidden, intermediate, zero=True)

    for layer in range(2):
        p = f"model.layers.{layer}"
        tensors[f"{p}.input_layernorm.weight"] = np.ones(hidden, np.float32)
        tensors[f"{p}.post_attention_layernorm.weight"] = np.ones(hidden, np.float32)
        linear(f"{p}.self_attn.q_proj", heads * head_dim, hidden)
        linear(f"{p}.self_attn.k_proj", kv_heads * head_dim, hidden)
        linear(f"{p}.self_attn.v_proj", kv_heads * head_dim, hidden)
        linear(f"{p}.self_attn.o_proj", hidden, heads * head_dim, zero=True)
        if layer == 0:
            mlp(f"{p}.mlp", 64)
            continue
        linear(f"{p}.mlp.gate", experts, hidden)
        tensors[f"{p}.mlp.gate.e_score_correction_bias"] = np.zeros(experts, np.float32)
        for e in range(experts):
            mlp(f"{p}.mlp.experts.{e}", 32)
        mlp(f"{p}.mlp.shared_experts", 32)
    safetensors_io.save(path / "model.safetensors", tensors)
    (path / "config.json").write_text(json.dumps(config, indent=1))
    (path / "generation_config.json").write_text(json.dumps({"eos_token_id": config["eos_token_id"]}))
    (path / "chat_template.jinja").write_text(TEMPLATE)
    (path / "tokenizer_config.json").write_text(json.dumps({"tokenizer_class": "PreTrainedTokenizerFast", "eos_token": "<|endoftext|>"}))
    return path
