// RUN: dl-opt %s -p "recognize,algebraic{fold_norm_weight=true},cse,dce" | filecheck %s
// Horizontal fusion (q/k share an input: one GEMM on the concatenated weight, then slices), FlashNorm
// (the norm weight folds into that weight), but not for a norm whose value has a non-linear user;
// scalar chains fold where exact ((x*2)*4 + -0.0 = x*8: powers of two; y + 0.0 stays: -0.0 + 0.0 is +0.0);
// reshape/transpose chains collapse.
// CHECK:      %zero = dl.constant 0.000000e+00
// CHECK:      %[[N:.*]] = dl.rms_norm %x {eps = 1.000000e-06 : f64} : tensor<8x16xf32> -> tensor<8x16xf32>
// CHECK-NEXT: %[[C:.*]] = dl.cat %q_weight, %k_weight {dim = 0 : i64}
// CHECK-NEXT: %[[W:.*]] = dl.mul %[[C]], %n_weight
// CHECK-NEXT: %[[QK:.*]] = dl.linear %[[N]], %[[W]] : tensor<8x16xf32>, tensor<12x16xf32> -> tensor<8x12xf32>
// CHECK-NEXT: dl.slice %[[QK]] {dim = 1 : i64, start = 0 : i64, end = 8 : i64}
// CHECK-NEXT: dl.slice %[[QK]] {dim = 1 : i64, start = 8 : i64, end = 12 : i64}
// CHECK-NEXT: %[[N2:.*]] = dl.rms_norm %x weight %n2_weight
// CHECK-NEXT: dl.linear %[[N2]], %o_weight
// CHECK:      %[[EIGHT:.*]] = dl.constant 8.000000e+00 : f64 : tensor<f32>
// CHECK-NEXT: dl.mul %x, %[[EIGHT]]
// CHECK-NEXT: dl.add %x, %zero
// CHECK-NEXT: dl.reshape %x : tensor<8x16xf32> -> tensor<32x4xf32>
// CHECK-NOT:  dl.permute

builtin.module {
  func.func @forward(%x: tensor<8x16xf32>) -> (tensor<8x8xf32>, tensor<8x4xf32>, tensor<8x8xf32>, tensor<8x16xf32>, tensor<32x4xf32>, tensor<8x16xf32>) {
    %pow = dl.pow %x {exponent = 2.000000e+00 : f64} : tensor<8x16xf32>
    %mean = dl.reduce_mean %pow {dims = array<i64: 1>, keepdim = true} : tensor<8x16xf32> -> tensor<8x1xf32>
    %add = dl.constant 1.000000e-06 : f64 : tensor<f32>
    %add_1 = dl.add %mean, %add : (tensor<8x1xf32>, tensor<f32>) -> tensor<8x1xf32>
    %rsqrt = dl.rsqrt %add_1 : tensor<8x1xf32>
    %mul = dl.mul %x, %rsqrt : (tensor<8x16xf32>, tensor<8x1xf32>) -> tensor<8x16xf32>
    %n_weight = dl.param "n.weight" : tensor<16xf32>
    %mul_1 = dl.mul %n_weight, %mul : (tensor<16xf32>, tensor<8x16xf32>) -> tensor<8x16xf32>
    %q_weight = dl.param "q.weight" : tensor<8x16xf32>
    %q = dl.linear %mul_1, %q_weight : tensor<8x16xf32>, tensor<8x16xf32> -> tensor<8x8xf32>
    %k_weight = dl.param "k.weight" : tensor<4x16xf32>
    %k = dl.linear %mul_1, %k_weight : tensor<8x16xf32>, tensor<4x16xf32> -> tensor<8x4xf32>
    %pow_1 = dl.pow %x {exponent = 2.000000e+00 : f64} : tensor<8x16xf32>
    %mean_1 = dl.reduce_mean %pow_1 {dims = array<i64: 1>, keepdim = true} : tensor<8x16xf32> -> tensor<8x1xf32>
    %add_2 = dl.constant 1.000000e-06 : f64 : tensor<f32>
    %add_3 = dl.add %mean_1, %add_2 : (tensor<8x1xf32>, tensor<f32>) -> tensor<8x1xf32>
    %rsqrt_1 = dl.rsqrt %add_3 : tensor<8x1xf32>
    %mul_2 = dl.mul %x, %rsqrt_1 : (tensor<8x16xf32>, tensor<8x1xf32>) -> tensor<8x16xf32>
    %n2_weight = dl.param "n2.weight" : tensor<16xf32>
    %mul_3 = dl.mul %n2_weight, %mul_2 : (tensor<16xf32>, tensor<8x16xf32>) -> tensor<8x16xf32>
    %o_weight = dl.param "o.weight" : tensor<8x16xf32>
    %o = dl.linear %mul_3, %o_weight : tensor<8x16xf32>, tensor<8x16xf32> -> tensor<8x8xf32>
    %getitem = dl.slice %mul_3 {dim = 1 : i64, start = 0 : i64, end = 8 : i64} : tensor<8x16xf32> -> tensor<8x8xf32>
    %add_4 = dl.add %o, %getitem : (tensor<8x8xf32>, tensor<8x8xf32>) -> tensor<8x8xf32>
    %mul_4 = dl.constant 2.000000e+00 : f64 : tensor<f32>
    %mul_5 = dl.mul %x, %mul_4 : (tensor<8x16xf32>, tensor<f32>) -> tensor<8x16xf32>
    %mul_6 = dl.constant 4.000000e+00 : f64 : tensor<f32>
    %mul_7 = dl.mul %mul_5, %mul_6 : (tensor<8x16xf32>, tensor<f32>) -> tensor<8x16xf32>
    %add_5 = dl.constant -0.000000e+00 : f64 : tensor<f32>
    %add_6 = dl.add %mul_7, %add_5 : (tensor<8x16xf32>, tensor<f32>) -> tensor<8x16xf32>
    %zero = dl.constant 0.000000e+00 : f64 : tensor<f32>
    %add_7 = dl.add %x, %zero : (tensor<8x16xf32>, tensor<f32>) -> tensor<8x16xf32>
    %view = dl.reshape %x : tensor<8x16xf32> -> tensor<8x4x4xf32>
    %view_1 = dl.reshape %view : tensor<8x4x4xf32> -> tensor<32x4xf32>
    %transpose = dl.permute %view_1 {perm = array<i64: 1, 0>} : tensor<32x4xf32> -> tensor<4x32xf32>
    %transpose_1 = dl.permute %transpose {perm = array<i64: 1, 0>} : tensor<4x32xf32> -> tensor<32x4xf32>
    func.return %q, %k, %add_4, %add_6, %transpose_1, %add_7 : tensor<8x8xf32>, tensor<8x4xf32>, tensor<8x8xf32>, tensor<8x16xf32>, tensor<32x4xf32>, tensor<8x16xf32>
  }
}
