"""forkv serve on a vision model (demo:qwen2_vl:tiny): images as data: URLs in chat
completions and in Responses input, and an unreadable image as a 400."""

from __future__ import annotations

import base64
import io

import pytest

openai = pytest.importorskip("openai")
Image = pytest.importorskip("PIL.Image")

from server_proc import running_server  # noqa: E402

MODEL = "demo:qwen2_vl:tiny"


def _png(color) -> str:
    buf = io.BytesIO()
    Image.new("RGB", (32, 32), color).save(buf, "PNG")
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode()


@pytest.fixture(scope="module")
def client():
    with running_server("--model", MODEL, "--reasoning", "off") as url:
        yield openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0, timeout=120)


def test_images_in_chat_and_responses(client):
    def ask(url):
        return client.chat.completions.create(model=MODEL, max_tokens=3, messages=[
            {"role": "user", "content": [{"type": "image_url", "image_url": {"url": url}},
                                         {"type": "text", "text": "What color is it?"}]}])

    red = ask(_png((200, 30, 30)))
    assert red.choices[0].finish_reason in ("stop", "length")
    text_only = client.chat.completions.create(
        model=MODEL, max_tokens=3, messages=[{"role": "user", "content": "What color is it?"}])
    assert red.usage.prompt_tokens > text_only.usage.prompt_tokens  # the image's tokens
    resp = client.responses.create(model=MODEL, max_output_tokens=3, input=[
        {"role": "user", "content": [{"type": "input_image", "image_url": _png((0, 0, 255))},
                                     {"type": "input_text", "text": "And this one?"}]}])
    assert resp.output[-1].type == "message" and resp.usage.input_tokens > 0
    with pytest.raises(openai.BadRequestError) as e:
        ask("data:image/png;base64," + base64.b64encode(b"not an image").decode())
    assert e.value.code == "invalid_image"
    with pytest.raises(openai.BadRequestError) as e:
        ask("https://example.com/cat.png")
    assert e.value.code == "invalid_image_url"
