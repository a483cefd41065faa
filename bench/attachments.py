"""Attachments (issue 17): what 50 image messages cost the database and the page (the goal:
nothing that grows with the images' bytes), and the latency from uploading a 5 MB phone
photo to its request reaching the provider."""

from __future__ import annotations

import asyncio
import io
import json
import random
import time
import uuid

from bench.common import summary

MESSAGES = 50
# A screenshot-sized image next to a phone photo's worth of pixels (noise, so the JPEG
# weighs what a photo does): the log and the page must be the same size for both.
SMALL = (64, 48)
LARGE = (1400, 1050)
# A phone photo: 12 MP, ~5 MB as a JPEG.
PHOTO = (4000, 3000)
PHOTO_QUALITY = 84
PHOTO_RUNS = 5


def photo(size: tuple[int, int], seed: int, quality: int = PHOTO_QUALITY) -> bytes:
    """A noisy JPEG, different for each seed."""
    from PIL import Image

    rng = random.Random(seed)
    coarse = (max(1, size[0] // 8), max(1, size[1] // 8))
    im = Image.frombytes("RGB", coarse, rng.randbytes(coarse[0] * coarse[1] * 3))
    im = im.resize(size, Image.Resampling.BILINEAR)
    noise = Image.frombytes("RGB", size, rng.randbytes(size[0] * size[1] * 3))
    out = io.BytesIO()
    Image.blend(im, noise, 0.25).save(out, "JPEG", quality=quality)
    return out.getvalue()


def run() -> dict:
    from django.contrib.auth import get_user_model
    from django.test import Client

    user = get_user_model().objects.create_superuser("attachments", password="x" * 12)
    client = Client(HTTP_HOST="127.0.0.1")
    client.force_login(user)
    tabs = {
        label: _tab_of_images(user, client, size)
        for label, size in (("small", SMALL), ("large", LARGE))
    }
    small, large = tabs["small"], tabs["large"]
    return {
        "messages": MESSAGES,
        "tabs": tabs,
        "row_ratio_large_to_small": round(large["row_bytes"] / small["row_bytes"], 3),
        "db_ratio_large_to_small": round(large["db_bytes"] / small["db_bytes"], 3),
        "page_ratio_large_to_small": round(large["page_bytes"] / small["page_bytes"], 3),
        "blob_ratio_large_to_small": round(large["blob_bytes"] / small["blob_bytes"], 1),
        "photo": _upload_to_sent(user, client),
    }


def _tab_of_images(user, client, size: tuple[int, int]) -> dict:
    """A tab of MESSAGES user messages, each with one image of `size`, and an answer each:
    its rows' bytes (the chunks' data as JSON: exact), the database file's growth (in
    whole pages, and noisy: free pages are reused), the page's and the API page's
    bytes, the blobs' bytes."""
    from chat import blobs, log
    from chat.management.commands.dispatch_status import database_size
    from chat.models import Chunk
    from chat.preferences import new_tab
    from chat.stream import Block

    tab = new_tab(user, "offline/demo")
    files = [blobs.normalise(photo(size, seed), f"shot-{seed}.jpg") for seed in range(MESSAGES)]
    before = _db_bytes(database_size)
    turn = uuid.uuid4()
    for i, n in enumerate(files):
        blobs.add_uploads(tab.pk, [n])
        blobs.mark_sent(tab.pk, [n.ref()])
        data = {"text": f"What is in picture {i}?", "attachments": [n.ref()]}
        answer = {"text": f"Picture {i} shows noise."}
        log.append(
            tab.pk,
            [
                Block(uuid.uuid4(), turn, 0, "user", "text", data),
                Block(uuid.uuid4(), turn, 1, "assistant", "text", answer),
            ],
        )
    grown = _db_bytes(database_size) - before
    rows = sum(
        len(json.dumps(data))
        for data in Chunk.objects.filter(tab=tab).values_list("data", flat=True)
    )
    page = client.get(f"/t/{tab.pk}/")
    api = client.get(f"/api/v1/tabs/{tab.pk}/chunks")
    assert page.status_code == api.status_code == 200
    assert b"base64" not in page.content and b"base64" not in api.content
    return {
        "image": f"{size[0]}x{size[1]}",
        "row_bytes": rows,
        "db_bytes": grown,
        "page_bytes": len(page.content),
        "api_bytes": len(api.content),
        "blob_bytes": sum(len(n.data) for n in files),
    }


def _db_bytes(database_size) -> int:
    from django.db import connection

    if connection.vendor == "sqlite":
        with connection.cursor() as cursor:
            # Without VACUUM the small tab can fit in free pages an earlier section left:
            # a growth of 0 bytes, and a ratio that divides by it.
            cursor.execute("VACUUM")
            cursor.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    return database_size().size_bytes


def _upload_to_sent(user, client) -> dict:
    """A 5 MB photo: the upload (normalised and stored), the message (queued), then its
    request (history, base64, the SDK) until the fake Anthropic server has received it."""
    from django.core.files.uploadedfile import SimpleUploadedFile

    from chat import history
    from chat.blobs import READER
    from chat.models import QueuedMessage
    from chat.preferences import new_tab
    from chat.providers.anthropic import AnthropicProvider
    from chat.providers.base import Request
    from chat.providers.registry import model_info
    from chat.stream import Block
    from harness.fakeprovider import FakeProviderServer, Reply, collect

    server = FakeProviderServer().start()
    provider = AnthropicProvider(
        model_info("anthropic/claude-sonnet-4-5"), api_key="bench", base_url=server.url
    )
    upload_s, send_s, request_s, totals, sizes, sent_bytes = [], [], [], [], [], []
    try:
        for seed in range(PHOTO_RUNS):
            raw = photo(PHOTO, 1000 + seed)
            sizes.append(len(raw))
            tab = new_tab(user, "anthropic/claude-sonnet-4-5")
            start = time.perf_counter()
            response = client.post(
                f"/t/{tab.pk}/attachments/",
                {"file": SimpleUploadedFile("IMG_0001.jpg", raw, content_type="image/jpeg")},
            )
            assert response.status_code == 200, response.content[:200]
            uploaded = time.perf_counter()
            value = response.content.decode().split('name="attachment" value="')[1].split('"')[0]
            response = client.post(
                f"/t/{tab.pk}/send/", {"text": "What is this?", "attachment": value}
            )
            assert response.status_code == 302, response.status_code
            queued = time.perf_counter()
            message = QueuedMessage.objects.get(tab=tab)
            data = {"text": message.text, "attachments": message.attachments}
            chunk = Block(uuid.uuid4(), None, 0, "user", "text", data, seq=1)
            server.add(Reply(events=_answer()))
            asyncio.run(
                collect(provider.stream(Request("", (), history.build([chunk]), blobs=READER)))
            )
            done = time.perf_counter()
            sent_bytes.append(len(server.last.body))
            upload_s.append(uploaded - start)
            send_s.append(queued - uploaded)
            request_s.append(done - queued)
            totals.append(done - start)
    finally:
        server.stop()
    return {
        "photo_bytes": round(sum(sizes) / len(sizes)),
        "request_bytes": round(sum(sent_bytes) / len(sent_bytes)),
        "upload": summary(upload_s),
        "send": summary(send_s),
        "request": summary(request_s),
        "total": summary(totals),
    }


def _answer() -> list[dict]:
    return [
        {"type": "message_start", "message": {"usage": {"input_tokens": 1600, "output_tokens": 1}}},
        {"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}},
        {
            "type": "content_block_delta",
            "index": 0,
            "delta": {"type": "text_delta", "text": "A photo."},
        },
        {"type": "content_block_stop", "index": 0},
        {
            "type": "message_delta",
            "delta": {"stop_reason": "end_turn"},
            "usage": {"output_tokens": 3},
        },
        {"type": "message_stop"},
    ]
