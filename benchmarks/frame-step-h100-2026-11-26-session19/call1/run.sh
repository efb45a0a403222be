# Session 19, call 1 (H100): the sampling kernel's hex-digit radix select against HEAD's bit-a-step one; the row
# projections (norm and SiLU inside) against norm kernel + cuBLAS (+ SiLU kernel), a tiling sweep at both talkers'
# shapes; the fused-ops GPU tests.
W=/tmp/s19c1; rm -rf $W; mkdir -p $W
trap 'cp .devwork/s19run1.sh $W/run.sh; cp .devwork/s19probe.py $W/; tar czf $OUT/s19c1.tgz -C /tmp s19c1' EXIT
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD:$PWD/proto
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv > $W/gpu.csv
SECONDS=0
timeout 420 python3 .devwork/s19probe.py $W/probe.json > $W/probe.txt 2>&1; echo "probe rc=$? ${SECONDS}s"
grep '"sampling"' $W/probe.txt | cut -c1-400
python3 - $W/probe.json <<'PY'
import json, sys
for r in json.load(open(sys.argv[1]))["results"]:
    if r["part"] == "rows":
        b = r["best"]
        print(r["size"], r["batch"], r["kind"], "chain %.2f/%.2f" % (r["chain_us"], r["chain_again_us"]), "best", b["tiling"], "%.2f" % b["us"],
              "err %.2e chain %.2e eq %.3f" % (b["err"], r["chain_err"], b["equal_frac"]),
              "errors", sum("error" in t for t in r["tilings"]))
PY
grep -i -B2 -A12 "Traceback" $W/probe.txt | head -40
SECONDS=0
timeout 120 python3 -m pytest -q tests/gpu/test_fused_ops_cuda.py -p no:cacheprovider > $W/gpu_tests.txt 2>&1; echo "gpu tests rc=$? ${SECONDS}s"; tail -1 $W/gpu_tests.txt; grep -E "^E " $W/gpu_tests.txt | head -6 | cut -c1-300
