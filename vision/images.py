"""Image loading: one function that turns what users hold into an RGB PIL image, or says clearly why not.

Why: processors accept many image types but fail late and obscurely on bad ones (a missing file, a
truncated PNG, a zero-width picture, an empty array), often after the model has been loaded or a batch
has started. Pipelines call :func:`load_image` on every input first, so bad inputs raise
:class:`mmspec.InvalidImageError` before any model work.

Example:
    >>> import numpy as np
    >>> load_image(np.zeros((4, 6, 3), dtype=np.uint8)).size
    (6, 4)
    >>> load_image(np.zeros((0, 6, 3)))
    Traceback (most recent call last):
    ...
    mmspec.errors.InvalidImageError: empty image array (shape (0, 6, 3))
"""

from __future__ import annotations

import contextlib

import io
import os
from pathlib import Path

import numpy as np
from PIL import Image, ImageOps, UnidentifiedImageError

from mmspec.errors import InvalidImageError

__all__ = ["load_image", "load_images", "probe_image", "max_image_pixels", "MAX_IMAGE_PIXELS_DEFAULT"]

MAX_IMAGE_PIXELS_DEFAULT = 50_000_000
"""Images with more pixels than this (about 7000 x 7000) are refused before their pixels are decoded: no
processor mmspec drives uses that many, and Pillow would spend seconds and gigabytes on them (a 12000 x 12000
scan took 23 s behind Pillow's decompression-bomb warning). ``MMSPEC_MAX_IMAGE_PIXELS`` changes the limit."""


def max_image_pixels() -> int:
    """The pixel limit: ``$MMSPEC_MAX_IMAGE_PIXELS`` if set (a positive integer), else
    :data:`MAX_IMAGE_PIXELS_DEFAULT`.

    Example:
        >>> max_image_pixels() >= 1
        True
    """
    raw = os.environ.get("MMSPEC_MAX_IMAGE_PIXELS", "")
    try:
        value = int(raw) if raw else MAX_IMAGE_PIXELS_DEFAULT
    except ValueError:
        raise InvalidImageError(f"MMSPEC_MAX_IMAGE_PIXELS must be a positive integer (got {raw!r})") from None
    if value < 1:
        raise InvalidImageError(f"MMSPEC_MAX_IMAGE_PIXELS must be a positive integer (got {raw!r})")
    return value

_CHANNELS = (1, 3, 4)


def load_image(x) -> Image.Image:
    """Return ``x`` as an RGB ``PIL.Image``; raise :class:`mmspec.InvalidImageError` if it is not a usable image.

    Why: every pipeline validates its images up front with this one function, so users get one clear
    message (naming the file or the shape) instead of a processor traceback halfway through a job.

    Accepts:
        * a path (``str`` or ``pathlib.Path``) to an image file Pillow can read (``~`` expanded);
        * raw encoded bytes (``bytes`` / ``bytearray``);
        * a ``PIL.Image`` in any mode (converted to RGB as transformers' processors convert it: transparency
          (RGBA, LA, a palette's transparent colour) composited on white; 16-bit grey scaled to 8 bits);
        * a ``numpy`` array, ``HW`` (grey), ``HWC`` or ``CHW`` with 1, 3 or 4 channels (4: RGBA, composited
          on white); ``uint8`` as is, ``uint16`` scaled to 8 bits, floats in ``[0, 1]`` scaled by 255 (other
          floats and integers clipped to ``[0, 255]``);
        * a ``torch.Tensor``, same layouts (``CHW`` is tried first for tensors, ``HWC`` first for arrays).

    Files and bytes are shown upright: an EXIF orientation (phone photos) is applied. A PIL image is taken
    as the caller holds it (no EXIF turn), so the pipeline sees what the processor would.

    Raises:
        InvalidImageError: missing, unreadable or empty file; URL (nothing is downloaded); zero-size
            image; more pixels than :func:`max_image_pixels` (said from the file's header, before decoding);
            empty array; unsupported shape or type.

    Example:
        >>> from PIL import Image
        >>> load_image(Image.new("L", (3, 2))).mode
        'RGB'
    """
    if isinstance(x, Image.Image):
        return _to_rgb(_check_pil(x, "image"))
    if isinstance(x, (str, os.PathLike)):
        return _from_path(x)
    if isinstance(x, (bytes, bytearray, memoryview)):
        if len(x) == 0:
            raise InvalidImageError("empty image bytes")
        return _open(io.BytesIO(bytes(x)), "image bytes")
    if _is_tensor(x):
        arr = x.detach().cpu()
        if arr.dtype.is_floating_point and arr.dtype not in (_torch().float32, _torch().float64):
            arr = arr.float()
        return _from_array(arr.numpy(), channels_first=True)
    if isinstance(x, np.ndarray):
        return _from_array(x, channels_first=False)
    raise InvalidImageError(
        f"cannot use a {type(x).__name__} as an image; pass a file path, a PIL image, a numpy array or a torch tensor"
    )


def load_images(images) -> list[Image.Image]:
    """:func:`load_image` over a list (``None`` gives ``[]``, a single image gives a one-element list).

    Example:
        >>> import numpy as np
        >>> len(load_images([np.zeros((2, 2, 3), np.uint8)] * 2))
        2
    """
    if images is None:
        return []
    if isinstance(images, (list, tuple)):
        out = []
        for i, im in enumerate(images):
            try:
                out.append(load_image(im))
            except InvalidImageError as e:
                if len(images) == 1:
                    raise
                raise InvalidImageError(f"image {i}: {e}") from e
        return out
    return [load_image(images)]


def probe_image(path) -> tuple[int, int]:
    """``(width, height)`` of an image file, read from its header only: the checks of :func:`load_image` that need
    no pixels (missing, empty or unreadable file, not an image, zero size, over :func:`max_image_pixels`), cheap
    enough to run on a request before any model loads.

    Raises:
        InvalidImageError: as :func:`load_image`, for what the header shows.

    Example:
        >>> import os, tempfile
        >>> from PIL import Image
        >>> p = os.path.join(tempfile.mkdtemp(), "page.png"); Image.new("RGB", (40, 30)).save(p)
        >>> probe_image(p)
        (40, 30)
    """
    path = local_file(path, "image")
    what = f"image file {path}"
    if path.stat().st_size == 0:
        raise InvalidImageError(f"image file is empty (0 bytes): {path}")
    with _pil_errors(what), Image.open(path) as img:  # lazy: the header, not the pixels
        _check_pil(img, what)
        size = img.size
    return size  # as stored: EXIF orientations 5-8 swap the sides when load_image applies them


# ---------------------------------------------------------------------------- internals
def _torch():
    import torch

    return torch


def _is_tensor(x) -> bool:
    mod = type(x).__module__
    return mod.startswith("torch") and hasattr(x, "detach")


def _check_pil(img: Image.Image, what: str) -> Image.Image:
    w, h = img.size
    if w <= 0 or h <= 0:
        raise InvalidImageError(f"{what} has zero size ({w}x{h} pixels)")
    limit = max_image_pixels()
    if w * h > limit:
        raise InvalidImageError(f"{what} is {w}x{h} = {w * h:,} pixels, over mmspec's limit of {limit:,} "
                                "(MMSPEC_MAX_IMAGE_PIXELS raises it); downscale it first")
    return img


def local_file(p, what: str, error=InvalidImageError) -> Path:
    """``p`` (``str`` / bytes / ``os.PathLike``, ``~`` expanded) as the :class:`~pathlib.Path` of an existing local
    file, else ``error`` saying what is wrong (a URL: mmspec downloads nothing; no such file; a folder). ``what``
    names the kind of file in the message (``"image"``, ``"video"``).

    Example:
        >>> local_file("/no/such/page.png", "image")
        Traceback (most recent call last):
        ...
        mmspec.errors.InvalidImageError: image file not found: /no/such/page.png
    """
    s = os.fsdecode(os.fspath(p))
    if "://" in s and not os.path.exists(s):
        raise error(f"{s} looks like a URL; mmspec does not download {what}s, save it to a file first")
    path = Path(os.path.expanduser(s))
    if not path.exists():
        raise error(f"{what} file not found: {path}")
    if path.is_dir():
        raise error(f"{what} path is a folder, not a file: {path}")
    return path


def _from_path(p) -> Image.Image:
    path = local_file(p, "image")
    try:
        size = path.stat().st_size
    except OSError as e:
        raise InvalidImageError(f"cannot read image file {path}: {e}") from e
    if size == 0:
        raise InvalidImageError(f"image file is empty (0 bytes): {path}")
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError as e:
        raise InvalidImageError(f"cannot read image file {path}: {e}") from e
    return _open(io.BytesIO(data), f"image file {path}")


@contextlib.contextmanager
def _pil_errors(what: str):
    """Pillow's failures on a file as :class:`InvalidImageError` naming ``what`` (header probe and full open)."""
    try:
        yield
    except InvalidImageError:
        raise
    except UnidentifiedImageError as e:
        raise InvalidImageError(f"{what} is not an image Pillow can read") from e
    except Image.DecompressionBombError as e:
        raise InvalidImageError(f"{what} is refused by Pillow as a decompression bomb: {e}") from e
    except (OSError, ValueError, SyntaxError) as e:
        raise InvalidImageError(f"{what} is unreadable (truncated or corrupt?): {e}") from e


def _open(fp, what: str) -> Image.Image:
    with _pil_errors(what), Image.open(fp) as img:
        _check_pil(img, what)  # the size comes from the header: a huge scan is refused before decoding
        img.load()
        # A camera stores the sensor's pixels and says in EXIF how to turn them; viewers apply it.
        return _to_rgb(ImageOps.exif_transpose(img))


def _from_array(arr: np.ndarray, channels_first: bool) -> Image.Image:
    if arr.size == 0:
        raise InvalidImageError(f"empty image array (shape {tuple(arr.shape)})")
    if arr.ndim == 4 and arr.shape[0] == 1:
        arr = arr[0]
    if arr.ndim == 2:
        arr = arr[:, :, None]
    elif arr.ndim == 3:
        chw = arr.shape[0] in _CHANNELS
        hwc = arr.shape[-1] in _CHANNELS
        if (channels_first and chw) or (chw and not hwc):
            arr = np.moveaxis(arr, 0, -1)
        elif not hwc:
            raise InvalidImageError(
                f"cannot tell the channels of an image array of shape {tuple(arr.shape)}; use HW, HWC or CHW with "
                "1, 3 or 4 channels"
            )
    else:
        raise InvalidImageError(
            f"an image array must be HW, HWC or CHW (got {arr.ndim} dims, shape {tuple(arr.shape)})"
        )
    if arr.dtype == np.bool_:
        arr = arr.astype(np.uint8) * 255
    elif np.issubdtype(arr.dtype, np.floating):
        if not np.isfinite(arr).all():
            raise InvalidImageError("image array contains NaN or infinite values")
        if arr.min() >= 0.0 and arr.max() <= 1.0:
            arr = arr * 255.0
        arr = np.clip(np.rint(arr), 0, 255).astype(np.uint8)
    elif arr.dtype == np.uint16:  # 16-bit grey or colour: the same scale as a 16-bit PNG
        arr = np.rint(arr / 257.0).astype(np.uint8)
    elif np.issubdtype(arr.dtype, np.integer):
        if arr.dtype != np.uint8:
            arr = np.clip(arr, 0, 255).astype(np.uint8)
    else:
        raise InvalidImageError(f"unsupported image array dtype {arr.dtype}")
    arr = np.ascontiguousarray(arr)
    img = Image.fromarray(arr[:, :, 0] if arr.shape[-1] == 1 else arr)
    return _to_rgb(img)


_SIXTEEN_BIT = ("I;16", "I;16B", "I;16L", "I;16N")


def _to_rgb(img: Image.Image) -> Image.Image:
    """RGB as transformers' ``convert_to_rgb`` makes it (transparency composited on white: Pillow's own
    ``convert("RGB")`` drops alpha, so black text on a transparent page became an all-black picture), with
    16-bit grey scaled to 8 bits (Pillow clips it, so everything above 255 of 65535 became white)."""
    if img.mode in _SIXTEEN_BIT or img.mode == "I":
        values = np.asarray(img, dtype=np.float64)
        # "I" (32-bit) is how some Pillow versions read a 16-bit PNG; 8-bit data read as "I" stays as it is.
        if img.mode != "I" or values.max() > 255:
            values = values / 257.0
        return Image.fromarray(np.clip(np.rint(values), 0, 255).astype(np.uint8)).convert("RGB")
    if "A" in img.getbands() or img.info.get("transparency") is not None:
        rgba = img.convert("RGBA")
        white = Image.new("RGBA", rgba.size, (255, 255, 255, 255))
        return Image.alpha_composite(white, rgba).convert("RGB")
    return img.convert("RGB")
