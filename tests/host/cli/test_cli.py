"""The ``dlbooster`` command line: decode outputs, JSON schema, exit codes, benchmarks."""

from __future__ import annotations

import hashlib
import io
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from dlbooster.cli import main
from jpegtools import make_jpeg


def _jpeg(rgb: np.ndarray, **options) -> bytes:
    buf = io.BytesIO()
    Image.fromarray(rgb).save(buf, "JPEG", **options)
    return buf.getvalue()


def _pillow(path) -> np.ndarray:
    with Image.open(path) as im:
        return np.asarray(im.convert("RGB"))


@pytest.fixture
def folder(tmp_path):
    """A folder with a baseline JPEG, a progressive JPEG, a PNG, a nested JPEG and junk."""
    rng = np.random.default_rng(7)
    photo = np.asarray(Image.fromarray(rng.integers(0, 256, (30, 40, 3), dtype=np.uint8))
                       .resize((80, 60), Image.BICUBIC))
    (tmp_path / "a.jpg").write_bytes(_jpeg(photo, quality=90, subsampling=2))
    (tmp_path / "b_progressive.jpg").write_bytes(_jpeg(photo, quality=80, progressive=True))
    buf = io.BytesIO()
    Image.fromarray(photo).save(buf, "PNG")
    (tmp_path / "c.JPEG").write_bytes(buf.getvalue())  # a PNG named .JPEG, as in ImageNet
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "d.jpg").write_bytes(_jpeg(photo[:17, :23], quality=50, subsampling=0))
    (tmp_path / "zz_junk.jpg").write_bytes(b"\xff\xd8\xff\xe0 not really a jpeg")
    return tmp_path


def test_decode_json_per_input(folder, capsys):
    status = main(["decode", "--backend", "model", "--json", str(folder)])
    out = json.loads(capsys.readouterr().out)
    results = {r["path"].removeprefix(str(folder) + "/"): r for r in out["results"]}
    assert sorted(results) == ["a.jpg", "b_progressive.jpg", "c.JPEG", "sub/d.jpg", "zz_junk.jpg"]
    assert status == 1  # the junk file is not decodable
    assert results["a.jpg"]["status"] == "ok" and results["a.jpg"]["backend"] == "model"
    assert results["a.jpg"]["reason"] is None
    assert results["b_progressive.jpg"]["status"] == "fallback"
    assert results["b_progressive.jpg"]["backend"] == "cpu"
    assert results["b_progressive.jpg"]["reason"] == "progressive"
    assert results["c.JPEG"]["status"] == "fallback" and results["c.JPEG"]["reason"] == "not-jpeg"
    assert results["sub/d.jpg"]["status"] == "ok"
    junk = results["zz_junk.jpg"]
    assert junk["status"] == "error" and junk["backend"] is None and junk["sha256"] is None
    for name, record in results.items():
        if record["status"] == "error":
            continue
        rgb = _pillow(folder / name)
        assert (record["width"], record["height"]) == (rgb.shape[1], rgb.shape[0])
        assert record["sha256"] == hashlib.sha256(rgb.tobytes()).hexdigest()
    assert results["a.jpg"]["symbols"] > 0
    assert out["summary"] == {
        "inputs": 5, "ok": 2, "fallback": 2, "error": 1,
        "by_reason": {"error:undecodable": 1, "fallback:not-jpeg": 1, "fallback:progressive": 1},
    }


def test_decode_png_out_is_lossless(folder, tmp_path_factory, capsys):
    out = tmp_path_factory.mktemp("out")
    assert main(["decode", "--backend", "cpu", "--out", str(out),
                 str(folder / "a.jpg"), str(folder / "sub")]) == 0
    assert sorted(p.relative_to(out).as_posix() for p in out.rglob("*.png")) == ["a.jpg.png", "sub/d.jpg.png"]
    assert np.array_equal(_pillow(out / "a.jpg.png"), _pillow(folder / "a.jpg"))
    assert np.array_equal(_pillow(out / "sub" / "d.jpg.png"), _pillow(folder / "sub" / "d.jpg"))
    assert "2 inputs: 2 ok, 0 fallback, 0 error" in capsys.readouterr().out


def test_out_names_never_collide(tmp_path, capsys):
    for sub, size in (("a", 8), ("b", 16)):
        (tmp_path / sub).mkdir()
        Image.new("RGB", (size, size), (size, 0, 0)).save(tmp_path / sub / "x.jpg")
    out = tmp_path / "out"
    assert main(["decode", "--out", str(out), str(tmp_path / "a" / "x.jpg"),
                 str(tmp_path / "b" / "x.jpg")]) == 0
    assert _pillow(out / "a" / "x.jpg.png").shape == (8, 8, 3)
    assert _pillow(out / "b" / "x.jpg.png").shape == (16, 16, 3)
    assert main(["decode", "--out", str(tmp_path / "a" / "x.jpg"), str(tmp_path / "b" / "x.jpg")]) == 2


def test_decode_verify_counts_matches(folder, capsys):
    assert main(["decode", "--backend", "model", "--verify", "--json",
                 str(folder / "a.jpg"), str(folder / "b_progressive.jpg")]) == 0
    out = json.loads(capsys.readouterr().out)
    assert [r["matches_pillow"] for r in out["results"]] == [True, True]
    assert out["summary"]["pillow_mismatches"] == 0


def test_decode_verify_reports_an_image_that_differs_from_pillow(folder, monkeypatch, capsys):
    """A backend whose output is one sample off: --verify must say so, per input and in
    the summary, name the file and exit 1 (the whole-corpus checks rest on this)."""
    from dlbooster.backends import ModelBackend

    decode_stages = ModelBackend.decode_stages

    def off_by_one(self, data, info=None):
        stages = decode_stages(self, data, info)
        if stages.rgb.shape == (60, 80, 3):      # a.jpg, not sub/d.jpg
            stages.rgb[0, 0, 0] ^= 1
        return stages

    monkeypatch.setattr(ModelBackend, "decode_stages", off_by_one)
    a, c = str(folder / "a.jpg"), str(folder / "sub" / "d.jpg")
    assert main(["decode", "--backend", "model", "--verify", "--json", a, c]) == 1
    captured = capsys.readouterr()
    out = json.loads(captured.out)
    assert [(r["status"], r["matches_pillow"]) for r in out["results"]] == [("ok", False), ("ok", True)]
    assert out["summary"]["pillow_mismatches"] == 1
    assert f"differs from Pillow: {a}" in captured.err and c not in captured.err
    # The text summary too.
    assert main(["decode", "--backend", "model", "--verify", a]) == 1
    assert "1 differ from Pillow" in capsys.readouterr().out


def test_missing_file_is_an_error_naming_it(tmp_path, capsys):
    missing = tmp_path / "nope.jpg"
    assert main(["decode", "--json", str(missing)]) == 1
    (record,) = json.loads(capsys.readouterr().out)["results"]
    assert record["path"] == str(missing)
    assert (record["status"], record["reason"]) == ("error", "unreadable")


def test_file_names_outside_the_locales_encoding_are_printed_escaped(folder, tmp_path):
    """A name whose bytes are not UTF-8 (kept by Python as surrogates) on a strict UTF-8
    stdout: the table prints it escaped and every other input is still reported."""
    odd = tmp_path / "odd"
    odd.mkdir()
    jpeg_bytes = (folder / "a.jpg").read_bytes()
    for name in (b"\xff\xfe.jpg", b"e\xff.jpg"):
        (odd / os.fsdecode(name)).write_bytes(jpeg_bytes)
    (odd / "fine.jpg").write_bytes(jpeg_bytes)
    env = {**os.environ, "PYTHONIOENCODING": "utf-8", "LC_ALL": "C.UTF-8"}
    done = subprocess.run([sys.executable, "-m", "dlbooster", "decode", "--backend", "cpu", str(odd)],
                          capture_output=True, text=True, timeout=120, env=env)
    assert done.returncode == 0, done.stderr
    assert "Traceback" not in done.stderr
    assert "\\udcff\\udcfe.jpg" in done.stdout and "e\\udcff.jpg" in done.stdout and "fine.jpg" in done.stdout
    assert "3 inputs: 3 ok" in done.stdout


def test_control_characters_in_file_names_are_printed_escaped(folder, tmp_path, capsys):
    """One line per input: a newline or tab in a name is printed as Python escapes it."""
    odd = tmp_path / "odd"
    odd.mkdir()
    (odd / "new\nline\t.jpg").write_bytes(b"not a jpeg")
    (odd / "fine.jpg").write_bytes((folder / "a.jpg").read_bytes())
    assert main(["decode", "--backend", "cpu", str(odd)]) == 1
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == f"ok       cpu    -                      {odd}/fine.jpg"
    assert lines[1].startswith("error    -      undecodable            ")
    assert f"{odd}/new\\nline\\t.jpg: Pillow: UnidentifiedImageError" in lines[1]
    assert lines[2] == "2 inputs: 1 ok, 0 fallback, 1 error"


def test_verify_reads_inputs_as_the_decode_does(folder, tmp_path, capsys):
    # A FIFO would block a plain open() and /dev/zero would fill memory: both must be
    # reported as unreadable, with --verify as without. In a child with a time limit, so
    # that a regression fails instead of hanging the suite.
    odd = tmp_path / "odd"
    odd.mkdir()
    os.mkfifo(odd / "pipe.jpg")
    (odd / "zero.jpg").symlink_to("/dev/zero")
    done = subprocess.run([sys.executable, "-m", "dlbooster", "decode", "--backend", "cpu", "--verify",
                           "--json", str(odd), str(folder / "a.jpg")], capture_output=True, text=True, timeout=120)
    assert done.returncode == 1, done.stderr
    records = {os.path.basename(r["path"]): r for r in json.loads(done.stdout)["results"]}
    for name in ("pipe.jpg", "zero.jpg"):
        assert (records[name]["status"], records[name]["reason"]) == ("error", "unreadable")
        assert records[name]["detail"] == "not a regular file" and records[name]["matches_pillow"]
    assert records["a.jpg"]["status"] == "ok" and records["a.jpg"]["matches_pillow"]


def test_error_records_carry_their_detail_and_the_declining_reason(folder, tmp_path, capsys):
    progressive = (folder / "b_progressive.jpg").read_bytes()
    (tmp_path / "cut.jpg").write_bytes(progressive[: len(progressive) // 2])
    assert main(["decode", "--backend", "model", "--json", str(tmp_path / "cut.jpg"),
                 str(folder / "zz_junk.jpg")]) == 1
    cut, junk = json.loads(capsys.readouterr().out)["results"]
    # The model declines the progressive file; then Pillow fails on the truncation.
    assert (cut["status"], cut["declined"]) == ("error", "progressive")
    assert cut["detail"] and junk["detail"]
    assert main(["decode", "--backend", "model", str(folder / "zz_junk.jpg")]) == 1
    line = capsys.readouterr().out.splitlines()[0]
    assert line.startswith("error") and line.endswith(f"zz_junk.jpg: {junk['detail']}")


def test_a_png_that_cannot_be_written_fails_that_sample_only(tmp_path, capsys):
    src = tmp_path / "src"
    (src / "x.jpg.png").mkdir(parents=True)
    Image.new("RGB", (8, 8), (9, 0, 0)).save(src / "x.jpg")
    Image.new("RGB", (16, 16), (0, 9, 0)).save(src / "x.jpg.png" / "y.jpg")
    out = tmp_path / "out"
    assert main(["decode", "--backend", "cpu", "--json", "--out", str(out), str(src)]) == 1
    report = json.loads(capsys.readouterr().out)
    x, y = report["results"]
    assert x["status"] == y["status"] == "ok"
    assert x["png"] == str(out / "x.jpg.png") and _pillow(out / "x.jpg.png").shape == (8, 8, 3)
    # y's PNG would go inside x's PNG file.
    assert "png" not in y and y["png_error"].startswith(("NotADirectoryError", "FileExistsError"))
    assert report["summary"]["png_not_written"] == 1
    # The text summary says so too, not only the exit code and stderr.
    assert main(["decode", "--backend", "cpu", "--out", str(out), str(src)]) == 1
    assert "2 inputs: 2 ok, 0 fallback, 0 error, 1 PNG(s) not written" in capsys.readouterr().out


def test_folders_linked_in_are_walked_once_and_empty_arguments_reported(folder, tmp_path, capsys):
    (folder / "sub" / "loop").symlink_to(folder)
    (tmp_path / "empty").mkdir()
    assert main(["decode", "--backend", "cpu", "--json", str(folder / "sub")]) == 1   # the junk file
    paths = [r["path"] for r in json.loads(capsys.readouterr().out)["results"]]
    names = sorted(os.path.basename(p) for p in paths)
    assert names == ["a.jpg", "b_progressive.jpg", "c.JPEG", "d.jpg", "zz_junk.jpg"]
    assert main(["decode", "--backend", "cpu", str(tmp_path / "empty")]) == 1
    assert f"no files under {tmp_path / 'empty'}" in capsys.readouterr().err


def test_bad_usage_exits_2(tmp_path):
    (tmp_path / "a-file").write_bytes(b"")
    for argv in (["build", "--verilog", str(tmp_path)], ["build", "--verilog", str(tmp_path / "x.v"), "--check"],
                 ["build", "--board", "pynq-z2", "--out", str(tmp_path / "a-file")],
                 ["decode", "--backend", "pynq", "--board", "bogus", "--binary", "x.bit", "x.jpg"],
                 ["decode", "--backend", "xrt", "--board", "pynq-z2", "--binary", "x.bit", "x.jpg"],
                 ["build", "--board", "pynq-z2", "--out", str(tmp_path / "b"), "--verilog", str(tmp_path / "x.v")],
                 ["decode"], ["decode", "--backend", "nope", "x.jpg"], ["frobnicate"],
                 ["decode", "--backend", "sim", "--lanes", "0", "x.jpg"], ["decode", "--max-width", "-1", "x.jpg"],
                 ["predict", "--model", "resnet18", "--batch-size", "-4"], ["predict", "--gpus", "0"],
                 ["predict", "--nodes", "0"], ["predict", "--image-size", "0"], ["train", "--batch-size", "0"],
                 ["build", "--verilog", str(tmp_path / "no-such-folder" / "x.v")],
                 ["bench", "host", "--epochs", "0"], ["bench", "loader", "--batch-size", "0"],
                 ["bench", "loader", "--sim-lanes", "1,,2"], ["bench", "device", "--lanes", "1,0"],
                 ["bench", "parse", "--limit", "-1"], ["bench", "records", "--rounds", "0"]):
        done = subprocess.run([sys.executable, "-m", "dlbooster", *argv], capture_output=True, text=True)
        assert done.returncode == 2, argv
        assert "Traceback" not in done.stderr, argv


def test_build_names_a_missing_or_wrong_folder_for_the_verilog(tmp_path):
    """A missing parent folder is named as missing, a file in its place as not a folder,
    worded as ``records write`` words them (both said "is not a folder" before)."""
    (tmp_path / "a-file").write_bytes(b"")
    for parent, said in ((tmp_path / "no-such-folder", "no such folder"), (tmp_path / "a-file", "not a folder")):
        done = subprocess.run([sys.executable, "-m", "dlbooster", "build", "--verilog", str(parent / "x.v")],
                              capture_output=True, text=True)
        assert done.returncode == 2
        assert done.stderr.strip() == f"dlbooster build: {parent}: {said}"


def test_out_of_range_options_are_refused_when_parsed(tmp_path):
    """Lanes beyond the registers' 32, devices PyTorch cannot name, counts below 1: each
    is refused by argparse, naming the option, before any work starts (a traceback,
    an assertion in the gateware, or a run with nonsense settings before)."""
    src = tmp_path / "src"
    src.mkdir()
    for flag, argv in (("--lanes", ["bench", "device", "--lanes", "64"]),
                       ("--sim-lanes", ["bench", "loader", "--sim-lanes", "1,33"]),
                       ("--lanes", ["bench", "host", "--lanes", "33"]),
                       ("--lanes", ["decode", "--backend", "sim", "--lanes", "33", "x.jpg"]),
                       ("--lanes", ["build", "--verilog", str(tmp_path / "x.v"), "--lanes", "40"]),
                       ("--device", ["bench", "backward", "--device", "tpu"]),
                       ("--device", ["train", "--device", "tpu"]), ("--device", ["train", "--device", "cuda:x"]),
                       ("--epochs", ["train", "--epochs", "0"]), ("--steps", ["train", "--steps", "-1"]),
                       ("--workers", ["train", "--workers", "0"]), ("--streams", ["train", "--streams", "0"]),
                       ("--workers", ["records", "write", str(src), str(tmp_path / "out"), "--workers", "0"]),
                       ("--images-per-record", ["records", "write", str(src), str(tmp_path / "out"),
                                                "--images-per-record", "0"]),
                       ("--ready", ["debug-lane", "x.jpg", "--ready", "0"]),
                       ("--valid", ["debug-lane", "x.jpg", "--valid", "101"]),
                       ("--procs", ["predict", "calibrate", "--procs", "0"]),
                       ("--rounds", ["predict", "validate", "--rounds", "0"]),
                       ("--recode", ["bench", "lane", "--recode", "4:1:1@90"]),
                       ("--recode", ["bench", "lane", "--recode", "4:2:0@101"])):
        done = subprocess.run([sys.executable, "-m", "dlbooster", *argv], capture_output=True, text=True)
        assert done.returncode == 2, argv
        assert f"error: argument {flag}" in done.stderr, (argv, done.stderr)


def test_board_backends_that_cannot_open_give_one_line(folder):
    """A board backend without its board and binary is a usage error (2); a named board
    that cannot be opened fails the command (1); neither prints a traceback."""
    photo = str(folder / "a.jpg")
    cases = [(["--backend", "pynq"], {}, 2, "needs a board and its binary: board= and binary="),
             (["--backend", "xrt", "--board", "alveo-u50", "--binary", str(folder / "none.xclbin")], {}, 1,
              "none.xclbin: no such file"),
             ([], {"DLBOOSTER_BOARD": "pynq-z2", "DLBOOSTER_BINARY": str(folder / "none.bit")}, 1,
              "backend auto: " + str(folder / "none.bit") + ": no such file"),
             ([], {"DLBOOSTER_BOARD": "bogus", "DLBOOSTER_BINARY": str(folder / "none.bit")}, 1,
              "unknown board 'bogus'")]
    for options, env, code, message in cases:
        environ = {k: v for k, v in os.environ.items() if not k.startswith("DLBOOSTER_B")}
        done = subprocess.run([sys.executable, "-m", "dlbooster", "decode", *options, photo],
                              capture_output=True, text=True, env={**environ, **env})
        assert done.returncode == code, (options, env, done.stderr)
        assert done.stderr.startswith("dlbooster decode: ") and message in done.stderr, done.stderr
        assert "Traceback" not in done.stderr


def test_debug_lane_names_a_missing_input_before_simulating(tmp_path, capsys):
    (tmp_path / "a.jpg").write_bytes(_jpeg(np.zeros((8, 8, 3), np.uint8)))
    assert main(["debug-lane", str(tmp_path / "a.jpg"), str(tmp_path / "nosuch.jpg")]) == 2
    assert capsys.readouterr().err == f"dlbooster debug-lane: {tmp_path / 'nosuch.jpg'}: No such file or directory\n"
    (tmp_path / "empty").mkdir()
    assert main(["debug-lane", str(tmp_path / "empty")]) == 2
    assert capsys.readouterr().err.endswith("dlbooster debug-lane: no input files\n")


def test_train_on_a_board_that_cannot_open_gives_one_line(tmp_path):
    """`dlbooster train` takes --board and --binary as `decode` does (the board
    backends' message names them), and a board that cannot be opened is one line."""
    for label in ("a", "b"):
        (tmp_path / "data" / label).mkdir(parents=True)
        for i in range(5):
            Image.new("RGB", (16, 16), (40 * i, 0, 0)).save(tmp_path / "data" / label / f"{i}.jpg")
    data = str(tmp_path / "data")
    cases = [(["--backend", "xrt"], {}, 2, "needs a board and its binary"),
             (["--backend", "xrt", "--board", "alveo-u50", "--binary", str(tmp_path / "none.xclbin")], {}, 1,
              "backend xrt: " + str(tmp_path / "none.xclbin") + ": no such file"),
             ([], {"DLBOOSTER_BOARD": "alveo-u50", "DLBOOSTER_BINARY": str(tmp_path / "none.xclbin")}, 1,
              "backend auto: " + str(tmp_path / "none.xclbin") + ": no such file")]
    for options, env, code, message in cases:
        environ = {k: v for k, v in os.environ.items() if not k.startswith("DLBOOSTER_B")}
        done = subprocess.run([sys.executable, "-m", "dlbooster", "train", data, "--steps", "1",
                               "--batch-size", "2", "--image-size", "32", *options],
                              capture_output=True, text=True, env={**environ, **env})
        assert done.returncode == code, (options, env, done.stderr)
        last = done.stderr.strip().splitlines()[-1]
        assert last.startswith("dlbooster train: ") and message in last, done.stderr
        assert "Traceback" not in done.stderr and "unrecognized arguments" not in done.stderr


def test_train_refuses_bad_settings_before_it_announces_a_run(tmp_path):
    """A setting only the training code can judge (an unknown model, label smoothing
    above 1) is refused with one line and exit 2, and no "training ..." banner first."""
    for argv, said in ((["--model", "no_such_model"], "unknown torchvision classification model 'no_such_model'"),
                       (["--label-smoothing", "2"], "label_smoothing must be between 0 and 1, not 2.0")):
        done = subprocess.run([sys.executable, "-m", "dlbooster", "train", *argv], capture_output=True,
                              text=True, cwd=tmp_path)
        assert done.returncode == 2, argv
        assert done.stderr.strip() == f"dlbooster train: {said}", argv
        assert done.stdout == ""


def test_output_cut_short_by_its_reader_ends_quietly(tmp_path):
    """`dlbooster decode ... | head -1`: the closed pipe ends the command without a traceback."""
    for i in range(400):                  # about 100 KB of JSON, more than a pipe holds
        Image.new("RGB", (8, 8), (i % 256, 0, 0)).save(tmp_path / f"{i:03}.jpg")
    proc = subprocess.Popen([sys.executable, "-m", "dlbooster", "decode", "--backend", "cpu", "--json",
                             str(tmp_path)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert proc.stdout.readline() == "{\n"
    proc.stdout.close()
    stderr = proc.stderr.read()
    assert proc.wait() == 1 and "Traceback" not in stderr and "BrokenPipeError" not in stderr, stderr


def test_bench_names_an_unreadable_input(tmp_path, capsys):
    (tmp_path / "a.jpg").write_bytes(make_jpeg(16, 16))
    for argv, message in ((["parse", str(tmp_path / "missing.jpg")],
                           f"dlbooster bench: {tmp_path / 'missing.jpg'}: No such file"),
                          (["records", str(tmp_path / "none")],
                           f"dlbooster bench records: {tmp_path / 'none'}: no such folder"),
                          (["records", str(tmp_path / "a.jpg")],
                           f"dlbooster bench records: {tmp_path / 'a.jpg'}: not a folder")):
        assert main(["bench", *argv]) == 2, argv
        assert message in capsys.readouterr().err, argv


def test_bench_refuses_before_measuring(tmp_path, capsys, monkeypatch):
    """Each of these printed a traceback, or a table of nothing, or lost a finished
    run's figures to an unwritable --json (helper-54's trial): now one line, exit 2,
    before any measurement."""
    photo = tmp_path / "a.jpg"
    photo.write_bytes(make_jpeg(24, 16))
    progressive = tmp_path / "p.jpg"
    progressive.write_bytes(make_jpeg(24, 16, progressive=True))
    text = tmp_path / "text"
    text.mkdir()
    (text / "a.txt").write_text("not an image")
    classes = tmp_path / "classes"
    (classes / "a").mkdir(parents=True)
    (classes / "a" / "notes.txt").write_text("no images")
    good = tmp_path / "good"
    good.mkdir()
    (good / "a.jpg").write_bytes(photo.read_bytes())
    fake = tmp_path / "fake"
    fake.mkdir()
    (fake / "t.jpg").write_text("a .jpg that is not a JPEG")
    (tmp_path / "zero.jpg").write_bytes(b"")

    def measured(*args, **kwargs):
        raise AssertionError("a refused benchmark measured")
    # Each refusal comes before the measurement: records are never written.
    monkeypatch.setattr("dlbooster.bench.records.bench_records", measured)
    cases = [(["parse", "--json", str(tmp_path / "nope" / "x.json"), str(photo)],
              f"dlbooster bench parse: --json {tmp_path / 'nope' / 'x.json'}: no such folder"),
             (["parse", "--json", str(tmp_path), str(photo)], f"dlbooster bench parse: --json {tmp_path}: a folder; "
                                                              f"give a file name"),
             (["decode", "--json", "", str(photo)], "dlbooster bench decode: --json: an empty path; give a file name"),
             (["entropy", str(progressive)], "dlbooster bench entropy: none of the 1 inputs is in the hardware"),
             (["idct", "--lanes", "1", "--ieee-blocks", "0", str(progressive)],
              "dlbooster bench idct: none of the 1 inputs is in the hardware profile"),
             (["lane", str(progressive)], "dlbooster bench lane: none of the 1 inputs is in the hardware profile "
                                          "at --max-width 8192"),
             (["device", "--max-width", "16", str(photo)],
              "dlbooster bench device: none of the 1 inputs is in the hardware profile at --max-width 16"),
             (["loader", str(text)], "dlbooster bench loader: Pillow decodes none of the 1 inputs"),
             (["records", str(text)], f"dlbooster bench records: {text}: no JPEG files"),
             (["records", str(good), str(classes)], f"dlbooster bench records: {classes}: Found no valid file "
                                                        f"for the classes a"),
             (["records", str(good), str(fake)], f"dlbooster bench records: {fake}: no JPEG files"),
             (["lane", "--recode", "4:2:0@90", str(text / "a.txt")],
              "dlbooster bench lane: Pillow could not re-encode any of the 1 inputs"),
             (["lane", "--all", str(tmp_path / "zero.jpg")], "dlbooster bench lane: none of the 1 inputs has any "
                                                            "bytes"),
             (["parse", "--json", "/proc/x.json", str(photo)], "dlbooster bench parse: --json /proc/x.json: "),
             (["records", "--train-epochs", "1", str(good)],
              "dlbooster bench records: --train-epochs trains on a DATASET with train/ and val/"),
             (["backward", "--model", "nosuch"], "dlbooster bench backward: --model nosuch: not a torchvision "
                                                 "classification model"),
             (["backward", "--model", "raft_small"], "dlbooster bench backward: --model raft_small: not a "
                                                     "torchvision classification model")]
    import torch

    if not torch.cuda.is_available():
        cases.append((["backward", "--device", "cuda"], "dlbooster bench backward: --device cuda, but PyTorch "
                                                        "finds 0 CUDA device(s) here"))
    cases.append((["backward", "--device", "cuda:99"], "dlbooster bench backward: --device cuda:99, but PyTorch "
                                                       "finds"))
    for argv, message in cases:
        assert main(["bench", *argv]) == 2, argv
        err = capsys.readouterr().err
        assert err.startswith(message) and err.count("\n") == 1, (argv, err)
    # bench decode stops at the first backend that leaves no input to compare: Pillow,
    # the second, never runs.
    with monkeypatch.context() as patched:
        patched.setattr("dlbooster.bench.decoder.decode_pillow", measured)
        assert main(["bench", "decode", "--backends", "model,pillow", str(progressive)]) == 2
    assert capsys.readouterr().err == "dlbooster bench decode: no input of the 1 decodes with every one of model\n"
    monkeypatch.setenv("DLBOOSTER_CORPUS", str(tmp_path / "elsewhere"))
    assert main(["bench", "parse"]) == 2
    assert capsys.readouterr().err == f"dlbooster bench parse: DLBOOSTER_CORPUS={tmp_path / 'elsewhere'}: " \
                                      f"no such folder\n"


def test_bench_options_are_checked_when_parsed():
    for flag, argv in (("--backends", ["decode", "--backends", "foo"]), ("--backends", ["decode", "--backends", ""]),
                       ("--lanes", ["idct", "--lanes", "3"]), ("--lanes", ["idct", "--lanes", ""]),
                       ("--lanes", ["device", "--lanes", ""]), ("--ieee-blocks", ["idct", "--ieee-blocks", "100"]),
                       ("--fidelities", ["records", "--fidelities", "abc"]),
                       ("--fidelities", ["records", "--fidelities", "0"]),
                       ("--dtype", ["backward", "--dtype", "fp16"]), ("--dtype", ["backward", "--dtype", ""]),
                       ("--backends", ["decode", "--backends", "pillow,pillow"]),
                       ("--ready", ["entropy", "--ready", "101"]), ("--ready", ["entropy", "--ready", "5000000000"])):
        done = subprocess.run([sys.executable, "-m", "dlbooster", "bench", *argv], capture_output=True, text=True)
        assert done.returncode == 2 and f"error: argument {flag}" in done.stderr, (argv, done.stderr)
    done = subprocess.run([sys.executable, "-m", "dlbooster", "bench", "records", "--backends", "cpu"],
                          capture_output=True, text=True)
    assert done.returncode == 2 and "unrecognized arguments: --backends" in done.stderr


def test_bench_default_inputs_are_the_corpus_photographs(tmp_path, monkeypatch, capsys):
    """Without PATH a benchmark reads the corpus's ImageNet sample photographs, not the
    ``_provenance.tsv`` listed beside them (it was timed as a failing input)."""
    photos = tmp_path / "corpus" / "imagenet-sample-images"
    photos.mkdir(parents=True)
    jpegs = {"n01_a.JPEG": make_jpeg(16, 16), "n02_b.jpg": make_jpeg(24, 16)}
    for name, data in jpegs.items():
        (photos / name).write_bytes(data)
    provenance = "file\tsource\n"
    (photos / "_provenance.tsv").write_text(provenance)
    monkeypatch.setenv("DLBOOSTER_CORPUS", str(tmp_path / "corpus"))
    assert main(["bench", "parse", "--repeat", "1", "--json", "-"]) == 0
    result = json.loads(capsys.readouterr().out)
    sizes = [len(data) for data in jpegs.values()]
    assert (result["files"], result["classification"]) == (2, {"None": 2})
    assert result["bytes_mean"] == pytest.approx(sum(sizes) / 2)
    # A folder given by name: every file in it.
    assert main(["bench", "parse", "--repeat", "1", "--json", "-", str(photos)]) == 0
    result = json.loads(capsys.readouterr().out)
    assert (result["files"], result["classification"]) == (3, {"None": 2, "not-jpeg": 1})
    assert result["bytes_mean"] == pytest.approx((sum(sizes) + len(provenance)) / 3)


def test_bench_without_inputs_says_so(tmp_path, capsys):
    """An empty folder, or inputs none of which decodes, is a message (exit 2), not a
    traceback from the statistics of no files."""
    empty = tmp_path / "empty"
    empty.mkdir()
    (tmp_path / "zero.jpg").write_bytes(b"")
    cases = [([kind, str(empty)], f"dlbooster bench {kind}: no input files") for kind in ("parse", "decode", "host",
                                                                                           "loader")]
    cases += [(["records", str(empty)], f"dlbooster bench records: {empty}: no files"),
              (["host", str(tmp_path / "zero.jpg")], "dlbooster bench host: none of the 1 inputs decodes")]
    for argv, message in cases:
        assert main(["bench", *argv]) == 2, argv
        assert message in capsys.readouterr().err, argv


def test_bench_loader_runs_both_loaders_round_by_round_and_judges_the_medians(tmp_path, capsys):
    """bench loader (its goal: 1.3x torchvision's loader) on a few generated JPEGs: each round times every
    image through both loaders; the speed-up is the ratio of the two medians of the
    rounds, and the goal is judged on it."""
    import statistics

    for n in range(6):
        (tmp_path / f"{n}.jpg").write_bytes(make_jpeg(48 + 8 * n, 40, subsampling=n % 3))
    out = tmp_path / "loader.json"
    assert main(["bench", "loader", str(tmp_path), "--epochs", "1", "--rounds", "3", "--batch-size", "2",
                 "--size", "16", "--workers", "1", "--json", str(out)]) == 0
    printed = capsys.readouterr().out
    result = json.loads(out.read_text())
    assert (result["files"], result["left_out"], result["epochs"], result["rounds"]) == (6, [], 1, 3)
    medians = {}
    for kind in ("torchvision", "dlbooster_cpu"):
        rounds = result[kind]["rounds"]
        assert [r["images"] for r in rounds] == [6] * 3
        for r in rounds:
            assert r["images_per_s"] == pytest.approx(r["images"] / r["wall_s"])
        medians[kind] = statistics.median(r["images_per_s"] for r in rounds)
        assert result[kind]["images_per_s"] == pytest.approx(medians[kind])
    assert result["dlbooster_cpu"]["outcomes"] == {"ok": 6}
    assert result["speedup"] == pytest.approx(medians["dlbooster_cpu"] / medians["torchvision"])
    assert result["goal_met"] == (result["speedup"] >= result["goal_speedup"] == 1.3)
    assert f"{result['speedup']:.2f}x" in printed


def test_bench_host_alternates_the_instrument_and_judges_the_control(tmp_path, capsys):
    """bench host runs a warm-up, then rounds of one epoch with the instrument writing
    pixels and one control epoch, in alternating order; the goal is judged on the
    control epochs' median, and both figures are printed and written."""
    for n in range(3):
        (tmp_path / f"{n}.jpg").write_bytes(make_jpeg(40 + 8 * n, 24, subsampling=n))
    out = tmp_path / "host.json"
    assert main(["bench", "host", str(tmp_path), "--epochs", "3", "--batch-size", "2", "--json", str(out)]) == 0
    printed = capsys.readouterr().out
    result = json.loads(out.read_text())
    rows = result["epochs"]
    assert [(r["round"], r["pixels"]) for r in rows] == [(1, False), (1, True), (2, True), (2, False),
                                                         (3, False), (3, True)]
    assert all(r["images"] == 3 for r in rows) and result["cpus"] == len(os.sched_getaffinity(0))
    control = sorted(r["host_us_per_image"] for r in rows if not r["pixels"])
    written = sorted(r["host_us_per_image"] for r in rows if r["pixels"])
    assert result["host_us_per_image"] == pytest.approx(control[1])
    assert result["with_pixel_writes_us_per_image"] == pytest.approx(written[1])
    assert result["goal_met"] == (control[1] <= 20.0)
    assert printed.count("no (control)") == 3 and "thread CPU, median of the control epochs" in printed
    assert f"host cost {control[1]:.1f} us/image without file reads" in printed
    assert f"host cost {written[1]:.1f} us/image without file reads" in printed


def test_an_interrupted_png_write_leaves_no_file(tmp_path, monkeypatch):
    """decode --out: Ctrl-C or SIGTERM mid-write left a truncated PNG under its final name."""
    from dlbooster.support.files import save_png

    real_save = Image.Image.save

    def interrupted(self, fp, *args, **kwargs):
        real_save(self, fp, *args, **kwargs)
        raise KeyboardInterrupt
    image, target = np.zeros((4, 6, 3), np.uint8), tmp_path / "out" / "a.png"
    monkeypatch.setattr(Image.Image, "save", interrupted)
    with pytest.raises(KeyboardInterrupt):
        save_png(image, target)
    assert list(target.parent.iterdir()) == []
    monkeypatch.undo()
    save_png(image, target)
    assert list(target.parent.iterdir()) == [target] and Image.open(target).size == (6, 4)
    # A name at the file-name limit (255 bytes) is written too: the partial file's own
    # name is short.
    long = tmp_path / "out" / ("x" * 251 + ".png")
    save_png(image, long)
    assert Image.open(long).size == (6, 4) and len(list(target.parent.iterdir())) == 2


def _demo_sent_sigterm(tmp_path, **popen) -> tuple[subprocess.Popen, str, str, Path]:
    """``dlbooster demo`` in a child with its own TMPDIR, sent SIGTERM once it has written
    a JPEG there; returns the process, its output and error text, and that folder."""
    from dlbooster.support.samples import packaged_photos

    if not packaged_photos():
        pytest.skip("no packaged photographs (scikit-image not installed)")
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    proc = subprocess.Popen([sys.executable, "-m", "dlbooster", "demo"], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env={**os.environ, "TMPDIR": str(tmp)}, **popen)
    try:
        deadline = time.monotonic() + 60
        while not any(tmp.rglob("*.jpg")) and time.monotonic() < deadline and proc.poll() is None:
            time.sleep(0.02)
        assert any(tmp.rglob("*.jpg")), "demo wrote no JPEG to its temporary folder"
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=300)
    finally:
        proc.kill()
    return proc, out, err, tmp


def test_an_ignored_sigterm_stays_ignored(tmp_path):
    """A command started with SIGTERM ignored (``trap '' TERM``, some supervisors) keeps
    ignoring it, as Python keeps an ignored SIGINT: demo, signalled mid-run, finishes. A
    command leaves SIGTERM's handler as it found it."""
    from dlbooster.support.samples import packaged_photos

    proc, out, err, tmp = _demo_sent_sigterm(tmp_path, preexec_fn=lambda: signal.signal(signal.SIGTERM,
                                                                                          signal.SIG_IGN))
    n = 6 * len(packaged_photos())        # six JPEG variants of each photograph
    assert proc.returncode == 0 and "terminated" not in err, err
    assert f"{n} inputs: {n} ok, 0 fallback, 0 error, 0 differ from Pillow" in out
    assert list(tmp.iterdir()) == []
    previous = signal.getsignal(signal.SIGTERM)
    assert main(["records", "info", str(tmp_path / "none")]) == 2
    assert signal.getsignal(signal.SIGTERM) is previous


def test_sigterm_ends_a_command_as_ctrl_c_does(tmp_path):
    """SIGTERM (kill, a batch system's time limit) left demo's temporary JPEGs behind and
    printed nothing; it now unwinds as Ctrl-C does: the temporary folder is removed,
    one line says so, and the exit status is 143."""
    proc, _, err, tmp = _demo_sent_sigterm(tmp_path)
    assert proc.returncode == 143, err
    assert err.endswith("dlbooster demo: terminated\n") and "Traceback" not in err, err
    assert list(tmp.iterdir()) == []


def test_demo_decodes_every_photo_equal_to_pillow(capsys):
    from dlbooster.support.samples import packaged_photos

    if not packaged_photos():
        pytest.skip("no packaged photographs (scikit-image not installed)")
    assert main(["demo"]) == 0
    out = capsys.readouterr().out
    n = 6 * len(packaged_photos())        # six JPEG variants of each photograph
    assert f"{n} inputs: {n} ok, 0 fallback, 0 error, 0 differ from Pillow" in out


def test_bench_parse_writes_json(folder, tmp_path, capsys):
    target = tmp_path / "parse.json"
    assert main(["bench", "parse", "--repeat", "2", "--json", str(target), str(folder)]) == 0
    result = json.loads(target.read_text())
    assert result["files"] == 5
    for mode in ("full", "prescreen"):
        assert 0 < result[mode]["us_median"] <= result[mode]["us_p95"] <= result[mode]["us_max"]
    assert result["classification"] == {"None": 2, "progressive": 1, "not-jpeg": 1,
                                        "malformed-header": 1}
    assert "us median" in capsys.readouterr().out
    # --json -: the JSON alone on stdout (for a pipe), the table on stderr. (The folder
    # now holds parse.json as well.)
    assert main(["bench", "parse", "--repeat", "2", "--json", "-", str(folder)]) == 0
    out, err = capsys.readouterr()
    assert json.loads(out)["classification"] == {**result["classification"], "not-jpeg": 2} and "us median" in err
    assert not (Path.cwd() / "-").exists()


def test_bench_decode_table(folder, tmp_path, capsys):
    target = tmp_path / "decode.json"
    assert main(["bench", "decode", "--json", str(target), str(folder / "a.jpg"),
                 str(folder / "b_progressive.jpg")]) == 0
    rows = {r["backend"]: r for r in json.loads(target.read_text())["results"]}
    # Every row times the one image all three decode; the model declines the progressive one.
    assert [(r["images"], r["decoded"], r["declined"]) for r in rows.values()] == [(1, 2, 0), (1, 2, 0), (1, 1, 1)]
    assert all(r["images_per_s"] > 0 for r in rows.values())
    assert "timed: the images every backend decodes" in capsys.readouterr().out


def test_version_and_python_dash_m():
    """`python -m dlbooster --version` names the installed distribution's version, as
    `dlbooster --version` and `dlbooster.__version__` do."""
    from importlib import metadata

    import dlbooster

    assert dlbooster.__version__ == metadata.version("dlbooster") != "unknown"
    done = subprocess.run([sys.executable, "-m", "dlbooster", "--version"], capture_output=True, text=True)
    assert done.returncode == 0 and done.stdout == f"dlbooster {dlbooster.__version__}\n", done
    done = subprocess.run([sys.executable, "-m", "dlbooster", "decode"], capture_output=True, text=True)
    assert done.returncode == 2 and "the following arguments are required: PATH" in done.stderr
