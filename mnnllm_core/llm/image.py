"""Images for vision-language prompts: decoded with Pillow (a path, bytes or a PIL image) or
taken as a numpy array, as RGB float32 [H, W, 3] in 0..255; and MNN's CV::resize with
INTER_LINEAR (pixel centres aligned, edges clamped) followed by its (x - mean) * norm."""
from __future__ import annotations

import io
import os
from typing import Any, Sequence

import numpy as np

from ..errors import FormatError, UnsupportedError

ImageSource = str | os.PathLike | bytes | np.ndarray | Any  # Any: a PIL.Image.Image
MAX_PIXELS = 1 << 26  # larger images are refused before they are decoded (Pillow's bomb check is 89M)


def load_image(source: ImageSource) -> np.ndarray:
    """RGB float32 [H, W, 3] in 0..255. A numpy array is [H, W, 3] (RGB) or [H, W] (gray)."""
    if isinstance(source, np.ndarray):
        return _from_array(source)
    try:
        from PIL import Image
    except ImportError:
        raise UnsupportedError("images need Pillow: pip install 'mnnllm[vision]'", field="image") from None
    if isinstance(source, Image.Image):
        return _from_pil(source, "image")
    name = "image bytes" if isinstance(source, bytes) else str(source)
    if not isinstance(source, bytes) and not os.path.isfile(name):
        raise FormatError(f"the image does not exist: {name}", file=name, field="image")
    try:
        with Image.open(io.BytesIO(source) if isinstance(source, bytes) else name) as image:
            if image.width * image.height > MAX_PIXELS:
                raise FormatError(f"image of {image.width}x{image.height} pixels is larger than {MAX_PIXELS}",
                                  file=name, field="image")
            return _from_pil(image, name)
    except (OSError, ValueError, Image.DecompressionBombError) as err:
        raise FormatError(f"cannot decode the image: {err}", file=name, field="image") from None


def _from_pil(image, name: str) -> np.ndarray:
    image.load()
    return np.asarray(image.convert("RGB"), dtype=np.float32)


def _from_array(array: np.ndarray) -> np.ndarray:
    if array.ndim == 2:
        array = np.repeat(array[:, :, None], 3, axis=2)
    if array.ndim != 3 or array.shape[2] not in (3, 4) or 0 in array.shape:
        raise FormatError(f"an image array must be [H, W, 3] RGB (or [H, W] gray), got shape {list(array.shape)}",
                          field="image")
    if array.shape[0] * array.shape[1] > MAX_PIXELS:
        raise FormatError(f"image of {array.shape[1]}x{array.shape[0]} pixels is larger than {MAX_PIXELS}",
                          field="image")
    return np.ascontiguousarray(array[:, :, :3], dtype=np.float32)


def _axis_taps(src: int, dst: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Source index pairs and weights of a linear resize along one axis (pixel centres aligned)."""
    position = (np.arange(dst, dtype=np.float64) + 0.5) * (src / dst) - 0.5
    position = np.clip(position, 0, src - 1)
    low = np.floor(position).astype(np.int64)
    high = np.minimum(low + 1, src - 1)
    return low, high, (position - low).astype(np.float32)


def resize_normalize(image: np.ndarray, height: int, width: int, mean: Sequence[float],
                     norm: Sequence[float]) -> np.ndarray:
    """MNN's CV::resize(image, {width, height}, INTER_LINEAR, mean, norm): [3, height, width] float32."""
    if height < 1 or width < 1:
        raise UnsupportedError(f"cannot resize an image to {height}x{width}", field="image_size")
    rows = _axis_taps(image.shape[0], height)
    cols = _axis_taps(image.shape[1], width)
    if (height, width) == image.shape[:2]:
        resized = image
    else:
        top = image[rows[0]] * (1 - rows[2])[:, None, None] + image[rows[1]] * rows[2][:, None, None]
        resized = top[:, cols[0]] * (1 - cols[2])[None, :, None] + top[:, cols[1]] * cols[2][None, :, None]
    mean = np.asarray(mean, np.float32).reshape(1, 1, -1)
    norm = np.asarray(norm, np.float32).reshape(1, 1, -1)
    return np.ascontiguousarray(((resized - mean) * norm).transpose(2, 0, 1), dtype=np.float32)
