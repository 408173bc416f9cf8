"""Images in requests: content-addressed inputs, and vision prompts rendered to tokens.

An image arrives as bytes, a local file path or a PIL image and is known by the sha256 of its
bytes. A prompt carries images either as chat messages whose content has
`{"type": "image", "image": ...}` parts (or bare `{"type": "image"}` parts filled, in order,
from an `images` list), as a list of content parts (one user message), as text plus `images`
(one user message: images first), or as token ids with one image placeholder per image.
`VisionPrompt` is the result: tokens with each placeholder expanded the model family's way
(text around the image, then one image token per feature), each image's span, and the
block-key extras (each image's digest and place in the block). Knows nothing about models.
"""

from __future__ import annotations

import hashlib
import os
import struct
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from ..errors import GenerationError
from ..models.special_tokens import encode_text


@dataclass(slots=True, frozen=True)
class ImageInput:
    data: bytes
    digest: bytes  # sha256 of `data`: the image's identity in keys and the feature cache
    source: str | None = field(default=None, compare=False)  # the path it was read from

    @classmethod
    def of(cls, image) -> ImageInput:
        """From bytes, a local file path or a PIL image."""
        if isinstance(image, ImageInput):
            return image
        if isinstance(image, (bytes, bytearray, memoryview)):
            data = bytes(image)
        elif isinstance(image, (str, os.PathLike)):
            if str(image).startswith(("http://", "https://", "data:")):
                raise GenerationError(
                    "forkv does not fetch image URLs; pass the image's bytes or a local path.")
            try:
                with open(image, "rb") as f:
                    data = f.read()
            except OSError as e:
                raise GenerationError(f"Cannot read image file {str(image)!r}: {e}.") from e
        elif hasattr(image, "save"):  # a PIL image: its PNG encoding is its identity
            import io

            buf = io.BytesIO()
            image.save(buf, format="PNG")
            data = buf.getvalue()
        else:
            raise GenerationError(
                f"Unsupported image of type {type(image).__name__}; pass bytes, a local path "
                "or a PIL image.")
        if not data:
            raise GenerationError("An image is empty (0 bytes); pass the image file's bytes.")
        source = str(image) if isinstance(image, (str, os.PathLike)) else None
        return cls(data, hashlib.sha256(data).digest(), source)

    def load(self):
        """The decoded RGB image (PIL)."""
        import io

        from PIL import Image, UnidentifiedImageError

        try:
            return Image.open(io.BytesIO(self.data)).convert("RGB")
        except (UnidentifiedImageError, OSError) as e:
            name = repr(self.source) if self.source else f"sha256:{self.digest.hex()[:12]}"
            raise GenerationError(f"Image {name} is not a readable image file ({e}); pass a "
                                  "PNG, JPEG, GIF, BMP or WebP file.") from e


@dataclass(slots=True, frozen=True)
class ImageSlot:
    image: ImageInput
    grid: tuple[int, int, int]  # (t, h, w), as the model family lays the image out
    start: int  # span of the image's feature tokens in the prompt
    end: int


@dataclass(slots=True)
class VisionPrompt:
    tokens: list[int]
    images: list[ImageSlot]
    pixels: dict = field(default_factory=dict)  # digest -> preprocessed pixels, if computed

    def extras(self, block_size: int) -> dict[int, list[bytes]]:
        """Per block, what keys it besides its tokens: the digest of each image overlapping it
        and where in the block that image's span lies (the same image elsewhere is another
        key, even where the tokens alone could not tell)."""
        out: dict[int, list[bytes]] = {}
        for s in self.images:
            for b in range(s.start // block_size, (s.end - 1) // block_size + 1):
                place = struct.pack("<qq", s.start - b * block_size, s.end - b * block_size)
                out.setdefault(b, []).append(s.image.digest + place)
        return out

    def extras_in(self, start: int, end: int) -> list[bytes]:
        """The same, for the tokens [start, end) (a partial block)."""
        return [s.image.digest + struct.pack("<qq", s.start - start, s.end - start)
                for s in self.images if s.start < end and s.end > start]


def has_image_parts(prompt) -> bool:
    if isinstance(prompt, (str, bytes)) or not prompt or not isinstance(prompt[0], dict):
        return False
    return any(p.get("type") == "image" for p in _parts(prompt))


def _parts(prompt) -> list[dict]:
    if all("role" in m for m in prompt):
        return [p for m in prompt if not isinstance(m.get("content"), str)
                for p in (m.get("content") or ())]
    return list(prompt)


def render_prompt(tokenizer, prompt, images: Sequence | None, placeholder_id: int,
                  image_tokens: Callable[[ImageInput], tuple[tuple[int, int, int], int]],
                  image_token_id: int | None = None,
                  wrap: tuple[Sequence[int], Sequence[int]] = ((), ())) -> VisionPrompt:
    """Tokens and image spans for `prompt`. Each `placeholder_id` (one per image, as the chat
    template renders it) becomes wrap[0], then `image_tokens(image)` = (grid, n) gives n copies
    of `image_token_id` (default: the placeholder itself), then wrap[1]."""
    extra = [ImageInput.of(i) for i in images or ()]
    if isinstance(prompt, str) and extra:  # text plus images: one user turn, images first
        parts = [{"type": "image"} for _ in extra] + [{"type": "text", "text": prompt}]
        prompt = [{"role": "user", "content": parts}]
    if isinstance(prompt, str):
        ids, found = encode_text(tokenizer, prompt), []  # plain text: with the BOS
    elif prompt and all(isinstance(m, dict) for m in prompt):
        messages = prompt if all("role" in m for m in prompt) else [
            {"role": "user", "content": list(prompt)}]
        messages, found = _take_images(messages, extra)
        ids = list(tokenizer.apply_chat_template(messages, tokenize=True,
                                                 add_generation_prompt=True))
    else:  # token ids with one placeholder per image
        ids, found = [int(t) for t in prompt], extra
    if not ids:
        raise GenerationError("The prompt is empty; give at least one token of text.")
    image_token_id = placeholder_id if image_token_id is None else image_token_id
    n_slots = ids.count(placeholder_id)
    if n_slots != len(found):
        raise GenerationError(
            f"The prompt has {n_slots} image placeholder(s) but {len(found)} image(s) were "
            "given; give one image per image part.")
    tokens, slots = [], []
    for t in ids:
        if t != placeholder_id:
            tokens.append(t)
            continue
        image = found[len(slots)]
        grid, n = image_tokens(image)
        tokens.extend(wrap[0])
        slots.append(ImageSlot(image, grid, len(tokens), len(tokens) + n))
        tokens.extend([image_token_id] * n)
        tokens.extend(wrap[1])
    return VisionPrompt(tokens, slots)


def _take_images(messages: list[dict], queue: list[ImageInput]) -> tuple[list[dict], list]:
    """Copy of `messages` with bare image parts (payloads gone), and the images in order;
    parts without a payload take the next image of `queue`."""
    out, found, queue = [], [], list(queue)
    for m in messages:
        content = m.get("content")
        if isinstance(content, str) or content is None:
            out.append(m)
            continue
        parts = []
        for p in content:
            if p.get("type") == "image":
                if p.get("image") is not None:
                    found.append(ImageInput.of(p["image"]))
                elif queue:
                    found.append(queue.pop(0))
                else:
                    raise GenerationError(
                        "An image part has no image; put it in the part's 'image' field or "
                        "pass it in images=[...].")
                parts.append({"type": "image"})
            else:
                parts.append(p)
        out.append(dict(m, content=parts))
    if queue:
        raise GenerationError(
            f"{len(queue)} image(s) in images=[...] have no image part to go to; add a "
            "{'type': 'image'} part for each.")
    return out, found
