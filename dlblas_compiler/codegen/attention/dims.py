"""Head dims as power-of-two pieces: tl.arange and tl.dot take power-of-two widths, so a head of 192 dims
(DeepSeek's queries and keys) or 96 (Phi-3's) is read as pieces of 128 + 64 or 64 + 32 columns, its scores
summed over the pieces' products and its output accumulated piece by piece. A power-of-two head is one piece
and its kernel reads as before: `rd = tl.arange(0, D)`, one q, one k, one accumulator. Where pieces were not safe
(the prefill kernel under a mask, see prefill.padded), a head is read as one piece padded to the next power of
two, its columns past D masked (`padded_range`)."""

from __future__ import annotations

from ..source import Writer

MAX_HEAD_DIM = 256  # q/k and v head dims the template takes: multiples of 16 up to this


def head_parts(d: int) -> list[tuple[int, int]] | None:
    """A head dim as (first column, width) pieces of power-of-two widths, widest first: 128 -> [(0, 128)],
    192 -> [(0, 128), (128, 64)], 96 -> [(0, 64), (64, 32)]. None unless d is a multiple of 16 up to
    MAX_HEAD_DIM."""
    if d % 16 or not 16 <= d <= MAX_HEAD_DIM:
        return None
    parts, lo = [], 0
    for width in (256, 128, 64, 32, 16):
        if d - lo >= width:
            parts.append((lo, width))
            lo += width
    return parts


def dim_ranges(w: Writer, name: str, d: int, const: str) -> list[tuple[str, int]]:
    """Emit the column ranges of a head of d dims and return (suffix, width) per piece: `rd = tl.arange(0, D)`
    for one piece (suffix ""), else `rd0 = tl.arange(0, 128)`, `rd1 = 128 + tl.arange(0, 64)`, ..."""
    parts = head_parts(d)
    if len(parts) == 1:
        w(f"{name} = tl.arange(0, {const})")
        return [("", d)]
    for i, (lo, width) in enumerate(parts):
        w(f"{name}{i} = " + (f"{lo} + " if lo else "") + f"tl.arange(0, {width})  # head dims {lo}..{lo + width - 1}")
    return [(str(i), width) for i, (_, width) in enumerate(parts)]


def padded_width(d: int) -> int:
    """The width `padded_range` reads a head of d dims as: the next power of two."""
    return 1 << (d - 1).bit_length()


def padded_range(w: Writer, name: str, d: int, const: str) -> list[tuple[str, int]]:
    """Emit one column range of the next power of two above d and its mask (`rd = tl.arange(0, 128)`,
    `rd_in = rd < D`), and return [("", width)]: loads fill the padded columns with zeros, which add nothing to
    the scores or the output, and stores leave them out."""
    width = padded_width(d)
    w(f"{name} = tl.arange(0, {width})" + (f"  # head dims 0..{d - 1}, padded to {width}" if width != d else ""))
    w(f"{name}_in = {name} < {const}")
    return [("", width)]


def scores(w: Writer, q: str, k: str, pieces: list[tuple[str, int]], dot: str) -> None:
    """s = q k^T summed over the head's pieces (the later products accumulate into the first's)."""
    for i, (sfx, _) in enumerate(pieces):
        w(f"s = tl.dot({q}{sfx}, tl.trans({k}{sfx}){', s' if i else ''}{dot})")


def keep_test(mask_bool: bool, mask_mode: str) -> str:
    """The statement narrowing `keep` to the keys the loaded mask tile `mv` keeps: a boolean mask's True keeps,
    or drops in mask_mode "drop" (masked_fill's mask); an additive mask drops where it is -inf."""
    if not mask_bool:
        return "keep = keep & (mv.to(tl.float32) != float('-inf'))"
    return "keep = keep & (mv == 0)" if mask_mode == "drop" else "keep = keep & (mv != 0)"


def drop_scores(w: Writer, has_mask: bool, fill: str | None = None) -> None:
    """The scores of dropped keys become -inf. A key the mask drops is dropped as eager's math drops it, by adding
    -inf: a NaN or +inf score there stays NaN (NaN + -inf, inf - inf) and turns its row NaN, as in eager; a key
    past the length, or in the future under is_causal (which eager skips), leaves no trace. (A tile whose keys the
    mask drops for every row is still not read: docs/bad-inputs.md.) `has_mask` False also for a mask whose dropped
    keys are replaced by -inf (dl.sdpa's mask_mode "keep" and "drop"): they leave no trace either. `fill`: the
    finite score (in the kernel's units) such a mask puts in place of a dropped key's, where the key still counts."""
    if fill is not None:
        w(f"s = tl.where(keep, s, tl.where(seen, {fill}, float('-inf')))")
    elif has_mask:
        w("s = tl.where(keep, s, tl.where(seen, s + float('-inf'), float('-inf')))")
    else:
        w("s = tl.where(keep, s, float('-inf'))")


def fill_score(mask_mode: str, fill: float) -> str | None:
    """The score a mask_mode "keep" / "drop" mask puts in a dropped key's place, in log2 units (a boolean mask's), as
    kernel text; None for -inf (or mask_mode "sdpa"). A fill below float32's range once times log2(e) (the dtype's
    minimum, HF's masks) is float32's most negative value: the same softmax, since every dropped score of a row is
    the same value."""
    if mask_mode == "sdpa" or fill == float("-inf"):
        return None
    return repr(max(fill * 1.4426950408889634, -3.4028234663852886e38))
