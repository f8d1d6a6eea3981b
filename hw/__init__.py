"""Decoder gateware (Amaranth HDL)."""
