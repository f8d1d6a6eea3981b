"""Simulation of the decoder gateware (cocotb, Verilator, Icarus)."""
