"""Displays from Python: the envelope's `displays`, its inline `images`, and tool-result content with
image blocks, so an agent loop shows the model what the code drew."""

from __future__ import annotations

import asyncio
import base64
import json
import struct
import zlib

import pytest

from runpython import RunPython

# A PNG the code makes itself (no plotting library needed): 3x2 pixels, red.
PNG_CODE = """
import struct, zlib
def chunk(kind, data):
    return struct.pack('>I', len(data)) + kind + data + struct.pack('>I', zlib.crc32(kind + data))
rows = b''.join(b'\\x00' + b'\\xff\\x00\\x00' * 3 for _ in range(2))
png = (b'\\x89PNG\\r\\n\\x1a\\n' + chunk(b'IHDR', struct.pack('>IIBBBBB', 3, 2, 8, 2, 0, 0, 0))
       + chunk(b'IDAT', zlib.compress(rows)) + chunk(b'IEND', b''))
class Picture:
    def _repr_png_(self):
        return png
display(Picture())
'done'
"""


@pytest.fixture(scope="module")
def rp() -> RunPython:
    return RunPython(timeout=20)


def _png_size(data: bytes) -> tuple[int, int]:
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    width, height = struct.unpack(">II", data[16:24])
    return width, height


def test_an_image_display_comes_inline_beside_its_artifact(rp: RunPython) -> None:
    e = rp.run(PNG_CODE)
    assert e.ok, e.error
    assert e.return_value == "done"
    [shown] = e.displays
    png = shown["formats"]["image/png"]
    assert (png["width"], png["height"]) == (3, 2)
    [image] = e.images
    assert image["display"] == 0 and image["mime"] == "image/png"
    data = base64.b64decode(image["data"])
    assert _png_size(data) == (3, 2) and zlib.crc32(data) != 0
    # The JSON envelope links the image; the inline bytes are never part of it.
    assert "images" not in e.to_dict() and image["data"] not in e.to_json()


def test_a_run_without_displays_has_no_images(rp: RunPython) -> None:
    e = rp.run("1 + 1")
    assert e.images == [] and e.displays == []
    assert "displays" not in e.to_dict()


@pytest.mark.parametrize("fmt", ["anthropic", "openai", "mcp"])
def test_tool_call_content_carries_image_blocks(rp: RunPython, fmt: str) -> None:
    content = rp.handle_tool_call_content("run_python", {"code": PNG_CODE}, format=fmt)
    text, image = content
    assert json.loads(text["text"])["return_value"] == "done"
    if fmt == "anthropic":
        assert text["type"] == "text" and image["type"] == "image"
        assert image["source"]["media_type"] == "image/png"
        data = base64.b64decode(image["source"]["data"])
    elif fmt == "openai":
        assert text["type"] == "input_text" and image["type"] == "input_image"
        prefix = "data:image/png;base64,"
        assert image["image_url"].startswith(prefix)
        data = base64.b64decode(image["image_url"][len(prefix):])
    else:
        assert text["type"] == "text" and image["type"] == "image" and image["mimeType"] == "image/png"
        data = base64.b64decode(image["data"])
    assert _png_size(data) == (3, 2)


def test_tool_call_content_of_a_run_without_images_is_its_text(rp: RunPython) -> None:
    [text] = rp.handle_tool_call_content("run_python", {"code": "6 * 7"})
    assert json.loads(text["text"])["return_value"] == 42


def test_the_async_form_gives_the_same_blocks(rp: RunPython) -> None:
    content = asyncio.run(rp.ahandle_tool_call_content("run_python", {"code": PNG_CODE}, format="anthropic"))
    assert [block["type"] for block in content] == ["text", "image"]


def test_an_unknown_format_is_refused(rp: RunPython) -> None:
    with pytest.raises(Exception, match="unknown tool format"):
        rp.handle_tool_call_content("run_python", {"code": "1"}, format="gemini")


def test_a_matplotlib_chart_comes_as_data_and_as_an_image(rp: RunPython) -> None:
    # matplotlib comes from the index through runpython's own dependency path (detected from the import).
    slow = RunPython(timeout=300)
    e = slow.run(
        "import matplotlib.pyplot as plt\n"
        "plt.figure(figsize=(3, 2), dpi=100)\n"
        "plt.plot([1, 2, 3], [4, 1, 9], label='rain'); plt.title('Rain'); plt.xlabel('day'); plt.ylabel('mm')\n"
        "plt.show()\n"
    )
    assert e.ok, e.error
    [shown] = e.displays
    chart = shown["chart"]
    assert (chart["type"], chart["title"], chart["x_label"], chart["y_label"]) == ("line", "Rain", "day", "mm")
    assert chart["elements"][0]["points"] == [[1, 4], [2, 1], [3, 9]]
    [image] = e.images
    assert _png_size(base64.b64decode(image["data"])) == (300, 200)
