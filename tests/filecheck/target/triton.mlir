// RUN: dl-opt %s -p fuse -t triton | filecheck %s
// `-t triton` prints the generated kernel of every dl.fused region, in program order, as the file that
// dump_ir writes: a header naming the kernel, the region's IR as a comment, then the @triton.jit functions (the
// kernel, each tile's work calling the config's product, then each variant's product).
// Here: RMSNorm -> linear -> SiLU becomes one GEMM (the norm's statistics in the prologue, SiLU in the
// epilogue; fp32 dots in IEEE precision, as torch's default allows no TF32), and the softmax of its output one row kernel.

// CHECK:      # ---- region 0: gemm (gemm_0)
// CHECK-NEXT: # dlblas_compiler kernel gemm_0 (source hash {{[0-9a-f]+}})
// CHECK:      #   %{{.*}} = dl.rms_norm
// CHECK:      #   %{{.*}} = dl.linear
// CHECK:      #   %{{.*}} = dl.silu
// CHECK:      import triton.language as tl
// CHECK:      @triton.jit
// CHECK-NEXT: def gemm_0(
// CHECK:          BLOCK_K: tl.constexpr
// CHECK:      def _tile(
// CHECK:              acc0 = _product_tiled(
// CHECK:              v1 = (y0 * tl.sigmoid(y0))
// CHECK:              tl.store(out0_ptr
// CHECK:      def _product_tiled(
// CHECK:          for k0 in range(
// CHECK:              a = (a.to(tl.float32) * nw[None, :]).to(a.dtype)
// CHECK:              acc0 = tl.dot(a, b0, acc0, input_precision="ieee")
// CHECK:          return acc0
// CHECK:      # ---- region 1: row (row_1)
// CHECK:      @triton.jit
// CHECK-NEXT: def row_1(
// CHECK:          tl.max(
// CHECK:          tl.exp(
// CHECK:          tl.store(
// CHECK-NOT:  # ---- region

builtin.module {
  func.func @forward(%x: tensor<2x8x64xf32>, %w: tensor<64xf32>, %up: tensor<96x64xf32>) -> tensor<2x8x96xf32> {
    %n = dl.rms_norm %x weight %w {eps = 1.000000e-06 : f64} : tensor<2x8x64xf32>, tensor<64xf32> -> tensor<2x8x64xf32>
    %h = dl.linear %n, %up : tensor<2x8x64xf32>, tensor<96x64xf32> -> tensor<2x8x96xf32>
    %a = dl.silu %h : tensor<2x8x96xf32>
    %s = dl.softmax %a {dim = 2 : i64} : tensor<2x8x96xf32>
    func.return %s : tensor<2x8x96xf32>
  }
}
