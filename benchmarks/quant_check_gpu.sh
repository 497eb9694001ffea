# The GPU checks of the KV-cache formats and the humming choice, in one run on the GPU machine
# (from the repository root, carrying .whl, .whl-server and .whl-humming: the humming-kernels
# wheel, `pip download --no-deps humming-kernels==0.1.20 -d .whl-humming`): fp4 rows in the
# triton kernels, fp8 pools in flashinfer (its FA2 kernels JIT-compile on first use: e4m3 first),
# humming's layers and model against gptq / awq, then humming's decode-step products next to the
# Triton W4A16 kernels (quant_gpu.py). Each step's log lands in $OUT.
#     bash benchmarks/quant_check_gpu.sh [STEP...]
# (steps: fp4, flashinfer_e4m3, humming, flashinfer_e5m2, bench (with an A/B of the row-wise
# fp8 threshold, ENGINE_FP8_KERNEL_ROWS), block_scaled; tests = the
# first three; block_scaled: block fp8 above 16 rows through torch._scaled_mm (the default;
# ENGINE_FP8_BLOCK_SCALED_MM=0 turns it off): its GPU test, then the step with and without it;
# rows: the 8-bit schemes and W4A16 at 1 / 32 / 128 rows, then ENGINE_FP8_KERNEL_ROWS 16 vs 32;
# swap64: the swapped-operand kernel's GPU tests, then 17-64 rows through it against the default;
# swap128: 65-128 rows through it (ENGINE_SWAP_ROWS=128) against the defaults;
# fp8_kv_store: fp8 K/V stored by the q/k norm + RoPE kernel, its GPU checks, then decode with
# an fp8 cache against a bf16 one)
source benchmarks/gpu_env.sh >/dev/null 2>&1 || { echo "gpu_env.sh failed"; exit 1; }
if compgen -G ".whl-humming/*.whl" > /dev/null; then
  python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site-humming \
    .whl-humming/*.whl && export PYTHONPATH=$PYTHONPATH:/tmp/site-humming
fi
OUT=${OUT:-/tmp/quant_check}
source benchmarks/gpu_step.sh
T="python3 -m pytest -q -p no:cacheprovider -m gpu -x"
steps=("${@:-tests}")
[[ ${steps[*]} == tests ]] && steps=(fp4 flashinfer_e4m3 humming)
for s in "${steps[@]}"; do
  case $s in
    fp4) step 120 fp4 $T tests/quant/test_kv_fp4.py ;;
    flashinfer_e4m3)
      step 240 flashinfer_e4m3 $T tests/quant/test_kv_cache_dtype.py -k "flashinfer and e4m3" ;;
    humming)
      step 220 humming python3 -m pytest -q -p no:cacheprovider -m gpu tests/quant/test_humming.py
      ;;
    flashinfer_e5m2)
      step 150 flashinfer_e5m2 $T tests/quant/test_kv_cache_dtype.py -k "flashinfer and e5m2" ;;
    bench)
      TAIL=30 step 240 quant_bench env ENGINE_PACKED_WEIGHT_ONLY=1 python3 benchmarks/quant_gpu.py \
        --schemes gptq,humming_gptq,awq,humming_awq,fp8_block,humming_fp8_block,ct_fp8_dynamic \
        --batches 1,8,32,128
      # the row-wise fp8 threshold: torch._scaled_mm from 17 rows instead of 33
      TAIL=6 step 90 fp8_rows16 env ENGINE_FP8_KERNEL_ROWS=16 python3 benchmarks/quant_gpu.py \
        --schemes ct_fp8_dynamic --batches 17,32,64 ;;
    block_scaled)
      step 90 block_scaled_test $T tests/quant/test_8bit_rows_cuda.py -k block_fp8
      TAIL=8 step 120 block_scaled_bench python3 \
        benchmarks/quant_gpu.py --schemes fp8_block --batches 1,32,128
      TAIL=8 step 120 block_kernel_bench env ENGINE_FP8_BLOCK_SCALED_MM=0 python3 \
        benchmarks/quant_gpu.py --schemes fp8_block --batches 1,32,128 ;;
    rows)  # every 8-bit scheme and W4A16 at 1 / 32 / 128 rows, and the row-wise fp8 threshold
      TAIL=16 step 330 quant_rows env ENGINE_PACKED_WEIGHT_ONLY=1 python3 benchmarks/quant_gpu.py \
        --schemes fp8_tensor,ct_fp8_dynamic,ct_fp8_static,modelopt_fp8,fp8_block,ct_w8a8_int8,\
ct_w8a16,gptq,humming_gptq --batches 1,32,128
      for r in 16 32; do
        TAIL=8 step 150 fp8_rows$r env ENGINE_FP8_KERNEL_ROWS=$r python3 benchmarks/quant_gpu.py \
          --schemes ct_fp8_dynamic,fp8_tensor,modelopt_fp8 --batches 17,32,64
      done ;;
    swap64)  # the swapped-operand kernel up to 64 rows against the other routes past 16 rows
      step 200 swap_tests $T tests/runtime/test_swap_kernels.py tests/quant/test_8bit_rows_cuda.py
      S="--schemes fp8_tensor,ct_fp8_dynamic,fp8_block,ct_w8a8_int8 --batches 17,32,64"
      TAIL=8 step 150 rows_default python3 benchmarks/quant_gpu.py $S
      TAIL=8 step 150 rows_swap64 env ENGINE_SWAP_ROWS=64 ENGINE_FP8_KERNEL_ROWS=64 \
        ENGINE_FP8_BLOCK_SCALED_ROWS=64 python3 benchmarks/quant_gpu.py $S ;;
    swap128)  # the swapped-operand kernel up to 128 rows against the defaults past 64 rows
      S="--schemes fp8_tensor,ct_fp8_dynamic,ct_w8a8_int8 --batches 65,96,128"
      TAIL=8 step 150 rows_default python3 benchmarks/quant_gpu.py $S
      TAIL=8 step 150 rows_swap128 env ENGINE_SWAP_ROWS=128 ENGINE_FP8_KERNEL_ROWS=128 \
        python3 benchmarks/quant_gpu.py $S ;;
    fp8_kv_store)
      step 200 fp8_kv_store_tests python3 -m pytest -q -p no:cacheprovider -m gpu \
        tests/runtime/test_fused_kernels.py tests/quant/test_kv_cache_dtype.py -k "not flashinfer"
      TAIL=6 step 150 fp8_kv_e2e python3 benchmarks/e2e_gpu.py --backends triton \
        --kv-cache-dtype fp8_e4m3 --batches 1,32 --hf "" --rounds 2
      TAIL=6 step 150 bf16_kv_e2e python3 benchmarks/e2e_gpu.py --backends triton \
        --batches 1,32 --hf "" --rounds 2 ;;
  esac
done
