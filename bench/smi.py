"""nvidia-smi sampling beside a benchmark: the SM clock, power, temperature and the active clock-event reasons, every
`period_ms` into a CSV, summarized per named phase (`phase(name)`, then `stop()`) or per time window
(`window(t0, t1)`), so that a timing can be matched to the clock it ran at (the H200's power limiter lowers the
clock under sustained load, bench/NOTES.md 155 and 179). Where nvidia-smi is missing it records nothing and every
summary is empty."""

from __future__ import annotations

import bisect
import contextlib
import datetime
import statistics
import subprocess
import time

POWER_CAP = 0x4  # nvidia-smi's "SW power cap" clock-event reason bit


class Smi:
    QUERY = "timestamp,clocks.sm,power.draw,temperature.gpu,clocks_throttle_reasons.active"

    def __init__(self, path: str, period_ms: int = 100):
        self.path, self.phases = path, []
        self._read, self._rows = 0, []  # (bytes of the file parsed; its samples: time, MHz, W, °C, reasons)
        self.file = open(path, "w")
        cmd = ["nvidia-smi", f"--query-gpu={self.QUERY}", "--format=csv,noheader,nounits", "-lms", str(period_ms)]
        try:
            self.proc = subprocess.Popen(cmd, stdout=self.file, stderr=subprocess.DEVNULL)
        except OSError:
            self.proc = None

    def _samples(self) -> list[tuple]:
        """The samples so far (the file's new complete lines parsed once: a search's hundreds of windows each ask)."""
        self.file.flush()
        with open(self.path) as fh:
            fh.seek(self._read)
            text = fh.read()
        whole = text[: text.rfind("\n") + 1]  # (a line nvidia-smi is still writing waits for the next call)
        self._read += len(whole.encode())
        for line in whole.splitlines():
            f = [x.strip() for x in line.split(",")]
            try:  # (nvidia-smi writes local time, as time.time() counts)
                ts = datetime.datetime.strptime(f[0], "%Y/%m/%d %H:%M:%S.%f").timestamp()
                self._rows.append((ts, float(f[1]), float(f[2]), float(f[3]), int(f[4], 16)))
            except (ValueError, IndexError):
                continue
        return self._rows

    @contextlib.contextmanager
    def phase(self, name: str):
        """Names the samples taken while the block runs (until the GPU has finished its work)."""
        import torch

        t0 = time.time()
        try:
            yield
        finally:
            if torch.cuda.is_available():
                torch.cuda.synchronize()
            self.phases.append((name, t0, time.time()))

    def _between(self, t0: float, t1: float) -> list[tuple]:
        rows = self._samples()
        times = [r[0] for r in rows]
        return rows[bisect.bisect_left(times, t0) : bisect.bisect_right(times, t1)]

    def window(self, t0: float, t1: float) -> dict:
        """Mean clock and power between t0 and t1, and the share of samples the power limiter was capping."""
        rows = self._between(t0, t1)
        if not rows:
            return {}
        return {"sm_mhz": statistics.mean(r[1] for r in rows), "watts": statistics.mean(r[2] for r in rows),
                "power_capped": sum(bool(r[4] & POWER_CAP) for r in rows) / len(rows)}  # fmt: skip

    def stop(self) -> dict:
        """Ends the sampling. Per phase: samples, SM clock (median, min), power (median, max), temperature (max) and
        the share of power-capped samples."""
        if self.proc is None:
            return {}
        self.proc.terminate()
        self.proc.wait()
        out = {}
        for name, t0, t1 in self.phases:
            s = self._between(t0, t1)
            if s:
                sm, w = [x[1] for x in s], [x[2] for x in s]
                out[name] = {"samples": len(s), "sm_mhz_median": statistics.median(sm), "sm_mhz_min": min(sm),
                             "power_w_median": statistics.median(w), "power_w_max": max(w),
                             "temp_c_max": max(x[3] for x in s),
                             "power_capped": sum(bool(x[4] & POWER_CAP) for x in s) / len(s)}  # fmt: skip
        self.file.close()
        return out
