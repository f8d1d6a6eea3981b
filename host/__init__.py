"""dlbooster: FPGA offload of deep-learning data preprocessing.

The host runtime: JPEG structure parser and hardware-profile classifier
(:mod:`dlbooster.jpeg`), the bit-exact reference model of the decoder lane
(:mod:`dlbooster.jpeg.model`), decode backends and :func:`decode` (:mod:`dlbooster.backends`),
the decoder device's host driver (:mod:`dlbooster.device.driver`), and the runtime: the decode
service over device lanes with its CPU fallback (:mod:`dlbooster.runtime.service`), batch
buffer pools (:mod:`dlbooster.runtime.pool`), DistributedSampler-identical sharding
(:mod:`dlbooster.runtime.sampler`), device-side transforms (:mod:`dlbooster.runtime.transforms`) and
the PyTorch loader :class:`Loader` (:mod:`dlbooster.runtime.loader`). PyTorch is imported only
when a loader is built.
"""

from importlib import metadata as _metadata

from dlbooster.backends import BACKENDS, DecodeResult, decode, decode_result, decode_results, get_backend
from dlbooster.errors import DecodeError, DlboosterError, FallbackError, Malformed, Unsupported
from dlbooster.runtime.loader import Batch, Loader

try:
    __version__ = _metadata.version("dlbooster")
except _metadata.PackageNotFoundError:      # imported from a source tree that is not installed
    __version__ = "unknown"

__all__ = [
    "BACKENDS",
    "Batch",
    "DecodeError",
    "DecodeResult",
    "DlboosterError",
    "FallbackError",
    "Loader",
    "Malformed",
    "Unsupported",
    "__version__",
    "decode",
    "decode_result",
    "decode_results",
    "get_backend",
]
