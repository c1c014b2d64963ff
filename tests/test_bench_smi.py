"""bench/smi.py: nvidia-smi's samples (here a stand-in script writing its CSV lines) summarized per named phase and
per time window; without nvidia-smi every summary is empty."""

import os
import sys
import time

BENCH = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "bench")
sys.path.insert(0, BENCH)

import smi  # noqa: E402


def _fake_nvidia_smi(folder, base: float, mhz: list[int]) -> None:
    """An `nvidia-smi` writing the lines `--query-gpu=... -lms 20` would: a sample every 20 ms from `base` (local
    time), the SM clock from `mhz` in turn, 500 W, 40 °C, and the power-cap reason (0x4) on samples under 1900 MHz."""
    script = folder / "nvidia-smi"
    script.write_text(f"""#!{sys.executable}
import datetime, time
for i, mhz in enumerate({mhz!r}):
    now = datetime.datetime.fromtimestamp({base!r} + 0.02 * i).strftime("%Y/%m/%d %H:%M:%S.%f")[:-3]
    reasons = "0x0000000000000004" if mhz < 1900 else "0x0000000000000000"
    print(f"{{now}}, {{mhz}}, 500.00, 40, {{reasons}}", flush=True)
time.sleep(60)
""")
    script.chmod(0o755)


def test_phases_and_windows_summarize_their_own_samples(tmp_path, monkeypatch):
    base = time.time()
    _fake_nvidia_smi(tmp_path, base, [1980] * 10 + [1700] * 10)
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ['PATH']}")
    s = smi.Smi(str(tmp_path / "smi.csv"), period_ms=20)
    with s.phase("call"):  # (a phase records its wall-clock span)
        pass
    (name, t0, t1), = s.phases
    assert name == "call" and t0 <= t1
    s.phases = [("fast", base - 0.001, base + 0.19), ("slow", base + 0.199, base + 0.39)]
    deadline = time.time() + 30
    while len(s._samples()) < 20 and time.time() < deadline:
        time.sleep(0.05)
    whole = s.window(base - 1, base + 1)
    assert whole == {"sm_mhz": 1840, "watts": 500.0, "power_capped": 0.5}
    assert s.window(base + 0.199, base + 0.39)["sm_mhz"] == 1700
    phases = s.stop()
    assert phases["fast"] == {"samples": 10, "sm_mhz_median": 1980, "sm_mhz_min": 1980, "power_w_median": 500.0,
                              "power_w_max": 500.0, "temp_c_max": 40, "power_capped": 0.0}  # fmt: skip
    assert phases["slow"]["samples"] == 10 and phases["slow"]["sm_mhz_median"] == 1700
    assert phases["slow"]["power_capped"] == 1.0


def test_without_nvidia_smi_every_summary_is_empty(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path))  # (no nvidia-smi on it)
    s = smi.Smi(str(tmp_path / "smi.csv"))
    with s.phase("a"):
        pass
    assert s.window(0, time.time() + 1) == {} and s.stop() == {}
