"""dlbooster: FPGA offload of deep-learning data preprocessing.

The host runtime: JPEG structure parser and hardware-profile classifier
(:mod:`dlbooster.jpeg`), the bit-exact reference model of the decoder lane
(:mod:`dlbooster.model`), decode backends and :func:`decode` (:mod:`dlbooster.backends`),
and the decoder device's host driver (:mod:`dlbooster.device`).
"""

from .backends import BACKENDS, DecodeResult, decode, decode_result, decode_results, get_backend
from .errors import DecodeError, DlboosterError, FallbackError, Malformed, Unsupported

__all__ = [
    "BACKENDS",
    "DecodeError",
    "DecodeResult",
    "DlboosterError",
    "FallbackError",
    "Malformed",
    "Unsupported",
    "decode",
    "decode_result",
    "decode_results",
    "get_backend",
]
