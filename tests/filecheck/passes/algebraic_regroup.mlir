// RUN: dl-opt %s -p "algebraic,dce" | filecheck %s
// A projection viewed as [.., groups, heads + 2, D] and read through slices of the middle dim (Falcon's new
// decoder: per k/v group its query heads, then k, then v) gets its weight's rows ordered by slice (a cat of row
// slices of the parameter, computed once): q, k and v become views of column ranges, as Llama's split is.
// Group g's rows are [g*64, g*64 + 64): q rows [g*64, g*64 + 32), k [g*64 + 32, g*64 + 48), v [g*64 + 48, g*64 + 64).
// CHECK:      %[[W0:.*]] = dl.slice %w {dim = 0 : i64, start = 0 : i64, end = 32 : i64}
// CHECK-NEXT: %[[W1:.*]] = dl.slice %w {dim = 0 : i64, start = 64 : i64, end = 96 : i64}
// CHECK-NEXT: %[[W2:.*]] = dl.slice %w {dim = 0 : i64, start = 32 : i64, end = 48 : i64}
// CHECK-NEXT: %[[W3:.*]] = dl.slice %w {dim = 0 : i64, start = 96 : i64, end = 112 : i64}
// CHECK-NEXT: %[[W4:.*]] = dl.slice %w {dim = 0 : i64, start = 48 : i64, end = 64 : i64}
// CHECK-NEXT: %[[W5:.*]] = dl.slice %w {dim = 0 : i64, start = 112 : i64, end = 128 : i64}
// CHECK-NEXT: %[[W:.*]] = dl.cat %[[W0]], %[[W1]], %[[W2]], %[[W3]], %[[W4]], %[[W5]] {dim = 0 : i64}
// CHECK-NEXT: %[[Y:.*]] = dl.linear %x, %[[W]] : tensor<2x8x16xf32>, tensor<128x16xf32> -> tensor<2x8x128xf32>
// CHECK-NEXT: %[[QC:.*]] = dl.slice %[[Y]] {dim = 2 : i64, start = 0 : i64, end = 64 : i64}
// CHECK-NEXT: %q = dl.reshape %[[QC]] : tensor<2x8x64xf32> -> tensor<2x8x2x2x16xf32>
// CHECK-NEXT: %[[KC:.*]] = dl.slice %[[Y]] {dim = 2 : i64, start = 64 : i64, end = 96 : i64}
// CHECK-NEXT: %k = dl.reshape %[[KC]] : tensor<2x8x32xf32> -> tensor<2x8x2x1x16xf32>
// CHECK-NEXT: %[[VC:.*]] = dl.slice %[[Y]] {dim = 2 : i64, start = 96 : i64, end = 128 : i64}
// CHECK-NEXT: %v = dl.reshape %[[VC]] : tensor<2x8x32xf32> -> tensor<2x8x2x1x16xf32>
// A view read otherwise (here whole) keeps its weight as it is.
// CHECK:      %[[Y2:.*]] = dl.linear %x2, %w2
// CHECK-NEXT: %whole = dl.reshape %[[Y2]]
// CHECK-NEXT: %qq = dl.slice %whole {dim = 3 : i64, start = 0 : i64, end = 2 : i64}
// CHECK-NEXT: func.return %q, %k, %v, %whole, %qq

builtin.module {
  func.func @forward(%x: tensor<2x8x16xf32>, %x2: tensor<2x8x16xf32>) -> (tensor<2x8x2x2x16xf32>, tensor<2x8x2x1x16xf32>, tensor<2x8x2x1x16xf32>, tensor<2x8x2x4x16xf32>, tensor<2x8x2x2x16xf32>) {
    %w = dl.param "w" : tensor<128x16xf32>
    %w2 = dl.param "w2" : tensor<128x16xf32>
    %y = dl.linear %x, %w : tensor<2x8x16xf32>, tensor<128x16xf32> -> tensor<2x8x128xf32>
    %qkv = dl.reshape %y : tensor<2x8x128xf32> -> tensor<2x8x2x4x16xf32>
    %q = dl.slice %qkv {dim = 3 : i64, start = 0 : i64, end = 2 : i64} : tensor<2x8x2x4x16xf32> -> tensor<2x8x2x2x16xf32>
    %k = dl.slice %qkv {dim = 3 : i64, start = 2 : i64, end = 3 : i64} : tensor<2x8x2x4x16xf32> -> tensor<2x8x2x1x16xf32>
    %v = dl.slice %qkv {dim = 3 : i64, start = 3 : i64, end = 4 : i64} : tensor<2x8x2x4x16xf32> -> tensor<2x8x2x1x16xf32>
    %y2 = dl.linear %x2, %w2 : tensor<2x8x16xf32>, tensor<128x16xf32> -> tensor<2x8x128xf32>
    %whole = dl.reshape %y2 : tensor<2x8x128xf32> -> tensor<2x8x2x4x16xf32>
    %qq = dl.slice %whole {dim = 3 : i64, start = 0 : i64, end = 2 : i64} : tensor<2x8x2x4x16xf32> -> tensor<2x8x2x2x16xf32>
    func.return %q, %k, %v, %whole, %qq : tensor<2x8x2x2x16xf32>, tensor<2x8x2x1x16xf32>, tensor<2x8x2x1x16xf32>, tensor<2x8x2x4x16xf32>, tensor<2x8x2x2x16xf32>
  }
}
