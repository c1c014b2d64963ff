import json, random, sys
sys.path.insert(0, ".")
from tests.fuzz.generator import random_spec, check, reference_values
seed, dtype = int(sys.argv[1]), "bfloat16"
for index in map(int, sys.argv[2:]):
    rng = random.Random(f"{seed}-{index}")
    while True:
        spec = random_spec(rng, dtype, 7)
        if reference_values(spec) is not None:
            break
    json.dump(spec, open(f".dbg/spec_{seed}_{index}.json", "w"))
    print(index, json.dumps(spec)[:2000])
    print([(r.backend, r.failure, r.message) for r in check(spec, ["reference", "interpret"]) or []])
