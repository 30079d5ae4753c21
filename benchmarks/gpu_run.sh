#!/usr/bin/env bash
# One batch of GPU work for a device machine (no internet): the GPU test suite, then the GPU
# benchmarks, with logs and JSON under $OUT (default ./gpu_out). Usage:
#   bash benchmarks/gpu_run.sh [tests] [bench] [probe] [pipeline]   (default: tests bench)
set -u
OUT=${OUT:-gpu_out}
mkdir -p "$OUT"
export PYTHONPATH=$PWD
card=$(python3 -c "import cupy as c; p=c.cuda.runtime.getDeviceProperties(0); print(p['name'].decode().split()[1].lower())")
want=${*:-tests bench}
for step in $want; do
  case $step in
    tests)
      python3 -m pytest -m gpu --require-gpu -q -p no:cacheprovider -o addopts="" tests \
        > "$OUT/gpu_tests_$card.log" 2>&1
      echo "tests rc=$?"; tail -3 "$OUT/gpu_tests_$card.log";;
    bench)
      python3 benchmarks/bench_gpu.py --out "$OUT/bench_gpu_$card.json" > "$OUT/bench_gpu_$card.log" 2>&1
      echo "bench rc=$?"; tail -60 "$OUT/bench_gpu_$card.log";;
    probe)
      python3 benchmarks/gpu_launch_probe.py > "$OUT/gpu_launch_probe_$card.log" 2>&1
      echo "probe rc=$?"; tail -30 "$OUT/gpu_launch_probe_$card.log";;
    pipeline)
      python3 benchmarks/bench_pipeline.py --no-dask --device-backend cupy > "$OUT/bench_pipeline_gpu_$card.log" 2>&1
      echo "pipeline rc=$?"; tail -20 "$OUT/bench_pipeline_gpu_$card.log";;
  esac
done
