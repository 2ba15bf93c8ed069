"""MNN's multimodal prompts: `<img>PATH</img>` or `<img><hw>H,W</hw>PATH</img>` inside the text
(PATH may name an image passed beside the prompt, MNN's MultimodalPrompt), structured messages
with image parts, and the prompt plan they encode to: the ids with each image's placeholder
expanded, the image embeddings to write over the placeholders, and M-RoPE position ids."""
from __future__ import annotations

import hashlib
import operator
import re
from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

import numpy as np

from ..errors import ConfigError, shorten

IMG_TAG = re.compile(r"<img>(.*?)</img>", re.S)
HW_TAG = re.compile(r"<hw>(.*?)</hw>", re.S)


def parse_image_content(content: str) -> tuple[str, int | None, int | None]:
    """The image named inside <img>...</img>, and the height and width of a <hw>H,W</hw> tag."""
    match = HW_TAG.search(content)
    if match is None:
        return content.strip(), None, None
    try:
        height, width = (int(v) for v in match.group(1).split(","))
    except ValueError:
        raise ConfigError(f"<hw> must hold two integers, 'H,W', got {match.group(1)!r}", field="hw") from None
    if height < 1 or width < 1:
        raise ConfigError(f"<hw> sizes must be positive, got {height},{width}", field="hw")
    return (content[:match.start()] + content[match.end():]).strip(), height, width


def image_tag(name: str, height: int | None = None, width: int | None = None) -> str:
    if height is None or width is None:
        return f"<img>{name}</img>"
    sizes = []
    for value, key in ((height, "height"), (width, "width")):
        try:
            sizes.append(operator.index(value))
        except TypeError:
            raise ConfigError(f"an image part's {key} must be an integer, got {shorten(repr(value))}",
                              field=key) from None
    return f"<img><hw>{sizes[0]},{sizes[1]}</hw>{name}</img>"


def inline_image_parts(messages: Sequence[Any]) -> tuple[list[Any], dict[str, Any]]:
    """Messages whose content is a list of parts ({"type": "text", "text"} and {"type": "image",
    "image": path | array | PIL image, optional "height"/"width"}) as text with <img> tags, and
    the in-memory images the tags name."""
    images: dict[str, Any] = {}
    out = []
    for message in messages:
        content = message.get("content") if isinstance(message, dict) else None
        if not isinstance(content, list):
            out.append(message)
            continue
        pieces = []
        for part in content:
            if not isinstance(part, dict):
                raise ConfigError(f"a content part must be an object, got {part!r}", field="content")
            if "image" in part or part.get("type") == "image":
                source = part.get("image")
                if source is None:
                    raise ConfigError("an image part needs its image (a path or an array)", field="image")
                name = source if isinstance(source, str) else f"image_{len(images)}"
                images[name] = source
                pieces.append(image_tag(name, part.get("height"), part.get("width")))
            elif "text" in part:
                pieces.append(str(part["text"]))
            else:
                raise ConfigError(f"a content part is text or image, got {sorted(part)}", field="content")
        out.append({**message, "content": "".join(pieces)})
    return out, images


class MropePositions:
    """MNN's MropeInfo: temporal, height and width positions per token. Text continues one
    after the last width position; an image is its vision_start, the grid offsets, and its
    vision_end one after the last width position."""

    def __init__(self):
        self.rows: list[list[int]] = [[], [], []]

    def current(self) -> int:
        return self.rows[2][-1] + 1 if self.rows[2] else 0

    def add_text(self, count: int) -> None:
        start = self.current()
        for row in self.rows:
            row.extend(range(start, start + count))

    def add_image(self, grid: tuple[int, int, int]) -> None:
        start = self.current()
        self.add_text(1)  # vision_start
        t, h, w = np.meshgrid(np.arange(grid[0]), np.arange(grid[1]), np.arange(grid[2]), indexing="ij")
        for row, offsets in zip(self.rows, (t, h, w)):
            row.extend((start + 1 + offsets.reshape(-1)).tolist())
        self.add_text(1)  # vision_end

    def array(self) -> np.ndarray:
        return np.asarray(self.rows, np.int32).reshape(3, -1)


@dataclass
class ImageRows:
    """One image in a prompt: the prompt indices of its image_pad ids, the embedding rows written
    over them, and its deepstack rows [layers, rows, hidden] (Qwen3-VL) or None."""

    where: np.ndarray
    embeds: np.ndarray
    deepstack: np.ndarray | None = None


@dataclass
class PromptPlan:
    """A prompt's ids, where image rows go (`image_index`: row of `image_embeds` or -1), the
    image rows' deepstack features [layers, rows, hidden] (or None), the M-RoPE positions [3, n],
    and one key per token for reusing the KV cache."""

    ids: list[int]
    positions: np.ndarray
    image_index: np.ndarray
    image_embeds: np.ndarray | None
    deepstack: np.ndarray | None = None
    keys: list[tuple] = field(default_factory=list)

    @classmethod
    def text(cls, ids: Sequence[int]) -> "PromptPlan":
        positions = MropePositions()
        positions.add_text(len(ids))
        return cls.build(list(ids), positions, [])

    @classmethod
    def build(cls, ids: list[int], positions: MropePositions, images: list[ImageRows]) -> "PromptPlan":
        index = np.full(len(ids), -1, np.int64)
        digests: list[str | None] = [None] * len(ids)
        row = 0
        for image in images:
            index[image.where] = np.arange(row, row + len(image.embeds))
            digest = hashlib.sha1(np.ascontiguousarray(image.embeds).tobytes()).hexdigest()
            for i in image.where.tolist():
                digests[i] = digest
            row += len(image.embeds)
        table = np.concatenate([image.embeds for image in images]).astype(np.float32) if images else None
        stacks = [image.deepstack for image in images if image.deepstack is not None]
        deepstack = np.concatenate(stacks, axis=1) if stacks and len(stacks) == len(images) else None
        pos = positions.array()
        keys = [(t, int(pos[0, i]), int(pos[1, i]), int(pos[2, i]), digests[i]) for i, t in enumerate(ids)]
        return cls(ids, pos, index, table, deepstack, keys)


def decode_key(token: int, position: int) -> tuple:
    """The key of a generated token: MNN gives decode steps the token count as every position."""
    return (token, position, position, position, None)


def named_image(images: Mapping[str, Any], name: str) -> Any:
    """An image passed beside the prompt under `name`, else `name` itself (a path)."""
    return images.get(name, name)
