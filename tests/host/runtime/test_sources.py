"""dlbooster.runtime.sources against torchvision's ImageFolder, which is the oracle."""

from __future__ import annotations

import os
import re
from pathlib import Path

import numpy as np
import pytest

from dlbooster.runtime.sources import IMG_EXTENSIONS, Sample, as_samples, image_folder
from jpegtools import CORPUS_DIR

folder = pytest.importorskip("torchvision.datasets.folder")

HYMENOPTERA = CORPUS_DIR / "hymenoptera" / "hymenoptera_data" / "train"

needs_symlinks = pytest.mark.skipif(not hasattr(os, "symlink") or os.name == "nt",
                                    reason="needs POSIX symbolic links")


def touch(path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"")


def torchvision_view(root):
    ds = folder.ImageFolder(root)
    return ds.samples, ds.classes, ds.class_to_idx


def our_view(root):
    samples, classes, class_to_idx = image_folder(root)
    assert all(type(s.path) is str and type(s.label) is int for s in samples)
    return [(s.path, s.label) for s in samples], classes, class_to_idx


@pytest.fixture
def tree(tmp_path):
    """A class tree with the traps torchvision's listing has to get right."""
    root = tmp_path / "root"
    for rel in [
        # "B" sorts before "a" (code points), and before "_x".
        "B/x.JPEG", "B/notes.txt", "B/sub/z.png", "B/sub/deeper/w.Jpg",
        # "sub b" sorts before "sub/..." as a path (" " < "/"), unlike os.walk's order.
        "B/sub b/v.jpg", "B/sub.d/u.TIFF", "B/0first.webp", "B/no_ext", "B/x.jpeg.bak",
        "a/.hidden.jpg", "a/img.webp", "a/readme.md", "a/IMG.PNG", "a/z.ppm", "a/y.pgm",
        "a/q.bmp", "a/r.tif",
        "_x/only.jpeg",
        ".hidden_class/h.png",  # a hidden folder is still a class for torchvision
        "root_level.jpg",  # files directly in root are not samples
    ]:
        touch(root / rel)
    (root / "a" / "folder.jpg").mkdir()  # a folder with an image name is no sample
    if os.name != "nt":
        outside = tmp_path / "outside"
        touch(outside / "p.bmp")
        touch(outside / "inner" / "q.jpg")
        touch(outside / "ignored.gif")
        (root / "linked").symlink_to(outside, target_is_directory=True)  # a class via a link
        touch(tmp_path / "more" / "m.png")
        (root / "a" / "via_link").symlink_to(tmp_path / "more", target_is_directory=True)
        (root / "a" / "dangling.jpg").symlink_to(tmp_path / "missing.jpg")
    return root


def test_image_folder_matches_torchvision(tree):
    ours = our_view(tree)
    assert ours == torchvision_view(tree)
    samples, classes, class_to_idx = ours
    assert classes[:3] == [".hidden_class", "B", "_x"]
    assert class_to_idx["B"] < class_to_idx["a"]
    names = [os.path.relpath(p, tree) for p, _ in samples]
    assert os.path.join("B", "x.JPEG") in names
    assert os.path.join("a", ".hidden.jpg") in names
    assert not any(n.endswith((".txt", ".md", ".bak", "no_ext", ".gif")) for n in names)
    assert os.path.join("root_level.jpg") not in names
    # Folders in path order (" " < "." < "/"), not os.walk's: sub/deeper comes last.
    assert [n for n in names if n.startswith("B" + os.sep)] == [os.path.join("B", *p) for p in [
        ("0first.webp",), ("x.JPEG",), ("sub", "z.png"), ("sub b", "v.jpg"), ("sub.d", "u.TIFF"),
        ("sub", "deeper", "w.Jpg")]]


@needs_symlinks
def test_image_folder_follows_links(tree):
    samples, classes, class_to_idx = image_folder(tree)
    paths = {s.path: s.label for s in samples}
    assert "linked" in classes
    assert paths[os.path.join(str(tree), "linked", "inner", "q.jpg")] == class_to_idx["linked"]
    assert paths[os.path.join(str(tree), "a", "via_link", "m.png")] == class_to_idx["a"]
    # torchvision lists a dangling link by its name; so do we.
    assert os.path.join(str(tree), "a", "dangling.jpg") in paths


@needs_symlinks
def test_a_link_back_up_the_tree_is_not_walked_again(tmp_path):
    """A link to its own folder's parent: torchvision walks it until the path is too
    long (each image listed again at every depth, then ELOOP); we list each image once,
    and the same images and labels as torchvision otherwise."""
    root = tmp_path / "data"
    for cls in ("a", "b"):
        touch(root / cls / "x.jpg")
    touch(root / "a" / "sub" / "y.jpg")
    (root / "a" / "sub" / "loop").symlink_to("..", target_is_directory=True)
    (root / "b" / "to_a").symlink_to(root / "a", target_is_directory=True)   # not a cycle: followed once
    samples, classes, _ = image_folder(root)
    assert [(os.path.relpath(s.path, root), s.label) for s in samples] == [
        (os.path.join("a", "x.jpg"), 0), (os.path.join("a", "sub", "y.jpg"), 0), (os.path.join("b", "x.jpg"), 1),
        (os.path.join("b", "to_a", "x.jpg"), 1), (os.path.join("b", "to_a", "sub", "y.jpg"), 1)]
    tv_samples, tv_classes, _ = torchvision_view(root)
    assert tv_classes == classes and len(tv_samples) > 20           # torchvision's repeats
    # A link to its own folder too (torchvision's walk of two such links grows
    # exponentially with the depth, so it is not run on this one).
    (root / "a" / "self").symlink_to(".", target_is_directory=True)
    assert [s.path for s in image_folder(root)[0]] == [s.path for s in samples]


@pytest.mark.parametrize("form", [str, Path, lambda p: str(p) + os.sep])
def test_image_folder_root_forms(tree, form):
    assert our_view(form(tree)) == torchvision_view(form(tree))


def test_image_folder_expands_user(tree, monkeypatch):
    monkeypatch.setenv("HOME", str(tree.parent))
    ours = our_view("~/root")
    assert ours == torchvision_view("~/root")
    assert ours[0][0][0].startswith(str(tree))


def test_extensions_are_torchvisions():
    assert IMG_EXTENSIONS == folder.IMG_EXTENSIONS


def raised(fn, root):
    with pytest.raises(FileNotFoundError) as info:
        fn(root)
    return str(info.value)


def test_empty_class_raises_like_torchvision(tmp_path):
    touch(tmp_path / "good" / "a.jpg")
    touch(tmp_path / "empty1" / "notes.txt")
    (tmp_path / "empty0").mkdir()
    message = raised(image_folder, tmp_path)
    assert message == raised(folder.ImageFolder, tmp_path)
    assert "empty0, empty1" in message


def test_no_class_folder_raises_like_torchvision(tmp_path):
    touch(tmp_path / "a.jpg")
    message = raised(image_folder, tmp_path)
    assert message == raised(folder.ImageFolder, tmp_path)
    assert "class folder" in message


def test_an_unreadable_folder_is_named(tmp_path, monkeypatch):
    """A class folder (or one under it) that cannot be listed fails with the error that
    names it: torchvision's walk passes over it, and its images are lost or the class is
    reported empty. The tests run as root, whom no permission stops, so listing the
    folder is made to fail as it fails for a user without read permission."""
    touch(tmp_path / "a" / "1.jpg")
    touch(tmp_path / "b" / "sub" / "2.jpg")
    touch(tmp_path / "b" / "3.jpg")
    scandir, locked = os.scandir, os.path.join(str(tmp_path), "b", "sub")

    def unreadable(path="."):
        if os.fspath(path) == locked:
            raise PermissionError(13, "Permission denied", locked)
        return scandir(path)
    monkeypatch.setattr(os, "scandir", unreadable)
    with pytest.raises(PermissionError, match=re.escape(f"Permission denied: '{locked}'")):
        image_folder(tmp_path)
    assert len(folder.ImageFolder(str(tmp_path)).samples) == 2, "torchvision loses b/sub/2.jpg"


def test_missing_root_raises(tmp_path):
    with pytest.raises(FileNotFoundError):
        image_folder(tmp_path / "nope")


def test_hymenoptera_matches_torchvision():
    if not HYMENOPTERA.is_dir():
        pytest.skip(f"hymenoptera data not present at {HYMENOPTERA}")
    samples, classes, class_to_idx = ours = our_view(HYMENOPTERA)
    assert ours == torchvision_view(HYMENOPTERA)
    assert classes == ["ants", "bees"]
    assert class_to_idx == {"ants": 0, "bees": 1}
    assert {label for _, label in samples} == {0, 1}
    assert len(samples) > 100


def test_sample_is_frozen():
    s = Sample("a.jpg", 1)
    with pytest.raises(AttributeError):
        s.label = 2  # type: ignore[misc]
    assert s == Sample("a.jpg", 1) and hash(s) == hash(Sample("a.jpg", 1))


def test_as_samples_from_folder(tree):
    assert as_samples(tree) == image_folder(tree)[0]
    assert as_samples(str(tree)) == image_folder(tree)[0]


def test_as_samples_from_pairs():
    torch = pytest.importorskip("torch")
    given = [("a.jpg", 0), (Path("b/c.png"), np.int64(3)), ["d.jpg", torch.tensor(2)],
             Sample("e.jpg", 1), Sample(Path("f.jpg"), np.int32(5))]  # type: ignore[arg-type]
    got = as_samples(given)
    assert got == [Sample("a.jpg", 0), Sample(os.path.join("b", "c.png"), 3), Sample("d.jpg", 2),
                   Sample("e.jpg", 1), Sample("f.jpg", 5)]
    assert all(type(s.path) is str and type(s.label) is int for s in got)
    assert as_samples(iter(given[:2])) == got[:2]
    assert as_samples(tuple(given[:1])) == got[:1]
    assert as_samples([]) == []


def test_labels_must_fit_the_batches_int64():
    assert as_samples([("a.jpg", 2**63 - 1), ("b.jpg", -2**63)])[0].label == 2**63 - 1
    with pytest.raises(ValueError, match="sample 1: label 9223372036854775808 does not fit in int64"):
        as_samples([("a.jpg", 0), ("b.jpg", 2**63)])


def test_as_samples_missing_path(tmp_path):
    missing = tmp_path / "missing"
    with pytest.raises(FileNotFoundError, match="missing"):
        as_samples(missing)


def test_as_samples_file_path(tmp_path):
    f = tmp_path / "file.jpg"
    touch(f)
    with pytest.raises(NotADirectoryError) as info:
        as_samples(str(f))
    assert str(f) in str(info.value)


@pytest.mark.parametrize("bad, named", [
    (42, "int"), (None, "NoneType"), (3.5, "float"), (b"/tmp", "bytes"),
    ({"a.jpg": 0}, "dict"),
])
def test_as_samples_rejects_other_types(bad, named):
    with pytest.raises(TypeError, match=named):
        as_samples(bad)


@pytest.mark.parametrize("items, match", [
    ([("a.jpg", 0), ("b.jpg",)], "sample 1"),
    ([("a.jpg", 0, 1)], "3 items"),
    (["a.jpg"], "sample 0"),
    ([("a.jpg", 1.5)], "label"),
    ([("a.jpg", "3")], "label"),
    ([(7, 1)], "path"),
    ([(b"a.jpg", 1)], "path"),
    ([Sample("a.jpg", 0.5)], "label"),  # type: ignore[arg-type]
    ([None], "sample 0"),
])
def test_as_samples_rejects_bad_items(items, match):
    with pytest.raises(TypeError, match=match):
        as_samples(items)
