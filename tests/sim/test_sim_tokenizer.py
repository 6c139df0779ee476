"""Tokenizers: the built-in one a gateway can reproduce, chat template, HF files."""

from __future__ import annotations

from pathlib import Path

import pytest

from epp_sim import (
    ByteTokenizer,
    SimConfig,
    SimServer,
    apply_chat_template,
    load_tokenizer,
)
from epp_sim.tokenizer import OutputText


def test_byte_tokenizer_is_four_bytes_per_token_little_endian() -> None:
    tok = ByteTokenizer()
    ids = tok.encode("abcdefg")
    assert list(ids) == [int.from_bytes(b"abcd", "little"), int.from_bytes(b"efg\0", "little")]
    assert tok.decode(ids) == "abcdefg"
    # A shared prefix of n bytes is a shared prefix of n // 4 tokens.
    assert list(tok.encode("shared prefix A"))[:3] == list(tok.encode("shared prefix B"))[:3]


def test_chat_template() -> None:
    text = apply_chat_template([
        {"role": "system", "content": "S"},
        {"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "image_url"}]},
    ])
    assert text == "<|system|>\nS\n<|user|>\na<image_url>\n<|assistant|>\n"
    with pytest.raises(ValueError):
        apply_chat_template([{"content": "no role"}])


def test_output_text_is_consistent_across_views() -> None:
    out = OutputText(ByteTokenizer(), seed=3, length=64)
    text = out.text(10, 0, 200)  # wraps around the cycle three times
    assert "".join(out.pieces(10, 0, 200)) == text
    assert ByteTokenizer().decode(out.ids(10, 200)) == text.rstrip("\0")
    assert out.token_id(10, 70) == out.ids(10, 71)[70]


def test_hugging_face_tokenizer_file(tmp_path: Path) -> None:
    tokenizers = pytest.importorskip("tokenizers")
    vocab = {"[UNK]": 0, "hello": 1, "world": 2, "the": 3}
    tok = tokenizers.Tokenizer(tokenizers.models.WordLevel(vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = tokenizers.pre_tokenizers.Whitespace()
    path = tmp_path / "tokenizer.json"
    tok.save(str(path))
    loaded = load_tokenizer(str(path))
    assert list(loaded.encode("hello world")) == [1, 2]
    SimServer(SimConfig(tokenizer=str(path)))  # builds its output text from that vocabulary
