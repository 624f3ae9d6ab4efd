"""The tokenizer of the tiny local models: a byte-level BPE trained on the task text, with the
Qwen special tokens and a Qwen-style chat template (docs/platform.md "Tiny local VLMs").

Why train one: a real Qwen vocabulary (151 k entries) would put ~39 M parameters into the
embedding and output layers of a ~1 M-parameter model. A BPE of a few hundred entries, fitted to
the synthetic questions and answers, keeps the model tiny and every answer a few tokens long.

Contract (tests/unit/test_models_tiny.py checks each point):

- Byte level: every string is encodable (the 256 byte symbols are in the alphabet), nothing maps
  to an unknown token; decode(encode(s)) == s.
- Pre-tokenization is Qwen2's (`PRETOKENIZE_REGEX` below, NFC, then bytes), so the tiny model
  splits text the way a real Qwen checkpoint does.
- Special tokens (`SPECIAL_TOKENS`): <|endoftext|> is pad (and unk, never produced), <|im_end|>
  is eos. `<answer>` and `</answer>` are NOT special: TRL decodes completions with
  skip_special_tokens=True, which would strip them (docs/platform.md).
- padding_side is left: generation pads prompts on the left.
- The chat template (`CHAT_TEMPLATE`) renders Qwen's <|im_start|>role\\n...<|im_end|>\\n turns;
  content is a string or a list of {"type": "image"} / {"type": "text", "text": ...} parts, an
  image part becomes <|vision_start|><|image_pad|><|vision_end|> (the processor expands the pad to
  the image's token count). Deviation from Qwen: no default system prompt (it would only add
  tokens to every row of a tiny model). The rendering of a prompt with add_generation_prompt=True
  is an exact string prefix of the rendering of prompt + completion, which TRL's SFTTrainer needs
  for completion-only loss; assistant content is wrapped in {% generation %} so
  assistant_only_loss works too.

Torch-free: `tokenizers` is a Rust extension without torch; transformers is imported inside
`wrap_tokenizer` only.
"""

from __future__ import annotations

from typing import Any, Iterable

# --- the vocabulary's fixed part

PAD_TOKEN = "<|endoftext|>"
BOS_CHAT = "<|im_start|>"
EOS_TOKEN = "<|im_end|>"
VISION_START = "<|vision_start|>"
VISION_END = "<|vision_end|>"
IMAGE_PAD = "<|image_pad|>"
VIDEO_PAD = "<|video_pad|>"

#: Added first, so their ids are 0..6 in this order for every corpus.
SPECIAL_TOKENS = (PAD_TOKEN, BOS_CHAT, EOS_TOKEN, VISION_START, VISION_END, IMAGE_PAD, VIDEO_PAD)

#: Tokens a policy must never sample: a sampled image/video pad would not match any image
#: features, and vision start/end have no meaning in a completion. (pad and eos are handled
#: by generate itself.)
NEVER_SAMPLED = (VISION_START, VISION_END, IMAGE_PAD, VIDEO_PAD, BOS_CHAT)

#: Qwen2's pre-tokenizer (transformers/models/qwen2/tokenization_qwen2.py, PRETOKENIZE_REGEX).
PRETOKENIZE_REGEX = (
    r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"""
)

# --- the chat template
# One macro renders a message's content; assistant turns are wrapped in {% generation %} so
# transformers can return assistant masks. Whitespace control ({%- -%}) everywhere: the only
# newlines emitted are the literal '\n' strings, so the prompt is a byte-exact prefix.
CHAT_TEMPLATE = (
    "{%- macro render(content) -%}"
    "{%- if content is string -%}{{- content -}}"
    "{%- else -%}{%- for part in content -%}"
    "{%- if part['type'] == 'image' or part['type'] == 'image_url' -%}"
    "{{- '<|vision_start|><|image_pad|><|vision_end|>' -}}"
    "{%- elif part['type'] == 'text' -%}{{- part['text'] -}}"
    "{%- endif -%}"
    "{%- endfor -%}{%- endif -%}"
    "{%- endmacro -%}"
    "{%- for message in messages -%}"
    "{{- '<|im_start|>' + message['role'] + '\\n' -}}"
    "{%- if message['role'] == 'assistant' -%}"
    "{%- generation -%}{{- render(message['content']) + '<|im_end|>' -}}{%- endgeneration -%}"
    "{{- '\\n' -}}"
    "{%- else -%}"
    "{{- render(message['content']) + '<|im_end|>\\n' -}}"
    "{%- endif -%}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{- '<|im_start|>assistant\\n' -}}{%- endif -%}"
)


# --- training


def corpus_lines(corpus: Iterable[str]) -> list[str]:
    """The corpus as it is trained on and hashed: sorted unique non-empty lines. The tokenizer then
    depends on the corpus as a set of lines, never on the caller's order or on how often a template
    line repeats."""
    return sorted({line for text in corpus for line in str(text).splitlines() if line})


def train_bpe(corpus: Iterable[str], vocab_size: int):
    """A `tokenizers.Tokenizer`: byte-level BPE fitted to `corpus`, at most `vocab_size` entries.

    The vocabulary is the 7 special tokens, the 256 byte symbols, then merges in order of
    frequency until `vocab_size` (fewer when the corpus runs out of pairs: still deterministic).
    """
    from tokenizers import Regex, Tokenizer, decoders, normalizers, pre_tokenizers
    from tokenizers.models import BPE
    from tokenizers.trainers import BpeTrainer

    floor = len(SPECIAL_TOKENS) + 256
    if vocab_size < floor:
        raise ValueError(
            f"tiny.vocab_size ({vocab_size}) must be at least {floor}: 7 special tokens plus the 256 byte "
            f"symbols that make every string encodable; use 512."
        )
    tok = Tokenizer(BPE(unk_token=None, fuse_unk=False, byte_fallback=False))
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(PRETOKENIZE_REGEX), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    tok.decoder = decoders.ByteLevel()
    trainer = BpeTrainer(
        vocab_size=vocab_size,
        # The corpus is a set of unique lines, so a word like "yellow" may occur once: with
        # min_frequency=2 it stayed spelled out in bytes (343 entries, 12-token answers), and
        # sampled answers went malformed one character at a time. Merge down to vocab_size.
        min_frequency=1,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    lines = corpus_lines(corpus)
    if not lines:
        raise ValueError("the tokenizer corpus is empty; pass the dataset's question and answer texts.")
    tok.train_from_iterator(lines, trainer=trainer, length=len(lines))
    return tok


def wrap_tokenizer(tok: Any):
    """A transformers fast tokenizer around a trained `tokenizers.Tokenizer`, with the Qwen specials,
    left padding and the chat template. Saves and reloads with AutoTokenizer (tokenizer.json)."""
    from transformers import PreTrainedTokenizerFast

    hf = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        pad_token=PAD_TOKEN,
        eos_token=EOS_TOKEN,
        unk_token=None,  # byte-level: nothing is unknown
        bos_token=None,  # Qwen has no BOS; the chat template opens every turn itself
        padding_side="left",
        model_max_length=4096,
        chat_template=CHAT_TEMPLATE,
        clean_up_tokenization_spaces=False,
        extra_special_tokens={
            "image_token": IMAGE_PAD,
            "video_token": VIDEO_PAD,
            "vision_start_token": VISION_START,
            "vision_end_token": VISION_END,
        },
    )
    return hf


def build_tokenizer(corpus: Iterable[str], vocab_size: int):
    """train_bpe + wrap_tokenizer: the tokenizer of a tiny model."""
    return wrap_tokenizer(train_bpe(corpus, vocab_size))


def never_sampled_ids(tokenizer: Any) -> list[int]:
    """Ids of `NEVER_SAMPLED` present in `tokenizer` (a tokenizer or anything with .tokenizer)."""
    tok = getattr(tokenizer, "tokenizer", tokenizer)
    vocab = tok.get_vocab()
    return sorted(vocab[t] for t in NEVER_SAMPLED if t in vocab)
