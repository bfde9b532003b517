set -o pipefail
mkdir -p /tmp/exp
for spec in "v13u1:-DQK_UNROLL=1" "v13u2:-DQK_UNROLL=2" "v13u4:-DQK_UNROLL=4" "hyb_u2:-DBLOCK_ROWS=128 -DHYBRID_SMEM=1 -DQK_UNROLL=2"; do
  name=${spec%%:*}; defs=${spec#*:}
  python3 - "$name" "$defs" <<'PY'
import sys, json
from flashbench.compile import compile_kernel
name, defs = sys.argv[1], sys.argv[2]
d = dict(x[2:].split('=') for x in defs.split())
r = compile_kernel(name, 'kernels/v13.cu', 'sm_90', ['-O3','-std=c++17','-lineinfo'], d, f'/tmp/exp/{name}.cubin')
json.dump(r, open(f'/tmp/exp/{name}.json','w'))
print(name, r['registers'], r['spill_bytes'])
PY
  python3 -m flashbench check --cubin /tmp/exp/$name.cubin --record /tmp/exp/$name.json --shapes '[{"B":1,"H":64,"S":1024,"D":128},{"B":1,"H":8,"S":8192,"D":128}]' --tolerance 1e-2 --out /tmp/exp/$name.check.json | tail -1
  python3 -m flashbench bench --cubin /tmp/exp/$name.cubin --record /tmp/exp/$name.json --check /tmp/exp/$name.check.json --shape '{"B":1,"H":64,"S":1024,"D":128}' --steps 100 --repeats 200 --warmup 20 --out /tmp/exp/$name.bench.json | tail -1
done
