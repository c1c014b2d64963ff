// RUN: dl-opt %s -p cse,recognize,dce | filecheck %s
// act(gate) * up raises to dl.glu (either operand order); softmax spelled with the max raises to dl.softmax,
// without it stays as written (eager's exp overflows past 88 there, and inf / inf is NaN).
// CHECK:      dl.glu %g, %u : (tensor<3x8xf32>, tensor<3x8xf32>) -> tensor<3x8xf32>
// CHECK-NEXT: dl.glu %g, %u {act = "gelu_tanh"}
// CHECK-NEXT: dl.glu %g, %u {act = "gelu"}
// CHECK-NEXT: dl.softmax %x {dim = 1 : i64}
// CHECK-NEXT: %[[E:.*]] = dl.exp %x
// CHECK-NEXT: %[[S:.*]] = dl.reduce_sum %[[E]]
// CHECK-NEXT: dl.div %[[E]], %[[S]]
// CHECK-NOT:  dl.softmax

builtin.module {
  func.func @forward(%g: tensor<3x8xf32>, %u: tensor<3x8xf32>, %x: tensor<3x8xf32>) -> (tensor<3x8xf32>, tensor<3x8xf32>, tensor<3x8xf32>, tensor<3x8xf32>, tensor<3x8xf32>) {
    %amax = dl.reduce_max %x {dims = array<i64: 1>, keepdim = true} : tensor<3x8xf32> -> tensor<3x1xf32>
    %sub = dl.sub %x, %amax : (tensor<3x8xf32>, tensor<3x1xf32>) -> tensor<3x8xf32>
    %exp = dl.exp %sub : tensor<3x8xf32>
    %silu = dl.silu %g : tensor<3x8xf32>
    %mul = dl.mul %silu, %u : (tensor<3x8xf32>, tensor<3x8xf32>) -> tensor<3x8xf32>
    %gelu = dl.gelu %g {approximate = "tanh"} : tensor<3x8xf32>
    %mul_1 = dl.mul %u, %gelu : (tensor<3x8xf32>, tensor<3x8xf32>) -> tensor<3x8xf32>
    %gelu_1 = dl.gelu %g : tensor<3x8xf32>
    %mul_2 = dl.mul %gelu_1, %u : (tensor<3x8xf32>, tensor<3x8xf32>) -> tensor<3x8xf32>
    %sum = dl.reduce_sum %exp {dims = array<i64: 1>, keepdim = true} : tensor<3x8xf32> -> tensor<3x1xf32>
    %truediv = dl.div %exp, %sum : (tensor<3x8xf32>, tensor<3x1xf32>) -> tensor<3x8xf32>
    %exp_1 = dl.exp %x : tensor<3x8xf32>
    %exp_2 = dl.exp %x : tensor<3x8xf32>
    %sum_1 = dl.reduce_sum %exp_2 {dims = array<i64: 1>, keepdim = true} : tensor<3x8xf32> -> tensor<3x1xf32>
    %truediv_1 = dl.div %exp_1, %sum_1 : (tensor<3x8xf32>, tensor<3x1xf32>) -> tensor<3x8xf32>
    func.return %mul, %mul_1, %mul_2, %truediv, %truediv_1 : tensor<3x8xf32>, tensor<3x8xf32>, tensor<3x8xf32>, tensor<3x8xf32>, tensor<3x8xf32>
  }
}
