"""frontend_proc.chat.images: an image part from a door's wire value, its marker in the content, the prompt split at it.

The tokenizer here is a stand-in (one id per character, 1 for BOS): the split is about where the pieces go, and
tests/test_vision_doors.py counts the real model's tokens against llama-server's.
"""

from __future__ import annotations

import base64

import pytest

from cllm.core.errors import ApiError
from cllm.core.protocol import ImageInput
from frontend_proc.chat.images import Image, checked, from_base64, from_url, joined, new_marker, split
from perf import image_files

PNG = image_files.png(image_files.picture(16, 16))


def test_a_data_uri_and_base64_give_the_bytes_whitespace_allowed():
    encoded = base64.b64encode(PNG).decode()
    assert from_url(f"data:image/png;base64,{encoded}", "p") == Image("p", PNG)
    assert from_url(f"DATA:IMAGE/JPEG;charset=x;BASE64,{encoded}".replace("DATA", "data"), "p").data == PNG
    wrapped = "\n".join(encoded[i : i + 76] for i in range(0, len(encoded), 76))
    assert from_base64(wrapped, "p").data == PNG
    assert from_base64(encoded, "p", "image/webp").data == PNG  # the format is sniffed from the bytes later


@pytest.mark.parametrize(
    "value, media_type, words",
    [
        (1, "image/png", "base64 string"),
        ("AAAA", "text/plain", "not an image type"),
        ("AAAA", None, "not an image type"),
    ],
)
def test_base64_fields_are_strings_of_an_image_type(value, media_type, words):
    with pytest.raises(ApiError) as e:
        from_base64(value, "p", media_type)
    assert words in e.value.message


@pytest.mark.parametrize(
    "url, words",
    [
        ("data:image/png;base64,abc!", "not valid base64"),
        ("data:image/png;base64,abcde", "not valid base64"),  # bad padding
        ("data:application/pdf;base64,AAAA", "'application/pdf' is not an image type"),
        ("data:;base64,AAAA", "'missing' is not an image type"),
        ("data:image/png,AAAA", "must be base64"),
        ("/tmp/cat.png", "data URI"),
    ],
)
def test_malformed_wire_values_are_400s_naming_the_field(url, words):
    with pytest.raises(ApiError) as e:
        from_url(url, "messages[0].content[1]")
    assert e.value.status == 400 and words in e.value.message and e.value.param == "messages[0].content[1]"


def test_an_http_url_is_left_for_the_chat_layer_to_fetch():
    assert from_url("https://example.com/a.png", "p") == Image("p", url="https://example.com/a.png")


def test_checked_names_the_problem():
    assert checked(Image("p", PNG)) == PNG
    with pytest.raises(ApiError) as e:
        checked(Image("p", b"text"))
    assert "not an image" in e.value.message and e.value.param == "p"


def test_parts_are_joined_as_llama_server_joins_them():
    m = "<M>"
    img = Image("p", PNG)
    assert joined(["a", "b"], m) == "a\nb"
    assert joined(["a", img, "b"], m) == "a<M>b"  # no newline beside an image
    assert joined([img, "a", "b", img, img], m) == "<M>a\nb<M><M>"


def test_markers_are_new_each_time():
    assert new_marker() != new_marker()


def tokenize(text: str, add_special: bool) -> list[int]:
    return ([1] if add_special else []) + [ord(c) for c in text]


def test_the_prompt_is_split_at_each_marker_and_each_image_placed_before_what_follows():
    m = new_marker()
    wide, tall = image_files.png(image_files.picture(24, 16)), image_files.png(image_files.picture(8, 32))
    tokens, images = split(tokenize, f"ab{m}c{m}{m}", m, [PNG, wide, tall])
    assert tokens == [1, ord("a"), ord("b"), ord("c")]
    # each with its size from its header: what sizes it for a projector that takes images at their own size
    assert images == [ImageInput(3, PNG, 16, 16), ImageInput(4, wide, 24, 16), ImageInput(4, tall, 8, 32)]
    tokens, images = split(tokenize, f"{m}x", m, [PNG])
    assert tokens == [1, ord("x")] and images == [ImageInput(1, PNG, 16, 16)]  # BOS first, as mtmd puts it


def test_a_template_that_drops_an_image_is_a_400():
    m = new_marker()
    with pytest.raises(ApiError) as e:
        split(tokenize, f"a{m}b", m, [b"1", b"2"])
    assert e.value.status == 400 and "1 places marked for images but 2 images" in e.value.message
