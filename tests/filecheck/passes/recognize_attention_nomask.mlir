// RUN: dl-opt %s -p recognize,dce | filecheck %s
// softmax(q k^T / 4) v without a mask raises to dl.sdpa that keeps the explicit form's NaN rows too: a NaN score
// (a non-finite q or k) makes its row NaN there, where torch's fused SDPA kernels may give 0 (fuzz 8297d26b99c1).
// CHECK:      dl.sdpa %q, %k, %v {masked_rows = "nan", scale = 2.500000e-01 : f64}
// CHECK-NOT:  dl.softmax

builtin.module {
  func.func @forward(%q: tensor<1x2x5x16xf32>, %k: tensor<1x2x5x16xf32>, %v: tensor<1x2x5x16xf32>) -> tensor<1x2x5x16xf32> {
    %transpose = dl.permute %k {perm = array<i64: 0, 1, 3, 2>} : tensor<1x2x5x16xf32> -> tensor<1x2x16x5xf32>
    %matmul = dl.matmul %q, %transpose : (tensor<1x2x5x16xf32>, tensor<1x2x16x5xf32>) -> tensor<1x2x5x5xf32>
    %truediv = dl.constant 4.000000e+00 : f64 : tensor<f32>
    %truediv_1 = dl.div %matmul, %truediv : (tensor<1x2x5x5xf32>, tensor<f32>) -> tensor<1x2x5x5xf32>
    %softmax = dl.softmax %truediv_1 {dim = 3 : i64} : tensor<1x2x5x5xf32>
    %matmul_1 = dl.matmul %softmax, %v : (tensor<1x2x5x5xf32>, tensor<1x2x5x16xf32>) -> tensor<1x2x5x16xf32>
    func.return %matmul_1 : tensor<1x2x5x16xf32>
  }
}
