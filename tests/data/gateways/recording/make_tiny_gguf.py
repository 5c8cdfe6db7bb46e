"""Throwaway: a random-weight tiny llama GGUF (byte-fallback SPM vocab) for recording real LiteLLM payloads."""
import sys
import numpy as np
import gguf

out = sys.argv[1]
rng = np.random.default_rng(0)
n_embd, n_ff, n_layer, n_head, n_ctx = 64, 128, 2, 4, 2048
tokens, scores, types = ["<unk>", "<s>", "</s>"], [0.0, 0.0, 0.0], [2, 3, 3]
for b in range(256):
    tokens.append(f"<0x{b:02X}>"); scores.append(0.0); types.append(6)
words = ["▁the", "▁a", "▁of", "▁to", "▁and", "▁in", "▁is", "▁you", "▁that", "▁it", "▁hello", "▁world", "▁model", "▁token"]
for i, w in enumerate(words):
    tokens.append(w); scores.append(-float(i)); types.append(1)
for c in "abcdefghijklmnopqrstuvwxyz":
    for piece in (c, "▁" + c):
        if piece not in tokens:
            tokens.append(piece); scores.append(-100.0); types.append(1)
n_vocab = len(tokens)
w = gguf.GGUFWriter(out, "llama")
w.add_name("tiny-random-llama")
w.add_context_length(n_ctx); w.add_embedding_length(n_embd); w.add_block_count(n_layer)
w.add_feed_forward_length(n_ff); w.add_head_count(n_head); w.add_head_count_kv(n_head)
w.add_rope_dimension_count(n_embd // n_head); w.add_layer_norm_rms_eps(1e-5); w.add_file_type(0)
w.add_tokenizer_model("llama"); w.add_token_list(tokens); w.add_token_scores(scores); w.add_token_types(types)
w.add_bos_token_id(1); w.add_eos_token_id(2); w.add_unk_token_id(0)
w.add_chat_template("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
def t(*shape, scale=0.2):
    return (rng.standard_normal(shape) * scale).astype(np.float32)
w.add_tensor("token_embd.weight", t(n_vocab, n_embd))
w.add_tensor("output_norm.weight", np.ones(n_embd, np.float32))
w.add_tensor("output.weight", t(n_vocab, n_embd))
for i in range(n_layer):
    w.add_tensor(f"blk.{i}.attn_norm.weight", np.ones(n_embd, np.float32))
    for n in ("q", "k", "v", "output"):
        w.add_tensor(f"blk.{i}.attn_{n}.weight", t(n_embd, n_embd))
    w.add_tensor(f"blk.{i}.ffn_norm.weight", np.ones(n_embd, np.float32))
    w.add_tensor(f"blk.{i}.ffn_gate.weight", t(n_ff, n_embd))
    w.add_tensor(f"blk.{i}.ffn_up.weight", t(n_ff, n_embd))
    w.add_tensor(f"blk.{i}.ffn_down.weight", t(n_embd, n_ff))
w.write_header_to_file(); w.write_kv_data_to_file(); w.write_tensors_to_file(); w.close()
print(out, n_vocab)
