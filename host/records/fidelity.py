"""Automatic choice of a record fidelity by gradient similarity (Kuchnik et al., VLDB 2021).

For a few fixed batches, the model's gradient of the training loss is computed on the
images decoded at full fidelity and at fidelity ``k`` (same images, same deterministic
resize and centre crop, same labels); ``k``'s score is the mean cosine similarity of the
flattened gradients over the batches. The chosen fidelity is the smallest ``k`` whose
score reaches the threshold: below it, training on fewer bytes would follow a
noticeably different descent direction.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field

from dlbooster.runtime.loader import Loader

__all__ = ["FidelityChoice", "check_threshold", "choose_fidelity"]


@dataclass
class FidelityChoice:
    """Result of :func:`choose_fidelity`.

    Attributes:
        fidelity: the chosen k (1..scans).
        threshold: the cosine similarity it had to reach.
        scores: k -> mean cosine similarity of the gradients at k and at full fidelity,
            for each k tried (ascending; the search stops at the first k that passes).
        batches, batch_size: what the scores were measured on.
    """

    fidelity: int
    threshold: float
    scores: dict[int, float] = field(default_factory=dict)
    batches: int = 0
    batch_size: int = 0

    def to_json(self) -> dict:
        return {"fidelity": self.fidelity, "threshold": self.threshold,
                "scores": {str(k): v for k, v in self.scores.items()},
                "batches": self.batches, "batch_size": self.batch_size}


def _gradients(model, loss_fn, batches) -> list:
    import torch

    grads = []
    for images, labels in batches:
        model.zero_grad(set_to_none=True)
        loss_fn(model(images), labels).backward()
        grads.append(torch.cat([p.grad.reshape(-1) for p in model.parameters() if p.grad is not None]).clone())
    return grads


def check_threshold(threshold: float) -> float:
    """``threshold`` if it is a cosine similarity :func:`choose_fidelity` can aim at, in
    (-1, 1]: -1 would accept every fidelity; above 1 none.

    Raises:
        ValueError: outside (-1, 1] (NaN too).
    """
    if not -1.0 < threshold <= 1.0:
        raise ValueError(f"threshold must be in (-1, 1], not {threshold}")
    return threshold


def choose_fidelity(model, records, *, batch_size: int = 32, batches: int = 2, image_size: int = 224,
                    threshold: float = 0.9, device="cpu", seed: int = 0, loss_fn=None,
                    cpu_workers: int | None = None) -> FidelityChoice:
    """Smallest fidelity whose gradients match full fidelity's (see the module docstring).

    Args:
        model: the ``torch.nn.Module`` to be trained (a copy is used; its parameters,
            buffers and gradients, and the global random state, are left as they were).
        records: a :class:`~dlbooster.records.pcr.RecordSet` or a folder of records.
        batch_size, batches: the fixed batches measured (the first ``batches`` of a
            shuffle by ``seed``; a final partial batch counts only when it is the only
            one, so a set of 33 images and ``batch_size=32`` measures one batch).
        image_size: the evaluation transform's centre crop (resize to ``image_size * 8 // 7``).
        threshold: cosine similarity to reach, in (-1, 1].
        device: where the model runs.
        loss_fn: ``loss_fn(logits, labels)``; default cross-entropy.

    Returns:
        a :class:`FidelityChoice`.

    Raises:
        ValueError: threshold outside (-1, 1], batches or batch_size below 1.
        dlbooster.errors.DecodeError: a sample of the measured batches cannot be read
            or decoded at some fidelity.
    """
    import torch

    from dlbooster.records.pcr import RecordSet
    from dlbooster.runtime.transforms import eval_transform

    check_threshold(threshold)
    if batches < 1 or batch_size < 1:
        raise ValueError("batches and batch_size must be at least 1")
    records = records if isinstance(records, RecordSet) else RecordSet(records)
    loss_fn = loss_fn or torch.nn.functional.cross_entropy
    device = torch.device(device)
    probe = copy.deepcopy(model).to(device)
    probe.train()
    transform = eval_transform(image_size, resize=image_size * 8 // 7)

    def take(fidelity):
        # on_error="raise": a sample missing at one fidelity would pair different images.
        with Loader(records, batch_size, backend="cpu", shuffle=True, seed=seed, device=device,
                    transform=transform, on_error="raise", fidelity=fidelity, rank=0, world_size=1,
                    cpu_workers=cpu_workers) as loader:
            out = []
            for images, labels in loader:
                # A final partial batch is left out once a full one is taken: a batch of
                # one fails in batch norm over features (one value per channel).
                if out and len(labels) < batch_size:
                    break
                out.append((images, labels))
                if len(out) == batches:
                    break
            return out

    # Every pass starts from the same state: batch-norm running statistics move in
    # train mode, and dropout draws the same masks from the same random state.
    state = copy.deepcopy(probe.state_dict())

    def gradients(fidelity):
        probe.load_state_dict(state)
        with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []):
            torch.manual_seed(seed)
            return _gradients(probe, loss_fn, take(fidelity))

    full = gradients(None)
    choice = FidelityChoice(records.scans, threshold, batches=len(full), batch_size=batch_size)
    for k in range(1, records.scans):
        grads = gradients(k)
        # In float64: a float32 dot product over millions of weights loses the digits
        # that tell a threshold of 0.999 from 0.9999.
        score = float(torch.stack([torch.nn.functional.cosine_similarity(a.double(), b.double(), dim=0)
                                   for a, b in zip(grads, full)]).mean())
        choice.scores[k] = score
        if score >= threshold:
            choice.fidelity = k
            break
    return choice
