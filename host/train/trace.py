"""Chrome-trace recording (the Trace Event Format that Perfetto and chrome://tracing read).

:class:`Trace` collects complete events ("ph": "X", microseconds) on named tracks: a
*process* per component (``host``, ``decoder device 0``, ``cuda``) and a *thread* per
track inside it (the Python thread, a decoder lane, a CUDA stream). ``dlbooster train
--trace FILE`` records decode jobs per lane, batch hand-offs and copies, forward and
backward phases and the backward scheduler's input- and weight-gradient tasks.

Format: https://docs.google.com/document/d/1CvAClvFfyA5R-PhYUmn5OOQtYMH4h6I0nSsKchNAySU
("Trace Event Format", complete and metadata events).
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

__all__ = ["Trace"]


class Trace:
    """An in-memory Chrome trace; :meth:`write` saves it as JSON.

    Times are host ``time.perf_counter()`` seconds; the file holds microseconds since
    the trace was made. Thread-safe.
    """

    def __init__(self):
        self.start = time.perf_counter()
        self.events: list[dict] = []
        self._lock = threading.Lock()
        self._ids: dict[tuple[str, str | None], int] = {}
        self._cuda_ref = None                      # (CUDA event, host time) pairing clocks

    def _track(self, process: str, thread: str) -> tuple[int, int]:
        with self._lock:
            pid = self._ids.get((process, None))
            if pid is None:
                pid = self._ids[process, None] = len([k for k in self._ids if k[1] is None]) + 1
                self.events.append({"ph": "M", "name": "process_name", "pid": pid, "tid": 0,
                                    "args": {"name": process}})
            tid = self._ids.get((process, thread))
            if tid is None:
                tid = self._ids[process, thread] = len(self._ids)
                self.events.append({"ph": "M", "name": "thread_name", "pid": pid, "tid": tid,
                                    "args": {"name": thread}})
        return pid, tid

    def complete(self, name: str, cat: str, start: float, end: float, *, process: str = "host",
                 thread: str | None = None, args: dict | None = None) -> None:
        """Record one span from ``start`` to ``end`` (``perf_counter`` seconds)."""
        pid, tid = self._track(process, thread or threading.current_thread().name)
        event = {"ph": "X", "name": name, "cat": cat, "pid": pid, "tid": tid,
                 "ts": round((start - self.start) * 1e6, 3), "dur": round(max(end - start, 0.0) * 1e6, 3)}
        if args:
            event["args"] = args
        with self._lock:
            self.events.append(event)

    @contextmanager
    def span(self, name: str, cat: str, *, process: str = "host", thread: str | None = None,
             args: dict | None = None) -> Iterator[None]:
        """Record the time the ``with`` block takes."""
        start = time.perf_counter()
        try:
            yield
        finally:
            self.complete(name, cat, start, time.perf_counter(), process=process, thread=thread, args=args)

    def cuda_spans(self, spans: list[tuple]) -> None:
        """Record ``(name, stream, start_event, end_event)`` spans timed by CUDA events
        (``enable_timing=True``), on one track per stream. Waits for the last event."""
        import torch

        if not spans:
            return
        if self._cuda_ref is None:
            ref = torch.cuda.Event(enable_timing=True)
            ref.record()
            ref.synchronize()
            self._cuda_ref = (ref, time.perf_counter())
        ref, host = self._cuda_ref
        for _, _, _, end in spans:
            end.synchronize()
        for name, stream, start, end in spans:
            begin = host + ref.elapsed_time(start) / 1e3
            self.complete(name, "cuda", begin, begin + start.elapsed_time(end) / 1e3, process="cuda",
                          thread=f"stream {stream.stream_id}")

    def to_json(self) -> dict:
        with self._lock:
            return {"traceEvents": list(self.events), "displayTimeUnit": "ms"}

    def write(self, path) -> None:
        """Save as a Chrome-trace JSON file."""
        with open(path, "w") as f:
            json.dump(self.to_json(), f)
