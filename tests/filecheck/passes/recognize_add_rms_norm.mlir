// RUN: dl-opt %s -p recognize,dce | filecheck %s
// A residual add feeding an RMSNorm becomes dl.add_rms_norm; the sum stays live as its second result.
// A norm of a plain input stays dl.rms_norm.
// CHECK:      %[[N:.*]], %[[S:.*]] = dl.add_rms_norm %x, %r weight %{{.*}} {eps = 1.000000e-06 : f64}
// CHECK:      %[[M:.*]] = dl.rms_norm %y weight
// CHECK:      func.return %[[N]], %[[S]], %[[M]]

builtin.module {
  func.func @forward(%x: tensor<2x16xf32>, %r: tensor<2x16xf32>, %y: tensor<2x16xf32>) -> (tensor<2x16xf32>, tensor<2x16xf32>, tensor<2x16xf32>) {
    %add = dl.add %x, %r : (tensor<2x16xf32>, tensor<2x16xf32>) -> tensor<2x16xf32>
    %pow = dl.pow %add {exponent = 2.000000e+00 : f64} : tensor<2x16xf32>
    %mean = dl.reduce_mean %pow {dims = array<i64: 1>, keepdim = true} : tensor<2x16xf32> -> tensor<2x1xf32>
    %add_1 = dl.constant 1.000000e-06 : f64 : tensor<f32>
    %add_2 = dl.add %mean, %add_1 : (tensor<2x1xf32>, tensor<f32>) -> tensor<2x1xf32>
    %rsqrt = dl.rsqrt %add_2 : tensor<2x1xf32>
    %mul = dl.mul %add, %rsqrt : (tensor<2x16xf32>, tensor<2x1xf32>) -> tensor<2x16xf32>
    %n1_weight = dl.param "n1.weight" : tensor<16xf32>
    %mul_1 = dl.mul %n1_weight, %mul : (tensor<16xf32>, tensor<2x16xf32>) -> tensor<2x16xf32>
    %pow_1 = dl.pow %y {exponent = 2.000000e+00 : f64} : tensor<2x16xf32>
    %mean_1 = dl.reduce_mean %pow_1 {dims = array<i64: 1>, keepdim = true} : tensor<2x16xf32> -> tensor<2x1xf32>
    %add_3 = dl.constant 1.000000e-06 : f64 : tensor<f32>
    %add_4 = dl.add %mean_1, %add_3 : (tensor<2x1xf32>, tensor<f32>) -> tensor<2x1xf32>
    %rsqrt_1 = dl.rsqrt %add_4 : tensor<2x1xf32>
    %mul_2 = dl.mul %y, %rsqrt_1 : (tensor<2x16xf32>, tensor<2x1xf32>) -> tensor<2x16xf32>
    %n2_weight = dl.param "n2.weight" : tensor<16xf32>
    %mul_3 = dl.mul %n2_weight, %mul_2 : (tensor<16xf32>, tensor<2x16xf32>) -> tensor<2x16xf32>
    func.return %mul_1, %add, %mul_3 : tensor<2x16xf32>, tensor<2x16xf32>, tensor<2x16xf32>
  }
}
