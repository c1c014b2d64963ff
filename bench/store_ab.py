"""A/B of the GEMM epilogue's stores (bench/NOTES.md 157): by pointer (0), through a tensor descriptor (1), and in two
halves of the tile (2) (`epilogue.STORE_MODE`), on the same configs of each GEMM region of a layer at 2048 tokens, timed
paired (`run.paired`). Run on commit with the descriptor stores; they were removed after the measurement.

    python bench/store_ab.py OUT llama3_8b,qwen25_7b,mistral_nemo_12b   (writes OUT/store_ab.json)
"""
import json, os, statistics, sys
sys.path.insert(0, "bench"); sys.path.insert(0, ".")
import torch
from blocks import BLOCKS
from gemms import region_inputs
from run import paired, graphed
import dlblas_compiler as dc
from dlblas_compiler.codegen.gemm import epilogue
from dlblas_compiler.codegen.kernel import compile_configs
from dlblas_compiler.numerics import rel_error

out, layers = sys.argv[1], sys.argv[2].split(",")
TURNS = int(os.environ.get("TURNS", "40"))
def cfg(bm, bn, s, pers=1, tma=1):
    return {"BLOCK_M": bm, "BLOCK_N": bn, "BLOCK_K": 64, "SPLIT_K": 1, "GROUP_M": 8, "num_warps": 8, "num_stages": s,
            "TMA": tma, "MM": 0, "NORM_PASS": 1, "PERSISTENT": pers, "WS": 0}
res = []
with torch.no_grad():
    for layer in layers:
        mod, args, kwargs, _, _ = BLOCKS[f"layer_{layer}"](2048, torch.bfloat16, "cuda")
        cms, steps = {}, {}
        for mode in "012":
            epilogue.STORE_MODE = mode
            cms[mode] = dc.compile(mod, backend="triton", tune="quick" if mode == "0" else "none", cuda_graphs=False)
            cms[mode](*args, **kwargs)
            steps[mode] = region_inputs(cms[mode], args, kwargs)
        for j, (s0, t0) in enumerate(steps["0"]):
            region, tuned = s0.choice.region, dict(s0.choice.config)
            ns = s0.kernel.shape_key["streams"]
            cands = [cfg(128, 128, 3), cfg(128, 128, 4)] + ([] if ns > 1 else [cfg(128, 256, 3), cfg(128, 256, 4), cfg(128, 256, 3, pers=0)])
            if not tuned["MM"] and tuned["TMA"] and tuned not in cands:
                cands.insert(0, tuned)
            cands = [{**c, "NORM_PASS": tuned["NORM_PASS"]} for c in cands]
            for mode in "012":
                compile_configs(steps[mode][j][0].kernel, steps[mode][j][0].compiled, steps[mode][j][1], cands)
            for c in cands:
                fns, ok = [], True
                for mode in "012":
                    st, tt = steps[mode][j]
                    try:
                        want = [o.float() for o in s0.launch(t0, tuned)]
                        got = st.launch(tt, c)
                        err = max(rel_error(g, r) for g, r in zip(got, want))
                        assert err < 2e-2, err
                        fns.append(graphed(lambda st=st, tt=tt, c=c: st.launch(tt, c)).replay)
                    except Exception as e:  # noqa: BLE001
                        print(f"  {layer} {region} {c['BLOCK_M']}x{c['BLOCK_N']} s{c['num_stages']} mode {mode}: {type(e).__name__} {str(e)[:200]}", flush=True)
                        ok = False
                        break
                if not ok:
                    continue
                us = paired(fns, TURNS)
                med = [statistics.median(u) for u in us]
                ratios = [statistics.median(a / b for a, b in zip(us[m], us[0])) for m in (1, 2)]
                print(f"{layer} {region} ns={ns} {c['BLOCK_M']}x{c['BLOCK_N']} s{c['num_stages']} P{c['PERSISTENT']}: ptr {med[0]:.1f}  tma {med[1]:.1f} ({ratios[0]:.3f})  tma2 {med[2]:.1f} ({ratios[1]:.3f}){'  TUNED' if c == {**tuned} else ''}", flush=True)
                res.append({"layer": layer, "region": region, "config": c, "tuned": tuned, "us": us, "median": med, "ratio_per_turn": ratios})
                with open(os.path.join(out, "store_ab.json"), "w") as f:
                    json.dump({"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "rows": res}, f)
        del cms, steps
        torch.cuda.empty_cache()
