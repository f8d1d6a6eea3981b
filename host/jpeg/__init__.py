"""JPEG as the decoder sees it: the structure parser and hardware-profile classifier
(:mod:`.parser`, whose names this package re-exports: ``jpeg.parse``, ``jpeg.classify``),
the bit-exact reference model of a decoder lane (:mod:`.model`) and the IEEE 1180-1990
IDCT accuracy test (:mod:`.ieee1180`)."""

from .parser import *  # noqa: F403 - the parser's public names are the package's
from .parser import __all__  # noqa: F401
