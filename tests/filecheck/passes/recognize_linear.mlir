// RUN: dl-opt %s -p recognize,algebraic,cse,dce | filecheck %s
// A matmul by a weight is a linear. x @ W.T reads W itself (nn.Linear's layout); y @ V with V [in, out] (GPT-2's
// Conv1D, imported from torch.addmm as matmul + bias) reads V transposed, a weight-only dl.permute the runtime
// computes once, and the bias add joins the linear; the view(-1, K) ... view(B, S, N) around it folds away.
// A matmul of two activations stays a matmul.
// CHECK:      %a = dl.linear %x, %w : tensor<8x16xf32>, tensor<4x16xf32> -> tensor<8x4xf32>
// CHECK:      %[[VT:.*]] = dl.permute %v {perm = array<i64: 1, 0>} : tensor<16x4xf32> -> tensor<4x16xf32>
// CHECK-NEXT: %c = dl.linear %y, %[[VT]] bias %b : tensor<2x3x16xf32>, tensor<4x16xf32>, tensor<4xf32> -> tensor<2x3x4xf32>
// CHECK:      %d = dl.matmul %x, %z
// CHECK-NOT:  dl.reshape

builtin.module {
  func.func @forward(%x: tensor<8x16xf32>, %y: tensor<2x3x16xf32>, %z: tensor<16x5xf32>) -> (tensor<8x4xf32>, tensor<2x3x4xf32>, tensor<8x5xf32>) {
    %w = dl.param "w" : tensor<4x16xf32>
    %wt = dl.permute %w {perm = array<i64: 1, 0>} : tensor<4x16xf32> -> tensor<16x4xf32>
    %a = dl.matmul %x, %wt : (tensor<8x16xf32>, tensor<16x4xf32>) -> tensor<8x4xf32>
    %v = dl.param "v" : tensor<16x4xf32>
    %b = dl.param "b" : tensor<4xf32>
    %flat = dl.reshape %y : tensor<2x3x16xf32> -> tensor<6x16xf32>
    %mm = dl.matmul %flat, %v : (tensor<6x16xf32>, tensor<16x4xf32>) -> tensor<6x4xf32>
    %c0 = dl.add %b, %mm : (tensor<4xf32>, tensor<6x4xf32>) -> tensor<6x4xf32>
    %c = dl.reshape %c0 : tensor<6x4xf32> -> tensor<2x3x4xf32>
    %d = dl.matmul %x, %z : (tensor<8x16xf32>, tensor<16x5xf32>) -> tensor<8x5xf32>
    func.return %a, %c, %d : tensor<8x4xf32>, tensor<2x3x4xf32>, tensor<8x5xf32>
  }
}
