"""A tiny random-weight llama GGUF, generated deterministically from a seed (gguf + numpy).

The weights are random, so the text is gibberish, but everything the engine does with it is real: tokenisation
with an SPM vocabulary (whole words are single tokens, anything else falls back to bytes), a ChatML or a
Qwen3-style thinking chat template, prefill and decode cost proportional to the tokens, KV cache, slots.

One design choice makes the output lengths realistic: channel 0 of the residual stream is a large constant in every
token embedding and no layer writes to it, so after the final RMSNorm it is (almost) the same number at every step.
Only the end-of-turn token's output row reads that channel, so ``<|im_end|>`` gets a steady logit and each decode
step ends the turn with about the same probability: requests finish by ``stop`` or by ``length`` in a mix that the
load's ``max_tokens`` controls.

Nothing generated here is committed; :func:`ensure_model` writes into a git-ignored cache directory.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

# Vocabulary words: everyday English plus serving jargon, so prompts built from them tokenise one word per token.
WORDS = """
a about after again against all also an and another any are around as at away back be because been before being
between both but by came can come could day did do down each even first for from get go good great had has have
he her here him his how if in into is it its just know last life like little long made make man many may me men
might more most much must my never new no not now of off old on one only or other our out over own people right
same see she should since so some state still such take than that the their them then there these they thing think
this those three through time to too two under up us used very was way we well were what when where which while
who why will with work world would year years you your yes keep turn start show hear play run move live believe
bring happen write provide sit stand lose pay meet include continue set learn change lead understand watch follow
stop create speak read allow add spend grow open walk win offer remember love consider appear buy wait serve die
send expect build stay fall cut reach kill remain suggest raise pass sell require report decide pull
model request server queue token prompt cache prefix batch kernel memory latency throughput decode prefill stream
engine metric scheduler gpu cpu slot context window budget answer reason question reply chat user system assistant
tool call search result document page table chart report error retry fallback timeout limit output input length
speed load burst steady peak tail median percentile histogram counter gauge scrape sample label value cohort band
release gate before during after rollback incident finding evidence summary policy tolerance interval share rate
please explain describe compare list summarize translate check review plan write code test fix debug deploy scale
city river mountain forest ocean garden kitchen market station library museum school office hospital bridge road
red blue green black white small large short tall quick slow early late warm cold bright dark quiet loud simple
morning evening night week month today tomorrow yesterday always often sometimes never usually maybe perhaps
""".split()

CHATML_TEMPLATE = (
    "{%- for message in messages %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)

# A Qwen3-style thinking template: earlier assistant turns keep their reasoning inside <think>…</think>, and
# enable_thinking=false pre-fills an empty thought. llama.cpp recognises the reasoning markers from the template, so
# --reasoning-format deepseek moves the thought into reasoning_content; a plain ChatML template cannot do that.
THINK_TEMPLATE = (
    "{%- for message in messages %}"
    "{%- if message['role'] == 'assistant' %}"
    "{%- set content = message['content'] if message['content'] is string else '' %}"
    "{%- set reasoning = message['reasoning_content'] if message['reasoning_content'] is defined "
    "and message['reasoning_content'] is string else '' %}"
    "{%- if not reasoning and '</think>' in content %}"
    "{%- set reasoning = content.split('</think>')[0].split('<think>')[-1].strip('\\n') %}"
    "{%- set content = content.split('</think>')[-1].lstrip('\\n') %}"
    "{%- endif %}"
    "{{- '<|im_start|>assistant\\n' }}"
    "{%- if reasoning %}{{- '<think>\\n' + reasoning + '\\n</think>\\n\\n' }}{%- endif %}"
    "{{- content + '<|im_end|>\\n' }}"
    "{%- else %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
    "{%- endif %}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}"
    "{%- if enable_thinking is defined and enable_thinking is false %}{{- '<think>\\n\\n</think>\\n\\n' }}{%- endif %}"
    "{%- endif %}"
)

TEMPLATES = {"chatml": CHATML_TEMPLATE, "think": THINK_TEMPLATE}

SPACE = "\u2581"  # SentencePiece's word-boundary marker
SPECIAL_CONTROL = ["<|im_start|>", "<|im_end|>"]
SPECIAL_USER = ["<think>", "</think>"]  # plain text in the output, like Qwen3's (not hidden as control tokens)
PUNCT = list(".,:;!?'\"-()[]/")
GENERATOR_VERSION = 1  # bump when the layout below changes, so cached files are regenerated


@dataclass(frozen=True)
class ModelSpec:
    seed: int = 1234
    template: str = "chatml"  # "chatml" | "think"
    n_embd: int = 256
    n_layer: int = 4
    n_head: int = 4
    n_ff: int = 768
    n_ctx_train: int = 8192
    # logit of <|im_end|> relative to the others; calibrated so a turn ends after ~40 tokens on average with the
    # server's default sampler and temperature 0.8 (see tests/e2e/test_engine_smoke.py)
    eot_logit: float = 0.5

    def key(self) -> str:
        blob = json.dumps({**asdict(self), "v": GENERATOR_VERSION}, sort_keys=True).encode()
        return hashlib.sha256(blob).hexdigest()[:12]

    def filename(self) -> str:
        return f"tiny-{self.template}-s{self.seed}-{self.key()}.gguf"


def build_vocab() -> tuple[list[str], list[float], list[int]]:
    """SPM vocabulary: <unk> <s> </s>, the 256 byte-fallback tokens, specials, single characters, and every prefix
    of each '▁word' / '▁Word' (the SPM merge walks through the prefixes, so each word ends as one token)."""
    tokens: list[str] = ["<unk>", "<s>", "</s>"]
    types: list[int] = [int(TokenType.UNKNOWN), int(TokenType.CONTROL), int(TokenType.CONTROL)]
    tokens += [f"<0x{b:02X}>" for b in range(256)]
    types += [int(TokenType.BYTE)] * 256
    tokens += SPECIAL_CONTROL
    types += [int(TokenType.CONTROL)] * len(SPECIAL_CONTROL)
    tokens += SPECIAL_USER
    types += [int(TokenType.USER_DEFINED)] * len(SPECIAL_USER)
    seen = set(tokens)
    pieces: list[str] = []
    chars = [SPACE, "\n"] + list("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789") + PUNCT
    for ch in chars:
        if ch not in seen:
            seen.add(ch)
            pieces.append(ch)
    for word in WORDS:
        for form in (word, word[:1].upper() + word[1:]):
            full = SPACE + form
            for end in range(2, len(full) + 1):
                piece = full[:end]
                if piece not in seen:
                    seen.add(piece)
                    pieces.append(piece)
    tokens += pieces
    types += [int(TokenType.NORMAL)] * len(pieces)
    # Longer pieces score higher, so merges prefer completing a word.
    scores = [0.0] * (len(tokens) - len(pieces)) + [float(len(p)) for p in pieces]
    return tokens, scores, types


try:  # gguf is only needed to write the file; keep the module importable for the word list without it
    from gguf import GGUFWriter, LlamaFileType, TokenType
except ImportError:  # pragma: no cover - the e2e tests skip when the engine packages are missing
    GGUFWriter = LlamaFileType = TokenType = None  # type: ignore[assignment]


def write_model(path: Path, spec: ModelSpec) -> Path:
    """Write the GGUF for ``spec`` to ``path`` (atomically: a temp file renamed into place)."""
    rng = np.random.default_rng(spec.seed)
    tokens, scores, types = build_vocab()
    n_vocab = len(tokens)
    d, ff, head_dim = spec.n_embd, spec.n_ff, spec.n_embd // spec.n_head
    eot_id = tokens.index("<|im_end|>")

    def mat(rows: int, cols: int, std: float) -> np.ndarray:
        return (rng.standard_normal((rows, cols), dtype=np.float32) * std).astype(np.float16)

    # Channel 0 is the constant "stop channel"; the other channels carry small token-specific noise, so channel 0
    # dominates every RMSNorm and the normalised stop channel stays near sqrt(d) at every position.
    embd = rng.standard_normal((n_vocab, d), dtype=np.float32) * 0.1
    embd[:, 0] = 8.0
    # The other tokens' logits have a spread of about 0.16 whatever d is (normalised channels are ~0.1*sqrt(d)/8),
    # so eot_logit keeps its calibration when the width changes.
    output = rng.standard_normal((n_vocab, d), dtype=np.float32) * (12.8 / d)
    output[:, 0] = 0.0
    output[eot_id, 0] = spec.eot_logit / np.sqrt(d)  # logit ≈ eot_logit at every step
    norm_c0_off = np.ones(d, dtype=np.float32)
    norm_c0_off[0] = 0.0  # layers do not see the stop channel ...

    # one temp file per process: two test workers may build the same (seeded, identical) model at once, and each
    # then replaces the final file atomically with its own complete copy
    tmp = path.with_suffix(f".{os.getpid()}.tmp")
    writer = GGUFWriter(str(tmp), "llama")
    writer.add_name(f"servlens-tiny-{spec.template}")
    writer.add_description("random-weight test model generated by servlens tools/engine/model.py")
    writer.add_context_length(spec.n_ctx_train)
    writer.add_embedding_length(d)
    writer.add_block_count(spec.n_layer)
    writer.add_feed_forward_length(ff)
    writer.add_head_count(spec.n_head)
    writer.add_head_count_kv(spec.n_head)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_rope_dimension_count(head_dim)
    writer.add_rope_freq_base(10000.0)
    writer.add_vocab_size(n_vocab)
    writer.add_file_type(LlamaFileType.MOSTLY_F16)
    writer.add_tokenizer_model("llama")
    writer.add_token_list(tokens)
    writer.add_token_scores(scores)
    writer.add_token_types(types)
    writer.add_bos_token_id(1)
    writer.add_eos_token_id(eot_id)
    writer.add_unk_token_id(0)
    writer.add_add_bos_token(False)
    writer.add_add_eos_token(False)
    writer.add_chat_template(TEMPLATES[spec.template])

    writer.add_tensor("token_embd.weight", embd.astype(np.float16))
    for i in range(spec.n_layer):
        p = f"blk.{i}."
        writer.add_tensor(p + "attn_norm.weight", norm_c0_off)
        writer.add_tensor(p + "attn_q.weight", mat(d, d, 0.05))
        writer.add_tensor(p + "attn_k.weight", mat(d, d, 0.05))
        writer.add_tensor(p + "attn_v.weight", mat(d, d, 0.05))
        # Layers write little into the residual stream (and nothing into channel 0), so the stream stays close to
        # the embedding and the stop channel's share of the final RMSNorm does not depend on depth or context.
        wo = mat(d, d, 0.002)
        wo[0, :] = 0
        writer.add_tensor(p + "attn_output.weight", wo)
        writer.add_tensor(p + "ffn_norm.weight", norm_c0_off)
        writer.add_tensor(p + "ffn_gate.weight", mat(ff, d, 0.05))
        writer.add_tensor(p + "ffn_up.weight", mat(ff, d, 0.05))
        down = mat(d, ff, 0.002)
        down[0, :] = 0
        writer.add_tensor(p + "ffn_down.weight", down)
    writer.add_tensor("output_norm.weight", np.ones(d, dtype=np.float32))
    writer.add_tensor("output.weight", output.astype(np.float16))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    os.replace(tmp, path)
    return path


def default_cache_dir() -> Path:
    """Where generated models live: $SERVLENS_ENGINE_CACHE, else tools/engine/models/ (git-ignored)."""
    env = os.environ.get("SERVLENS_ENGINE_CACHE")
    return Path(env) if env else Path(__file__).resolve().parent / "models"


def ensure_model(spec: ModelSpec | None = None, cache_dir: Path | None = None) -> Path:
    """Return the path of the model for ``spec``, generating it into the cache the first time."""
    spec = spec or ModelSpec()
    cache_dir = Path(cache_dir) if cache_dir else default_cache_dir()
    cache_dir.mkdir(parents=True, exist_ok=True)
    path = cache_dir / spec.filename()
    if not path.exists():
        write_model(path, spec)
    return path
