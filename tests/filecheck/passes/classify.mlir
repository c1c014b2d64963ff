// RUN: dl-opt %s -p classify | filecheck %s
// classify writes each op's DNNFusion mapping kind into the IR.
// CHECK: dl.pow {{.*}}{kind = "one-to-one"
// CHECK: dl.reduce_mean {{.*}}{kind = "many-to-many"
// CHECK: dl.linear {{.*}}{kind = "many-to-many"}
// CHECK: dl.add {{.*}}{kind = "one-to-one"}

builtin.module {
  func.func @forward(%x: tensor<4x16xf32>) -> tensor<4x16xf32> {
    %pow = dl.pow %x {exponent = 2.000000e+00 : f64} : tensor<4x16xf32>
    %mean = dl.reduce_mean %pow {dims = array<i64: 1>, keepdim = true} : tensor<4x16xf32> -> tensor<4x1xf32>
    %add = dl.constant 1.000000e-06 : f64 : tensor<f32>
    %add_1 = dl.add %mean, %add : (tensor<4x1xf32>, tensor<f32>) -> tensor<4x1xf32>
    %rsqrt = dl.rsqrt %add_1 : tensor<4x1xf32>
    %mul = dl.mul %x, %rsqrt : (tensor<4x16xf32>, tensor<4x1xf32>) -> tensor<4x16xf32>
    %n_weight = dl.param "n.weight" : tensor<16xf32>
    %mul_1 = dl.mul %n_weight, %mul : (tensor<16xf32>, tensor<4x16xf32>) -> tensor<4x16xf32>
    %lin_weight = dl.param "lin.weight" : tensor<16x16xf32>
    %lin = dl.linear %mul_1, %lin_weight : tensor<4x16xf32>, tensor<16x16xf32> -> tensor<4x16xf32>
    %add_2 = dl.add %lin, %mul_1 : (tensor<4x16xf32>, tensor<4x16xf32>) -> tensor<4x16xf32>
    func.return %add_2 : tensor<4x16xf32>
  }
}
