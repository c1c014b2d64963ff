// RUN: dl-opt %s -p "algebraic,dce" | filecheck %s
// Heads sliced from a [.., heads, D] view of a projection's columns (Falcon's multi-query q/k/v) become views of
// column slices, and a slice of a slice along one dim one slice: the GEMM epilogue then takes them. A slice of
// the last dim of the view (within each head) or a strided slice stays.
// CHECK:      %[[Y:.*]] = dl.linear %x, %w : tensor<2x8x16xf32>, tensor<96x16xf32> -> tensor<2x8x96xf32>
// CHECK-NEXT: %[[H:.*]] = dl.reshape %[[Y]] : tensor<2x8x96xf32> -> tensor<2x8x6x16xf32>
// CHECK-NEXT: %[[QC:.*]] = dl.slice %[[Y]] {dim = 2 : i64, start = 0 : i64, end = 64 : i64} : tensor<2x8x96xf32> -> tensor<2x8x64xf32>
// CHECK-NEXT: %[[Q:.*]] = dl.reshape %[[QC]] : tensor<2x8x64xf32> -> tensor<2x8x4x16xf32>
// CHECK-NEXT: %[[KC:.*]] = dl.slice %[[Y]] {dim = 2 : i64, start = 64 : i64, end = 80 : i64} : tensor<2x8x96xf32> -> tensor<2x8x16xf32>
// CHECK-NEXT: %[[K:.*]] = dl.reshape %[[KC]] : tensor<2x8x16xf32> -> tensor<2x8x1x16xf32>
// CHECK-NEXT: %half = dl.slice %[[H]] {dim = 3 : i64, start = 0 : i64, end = 8 : i64}
// CHECK-NEXT: %even = dl.slice %[[H]] {dim = 2 : i64, start = 0 : i64, end = 6 : i64, step = 2 : i64}
// CHECK-NEXT: %inner = dl.slice %[[Y]] {dim = 2 : i64, start = 10 : i64, end = 20 : i64} : tensor<2x8x96xf32> -> tensor<2x8x10xf32>
// CHECK-NEXT: func.return %[[Q]], %[[K]], %half, %even, %inner

builtin.module {
  func.func @forward(%x: tensor<2x8x16xf32>) -> (tensor<2x8x4x16xf32>, tensor<2x8x1x16xf32>, tensor<2x8x6x8xf32>, tensor<2x8x3x16xf32>, tensor<2x8x10xf32>) {
    %w = dl.param "w" : tensor<96x16xf32>
    %y = dl.linear %x, %w : tensor<2x8x16xf32>, tensor<96x16xf32> -> tensor<2x8x96xf32>
    %heads = dl.reshape %y : tensor<2x8x96xf32> -> tensor<2x8x6x16xf32>
    %q = dl.slice %heads {dim = 2 : i64, start = 0 : i64, end = 4 : i64} : tensor<2x8x6x16xf32> -> tensor<2x8x4x16xf32>
    %k = dl.slice %heads {dim = 2 : i64, start = 4 : i64, end = 5 : i64} : tensor<2x8x6x16xf32> -> tensor<2x8x1x16xf32>
    %half = dl.slice %heads {dim = 3 : i64, start = 0 : i64, end = 8 : i64} : tensor<2x8x6x16xf32> -> tensor<2x8x6x8xf32>
    %even = dl.slice %heads {dim = 2 : i64, start = 0 : i64, end = 6 : i64, step = 2 : i64} : tensor<2x8x6x16xf32> -> tensor<2x8x3x16xf32>
    %outer = dl.slice %y {dim = 2 : i64, start = 8 : i64, end = 40 : i64} : tensor<2x8x96xf32> -> tensor<2x8x32xf32>
    %inner = dl.slice %outer {dim = 2 : i64, start = 2 : i64, end = 12 : i64} : tensor<2x8x32xf32> -> tensor<2x8x10xf32>
    func.return %q, %k, %half, %even, %inner : tensor<2x8x4x16xf32>, tensor<2x8x1x16xf32>, tensor<2x8x6x8xf32>, tensor<2x8x3x16xf32>, tensor<2x8x10xf32>
  }
}
