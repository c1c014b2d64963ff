// RUN: dl-opt %s -t triton | filecheck %s
// A region no template can lower is printed as a comment naming the reason, and the next region still
// gets its kernel.

// CHECK:      # ---- region 0: gemm (gemm_0)
// CHECK-NEXT: # not lowered: region gemm_0: the gemm template cannot lower it: {{.+}}
// CHECK:      # ---- region 1: mystery (mystery_1)
// CHECK-NEXT: # not lowered: region mystery_1: no template named 'mystery' (have ['attention', 'gemm', 'row'])
// CHECK:      # ---- region 2: row (row_2)
// CHECK:      @triton.jit
// CHECK-NEXT: def row_2(
// CHECK:          tl.exp(

builtin.module {
  func.func @forward(%x: tensor<4x16xf32>) -> tensor<4x16xf32> {
    %a = dl.fused "gemm"(%x) {kernel = "gemm_0"} : (tensor<4x16xf32>) -> tensor<4x16xf32> {
    ^bb0(%x0: tensor<4x16xf32>):
      %e = dl.exp %x0 : tensor<4x16xf32>
      dl.yield %e : tensor<4x16xf32>
    }
    %b = dl.fused "mystery"(%a) {kernel = "mystery_1"} : (tensor<4x16xf32>) -> tensor<4x16xf32> {
    ^bb0(%a0: tensor<4x16xf32>):
      %n = dl.neg %a0 : tensor<4x16xf32>
      dl.yield %n : tensor<4x16xf32>
    }
    %c = dl.fused "row"(%b) {kernel = "row_2"} : (tensor<4x16xf32>) -> tensor<4x16xf32> {
    ^bb0(%b0: tensor<4x16xf32>):
      %e = dl.exp %b0 : tensor<4x16xf32>
      dl.yield %e : tensor<4x16xf32>
    }
    func.return %c : tensor<4x16xf32>
  }
}
