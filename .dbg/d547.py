import json, sys, torch, warnings
sys.path.insert(0, ".")
from tests.fuzz.generator import build, make_inputs, check
import dlblas_compiler as dc
r = json.load(open("tests/fuzz/regressions/d547c49df60a.json"))
spec = r["spec"]
print([(x.backend, x.failure, x.message) for x in check(spec, ["triton"]) or []])
m = build(spec).to(torch.bfloat16).cuda()
xs = make_inputs(spec, torch.bfloat16, "cuda")
with torch.no_grad():
    eager = m(*[x.clone() for x in xs])
    for backend_opts in (dict(check=True), dict(cuda_graphs=False)):
        cm = dc.compile(m, backend="triton", **backend_opts)
        with warnings.catch_warnings(record=True) as w:
            warnings.simplefilter("always")
            out = cm(*[x.clone() for x in xs])
        print(backend_opts, [str(x.message)[:200] for x in w])
        print(str(cm.report()))
        print("eager nan", eager[0].isnan().sum().item(), "ours nan", out[0].isnan().sum().item())
        print(out[0].float().flatten()[:40]); print(eager[0].float().flatten()[:40])
        print(cm.ir())
    q, k, v, mask = xs[1], xs[2], None, xs[3]
    print("k stride", k.stride(), k.storage_offset(), "mask", mask.flatten())
