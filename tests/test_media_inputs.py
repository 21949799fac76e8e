"""Images and audio that are damaged or unusual give one line naming the file (issue 33, item 8).

A float WAV (which media.py promises) is read, 16/32-bit PCM plain or WAVE_FORMAT_EXTENSIBLE
too; a truncated, empty, header-only or 24-bit WAV, a 1x1 PNG and a file that is no image
are each a ValueError naming the file and what is wrong, never a PIL / wave / mlx-vlm error.
"""
from __future__ import annotations

import struct
import wave

import numpy as np
import pytest

import workbench
from workbench.reference import media
from workbench.zoo.multimodal import build_gemma4


def _riff(fmt: bytes, data: bytes) -> bytes:
    body = b"WAVE" + b"fmt " + struct.pack("<I", len(fmt)) + fmt + b"data" + struct.pack("<I", len(data)) + data
    return b"RIFF" + struct.pack("<I", len(body)) + body


def _fmt(tag, ch=1, rate=16000, bits=16, ext_tag=None):
    block = ch * bits // 8
    f = struct.pack("<HHIIHH", tag, ch, rate, rate * block, block, bits)
    if ext_tag is not None:  # WAVE_FORMAT_EXTENSIBLE: cbSize, valid bits, channel mask, sub-format GUID
        f += struct.pack("<HHI", 22, bits, 0) + struct.pack("<H", ext_tag) + b"\x00\x00\x00\x00\x10\x00\x80\x00\x00\xaa\x00\x38\x9b\x71"
    return f


WAVE = np.linspace(-0.5, 0.5, 1600, dtype=np.float32)


def test_float_and_extensible_wavs_are_read(tmp_path):
    (tmp_path / "f.wav").write_bytes(_riff(_fmt(3, bits=32), WAVE.astype("<f4").tobytes()))
    rate, a = media.read_wav(tmp_path / "f.wav")
    assert rate == 16000 and np.array_equal(a, WAVE)
    pcm = np.round(WAVE * 32767).astype("<i2")
    (tmp_path / "e.wav").write_bytes(_riff(_fmt(0xFFFE, ch=2, ext_tag=1), np.repeat(pcm, 2).tobytes()))
    rate, b = media.read_wav(tmp_path / "e.wav")
    assert np.array_equal(b, pcm.astype(np.float32) / 32768)  # the first channel
    with wave.open(str(tmp_path / "w.wav"), "wb") as w:  # what Python's own writer makes
        w.setnchannels(1), w.setsampwidth(2), w.setframerate(16000), w.writeframes(pcm.tobytes())
    assert np.array_equal(media.load_audio(tmp_path / "w.wav", 16000), b)


@pytest.mark.parametrize("name, make, words", [
    ("cut.wav", lambda: _riff(_fmt(1), np.zeros(1600, "<i2").tobytes())[:-101], "truncated"),
    ("odd.wav", lambda: _riff(_fmt(1), b"\x00" * 3), "truncated"),
    ("empty.wav", lambda: _riff(_fmt(1), b""), "no samples"),
    ("nofmt.wav", lambda: b"RIFF" + struct.pack("<I", 12) + b"WAVE" + b"data" + struct.pack("<I", 0), "fmt"),
    ("24bit.wav", lambda: _riff(_fmt(1, bits=24), b"\x00" * 30), "24-bit PCM WAV is not supported"),
    ("text.wav", lambda: b"hello, not audio", "not a WAV file"),
    ("rate.wav", lambda: _riff(_fmt(1, rate=8000), b"\x00" * 32), "8000 Hz"),
])
def test_bad_wavs_name_the_file_and_the_fault(tmp_path, name, make, words):
    (tmp_path / name).write_bytes(make())
    with pytest.raises(ValueError) as e:
        media.load_audio(tmp_path / name, 16000)
    msg = str(e.value)
    assert msg.startswith(str(tmp_path / name)) and words in msg and "\n" not in msg


def test_an_empty_or_non_finite_waveform_is_refused():
    with pytest.raises(ValueError, match="a waveform: no samples"):
        media.load_audio(np.zeros(0, np.float32), 16000)
    with pytest.raises(ValueError, match="NaN or Inf"):
        media.load_audio(np.array([0.0, np.nan], np.float32), 16000)


@pytest.fixture(scope="module")
def g4(tmp_path_factory):
    return workbench.load(build_gemma4(tmp_path_factory.mktemp("g4") / "g4"), granularity="module")


def test_images_the_processor_cannot_take_name_the_file(g4, tmp_path):
    from PIL import Image

    Image.fromarray(np.zeros((1, 1, 3), np.uint8)).save(tmp_path / "one.png")
    (tmp_path / "junk.png").write_bytes(b"\x89PNG\r\n\x1a\n" + b"junk")
    for name, words in (("one.png", "the model's image processor cannot take it"), ("junk.png", "not an image")):
        with pytest.raises(ValueError) as e:
            workbench.trace(g4, [5, 6], images=[str(tmp_path / name)])
        assert str(e.value).startswith(str(tmp_path / name)) and words in str(e.value)
    Image.fromarray(np.zeros((40, 7, 3), np.uint8)).save(tmp_path / "thin.png")  # odd, but fine: resized
    assert workbench.trace(g4, [5, 6], images=[str(tmp_path / "thin.png")]) is not None
