"""How many prompt tokens an image takes with a projector that sizes it (Qwen2-VL's), counted from its size alone.

Such a projector (ModelInfo.image_grid) takes an image at about its own size: llama.cpp rounds each side to a
multiple of ``align`` pixels (the patch size times the 2x2 patches merged into one token), then scales the
image, its aspect kept, into [min_pixels, max_pixels] (tools/mtmd/mtmd-image.cpp, calc_size_preserved_ratio).
Each ``align`` x ``align`` square becomes one token, so a 640 x 480 image takes more than a 64 x 48 one. The
frontend counts a prompt before the engine sees it (usage, the context check, Anthropic's count_tokens), so the
arithmetic is llama.cpp's, done in float32 as there; the engine checks it on made images of several sizes
against mtmd's own count when it loads the projector (engine_proc/vision/projector.py), and serves no projector it
disagrees with.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from cllm.core.protocol import ImageGrid, ImageInput, ModelInfo

if TYPE_CHECKING:
    import numpy as np


def _round(x: np.float32) -> int:
    """std::round of a positive float: half up (Python's round takes half to even); exact, as a float32 plus 0.5
    is a float64."""
    return math.floor(float(x) + 0.5)


def resized(grid: ImageGrid, width: int, height: int) -> tuple[int, int]:
    """The size llama.cpp resizes a width x height image to before its projector reads it."""
    import numpy as np  # here: the frontend imports this module at start-up, and numpy only for an image's size

    _F = np.float32
    a = grid.align
    w = max(a, _round(_F(width) / _F(a)) * a)
    h = max(a, _round(_F(height) / _F(a)) * a)
    if w * h > grid.max_pixels:
        beta = np.sqrt(_F(height) * _F(width) / _F(grid.max_pixels))
        h = max(a, math.floor(_F(height) / beta / _F(a)) * a)
        w = max(a, math.floor(_F(width) / beta / _F(a)) * a)
    elif w * h < grid.min_pixels:
        beta = np.sqrt(_F(grid.min_pixels) / (_F(height) * _F(width)))
        h = math.ceil(_F(height) * beta / _F(a)) * a
        w = math.ceil(_F(width) * beta / _F(a)) * a
    return w, h


def grid_tokens(grid: ImageGrid, width: int, height: int) -> int:
    """The embeddings (KV cells) of a width x height image: one per align x align square once resized."""
    w, h = resized(grid, width, height)
    return (w // grid.align) * (h // grid.align)


def image_tokens(info: ModelInfo, image: ImageInput) -> int:
    """The prompt tokens (KV cells) one image takes, its projector's text around it included, as llama-server
    counts them."""
    grid = info.image_grid
    return info.image_tokens + (grid_tokens(grid, image.width, image.height) if grid is not None else 0)


def prompt_images(info: ModelInfo, images: list[ImageInput] | None) -> int:
    """The prompt tokens a prompt's images take, all of them."""
    return sum(image_tokens(info, image) for image in images) if images else 0
