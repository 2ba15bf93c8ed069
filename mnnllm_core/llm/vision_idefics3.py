"""MNN's smolvlmVisionProcess for Idefics3 / SmolVLM encoders (one input, `pixel_values`
[n, 3, unit, unit]; the pixel shuffle is inside the graph). The whole image resized to
image_size_unit is the global image. An image taller or wider than the unit (the <hw> tag's
size, else image_size) is also resized to multiples of the unit (rounded, at most
image_max_size) and cut into unit-sized tiles, row by row. Prompt ids, as MNN writes them: per
tile vision_start, the first id of the text `<row_R_col_C>` and one image_pad per image token,
a newline id after each row of tiles and one more after the last; then the global image:
vision_start, global_image, its image_pads, vision_end. Embedding rows: the tiles', then the
global image's."""
from __future__ import annotations

import numpy as np

from ..errors import ConfigError, UnsupportedError
from .image import ImageSource, load_image, resize_normalize
from .vision import VisionEncoder, VisionOutput, round_half_up, token_id


def tiles(pixels: np.ndarray, unit: int) -> np.ndarray:
    """[3, H, W] (multiples of unit) -> [rows * cols, 3, unit, unit], row-major."""
    channels, height, width = pixels.shape
    grid = pixels.reshape(channels, height // unit, unit, width // unit, unit)
    return np.ascontiguousarray(grid.transpose(1, 3, 0, 2, 4).reshape(-1, channels, unit, unit))


class Idefics3VisionEncoder(VisionEncoder):
    def __init__(self, config, module, tokenizer):
        super().__init__(config, module, tokenizer)
        self.unit = self._size("image_size_unit", 14)
        self.max_size = self.max_side  # tiles past it are clamped to it, as MNN does
        if self.max_size < self.unit:
            raise ConfigError(f"image_max_size {self.max_size} is below image_size_unit {self.unit}",
                              file=config.origin("image_max_size") or config.source, field="image_max_size")
        self.start, self.pad, self.end, self.global_image = (
            token_id(config, key) for key in ("vision_start", "image_pad", "vision_end", "global_image"))
        self.newline = self._first_id("\n")

    def _size(self, key: str, default: int) -> int:
        value = self.config.get(key, default)
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise ConfigError(f"{key} must be a positive integer, got {value!r}",
                              file=self.config.origin(key) or self.config.source, field=key)
        return value

    def _first_id(self, text: str) -> int:
        ids = self.tokenizer.encode(text)
        if not ids:
            raise UnsupportedError(f"the tokenizer encodes {text!r} to no ids", file=self.config.tokenizer_file,
                                   field="tokenizer")
        return ids[0]

    def tile_size(self, height: int | None, width: int | None) -> tuple[int, int] | None:
        """The size the image is cut into tiles at, or None when the global image alone stands for it."""
        height = self.image_size if height is None else int(height)
        width = self.image_size if width is None else int(width)
        if height <= self.unit and width <= self.unit:
            return None
        size = []
        for value, name in ((height, "height"), (width, "width")):
            rounded = min(round_half_up(value / self.unit) * self.unit, self.max_size)
            if rounded < self.unit:
                raise UnsupportedError(f"an image {name} of {value} rounds to no row of {self.unit}-pixel tiles: at "
                                       f"least {(self.unit + 1) // 2} needed when the image is tiled", field="hw")
            size.append(rounded)
        return size[0], size[1]

    def target_size(self, height: int | None, width: int | None) -> tuple[int, int]:
        return self.tile_size(height, width) or (self.unit, self.unit)

    def pixel_values(self, image: ImageSource, height: int | None = None,
                     width: int | None = None) -> tuple[np.ndarray, np.ndarray | None]:
        """The global image [1, 3, unit, unit] and the tiles [n, 3, unit, unit] (None without tiling)."""
        rgb = load_image(image)
        whole = resize_normalize(rgb, self.unit, self.unit, self.mean, self.norm)[None]
        size = self.tile_size(height, width)
        if size is None:
            return whole, None
        return whole, tiles(resize_normalize(rgb, *size, self.mean, self.norm), self.unit)

    def _encode(self, image: ImageSource, height: int | None, width: int | None) -> VisionOutput:
        whole, parts = self.pixel_values(image, height, width)
        global_rows = self._rows(self.module.forward({"pixel_values": whole})[0], 1, "image_embeds")[0]
        count = len(global_rows)
        ids: list[int] = []
        rows = [global_rows]
        size = self.target_size(height, width)
        if parts is not None:
            grid_h, grid_w = size[0] // self.unit, size[1] // self.unit
            self.check_tokens((grid_h * grid_w + 1) * (count + 2) + grid_h + 1, size[0], size[1])
            tile_rows = self._rows(self.module.forward({"pixel_values": parts})[0], len(parts), "image_embeds")
            rows = list(tile_rows) + rows
            for r in range(grid_h):
                for c in range(grid_w):
                    ids += [self.start, self._first_id(f"<row_{r + 1}_col_{c + 1}>")] + [self.pad] * count
                ids.append(self.newline)
            ids.append(self.newline)
        ids += [self.start, self.global_image] + [self.pad] * count + [self.end]
        return VisionOutput(ids, np.concatenate(rows), size)
