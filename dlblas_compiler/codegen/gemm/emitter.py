"""The GEMM kernel's skeleton: its arguments, the program's tile (grouped ordering, split-K slice), then the product
of the config's variant, each its own jitted function (`_product_tiled`: tensor-core tiles by pointer or TMA;
`_product_one_row`: one row per program on CUDA cores; `_product_cublas`: cuBLAS's product read back), chosen by the
config's constexprs, then the shared epilogue."""

from __future__ import annotations

from ...dialects import ConstantOp, IndexCopyOp
from ..source import PDL_ARG, Writer, chained_start, wrapped
from . import cublas, gemv, prologue, tiled, warp_specialized
from .epilogue import EpilogueEmitter


# the kernel's compile-time parameters, passed on to each tile's work
CONSTS = ("K", "GRID_N", "BLOCK_M", "BLOCK_N", "BLOCK_K", "GROUP_M", "SPLIT_K", "K_SPLIT", "EVEN_K", "TMA", "RS_INLINE",
          "RS_BLOCK", "MM", "NORMED")  # fmt: skip


class GemmEmitter(EpilogueEmitter):
    def source(self) -> str:
        """The kernel's text."""
        p, w = self.plan, Writer()
        nrow = len(p.rows)
        has_bias = p.linear.bias is not None
        for o in p.epilogue:  # external operands, each read through the view of its reader's result
            if isinstance(o, IndexCopyOp):  # (its destination is an output, its index read per row: `_store`)
                continue
            for v in o.operands:
                if v not in p.info and not isinstance(v.owner, ConstantOp):
                    self.ext.append((v, p.info[o.results[0]], o.results[0]))
        p.residual_in_place = cublas.residual_in_place(self)
        args = ["x_ptr", "w_ptr"] + (["bias_ptr"] if has_bias else []) + prologue.pointers(p)
        args += [f"e{j}_ptr" for j in range(len(self.ext))] + [f"out{k}_ptr" for k in range(len(self.outputs))]
        args += [f"ix{k}_ptr" for k, r in enumerate(self.outputs) if r in p.scatters]
        args += [f"ix{k}_n" for k, r in enumerate(self.outputs) if r in p.scatters]  # (the destination's size there)
        args += ["mm_ptr", "ws_ptr", "cnt_ptr", "rs_ptr", "M"] + [f"R{d}" for d in range(1, nrow)]
        for j in range(len(self.ext)):
            args += [f"e{j}_s{d}" for d in range(len(self.ext[j][1].perm))]
        for k, r in enumerate(self.outputs):
            args += [f"o{k}_s{d}" for d in range(len(p.info[r].perm))]
        self._kernel(w, args)
        w("@triton.jit")
        wrapped(w, "def _tile(", [*args, "pid", "pid_k", "slot0", *(f"{c}: tl.constexpr" for c in CONSTS),
                                   "RELEASE: tl.constexpr"], "):")  # fmt: skip
        w.indent()
        w('"""One output tile: its rows and columns, the product by the config\'s variant, the epilogue."""')
        w("num_m = tl.cdiv(M, BLOCK_M)")
        w("num_n = tl.cdiv(GRID_N, BLOCK_N)")
        tiled.tile_position(w)
        w("rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)")
        span = self._cones() is not None  # the tile's columns lie in [n_lo, n_hi) (`EpilogueEmitter`'s branches)
        if p.narrow_rotary == "half":  # a tile narrower than a head takes matching parts of its two halves,
            d = max(p.rotary_dims)  # so each rotation pair (j, j + D/2) stays inside the tile
            w(f"if BLOCK_N < {d}:")
            w("    ri = tl.arange(0, BLOCK_N)")
            w(f"    rn = (pid_n * BLOCK_N) // {d} * {d} + (pid_n % ({d} // BLOCK_N)) * (BLOCK_N // 2) + ri % (BLOCK_N // 2) + ri // (BLOCK_N // 2) * {d // 2}")
            if span:
                w(f"    n_lo = (pid_n * BLOCK_N) // {d} * {d}  # (the columns of the head holding the tile's)")
                w(f"    n_hi = n_lo + {d}")
            w("else:")
            w("    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)")
            if span:
                w("    n_lo = pid_n * BLOCK_N")
                w("    n_hi = n_lo + BLOCK_N")
        else:
            w("rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)")
            if span:
                w("n_lo = pid_n * BLOCK_N")
                w("n_hi = n_lo + BLOCK_N")
        w("mmask = rm < M")
        w("nmask = rn < GRID_N")
        accs = ", ".join(f"acc{i}" for i in range(len(p.streams)))
        w("if MM:")
        w(f"    {accs} = _product_cublas(mm_ptr, M, rm, rn, GRID_N)")
        variants = (("elif BLOCK_M == 1:", "_product_one_row", gemv.results(p), gemv),
                    ("else:", "_product_tiled", [], tiled))
        for cond, name, more, variant in variants:
            w(cond)
            w.depth += 1
            wrapped(w, f"{', '.join([accs, *more])} = {name}(",
                    [*prologue.product_params(p, variant.TILE), *variant.consts(p)], ")")
            w.depth -= 1
        self._release(w)
        self.emit(w)
        w.dedent()
        w("")
        w("")
        tiled.product(self, w)
        gemv.product(self, w)
        cublas.product(self, w)
        if not self.warp_specialized:
            return w.text()
        self.staging = warp_specialized.staging(self)  # (WS=2's operands, or None: launch.py reads it too)
        w("")
        w("")
        warp_specialized.emit(self, w, args, CONSTS)
        return warp_specialized.HEADER + "\n" + w.text()

    @property
    def warp_specialized(self) -> bool:
        """Whether the source also holds the warp-specialized Gluon kernel (`<name>_ws`, warp_specialized.py)."""
        return warp_specialized.offered(self.plan)

    @staticmethod
    def _release(w: Writer) -> None:
        """RELEASE (under PDL, one tile a program): once the K loop has read this tile's operands, let the next
        kernel's programs start. Released at the kernel's start instead, they took SM slots and issued their own
        reads while this one still streamed its weight: the decode graph 1.1% slower than without PDL, and
        0.6-1.3% faster released here (bench/NOTES.md 47, 124). A persistent program releases after its last tile."""
        w("if RELEASE:  # chained launch: the operands are read, let the next kernel start")
        w("    tl.extra.cuda.gdc_launch_dependents()")

    def _kernel(self, w: Writer, args: list[str]) -> None:
        """The kernel: one tile per program (SPLIT_K programs per tile), or (PERSISTENT) one program per SM looping
        over the tiles. A persistent kernel with SPLIT_K > 1 splits over K only the tiles of its last wave, which
        would otherwise leave SMs idle: the tiles past DP_TILES (`plan.whole_tiles`: a multiple of the programs,
        where the split parts make one wave) are run in parts, each program running its whole tiles, then at most
        one part; `_split_k` sums the parts. The loop over whole tiles is flattened with each tile's K loop
        (`tl.range(..., flatten=True)`: the next tile's loads issue during this tile's epilogue, bench/NOTES.md 141)
        where no runtime branch follows the K loop. (Triton 3.6's warp
        specialization of the loop, `tl.range(..., warp_specialize=True)`, gave non-finite rows that varied
        between runs on the H100 for the dual GEMM with 4 warps: not offered, NOTES 59.)"""
        w('@triton.jit(do_not_specialize=["DP_TILES"])  # (a count that changes with M: one binary for all)')
        wrapped(w, f"def {self.name}(", [*args, "DP_TILES", *(f"{c}: tl.constexpr" for c in CONSTS),
                                          "PERSISTENT: tl.constexpr", PDL_ARG.rstrip(",")], "):")  # fmt: skip
        w.indent()
        chained_start(w, release=False)  # (released after the K loop: `_release`)
        whole = {"SPLIT_K": "1", "K_SPLIT": "(K + BLOCK_K - 1) // BLOCK_K * BLOCK_K", "EVEN_K": "K % BLOCK_K == 0"}

        def tile(depth: int, pid: str, pid_k: str, slot0: str, consts=CONSTS, release: str = "False") -> None:
            """A call of the tile's work `depth` levels in."""
            w.depth += depth
            wrapped(w, "_tile(", [*args, pid, pid_k, slot0, *consts, release], ")")
            w.depth -= depth

        w("if PERSISTENT:")
        w("    tiles = tl.cdiv(M, BLOCK_M) * tl.cdiv(GRID_N, BLOCK_N)")
        w("    if SPLIT_K == 1:")
        # flattened (the next tile's loads issued during this tile's epilogue) unless a runtime branch follows the
        # K loop, which Triton 3.6's loop fusion fails on (an output's ops only in tiles holding it: NOTES 139)
        w(f"        for pid in tl.range(tl.program_id(0), tiles, tl.num_programs(0), flatten={self._cones() is None}):")
        tile(3, "pid", "0", "0")
        w("    else:  # the last wave's tiles split over K")
        w("        for u in range(tl.program_id(0), DP_TILES + (tiles - DP_TILES) * SPLIT_K, tl.num_programs(0)):")
        w("            if u < DP_TILES:")
        tile(4, "u", "0", "0", [whole.get(c, c) for c in CONSTS])
        w("            else:")
        w("                t = u - DP_TILES")
        tile(4, "DP_TILES + t // SPLIT_K", "t % SPLIT_K", "DP_TILES")
        w("    if PDL:  # chained launch: every tile's operands are read, let the next kernel start")
        w("        tl.extra.cuda.gdc_launch_dependents()")
        w("else:")
        tile(1, "tl.program_id(0)", "tl.program_id(1)", "0", release="PDL")
        w.dedent()
        w("")
        w("")
