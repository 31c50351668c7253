"""The one image check: an image a prompt sends is validated before anything is launched.

`dspark run IMAGE` and every image of a bench/tune prompt file go through ``load_image``: the file
exists and is a file, is not too large, decodes completely (a truncated or corrupt file fails here,
in one line, not inside llama-server mid-run) and is a format llama.cpp's mtmd reads.
"""

from __future__ import annotations

import io
import warnings
from dataclasses import dataclass
from pathlib import Path

from dsparkcli.errors import UsageError
from dsparkcli.llama import protocol

IMAGE_FORMATS = {
    "PNG": "image/png",
    "JPEG": "image/jpeg",
    "WEBP": "image/webp",
    "BMP": "image/bmp",
    "GIF": "image/gif",
}
IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".webp", ".bmp", ".gif")
MAX_IMAGE_BYTES = 32 * 1024 * 1024
MAX_IMAGE_PIXELS = 8192 * 8192


@dataclass(frozen=True)
class ImageInput:
    path: Path
    format: str
    width: int
    height: int
    data_url: str


def names_an_image(text: str) -> bool:
    """Whether an argument reads as an image's file name, not a prompt: an image suffix, and a file there or
    no space in it. `dspark run` takes its last argument as the prompt; a forgotten or misplaced prompt
    would otherwise send the file's name as the question and no image (issue 40)."""
    if not text.lower().endswith(IMAGE_SUFFIXES):
        return False
    return Path(text).is_file() or not any(c.isspace() for c in text)


def load_image(path: Path | str) -> ImageInput:
    """Validate an image: exists, size, decodes, supported format. UsageError (one line) otherwise."""
    from PIL import Image, UnidentifiedImageError  # deferred: only commands with images pay for Pillow

    path = Path(path)
    if path.is_dir():
        raise UsageError(f"image is a directory, not a file: {path}")
    if not path.is_file():
        raise UsageError(f"image not found: {path}")
    size = path.stat().st_size
    if size > MAX_IMAGE_BYTES:
        raise UsageError(f"image too large: {path} is {size / 2**20:.1f} MiB (limit {MAX_IMAGE_BYTES // 2**20} MiB)")
    raw = path.read_bytes()
    try:
        # Pillow warns (two lines on stderr) above its own pixel limit; ours is lower and says it in one line
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", Image.DecompressionBombWarning)
            img = Image.open(io.BytesIO(raw))
        with img:
            fmt = img.format or ""
            width, height = img.size
            if width * height > MAX_IMAGE_PIXELS:
                raise UsageError(f"image too large: {path} is {width}x{height} pixels")
            img.load()  # decode fully: a truncated file fails here, not inside llama-server
    except (UnidentifiedImageError, OSError, Image.DecompressionBombError, SyntaxError, ValueError) as e:
        raise UsageError(f"not a readable image: {path} ({e.__class__.__name__})") from e
    if fmt not in IMAGE_FORMATS:
        raise UsageError(f"unsupported image format {fmt or 'unknown'}: {path} (use PNG, JPEG, WEBP, BMP or GIF)")
    return ImageInput(
        path=path, format=fmt, width=width, height=height, data_url=protocol.image_data_url(IMAGE_FORMATS[fmt], raw)
    )
