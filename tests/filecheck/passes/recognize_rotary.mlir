// RUN: dl-opt %s -p recognize,dce | filecheck %s
// rotate_half (NeoX), rotate_every_two (GPT-J) and partial rotary raise to dl.rotary; a rotation the
// wrong way round (cat(x2, -x1)) is not rotary and must stay as it is.
// CHECK:      dl.rotary %q, %cos, %sin {rotary_dim = 16 : i64}
// CHECK-NEXT: dl.rotary %q, %ci, %si {layout = "interleaved", rotary_dim = 16 : i64}
// CHECK-NEXT: dl.rotary %q, %cp, %sp {rotary_dim = 8 : i64} : (tensor<1x2x4x16xf32>, tensor<4x8xf32>, tensor<4x8xf32>)
// CHECK-NEXT: dl.mul %q, %cos
// CHECK:      dl.cat
// CHECK:      dl.add
// CHECK-NOT:  dl.rotary

builtin.module {
  func.func @forward(%q: tensor<1x2x4x16xf32>, %cos: tensor<4x16xf32>, %sin: tensor<4x16xf32>, %ci: tensor<4x16xf32>, %si: tensor<4x16xf32>, %cp: tensor<4x8xf32>, %sp: tensor<4x8xf32>) -> (tensor<1x2x4x16xf32>, tensor<1x2x4x16xf32>, tensor<1x2x4x16xf32>, tensor<1x2x4x16xf32>) {
    %mul = dl.mul %q, %cos : (tensor<1x2x4x16xf32>, tensor<4x16xf32>) -> tensor<1x2x4x16xf32>
    %getitem = dl.slice %q {dim = 3 : i64, start = 0 : i64, end = 8 : i64} : tensor<1x2x4x16xf32> -> tensor<1x2x4x8xf32>
    %getitem_1 = dl.slice %q {dim = 3 : i64, start = 8 : i64, end = 16 : i64} : tensor<1x2x4x16xf32> -> tensor<1x2x4x8xf32>
    %neg = dl.neg %getitem_1 : tensor<1x2x4x8xf32>
    %cat = dl.cat %neg, %getitem {dim = 3 : i64} : (tensor<1x2x4x8xf32>, tensor<1x2x4x8xf32>) -> tensor<1x2x4x16xf32>
    %mul_1 = dl.mul %cat, %sin : (tensor<1x2x4x16xf32>, tensor<4x16xf32>) -> tensor<1x2x4x16xf32>
    %add = dl.add %mul, %mul_1 : (tensor<1x2x4x16xf32>, tensor<1x2x4x16xf32>) -> tensor<1x2x4x16xf32>
    %mul_2 = dl.mul %q, %ci : (tensor<1x2x4x16xf32>, tensor<4x16xf32>) -> tensor<1x2x4x16xf32>
    %getitem_2 = dl.slice %q {dim = 3 : i64, start = 1 : i64, end = 16 : i64, step = 2 : i64} : tensor<1x2x4x16xf32> -> tensor<1x2x4x8xf32>
    %neg_1 = dl.neg %getitem_2 : tensor<1x2x4x8xf32>
    %getitem_3 = dl.slice %q {dim = 3 : i64, start = 0 : i64, end = 16 : i64, step = 2 : i64} : tensor<1x2x4x16xf32> -> tensor<1x2x4x8xf32>
    %stack = dl.reshape %neg_1 : tensor<1x2x4x8xf32> -> tensor<1x2x4x8x1xf32>
    %stack_1 = dl.reshape %getitem_3 : tensor<1x2x4x8xf32> -> tensor<1x2x4x8x1xf32>
    %stack_2 = dl.cat %stack, %stack_1 {dim = 4 : i64} : (tensor<1x2x4x8x1xf32>, tensor<1x2x4x8x1xf32>) -> tensor<1x2x4x8x2xf32>
    %flatten = dl.reshape %stack_2 : tensor<1x2x4x8x2xf32> -> tensor<1x2x4x16xf32>
    %mul_3 = dl.mul %flatten, %si : (tensor<1x2x4x16xf32>, tensor<4x16xf32>) -> tensor<1x2x4x16xf32>
    %add_1 = dl.add %mul_2, %mul_3 : (tensor<1x2x4x16xf32>, tensor<1x2x4x16xf32>) -> tensor<1x2x4x16xf32>
    %getitem_4 = dl.slice %q {dim = 3 : i64, start = 0 : i64, end = 8 : i64} : tensor<1x2x4x16xf32> -> tensor<1x2x4x8xf32>
    %getitem_5 = dl.slice %q {dim = 3 : i64, start = 8 : i64, end = 16 : i64} : tensor<1x2x4x16xf32> -> tensor<1x2x4x8xf32>
    %mul_4 = dl.mul %getitem_4, %cp : (tensor<1x2x4x8xf32>, tensor<4x8xf32>) -> tensor<1x2x4x8xf32>
    %getitem_6 = dl.slice %getitem_4 {dim = 3 : i64, start = 0 : i64, end = 4 : i64} : tensor<1x2x4x8xf32> -> tensor<1x2x4x4xf32>
    %getitem_7 = dl.slice %getitem_4 {dim = 3 : i64, start = 4 : i64, end = 8 : i64} : tensor<1x2x4x8xf32> -> tensor<1x2x4x4xf32>
    %neg_2 = dl.neg %getitem_7 : tensor<1x2x4x4xf32>
    %cat_1 = dl.cat %neg_2, %getitem_6 {dim = 3 : i64} : (tensor<1x2x4x4xf32>, tensor<1x2x4x4xf32>) -> tensor<1x2x4x8xf32>
    %mul_5 = dl.mul %cat_1, %sp : (tensor<1x2x4x8xf32>, tensor<4x8xf32>) -> tensor<1x2x4x8xf32>
    %add_2 = dl.add %mul_4, %mul_5 : (tensor<1x2x4x8xf32>, tensor<1x2x4x8xf32>) -> tensor<1x2x4x8xf32>
    %cat_2 = dl.cat %add_2, %getitem_5 {dim = 3 : i64} : (tensor<1x2x4x8xf32>, tensor<1x2x4x8xf32>) -> tensor<1x2x4x16xf32>
    %mul_6 = dl.mul %q, %cos : (tensor<1x2x4x16xf32>, tensor<4x16xf32>) -> tensor<1x2x4x16xf32>
    %getitem_8 = dl.slice %q {dim = 3 : i64, start = 8 : i64, end = 16 : i64} : tensor<1x2x4x16xf32> -> tensor<1x2x4x8xf32>
    %getitem_9 = dl.slice %q {dim = 3 : i64, start = 0 : i64, end = 8 : i64} : tensor<1x2x4x16xf32> -> tensor<1x2x4x8xf32>
    %neg_3 = dl.neg %getitem_9 : tensor<1x2x4x8xf32>
    %cat_3 = dl.cat %getitem_8, %neg_3 {dim = 3 : i64} : (tensor<1x2x4x8xf32>, tensor<1x2x4x8xf32>) -> tensor<1x2x4x16xf32>
    %mul_7 = dl.mul %cat_3, %sin : (tensor<1x2x4x16xf32>, tensor<4x16xf32>) -> tensor<1x2x4x16xf32>
    %add_3 = dl.add %mul_6, %mul_7 : (tensor<1x2x4x16xf32>, tensor<1x2x4x16xf32>) -> tensor<1x2x4x16xf32>
    func.return %add, %add_1, %cat_2, %add_3 : tensor<1x2x4x16xf32>, tensor<1x2x4x16xf32>, tensor<1x2x4x16xf32>, tensor<1x2x4x16xf32>
  }
}
