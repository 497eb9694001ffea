# One-row products whose programs load all their weights before the wait for the previous
# kernel (ENGINE_GEMV_EARLY=1), on the GPU machine (from the repository root, carrying .whl
# and .whl-server): every format's kernel checks with it on, the step's dense products as a
# chain, the quantized schemes' step products with it off and on, a few 4-bit and 8-bit
# launches, then decode end to end. Each step's log lands in $OUT.
#     bash benchmarks/early_check_gpu.sh [STEP...]   (steps: checks chain quant sweep e2e)
source benchmarks/gpu_env.sh >/dev/null 2>&1 || { echo "gpu_env.sh failed"; exit 1; }
OUT=${OUT:-/tmp/early_check}
source benchmarks/gpu_step.sh
Q="python3 benchmarks/quant_gpu.py --batches 1"
W8="fp8_tensor,ct_fp8_dynamic,modelopt_fp8,fp8_block,ct_w8a8_int8"
steps=("${@:-checks chain quant sweep e2e}")
for s in ${steps[*]}; do
  case $s in
    checks)
      TAIL=4 step 150 checks env ENGINE_GEMV_EARLY=1 python3 tests/runtime/quant_kernel_checks.py cuda ;;
    chain) TAIL=8 step 90 chain python3 benchmarks/step_products_gpu.py \
      --variants default,early,default,early ;;
    quant)
      TAIL=9 step 90 quant_w8 $Q --schemes $W8
      ENGINE_GEMV_EARLY=1 TAIL=9 step 90 quant_w8_early $Q --schemes $W8
      ENGINE_PACKED_WEIGHT_ONLY=1 TAIL=5 step 90 quant_w4 $Q --schemes gptq,awq
      ENGINE_GEMV_EARLY=1 ENGINE_PACKED_WEIGHT_ONLY=1 TAIL=5 step 90 quant_w4_early $Q \
        --schemes gptq,awq ;;
    sweep)
      for c in 4,32,4,1 16,16,8,1 8,32,8,1 8,16,4,0; do
        ENGINE_GEMV_EARLY=1 ENGINE_PACKED_WEIGHT_ONLY=1 ENGINE_GEMV_EARLY_AFFINE=$c TAIL=3 \
          step 60 "w4_$c" $Q --schemes gptq
      done
      for c in 4,4096,4 16,4096,8 8,2048,4; do
        ENGINE_GEMV_EARLY=1 ENGINE_GEMV_EARLY_CONFIG=$c TAIL=4 step 60 "w8_$c" $Q \
          --schemes fp8_tensor,fp8_block
      done ;;
    e2e) TAIL=8 step 200 e2e python3 benchmarks/e2e_gpu.py \
      --backends triton,triton:early,triton,triton:early --batches 1 --hf "" --steps 32 ;;
  esac
done
