"""The reference interpreter of `dl`: xDSL's Interpreter with each op's torch reference."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch
from xdsl.dialects.builtin import ModuleOp
from xdsl.interpreter import (
    Interpreter,
    InterpreterFunctions,
    ReturnedValues,
    impl,
    impl_terminator,
    register_impls,
)
from xdsl.interpreters.func import FuncFunctions

from ..dialects import ALL_OPS, FusedOp, ParamOp, TorchCallOp, YieldOp


def _generic(op_cls):
    def run(self, interpreter, op, args):
        out = op.reference(*args)
        return out if isinstance(out, tuple) else (out,)

    return impl(op_cls)(run)


class DLReference(InterpreterFunctions):
    """Runs every `dl` op by its `reference`; parameters and torch calls come from the tables."""

    def __init__(self, params: dict[str, torch.Tensor], calls: dict[str, Callable] | None = None):
        self.params = params
        self.calls = calls or {}

    @impl(ParamOp)
    def run_param(self, interpreter, op: ParamOp, args):
        try:
            return (self.params[op.pname],)
        except KeyError:
            raise KeyError(f"dl.param {op.pname!r} has no value in the parameter table") from None

    @impl(TorchCallOp)
    def run_torch_call(self, interpreter, op: TorchCallOp, args):
        fn = self.calls.get(op.node.data)
        if fn is None:
            out = op.resolve()(*args)
            return out if isinstance(out, tuple) else (out,)
        return tuple(fn(*args))

    @impl(FusedOp)
    def run_fused(self, interpreter, op: FusedOp, args):
        return interpreter.run_ssacfg_region(op.body, args, "dl.fused")

    @impl_terminator(YieldOp)
    def run_yield(self, interpreter, op: YieldOp, args):
        return ReturnedValues(args), ()


for _cls in ALL_OPS:
    if _cls not in (ParamOp, TorchCallOp, FusedOp, YieldOp):
        setattr(DLReference, f"run_{_cls.name.replace('.', '_')}", _generic(_cls))
register_impls(DLReference)


def run_reference(
    module: ModuleOp,
    inputs: Sequence[Any],
    params: dict[str, torch.Tensor],
    calls: dict[str, Callable] | None = None,
    fn: str = "forward",
) -> tuple:
    """Execute `fn` of the module on the inputs with the torch reference of every op."""
    interp = Interpreter(module)
    interp.register_implementations(FuncFunctions())
    interp.register_implementations(DLReference(params, calls))
    return tuple(interp.call_op(fn, tuple(inputs)))
