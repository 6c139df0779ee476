"""A Hugging Face tokenizer for the benchmark's synthetic text, so the precise path can tokenize in EPP's process.

``build(folder)`` writes ``tokenizer.json`` (a byte-level BPE trained, deterministically, on the workloads' random
lowercase words, with the simulator's chat roles as special tokens) and ``chat_template.jinja``, a Jinja chat
template that renders exactly what the simulator's built-in template renders (``<|role|>`` line, content, newline;
then ``<|assistant|>``). A pool started with ``--tokenizer FOLDER`` tokenizes with it, and ``epp:precise-local``
reads the same folder, so EPP's local ids are the servers' ids; tests/bench check both against each other.
``python -m bench.routing.tokenizer FOLDER`` builds it.
"""

from __future__ import annotations

import random
import sys
from pathlib import Path

from bench.routing.workloads import text

__all__ = ["CHAT_TEMPLATE", "build"]

VOCAB = 8192
ROLES = ("system", "user", "assistant", "tool")
CHAT_TEMPLATE = (
    "{% for message in messages %}{{ '<|' + message['role'] + '|>\\n' }}"
    "{% if message['content'] is string %}{{ message['content'] }}"
    "{% else %}{% for part in message['content'] %}"
    "{{ part['text'] if part['type'] == 'text' else '<' + part['type'] + '>' }}{% endfor %}{% endif %}"
    "{{ '\\n' }}{% endfor %}{% if add_generation_prompt %}{{ '<|assistant|>\\n' }}{% endif %}"
)
"""The simulator's built-in chat template (``epp_sim.apply_chat_template``) as a Hugging Face chat template."""


def build(folder: Path, vocab: int = VOCAB) -> Path:
    """Write ``tokenizer.json`` and ``chat_template.jinja`` into ``folder`` (created); returns ``folder``."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    rng = random.Random(0)
    corpus = [text(rng, 512) for _ in range(400)]
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  special_tokens=[f"<|{role}|>" for role in ROLES], show_progress=False)
    tok.train_from_iterator(corpus, trainer)
    folder.mkdir(parents=True, exist_ok=True)
    tok.save(str(folder / "tokenizer.json"))
    (folder / "chat_template.jinja").write_text(CHAT_TEMPLATE)
    return folder


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: python -m bench.routing.tokenizer FOLDER")
    print(build(Path(sys.argv[1])))
