#!/usr/bin/env python3
"""Builds the project's tiny GLM-style tokenizer (testdata/tokenizers/tiny-glm/).

A byte-level BPE with exactly 1000 ordinary tokens, trained with Hugging Face
`tokenizers` on the small mixed corpus below (English, code, CJK, emoji,
digits), with GLM-4's pre-tokenizer (Split on the GLM-4 regex, then ByteLevel
without its own regex) and the GLM special tokens as added tokens right after
the ordinary vocabulary: ids 1000..1035, in the real table's order
(docs/model.md §5.1), so `<|user|>` - `<|endoftext|>` and friends keep the same
offsets as in the real 151329-based table.

The tiny checkpoints (vocab_size 1040) copy this tokenizer. The output is
committed; rerun only to change it:

    python3 scripts/tokenizer_build_tiny.py testdata/tokenizers/tiny-glm
"""

import json
import os
import sys

from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers, trainers

GLM4_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)

ORDINARY_VOCAB = 1000

# (content, special). Order and names are the GLM-4.5/4.6/4.7 table. The role
# and control markers are "special" (dropped by decode(skip_special=True)); the
# markup the parsers read back from generated text (<think>, <tool_call>, ...)
# is an added but not special token, so a decode that skips specials keeps it.
SPECIALS = [
    ("<|endoftext|>", True),
    ("[MASK]", True),
    ("[gMASK]", True),
    ("[sMASK]", True),
    ("<sop>", True),
    ("<eop>", True),
    ("<|system|>", True),
    ("<|user|>", True),
    ("<|assistant|>", True),
    ("<|observation|>", True),
    ("<|begin_of_image|>", True),
    ("<|end_of_image|>", True),
    ("<|begin_of_video|>", True),
    ("<|end_of_video|>", True),
    ("<|begin_of_audio|>", True),
    ("<|end_of_audio|>", True),
    ("<|begin_of_transcription|>", True),
    ("<|end_of_transcription|>", True),
    ("<|code_prefix|>", True),
    ("<|code_middle|>", True),
    ("<|code_suffix|>", True),
    ("<think>", False),
    ("</think>", False),
    ("<tool_call>", False),
    ("</tool_call>", False),
    ("<tool_response>", False),
    ("</tool_response>", False),
    ("<arg_key>", False),
    ("</arg_key>", False),
    ("<arg_value>", False),
    ("</arg_value>", False),
    ("/nothink", False),
    ("<|begin_of_box|>", False),
    ("<|end_of_box|>", False),
    ("<|image|>", True),
    ("<|video|>", True),
]

CORPUS = [
    """The quick brown fox jumps over the lazy dog. It's a sentence that they'll use,
we've seen it, I'm sure you'd agree. Tokenizers split text into pieces; the pieces
are mapped to numbers, and the model reads the numbers. Don't forget: whitespace
matters, and so do    runs of spaces, tabs\tand newlines.

A language model predicts the next token. Given a prompt, it computes logits over the
vocabulary, and a sampler picks one token: greedy, top-k, top-p or min-p sampling.
Temperature scales the logits before the softmax. The answer is streamed back to the
user as text, one complete character at a time.""",
    """def encode(text: str, add_special: bool = False) -> list[int]:
    ids = []
    for piece in pre_tokenize(text):
        ids.extend(bpe(piece))
    return ids

class Scheduler:
    def __init__(self, max_batch=64):
        self.max_batch = max_batch
        self.queue = []

    def step(self):
        batch = self.queue[: self.max_batch]
        return [seq.next_token() for seq in batch]
""",
    """package main

import (
\t"fmt"
\t"os"
)

func main() {
\tif len(os.Args) < 2 {
\t\tfmt.Fprintln(os.Stderr, "usage: glmctl generate --prompt TEXT")
\t\tos.Exit(2)
\t}
\tfor i, arg := range os.Args[1:] {
\t\tfmt.Printf("%d: %s\\n", i, arg)
\t}
}
""",
    """{"name": "get_weather", "arguments": {"city": "Beijing", "unit": "celsius", "days": 3}}
{"model": "glm-4.7", "messages": [{"role": "user", "content": "Hello!"}], "stream": true}
SELECT id, name FROM users WHERE created_at > '2025-01-01' ORDER BY id LIMIT 100;
<html><body><div class="main">Hello, world!</div></body></html>
x = [1, 2, 3]; y = {k: v for k, v in zip("abc", x)}; print(y["a"] + 42)
""",
    """人工智能正在改变世界。大语言模型可以回答问题、写代码、翻译文章。
今天天气很好，我们去公园散步吧。北京是中国的首都，上海是最大的城市。
模型的推理速度取决于显存带宽和计算能力。请用中文回答下面的问题。
你好，世界！这是一个测试。数据、算法和算力是人工智能的三个要素。""",
    """日本語のテキストも少し含めます。東京は日本の首都です。ありがとうございます。
한국어 문장도 있습니다. 안녕하세요, 반갑습니다. 서울은 한국의 수도입니다.
Ünïcödé façade naïve café résumé — “quotes” and ‘single quotes’ … ½ × ÷ ± ≤ ≥ ≠ ∞.
Emoji: 😀 😂 👍 🚀 🎉 ❤️ 👨‍👩‍👧‍👦 🇨🇳 🇺🇸 ✅ ⚠️""",
    """Numbers: 0 1 2 3 4 5 6 7 8 9 10 42 100 256 1024 2048 4096 65536 3.14159 2.71828
151329 151552 202752 1000000 2025-11-22 12:34:56 +86 138 0013 8000 $1,234.56 99% 1e-5
The year 2024 had 366 days; 1234567890 is a long run of digits; so is 00000000.""",
    """Once upon a time there was a small model. It had three layers, eight experts and a
vocabulary of one thousand and forty tokens. Nobody expected it to write poetry, but it
could count: one, two, three, four, five. It learned that "think" comes before "answer",
that tools are called with arguments, and that the observation comes back from the tool.
What's the time? It's late. They're here. We'll see. You've done it. She'd know.""",
]


def corpus_lines():
    # Repeat with small variations so frequent pairs win and the merges cover
    # words, code keywords, CJK characters and digit groups.
    for rep in range(4):
        for block in CORPUS:
            for line in block.splitlines(keepends=True):
                yield line
                if rep % 2 == 1:
                    yield line.upper()
                    yield line.lower()


def train_glm_bpe(texts, vocab, who, length=None):
    """A byte-level BPE of exactly `vocab` ordinary tokens with GLM-4's
    pre-tokenizer, trained on `texts`, with SPECIALS added at ids vocab, vocab+1, ...
    (scripts/demo_corpus.py trains the demo model's tokenizer with it too)."""
    tok = Tokenizer(models.BPE(unk_token=None, fuse_unk=False, byte_fallback=False))
    tok.normalizer = None
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(GLM4_SPLIT), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=True, use_regex=False),
        ]
    )
    tok.decoder = decoders.ByteLevel(add_prefix_space=True, trim_offsets=True, use_regex=True)
    trainer = trainers.BpeTrainer(
        vocab_size=vocab,
        min_frequency=2,
        show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        special_tokens=[],
    )
    tok.train_from_iterator(texts, trainer=trainer, length=length)
    got = tok.get_vocab_size(with_added_tokens=False)
    if got != vocab:
        sys.exit(f"{who}: trained vocab has {got} tokens, want {vocab}: enlarge the corpus")

    for i, (content, special) in enumerate(SPECIALS):
        added = AddedToken(content, single_word=False, lstrip=False, rstrip=False, normalized=False, special=special)
        tok.add_tokens([added])
        tid = tok.token_to_id(content)
        if tid != vocab + i:
            sys.exit(f"{who}: {content} got id {tid}, want {vocab + i}")
    return tok


def build(out_dir):
    tok = train_glm_bpe(corpus_lines(), ORDINARY_VOCAB, "tokenizer_build_tiny")

    os.makedirs(out_dir, exist_ok=True)
    tok.save(os.path.join(out_dir, "tokenizer.json"), pretty=False)

    template_path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "testdata", "tokenizers", "templates", "glm47", "chat_template.jinja")
    with open(template_path, encoding="utf-8") as f:
        template = f.read()
    with open(os.path.join(out_dir, "chat_template.jinja"), "w", encoding="utf-8") as f:
        f.write(template)

    decoder = {}
    for i, (content, special) in enumerate(SPECIALS):
        decoder[str(ORDINARY_VOCAB + i)] = {
            "content": content,
            "lstrip": False,
            "normalized": False,
            "rstrip": False,
            "single_word": False,
            "special": special,
        }
    config = {
        "added_tokens_decoder": decoder,
        "additional_special_tokens": [c for c, _ in SPECIALS],
        "clean_up_tokenization_spaces": False,
        "do_lower_case": False,
        "eos_token": "<|endoftext|>",
        "extra_special_tokens": {},
        "model_max_length": 4096,
        "pad_token": "<|endoftext|>",
        "padding_side": "left",
        "remove_space": False,
        "tokenizer_class": "PreTrainedTokenizerFast",
    }
    with open(os.path.join(out_dir, "tokenizer_config.json"), "w", encoding="utf-8") as f:
        json.dump(config, f, indent=2, ensure_ascii=False)
        f.write("\n")
    ids = {c: ORDINARY_VOCAB + i for i, (c, _) in enumerate(SPECIALS)}
    gen = {
        "_from_model_config": True,
        "eos_token_id": [ids["<|endoftext|>"], ids["<|user|>"], ids["<|observation|>"]],
        "pad_token_id": ids["<|endoftext|>"],
        "temperature": 1.0,
    }
    with open(os.path.join(out_dir, "generation_config.json"), "w", encoding="utf-8") as f:
        json.dump(gen, f, indent=2)
        f.write("\n")
    print(json.dumps(ids))


if __name__ == "__main__":
    build(sys.argv[1] if len(sys.argv) > 1 else "testdata/tokenizers/tiny-glm")
