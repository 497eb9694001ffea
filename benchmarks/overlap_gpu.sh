# The overlap scheduler on the GPU machine, in one run (from the repository root, carrying
# .whl .whl-moe .whl-server .gpu-data): its CUDA test, the direct decode step at batch 1 and 64,
# bench_serving with the overlap scheduler (the default) and without it, and the grammar
# benchmark on the GPU. Results (JSON, server logs) land in $OUT when set.
#     bash benchmarks/overlap_gpu.sh
source benchmarks/gpu_env.sh >/dev/null 2>&1 || { echo "gpu_env.sh failed"; exit 1; }
nvidia-smi --query-gpu=name,memory.used --format=csv,noheader
python3 -m pytest -q -p no:cacheprovider tests/runtime/test_sched_overlap_cuda.py 2>&1 | tail -2
python3 benchmarks/e2e_gpu.py --backends triton --batches 1,64 --hf "" --steps 32 2>&1 | tail -3
FLAGS="--model-path tests/data/llama3-8b-dummy --load-format dummy --dtype bfloat16
  --skip-tokenizer-init --attention-backend triton --page-size 16 --context-length 4096
  --max-running-requests 256"
python3 benchmarks/bench_serving.py --vocab 128256 --label overlap -- $FLAGS 2>&1 | tail -7
python3 benchmarks/bench_serving.py --vocab 128256 --concurrency 1,64,256 --label sync -- $FLAGS \
  --disable-overlap-schedule 2>&1 | tail -6
if [ -d .gpu-data/smollm2 ]; then
  timeout 150 python3 benchmarks/grammar.py --device cuda --model-path .gpu-data/smollm2 \
    --load-format dummy 2>&1 | tail -16
fi
