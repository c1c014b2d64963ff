// RUN: dl-opt %s -p recognize,dce | filecheck %s
// Three spellings of RMSNorm raise to dl.rms_norm: Llama (fp32 upcast, weight after the downcast),
// Gemma ((1 + w) in fp32 before the downcast) and a weightless x * (1 / sqrt(mean(x^2) + eps)).
// CHECK:      %[[W:.*]] = dl.param "w" : tensor<16xbf16>
// CHECK-NEXT: dl.rms_norm %x weight %[[W]] {eps = 1.000000e-06 : f64} : tensor<2x3x16xbf16>, tensor<16xbf16> -> tensor<2x3x16xbf16>
// CHECK:      %[[G:.*]] = dl.param "g" : tensor<16xbf16>
// CHECK-NEXT: dl.rms_norm %x weight %[[G]] {eps = 1.000000e-05 : f64, offset = 1.000000e+00 : f64, scale_in_f32 = true}
// CHECK-NEXT: dl.rms_norm %{{.*}} {eps = 1.000000e-06 : f64} : tensor<2x3x16xf32> -> tensor<2x3x16xf32>
// CHECK-NOT:  dl.rsqrt
// CHECK-NOT:  dl.reduce_mean

builtin.module {
  func.func @forward(%x: tensor<2x3x16xbf16>) -> (tensor<2x3x16xbf16>, tensor<2x3x16xbf16>, tensor<2x3x16xf32>) {
    %to = dl.convert %x : tensor<2x3x16xbf16> -> tensor<2x3x16xf32>
    %w = dl.param "w" : tensor<16xbf16>
    %pow = dl.pow %to {exponent = 2.000000e+00 : f64} : tensor<2x3x16xf32>
    %mean = dl.reduce_mean %pow {dims = array<i64: 2>, keepdim = true} : tensor<2x3x16xf32> -> tensor<2x3x1xf32>
    %add = dl.constant 1.000000e-06 : f64 : tensor<f32>
    %add_1 = dl.add %mean, %add : (tensor<2x3x1xf32>, tensor<f32>) -> tensor<2x3x1xf32>
    %rsqrt = dl.rsqrt %add_1 : tensor<2x3x1xf32>
    %mul = dl.mul %to, %rsqrt : (tensor<2x3x16xf32>, tensor<2x3x1xf32>) -> tensor<2x3x16xf32>
    %to_1 = dl.convert %mul : tensor<2x3x16xf32> -> tensor<2x3x16xbf16>
    %mul_1 = dl.mul %w, %to_1 : (tensor<16xbf16>, tensor<2x3x16xbf16>) -> tensor<2x3x16xbf16>
    %mul_2 = dl.mul %to, %to : (tensor<2x3x16xf32>, tensor<2x3x16xf32>) -> tensor<2x3x16xf32>
    %mean_1 = dl.reduce_mean %mul_2 {dims = array<i64: 2>, keepdim = true} : tensor<2x3x16xf32> -> tensor<2x3x1xf32>
    %add_2 = dl.constant 1.000000e-05 : f64 : tensor<f32>
    %add_3 = dl.add %mean_1, %add_2 : (tensor<2x3x1xf32>, tensor<f32>) -> tensor<2x3x1xf32>
    %sqrt = dl.sqrt %add_3 : tensor<2x3x1xf32>
    %truediv = dl.div %to, %sqrt : (tensor<2x3x16xf32>, tensor<2x3x1xf32>) -> tensor<2x3x16xf32>
    %g = dl.param "g" : tensor<16xbf16>
    %float = dl.convert %g : tensor<16xbf16> -> tensor<16xf32>
    %add_4 = dl.constant 1.000000e+00 : f64 : tensor<f32>
    %add_5 = dl.add %add_4, %float : (tensor<f32>, tensor<16xf32>) -> tensor<16xf32>
    %mul_3 = dl.mul %truediv, %add_5 : (tensor<2x3x16xf32>, tensor<16xf32>) -> tensor<2x3x16xf32>
    %type_as = dl.convert %mul_3 : tensor<2x3x16xf32> -> tensor<2x3x16xbf16>
    %pow_1 = dl.pow %to {exponent = 2.000000e+00 : f64} : tensor<2x3x16xf32>
    %mean_2 = dl.reduce_mean %pow_1 {dims = array<i64: 2>, keepdim = true} : tensor<2x3x16xf32> -> tensor<2x3x1xf32>
    %add_6 = dl.constant 1.000000e-06 : f64 : tensor<f32>
    %add_7 = dl.add %mean_2, %add_6 : (tensor<2x3x1xf32>, tensor<f32>) -> tensor<2x3x1xf32>
    %sqrt_1 = dl.sqrt %add_7 : tensor<2x3x1xf32>
    %truediv_1 = dl.constant 1.000000e+00 : f64 : tensor<f32>
    %truediv_2 = dl.div %truediv_1, %sqrt_1 : (tensor<f32>, tensor<2x3x1xf32>) -> tensor<2x3x1xf32>
    %mul_4 = dl.mul %to, %truediv_2 : (tensor<2x3x16xf32>, tensor<2x3x1xf32>) -> tensor<2x3x16xf32>
    func.return %mul_1, %type_as, %mul_4 : tensor<2x3x16xbf16>, tensor<2x3x16xbf16>, tensor<2x3x16xf32>
  }
}
