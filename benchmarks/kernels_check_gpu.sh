# The GPU checks of kernel changes built and checked on a CPU machine (sm_90 builds, the Triton
# interpreter), in one run on the GPU machine (from the repository root, carrying .whl and
# .whl-server): the GPU tests of the Triton attention kernels (PDL chains, prefill graphs, the
# conformance kit, fp8 and fp4 KV caches), then the prefill sweep's short list (the shipped
# launches and the query descriptor on and off, alternating), then end to end (greedy tokens
# equal and prefill logits identical across the variants). Each step's log lands in $OUT. The
# steps' limits add up to under ten minutes (one call of the GPU machine).
#     bash benchmarks/kernels_check_gpu.sh
source benchmarks/gpu_env.sh >/dev/null 2>&1 || { echo "gpu_env.sh failed"; exit 1; }
OUT=${OUT:-/tmp/kernels_check}
source benchmarks/gpu_step.sh
nvidia-smi --query-gpu=name,memory.used --format=csv,noheader
step 200 gpu_tests python3 -m pytest -q -p no:cacheprovider -m gpu \
  tests/runtime/test_triton_pdl.py tests/attention/test_triton_attention.py \
  tests/runtime/test_prefill_graphs_cuda.py tests/quant/test_kv_cache_dtype.py \
  tests/quant/test_kv_fp4.py
TAIL=40 step 180 prefill_sweep python3 benchmarks/attention_gpu.py --sections prefill \
  --backends torch_native,triton --page-sizes 16,64 --short-sweep
step 180 e2e python3 benchmarks/e2e_gpu.py --backends triton,triton:qptr \
  --batches 1,32 --hf ""
