"""The GEMM's epilogue, shared by every variant: after the K loop (or cuBLAS's product) each tile's accumulators
become Y's tile, and everything the planner attached to Y is computed on it in fp32 before one store per output:
bias, elementwise ops with other tensors (residual add, ...), column slices (one GEMM for q/k/v), reshapes
splitting the columns into heads and permutes (written straight into [B, H, S, D]), an RMSNorm over each head's
columns (Qwen3's q/k norms: the tile holds whole heads, reshaped [BLOCK_M, heads, D] for the statistics), rotary on
head columns (partner column gathered within the tile; a tile narrower than a head takes the matching slices of its
two halves; cos and sin shared by every head read once per tile), a gated activation of two column halves (dual
GEMM: two accumulators), and stores into an input at indexed rows (a KV-cache update, `index_copy` of k or v along
the tokens: each row's position read from the index). Split-K programs store partial sums and the last one of a
tile runs the epilogue."""

from __future__ import annotations

from collections import Counter

from xdsl.ir import Operation, SSAValue

from ...dialects import ConstantOp, FusedOp, IndexCopyOp, PermuteOp, ReshapeOp, RMSNormOp, RotaryOp, SliceOp
from ...dialects.types import dtype_of, shape_of
from .. import device
from ..exprs import Names, emit_pointwise, rotate_in_registers, round_to
from ..source import TL_DTYPE, Writer, row_indices, stored, wide_indices
from ..views import Layout, view_chain
from .plan import Cols, GemmPlan, canonical_strides, input_view
from .prologue import ONE_ROW_SQUARES, row_scale


class EpilogueEmitter:
    """The kernel's names, operands and index spaces, and the epilogue's emission (see the module docstring)."""

    def __init__(self, plan: GemmPlan, fused: FusedOp, name: str):
        self.plan, self.fused, self.name = plan, fused, name
        self.args = list(fused.block.args)
        self.outputs = list(fused.yielded.values)
        self.names = Names()
        self.wide = wide_indices([*self.args, *self.outputs])
        self.ext: list[tuple[SSAValue, Cols, SSAValue]] = []  # (region input, view it is read as, reader's value)
        self.spaces: dict[tuple, str] = {}
        self.dot = device.dot_args(dtype_of(plan.linear.weight))  # IEEE fp32 unless torch allows TF32
        # (a variant's hooks: the ext operand read from, and the output written into, the shared-memory tile
        # `c_part` instead of global memory: warp_specialized.py's TMA epilogue)
        self.smem_ext: int | None = None
        self.smem_out: int | None = None
        self.staging = None  # (set with the source: warp_specialized.Staging where WS=2 is built)
        # (the epilogue's text for a Gluon kernel, warp_specialized.py: only tensors whose layouts Gluon infers from
        # the accumulator's; Triton's compiler would convert the others)
        self.gluon = False

    def ext_operand(self, j: int) -> tuple[int, list[int]]:
        """External operand j: the region input it is read from (its index) and its canonical strides there."""
        v, c, res = self.ext[j]
        base, chain = input_view(v, set(self.fused.body_ops), self.args)
        lay = view_chain(Layout.contiguous(shape_of(base)), chain)
        return self.args.index(base), canonical_strides(lay, c, shape_of(res))

    def out_strides(self, k: int) -> list[int]:
        """Output k's canonical strides (the launch allocates it contiguous)."""
        r = self.outputs[k]
        return canonical_strides(shape_of(r), self.plan.info[r], shape_of(r))

    def emit(self, w: Writer, split_k: bool = True) -> None:
        """Everything after the K loop: split-K's partial sums and their reduction by the tile's last program
        (`split_k`: a kernel whose config may split K), the norm's row scaling and the bias on each accumulator, the
        epilogue ops, one store per output."""
        p = self.plan
        lin = p.linear
        has_bias = lin.bias is not None
        nrow = len(p.rows)
        if split_k:
            self._split_k(w)
            w("if last:")
            w.indent()
            w("if SPLIT_K > 1:")
            w.indent()
            self._reduce_partials(w)
            w.dedent()
        if p.rms is not None:  # the norm prologue's row statistics (see prologue.row_scale)
            row_scale(self, w)
        for s, off in enumerate(p.streams):
            if p.rms is not None:
                w("if not NORMED:")
                w(f"    acc{s} = acc{s} * rs[:, None]")
            if has_bias:
                w(f"acc{s} += tl.load(bias_ptr + rn + {off}, mask=nmask, other=0.0).to(tl.float32)[None, :]")
            w(f"y{s} = {round_to(f'acc{s}', lin.result)}")
        if self.wide:  # epilogue addresses (row * stride, head * stride) pass 2^31
            w("rm = rm.to(tl.int64)")
            w("rn = rn.to(tl.int64)")
        row_indices(w, "rm", nrow)  # canonical row dims
        names = self.names
        for o in self.fused.block.ops:
            if isinstance(o, ConstantOp):
                names[o.result] = o.triton()
        if len(p.streams) == 1:
            names[lin.result] = "y0"
        for u in lin.result.uses:
            if isinstance(u.operation, SliceOp) and u.operation.result in p.info:
                names[u.operation.result] = f"y{p.streams.index(p.info[u.operation.result].stream_lo)}"
        cones = self._cones()
        if cones is None:
            for o in p.epilogue:
                self._epilogue(w, o)
            for k in range(len(self.outputs)):
                self._store(w, k)
        else:  # each output's own ops and store only in tiles holding some of its columns (q, k, v of one GEMM)
            for c in dict.fromkeys(p.info.values()):
                self._space(w, c)  # (index spaces defined once, outside the branches)
            uses = Counter(o for cone in cones for o in cone)
            for o in p.epilogue:
                if uses[o] > 1:
                    self._epilogue(w, o)
            for k, (r, cone) in enumerate(zip(self.outputs, cones)):
                c = p.info[r]
                # in the cuBLAS-product pass the test is on scalars (`n_lo`, `n_hi`: `GemmEmitter.source`), so no
                # reduction crosses warps through shared memory; after a K loop it stays on rn's reductions, since there
                # the scalar test let Triton schedule the branches' code together and spill more (bench/NOTES.md 166)
                if self.gluon:  # (no reduction of rn there: the tile's columns from pid_n, as scalars)
                    w(f"holds = (pid_n * BLOCK_N + BLOCK_N > {c.lo}) & (pid_n * BLOCK_N < {c.hi})")
                else:
                    w("if MM:")
                    w(f"    holds = (n_hi > {c.lo}) & (n_lo < {c.hi})")
                    w("else:")
                    w(f"    holds = (tl.max(rn, 0) >= {c.lo}) & (tl.min(rn, 0) < {c.hi})")
                w(f"if holds:  # this tile holds columns of output {k}")
                w.indent()
                for o in p.epilogue:
                    if o in cone and uses[o] == 1:
                        self._epilogue(w, o)
                self._store(w, k)
                w.dedent()
        if split_k:
            w.dedent()

    def _cones(self) -> list[set[Operation]] | None:
        """Per output, the epilogue ops it depends on; None where the epilogue is emitted whole (one output, or
        two accumulators whose column ranges are relative to different streams)."""
        p = self.plan
        if len(self.outputs) < 2 or len(p.streams) > 1:
            return None
        producer = {o.results[0]: o for o in p.epilogue}
        cones = []
        for r in self.outputs:
            cone: set[Operation] = set()
            todo = [r]
            while todo:
                o = producer.get(todo.pop())
                if o is not None and o not in cone:
                    cone.add(o)
                    todo.extend(o.operands)
            cones.append(cone)
        return cones

    def _epilogue(self, w: Writer, o: Operation) -> None:
        """Emit one epilogue op (views only rename; external operands are loaded through their reader's view)."""
        names, res = self.names, o.results[0]
        if isinstance(o, (SliceOp, ReshapeOp, PermuteOp)):
            if res not in names:
                names[res] = names[o.operands[0]]
            return
        if isinstance(o, IndexCopyOp):  # the tile's values, stored at indexed rows of the destination (`_store`)
            names[res] = names[o.source]
            return
        ext_index = {(e[0], e[2]): j for j, e in enumerate(self.ext)}
        # (a rotary whose cos and sin are one table for every head loads them itself: `_rotary`)
        own = self._head_tables(o) if isinstance(o, RotaryOp) else {}
        if isinstance(o, RMSNormOp) and o.weight is not None:  # (one weight for every row and head: `_head_norm`)
            j = self._shared_by_heads(o.weight, res, rows=True)
            own = {o.weight: j} if j is not None else {}
        loaded = {v: self._load_ext(w, ext_index[(v, res)]) for v in o.operands if (v, res) in ext_index and v not in own}
        for v, t in loaded.items():
            names[v] = t
        if isinstance(o, RotaryOp):
            self._rotary(w, o, own)
        elif isinstance(o, RMSNormOp):
            self._head_norm(w, o, own.get(o.weight))
        else:
            emit_pointwise(w, names, o)
        for v in loaded:
            names.names.pop(v)

    def _store(self, w: Writer, k: int) -> None:
        r = self.outputs[k]
        if k == self.smem_out:  # (into the shared-memory tile, which the variant stores whole)
            w(f"c_part.store({self.names[r]}.to({TL_DTYPE[dtype_of(r)]}))")
            return
        idx, member = self._space(w, self.plan.info[r])
        scatter = self.plan.scatters.get(r)
        rows = "mmask"
        if scatter is not None:  # row i of the tile goes to the destination's position index[i] along that dim
            d = self.plan.info[r].perm[scatter.axis]
            pos = self.names.fresh("pos")
            w(f"{pos} = tl.load(ix{k}_ptr + i{d}, mask=mmask, other=0)")
            # (a position outside the destination's ix<k>_n, where torch's index_copy_ fails, writes nothing)
            rows = f"(mmask & ({pos} >= 0) & ({pos} < ix{k}_n))"
            idx[d] = f"{pos}[:, None]"
        addr = " + ".join(f"({e}) * o{k}_s{d}" for d, e in enumerate(idx))
        w(f"tl.store(out{k}_ptr + {addr}, {stored(self.names[r], dtype_of(r))}, mask={rows}[:, None] & {member})")


    def _split_k(self, w: Writer) -> None:
        """Split-K: each of SPLIT_K programs of a tile stores its partial sums (and a one-row tile's part of the
        RMSNorm's sum of squares, past every part's sums: `gemv.k_loop`); the last to finish
        (an acq_rel counter per tile) reduces them, resets the counter and runs the epilogue. The tiles from
        `slot0` on split (all of them, or a persistent kernel's last wave): tile pid's workspace slot is pid - slot0."""
        p = self.plan
        ns = len(p.streams)
        w("if SPLIT_K > 1:")
        w.indent()
        w("slots = num_m * num_n - slot0")
        w("slot = pid - slot0")
        w("offs = tl.arange(0, BLOCK_M)[:, None] * BLOCK_N + tl.arange(0, BLOCK_N)[None, :]")
        for s in range(ns):
            w(f"tl.store(ws_ptr + ((pid_k * slots + slot) * {ns} + {s}) * BLOCK_M * BLOCK_N + offs, acc{s})")
        if p.rms is not None:  # a one-row tile's part of the norm's sum of squares, after every part's sums
            w(f"if {ONE_ROW_SQUARES}:")
            w(f"    tl.store(ws_ptr + (SPLIT_K * slots * {ns} * BLOCK_N + pid_k * slots + slot) + tl.arange(0, 1), ssq)")
        w("tl.debug_barrier()  # (every thread's partial sums stored before one thread's release of the count)")
        w('last = tl.atomic_add(cnt_ptr + slot, 1, sem="acq_rel") == SPLIT_K - 1')
        w.dedent()
        w("else:")
        w.indent()
        w("last = True")
        w.dedent()

    def _reduce_partials(self, w: Writer) -> None:
        p = self.plan
        ns = len(p.streams)
        for s in range(ns):
            w(f"acc{s} = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)")
        w("for j in range(SPLIT_K):")
        w.indent()
        for s in range(ns):
            w(f'acc{s} += tl.load(ws_ptr + ((j * slots + slot) * {ns} + {s}) * BLOCK_M * BLOCK_N + offs, cache_modifier=".cg")')
        w.dedent()
        if p.rms is not None:
            w(f"if {ONE_ROW_SQUARES}:")
            w("    ssq = tl.zeros((1,), dtype=tl.float32)")
            w("    for j in range(SPLIT_K):")
            w(f'        ssq += tl.load(ws_ptr + (SPLIT_K * slots * {ns} * BLOCK_N + j * slots + slot) + tl.arange(0, 1), cache_modifier=".cg")')
        w("tl.atomic_xchg(cnt_ptr + slot, 0)")

    def _space(self, w: Writer, c: Cols) -> tuple[list[str], str]:
        """Canonical index expressions ([BLOCK_M,1] rows, [1,BLOCK_N] columns) and the column membership."""
        key = c.space()
        nrow = len(self.plan.rows)
        rows = [f"i{d}[:, None]" for d in range(nrow)]
        if key not in self.spaces:
            j = len(self.spaces)
            self.spaces[key] = f"c{j}"
            w(f"c{j} = rn - {c.lo}")
            w(f"m{j} = ((rn >= {c.lo}) & (rn < {c.hi}) & nmask)[None, :]")
            inner = 1
            for d in reversed(range(len(c.split))):
                size = c.split[d]
                w(f"c{j}_{d} = (c{j} // {inner}) % {size}" if inner > 1 else f"c{j}_{d} = c{j} % {size}")
                inner *= size
            if c.window is not None:  # only these positions of the innermost dim, which index from their start
                start, size = c.window
                last = len(c.split) - 1
                w(f"c{j}_{last} = c{j}_{last} - {start}")
                w(f"m{j} = m{j} & ((c{j}_{last} >= 0) & (c{j}_{last} < {size}))[None, :]")
        j = self.spaces[key][1:]
        cols = [f"c{j}_{d}[None, :]" for d in range(len(c.split))]
        return rows + cols, f"m{j}"

    def _load_ext(self, w: Writer, j: int) -> str:
        v, c, res = self.ext[j]
        if j == self.smem_ext:  # (its tile in shared memory, copied there by TMA: in the accumulator's layout)
            t = self.names.fresh("e")
            w(f"{t} = c_part.load(acc0.type.layout).to(tl.float32)")
            return t
        idx, member = self._space(w, c)
        addr = " + ".join(f"({e}) * e{j}_s{d}" for d, e in enumerate(idx))
        mask = f"mmask[:, None] & {member}"
        logical, own = shape_of(res), shape_of(v)
        own = (1,) * (len(logical) - len(own)) + own
        for i, (a, b) in enumerate(zip(own, logical)):
            if a not in (1, b):  # a narrower operand (partial rotary's cos/sin): no reads past its end
                mask += f" & ({idx[c.perm[i]]} < {a})"
        t = self.names.fresh("e")
        w(f"{t} = tl.load(e{j}_ptr + {addr}, mask={mask}, other=0.0).to(tl.float32)")
        return t

    def _head_norm(self, w: Writer, o: RMSNormOp, shared: int | None) -> None:
        """RMSNorm over each head's D columns, with dl.rms_norm's rounding: the tile (whole heads, BLOCK_N % D
        == 0) is reshaped [BLOCK_M, BLOCK_N // D, D] for each head's mean square. A weight shared by every row and
        head (`shared`: its ext index) is loaded once as D values and scales that shape (not a [BLOCK_M, BLOCK_N]
        tile of it: Qwen3's 128x256 QKV kernel spilled 416-568 bytes a thread, NOTES 133)."""
        d = self.plan.info[o.input].split[-1]
        eps, offset, in_f32 = o.attrs
        names, x = self.names, self.names[o.input]
        heads, ms, normed, y = names.fresh("hd"), names.fresh("ms"), names.fresh("nrm"), names.fresh("y")
        w(f"{heads} = tl.reshape(tl.broadcast_to({x}, [BLOCK_M, BLOCK_N]), [BLOCK_M, BLOCK_N // {d}, {d}])")
        w(f"{ms} = tl.sum({heads} * {heads}, axis=2) / {d}")
        if shared is not None:  # the weight as [1, 1, D], the product reshaped back
            wt = names.fresh("e")
            last = len(self.ext[shared][1].perm) - 1
            w(f"{wt} = tl.load(e{shared}_ptr + tl.arange(0, {d}) * e{shared}_s{last}).to(tl.float32)[None, None, :]")
            w(f"{normed} = {heads} * tl.rsqrt({ms} + {eps!r})[:, :, None]")
            weight = f"({wt} + {offset!r})" if offset else wt
            expr = f"{normed} * {weight}" if in_f32 else f"{round_to(normed, o.input)} * {weight}"
            w(f"{y} = tl.reshape({round_to(expr, o.result)}, [BLOCK_M, BLOCK_N])")
            names[o.result] = y
            return
        w(f"{normed} = tl.reshape({heads} * tl.rsqrt({ms} + {eps!r})[:, :, None], [BLOCK_M, BLOCK_N])")
        if o.weight is None:
            expr = normed
        else:
            weight = f"({names[o.weight]} + {offset!r})" if offset else names[o.weight]
            expr = f"{normed} * {weight}" if in_f32 else f"{round_to(normed, o.input)} * {weight}"
        w(f"{y} = {round_to(expr, o.result)}")
        names[o.result] = y

    def _head_tables(self, o: RotaryOp) -> dict[SSAValue, int]:
        """cos and sin of a rotary (their ext indices) where both are region inputs broadcast over every column dim
        but the innermost (one table for all heads, as HF passes them: [B, 1, S, D]) and the tile holds whole rotary
        groups: `_rotary` then loads each once as a [BLOCK_M, rotary_dim] tile for all the tile's heads, instead of
        a [BLOCK_M, BLOCK_N] tile of the same values repeated per head (half the registers of a 128x256 tile's
        epilogue, whose spills were the rotary's cost, NOTES 131). {} otherwise."""
        if o.dim & (o.dim - 1) or self.gluon:  # (a tile's columns: a power of two; in Gluon the table's reshape for
            return {}                            # every head has no layout it can infer: a tile of it per column)
        found = {v: self._shared_by_heads(v, o.result, rows=False) for v in (o.cos, o.sin)}
        return {} if None in found.values() else found

    def _shared_by_heads(self, v: SSAValue, res: SSAValue, rows: bool) -> int | None:
        """The ext index of region input v as `res` reads it, where v is broadcast over every column dim but the
        innermost (and with `rows`, over the rows too): one value per position in a head, the same for every head.
        None otherwise."""
        j = next((j for j, e in enumerate(self.ext) if e[0] == v and e[2] == res), None)
        if j is None:
            return None
        c, nrow = self.ext[j][1], len(self.plan.rows)
        own = shape_of(v)
        own = (1,) * (len(shape_of(res)) - len(own)) + own
        inner = nrow + len(c.split) - 1  # the canonical dim of a head's columns
        shared = range(0 if rows else nrow, inner)
        if c.window is not None or c.perm[-1] != inner or any(own[i] != 1 for i in range(len(own)) if c.perm[i] in shared):
            return None
        return j

    def _head_table(self, w: Writer, j: int, rd: int) -> str:
        """Load ext operand j, broadcast over the heads, as a [BLOCK_M, rd] tile: columns 0..rd of a head."""
        c = self.ext[j][1]
        idx, _ = self._space(w, c)
        nrow = len(self.plan.rows)
        col = f"tl.arange(0, {rd}).to(tl.int64)" if self.wide else f"tl.arange(0, {rd})"  # (as `rn`: past 2^31)
        cols = ["0"] * (len(c.split) - 1) + [f"{col}[None, :]"]
        idx = idx[:nrow] + cols
        addr = " + ".join(f"({e}) * e{j}_s{d}" for d, e in enumerate(idx) if e != "0")
        t = self.names.fresh("e")  # (dl.rotary's verifier makes cos and sin exactly rd wide: no column mask)
        w(f"{t} = tl.load(e{j}_ptr + {addr}, mask=mmask[:, None], other=0.0).to(tl.float32)")
        return t

    def _rotary(self, w: Writer, o: RotaryOp, tables_at: dict[SSAValue, int]) -> None:
        """Rotate head columns. With MM (the product in memory) each column's partner is read back from the
        product: out = x * cos + sign * partner * sin, elementwise, for any tile width. Otherwise in registers:
        the tile is reshaped so each rotation pair lands in one axis of size 2 (split), rotated, and joined
        back. Heads of D columns start at tile boundaries (BLOCK_N % D == 0); with partial rotary only the
        first rotary_dim columns of a head change. A tile narrower than a head (plan.narrow_rotary) is one
        rotation group: for the half layout its columns are the matching parts of the head's two halves (see
        `rn`), for the interleaved one a run of pairs."""
        c = self.plan.info[o.input]
        d, rd = c.head, o.dim
        dcol = self._space(w, c)[0][-1]  # the column within the head
        x, names = self.names[o.input], self.names

        def tables(shared: bool) -> tuple[str, str]:
            """cos and sin: loaded already ([BLOCK_M, BLOCK_N]), or here, as one [BLOCK_M, rd] table for every
            head (`shared`) or per column."""
            if not tables_at:
                return names[o.cos], names[o.sin]
            if shared:
                return self._head_table(w, tables_at[o.cos], rd), self._head_table(w, tables_at[o.sin], rd)
            return self._load_ext(w, tables_at[o.cos]), self._load_ext(w, tables_at[o.sin])

        # (not "c": c<j> names the index spaces)
        parts = {tag: (names.fresh(tag), names.fresh(tag)) for tag in ("x", "cos", "sin")}
        t = names.fresh("rot")
        if self.plan.rotary_from_product:
            lin, h = self.plan.linear, rd // 2
            if o.layout.data == "half":  # partner j + h of the first half, j - h of the second
                delta, sign = f"tl.where({dcol} < {h}, {h}, -{h})", f"tl.where({dcol} < {h}, -1.0, 1.0)"
            else:  # pairs (2j, 2j + 1)
                delta, sign = f"tl.where({dcol} % 2 == 0, 1, -1)", f"tl.where({dcol} % 2 == 0, -1.0, 1.0)"
            pc, xp = names.fresh("pc"), names.fresh("xp")
            w("if MM:")
            w.indent()
            cos, sin = tables(False)
            w(f"{pc} = ((rn % GRID_N) + {c.stream_lo})[None, :] + {delta}")
            w(f"{xp} = tl.load(mm_ptr + (rm % M).to(tl.int64)[:, None] * {self.plan.n} + {pc}).to(tl.float32)")
            if lin.bias is not None:
                w(f"{xp} += tl.load(bias_ptr + {pc}).to(tl.float32)")
            w(f"{xp} = {round_to(xp, lin.result)}")
            w(f"{t} = {x} * {cos} + {sign} * {xp} * {sin}")
            w.dedent()
            w("else:")
            w.indent()

        def rotate(groups: str, half: str, shared: bool) -> None:
            cos, sin = tables(shared)
            rotate_in_registers(w, t, (x, cos, sin), [parts["x"], parts["cos"], parts["sin"]],
                                o.layout.data != "half", groups, half, shared_table=shared and bool(tables_at))

        if self.plan.narrow_rotary:
            w(f"if BLOCK_N < {rd}:")
            w.indent()
            rotate("1", "BLOCK_N // 2", False)
            w.dedent()
            w("else:")
            w.indent()
            rotate(f"BLOCK_N // {rd}", str(rd // 2), True)
            w.dedent()
        else:
            rotate(f"BLOCK_N // {rd}", str(rd // 2), True)
        if self.plan.rotary_from_product:
            w.dedent()
        if rd < d:  # partial rotary: the columns past rotary_dim in each head pass through
            w(f"{t} = tl.where({dcol} < {rd}, {t}, {x})")
        if round_to(t, o.result) != t:  # (as eager's op rounds its result; free before a store of that dtype)
            w(f"{t} = {round_to(t, o.result)}")
        names[o.result] = t

