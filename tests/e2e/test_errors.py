"""Errors a user meets first, each one FrontendError (or Python's own TypeError) in one message naming the cause:
a call that does not fit forward's signature, a wrong hidden size (no fake-tensor log on stderr), a plain function."""

import copy
import io
import logging
import pickle
import re

import pytest
import torch

import dlblas_compiler as dc
from dlblas_compiler.models import BlockConfig, LlamaBlock, llama_block_inputs, randomize_

from ..hf import llama_layer_and_inputs


@pytest.fixture
def block():
    cfg = BlockConfig()
    return randomize_(LlamaBlock(cfg)).eval(), llama_block_inputs(cfg, batch=1, seq=8)


@pytest.mark.parametrize(
    "count, given, cause",
    [(2, "given 2 positional", "missing a required argument: 'sin'"), (4, "given 4 positional", "too many positional")],
)
def test_wrong_argument_count_says_what_forward_takes(block, count, given, cause):
    model, (x, cos, sin) = block
    args = (x, cos, sin, sin)[:count]
    with torch.no_grad(), pytest.raises(dc.FrontendError) as err:
        dc.compile(model, backend="reference")(*args)
    msg = str(err.value)
    assert msg.startswith("LlamaBlock.forward(x, cos, sin) takes 3 arguments")
    assert given in msg and cause in msg


def test_hf_layer_given_too_many_arguments_names_the_clash():
    layer, (x,), kw = llama_layer_and_inputs()
    with torch.no_grad(), pytest.raises(dc.FrontendError, match="given 2 positional and 2 keyword") as err:
        dc.compile(layer, backend="reference")(x, None, **kw)
    assert "multiple values for argument 'attention_mask'" in str(err.value)


def test_wrong_hidden_size_is_one_error_and_no_log(block, capfd):
    """symbolic_trace path: the importer's fake-tensor run names the node and source line, without torch's
    'While executing' traceback and without FakeTensorMode's ~40-line log."""
    model, (x, cos, sin) = block
    with torch.no_grad(), pytest.raises(dc.FrontendError) as err:
        dc.compile(model, backend="reference")(torch.randn(1, 8, 48), cos, sin)
    msg = str(err.value)
    assert "models.py:" in msg and "self.weight * x.to(dtype)" in msg and "broadcast" in msg
    assert "While executing" not in msg and "Original traceback" not in msg
    assert capfd.readouterr().err == ""


def test_wrong_hidden_size_through_dynamo_is_one_error_and_no_log(capfd):
    """A Hugging Face layer (captured by dynamo): the op's source line from dynamo's stack, torch's error, nothing
    on stderr, and no chained dynamo exception with its hints."""
    layer, _, kw = llama_layer_and_inputs()
    with torch.no_grad(), pytest.raises(dc.FrontendError) as err:
        dc.compile(layer, backend="reference")(torch.randn(1, 8, 48), **kw)
    msg = str(err.value)
    assert msg.startswith("cannot compute the shape of an op of LlamaDecoderLayer at ")
    assert "modeling_llama.py:" in msg and "hidden_states.to(input_dtype)" in msg and "broadcast" in msg
    assert err.value.__cause__ is None and err.value.__suppress_context__
    assert capfd.readouterr().err == ""


def test_wrong_hidden_size_through_a_compiled_forward_is_one_error_and_no_log(capfd, fresh_dynamo):
    """`dc.compile(model.forward)` (the generate() path: dynamo traces each call): the same one-line error. (With
    `torch.compile(..., backend="dlblas")` dynamo's own tracing fails before any backend runs, as with Inductor.)"""
    layer, (x,), kw = llama_layer_and_inputs()
    fn = dc.compile(layer.forward, backend="reference")
    with torch.no_grad(), pytest.raises(dc.FrontendError) as err:
        fn(torch.randn(1, 8, 48), **kw)
    msg = str(err.value)
    assert msg.startswith("cannot compute the shape of an op of LlamaDecoderLayer at ")
    assert "modeling_llama.py:" in msg and "broadcast" in msg
    assert capfd.readouterr().err == ""
    fake_log = logging.getLogger("torch._subclasses.fake_tensor")  # quiet during a call only
    assert fake_log.filter(fake_log.makeRecord(fake_log.name, logging.ERROR, __file__, 1, "outside a call", (), None))
    with torch.no_grad():  # the right size still compiles, and equals eager
        torch.testing.assert_close(fn(x, **kw), layer(x, **kw), rtol=1e-5, atol=1e-5)


def _gate(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return torch.nn.functional.silu(a) * b + 1.0


def test_a_plain_function_compiles_through_dynamo():
    a, b = torch.randn(4, 32), torch.randn(4, 32)
    fn = dc.compile(_gate, backend="interpret")
    with torch.no_grad():
        torch.testing.assert_close(fn(a, b), _gate(a, b), rtol=1e-5, atol=1e-5)
    assert len(fn.compilations) == 1 and fn.report().patterns == ["row"]
    with pytest.raises(TypeError, match="missing 1 required positional argument: 'b'"):  # Python's own message
        fn(a)


def test_not_callable_is_a_type_error():
    with pytest.raises(TypeError, match="takes an nn.Module or a callable, got int"):
        dc.compile(3)


class _DataDependent(torch.nn.Module):
    def forward(self, x):
        k = x.argmax().item()  # (a size from a tensor's values: JetMoE's `expert_size.tolist()`)
        return x[: k + 1] * 2


def test_a_size_from_a_tensors_values_names_the_line_and_says_to_compile_the_forward(fresh_dynamo):
    """One graph cannot hold a size read from values; the error names the node and its line, and says what works:
    compiling the forward, where dynamo runs that code eagerly between graphs (checked: it gives eager's answer)."""
    model, x = _DataDependent(), torch.randn(8)
    with pytest.raises(dc.FrontendError, match=r"(?s)test_errors.py.*model.forward = dc.compile\(model.forward\)"):
        dc.compile(model, backend="reference")(x)
    model.forward = dc.compile(model.forward, backend="reference")
    with torch.no_grad():
        torch.testing.assert_close(model(x), _DataDependent()(x))


@pytest.mark.parametrize("options,message", [
    ({"pipeline": "recognize{"}, "pipeline 'recognize{' cannot be parsed"),
    ({"pipeline": ","}, "cannot be parsed"),
    ({"pipeline": "cse,nosuchpass"}, "unknown pass 'nosuchpass'"),
    ({"pipeline": 3}, "pipeline must be a string"),
    ({"strict": "no"}, "strict must be True or False, got 'no'"),
    ({"check_each_pass": "0"}, "check_each_pass must be True or False"),
    ({"max_specializations": True}, "max_specializations must be a positive int"),
])  # fmt: skip
def test_bad_option_values_are_clear_errors_at_compile(options, message):
    """Each is a ValueError naming the option when `dc.compile` is called (before: xDSL's parse error, a
    BaseException, at the first call; an unknown pass at the first call; `strict="no"` turned strict on)."""
    with pytest.raises(ValueError, match=re.escape(message)):
        dc.compile(torch.nn.Linear(4, 4), backend="reference", **options)


def test_options_given_as_lists_numbers_and_home_paths(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path))
    cm = dc.compile(torch.nn.Linear(4, 4), backend="reference", pipeline=["cse", "fuse"], strict=1, dump_ir="~/dbg")
    assert cm.options.pipeline == "cse,fuse" and cm.options.strict is True
    assert cm.options.dump_ir == str(tmp_path / "dbg")
    (tmp_path / "file").write_text("")
    with pytest.raises(ValueError, match="dump_ir .* names a file, not a folder"):
        dc.compile(torch.nn.Linear(4, 4), backend="reference", dump_ir=str(tmp_path / "file"))


def test_a_compiled_module_pickles_without_its_compiles():
    """pickle, torch.save and deepcopy copy the model and the options; the copy compiles at its first call (before,
    pickling failed on a local function of the compiled program)."""
    m = torch.nn.Sequential(torch.nn.Linear(16, 16), torch.nn.ReLU(), torch.nn.Linear(16, 8)).eval()
    cm = dc.compile(m, backend="interpret")
    x = torch.randn(4, 16)
    with torch.no_grad():
        y = cm(x)
        buf = io.BytesIO()
        torch.save(cm, buf)
        buf.seek(0)
        for copy_ in (pickle.loads(pickle.dumps(cm)), torch.load(buf, weights_only=False), copy.deepcopy(cm)):
            assert copy_.model is not m and not copy_._specs
            torch.testing.assert_close(copy_(x), y, rtol=1e-5, atol=1e-6)
            copy_.model[0].weight.mul_(2)
            torch.testing.assert_close(copy_(x), copy_.model(x), rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(cm(x), y)
