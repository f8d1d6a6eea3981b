"""JPEG as the decoder sees it: the structure parser and hardware-profile classifier
(:mod:`.parser`, whose names this package re-exports: ``jpeg.parse``, ``jpeg.classify``),
the bit-exact reference model of a decoder lane (:mod:`.model`) and the IEEE 1180-1990
IDCT accuracy test (:mod:`.ieee1180`)."""

from .parser import (DEFAULT_MAX_WIDTH, HARDWARE_SAMPLINGS, HOST_ONLY_REASONS, MAX_SCANS, PILLOW_MAX_PIXELS,
                     REASONS, STANDARD_HUFFMAN, ZIGZAG, Component, Frame, HuffmanTable, JpegInfo, Scan,
                     classify, host_prescreen, parse, pillow_header_error, pillow_max_pixels,
                     standard_huffman_segment, with_standard_huffman)

__all__ = ["DEFAULT_MAX_WIDTH", "HARDWARE_SAMPLINGS", "HOST_ONLY_REASONS", "MAX_SCANS", "PILLOW_MAX_PIXELS",
           "REASONS", "STANDARD_HUFFMAN", "ZIGZAG", "Component", "Frame", "HuffmanTable", "JpegInfo", "Scan",
           "classify", "host_prescreen", "parse", "pillow_header_error", "pillow_max_pixels",
           "standard_huffman_segment", "with_standard_huffman"]
