// RUN: dl-opt %s | dl-opt | filecheck %s
// Every dl op prints and parses back to the same text.

builtin.module {
  func.func @forward(%x: tensor<2x8x64xf32>, %idx: tensor<3xi64>) -> tensor<2x8x64xbf16> {
    %w = dl.param "norm.weight" : tensor<64xf32>
    %lw = dl.param "lin.weight" : tensor<64x64xf32>
    %lb = dl.param "lin.bias" : tensor<64xf32>
    %eps = dl.constant 1.000000e-06 : f64 : tensor<f32>
    %p = dl.pow %x {exponent = 2.000000e+00 : f64} : tensor<2x8x64xf32>
    %m = dl.reduce_mean %p {dims = array<i64: 2>, keepdim = true} : tensor<2x8x64xf32> -> tensor<2x8x1xf32>
    %s = dl.reduce_sum %p {dims = array<i64: 1, 2>} : tensor<2x8x64xf32> -> tensor<2xf32>
    %mx = dl.reduce_max %p {dims = array<i64: 0>} : tensor<2x8x64xf32> -> tensor<8x64xf32>
    %a = dl.add %m, %eps : (tensor<2x8x1xf32>, tensor<f32>) -> tensor<2x8x1xf32>
    %b = dl.sub %m, %eps : (tensor<2x8x1xf32>, tensor<f32>) -> tensor<2x8x1xf32>
    %c = dl.div %a, %b : (tensor<2x8x1xf32>, tensor<2x8x1xf32>) -> tensor<2x8x1xf32>
    %d = dl.maximum %a, %c : (tensor<2x8x1xf32>, tensor<2x8x1xf32>) -> tensor<2x8x1xf32>
    %e = dl.minimum %a, %d : (tensor<2x8x1xf32>, tensor<2x8x1xf32>) -> tensor<2x8x1xf32>
    %r = dl.rsqrt %e : tensor<2x8x1xf32>
    %n1 = dl.neg %r : tensor<2x8x1xf32>
    %n2m = dl.exp %n1 : tensor<2x8x1xf32>
    %n2 = dl.expm1 %n2m : tensor<2x8x1xf32>
    %n3l = dl.log1p %n2 : tensor<2x8x1xf32>
    %n3 = dl.log %n3l : tensor<2x8x1xf32>
    %n4 = dl.sqrt %n3 : tensor<2x8x1xf32>
    %n5 = dl.reciprocal %n4 : tensor<2x8x1xf32>
    %n6 = dl.abs %n5 : tensor<2x8x1xf32>
    %n7 = dl.sin %n6 : tensor<2x8x1xf32>
    %n8 = dl.cos %n7 : tensor<2x8x1xf32>
    %n9 = dl.sigmoid %n8 : tensor<2x8x1xf32>
    %n9e = dl.erf %n9 : tensor<2x8x1xf32>
    %n10 = dl.tanh %n9e : tensor<2x8x1xf32>
    %n11 = dl.relu %n10 : tensor<2x8x1xf32>
    %n12 = dl.silu %n11 : tensor<2x8x1xf32>
    %n13 = dl.gelu %n12 {approximate = "tanh"} : tensor<2x8x1xf32>
    %y = dl.mul %x, %n13 : (tensor<2x8x64xf32>, tensor<2x8x1xf32>) -> tensor<2x8x64xf32>
    %nrm0 = dl.rms_norm %y {eps = 1.000000e-06 : f64} : tensor<2x8x64xf32> -> tensor<2x8x64xf32>
    %nrm = dl.rms_norm %nrm0 weight %w {eps = 1.000000e-06 : f64} : tensor<2x8x64xf32>, tensor<64xf32> -> tensor<2x8x64xf32>
    %an0, %as0 = dl.add_rms_norm %nrm, %x {eps = 1.000000e-05 : f64} : tensor<2x8x64xf32>, tensor<2x8x64xf32> -> (tensor<2x8x64xf32>, tensor<2x8x64xf32>)
    %an, %as = dl.add_rms_norm %an0, %as0 weight %w {eps = 1.000000e-05 : f64, offset = 1.000000e+00 : f64, scale_in_f32 = true} : tensor<2x8x64xf32>, tensor<2x8x64xf32>, tensor<64xf32> -> (tensor<2x8x64xf32>, tensor<2x8x64xf32>)
    %ln = dl.layer_norm %an, %w, %lb {eps = 1.000000e-05 : f64} : (tensor<2x8x64xf32>, tensor<64xf32>, tensor<64xf32>) -> tensor<2x8x64xf32>
    %l1 = dl.linear %ln, %lw bias %lb : tensor<2x8x64xf32>, tensor<64x64xf32>, tensor<64xf32> -> tensor<2x8x64xf32>
    %l2 = dl.linear %ln, %lw : tensor<2x8x64xf32>, tensor<64x64xf32> -> tensor<2x8x64xf32>
    %g = dl.glu %l1, %l2 {act = "gelu_tanh"} : (tensor<2x8x64xf32>, tensor<2x8x64xf32>) -> tensor<2x8x64xf32>
    %v = dl.reshape %g : tensor<2x8x64xf32> -> tensor<2x8x4x16xf32>
    %t = dl.permute %v {perm = array<i64: 0, 2, 1, 3>} : tensor<2x8x4x16xf32> -> tensor<2x4x8x16xf32>
    %sl = dl.slice %t {dim = 3 : i64, start = 0 : i64, end = 16 : i64, step = 2 : i64} : tensor<2x4x8x16xf32> -> tensor<2x4x8x8xf32>
    %ct = dl.cat %sl, %sl {dim = 3 : i64} : (tensor<2x4x8x8xf32>, tensor<2x4x8x8xf32>) -> tensor<2x4x8x16xf32>
    %cs = dl.param "cos" : tensor<8x8xf32>
    %ro = dl.rotary %ct, %cs, %cs {layout = "interleaved", rotary_dim = 8 : i64} : (tensor<2x4x8x16xf32>, tensor<8x8xf32>, tensor<8x8xf32>) -> tensor<2x4x8x16xf32>
    %mask = dl.param "mask" : tensor<8x8xi1>
    %at = dl.sdpa %ro, %ro, %t mask %mask {is_causal = true, scale = 2.500000e-01 : f64} : tensor<2x4x8x16xf32>, tensor<2x4x8x16xf32>, tensor<2x4x8x16xf32>, tensor<8x8xi1> -> tensor<2x4x8x16xf32>
    %kt = dl.permute %at {perm = array<i64: 0, 1, 3, 2>} : tensor<2x4x8x16xf32> -> tensor<2x4x16x8xf32>
    %mm = dl.matmul %at, %kt : (tensor<2x4x8x16xf32>, tensor<2x4x16x8xf32>) -> tensor<2x4x8x8xf32>
    %sm = dl.softmax %mm {dim = 3 : i64} : tensor<2x4x8x8xf32>
    %wh = dl.where %mask, %sm, %eps : (tensor<8x8xi1>, tensor<2x4x8x8xf32>, tensor<f32>) -> tensor<2x4x8x8xf32>
    %gt = dl.compare "gt" %sm, %eps : (tensor<2x4x8x8xf32>, tensor<f32>) -> tensor<2x4x8x8xi1>
    %both = dl.logical "and" %gt, %mask : (tensor<2x4x8x8xi1>, tensor<8x8xi1>) -> tensor<2x4x8x8xi1>
    %neither = dl.not %both : tensor<2x4x8x8xi1>
    %zeros = dl.convert %neither : tensor<2x4x8x8xi1> -> tensor<2x4x8x8xbf16>
    %at2 = dl.sdpa %ro, %ro, %t mask %mask {mask_fill = -1.000000e+09 : f64, mask_mode = "drop", masked_rows = "nan"} : tensor<2x4x8x16xf32>, tensor<2x4x8x16xf32>, tensor<2x4x8x16xf32>, tensor<8x8xi1> -> tensor<2x4x8x16xf32>
    %bc = dl.broadcast %w : tensor<64xf32> -> tensor<2x8x64xf32>
    %pos = dl.param "pos" : tensor<2xi64>
    %upd = dl.slice %bc {dim = 1 : i64, start = 0 : i64, end = 2 : i64, step = 1 : i64} : tensor<2x8x64xf32> -> tensor<2x2x64xf32>
    %ic = dl.index_copy %bc[%pos] = %upd {dim = 1 : i64} : tensor<2x8x64xf32>, tensor<2xi64>, tensor<2x2x64xf32> -> tensor<2x8x64xf32>
    %emb = dl.embedding %lw, %idx : (tensor<64x64xf32>, tensor<3xi64>) -> tensor<3x64xf32>
    %rw = dl.param "moe.router" : tensor<4x64xf32>
    %gu = dl.param "moe.gate_up" : tensor<4x32x64xf32>
    %dw = dl.param "moe.down" : tensor<4x64x16xf32>
    %moe = dl.moe %emb, %rw, %gu, %dw {top_k = 2 : i64, renormalize = true} : (tensor<3x64xf32>, tensor<4x64xf32>, tensor<4x32x64xf32>, tensor<4x64x16xf32>) -> tensor<3x64xf32>
    %tc = dl.torch_call "torch.flip"(%bc) {node = "flip"} : (tensor<2x8x64xf32>) -> tensor<2x8x64xf32>
    %f = dl.fused "elementwise" (%tc, %w) : (tensor<2x8x64xf32>, tensor<64xf32>) -> tensor<2x8x64xf32> {
    ^bb0(%fa: tensor<2x8x64xf32>, %fb: tensor<64xf32>):
      %fm = dl.mul %fa, %fb : (tensor<2x8x64xf32>, tensor<64xf32>) -> tensor<2x8x64xf32>
      dl.yield %fm : tensor<2x8x64xf32>
    }
    %out = dl.convert %f : tensor<2x8x64xf32> -> tensor<2x8x64xbf16>
    func.return %out : tensor<2x8x64xbf16>
  }
}

// CHECK:      %{{.*}} = dl.param "norm.weight" : tensor<64xf32>
// CHECK:      dl.constant 1.000000e-06 : f64 : tensor<f32>
// CHECK:      dl.reduce_mean %{{.*}} {dims = array<i64: 2>, keepdim = true}
// CHECK:      dl.reduce_sum %{{.*}} {dims = array<i64: 1, 2>} : tensor<2x8x64xf32> -> tensor<2xf32>
// CHECK:      dl.gelu %{{.*}} {approximate = "tanh"}
// CHECK:      dl.add_rms_norm {{.*}} {eps = 1.000000e-05 : f64, offset = 1.000000e+00 : f64, scale_in_f32 = true}
// CHECK:      dl.linear %{{.*}}, %{{.*}} bias %{{.*}} : tensor<2x8x64xf32>, tensor<64x64xf32>, tensor<64xf32> -> tensor<2x8x64xf32>
// CHECK:      dl.glu {{.*}} {act = "gelu_tanh"}
// CHECK:      dl.slice {{.*}} {dim = 3 : i64, start = 0 : i64, end = 16 : i64, step = 2 : i64}
// CHECK:      dl.rotary {{.*}} {layout = "interleaved", rotary_dim = 8 : i64}
// CHECK:      dl.sdpa {{.*}} mask %{{.*}} {is_causal = true, scale = 2.500000e-01 : f64}
// CHECK:      dl.where %{{.*}}, %{{.*}}, %{{.*}} : (tensor<8x8xi1>, tensor<2x4x8x8xf32>, tensor<f32>) -> tensor<2x4x8x8xf32>
// CHECK:      dl.compare "gt" %{{.*}}, %{{.*}} : (tensor<2x4x8x8xf32>, tensor<f32>) -> tensor<2x4x8x8xi1>
// CHECK:      dl.logical "and" %{{.*}}, %{{.*}} : (tensor<2x4x8x8xi1>, tensor<8x8xi1>) -> tensor<2x4x8x8xi1>
// CHECK:      dl.not %{{.*}} : tensor<2x4x8x8xi1>
// CHECK:      dl.convert %{{.*}} : tensor<2x4x8x8xi1> -> tensor<2x4x8x8xbf16>
// CHECK:      dl.sdpa {{.*}} mask %{{.*}} {mask_fill = -1.000000e+09 : f64, mask_mode = "drop", masked_rows = "nan"}
// CHECK:      dl.index_copy %{{.*}}[%{{.*}}] = %{{.*}} {dim = 1 : i64} : tensor<2x8x64xf32>, tensor<2xi64>, tensor<2x2x64xf32> -> tensor<2x8x64xf32>
// CHECK:      dl.moe %{{.*}} {top_k = 2 : i64, renormalize = true} : (tensor<3x64xf32>, tensor<4x64xf32>, tensor<4x32x64xf32>, tensor<4x64x16xf32>) -> tensor<3x64xf32>
// CHECK:      dl.torch_call "torch.flip"(%{{.*}}) {node = "flip"}
// CHECK:      dl.fused "elementwise"(%{{.*}}, %{{.*}}) : (tensor<2x8x64xf32>, tensor<64xf32>) -> tensor<2x8x64xf32> {
// CHECK-NEXT: ^{{.*}}(%{{.*}}: tensor<2x8x64xf32>, %{{.*}}: tensor<64xf32>):
// CHECK:        dl.yield %{{.*}} : tensor<2x8x64xf32>
// CHECK:      dl.convert %{{.*}} : tensor<2x8x64xf32> -> tensor<2x8x64xbf16>
