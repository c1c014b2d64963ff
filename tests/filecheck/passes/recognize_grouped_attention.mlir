// RUN: dl-opt %s -p recognize,algebraic,cse,dce | filecheck %s
// Falcon's new decoder architecture: 2 k/v heads broadcast to the 4 query heads on [B, S, H, D] (broadcast_to +
// flatten), then transposed, k rotated after the repeat. The rotary moves before the repeat (cos/sin are alike
// for every head), and the sdpa reads the 2 k/v heads with enable_gqa: no repeated copy is left.
// CHECK:      dl.rotary %{{.*}}, %cos, %sin {rotary_dim = 16 : i64} : (tensor<1x2x7x16xf32>,
// CHECK:      dl.sdpa %{{.*}}, %{{.*}}, %{{.*}} {is_causal = true, enable_gqa = true}
// CHECK-SAME: tensor<1x4x7x16xf32>, tensor<1x2x7x16xf32>, tensor<1x2x7x16xf32> -> tensor<1x4x7x16xf32>
// CHECK-NOT:  dl.broadcast

builtin.module {
  func.func @forward(%qkv: tensor<1x7x2x4x16xf32>, %cos: tensor<1x1x7x16xf32>, %sin: tensor<1x1x7x16xf32>) -> tensor<1x4x7x16xf32> {
    %q5 = dl.slice %qkv {dim = 3 : i64, start = 0 : i64, end = 2 : i64, step = 1 : i64} : tensor<1x7x2x4x16xf32> -> tensor<1x7x2x2x16xf32>
    %k5 = dl.slice %qkv {dim = 3 : i64, start = 2 : i64, end = 3 : i64, step = 1 : i64} : tensor<1x7x2x4x16xf32> -> tensor<1x7x2x1x16xf32>
    %v5 = dl.slice %qkv {dim = 3 : i64, start = 3 : i64, end = 4 : i64, step = 1 : i64} : tensor<1x7x2x4x16xf32> -> tensor<1x7x2x1x16xf32>
    %kb = dl.broadcast %k5 : tensor<1x7x2x1x16xf32> -> tensor<1x7x2x2x16xf32>
    %vb = dl.broadcast %v5 : tensor<1x7x2x1x16xf32> -> tensor<1x7x2x2x16xf32>
    %q = dl.reshape %q5 : tensor<1x7x2x2x16xf32> -> tensor<1x7x4x16xf32>
    %k = dl.reshape %kb : tensor<1x7x2x2x16xf32> -> tensor<1x7x4x16xf32>
    %v = dl.reshape %vb : tensor<1x7x2x2x16xf32> -> tensor<1x7x4x16xf32>
    %qt = dl.permute %q {perm = array<i64: 0, 2, 1, 3>} : tensor<1x7x4x16xf32> -> tensor<1x4x7x16xf32>
    %kt = dl.permute %k {perm = array<i64: 0, 2, 1, 3>} : tensor<1x7x4x16xf32> -> tensor<1x4x7x16xf32>
    %vt = dl.permute %v {perm = array<i64: 0, 2, 1, 3>} : tensor<1x7x4x16xf32> -> tensor<1x4x7x16xf32>
    %qr = dl.rotary %qt, %cos, %sin {rotary_dim = 16 : i64} : (tensor<1x4x7x16xf32>, tensor<1x1x7x16xf32>, tensor<1x1x7x16xf32>) -> tensor<1x4x7x16xf32>
    %kr = dl.rotary %kt, %cos, %sin {rotary_dim = 16 : i64} : (tensor<1x4x7x16xf32>, tensor<1x1x7x16xf32>, tensor<1x1x7x16xf32>) -> tensor<1x4x7x16xf32>
    %o = dl.sdpa %qr, %kr, %vt {is_causal = true} : tensor<1x4x7x16xf32>, tensor<1x4x7x16xf32>, tensor<1x4x7x16xf32> -> tensor<1x4x7x16xf32>
    func.return %o : tensor<1x4x7x16xf32>
  }
}
