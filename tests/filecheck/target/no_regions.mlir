// RUN: dl-opt %s -t triton | filecheck %s
// Without the fuse pass there is nothing to emit: the target says which pass to run.
// CHECK:     # no dl.fused regions: run the `fuse` pass first (dl-opt -p fuse -t triton)
// CHECK-NOT: @triton.jit

builtin.module {
  func.func @forward(%x: tensor<4x16xf32>) -> tensor<4x16xf32> {
    %e = dl.exp %x : tensor<4x16xf32>
    func.return %e : tensor<4x16xf32>
  }
}
