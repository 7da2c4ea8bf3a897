"""The one image loader (``mmspec.vision.load_image``) gives the pixels a user sees and the processor would use.

A new user's cases: a transparent page (RGBA, LA, P with a transparent colour) turned all black, a JPEG
with an EXIF rotation came out sideways, a 16-bit grayscale PNG clipped to white. The reference for
transparency is transformers' own ``convert_to_rgb`` (what the image processors apply), composited on white.
"""

from __future__ import annotations

import io

import numpy as np
import pytest
from PIL import Image

from mmspec.vision import load_image


def _page(mode: str) -> Image.Image:
    """Black text on a transparent page, in ``mode``: the page pixels are black *and* fully transparent."""
    rgba = np.zeros((8, 12, 4), np.uint8)
    rgba[2:4, 3:9, 3] = 255  # opaque black "text"
    rgba[5, 3:9, 3] = 128    # half-transparent black: composited to mid grey
    img = Image.fromarray(rgba, "RGBA")
    if mode == "LA":
        return img.convert("LA")
    if mode == "P":
        # A palette image whose index 0 (black) is the transparent colour, as GIFs and PNG-8 store it.
        pal = Image.new("P", (12, 8), 0)
        pal.putpalette([0, 0, 0, 0, 0, 0] + [0] * 762)
        pal.paste(1, (3, 2, 9, 4))
        pal.info["transparency"] = 0
        return pal
    return img


@pytest.mark.parametrize("mode", ["RGBA", "LA", "P"])
def test_transparency_composited_on_white_as_the_processor_does(mode):
    from transformers.image_transforms import convert_to_rgb

    img = _page(mode)
    got = np.asarray(load_image(img))
    assert got[0, 0].tolist() == [255, 255, 255]  # the transparent page is white, not black
    assert got[2, 3].tolist() == [0, 0, 0]        # the text stays black
    assert np.array_equal(got, convert_to_rgb(img, return_numpy=True))


@pytest.mark.parametrize("source", ["file", "bytes"])
def test_transparent_png_file_and_bytes(tmp_path, source):
    buf = io.BytesIO()
    _page("RGBA").save(buf, format="PNG")
    path = tmp_path / "page.png"
    path.write_bytes(buf.getvalue())
    got = np.asarray(load_image(path if source == "file" else buf.getvalue()))
    assert got[0, 0].tolist() == [255, 255, 255] and got[2, 3].tolist() == [0, 0, 0]


def test_rgba_array_composited_on_white():
    from transformers.image_transforms import convert_to_rgb

    arr = np.asarray(_page("RGBA"))
    got = np.asarray(load_image(arr)).astype(int)
    assert got[0, 0].tolist() == [255, 255, 255]
    assert np.abs(got - convert_to_rgb(arr, return_numpy=True).astype(int)).max() <= 1


def test_exif_orientation_applied(tmp_path):
    # 20 wide, 10 high, left half red; EXIF orientation 6 means "rotate 90 degrees clockwise to view".
    arr = np.zeros((10, 20, 3), np.uint8)
    arr[:, :10] = (255, 0, 0)
    exif = Image.Exif()
    exif[0x0112] = 6
    path = tmp_path / "rotated.jpg"
    Image.fromarray(arr).save(path, exif=exif, quality=95)
    img = load_image(path)
    assert img.size == (10, 20)  # shown upright: 10 wide, 20 high
    top = np.asarray(img)[2, 5].astype(int)
    assert top[0] > 200 and top[1] < 60  # the red half is on top after the clockwise turn
    assert load_image(path.read_bytes()).size == (10, 20)


def test_16_bit_grayscale_scaled_to_8_bits(tmp_path):
    ramp = (np.arange(16, dtype=np.uint16).reshape(4, 4) * 4369)  # 0 .. 65535
    path = tmp_path / "gray16.png"
    Image.fromarray(ramp).save(path)
    assert Image.open(path).mode.startswith("I")  # Pillow reads it as a 16-bit integer image
    got = np.asarray(load_image(path))[..., 0]
    want = np.rint(ramp / 257.0).astype(np.uint8)
    assert np.array_equal(got, want)  # mid greys stay grey (clipping made everything above 255 white)
    assert np.array_equal(np.asarray(load_image(ramp))[..., 0], want)  # a uint16 array the same way
