"""Tuning: search spaces, search policies (grid, random, Bayesian), the profiler and the persistent cache."""

from .cache import CacheEntry, CacheKey, DeviceFingerprint, TuneCache, bucket, default_path, device_fingerprint
from .policies import POLICIES, Progress, Trial, TuneResult, bayes, grid, random
from .profiler import TuningCheckError, as_outputs, benchmark, in_turn, make_objective, paired
from .space import Config, SearchSpace, pow2
from .tuner import (
    TUNE_MODES,
    CandidateFault,
    TuneJob,
    TuneMode,
    TuneOutcome,
    TuningError,
    default_cache,
    progress_bar,
    searches,
    tune,
)
from .lockstep import Lockstep

__all__ = [
    "Config",
    "SearchSpace",
    "pow2",
    "POLICIES",
    "Progress",
    "Trial",
    "TuneResult",
    "grid",
    "random",
    "bayes",
    "benchmark",
    "in_turn",
    "paired",
    "make_objective",
    "as_outputs",
    "TuningCheckError",
    "CacheKey",
    "CacheEntry",
    "DeviceFingerprint",
    "TuneCache",
    "bucket",
    "default_path",
    "device_fingerprint",
    "TUNE_MODES",
    "TuneMode",
    "TuneJob",
    "TuneOutcome",
    "TuningError",
    "CandidateFault",
    "default_cache",
    "tune",
    "searches",
    "progress_bar",
    "Lockstep",
]
