// RUN: dl-opt %s --split-input-file --verify-diagnostics | filecheck %s
// Verifiers reject bad shapes and dtypes with a message that names the op and the rule.

func.func @bad_broadcast(%a: tensor<2x3xf32>, %b: tensor<4x3xf32>) -> tensor<4x3xf32> {
  %0 = dl.add %a, %b : (tensor<2x3xf32>, tensor<4x3xf32>) -> tensor<4x3xf32>
  func.return %0 : tensor<4x3xf32>
}
// CHECK: dl.add: shapes [(2, 3), (4, 3)] do not broadcast

// -----

func.func @bad_result(%a: tensor<2x3xf32>, %b: tensor<2x3xbf16>) -> tensor<2x3xbf16> {
  %0 = dl.mul %a, %b : (tensor<2x3xf32>, tensor<2x3xbf16>) -> tensor<2x3xbf16>
  func.return %0 : tensor<2x3xbf16>
}
// CHECK: dl.mul: operands tensor<2x3xf32> and tensor<2x3xbf16> give tensor<2x3xf32>, but the result is tensor<2x3xbf16>

// -----

func.func @bad_linear(%x: tensor<4x32xf32>, %w: tensor<16x64xf32>) -> tensor<4x16xf32> {
  %0 = dl.linear %x, %w : tensor<4x32xf32>, tensor<16x64xf32> -> tensor<4x16xf32>
  func.return %0 : tensor<4x16xf32>
}
// CHECK: dl.linear: input tensor<4x32xf32> does not match weight tensor<16x64xf32> ([N, K])

// -----

func.func @bad_dtype(%x: tensor<4x32xf64>) -> tensor<4x32xf64> {
  %0 = dl.exp %x : tensor<4x32xf64>
  func.return %0 : tensor<4x32xf64>
}
// CHECK: expected a tensor of f16, bf16 or f32, got tensor<4x32xf64>

// -----

func.func @bad_norm(%x: tensor<4x32xf32>, %w: tensor<16xf32>) -> tensor<4x32xf32> {
  %0 = dl.rms_norm %x weight %w {eps = 1.000000e-06 : f64} : tensor<4x32xf32>, tensor<16xf32> -> tensor<4x32xf32>
  func.return %0 : tensor<4x32xf32>
}
// CHECK: dl.rms_norm: weight tensor<16xf32> must be rank-1 of size 32 (the last dim of tensor<4x32xf32>)

// -----

func.func @bad_reshape(%x: tensor<4x32xf32>) -> tensor<4x30xf32> {
  %0 = dl.reshape %x : tensor<4x32xf32> -> tensor<4x30xf32>
  func.return %0 : tensor<4x30xf32>
}
// CHECK: dl.reshape: (4, 32) has 128 elements, (4, 30) has 120

// -----

func.func @bad_permute(%x: tensor<4x32xf32>) -> tensor<32x4xf32> {
  %0 = dl.permute %x {perm = array<i64: 0, 0>} : tensor<4x32xf32> -> tensor<32x4xf32>
  func.return %0 : tensor<32x4xf32>
}
// CHECK: dl.permute: [0, 0] is not a permutation of 2 dims

// -----

func.func @bad_gqa(%q: tensor<1x6x8x16xf32>, %k: tensor<1x4x8x16xf32>) -> tensor<1x6x8x16xf32> {
  %0 = dl.sdpa %q, %k, %k {enable_gqa = true} : tensor<1x6x8x16xf32>, tensor<1x4x8x16xf32>, tensor<1x4x8x16xf32> -> tensor<1x6x8x16xf32>
  func.return %0 : tensor<1x6x8x16xf32>
}
// CHECK: dl.sdpa: 6 query heads vs 4 key heads needs enable_gqa and divisibility

// -----

func.func @bad_rotary(%x: tensor<2x8x16xf32>, %c: tensor<8x6xf32>) -> tensor<2x8x16xf32> {
  %0 = dl.rotary %x, %c, %c {rotary_dim = 8 : i64} : (tensor<2x8x16xf32>, tensor<8x6xf32>, tensor<8x6xf32>) -> tensor<2x8x16xf32>
  func.return %0 : tensor<2x8x16xf32>
}
// CHECK: dl.rotary: tensor<8x6xf32> does not broadcast to (2, 8, 8)

// -----

func.func @bad_moe(%x: tensor<3x64xf32>, %r: tensor<4x64xf32>, %gu: tensor<4x32x64xf32>, %d: tensor<4x64x8xf32>) -> tensor<3x64xf32> {
  %0 = dl.moe %x, %r, %gu, %d {top_k = 2 : i64, renormalize = true} : (tensor<3x64xf32>, tensor<4x64xf32>, tensor<4x32x64xf32>, tensor<4x64x8xf32>) -> tensor<3x64xf32>
  func.return %0 : tensor<3x64xf32>
}
// CHECK: dl.moe: need x [T, H], router_weight [E, H], w_gate_up [E, 2I, H], w_down [E, H, I]

// -----

func.func @bad_moe_top_k(%x: tensor<3x64xf32>, %r: tensor<4x64xf32>, %gu: tensor<4x32x64xf32>, %d: tensor<4x64x16xf32>) -> tensor<3x64xf32> {
  %0 = dl.moe %x, %r, %gu, %d {top_k = 5 : i64, renormalize = true} : (tensor<3x64xf32>, tensor<4x64xf32>, tensor<4x32x64xf32>, tensor<4x64x16xf32>) -> tensor<3x64xf32>
  func.return %0 : tensor<3x64xf32>
}
// CHECK: dl.moe: top_k 5 must be in [1, 4] (the number of experts)
