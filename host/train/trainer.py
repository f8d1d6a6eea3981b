"""The main job: image-classification training fed by the decoder (``dlbooster train``).

A torchvision model trained with SGD (momentum, weight decay, linear-scaling learning
rate, optional warm-up, cosine decay; the usual ImageNet recipe of Goyal et al., 2017)
on batches from :class:`dlbooster.Loader`, whose decode backend is the simulated (or
real) FPGA decoder, with the backward pass either plain autograd or
:class:`dlbooster.train.schedule.SplitBackward`.

- Data: an ImageFolder root with ``train/`` and ``val/`` sub-folders (the hymenoptera
  layout), or one ImageFolder whose every fifth file per class (in sorted order) is held
  out for validation; with no data, :func:`photo_dataset` builds one from the real
  photographs that scikit-image ships (class = photograph; samples = crops of it).
- Distributed: under ``torchrun`` each rank has its own loader (its own simulated
  device lanes) and its shard; gradients are averaged by ``DistributedDataParallel``
  (``backward="autograd"``) or by SplitBackward's bucketed all-reduce (``"split"``);
  gloo on the CPU, NCCL on CUDA.
- Checkpoints hold the model, optimiser, learning-rate schedule, epoch, position in the
  epoch (the sampler's start) and every rank's random state (augmentation generator,
  torch's CPU and CUDA generators), so a run resumed from a checkpoint continues exactly
  as the uninterrupted run would have from that step.
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import os
import random
import shutil
import tempfile
import time
import warnings
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from dlbooster.runtime.loader import Loader
from dlbooster.runtime.sampler import dist_env, local_rank_env
from dlbooster.runtime.sources import image_folder as listing

if TYPE_CHECKING:
    import torch

__all__ = ["NoTrainingData", "TrainConfig", "format_epoch", "photo_dataset", "split_folder", "summary_json",
           "train"]

log = logging.getLogger(__name__)

#: Validation share when DATA has no ``val/`` folder: every ``_VAL_EVERY``-th file per class.
_VAL_EVERY = 5

#: Simulated devices a run may make (``devices``): each maps 4 GiB of modelled host memory.
MAX_DEVICES = 32


class NoTrainingData(RuntimeError):
    """A whole epoch delivered no training sample (every one failed to decode and was
    skipped): training would loop without a step."""


@dataclass
class TrainConfig:
    """Settings of :func:`train` (the ``dlbooster train`` options).

    Attributes:
        data: ImageFolder root (see the module docstring); None: the packaged photographs.
        backend: decode backend (``sim``, ``cpu``, ``model``, ``auto``, ...).
        lanes, max_width, devices: the simulated device's build (``sim`` only).
        board, binary: the board and its bitstream or xclbin (``pynq`` and ``xrt`` only;
            None: ``$DLBOOSTER_BOARD`` and ``$DLBOOSTER_BINARY``).
        model: a torchvision classification model name (``resnet18``, ``resnet50``, ...).
        epochs, steps: stop after this many epochs, or optimiser steps (whichever first;
            ``steps`` alone runs as many epochs as it needs).
        batch_size: images per step per rank.
        lr: peak learning rate (None: ``0.1 * batch_size * world_size / 256``).
        momentum, weight_decay, label_smoothing, warmup_epochs: SGD recipe knobs.
        image_size: training crop (random-resized-crop), validation centre crop, pixels.
        backward: ``autograd`` or ``split`` (:class:`~dlbooster.train.schedule.SplitBackward`).
        streams: side CUDA streams for ``split``.
        device: ``cpu``, ``cuda`` or None (CUDA when present).
        seed: model initialisation, shuffling and augmentation.
        workers: CPU decode threads per rank (None: all cores).
        trace: Chrome-trace JSON file to write (rank r > 0 writes ``NAME.rank{r}.json``).
        checkpoint: file saved after every epoch (and every ``checkpoint_every`` steps).
        resume: continue from ``checkpoint`` when it exists.
        progress: a progress bar per epoch on rank 0.
        records: a folder of Progressive Compressed Records to train on instead of
            ``data`` (:mod:`dlbooster.records.pcr`): ``train/`` and ``val/`` record sets as
            ``dlbooster records write`` makes of the hymenoptera layout, or one record
            set (no validation). Record images decode on the CPU path.
        fidelity: records only: scans per training image (1..scans), ``"auto"``
            (:func:`dlbooster.records.fidelity.choose_fidelity` at ``fidelity_threshold``) or None
            (full). Validation always reads full fidelity.
        fidelity_threshold: gradient cosine similarity ``"auto"`` must reach.
    """

    data: str | None = None
    backend: str = "sim"
    lanes: int = 1
    max_width: int = 256
    devices: int = 1
    board: str | None = None
    binary: str | None = None
    model: str = "resnet18"
    epochs: int | None = None
    steps: int | None = None
    batch_size: int = 32
    lr: float | None = None
    momentum: float = 0.9
    weight_decay: float = 1e-4
    label_smoothing: float = 0.0
    warmup_epochs: float = 0.0
    image_size: int = 224
    backward: str = "autograd"
    streams: int = 2
    device: str | None = None
    seed: int = 0
    workers: int | None = None
    trace: str | None = None
    checkpoint: str | None = None
    checkpoint_every: int = 0
    resume: bool = False
    progress: bool = False
    records: str | None = None
    fidelity: int | str | None = None
    fidelity_threshold: float = 0.9

    def check(self) -> torch.device:
        """The settings checks that need no data, made before anything is built (so a
        command can refuse bad options before it announces a run).

        Returns:
            The ``torch.device`` to train on.

        Raises:
            ValueError: an unknown model or backward, neither epochs nor steps, epochs,
                steps, batch size or image size below 1; ``lr``, ``momentum``,
                ``weight_decay`` or ``warmup_epochs`` negative or not finite; ``seed``
                outside [-2**63, 2**63); more than :data:`MAX_DEVICES` devices;
                ``resume`` or ``checkpoint_every`` without ``checkpoint``; a
                ``checkpoint`` or ``trace`` that cannot be written (empty, a folder, in
                a missing folder, or refused by the file system);
                ``label_smoothing`` outside [0, 1], ``fidelity`` without records, below
                1 or not an integer or ``"auto"``, ``fidelity_threshold`` outside (-1, 1]
                with ``"auto"``, a
                CUDA device where PyTorch finds none, a device index beyond the GPUs
                this process sees, or under torchrun an index other than ``LOCAL_RANK``
                while this process sees that rank's GPU (every rank would share one
                GPU), or ``cuda`` while it does not or while ``LOCAL_RANK`` is unset
                (``srun``, ``mpirun``) and there is more than one GPU; a ``LOCAL_RANK``
                that is not an integer.
        """
        import torch
        import torchvision

        from dlbooster.support.files import output_problem

        if self.backward not in ("autograd", "split"):
            raise ValueError(f"backward must be 'autograd' or 'split', not {self.backward!r}")
        if self.epochs is None and self.steps is None:
            raise ValueError("give epochs or steps")
        for name in ("epochs", "steps", "batch_size", "image_size"):
            value = getattr(self, name)
            if value is not None and value < 1:
                raise ValueError(f"{name} must be at least 1, not {value}")
        for name in ("lr", "momentum", "weight_decay", "warmup_epochs"):
            value = getattr(self, name)
            # nan and inf trained to a loss of nan, or failed deep inside PyTorch.
            if value is not None and not (math.isfinite(value) and value >= 0):
                raise ValueError(f"{name} must be a finite number of at least 0, not {value}")
            # The optimiser holds them as float32: a larger value overflowed in its first step.
            if value is not None and name != "warmup_epochs" and value > _FLOAT32_MAX:
                raise ValueError(f"{name} must be at most {_FLOAT32_MAX:.6g} (float32), not {value}")
        # torch.manual_seed takes [-2**63, 2**64); the run adds the epoch and a rank offset.
        if not -2**63 <= self.seed < 2**63:
            raise ValueError(f"seed must be in [-2**63, 2**63), not {self.seed}")
        if self.devices > MAX_DEVICES:
            raise ValueError(f"devices must be at most {MAX_DEVICES} (each simulated device maps 4 GiB of modelled "
                             f"memory), not {self.devices}")
        if self.checkpoint is None and (self.resume or self.checkpoint_every):
            raise ValueError(f"{'resume' if self.resume else 'checkpoint_every'} needs a checkpoint file")
        for name in ("checkpoint", "trace"):
            # Found now, not when the first save comes after an epoch of training.
            path = getattr(self, name)
            problem = None if path is None else output_problem(path, name)
            if problem:
                raise ValueError(problem)
        if not 0.0 <= self.label_smoothing <= 1.0:
            raise ValueError(f"label_smoothing must be between 0 and 1, not {self.label_smoothing}")
        if self.fidelity is not None and self.records is None:
            raise ValueError("fidelity applies to records (--records) only")
        if self.fidelity not in (None, "auto") and (isinstance(self.fidelity, bool) or not isinstance(
                self.fidelity, int) or self.fidelity < 1):
            raise ValueError(f"fidelity must be 'auto' or a number of scans from 1, not {self.fidelity!r}")
        if self.fidelity == "auto":
            from dlbooster.records.fidelity import check_threshold

            try:
                check_threshold(self.fidelity_threshold)
            except ValueError as exc:
                raise ValueError(f"fidelity {exc}") from None
        if self.model not in torchvision.models.list_models(module=torchvision.models):
            raise ValueError(f"unknown torchvision classification model {self.model!r}")
        device = torch.device(self.device or ("cuda" if torch.cuda.is_available() else "cpu"))
        if device.type == "cuda" and not torch.cuda.is_available():
            raise ValueError(f"device {device}: PyTorch finds no CUDA device here")
        if device.type == "cuda":
            from dlbooster.runtime.sampler import dist_env, local_rank_env

            count, torchrun = torch.cuda.device_count(), dist_env()[1] > 1
            local_rank = local_rank_env()
            if device.index is not None and device.index >= count:
                raise ValueError(f"device {device}: PyTorch finds {count} CUDA device(s) here")
            if torchrun and device.index is None and local_rank is None and count > 1:
                # srun or mpirun set RANK and WORLD_SIZE, not LOCAL_RANK: GPU 0 for all.
                raise ValueError("device cuda with WORLD_SIZE above 1 but no LOCAL_RANK: this rank's GPU is "
                                 "unknown; launch with torchrun, set LOCAL_RANK, or give --device cuda:N")
            if torchrun and device.index is None and local_rank is not None and local_rank >= count:
                raise ValueError(f"device cuda under torchrun: this rank's GPU, LOCAL_RANK {local_rank}, is not "
                                 f"among the {count} CUDA device(s) PyTorch finds here (where each rank sees "
                                 f"only its own GPU, give --device cuda:0)")
            # Under torchrun each rank takes GPU LOCAL_RANK (--device cuda); a fixed index
            # would put every rank of the node on one GPU, which NCCL refuses or stalls
            # on. A rank that sees fewer GPUs (CUDA_VISIBLE_DEVICES per rank) may name one.
            if (torchrun and device.index is not None and local_rank is not None and device.index != local_rank
                    and local_rank < count):
                raise ValueError(f"device {device} under torchrun: every rank of this node would use GPU "
                                 f"{device.index}; give --device cuda so that each rank uses GPU LOCAL_RANK "
                                 f"(this one {local_rank})")
        return device


def record_sets(root: str | os.PathLike):
    """The record sets ``dlbooster train --records ROOT`` reads: ``(train, val)``
    :class:`~dlbooster.records.pcr.RecordSet` objects from ``ROOT/train`` and ``ROOT/val``
    (what ``records write`` makes of a hymenoptera-style folder; ``val`` None when
    ``ROOT/val`` holds no records), else ``(RecordSet(ROOT), None)``.

    Raises:
        FileNotFoundError: ``ROOT`` is no folder, or holds no record files, nor does
            ``ROOT/train``.
        dlbooster.records.pcr.RecordError: a corrupt record file, or train and val records
            with different classes (a ``ValueError``).
    """
    from dlbooster.records.pcr import RecordError, RecordSet, is_record_dir

    root = Path(root)
    if not root.is_dir():
        raise FileNotFoundError(f"{root}: {'not a folder' if root.exists() else 'no such folder'}")
    if is_record_dir(root / "train"):
        train_set = RecordSet(root / "train")
        val_set = RecordSet(root / "val") if is_record_dir(root / "val") else None
    elif is_record_dir(root):
        train_set, val_set = RecordSet(root), None
    else:
        raise FileNotFoundError(f"{root}: no record files (in it or in train/)")
    if val_set is not None and val_set.classes != train_set.classes:
        raise RecordError(f"{root}: train/ and val/ records have different classes")
    return train_set, val_set


def photo_dataset(out_dir: str | os.PathLike, *, crops: int = 8, val_crops: int = 2,
                  size: tuple[int, int] = (96, 240), seed: int = 0) -> Path:
    """An ImageFolder (``train/``, ``val/``) of crops of the real photographs that
    scikit-image ships, one class per photograph, encoded as JPEG with Pillow in the
    decoder's formats (4:4:4, 4:2:2, 4:2:0, quality 75-95, restart markers, optimised
    tables) in turn. Crop sides are drawn from ``size`` (pixels, at most 256 wide, so
    a 256-pixel device build takes them all).

    Returns:
        The root folder.

    Raises:
        FileNotFoundError: no packaged photographs (scikit-image is not installed).
    """
    from PIL import Image

    from dlbooster.support.samples import load_photo, packaged_photos

    photos = packaged_photos()
    if not photos:
        raise FileNotFoundError("no packaged photographs: install scikit-image")
    rng = random.Random(seed)
    formats = [{"quality": 95, "subsampling": 0}, {"quality": 90, "subsampling": 1},
               {"quality": 75, "subsampling": 2}, {"quality": 85, "subsampling": 2, "optimize": True},
               {"quality": 85, "subsampling": 0, "restart_marker_blocks": 5}]
    root = Path(out_dir)
    n = 0
    for photo in photos:
        image = load_photo(photo)
        h, w = image.shape[:2]
        for k in range(crops + val_crops):
            ch = min(h, rng.randint(*size))
            cw = min(w, rng.randint(*size))
            y, x = rng.randint(0, h - ch), rng.randint(0, w - cw)
            split = "train" if k < crops else "val"
            target = root / split / photo.stem / f"{photo.stem}_{k:02d}.jpg"
            target.parent.mkdir(parents=True, exist_ok=True)
            Image.fromarray(np.ascontiguousarray(image[y:y + ch, x:x + cw])).save(
                target, "JPEG", **formats[n % len(formats)])
            n += 1
    return root


def split_folder(root: Path):
    """(train samples, val samples, classes) of an ImageFolder root (module docstring).

    Raises:
        FileNotFoundError: no class folder, or a class folder without images (naming
            the folder read: ``root``, ``root/train`` or ``root/val``).
    """
    def image_folder(folder: Path):
        try:
            return listing(folder)
        except FileNotFoundError as exc:     # named once: some messages name it already
            raise FileNotFoundError(str(exc) if str(folder) in str(exc) else f"{folder}: {exc}") from None

    if (root / "train").is_dir() and (root / "val").is_dir():
        train, classes, mapping = image_folder(root / "train")
        val, val_classes, _ = image_folder(root / "val")
        if val_classes != classes:
            raise ValueError(f"{root}: train/ and val/ have different classes")
        return train, val, classes
    if (root / "train").is_dir():               # train/ alone: hold out from it
        root = root / "train"
    samples, classes, _ = image_folder(root)
    train, val, seen = [], [], {}
    for s in samples:
        k = seen[s.label] = seen.get(s.label, -1) + 1
        (val if k % _VAL_EVERY == _VAL_EVERY - 1 else train).append(s)
    return train, val, classes


class _Distributed:
    """The process group when run under torchrun (WORLD_SIZE > 1), else a single process."""

    def __init__(self, device_type: str):
        import torch.distributed as dist


        self.rank, self.world = dist_env()
        self.local_rank = local_rank_env() or 0
        self.active = self.world > 1
        if self.active and not dist.is_initialized():
            dist.init_process_group("nccl" if device_type == "cuda" else "gloo")
            self.owned = True
        else:
            self.owned = False
        # The per-step agreement (all_min) runs on the CPU: through NCCL it would be a
        # device synchronisation every step.
        self.control = dist.new_group(backend="gloo") if self.active and dist.get_backend() == "nccl" else None

    def all_sum(self, values: list[float]) -> list[float]:
        import torch
        import torch.distributed as dist

        if not self.active:
            return values
        t = torch.tensor(values, dtype=torch.float64)
        if dist.get_backend() == "nccl":
            t = t.cuda()
        dist.all_reduce(t)
        return t.cpu().tolist()

    def all_min(self, value: int) -> int:
        """The smallest ``value`` over the ranks (every rank must call it)."""
        import torch
        import torch.distributed as dist

        if not self.active:
            return value
        t = torch.tensor([value], dtype=torch.int64)
        dist.all_reduce(t, op=dist.ReduceOp.MIN, group=self.control)
        return int(t.item())

    def gather(self, obj):
        import torch.distributed as dist

        if not self.active:
            return [obj]
        out = [None] * self.world
        dist.all_gather_object(out, obj)
        return out

    def close(self) -> None:
        import torch.distributed as dist

        if self.control is not None:
            dist.destroy_process_group(self.control)
        if self.owned:
            dist.destroy_process_group()


def _lr_factor(step: int, total: int, warmup: int) -> float:
    """Linear warm-up over ``warmup`` steps, then cosine decay to 0 at ``total``
    (Goyal et al. 2017; Loshchilov & Hutter 2017)."""
    if warmup and step < warmup:
        return (step + 1) / warmup
    span = max(total - warmup, 1)
    return 0.5 * (1 + math.cos(math.pi * min(step - warmup, span) / span))


def train(config: TrainConfig, *, on_epoch=None, on_step=None, sets=None) -> dict:
    """Run the training job; return its summary (the ``--json`` object).

    ``on_epoch(record)`` is called on rank 0 after each epoch's validation with that
    epoch's figures; ``on_step(step, loss)`` on every rank after each optimiser step
    (and after the step's checkpoint). ``sets``: the ``(train, val)`` record sets of
    ``config.records`` where the caller has opened them (:func:`record_sets`), so that
    their headers are not read twice; None opens them here.

    Returns:
        ``steps``, ``images``, ``images_per_s`` (training images over training wall
        time, all ranks), ``loss_first``, ``loss_last``,
        ``val_top1`` (fraction, last validation), ``host_cores`` (this process's CPU
        time over wall time during training), ``backend``, ``backward``, ``epochs``
        (per-epoch figures), ``outcomes`` (training decode outcomes by status and
        reason, this rank), ``fallbacks`` (how many of them fell back to the CPU),
        ``untrained`` (decoded training samples of batches no rank stepped on, all
        ranks: a rank had none, or one where batch norm would see a 1x1 map),
        ``world_size``,
        ``model``, ``classes``, ``resumed_from`` (step), ``trace`` (and
        ``trace_error`` when the trace file could not be written), and with records
        ``fidelity`` (the scans per training image, None: all) and ``fidelity_choice``
        (the ``"auto"`` search: scores per fidelity).

    Raises:
        ValueError: a bad setting (:meth:`TrainConfig.check`; ``fidelity`` out of the
            records' range, a batch size of 1 where one sample leaves a batch-norm layer
            a 1x1 map, a model that does not run at ``image_size``: one probe forward),
            or a ``resume`` from a checkpoint of other options or classes.
        FileNotFoundError: the data folder is missing or has no classes.
        OSError: a checkpoint cannot be written (the message names it).
        dlbooster.records.pcr.RecordError: a corrupt record file.
    """
    import torch

    device = config.check()
    dist = _Distributed(device.type)
    if device.type == "cuda" and device.index is None:
        device = torch.device("cuda", dist.local_rank)
        torch.cuda.set_device(device)
    tmp = None
    try:
        if config.records is not None:
            train_set, val_set = sets if sets is not None else record_sets(config.records)
            return _run(config, device, dist, train_set, val_set, train_set.classes, on_epoch, on_step)
        if config.data is None:
            tmp = tempfile.mkdtemp(prefix="dlbooster-photos-")
            root = photo_dataset(tmp, seed=config.seed)
        else:
            root = Path(config.data)
            if not root.is_dir():
                raise FileNotFoundError(f"{root}: {'not a folder' if root.exists() else 'no such folder'}")
            from dlbooster.records.pcr import is_record_dir

            if is_record_dir(root) or is_record_dir(root / "train"):
                raise FileNotFoundError(f"{root}: holds record files, not class folders; give it as "
                                        f"--records {root} (records=)")
        train_samples, val_samples, classes = split_folder(root)
        return _run(config, device, dist, [(s.path, s.label) for s in train_samples],
                    [(s.path, s.label) for s in val_samples] or None, classes, on_epoch, on_step)
    finally:
        dist.close()
        if tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)


def _run(config, device, dist, train_source, val_source, classes, on_epoch, on_step) -> dict:
    """Train on ``train_source`` (a Loader source: (path, label) pairs or a RecordSet)."""
    import torch
    import torchvision
    from torch import nn

    from dlbooster.runtime.transforms import eval_transform, train_transform
    from dlbooster.train.schedule import SplitBackward
    from dlbooster.train.trace import Trace

    torch.manual_seed(config.seed)
    # Inception-style models return auxiliary outputs in training mode unless told not to.
    extra = {"aux_logits": False} if config.model in ("googlenet", "inception_v3") else {}
    if len(classes) == 1 and dist.rank == 0:
        log.warning("one class (%s): every label is the same, the loss is 0 from the first step and "
                    "training learns nothing; a data set needs two or more class folders", classes[0])
    model = torchvision.models.get_model(config.model, num_classes=len(classes), **extra)
    model = model.to(device, memory_format=torch.channels_last)
    # Batch norm cannot normalise one value per channel in training mode (one sample with
    # a 1x1 map): at such sizes a batch needs 2 samples.
    min_batch = 2 if _probe(model, config.model, config.image_size, device) else 1
    if min_batch > config.batch_size:
        raise ValueError(f"{config.model} at {config.image_size} pixels leaves a batch-norm layer one value per "
                         f"channel for a single sample, which training cannot normalise: use a batch size of "
                         f"at least 2 or a larger image size")
    trace = Trace() if config.trace else None
    options = ({"lanes": config.lanes, "max_width": config.max_width, "devices": config.devices}
               if config.backend == "sim" else {"board": config.board, "binary": config.binary}
               if config.backend in ("pynq", "xrt") else {})
    loader_args = dict(backend=config.backend, seed=config.seed, device=device, cpu_workers=config.workers,
                       backend_options=options, rank=dist.rank, world_size=dist.world)
    fidelity, choice = config.fidelity, None
    if fidelity == "auto":
        from dlbooster.records.fidelity import choose_fidelity

        choice = choose_fidelity(model, train_source, batch_size=config.batch_size, image_size=config.image_size,
                                 threshold=config.fidelity_threshold, device=device, seed=config.seed,
                                 cpu_workers=config.workers)
        # Every rank measures the same batches; rank 0's choice is the one all use.
        fidelity = int(dist.all_sum([choice.fidelity if dist.rank == 0 else 0])[0])
        log.info("fidelity %d chosen (gradient cosine similarity %s)", fidelity, choice.scores)
    loader = Loader(train_source, config.batch_size, shuffle=True, fidelity=fidelity,
                    # Ranks' augmentation streams must not meet: the transform adds the epoch.
                    transform=train_transform(config.image_size, seed=config.seed + 1_000_003 * dist.rank),
                    progress=config.progress, trace=trace, **loader_args)
    # Where a batch needs 2 samples, a final batch of one is dropped, as
    # DataLoader(drop_last=True) drops a partial batch, and a batch that skips leave with
    # one sample on any rank is not trained on.
    if min_batch == 2 and len(loader.sampler) % config.batch_size == 1 and len(loader.sampler) > 1:
        loader.drop_last = True
    val_loader = Loader(val_source, config.batch_size, shuffle=False,
                        transform=eval_transform(config.image_size, resize=config.image_size * 8 // 7),
                        **loader_args) if val_source is not None else None
    scheduler_split = None
    if config.backward == "split":
        scheduler_split = SplitBackward(model, streams=config.streams, trace=trace)
        net = model
    elif dist.active:
        from torch.nn.parallel import DistributedDataParallel as DDP

        net = DDP(model, device_ids=[device.index] if device.type == "cuda" else None)
    else:
        net = model
    criterion = nn.CrossEntropyLoss(label_smoothing=config.label_smoothing)
    lr = config.lr if config.lr is not None else 0.1 * config.batch_size * dist.world / 256
    decay, no_decay = [], []
    for p in model.parameters():
        if p.requires_grad:
            (no_decay if p.dim() <= 1 else decay).append(p)   # no weight decay on norms and biases
    optimizer = torch.optim.SGD([{"params": decay, "weight_decay": config.weight_decay},
                                 {"params": no_decay, "weight_decay": 0.0}], lr=lr, momentum=config.momentum)
    per_epoch = len(loader)
    total = config.steps if config.steps is not None else per_epoch * config.epochs
    if config.epochs is not None:
        total = min(total, per_epoch * config.epochs)
    warmup = int(config.warmup_epochs * per_epoch)
    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: _lr_factor(s, total, warmup))
    # When the epochs bound the run, the schedule follows the batches (a batch passed over
    # below still advances it, so that it ends at 0 with the last epoch); when the steps
    # do, it follows the steps taken.
    by_batches = config.epochs is not None and per_epoch * config.epochs <= (config.steps or math.inf)

    step, epoch, skip, resumed, state = 0, 0, 0, None, None
    first_loss = None
    if config.checkpoint and config.resume and os.path.exists(config.checkpoint):
        state = _load_checkpoint(config, classes, lr, dist.world)
        try:
            model.load_state_dict(state["model"])
        except RuntimeError as exc:           # a checkpoint of before the class check, or edited
            why = _first_line(str(exc).splitlines()[-1].rstrip("."))
            raise ValueError(f"{config.checkpoint}: its weights do not fit this {config.model} with "
                             f"{len(classes)} classes ({why}); resume on the checkpoint's data, or start "
                             f"without --resume") from None
        optimizer.load_state_dict(state["optimizer"])
        schedule.load_state_dict(state["schedule"])
        step, epoch, skip = state["step"], state["epoch"], state["batches_done"]
        first_loss = state.get("loss_first")
        resumed = step
        if skip >= per_epoch:
            epoch, skip = epoch + 1, 0
        log.info("resumed from %s at step %d (epoch %d, batch %d)", config.checkpoint, step, epoch, skip)

    summary = {"steps": 0, "images": 0, "images_per_s": 0.0, "loss_first": first_loss, "loss_last": None,
               "val_top1": None, "host_cores": 0.0, "backend": loader.backend_name, "backward": config.backward,
               "model": config.model, "classes": len(classes), "world_size": dist.world, "device": str(device),
               "lr": lr, "epochs": [], "outcomes": {}, "fallbacks": 0, "untrained": 0, "resumed_from": resumed,
               "trace": config.trace}
    if config.records is not None:
        summary.update(records=config.records, fidelity=fidelity,
                       fidelity_choice=choice.to_json() if choice is not None else None)
    images_total, wall_total, cpu_total = 0, 0.0, 0.0
    try:
        # Steps not taken (batches skipped above) are not made up in an extra epoch.
        while step < total and (config.epochs is None or epoch < config.epochs):
            loader.set_epoch(epoch)
            if skip:
                _skip_to(loader, skip)
            if state is not None:                     # random streams continue where they were
                ranks = state["rng"]
                if len(ranks) != dist.world:
                    raise ValueError(f"{config.checkpoint} was saved by {len(ranks)} ranks, not {dist.world}")
                # At an epoch's start set_epoch has seeded the augmentation as an
                # uninterrupted run's is; inside one it continues where it was.
                _set_rng_state(loader, ranks[dist.rank], transform=bool(skip))
            state = None
            model.train()
            losses, images, untrained, batch_no = [], 0, 0, skip
            wall0, cpu0 = time.perf_counter(), time.process_time()
            for images_batch, labels in loader:
                # Every rank takes the step or none does: DDP's gradient all-reduce (and
                # the split schedule's) would wait forever for a rank that skipped it.
                if dist.all_min(len(labels)) < min_batch:
                    untrained += len(labels)
                    batch_no += 1
                    if by_batches:
                        with warnings.catch_warnings():
                            # Stepped on purpose before any optimizer step: the schedule
                            # counts batches, trained on or not.
                            warnings.filterwarnings("ignore", "Detected call of `lr_scheduler")
                            schedule.step()
                    log.warning("epoch %d batch %d not trained on: a rank has fewer than %d decoded samples "
                                "(this rank: %d)", epoch, batch_no - 1, min_batch, len(labels))
                    continue
                phase = trace.span if trace is not None else _no_span
                with phase("forward", "train", thread="trainer"):
                    loss = criterion(net(images_batch), labels)
                with phase("backward", "train", thread="trainer"):
                    loss.backward()
                with phase("optimizer", "train", thread="trainer"):
                    optimizer.step()
                    optimizer.zero_grad(set_to_none=True)
                    schedule.step()
                value = loss.item()
                if first_loss is None:
                    first_loss = value
                losses.append(value)
                images += len(labels)
                step += 1
                batch_no += 1
                if config.checkpoint and config.checkpoint_every and step % config.checkpoint_every == 0:
                    _save(config, dist, model, optimizer, schedule, loader, step, epoch, batch_no, first_loss,
                          {"classes": list(classes), "lr": lr})
                if on_step is not None:
                    on_step(step, value)
                if step >= total:
                    break
            wall = time.perf_counter() - wall0
            cpu = time.process_time() - cpu0
            images_total, wall_total, cpu_total = images_total + images, wall_total + wall, cpu_total + cpu
            stats = loader.stats()
            for key, n in (stats.outcomes if stats else {}).items():
                summary["outcomes"][key] = summary["outcomes"].get(key, 0) + n
                if key.startswith("fallback"):
                    summary["fallbacks"] += n
            top1 = _validate(net if config.backward == "autograd" else model, val_loader, dist, device)
            loss_sum, loss_n, img_sum, untrained_sum = dist.all_sum([sum(losses), len(losses), images, untrained])
            summary["untrained"] += int(untrained_sum)
            record = {"epoch": epoch, "steps": len(losses), "loss": loss_sum / loss_n if loss_n else None,
                      "val_top1": top1, "images": int(img_sum), "untrained": int(untrained_sum), "seconds": wall,
                      "images_per_s": img_sum / wall if wall else 0.0, "host_cores": cpu / wall if wall else 0.0,
                      "lane_busy": stats.lane_busy if stats else {}, "lr": schedule.get_last_lr()[0]}
            summary["epochs"].append(record)
            summary["val_top1"], summary["loss_last"] = top1, (losses[-1] if losses else summary["loss_last"])
            if on_epoch is not None and dist.rank == 0:
                on_epoch(record)
            if not loss_n and batch_no >= per_epoch:
                outcomes = dict(stats.outcomes) if stats else {}
                raise NoTrainingData(
                    f"epoch {epoch}: no optimiser step was taken: every batch had a rank with fewer than "
                    f"{min_batch} decoded sample(s) ({int(untrained_sum)} decoded but untrained, all ranks; "
                    f"this rank's decode outcomes: {outcomes})")
            if config.checkpoint:
                _save(config, dist, model, optimizer, schedule, loader, step, epoch, batch_no, first_loss,
                          {"classes": list(classes), "lr": lr})
            epoch, skip = (epoch + 1, 0) if batch_no >= per_epoch else (epoch, batch_no)
    finally:
        if scheduler_split is not None:
            scheduler_split.remove()
        loader.close()
        if val_loader is not None:
            val_loader.close()
    total_images = dist.all_sum([images_total])[0]
    summary.update(steps=step - (resumed or 0), images=int(total_images),
                   images_per_s=total_images / wall_total if wall_total else 0.0,
                   host_cores=cpu_total / wall_total if wall_total else 0.0, loss_first=first_loss)
    if trace is not None:
        path = Path(config.trace)
        if dist.rank:
            path = path.with_name(f"{path.stem}.rank{dist.rank}{path.suffix or '.json'}")
        try:
            trace.write(path)
        except OSError as exc:            # the run's results stand; the caller reports the trace
            summary["trace_error"] = f"{path}: the trace cannot be written ({exc.strerror or exc})"
    return summary


def _probe(model, name: str, image_size: int, device) -> bool:
    """One forward of one ``image_size`` sample in evaluation mode, without gradients
    (running statistics are not touched): whether it leaves some batch-norm layer of
    ``model`` one value per channel (a 1x1 map), which training mode cannot normalise.

    Raises:
        ValueError: the model does not run at that size (a map pooled below 1x1, a
            fixed input size, memory for the sample's activations), found before any
            decoding.
    """
    import torch
    from torch import nn

    layers = [m for m in model.modules() if isinstance(m, nn.modules.batchnorm._BatchNorm)]
    single = []
    hooks = [m.register_forward_pre_hook(lambda m, args: single.append(args[0].numel() == args[0].shape[1]))
             for m in layers]
    was_training = model.training
    try:
        model.eval()
        with torch.no_grad():
            model(torch.zeros(1, 3, image_size, image_size, device=device))
    except (RuntimeError, AssertionError, ValueError) as exc:     # torch's out of memory is a RuntimeError
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise ValueError(f"{name} does not run on {image_size}x{image_size}-pixel images ({first}); give "
                         f"another --image-size") from None
    finally:
        for h in hooks:
            h.remove()
        model.train(was_training)
    return any(single)


def _no_span(*args, **kwargs):
    return contextlib.nullcontext()


def _rng_state(loader) -> dict:
    """This rank's random state: the augmentation's generator, torch's CPU and CUDA ones
    (dropout, stochastic depth)."""
    import torch

    transform = loader.transform
    return {"transform": transform.generator.get_state() if hasattr(transform, "generator") else None,
            "torch": torch.get_rng_state(),
            "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None}


def _set_rng_state(loader, state: dict, *, transform: bool = True) -> None:
    """Restore :func:`_rng_state`'s streams (the augmentation's only when ``transform``)."""
    import torch

    if transform and state["transform"] is not None and hasattr(loader.transform, "generator"):
        loader.transform.generator.set_state(state["transform"])
    torch.set_rng_state(state["torch"])
    if state["cuda"] is not None and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


_FLOAT32_MAX = 3.4028234663852886e38

#: Options a resumed run must share with its checkpoint's: each changes what is trained
#: (the model, its batches, their augmentation, the optimiser's recipe). The totals
#: (epochs, steps) may grow; how the data is decoded does not change the data.
RESUME_OPTIONS = ("model", "batch_size", "image_size", "seed", "lr", "momentum", "weight_decay",
                  "label_smoothing", "warmup_epochs", "fidelity", "fidelity_threshold")


def _load_checkpoint(config, classes: list[str], lr: float, world: int) -> dict:
    """The checkpoint ``--resume`` continues from, for a run on ``classes`` (the data's
    class names) at peak learning rate ``lr`` (resolved: ``--lr``, or its default for the
    batch size and ``world`` processes).

    The file is read with ``torch.load(weights_only=True)``: tensors and plain values
    only (:func:`_save` writes nothing else), so loading one cannot run code.

    Raises:
        ValueError: the file is not a checkpoint of :func:`train` (unreadable, truncated,
            another format, or a pickle naming other objects), or it was written with
            other :data:`RESUME_OPTIONS` (the learning rate compared as resolved, so an
            explicit ``--lr`` equal to the default is the same) or for other classes.
    """
    import torch

    try:
        # weights_only: tensors and plain values only, so a planted file cannot run code
        # when it loads (its pickle may name no other global). Onto the CPU: the random
        # states must be CPU byte tensors, and load_state_dict moves the weights and the
        # optimiser's state to the model's device.
        state = torch.load(config.checkpoint, map_location="cpu", weights_only=True)
    except Exception as exc:  # torch.load raises many types for a damaged or unsafe file
        import pickle

        # torch's own message for these runs to many lines and suggests weights_only=False.
        why = ("not tensors and plain values that torch.load(weights_only=True) reads"
               if isinstance(exc, pickle.UnpicklingError)
               else f"{type(exc).__name__}: {_first_line(exc)}")
        raise ValueError(f"{config.checkpoint}: not a readable checkpoint ({why}); "
                         f"remove it or start without --resume") from exc
    keys = {"model", "optimizer", "schedule", "step", "epoch", "batches_done", "rng", "config"}
    if not isinstance(state, dict) or not keys <= state.keys():
        raise ValueError(f"{config.checkpoint}: not a checkpoint of dlbooster train; remove it or start "
                         f"without --resume")
    saved = state["config"]
    changed = [f"{k} {saved.get(k)!r} -> {getattr(config, k)!r}" for k in RESUME_OPTIONS
               if k != "lr" and saved.get(k) != getattr(config, k)]
    # Checkpoints of earlier versions hold only the option: its default resolved as _run does.
    saved_lr = state.get("lr")
    if saved_lr is None:
        saved_lr = saved.get("lr")
    if saved_lr is None and isinstance(saved.get("batch_size"), int):
        saved_lr = 0.1 * saved["batch_size"] * world / 256
    if not (isinstance(saved_lr, (int, float)) and math.isclose(saved_lr, lr, rel_tol=1e-9)):
        changed.append(f"lr {saved_lr!r} -> {lr!r}")
    saved_classes = state.get("classes")
    if saved_classes is not None and list(saved_classes) != list(classes):
        changed.append(f"classes {_names(saved_classes)} -> {_names(classes)}")
    if changed:
        raise ValueError(f"{config.checkpoint} was written with other options ({', '.join(changed)}): resume "
                         f"with the checkpoint's, or start without --resume")
    return state


def _first_line(exc: BaseException | str, limit: int = 200) -> str:
    """An error's first line for a one-line message, cut at ``limit`` characters with an
    ellipsis (torch's run to many lines)."""
    line = (str(exc).splitlines() or [""])[0].strip()
    return line if len(line) <= limit else line[:limit - 3].rstrip() + "..."


def _names(classes) -> str:
    """A class list for a message: its count and its first names."""
    shown = ", ".join(map(str, list(classes)[:4])) + (", ..." if len(classes) > 4 else "")
    return f"{len(classes)} ({shown})"


def _skip_to(loader, batches: int) -> None:
    """Resume inside an epoch: the sampler starts after the batches already trained on."""
    loader.sampler.skip(min(batches * loader.batch_size, len(loader.sampler)))


def _save(config, dist, model, optimizer, schedule, loader, step, epoch, batches_done, first_loss,
          run: dict) -> None:
    """Write the checkpoint (rank 0); ``run``: the run's ``classes`` and resolved ``lr``,
    which a resume checks."""
    import torch

    rng = dist.gather(_rng_state(loader))       # every rank's random state
    if dist.rank != 0:
        return
    state = {"model": model.state_dict(), "optimizer": optimizer.state_dict(), "schedule": schedule.state_dict(),
             "step": step, "epoch": epoch, "batches_done": batches_done, "loss_first": first_loss, **run,
             "sampler": loader.sampler.state_dict(),
             "rng": rng, "config": {k: os.fspath(v) if isinstance(v, os.PathLike) else v
                                    for k, v in asdict(config).items()}}
    tmp = f"{config.checkpoint}.tmp"
    try:
        torch.save(state, tmp)
        os.replace(tmp, config.checkpoint)        # a crash mid-save leaves the old checkpoint
    except BaseException as exc:                  # Ctrl-C, SIGTERM, a full disk: no partial file left
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        if isinstance(exc, Exception):            # torch's writer raises RuntimeError for the OS's errors
            why = exc.strerror if isinstance(exc, OSError) and exc.strerror else _first_line(exc)
            raise OSError(f"{config.checkpoint}: the checkpoint cannot be written ({why})") from exc
        raise


def _validate(net, loader, dist, device) -> float | None:
    """Top-1 accuracy over the validation set (each index counted once across ranks:
    the sampler pads shards with repeats as DistributedSampler does)."""
    import torch

    if loader is None:
        return None
    net.eval()
    results = {}
    with torch.no_grad():
        for batch in loader:
            images, labels = batch
            correct = (net(images).argmax(1) == labels).tolist()
            results.update(zip(batch.indices.tolist(), correct))
    merged = {}
    for part in dist.gather(results):
        merged.update(part)
    return sum(merged.values()) / len(merged) if merged else None


def format_epoch(record: dict) -> str:
    """One line per epoch for the terminal."""
    top1 = "-" if record["val_top1"] is None else f"{100 * record['val_top1']:.1f}%"
    loss = "-" if record["loss"] is None else f"{record['loss']:.4f}"
    return (f"epoch {record['epoch']:3d}  steps {record['steps']:4d}  loss {loss}  val top-1 {top1}  "
            f"{record['images_per_s']:7.1f} images/s  host cores {record['host_cores']:.2f}  "
            f"lr {record['lr']:.4g}" + (f"  untrained {record['untrained']}" if record.get("untrained") else ""))


def summary_json(summary: dict) -> str:
    return json.dumps(summary, indent=1, default=str)
