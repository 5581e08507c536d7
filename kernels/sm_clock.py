"""The SM clock while something runs: NVML samples in a background thread, so that a timing can
say at what clock it was taken (the library timings and the microbenchmarks record it), with the
board's power draw and the reasons NVML gives for holding the clock down (a sampled clock can read
1980 MHz while the power limit holds the SMs lower between samples: docs/validation.md, the FA3 set)."""
from __future__ import annotations

import functools
import operator
import statistics
import threading
import time


# NVML's clock event (throttle) reasons, bit by bit (NVML API reference, nvmlClocksEventReasons /
# nvmlClocksThrottleReasons): why the clock is below the maximum when a sample is taken
THROTTLE_REASONS = {0x1: "gpu_idle", 0x2: "applications_clocks_setting", 0x4: "sw_power_cap",
                    0x8: "hw_slowdown", 0x10: "sync_boost", 0x20: "sw_thermal_slowdown",
                    0x40: "hw_thermal_slowdown", 0x80: "hw_power_brake_slowdown", 0x100: "display_clock_setting"}


def throttle_names(mask: int) -> list:
    """The names of the reasons set in an NVML reasons bitmask (unknown bits as hex)."""
    names = [name for bit, name in THROTTLE_REASONS.items() if mask & bit]
    rest = mask & ~sum(THROTTLE_REASONS)
    return names + ([hex(rest)] if rest else [])


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
        while not self._stop.is_set():
            self.sample()
            time.sleep(period_s)

    def sample(self) -> None:
        """One sample: (time, SM clock MHz, power W or None, reasons bitmask or None)."""
        n = self._nvml
        if n is None:
            return
        h = self._h
        try:
            clock = n.nvmlDeviceGetClockInfo(h, n.NVML_CLOCK_SM)
        except Exception:
            return
        power = reasons = None
        try:
            power = n.nvmlDeviceGetPowerUsage(h) / 1000.0          # milliwatts
        except Exception:
            pass
        for name in ("nvmlDeviceGetCurrentClocksEventReasons", "nvmlDeviceGetCurrentClocksThrottleReasons"):
            try:
                reasons = getattr(n, name)(h)
                break
            except Exception:
                continue
        self.samples.append((time.monotonic(), clock, power, reasons))

    def window(self, t0: float) -> dict | None:
        """The samples since t0: the clock's median, min and max (MHz), and where NVML gave them the
        power draw's median and max (W) and every clock reason seen."""
        rows = [r for r in list(self.samples) if r[0] >= t0]
        if not rows:
            return None
        xs = [r[1] for r in rows]
        out = {"samples": len(xs), "median": statistics.median(xs), "min": min(xs), "max": max(xs)}
        watts = [r[2] for r in rows if r[2] is not None]
        if watts:
            out["power_w_median"], out["power_w_max"] = statistics.median(watts), max(watts)
        masks = [r[3] for r in rows if r[3] is not None]
        if masks:
            out["clock_reasons"] = throttle_names(functools.reduce(operator.or_, masks))
        return out

    def stop(self):
        self._stop.set()
