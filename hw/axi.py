"""AXI4 and AXI4-Lite port sets, and the per-lane memory bus the decoder device arbitrates.

The device's top level (:class:`dlbooster.hw.device.Device`) exposes flat ports named
``<prefix>_<signal>`` (``m_axi_gmem_araddr``, ``s_axi_control_wdata``), the names Vivado's
IP packager, XRT RTL kernels (SPEC.md section 5) and cocotbext-axi expect. Inside, each
lane talks to the shared AXI4 master through a :data:`LaneBus`: burst requests and data
beats without IDs; :class:`dlbooster.hw.device.Device` assigns ``ARID``/``AWID`` = lane
index and routes ``R``/``B`` back by ID.
"""

import enum

from amaranth.lib import data, stream, wiring
from amaranth.lib.wiring import In, Out

__all__ = ["Resp", "axi4_master_ports", "axi4_lite_slave_ports", "burst_request", "read_beat",
           "write_beat", "LaneBus"]


class Resp(enum.IntEnum):
    """``RRESP``/``BRESP`` codes (AXI4 specification, ARM IHI 0022, A3.4.4)."""
    OKAY = 0
    EXOKAY = 1
    SLVERR = 2
    DECERR = 3


#: One burst request: byte address (aligned to the bus word) and ``AxLEN`` (beats - 1).
burst_request = data.StructLayout({"addr": 64, "len": 8})


def read_beat(data_width: int) -> data.StructLayout:
    """One read data beat handed to a lane: the bus word and whether ``RRESP`` was not OKAY."""
    return data.StructLayout({"data": data_width, "err": 1})


def write_beat(data_width: int) -> data.StructLayout:
    """One write data beat from a lane: the bus word, byte strobes, ``WLAST``."""
    return data.StructLayout({"data": data_width, "strb": data_width // 8, "last": 1})


def LaneBus(data_width: int) -> wiring.Signature:
    """A lane's side of the memory port (from the lane's view): ``ar``/``aw`` burst
    requests, ``w`` data out; ``r`` data and ``b`` responses (``err``: not OKAY) in.
    ``r`` and ``b`` have no ``ready``: a lane reserves buffer space before it asks."""
    return wiring.Signature({
        "ar": Out(stream.Signature(burst_request)),
        "r": In(stream.Signature(read_beat(data_width), always_ready=True)),
        "aw": Out(stream.Signature(burst_request)),
        "w": Out(stream.Signature(write_beat(data_width))),
        "b": In(stream.Signature(data.StructLayout({"err": 1}), always_ready=True)),
    })


def axi4_master_ports(prefix: str, data_width: int, id_width: int, addr_width: int = 64) -> dict:
    """Members of an AXI4 master port set named ``<prefix>_<signal>`` (all five channels,
    incrementing bursts; ``AxLOCK``/``AxCACHE``/``AxPROT``/``AxQOS`` driven constant)."""
    strobes = data_width // 8
    outs = {"awid": id_width, "awaddr": addr_width, "awlen": 8, "awsize": 3, "awburst": 2,
            "awlock": 1, "awcache": 4, "awprot": 3, "awqos": 4, "awvalid": 1,
            "wdata": data_width, "wstrb": strobes, "wlast": 1, "wvalid": 1, "bready": 1,
            "arid": id_width, "araddr": addr_width, "arlen": 8, "arsize": 3, "arburst": 2,
            "arlock": 1, "arcache": 4, "arprot": 3, "arqos": 4, "arvalid": 1, "rready": 1}
    ins = {"awready": 1, "wready": 1, "bid": id_width, "bresp": 2, "bvalid": 1,
           "arready": 1, "rid": id_width, "rdata": data_width, "rresp": 2, "rlast": 1, "rvalid": 1}
    ports = {f"{prefix}_{name}": Out(width) for name, width in outs.items()}
    ports.update({f"{prefix}_{name}": In(width) for name, width in ins.items()})
    return ports


def axi4_lite_slave_ports(prefix: str, addr_width: int = 12) -> dict:
    """Members of a 32-bit AXI4-Lite slave port set named ``<prefix>_<signal>``."""
    ins = {"awaddr": addr_width, "awvalid": 1, "wdata": 32, "wstrb": 4, "wvalid": 1,
           "bready": 1, "araddr": addr_width, "arvalid": 1, "rready": 1}
    outs = {"awready": 1, "wready": 1, "bresp": 2, "bvalid": 1, "arready": 1, "rdata": 32,
            "rresp": 2, "rvalid": 1}
    ports = {f"{prefix}_{name}": In(width) for name, width in ins.items()}
    ports.update({f"{prefix}_{name}": Out(width) for name, width in outs.items()})
    return ports
