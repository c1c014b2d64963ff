// RUN: dl-opt %s -p recognize,dce | filecheck %s
// softmax(q k^T / 4 + mask) v with repeat_kv'd k and v (and the fp32 softmax cast) raises to dl.sdpa with GQA.
// CHECK:      dl.sdpa %q, %k, %v mask %mask {enable_gqa = true, masked_rows = "nan", scale = 2.500000e-01 : f64}
// CHECK-SAME: tensor<1x4x5x16xf32>, tensor<1x2x5x16xf32>, tensor<1x2x5x16xf32>, tensor<5x5xf32> -> tensor<1x4x5x16xf32>
// CHECK-NOT:  dl.matmul
// CHECK-NOT:  dl.softmax

builtin.module {
  func.func @forward(%q: tensor<1x4x5x16xf32>, %k: tensor<1x2x5x16xf32>, %v: tensor<1x2x5x16xf32>, %mask: tensor<5x5xf32>) -> tensor<1x4x5x16xf32> {
    %getitem = dl.reshape %k : tensor<1x2x5x16xf32> -> tensor<1x2x1x5x16xf32>
    %expand = dl.broadcast %getitem : tensor<1x2x1x5x16xf32> -> tensor<1x2x2x5x16xf32>
    %reshape = dl.reshape %expand : tensor<1x2x2x5x16xf32> -> tensor<1x4x5x16xf32>
    %getitem_1 = dl.reshape %v : tensor<1x2x5x16xf32> -> tensor<1x2x1x5x16xf32>
    %expand_1 = dl.broadcast %getitem_1 : tensor<1x2x1x5x16xf32> -> tensor<1x2x2x5x16xf32>
    %reshape_1 = dl.reshape %expand_1 : tensor<1x2x2x5x16xf32> -> tensor<1x4x5x16xf32>
    %transpose = dl.permute %reshape {perm = array<i64: 0, 1, 3, 2>} : tensor<1x4x5x16xf32> -> tensor<1x4x16x5xf32>
    %matmul = dl.matmul %q, %transpose : (tensor<1x4x5x16xf32>, tensor<1x4x16x5xf32>) -> tensor<1x4x5x5xf32>
    %truediv = dl.constant 4.000000e+00 : f64 : tensor<f32>
    %truediv_1 = dl.div %matmul, %truediv : (tensor<1x4x5x5xf32>, tensor<f32>) -> tensor<1x4x5x5xf32>
    %add = dl.add %truediv_1, %mask : (tensor<1x4x5x5xf32>, tensor<5x5xf32>) -> tensor<1x4x5x5xf32>
    %softmax = dl.softmax %add {dim = 3 : i64} : tensor<1x4x5x5xf32>
    %matmul_1 = dl.matmul %softmax, %reshape_1 : (tensor<1x4x5x5xf32>, tensor<1x4x5x16xf32>) -> tensor<1x4x5x16xf32>
    func.return %matmul_1 : tensor<1x4x5x16xf32>
  }
}
