"""The GEMM template: Y = x @ W^T over [*rows, K] x [N, K], with a norm prologue and a generated epilogue.

One kernel per region, its variants chosen by the config (the tuner picks; cuBLAS stays a candidate as the
region's reference); each variant's product is its own jitted function in the source, which the tile's work calls
before the shared epilogue:
  tiled.py     `_product_tiled`: tensor-core tiles (tl.dot), loaded by pointer or through TMA descriptors (sm90+)
  gemv.py      `_product_one_row`: one-row tiles on CUDA cores for a few rows (decode): the weight streamed along K
  cublas.py    `_product_cublas`, MM: cuBLAS computes the product and the kernel is the prologue's scaling and the
               epilogue
  warp_specialized.py  WS (sm90): a second kernel in the same source, in Gluon: a TMA loader warp feeding the MMA
               warps, persistent, the same epilogue (regions without per-head norms); WS=2 ends each
               tile in shared memory and a TMA store, the residual copied in by the loader
and the parts they share:
  plan.py      what a region computes (`analyze`: the linear, its norm, each epilogue value's view of the tile)
  emitter.py   the kernel's skeleton: one tile per program or (PERSISTENT) one program per SM looping over the
               tiles; each tile's work (`_tile`): its rows and columns, the config's product, the epilogue
  prologue.py  an RMSNorm / LayerNorm before the GEMM: a norm weight on the A tile, row statistics on the result
  epilogue.py  split-K reduction and everything the planner attached to Y, one store per output
  norms.py     the row passes a launch runs first (NORM_PASS's normalized rows, the RMSNorm statistics)
  launch.py    strides, workspaces, the row passes, cuBLAS's product, the grid
  space.py     the search space, its default and seeds
Prologue: RMSNorm or LayerNorm. A norm pass (NORM_PASS; always for a LayerNorm above 16 rows) writes the normalized
rows first, as eager does. Otherwise, for an RMSNorm, the rows' rsqrt(mean(x^2) + eps) comes from the `row_rms`
pass, or for a few rows from the GEMM itself (a one-row tile's K loop sums the squares of the x slices it loads; a
tensor-core tile's last program reads x after its loop), and scales the accumulator after the K loop; a norm weight
that was not folded into W scales the A tile. A LayerNorm of a few rows: each program computes its rows' mean and
rstd and normalizes the A tiles it loads.
"""

from __future__ import annotations

from ...fusion.templates import PlannedTemplate, register_template
from .launch import build
from .norms import row_layer_norm, row_norm, row_rms
from .plan import GEMV_ROWS, Cols, GemmPlan, analyze
from .space import PARAMS, space

__all__ = ["GEMV_ROWS", "PARAMS", "Cols", "GemmPlan", "analyze", "build", "row_layer_norm", "row_norm",
           "row_rms", "space"]  # fmt: skip


# Y = x @ W^T with an RMSNorm prologue and an epilogue of everything the planner attached to Y (see above)
register_template(PlannedTemplate("gemm", PARAMS, analyze, build, space))
