"""The SM clock while something runs: NVML samples in a background thread, so that a timing can
say at what clock it was taken (the library timings and the microbenchmarks record it)."""
from __future__ import annotations

import statistics
import threading
import time


class ClockSampler:
    """SM clock (MHz) through NVML every `period_s`, in a thread; window(t0) sums up the samples
    taken since t0 (time.monotonic()). Without NVML (no pynvml, no driver) it samples nothing."""

    def __init__(self, period_s: float = 0.02):
        self.samples: list = []
        self._stop = threading.Event()
        try:
            import pynvml
            pynvml.nvmlInit()
            self._h = pynvml.nvmlDeviceGetHandleByIndex(0)
            self._nvml = pynvml
        except Exception:
            self._nvml = None
        self._t = threading.Thread(target=self._run, args=(period_s,), daemon=True)
        if self._nvml is not None:
            self._t.start()

    def _run(self, period_s):
        n = self._nvml
        while not self._stop.is_set():
            try:
                self.samples.append((time.monotonic(), n.nvmlDeviceGetClockInfo(self._h, n.NVML_CLOCK_SM)))
            except Exception:
                pass
            time.sleep(period_s)

    def window(self, t0: float) -> dict | None:
        xs = [c for t, c in list(self.samples) if t >= t0]
        if not xs:
            return None
        return {"samples": len(xs), "median": statistics.median(xs), "min": min(xs), "max": max(xs)}

    def stop(self):
        self._stop.set()
