"""Multimodal encoder-cache affinity end to end: the official ``openai`` client sends chat requests with images
through the gateway to three simulated vLLM servers, scheduled by ``mm-embeddings-cache-scorer`` (its producer is
created by the loader). A repeated image follows its first request; new images are spread by the picker's tie-break
(seeded, so the run is reproducible)."""

from __future__ import annotations

import random
from typing import Any

from epp.plugins.producers.mm_embeddings_cache import PRODUCER_TYPE
from epp_sim import SimServer

from .helpers import MODEL, sim, spec_for

CONFIG = """\
plugins:
- type: mm-embeddings-cache-scorer
- type: max-score-picker
schedulingProfiles:
- name: default
  plugins: [{pluginRef: mm-embeddings-cache-scorer}, {pluginRef: max-score-picker}]
"""
IMAGES = [f"https://images.example/{i}.png" for i in range(6)]


def messages(question: str, *urls: str) -> list[dict[str, Any]]:
    parts: list[dict[str, Any]] = [{"type": "image_url", "image_url": {"url": url}} for url in urls]
    return [{"role": "user", "content": [{"type": "text", "text": question}, *parts]}]


async def test_a_repeated_image_goes_where_it_went_and_new_images_spread(sims, stack):
    servers: list[SimServer] = await sims(*[sim() for _ in range(3)])
    st = await stack(CONFIG, [spec_for(s) for s in servers])
    st.director.pipeline.scheduler.profiles["default"].picker.rng = random.Random(7)
    async with st.openai() as client:
        for url in IMAGES:
            await client.chat.completions.create(model=MODEL, messages=messages("What is this?", url),
                                                 max_tokens=4)
        first = [ep.name for _, ep, _ in st.recorder.done]
        for url in reversed(IMAGES):  # another question about each image, streamed this time
            stream = await client.chat.completions.create(model=MODEL, messages=messages("And its colour?", url),
                                                          max_tokens=4, stream=True)
            _ = [chunk async for chunk in stream]
    again = [ep.name for _, ep, _ in st.recorder.done[len(IMAGES):]]
    assert len(set(first)) > 1, first  # six new images did not all land on one endpoint
    assert again == first[::-1]
    assert all(info.status == 200 for info in st.recorder.infos)
    producer = st.director.pipeline.handle.plugin(PRODUCER_TYPE)
    assert sum(producer.item_counts().values()) == len(IMAGES)


async def test_the_image_decides_not_the_text(sims, stack):
    servers: list[SimServer] = await sims(*[sim() for _ in range(3)])
    st = await stack(CONFIG, [spec_for(s) for s in servers])
    async with st.openai() as client:
        await client.chat.completions.create(model=MODEL, messages=messages("Describe it.", IMAGES[0]),
                                             max_tokens=4)
        target = st.recorder.done[-1][1].name
        for question in ("Count the objects.", "Any text in it?", "Is it a photo?"):
            await client.chat.completions.create(model=MODEL, messages=messages(question, IMAGES[0], IMAGES[0]),
                                                 max_tokens=4)
    assert [ep.name for _, ep, _ in st.recorder.done[1:]] == [target] * 3
