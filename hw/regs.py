"""The decoder device's register map and job statuses: the contract between the gateware
(:mod:`dlbooster.hw.device`) and the host driver (:mod:`dlbooster.device.driver`).

Plain Python (no Amaranth), so board drivers import it cheaply.

All registers are 32 bits on AXI4-Lite (full-word accesses; ``WSTRB`` is ignored). 0x00-0x0C
follow XRT's ``ap_ctrl_hs`` layout (SPEC.md section 5), so the device packages as an Alveo
RTL kernel.

Job interface: a register FIFO. The host writes a job's fields to the ``JOB_*`` staging
registers and queues it by writing ``JOB_PUSH``; it reads completions from the head of a
completion FIFO (``DONE_*``) and drops the head with ``DONE_POP``. Chosen over a
descriptor ring in host memory because (a) jobs are few and large (one image, ~10^5
device clocks each), so a job's 8 register writes and a completion's 8 reads cost the
host far less than the decode (and the staging registers and the completion registers
are each one run of consecutive offsets, so a transport with block access makes each
run one call: ``DecoderDevice``), (b) it needs no third AXI master, no descriptor coherency handling on Zynq's
non-coherent HP ports and no ring-pointer protocol, and (c) the same few register
accesses work unchanged over pynq MMIO, XRT register access and the simulated device.
"""

import enum

__all__ = ["Reg", "Ctrl", "Irq", "DeviceStatus", "MAGIC", "DONE_BLOCK_WORDS", "device_reason"]

#: Value of :attr:`Reg.ID` ("DLB1").
MAGIC = 0x444C4231


class Reg(enum.IntEnum):
    """Byte offsets of the registers."""
    #: ap_ctrl_hs: :class:`Ctrl` bits.
    AP_CTRL = 0x00
    #: Global interrupt enable (bit 0).
    GIE = 0x04
    #: Interrupt enable: :class:`Irq` bits.
    IER = 0x08
    #: Interrupt status: :class:`Irq` bits, toggled by writing 1s.
    ISR = 0x0C
    JOB_IN_ADDR_LO = 0x10
    JOB_IN_ADDR_HI = 0x14
    #: Input length, bytes (> 0).
    JOB_IN_LEN = 0x18
    JOB_OUT_ADDR_LO = 0x1C
    JOB_OUT_ADDR_HI = 0x20
    #: Output buffer size, bytes.
    JOB_OUT_CAP = 0x24
    JOB_ID = 0x28
    #: Write: queue the staged job (dropped when the FIFO is full). Read: free job slots.
    JOB_PUSH = 0x2C
    #: Read: completions waiting.
    DONE_COUNT = 0x30
    #: Write: drop the head completion.
    DONE_POP = 0x34
    DONE_ID = 0x38
    #: ``status | lane << 8``.
    DONE_STATUS = 0x3C
    #: ``width | height << 16``.
    DONE_SIZE = 0x40
    #: Bytes written to the output buffer.
    DONE_BYTES = 0x44
    #: Device clocks from taking the job to completing it.
    DONE_CLOCKS = 0x48
    #: Huffman symbols decoded.
    DONE_SYMBOLS = 0x4C
    #: :data:`MAGIC`.
    ID = 0x50
    #: ``lanes | bus_bytes << 8 | job_depth << 16 | done_depth << 24``.
    CONFIG = 0x54
    #: Widest image, pixels.
    MAX_WIDTH = 0x58
    #: Watchdog: clocks without movement before a job is abandoned (0: never). Read/write.
    WATCHDOG = 0x5C
    #: Bit per lane: the lane holds a job.
    BUSY = 0x60


#: Registers from :attr:`Reg.DONE_COUNT` to :attr:`Reg.DONE_SYMBOLS`: the count,
#: ``DONE_POP`` (reads 0) and the head completion, one block read (``DecoderDevice``).
DONE_BLOCK_WORDS = (Reg.DONE_SYMBOLS - Reg.DONE_COUNT) // 4 + 1


class Ctrl(enum.IntFlag):
    """:attr:`Reg.AP_CTRL` bits. Lanes take queued jobs while started; ``AP_DONE`` (clear
    on read) is set when a start finds the queue empty and every lane idle, and the start
    ends unless ``AUTO_RESTART`` keeps the device running (the runtime's streaming mode;
    completions are then signalled by :attr:`Irq.COMPLETION`)."""
    AP_START = 1 << 0
    AP_DONE = 1 << 1
    AP_IDLE = 1 << 2
    AP_READY = 1 << 3
    AUTO_RESTART = 1 << 7


class Irq(enum.IntFlag):
    """Interrupt sources (:attr:`Reg.IER`, :attr:`Reg.ISR`)."""
    AP_DONE = 1 << 0
    #: A completion entered the completion FIFO.
    COMPLETION = 1 << 1


class DeviceStatus(enum.IntEnum):
    """Job statuses of the device itself; 0 is success and 1..0x3F are the lane's
    (:func:`dlbooster.hw.lane.status_reason`)."""
    #: Input length 0, or an address not aligned to the bus word.
    BAD_JOB = 0x40
    #: The output buffer is smaller than ``width * height * 3`` bytes (nothing written).
    OUTPUT_TOO_SMALL = 0x41
    #: A read response was SLVERR or DECERR.
    READ_ERROR = 0x42
    #: A write response was SLVERR or DECERR, or the pixels would pass the buffer's end.
    WRITE_ERROR = 0x43
    #: Nothing moved for :attr:`Reg.WATCHDOG` clocks.
    WATCHDOG = 0x44

    @property
    def reason(self) -> str:
        """Reason code, as the host reports it (``output-too-small``...)."""
        return self.name.lower().replace("_", "-")


def device_reason(status: int) -> str | None:
    """Reason code of any job status: None for 0, :attr:`DeviceStatus.reason` for the
    device's own, else the lane's (:func:`dlbooster.hw.lane.status_reason`).

    Raises:
        ValueError: not a status the device reports.
    """
    if status >= DeviceStatus.BAD_JOB:
        return DeviceStatus(status).reason
    from .lane import status_reason

    return status_reason(status)
