// RUN: dl-opt %s -p cse,recognize,algebraic,cse,dce,fuse | filecheck %s
// A Llama-style block becomes five kernels: norm+QKV+rotary (one GEMM, norm statistics in the prologue,
// rotary in the epilogue, v written untouched), attention, o-proj + residual, norm + gate/up + SiLU*up
// (dual GEMM), down + residual. Only the weight-only expressions stay outside regions.
// CHECK:      dl.cat %q_proj_weight, %k_proj_weight, %v_proj_weight
// CHECK:      dl.fused "gemm"(%x, %{{.*}}, %cos, %sin)
// CHECK:        dl.rms_norm
// CHECK:        dl.linear
// CHECK:        dl.rotary
// CHECK:        dl.rotary
// CHECK:      dl.fused "attention"
// CHECK:        dl.sdpa {{.*}} {is_causal = true, enable_gqa = true}
// CHECK:        dl.permute
// CHECK:        dl.reshape
// CHECK:      dl.fused "gemm"(%{{.*}}, %o_proj_weight, %x)
// CHECK:        dl.add
// CHECK:      dl.fused "gemm"
// CHECK:        dl.rms_norm
// CHECK:        dl.glu
// CHECK:      dl.fused "gemm"(%{{.*}}, %down_proj_weight, %{{.*}})
// CHECK:        dl.add
// CHECK:      func.return
// CHECK-NOT:  dl.fused

builtin.module {
  func.func @forward(%x: tensor<1x6x64xf32>, %cos: tensor<6x16xf32>, %sin: tensor<6x16xf32>) -> tensor<1x6x64xf32> {
    %pow = dl.pow %x {exponent = 2.000000e+00 : f64} : tensor<1x6x64xf32>
    %mean = dl.reduce_mean %pow {dims = array<i64: 2>, keepdim = true} : tensor<1x6x64xf32> -> tensor<1x6x1xf32>
    %add = dl.constant 1.000000e-06 : f64 : tensor<f32>
    %add_1 = dl.add %mean, %add : (tensor<1x6x1xf32>, tensor<f32>) -> tensor<1x6x1xf32>
    %rsqrt = dl.rsqrt %add_1 : tensor<1x6x1xf32>
    %mul = dl.mul %x, %rsqrt : (tensor<1x6x64xf32>, tensor<1x6x1xf32>) -> tensor<1x6x64xf32>
    %input_norm_weight = dl.param "input_norm.weight" : tensor<64xf32>
    %mul_1 = dl.mul %input_norm_weight, %mul : (tensor<64xf32>, tensor<1x6x64xf32>) -> tensor<1x6x64xf32>
    %q_proj_weight = dl.param "q_proj.weight" : tensor<64x64xf32>
    %q_proj = dl.linear %mul_1, %q_proj_weight : tensor<1x6x64xf32>, tensor<64x64xf32> -> tensor<1x6x64xf32>
    %view = dl.reshape %q_proj : tensor<1x6x64xf32> -> tensor<1x6x4x16xf32>
    %transpose = dl.permute %view {perm = array<i64: 0, 2, 1, 3>} : tensor<1x6x4x16xf32> -> tensor<1x4x6x16xf32>
    %k_proj_weight = dl.param "k_proj.weight" : tensor<32x64xf32>
    %k_proj = dl.linear %mul_1, %k_proj_weight : tensor<1x6x64xf32>, tensor<32x64xf32> -> tensor<1x6x32xf32>
    %view_1 = dl.reshape %k_proj : tensor<1x6x32xf32> -> tensor<1x6x2x16xf32>
    %transpose_1 = dl.permute %view_1 {perm = array<i64: 0, 2, 1, 3>} : tensor<1x6x2x16xf32> -> tensor<1x2x6x16xf32>
    %v_proj_weight = dl.param "v_proj.weight" : tensor<32x64xf32>
    %v_proj = dl.linear %mul_1, %v_proj_weight : tensor<1x6x64xf32>, tensor<32x64xf32> -> tensor<1x6x32xf32>
    %view_2 = dl.reshape %v_proj : tensor<1x6x32xf32> -> tensor<1x6x2x16xf32>
    %transpose_2 = dl.permute %view_2 {perm = array<i64: 0, 2, 1, 3>} : tensor<1x6x2x16xf32> -> tensor<1x2x6x16xf32>
    %unsqueeze = dl.reshape %cos : tensor<6x16xf32> -> tensor<1x6x16xf32>
    %unsqueeze_1 = dl.reshape %unsqueeze : tensor<1x6x16xf32> -> tensor<1x1x6x16xf32>
    %unsqueeze_2 = dl.reshape %sin : tensor<6x16xf32> -> tensor<1x6x16xf32>
    %unsqueeze_3 = dl.reshape %unsqueeze_2 : tensor<1x6x16xf32> -> tensor<1x1x6x16xf32>
    %mul_2 = dl.mul %transpose, %unsqueeze_1 : (tensor<1x4x6x16xf32>, tensor<1x1x6x16xf32>) -> tensor<1x4x6x16xf32>
    %getitem = dl.slice %transpose {dim = 3 : i64, start = 0 : i64, end = 8 : i64} : tensor<1x4x6x16xf32> -> tensor<1x4x6x8xf32>
    %getitem_1 = dl.slice %transpose {dim = 3 : i64, start = 8 : i64, end = 16 : i64} : tensor<1x4x6x16xf32> -> tensor<1x4x6x8xf32>
    %neg = dl.neg %getitem_1 : tensor<1x4x6x8xf32>
    %cat = dl.cat %neg, %getitem {dim = 3 : i64} : (tensor<1x4x6x8xf32>, tensor<1x4x6x8xf32>) -> tensor<1x4x6x16xf32>
    %mul_3 = dl.mul %cat, %unsqueeze_3 : (tensor<1x4x6x16xf32>, tensor<1x1x6x16xf32>) -> tensor<1x4x6x16xf32>
    %add_2 = dl.add %mul_2, %mul_3 : (tensor<1x4x6x16xf32>, tensor<1x4x6x16xf32>) -> tensor<1x4x6x16xf32>
    %mul_4 = dl.mul %transpose_1, %unsqueeze_1 : (tensor<1x2x6x16xf32>, tensor<1x1x6x16xf32>) -> tensor<1x2x6x16xf32>
    %getitem_2 = dl.slice %transpose_1 {dim = 3 : i64, start = 0 : i64, end = 8 : i64} : tensor<1x2x6x16xf32> -> tensor<1x2x6x8xf32>
    %getitem_3 = dl.slice %transpose_1 {dim = 3 : i64, start = 8 : i64, end = 16 : i64} : tensor<1x2x6x16xf32> -> tensor<1x2x6x8xf32>
    %neg_1 = dl.neg %getitem_3 : tensor<1x2x6x8xf32>
    %cat_1 = dl.cat %neg_1, %getitem_2 {dim = 3 : i64} : (tensor<1x2x6x8xf32>, tensor<1x2x6x8xf32>) -> tensor<1x2x6x16xf32>
    %mul_5 = dl.mul %cat_1, %unsqueeze_3 : (tensor<1x2x6x16xf32>, tensor<1x1x6x16xf32>) -> tensor<1x2x6x16xf32>
    %add_3 = dl.add %mul_4, %mul_5 : (tensor<1x2x6x16xf32>, tensor<1x2x6x16xf32>) -> tensor<1x2x6x16xf32>
    %scaled_dot_product_attention = dl.sdpa %add_2, %add_3, %transpose_2 {is_causal = true, enable_gqa = true} : tensor<1x4x6x16xf32>, tensor<1x2x6x16xf32>, tensor<1x2x6x16xf32> -> tensor<1x4x6x16xf32>
    %transpose_3 = dl.permute %scaled_dot_product_attention {perm = array<i64: 0, 2, 1, 3>} : tensor<1x4x6x16xf32> -> tensor<1x6x4x16xf32>
    %reshape = dl.reshape %transpose_3 : tensor<1x6x4x16xf32> -> tensor<1x6x64xf32>
    %o_proj_weight = dl.param "o_proj.weight" : tensor<64x64xf32>
    %o_proj = dl.linear %reshape, %o_proj_weight : tensor<1x6x64xf32>, tensor<64x64xf32> -> tensor<1x6x64xf32>
    %add_4 = dl.add %x, %o_proj : (tensor<1x6x64xf32>, tensor<1x6x64xf32>) -> tensor<1x6x64xf32>
    %pow_1 = dl.pow %add_4 {exponent = 2.000000e+00 : f64} : tensor<1x6x64xf32>
    %mean_1 = dl.reduce_mean %pow_1 {dims = array<i64: 2>, keepdim = true} : tensor<1x6x64xf32> -> tensor<1x6x1xf32>
    %add_5 = dl.constant 1.000000e-06 : f64 : tensor<f32>
    %add_6 = dl.add %mean_1, %add_5 : (tensor<1x6x1xf32>, tensor<f32>) -> tensor<1x6x1xf32>
    %rsqrt_1 = dl.rsqrt %add_6 : tensor<1x6x1xf32>
    %mul_6 = dl.mul %add_4, %rsqrt_1 : (tensor<1x6x64xf32>, tensor<1x6x1xf32>) -> tensor<1x6x64xf32>
    %post_norm_weight = dl.param "post_norm.weight" : tensor<64xf32>
    %mul_7 = dl.mul %post_norm_weight, %mul_6 : (tensor<64xf32>, tensor<1x6x64xf32>) -> tensor<1x6x64xf32>
    %gate_proj_weight = dl.param "gate_proj.weight" : tensor<160x64xf32>
    %gate_proj = dl.linear %mul_7, %gate_proj_weight : tensor<1x6x64xf32>, tensor<160x64xf32> -> tensor<1x6x160xf32>
    %silu = dl.silu %gate_proj : tensor<1x6x160xf32>
    %up_proj_weight = dl.param "up_proj.weight" : tensor<160x64xf32>
    %up_proj = dl.linear %mul_7, %up_proj_weight : tensor<1x6x64xf32>, tensor<160x64xf32> -> tensor<1x6x160xf32>
    %mul_8 = dl.mul %silu, %up_proj : (tensor<1x6x160xf32>, tensor<1x6x160xf32>) -> tensor<1x6x160xf32>
    %down_proj_weight = dl.param "down_proj.weight" : tensor<64x160xf32>
    %down_proj = dl.linear %mul_8, %down_proj_weight : tensor<1x6x160xf32>, tensor<64x160xf32> -> tensor<1x6x64xf32>
    %add_7 = dl.add %add_4, %down_proj : (tensor<1x6x64xf32>, tensor<1x6x64xf32>) -> tensor<1x6x64xf32>
    func.return %add_7 : tensor<1x6x64xf32>
  }
}
