"""Execution of a compiled specialization: the Program of typed steps (kernel, torch, reference), derived
weights, CUDA-graph capture, kernel-vs-reference selection, eager's output aliasing, and the reference
interpreter of `dl` (xDSL's Interpreter with each op's torch reference)."""

from __future__ import annotations

from .ops import register_op_step
from .program import Program, build_program
from .reference import run_reference

__all__ = ["Program", "build_program", "register_op_step", "run_reference"]
