"""Fusion: the planner (the `fuse` pass), the one pattern API, and the template protocol and registry.

Imports nothing above it: templates (codegen's, or a user's) register themselves here, and the planner asks
them only through the protocol (`fusion.templates`).
"""

from . import builtin  # noqa: F401  (registers the built-in patterns)
from .patterns import PATTERNS, FusionPattern, Match, P, patterns_by_priority, register_fusion_pattern, unregister_fusion_pattern
from .planner import LEGALITY, FusePass, Plan, external_inputs, fusion_notes, rule
from .templates import (
    TEMPLATES,
    CallLowering,
    CallTemplate,
    KernelLowering,
    KernelTemplate,
    Lowered,
    PlannedTemplate,
    ReferenceLowering,
    Template,
    WhyNot,
    get_template,
    register_template,
    unregister_template,
)

__all__ = [
    "PATTERNS", "FusionPattern", "Match", "P", "patterns_by_priority", "register_fusion_pattern",
    "unregister_fusion_pattern", "LEGALITY", "FusePass", "Plan", "external_inputs", "fusion_notes", "rule",
    "TEMPLATES", "CallLowering", "CallTemplate", "KernelLowering", "KernelTemplate", "Lowered", "PlannedTemplate",
    "ReferenceLowering", "Template", "WhyNot", "get_template", "register_template", "unregister_template",
]  # fmt: skip
