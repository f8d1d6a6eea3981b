"""``dlbooster bench records``: what Progressive Compressed Records save.

Per data set (ImageFolder roots; the hymenoptera layout counts its train/ and val/):

- writing: images, seconds, skipped files;
- bytes one epoch reads at each fidelity against the source JPEG files, and PSNR
  against full fidelity on a sample (:func:`dlbooster.records.pcr.info`);
- read throughput, MB/s and images/s, of the source files (open + read each) and of
  the records (one contiguous prefix read per file, its scan groups' CRCs checked), cold
  (each file's pages dropped from the page cache first, ``posix_fadvise(DONTNEED)``) and
  warm; the median of ``rounds`` rounds, the two readers alternating;
- Loader images/s (read + CPU decode into uint8 batches) of the JPEG files and of the
  records at each fidelity: progressive decoding costs more CPU than baseline;
- optionally a short training run (:func:`dlbooster.train.trainer.train`) at a low fidelity, at
  full fidelity and on the JPEG files, same seed and settings.
"""

from __future__ import annotations

import os
import re
import statistics
import tempfile
import time
from pathlib import Path

from dlbooster.runtime.loader import Loader
from dlbooster.runtime.sources import image_folder

__all__ = ["bench_records", "dataset_roots"]


def _layout(path: str | os.PathLike) -> tuple[list[Path], list[str] | None]:
    """``(roots, None)`` for a data set of ImageFolders (``train``/``val`` when both
    exist, else the folder itself), ``([], files)`` for a folder of images without class
    folders (the ImageNet sample): its .jpg/.jpeg files, sorted."""
    p = Path(path)
    if (p / "train").is_dir() and (p / "val").is_dir():
        return [p / "train", p / "val"], None
    if not any(child.is_dir() for child in p.iterdir()):
        return [], sorted(str(f) for f in p.iterdir() if f.suffix.lower() in (".jpg", ".jpeg"))
    return [p], None


def dataset_roots(path: str | os.PathLike, tmp: str | os.PathLike) -> list[Path]:
    """The ImageFolder roots of a data set (:func:`_layout`); a folder of images without
    class folders becomes an ImageFolder of symbolic links in ``tmp`` (two classes,
    alternating)."""
    from dlbooster.bench.common import image_folder_links

    roots, files = _layout(path)
    return roots if files is None else [image_folder_links([(f, b"") for f in files], Path(tmp) / "folder")]


def dataset_files(path: str | os.PathLike) -> list[str]:
    """The image files the benchmark stores from the data set at ``path``, read as
    :func:`dataset_roots` reads it, without making anything.

    Raises:
        OSError: as :func:`dlbooster.runtime.sources.image_folder` (no class folder, a class
            folder without images, an unreadable folder).
    """
    roots, files = _layout(path)
    return files if files is not None else [s.path for root in roots for s in image_folder(root)[0]]


def _evict(paths: list[str]) -> None:
    for path in paths:
        fd = os.open(path, os.O_RDONLY)
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def _read_files(paths: list[str]) -> int:
    total = 0
    for path in paths:
        with open(path, "rb") as f:
            total += len(f.read())
    return total


def _read_records(record_sets, fidelity) -> int:
    """Bytes read: every record's prefix at ``fidelity``, its images assembled."""
    nbytes = 0
    for records in record_sets:
        for rf in records.files:
            rf.read_prefix(fidelity)
            nbytes += rf.prefix_bytes(fidelity)
    return nbytes


def _throughput(fn, paths: list[str], cold: bool, images: int) -> dict:
    if cold:
        _evict(paths)
    t = time.perf_counter()
    nbytes = fn()
    s = time.perf_counter() - t
    return {"bytes": nbytes, "s": s, "mb_per_s": nbytes / s / 1e6, "images_per_s": images / s}


def _loader_rate(source, fidelity, batch_size: int, epochs: int, workers: int) -> dict:
    with Loader(source, batch_size, backend="cpu", shuffle=True, seed=0, cpu_workers=workers,
                fidelity=fidelity) as loader:
        for _ in loader:                                     # warm-up epoch
            pass
        rates = []
        for epoch in range(epochs):
            loader.set_epoch(epoch + 1)
            t, n = time.perf_counter(), 0
            for batch in loader:
                n += len(batch.indices)
            rates.append(n / (time.perf_counter() - t))
    return {"images_per_s": statistics.median(rates), "epochs": rates}


def bench_records(datasets: list[str], *, fidelities: list[int] | None = None, rounds: int = 5, sample: int = 16,
                  images_per_record: int = 256, loader_epochs: int = 2, batch_size: int = 32, workers: int = 2,
                  train_epochs: int = 0, train_fidelity: int = 2, model: str = "resnet18", image_size: int = 112,
                  progress=print) -> dict:
    """Run the benchmark (module docstring) on each folder of ``datasets``.

    Args:
        fidelities: the fidelities of the read and loader measurements (default: 1, 2,
            5 and full).
        rounds: alternating read rounds (median reported).
        train_epochs: epochs of each training run (0: no training); runs on the first
            data set that has train/ and val/.
        train_fidelity: the low fidelity trained at (beside ``auto``, full fidelity and
            the JPEG files).

    Returns:
        ``datasets``: per data set ``name``, ``images``, ``skipped``, ``write_s``,
        ``source_bytes``, ``record_bytes``, ``scans``, ``fidelities`` (bytes, fractions
        and PSNR per fidelity), ``read`` (per reader: cold and warm throughput),
        ``loader`` (images/s per reader); and ``training`` (runs) when asked.
    """
    from dlbooster.records.pcr import RecordError, RecordSet, info, write_records

    out = {"datasets": [], "training": []}
    with tempfile.TemporaryDirectory(prefix="dlbooster-records-") as tmp:
        for n, data in enumerate(datasets):
            roots = dataset_roots(data, Path(tmp) / f"{n}")
            name = Path(data).name
            progress(f"{name}: writing records of {', '.join(str(r) for r in roots)}")
            sets, sources, skipped, t = [], [], [], time.perf_counter()
            for root in roots:
                target = Path(tmp) / f"{n}" / "records" / root.name
                try:
                    report = write_records(root, target, images_per_record=images_per_record)
                except RecordError as exc:
                    # Name the user's files, not the links of the temporary ImageFolder made
                    # over a flat folder.
                    raise RecordError(re.sub(re.escape(str(root)) + r"[^\s:;,()]*", lambda m: data if m.group(0) == str(
                        root) else os.path.realpath(m.group(0)), str(exc))) from exc
                skipped += report.skipped
                left_out = {p for p, _ in report.skipped}
                sources += [s.path for s in image_folder(root)[0] if s.path not in left_out]
                sets.append(RecordSet(target))
            write_s = time.perf_counter() - t
            scans = max(s.scans for s in sets)
            ks = sorted({min(k, scans) for k in (fidelities or [1, 2, 5, scans])})
            summary = info(sets[0], sample=sample)
            source_bytes = sum(s.source_bytes() for s in sets)
            rows = []
            for k in range(1, scans + 1):
                nbytes = sum(s.prefix_bytes(k) for s in sets)
                psnr = summary["fidelities"][k - 1] if k <= sets[0].scans else {}
                rows.append({"fidelity": k, "bytes": nbytes, "of_source": nbytes / source_bytes,
                             "psnr_mean_db": psnr.get("psnr_mean_db"), "psnr_min_db": psnr.get("psnr_min_db")})
            record_files = [rf.path for s in sets for rf in s.files]
            images = sum(len(s) for s in sets)
            progress(f"{name}: {images} images, reading {rounds} rounds")
            readers = {"jpeg files": (lambda: _read_files(sources), sources)}
            for k in ks:
                readers[f"records k={k}"] = ((lambda k=k: _read_records(sets, k)), record_files)
            samples = {r: {"cold": [], "warm": []} for r in readers}
            for _ in range(rounds):
                for reader, (fn, paths) in readers.items():
                    samples[reader]["cold"].append(_throughput(fn, paths, True, images))
                    samples[reader]["warm"].append(_throughput(fn, paths, False, images))
            read = {}
            for reader, modes in samples.items():
                read[reader] = {mode: {"bytes": runs[0]["bytes"],
                                       "mb_per_s": statistics.median(r["mb_per_s"] for r in runs),
                                       "images_per_s": statistics.median(r["images_per_s"] for r in runs)}
                                for mode, runs in modes.items()}
            loader = {}
            if loader_epochs:
                progress(f"{name}: Loader images/s")
                loader["jpeg files"] = _combine([_loader_rate(str(r), None, batch_size, loader_epochs, workers)
                                                 for r in roots], [len(image_folder(r)[0]) for r in roots])
                for k in ks:
                    loader[f"records k={k}"] = _combine(
                        [_loader_rate(s, k, batch_size, loader_epochs, workers) for s in sets],
                        [len(s) for s in sets])
            out["datasets"].append({
                "name": name, "path": str(data), "images": images, "skipped": skipped, "write_s": write_s,
                "source_bytes": source_bytes, "record_bytes": sum(os.path.getsize(p) for p in record_files),
                "scans": scans, "fidelities": rows, "psnr_sample": summary["sample"], "read": read,
                "loader": loader, "rounds": rounds})
            if train_epochs and len(roots) == 2 and not out["training"]:
                out["training"] = _train_runs(Path(tmp) / f"{n}" / "records", Path(data), train_epochs,
                                              train_fidelity, model, image_size, batch_size, workers, progress)
    return out


def _combine(results: list[dict], weights: list[int]) -> dict:
    """Images/s over several record sets read one after another (harmonic by images)."""
    total = sum(weights)
    seconds = sum(w / r["images_per_s"] for r, w in zip(results, weights))
    return {"images_per_s": total / seconds}


def _train_runs(records: Path, data: Path, epochs: int, low: int, model: str, image_size: int,
                batch_size: int, workers: int, progress) -> list[dict]:
    from dlbooster.records.pcr import RecordSet
    from dlbooster.train.trainer import TrainConfig, train

    runs = []
    for label, extra in ((f"records k={low}", {"records": str(records), "fidelity": low}),
                         ("records auto", {"records": str(records), "fidelity": "auto"}),
                         ("records full", {"records": str(records)}),
                         ("jpeg files", {"data": str(data)})):
        progress(f"training {model} for {epochs} epochs on {label}")
        config = TrainConfig(backend="cpu", model=model, epochs=epochs, batch_size=batch_size,
                             image_size=image_size, workers=workers, seed=0, **extra)
        summary = train(config)
        fidelity = summary.get("fidelity")
        rs = RecordSet(records / "train")
        epoch_bytes = rs.prefix_bytes(fidelity) if "records" in extra else rs.source_bytes()
        runs.append({"run": label, "fidelity": fidelity, "train_bytes_per_epoch": epoch_bytes,
                     "fidelity_choice": summary.get("fidelity_choice"),
                     "val_top1": summary["val_top1"], "loss_last": summary["loss_last"],
                     "images_per_s": summary["images_per_s"],
                     "val_top1_per_epoch": [e["val_top1"] for e in summary["epochs"]]})
    return runs
