// RUN: dl-opt %s -p recognize,algebraic,fuse | filecheck %s
// The normed value has two consumers (the GEMM and the residual add): the norm cannot become the GEMM's
// prologue, so it stays a row kernel and the GEMM reads its output.
// CHECK:      %[[N:.*]] = dl.fused "row"(%x, %n_weight)
// CHECK:        dl.rms_norm
// CHECK:      dl.fused "gemm"(%[[N]], %lin_weight)
// CHECK-NOT:    dl.rms_norm
// CHECK:        dl.add

builtin.module {
  func.func @forward(%x: tensor<4x16xf32>) -> tensor<4x16xf32> {
    %pow = dl.pow %x {exponent = 2.000000e+00 : f64} : tensor<4x16xf32>
    %mean = dl.reduce_mean %pow {dims = array<i64: 1>, keepdim = true} : tensor<4x16xf32> -> tensor<4x1xf32>
    %add = dl.constant 1.000000e-06 : f64 : tensor<f32>
    %add_1 = dl.add %mean, %add : (tensor<4x1xf32>, tensor<f32>) -> tensor<4x1xf32>
    %rsqrt = dl.rsqrt %add_1 : tensor<4x1xf32>
    %mul = dl.mul %x, %rsqrt : (tensor<4x16xf32>, tensor<4x1xf32>) -> tensor<4x16xf32>
    %n_weight = dl.param "n.weight" : tensor<16xf32>
    %mul_1 = dl.mul %n_weight, %mul : (tensor<16xf32>, tensor<4x16xf32>) -> tensor<4x16xf32>
    %lin_weight = dl.param "lin.weight" : tensor<16x16xf32>
    %lin = dl.linear %mul_1, %lin_weight : tensor<4x16xf32>, tensor<16x16xf32> -> tensor<4x16xf32>
    %add_2 = dl.add %lin, %mul_1 : (tensor<4x16xf32>, tensor<4x16xf32>) -> tensor<4x16xf32>
    func.return %add_2 : tensor<4x16xf32>
  }
}
