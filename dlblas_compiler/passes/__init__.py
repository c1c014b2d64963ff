"""Passes over `dl` IR, registered by name, and the pipeline runner."""

from . import algebraic, classify, recognize  # noqa: F401  (registers the passes; `fuse` registers from fusion/)
from .pipeline import PipelineResult, run_pipeline
from .registry import PASSES, parse_pipeline, register_pass

DEFAULT_PIPELINE = "canonicalize,cse,recognize,algebraic,cse,dce,classify,fuse"

__all__ = ["PASSES", "DEFAULT_PIPELINE", "PipelineResult", "parse_pipeline", "register_pass", "run_pipeline"]
