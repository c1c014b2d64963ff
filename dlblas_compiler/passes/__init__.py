"""Passes over `dl` IR, registered by name, and the pipeline runner."""

from . import classify  # noqa: F401  (registers the pass)
from .pipeline import PipelineResult, run_pipeline
from .registry import PASSES, parse_pipeline, register_pass

DEFAULT_PIPELINE = "canonicalize,cse,dce,classify"

__all__ = ["PASSES", "DEFAULT_PIPELINE", "PipelineResult", "parse_pipeline", "register_pass", "run_pipeline"]
