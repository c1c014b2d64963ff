"""The report as text: concise (one line per region, notes summarized) or detailed (every op, config and note).

Helpers shared by both: readable names for the callables PyTorch runs (`torch.addmm`, not
`torch._VariableFunctionsClass.addmm`), a region's ops in a few words, times, counts with "×N".
"""

from __future__ import annotations

from collections import Counter
from typing import Any

Report = Any  # (the Report of `report/__init__.py`, which imports this module)

# torch's internal homes of its public functions -> the public spelling
_PUBLIC = (
    ("torch._VariableFunctionsClass.", "torch."),
    ("torch._C._VariableFunctions.", "torch."),
    ("torch._C._nn.", "torch.nn.functional."),
    ("torch._C._linalg.", "torch.linalg."),
    ("torch._C._special.", "torch.special."),
    ("torch._C._fft.", "torch.fft."),
    ("torch._C.TensorBase.", "torch.Tensor."),
    ("torch._tensor.Tensor.", "torch.Tensor."),
    ("_operator.", "operator."),
    ("builtins.", ""),
)
VIEWS = ("dl.reshape", "dl.permute", "dl.slice", "dl.broadcast")  # free in a region's description
MANY = 3  # notes of one kind above this many are summarized in the concise text


def readable(callee: str) -> str:
    """`torch._VariableFunctionsClass.addmm` -> `torch.addmm`, `_operator.add` -> `operator.add`."""
    for internal, public in _PUBLIC:
        if callee.startswith(internal):
            return public + callee[len(internal) :]
    return callee


def times(counts: Counter | dict, sep: str = ", ") -> str:
    """`{"a": 2, "b": 1}` -> "a ×2, b"."""
    return sep.join(f"{k} ×{n}" if n > 1 else k for k, n in counts.items())


def nbytes(n: float) -> str:
    for unit in ("B", "KB", "MB", "GB"):
        if n < 1024 or unit == "GB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return str(n)


def seconds(s: float) -> str:
    return f"{s * 1e6:.1f} µs" if s < 1e-3 else f"{s * 1e3:.2f} ms"


def one_line(note: str) -> str:
    """A note on one line, torch's internal paths in it spelled as users spell them."""
    for internal, public in _PUBLIC:
        if public:
            note = note.replace(internal, public)
    return " ".join(note.split())


def op_words(ops: list[str]) -> str:
    """A region's ops in a few words: views left out, repeats counted ("rms_norm linear rotary×2")."""
    words: list[list] = []
    for name in ops:
        if name in VIEWS:
            continue
        short = name.removeprefix("dl.")
        if words and words[-1][0] == short:
            words[-1][1] += 1
        else:
            words.append([short, 1])
    return " ".join(w if n == 1 else f"{w}×{n}" for w, n in words) or "views"


def summary(rep: Report) -> str:
    """The counts line: regions by what runs them, then what runs outside them."""
    c = rep.counts()
    line = f"{regions_line(c)}; {count(c['torch_fallbacks'], 'torch fallback')} (opaque calls)"
    if c["unfused"]:
        line += f"; {count(c['unfused'], 'unfused dl op')} (their torch reference)"
    if c["computed_once"]:
        line += f"; {count(c['computed_once'], 'op')} computed once (weight preparation)"
    return line


def regions_line(c: dict[str, int]) -> str:
    """The regions counted by what runs them: "5 fused regions: 3 generated kernels, 2 references (...)"."""
    references = f"{count(c['references'], 'reference')} (cuBLAS, SDPA, torch ops)"
    parts = [count(c["kernels"], "generated kernel"), references]
    if c["callables"]:
        parts.append(count(c["callables"], "pattern callable"))
    return f"{count(c['regions'], 'fused region')}: {', '.join(parts)}"


def count(n: int, noun: str) -> str:
    """`count(1, "kernel")` -> "1 kernel", `count(2, "kernel")` -> "2 kernels"."""
    return f"{n} {noun}" if n == 1 else f"{n} {noun}s"


def how(rep: Report, i: int) -> str:
    """What runs region i: its kernel (and tuned time), or what runs instead and why."""
    r = rep.regions[i]
    c = rep.choice(r)
    if c is None:
        return "not run"
    if c.impl == "kernel":
        text = f"kernel {c.region}"
        if c.config and c.config.get("MM") == 2:  # (the GEMM template's MM configs)
            text = f"cuBLAS GEMM adding into the residual in place ({c.region} runs no kernel)"
        elif c.config and c.config.get("MM"):
            text = f"cuBLAS GEMM + epilogue kernel {c.region}"
        if c.time:
            text += f", tuned {seconds(c.time)}" + (f" (default {seconds(c.default_time)})" if c.default_time else "")
            text += ", from the cache" if c.from_cache else ""
        return text
    return f"{c.impl}: {c.reason}" if c.reason else c.impl


def concise_notes(notes: list[str]) -> list[str]:
    """One line each, repeats counted. Why a torch call or a view is not fused goes (the counts say where they
    are); the many why-not notes of one kind (ops left unfused, torch calls their converter refused) are
    summarized in one line."""
    plain: Counter = Counter()
    unfused: list[str] = []
    refused: list[str] = []
    for note in map(one_line, notes):
        if note.startswith("not fused: "):
            op = note.removeprefix("not fused: ").split(" ", 1)[0]
            if op != "dl.torch_call" and op not in VIEWS:
                unfused.append(note)
        elif note.startswith("torch_call "):
            refused.append(note)
        else:
            plain[note] += 1
    lines = [f"{n} (×{k})" if k > 1 else n for n, k in plain.items()]
    if len(refused) > MANY:
        lines.append(f"{len(refused)} torch calls the converters refused (some later removed, as a mask found causal "
                     "is; those still run are the fallbacks above): the detailed text says why")
    else:
        lines.extend(refused)
    if len(unfused) > MANY:
        ops = Counter(n.removeprefix("not fused: ").split(" ", 1)[0] for n in unfused)
        lines.append(f"not fused: {times(ops)} (the detailed text says why)")
    else:
        lines.extend(unfused)
    return lines


def concise(rep: Report) -> str:
    lines = [header(rep), summary(rep)]
    lines.append("ops by mapping kind: " + (", ".join(f"{k} {n}" for k, n in sorted(rep.kinds.items())) or "none"))
    for i, r in enumerate(rep.regions):
        lines.append(f"  [{i}] {r.pattern} ({op_words(r.ops)}): {how(rep, i)}")
    if rep.fallbacks:
        lines.append(f"torch fallbacks (run by PyTorch each call): {times(Counter(f.name for f in rep.fallbacks))}")
    if rep.unfused:
        lines.append(f"unfused ops (torch reference each call): {times(rep.unfused)}")
    if rep.once:
        lines.append(f"computed once (weight preparation): {times(rep.once)}")
    notes = concise_notes(rep.notes)
    if notes:
        lines.append("notes:")
        lines.extend(f"  {n}" for n in notes)
    lines.append("(report.text(detail=True): every op, config, source line and note)")
    return "\n".join(lines)


def detailed(rep: Report) -> str:
    lines = [header(rep), summary(rep)]
    lines.append("ops by mapping kind: " + (", ".join(f"{k} {n}" for k, n in sorted(rep.kinds.items())) or "none"))
    per_call = rep.ops - rep.once
    lines.append("top-level ops each call: " + ", ".join(f"{k} x{n}" for k, n in per_call.most_common()))
    if rep.once:
        lines.append("computed once (weight preparation): " + ", ".join(f"{k} x{n}" for k, n in rep.once.most_common()))
    lines.append(f"fused regions: {len(rep.regions)}")
    for i, r in enumerate(rep.regions):
        saved = f"; intermediate traffic removed ≈ {nbytes(r.saved_bytes)}" if r.saved_bytes else ""
        lines.append(f"  [{i}] {r.pattern}: {' '.join(r.ops)} ({', '.join(r.kinds)}){saved}")
    if rep.kernels:
        lines.append(f"what runs each region: {len(rep.kernels)}")
        for k in rep.kernels:
            timing = ""
            if k.time:
                source = ", from the cache" if k.from_cache else f", {k.trials} trials"
                timing = f", tuned {k.time * 1e6:.1f} µs{source}"
                if k.default_time:
                    timing += f" (default config {k.default_time * 1e6:.1f} µs)"
            reason = f" ({k.reason})" if k.reason else ""
            lines.append(f"  {k.region} [{k.impl}{reason}]: {k.config or ''}{timing}")
    lines.append(f"torch fallbacks: {len(rep.fallbacks)}")
    lines.extend(f"  {f}" for f in rep.fallbacks)
    if rep.unfused:
        lines.append(f"unfused ops (torch reference each call): {times(rep.unfused)}")
    if rep.notes:
        lines.append("notes:")
        lines.extend(f"  {one_line(n)}" for n in rep.notes)
    return "\n".join(lines)


def header(rep: Report) -> str:
    return f"dlblas_compiler report: {rep.title} (backend {rep.backend}, compiled in {rep.compile_seconds:.2f} s)"
