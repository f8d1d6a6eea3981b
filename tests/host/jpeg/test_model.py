"""The reference model of the decoder lane: stage by stage, then end to end vs Pillow."""

from __future__ import annotations

import functools
import struct

import numpy as np
import pytest
from dlbooster import Malformed, Unsupported, backends, jpeg
from dlbooster.jpeg import model
from jpegtools import (
    CLEAN_BUT_DECLINED,
    CORPUS_DIR,
    HW_SUBSAMPLINGS,
    Crafted,
    assert_result_matches_pillow,
    block_tokens,
    corpus_params,
    corpus_paths,
    corpus_rows,
    describe_mismatch,
    feature_subset,
    find_rst,
    gen,
    hardware_candidates,
    looks_clean,
    noise_jpeg,
    huffman_codes,
    pillow_rgb,
    reencode,
    require_corpus,
    segment,
)
from reference_impl import (
    spec_idct,
    spec_idct_values,
    spec_range_limit_table,
    spec_upsample,
    spec_ycbcr_to_rgb,
)

MALFORMED_REASONS = set(model.STATUS_REASONS.values()) | {"idct-range"}


def ss_id(s):
    return {0: "444", 1: "422", 2: "420"}.get(s, str(s))


def pillow_ok(data: bytes) -> np.ndarray:
    ref, exc = pillow_rgb(data)
    assert exc is None, f"Pillow cannot decode the generated file: {exc!r}"
    return ref


def assert_model_equals_pillow(data: bytes) -> model.ModelOutput:
    ref = pillow_ok(data)
    out = model.decode(data)
    assert out.rgb.dtype == np.uint8
    assert out.rgb.shape == ref.shape
    assert np.array_equal(out.rgb, ref), describe_mismatch(out.rgb, ref)
    return out


# =================================================================================
# 3.1 IDCT


def test_range_limit_table_matches_spec():
    table = model.range_limit()
    assert table.shape == (1024,)
    assert table.dtype == np.uint8
    assert table.tolist() == spec_range_limit_table()
    # Equal to clamp(v + 128) for v in -512..511.
    v = np.arange(-512, 512)
    assert np.array_equal(table[v & 1023], np.clip(v + 128, 0, 255))


def test_idct_all_zero_blocks_give_128():
    coef = np.zeros((5, 64), dtype=np.int16)
    for quant in (np.ones(64), np.full(64, 255), np.arange(64) * 1000):
        samples, in_range = model.idct_islow(coef, quant)
        assert samples.shape == (5, 8, 8)
        assert samples.dtype == np.uint8
        assert (samples == 128).all()
        assert in_range.all()


def test_idct_keeps_leading_axes():
    rng = np.random.default_rng(7)
    coef = rng.integers(-20, 21, size=(3, 4, 64)).astype(np.int16)
    quant = rng.integers(1, 30, size=64)
    samples, in_range = model.idct_islow(coef, quant)
    assert samples.shape == (3, 4, 8, 8)
    assert in_range.shape == (3, 4)
    assert np.array_equal(samples.reshape(12, 8, 8), spec_idct(coef.reshape(12, 64), quant))


@pytest.mark.parametrize("q", [1, 3, 16, 255])
def test_idct_dc_only_blocks(q):
    # DC only: pass 1 gives 4x, pass 2 gives v = (x + 4) >> 3 in every position.
    dcs = np.arange(-1100, 1101) // q if q > 1 else np.arange(-4200, 4201)
    dcs = np.unique(dcs)
    coef = np.zeros((len(dcs), 64), dtype=np.int16)
    coef[:, 0] = dcs
    samples, in_range = model.idct_islow(coef, np.full(64, q))
    x = dcs.astype(np.int64) * q
    v = (x + 4) >> 3
    table = np.array(spec_range_limit_table(), dtype=np.uint8)
    expected = table[v & 1023]
    assert np.array_equal(samples, np.broadcast_to(expected[:, None, None], samples.shape))
    assert np.array_equal(in_range, (v >= -512) & (v <= 511))


def test_idct_wraps_out_of_range_values():
    # v = 600 is past white: the & 1023 mask gives black (0), clamping would give 255;
    # v = -600 gives white. Both blocks are flagged out of range.
    coef = np.zeros((4, 64), dtype=np.int16)
    coef[:, 0] = [600, -600, 511, -512]
    samples, in_range = model.idct_islow(coef, np.full(64, 8))
    assert (samples[0] == 0).all()
    assert (samples[1] == 255).all()
    assert (samples[2] == 255).all()
    assert (samples[3] == 0).all()
    assert in_range.tolist() == [False, False, True, True]


def test_idct_flags_dequantised_values_beyond_16_bits():
    coef = np.zeros((2, 64), dtype=np.int16)
    coef[0, 9] = 2
    coef[1, 9] = 1
    quant = np.ones(64, dtype=np.int64)
    quant[9] = 20000  # 2 * 20000 does not fit a 16-bit SIMD lane, 1 * 20000 does
    samples, in_range = model.idct_islow(coef, quant)
    assert in_range.tolist()[0] is False
    assert np.array_equal(samples, spec_idct(coef, quant))


def test_idct_matches_spec_on_realistic_blocks():
    rng = np.random.default_rng(1180)
    n = 4000
    # Laplacian-like coefficients, large DC, decaying AC: what real streams carry.
    scale = np.concatenate([[60.0], 12.0 / (1 + np.arange(63) / 4)])
    coef = np.round(rng.laplace(0, scale, size=(n, 64))).astype(np.int16)
    quant = rng.integers(1, 30, size=64)
    samples, in_range = model.idct_islow(coef, quant)
    assert np.array_equal(samples, spec_idct(coef, quant))
    v = spec_idct_values(coef, quant)
    inside = in_range
    assert 0.5 < inside.mean() < 1, "the test data should be mostly, not all, in range"
    # In range, the mask and a plain clamp agree.
    assert np.array_equal(samples[inside], np.clip(v[inside] + 128, 0, 255))
    # A block whose output leaves -512..511 is never in range.
    outside = ((v < -512) | (v > 511)).any(axis=(1, 2))
    assert not (in_range & outside).any()


def test_idct_small_blocks_are_in_range():
    rng = np.random.default_rng(3)
    quant = rng.integers(1, 5, size=64)
    coef = (rng.integers(-32, 33, size=(3000, 64)) // quant).astype(np.int16)
    samples, in_range = model.idct_islow(coef, quant)
    assert in_range.all()
    assert np.array_equal(samples, spec_idct(coef, quant))


@pytest.mark.parametrize("seed", range(4))
def test_idct_matches_spec_on_full_range(seed):
    # Any int16 coefficient and any 16-bit quantiser: the samples must follow the C
    # code (64-bit products, 32-bit workspace, & 1023) even where in_range is False.
    rng = np.random.default_rng(seed)
    n = 3000
    coef = rng.integers(-32768, 32768, size=(n, 64)).astype(np.int16)
    # Sparse blocks too, so that the zero shortcuts of a real IDCT are exercised.
    mask = rng.random((n, 64)) < np.where(np.arange(n) % 2 == 0, 1.0, 0.1)[:, None]
    coef = np.where(mask, coef, 0).astype(np.int16)
    quant = rng.integers(0, 65536, size=64)
    if seed == 0:
        quant[:] = 65535
    samples, in_range = model.idct_islow(coef, quant)
    assert np.array_equal(samples, spec_idct(coef, quant))
    assert in_range.dtype == np.bool_
    # Such blocks leave the 16-bit range: flagged.
    big = (np.abs(coef.astype(np.int64) * quant) > 32767).any(axis=1)
    assert big.any()
    assert not in_range[big].any()


# =================================================================================
# 3.2 Upsampling


@pytest.mark.parametrize("h,v", [(2, 1), (1, 2), (2, 2), (1, 1)])
@pytest.mark.parametrize("cols", [1, 2, 3, 4, 5])
@pytest.mark.parametrize("rows", [1, 2, 3, 5])
def test_upsample_matches_spec(h, v, cols, rows):
    rng = np.random.default_rng(rows * 100 + cols * 10 + h * 2 + v)
    planes = [rng.integers(0, 256, size=(rows, cols)).astype(np.uint8),
              np.full((rows, cols), 255, dtype=np.uint8),
              np.zeros((rows, cols), dtype=np.uint8),
              (np.indices((rows, cols)).sum(axis=0) % 2 * 255).astype(np.uint8)]
    for plane in planes:
        # The output size is the frame's: both odd and even frame sizes map to this plane.
        for height in {rows * v, rows * v - (v - 1)}:
            for width in {cols * h, cols * h - (h - 1)}:
                got = model.upsample(plane, h, v, height, width)
                want = spec_upsample(plane, h, v, height, width)
                assert got.dtype == np.uint8
                assert got.shape == (height, width)
                assert np.array_equal(got, want), (plane.tolist(), height, width, got.tolist(),
                                                   want.tolist())


def test_upsample_narrow_planes_replicate():
    plane = np.array([[10, 200], [90, 30]], dtype=np.uint8)
    # h2v1 on a 2-wide plane: plain replication, not the 3:1 filter.
    assert model.upsample(plane, 2, 1, 2, 4).tolist() == [[10, 10, 200, 200], [90, 90, 30, 30]]
    assert model.upsample(plane, 2, 2, 4, 3).tolist() == [
        [10, 10, 200], [10, 10, 200], [90, 90, 30], [90, 90, 30]]
    # h1v2 has no such fallback: rows are still filtered.
    col = np.array([[0], [100]], dtype=np.uint8)
    assert model.upsample(col, 1, 2, 4, 1).tolist() == [[0], [25], [75], [100]]


def test_upsample_wide_random_planes():
    rng = np.random.default_rng(11)
    for h, v in [(2, 1), (1, 2), (2, 2)]:
        plane = rng.integers(0, 256, size=(9, 23)).astype(np.uint8)
        got = model.upsample(plane, h, v, 9 * v - (v - 1), 23 * h - (h - 1))
        assert np.array_equal(got, spec_upsample(plane, h, v, 9 * v - (v - 1), 23 * h - (h - 1)))


# =================================================================================
# 3.3 Colour


@pytest.mark.parametrize("y", [0, 1, 64, 128, 200, 254, 255])
def test_ycbcr_to_rgb_all_chroma_pairs(y):
    cb, cr = np.meshgrid(np.arange(256), np.arange(256), indexing="ij")
    cb = cb.astype(np.uint8)
    cr = cr.astype(np.uint8)
    yy = np.full_like(cb, y)
    got = model.ycbcr_to_rgb(yy, cb, cr)
    assert got.shape == (256, 256, 3)
    assert got.dtype == np.uint8
    assert np.array_equal(got, spec_ycbcr_to_rgb(yy, cb, cr))


def test_ycbcr_to_rgb_neutral_chroma_is_gray():
    y = np.arange(256, dtype=np.uint8)[None, :]
    c = np.full_like(y, 128)
    rgb = model.ycbcr_to_rgb(y, c, c)
    assert np.array_equal(rgb, np.repeat(y[..., None], 3, axis=2))


# =================================================================================
# Entropy decoding: checked by re-encoding with the test's own encoder


def _entropy_bytes(data, info):
    scan = info.scans[0]
    return data[scan.data_start: scan.data_end]


def _expected_symbols(out) -> int:
    """Huffman codes a baseline encoder writes for these coefficients (DC + AC + ZRL + EOB)."""
    total = 0
    for grid in out.coefficients:
        blocks = grid.reshape(-1, 64)
        for block in blocks:
            tokens, _ = block_tokens(block, 0)
            total += len(tokens)
    return total


STAGE_CASES = [
    (37, 29, 0), (37, 29, 1), (37, 29, 2), (37, 29, "440"), (37, 29, "gray"),
    (8, 8, 2), (1, 1, 2), (17, 1, 1), (1, 17, "440"), (16, 16, 0), (50, 3, "gray"),
]


@pytest.mark.parametrize("w,h,ss", STAGE_CASES,
                         ids=[f"{w}x{h}-{ss_id(s)}" for w, h, s in STAGE_CASES])
def test_stages_are_consistent(w, h, ss):
    data = gen(w, h, subsampling=ss, quality=85)
    out = assert_model_equals_pillow(data)
    info = out.info
    frame = info.frame
    hmax, vmax = frame.hmax, frame.vmax
    ncomp = len(frame.components)
    assert len(out.coefficients) == len(out.samples) == len(out.upsampled) == ncomp
    mcux, mcuy = -(-w // (8 * hmax)), -(-h // (8 * vmax))
    scan = info.scans[0]
    for c, comp in enumerate(frame.components):
        rows = -(-h * comp.v // vmax)
        cols = -(-w * comp.h // hmax)
        if ncomp == 1:
            assert out.coefficients[c].shape == (-(-rows // 8), -(-cols // 8), 64)
        else:
            assert out.coefficients[c].shape == (mcuy * comp.v, mcux * comp.h, 64)
        assert out.coefficients[c].dtype == np.int16
        assert out.samples[c].shape == (rows, cols)
        assert out.samples[c].dtype == np.uint8
        assert out.upsampled[c].shape == (h, w)
        # IDCT stage against the independent implementation.
        grid = out.coefficients[c]
        pix = spec_idct(grid.reshape(-1, 64), scan.qtables[comp.tq])
        plane = pix.reshape(grid.shape[0], grid.shape[1], 8, 8).transpose(0, 2, 1, 3)
        plane = plane.reshape(grid.shape[0] * 8, grid.shape[1] * 8)
        assert np.array_equal(out.samples[c], plane[:rows, :cols])
        # Upsampling stage.
        if ncomp == 3:
            want = spec_upsample(out.samples[c], hmax // comp.h, vmax // comp.v, h, w)
            assert np.array_equal(out.upsampled[c], want)
    assert out.rgb.shape == (h, w, 3)
    if ncomp == 3:
        assert np.array_equal(out.rgb, spec_ycbcr_to_rgb(*out.upsampled))
    else:
        assert np.array_equal(out.upsampled[0], out.samples[0])
        assert all(np.array_equal(out.rgb[..., k], out.samples[0]) for k in range(3))
    assert out.symbols > 0
    assert out.symbols == _expected_symbols(out)
    # Re-encoding the decoded coefficients reproduces the file's entropy-coded bytes.
    assert reencode(data, info, out.coefficients) == data


@pytest.mark.parametrize("ss", (0, 1, 2, "gray"), ids=ss_id)
@pytest.mark.parametrize("kw", [dict(restart_blocks=1), dict(restart_blocks=5),
                                dict(restart_rows=1), dict(optimize=True)],
                         ids=["rst1", "rst5", "rows1", "optimize"])
def test_entropy_roundtrip(ss, kw):
    # (simplejpeg, the 4:4:0 writer, has neither restarts nor optimised tables: see the
    # DRI tests below for 4:4:0 with restart markers.)
    data = gen(83, 45, subsampling=ss, quality=90, **kw)
    out = assert_model_equals_pillow(data)
    assert reencode(data, out.info, out.coefficients) == data


def _with_dri(data: bytes, interval: int) -> bytes:
    """Insert a DRI segment before SOS and re-encode the scan with RSTn markers."""
    info = jpeg.parse(data)
    out = model.decode(data, info=info)
    sos = [off for m, off in info.markers if m == 0xDA][0]
    with_dri = data[:sos] + segment(0xDD, struct.pack(">H", interval)) + data[sos:]
    info2 = jpeg.parse(with_dri)
    assert info2.scans[0].restart_interval == interval
    return reencode(with_dri, info2, out.coefficients)


@pytest.mark.parametrize("interval", [1, 2, 3, 7])
@pytest.mark.parametrize("ss", HW_SUBSAMPLINGS, ids=ss_id)
def test_restart_intervals_inserted(ss, interval):
    # Restart markers for every subsampling (also 4:4:0, which Pillow cannot write).
    data = _with_dri(gen(61, 43, subsampling=ss, quality=80), interval)
    info = jpeg.parse(data)
    assert jpeg.classify(info) is None
    assert info.scans[0].restarts > 0
    assert_model_equals_pillow(data)


def test_dc_predictor_wraps_like_jcoef():
    # DC differences of +2047 repeated: the predictor passes 32767 and the stored
    # 16-bit coefficient wraps (libjpeg-turbo: (JCOEF)s).
    n = 20
    data = gen(n * 8, 8, subsampling="gray", quality=90)
    info = jpeg.parse(data)
    grid = np.zeros((1, n, 64), dtype=np.int16)
    crafted = [Crafted(0, i, [("dc", 2047), ("eob",)]) for i in range(n)]
    evil = reencode(data, info, [grid], crafted=crafted)
    blocks, symbols = model.entropy_decode(evil, jpeg.parse(evil))
    assert symbols == 2 * n
    want = [(((2047 * (i + 1)) + 32768) % 65536) - 32768 for i in range(n)]
    assert min(want) < 0  # it did wrap
    assert blocks[0][0, :, 0].tolist() == want
    assert (blocks[0][0, :, 1:] == 0).all()
    result = backends.decode_result(evil, "model")
    assert result.status == "fallback" and result.reason == "idct-range"
    assert_result_matches_pillow(result, evil)


# =================================================================================
# End to end against Pillow: the generated sweep (default run)

EDGE = [1, 2, 3, 4, 5, 7, 8, 9, 15, 16, 17, 31, 33]  # 3..5: chroma planes 2-3 wide
QUALITIES = [1, 5, 25, 50, 75, 90, 95, 100]
SIZE_CASES = [(w, h, ss, QUALITIES[(i + j) % len(QUALITIES)])
              for i, w in enumerate(EDGE) for j, h in enumerate(EDGE) for ss in HW_SUBSAMPLINGS]


@pytest.mark.parametrize("w,h,ss,q", SIZE_CASES,
                         ids=[f"{w}x{h}-{ss_id(s)}-q{q}" for w, h, s, q in SIZE_CASES])
def test_sizes_match_pillow(w, h, ss, q):
    data = gen(w, h, subsampling=ss, quality=q)
    out = assert_model_equals_pillow(data)
    assert out.rgb.shape == (h, w, 3)


@pytest.mark.parametrize("q", QUALITIES + [2, 10, 60, 99])
@pytest.mark.parametrize("ss", HW_SUBSAMPLINGS, ids=ss_id)
def test_qualities_match_pillow(ss, q):
    assert_model_equals_pillow(gen(71, 45, subsampling=ss, quality=q, name=(
        "camera.png" if ss == "gray" else "coffee.png")))


@pytest.mark.parametrize("ss", HW_SUBSAMPLINGS, ids=ss_id)
def test_large_image_matches_pillow(ss):
    assert_model_equals_pillow(gen(2000, 1500, subsampling=ss, quality=90, name=(
        "moon.png" if ss == "gray" else "chelsea.png")))


PIL_SUBSAMPLINGS = (0, 1, 2, "gray")


@pytest.mark.parametrize("kw", [dict(restart_blocks=1), dict(restart_blocks=2),
                                dict(restart_blocks=7), dict(restart_rows=1),
                                dict(restart_rows=3)],
                         ids=["blocks1", "blocks2", "blocks7", "rows1", "rows3"])
@pytest.mark.parametrize("ss", PIL_SUBSAMPLINGS, ids=ss_id)
def test_restart_markers_match_pillow(ss, kw):
    data = gen(97, 71, subsampling=ss, quality=85, **kw)
    info = jpeg.parse(data)
    assert info.scans[0].restart_interval > 0
    assert info.scans[0].restarts > 0
    assert_model_equals_pillow(data)


@pytest.mark.parametrize("size", [(1, 1), (8, 8), (33, 17), (211, 149)], ids=str)
@pytest.mark.parametrize("ss", PIL_SUBSAMPLINGS, ids=ss_id)
def test_optimized_tables_match_pillow(ss, size):
    data = gen(*size, subsampling=ss, quality=80, optimize=True)
    assert_model_equals_pillow(data)


QTABLES_16 = {
    "ramp": [[8 + 20 * i for i in range(64)], [300 + 5 * i for i in range(64)]],
    "dc256": [[256] + [1] * 63, [257] * 64],
    "max": [[32767] * 64, [1000] * 64],
    "fine": [[1] * 63 + [256], [2] * 63 + [999]],
}


@pytest.mark.parametrize("tables", QTABLES_16, ids=str)
@pytest.mark.parametrize("ss", PIL_SUBSAMPLINGS, ids=ss_id)
def test_16bit_quant_tables_match_pillow(ss, tables):
    qt = QTABLES_16[tables][:1] if ss == "gray" else QTABLES_16[tables]
    data = gen(45, 37, subsampling=ss, qtables=qt)
    info = jpeg.parse(data)
    assert info.frame.sof == 1  # libjpeg writes SOF1 for 16-bit tables
    dqt = [off for m, off in info.markers if m == 0xDB]
    assert any(data[off + 4] >> 4 == 1 for off in dqt), "expected a 16-bit DQT"
    assert_model_equals_pillow(data)


@pytest.mark.parametrize("name", ["astronaut.png", "chelsea.png", "coffee.png", "rocket.jpg",
                                  "retina.jpg", "hubble_deep_field.jpg", "camera.png",
                                  "moon.png"])
def test_whole_photos_match_pillow(name):
    from jpegtools import photo
    for ss in (2, 0) if photo(name).mode != "L" else ("gray",):
        data = gen(0, 0, subsampling=ss, quality=92, image=photo(name).convert(
            "L" if ss == "gray" else "RGB"))
        assert_model_equals_pillow(data)


def test_noise_matches_pillow():
    # Noise maximises coefficient magnitudes (the worst case for range and Huffman code
    # lengths) at quality 100.
    from PIL import Image
    rng = np.random.default_rng(5)
    img = Image.fromarray(rng.integers(0, 256, size=(67, 93, 3), dtype=np.uint8))
    for ss in (0, 1, 2):
        assert_model_equals_pillow(gen(0, 0, subsampling=ss, quality=100, image=img))


@pytest.mark.parametrize("sampling", [0x22, 0x12, 0x21, 0x41])
def test_gray_with_sampling_factors(sampling):
    # A single-component scan is non-interleaved whatever its sampling factors say.
    data = bytearray(gen(29, 19, subsampling="gray", quality=80))
    info = jpeg.parse(bytes(data))
    sof = [off for m, off in info.markers if m in (0xC0, 0xC1)][0]
    assert data[sof + 11] == 0x11
    data[sof + 11] = sampling
    data = bytes(data)
    result = backends.decode_result(data, "model")
    assert_result_matches_pillow(result, data)
    assert result.status == "ok"


# =================================================================================
# Legal (or tolerated) stream oddities: decoded by the model, equal to Pillow


def _with_restarts():
    data = gen(64, 48, subsampling=2, quality=80, restart_blocks=1)
    scan = jpeg.parse(data).scans[0]
    return data, find_rst(data, scan.data_start, scan.data_end)


def _insert_before(data: bytes, offsets, chunk: bytes) -> bytes:
    out = bytearray(data)
    for off in sorted(offsets, reverse=True):
        out[off:off] = chunk
    return bytes(out)


def _assert_model_ok(data: bytes):
    result = backends.decode_result(data, "model")
    assert_result_matches_pillow(result, data)
    assert result.status == "ok", result.reason


@pytest.mark.parametrize("kind", ["fill-before-rst", "junk-before-rst", "rst-after-last",
                                  "fill-before-eoi", "fill-between-segments"])
def test_tolerated_stream_oddities(kind):
    data, rst = _with_restarts()
    if kind == "fill-before-rst":  # T.81 B.1.1.2: any marker may be preceded by 0xFF fill
        evil = _insert_before(data, rst, b"\xff\xff")
    elif kind == "junk-before-rst":  # libjpeg-turbo warns and skips the bytes
        evil = _insert_before(data, rst, b"\x12\x34")
    elif kind == "rst-after-last":
        evil = data[:-2] + b"\xff\xd0" + data[-2:]
    elif kind == "fill-before-eoi":
        evil = data[:-2] + b"\xff\xff\xff" + data[-2:]
    else:
        sof = [off for m, off in jpeg.parse(data).markers if m == 0xC0][0]
        evil = data[:sof] + b"\xff\xff\xff" + data[sof:]
    _assert_model_ok(evil)


def test_zero_quantisers():
    data = bytearray(gen(40, 24, subsampling=0, quality=90))
    dqt = [off for m, off in jpeg.parse(bytes(data)).markers if m == 0xDB][0]
    for k in (0, 5, 63):
        data[dqt + 5 + k] = 0
    data = bytes(data)
    assert jpeg.parse(data).scans[0].qtables[0][0] == 0
    _assert_model_ok(data)


@pytest.mark.parametrize("symbol", [0x10, 0x70, 0xE0])
def test_size_zero_ac_symbols_end_the_block(symbol):
    # libjpeg treats any AC symbol of size 0 other than ZRL (0xF0) as EOB. Give such a
    # symbol the code of 0xFA (run 15, size 10) in the luma AC table and use it.
    data = gen(40, 24, subsampling=0, quality=90)
    info = jpeg.parse(data)
    dht = [off for m, off in info.markers
           if m == 0xC4 and data[off + 4] == 0x10][0]
    n = sum(data[dht + 5: dht + 21])
    syms = data[dht + 21: dht + 21 + n]
    k = syms.index(0xFA)
    data = data[:dht + 21 + k] + bytes([symbol]) + data[dht + 22 + k:]
    info = jpeg.parse(data)
    out = model.decode(data, info=info)
    evil = reencode(data, info, out.coefficients, crafted=[
        Crafted(0, 2, [("dc", 3), ("ac", 0, 5), ("sym", symbol), ]),
        Crafted(0, 4, [("dc", -2), ("ac", 3, -7), ("ac", 1, 1), ("sym", symbol)]),
    ])
    _assert_model_ok(evil)
    coefs = model.decode(evil).coefficients[0].reshape(-1, 64)
    assert coefs[2, 0] == coefs[1, 0] + 3 and coefs[2, 1] == 5 and not coefs[2, 2:].any()
    assert coefs[4, 0] == coefs[3, 0] - 2 and coefs[4, 9] == -7 and coefs[4, 3] == 1  # zigzag 4, 6


# =================================================================================
# Stream faults the hardware flags: reason codes, then fallback equal to Pillow


def _first_restart(data, info):
    scan = info.scans[0]
    rst = find_rst(data, scan.data_start, scan.data_end)
    assert rst, "expected RSTn markers"
    return rst


def _expect_malformed(data: bytes, reasons) -> Malformed:
    info = jpeg.parse(data)
    assert jpeg.classify(info) is None, "the fault must be invisible to the header checks"
    with pytest.raises(Malformed) as excinfo:
        model.decode(data)
    err = excinfo.value
    assert err.reason in ({reasons} if isinstance(reasons, str) else set(reasons))
    result = backends.decode_result(data, "model")
    assert result.status in ("fallback", "error")
    if result.status == "fallback":
        assert result.reason == err.reason
        assert result.backend == "cpu"
    assert_result_matches_pillow(result, data)
    return err


@pytest.mark.parametrize("ss", PIL_SUBSAMPLINGS, ids=ss_id)
@pytest.mark.parametrize("which", [0, 1, -1])
def test_wrong_restart_number(ss, which):
    data = bytearray(gen(64, 48, subsampling=ss, quality=75, restart_blocks=1))
    info = jpeg.parse(bytes(data))
    off = _first_restart(bytes(data), info)[which]
    data[off + 1] = 0xD0 + ((data[off + 1] - 0xD0 + 3) & 7)
    err = _expect_malformed(bytes(data), "bad-restart")
    assert err.offset >= 0


def test_missing_restart_marker():
    data = gen(64, 48, subsampling=2, quality=75, restart_blocks=2)
    info = jpeg.parse(data)
    off = _first_restart(data, info)[1]
    _expect_malformed(data[:off] + data[off + 2:], "bad-restart")


@pytest.mark.parametrize("ss", HW_SUBSAMPLINGS, ids=ss_id)
@pytest.mark.parametrize("fraction", [0.1, 0.5, 0.95])
def test_truncated_entropy_data_with_eoi(ss, fraction):
    data = gen(80, 64, subsampling=ss, quality=90)
    scan = jpeg.parse(data).scans[0]
    cut = scan.data_start + int((scan.data_end - scan.data_start) * fraction)
    while data[cut - 1] == 0xFF:
        cut -= 1
    _expect_malformed(data[:cut] + b"\xff\xd9", "truncated")


@pytest.mark.parametrize("ss", PIL_SUBSAMPLINGS, ids=ss_id)
@pytest.mark.parametrize("marker", [0xD0, 0xD5])
def test_restart_marker_without_dri(ss, marker):
    data = gen(80, 64, subsampling=ss, quality=90)
    scan = jpeg.parse(data).scans[0]
    mid = (scan.data_start + scan.data_end) // 2
    while data[mid - 1] == 0xFF:
        mid += 1
    _expect_malformed(data[:mid] + bytes([0xFF, marker]) + data[mid:], "unexpected-marker")


@pytest.mark.parametrize("options", [{"quality": 50, "subsampling": 0}, {"quality": 90, "subsampling": 2},
                                     {"quality": 75, "subsampling": 2, "restart_marker_blocks": 3}],
                         ids=["444_q50", "420_q90", "420_q75_restart"])
def test_fill_bytes_before_a_stuffed_zero_equal_pillow(options):
    """FF FF.. 00 in entropy-coded data (T.81 B.1.1.2 allows fill bytes only before
    markers): libjpeg-turbo's slow path reads one FF data byte, its fast path a marker,
    and Pillow's pixels follow either. An MCU that needs data past such a sequence is
    declined (``fill-before-stuffing``) and decoded on the CPU, so every variant, one
    fill byte before each stuffed zero in turn, equals Pillow; none is ``ok`` with other
    pixels (the attack review's finding: before, 820 of 1,418 such variants were)."""
    data = noise_jpeg(192, 48, **options)
    scan = jpeg.parse(data).scans[0]
    stuffed = [p for p in range(scan.data_start, scan.data_end - 1) if data[p:p + 2] == b"\xff\x00"]
    assert len(stuffed) >= 5
    reasons = set()
    for p in stuffed[:: max(1, len(stuffed) // 40)]:
        evil = data[:p] + b"\xff" + data[p:]
        result = backends.decode_result(evil, "model")
        assert_result_matches_pillow(result, evil)
        reasons.add(result.reason)
    assert "fill-before-stuffing" in reasons


def test_eoi_inside_entropy_data():
    data = gen(80, 64, subsampling=2, quality=90)
    scan = jpeg.parse(data).scans[0]
    mid = (scan.data_start + scan.data_end) // 2
    while data[mid - 1] == 0xFF:
        mid += 1
    evil = data[:mid] + b"\xff\xd9" + data[mid:]
    info = jpeg.parse(evil)
    assert info.eoi == mid and info.trailing > 0
    _expect_malformed(evil, {"truncated", "unexpected-marker"})


def _craft(ss, crafted, size=(40, 24)):
    data = gen(*size, subsampling=ss, quality=90)
    info = jpeg.parse(data)
    out = model.decode(data, info=info)
    return reencode(data, info, out.coefficients, crafted=crafted)


@pytest.mark.parametrize("ss", PIL_SUBSAMPLINGS, ids=ss_id)
@pytest.mark.parametrize("index", [0, 3])
def test_bad_huffman_code(ss, index):
    info = jpeg.parse(gen(8, 8, subsampling=ss))
    ac = info.scans[0].ac_tables[0]
    codes = huffman_codes(ac.counts, ac.symbols)
    assert (0xFFFF, 16) not in codes.values(), "the test needs the all-ones code unused"
    # DC difference 0, then sixteen 1-bits where an AC code must start.
    evil = _craft(ss, [Crafted(0, index, [("dc", 0), ("raw", "1" * 16), ("eob",)])])
    _expect_malformed(evil, "bad-huffman-code")


def test_bad_huffman_code_in_dc():
    evil = _craft(2, [Crafted(1, 0, [("raw", "1" * 16), ("eob",)])])
    _expect_malformed(evil, "bad-huffman-code")


@pytest.mark.parametrize("tokens", [
    [("dc", 0)] + [("zrl",)] * 4 + [("eob",)],
    [("dc", 0)] + [("zrl",)] * 3 + [("ac", 15, 1), ("eob",)],
], ids=["4zrl", "zrl-run"])
@pytest.mark.parametrize("ss", PIL_SUBSAMPLINGS, ids=ss_id)
def test_more_than_64_coefficients(ss, tokens):
    evil = _craft(ss, [Crafted(0, 1, tokens)])
    _expect_malformed(evil, "coefficient-overflow")


def test_exactly_64_coefficients_is_fine():
    # 63 AC values fill the block: no EOB follows, and that is valid.
    data = _craft(0, [Crafted(0, 1, [("dc", 0)] + [("ac", 0, 1)] * 63)])
    assert_model_equals_pillow(data)
    data = _craft(0, [Crafted(0, 1, [("dc", 0)] + [("zrl",)] * 3 + [("ac", 14, 1)])])
    assert_model_equals_pillow(data)


def test_extreme_coefficients_fall_back():
    # 16-bit quantisers times a large coefficient leave the exact IDCT range.
    data = gen(32, 16, subsampling=0, qtables=[[1000] * 64, [1000] * 64])
    info = jpeg.parse(data)
    out = model.decode(data, info=info)
    evil = reencode(data, info, out.coefficients,
                    crafted=[Crafted(0, 0, [("dc", 0), ("ac", 0, 1023), ("eob",)])])
    _expect_malformed(evil, "idct-range")


@pytest.mark.parametrize("seed", range(6))
def test_bit_flips_in_entropy_data(seed):
    rng = np.random.default_rng(seed)
    ss = HW_SUBSAMPLINGS[seed % len(HW_SUBSAMPLINGS)]
    kw = dict(restart_blocks=2) if ss in (0, 2) else {}
    data = gen(48, 40, subsampling=ss, quality=70, **kw)
    scan = jpeg.parse(data).scans[0]
    flagged = 0
    for _ in range(25):
        evil = bytearray(data)
        for _ in range(rng.integers(1, 4)):
            pos = int(rng.integers(scan.data_start, scan.data_end))
            evil[pos] ^= 1 << int(rng.integers(0, 8))
        evil = bytes(evil)
        info = jpeg.parse(evil)
        reason = jpeg.classify(info)
        try:
            out = model.decode(evil, info=info)
        except Malformed as exc:
            flagged += 1
            assert reason is None
            assert exc.reason in MALFORMED_REASONS
        except Unsupported as exc:
            assert exc.reason == reason
        else:
            ref = pillow_ok(evil)
            assert np.array_equal(out.rgb, ref), describe_mismatch(out.rgb, ref)
        assert_result_matches_pillow(backends.decode_result(evil, "model"), evil)
    assert flagged > 0


# =================================================================================
# Larger generated sweep (deselected by default: pytest -m sweep)

SWEEP_SS = HW_SUBSAMPLINGS


@pytest.mark.corpus
@pytest.mark.sweep
@pytest.mark.parametrize("ss", SWEEP_SS, ids=ss_id)
@pytest.mark.parametrize("q", range(1, 101))
def test_sweep_all_qualities(ss, q):
    assert_model_equals_pillow(gen(45, 37, subsampling=ss, quality=q, name="coffee.png"))
    if ss != "gray":
        assert_model_equals_pillow(gen(45, 37, subsampling=ss, quality=q, name="rocket.jpg"))


@pytest.mark.corpus
@pytest.mark.sweep
@pytest.mark.parametrize("ss", SWEEP_SS, ids=ss_id)
@pytest.mark.parametrize("w", range(1, 35))
def test_sweep_all_small_sizes(ss, w):
    for h in range(1, 35):
        data = gen(w, h, subsampling=ss, quality=(w * 7 + h * 3) % 100 + 1)
        assert_model_equals_pillow(data)


@pytest.mark.corpus
@pytest.mark.sweep
@pytest.mark.parametrize("ss", PIL_SUBSAMPLINGS, ids=ss_id)
@pytest.mark.parametrize("blocks", range(1, 20))
def test_sweep_restart_intervals(ss, blocks):
    for optimize in (False, True):
        data = gen(123, 77, subsampling=ss, quality=88, restart_blocks=blocks, optimize=optimize)
        assert_model_equals_pillow(data)


# =================================================================================
# Corpus


def _corpus_subset():
    return [r["path"] for r in feature_subset(hardware_candidates(corpus_rows()), cap=40)]


@pytest.mark.parametrize("rel", corpus_params(_corpus_subset()))
def test_corpus_subset_model_matches_pillow(rel):
    root = require_corpus()
    path = root / rel
    data = path.read_bytes()
    result = backends.decode_result(str(path), "model")
    assert result.path == str(path)
    assert_result_matches_pillow(result, data)
    # Pillow's pixels through the CPU fallback would pass the check above: a file that
    # classify.tsv shows to be plain must come from the model itself.
    (row,) = [r for r in corpus_rows() if r["path"] == rel]
    if looks_clean(row):
        expected = ("fallback", CLEAN_BUT_DECLINED[rel]) if rel in CLEAN_BUT_DECLINED else ("ok", None)
        assert (result.status, result.reason) == expected


def test_corpus_subset_has_plain_files():
    require_corpus()
    rows = {r["path"]: r for r in corpus_rows()}
    assert sum(looks_clean(rows[rel]) for rel in _corpus_subset()) >= 20


@functools.lru_cache(maxsize=None)
def _model_outcome(rel: str) -> tuple[str, str | None, bool, str | None]:
    """(status, reason, hardware profile per classify(), failure text or None)."""
    path = CORPUS_DIR / rel
    data = path.read_bytes()
    result = backends.decode_result(str(path), "model")
    accepted = jpeg.classify(jpeg.parse(data)) is None
    try:
        assert_result_matches_pillow(result, data)
        failure = None
    except AssertionError as exc:
        failure = str(exc)
    return result.status, result.reason, accepted, failure


@pytest.mark.corpus
@pytest.mark.parametrize("rel", corpus_params(corpus_paths()))
def test_corpus_every_file_model(rel):
    require_corpus()
    status, reason, _, failure = _model_outcome(rel)
    assert failure is None, f"{rel}: status {status} ({reason}): {failure}"


@pytest.mark.corpus
def test_corpus_model_ok_rate():
    require_corpus()
    counted = ok = 0
    declined = {}
    for rel in corpus_paths():
        status, reason, accepted, failure = _model_outcome(rel)
        if accepted and status != "error":  # classify() accepts it and Pillow decodes it
            counted += 1
            if status == "ok":
                ok += 1
            else:
                declined[reason] = declined.get(reason, 0) + 1
    if counted == 0:
        pytest.skip("no file in the corpus is both hardware-decodable and Pillow-decodable")
    assert ok >= 0.98 * counted, f"only {ok} of {counted} accepted files decode ok: {declined}"
