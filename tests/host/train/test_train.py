"""The main job: ``dlbooster train`` on real photographs, cpu and simulated decoder,
autograd and split backward, checkpoint/resume, torchrun with two gloo ranks."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import warnings
from dataclasses import replace
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("torchvision")
pytest.importorskip("skimage")

from dlbooster.train.trainer import TrainConfig, photo_dataset, train  # noqa: E402

# Small and quick: 64-pixel crops, batch 8 (15 batches per epoch of the photo set).
BASE = TrainConfig(backend="cpu", batch_size=8, image_size=64, lr=0.05, workers=1, device="cpu")


@pytest.fixture(scope="module")
def photos(tmp_path_factory):
    return str(photo_dataset(tmp_path_factory.mktemp("photos")))


def _state(path):
    return torch.load(path, weights_only=False)


def _same_model(a, b) -> bool:
    sa, sb = _state(a)["model"], _state(b)["model"]
    return sa.keys() == sb.keys() and all(torch.equal(sa[k], sb[k]) for k in sa)


def test_photo_dataset(photos):
    from PIL import Image

    from dlbooster.support.samples import packaged_photos

    root = Path(photos)
    classes = sorted(p.name for p in (root / "train").iterdir())
    assert classes == sorted(p.stem for p in packaged_photos())
    for split, per_class in (("train", 8), ("val", 2)):
        for cls in classes:
            files = sorted((root / split / cls).glob("*.jpg"))
            assert len(files) == per_class
            for f in files:
                with Image.open(f) as im:
                    assert im.format == "JPEG" and im.width <= 256 and im.height <= 256


def test_train_summary(photos, tmp_path):
    epochs = []
    summary = train(replace(BASE, data=photos, steps=4, checkpoint=str(tmp_path / "c.pt")),
                    on_epoch=epochs.append)
    assert summary["steps"] == 4 and summary["images"] == 32
    assert summary["backend"] == "cpu" and summary["backward"] == "autograd"
    assert summary["classes"] == 15 and summary["world_size"] == 1
    # Outcomes count what the loader decoded, the prefetched batches included.
    assert list(summary["outcomes"]) == ["ok"] and summary["outcomes"]["ok"] >= 32
    assert summary["fallbacks"] == 0
    assert summary["loss_first"] > 0 and summary["loss_last"] > 0
    assert 0.0 <= summary["val_top1"] <= 1.0
    assert summary["images_per_s"] > 0 and summary["host_cores"] > 0
    assert len(epochs) == 1 and epochs[0]["steps"] == 4
    state = _state(tmp_path / "c.pt")
    assert (state["step"], state["epoch"], state["batches_done"]) == (4, 0, 4)
    assert state["sampler"]["start"] == 32
    # The optimizer moved every trainable tensor away from the seeded initial model.
    import torchvision

    torch.manual_seed(BASE.seed)
    initial = torchvision.models.get_model(BASE.model, num_classes=15).state_dict()
    trained = state["model"]
    names = [name for name, p in torchvision.models.get_model(BASE.model, num_classes=15).named_parameters()]
    assert sorted(names) == sorted(k for k in names if k in trained) and len(names) > 50
    unchanged = [name for name in names if torch.equal(initial[name], trained[name].cpu())]
    assert not unchanged


def test_bad_settings_are_usage_errors(photos, capsys):
    from dlbooster.cli import main

    with pytest.raises(SystemExit) as parsed:         # refused by the argument parser
        main(["train", photos, "--backend", "cpu", "--epochs", "0"])
    assert parsed.value.code == 2
    assert "argument --epochs: must be at least 1, not 0" in capsys.readouterr().err
    with pytest.raises(ValueError, match="epochs must be at least 1, not 0"):   # and by train() itself
        train(replace(BASE, data=photos, epochs=0))
    assert main(["train", photos, "--backend", "cpu", "--steps", "1", "--model", "nosuchnet"]) == 2
    assert main(["train", photos + "/missing", "--backend", "cpu", "--steps", "1"]) == 2


def test_recipe_settings_out_of_range_are_usage_errors(photos, capsys):
    from dlbooster.cli import main

    assert main(["train", photos, "--backend", "cpu", "--steps", "1", "--warmup-epochs", "-1"]) == 2
    assert "warmup_epochs must be a finite number of at least 0, not -1" in capsys.readouterr().err
    assert main(["train", photos, "--backend", "cpu", "--steps", "1", "--label-smoothing", "2"]) == 2
    assert "label_smoothing must be between 0 and 1, not 2" in capsys.readouterr().err


def test_options_that_failed_late_or_silently_are_refused_first(photos, tmp_path, capsys):
    """Each of these trained to a loss of nan, failed in PyTorch with a traceback, failed
    only at the first checkpoint after an epoch of training, or did nothing (helper-56's
    trial): now a one-line usage error before any training."""
    from dlbooster.cli import main

    (tmp_path / "a.jpg").write_bytes(b"\xff\xd8")
    cases = [(["--lr", "nan"], "lr must be a finite number of at least 0, not nan"),
             (["--lr", "inf"], "lr must be a finite number of at least 0, not inf"),
             (["--weight-decay", "-1"], "weight_decay must be a finite number of at least 0, not -1"),
             (["--momentum", "nan"], "momentum must be a finite number of at least 0, not nan"),
             (["--warmup-epochs", "inf"], "warmup_epochs must be a finite number of at least 0, not inf"),
             (["--seed", str(2**64 - 1)], "seed must be in [-2**63, 2**63), not"),
             (["--checkpoint", ""], "checkpoint: an empty path; give a file name"),
             (["--devices", "33"], "devices must be at most 32"),
             (["--resume"], "resume needs a checkpoint file"),
             (["--checkpoint-every", "2"], "checkpoint_every needs a checkpoint file"),
             (["--checkpoint", str(tmp_path / "nodir" / "c.pt")],
              f"checkpoint {tmp_path / 'nodir' / 'c.pt'}: no such folder {tmp_path / 'nodir'}"),
             (["--checkpoint", str(tmp_path)], f"checkpoint {tmp_path}: a folder; give a file name"),
             (["--trace", str(tmp_path / "nodir" / "t.json")], f"trace {tmp_path / 'nodir' / 't.json'}: no such "
                                                               f"folder"),
             # Found before training (it was a traceback after the epoch): a path the
             # file system refuses, and a learning rate the optimiser's float32 cannot hold.
             (["--checkpoint", "/proc/self/c.pt"], "checkpoint /proc/self/c.pt: "),
             (["--lr", "1e308"], "lr must be at most 3.40282e+38 (float32), not 1e+308"),
             (["--model", "alexnet", "--image-size", "32"], "alexnet does not run on 32x32-pixel images (")]
    for argv, message in cases:
        assert main(["train", photos, "--backend", "cpu", "--steps", "1", *argv]) == 2, argv
        err = capsys.readouterr().err
        assert f"dlbooster train: {message}" in err and "Traceback" not in err, (argv, err)
    assert not list(tmp_path.glob("*.tmp"))
    assert main(["train", str(tmp_path / "a.jpg"), "--backend", "cpu", "--steps", "1"]) == 2
    assert f"dlbooster train: {tmp_path / 'a.jpg'}: not a folder" in capsys.readouterr().err
    # A class folder without images: the message names the folder it was read from.
    for split in ("train", "val"):
        for cls in ("ants", "wasps"):
            (tmp_path / "data" / split / cls).mkdir(parents=True)
        shutil.copy(next(Path(photos).rglob("*.jpg")), tmp_path / "data" / split / "ants")
    shutil.copy(next(Path(photos).rglob("*.jpg")), tmp_path / "data" / "train" / "wasps")
    assert main(["train", str(tmp_path / "data"), "--backend", "cpu", "--steps", "1"]) == 2
    assert (f"dlbooster train: {tmp_path / 'data' / 'val'}: Found no valid file for the classes wasps"
            in capsys.readouterr().err)


def test_an_interrupted_checkpoint_save_leaves_no_partial_file(photos, tmp_path, monkeypatch):
    """Ctrl-C or SIGTERM while torch.save writes left CHECKPOINT.tmp behind (tens of MB)."""
    import torch

    real_save = torch.save

    def interrupted(state, path):
        real_save({"partial": True}, path)
        raise KeyboardInterrupt
    monkeypatch.setattr(torch, "save", interrupted)
    with pytest.raises(KeyboardInterrupt):
        train(replace(BASE, data=photos, steps=1, checkpoint=str(tmp_path / "c.pt")))
    assert list(tmp_path.iterdir()) == []


def test_an_output_the_file_system_refuses_after_the_checks_is_one_line(photos, tmp_path, monkeypatch, capsys):
    """A checkpoint torch cannot write (its writer raises RuntimeError for the OS's
    error) ended the run in a traceback; now one line and exit 1."""
    import torch

    from dlbooster.cli import main

    argv = ["train", photos, "--backend", "cpu", "--batch-size", "8", "--image-size", "64", "--workers", "1",
            "--device", "cpu", "--steps", "1"]

    def refused(state, path):
        raise RuntimeError(f"[enforce fail at inline_container.cc:747] . open file failed because of errno 30 "
                           f"on fopen: Read-only file system, file path: {path}\nmore lines")
    with monkeypatch.context() as m:
        m.setattr(torch, "save", refused)
        assert main([*argv, "--checkpoint", str(tmp_path / "c.pt")]) == 1
    err = capsys.readouterr().err
    assert err.endswith(f"dlbooster train: {tmp_path / 'c.pt'}: the checkpoint cannot be written ([enforce fail at "
                        f"inline_container.cc:747] . open file failed because of errno 30 on fopen: Read-only "
                        f"file system, file path: {tmp_path / 'c.pt.tmp'})\n"), err
    assert list(tmp_path.iterdir()) == []


@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="needs /dev/full (a write to it fails: disk full)")
def test_a_trace_that_cannot_be_written_is_reported_after_the_results(photos, capsys):
    from dlbooster.cli import main

    argv = ["train", photos, "--backend", "cpu", "--batch-size", "8", "--image-size", "64", "--workers", "1",
            "--device", "cpu", "--steps", "1"]
    assert main([*argv, "--trace", "/dev/full"]) == 1
    captured = capsys.readouterr()
    assert "\n1 steps, 8 images" in captured.out and "trace: " not in captured.out
    assert captured.err.endswith("dlbooster train: /dev/full: the trace cannot be written (No space left on "
                                 "device)\n"), captured.err


def test_a_records_folder_as_data_and_a_single_class_are_named(photos, tmp_path, caplog):
    import logging

    (tmp_path / "rec").mkdir()
    (tmp_path / "rec" / "records-00000.pcr").write_bytes(b"")
    with pytest.raises(FileNotFoundError, match=rf"{re.escape(str(tmp_path / 'rec'))}: holds record files, not "
                                                rf"class folders; give it as --records"):
        train(replace(BASE, data=str(tmp_path / "rec"), steps=1))
    one = tmp_path / "one" / "only"
    one.mkdir(parents=True)
    for n, path in enumerate(sorted(Path(photos).rglob("*.jpg"))[:4]):
        shutil.copy(path, one / f"{n}.jpg")
    with caplog.at_level(logging.WARNING, logger="dlbooster.train.trainer"):
        summary = train(replace(BASE, data=str(tmp_path / "one"), batch_size=2, steps=1))
    assert summary["classes"] == 1 and summary["loss_first"] == 0.0
    assert [r.getMessage() for r in caplog.records] == [
        "one class (only): every label is the same, the loss is 0 from the first step and training learns "
        "nothing; a data set needs two or more class folders"]


def test_a_final_batch_of_one_is_dropped(photos):
    """120 training images in batches of 7 leave one: batch norm cannot train on one
    sample at 32 pixels (a 1x1 map in ResNet-18's last stage), so that batch is dropped."""
    epochs = []
    summary = train(replace(BASE, data=photos, batch_size=7, image_size=32, epochs=1), on_epoch=epochs.append)
    assert summary["steps"] == 17 and summary["images"] == 119
    assert epochs[0]["steps"] == 17


def test_a_batch_of_one_trains_where_batch_norm_has_more_than_one_value(tmp_path):
    """One of each batch's two samples undecodable: at 64 pixels ResNet-18's smallest map
    is 2x2, so batch norm normalises one sample and every batch trains; at 32 pixels
    (a 1x1 map) none can, and the epoch ends in NoTrainingData naming the rule."""
    from PIL import Image

    from dlbooster.train.trainer import NoTrainingData

    for split in ("train", "val"):
        for cls in ("a", "b"):
            (tmp_path / split / cls).mkdir(parents=True)
            Image.new("RGB", (48, 40), (200, 30, 30)).save(tmp_path / split / cls / "good.jpg")
    for cls in ("a", "b"):
        (tmp_path / "train" / cls / "zbad.jpg").write_bytes(b"\xff\xd8 not a jpeg")
    config = replace(BASE, data=str(tmp_path), batch_size=2, epochs=1)
    summary = train(replace(config, image_size=64))
    assert summary["steps"] == 2 and summary["images"] == 2 and summary["untrained"] == 0
    with pytest.raises(NoTrainingData, match="fewer than 2 decoded sample"):
        train(replace(config, image_size=32))


def test_a_batch_size_of_one_where_batch_norm_needs_two_is_refused_before_training(photos):
    """At 32 pixels one sample leaves ResNet-18's last batch norm a 1x1 map: batch size 1
    can never take a step, so the run is refused up front, naming the rule."""
    with pytest.raises(ValueError, match="resnet18 at 32 pixels leaves a batch-norm layer one value per channel"):
        train(replace(BASE, data=photos, batch_size=1, image_size=32, steps=1))
    summary = train(replace(BASE, data=photos, batch_size=1, image_size=64, steps=1))
    assert summary["steps"] == 1 and summary["images"] == 1


def test_a_cuda_device_that_pytorch_cannot_find_is_refused(photos):
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has a CUDA device")
    with pytest.raises(ValueError, match="device cuda: PyTorch finds no CUDA device here"):
        train(replace(BASE, data=photos, device="cuda", steps=1))


def test_a_fixed_gpu_index_under_torchrun_is_refused(monkeypatch):
    """Under torchrun ``--device cuda:N`` would put every rank of a node on GPU N; the
    check names the rule (its CUDA queries stand in for a two-GPU machine: the check
    touches no device). A rank that sees only its own GPU may name it."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("LOCAL_RANK", "1")
    with pytest.raises(ValueError, match=r"device cuda:0 under torchrun: every rank of this node would use GPU 0; "
                                         r"give --device cuda .*\(this one 1\)"):
        replace(BASE, device="cuda:0", steps=1).check()
    assert replace(BASE, device="cuda:1", steps=1).check() == torch.device("cuda", 1)
    assert replace(BASE, device="cuda", steps=1).check() == torch.device("cuda")
    with pytest.raises(ValueError, match=r"device cuda:2: PyTorch finds 2 CUDA device\(s\) here"):
        replace(BASE, device="cuda:2", steps=1).check()
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)      # CUDA_VISIBLE_DEVICES per rank
    assert replace(BASE, device="cuda:0", steps=1).check() == torch.device("cuda", 0)
    with pytest.raises(ValueError, match=r"device cuda under torchrun: this rank's GPU, LOCAL_RANK 1, is not among "
                                         r"the 1 CUDA device\(s\) .*give --device cuda:0\)"):
        replace(BASE, device="cuda", steps=1).check()
    # srun or mpirun: RANK and WORLD_SIZE without LOCAL_RANK, which cannot be guessed.
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 8)
    monkeypatch.delenv("LOCAL_RANK")
    with pytest.raises(ValueError, match=r"device cuda with WORLD_SIZE above 1 but no LOCAL_RANK"):
        replace(BASE, device="cuda", steps=1).check()
    assert replace(BASE, device="cuda:1", steps=1).check() == torch.device("cuda", 1)
    monkeypatch.setenv("LOCAL_RANK", "x")
    with pytest.raises(ValueError, match=r"environment variable LOCAL_RANK='x' is not an integer"):
        replace(BASE, device="cuda", steps=1).check()


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_resume_after_a_crash(photos, tmp_path):
    """On a GPU the checkpoint loads onto the CPU first: the random states it restores
    must be CPU byte tensors (loaded onto the GPU, set_rng_state raised)."""
    resumed = str(tmp_path / "resumed.pt")
    config = replace(BASE, data=photos, steps=8, device="cuda")

    def crash(step, loss):
        if step == 4:
            raise KeyboardInterrupt
    with pytest.raises(KeyboardInterrupt):
        train(replace(config, checkpoint=resumed, checkpoint_every=2), on_step=crash)
    summary = train(replace(config, checkpoint=resumed, checkpoint_every=2, resume=True))
    assert summary["resumed_from"] == 4 and summary["steps"] == 4 and summary["device"].startswith("cuda")
    assert all(torch.isfinite(t).all() for t in _state(resumed)["model"].values() if t.is_floating_point())


def test_a_batch_passed_over_still_advances_an_epoch_bound_schedule(tmp_path):
    """Three batches, the first left with one sample at 32 pixels (passed over): two steps
    are taken, and the cosine schedule over the epoch's three batches still ends at 0."""
    from PIL import Image

    from dlbooster.runtime.sampler import shard_indices
    from dlbooster.runtime.sources import image_folder

    for split, count in (("train", 3), ("val", 1)):
        for cls in ("a", "b"):
            (tmp_path / split / cls).mkdir(parents=True)
            for i in range(count):
                Image.new("RGB", (48, 40), (200, 30, 30)).save(tmp_path / split / cls / f"{i}.jpg")
    samples, _, _ = image_folder(tmp_path / "train")
    first = shard_indices(len(samples), seed=0)[0]
    Path(samples[first].path).write_bytes(b"\xff\xd8 not a jpeg")
    epochs = []
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        summary = train(replace(BASE, data=str(tmp_path), batch_size=2, image_size=32, epochs=1),
                        on_epoch=epochs.append)
    # The schedule steps before any optimizer step on purpose: PyTorch's warning about
    # that order is not passed on to the user.
    assert not [w for w in caught if "lr_scheduler.step()" in str(w.message)]
    assert summary["steps"] == 2 and summary["untrained"] == 1
    assert epochs[0]["lr"] == pytest.approx(0.0, abs=1e-12)


def test_an_epoch_with_nothing_decodable_stops_training(tmp_path):
    """Every training file undecodable (each skipped with its reason): training stops
    after the first epoch instead of looping without a step."""
    from PIL import Image

    from dlbooster.cli import main
    from dlbooster.train.trainer import NoTrainingData

    for cls in ("a", "b"):
        (tmp_path / "train" / cls).mkdir(parents=True)
        (tmp_path / "val" / cls).mkdir(parents=True)
        for i in range(3):
            (tmp_path / "train" / cls / f"{i}.jpg").write_bytes(b"\xff\xd8 not a jpeg")
        Image.new("RGB", (40, 40), (200, 0, 0)).save(tmp_path / "val" / cls / "v.jpg")
    epochs = []

    def on_epoch(record):
        epochs.append(record)
        assert len(epochs) == 1, "training looped over epochs without a step"

    with pytest.raises(NoTrainingData, match="epoch 0: no optimiser step was taken"):
        train(replace(BASE, data=str(tmp_path), steps=2), on_epoch=on_epoch)
    assert main(["train", str(tmp_path), "--backend", "cpu", "--device", "cpu", "--steps", "2",
                 "--batch-size", "2", "--image-size", "32"]) == 1


def test_inception_style_model_trains(photos):
    summary = train(replace(BASE, data=photos, steps=1, model="googlenet"))
    assert summary["steps"] == 1 and summary["loss_first"] > 0


def test_split_backward_trains_identically(photos, tmp_path):
    a, b = str(tmp_path / "autograd.pt"), str(tmp_path / "split.pt")
    sa = train(replace(BASE, data=photos, steps=3, checkpoint=a))
    sb = train(replace(BASE, data=photos, steps=3, checkpoint=b, backward="split"))
    assert sb["backward"] == "split"
    assert (sa["loss_first"], sa["loss_last"]) == (sb["loss_first"], sb["loss_last"])
    assert _same_model(a, b)


@pytest.mark.parametrize("crash_at", [6, 15], ids=["inside_an_epoch", "at_an_epochs_end"])
def test_resume_after_a_crash_is_exact(photos, tmp_path, crash_at):
    """Resumed from a checkpoint inside an epoch, or from the one at an epoch's end (the
    next epoch's augmentation is seeded as an uninterrupted run's), the weights end
    bitwise equal."""
    straight, resumed = str(tmp_path / "straight.pt"), str(tmp_path / "resumed.pt")
    config = replace(BASE, data=photos, steps=19)           # crosses an epoch boundary (15)
    train(replace(config, checkpoint=straight))

    def crash(step, loss):
        if step == crash_at:
            raise KeyboardInterrupt
    with pytest.raises(KeyboardInterrupt):
        train(replace(config, checkpoint=resumed, checkpoint_every=3), on_step=crash)
    assert _state(resumed)["step"] == crash_at
    summary = train(replace(config, checkpoint=resumed, checkpoint_every=3, resume=True))
    assert summary["resumed_from"] == crash_at and summary["steps"] == 19 - crash_at
    assert _same_model(straight, resumed)


def test_resume_compares_the_learning_rate_as_resolved(photos, tmp_path):
    """An explicit --lr equal to the default the checkpoint ran with is the same run
    (it was refused as "lr None -> 0.003125"); another one is not."""
    path = tmp_path / "c.pt"
    config = replace(BASE, data=photos, lr=None, steps=1, checkpoint=str(path))
    train(config)
    assert _state(path)["lr"] == 0.1 * 8 / 256
    assert train(replace(config, lr=0.003125, steps=2, resume=True))["resumed_from"] == 1
    with pytest.raises(ValueError, match=r"c\.pt was written with other options \(lr 0\.003125 -> 0\.004\)"):
        train(replace(config, lr=0.004, steps=3, resume=True))


def test_resume_refuses_other_options_and_damaged_checkpoints(photos, tmp_path, capfd):
    """A checkpoint written with another model, batch size, learning rate... is refused
    before anything loads (else an epoch's remaining samples are never trained on, or a
    new learning rate is silently ignored); so is a file that is not a checkpoint."""
    path = tmp_path / "c.pt"
    config = replace(BASE, data=photos, steps=1, checkpoint=str(path))
    train(config)
    # Resumed where nothing is left to train: the command says so.
    from dlbooster.cli import main

    argv = ["train", photos, "--backend", "cpu", "--batch-size", "8", "--image-size", "64", "--lr", "0.05",
            "--workers", "1", "--device", "cpu", "--steps", "1", "--checkpoint", str(path), "--resume"]
    assert main(argv) == 0
    assert f"{path} had already trained 1 step, as far as these options go" in capfd.readouterr().err
    for change, words in [(dict(batch_size=4), "batch_size 8 -> 4"), (dict(lr=0.5), "lr 0.05 -> 0.5"),
                          (dict(model="mobilenet_v2"), "model 'resnet18' -> 'mobilenet_v2'")]:
        with pytest.raises(ValueError, match=rf"c\.pt was written with other options \({re.escape(words)}\)"):
            train(replace(config, steps=2, resume=True, **change))
    # Another data set's classes: refused by name (it used to be torch's size mismatch
    # traceback); a checkpoint of before the class check, by its weights.
    fewer = tmp_path / "fewer"
    shutil.copytree(photos, fewer)
    dropped = sorted(p.name for p in (fewer / "train").iterdir())[-1]
    for split in ("train", "val"):
        shutil.rmtree(fewer / split / dropped)
    with pytest.raises(ValueError, match=r"c\.pt was written with other options \(classes \d+ \(.*\) -> \d+ "):
        train(replace(config, data=str(fewer), steps=2, resume=True))
    state = _state(path)
    del state["classes"]
    torch.save(state, path)
    with pytest.raises(ValueError, match=r"c\.pt: its weights do not fit this resnet18 with \d+ classes \(size "
                                         r"mismatch for fc\."):
        train(replace(config, data=str(fewer), steps=2, resume=True))
    good = path.read_bytes()
    for damaged in (good[:100_000], b"", b"garbage, not a checkpoint\n"):
        path.write_bytes(damaged)
        with pytest.raises(ValueError, match=r"c\.pt: not a readable checkpoint") as raised:
            train(replace(config, steps=2, resume=True))
        # One line, and not torch's advice to load it with weights_only=False.
        assert "\n" not in str(raised.value) and "weights_only` set to `False" not in str(raised.value)
        assert "weights_only set to False" not in str(raised.value)
    torch.save({"model": {}}, path)
    with pytest.raises(ValueError, match=r"c\.pt: not a checkpoint of dlbooster train"):
        train(replace(config, steps=2, resume=True))


class _Planted:
    """An object whose unpickling runs code (here: creates a file)."""

    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return (Path.touch, (Path(self.marker),))


def test_resume_never_runs_code_from_the_checkpoint(photos, tmp_path):
    """A checkpoint is loaded with ``weights_only=True``: a planted file that would run
    code when unpickled is refused as unreadable, and its code does not run; a checkpoint
    of a run configured with a ``Path`` still resumes."""
    path, marker = tmp_path / "c.pt", tmp_path / "ran"
    config = replace(BASE, data=Path(photos), steps=1, checkpoint=path)
    train(config)
    assert train(replace(config, steps=2, resume=True))["resumed_from"] == 1
    state = torch.load(path, weights_only=True)
    state["loss_first"] = _Planted(marker)
    torch.save(state, path)
    with pytest.raises(ValueError, match=r"c\.pt: not a readable checkpoint \(not tensors and plain values that "
                                         r"torch\.load\(weights_only=True\) reads\)"):
        train(replace(config, steps=3, resume=True))
    assert not marker.exists()


def test_sim_decoder_feeds_identical_training(photos, tmp_path):
    """The simulated device decodes exactly like the CPU path, so training on it gives the
    same model; the trace shows its lane, the loader, the phases and the split tasks."""
    cpu, sim = str(tmp_path / "cpu.pt"), str(tmp_path / "sim.pt")
    trace = tmp_path / "trace.json"
    train(replace(BASE, data=photos, steps=2, checkpoint=cpu, backward="split"))
    summary = train(replace(BASE, data=photos, steps=2, checkpoint=sim, backend="sim", lanes=1,
                            max_width=256, backward="split", trace=str(trace)))
    assert summary["backend"] == "sim" and list(summary["outcomes"]) == ["ok"]
    assert _same_model(cpu, sim)
    events = json.loads(trace.read_text())["traceEvents"]
    names = {(e["pid"], e["tid"]): e["args"]["name"] for e in events if e["name"] == "thread_name"}
    spans = [(names[e["pid"], e["tid"]], e["cat"], e["name"]) for e in events if e["ph"] == "X"]
    assert sum(1 for t, c, _ in spans if (t, c) == ("lane 0", "decode")) == summary["outcomes"]["ok"] >= 16
    assert sum(1 for t, c, _ in spans if (t, c) == ("loader", "batch")) == 2
    assert [n for t, c, n in spans if c == "train"] == ["forward", "backward", "optimizer"] * 2
    assert sum(1 for _, c, _ in spans if c == "weight-grad") == 2 * 21     # ResNet-18: 20 convs + fc


def _torchrun(args: list[str], tmp_path, timeout: float = 600) -> dict:
    env = dict(os.environ, OMP_NUM_THREADS="1")
    for key in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(key, None)
    # A session of its own, so that a hung run's ranks are killed with it.
    proc = subprocess.Popen([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
                             "-m", "dlbooster", "train", *args, "--json"], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=env, cwd=tmp_path, start_new_session=True)
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        pytest.fail(f"torchrun hung for {timeout} s: {err[-2000:]}")
    assert proc.returncode == 0, err[-3000:]
    return json.loads(out[out.index("{"):])


def test_torchrun_two_gloo_ranks_autograd_and_split_agree(photos, tmp_path):
    """DDP with each rank's own simulated device, and the split schedule's all-reduce
    with CPU decoding, train the same model."""
    common = [photos, "--steps", "3", "--batch-size", "4", "--image-size", "64",
              "--lr", "0.05", "--workers", "1", "--device", "cpu"]
    a = _torchrun([*common, "--backend", "sim", "--lanes", "1", "--max-width", "256",
                   "--checkpoint", str(tmp_path / "ddp.pt")], tmp_path)
    b = _torchrun([*common, "--backend", "cpu", "--backward", "split",
                   "--checkpoint", str(tmp_path / "split.pt")], tmp_path)
    assert (a["backend"], a["backward"], b["backend"], b["backward"]) == ("sim", "autograd", "cpu", "split")
    assert a["world_size"] == b["world_size"] == 2
    assert a["images"] == b["images"] == 2 * 3 * 4          # both ranks, every step
    assert a["loss_first"] == b["loss_first"] and a["loss_last"] == b["loss_last"]
    assert _same_model(tmp_path / "ddp.pt", tmp_path / "split.pt")


def test_a_rank_with_nothing_to_train_on_does_not_hang_the_others(tmp_path):
    """Skips empty one rank's first batch and leave one sample in its second: no rank
    steps on either (DDP's all-reduce would wait forever for the rank that skipped, and
    batch norm cannot train on one sample at 32 pixels); the third batch trains on both."""
    from PIL import Image

    from dlbooster.runtime.sampler import shard_indices
    from dlbooster.runtime.sources import image_folder

    for split, count in (("train", 12), ("val", 1)):
        for cls, colour in (("a", (200, 30, 30)), ("b", (30, 30, 200))):
            (tmp_path / "data" / split / cls).mkdir(parents=True)
            for i in range(count):
                Image.new("RGB", (48, 40), colour).save(tmp_path / "data" / split / cls / f"{i:02d}.jpg")
    samples, _, _ = image_folder(tmp_path / "data" / "train")
    rank1 = shard_indices(len(samples), seed=0, rank=1, world_size=2)     # 12 indices, 3 batches of 4
    for index in rank1[:4] + rank1[4:7]:
        Path(samples[index].path).write_bytes(b"\xff\xd8 not a jpeg")
    # Rank 1's only validation sample (unshuffled: index 1) too: its forward on an empty
    # batch must still run (DDP's first evaluation forward broadcasts buffers).
    (tmp_path / "data" / "val" / "b" / "00.jpg").write_bytes(b"\xff\xd8 not a jpeg")
    run = _torchrun([str(tmp_path / "data"), "--backend", "cpu", "--epochs", "1", "--batch-size", "4",
                     "--image-size", "32", "--workers", "1", "--device", "cpu"], tmp_path, timeout=240)
    assert run["world_size"] == 2 and run["steps"] == 1
    assert run["images"] == 8                                   # the third batch of both ranks
    assert run["untrained"] == 4 + 4 + 1                        # rank 0's first two batches, rank 1's lone sample
    assert run["epochs"][0]["steps"] == 1 and run["epochs"][0]["untrained"] == 9
    assert run["val_top1"] in (0.0, 1.0)                         # rank 0's one validation sample
