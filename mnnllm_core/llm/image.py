"""Images for vision-language prompts: decoded with Pillow (a path, bytes or a PIL image) or
taken as a numpy array, as RGB [H, W, 3] in 0..255 (uint8 as decoded, else float32, never
copied to float whole); and MNN's CV::resize with INTER_LINEAR (pixel centres aligned, edges
clamped) followed by its (x - mean) * norm, which reads only the source pixels it samples.

An image is at most MAX_PIXELS (checked before it is decoded or copied), and an array's values
must be finite: NaN pixels would turn every image row into NaN and the answer into nothing."""
from __future__ import annotations

import io
import os
from typing import Any, Sequence

import numpy as np

from ..errors import FormatError, UnsupportedError

ImageSource = str | os.PathLike | bytes | np.ndarray | Any  # Any: a PIL.Image.Image
MAX_PIXELS = 1 << 26  # larger images are refused before they are decoded (Pillow's bomb check is 89M)
_FINITE_CHUNK = 1 << 20  # values of an array checked for finiteness at a time (no full-size mask)


def load_image(source: ImageSource) -> np.ndarray:
    """RGB [H, W, 3] in 0..255, uint8 or float32. A numpy array is [H, W, 3] (RGB, or RGBA) or
    [H, W] (gray)."""
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
            return _from_pil(image, name)
    except (OSError, ValueError, Image.DecompressionBombError) as err:
        raise FormatError(f"cannot decode the image: {err}", file=name, field="image") from None


def _check_pixels(height: int, width: int, name: str | None) -> None:
    if height * width > MAX_PIXELS:
        raise FormatError(f"an image of {width}x{height} pixels is larger than {MAX_PIXELS} pixels (MAX_PIXELS)",
                          file=name, field="image")


def _from_pil(image, name: str) -> np.ndarray:
    _check_pixels(image.height, image.width, name)
    image.load()
    return np.asarray(image.convert("RGB"))


def _from_array(array: np.ndarray) -> np.ndarray:
    if array.ndim not in (2, 3) or (array.ndim == 3 and array.shape[2] not in (3, 4)) or 0 in array.shape:
        raise FormatError(f"an image array must be [H, W, 3] RGB (or [H, W] gray), got shape {list(array.shape)}",
                          field="image")
    _check_pixels(array.shape[0], array.shape[1], None)
    if array.dtype.kind not in "biuf":
        raise FormatError(f"an image array holds numbers, not {array.dtype}", field="image")
    if array.dtype.kind == "f":
        _check_finite(array)
    rgb = np.repeat(array[:, :, None], 3, axis=2) if array.ndim == 2 else array[:, :, :3]
    return rgb if rgb.dtype in (np.uint8, np.float32) else rgb.astype(np.float32)


def _check_finite(array: np.ndarray) -> None:
    """Refuse NaN or infinite pixels, a chunk of rows at a time."""
    rows = max(1, _FINITE_CHUNK // max(1, array[0].size))
    for start in range(0, array.shape[0], rows):
        chunk = array[start:start + rows]
        if not np.isfinite(chunk).all():
            where = np.argwhere(~np.isfinite(chunk))[0]
            raise FormatError(f"the image array holds a non-finite value ({chunk[tuple(where)]}) at "
                              f"{[start + int(where[0]), *map(int, where[1:])]}", field="image")


def _axis_taps(src: int, dst: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Source index pairs and weights of a linear resize along one axis (pixel centres aligned)."""
    position = (np.arange(dst, dtype=np.float64) + 0.5) * (src / dst) - 0.5
    position = np.clip(position, 0, src - 1)
    low = np.floor(position).astype(np.int64)
    high = np.minimum(low + 1, src - 1)
    return low, high, (position - low).astype(np.float32)


def resize_normalize(image: np.ndarray, height: int, width: int, mean: Sequence[float],
                     norm: Sequence[float]) -> np.ndarray:
    """MNN's CV::resize(image, {width, height}, INTER_LINEAR, mean, norm): [3, height, width] float32.
    Rows are blended first, at the two source columns each output column samples: only
    [height, width] pixels are ever read or built, however large the source."""
    if height < 1 or width < 1:
        raise UnsupportedError(f"cannot resize an image to {height}x{width}", field="image_size")
    if (height, width) == image.shape[:2]:
        resized = image
    else:
        low_row, high_row, dy = _axis_taps(image.shape[0], height)
        low_col, high_col, dx = _axis_taps(image.shape[1], width)
        dy, dx = dy[:, None, None], dx[None, :, None]

        def rows_blended(column: np.ndarray) -> np.ndarray:
            return (image[low_row[:, None], column[None, :]] * (1 - dy)
                    + image[high_row[:, None], column[None, :]] * dy)

        resized = rows_blended(low_col) * (1 - dx) + rows_blended(high_col) * dx
    mean = np.asarray(mean, np.float32).reshape(1, 1, -1)
    norm = np.asarray(norm, np.float32).reshape(1, 1, -1)
    return np.ascontiguousarray(((resized - mean) * norm).transpose(2, 0, 1), dtype=np.float32)
